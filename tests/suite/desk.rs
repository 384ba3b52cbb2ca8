//! The desk end to end, as a user meets it: a real MCP client starts the real `countersign mcp`,
//! which reaches the real desk (the Tauri app, under Xvfb, with the real keychain and SQLite
//! file), and the test clicks the real Approve or Deny button through WebDriver (tauri-driver +
//! WebKitWebDriver). Each test has its own data, config and socket. Needs a display (the test
//! command runs everything under Xvfb) and `tauri-driver` (installed by the test setup).
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

use std::process::Stdio;
use std::time::{Duration, Instant};

use countersign_tests::group;
use countersign_tests::peers;
use countersign_tests::window::{Desk, bin};
use fantoccini::Locator;
use rmcp::RoleClient;
use rmcp::model::*;
use rmcp::service::RunningService;
use serde_json::{Map, Value, json};

fn args(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

type Call = tokio::task::JoinHandle<CallToolResult>;

fn call(agent: &RunningService<RoleClient, ClientConfig>, tool: &str, arguments: Value) -> Call {
    let peer = agent.peer().clone();
    let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args(arguments));
    tokio::spawn(async move { peer.call_tool(params).await.unwrap() })
}

fn refusal(r: &CallToolResult) -> Option<String> {
    r.structured_content
        .as_ref()?
        .get("refusal")?
        .as_str()
        .map(str::to_owned)
}

fn confirm_of(preflight: &CallToolResult, mut arguments: Value) -> Value {
    let s = preflight
        .structured_content
        .as_ref()
        .expect("an approved preflight has structured content");
    arguments["confirm"] = json!(true);
    arguments["confirmTarget"] = s["confirmTarget"].clone();
    arguments["confirmToken"] = s["confirmToken"].clone();
    arguments
}

/// Approves the request shown through the page's IPC, past its button, as a script running in
/// the window could: the error the engine gives.
async fn approve_by_script(desk: &Desk) -> Value {
    let pending = desk.invoke("pending", json!({})).await.unwrap();
    let id = pending[0]["id"].clone();
    desk.invoke("approve", json!({"id": id, "typedTarget": null}))
        .await
        .expect_err("an approve by script sooner than the delay")
}

/// Waits out the approve delay, as a person reading the request would.
async fn read_then_approve(desk: &Desk) {
    desk.until("Approve to be enabled", |d| Box::pin(d.approve_enabled()))
        .await;
    desk.click("#approve").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clicking_approve_mints_the_token_and_the_confirm_executes() {
    let desk = Desk::start().await;
    let agent = desk.agent("claude-code").await;
    let create = json!({"sql": "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)"});
    let pending = call(&agent, "execute", create.clone());
    desk.wait_for_request().await;
    assert_eq!(desk.text("#approve").await, "Approve");
    assert_eq!(desk.text("#deny").await, "Deny");
    assert_eq!(desk.text("#d-agent").await, "claude-code 1.0");
    desk.screenshot("approval-irreversible.png").await;
    // execute is destructive: the target must be typed first.
    let target = desk.text("#d-target").await;
    desk.browser()
        .find(Locator::Css("#typed-target"))
        .await
        .unwrap()
        .send_keys(&target)
        .await
        .unwrap();
    read_then_approve(&desk).await;
    let preflight = pending.await.unwrap();
    assert_ne!(preflight.is_error, Some(true), "{preflight:?}");
    let done = call(&agent, "execute", confirm_of(&preflight, create))
        .await
        .unwrap();
    assert_ne!(done.is_error, Some(true), "{done:?}");
    let tables = call(&agent, "list_tables", json!({})).await.unwrap();
    assert_eq!(
        tables.structured_content.unwrap()["rows"],
        json!([{"name": "notes"}])
    );
    desk.until("the queue to empty", |d| {
        Box::pin(async move { !d.visible_request().await })
    })
    .await;
    desk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_with_a_note_reaches_the_agent() {
    let desk = Desk::start().await;
    let agent = desk.agent("cursor").await;
    let pending = call(&agent, "create_backup", json!({"name": "nightly"}));
    desk.wait_for_request().await;
    desk.screenshot("approval-reversible.png").await;
    desk.browser()
        .find(Locator::Css("#deny-note"))
        .await
        .unwrap()
        .send_keys("not during the release")
        .await
        .unwrap();
    desk.click("#deny").await;
    let r = pending.await.unwrap();
    assert_eq!(refusal(&r).as_deref(), Some("denied"));
    let text: String = r
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    assert!(text.contains("not during the release"), "{text}");
    desk.stop().await;
}

/// Where Deny and Approve are in the window's viewport, and what a click at each one's middle
/// would hit: `[[left, top, width, height, id hit], ...]`, with the viewport's height last.
async fn decision_buttons(desk: &Desk) -> Value {
    desk.browser()
        .execute(
            "return [...['deny', 'approve'].map((id) => {
               const r = document.getElementById(id).getBoundingClientRect();
               const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
               return [r.left, r.top, r.width, r.height, hit && hit.id];
             }), window.innerHeight]",
            vec![],
        )
        .await
        .unwrap()
}

/// Deny and Approve stay at the foot of the request, in sight however long the request is, and
/// do not move while the person's pointer may be on them: not when another request joins the
/// queue, not when a notice appears above them (here: the agent stopped waiting). A click where
/// Deny was still lands on Deny. (A notice that pushed them down once had a click meant for Deny
/// land on the note field above it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_and_approve_stay_in_sight_and_under_the_pointer_when_the_request_changes_above_them()
{
    let desk = Desk::start().await;
    let agent = desk.agent("cursor").await;
    let first = call(&agent, "create_backup", json!({"name": "nightly"}));
    desk.wait_for_request().await;
    let before = decision_buttons(&desk).await;
    let height = before[2].as_f64().unwrap();
    for (button, id) in before.as_array().unwrap()[..2]
        .iter()
        .zip(["deny", "approve"])
    {
        let (top, tall) = (button[1].as_f64().unwrap(), button[3].as_f64().unwrap());
        assert!(
            top >= 0.0 && top + tall <= height,
            "{id} out of sight: {before}"
        );
        assert_eq!(
            button[4],
            json!(id),
            "a click on {id} hits something else: {before}"
        );
    }

    // Another request joins the queue (a long one: its target must be typed).
    let other = desk.agent("claude-code").await;
    let second = call(&other, "delete_backup", json!({"name": "weekly"}));
    desk.until_page(
        "two requests queued",
        "document.querySelectorAll('#queue li').length === 2",
    )
    .await;
    assert_eq!(
        decision_buttons(&desk).await,
        before,
        "another request joined"
    );

    // The first agent stops waiting (its call dropped: its client cancels it) and stays
    // connected: a notice appears above the request's fields.
    first.abort();
    desk.until_page(
        "the stopped notice",
        "!document.getElementById('d-stopped').hidden",
    )
    .await;
    assert_eq!(
        decision_buttons(&desk).await,
        before,
        "a notice appeared above"
    );

    // The long request, shown: its Deny is where the first one's was, in sight.
    desk.click("#queue li:nth-child(2)").await;
    desk.until_page(
        "the second request shown",
        "document.getElementById('typed').hidden === false",
    )
    .await;
    assert_eq!(
        decision_buttons(&desk).await,
        before,
        "the other request shown"
    );
    desk.click("#deny").await;
    assert_eq!(refusal(&second.await.unwrap()).as_deref(), Some("denied"));
    // The stopped request still waits, for its agent to ask again.
    desk.until_page(
        "the denied request gone, the stopped one still queued",
        "document.querySelectorAll('#queue li').length === 1",
    )
    .await;
    assert!(desk.text("#queue").await.contains("create_backup"));
    drop(agent);
    desk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_click_in_the_first_second_and_enter_do_nothing() {
    // A raised delay (settings may raise it, never lower it) keeps the early click early even on
    // a slow machine.
    let desk =
        Desk::start_with_settings(json!({"token_minutes": 10, "approve_delay_ms": 4000})).await;
    let agent = desk.agent("vscode").await;
    let mut pending = call(&agent, "create_backup", json!({"name": "early"}));
    desk.wait_for_request().await;
    // Straight away: the button is still disabled, and a click does nothing.
    assert!(!desk.approve_enabled().await, "Approve must start disabled");
    let _ = desk
        .browser()
        .find(Locator::Css("#approve"))
        .await
        .unwrap()
        .click()
        .await;
    // The raised delay is honoured: still disabled past the default second, and the engine
    // itself refuses an approve that a script in the page sends past the button.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !desk.approve_enabled().await,
        "the raised approve delay was not honoured"
    );
    let early = approve_by_script(&desk).await;
    assert_eq!(early["code"], "too_soon", "{early}");
    assert!(early["wait_ms"].as_u64().unwrap() > 500, "{early}");
    // Once enabled, Enter on the focused button does nothing either.
    desk.until("Approve to be enabled", |d| Box::pin(d.approve_enabled()))
        .await;
    let button = desk.browser().find(Locator::Css("#approve")).await.unwrap();
    desk.browser()
        .execute("document.getElementById('approve').focus()", vec![])
        .await
        .unwrap();
    button.send_keys("\u{E007}").await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), &mut pending)
            .await
            .is_err(),
        "an early click or Enter approved the request"
    );
    assert!(desk.visible_request().await);
    desk.click("#approve").await;
    let r = pending.await.unwrap();
    assert!(r.structured_content.unwrap()["confirmToken"].is_string());
    desk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn space_on_the_focused_approve_button_does_not_approve() {
    let desk = Desk::start().await;
    let agent = desk.agent("vscode").await;
    let mut pending = call(&agent, "create_backup", json!({"name": "space"}));
    desk.wait_for_request().await;
    desk.until("Approve to be enabled", |d| Box::pin(d.approve_enabled()))
        .await;
    desk.browser()
        .execute("document.getElementById('approve').focus()", vec![])
        .await
        .unwrap();
    let button = desk.browser().find(Locator::Css("#approve")).await.unwrap();
    button.send_keys(" ").await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), &mut pending)
            .await
            .is_err(),
        "Space on the focused Approve button approved the request"
    );
    assert!(desk.visible_request().await);
    desk.click("#approve").await;
    let r = pending.await.unwrap();
    assert!(r.structured_content.unwrap()["confirmToken"].is_string());
    desk.stop().await;
}

/// The window's first read of the queue races the first event: here its answer, read before the
/// request arrived, comes back seconds after the event that carries the request. The request is
/// shown all the same (before, an older answer arriving last emptied the queue, and a request
/// sent while a window was loading stayed unseen: two CI failures).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_arriving_while_the_window_reads_the_queue_is_shown() {
    let desk = Desk::start_with(&[("COUNTERSIGN_DEBUG_PENDING_LATE_MS", "4000")]).await;
    let agent = desk.agent("while-loading").await;
    let pending = call(&agent, "create_backup", json!({"name": "early"}));
    desk.wait_for_request().await;
    // Past the late answer: the request is still shown.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert!(
        desk.visible_request().await,
        "the late answer hid the request"
    );
    assert!(desk.text("#d-target").await.contains("early"));
    deny_by_script(&desk).await;
    assert_eq!(refusal(&pending.await.unwrap()).as_deref(), Some("denied"));
    desk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_raised_in_settings_is_kept_by_the_engine_and_the_window_waits_it_out() {
    let desk = Desk::start().await;
    let agent = desk.agent("claude-code").await;
    let mut pending = call(&agent, "create_backup", json!({"name": "raised"}));
    desk.wait_for_request().await;
    // The window's own wait is the second it read at start; the delay is raised behind it.
    let mut view = desk.invoke("settings", json!({})).await.unwrap();
    view["settings"]["approve_delay_ms"] = json!(6000);
    desk.invoke("save_settings", json!({"view": view}))
        .await
        .unwrap();
    desk.until("Approve to be enabled", |d| Box::pin(d.approve_enabled()))
        .await;
    desk.click("#approve").await;
    // The engine refuses it as too soon; the window holds Approve for as long as it says.
    desk.until("Approve to be held again", |d| {
        Box::pin(async move { !d.approve_enabled().await })
    })
    .await;
    assert!(desk.text("#wait").await.starts_with("Approve in"));
    assert!(desk.text("#error").await.is_empty());
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut pending)
            .await
            .is_err(),
        "approved sooner than the raised delay"
    );
    read_then_approve(&desk).await;
    let r = pending.await.unwrap();
    assert!(r.structured_content.unwrap()["confirmToken"].is_string());
    desk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destructive_request_needs_the_typed_target() {
    let desk = Desk::start().await;
    let agent = desk.agent("claude-desktop").await;
    let pending = call(&agent, "delete_backup", json!({"name": "weekly"}));
    desk.wait_for_request().await;
    assert!(desk.text("#reversibility").await.contains("IRREVERSIBLE"));
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(
        !desk.approve_enabled().await,
        "Approve is enabled without the typed target"
    );
    let input = desk
        .browser()
        .find(Locator::Css("#typed-target"))
        .await
        .unwrap();
    input.send_keys("weekl").await.unwrap();
    assert!(
        !desk.approve_enabled().await,
        "a partial target enabled Approve"
    );
    input.send_keys("y").await.unwrap();
    read_then_approve(&desk).await;
    let r = pending.await.unwrap();
    assert!(r.structured_content.unwrap()["confirmToken"].is_string());
    desk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_show_two_requests_in_one_queue_and_the_title_counts_them() {
    let desk = Desk::start().await;
    let first = desk.agent("agent-one").await;
    let second = desk.agent("agent-two").await;
    let a = call(&first, "create_backup", json!({"name": "one"}));
    let b = call(&second, "create_backup", json!({"name": "two"}));
    desk.until("two requests", |d| {
        Box::pin(async move {
            let n: Value = d
                .browser()
                .execute(
                    "return document.querySelectorAll('#queue li').length",
                    vec![],
                )
                .await
                .unwrap();
            n == json!(2)
        })
    })
    .await;
    desk.until("the title to count two", |d| {
        Box::pin(async move { d.browser().title().await.unwrap().contains("(2 pending)") })
    })
    .await;
    let who: Value = desk
        .browser()
        .execute("return [...document.querySelectorAll('#queue li small')].map(e => e.textContent).join('|')", vec![])
        .await
        .unwrap();
    assert!(
        who.as_str().unwrap().contains("agent-one") && who.as_str().unwrap().contains("agent-two"),
        "{who}"
    );
    drop(first);
    drop(second);
    a.abort();
    b.abort();
    desk.stop().await;
}

/// The characters an agent could use to make one string read as another: the right-to-left
/// override, the directional isolates, the right-to-left mark, zero-width space and joiner, and
/// the byte order mark.
const SNEAKY: [char; 9] = [
    '\u{202e}', '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}', '\u{200f}', '\u{200b}', '\u{200d}',
    '\u{feff}',
];

/// Fails on any raw invisible or direction-changing character anywhere in the page.
async fn assert_nothing_raw(desk: &Desk, when: &str) {
    let page = desk.page_text().await;
    let raw: Vec<String> = page
        .chars()
        .filter(|c| SNEAKY.contains(c) || countersign_core::render::is_deceptive(*c))
        .map(|c| format!("U+{:04X}", c as u32))
        .collect();
    assert!(raw.is_empty(), "{when}: raw {raw:?} in the page:\n{page:?}");
}

/// Also takes the README's picture (tests/readme/approval.png): see `Desk::readme_picture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bidi_and_invisible_characters_from_agents_and_upstreams_never_reach_the_screen_raw() {
    let desk = Desk::start().await;
    let agent = desk.agent("claude-code").await;
    // The target, so also the summary, hides a right-to-left override and a zero-width space;
    // an argument the tool does not declare carries the rest.
    let sneaky = "nightly\u{202e}txt.exe\u{200b}";
    let arguments = json!({
        "name": sneaky,
        "reason": "clean\u{2066}up\u{2069} \u{feff}old\u{200d} \u{2067}backups\u{2068} \u{200f}",
    });
    let mut first = call(&agent, "delete_backup", arguments);
    desk.wait_for_request().await;
    // A second agent whose own name, and the database path it reaches (so the server the desk
    // names), carry more; its target names the details field.
    let odd = desk.dir.path().join("re\u{202e}ports");
    std::fs::create_dir_all(&odd).unwrap();
    let other = desk
        .agent_on("cursor\u{2067}\u{feff}", &odd.join("app.sqlite"))
        .await;
    let second = call(
        &other,
        "create_backup",
        json!({"name": "Details: \u{200f}x"}),
    );
    desk.until("two requests", |d| {
        Box::pin(async move { d.count("#queue li").await == 2 })
    })
    .await;

    assert_eq!(
        desk.text("#d-target").await,
        "nightly\\u{202e}txt.exe\\u{200b}"
    );
    assert_eq!(
        desk.text("#d-summary").await,
        "delete_backup on nightly\\u{202e}txt.exe\\u{200b}"
    );
    let all = ["bidi", "invisible", "non_ascii"];
    for field in ["target", "summary", "details"] {
        let flags = desk.flags(&format!("#d-{field}-flags .flag")).await;
        assert_eq!(flags, all, "{field}");
    }
    assert!(desk.flags("#d-agent-flags .flag").await.is_empty());
    assert_eq!(
        desk.count("#queue li .mark").await,
        4,
        "the first entry's target is flagged; the second's agent, server and target"
    );
    assert_nothing_raw(&desk, "the first request").await;
    // The state the README shows: read, the delay over, the target still to type.
    desk.until("the hint to type the target", |d| {
        Box::pin(async move { d.text("#wait").await == "Type the target to enable Approve." })
    })
    .await;
    // As tall as the test screen, so the picture shows the buttons too.
    desk.browser().set_window_size(960, 800).await.unwrap();
    desk.readme_picture("approval").await;

    // The second request: its agent and server are flagged, and a target that says "Details:"
    // leaves the details pane as the plan has it.
    desk.click("#queue li:nth-child(2)").await;
    desk.until("the second request", |d| {
        Box::pin(async move { d.text("#d-tool").await == "create_backup" })
    })
    .await;
    assert_eq!(desk.text("#d-agent").await, "cursor\\u{2067}\\u{feff} 1.0");
    assert_eq!(desk.flags("#d-agent-flags .flag").await, all);
    assert_eq!(
        desk.flags("#d-server-flags .flag").await,
        ["bidi", "non_ascii"]
    );
    let details: Value = desk
        .browser()
        .execute(
            "return document.getElementById('d-details').textContent",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(details, json!("name: \"Details: \\u{200f}x\"\n"));
    assert_nothing_raw(&desk, "the second request").await;
    // Denied with a note that hides a character of its own (as pasted into the field).
    desk.set_value("#deny-note", "not \u{202e}now").await;
    desk.click("#deny").await;
    assert_eq!(refusal(&second.await.unwrap()).as_deref(), Some("denied"));

    // The first one approved (the target typed as it is, as a paste would).
    desk.until("the first request again", |d| {
        Box::pin(async move { d.text("#d-tool").await == "delete_backup" })
    })
    .await;
    desk.set_value("#typed-target", sneaky).await;
    read_then_approve(&desk).await;
    let approved = tokio::time::timeout(Duration::from_secs(30), &mut first)
        .await
        .expect("the approval reaches the agent")
        .unwrap();
    assert!(approved.structured_content.unwrap()["confirmToken"].is_string());
    desk.until("the queue to empty", |d| {
        Box::pin(async move { !d.visible_request().await })
    })
    .await;
    assert_nothing_raw(&desk, "the empty queue").await;

    // History: tool, target, server and note escaped and flagged there too.
    desk.click("#tab-history").await;
    desk.until("the issued and denied rows", |d| {
        Box::pin(async move {
            let kinds: Value = d
                .browser()
                .execute("return [...document.querySelectorAll('#history tr')].map(r => r.children[1].textContent)", vec![])
                .await
                .unwrap();
            // Newest first.
            kinds == json!(["issued", "denied"])
        })
    })
    .await;
    let cells: Value = desk
        .browser()
        .execute(
            "return [...document.querySelectorAll('#history tr')].map(r => \
               [...r.children].map(c => [c.firstChild ? c.firstChild.textContent : '', \
                 c.querySelector('.mark') ? c.querySelector('.mark').dataset.flag : '']))",
            vec![],
        )
        .await
        .unwrap();
    // Columns: when, event, code, server, tool, target, note, nonce.
    let issued = &cells[0];
    let denied = &cells[1];
    assert_eq!(
        issued[5],
        json!([
            "nightly\\u{202e}txt.exe\\u{200b}",
            "bidi invisible non_ascii"
        ])
    );
    assert_eq!(denied[5], json!(["Details: \\u{200f}x", "bidi non_ascii"]));
    assert_eq!(denied[3][1], json!("bidi non_ascii"), "{denied}");
    assert!(
        denied[3][0].as_str().unwrap().contains("re\\u{202e}ports"),
        "{denied}"
    );
    assert_eq!(denied[6], json!(["not \\u{202e}now", "bidi non_ascii"]));
    assert_nothing_raw(&desk, "the history").await;

    // History → Save: the same export as `countersign history --format jsonl`, in a new file of
    // the desk's own, which `countersign history verify` checks offline.
    desk.click("#save-jsonl").await;
    desk.until("the export to be saved", |d| {
        Box::pin(async move { d.text("#saved").await.starts_with("Saved 2 events to ") })
    })
    .await;
    let saved = desk.text("#saved").await;
    let path = saved.trim_start_matches("Saved 2 events to ").to_owned();
    let export = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        export.lines().count(),
        3,
        "two events and the signed head: {export}"
    );
    assert!(
        export.lines().last().unwrap().starts_with("{\"head\":"),
        "{export}"
    );
    let verified = std::process::Command::new(bin("countersign"))
        .args(["history", "verify", "--file", &path])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&verified.stdout);
    assert!(
        verified.status.success() && said.starts_with("history intact: events #1 to #2"),
        "{said}"
    );

    // Settings → an OpenTelemetry collector: the history so far arrives there, and the History
    // view says every event was sent.
    let collector = countersign_tests::otlp::Collector::start().await;
    desk.click("#tab-settings").await;
    desk.until("the settings to load", |d| {
        Box::pin(async move { !d.value("#s-minutes").await.is_empty() })
    })
    .await;
    desk.set_value("#s-otlp", &collector.endpoint()).await;
    desk.click("#s-save").await;
    desk.until("the settings to be saved", |d| {
        Box::pin(async move { d.text("#s-saved").await == "Saved." })
    })
    .await;
    let sent = collector.wait_for(2, Duration::from_secs(30)).await;
    assert_eq!(countersign_tests::otlp::seqs(&sent), [1, 2]);
    desk.click("#tab-history").await;
    desk.until("the collector's line", |d| {
        Box::pin(async move {
            d.text("#export-status").await.starts_with(
                "Every event was sent to the OpenTelemetry collector at http://127.0.0.1:",
            )
        })
    })
    .await;
    desk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_text_is_never_interpreted_as_html() {
    let desk = Desk::start().await;
    let agent = desk.agent("<b>bold</b>").await;
    let pending = call(
        &agent,
        "create_backup",
        json!({"name": "<img src=x onerror=\"document.title='pwned'\">"}),
    );
    desk.wait_for_request().await;
    let images: Value = desk
        .browser()
        .execute(
            "return document.querySelectorAll('#detail img, #queue img, b').length",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(images, json!(0));
    assert!(desk.text("#d-agent").await.contains("<b>bold</b>"));
    assert!(!desk.browser().title().await.unwrap().contains("pwned"));
    desk.click("#deny").await;
    let _ = pending.await;
    desk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_lists_what_happened() {
    let desk = Desk::start().await;
    let agent = desk.agent("claude-code").await;
    let backup = json!({"name": "audit"});
    let pending = call(&agent, "create_backup", backup.clone());
    desk.wait_for_request().await;
    read_then_approve(&desk).await;
    let preflight = pending.await.unwrap();
    let confirm = confirm_of(&preflight, backup);
    let done = call(&agent, "create_backup", confirm.clone())
        .await
        .unwrap();
    assert_ne!(done.is_error, Some(true), "{done:?}");
    let mut forged = confirm.clone();
    forged["confirmToken"] = json!("cs1.e30.AAAA");
    let refused = call(&agent, "create_backup", forged).await.unwrap();
    assert_eq!(refusal(&refused).as_deref(), Some("bad_token"));
    desk.click("#tab-history").await;
    desk.until("history rows", |d| {
        Box::pin(async move {
            let kinds: Value = d
                .browser()
                .execute("return [...document.querySelectorAll('#history tr')].map(r => r.children[1].textContent + ':' + r.children[2].textContent)", vec![])
                .await
                .unwrap();
            let kinds = kinds.to_string();
            kinds.contains("issued:") && kinds.contains("accepted:") && kinds.contains("executed:ok") && kinds.contains("refused:bad_token")
        })
    })
    .await;
    desk.screenshot("history.png").await;
    // Filtering by outcome narrows the list.
    desk.browser().execute("const s = document.getElementById('f-kind'); s.value = 'refused'; s.dispatchEvent(new Event('input'));", vec![]).await.unwrap();
    desk.until("only refusals", |d| {
        Box::pin(async move {
            let kinds: Value = d.browser().execute("return [...document.querySelectorAll('#history tr')].map(r => r.children[1].textContent)", vec![]).await.unwrap();
            kinds == json!(["refused"])
        })
    })
    .await;
    desk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_through_when_a_person_approves_each_request() {
    let desk = Desk::start().await;
    let demo = tokio::process::Command::new(bin("countersign"))
        .arg("demo")
        .env("COUNTERSIGN_SOCKET", desk.socket())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let output = tokio::spawn(demo.wait_with_output());
    // The person: approve each request as it arrives (three in the script), typing the target
    // where the window asks for it.
    for _ in 0..3 {
        desk.wait_for_request().await;
        let typed: Value = desk
            .browser()
            .execute("return !document.getElementById('typed').hidden", vec![])
            .await
            .unwrap();
        if typed == json!(true) {
            let target: Value = desk
                .browser()
                .execute(
                    "return document.getElementById('d-target').textContent",
                    vec![],
                )
                .await
                .unwrap();
            desk.browser()
                .find(Locator::Css("#typed-target"))
                .await
                .unwrap()
                .send_keys(target.as_str().unwrap())
                .await
                .unwrap();
        }
        let hash = desk.text("#d-hash").await;
        read_then_approve(&desk).await;
        // Gone once the window shows another request, or none.
        desk.until_page(
            "the approved request to leave the queue",
            &format!(
                "document.getElementById('detail').hidden || \
                 document.getElementById('d-hash').textContent !== {}",
                json!(hash)
            ),
        )
        .await;
    }
    let out = tokio::time::timeout(Duration::from_secs(60), output)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("already used"), "{stdout}");
    assert!(
        stdout.contains("operation changed since it was approved"),
        "{stdout}"
    );
    assert!(
        stdout.contains("\"count(*)\"") || stdout.contains("people"),
        "{stdout}"
    );
    desk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_keychain_the_desk_says_so_and_mints_nothing() {
    let desk =
        Desk::start_with(&[("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent/bus")]).await;
    desk.until("the banner", |d| {
        Box::pin(async move {
            let hidden: Value = d
                .browser()
                .execute("return document.getElementById('banner').hidden", vec![])
                .await
                .unwrap();
            hidden == json!(false)
        })
    })
    .await;
    let banner = desk.text("#banner").await;
    assert!(
        banner.contains("Nothing can be approved") && banner.contains("keychain"),
        "{banner}"
    );
    let agent = desk.agent("claude-code").await;
    let pending = call(&agent, "create_backup", json!({"name": "locked"}));
    desk.wait_for_request().await;
    read_then_approve(&desk).await;
    desk.until("the error", |d| {
        Box::pin(async move { !d.text("#error").await.is_empty() })
    })
    .await;
    let error = desk.text("#error").await;
    assert!(
        error.contains("Nothing can be approved") && error.contains("keychain"),
        "{error}"
    );
    assert!(
        desk.visible_request().await,
        "the request stays: nothing was minted"
    );
    desk.click("#deny").await;
    assert_eq!(refusal(&pending.await.unwrap()).as_deref(), Some("denied"));
    desk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_start_brings_the_first_forward_and_exits() {
    let desk = Desk::start().await;
    let agent = desk.agent("before-second-start").await;
    let waiting = call(&agent, "create_backup", json!({"name": "read-already"}));
    desk.wait_for_request().await;
    desk.until("Approve to be enabled", |d| Box::pin(d.approve_enabled()))
        .await;
    let second = tokio::process::Command::new(bin("countersign-desk"))
        .env("COUNTERSIGN_DESK_DIR", desk.dir.path())
        .env("COUNTERSIGN_SOCKET", desk.socket())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(20), second)
        .await
        .expect("the second desk exits")
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already running"),
        "{out:?}"
    );
    // Brought forward: a click aimed at whatever was on screen before lands on nothing, in the
    // window and in the engine (which holds first), until the delay has passed again.
    desk.until("Approve to be held when the window came forward", |d| {
        Box::pin(async move { !d.approve_enabled().await })
    })
    .await;
    let held = approve_by_script(&desk).await;
    assert_eq!(held["code"], "too_soon", "{held}");
    desk.click("#deny").await;
    assert_eq!(refusal(&waiting.await.unwrap()).as_deref(), Some("denied"));
    // Until the window has taken the denied request off, the next wait would see it still there.
    desk.until("the denied request to leave the window", |d| {
        Box::pin(async move { !d.visible_request().await })
    })
    .await;
    // The first one still serves: a request still reaches its window.
    let agent = desk.agent("after-second-start").await;
    let pending = call(&agent, "create_backup", json!({"name": "still-here"}));
    desk.wait_for_request().await;
    desk.click("#deny").await;
    assert_eq!(refusal(&pending.await.unwrap()).as_deref(), Some("denied"));
    desk.stop().await;
}

/// The text of a tool result's content blocks.
fn text_of(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect()
}

/// Issue 10, pinned tool definitions: an upstream (tests/peers/shifting_server.py) changes an
/// open tool's description after the desk pinned it and says so (`list_changed`). The agent lists
/// again: the tool is still listed, but its calls are refused `tool_changed` until the person
/// reads the old and new definitions side by side in the window, the changed line marked, and
/// approves; then the same call passes, without listing again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_tool_is_refused_until_the_person_accepts_the_difference_in_the_window() {
    let desk = Desk::start().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/peers/shifting_server.py");
    let stderr = std::fs::File::create(desk.dir.path().join("gateway.stderr")).unwrap();
    let agent = desk
        .agent_command(
            "claude-code",
            &["python3", script],
            &[],
            desk.dir.path(),
            stderr,
        )
        .await;
    let tools = agent.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "lookup"), "{tools:?}");
    let word = json!({"word": "nonce"});
    let first = call(&agent, "lookup", word.clone()).await.unwrap();
    assert_ne!(
        first.is_error,
        Some(true),
        "first sight pins and passes: {first:?}"
    );

    let shifted = call(&agent, "shift", json!({})).await.unwrap();
    assert_ne!(shifted.is_error, Some(true), "{shifted:?}");
    let relisted = agent.list_all_tools().await.unwrap();
    let lookup = relisted.iter().find(|t| t.name == "lookup").unwrap();
    // Still listed, but as the person accepted it: the injected text waits in the desk.
    assert_eq!(
        lookup.description.as_deref(),
        Some("Looks up a word in the glossary."),
        "the agent was shown a definition the person has not accepted: {lookup:?}"
    );
    let held = call(&agent, "lookup", word.clone()).await.unwrap();
    assert_eq!(refusal(&held).as_deref(), Some("tool_changed"), "{held:?}");
    assert!(
        text_of(&held).contains("the person reviews the change in the Countersign desk"),
        "{held:?}"
    );

    desk.wait_for_request().await;
    desk.until("the change request", |d| {
        Box::pin(async move {
            let hidden: Value = d
                .browser()
                .execute("return document.getElementById('change').hidden", vec![])
                .await
                .unwrap();
            hidden == json!(false)
        })
    })
    .await;
    assert_eq!(desk.text("#c-kind").await, "A tool's definition");
    assert!(desk.text("#c-subject").await.ends_with(":: lookup"));
    assert_eq!(desk.text("#c-origin").await, "the upstream's tool listing");
    assert!(desk.text("#c-summary").await.contains("description"));
    assert_eq!(desk.count("#c-rows tr.row-changed").await, 1);
    assert!(desk.count("#c-rows tr.row-same").await >= 3);
    let old = desk.text("#c-rows tr.row-changed td.before").await;
    let new = desk.text("#c-rows tr.row-changed td.after").await;
    assert!(old.contains("Looks up a word in the glossary."), "{old}");
    assert!(!old.contains("id_ed25519"), "{old}");
    assert!(new.contains("read ~/.ssh/id_ed25519"), "{new}");
    assert_eq!(
        desk.text("#c-rows tr.row-changed td.before-sign").await,
        "−"
    );
    assert_eq!(desk.text("#c-rows tr.row-changed td.after-sign").await, "+");
    assert!(!desk.exists("#call:not([hidden])").await, "no call fields");
    assert!(
        desk.exists("#c-analysis-row[hidden]").await,
        "nothing analysed is said of a tool's change"
    );
    desk.screenshot("change-tool.png").await;
    // Still refused while the person reads.
    let waiting = call(&agent, "lookup", word.clone()).await.unwrap();
    assert_eq!(refusal(&waiting).as_deref(), Some("tool_changed"));

    read_then_approve(&desk).await;
    desk.until("the queue to empty", |d| {
        Box::pin(async move { !d.visible_request().await })
    })
    .await;
    let passed = call(&agent, "lookup", word.clone()).await.unwrap();
    assert_ne!(passed.is_error, Some(true), "{passed:?}");
    assert_eq!(passed.structured_content, Some(word));
    // Accepted: now the agent is shown the new definition.
    let relisted = agent.list_all_tools().await.unwrap();
    let lookup = relisted.iter().find(|t| t.name == "lookup").unwrap();
    assert!(
        lookup
            .description
            .as_deref()
            .unwrap_or("")
            .contains("id_ed25519"),
        "{lookup:?}"
    );

    desk.click("#tab-history").await;
    desk.until("the change and the refusals in history", |d| {
        Box::pin(async move {
            let rows: Value = d
                .browser()
                .execute("return [...document.querySelectorAll('#history tr')].map(r => r.children[1].textContent + ':' + r.children[2].textContent + ':' + r.children[4].textContent)", vec![])
                .await
                .unwrap();
            let rows = rows.to_string();
            rows.contains("changed::change:tool") && rows.contains("refused:tool_changed:lookup")
        })
    })
    .await;
    desk.stop().await;
}

/// Issue 11, a light idle desk: closed with nothing pending, the window is released after the
/// release delay (a debug-only knob shortens it here) and the desk's WebKit web process exits;
/// the desk goes on serving, and the next preflight from a real MCP client brings the window
/// back showing the request, with Approve held for the delay in the new page and in the engine,
/// until the real click approves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_closed_window_is_released_and_the_next_request_brings_it_back() {
    let desk = Desk::start_configured(
        &[("COUNTERSIGN_DEBUG_RELEASE_AFTER_MS", "1000")],
        Some(json!({"token_minutes": 10, "approve_delay_ms": 4000})),
    )
    .await;
    let pid = desk.pid().await;
    let web = Desk::web_processes(pid);
    assert!(!web.is_empty(), "a live window has a web process");
    let old = Desk::parent_of(web[0]).unwrap();
    desk.close_window().await;
    until_released(pid).await;
    // The old window's process ends; a spare one takes its place, with no window of its own.
    let deadline = Instant::now() + Duration::from_secs(30);
    let spare = loop {
        let windows = Desk::window_processes(pid);
        if windows.len() == 1 && windows[0] != old {
            break windows[0];
        }
        assert!(
            Instant::now() < deadline,
            "no spare window process after the release: {windows:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Released, still serving: a real client's preflight reaches the queue and the window.
    let agent = desk.agent("after-release").await;
    let create = json!({"name": "after-release"});
    let pending = call(&agent, "create_backup", create.clone());
    desk.follow_window().await;
    desk.wait_for_request().await;
    assert_eq!(desk.text("#d-target").await, "after-release");
    assert_eq!(desk.pid().await, pid, "the same desk, not a new one");
    let web = Desk::web_processes(pid);
    assert!(!web.is_empty(), "the window's web process is back");
    assert_eq!(
        Desk::parent_of(web[0]),
        Some(spare),
        "the window came back in the spare"
    );
    // The new page holds Approve, and the engine refuses an approve sooner than the delay.
    let held = approve_by_script(&desk).await;
    assert_eq!(held["code"], "too_soon", "{held}");
    read_then_approve(&desk).await;
    let preflight = pending.await.unwrap();
    assert_ne!(preflight.is_error, Some(true), "{preflight:?}");
    let done = call(&agent, "create_backup", confirm_of(&preflight, create))
        .await
        .unwrap();
    assert_ne!(done.is_error, Some(true), "{done:?}");
    desk.stop().await;
}

/// Issue 11, previews: the desk reads the file through the same server-filesystem's read-only
/// `read_text_file` while the request waits, and the window shows the file as it is beside what
/// `write_file` would make of it, with why the tool is gated; nothing is written until the confirm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_file_request_shows_the_old_and_new_lines_of_the_file() {
    let desk = Desk::start().await;
    let files = desk.dir.path().join("files");
    std::fs::create_dir_all(&files).unwrap();
    let files = files.canonicalize().unwrap();
    let notes = files.join("notes.txt");
    std::fs::write(&notes, "alpha\nbeta\ngamma\n").unwrap();
    let server = peers::npm_server(peers::SERVER_FILESYSTEM, "mcp-server-filesystem");
    let server = server.to_str().unwrap();
    let stderr = std::fs::File::create(desk.dir.path().join("gateway.stderr")).unwrap();
    let agent = desk
        .agent_command(
            "claude-code",
            &[server, files.to_str().unwrap()],
            &[],
            desk.dir.path(),
            stderr,
        )
        .await;
    let write = json!({"path": notes.to_str().unwrap(), "content": "alpha\nBETA\ngamma\n"});
    let pending = call(&agent, "write_file", write.clone());
    desk.wait_for_request().await;
    desk.until("the file's preview", |d| {
        Box::pin(async move { d.exists("#d-preview table.preview-diff").await })
    })
    .await;
    assert_eq!(desk.count("#d-preview tr.row-changed").await, 1);
    assert_eq!(
        desk.text("#d-preview tr.row-changed td.before").await,
        "beta"
    );
    assert_eq!(
        desk.text("#d-preview tr.row-changed td.after").await,
        "BETA"
    );
    assert_eq!(desk.count("#d-preview tr.row-same").await, 2);
    assert!(
        desk.text("#d-why").await.contains("destructiveHint: true"),
        "{}",
        desk.text("#d-why").await
    );
    desk.screenshot("preview-write-file.png").await;
    assert_eq!(
        std::fs::read_to_string(&notes).unwrap(),
        "alpha\nbeta\ngamma\n"
    );
    let target = desk.text("#d-target").await;
    desk.set_value("#typed-target", &target).await;
    read_then_approve(&desk).await;
    let preflight = pending.await.unwrap();
    assert_ne!(preflight.is_error, Some(true), "{preflight:?}");
    assert_eq!(
        std::fs::read_to_string(&notes).unwrap(),
        "alpha\nbeta\ngamma\n",
        "nothing written before the confirm"
    );
    let done = call(&agent, "write_file", confirm_of(&preflight, write))
        .await
        .unwrap();
    assert_ne!(done.is_error, Some(true), "{done:?}");
    assert_eq!(
        std::fs::read_to_string(&notes).unwrap(),
        "alpha\nBETA\ngamma\n"
    );
    desk.stop().await;
}

fn users(db: &std::path::Path) -> i64 {
    rusqlite::Connection::open(db)
        .unwrap()
        .query_row("SELECT count(*) FROM users", [], |r| r.get(0))
        .unwrap()
}

/// Issue 11, the built-in `execute`: the person types the table the statement writes (not the
/// tool's name), and reads the rows it would remove, counted in a transaction the desk rolled
/// back; the table is unchanged through the click and changes only with the confirm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execute_request_shows_the_rows_it_would_remove_and_changes_nothing_until_the_confirm() {
    let desk = Desk::start().await;
    let db = desk.dir.path().join("app.sqlite");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(
            "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);
             INSERT INTO users (name) VALUES ('ada'), ('bob'), ('cy');",
        )
        .unwrap();
    let agent = desk.agent("claude-code").await;
    let delete = json!({"sql": "DELETE FROM users WHERE id = 2"});
    let pending = call(&agent, "execute", delete.clone());
    desk.wait_for_request().await;
    assert_eq!(desk.text("#d-target").await, "users");
    assert_eq!(desk.text("#d-summary").await, "DELETE from users");
    desk.until("the rows' preview", |d| {
        Box::pin(async move { d.exists("#d-preview table.preview-rows").await })
    })
    .await;
    let mut cells = Vec::new();
    for n in 1..=6 {
        let css = format!("#d-preview tr[data-table='users'] td:nth-child({n})");
        cells.push(desk.text(&css).await);
    }
    // users: 3 rows now, 2 after, none gained, 1 lost, none changed.
    assert_eq!(cells, ["users", "3", "2", "0", "1", "0"]);
    desk.screenshot("preview-execute.png").await;
    assert_eq!(users(&db), 3, "the preview kept nothing");
    // The tool's name is no longer what is typed.
    desk.set_value("#typed-target", "execute").await;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(
        !desk.approve_enabled().await,
        "the tool's name enabled Approve"
    );
    desk.set_value("#typed-target", "users").await;
    read_then_approve(&desk).await;
    let preflight = pending.await.unwrap();
    assert_ne!(preflight.is_error, Some(true), "{preflight:?}");
    assert_eq!(
        preflight.structured_content.as_ref().unwrap()["confirmTarget"],
        "users"
    );
    assert_eq!(users(&db), 3, "unchanged until the confirm");
    let done = call(&agent, "execute", confirm_of(&preflight, delete))
        .await
        .unwrap();
    assert_ne!(done.is_error, Some(true), "{done:?}");
    assert_eq!(users(&db), 2);
    desk.stop().await;
}

/// Issue 11: a preview the desk cannot make says so in the window, with its code; it never
/// disappears. A statement a rolled-back rehearsal cannot undo is named by what it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_that_cannot_be_made_says_so_in_the_window() {
    let desk = Desk::start().await;
    let agent = desk.agent("claude-code").await;
    let pending = call(&agent, "execute", json!({"sql": "PRAGMA user_version = 5"}));
    desk.wait_for_request().await;
    assert_eq!(desk.text("#d-target").await, "PRAGMA user_version");
    desk.until("the preview's failure", |d| {
        Box::pin(async move { d.exists("#d-preview .preview-unavailable").await })
    })
    .await;
    assert_eq!(
        desk.text("#d-preview .preview-unavailable").await,
        "Preview unavailable: not_rehearsable"
    );
    desk.click("#deny").await;
    assert_eq!(refusal(&pending.await.unwrap()).as_deref(), Some("denied"));
    desk.stop().await;
}

/// Issue 11: server-filesystem's `edit_file` is previewed by its own dry run (a call the desk
/// builds, `dryRun: true`), and `move_file` shows both paths and whether the destination exists;
/// neither changes a file before its confirm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edit_and_move_requests_show_the_dry_run_and_the_destination() {
    let desk = Desk::start().await;
    let files = desk.dir.path().join("files");
    std::fs::create_dir_all(&files).unwrap();
    let files = files.canonicalize().unwrap();
    let notes = files.join("notes.txt");
    let taken = files.join("taken.txt");
    std::fs::write(&notes, "alpha\nbeta\n").unwrap();
    std::fs::write(&taken, "keep me\n").unwrap();
    let server = peers::npm_server(peers::SERVER_FILESYSTEM, "mcp-server-filesystem");
    let server = server.to_str().unwrap();
    let stderr = std::fs::File::create(desk.dir.path().join("gateway.stderr")).unwrap();
    let agent = desk
        .agent_command(
            "claude-code",
            &[server, files.to_str().unwrap()],
            &[],
            desk.dir.path(),
            stderr,
        )
        .await;
    // The agent asks for the real edit (dryRun false): the desk's own preview call is a dry run.
    let edit = json!({"path": notes.to_str().unwrap(), "dryRun": false,
        "edits": [{"oldText": "beta", "newText": "BETA"}]});
    let pending = call(&agent, "edit_file", edit);
    desk.wait_for_request().await;
    desk.until("the dry run", |d| {
        Box::pin(async move { d.exists("#d-preview pre.preview-dry-run").await })
    })
    .await;
    let dry = desk.text("#d-preview pre.preview-dry-run").await;
    assert!(dry.contains("-beta") && dry.contains("+BETA"), "{dry}");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "alpha\nbeta\n");
    desk.click("#deny").await;
    assert_eq!(refusal(&pending.await.unwrap()).as_deref(), Some("denied"));
    desk.until("the denied request to leave", |d| {
        Box::pin(async move { !d.visible_request().await })
    })
    .await;

    let moving = json!({"source": notes.to_str().unwrap(), "destination": taken.to_str().unwrap()});
    let pending = call(&agent, "move_file", moving);
    desk.wait_for_request().await;
    desk.until("the move's preview", |d| {
        Box::pin(async move {
            d.page_text()
                .await
                .contains("Something exists at the destination now.")
        })
    })
    .await;
    desk.click("#deny").await;
    assert_eq!(refusal(&pending.await.unwrap()).as_deref(), Some("denied"));
    assert_eq!(std::fs::read_to_string(&taken).unwrap(), "keep me\n");
    desk.stop().await;
}

/// Waits (up to 30 s) until the desk `pid` has no web process: its window was released. Each
/// web process's exit is waited for on the kernel's word ([`group::exited`]), not polled.
pub(crate) async fn until_released(pid: u32) {
    let web = Desk::web_processes(pid);
    let all_exited = async {
        for &process in &web {
            group::exited(process).await;
        }
    };
    assert!(
        tokio::time::timeout(Duration::from_secs(30), all_exited)
            .await
            .is_ok(),
        "the window was not released: {web:?} still run"
    );
    // Released: no web process is left (none was started meanwhile).
    assert!(
        Desk::web_processes(pid).is_empty(),
        "the window was not released"
    );
}

/// Denies the request shown through the page's IPC (Deny has no delay, and a hidden window's
/// button cannot be clicked). The answer is not waited for: with nothing pending any more, a
/// closed window may be released before it comes back; the agent's refusal says what happened.
async fn deny_by_script(desk: &Desk) {
    let pending = desk.invoke("pending", json!({})).await.unwrap();
    let id = pending[0]["id"].clone();
    let _ = desk
        .browser()
        .execute(
            "window.__TAURI__.core.invoke('deny', { id: arguments[0], note: null })",
            vec![id],
        )
        .await;
}

/// Waits (up to 30 s) until a window of the desk's shows request `name`, following the window
/// as the desk releases and creates it again.
async fn until_shown(desk: &Desk, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        desk.follow_window().await;
        let shown = desk
            .browser()
            .execute(
                "const d = document.getElementById('detail'); \
                 return !d.hidden && document.getElementById('d-target').textContent",
                vec![],
            )
            .await;
        if shown.is_ok_and(|v| v == json!(name)) {
            return;
        }
        assert!(Instant::now() < deadline, "request {name} was never shown");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Issue 11: a second start of the desk (`countersign desk`) brings a released window back, shown,
/// and the desk that answers is still the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_start_brings_a_released_window_back() {
    let desk = Desk::start_with(&[("COUNTERSIGN_DEBUG_RELEASE_AFTER_MS", "1000")]).await;
    let pid = desk.pid().await;
    desk.close_window().await;
    until_released(pid).await;
    let second = tokio::process::Command::new(bin("countersign-desk"))
        .env("COUNTERSIGN_DESK_DIR", desk.dir.path())
        .env("COUNTERSIGN_SOCKET", desk.socket())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(20), second)
        .await
        .expect("the second desk exits")
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    desk.follow_window().await;
    desk.until("the window to be on screen", |d| {
        Box::pin(async move {
            d.browser()
                .execute("return document.visibilityState", vec![])
                .await
                .is_ok_and(|v| v == json!("visible"))
        })
    })
    .await;
    assert_eq!(desk.pid().await, pid);
    let agent = desk.agent("after-second-start").await;
    let pending = call(&agent, "create_backup", json!({"name": "back-again"}));
    desk.wait_for_request().await;
    desk.click("#deny").await;
    assert_eq!(refusal(&pending.await.unwrap()).as_deref(), Some("denied"));
    desk.stop().await;
}

/// Issue 11: a closed window with a request waiting is never released; and requests sent around
/// the moment of release (before it, while the window is destroyed, after it) each find a window
/// showing them, with never more than one web process and the same desk throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_around_the_release_always_find_a_window_and_a_waiting_one_keeps_it() {
    let desk = Desk::start_with(&[("COUNTERSIGN_DEBUG_RELEASE_AFTER_MS", "1000")]).await;
    let pid = desk.pid().await;
    let agent = desk.agent("around-the-release").await;
    // Waiting: closed for three release delays, the window and its web process stay.
    let waiting = call(&agent, "create_backup", json!({"name": "waiting"}));
    desk.wait_for_request().await;
    let before = Desk::web_processes(pid);
    desk.close_window().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        Desk::web_processes(pid),
        before,
        "released with a request waiting"
    );
    assert!(desk.visible_request().await);
    deny_by_script(&desk).await;
    assert_eq!(refusal(&waiting.await.unwrap()).as_deref(), Some("denied"));
    // Around the release: the window hidden (or released) for 0.6 s to 1.5 s, then a request.
    for k in 0..10u64 {
        countersign_tests::xwindow::close_by_title(&desk.display_name(), "Countersign");
        tokio::time::sleep(Duration::from_millis(600 + 100 * k)).await;
        let name = format!("around-{k}");
        let pending = call(&agent, "create_backup", json!({ "name": name }));
        until_shown(&desk, &name).await;
        assert!(
            Desk::web_processes(pid).len() <= 1,
            "one web process at most"
        );
        deny_by_script(&desk).await;
        assert_eq!(refusal(&pending.await.unwrap()).as_deref(), Some("denied"));
    }
    assert_eq!(desk.pid().await, pid, "the same desk throughout");
    desk.stop().await;
}

/// A desk started in the tray (`--tray`, as a gateway starts it) on `display`, its files in a
/// new directory; waits until it says it is ready in the tray.
struct InTray {
    started: tokio::process::Child,
    pid: u32,
    dir: tempfile::TempDir,
    socket: std::path::PathBuf,
}

impl InTray {
    async fn start(display: &str) -> InTray {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["data", "config"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        let socket = dir.path().join("desk.sock");
        let started = tokio::process::Command::new(bin("countersign-desk"))
            .arg(countersign_wire::DESK_IN_TRAY)
            .env("COUNTERSIGN_DESK_DIR", dir.path())
            .env("COUNTERSIGN_SOCKET", &socket)
            .env("DISPLAY", display)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = started.id().unwrap();
        let desk = InTray {
            started,
            pid,
            dir,
            socket,
        };
        desk.until_logged("ready in_tray=true").await;
        desk
    }

    /// Waits (up to 30 s) until the desk's log file has `line`.
    async fn until_logged(&self, line: &str) {
        let log = self.dir.path().join("state/desk.log");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !std::fs::read_to_string(&log).is_ok_and(|l| l.contains(line)) {
            assert!(Instant::now() < deadline, "the desk never logged {line:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A real MCP client through a gateway, on the built-in tools.
    async fn agent(&self) -> RunningService<RoleClient, ClientConfig> {
        use rmcp::ServiceExt;
        let mut cmd = tokio::process::Command::new(bin("countersign"));
        cmd.args(["mcp", "--no-launch", "--wait", "40", "--socket"])
            .arg(&self.socket)
            .arg("--db")
            .arg(self.dir.path().join("app.sqlite"))
            .env("RUST_LOG", "warn");
        let info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("tray-agent", "1.0"),
        );
        info.serve(rmcp::transport::TokioChildProcess::new(cmd).unwrap())
            .await
            .unwrap()
    }
}

/// Waits (up to 30 s) until `display` shows a window titled `title`.
async fn until_titled(display: &str, title: &str) {
    use countersign_tests::xwindow::titles;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let shown = titles(display);
        if shown.iter().any(|t| t == title) {
            return;
        }
        assert!(Instant::now() < deadline, "no window {title:?}: {shown:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Issue 18, item 3: a desk started in the tray (as a gateway starts it, for an agent, with
/// nothing to decide) makes no window and runs no WebKit while agents connect, list and use open
/// tools; the first request brings the window, showing it, with one web process. The window opens
/// in the spare window's process the desk started ahead of need (item 2: a request from the light
/// state does not wait for a process and GTK to start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_desk_started_in_the_tray_makes_no_window_until_the_first_request_brings_it() {
    use countersign_tests::window::OwnDisplay;
    use countersign_tests::xwindow::titles;
    let display = OwnDisplay::start();
    let mut desk = InTray::start(&display.name).await;
    let pid = desk.pid;
    let agent = desk.agent().await;
    agent.list_all_tools().await.unwrap();
    let read = call(&agent, "list_tables", json!({})).await.unwrap();
    assert_ne!(read.is_error, Some(true), "{read:?}");
    // Past its start, and a moment more: still no window, no WebKit; one spare window process.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        Desk::web_processes(pid).is_empty(),
        "WebKit runs with nothing to decide"
    );
    assert!(
        !titles(&display.name)
            .iter()
            .any(|t| t.starts_with("Countersign")),
        "a window with nothing to decide: {:?}",
        titles(&display.name)
    );
    let spare = Desk::window_processes(pid);
    assert_eq!(spare.len(), 1, "one spare window process: {spare:?}");
    // The first request: the window comes, on screen, saying so, in the spare.
    let pending = call(&agent, "create_backup", json!({"name": "first"}));
    until_titled(&display.name, "Countersign (1 pending)").await;
    let web = Desk::web_processes(pid);
    assert_eq!(web.len(), 1, "one web process");
    assert_eq!(
        Desk::parent_of(web[0]),
        Some(spare[0]),
        "the window opened in the spare"
    );
    assert_eq!(
        Desk::window_processes(pid),
        spare,
        "no other window process"
    );
    assert!(!pending.is_finished(), "it waits for a person");
    drop(agent);
    desk.started.kill().await.unwrap();
}

/// A spare window process that ends by itself (killed here; a display gone, in life) is not
/// started again, so a desk whose spare cannot live does not start one in a loop; the next
/// request still brings a window, in a process started for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spare_window_process_that_dies_is_not_restarted_and_the_next_request_still_gets_a_window()
 {
    use countersign_tests::window::OwnDisplay;
    let display = OwnDisplay::start();
    let mut desk = InTray::start(&display.name).await;
    let pid = desk.pid;
    let spare = Desk::window_processes(pid);
    assert_eq!(spare.len(), 1, "one spare window process: {spare:?}");
    // SAFETY: kill has no memory preconditions; the pid is the desk's child, not yet reaped.
    unsafe { libc::kill(spare[0] as i32, libc::SIGKILL) };
    desk.until_logged("the spare window process ended").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        Desk::window_processes(pid).is_empty(),
        "the spare was started again: {:?}",
        Desk::window_processes(pid)
    );
    let agent = desk.agent().await;
    let pending = call(&agent, "create_backup", json!({"name": "after-spare"}));
    until_titled(&display.name, "Countersign (1 pending)").await;
    let windows = Desk::window_processes(pid);
    assert_eq!(windows.len(), 1, "{windows:?}");
    assert_ne!(windows[0], spare[0]);
    assert_eq!(Desk::web_processes(pid).len(), 1, "one web process");
    assert!(!pending.is_finished(), "it waits for a person");
    drop(agent);
    desk.started.kill().await.unwrap();
}

/// Issue 19, item 4: a confirm whose server died before answering tells the agent it may have
/// run, is on record as `outcome_unknown`, and when the same call asks again the window says,
/// above everything else, that the last identical call's outcome is unknown, and when.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_server_died_unanswered_is_shown_as_unknown_when_it_asks_again() {
    let desk = Desk::start().await;
    let work = tempfile::tempdir().unwrap();
    let server = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/dying_server.py");
    let stderr = std::fs::File::create(work.path().join("gateway.log")).unwrap();
    let agent = desk
        .agent_command(
            "dying-agent",
            &["python3", server.to_str().unwrap()],
            &[],
            work.path(),
            stderr,
        )
        .await;
    let args = json!({"path": "/srv/report.txt", "text": "hello"});
    let pending = call(&agent, "write", args.clone());
    desk.wait_for_request().await;
    assert!(
        desk.text("#d-unknown").await.is_empty(),
        "nothing to say yet"
    );
    read_then_approve(&desk).await;
    let preflight = pending.await.unwrap();
    let done = call(&agent, "write", confirm_of(&preflight, args.clone()))
        .await
        .unwrap();
    assert!(
        format!("{done:?}").contains("not known"),
        "the agent is told it may have run: {done:?}"
    );
    // The same call again: the person sees that the last one's outcome is unknown.
    let again = call(&agent, "write", args.clone());
    desk.wait_for_request().await;
    desk.until("the unknown outcome to be shown", |d| {
        Box::pin(async move {
            d.text("#d-unknown")
                .await
                .contains("whether it ran is not known")
        })
    })
    .await;
    deny_by_script(&desk).await;
    assert_eq!(refusal(&again.await.unwrap()).as_deref(), Some("denied"));
    let history = desk.invoke("history", json!({"query": {}})).await.unwrap();
    assert!(history.to_string().contains("outcome_unknown"), "{history}");
    desk.stop().await;
}

/// The window's channel is a socket pair the desk hands to the process it starts: nothing else
/// reaches it. What the window would send, sent by another process of the same account on the
/// desk's own socket (an approve, after the delay, for a request that waits), is not a hello: the
/// connection is closed and nothing is approved. The page's own approve, which crosses the
/// channel, still works afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_window_sends_approves_nothing_from_anywhere_but_its_channel() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let desk = Desk::start().await;
    let agent = desk.agent("channel-prober").await;
    let waiting = call(&agent, "create_backup", json!({"name": "probed"}));
    desk.wait_for_request().await;
    desk.until("Approve to be enabled", |d| Box::pin(d.approve_enabled()))
        .await;
    let pending = desk.invoke("pending", json!({})).await.unwrap();
    let id = pending[0]["id"].clone();
    let invoke = json!({"type": "invoke", "id": 1, "command": "approve",
                        "args": {"id": id, "typedTarget": null}});
    let mut stream = tokio::net::UnixStream::connect(desk.socket())
        .await
        .unwrap();
    stream
        .write_all(format!("{invoke}\n").as_bytes())
        .await
        .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
        .await
        .expect("the desk closes a connection that sends no hello");
    assert!(read.is_ok() || answer.is_empty());
    assert!(
        !String::from_utf8_lossy(&answer).contains("\"ok\""),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert!(!waiting.is_finished(), "the request was decided");
    let still = desk.invoke("pending", json!({})).await.unwrap();
    assert_eq!(still[0]["id"], id, "{still}");
    desk.click("#approve").await;
    let approved = waiting.await.unwrap();
    assert_ne!(approved.is_error, Some(true), "{approved:?}");
    desk.stop().await;
}

/// Issue 32 in the window: `policy.cedar` edited behind the desk's back waits for the person, and
/// the window says beside the diff what the edit widens, as cvc5 found it (a call of `execute`
/// that would now run without a click). Approved, the rules are in force: the INSERT they open
/// runs at once, with nobody asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rules_edit_waits_and_the_window_says_what_it_widens_then_the_rules_open_what_they_say() {
    let solver = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/peers/bin/cvc5");
    let solver = std::env::var("CVC5").unwrap_or_else(|_| solver.to_string_lossy().into_owned());
    let desk = Desk::start_with(&[("CVC5", solver.as_str())]).await;
    let db = desk.dir.path().join("rules.sqlite");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch("CREATE TABLE notes (body TEXT)")
        .unwrap();
    let agent = desk.agent_on("rules-agent", &db).await;
    agent.list_all_tools().await.unwrap();
    std::fs::write(
        desk.dir.path().join("config/policy.cedar"),
        "@class(\"open\")\n\
         permit (principal, action == Countersign::Action::\"execute\", resource)\n\
         when { context.arguments.sql like \"INSERT INTO notes *\" && !(context.arguments.sql like \"*;*\") };\n",
    )
    .unwrap();
    desk.wait_for_request().await;
    desk.until("the change request", |d| {
        Box::pin(async move { d.exists("#change:not([hidden])").await })
    })
    .await;
    assert_eq!(desk.text("#c-kind").await, "The policy");
    assert_eq!(desk.text("#c-subject").await, "policy.cedar");
    assert!(desk.exists("#c-analysis-row:not([hidden])").await);
    let analysis = desk.text("#c-analysis").await;
    assert!(analysis.starts_with("It widens"), "{analysis}");
    assert!(analysis.contains("execute with"), "{analysis}");
    assert!(analysis.contains("INSERT INTO notes"), "{analysis}");
    assert!(analysis.contains("would run without a click"), "{analysis}");
    desk.screenshot("change-rules.png").await;
    read_then_approve(&desk).await;
    desk.until("the queue to empty", |d| {
        Box::pin(async move { !d.visible_request().await })
    })
    .await;
    // In force: the INSERT runs at once, nobody asked; anything else still waits.
    let insert = json!({"sql": "INSERT INTO notes VALUES ('opened by a rule')"});
    let ran = tokio::time::timeout(Duration::from_secs(20), call(&agent, "execute", insert))
        .await
        .expect("an opened call is answered at once")
        .unwrap();
    assert_ne!(ran.is_error, Some(true), "{ran:?}");
    assert!(!desk.visible_request().await, "nobody was asked");
    let rows: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("SELECT count(*) FROM notes", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 1);
    desk.stop().await;
}
