//! The 2026-07-28 flow's `requestState` in the engine: on a desk (the queue's own id, used up in
//! memory) and on a team's server, where two engines share one record file as two replicas share
//! the control database, and a state sealed by one is resumed by the other. What the replicas
//! know of their waiting calls is a double here (the server's real one is tested end to end in
//! tests/serve.rs); the ledger each state is spent in is the real file.

use countersign_core::Tenant;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use countersign_core::request_state::StateRefusal;
use countersign_core::{PlanHash, Refusal, ServerId};
use countersign_engine::{
    Engine, ManualClock, Resumed, SharedFate, SharedRequests, Stopped, Unsealed,
};
use serde_json::{Value, json};

/// The team server's caller every test here asks as.
fn tenant() -> Tenant {
    Tenant::team("key:ci", &ServerId::Registered("db".into()))
}

/// A replica's engine on the team's file in `dir`, its time `clock`'s.
fn engine_on(dir: &std::path::Path, clock: &ManualClock) -> Engine {
    let mut config = countersign_tests::engine::config();
    config.clock = Arc::new(clock.clone());
    countersign_tests::engine::engine(dir, config)
}

async fn attached(engine: &Engine) {
    engine
        .attach(&tenant(), ServerId::Registered("db".into()))
        .unwrap();
    engine
        .register_tools(&tenant(), vec![json!({"name": "execute"})])
        .await
        .unwrap();
}

/// Queues `arguments` for `execute` without waiting, and returns the plan and the local id.
async fn queued(engine: &Engine, arguments: &Value) -> (PlanHash, u64) {
    let r = engine
        .preflight(&tenant(), "execute", arguments, Duration::ZERO)
        .await;
    assert_eq!(
        r.as_ref().err().and_then(Stopped::refusal),
        Some(Refusal::Pending)
    );
    let (plan, id) = engine
        .queued_aside(&tenant(), "execute", arguments)
        .await
        .unwrap();
    (plan, id.unwrap())
}

fn refused(r: &Resumed) -> Option<&StateRefusal> {
    match r {
        Resumed::Refused(why) => Some(why),
        _ => None,
    }
}

#[tokio::test]
async fn on_a_desk_a_state_continues_its_own_request_once() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::starting_now();
    let engine = engine_on(dir.path(), &clock);
    attached(&engine).await;
    let args = json!({"sql": "DELETE FROM t"});
    let (plan, id) = queued(&engine, &args).await;
    let state = engine
        .seal_round(&tenant(), "execute", plan, id, 1)
        .await
        .unwrap();
    let other = json!({"sql": "DELETE FROM u"});
    assert_eq!(
        refused(
            &engine
                .resume_round(&tenant(), "execute", &other, &state)
                .await
        ),
        Some(&StateRefusal::PlanChanged)
    );
    assert_eq!(
        engine
            .resume_round(&tenant(), "execute", &args, &state)
            .await,
        Resumed::Continue { round: 1 }
    );
    assert_eq!(
        refused(
            &engine
                .resume_round(&tenant(), "execute", &args, &state)
                .await
        ),
        Some(&StateRefusal::Used)
    );
    // A state for a request that left the queue continues nothing.
    let fresh = engine
        .seal_round(&tenant(), "execute", plan, id, 2)
        .await
        .unwrap();
    engine.withdraw(&tenant(), "execute", &args).unwrap();
    assert_eq!(
        refused(
            &engine
                .resume_round(&tenant(), "execute", &args, &fresh)
                .await
        ),
        Some(&StateRefusal::RequestGone)
    );
}

/// What the replicas know of their waiting calls: one table both engines read, as the control
/// database is. Local ids are numbered `1000 + id` on the first replica, `2000 + id` on the
/// second; what became of each number is set by the test.
#[derive(Default)]
struct Table {
    fates: Mutex<HashMap<u64, SharedFate>>,
    unshared: Mutex<bool>,
}

struct Replica {
    base: u64,
    table: Arc<Table>,
}

#[async_trait]
impl SharedRequests for Replica {
    async fn number(&self, local: u64) -> Option<u64> {
        if *countersign_core::sync::lock(&self.table.unshared) {
            return None;
        }
        let number = self.base + local;
        countersign_core::sync::lock(&self.table.fates)
            .entry(number)
            .or_insert(SharedFate::Waiting);
        Some(number)
    }

    async fn fate(&self, number: u64, _tenant: &Tenant, _plan: &PlanHash) -> SharedFate {
        countersign_core::sync::lock(&self.table.fates)
            .get(&number)
            .cloned()
            .unwrap_or(SharedFate::Gone)
    }
}

struct Team {
    a: Engine,
    b: Engine,
    table: Arc<Table>,
    _dir: tempfile::TempDir,
}

async fn team() -> Team {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::starting_now();
    let table = Arc::new(Table::default());
    let a = engine_on(dir.path(), &clock);
    let b = engine_on(dir.path(), &clock);
    for (engine, base) in [(&a, 1000), (&b, 2000)] {
        let replica = Replica {
            base,
            table: table.clone(),
        };
        assert!(engine.share_requests(Arc::new(replica)));
        attached(engine).await;
    }
    Team {
        a,
        b,
        table,
        _dir: dir,
    }
}

#[tokio::test]
async fn on_a_team_server_a_state_sealed_on_one_replica_continues_on_another_and_works_once() {
    let t = team().await;
    let args = json!({"sql": "DELETE FROM t"});
    let (plan, id) = queued(&t.a, &args).await;
    let state =
        t.a.seal_round(&tenant(), "execute", plan, id, 1)
            .await
            .unwrap();
    // The retry lands on the other replica, where nothing of the call waits locally.
    assert!(t.b.pending().is_empty());
    assert_eq!(
        t.b.resume_round(&tenant(), "execute", &args, &state).await,
        Resumed::Continue { round: 1 }
    );
    // Used there: refused here, and there again (the shared ledger, not a replica's memory).
    for replica in [&t.a, &t.b] {
        assert_eq!(
            refused(
                &replica
                    .resume_round(&tenant(), "execute", &args, &state)
                    .await
            ),
            Some(&StateRefusal::Used)
        );
    }
    // A second engine cannot be given another table behind the first one's back.
    let other = Replica {
        base: 0,
        table: t.table.clone(),
    };
    assert!(!t.a.share_requests(Arc::new(other)));
}

#[tokio::test]
async fn on_a_team_server_a_state_says_what_became_of_the_shared_call() {
    let t = team().await;
    let args = json!({"sql": "DELETE FROM t"});
    let (plan, id) = queued(&t.a, &args).await;
    let number = 1000 + id;
    let caller = tenant();
    let seal = |round| t.a.seal_round(&caller, "execute", plan, id, round);
    // Denied on some replica while the client was away: the person's note, once.
    let state = seal(1).await.unwrap();
    countersign_core::sync::lock(&t.table.fates).insert(
        number,
        SharedFate::Denied {
            note: Some("not on Fridays".into()),
        },
    );
    match t.b.resume_round(&tenant(), "execute", &args, &state).await {
        Resumed::Decided(Stopped::Refused { refusal, message }) => {
            assert_eq!(refusal, Refusal::Denied);
            assert!(message.contains("not on Fridays"), "{message}");
        }
        other => panic!("expected the deny, got {other:?}"),
    }
    assert_eq!(
        refused(&t.b.resume_round(&tenant(), "execute", &args, &state).await),
        Some(&StateRefusal::Used)
    );
    // Minted elsewhere, expired or withdrawn: gone.
    let state = seal(2).await.unwrap();
    countersign_core::sync::lock(&t.table.fates).insert(number, SharedFate::Gone);
    assert_eq!(
        refused(&t.b.resume_round(&tenant(), "execute", &args, &state).await),
        Some(&StateRefusal::RequestGone)
    );
    // The shared records unreadable: refused, failing closed, and the state is not spent.
    let state = seal(3).await.unwrap();
    countersign_core::sync::lock(&t.table.fates).insert(number, SharedFate::Unreachable);
    assert_eq!(
        refused(&t.b.resume_round(&tenant(), "execute", &args, &state).await),
        Some(&StateRefusal::Unreachable)
    );
    countersign_core::sync::lock(&t.table.fates).insert(number, SharedFate::Waiting);
    assert_eq!(
        t.b.resume_round(&tenant(), "execute", &args, &state).await,
        Resumed::Continue { round: 3 }
    );
    // Another plan under a good state: plan_changed, whatever the table says.
    let state = seal(4).await.unwrap();
    let other = json!({"sql": "DELETE FROM u"});
    assert_eq!(
        refused(&t.b.resume_round(&tenant(), "execute", &other, &state).await),
        Some(&StateRefusal::PlanChanged)
    );
    // A call that cannot be shared now gets no state naming it.
    *countersign_core::sync::lock(&t.table.unshared) = true;
    assert_eq!(seal(5).await, Err(Unsealed::NotShared));
}
