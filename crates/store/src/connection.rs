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
//!
//! The file holds what people approved and the history of every decision: it is the account's
//! alone. It is created 0600 before SQLite first opens it, and an existing one (with its `-wal`
//! and `-shm`) that others could read is made 0600; SQLite gives the `-wal` and `-shm` it creates
//! the main file's mode.

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
    /// The key that signs the head of the history's chain as each event is recorded (and the
    /// start of a pruned chain). Without one, events are still chained but the head is left as
    /// it was, and `countersign history verify` says from which event nothing signed covers them.
    pub chain_key: Option<std::sync::Arc<countersign_core::chain::ChainKey>>,
    /// How many history events [`Store::prune`](crate::Store::prune) keeps (the newest).
    pub history_rows: i64,
}

impl StoreOptions {
    /// The busy timeout used unless a caller says otherwise.
    pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

    /// These options with another busy timeout.
    pub fn with_busy_timeout(mut self, busy_timeout: Duration) -> Self {
        self.busy_timeout = busy_timeout;
        self
    }

    /// These options keeping `rows` history events at a prune (tests prune small histories).
    pub fn with_history_rows(mut self, rows: i64) -> Self {
        self.history_rows = rows.max(0);
        self
    }

    /// These options with `key` signing the history's head.
    pub fn with_chain_key(
        mut self,
        key: std::sync::Arc<countersign_core::chain::ChainKey>,
    ) -> Self {
        self.chain_key = Some(key);
        self
    }
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            busy_timeout: Self::DEFAULT_BUSY_TIMEOUT,
            chain_key: None,
            history_rows: crate::MAX_HISTORY_ROWS,
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
    make_private(path)?;
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

/// Creates the file 0600 if it does not exist, and takes group and other permissions away from
/// it and from its `-wal` and `-shm` where they exist. A file that cannot be created is left to
/// SQLite to report, as an [`StoreError::Open`] like any unopenable path.
#[cfg(unix)]
fn make_private(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

    let failed = |source| StoreError::NotPrivate {
        path: path.to_owned(),
        source,
    };
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        // An existing file is the ledger: never truncated.
        .truncate(false)
        .mode(0o600)
        .open(path);
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let mut shm = path.as_os_str().to_owned();
    shm.push("-shm");
    for file in [path.as_os_str(), &wal, &shm] {
        // A file that is not there (or cannot be looked at) is SQLite's to create or report.
        if let Ok(meta) = std::fs::metadata(file)
            && meta.permissions().mode() & 0o077 != 0
        {
            let mode = meta.permissions().mode() & 0o700;
            std::fs::set_permissions(file, std::fs::Permissions::from_mode(mode))
                .map_err(failed)?;
        }
    }
    Ok(())
}

#[cfg(not(unix))]
fn make_private(_: &Path) -> Result<(), StoreError> {
    Ok(())
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

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use countersign_core::Ledger;

    use crate::test_support::nonce;
    use crate::{Store, StoreOptions};

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    fn sidecars(db: &Path) -> [std::path::PathBuf; 3] {
        let with = |suffix: &str| {
            let mut p = db.as_os_str().to_owned();
            p.push(suffix);
            std::path::PathBuf::from(p)
        };
        [db.to_owned(), with("-wal"), with("-shm")]
    }

    #[test]
    fn the_file_its_wal_and_its_shm_are_0600_after_a_write() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("desk.sqlite");
        let mut store = Store::open(&db, StoreOptions::default()).unwrap();
        store.spend(&nonce(1), 10).unwrap();
        // The connection is open: SQLite keeps the -wal and -shm while it is.
        for file in sidecars(&db) {
            assert!(file.exists(), "{} is missing", file.display());
            assert_eq!(mode(&file), 0o600, "{}", file.display());
        }
    }

    #[test]
    fn an_existing_file_others_could_read_is_made_0600_with_its_wal_and_shm() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("desk.sqlite");
        let mut first = Store::open(&db, StoreOptions::default()).unwrap();
        first.spend(&nonce(1), 10).unwrap();
        // Loosened while the first connection keeps the -wal and -shm, as an older build or a
        // careless copy could leave them.
        for file in sidecars(&db) {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let mut second = Store::open(&db, StoreOptions::default()).unwrap();
        second.spend(&nonce(2), 10).unwrap();
        for file in sidecars(&db) {
            assert_eq!(mode(&file), 0o600, "{}", file.display());
        }
    }
}
