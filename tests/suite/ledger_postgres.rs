//! The PostgreSQL ledger under races and faults, with real processes and a real server.
//!
//! What `serve` promises: a nonce presented by many replicas at once spends once; a spend the
//! ledger cannot vouch for is refused (`Unreachable`, nothing runs); a refusal whose outcome is
//! unknown can only ever be followed by "already used", through this replica or any other; and a
//! refusal where nothing was sent leaves the approval spendable once the server is back. Faults
//! that stop, freeze or cut the server use a private server of the test's own (the shared one
//! serves every other test running at the same moment). All need `.ci/with-postgres`.
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

use std::time::{Duration, Instant};

use countersign_core::SpendError;
use countersign_core::chain::{ChainKey, Walk};
use countersign_store::test_support::{accepted, approval, nonce, spent, unreachable};
use countersign_store::{Postgres, PostgresOptions, Records, SERIALIZATION_RETRIES, StoreError};
use countersign_tests::postgres::{
    FaultProxy, PrivateServer, admin, fresh_database, migrated_database,
};
use countersign_tests::{Spend, assert_ready, spawn_group};

const CHILD: &str = env!("CARGO_BIN_EXE_ledger_child");
const PROCESSES: usize = 64;
const EXPIRES_AT_MS: u64 = 4_000_000_000_000;

/// Options for fault tests: short timeouts, so a refusal comes quickly.
fn short(application_name: &str) -> PostgresOptions {
    PostgresOptions::default()
        .with_statement_timeout(Duration::from_secs(1))
        .with_connect_timeout(Duration::from_secs(2))
        .with_pool_size(1)
        .with_application_name(application_name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn sixty_four_processes_spending_one_nonce_on_postgres_spend_it_once() {
    // The schema exists before the children start: the race is on the spend alone.
    let dsn = migrated_database().await;
    for round in 0..3u8 {
        let started = Instant::now();
        let hex = nonce(round).to_hex();
        let (mut release, children) =
            spawn_group(CHILD, &["postgres-spend", &dsn, &hex], &[], PROCESSES);
        assert_ready(&children);
        release.release();
        let (mut ok, mut already_spent, mut slowest) = (0, 0, 0);
        for child in children.into_iter().map(|c| c.finish()) {
            assert!(child.status.success(), "a child failed: {child:?}");
            let outcome = child.outcome().expect("an outcome");
            match outcome.spend {
                Spend::Ok => ok += 1,
                Spend::AlreadySpent => already_spent += 1,
                Spend::Unreachable | Spend::OpenError => {
                    panic!(
                        "round {round}: a child was refused: {outcome:?}\n{}",
                        child.stderr
                    )
                }
            }
            slowest = slowest.max(outcome.micros);
        }
        eprintln!(
            "round {round}: {ok} ok, {already_spent} already spent, slowest spend {:.1} ms, \
             round {} ms",
            slowest as f64 / 1000.0,
            started.elapsed().as_millis()
        );
        assert_eq!(ok, 1, "round {round}: exactly one spend succeeds");
        assert_eq!(
            already_spent,
            PROCESSES - 1,
            "round {round}: the rest are replays"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn a_server_stopped_before_the_spend_is_unreachable_and_the_nonce_spends_once_it_is_back() {
    let server = PrivateServer::start();
    let dsn = fresh_database(&server.dsn()).await;
    let records = Postgres::connect(&dsn, short("countersign-stopped"))
        .await
        .unwrap();
    records
        .put_approval(&approval(1, EXPIRES_AT_MS))
        .await
        .unwrap();

    server.stop_immediately();
    let reason = unreachable(records.spend(&nonce(1), EXPIRES_AT_MS).await);
    eprintln!("server stopped: {reason}");
    assert_eq!(records.doubtful_count(), 0, "nothing was sent: no doubt");
    assert!(matches!(
        records.approval(&nonce(1)).await,
        Err(StoreError::PostgresUnavailable { .. })
    ));

    server.start_again();
    // It never reached the database: the same approval spends, once.
    assert_eq!(records.spend(&nonce(1), EXPIRES_AT_MS).await, Ok(()));
    assert_eq!(
        records.spend(&nonce(1), EXPIRES_AT_MS).await,
        Err(SpendError::AlreadySpent)
    );
    assert_eq!(
        records.approval(&nonce(1)).await.unwrap(),
        Some(approval(1, EXPIRES_AT_MS))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn a_connection_cut_after_the_insert_was_sent_is_unreachable_then_already_spent_everywhere() {
    let server = PrivateServer::start();
    let direct = fresh_database(&server.dsn()).await;
    let proxy = FaultProxy::start(server.port(), b"spent_nonce").await;
    let proxied = direct.replace(
        &format!("port={}", server.port()),
        &format!("port={}", proxy.port()),
    );
    let records = Postgres::connect(&proxied, short("countersign-cut"))
        .await
        .unwrap();

    proxy.arm();
    let reason = unreachable(records.spend(&nonce(1), EXPIRES_AT_MS).await);
    eprintln!("connection cut: {reason}");
    assert_eq!(proxy.cuts(), 1);
    assert_eq!(records.doubtful_count(), 1, "the outcome is unknown: doubt");

    // The proxy forwards again. Through the same value, the doubtful nonce is refused as used,
    // and burned in the database on the way.
    assert_eq!(
        records.spend(&nonce(1), EXPIRES_AT_MS).await,
        Err(SpendError::AlreadySpent)
    );
    assert_eq!(records.doubtful_count(), 0, "burned");
    assert_eq!(records.spend(&nonce(2), EXPIRES_AT_MS).await, Ok(()));
    // Through another replica (a fresh value, straight to the server): already used too.
    let other = Postgres::connect(&direct, short("countersign-other"))
        .await
        .unwrap();
    assert_eq!(
        other.spend(&nonce(1), EXPIRES_AT_MS).await,
        Err(SpendError::AlreadySpent)
    );
}

/// A database whose `spent_nonce` inserts fail with a serialization failure the first
/// `failures` times (a trigger of the test's own; the product's schema has no functions).
async fn failing_the_first(failures: u32) -> (String, tokio_postgres::Client) {
    let dsn = migrated_database().await;
    let admin = admin(&dsn).await;
    admin
        .batch_execute(&format!(
            "CREATE SEQUENCE injected_failures;
             CREATE FUNCTION fail_first() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF nextval('injected_failures') <= {failures} THEN
                     RAISE EXCEPTION 'injected serialization failure' USING ERRCODE = '40001';
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER fail_first BEFORE INSERT ON spent_nonce
                 FOR EACH ROW EXECUTE FUNCTION fail_first();"
        ))
        .await
        .unwrap();
    (dsn, admin)
}

async fn rows_of(admin: &tokio_postgres::Client, n: u8) -> i64 {
    admin
        .query_one(
            "SELECT count(*) FROM spent_nonce WHERE nonce = $1",
            &[&&nonce(n).as_bytes()[..]],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn serialization_failures_up_to_the_retry_bound_are_retried_and_spend_once() {
    let (dsn, admin) = failing_the_first(SERIALIZATION_RETRIES).await;
    let records = Postgres::connect(&dsn, PostgresOptions::default())
        .await
        .unwrap();
    assert_eq!(records.spend(&nonce(1), EXPIRES_AT_MS).await, Ok(()));
    assert_eq!(
        records.spend(&nonce(1), EXPIRES_AT_MS).await,
        Err(SpendError::AlreadySpent)
    );
    assert_eq!(rows_of(&admin, 1).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn serialization_failures_past_the_retry_bound_are_unreachable_and_spend_nothing() {
    let (dsn, admin) = failing_the_first(SERIALIZATION_RETRIES + 1).await;
    let records = Postgres::connect(&dsn, PostgresOptions::default())
        .await
        .unwrap();
    let reason = unreachable(records.spend(&nonce(1), EXPIRES_AT_MS).await);
    assert!(reason.contains("40001"), "{reason}");
    assert!(
        reason.contains(&format!("(after {SERIALIZATION_RETRIES} retries)")),
        "{reason}"
    );
    assert_eq!(records.doubtful_count(), 0, "the server said no: no doubt");
    assert_eq!(rows_of(&admin, 1).await, 0);
    admin
        .batch_execute("DROP TRIGGER fail_first ON spent_nonce")
        .await
        .unwrap();
    assert_eq!(records.spend(&nonce(1), EXPIRES_AT_MS).await, Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn a_frozen_backend_times_out_as_unreachable_and_the_nonce_is_then_already_spent() {
    let server = PrivateServer::start();
    let dsn = fresh_database(&server.dsn()).await;
    let timeout = Duration::from_secs(1);
    let records = Postgres::connect(&dsn, short("countersign-frozen"))
        .await
        .unwrap();
    // The pool's one connection is open; find its backend.
    assert_eq!(records.approval(&nonce(1)).await.unwrap(), None);
    let backends = backends_of(&server, "countersign-frozen").await;
    assert_eq!(backends.len(), 1, "{backends:?}");

    let frozen = Frozen::stop(&backends);
    let started = Instant::now();
    let result = records.spend(&nonce(1), EXPIRES_AT_MS).await;
    let waited = started.elapsed();
    frozen.go_on();
    let reason = unreachable(result);
    eprintln!("frozen backend: refused after {waited:?}: {reason}");
    assert!(waited >= timeout, "gave up after only {waited:?}");
    assert!(
        waited < timeout + Duration::from_millis(500),
        "waited {waited:?} with a {timeout:?} statement timeout"
    );
    assert_eq!(records.doubtful_count(), 1);

    assert_eq!(
        records.spend(&nonce(1), EXPIRES_AT_MS).await,
        Err(SpendError::AlreadySpent)
    );
    let other = Postgres::connect(&dsn, short("countersign-other"))
        .await
        .unwrap();
    assert_eq!(
        other.spend(&nonce(1), EXPIRES_AT_MS).await,
        Err(SpendError::AlreadySpent)
    );
    assert_eq!(other.spend(&nonce(2), EXPIRES_AT_MS).await, Ok(()));
}

// A works-once confirm's spend and its acceptance's history event, written together
// (`Records::spend_recording`): the same rules as the spend alone, and the event never without it.

/// The confirm of `nonce(n)` through `records`: its acceptance written with its spend, as a
/// spend's outcome (a spent one's event must have been written).
async fn confirm(records: &Postgres, n: u8) -> Result<(), SpendError> {
    spent(
        records
            .spend_recording(&nonce(n), EXPIRES_AT_MS, &accepted(n, 1_000 + u64::from(n)))
            .await,
    )
}

async fn events_of(admin: &tokio_postgres::Client, n: u8) -> i64 {
    admin
        .query_one(
            "SELECT count(*) FROM history WHERE nonce = $1",
            &[&nonce(n).to_hex()],
        )
        .await
        .unwrap()
        .get(0)
}

/// How the proxy fails a confirm's connection once its spend and event were sent.
#[derive(Clone, Copy)]
enum Failing {
    /// Both sides closed before the answer comes back.
    Cut,
    /// Kept open and silent: the answer never comes.
    Stall,
}

/// A replica behind a [`FaultProxy`] confirms `nonce(1)`, then `nonce(2)` with `failing` armed
/// on that confirm's row: it is refused as unreachable, its nonce held doubtful, its spend and
/// event committed together or not at all, and the nonce is then only ever already used.
/// Answers how long the refused confirm took.
async fn a_confirm_failed_once_sent(failing: Failing) -> Duration {
    let server = PrivateServer::start();
    let direct = fresh_database(&server.dsn()).await;
    // The event's row names the nonce in hex: the proxy acts once the row (and, in the same
    // write or not, the COMMIT) has gone to the server, before its answer comes back.
    let needle: &'static [u8] = Box::leak(nonce(2).to_hex().into_bytes().into_boxed_slice());
    let proxy = FaultProxy::start(server.port(), needle).await;
    let proxied = direct.replace(
        &format!("port={}", server.port()),
        &format!("port={}", proxy.port()),
    );
    // Signing its head, so that the chain can be checked whole afterwards.
    let key = std::sync::Arc::new(ChainKey::from_seed(&[3; 32]));
    let signing = |name| short(name).with_chain_key(key.clone());
    let records = Postgres::connect(&proxied, signing("countersign-failed-confirm"))
        .await
        .unwrap();
    // A first confirm, before the proxy is armed: the fault comes at the second one's write.
    assert_eq!(confirm(&records, 1).await, Ok(()));

    match failing {
        Failing::Cut => proxy.arm(),
        Failing::Stall => proxy.arm_stalling(),
    }
    let started = Instant::now();
    let result = confirm(&records, 2).await;
    let waited = started.elapsed();
    let reason = unreachable(result);
    eprintln!("connection failed once sent: refused after {waited:?}: {reason}");
    assert_eq!(proxy.cuts(), 1);
    assert_eq!(records.doubtful_count(), 1, "the outcome is unknown: doubt");
    let admin = admin(&direct).await;
    let (rows, events) = (rows_of(&admin, 2).await, events_of(&admin, 2).await);
    eprintln!("after it: {rows} spent row(s), {events} event(s)");
    assert_eq!(
        rows, events,
        "the spend and its event commit together or not at all"
    );

    proxy.disarm();
    only_ever_already_used(&records, 2, &direct, signing("countersign-other"), &key).await;
    waited
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn a_confirm_cut_once_its_spend_and_event_were_sent_is_unreachable_then_already_spent_everywhere()
 {
    a_confirm_failed_once_sent(Failing::Cut).await;
}

/// The backends of the connections `application_name` has open on `server`.
async fn backends_of(server: &PrivateServer, application_name: &str) -> Vec<i32> {
    admin(&server.dsn())
        .await
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
            &[&application_name],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Backends of the test's own private server stopped (`SIGSTOP`) while this is held, and
/// continued (`SIGCONT`) when it is dropped, also when the test fails on the way: a backend left
/// stopped would hold the server's shutdown.
struct Frozen(Vec<i32>);

impl Frozen {
    fn stop(backends: &[i32]) -> Frozen {
        let frozen = Frozen(backends.to_vec());
        assert!(
            signal(backends, libc::SIGSTOP),
            "a backend could not be stopped"
        );
        frozen
    }

    /// Continues them now, asserting that each was.
    fn go_on(mut self) {
        let backends = std::mem::take(&mut self.0);
        assert!(
            signal(&backends, libc::SIGCONT),
            "a backend could not be continued"
        );
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // Not an assertion: this may run while a failure unwinds.
        if !signal(&self.0, libc::SIGCONT) {
            eprintln!("a stopped backend could not be continued: {:?}", self.0);
        }
    }
}

/// Sends `signal` to each of `backends`: whether every one was sent.
fn signal(backends: &[i32], signal: libc::c_int) -> bool {
    backends.iter().fold(true, |all, &backend| {
        // SAFETY: signals to a PostgreSQL backend process of the test's own private server.
        let sent = unsafe { libc::kill(backend, signal) } == 0;
        all && sent
    })
}

/// After a confirm of `nonce(n)` through `records` whose outcome was not known: through the
/// same records it is burned (refused as already used, no longer doubtful, one spent row, and no
/// event for the replay); through another replica on `dsn` (with `others`) it is already used,
/// a new nonce still spends, and the history verifies under `key`.
async fn only_ever_already_used(
    records: &Postgres,
    n: u8,
    dsn: &str,
    others: PostgresOptions,
    key: &ChainKey,
) {
    let admin = admin(dsn).await;
    let events = events_of(&admin, n).await;
    assert_eq!(
        confirm(records, n).await,
        Err(SpendError::AlreadySpent),
        "burned, not spent again"
    );
    assert_eq!(records.doubtful_count(), 0, "burned");
    assert_eq!(rows_of(&admin, n).await, 1);
    assert_eq!(
        events_of(&admin, n).await,
        events,
        "a replay writes no event"
    );
    let other = Postgres::connect(dsn, others).await.unwrap();
    assert_eq!(confirm(&other, n).await, Err(SpendError::AlreadySpent));
    assert_eq!(confirm(&other, n + 1).await, Ok(()));
    let verified = other.verify_history(Walk::new(Some(key.public()))).await;
    assert!(matches!(verified, Ok(Ok(_))), "{verified:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn a_confirm_on_a_frozen_backend_times_out_as_unreachable_and_is_then_already_spent_everywhere()
 {
    let server = PrivateServer::start();
    let dsn = fresh_database(&server.dsn()).await;
    let timeout = Duration::from_secs(1);
    let key = std::sync::Arc::new(ChainKey::from_seed(&[4; 32]));
    let signing = |name| short(name).with_chain_key(key.clone());
    let records = Postgres::connect(&dsn, signing("countersign-frozen-confirm"))
        .await
        .unwrap();
    // A first confirm opens what the replica holds (its pool's one connection).
    assert_eq!(confirm(&records, 1).await, Ok(()));
    let backends = backends_of(&server, "countersign-frozen-confirm").await;
    assert!(!backends.is_empty());

    let frozen = Frozen::stop(&backends);
    let started = Instant::now();
    let result = confirm(&records, 2).await;
    let waited = started.elapsed();
    frozen.go_on();
    let reason = unreachable(result);
    eprintln!("frozen backend: the confirm was refused after {waited:?}: {reason}");
    assert!(waited >= timeout, "gave up after only {waited:?}");
    assert!(
        waited < timeout + Duration::from_millis(500),
        "waited {waited:?} with a {timeout:?} statement timeout: more than one"
    );
    assert_eq!(records.doubtful_count(), 1, "the outcome is unknown: doubt");
    only_ever_already_used(&records, 2, &dsn, signing("countersign-other"), &key).await;
}

/// A confirm whose spend and event reached the server, and whose answer never came back (the
/// connection open and silent): given up on within one bound, its outcome unknown, so the nonce
/// is held doubtful and then burned: already used everywhere, whatever the server did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn a_confirm_whose_answer_never_comes_times_out_as_unreachable_and_is_then_already_spent_everywhere()
 {
    let timeout = Duration::from_secs(1);
    let waited = a_confirm_failed_once_sent(Failing::Stall).await;
    assert!(waited >= timeout, "gave up after only {waited:?}");
    assert!(
        waited < timeout + Duration::from_millis(500),
        "waited {waited:?} with a {timeout:?} statement timeout: more than one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn a_confirm_whose_history_writer_stops_mid_batch_is_unreachable_and_its_nonce_is_held_spent()
{
    let server = PrivateServer::start();
    let dsn = fresh_database(&server.dsn()).await;
    // The replica's history writer (and its connections) on a runtime of its own, which the
    // test ends while the writer's batch waits on a frozen backend: a replica's runtime ending
    // mid-batch. Timeouts long enough that only the runtime's end can answer the confirm.
    let patient = short("countersign-writer-stops")
        .with_statement_timeout(Duration::from_secs(30))
        .with_pool_size(1);
    let (handed, replica) = std::sync::mpsc::channel();
    let (stop, stopping) = std::sync::mpsc::channel::<()>();
    let writers = std::thread::spawn({
        let dsn = dsn.clone();
        move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let records = runtime.block_on(Postgres::connect(&dsn, patient)).unwrap();
            handed.send(std::sync::Arc::new(records)).unwrap();
            let _ = stopping.recv();
            drop(runtime);
        }
    });
    let records: std::sync::Arc<Postgres> = replica.recv().unwrap();
    assert_eq!(confirm(&records, 1).await, Ok(()));
    let backends = backends_of(&server, "countersign-writer-stops").await;
    assert!(!backends.is_empty());

    let frozen = Frozen::stop(&backends);
    let confirming = tokio::spawn({
        let records = records.clone();
        async move { confirm(&records, 2).await }
    });
    // The writer has the pool's one connection to hand (the first confirm gave it back), so the
    // batch goes to the frozen backend at once: 300 ms is its time to get there. Nothing but the
    // runtime's end can answer it then (the statement timeout is 30 s).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answered_early = confirming.is_finished();
    stop.send(()).unwrap();
    writers.join().unwrap();
    let result = confirming.await.unwrap();
    frozen.go_on();
    assert!(!answered_early, "answered while the backend was frozen");
    let reason = unreachable(result);
    eprintln!("the writer stopped mid-batch: {reason}");
    assert!(reason.contains("stopped before"), "{reason}");
    assert_eq!(records.doubtful_count(), 1, "it may have committed: doubt");

    // Through the same replica's records (its connections now made on this runtime): burned,
    // never spent as new; and through another replica, already used.
    assert_eq!(confirm(&records, 2).await, Err(SpendError::AlreadySpent));
    assert_eq!(records.doubtful_count(), 0);
    let admin = admin(&dsn).await;
    assert_eq!(rows_of(&admin, 2).await, 1);
    let other = Postgres::connect(&dsn, short("countersign-other"))
        .await
        .unwrap();
    assert_eq!(confirm(&other, 2).await, Err(SpendError::AlreadySpent));
    assert_eq!(confirm(&other, 3).await, Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn a_server_stopped_before_a_confirm_is_unreachable_and_it_spends_once_the_server_is_back() {
    let server = PrivateServer::start();
    let dsn = fresh_database(&server.dsn()).await;
    let records = Postgres::connect(&dsn, short("countersign-stopped-confirm"))
        .await
        .unwrap();
    server.stop_immediately();
    unreachable(confirm(&records, 1).await);
    assert_eq!(records.doubtful_count(), 0, "nothing was sent: no doubt");

    server.start_again();
    assert_eq!(confirm(&records, 1).await, Ok(()));
    assert_eq!(confirm(&records, 1).await, Err(SpendError::AlreadySpent));
    let admin = admin(&dsn).await;
    assert_eq!(
        (rows_of(&admin, 1).await, events_of(&admin, 1).await),
        (1, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn a_confirms_serialization_failures_up_to_the_bound_are_retried_and_past_it_write_nothing() {
    let (dsn, admin) = failing_the_first(SERIALIZATION_RETRIES).await;
    let records = Postgres::connect(&dsn, PostgresOptions::default())
        .await
        .unwrap();
    assert_eq!(confirm(&records, 1).await, Ok(()));
    assert_eq!(
        (rows_of(&admin, 1).await, events_of(&admin, 1).await),
        (1, 1)
    );

    let (dsn, admin) = failing_the_first(SERIALIZATION_RETRIES + 1).await;
    let records = Postgres::connect(&dsn, PostgresOptions::default())
        .await
        .unwrap();
    let reason = unreachable(confirm(&records, 1).await);
    assert!(reason.contains("40001"), "{reason}");
    assert!(
        reason.contains(&format!("(after {SERIALIZATION_RETRIES} retries)")),
        "{reason}"
    );
    assert_eq!(records.doubtful_count(), 0, "the server said no: no doubt");
    assert_eq!(
        (rows_of(&admin, 1).await, events_of(&admin, 1).await),
        (0, 0)
    );
    admin
        .batch_execute("DROP TRIGGER fail_first ON spent_nonce")
        .await
        .unwrap();
    assert_eq!(confirm(&records, 1).await, Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn a_confirm_that_cannot_lock_the_history_says_so_spends_nothing_and_spends_once_it_can() {
    let dsn = migrated_database().await;
    // A replica that waits at most 200 ms for a lock.
    let impatient = format!("{dsn} options='-c lock_timeout=200'");
    let records = Postgres::connect(&impatient, PostgresOptions::default())
        .await
        .unwrap();
    assert_eq!(confirm(&records, 1).await, Ok(()));
    let admin = admin(&dsn).await;
    admin
        .batch_execute("BEGIN; SELECT * FROM history_tip FOR UPDATE")
        .await
        .unwrap();
    // The lock fails, and the spend sent behind it with it: the lock's failure is what is said.
    let reason = unreachable(confirm(&records, 2).await);
    assert!(reason.contains("55P03"), "{reason}");
    assert_eq!(records.doubtful_count(), 0, "the server said no: no doubt");
    admin.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        (rows_of(&admin, 2).await, events_of(&admin, 2).await),
        (0, 0)
    );
    assert_eq!(confirm(&records, 2).await, Ok(()));
}

/// Confirms gathered behind the chain's tip while another holds it (the test's transaction), a
/// replay among them: the replica's history writer appends them in batches once the tip is free,
/// the replay is refused and leaves no event, every other confirm spends once with its event, and
/// the chain is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn a_replay_among_confirms_waiting_for_the_tip_is_refused_and_the_others_spend_once() {
    let dsn = migrated_database().await;
    let key = std::sync::Arc::new(ChainKey::from_seed(&[6; 32]));
    let options = PostgresOptions::default()
        .with_application_name("countersign-replay-in-batch")
        .with_chain_key(key.clone());
    let records = std::sync::Arc::new(Postgres::connect(&dsn, options).await.unwrap());
    assert_eq!(confirm(&records, 1).await, Ok(()));
    let admin = admin(&dsn).await;
    admin
        .batch_execute("BEGIN; SELECT * FROM history_tip FOR UPDATE")
        .await
        .unwrap();
    let confirms: Vec<_> = std::iter::once(1)
        .chain(10..20)
        .map(|n| {
            let records = records.clone();
            tokio::spawn(async move { (n, confirm(&records, n).await) })
        })
        .collect();
    // The writer waits for the tip behind the test's lock, and the other confirms gather behind it.
    let waiting = "SELECT count(*) FROM pg_stat_activity
                   WHERE application_name = 'countersign-replay-in-batch'
                     AND wait_event_type = 'Lock'";
    let started = Instant::now();
    while admin
        .query_one(waiting, &[])
        .await
        .unwrap()
        .get::<_, i64>(0)
        == 0
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the writer never waited for the tip"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    admin.batch_execute("ROLLBACK").await.unwrap();
    for task in confirms {
        let (n, outcome) = task.await.unwrap();
        let expected = if n == 1 {
            Err(SpendError::AlreadySpent)
        } else {
            Ok(())
        };
        assert_eq!(outcome, expected, "confirm of nonce {n}");
    }
    for n in std::iter::once(1).chain(10..20) {
        assert_eq!(
            (rows_of(&admin, n).await, events_of(&admin, n).await),
            (1, 1),
            "nonce {n}: one spend, one event"
        );
    }
    let intact = records
        .verify_history(Walk::new(Some(key.public())))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((intact.first, intact.last), (Some(1), Some(11)));
}
