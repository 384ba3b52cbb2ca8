//! The agent's side of a session: every message the agent sends is judged here before rmcp sees
//! it, and only what this module lets through ever becomes a typed message.
//!
//! Why a layer of our own under rmcp: rmcp parses leniently by design (a `tools/call` whose params
//! fail its typed parse falls back to a custom request, a duplicate key silently keeps the last
//! value), and a lenient parse is a way around the click. So each message is parsed strictly
//! (duplicate keys anywhere, nesting, size and unsafe integers refused), batches are refused, the
//! method must be on an allow-list, and a known method's parameters must take rmcp's typed shape
//! (a fall-back to a custom message means the shape was wrong). A request that fails gets a
//! JSON-RPC error; a notification that fails is dropped; neither reaches the session, so nothing
//! of it reaches the upstream. What the session later sends upstream is serialized from its own
//! typed values, never from these bytes. One shape skips rmcp's parse, for speed only: a
//! `tools/call` with nothing but a name, arguments and `_meta` (every open call), which is typed
//! here directly into what rmcp's parse would give (see `plain_call`; tests hold the two equal).
//!
//! A crate of its own so that the one judge of an agent's bytes is the same for every door (the
//! desk's sessions, `countersign serve`'s endpoint) and links nothing but the protocol's types:
//! no engine, store or HTTP client. Its fuzz targets (fuzz/) build it alone, in minutes.

#![forbid(unsafe_code)]

use countersign_core::canonical;
use countersign_wire::Frame;
use rmcp::RoleServer;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientJsonRpcMessage, ClientNotification,
    ClientRequest, JsonRpcMessage, JsonRpcRequest, RequestId, RequestMetaObject,
};
use rmcp::transport::Transport;
use serde::Deserialize as _;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// Requests an agent may send.
pub const REQUESTS: &[&str] = &[
    "initialize",
    "server/discover",
    "ping",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
];

/// Notifications an agent may send.
pub const NOTIFICATIONS: &[&str] = &[
    "notifications/initialized",
    "notifications/cancelled",
    "notifications/progress",
    "notifications/roots/list_changed",
];

/// JSON-RPC's error codes used here.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

/// What became of one message from the agent.
#[derive(Debug)]
pub enum Routed {
    /// Let through, typed.
    Pass(Box<ClientJsonRpcMessage>),
    /// Refused: answer the agent with this JSON-RPC error.
    Answer(Value),
    /// Refused without an answer (a notification, or a response to nothing we can name).
    Drop(String),
}

fn error(id: Value, code: i64, message: impl Into<String>) -> Routed {
    Routed::Answer(json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code, "message": message.into()},
    }))
}

/// A usable JSON-RPC id: a string or an integer. Anything else is answered with a null id.
fn valid_id(id: &Value) -> bool {
    id.is_string() || id.is_i64() || id.is_u64()
}

/// Judges one message from the agent.
pub fn route(bytes: &[u8]) -> Routed {
    route_with(bytes, Typing::Plain)
}

/// Which parse types a `tools/call` of the plain shape (see [`plain_call`]): the tests route
/// each message both ways and compare.
#[derive(Clone, Copy, PartialEq)]
enum Typing {
    /// Built directly: the desk's way.
    Plain,
    /// rmcp's parse, as for every other message.
    #[cfg(test)]
    Rmcp,
}

fn route_with(bytes: &[u8], typing: Typing) -> Routed {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return error(Value::Null, PARSE_ERROR, "the message is not UTF-8");
    };
    let value = match canonical::parse_strict(text) {
        Ok(value) => value,
        Err(canonical::CanonicalError::DuplicateKey(key)) => {
            // The id is reported only when it can be read unambiguously.
            let id = serde_json::from_str::<Value>(text)
                .ok()
                .and_then(|v| v.get("id").cloned())
                .filter(valid_id)
                .filter(|_| key != "id")
                .unwrap_or(Value::Null);
            return error(
                id,
                INVALID_REQUEST,
                format!("duplicate key {key:?}: a message must say each thing once"),
            );
        }
        Err(e) => {
            return error(
                Value::Null,
                PARSE_ERROR,
                format!("not acceptable JSON: {e}"),
            );
        }
    };
    let Value::Object(object) = &value else {
        let why = if value.is_array() {
            "batches are not accepted: send one message at a time"
        } else {
            "a message must be a JSON object"
        };
        return error(Value::Null, INVALID_REQUEST, why);
    };
    let id = object.get("id");
    if object.get("jsonrpc") != Some(&json!("2.0")) {
        let id = id.filter(|i| valid_id(i)).cloned().unwrap_or(Value::Null);
        return error(id, INVALID_REQUEST, "jsonrpc must be \"2.0\"");
    }
    if let Some(id) = id
        && !valid_id(id)
    {
        return error(
            Value::Null,
            INVALID_REQUEST,
            "an id must be a string or an integer",
        );
    }
    let method = match object.get("method") {
        None => return response(value),
        Some(Value::String(m)) => m.clone(),
        Some(_) => {
            let id = id.cloned().unwrap_or(Value::Null);
            return error(id, INVALID_REQUEST, "method must be a string");
        }
    };
    match id.cloned() {
        Some(id) => request(value, id, &method, typing),
        None => notification(value, &method),
    }
}

fn request(value: Value, id: Value, method: &str, typing: Typing) -> Routed {
    if !REQUESTS.contains(&method) {
        return error(
            id,
            METHOD_NOT_FOUND,
            format!("Countersign does not pass on `{method}`"),
        );
    }
    if let Some(params) = value.get("params")
        && !params.is_object()
    {
        return error(id, INVALID_PARAMS, "params must be an object");
    }
    if method == "tools/call" {
        // Checked here as well as by the typed parse below, so the refusal says what is wrong.
        let params = value.get("params");
        let field = |name: &str| params.and_then(|p| p.get(name));
        if !field("name").is_some_and(Value::is_string) {
            return error(id, INVALID_PARAMS, "tools/call: name must be a string");
        }
        if field("arguments").is_some_and(|a| !a.is_object()) {
            return error(
                id,
                INVALID_PARAMS,
                "tools/call: arguments must be an object",
            );
        }
        if field("requestState").is_some_and(|s| !s.is_string()) {
            return error(
                id,
                INVALID_PARAMS,
                "tools/call: requestState must be a string",
            );
        }
    }
    let value = if method == "tools/call" && typing == Typing::Plain {
        match plain_call(value) {
            Ok(call) => return Routed::Pass(Box::new(call)),
            Err(value) => value,
        }
    } else {
        value
    };
    match serde_json::from_value::<ClientJsonRpcMessage>(value) {
        Ok(JsonRpcMessage::Request(r)) if !matches!(r.request, ClientRequest::CustomRequest(_)) => {
            Routed::Pass(Box::new(JsonRpcMessage::Request(r)))
        }
        // rmcp falls back to a custom request when the params do not fit the method's type.
        _ => error(
            id,
            INVALID_PARAMS,
            format!("{method}: the params do not have the shape MCP defines"),
        ),
    }
}

/// A `tools/call` of the plain shape, typed without rmcp's parse; the message back, untouched,
/// when it has any other shape (which then takes rmcp's parse, as every other request does).
///
/// Why: this is every open call's shape, and rmcp's parse of a message (a buffered, untagged
/// try of each message kind and of each request type) is most of the desk's own work on an open
/// call: 4.5 µs of 6 when its code is in the CPU's caches, 28 µs when it is not, as it is not
/// when an agent calls after a pause. Plain means exactly: the members `jsonrpc`, `id`, `method`
/// and `params` and no other; `params` with a string `name`, and nothing else but an object
/// `arguments` and an object `_meta`; an id rmcp takes. [`route`] has checked the rest (strict
/// JSON, `jsonrpc`, the method). For such a message rmcp's parse always succeeds, and builds what
/// this builds: the name and arguments as sent, no other parameter, `_meta` in the request's
/// extensions (tests compare the two on generated messages and on every hostile case).
fn plain_call(value: Value) -> Result<ClientJsonRpcMessage, Value> {
    let plain_params = |params: &serde_json::Map<String, Value>| {
        params.get("name").is_some_and(Value::is_string)
            && params.iter().all(|(key, v)| match key.as_str() {
                "name" => true,
                "arguments" | "_meta" => v.is_object(),
                _ => false,
            })
    };
    let id = match &value {
        Value::Object(message)
            if message.len() == 4
                && message.get("jsonrpc").is_some()
                && message.get("method").is_some()
                && message
                    .get("params")
                    .and_then(Value::as_object)
                    .is_some_and(plain_params) =>
        {
            match message.get("id").map(RequestId::deserialize) {
                Some(Ok(id)) => id,
                _ => return Err(value),
            }
        }
        _ => return Err(value),
    };
    let Value::Object(mut message) = value else {
        unreachable!("matched as an object above");
    };
    let Some(Value::Object(mut params)) = message.remove("params") else {
        unreachable!("matched as an object above");
    };
    let take_object =
        |params: &mut serde_json::Map<String, Value>, key: &str| match params.remove(key) {
            Some(Value::Object(object)) => Some(object),
            _ => None,
        };
    let arguments = take_object(&mut params, "arguments");
    let meta = take_object(&mut params, "_meta");
    let Some(Value::String(name)) = params.remove("name") else {
        unreachable!("matched as a string above");
    };
    let mut typed = CallToolRequestParams::new(name);
    typed.arguments = arguments;
    let mut request = CallToolRequest::new(typed);
    if let Some(meta) = meta {
        request.extensions.insert(RequestMetaObject::from(meta));
    }
    Ok(JsonRpcMessage::Request(JsonRpcRequest::new(
        id,
        ClientRequest::CallToolRequest(request),
    )))
}

fn notification(value: Value, method: &str) -> Routed {
    if !NOTIFICATIONS.contains(&method) {
        return Routed::Drop(format!("notification `{method}` is not passed on"));
    }
    match serde_json::from_value::<ClientJsonRpcMessage>(value) {
        Ok(JsonRpcMessage::Notification(n))
            if !matches!(n.notification, ClientNotification::CustomNotification(_)) =>
        {
            Routed::Pass(Box::new(JsonRpcMessage::Notification(n)))
        }
        _ => Routed::Drop(format!("notification `{method}` has the wrong shape")),
    }
}

/// A response or error from the agent, to a request the session sent it (roots, sampling,
/// elicitation). rmcp matches it to the waiting request by id and ignores unknown ids.
fn response(value: Value) -> Routed {
    let has = |k: &str| value.get(k).is_some();
    if has("id") && has("result") != has("error") {
        match serde_json::from_value::<ClientJsonRpcMessage>(value) {
            Ok(m @ (JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_))) => {
                return Routed::Pass(Box::new(m));
            }
            _ => return Routed::Drop("a response of the wrong shape".into()),
        }
    }
    Routed::Drop("neither a request, a notification nor a response".into())
}

/// Judges one message from the agent with [`route`]: what passes, typed; a refusal is answered
/// on `outbound` (a request) or logged (a notification), and `None` is returned.
pub async fn judge(bytes: &[u8], outbound: &mpsc::Sender<Frame>) -> Option<ClientJsonRpcMessage> {
    match route(bytes) {
        Routed::Pass(message) => Some(*message),
        Routed::Answer(reply) => {
            tracing::warn!(target: "router", "refused a message from the agent: {}", reply["error"]["message"]);
            let bytes = serde_json::to_vec(&reply).expect("a JSON value serializes");
            let _ = outbound.send(Frame::Mcp(bytes)).await;
            None
        }
        Routed::Drop(why) => {
            tracing::warn!(target: "router", "dropped a message from the agent: {why}");
            None
        }
    }
}

/// The agent's side of a session as an rmcp transport: messages [`judge`] let through (the
/// connection's reader judges each frame as it arrives, see `socket`), typed; the session's
/// messages out, as `M` frames.
pub struct AgentTransport {
    inbound: mpsc::Receiver<ClientJsonRpcMessage>,
    outbound: mpsc::Sender<Frame>,
    replayed: Option<ClientJsonRpcMessage>,
}

impl AgentTransport {
    /// A transport reading the agent's judged messages from `inbound` and writing to `outbound`.
    pub fn new(
        inbound: mpsc::Receiver<ClientJsonRpcMessage>,
        outbound: mpsc::Sender<Frame>,
    ) -> Self {
        Self {
            inbound,
            outbound,
            replayed: None,
        }
    }

    /// The first message the router let through, or `None` when the gateway goes away first.
    /// Hand it back with [`Self::replay`].
    pub async fn first(&mut self) -> Option<ClientJsonRpcMessage> {
        self.next().await
    }

    /// Makes `message` the next one [`Transport::receive`] returns.
    pub fn replay(&mut self, message: ClientJsonRpcMessage) {
        self.replayed = Some(message);
    }

    async fn next(&mut self) -> Option<ClientJsonRpcMessage> {
        if let Some(message) = self.replayed.take() {
            return Some(message);
        }
        self.inbound.recv().await
    }
}

/// Whether the agent opened with the 2026-07-28 probe (`server/discover`) rather than the
/// `initialize` handshake.
pub fn probes_modern(message: &ClientJsonRpcMessage) -> bool {
    matches!(message, JsonRpcMessage::Request(r) if matches!(r.request, ClientRequest::DiscoverRequest(_)))
}

/// What an agent's `initialize` declares it can answer, if `message` is one.
pub fn declared_capabilities(
    message: &ClientJsonRpcMessage,
) -> Option<rmcp::model::ClientCapabilities> {
    match message {
        JsonRpcMessage::Request(r) => match &r.request {
            ClientRequest::InitializeRequest(init) => Some(init.params.capabilities.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// A JSON-RPC error answering `message`, if it is a request.
pub fn error_reply(message: &ClientJsonRpcMessage, text: &str) -> Option<Vec<u8>> {
    let JsonRpcMessage::Request(r) = message else {
        return None;
    };
    let reply = json!({
        "jsonrpc": "2.0",
        "id": r.id,
        "error": {"code": -32603, "message": text},
    });
    serde_json::to_vec(&reply).ok()
}

/// The gateway went away while the session was writing to it.
#[derive(Debug, thiserror::Error)]
#[error("the gateway's connection is closed")]
pub struct Closed;

impl Transport<RoleServer> for AgentTransport {
    type Error = Closed;

    fn send(
        &mut self,
        item: rmcp::service::TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let outbound = self.outbound.clone();
        async move {
            let bytes = serde_json::to_vec(&item).map_err(|_| Closed)?;
            outbound.send(Frame::Mcp(bytes)).await.map_err(|_| Closed)
        }
    }

    async fn receive(&mut self) -> Option<rmcp::service::RxJsonRpcMessage<RoleServer>> {
        self.next().await
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inbound.close();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routed(text: &str) -> Routed {
        route(text.as_bytes())
    }

    fn error_code(r: &Routed) -> Option<i64> {
        match r {
            Routed::Answer(v) => v["error"]["code"].as_i64(),
            _ => None,
        }
    }

    #[test]
    fn a_well_formed_call_passes_typed() {
        let r = routed(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w","arguments":{"a":1}}}"#,
        );
        assert!(matches!(r, Routed::Pass(_)), "{r:?}");
    }

    #[test]
    fn request_state_that_is_not_a_string_is_invalid_params() {
        let r = routed(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w","arguments":{},"requestState":0}}"#,
        );
        assert_eq!(error_code(&r), Some(INVALID_PARAMS), "{r:?}");
    }

    #[test]
    fn arguments_that_are_not_an_object_are_invalid_params() {
        for args in ["\"x\"", "[1]", "3", "null"] {
            let r = routed(&format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"w","arguments":{args}}}}}"#
            ));
            assert_eq!(error_code(&r), Some(INVALID_PARAMS), "{args}: {r:?}");
        }
    }

    #[test]
    fn duplicate_keys_anywhere_are_invalid_requests() {
        for text in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"r","name":"w"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w","arguments":{"p":"a","p":"b"}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call","params":{"name":"w"}}"#,
        ] {
            assert_eq!(error_code(&routed(text)), Some(INVALID_REQUEST), "{text}");
        }
    }

    #[test]
    fn batches_are_invalid_requests() {
        let r = routed(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#);
        assert_eq!(error_code(&r), Some(INVALID_REQUEST));
    }

    #[test]
    fn tools_call_as_a_notification_is_dropped() {
        let r = routed(r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"w"}}"#);
        assert!(matches!(r, Routed::Drop(_)), "{r:?}");
    }

    #[test]
    fn unknown_methods_are_method_not_found() {
        for m in [
            "tools/execute",
            "x/y",
            "tasks/get",
            "sampling/createMessage",
        ] {
            let r = routed(&format!(r#"{{"jsonrpc":"2.0","id":"a","method":"{m}"}}"#));
            assert_eq!(error_code(&r), Some(METHOD_NOT_FOUND), "{m}");
        }
    }

    #[test]
    fn odd_ids_and_versions_are_invalid_requests() {
        for text in [
            r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#,
            r#"{"id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":7}"#,
        ] {
            assert_eq!(error_code(&routed(text)), Some(INVALID_REQUEST), "{text}");
        }
    }

    #[test]
    fn garbage_is_a_parse_error() {
        for text in ["", "{", "nul", "\"\\ud800\"", "{\"a\":1} {}"] {
            assert!(matches!(routed(text), Routed::Answer(_)), "{text:?}");
        }
        assert!(matches!(route(&[0xff, 0xfe]), Routed::Answer(_)));
    }

    #[test]
    fn unknown_notifications_are_dropped_and_known_ones_pass() {
        assert!(matches!(
            routed(r#"{"jsonrpc":"2.0","method":"notifications/whatever"}"#),
            Routed::Drop(_)
        ));
        assert!(matches!(
            routed(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Routed::Pass(_)
        ));
    }
}

#[cfg(test)]
mod transport_tests {
    use super::*;

    #[tokio::test]
    async fn a_replayed_first_message_is_received_again() {
        let (tx, rx) = mpsc::channel(4);
        let (out, _out_rx) = mpsc::channel(4);
        let mut t = AgentTransport::new(rx, out.clone());
        let ping = judge(br#"{"jsonrpc":"2.0","id":0,"method":"ping"}"#, &out)
            .await
            .unwrap();
        tx.send(ping).await.unwrap();
        let first = t.first().await.unwrap();
        t.replay(first);
        drop(tx);
        assert!(Transport::receive(&mut t).await.is_some());
        assert!(Transport::receive(&mut t).await.is_none());
    }

    #[tokio::test]
    async fn a_refused_request_is_answered_and_passes_nothing_on() {
        let (out, mut out_rx) = mpsc::channel(4);
        let refused = judge(
            br#"{"jsonrpc":"2.0","id":9,"method":"tools/execute"}"#,
            &out,
        )
        .await;
        assert!(refused.is_none());
        let Some(Frame::Mcp(reply)) = out_rx.recv().await else {
            panic!("an answer");
        };
        let reply: Value = serde_json::from_slice(&reply).unwrap();
        assert_eq!(reply["id"], 9);
        assert_eq!(reply["error"]["code"], METHOD_NOT_FOUND);
        assert!(
            judge(br#"{"jsonrpc":"2.0","method":"x/y"}"#, &out)
                .await
                .is_none()
        );
        assert!(out_rx.try_recv().is_err(), "a notification is not answered");
    }
}

/// The plain shape of `tools/call` is typed without rmcp's parse (see `plain_call`): these
/// tests route every message both ways and require the same outcome, down to the typed value.
#[cfg(test)]
mod plain {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Map;

    /// How the two routings of one message disagreed; its text is what a failing case prints.
    #[derive(Debug, thiserror::Error)]
    enum Disagreement {
        /// One routing passed, answered or dropped the message where the other did otherwise.
        #[error("{text}: routed {plain}, rmcp {rmcp}")]
        Routing {
            text: String,
            plain: String,
            rmcp: String,
        },
        /// Both passed it, in different wire forms.
        #[error("wire forms differ: {0} / {1}")]
        Wire(String, String),
        /// Both passed a request, with different ids.
        #[error("ids differ: {0} / {1}")]
        Ids(String, String),
        /// Both passed a `tools/call`, typed differently (parameters, `_meta` or extensions).
        #[error("typed calls differ: {0} / {1}")]
        TypedCalls(String, String),
        /// Both passed a request, of different types.
        #[error("request types differ: {0} / {1}")]
        RequestTypes(String, String),
    }

    /// Both routings of `text`, which must agree; the desk's is returned.
    fn routed_alike(text: &str) -> Result<Routed, Disagreement> {
        let plain = route_with(text.as_bytes(), Typing::Plain);
        let rmcp = route_with(text.as_bytes(), Typing::Rmcp);
        match (&plain, &rmcp) {
            (Routed::Pass(a), Routed::Pass(b)) => same_message(a, b)?,
            (Routed::Answer(a), Routed::Answer(b)) if a == b => {}
            (Routed::Drop(a), Routed::Drop(b)) if a == b => {}
            _ => {
                return Err(Disagreement::Routing {
                    text: text.to_owned(),
                    plain: format!("{plain:?}"),
                    rmcp: format!("{rmcp:?}"),
                });
            }
        }
        Ok(plain)
    }

    /// The same message: the same wire form, and the same typed request with the same `_meta`.
    fn same_message(
        a: &ClientJsonRpcMessage,
        b: &ClientJsonRpcMessage,
    ) -> Result<(), Disagreement> {
        let (wire_a, wire_b) = (
            serde_json::to_value(a).expect("serializes"),
            serde_json::to_value(b).expect("serializes"),
        );
        if wire_a != wire_b {
            return Err(Disagreement::Wire(wire_a.to_string(), wire_b.to_string()));
        }
        if let (JsonRpcMessage::Request(a), JsonRpcMessage::Request(b)) = (a, b) {
            if a.id != b.id {
                return Err(Disagreement::Ids(
                    format!("{:?}", a.id),
                    format!("{:?}", b.id),
                ));
            }
            if let (ClientRequest::CallToolRequest(a), ClientRequest::CallToolRequest(b)) =
                (&a.request, &b.request)
            {
                let meta = |r: &CallToolRequest| r.extensions.get::<RequestMetaObject>().cloned();
                if a.params != b.params
                    || meta(a) != meta(b)
                    || a.extensions.len() != b.extensions.len()
                {
                    return Err(Disagreement::TypedCalls(format!("{a:?}"), format!("{b:?}")));
                }
            } else if std::mem::discriminant(&a.request) != std::mem::discriminant(&b.request) {
                return Err(Disagreement::RequestTypes(
                    format!("{a:?}"),
                    format!("{b:?}"),
                ));
            }
        }
        Ok(())
    }

    fn json_leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|i| json!(i)),
            any::<u64>().prop_map(|u| json!(u)),
            (-1.0e6f64..1.0e6).prop_map(|f| json!(f)),
            any::<String>().prop_map(Value::String),
            "[a-z\\u{202e}\\u{200b}\\u{0430} é😂]{0,6}".prop_map(Value::String),
        ]
    }

    fn json_value() -> impl Strategy<Value = Value> {
        json_leaf().prop_recursive(4, 32, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map("[a-z_]{0,5}|progressToken|_meta", inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn json_object() -> impl Strategy<Value = Value> {
        prop::collection::btree_map("[a-zA-Z_\\u{200b}]{0,6}|progressToken", json_value(), 0..5)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
    }

    /// A member that is sometimes absent, mostly of the plain shape's type, sometimes not.
    fn member(usual: BoxedStrategy<Value>) -> impl Strategy<Value = Option<Value>> {
        prop_oneof![
            1 => Just(None),
            6 => usual.prop_map(Some),
            1 => json_value().prop_map(Some),
        ]
    }

    prop_compose! {
        /// A `tools/call`, mostly of the plain shape, with every way out of it now and then:
        /// other members, other parameters, wrong types, odd ids, look-alike characters.
        fn call()(
            id in prop_oneof![
                any::<i64>().prop_map(|i| json!(i)),
                any::<u64>().prop_map(|u| json!(u)),
                "[0-9a-z\\u{200b}]{0,8}".prop_map(Value::String),
                json_value(),
            ],
            name in member(prop_oneof![
                "[a-z_]{1,8}".prop_map(Value::String),
                any::<String>().prop_map(Value::String),
            ].boxed()),
            arguments in member(json_object().boxed()),
            meta in member(json_object().boxed()),
            extra_param in prop::option::weighted(
                0.2,
                (
                    "task|requestState|inputResponses|Name|name\\u{200b}|_Meta",
                    prop_oneof![json_value(), "[a-z]{0,4}".prop_map(Value::String), json_object()],
                ),
            ),
            extra_member in prop::option::weighted(
                0.2,
                ("result|error|extra|_meta|Params|params\\u{200b}", json_value()),
            ),
            params_not_object in prop::option::weighted(0.05, json_leaf()),
        ) -> String {
            let mut params = Map::new();
            for (key, value) in [("name", name), ("arguments", arguments), ("_meta", meta)] {
                if let Some(value) = value {
                    params.insert(key.into(), value);
                }
            }
            if let Some((key, value)) = extra_param {
                params.insert(key, value);
            }
            let mut message = Map::new();
            message.insert("jsonrpc".into(), json!("2.0"));
            message.insert("id".into(), id);
            message.insert("method".into(), json!("tools/call"));
            message.insert("params".into(), params_not_object.unwrap_or(Value::Object(params)));
            if let Some((key, value)) = extra_member {
                message.insert(key, value);
            }
            Value::Object(message).to_string()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn a_generated_call_is_routed_and_typed_as_rmcp_would(text in call()) {
            if let Err(why) = routed_alike(&text) {
                prop_assert!(false, "{}", why);
            }
        }
    }

    #[test]
    fn a_plain_call_with_meta_passes_with_its_progress_token() {
        let text = r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"echo","arguments":{"m":"hi"},"_meta":{"progressToken":7,"x":[1]}}}"#;
        let Ok(Routed::Pass(message)) = routed_alike(text) else {
            panic!("{text} did not pass alike");
        };
        let JsonRpcMessage::Request(r) = *message else {
            panic!("not a request");
        };
        let ClientRequest::CallToolRequest(call) = r.request else {
            panic!("not a call");
        };
        let meta = call
            .extensions
            .get::<RequestMetaObject>()
            .expect("meta kept");
        assert_eq!(meta.0.get("progressToken"), Some(&json!(7)));
        assert_eq!(call.params.name, "echo");
        assert_eq!(
            call.params.arguments,
            json!({"m": "hi"}).as_object().cloned()
        );
    }

    #[test]
    fn calls_just_outside_the_plain_shape_are_routed_as_rmcp_would() {
        for text in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w","arguments":null}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w","_meta":null}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w","_meta":[]}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w","task":{}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w","requestState":"s"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w","inputResponses":{}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w","nаme":"r"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w"},"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w"},"error":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w"},"x":1}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":1}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#,
            r#"{"jsonrpc":"2.0","id":18446744073709551615,"method":"tools/call","params":{"name":"w"}}"#,
            r#"{"jsonrpc":"2.0","id":-9223372036854775808,"method":"tools/call","params":{"name":"w"}}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"method":"tools/call","params":{"name":"w"}}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"w"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call ","params":{"name":"w"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w","arguments":{"a":1,"a":2}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w\u202e\u200b"}}"#,
        ] {
            routed_alike(text).unwrap_or_else(|why| panic!("{why}"));
        }
    }
}
