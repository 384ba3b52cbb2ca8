//! `countersign mcp` end to end below the window: a real rmcp client spawns the real gateway
//! binary over stdio, the gateway serves the built-in tools on a real SQLite file, and the desk's
//! engine runs in this test process behind a real Unix socket. Approval happens the only way the
//! product allows: `Engine::approve` (which the window calls on a click), called here.

mod common;

use std::time::Duration;

use common::*;
use countersign_engine::QueueChange;
use serde_json::json;

async fn setup_table(desk: &Desk, agent: &Agent) {
    let confirm = approved(
        desk,
        agent,
        "execute",
        json!({"sql": "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"}),
    )
    .await;
    let r = call(agent, "execute", confirm).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
}

async fn count_rows(agent: &Agent) -> i64 {
    let r = call(
        agent,
        "query",
        json!({"sql": "SELECT count(*) AS n FROM t"}),
    )
    .await;
    r.structured_content.unwrap()["rows"][0]["n"]
        .as_i64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_are_listed_with_gated_ones_augmented_and_every_other_field_kept() {
    let desk = desk().await;
    let agent = agent(&desk).await;
    let tools = agent.peer().list_all_tools().await.unwrap();
    let by_name: std::collections::HashMap<_, _> =
        tools.iter().map(|t| (t.name.to_string(), t)).collect();
    assert_eq!(by_name.len(), 7);
    let query = by_name["query"];
    assert!(
        !query
            .input_schema
            .get("properties")
            .unwrap()
            .as_object()
            .unwrap()
            .contains_key("confirmToken")
    );
    let execute = by_name["execute"];
    let props = execute
        .input_schema
        .get("properties")
        .unwrap()
        .as_object()
        .unwrap();
    for name in ["sql", "confirm", "confirmTarget", "confirmToken"] {
        assert!(props.contains_key(name), "{name} missing");
    }
    assert!(
        execute
            .description
            .as_deref()
            .unwrap()
            .contains("Countersign")
    );
    assert_eq!(execute.title.as_deref(), Some("Execute SQL"));
    assert_eq!(
        execute.annotations.as_ref().unwrap().destructive_hint,
        Some(true)
    );
    let info = agent.peer().peer_info().unwrap();
    assert_eq!(
        info.server_info.as_ref().unwrap().name,
        "countersign-builtin"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_query_passes_through_without_the_desk_being_asked() {
    let desk = desk().await;
    let agent = agent(&desk).await;
    let r = call(&agent, "query", json!({"sql": "SELECT 1 AS one"})).await;
    assert_eq!(r.structured_content.unwrap()["rows"], json!([{"one": 1}]));
    assert!(desk.engine.pending().is_empty());
    let r = call(&agent, "query", json!({"sql": "SELEC nonsense"})).await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("syntax error"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_once_call_runs_once_and_its_replay_is_refused() {
    let desk = desk().await;
    let agent = agent(&desk).await;
    setup_table(&desk, &agent).await;
    let confirm = approved(
        &desk,
        &agent,
        "execute",
        json!({"sql": "INSERT INTO t (v) VALUES ('x')"}),
    )
    .await;
    let r = call(&agent, "execute", confirm.clone()).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(count_rows(&agent).await, 1);
    let again = call(&agent, "execute", confirm).await;
    assert_eq!(refusal(&again).as_deref(), Some("already_used"));
    assert!(text(&again).contains("may already be done"));
    assert_eq!(
        count_rows(&agent).await,
        1,
        "the upstream saw the insert once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflight_text_ends_with_how_to_confirm_and_the_token() {
    let desk = desk().await;
    let agent = agent(&desk).await;
    let click = click_approve(&desk.engine);
    let r = call(&agent, "create_backup", json!({"name": "nightly"})).await;
    click.await.unwrap();
    let body = text(&r);
    let token = r.structured_content.as_ref().unwrap()["confirmToken"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        body.contains("confirmTarget: \"nightly\", and confirmToken from this response."),
        "{body}"
    );
    assert!(
        body.ends_with(&format!(
            "confirmToken: {token} (expires in 10 minutes, works until it expires)"
        )),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_class_token_is_reused_within_its_life() {
    let desk = desk().await;
    let agent = agent(&desk).await;
    setup_table(&desk, &agent).await;
    let confirm = approved(&desk, &agent, "create_backup", json!({"name": "nightly"})).await;
    for _ in 0..3 {
        let r = call(&agent, "create_backup", confirm.clone()).await;
        assert_ne!(r.is_error, Some(true), "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_with_a_note_reaches_the_agent() {
    let desk = desk().await;
    let agent = agent(&desk).await;
    let engine = desk.engine.clone();
    let mut changes = engine.subscribe();
    let deny = tokio::spawn(async move {
        while let Ok(change) = changes.recv().await {
            if let QueueChange::Added { request } = change {
                engine
                    .deny(request.id, Some("use the staging database"))
                    .unwrap();
                return;
            }
        }
    });
    let r = call(&agent, "execute", json!({"sql": "DROP TABLE t"})).await;
    deny.await.unwrap();
    assert_eq!(refusal(&r).as_deref(), Some("denied"));
    assert!(text(&r).contains("use the staging database"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecided_preflight_is_pending_and_calling_again_reattaches() {
    let desk = desk().await;
    let agent = agent_on(
        &desk.socket,
        &desk.dir.path().join("app.sqlite"),
        &["--wait", "1"],
    )
    .await;
    let args = json!({"sql": "CREATE TABLE p (x)"});
    let r = call(&agent, "execute", args.clone()).await;
    assert_eq!(refusal(&r).as_deref(), Some("pending"));
    let r = call(&agent, "execute", args.clone()).await;
    assert_eq!(refusal(&r).as_deref(), Some("pending"));
    let pending = desk.engine.pending();
    assert_eq!(pending.len(), 1, "one request, not two");
    let target = pending[0].plan.target.clone();
    desk.engine.approve(pending[0].id, Some(&target)).unwrap();
    let r = call(&agent, "execute", args).await;
    assert!(r.structured_content.unwrap()["confirmToken"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_arguments_are_refused_and_the_upstream_sees_nothing() {
    let desk = desk().await;
    let agent = agent(&desk).await;
    setup_table(&desk, &agent).await;
    let mut confirm = approved(
        &desk,
        &agent,
        "execute",
        json!({"sql": "INSERT INTO t (v) VALUES ('a')"}),
    )
    .await;
    confirm["sql"] = json!("INSERT INTO t (v) VALUES ('a'), ('b'), ('c')");
    let r = call(&agent, "execute", confirm).await;
    assert_eq!(refusal(&r).as_deref(), Some("plan_changed"));
    assert!(text(&r).contains("Do not retry"));
    assert_eq!(count_rows(&agent).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_from_another_gateway_connection_is_wrong_tenant() {
    let desk = desk().await;
    let first = agent(&desk).await;
    let second = agent(&desk).await;
    let confirm = approved(
        &desk,
        &first,
        "execute",
        json!({"sql": "CREATE TABLE w (x)"}),
    )
    .await;
    second.peer().list_all_tools().await.unwrap();
    let r = call(&second, "execute", confirm).await;
    assert_eq!(refusal(&r).as_deref(), Some("wrong_tenant"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_verification_refusal_reaches_the_agent() {
    let desk = desk().await;
    let agent = agent(&desk).await;
    // no_token
    let r = call(
        &agent,
        "execute",
        json!({"sql": "SELECT 1", "confirm": true, "confirmTarget": "execute"}),
    )
    .await;
    assert_eq!(refusal(&r).as_deref(), Some("no_token"));
    // bad_token
    let r = call(&agent, "execute", json!({"sql": "SELECT 1", "confirm": true, "confirmTarget": "execute", "confirmToken": "cs1.e30.AAAA"})).await;
    assert_eq!(refusal(&r).as_deref(), Some("bad_token"));
    // wrong_tool: a token for delete_backup presented to restore_backup, same arguments.
    let confirm = approved(&desk, &agent, "delete_backup", json!({"name": "old"})).await;
    let r = call(&agent, "restore_backup", confirm.clone()).await;
    assert_eq!(refusal(&r).as_deref(), Some("wrong_tool"));
    // wrong_target: confirmTarget naming something else.
    let mut other = confirm.clone();
    other["confirmTarget"] = json!("new");
    let r = call(&agent, "delete_backup", other).await;
    assert_eq!(refusal(&r).as_deref(), Some("wrong_target"));
    // wrong_target: the arguments name another target.
    let mut other = confirm.clone();
    other["name"] = json!("new");
    let r = call(&agent, "delete_backup", other).await;
    assert_eq!(refusal(&r).as_deref(), Some("wrong_target"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_token_is_refused() {
    let desk = desk_with(|c| c.token_ttl_ms = 1500).await;
    let agent = agent(&desk).await;
    let confirm = approved(
        &desk,
        &agent,
        "execute",
        json!({"sql": "CREATE TABLE e (x)"}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let r = call(&agent, "execute", confirm).await;
    assert_eq!(refusal(&r).as_deref(), Some("expired"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_held_by_another_writer_is_ledger_unreachable_and_nothing_runs() {
    let desk = desk_with(|c| {
        c.store_options = countersign_store::StoreOptions::default()
            .with_busy_timeout(Duration::from_millis(200));
    })
    .await;
    let agent = agent(&desk).await;
    setup_table(&desk, &agent).await;
    let confirm = approved(
        &desk,
        &agent,
        "execute",
        json!({"sql": "INSERT INTO t (v) VALUES ('z')"}),
    )
    .await;
    // Another process-like writer holds the ledger's write lock past the busy timeout.
    let holder = rusqlite::Connection::open(desk.dir.path().join("desk.sqlite")).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let r = call(&agent, "execute", confirm.clone()).await;
    assert_eq!(refusal(&r).as_deref(), Some("ledger_unreachable"));
    assert!(text(&r).contains("Nothing was executed"));
    holder.execute_batch("ROLLBACK").unwrap();
    assert_eq!(count_rows(&agent).await, 0);
    // Failing closed spent nothing: the same token works once the ledger is back.
    let r = call(&agent, "execute", confirm).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(count_rows(&agent).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_desk_gated_calls_are_desk_unavailable_and_open_tools_still_work() {
    let dir = tempfile::tempdir().unwrap();
    let agent = agent_on(
        &dir.path().join("nobody.sock"),
        &dir.path().join("app.sqlite"),
        &[],
    )
    .await;
    let tools = agent.peer().list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 7);
    let r = call(&agent, "execute", json!({"sql": "CREATE TABLE t (x)"})).await;
    assert_eq!(refusal(&r).as_deref(), Some("desk_unavailable"));
    assert!(text(&r).contains("countersign desk"));
    let r = call(&agent, "list_tables", json!({})).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_disconnect_withdraws_its_pending_requests() {
    let desk = desk().await;
    let agent = agent_on(
        &desk.socket,
        &desk.dir.path().join("app.sqlite"),
        &["--wait", "1"],
    )
    .await;
    let r = call(&agent, "execute", json!({"sql": "CREATE TABLE gone (x)"})).await;
    assert_eq!(refusal(&r).as_deref(), Some("pending"));
    assert_eq!(desk.engine.pending().len(), 1);
    let mut changes = desk.engine.subscribe();
    agent.cancel().await.unwrap();
    let removed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(QueueChange::Removed { reason, .. }) = changes.recv().await {
                return reason;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(removed, countersign_engine::Removal::Disconnected);
    assert!(desk.engine.pending().is_empty());
}
