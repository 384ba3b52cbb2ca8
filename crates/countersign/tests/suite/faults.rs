//! Crashes and faults between the agent and the upstream, end to end below the window: the real
//! `countersign mcp` binary spawned as an agent would, the desk's engine in this test process
//! behind a real Unix socket, real upstream processes. An upstream killed with SIGKILL in the
//! middle of a call, and a desk restarted while a preflight waits: the agent gets a clear answer
//! in time, nothing runs twice, and the next call works.
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

use crate::common;
use crate::peers::python;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use countersign_engine::Engine;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::ServiceError;
use rmcp::{Peer, RoleClient};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

/// The slow test upstream's command line, logging its `note` calls to `log`.
fn slow_upstream(log: &Path) -> Vec<String> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/peers/slow_server.py"
    );
    vec!["python3".into(), script.into(), log.display().to_string()]
}

/// The obedient test upstream's command line, logging every call that reaches it to `log`.
fn obedient_upstream(log: &Path) -> Vec<String> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/peers/obedient_server.py"
    );
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

    /// Waits until the gateway has seen its connection to the desk close: a request sent before
    /// then would still be in flight on the old connection.
    async fn lost_the_desk(&mut self) {
        self.said("the connection to the desk was lost").await;
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
    // Its exit, on the kernel's word (a pidfd; a zombie has exited).
    assert!(
        tokio::time::timeout(
            Duration::from_secs(10),
            countersign_tests::group::exited(pid as u32)
        )
        .await
        .is_ok(),
        "{pid} outlived SIGKILL"
    );
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

/// An upstream whose output has ended is not handed another call, even while its process
/// lingers (a server that closed its standard output, or one caught between closing its files and
/// exiting): the call in flight is answered `upstream_exited`, and the next call starts the
/// upstream again and ends the old process, instead of being lost to a start that cannot answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_whose_output_ends_before_it_exits_is_started_again_for_the_next_call() {
    let desk = desk().await;
    let mut first = watched(
        &desk.socket,
        &slow_upstream(&desk.dir.path().join("log")),
        10,
    )
    .await;
    let hung_up = upstream_pid(&first.agent).await;
    let peer = first.agent.peer().clone();
    let in_flight =
        tokio::spawn(
            async move { call(&peer, "sleep", json!({"seconds": 20, "hangUp": true})).await },
        );
    first.said("slow_server: sleep started").await;
    let r = tokio::time::timeout(Duration::from_secs(10), in_flight)
        .await
        .expect("the call in flight got no answer within 10 s of its upstream's output ending")
        .unwrap();
    assert_eq!(error_code(&r).as_deref(), Some("upstream_exited"), "{r:?}");
    assert!(alive(hung_up), "the old process sleeps on for 20 s");

    // The very next call: a new start answers it.
    let restarted = upstream_pid(&first.agent).await;
    assert_ne!(restarted, hung_up);
    gone(hung_up).await;
    let r = call(&first.agent, "sleep", json!({"seconds": 0})).await;
    assert_eq!(text(&r), "slept");
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
        .await
        .unwrap();
    // Handed over and never answered: on record as unknown, not as failed (it may have run).
    let executed: Vec<_> = history
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                countersign_core::telemetry::EventKind::Executed { .. }
                    | countersign_core::telemetry::EventKind::OutcomeUnknown
            )
        })
        .collect();
    assert_eq!(executed.len(), 1, "{history:?}");
    assert_eq!(
        executed[0].kind,
        countersign_core::telemetry::EventKind::OutcomeUnknown
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

/// A desk that can be restarted as its process would be: every connection closed, every upstream
/// killed, then a new engine on the same database (and the same secret, which a real desk keeps
/// in the keychain) serving on the same socket.
struct Restartable {
    engine: Engine,
    served: Option<countersign_session::Served>,
    socket: PathBuf,
    dir: tempfile::TempDir,
}

fn engine_in(dir: &Path) -> Engine {
    let mut config = countersign_tests::engine::config();
    config.describer = Some(std::sync::Arc::new(
        countersign_session::SqlDescriber::default(),
    ));
    countersign_tests::engine::engine(dir, config)
}

impl Restartable {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("run/desk.sock");
        let engine = engine_in(dir.path());
        let served = countersign_session::serve(engine.clone(), socket.clone())
            .await
            .unwrap();
        Self {
            engine,
            served: Some(served),
            socket,
            dir,
        }
    }

    /// The desk stops: its connections close and its upstreams die.
    fn stop(&mut self) {
        drop(self.served.take());
    }

    /// A new desk process takes the socket and the database.
    async fn serve_again(&mut self) {
        self.engine = engine_in(self.dir.path());
        let served = countersign_session::serve(self.engine.clone(), self.socket.clone())
            .await
            .unwrap();
        self.served = Some(served);
    }

    async fn restart(&mut self) {
        self.stop();
        self.serve_again().await;
    }
}

/// A preflight approved on `engine` by a click; returns the confirm arguments for it.
async fn approved_on(engine: &Engine, agent: &Peer<RoleClient>, tool: &str, args: Value) -> Value {
    let click = click_approve(engine);
    let r = call(agent, tool, args.clone()).await;
    click.await.unwrap();
    assert_ne!(r.is_error, Some(true), "preflight not approved: {r:?}");
    confirm_args(&args, &r)
}

/// A call whose answer may be a JSON-RPC error.
async fn try_call(
    agent: &Peer<RoleClient>,
    tool: &str,
    args: Value,
) -> Result<CallToolResult, ServiceError> {
    agent
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(obj(args)))
        .await
}

/// The JSON-RPC error a call got: its code for agents (`data.error`) and its message.
fn rpc_error(r: Result<CallToolResult, ServiceError>) -> (String, String) {
    match r {
        Err(ServiceError::McpError(e)) => {
            let code = e.data.as_ref().and_then(|d| d["error"].as_str());
            let code = code.unwrap_or_else(|| panic!("an error without a code: {e:?}"));
            (code.to_owned(), e.message.to_string())
        }
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

/// The `tools/call`s of `tool` that reached the obedient upstream, by their arguments.
fn executed(log: &Path, tool: &str) -> Vec<Value> {
    log_lines(log)
        .into_iter()
        .filter(|e| e["method"] == "tools/call" && e["params"]["name"] == tool)
        .map(|e| e["params"]["arguments"].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_desk_restarted_while_a_preflight_waits_refuses_it_and_the_gateway_reconnects_on_the_next_call()
 {
    let mut desk = Restartable::start().await;
    let log = desk.dir.path().join("upstream.log");
    let Watched { agent, mut stderr } = watched(&desk.socket, &obedient_upstream(&log), 30).await;
    let peer = agent.peer().clone();
    // An approval the old desk gave: its token is bound to that desk's session for this agent.
    let old_confirm = approved_on(
        &desk.engine,
        &peer,
        "write",
        json!({"path": "before", "text": "approved before the restart"}),
    )
    .await;

    // A preflight waits for a person when the desk restarts.
    let mut changes = desk.engine.subscribe();
    let waiting = {
        let peer = peer.clone();
        tokio::spawn(async move { try_call(&peer, "write", json!({"path": "waiting"})).await })
    };
    next_request(&mut changes).await;
    let restarted = Instant::now();
    desk.restart().await;
    let answer = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting preflight got no answer within 10 s of the restart")
        .unwrap();
    assert!(
        restarted.elapsed() < Duration::from_secs(5),
        "{:?}",
        restarted.elapsed()
    );
    let (code, message) = rpc_error(answer);
    assert_eq!(code, "desk_lost");
    for needle in [
        "stopped or restarted",
        "this was a preflight and nothing was executed",
        "new session",
        "tokens issued before no longer work",
        "run the preflight again",
    ] {
        assert!(message.contains(needle), "{needle:?} not in {message}");
    }
    stderr.lost_the_desk().await;

    // The next call goes through the new desk, on the same gateway: a new preflight, approved
    // there, runs once.
    let confirm = approved_on(
        &desk.engine,
        &peer,
        "write",
        json!({"path": "after", "text": "approved after the restart"}),
    )
    .await;
    let r = call(&peer, "write", confirm.clone()).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    let again = call(&peer, "write", confirm).await;
    assert_eq!(refusal(&again).as_deref(), Some("already_used"));
    // The old token belongs to the old session.
    let r = call(&peer, "write", old_confirm).await;
    assert_eq!(refusal(&r).as_deref(), Some("wrong_tenant"), "{r:?}");

    // What ran: the one confirm approved after the restart, once.
    assert_eq!(
        executed(&log, "write"),
        vec![json!({"path": "after", "text": "approved after the restart"})]
    );
    agent.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_in_flight_when_the_desk_restarts_may_have_run_and_nothing_runs_twice() {
    let mut desk = Restartable::start().await;
    let log = desk.dir.path().join("notes.log");
    let mut watched = watched(&desk.socket, &slow_upstream(&log), 30).await;
    let peer = watched.agent.peer().clone();
    let args = json!({"text": "slowly", "seconds": 60});
    let confirm = approved_on(&desk.engine, &peer, "note", args).await;
    let in_flight = {
        let (peer, confirm) = (peer.clone(), confirm.clone());
        tokio::spawn(async move { try_call(&peer, "note", confirm).await })
    };
    watched.said("slow_server: note started").await;
    desk.restart().await;
    let answer = tokio::time::timeout(Duration::from_secs(10), in_flight)
        .await
        .expect("the confirm in flight got no answer within 10 s of the restart")
        .unwrap();
    // The gateway saw its connection close, or the desk saw its upstream die first: either way
    // the agent is told that the confirm may have run.
    match answer {
        Ok(r) => {
            assert_eq!(error_code(&r).as_deref(), Some("upstream_exited"), "{r:?}");
            assert!(text(&r).contains("whether it ran"), "{}", text(&r));
        }
        Err(e) => {
            let (code, message) = rpc_error(Err(e));
            assert_eq!(code, "desk_lost");
            assert!(
                message.contains("This was a confirm of `note`: it may have been executed"),
                "{message}"
            );
        }
    }
    watched.stderr.lost_the_desk().await;
    // On the new desk the old token is refused, and nothing it approved runs.
    let r = call(&peer, "note", confirm).await;
    assert_eq!(refusal(&r).as_deref(), Some("wrong_tenant"), "{r:?}");
    assert!(log_lines(&log).is_empty(), "{:?}", log_lines(&log));
    let args = json!({"text": "again"});
    let confirm = approved_on(&desk.engine, &peer, "note", args).await;
    let r = call(&peer, "note", confirm).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    let notes = log_lines(&log);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(notes[0]["text"], "again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_desk_that_does_not_come_back_is_a_clear_error_after_a_few_tries_and_none_is_started() {
    let mut desk = Restartable::start().await;
    let log = desk.dir.path().join("upstream.log");
    let Watched { agent, mut stderr } = watched(&desk.socket, &obedient_upstream(&log), 10).await;
    let peer = agent.peer().clone();
    let r = call(&peer, "read", json!({"path": "x"})).await;
    assert_eq!(text(&r), "did it");
    desk.stop();
    stderr.lost_the_desk().await;
    let asked = Instant::now();
    let (code, message) = rpc_error(try_call(&peer, "read", json!({"path": "y"})).await);
    let waited = asked.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(15),
        "{waited:?}"
    );
    assert_eq!(code, "desk_unreachable");
    for needle in [
        "connecting again failed",
        "tried 6 times",
        "Nothing was sent for this request",
        "start the Countersign desk",
    ] {
        assert!(message.contains(needle), "{needle:?} not in {message}");
    }
    // The socket was chosen on the command line: the gateway started no desk there.
    assert!(!desk.socket.exists());
    // Once a desk is back, the next call goes through it.
    desk.serve_again().await;
    let r = call(&peer, "read", json!({"path": "z"})).await;
    assert_eq!(text(&r), "did it");
    assert_eq!(executed(&log, "read").len(), 2);
    agent.cancel().await.unwrap();
}

/// An agent on 2026-07-28 opens with `server/discover` and no handshake: after a restart the
/// gateway replays that probe, so the new desk opens the upstream on the same revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_on_2026_07_28_keeps_its_revision_through_a_desk_restart() {
    use rmcp::ClientServiceExt;
    use rmcp::model::ProtocolVersion;
    let mut desk = Restartable::start().await;
    let server = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/peers/python_server.py"
    );
    let notes = desk.dir.path().join("notes.txt");
    let python = python();
    let cmd = gateway_command(
        &desk.socket,
        &[
            "--",
            python.to_str().unwrap(),
            server,
            notes.to_str().unwrap(),
        ],
    );
    let (transport, mut stderr) = gateway_watched(cmd);
    let agent = plain_client()
        .serve_with_lifecycle(
            transport,
            rmcp::ClientLifecycleMode::Auto {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                legacy_version: Some(ProtocolVersion::V_2025_11_25),
            },
        )
        .await
        .unwrap();
    let r = call(&agent, "whoami", json!({})).await;
    assert_eq!(text(&r), "protocol 2026-07-28");
    desk.restart().await;
    stderr.lost_the_desk().await;
    let r = call(&agent, "whoami", json!({})).await;
    assert_eq!(text(&r), "protocol 2026-07-28", "{r:?}");
    let confirm = approved_on(&desk.engine, &agent, "note", json!({"text": "modern"})).await;
    let r = call(&agent, "note", confirm).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "modern\n");
    agent.cancel().await.unwrap();
}
