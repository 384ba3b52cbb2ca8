//! The open lane for an upstream reached by URL: a team's server posts an open tool's call
//! straight to the upstream, over the connections rmcp's client keeps, past both rmcp sessions,
//! as [`crate::lane`] writes one to a line-based upstream.
//!
//! Why: on a team's server every agent's reads, listings and searches are open calls, and through
//! the two rmcp sessions each one crossed five tasks on the way up and five on the way down (the
//! HTTP handler, the server session, its handler task, the client session, its HTTP worker),
//! with a parse and a serialization at each session. Measured (`serve_bench`, release, 2 cores):
//! a front server added about 350 µs to an open call that takes 710 µs directly; a bare relay of
//! the same bytes added about 165 µs. The decision needs none of that: the kept gates say the
//! tool is open under the upstream's current listing, and the engine agrees. So the call is
//! posted with rmcp's own HTTP client ([`StreamableHttpClient`], the one its worker uses, which
//! reads JSON and SSE answers within its limits), under an id of the lane's own, and the answer
//! is rebuilt under the agent's id. Whenever any condition fails, or the post never reached the
//! upstream, the call takes the full path, unchanged: the lane only ever skips work, never a
//! decision.
//!
//! What the lane sends is what rmcp's client sends: it watches the client's own requests
//! ([`Watched`], the HTTP client the worker is given) and takes from the last one the session
//! (`Mcp-Session-Id`), the headers (the revision, the credentials the server was configured
//! with) and the lifecycle keys of its `_meta` (2026-07-28). It negotiates nothing itself: until
//! the client has sent a request after its handshake, the lane takes nothing.
//!
//! The lane takes a call only when:
//! - the upstream is reached by URL, and the start it belongs to is the current one and running;
//! - the call carries nothing but a name, arguments and `_meta`;
//! - the caller's gates, under the upstream's current listing, say the tool is open, the engine
//!   agrees ([`Engine::forwards_open`]), and (from 2026-07-28, where a call's arguments may be
//!   copied into headers) the tool's schema asks for no `x-mcp-header` and its name needs no
//!   encoding in a header.
//!
//! What comes back: the answer to the lane's id (a result as sent, `resultType` fitted to the
//! caller's revision; an error's code, message and data), never copied. On an SSE answer, a
//! `tools/list_changed` moves the listing's epoch on, as the client session would; a request the
//! upstream makes of an agent is refused, as the client session refuses it for a server with no
//! agent behind it; other notifications have no stream to go to (a stateless server's).
//!
//! [`Engine::forwards_open`]: countersign_engine::Engine::forwards_open

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use countersign_core::sync::lock;
use futures_util::StreamExt;
use http::{HeaderName, HeaderValue};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientJsonRpcMessage, ClientRequest, ErrorCode,
    ErrorData, JsonObject, JsonRpcMessage, ProtocolVersion, RequestId, RequestMetaObject,
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

/// What the client session sent with its last request: what the lane sends with its own. Holds
/// the upstream's credentials: never printed, logged or kept past its start.
struct Seen {
    session: Option<Arc<str>>,
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
    spoiled: Arc<std::sync::atomic::AtomicBool>,
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
    /// sent again: whether the upstream ran anything is not known here.
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

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Post {
        self.watch(&message, &session_id, &auth_header, &custom_headers);
        let (asked, session) = (asked(&message), session_id.is_some());
        let mut posted = self
            .client
            .post_message(uri, message, session_id, auth_header, custom_headers)
            .await;
        self.claim(asked, session, &mut posted);
        posted
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
        self.watch(&message, &session_id, &auth_header, &custom_headers);
        let (asked, session) = (asked(&message), session_id.is_some());
        let mut posted = self
            .client
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        self.claim(asked, session, &mut posted);
        posted
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
    ) -> Result<
        futures_util::stream::BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>,
        StreamableHttpError<Self::Error>,
    > {
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
    ) -> Result<
        futures_util::stream::BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>,
        StreamableHttpError<Self::Error>,
    > {
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

    /// Whether the upstream has forgotten this start's session ([`Watched::spoiled`]).
    pub(crate) fn spoiled(&self) -> bool {
        self.watched.spoiled()
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

    /// Posts `params` (a call the caller may make as open) and waits for its answer.
    pub(crate) async fn call(&self, params: &CallToolRequestParams) -> Posted {
        let Some(seen) = lock(&self.watched.seen).clone() else {
            return Posted::NotSent;
        };
        let own = format!("{PREFIX}{}", self.next.fetch_add(1, Ordering::Relaxed));
        let mut up = CallToolRequestParams::new(params.name.clone());
        up.arguments = params.arguments.clone();
        // As the full path sends it: the caller's progress token and lifecycle keys are the
        // caller's business with this server; toward the upstream, this server is the client
        // and says so with its own.
        let mut meta: JsonObject = params
            .meta
            .as_ref()
            .and_then(|m| serde_json::to_value(m).ok())
            .and_then(|m| match m {
                Value::Object(m) => Some(m),
                _ => None,
            })
            .unwrap_or_default();
        meta.retain(|k, _| k != "progressToken" && !k.starts_with("io.modelcontextprotocol/"));
        meta.extend(seen.lifecycle.clone());
        if !meta.is_empty() {
            match serde_json::from_value::<RequestMetaObject>(Value::Object(meta)) {
                Ok(meta) => up.meta = Some(meta),
                Err(_) => return Posted::NotSent,
            }
        }
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
        let id = RequestId::String(own.clone().into());
        let message = ClientJsonRpcMessage::request(
            ClientRequest::CallToolRequest(CallToolRequest::new(up)),
            id.clone(),
        );
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
            Ok(StreamableHttpPostResponse::Sse(mut events, _)) => {
                let mut answer = None;
                while let Some(event) = events.next().await {
                    let Ok(event) = event else { break };
                    let Some(data) = event.data.filter(|d| !d.is_empty()) else {
                        continue;
                    };
                    let Ok(message) = serde_json::from_str::<ServerJsonRpcMessage>(&data) else {
                        continue;
                    };
                    if let Some(found) = self.answer_to(&id, message) {
                        answer = Some(found);
                        break;
                    }
                }
                answer
            }
            // Accepted (no answer to a call), or a kind of answer this lane does not know.
            Ok(_) => None,
            Err(e) if never_ran(&e) => return Posted::NotSent,
            Err(_) => None,
        };
        match answer {
            Some(answer) => Posted::Answer(answer),
            None => Posted::Lost,
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
            if let Some(object) = result.as_object_mut() {
                if modern {
                    object
                        .entry("resultType")
                        .or_insert_with(|| json!("complete"));
                } else if object.get("resultType") == Some(&json!("complete")) {
                    object.remove("resultType");
                }
            }
            json!({ "jsonrpc": "2.0", "id": id, "result": result })
        }
        Err(error) => json!({ "jsonrpc": "2.0", "id": id, "error": error }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{InitializeRequest, InitializeRequestParams};

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
