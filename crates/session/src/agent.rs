//! The session's server half, toward the agent (behind [`crate::router`], which has already
//! refused every message that is not on its allow-list or not of the shape MCP defines).
//!
//! `tools/list` is fetched raw from the upstream (every field it sent survives), classed by the
//! engine, and answered with gated tools augmented (`confirm`, `confirmTarget`, `confirmToken`, a
//! sentence, no `outputSchema`) and withheld tools left out. Every `tools/call` is decided here:
//! an open tool's call goes on, a gated one goes to the engine (a preflight waits for a person,
//! with progress to the agent; a confirm is verified, and what the person approved is what gets
//! sent), and a tool missing from the listing is refused. The other allowed requests are sent on
//! typed, re-serialized by the desk; anything else is an error, never "forward".
#![allow(deprecated)] // roots, sampling, logging and subscribe are marked deprecated in rmcp 3.x; MCP still has them

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use countersign_core::{GateClass, Refusal, policy};
use countersign_engine::{Answer, Engine, ErrorCode};
use rmcp::model::*;
use rmcp::service::{NotificationContext, PeerRequestOptions, RequestContext};
use rmcp::{ErrorData, Peer, RoleClient, RoleServer, ServerHandler, Service};
use serde_json::{Value, json};

use crate::upstream::{Shared, forward};

/// How one tool is treated, as last decided.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Gate {
    Class(GateClass),
    Withheld(String),
}

/// The server half.
#[derive(Clone)]
pub struct Session {
    shared: Arc<Shared>,
    upstream: Peer<RoleClient>,
    info: ServerConfig,
    upstream_version: ProtocolVersion,
    engine: Engine,
    tenant: String,
    wait: Duration,
    gates: Arc<Mutex<HashMap<String, Gate>>>,
    /// The agent's clientInfo as last shown to the person.
    client_info: Arc<Mutex<Option<Value>>>,
}

impl Session {
    /// Mirrors the upstream's `InitializeResult` (capabilities, serverInfo, instructions).
    pub fn new(
        shared: Arc<Shared>,
        upstream: Peer<RoleClient>,
        engine: Engine,
        tenant: String,
        wait: Duration,
    ) -> Self {
        let up = upstream
            .peer_info()
            .expect("an initialized upstream has peer info");
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
            gates: Arc::default(),
            client_info: Arc::default(),
        }
    }

    /// Forwards one request to the upstream, mapping progress tokens and cancellation.
    async fn up(
        &self,
        req: ClientRequest,
        context: &RequestContext<RoleServer>,
    ) -> Result<ServerResult, ErrorData> {
        let mut meta = context.meta.clone();
        meta.remove("progressToken");
        // The agent's own lifecycle keys (2026-07-28: protocol version, clientInfo, capabilities)
        // describe the agent to the desk; toward the upstream the desk is the client and says so
        // itself.
        meta.retain(|key, _| !key.starts_with("io.modelcontextprotocol/"));
        let options = PeerRequestOptions::no_options().with_meta(meta);
        let agent_token = context.meta.get_progress_token();
        let mut registered = None;
        let r = forward(&self.upstream, req, options, &context.ct, |up_token| {
            if let Some(agent_token) = agent_token {
                self.shared
                    .progress
                    .lock()
                    .unwrap()
                    .insert(up_token.clone(), agent_token);
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
                    shared.progress.lock().unwrap().remove(&t);
                });
            } else {
                shared.progress.lock().unwrap().remove(&t);
            }
        }
        r
    }

    /// Shows the person who asks: the agent's `clientInfo` (its own claim), from its `initialize`
    /// or, on 2026-07-28, from each request's `_meta`.
    fn note_client_info(&self, info: Value) {
        let mut seen = self.client_info.lock().unwrap();
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
    ) -> Result<Vec<Value>, ErrorData> {
        self.shared.tools_stale.store(false, Ordering::Release);
        let tools = self.upstream_tools(context).await?;
        let decided: HashMap<String, Gate> =
            match self.engine.register_tools(&self.tenant, tools.clone()) {
                Answer::Classes { tools: decisions } => decisions
                    .into_iter()
                    .map(|d| {
                        (
                            d.name,
                            d.withheld.map_or(Gate::Class(d.class), Gate::Withheld),
                        )
                    })
                    .collect(),
                other => {
                    return Err(ErrorData::internal_error(
                        format!("the desk could not class the tools: {other:?}"),
                        None,
                    ));
                }
            };
        let mut listed = Vec::with_capacity(tools.len());
        for tool in tools {
            let Some(name) = tool.get("name").and_then(Value::as_str) else {
                continue;
            };
            // Decided by the engine for every named tool; a name it did not decide is not offered.
            match decided.get(name) {
                Some(Gate::Class(GateClass::Open)) => listed.push(tool),
                Some(Gate::Class(class)) => listed.push(policy::augment(&tool, *class)),
                Some(Gate::Withheld(reason)) => {
                    tracing::warn!(target: "session", tool = %name, "not offered: {reason}");
                }
                None => {}
            }
        }
        *self.gates.lock().unwrap() = decided;
        Ok(listed)
    }

    async fn gate_of(
        &self,
        tool: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<Option<Gate>, ErrorData> {
        let known = self.gates.lock().unwrap().get(tool).cloned();
        if known.is_some() && !self.shared.tools_stale.load(Ordering::Acquire) {
            return Ok(known);
        }
        // A tool not in the last listing (or a list that changed): never guess, list again.
        self.refresh_tools(context).await?;
        Ok(self.gates.lock().unwrap().get(tool).cloned())
    }

    async fn forward_call(
        &self,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        match self
            .up(
                ClientRequest::CallToolRequest(CallToolRequest::new(request)),
                context,
            )
            .await?
        {
            ServerResult::CallToolResult(r) => Ok(r),
            other => Err(ErrorData::internal_error(
                format!("unexpected upstream result: {other:?}"),
                None,
            )),
        }
    }

    async fn gated(
        &self,
        mut request: CallToolRequestParams,
        class: GateClass,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let tool = request.name.to_string();
        let arguments = Value::Object(request.arguments.clone().unwrap_or_default());
        if arguments.get("confirm") == Some(&Value::Bool(true)) {
            let answer = self.engine.confirm(&self.tenant, &tool, &arguments);
            return match answer {
                Answer::Accepted { arguments, nonce } => {
                    // What runs is what the person approved, as the desk kept it.
                    request.arguments = arguments.as_object().cloned();
                    let result = self.forward_call(request, context).await;
                    let (ok, note) = match &result {
                        Ok(r) => (r.is_error != Some(true), None),
                        Err(e) => (false, Some(e.message.to_string())),
                    };
                    let _ = self.engine.outcome(&self.tenant, &nonce, ok, note);
                    result
                }
                answer => Ok(from_desk(answer)),
            };
        }
        let preflight = self
            .engine
            .preflight(&self.tenant, &tool, &arguments, self.wait);
        tokio::pin!(preflight);
        let progress = context.meta.get_progress_token();
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        tick.tick().await;
        let mut step = 0u32;
        let answer = loop {
            tokio::select! {
                answer = &mut preflight => break answer,
                _ = context.ct.cancelled() => {
                    // The agent gave up: take the request off the person's queue.
                    let _ = self.engine.withdraw(&self.tenant, &tool, &arguments);
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
        };
        let _ = class;
        Ok(from_desk(answer))
    }
}

/// A refusal as the agent receives it: an error result whose `structuredContent.refusal` is the code.
fn refusal(refusal: Refusal, message: &str) -> CallToolResult {
    let mut r = CallToolResult::error(vec![ContentBlock::text(message)]);
    r.structured_content = Some(json!({ "refusal": refusal.code(), "message": message }));
    r
}

/// The desk's answer to a gated call, as a tool result.
fn from_desk(answer: Answer) -> CallToolResult {
    match answer {
        Answer::Approved {
            text,
            token,
            target,
            expires_at_ms,
            class,
        } => {
            let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
            r.structured_content = Some(json!({
                "approved": true,
                "confirmToken": token,
                "confirmTarget": target,
                "expiresAtMs": expires_at_ms,
                "worksOnce": class.is_single_use(),
            }));
            r
        }
        Answer::Refused {
            refusal: code,
            message,
        } => refusal(code, &message),
        Answer::Error {
            code: ErrorCode::NoSecret,
            message,
        } => refusal(
            Refusal::DeskUnavailable,
            &format!("Refused: the Countersign desk cannot sign approvals right now: {message}"),
        ),
        // A code the agent can branch on, as for refusals and unlisted tools; the text for people.
        Answer::Error { code, message } => {
            let mut r = CallToolResult::error(vec![ContentBlock::text(message.clone())]);
            r.structured_content = Some(json!({ "error": code.code(), "message": message }));
            r
        }
        other => refusal(
            Refusal::DeskUnavailable,
            &format!("unexpected answer from the desk: {other:?}"),
        ),
    }
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
        self.negotiate_initialize(&request)
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        // Only now may requests go to the agent (roots, sampling, elicitation).
        self.shared.set_agent(context.peer.clone());
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let mut result = match self.gate_of(&request.name, &context).await? {
            Some(Gate::Class(GateClass::Open)) => self.forward_call(request, &context).await?,
            // Not in the upstream's listing, even after listing again: no annotations, no schema,
            // nothing a person could judge. Refused, never sent on ungated.
            None => {
                self.engine.record_unlisted(&self.tenant, &request.name);
                unlisted(&request.name)
            }
            Some(Gate::Class(class)) => self.gated(request, class, &context).await?,
            Some(Gate::Withheld(reason)) => {
                let mut r = CallToolResult::error(vec![ContentBlock::text(format!(
                    "Countersign does not offer `{}`: {reason}.",
                    request.name
                ))]);
                r.structured_content = Some(json!({ "error": "withheld", "reason": reason }));
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
        let _ = self.upstream.notify_roots_list_changed().await;
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
    let mut r = CallToolResult::error(vec![ContentBlock::text(message.clone())]);
    r.structured_content = Some(json!({ "error": "unlisted_tool", "message": message }));
    r
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
    let newer = is_modern(context);
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
                let tools = self.0.refresh_tools(&context).await?;
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
                let gate = self.0.gate_of(&req.params.name, &context).await?;
                if gate != Some(Gate::Class(GateClass::Open)) {
                    let req = ClientRequest::CallToolRequest(req);
                    return <Session as Service<RoleServer>>::handle_request(&self.0, req, context)
                        .await;
                }
                let params = serde_json::to_value(&req.params)
                    .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
                let call = CustomRequest::new("tools/call", Some(params));
                let mut raw = match self
                    .0
                    .up(ClientRequest::CustomRequest(call), &context)
                    .await?
                {
                    ServerResult::CustomResult(raw) => raw.0,
                    typed => serde_json::to_value(typed).unwrap_or_default(),
                };
                fit_result_type(&mut raw, &context);
                Ok(ServerResult::CustomResult(CustomResult::new(raw)))
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
