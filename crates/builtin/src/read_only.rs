//! The connection `list_tables`, `describe_table` and `query` read through.
//!
//! `query` is classed open: it runs with no person's approval, so whatever SQL it is given must
//! only read. Opening the file read-only (with `query_only` on) is not enough for that: `ATTACH`
//! still opens any SQLite file the agent names, `VACUUM INTO` still creates a file at the path it
//! names, and `BEGIN` or `PRAGMA query_only = 0` still run. So each statement is checked while it
//! is prepared, before any of it runs, twice:
//!
//! - SQLite's authorizer allows only what a read needs ([`allowed`]) and denies everything else,
//!   including any action a later SQLite adds.
//! - A statement SQLite does not report as read-only is refused: `VACUUM` asks the authorizer
//!   nothing while it is prepared (it attaches its target only when it runs).
//!
//! A refusal reads `query is read-only: ATTACH is not allowed; use execute`.

use countersign_core::sync::lock;
use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::hooks::{AuthAction, AuthContext, Authorization, TransactionOperation};
use rusqlite::{Connection, OpenFlags, Statement, ffi};

use crate::Failure;

/// Pragmas that only describe the schema. Their argument names a table or an index; it never
/// sets anything.
const SCHEMA_PRAGMAS: &[&str] = &[
    "table_info",
    "table_xinfo",
    "table_list",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
];

/// Settings full-text search reads while it runs a query; allowed only without a value, which
/// would set them.
const SETTINGS_READ_BY_SEARCH: &[&str] = &["data_version", "page_size"];

/// Full-text search's functions that only read. SQLite registers them per virtual table without
/// the innocuous flag; `optimize`, which rewrites an FTS3/4 index, is left out.
const SEARCH_FUNCTIONS: &[&str] = &[
    "match",
    "bm25",
    "highlight",
    "snippet",
    "matchinfo",
    "offsets",
];

/// A read-only connection whose statements can only read.
pub(crate) struct ReadOnly {
    conn: Connection,
    /// What the authorizer denied first since it was last looked at, for the message.
    denied: Arc<Mutex<Option<Denied>>>,
}

/// What the authorizer denied, kept for the message.
enum Denied {
    /// An action as the agent would write it: `ATTACH`, `PRAGMA user_version`.
    Action(String),
    /// A write to one of SQLite's own tables (`sqlite_schema`, `sqlite_stat1`), which is how a
    /// `CREATE`, a `DROP` or an `ANALYZE` first asks: named after the statement instead.
    Bookkeeping,
}

impl ReadOnly {
    /// Opens `db` (which must exist) read-only, with the authorizer installed.
    pub(crate) fn open(db: &Path) -> Result<Self, Failure> {
        let conn = Connection::open_with_flags(
            db,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        // Set before the authorizer, which denies this pragma.
        conn.pragma_update(None, "query_only", true)?;
        let innocuous = innocuous_functions(&conn)?;
        let denied = Arc::new(Mutex::new(None));
        let record = Arc::clone(&denied);
        conn.authorizer(Some(move |context: AuthContext<'_>| {
            if allowed(&context.action, &innocuous) {
                return Authorization::Allow;
            }
            lock(&record).get_or_insert_with(|| named(&context.action));
            Authorization::Deny
        }));
        Ok(Self { conn, denied })
    }

    /// Prepares `sql` (one statement), refusing it unless it only reads.
    pub(crate) fn prepare(&self, sql: &str) -> Result<Statement<'_>, Failure> {
        let statement = self.conn.prepare(sql).map_err(|e| self.failure(sql, e))?;
        if !statement.readonly() {
            return Err(refusal(&first_word(sql)));
        }
        Ok(statement)
    }

    /// The failure for an error from running `sql` here: the refusal, when the authorizer denied
    /// something (while preparing, or inside full-text search as it runs).
    pub(crate) fn failure(&self, sql: &str, error: rusqlite::Error) -> Failure {
        let denied = lock(&self.denied).take();
        match denied {
            Some(Denied::Action(what)) => refusal(&what),
            Some(Denied::Bookkeeping) => refusal(&first_word(sql)),
            None => Failure::from(error),
        }
    }
}

fn refusal(what: &str) -> Failure {
    Failure(format!(
        "query is read-only: {what} is not allowed; use execute"
    ))
}

/// The functions SQLite itself marks innocuous on this connection: no side effects, nothing read
/// but their arguments. `load_extension` and `fts3_tokenizer` are not among them.
fn innocuous_functions(conn: &Connection) -> Result<HashSet<String>, Failure> {
    let mut statement =
        conn.prepare("SELECT DISTINCT name FROM pragma_function_list WHERE flags & ?1 != 0")?;
    let names = statement
        .query_map([ffi::SQLITE_INNOCUOUS], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(names)
}

/// Whether a read may do `action`. Everything not named here is denied.
fn allowed(action: &AuthAction<'_>, innocuous: &HashSet<String>) -> bool {
    let listed = |list: &[&str], name: &str| list.iter().any(|n| n.eq_ignore_ascii_case(name));
    match *action {
        AuthAction::Select | AuthAction::Read { .. } | AuthAction::Recursive => true,
        AuthAction::Function { function_name } => {
            let name = function_name.to_ascii_lowercase();
            innocuous.contains(&name) || listed(SEARCH_FUNCTIONS, &name)
        }
        AuthAction::Pragma {
            pragma_name,
            pragma_value,
        } => {
            listed(SCHEMA_PRAGMAS, pragma_name)
                || (pragma_value.is_none() && listed(SETTINGS_READ_BY_SEARCH, pragma_name))
        }
        _ => false,
    }
}

/// A denied action, named as the agent would write it.
fn named(action: &AuthAction<'_>) -> Denied {
    let word = match *action {
        AuthAction::Insert { table_name }
        | AuthAction::Update { table_name, .. }
        | AuthAction::Delete { table_name }
            if is_sqlites_own(table_name) =>
        {
            return Denied::Bookkeeping;
        }
        AuthAction::Attach { .. } => "ATTACH",
        AuthAction::Detach { .. } => "DETACH",
        AuthAction::Insert { .. } => "INSERT",
        AuthAction::Update { .. } => "UPDATE",
        AuthAction::Delete { .. } => "DELETE",
        AuthAction::CreateTable { .. } | AuthAction::CreateTempTable { .. } => "CREATE TABLE",
        AuthAction::CreateIndex { .. } | AuthAction::CreateTempIndex { .. } => "CREATE INDEX",
        AuthAction::CreateView { .. } | AuthAction::CreateTempView { .. } => "CREATE VIEW",
        AuthAction::CreateTrigger { .. } | AuthAction::CreateTempTrigger { .. } => "CREATE TRIGGER",
        AuthAction::CreateVtable { .. } => "CREATE VIRTUAL TABLE",
        AuthAction::DropTable { .. } | AuthAction::DropTempTable { .. } => "DROP TABLE",
        AuthAction::DropIndex { .. } | AuthAction::DropTempIndex { .. } => "DROP INDEX",
        AuthAction::DropView { .. } | AuthAction::DropTempView { .. } => "DROP VIEW",
        AuthAction::DropTrigger { .. } | AuthAction::DropTempTrigger { .. } => "DROP TRIGGER",
        AuthAction::DropVtable { .. } => "DROP VIRTUAL TABLE",
        AuthAction::AlterTable { .. } => "ALTER TABLE",
        AuthAction::Reindex { .. } => "REINDEX",
        AuthAction::Analyze { .. } => "ANALYZE",
        AuthAction::Transaction { operation } => match operation {
            TransactionOperation::Begin => "BEGIN",
            TransactionOperation::Rollback => "ROLLBACK",
            // SQLite reports COMMIT (and END) as "COMMIT", which rusqlite does not name.
            _ => "COMMIT",
        },
        AuthAction::Savepoint { operation, .. } => match operation {
            TransactionOperation::Begin => "SAVEPOINT",
            TransactionOperation::Release => "RELEASE",
            _ => "ROLLBACK TO",
        },
        AuthAction::Pragma { pragma_name, .. } => {
            return Denied::Action(format!("PRAGMA {pragma_name}"));
        }
        AuthAction::Function { function_name } => {
            return Denied::Action(format!("the function {function_name}()"));
        }
        _ => "this statement",
    };
    Denied::Action(word.to_owned())
}

/// Whether `table` is one SQLite keeps for itself; no one may create a table named so.
fn is_sqlites_own(table: &str) -> bool {
    table
        .get(..7)
        .is_some_and(|prefix| prefix.eq_ignore_ascii_case("sqlite_"))
}

/// The statement's first word, upper-cased, past any comments: `VACUUM` for
/// `/* copy */ vacuum into 'f'`. Only for the message; SQLite decides what is refused.
fn first_word(sql: &str) -> String {
    let mut rest = sql;
    loop {
        rest = rest.trim_start();
        if let Some(comment) = rest.strip_prefix("--") {
            rest = comment.split_once('\n').map_or("", |(_, after)| after);
        } else if let Some(comment) = rest.strip_prefix("/*") {
            rest = comment.split_once("*/").map_or("", |(_, after)| after);
        } else {
            break;
        }
    }
    let word: String = rest.chars().take_while(char::is_ascii_alphabetic).collect();
    if word.is_empty() {
        "this statement".to_owned()
    } else {
        word.to_ascii_uppercase()
    }
}
