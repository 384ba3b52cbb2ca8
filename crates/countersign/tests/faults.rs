//! Crashes and faults between the agent and the upstream, end to end below the window: the real
//! `countersign mcp` binary spawned as an agent would, the desk's engine in this test process
//! behind a real Unix socket, real upstream processes. An upstream killed with SIGKILL in the
//! middle of a call: the agent gets a clear answer in time, nothing runs twice, and the next call
//! works.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use rmcp::model::CallToolResult;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

/// The slow test upstream's command line, logging its `note` calls to `log`.
fn slow_upstream(log: &Path) -> Vec<String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peers/slow_server.py");
    vec!["python3".into(), script.into(), log.display().to_string()]
}

/// A gateway's stderr (where the upstream's own stderr arrives too), line by line.
struct Stderr(mpsc::UnboundedReceiver<String>);

impl Stderr {
    /// Waits for a line that contains `needle`.
    async fn said(&mut self, needle: &str) -> String {
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                match self.0.recv().await {
                    Some(line) if line.contains(needle) => return line,
                    Some(_) => {}
                    None => panic!("the gateway's stderr closed before it said {needle:?}"),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the gateway did not say {needle:?} within 30 s"))
    }
}

/// Starts the gateway `cmd` with its stderr piped to a [`Stderr`].
fn gateway_watched(cmd: tokio::process::Command) -> (rmcp::transport::TokioChildProcess, Stderr) {
    let (transport, stderr) = rmcp::transport::TokioChildProcess::builder(cmd)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (lines, stderr_rx) = mpsc::unbounded_channel();
    let mut stderr = tokio::io::BufReader::new(stderr.unwrap()).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = stderr.next_line().await {
            eprintln!("gateway: {line}");
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    (transport, Stderr(stderr_rx))
}

/// The gateway's arguments for the ad-hoc upstream `argv`, with a preflight waiting `wait_s`.
fn upstream_args(argv: &[String], wait_s: u32) -> Vec<String> {
    let mut args = vec!["--wait".to_owned(), wait_s.to_string(), "--".to_owned()];
    args.extend(argv.iter().cloned());
    args
}

/// An agent on a gateway to `upstream`, and the gateway's stderr.
struct Watched {
    agent: Agent,
    stderr: Stderr,
}

async fn watched(socket: &Path, upstream: &[String], wait_s: u32) -> Watched {
    let args = upstream_args(upstream, wait_s);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (transport, stderr) = gateway_watched(gateway_command(socket, &args));
    let agent = rmcp::ServiceExt::serve(plain_client(), transport)
        .await
        .unwrap();
    Watched { agent, stderr }
}

impl Watched {
    async fn said(&mut self, needle: &str) -> String {
        self.stderr.said(needle).await
    }
}

/// The slow upstream's process id, as its `pid` tool says.
async fn upstream_pid(agent: &Agent) -> i32 {
    let r = call(agent, "pid", json!({})).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    text(&r).trim().parse().unwrap()
}

fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// Waits (up to 10 s) until `pid` has died: SIGKILL is delivered, not awaited, by kill(2).
async fn gone(pid: i32) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "{pid} outlived SIGKILL"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn kill_9(pid: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill {pid}");
}

/// The JSON lines of a test upstream's log (none when it has no file yet).
fn log_lines(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn error_code(r: &CallToolResult) -> Option<String> {
    r.structured_content
        .as_ref()?
        .get("error")?
        .as_str()
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_killed_mid_call_is_a_clear_error_and_the_next_call_restarts_it() {
    let desk = desk().await;
    let dir = desk.dir.path();
    let mut first = watched(&desk.socket, &slow_upstream(&dir.join("first.log")), 10).await;
    let second = watched(&desk.socket, &slow_upstream(&dir.join("second.log")), 10).await;
    let killed = upstream_pid(&first.agent).await;
    let other = upstream_pid(&second.agent).await;

    let peer = first.agent.peer().clone();
    let in_flight = tokio::spawn(async move { call(&peer, "sleep", json!({"seconds": 60})).await });
    first.said("slow_server: sleep started").await;
    let killed_at = std::time::Instant::now();
    kill_9(killed);
    let r = tokio::time::timeout(Duration::from_secs(10), in_flight)
        .await
        .expect("the call in flight got no answer within 10 s of its upstream's death")
        .unwrap();
    assert!(killed_at.elapsed() < Duration::from_secs(5));
    assert_eq!(r.is_error, Some(true), "{r:?}");
    assert_eq!(error_code(&r).as_deref(), Some("upstream_exited"), "{r:?}");
    let said = text(&r);
    assert!(said.contains("exited"), "{said}");
    assert!(said.contains("whether it ran"), "{said}");
    assert!(said.contains("is not known"), "{said}");

    // The other agent's session, and its upstream, never noticed.
    assert_eq!(upstream_pid(&second.agent).await, other);
    let r = call(&second.agent, "sleep", json!({"seconds": 0})).await;
    assert_eq!(text(&r), "slept");

    // The next call of the first agent starts its upstream again, through the same gateway.
    let restarted = upstream_pid(&first.agent).await;
    assert_ne!(restarted, killed);
    assert!(alive(restarted));
    assert!(!alive(killed));
    let tools = first.agent.peer().list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 3, "{tools:?}");
    let r = call(&first.agent, "sleep", json!({"seconds": 0})).await;
    assert_eq!(text(&r), "slept");
    assert_eq!(
        desk.children().len(),
        2,
        "one upstream per agent, the dead one collected"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_made_before_the_upstream_restarted_is_confirmed_once_on_the_new_process() {
    let desk = desk().await;
    let log = desk.dir.path().join("notes.log");
    let watched = watched(&desk.socket, &slow_upstream(&log), 10).await;
    let agent = &watched.agent;
    let confirm = approved(&desk, agent, "note", json!({"text": "after the crash"})).await;
    let killed = upstream_pid(agent).await;
    kill_9(killed);
    // Dead before the confirm: the desk sends it to a new process, never to the dead one.
    gone(killed).await;
    // The tenant stayed and the new process lists the same tool: the approval holds, once.
    let r = call(agent, "note", confirm.clone()).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    let restarted = upstream_pid(agent).await;
    assert_ne!(restarted, killed);
    assert_eq!(
        log_lines(&log),
        vec![json!({"text": "after the crash", "pid": restarted})]
    );
    let again = call(agent, "note", confirm).await;
    assert_eq!(refusal(&again).as_deref(), Some("already_used"));
    assert_eq!(log_lines(&log).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_whose_upstream_is_killed_mid_call_may_have_run_and_is_never_run_again() {
    let desk = desk().await;
    let log = desk.dir.path().join("notes.log");
    let mut watched = watched(&desk.socket, &slow_upstream(&log), 10).await;
    let args = json!({"text": "slowly", "seconds": 60});
    let confirm = approved(&desk, &watched.agent, "note", args).await;
    let killed = upstream_pid(&watched.agent).await;
    let peer = watched.agent.peer().clone();
    let sent = confirm.clone();
    let in_flight = tokio::spawn(async move { call(&peer, "note", sent).await });
    watched.said("slow_server: note started").await;
    kill_9(killed);
    let r = tokio::time::timeout(Duration::from_secs(10), in_flight)
        .await
        .expect("the confirm in flight got no answer within 10 s of its upstream's death")
        .unwrap();
    assert_eq!(error_code(&r).as_deref(), Some("upstream_exited"), "{r:?}");
    let said = text(&r);
    assert!(said.contains("whether it ran"), "{said}");
    assert!(said.contains("approval worked once and is spent"), "{said}");
    // The person's approval was spent on that call: it never runs again, on any process.
    let again = call(&watched.agent, "note", confirm).await;
    assert_eq!(
        refusal(&again).as_deref(),
        Some("already_used"),
        "{again:?}"
    );
    assert!(log_lines(&log).is_empty(), "{:?}", log_lines(&log));
    let history = desk
        .engine
        .history(&countersign_store::HistoryFilter::default())
        .unwrap();
    let executed: Vec<_> = history
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                countersign_core::telemetry::EventKind::Executed { .. }
            )
        })
        .collect();
    assert_eq!(executed.len(), 1, "{history:?}");
    assert_eq!(
        executed[0].kind,
        countersign_core::telemetry::EventKind::Executed { ok: false }
    );
    assert!(
        executed[0]
            .note
            .as_deref()
            .is_some_and(|n| n.contains("not known")),
        "{:?}",
        executed[0]
    );
}
