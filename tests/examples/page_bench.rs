//! The approvers' page of `countersign serve`, measured in Debian's Chromium on a phone's screen
//! (390×844) with the WebDriver virtual authenticator as the passkey; printed, not asserted (the
//! machines are shared and noisy; a wrong answer makes the run exit 1). Needs PostgreSQL and
//! Chromium: `make bench` runs it under `.ci/with-postgres`.
//!
//! For each of N calls (an agent's `execute`, waiting for a person):
//! - **page load to the call shown**: from the navigation to `/call/ID` (the notice's link) to
//!   the call's target on screen, read in the page (`performance.now()`, so WebDriver's own
//!   round trips are not counted);
//! - **page load to a clickable Approve**: the same, to the moment Approve is enabled (the target
//!   typed by the test at once; the approve delay, 1 s, is most of it, by design);
//! - **decision round trip**: from the click on Approve to the page saying "Approved" (the
//!   decision's challenge from the server, the passkey's assertion, the server's check, the
//!   decision kept and put on the shared row), and to the agent's answer.
//!
//! Environment: `COUNTERSIGN_PAGE_BENCH_CALLS` (20).

use std::time::{Duration, Instant};

use countersign_tests::browser::Browser;
use countersign_tests::ports::free_port;
use countersign_tests::team_server::{call, post, serve, tools_db};
use countersign_tests::window::bin;
use fantoccini::Locator;
use serde_json::{Value, json};

/// Waits in the page (a MutationObserver, no polling) until `what` holds: `shown` (the call's
/// target on screen) or `clickable` (Approve enabled); answers `performance.now()` at that
/// moment, in ms since the navigation began. (The page's policy forbids eval: no expression is
/// passed in.)
const UNTIL: &str = r#"
    const [what, done] = arguments;
    const tests = {
      shown: () => document.getElementById("c-target").textContent === "notes",
      clickable: () => !document.getElementById("approve").disabled,
    };
    const check = tests[what];
    if (check()) { done(performance.now()); return; }
    const seen = new MutationObserver(() => { if (check()) { seen.disconnect(); done(performance.now()); } });
    seen.observe(document, { subtree: true, childList: true, attributes: true, characterData: true });
"#;

/// Clicks Approve and waits in the page for the outcome; answers the ms between.
const APPROVE: &str = r#"
    const [done] = arguments;
    const start = performance.now();
    const outcome = document.getElementById("outcome");
    const seen = new MutationObserver(() => {
      if (outcome.dataset.outcome) { seen.disconnect(); done([performance.now() - start, outcome.dataset.outcome]); }
    });
    seen.observe(outcome, { attributes: true });
    document.getElementById("approve").click();
"#;

fn percentile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    values[((values.len() as f64 - 1.0) * q).round() as usize]
}

fn main() {
    let calls: usize = std::env::var("COUNTERSIGN_PAGE_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dsn = runtime.block_on(countersign_tests::postgres::shared_database());
    let dir = tempfile::tempdir().unwrap();
    let db = tools_db(dir.path());
    let web = free_port();
    let origin = format!("http://localhost:{web}");
    let env = [
        ("CONFIRM_SECRET", "page-bench-secret-0123456789abcdef"),
        ("CONTROL_DSN", dsn.as_str()),
    ];
    let server = serve(
        &[
            "--behind-tls-proxy",
            "--unauthenticated",
            "--wait",
            "120",
            "--db",
            db.to_str().unwrap(),
            "--approver-url",
            "https://approvers.example.test",
            "--approver-web",
            &format!("127.0.0.1:{web}"),
            "--approver-web-origin",
            &origin,
        ],
        &env,
    );
    let invite = std::process::Command::new(bin("countersign-serve"))
        .args(["approver", "invite", "pat", "--page", &origin])
        .env("CONTROL_DSN", &dsn)
        .output()
        .unwrap();
    assert!(invite.status.success(), "{invite:?}");
    let link = String::from_utf8_lossy(&invite.stdout).trim().to_owned();

    runtime.block_on(async {
        let browser = Browser::start(390, 844).await;
        let c = &browser.client;
        c.goto(&link).await.unwrap();
        let wait = |css: &'static str| async move {
            c.wait()
                .at_most(Duration::from_secs(30))
                .for_element(Locator::Css(css))
                .await
                .unwrap_or_else(|e| panic!("{css}: {e}"))
        };
        wait("#enroll-go").await.click().await.unwrap();
        wait("#enrolled").await;
        wait("#signin-go").await.click().await.unwrap();
        wait("#who:not([hidden])").await;

        let (mut shown, mut clickable, mut decided, mut answered) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for n in 0..calls {
            let port = server.port;
            let agent = std::thread::spawn(move || {
                let sql = format!("INSERT INTO notes(body) VALUES ('bench {n}')");
                post(port, &call("execute", json!({ "sql": sql })), None)
            });
            // The call's number, as the notice's link would carry it.
            let id = loop {
                let (_, body) = browser.fetch("GET", "/api/v1/requests", None).await;
                if let Some(id) = body["calls"][0]["id"].as_u64() {
                    break id;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            c.goto(&format!("{origin}/call/{id}")).await.unwrap();
            let at_shown: Value = c.execute_async(UNTIL, vec![json!("shown")]).await.unwrap();
            let field = c.find(Locator::Id("typed-input")).await.unwrap();
            field.send_keys("notes").await.unwrap();
            let at_clickable: Value = c
                .execute_async(UNTIL, vec![json!("clickable")])
                .await
                .unwrap();
            let clicked = Instant::now();
            let outcome: Value = c.execute_async(APPROVE, vec![]).await.unwrap();
            assert_eq!(outcome[1], "approved", "{outcome}");
            let answer = tokio::task::spawn_blocking(move || agent.join().unwrap())
                .await
                .unwrap();
            let agent_ms = clicked.elapsed().as_secs_f64() * 1e3;
            assert_eq!(
                answer["result"]["structuredContent"]["approved"], true,
                "{answer}"
            );
            shown.push(at_shown.as_f64().unwrap());
            clickable.push(at_clickable.as_f64().unwrap());
            decided.push(outcome[0].as_f64().unwrap());
            answered.push(agent_ms);
        }
        println!(
            "approvers' page, {calls} calls, Chromium {}×{} (phone), virtual authenticator:",
            390, 844
        );
        for (what, values) in [
            ("page load to the call shown", &mut shown),
            (
                "page load to a clickable Approve (1 s delay included)",
                &mut clickable,
            ),
            (
                "decision round trip: click to \"Approved\" on the page",
                &mut decided,
            ),
            (
                "decision round trip: click to the agent's answer",
                &mut answered,
            ),
        ] {
            println!(
                "  {what:<56} p50 {:>7.1} ms   p95 {:>7.1} ms",
                percentile(values, 0.5),
                percentile(values, 0.95)
            );
        }
    });
    drop(server);
}
