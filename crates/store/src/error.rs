//! What can go wrong with the store, as types rather than strings.
//!
//! The desk turns some of these into an agent-facing refusal (`ledger_unreachable`) and shows the
//! others to the person (a file from a newer Countersign, a file that is not ours), so each cause
//! is its own variant and nobody has to match on message text.

use std::path::PathBuf;

use countersign_core::Nonce;

/// A failure of the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The file could not be opened, configured (busy timeout, WAL, `synchronous=FULL`) or
    /// migrated: a missing or unwritable directory, a corrupt file, a lock held past the timeout.
    #[error("cannot open the store at {} (while {during}): {source}", .path.display())]
    Open {
        /// The file's path.
        path: PathBuf,
        /// The step that failed: `opening the file`, `switching to WAL`, `migrating`, ...
        during: &'static str,
        /// What SQLite reported.
        #[source]
        source: rusqlite::Error,
    },
    /// An existing file (or its `-wal` or `-shm`) that other accounts may read could not be made
    /// private (0600). Nothing was opened.
    #[error("cannot make the store at {} private to this account (0600): {source}", .path.display())]
    NotPrivate {
        /// The file's path.
        path: PathBuf,
        /// What the system reported.
        #[source]
        source: std::io::Error,
    },
    /// SQLite would not put the file in WAL mode, so the durability and concurrency the ledger
    /// relies on are not available (for example a file system without shared memory support).
    #[error("the store at {} cannot use WAL journaling (journal mode stayed {mode:?})", .path.display())]
    NotWal {
        /// The file's path.
        path: PathBuf,
        /// The journal mode SQLite reported instead.
        mode: String,
    },
    /// The file was written by a newer Countersign whose schema this build does not know.
    /// Nothing was changed in it.
    #[error(
        "the store at {} has schema version {found}, newer than the {known} this build knows: \
         upgrade Countersign",
        .path.display()
    )]
    NewerSchema {
        /// The file's path.
        path: PathBuf,
        /// The file's `user_version`.
        found: i64,
        /// The newest version this build knows.
        known: i64,
    },
    /// The file is an SQLite database of some other program (its `application_id` or a negative
    /// `user_version` says so). Nothing was changed in it.
    #[error("the file at {} is not a Countersign store ({reason})", .path.display())]
    NotAStore {
        /// The file's path.
        path: PathBuf,
        /// What gave it away.
        reason: String,
    },
    /// The file was deleted or replaced while it was open. Its connection was dropped (writing
    /// on would record spends in a file nobody else sees); the next operation opens whatever is
    /// at the path then.
    #[error("the store at {} was deleted or replaced while open", .path.display())]
    Moved {
        /// The file's path.
        path: PathBuf,
    },
    /// A statement on an open file failed (busy past the timeout, I/O error, disk full, ...).
    #[error("store operation failed: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// An approval is already stored under this nonce; what a person approved is never
    /// overwritten.
    #[error("an approval is already stored for nonce {0}")]
    ApprovalExists(Nonce),
    /// An approval of the `open` class was offered for storing: an open tool is forwarded
    /// without a token, so an approval of one is a caller's mistake and is not recorded.
    #[error(
        "an approval must be of class token or once, not open (nonce {0}): an open tool needs \
         no approval"
    )]
    UngatedApproval(Nonce),
    /// A stored row does not decode into its type (edited by hand, or damaged).
    #[error("a stored {table} row is invalid: {reason}")]
    InvalidRow {
        /// The table it came from.
        table: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A time in milliseconds that does not fit SQLite's signed 64-bit integers.
    #[error("time {0} ms is out of the range the store can hold")]
    TimeOutOfRange(u64),
    /// The PostgreSQL DSN or options are unusable (a DSN that does not parse, a bad certificate,
    /// TLS that cannot be set up). Never carries the DSN's password.
    #[cfg(feature = "postgres")]
    #[error("cannot use the PostgreSQL settings: {reason}")]
    PostgresConfig {
        /// What is wrong.
        reason: String,
    },
    /// No connection to PostgreSQL could be had (server down, connection refused,
    /// authentication failed, TLS refused, every pooled connection busy past the wait). Nothing
    /// was sent: a spend refused this way spent nothing.
    #[cfg(feature = "postgres")]
    #[error("the records at {target} are unreachable: {reason}")]
    PostgresUnavailable {
        /// `user@host:port/dbname` (never the password).
        target: String,
        /// Why.
        reason: String,
    },
    /// A PostgreSQL statement failed: the server's error (its SQLSTATE and message), or the
    /// connection failing under it.
    #[cfg(feature = "postgres")]
    #[error("records statement failed: {}", crate::postgres::describe(.0))]
    Postgres(#[source] tokio_postgres::Error),
    /// PostgreSQL refused a transaction as not serializable with others at once (SQLSTATE
    /// 40001) every time it was tried: its first try and [`SERIALIZATION_RETRIES`] more.
    /// Nothing of it was written.
    ///
    /// [`SERIALIZATION_RETRIES`]: crate::SERIALIZATION_RETRIES
    #[cfg(feature = "postgres")]
    #[error(
        "records statement failed: {} (after {retries} retries)",
        crate::postgres::describe(.source)
    )]
    PostgresContended {
        /// How many times it was tried again.
        retries: u32,
        /// The last try's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// PostgreSQL did not answer a statement within the statement timeout. Whether it took
    /// effect is unknown; its connection was closed.
    #[cfg(feature = "postgres")]
    #[error("the records did not answer within {after:?}; the outcome is unknown")]
    PostgresTimeout {
        /// The statement timeout.
        after: std::time::Duration,
    },
    /// The database's schema was written by a newer Countersign than this build. Nothing was
    /// changed in it.
    #[cfg(feature = "postgres")]
    #[error(
        "the records at {target} have schema version {found}, newer than the {known} this build \
         knows: upgrade Countersign"
    )]
    PostgresNewerSchema {
        /// `user@host:port/dbname`.
        target: String,
        /// The newest version recorded in `countersign_schema`.
        found: i64,
        /// The newest version this build knows.
        known: i64,
    },
}

impl StoreError {
    /// Whether the connection that produced this error should be dropped and the file reopened
    /// on the next operation. A duplicate key or a lock held past the timeout leaves the
    /// connection sound; an I/O error, a corrupt or moved file, or anything unexpected does not.
    pub(crate) fn breaks_connection(&self) -> bool {
        match self {
            StoreError::Sqlite(err) => !matches!(
                err.sqlite_error_code(),
                Some(
                    rusqlite::ErrorCode::ConstraintViolation
                        | rusqlite::ErrorCode::DatabaseBusy
                        | rusqlite::ErrorCode::DatabaseLocked
                )
            ),
            StoreError::ApprovalExists(_)
            | StoreError::UngatedApproval(_)
            | StoreError::InvalidRow { .. }
            | StoreError::TimeOutOfRange(_) => false,
            // Opening failed, so there is no connection to keep.
            StoreError::Open { .. }
            | StoreError::NotPrivate { .. }
            | StoreError::NotWal { .. }
            | StoreError::NewerSchema { .. }
            | StoreError::NotAStore { .. }
            | StoreError::Moved { .. } => true,
            // PostgreSQL's connections are pooled, not this store's.
            #[cfg(feature = "postgres")]
            StoreError::PostgresConfig { .. }
            | StoreError::PostgresUnavailable { .. }
            | StoreError::Postgres(_)
            | StoreError::PostgresContended { .. }
            | StoreError::PostgresTimeout { .. }
            | StoreError::PostgresNewerSchema { .. } => false,
        }
    }

    /// Whether this is SQLite saying another connection holds a lock (busy or locked).
    pub(crate) fn is_busy(&self) -> bool {
        let source = match self {
            StoreError::Open { source, .. } => source,
            StoreError::Sqlite(source) => source,
            _ => return false,
        };
        matches!(
            source.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
        )
    }
}

/// Wraps SQLite's error from the open step `during`.
pub(crate) fn open_error(
    path: &std::path::Path,
    during: &'static str,
) -> impl Fn(rusqlite::Error) -> StoreError {
    move |source| StoreError::Open {
        path: path.to_owned(),
        during,
        source,
    }
}

/// Milliseconds since the epoch as SQLite stores them.
pub(crate) fn ms_to_sql(ms: u64) -> Result<i64, StoreError> {
    i64::try_from(ms).map_err(|_| StoreError::TimeOutOfRange(ms))
}

/// Milliseconds read back from SQLite; a negative value is a damaged row.
pub(crate) fn ms_from_sql(value: i64, table: &'static str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::InvalidRow {
        table,
        reason: format!("negative time {value}"),
    })
}
