//! What `execute` would do, found out without doing it.
//!
//! A person approving `DELETE FROM users WHERE id = 7` should type and read what it changes, not
//! the tool's name. So the desk asks SQLite: each statement is prepared with an authorizer that
//! records every table it would write, the writes its triggers would make (SQLite codes a
//! trigger's body into the statement while preparing it, so they are reported too), and every
//! effect that is not a table's rows (`ATTACH`, a `PRAGMA`, transaction control). A statement SQLite
//! does not report as read-only but attributes to nothing (`VACUUM`, which asks nothing while
//! prepared) is named as unattributed: [`Described::target`] never reports less than is written.
//!
//! A later statement of a batch can only be prepared once the earlier ones have run (it may use a
//! table they create), and the preview counts rows gained, lost and changed per table. Both run
//! the statements inside one transaction that is always rolled back, on a connection of its own
//! (never the read-only one `query` uses):
//!
//! - the authorizer denies anything that could end the transaction or reach past the file
//!   (`BEGIN`/`COMMIT`/`ROLLBACK`, savepoints, `ATTACH`, `DETACH`, a `PRAGMA`), and a statement
//!   SQLite cannot attribute is never run;
//! - a commit hook turns any commit on this connection into a rollback;
//! - before each statement runs, the connection must still be inside the transaction (an
//!   `INSERT OR ROLLBACK` or a trigger's `RAISE(ROLLBACK)` ends it, and what follows would run on
//!   its own and commit): otherwise the rehearsal stops there;
//! - a progress handler interrupts it at its deadline, and the file lock is waited for briefly.
//!
//! What a plan may bind, and what it may not. A plan binds what the operation will do, so only
//! facts of the SQL and of the database's contents and schema go into [`Described::target`]: the
//! tables a statement writes, a statement SQLite refuses (no such table, a syntax error, a
//! constraint the rows break: `execute` stops there too, so what follows is not run and not
//! named), an effect nothing can be attributed to (`unattributed`), a statement a rehearsal must
//! not run and the `unknown` statements after it, more than [`MAX_STATEMENTS`] statements. The
//! same SQL on the same file describes the same way every time (a file whose rows or schema
//! change plans differently, which is what the confirm's second description is for). What
//! depends on the moment is not a fact: [`Stopped::TimeLimit`], [`Stopped::Busy`] (another
//! connection held the lock past the brief wait) and [`Stopped::NoDatabase`] (the file could not
//! be opened, read or written: an I/O error, a full disk, memory) say "I could not find out", and
//! [`Stopped::is_transient`] tells them apart. Whoever plans must answer those as an error of the
//! call (retry shortly), never hash a placeholder for them: the same call would plan differently
//! from one moment to the next, or a person would approve `unknown`.
#![allow(unsafe_code)] // this module reaches the OS through libc; each unsafe block says why it is sound

use countersign_core::sync::lock;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};

/// How long a rehearsal may take, preparing and running together.
pub const TIME_LIMIT: Duration = Duration::from_secs(2);

/// The most statements of one batch that are described; more make the description incomplete.
pub const MAX_STATEMENTS: usize = 64;

/// The most rows of one table compared row by row; a larger table is only counted.
pub const MAX_COMPARED_ROWS: u64 = 20_000;

/// The most tables whose rows a preview counts.
pub const MAX_TABLES: usize = 16;

/// How long to wait for another writer's lock on the file.
const BUSY_WAIT: Duration = Duration::from_millis(300);

/// The busy handler of a rehearsal's connection: tries again as soon as the tools' writers do
/// (which would otherwise take the lock first, every time, while it slept), for [`BUSY_WAIT`].
fn retry_briefly(tries: i32) -> bool {
    crate::retry_within(tries, BUSY_WAIT)
}

/// Whether to run the statements (and count rows) or only describe them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Name what the statements write: the last statement is only prepared, never run.
    Describe,
    /// Also run every statement, counting rows per table, then roll back.
    Preview,
}

/// One statement of the batch, as SQLite reported it while preparing it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Statement {
    /// What kind of statement it is: `DELETE`, `INSERT`, `CREATE TABLE`, `PRAGMA`...
    pub kind: String,
    /// The tables (and views) it writes itself, `schema.name` outside `main`, sorted.
    pub writes: BTreeSet<String>,
    /// The tables its triggers write.
    pub by_triggers: BTreeSet<String>,
    /// What it does beyond a table's rows: `ATTACH`, `PRAGMA user_version`, `unattributed`.
    pub effects: BTreeSet<String>,
}

/// Why a rehearsal stopped before the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// The time limit passed.
    TimeLimit,
    /// Another connection held the file's lock.
    Busy,
    /// A statement does something a rehearsal must not do (it is named).
    NotRehearsable(String),
    /// SQLite refused a statement (bad SQL, a missing table, a constraint).
    Failed(String),
    /// More statements than [`MAX_STATEMENTS`].
    TooMany,
    /// The database could not be opened, read or written just now (an I/O error, a full disk,
    /// memory, a file that is not a database).
    NoDatabase(String),
}

impl Stopped {
    /// A stable code for the window.
    pub fn code(&self) -> &'static str {
        match self {
            Stopped::TimeLimit => "time_limit",
            Stopped::Busy => "database_busy",
            Stopped::NotRehearsable(_) => "not_rehearsable",
            Stopped::Failed(_) => "statement_failed",
            Stopped::TooMany => "too_many_statements",
            Stopped::NoDatabase(_) => "no_database",
        }
    }

    /// Whether the stop says something about the moment (a time limit, a lock, an I/O error)
    /// rather than about the SQL and the database: such a stop is never part of a plan.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Stopped::TimeLimit | Stopped::Busy | Stopped::NoDatabase(_)
        )
    }

    /// What to tell the person besides the code.
    pub fn detail(&self) -> String {
        match self {
            Stopped::TimeLimit => format!("it ran past {} s", TIME_LIMIT.as_secs()),
            Stopped::Busy => "another connection is writing the database".to_owned(),
            Stopped::NotRehearsable(what) => {
                format!("{what} cannot run inside a rolled-back transaction")
            }
            Stopped::Failed(message) | Stopped::NoDatabase(message) => message.clone(),
            Stopped::TooMany => format!("more than {MAX_STATEMENTS} statements"),
        }
    }
}

/// Rows of one table before and after the statements ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableRows {
    /// The table, `schema.name` outside `main`.
    pub table: String,
    /// Rows before.
    pub before: u64,
    /// Rows after.
    pub after: u64,
    /// Rows that are new.
    pub gained: u64,
    /// Rows that are gone.
    pub lost: u64,
    /// Rows kept whose values differ.
    pub changed: u64,
    /// Only counted (too many rows to compare, or a table without rowids): `gained` and `lost`
    /// are then the difference of the counts, and `changed` is unknown (0).
    pub counted_only: bool,
}

/// What a batch of SQL writes, as far as SQLite reported it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Described {
    /// Each statement described, in order.
    pub statements: Vec<Statement>,
    /// Set when the batch was not described to its end: what follows is unknown.
    pub stopped: Option<Stopped>,
    /// In [`Mode::Preview`], when every statement ran: the rows of each table written.
    pub rows: Option<Vec<TableRows>>,
    /// Whether every statement of the batch was named (a later one may be unknown when an
    /// earlier one could not be prepared or run).
    pub complete: bool,
}

impl Described {
    /// Why the description stopped, when that says something about the moment and not about the
    /// SQL (see [`Stopped::is_transient`]): the batch could not be described now, so there is no
    /// plan to name; ask again.
    pub fn transient(&self) -> Option<&Stopped> {
        self.stopped.as_ref().filter(|s| s.is_transient())
    }

    /// What the person types and reads as the target: every table written (by a statement or
    /// its triggers) and every other effect, sorted; `unknown` when the batch could not be
    /// described to its end; `nothing` only when it was and writes nothing.
    pub fn target(&self) -> String {
        let mut all = BTreeSet::new();
        for s in &self.statements {
            all.extend(s.writes.iter().cloned());
            all.extend(s.by_triggers.iter().cloned());
            all.extend(s.effects.iter().cloned());
        }
        // Statements never prepared write what nobody knows.
        if !self.complete {
            all.insert("unknown".to_owned());
        }
        if all.is_empty() {
            return "nothing".to_owned();
        }
        all.into_iter().collect::<Vec<_>>().join(", ")
    }

    /// One line per statement kind and what it writes: `DELETE from users`,
    /// `INSERT into orders (its triggers write audit)`.
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = self
            .statements
            .iter()
            .take(8)
            .map(|s| {
                let mut tables: Vec<&str> = s.writes.iter().map(String::as_str).collect();
                tables.extend(s.effects.iter().map(String::as_str));
                let preposition = match s.kind.as_str() {
                    "DELETE" => " from ",
                    "INSERT" | "REPLACE" => " into ",
                    _ => " ",
                };
                let mut line = if tables.is_empty() {
                    format!("{} (writes no table)", s.kind)
                } else {
                    format!("{}{preposition}{}", s.kind, tables.join(", "))
                };
                if !s.by_triggers.is_empty() {
                    let written: Vec<&str> = s.by_triggers.iter().map(String::as_str).collect();
                    line.push_str(&format!(" (its triggers write {})", written.join(", ")));
                }
                line
            })
            .collect();
        if self.statements.len() > 8 {
            parts.push(format!("and {} more statements", self.statements.len() - 8));
        }
        if !self.complete {
            parts.push("and statements not described".to_owned());
        }
        if parts.is_empty() {
            return "SQL that does nothing".to_owned();
        }
        parts.join("; ")
    }
}

/// What the authorizer saw for the statement being prepared.
#[derive(Default)]
struct Seen {
    /// The first action of the statement itself (not of a trigger), as a kind.
    kind: Option<String>,
    writes: BTreeSet<String>,
    by_triggers: BTreeSet<String>,
    effects: BTreeSet<String>,
    /// Whether the statement changes the schema (its writes to `sqlite_schema` are bookkeeping).
    ddl: bool,
    /// What the rehearsal refused, if anything.
    refused: Option<String>,
}

/// A table as the person reads it: `name` in `main`, `schema.name` elsewhere; a name holding a
/// dot, a quote or outer space is quoted, so no name in `main` reads as another schema's.
fn qualified(database: Option<&str>, name: &str) -> String {
    let name = if name.contains(['.', '"']) || name.trim() != name || name.is_empty() {
        quoted(name)
    } else {
        name.to_owned()
    };
    match database {
        None | Some("main") => name,
        Some(db) => format!("{db}.{name}"),
    }
}

const SCHEMA_TABLES: &[&str] = &[
    "sqlite_master",
    "sqlite_schema",
    "sqlite_temp_master",
    "sqlite_temp_schema",
];

/// Records one action; returns whether the rehearsal must refuse it.
fn record(seen: &mut Seen, context: &AuthContext<'_>) -> bool {
    let db = context.database_name;
    let by_trigger = context.accessor.is_some();
    let mut kind = None;
    let mut write = None;
    let mut effect = None;
    let mut refuse = false;
    match context.action {
        AuthAction::Insert { table_name } => {
            kind = Some("INSERT");
            write = Some(qualified(db, table_name));
        }
        AuthAction::Update { table_name, .. } => {
            kind = Some("UPDATE");
            write = Some(qualified(db, table_name));
        }
        AuthAction::Delete { table_name } => {
            kind = Some("DELETE");
            write = Some(qualified(db, table_name));
        }
        AuthAction::CreateTable { table_name } | AuthAction::CreateTempTable { table_name } => {
            kind = Some("CREATE TABLE");
            write = Some(qualified(db, table_name));
        }
        AuthAction::CreateIndex { table_name, .. }
        | AuthAction::CreateTempIndex { table_name, .. } => {
            kind = Some("CREATE INDEX");
            write = Some(qualified(db, table_name));
        }
        AuthAction::CreateTrigger { table_name, .. } => {
            kind = Some("CREATE TRIGGER");
            write = Some(qualified(db, table_name));
        }
        // A temporary trigger lives in `temp` but may watch a table of `main`: named bare.
        AuthAction::CreateTempTrigger { table_name, .. } => {
            kind = Some("CREATE TRIGGER");
            write = Some(qualified(None, table_name));
        }
        AuthAction::CreateView { view_name } | AuthAction::CreateTempView { view_name } => {
            kind = Some("CREATE VIEW");
            write = Some(qualified(db, view_name));
        }
        AuthAction::DropTable { table_name } | AuthAction::DropTempTable { table_name } => {
            kind = Some("DROP TABLE");
            write = Some(qualified(db, table_name));
        }
        AuthAction::DropIndex { table_name, .. } | AuthAction::DropTempIndex { table_name, .. } => {
            kind = Some("DROP INDEX");
            write = Some(qualified(db, table_name));
        }
        AuthAction::DropTrigger { table_name, .. } => {
            kind = Some("DROP TRIGGER");
            write = Some(qualified(db, table_name));
        }
        AuthAction::DropTempTrigger { table_name, .. } => {
            kind = Some("DROP TRIGGER");
            write = Some(qualified(None, table_name));
        }
        AuthAction::DropView { view_name } | AuthAction::DropTempView { view_name } => {
            kind = Some("DROP VIEW");
            write = Some(qualified(db, view_name));
        }
        AuthAction::AlterTable {
            database_name,
            table_name,
        } => {
            kind = Some("ALTER TABLE");
            write = Some(qualified(Some(database_name), table_name));
        }
        AuthAction::CreateVtable { table_name, .. } => {
            kind = Some("CREATE VIRTUAL TABLE");
            write = Some(qualified(db, table_name));
        }
        AuthAction::DropVtable { table_name, .. } => {
            kind = Some("DROP TABLE");
            write = Some(qualified(db, table_name));
        }
        AuthAction::Reindex { .. } => {
            kind = Some("REINDEX");
            effect = Some("REINDEX".to_owned());
        }
        AuthAction::Analyze { .. } => {
            kind = Some("ANALYZE");
            effect = Some("ANALYZE".to_owned());
        }
        AuthAction::Pragma { pragma_name, .. } => {
            kind = Some("PRAGMA");
            effect = Some(format!("PRAGMA {}", pragma_name.to_ascii_lowercase()));
            refuse = true;
        }
        AuthAction::Attach { .. } => {
            kind = Some("ATTACH");
            effect = Some("ATTACH".to_owned());
            refuse = true;
        }
        AuthAction::Detach { .. } => {
            kind = Some("DETACH");
            effect = Some("DETACH".to_owned());
            refuse = true;
        }
        AuthAction::Transaction { .. } => {
            kind = Some("transaction control");
            effect = Some("transaction control".to_owned());
            refuse = true;
        }
        AuthAction::Savepoint { .. } => {
            kind = Some("SAVEPOINT");
            effect = Some("SAVEPOINT".to_owned());
            refuse = true;
        }
        AuthAction::Select => kind = Some("SELECT"),
        AuthAction::Read { .. } | AuthAction::Function { .. } | AuthAction::Recursive => {}
        // Whatever a later SQLite adds is named, and never rehearsed.
        _ => {
            effect = Some("unknown action".to_owned());
            refuse = true;
        }
    }
    if let Some(kind) = kind
        && !by_trigger
    {
        if kind.starts_with("CREATE") || kind.starts_with("DROP") || kind.starts_with("ALTER") {
            seen.ddl = true;
        }
        // A statement's own write names it over the SELECT that an INSERT ... SELECT starts with,
        // and a schema change over the write to sqlite_schema that a CREATE first asks for.
        let is_write = write.is_some() || effect.is_some();
        let is_ddl =
            |k: &str| k.starts_with("CREATE") || k.starts_with("DROP") || k.starts_with("ALTER");
        // ANALYZE first creates sqlite_stat1 when it is missing: it is still an ANALYZE.
        let stronger = match seen.kind.as_deref() {
            _ if kind == "ANALYZE" => true,
            Some("ANALYZE") => false,
            None => true,
            Some("SELECT") => is_write,
            Some(current) => is_ddl(kind) && matches!(current, "INSERT" | "UPDATE" | "DELETE"),
        };
        if stronger {
            seen.kind = Some(kind.to_owned());
        }
    }
    if let Some(table) = write {
        if by_trigger {
            seen.by_triggers.insert(table);
        } else {
            seen.writes.insert(table);
        }
    }
    if let Some(effect) = effect {
        if refuse && seen.refused.is_none() {
            seen.refused = Some(effect.clone());
        }
        seen.effects.insert(effect);
    }
    refuse
}

impl Seen {
    fn statement(&mut self, readonly: bool, sql: &str) -> Statement {
        let mut seen = std::mem::take(self);
        // Building a new index is how SQLite reports CREATE INDEX's own work, not a REINDEX.
        if seen.kind.as_deref() == Some("CREATE INDEX") {
            seen.effects.remove("REINDEX");
        }
        if seen.ddl {
            for t in SCHEMA_TABLES {
                seen.writes.remove(*t);
                seen.writes.remove(&format!("temp.{t}"));
            }
        }
        if !readonly && seen.writes.is_empty() && seen.effects.is_empty() {
            seen.effects.insert("unattributed".to_owned());
        }
        Statement {
            kind: seen.kind.unwrap_or_else(|| first_word(sql)),
            writes: seen.writes,
            by_triggers: seen.by_triggers,
            effects: seen.effects,
        }
    }
}

/// The statement's first word, upper case, comments skipped: what names a statement the
/// authorizer saw nothing of (`VACUUM`).
fn first_word(sql: &str) -> String {
    let mut rest = sql.trim_start();
    loop {
        if let Some(after) = rest.strip_prefix("--") {
            rest = after.split_once('\n').map_or("", |(_, r)| r).trim_start();
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.split_once("*/").map_or("", |(_, r)| r).trim_start();
        } else {
            break;
        }
    }
    let word: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .take(16)
        .collect();
    if word.is_empty() {
        "SQL".to_owned()
    } else {
        word.to_ascii_uppercase()
    }
}

/// Row snapshots, per table: rowid → hash of the row, or only a count.
enum Snapshot {
    Missing,
    Rows(HashMap<i64, u64>),
    Counted(u64),
}

impl Snapshot {
    fn len(&self) -> u64 {
        match self {
            Snapshot::Missing => 0,
            Snapshot::Rows(rows) => rows.len() as u64,
            Snapshot::Counted(n) => *n,
        }
    }
}

fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `schema.name` (as [`qualified`] writes it) as a schema and a name.
fn table_sql(table: &str) -> (String, String) {
    let (db, name) = match table.strip_prefix("temp.") {
        Some(name) => ("temp", name),
        None => ("main", table),
    };
    let name = match name.strip_prefix('"').and_then(|n| n.strip_suffix('"')) {
        Some(inner) => inner.replace("\"\"", "\""),
        None => name.to_owned(),
    };
    (db.to_owned(), name)
}

fn snapshot(conn: &Connection, table: &str) -> rusqlite::Result<Snapshot> {
    let (db, name) = table_sql(table);
    let is_table: bool = conn
        .query_row(
            &format!(
                "SELECT count(*) FROM {}.sqlite_schema WHERE type = 'table' AND name = ?1",
                quoted(&db)
            ),
            [&name],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n > 0)?;
    if !is_table {
        return Ok(Snapshot::Missing);
    }
    let from = format!("{}.{}", quoted(&db), quoted(&name));
    let count: i64 = conn.query_row(&format!("SELECT count(*) FROM {from}"), [], |r| r.get(0))?;
    let count = count.max(0) as u64;
    if count > MAX_COMPARED_ROWS {
        return Ok(Snapshot::Counted(count));
    }
    let Ok(mut stmt) = conn.prepare(&format!("SELECT rowid, * FROM {from}")) else {
        // A table without rowids.
        return Ok(Snapshot::Counted(count));
    };
    let width = stmt.column_count();
    let mut rows = stmt.query([])?;
    let mut out = HashMap::new();
    while let Some(row) = rows.next()? {
        let rowid: i64 = row.get(0)?;
        let mut hasher = DefaultHasher::new();
        for i in 1..width {
            match row.get_ref(i)? {
                ValueRef::Null => 0u8.hash(&mut hasher),
                ValueRef::Integer(n) => (1u8, n).hash(&mut hasher),
                ValueRef::Real(f) => (2u8, f.to_bits()).hash(&mut hasher),
                ValueRef::Text(t) => (3u8, t).hash(&mut hasher),
                ValueRef::Blob(b) => (4u8, b).hash(&mut hasher),
            }
        }
        out.insert(rowid, hasher.finish());
    }
    Ok(Snapshot::Rows(out))
}

fn compare(table: &str, before: &Snapshot, after: &Snapshot) -> TableRows {
    let (b, a) = (before.len(), after.len());
    let counted = |counted_only| TableRows {
        table: table.to_owned(),
        before: b,
        after: a,
        gained: a.saturating_sub(b),
        lost: b.saturating_sub(a),
        changed: 0,
        counted_only,
    };
    match (before, after) {
        (Snapshot::Rows(old), Snapshot::Rows(new)) => {
            let lost = old.keys().filter(|k| !new.contains_key(k)).count() as u64;
            let gained = new.keys().filter(|k| !old.contains_key(k)).count() as u64;
            let changed = old
                .iter()
                .filter(|(k, h)| new.get(k).is_some_and(|n| n != *h))
                .count() as u64;
            TableRows {
                table: table.to_owned(),
                before: b,
                after: a,
                gained,
                lost,
                changed,
                counted_only: false,
            }
        }
        (Snapshot::Missing | Snapshot::Rows(_), Snapshot::Missing | Snapshot::Rows(_)) => {
            counted(false)
        }
        _ => counted(true),
    }
}

fn stopped_by(error: &rusqlite::Error, deadline: Instant) -> Stopped {
    if Instant::now() >= deadline {
        return Stopped::TimeLimit;
    }
    match error.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
            Stopped::Busy
        }
        Some(rusqlite::ErrorCode::OperationInterrupted) => Stopped::TimeLimit,
        // The file, the disk or memory, not the SQL: what the same SQL does is still unknown.
        Some(
            rusqlite::ErrorCode::SystemIoFailure
            | rusqlite::ErrorCode::DiskFull
            | rusqlite::ErrorCode::OutOfMemory
            | rusqlite::ErrorCode::CannotOpen
            | rusqlite::ErrorCode::FileLockingProtocolFailed
            | rusqlite::ErrorCode::DatabaseCorrupt
            | rusqlite::ErrorCode::NotADatabase
            | rusqlite::ErrorCode::PermissionDenied
            | rusqlite::ErrorCode::ReadOnly
            | rusqlite::ErrorCode::NoLargeFileSupport
            | rusqlite::ErrorCode::SchemaChanged,
        ) => Stopped::NoDatabase(error.to_string()),
        _ => Stopped::Failed(error.to_string()),
    }
}

/// The most SQL text a rehearsal splits into statements.
pub const MAX_SQL_BYTES: usize = 256 * 1024;

/// `sql` cut into its statements, as SQLite's own `sqlite3_complete` tells where one ends (a
/// trigger's body holds semicolons of its own); what trails without a final semicolon is the last.
/// Chunks with nothing but space and comments are left out.
fn split(sql: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, _) in sql.match_indices(';') {
        let chunk = &sql[start..=i];
        let Ok(text) = std::ffi::CString::new(chunk) else {
            break;
        };
        // SAFETY: `text` is a NUL-terminated string that outlives the call.
        if unsafe { rusqlite::ffi::sqlite3_complete(text.as_ptr()) } == 1 {
            out.push(chunk);
            start = i + 1;
        }
    }
    out.push(&sql[start..]);
    out.retain(|chunk| has_words(chunk));
    out
}

/// Whether `chunk` holds anything but space, semicolons and comments.
fn has_words(chunk: &str) -> bool {
    let mut rest = chunk;
    loop {
        rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
        if let Some(after) = rest.strip_prefix("--") {
            rest = after.split_once('\n').map_or("", |(_, r)| r);
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.split_once("*/").map_or("", |(_, r)| r);
        } else {
            return !rest.is_empty();
        }
    }
}

/// Describes (and in [`Mode::Preview`] rehearses) `sql` on the database at `db`, which must
/// exist. Nothing it does is ever committed.
pub fn rehearse(db: &Path, sql: &str, mode: Mode) -> Described {
    if let Some(refused) = refused_sql(sql) {
        return refused;
    }
    match open(db) {
        Ok(conn) => rehearse_on(&conn, sql, mode),
        Err(stopped) => stopped_before(stopped),
    }
}

/// SQL refused before any database is opened: too long, or holding a NUL.
fn refused_sql(sql: &str) -> Option<Described> {
    (sql.len() > MAX_SQL_BYTES || sql.contains('\0')).then(|| {
        stopped_before(Stopped::Failed(format!(
            "the SQL is longer than {MAX_SQL_BYTES} bytes or holds a NUL"
        )))
    })
}

fn stopped_before(stopped: Stopped) -> Described {
    Described {
        stopped: Some(stopped),
        ..Described::default()
    }
}

/// A connection for rehearsals on `db`, which must exist.
fn open(db: &Path) -> Result<Connection, Stopped> {
    Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| Stopped::NoDatabase(e.to_string()))
}

/// [`rehearse`] on a connection already open.
fn rehearse_on(conn: &Connection, sql: &str, mode: Mode) -> Described {
    let deadline = Instant::now() + TIME_LIMIT;
    let mut described = Described::default();
    let outcome = run(conn, sql, mode, deadline, &mut described);
    // Nothing commits: the hook already turns a commit into a rollback; roll back explicitly too
    // (the authorizer, which refuses transaction control, is gone first).
    conn.authorizer(None::<fn(AuthContext<'_>) -> Authorization>);
    if !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    if let Err(stopped) = outcome {
        described.stopped = Some(stopped);
        described.rows = None;
    }
    described
}

/// The most connections [`Kept`] holds open.
pub const MAX_KEPT: usize = 4;

/// Connections kept open between descriptions ([`Kept::describe`]), so that describing a call
/// does not open its database anew each time. A connection is taken again only while its path
/// still names the very file it opened (the same device and inode): a file replaced or deleted
/// since is opened anew, never described from the old one. It is kept only when it ended clean
/// (no transaction left open), and never on systems without file identities.
///
/// Descriptions only, never previews: a rolled-back batch leaves a connection's
/// `last_insert_rowid()` and `total_changes()` behind, and a preview shows what statements
/// return, where another call's rehearsal could be read. A description says only what the
/// statements write.
#[derive(Debug, Default)]
pub struct Kept {
    idle: Mutex<Vec<Idle>>,
}

struct Idle {
    db: std::path::PathBuf,
    file: (u64, u64),
    conn: Connection,
}

impl std::fmt::Debug for Idle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idle")
            .field("db", &self.db)
            .finish_non_exhaustive()
    }
}

/// The device and inode of the file at `db` now: `None` when there is none, or the system does
/// not say.
fn file_of(db: &Path) -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(db).ok().map(|m| (m.dev(), m.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = db;
        None
    }
}

impl Kept {
    /// [`rehearse`] in [`Mode::Describe`], on a connection kept from an earlier description of
    /// the same file when there is one.
    pub fn describe(&self, db: &Path, sql: &str) -> Described {
        let mode = Mode::Describe;
        if let Some(refused) = refused_sql(sql) {
            return refused;
        }
        let file = file_of(db);
        let taken = {
            let mut idle = lock(&self.idle);
            // A connection to a file no longer at its path goes.
            idle.retain(|i| i.db != db || Some(i.file) == file);
            idle.iter()
                .position(|i| i.db == db)
                .map(|at| idle.swap_remove(at).conn)
        };
        let Some(file) = file else {
            return rehearse(db, sql, mode);
        };
        let conn = match taken {
            Some(conn) => conn,
            None => match open(db) {
                Ok(conn) => conn,
                Err(stopped) => return stopped_before(stopped),
            },
        };
        let described = rehearse_on(&conn, sql, mode);
        // Opened, then checked: a file moved in between is described once more, never kept.
        let still = file_of(db) == Some(file);
        let clean =
            conn.is_autocommit() && !matches!(described.stopped, Some(Stopped::NoDatabase(_)));
        if still && clean {
            let mut idle = lock(&self.idle);
            if idle.len() < MAX_KEPT {
                idle.push(Idle {
                    db: db.to_owned(),
                    file,
                    conn,
                });
            }
        }
        described
    }
}

fn run(
    conn: &Connection,
    sql: &str,
    mode: Mode,
    deadline: Instant,
    described: &mut Described,
) -> Result<(), Stopped> {
    let chunks = split(sql);
    if chunks.len() > MAX_STATEMENTS {
        return Err(Stopped::TooMany);
    }
    let setup = |e: rusqlite::Error| Stopped::NoDatabase(e.to_string());
    conn.busy_handler(Some(retry_briefly)).map_err(setup)?;
    conn.commit_hook(Some(|| true));
    conn.progress_handler(1000, Some(move || Instant::now() >= deadline));
    conn.execute_batch("BEGIN").map_err(setup)?;
    // The read begins now, and with it the snapshot every statement below is prepared against:
    // a statement that reads the schema table makes SQLite check the file's schema against the
    // one this connection has in memory, and load it again if it changed. A connection kept
    // from an earlier description would otherwise prepare the last statement (never run, so
    // never checked) against the schema it saw then, blind to a trigger added since.
    conn.query_row("SELECT count(*) FROM sqlite_schema", [], |_| Ok(()))
        .map_err(|e| stopped_by(&e, deadline))?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let recorder = Arc::clone(&seen);
    conn.authorizer(Some(move |context: AuthContext<'_>| {
        let mut seen = lock(&recorder);
        if record(&mut seen, &context) {
            Authorization::Deny
        } else {
            Authorization::Allow
        }
    }));
    let take = |readonly: bool, text: &str| {
        let mut seen = lock(&seen);
        let refused = seen.refused.take();
        (seen.statement(readonly, text), refused)
    };
    let mut before: BTreeMap<String, Snapshot> = BTreeMap::new();
    for (i, chunk) in chunks.iter().enumerate() {
        let last = i + 1 == chunks.len();
        let prepared = conn.prepare(chunk);
        let mut stmt = match prepared {
            Ok(stmt) => stmt,
            Err(e) => {
                // Refused while preparing (a PRAGMA setting a value is refused before SQLite
                // acts on it): still named by what it asked for.
                let (statement, refused) = take(true, chunk);
                described.statements.push(statement);
                if let Some(what) = refused {
                    described.complete = last;
                    return Err(Stopped::NotRehearsable(what));
                }
                // SQLite refuses it now (a table that exists or is missing): run now, it fails the
                // same way, and `execute` stops at a batch's first failure, so nothing after it
                // runs. What it asked for before failing names it (over, never under, what it
                // writes), and the batch is described to its end. The plan is described again at
                // the confirm, so SQL whose state changed since the click is refused then.
                let stopped = stopped_by(&e, deadline);
                described.complete = matches!(stopped, Stopped::Failed(_));
                return Err(stopped);
            }
        };
        let (statement, refused) = take(stmt.readonly(), chunk);
        let refused = refused.or_else(|| {
            statement
                .effects
                .contains("unattributed")
                .then(|| statement.kind.clone())
        });
        described.statements.push(statement.clone());
        if let Some(what) = refused {
            described.complete = last;
            return Err(Stopped::NotRehearsable(what));
        }
        if mode == Mode::Describe && last {
            break;
        }
        if mode == Mode::Preview {
            for table in statement.writes.iter().chain(&statement.by_triggers) {
                if !before.contains_key(table) {
                    if before.len() == MAX_TABLES {
                        return Err(Stopped::Failed(format!(
                            "it writes more than {MAX_TABLES} tables"
                        )));
                    }
                    let shot = snapshot(conn, table).map_err(|e| stopped_by(&e, deadline))?;
                    before.insert(table.clone(), shot);
                }
            }
        }
        // Never run a statement outside the transaction: it would commit on its own.
        if conn.is_autocommit() {
            return Err(Stopped::NotRehearsable(
                "a statement that ends the transaction".to_owned(),
            ));
        }
        let mut rows = stmt.raw_query();
        loop {
            match rows.next() {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => {
                    // As above: a statement SQLite refuses ends the batch when it runs too.
                    let stopped = stopped_by(&e, deadline);
                    described.complete = matches!(stopped, Stopped::Failed(_));
                    return Err(stopped);
                }
            }
        }
        drop(rows);
        drop(stmt);
        if conn.is_autocommit() {
            return Err(Stopped::NotRehearsable(
                "a statement that ends the transaction".to_owned(),
            ));
        }
    }
    described.complete = true;
    if mode == Mode::Preview {
        let mut rows = Vec::new();
        for (table, old) in &before {
            let new = snapshot(conn, table).map_err(|e| stopped_by(&e, deadline))?;
            rows.push(compare(table, old, &new));
        }
        described.rows = Some(rows);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(setup: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.sqlite");
        Connection::open(&path)
            .unwrap()
            .execute_batch(setup)
            .unwrap();
        (dir, path)
    }

    #[test]
    fn a_kept_connection_serves_the_next_description_of_the_same_file_and_never_a_replaced_one() {
        let (dir, path) = db(USERS);
        let kept = Kept::default();
        let users = "INSERT INTO users (name) VALUES ('d')";
        for _ in 0..3 {
            let described = kept.describe(&path, users);
            assert_eq!(described.stopped, None);
            assert_eq!(described.target(), "users");
            assert_eq!(
                lock(&kept.idle).len(),
                1,
                "one connection, kept and taken again"
            );
        }
        // Another file put at the path: it is described, not the one the kept connection has.
        let other = dir.path().join("other.sqlite");
        Connection::open(&other)
            .unwrap()
            .execute_batch("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
            .unwrap();
        std::fs::rename(&other, &path).unwrap();
        let described = kept.describe(&path, "DELETE FROM invoices");
        assert_eq!(described.stopped, None, "{described:?}");
        assert_eq!(described.target(), "invoices");
        let described = kept.describe(&path, users);
        assert!(described.stopped.is_some(), "{described:?}");
        // Deleted: nothing to describe, and nothing kept of it.
        std::fs::remove_file(&path).unwrap();
        let described = kept.describe(&path, "DELETE FROM invoices");
        assert!(
            matches!(described.stopped, Some(Stopped::NoDatabase(_))),
            "{described:?}"
        );
        assert!(lock(&kept.idle).is_empty());
    }

    #[test]
    fn a_kept_connection_sees_a_trigger_added_since_its_last_description() {
        let (_dir, path) = db(USERS);
        let kept = Kept::default();
        let delete = "DELETE FROM users";
        assert_eq!(kept.describe(&path, delete).target(), "users");
        Connection::open(&path)
            .unwrap()
            .execute_batch(
                "CREATE TRIGGER t AFTER DELETE ON users BEGIN INSERT INTO audit VALUES (1); END;",
            )
            .unwrap();
        let described = kept.describe(&path, delete);
        assert_eq!(lock(&kept.idle).len(), 1, "the kept connection, again");
        assert_eq!(described.target(), "audit, users", "{described:?}");
    }

    #[test]
    fn a_description_on_a_kept_connection_still_commits_nothing() {
        let (_dir, path) = db(USERS);
        let before = contents(&path);
        let kept = Kept::default();
        // Every statement but the last runs (and is rolled back) while it is described.
        for sql in [
            "INSERT INTO users (name) VALUES ('d'); DELETE FROM audit; UPDATE users SET name = 'x'",
            "DELETE FROM users; INSERT INTO audit VALUES ('gone')",
        ] {
            let described = kept.describe(&path, sql);
            assert_eq!(described.stopped, None, "{described:?}");
        }
        assert_eq!(contents(&path), before);
        assert_eq!(lock(&kept.idle).len(), 1);
    }

    const USERS: &str = "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);
        INSERT INTO users (name) VALUES ('a'), ('b'), ('c');
        CREATE TABLE audit (what TEXT);";

    fn contents(path: &Path) -> Vec<String> {
        let conn = Connection::open(path).unwrap();
        let mut out = Vec::new();
        for sql in [
            "SELECT type || ' ' || name || ' ' || coalesce(sql, '') FROM sqlite_schema ORDER BY name",
            "SELECT id || ' ' || name FROM users ORDER BY id",
            "SELECT what FROM audit",
            "SELECT 'v' || user_version FROM pragma_user_version",
        ] {
            let mut stmt = conn.prepare(sql).unwrap();
            let rows = stmt.query_map([], |r| r.get::<_, String>(0)).unwrap();
            out.extend(rows.map(Result::unwrap));
        }
        out
    }

    #[test]
    fn delete_targets_the_table_it_deletes_from() {
        let (_d, path) = db(USERS);
        let d = rehearse(&path, "DELETE FROM users WHERE id = 2", Mode::Describe);
        assert_eq!(d.target(), "users");
        assert_eq!(d.summary(), "DELETE from users");
        assert!(d.complete && d.stopped.is_none());
    }

    #[test]
    fn preview_counts_rows_and_changes_nothing() {
        let (_d, path) = db(USERS);
        let before = contents(&path);
        let d = rehearse(
            &path,
            "DELETE FROM users WHERE id = 2; UPDATE users SET name = 'z' WHERE id = 3; INSERT INTO users (name) VALUES ('n'), ('m')",
            Mode::Preview,
        );
        assert_eq!(d.stopped, None);
        let rows = d.rows.unwrap();
        assert_eq!(
            rows,
            [TableRows {
                table: "users".into(),
                before: 3,
                after: 4,
                gained: 2,
                lost: 1,
                changed: 1,
                counted_only: false
            }]
        );
        assert_eq!(contents(&path), before);
    }

    #[test]
    fn triggers_writes_are_in_the_target() {
        let (_d, path) = db(&format!(
            "{USERS} CREATE TRIGGER noted AFTER DELETE ON users BEGIN INSERT INTO audit VALUES ('gone'); END;"
        ));
        let d = rehearse(&path, "DELETE FROM users", Mode::Preview);
        assert_eq!(d.target(), "audit, users");
        assert_eq!(d.summary(), "DELETE from users (its triggers write audit)");
        let rows = d.rows.unwrap();
        assert_eq!(rows[0].table, "audit");
        assert_eq!(rows[0].gained, 3);
        assert_eq!(rows[1].lost, 3);
    }

    #[test]
    fn a_view_with_an_instead_of_trigger_names_the_view_and_the_table() {
        let (_d, path) = db(&format!(
            "{USERS} CREATE VIEW names AS SELECT name FROM users;
             CREATE TRIGGER via INSTEAD OF INSERT ON names BEGIN INSERT INTO users (name) VALUES (new.name); END;"
        ));
        let d = rehearse(&path, "INSERT INTO names VALUES ('x')", Mode::Describe);
        assert_eq!(d.target(), "names, users");
    }

    #[test]
    fn insert_select_and_ctes_name_the_table_written_not_the_ones_read() {
        let (_d, path) = db(USERS);
        let d = rehearse(
            &path,
            "WITH x AS (SELECT name FROM users) INSERT INTO audit SELECT name FROM x",
            Mode::Describe,
        );
        assert_eq!(d.target(), "audit");
        assert_eq!(d.summary(), "INSERT into audit");
    }

    #[test]
    fn later_statements_are_described_after_earlier_ones_ran_and_nothing_stays() {
        let (_d, path) = db(USERS);
        let before = contents(&path);
        let d = rehearse(
            &path,
            "CREATE TABLE fresh (x); INSERT INTO fresh VALUES (1), (2); DROP TABLE audit",
            Mode::Preview,
        );
        assert_eq!(d.stopped, None, "{d:?}");
        assert_eq!(d.target(), "audit, fresh");
        let rows = d.rows.unwrap();
        assert_eq!(
            (rows[1].table.as_str(), rows[1].before, rows[1].after),
            ("fresh", 0, 2)
        );
        assert_eq!(contents(&path), before);
    }

    #[test]
    fn what_a_rehearsal_cannot_undo_is_named_and_never_run() {
        let (dir, path) = db(USERS);
        let before = contents(&path);
        let other = dir.path().join("other.sqlite");
        for (sql, target) in [
            ("PRAGMA user_version = 7", "PRAGMA user_version"),
            (
                &format!("ATTACH '{}' AS o", other.display()) as &str,
                "ATTACH",
            ),
            ("DELETE FROM users; COMMIT", "transaction control, users"),
            ("COMMIT; DELETE FROM users", "transaction control, unknown"),
            ("SAVEPOINT s; DELETE FROM users", "SAVEPOINT, unknown"),
            ("VACUUM", "unattributed"),
            ("PRAGMA hard_heap_limit = 1", "PRAGMA hard_heap_limit"),
        ] {
            for mode in [Mode::Describe, Mode::Preview] {
                let d = rehearse(&path, sql, mode);
                assert_eq!(d.target(), target, "{sql}");
                assert!(
                    matches!(d.stopped, Some(Stopped::NotRehearsable(_))),
                    "{sql}: {d:?}"
                );
                assert_eq!(d.rows, None);
            }
        }
        assert!(!other.exists(), "ATTACH never ran");
        assert_eq!(contents(&path), before);
    }

    #[test]
    fn a_statement_that_ends_the_transaction_stops_the_rehearsal_before_what_follows() {
        let (_d, path) = db(&format!(
            "{USERS} CREATE TABLE uniq (k INTEGER PRIMARY KEY); INSERT INTO uniq VALUES (1);"
        ));
        let before = contents(&path);
        let d = rehearse(
            &path,
            "INSERT OR ROLLBACK INTO uniq VALUES (1); DELETE FROM users",
            Mode::Preview,
        );
        assert!(d.stopped.is_some(), "{d:?}");
        assert_eq!(contents(&path), before, "the DELETE never ran on its own");
        let d = rehearse(
            &path,
            "INSERT OR ROLLBACK INTO uniq VALUES (1); DELETE FROM users",
            Mode::Describe,
        );
        // It fails here and would fail when run, which ends the batch: the DELETE never runs.
        assert_eq!(d.target(), "uniq");
        assert_eq!(contents(&path), before);
    }

    #[test]
    fn temp_tables_and_statements_that_write_nothing_are_named_honestly() {
        let (_d, path) = db(USERS);
        let d = rehearse(&path, "CREATE TEMP TABLE scratch (x)", Mode::Describe);
        assert_eq!(d.target(), "temp.scratch");
        let d = rehearse(
            &path,
            "CREATE TABLE \"temp.users\" (x); INSERT INTO \"temp.users\" VALUES (1)",
            Mode::Preview,
        );
        assert_eq!(d.target(), "\"temp.users\"");
        assert_eq!(d.rows.unwrap()[0].after, 1);
        let d = rehearse(&path, "SELECT 1", Mode::Describe);
        assert_eq!(d.target(), "nothing");
        assert_eq!(d.summary(), "SELECT (writes no table)");
        let d = rehearse(&path, "DELETE FROM missing", Mode::Describe);
        assert_eq!(d.target(), "nothing");
        // The failure is the preview's to show: the plan names the statement only.
        assert_eq!(d.summary(), "DELETE (writes no table)");
        assert!(matches!(d.stopped, Some(Stopped::Failed(_))));
        // A table that exists already: named by what it asked for before failing, so a replay of
        // an executed CREATE TABLE still plans as it did.
        let d = rehearse(&path, "CREATE TABLE users (x)", Mode::Describe);
        assert_eq!(d.target(), "users");
        // A batch stops at its first failure: what follows never runs.
        let d = rehearse(
            &path,
            "CREATE TABLE users (x); DELETE FROM users",
            Mode::Describe,
        );
        assert_eq!(d.target(), "users");
        assert_eq!(d.summary(), "CREATE TABLE users");
        let d = rehearse(
            &path,
            "CREATE TABLE fresh (id INTEGER PRIMARY KEY); INSERT INTO fresh VALUES (1)",
            Mode::Describe,
        );
        assert_eq!(d.summary(), "CREATE TABLE fresh; INSERT into fresh");
        // A CREATE TABLE ... AS SELECT plans the same before it ran and after (its replay).
        let ctas = "CREATE TABLE people AS SELECT 1 AS id, 'Ada' AS name";
        let before = rehearse(&path, ctas, Mode::Describe);
        Connection::open(&path)
            .unwrap()
            .execute_batch(ctas)
            .unwrap();
        let after = rehearse(&path, ctas, Mode::Describe);
        assert_eq!(
            (before.target(), before.summary()),
            ("people".to_owned(), "CREATE TABLE people".to_owned())
        );
        assert_eq!(
            (after.target(), after.summary()),
            (before.target(), before.summary())
        );
    }

    #[test]
    fn a_long_statement_is_cut_off_at_the_time_limit() {
        let (_d, path) = db(USERS);
        let before = contents(&path);
        let started = Instant::now();
        let d = rehearse(
            &path,
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) INSERT INTO audit SELECT i FROM n",
            Mode::Preview,
        );
        assert_eq!(d.stopped, Some(Stopped::TimeLimit));
        assert!(started.elapsed() < TIME_LIMIT * 3);
        assert_eq!(contents(&path), before);
    }

    #[test]
    fn a_lock_held_by_another_connection_is_transient_never_a_fact() {
        let (_d, path) = db(USERS);
        let other = Connection::open(&path).unwrap();
        // Another writer holds the write lock: a batch's first statement cannot run.
        other
            .execute_batch("BEGIN IMMEDIATE; INSERT INTO audit VALUES ('held')")
            .unwrap();
        let batch = "DELETE FROM users WHERE id = 1; DELETE FROM audit";
        let d = rehearse(&path, batch, Mode::Describe);
        assert_eq!(d.stopped, Some(Stopped::Busy), "{d:?}");
        assert_eq!(d.transient(), Some(&Stopped::Busy));
        // Nobody may read the schema under an exclusive lock: even one statement is unknown now.
        other.execute_batch("COMMIT; BEGIN EXCLUSIVE").unwrap();
        let d = rehearse(&path, "DELETE FROM users", Mode::Describe);
        assert_eq!(d.transient(), Some(&Stopped::Busy), "{d:?}");
        // Once the lock is gone, the same SQL describes as a fact, the same every time.
        other.execute_batch("ROLLBACK").unwrap();
        let d = rehearse(&path, batch, Mode::Describe);
        assert_eq!((d.transient(), d.target()), (None, "audit, users".into()));
    }

    #[test]
    fn the_time_limit_and_a_missing_file_are_transient() {
        let (dir, path) = db(USERS);
        let endless = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) \
                       INSERT INTO audit SELECT i FROM n; DELETE FROM users";
        let d = rehearse(&path, endless, Mode::Describe);
        assert_eq!(d.transient(), Some(&Stopped::TimeLimit), "{d:?}");
        let d = rehearse(
            &dir.path().join("gone.sqlite"),
            "DELETE FROM users",
            Mode::Describe,
        );
        assert!(
            matches!(d.transient(), Some(Stopped::NoDatabase(_))),
            "{d:?}"
        );
    }

    #[test]
    fn what_the_sql_and_the_schema_say_is_a_fact_not_transient() {
        let (_d, path) = db(&format!(
            "{USERS} CREATE TABLE uniq (k INTEGER PRIMARY KEY); INSERT INTO uniq VALUES (1);"
        ));
        let many = "DELETE FROM audit;".repeat(MAX_STATEMENTS + 1);
        for (sql, target) in [
            ("DELETE FROM missing; DELETE FROM users", "nothing"),
            ("DELETE FROM users WHERE; DELETE FROM audit", "nothing"),
            ("INSERT INTO uniq VALUES (1); DELETE FROM users", "uniq"),
            ("VACUUM", "unattributed"),
            ("COMMIT; DELETE FROM users", "transaction control, unknown"),
            (many.as_str(), "unknown"),
        ] {
            let first = rehearse(&path, sql, Mode::Describe);
            assert!(first.stopped.is_some(), "{sql}");
            assert_eq!(first.transient(), None, "{sql}: {first:?}");
            assert_eq!(first.target(), target, "{sql}");
            let again = rehearse(&path, sql, Mode::Describe);
            assert_eq!(
                (again.target(), again.summary()),
                (first.target(), first.summary())
            );
        }
    }

    #[test]
    fn every_way_of_writing_a_table_names_it() {
        let (_d, path) = db(&format!(
            "{USERS} CREATE VIEW names AS SELECT name FROM users;
             CREATE TABLE t (id INTEGER PRIMARY KEY, v);"
        ));
        for (sql, target) in [
            ("REPLACE INTO users (id, name) VALUES (1, 'z')", "users"),
            (
                "INSERT INTO users (id, name) VALUES (1, 'z') ON CONFLICT(id) DO UPDATE SET name = 'y'",
                "users",
            ),
            ("DELETE FROM users WHERE id = 1 RETURNING name", "users"),
            (
                "UPDATE users SET name = a.what FROM audit AS a WHERE users.id = 1",
                "users",
            ),
            ("DROP VIEW names", "names"),
            ("ALTER TABLE t ADD COLUMN w", "t"),
            ("CREATE INDEX t_v ON t(v)", "t"),
            (
                "CREATE TRIGGER t_del AFTER DELETE ON t BEGIN DELETE FROM users; END",
                "t",
            ),
            (
                "CREATE TEMP TRIGGER gone AFTER DELETE ON t BEGIN DELETE FROM users; END; DELETE FROM t",
                "t, users",
            ),
            ("INSERT INTO t (v) SELECT name FROM users", "t"),
            ("ANALYZE", "ANALYZE, sqlite_stat1, sqlite_stat4"),
        ] {
            let d = rehearse(&path, sql, Mode::Describe);
            assert_eq!(d.target(), target, "{sql}: {d:?}");
        }
        let d = rehearse(&path, "ANALYZE", Mode::Describe);
        assert_eq!(d.statements[0].kind, "ANALYZE");
    }

    #[test]
    fn statements_are_split_where_sqlite_says_they_end() {
        assert_eq!(
            split(
                "CREATE TRIGGER t AFTER INSERT ON a BEGIN DELETE FROM b; END; SELECT ';' -- x;\n ;"
            ),
            [
                "CREATE TRIGGER t AFTER INSERT ON a BEGIN DELETE FROM b; END;",
                " SELECT ';' -- x;\n ;"
            ]
        );
        assert!(split(" -- only\n /* a comment */ ;").is_empty());
    }
}
