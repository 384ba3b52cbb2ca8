//! The MCP 2026-07-28 flow through the real window: the official Python SDK (`mcp` 2.3.0, in
//! target/peers/venv) as the agent, through the real `countersign mcp`, to the real desk under
//! Xvfb. In `mode="auto"` the SDK negotiates 2026-07-28; its call of the gated `execute` is
//! answered `input_required` with a URL elicitation naming the request in the desk; the SDK's
//! elicitation callback (tests/peers/mrtr_agent.py) says so and waits while this test clicks
//! Approve in the window, then answers "accept", and the SDK's own retry with the `requestState`
//! gets the tool's real result. A client in `mode="legacy"` beside it keeps the preflight/confirm
//! text flow. Needs a display, tauri-driver and the Python peer (`.ci/setup tests`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use countersign_tests::window::Desk;
use fantoccini::Locator;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

fn python() -> PathBuf {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/peers/venv/bin/python");
    assert!(
        python.exists(),
        "the Python MCP SDK is not installed in target/peers: run .ci/setup tests"
    );
    python
}

/// The Python agent, running: its steps arrive one JSON line at a time.
struct PythonAgent {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl PythonAgent {
    /// Starts tests/peers/mrtr_agent.py in `mode`, running `sql` through `execute` on `db`; what
    /// the gateway sends the agent is copied to `log`.
    fn start(desk: &Desk, mode: &str, db: &Path, sql: &str, log: &Path) -> PythonAgent {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/mrtr_agent.py");
        let mut child = tokio::process::Command::new(python())
            .arg(script)
            .arg(mode)
            .arg(countersign_tests::window::bin("countersign"))
            .arg(desk.socket())
            .arg(db)
            .arg(sql)
            .arg(log)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        PythonAgent {
            child,
            stdin,
            lines,
        }
    }

    /// The next step it printed, which must be `name`.
    async fn step(&mut self, name: &str) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("no step {name:?} within 60 s"))
            .unwrap()
            .unwrap_or_else(|| panic!("the Python agent ended before the step {name:?}"));
        let step: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(step["step"], json!(name), "{step}");
        step
    }

    /// Tells the waiting elicitation callback that the person has clicked.
    async fn clicked(&mut self) {
        self.stdin.write_all(b"clicked\n").await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    async fn finish(mut self) {
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the Python agent did not exit")
            .unwrap();
        assert!(status.success(), "the Python agent failed: {status}");
    }
}

fn rows(db: &Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn.prepare("SELECT v FROM t ORDER BY id").unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Types the target where the window asks for it, waits out the approve delay, clicks Approve.
async fn approve_in_the_window(desk: &Desk) {
    desk.wait_for_request().await;
    let typed = desk.browser.find(Locator::Css("#typed-target")).await;
    if let Ok(field) = typed
        && field.is_displayed().await.unwrap_or(false)
    {
        let target = desk.text("#d-target").await;
        field.send_keys(&target).await.unwrap();
    }
    desk.until("Approve to be enabled", |d| Box::pin(d.approve_enabled()))
        .await;
    desk.click("#approve").await;
    desk.until("the queue to empty", |d| {
        Box::pin(async move { !d.visible_request().await })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_07_28_client_confirms_by_its_own_retry_after_the_click_and_an_older_one_keeps_the_text_flow()
 {
    let desk = Desk::start().await;
    let db = desk.dir.path().join("app.sqlite");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
        .unwrap();

    // 2026-07-28: input_required, the click, the SDK's own retry.
    let modern_log = desk.dir.path().join("agent-in-modern.jsonl");
    let sql = "INSERT INTO t (v) VALUES ('modern')";
    let mut modern = PythonAgent::start(&desk, "auto", &db, sql, &modern_log);
    assert_eq!(
        modern.step("connected").await["protocol"],
        json!("2026-07-28")
    );
    let elicited = modern.step("elicited").await;
    assert_eq!(elicited["mode"], json!("url"), "{elicited}");
    let url = elicited["url"].as_str().unwrap();
    assert!(url.starts_with("countersign://request/"), "{url}");
    assert!(
        elicited["message"]
            .as_str()
            .unwrap()
            .contains("waits for a person's decision in the Countersign desk"),
        "{elicited}"
    );
    approve_in_the_window(&desk).await;
    // Approved, and still nothing ran: only the client's retry runs it.
    assert!(rows(&db).is_empty());
    modern.clicked().await;
    modern.step("answering").await;
    let result = modern.step("result").await;
    assert_eq!(result["result"]["isError"], json!(false), "{result}");
    modern.finish().await;
    assert_eq!(rows(&db), ["modern"]);

    // Everything the agent was sent: the elicitation and the state, never a token.
    let seen = std::fs::read_to_string(&modern_log).unwrap();
    assert!(seen.contains("\"input_required\""), "{seen}");
    assert!(seen.contains("\"requestState\":\"csr1."), "{seen}");
    assert!(!seen.contains("cs1."), "a token reached the agent: {seen}");
    assert!(!seen.contains("\"confirmToken\":\""), "{seen}");

    // An older client: the preflight waits for the click and hands over the token to confirm.
    let legacy_log = desk.dir.path().join("agent-in-legacy.jsonl");
    let sql = "INSERT INTO t (v) VALUES ('legacy')";
    let mut legacy = PythonAgent::start(&desk, "legacy", &db, sql, &legacy_log);
    assert_eq!(
        legacy.step("connected").await["protocol"],
        json!("2025-11-25")
    );
    approve_in_the_window(&desk).await;
    let preflight = legacy.step("result").await;
    let token = preflight["result"]["structuredContent"]["confirmToken"]
        .as_str()
        .unwrap_or_else(|| panic!("no token in the preflight: {preflight}"));
    assert!(token.starts_with("cs1."), "{token}");
    let confirm = legacy.step("confirm").await;
    assert_eq!(confirm["result"]["isError"], json!(false), "{confirm}");
    legacy.finish().await;
    assert_eq!(rows(&db), ["modern", "legacy"]);
    assert!(
        !std::fs::read_to_string(&legacy_log)
            .unwrap()
            .contains("input_required")
    );

    desk.click("#tab-history").await;
    desk.until("both calls issued, accepted and executed in history", |d| {
        Box::pin(async move {
            let rows: Value = d
                .browser
                .execute("return [...document.querySelectorAll('#history tr')].map(r => r.children[1].textContent + ':' + r.children[2].textContent + ':' + r.children[4].textContent)", vec![])
                .await
                .unwrap();
            let rows: Vec<String> = serde_json::from_value(rows).unwrap();
            let count = |prefix: &str| rows.iter().filter(|r| r.starts_with(prefix)).count();
            count("issued:") == 2 && count("accepted:") == 2 && count("executed:ok") == 2
        })
    })
    .await;
    desk.stop().await;
}
