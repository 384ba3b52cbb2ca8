//! One suite, both stores: every behaviour the engine relies on from its records, run against
//! the desk's SQLite file and against PostgreSQL, so the two implementations of `Records` cannot
//! drift apart. Each behaviour is a generic function over `&dyn Records`; the `suite!` macro
//! instantiates it once per store. The PostgreSQL half needs `.ci/with-postgres` (a fresh
//! database per test) and fails, not passes, without it. The rows stored are the store crate's
//! own fixtures (`countersign_store::test_support`), the same its unit tests use. What only one
//! store has is tested apart: SQLite's file (damaged rows, locks, reopening, migrations) by the
//! store crate's unit tests, PostgreSQL's concurrent migrations and newer-schema refusal after
//! the suite here.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use countersign_core::approver::Verdict;
use countersign_core::chain::{Break, ChainKey, Walk};
use countersign_core::telemetry::EventKind;
use countersign_core::{GateClass, PlanHash, Refusal, SpendError};
use countersign_store::test_support::{
    accepted, approval, assert_spent_once, event, every_kind, grant, nonce, pin, spent,
};
use countersign_store::{
    Accepted, Assertion, DecisionRecord, Evidence, Grant, GrantEnd, GrantKind, HistoryFilter,
    Invite, MAX_ACCEPTED_BYTES, MAX_DEFINITION_CHARS, MAX_PINS_PER_SERVER, Member, Passkey,
    Postgres, PostgresOptions, Pruned, Records, Roster, SharedRow, Sqlite, Store, StoreError,
    StoreOptions, ToolPin, WaitingCall,
};
use countersign_tests::postgres::{migrated_database, shared_database};

/// A store under test, with whatever must live as long as it.
struct Fixture {
    records: Arc<dyn Records>,
    _dir: Option<tempfile::TempDir>,
}

/// The key every store of the suite signs its history's head with.
fn chain_key() -> Arc<ChainKey> {
    Arc::new(ChainKey::from_seed(&[9; 32]))
}

fn sqlite() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path().join("countersign.db"),
        StoreOptions::default().with_chain_key(chain_key()),
    )
    .unwrap();
    Fixture {
        records: Arc::new(Sqlite::new(store)),
        _dir: Some(dir),
    }
}

/// One replica's records on the database `dsn`, signing the chain's head with [`chain_key`].
async fn replica(dsn: &str) -> R {
    Arc::new(
        Postgres::connect(dsn, PostgresOptions::default().with_chain_key(chain_key()))
            .await
            .unwrap(),
    )
}

async fn postgres() -> Fixture {
    let dsn = shared_database().await;
    Fixture {
        records: replica(&dsn).await,
        _dir: None,
    }
}

macro_rules! suite {
    ($($behaviour:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    let fixture = super::sqlite();
                    super::$behaviour(fixture.records.clone()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
                async fn $behaviour() {
                    let fixture = super::postgres().await;
                    super::$behaviour(fixture.records.clone()).await;
                }
            )*
        }
    };
}

suite!(
    a_spent_nonce_is_already_spent_the_second_time,
    tasks_racing_one_nonce_spend_it_once,
    confirms_racing_one_nonce_spend_it_once_and_record_it_once,
    a_replayed_confirm_is_refused_and_records_nothing,
    an_approval_reads_back_exactly_and_is_never_overwritten,
    an_open_class_approval_is_refused,
    a_withdrawn_approval_is_gone_and_only_that_one,
    a_time_beyond_the_stores_range_is_refused,
    history_round_trips_every_event_kind,
    history_is_newest_first,
    history_filters_by_tool_tenant_kind_nonce_and_limit,
    events_recorded_at_once_form_one_chain_under_a_signed_head,
    record_emits_one_confirm_event_per_event,
    prune_deletes_only_rows_expired_before_now,
    prune_keeps_history_and_pins,
    first_sight_pins_and_a_later_sight_finds_the_first_pin,
    an_accepted_change_replaces_the_pin,
    a_huge_definition_is_kept_cut_and_its_hash_whole,
    a_first_listing_pins_at_most_its_share,
    a_stored_grant_reads_back_with_its_number_and_counts_its_uses,
    an_expired_or_ended_grant_is_not_live_and_ends_once,
    session_grants_end_with_their_connection_or_all_at_a_restart,
    no_grant_is_stored_past_the_cap_of_live_ones,
    racing_grants_never_pass_the_cap_together,
    a_file_is_unknown_until_accepted_then_its_latest_text_is_kept,
    a_huge_accepted_file_is_refused_not_stored,
    an_accepted_file_is_replaced_only_in_place_of_the_text_expected,
    a_member_is_found_by_its_key_until_revoked_and_its_name_never_reused,
    a_member_name_that_could_pass_for_something_else_is_refused,
    decisions_are_kept_whole_in_order_and_read_back_newest_last,
    desks_and_passkeys_decisions_read_back_as_one_and_a_person_counts_once,
    a_passkey_counter_only_moves_forward_once_and_never_for_a_revoked_one,
    revoking_an_approver_ends_its_desk_key_and_every_passkey_at_once,
    an_invite_is_begun_and_used_once_before_it_expires,
    a_sign_in_challenge_is_taken_once_before_it_expires,
    a_waiting_call_is_seen_until_decided_once_or_expired_and_its_replica_reads_the_verdict,
    a_row_stays_in_sight_while_any_replica_keeps_it_and_a_decided_one_is_not_moved,
    a_call_shared_again_joins_its_one_row_until_denied_minted_or_long_lapsed,
    replicas_sharing_one_call_at_once_meet_on_one_row,
);

type R = Arc<dyn Records>;

async fn a_spent_nonce_is_already_spent_the_second_time(r: R) {
    assert_eq!(r.spend(&nonce(1), 10).await, Ok(()));
    assert_eq!(r.spend(&nonce(1), 10).await, Err(SpendError::AlreadySpent));
    assert_eq!(r.spend(&nonce(1), 99).await, Err(SpendError::AlreadySpent));
    assert_eq!(r.spend(&nonce(2), 10).await, Ok(()));
    // An expiry beyond the store's range is "never": the nonce is kept, and no `now` prunes it.
    assert_eq!(r.spend(&nonce(3), u64::MAX).await, Ok(()));
    assert_eq!(
        r.spend(&nonce(3), u64::MAX).await,
        Err(SpendError::AlreadySpent)
    );
    assert_eq!(r.prune(u64::MAX).await.unwrap().nonces, 2, "only 1 and 2");
    assert_eq!(
        r.spend(&nonce(3), u64::MAX).await,
        Err(SpendError::AlreadySpent)
    );
}

async fn tasks_racing_one_nonce_spend_it_once(r: R) {
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let r = r.clone();
            tokio::spawn(async move { r.spend(&nonce(9), 10).await })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    assert_spent_once(&outcomes);
}

async fn confirms_racing_one_nonce_spend_it_once_and_record_it_once(r: R) {
    // Sixteen confirms of one nonce and sixteen of nonces of their own, all at once: what a
    // replica's writer takes in one batch or several.
    let tasks: Vec<_> = (0..32_u8)
        .map(|i| {
            let r = r.clone();
            let n = if i % 2 == 0 { 9 } else { 20 + i };
            tokio::spawn(async move {
                let outcome = r
                    .spend_recording(&nonce(n), 10, &accepted(n, 100 + u64::from(i)))
                    .await;
                (n, outcome)
            })
        })
        .collect();
    let mut of_nine = Vec::new();
    for task in tasks {
        let (n, outcome) = task.await.unwrap();
        let spent = spent(outcome);
        if n == 9 {
            of_nine.push(spent);
        } else {
            assert_eq!(spent, Ok(()), "a nonce of its own spends");
        }
    }
    assert_spent_once(&of_nine);
    let recorded = r.history(&HistoryFilter::all()).await.unwrap();
    assert_eq!(
        recorded.len(),
        17,
        "one event per nonce spent, none for a replay"
    );
    assert_eq!(
        recorded
            .iter()
            .filter(|e| e.nonce == Some(nonce(9)))
            .count(),
        1
    );
    assert!(recorded.iter().all(|e| e.kind == EventKind::Accepted));
    let intact = r
        .verify_history(Walk::new(Some(chain_key().public())))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((intact.first, intact.last), (Some(1), Some(17)));
    assert_eq!(intact.head.unwrap().head.seq, 17);
    // The spends are the ledger's like any other: the nonce stays spent.
    assert_eq!(r.spend(&nonce(9), 10).await, Err(SpendError::AlreadySpent));
}

async fn a_replayed_confirm_is_refused_and_records_nothing(r: R) {
    r.spend(&nonce(4), 10).await.unwrap();
    assert_eq!(
        spent(r.spend_recording(&nonce(4), 10, &accepted(4, 100)).await),
        Err(SpendError::AlreadySpent)
    );
    assert_eq!(
        spent(r.spend_recording(&nonce(5), 10, &accepted(5, 101)).await),
        Ok(())
    );
    assert_eq!(
        spent(r.spend_recording(&nonce(5), 10, &accepted(5, 102)).await),
        Err(SpendError::AlreadySpent)
    );
    let recorded = r.history(&HistoryFilter::all()).await.unwrap();
    assert_eq!(recorded, vec![accepted(5, 101)]);
}

async fn an_approval_reads_back_exactly_and_is_never_overwritten(r: R) {
    assert_eq!(r.approval(&nonce(1)).await.unwrap(), None);
    let mut first = approval(1, 700_000);
    first.arguments = serde_json::json!({
        "sql": "DELETE FROM t WHERE name = 'x' -- \u{202e}\u{0}",
        "floats": [0.1, 1e-300, 5e-324, 1.7976931348623157e308, 123456789.12345679, -0.0, 2.5],
        "ints": [u64::MAX, i64::MIN, 0, -1],
        "types": ["2", 2, 2.0, true, null, {}, []],
        "nested": { "b": { "z": 1, "a": [1, { "k": "v" }] }, "a": "é 漢字 🦀" },
    });
    r.put_approval(&first).await.unwrap();
    let back = r.approval(&nonce(1)).await.unwrap().unwrap();
    assert_eq!(back, first);
    // Same text too: floats come back bit for bit, and "2", 2 and 2.0 stay distinct.
    assert_eq!(back.arguments.to_string(), first.arguments.to_string());
    let mut token = approval(2, 700_000);
    (token.class, token.mac) = (GateClass::Token, None);
    r.put_approval(&token).await.unwrap();
    assert_eq!(r.approval(&nonce(2)).await.unwrap(), Some(token));

    let mut second = approval(1, 10);
    second.arguments = serde_json::json!({ "name": "something else" });
    assert!(
        matches!(r.put_approval(&second).await, Err(StoreError::ApprovalExists(n)) if n == nonce(1))
    );
    assert_eq!(r.approval(&nonce(1)).await.unwrap(), Some(first));
    assert_eq!(r.approval(&nonce(3)).await.unwrap(), None);
}

async fn an_open_class_approval_is_refused(r: R) {
    let mut open = approval(1, 10);
    open.class = GateClass::Open;
    let err = r.put_approval(&open).await.unwrap_err();
    assert!(matches!(err, StoreError::UngatedApproval(n) if n == nonce(1)));
    assert!(err.to_string().contains("open"), "{err}");
    assert_eq!(r.approval(&nonce(1)).await.unwrap(), None);
}

async fn a_withdrawn_approval_is_gone_and_only_that_one(r: R) {
    r.put_approval(&approval(1, 700_000)).await.unwrap();
    r.put_approval(&approval(2, 700_000)).await.unwrap();
    assert!(r.withdraw_approval(&nonce(1)).await.unwrap());
    assert!(!r.withdraw_approval(&nonce(1)).await.unwrap());
    assert_eq!(r.approval(&nonce(1)).await.unwrap(), None);
    assert!(r.approval(&nonce(2)).await.unwrap().is_some());
}

async fn a_time_beyond_the_stores_range_is_refused(r: R) {
    let mut approved = approval(1, 10);
    approved.expires_at_ms = u64::MAX;
    assert!(matches!(
        r.put_approval(&approved).await,
        Err(StoreError::TimeOutOfRange(u64::MAX))
    ));
    assert_eq!(r.approval(&nonce(1)).await.unwrap(), None);
    assert!(matches!(
        r.record(&event(u64::MAX, EventKind::Issued)).await,
        Err(StoreError::TimeOutOfRange(u64::MAX))
    ));
}

async fn history_round_trips_every_event_kind(r: R) {
    let mut recorded = Vec::new();
    for (i, kind) in every_kind().into_iter().enumerate() {
        let mut e = event(i as u64, kind);
        if i % 2 == 1 {
            (e.target, e.nonce, e.plan, e.note) = (None, None, None, None);
        }
        r.record(&e).await.unwrap();
        recorded.push(e);
    }
    recorded.reverse();
    assert_eq!(r.history(&HistoryFilter::all()).await.unwrap(), recorded);
}

async fn history_is_newest_first(r: R) {
    r.record(&event(20, EventKind::Issued)).await.unwrap();
    r.record(&event(10, EventKind::Accepted)).await.unwrap();
    r.record(&event(30, EventKind::Denied)).await.unwrap();
    // Same time: the later recorded is newer.
    r.record(&event(30, EventKind::Replay)).await.unwrap();
    let kinds: Vec<_> = r
        .history(&HistoryFilter::all())
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.at_ms, e.kind))
        .collect();
    assert_eq!(
        kinds,
        [
            (30, EventKind::Replay),
            (30, EventKind::Denied),
            (20, EventKind::Issued),
            (10, EventKind::Accepted)
        ]
    );
}

async fn history_filters_by_tool_tenant_kind_nonce_and_limit(r: R) {
    let mut at = 0;
    for tool in ["execute", "delete_backup"] {
        for tenant in ["conn-1", "conn-2"] {
            for kind in [
                EventKind::Issued,
                EventKind::Refused {
                    refusal: Refusal::Expired,
                },
            ] {
                at += 1;
                let mut e = event(at, kind);
                e.tool = tool.into();
                e.tenant = tenant.into();
                e.nonce = Some(nonce(at as u8));
                r.record(&e).await.unwrap();
            }
        }
    }
    let count = |filter: HistoryFilter| {
        let r = r.clone();
        async move { r.history(&filter).await.unwrap().len() }
    };
    assert_eq!(count(HistoryFilter::all()).await, 8);
    assert_eq!(count(HistoryFilter::all().tool("execute")).await, 4);
    assert_eq!(count(HistoryFilter::all().tenant("conn-2")).await, 4);
    assert_eq!(count(HistoryFilter::all().kind(EventKind::Issued)).await, 4);
    let refused = HistoryFilter::all().kind(EventKind::Refused {
        refusal: Refusal::BadToken,
    });
    assert_eq!(
        count(refused).await,
        4,
        "the kind filter compares codes only"
    );
    let narrow = HistoryFilter::all()
        .tool("execute")
        .tenant("conn-1")
        .kind(EventKind::Issued);
    assert_eq!(count(narrow).await, 1);
    assert_eq!(count(HistoryFilter::all().tool("nothing")).await, 0);
    let by_nonce = r
        .history(&HistoryFilter::all().nonce(nonce(3)))
        .await
        .unwrap();
    assert_eq!(by_nonce.len(), 1);
    assert_eq!(by_nonce[0].at_ms, 3);
    let newest = r.history(&HistoryFilter::all().limit(3)).await.unwrap();
    assert_eq!(
        newest.iter().map(|e| e.at_ms).collect::<Vec<_>>(),
        [8, 7, 6]
    );
    assert_eq!(count(HistoryFilter::all().limit(0)).await, 0);
}

/// Counts the `confirm` events emitted while it is the thread's default subscriber.
struct ConfirmEvents(Arc<AtomicUsize>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ConfirmEvents {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() == "confirm" {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn events_recorded_at_once_form_one_chain_under_a_signed_head(r: R) {
    let tasks: Vec<_> = (0..24_u64)
        .map(|i| {
            let r = r.clone();
            tokio::spawn(async move { r.record(&event(100 + i, EventKind::Issued)).await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let intact = r
        .verify_history(Walk::new(Some(chain_key().public())))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((intact.first, intact.last), (Some(1), Some(24)));
    assert_eq!(intact.head.unwrap().head.seq, 24);
    let other = ChainKey::from_seed(&[1; 32]).public();
    assert!(matches!(
        r.verify_history(Walk::new(Some(other))).await.unwrap(),
        Err(Break::WrongKey { seq: 24, .. })
    ));
}

async fn record_emits_one_confirm_event_per_event(r: R) {
    use tracing_subscriber::layer::SubscriberExt;
    let count = Arc::new(AtomicUsize::new(0));
    let subscriber = tracing_subscriber::registry().with(ConfirmEvents(count.clone()));
    // The test's own future runs on this thread, and so does the emitting.
    let _default = tracing::subscriber::set_default(subscriber);
    r.record(&event(1, EventKind::Issued)).await.unwrap();
    r.record(&event(2, EventKind::Replay)).await.unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 2);
    // A write that fails is still emitted: a refusal reaches the logs even when not the store.
    assert!(r.record(&event(u64::MAX, EventKind::Replay)).await.is_err());
    assert_eq!(count.load(Ordering::SeqCst), 3);
}

async fn prune_deletes_only_rows_expired_before_now(r: R) {
    for (n, expires) in [(1, 10), (2, 20), (3, 30)] {
        r.spend(&nonce(n), expires).await.unwrap();
        r.put_approval(&approval(n, expires)).await.unwrap();
    }
    assert_eq!(
        r.prune(20).await.unwrap(),
        Pruned {
            nonces: 1,
            approvals: 1,
            history: 0,
            pins: 0
        }
    );
    // Expiring exactly at `now` is not "before now": kept.
    assert_eq!(r.spend(&nonce(2), 20).await, Err(SpendError::AlreadySpent));
    assert_eq!(r.spend(&nonce(3), 30).await, Err(SpendError::AlreadySpent));
    assert!(r.approval(&nonce(1)).await.unwrap().is_none());
    assert!(r.approval(&nonce(2)).await.unwrap().is_some());
    // The pruned nonce's row is gone (its token is refused as expired before the ledger).
    assert_eq!(r.spend(&nonce(1), 10).await, Ok(()));
    assert_eq!(
        r.prune(u64::MAX).await.unwrap(),
        Pruned {
            nonces: 3,
            approvals: 2,
            history: 0,
            pins: 0
        }
    );
}

async fn prune_keeps_history_and_pins(r: R) {
    r.record(&event(1, EventKind::Issued)).await.unwrap();
    r.pin_first_seen(&[pin("s", "a", 1, 10)]).await.unwrap();
    assert_eq!(r.prune(u64::MAX).await.unwrap(), Pruned::default());
    assert_eq!(r.history(&HistoryFilter::all()).await.unwrap().len(), 1);
    assert!(r.tool_pin("s", "a").await.unwrap().is_some());
}

async fn first_sight_pins_and_a_later_sight_finds_the_first_pin(r: R) {
    let first = r
        .pin_first_seen(&[pin("s", "a", 1, 10), pin("s", "b", 2, 10)])
        .await
        .unwrap();
    assert_eq!(first, vec![pin("s", "a", 1, 10), pin("s", "b", 2, 10)]);
    // A changed definition does not replace the pin: the pin in force comes back. A tool new to
    // a server the desk knows is not pinned on sight: the person accepts it first.
    let later = r
        .pin_first_seen(&[pin("s", "a", 9, 20), pin("s", "c", 3, 20)])
        .await
        .unwrap();
    assert_eq!(later, vec![pin("s", "a", 1, 10)]);
    assert_eq!(r.tool_pin("s", "c").await.unwrap(), None);
    // Another server's tool of the same name is its own pin.
    let other = r.pin_first_seen(&[pin("t", "a", 5, 30)]).await.unwrap();
    assert_eq!(other, vec![pin("t", "a", 5, 30)]);
}

async fn an_accepted_change_replaces_the_pin(r: R) {
    r.pin_first_seen(&[pin("s", "a", 1, 10)]).await.unwrap();
    r.repin(&pin("s", "a", 2, 20)).await.unwrap();
    assert_eq!(
        r.tool_pin("s", "a").await.unwrap(),
        Some(pin("s", "a", 2, 20))
    );
    assert_eq!(r.tool_pin("s", "b").await.unwrap(), None);
}

async fn a_huge_definition_is_kept_cut_and_its_hash_whole(r: R) {
    let mut big = pin("s", "a", 1, 10);
    big.definition = "x".repeat(MAX_DEFINITION_CHARS + 5);
    let kept = r.pin_first_seen(&[big]).await.unwrap().remove(0);
    assert!(kept.definition.ends_with("… [cut: 5 more characters]"));
    assert_eq!(kept.hash, PlanHash::from_bytes([1; 32]));
}

async fn a_first_listing_pins_at_most_its_share(r: R) {
    let listing: Vec<ToolPin> = (0..MAX_PINS_PER_SERVER + 5)
        .map(|i| pin("flood", &format!("t{i}"), 1, 1))
        .collect();
    let pins = r.pin_first_seen(&listing).await.unwrap();
    assert_eq!(pins.len(), MAX_PINS_PER_SERVER);
    let last = format!("t{}", MAX_PINS_PER_SERVER + 4);
    assert_eq!(r.tool_pin("flood", &last).await.unwrap(), None);
}

/// Stores `grant` (under a cap of 64 live grants, at 1000) and answers its number.
async fn stored(r: &R, grant: &Grant) -> u64 {
    r.put_grant(grant, 64, 1_000)
        .await
        .unwrap()
        .expect("stored under the cap")
}

/// The numbers of the grants live at `now`, oldest first.
async fn live_ids(r: &R, now: u64) -> Vec<u64> {
    r.live_grants(now)
        .await
        .unwrap()
        .iter()
        .map(|g| g.id)
        .collect()
}

async fn a_stored_grant_reads_back_with_its_number_and_counts_its_uses(r: R) {
    let id = stored(&r, &grant(GrantKind::Call, 10_000)).await;
    r.grant_used(id).await.unwrap();
    r.grant_used(id).await.unwrap();
    let live = r.live_grants(1_000).await.unwrap();
    assert_eq!(
        live,
        vec![Grant {
            id,
            uses: 2,
            ..grant(GrantKind::Call, 10_000)
        }]
    );
    assert_eq!(r.grant(id).await.unwrap(), Some(live[0].clone()));
    assert_eq!(r.grant(id + 1).await.unwrap(), None);
    assert_eq!(r.grant(u64::MAX).await.unwrap(), None);
}

async fn an_expired_or_ended_grant_is_not_live_and_ends_once(r: R) {
    let a = stored(&r, &grant(GrantKind::Call, 5_000)).await;
    let b = stored(&r, &grant(GrantKind::Call, 9_000)).await;
    // Expiring exactly at `now` is no longer live.
    assert_eq!(r.live_grants(5_000).await.unwrap().len(), 1);
    assert!(r.end_grant(b, 6_000, GrantEnd::Revoked).await.unwrap());
    assert!(!r.end_grant(b, 6_001, GrantEnd::Revoked).await.unwrap());
    // An expired grant cannot be revoked: it is already over.
    assert!(!r.end_grant(a, 6_000, GrantEnd::Revoked).await.unwrap());
    assert_eq!(live_ids(&r, 1_000).await, vec![a]);
    assert!(r.live_grants(5_000).await.unwrap().is_empty());
    assert_eq!(
        r.grant(b).await.unwrap().unwrap().ended,
        Some((6_000, GrantEnd::Revoked))
    );
}

async fn session_grants_end_with_their_connection_or_all_at_a_restart(r: R) {
    let call = stored(&r, &grant(GrantKind::Call, 10_000)).await;
    let mine = stored(&r, &grant(GrantKind::Prefix, 10_000)).await;
    let other = Grant {
        tenant: Some("conn-2".into()),
        ..grant(GrantKind::Prefix, 10_000)
    };
    let other = stored(&r, &other).await;
    assert_eq!(
        r.end_prefix_grants(Some("conn-1"), 2_000, GrantEnd::Disconnected)
            .await
            .unwrap(),
        1
    );
    assert_eq!(live_ids(&r, 2_000).await, vec![call, other]);
    assert_eq!(
        r.end_prefix_grants(None, 3_000, GrantEnd::Restarted)
            .await
            .unwrap(),
        1
    );
    assert_eq!(live_ids(&r, 3_000).await, vec![call]);
    assert_eq!(
        r.grant(mine).await.unwrap().unwrap().ended,
        Some((2_000, GrantEnd::Disconnected))
    );
}

async fn no_grant_is_stored_past_the_cap_of_live_ones(r: R) {
    for _ in 0..3 {
        assert!(
            r.put_grant(&grant(GrantKind::Call, 10_000), 3, 1_000)
                .await
                .unwrap()
                .is_some()
        );
    }
    assert_eq!(
        r.put_grant(&grant(GrantKind::Call, 10_000), 3, 1_000)
            .await
            .unwrap(),
        None
    );
    // Expired ones do not count.
    assert!(
        r.put_grant(&grant(GrantKind::Call, 20_000), 3, 10_000)
            .await
            .unwrap()
            .is_some()
    );
}

async fn racing_grants_never_pass_the_cap_together(r: R) {
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let r = r.clone();
            tokio::spawn(
                async move { r.put_grant(&grant(GrantKind::Call, 10_000), 3, 1_000).await },
            )
        })
        .collect();
    let mut stored = 0;
    for task in tasks {
        if task.await.unwrap().unwrap().is_some() {
            stored += 1;
        }
    }
    assert_eq!(stored, 3);
    assert_eq!(r.live_grants(1_000).await.unwrap().len(), 3);
}

async fn a_file_is_unknown_until_accepted_then_its_latest_text_is_kept(r: R) {
    assert_eq!(r.accepted("servers.json").await.unwrap(), None);
    r.accept("servers.json", "{}", 5).await.unwrap();
    r.accept("servers.json", "{\"servers\": {}}", 7)
        .await
        .unwrap();
    r.accept("policy.toml", "", 8).await.unwrap();
    assert_eq!(
        r.accepted("servers.json").await.unwrap(),
        Some(Accepted {
            text: "{\"servers\": {}}".into(),
            at_ms: 7
        })
    );
    assert_eq!(r.accepted("policy.toml").await.unwrap().unwrap().text, "");
}

fn member(name: &str, n: u8) -> Member {
    Member {
        name: name.into(),
        key: [n; 32],
        created_at_ms: 1_000,
        revoked_at_ms: None,
    }
}

async fn a_member_is_found_by_its_key_until_revoked_and_its_name_never_reused(r: R) {
    for roster in [Roster::Agents, Roster::Approvers] {
        assert_eq!(r.member(roster, &[1; 32]).await.unwrap(), None);
        assert!(r.put_member(roster, &member("ci-runner", 1)).await.unwrap());
        assert!(
            r.put_member(roster, &member("nightly.build", 2))
                .await
                .unwrap()
        );
        assert_eq!(
            r.member(roster, &[1; 32]).await.unwrap(),
            Some(member("ci-runner", 1))
        );
        // The same name again, even with another key: refused, nothing written.
        assert!(!r.put_member(roster, &member("ci-runner", 3)).await.unwrap());
        assert_eq!(r.member(roster, &[3; 32]).await.unwrap(), None);
        // The same key under another name: nothing written (a key names one member).
        assert!(!r.put_member(roster, &member("other", 1)).await.unwrap());
        assert!(r.revoke_member(roster, "ci-runner", 5_000).await.unwrap());
        assert!(
            !r.revoke_member(roster, "ci-runner", 6_000).await.unwrap(),
            "revoked once"
        );
        assert!(!r.revoke_member(roster, "nobody", 6_000).await.unwrap());
        let revoked = r.member(roster, &[1; 32]).await.unwrap().unwrap();
        assert_eq!(revoked.revoked_at_ms, Some(5_000));
        assert!(!revoked.is_active());
        // A revoked name stays taken: another member never inherits its history.
        assert!(!r.put_member(roster, &member("ci-runner", 4)).await.unwrap());
        let names: Vec<String> = r
            .members(roster)
            .await
            .unwrap()
            .into_iter()
            .map(|k| k.name)
            .collect();
        assert_eq!(names, ["ci-runner", "nightly.build"]);
    }
    // The rosters are apart: revoking an agent did nothing to the approver of the same name
    // before it was revoked there, and an agent's key hash is no approver's key.
    r.put_member(Roster::Agents, &member("only-agent", 7))
        .await
        .unwrap();
    assert_eq!(r.member(Roster::Approvers, &[7; 32]).await.unwrap(), None);
}

async fn a_member_name_that_could_pass_for_something_else_is_refused(r: R) {
    for roster in [Roster::Agents, Roster::Approvers] {
        for bad in [
            "",
            "a b",
            "key:x",
            "x@y",
            "a\u{202e}b",
            "\u{0430}dmin",
            &"n".repeat(65),
            "a\0",
        ] {
            assert!(
                r.put_member(roster, &member(bad, 9)).await.is_err(),
                "{bad:?}"
            );
        }
        assert!(r.members(roster).await.unwrap().is_empty());
    }
}

fn decision_record(request: u64, verdict: Verdict) -> DecisionRecord {
    DecisionRecord {
        approver: "alice".into(),
        server: "https://approvers.example.com".into(),
        request,
        verdict,
        plan: PlanHash::from_bytes([request as u8; 32]),
        tenant: "key:ci@server:db".into(),
        tool: "execute".into(),
        target: "users\u{202e}".into(),
        class: GateClass::Once,
        expires_at_ms: u64::MAX >> 1,
        evidence: Evidence::Desk {
            signature: [request as u8; 64],
        },
        decided_at_ms: 1_000 + request,
    }
}

async fn decisions_are_kept_whole_in_order_and_read_back_newest_last(r: R) {
    assert!(r.decisions(10).await.unwrap().is_empty());
    for n in 1..=5 {
        let verdict = if n == 3 {
            Verdict::Deny
        } else {
            Verdict::Approve
        };
        r.put_decision(&decision_record(n, verdict)).await.unwrap();
    }
    let all = r.decisions(100).await.unwrap();
    let requests: Vec<u64> = all.iter().map(|d| d.request).collect();
    assert_eq!(requests, [1, 2, 3, 4, 5]);
    assert_eq!(all[2].verdict, Verdict::Deny);
    assert_eq!(all[3], decision_record(4, Verdict::Approve));
    // The newest `limit`, still oldest first.
    let newest: Vec<u64> = r
        .decisions(2)
        .await
        .unwrap()
        .iter()
        .map(|d| d.request)
        .collect();
    assert_eq!(newest, [4, 5]);
}

fn passkey_decision(request: u64, approver: &str, verdict: Verdict) -> DecisionRecord {
    DecisionRecord {
        approver: approver.into(),
        decided_at_ms: 2_000 + request,
        evidence: Evidence::Passkey(Assertion {
            credential_id: vec![7; 16],
            authenticator_data: vec![1; 37],
            client_data: br#"{"type":"webauthn.get"}"#.to_vec(),
            signature: vec![0x30; 71],
        }),
        ..decision_record(request, verdict)
    }
}

async fn desks_and_passkeys_decisions_read_back_as_one_and_a_person_counts_once(r: R) {
    let desk = decision_record(1, Verdict::Approve);
    let by_passkey = passkey_decision(1, "alice", Verdict::Approve);
    let bob = passkey_decision(1, "bob", Verdict::Approve);
    for d in [&desk, &by_passkey, &bob] {
        r.put_decision(d).await.unwrap();
    }
    let all = r.decisions(10).await.unwrap();
    assert_eq!(all, vec![desk.clone(), by_passkey.clone(), bob.clone()]);
    // Alice by her desk and by her passkey is one person.
    assert_eq!(
        r.approved_by(&desk.server, 1, &desk.plan).await.unwrap(),
        ["alice", "bob"]
    );
    // An assertion part out of bounds is refused, not kept cut.
    let mut huge = passkey_decision(2, "carol", Verdict::Approve);
    if let Evidence::Passkey(a) = &mut huge.evidence {
        a.client_data = vec![b'x'; countersign_store::MAX_ASSERTION_PART_BYTES + 1];
    }
    assert!(r.put_decision(&huge).await.is_err());
    assert_eq!(r.decisions(10).await.unwrap().len(), 3);
}

fn passkey(approver: &str, id: u8) -> Passkey {
    Passkey {
        approver: approver.into(),
        credential_id: vec![id; 16],
        credential: format!(r#"{{"cred_id":"{id}"}}"#),
        counter: 0,
        created_at_ms: 10,
        revoked_at_ms: None,
    }
}

async fn a_passkey_counter_only_moves_forward_once_and_never_for_a_revoked_one(r: R) {
    let p = passkey("alice", 1);
    assert!(r.put_passkey(&p).await.unwrap());
    // The same credential again is refused (revoked or not, never reused).
    assert!(!r.put_passkey(&passkey("bob", 1)).await.unwrap());
    assert_eq!(r.passkey(&p.credential_id).await.unwrap(), Some(p.clone()));
    // An authenticator without a counter stays at 0.
    assert!(r.advance_passkey(&p.credential_id, 0).await.unwrap());
    assert!(r.advance_passkey(&p.credential_id, 5).await.unwrap());
    // The same value again (a replay) or lower (a clone) does not count.
    assert!(!r.advance_passkey(&p.credential_id, 5).await.unwrap());
    assert!(!r.advance_passkey(&p.credential_id, 4).await.unwrap());
    assert!(!r.advance_passkey(&p.credential_id, 0).await.unwrap());
    assert!(r.advance_passkey(&p.credential_id, 6).await.unwrap());
    assert!(!r.advance_passkey(&[9; 16], 100).await.unwrap());
    assert_eq!(
        r.passkey(&p.credential_id).await.unwrap().unwrap().counter,
        6
    );
    assert!(
        r.revoke_member(Roster::Approvers, "alice", 20)
            .await
            .unwrap()
    );
    assert!(!r.advance_passkey(&p.credential_id, 7).await.unwrap());
    // Racing replicas: one assertion's counter moves once.
    let q = passkey("carol", 2);
    assert!(r.put_passkey(&q).await.unwrap());
    let races: Vec<_> = (0..8)
        .map(|_| {
            let (r, id) = (r.clone(), q.credential_id.clone());
            tokio::spawn(async move { r.advance_passkey(&id, 3).await.unwrap() })
        })
        .collect();
    let mut moved = 0;
    for race in races {
        moved += usize::from(race.await.unwrap());
    }
    assert_eq!(moved, 1);
}

async fn revoking_an_approver_ends_its_desk_key_and_every_passkey_at_once(r: R) {
    let desk = Member {
        name: "alice".into(),
        key: [5; 32],
        created_at_ms: 1,
        revoked_at_ms: None,
    };
    assert!(r.put_member(Roster::Approvers, &desk).await.unwrap());
    for (name, id) in [("alice", 1), ("alice", 2), ("bob", 3)] {
        assert!(r.put_passkey(&passkey(name, id)).await.unwrap());
    }
    assert!(
        r.revoke_member(Roster::Approvers, "alice", 50)
            .await
            .unwrap()
    );
    let keys = r.passkeys().await.unwrap();
    let active: Vec<&str> = keys
        .iter()
        .filter(|p| p.is_active())
        .map(|p| p.approver.as_str())
        .collect();
    assert_eq!(active, ["bob"]);
    assert!(
        keys.iter()
            .filter(|p| p.approver == "alice")
            .all(|p| p.revoked_at_ms == Some(50))
    );
    assert!(
        !r.member(Roster::Approvers, &[5; 32])
            .await
            .unwrap()
            .unwrap()
            .is_active()
    );
    // A name with passkeys only is revoked the same way; again is "nothing to revoke".
    assert!(r.revoke_member(Roster::Approvers, "bob", 60).await.unwrap());
    assert!(!r.revoke_member(Roster::Approvers, "bob", 70).await.unwrap());
}

async fn an_invite_is_begun_and_used_once_before_it_expires(r: R) {
    let invite = Invite {
        hash: [3; 32],
        approver: "alice".into(),
        created_at_ms: 100,
        expires_at_ms: 1_000,
        ceremony: None,
        used_at_ms: None,
    };
    assert!(r.put_invite(&invite).await.unwrap());
    assert!(!r.put_invite(&invite).await.unwrap());
    // Not begun: not usable.
    assert_eq!(r.use_invite(&[3; 32], 200).await.unwrap(), None);
    assert!(r.begin_invite(&[3; 32], "ceremony one", 200).await.unwrap());
    assert!(r.begin_invite(&[3; 32], "ceremony two", 300).await.unwrap());
    assert!(!r.begin_invite(&[4; 32], "unknown", 300).await.unwrap());
    assert!(!r.begin_invite(&[3; 32], "too late", 1_000).await.unwrap());
    // Expired: not usable, and left as it was.
    assert_eq!(r.use_invite(&[3; 32], 1_000).await.unwrap(), None);
    let used = r.use_invite(&[3; 32], 400).await.unwrap().unwrap();
    assert_eq!(used.ceremony.as_deref(), Some("ceremony two"));
    assert_eq!(used.used_at_ms, Some(400));
    // Used: never again, and never begun again.
    assert_eq!(r.use_invite(&[3; 32], 401).await.unwrap(), None);
    assert!(!r.begin_invite(&[3; 32], "again", 402).await.unwrap());
    assert_eq!(
        r.invite(&[3; 32]).await.unwrap().unwrap().used_at_ms,
        Some(400)
    );
    // Racing replicas finishing one invite: one of them uses it.
    let twice = Invite {
        hash: [8; 32],
        ..invite
    };
    assert!(r.put_invite(&twice).await.unwrap());
    assert!(r.begin_invite(&[8; 32], "c", 150).await.unwrap());
    let races: Vec<_> = (0..8)
        .map(|_| {
            let r = r.clone();
            tokio::spawn(async move { r.use_invite(&[8; 32], 160).await.unwrap().is_some() })
        })
        .collect();
    let mut used = 0;
    for race in races {
        used += usize::from(race.await.unwrap());
    }
    assert_eq!(used, 1);
}

async fn a_sign_in_challenge_is_taken_once_before_it_expires(r: R) {
    r.put_challenge(&[1; 32], 1_000, 0).await.unwrap();
    r.put_challenge(&[2; 32], 500, 0).await.unwrap();
    assert!(r.take_challenge(&[1; 32], 999).await.unwrap());
    assert!(!r.take_challenge(&[1; 32], 999).await.unwrap());
    assert!(!r.take_challenge(&[2; 32], 500).await.unwrap());
    assert!(!r.take_challenge(&[9; 32], 0).await.unwrap());
}

/// A change approved as "from this text to that one" (the team server's rules) replaces only
/// the text it was shown replacing: once another change moved the record, it writes nothing.
async fn an_accepted_file_is_replaced_only_in_place_of_the_text_expected(r: R) {
    let name = "policy.cedar";
    assert!(r.replace_accepted(name, None, "a", 1).await.unwrap());
    assert!(
        !r.replace_accepted(name, None, "b", 2).await.unwrap(),
        "something is on record already"
    );
    assert!(!r.replace_accepted(name, Some("b"), "c", 3).await.unwrap());
    assert_eq!(
        r.accepted(name).await.unwrap(),
        Some(Accepted {
            text: "a".into(),
            at_ms: 1
        })
    );
    assert!(r.replace_accepted(name, Some("a"), "c", 4).await.unwrap());
    assert!(
        !r.replace_accepted(name, Some("a"), "d", 5).await.unwrap(),
        "the record moved from a to c"
    );
    assert_eq!(
        r.accepted(name).await.unwrap(),
        Some(Accepted {
            text: "c".into(),
            at_ms: 4
        })
    );
    // Another file's record is its own.
    assert!(
        !r.replace_accepted("servers.json", Some("c"), "e", 6)
            .await
            .unwrap()
    );
    assert_eq!(r.accepted("servers.json").await.unwrap(), None);
    let huge = "x".repeat(MAX_ACCEPTED_BYTES + 1);
    assert!(r.replace_accepted(name, Some("c"), &huge, 7).await.is_err());
    assert_eq!(r.accepted(name).await.unwrap().unwrap().text, "c");
}

async fn a_huge_accepted_file_is_refused_not_stored(r: R) {
    let huge = "x".repeat(MAX_ACCEPTED_BYTES + 1);
    assert!(r.accept("policy.toml", &huge, 1).await.is_err());
    assert_eq!(r.accepted("policy.toml").await.unwrap(), None);
}

// PostgreSQL only: what replicas sharing one database need beyond the suite.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn replicas_starting_at_once_on_a_new_database_all_connect() {
    for _round in 0..3 {
        let dsn = shared_database().await;
        let starts: Vec<_> = (0..12)
            .map(|_| {
                let dsn = dsn.clone();
                tokio::spawn(
                    async move { Postgres::connect(&dsn, PostgresOptions::default()).await },
                )
            })
            .collect();
        let mut replicas = Vec::new();
        for start in starts {
            replicas.push(start.await.unwrap().unwrap());
        }
        // One schema, shared: a nonce spent through one replica is spent for all.
        assert_eq!(replicas[0].spend(&nonce(1), 10).await, Ok(()));
        for replica in &replicas[1..] {
            assert_eq!(
                replica.spend(&nonce(1), 10).await,
                Err(SpendError::AlreadySpent)
            );
        }
        let admin = countersign_tests::postgres::admin(&dsn).await;
        let versions = admin
            .query("SELECT version FROM countersign_schema", &[])
            .await
            .unwrap();
        assert_eq!(
            versions.len() as i64,
            countersign_store::POSTGRES_SCHEMA_VERSION
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn a_database_with_a_newer_schema_is_refused_unchanged() {
    let dsn = migrated_database().await;
    let admin = countersign_tests::postgres::admin(&dsn).await;
    admin
        .execute(
            "INSERT INTO countersign_schema (version, purpose) VALUES (99, 'from the future')",
            &[],
        )
        .await
        .unwrap();
    let tables = "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'";
    let before: i64 = admin.query_one(tables, &[]).await.unwrap().get(0);
    match Postgres::connect(&dsn, PostgresOptions::default()).await {
        Err(StoreError::PostgresNewerSchema {
            found: 99, known, ..
        }) => {
            assert_eq!(known, countersign_store::POSTGRES_SCHEMA_VERSION)
        }
        other => panic!("expected PostgresNewerSchema, got {other:?}"),
    }
    let after: i64 = admin.query_one(tables, &[]).await.unwrap().get(0);
    assert_eq!(before, after);
    let newest: i64 = admin
        .query_one("SELECT max(version) FROM countersign_schema", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(newest, 99);
}

/// `n` events (`event_of` each number) recorded all at once, alternately through `a` and `b`:
/// each number with how its record went.
async fn record_alternately(
    a: &R,
    b: &R,
    n: u64,
    event_of: fn(u64) -> countersign_core::telemetry::ConfirmEvent,
) -> Vec<(u64, Result<(), StoreError>)> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let r = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move { (i, r.record(&event_of(i)).await) })
        })
        .collect();
    let mut recorded = Vec::with_capacity(tasks.len());
    for task in tasks {
        recorded.push(task.await.unwrap());
    }
    recorded
}

/// Two replicas' records on the database `dsn`, having written `n` events at once, alternately:
/// every third a confirm's acceptance, written with its spend (`spend_recording`), the others
/// recorded alone.
async fn two_replicas_chain(dsn: &str, n: u64) -> (R, R) {
    let (a, b) = (replica(dsn).await, replica(dsn).await);
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let r = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                let at = 100 + i;
                let written = match u8::try_from(i) {
                    Ok(n) if i % 3 == 0 => r
                        .spend_recording(&nonce(n), u64::MAX, &accepted(n, at))
                        .await
                        .expect("a nonce of its own spends"),
                    _ => r.record(&event(at, EventKind::Accepted)).await,
                };
                (i, written)
            })
        })
        .collect();
    for task in tasks {
        let (i, written) = task.await.unwrap();
        assert!(written.is_ok(), "event {i}: {written:?}");
    }
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn replicas_confirming_one_nonce_at_once_spend_it_once_and_keep_one_chain() {
    let dsn = migrated_database().await;
    let replicas = [
        replica(&dsn).await,
        replica(&dsn).await,
        replica(&dsn).await,
        replica(&dsn).await,
    ];
    // Each replica: eight confirms of one nonce and eight of nonces of their own, at once.
    let tasks: Vec<_> = (0..64_u8)
        .map(|i| {
            let r = replicas[usize::from(i % 4)].clone();
            let n = if i % 2 == 0 { 1 } else { 100 + i };
            tokio::spawn(async move {
                (
                    n,
                    r.spend_recording(&nonce(n), u64::MAX, &accepted(n, 1_000 + u64::from(i)))
                        .await,
                )
            })
        })
        .collect();
    let mut of_one = Vec::new();
    for task in tasks {
        let (n, outcome) = task.await.unwrap();
        let spent = spent(outcome);
        if n == 1 {
            of_one.push(spent);
        } else {
            assert_eq!(spent, Ok(()), "nonce {n}: a nonce of its own spends");
        }
    }
    assert_spent_once(&of_one);
    let key = Some(chain_key().public());
    let intact = replicas[3]
        .verify_history(Walk::new(key))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((intact.first, intact.last), (Some(1), Some(33)));
    let admin = countersign_tests::postgres::admin(&dsn).await;
    let counted = |sql: &'static str| {
        let admin = &admin;
        async move { admin.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) }
    };
    assert_eq!(counted("SELECT count(*) FROM spent_nonce").await, 33);
    assert_eq!(
        counted("SELECT count(*) FROM history WHERE nonce IS NOT NULL").await,
        33,
        "each spent nonce's acceptance is written once, a replay's never"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn two_replicas_write_one_chain_and_an_edit_or_a_cut_of_it_is_named() {
    let dsn = migrated_database().await;
    let (a, b) = two_replicas_chain(&dsn, 30).await;
    let key = Some(chain_key().public());
    let intact = b.verify_history(Walk::new(key)).await.unwrap().unwrap();
    assert_eq!((intact.first, intact.last), (Some(1), Some(30)));
    let admin = countersign_tests::postgres::admin(&dsn).await;
    admin
        .execute(
            "UPDATE history SET tenant = 'someone-else' WHERE seq = 17",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        a.verify_history(Walk::new(key)).await.unwrap(),
        Err(Break::Edited { seq: 17 })
    );
    admin
        .execute("DELETE FROM history WHERE seq >= 17", &[])
        .await
        .unwrap();
    assert_eq!(
        a.verify_history(Walk::new(key)).await.unwrap(),
        Err(Break::TailCut { last: 16, head: 30 })
    );
}

/// The chain's tamper tests on PostgreSQL, after two replicas wrote it at once (pipelined
/// statements, one lock on the tip): a row deleted, two rows' places swapped, a forged head, each
/// named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn on_postgresql_a_deletion_a_reordering_and_a_forged_head_are_each_named() {
    let key = Some(chain_key().public());
    for tamper in ["delete", "reorder", "forge"] {
        let dsn = migrated_database().await;
        let (a, b) = two_replicas_chain(&dsn, 12).await;
        let intact = a.verify_history(Walk::new(key)).await.unwrap().unwrap();
        assert_eq!((intact.first, intact.last), (Some(1), Some(12)), "{tamper}");
        let admin = countersign_tests::postgres::admin(&dsn).await;
        let sql = match tamper {
            "delete" => "DELETE FROM history WHERE seq = 5",
            // Rows 3 and 4 trade places in the order (their numbers swapped).
            "reorder" => {
                "UPDATE history SET seq = 1000000 WHERE seq = 3;
                 UPDATE history SET seq = 3 WHERE seq = 4;
                 UPDATE history SET seq = 4 WHERE seq = 1000000;"
            }
            _ => {
                "UPDATE history_head SET signature = decode(repeat('00', 64), 'hex') \
                  WHERE role = 'head'"
            }
        };
        admin.batch_execute(sql).await.unwrap();
        let broken = b.verify_history(Walk::new(key)).await.unwrap();
        match tamper {
            "delete" => assert_eq!(broken, Err(Break::Missing { from: 5, to: 5 })),
            "reorder" => assert!(
                matches!(
                    broken,
                    Err(Break::Edited { seq: 3 | 4 }
                        | Break::Unlinked { .. }
                        | Break::Reordered { .. })
                ),
                "{broken:?}"
            ),
            _ => assert_eq!(broken, Err(Break::ForgedHead { seq: 12 })),
        }
    }
}

/// Each replica appends the events waiting together (one transaction, one signed head): 600
/// events from two replicas at once make one intact chain holding every good event exactly once,
/// and the two bad ones fail alone: one whose time is beyond the store's range (refused before any
/// batch), one the database refuses (a check of the test's own, which fails its batch's statement:
/// the rest of that batch is appended again, an event at a time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn events_appended_together_by_two_replicas_are_each_in_the_chain_once_and_a_bad_one_fails_alone()
 {
    let dsn = migrated_database().await;
    let admin = countersign_tests::postgres::admin(&dsn).await;
    admin
        .batch_execute(
            "ALTER TABLE history ADD CONSTRAINT refused_by_the_test \
             CHECK (note IS DISTINCT FROM 'refused by the test')",
        )
        .await
        .unwrap();
    let (a, b) = (replica(&dsn).await, replica(&dsn).await);
    let event_of = |i: u64| {
        let mut e = event(100 + i, EventKind::Accepted);
        e.note = Some(format!("event {i}"));
        match i {
            // Beyond BIGINT: refused by the columns, before any batch.
            301 => e.at_ms = u64::MAX,
            // Refused by the database, inside whatever batch it is in.
            444 => e.note = Some("refused by the test".into()),
            _ => {}
        }
        e
    };
    for (i, recorded) in record_alternately(&a, &b, 600, event_of).await {
        match i {
            301 => assert!(
                matches!(recorded, Err(StoreError::TimeOutOfRange(_))),
                "{recorded:?}"
            ),
            444 => assert!(
                matches!(&recorded, Err(StoreError::Postgres(e))
                    if e.code() == Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION)),
                "{recorded:?}"
            ),
            _ => assert!(recorded.is_ok(), "event {i}: {recorded:?}"),
        }
    }
    let key = Some(chain_key().public());
    let intact = a.verify_history(Walk::new(key)).await.unwrap().unwrap();
    assert_eq!((intact.first, intact.last), (Some(1), Some(598)));
    let row = admin
        .query_one(
            "SELECT count(*), count(DISTINCT note),
                    count(*) FILTER (WHERE note IN ('event 301', 'event 444'))
             FROM history",
            &[],
        )
        .await
        .unwrap();
    let counted: (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(counted, (598, 598, 0));
}

/// Records without a key to sign the head (a server that has none) still number and link every
/// event, and sign no head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn without_a_key_the_events_are_numbered_and_no_head_is_signed() {
    let dsn = migrated_database().await;
    let r: R = Arc::new(
        Postgres::connect(&dsn, PostgresOptions::default())
            .await
            .unwrap(),
    );
    for (i, recorded) in
        record_alternately(&r, &r, 20, |i| event(100 + i, EventKind::Accepted)).await
    {
        assert!(recorded.is_ok(), "event {i}: {recorded:?}");
    }
    // Nothing signed, so nothing to prove the chain's end against: said so, never "intact".
    assert_eq!(
        r.verify_history(Walk::new(None)).await.unwrap(),
        Err(Break::NoHead)
    );
    let admin = countersign_tests::postgres::admin(&dsn).await;
    let row = admin
        .query_one(
            "SELECT count(DISTINCT seq), min(seq), max(seq),
                    (SELECT count(*) FROM history_head) FROM history",
            &[],
        )
        .await
        .unwrap();
    let chained: (i64, i64, i64, i64) = (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!(chained, (20, 1, 20, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_unavailable_and_its_password_never_printed() {
    // A port nobody listens on: the DSN's password must appear in neither the error's text nor
    // its Debug.
    let dsn = "host=127.0.0.1 port=1 user=serve password=hunter2-secret dbname=ledger";
    let err = Postgres::connect(
        dsn,
        PostgresOptions::default().with_connect_timeout(std::time::Duration::from_secs(2)),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, StoreError::PostgresUnavailable { .. }),
        "{err:?}"
    );
    assert!(!err.to_string().contains("hunter2"), "{err}");
    assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
    assert!(
        err.to_string().contains("serve@127.0.0.1:1/ledger"),
        "{err}"
    );
}

fn waiting_call(replica: &str, local_id: u64, expires_at_ms: u64) -> WaitingCall {
    WaitingCall {
        id: 0,
        replica: replica.into(),
        local_id,
        server: "https://approvers.example.com".into(),
        tenant: "key:ci@server:db".into(),
        plan: PlanHash::from_bytes([local_id as u8; 32]),
        request: format!("{{\"id\":{local_id}}}"),
        approvers: 2,
        arrived_at_ms: 1_000,
        expires_at_ms,
        verdict: None,
        note: None,
        minted_by: None,
    }
}

/// The number of a row that sharing a call wrote; any other outcome fails the test.
fn new_row(shared: SharedRow) -> u64 {
    match shared {
        SharedRow::New(id) => id,
        joined => panic!("a new row was expected: {joined:?}"),
    }
}

/// What sharing a call joined; any other outcome fails the test.
fn joined(shared: SharedRow) -> WaitingCall {
    match shared {
        SharedRow::Joined(row) => *row,
        new => panic!("the call's row was expected to be joined: {new:?}"),
    }
}

async fn a_waiting_call_is_seen_until_decided_once_or_expired_and_its_replica_reads_the_verdict(
    r: R,
) {
    let server = "https://approvers.example.com";
    let share = |call: WaitingCall| {
        let r = r.clone();
        async move { r.share_waiting(&call, 0).await }
    };
    let a = new_row(share(waiting_call("a", 1, 10_000)).await.unwrap());
    let b = new_row(share(waiting_call("b", 2, 10_000)).await.unwrap());
    let c = new_row(share(waiting_call("a", 3, 5_000)).await.unwrap());
    assert!(a != b && b != c && a != c);
    // The same call of the same replica shared again: its row again. Another call under the
    // same replica's number: refused.
    assert_eq!(
        share(waiting_call("a", 1, 10_000)).await.unwrap(),
        SharedRow::New(a)
    );
    let another = WaitingCall {
        plan: PlanHash::from_bytes([7; 32]),
        ..waiting_call("a", 1, 10_000)
    };
    assert!(share(another).await.is_err());
    let ids = |calls: Vec<WaitingCall>| calls.iter().map(|w| w.id).collect::<Vec<_>>();
    assert_eq!(
        ids(r.waiting_calls(server, 6_000).await.unwrap()),
        [a, b],
        "the expired one is not seen"
    );
    assert!(
        r.waiting_calls("https://other", 0)
            .await
            .unwrap()
            .is_empty()
    );
    let read = r.waiting_call(a).await.unwrap().unwrap();
    assert_eq!(
        read,
        WaitingCall {
            id: a,
            ..waiting_call("a", 1, 10_000)
        }
    );
    // Several read at once (a replica carrying out decisions): those on record, by number.
    let together = r.waiting_calls_by_id(&[c, 9_999, a]).await.unwrap();
    assert_eq!(ids(together.clone()), [a, c]);
    assert_eq!(together[0], read);
    assert!(r.waiting_calls_by_id(&[]).await.unwrap().is_empty());
    // The first verdict stands, and keeps the call on record until the time given.
    assert!(
        r.decide_waiting(a, Verdict::Deny, Some("no"), 30_000)
            .await
            .unwrap()
    );
    assert!(
        !r.decide_waiting(a, Verdict::Approve, None, 30_000)
            .await
            .unwrap()
    );
    assert!(
        !r.decide_waiting(9_999, Verdict::Approve, None, 30_000)
            .await
            .unwrap()
    );
    let decided = r.waiting_call(a).await.unwrap().unwrap();
    assert_eq!(
        (
            decided.verdict,
            decided.note.as_deref(),
            decided.expires_at_ms
        ),
        (Some(Verdict::Deny), Some("no"), 30_000)
    );
    assert_eq!(ids(r.waiting_calls(server, 6_000).await.unwrap()), [b]);
    // An approved call's token is minted by one replica: the first to claim it.
    assert!(!r.claim_mint(b, "c").await.unwrap(), "not approved yet");
    assert!(
        r.decide_waiting(b, Verdict::Approve, None, 40_000)
            .await
            .unwrap()
    );
    assert!(r.claim_mint(b, "c").await.unwrap());
    assert!(!r.claim_mint(b, "b").await.unwrap(), "one replica mints");
    let claimed = r.waiting_call(b).await.unwrap().unwrap();
    assert_eq!(claimed.minted_by.as_deref(), Some("c"));
    // A living replica keeps its undecided rows in sight; the row of a call that left goes, and
    // so does one forgotten.
    r.refresh_waiting("a", 20_000).await.unwrap();
    assert_eq!(ids(r.waiting_calls(server, 15_000).await.unwrap()), [c]);
    r.remove_waiting("a", 1).await.unwrap();
    assert_eq!(r.waiting_call(a).await.unwrap(), None);
    r.forget_waiting(c).await.unwrap();
    assert_eq!(r.waiting_call(c).await.unwrap(), None);
    // Out of sight long enough: pruned (a's was removed, c's forgotten; b's record lasts to 40 s).
    assert_eq!(r.prune_waiting(40_000).await.unwrap(), 0);
    assert_eq!(r.prune_waiting(40_001).await.unwrap(), 1);
    assert_eq!(r.waiting_call(b).await.unwrap(), None);
    // Approvals are counted by distinct approver over the same request and plan.
    let plan = PlanHash::from_bytes([2; 32]);
    let mut d = decision_record(b, Verdict::Approve);
    d.server = server.into();
    d.plan = plan;
    r.put_decision(&d).await.unwrap();
    r.put_decision(&d).await.unwrap();
    let by = |name: &str| DecisionRecord {
        approver: name.into(),
        ..d.clone()
    };
    r.put_decision(&by("bob")).await.unwrap();
    r.put_decision(&DecisionRecord {
        verdict: Verdict::Deny,
        ..by("carol")
    })
    .await
    .unwrap();
    r.put_decision(&DecisionRecord {
        plan: PlanHash::from_bytes([9; 32]),
        ..by("dave")
    })
    .await
    .unwrap();
    assert_eq!(
        r.approved_by(server, b, &plan).await.unwrap(),
        ["alice", "bob"]
    );
}

/// One call (server, tenant, plan) has one row to join: an agent asking again on another
/// replica, or a second replica proposing the same rules change, is linked to it and keeps it in
/// sight, never given a second row whose approvals would count apart. A denied or minted call,
/// or one that left desks' sight before the adoption window, is not joined: the call asked
/// again is a new one.
async fn a_call_shared_again_joins_its_one_row_until_denied_minted_or_long_lapsed(r: R) {
    let server = "https://approvers.example.com";
    let call = |replica: &str, local_id: u64, expires_at_ms: u64| WaitingCall {
        plan: PlanHash::from_bytes([1; 32]),
        ..waiting_call(replica, local_id, expires_at_ms)
    };
    let share = |call: WaitingCall, adopt_since: u64| {
        let r = r.clone();
        async move { r.share_waiting(&call, adopt_since).await.unwrap() }
    };
    // A's call; B's agent asks again there: B joins A's row and keeps it in sight longer.
    let a = new_row(share(call("a", 1, 10_000), 0).await);
    let row = joined(share(call("b", 1, 15_000), 0).await);
    assert_eq!((row.id, row.replica.as_str(), row.local_id), (a, "a", 1));
    assert_eq!(row.expires_at_ms, 15_000, "kept in sight until B's expiry");
    let row = joined(share(call("c", 1, 12_000), 0).await);
    assert_eq!(
        row.expires_at_ms, 15_000,
        "an earlier expiry shortens nothing"
    );
    assert_eq!(r.waiting_calls(server, 0).await.unwrap().len(), 1);
    // The same plan from another tenant, or on another server: rows of their own.
    let other_tenant = WaitingCall {
        tenant: "key:other@server:db".into(),
        ..call("d", 1, 10_000)
    };
    let other_server = WaitingCall {
        server: "https://elsewhere.example.com".into(),
        ..call("e", 1, 10_000)
    };
    let t = new_row(share(other_tenant, 0).await);
    let s = new_row(share(other_server, 0).await);
    assert!(t != a && s != a && t != s);
    // Lapsed within the adoption window: joined, and back in sight.
    let row = joined(share(call("f", 1, 20_000), 14_999).await);
    assert_eq!((row.id, row.expires_at_ms), (a, 20_000));
    // Lapsed before it: a new row, and the old one is never joined again.
    let fresh = new_row(share(call("g", 1, 30_000), 20_000).await);
    assert_ne!(fresh, a);
    assert_eq!(joined(share(call("h", 1, 30_000), 0).await).id, fresh);
    // Denied: not joined; the call asked again is a new one.
    assert!(
        r.decide_waiting(fresh, Verdict::Deny, None, 31_000)
            .await
            .unwrap()
    );
    let next = new_row(share(call("i", 1, 40_000), 0).await);
    assert!(next != fresh && next != a);
    // Approved with no token minted yet: joined, and the verdict's expiry stays.
    assert!(
        r.decide_waiting(next, Verdict::Approve, None, 45_000)
            .await
            .unwrap()
    );
    let row = joined(share(call("j", 1, 50_000), 0).await);
    assert_eq!((row.id, row.expires_at_ms), (next, 45_000));
    assert_eq!(row.verdict, Some(Verdict::Approve));
    // Minted: not joined.
    assert!(r.claim_mint(next, "j").await.unwrap());
    let last = new_row(share(call("k", 1, 50_000), 0).await);
    assert!(last != next && last != fresh && last != a);
}

/// Replicas sharing one call at the same moment (two replicas seeing one edited rules file) get
/// one row between them: one writes it, every other joins it, and desks see it once. Only the
/// PostgreSQL half races (its pool runs the twelve at once); the SQLite half runs them one after
/// another behind the store's lock, and checks the same outcome.
async fn replicas_sharing_one_call_at_once_meet_on_one_row(r: R) {
    let server = "https://approvers.example.com";
    for round in 0..8u8 {
        let tasks: Vec<_> = (0..12)
            .map(|replica| {
                let r = r.clone();
                let call = WaitingCall {
                    plan: PlanHash::from_bytes([100 + round; 32]),
                    ..waiting_call(&format!("replica-{replica}"), u64::from(round), 10_000)
                };
                tokio::spawn(async move { r.share_waiting(&call, 0).await.unwrap() })
            })
            .collect();
        let mut written = Vec::new();
        let mut rows = Vec::new();
        for task in tasks {
            match task.await.unwrap() {
                SharedRow::New(id) => written.push(id),
                SharedRow::Joined(row) => rows.push(row.id),
            }
        }
        assert_eq!(
            written.len(),
            1,
            "round {round}: one replica writes the row"
        );
        assert!(
            rows.iter().all(|id| *id == written[0]),
            "round {round}: every other joins it: {rows:?} against {written:?}"
        );
    }
    assert_eq!(
        r.waiting_calls(server, 0).await.unwrap().len(),
        8,
        "one row a call"
    );
}

/// Issue 29: a call asked again on replica B after replica A (which wrote its row) died is kept
/// in desks' sight by B, by its number; a row whose verdict is in keeps the expiry the verdict
/// gave it; a row nobody keeps lapses.
async fn a_row_stays_in_sight_while_any_replica_keeps_it_and_a_decided_one_is_not_moved(r: R) {
    let server = "https://approvers.example.com";
    let ids = |rows: Vec<WaitingCall>| rows.into_iter().map(|w| w.id).collect::<Vec<_>>();
    // Written by A, which then dies: nobody refreshes its rows by name any more.
    let share = |call: WaitingCall| {
        let r = r.clone();
        async move { new_row(r.share_waiting(&call, 0).await.unwrap()) }
    };
    let held = share(waiting_call("a", 1, 10_000)).await;
    let lapsing = share(waiting_call("a", 2, 10_000)).await;
    let decided = share(waiting_call("a", 3, 10_000)).await;
    assert!(
        r.decide_waiting(decided, Verdict::Approve, None, 12_000)
            .await
            .unwrap()
    );
    // B holds the first call (its agent asked again there) and keeps it, even after it lapsed.
    assert!(ids(r.waiting_calls(server, 11_000).await.unwrap()).is_empty());
    r.keep_waiting(&[held, decided, 9_999], 25_000)
        .await
        .unwrap();
    assert_eq!(ids(r.waiting_calls(server, 20_000).await.unwrap()), [held]);
    assert_eq!(
        r.waiting_call(lapsing)
            .await
            .unwrap()
            .unwrap()
            .expires_at_ms,
        10_000
    );
    assert_eq!(
        r.waiting_call(decided)
            .await
            .unwrap()
            .unwrap()
            .expires_at_ms,
        12_000,
        "a decided row keeps the expiry its verdict set"
    );
    r.keep_waiting(&[], 30_000).await.unwrap();
    assert!(ids(r.waiting_calls(server, 26_000).await.unwrap()).is_empty());
}
