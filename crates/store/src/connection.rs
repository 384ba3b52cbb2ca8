//! Opening the file the same careful way every time.
//!
//! The ledger's promises rest on per-connection settings that SQLite forgets unless every
//! connection sets them: a busy timeout (set FIRST, so that everything after it, switching to WAL
//! and migrating included, waits for other openers wherever SQLite consults it), WAL journaling
//! (readers never block the writer, and a commit is one append), and `synchronous=FULL` (a commit
//! is on disk before the spend is reported). Opening a brand-new file from many processes at once
//! still returns `SQLITE_BUSY` at once now and then where SQLite does not consult the busy handler
//! (the multi-process tests see it while switching a new file to WAL), so the open step alone is
//! retried, for about the busy timeout at most. A spend is never retried here: its only waiting
//! is the busy timeout.

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

use crate::error::{StoreError, open_error};
use crate::schema;

/// How a store opens its file.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreOptions {
    /// How long an operation waits for another connection's write lock before it fails (and a
    /// spend is refused as unreachable). Opening retries for at most this long as well.
    pub busy_timeout: Duration,
}

impl StoreOptions {
    /// The busy timeout used unless a caller says otherwise.
    pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

    /// These options with another busy timeout.
    pub fn with_busy_timeout(mut self, busy_timeout: Duration) -> Self {
        self.busy_timeout = busy_timeout;
        self
    }
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            busy_timeout: Self::DEFAULT_BUSY_TIMEOUT,
        }
    }
}

/// Opens, configures and migrates the file at `path`, retrying only while another opener holds
/// a lock, and starting no new attempt once the busy timeout has passed.
pub(crate) fn open(path: &Path, options: &StoreOptions) -> Result<Connection, StoreError> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        match open_once(path, options) {
            Err(err) if err.is_busy() && started.elapsed() < options.busy_timeout => {
                tracing::debug!(path = %path.display(), error = %err, "store busy while opening; retrying");
                // Spread the retries of processes that collided so they do not collide again.
                thread::sleep(pause + Duration::from_micros(u64::from(std::process::id() % 1000)));
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            result => return result,
        }
    }
}

fn open_once(path: &Path, options: &StoreOptions) -> Result<Connection, StoreError> {
    // No URI interpretation: the path is a path, whatever it starts with.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn =
        Connection::open_with_flags(path, flags).map_err(open_error(path, "opening the file"))?;
    conn.busy_timeout(options.busy_timeout)
        .map_err(open_error(path, "setting the busy timeout"))?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(open_error(path, "switching to WAL"))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::NotWal {
            path: path.to_owned(),
            mode,
        });
    }
    conn.execute_batch("PRAGMA synchronous = FULL")
        .map_err(open_error(path, "setting synchronous=FULL"))?;
    schema::migrate(&mut conn, path)?;
    Ok(conn)
}

/// Which file a path named when it was opened (device and inode on Unix), so that a file deleted
/// or replaced under an open connection is noticed: SQLite in WAL mode would otherwise keep
/// writing to the unlinked file while other processes open a new one at the path, and a nonce
/// could then be spent once in each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileIdentity(Option<(u64, u64)>);

impl FileIdentity {
    /// The identity of the file at `path` now (none if there is no file).
    pub(crate) fn of(path: &Path) -> FileIdentity {
        FileIdentity(std::fs::metadata(path).ok().map(|meta| {
            #[cfg(unix)]
            {
                use std::os::unix::fs::MetadataExt;
                (meta.dev(), meta.ino())
            }
            #[cfg(not(unix))]
            {
                // Open files cannot be replaced there as easily; notice deletion at least.
                let _ = meta;
                (0, 0)
            }
        }))
    }

    /// Whether `path` still names this file.
    pub(crate) fn still_at(self, path: &Path) -> bool {
        self.0.is_some() && FileIdentity::of(path) == self
    }
}
