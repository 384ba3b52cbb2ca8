//! A replica of a team's server killed while a call waits never strands the call. Real
//! `countersign-serve` processes on a real PostgreSQL database (run under `.ci/with-postgres`),
//! the built-in tools on one SQLite file, an agent over streamable HTTP
//! and a desk signing its decision on the approver listener. The call is asked on replica A, A
//! is killed (`SIGKILL`), the agent asks again on B at once, A comes back, B is killed, the
//! agent asks on the new A; the person decides 30 s after the first ask, three times the time a
//! dead replica's rows stay in sight on their own. The call stays in the desks' queue once,
//! under one number, is approved, and runs exactly once. About 40 s.
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use countersign_core::approver::Verdict;
use countersign_tests::approver::{Desk, first_waiting, waiting_now};
use countersign_tests::postgres::shared_database;
use countersign_tests::window::bin;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::{Value, json};

use super::free_port;

/// A running replica, killed when dropped.
struct Replica {
    child: Child,
    port: u16,
}

impl Replica {
    /// A replica with `args` and `env`, once it says it listens.
    fn start(args: &[String], env: &[(&str, &str)]) -> Replica {
        let port = free_port();
        let mut child = Command::new(bin("countersign-serve"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", std::env::var("HOME").unwrap_or_default())
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (mut log, mut buf, mut told) = (Vec::new(), [0u8; 4096], false);
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                log.extend_from_slice(&buf[..n]);
                if !told && String::from_utf8_lossy(&log).contains("listening on") {
                    told = true;
                    let _ = ready_tx.send(());
                }
            }
            if !told {
                let _ = ready_tx.send(());
                eprintln!("{}", String::from_utf8_lossy(&log));
            }
        });
        ready_rx.recv_timeout(Duration::from_secs(60)).unwrap();
        Replica { child, port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Killed at once, as a crash or an OOM kill does: nothing of it runs after this.
    fn kill(mut self) {
        // SAFETY: kill(2) on the pid of a child this value owns and has not reaped yet, so the
        // pid cannot have been reused by another process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

type Agent = rmcp::service::RunningService<rmcp::RoleClient, ()>;

async fn agent(url: &str) -> Arc<Agent> {
    Arc::new(
        ().serve(StreamableHttpClientTransport::from_uri(url))
            .await
            .unwrap(),
    )
}

/// The agent's call of `execute` with `arguments`, waiting on its replica.
fn ask(
    agent: &Arc<Agent>,
    arguments: &Value,
) -> tokio::task::JoinHandle<Result<rmcp::model::CallToolResult, rmcp::ServiceError>> {
    let (agent, arguments) = (agent.clone(), arguments.as_object().unwrap().clone());
    tokio::spawn(async move {
        agent
            .call_tool(CallToolRequestParams::new("execute").with_arguments(arguments))
            .await
    })
}

fn runs(db: &Path) -> i64 {
    rusqlite::Connection::open(db)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM notes WHERE body = 'survives'",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

/// The waiting calls desks see through the listener at `port`, read off the async workers.
async fn seen(port: u16, trusted: &rustls::pki_types::CertificateDer<'static>) -> Vec<Value> {
    let trusted = trusted.clone();
    tokio::task::spawn_blocking(move || waiting_now(port, &trusted, &Desk::new(61)))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn a_call_survives_each_replica_killed_in_turn_and_a_person_deciding_after_30_s_runs_it_once()
{
    let dsn = shared_database().await;
    let dir = tempfile::tempdir().unwrap();
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let trusted = certified.cert.der().clone();
    let db: PathBuf = dir.path().join("tools.sqlite");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch("CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT);")
        .unwrap();
    let alice = Desk::new(61);
    let registered = Command::new(bin("countersign-serve"))
        .args(["approver", "add", "alice-29", &alice.public_text()])
        .env("CONTROL_DSN", &dsn)
        .output()
        .unwrap();
    assert!(
        registered.status.success(),
        "{}",
        String::from_utf8_lossy(&registered.stderr)
    );
    let url = format!("https://approvers.example.test:{}", free_port());
    let env = [
        ("CONFIRM_SECRET", "replicas-killed-in-turn-0123456789abcdef"),
        ("CONTROL_DSN", dsn.as_str()),
    ];
    // Each replica has its own approver listener (one name for desks); the preflight waits a
    // minute on whichever replica the agent reaches.
    let replica = |listener: u16| {
        let args: Vec<String> = [
            "--behind-tls-proxy",
            "--unauthenticated",
            "--wait",
            "60",
            "--db",
            db.to_str().unwrap(),
            "--approver-listen",
            &format!("127.0.0.1:{listener}"),
            "--approver-url",
            &url,
            "--approver-cert",
            cert.to_str().unwrap(),
            "--approver-key",
            key.to_str().unwrap(),
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
        Replica::start(&args, &env)
    };
    let (a_listener, b_listener) = (free_port(), free_port());
    let a = replica(a_listener);
    let b = replica(b_listener);
    let insert = json!({"sql": "INSERT INTO notes(body) VALUES ('survives')"});

    // Asked on A: desks see it (through B's listener too), under one number.
    let asked_at = Instant::now();
    let on_a = agent(&a.url()).await;
    let waiting_on_a = ask(&on_a, &insert);
    let request = {
        let trusted = trusted.clone();
        tokio::task::spawn_blocking(move || first_waiting(b_listener, &trusted, &Desk::new(61)))
            .await
            .unwrap()
    };
    let number = request["id"].clone();

    // A is killed while the call waits; the agent asks again on B at once.
    a.kill();
    let ended = waiting_on_a.await.unwrap();
    assert!(
        ended.is_err() || ended.as_ref().unwrap().is_error == Some(true),
        "{ended:?}"
    );
    let on_b = agent(&b.url()).await;
    let waiting_on_b = ask(&on_b, &insert);

    // A comes back (a new process, a new replica), then B is killed; the agent asks on the new A.
    let a_listener = free_port();
    let a = replica(a_listener);
    // B holds the call now: desks still see it, once, under its number.
    let listed = seen(a_listener, &trusted).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["id"], number);
    b.kill();
    let ended = waiting_on_b.await.unwrap();
    assert!(
        ended.is_err() || ended.as_ref().unwrap().is_error == Some(true),
        "{ended:?}"
    );
    let on_a = agent(&a.url()).await;
    let waiting_on_a = ask(&on_a, &insert);

    // The person takes 30 s from the first ask (this wait is the scenario: the person reading):
    // three times the time rows stay in sight without a live replica keeping them.
    let decide_at = asked_at + Duration::from_secs(30);
    tokio::time::sleep_until(decide_at.into()).await;
    let listed = seen(a_listener, &trusted).await;
    assert_eq!(
        listed.len(),
        1,
        "one entry for the call, after two kills: {listed:?}"
    );
    assert_eq!(
        listed[0]["id"], number,
        "under the number it was first seen by"
    );
    let (url_a, trusted_a) = (url.clone(), trusted.clone());
    let decided = tokio::task::spawn_blocking(move || {
        let alice = Desk::new(61);
        let decision = alice.decide(&url_a, &request, Verdict::Approve, |_| {});
        alice.send(a_listener, &trusted_a, &decision)
    })
    .await
    .unwrap();
    assert_eq!(
        decided.0, 200,
        "the decision on its number lands: {decided:?}"
    );

    // The agent waiting on the new A gets the approval, confirms, and it runs once.
    let approved = waiting_on_a.await.unwrap().unwrap();
    let content = approved.structured_content.clone().unwrap();
    assert_eq!(content["approved"], true, "{approved:?}");
    let mut confirm = insert.clone();
    confirm["confirm"] = json!(true);
    confirm["confirmTarget"] = content["confirmTarget"].clone();
    confirm["confirmToken"] = content["confirmToken"].clone();
    let arguments = confirm.as_object().unwrap().clone();
    let done = on_a
        .call_tool(CallToolRequestParams::new("execute").with_arguments(arguments.clone()))
        .await
        .unwrap();
    assert_ne!(done.is_error, Some(true), "{done:?}");
    let replay = on_a
        .call_tool(CallToolRequestParams::new("execute").with_arguments(arguments))
        .await
        .unwrap();
    assert_eq!(replay.is_error, Some(true), "works once: {replay:?}");
    assert_eq!(runs(&db), 1, "one approval, one run");
    assert!(seen(a_listener, &trusted).await.is_empty(), "decided: gone");
}
