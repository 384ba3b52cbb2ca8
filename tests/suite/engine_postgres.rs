//! One engine, two homes: the same authority with its records on PostgreSQL. A gated call is
//! queued, approved by the engine's approve (the click, below the window), confirmed and executed
//! exactly once; a replay, a changed plan and another connection are refused; history is read
//! back from the database; and with the server cut mid-spend the confirm is refused
//! `ledger_unreachable` and can then only be refused `already_used`. Needs `.ci/with-postgres`.

use countersign_core::ServerId;
use countersign_core::Tenant;
use std::sync::Arc;
use std::time::Duration;

use countersign_core::telemetry::EventKind;
use countersign_core::token::SigningKey;
use countersign_core::{Refusal, SpendError};
use countersign_engine::{Accepted, Approved, Engine, EngineConfig, QueueChange, Stopped};
use countersign_store::{HistoryFilter, Postgres, PostgresOptions, Records};
use countersign_tests::calls::confirm_args;
use countersign_tests::postgres::{FaultProxy, shared_database};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(10);

fn engine_on(records: Postgres) -> Engine {
    let mut config = EngineConfig::new();
    // Approvals below the window, right after the preflight: no person's delay to wait out.
    config.approve_delay_ms = 0;
    Engine::new(
        config,
        Arc::new(records),
        Ok(SigningKey::new(&[7; 32]).unwrap()),
    )
}

async fn connect(engine: &Engine) -> Tenant {
    let tenant = engine.connect(ServerId::Command("test-server".into()));
    engine
        .register_tools(&tenant, vec![json!({"name": "execute"})])
        .await
        .unwrap();
    tenant
}

/// A preflight of `execute(args)`, approved as a click would: the token and its target.
async fn approved(engine: &Engine, tenant: &Tenant, args: &Value) -> (String, String) {
    let clicker = engine.clone();
    let mut changes = engine.subscribe();
    let click = tokio::spawn(async move {
        loop {
            if let Ok(QueueChange::Added { request }) = changes.recv().await {
                clicker.approve(request.id, None).await.unwrap();
                return;
            }
        }
    });
    let answer = engine.preflight(tenant, "execute", args, WAIT).await;
    click.await.unwrap();
    match answer {
        Ok(Approved { token, target, .. }) => (token, target),
        other => panic!("not approved: {other:?}"),
    }
}

fn refusal<T>(answer: &Result<T, Stopped>) -> Option<Refusal> {
    answer.as_ref().err().and_then(Stopped::refusal)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn the_engine_on_postgres_executes_an_approved_once_call_exactly_once() {
    let dsn = shared_database().await;
    let records = Postgres::connect(&dsn, PostgresOptions::default())
        .await
        .unwrap();
    let engine = engine_on(records);
    let tenant = connect(&engine).await;
    let args = json!({"sql": "DELETE FROM t WHERE id = 7"});
    let (token, target) = approved(&engine, &tenant, &args).await;
    let confirm = confirm_args(&args, &target, &token);
    let first = engine.confirm(&tenant, "execute", &confirm).await;
    let Ok(Accepted { arguments, nonce }) = first else {
        panic!("not accepted: {first:?}");
    };
    assert_eq!(arguments, args, "what runs is what was approved");
    engine.outcome(&tenant, &nonce, true, None).await.unwrap();
    assert_eq!(
        refusal(&engine.confirm(&tenant, "execute", &confirm).await),
        Some(Refusal::AlreadyUsed)
    );
    let changed = confirm_args(&json!({"sql": "DELETE FROM t"}), &target, &token);
    assert_eq!(
        refusal(&engine.confirm(&tenant, "execute", &changed).await),
        Some(Refusal::PlanChanged)
    );
    let other = connect(&engine).await;
    assert_eq!(
        refusal(&engine.confirm(&other, "execute", &confirm).await),
        Some(Refusal::WrongTenant)
    );
    // The history is the database's: a second engine on the same database reads it.
    let reader = engine_on(
        Postgres::connect(&dsn, PostgresOptions::default())
            .await
            .unwrap(),
    );
    let kinds: Vec<EventKind> = reader
        .history(&HistoryFilter::all())
        .await
        .unwrap()
        .into_iter()
        .rev()
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        vec![
            EventKind::Issued,
            EventKind::Accepted,
            EventKind::Executed { ok: true },
            EventKind::Replay,
            EventKind::Refused {
                refusal: Refusal::PlanChanged
            },
            EventKind::Refused {
                refusal: Refusal::WrongTenant
            },
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn a_confirm_whose_spend_was_cut_is_refused_unreachable_then_only_ever_already_used() {
    let dsn = shared_database().await;
    let port: u16 = dsn
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("port="))
        .and_then(|p| p.parse().ok())
        .expect("the DSN names the server's port");
    let proxy = FaultProxy::start(port, b"spent_nonce").await;
    let through_proxy = dsn.replace(&format!("port={port}"), &format!("port={}", proxy.port()));
    let records = Postgres::connect(
        &through_proxy,
        PostgresOptions::default().with_statement_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let engine = engine_on(records);
    let tenant = connect(&engine).await;
    let args = json!({"sql": "DROP TABLE t"});
    let (token, target) = approved(&engine, &tenant, &args).await;
    let confirm = confirm_args(&args, &target, &token);
    let issued = engine
        .history(&HistoryFilter::all())
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.kind == EventKind::Issued)
        .and_then(|e| e.nonce)
        .expect("the approval is on the record with its nonce");
    // The spend goes with the acceptance's history row, which names the nonce in hex: cut once
    // that row (after the spend, in the same transaction) has gone to the server.
    proxy.arm_on(issued.to_hex().as_bytes());
    assert_eq!(
        refusal(&engine.confirm(&tenant, "execute", &confirm).await),
        Some(Refusal::LedgerUnreachable),
        "a spend whose answer never came runs nothing"
    );
    proxy.disarm();
    assert_eq!(
        refusal(&engine.confirm(&tenant, "execute", &confirm).await),
        Some(Refusal::AlreadyUsed),
        "after the cut, the same approval can only be refused as used"
    );
    // Any other replica sees the nonce spent too: the database holds it.
    let replica = Postgres::connect(&dsn, PostgresOptions::default())
        .await
        .unwrap();
    assert_eq!(
        replica.spend(&issued, u64::MAX / 2).await,
        Err(SpendError::AlreadySpent)
    );
    // Oldest first. The acceptance is written with the spend: when the cut came after the
    // COMMIT had gone too, the database holds both, and the refusal that follows says the
    // replica never heard so. Either way nothing ran, and no outcome is on the record.
    let mut recorded = engine.history(&HistoryFilter::all()).await.unwrap();
    recorded.reverse();
    let kinds: Vec<EventKind> = recorded
        .iter()
        .filter(|e| e.nonce == Some(issued) && e.kind != EventKind::Issued)
        .map(|e| e.kind)
        .collect();
    let (unreachable, used) = (
        EventKind::for_refusal(Refusal::LedgerUnreachable),
        EventKind::for_refusal(Refusal::AlreadyUsed),
    );
    let unreachable_then_used = [unreachable, used];
    let committed_then_unheard = [EventKind::Accepted, unreachable, used];
    assert!(
        kinds == unreachable_then_used || kinds == committed_then_unheard,
        "{kinds:?}"
    );
}
