//! The session's server half, toward the agent (behind [`crate::router`], which has already
//! refused every message that is not on its allow-list or not of the shape MCP defines).
//!
//! `tools/list` is fetched raw from the upstream (every field it sent survives), classed by the
//! engine, and answered with gated tools augmented (`confirm`, `confirmTarget`, `confirmToken`, a
//! sentence, no `outputSchema`) and withheld tools left out. Every `tools/call` is decided here:
//! an open tool's call goes on once the engine agrees (its definition is the pinned one), a gated
//! one goes to the engine (a preflight waits for a person, with progress to the agent; a confirm
//! is verified, and what the person approved is what gets sent; an agent on 2026-07-28 that
//! handles URL elicitations confirms by its own retry instead, see [`rounds`]), and a tool
//! missing from the listing is refused. The other allowed requests are sent on typed,
//! re-serialized by the desk; anything else is an error, never "forward".
#![allow(deprecated)] // roots, sampling, logging and subscribe are marked deprecated in rmcp 3.x; MCP still has them

use countersign_core::Tenant;
use countersign_core::sync::lock;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use countersign_core::{GateClass, Refusal, policy};
use countersign_engine::{Accepted, Approved, Engine, ErrorCode, Queued, Stopped};
use rmcp::model::*;
use rmcp::service::{NotificationContext, PeerRequestOptions, RequestContext};
use rmcp::{ErrorData, RoleServer, ServerHandler, Service};
use serde_json::{Value, json};

use crate::reach::{Live, Unreached, Upstream};
use crate::url_lane::{Posted, to_caller};

#[path = "rounds.rs"]
mod rounds;
use crate::upstream::{ForwardError, Shared, send};

/// How one tool is treated, as last decided.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Gate {
    Class(GateClass),
    Withheld(String),
}

/// The gate [`RawTools`] decided for a `tools/call`, and the upstream it decided it on: handed
/// with the call to the typed handler, which decides nothing again.
#[derive(Clone)]
struct Decided {
    gate: Option<Gate>,
    live: Live,
}

/// The server half.
#[derive(Clone)]
pub struct Session {
    shared: Arc<Shared>,
    upstream: Arc<Upstream>,
    info: ServerConfig,
    upstream_version: ProtocolVersion,
    engine: Engine,
    tenant: Tenant,
    wait: Duration,
    gates: Arc<Gates>,
    /// The agent's clientInfo as last shown to the person.
    client_info: Arc<Mutex<Option<Value>>>,
    /// The revision the agent's `initialize` settled on is older than 2026-07-28: once it has
    /// initialized, the open lane may take its calls (see [`crate::lane`]).
    legacy_agent: Arc<std::sync::atomic::AtomicBool>,
    /// This agent's turns at the desk's records (see [`DESK_TURNS`]).
    turns: Arc<tokio::sync::Semaphore>,
}

/// What the agent's last listing decided for each tool, and under which listing.
///
/// A session keeps its own ([`Session::new`]): its listing is current until the upstream says
/// its tools changed, starts again, or the desk's rules over arguments change. A team's server
/// answers each HTTP request with a new session, so it keeps one of these per caller instead
/// ([`Gates::across_requests`], [`Session::with_gates`]): without it, every call would class the
/// listing and read its pins again. Such a listing is also current only while the upstream's
/// listing it was decided from is the one kept, at most [`LISTING_FRESH`] old: a definition the
/// person replaced, a pin accepted on another replica, or a tool the upstream changed without
/// saying so reaches the gates within that second, as it reaches the listing.
///
/// [`LISTING_FRESH`]: crate::upstream::LISTING_FRESH
#[derive(Debug)]
pub struct Gates {
    /// Read and written whole, under one lock: a call's gate is only ever taken together with
    /// the listing it belongs to, never one listing's gate with another's currency.
    decided: Mutex<Decisions>,
    /// Kept across a caller's requests: current only while the upstream's listing they were
    /// decided from is still the one [`Shared::listing`] keeps.
    across_requests: bool,
}

/// What one listing decided, and what it was decided under.
#[derive(Debug)]
struct Decisions {
    by_tool: HashMap<String, Gate>,
    /// The value of [`Shared::tools_epoch`] the gates were listed under (`u64::MAX` before the
    /// first listing): the listing is current only while the two are equal.
    ///
    /// [`Shared::tools_epoch`]: crate::upstream::Shared::tools_epoch
    epoch: u64,
    /// The generation of the desk's rules over arguments the listing was classed under.
    rules: u64,
    /// The upstream's listing the gates were decided from. Weak: an idle caller's gates must not
    /// keep a listing alive once the upstream's kept listing has moved on (the tools' text, for
    /// each caller). Its allocation stays while this points to it, so no later listing can come
    /// to have the same address.
    from: std::sync::Weak<Vec<Value>>,
}

impl Gates {
    fn new(across_requests: bool) -> Self {
        Self {
            decided: Mutex::new(Decisions {
                by_tool: HashMap::new(),
                epoch: u64::MAX,
                rules: u64::MAX,
                from: std::sync::Weak::new(),
            }),
            across_requests,
        }
    }

    /// Gates for one caller of a team's server, kept across its requests (see [`Gates`]). Start
    /// anew ([`Gates::across_requests`] again) whenever the engine made the caller's connection
    /// anew: an engine that forgot it knows none of its tools.
    pub fn across_requests() -> Arc<Self> {
        Arc::new(Self::new(true))
    }
}

/// How many of one agent's gated calls may be planned, checked, queued or confirmed at once.
/// Each of those steps reads or writes the desk's records on the blocking pool, one statement at
/// a time behind one connection; without a bound, an agent that sends thousands of calls at
/// once fills that queue, and every other agent's listing and calls wait behind all of them
/// (seen: a fresh agent's `tools/list` took 5 s while two agents sent 2,000 preflights each). A
/// call waiting for the person holds no turn, and the semaphore is fair (first come, first
/// served), so the agent's own calls keep their order.
pub const DESK_TURNS: usize = 4;

impl Session {
    /// Mirrors the upstream's `InitializeResult` (capabilities, serverInfo, instructions), as
    /// it first started.
    pub fn new(upstream: Arc<Upstream>, engine: Engine, tenant: Tenant, wait: Duration) -> Self {
        Self::with_gates(upstream, engine, tenant, wait, Arc::new(Gates::new(false)))
    }

    /// [`Session::new`], deciding calls by `gates`, which other sessions of the same caller may
    /// share (a team's server: [`Gates::across_requests`]).
    pub fn with_gates(
        upstream: Arc<Upstream>,
        engine: Engine,
        tenant: Tenant,
        wait: Duration,
        gates: Arc<Gates>,
    ) -> Self {
        let shared = upstream.shared().clone();
        let up = upstream.info();
        let mut info = ServerConfig::new(up.capabilities.clone())
            .with_protocol_version(up.protocol_version.clone());
        if let Some(server_info) = &up.server_info {
            info = info.with_server_info(server_info.clone());
        }
        if let Some(instructions) = &up.instructions {
            info = info.with_instructions(instructions.clone());
        }
        info.meta = up.meta.clone();
        let upstream_version = up.protocol_version.clone();
        Self {
            shared,
            upstream,
            info,
            upstream_version,
            engine,
            tenant,
            wait,
            gates,
            client_info: Arc::default(),
            legacy_agent: Arc::default(),
            turns: Arc::new(tokio::sync::Semaphore::new(DESK_TURNS)),
        }
    }

    /// Waits for one of this agent's turns at the desk's records ([`DESK_TURNS`]), held until the
    /// permit is dropped.
    pub(crate) async fn turn(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        // The semaphore is never closed; `None` would only let the call go on unbounded.
        self.turns.acquire().await.ok()
    }

    /// Whether the last listing was taken under the upstream's current tools: since the start
    /// that runs now began, since it last said they changed, and under the desk's rules over
    /// arguments in force (a rule accepted since may gate a tool listed open). A listing that
    /// failed or has not come back yet never counts.
    fn listing_current(&self, decided: &Decisions) -> bool {
        decided.epoch == self.shared.tools_epoch.load(Ordering::Acquire)
            && decided.rules == self.engine.rules_generation()
            && (!self.gates.across_requests || {
                let kept = self
                    .shared
                    .listing(decided.epoch, std::time::Instant::now());
                kept.is_some_and(|kept| std::ptr::eq(Arc::as_ptr(&kept), decided.from.as_ptr()))
            })
    }

    /// How the current listing treats `tool`: `None` when no listing is current; `Some(None)`
    /// when it does not list the tool.
    fn current_gate(&self, tool: &str) -> Option<Option<Gate>> {
        let decided = lock(&self.gates.decided);
        self.listing_current(&decided)
            .then(|| decided.by_tool.get(tool).cloned())
    }

    /// The open lane, when it may take a call of `tool` now (see [`crate::lane`]): the agent and
    /// the upstream speak a revision before 2026-07-28, the tools were listed since the current
    /// start began and since it last said they changed, this listing gates `tool` open, and the
    /// engine agrees. `None` sends the call the full way.
    pub(crate) fn lane_for(&self, tool: &str) -> Option<Arc<crate::lane::Lane>> {
        if !self.shared.lane_armed.load(Ordering::Acquire) {
            return None;
        }
        // The lane first, then the listing: a start that began meanwhile has moved the epoch
        // on before its lane became the current one, so its lane never passes with an old
        // listing.
        let lane = self.upstream.lane()?;
        if self.current_gate(tool) != Some(Some(Gate::Class(GateClass::Open))) {
            return None;
        }
        self.engine
            .forwards_open(&self.tenant, tool)
            .then_some(lane)
    }

    /// Answers `request`, an open tool's call of a team's server, on the open lane for URL
    /// upstreams, when that lane may take it (see [`crate::url_lane`]): the caller's whole JSON-RPC answer, under
    /// `id`, for a caller speaking `version`. `None`: the lane did not take it, or the upstream
    /// cannot have run it; the call takes the full path.
    pub async fn open_by_url_lane(
        &self,
        id: &RequestId,
        request: &ClientRequest,
        version: &ProtocolVersion,
    ) -> Option<Value> {
        let ClientRequest::CallToolRequest(call) = request else {
            return None;
        };
        let params = &call.params;
        // The request's `_meta` (rmcp keeps it beside the parameters, not in them).
        let meta = request.get_meta();
        // A call carrying the 2026-07-28 rounds' fields is the full path's to judge.
        if params.request_state.is_some() || params.input_responses.is_some() {
            return None;
        }
        // The lane first, then the listing: a start that began meanwhile has moved the epoch on
        // before its lane became the current one, so its lane never passes with an old listing.
        let lane = self.upstream.url_lane()?;
        let tool = params.name.as_ref();
        {
            let decided = lock(&self.gates.decided);
            if !self.listing_current(&decided)
                || decided.by_tool.get(tool) != Some(&Gate::Class(GateClass::Open))
            {
                return None;
            }
            if lane.headed() {
                let listing = decided.from.upgrade()?;
                let schema = listing
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some(tool))
                    .and_then(|t| t.get("inputSchema"));
                if !lane.takes_tool(tool, schema) {
                    return None;
                }
            }
        }
        if !self.engine.forwards_open(&self.tenant, tool) {
            return None;
        }
        if let Some(info) = meta.client_info() {
            self.note_client_info(serde_json::to_value(info).unwrap_or_default());
        }
        let modern = *version >= ProtocolVersion::V_2026_07_28;
        let answer = match lane.call(params, meta).await {
            Posted::NotSent => return None,
            Posted::Answer(answer) => answer,
            Posted::Lost => serde_json::to_value(self.lost(tool, None))
                .map_err(|e| ErrorData::internal_error(e.to_string(), None)),
        };
        self.forwarded_open();
        Some(to_caller(id, answer, modern))
    }

    /// A call of `tool` (a gated one of `class`) that was sent and never answered: whether it ran
    /// is not known. Said as what happened: a process that exited, or a URL upstream whose
    /// connection ended.
    fn lost(&self, tool: &str, class: Option<GateClass>) -> CallToolResult {
        if self.upstream.by_url() {
            call_unanswered(tool, class)
        } else {
            call_lost(tool, class)
        }
    }

    /// The current start's open lane, if any, for the agent's cancels.
    pub(crate) fn current_lane(&self) -> Option<Arc<crate::lane::Lane>> {
        self.upstream.lane()
    }

    /// Counts an open call the lane forwarded, as the full path counts its own.
    pub(crate) fn forwarded_open(&self) {
        self.engine.forwarded_open();
    }

    /// The upstream, started again if it has exited; an agent-facing error when it cannot be.
    async fn live(&self) -> Result<Live, ErrorData> {
        self.upstream.live().await.map_err(unavailable)
    }

    /// Forwards one request to the upstream (started again if it has exited), mapping progress
    /// tokens and cancellation. Not for `tools/call`: a call goes only to the start its tool was
    /// gated against ([`Self::up_on`]).
    async fn up(
        &self,
        req: ClientRequest,
        context: &RequestContext<RoleServer>,
    ) -> Result<ServerResult, ErrorData> {
        // A request not handed over reached nothing, so it may go to a new start.
        for _ in 0..3 {
            let live = self.live().await?;
            match self.up_on(&live, req.clone(), context).await {
                Err(ForwardError::NotSent) => self.upstream.discard(&live).await,
                other => return other.map_err(|e| lost_request(e, req.method())),
            }
        }
        Err(unavailable(Unreached::keeps_exiting()))
    }

    /// Forwards one request to the start `live` of the upstream, mapping progress tokens and
    /// cancellation.
    async fn up_on(
        &self,
        live: &Live,
        req: ClientRequest,
        context: &RequestContext<RoleServer>,
    ) -> Result<ServerResult, ForwardError> {
        let mut meta = context.meta.clone();
        meta.remove("progressToken");
        // The agent's own lifecycle keys (2026-07-28: protocol version, clientInfo, capabilities)
        // describe the agent to the desk; toward the upstream the desk is the client and says so
        // itself.
        meta.retain(|key, _| !key.starts_with("io.modelcontextprotocol/"));
        let options = PeerRequestOptions::no_options().with_meta(meta);
        let agent_token = context.meta.get_progress_token();
        let mut registered = None;
        let r = send(&live.peer, req, options, &context.ct, |up_token| {
            if let Some(agent_token) = agent_token {
                lock(&self.shared.progress).insert(up_token.clone(), agent_token);
                registered = Some(up_token.clone());
            }
        })
        .await;
        if let Some(t) = registered {
            // rmcp hands notifications to their handler in tasks of their own, so the last
            // progress of a call can be handled just after its response: keep the mapping a
            // moment longer after a success. After a failure or a cancel, late progress goes.
            let shared = self.shared.clone();
            if r.is_ok() {
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    lock(&shared.progress).remove(&t);
                });
            } else {
                lock(&shared.progress).remove(&t);
            }
        }
        r
    }

    /// Shows the person who asks: the agent's `clientInfo` (its own claim), from its `initialize`
    /// or, on 2026-07-28, from each request's `_meta`.
    fn note_client_info(&self, info: Value) {
        let mut seen = lock(&self.client_info);
        if seen.as_ref() != Some(&info) {
            self.engine.set_client_info(&self.tenant, info.clone());
            *seen = Some(info);
        }
    }

    /// Every tool of the upstream, raw, across all pages.
    async fn upstream_tools(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<Vec<Value>, ErrorData> {
        let mut tools = Vec::new();
        let mut cursor: Option<Value> = None;
        loop {
            let params = cursor.take().map(|c| json!({ "cursor": c }));
            let result = self
                .up(
                    ClientRequest::CustomRequest(CustomRequest::new("tools/list", params)),
                    context,
                )
                .await?;
            let raw = match result {
                ServerResult::CustomResult(raw) => raw.0,
                typed => serde_json::to_value(typed).unwrap_or_default(),
            };
            if let Some(page) = raw.get("tools").and_then(Value::as_array) {
                tools.extend(page.iter().cloned());
            }
            match raw.get("nextCursor") {
                Some(next) if !next.is_null() && tools.len() < 100_000 => {
                    cursor = Some(next.clone())
                }
                _ => break,
            }
        }
        Ok(tools)
    }

    /// Fetches the tools, has the engine class them, and returns the list the agent sees.
    async fn refresh_tools(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<Vec<Value>, Unlisted> {
        // The epoch this listing is taken under: should the tools change while it is fetched or
        // registered, it is out of date at once.
        let epoch = self.shared.tools_epoch.load(Ordering::Acquire);
        let rules = self.engine.rules_generation();
        // A listing taken moments ago under the same epoch serves (see LISTING_FRESH); the time
        // is taken before the fetch, so a kept listing is never older than it says.
        let asked_at = std::time::Instant::now();
        let from = match self.shared.listing(epoch, asked_at) {
            Some(kept) => kept,
            None => {
                let fetched = Arc::new(self.upstream_tools(context).await?);
                self.shared.keep_listing(epoch, asked_at, fetched.clone());
                fetched
            }
        };
        let mut held = HashMap::<String, Value>::new();
        let decided: HashMap<String, Gate> = match self
            .engine
            .register_tools(&self.tenant, from.as_ref().clone())
            .await
        {
            Ok(decisions) => decisions
                .into_iter()
                .map(|d| {
                    if let Some(shown) = d.listed_as {
                        held.insert(d.name.clone(), shown);
                    }
                    (
                        d.name,
                        d.withheld.map_or(Gate::Class(d.class), Gate::Withheld),
                    )
                })
                .collect(),
            Err(stopped) => {
                // No listing of this session is current any more: the engine knows none (its
                // records could not be read), so the next call lists again, once they can be.
                lock(&self.gates.decided).epoch = u64::MAX;
                return Err(Unlisted::Engine(stopped));
            }
        };
        let mut listed = Vec::with_capacity(from.len());
        for tool in from.iter().cloned() {
            let Some(name) = tool.get("name").and_then(Value::as_str).map(str::to_owned) else {
                continue;
            };
            let name = name.as_str();
            // Held back: the agent sees what the person accepted, never the new text.
            let tool = held.remove(name).unwrap_or(tool);
            // Decided by the engine for every named tool; a name it did not decide is not offered.
            match decided.get(name) {
                Some(Gate::Class(GateClass::Open)) => listed.push(tool),
                Some(Gate::Class(class)) => listed.push(policy::augment(&tool, *class)),
                Some(Gate::Withheld(reason)) => {
                    // The engine logged why, once per listing where it matters.
                    tracing::debug!(target: "session", tool = %name, "not offered: {reason}");
                }
                None => {}
            }
        }
        *lock(&self.gates.decided) = Decisions {
            by_tool: decided,
            epoch,
            rules,
            from: Arc::downgrade(&from),
        };
        Ok(listed)
    }

    /// How `tool` is treated, as the running start of the upstream lists it, and that start: a
    /// call goes only to the start whose listing it was gated against.
    async fn gate_of(
        &self,
        tool: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<(Option<Gate>, Live), Unlisted> {
        for _ in 0..3 {
            let live = self.live().await?;
            if let Some(known @ Some(_)) = self.current_gate(tool) {
                return Ok((known, live));
            }
            // A tool not in the last listing, a list that changed, or an upstream started again:
            // never guess, list again.
            self.refresh_tools(context).await?;
            // Listed by this start, unless it was started again meanwhile (then once more).
            if self.upstream.is_current(&live).await {
                return Ok((lock(&self.gates.decided).by_tool.get(tool).cloned(), live));
            }
        }
        Err(unavailable(Unreached::keeps_exiting()).into())
    }

    async fn forward_call(
        &self,
        live: &Live,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ForwardError> {
        match self
            .up_on(
                live,
                ClientRequest::CallToolRequest(CallToolRequest::new(request)),
                context,
            )
            .await?
        {
            ServerResult::CallToolResult(r) => Ok(r),
            other => Err(ForwardError::Answer(ErrorData::internal_error(
                format!("unexpected upstream result: {other:?}"),
                None,
            ))),
        }
    }

    /// Why an open tool's call must not go on, if it must not: the engine has the last word on
    /// every call (a tool whose definition differs from its pin is refused `tool_changed`, open
    /// or not). Anything but a plain yes refuses.
    async fn open_refused(&self, tool: &str) -> Option<CallToolResult> {
        match self.engine.open_call(&self.tenant, tool).await {
            Ok(()) => None,
            Err(stopped) => Some(stopped_result(stopped)),
        }
    }

    async fn gated(
        &self,
        request: CallToolRequestParams,
        class: GateClass,
        live: &Live,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let tool = request.name.to_string();
        let arguments = Value::Object(request.arguments.clone().unwrap_or_default());
        if arguments.get("confirm") == Some(&Value::Bool(true)) {
            let turn = self.turn().await;
            let accepted = self
                .engine
                .confirm_aside(&self.tenant, &tool, &arguments)
                .await;
            drop(turn);
            return match accepted {
                Ok(accepted) => {
                    self.run_accepted(request, accepted, class, live, context)
                        .await
                }
                Err(stopped) => Ok(stopped_result(stopped)),
            };
        }
        match self
            .preflight(&tool, &arguments, self.wait, context)
            .await?
        {
            Asked::Decided(answer) => Ok(from_desk(answer)),
            Asked::Open(arguments) => self.run_open(request, arguments, live, context).await,
        }
    }

    /// Runs a call the desk's rules over arguments open, with the `arguments` they judged: no
    /// click, no token, nothing to spend, as an open tool's call runs. Its round-trip fields,
    /// the desk's own business, are never sent on.
    pub(crate) async fn run_open(
        &self,
        mut request: CallToolRequestParams,
        arguments: serde_json::Map<String, Value>,
        live: &Live,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let tool = request.name.to_string();
        request.arguments = Some(arguments);
        request.request_state = None;
        request.input_responses = None;
        match self.forward_call(live, request, context).await {
            Ok(r) => Ok(r),
            Err(ForwardError::Answer(e)) => Err(e),
            Err(ForwardError::NotSent) => {
                self.upstream.discard(live).await;
                Ok(call_not_sent(&tool, Some(GateClass::Open)))
            }
            Err(ForwardError::Lost) => Ok(self.lost(&tool, Some(GateClass::Open))),
        }
    }

    /// Runs a call the engine accepted, with the `arguments` the person approved, and tells the
    /// engine its outcome.
    async fn run_accepted(
        &self,
        mut request: CallToolRequestParams,
        Accepted { arguments, nonce }: Accepted,
        class: GateClass,
        live: &Live,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let tool = request.name.to_string();
        // What runs is what the person approved, as the desk kept it. It goes to the start the
        // tool was gated against, or nowhere: never to a new process whose tools the engine has
        // not seen. The agent's round-trip fields are the desk's own business, never sent on.
        request.arguments = arguments.as_object().cloned();
        request.request_state = None;
        request.input_responses = None;
        let result = self.forward_call(live, request, context).await;
        let (ok, note) = match &result {
            Ok(r) => (r.is_error != Some(true), None),
            Err(ForwardError::Answer(e)) => (false, Some(e.message.to_string())),
            Err(ForwardError::NotSent) => (false, Some(NOT_SENT_NOTE.to_owned())),
            Err(ForwardError::Lost) => (false, Some(LOST_NOTE.to_owned())),
        };
        let _ = if matches!(result, Err(ForwardError::Lost)) {
            // Handed over, never answered: it may have run. Not a failure.
            self.engine
                .outcome_unknown(&self.tenant, &nonce, note)
                .await
        } else {
            self.engine.outcome(&self.tenant, &nonce, ok, note).await
        };
        match result {
            Ok(r) => Ok(r),
            Err(ForwardError::Answer(e)) => Err(e),
            Err(ForwardError::NotSent) => {
                self.upstream.discard(live).await;
                Ok(call_not_sent(&tool, Some(class)))
            }
            Err(ForwardError::Lost) => Ok(self.lost(&tool, Some(class))),
        }
    }

    /// A preflight of this call, waiting up to `wait` for the person's decision, with progress to
    /// the agent every few seconds. An agent that cancels leaves the request in the queue, marked,
    /// for [`countersign_engine::STOPPED_WAITING_GRACE_MS`].
    async fn preflight(
        &self,
        tool: &str,
        arguments: &Value,
        wait: Duration,
        context: &RequestContext<RoleServer>,
    ) -> Result<Asked, ErrorData> {
        let turn = self.turn().await;
        let queued = self
            .engine
            .queue_preflight(&self.tenant, tool, arguments)
            .await;
        drop(turn);
        let ticket = match queued {
            Ok(Queued::Waiting(ticket)) => ticket,
            Ok(Queued::Granted(approved)) => return Ok(Asked::Decided(Ok(approved))),
            Ok(Queued::Open(arguments)) => return Ok(Asked::Open(arguments)),
            Err(stopped) => return Ok(Asked::Decided(Err(stopped))),
        };
        // A request this preflight queued gets its preview, attached by the ticket's plan hash;
        // one it re-attached to has had its own.
        if ticket.is_new() {
            crate::preview::start(
                &self.engine,
                &self.tenant,
                &self.upstream,
                tool,
                arguments,
                ticket.plan_hash(),
            );
        }
        let preflight = self.engine.decision(ticket, wait);
        tokio::pin!(preflight);
        let progress = context.meta.get_progress_token();
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        tick.tick().await;
        let mut step = 0u32;
        loop {
            tokio::select! {
                answer = &mut preflight => return Ok(Asked::Decided(answer)),
                _ = context.ct.cancelled() => {
                    // The agent stopped waiting (its cancel, or its client's own timeout): the
                    // request stays, marked, for the grace, and the same call asked again
                    // re-attaches to it and collects an approval given meanwhile.
                    let _ = self.engine.stop_waiting_aside(&self.tenant, tool, arguments).await;
                    return Err(ErrorData::internal_error("request cancelled", None));
                }
                _ = tick.tick() => {
                    if let Some(token) = &progress {
                        step += 1;
                        let note = ProgressNotificationParam::new(token.clone(), f64::from(step))
                            .with_message("waiting for a person to approve at the Countersign desk");
                        let _ = context.peer.notify_progress(note).await;
                    }
                }
            }
        }
    }
}

/// A refusal as the agent receives it: an error result whose text is `message`, and whose
/// `structuredContent` says the same to a client that shows its model only that (Claude Code and
/// Codex do): `refusal` (the code), `message` (the whole text) and `nextStep` (the part of the
/// text that says what to do next, word for word). The table in docs/clients.md, "What an agent
/// sees", lists them.
fn refusal(refusal: Refusal, message: &str) -> CallToolResult {
    refused(refusal, message, None)
}

/// [`refusal`], with the note the person left with a denial as `note`.
fn refused(refusal: Refusal, message: &str, note: Option<&str>) -> CallToolResult {
    let mut r = CallToolResult::error(vec![ContentBlock::text(message)]);
    let mut said = json!({
        "refusal": refusal.code(),
        "message": message,
        "nextStep": refusal.next_step_in(message),
    });
    if let Some(note) = note {
        said["note"] = json!(note);
    }
    r.structured_content = Some(said);
    r
}

/// An error that is not a refusal, as the agent receives it: the text, and in
/// `structuredContent` the code under `error`, the text as `message`, and `nextStep` where the
/// text says one (its `Next: `).
pub(crate) fn failed(code: &str, message: String) -> CallToolResult {
    let mut said = json!({ "error": code, "message": message });
    if let Some(step) = countersign_core::refusal::next_step_said(&message) {
        said["nextStep"] = json!(step);
    }
    let mut r = CallToolResult::error(vec![ContentBlock::text(message)]);
    r.structured_content = Some(said);
    r
}

/// The desk's answer to a preflight, as a tool result.
/// What a preflight came to: the desk's answer, or the rules over arguments open the call.
pub(crate) enum Asked {
    /// Approved (by a click or a grant), or stopped.
    Decided(Result<Approved, Stopped>),
    /// Runs without a click, with these arguments: [`Session::run_open`].
    Open(serde_json::Map<String, Value>),
}

fn from_desk(answer: Result<Approved, Stopped>) -> CallToolResult {
    match answer {
        Ok(approved) => approved_result(approved),
        Err(stopped) => stopped_result(stopped),
    }
}

/// An approval as the agent receives it: the preflight text, and in `structuredContent` what a
/// model that reads only that needs to confirm: how (`nextStep`, the text's own sentence), what
/// was approved (`action`, `summary`, `reversible`), and the token with its target, lifetime and
/// uses. The table in docs/clients.md, "What an agent sees", lists them.
fn approved_result(
    Approved {
        text,
        next_step,
        action,
        summary,
        reversible,
        expires_in,
        token,
        target,
        expires_at_ms,
        class,
    }: Approved,
) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = Some(json!({
        "approved": true,
        "nextStep": next_step,
        "summary": summary,
        "action": action,
        "reversible": reversible,
        "confirmTarget": target,
        "confirmToken": token,
        "expiresIn": expires_in,
        "expiresAtMs": expires_at_ms,
        "worksOnce": class.is_single_use(),
    }));
    r
}

/// Why the desk did not do what a call asked, as a tool result: a refusal's code, or an error's.
fn stopped_result(stopped: Stopped) -> CallToolResult {
    match &stopped {
        Stopped::Refused { refusal, .. } => refused(*refusal, stopped.message(), stopped.note()),
        Stopped::Failed {
            code: ErrorCode::NoSecret,
            message,
        } => refusal(Refusal::DeskUnavailable, &no_secret(message)),
        // A code the agent can branch on, as for refusals and unlisted tools; the text for people.
        Stopped::Failed { code, message } => failed(code.code(), message.clone()),
    }
}

/// What an agent is told when the desk cannot sign approvals (`why`: its keychain), with the
/// next move.
fn no_secret(why: &str) -> String {
    format!(
        "Refused: the Countersign desk cannot sign approvals right now: {}. Nothing was \
         executed. Next: ask the user to fix this in the Countersign desk, then call this tool \
         again.",
        why.trim_end_matches('.')
    )
}

impl ServerHandler for Session {
    fn get_info(&self) -> ServerConfig {
        self.info.clone()
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        // Never promise the agent a newer protocol than the upstream speaks.
        Cow::Borrowed(ProtocolVersion::known_up_to(&self.upstream_version))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        context.peer.set_peer_info(request.clone());
        self.note_client_info(serde_json::to_value(&request.client_info).unwrap_or_default());
        let result = self.negotiate_initialize(&request)?;
        let legacy = |v: &ProtocolVersion| *v < ProtocolVersion::V_2026_07_28;
        self.legacy_agent.store(
            legacy(&result.protocol_version) && legacy(&self.upstream_version),
            Ordering::Release,
        );
        Ok(result)
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        // Only now may requests go to the agent (roots, sampling, elicitation).
        self.shared.set_agent(context.peer.clone());
        if self.legacy_agent.load(Ordering::Acquire) {
            self.shared.lane_armed.store(true, Ordering::Release);
        }
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // Only RawTools::handle_request reaches here, with the gate it decided (an open tool's
        // call it forwards itself): one decision per call, one retry loop, in one handler.
        let Some(Decided { gate, live }) = context.extensions.get::<Decided>().cloned() else {
            return Err(ErrorData::internal_error(
                "a tool call reached the desk's typed handler without its gate",
                None,
            ));
        };
        let mut result = match gate {
            Some(Gate::Class(GateClass::Open)) => {
                return Err(ErrorData::internal_error(
                    "an open tool's call reached the desk's typed handler",
                    None,
                ));
            }
            // Not in the upstream's listing, even after listing again: no annotations, no
            // schema, nothing a person could judge. Refused, never sent on ungated.
            None => {
                let _turn = self.turn().await;
                self.engine
                    .record_unlisted(&self.tenant, &request.name)
                    .await;
                unlisted(&request.name)
            }
            Some(Gate::Class(class)) => {
                // The 2026-07-28 flow, where the agent negotiated it or sent its state.
                if let Some(response) = self.rounds(&request, class, &live, &context).await? {
                    return Ok(response);
                }
                self.gated(request.clone(), class, &live, &context).await?
            }
            Some(Gate::Withheld(reason)) => {
                let message = format!(
                    "Countersign does not offer `{}`: {reason}. Nothing was executed. Next: use \
                     another tool, or ask the user to change this one's definition upstream.",
                    request.name
                );
                let mut r = failed("withheld", message);
                if let Some(said) = r.structured_content.as_mut() {
                    said["reason"] = json!(reason);
                }
                r
            }
        };
        // Results from older upstreams carry no resultType; newer agents require it (rmcp removes
        // it again for older agents).
        result.result_type.get_or_insert(ResultType::COMPLETE);
        Ok(result.into())
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        // The router lets no custom request through; should one arrive, it is not sent on.
        Err(ErrorData::new(
            rmcp::model::ErrorCode::METHOD_NOT_FOUND,
            format!("Countersign does not pass on `{}`", request.method),
            None,
        ))
    }

    async fn on_roots_list_changed(&self, _context: NotificationContext<RoleServer>) {
        // A start that is not running yet asks for roots when it starts.
        if let Some(upstream) = self.upstream.running().await {
            let _ = upstream.notify_roots_list_changed().await;
        }
    }

    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        _context: NotificationContext<RoleServer>,
    ) {
        tracing::warn!(target: "session", method = %notification.method, "dropped a notification that is not passed on");
    }
}

/// The answer to a call of a tool the upstream does not list.
fn unlisted(name: &str) -> CallToolResult {
    let message = format!(
        "Refused: `{name}` is not among the tools this server lists, so Countersign cannot tell \
         what it does and does not pass it on. Nothing was executed. Next: list the tools and \
         call one of them."
    );
    failed("unlisted_tool", message)
}

/// The code of an agent-facing error for an upstream that has exited and could not be started
/// again: nothing was sent to it.
const UNAVAILABLE: &str = "upstream_unavailable";
/// The code of an agent-facing error for an upstream that exited while a request was in flight:
/// whether it acted on it is unknown.
const EXITED: &str = "upstream_exited";

/// What the history says of a confirmed call whose upstream exited before it was handed over.
const NOT_SENT_NOTE: &str = "not sent: the upstream had exited";
/// What the history says of a confirmed call whose upstream exited while it ran.
const LOST_NOTE: &str = "the upstream exited during the call: whether it ran is not known";

/// The upstream has exited and could not be started again, as a JSON-RPC error.
fn unavailable(why: Unreached) -> ErrorData {
    let message = format!(
        "The upstream server has exited and could not be started again ({}). Nothing was sent \
         to it. Next: tell the person (what the server printed is in the gateway's log); each \
         new request tries to start it again.",
        why.message
    );
    ErrorData::internal_error(message, Some(json!({ "error": UNAVAILABLE })))
}

/// The answer to a request other than `tools/call` that the upstream took and never answered.
fn lost_request(e: ForwardError, method: &str) -> ErrorData {
    match e {
        ForwardError::Answer(e) => e,
        ForwardError::NotSent | ForwardError::Lost => ErrorData::internal_error(
            format!(
                "The upstream server exited (it crashed or was killed) before it answered \
                 `{method}`. Next: send it again; Countersign starts the server again."
            ),
            Some(json!({ "error": EXITED })),
        ),
    }
}

/// A call answered for an upstream that went away: an error result, with a code the agent can
/// branch on.
fn gone_result(code: &str, message: String) -> CallToolResult {
    let mut r = failed(code, message);
    r.result_type.get_or_insert(ResultType::COMPLETE);
    r
}

/// What became of an approval whose call did not complete, for a gated call (`class`).
fn approval_after(class: Option<GateClass>) -> &'static str {
    match class {
        None => "",
        Some(class) if class.is_single_use() => {
            " Its approval worked once and is spent: if the call must run, make the preflight \
             again."
        }
        Some(_) => {
            " Its token stays valid until it expires: calling again with it runs the call again."
        }
    }
}

/// A call the upstream took and never answered because it exited: whether it ran is unknown.
pub(crate) fn call_lost(tool: &str, class: Option<GateClass>) -> CallToolResult {
    gone_result(
        EXITED,
        format!(
            "The upstream server exited (it crashed or was killed) while `{tool}` was running, \
             so whether it ran, in whole or in part, is not known.{} Next: check whether its \
             effect happened before calling it again; Countersign starts the server again on the \
             next call.",
            approval_after(class)
        ),
    )
}

/// [`call_lost`] for an upstream reached by URL, which does not exit but stops answering.
fn call_unanswered(tool: &str, class: Option<GateClass>) -> CallToolResult {
    gone_result(
        EXITED,
        format!(
            "No answer to `{tool}` came back from the upstream server (its connection ended, or \
             it answered out of turn), so whether it ran, in whole or in part, is not known.{} \
             Next: check whether its effect happened before calling it again; Countersign \
             reaches the server again on the next call.",
            approval_after(class)
        ),
    )
}

/// A confirmed call the upstream never received: it had exited just before.
pub(crate) fn call_not_sent(tool: &str, class: Option<GateClass>) -> CallToolResult {
    gone_result(
        EXITED,
        format!(
            "The upstream server exited (it crashed or was killed) just before `{tool}` was sent \
             to it: nothing was executed.{} Countersign starts the server again on the next call.",
            approval_after(class)
        ),
    )
}

/// Why the tools could not be listed for the agent: typed, so that a call hears the engine's
/// refusal as a tool result and a listing hears it as a JSON-RPC error.
enum Unlisted {
    /// The upstream could not be reached or answered with an error.
    Upstream(ErrorData),
    /// The engine could not class the tools: its records could not be read
    /// (`ledger_unreachable`, an outage and never a statement about the tools), or it no longer
    /// knows the connection.
    Engine(Stopped),
}

impl From<ErrorData> for Unlisted {
    fn from(e: ErrorData) -> Self {
        Unlisted::Upstream(e)
    }
}

impl Unlisted {
    /// As the answer to `tools/list`: a JSON-RPC error. For the engine's refusal, an internal
    /// error whose `data.error` is its code (`ledger_unreachable`) and whose message is its text
    /// (an outage: retry shortly). An error, not a listing: a client caches a listing, and an
    /// empty or held-back one would say something untrue about the tools until it lists again.
    fn into_error(self) -> ErrorData {
        match self {
            Unlisted::Upstream(e) => e,
            Unlisted::Engine(stopped) => ErrorData::internal_error(
                stopped.message().to_owned(),
                Some(json!({ "error": stopped.code() })),
            ),
        }
    }
}

/// `e` as a call's result when it says the upstream is gone (so that an agent reads it where it
/// reads tool errors); any other error stays a JSON-RPC error.
fn upstream_gone(e: ErrorData) -> Result<CallToolResult, ErrorData> {
    let code = e
        .data
        .as_ref()
        .and_then(|d| d.get("error"))
        .and_then(Value::as_str);
    match code {
        Some(code @ (UNAVAILABLE | EXITED)) => Ok(gone_result(code, e.message.to_string())),
        _ => Err(e),
    }
}

/// Whether the agent speaks 2026-07-28 or later on this request.
fn is_modern(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28)
}

/// Bypassing rmcp's handler also bypasses its per-version fix-ups: agents on protocol 2026-07-28
/// or later need `resultType`, older ones must not see it.
fn fit_result_type(raw: &mut Value, context: &RequestContext<RoleServer>) {
    fit_result_type_for(raw, is_modern(context));
}

/// [`fit_result_type`] for an agent on 2026-07-28 or later (`newer`), or before.
pub(crate) fn fit_result_type_for(raw: &mut Value, newer: bool) {
    let Some(object) = raw.as_object_mut() else {
        return;
    };
    if newer {
        object
            .entry("resultType")
            .or_insert_with(|| json!("complete"));
    } else if object.get("resultType") == Some(&json!("complete")) {
        object.remove("resultType");
    }
}

/// The session as an rmcp service: `tools/list` and open tools' calls are answered raw (every
/// field kept), the rest by the [`ServerHandler`] above.
#[derive(Clone)]
pub struct RawTools(pub Session);

impl Service<RoleServer> for RawTools {
    async fn handle_request(
        &self,
        request: ClientRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<ServerResult, ErrorData> {
        if let Some(info) = context.meta.client_info() {
            self.0
                .note_client_info(serde_json::to_value(info).unwrap_or_default());
        }
        match request {
            ClientRequest::ListToolsRequest(_) => {
                let tools = self
                    .0
                    .refresh_tools(&context)
                    .await
                    .map_err(Unlisted::into_error)?;
                let mut raw = json!({ "tools": tools });
                fit_result_type(&mut raw, &context);
                if is_modern(&context) {
                    // 2026-07-28 list results say how long they may be cached. This listing is
                    // this session's alone and changes with the desk's policy: never shared,
                    // never cached.
                    raw["ttlMs"] = json!(0);
                    raw["cacheScope"] = json!("private");
                }
                Ok(ServerResult::CustomResult(CustomResult::new(raw)))
            }
            // An open tool's call is passed on raw: the result keeps every field the upstream
            // sent, and skips rmcp's decoding by trial of every result shape (the hot path).
            ClientRequest::CallToolRequest(req) => {
                for _ in 0..3 {
                    let (gate, live) = match self.0.gate_of(&req.params.name, &context).await {
                        Ok(decided) => decided,
                        Err(Unlisted::Upstream(e)) => {
                            return upstream_gone(e).map(ServerResult::CallToolResult);
                        }
                        // The engine could not class the tools (its records unreadable): its
                        // refusal, `ledger_unreachable`, as the call's result.
                        Err(Unlisted::Engine(stopped)) => {
                            let mut refused = stopped_result(stopped);
                            refused.result_type.get_or_insert(ResultType::COMPLETE);
                            return Ok(ServerResult::CallToolResult(refused));
                        }
                    };
                    if gate != Some(Gate::Class(GateClass::Open)) {
                        // Gated, withheld or unlisted: decided here, answered by the typed
                        // handler through rmcp (its checks of the protocol and of the result
                        // for the agent's revision), which takes this decision with the call.
                        let mut context = context;
                        context.extensions.insert(Decided { gate, live });
                        let req = ClientRequest::CallToolRequest(req);
                        return <Session as Service<RoleServer>>::handle_request(
                            &self.0, req, context,
                        )
                        .await;
                    }
                    if let Some(mut refused) = self.0.open_refused(&req.params.name).await {
                        refused.result_type.get_or_insert(ResultType::COMPLETE);
                        return Ok(ServerResult::CallToolResult(refused));
                    }
                    let params = serde_json::to_value(&req.params)
                        .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
                    let call = CustomRequest::new("tools/call", Some(params));
                    let up = self
                        .0
                        .up_on(&live, ClientRequest::CustomRequest(call), &context);
                    let mut raw = match up.await {
                        Ok(ServerResult::CustomResult(raw)) => raw.0,
                        Ok(typed) => serde_json::to_value(typed).unwrap_or_default(),
                        Err(ForwardError::Answer(e)) => return Err(e),
                        // Nothing was handed over: gate it again on a new start.
                        Err(ForwardError::NotSent) => {
                            self.0.upstream.discard(&live).await;
                            continue;
                        }
                        Err(ForwardError::Lost) => {
                            let lost = self.0.lost(&req.params.name, None);
                            return Ok(ServerResult::CallToolResult(lost));
                        }
                    };
                    fit_result_type(&mut raw, &context);
                    return Ok(ServerResult::CustomResult(CustomResult::new(raw)));
                }
                upstream_gone(unavailable(Unreached::keeps_exiting()))
                    .map(ServerResult::CallToolResult)
            }
            // Resources, prompts, completion and logging: sent on as typed (the router has
            // checked their shape; rmcp re-serializes them), the upstream's typed answer back.
            request @ (ClientRequest::ListResourcesRequest(_)
            | ClientRequest::ListResourceTemplatesRequest(_)
            | ClientRequest::ReadResourceRequest(_)
            | ClientRequest::ListPromptsRequest(_)
            | ClientRequest::GetPromptRequest(_)
            | ClientRequest::CompleteRequest(_)
            | ClientRequest::SetLevelRequest(_)
            | ClientRequest::SubscribeRequest(_)
            | ClientRequest::UnsubscribeRequest(_)) => self.0.up(request, &context).await,
            // The handshake, ping, and the refusal of anything else.
            other => {
                <Session as Service<RoleServer>>::handle_request(&self.0, other, context).await
            }
        }
    }

    async fn handle_notification(
        &self,
        notification: ClientNotification,
        context: NotificationContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        <Session as Service<RoleServer>>::handle_notification(&self.0, notification, context).await
    }

    fn get_info(&self) -> ServerConfig {
        ServerHandler::get_info(&self.0)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        ServerHandler::supported_protocol_versions(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use countersign_core::request_state::{StateError, StateRefusal};

    use super::*;

    fn said(r: &CallToolResult) -> &Value {
        r.structured_content.as_ref().expect("structuredContent")
    }

    fn text(r: &CallToolResult) -> String {
        r.content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect()
    }

    #[test]
    fn every_refusal_kind_carries_its_next_step_as_its_text_says_it() {
        for kind in Refusal::ALL {
            let r = stopped_result(Stopped::Refused {
                refusal: kind,
                message: kind.next_move().to_owned(),
            });
            let s = said(&r);
            assert_eq!(r.is_error, Some(true));
            assert_eq!(s["refusal"], kind.code());
            assert_eq!(s["message"], text(&r).as_str());
            assert_eq!(s["nextStep"], kind.next_step(), "{kind}");
            assert!(text(&r).ends_with(kind.next_step()), "{kind}");
            assert!(s.get("note").is_none());
        }
    }

    #[test]
    fn every_refused_request_state_carries_a_next_step_from_its_text() {
        let states = [
            StateRefusal::Expired,
            StateRefusal::NotOurs(StateError::BadSignature),
            StateRefusal::WrongTenant,
            StateRefusal::WrongTool,
            StateRefusal::Used,
            StateRefusal::PlanChanged,
            StateRefusal::RequestGone,
            StateRefusal::Unreachable,
        ];
        for state in states {
            let r = refusal(state.refusal(), &state.message());
            let s = said(&r);
            let step = s["nextStep"].as_str().unwrap();
            assert_eq!(s["refusal"], state.refusal().code());
            assert!(text(&r).contains(step), "{state:?}");
            assert!(
                step.len() < text(&r).len(),
                "{state:?}: the step is all it says"
            );
        }
    }

    #[test]
    fn a_desk_that_cannot_sign_says_desk_unavailable_with_a_next_step() {
        let r = stopped_result(Stopped::Failed {
            code: ErrorCode::NoSecret,
            message: "the OS keychain did not answer within 5 s (locked?)".into(),
        });
        let s = said(&r);
        assert_eq!(s["refusal"], "desk_unavailable");
        assert_eq!(
            s["nextStep"],
            "ask the user to fix this in the Countersign desk, then call this tool again."
        );
        assert!(
            text(&r).contains("(locked?). Nothing was executed."),
            "{}",
            text(&r)
        );
    }

    #[test]
    fn an_error_carries_a_next_step_only_where_its_text_says_one() {
        let busy = stopped_result(Stopped::Failed {
            code: ErrorCode::Busy,
            message: "Refused: too many wait. Next: wait for the person.".into(),
        });
        assert_eq!(said(&busy)["error"], "busy");
        assert_eq!(said(&busy)["nextStep"], "wait for the person.");
        let bare = stopped_result(Stopped::Failed {
            code: ErrorCode::BadArguments,
            message: "a confirm is not a preflight".into(),
        });
        assert!(said(&bare).get("nextStep").is_none());
        let lost = call_lost("execute", Some(GateClass::Once));
        assert_eq!(said(&lost)["error"], EXITED);
        let unanswered = call_unanswered("execute", Some(GateClass::Once));
        assert_eq!(said(&unanswered)["error"], EXITED);
        assert!(
            !text(&unanswered).contains("exited"),
            "{}",
            text(&unanswered)
        );
        assert!(
            text(&unanswered).contains("is spent"),
            "{}",
            text(&unanswered)
        );
        assert!(text(&unanswered).ends_with(said(&unanswered)["nextStep"].as_str().unwrap()));
        assert!(text(&lost).ends_with(said(&lost)["nextStep"].as_str().unwrap()));
    }

    #[test]
    fn an_approval_says_how_to_confirm_apart_from_its_token() {
        let r = approved_result(Approved {
            text: "Approved ...\nTo proceed, call this tool again with confirm: true, \
                   confirmTarget: \"t\", and confirmToken from this response.\nconfirmToken: \
                   cs1.payload.tag (expires in 10 minutes, works once)"
                .into(),
            next_step: countersign_core::render::instruction("t"),
            action: "drop".into(),
            summary: "Drop t".into(),
            reversible: false,
            expires_in: "10 minutes".into(),
            token: "cs1.payload.tag".into(),
            target: "t".into(),
            expires_at_ms: 7,
            class: GateClass::Once,
        });
        let s = said(&r);
        let step = s["nextStep"].as_str().unwrap();
        assert!(text(&r).lines().any(|l| l == step));
        assert!(!step.contains("cs1."));
        assert_eq!(
            s,
            &json!({
                "approved": true,
                "nextStep": step,
                "summary": "Drop t",
                "action": "drop",
                "reversible": false,
                "confirmTarget": "t",
                "confirmToken": "cs1.payload.tag",
                "expiresIn": "10 minutes",
                "expiresAtMs": 7,
                "worksOnce": true,
            })
        );
    }
}
