//! The durable ledger: spending a single-use nonce.
//!
//! This is the check that makes a `once` token work exactly once, across processes and restarts.
//! A spend is ONE `INSERT` in a `BEGIN IMMEDIATE` transaction, committed durably (WAL,
//! `synchronous=FULL`) before the guarded action runs. The primary key's duplicate-key error is the
//! replay signal; there is no read-then-write (two callers could both read "not spent") and no
//! `INSERT OR IGNORE` (it hides the very error that matters). Every other outcome fails closed as
//! unreachable, and the transaction is rolled back, so nothing is spent.

use countersign_core::{Ledger, Nonce, SpendError};
use rusqlite::{Connection, TransactionBehavior, ffi};

use crate::{Store, StoreError};

/// Whether the INSERT found the nonce already there.
enum Spend {
    /// Recorded now, durably.
    Recorded,
    /// It was recorded before: a replay.
    Duplicate,
}

fn is_duplicate_key(err: &rusqlite::Error) -> bool {
    matches!(
        err,
        rusqlite::Error::SqliteFailure(e, _) if e.extended_code == ffi::SQLITE_CONSTRAINT_PRIMARYKEY
    )
}

fn insert_nonce(
    conn: &mut Connection,
    nonce: &Nonce,
    expires_at: i64,
) -> Result<Spend, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let inserted = tx
        .prepare_cached("INSERT INTO spent_nonce (nonce, expires_at_ms) VALUES (?1, ?2)")?
        .execute(rusqlite::params![&nonce.as_bytes()[..], expires_at]);
    match inserted {
        Ok(_) => {}
        // Dropping the transaction rolls it back; the connection stays sound.
        Err(err) if is_duplicate_key(&err) => return Ok(Spend::Duplicate),
        Err(err) => return Err(err.into()),
    }
    tx.commit()?;
    Ok(Spend::Recorded)
}

impl Ledger for Store {
    fn spend(&mut self, nonce: &Nonce, expires_at_ms: u64) -> Result<(), SpendError> {
        // The expiry only decides when the row may be pruned: one beyond SQLite's range is
        // "never", which keeps the nonce, the safe side.
        let expires_at = i64::try_from(expires_at_ms).unwrap_or(i64::MAX);
        match self.with_connection(|conn| insert_nonce(conn, nonce, expires_at)) {
            Ok(Spend::Recorded) => Ok(()),
            Ok(Spend::Duplicate) => Err(SpendError::AlreadySpent),
            Err(err) => Err(SpendError::Unreachable(err.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier};
    use std::time::{Duration, Instant};

    use countersign_core::{Ledger, SpendError};

    use crate::test_support::{
        assert_spent_once, nonce, raw, short_timeout, temp_store, unreachable,
    };
    use crate::{Store, StoreOptions};

    #[test]
    fn spent_nonce_stays_spent_after_reopen() {
        let (dir, mut store) = temp_store();
        store.spend(&nonce(1), 10).unwrap();
        drop(store);
        let mut store =
            Store::open(dir.path().join("countersign.db"), StoreOptions::default()).unwrap();
        assert_eq!(store.spend(&nonce(1), 10), Err(SpendError::AlreadySpent));
    }

    #[test]
    fn connection_is_wal_with_full_sync_and_the_busy_timeout() {
        let (_dir, mut store) = temp_store();
        let conn = store.connection().unwrap();
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        let sync: i64 = conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        let busy: i64 = conn
            .query_row("PRAGMA busy_timeout", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        assert_eq!(sync, 2, "synchronous=FULL");
        assert_eq!(busy, 5_000);
    }

    #[test]
    fn lock_held_past_busy_timeout_is_unreachable_and_spends_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path().join("countersign.db"), short_timeout()).unwrap();
        let holder = raw(&store);
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let started = Instant::now();
        let reason = unreachable(store.spend(&nonce(1), 10));
        assert!(
            started.elapsed() >= Duration::from_millis(190),
            "waited {:?}",
            started.elapsed()
        );
        assert!(
            reason.contains("locked") || reason.contains("busy"),
            "{reason}"
        );
        // Busy leaves the connection sound; once the lock is gone the same nonce spends.
        assert!(store.is_connected());
        holder.execute_batch("ROLLBACK").unwrap();
        assert_eq!(store.spend(&nonce(1), 10), Ok(()));
    }

    #[test]
    fn lock_released_within_busy_timeout_is_waited_for() {
        let (_dir, mut store) = temp_store();
        let holder = raw(&store);
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            holder.execute_batch("COMMIT").unwrap();
        });
        assert_eq!(store.spend(&nonce(1), 10), Ok(()));
        release.join().unwrap();
    }

    #[test]
    fn corrupt_file_is_unreachable_and_recovers_when_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("countersign.db");
        std::fs::write(&path, vec![0xA5; 8192]).unwrap();
        let mut store = Store::open_deferred(&path, short_timeout());
        let reason = unreachable(store.spend(&nonce(1), 10));
        assert!(reason.contains("not a database"), "{reason}");
        assert!(!store.is_connected());
        // The garbage was not overwritten: the ledger never "repairs" a file by starting afresh.
        assert_eq!(std::fs::read(&path).unwrap(), vec![0xA5; 8192]);
        // The file comes back (restored from a backup, say): the same store works again.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(store.spend(&nonce(1), 10), Ok(()));
    }

    #[test]
    fn damaged_header_is_unreachable_and_not_reinitialised() {
        let (_dir, mut store) = temp_store();
        store.spend(&nonce(1), 10).unwrap();
        let path = store.path().to_owned();
        // Close, so the WAL is checkpointed into the main file, then overwrite its header.
        drop(store);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[..100].fill(0x5A);
        std::fs::write(&path, &bytes).unwrap();
        let mut store = Store::open_deferred(&path, short_timeout());
        unreachable(store.spend(&nonce(2), 10));
        unreachable(store.spend(&nonce(2), 10));
    }

    #[test]
    fn unopenable_path_is_unreachable_until_it_becomes_openable() {
        let dir = tempfile::tempdir().unwrap();
        let parent = dir.path().join("data");
        std::fs::write(&parent, b"a regular file where a directory should be").unwrap();
        let mut store = Store::open_deferred(parent.join("countersign.db"), short_timeout());
        let reason = unreachable(store.spend(&nonce(1), 10));
        assert!(reason.contains("cannot open"), "{reason}");
        assert!(matches!(
            Store::open(parent.join("countersign.db"), short_timeout()),
            Err(crate::StoreError::Open { .. })
        ));
        std::fs::remove_file(&parent).unwrap();
        std::fs::create_dir(&parent).unwrap();
        assert_eq!(store.spend(&nonce(1), 10), Ok(()));
        assert_eq!(store.spend(&nonce(1), 10), Err(SpendError::AlreadySpent));
    }

    #[test]
    fn file_deleted_while_open_is_not_written_behind_the_paths_back() {
        let (_dir, mut store) = temp_store();
        store.spend(&nonce(1), 10).unwrap();
        let path = store.path().to_owned();
        std::fs::remove_file(&path).unwrap();
        // The open connection's file is gone: the spend is refused, not recorded in a ghost.
        let reason = unreachable(store.spend(&nonce(2), 10));
        assert!(reason.contains("deleted or replaced"), "{reason}");
        assert!(!store.is_connected());
        // The next operation opens what is at the path now: a new, empty ledger that every
        // other process opening the path shares.
        assert_eq!(store.spend(&nonce(2), 10), Ok(()));
        assert!(path.exists());
        let mut other = Store::open(&path, StoreOptions::default()).unwrap();
        assert_eq!(other.spend(&nonce(2), 10), Err(SpendError::AlreadySpent));
    }

    #[test]
    fn threads_racing_one_nonce_spend_it_once() {
        let (dir, store) = temp_store();
        drop(store);
        let path = dir.path().join("countersign.db");
        let threads = 16;
        let barrier = Arc::new(Barrier::new(threads));
        let outcomes: Vec<_> = (0..threads)
            .map(|_| {
                let (path, barrier) = (path.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let mut store = Store::open(path, StoreOptions::default()).unwrap();
                    barrier.wait();
                    store.spend(&nonce(9), 10)
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        assert_spent_once(&outcomes);
    }
}
