//! The desk's MCP sessions: the mechanism, kept in the authority's process.
//!
//! `countersign mcp` is a pipe the agent controls, so nothing it says is trusted and it reaches
//! nothing. Here, per gateway connection, the desk runs both MCP sessions: the server session the
//! agent talks to (behind a default-deny [`router`]) and the client session toward the upstream,
//! which the desk starts as its own child, connects by URL, or serves built in ([`reach`]). Every
//! decision about a call goes through one narrow seam to the engine (crates/engine): class the
//! listed tools, preflight, withdraw, confirm, outcome. The engine never sees MCP; this crate
//! never mints, verifies or spends.
#![deny(missing_docs)]

mod agent;
mod children;
mod peer;
mod raw;
pub mod reach;
pub mod router;
mod socket;
mod upstream;

use std::time::Duration;

use countersign_engine::Engine;
use rmcp::ServiceExt;

pub use agent::{RawTools, Session};
pub use children::Children;
pub use socket::{Options, Served, SocketError, serve, serve_with};

/// Runs one session until the agent or the upstream goes away, then shuts the upstream down
/// (gracefully: its stdin closes, it gets a moment, then its process group is killed).
async fn run(
    engine: Engine,
    tenant: String,
    wait: Duration,
    reached: reach::Reached,
    agent: router::AgentTransport,
) {
    let reach::Reached {
        upstream, shared, ..
    } = reached;
    let session = Session::new(
        shared,
        upstream.peer().clone(),
        engine,
        tenant.clone(),
        wait,
    );
    let upstream_ct = upstream.cancellation_token();
    let upstream_done = tokio::spawn(upstream.waiting());
    tokio::pin!(upstream_done);
    let server = tokio::select! {
        server = RawTools(session).serve(agent) => server,
        r = &mut upstream_done => {
            tracing::warn!(target: "session", %tenant, "the upstream went away before the agent initialized: {r:?}");
            return;
        }
    };
    let server = match server {
        Ok(server) => server,
        Err(err) => {
            tracing::warn!(target: "session", %tenant, "the agent did not initialize: {err}");
            upstream_ct.cancel();
            let _ = upstream_done.await;
            return;
        }
    };
    let server_ct = server.cancellation_token();
    tokio::select! {
        r = server.waiting() => {
            tracing::info!(target: "session", %tenant, "the agent disconnected: {r:?}");
            upstream_ct.cancel();
            let _ = upstream_done.await;
        }
        r = &mut upstream_done => {
            tracing::warn!(target: "session", %tenant, "the upstream went away: {r:?}");
            server_ct.cancel();
        }
    }
}
