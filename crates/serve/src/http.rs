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
//! `_meta`, its `clientInfo`) changes it.
//!
//! Answers are `application/json` only: a stateless server keeps no stream, so notifications
//! the handler sends on the way (progress) are not delivered, and `GET` (a stream of the
//! server's own messages) is `405`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use countersign_core::ServerId;
use countersign_engine::Engine;
use countersign_session::reach::Upstream;
use countersign_session::router::{Routed, route};
use countersign_session::{RawTools, Session};
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
}

impl Endpoint {
    /// The tenant of `caller` on this server: the caller and the server together.
    pub fn tenant(&self, caller: &Caller) -> String {
        format!("{}@{}", caller.name(), self.server.key())
    }
}

/// An HTTP error with a JSON body saying why: `{"error": code, "message": ...}`.
pub fn refuse(status: StatusCode, code: &str, message: &str) -> Response {
    json_response(status, &json!({ "error": code, "message": message }))
}

fn json_response(status: StatusCode, value: &impl serde::Serialize) -> Response {
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
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

/// The revision a request speaks: `initialize`'s own, else the header's, else the one before
/// the header existed. `None`: the header names a revision this server does not know.
fn revision(request: &ClientRequest, headers: &HeaderMap) -> Option<ProtocolVersion> {
    if let ClientRequest::InitializeRequest(init) = request {
        return Some(init.params.protocol_version.clone());
    }
    let Some(value) = headers.get(PROTOCOL_HEADER) else {
        return Some(ProtocolVersion::V_2025_03_26);
    };
    value
        .to_str()
        .ok()
        .and_then(|v| serde_json::from_value::<ProtocolVersion>(Value::String(v.into())).ok())
        .filter(|v| ProtocolVersion::KNOWN_VERSIONS.contains(v))
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
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY).await else {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            "the message is larger than this server accepts (4 MiB)",
        );
    };
    answer(&endpoint, parts, bytes).await
}

async fn answer(endpoint: &Endpoint, parts: axum::http::request::Parts, bytes: Bytes) -> Response {
    let message = match route(&bytes) {
        Routed::Pass(message) => *message,
        // Judged and refused: the agent gets its error, nothing goes further.
        Routed::Answer(error) => return json_body(&error),
        Routed::Drop(_) => return StatusCode::ACCEPTED.into_response(),
    };
    // Notifications and responses: a stateless server has no session they could belong to.
    let ClientJsonRpcMessage::Request(mut request) = message else {
        return StatusCode::ACCEPTED.into_response();
    };
    let Some(version) = revision(&request.request, &parts.headers) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "unsupported_protocol_version",
            "the MCP-Protocol-Version header names a revision this server does not speak",
        );
    };
    let Some(caller) = parts.extensions.get::<Caller>().cloned() else {
        // The layer that names the caller did not run: refuse rather than guess.
        return refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the caller is unknown",
        );
    };
    let tenant = endpoint.tenant(&caller);
    if let Err(stopped) = endpoint.engine.attach(&tenant, endpoint.server.clone()) {
        let error = json!({
            "jsonrpc": "2.0",
            "id": request.id,
            "error": { "code": -32603, "message": stopped.message(), "data": { "code": stopped.code() } },
        });
        return json_body(&error);
    }
    let session = Session::new(
        endpoint.upstream.clone(),
        endpoint.engine.clone(),
        tenant,
        endpoint.wait,
    );
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
        assert_eq!(
            revision(&ping, &headers(&[])),
            Some(ProtocolVersion::V_2025_03_26)
        );
        assert_eq!(
            revision(&ping, &headers(&[(PROTOCOL_HEADER, "2025-11-25")])),
            Some(ProtocolVersion::V_2025_11_25)
        );
        assert_eq!(
            revision(&ping, &headers(&[(PROTOCOL_HEADER, "1999-01-01")])),
            None
        );
    }
}
