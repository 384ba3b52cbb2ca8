//! `countersign mcp`: the pipe between an agent and the desk, and the desk's launcher.
//!
//! A crate of its own that links nothing of Countersign's but the wire protocol
//! (`countersign-wire`), so that what an agent starts cannot link policy, records or MCP code by
//! accident: the `countersign` command and the demo use it; [`launch`] starts the desk (and
//! finds the other programs beside this one).
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
//!
//! The desk may stop or restart while the agent runs. The pipe reads just enough of each message
//! (its id and method) to know which of the agent's requests are in flight: when the connection
//! is lost, each of them gets a JSON-RPC error saying so (a confirm may have run; nothing more is
//! known), and the agent's next request connects again, a few tries with a growing pause (never
//! starting a desk where the gateway would not start one at its own start). The new connection
//! is a new session with the desk, so the pipe replays the agent's `initialize` (or the
//! `server/discover` it opened with) under an id of its own, swallowing the answer, and its
//! `notifications/initialized`: the agent goes on as if nothing happened, except that confirm
//! tokens of the old session no longer work, which the errors say.
#![allow(unsafe_code)] // this crate reaches the OS through libc; each unsafe block says why it is sound

pub mod launch;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use countersign_wire::message::{Asked, Kind, cancelled};
use countersign_wire::{
    DeskError, Frame, FrameError, Hello, MAX_FRAME, PROTOCOL_VERSION, Reach, Welcome, decode,
    encode,
};

/// Exit codes, for scripts and for the person reading a client's log.
pub mod exit {
    /// The agent closed stdin (or the session ended normally).
    pub const OK: i32 = 0;
    /// No desk answers and none could be started.
    pub const DESK_UNREACHABLE: i32 = 3;
    /// The desk refused the hello (another version, no such server, the upstream failed).
    pub const REFUSED: i32 = 4;
    /// The connection to the desk broke before its welcome, or the agent's stdin or stdout
    /// failed. (A connection lost later is made again on the agent's next request.)
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
    /// Relay every message as a frame instead of handing the agent's stdio to the desk.
    pub relay: bool,
}

/// The process exit code for a failure to talk to the desk.
pub fn exit_code(err: &DeskError) -> i32 {
    match err {
        DeskError::Unreachable(_) | DeskError::NoDeskAt(_) => exit::DESK_UNREACHABLE,
        DeskError::Refused { .. } => exit::REFUSED,
        DeskError::Lost(_) => exit::LOST,
    }
}

/// The connection to the desk was lost (or never made) because of `e`.
pub fn lost(e: impl std::fmt::Display) -> DeskError {
    DeskError::Lost(e.to_string())
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
fn no_desk_at(options: &Options, chosen_by: &str, e: &std::io::Error) -> DeskError {
    let socket = options.socket.display();
    if options.desk_uid != my_uid() {
        return DeskError::NoDeskAt(format!(
            "no desk of uid {} answers at {socket} ({e}). That desk listens there for agent \
             accounts while it runs and its settings list this account (uid {}); a gateway \
             never starts another account's desk",
            options.desk_uid,
            my_uid()
        ));
    }
    DeskError::NoDeskAt(format!(
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
pub fn connect(options: &Options) -> Result<UnixStream, DeskError> {
    let unreachable =
        |e: std::io::Error| DeskError::Unreachable(format!("{}: {e}", options.socket.display()));
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
    // In the tray: nothing waits yet, so no window (the first request brings it).
    if let Err(e) = launch::start_desk(&[countersign_wire::DESK_IN_TRAY.to_owned()]) {
        return Err(DeskError::Unreachable(format!(
            "cannot start {}: {e}",
            launch::desk_program().display()
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
pub fn read_frame(reader: &mut impl Read) -> Result<Option<Frame>, FrameError> {
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

/// Writes one frame, whole.
pub fn write_frame(writer: &mut impl Write, frame: &Frame) -> Result<(), FrameError> {
    // One write per frame: the desk sees whole frames as early as possible.
    writer.write_all(&encode(frame)?)?;
    Ok(())
}

/// How many times the pipe dials the desk again after losing it, before it says none answers.
const RECONNECT_TRIES: u32 = 6;
/// The first pause between those tries; each pause doubles, up to [`RECONNECT_MAX_PAUSE`].
const RECONNECT_FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between two tries. The tries span 2.5 s: a desk that restarts binds its
/// socket early, and an agent waiting on a desk that is not coming back hears so soon (its next
/// request tries again).
const RECONNECT_MAX_PAUSE: Duration = Duration::from_secs(1);

/// The JSON-RPC error code of the pipe's own answers (an implementation-defined server error).
const PIPE_ERROR: i64 = -32000;

/// A connection to the desk, welcomed: its two halves, and the desk's notes when it took the
/// agent's stdio.
struct Connection {
    to_desk: UnixStream,
    from_desk: BufReader<FromDesk>,
    /// The file the desk notes the agent's requests in flight into, once the agent's stdin and
    /// stdout are the desk's (see `countersign_wire::stdio`); `None` when this pipe relays.
    notes: Option<std::fs::File>,
}

/// The read half of the connection to the desk, which waits in poll(2) before it reads.
///
/// Why: the stdin thread writes the agent's requests to the same socket this half reads. Each
/// time the desk takes one, the kernel wakes whatever waits on the socket to say there is room to
/// write again, and a thread blocked in a stream socket's recv(2) is woken by that too, finds
/// nothing and sleeps again: one context switch per call for nothing (measured: the pipe and the
/// desk on a CPU 6.8 times per call with recv alone, 5.8 with poll first; 4.8 for two bare
/// relays). poll(2) for input sleeps on the same queue but is woken only for input, a hang-up or
/// an error. After a second with nothing to read it reads all the same, which blocks as before:
/// the socket's receive timeout (set once the agent is done) stays in force.
struct FromDesk(UnixStream);

/// How long the read half waits in poll(2) before it blocks in recv(2) instead.
const POLL_FIRST_MS: libc::c_int = 1000;

impl Read for FromDesk {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        let mut wanted = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for a descriptor `self` owns. Whatever poll says (ready,
        // timed out, interrupted, failed), the read below reports the socket's state.
        let _ = unsafe { libc::poll(&mut wanted, 1, POLL_FIRST_MS) };
        self.0.read(buf)
    }
}

/// Says hello on `stream` and reads the desk's welcome (the upstream's stderr may come first).
/// With `offer`, the agent's stdio is offered to the desk, where it can be (see [`notes_file`]),
/// and handed over when the desk takes it.
fn handshake(stream: UnixStream, options: &Options, offer: bool) -> Result<Connection, DeskError> {
    let mut to_desk = stream.try_clone().map_err(lost)?;
    let mut from_desk = BufReader::with_capacity(64 * 1024, FromDesk(stream));
    let mut notes = if offer { notes_file(options) } else { None };
    let hello = Frame::Hello(Hello::Gateway {
        version: PROTOCOL_VERSION,
        reach: options.reach.clone(),
        label: options.label.clone(),
        wait_ms: options.wait.map(|w| w.as_millis() as u64),
        pid: std::process::id(),
        stdio: notes.is_some(),
    });
    write_frame(&mut to_desk, &hello).map_err(lost)?;
    loop {
        match read_frame(&mut from_desk).map_err(lost)? {
            Some(Frame::Stderr(bytes)) => to_stderr(&bytes),
            Some(Frame::Welcome(Welcome::Accepted { tenant, stdio, .. })) => {
                tracing::info!(target: "gateway", %tenant, handed_over = stdio, "connected to the desk");
                if !stdio {
                    notes = None;
                } else if let Some(notes) = &notes {
                    // Right after the welcome: the desk sends nothing more until it has them.
                    if !from_desk.buffer().is_empty() {
                        return Err(lost(
                            "the desk sent more than its welcome before taking the stdio",
                        ));
                    }
                    hand_over(&to_desk, notes)?;
                } else {
                    return Err(lost("the desk took stdio the gateway did not offer"));
                }
                return Ok(Connection {
                    to_desk,
                    from_desk,
                    notes,
                });
            }
            Some(Frame::Welcome(Welcome::Refused { code, message })) => {
                return Err(DeskError::Refused {
                    code: code.code(),
                    message,
                });
            }
            Some(other) => return Err(lost(format!("unexpected {other:?}"))),
            None => return Err(lost("the desk closed the connection before answering")),
        }
    }
}

/// The file for the desk's notes, when the agent's stdio may be handed over: on Linux, unless
/// `--relay`, when stdin and stdout are both pipes or sockets (a terminal or a file stays here).
fn notes_file(options: &Options) -> Option<std::fs::File> {
    #[cfg(target_os = "linux")]
    {
        use countersign_wire::stdio::{may_hand_over, new_notes_file};
        if options.relay || !may_hand_over(0) || !may_hand_over(1) {
            return None;
        }
        match new_notes_file() {
            Ok(file) => Some(file),
            Err(e) => {
                tracing::debug!(target: "gateway", error = %e, "no notes file: relaying");
                None
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = options;
        None
    }
}

/// Sends the agent's stdin and stdout, and the notes file, to the desk.
fn hand_over(to_desk: &UnixStream, notes: &std::fs::File) -> Result<(), DeskError> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        countersign_wire::stdio::send_descriptors(to_desk.as_raw_fd(), &[0, 1, notes.as_raw_fd()])
            .map_err(|e| lost(format!("could not hand the agent's stdio to the desk: {e}")))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (to_desk, notes);
        Err(lost("the desk took stdio the gateway did not offer"))
    }
}

/// The connection the desk held the agent's stdio for is gone: the stdio is the pipe's again.
/// Every request the desk noted as taken and not answered becomes the pipe's to answer, as if it
/// had relayed it; what the desk read and never took is read again, before stdin; and the
/// agent's opening is kept for the next desk. When the agent has closed
/// stdin (the desk ended the session because the agent is done), the agent is marked done.
fn take_back(link: &Shared, notes: &std::fs::File) {
    #[cfg(target_os = "linux")]
    {
        let back = countersign_wire::stdio::read_back(notes).unwrap_or_else(|e| {
            eprintln!("countersign mcp: could not read the desk's notes back: {e}");
            Default::default()
        });
        if back.mid_line {
            // The desk died half-way through a line: end it, so that the agent's next line is whole.
            let _ = to_stdout(Vec::new());
        }
        let mut state = lock(link);
        let generation = state.generation;
        for (key, asked) in back.in_flight {
            state.outstanding.insert(key, (generation, asked));
        }
        if state.opening.is_none() {
            state.opening = back.opening;
            state.initialized = back.initialized;
        }
        // Never taken by the desk: the start of the pipe's stdin, to send to the next one.
        state.agent_done |= back.unread.is_empty() && stdin_closed();
        state.unread = back.unread;
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (link, notes);
}

/// Whether the agent has closed stdin with nothing left to read in it.
#[cfg(target_os = "linux")]
fn stdin_closed() -> bool {
    let mut wanted = libc::pollfd {
        fd: 0,
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd; a zero timeout never blocks.
    if unsafe { libc::poll(&mut wanted, 1, 0) } <= 0 {
        return false;
    }
    if wanted.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) == 0 {
        return false;
    }
    // A socket says "readable" for its end as for data: a peek tells them apart. A pipe with no
    // writer left says "hung up", and "readable" only while data is left in it.
    let mut byte = 0u8;
    // SAFETY: a one-byte buffer that lives for the call; MSG_PEEK leaves the data where it is.
    let peeked = unsafe {
        libc::recv(
            0,
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match peeked {
        0 => true,
        n if n > 0 => false,
        _ => wanted.revents & libc::POLLIN == 0,
    }
}

/// Connects again after the connection was lost: a few tries with a growing pause (a desk that
/// restarts takes a moment to bind), then, only where the gateway may start a desk, the start
/// [`connect`] makes.
fn reconnect(options: &Options) -> Result<Connection, DeskError> {
    let mut pause = RECONNECT_FIRST_PAUSE;
    let started = Instant::now();
    let mut last = None;
    for attempt in 0..RECONNECT_TRIES {
        if attempt > 0 {
            std::thread::sleep(pause);
            pause = (pause * 2).min(RECONNECT_MAX_PAUSE);
        }
        match dial(&options.socket, options.desk_uid) {
            Ok(stream) => return handshake(stream, options, false),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(DeskError::Unreachable(format!(
                    "{}: {e}",
                    options.socket.display()
                )));
            }
            Err(e) => last = Some(e),
        }
    }
    let last = last.unwrap_or_else(|| std::io::Error::other("no answer"));
    let tried = format!(
        "tried {RECONNECT_TRIES} times over {} s",
        started.elapsed().as_secs()
    );
    match options.socket_chosen_by {
        // Where the gateway starts desks, it starts one now, as it would at its own start.
        None if options.launch_desk => handshake(connect(options)?, options, false),
        None => Err(DeskError::Unreachable(format!(
            "no desk answers at {} ({last}; {tried})",
            options.socket.display()
        ))),
        Some(chosen_by) => Err(match no_desk_at(options, chosen_by, &last) {
            DeskError::NoDeskAt(why) => DeskError::NoDeskAt(format!("{why} ({tried})")),
            other => other,
        }),
    }
}

/// What the agent is told about a request when the connection to the desk is lost while it is
/// in flight.
fn lost_message(asked: &Asked) -> String {
    let what = match asked {
        Asked::Call {
            tool,
            confirm: true,
        } => format!(
            " This was a confirm of `{tool}`: it may have been executed, in whole or in part, \
                 or not at all, and nothing more is known. Check whether its effect happened \
                 before doing it again."
        ),
        Asked::Call {
            tool,
            confirm: false,
        } => format!(
            " If `{tool}` is a gated tool, this was a preflight and nothing was executed; if \
                 it is an open tool, it may have run, and nothing more is known."
        ),
        Asked::Other { method } => format!(" Nothing more is known about `{method}`."),
    };
    format!(
        "Countersign: the connection to the desk was lost while this request was in progress \
             (the desk stopped or restarted).{what} The gateway connects to the desk again on \
             the next request, and the desk gives this agent a new session: confirm tokens \
             issued before no longer work there (they are bound to the old session), so run the \
             preflight again for a new one."
    )
}

/// What both threads know about the connection to the desk.
#[derive(Default)]
struct Link {
    /// The write half of the connection now; `None` once it is lost, until the agent's next
    /// request connects again.
    desk: Option<Arc<UnixStream>>,
    /// Which connection `desk` is (1 for the first).
    generation: u64,
    /// The agent's requests sent to the desk and not answered yet: id → (connection, what).
    outstanding: HashMap<String, (u64, Asked)>,
    /// The desk's requests to the agent: id → connection. An answer to a connection that is
    /// gone is dropped: the new desk may have asked something else under the same id.
    asked_by_desk: HashMap<String, u64>,
    /// Requests the pipe replayed itself (id → connection): their answers are not the agent's.
    replayed: HashMap<String, u64>,
    /// The agent's `initialize` (or opening `server/discover`) and its
    /// `notifications/initialized`, replayed to a new connection.
    opening: Option<Vec<u8>>,
    initialized: Option<Vec<u8>>,
    /// Input the desk read from the agent's stdin and never took: read before stdin itself.
    unread: Vec<u8>,
    /// The agent closed stdin.
    agent_done: bool,
    /// Why the pipe must stop, found by the stdin thread.
    fatal: Option<DeskError>,
}

impl Link {
    /// Keeps what opens the agent's session (its `initialize`, or the `server/discover` it
    /// opened with, and its `notifications/initialized`) for a new connection, and forgets the
    /// requests it cancels.
    fn remember(&mut self, kind: &Kind, message: &[u8]) {
        match kind {
            Kind::Request { method, .. } if method == "initialize" => {
                self.opening = Some(message.to_vec());
                self.initialized = None;
            }
            Kind::Request { method, .. }
                if method == "server/discover" && self.opening.is_none() =>
            {
                self.opening = Some(message.to_vec());
            }
            Kind::Other { method: Some(m) } if m == "notifications/initialized" => {
                self.initialized = Some(message.to_vec());
            }
            // A cancelled request gets no answer: it is no longer in flight.
            Kind::Other { method: Some(m) } if m == "notifications/cancelled" => {
                if let Some(key) = cancelled(message) {
                    self.outstanding.remove(&key);
                }
            }
            _ => {}
        }
    }
}

/// The link, shared by both threads. Never held across a write to the socket or to stdout.
type Shared = Arc<Mutex<Link>>;

/// Takes the link, recovering it if a thread panicked while holding it (as
/// `countersign_core::sync::lock` does everywhere else; the pipe links `wire` alone).
#[allow(clippy::disallowed_methods)] // the pipe's one lock, poison-tolerant like core's
fn lock(link: &Shared) -> std::sync::MutexGuard<'_, Link> {
    link.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes one message to stdout as a line, whole, so that the two threads' lines never
/// interleave: the newline is added to the message's own buffer, so that a line goes out in one
/// write (stdout's line buffer would send a message longer than its 1 KiB in one write and its
/// newline in another, and the agent would wake twice for it).
fn to_stdout(mut line: Vec<u8>) -> std::io::Result<()> {
    line.push(b'\n');
    let mut out = std::io::stdout().lock();
    out.write_all(&line)?;
    out.flush()
}

/// The pipe's own JSON-RPC error answer to the agent's request `id`.
fn answer_error(id: &serde_json::Value, code: &str, message: &str) {
    let reply = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": PIPE_ERROR, "message": message, "data": {"error": code}},
    });
    // The agent may be gone already; there is no one else to tell.
    let _ = to_stdout(reply.to_string().into_bytes());
}

/// Runs the pipe until the agent closes stdin (or the desk refuses it).
pub fn run(options: Options) -> Result<(), DeskError> {
    let Connection {
        to_desk,
        from_desk,
        mut notes,
    } = handshake(connect(&options)?, &options, true)?;
    let link: Shared = Arc::new(Mutex::new(Link {
        desk: Some(Arc::new(to_desk)),
        generation: 1,
        ..Link::default()
    }));
    // The stdin thread hands each new connection's read half to the loop below.
    let (readers, next_reader) = std::sync::mpsc::channel::<(BufReader<FromDesk>, u64)>();

    // stdin → desk, on a thread of its own. When the agent closes stdin, our half of the socket
    // closes too: the desk ends the session and its upstream, then closes its half, which ends
    // the loop below (given a few seconds at most). While the desk holds the agent's stdio, the
    // thread waits until the loop below has taken it back.
    let (give_back, taken_back) = std::sync::mpsc::channel::<()>();
    let handed = notes.is_some();
    let stdin_link = link.clone();
    std::thread::spawn(move || {
        if handed && taken_back.recv().is_err() {
            return; // the pipe ends without taking stdin back
        }
        let result = copy_stdin(&stdin_link, &options, &readers);
        let mut state = lock(&stdin_link);
        state.agent_done = true;
        if let Err(e) = result {
            state.fatal = Some(e);
        }
        if let Some(desk) = state.desk.clone() {
            drop(state);
            let _ = desk.shutdown(std::net::Shutdown::Write);
            let _ = desk.set_read_timeout(Some(Duration::from_secs(5)));
        }
        // Dropping `readers` wakes the loop below if it waits for a connection.
    });

    // desk → stdout and stderr, here.
    let (mut from_desk, mut generation) = (from_desk, 1);
    loop {
        let ended = relay(&link, &mut from_desk, generation, notes.is_some());
        if let Some(notes) = notes.take() {
            take_back(&link, &notes);
        }
        match ended {
            Ended::Refused(e) => {
                let message = e.to_string();
                answer_lost(&link, generation, |_| message.clone());
                return Err(e);
            }
            Ended::Stdout(e) => return Err(DeskError::Lost(format!("stdout: {e}"))),
            Ended::Lost(why) => {
                tracing::debug!(target: "gateway", "the connection to the desk ended: {why}");
                if answer_lost(&link, generation, lost_message) {
                    return Ok(());
                }
                eprintln!(
                    "countersign mcp: the connection to the desk was lost ({why}); the gateway \
                     connects again on the agent's next request"
                );
                // Sent once, after the lost requests were answered; unheard when not handed.
                let _ = give_back.send(());
                match next_reader.recv() {
                    Ok((reader, g)) => (from_desk, generation) = (reader, g),
                    Err(_) => return lock(&link).fatal.take().map_or(Ok(()), Err),
                }
            }
        }
    }
}

/// Why a connection's relay ended.
enum Ended {
    /// The desk refused the session after its welcome (the upstream could not be started).
    Refused(DeskError),
    /// stdout is closed: the agent is gone.
    Stdout(std::io::Error),
    /// The connection closed or broke (the desk stopped or restarted), or the agent is done.
    Lost(String),
}

/// Copies the desk's frames of connection `generation` to stdout and stderr until it ends. With
/// the agent's stdio `handed` to the desk, an `M` frame is a desk out of order (the agent's
/// output is the desk's to write then), and ends the connection.
fn relay(
    link: &Shared,
    from_desk: &mut BufReader<FromDesk>,
    generation: u64,
    handed: bool,
) -> Ended {
    loop {
        match read_frame(from_desk) {
            Ok(Some(Frame::Mcp(_))) if handed => {
                return Ended::Lost(
                    "the desk sent a message on the socket after taking stdio".into(),
                );
            }
            Ok(Some(Frame::Mcp(bytes))) => {
                match Kind::of(&bytes) {
                    Kind::Response { key } => {
                        let mut state = lock(link);
                        if state.replayed.remove(&key).is_some() {
                            continue; // the answer to the pipe's own replay
                        }
                        if state
                            .outstanding
                            .get(&key)
                            .is_some_and(|(g, _)| *g == generation)
                        {
                            state.outstanding.remove(&key);
                        }
                    }
                    Kind::Request { id, .. } => {
                        let mut state = lock(link);
                        // Kept to drop answers meant for a desk that is gone; bounded all the
                        // same (an agent that never answers must not grow it).
                        if state.asked_by_desk.len() >= 1024 {
                            state.asked_by_desk.retain(|_, g| *g == generation);
                            if state.asked_by_desk.len() >= 1024 {
                                state.asked_by_desk.clear();
                            }
                        }
                        state.asked_by_desk.insert(id.to_string(), generation);
                    }
                    Kind::Other { .. } => {}
                }
                if let Err(e) = to_stdout(bytes) {
                    return Ended::Stdout(e);
                }
            }
            Ok(Some(Frame::Stderr(bytes))) => to_stderr(&bytes),
            // The upstream is started once the agent's first message says which revision it
            // speaks; when it cannot be, the desk says so after the welcome.
            Ok(Some(Frame::Welcome(Welcome::Refused { code, message }))) => {
                return Ended::Refused(DeskError::Refused {
                    code: code.code(),
                    message,
                });
            }
            Ok(Some(other)) => return Ended::Lost(format!("the desk sent {other:?}")),
            Ok(None) => return Ended::Lost("the desk closed it".into()),
            Err(e) => return Ended::Lost(e.to_string()),
        }
    }
}

/// The connection `generation` is gone: every request still in flight on it gets an error saying
/// so (`message` says what is known), and the next request connects again. Returns whether the
/// agent is done (then there is nothing to connect again for).
fn answer_lost(link: &Shared, generation: u64, message: impl Fn(&Asked) -> String) -> bool {
    let (lost, agent_done) = {
        let mut state = lock(link);
        if state.generation == generation
            && let Some(desk) = state.desk.take()
        {
            let _ = desk.shutdown(std::net::Shutdown::Both);
        }
        state.replayed.retain(|_, g| *g != generation);
        let lost: Vec<(String, Asked)> = state
            .outstanding
            .extract_if(|_, (g, _)| *g == generation)
            .map(|(key, (_, asked))| (key, asked))
            .collect();
        (lost, state.agent_done)
    };
    for (key, asked) in lost {
        if let Ok(id) = serde_json::from_str::<serde_json::Value>(&key) {
            answer_error(&id, "desk_lost", &message(&asked));
        }
    }
    agent_done
}

/// Copies stdin's lines to the desk as `M` frames until stdin closes.
fn copy_stdin(
    link: &Shared,
    options: &Options,
    readers: &std::sync::mpsc::Sender<(BufReader<FromDesk>, u64)>,
) -> Result<(), DeskError> {
    // What the desk read from stdin and never took comes first (see `take_back`).
    let unread = std::mem::take(&mut lock(link).unread);
    let mut stdin = BufReader::with_capacity(
        64 * 1024,
        std::io::Cursor::new(unread).chain(std::io::stdin().lock()),
    );
    let mut line = Vec::new();
    loop {
        line.clear();
        // At most one frame's worth (plus the newline): a longer line is dropped whole.
        let n = (&mut stdin)
            .take(MAX_FRAME as u64)
            .read_until(b'\n', &mut line)
            .map_err(|e| DeskError::Lost(format!("stdin: {e}")))?;
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
        forward(link, options, readers, std::mem::take(&mut line))?;
    }
}

/// Sends one message of the agent to the desk, connecting again first when the connection was
/// lost and the message is a request. Errors only when the pipe must stop.
fn forward(
    link: &Shared,
    options: &Options,
    readers: &std::sync::mpsc::Sender<(BufReader<FromDesk>, u64)>,
    message: Vec<u8>,
) -> Result<(), DeskError> {
    let kind = Kind::of(&message);
    let asked = match &kind {
        Kind::Request { method, .. } => Some(Asked::of(method, &message)),
        _ => None,
    };
    lock(link).remember(&kind, &message);
    // Encoded once, whatever connection it goes to.
    let frame = match encode(&Frame::Mcp(message)) {
        Ok(frame) => frame,
        Err(e) => {
            eprintln!("countersign mcp: dropped a message from the agent: {e}");
            return Ok(());
        }
    };
    // Sent at most twice: again on a new connection only when it never arrived whole.
    let mut sent = 0;
    loop {
        let (desk, generation) = {
            let mut state = lock(link);
            if let Kind::Response { key } = &kind {
                match state.asked_by_desk.remove(key) {
                    // An answer to a desk that is gone: nobody can take it.
                    Some(g) if g != state.generation || state.desk.is_none() => return Ok(()),
                    None if state.desk.is_none() => return Ok(()),
                    _ => {}
                }
            }
            match state.desk.clone() {
                Some(desk) => {
                    let generation = state.generation;
                    if let (Kind::Request { id, .. }, Some(asked)) = (&kind, &asked) {
                        let entry = (generation, asked.clone());
                        state.outstanding.insert(id.to_string(), entry);
                    }
                    (desk, generation)
                }
                // Lost: a request connects again; anything else has no one to go to.
                None if asked.is_some() && sent < 2 => {
                    drop(state);
                    if connect_again(link, options, readers, &kind)? {
                        continue;
                    }
                    return Ok(()); // answered: no desk answers
                }
                None => return Ok(()),
            }
        };
        sent += 1;
        // One write per frame: the desk sees whole frames as early as possible.
        if (&*desk).write_all(&frame).is_ok() {
            return Ok(());
        }
        // The frame did not arrive whole, so the desk never read it: the connection is gone.
        let mut state = lock(link);
        if state.generation == generation
            && let Some(desk) = state.desk.take()
        {
            let _ = desk.shutdown(std::net::Shutdown::Both);
        }
        if let Kind::Request { id, .. } = &kind {
            if state.outstanding.remove(&id.to_string()).is_none() {
                return Ok(()); // answered already, as lost with its connection
            }
            if sent >= 2 {
                drop(state);
                let message = "Countersign: the connection to the desk broke twice while this \
                               request was being sent, so it was not sent: nothing was executed. \
                               Next: send it again.";
                answer_error(id, "desk_lost", message);
                return Ok(());
            }
        }
    }
}

/// Connects again for the agent's request `kind`, and replays the agent's opening messages on
/// the new connection: `true` once connected. When no desk answers, the request is answered with
/// an error saying so (`false`; the next request tries again); when the desk refuses, the pipe
/// stops.
fn connect_again(
    link: &Shared,
    options: &Options,
    readers: &std::sync::mpsc::Sender<(BufReader<FromDesk>, u64)>,
    kind: &Kind,
) -> Result<bool, DeskError> {
    let Kind::Request { id, method } = kind else {
        return Ok(false);
    };
    let connection = match reconnect(options) {
        Ok(connection) => connection,
        Err(e @ DeskError::Refused { .. }) => {
            answer_error(id, "desk_refused", &e.to_string());
            return Err(e);
        }
        Err(e) => {
            eprintln!("countersign mcp: {e}");
            let message = format!(
                "Countersign: the connection to the desk was lost, and connecting again failed: \
                 {e}. Nothing was sent for this request. Next: start the Countersign desk (or \
                 wait until it is back), then send it again: the gateway connects again on each \
                 request."
            );
            answer_error(id, "desk_unreachable", &message);
            return Ok(false);
        }
    };
    let Connection {
        to_desk, from_desk, ..
    } = connection;
    let mut state = lock(link);
    state.generation += 1;
    let generation = state.generation;
    // The agent's session is re-established transparently: its own opening again (unless this
    // request is that opening), under an id of the pipe's whose answer is dropped.
    let mut replay = Vec::new();
    let reopening = method == "initialize" || method == "server/discover";
    if !reopening && let Some(opening) = &state.opening {
        if let Ok(mut opening) = serde_json::from_slice::<serde_json::Value>(opening) {
            let own = format!("countersign-reconnect-{generation}");
            opening["id"] = serde_json::Value::String(own.clone());
            state
                .replayed
                .insert(serde_json::Value::String(own).to_string(), generation);
            replay.push(opening.to_string().into_bytes());
        }
        if let Some(initialized) = &state.initialized {
            replay.push(initialized.clone());
        }
    }
    let desk = Arc::new(to_desk);
    state.desk = Some(desk.clone());
    drop(state);
    eprintln!(
        "countersign mcp: connected to the desk again; the agent has a new session there, so \
         confirm tokens issued before no longer work"
    );
    // The read half first: the loop that relays it answers what this connection carries.
    if readers.send((from_desk, generation)).is_err() {
        return Err(DeskError::Lost("the relay stopped".into()));
    }
    for message in replay {
        // A failure shows on the next write, which connects again.
        if write_frame(&mut &*desk, &Frame::Mcp(message)).is_err() {
            break;
        }
    }
    Ok(true)
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

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    use super::FromDesk;

    #[test]
    fn the_read_half_returns_what_arrives_and_zero_once_the_desk_closes() {
        let (ours, mut desk) = UnixStream::pair().unwrap();
        let mut from_desk = FromDesk(ours.try_clone().unwrap());
        // The other half writes on the same socket, as the stdin thread does; the desk takes it.
        (&ours).write_all(b"request").unwrap();
        let mut taken = [0u8; 7];
        desk.read_exact(&mut taken).unwrap();
        desk.write_all(b"answer").unwrap();
        let mut buf = [0u8; 16];
        let n = from_desk.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"answer");
        drop(desk);
        assert_eq!(from_desk.read(&mut buf).unwrap(), 0);
    }

    #[test]
    fn the_read_half_keeps_the_sockets_receive_timeout() {
        let (ours, _desk) = UnixStream::pair().unwrap();
        ours.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let mut from_desk = FromDesk(ours);
        let err = from_desk.read(&mut [0u8; 4]).unwrap_err();
        assert!(
            matches!(
                err.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "{err}"
        );
    }
}
