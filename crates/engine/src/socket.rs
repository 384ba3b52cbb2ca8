//! The desk's end of the local socket.
//!
//! A Unix domain socket at [`countersign_wire::socket_path`], created inside a 0700 directory
//! and itself 0600; each connection's peer uid must be ours. Binding it is the single-instance
//! lock: if a live desk answers on the path, a second one refuses to start; a stale file left by
//! a crash is replaced. Each connection is served concurrently (a preflight waiting for a person
//! does not hold up the other calls); a malformed or oversized frame closes that connection only.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use countersign_wire::{
    Envelope, ErrorCode, FrameError, PROTOCOL_VERSION, Request, Response, read_frame, write_frame,
};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::Engine;

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
}

impl Served {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting connections and removes the socket file.
    pub fn stop(self) {}
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

fn setup_error(path: &Path) -> impl FnOnce(io::Error) -> SocketError + '_ {
    move |source| SocketError::Setup {
        path: path.to_owned(),
        source,
    }
}

/// Binds the socket at `path` and serves `engine` on it until the returned [`Served`] is dropped.
/// Must be called inside a Tokio runtime.
pub async fn serve(engine: Engine, path: PathBuf) -> Result<Served, SocketError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(setup_error(&path))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(setup_error(&path))?;
    }
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
    let task = tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let engine = engine.clone();
                    tokio::spawn(async move { connection(engine, stream).await });
                }
                Err(err) => {
                    tracing::warn!(target: "desk", error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
    Ok(Served { path, task })
}

fn same_user(stream: &UnixStream) -> bool {
    // SAFETY: getuid has no preconditions and cannot fail.
    let me = unsafe { libc::getuid() };
    stream
        .peer_cred()
        .map(|cred| cred.uid() == me)
        .unwrap_or(false)
}

/// Serves one gateway: the handshake, then its requests, concurrently, until it goes away.
async fn connection(engine: Engine, stream: UnixStream) {
    if !same_user(&stream) {
        tracing::warn!(target: "desk", "refused a connection from another user");
        return;
    }
    let (mut reader, mut writer) = stream.into_split();
    let hello: Envelope<Request> = match read_frame(&mut reader).await {
        Ok(hello) => hello,
        Err(err) => {
            tracing::warn!(target: "desk", error = %err, "connection closed before its hello");
            return;
        }
    };
    let tenant = match hello.body {
        Request::Hello {
            version,
            client_info,
            server,
            pid,
        } if version == PROTOCOL_VERSION => {
            let tenant = engine.connect(client_info, server.clone());
            tracing::info!(target: "desk", %tenant, %server, pid, "gateway connected");
            let welcome = Envelope {
                id: hello.id,
                body: Response::Welcome {
                    version: PROTOCOL_VERSION,
                    tenant: tenant.clone(),
                },
            };
            if write_frame(&mut writer, &welcome).await.is_err() {
                engine.disconnect(&tenant);
                return;
            }
            tenant
        }
        Request::Hello { version, .. } => {
            let message = format!(
                "this desk speaks protocol version {PROTOCOL_VERSION}, the gateway {version}: \
                 update Countersign so that both come from the same release"
            );
            tracing::warn!(target: "desk", "{message}");
            let reply = Envelope {
                id: hello.id,
                body: Response::Error {
                    code: ErrorCode::VersionMismatch,
                    message,
                },
            };
            let _ = write_frame(&mut writer, &reply).await;
            return;
        }
        _ => {
            let reply = Envelope {
                id: hello.id,
                body: Response::Error {
                    code: ErrorCode::NotIntroduced,
                    message: "the first message must be hello".into(),
                },
            };
            let _ = write_frame(&mut writer, &reply).await;
            return;
        }
    };

    // One writer task; request tasks send their responses to it.
    let (out, mut outbox) = mpsc::unbounded_channel::<Envelope<Response>>();
    let writing = tokio::spawn(async move {
        while let Some(reply) = outbox.recv().await {
            if let Err(err) = write_frame(&mut writer, &reply).await {
                tracing::warn!(target: "desk", error = %err, "could not answer a gateway");
                break;
            }
        }
    });
    let mut running = Vec::new();
    loop {
        let request: Envelope<Request> = match read_frame(&mut reader).await {
            Ok(request) => request,
            Err(FrameError::Closed) => break,
            Err(err) => {
                tracing::warn!(target: "desk", %tenant, error = %err, "closing a connection that sent a bad frame");
                break;
            }
        };
        let engine = engine.clone();
        let tenant = tenant.clone();
        let out = out.clone();
        running.push(tokio::spawn(async move {
            let body = handle(&engine, &tenant, request.body).await;
            let _ = out.send(Envelope {
                id: request.id,
                body,
            });
        }));
        running.retain(|task| !task.is_finished());
    }
    // Gone: withdraw its pending requests, and stop whatever it was waiting on.
    engine.disconnect(&tenant);
    for task in running {
        task.abort();
    }
    drop(out);
    let _ = writing.await;
    tracing::info!(target: "desk", %tenant, "gateway disconnected");
}

async fn handle(engine: &Engine, tenant: &str, request: Request) -> Response {
    match request {
        Request::Hello { .. } => Response::Error {
            code: ErrorCode::NotIntroduced,
            message: "hello was already said".into(),
        },
        Request::RegisterTools { tools } => engine.register_tools(tenant, tools),
        Request::Preflight {
            tool,
            arguments,
            wait_ms,
        } => {
            // Bounded by the desk too, whatever the gateway asks: a wait never outlives a token.
            let wait = Duration::from_millis(wait_ms.min(10 * 60 * 1000));
            engine.preflight(tenant, &tool, &arguments, wait).await
        }
        Request::Withdraw { tool, arguments } => engine.withdraw(tenant, &tool, &arguments),
        Request::Confirm { tool, arguments } => engine.confirm(tenant, &tool, &arguments),
        Request::Outcome { nonce, ok, note } => engine.outcome(tenant, &nonce, ok, note),
        Request::Focus => {
            engine.request_focus();
            Response::Done
        }
        _ => Response::Error {
            code: ErrorCode::Internal,
            message: "unknown request".into(),
        },
    }
}
