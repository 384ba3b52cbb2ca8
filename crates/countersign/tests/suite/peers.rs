//! `countersign mcp` between real MCP peers that Countersign did not write: the official Python SDK
//! as the agent, and the reference servers `@modelcontextprotocol/server-everything` and
//! `@modelcontextprotocol/server-filesystem` as upstreams. The desk's engine runs in this test
//! process, as in `gateway.rs`; approval is `Engine::approve`, as a click in the window.
//!
//! The peers are installed, at the versions pinned below, by `.ci/setup tests` into `target/peers`; a
//! test whose peer is missing fails and says so.
#![allow(deprecated)] // roots are deprecated in rmcp 3.x (SEP-2577); MCP clients and servers still use them

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use countersign_engine::{PendingRequest, QueueChange};
use rmcp::model::*;
use rmcp::service::{NotificationContext, PeerRequestOptions, RequestContext, RunningService};
use rmcp::{ClientHandler, ErrorData, Peer, RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;

pub(crate) use countersign_tests::peers::python;
use countersign_tests::peers::{PYTHON_MCP, SERVER_EVERYTHING, SERVER_FILESYSTEM, npm_server};

fn server_everything() -> PathBuf {
    npm_server(SERVER_EVERYTHING, "mcp-server-everything")
}

fn server_filesystem() -> PathBuf {
    npm_server(SERVER_FILESYSTEM, "mcp-server-filesystem")
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A directory for a test's files, with its canonical path (what servers compare against).
fn workdir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().canonicalize().unwrap();
    (dir, path)
}

// ---------------------------------------------------------------------------------------------
// The official Python SDK as the agent.

/// What the Python agent printed (its JSON lines, by step), the request the desk saw, and the
/// messages the agent sent the gateway.
struct PythonRun {
    steps: Vec<(String, Value)>,
    request: countersign_engine::PendingRequest,
    sent: Vec<Value>,
}

/// Runs the Python script `tests/peers/SCRIPT` with `args` (the desk approving what reaches its
/// queue through `click`), and returns the steps it printed (one JSON line each) and the request
/// the desk saw.
async fn run_python_agent(
    script: &str,
    args: &[&std::ffi::OsStr],
    click: tokio::task::JoinHandle<countersign_engine::PendingRequest>,
) -> (Vec<(String, Value)>, countersign_engine::PendingRequest) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/peers")
        .join(script);
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(&script)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("the Python agent did not finish within 120 s")
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "the Python agent failed ({}); it printed:\n{stdout}\nand on stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let steps = stdout
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
            (v["step"].as_str().unwrap().to_owned(), v)
        })
        .collect::<Vec<_>>();
    let request = tokio::time::timeout(Duration::from_secs(5), click)
        .await
        .expect("the desk never saw the preflight")
        .unwrap();
    (steps, request)
}

/// Runs `tests/peers/python_agent.py` in `mode` against `countersign mcp` on the built-in tools,
/// approving its one preflight at the desk.
async fn python_agent(mode: &str) -> PythonRun {
    let desk = desk().await;
    let wire = desk.dir.path().join("agent-out.jsonl");
    let click = click_approve(&desk.engine);
    let db = desk.dir.path().join("app.sqlite");
    let args = [
        mode.as_ref(),
        env!("CARGO_BIN_EXE_countersign").as_ref(),
        desk.socket.as_os_str(),
        db.as_os_str(),
        wire.as_os_str(),
    ];
    let (steps, request) = run_python_agent("python_agent.py", &args, click).await;
    PythonRun {
        steps,
        request,
        sent: recorded_messages(&wire),
    }
}

fn step<'a>(steps: &'a [(String, Value)], name: &str) -> &'a Value {
    steps
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no step {name:?} in {steps:#?}"))
}

fn result_text(result: &Value) -> String {
    result["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

async fn python_agent_flow(mode: &str) -> PythonRun {
    let run = python_agent(mode).await;
    let (steps, request) = (&run.steps, &run.request);
    let names: Vec<&str> = steps.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "connected",
            "tools",
            "open",
            "preflight",
            "confirm",
            "replay",
            "tables"
        ],
        "{steps:#?}"
    );

    let connected = step(steps, "connected");
    assert_eq!(
        connected["sdk"],
        json!(PYTHON_MCP),
        "the Python SDK is not the pinned mcp=={PYTHON_MCP}: run .ci/setup tests"
    );
    assert_eq!(connected["server"], json!("countersign-builtin"));

    // The desk knows which agent asks: the SDK's own clientInfo, in either protocol.
    assert_eq!(
        request.call().unwrap().client_info["name"],
        json!("mcp"),
        "{request:?}"
    );
    assert_eq!(request.plan.tool, "execute");

    let tools = step(steps, "tools")["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 7, "{tools:?}");
    let tool = |name: &str| tools.iter().find(|t| t["name"] == json!(name)).unwrap();
    assert_eq!(tool("query")["readOnly"], json!(true));
    assert!(
        !tool("query")["properties"]
            .as_array()
            .unwrap()
            .contains(&json!("confirmToken"))
    );
    assert_eq!(tool("execute")["readOnly"], json!(false));
    for arg in ["sql", "confirm", "confirmTarget", "confirmToken"] {
        assert!(
            tool("execute")["properties"]
                .as_array()
                .unwrap()
                .contains(&json!(arg)),
            "execute lacks {arg}"
        );
    }

    let open = &step(steps, "open")["result"];
    assert_eq!(open["isError"], json!(false), "{open}");
    assert_eq!(open["structuredContent"]["rows"], json!([{"answer": 42}]));

    let preflight = &step(steps, "preflight")["result"];
    assert_eq!(preflight["isError"], json!(false), "{preflight}");
    let token = preflight["structuredContent"]["confirmToken"]
        .as_str()
        .unwrap();
    // execute's target is the table its SQL writes, as SQLite's authorizer reports it.
    assert_eq!(
        preflight["structuredContent"]["confirmTarget"],
        json!("from_python")
    );
    let body = result_text(preflight);
    assert!(
        body.ends_with(&format!(
            "confirmToken: {token} (expires in 10 minutes, works once)"
        )),
        "{body}"
    );

    let confirm = &step(steps, "confirm")["result"];
    assert_eq!(confirm["isError"], json!(false), "{confirm}");
    let tables = &step(steps, "tables")["result"];
    assert!(
        tables["structuredContent"]
            .to_string()
            .contains("from_python"),
        "the confirmed CREATE TABLE did not run: {tables}"
    );

    let replay = &step(steps, "replay")["result"];
    assert_eq!(replay["isError"], json!(true), "{replay}");
    assert_eq!(
        replay["structuredContent"]["refusal"],
        json!("already_used")
    );
    run
}

/// `mode="auto"`: the SDK first asks for the newest protocol (2026-07-28) with `server/discover`.
/// The desk opens the upstream the same way (the built-in tools are an rmcp server that speaks
/// 2026-07-28), so the agent gets the revision it would get talking to the upstream directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_agent_in_auto_mode_negotiates_2026_07_28_through_the_desk_and_completes_the_flow()
 {
    let run = python_agent_flow("auto").await;
    let first = &run.sent[0];
    assert_eq!(first["method"], json!("server/discover"), "{:?}", run.sent);
    assert_eq!(
        first["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"],
        json!("2026-07-28")
    );
    assert!(
        run.sent.iter().all(|m| m["method"] != json!("initialize")),
        "no handshake on 2026-07-28: {:?}",
        run.sent
    );
    assert_eq!(
        step(&run.steps, "connected")["protocol"],
        json!("2026-07-28")
    );
}

/// `mode="legacy"`: the initialize handshake from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_agent_in_legacy_mode_preflights_confirms_and_is_refused_a_replay() {
    let run = python_agent_flow("legacy").await;
    assert_eq!(run.sent[0]["method"], json!("initialize"), "{:?}", run.sent);
    assert_eq!(
        run.sent[0]["params"]["protocolVersion"],
        json!("2025-11-25")
    );
    assert_eq!(
        step(&run.steps, "connected")["protocol"],
        json!("2025-11-25")
    );
}

/// The Python SDK on both sides of the desk: `tests/peers/python_pair.py` (the SDK's client in
/// `mode`) through `countersign mcp` to `tests/peers/python_server.py` (the SDK's `MCPServer`),
/// approving the one preflight at the desk. Returns the agent's steps and the notes file.
async fn python_pair(mode: &str) -> (Vec<(String, Value)>, String) {
    let desk = desk().await;
    let notes = desk.dir.path().join("notes.txt");
    let server = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/peers/python_server.py");
    let click = click_approve(&desk.engine);
    let python = python();
    let args = [
        mode.as_ref(),
        env!("CARGO_BIN_EXE_countersign").as_ref(),
        desk.socket.as_os_str(),
        python.as_os_str(),
        server.as_os_str(),
        notes.as_os_str(),
    ];
    let (steps, request) = run_python_agent("python_pair.py", &args, click).await;
    assert_eq!(request.plan.tool, "note");
    assert_eq!(
        request.call().unwrap().class,
        countersign_core::GateClass::Once
    );
    // Whatever the revision, the flow holds: approved, run once, the replay refused.
    assert_eq!(
        step(&steps, "preflight")["approved"],
        json!(true),
        "{steps:?}"
    );
    assert_eq!(
        step(&steps, "confirm")["is_error"],
        json!(false),
        "{steps:?}"
    );
    assert_eq!(
        step(&steps, "replay")["refusal"],
        json!("already_used"),
        "{steps:?}"
    );
    let noted = std::fs::read_to_string(&notes).unwrap_or_default();
    (steps, noted)
}

/// Directly, the SDK's client in auto mode and its `MCPServer` speak 2026-07-28; through the desk
/// they do too, on both sides: the agent negotiated it, and the upstream served the open call
/// under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_client_and_server_speak_2026_07_28_through_the_desk() {
    let (steps, noted) = python_pair("auto").await;
    assert_eq!(step(&steps, "connected")["protocol"], json!("2026-07-28"));
    assert_eq!(
        step(&steps, "whoami")["text"],
        json!("protocol 2026-07-28"),
        "{steps:?}"
    );
    assert_eq!(noted, "from python\n");
}

/// The same pair with the client on the handshake: 2025-11-25 on both sides, as directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_client_in_legacy_mode_and_server_speak_2025_11_25_through_the_desk() {
    let (steps, noted) = python_pair("legacy").await;
    assert_eq!(step(&steps, "connected")["protocol"], json!("2025-11-25"));
    assert_eq!(
        step(&steps, "whoami")["text"],
        json!("protocol 2025-11-25"),
        "{steps:?}"
    );
    assert_eq!(noted, "from python\n");
}

// ---------------------------------------------------------------------------------------------
// An rmcp agent that records what the gateway sends it: progress, and requests for its roots.

#[derive(Clone)]
struct Recording {
    info: ClientConfig,
    roots: Vec<Root>,
    roots_asked: Arc<AtomicUsize>,
    progress: mpsc::UnboundedSender<ProgressNotificationParam>,
}

impl Recording {
    /// An agent offering `roots` when given (declaring the roots capability), else none.
    fn new(roots: Option<Vec<Root>>) -> (Self, mpsc::UnboundedReceiver<ProgressNotificationParam>) {
        let capabilities = match roots {
            Some(_) => ClientCapabilities::builder()
                .enable_roots()
                .enable_roots_list_changed()
                .build(),
            None => ClientCapabilities::default(),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let agent = Self {
            info: ClientConfig::new(capabilities, Implementation::new("peer-agent", "1.0")),
            roots: roots.unwrap_or_default(),
            roots_asked: Arc::default(),
            progress: tx,
        };
        (agent, rx)
    }
}

impl ClientHandler for Recording {
    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }

    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        self.roots_asked.fetch_add(1, Ordering::SeqCst);
        Ok(ListRootsResult::new(self.roots.clone()))
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.progress.send(params);
    }
}

type PeerAgent = RunningService<RoleClient, Recording>;

/// `countersign mcp` in front of `upstream`, with `agent` connected to it.
async fn agent_before(desk: &Desk, agent: Recording, upstream: &[&str]) -> PeerAgent {
    let mut args = vec!["--wait", "20", "--"];
    args.extend_from_slice(upstream);
    connect(gateway_command(&desk.socket, &args), agent).await
}

/// Starts the gateway `cmd`, and connects `agent` to it only once `then` has passed: an agent
/// that sends its `initialize` late. Returns the agent and the gateway's process.
async fn connect_after(
    mut cmd: tokio::process::Command,
    agent: Recording,
    then: Duration,
) -> (PeerAgent, tokio::process::Child) {
    use tokio::io::AsyncBufReadExt;
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    // Keep passing its stderr on, so that it never blocks on a full pipe.
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("{line}");
        }
    });
    tokio::time::sleep(then).await;
    let io = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    (agent.serve(io).await.unwrap(), child)
}

/// An upstream command line that runs `server` behind a `tee` recording, in `log`, every message
/// the gateway sends it.
fn recorded<'a>(log: &'a Path, server: &'a Path) -> [&'a str; 5] {
    ["sh", "-c", r#"tee -a "$0" | exec "$@""#, s(log), s(server)]
}

/// The `_meta.progressToken`s of the `tools/call`s of `tool` among recorded `messages`.
fn progress_tokens_sent(messages: &[Value], tool: &str) -> Vec<Value> {
    messages
        .iter()
        .filter(|m| m["method"] == json!("tools/call") && m["params"]["name"] == json!(tool))
        .map(|m| m["params"]["_meta"]["progressToken"].clone())
        .collect()
}

/// Sends a `tools/call` whose handle the test keeps (to read its progress token, or cancel it).
async fn send_call(
    agent: &Peer<RoleClient>,
    tool: &str,
    args: Value,
) -> rmcp::service::RequestHandle<RoleClient> {
    let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(obj(args));
    agent
        .send_request_with_option(
            ClientRequest::CallToolRequest(CallToolRequest::new(params)),
            PeerRequestOptions::no_options(),
        )
        .await
        .unwrap()
}

async fn tool_result(handle: rmcp::service::RequestHandle<RoleClient>) -> CallToolResult {
    match handle.await_response().await.unwrap() {
        ServerResult::CallToolResult(r) => r,
        other => panic!("not a tool result: {other:?}"),
    }
}

/// Requests that never reach the upstream, so that the agent's progress tokens (rmcp numbers
/// them per connection) are not the ones the gateway uses upstream by coincidence.
async fn advance_progress_tokens(agent: &Peer<RoleClient>, n: usize) {
    for _ in 0..n {
        agent
            .send_request(ClientRequest::PingRequest(Default::default()))
            .await
            .unwrap();
    }
}

fn no_desk_request(changes: &mut tokio::sync::broadcast::Receiver<QueueChange>) {
    match changes.try_recv() {
        Err(tokio::sync::broadcast::error::TryRecvError::Empty) => {}
        other => panic!("the desk was asked: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// @modelcontextprotocol/server-everything as the upstream.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_open_tools_pass_through_with_structured_content_and_every_field_kept() {
    let server = server_everything();
    let desk = desk().await;
    let mut changes = desk.engine.subscribe();
    let (recording, _progress) = Recording::new(None);
    let agent = agent_before(&desk, recording, &[s(&server)]).await;
    assert_eq!(
        agent
            .peer_info()
            .unwrap()
            .server_info
            .as_ref()
            .unwrap()
            .name,
        "mcp-servers/everything",
        "the gateway mirrors the upstream's serverInfo"
    );

    let tools = agent.list_all_tools().await.unwrap();
    let tool = |name: &str| {
        tools
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("{name} not listed"))
    };
    let has_confirm = |name: &str| {
        tool(name).input_schema.contains_key("properties")
            && tool(name).input_schema["properties"]
                .as_object()
                .unwrap()
                .contains_key("confirmToken")
    };
    // Read-only tools are listed as the upstream sent them, output schema included.
    let structured = tool("get-structured-content");
    assert_eq!(
        structured.annotations.as_ref().unwrap().read_only_hint,
        Some(true)
    );
    assert!(structured.output_schema.is_some());
    assert!(!has_confirm("get-structured-content"));
    assert!(!has_confirm("echo"));
    assert!(!has_confirm("trigger-long-running-operation"));
    // Tools that change something are gated.
    for gated in ["toggle-subscriber-updates", "toggle-simulated-logging"] {
        assert!(has_confirm(gated), "{gated} is not gated");
        assert!(tool(gated).output_schema.is_none());
    }

    let r = call(
        &agent,
        "get-structured-content",
        json!({"location": "Chicago"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    let weather = json!({"temperature": 36, "conditions": "Light rain / drizzle", "humidity": 82});
    assert_eq!(r.structured_content, Some(weather.clone()));
    assert_eq!(serde_json::from_str::<Value>(&text(&r)).unwrap(), weather);

    let r = call(&agent, "echo", json!({"message": "through the gateway"})).await;
    assert_eq!(text(&r), "Echo: through the gateway");

    let r = call(&agent, "get-sum", json!({"a": 2, "b": 40})).await;
    assert!(text(&r).contains("42"), "{r:?}");

    no_desk_request(&mut changes);
    assert!(desk.engine.pending().is_empty());
}

/// Resources, prompts and logging pass through the desk typed, with nothing queued for a person.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_resources_prompts_and_logging_pass_through() {
    let server = server_everything();
    let desk = desk().await;
    let (recording, _progress) = Recording::new(None);
    let agent = agent_before(&desk, recording, &[s(&server)]).await;
    let resources = agent.list_all_resources().await.unwrap();
    let first = resources
        .first()
        .expect("server-everything lists resources");
    let read = agent
        .read_resource(ReadResourceRequestParams::new(first.uri.clone()))
        .await
        .unwrap();
    assert!(!read.contents.is_empty(), "{read:?}");
    let prompts = agent.list_all_prompts().await.unwrap();
    let simple = prompts
        .iter()
        .find(|p| {
            p.arguments
                .as_ref()
                .is_none_or(|a| a.iter().all(|x| x.required != Some(true)))
        })
        .expect("a prompt without required arguments");
    let got = agent
        .get_prompt(GetPromptRequestParams::new(simple.name.clone()))
        .await
        .unwrap();
    assert!(!got.messages.is_empty(), "{got:?}");
    agent
        .set_level(SetLevelRequestParams::new(LoggingLevel::Warning))
        .await
        .unwrap();
    assert!(desk.engine.pending().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_gated_tool_runs_after_approval_once() {
    let server = server_everything();
    let desk = desk().await;
    let (recording, _progress) = Recording::new(None);
    let agent = agent_before(&desk, recording, &[s(&server)]).await;

    let click = click_approve(&desk.engine);
    let preflight = call(&agent, "toggle-subscriber-updates", json!({})).await;
    let request = click.await.unwrap();
    // The desk's name for the server is what it runs, never a name the server or gateway gives.
    assert_eq!(request.server(), Some(s(&server)));
    assert_eq!(request.plan.tool, "toggle-subscriber-updates");
    assert_eq!(
        request.call().unwrap().client_info["name"],
        json!("peer-agent")
    );
    assert_ne!(preflight.is_error, Some(true), "{preflight:?}");
    assert!(
        text(&preflight).ends_with("(expires in 10 minutes, works once)"),
        "{}",
        text(&preflight)
    );

    let confirm = confirm_args(&json!({}), &preflight);
    let r = call(&agent, "toggle-subscriber-updates", confirm.clone()).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert!(
        text(&r).starts_with("Started simulated resource updated notifications"),
        "the upstream did not run it: {r:?}"
    );
    let again = call(&agent, "toggle-subscriber-updates", confirm).await;
    assert_eq!(refusal(&again).as_deref(), Some("already_used"));
}

/// Collects progress notifications until `done` says enough or `within` passes.
async fn collect_progress(
    rx: &mut mpsc::UnboundedReceiver<ProgressNotificationParam>,
    within: Duration,
    mut done: impl FnMut(&[ProgressNotificationParam]) -> bool,
) -> Vec<ProgressNotificationParam> {
    let mut seen = Vec::new();
    let _ = tokio::time::timeout(within, async {
        while !done(&seen) {
            match rx.recv().await {
                Some(p) => seen.push(p),
                None => break,
            }
        }
    })
    .await;
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_progress_reaches_the_agent_under_its_own_tokens() {
    let server = server_everything();
    let desk = desk().await;
    let log = desk.dir.path().join("upstream-in.jsonl");
    let (recording, mut progress) = Recording::new(None);
    let agent = agent_before(&desk, recording, &recorded(&log, &server)).await;
    agent.list_all_tools().await.unwrap();
    advance_progress_tokens(&agent, 7).await;

    // Two operations at once, with different step counts: each one's progress must come back
    // under the token its own request carried.
    let short = send_call(
        &agent,
        "trigger-long-running-operation",
        json!({"duration": 1, "steps": 2}),
    )
    .await;
    let long = send_call(
        &agent,
        "trigger-long-running-operation",
        json!({"duration": 2, "steps": 4}),
    )
    .await;
    let (short_token, long_token) = (short.progress_token.clone(), long.progress_token.clone());
    assert_ne!(short_token, long_token);
    let (a, b) = tokio::join!(tool_result(short), tool_result(long));
    assert!(text(&a).contains("Steps: 2"), "{a:?}");
    assert!(text(&b).contains("Steps: 4"), "{b:?}");

    let seen = collect_progress(&mut progress, Duration::from_secs(5), |seen| {
        seen.len() >= 6
    })
    .await;
    let of = |token: &ProgressToken| {
        seen.iter()
            .filter(|p| &p.progress_token == token)
            .map(|p| (p.progress, p.total))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        of(&short_token),
        [(1.0, Some(2.0)), (2.0, Some(2.0))],
        "{seen:?}"
    );
    assert_eq!(
        of(&long_token),
        [
            (1.0, Some(4.0)),
            (2.0, Some(4.0)),
            (3.0, Some(4.0)),
            (4.0, Some(4.0))
        ],
        "{seen:?}"
    );
    assert_eq!(
        seen.len(),
        6,
        "progress under tokens the agent never used: {seen:?}"
    );

    // The upstream saw tokens of the gateway's own, not the agent's: the mapping did the work.
    let upstream = progress_tokens_sent(&recorded_messages(&log), "trigger-long-running-operation");
    assert_eq!(upstream.len(), 2, "{upstream:?}");
    for token in [&short_token, &long_token] {
        let token = serde_json::to_value(token).unwrap();
        assert!(
            !upstream.contains(&token),
            "the agent's token {token} went upstream as it was: {upstream:?}"
        );
    }
}

/// The messages recorded by a `tee` on a peer's input, line by line.
fn recorded_messages(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_cancelled_call_is_cancelled_upstream_and_the_gateway_stays_healthy() {
    let server = server_everything();
    let desk = desk().await;
    let log = desk.dir.path().join("upstream-in.jsonl");
    let (recording, mut progress) = Recording::new(None);
    let agent = agent_before(&desk, recording, &recorded(&log, &server)).await;
    agent.list_all_tools().await.unwrap();

    let handle = send_call(
        &agent,
        "trigger-long-running-operation",
        json!({"duration": 30, "steps": 30}),
    )
    .await;
    let token = handle.progress_token.clone();
    let first = collect_progress(&mut progress, Duration::from_secs(10), |s| !s.is_empty()).await;
    assert_eq!(first.len(), 1, "the operation never reported progress");
    assert_eq!(first[0].progress_token, token);
    handle
        .cancel(Some("the agent changed its mind".into()))
        .await
        .unwrap();

    // The cancellation reached the upstream, naming the request the gateway sent it.
    let cancelled = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let seen = recorded_messages(&log);
            let call_id = seen
                .iter()
                .find(|m| {
                    m["method"] == json!("tools/call")
                        && m["params"]["name"] == json!("trigger-long-running-operation")
                })
                .map(|m| m["id"].clone());
            let cancel = seen
                .iter()
                .find(|m| m["method"] == json!("notifications/cancelled"))
                .cloned();
            if let (Some(id), Some(cancel)) = (call_id, cancel) {
                return (id, cancel);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("no notifications/cancelled reached the upstream");
    assert_eq!(
        cancelled.1["params"]["requestId"], cancelled.0,
        "{cancelled:?}"
    );

    // The upstream keeps reporting progress for the operation it may still be running; none of
    // it reaches the agent under a token it has given up.
    let late = collect_progress(&mut progress, Duration::from_millis(2500), |_| false).await;
    assert!(late.is_empty(), "progress after the cancel: {late:?}");

    // The gateway and the upstream still serve: open calls, and another operation to its end.
    let r = call(&agent, "get-sum", json!({"a": 20, "b": 22})).await;
    assert!(text(&r).contains("42"), "{r:?}");
    let handle = send_call(
        &agent,
        "trigger-long-running-operation",
        json!({"duration": 0.4, "steps": 2}),
    )
    .await;
    let token = handle.progress_token.clone();
    let r = tool_result(handle).await;
    assert!(
        text(&r).contains("Long running operation completed"),
        "{r:?}"
    );
    let seen = collect_progress(&mut progress, Duration::from_secs(3), |s| s.len() >= 2).await;
    assert!(seen.iter().all(|p| p.progress_token == token), "{seen:?}");
    assert_eq!(seen.len(), 2, "{seen:?}");
}

// ---------------------------------------------------------------------------------------------
// @modelcontextprotocol/server-filesystem as the upstream.

fn file_root(dir: &Path) -> Root {
    Root::new(format!("file://{}", dir.display())).with_name("workspace")
}

async fn allowed_directories(agent: &Peer<RoleClient>) -> String {
    let r = call(agent, "list_allowed_directories", json!({})).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    r.structured_content.unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Waits until the server's allowed directories mention `dir`; returns what it last said.
async fn allowed_until(agent: &Peer<RoleClient>, dir: &Path) -> String {
    let mut last = String::new();
    for _ in 0..50 {
        last = allowed_directories(agent).await;
        if last.lines().any(|l| l == s(dir)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

/// server-filesystem asks its client for roots right after the handshake (when the client
/// declares the roots capability) and replaces its allowed directories with them. Through the
/// desk, that client is the agent, and the question must reach it even though the desk completes
/// the upstream's handshake (started when the agent's `initialize` arrives, here a moment after
/// the gateway started, as hosts that start many servers do) before it answers the agent's: the
/// upstream asks before the agent's session is initialized.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_asks_the_agent_for_its_roots_and_follows_them() {
    let server = server_filesystem();
    let desk = desk().await;
    let (_started, started_dir) = workdir();
    let (_root, root_dir) = workdir();
    let (recording, _progress) = Recording::new(Some(vec![file_root(&root_dir)]));
    let asked = recording.roots_asked.clone();
    let cmd = gateway_command(&desk.socket, &["--", s(&server), s(&started_dir)]);
    let (agent, _gateway) = connect_after(cmd, recording, Duration::from_secs(1)).await;

    let allowed = allowed_until(&agent, &root_dir).await;
    assert!(
        asked.load(Ordering::SeqCst) >= 1,
        "the agent was never asked for its roots; the upstream still allows: {allowed}"
    );
    assert_eq!(
        allowed,
        format!("Allowed directories:\n{}", root_dir.display()),
        "the upstream's allowed directories do not follow the agent's roots"
    );
}

/// When the agent says its roots changed, the upstream asks again (through the gateway) and
/// follows the new list: writing is then allowed where the agent's root is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_follows_the_agents_roots_after_it_says_they_changed() {
    let server = server_filesystem();
    let desk = desk().await;
    let (_started, started_dir) = workdir();
    let (_root, root_dir) = workdir();
    let (recording, _progress) = Recording::new(Some(vec![file_root(&root_dir)]));
    let asked = recording.roots_asked.clone();
    let agent = agent_before(&desk, recording, &[s(&server), s(&started_dir)]).await;
    let before = asked.load(Ordering::SeqCst);

    agent.notify_roots_list_changed().await.unwrap();
    let allowed = allowed_until(&agent, &root_dir).await;
    assert!(
        asked.load(Ordering::SeqCst) > before,
        "the agent was not asked for its roots after saying they changed"
    );
    assert_eq!(
        allowed,
        format!("Allowed directories:\n{}", root_dir.display())
    );

    // And the upstream acts on it: a file under the agent's root can be read, one under the
    // directory it was started with no longer can.
    std::fs::write(root_dir.join("inside.txt"), "in the root").unwrap();
    std::fs::write(started_dir.join("outside.txt"), "not any more").unwrap();
    let r = call(
        &agent,
        "read_text_file",
        json!({"path": s(&root_dir.join("inside.txt"))}),
    )
    .await;
    assert_eq!(text(&r), "in the root", "{r:?}");
    let r = call(
        &agent,
        "read_text_file",
        json!({"path": s(&started_dir.join("outside.txt"))}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{r:?}");
}

/// An agent on server-filesystem over `dir`, with no roots of its own.
async fn filesystem_agent(desk: &Desk, dir: &Path) -> PeerAgent {
    let server = server_filesystem();
    let (recording, _progress) = Recording::new(None);
    agent_before(desk, recording, &[s(&server), s(dir)]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_write_needs_the_target_typed_then_runs_once() {
    let desk = desk().await;
    let (_dir, dir) = workdir();
    let agent = filesystem_agent(&desk, &dir).await;
    let file = dir.join("notes.txt");
    let args = json!({"path": s(&file), "content": "approved by a person\n"});

    let mut changes = desk.engine.subscribe();
    let preflight = tokio::spawn({
        let agent = agent.peer().clone();
        let args = args.clone();
        async move { call(&agent, "write_file", args).await }
    });
    let request = next_request(&mut changes).await;
    assert_eq!(request.plan.tool, "write_file");
    assert_eq!(request.plan.target, s(&file));
    assert!(!request.plan.reversible, "write_file is destructive");
    assert!(
        request.type_target(),
        "a destructive tool needs its target typed"
    );
    assert!(matches!(
        desk.engine.approve(request.id, None).await,
        Err(countersign_engine::ApproveError::TargetNotTyped)
    ));
    assert!(!file.exists(), "nothing runs on a preflight");
    desk.engine
        .approve(request.id, Some(&request.plan.target))
        .await
        .unwrap();
    let preflight = preflight.await.unwrap();
    assert_ne!(preflight.is_error, Some(true), "{preflight:?}");
    assert_eq!(
        preflight.structured_content.as_ref().unwrap()["confirmTarget"],
        json!(s(&file))
    );
    assert!(!file.exists(), "nothing runs on a preflight");

    let confirm = confirm_args(&args, &preflight);
    let r = call(&agent, "write_file", confirm.clone()).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "approved by a person\n"
    );

    // The file changes by other means; a replay of the once token must not write it again.
    std::fs::write(&file, "edited afterwards\n").unwrap();
    let again = call(&agent, "write_file", confirm).await;
    assert_eq!(
        refusal(&again).as_deref(),
        Some("already_used"),
        "{again:?}"
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "edited afterwards\n",
        "the replay reached the upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_move_runs_once() {
    let desk = desk().await;
    let (_dir, dir) = workdir();
    let agent = filesystem_agent(&desk, &dir).await;
    let (from, to) = (dir.join("draft.txt"), dir.join("final.txt"));
    std::fs::write(&from, "v1").unwrap();
    let args = json!({"source": s(&from), "destination": s(&to)});

    let confirm = approved(&desk, &agent, "move_file", args).await;
    assert_eq!(confirm["confirmTarget"], json!(s(&from)));
    let r = call(&agent, "move_file", confirm.clone()).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert!(!from.exists());
    assert_eq!(std::fs::read_to_string(&to).unwrap(), "v1");

    // Put a new draft where the old one was: a replay would move it over the final one.
    std::fs::write(&from, "v2").unwrap();
    let again = call(&agent, "move_file", confirm).await;
    assert_eq!(
        refusal(&again).as_deref(),
        Some("already_used"),
        "{again:?}"
    );
    assert_eq!(std::fs::read_to_string(&from).unwrap(), "v2");
    assert_eq!(std::fs::read_to_string(&to).unwrap(), "v1");
}

/// The decoy: `move_file` declares `source` and `destination`; an extra `path` argument it does
/// not declare must not become the target the person sees and types while `source` moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_move_with_an_undeclared_path_decoy_targets_the_source() {
    let desk = desk().await;
    let (_dir, dir) = workdir();
    let agent = filesystem_agent(&desk, &dir).await;
    let (from, to) = (dir.join("payroll.txt"), dir.join("gone.txt"));
    std::fs::write(&from, "salaries").unwrap();
    let args = json!({"source": s(&from), "destination": s(&to), "path": "notes.txt"});
    let click = click_approve(&desk.engine);
    let preflight = call(&agent, "move_file", args.clone()).await;
    let request = click.await.unwrap();
    assert_eq!(request.plan.target, s(&from), "{request:?}");
    assert_eq!(request.plan.details["path"], json!("notes.txt"));
    assert_eq!(
        preflight.structured_content.unwrap()["confirmTarget"],
        json!(s(&from))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_changed_content_is_refused_and_nothing_is_written() {
    let desk = desk().await;
    let (_dir, dir) = workdir();
    let agent = filesystem_agent(&desk, &dir).await;
    let file = dir.join("config.toml");
    let args = json!({"path": s(&file), "content": "mode = \"safe\"\n"});

    let mut confirm = approved(&desk, &agent, "write_file", args).await;
    confirm["content"] = json!("mode = \"reckless\"\n");
    let r = call(&agent, "write_file", confirm.clone()).await;
    assert_eq!(refusal(&r).as_deref(), Some("plan_changed"), "{r:?}");
    assert!(text(&r).contains("Do not retry"), "{r:?}");
    assert!(!file.exists(), "the changed plan reached the upstream");

    // Refusing spent nothing: the arguments the person approved still go through, once.
    confirm["content"] = json!("mode = \"safe\"\n");
    let r = call(&agent, "write_file", confirm).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mode = \"safe\"\n");
}

// ---------------------------------------------------------------------------------------------
// A cancel: the agent cancels a preflight while the desk is still waiting for a person.

/// The next `Updated` change whose request is marked as its agent having stopped waiting
/// (`stopped`), or no longer marked (`!stopped`).
async fn next_marking(
    changes: &mut tokio::sync::broadcast::Receiver<QueueChange>,
    stopped: bool,
) -> PendingRequest {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match changes.recv().await {
                Ok(QueueChange::Updated { request })
                    if request
                        .call()
                        .is_some_and(|c| c.stopped_waiting_at_ms.is_some() == stopped) =>
                {
                    return *request;
                }
                Ok(_) => {}
                Err(e) => panic!("the desk's queue closed: {e}"),
            }
        }
    })
    .await
    .expect("the request's mark did not change within 30 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_preflight_stays_marked_and_the_same_call_asked_again_takes_the_decision() {
    let desk = desk().await;
    let (_dir, dir) = workdir();
    let agent = filesystem_agent(&desk, &dir).await;
    let file = dir.join("never.txt");
    let args = json!({"path": s(&file), "content": "nobody approved this"});
    let mut changes = desk.engine.subscribe();

    let handle = send_call(&agent, "write_file", args.clone()).await;
    let request = next_request(&mut changes).await;
    assert_eq!(desk.engine.pending().len(), 1);
    handle
        .cancel(Some("the user interrupted the agent".into()))
        .await
        .unwrap();

    // Still in the person's queue, marked: the agent stopped waiting, and will collect the
    // decision if it asks again.
    let marked = next_marking(&mut changes, true).await;
    assert_eq!(marked.id, request.id);
    let pending = desk.engine.pending();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].id, request.id);
    assert!(!file.exists());

    // The same preflight again is the same request, no longer marked; the person's decision
    // reaches it.
    let again = send_call(&agent, "write_file", args.clone()).await;
    let reattached = next_marking(&mut changes, false).await;
    assert_eq!(reattached.id, request.id);
    assert_eq!(desk.engine.pending().len(), 1);
    desk.engine.deny(request.id, None).await.unwrap();
    let r = tool_result(again).await;
    assert_eq!(refusal(&r).as_deref(), Some("denied"), "{r:?}");
    assert!(desk.engine.pending().is_empty());
    assert!(matches!(
        desk.engine
            .approve(request.id, Some(&request.plan.target))
            .await,
        Err(countersign_engine::ApproveError::NotPending)
    ));

    // Another plan is a request of its own, never the decided one.
    let other = json!({"path": s(&file), "content": "nor this"});
    let third = send_call(&agent, "write_file", other).await;
    let next = next_request(&mut changes).await;
    assert_ne!(next.id, request.id);
    desk.engine.deny(next.id, None).await.unwrap();
    let r = tool_result(third).await;
    assert_eq!(refusal(&r).as_deref(), Some("denied"), "{r:?}");
    assert!(!file.exists());
}

/// `--url`: server-everything in its streamable-HTTP mode, reached over HTTP; open tools pass
/// through, gated ones go to the desk, as with a stdio upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_over_streamable_http_is_reached_with_url() {
    let (mut upstream, url) = countersign_tests::peers::server_everything_http().await;
    let desk = desk().await;
    let agent = connect(
        gateway_command(&desk.socket, &["--url", &url]),
        plain_client(),
    )
    .await;
    assert_eq!(
        agent
            .peer_info()
            .unwrap()
            .server_info
            .as_ref()
            .unwrap()
            .name,
        "mcp-servers/everything"
    );
    let r = call(agent.peer(), "echo", json!({"message": "over http"})).await;
    assert_eq!(text(&r), "Echo: over http");
    assert!(
        desk.engine.pending().is_empty(),
        "an open tool never reaches the desk"
    );
    let tools = agent.list_all_tools().await.unwrap();
    let gated = tools
        .iter()
        .find(|t| t.name.starts_with("toggle-"))
        .expect("a gated tool");
    assert!(
        gated
            .input_schema
            .get("properties")
            .unwrap()
            .get("confirmToken")
            .is_some()
    );
    let _ = agent.cancel().await;
    let _ = upstream.kill().await;
}
