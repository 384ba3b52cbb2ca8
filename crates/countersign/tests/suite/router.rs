//! The router is default-deny: the ways around the click that an attacker who can only send MCP
//! messages would try, each against an upstream that obeys anything.
//!
//! The agent here is hostile and speaks raw bytes to the real `countersign mcp` binary: after an
//! honest initialize handshake and a `tools/list` (so the desk knows the listing), it sends one
//! message that a careless router would get wrong — a `tools/call` with fields of the wrong type,
//! duplicate keys (which parsers resolve differently: the desk might decide on one value while
//! the upstream executes another), a batch, a `tools/call` sent as a notification, an unknown
//! method, a call of a tool the upstream executes but never listed. Each must come back as a
//! JSON-RPC error (a notification: as nothing at all), and nothing of it may reach the upstream.
//!
//! The upstream is `tests/peers/obedient_server.py`: it executes every `tools/call` it receives, in
//! any shape, answers unknown methods with success, and appends everything that could have done
//! something to a log file. A test reads that log only after a round trip through the upstream (a
//! call of the open tool `read` on the path `barrier`, which the log check leaves out), so whatever
//! the desk forwarded before has been logged by then. The desk's engine runs in this test process,
//! as in `gateway.rs`; nobody approves anything.

use crate::common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// The upstream that obeys anything.
const OBEDIENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/peers/obedient_server.py"
);

/// How long any one reply may take.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a notification is given to provoke a reply that must not come.
const SILENCE: Duration = Duration::from_secs(1);

/// The path the barrier call reads; the log check leaves these calls out.
const BARRIER_PATH: &str = "barrier";

/// An agent that writes raw lines to `countersign mcp` and reads its raw replies.
struct RawAgent {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    /// The upstream's log of what reached it.
    log: PathBuf,
    /// The last line sent, for failure messages.
    last_sent: String,
    barriers: u64,
}

impl RawAgent {
    /// Starts `countersign mcp EXTRA... -- python3 obedient_server.py LOG` on `desk`, does the
    /// initialize handshake and lists the tools.
    async fn start(desk: &Desk, extra: &[&str]) -> RawAgent {
        let log = desk.dir.path().join("upstream.jsonl");
        let mut args: Vec<&str> = extra.to_vec();
        args.extend_from_slice(&["--", "python3", OBEDIENT, log.to_str().unwrap()]);
        let mut cmd = gateway_command(&desk.socket, &args);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn countersign mcp");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut agent = RawAgent {
            child,
            stdin,
            stdout,
            log,
            last_sent: String::new(),
            barriers: 0,
        };
        let init = agent
            .request(
                r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"hostile","version":"1"}}}"#,
                json!(0),
            )
            .await;
        assert!(init["result"].is_object(), "initialize failed: {init}");
        agent
            .send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
            .await;
        let list = agent
            .request(
                r#"{"jsonrpc":"2.0","id":"list","method":"tools/list"}"#,
                json!("list"),
            )
            .await;
        let names: Vec<&str> = list["result"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("tools/list failed: {list}"))
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert!(
            names.contains(&"read") && names.contains(&"write") && !names.contains(&"hidden"),
            "unexpected listing: {names:?}"
        );
        agent
    }

    /// Writes `line` and a newline to the gateway's stdin.
    async fn send(&mut self, line: &str) {
        self.last_sent = line.to_owned();
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap_or_else(|e| panic!("writing to the gateway failed ({e}) on: {line}"));
        self.stdin.flush().await.unwrap();
    }

    /// The next message from the gateway that is not a notification or a request of its own: a
    /// response object, or an array (a batch response).
    async fn next_reply(&mut self) -> Value {
        match tokio::time::timeout(REPLY_TIMEOUT, self.read_reply()).await {
            Ok(reply) => reply,
            Err(_) => panic!(
                "no reply within {REPLY_TIMEOUT:?} after sending: {}",
                self.last_sent
            ),
        }
    }

    /// Cancel-safe: `Lines::next_line` keeps a partly read line for the next call.
    async fn read_reply(&mut self) -> Value {
        loop {
            let line = match self.stdout.next_line().await {
                Ok(Some(line)) => line,
                Ok(None) | Err(_) => {
                    let status = self.child.try_wait().ok().flatten();
                    panic!(
                        "the gateway closed its stdout (exit: {status:?}) after: {}",
                        self.last_sent
                    )
                }
            };
            if line.trim().is_empty() {
                continue;
            }
            let message: Value = serde_json::from_str(&line).unwrap_or_else(|e| {
                panic!("the gateway wrote a line that is not JSON ({e}): {line}")
            });
            if message.get("method").is_some() {
                continue; // a notification or a request of the server's: not a reply
            }
            return message;
        }
    }

    /// The reply whose id is `id`, skipping any other.
    async fn reply_to(&mut self, id: Value) -> Value {
        loop {
            let reply = self.next_reply().await;
            if reply.get("id") == Some(&id) {
                return reply;
            }
        }
    }

    /// Sends `line` (a request with id `id`) and returns its reply.
    async fn request(&mut self, line: &str, id: Value) -> Value {
        self.send(line).await;
        self.reply_to(id).await
    }

    /// Asserts that no reply comes for what was just sent (a notification): nothing arrives
    /// within a second, and a `ping` sent then is answered first.
    async fn expect_silence(&mut self) {
        let sent = self.last_sent.clone();
        if let Ok(reply) = tokio::time::timeout(SILENCE, self.read_reply()).await {
            panic!("a notification was answered: {reply}\n  notification: {sent}");
        }
        self.send(r#"{"jsonrpc":"2.0","id":"ping-after-silence","method":"ping"}"#)
            .await;
        let reply = self.next_reply().await;
        assert_eq!(
            reply["id"],
            json!("ping-after-silence"),
            "something other than the ping's answer came first: {reply}\n  notification: {sent}"
        );
        assert!(reply["result"].is_object(), "ping failed: {reply}");
    }

    /// Everything the upstream logged, read after a ping and a call of the open tool `read` went
    /// through it, so everything forwarded before them has been logged.
    async fn upstream_log(&mut self) -> Vec<Value> {
        let ping = self
            .request(
                r#"{"jsonrpc":"2.0","id":"ping-barrier","method":"ping"}"#,
                json!("ping-barrier"),
            )
            .await;
        assert!(ping["result"].is_object(), "ping failed: {ping}");
        self.barriers += 1;
        let id = format!("barrier-{}", self.barriers);
        let line = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "tools/call",
            "params": {"name": "read", "arguments": {"path": BARRIER_PATH}},
        })
        .to_string();
        let reply = self.request(&line, json!(id)).await;
        assert_eq!(
            reply["result"]["isError"],
            json!(false),
            "the barrier call of the open tool `read` did not reach the upstream: {reply}"
        );
        self.logged()
    }

    /// Everything the upstream has logged so far, without a barrier: for a test whose upstream
    /// can no longer take the barrier's call, and whose every call has been answered (the
    /// upstream logs a call before it answers it, so one that reached it is in the log by then).
    fn logged(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad log line ({e}): {l}")))
            .collect()
    }

    /// The `tools/call` messages that reached the upstream, barrier calls left out.
    async fn calls_at_upstream(&mut self) -> Vec<Value> {
        calls_in(self.upstream_log().await)
    }

    /// Asserts that no `tools/call` reached the upstream.
    async fn assert_no_call_reached_the_upstream(&mut self) {
        let calls = self.calls_at_upstream().await;
        assert!(calls.is_empty(), "{}", reached(&calls));
    }
}

/// The failure message for `calls` that reached the upstream.
fn reached(calls: &[Value]) -> String {
    let raw: Vec<String> = calls.iter().map(|c| format!("    {}", c["raw"])).collect();
    format!("tools/call reached the upstream:\n{}", raw.join("\n"))
}

/// A hostile agent on a fresh desk. A preflight waits 1 s, so a hostile call that the desk
/// wrongly took for a preflight shows up as a `pending` result instead of a timeout.
async fn hostile() -> (Desk, RawAgent) {
    let desk = desk().await;
    let agent = RawAgent::start(&desk, &["--wait", "1"]).await;
    (desk, agent)
}

/// The `tools/call` messages in the upstream's `log`, barrier calls left out.
fn calls_in(log: Vec<Value>) -> Vec<Value> {
    log.into_iter()
        .filter(|entry| {
            let call = entry["method"] == json!("tools/call")
                || (entry["unparsed"] == json!(true)
                    && entry["raw"].as_str().unwrap_or("").contains("tools/call"));
            let barrier = entry["params"]["name"] == json!("read")
                && entry["params"]["arguments"] == json!({"path": BARRIER_PATH})
                && entry.get("notification").is_none();
            call && !barrier
        })
        .collect()
}

/// Why `reply` is not a JSON-RPC error (or a batch response made only of errors) for the message
/// `sent` with id `id` (or with no id: a message the desk could not trust carries none).
fn not_an_error(reply: &Value, id: &Value, sent: &str) -> Option<String> {
    let one = |r: &Value| {
        r["error"].is_object()
            && r["error"]["code"].is_i64()
            && r.get("result").is_none()
            && (r["id"] == *id || r["id"].is_null())
    };
    let ok = match reply {
        Value::Array(items) => !items.is_empty() && items.iter().all(one),
        _ => one(reply),
    };
    (!ok).then(|| format!("expected a JSON-RPC error, got: {reply}\n    for: {sent}"))
}

/// Sends each of `lines` (requests with id `id`), expecting a JSON-RPC error for each, then
/// checks that no call reached the upstream; reports every case that went wrong at once.
async fn each_is_an_error_and_nothing_reaches_the_upstream(lines: &[(&str, Value)]) {
    let (_desk, agent) = hostile().await;
    each_is_an_error_on(agent, lines).await;
}

/// [`each_is_an_error_and_nothing_reaches_the_upstream`] on `agent`.
async fn each_is_an_error_on(mut agent: RawAgent, lines: &[(&str, Value)]) {
    let mut problems = Vec::new();
    for (line, id) in lines {
        agent.send(line).await;
        let reply = agent.next_reply().await;
        problems.extend(not_an_error(&reply, id, line));
    }
    let calls = agent.calls_at_upstream().await;
    if !calls.is_empty() {
        problems.push(reached(&calls));
    }
    assert!(problems.is_empty(), "\n  {}", problems.join("\n  "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_call_with_request_state_not_a_string_is_an_error_and_never_reaches_the_upstream() {
    each_is_an_error_and_nothing_reaches_the_upstream(&[(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"write","arguments":{"path":"x","text":"y"},"requestState":0}}"#,
        json!(1),
    )])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_call_with_arguments_not_an_object_is_an_error_and_never_reaches_the_upstream() {
    each_is_an_error_and_nothing_reaches_the_upstream(&[
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"write","arguments":"x"}}"#,
            json!(1),
        ),
        (
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"write","arguments":[1]}}"#,
            json!(2),
        ),
        (
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"read","arguments":"x"}}"#,
            json!(3),
        ),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_call_with_name_not_a_string_is_an_error_and_never_reaches_the_upstream() {
    each_is_an_error_and_nothing_reaches_the_upstream(&[
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":5,"arguments":{"path":"x","text":"y"}}}"#,
            json!(1),
        ),
        (
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":["write"],"arguments":{"path":"x","text":"y"}}}"#,
            json!(2),
        ),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_keys_anywhere_are_an_error_and_never_reach_the_upstream() {
    each_is_an_error_and_nothing_reaches_the_upstream(&[
        // The desk might decide on the open `read`, the upstream execute `write`.
        (
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"read","name":"write","arguments":{"path":"a"}}}"#,
            json!(7),
        ),
        // Nested in the arguments: the person would approve one path, another would be written.
        (
            r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"write","arguments":{"path":"a","text":"y","path":"b"}}}"#,
            json!(8),
        ),
        // The method itself: an allowed `ping` to the desk, a `tools/call` to the upstream.
        (
            r#"{"jsonrpc":"2.0","id":9,"method":"ping","method":"tools/call","params":{"name":"write","arguments":{"path":"x","text":"y"}}}"#,
            json!(9),
        ),
        // The whole params object.
        (
            r#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"read","arguments":{"path":"a"}},"params":{"name":"write","arguments":{"path":"a","text":"y"}}}"#,
            json!(10),
        ),
    ])
    .await;
}

/// Every test here speaks to a gateway whose stdio is pipes, which it hands to the desk: the desk
/// reads the agent's lines itself. With `--relay` the same lines reach the desk as frames
/// through the gateway; they are judged by the same router, and this proves it for a sample of
/// each kind: duplicate keys, a batch, malformed JSON, a wrong type, an unlisted tool, and a
/// call sent as a notification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_relay_the_same_hostile_lines_are_errors_and_never_reach_the_upstream() {
    let desk = desk().await;
    let mut agent = RawAgent::start(&desk, &["--wait", "1", "--relay"]).await;
    agent
        .send(r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"write","arguments":{"path":"x","text":"y"}}}"#)
        .await;
    agent.expect_silence().await;
    let unlisted = agent
        .request(
            r#"{"jsonrpc":"2.0","id":40,"method":"tools/call","params":{"name":"hidden","arguments":{"path":"x"}}}"#,
            json!(40),
        )
        .await;
    assert_eq!(
        unlisted["result"]["structuredContent"]["error"], "unlisted_tool",
        "{unlisted}"
    );
    each_is_an_error_on(
        agent,
        &[
            (
                r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"read","name":"write","arguments":{"path":"a"}}}"#,
                json!(7),
            ),
            (
                r#"[{"jsonrpc":"2.0","id":20,"method":"tools/call","params":{"name":"write","arguments":{"path":"x","text":"y"}}}]"#,
                Value::Null,
            ),
            (r#"{"jsonrpc":"2.0","id":60,"#, Value::Null),
            (
                r#"{"jsonrpc":"2.0","id":30,"method":"tools/call","params":{"name":"write","arguments":"x"}}"#,
                json!(30),
            ),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_an_error_and_never_reach_the_upstream() {
    each_is_an_error_and_nothing_reaches_the_upstream(&[(
        r#"[{"jsonrpc":"2.0","id":20,"method":"tools/call","params":{"name":"read","arguments":{"path":"a"}}},{"jsonrpc":"2.0","id":21,"method":"tools/call","params":{"name":"write","arguments":{"path":"x","text":"y"}}}]"#,
        Value::Null,
    )])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_call_as_a_notification_is_dropped_and_never_reaches_the_upstream() {
    let (_desk, mut agent) = hostile().await;
    for line in [
        r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"write","arguments":{"path":"x","text":"y"}}}"#,
        r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"hidden","arguments":{"path":"x"}}}"#,
        r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"read","arguments":{"path":"a"}}}"#,
    ] {
        agent.send(line).await;
        agent.expect_silence().await;
    }
    agent.assert_no_call_reached_the_upstream().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_methods_are_method_not_found_and_never_forwarded() {
    let (_desk, mut agent) = hostile().await;
    let methods = ["tools/execute", "x/anything"];
    let mut problems = Vec::new();
    for (id, method) in methods.iter().enumerate() {
        let line = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": method,
            "params": {"name": "write", "arguments": {"path": "x", "text": "y"}},
        })
        .to_string();
        let reply = agent.request(&line, json!(id)).await;
        if reply["error"]["code"] != json!(-32601) {
            problems.push(format!(
                "expected method not found (-32601), got: {reply}\n    for: {line}"
            ));
        }
    }
    let forwarded: Vec<String> = agent
        .upstream_log()
        .await
        .iter()
        .filter(|entry| methods.iter().any(|m| entry["method"] == json!(m)))
        .map(|entry| format!("    {}", entry["raw"]))
        .collect();
    if !forwarded.is_empty() {
        problems.push(format!(
            "unknown methods reached the upstream:\n{}",
            forwarded.join("\n")
        ));
    }
    let calls = agent.calls_at_upstream().await;
    if !calls.is_empty() {
        problems.push(reached(&calls));
    }
    assert!(problems.is_empty(), "\n  {}", problems.join("\n  "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlisted_tool_is_refused_and_never_forwarded() {
    let (_desk, mut agent) = hostile().await;
    let line = r#"{"jsonrpc":"2.0","id":40,"method":"tools/call","params":{"name":"hidden","arguments":{"path":"x"}}}"#;
    let reply = agent.request(line, json!(40)).await;
    assert!(
        reply["error"].is_object() || reply["result"]["isError"] == json!(true),
        "expected an error or a refusal, got: {reply}"
    );
    agent.assert_no_call_reached_the_upstream().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gated_tool_call_without_confirm_never_reaches_the_upstream() {
    let desk = desk().await;
    let mut agent = RawAgent::start(&desk, &["--wait", "1"]).await;
    let line = r#"{"jsonrpc":"2.0","id":30,"method":"tools/call","params":{"name":"write","arguments":{"path":"x","text":"y"}}}"#;
    let reply = agent.request(line, json!(30)).await;
    assert_eq!(reply["result"]["isError"], json!(true), "{reply}");
    assert_eq!(
        reply["result"]["structuredContent"]["refusal"],
        json!("pending"),
        "{reply}"
    );
    agent.assert_no_call_reached_the_upstream().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_tool_call_is_forwarded_serialized_by_the_desk() {
    let (_desk, mut agent) = hostile().await;
    // Odd whitespace and key order: bytes no serializer would produce.
    let sent = r#"{ "params" : {"arguments":{"path":"a"},"name":"read"}, "method":"tools/call","id":9,"jsonrpc":"2.0"}"#;
    let reply = agent.request(sent, json!(9)).await;
    assert_eq!(reply["result"]["isError"], json!(false), "{reply}");
    assert_eq!(
        reply["result"]["content"][0]["text"],
        json!("did it"),
        "{reply}"
    );
    let calls = agent.calls_at_upstream().await;
    assert_eq!(
        calls.len(),
        1,
        "expected one call at the upstream: {calls:?}"
    );
    let call = &calls[0];
    // The desk may add its own `_meta` (a progress token of its session); the rest is equal.
    let mut params = call["params"].clone();
    if let Some(p) = params.as_object_mut() {
        p.remove("_meta");
    }
    assert_eq!(params, json!({"name": "read", "arguments": {"path": "a"}}));
    assert_ne!(
        call["raw"].as_str().unwrap(),
        sent,
        "the upstream received the agent's own bytes"
    );
}

/// The open lane (crates/session/src/lane.rs: an open call written to the upstream by the desk's
/// connection reader, past both MCP sessions) takes a call only when every condition holds, and
/// the full path takes every other. The upstream's log tells them apart: the lane's calls carry an
/// id of the desk's own (`countersign-open-N`), the full path's are numbered by its MCP session.
/// A call with metadata the lane does not carry, and the first call after the upstream said its
/// tools changed, take the full path (which lists the tools again before the call goes on); the
/// next plain call takes the lane again. A call whose id is a string over 256 bytes takes the full
/// path (the lane keeps every waiting call's id). Every answer comes back under the agent's own id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_lane_takes_a_plain_open_call_of_a_current_listing_and_nothing_else() {
    let (_desk, mut agent) = hostile().await;
    let read = |id: Value, path: &str, meta: Option<Value>| {
        let mut params = json!({"name": "read", "arguments": {"path": path}});
        if let Some(meta) = meta {
            params["_meta"] = meta;
        }
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string()
    };
    let steps = [
        (json!(1), "plain", None),
        (
            json!("two"),
            "traced",
            Some(json!({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})),
        ),
        (json!(3), "relist", None),
        (json!(4), "after-the-change", None),
        (
            json!("five"),
            "plain-again",
            Some(json!({"progressToken": "p5"})),
        ),
        (json!("6".repeat(257)), "long-id", None),
    ];
    for (id, path, meta) in steps {
        let reply = agent
            .request(&read(id.clone(), path, meta), id.clone())
            .await;
        assert_eq!(reply["id"], id, "{reply}");
        assert_eq!(
            reply["result"]["content"][0]["text"],
            json!("did it"),
            "{path}: {reply}"
        );
    }
    let calls = agent.calls_at_upstream().await;
    let id_of = |path: &str| -> Value {
        let call = calls
            .iter()
            .find(|c| c["params"]["arguments"]["path"] == json!(path))
            .unwrap_or_else(|| panic!("{path} did not reach the upstream: {calls:?}"));
        let raw: Value = serde_json::from_str(call["raw"].as_str().unwrap()).unwrap();
        raw["id"].clone()
    };
    let on_lane = |path: &str| {
        id_of(path)
            .as_str()
            .is_some_and(|id| id.starts_with("countersign-open-"))
    };
    assert!(on_lane("plain"), "a plain open call: {:?}", id_of("plain"));
    assert!(!on_lane("traced"), "other metadata: {:?}", id_of("traced"));
    assert!(on_lane("relist"), "{:?}", id_of("relist"));
    assert!(
        !on_lane("after-the-change"),
        "the first call after the list changed: {:?}",
        id_of("after-the-change")
    );
    assert!(on_lane("plain-again"), "{:?}", id_of("plain-again"));
    assert!(
        !on_lane("long-id"),
        "an id over 256 bytes: {:?}",
        id_of("long-id")
    );
    // The lane's own progress token, never the agent's, reached the upstream.
    let again = calls
        .iter()
        .find(|c| c["params"]["arguments"]["path"] == json!("plain-again"))
        .unwrap();
    assert_eq!(
        again["params"]["_meta"]["progressToken"],
        id_of("plain-again")
    );
    assert_eq!(calls.len(), 6, "{calls:?}");
}

/// A listing counts only under the tools it was taken for. The upstream says its tools changed and
/// from then on cannot list them: no call goes by the listing from before, on the lane or the
/// full way, however many times the agent tries. (A flag cleared when a listing began once let
/// the call after a failed listing go by the old one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_tools_changed_a_failed_listing_leaves_no_listing_in_force() {
    let (_desk, mut agent) = hostile().await;
    let read = |id: u64, path: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": "read", "arguments": {"path": path}}})
        .to_string()
    };
    for (id, path) in [(1, "listed"), (2, "unlistable")] {
        let reply = agent.request(&read(id, path), json!(id)).await;
        assert_eq!(
            reply["result"]["content"][0]["text"],
            json!("did it"),
            "{path}: {reply}"
        );
    }
    for id in 3..6 {
        let reply = agent
            .request(&read(id, "by-the-old-listing"), json!(id))
            .await;
        assert_eq!(reply["id"], json!(id), "{reply}");
        assert_ne!(
            reply["result"]["content"][0]["text"],
            json!("did it"),
            "call {id} went by the listing from before the change: {reply}"
        );
    }
    // Every call has been answered, and the upstream can no longer list its tools (so it can
    // take no barrier call): what it logged is all it will ever get.
    let calls = calls_in(agent.logged());
    let paths: Vec<&Value> = calls
        .iter()
        .map(|c| &c["params"]["arguments"]["path"])
        .collect();
    assert_eq!(paths, [&json!("listed"), &json!("unlistable")], "{calls:?}");
}

/// The re-listing attack, by the upstream: `write` is listed as works-once, a person approves a
/// call, then the upstream re-lists it as idempotent (reusable) and says its list changed. The
/// approval keeps the class it was made under: the first confirm runs, the second is
/// `already_used`, and the upstream executed `write` exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_relisted_as_reusable_after_the_click_still_runs_once() {
    let desk = desk().await;
    let log = desk.dir.path().join("relist.log");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/peers/obedient_server.py"
    );
    let cmd = gateway_command(
        &desk.socket,
        &[
            "--wait",
            "10",
            "--",
            "python3",
            script,
            log.to_str().unwrap(),
        ],
    );
    let agent = connect(cmd, plain_client()).await;
    let tools = agent.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "write"), "{tools:?}");
    let args = json!({"path": "ledger.txt", "text": "pay 100"});
    let confirm = approved(&desk, &agent, "write", args).await;

    // The upstream re-lists `write` as idempotent; the desk learns it on the next call.
    let r = call(&agent, "read", json!({"path": "relist"})).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    // A changed definition is held back until the person accepts it: the agent is shown the
    // pinned one meanwhile, and calls are refused.
    let relisted = agent.list_all_tools().await.unwrap();
    let write = relisted.iter().find(|t| t.name == "write").unwrap();
    assert_eq!(
        write.annotations.as_ref().unwrap().idempotent_hint,
        Some(false),
        "the agent was shown a definition the person has not accepted: {write:?}"
    );
    let held = call(&agent, "write", confirm.clone()).await;
    assert_eq!(refusal(&held).as_deref(), Some("tool_changed"), "{held:?}");
    let change = desk
        .engine
        .pending()
        .into_iter()
        .find(|r| r.change().is_some());
    desk.engine.approve(change.unwrap().id, None).await.unwrap();
    let relisted = agent.list_all_tools().await.unwrap();
    let write = relisted.iter().find(|t| t.name == "write").unwrap();
    assert_eq!(
        write.annotations.as_ref().unwrap().idempotent_hint,
        Some(true),
        "the upstream did not re-list: {write:?}"
    );
    // The approval made before the change still counts under the stricter class.

    let first = call(&agent, "write", confirm.clone()).await;
    assert_ne!(first.is_error, Some(true), "{first:?}");
    let second = call(&agent, "write", confirm).await;
    assert_eq!(
        refusal(&second).as_deref(),
        Some("already_used"),
        "{second:?}"
    );
    let writes = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter(|l| serde_json::from_str::<Value>(l).unwrap()["params"]["name"] == json!("write"))
        .count();
    assert_eq!(writes, 1, "the upstream executed write {writes} times");
}

/// Names that look like a listed tool but are not it (a Cyrillic і, a zero-width space, a
/// trailing space, another case) are tools the upstream does not list: refused, never sent on,
/// and never mistaken for the open `read`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn look_alike_and_invisible_tool_names_are_refused_and_never_forwarded() {
    let (_desk, mut agent) = hostile().await;
    for (i, name) in [
        "re\u{0430}d",
        "wr\u{0456}te",
        "read\u{200b}",
        "write ",
        "Read",
        "\u{202e}daer",
    ]
    .iter()
    .enumerate()
    {
        let id = 100 + i as u64;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": name, "arguments": {"path": "x", "text": "y"}}})
        .to_string();
        let reply = agent.request(&line, json!(id)).await;
        assert_eq!(
            reply["result"]["isError"],
            json!(true),
            "{name:?} was not refused: {reply}"
        );
        assert_eq!(
            reply["result"]["structuredContent"]["error"],
            json!("unlisted_tool"),
            "{name:?}: {reply}"
        );
    }
    agent.assert_no_call_reached_the_upstream().await;
}

/// A line longer than the largest frame is dropped by the pipe (it says so on stderr) without
/// taking anything down: the next message is answered, and nothing reached the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_larger_than_a_frame_is_dropped_and_the_session_goes_on() {
    let (_desk, mut agent) = hostile().await;
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":50,"method":"tools/call","params":{{"name":"write","arguments":{{"path":"x","text":"{}"}}}}}}"#,
        "a".repeat(countersign_wire::MAX_FRAME + 10)
    );
    agent.send(&huge).await;
    let reply = agent
        .request(r#"{"jsonrpc":"2.0","id":51,"method":"ping"}"#, json!(51))
        .await;
    assert!(reply["result"].is_object(), "{reply}");
    agent.assert_no_call_reached_the_upstream().await;
}

/// Malformed JSON-RPC and wrong types, end to end: text that is not JSON, a lone surrogate,
/// trailing data, a number as the whole message, a float or object id, another `jsonrpc`, a
/// method that is not a string. Each is an error and nothing reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_rpc_and_wrong_types_are_errors_and_never_reach_the_upstream() {
    let call =
        r#""method":"tools/call","params":{"name":"write","arguments":{"path":"x","text":"y"}}"#;
    each_is_an_error_and_nothing_reaches_the_upstream(&[
        ("nul", Value::Null),
        (r#"{"jsonrpc":"2.0","id":60,"#, Value::Null),
        (r#""\ud800""#, Value::Null),
        (
            &format!(r#"{{"jsonrpc":"2.0","id":61,{call}}} {{}}"#),
            Value::Null,
        ),
        ("42", Value::Null),
        (
            &format!(r#"{{"jsonrpc":"2.0","id":6.5,{call}}}"#),
            Value::Null,
        ),
        (
            &format!(r#"{{"jsonrpc":"2.0","id":{{"a":1}},{call}}}"#),
            Value::Null,
        ),
        (&format!(r#"{{"jsonrpc":"1.0","id":62,{call}}}"#), json!(62)),
        (
            r#"{"jsonrpc":"2.0","id":63,"method":["tools/call"],"params":{"name":"write"}}"#,
            json!(63),
        ),
    ])
    .await;
}
