//! `countersign mcp`: what an agent's MCP configuration launches.
//!
//! It speaks MCP on stdin/stdout toward the agent (logs go to stderr), and MCP toward an upstream
//! server: a child process started with the agent's own environment and working directory, or
//! the built-in tools. Read-only tools pass straight through; every other call goes to the desk
//! over the local socket. The agent owns this process, so nothing trusted lives here: no secret,
//! no ledger, no policy of its own.
#![deny(missing_docs)]

mod agent;
pub mod desk;
pub mod raw;
mod upstream;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rmcp::{ClientCacheConfig, ServiceExt};

pub use agent::{Gateway, RawTools};
use desk::DeskLink;
use raw::RawPassthroughTransport;
use upstream::{Shared, UpstreamClient};

/// How long a preflight waits for a person by default, below common client timeouts.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(45);

/// What the gateway stands in front of.
#[derive(Debug, Clone)]
pub enum Upstream {
    /// A stdio MCP server: the program and its arguments.
    Command(Vec<String>),
    /// An already-connected in-process server (the built-in tools): the gateway's ends of the pipe.
    Pipe,
}

/// How `countersign mcp` runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The server's name for the desk and its policy (default: the upstream's `serverInfo.name`).
    pub name: Option<String>,
    /// How long a preflight waits for a decision before answering `pending`.
    pub wait: Duration,
    /// The desk's socket.
    pub socket: PathBuf,
    /// Whether to start a desk when none answers.
    pub launch_desk: bool,
}

/// The gateway failed to start or to run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// The upstream command could not be started.
    #[error("cannot start the upstream `{command}`: {source}")]
    Spawn {
        /// The program.
        command: String,
        /// Why.
        source: std::io::Error,
    },
    /// The upstream did not complete the MCP handshake.
    #[error("the upstream did not initialize: {0}")]
    UpstreamInit(String),
    /// The agent did not complete the MCP handshake.
    #[error("the agent did not initialize: {0}")]
    AgentInit(String),
}

/// Runs the gateway in front of the stdio server `command`, serving the agent on this process's
/// stdin/stdout until the agent disconnects; then shuts the upstream down gracefully.
pub async fn run_command(options: Options, command: Vec<String>) -> Result<(), GatewayError> {
    let (program, args) = command.split_first().ok_or_else(|| GatewayError::Spawn {
        command: String::new(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "no upstream command"),
    })?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args);
    let transport = RawPassthroughTransport::spawn(cmd).map_err(|source| GatewayError::Spawn {
        command: program.clone(),
        source,
    })?;
    run(options, transport).await
}

/// Runs the gateway in front of an in-process server reached through `read`/`write`.
pub async fn run_pipe<R, W>(options: Options, read: R, write: W) -> Result<(), GatewayError>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    run(options, RawPassthroughTransport::new(read, write)).await
}

/// Runs the gateway in front of a streamable-HTTP MCP server at `url`. Tool fields rmcp does not
/// model are lost on this path (its HTTP transport is typed); stdio upstreams keep them.
pub async fn run_url(options: Options, url: String) -> Result<(), GatewayError> {
    let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url);
    run(options, transport).await
}

async fn run<T, E, A>(options: Options, transport: T) -> Result<(), GatewayError>
where
    T: rmcp::transport::IntoTransport<rmcp::RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let shared = Arc::new(Shared::default());
    // The upstream first, so the agent is offered exactly its capabilities.
    let upstream = UpstreamClient::new(shared.clone())
        .serve(transport)
        .await
        .map_err(|e| GatewayError::UpstreamInit(e.to_string()))?;
    upstream
        .set_response_cache_config(ClientCacheConfig::disabled())
        .await;
    let desk = Arc::new(DeskLink::new(options.socket.clone(), options.launch_desk));
    let gateway = Gateway::new(
        shared,
        upstream.peer().clone(),
        desk,
        options.name.clone(),
        options.wait,
    );
    // Non-blocking stdio where stdin/stdout are pipes, so shutdown is not held by a pending read.
    let server = RawTools(gateway)
        .serve(rmcp::transport::stdio_pipes())
        .await
        .map_err(|e| GatewayError::AgentInit(e.to_string()))?;
    let server_ct = server.cancellation_token();
    let upstream_ct = upstream.cancellation_token();
    let upstream_done = tokio::spawn(upstream.waiting());
    tokio::pin!(upstream_done);
    tokio::select! {
        r = server.waiting() => {
            tracing::info!(target: "gateway", "the agent disconnected: {r:?}");
            // Graceful: cancelling closes the child's stdin, gives it a moment, then ends it.
            upstream_ct.cancel();
            let _ = upstream_done.await;
        }
        r = &mut upstream_done => {
            tracing::warn!(target: "gateway", "the upstream went away: {r:?}");
            server_ct.cancel();
        }
    }
    Ok(())
}
