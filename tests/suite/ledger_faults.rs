//! Every way the ledger can fail to vouch for a spend gives `Unreachable`, and spends nothing:
//! once the fault clears, the very same nonce spends. The ledger fails closed, and a ledger that
//! comes back works again without restarting anything.

use std::path::Path;
use std::time::{Duration, Instant};

use countersign_core::{Ledger, SpendError};
use countersign_store::test_support::{nonce, short_timeout, unreachable};
use countersign_store::{Store, StoreOptions};
use countersign_tests::{Spend, spawn_one};

const CHILD: &str = env!("CARGO_BIN_EXE_ledger_child");
const EXPIRES_AT_MS: u64 = 4_000_000_000_000;

fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn integrity_ok(db: &Path) {
    let conn = rusqlite::Connection::open(db).unwrap();
    let verdict: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(verdict, "ok");
}

#[test]
fn corrupt_file_is_unreachable_and_spends_nothing() {
    let dir = temp_dir();
    let db = dir.path().join("countersign.db");
    std::fs::write(
        &db,
        b"this is not an SQLite database, just garbage bytes".repeat(100),
    )
    .unwrap();
    let mut store = Store::open_deferred(&db, short_timeout());
    let reason = unreachable(store.spend(&nonce(1), EXPIRES_AT_MS));
    assert!(reason.contains("not a database"), "{reason}");
    // The fault clears (the file is restored or removed): the same store, the same nonce, spent.
    std::fs::remove_file(&db).unwrap();
    assert_eq!(store.spend(&nonce(1), EXPIRES_AT_MS), Ok(()));
    assert_eq!(
        store.spend(&nonce(1), EXPIRES_AT_MS),
        Err(SpendError::AlreadySpent)
    );
}

#[test]
fn path_whose_parent_is_a_regular_file_is_unreachable_and_spends_nothing() {
    let dir = temp_dir();
    let parent = dir.path().join("app-data");
    std::fs::write(&parent, b"a file where the data directory should be").unwrap();
    let db = parent.join("countersign.db");
    let mut store = Store::open_deferred(&db, short_timeout());
    let reason = unreachable(store.spend(&nonce(1), EXPIRES_AT_MS));
    assert!(reason.contains("unable to open"), "{reason}");
    std::fs::remove_file(&parent).unwrap();
    std::fs::create_dir(&parent).unwrap();
    assert_eq!(store.spend(&nonce(1), EXPIRES_AT_MS), Ok(()));
}

#[test]
fn write_lock_held_by_another_process_past_the_busy_timeout_is_unreachable_and_spends_nothing() {
    let dir = temp_dir();
    let db = dir.path().join("countersign.db");
    let mut store = Store::open(&db, short_timeout()).unwrap();
    let (mut release, holder) = spawn_one(CHILD, &["hold-write-lock", db.to_str().unwrap()]);
    assert_eq!(holder.first_line(), "locked");

    let started = Instant::now();
    let reason = unreachable(store.spend(&nonce(1), EXPIRES_AT_MS));
    let waited = started.elapsed();
    eprintln!("refused after {waited:?} with a 200 ms busy timeout: {reason}");
    assert!(
        waited >= Duration::from_millis(190),
        "gave up after only {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(2),
        "waited {waited:?}: a spend is never retried past its timeout"
    );
    assert!(
        reason.contains("locked") || reason.contains("busy"),
        "{reason}"
    );

    release.release();
    assert!(holder.finish().status.success());
    assert_eq!(store.spend(&nonce(1), EXPIRES_AT_MS), Ok(()));
}

#[test]
fn write_lock_of_a_killed_process_does_not_wedge_the_ledger() {
    let dir = temp_dir();
    let db = dir.path().join("countersign.db");
    let mut store = Store::open(&db, short_timeout()).unwrap();
    let (_release, holder) = spawn_one(CHILD, &["hold-write-lock", db.to_str().unwrap()]);
    assert_eq!(holder.first_line(), "locked");
    unreachable(store.spend(&nonce(1), EXPIRES_AT_MS));
    holder.kill();
    assert_eq!(store.spend(&nonce(1), EXPIRES_AT_MS), Ok(()));
    integrity_ok(&db);
}

/// Runs a child that spends `nonce(2)` with its file-size limit at the WAL's current size, and
/// checks that the spend is refused and that nothing was spent. With `keep_open`, this process
/// keeps a connection open, so the WAL keeps its frames and the child must grow it past its
/// size; without, the WAL was removed at the last close and the child cannot write one at all.
fn spend_at_the_file_size_limit(keep_open: bool) {
    let dir = temp_dir();
    let db = dir.path().join("countersign.db");
    let mut store = Store::open(&db, StoreOptions::default()).unwrap();
    store.spend(&nonce(1), EXPIRES_AT_MS).unwrap();
    if !keep_open {
        // Closing the last connection checkpoints the WAL into the file and removes it.
        drop(store);
    }
    let args = [
        "spend-over-size-limit",
        db.to_str().unwrap(),
        &nonce(2).to_hex(),
    ];
    let (_release, child) = spawn_one(CHILD, &args);
    let finished = child.finish();
    assert!(
        finished.status.success(),
        "the child must not be killed by SIGXFSZ: {finished:?}"
    );
    let limit: u64 = finished
        .first_line
        .strip_prefix("limit\t")
        .expect("the limit")
        .parse()
        .unwrap();
    let outcome = finished.outcome().expect("an outcome");
    eprintln!("file size limit {limit} bytes (connection kept open: {keep_open}): {outcome:?}");
    assert_eq!(limit > 0, keep_open);
    assert_eq!(outcome.spend, Spend::Unreachable, "{outcome:?}");

    // The limit was the child's alone: here the file is whole, the old spend kept, the new one not.
    integrity_ok(&db);
    let mut store = Store::open(&db, StoreOptions::default()).unwrap();
    assert_eq!(
        store.spend(&nonce(1), EXPIRES_AT_MS),
        Err(SpendError::AlreadySpent)
    );
    assert_eq!(store.spend(&nonce(2), EXPIRES_AT_MS), Ok(()));
}

#[test]
fn file_size_limit_reached_while_growing_the_wal_is_unreachable_and_spends_nothing() {
    spend_at_the_file_size_limit(true);
}

#[test]
fn file_size_limit_reached_before_any_wal_is_unreachable_and_spends_nothing() {
    spend_at_the_file_size_limit(false);
}
