//! The harness the end-to-end tests share: the desk's engine in the test process behind a real
//! Unix socket, the real `countersign mcp` binary spawned as an agent would, and approval the only
//! way the product allows: `Engine::approve` (which the window calls on a click), called here.

use std::path::{Path, PathBuf};
use std::time::Duration;

use countersign_engine::{Engine, EngineConfig, PendingRequest, QueueChange, Removal};
use countersign_session as socket;
use rmcp::model::*;
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, Peer, RoleClient, ServiceExt};
use serde_json::{Map, Value, json};

/// The desk: its engine, serving on a socket in a temporary directory.
pub struct Desk {
    pub engine: Engine,
    _served: socket::Served,
    pub socket: PathBuf,
    pub dir: tempfile::TempDir,
}

pub async fn desk_with(config: impl FnOnce(&mut EngineConfig)) -> Desk {
    desk_on(countersign_store::StoreOptions::default(), config).await
}

/// [`desk_with`], its SQLite file opened with `options`.
pub async fn desk_on(
    options: countersign_store::StoreOptions,
    config: impl FnOnce(&mut EngineConfig),
) -> Desk {
    let dir = tempfile::tempdir().unwrap();
    let records = std::sync::Arc::new(countersign_store::Sqlite::open_deferred(
        dir.path().join("desk.sqlite"),
        options,
    ));
    let mut cfg = countersign_tests::engine::config();
    cfg.describer = Some(std::sync::Arc::new(
        countersign_session::SqlDescriber::default(),
    ));
    config(&mut cfg);
    let engine = Engine::new(cfg, records, Ok(countersign_tests::engine::key()));
    let socket = dir.path().join("run/desk.sock");
    let served = socket::serve(engine.clone(), socket.clone()).await.unwrap();
    Desk {
        engine,
        _served: served,
        socket,
        dir,
    }
}

pub async fn desk() -> Desk {
    desk_with(|_| {}).await
}

impl Desk {
    /// The upstream process groups the desk has running.
    pub fn children(&self) -> &countersign_session::Children {
        self._served.children()
    }
}

/// An agent with no handler of its own (the default client).
pub type Agent = RunningService<RoleClient, ClientConfig>;

/// `countersign mcp --no-launch --socket SOCKET EXTRA...`, as an agent's configuration starts it.
/// Its stderr is inherited (the test's output shows the gateway's and the upstream's messages).
pub fn gateway_command(socket: &Path, extra: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_countersign"));
    cmd.arg("mcp")
        .arg("--no-launch")
        .arg("--socket")
        .arg(socket)
        .args(extra);
    cmd.env("RUST_LOG", "warn");
    cmd
}

/// Starts `cmd` (a gateway) and connects `handler` to it as the agent.
pub async fn connect<H: ClientHandler>(
    cmd: tokio::process::Command,
    handler: H,
) -> RunningService<RoleClient, H> {
    let transport = TokioChildProcess::new(cmd).unwrap();
    handler.serve(transport).await.unwrap()
}

/// The plain agent's client configuration.
pub fn plain_client() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("test-agent", "1.0"),
    )
}

/// A plain agent on a gateway serving the built-in tools on `db`.
pub async fn agent_on(socket: &Path, db: &Path, extra: &[&str]) -> Agent {
    let mut args = vec!["--db", db.to_str().unwrap()];
    args.extend_from_slice(extra);
    connect(gateway_command(socket, &args), plain_client()).await
}

/// A plain agent on the built-in tools, with the desk's decision awaited for up to 10 s.
pub async fn agent(desk: &Desk) -> Agent {
    agent_on(
        &desk.socket,
        &desk.dir.path().join("app.sqlite"),
        &["--wait", "10"],
    )
    .await
}

pub fn obj(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

pub async fn call(agent: &Peer<RoleClient>, tool: &str, args: Value) -> CallToolResult {
    agent
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(obj(args)))
        .await
        .unwrap()
}

pub fn refusal(r: &CallToolResult) -> Option<String> {
    r.structured_content
        .as_ref()?
        .get("refusal")?
        .as_str()
        .map(str::to_owned)
}

pub fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The next request to reach the desk's queue.
pub async fn next_request(
    changes: &mut tokio::sync::broadcast::Receiver<QueueChange>,
) -> PendingRequest {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match changes.recv().await {
                Ok(QueueChange::Added { request }) => return *request,
                Ok(_) => {}
                Err(e) => panic!("the desk's queue closed: {e}"),
            }
        }
    })
    .await
    .expect("no request reached the desk within 30 s")
}

/// The next request to leave the desk's queue: its id and why.
pub async fn next_removal(
    changes: &mut tokio::sync::broadcast::Receiver<QueueChange>,
) -> (u64, Removal) {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match changes.recv().await {
                Ok(QueueChange::Removed { id, reason }) => return (id, reason),
                Ok(_) => {}
                Err(e) => panic!("the desk's queue closed: {e}"),
            }
        }
    })
    .await
    .expect("no request left the desk's queue within 30 s")
}

/// Approves the next request to reach the desk's queue, as a click would (typing the target
/// where policy asks for it), and hands back that request.
pub fn click_approve(engine: &Engine) -> tokio::task::JoinHandle<PendingRequest> {
    let engine = engine.clone();
    let mut changes = engine.subscribe();
    tokio::spawn(async move {
        let request = next_request(&mut changes).await;
        let typed = request.type_target().then(|| request.plan.target.clone());
        engine.approve(request.id, typed.as_deref()).await.unwrap();
        request
    })
}

/// The confirm arguments for `args` and an approved preflight's result.
pub fn confirm_args(args: &Value, preflight: &CallToolResult) -> Value {
    let s = preflight
        .structured_content
        .clone()
        .unwrap_or_else(|| panic!("preflight without structuredContent: {preflight:?}"));
    let mut confirm = args.clone();
    confirm["confirm"] = json!(true);
    confirm["confirmTarget"] = s["confirmTarget"].clone();
    confirm["confirmToken"] = s["confirmToken"].clone();
    confirm
}

/// A preflight approved by a click; returns the confirm arguments for it.
pub async fn approved(desk: &Desk, agent: &Peer<RoleClient>, tool: &str, args: Value) -> Value {
    let click = click_approve(&desk.engine);
    let r = call(agent, tool, args.clone()).await;
    click.await.unwrap();
    assert_ne!(r.is_error, Some(true), "preflight not approved: {r:?}");
    confirm_args(&args, &r)
}
