//! The open lane for an upstream reached by URL: a team's server posts an open tool's call
//! straight to the upstream, over the connections rmcp's client keeps, past both rmcp sessions,
//! as [`crate::lane`] writes one to a line-based upstream.
//!
//! Why: on a team's server every agent's reads, listings and searches are open calls, and through
//! the two rmcp sessions each one crossed five tasks on the way up and five on the way down (the
//! HTTP handler, the server session, its handler task, the client session, its HTTP worker),
//! with a parse and a serialization at each session. Measured (`serve_bench`, release, 2 cores):
//! a front server added about 350 µs to an open call that takes 710 µs directly; with the lane,
//! about 230 µs (a bare relay of the same bytes added about 165 µs). The decision needs none of
//! that: the kept gates say the tool is open under the upstream's current listing, and the engine
//! agrees. So the call is posted with rmcp's own HTTP client ([`StreamableHttpClient`], the one
//! its worker uses, which reads JSON and SSE answers within its limits), under an id of the
//! lane's own, and the answer is rebuilt under the caller's id. Whenever a condition fails, or
//! the upstream cannot have run the call ([`Posted::NotSent`]), the call takes the full path,
//! unchanged: the lane only ever skips work, never a decision.
//!
//! What the lane sends is what rmcp's client sends: it watches the client's own requests
//! ([`Watched`], the HTTP client the worker is given) and takes from the last one the session
//! (`Mcp-Session-Id`), the headers (the revision, the credentials the server was configured
//! with) and the lifecycle keys of its `_meta` (2026-07-28). It negotiates nothing itself: until
//! the client has sent a request after its handshake, the lane takes nothing.
//!
//! The lane takes a call only when:
//! - the upstream is reached by URL by a team's server (no agent stands behind it), and the
//!   start the lane belongs to is the current one and running;
//! - the call carries no `requestState` or `inputResponses` (2026-07-28's rounds, which the full
//!   path judges);
//! - the caller's gates, under the upstream's current listing, say the tool is open, the engine
//!   agrees ([`Engine::forwards_open`]), and (from 2026-07-28, where a call's arguments may be
//!   copied into headers) the tool's schema asks for no `x-mcp-header` and its name needs no
//!   encoding in a header.
//!
//! The call goes up as the full path sends it: its name, its arguments, and its `_meta` less the
//! caller's progress token and lifecycle keys (this server's own go instead). What comes back is
//! read into rmcp's types and written out again for the caller, never passed on as bytes: the
//! answer to the lane's id (a result, `resultType` fitted to the caller's revision; an error's
//! code, message and data). On an SSE answer, a `tools/list_changed` moves the listing's epoch
//! on, as the client session would; a request the upstream makes of an agent is refused, as the
//! client session refuses it where no agent stands behind it; other notifications have no stream
//! to go to (a stateless server's). A stream that ends before the answer is taken up again from
//! its last event, as MCP asks of a client; a caller that goes away has the call cancelled
//! upstream, as the client session does.
//!
//! [`Engine::forwards_open`]: countersign_engine::Engine::forwards_open

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use countersign_core::sync::lock;
use futures_util::StreamExt;
use http::{HeaderName, HeaderValue};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientJsonRpcMessage, ClientRequest, ErrorCode,
    ErrorData, GetMeta, JsonObject, JsonRpcMessage, ProtocolVersion, RequestId, RequestMetaObject,
    ServerJsonRpcMessage, ServerNotification,
};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use rmcp::{Peer, RoleClient};
use serde_json::{Value, json};

use crate::upstream::Shared;

/// How every id the lane gives a call begins: rmcp numbers its own requests, so an id of this
/// shape is never one of the client session's.
const PREFIX: &str = "countersign-open-";

/// The per-request headers of 2026-07-28 (SEP-2243): the lane writes its own `Mcp-Method` and
/// `Mcp-Name`, and takes no call whose arguments would go into `Mcp-Param-*`.
const MCP_METHOD: &str = "mcp-method";
const MCP_NAME: &str = "mcp-name";
const MCP_PARAM: &str = "mcp-param-";

/// The key of a tool's input schema that asks for an argument to be copied into a header.
const PARAM_HEADER_KEY: &str = "x-mcp-header";

/// How many times in a row a call's answer stream is taken up again without a message coming.
const MAX_RESUMES: u32 = 5;

/// The longest wait before taking a stream up again, whatever the server asked for.
const MAX_RETRY_MS: u64 = 5_000;

/// The wait before taking a stream up again when the server asked for none (rmcp's client
/// waits as long).
const DEFAULT_RETRY_MS: u64 = 1_000;

/// An answer's stream of events, as rmcp's HTTP client reads it.
type SseEvents =
    futures_util::stream::BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>;

/// Tells the upstream a lane call is cancelled when the call is dropped before its answer (the
/// caller went away): `own` is the call's id, `None` once there is nothing to cancel.
struct Cancel<'a> {
    lane: &'a UrlLane,
    own: Option<RequestId>,
    seen: Arc<Seen>,
}

impl Drop for Cancel<'_> {
    fn drop(&mut self) {
        let Some(own) = self.own.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let cancelled = serde_json::from_value::<ClientJsonRpcMessage>(json!({
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": { "requestId": own, "reason": "the caller went away" },
        }));
        let Ok(cancelled) = cancelled else { return };
        let (client, uri, seen) = (
            self.lane.watched.client.clone(),
            self.lane.uri.clone(),
            self.seen.clone(),
        );
        runtime.spawn(async move {
            let _ = client
                .post_message(
                    uri,
                    cancelled,
                    seen.session.clone(),
                    seen.auth.clone(),
                    seen.headers.clone(),
                )
                .await;
        });
    }
}

/// What the client session sent with its last request: what the lane sends with its own. Holds
/// the upstream's credentials: never printed, logged or kept past its start.
struct Seen {
    session: Option<Arc<str>>,
    /// The bearer token rmcp's transport adds, when one is configured. None is: this desk
    /// and server send an upstream's credentials as its configured headers, below.
    auth: Option<String>,
    /// Its headers, less the per-request ones.
    headers: HashMap<HeaderName, HeaderValue>,
    /// The `io.modelcontextprotocol/` keys of its `_meta`: who the client is, on 2026-07-28.
    lifecycle: JsonObject,
}

/// The HTTP client rmcp's worker is given: reqwest's, unchanged, watching the requests it
/// sends (see the module's note). Clones share the watch and the connection pool.
#[derive(Clone)]
pub(crate) struct Watched {
    client: reqwest::Client,
    seen: Arc<Mutex<Option<Arc<Seen>>>>,
    /// The upstream answered a request of the session this start holds with an error that names
    /// no request: it no longer knows the session (see [`Watched::claim`]).
    spoiled: Arc<AtomicBool>,
}

impl Watched {
    pub(crate) fn new(client: reqwest::Client) -> Self {
        Self {
            client,
            seen: Arc::default(),
            spoiled: Arc::default(),
        }
    }

    /// Whether the upstream has shown it no longer knows this start's session: the start is
    /// then not used again, and the next request opens a new one.
    pub(crate) fn spoiled(&self) -> bool {
        self.spoiled.load(Ordering::Acquire)
    }

    /// Gives an error that names no request the id of the one request it answers. An HTTP answer
    /// to a POST of one request can only be that request's answer, but the client session
    /// matches answers by id, and would wait for this one for ever: a server that forgot the
    /// session (one started again) answers `400` with such an error, where MCP asks for `404`
    /// (which rmcp recovers from). With a session attached, the start is also marked spoiled
    /// ([`Self::spoiled`]): its session is gone, so the next request opens a new one. Nothing is
    /// sent again: whether the upstream ran anything is not known here. Any such error counts
    /// (a `500` naming no request too): what the upstream says in it is not read, and a new
    /// session costs one handshake and one listing, where keeping a forgotten one would fail
    /// every request after it.
    fn claim(&self, asked: Option<RequestId>, session: bool, posted: &mut Post) {
        let (Some(asked), Ok(StreamableHttpPostResponse::Json(JsonRpcMessage::Error(e), _))) =
            (asked, posted)
        else {
            return;
        };
        if e.id.is_some() {
            return;
        }
        e.id = Some(asked);
        if session && !self.spoiled.swap(true, Ordering::AcqRel) {
            tracing::warn!(target: "session", code = e.error.code.0, "the upstream answered a request of its session with an error for no request (it has forgotten the session?): the next request starts a new session");
        }
    }

    /// Notes what the client session sends with a request after its handshake.
    fn watch(
        &self,
        message: &ClientJsonRpcMessage,
        session: &Option<Arc<str>>,
        auth: &Option<String>,
        headers: &HashMap<HeaderName, HeaderValue>,
    ) {
        let JsonRpcMessage::Request(request) = message else {
            return;
        };
        if matches!(request.request, ClientRequest::InitializeRequest(_)) {
            return;
        }
        let own = |name: &HeaderName| {
            let name = name.as_str();
            name == MCP_METHOD || name == MCP_NAME || name.starts_with(MCP_PARAM)
        };
        let meta = serde_json::to_value(rmcp::model::GetMeta::get_meta(&request.request))
            .unwrap_or_default();
        let lifecycle = meta
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| k.starts_with("io.modelcontextprotocol/"))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        *lock(&self.seen) = Some(Arc::new(Seen {
            session: session.clone(),
            auth: auth.clone(),
            headers: headers
                .iter()
                .filter(|(k, _)| !own(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            lifecycle,
        }));
    }
}

type Post = Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>>;

/// The id of the request `message` is, if it is one.
fn asked(message: &ClientJsonRpcMessage) -> Option<RequestId> {
    match message {
        JsonRpcMessage::Request(request) => Some(request.id.clone()),
        _ => None,
    }
}

impl StreamableHttpClient for Watched {
    type Error = reqwest::Error;

    // Both go through the one with limits (reqwest's own do too), where the watch is.
    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Post {
        let limits = StreamableHttpResponseLimits::default();
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Post {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Post {
        self.watch(&message, &session_id, &auth_header, &custom_headers);
        let (asked, session) = (asked(&message), session_id.is_some());
        let mut posted = self
            .client
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await;
        self.claim(asked, session, &mut posted);
        posted
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        // The session is gone: the lane sends nothing more under it.
        *lock(&self.seen) = None;
        self.client
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<SseEvents, StreamableHttpError<Self::Error>> {
        self.client
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<SseEvents, StreamableHttpError<Self::Error>> {
        self.client
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

/// The lane of one start of an upstream reached by URL. See the module's note.
pub struct UrlLane {
    watched: Watched,
    uri: Arc<str>,
    limits: StreamableHttpResponseLimits,
    /// The client session of the same start: while its transport runs, so does the lane.
    peer: Peer<RoleClient>,
    /// The upstream speaks 2026-07-28 or later: a call carries `Mcp-Method` and `Mcp-Name`.
    headed: bool,
    shared: Arc<Shared>,
    next: AtomicU64,
}

/// How a call on the lane went.
#[derive(Debug)]
pub(crate) enum Posted {
    /// The upstream's answer, for the caller: `result` or `error`, without the JSON-RPC frame.
    Answer(Result<Value, ErrorData>),
    /// It never reached the upstream, or the upstream refused it before running anything (an
    /// expired session, credentials it no longer takes): the full path takes it.
    NotSent,
    /// Sent, and no answer came back: it may have run.
    Lost,
}

impl UrlLane {
    /// The lane of the start whose client session is `peer`, posting to `uri` with `watched`
    /// (the HTTP client that session was given), speaking `version`.
    pub(crate) fn new(
        watched: Watched,
        uri: &str,
        peer: Peer<RoleClient>,
        version: &ProtocolVersion,
        shared: Arc<Shared>,
    ) -> Self {
        Self {
            watched,
            uri: Arc::from(uri),
            limits: StreamableHttpResponseLimits::default(),
            peer,
            headed: *version >= ProtocolVersion::STANDARD_HEADERS,
            shared,
            next: AtomicU64::new(1),
        }
    }

    /// Whether the start it belongs to still runs.
    pub(crate) fn is_running(&self) -> bool {
        !self.peer.is_transport_closed() && !self.watched.spoiled()
    }

    /// Whether the upstream speaks 2026-07-28 or later, where a call's headers say what it is.
    pub(crate) fn headed(&self) -> bool {
        self.headed
    }

    /// Whether a call of `tool`, as the current listing defines it (`schema`), may take the
    /// lane at all: from 2026-07-28 a name that needs encoding in `Mcp-Name`, or a schema that
    /// copies arguments into headers, takes the full path, whose client writes those headers.
    pub(crate) fn takes_tool(&self, tool: &str, schema: Option<&Value>) -> bool {
        !self.headed || (plain_header(tool) && !schema.is_some_and(asks_for_headers))
    }

    /// Posts `params` with the caller's `meta` (a call the caller may make as open) and waits
    /// for its answer.
    pub(crate) async fn call(
        &self,
        params: &CallToolRequestParams,
        meta: &RequestMetaObject,
    ) -> Posted {
        let Some(seen) = lock(&self.watched.seen).clone() else {
            return Posted::NotSent;
        };
        let own = format!("{PREFIX}{}", self.next.fetch_add(1, Ordering::Relaxed));
        let mut up = CallToolRequestParams::new(params.name.clone());
        up.arguments = params.arguments.clone();
        let mut request = ClientRequest::CallToolRequest(CallToolRequest::new(up));
        // As the full path sends it: the caller's progress token and lifecycle keys are the
        // caller's business with this server; toward the upstream, this server is the client
        // and says so with its own. Every other key goes on.
        let mut sent = match serde_json::to_value(meta) {
            Ok(Value::Object(meta)) => meta,
            _ => JsonObject::new(),
        };
        sent.retain(|k, _| k != "progressToken" && !k.starts_with("io.modelcontextprotocol/"));
        sent.extend(seen.lifecycle.clone());
        *request.get_meta_mut() = RequestMetaObject::from(sent);
        let mut headers = seen.headers.clone();
        if self.headed {
            let (Ok(method), Ok(name)) = (
                HeaderValue::from_str("tools/call"),
                HeaderValue::from_str(&params.name),
            ) else {
                return Posted::NotSent;
            };
            headers.insert(HeaderName::from_static(MCP_METHOD), method);
            headers.insert(HeaderName::from_static(MCP_NAME), name);
        }
        let id = RequestId::String(own.into());
        let message = ClientJsonRpcMessage::request(request, id.clone());
        // Should the caller go away, the upstream is told the call is cancelled, as the client
        // session tells it (before 2026-07-28; from then, a closed stream is the cancel).
        let mut cancel = Cancel {
            lane: self,
            own: Some(id.clone()).filter(|_| !self.headed),
            seen: seen.clone(),
        };
        let mut posted = self
            .watched
            .client
            .post_message_with_response_limits(
                self.uri.clone(),
                message,
                seen.session.clone(),
                seen.auth.clone(),
                headers,
                self.limits,
            )
            .await;
        self.watched
            .claim(Some(id.clone()), seen.session.is_some(), &mut posted);
        let answer = match posted {
            Ok(StreamableHttpPostResponse::Json(message, _)) => self.answer_to(&id, message),
            Ok(StreamableHttpPostResponse::Sse(events, _)) => {
                self.answer_on_stream(&id, events, &seen).await
            }
            Err(e) if never_ran(&e) => {
                cancel.own = None;
                return Posted::NotSent;
            }
            // Accepted (no answer to a call), a kind of answer this lane does not know, or a
            // failure after the call may have reached the upstream.
            _ => None,
        };
        cancel.own = None;
        match answer {
            Some(answer) => Posted::Answer(answer),
            None => Posted::Lost,
        }
    }

    /// Reads `events` until the answer to `own`. A stream that ends first is taken up again
    /// from its last event (`Last-Event-ID`), as MCP asks of a client for servers that close
    /// their streams while a call runs: after the interval the server asked for, and at most
    /// [`MAX_RESUMES`] times in a row without a message (events that only carry an id or an
    /// interval do not count as one). A stream that cannot be taken up again ends the wait: the
    /// call is then lost, as it would be on a connection that ended.
    async fn answer_on_stream(
        &self,
        own: &RequestId,
        mut events: SseEvents,
        seen: &Seen,
    ) -> Option<Result<Value, ErrorData>> {
        let (mut last, mut retry, mut resumes) = (None, None, 0);
        loop {
            while let Some(Ok(event)) = events.next().await {
                if event.id.is_some() {
                    last = event.id.clone();
                }
                if event.retry.is_some() {
                    retry = event.retry;
                }
                let Some(data) = event.data.filter(|d| !d.is_empty()) else {
                    continue;
                };
                let Ok(message) = serde_json::from_str::<ServerJsonRpcMessage>(&data) else {
                    continue;
                };
                resumes = 0;
                if let Some(answer) = self.answer_to(own, message) {
                    return Some(answer);
                }
            }
            if resumes == MAX_RESUMES {
                return None;
            }
            resumes += 1;
            let after = last.clone()?;
            let wait = retry.unwrap_or(DEFAULT_RETRY_MS).min(MAX_RETRY_MS);
            tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
            events = self
                .watched
                .client
                .get_stream_with_max_sse_event_size(
                    self.uri.clone(),
                    seen.session.clone(),
                    Some(after),
                    seen.auth.clone(),
                    seen.headers.clone(),
                    self.limits.max_sse_event_size,
                )
                .await
                .ok()?;
        }
    }

    /// `message`'s answer to the call `own`, if it is one; on the way, a tool list that changed
    /// moves the listing's epoch on, and a request the upstream makes is refused.
    fn answer_to(
        &self,
        own: &RequestId,
        message: ServerJsonRpcMessage,
    ) -> Option<Result<Value, ErrorData>> {
        match message {
            JsonRpcMessage::Response(r) if r.id == *own => {
                Some(serde_json::to_value(&r.result).map_err(|e| {
                    ErrorData::internal_error(format!("the upstream's result: {e}"), None)
                }))
            }
            JsonRpcMessage::Error(e) if e.id.as_ref() == Some(own) => Some(Err(e.error)),
            JsonRpcMessage::Notification(n) => {
                if let ServerNotification::ToolListChangedNotification(_) = n.notification {
                    self.shared.tools_changed();
                }
                None
            }
            JsonRpcMessage::Request(request) => {
                // As the client session answers it for a server no agent stands behind.
                let refusal = ClientJsonRpcMessage::error(
                    ErrorData::new(
                        ErrorCode::METHOD_NOT_FOUND,
                        "no agent answers requests of this server",
                        None,
                    ),
                    Some(request.id),
                );
                let (client, uri) = (self.watched.client.clone(), self.uri.clone());
                let seen = lock(&self.watched.seen).clone();
                if let Some(seen) = seen {
                    tokio::spawn(async move {
                        let (session, auth) = (seen.session.clone(), seen.auth.clone());
                        let _ = client
                            .post_message(uri, refusal, session, auth, seen.headers.clone())
                            .await;
                    });
                }
                None
            }
            _ => None,
        }
    }
}

/// Whether a failed post shows that the upstream ran nothing: the connection was never made,
/// or the upstream refused the request before reading it as a call.
fn never_ran(e: &StreamableHttpError<reqwest::Error>) -> bool {
    match e {
        StreamableHttpError::Client(e) => e.is_connect(),
        StreamableHttpError::SessionExpired
        | StreamableHttpError::AuthRequired(_)
        | StreamableHttpError::InsufficientScope(_) => true,
        _ => false,
    }
}

/// Whether `name` goes into a header as it is (rmcp encodes anything else, which the lane leaves
/// to it).
fn plain_header(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:".contains(&b))
}

/// Whether a tool's input schema asks, anywhere in it, for an argument to go into a header.
fn asks_for_headers(schema: &Value) -> bool {
    match schema {
        Value::Object(object) => object
            .iter()
            .any(|(k, v)| k == PARAM_HEADER_KEY || asks_for_headers(v)),
        Value::Array(items) => items.iter().any(asks_for_headers),
        _ => false,
    }
}

/// The caller's answer: `result` (its `resultType` fitted to the caller's revision, `modern`
/// from 2026-07-28) or `error`, under `id`.
pub(crate) fn to_caller(id: &RequestId, answer: Result<Value, ErrorData>, modern: bool) -> Value {
    match answer {
        Ok(mut result) => {
            crate::agent::fit_result_type_for(&mut result, modern);
            json!({ "jsonrpc": "2.0", "id": id, "result": result })
        }
        Err(error) => json!({ "jsonrpc": "2.0", "id": id, "error": error }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::ServiceExt;
    use rmcp::model::{InitializeRequest, InitializeRequestParams};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Reads one HTTP request's head and body from `stream`: its head, lower-cased, and body.
    async fn read_request(stream: &mut tokio::net::TcpStream) -> (String, String) {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "the connection closed mid-request");
            seen.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&seen).to_lowercase();
            if let Some(end) = text.find("\r\n\r\n") {
                let length = text[..end]
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                if seen.len() >= end + 4 + length {
                    let body = String::from_utf8_lossy(&seen[end + 4..end + 4 + length]);
                    return (text[..end].to_owned(), body.into_owned());
                }
            }
        }
    }

    /// A lane to `uri` on a revision before 2026-07-28, as if its client had sent a request
    /// already, and what it needs kept alive: a client session of its own, for the lane's start
    /// (the built-in tools on a file).
    async fn lane_to(
        uri: &str,
    ) -> (
        UrlLane,
        rmcp::service::RunningService<rmcp::RoleClient, ()>,
        tempfile::TempDir,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let (read, write) = tokio::io::split(theirs);
        tokio::spawn(countersign_builtin::serve(
            dir.path().join("t.sqlite"),
            read,
            write,
        ));
        let client = ().serve(tokio::io::split(ours)).await.unwrap();
        let watched = Watched::new(reqwest::Client::new());
        *lock(&watched.seen) = Some(Arc::new(Seen {
            session: Some(Arc::from("s-1")),
            auth: None,
            headers: HashMap::new(),
            lifecycle: JsonObject::new(),
        }));
        let lane = UrlLane::new(
            watched,
            uri,
            client.peer().clone(),
            &ProtocolVersion::V_2025_11_25,
            Arc::default(),
        );
        (lane, client, dir)
    }

    /// A caller that goes away while its call runs: the upstream is told the lane's call is
    /// cancelled, in the session, as the client session tells it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_whose_caller_goes_away_is_cancelled_upstream() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri = format!("http://{}/mcp", listener.local_addr().unwrap());
        let (told, mut cancelled) = tokio::sync::mpsc::unbounded_channel();
        let (called, mut calling) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut stream, _)) = listener.accept().await {
                let (head, body) = read_request(&mut stream).await;
                if body.contains("notifications/cancelled") {
                    let _ = told.send((head, body));
                    let accepted = b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n";
                    let _ = stream.write_all(accepted).await;
                } else {
                    // The call: never answered while the test runs.
                    let _ = called.send(());
                    held.push(stream);
                }
            }
        });
        let (lane, _client, _dir) = lane_to(&uri).await;
        let params = CallToolRequestParams::new("slow");
        let meta = RequestMetaObject::default();
        tokio::select! {
            posted = lane.call(&params, &meta) => panic!("answered: {posted:?}"),
            _ = calling.recv() => {}
        }
        let (head, body) =
            tokio::time::timeout(std::time::Duration::from_secs(10), cancelled.recv())
                .await
                .expect("no cancel within 10 s")
                .unwrap();
        assert!(head.contains("mcp-session-id: s-1"), "{head}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["params"]["requestId"], "countersign-open-1", "{body}");
    }

    /// An upstream that closes the call's answer stream after its first event (MCP's polling
    /// for long calls), and answers on the stream taken up again from that event, as a server
    /// with an event store does: the lane reads the answer there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_stream_that_ends_early_is_taken_up_again_from_its_last_event() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri = format!("http://{}/mcp", listener.local_addr().unwrap());
        let heads = Arc::new(Mutex::new(Vec::<String>::new()));
        let kept = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (head, _) = read_request(&mut stream).await;
                let events = if head.starts_with("post") {
                    "id: e1\nretry: 10\ndata: \n\n".to_owned()
                } else if head.contains("last-event-id: e1") {
                    let answer = json!({"jsonrpc": "2.0", "id": "countersign-open-1",
                                        "result": {"content": [{"type": "text", "text": "polled"}]}});
                    format!("id: e2\ndata: {answer}\n\n")
                } else {
                    String::new()
                };
                lock(&kept).push(head);
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n{events}"
                );
                let _ = stream.write_all(response.as_bytes()).await;
            }
        });
        let (lane, _client, _dir) = lane_to(&uri).await;
        let posted = lane
            .call(
                &CallToolRequestParams::new("poll"),
                &RequestMetaObject::default(),
            )
            .await;
        let Posted::Answer(Ok(result)) = posted else {
            panic!("{posted:?}, after {:?}", lock(&heads));
        };
        assert_eq!(result["content"][0]["text"], "polled");
        let heads = lock(&heads).clone();
        assert_eq!(heads.len(), 2, "{heads:?}");
        assert!(
            heads[1].starts_with("get") && heads[1].contains("last-event-id: e1"),
            "{heads:?}"
        );
    }

    /// An upstream whose answer stream carries, before the call's answer, messages that try to
    /// pass for it: an answer to another id, an error to another id, a response with two ids,
    /// bytes that are not JSON, a request posing as the answer. Only the call's own answer is
    /// taken; and a plain JSON answer under another id is no answer (the call is lost, never
    /// given someone else's result).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_calls_own_answer_is_taken_from_a_hostile_upstream() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri = format!("http://{}/mcp", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (head, body) = read_request(&mut stream).await;
                let response = if body.contains("\"other\"") {
                    // The second call: a JSON answer, under an id that is not its own.
                    let answer = json!({"jsonrpc": "2.0", "id": "countersign-open-1",
                                        "result": {"content": [{"type": "text", "text": "stale"}]}});
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                        answer.to_string().len()
                    )
                } else if head.starts_with("post") && body.contains("tools/call") {
                    let result = |text: &str| json!({"content": [{"type": "text", "text": text}]});
                    let events = [
                        json!({"jsonrpc": "2.0", "id": "countersign-open-9", "result": result("another's")}).to_string(),
                        json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32000, "message": "another's"}}).to_string(),
                        format!(r#"{{"jsonrpc":"2.0","id":"countersign-open-9","id":"countersign-open-1","result":{}}}"#, result("two ids")),
                        "{not json".to_owned(),
                        json!({"jsonrpc": "2.0", "id": "countersign-open-1", "method": "tools/call",
                               "params": {"name": "posing"}}).to_string(),
                        json!({"jsonrpc": "2.0", "id": "countersign-open-1", "result": result("own")}).to_string(),
                    ];
                    let events: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n{events}"
                    )
                } else {
                    // The refusal of the posing request, and anything else.
                    "HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        .to_owned()
                };
                let _ = stream.write_all(response.as_bytes()).await;
            }
        });
        let (lane, _client, _dir) = lane_to(&uri).await;
        let meta = RequestMetaObject::default();
        let posted = lane.call(&CallToolRequestParams::new("own"), &meta).await;
        let Posted::Answer(Ok(result)) = posted else {
            panic!("{posted:?}");
        };
        assert_eq!(result["content"][0]["text"], "own", "{result}");
        let posted = lane.call(&CallToolRequestParams::new("other"), &meta).await;
        assert!(matches!(posted, Posted::Lost), "{posted:?}");
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HashMap<HeaderName, HeaderValue> {
        pairs
            .iter()
            .map(|(k, v)| (HeaderName::from_static(k), HeaderValue::from_static(v)))
            .collect()
    }

    #[test]
    fn the_lane_sends_what_the_client_last_sent_less_its_per_request_headers_and_not_its_handshake()
    {
        let watched = Watched::new(reqwest::Client::new());
        let init = ClientJsonRpcMessage::request(
            ClientRequest::InitializeRequest(InitializeRequest::new(
                InitializeRequestParams::default(),
            )),
            RequestId::Number(0),
        );
        watched.watch(
            &init,
            &None,
            &None,
            &headers(&[("authorization", "Bearer s")]),
        );
        assert!(
            lock(&watched.seen).is_none(),
            "the handshake is not a request to copy"
        );

        let list: ClientJsonRpcMessage = serde_json::from_value(json!({
            "jsonrpc": "2.0", "id": 1, "method": "tools/list",
            "params": {"_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "progressToken": 7
            }}
        }))
        .unwrap();
        watched.watch(
            &list,
            &Some(Arc::from("session-1")),
            &None,
            &headers(&[
                ("authorization", "Bearer s"),
                ("mcp-protocol-version", "2026-07-28"),
                ("mcp-method", "tools/list"),
                ("mcp-name", "x"),
                ("mcp-param-region", "eu"),
            ]),
        );
        let seen = lock(&watched.seen).clone().unwrap();
        assert_eq!(seen.session.as_deref(), Some("session-1"));
        let mut kept: Vec<&str> = seen.headers.keys().map(HeaderName::as_str).collect();
        kept.sort();
        assert_eq!(kept, ["authorization", "mcp-protocol-version"]);
        assert_eq!(
            Value::Object(seen.lifecycle.clone()),
            json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28"})
        );
    }

    #[test]
    fn an_error_naming_no_request_is_the_one_requests_answer_and_gives_its_session_up() {
        let idless = || -> Post {
            Ok(StreamableHttpPostResponse::Json(
                serde_json::from_value(json!({"jsonrpc": "2.0", "id": null,
                    "error": {"code": -32000, "message": "No valid session ID provided"}}))
                .unwrap(),
                None,
            ))
        };
        let id_of = |posted: &Post| match posted {
            Ok(StreamableHttpPostResponse::Json(JsonRpcMessage::Error(e), _)) => e.id.clone(),
            _ => panic!("not an error"),
        };
        // Without a session (2026-07-28): the request's, and nothing is given up.
        let watched = Watched::new(reqwest::Client::new());
        let mut posted = idless();
        watched.claim(Some(RequestId::Number(4)), false, &mut posted);
        assert_eq!(id_of(&posted), Some(RequestId::Number(4)));
        assert!(!watched.spoiled());
        // A notification asked nothing: left as it is.
        let mut posted = idless();
        watched.claim(None, true, &mut posted);
        assert_eq!(id_of(&posted), None);
        assert!(!watched.spoiled());
        // An error naming a request is the upstream's own to name.
        let mut named: Post = Ok(StreamableHttpPostResponse::Json(
            serde_json::from_value(json!({"jsonrpc": "2.0", "id": 9,
                "error": {"code": -32602, "message": "bad"}}))
            .unwrap(),
            None,
        ));
        watched.claim(Some(RequestId::Number(5)), true, &mut named);
        assert_eq!(id_of(&named), Some(RequestId::Number(9)));
        assert!(!watched.spoiled());
        // In a session: the request's, and the session is given up.
        let mut posted = idless();
        watched.claim(Some(RequestId::Number(6)), true, &mut posted);
        assert_eq!(id_of(&posted), Some(RequestId::Number(6)));
        assert!(watched.spoiled());
    }

    #[test]
    fn a_schema_that_copies_arguments_into_headers_or_a_name_that_needs_encoding_takes_the_full_path()
     {
        assert!(asks_for_headers(&json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"}}})));
        assert!(asks_for_headers(&json!({"allOf": [{"x-mcp-header": "A"}]})));
        assert!(!asks_for_headers(&json!({"type": "object", "properties": {
            "x": {"type": "string", "description": "x-mcp-header in a text is no key"}}})));
        assert!(plain_header("query") && plain_header("db.read_rows-2"));
        for name in [
            "",
            "caf\u{e9}",
            "a b",
            "a\r\nX-Injected: 1",
            "\u{200b}query",
        ] {
            assert!(!plain_header(name), "{name:?}");
        }
    }

    #[test]
    fn an_answer_is_rebuilt_under_the_callers_id_with_result_type_for_its_revision() {
        let id = RequestId::String("agent-7".into());
        let old = to_caller(
            &id,
            Ok(json!({"content": [], "resultType": "complete"})),
            false,
        );
        assert_eq!(
            old,
            json!({"jsonrpc": "2.0", "id": "agent-7", "result": {"content": []}})
        );
        let new = to_caller(&id, Ok(json!({"content": []})), true);
        assert_eq!(new["result"]["resultType"], "complete");
        let error = to_caller(
            &RequestId::Number(3),
            Err(ErrorData::invalid_params(
                "no such table",
                Some(json!({"t": 1})),
            )),
            false,
        );
        assert_eq!(
            error,
            json!({"jsonrpc": "2.0", "id": 3, "error": {"code": -32602, "message": "no such table", "data": {"t": 1}}})
        );
    }
}
