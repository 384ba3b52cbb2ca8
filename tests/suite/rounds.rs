//! The MCP 2026-07-28 flow through the real window: the official Python SDK (`mcp` 2.3.0, in
//! target/peers/venv) as the agent, through the real `countersign mcp`, to the real desk under
//! Xvfb. In `mode="auto"` the SDK negotiates 2026-07-28; its call of the gated `execute` is
//! answered `input_required` with a URL elicitation naming the request in the desk; the SDK's
//! elicitation callback (tests/peers/mrtr_agent.py) says so and waits while this test clicks
//! Approve in the window, then answers "accept", and the SDK's own retry with the `requestState`
//! gets the tool's real result. A client in `mode="legacy"` beside it keeps the preflight/confirm
//! text flow. Needs a display, tauri-driver and the Python peer (`.ci/setup tests`).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use countersign_tests::window::Desk;
use fantoccini::Locator;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use countersign_tests::peers::python;

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

    /// Starts it in `auto` mode (2026-07-28) running `sql`, what the gateway sends it copied to
    /// `agent-in-<name>.jsonl` in the desk's directory, until its call is elicited: the agent and
    /// the URL the elicitation names.
    async fn elicited(desk: &Desk, db: &Path, name: &str, sql: &str) -> (PythonAgent, String) {
        let log = desk.dir.path().join(format!("agent-in-{name}.jsonl"));
        let mut agent = PythonAgent::start(desk, "auto", db, sql, &log);
        agent.step("connected").await;
        let url = agent.step("elicited").await["url"]
            .as_str()
            .unwrap()
            .to_owned();
        (agent, url)
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
    let typed = desk.browser().find(Locator::Css("#typed-target")).await;
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
                .browser()
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

/// Runs `countersign open URL` against this desk's socket: its exit code and stderr.
async fn open_in_the_desk(desk: &Desk, url: &str) -> (Option<i32>, String) {
    let mut open = tokio::process::Command::new(countersign_tests::window::bin("countersign"));
    open.arg("open")
        .arg(url)
        .env("COUNTERSIGN_SOCKET", desk.socket())
        .stdin(Stdio::null());
    code_and_stderr(open, "countersign open exits").await
}

/// Runs `cmd` to its end, failing with `exits` if it has not within 20 s: its exit code and
/// stderr.
async fn code_and_stderr(mut cmd: tokio::process::Command, exits: &str) -> (Option<i32>, String) {
    let out = tokio::time::timeout(Duration::from_secs(20), cmd.output())
        .await
        .expect(exits)
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The target of the request the window shows, and how many requests it lists as selected.
async fn shown_target(desk: &Desk) -> (String, usize) {
    let selected: Value = desk
        .browser()
        .execute(
            "return document.querySelectorAll('#queue li.selected').length",
            vec![],
        )
        .await
        .unwrap();
    (
        desk.text("#d-target").await,
        selected.as_u64().unwrap() as usize,
    )
}

/// The URL a 2026-07-28 client is sent opens that request in the desk: `countersign open
/// countersign://request/<id>` selects it in the running window (another request was shown), the
/// engine's approve delay starts again (an approve through the page's IPC right then is refused
/// too_soon, and the button is disabled), and nothing is approved or run. A URL with anything
/// more (`?approve=1`, `/approve`) is refused and changes nothing; a request no longer waiting
/// is said to be so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_a_request_url_shows_that_request_and_approves_nothing() {
    let desk =
        Desk::start_with_settings(json!({"token_minutes": 10, "approve_delay_ms": 4000})).await;
    let db = desk.dir.path().join("app.sqlite");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch("CREATE TABLE first (v TEXT); CREATE TABLE second (v TEXT)")
        .unwrap();
    let count = |table: &str| -> i64 {
        rusqlite::Connection::open(&db)
            .unwrap()
            .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    };

    let (first, first_url) =
        PythonAgent::elicited(&desk, &db, "first", "INSERT INTO first (v) VALUES ('one')").await;
    desk.wait_for_request().await;
    let (second, url) = PythonAgent::elicited(
        &desk,
        &db,
        "second",
        "INSERT INTO second (v) VALUES ('two')",
    )
    .await;
    let id: u64 = countersign_wire::parse_request_url(&url).unwrap();
    desk.until("both requests listed", |d| {
        Box::pin(async move {
            d.browser()
                .execute(
                    "return document.querySelectorAll('#queue li').length",
                    vec![],
                )
                .await
                .is_ok_and(|n| n == json!(2))
        })
    })
    .await;
    // The first is shown; once the delay has passed since the second arrived, either could be
    // approved.
    assert_eq!(shown_target(&desk).await, ("first".to_owned(), 1));
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert!(!desk.text("#wait").await.starts_with("Approve in"));

    // Hostile variants of the URL: refused, nothing sent, the window unchanged.
    for bad in [
        format!("{url}?approve=1"),
        format!("{url}/approve"),
        url.to_uppercase(),
        format!(" {url}"),
        "countersign://request/99999999999999999999999".to_owned(),
    ] {
        let (code, stderr) = open_in_the_desk(&desk, &bad).await;
        assert_eq!(code, Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("not a request URL"), "{stderr}");
    }
    assert_eq!(shown_target(&desk).await, ("first".to_owned(), 1));
    assert!(!desk.text("#wait").await.starts_with("Approve in"));

    // The URL itself: the second request is shown and Approve waits again.
    let (code, stderr) = open_in_the_desk(&desk, &url).await;
    assert_eq!(code, Some(0), "{stderr}");
    desk.until("the second request shown", |d| {
        Box::pin(async move { shown_target(d).await == ("second".to_owned(), 1) })
    })
    .await;
    assert!(!desk.approve_enabled().await, "Approve enabled at once");
    assert!(desk.text("#wait").await.starts_with("Approve in"));
    let early = desk
        .invoke("approve", json!({"id": id, "typedTarget": "second"}))
        .await;
    assert_eq!(early.unwrap_err()["code"], json!("too_soon"));
    let pending = desk.invoke("pending", json!({})).await.unwrap();
    assert_eq!(pending.as_array().unwrap().len(), 2, "{pending}");
    assert_eq!((count("first"), count("second")), (0, 0));

    // The desktop entry's way: the desk binary with the URL asks the running desk, and exits.
    // With anything but a request URL it refuses and does nothing.
    let desk_with = |url: String| {
        let mut run =
            tokio::process::Command::new(countersign_tests::window::bin("countersign-desk"));
        run.arg(url)
            .env("COUNTERSIGN_DESK_DIR", desk.dir.path())
            .env("COUNTERSIGN_SOCKET", desk.socket())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        code_and_stderr(run, "the second desk exits")
    };
    let (code, stderr) = desk_with(format!("{first_url}#approve")).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("not a request URL"), "{stderr}");
    assert_eq!(shown_target(&desk).await, ("second".to_owned(), 1));
    let (code, stderr) = desk_with(first_url.clone()).await;
    assert_eq!(code, Some(0), "{stderr}");
    desk.until("the first request shown again", |d| {
        Box::pin(async move { shown_target(d).await == ("first".to_owned(), 1) })
    })
    .await;
    assert!(desk.text("#wait").await.starts_with("Approve in"));

    // A request that no longer waits: the window says so.
    let (code, _) = open_in_the_desk(&desk, "countersign://request/18446744073709551615").await;
    assert_eq!(code, Some(0));
    desk.until("the window to say it no longer waits", |d| {
        Box::pin(async move {
            d.text("#focus-note").await == "Request 18446744073709551615 is no longer waiting."
        })
    })
    .await;
    assert_eq!(
        desk.invoke("pending", json!({}))
            .await
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!((count("first"), count("second")), (0, 0));
    drop((first, second));
    desk.stop().await;
}

/// A request URL opened while the desk's window is released (closed and idle) creates the window
/// again, and the page it loads takes the URL's request: one no longer waiting is said to be so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_url_brings_a_released_window_back_saying_what_no_longer_waits() {
    let desk = Desk::start_with(&[("COUNTERSIGN_DEBUG_RELEASE_AFTER_MS", "1000")]).await;
    let pid = desk.pid().await;
    desk.close_window().await;
    crate::desk::until_released(pid).await;
    let (code, stderr) = open_in_the_desk(&desk, "countersign://request/41").await;
    assert_eq!(code, Some(0), "{stderr}");
    desk.follow_window().await;
    desk.until("the window to say request 41 no longer waits", |d| {
        Box::pin(async move { d.text("#focus-note").await == "Request 41 is no longer waiting." })
    })
    .await;
    assert_eq!(desk.pid().await, pid, "the same desk answers");
    desk.stop().await;
}
