//! Previews on waiting requests and the built-in `execute` named by the tables it writes, driven
//! as a session and the window would drive the engine.

use countersign_core::ServerId;
use countersign_core::Tenant;
use std::time::Duration;

use countersign_core::preview::{self, Preview, Unavailable};
use countersign_engine::{
    Accepted, ApproveError, Approved, Engine, ManualClock, QueueChange, Queued, Stopped,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(5);

fn engine(dir: &tempfile::TempDir, delay_ms: u64) -> Engine {
    engine_at(dir, delay_ms, ManualClock::starting_now())
}

/// An engine whose time is `clock`'s: the test moves it instead of sleeping.
fn engine_at(dir: &tempfile::TempDir, delay_ms: u64, clock: ManualClock) -> Engine {
    let mut config = countersign_tests::engine::config();
    config.approve_delay_ms = delay_ms;
    config.clock = std::sync::Arc::new(clock);
    config.describer = Some(std::sync::Arc::new(
        countersign_builtin::SqlDescriber::default(),
    ));
    countersign_tests::engine::engine(dir.path(), config)
}

async fn files(engine: &Engine, server: &str) -> Tenant {
    let tenant = engine.connect(ServerId::Command(server.into()));
    engine.register_tools(
        &tenant,
        vec![json!({"name": "write_file", "annotations": {"destructiveHint": true},
            "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}})],
    ).await.unwrap();
    tenant
}

/// A preflight left waiting in the background, and the request it queued.
async fn queued(
    engine: &Engine,
    tenant: &Tenant,
    tool: &str,
    args: Value,
) -> (
    tokio::task::JoinHandle<Result<Approved, Stopped>>,
    countersign_engine::PendingRequest,
) {
    let mut changes = engine.subscribe();
    let (e, t, tool, a) = (engine.clone(), tenant.to_owned(), tool.to_owned(), args);
    let waiting = tokio::spawn(async move { e.preflight(&t, &tool, &a, WAIT).await });
    loop {
        if let Ok(QueueChange::Added { request }) = changes.recv().await {
            return (waiting, *request);
        }
    }
}

#[tokio::test]
async fn a_preview_is_shown_with_its_request_and_never_changes_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(&dir, 0);
    let tenant = files(&engine, "fs").await;
    let args = json!({"path": "/a.txt", "content": "new\n"});
    let (waiting, request) = queued(&engine, &tenant, "write_file", args.clone()).await;
    assert_eq!(request.preview, None);
    assert_eq!(
        request.call().unwrap().why,
        "annotations destructiveHint: true"
    );
    let mut changes = engine.subscribe();
    let shown = preview::file("/a.txt", Some("old\n"), None, "new\n");
    assert_eq!(
        engine.call_hash(&tenant, "write_file", &args),
        Some(request.call().unwrap().plan_hash)
    );
    assert!(engine.awaits_preview(&tenant, "write_file", request.call().unwrap().plan_hash));
    assert!(engine.attach_preview(
        &tenant,
        "write_file",
        request.call().unwrap().plan_hash,
        shown.clone()
    ));
    let Ok(QueueChange::Updated { request: updated }) = changes.recv().await else {
        panic!("the window is told")
    };
    assert_eq!(updated.preview.as_ref(), Some(&shown));
    assert_eq!(
        updated.call().unwrap().plan_hash,
        request.call().unwrap().plan_hash,
        "the plan is untouched"
    );
    assert_eq!(updated.text, request.text);
    assert!(!engine.awaits_preview(&tenant, "write_file", request.call().unwrap().plan_hash));
    // The same preview again changes nothing and tells nobody.
    assert!(engine.attach_preview(
        &tenant,
        "write_file",
        request.call().unwrap().plan_hash,
        shown
    ));
    assert!(changes.try_recv().is_err());
    engine.approve(request.id, Some("/a.txt")).await.unwrap();
    assert!(matches!(waiting.await.unwrap(), Ok(Approved { .. })));
}

#[tokio::test]
async fn the_preflight_that_queues_a_request_holds_its_ticket_and_one_that_re_attaches_does_not_ask_for_a_preview()
 {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(&dir, 0);
    let tenant = files(&engine, "fs").await;
    let args = json!({"path": "/a.txt", "content": "x"});
    let Ok(Queued::Waiting(first)) = engine.queue_preflight(&tenant, "write_file", &args).await
    else {
        panic!("queued")
    };
    let Ok(Queued::Waiting(again)) = engine.queue_preflight(&tenant, "write_file", &args).await
    else {
        panic!("re-attached")
    };
    assert!(first.is_new() && !again.is_new());
    assert_eq!(
        (again.id(), again.plan_hash()),
        (first.id(), first.plan_hash())
    );
    assert_eq!(engine.pending().len(), 1, "one request, not two");
    assert_eq!(
        engine.pending()[0].call().unwrap().plan_hash,
        first.plan_hash()
    );
    // The ticket names the request a preview lands on, with no second planning of the call.
    let shown = preview::file("/a.txt", None, None, "x");
    assert!(engine.attach_preview(&tenant, "write_file", first.plan_hash(), shown.clone()));
    assert_eq!(engine.pending()[0].preview, Some(shown));
    engine.approve(first.id(), Some("/a.txt")).await.unwrap();
    // Both preflights waiting on it get the one decision: the same token.
    let (Ok(Approved { token: a, .. }), Ok(Approved { token: b, .. })) = (
        engine.decision(again, WAIT).await,
        engine.decision(first, WAIT).await,
    ) else {
        panic!("both approved")
    };
    assert_eq!(a, b);
    assert!(engine.pending().is_empty());
}

#[tokio::test]
async fn a_preview_lands_only_on_the_request_of_its_own_call() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(&dir, 0);
    let mine = files(&engine, "fs").await;
    let other = files(&engine, "fs").await;
    let args = json!({"path": "/a.txt", "content": "x"});
    let (_waiting, request) = queued(&engine, &mine, "write_file", args.clone()).await;
    let p = Preview::unavailable(Unavailable::ReadFailed, "x");
    assert!(!engine.attach_preview(
        &other,
        "write_file",
        request.call().unwrap().plan_hash,
        p.clone()
    ));
    let elsewhere = engine
        .call_hash(
            &mine,
            "write_file",
            &json!({"path": "/b.txt", "content": "x"}),
        )
        .unwrap();
    assert!(!engine.attach_preview(&mine, "write_file", elsewhere, p));
    assert_eq!(engine.pending()[0].preview, None);
}

#[tokio::test]
async fn a_preview_that_changes_what_is_shown_re_arms_the_approve_delay() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::starting_now();
    let engine = engine_at(&dir, 600, clock.clone());
    let tenant = files(&engine, "fs").await;
    let args = json!({"path": "/a.txt", "content": "x"});
    let (waiting, request) = queued(&engine, &tenant, "write_file", args).await;
    clock.advance(700);
    let p = Preview::unavailable(Unavailable::TimeLimit, "slow");
    assert!(engine.attach_preview(&tenant, "write_file", request.call().unwrap().plan_hash, p));
    assert!(matches!(
        engine.approve(request.id, Some("/a.txt")).await,
        Err(ApproveError::TooSoon { .. })
    ));
    clock.advance(599);
    assert!(matches!(
        engine.approve(request.id, Some("/a.txt")).await,
        Err(ApproveError::TooSoon { wait_ms: 1 })
    ));
    clock.advance(1);
    engine.approve(request.id, Some("/a.txt")).await.unwrap();
    assert!(matches!(waiting.await.unwrap(), Ok(Approved { .. })));
}

async fn builtin(engine: &Engine, db: &std::path::Path) -> Tenant {
    let tenant = engine.connect(ServerId::Builtin(db.to_owned()));
    engine
        .register_tools(&tenant, countersign_builtin::definitions())
        .await
        .unwrap();
    tenant
}

#[tokio::test]
async fn execute_is_typed_by_the_tables_it_writes_and_its_summary_names_them() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.sqlite");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT); INSERT INTO users (name) VALUES ('a'), ('b');")
        .unwrap();
    let engine = engine(&dir, 0);
    let tenant = builtin(&engine, &db).await;
    let args = json!({"sql": "DELETE FROM users WHERE id = 2"});
    let (waiting, request) = queued(&engine, &tenant, "execute", args.clone()).await;
    assert_eq!(request.plan.target, "users");
    assert_eq!(request.plan.summary, "DELETE from users");
    assert!(request.type_target());
    assert_eq!(
        engine.approve(request.id, Some("execute")).await,
        Err(ApproveError::TargetNotTyped),
        "the tool's name is no longer the target"
    );
    engine.approve(request.id, Some("users")).await.unwrap();
    let Ok(Approved { token, target, .. }) = waiting.await.unwrap() else {
        panic!()
    };
    assert_eq!(target, "users");
    let mut confirm = args.clone();
    confirm["confirm"] = json!(true);
    confirm["confirmTarget"] = json!("users");
    confirm["confirmToken"] = json!(token);
    assert!(matches!(
        engine.confirm(&tenant, "execute", &confirm).await,
        Ok(Accepted { .. })
    ));
}

#[tokio::test]
async fn a_trigger_added_after_the_click_changes_the_plan_and_the_confirm_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.sqlite");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch("CREATE TABLE users (id INTEGER PRIMARY KEY); CREATE TABLE audit (x);")
        .unwrap();
    let engine = engine(&dir, 0);
    let tenant = builtin(&engine, &db).await;
    let args = json!({"sql": "DELETE FROM users"});
    let (waiting, request) = queued(&engine, &tenant, "execute", args.clone()).await;
    engine.approve(request.id, Some("users")).await.unwrap();
    let Ok(Approved { token, .. }) = waiting.await.unwrap() else {
        panic!()
    };
    conn.execute_batch(
        "CREATE TRIGGER t AFTER DELETE ON users BEGIN INSERT INTO audit VALUES (1); END;",
    )
    .unwrap();
    let mut confirm = args;
    confirm["confirm"] = json!(true);
    confirm["confirmTarget"] = json!("users");
    confirm["confirmToken"] = json!(token);
    let answer = engine.confirm(&tenant, "execute", &confirm).await;
    assert!(
        matches!(answer, Err(Stopped::Refused { .. })),
        "what it writes changed since the click: {answer:?}"
    );
}
