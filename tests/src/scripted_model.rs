//! A model of the test's own, on loopback, for real MCP clients (Claude Code, Codex) to talk to in
//! place of their vendor's API: an HTTP server on `127.0.0.1` that answers each turn of the
//! conversation by script, in the wire format the client speaks (Anthropic's Messages API streamed
//! as server-sent events, `POST /v1/messages`; OpenAI's Responses API streamed the same way,
//! `POST /v1/responses`), and records what the client sent: the tools it listed to the model and
//! every tool result it handed back. The script's moves are tool calls (by server and tool, named
//! the way each client names MCP tools), a confirm whose token and target are read from an earlier
//! result as the client passed it on, and a last text answer.
//!
//! Which move a request gets is worked out from the conversation it carries (how many tool results
//! it holds), not from how many requests came, so a client's retry gets the same move again. A
//! request that lists no MCP tool (a client's own side request, a title or a quota check) is
//! answered with plain text and changes nothing.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The wire format of the client's model API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// Anthropic's Messages API (Claude Code): MCP tools named `mcp__SERVER__TOOL`.
    Messages,
    /// OpenAI's Responses API (Codex): MCP tools in a `namespace` tool `mcp__SERVER`.
    Responses,
}

/// One move of the script.
#[derive(Debug, Clone)]
pub enum Move {
    /// Call `tool` of the client's server `server` with `arguments`.
    Call {
        /// The server's name in the client's configuration.
        server: String,
        /// The tool's name as the server lists it.
        tool: String,
        /// The arguments.
        arguments: Value,
    },
    /// The same, with `confirm: true` and the `confirmToken` and `confirmTarget` read from the
    /// result of move number `from` (counted from 0) as the client handed it back. When that
    /// result holds no token the model says so and ends instead.
    Confirm {
        /// The server's name.
        server: String,
        /// The tool's name.
        tool: String,
        /// The arguments, without the confirm fields.
        arguments: Value,
        /// The move whose result holds the token.
        from: usize,
    },
    /// A last answer in text.
    Say(String),
}

/// A tool result as the client handed it to the model.
#[derive(Debug, Clone)]
pub struct Handed {
    /// `SERVER/TOOL` of the call it answers (the model's own call id maps it back).
    pub call: String,
    /// Its text, every piece joined with newlines.
    pub text: String,
    /// The client's error flag, where its wire format has one (the Messages API's `is_error`).
    pub is_error: Option<bool>,
}

impl Handed {
    /// The JSON object in the text (the `structuredContent` a client passes on as text),
    /// if one is there: the whole text, or from the first line that opens an object.
    pub fn structured(&self) -> Option<Value> {
        if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(self.text.trim()) {
            return Some(v);
        }
        let mut at = 0;
        for line in self.text.split_inclusive('\n') {
            if line.trim_start().starts_with('{') {
                let mut values =
                    serde_json::Deserializer::from_str(&self.text[at..]).into_iter::<Value>();
                if let Some(Ok(v @ Value::Object(_))) = values.next() {
                    return Some(v);
                }
            }
            at += line.len();
        }
        None
    }
}

/// What the model has seen.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// Every MCP tool of the first request that listed any, as `SERVER/TOOL`, with its input
    /// schema.
    pub listed: Vec<(String, Value)>,
    /// The tool results of the longest conversation so far, in order.
    pub handed: Vec<Handed>,
    /// How many requests listed MCP tools, and how many did not.
    pub requests: (usize, usize),
    /// Requests the model could not read (the path and why), which fail the test that asserts
    /// on [`Seen::unread`].
    pub unread: Vec<String>,
}

impl Seen {
    /// The input schema of `SERVER/TOOL`, if the client listed it.
    pub fn schema(&self, call: &str) -> Option<&Value> {
        self.listed.iter().find(|(n, _)| n == call).map(|(_, s)| s)
    }
}

/// The model, serving until dropped.
pub struct ScriptedModel {
    port: u16,
    seen: Arc<Mutex<Seen>>,
    /// Told each time what it has seen changes.
    changed: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedModel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Script {
    wire: Wire,
    moves: Vec<Move>,
    seen: Arc<Mutex<Seen>>,
    changed: Arc<tokio::sync::Notify>,
}

impl ScriptedModel {
    /// Starts the model on a free port of `127.0.0.1`, answering in `wire` by `moves`.
    pub async fn start(wire: Wire, moves: Vec<Move>) -> ScriptedModel {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let changed = Arc::new(tokio::sync::Notify::new());
        let script = Arc::new(Script {
            wire,
            moves,
            seen: seen.clone(),
            changed: changed.clone(),
        });
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let script = script.clone();
                tokio::spawn(async move {
                    let _ = serve(stream, &script).await;
                });
            }
        });
        ScriptedModel {
            port,
            seen,
            changed,
            task,
        }
    }

    /// Its port on `127.0.0.1`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// What it has seen so far.
    pub fn seen(&self) -> Seen {
        countersign_core::sync::lock(&self.seen).clone()
    }

    /// Waits (up to `limit`) until what it has seen satisfies `done`, woken by each change
    /// (no polling); panics naming `what` if it never does.
    pub async fn until_seen(
        &self,
        what: &str,
        limit: std::time::Duration,
        done: impl Fn(&Seen) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            // Registered before the look: a change between the look and the wait is not missed.
            let changed = self.changed.notified();
            if done(&self.seen()) {
                return;
            }
            assert!(
                tokio::time::timeout_at(deadline, changed).await.is_ok(),
                "{what}: not within {limit:?}"
            );
        }
    }
}

/// The requests of one connection (HTTP/1.1, kept alive), each with a body of `Content-Length`.
async fn serve(mut stream: TcpStream, script: &Script) -> std::io::Result<()> {
    let mut buf = Vec::new();
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            let mut chunk = [0u8; 8192];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap_or_default().to_owned();
        let mut length = 0usize;
        let mut chunked = false;
        for line in lines {
            if let Some((name, value)) = line.split_once(':') {
                let name = name.trim().to_ascii_lowercase();
                if name == "content-length" {
                    length = value.trim().parse().unwrap_or(0);
                } else if name == "transfer-encoding" && value.contains("chunked") {
                    chunked = true;
                }
            }
        }
        buf.drain(..head_end + 4);
        while buf.len() < length {
            let mut chunk = vec![0u8; length - buf.len()];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let body: Vec<u8> = buf.drain(..length).collect();
        let path = request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        let (status, kind, out) = if chunked {
            let why = format!("{path}: a chunked body, which this model does not read");
            countersign_core::sync::lock(&script.seen).unread.push(why);
            script.changed.notify_waiters();
            (400, "text/plain", String::new())
        } else {
            answer(script, &request_line, &path, &body)
        };
        let reason = match status {
            200 => "OK",
            404 => "Not Found",
            _ => "Bad Request",
        };
        let response = format!(
            "HTTP/1.1 {status} {reason}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n\
             cache-control: no-cache\r\nconnection: keep-alive\r\n\r\n{out}",
            out.len()
        );
        stream.write_all(response.as_bytes()).await?;
    }
}

/// The status, content type and body answering one request.
fn answer(
    script: &Script,
    request_line: &str,
    path: &str,
    body: &[u8],
) -> (u16, &'static str, String) {
    let wanted = match script.wire {
        Wire::Messages => "/v1/messages",
        Wire::Responses => "/v1/responses",
    };
    let route = path.split('?').next().unwrap_or_default();
    if !request_line.starts_with("POST ") || route != wanted {
        return (404, "application/json", "{}".to_owned());
    }
    let request: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            countersign_core::sync::lock(&script.seen)
                .unread
                .push(format!("{path}: {e}"));
            script.changed.notify_waiters();
            return (400, "text/plain", String::new());
        }
    };
    let listed = listed(script.wire, &request);
    let mut seen = countersign_core::sync::lock(&script.seen);
    if listed.is_empty() {
        seen.requests.1 += 1;
        drop(seen);
        script.changed.notify_waiters();
        return (200, "text/event-stream", say(script.wire, "ok"));
    }
    seen.requests.0 += 1;
    if seen.listed.is_empty() {
        seen.listed = listed;
    }
    let handed = handed(script, &request);
    let step = handed.len();
    if handed.len() >= seen.handed.len() {
        seen.handed = handed.clone();
    }
    drop(seen);
    script.changed.notify_waiters();
    let call_id = format!("toolu_{step}");
    let out = match script.moves.get(step) {
        Some(Move::Call {
            server,
            tool,
            arguments,
        }) => call(script.wire, &call_id, server, tool, arguments),
        Some(Move::Confirm {
            server,
            tool,
            arguments,
            from,
        }) => {
            let found = handed
                .get(*from)
                .and_then(Handed::structured)
                .filter(|s| s["confirmToken"].is_string());
            match found {
                Some(s) => {
                    let mut arguments = arguments.clone();
                    arguments["confirm"] = json!(true);
                    arguments["confirmToken"] = s["confirmToken"].clone();
                    arguments["confirmTarget"] = s["confirmTarget"].clone();
                    call(script.wire, &call_id, server, tool, &arguments)
                }
                None => say(script.wire, "the preflight's result held no confirmToken"),
            }
        }
        Some(Move::Say(text)) => say(script.wire, text),
        None => say(script.wire, "the script has ended"),
    };
    (200, "text/event-stream", out)
}

/// The MCP tools a request lists, as `SERVER/TOOL` with their input schemas. Claude Code joins
/// the server and the tool with `__` after `mcp__`; a server's name is taken up to the first
/// `__` (the test's servers have none in their names).
fn listed(wire: Wire, request: &Value) -> Vec<(String, Value)> {
    let tools = request["tools"].as_array().cloned().unwrap_or_default();
    let mut out = Vec::new();
    match wire {
        Wire::Messages => {
            for tool in tools {
                let Some(name) = tool["name"].as_str() else {
                    continue;
                };
                if let Some((server, tool_name)) =
                    name.strip_prefix("mcp__").and_then(|r| r.split_once("__"))
                {
                    out.push((
                        format!("{server}/{tool_name}"),
                        tool["input_schema"].clone(),
                    ));
                }
            }
        }
        Wire::Responses => {
            for space in tools {
                let Some(server) = space["name"].as_str().and_then(|n| n.strip_prefix("mcp__"))
                else {
                    continue;
                };
                if space["type"] != "namespace" {
                    continue;
                }
                for tool in space["tools"].as_array().into_iter().flatten() {
                    if let Some(name) = tool["name"].as_str() {
                        out.push((format!("{server}/{name}"), tool["parameters"].clone()));
                    }
                }
            }
        }
    }
    out
}

/// The tool results a request's conversation holds, in order, mapped back to the model's calls
/// by their ids (`toolu_N` answers move N).
fn handed(script: &Script, request: &Value) -> Vec<Handed> {
    let mut out = Vec::new();
    let call_of = |id: &str| -> String {
        let step: Option<usize> = id.strip_prefix("toolu_").and_then(|n| n.parse().ok());
        match step.and_then(|n| script.moves.get(n)) {
            Some(Move::Call { server, tool, .. } | Move::Confirm { server, tool, .. }) => {
                format!("{server}/{tool}")
            }
            _ => format!("unknown call {id}"),
        }
    };
    match script.wire {
        Wire::Messages => {
            for message in request["messages"].as_array().into_iter().flatten() {
                for block in message["content"].as_array().into_iter().flatten() {
                    if block["type"] != "tool_result" {
                        continue;
                    }
                    out.push(Handed {
                        call: call_of(block["tool_use_id"].as_str().unwrap_or_default()),
                        text: text_of(&block["content"]),
                        is_error: block["is_error"].as_bool(),
                    });
                }
            }
        }
        Wire::Responses => {
            for item in request["input"].as_array().into_iter().flatten() {
                if item["type"] != "function_call_output" {
                    continue;
                }
                out.push(Handed {
                    call: call_of(item["call_id"].as_str().unwrap_or_default()),
                    text: text_of(&item["output"]),
                    is_error: None,
                });
            }
        }
    }
    out
}

/// A result's text: a string, or the text of each piece of a list, joined with newlines.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str().or(p["output"].as_str()))
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.to_string(),
    }
}

/// Server-sent events, each `event: TYPE` and its JSON data.
fn events(list: &[Value]) -> String {
    list.iter()
        .map(|data| {
            format!(
                "event: {}\ndata: {data}\n\n",
                data["type"].as_str().unwrap()
            )
        })
        .collect()
}

fn usage_messages() -> Value {
    json!({"input_tokens": 1, "output_tokens": 1})
}

fn usage_responses() -> Value {
    json!({"input_tokens": 1, "input_tokens_details": null, "output_tokens": 1,
           "output_tokens_details": null, "total_tokens": 2})
}

fn message_start() -> Value {
    json!({"type": "message_start", "message": {"id": "msg_scripted", "type": "message",
        "role": "assistant", "model": "scripted", "content": [], "stop_reason": null,
        "stop_sequence": null, "usage": usage_messages()}})
}

fn message_end(stop: &str) -> [Value; 3] {
    [
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
               "usage": {"output_tokens": 1}}),
        json!({"type": "message_stop"}),
    ]
}

fn response_around(item: Value) -> String {
    events(&[
        json!({"type": "response.created", "response": {"id": "resp_scripted"}}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
        json!({"type": "response.completed",
               "response": {"id": "resp_scripted", "usage": usage_responses()}}),
    ])
}

/// A turn that ends with `text`.
fn say(wire: Wire, text: &str) -> String {
    match wire {
        Wire::Messages => {
            let mut list = vec![
                message_start(),
                json!({"type": "content_block_start", "index": 0,
                       "content_block": {"type": "text", "text": ""}}),
                json!({"type": "content_block_delta", "index": 0,
                       "delta": {"type": "text_delta", "text": text}}),
            ];
            list.extend(message_end("end_turn"));
            events(&list)
        }
        Wire::Responses => response_around(json!({"type": "message", "role": "assistant",
            "id": "msg_scripted", "content": [{"type": "output_text", "text": text}]})),
    }
}

/// A turn that calls `tool` of `server` with `arguments`, under the call id `id`.
fn call(wire: Wire, id: &str, server: &str, tool: &str, arguments: &Value) -> String {
    match wire {
        Wire::Messages => {
            let mut list = vec![
                message_start(),
                json!({"type": "content_block_start", "index": 0,
                       "content_block": {"type": "tool_use", "id": id,
                                         "name": format!("mcp__{server}__{tool}"), "input": {}}}),
                json!({"type": "content_block_delta", "index": 0,
                       "delta": {"type": "input_json_delta",
                                 "partial_json": arguments.to_string()}}),
            ];
            list.extend(message_end("tool_use"));
            events(&list)
        }
        Wire::Responses => {
            response_around(json!({"type": "function_call", "id": format!("fc_{id}"),
            "call_id": id, "namespace": format!("mcp__{server}"), "name": tool,
            "arguments": arguments.to_string()}))
        }
    }
}
