//! The upstream transport (the desk's client side toward a stdio server it started): newline-delimited JSON-RPC over a child's stdio (or an in-process
//! pipe), which keeps the raw JSON `result` of responses to requests sent as
//! `ClientRequest::CustomRequest`.
//!
//! Why: rmcp's `ServerResult` is an untagged enum, so a `tools/list` response always becomes the
//! typed `ListToolsResult`, which drops every tool field rmcp does not model. The gateway must pass
//! tools on with every field the upstream sent, so it asks for `tools/list` as a custom request;
//! this transport remembers those request ids and hands their results back raw. Everything else
//! is rmcp's own typed handling, except what belongs to the session's open lane
//! ([`crate::lane`]): answers and progress under the lane's ids go straight to the gateway.

use countersign_core::sync::lock;
use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
};

use rmcp::{
    RoleClient,
    model::{
        ClientJsonRpcMessage, ClientRequest, CustomResult, JsonRpcMessage, RequestId,
        ServerJsonRpcMessage, ServerResult,
    },
    transport::Transport,
};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

use crate::children::{Children, Group};
use crate::lane::{Lane, SharedWriter, Upward};

/// See the module documentation.
pub struct RawPassthroughTransport<R> {
    reader: BufReader<R>,
    /// The line being read. Kept here, not in `receive`: rmcp polls `receive` inside a `select!`
    /// and drops it whenever another branch is ready first, and a line that arrived in pieces
    /// must survive that (a local buffer would lose the part already read, and with it the
    /// message).
    line: Vec<u8>,
    writer: SharedWriter,
    raw_ids: Arc<Mutex<HashSet<RequestId>>>,
    child: Option<tokio::process::Child>,
    group: Option<Group>,
    /// The session's open lane on this start, once opened.
    lane: Option<Arc<Lane>>,
    /// A lane frame taken from the upstream and not yet handed to the gateway's writer: kept
    /// here across a dropped `receive`, as `line` is.
    delivering: Option<Vec<u8>>,
    /// The rest of a line longer than [`MAX_LINE`] is being thrown away.
    skipping: bool,
}

/// The longest line the upstream may send: no message longer than a frame could reach the agent,
/// and a server that never ends its line must not fill the desk's memory.
const MAX_LINE: usize = countersign_wire::MAX_FRAME;

impl<R: AsyncRead + Unpin> RawPassthroughTransport<R> {
    /// Wraps a reader and writer (an in-process pipe).
    pub fn new(read: R, write: impl AsyncWrite + Unpin + Send + 'static) -> Self {
        Self {
            reader: BufReader::new(read),
            line: Vec::new(),
            writer: Arc::new(tokio::sync::Mutex::new(Some(Box::new(write)))),
            raw_ids: Default::default(),
            child: None,
            group: None,
            lane: None,
            delivering: None,
            skipping: false,
        }
    }
}

impl<R> RawPassthroughTransport<R> {
    /// Opens the session's lane on this transport (see [`crate::lane`]): answers to the lane's
    /// calls go to the gateway through `out`.
    pub fn open_lane(
        &mut self,
        out: tokio::sync::mpsc::Sender<countersign_wire::Frame>,
        shared: Arc<crate::upstream::Shared>,
    ) -> Arc<Lane> {
        let pid = self.child.as_ref().and_then(tokio::process::Child::id);
        let lane = Lane::open(self.writer.clone(), out, shared, pid);
        self.lane = Some(lane.clone());
        lane
    }
}

impl<R> Drop for RawPassthroughTransport<R> {
    fn drop(&mut self) {
        if let Some(lane) = &self.lane {
            // An answer taken from the upstream and not yet handed to the gateway's writer is
            // still the agent's (its call is no longer waiting, so `close` would not answer it).
            if let Some(bytes) = self.delivering.take() {
                let _ = lane.out().try_send(countersign_wire::Frame::Mcp(bytes));
            }
            lane.close();
        }
    }
}

impl RawPassthroughTransport<tokio::process::ChildStdout> {
    /// Spawns `cmd` in a process group of its own with piped stdin/stdout/stderr and wraps it;
    /// `stderr` receives what it writes there. The whole group is killed when the transport
    /// closes or is dropped, so a server that started helpers (`npx` starting `node`) leaves none.
    /// The returned handle finishes when the upstream's stderr closes: after a failed start,
    /// waiting on it lets the server's last words reach the gateway before the refusal does.
    pub fn spawn(
        mut cmd: tokio::process::Command,
        stderr: impl FnMut(Vec<u8>) + Send + 'static,
        children: Children,
    ) -> std::io::Result<(Self, tokio::task::JoinHandle<()>)> {
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let stdout = child.stdout.take().expect("piped");
        let stdin = child.stdin.take().expect("piped");
        let err = child.stderr.take().expect("piped");
        let stderr_done = tokio::spawn(pipe_stderr(err, stderr));
        let group = child.id().map(|pid| children.add(pid as i32));
        let mut t = Self::new(stdout, stdin);
        t.child = Some(child);
        t.group = group;
        Ok((t, stderr_done))
    }
}

impl<R> RawPassthroughTransport<R> {
    /// The process id of the upstream it started, if it started one.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(tokio::process::Child::id)
    }
}

/// Passes the upstream's stderr on in chunks, until it closes.
async fn pipe_stderr(
    mut err: tokio::process::ChildStderr,
    mut sink: impl FnMut(Vec<u8>) + Send + 'static,
) {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 8192];
    while let Ok(n) = err.read(&mut buf).await {
        if n == 0 {
            break;
        }
        sink(buf[..n].to_vec());
    }
}

impl<R> Transport<RoleClient> for RawPassthroughTransport<R>
where
    R: AsyncRead + Unpin + Send + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        if let JsonRpcMessage::Request(req) = &item
            && matches!(req.request, ClientRequest::CustomRequest(_))
        {
            lock(&self.raw_ids).insert(req.id.clone());
        }
        let writer = self.writer.clone();
        async move {
            let mut line = serde_json::to_vec(&item).map_err(std::io::Error::other)?;
            line.push(b'\n');
            let mut w = writer.lock().await;
            let Some(w) = w.as_mut() else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "closed",
                ));
            };
            w.write_all(&line).await?;
            w.flush().await
        }
    }

    async fn receive(&mut self) -> Option<rmcp::service::RxJsonRpcMessage<RoleClient>> {
        loop {
            if self.delivering.is_some()
                && let Some(lane) = &self.lane
            {
                // Cancel safe: the frame leaves `self.delivering` only once there is room for it.
                match lane.out().reserve().await {
                    Ok(room) => {
                        let bytes = self.delivering.take().expect("checked above");
                        room.send(countersign_wire::Frame::Mcp(bytes));
                    }
                    Err(_) => self.delivering = None, // the gateway is gone
                }
            }
            // Cancel safe: what `read_until` takes from the reader is appended to `self.line`
            // before it waits for more, so a dropped `receive` loses nothing.
            // At most what a line may still grow by: the rest of a longer one is thrown away.
            let room = MAX_LINE.saturating_sub(self.line.len()).max(1) as u64;
            let read = (&mut self.reader)
                .take(room)
                .read_until(b'\n', &mut self.line)
                .await;
            if read.is_err() || matches!(read, Ok(0) if self.line.is_empty()) {
                // EOF: the lane's calls still waiting are answered as lost.
                if let Some(lane) = &self.lane {
                    lane.close();
                }
                return None;
            }
            let ended = self.line.last() == Some(&b'\n') || matches!(read, Ok(0));
            if self.skipping || (!ended && self.line.len() >= MAX_LINE) {
                if !self.skipping {
                    tracing::warn!(target: "gateway", "dropped a line longer than {MAX_LINE} bytes from the upstream");
                }
                self.skipping = !ended;
                self.line.clear();
                continue;
            }
            if !ended {
                continue; // more of this line to come
            }
            // A whole line (or the last one, cut by EOF).
            let line = std::mem::take(&mut self.line);
            let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(line.trim_ascii())
            else {
                // Some servers print banners on stdout; they are not protocol.
                tracing::debug!(target: "gateway", "ignored a non-JSON line from the upstream");
                continue;
            };
            if let Some(lane) = &self.lane {
                match lane.take_upstream(&mut value) {
                    Upward::Agent(bytes) => {
                        self.delivering = Some(bytes);
                        continue;
                    }
                    Upward::Dropped => continue,
                    Upward::Session => {}
                }
            }
            // Raw path: a response to one of our CustomRequests.
            if value.get("result").is_some()
                && let Some(id) = value
                    .get("id")
                    .and_then(|id| serde_json::from_value::<RequestId>(id.clone()).ok())
                && lock(&self.raw_ids).remove(&id)
            {
                let result = value["result"].take();
                return Some(ServerJsonRpcMessage::response(
                    ServerResult::CustomResult(CustomResult::new(result)),
                    id,
                ));
            }
            if let Some(id) = value
                .get("id")
                .and_then(|id| serde_json::from_value::<RequestId>(id.clone()).ok())
                && value.get("error").is_some()
            {
                lock(&self.raw_ids).remove(&id);
            }
            match serde_json::from_value::<ServerJsonRpcMessage>(value) {
                Ok(m) => return Some(m),
                Err(e) => {
                    tracing::warn!(target: "gateway", error = %e, "ignored an unparsable message from the upstream");
                    continue;
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        if let Some(lane) = &self.lane {
            lane.close();
        }
        // closing stdin lets a well-behaved stdio server exit
        self.writer.lock().await.take();
        if let Some(mut child) = self.child.take()
            && tokio::time::timeout(std::time::Duration::from_secs(3), child.wait())
                .await
                .is_err()
        {
            let _ = child.kill().await;
        }
        // Whatever the server started and left behind goes with it.
        self.group.take();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncWriteExt;

    use super::*;

    #[tokio::test]
    async fn a_message_that_arrives_in_pieces_survives_a_receive_dropped_halfway() {
        let (upstream, desk) = tokio::io::duplex(1024);
        let (read, _write_half) = tokio::io::split(desk);
        let (_, mut upstream_out) = tokio::io::split(upstream);
        let mut transport = RawPassthroughTransport::new(read, tokio::io::sink());
        let message = br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#;
        let (first, rest) = message.split_at(20);
        upstream_out.write_all(first).await.unwrap();
        // rmcp's loop drops `receive` when another branch is ready first: here, a timeout that
        // fires once the first piece was read and the rest has not come.
        let dropped = tokio::time::timeout(Duration::from_millis(100), transport.receive()).await;
        assert!(dropped.is_err(), "nothing whole had arrived yet");
        upstream_out.write_all(rest).await.unwrap();
        upstream_out.write_all(b"\n").await.unwrap();
        let received = tokio::time::timeout(Duration::from_secs(10), transport.receive())
            .await
            .expect("the message was lost with the dropped receive")
            .expect("the whole message");
        assert!(
            matches!(received, JsonRpcMessage::Notification(_)),
            "{received:?}"
        );
    }

    #[tokio::test]
    async fn a_line_longer_than_a_frame_is_dropped_without_being_kept_and_the_next_is_read() {
        let (upstream, desk) = tokio::io::duplex(1 << 16);
        let (read, _write_half) = tokio::io::split(desk);
        let mut transport = RawPassthroughTransport::new(read, tokio::io::sink());
        let (_, mut upstream_out) = tokio::io::split(upstream);
        // A line with no end yet, a MiB longer than any frame (the frame's length, not the
        // constant under test, so that a bound raised past it fails here).
        let writer = tokio::spawn(async move {
            let chunk = vec![b'x'; 1 << 20];
            for _ in 0..=countersign_wire::MAX_FRAME / chunk.len() {
                upstream_out.write_all(&chunk).await.unwrap();
            }
            upstream_out
        });
        // The transport reads (so that the writer never waits on a full pipe for long) until the
        // whole unended line is written; `receive` is cancel safe, so dropping it loses nothing.
        let mut writer = std::pin::pin!(writer);
        let mut upstream_out = tokio::select! {
            received = transport.receive() => panic!("nothing whole has arrived: {received:?}"),
            written = &mut writer => written.unwrap(),
        };
        // Against the frame's length itself, not the constant under test.
        assert!(
            transport.line.len() <= countersign_wire::MAX_FRAME,
            "the desk kept {} bytes of one line",
            transport.line.len()
        );
        // The line's end and a message after it, written while the transport reads (the pipe
        // may still be full of the long line).
        tokio::spawn(async move {
            upstream_out.write_all(b"\n").await.unwrap();
            upstream_out
                .write_all(
                    b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n",
                )
                .await
                .unwrap();
            upstream_out
        });
        let received = tokio::time::timeout(Duration::from_secs(60), transport.receive())
            .await
            .expect("the message after the long line")
            .expect("a message");
        assert!(
            matches!(received, JsonRpcMessage::Notification(_)),
            "{received:?}"
        );
    }

    #[tokio::test]
    async fn a_last_line_without_its_newline_is_still_read_at_eof() {
        let (upstream, desk) = tokio::io::duplex(1024);
        let (read, _write_half) = tokio::io::split(desk);
        let mut transport = RawPassthroughTransport::new(read, tokio::io::sink());
        let (_, mut upstream_out) = tokio::io::split(upstream);
        upstream_out
            .write_all(br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#)
            .await
            .unwrap();
        drop(upstream_out);
        assert!(transport.receive().await.is_some());
        assert!(transport.receive().await.is_none());
    }
}
