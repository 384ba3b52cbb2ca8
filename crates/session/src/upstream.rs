//! The session's client half, toward the upstream MCP server.
//!
//! Requests the upstream sends to its client (roots, sampling, elicitation) and its notifications
//! (progress, logging, list and resource changes) are passed on to the agent through the server
//! half's peer, typed and re-serialized; upstream progress tokens are mapped back to the agent's
//! own. Requests and notifications MCP does not define are not passed on, in this direction
//! either.
#![allow(deprecated)] // roots, sampling, logging and subscribe are marked deprecated in rmcp 3.x; MCP still has them

use countersign_core::sync::lock;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rmcp::model::*;
use rmcp::service::{NotificationContext, PeerRequestOptions, RequestContext, ServiceRole};
use rmcp::{ClientHandler, ErrorData, Peer, RoleClient, RoleServer, ServiceError};
use tokio_util::sync::CancellationToken;

/// An rmcp service error as the agent should see it: the upstream's own JSON-RPC error when it
/// sent one, else an internal error.
pub fn service_error(e: ServiceError) -> ErrorData {
    match e {
        ServiceError::McpError(e) => e,
        other => ErrorData::internal_error(other.to_string(), None),
    }
}

/// Why a forwarded request has no answer.
#[derive(Debug)]
pub enum ForwardError {
    /// The peer answered with an error, or the request failed otherwise: as the agent sees it.
    Answer(ErrorData),
    /// The peer's session had ended before the request was handed over: it never received it.
    NotSent,
    /// The peer's session ended (its process exited, its connection closed) after the request
    /// was handed over and before an answer came: whether it acted on it is unknown.
    Lost,
}

impl From<ForwardError> for ErrorData {
    fn from(e: ForwardError) -> Self {
        match e {
            ForwardError::Answer(e) => e,
            ForwardError::NotSent | ForwardError::Lost => {
                service_error(ServiceError::TransportClosed)
            }
        }
    }
}

/// Sends `req` on `peer`, lets `register` see the progress token rmcp chose for it, and turns a
/// cancellation of `ct` into `notifications/cancelled` to that peer.
pub async fn forward<R: ServiceRole>(
    peer: &Peer<R>,
    req: R::Req,
    options: PeerRequestOptions,
    ct: &CancellationToken,
    register: impl FnOnce(&ProgressToken),
) -> Result<R::PeerResp, ErrorData> {
    send(peer, req, options, ct, register)
        .await
        .map_err(ErrorData::from)
}

/// [`forward`], saying whether a request that got no answer was handed over at all.
pub async fn send<R: ServiceRole>(
    peer: &Peer<R>,
    req: R::Req,
    options: PeerRequestOptions,
    ct: &CancellationToken,
    register: impl FnOnce(&ProgressToken),
) -> Result<R::PeerResp, ForwardError> {
    let handle = match peer.send_request_with_option(req, options).await {
        Ok(handle) => handle,
        Err(ServiceError::TransportClosed) => return Err(ForwardError::NotSent),
        Err(e) => return Err(ForwardError::Answer(service_error(e))),
    };
    register(&handle.progress_token);
    let id = handle.id.clone();
    tokio::select! {
        r = handle.await_response() => r.map_err(|e| match e {
            // Handed over, then the session ended with the request unanswered, or writing it
            // failed (over HTTP, a request can fail after the server has read it).
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => ForwardError::Lost,
            e => ForwardError::Answer(service_error(e)),
        }),
        _ = ct.cancelled() => {
            let n: CancelledNotification = Notification::new(CancelledNotificationParam::new(
                Some(id),
                Some("cancelled by the agent".into()),
            ));
            let _ = peer.send_notification(n.into()).await;
            Err(ForwardError::Answer(ErrorData::internal_error("request cancelled", None)))
        }
    }
}

/// State both halves share.
#[derive(Default)]
pub struct Shared {
    /// The agent, once it has initialized.
    pub agent: OnceLock<Peer<RoleServer>>,
    /// Wakes requests the upstream sent before the agent had initialized.
    pub agent_ready: tokio::sync::Notify,
    /// Upstream progress token (chosen by rmcp) to the agent's progress token.
    pub progress: Mutex<HashMap<ProgressToken, ProgressToken>>,
    /// Moves on whenever the upstream says its tool list changed, or starts again: a listing
    /// counts only while this is still the value it was fetched under (see
    /// [`Shared::tools_changed`]), so a call never goes by a listing older than the tools.
    pub tools_epoch: std::sync::atomic::AtomicU64,
    /// Set once the agent has initialized on a revision before 2026-07-28 and the upstream
    /// speaks one too: the open lane may take calls (see [`crate::lane`]).
    pub lane_armed: std::sync::atomic::AtomicBool,
    /// Set when no agent ever stands behind this upstream (a team's server answers each HTTP
    /// request on its own, for many callers): what the upstream asks of an agent (roots,
    /// sampling, elicitation) is refused at once, never sent to whichever caller came last.
    pub without_agent: std::sync::atomic::AtomicBool,
    /// What the agent declared in its `initialize` (roots, sampling, elicitation), when its first
    /// message was one: the upstream is offered that and nothing more, as it would be reached
    /// directly. Unknown (the agent opened with `server/discover`), all three are offered, and
    /// each request is checked against the agent's declaration when it comes.
    pub agent_declared: OnceLock<ClientCapabilities>,
    /// The upstream's last listing, under the epoch it was fetched in and when: taken again
    /// for at most [`LISTING_FRESH`] while the epoch has not moved (see [`Shared::listing`]).
    listing: Mutex<Option<Kept>>,
}

/// A listing kept: the epoch it was fetched under, when it was asked for, and the tools.
type Kept = (u64, std::time::Instant, Arc<Vec<serde_json::Value>>);

/// How long one listing of the upstream's tools serves the calls after it, while the upstream
/// has not said its tools changed (nor started again). A team's server answers each HTTP request
/// on its own: without this, every call would list the upstream's tools first. What a call is
/// judged by is then at most this old, never older than a `list_changed` the upstream sent; each
/// call's tool is still compared with its pin, class and rules as that listing has them.
pub const LISTING_FRESH: std::time::Duration = std::time::Duration::from_secs(1);

impl Shared {
    /// The listing taken under `epoch` less than [`LISTING_FRESH`] before `now`, if there is one
    /// and `epoch` is still the current one.
    pub fn listing(
        &self,
        epoch: u64,
        now: std::time::Instant,
    ) -> Option<Arc<Vec<serde_json::Value>>> {
        let kept = lock(&self.listing);
        let (at_epoch, at, tools) = kept.as_ref()?;
        (*at_epoch == epoch
            && self.tools_epoch.load(std::sync::atomic::Ordering::Acquire) == epoch
            && now.saturating_duration_since(*at) < LISTING_FRESH)
            .then(|| tools.clone())
    }

    /// Keeps `tools`, fetched under `epoch` starting at `at`, for the calls after it.
    pub fn keep_listing(
        &self,
        epoch: u64,
        at: std::time::Instant,
        tools: Arc<Vec<serde_json::Value>>,
    ) {
        *lock(&self.listing) = Some((epoch, at, tools));
    }

    /// The upstream's tools may have changed (it said so, or it started again): every listing
    /// taken so far is out of date.
    pub fn tools_changed(&self) {
        self.tools_epoch
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Records the agent once it has initialized, and wakes whoever waits for it.
    pub fn set_agent(&self, peer: Peer<RoleServer>) {
        let _ = self.agent.set(peer);
        self.agent_ready.notify_waiters();
    }

    /// The agent, waiting (up to `limit`) for it to initialize: the upstream is started first,
    /// and may ask for roots before the agent has said hello.
    async fn agent_within(&self, limit: Duration) -> Result<&Peer<RoleServer>, ErrorData> {
        if self
            .without_agent
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return Err(ErrorData::new(
                ErrorCode::METHOD_NOT_FOUND,
                "no agent answers requests of this server",
                None,
            ));
        }
        let ready = self.agent_ready.notified();
        tokio::pin!(ready);
        // Registered before the check, so a set_agent in between is not missed.
        ready.as_mut().enable();
        if let Some(agent) = self.agent.get() {
            return Ok(agent);
        }
        let _ = tokio::time::timeout(limit, ready).await;
        self.agent()
    }

    fn agent(&self) -> Result<&Peer<RoleServer>, ErrorData> {
        self.agent
            .get()
            .ok_or_else(|| ErrorData::internal_error("the agent is not connected yet", None))
    }
}

/// The client half.
#[derive(Clone)]
pub struct UpstreamClient {
    shared: Arc<Shared>,
    config: ClientConfig,
}

impl UpstreamClient {
    /// A client that offers the upstream what the agent declared of roots, sampling and
    /// elicitation (all three while that is not known), each answered by the agent.
    pub fn new(shared: Arc<Shared>) -> Self {
        // Without an agent behind it, nothing is offered that only an agent could answer.
        let capabilities = if shared.without_agent.load(Ordering::Acquire) {
            ClientCapabilities::default()
        } else if let Some(declared) = shared.agent_declared.get() {
            // An upstream offered more than the agent has registers tools for it (the reference
            // server adds three, each with a `tools/list_changed`, before the first listing) that
            // could only fail.
            let mut offered = ClientCapabilities::default();
            offered.roots = declared.roots.clone();
            offered.sampling = declared.sampling.clone();
            offered.elicitation = declared.elicitation.clone();
            offered
        } else {
            ClientCapabilities::builder()
                .enable_roots()
                .enable_roots_list_changed()
                .enable_sampling()
                .enable_elicitation()
                .build()
        };
        let config = ClientConfig::new(
            capabilities,
            Implementation::new("countersign", env!("CARGO_PKG_VERSION")),
        )
        // The handshake-era version: server-to-client requests are legal in it, and every
        // upstream of today speaks it.
        .with_protocol_version(ProtocolVersion::V_2025_11_25);
        Self { shared, config }
    }

    /// Passes a request on to the agent, if the agent declared the capability it needs: the
    /// upstream may have been offered every capability before the agent's declaration was known,
    /// so it is checked here, and an undeclared one is answered "method not found".
    async fn to_agent(
        &self,
        req: ServerRequest,
        ct: &CancellationToken,
    ) -> Result<ClientResult, ErrorData> {
        let agent = self
            .shared
            .agent_within(Duration::from_secs(60))
            .await?
            .clone();
        let declared = agent.peer_info().map(|info| {
            let caps = &info.capabilities;
            match &req {
                ServerRequest::ListRootsRequest(_) => caps.roots.is_some(),
                ServerRequest::CreateMessageRequest(_) => caps.sampling.is_some(),
                ServerRequest::ElicitRequest(_) => caps.elicitation.is_some(),
                _ => true,
            }
        });
        if declared == Some(false) {
            return Err(ErrorData::new(
                ErrorCode::METHOD_NOT_FOUND,
                "the agent does not offer this capability",
                None,
            ));
        }
        forward(&agent, req, PeerRequestOptions::no_options(), ct, |_| {}).await
    }
}

fn unexpected(r: ClientResult) -> ErrorData {
    ErrorData::internal_error(format!("unexpected answer from the agent: {r:?}"), None)
}

impl ClientHandler for UpstreamClient {
    fn get_info(&self) -> ClientConfig {
        self.config.clone()
    }

    async fn list_roots(
        &self,
        context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        match self
            .to_agent(
                ServerRequest::ListRootsRequest(ListRootsRequest::default()),
                &context.ct,
            )
            .await?
        {
            ClientResult::ListRootsResult(r) => Ok(r),
            other => Err(unexpected(other)),
        }
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let req = ServerRequest::CreateMessageRequest(CreateMessageRequest::new(params));
        match self.to_agent(req, &context.ct).await? {
            ClientResult::CreateMessageResult(r) => Ok(*r),
            other => Err(unexpected(other)),
        }
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        match self
            .to_agent(
                ServerRequest::ElicitRequest(ElicitRequest::new(request)),
                &context.ct,
            )
            .await?
        {
            ClientResult::ElicitResult(r) => Ok(r),
            other => Err(unexpected(other)),
        }
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleClient>,
    ) -> Result<CustomResult, ErrorData> {
        Err(ErrorData::new(
            ErrorCode::METHOD_NOT_FOUND,
            format!("Countersign does not pass on `{}`", request.method),
            None,
        ))
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        // The mapping is inserted just after the request is sent; a very fast first progress can
        // beat it, so look again briefly. Progress for unknown tokens (late, or after a cancel)
        // is dropped.
        for _ in 0..20 {
            let agent_token = lock(&self.shared.progress)
                .get(&params.progress_token)
                .cloned();
            if let Some(agent_token) = agent_token {
                if let Ok(agent) = self.shared.agent() {
                    let mut p = ProgressNotificationParam::new(agent_token, params.progress);
                    p.total = params.total;
                    p.message = params.message.clone();
                    let _ = agent.notify_progress(p).await;
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.shared.tools_changed();
        if let Ok(agent) = self.shared.agent() {
            let _ = agent.notify_tool_list_changed().await;
        }
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Ok(agent) = self.shared.agent() {
            let _ = agent.notify_prompt_list_changed().await;
        }
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Ok(agent) = self.shared.agent() {
            let _ = agent.notify_resource_list_changed().await;
        }
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if let Ok(agent) = self.shared.agent() {
            let _ = agent.notify_resource_updated(params).await;
        }
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if let Ok(agent) = self.shared.agent() {
            let _ = agent.notify_logging_message(params).await;
        }
    }

    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        _context: NotificationContext<RoleClient>,
    ) {
        tracing::debug!(target: "session", method = %notification.method, "dropped an upstream notification MCP does not define");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offered(declared: Option<ClientCapabilities>) -> ClientCapabilities {
        let shared = Shared::default();
        if let Some(declared) = declared {
            shared.agent_declared.set(declared).unwrap();
        }
        UpstreamClient::new(Arc::new(shared))
            .get_info()
            .capabilities
    }

    #[test]
    fn the_upstream_is_offered_what_the_agent_declared_and_nothing_more() {
        let nothing = offered(Some(ClientCapabilities::default()));
        assert!(nothing.roots.is_none() && nothing.sampling.is_none());
        assert!(nothing.elicitation.is_none());

        let roots = ClientCapabilities::builder().enable_roots().build();
        let only_roots = offered(Some(roots.clone()));
        assert_eq!(only_roots.roots, roots.roots);
        assert!(only_roots.sampling.is_none() && only_roots.elicitation.is_none());

        // Not known (an agent that opened with `server/discover`): all three, each checked
        // against the agent's declaration when the upstream asks.
        let unknown = offered(None);
        assert!(unknown.roots.is_some() && unknown.sampling.is_some());
        assert!(unknown.elicitation.is_some());
    }

    #[test]
    fn an_upstream_with_no_agent_behind_it_is_offered_nothing() {
        let shared = Shared::default();
        shared.without_agent.store(true, Ordering::Release);
        let all = ClientCapabilities::builder()
            .enable_roots()
            .enable_sampling()
            .enable_elicitation()
            .build();
        shared.agent_declared.set(all).unwrap();
        let offered = UpstreamClient::new(Arc::new(shared))
            .get_info()
            .capabilities;
        assert!(offered.roots.is_none() && offered.sampling.is_none());
        assert!(offered.elicitation.is_none());
    }
}
