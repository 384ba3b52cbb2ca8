//! The desk's one SQLite file: the single-use nonce ledger, the arguments each person approved,
//! the history of every confirmation event, and the tool definitions pinned per server.
//!
//! Why one durable file: the desk restarts, and more than one process (the desk, a second desk
//! started before the first noticed, tools and tests) may open the ledger at once. A token
//! approved before a restart must still execute exactly what was approved, and a single-use token
//! must work exactly once however many processes present it at the same moment. SQLite in WAL mode
//! with `synchronous=FULL` and `BEGIN IMMEDIATE` writes gives both, and its primary key gives the
//! replay check for free: a spend is one `INSERT` whose duplicate-key error IS the replay signal.
//!
//! The ledger fails closed: anything but success or a duplicate key (a lock held past the busy
//! timeout, a corrupt or unopenable file, a full disk, an I/O error) is
//! [`SpendError::Unreachable`](countersign_core::SpendError::Unreachable), and nothing was spent.
//! A [`Store`] that could not open its file, or whose connection broke, is not dead: it opens the
//! file again on its next operation, so a ledger that comes back works again.
//!
//! The engine reaches these records through the [`Records`] trait: [`Sqlite`] (this file, for
//! the desk) and, with the `postgres` feature, [`Postgres`] (for `countersign serve`).
//!
//! Time is always a parameter (milliseconds since the Unix epoch); nothing here reads the clock
//! to decide anything.
#![forbid(unsafe_code)] // nothing here reaches past the safe language; keep it so

mod accepted;
mod approval;
mod budget;
mod connection;
mod decision;
mod error;
#[cfg(feature = "export")]
pub mod export;
mod grant;
mod history;
mod ledger;
mod passkey;
mod pin;
#[cfg(feature = "postgres")]
mod postgres;
mod read;
mod records;
mod roster;
mod schema;
mod sink;
pub(crate) mod waiting;

use std::path::{Path, PathBuf};

use rusqlite::{Connection, TransactionBehavior};

use crate::connection::FileIdentity;

pub use accepted::{Accepted, MAX_ACCEPTED_BYTES};
pub use approval::Approval;
pub use connection::StoreOptions;
pub use decision::{
    Assertion, DecisionRecord, Evidence, MAX_ASSERTION_PART_BYTES, MAX_DECISION_ROWS,
};
pub use error::StoreError;
pub use grant::{Grant, GrantEnd, GrantKind};
pub use history::{Chained, Heads, HistoryFilter, MAX_STORED_CHARS, Recorded, StoredLink, capped};
pub use passkey::{Invite, MAX_CREDENTIAL_BYTES, MAX_CREDENTIAL_ID_BYTES, Passkey};
pub use pin::{MAX_DEFINITION_CHARS, MAX_PINS, MAX_PINS_PER_SERVER, ToolPin};
#[cfg(feature = "postgres")]
pub use postgres::{POSTGRES_SCHEMA_VERSION, Postgres, PostgresOptions, SERIALIZATION_RETRIES};
pub use read::HistoryReader;
pub use records::{Records, Sqlite};
pub use roster::{MAX_MEMBER_NAME_CHARS, Member, Roster, valid_member_name};
pub use schema::{APPLICATION_ID, SCHEMA_VERSION};
pub use sink::{ExportStatus, OTLP_SINK};
pub use waiting::{MAX_WAITING_ROWS, SharedRow, WaitingCall};

/// The desk's SQLite file, opened with the settings the ledger depends on.
///
/// Not `Sync`: one owner (the desk wraps it in a mutex) and one connection. Every method takes
/// `&mut self` because any of them may have to reopen the file first.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    options: StoreOptions,
    /// `None` until the file opens, and again after an error that broke the connection.
    opened: Option<Opened>,
}

/// A live connection and the file it was opened on.
#[derive(Debug)]
struct Opened {
    conn: Connection,
    file: FileIdentity,
}

/// How many rows [`Store::prune`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Spent nonces whose tokens had expired.
    pub nonces: usize,
    /// Approvals whose tokens had expired.
    pub approvals: usize,
    /// History events older than the newest [`MAX_HISTORY_ROWS`].
    pub history: usize,
    /// Tool pins older than the newest [`MAX_PINS`].
    pub pins: usize,
}

/// How many history events [`Store::prune`] keeps, unless its options say otherwise.
pub const MAX_HISTORY_ROWS: i64 = 100_000;

impl Store {
    /// Opens (creating it if needed) and migrates the file at `path` now, reporting why if that
    /// fails. The parent directory must exist.
    pub fn open(path: impl Into<PathBuf>, options: StoreOptions) -> Result<Store, StoreError> {
        let mut store = Store::open_deferred(path, options);
        store.connection()?;
        Ok(store)
    }

    /// A store for the file at `path` that opens it on first use, and never fails here: if the
    /// file cannot be opened, each operation says so (a spend as unreachable) and the next one
    /// tries again. This is what a desk that must start even when its ledger is briefly
    /// unavailable wants.
    pub fn open_deferred(path: impl Into<PathBuf>, options: StoreOptions) -> Store {
        Store {
            path: path.into(),
            options,
            opened: None,
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the file now if no connection is open (creating and migrating it as
    /// [`Store::open`] does), saying why if that fails: for what must see the file exist, such as
    /// its canonical path.
    pub fn connect(&mut self) -> Result<(), StoreError> {
        self.connection().map(|_| ())
    }

    /// Whether a connection is open right now (false before first use and after a broken one).
    pub fn is_connected(&self) -> bool {
        self.opened.is_some()
    }

    /// Deletes the spent nonces and the approvals whose expiry is before `now_ms`, the oldest
    /// history beyond the newest [`MAX_HISTORY_ROWS`] events, and the oldest tool pins beyond the
    /// newest [`MAX_PINS`] (a pruned pin is taken again at the tool's next sight).
    ///
    /// Strictly before: a row expiring exactly at `now_ms` is kept, so a clock that lags the
    /// verifier's by a millisecond never forgets a nonce whose token still verifies. History is
    /// the audit trail, kept by count rather than age: a quiet month loses nothing, and an agent
    /// that provokes refusals in a loop cannot fill the disk.
    pub fn prune(&mut self, now_ms: u64) -> Result<Pruned, StoreError> {
        // A `now` beyond SQLite's range is later than any stored expiry.
        let now = i64::try_from(now_ms).unwrap_or(i64::MAX);
        let chain_key = self.options.chain_key.clone();
        let history_rows = self.options.history_rows;
        self.with_connection(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let nonces = tx.execute("DELETE FROM spent_nonce WHERE expires_at_ms < ?1", [now])?;
            let approvals = tx.execute("DELETE FROM approval WHERE expires_at_ms < ?1", [now])?;
            let history = tx.execute(
                // Never an event a telemetry sink still waits for (see export.rs).
                "DELETE FROM history WHERE id <=
                     (SELECT id FROM history ORDER BY id DESC LIMIT 1 OFFSET ?1)
                   AND seq IS NOT NULL
                   AND seq <= (SELECT coalesce(min(seq), 9223372036854775807) FROM export_cursor)",
                [history_rows],
            )?;
            if history > 0
                && let Some(key) = &chain_key
            {
                history::mark_start(&tx, key, now_ms)?;
            }
            // Pins of registered servers (`server:NAME`) are never pruned: a pruned server's next
            // listing would be pinned as it is, unasked, and an agent can list tools under
            // identities of its own choosing to push them out. An identity an agent chose it can
            // make fresh anyway, so losing its pins gives nothing away.
            let pins = tx.execute(
                "DELETE FROM tool_pin WHERE rowid IN
                     (SELECT rowid FROM tool_pin WHERE server NOT LIKE 'server:%'
                      ORDER BY pinned_at_ms DESC, rowid DESC
                      LIMIT -1 OFFSET ?1)",
                [MAX_PINS],
            )?;
            tx.commit()?;
            Ok(Pruned {
                nonces,
                approvals,
                history,
                pins,
            })
        })
    }

    /// The open connection, opening the file first if there is none. A connection whose file
    /// was deleted or replaced is dropped with [`StoreError::Moved`], and the next call opens
    /// whatever is at the path then.
    fn connection(&mut self) -> Result<&mut Connection, StoreError> {
        if let Some(opened) = &self.opened
            && !opened.file.still_at(&self.path)
        {
            self.opened = None;
            let err = StoreError::Moved {
                path: self.path.clone(),
            };
            tracing::warn!(path = %self.path.display(), error = %err, "store connection dropped");
            return Err(err);
        }
        if self.opened.is_none() {
            let conn = connection::open(&self.path, &self.options).inspect_err(|err| {
                tracing::warn!(path = %self.path.display(), error = %err, "store unavailable");
            })?;
            let file = FileIdentity::of(&self.path);
            self.opened = Some(Opened { conn, file });
        }
        Ok(&mut self
            .opened
            .as_mut()
            .expect("a connection was just opened")
            .conn)
    }

    /// Runs `op` on the connection (opening the file if needed) and drops the connection if the
    /// failure says it is no longer sound, so the next operation reopens the file.
    fn with_connection<T>(
        &mut self,
        op: impl FnOnce(&mut Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let result = op(self.connection()?);
        if let Err(err) = &result
            && err.breaks_connection()
        {
            tracing::warn!(
                path = %self.path.display(),
                error = %err,
                "store connection dropped; the next operation reopens the file"
            );
            self.opened = None;
        }
        result
    }
}

#[cfg(any(test, feature = "test-support"))]
pub mod test_support;

#[cfg(test)]
mod chain_tests;

#[cfg(test)]
mod tests {
    use countersign_core::{GateClass, Ledger, SpendError};

    use super::*;
    use crate::test_support::{approval, nonce, raw, temp_store};

    /// How many rows `table` of the store's file holds.
    fn rows(store: &Store, table: &str) -> i64 {
        raw(store)
            .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    }

    /// A refusal that is the answer rather than a fault (a replay, an approval already stored,
    /// an ungated approval) keeps the connection and leaves the file as it was. The refusals
    /// themselves are asserted on both stores by the suite in tests/records.rs.
    #[test]
    fn refusals_keep_the_connection_and_write_nothing() {
        let (_dir, mut store) = temp_store();
        assert_eq!(store.spend(&nonce(1), 10), Ok(()));
        assert_eq!(store.spend(&nonce(1), 10), Err(SpendError::AlreadySpent));
        assert_eq!(store.spend(&nonce(1), 99), Err(SpendError::AlreadySpent));
        assert!(store.is_connected());
        assert_eq!(rows(&store, "spent_nonce"), 1);

        let first = approval(1, 10);
        store.put_approval(&first).unwrap();
        let mut second = approval(1, 10);
        second.arguments = serde_json::json!({ "name": "something else" });
        assert!(matches!(
            store.put_approval(&second),
            Err(StoreError::ApprovalExists(_))
        ));
        assert!(store.is_connected());

        let mut open = approval(2, 10);
        open.class = GateClass::Open;
        assert!(matches!(
            store.put_approval(&open),
            Err(StoreError::UngatedApproval(_))
        ));
        assert!(store.is_connected());
        assert_eq!(rows(&store, "approval"), 1);
    }

    #[test]
    fn deferred_store_opens_on_first_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("countersign.db");
        let mut store = Store::open_deferred(&path, StoreOptions::default());
        assert!(!store.is_connected());
        assert!(!path.exists());
        assert_eq!(store.spend(&nonce(1), 10), Ok(()));
        assert!(store.is_connected());
        assert!(path.exists());
    }

    #[test]
    fn options_default_to_a_five_second_busy_timeout() {
        let options = StoreOptions::default();
        assert_eq!(options.busy_timeout, std::time::Duration::from_secs(5));
        let short = options.with_busy_timeout(std::time::Duration::from_millis(200));
        assert_eq!(short.busy_timeout.as_millis(), 200);
    }
}
