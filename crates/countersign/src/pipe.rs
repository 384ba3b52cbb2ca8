//! `countersign mcp`: the pipe between an agent and the desk.
//!
//! The agent launches and controls this process, so it holds nothing and decides nothing: it
//! connects to the desk (starting one when none answers), says in a hello what the agent wants
//! reached, then copies MCP messages (one JSON-RPC message per line on stdin/stdout) to and from
//! the socket, and the upstream's stderr, which the desk sends, to its own stderr. It never starts
//! or reaches an upstream and links no policy, store or MCP code; taking it over gains nothing.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use countersign_wire::{
    Frame, FrameError, Hello, MAX_FRAME, PROTOCOL_VERSION, Reach, Welcome, read_frame, write_frame,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// Exit codes, for scripts and for the person reading a client's log.
pub mod exit {
    /// The agent closed stdin (or the session ended normally).
    pub const OK: i32 = 0;
    /// No desk answers and none could be started.
    pub const DESK_UNREACHABLE: i32 = 3;
    /// The desk refused the hello (another version, no such server, the upstream failed).
    pub const REFUSED: i32 = 4;
    /// The connection to the desk broke while the agent was still talking.
    pub const LOST: i32 = 5;
}

/// What `countersign mcp` was asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// What to reach.
    pub reach: Reach,
    /// A name to show the person (a display label only).
    pub label: Option<String>,
    /// How long a preflight should wait for a person.
    pub wait: Option<Duration>,
    /// The desk's socket.
    pub socket: PathBuf,
    /// Whether to start a desk when none answers.
    pub launch_desk: bool,
}

/// Why the pipe stopped.
#[derive(Debug, thiserror::Error)]
pub enum PipeError {
    /// No desk answers (and starting one did not help).
    #[error("the Countersign desk is not running and could not be started ({0})")]
    Unreachable(String),
    /// The desk refused the hello.
    #[error("the Countersign desk refused: {message} [{code}]")]
    Refused {
        /// The refusal's code.
        code: &'static str,
        /// Its sentence.
        message: String,
    },
    /// The connection broke.
    #[error("the connection to the Countersign desk was lost: {0}")]
    Lost(String),
}

impl PipeError {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> i32 {
        match self {
            PipeError::Unreachable(_) => exit::DESK_UNREACHABLE,
            PipeError::Refused { .. } => exit::REFUSED,
            PipeError::Lost(_) => exit::LOST,
        }
    }
}

/// The hello's `Reach` for an ad-hoc command: with the working directory and environment this
/// process was given, which the desk passes to the upstream it starts.
pub fn command_reach(argv: Vec<String>) -> Reach {
    let cwd = std::env::current_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    // Variables that are not Unicode cannot cross the JSON hello; they are left out.
    let env = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    Reach::Command { argv, cwd, env }
}

/// The hello's `Reach` for the built-in tools on `db` (made absolute here: the desk's working
/// directory is not the agent's).
pub fn builtin_reach(db: &Path) -> Reach {
    let db = std::path::absolute(db).unwrap_or_else(|_| db.to_owned());
    Reach::Builtin {
        db: db.display().to_string(),
    }
}

async fn dial(socket: &Path) -> std::io::Result<UnixStream> {
    let stream = UnixStream::connect(socket).await?;
    // Only a desk of our own user is the authority: a socket someone else planted at the path
    // could otherwise answer every preflight.
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

/// Connects, starting the desk once if none answers and giving it a few seconds to bind.
async fn connect(options: &Options) -> Result<UnixStream, PipeError> {
    let unreachable =
        |e: std::io::Error| PipeError::Unreachable(format!("{}: {e}", options.socket.display()));
    let first = match dial(&options.socket).await {
        Ok(stream) => return Ok(stream),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return Err(unreachable(e)),
        Err(e) => e,
    };
    if !options.launch_desk {
        return Err(unreachable(first));
    }
    tracing::info!(target: "gateway", "no desk answers; starting one");
    if let Err(e) = crate::launch::start_desk(&[]) {
        return Err(PipeError::Unreachable(format!(
            "cannot start {}: {e}",
            crate::launch::desk_program().display()
        )));
    }
    // The desk binds its socket early in its start; wait for it with a growing step.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut step = Duration::from_millis(20);
    loop {
        tokio::time::sleep(step).await;
        match dial(&options.socket).await {
            Ok(stream) => return Ok(stream),
            Err(e) if Instant::now() >= deadline => return Err(unreachable(e)),
            Err(_) => step = (step * 2).min(Duration::from_millis(250)),
        }
    }
}

/// Runs the pipe until the agent closes stdin or the desk ends the session.
pub async fn run(options: Options) -> Result<(), PipeError> {
    let stream = connect(&options).await?;
    let (mut from_desk, mut to_desk) = stream.into_split();
    let hello = Frame::Hello(Hello::Gateway {
        version: PROTOCOL_VERSION,
        reach: options.reach.clone(),
        label: options.label.clone(),
        wait_ms: options.wait.map(|w| w.as_millis() as u64),
        pid: std::process::id(),
    });
    let lost = |e: FrameError| PipeError::Lost(e.to_string());
    write_frame(&mut to_desk, &hello).await.map_err(lost)?;
    // The upstream's stderr may come before the answer (it says why a server would not start).
    loop {
        match read_frame(&mut from_desk).await.map_err(lost)? {
            Frame::Stderr(bytes) => to_stderr(&bytes),
            Frame::Welcome(Welcome::Accepted { tenant, .. }) => {
                tracing::info!(target: "gateway", %tenant, "connected to the desk");
                break;
            }
            Frame::Welcome(Welcome::Refused { code, message }) => {
                return Err(PipeError::Refused {
                    code: code.code(),
                    message,
                });
            }
            other => return Err(PipeError::Lost(format!("unexpected {other:?}"))),
        }
    }

    let agent_to_desk = async move {
        let mut stdin = BufReader::with_capacity(64 * 1024, tokio::io::stdin());
        let mut line = Vec::new();
        loop {
            line.clear();
            // Read at most one frame's worth (plus the newline): a longer line is dropped whole.
            let n = (&mut stdin)
                .take(MAX_FRAME as u64)
                .read_until(b'\n', &mut line)
                .await
                .map_err(|e| PipeError::Lost(format!("stdin: {e}")))?;
            if n == 0 {
                return Ok(()); // stdin closed: the agent is done.
            }
            if line.last() != Some(&b'\n') && n as u64 == MAX_FRAME as u64 {
                eprintln!(
                    "countersign mcp: dropped a message longer than {MAX_FRAME} bytes from the agent"
                );
                skip_line(&mut stdin).await;
                continue;
            }
            while matches!(line.last(), Some(b'\n' | b'\r')) {
                line.pop();
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            write_frame(&mut to_desk, &Frame::Mcp(std::mem::take(&mut line)))
                .await
                .map_err(lost)?;
        }
    };
    let desk_to_agent = async move {
        let mut stdout = tokio::io::stdout();
        loop {
            match read_frame(&mut from_desk).await {
                Ok(Frame::Mcp(mut bytes)) => {
                    bytes.push(b'\n');
                    stdout
                        .write_all(&bytes)
                        .await
                        .map_err(|e| PipeError::Lost(format!("stdout: {e}")))?;
                    stdout.flush().await.ok();
                }
                Ok(Frame::Stderr(bytes)) => to_stderr(&bytes),
                // The upstream is started once the agent's first message says which revision it
                // speaks; when it cannot be, the desk says so after the welcome.
                Ok(Frame::Welcome(Welcome::Refused { code, message })) => {
                    return Err(PipeError::Refused {
                        code: code.code(),
                        message,
                    });
                }
                Ok(other) => return Err(PipeError::Lost(format!("unexpected {other:?}"))),
                Err(FrameError::Closed) => return Ok(()),
                Err(e) => return Err(lost(e)),
            }
        }
    };
    tokio::pin!(desk_to_agent);
    tokio::select! {
        done = agent_to_desk => {
            done?;
            // The agent is done; closing our half tells the desk, which ends the session and
            // its upstream, then closes too. Messages already on their way still reach stdout.
            match tokio::time::timeout(Duration::from_secs(5), &mut desk_to_agent).await {
                Ok(r) => r,
                Err(_) => Ok(()),
            }
        }
        done = &mut desk_to_agent => {
            done?;
            eprintln!("countersign mcp: the desk ended this session (the upstream exited, or the desk stopped)");
            Ok(())
        }
    }
}

async fn skip_line<R: tokio::io::AsyncBufRead + Unpin>(reader: &mut R) {
    loop {
        let Ok(buf) = reader.fill_buf().await else {
            return;
        };
        if buf.is_empty() {
            return;
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                reader.consume(i + 1);
                return;
            }
            None => {
                let n = buf.len();
                reader.consume(n);
            }
        }
    }
}

fn to_stderr(bytes: &[u8]) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(bytes);
    let _ = err.flush();
}
