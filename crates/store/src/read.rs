//! Reading the history from outside the desk, without writing a byte: `countersign history`.
//!
//! [`Store::open`](crate::Store::open) creates, configures and migrates the file, which only the
//! desk should do: a command-line tool that did it would bring the file to its own schema under
//! a running desk of another version, or create one where none was. A [`HistoryReader`] opens the
//! file read-only (SQLite's `SQLITE_OPEN_READ_ONLY`, no journal-mode switch, no migration) and
//! reads it only when it is a Countersign store whose schema this build knows; a file of a newer
//! Countersign or of another program is refused with the same errors `Store::open` gives, and a
//! file nothing was written to yet reads as an empty history. (Reading a WAL file, SQLite may
//! create its empty `-wal` and `-shm` beside it, as any reader does; the file itself is never
//! written.)

use std::path::{Path, PathBuf};

use countersign_core::chain::{Break, Intact, Walk};
use countersign_core::telemetry::ConfirmEvent;
use rusqlite::{Connection, OpenFlags};

use crate::error::open_error;
use crate::history::{Heads, Recorded, StoredLink};
use crate::schema::{CHAIN_VERSION, EXPORT_VERSION};
use crate::{APPLICATION_ID, HistoryFilter, SCHEMA_VERSION, StoreError, StoreOptions, history};

/// The history of the desk's file, opened read-only.
#[derive(Debug)]
pub struct HistoryReader {
    /// `None`: the file has no schema yet (nothing was ever written to it).
    conn: Option<Connection>,
    /// Its schema version.
    version: i64,
    path: PathBuf,
}

impl HistoryReader {
    /// Opens the file at `path` read-only, refusing one that is not a Countersign store
    /// ([`StoreError::NotAStore`]) or whose schema is newer than this build knows
    /// ([`StoreError::NewerSchema`]). A missing file is an [`StoreError::Open`]; nothing is ever
    /// created, converted or migrated.
    pub fn open(path: impl Into<PathBuf>, options: &StoreOptions) -> Result<Self, StoreError> {
        let path = path.into();
        // No URI interpretation: the path is a path, whatever it starts with.
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&path, flags)
            .map_err(open_error(&path, "opening the file read-only"))?;
        conn.busy_timeout(options.busy_timeout)
            .map_err(open_error(&path, "setting the busy timeout"))?;
        let version = known_version(&conn, &path)?;
        Ok(HistoryReader {
            conn: (version > 0).then_some(conn),
            version,
            path,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every event recorded at or after `since` and before `until` (ms since the epoch), oldest
    /// first, handed to `each` one at a time as it is read (an export: a year of history is
    /// never held in memory), with its place in the chain. Read as one snapshot, so the signed
    /// heads answered with the count are those of the same moment (a desk writing meanwhile
    /// changes nothing of what is read). Stops at the first error, the store's or `each`'s.
    pub fn each_between<E: From<StoreError>>(
        &self,
        since: Option<u64>,
        until: Option<u64>,
        each: impl FnMut(Recorded) -> Result<(), E>,
    ) -> Result<(u64, Heads), E> {
        let Some(conn) = &self.conn else {
            return Ok((0, Heads::default()));
        };
        let snapshot = conn.unchecked_transaction().map_err(StoreError::from)?;
        let n = history::each_between(&snapshot, self.is_chained(), since, until, each)?;
        let heads = if self.is_chained() {
            history::heads(&snapshot)?
        } else {
            Heads::default()
        };
        snapshot.commit().map_err(StoreError::from)?;
        Ok((n, heads))
    }

    /// Whether the file's schema has the history's chain (a file of an older desk has not).
    pub fn is_chained(&self) -> bool {
        self.version >= CHAIN_VERSION
    }

    /// Reads the whole chain as one snapshot (a desk writing meanwhile changes nothing of what
    /// is read): `each` is handed every row exactly as stored, in the order recorded, and the
    /// signed heads the file keeps are answered once every row was read. A file whose schema
    /// has no chain yet hands nothing and has no heads.
    pub fn each_link<E: From<StoreError>>(
        &self,
        each: impl FnMut(StoredLink) -> Result<(), E>,
    ) -> Result<Heads, E> {
        let Some(conn) = self.conn.as_ref().filter(|_| self.is_chained()) else {
            return Ok(Heads::default());
        };
        // One read transaction: the rows and the heads of the same moment.
        let snapshot = conn.unchecked_transaction().map_err(StoreError::from)?;
        history::each_link(&snapshot, each)?;
        let heads = history::heads(&snapshot)?;
        snapshot.commit().map_err(StoreError::from)?;
        Ok(heads)
    }

    /// Checks the file's chain (see [`countersign_core::chain`]) with `walk`: every event against
    /// its hash and the one before, the oldest against the start (or its signed prune mark), the
    /// newest against the signed head, and the chain against what `walk` was told to expect
    /// (heads exported earlier, events a collector saw: they catch a tail cut off with the head
    /// signed again). Signatures are checked against the key `walk` was given, else against the
    /// key the file's head names. The outer
    /// error is the store's (the file cannot be read); the inner one names the first event at
    /// which the chain breaks.
    pub fn verify(&self, walk: Walk) -> Result<Result<Intact, Break>, StoreError> {
        if self.conn.is_some() && !self.is_chained() {
            return Ok(Err(Break::Unreadable {
                at: "the file".into(),
                reason: format!(
                    "its schema (version {}) is from before the history was chained; the desk \
                     converts it at its next start",
                    self.version
                ),
            }));
        }
        match &self.conn {
            Some(conn) => history::verify(conn, walk),
            None => Ok(walk.finish(None, None, false)),
        }
    }

    /// How far telemetry `sink` got and how many events wait for it (`None`: no such sink, or
    /// a file from before sinks existed).
    pub fn export_status(&self, sink: &str) -> Result<Option<crate::ExportStatus>, StoreError> {
        match self
            .conn
            .as_ref()
            .filter(|_| self.version >= EXPORT_VERSION)
        {
            Some(conn) => crate::sink::status(conn, sink),
            None => Ok(None),
        }
    }

    /// The signed heads the file keeps now.
    pub fn heads(&self) -> Result<Heads, StoreError> {
        match self.conn.as_ref().filter(|_| self.is_chained()) {
            Some(conn) => history::heads(conn),
            None => Ok(Heads::default()),
        }
    }

    /// Recorded events that pass `filter`, newest first, as [`Store::history`](crate::Store::history)
    /// returns them.
    pub fn history(&self, filter: &HistoryFilter) -> Result<Vec<ConfirmEvent>, StoreError> {
        match &self.conn {
            Some(conn) => history::select(conn, filter),
            None => Ok(Vec::new()),
        }
    }
}

/// The file's schema version, when it is one this build can read: 0 (nothing written yet) or a
/// version of a Countersign store up to [`SCHEMA_VERSION`]. The history table has kept its
/// columns since version 1.
fn known_version(conn: &Connection, path: &Path) -> Result<i64, StoreError> {
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(open_error(path, "reading the schema version"))?;
    let app: i32 = conn
        .query_row("PRAGMA application_id", [], |row| row.get(0))
        .map_err(open_error(path, "reading the application id"))?;
    let not_ours = |reason: String| StoreError::NotAStore {
        path: path.to_owned(),
        reason,
    };
    if version < 0 {
        return Err(not_ours(format!("user_version is {version}")));
    }
    if version == 0 {
        // Nothing written yet, unless another program's tables are there.
        let tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE type = 'table'",
                [],
                |row| row.get(0),
            )
            .map_err(open_error(path, "reading the schema"))?;
        if app != 0 && app != APPLICATION_ID {
            return Err(not_ours(format!("application_id is {app:#x}")));
        }
        if tables > 0 {
            return Err(not_ours(format!("{tables} tables and no schema version")));
        }
        return Ok(0);
    }
    if app != APPLICATION_ID {
        return Err(not_ours(format!("application_id is {app:#x}")));
    }
    if version > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: path.to_owned(),
            found: version,
            known: SCHEMA_VERSION,
        });
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use countersign_core::telemetry::EventKind;

    use super::*;
    use crate::test_support::{event, raw, temp_store};

    #[test]
    fn reads_what_the_store_recorded_newest_first_with_the_filter() {
        let (dir, mut store) = temp_store();
        store.record(&event(10, EventKind::Issued)).unwrap();
        store.record(&event(20, EventKind::Accepted)).unwrap();
        let mut other = event(30, EventKind::Denied);
        other.tool = "query".into();
        store.record(&other).unwrap();
        let reader = HistoryReader::open(store.path(), &StoreOptions::default()).unwrap();
        assert_eq!(
            reader.history(&HistoryFilter::all()).unwrap(),
            store.history(&HistoryFilter::all()).unwrap()
        );
        let execute = HistoryFilter::all().tool("execute").limit(1);
        assert_eq!(
            reader.history(&execute).unwrap(),
            store.history(&execute).unwrap()
        );
        assert_eq!(reader.history(&execute).unwrap()[0].at_ms, 20);
        drop(dir);
    }

    #[test]
    fn reads_a_closed_store_and_writes_nothing() {
        let (_dir, mut store) = temp_store();
        store.record(&event(10, EventKind::Issued)).unwrap();
        let path = store.path().to_owned();
        // The desk closed: its WAL checkpointed and removed.
        drop(store);
        let before = std::fs::read(&path).unwrap();
        let reader = HistoryReader::open(&path, &StoreOptions::default()).unwrap();
        assert_eq!(reader.history(&HistoryFilter::all()).unwrap().len(), 1);
        drop(reader);
        // (SQLite may leave an empty `-wal` and `-shm` beside it, as any reader of a WAL file.)
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    #[test]
    fn an_empty_file_is_an_empty_history_and_stays_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("desk.sqlite");
        std::fs::write(&path, b"").unwrap();
        let reader = HistoryReader::open(&path, &StoreOptions::default()).unwrap();
        assert!(reader.history(&HistoryFilter::all()).unwrap().is_empty());
        drop(reader);
        assert_eq!(std::fs::read(&path).unwrap(), b"");
    }

    #[test]
    fn a_missing_file_is_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("desk.sqlite");
        let err = HistoryReader::open(&path, &StoreOptions::default()).unwrap_err();
        assert!(matches!(err, StoreError::Open { .. }), "{err:?}");
        assert!(!path.exists());
    }

    #[test]
    fn a_newer_schema_is_refused_and_left_as_it_was() {
        let (_dir, store) = temp_store();
        raw(&store).pragma_update(None, "user_version", 99).unwrap();
        let err = HistoryReader::open(store.path(), &StoreOptions::default()).unwrap_err();
        assert!(
            matches!(err, StoreError::NewerSchema { found: 99, .. }),
            "{err:?}"
        );
        let version: i64 = raw(&store)
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, 99);
    }

    #[test]
    fn another_programs_database_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for (i, sql) in [
            "PRAGMA application_id = 1234; CREATE TABLE notes (body TEXT);",
            "CREATE TABLE history (body TEXT);",
            "PRAGMA user_version = 3; CREATE TABLE history (body TEXT);",
        ]
        .into_iter()
        .enumerate()
        {
            let path = dir.path().join(format!("other-{i}.db"));
            Connection::open(&path).unwrap().execute_batch(sql).unwrap();
            let err = HistoryReader::open(&path, &StoreOptions::default()).unwrap_err();
            assert!(
                matches!(err, StoreError::NotAStore { .. }),
                "{sql}: {err:?}"
            );
        }
    }
}
