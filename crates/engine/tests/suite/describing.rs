//! The built-in `execute` planned by describing its SQL: a description that stops for a reason of
//! the moment (a lock another connection holds, the time limit) is an error answer of the call,
//! the same for a preflight, a confirm and a withdraw, and never a plan naming `unknown`.

use countersign_core::ServerId;
use countersign_core::Tenant;
use std::time::Duration;

use countersign_core::Refusal;
use countersign_engine::{Accepted, Approved, Engine, ErrorCode, QueueChange, Stopped};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(5);

/// A batch whose first statement must take the write lock, so another writer's lock stops it.
const BATCH: &str = "DELETE FROM users WHERE id = 1; DELETE FROM audit";

struct Setup {
    engine: Engine,
    tenant: Tenant,
    db: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.sqlite");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(
            "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);
             INSERT INTO users (name) VALUES ('a'), ('b');
             CREATE TABLE audit (what TEXT);",
        )
        .unwrap();
    let mut config = countersign_tests::engine::config();
    config.describer = Some(std::sync::Arc::new(
        countersign_builtin::SqlDescriber::default(),
    ));
    let engine = countersign_tests::engine::engine(dir.path(), config);
    let tenant = engine.connect(ServerId::Builtin(db.clone()));
    engine
        .register_tools(&tenant, countersign_builtin::definitions())
        .await
        .unwrap();
    Setup {
        engine,
        tenant,
        db,
        _dir: dir,
    }
}

/// Another connection holding the database's write lock until it is dropped.
fn writer_lock(db: &std::path::Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE; INSERT INTO audit VALUES ('held')")
        .unwrap();
    conn
}

fn is_busy<T>(answer: &Result<T, Stopped>, why: &str) -> bool {
    matches!(answer, Err(Stopped::Failed { code: ErrorCode::Busy, message })
        if message.starts_with("Nothing was executed.") && message.contains(why)
            && message.contains("call again"))
}

/// A preflight of `args` approved with `target` typed, and the confirm's arguments.
async fn approved(s: &Setup, args: &Value, target: &str) -> Value {
    let mut changes = s.engine.subscribe();
    let (e, t, a) = (s.engine.clone(), s.tenant.clone(), args.clone());
    let waiting = tokio::spawn(async move { e.preflight(&t, "execute", &a, WAIT).await });
    let request = loop {
        if let Ok(QueueChange::Added { request }) = changes.recv().await {
            break request;
        }
    };
    assert_eq!(request.plan.target, target);
    s.engine.approve(request.id, Some(target)).await.unwrap();
    let Ok(Approved { token, .. }) = waiting.await.unwrap() else {
        panic!("not approved")
    };
    let mut confirm = args.clone();
    confirm["confirm"] = json!(true);
    confirm["confirmTarget"] = json!(target);
    confirm["confirmToken"] = json!(token);
    confirm
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preflight_during_a_lock_is_busy_and_queues_nothing_and_after_it_plans_the_facts() {
    let s = setup().await;
    let args = json!({ "sql": BATCH });
    let lock = writer_lock(&s.db);
    let answer = s
        .engine
        .preflight(&s.tenant, "execute", &args, Duration::ZERO)
        .await;
    assert!(is_busy(&answer, "database was busy"), "{answer:?}");
    assert!(
        s.engine.pending().is_empty(),
        "no plan naming unknown waits"
    );
    assert_eq!(s.engine.call_hash(&s.tenant, "execute", &args), None);
    drop(lock);
    let answer = s
        .engine
        .preflight(&s.tenant, "execute", &args, Duration::ZERO)
        .await;
    assert!(matches!(
        answer,
        Err(Stopped::Refused {
            refusal: Refusal::Pending,
            ..
        })
    ));
    let pending = s.engine.pending();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].plan.target, "audit, users");
    assert_eq!(
        s.engine.call_hash(&s.tenant, "execute", &args),
        Some(pending[0].call().unwrap().plan_hash)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_that_cannot_be_described_now_is_refused_spends_nothing_and_works_after() {
    let s = setup().await;
    let args = json!({ "sql": BATCH });
    let confirm = approved(&s, &args, "audit, users").await;
    let lock = writer_lock(&s.db);
    // Refused before verification: the once tool's nonce is not spent, from sync or async code.
    let answer = s.engine.confirm(&s.tenant, "execute", &confirm).await;
    assert!(is_busy(&answer, "database was busy"), "{answer:?}");
    let answer = s.engine.confirm_aside(&s.tenant, "execute", &confirm).await;
    assert!(is_busy(&answer, "database was busy"), "{answer:?}");
    drop(lock);
    let answer = s.engine.confirm_aside(&s.tenant, "execute", &confirm).await;
    assert!(matches!(answer, Ok(Accepted { .. })), "{answer:?}");
    // Spent once, by the confirm that was accepted: a replay is refused as usual.
    let again = s.engine.confirm(&s.tenant, "execute", &confirm).await;
    assert!(
        matches!(
            again,
            Err(Stopped::Refused {
                refusal: Refusal::AlreadyUsed,
                ..
            })
        ),
        "{again:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdraw_that_cannot_be_described_now_says_so_and_the_request_keeps_waiting() {
    let s = setup().await;
    let args = json!({ "sql": BATCH });
    let _ = s
        .engine
        .preflight(&s.tenant, "execute", &args, Duration::ZERO)
        .await;
    assert_eq!(s.engine.pending().len(), 1);
    let lock = writer_lock(&s.db);
    let answer = s.engine.withdraw(&s.tenant, "execute", &args);
    assert!(is_busy(&answer, "database was busy"), "{answer:?}");
    let answer = s.engine.withdraw_aside(&s.tenant, "execute", &args).await;
    assert!(is_busy(&answer, "database was busy"), "{answer:?}");
    assert_eq!(s.engine.pending().len(), 1, "nothing was withdrawn");
    assert_eq!(
        s.engine
            .queued_aside(&s.tenant, "execute", &args)
            .await
            .map(|(_, id)| id.is_some()),
        None,
        "not planned while it cannot be described"
    );
    drop(lock);
    let answer = s.engine.withdraw_aside(&s.tenant, "execute", &args).await;
    assert_eq!(answer, Ok(()));
    assert!(s.engine.pending().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_past_the_time_limit_is_busy_every_time_never_a_plan() {
    let s = setup().await;
    let args = json!({ "sql": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) \
                               SELECT count(*) FROM n; DELETE FROM users" });
    let answer = s
        .engine
        .preflight(&s.tenant, "execute", &args, Duration::ZERO)
        .await;
    assert!(is_busy(&answer, "ran past 2 s"), "{answer:?}");
    assert!(s.engine.pending().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_sqlite_refuses_is_still_a_plan_the_same_each_time() {
    let s = setup().await;
    for (sql, target) in [
        ("DELETE FROM missing; DELETE FROM users", "nothing"),
        ("COMMIT; DELETE FROM users", "transaction control, unknown"),
    ] {
        let args = json!({ "sql": sql });
        let first = s.engine.call_hash(&s.tenant, "execute", &args);
        assert!(first.is_some(), "{sql}");
        assert_eq!(s.engine.call_hash(&s.tenant, "execute", &args), first);
        let _ = s
            .engine
            .preflight(&s.tenant, "execute", &args, Duration::ZERO)
            .await;
        let pending = s.engine.pending();
        let request = pending
            .iter()
            .find(|r| Some(r.call().unwrap().plan_hash) == first)
            .unwrap();
        assert_eq!(request.plan.target, target, "{sql}");
    }
}

/// Whether some connection reads `db` right now (a description holds its shared lock).
fn being_read(db: &std::path::Path) -> bool {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.busy_timeout(Duration::ZERO).unwrap();
    match conn.execute_batch("BEGIN EXCLUSIVE") {
        Ok(()) => {
            conn.execute_batch("ROLLBACK").unwrap();
            false
        }
        Err(_) => true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_turn_to_describe_taken_a_sync_call_is_busy_and_an_async_one_waits_its_turn() {
    let endless = json!({ "sql": "WITH RECURSIVE n(i) AS (SELECT count(*) FROM audit UNION ALL \
                                  SELECT i + 1 FROM n) SELECT count(*) FROM n; DELETE FROM users" });
    // Two databases on one engine, each described by a call that never ends on its own.
    let (s, b) = (setup().await, setup().await);
    let other_db = b.db.clone();
    let other_tenant = s.engine.connect(ServerId::Builtin(other_db.clone()));
    s.engine
        .register_tools(&other_tenant, countersign_builtin::definitions())
        .await
        .unwrap();
    let mut slow = Vec::new();
    for (t, db) in [
        (s.tenant.clone(), s.db.clone()),
        (other_tenant.clone(), other_db),
    ] {
        let (e, args) = (s.engine.clone(), endless.clone());
        slow.push(tokio::spawn(async move {
            e.preflight(&t, "execute", &args, Duration::ZERO).await
        }));
        let mut tries = 0;
        while !being_read(&db) {
            tries += 1;
            assert!(tries < 2_000, "never described");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    // Both turns are taken: a sync call describes nothing and says so; nothing is planned.
    let args = json!({ "sql": BATCH });
    let answer = s.engine.withdraw(&s.tenant, "execute", &args);
    assert!(is_busy(&answer, "describing other SQL"), "{answer:?}");
    assert_eq!(s.engine.call_hash(&s.tenant, "execute", &args), None);
    // An async one waits for a turn, and is described once one is free.
    let answer = s
        .engine
        .preflight(&s.tenant, "execute", &args, Duration::ZERO)
        .await;
    assert!(
        matches!(
            answer,
            Err(Stopped::Refused {
                refusal: Refusal::Pending,
                ..
            })
        ),
        "{answer:?}"
    );
    for slow in slow {
        let answer = slow.await.unwrap();
        assert!(is_busy(&answer, "ran past 2 s"), "{answer:?}");
    }
    assert_eq!(s.engine.pending().len(), 1);
    assert_eq!(s.engine.pending()[0].plan.target, "audit, users");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_sending_endless_batches_holds_one_turn_so_another_is_described_at_once() {
    // A batch that never ends on its own: describing it runs into the time limit.
    let endless = json!({ "sql": "WITH RECURSIVE n(i) AS (SELECT count(*) FROM audit UNION ALL \
                                  SELECT i + 1 FROM n) SELECT count(*) FROM n; DELETE FROM users" });
    // Connection A on one database, connection B on another, one engine.
    let (a, b) = (setup().await, setup().await);
    let b_tenant = a.engine.connect(ServerId::Builtin(b.db.clone()));
    a.engine
        .register_tools(&b_tenant, countersign_builtin::definitions())
        .await
        .unwrap();
    let (answers, mut answered) = tokio::sync::mpsc::unbounded_channel();
    // A sends more endless batches at once than the desk describes at once (within the time a
    // call waits for its turn, so each of them is described in the end).
    for _ in 0..3 {
        let (e, t, args, answers) = (
            a.engine.clone(),
            a.tenant.clone(),
            endless.clone(),
            answers.clone(),
        );
        tokio::spawn(async move {
            let answer = e.preflight(&t, "execute", &args, Duration::ZERO).await;
            answers.send(("A", answer)).unwrap();
        });
    }
    let mut tries = 0;
    while !being_read(&a.db) {
        tries += 1;
        assert!(tries < 2_000, "never described");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A's own sync call finds A's turn taken, and describes nothing.
    let batch = json!({ "sql": BATCH });
    let answer = a.engine.withdraw(&a.tenant, "execute", &batch);
    assert!(is_busy(&answer, "describing other SQL"), "{answer:?}");
    // B's batch (two statements: it is described, so it needs a turn) is planned and queued
    // while A's are still being described: B's answer comes first, and is not busy.
    let (e, t, answers_b) = (a.engine.clone(), b_tenant.clone(), answers.clone());
    tokio::spawn(async move {
        let answer = e.preflight(&t, "execute", &batch, Duration::ZERO).await;
        answers_b.send(("B", answer)).unwrap();
    });
    drop(answers);
    let (first, answer) = answered.recv().await.unwrap();
    assert_eq!(first, "B", "{answer:?}");
    assert!(
        matches!(
            answer,
            Err(Stopped::Refused {
                refusal: Refusal::Pending,
                ..
            })
        ),
        "{answer:?}"
    );
    let pending = a.engine.pending();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].call().unwrap().tenant, b_tenant);
    assert_eq!(pending[0].plan.target, "audit, users");
    // A's batches are each answered busy in the end, none of them a plan.
    let mut from_a = 0;
    while let Some((who, answer)) = answered.recv().await {
        assert_eq!(who, "A");
        assert!(is_busy(&answer, "ran past 2 s"), "{answer:?}");
        from_a += 1;
    }
    assert_eq!(from_a, 3);
    assert_eq!(a.engine.pending().len(), 1);
}
