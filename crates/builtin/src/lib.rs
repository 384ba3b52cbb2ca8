//! The built-in tools `countersign mcp --db PATH` serves when it has no upstream command.
//!
//! They make the whole flow (open, `token` and `once` tools, refusals, history) work on a fresh
//! machine with nothing else installed, on a real SQLite file with real errors for bad SQL. Each
//! tool carries honest MCP annotations, and the gate classes follow from them like any
//! upstream's: `list_tables`, `describe_table` and `query` are read-only (`open`; `query` runs on
//! a read-only connection, so annotation and behaviour agree); `execute` changes data (`once`);
//! `create_backup` is idempotent and non-destructive (`token`); `restore_backup` and
//! `delete_backup` are destructive (`once`).
#![deny(missing_docs)]

use std::path::{Path, PathBuf};

use rmcp::model::*;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};
use serde_json::{Map, Value, json};

/// The most rows a `query` returns; more are reported as truncated.
pub const MAX_ROWS: usize = 1000;

/// The built-in tools on one SQLite file.
#[derive(Debug, Clone)]
pub struct Builtin {
    db: PathBuf,
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

/// A tool failure the agent should read: bad SQL, a missing table or backup.
#[derive(Debug)]
struct Failure(String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(e.to_string())
    }
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
        Self { db: db.into() }
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

    fn read_only(&self) -> Result<Connection, Failure> {
        if !self.db.exists() {
            return Err(Failure(format!(
                "the database {} does not exist yet",
                self.db.display()
            )));
        }
        let conn = Connection::open_with_flags(
            &self.db,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.pragma_update(None, "query_only", true)?;
        Ok(conn)
    }

    fn writable(&self) -> Result<Connection, Failure> {
        let conn = Connection::open(&self.db)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        Ok(conn)
    }

    fn rows(
        conn: &Connection,
        sql: &str,
        params: &[&dyn rusqlite::ToSql],
    ) -> Result<Value, Failure> {
        let mut stmt = conn.prepare(sql)?;
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
                let before = conn.total_changes();
                conn.execute_batch(sql)?;
                Ok(json!({"changes": conn.total_changes() - before}))
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
                let mut target = self.writable()?;
                let backup = rusqlite::backup::Backup::new(&source, &mut target)?;
                backup.run_to_completion(256, std::time::Duration::from_millis(0), None)?;
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
}
