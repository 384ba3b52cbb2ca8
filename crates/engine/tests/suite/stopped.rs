//! An agent that stops waiting for a preflight (it cancels, or its client's own tool timeout gives
//! up on the call) does not make the call impossible to approve: the request stays in the queue,
//! marked, for the grace; the same call asked again re-attaches to it and collects an approval
//! given meanwhile, with the approve delay running on from the request's arrival; after the grace
//! it leaves. Time is the engine's manual clock, moved by the tests, never slept on.

use countersign_core::Tenant;
use countersign_tests::engine as support;

use std::time::Duration;

use countersign_core::{Refusal, ServerId};
use countersign_engine::{
    ApproveError, Clock, Engine, QueueChange, Queued, Removal, STOPPED_WAITING_GRACE_MS, Stopped,
    Ticket,
};
use serde_json::{Value, json};

use support::Desk;

fn desk_with_delay(approve_delay_ms: u64) -> Desk {
    Desk::new(|config| config.approve_delay_ms = approve_delay_ms)
}

fn desk() -> Desk {
    desk_with_delay(0)
}

async fn connect(engine: &Engine, agent: &str) -> Tenant {
    let tenant = engine.connect(ServerId::Command("test-server".into()));
    engine.set_client_info(&tenant, json!({"name": agent, "version": "1"}));
    engine
        .register_tools(&tenant, vec![json!({"name": "execute"})])
        .await
        .unwrap();
    tenant
}

async fn ticket(engine: &Engine, tenant: &Tenant, args: &Value) -> Ticket {
    match engine.queue_preflight(tenant, "execute", args).await {
        Ok(Queued::Waiting(ticket)) => ticket,
        other => panic!("not queued: {other:?}"),
    }
}

/// What the session does when the agent's call is cancelled while it waits: the engine is told
/// (while the waiting preflight still holds its ticket), then the preflight is dropped.
async fn cancelled(engine: &Engine, tenant: &Tenant, args: &Value) -> u64 {
    let ticket = ticket(engine, tenant, args).await;
    let id = ticket.id();
    engine.stop_waiting(tenant, "execute", args).unwrap();
    drop(ticket);
    id
}

fn marked(engine: &Engine, id: u64) -> Option<u64> {
    engine
        .pending()
        .into_iter()
        .find(|r| r.id == id)
        .and_then(|r| r.call().unwrap().stopped_waiting_at_ms)
}

fn refusal(answer: &Result<countersign_engine::Approved, Stopped>) -> Option<Refusal> {
    answer.as_ref().err().and_then(Stopped::refusal)
}

#[tokio::test]
async fn a_cancelled_preflight_stays_marked_and_the_retry_collects_the_approval_given_meanwhile() {
    let d = desk();
    let tenant = connect(&d.engine, "agent").await;
    let args = json!({"sql": "DELETE FROM t"});
    let mut changes = d.engine.subscribe();
    let id = cancelled(&d.engine, &tenant, &args).await;
    // Still in the queue, marked with when the agent stopped waiting; the window was told.
    assert_eq!(marked(&d.engine, id), Some(d.clock.now_ms()));
    let told = std::iter::from_fn(|| changes.try_recv().ok()).any(|c| {
        matches!(c, QueueChange::Updated { request }
            if request.id == id && request.call().unwrap().stopped_waiting_at_ms.is_some())
    });
    assert!(told, "the window was not told the agent stopped waiting");
    assert!(
        !std::iter::from_fn(|| changes.try_recv().ok())
            .any(|c| matches!(c, QueueChange::Removed { .. })),
        "a cancel took the request off the queue"
    );
    // The person approves while nobody waits; the same call asked again collects it at once.
    d.clock.advance(30_000);
    d.engine.approve(id, None).await.unwrap();
    let again = d
        .engine
        .preflight(&tenant, "execute", &args, Duration::from_millis(1))
        .await
        .expect("the retry collects the approval");
    assert!(!again.token.is_empty());
    // Collected: nothing is left of it, and a third ask is a new request.
    assert!(d.engine.pending().is_empty());
    let third = ticket(&d.engine, &tenant, &args).await;
    assert_ne!(third.id(), id);
}

#[tokio::test]
async fn a_request_the_agent_stopped_waiting_for_leaves_when_its_grace_ends_and_not_before() {
    let d = desk();
    let tenant = connect(&d.engine, "agent").await;
    let args = json!({"sql": "DROP TABLE t"});
    let id = cancelled(&d.engine, &tenant, &args).await;
    let mut changes = d.engine.subscribe();
    d.clock.advance(STOPPED_WAITING_GRACE_MS - 1);
    assert_eq!(d.engine.expire_stopped(), 0);
    assert_eq!(d.engine.pending().len(), 1);
    d.clock.advance(1);
    // The queue's view says it at once, whether or not the timer has fired yet.
    assert!(d.engine.pending().is_empty());
    assert_eq!(d.engine.expire_stopped(), 1);
    let removed = std::iter::from_fn(|| changes.try_recv().ok())
        .find_map(|c| match c {
            QueueChange::Removed { id, reason } => Some((id, reason)),
            _ => None,
        })
        .expect("the window was not told it left");
    assert_eq!(removed, (id, Removal::Withdrawn));
    // Nothing to approve any more; the same call asked again is a new request, with its delay.
    assert_eq!(
        d.engine.approve(id, None).await,
        Err(ApproveError::NotPending)
    );
    let fresh = ticket(&d.engine, &tenant, &args).await;
    assert_ne!(fresh.id(), id);
    assert!(fresh.is_new());
}

#[tokio::test]
async fn the_retry_re_attaches_unmarks_and_the_approve_delay_runs_on_from_the_arrival() {
    let d = desk_with_delay(1_000);
    let tenant = connect(&d.engine, "agent").await;
    let args = json!({"sql": "UPDATE t SET v = 1"});
    let id = cancelled(&d.engine, &tenant, &args).await;
    d.clock.advance(900);
    let back = ticket(&d.engine, &tenant, &args).await;
    assert_eq!(back.id(), id, "re-attached, not a second entry");
    assert!(!back.is_new());
    assert_eq!(d.engine.pending().len(), 1);
    assert_eq!(marked(&d.engine, id), None, "the agent is back: no mark");
    // The delay counts from the arrival 900 ms ago, not from the re-attach.
    assert_eq!(
        d.engine.approve(id, None).await,
        Err(ApproveError::TooSoon { wait_ms: 100 })
    );
    d.clock.advance(100);
    let waiting = tokio::spawn({
        let engine = d.engine.clone();
        async move { engine.decision(back, Duration::from_secs(10)).await }
    });
    d.engine.approve(id, None).await.unwrap();
    assert!(waiting.await.unwrap().is_ok());
}

#[tokio::test]
async fn a_cancel_while_the_same_call_still_waits_elsewhere_marks_nothing() {
    let d = desk();
    let tenant = connect(&d.engine, "agent").await;
    let args = json!({"sql": "DELETE FROM t WHERE id = 2"});
    let first = ticket(&d.engine, &tenant, &args).await;
    let second = ticket(&d.engine, &tenant, &args).await;
    assert_eq!(first.id(), second.id());
    d.engine.stop_waiting(&tenant, "execute", &args).unwrap();
    drop(first);
    assert_eq!(marked(&d.engine, second.id()), None);
    d.clock.advance(STOPPED_WAITING_GRACE_MS);
    assert_eq!(d.engine.expire_stopped(), 0, "someone still waits for it");
    assert_eq!(d.engine.pending().len(), 1);
}

#[tokio::test]
async fn an_approval_given_in_the_grace_is_collected_later_only_by_the_same_tenant_and_plan() {
    let d = desk();
    let owner = connect(&d.engine, "agent").await;
    let other = connect(&d.engine, "agent").await;
    let args = json!({"sql": "DELETE FROM accounts"});
    let id = cancelled(&d.engine, &owner, &args).await;
    d.clock.advance(STOPPED_WAITING_GRACE_MS - 1);
    d.engine.approve(id, None).await.unwrap();
    // The grace ends: a decided request is not swept as if nobody had decided it.
    d.clock.advance(10);
    assert_eq!(d.engine.expire_stopped(), 0);
    // Another connection asking the same arguments gets a request of its own, never this token.
    let theirs = ticket(&d.engine, &other, &args).await;
    assert_ne!(theirs.id(), id);
    assert!(theirs.is_new());
    // The owner asking another plan does not collect it either.
    let elsewhere = ticket(&d.engine, &owner, &json!({"sql": "DELETE FROM other"})).await;
    assert_ne!(elsewhere.id(), id);
    // The owner's same call collects it.
    let mine = d
        .engine
        .preflight(&owner, "execute", &args, Duration::from_millis(1))
        .await;
    assert!(mine.is_ok(), "{mine:?}");
}

#[tokio::test]
async fn a_deny_in_the_grace_reaches_the_retry_and_a_disconnect_still_takes_the_request() {
    let d = desk();
    let tenant = connect(&d.engine, "agent").await;
    let args = json!({"sql": "DELETE FROM a"});
    let id = cancelled(&d.engine, &tenant, &args).await;
    d.engine.deny(id, Some("not today")).await.unwrap();
    let answer = d
        .engine
        .preflight(&tenant, "execute", &args, Duration::from_millis(1))
        .await;
    assert_eq!(refusal(&answer), Some(Refusal::Denied));

    // A gateway that disconnects takes its requests, marked or not: its tenant is gone.
    let args = json!({"sql": "DELETE FROM b"});
    let id = cancelled(&d.engine, &tenant, &args).await;
    let mut changes = d.engine.subscribe();
    d.engine.disconnect(&tenant).await;
    assert!(d.engine.pending().is_empty());
    let removed = std::iter::from_fn(|| changes.try_recv().ok()).find_map(|c| match c {
        QueueChange::Removed { id, reason } => Some((id, reason)),
        _ => None,
    });
    assert_eq!(removed, Some((id, Removal::Disconnected)));
    assert_eq!(
        d.engine.approve(id, None).await,
        Err(ApproveError::NotPending)
    );
}

#[tokio::test(start_paused = true)]
async fn the_engine_takes_a_request_off_the_queue_itself_when_its_grace_ends() {
    let d = desk();
    let tenant = connect(&d.engine, "agent").await;
    let args = json!({"sql": "DELETE FROM c"});
    let id = cancelled(&d.engine, &tenant, &args).await;
    // The runtime's timer wakes the engine at the grace's end; the engine's clock says it is
    // over (both are moved here, neither is slept on).
    d.clock.advance(STOPPED_WAITING_GRACE_MS);
    let mut changes = d.engine.subscribe();
    tokio::time::advance(Duration::from_millis(STOPPED_WAITING_GRACE_MS)).await;
    let removed = tokio::time::timeout(Duration::from_secs(1), async {
        loop {
            if let Ok(QueueChange::Removed { id, reason }) = changes.recv().await {
                return (id, reason);
            }
        }
    })
    .await
    .expect("the engine did not take it off the queue at the grace's end");
    assert_eq!(removed, (id, Removal::Withdrawn));
    support::until(&d.engine, || d.engine.pending().is_empty()).await;
}
