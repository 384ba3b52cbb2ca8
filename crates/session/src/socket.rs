//! The desk's end of the local socket.
//!
//! A Unix domain socket at [`countersign_wire::socket_path`], created inside a directory only
//! this account controls (0700, or 0711 when other accounts are listed, see `peer`) and itself
//! 0600; each connection's peer uid is checked with the kernel. Binding it is the
//! single-instance lock: if a live desk answers on the path, a second one refuses to start; a
//! stale file left by a crash is replaced. Each connection is one gateway: its hello says what to
//! reach, the desk reaches it (starting the upstream as its own child), answers with a tenant,
//! and then runs the MCP session between the gateway's `M` frames and the upstream until the
//! gateway goes away (an upstream that exits is started again by the next request) or the desk
//! stops serving, which closes every connection at once.
//!
//! Everything is bounded, since the peer may be hostile: until its first message (or its agent's
//! stdio handed over) a connection is a task, not a thread, and it has
//! [`Options::hello_deadline`] to say hello; an account holds at most
//! [`Options::max_connections`]; a frame that has begun must complete within
//! [`Options::frame_deadline`], and a frame's memory follows the bytes that arrived. A malformed,
//! oversized or stalled frame closes that connection only.
#![allow(unsafe_code)] // this module reaches the OS through libc; each unsafe block says why it is sound

use countersign_core::Tenant;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use countersign_engine::Engine;
use countersign_wire::{
    Frame, FrameError, Hello, PROTOCOL_VERSION, RefusedCode, Welcome, read_frame_within,
    write_frame,
};
use rmcp::model::ClientJsonRpcMessage;
use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::children::Children;
use crate::{peer, reach};

/// The socket could not be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SocketError {
    /// Another desk already answers on this path.
    #[error("a Countersign desk is already running (socket {0})")]
    AlreadyRunning(PathBuf),
    /// The socket or its directory could not be set up.
    #[error("cannot set up the socket {path}: {source}")]
    Setup {
        /// The socket's path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// A running socket server; dropping it (or calling [`Served::stop`]) stops accepting and removes
/// the socket file.
#[derive(Debug)]
pub struct Served {
    path: PathBuf,
    task: JoinHandle<()>,
    children: Children,
    stopping: CancellationToken,
}

impl Served {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The upstream processes started for connections, live now.
    pub fn children(&self) -> &Children {
        &self.children
    }

    /// Stops accepting connections, closes every open one, removes the socket file and kills
    /// every upstream.
    pub fn stop(self) {}
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
        self.stopping.cancel();
        self.children.kill_all();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// How the desk serves its sessions.
#[derive(Debug, Clone)]
pub struct Options {
    /// How long a preflight waits for a person when the gateway does not say.
    pub default_wait: Duration,
    /// The longest wait a gateway may ask for.
    pub max_wait: Duration,
    /// How long a new connection has to send its hello.
    pub hello_deadline: Duration,
    /// How long an upstream has to start and complete the MCP handshake.
    pub upstream_deadline: Duration,
    /// User ids besides the desk's own that may connect: the accounts listed in the desk's
    /// settings, for agents that run under accounts of their own. They may reach URLs and
    /// registered servers only (see `peer`). When there are any, the socket's directory is 0711
    /// so that they can pass through it.
    pub other_accounts: Vec<u32>,
    /// How long a frame may take to arrive once its first byte has: a peer that sends all but
    /// the last byte is closed, not waited for.
    pub frame_deadline: Duration,
    /// The most connections one account may have open at once (each session is a thread and,
    /// once it calls, an upstream process); beyond it a new one is refused `busy`.
    pub max_connections: usize,
    /// The servers registered in the desk (`--server NAME`, `countersign server ...`); without
    /// one every name is unknown and the registry's requests are refused.
    pub registry: Option<countersign_registry::Registry>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            default_wait: Duration::from_secs(45),
            max_wait: Duration::from_secs(10 * 60),
            hello_deadline: Duration::from_secs(10),
            upstream_deadline: Duration::from_secs(60),
            other_accounts: Vec::new(),
            frame_deadline: Duration::from_secs(30),
            max_connections: 2048,
            registry: None,
        }
    }
}

fn setup_error(path: &Path) -> impl FnOnce(io::Error) -> SocketError + '_ {
    move |source| SocketError::Setup {
        path: path.to_owned(),
        source,
    }
}

/// Lets the desk hold as many descriptors as the system allows it (the soft limit raised to the
/// hard one): each connection is one, each upstream three more, and a default of 1,024 would let
/// a crowd of idle connections lock every later agent out before the per-account limit does.
fn raise_descriptor_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                tracing::debug!(target: "desk", "could not raise the descriptor limit");
            }
        }
    }
}

/// Binds the socket at `path` and serves `engine` on it with default [`Options`] until the
/// returned [`Served`] is dropped. Must be called inside a Tokio runtime.
pub async fn serve(engine: Engine, path: PathBuf) -> Result<Served, SocketError> {
    serve_with(engine, path, Options::default()).await
}

/// [`serve`] with options.
pub async fn serve_with(
    engine: Engine,
    path: PathBuf,
    options: Options,
) -> Result<Served, SocketError> {
    if let Some(dir) = path.parent() {
        // Refused when another account owns it or can write into it (it may be in /tmp).
        countersign_wire::prepare_socket_dir(dir, !options.other_accounts.is_empty())
            .map_err(setup_error(&path))?;
    }
    raise_descriptor_limit();
    let listener = match UnixListener::bind(&path) {
        Ok(listener) => listener,
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            if UnixStream::connect(&path).await.is_ok() {
                return Err(SocketError::AlreadyRunning(path));
            }
            // Nobody answers: a file left by a desk that crashed.
            std::fs::remove_file(&path).map_err(setup_error(&path))?;
            UnixListener::bind(&path).map_err(setup_error(&path))?
        }
        Err(e) => return Err(setup_error(&path)(e)),
    };
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(setup_error(&path))?;
    tracing::info!(target: "desk", socket = %path.display(), "listening");
    let children = Children::default();
    let stopping = CancellationToken::new();
    let desk = Desk {
        engine,
        options,
        children: children.clone(),
        slots: Slots::default(),
        stopping: stopping.clone(),
    };
    let task = tokio::spawn(async move {
        loop {
            match listener.accept().await {
                // Until its first message, a connection is a task here, not a thread: a crowd of
                // silent or half-sent connections costs little, and each meets its deadline.
                Ok((stream, _)) => {
                    tokio::spawn(introduce(desk.clone(), stream));
                }
                Err(err) => {
                    tracing::warn!(target: "desk", error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
    Ok(Served {
        path,
        task,
        children,
        stopping,
    })
}

/// The most threads one connection's runtime keeps for blocking work.
const SESSION_BLOCKING_THREADS: usize = 32;

/// Serves one connection on a thread of its own, with a single-threaded runtime: a session's
/// tasks (the router, both rmcp sessions, the socket's reader and writer, the upstream's pipes)
/// hand every message to each other, and on one thread those hand-offs are plain polls instead of
/// wake-ups across threads, which cost most of a call's time in the desk when measured. The engine
/// is shared across threads as before; its channels do not care which runtime waits on them.
///
/// A thread and its runtime cost far more than a task (about half a megabyte in a debug build,
/// measured), so a connection gets one only once it has something to serve: its first message,
/// or the agent's stdio handed over. Until then it waits as a task, and a crowd of connections
/// that said hello and then stalled costs what a crowd of silent ones does.
fn on_its_own_thread<F, Fut>(stream: UnixStream, slot: Slot, serve: F)
where
    F: FnOnce(UnixStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let stream = match stream.into_std() {
        Ok(stream) => stream,
        Err(err) => {
            tracing::warn!(target: "desk", error = %err, "could not take over a connection");
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("countersign-session".into())
        .spawn(move || {
            let _slot = slot;
            let runtime = match tokio::runtime::Builder::new_current_thread()
                // What one connection runs on the blocking pool is mostly bounded on its own
                // (its turns at the records, one description at a time, a preview per waiting
                // request): about twenty at once. This cap holds the pool there whatever else
                // runs on it, so that one agent cannot grow the desk's threads toward tokio's
                // default of 512. Tasks past it wait their turn in order.
                .max_blocking_threads(SESSION_BLOCKING_THREADS)
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(err) => {
                    tracing::error!(target: "desk", error = %err, "no runtime for a session");
                    return;
                }
            };
            runtime.block_on(async move {
                match UnixStream::from_std(stream) {
                    Ok(stream) => serve(stream).await,
                    Err(err) => {
                        tracing::warn!(target: "desk", error = %err, "could not serve a connection")
                    }
                }
            });
        });
    if let Err(err) = spawned {
        tracing::error!(target: "desk", error = %err, "no thread for a session");
    }
}

/// Open connections per account, so that one account cannot take every thread and descriptor.
#[derive(Clone, Default)]
struct Slots(std::sync::Arc<std::sync::Mutex<std::collections::HashMap<u32, usize>>>);

/// One open connection's place among its account's; given back when dropped.
struct Slot {
    slots: Slots,
    uid: u32,
}

impl Slots {
    fn take(&self, uid: u32, max: usize) -> Option<Slot> {
        let mut counts = countersign_core::sync::lock(&self.0);
        let count = counts.entry(uid).or_default();
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(Slot {
            slots: self.clone(),
            uid,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = countersign_core::sync::lock(&self.slots.0);
        if let Some(count) = counts.get_mut(&self.uid) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.uid);
            }
        }
    }
}

/// A gateway's hello, taken apart, and the account it came from.
struct Introduced {
    peer: peer::Peer,
    version: u32,
    reach: countersign_wire::Reach,
    label: Option<String>,
    wait_ms: Option<u64>,
    pid: u32,
}

/// A gateway the desk admitted: what it reaches (resolved, with the registry's secrets when it
/// names a registered server), and the tenant the engine gave it.
struct Admitted {
    tenant: Tenant,
    reach: countersign_wire::Reach,
    headers: reach::Headers,
    registered: Option<(countersign_registry::Registry, String)>,
    wait_ms: Option<u64>,
}

/// Where a connection's first message comes from.
enum First {
    /// The gateway hands over the agent's stdio: the welcome says so, and the messages come on it.
    HandOver,
    /// The gateway was welcomed and sent this message on the socket, whole.
    Message(Vec<u8>),
}

/// A new connection, up to its hello: the peer's account, the per-account limit, the hello
/// within its deadline. A focus request ends here; a gateway moves to a thread of its own.
async fn introduce(desk: Desk, mut stream: UnixStream) {
    let peer = match peer::identify(&stream, &desk.options.other_accounts) {
        Ok(peer) => peer,
        Err(refused) => {
            tracing::warn!(target: "desk", uid = ?refused.0, "refused a connection from an account not listed in the settings");
            // Say why, then read what the gateway sent (closing on unread bytes would reset the
            // connection before it reads the answer).
            let answer = Frame::Welcome(Welcome::Refused {
                code: RefusedCode::AccountNotAllowed,
                message: refused.message(),
            });
            if write_frame(&mut stream, &answer).await.is_ok() {
                let deadline = desk.options.hello_deadline;
                let _ =
                    tokio::time::timeout(deadline, read_frame_within(&mut stream, Some(deadline)))
                        .await;
            }
            return;
        }
    };
    let uid = stream.peer_cred().map(|c| c.uid()).unwrap_or(u32::MAX);
    let Some(slot) = desk.slots.take(uid, desk.options.max_connections) else {
        tracing::warn!(target: "desk", uid, "refused a connection: the account has too many open");
        let message = format!(
            "the desk already serves {} connections of this account, the most it allows. Nothing \
             was started. Next: close agents no longer in use, then start this one again",
            desk.options.max_connections
        );
        let refused = Frame::Welcome(Welcome::Refused {
            code: RefusedCode::Busy,
            message,
        });
        // As for an account not allowed: answer, then read the hello, so that closing does not
        // reset the connection before the gateway reads why.
        let deadline = desk.options.hello_deadline;
        if write_frame(&mut stream, &refused).await.is_ok() {
            let _ = tokio::time::timeout(deadline, read_frame_within(&mut stream, Some(deadline)))
                .await;
        }
        return;
    };
    let deadline = desk.options.hello_deadline;
    let hello = match tokio::time::timeout(deadline, read_frame_within(&mut stream, Some(deadline)))
        .await
    {
        Ok(Ok(Frame::Hello(hello))) => hello,
        Ok(Ok(other)) => {
            tracing::warn!(target: "desk", "a connection opened with {other:?} instead of a hello");
            return;
        }
        Ok(Err(err)) => {
            tracing::warn!(target: "desk", error = %err, "connection closed before its hello");
            return;
        }
        Err(_) => {
            tracing::warn!(target: "desk", "a connection sent no hello in time");
            return;
        }
    };
    match hello {
        Hello::Focus { request, .. } => match focus_request(peer, request) {
            Some(id) => desk.engine.request_focus_on(id),
            None => desk.engine.request_focus(),
        },
        Hello::Registry { version, request } => {
            let origin = match stream.peer_cred().ok().and_then(|c| c.pid()) {
                Some(pid) => format!("the command line (`countersign`, pid {pid})"),
                None => "the command line (`countersign`)".to_owned(),
            };
            crate::registry::serve(
                desk.options.registry.clone(),
                peer,
                version,
                request,
                origin,
                stream,
            )
            .await;
        }
        Hello::Gateway {
            version,
            reach,
            label,
            wait_ms,
            pid,
            stdio,
        } => {
            if desk.stopping.is_cancelled() {
                // Said hello as the desk stopped: closed, as every open connection is.
                return;
            }
            let hello = Introduced {
                peer,
                version,
                reach,
                label,
                wait_ms,
                pid,
            };
            #[cfg(not(target_os = "linux"))]
            let stdio = false;
            if stdio {
                // The agent's stdio comes next, and its messages on it: taken on the session's
                // thread, where its pipes are read.
                on_its_own_thread(stream, slot, move |mut stream| async move {
                    if let Some(admitted) = admit(&desk, &mut stream, hello).await {
                        connection(desk, stream, admitted, First::HandOver).await;
                    }
                });
                return;
            }
            let Some(admitted) = admit(&desk, &mut stream, hello).await else {
                return;
            };
            let first = tokio::select! {
                first = welcome_and_first(&mut stream, &admitted.tenant, desk.options.frame_deadline) => first,
                () = desk.stopping.cancelled() => None,
            };
            match first {
                Some(first) => on_its_own_thread(stream, slot, move |stream| {
                    connection(desk, stream, admitted, First::Message(first))
                }),
                None => desk.engine.disconnect(&admitted.tenant).await,
            }
        }
        other => {
            tracing::warn!(target: "desk", "a hello this desk does not know: {other:?}");
        }
    }
}

/// What every connection shares.
#[derive(Clone)]
struct Desk {
    engine: Engine,
    options: Options,
    children: Children,
    slots: Slots,
    /// Cancelled when the desk stops serving: every connection closes.
    stopping: CancellationToken,
}

/// Checks a gateway's hello (its protocol version, what its account may reach, what it names)
/// and connects it to the engine; `None` once it has been told why not.
async fn admit(desk: &Desk, stream: &mut UnixStream, hello: Introduced) -> Option<Admitted> {
    let Introduced {
        peer,
        version,
        reach,
        label,
        wait_ms,
        pid,
    } = hello;
    let refuse =
        |code: RefusedCode, message: String| Frame::Welcome(Welcome::Refused { code, message });
    if version != PROTOCOL_VERSION {
        let message = format!(
            "this desk speaks protocol version {PROTOCOL_VERSION}, the gateway {version}: \
             update Countersign so that both come from the same release, and restart the desk"
        );
        tracing::warn!(target: "desk", "{message}");
        let _ = write_frame(stream, &refuse(RefusedCode::VersionMismatch, message)).await;
        return None;
    }

    if let Err(refusal) = peer.may_reach(&reach) {
        tracing::warn!(target: "desk", ?peer, ?reach, "{}", refusal.message);
        let _ = write_frame(stream, &refuse(refusal.code, refusal.message)).await;
        return None;
    }

    // What to reach is checked before anything starts: a name the desk does not know, or a
    // malformed hello, is refused at once. A registered name becomes what the registry has on
    // record for it, with its secrets, and never what the gateway says.
    let registered = match &reach {
        countersign_wire::Reach::Server { name } => desk
            .options
            .registry
            .clone()
            .map(|registry| (registry, name.clone())),
        _ => None,
    };
    let (reach, headers, identity) = match reach::resolve(reach, desk.options.registry.as_ref()) {
        Ok(resolved) => resolved,
        Err(refusal) => {
            tracing::warn!(target: "desk", "{}", refusal.message);
            let _ = write_frame(stream, &refuse(refusal.code, refusal.message)).await;
            return None;
        }
    };

    let tenant = desk.engine.connect(identity.clone());
    tracing::info!(target: "desk", %tenant, server = %identity, label = label.as_deref().unwrap_or(""), pid, "gateway connected");
    Some(Admitted {
        tenant,
        reach,
        headers,
        registered,
        wait_ms,
    })
}

/// Welcomes an admitted gateway that keeps its agent's stdio, and waits (as a task, without a
/// thread) for its first message: `None` when the connection ends first or sends anything else.
/// Waiting for a frame to begin has no limit (an agent may be slow to say `initialize`); once
/// begun, it has `frame_deadline`. Read unbuffered, so no byte past the frame is taken from
/// the session that follows.
async fn welcome_and_first(
    stream: &mut UnixStream,
    tenant: &Tenant,
    frame_deadline: Duration,
) -> Option<Vec<u8>> {
    let welcome = Frame::Welcome(Welcome::Accepted {
        version: PROTOCOL_VERSION,
        tenant: tenant.to_string(),
        stdio: false,
    });
    if let Err(err) = write_frame(&mut *stream, &welcome).await {
        tracing::debug!(target: "desk", %tenant, error = %err, "could not welcome a gateway");
        return None;
    }
    match read_frame_within(stream, Some(frame_deadline)).await {
        Ok(Frame::Mcp(bytes)) => Some(bytes),
        Ok(other) => {
            tracing::warn!(target: "desk", %tenant, "closing a connection that sent {other:?}");
            None
        }
        Err(FrameError::Closed) => {
            tracing::info!(target: "desk", %tenant, "gateway disconnected before its first message");
            None
        }
        Err(err) => {
            tracing::warn!(target: "desk", %tenant, error = %err, "closing a connection that sent a bad frame");
            None
        }
    }
}

/// Serves one admitted connection: reaching the upstream, then the MCP session.
async fn connection(desk: Desk, stream: UnixStream, admitted: Admitted, first: First) {
    let Admitted {
        tenant,
        reach,
        headers,
        registered,
        wait_ms,
    } = admitted;
    let (reader, mut writer) = stream.into_split();
    // Buffered: a frame is its length and its body, one read rather than two.
    let mut reader = tokio::io::BufReader::with_capacity(64 * 1024, reader);
    let refuse =
        |code: RefusedCode, message: String| Frame::Welcome(Welcome::Refused { code, message });
    let (stdio, mut first) = match first {
        First::HandOver => (true, None),
        First::Message(bytes) => (false, Some(bytes)),
    };
    // Where the gateway offers the agent's stdio, the desk takes it (see `handed`): the welcome
    // says so, and the descriptors must come next, before anything else is read or written.
    #[cfg(target_os = "linux")]
    let handed = if stdio {
        let welcome = Frame::Welcome(Welcome::Accepted {
            version: PROTOCOL_VERSION,
            tenant: tenant.to_string(),
            stdio: true,
        });
        let taken = match write_frame(&mut writer, &welcome).await {
            Ok(()) => {
                crate::handed::take(reader.get_ref().as_ref(), desk.options.hello_deadline).await
            }
            Err(err) => Err(crate::handed::HandOverError::Welcome(err)),
        };
        match taken {
            Ok(handed) => Some(handed),
            Err(why) => {
                tracing::warn!(target: "desk", %tenant, "closing a connection: {why}");
                desk.engine.disconnect(&tenant).await;
                return;
            }
        }
    } else {
        None
    };
    #[cfg(not(target_os = "linux"))]
    let _ = stdio;
    #[cfg(target_os = "linux")]
    let (mut lines, mut agent_out) = match handed {
        Some(crate::handed::Handed { lines, output }) => (Some(lines), Some(output)),
        None => (None, None),
    };

    // Every frame to the gateway goes through one writer task, so the upstream's stderr, the
    // welcome and the session's messages never interleave inside a frame; with the agent's
    // stdio handed over, the session's messages go there instead, each line whole.
    let (out, mut outbox) = mpsc::channel::<Frame>(1024);
    let writing = tokio::spawn(async move {
        while let Some(frame) = outbox.recv().await {
            #[cfg(target_os = "linux")]
            let frame = match (agent_out.as_mut(), frame) {
                (Some(agent_out), Frame::Mcp(line)) => {
                    if let Err(err) = agent_out.send(line).await {
                        tracing::debug!(target: "desk", error = %err, "could not write to an agent");
                        break;
                    }
                    continue;
                }
                (_, frame) => frame,
            };
            if let Err(err) = write_frame(&mut writer, &frame).await {
                tracing::debug!(target: "desk", error = %err, "could not write to a gateway");
                break;
            }
        }
        // With the stdio handed over, the gateway takes it back when the socket closes: the
        // socket must not close (as dropping this half would, with a shutdown) while the reading
        // task may still read the agent's stdin. It closes when that task's half is dropped too.
        #[cfg(target_os = "linux")]
        if agent_out.is_some() {
            writer.forget();
        }
    });
    // The welcome went out already: before the first message, or with the stdio handed over.

    // The agent's messages, from `M` frames or from its stdin: each judged by the router here,
    // as it arrives; what passes goes to the open lane when it may take it (see `lane`), else
    // to the session. Anything but an MCP frame ends the connection; with the stdio handed over,
    // so does anything at all on the socket, or its closing (the gateway is gone).
    let (inbound, inbox) = mpsc::channel::<ClientJsonRpcMessage>(64);
    let door = std::sync::Arc::new(crate::lane::Door::default());
    let frame_deadline = desk.options.frame_deadline;
    let reading = {
        let door = door.clone();
        let out = out.clone();
        tokio::spawn(async move {
            #[cfg(target_os = "linux")]
            if let Some(lines) = lines.as_mut() {
                let mut gateway = [0u8; 1];
                let gone = reader.read(&mut gateway);
                tokio::pin!(gone);
                loop {
                    let line = tokio::select! {
                        line = lines.next(frame_deadline) => line,
                        _ = &mut gone => {
                            tracing::debug!(target: "desk", "the gateway of a handed-over connection closed or spoke");
                            break;
                        }
                    };
                    match line {
                        Ok(Some(bytes)) => {
                            if !take_in(&bytes, &out, &door, &inbound).await {
                                break;
                            }
                        }
                        Ok(None) => break,
                        Err(err) => {
                            tracing::warn!(target: "desk", error = %err, "closing a connection whose agent sent a bad line");
                            break;
                        }
                    }
                }
                return;
            }
            // The message that earned the connection its thread, read before it came here.
            if let Some(bytes) = first.take()
                && !take_in(&bytes, &out, &door, &inbound).await
            {
                return;
            }
            loop {
                match read_frame_within(&mut reader, Some(frame_deadline)).await {
                    Ok(Frame::Mcp(bytes)) => {
                        if !take_in(&bytes, &out, &door, &inbound).await {
                            break;
                        }
                    }
                    Ok(other) => {
                        tracing::warn!(target: "desk", "closing a connection that sent {other:?}");
                        break;
                    }
                    Err(FrameError::Closed) => break,
                    Err(err) => {
                        tracing::warn!(target: "desk", error = %err, "closing a connection that sent a bad frame");
                        break;
                    }
                }
            }
        })
    };

    let serve = async {
        // Inside the block: every way out of it drops the agent's side, and with it the last
        // sender the writer waits on, so the connection closes at once.
        let mut agent = crate::router::AgentTransport::new(inbox, out.clone());
        // The agent's first message says which revision it would speak: the upstream is opened
        // the same way, so the two negotiate through the desk what they would negotiate directly.
        let Some(first) = agent.first().await else {
            return;
        };
        let lifecycle = reach::lifecycle(crate::router::probes_modern(&first));
        let reached = reach::Upstream::start(
            reach.clone(),
            headers,
            lifecycle,
            crate::router::declared_capabilities(&first),
            out.clone(),
            desk.children.clone(),
            desk.options.upstream_deadline,
        )
        .await;
        let reached = match registered {
            Some((registry, name)) => reached.map(|u| u.registered(registry, name)),
            None => reached,
        };
        let upstream = match reached {
            Ok(upstream) => std::sync::Arc::new(upstream),
            Err(refusal) => {
                tracing::warn!(target: "desk", %tenant, ?reach, "{}", refusal.message);
                // The agent's first request gets an error it can show; the gateway gets the
                // refusal, prints it and exits.
                if let Some(reply) = crate::router::error_reply(&first, &refusal.message) {
                    let _ = out.send(Frame::Mcp(reply)).await;
                }
                let _ = out.send(refuse(refusal.code, refusal.message)).await;
                return;
            }
        };
        agent.replay(first);
        let wait = wait_ms
            .map_or(desk.options.default_wait, Duration::from_millis)
            .min(desk.options.max_wait);
        crate::run(
            desk.engine.clone(),
            tenant.clone(),
            wait,
            upstream,
            agent,
            &door,
        )
        .await;
    };
    // The desk stopping ends every session at once: its gateway sees the connection close, and
    // answers the agent's requests still in flight itself.
    let stopped = tokio::select! {
        () = serve => false,
        () = desk.stopping.cancelled() => true,
    };
    drop(out);
    reading.abort();
    if stopped {
        // At once, before anything below yields: an answer the session gave while it was being
        // ended (its requests cancelled) must not reach the gateway, which answers those itself.
        writing.abort();
    }
    // The door holds the session, and through it the upstream and its sender to the writer: let
    // go of it too, or the writer below waits out its 5 s and the gateway (and with it whatever
    // agent waits for the gateway to exit) 5 s more after every session. After the abort above:
    // letting go may end the upstream's transport, whose lane answers what it still held.
    drop(door);
    // Gone: withdraw its pending requests.
    desk.engine.disconnect(&tenant).await;
    if stopped {
        tracing::info!(target: "desk", %tenant, "closed a gateway's connection: the desk stops");
        return;
    }
    // The writer ends once the session and the upstream's stderr have let go of it.
    let _ = tokio::time::timeout(Duration::from_secs(5), writing).await;
    tracing::info!(target: "desk", %tenant, "gateway disconnected");
}

/// One message of the agent's: judged by the router, then taken by the open lane or passed to
/// the session. `false` once the session is gone.
async fn take_in(
    bytes: &[u8],
    out: &mpsc::Sender<Frame>,
    door: &crate::lane::Door,
    inbound: &mpsc::Sender<ClientJsonRpcMessage>,
) -> bool {
    let Some(message) = crate::router::judge(bytes, out).await else {
        return true;
    };
    let Some(message) = door.offer(message).await else {
        return true;
    };
    inbound.send(message).await.is_ok()
}

/// The request a focus hello from `peer` may have the window show: only the desk's own account
/// chooses one; another account's hello (an agent under an account of its own, on the agents'
/// socket) brings the window forward at most, so it cannot steer what the person looks at.
fn focus_request(peer: peer::Peer, request: Option<u64>) -> Option<u64> {
    request.filter(|_| peer == peer::Peer::Own)
}

#[cfg(test)]
mod focus_tests {
    use super::*;

    #[test]
    fn only_the_desks_own_account_chooses_the_request_a_focus_shows() {
        assert_eq!(focus_request(peer::Peer::Own, Some(7)), Some(7));
        assert_eq!(focus_request(peer::Peer::Own, None), None);
        assert_eq!(focus_request(peer::Peer::Listed(1001), Some(7)), None);
    }
}
