//! Grants through the real window: a real MCP client starts the real `countersign mcp` against
//! the built-in tools, the desk runs under Xvfb with the real keychain, and the test clicks
//! "Approve and grant", the Grants view's Revoke and Approve through WebDriver.

use std::time::Duration;

use countersign_tests::calls::{Call, call, confirm_of};
use countersign_tests::peers;
use countersign_tests::window::Desk;
use rmcp::RoleClient;
use rmcp::model::*;
use rmcp::service::RunningService;
use serde_json::{Value, json};

fn approved(r: &CallToolResult) -> bool {
    r.structured_content
        .as_ref()
        .is_some_and(|s| s["confirmToken"].is_string())
}

async fn hidden(desk: &Desk, id: &str) -> bool {
    let hidden: Value = desk
        .browser()
        .execute(
            "const el = document.getElementById(arguments[0]); return !el || el.hidden",
            vec![json!(id)],
        )
        .await
        .unwrap();
    hidden == json!(true)
}

/// Whether `call` is still waiting after `ms`.
async fn still_waiting(call: &mut Call, ms: u64) -> bool {
    tokio::time::timeout(Duration::from_millis(ms), call)
        .await
        .is_err()
}

/// The person picks "this same call" beside Approve, waits out the delay and clicks "Approve
/// and grant".
async fn approve_and_grant_this_call(desk: &Desk) {
    desk.until("grants to be offered", |d| {
        Box::pin(async move { !hidden(d, "widen").await })
    })
    .await;
    desk.until("the call grant to be offered", |d| {
        Box::pin(d.enabled("#widen-kind option[value=call]"))
    })
    .await;
    desk.click("#widen-kind option[value=call]").await;
    desk.until("Approve and grant to be enabled", |d| {
        Box::pin(d.enabled("#approve-widen"))
    })
    .await;
    desk.screenshot("approval-grant.png").await;
    desk.click("#approve-widen").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_approves_the_second_identical_call_without_a_click() {
    let desk = Desk::start().await;
    let agent = desk.agent("claude-code").await;
    let backup = json!({"name": "nightly"});
    let first = call(&agent, "create_backup", backup.clone());
    desk.wait_for_request().await;
    approve_and_grant_this_call(&desk).await;
    let first = first.await.unwrap();
    assert!(approved(&first), "{first:?}");
    desk.until("the queue to empty", |d| {
        Box::pin(async move { !d.visible_request().await })
    })
    .await;
    // The same call again: approved without anything shown or clicked.
    let second = tokio::time::timeout(
        Duration::from_secs(10),
        call(&agent, "create_backup", backup.clone()),
    )
    .await
    .expect("the granted call was approved at once")
    .unwrap();
    assert!(approved(&second), "{second:?}");
    assert!(!desk.visible_request().await, "no request was shown");
    let tokens =
        [&first, &second].map(|r| r.structured_content.as_ref().unwrap()["confirmToken"].clone());
    assert_ne!(tokens[0], tokens[1], "each call has a token of its own");
    let done = call(&agent, "create_backup", confirm_of(&second, backup))
        .await
        .unwrap();
    assert_ne!(done.is_error, Some(true), "{done:?}");
    // The Grants view lists it, with one use; history names the grant.
    desk.click("#tab-grants").await;
    desk.until("the grant listed", |d| {
        Box::pin(async move { d.count("#grants tr[data-grant]").await == 1 })
    })
    .await;
    let row = desk.text("#grants tr[data-grant]").await;
    assert!(
        row.contains("create_backup") && row.contains("nightly"),
        "{row}"
    );
    desk.screenshot("grants.png").await;
    desk.click("#tab-history").await;
    desk.until("history naming the grant", |d| {
        Box::pin(async move {
            d.text("#history")
                .await
                .contains("by grant #1, granted at ")
        })
    })
    .await;
    desk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_grant_makes_the_next_call_wait_for_a_click() {
    let desk = Desk::start().await;
    let agent = desk.agent("cursor").await;
    let backup = json!({"name": "hourly"});
    let first = call(&agent, "create_backup", backup.clone());
    desk.wait_for_request().await;
    approve_and_grant_this_call(&desk).await;
    assert!(approved(&first.await.unwrap()));
    desk.click("#tab-grants").await;
    desk.until("the grant listed", |d| {
        Box::pin(async move { d.count("#grants tr[data-grant]").await == 1 })
    })
    .await;
    desk.click("#grants tr[data-grant] button.revoke").await;
    desk.until("the grant gone from the list", |d| {
        Box::pin(async move { d.count("#grants tr[data-grant]").await == 0 })
    })
    .await;
    desk.click("#tab-queue").await;
    let mut next = call(&agent, "create_backup", backup);
    desk.wait_for_request().await;
    assert!(
        still_waiting(&mut next, 1500).await,
        "a revoked grant approved a call"
    );
    desk.until("Approve to be enabled", |d| Box::pin(d.approve_enabled()))
        .await;
    desk.click("#approve").await;
    assert!(approved(&next.await.unwrap()));
    desk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_on_a_destructive_tool_is_refused() {
    let desk = Desk::start().await;
    let agent = desk.agent("vscode").await;
    let mut pending = call(&agent, "delete_backup", json!({"name": "nightly"}));
    desk.wait_for_request().await;
    desk.until("the reason no grant is offered", |d| {
        Box::pin(async move { d.text("#widen-why").await.contains("destructive") })
    })
    .await;
    let offered: Value = desk
        .browser()
        .execute(
            "return [...document.querySelectorAll('#widen-kind option')].filter(o => o.value && !o.disabled).length",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(offered, json!(0), "no kind of grant is offered");
    assert!(!desk.enabled("#approve-widen").await);
    // A script in the page asking anyway, after the delay and with the target typed: the engine
    // refuses, and approves nothing.
    desk.until("Approve's delay to pass", |d| {
        Box::pin(async move {
            d.set_value("#typed-target", "nightly").await;
            d.approve_enabled().await
        })
    })
    .await;
    let id = desk.invoke("pending", json!({})).await.unwrap()[0]["id"].clone();
    let refused = desk
        .invoke(
            "approve_widening",
            json!({"id": id, "typedTarget": "nightly", "widening": {"kind": "call", "minutes": 5}}),
        )
        .await
        .expect_err("a grant on a destructive tool");
    assert_eq!(refused["code"], "destructive", "{refused}");
    assert!(
        still_waiting(&mut pending, 1000).await,
        "nothing was approved"
    );
    let grants = desk.invoke("grants", json!({})).await.unwrap();
    assert_eq!(grants, json!([]));
    desk.click("#deny").await;
    let denied = pending.await.unwrap();
    assert!(!approved(&denied));
    desk.stop().await;
}

/// A real MCP client reaching the real server-filesystem serving `root`, through the desk.
async fn filesystem_agent(
    desk: &Desk,
    name: &str,
    root: &str,
) -> RunningService<RoleClient, ClientConfig> {
    let server = peers::npm_server(peers::SERVER_FILESYSTEM, "mcp-server-filesystem");
    let server = server.to_str().unwrap();
    let stderr = std::fs::File::create(desk.dir.path().join(format!("{name}.stderr"))).unwrap();
    desk.agent_command(name, &[server, root], &[], desk.dir.path(), stderr)
        .await
}

/// A prefix grant on the real server-filesystem's `create_directory` (not destructive, so a
/// grant may be offered): the prefix proposed is the target's parent directory; a directory under
/// it on the same connection is approved without a click, while a sibling sharing the prefix's
/// text, a `..` path, and the same call from another agent's connection each wait for one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_grant_covers_this_sessions_targets_under_it_and_nothing_beside_it() {
    let desk = Desk::start().await;
    let files = desk.dir.path().join("files");
    std::fs::create_dir_all(&files).unwrap();
    let files = files.canonicalize().unwrap();
    let root = files.to_str().unwrap().to_owned();
    let agent = filesystem_agent(&desk, "claude-code", &root).await;
    let mkdir = |path: String| json!({"path": path});
    let first = call(&agent, "create_directory", mkdir(format!("{root}/a")));
    desk.wait_for_request().await;
    desk.until("the prefix grant to be offered", |d| {
        Box::pin(d.enabled("#widen-kind option[value=prefix]"))
    })
    .await;
    desk.click("#widen-kind option[value=prefix]").await;
    // The parent directory is proposed (the request may be updated meanwhile, by its preview:
    // the choice stays).
    desk.until("the parent directory proposed", |d| {
        let root = root.clone();
        Box::pin(async move {
            let proposed: Value = d
                .browser()
                .execute(
                    "return [document.getElementById('widen-kind').value, \
                     document.getElementById('widen-prefix').value]",
                    vec![],
                )
                .await
                .unwrap();
            proposed == json!(["prefix", root])
        })
    })
    .await;
    desk.until("Approve and grant to be enabled", |d| {
        Box::pin(d.enabled("#approve-widen"))
    })
    .await;
    desk.click("#approve-widen").await;
    let first = first.await.unwrap();
    assert!(approved(&first), "{first:?}");
    let made = call(
        &agent,
        "create_directory",
        confirm_of(&first, mkdir(format!("{root}/a"))),
    )
    .await
    .unwrap();
    assert_ne!(made.is_error, Some(true), "{made:?}");
    desk.until("the queue to empty", |d| {
        Box::pin(async move { !d.visible_request().await })
    })
    .await;

    // Under the prefix, on this connection: approved at once, and it runs.
    let deeper = mkdir(format!("{root}/b/c"));
    let second = tokio::time::timeout(
        Duration::from_secs(10),
        call(&agent, "create_directory", deeper.clone()),
    )
    .await
    .expect("a target under the prefix was approved at once")
    .unwrap();
    assert!(approved(&second), "{second:?}");
    let made = call(&agent, "create_directory", confirm_of(&second, deeper))
        .await
        .unwrap();
    assert_ne!(made.is_error, Some(true), "{made:?}");
    assert!(files.join("b/c").is_dir());

    // Beside it, through it, and from another connection: each waits for a click.
    let other = filesystem_agent(&desk, "cursor", &root).await;
    for (who, path) in [
        (&agent, format!("{root}-other")),
        (&agent, format!("{root}/../escape")),
        (&other, format!("{root}/d")),
    ] {
        let mut waiting = call(who, "create_directory", mkdir(path.clone()));
        desk.wait_for_request().await;
        assert!(
            still_waiting(&mut waiting, 1000).await,
            "{path} rode on the grant"
        );
        desk.click("#deny").await;
        let denied = waiting.await.unwrap();
        assert!(!approved(&denied), "{path}: {denied:?}");
        desk.until("the queue to empty", |d| {
            Box::pin(async move { !d.visible_request().await })
        })
        .await;
    }
    assert!(!files.join("d").exists());
    // The Grants view says whose session the grant lives with, and its prefix.
    desk.click("#tab-grants").await;
    desk.until("the session grant listed", |d| {
        Box::pin(async move { d.count("#grants tr[data-grant]").await == 1 })
    })
    .await;
    let row = desk.text("#grants tr[data-grant]").await;
    assert!(
        row.contains("for the session of claude-code 1.0") && row.contains(&root),
        "{row}"
    );
    desk.stop().await;
}
