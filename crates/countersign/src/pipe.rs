//! `countersign mcp`: the pipe between an agent and the desk.
//!
//! The agent launches and controls this process, so it holds nothing and decides nothing: it
//! connects to the desk (starting one when none answers at the socket computed from the user id;
//! never for a socket chosen by a flag or the environment, or another account's desk), says in a hello what the agent wants
//! reached, then copies MCP messages (one JSON-RPC message per line on stdin/stdout) to and from
//! the socket, and the upstream's stderr, which the desk sends, to its own stderr. It never starts
//! or reaches an upstream and links no policy, store or MCP code; taking it over gains nothing.
//!
//! Plain blocking I/O on two threads (stdin → desk on one, desk → stdout on the other), no async
//! runtime: agents start one of these per server, so it must start fast, idle light and add as
//! little as possible to every call.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use countersign_wire::{
    Frame, FrameError, Hello, MAX_FRAME, PROTOCOL_VERSION, Reach, Welcome, decode, encode,
};

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
    /// What chose `socket` when it is not the path computed from the user id (`--socket`,
    /// `COUNTERSIGN_SOCKET`, `--desk-user`). A desk is started only at the computed path: a desk
    /// the gateway starts never takes a socket from the agent's environment, so one started for
    /// another path would listen where nobody looks.
    pub socket_chosen_by: Option<&'static str>,
    /// Whether to start a desk when none answers at the computed path.
    pub launch_desk: bool,
    /// The account the desk runs under: this one, or the one `--desk-user` names when the agent
    /// runs under an account of its own. Only a desk of that account is answered.
    pub desk_uid: u32,
}

/// Why the pipe stopped.
#[derive(Debug, thiserror::Error)]
pub enum PipeError {
    /// No desk answers (and starting one did not help).
    #[error("the Countersign desk is not running and could not be started ({0})")]
    Unreachable(String),
    /// No desk answers at a socket chosen by a flag or the environment, where no desk is started.
    #[error("{0}")]
    NoDeskAt(String),
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
            PipeError::Unreachable(_) | PipeError::NoDeskAt(_) => exit::DESK_UNREACHABLE,
            PipeError::Refused { .. } => exit::REFUSED,
            PipeError::Lost(_) => exit::LOST,
        }
    }
}

fn lost(e: impl std::fmt::Display) -> PipeError {
    PipeError::Lost(e.to_string())
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

fn my_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

fn dial(socket: &Path, desk_uid: u32) -> std::io::Result<UnixStream> {
    let stream = UnixStream::connect(socket)?;
    // Only a desk of the desk's account (ours, unless --desk-user says) is the authority: a
    // socket someone else planted at the path could otherwise answer every preflight.
    let owner = peer_uid(&stream)?;
    if owner != desk_uid {
        let whose = if desk_uid == my_uid() {
            "this user".to_owned()
        } else {
            format!("the desk's account (uid {desk_uid})")
        };
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("the socket belongs to uid {owner}, not to {whose}"),
        ));
    }
    Ok(stream)
}

/// What to tell the person when no desk answers at a socket the gateway does not start one for.
fn no_desk_at(options: &Options, chosen_by: &str, e: &std::io::Error) -> PipeError {
    let socket = options.socket.display();
    if options.desk_uid != my_uid() {
        return PipeError::NoDeskAt(format!(
            "no desk of uid {} answers at {socket} ({e}). That desk listens there for agent \
             accounts while it runs and its settings list this account (uid {}); a gateway \
             never starts another account's desk",
            options.desk_uid,
            my_uid()
        ));
    }
    PipeError::NoDeskAt(format!(
        "the Countersign desk is not running at {socket}, the socket {chosen_by} names ({e}). A \
         gateway starts a desk only at the socket computed from the user id, because the desk it \
         starts does not take its socket from the agent's environment. Start a desk at this \
         socket with `{}={socket} countersign-desk`, or leave {chosen_by} out to use the default \
         desk",
        countersign_wire::SOCKET_ENV
    ))
}

#[cfg(target_os = "linux")]
fn peer_uid(stream: &UnixStream) -> std::io::Result<u32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given, for the whole call.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(cred.uid)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn peer_uid(stream: &UnixStream) -> std::io::Result<u32> {
    use std::os::fd::AsRawFd;
    let (mut uid, mut gid) = (0, 0);
    // SAFETY: both out-pointers are valid for writes for the whole call.
    if unsafe { libc::getpeereid(stream.as_raw_fd(), &mut uid, &mut gid) } == 0 {
        Ok(uid)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Connects, starting the desk once if none answers at the computed path and giving it a few
/// seconds to bind.
fn connect(options: &Options) -> Result<UnixStream, PipeError> {
    let unreachable =
        |e: std::io::Error| PipeError::Unreachable(format!("{}: {e}", options.socket.display()));
    let first = match dial(&options.socket, options.desk_uid) {
        Ok(stream) => return Ok(stream),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return Err(unreachable(e)),
        Err(e) => e,
    };
    if let Some(chosen_by) = options.socket_chosen_by {
        return Err(no_desk_at(options, chosen_by, &first));
    }
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
        std::thread::sleep(step);
        match dial(&options.socket, options.desk_uid) {
            Ok(stream) => return Ok(stream),
            Err(e) if Instant::now() >= deadline => return Err(unreachable(e)),
            Err(_) => step = (step * 2).min(Duration::from_millis(250)),
        }
    }
}

/// Reads one frame. `Ok(None)` when the desk closed the connection between frames.
fn read_frame(reader: &mut impl Read) -> Result<Option<Frame>, FrameError> {
    let mut len = [0u8; 4];
    match reader.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body)?;
    decode(&body).map(Some)
}

fn write_frame(writer: &mut impl Write, frame: &Frame) -> Result<(), FrameError> {
    // One write per frame: the desk sees whole frames as early as possible.
    writer.write_all(&encode(frame)?)?;
    Ok(())
}

/// Runs the pipe until the agent closes stdin or the desk ends the session.
pub fn run(options: Options) -> Result<(), PipeError> {
    let stream = connect(&options)?;
    let mut to_desk = stream.try_clone().map_err(lost)?;
    let mut from_desk = BufReader::with_capacity(64 * 1024, stream);
    let hello = Frame::Hello(Hello::Gateway {
        version: PROTOCOL_VERSION,
        reach: options.reach.clone(),
        label: options.label.clone(),
        wait_ms: options.wait.map(|w| w.as_millis() as u64),
        pid: std::process::id(),
    });
    write_frame(&mut to_desk, &hello).map_err(lost)?;
    // The upstream's stderr may come before the answer (it says why a server would not start).
    loop {
        match read_frame(&mut from_desk).map_err(lost)? {
            Some(Frame::Stderr(bytes)) => to_stderr(&bytes),
            Some(Frame::Welcome(Welcome::Accepted { tenant, .. })) => {
                tracing::info!(target: "gateway", %tenant, "connected to the desk");
                break;
            }
            Some(Frame::Welcome(Welcome::Refused { code, message })) => {
                return Err(PipeError::Refused {
                    code: code.code(),
                    message,
                });
            }
            Some(other) => return Err(lost(format!("unexpected {other:?}"))),
            None => return Err(lost("the desk closed the connection before answering")),
        }
    }

    // stdin → desk, on a thread of its own. When the agent closes stdin, our half of the socket
    // closes too: the desk ends the session and its upstream, then closes its half, which ends
    // the loop below (given a few seconds at most).
    let closer = to_desk.try_clone().map_err(lost)?;
    let agent_to_desk = std::thread::spawn(move || -> Result<(), PipeError> {
        let result = copy_stdin(&mut to_desk);
        let _ = to_desk.shutdown(std::net::Shutdown::Write);
        let _ = closer.set_read_timeout(Some(Duration::from_secs(5)));
        result
    });

    // desk → stdout and stderr, here.
    let mut stdout = std::io::stdout().lock();
    let ended = loop {
        match read_frame(&mut from_desk) {
            Ok(Some(Frame::Mcp(mut bytes))) => {
                bytes.push(b'\n');
                if let Err(e) = stdout.write_all(&bytes).and_then(|()| stdout.flush()) {
                    break Err(PipeError::Lost(format!("stdout: {e}")));
                }
            }
            Ok(Some(Frame::Stderr(bytes))) => to_stderr(&bytes),
            // The upstream is started once the agent's first message says which revision it
            // speaks; when it cannot be, the desk says so after the welcome.
            Ok(Some(Frame::Welcome(Welcome::Refused { code, message }))) => {
                break Err(PipeError::Refused {
                    code: code.code(),
                    message,
                });
            }
            Ok(Some(other)) => break Err(lost(format!("unexpected {other:?}"))),
            Ok(None) => break Ok(()),
            // The agent is gone and the desk did not close in time: done all the same.
            Err(FrameError::Io(e))
                if agent_to_desk.is_finished()
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
            {
                break Ok(());
            }
            Err(e) => break Err(lost(e)),
        }
    };
    ended?;
    if agent_to_desk.is_finished() {
        agent_to_desk
            .join()
            .unwrap_or_else(|_| Err(lost("the stdin thread panicked")))
    } else {
        // The desk ended the session while the agent still talks: the upstream exited, or the
        // desk stopped. The stdin thread is blocked in a read; the process exit ends it.
        eprintln!(
            "countersign mcp: the desk ended this session (the upstream exited, or the desk stopped)"
        );
        Ok(())
    }
}

/// Copies stdin's lines to the desk as `M` frames until stdin closes.
fn copy_stdin(to_desk: &mut UnixStream) -> Result<(), PipeError> {
    let mut stdin = BufReader::with_capacity(64 * 1024, std::io::stdin().lock());
    let mut line = Vec::new();
    loop {
        line.clear();
        // At most one frame's worth (plus the newline): a longer line is dropped whole.
        let n = (&mut stdin)
            .take(MAX_FRAME as u64)
            .read_until(b'\n', &mut line)
            .map_err(|e| PipeError::Lost(format!("stdin: {e}")))?;
        if n == 0 {
            return Ok(()); // stdin closed: the agent is done.
        }
        if line.last() != Some(&b'\n') && n as u64 == MAX_FRAME as u64 {
            eprintln!(
                "countersign mcp: dropped a message longer than {MAX_FRAME} bytes from the agent"
            );
            skip_line(&mut stdin);
            continue;
        }
        while matches!(line.last(), Some(b'\n' | b'\r')) {
            line.pop();
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        write_frame(to_desk, &Frame::Mcp(std::mem::take(&mut line))).map_err(lost)?;
    }
}

fn skip_line(reader: &mut impl BufRead) {
    loop {
        let Ok(buf) = reader.fill_buf() else {
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
