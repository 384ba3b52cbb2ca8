//! The desk's MCP sessions: the mechanism, kept in the authority's process.
//!
//! `countersign mcp` is a pipe the agent controls, so nothing it says is trusted and it reaches
//! nothing. Here, per gateway connection, the desk runs both MCP sessions: the server session the
//! agent talks to (behind a default-deny [`router`]) and the client session toward the upstream,
//! which the desk starts as its own child, connects by URL, or serves built in ([`reach`]). Every
//! decision about a call goes through one narrow seam to the engine (crates/engine): class the
//! listed tools, preflight, withdraw, confirm, outcome. The engine never sees MCP; this crate
//! never mints, verifies or spends.

mod agent;
mod children;
#[cfg(target_os = "linux")]
mod handed;
mod lane;
mod peer;
mod preview;
mod raw;
pub mod reach;
mod registry;
mod socket;
mod upstream;
mod url_lane;

// The judge of the agent's bytes, a crate of its own (see its note); named here as the module
// it once was.
use countersign_router as router;

use countersign_core::Tenant;
use std::sync::Arc;
use std::time::Duration;

use countersign_engine::Engine;
use rmcp::ServiceExt;

pub use agent::{Gates, RawTools, Session};
pub use children::Children;
/// What names the built-in `execute`'s plan by the tables it writes: the describer every host
/// that serves the built-in tools gives its engine.
pub use countersign_builtin::SqlDescriber;
pub use socket::{Options, Served, SocketError, serve, serve_with};

/// Runs one session until the agent goes away, then shuts the upstream down (gracefully: its
/// stdin closes, it gets a moment, then its process group is killed). An upstream that exits
/// before then does not end the session: the next request starts it again (see
/// [`reach::Upstream`]).
async fn run(
    engine: Engine,
    tenant: Tenant,
    wait: Duration,
    upstream: Arc<reach::Upstream>,
    agent: router::AgentTransport,
    door: &lane::Door,
) {
    let session = Session::new(upstream.clone(), engine, tenant.clone(), wait);
    door.open_to(session.clone());
    match RawTools(session).serve(agent).await {
        Ok(server) => {
            let r = server.waiting().await;
            tracing::info!(target: "session", %tenant, "the agent disconnected: {r:?}");
        }
        Err(err) => {
            tracing::warn!(target: "session", %tenant, "the agent did not initialize: {err}");
        }
    }
    upstream.stop().await;
}
