//! Each approval runs at most once, whatever dies and whenever.
//!
//! The desk (`desk_child`: the engine, store file and sessions without the window, approving
//! each request through `Engine::approve` as a click would) is killed with SIGKILL at a random
//! moment along preflight → approve → confirm → spend → execute → outcome, many times over, with
//! a real upstream in its own process (`obedient_server.py`, which appends every call it
//! executes to a file this test reads). After each kill the desk is started again on the same
//! file, and the test checks what the seed promises:
//!
//! * every approved call executed at most once, ever, and nothing executed that nobody approved;
//! * a call that executed had its nonce spent first (the ledger says so after the restart);
//! * replaying the token after the restart is refused and executes nothing (a restarted desk
//!   gives every connection a new tenant, so the token is refused `wrong_tenant` before its
//!   nonce is looked up; the ledger row that would refuse it `already_used` is checked directly);
//! * the store opens cleanly every time (WAL recovery), and history says what happened up to
//!   the crash: an `accepted` event only for a spent nonce, an `executed` one only for a call the
//!   upstream ran.
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use countersign_core::token::{self, SigningKey};
use countersign_store::{HistoryFilter, Store, StoreOptions};
use countersign_tests::desk_process::DeskChild;
use rmcp::model::*;
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

/// The key `desk_child` signs with.
fn key() -> SigningKey {
    SigningKey::new(&[42; 32]).unwrap()
}

fn obedient_server() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("peers/obedient_server.py")
}

fn countersign() -> PathBuf {
    countersign_tests::window::bin("countersign")
}

type Agent = RunningService<RoleClient, ClientConfig>;

async fn agent(socket: &Path, log: &Path) -> Agent {
    let mut cmd = tokio::process::Command::new(countersign());
    cmd.arg("mcp")
        .arg("--no-launch")
        .arg("--wait")
        .arg("10")
        .arg("--socket")
        .arg(socket)
        .arg("--")
        .arg("python3")
        .arg(obedient_server())
        .arg(log)
        .stderr(Stdio::null());
    let info = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("crash-agent", "1.0"),
    );
    info.serve(TokioChildProcess::new(cmd).unwrap())
        .await
        .unwrap()
}

async fn call(agent: &Agent, args: Value) -> Result<CallToolResult, String> {
    let args = args.as_object().cloned().unwrap();
    agent
        .call_tool(CallToolRequestParams::new("write").with_arguments(args))
        .await
        .map_err(|e| e.to_string())
}

/// How often the upstream executed `write` with each text.
fn executions(log: &Path) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    let text = std::fs::read_to_string(log).unwrap_or_default();
    for line in text.lines() {
        let entry: Value = serde_json::from_str(line).unwrap();
        if entry["method"] == "tools/call" && entry["params"]["name"] == "write" {
            let text = entry["params"]["arguments"]["text"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            *counts.entry(text).or_default() += 1;
        }
    }
    counts
}

fn spent(db: &Path, nonce: &countersign_core::Nonce) -> bool {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.query_row(
        "SELECT count(*) FROM spent_nonce WHERE nonce = ?1",
        [&nonce.as_bytes()[..]],
        |row| row.get::<_, i64>(0),
    )
    .unwrap()
        == 1
}

/// What one trial's agent got to see.
#[derive(Default)]
struct Seen {
    token: Option<String>,
    confirm: Option<Value>,
}

/// Preflight (approved by the desk child at once), then confirm, as far as the desk lets it.
async fn flow(agent: &Agent, text: &str, path: &Path) -> Seen {
    let mut seen = Seen::default();
    let args = json!({ "path": path, "text": text });
    let Ok(pre) = call(agent, args.clone()).await else {
        return seen;
    };
    let Some(token) = pre
        .structured_content
        .as_ref()
        .and_then(|s| s.get("confirmToken"))
        .and_then(Value::as_str)
    else {
        return seen;
    };
    let target = pre.structured_content.as_ref().unwrap()["confirmTarget"].clone();
    let mut confirm = args;
    confirm["confirm"] = json!(true);
    confirm["confirmTarget"] = target;
    confirm["confirmToken"] = json!(token);
    seen.token = Some(token.to_owned());
    seen.confirm = Some(confirm.clone());
    let _ = call(agent, confirm).await;
    seen
}

/// A small deterministic generator, seeded from the clock and printed, so a failing run can be
/// repeated with `COUNTERSIGN_CRASH_SEED`.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_desk_killed_at_any_moment_never_runs_an_approval_twice_or_one_nobody_approved() {
    let trials: usize = std::env::var("COUNTERSIGN_CRASH_TRIALS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let seed = std::env::var("COUNTERSIGN_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("crash trials: {trials}, seed {seed} (COUNTERSIGN_CRASH_SEED repeats it)");
    let mut random = Random(seed);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("desk.sock");
    let db = dir.path().join("desk.sqlite");
    let log = dir.path().join("upstream.log");
    let target = dir.path().join("written.txt");

    // How long the whole flow takes when nothing dies (the median of five): the kills are spread
    // over it, a little past its end, so that each step of it is hit.
    let desk = DeskChild::start(&socket, &db).await;
    let mut spans = Vec::new();
    for n in 0..5 {
        let calm = agent(&socket, &log).await;
        let text = format!("calibration-{n}");
        let started = Instant::now();
        let seen = flow(&calm, &text, &target).await;
        spans.push(started.elapsed());
        assert!(
            seen.confirm.is_some(),
            "the flow completes when nothing dies"
        );
        assert_eq!(executions(&log).get(&text), Some(&1));
        let _ = calm.cancel().await;
    }
    spans.sort();
    let span = spans[2];
    eprintln!(
        "one flow takes {:.1} ms (median of 5); kills land in 0..{:.1} ms",
        span.as_secs_f64() * 1e3,
        span.as_secs_f64() * 1.1e3
    );

    let mut desk = Some(desk);
    let mut approved: HashSet<String> = (0..5).map(|n| format!("calibration-{n}")).collect();
    let mut tokens = Vec::new();
    let mut moments = BTreeMap::<&str, usize>::new();
    for trial in 0..trials {
        let text = format!("trial-{trial}");
        let running = match desk.take() {
            Some(d) => d,
            None => DeskChild::start(&socket, &db).await,
        };
        let agent = agent(&socket, &log).await;
        let kill_after =
            Duration::from_micros(random.next() % (span.as_micros() as u64 * 13 / 10).max(1));
        let pid = running.pid as i32;
        let killer = tokio::spawn(async move {
            tokio::time::sleep(kill_after).await;
            // SAFETY: a signal to our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        });
        let seen = flow(&agent, &text, &target).await;
        killer.await.unwrap();
        running.killed().await;
        let _ = agent.cancel().await;

        // The store opens cleanly after every kill.
        let mut store = Store::open(&db, StoreOptions::default()).unwrap_or_else(|e| {
            panic!("trial {trial}: the store did not open after the kill: {e}")
        });
        let history = store.history(&HistoryFilter::all()).unwrap();
        drop(store);
        let ran = executions(&log).get(&text).copied().unwrap_or(0);
        assert!(ran <= 1, "trial {trial}: executed {ran} times");
        let moment = match (&seen.token, ran) {
            (None, 0) => "before the token reached the agent",
            (None, _) => panic!("trial {trial}: executed without a token reaching the agent"),
            (Some(_), 0) => "after approval, before execution",
            (Some(_), _) => "after execution",
        };
        *moments.entry(moment).or_default() += 1;
        if let Some(token) = &seen.token {
            approved.insert(text.clone());
            let claims = token::decode(&key(), token).unwrap();
            if ran == 1 {
                assert!(
                    spent(&db, &claims.nonce),
                    "trial {trial}: executed but not spent"
                );
            }
            for event in history.iter().filter(|e| e.nonce == Some(claims.nonce)) {
                match event.kind.code() {
                    "accepted" => assert!(
                        spent(&db, &claims.nonce),
                        "trial {trial}: accepted but not spent"
                    ),
                    "executed" => assert_eq!(ran, 1, "trial {trial}: history says executed"),
                    _ => {}
                }
            }
            tokens.push((text.clone(), seen.confirm.clone().unwrap(), claims.nonce));
        }
    }

    // After everything: every token replayed on a restarted desk is refused and runs nothing.
    let desk = DeskChild::start(&socket, &db).await;
    let replayer = agent(&socket, &log).await;
    let before = executions(&log);
    for (text, confirm, nonce) in tokens.iter().take(40) {
        let r = call(&replayer, confirm.clone()).await.unwrap();
        let code = r
            .structured_content
            .as_ref()
            .and_then(|s| s.get("refusal"))
            .and_then(Value::as_str);
        assert!(
            matches!(code, Some("wrong_tenant") | Some("expired")),
            "{text}: a replay after the restart was not refused: {r:?}"
        );
        if before.get(text) == Some(&1) {
            assert!(
                spent(&db, nonce),
                "{text}: executed, so its nonce must stay spent"
            );
        }
    }
    assert_eq!(executions(&log), before, "a replay executed something");
    let _ = replayer.cancel().await;
    desk.killed().await;

    // Nothing ran that nobody approved, and nothing ran twice.
    for (text, count) in executions(&log) {
        assert!(approved.contains(&text), "{text} ran without an approval");
        assert_eq!(count, 1, "{text} ran {count} times");
    }
    eprintln!("where the kills landed: {moments:?}");
}

/// Sets the soft file-size limit of process `pid` (the hard one stays as it is).
fn limit_file_size(pid: i32, bytes: libc::rlim_t) {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: reading and setting a resource limit of our own child through local structs.
    unsafe {
        assert_eq!(
            libc::prlimit(pid, libc::RLIMIT_FSIZE, std::ptr::null(), &mut old),
            0
        );
        let new = libc::rlimit {
            rlim_cur: bytes.min(old.rlim_max),
            rlim_max: old.rlim_max,
        };
        assert_eq!(
            libc::prlimit(pid, libc::RLIMIT_FSIZE, &new, std::ptr::null_mut()),
            0,
            "prlimit: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// A full disk at the moment of the spend (a file-size limit on the desk stands in for it):
/// `ledger_unreachable`, nothing runs; once there is room again the same approval spends and
/// runs, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_at_the_spend_runs_nothing_and_the_same_approval_works_once_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("desk.sock");
    let db = dir.path().join("desk.sqlite");
    let log = dir.path().join("upstream.log");
    let desk = DeskChild::start(&socket, &db).await;
    let agent = agent(&socket, &log).await;
    let args = json!({ "path": dir.path().join("w.txt"), "text": "full-disk" });
    let pre = call(&agent, args.clone()).await.unwrap();
    let s = pre.structured_content.clone().unwrap();
    let mut confirm = args;
    confirm["confirm"] = json!(true);
    confirm["confirmTarget"] = s["confirmTarget"].clone();
    confirm["confirmToken"] = s["confirmToken"].clone();
    let nonce = token::decode(&key(), s["confirmToken"].as_str().unwrap())
        .unwrap()
        .nonce;

    // No room for a single byte more in any file the desk writes.
    limit_file_size(desk.pid as i32, 1);
    let r = call(&agent, confirm.clone()).await.unwrap();
    let refusal = r
        .structured_content
        .as_ref()
        .and_then(|s| s.get("refusal"))
        .and_then(Value::as_str);
    assert_eq!(refusal, Some("ledger_unreachable"), "{r:?}");
    assert!(!spent(&db, &nonce));
    assert_eq!(
        executions(&log).get("full-disk"),
        None,
        "it ran on a full disk"
    );

    // Room again: the same token spends and runs, once.
    limit_file_size(desk.pid as i32, libc::RLIM_INFINITY);
    let r = call(&agent, confirm.clone()).await.unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(executions(&log).get("full-disk"), Some(&1));
    assert!(spent(&db, &nonce));
    let r = call(&agent, confirm).await.unwrap();
    let refusal = r
        .structured_content
        .as_ref()
        .and_then(|s| s.get("refusal"))
        .and_then(Value::as_str);
    assert_eq!(refusal, Some("already_used"));
    assert_eq!(executions(&log).get("full-disk"), Some(&1));
    let _ = agent.cancel().await;
    desk.killed().await;
}
