//! The one MCP endpoint: `POST /mcp`, each request answered on its own (streamable HTTP,
//! stateless).
//!
//! Why not rmcp's `StreamableHttpService`: it hosts only a typed `ServerHandler`, whose tool
//! listings drop every field rmcp does not model, and it parses the body leniently. The desk's
//! sessions keep tools raw ([`RawTools`]) and judge every byte strictly first ([`route`]), and a
//! server for teams must not be the weaker door. So this is rmcp's own stateless path, built from
//! its public pieces (`OneshotTransport`, `serve_directly_with_ct`), with the router in front: a
//! message the router refuses gets its JSON-RPC error and reaches neither the engine nor the
//! upstream.
//!
//! Each request gets a fresh [`Session`] for its caller (never the last caller's): the tenant is
//! the caller the host authenticated ([`Caller`]) and the server, together, so an approval bound
//! to one never verifies for another, nor on another server. Nothing in the message (its
//! `_meta`, its `clientInfo`) changes it. What the caller's last listing decided is kept for it
//! ([`Gates`]) while the upstream's listing it was decided from is fresh (a second), so a call
//! does not class the upstream's tools and read their pins again every time. An open tool's
//! call to an upstream reached by URL skips the rmcp sessions altogether when the kept gates and
//! the engine say it may (the session crate's open lane for URL upstreams).
//!
//! Answers are `application/json` only: a stateless server keeps no stream, so notifications
//! the handler sends on the way (progress) are not delivered, and `GET` (a stream of the
//! server's own messages) is `405`.

use countersign_core::Tenant;
use countersign_core::sync::lock;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use countersign_core::ServerId;
use countersign_engine::{Attached, Engine, MAX_ATTACHED, Stopped};
use countersign_router::{NOTIFICATIONS, Routed, route};
use countersign_session::reach::Upstream;
use countersign_session::{Gates, RawTools, Session};
use rmcp::RoleServer;
use rmcp::model::{
    ClientCapabilities, ClientJsonRpcMessage, ClientRequest, GetExtensions, Implementation,
    InitializeRequestParams, ProtocolVersion, ServerJsonRpcMessage,
};
use rmcp::service::serve_directly_with_ct;
use rmcp::transport::OneshotTransport;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// The largest request body accepted, in bytes.
pub const MAX_BODY: usize = 4 * 1024 * 1024;

/// How long a client has to send a request's body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// The most requests answered at once (each may hold a call to the upstream): more are told to
/// come back, rather than queue without bound.
pub const MAX_IN_FLIGHT: usize = 256;

/// Methods that need a session a stateless server does not keep: what they start could never
/// be delivered, and they would change the shared upstream for every caller.
pub const SESSION_METHODS: &[&str] = &[
    "resources/subscribe",
    "resources/unsubscribe",
    "logging/setLevel",
];

/// The headers naming the request's method and tool, which proxies may route on (SEP-2243).
pub const METHOD_HEADER: &str = "mcp-method";

/// See [`METHOD_HEADER`].
pub const NAME_HEADER: &str = "mcp-name";

/// The header naming the protocol revision of a request after `initialize`.
pub const PROTOCOL_HEADER: &str = "mcp-protocol-version";

/// Who is calling, as the server established it (never as the message says): put in the
/// request's extensions by the authentication layer ([`crate::auth::layer`]) in front of the
/// endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(String);

impl Caller {
    /// A caller nobody authenticated: every request of a server started `--unauthenticated`
    /// (loopback only) is this one caller.
    pub fn unauthenticated() -> Self {
        Caller("unauthenticated".into())
    }

    /// A caller the server authenticated, by its name (`jwt:ISSUER#SUBJECT`, `key:NAME`).
    pub fn authenticated(name: String) -> Self {
        Caller(name)
    }

    /// Its name, as history shows it.
    pub fn name(&self) -> &str {
        &self.0
    }
}

/// What the endpoint serves: one engine, one upstream.
pub struct Endpoint {
    /// The authority.
    pub engine: Engine,
    /// The upstream, shared by every caller.
    pub upstream: Arc<Upstream>,
    /// Its identity.
    pub server: ServerId,
    /// How long a preflight waits for a person.
    pub wait: Duration,
    /// Turns to answer a request ([`MAX_IN_FLIGHT`]).
    pub in_flight: Arc<tokio::sync::Semaphore>,
    /// What each caller's last listing decided, kept across its requests.
    pub gates: KeptGates,
}

/// What each caller's last listing decided ([`Gates`]), kept across its requests: a call then
/// neither classes the upstream's listing nor reads its pins again while that listing is fresh.
#[derive(Default)]
pub struct KeptGates(std::sync::Mutex<HashMap<Tenant, Arc<Gates>>>);

impl KeptGates {
    /// Attaches `tenant` to the engine (`attach`, [`Engine::attach`]) and answers the gates kept
    /// for it, made anew when the engine made its connection anew, since that connection knows
    /// no tools yet. Both under one lock: a request that finds the caller attached again never
    /// takes the gates of the connection another request's attach has just replaced.
    ///
    /// At most [`MAX_ATTACHED`] callers' gates are kept, as the engine keeps at most that many
    /// connections: past it, one is dropped, and that caller's next call lists again.
    fn attach(
        &self,
        tenant: &Tenant,
        attach: impl FnOnce() -> Result<Attached, Stopped>,
    ) -> Result<Arc<Gates>, Stopped> {
        let mut kept = lock(&self.0);
        let attached = attach()?;
        if attached == Attached::Again
            && let Some(gates) = kept.get(tenant)
        {
            return Ok(gates.clone());
        }
        if kept.len() >= MAX_ATTACHED
            && !kept.contains_key(tenant)
            && let Some(any) = kept.keys().next().cloned()
        {
            kept.remove(&any);
        }
        let gates = Gates::across_requests();
        kept.insert(tenant.clone(), gates.clone());
        Ok(gates)
    }
}

impl Endpoint {
    /// The tenant of `caller` on this server: [`tenant_of`].
    pub fn tenant(&self, caller: &Caller) -> Tenant {
        tenant_of(caller, &self.server)
    }
}

/// The tenant of `caller` on `server`: the caller and the server together
/// ([`Tenant::team`], which never spells out a server's command line or URL).
pub fn tenant_of(caller: &Caller, server: &ServerId) -> Tenant {
    Tenant::team(caller.name(), server)
}

/// An HTTP error with a JSON body saying why: `{"error": code, "message": ...}`.
pub fn refuse(status: StatusCode, code: &str, message: &str) -> Response {
    json_response(status, &json!({ "error": code, "message": message }))
}

pub(crate) fn json_response(status: StatusCode, value: &impl serde::Serialize) -> Response {
    // Serializing a JSON-RPC message or a Value cannot fail; if it ever did, say so plainly.
    let body = serde_json::to_vec(value).unwrap_or_else(|_| {
        br#"{"error":"internal","message":"the answer could not be written"}"#.to_vec()
    });
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

/// `200` with `value` as JSON.
pub fn json_ok(value: &impl serde::Serialize) -> Response {
    json_response(StatusCode::OK, value)
}

fn json_body(value: &impl serde::Serialize) -> Response {
    json_response(StatusCode::OK, value)
}

/// Whether the client accepts a JSON answer (the only kind this server sends).
fn accepts_json(headers: &HeaderMap) -> bool {
    let accept: Vec<&str> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.split(';').next().unwrap_or("").trim())
        .collect();
    accept.is_empty()
        || accept.iter().any(|m| {
            m.eq_ignore_ascii_case("application/json")
                || m.eq_ignore_ascii_case("application/*")
                || *m == "*/*"
        })
}

fn is_json(headers: &HeaderMap) -> bool {
    let mut all = headers.get_all(header::CONTENT_TYPE).iter();
    let (Some(one), None) = (all.next(), all.next()) else {
        // None, or two that could be read either way.
        return false;
    };
    one.to_str()
        .ok()
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

/// The one value of header `name`: `Ok(None)` without it, `Err` when it is there twice or is
/// not text.
fn single<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, ()> {
    let mut all = headers.get_all(name).iter();
    match (all.next(), all.next()) {
        (None, _) => Ok(None),
        (Some(one), None) => one.to_str().map(Some).map_err(|_| ()),
        (Some(_), Some(_)) => Err(()),
    }
}

/// Whether the routing headers, where a client sent them, say what the message says.
fn headers_agree(request: &ClientRequest, headers: &HeaderMap) -> bool {
    let method = request.method();
    let name = match request {
        ClientRequest::CallToolRequest(call) => Some(call.params.name.as_ref()),
        ClientRequest::GetPromptRequest(get) => Some(get.params.name.as_str()),
        _ => None,
    };
    let agrees = |header: &str, expected: Option<&str>| match single(headers, header) {
        Ok(None) => true,
        Ok(Some(value)) => Some(value) == expected,
        Err(()) => false,
    };
    agrees(METHOD_HEADER, Some(method)) && agrees(NAME_HEADER, name)
}

/// The revision a request speaks: `initialize`'s own, else the header's, else the one before
/// the header existed. `None`: the header is there twice, or names a revision this server does
/// not speak (`spoken`: never newer than its upstream's).
fn revision(
    request: &ClientRequest,
    headers: &HeaderMap,
    spoken: &[ProtocolVersion],
) -> Option<ProtocolVersion> {
    if let ClientRequest::InitializeRequest(init) = request {
        return Some(init.params.protocol_version.clone());
    }
    let Ok(value) = single(headers, PROTOCOL_HEADER) else {
        return None;
    };
    let Some(value) = value else {
        return Some(ProtocolVersion::V_2025_03_26);
    };
    serde_json::from_value::<ProtocolVersion>(Value::String(value.into()))
        .ok()
        .filter(|v| spoken.contains(v))
}

/// `GET` and `DELETE /mcp`: a stateless server keeps no stream and no session.
pub async fn not_here() -> Response {
    let mut r = refuse(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this server is stateless: POST one JSON-RPC message at a time",
    );
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    r
}

/// The endpoints of a servers file's upstreams, by name.
pub type Named = Arc<std::collections::HashMap<String, Arc<Endpoint>>>;

/// `POST /mcp/<name>`: [`post`] to the endpoint of the servers file's `name`.
pub async fn post_named(
    State(named): State<Named>,
    axum::extract::Path(name): axum::extract::Path<String>,
    request: Request,
) -> Response {
    match named.get(&name) {
        Some(endpoint) => post(State(endpoint.clone()), request).await,
        None => refuse(
            StatusCode::NOT_FOUND,
            "no_such_server",
            "this server serves no upstream of that name",
        ),
    }
}

/// `POST /mcp`: one JSON-RPC message in, its answer out.
pub async fn post(State(endpoint): State<Arc<Endpoint>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    if !accepts_json(&parts.headers) {
        return refuse(
            StatusCode::NOT_ACCEPTABLE,
            "not_acceptable",
            "this server answers with application/json: accept it",
        );
    }
    if !is_json(&parts.headers) {
        return refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send one JSON-RPC message as application/json",
        );
    }
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY)).await
    {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => {
            return refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "the message is larger than this server accepts (4 MiB)",
            );
        }
        Err(_) => {
            return refuse(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                "the message did not arrive in time",
            );
        }
    };
    let Ok(_turn) = endpoint.in_flight.clone().try_acquire_owned() else {
        let mut busy = refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            "this server is answering as many requests as it takes: call again shortly",
        );
        busy.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return busy;
    };
    answer(&endpoint, parts, bytes).await
}

/// The answer to a message the router let no further (`why`) that needs no JSON-RPC answer: a
/// notification or a response. The streamable HTTP transport keeps `202 Accepted` for input the
/// server accepts, so only a notification (a method under `notifications/`, known or not: a
/// notification is never answered, and one this server does not know is ignored) gets it. A
/// request's method sent without an id (`tools/call`, `ping`, `initialize`...), which its sender
/// waits on and which can never be answered, is `400` with a JSON-RPC error without an id; so is
/// a notification of a method this server knows in the wrong shape, and a response, which a
/// stateless server never asked for (it sends no requests of its own).
fn not_a_request(bytes: &[u8], why: &str) -> Response {
    // The router parsed it strictly before it dropped it: this reads the same object again.
    let value: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
    let message = match value.get("method").and_then(Value::as_str) {
        // One it knows, dropped: its params are not of the shape MCP defines.
        Some(method) if NOTIFICATIONS.contains(&method) => {
            format!("notification `{method}` has the wrong shape ({why})")
        }
        Some(method) if method.starts_with(NOTIFICATION_PREFIX) => {
            return StatusCode::ACCEPTED.into_response();
        }
        Some(method) => format!(
            "`{method}` is a request: send it with an id to be answered. Nothing was executed."
        ),
        None => format!(
            "this server sends no requests of its own, so it takes no responses ({why}). \
             Nothing was executed."
        ),
    };
    bad_notification(&message)
}

/// What every method of a notification begins with.
const NOTIFICATION_PREFIX: &str = "notifications/";

/// `400` with a JSON-RPC error that has no id (there is none to answer): invalid request.
fn bad_notification(message: &str) -> Response {
    json_response(
        StatusCode::BAD_REQUEST,
        &json!({
            "jsonrpc": "2.0",
            "error": { "code": -32600, "message": message },
        }),
    )
}

async fn answer(endpoint: &Endpoint, parts: axum::http::request::Parts, bytes: Bytes) -> Response {
    let message = match route(&bytes) {
        Routed::Pass(message) => *message,
        // Judged and refused: the agent gets its error, nothing goes further.
        Routed::Answer(error) => return json_body(&error),
        Routed::Drop(why) => return not_a_request(&bytes, &why),
    };
    let mut request = match message {
        ClientJsonRpcMessage::Request(request) => request,
        // A notification: accepted, and it goes nowhere (a stateless server has no session it
        // could belong to).
        ClientJsonRpcMessage::Notification(_) => return StatusCode::ACCEPTED.into_response(),
        // A response: to nothing, since this server never asks the client anything.
        _ => return not_a_request(&bytes, "a response"),
    };
    let spoken = ProtocolVersion::known_up_to(&endpoint.upstream.info().protocol_version);
    let Some(version) = revision(&request.request, &parts.headers, spoken) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "unsupported_protocol_version",
            "the MCP-Protocol-Version header names a revision this server does not speak (or \
             is sent twice)",
        );
    };
    if !headers_agree(&request.request, &parts.headers) {
        return refuse(
            StatusCode::BAD_REQUEST,
            "header_mismatch",
            "the Mcp-Method or Mcp-Name header does not say what the message says",
        );
    }
    if SESSION_METHODS.contains(&request.request.method()) {
        let error = json!({
            "jsonrpc": "2.0",
            "id": request.id,
            "error": { "code": -32601, "message": "this server is stateless: it keeps no subscription or log level for a caller" },
        });
        return json_body(&error);
    }
    let Some(caller) = parts.extensions.get::<Caller>().cloned() else {
        // The layer that names the caller did not run: refuse rather than guess.
        return refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the caller is unknown",
        );
    };
    let tenant = endpoint.tenant(&caller);
    let attached = endpoint.gates.attach(&tenant, || {
        endpoint.engine.attach(&tenant, endpoint.server.clone())
    });
    let gates = match attached {
        Ok(gates) => gates,
        Err(stopped) => {
            let error = json!({
                "jsonrpc": "2.0",
                "id": request.id,
                "error": { "code": -32603, "message": stopped.message(), "data": { "code": stopped.code() } },
            });
            return json_body(&error);
        }
    };
    let session = Session::with_gates(
        endpoint.upstream.clone(),
        endpoint.engine.clone(),
        tenant,
        endpoint.wait,
        gates,
    );
    // An open tool's call, when the open lane for URL upstreams may take it: posted straight
    // to the upstream, past both rmcp sessions (see the session crate's `url_lane`).
    if let Some(answer) = session
        .open_by_url_lane(&request.id, &request.request, &version)
        .await
    {
        return json_body(&answer);
    }
    let peer =
        InitializeRequestParams::new(ClientCapabilities::default(), Implementation::default())
            .with_protocol_version(version);
    request.request.extensions_mut().insert(parts);
    let (transport, mut answers) =
        OneshotTransport::<RoleServer>::new(ClientJsonRpcMessage::Request(request));
    // The handler ends when its caller goes away: this future is dropped with the connection.
    let ct = CancellationToken::new();
    let _cancel_on_drop = ct.clone().drop_guard();
    let running = serve_directly_with_ct(RawTools(session), transport, Some(peer), ct);
    tokio::spawn(async move {
        let _ = running.waiting().await;
    });
    while let Some(message) = answers.recv().await {
        match message {
            ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_) => {
                return json_body(&message);
            }
            // Progress and other notifications: no stream to carry them (see the module's note).
            _ => continue,
        }
    }
    refuse(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "the request ended without an answer",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn a_tenant_never_carries_the_upstreams_command_line_or_url() {
        let tenant = |server: ServerId| {
            tenant_of(&Caller::authenticated("key:ci".into()), &server).to_string()
        };
        assert_eq!(
            tenant(ServerId::Registered("github".into())),
            "key:ci@server:github"
        );
        let url = tenant(ServerId::Url(
            "https://user:hunter2@api.example.com/mcp?token=t0k".into(),
        ));
        assert!(
            url.starts_with("key:ci@upstream:") && !url.contains("hunter2") && !url.contains("t0k"),
            "{url}"
        );
        let command = tenant(ServerId::Command("srv --token s3cret".into()));
        assert!(!command.contains("s3cret"), "{command}");
    }

    #[test]
    fn a_callers_gates_are_kept_across_its_requests_until_the_engine_attaches_it_anew() {
        let kept = KeptGates::default();
        let caller = |n: usize| {
            tenant_of(
                &Caller::authenticated(format!("key:agent-{n}")),
                &ServerId::Registered("db".into()),
            )
        };
        let of = |n: usize, attached: Attached| kept.attach(&caller(n), || Ok(attached)).unwrap();
        let first = of(0, Attached::Anew);
        assert!(Arc::ptr_eq(&first, &of(0, Attached::Again)));
        assert!(!Arc::ptr_eq(&first, &of(1, Attached::Again)));
        // The engine forgot the caller and made its connection again: nothing kept holds.
        let anew = of(0, Attached::Anew);
        assert!(!Arc::ptr_eq(&first, &anew));
        assert!(Arc::ptr_eq(&anew, &of(0, Attached::Again)));
        // An engine that refuses to attach: its refusal, and nothing kept changes.
        let refused = kept.attach(&caller(0), || {
            Err(Stopped::Failed {
                code: countersign_engine::ErrorCode::Busy,
                message: "full".into(),
            })
        });
        assert!(refused.is_err());
        assert!(Arc::ptr_eq(&anew, &of(0, Attached::Again)));
        // Never more callers' than the engine keeps connections.
        for n in 0..MAX_ATTACHED + 10 {
            of(n, Attached::Anew);
        }
        assert_eq!(lock(&kept.0).len(), MAX_ATTACHED);
    }

    #[test]
    fn json_must_be_accepted_and_sent() {
        assert!(accepts_json(&headers(&[(
            "accept",
            "application/json, text/event-stream"
        )])));
        assert!(accepts_json(&headers(&[("accept", "*/*")])));
        assert!(accepts_json(&headers(&[])));
        assert!(!accepts_json(&headers(&[("accept", "text/event-stream")])));
        assert!(is_json(&headers(&[(
            "content-type",
            "application/json; charset=utf-8"
        )])));
        assert!(!is_json(&headers(&[("content-type", "text/plain")])));
        assert!(!is_json(&headers(&[])));
    }

    #[test]
    fn an_unknown_revision_in_the_header_is_refused_and_none_is_the_oldest() {
        let ping = ClientRequest::PingRequest(Default::default());
        let spoken = ProtocolVersion::known_up_to(&ProtocolVersion::V_2025_11_25);
        let rev = |h: &[(&'static str, &'static str)]| revision(&ping, &headers(h), spoken);
        assert_eq!(rev(&[]), Some(ProtocolVersion::V_2025_03_26));
        assert_eq!(
            rev(&[(PROTOCOL_HEADER, "2025-11-25")]),
            Some(ProtocolVersion::V_2025_11_25)
        );
        assert_eq!(rev(&[(PROTOCOL_HEADER, "1999-01-01")]), None);
        // Newer than the upstream speaks: never promised.
        assert_eq!(rev(&[(PROTOCOL_HEADER, "2026-07-28")]), None);
        // Twice, even the same: which one a proxy read is anyone's guess.
        assert_eq!(
            rev(&[
                (PROTOCOL_HEADER, "2025-11-25"),
                (PROTOCOL_HEADER, "2025-11-25")
            ]),
            None
        );
    }

    #[test]
    fn routing_headers_must_say_what_the_message_says() {
        let call: ClientRequest = serde_json::from_value(json!({
            "method": "tools/call", "params": {"name": "write", "arguments": {}}
        }))
        .unwrap();
        assert!(headers_agree(&call, &headers(&[])));
        assert!(headers_agree(
            &call,
            &headers(&[(METHOD_HEADER, "tools/call"), (NAME_HEADER, "write")])
        ));
        assert!(!headers_agree(&call, &headers(&[(METHOD_HEADER, "ping")])));
        assert!(!headers_agree(&call, &headers(&[(NAME_HEADER, "read")])));
        assert!(!headers_agree(
            &call,
            &headers(&[(NAME_HEADER, "write"), (NAME_HEADER, "write")])
        ));
        assert!(!is_json(&headers(&[
            ("content-type", "application/json"),
            ("content-type", "text/plain")
        ])));
    }
}
