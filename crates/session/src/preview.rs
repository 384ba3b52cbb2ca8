//! Previews of a gated call, made by the desk while the person decides.
//!
//! When a preflight queues a call the desk knows how to look at, it looks, in a task of its own,
//! and attaches what it saw to the waiting request ([`Engine::attach_preview_to_call`]): display
//! only, never part of the plan, the token or what runs.
//!
//! - The built-in `execute`: its SQL rehearsed in a transaction that is rolled back, on the desk's
//!   own connection to the file (`countersign_builtin::rehearse`): rows per table.
//! - A file write, move or new directory (server-filesystem's tools, or a policy's recipe): the
//!   same upstream's read tool asked about the path, and the file shown beside its new content.
//!   The read tool is called only when the upstream lists it, once, with `readOnlyHint: true`:
//!   a recipe cannot make the desk call a tool that may change something without a click.
//! - server-filesystem's `edit_file`: the upstream's own dry run, a call the desk builds itself
//!   (`path`, `edits` as `oldText`/`newText` strings, `dryRun: true`, nothing else of the agent's),
//!   and only when the upstream says it is server-filesystem and declares `dryRun`.
//!
//! Every preview is bounded in time ([`TIME_LIMIT`]) and size; one that cannot be made is
//! attached as unavailable with a code, never dropped.

use countersign_core::Tenant;
use std::sync::Arc;
use std::time::Duration;

use countersign_builtin::rehearse::{self, Mode, Stopped};
use countersign_core::policy::{PreviewKind, PreviewRecipe};
use countersign_core::preview::{self, Preview, TableRows, Unavailable};
use countersign_core::{PlanHash, ServerId};
use countersign_engine::Engine;
use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::Peer;
use serde_json::{Map, Value, json};

use crate::reach::Upstream;

/// How long the desk waits for a preview before showing it as unavailable.
pub const TIME_LIMIT: Duration = Duration::from_secs(3);

/// The name server-filesystem gives itself: its `edit_file` has a documented `dryRun`.
const FILESYSTEM_SERVER: &str = "secure-filesystem-server";

/// Starts the preview of a gated call of `tool` with `arguments`, if the desk knows one: the
/// preflight that queued its request (plan `plan_hash`) starts it, so nothing looks for the
/// request or plans the call again.
pub(crate) fn start(
    engine: &Engine,
    tenant: &Tenant,
    upstream: &Arc<Upstream>,
    tool: &str,
    arguments: &Value,
    plan_hash: PlanHash,
) {
    let Some(server) = engine.server_id_of(tenant) else {
        return;
    };
    let Some(args) = arguments.as_object() else {
        return;
    };
    let job: Job = if let ServerId::Builtin(db) = &server {
        if tool != "execute" {
            return;
        }
        let Some(Value::String(sql)) = args.get("sql") else {
            return;
        };
        Job::Sql {
            db: db.to_owned(),
            sql: sql.clone(),
        }
    } else {
        match engine.policy().recipe(&server.key(), tool) {
            Some(recipe) => Job::Upstream {
                recipe: Box::new(recipe),
                upstream: upstream.clone(),
                args: args.clone(),
                engine: engine.clone(),
                tenant: tenant.to_owned(),
            },
            None => return,
        }
    };
    let (engine, tenant, tool) = (engine.clone(), tenant.to_owned(), tool.to_owned());
    tokio::spawn(async move {
        let preview = bounded(TIME_LIMIT, job.run()).await;
        engine.attach_preview(&tenant, &tool, plan_hash, preview);
    });
}

/// `preview`, or "unavailable: time_limit" when it takes longer than `limit` (an upstream that
/// never answers).
async fn bounded(limit: Duration, preview: impl Future<Output = Preview>) -> Preview {
    match tokio::time::timeout(limit, preview).await {
        Ok(preview) => preview,
        Err(_) => Preview::unavailable(
            Unavailable::TimeLimit,
            format!("no preview within {} ms", limit.as_millis()),
        ),
    }
}

enum Job {
    Sql {
        db: std::path::PathBuf,
        sql: String,
    },
    Upstream {
        // Boxed: a recipe is large beside a query's two fields, and a job waits in a task.
        recipe: Box<PreviewRecipe>,
        upstream: Arc<Upstream>,
        args: Map<String, Value>,
        engine: Engine,
        tenant: Tenant,
    },
}

impl Job {
    async fn run(self) -> Preview {
        match self {
            Job::Sql { db, sql } => {
                let rehearsed = tokio::task::spawn_blocking(move || {
                    rehearse::rehearse(&db, &sql, Mode::Preview)
                })
                .await;
                match rehearsed {
                    Ok(described) => rows(described),
                    Err(e) => Preview::unavailable(Unavailable::Failed, e.to_string()),
                }
            }
            Job::Upstream {
                recipe,
                upstream,
                args,
                engine,
                tenant,
            } => {
                let live = match upstream.live().await {
                    Ok(live) => live,
                    Err(_) => {
                        return Preview::unavailable(
                            Unavailable::UpstreamUnreachable,
                            "the upstream is not running",
                        );
                    }
                };
                let is_filesystem = upstream
                    .info()
                    .server_info
                    .as_ref()
                    .is_some_and(|i| i.name == FILESYSTEM_SERVER);
                // A tool whose definition waits for the person is called by nobody, the desk
                // included.
                let pinned = |tool: &str| engine.runs(&tenant, tool);
                from_upstream(&live.peer, &recipe, &args, is_filesystem, &pinned).await
            }
        }
    }
}

/// The preview of a rehearsal.
fn rows(described: rehearse::Described) -> Preview {
    match (described.rows, described.stopped) {
        (Some(tables), None) => Preview::Rows {
            tables: tables
                .into_iter()
                .map(|t| TableRows {
                    table: t.table,
                    before: t.before,
                    after: t.after,
                    gained: t.gained,
                    lost: t.lost,
                    changed: t.changed,
                    counted_only: t.counted_only,
                })
                .collect(),
        },
        (_, stopped) => {
            let stopped = stopped.unwrap_or(Stopped::Failed("no rows were counted".to_owned()));
            let reason = match stopped {
                Stopped::TimeLimit => Unavailable::TimeLimit,
                Stopped::Busy => Unavailable::DatabaseBusy,
                Stopped::NotRehearsable(_) => Unavailable::NotRehearsable,
                Stopped::Failed(_) => Unavailable::StatementFailed,
                Stopped::TooMany => Unavailable::TooLarge,
                Stopped::NoDatabase(_) => Unavailable::Failed,
            };
            Preview::unavailable(reason, stopped.detail())
        }
    }
}

fn text_arg<'a>(args: &'a Map<String, Value>, name: &str) -> Result<&'a str, Preview> {
    args.get(name).and_then(Value::as_str).ok_or_else(|| {
        Preview::unavailable(
            Unavailable::BadArguments,
            format!("`{name}` is not a string"),
        )
    })
}

/// Whether the upstream lists `tool` exactly once, with `readOnlyHint: true`, and its definition
/// is the one pinned.
async fn read_only(
    peer: &Peer<RoleClient>,
    tool: &str,
    pinned: &(dyn Fn(&str) -> bool + Sync),
) -> Result<(), Preview> {
    if !pinned(tool) {
        return Err(Preview::unavailable(
            Unavailable::ReadToolNotReadOnly,
            format!("`{tool}` is not a pinned tool of this upstream"),
        ));
    }
    let tools = peer
        .list_all_tools()
        .await
        .map_err(|e| Preview::unavailable(Unavailable::UpstreamUnreachable, e.to_string()))?;
    let mut listed = tools.iter().filter(|t| t.name == tool);
    match (listed.next(), listed.next()) {
        (Some(t), None) if t.annotations.as_ref().and_then(|a| a.read_only_hint) == Some(true) => {
            Ok(())
        }
        _ => Err(Preview::unavailable(
            Unavailable::ReadToolNotReadOnly,
            format!("the upstream does not list `{tool}` once with readOnlyHint: true"),
        )),
    }
}

/// A tool's text result, or what it said instead (an error result's text).
fn text_of(result: &CallToolResult) -> (bool, String) {
    let mut text = String::new();
    for block in &result.content {
        if let Some(t) = block.as_text() {
            if text.len() > preview::MAX_FILE_BYTES {
                break;
            }
            text.push_str(&t.text);
        }
    }
    (result.is_error != Some(true), text)
}

async fn call(
    peer: &Peer<RoleClient>,
    tool: &str,
    arguments: Value,
) -> Result<(bool, String), Preview> {
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(arguments.as_object().cloned().unwrap_or_default());
    let result = peer
        .call_tool(params)
        .await
        .map_err(|e| Preview::unavailable(Unavailable::ReadFailed, e.to_string()))?;
    Ok(text_of(&result))
}

async fn from_upstream(
    peer: &Peer<RoleClient>,
    recipe: &PreviewRecipe,
    args: &Map<String, Value>,
    is_filesystem: bool,
    pinned: &(dyn Fn(&str) -> bool + Sync),
) -> Preview {
    match look(peer, recipe, args, is_filesystem, pinned).await {
        Ok(preview) | Err(preview) => preview,
    }
}

async fn look(
    peer: &Peer<RoleClient>,
    recipe: &PreviewRecipe,
    args: &Map<String, Value>,
    is_filesystem: bool,
    pinned: &(dyn Fn(&str) -> bool + Sync),
) -> Result<Preview, Preview> {
    if recipe.kind == PreviewKind::Edit {
        if !pinned("edit_file") {
            return Err(Preview::unavailable(
                Unavailable::ReadToolNotReadOnly,
                "`edit_file` is not a pinned tool of this upstream",
            ));
        }
        return dry_run(peer, args, is_filesystem).await;
    }
    let Some(read) = recipe.read.as_deref() else {
        return Err(Preview::unavailable(
            Unavailable::Failed,
            "the recipe names no read tool",
        ));
    };
    read_only(peer, read, pinned).await?;
    match recipe.kind {
        PreviewKind::Write => {
            let path = text_arg(args, &recipe.path)?;
            let content = text_arg(args, &recipe.content)?;
            if content.len() > preview::MAX_FILE_BYTES {
                return Err(Preview::unavailable(
                    Unavailable::TooLarge,
                    "the new content is too large to compare",
                ));
            }
            let (ok, text) = call(peer, read, json!({ "path": path })).await?;
            if text.len() > preview::MAX_FILE_BYTES {
                return Err(Preview::unavailable(
                    Unavailable::TooLarge,
                    "the file is too large to compare",
                ));
            }
            Ok(if ok {
                preview::file(path, Some(&text), None, content)
            } else {
                preview::file(path, None, Some(&text), content)
            })
        }
        PreviewKind::Move => {
            let source = text_arg(args, &recipe.source)?;
            let destination = text_arg(args, &recipe.destination)?;
            let (exists, _) = call(peer, read, json!({ "path": destination })).await?;
            Ok(Preview::Move {
                source: source.to_owned(),
                destination: destination.to_owned(),
                destination_exists: exists,
            })
        }
        PreviewKind::CreateDir => {
            let path = text_arg(args, &recipe.path)?;
            let (exists, _) = call(peer, read, json!({ "path": path })).await?;
            Ok(Preview::Directory {
                path: path.to_owned(),
                exists,
            })
        }
        PreviewKind::Edit => unreachable!("handled above"),
    }
}

/// server-filesystem's own dry run of an `edit_file` call, rebuilt by the desk.
async fn dry_run(
    peer: &Peer<RoleClient>,
    args: &Map<String, Value>,
    is_filesystem: bool,
) -> Result<Preview, Preview> {
    let declares_dry_run = peer
        .list_all_tools()
        .await
        .map_err(|e| Preview::unavailable(Unavailable::UpstreamUnreachable, e.to_string()))?
        .iter()
        .filter(|t| t.name == "edit_file")
        .map(|t| {
            t.input_schema
                .get("properties")
                .and_then(|p| p.get("dryRun"))
                .is_some()
        })
        .collect::<Vec<_>>()
        == [true];
    if !is_filesystem || !declares_dry_run {
        return Err(Preview::unavailable(
            Unavailable::ReadToolNotReadOnly,
            "only server-filesystem's edit_file has a dry run the desk trusts",
        ));
    }
    let path = text_arg(args, "path")?;
    let bad = || {
        Preview::unavailable(
            Unavailable::BadArguments,
            "`edits` is not a list of oldText/newText strings",
        )
    };
    let edits = args
        .get("edits")
        .and_then(Value::as_array)
        .ok_or_else(bad)?;
    if edits.len() > 256 {
        return Err(bad());
    }
    let mut rebuilt = Vec::with_capacity(edits.len());
    for edit in edits {
        let old = edit
            .get("oldText")
            .and_then(Value::as_str)
            .ok_or_else(bad)?;
        let new = edit
            .get("newText")
            .and_then(Value::as_str)
            .ok_or_else(bad)?;
        rebuilt.push(json!({ "oldText": old, "newText": new }));
    }
    let (ok, text) = call(
        peer,
        "edit_file",
        json!({ "path": path, "edits": rebuilt, "dryRun": true }),
    )
    .await?;
    if !ok {
        return Err(Preview::unavailable(Unavailable::ReadFailed, text));
    }
    Ok(preview::dry_run(path, &text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::ServiceExt;

    /// The built-in tools as an upstream on an in-process pipe (list_tables is read-only,
    /// execute is not), and a client peer on it.
    async fn upstream(dir: &tempfile::TempDir) -> rmcp::service::RunningService<RoleClient, ()> {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let (read, write) = tokio::io::split(theirs);
        tokio::spawn(countersign_builtin::serve(
            dir.path().join("db.sqlite"),
            read,
            write,
        ));
        let (read, write) = tokio::io::split(ours);
        ().serve((read, write)).await.unwrap()
    }

    fn recipe(kind: PreviewKind, read: &str) -> PreviewRecipe {
        PreviewRecipe {
            server: None,
            tool: "save".into(),
            kind,
            read: Some(read.into()),
            path: "p".into(),
            content: "c".into(),
            source: "p".into(),
            destination: "c".into(),
        }
    }

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn reason(p: &Preview) -> Option<Unavailable> {
        match p {
            Preview::Unavailable { reason, .. } => Some(*reason),
            _ => None,
        }
    }

    /// The preview of a write whose recipe reads through `read`, from an upstream that does not
    /// say it is server-filesystem; `callable` is whether tools' definitions let the desk call
    /// them.
    async fn preview_write(
        up: &Peer<RoleClient>,
        read: &str,
        call: &Map<String, Value>,
        callable: bool,
    ) -> Preview {
        from_upstream(up, &recipe(PreviewKind::Write, read), call, false, &|_| {
            callable
        })
        .await
    }

    #[tokio::test]
    async fn a_recipe_cannot_make_the_desk_call_a_tool_that_may_change_something() {
        let dir = tempfile::tempdir().unwrap();
        let up = upstream(&dir).await;
        let call = args(json!({"p": "CREATE TABLE pwned (x)", "c": "x"}));
        for kind in [
            PreviewKind::Write,
            PreviewKind::Move,
            PreviewKind::CreateDir,
        ] {
            let p =
                from_upstream(up.peer(), &recipe(kind, "execute"), &call, false, &|_| true).await;
            assert_eq!(reason(&p), Some(Unavailable::ReadToolNotReadOnly), "{p:?}");
        }
        // A tool the upstream does not list at all.
        let p = preview_write(up.peer(), "nope", &call, true).await;
        assert_eq!(reason(&p), Some(Unavailable::ReadToolNotReadOnly));
        let conn = rusqlite::Connection::open(dir.path().join("db.sqlite")).unwrap();
        let tables: i64 = conn
            .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
            .unwrap();
        assert_eq!(tables, 0, "nothing ran");
    }

    #[tokio::test]
    async fn a_read_tool_whose_definition_waits_for_the_person_is_not_called() {
        let dir = tempfile::tempdir().unwrap();
        let up = upstream(&dir).await;
        let call = args(json!({"p": "/x", "c": "a\n"}));
        let p = preview_write(up.peer(), "list_tables", &call, false).await;
        assert_eq!(reason(&p), Some(Unavailable::ReadToolNotReadOnly));
    }

    #[tokio::test]
    async fn a_write_is_previewed_through_a_read_only_tool_of_the_same_upstream() {
        let dir = tempfile::tempdir().unwrap();
        let up = upstream(&dir).await;
        let call = args(json!({"p": "/x", "c": "a\n"}));
        let p = preview_write(up.peer(), "list_tables", &call, true).await;
        let Preview::File {
            path,
            existed,
            rows,
            ..
        } = p
        else {
            panic!("{p:?}")
        };
        assert_eq!(path, "/x");
        assert!(existed);
        assert!(rows.iter().any(|r| r.after.as_deref() == Some("a")));
        // Arguments of the wrong type are said to be so.
        let bad = args(json!({"p": 5, "c": "a"}));
        let p = preview_write(up.peer(), "list_tables", &bad, true).await;
        assert_eq!(reason(&p), Some(Unavailable::BadArguments));
    }

    #[tokio::test]
    async fn only_server_filesystem_gets_its_edit_dry_run_called() {
        let dir = tempfile::tempdir().unwrap();
        let up = upstream(&dir).await;
        let edit = PreviewRecipe {
            kind: PreviewKind::Edit,
            read: None,
            ..recipe(PreviewKind::Edit, "x")
        };
        let call = args(json!({"path": "/a", "edits": [{"oldText": "a", "newText": "b"}]}));
        let p = from_upstream(up.peer(), &edit, &call, false, &|_| true).await;
        assert_eq!(reason(&p), Some(Unavailable::ReadToolNotReadOnly));
        // Claiming to be server-filesystem is not enough: its edit_file must declare dryRun.
        let p = from_upstream(up.peer(), &edit, &call, true, &|_| true).await;
        assert_eq!(reason(&p), Some(Unavailable::ReadToolNotReadOnly));
    }

    /// An upstream whose read-only `read_text_file` answers with more text than a preview compares.
    #[derive(Clone)]
    struct Huge;

    impl rmcp::ServerHandler for Huge {
        fn get_info(&self) -> rmcp::model::ServerConfig {
            rmcp::model::ServerConfig::new(
                rmcp::model::ServerCapabilities::builder()
                    .enable_tools()
                    .build(),
            )
        }

        async fn list_tools(
            &self,
            _request: Option<rmcp::model::PaginatedRequestParams>,
            _context: rmcp::service::RequestContext<rmcp::RoleServer>,
        ) -> Result<rmcp::model::ListToolsResult, rmcp::ErrorData> {
            let tool = serde_json::from_value(json!({"name": "read_text_file",
                "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": true}}))
            .unwrap();
            Ok(rmcp::model::ListToolsResult::with_all_items(vec![tool]))
        }

        async fn call_tool(
            &self,
            _request: CallToolRequestParams,
            _context: rmcp::service::RequestContext<rmcp::RoleServer>,
        ) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
            let block = rmcp::model::ContentBlock::text("x".repeat(64 * 1024));
            Ok(CallToolResult::success(vec![block; 8]).into())
        }
    }

    #[tokio::test]
    async fn a_file_larger_than_a_preview_compares_is_said_to_be_too_large() {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            let running = Huge.serve(theirs).await.unwrap();
            let _ = running.waiting().await;
        });
        let up = ().serve(ours).await.unwrap();
        let write = PreviewRecipe {
            path: "path".into(),
            content: "content".into(),
            ..recipe(PreviewKind::Write, "read_text_file")
        };
        let call = args(json!({"path": "/big", "content": "small"}));
        let p = from_upstream(up.peer(), &write, &call, false, &|_| true).await;
        assert_eq!(reason(&p), Some(Unavailable::TooLarge), "{p:?}");
    }

    #[tokio::test]
    async fn an_upstream_that_never_answers_is_shown_as_out_of_time() {
        let p = bounded(Duration::from_millis(50), std::future::pending()).await;
        assert_eq!(reason(&p), Some(Unavailable::TimeLimit));
    }

    #[test]
    fn a_rehearsal_that_stopped_is_shown_as_unavailable_with_its_code() {
        let d = rehearse::Described {
            stopped: Some(Stopped::NotRehearsable("ATTACH".into())),
            ..Default::default()
        };
        assert_eq!(reason(&rows(d)), Some(Unavailable::NotRehearsable));
        let d = rehearse::Described {
            stopped: Some(Stopped::TimeLimit),
            ..Default::default()
        };
        assert_eq!(reason(&rows(d)), Some(Unavailable::TimeLimit));
    }
}
