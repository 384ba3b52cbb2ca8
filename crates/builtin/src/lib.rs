//! The built-in tools `countersign mcp --db PATH` serves when it has no upstream command.
//!
//! They make the whole flow (open, `token` and `once` tools, refusals, history) work on a fresh
//! machine with nothing else installed, on a real SQLite file with real errors for bad SQL. Each
//! tool carries honest MCP annotations, and the gate classes follow from them like any
//! upstream's: `list_tables`, `describe_table` and `query` are read-only (`open`; `query` runs on
//! a read-only connection whose authorizer allows only reads, so annotation and behaviour agree:
//! see [`read_only`]); `execute` changes data (`once`);
//! `create_backup` is idempotent and non-destructive (`token`); `restore_backup` and
//! `delete_backup` are destructive (`once`). What an `execute` would write is found out without
//! writing it ([`rehearse`]): the desk names its plan by the tables SQLite reports, and previews
//! it in a transaction that is rolled back.

mod describe;
mod read_only;
pub mod rehearse;

pub use describe::SqlDescriber;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

// Why parking_lot's and not std's: its condition's timed wait says whether it timed out by a
// deadline, not a duration, and its lock is not poisoned by a panicking writer.
use parking_lot::{Condvar, Mutex};

use rmcp::model::*;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};
use serde_json::{Map, Value, json};

use crate::read_only::ReadOnly;

/// The most rows a `query` returns; more are reported as truncated.
pub const MAX_ROWS: usize = 1000;

/// The built-in tools on one SQLite file.
#[derive(Debug, Clone)]
pub struct Builtin {
    db: PathBuf,
    /// How many of these tools' writes are at the file now: see [`Builtin::turn`]. Shared by
    /// clones, not by other `Builtin`s on the same file.
    at_the_file: Arc<AtTheFile>,
}

fn tool(definition: Value) -> Tool {
    serde_json::from_value(definition).expect("built-in tool definitions are valid")
}

/// Every built-in tool's definition, as MCP JSON.
pub fn definitions() -> Vec<Value> {
    let name = json!({"type": "string", "description": "backup name: letters, digits, '-' and '_'", "pattern": "^[A-Za-z0-9_-]{1,64}$"});
    vec![
        json!({"name": "list_tables", "title": "List tables", "description": "List the tables of the database.",
               "inputSchema": {"type": "object", "properties": {}},
               "annotations": {"readOnlyHint": true, "openWorldHint": false}}),
        json!({"name": "describe_table", "title": "Describe a table", "description": "Columns of a table: name, type, nullability, default, primary key.",
               "inputSchema": {"type": "object", "properties": {"table": {"type": "string"}}, "required": ["table"]},
               "annotations": {"readOnlyHint": true, "openWorldHint": false}}),
        json!({"name": "query", "title": "Query", "description": "Run one read-only SQL statement and return its rows (at most 1000).",
               "inputSchema": {"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]},
               "annotations": {"readOnlyHint": true, "openWorldHint": false}}),
        json!({"name": "execute", "title": "Execute SQL", "description": "Run SQL that changes the database (INSERT, UPDATE, DELETE, CREATE, DROP...).",
               "inputSchema": {"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]},
               "annotations": {"readOnlyHint": false, "destructiveHint": true, "idempotentHint": false, "openWorldHint": false}}),
        json!({"name": "create_backup", "title": "Create a backup", "description": "Write a consistent copy of the database under a name (replacing a backup of that name).",
               "inputSchema": {"type": "object", "properties": {"name": name}, "required": ["name"]},
               "annotations": {"readOnlyHint": false, "destructiveHint": false, "idempotentHint": true, "openWorldHint": false}}),
        json!({"name": "restore_backup", "title": "Restore a backup", "description": "Replace the whole database with a named backup.",
               "inputSchema": {"type": "object", "properties": {"name": name}, "required": ["name"]},
               "annotations": {"readOnlyHint": false, "destructiveHint": true, "idempotentHint": true, "openWorldHint": false}}),
        json!({"name": "delete_backup", "title": "Delete a backup", "description": "Delete a named backup for good.",
               "inputSchema": {"type": "object", "properties": {"name": name}, "required": ["name"]},
               "annotations": {"readOnlyHint": false, "destructiveHint": true, "idempotentHint": true, "openWorldHint": false}}),
    ]
}

/// A tool did not do what it was asked ([`Builtin::call`]): bad SQL, a missing table or
/// backup, an unknown tool. Its text is what an agent would read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolFailed(pub String);

impl ToolFailed {
    /// A stable code: `tool_failed`.
    pub fn code(&self) -> &'static str {
        "tool_failed"
    }
}

impl std::fmt::Display for ToolFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ToolFailed {}

/// A tool failure the agent should read: bad SQL, a missing table or backup.
#[derive(Debug)]
struct Failure(String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(e.to_string())
    }
}

/// How long a write waits for another writer's lock on the file before it fails ("database is
/// locked").
const WRITE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// SQLite's busy handler for the tools' writers: [`retry_within`] [`WRITE_WAIT`].
fn retry_soon(tries: i32) -> bool {
    retry_within(tries, WRITE_WAIT)
}

thread_local! {
    /// When this thread was first told the file is busy, for the lock it waits for now.
    static WAITING_SINCE: std::cell::Cell<Option<std::time::Instant>> =
        const { std::cell::Cell::new(None) };
    /// When this thread's write began waiting for its turn ([`Builtin::turn`]), until its first
    /// wait for the file's lock takes it: that wait counts from there, so a write waits
    /// [`WRITE_WAIT`] in all for its turn and the lock together.
    static TURN_ASKED: std::cell::Cell<Option<std::time::Instant>> =
        const { std::cell::Cell::new(None) };
}

/// How many of one `Builtin`'s writes (its clones' included) are at the file ([`Builtin::turn`]),
/// and where the others wait for one of them to end.
#[derive(Debug, Default)]
struct AtTheFile {
    writing: Mutex<usize>,
    ended: Condvar,
}

/// The most of one `Builtin`'s writes at the file at once: one holding SQLite's lock, one ready
/// to take it the moment it is free. See [`Builtin::turn`].
const AT_THE_FILE: usize = 2;

/// A write's turn at the file ([`Builtin::turn`]): while it is held, its first wait for the
/// file's lock counts from when it asked for the turn.
struct Turn<'a> {
    at_the_file: &'a AtTheFile,
    /// Ended on the thread that took it, whose waits it times ([`TURN_ASKED`]).
    on_this_thread: std::marker::PhantomData<*const ()>,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        TURN_ASKED.with(|asked| asked.set(None));
        *self.at_the_file.writing.lock() -= 1;
        self.at_the_file.ended.notify_one();
    }
}

/// A busy handler's body: sleeps [`retry_pause`] and says to try again, or says to give up once
/// `limit` has passed since the first try. SQLite calls its busy handler on the waiting thread,
/// `tries` counting the calls before this one for the same lock (0 the first time).
///
/// Why not SQLite's own (`busy_timeout`): it sleeps 1, 2, 5, 10 ... up to 100 ms between tries,
/// so a writer slept on long after the lock it waited for was free. 16 writers on one file did
/// between 45 % and all of what the file allows, as the sleeps fell.
pub(crate) fn retry_within(tries: i32, limit: std::time::Duration) -> bool {
    let now = std::time::Instant::now();
    let since = WAITING_SINCE.with(|since| match since.get() {
        Some(at) if tries > 0 => at,
        _ => {
            // The first wait of a turn counts from when the turn was asked; a later one (another
            // statement of the same batch) from its own first try, as without turns.
            let began = TURN_ASKED.with(std::cell::Cell::take).unwrap_or(now);
            since.set(Some(began));
            began
        }
    });
    match retry_pause(tries, now.saturating_duration_since(since), limit) {
        Some(pause) => {
            std::thread::sleep(pause);
            true
        }
        None => false,
    }
}

/// The pause before the next try after `tries` earlier ones, `waited` into the wait: 50 µs, then
/// 50 µs more each time up to 1 ms (a lock is held for about a commit's fsync); past 100 ms of
/// waiting (a long transaction holds the lock), 10 ms, so that many writers waiting long do not
/// keep the cores busy trying; never past `limit`. `None` (give up) once `waited` reaches `limit`.
fn retry_pause(
    tries: i32,
    waited: std::time::Duration,
    limit: std::time::Duration,
) -> Option<std::time::Duration> {
    use std::time::Duration;
    let left = limit.checked_sub(waited).filter(|left| !left.is_zero())?;
    let earlier = u64::try_from(tries).unwrap_or(0);
    let pause = Duration::from_micros(earlier.saturating_add(1).saturating_mul(50));
    let most = if waited < Duration::from_millis(100) {
        Duration::from_millis(1)
    } else {
        Duration::from_millis(10)
    };
    Some(pause.min(most).min(left))
}

fn text_arg<'a>(args: &'a Map<String, Value>, name: &str) -> Result<&'a str, Failure> {
    args.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| Failure(format!("`{name}` is required and must be a string")))
}

fn json_of(value: ValueRef<'_>) -> Value {
    match value {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => json!(i),
        ValueRef::Real(f) => json!(f),
        ValueRef::Text(t) => json!(String::from_utf8_lossy(t)),
        ValueRef::Blob(b) => json!({"blob_bytes": b.len()}),
    }
}

impl Builtin {
    /// The tools on the SQLite file at `db` (created on first write).
    pub fn new(db: impl Into<PathBuf>) -> Self {
        Self {
            db: db.into(),
            at_the_file: Arc::default(),
        }
    }

    /// Waits until fewer than [`AT_THE_FILE`] of these tools' writes are at the file, up to
    /// [`WRITE_WAIT`] (the same wait as for the file's lock, whose first wait then counts from
    /// here).
    ///
    /// Why: SQLite lets one writer at a time have the file and tells the others it is busy;
    /// each then sleeps and tries again ([`retry_within`]). With many calls writing at once, all
    /// of them tried and slept over and over (a profile of a team server's confirms: about 12
    /// tries a write). Here one write holds the file and one more tries for it; the rest wait on
    /// a condition, and one of them is woken when a write ends (in no set order: a write that
    /// asks just then may go first). Measured on 2 cores, 16 threads writing straight: about
    /// 1,710 writes a second before, 1,980 after. Not fewer: with one at a time, the next writer
    /// must first be woken, and on an idle machine that took as long as the write (800 a
    /// second); the write that tries for the lock is already running when it frees.
    ///
    /// The count is one `Builtin`'s (and its clones'): in `serve`, one start of the upstream's;
    /// on the desk, one agent's session. Other writers of the file, in this process or another,
    /// meet SQLite's lock as before.
    fn turn(&self) -> Result<Turn<'_>, Failure> {
        self.turn_within(WRITE_WAIT)
    }

    /// [`Self::turn`], waiting at most `limit`.
    fn turn_within(&self, limit: std::time::Duration) -> Result<Turn<'_>, Failure> {
        let asked = Instant::now();
        let deadline = asked + limit;
        let at_the_file = &*self.at_the_file;
        let mut writing = at_the_file.writing.lock();
        while *writing >= AT_THE_FILE {
            if at_the_file
                .ended
                .wait_until(&mut writing, deadline)
                .timed_out()
                && *writing >= AT_THE_FILE
            {
                return Err(Failure(format!(
                    "the database stayed busy with other calls' writes for {} s: nothing was \
                     written; call again",
                    limit.as_secs()
                )));
            }
        }
        *writing += 1;
        drop(writing);
        TURN_ASKED.with(|at| at.set(Some(asked)));
        Ok(Turn {
            at_the_file,
            on_this_thread: std::marker::PhantomData,
        })
    }

    fn backups(&self) -> PathBuf {
        let mut dir = self.db.clone().into_os_string();
        dir.push(".backups");
        PathBuf::from(dir)
    }

    fn backup_path(&self, args: &Map<String, Value>) -> Result<PathBuf, Failure> {
        let name = text_arg(args, "name")?;
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !valid {
            return Err(Failure(
                "a backup name has 1 to 64 letters, digits, '-' or '_'".into(),
            ));
        }
        Ok(self.backups().join(format!("{name}.sqlite")))
    }

    fn read_only(&self) -> Result<ReadOnly, Failure> {
        if !self.db.exists() {
            return Err(Failure(format!(
                "the database {} does not exist yet",
                self.db.display()
            )));
        }
        ReadOnly::open(&self.db)
    }

    fn writable(&self) -> Result<Connection, Failure> {
        let conn = Connection::open(&self.db)?;
        conn.busy_handler(Some(retry_soon))?;
        Ok(conn)
    }

    fn rows(conn: &ReadOnly, sql: &str, params: &[&dyn rusqlite::ToSql]) -> Result<Value, Failure> {
        let mut stmt = conn.prepare(sql)?;
        Self::collect(&mut stmt, params).map_err(|e| conn.failure(sql, e))
    }

    fn collect(
        stmt: &mut rusqlite::Statement<'_>,
        params: &[&dyn rusqlite::ToSql],
    ) -> rusqlite::Result<Value> {
        let columns: Vec<String> = stmt.column_names().iter().map(|c| c.to_string()).collect();
        let mut rows = stmt.query(params)?;
        let mut out = Vec::new();
        let mut truncated = false;
        while let Some(row) = rows.next()? {
            if out.len() == MAX_ROWS {
                truncated = true;
                break;
            }
            let mut obj = Map::new();
            for (i, c) in columns.iter().enumerate() {
                obj.insert(c.clone(), json_of(row.get_ref(i)?));
            }
            out.push(Value::Object(obj));
        }
        Ok(json!({"columns": columns, "rows": out, "truncated": truncated}))
    }

    /// What tool `tool` does with `args`, without MCP around it: its result, or the failure an
    /// agent would read. For callers in the same process that measure the tools themselves (the
    /// team server's benchmark compares its confirms with `execute` run straight).
    pub fn call(&self, tool: &str, args: &Map<String, Value>) -> Result<Value, ToolFailed> {
        self.run(tool, args).map_err(|Failure(why)| ToolFailed(why))
    }

    fn run(&self, tool: &str, args: &Map<String, Value>) -> Result<Value, Failure> {
        match tool {
            "list_tables" => {
                let conn = self.read_only()?;
                Self::rows(
                    &conn,
                    "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
                    &[],
                )
            }
            "describe_table" => {
                let conn = self.read_only()?;
                let table = text_arg(args, "table")?;
                let described = Self::rows(
                    &conn,
                    "SELECT name, type, \"notnull\", dflt_value, pk FROM pragma_table_info(?1)",
                    &[&table],
                )?;
                if described["rows"].as_array().is_some_and(Vec::is_empty) {
                    return Err(Failure(format!("no table named {table:?}")));
                }
                Ok(described)
            }
            "query" => Self::rows(&self.read_only()?, text_arg(args, "sql")?, &[]),
            "execute" => {
                let conn = self.writable()?;
                let sql = text_arg(args, "sql")?;
                let turn = self.turn()?;
                let before = conn.total_changes();
                let ran = conn.execute_batch(sql);
                let changes = conn.total_changes() - before;
                // Closed within the turn: SQL that left a transaction open holds the file until
                // its connection closes (and rolls it back).
                drop(conn);
                drop(turn);
                ran?;
                Ok(json!({ "changes": changes }))
            }
            "create_backup" => {
                let path = self.backup_path(args)?;
                std::fs::create_dir_all(self.backups())?;
                let conn = self.writable()?;
                // Written aside, then renamed over any backup of that name: idempotent, and never
                // a half-written backup under the name.
                let partial = path.with_extension("partial");
                let _ = std::fs::remove_file(&partial);
                conn.execute("VACUUM INTO ?1", [partial.to_string_lossy()])?;
                std::fs::rename(&partial, &path)?;
                Ok(
                    json!({"backup": path.display().to_string(), "bytes": std::fs::metadata(&path)?.len()}),
                )
            }
            "restore_backup" => {
                let path = self.backup_path(args)?;
                if !path.exists() {
                    return Err(Failure(format!(
                        "no backup named {:?}",
                        text_arg(args, "name")?
                    )));
                }
                let source = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
                // A backup is only ever replaced whole (written aside, then renamed), never
                // written in place: a lock on it is some other program's, so fail at once.
                source.busy_timeout(std::time::Duration::ZERO)?;
                let mut target = self.writable()?;
                let _turn = self.turn()?;
                let backup = rusqlite::backup::Backup::new(&source, &mut target)?;
                // One step for the whole copy: the file's lock is taken once (the busy handler
                // waits up to WRITE_WAIT for it) and the pages replaced in one transaction.
                // rusqlite's `run_to_completion` tried a busy step again for ever, without a pause.
                match backup.step(-1)? {
                    rusqlite::backup::StepResult::Done => {}
                    rusqlite::backup::StepResult::Busy | rusqlite::backup::StepResult::Locked => {
                        return Err(Failure(format!(
                            "the database or the backup stayed locked by another connection \
                             (the database is waited for up to {} s): nothing was restored; call \
                             again when they are free",
                            WRITE_WAIT.as_secs()
                        )));
                    }
                    // Not for a step of every page; an unfinished copy is rolled back when the
                    // backup is dropped.
                    _ => {
                        return Err(Failure(
                            "the restore stopped before its end: nothing was restored".into(),
                        ));
                    }
                }
                Ok(json!({"restored_from": path.display().to_string()}))
            }
            "delete_backup" => {
                let path = self.backup_path(args)?;
                std::fs::remove_file(&path).map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => Failure("no backup of that name".into()),
                    _ => Failure(e.to_string()),
                })?;
                Ok(json!({"deleted": path.display().to_string()}))
            }
            other => Err(Failure(format!("no built-in tool named {other:?}"))),
        }
    }

    /// The database file.
    pub fn db(&self) -> &Path {
        &self.db
    }
}

impl ServerHandler for Builtin {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("countersign-builtin", env!("CARGO_PKG_VERSION")))
            .with_instructions("SQLite tools on one local database file. Reads are immediate; changes need a person's approval at the Countersign desk.")
            .with_protocol_version(ProtocolVersion::V_2025_11_25)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            definitions().into_iter().map(tool).collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.clone().unwrap_or_default();
        let this = self.clone();
        let name = request.name.to_string();
        // SQLite is blocking I/O: keep it off the protocol's task.
        let outcome = tokio::task::spawn_blocking(move || this.run(&name, &args))
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let result = match outcome {
            Ok(value) => {
                let mut r = CallToolResult::success(vec![ContentBlock::text(value.to_string())]);
                r.structured_content = Some(value);
                r
            }
            Err(Failure(message)) => CallToolResult::error(vec![ContentBlock::text(message)]),
        };
        Ok(result.into())
    }
}

/// Serves the built-in tools on `db` over an in-process pipe until the other end closes.
pub async fn serve<R, W>(db: PathBuf, read: R, write: W)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // Created up front, so that reading tools work on a fresh file too.
    if let Err(err) = Connection::open(&db) {
        tracing::error!(target: "builtin", "cannot open {}: {err}", db.display());
    }
    match Builtin::new(db).serve((read, write)).await {
        Ok(running) => {
            let _ = running.waiting().await;
        }
        Err(err) => tracing::error!(target: "builtin", "the built-in tools did not start: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn every_definition_parses_and_classes_as_documented() {
        let classes: Vec<(String, bool, Option<bool>)> = definitions()
            .iter()
            .map(|d| {
                (
                    d["name"].as_str().unwrap().to_owned(),
                    d["annotations"]["readOnlyHint"] == true,
                    d["annotations"]["destructiveHint"].as_bool(),
                )
            })
            .collect();
        assert_eq!(classes.len(), 7);
        for d in definitions() {
            let _ = tool(d);
        }
    }

    #[test]
    fn execute_query_and_backups_work_on_a_real_file() {
        let dir = tempfile::tempdir().unwrap();
        let b = Builtin::new(dir.path().join("demo.sqlite"));
        assert!(
            b.run("query", &args(json!({"sql": "SELECT 1"}))).is_err(),
            "no database yet"
        );
        b.run("execute", &args(json!({"sql": "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT); INSERT INTO t (name) VALUES ('a'), ('b')"}))).unwrap();
        let tables = b.run("list_tables", &Map::new()).unwrap();
        assert_eq!(tables["rows"], json!([{"name": "t"}]));
        let rows = b
            .run(
                "query",
                &args(json!({"sql": "SELECT name FROM t ORDER BY id"})),
            )
            .unwrap();
        assert_eq!(rows["rows"], json!([{"name": "a"}, {"name": "b"}]));
        b.run("create_backup", &args(json!({"name": "before"})))
            .unwrap();
        b.run("create_backup", &args(json!({"name": "before"})))
            .unwrap();
        b.run("execute", &args(json!({"sql": "DELETE FROM t"})))
            .unwrap();
        b.run("restore_backup", &args(json!({"name": "before"})))
            .unwrap();
        let rows = b
            .run(
                "query",
                &args(json!({"sql": "SELECT count(*) AS n FROM t"})),
            )
            .unwrap();
        assert_eq!(rows["rows"], json!([{"n": 2}]));
        b.run("delete_backup", &args(json!({"name": "before"})))
            .unwrap();
        assert!(
            b.run("delete_backup", &args(json!({"name": "before"})))
                .is_err()
        );
    }

    #[test]
    fn query_cannot_change_data_and_bad_sql_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let b = Builtin::new(dir.path().join("demo.sqlite"));
        b.run("execute", &args(json!({"sql": "CREATE TABLE t (x)"})))
            .unwrap();
        let Err(Failure(msg)) = b.run("query", &args(json!({"sql": "DELETE FROM t"}))) else {
            panic!()
        };
        assert!(
            msg.contains("readonly") || msg.contains("read-only") || msg.contains("read only"),
            "{msg}"
        );
        let Err(Failure(msg)) = b.run("execute", &args(json!({"sql": "SELEC nonsense"}))) else {
            panic!()
        };
        assert!(msg.contains("syntax error"), "{msg}");
        assert!(
            b.run("describe_table", &args(json!({"table": "missing"})))
                .is_err()
        );
        assert!(
            b.run("create_backup", &args(json!({"name": "../escape"})))
                .is_err()
        );
    }

    #[test]
    fn a_writer_told_busy_tries_again_within_a_millisecond_and_gives_up_at_its_limit() {
        use std::time::Duration;
        let (ms, us) = (Duration::from_millis, Duration::from_micros);
        let limit = Duration::from_secs(5);
        assert_eq!(retry_pause(0, Duration::ZERO, limit), Some(us(50)));
        assert_eq!(retry_pause(1, us(50), limit), Some(us(100)));
        assert_eq!(retry_pause(19, ms(10), limit), Some(ms(1)));
        assert_eq!(retry_pause(i32::MAX, ms(10), limit), Some(ms(1)));
        // A long wait tries less often.
        assert_eq!(retry_pause(500, ms(200), limit), Some(ms(10)));
        assert_eq!(retry_pause(-1, Duration::ZERO, limit), Some(us(50)));
        // Never past the limit, and nothing once it is reached.
        assert_eq!(retry_pause(900, ms(4_999) + us(700), limit), Some(us(300)));
        assert_eq!(retry_pause(100, limit, limit), None);
        assert_eq!(retry_pause(0, ms(6_000), limit), None);
        assert_eq!(retry_pause(0, Duration::ZERO, Duration::ZERO), None);
    }

    #[test]
    fn a_busy_wait_gives_up_once_its_limit_has_passed_since_the_first_try() {
        let limit = std::time::Duration::from_millis(20);
        let started = std::time::Instant::now();
        let mut tries = 0;
        while retry_within(tries, limit) {
            tries += 1;
        }
        assert!(started.elapsed() >= limit);
        assert!(tries > 1, "it tried again before giving up ({tries})");
        // A new wait (tries at 0 again) starts its own count.
        assert!(retry_within(0, limit));
    }

    #[test]
    fn at_most_two_writes_of_the_tools_are_at_the_file_and_a_third_waits_for_one_to_end() {
        use std::time::Duration;
        let (_dir, b) = seeded();
        let clone = b.clone();
        let first = b.turn_within(Duration::ZERO).unwrap();
        let _second = clone.turn_within(Duration::ZERO).unwrap();
        // Clones share the count: a third, of either, waits its limit and is told why.
        let waited = Instant::now();
        let Err(Failure(why)) = b.turn_within(Duration::from_millis(30)) else {
            panic!("a third write was let at the file")
        };
        assert!(waited.elapsed() >= Duration::from_millis(30));
        assert!(why.contains("nothing was written"), "{why}");
        // One that waits is let in as soon as a write ends, long before its limit.
        std::thread::scope(|scope| {
            let (asking, asked) = std::sync::mpsc::channel();
            let waiter = &clone;
            let third = scope.spawn(move || {
                asking.send(()).unwrap();
                let waited = Instant::now();
                let let_in = waiter.turn_within(Duration::from_secs(60)).is_ok();
                (let_in, waited.elapsed())
            });
            asked.recv().unwrap();
            std::thread::sleep(Duration::from_millis(20));
            drop(first);
            let (let_in, waited) = third.join().unwrap();
            assert!(let_in);
            assert!(
                waited < Duration::from_secs(30),
                "woken when a write ended, not at its limit ({waited:?})"
            );
        });
    }

    #[test]
    fn sixteen_writers_through_the_same_tools_at_once_each_write_once() {
        let (_dir, b) = seeded();
        std::thread::scope(|scope| {
            for w in 0..16 {
                let b = &b;
                scope.spawn(move || {
                    for n in 0..10 {
                        let sql = format!("INSERT INTO u VALUES (1, 'w{w}n{n}')");
                        b.run("execute", &args(json!({ "sql": sql }))).unwrap();
                    }
                });
            }
        });
        let written = notes(&b);
        assert_eq!(written.len(), 1 + 160);
        let distinct: std::collections::BTreeSet<_> = written.iter().collect();
        assert_eq!(distinct.len(), 161, "every write once");
    }

    #[test]
    fn a_writes_wait_for_the_file_counts_from_when_it_asked_for_its_turn() {
        use std::time::Duration;
        let limit = Duration::from_millis(200);
        let (_dir, b) = seeded();
        {
            let _turn = b.turn_within(limit).unwrap();
            let asked = TURN_ASKED.with(std::cell::Cell::get);
            assert!(asked.is_some_and(|at| at <= Instant::now()), "{asked:?}");
            // As if the turn had taken the whole limit to come: the file's first busy answer
            // gives up at once.
            TURN_ASKED.with(|asked| asked.set(Instant::now().checked_sub(limit)));
            assert!(!retry_within(0, limit));
            // A later wait of the same turn (another statement of its batch) has its own limit.
            assert!(retry_within(0, limit));
        }
        // The turn ended: nothing of it is left on the thread.
        assert_eq!(TURN_ASKED.with(std::cell::Cell::get), None);
        assert!(retry_within(0, limit));
    }

    #[test]
    fn a_write_waits_while_another_writer_holds_the_file_and_then_runs() {
        let (_dir, b) = seeded();
        // The tools' own handler waits, not SQLite's sleeps (setting one clears the other).
        let timeout: i64 = b
            .writable()
            .unwrap()
            .query_row("PRAGMA busy_timeout", [], |r| r.get(0))
            .unwrap();
        assert_eq!(timeout, 0);
        let writer = while_another_writer_holds(&b, || {
            b.run(
                "execute",
                &args(json!({"sql": "INSERT INTO u VALUES (1, 'after')"})),
            )
        });
        assert_eq!(writer.unwrap(), json!({"changes": 1}));
        assert_eq!(notes(&b), ["first", "held", "after"]);
    }

    #[test]
    fn a_restore_waits_out_another_writer_and_replaces_the_file_whole() {
        let (_dir, b) = seeded();
        b.run("create_backup", &args(json!({"name": "before"})))
            .unwrap();
        b.run(
            "execute",
            &args(json!({"sql": "INSERT INTO u VALUES (2, 'later')"})),
        )
        .unwrap();
        let restored = while_another_writer_holds(&b, || {
            b.run("restore_backup", &args(json!({"name": "before"})))
        });
        assert!(restored.is_ok(), "{restored:?}");
        assert_eq!(notes(&b), ["first"], "the backup's rows, and only them");
    }

    #[test]
    fn a_restore_from_a_backup_another_connection_holds_fails_at_once_and_changes_nothing() {
        let (_dir, b) = seeded();
        let made = b
            .run("create_backup", &args(json!({"name": "before"})))
            .unwrap();
        b.run(
            "execute",
            &args(json!({"sql": "INSERT INTO u VALUES (2, 'later')"})),
        )
        .unwrap();
        let held = Connection::open(made["backup"].as_str().unwrap()).unwrap();
        held.execute_batch("BEGIN EXCLUSIVE").unwrap();
        // In a thread with a bound: the old loop tried the busy step again for ever.
        let (told, answer) = std::sync::mpsc::channel();
        let restoring = b.clone();
        std::thread::spawn(move || {
            let _ = told.send(restoring.run("restore_backup", &args(json!({"name": "before"}))));
        });
        let Failure(why) = answer
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the restore answered")
            .unwrap_err();
        assert!(why.contains("nothing was restored"), "{why}");
        drop(held);
        let later: i64 = Connection::open(b.db())
            .unwrap()
            .query_row("SELECT count(*) FROM u WHERE note = 'later'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(later, 1, "the database is as it was");
    }

    /// `call`'s answer, made in a thread of its own while another connection holds the file's
    /// write lock (with a row `held` added to `u`), committed 50 ms after the thread starts: by
    /// then `call` is told the file is busy (or is about to be), and gets it once freed.
    fn while_another_writer_holds<T: Send>(b: &Builtin, call: impl FnOnce() -> T + Send) -> T {
        let holder = Connection::open(b.db()).unwrap();
        holder
            .execute_batch("BEGIN IMMEDIATE; INSERT INTO u VALUES (1, 'held');")
            .unwrap();
        let (started, waiting) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            let calling = scope.spawn(|| {
                started.send(()).unwrap();
                call()
            });
            waiting.recv().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(50));
            holder.execute_batch("COMMIT").unwrap();
            calling.join().unwrap()
        })
    }

    /// The notes of `u`, in the order they were added.
    fn notes(b: &Builtin) -> Vec<String> {
        Connection::open(b.db())
            .unwrap()
            .prepare("SELECT note FROM u ORDER BY rowid")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    /// A database with two rows in `t`, an index, a view, a trigger and a full-text table, so
    /// that every kind of change has something to change.
    fn seeded() -> (tempfile::TempDir, Builtin) {
        let dir = tempfile::tempdir().unwrap();
        let b = Builtin::new(dir.path().join("demo.sqlite"));
        b.run(
            "execute",
            &args(json!({"sql": "
                CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT);
                INSERT INTO t (name) VALUES ('a'), ('b');
                CREATE TABLE u (t_id INTEGER REFERENCES t(id), note TEXT);
                INSERT INTO u VALUES (1, 'first');
                CREATE INDEX t_name ON t(name);
                CREATE VIEW names AS SELECT upper(name) AS big FROM t;
                CREATE TRIGGER t_noted AFTER INSERT ON t BEGIN INSERT INTO u VALUES (new.id, 'new'); END;
                CREATE VIRTUAL TABLE notes USING fts5(body);
                INSERT INTO notes VALUES ('hello world');
                CREATE VIRTUAL TABLE old_notes USING fts4(body);
                INSERT INTO old_notes VALUES ('hello world');"})),
        )
        .unwrap();
        (dir, b)
    }

    /// Everything in the database, to show a refused statement changed nothing.
    fn snapshot(b: &Builtin) -> Value {
        let conn = Connection::open(b.db()).unwrap();
        let mut contents = Vec::new();
        for sql in [
            "SELECT type, name, tbl_name, sql FROM sqlite_schema ORDER BY name",
            "SELECT id, name FROM t ORDER BY id",
            "SELECT t_id, note FROM u ORDER BY rowid",
            "SELECT body FROM notes",
            "SELECT * FROM pragma_user_version, pragma_application_id, pragma_journal_mode",
        ] {
            let mut stmt = conn.prepare(sql).unwrap();
            let width = stmt.column_count();
            let rows: Vec<Value> = stmt
                .query_map([], |row| {
                    (0..width)
                        .map(|i| row.get_ref(i).map(json_of))
                        .collect::<Result<Vec<_>, _>>()
                })
                .unwrap()
                .map(|row| Value::Array(row.unwrap()))
                .collect();
            contents.push(json!({sql: rows}));
        }
        Value::Array(contents)
    }

    /// The names in the database's directory.
    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Runs `sql` through `query`, asserts it is refused with the read-only message naming
    /// `what`, and that neither the database nor its directory changed.
    fn assert_query_refuses(b: &Builtin, sql: &str, what: &str) {
        let dir = b.db().parent().unwrap();
        let (before, listed) = (snapshot(b), files(dir));
        match b.run("query", &args(json!({"sql": sql}))) {
            Ok(value) => panic!("query ran {sql:?}: {value}"),
            Err(Failure(message)) => assert_eq!(
                message,
                format!("query is read-only: {what} is not allowed; use execute"),
                "for {sql:?}"
            ),
        }
        assert_eq!(snapshot(b), before, "{sql:?} changed the database");
        assert_eq!(files(dir), listed, "{sql:?} changed the files beside it");
    }

    #[test]
    fn attach_through_query_is_refused_and_opens_no_other_database() {
        let (dir, b) = seeded();
        let other = dir.path().join("other.sqlite");
        Connection::open(&other)
            .unwrap()
            .execute_batch("CREATE TABLE secret (x); INSERT INTO secret VALUES ('kept')")
            .unwrap();
        let sql = format!("ATTACH DATABASE '{}' AS other", other.display());
        assert_query_refuses(&b, &sql, "ATTACH");
        let sql = format!(
            "ATTACH '{}' AS other; SELECT x FROM other.secret",
            other.display()
        );
        assert_query_refuses(&b, &sql, "ATTACH");
    }

    #[test]
    fn attach_of_a_new_path_through_query_is_refused_and_creates_no_file() {
        let (dir, b) = seeded();
        let new = dir.path().join("new.sqlite");
        for sql in [
            format!("ATTACH '{}' AS new", new.display()),
            format!("ATTACH 'file:{}?mode=rwc' AS new", new.display()),
        ] {
            assert_query_refuses(&b, &sql, "ATTACH");
            assert!(!new.exists(), "{sql:?} created a file");
        }
    }

    #[test]
    fn detach_through_query_is_refused() {
        let (_dir, b) = seeded();
        assert_query_refuses(&b, "DETACH DATABASE other", "DETACH");
        assert_query_refuses(&b, "DETACH main", "DETACH");
    }

    #[test]
    fn vacuum_into_through_query_is_refused_and_writes_no_file() {
        let (dir, b) = seeded();
        let copy = dir.path().join("copy.sqlite");
        assert_query_refuses(&b, &format!("VACUUM INTO '{}'", copy.display()), "VACUUM");
        assert_query_refuses(
            &b,
            &format!("/* a copy */ vacuum main into '{}'", copy.display()),
            "VACUUM",
        );
        assert!(!copy.exists());
    }

    #[test]
    fn vacuum_through_query_is_refused() {
        let (_dir, b) = seeded();
        assert_query_refuses(&b, "VACUUM", "VACUUM");
        assert_query_refuses(&b, "-- tidy up\nVACUUM main", "VACUUM");
    }

    #[test]
    fn row_writes_through_query_are_refused_and_change_nothing() {
        let (_dir, b) = seeded();
        for (sql, what) in [
            ("INSERT INTO t (name) VALUES ('c')", "INSERT"),
            ("INSERT INTO t (name) VALUES ('c') RETURNING id", "INSERT"),
            ("REPLACE INTO t (id, name) VALUES (1, 'z')", "INSERT"),
            (
                "INSERT INTO t (id, name) VALUES (1, 'z') ON CONFLICT (id) DO UPDATE SET name = 'z'",
                "INSERT",
            ),
            ("UPDATE t SET name = 'z'", "UPDATE"),
            ("DELETE FROM t", "DELETE"),
            (
                "WITH doomed AS (SELECT id FROM t) DELETE FROM t WHERE id IN doomed",
                "DELETE",
            ),
            ("INSERT INTO notes VALUES ('more')", "INSERT"),
            ("INSERT INTO notes (notes) VALUES ('optimize')", "INSERT"),
        ] {
            assert_query_refuses(&b, sql, what);
        }
    }

    #[test]
    fn schema_changes_through_query_are_refused_and_change_nothing() {
        let (_dir, b) = seeded();
        for (sql, what) in [
            ("CREATE TABLE made (x)", "CREATE"),
            ("CREATE TEMP TABLE made (x)", "CREATE"),
            ("CREATE TABLE made AS SELECT * FROM t", "CREATE"),
            ("CREATE INDEX made ON t(id, name)", "CREATE"),
            ("CREATE VIEW made AS SELECT 1", "CREATE"),
            ("CREATE TEMP VIEW made AS SELECT 1", "CREATE"),
            (
                "CREATE TRIGGER made AFTER DELETE ON t BEGIN SELECT 1; END",
                "CREATE TRIGGER",
            ),
            ("CREATE VIRTUAL TABLE made USING fts5(x)", "CREATE"),
            ("DROP TABLE u", "DROP"),
            ("DROP INDEX t_name", "DROP"),
            ("DROP VIEW names", "DROP"),
            ("DROP TRIGGER t_noted", "DROP TRIGGER"),
            ("DROP TABLE notes", "DROP"),
            ("ALTER TABLE t RENAME TO renamed", "ALTER TABLE"),
            ("ALTER TABLE t ADD COLUMN extra", "ALTER TABLE"),
            ("ALTER TABLE t DROP COLUMN name", "ALTER TABLE"),
            ("REINDEX t_name", "REINDEX"),
            ("ANALYZE", "ANALYZE"),
        ] {
            assert_query_refuses(&b, sql, what);
        }
    }

    #[test]
    fn transactions_and_savepoints_through_query_are_refused() {
        let (_dir, b) = seeded();
        for (sql, what) in [
            ("BEGIN", "BEGIN"),
            ("BEGIN IMMEDIATE", "BEGIN"),
            ("COMMIT", "COMMIT"),
            ("END", "COMMIT"),
            ("ROLLBACK", "ROLLBACK"),
            ("SAVEPOINT s", "SAVEPOINT"),
            ("RELEASE s", "RELEASE"),
            ("ROLLBACK TO s", "ROLLBACK TO"),
        ] {
            assert_query_refuses(&b, sql, what);
        }
    }

    #[test]
    fn pragma_writes_through_query_are_refused_and_change_nothing() {
        let (_dir, b) = seeded();
        for (sql, what) in [
            ("PRAGMA user_version = 7", "PRAGMA user_version"),
            ("PRAGMA application_id = 7", "PRAGMA application_id"),
            ("PRAGMA query_only = 0", "PRAGMA query_only"),
            ("PRAGMA journal_mode = WAL", "PRAGMA journal_mode"),
            ("PRAGMA writable_schema = ON", "PRAGMA writable_schema"),
            ("PRAGMA page_size = 8192", "PRAGMA page_size"),
            ("PRAGMA wal_checkpoint", "PRAGMA wal_checkpoint"),
            ("PRAGMA optimize", "PRAGMA optimize"),
            ("PRAGMA incremental_vacuum", "PRAGMA incremental_vacuum"),
        ] {
            assert_query_refuses(&b, sql, what);
        }
    }

    #[test]
    fn functions_with_side_effects_through_query_are_refused() {
        let (dir, b) = seeded();
        let library = dir.path().join("library");
        assert_query_refuses(
            &b,
            &format!("SELECT load_extension('{}')", library.display()),
            "the function load_extension()",
        );
        assert_query_refuses(
            &b,
            "SELECT fts3_tokenizer('simple')",
            "the function fts3_tokenizer()",
        );
        assert_query_refuses(
            &b,
            "SELECT optimize(old_notes) FROM old_notes LIMIT 1",
            "the function optimize()",
        );
        // The SQLite shell's file functions are not in the library at all.
        for sql in [
            format!(
                "SELECT writefile('{}', 'x')",
                dir.path().join("written").display()
            ),
            format!("SELECT readfile('{}')", b.db().display()),
            "SELECT edit('x')".to_string(),
        ] {
            let Err(Failure(message)) = b.run("query", &args(json!({"sql": sql}))) else {
                panic!("query ran {sql:?}")
            };
            assert!(message.starts_with("no such function"), "{message}");
        }
        assert!(!dir.path().join("written").exists());
    }

    #[test]
    fn a_refused_statement_after_a_read_is_refused_too() {
        let (dir, b) = seeded();
        let other = dir.path().join("other.sqlite");
        Connection::open(&other).unwrap();
        assert_query_refuses(
            &b,
            &format!("SELECT 1; ATTACH '{}' AS other", other.display()),
            "ATTACH",
        );
        assert_query_refuses(&b, "SELECT 1; DELETE FROM t", "DELETE");
        let Err(Failure(message)) = b.run("query", &args(json!({"sql": "SELECT 1; SELECT 2"})))
        else {
            panic!("query ran two statements")
        };
        assert!(message.contains("Multiple statements"), "{message}");
    }

    #[test]
    fn reads_through_query_still_work() {
        let (_dir, b) = seeded();
        let query = |sql: &str| {
            b.run("query", &args(json!({"sql": sql})))
                .unwrap_or_else(|Failure(message)| panic!("{sql:?}: {message}"))["rows"]
                .clone()
        };
        assert_eq!(
            query("SELECT id, name FROM t ORDER BY id"),
            json!([{"id": 1, "name": "a"}, {"id": 2, "name": "b"}])
        );
        assert_eq!(
            query("SELECT t.name, u.note FROM t JOIN u ON u.t_id = t.id"),
            json!([{"name": "a", "note": "first"}])
        );
        assert_eq!(
            query(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 4) SELECT sum(i) AS s FROM n"
            ),
            json!([{"s": 10}])
        );
        assert_eq!(
            query(
                "SELECT name, row_number() OVER (ORDER BY name DESC) AS r, json_object('n', length(name)) AS j FROM t ORDER BY name"
            ),
            json!([{"name": "a", "r": 2, "j": "{\"n\":1}"}, {"name": "b", "r": 1, "j": "{\"n\":1}"}])
        );
        assert_eq!(
            query("SELECT big FROM names ORDER BY big"),
            json!([{"big": "A"}, {"big": "B"}])
        );
        assert_eq!(
            query("SELECT value FROM json_each('[1, 2]')"),
            json!([{"value": 1}, {"value": 2}])
        );
        assert_eq!(
            query(
                "SELECT highlight(notes, 0, '[', ']') AS h FROM notes WHERE notes MATCH 'hello' ORDER BY bm25(notes)"
            ),
            json!([{"h": "[hello] world"}])
        );
        assert_eq!(
            query("SELECT snippet(old_notes) AS s FROM old_notes WHERE old_notes MATCH 'world'"),
            json!([{"s": "hello <b>world</b>"}])
        );
        assert_eq!(
            query("PRAGMA table_info(t)"),
            json!([
                {"cid": 0, "name": "id", "type": "INTEGER", "notnull": 0, "dflt_value": null, "pk": 1},
                {"cid": 1, "name": "name", "type": "TEXT", "notnull": 0, "dflt_value": null, "pk": 0}
            ])
        );
        assert_eq!(
            query("SELECT name FROM pragma_index_list('t')"),
            json!([{"name": "t_name"}])
        );
        assert_eq!(
            query("SELECT \"table\" FROM pragma_foreign_key_list('u')"),
            json!([{"table": "t"}])
        );
        assert!(
            !query("EXPLAIN QUERY PLAN SELECT * FROM t WHERE name = 'a'")
                .as_array()
                .unwrap()
                .is_empty()
        );
        let tables = b.run("list_tables", &Map::new()).unwrap()["rows"].clone();
        for name in ["notes", "old_notes", "t", "u"] {
            assert!(
                tables.as_array().unwrap().contains(&json!({"name": name})),
                "{tables}"
            );
        }
        assert_eq!(
            b.run("describe_table", &args(json!({"table": "u"})))
                .unwrap()["rows"],
            json!([
                {"name": "t_id", "type": "INTEGER", "notnull": 0, "dflt_value": null, "pk": 0},
                {"name": "note", "type": "TEXT", "notnull": 0, "dflt_value": null, "pk": 0}
            ])
        );
    }

    #[test]
    fn execute_still_runs_what_query_refuses() {
        let (dir, b) = seeded();
        let (other, copy) = (
            dir.path().join("other.sqlite"),
            dir.path().join("copy.sqlite"),
        );
        let sql = format!(
            "ATTACH '{}' AS other; CREATE TABLE other.kept AS SELECT * FROM t; DETACH other;
             BEGIN; INSERT INTO t (name) VALUES ('c'); COMMIT;
             PRAGMA user_version = 7;
             VACUUM INTO '{}'",
            other.display(),
            copy.display()
        );
        // The insert and the row its trigger adds; SQLite counts no changes for CREATE ... AS.
        assert_eq!(
            b.run("execute", &args(json!({"sql": sql}))).unwrap(),
            json!({"changes": 2})
        );
        assert!(other.exists() && copy.exists());
        let count = |path: &Path, sql: &str| -> i64 {
            Connection::open(path)
                .unwrap()
                .query_row(sql, [], |row| row.get(0))
                .unwrap()
        };
        assert_eq!(count(&other, "SELECT count(*) FROM kept"), 2);
        assert_eq!(count(&copy, "SELECT count(*) FROM t"), 3);
        assert_eq!(count(b.db(), "PRAGMA user_version"), 7);
    }
}
