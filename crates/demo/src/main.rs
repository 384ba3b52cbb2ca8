//! `countersign-demo`, which `countersign demo` runs: a scripted sample agent that walks a new user
//! through the whole flow in a minute: the desk's window opens (started if needed), and the agent,
//! connected through a real `countersign mcp` to the built-in tools on a fresh demo database, makes
//! an open call, a `token` call, a `once` call, a replay and a changed plan, printing what it sends
//! and what it receives. The person approves in the window: the demo never approves anything
//! itself.
//!
//! A program of its own because it is an MCP client (rmcp): the `countersign` binary that agents
//! start is a pipe and links no MCP code, so it runs this one, installed beside it.
#![forbid(unsafe_code)] // nothing here reaches past the safe language; keep it so

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rmcp::model::*;
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

type Agent = RunningService<RoleClient, ClientConfig>;

fn bold(s: &str) -> String {
    format!("\x1b[1m{s}\x1b[0m")
}

fn step(n: u32, title: &str) {
    println!("\n{}", bold(&format!("── {n}. {title}")));
}

fn said(tool: &str, args: &Value) {
    println!("agent → {tool} {args}");
}

fn heard(r: &CallToolResult) {
    let text: Vec<String> = r
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    let marker = if r.is_error == Some(true) {
        "agent ← (error)"
    } else {
        "agent ←"
    };
    for (i, line) in text.join("\n").lines().enumerate() {
        println!(
            "{}{line}",
            if i == 0 {
                format!("{marker} ")
            } else {
                "        ".to_owned()
            }
        );
    }
}

/// Whether a desktop session is there to show the window in.
fn has_display() -> bool {
    std::env::var_os("DISPLAY").is_some_and(|d| !d.is_empty())
        || std::env::var_os("WAYLAND_DISPLAY").is_some_and(|d| !d.is_empty())
}

async fn desk_is_up(socket: &Path) -> bool {
    tokio::net::UnixStream::connect(socket).await.is_ok()
}

/// Why the demo stopped before its end.
#[derive(Debug, thiserror::Error)]
enum DemoError {
    /// The gateway (`countersign mcp`) could not be started.
    #[error("cannot start the gateway {}: {source}", program.display())]
    Gateway {
        /// The program started.
        program: PathBuf,
        /// Why it did not start.
        #[source]
        source: std::io::Error,
    },
    /// The gateway started, but no MCP session came up with it.
    #[error("no MCP session with the gateway: {0}")]
    // Boxed: the client's initialize error is many times larger than every other variant.
    Session(#[source] Box<rmcp::service::ClientInitializeError>),
    /// The gateway did not list its tools.
    #[error("listing the tools failed: {0}")]
    ListTools(#[source] rmcp::ServiceError),
    /// A tool call got no answer (the MCP request itself failed).
    #[error("calling {tool} failed: {source}")]
    Call {
        /// The tool called.
        tool: String,
        /// Why the call failed.
        #[source]
        source: rmcp::ServiceError,
    },
    /// A preflight was refused with a code other than `pending`.
    #[error("the preflight was refused ({0})")]
    Refused(String),
    /// A preflight's answer carries no structured content (so no token).
    #[error("no structured content")]
    NoStructuredContent,
}

async fn call(agent: &Agent, tool: &str, args: Value) -> Result<CallToolResult, DemoError> {
    said(tool, &args);
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    let r = agent
        .peer()
        .call_tool(params)
        .await
        .map_err(|source| DemoError::Call {
            tool: tool.to_owned(),
            source,
        })?;
    heard(&r);
    Ok(r)
}

/// A preflight the person must approve; asks again (re-attaching) while it is pending.
async fn preflight(agent: &Agent, tool: &str, args: Value) -> Result<Value, DemoError> {
    println!("   (look at the Countersign window: read the request, then click Approve)");
    loop {
        let r = call(agent, tool, args.clone()).await?;
        let refusal = r
            .structured_content
            .as_ref()
            .and_then(|s| s.get("refusal"))
            .and_then(Value::as_str);
        match refusal {
            Some("pending") => continue,
            Some(other) => return Err(DemoError::Refused(other.to_owned())),
            None => {}
        }
        let s = r.structured_content.ok_or(DemoError::NoStructuredContent)?;
        let mut confirm = args;
        confirm["confirm"] = json!(true);
        confirm["confirmTarget"] = s["confirmTarget"].clone();
        confirm["confirmToken"] = s["confirmToken"].clone();
        return Ok(confirm);
    }
}

/// Runs the demo; returns the process exit code.
async fn run(socket: PathBuf) -> i32 {
    if !has_display() {
        eprintln!(
            "countersign demo: a desktop session is needed: the demo shows its requests in the Countersign \
             window, and there is no display here (DISPLAY and WAYLAND_DISPLAY are unset)."
        );
        return 2;
    }
    println!(
        "{}",
        bold(
            "Countersign demo: a sample agent, a real gateway, the built-in SQLite tools, and you."
        )
    );
    if !desk_is_up(&socket).await {
        // A desk started from here listens at the default socket, never at one the environment
        // names (it does not take its socket from the environment of whoever starts it).
        if countersign_wire::socket_override().is_some() {
            eprintln!(
                "countersign demo: no desk answers at {}, the socket {} names: start one there \
                 with `{}={} countersign-desk`, or unset {} to use the default desk",
                socket.display(),
                countersign_wire::SOCKET_ENV,
                countersign_wire::SOCKET_ENV,
                socket.display(),
                countersign_wire::SOCKET_ENV,
            );
            return 1;
        }
        println!("Starting the desk…");
        if let Err(e) = countersign_pipe::launch::start_desk(&[]) {
            eprintln!("countersign demo: cannot start the desk: {e}");
            return 1;
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while !desk_is_up(&socket).await {
            if Instant::now() > deadline {
                eprintln!("countersign demo: the desk did not start (is the display usable?)");
                return 1;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let dir = std::env::temp_dir().join(format!("countersign-demo-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let db = dir.join("demo.sqlite");
    let result = script(&socket, &db).await;
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok(()) => {
            println!(
                "\n{}",
                bold(
                    "That is the whole flow. `countersign history` shows it again; `countersign config --help` wraps your own servers."
                )
            );
            0
        }
        Err(e) => {
            eprintln!("countersign demo: {e}");
            1
        }
    }
}

/// The `countersign` program beside this one: the gateway the sample agent starts.
fn gateway_program() -> PathBuf {
    let me = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("countersign-demo"));
    me.with_file_name("countersign")
}

/// Logs (rmcp's, mostly) go to stderr, as `RUST_LOG` says (warnings by default): stdout is the
/// demo's own story of each step.
fn init_logging() {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|spec| tracing_subscriber::EnvFilter::try_new(spec).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .init();
}

fn main() {
    init_logging();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let code = runtime.block_on(run(countersign_wire::socket_path()));
    std::process::exit(code);
}

async fn script(socket: &Path, db: &Path) -> Result<(), DemoError> {
    let program = gateway_program();
    let mut cmd = tokio::process::Command::new(&program);
    cmd.arg("mcp")
        .arg("--name")
        .arg("demo")
        .arg("--wait")
        .arg("40")
        .arg("--socket")
        .arg(socket)
        .arg("--db")
        .arg(db);
    let transport =
        TokioChildProcess::new(cmd).map_err(|source| DemoError::Gateway { program, source })?;
    let info = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("countersign-demo-agent", env!("CARGO_PKG_VERSION")),
    );
    let agent: Agent = info
        .serve(transport)
        .await
        .map_err(|e| DemoError::Session(Box::new(e)))?;

    step(1, "The tools the agent sees");
    let tools = agent
        .peer()
        .list_all_tools()
        .await
        .map_err(DemoError::ListTools)?;
    for t in &tools {
        let gated = t
            .input_schema
            .get("properties")
            .and_then(Value::as_object)
            .is_some_and(|p| p.contains_key("confirmToken"));
        println!(
            "   {:<16} {}",
            t.name,
            if gated {
                "needs approval"
            } else {
                "open (read-only)"
            }
        );
    }

    step(2, "An open call: read-only tools pass straight through");
    call(&agent, "list_tables", json!({})).await?;

    step(
        3,
        "A `token` call: create_backup is idempotent, so its token may be reused until it expires",
    );
    let confirm = preflight(&agent, "create_backup", json!({"name": "before-demo"})).await?;
    call(&agent, "create_backup", confirm.clone()).await?;
    println!("   (the same token again, within its life: still accepted)");
    call(&agent, "create_backup", confirm).await?;

    step(
        4,
        "A `once` call: execute changes data, so its token works exactly once",
    );
    // One statement, so that its replay below plans exactly as it did (the desk names execute's
    // plan by what SQLite says it writes now; a batch's later statements are not described once
    // an earlier one fails) and reaches the ledger's `already_used`.
    let sql = json!({"sql": "CREATE TABLE people AS SELECT 1 AS id, 'Ada' AS name UNION ALL SELECT 2, 'Grace'"});
    let confirm = preflight(&agent, "execute", sql).await?;
    call(&agent, "execute", confirm.clone()).await?;
    call(&agent, "query", json!({"sql": "SELECT * FROM people"})).await?;

    step(5, "A replay: the agent sends the same once-token again");
    call(&agent, "execute", confirm).await?;

    step(
        6,
        "A changed plan: approved one statement, the agent tries to run another",
    );
    let mut confirm = preflight(
        &agent,
        "execute",
        json!({"sql": "DELETE FROM people WHERE id = 1"}),
    )
    .await?;
    confirm["sql"] = json!("DELETE FROM people");
    call(&agent, "execute", confirm).await?;
    call(
        &agent,
        "query",
        json!({"sql": "SELECT count(*) AS people FROM people"}),
    )
    .await?;

    let _ = agent.cancel().await;
    Ok(())
}
