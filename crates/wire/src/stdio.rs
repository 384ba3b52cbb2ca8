//! The agent's stdio, handed from the gateway to the desk (Linux).
//!
//! Why: with the gateway in the middle, every open call crosses two processes and a socket
//! before it reaches the upstream, and the scheduler's wake-ups between them were most of what
//! the desk added to a call (measured: pipe and desk on a CPU 5.8 times per call, two bare relays
//! 4.8). The gateway holds the agent's stdin and stdout, which are pipes or sockets; handing them
//! to the desk takes the gateway and the socket off the path of every message, so that the desk
//! alone stands between the agent and the upstream. Nothing about a decision changes: the desk
//! reads the same lines it read from `M` frames, judged by the same router.
//!
//! How: the gateway says in its hello that it can hand its stdio over ([`crate::Hello::Gateway`]'s
//! `stdio`); a desk that takes it says so in its welcome; the gateway then sends one byte,
//! [`HAND_OVER`], carrying three descriptors ([`send_descriptors`]): its stdin, its stdout, and a
//! memory file it made ([`new_notes_file`]). From then on the desk reads the agent's lines from the
//! first and writes its own to the second; the socket carries only the upstream's stderr and a
//! refusal, and its closing still ends the session either way.
//!
//! The memory file is why the gateway can still answer for a desk that is lost. The desk maps it
//! and writes into it, never reading anything from it that it decides by ([`Notes`]):
//! * the agent's input lands there first: the desk reads stdin straight into a ring in the file,
//!   and takes each line out of the ring only after noting it. A desk that dies at any moment
//!   leaves every byte it consumed from stdin either noted or still in the ring;
//! * which of the agent's requests it has taken and not answered;
//! * the messages that open the agent's session.
//!
//! When the connection closes, the gateway reads it back ([`read_back`]): each request still noted
//! gets the same `desk_lost` answer a gateway that saw every message would give; what is still in
//! the ring was never taken by the desk, so the gateway reads it as the start of its stdin again
//! and sends it to the next desk, after replaying the opening; with that desk it relays, without
//! a hand-over. Writing the file wakes nobody, so it costs the gateway nothing per call.
//!
//! What the file does not cover, and why that is accepted: a request whose id is longer than
//! [`MAX_NOTED_ID`] bytes, or beyond [`SLOTS`] at once, is not noted (no agent uses either); a desk
//! that dies between noting a request and taking it out of the ring leaves both, so the agent may
//! get a `desk_lost` answer and then a second answer from the next desk, which it ignores.
#![allow(unsafe_code)] // this module reaches the OS through libc; each unsafe block says why it is sound

use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;

pub use crate::message::{Asked, Kind, cancelled};

/// The one byte that carries the descriptors.
pub const HAND_OVER: u8 = b'S';

/// How many requests the notes hold at once.
pub const SLOTS: usize = 1024;
/// The longest request id (as JSON text) the notes hold.
pub const MAX_NOTED_ID: usize = 256;
/// Bytes per noted request: a 12-byte head (in use, kind, confirm, lengths, the line's number),
/// the id, and the method or tool (cut to fit).
const SLOT_SIZE: usize = 512;
const SLOT_HEAD: usize = 12;
/// The longest opening message (`initialize`, or `server/discover`) the notes keep.
pub const MAX_OPENING: usize = 1024 * 1024;
/// The longest `notifications/initialized` the notes keep.
const MAX_INITIALIZED: usize = 64 * 1024;
/// The ring the agent's input lands in: room for the longest line and a read after it.
const RING_SIZE: usize = 32 * 1024 * 1024;
/// The most one read takes from stdin (the pages it touches are all the ring costs then).
const READ_CHUNK: usize = 64 * 1024;

// The file's layout. Pages that are never written take no memory.
/// Byte 0: the layout's version.
const VERSION_AT: usize = 0;
const LAYOUT_VERSION: u8 = 1;
/// Byte 1: 1 while the desk writes a line to the agent (which may take it in pieces).
const MID_LINE_AT: usize = 1;
/// Bytes 8..12 and 12..16: the lengths of the opening and of `initialized` (0: none).
const OPENING_LEN_AT: usize = 8;
const INITIALIZED_LEN_AT: usize = 12;
/// Bytes 16..24, the cursor, stored at once: in the low 32 bits where in the ring the input the
/// desk has not taken starts (it goes on up to the ring's first zero byte after it); in the high
/// 32 how many lines it has taken (a request noted under the next number was noted and not yet
/// taken, so the gateway leaves its line out of what it reads again).
const CURSOR_AT: usize = 16;
const OPENING_AT: usize = 4096;
const INITIALIZED_AT: usize = OPENING_AT + MAX_OPENING;
const SLOTS_AT: usize = INITIALIZED_AT + MAX_INITIALIZED;
const RING_AT: usize = 2 * 1024 * 1024;
const _: () = assert!(SLOTS_AT + SLOTS * SLOT_SIZE <= RING_AT);
/// The size the gateway gives the file.
pub const NOTES_SIZE: u64 = (RING_AT + RING_SIZE) as u64;

/// What a descriptor the gateway may hand over is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// A pipe (or FIFO).
    Pipe,
    /// A Unix stream socket.
    Socket,
}

/// What `fd` is, when it may be handed over: a pipe or a Unix stream socket, the only kinds an
/// agent gives a server it launches and the only kinds the desk takes (a terminal, a file, a
/// datagram or network socket is left with the gateway).
pub fn end_of(fd: RawFd) -> Option<End> {
    // SAFETY: an all-zero `stat` is a valid value of that plain C struct.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into the struct it is given, for a descriptor the caller names; a
    // closed or bad one is an error return, not undefined behaviour.
    if unsafe { libc::fstat(fd, &mut stat) } != 0 {
        return None;
    }
    match stat.st_mode & libc::S_IFMT {
        libc::S_IFIFO => Some(End::Pipe),
        libc::S_IFSOCK => {
            let option = |name| {
                let mut value: libc::c_int = 0;
                let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                // SAFETY: `value` and `len` are valid for writes of the sizes given.
                let r = unsafe {
                    libc::getsockopt(
                        fd,
                        libc::SOL_SOCKET,
                        name,
                        (&mut value as *mut libc::c_int).cast(),
                        &mut len,
                    )
                };
                (r == 0).then_some(value)
            };
            (option(libc::SO_DOMAIN) == Some(libc::AF_UNIX)
                && option(libc::SO_TYPE) == Some(libc::SOCK_STREAM))
            .then_some(End::Socket)
        }
        _ => None,
    }
}

/// Whether `fd` may be handed over (see [`end_of`]).
pub fn may_hand_over(fd: RawFd) -> bool {
    end_of(fd).is_some()
}

/// A new, empty memory file of [`NOTES_SIZE`] for the desk's notes, which the desk may seal
/// against shrinking.
pub fn new_notes_file() -> io::Result<File> {
    // SAFETY: a static C string; the call returns a new descriptor or -1.
    let fd = unsafe {
        libc::memfd_create(
            c"countersign-notes".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just made and nothing else owns it.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(NOTES_SIZE)?;
    file.write_all_at(&[LAYOUT_VERSION], VERSION_AT as u64)?;
    Ok(file)
}

/// A message header for the one byte in `iov` and room for `fds` descriptors, in `control`
/// (sized here). The header points into both: they must outlive its use.
fn message(iov: &mut libc::iovec, control: &mut Vec<u8>, fds: usize) -> libc::msghdr {
    let data_len = (fds * std::mem::size_of::<RawFd>()) as u32;
    // SAFETY: CMSG_SPACE is arithmetic.
    let space = unsafe { libc::CMSG_SPACE(data_len) } as usize;
    control.clear();
    control.resize(space, 0);
    // SAFETY: a zeroed msghdr is valid; its pointers are set to live buffers below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    msg
}

/// Sends [`HAND_OVER`] with `fds` attached on the Unix socket `socket` (blocking).
pub fn send_descriptors(socket: RawFd, fds: &[RawFd]) -> io::Result<()> {
    let payload = [HAND_OVER];
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    let data_len = std::mem::size_of_val(fds) as u32;
    let mut control = Vec::new();
    let msg = message(&mut iov, &mut control, fds.len());
    // SAFETY: `control` has room for one header of `data_len` bytes (CMSG_SPACE), so
    // CMSG_FIRSTHDR is not null and CMSG_DATA points inside it; `msg`, `iov` and `payload` live
    // for the whole call.
    unsafe {
        let header = libc::CMSG_FIRSTHDR(&msg);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(data_len) as _;
        std::ptr::copy_nonoverlapping(
            fds.as_ptr().cast::<u8>(),
            libc::CMSG_DATA(header),
            data_len as usize,
        );
        loop {
            let sent = libc::sendmsg(socket, &msg, libc::MSG_NOSIGNAL);
            if sent == 1 {
                return Ok(());
            }
            let err = io::Error::last_os_error();
            if sent < 0 && err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(if sent < 0 {
                err
            } else {
                io::Error::from(io::ErrorKind::WriteZero)
            });
        }
    }
}

/// What [`receive_descriptors`] took from the socket.
#[derive(Debug)]
pub struct Received {
    /// The byte that came (0 when the peer closed).
    pub byte: Option<u8>,
    /// The descriptors that came with it, closed when dropped.
    pub fds: Vec<OwnedFd>,
    /// Whether the peer sent more descriptors (or other control data) than were asked for: the
    /// kernel closed the rest.
    pub truncated: bool,
}

/// Takes one byte and up to `max` descriptors from the Unix socket `socket` without blocking
/// (`WouldBlock` when nothing is there yet). Descriptors are received close-on-exec.
pub fn receive_descriptors(socket: RawFd, max: usize) -> io::Result<Received> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = Vec::new();
    let mut msg = message(&mut iov, &mut control, max);
    // SAFETY: `msg` points at `iov`, `byte` and `control`, all alive for the call.
    let got = unsafe {
        libc::recvmsg(
            socket,
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        )
    };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `control` up to `msg.msg_controllen`; the CMSG macros walk
    // only within it, and every descriptor in an SCM_RIGHTS header is new in this process and
    // owned by nobody else, so each becomes an OwnedFd exactly once.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(header);
                let len = (*header).cmsg_len as usize - (data as usize - header as usize);
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            header = libc::CMSG_NXTHDR(&msg, header);
        }
    }
    Ok(Received {
        byte: (got == 1).then_some(byte[0]),
        fds,
        truncated: msg.msg_flags & libc::MSG_CTRUNC != 0,
    })
}

/// The notes file, mapped into the desk (shared with the gateway, which reads it back).
struct Mapping {
    ptr: *mut u8,
    file: File,
}

// SAFETY: the mapping is owned by one `Notes`, used by one task at a time (behind the desk's
// mutex); the pointer is valid for `NOTES_SIZE` bytes until `Drop` unmaps it.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Seals `file` against shrinking (so the mapping can never lose pages under the desk, which
    /// would be a SIGBUS) and maps its first [`NOTES_SIZE`] bytes.
    fn new(file: File) -> io::Result<Mapping> {
        let fd = file.as_raw_fd();
        // SAFETY: fcntl on a descriptor `file` owns. Adding a seal fails unless the file is a
        // memory file made to take seals and not sealed against seals: anything else is refused.
        if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) } < 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "not a memory file that can be sealed: {}",
                    io::Error::last_os_error()
                ),
            ));
        }
        // Only an ordinary memory file: one backed by huge pages could fault with no page to
        // give (SIGBUS) after its owner punched a hole in it.
        // SAFETY: an all-zero `statfs` is a valid value of that plain C struct.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: fstatfs writes into the struct it is given; a bad descriptor is an error return.
        if unsafe { libc::fstatfs(fd, &mut fs) } != 0 || fs.f_type != libc::TMPFS_MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not an ordinary memory file",
            ));
        }
        // After the seal: nobody can make it smaller than this now.
        if file.metadata()?.len() < NOTES_SIZE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "smaller than the notes need",
            ));
        }
        // SAFETY: a new shared mapping of a file at least `NOTES_SIZE` long that cannot shrink.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                NOTES_SIZE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            file,
        })
    }

    fn write(&self, at: usize, bytes: &[u8]) {
        assert!(
            at + bytes.len() <= NOTES_SIZE as usize,
            "a write past the notes"
        );
        // SAFETY: in bounds (checked above) of a live mapping. The gateway may write into the
        // same pages (it is the agent's); nothing the desk decides is read back from them.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(at), bytes.len()) }
    }

    fn read(&self, at: usize, out: &mut [u8]) {
        assert!(
            at + out.len() <= NOTES_SIZE as usize,
            "a read past the notes"
        );
        // SAFETY: as in `write`. What is read is the agent's input, hostile whatever it holds.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(at), out.as_mut_ptr(), out.len()) }
    }

    /// Zeroes `len` bytes from `at`, giving back every whole page among them (a hole reads as
    /// zeros), so that input the desk has taken costs it no memory however far it went. The
    /// first byte is zeroed first: a desk that dies half-way leaves a zero where the gateway
    /// starts to read.
    fn zero(&self, at: usize, len: usize) {
        const PAGE: usize = 4096;
        let end = at + len;
        assert!(end <= NOTES_SIZE as usize, "a write past the notes");
        let inner = at.next_multiple_of(PAGE).min(end);
        let inner_end = (end / PAGE * PAGE).max(inner);
        // SAFETY: every range below is inside [at, end), in bounds as checked above.
        unsafe {
            std::ptr::write_bytes(self.ptr.add(at), 0, inner - at);
            if inner_end > inner {
                let punched = libc::fallocate(
                    self.file.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    inner as libc::off_t,
                    (inner_end - inner) as libc::off_t,
                );
                if punched != 0 {
                    std::ptr::write_bytes(self.ptr.add(inner), 0, inner_end - inner);
                }
            }
            std::ptr::write_bytes(self.ptr.add(inner_end), 0, end - inner_end);
        }
    }

    /// Stores `value` at `at` (8-aligned) in one store: a desk that dies leaves the old value or
    /// the new one, never half of each.
    fn store_u64(&self, at: usize, value: u64) {
        assert!(
            at.is_multiple_of(8) && at + 8 <= NOTES_SIZE as usize,
            "an unaligned store"
        );
        // SAFETY: aligned (the mapping is page-aligned) and in bounds, as checked above.
        unsafe { std::ptr::write_volatile(self.ptr.add(at).cast::<u64>(), value.to_le()) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe {
            libc::munmap(self.ptr.cast(), NOTES_SIZE as usize);
        }
    }
}

impl fmt::Debug for Mapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Mapping")
    }
}

/// What [`Notes::next_line`] found in the ring.
#[derive(Debug, PartialEq)]
pub enum Taken {
    /// One message of the agent's (its line without the end), noted.
    Line(Vec<u8>),
    /// A line longer than a frame, dropped whole (the caller says so in the log).
    Dropped,
    /// No whole line yet: read more.
    Wanting,
}

/// The desk's notes for one handed-over connection (see the module's documentation): the ring
/// the agent's input lands in, the requests taken and not answered, the opening. The gateway made
/// the file and may write into it too, so nothing the desk decides comes from it except the
/// agent's own input, which is hostile whatever it says.
#[derive(Debug)]
pub struct Notes {
    map: Mapping,
    /// Request id (JSON text) → its slot.
    slots: std::collections::HashMap<String, usize>,
    free: Vec<usize>,
    /// Slots never used yet start here.
    unused: usize,
    opening_kept: bool,
    /// Where in the ring the input not yet taken starts, and how many bytes of it there are.
    start: usize,
    held: usize,
    /// How many of those bytes are known to hold no line end.
    scanned: usize,
    /// How many lines the desk has taken out of the ring (wrapping).
    lines: u32,
    /// The bytes `line_end` looks through.
    scan: Vec<u8>,
    /// Inside a line longer than a frame: dropped up to its end.
    skipping: bool,
}

impl Notes {
    /// Notes in `file`: it must be a memory file of at least [`NOTES_SIZE`] that takes seals (the
    /// desk seals it against shrinking and maps it).
    pub fn new(file: File) -> io::Result<Notes> {
        Ok(Notes {
            map: Mapping::new(file)?,
            slots: std::collections::HashMap::new(),
            free: Vec::new(),
            unused: 0,
            opening_kept: false,
            start: 0,
            held: 0,
            scanned: 0,
            lines: 0,
            scan: Vec::new(),
            skipping: false,
        })
    }

    /// Reads from the agent's stdin `fd`, a pipe opened non-blocking or a socket (read with
    /// `MSG_DONTWAIT`, whatever its flags say), into the ring: the bytes read, 0 at its end. A
    /// desk that dies right after leaves them in the ring for the gateway.
    pub fn read_input(&mut self, fd: RawFd, end: End) -> io::Result<usize> {
        let at = (self.start + self.held) % RING_SIZE;
        let room = (RING_SIZE - self.held).min(RING_SIZE - at).min(READ_CHUNK);
        debug_assert!(
            room > 0,
            "a line longer than a frame is dropped before the ring fills"
        );
        // SAFETY: `room` bytes from `RING_AT + at` are inside the mapping (at + room <= RING_SIZE)
        // and hold nothing the desk still needs (they are past what it holds).
        let n = unsafe {
            let into = self.map.ptr.add(RING_AT + at).cast();
            match end {
                End::Pipe => libc::read(fd, into, room),
                End::Socket => libc::recv(fd, into, room, libc::MSG_DONTWAIT),
            }
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        self.held += n as usize;
        Ok(n as usize)
    }

    /// Takes the next line out of the ring, noting it first: a request is in flight until
    /// [`Notes::answered`]; the opening is kept; a cancellation clears what it cancels. Blank
    /// lines are skipped. At the end of input (`ended`), what is left without a line end is the
    /// last line.
    pub fn next_line(&mut self, ended: bool) -> Taken {
        loop {
            let len = match self.line_end() {
                Some(len) => len,
                None if ended && self.held > 0 => self.held,
                None => {
                    if self.held >= crate::MAX_FRAME {
                        // No frame is this long: drop what came, and the rest up to its end.
                        self.forget(self.held);
                        let was = std::mem::replace(&mut self.skipping, true);
                        if !was {
                            return Taken::Dropped;
                        }
                    }
                    return Taken::Wanting;
                }
            };
            if std::mem::replace(&mut self.skipping, false) {
                self.forget(len);
                continue;
            }
            if len > crate::MAX_FRAME {
                // Its end came in the read that took it past a frame's length.
                self.forget(len);
                return Taken::Dropped;
            }
            let mut line = vec![0u8; len];
            self.copy_out(&mut line);
            while matches!(line.last(), Some(b'\n' | b'\r')) {
                line.pop();
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                self.forget(len);
                continue;
            }
            // Noted before it leaves the ring, under the number it leaves with: at no moment is it
            // in neither, and where it is in both the gateway reads the number and keeps one.
            self.took(&line, self.lines.wrapping_add(1));
            self.forget(len);
            return Taken::Line(line);
        }
    }

    /// The length of the first line in the ring, its `\n` included, if it has ended.
    fn line_end(&mut self) -> Option<usize> {
        while self.scanned < self.held {
            let at = (self.start + self.scanned) % RING_SIZE;
            let len = (self.held - self.scanned).min(RING_SIZE - at);
            // Scanned through a buffer kept for it: no allocation per line.
            self.scan.resize(len, 0);
            self.map.read(RING_AT + at, &mut self.scan);
            match self.scan.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    self.scanned += i;
                    return Some(self.scanned + 1);
                }
                None => self.scanned += len,
            }
        }
        None
    }

    /// Copies the first `out.len()` bytes the ring holds.
    fn copy_out(&self, out: &mut [u8]) {
        let first = out.len().min(RING_SIZE - self.start);
        self.map.read(RING_AT + self.start, &mut out[..first]);
        let rest = out.len() - first;
        if rest > 0 {
            self.map.read(RING_AT, &mut out[first..]);
        }
    }

    /// Takes the first `len` bytes out of the ring and zeroes them. The ring starts over at its
    /// beginning whenever it is left empty, so that a session's input keeps landing in the same
    /// few pages. Ordered for a desk that may die between any two steps: where more input
    /// follows, the new start is written before the bytes are zeroed (the gateway reads from
    /// there); where none does, the bytes are zeroed first (the gateway finds nothing wherever
    /// it looks). Never a line twice, never one lost.
    fn forget(&mut self, len: usize) {
        let from = self.start;
        self.held -= len;
        self.scanned = self.scanned.saturating_sub(len);
        let first = len.min(RING_SIZE - from);
        let zero = |map: &Mapping| {
            map.zero(RING_AT + from, first);
            if len > first {
                map.zero(RING_AT, len - first);
            }
        };
        self.lines = self.lines.wrapping_add(1);
        if self.held == 0 {
            zero(&self.map);
            self.start = 0;
            self.scanned = 0;
            self.map.store_u64(CURSOR_AT, cursor(self.lines, 0));
        } else {
            self.start = (from + len) % RING_SIZE;
            self.map
                .store_u64(CURSOR_AT, cursor(self.lines, self.start));
            zero(&self.map);
        }
    }

    /// Notes a message of the agent's, as taken under the line number `seq`.
    fn took(&mut self, line: &[u8], seq: u32) {
        match Kind::of(line) {
            Kind::Request { id, method } => {
                if method == "initialize" || (method == "server/discover" && !self.opening_kept) {
                    self.keep(OPENING_LEN_AT, OPENING_AT, MAX_OPENING, line);
                    self.opening_kept = true;
                    if method == "initialize" {
                        self.map.write(INITIALIZED_LEN_AT, &0u32.to_le_bytes());
                    }
                }
                let asked = Asked::of(&method, line);
                self.in_flight(id.to_string(), &asked, seq);
            }
            Kind::Other { method: Some(m) } if m == "notifications/initialized" => {
                self.keep(INITIALIZED_LEN_AT, INITIALIZED_AT, MAX_INITIALIZED, line);
            }
            Kind::Other { method: Some(m) } if m == "notifications/cancelled" => {
                if let Some(key) = cancelled(line) {
                    self.clear(&key);
                }
            }
            _ => {}
        }
    }

    /// Notes a message the desk sends the agent: an answer clears its request.
    pub fn answered(&mut self, line: &[u8]) {
        if self.slots.is_empty() {
            return; // nothing in flight: no need to read the message
        }
        if let Kind::Response { key } = Kind::of(line) {
            self.clear(&key);
        }
    }

    /// Says whether a line that may reach the agent in pieces is being written.
    pub fn mid_line(&self, writing: bool) {
        self.map.write(MID_LINE_AT, &[u8::from(writing)]);
    }

    fn keep(&self, len_at: usize, at: usize, max: usize, line: &[u8]) {
        // Length 0 first: a desk that dies half-way leaves nothing, never a torn message.
        self.map.write(len_at, &0u32.to_le_bytes());
        if line.len() > max {
            return;
        }
        self.map.write(at, line);
        self.map.write(len_at, &(line.len() as u32).to_le_bytes());
    }

    fn in_flight(&mut self, key: String, asked: &Asked, seq: u32) {
        if key.len() > MAX_NOTED_ID {
            return;
        }
        let slot = match self.slots.get(&key) {
            Some(&slot) => slot,
            None => match self.free.pop() {
                Some(slot) => slot,
                None if self.unused < SLOTS => {
                    self.unused += 1;
                    self.unused - 1
                }
                None => return,
            },
        };
        let (kind, confirm, name) = match asked {
            Asked::Call { tool, confirm } => (1u8, *confirm, tool.as_str()),
            Asked::Other { method } => (2u8, false, method.as_str()),
        };
        let room = SLOT_SIZE - SLOT_HEAD - key.len();
        let mut cut = name.len().min(room);
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        let name = &name[..cut];
        let mut body = Vec::with_capacity(SLOT_SIZE);
        body.extend_from_slice(&[kind, u8::from(confirm), 0]);
        body.extend_from_slice(&(key.len() as u16).to_le_bytes());
        body.extend_from_slice(&(name.len() as u16).to_le_bytes());
        body.extend_from_slice(&seq.to_le_bytes());
        body.extend_from_slice(key.as_bytes());
        body.extend_from_slice(name.as_bytes());
        self.slots.insert(key, slot);
        // The body, then the byte that makes it count: never a slot in use with half a body.
        self.map.write(slot_at(slot) + 1, &body);
        self.map.write(slot_at(slot), &[1]);
    }

    fn clear(&mut self, key: &str) {
        let Some(slot) = self.slots.remove(key) else {
            return;
        };
        self.free.push(slot);
        self.map.write(slot_at(slot), &[0]);
    }
}

/// The cursor's value: `lines` taken, the rest starting at `start`.
fn cursor(lines: u32, start: usize) -> u64 {
    (u64::from(lines) << 32) | start as u64
}

fn slot_at(slot: usize) -> usize {
    SLOTS_AT + slot * SLOT_SIZE
}

/// What the gateway reads back from the notes once the connection has closed.
#[derive(Debug, Default, PartialEq)]
pub struct ReadBack {
    /// The requests taken and not answered: id (JSON text) and what each asked.
    pub in_flight: Vec<(String, Asked)>,
    /// The agent's opening message, when kept.
    pub opening: Option<Vec<u8>>,
    /// The agent's `notifications/initialized`, when kept.
    pub initialized: Option<Vec<u8>>,
    /// Input the desk read from stdin and never took: the gateway's stdin starts with it.
    pub unread: Vec<u8>,
    /// The desk was writing a line to the agent that may have arrived in part: the agent's
    /// input may end in half a line, which the gateway ends before it writes.
    pub mid_line: bool,
}

/// Reads the notes back (the gateway, after the connection closed).
pub fn read_back(file: &File) -> io::Result<ReadBack> {
    let mut head = [0u8; 24];
    file.read_exact_at(&mut head, 0)?;
    let u32_at = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    let kept = |len: u32, at: usize, max: usize| -> io::Result<Option<Vec<u8>>> {
        let len = len as usize;
        if len == 0 || len > max {
            return Ok(None);
        }
        let mut bytes = vec![0u8; len];
        file.read_exact_at(&mut bytes, at as u64)?;
        Ok(Some(bytes))
    };
    let opening = kept(u32_at(OPENING_LEN_AT), OPENING_AT, MAX_OPENING)?;
    let initialized = kept(u32_at(INITIALIZED_LEN_AT), INITIALIZED_AT, MAX_INITIALIZED)?;
    let mut slots = vec![0u8; SLOTS * SLOT_SIZE];
    file.read_exact_at(&mut slots, SLOTS_AT as u64)?;
    let cursor = u64::from_le_bytes(head[CURSOR_AT..CURSOR_AT + 8].try_into().expect("8 bytes"));
    let (lines, start) = ((cursor >> 32) as u32, cursor & 0xffff_ffff);
    let mut noted_not_taken = false;
    let mut in_flight = Vec::new();
    for slot in slots.chunks_exact(SLOT_SIZE) {
        if slot[0] != 1 {
            continue;
        }
        let id_len = u16::from_le_bytes([slot[4], slot[5]]) as usize;
        let name_len = u16::from_le_bytes([slot[6], slot[7]]) as usize;
        if SLOT_HEAD + id_len + name_len > SLOT_SIZE || id_len > MAX_NOTED_ID {
            continue;
        }
        let seq = u32::from_le_bytes([slot[8], slot[9], slot[10], slot[11]]);
        let (Ok(key), Ok(name)) = (
            std::str::from_utf8(&slot[SLOT_HEAD..SLOT_HEAD + id_len]),
            std::str::from_utf8(&slot[SLOT_HEAD + id_len..SLOT_HEAD + id_len + name_len]),
        ) else {
            continue;
        };
        let asked = match slot[1] {
            1 => Asked::Call {
                tool: name.to_owned(),
                confirm: slot[2] == 1,
            },
            _ => Asked::Other {
                method: name.to_owned(),
            },
        };
        if seq == lines.wrapping_add(1) {
            noted_not_taken = true;
        }
        in_flight.push((key.to_owned(), asked));
    }
    // The ring from where the desk stopped taking, up to its first zero byte (input is JSON
    // text, which has none; an agent that sends one only cuts its own input short here).
    let mut unread = Vec::new();
    let mut at = (start % RING_SIZE as u64) as usize;
    while unread.len() < RING_SIZE {
        let len = READ_CHUNK.min(RING_SIZE - at);
        let mut chunk = vec![0u8; len];
        file.read_exact_at(&mut chunk, (RING_AT + at) as u64)?;
        match chunk.iter().position(|&b| b == 0) {
            Some(i) => {
                unread.extend_from_slice(&chunk[..i]);
                break;
            }
            None => unread.extend_from_slice(&chunk),
        }
        at = (at + len) % RING_SIZE;
    }
    unread.truncate(RING_SIZE);
    if noted_not_taken {
        // The desk died between noting the first line there and taking it out: it is answered
        // as noted, so it is not read again.
        let first = unread
            .iter()
            .position(|&b| b == b'\n')
            .map_or(unread.len(), |i| i + 1);
        unread.drain(..first);
    }
    Ok(ReadBack {
        in_flight,
        opening,
        initialized,
        unread,
        mid_line: head[MID_LINE_AT] == 1,
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    use super::*;

    /// Notes on a new file, the gateway's copy of the file, and the agent's end of its stdin.
    struct Desk {
        notes: Notes,
        file: File,
        agent: UnixStream,
        stdin: UnixStream,
    }

    fn desk() -> Desk {
        let file = new_notes_file().unwrap();
        let (agent, stdin) = UnixStream::pair().unwrap();
        // Left blocking, as a gateway may leave it: the desk reads sockets with MSG_DONTWAIT.
        Desk {
            notes: Notes::new(file.try_clone().unwrap()).unwrap(),
            file,
            agent,
            stdin,
        }
    }

    impl Desk {
        /// The agent writes `bytes`; the desk reads all of it into the ring.
        fn send(&mut self, bytes: &[u8]) {
            self.agent.write_all(bytes).unwrap();
            let mut got = 0;
            while got < bytes.len() {
                got += self
                    .notes
                    .read_input(self.stdin.as_raw_fd(), End::Socket)
                    .unwrap();
            }
        }

        /// Every whole line the ring holds now.
        fn lines(&mut self) -> Vec<String> {
            let mut lines = Vec::new();
            while let Taken::Line(line) = self.notes.next_line(false) {
                lines.push(String::from_utf8(line).unwrap());
            }
            lines
        }

        /// Waits (up to 5 s) for the agent's next bytes, and reads what came into the ring.
        fn read_when_ready(&mut self) {
            let mut ready = libc::pollfd {
                fd: self.stdin.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut ready, 1, 5000) };
            self.notes
                .read_input(self.stdin.as_raw_fd(), End::Socket)
                .unwrap();
        }

        fn back(&self) -> ReadBack {
            read_back(&self.file).unwrap()
        }
    }

    #[test]
    fn a_request_is_in_flight_until_its_answer_and_a_cancel_clears_it() {
        let mut desk = desk();
        desk.send(concat!(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"write","arguments":{"confirm":true}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":"1","method":"tools/list"}"#,
            "\r\n\n   \n",
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"read"}}"#,
            "\n"
        ).as_bytes());
        assert_eq!(desk.lines().len(), 3);
        let back = desk.back();
        assert_eq!(back.in_flight.len(), 3);
        assert!(back.unread.is_empty());
        assert!(back.in_flight.contains(&(
            "1".into(),
            Asked::Call {
                tool: "write".into(),
                confirm: true
            }
        )));
        // The answer to 1 (the number) leaves "1" (the string) in flight.
        desk.notes
            .answered(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
        desk.send(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":2}}\n");
        assert_eq!(desk.lines().len(), 1);
        assert_eq!(
            desk.back().in_flight,
            vec![(
                "\"1\"".into(),
                Asked::Other {
                    method: "tools/list".into()
                }
            )]
        );
    }

    #[test]
    fn input_not_taken_yet_is_read_back_whole_and_a_taken_request_is_noted_never_neither() {
        let mut desk = desk();
        let first = r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#;
        let half = r#"{"jsonrpc":"2.0","id":8,"meth"#;
        desk.send(format!("{first}\n{half}").as_bytes());
        // Read, not taken: all of it is the gateway's to read again; nothing is in flight.
        let back = desk.back();
        assert_eq!(back.unread, format!("{first}\n{half}").as_bytes());
        assert!(back.in_flight.is_empty());
        // Taken: noted, and gone from what is read back.
        assert_eq!(desk.lines(), vec![first.to_owned()]);
        let back = desk.back();
        assert_eq!(back.unread, half.as_bytes());
        assert_eq!(back.in_flight.len(), 1);
        // The rest of the line arrives in another read.
        desk.send(b"od\":\"ping\"}\n");
        assert_eq!(desk.lines().len(), 1);
        let back = desk.back();
        assert!(
            back.unread.is_empty(),
            "{:?}",
            String::from_utf8_lossy(&back.unread)
        );
        assert_eq!(back.in_flight.len(), 2);
    }

    #[test]
    fn the_ring_wraps_and_what_is_read_back_stays_in_order() {
        let mut desk = desk();
        // Input that never leaves the ring empty (each read ends in half a line) walks the ring
        // forward until it wraps.
        desk.send(b"{");
        let pad = "x".repeat(60_000);
        let mut sent = 1;
        while sent + pad.len() + 2 < RING_SIZE - 1000 {
            desk.send(format!("{pad}\n{{").as_bytes());
            assert_eq!(desk.lines().len(), 1);
            sent += pad.len() + 2;
        }
        let pad = "x".repeat(1000);
        while sent + pad.len() + 2 < RING_SIZE - 2000 {
            desk.send(format!("{pad}\n{{").as_bytes());
            assert_eq!(desk.lines().len(), 1);
            sent += pad.len() + 2;
        }
        let tail = format!(
            r#""jsonrpc":"2.0","id":"w","method":"ping","params":{{"pad":"{}"}}}}"#,
            "y".repeat(3000)
        );
        desk.send(format!("{tail}\n{{{tail}").as_bytes());
        assert!(
            desk.notes.start + desk.notes.held > RING_SIZE,
            "the ring did not wrap"
        );
        let back = desk.back();
        assert_eq!(back.unread, format!("{{{tail}\n{{{tail}").as_bytes());
        assert_eq!(desk.lines(), vec![format!("{{{tail}")]);
        assert_eq!(desk.back().unread, format!("{{{tail}").as_bytes());
        assert_eq!(
            desk.notes.next_line(true),
            Taken::Line(format!("{{{tail}").into_bytes())
        );
        // Empty again: the ring starts over at its beginning, and nothing is left to read back.
        assert!(desk.back().unread.is_empty());
        assert_eq!(desk.notes.start, 0);
    }

    #[test]
    fn a_line_longer_than_a_frame_is_dropped_whole_and_the_next_one_is_read() {
        let mut desk = desk();
        let next = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        let writer = {
            let mut agent = desk.agent.try_clone().unwrap();
            let next = next.to_owned();
            std::thread::spawn(move || {
                agent.write_all(&vec![b'z'; crate::MAX_FRAME + 5]).unwrap();
                agent.write_all(format!("\n{next}\n").as_bytes()).unwrap();
            })
        };
        let (mut dropped, mut lines) = (0, Vec::new());
        while lines.is_empty() {
            match desk.notes.next_line(false) {
                Taken::Line(line) => lines.push(line),
                Taken::Dropped => dropped += 1,
                Taken::Wanting => desk.read_when_ready(),
            }
        }
        writer.join().unwrap();
        assert_eq!(dropped, 1);
        assert_eq!(lines, vec![next.as_bytes().to_vec()]);
    }

    #[test]
    fn a_blocking_socket_never_blocks_the_desk() {
        let mut desk = desk();
        let err = desk
            .notes
            .read_input(desk.stdin.as_raw_fd(), End::Socket)
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn a_request_noted_and_not_yet_taken_out_is_answered_once_and_not_read_again() {
        let mut desk = desk();
        let first = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"write"}}"#;
        let second = r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#;
        desk.send(format!("{first}\n{second}\n").as_bytes());
        // The desk dies after noting the first line and before taking it out of the ring.
        let seq = desk.notes.lines.wrapping_add(1);
        desk.notes.took(first.as_bytes(), seq);
        let back = desk.back();
        assert_eq!(back.in_flight.len(), 1);
        assert_eq!(back.unread, format!("{second}\n").as_bytes());
        // Taken out, the same: the line is in exactly one of the two.
        desk.notes.forget(first.len() + 1);
        let back = desk.back();
        assert_eq!(back.in_flight.len(), 1);
        assert_eq!(back.unread, format!("{second}\n").as_bytes());
    }

    #[test]
    fn input_taken_out_gives_its_pages_back() {
        let mut desk = desk();
        let allocated = |file: &File| {
            use std::os::unix::fs::MetadataExt;
            file.metadata().unwrap().blocks() * 512
        };
        let before = allocated(&desk.file);
        let writer = {
            let mut agent = desk.agent.try_clone().unwrap();
            std::thread::spawn(move || {
                agent.write_all(&vec![b'a'; 4 * 1024 * 1024]).unwrap();
                agent.write_all(b"\n").unwrap();
            })
        };
        let mut taken = None;
        while taken.is_none() {
            match desk.notes.next_line(false) {
                Taken::Line(line) => taken = Some(line.len()),
                Taken::Dropped => panic!("a 4 MiB line is not too long"),
                Taken::Wanting => desk.read_when_ready(),
            }
        }
        writer.join().unwrap();
        assert_eq!(taken, Some(4 * 1024 * 1024));
        let after = allocated(&desk.file);
        assert!(
            after <= before + 64 * 1024,
            "the ring kept {} KiB after its input was taken",
            (after - before) / 1024
        );
    }

    #[test]
    fn the_opening_is_kept_and_a_new_initialize_forgets_the_old_initialized() {
        let mut desk = desk();
        assert_eq!(desk.back(), ReadBack::default());
        let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#;
        let done = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        desk.send(format!("{init}\n{done}\n").as_bytes());
        desk.lines();
        desk.notes
            .answered(br#"{"jsonrpc":"2.0","id":0,"result":{}}"#);
        let back = desk.back();
        assert_eq!(back.opening.as_deref(), Some(init.as_bytes()));
        assert_eq!(back.initialized.as_deref(), Some(done.as_bytes()));
        assert!(back.in_flight.is_empty());
        // A probe after the opening does not replace it; a second initialize does.
        desk.send(b"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"server/discover\"}\n");
        desk.lines();
        assert_eq!(desk.back().opening.as_deref(), Some(init.as_bytes()));
        let again = r#"{"jsonrpc":"2.0","id":9,"method":"initialize","params":{"x":1}}"#;
        desk.send(format!("{again}\n").as_bytes());
        desk.lines();
        let back = desk.back();
        assert_eq!(back.opening.as_deref(), Some(again.as_bytes()));
        assert_eq!(back.initialized, None);
    }

    #[test]
    fn ids_too_long_and_requests_beyond_the_slots_are_not_noted_and_break_nothing() {
        let mut desk = desk();
        let long = "x".repeat(MAX_NOTED_ID);
        desk.send(
            format!("{{\"jsonrpc\":\"2.0\",\"id\":\"{long}\",\"method\":\"ping\"}}\n").as_bytes(),
        );
        assert_eq!(desk.lines().len(), 1);
        assert!(desk.back().in_flight.is_empty());
        for i in 0..SLOTS + 10 {
            desk.send(
                format!("{{\"jsonrpc\":\"2.0\",\"id\":{i},\"method\":\"ping\"}}\n").as_bytes(),
            );
            desk.lines();
        }
        assert_eq!(desk.back().in_flight.len(), SLOTS);
        // Answers free slots for the next requests.
        desk.notes
            .answered(br#"{"jsonrpc":"2.0","id":3,"result":{}}"#);
        desk.send(b"{\"jsonrpc\":\"2.0\",\"id\":\"late\",\"method\":\"ping\"}\n");
        desk.lines();
        let back = desk.back();
        assert_eq!(back.in_flight.len(), SLOTS);
        assert!(back.in_flight.iter().any(|(k, _)| k == "\"late\""));
        assert!(!back.in_flight.iter().any(|(k, _)| k == "3"));
    }

    #[test]
    fn a_long_tool_name_is_cut_at_a_character_boundary() {
        let mut desk = desk();
        let name = "é".repeat(400);
        desk.send(
            format!("{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{{\"name\":\"{name}\"}}}}\n").as_bytes(),
        );
        desk.lines();
        let back = desk.back();
        let [(_, Asked::Call { tool, .. })] = &back.in_flight[..] else {
            panic!("{back:?}");
        };
        assert!(
            name.starts_with(tool.as_str()) && tool.len() > 400,
            "{}",
            tool.len()
        );
    }

    #[test]
    fn the_mid_line_mark_is_read_back() {
        let desk = desk();
        desk.notes.mid_line(true);
        assert!(desk.back().mid_line);
        desk.notes.mid_line(false);
        assert!(!desk.back().mid_line);
    }

    #[test]
    fn only_a_sealable_memory_file_of_the_right_size_takes_notes() {
        let path = std::env::temp_dir().join(format!("notes-test-{}", std::process::id()));
        let plain = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        plain.set_len(NOTES_SIZE).unwrap();
        assert!(Notes::new(plain).is_err());
        let _ = std::fs::remove_file(&path);
        let small = new_notes_file().unwrap();
        small.set_len(16).unwrap();
        assert!(Notes::new(small).is_err());
        // A memory file that does not take seals could be shrunk under the desk's mapping.
        // SAFETY: a static C string.
        let fd = unsafe { libc::memfd_create(c"unsealable".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: new and owned by nobody else.
        let unsealable = unsafe { File::from_raw_fd(fd) };
        unsealable.set_len(NOTES_SIZE).unwrap();
        assert!(Notes::new(unsealable).is_err());
        // Once the desk has it, nobody can shrink it.
        let file = new_notes_file().unwrap();
        let _notes = Notes::new(file.try_clone().unwrap()).unwrap();
        assert!(file.set_len(16).is_err());
    }

    #[test]
    fn descriptors_cross_a_socket_and_extra_ones_are_closed_by_the_kernel() {
        let (a, b) = UnixStream::pair().unwrap();
        let (p, q) = UnixStream::pair().unwrap();
        send_descriptors(
            a.as_raw_fd(),
            &[p.as_raw_fd(), q.as_raw_fd(), p.as_raw_fd()],
        )
        .unwrap();
        let got = receive_descriptors(b.as_raw_fd(), 2).unwrap();
        assert_eq!(got.byte, Some(HAND_OVER));
        assert_eq!(got.fds.len(), 2);
        assert!(got.truncated);
        assert!(may_hand_over(got.fds[0].as_raw_fd()));
        // Nothing more: WouldBlock; the peer gone: no byte.
        let err = receive_descriptors(b.as_raw_fd(), 2).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        drop(a);
        let got = receive_descriptors(b.as_raw_fd(), 2).unwrap();
        assert_eq!(got.byte, None);
        assert!(got.fds.is_empty());
    }
}
