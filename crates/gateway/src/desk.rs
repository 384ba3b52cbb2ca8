//! The gateway's link to the desk.
//!
//! Connected lazily (the agent's `clientInfo` is only known after `initialize`) and again after the
//! desk restarts; each (re)connection introduces itself, gets a fresh tenant from the desk, and
//! registers the upstream's tools again. Requests are multiplexed by id, so a preflight waiting for
//! a person does not hold up other calls. If no desk answers, the gateway starts one
//! (`countersign desk`) once and waits briefly; if there is still none, gated calls get
//! `desk_unavailable` while open tools keep working.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use countersign_wire::{Envelope, PROTOCOL_VERSION, Request, Response, read_frame, write_frame};
use serde_json::Value;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

/// Why the desk could not answer.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum DeskError {
    /// No desk is listening (and starting one did not help).
    #[error("the Countersign desk is not running ({0})")]
    Unreachable(String),
    /// The desk answered the handshake with an error (e.g. another protocol version).
    #[error("the Countersign desk refused this gateway: {0}")]
    Refused(String),
    /// The connection dropped while a request was in flight.
    #[error("the connection to the Countersign desk was lost")]
    Lost,
}

type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<Response>>>>;

struct Conn {
    tenant: String,
    out: mpsc::UnboundedSender<Envelope<Request>>,
    waiters: Waiters,
    alive: Arc<AtomicBool>,
}

/// Who this gateway is, as told to the desk at each (re)connection.
#[derive(Debug, Clone, Default)]
pub struct Introduction {
    /// The agent's `clientInfo`.
    pub client_info: Value,
    /// The server name shown in the desk.
    pub server: String,
}

/// The link. Cheap to share behind an `Arc`.
pub struct DeskLink {
    socket: PathBuf,
    launch: bool,
    next_id: AtomicU64,
    conn: tokio::sync::Mutex<Option<Conn>>,
    introduction: Mutex<Introduction>,
    tools: Mutex<Vec<Value>>,
    launched_at: Mutex<Option<Instant>>,
}

impl DeskLink {
    /// A link to the desk at `socket`; `launch` lets it start a desk when none answers.
    pub fn new(socket: PathBuf, launch: bool) -> Self {
        Self {
            socket,
            launch,
            next_id: AtomicU64::new(1),
            conn: tokio::sync::Mutex::new(None),
            introduction: Mutex::new(Introduction::default()),
            tools: Mutex::new(Vec::new()),
            launched_at: Mutex::new(None),
        }
    }

    /// Sets who this gateway is; used by the next (re)connection.
    pub fn introduce(&self, introduction: Introduction) {
        *self.introduction.lock().unwrap() = introduction;
    }

    /// Remembers the upstream's raw tools, re-sent on each reconnection.
    pub fn set_tools(&self, tools: Vec<Value>) {
        *self.tools.lock().unwrap() = tools;
    }

    /// Sends `body` and waits for its answer, connecting (or reconnecting) first if needed.
    pub async fn request(&self, body: Request) -> Result<Response, DeskError> {
        let (out, waiters, alive) = {
            let mut guard = self.conn.lock().await;
            if !guard
                .as_ref()
                .is_some_and(|c| c.alive.load(Ordering::Acquire))
            {
                *guard = Some(self.connect().await?);
            }
            let conn = guard.as_ref().expect("just connected");
            (conn.out.clone(), conn.waiters.clone(), conn.alive.clone())
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        waiters.lock().unwrap().insert(id, tx);
        if out.send(Envelope { id, body }).is_err() || !alive.load(Ordering::Acquire) {
            waiters.lock().unwrap().remove(&id);
            return Err(DeskError::Lost);
        }
        rx.await.map_err(|_| DeskError::Lost)
    }

    /// The tenant of the current connection, if connected.
    pub async fn tenant(&self) -> Option<String> {
        self.conn
            .lock()
            .await
            .as_ref()
            .filter(|c| c.alive.load(Ordering::Acquire))
            .map(|c| c.tenant.clone())
    }

    async fn dial(&self) -> std::io::Result<UnixStream> {
        let stream = self.dial_any().await?;
        // Only a desk of our own user is the authority: a socket someone else planted at the
        // path could otherwise answer every preflight.
        // SAFETY: getuid has no preconditions and cannot fail.
        let me = unsafe { libc::getuid() };
        match stream.peer_cred() {
            Ok(cred) if cred.uid() == me => Ok(stream),
            Ok(cred) => Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("the socket belongs to uid {}, not to this user", cred.uid()),
            )),
            Err(e) => Err(e),
        }
    }

    async fn dial_any(&self) -> std::io::Result<UnixStream> {
        match UnixStream::connect(&self.socket).await {
            Ok(stream) => Ok(stream),
            Err(first) if self.launch => {
                self.launch_desk();
                // Give a starting desk a moment to bind its socket.
                let deadline = Instant::now() + Duration::from_secs(3);
                while Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if let Ok(stream) = UnixStream::connect(&self.socket).await {
                        return Ok(stream);
                    }
                }
                Err(first)
            }
            Err(e) => Err(e),
        }
    }

    /// Starts `countersign desk` (this same program), at most once every 30 s.
    fn launch_desk(&self) {
        let mut launched = self.launched_at.lock().unwrap();
        if launched.is_some_and(|at| at.elapsed() < Duration::from_secs(30)) {
            return;
        }
        *launched = Some(Instant::now());
        let Ok(me) = std::env::current_exe() else {
            return;
        };
        tracing::info!(target: "gateway", "no desk answers; starting one");
        let started = std::process::Command::new(me)
            .arg("desk")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        if let Err(err) = started {
            tracing::warn!(target: "gateway", error = %err, "could not start the desk");
        }
    }

    async fn connect(&self) -> Result<Conn, DeskError> {
        let stream = self
            .dial()
            .await
            .map_err(|e| DeskError::Unreachable(format!("{}: {e}", self.socket.display())))?;
        let (mut reader, mut writer) = stream.into_split();
        let introduction = self.introduction.lock().unwrap().clone();
        let hello = Envelope {
            id: 0,
            body: Request::Hello {
                version: PROTOCOL_VERSION,
                client_info: introduction.client_info,
                server: introduction.server,
                pid: std::process::id(),
            },
        };
        let lost = |e: countersign_wire::FrameError| DeskError::Unreachable(e.to_string());
        write_frame(&mut writer, &hello).await.map_err(lost)?;
        let welcome: Envelope<Response> = read_frame(&mut reader).await.map_err(lost)?;
        let tenant = match welcome.body {
            Response::Welcome { tenant, .. } => tenant,
            Response::Error { message, .. } => return Err(DeskError::Refused(message)),
            other => return Err(DeskError::Refused(format!("unexpected answer {other:?}"))),
        };
        let waiters: Waiters = Arc::default();
        let alive = Arc::new(AtomicBool::new(true));
        let (out, mut outbox) = mpsc::unbounded_channel::<Envelope<Request>>();
        {
            let alive = alive.clone();
            tokio::spawn(async move {
                while let Some(message) = outbox.recv().await {
                    if write_frame(&mut writer, &message).await.is_err() {
                        break;
                    }
                }
                alive.store(false, Ordering::Release);
            });
        }
        {
            let (alive, waiters) = (alive.clone(), waiters.clone());
            tokio::spawn(async move {
                while let Ok(reply) = read_frame::<_, Envelope<Response>>(&mut reader).await {
                    if let Some(waiter) = waiters.lock().unwrap().remove(&reply.id) {
                        let _ = waiter.send(reply.body);
                    }
                }
                alive.store(false, Ordering::Release);
                // Dropping the senders wakes every waiter with `Lost`.
                waiters.lock().unwrap().clear();
                tracing::warn!(target: "gateway", "lost the connection to the desk");
            });
        }
        tracing::info!(target: "gateway", %tenant, "connected to the desk");
        let conn = Conn {
            tenant,
            out,
            waiters,
            alive,
        };
        // A new connection is a new tenant: it must learn the tools again.
        let tools = self.tools.lock().unwrap().clone();
        if !tools.is_empty() {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            conn.waiters.lock().unwrap().insert(id, tx);
            let _ = conn.out.send(Envelope {
                id,
                body: Request::RegisterTools { tools },
            });
            let _ = rx.await;
        }
        Ok(conn)
    }
}
