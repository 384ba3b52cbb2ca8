//! The open lane: an open tool's call written to the upstream by the connection's reader, and
//! its answer written back to the gateway by the upstream's transport, past both rmcp sessions.
//!
//! Why: an open call is the hot path of every agent (reads, listings, searches), and through the
//! two rmcp sessions it cost about twice a bare two-process relay: a handler task spawned per
//! call on each side, six channel hand-offs, four parses and three serializations. The desk's
//! decision for such a call needs none of that: the router has judged the message (strictly, as
//! for every message), the session's last listing says the tool is open, and the engine agrees
//! (listed, classed open, its definition the pinned one). So the reader asks the session
//! ([`crate::Session`]) whether the lane may take the call; when every condition holds, it
//! writes the call to the upstream under an id of the desk's own, and the transport maps the
//! answer (and progress) back to the agent's id. Whenever any condition fails, the call takes
//! the full path, unchanged: the lane only ever skips work, never a decision.
//!
//! The lane takes a call only when:
//! - the agent and the upstream both negotiated a revision before 2026-07-28 through
//!   `initialize` (newer ones carry per-request metadata and `resultType` the full path handles);
//! - the upstream is a line-based one (a child's stdio, or the built-in tools) and the current
//!   start, whose tools were listed since it started and since it last said its list changed;
//! - the call carries nothing but a name, arguments and, in `_meta`, a progress token;
//! - the session's listing gates the tool `open` and [`Engine::forwards_open`] agrees.
//!
//! What the upstream sends back under a lane id is rebuilt for the agent (the result as sent,
//! less a `resultType` older agents must not see; an error's code, message and data), never
//! copied; a lane id the desk is not waiting for is dropped. When the upstream's output ends,
//! every call still waiting is answered `upstream_exited`, as on the full path, and the lane is
//! closed before any of them is answered: from then on the start counts as ended (see
//! `Opened::is_running` in [`crate::reach`]), so the agent's next call starts the upstream again
//! even if the client session has not yet read the end of the output, or the process lingers.
//!
//! [`Engine::forwards_open`]: countersign_engine::Engine::forwards_open

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use countersign_wire::Frame;
use rmcp::model::NumberOrString;
use rmcp::model::{
    CallToolRequestParams, ClientJsonRpcMessage, ClientNotification, ClientRequest, ErrorData,
    GetMeta, JsonObject, JsonRpcMessage, ProgressNotificationParam, ProgressToken, RequestId,
};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::agent::Session;
use crate::upstream::Shared;

/// What the upstream's transport writes to: a child's stdin, or the built-in tools' pipe.
pub type Writer = Box<dyn AsyncWrite + Unpin + Send>;
/// The writer, shared by the transport (rmcp's messages) and the lane (open calls); `None` once
/// the transport has closed it.
pub type SharedWriter = Arc<tokio::sync::Mutex<Option<Writer>>>;

/// The most calls waiting on one lane: beyond it a call takes the full path (whose own bounds
/// apply), so an agent that never waits for answers cannot grow the lane's table without end.
const MAX_WAITING: usize = 1024;

/// The longest agent's id (a string) a lane call may carry: each waiting call keeps it.
const MAX_ID: usize = 256;

/// How every id the lane gives a call begins. rmcp numbers its own requests, so a string of this
/// shape is never one of the client session's.
const PREFIX: &str = "countersign-open-";

/// One call in flight on the lane.
#[derive(Debug)]
struct Call {
    /// The id the agent gave it: the answer goes back under it.
    agent: RequestId,
    /// The agent's progress token, when it asked for progress.
    progress: Option<ProgressToken>,
    /// The tool, for the answer when the upstream exits.
    tool: String,
    /// Written whole to the upstream: if it exits now, whether the call ran is unknown.
    written: bool,
}

#[derive(Debug, Default)]
struct Calls {
    waiting: HashMap<String, Call>,
    /// The upstream's output has ended (or its transport closed): nothing more is sent.
    closed: bool,
    /// A write to the upstream failed: its input is broken, nothing more is sent.
    broken: bool,
}

/// One line for the upstream's input, and the lane's call it carries, if any.
struct Up {
    line: Vec<u8>,
    call: Option<String>,
}

/// How many lines may wait for the upstream's input: a full queue (an upstream that stopped
/// reading) sends the next call the full way, and never holds up the connection's reader.
const QUEUE: usize = 64;

/// The lane of one start of a line-based upstream. See the module documentation.
pub struct Lane {
    /// Lines for the writer task, which writes them in order.
    queue: mpsc::Sender<Up>,
    calls: Mutex<Calls>,
    next: AtomicU64,
    /// The gateway's frames, as the session's own messages go.
    out: mpsc::Sender<Frame>,
    shared: Arc<Shared>,
    /// The upstream's process, when the desk started one.
    pid: Option<u32>,
}

/// A call the lane could not hand to the upstream: it never reached it, and takes the full path.
#[derive(Debug)]
pub struct NotSent;

/// What the transport does with one message from the upstream.
#[derive(Debug, PartialEq)]
pub enum Upward {
    /// The lane's: this frame's bytes go to the gateway.
    Agent(Vec<u8>),
    /// The lane's, and nobody waits for it: dropped.
    Dropped,
    /// Not the lane's: for the client session.
    Session,
}

#[derive(Serialize)]
struct UpCall<'a> {
    jsonrpc: &'static str,
    id: &'a str,
    method: &'static str,
    params: UpParams<'a>,
}

#[derive(Serialize)]
struct UpParams<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    arguments: Option<&'a JsonObject>,
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    meta: Option<UpMeta<'a>>,
}

/// An answer for the agent, serialized straight from what it holds (no JSON value built).
#[derive(Serialize)]
struct ToAgent<'a> {
    jsonrpc: &'static str,
    id: &'a RequestId,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a ErrorData>,
}

#[derive(Serialize)]
struct UpMeta<'a> {
    #[serde(rename = "progressToken")]
    progress_token: &'a str,
}

fn lock(calls: &Mutex<Calls>) -> std::sync::MutexGuard<'_, Calls> {
    countersign_core::sync::lock(calls)
}

impl Lane {
    /// The lane of a transport writing to `writer` (to the process `pid`, when the desk started
    /// one); answers go to the gateway through `out`. Its lines are written by a task of their
    /// own, so that the connection's reader never waits on the upstream. Must be called inside a
    /// Tokio runtime.
    pub fn open(
        writer: SharedWriter,
        out: mpsc::Sender<Frame>,
        shared: Arc<Shared>,
        pid: Option<u32>,
    ) -> Arc<Self> {
        let (queue, lines) = mpsc::channel(QUEUE);
        let lane = Arc::new(Self {
            queue,
            calls: Mutex::default(),
            next: AtomicU64::new(1),
            out,
            shared,
            pid,
        });
        tokio::spawn(write_up(Arc::downgrade(&lane), writer, lines));
        lane
    }

    /// The upstream's process, when the desk started one.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Whether the upstream's output has ended or its input broke: the lane takes nothing more.
    pub fn is_closed(&self) -> bool {
        let calls = lock(&self.calls);
        calls.closed || calls.broken
    }

    /// Hands the agent's call `id` to the upstream under an id of the lane's own. `NotSent` when
    /// the lane cannot take it now (closed, broken, too many waiting, the upstream not reading):
    /// then it never reaches the upstream by the lane.
    pub fn send(
        &self,
        id: &RequestId,
        params: &CallToolRequestParams,
        progress: Option<ProgressToken>,
    ) -> Result<(), NotSent> {
        let own = format!("{PREFIX}{}", self.next.fetch_add(1, Ordering::Relaxed));
        let call = UpCall {
            jsonrpc: "2.0",
            id: &own,
            method: "tools/call",
            params: UpParams {
                name: &params.name,
                arguments: params.arguments.as_ref(),
                meta: progress.as_ref().map(|_| UpMeta {
                    progress_token: &own,
                }),
            },
        };
        let mut line = serde_json::to_vec(&call).map_err(|_| NotSent)?;
        line.push(b'\n');
        // Registered before it is queued: the answer can come before the writer says it wrote.
        let mut calls = lock(&self.calls);
        if calls.closed || calls.broken || calls.waiting.len() >= MAX_WAITING {
            return Err(NotSent);
        }
        let up = Up {
            line,
            call: Some(own.clone()),
        };
        // Queued under the lock, so that `close` and the writer see it registered.
        if self.queue.try_send(up).is_err() {
            return Err(NotSent);
        }
        let call = Call {
            agent: id.clone(),
            progress,
            tool: params.name.to_string(),
            written: false,
        };
        calls.waiting.insert(own, call);
        Ok(())
    }

    /// Cancels the agent's call `id` if it is the lane's: the upstream is told (under the lane's
    /// id, when its input takes it), and its answer, should it come, is dropped. `false` when
    /// the lane has no such call.
    pub fn cancel(&self, id: &RequestId) -> bool {
        let own = {
            let mut calls = lock(&self.calls);
            let Some(own) = calls
                .waiting
                .iter()
                .find(|(_, c)| &c.agent == id)
                .map(|(own, _)| own.clone())
            else {
                return false;
            };
            calls.waiting.remove(&own);
            own
        };
        let cancel = json!({
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": own, "reason": "cancelled by the agent"},
        });
        let mut line = cancel.to_string().into_bytes();
        line.push(b'\n');
        let _ = self.queue.try_send(Up { line, call: None });
        true
    }

    /// The writer wrote the call `own` whole.
    fn written(&self, own: &str) {
        if let Some(call) = lock(&self.calls).waiting.get_mut(own) {
            call.written = true;
        }
    }

    /// A write to the upstream failed: nothing more goes by the lane, and the call `own`, which
    /// the upstream cannot have read whole, is answered as not sent (nothing was executed).
    fn unsent(&self, own: Option<String>) {
        let call = {
            let mut calls = lock(&self.calls);
            calls.broken = true;
            own.and_then(|own| calls.waiting.remove(&own))
        };
        if let Some(call) = call {
            self.answer(vec![call]);
        }
    }

    /// Takes what is the lane's of one message from the upstream: an answer or progress under a
    /// lane id. A tool list that changed stops the lane at once, before the client session has
    /// read the notification: no call goes by the old listing.
    pub fn take_upstream(&self, message: &mut Value) -> Upward {
        let Some(object) = message.as_object_mut() else {
            return Upward::Session;
        };
        match object.get("method").and_then(Value::as_str) {
            None => {}
            Some("notifications/progress") => return self.progress(object),
            Some("notifications/tools/list_changed") => {
                self.shared.tools_changed();
                return Upward::Session;
            }
            Some(_) => return Upward::Session,
        }
        let Some(Value::String(own)) = object.get("id") else {
            return Upward::Session;
        };
        if !own.starts_with(PREFIX) {
            return Upward::Session;
        }
        let own = own.clone();
        let Some(call) = lock(&self.calls).waiting.remove(&own) else {
            // Answered already, cancelled, or never asked: nobody waits for it.
            return Upward::Dropped;
        };
        let answer = if let Some(mut result) = object.remove("result") {
            // Agents before 2026-07-28 must not see `resultType` (rmcp's rule on the full path).
            if let Some(r) = result.as_object_mut()
                && r.get("resultType") == Some(&json!("complete"))
            {
                r.remove("resultType");
            }
            serde_json::to_vec(&ToAgent {
                jsonrpc: "2.0",
                id: &call.agent,
                result: Some(&result),
                error: None,
            })
        } else if let Some(error) = object.get("error") {
            let error = serde_json::from_value::<ErrorData>(error.clone()).unwrap_or_else(|_| {
                ErrorData::internal_error(
                    "the upstream server answered with an error of the wrong shape",
                    None,
                )
            });
            serde_json::to_vec(&ToAgent {
                jsonrpc: "2.0",
                id: &call.agent,
                result: None,
                error: Some(&error),
            })
        } else {
            // Neither a result nor an error: not an answer (the full path ignores it too).
            lock(&self.calls).waiting.insert(own, call);
            return Upward::Dropped;
        };
        match answer {
            Ok(bytes) => Upward::Agent(bytes),
            // Not reached: a JSON value, an id and rmcp's error type always serialize.
            Err(_) => Upward::Dropped,
        }
    }

    /// Progress of a lane call, under the agent's own token; progress under a lane token nobody
    /// asked for is dropped.
    fn progress(&self, object: &mut JsonObject) -> Upward {
        let token = object
            .get("params")
            .and_then(|p| p.get("progressToken"))
            .and_then(Value::as_str);
        let Some(own) = token.filter(|t| t.starts_with(PREFIX)) else {
            return Upward::Session;
        };
        let agent = lock(&self.calls)
            .waiting
            .get(own)
            .and_then(|c| c.progress.clone());
        let Some(agent) = agent else {
            return Upward::Dropped;
        };
        let Some(params) = object
            .remove("params")
            .and_then(|p| serde_json::from_value::<ProgressNotificationParam>(p).ok())
        else {
            return Upward::Dropped;
        };
        // Rebuilt from what MCP defines, as the full path does.
        let mut progress = ProgressNotificationParam::new(agent, params.progress);
        progress.total = params.total;
        progress.message = params.message;
        let note =
            json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": progress});
        Upward::Agent(note.to_string().into_bytes())
    }

    /// The upstream's output has ended, or its transport closed: every call still waiting is
    /// answered (`upstream_exited`: one written whole may have run, one not written did not),
    /// and the lane takes nothing more.
    pub fn close(&self) {
        let waiting: Vec<Call> = {
            let mut calls = lock(&self.calls);
            calls.closed = true;
            calls.waiting.drain().map(|(_, c)| c).collect()
        };
        self.answer(waiting);
    }

    /// Answers `calls` for an upstream that went away, as the full path does.
    fn answer(&self, calls: Vec<Call>) {
        if calls.is_empty() {
            return;
        }
        let answers: Vec<Frame> = calls
            .into_iter()
            .map(|call| {
                let result = if call.written {
                    crate::agent::call_lost(&call.tool, None)
                } else {
                    crate::agent::call_not_sent(&call.tool, None)
                };
                let mut result = serde_json::to_value(result).unwrap_or_default();
                if let Some(r) = result.as_object_mut() {
                    r.remove("resultType");
                }
                let answer = json!({"jsonrpc": "2.0", "id": call.agent, "result": result});
                Frame::Mcp(answer.to_string().into_bytes())
            })
            .collect();
        let out = self.out.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    for answer in answers {
                        if out.send(answer).await.is_err() {
                            break;
                        }
                    }
                });
            }
            Err(_) => {
                for answer in answers {
                    let _ = out.try_send(answer);
                }
            }
        }
    }

    /// Where the lane's answers go.
    pub fn out(&self) -> &mpsc::Sender<Frame> {
        &self.out
    }
}

/// Writes the lane's lines to the upstream's input, in order, until the lane is gone. After a
/// failed write, every line still queued is a call not sent.
async fn write_up(lane: Weak<Lane>, writer: SharedWriter, mut lines: mpsc::Receiver<Up>) {
    while let Some(up) = lines.recv().await {
        let written = {
            let mut writer = writer.lock().await;
            match writer.as_mut() {
                Some(w) => w.write_all(&up.line).await.is_ok() && w.flush().await.is_ok(),
                None => false,
            }
        };
        let Some(lane) = lane.upgrade() else {
            return;
        };
        match (written, up.call) {
            (true, Some(own)) => lane.written(&own),
            (true, None) => {}
            (false, own) => {
                lane.unsent(own);
                while let Ok(up) = lines.try_recv() {
                    lane.unsent(up.call);
                }
            }
        }
    }
}

/// The way into the lane from the connection's reader, open once the session exists.
#[derive(Default)]
pub struct Door {
    session: OnceLock<Session>,
}

impl Door {
    /// Lets the reader offer calls to `session`.
    pub fn open_to(&self, session: Session) {
        let _ = self.session.set(session);
    }

    /// Takes `message` onto the lane when it is an open call the lane may take (or the agent's
    /// cancel of a lane call): `None` once taken; otherwise the message, for the session.
    pub async fn offer(&self, message: ClientJsonRpcMessage) -> Option<ClientJsonRpcMessage> {
        let Some(session) = self.session.get() else {
            return Some(message);
        };
        match &message {
            JsonRpcMessage::Request(r) => {
                let ClientRequest::CallToolRequest(call) = &r.request else {
                    return Some(message);
                };
                let params = &call.params;
                let meta = r.request.get_meta();
                let plain = params.meta.is_none()
                    && params.request_state.is_none()
                    && params.input_responses.is_none()
                    && meta.0.keys().all(|k| k == "progressToken");
                if !plain {
                    return Some(message);
                }
                // An id longer than any client uses is the full path's to keep, not the lane's.
                if matches!(&r.id, NumberOrString::String(id) if id.len() > MAX_ID) {
                    return Some(message);
                }
                let progress = meta.get_progress_token();
                // Not for the lane: the full path decides (never `?` here: `None` means taken).
                let Some(lane) = session.lane_for(&params.name) else {
                    return Some(message);
                };
                match lane.send(&r.id, params, progress) {
                    Ok(()) => {
                        session.forwarded_open();
                        None
                    }
                    Err(NotSent) => Some(message),
                }
            }
            JsonRpcMessage::Notification(n) => {
                let ClientNotification::CancelledNotification(cancel) = &n.notification else {
                    return Some(message);
                };
                let Some(id) = &cancel.params.request_id else {
                    return Some(message);
                };
                match session.current_lane() {
                    Some(lane) if lane.cancel(id) => None,
                    _ => Some(message),
                }
            }
            _ => Some(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane() -> (Arc<Lane>, mpsc::Receiver<Frame>, tokio::io::DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let writer: SharedWriter = Arc::new(tokio::sync::Mutex::new(Some(Box::new(ours))));
        let (out, rx) = mpsc::channel(16);
        (Lane::open(writer, out, Arc::default(), None), rx, theirs)
    }

    /// The next line the lane wrote, read a byte at a time (nothing after it is taken).
    async fn sent_line(theirs: &mut tokio::io::DuplexStream) -> Value {
        use tokio::io::AsyncReadExt;
        let mut line = Vec::new();
        loop {
            let byte = theirs.read_u8().await.unwrap();
            if byte == b'\n' {
                break;
            }
            line.push(byte);
        }
        serde_json::from_slice(&line).unwrap()
    }

    fn call(name: &str) -> CallToolRequestParams {
        let args = json!({"message": "hi"}).as_object().cloned().unwrap();
        CallToolRequestParams::new(name.to_owned()).with_arguments(args)
    }

    fn answer(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[tokio::test]
    async fn a_call_goes_up_under_the_lanes_id_and_its_result_comes_back_under_the_agents() {
        let (lane, _rx, mut theirs) = lane();
        let agent = RequestId::String("a-7".into());
        lane.send(&agent, &call("echo"), None).unwrap();
        let up = sent_line(&mut theirs).await;
        assert_eq!(up["method"], "tools/call");
        assert_eq!(
            up["params"],
            json!({"name": "echo", "arguments": {"message": "hi"}})
        );
        let own = up["id"].as_str().unwrap().to_owned();
        assert!(own.starts_with(PREFIX));
        let mut reply = json!({"jsonrpc": "2.0", "id": own, "result": {"content": [], "resultType": "complete", "extra": 1}});
        let Upward::Agent(bytes) = lane.take_upstream(&mut reply) else {
            panic!("the lane's answer");
        };
        assert_eq!(
            answer(&bytes),
            json!({"jsonrpc": "2.0", "id": "a-7", "result": {"content": [], "extra": 1}})
        );
        // Answered once: the same id again is nobody's.
        let mut again = json!({"jsonrpc": "2.0", "id": own, "result": {}});
        assert_eq!(lane.take_upstream(&mut again), Upward::Dropped);
    }

    #[tokio::test]
    async fn ids_and_messages_that_are_not_the_lanes_go_to_the_session() {
        let (lane, _rx, _theirs) = lane();
        for mut m in [
            json!({"jsonrpc": "2.0", "id": 3, "result": {}}),
            json!({"jsonrpc": "2.0", "id": "3", "result": {}}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "roots/list"}),
            json!({"jsonrpc": "2.0", "id": "countersign-open-1", "method": "sampling/createMessage"}),
            json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 0, "progress": 1}}),
            json!([1]),
        ] {
            assert_eq!(lane.take_upstream(&mut m), Upward::Session, "{m}");
        }
        let mut forged = json!({"jsonrpc": "2.0", "id": "countersign-open-99", "result": {}});
        assert_eq!(lane.take_upstream(&mut forged), Upward::Dropped);
    }

    #[tokio::test]
    async fn an_error_is_rebuilt_and_a_malformed_one_becomes_an_internal_error() {
        let (lane, _rx, mut theirs) = lane();
        for (i, (error, code)) in [
            (
                json!({"code": -32602, "message": "bad", "data": {"x": 1}, "extra": true}),
                -32602,
            ),
            (json!({"code": "nope", "message": 5}), -32603),
        ]
        .into_iter()
        .enumerate()
        {
            let agent = RequestId::Number(i as i64);
            lane.send(&agent, &call("echo"), None).unwrap();
            let own = sent_line(&mut theirs).await["id"].clone();
            let mut reply = json!({"jsonrpc": "2.0", "id": own, "error": error});
            let Upward::Agent(bytes) = lane.take_upstream(&mut reply) else {
                panic!("the lane's answer");
            };
            let a = answer(&bytes);
            assert_eq!(a["id"], json!(i));
            assert_eq!(a["error"]["code"], json!(code), "{a}");
            assert!(a["error"].get("extra").is_none(), "{a}");
        }
    }

    #[tokio::test]
    async fn progress_goes_to_the_agent_under_its_token_and_nobody_elses_is_dropped() {
        let (lane, _rx, mut theirs) = lane();
        let agent = RequestId::Number(1);
        let token = ProgressToken(rmcp::model::NumberOrString::String("mine".into()));
        lane.send(&agent, &call("slow"), Some(token)).unwrap();
        let up = sent_line(&mut theirs).await;
        let own = up["id"].clone();
        assert_eq!(up["params"]["_meta"], json!({"progressToken": own}));
        let mut note = json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": own, "progress": 2, "total": 4, "message": "half", "junk": 1}});
        let Upward::Agent(bytes) = lane.take_upstream(&mut note) else {
            panic!("progress for the agent");
        };
        assert_eq!(
            answer(&bytes)["params"],
            json!({"progressToken": "mine", "progress": 2.0, "total": 4.0, "message": "half"})
        );
        let mut stray = json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "countersign-open-42", "progress": 1}});
        assert_eq!(lane.take_upstream(&mut stray), Upward::Dropped);
    }

    #[tokio::test]
    async fn a_changed_tool_list_stops_the_lane_before_the_session_reads_it() {
        let (lane, _rx, _theirs) = lane();
        let before = lane.shared.tools_epoch.load(Ordering::Acquire);
        let mut changed = json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"});
        assert_eq!(lane.take_upstream(&mut changed), Upward::Session);
        assert_ne!(lane.shared.tools_epoch.load(Ordering::Acquire), before);
    }

    #[tokio::test]
    async fn calls_waiting_when_the_upstream_ends_are_answered_as_exited_and_no_more_are_sent() {
        let (lane, mut rx, mut theirs) = lane();
        lane.send(&RequestId::Number(5), &call("echo"), None)
            .unwrap();
        let _ = sent_line(&mut theirs).await;
        lane.close();
        let Some(Frame::Mcp(bytes)) = rx.recv().await else {
            panic!("an answer for the waiting call");
        };
        let a = answer(&bytes);
        assert_eq!(a["id"], 5);
        assert_eq!(a["result"]["isError"], true);
        assert_eq!(a["result"]["structuredContent"]["error"], "upstream_exited");
        assert!(a["result"].get("resultType").is_none());
        assert!(lane.is_closed());
        assert!(
            lane.send(&RequestId::Number(6), &call("echo"), None)
                .is_err()
        );
    }

    #[tokio::test]
    async fn a_lane_full_of_unanswered_calls_sends_the_next_the_full_way() {
        let (lane, _rx, _theirs) = lane();
        for i in 0..MAX_WAITING {
            lane.send(&RequestId::Number(i as i64), &call("echo"), None)
                .unwrap();
            // The writer task takes each line as it comes (the queue holds few).
            tokio::task::yield_now().await;
        }
        let next = RequestId::Number(MAX_WAITING as i64);
        assert!(lane.send(&next, &call("echo"), None).is_err());
    }

    #[tokio::test]
    async fn a_call_that_cannot_be_written_is_not_sent_and_a_cancel_reaches_the_upstream() {
        let (lane, mut rx, mut theirs) = lane();
        lane.send(&RequestId::Number(1), &call("echo"), None)
            .unwrap();
        let own = sent_line(&mut theirs).await["id"].clone();
        assert!(lane.cancel(&RequestId::Number(1)));
        let cancel = sent_line(&mut theirs).await;
        assert_eq!(cancel["method"], "notifications/cancelled");
        assert_eq!(cancel["params"]["requestId"], own);
        assert!(!lane.cancel(&RequestId::Number(1)), "once");
        // Its late answer is nobody's.
        let mut late = json!({"jsonrpc": "2.0", "id": own, "result": {}});
        assert_eq!(lane.take_upstream(&mut late), Upward::Dropped);
        // An upstream whose input is gone: the call was never read, and says so; the lane then
        // takes nothing more.
        drop(theirs);
        lane.send(&RequestId::Number(2), &call("echo"), None)
            .unwrap();
        let Some(Frame::Mcp(bytes)) = rx.recv().await else {
            panic!("an answer for the call not sent");
        };
        let a = answer(&bytes);
        assert_eq!(a["id"], 2);
        assert_eq!(a["result"]["structuredContent"]["error"], "upstream_exited");
        let said = a["result"]["content"][0]["text"].as_str().unwrap();
        assert!(said.contains("nothing was executed"), "{said}");
        assert!(lane.is_closed());
        assert!(
            lane.send(&RequestId::Number(3), &call("echo"), None)
                .is_err()
        );
    }

    #[tokio::test]
    async fn an_upstream_that_stops_reading_fills_the_queue_and_the_next_calls_go_the_full_way() {
        // An upstream input with room for one line, never read.
        let (ours, _theirs) = tokio::io::duplex(64);
        let writer: SharedWriter = Arc::new(tokio::sync::Mutex::new(Some(Box::new(ours))));
        let (out, _rx) = mpsc::channel(16);
        let lane = Lane::open(writer, out, Arc::default(), None);
        let mut taken = 0;
        let mut refused = 0;
        for id in 0..(4 * QUEUE as i64) {
            // The writer runs between calls, as it would between the reader's messages.
            tokio::task::yield_now().await;
            match lane.send(&RequestId::Number(id), &call("echo"), None) {
                Ok(()) => taken += 1,
                Err(NotSent) => refused += 1,
            }
        }
        // The writer holds one line it cannot finish and the queue the next QUEUE; every call
        // after them is refused at once (well below the lane's limit of waiting calls), and
        // none of this waited on the upstream.
        assert!(taken <= QUEUE + 1, "{taken} taken");
        assert_eq!(taken + refused, 4 * QUEUE);
        assert!(refused >= 3 * QUEUE - 1, "{refused} refused");
        assert!(!lane.is_closed(), "a slow upstream is not a closed one");
    }
}
