//! The desk's side of the agent's stdio handed over by the gateway (Linux; the protocol and why
//! are in `countersign_wire::stdio`).
//!
//! Everything the gateway sends is checked as hostile: exactly one byte, [`HAND_OVER`], with
//! exactly three descriptors; the first two pipes or sockets, readable and writable as their
//! places say; the third a memory file of the notes' size that the desk can seal against
//! shrinking. Anything else closes the connection (the gateway offered, so a gateway that then
//! sends something else is broken or hostile). The agent's lines are then read here with the
//! bounds the socket's frames have: at most one frame's length (a longer line is dropped whole
//! and said so), and a line that has begun must end within the frame deadline.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use countersign_wire::MAX_FRAME;
use countersign_wire::stdio::{
    ATOMIC_LINE, HAND_OVER, Notes, Taken, may_hand_over, receive_descriptors,
};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tokio::net::unix::pipe;

/// The agent's stdin and stdout, taken from the gateway, and the notes the gateway reads back.
pub(crate) struct Handed {
    pub(crate) lines: Lines,
    pub(crate) output: Output,
}

/// Takes the descriptors the gateway sends after a welcome that said the desk would, within
/// `deadline`. The error says why, for the log.
pub(crate) async fn take(stream: &UnixStream, deadline: Duration) -> Result<Handed, String> {
    let fd = stream.as_raw_fd();
    let received = tokio::time::timeout(
        deadline,
        stream.async_io(Interest::READABLE, || receive_descriptors(fd, 3)),
    )
    .await
    .map_err(|_| format!("the gateway sent no stdio within {deadline:?}"))?
    .map_err(|e| format!("could not receive the gateway's stdio: {e}"))?;
    if received.byte != Some(HAND_OVER) || received.truncated || received.fds.len() != 3 {
        return Err(format!(
            "the gateway sent {:?} with {} descriptors{} instead of its stdio",
            received.byte,
            received.fds.len(),
            if received.truncated { " and more" } else { "" }
        ));
    }
    let mut fds = received.fds.into_iter();
    let (input, output, notes) = (fds.next(), fds.next(), fds.next());
    let (Some(input), Some(output), Some(notes)) = (input, output, notes) else {
        unreachable!("three descriptors were counted");
    };
    let input = stream_end(input, false).map_err(|e| format!("the agent's stdin: {e}"))?;
    let output = stream_end(output, true).map_err(|e| format!("the agent's stdout: {e}"))?;
    let notes = Notes::new(File::from(notes)).map_err(|e| format!("the gateway's notes: {e}"))?;
    let notes = Arc::new(Mutex::new(notes));
    Ok(Handed {
        lines: Lines {
            // Any descriptor the runtime can wait on reads as a pipe's read end does.
            input: pipe::Receiver::from_owned_fd_unchecked(input)
                .map_err(|e| format!("the agent's stdin: {e}"))?,
            notes: notes.clone(),
            ended: false,
        },
        output: Output {
            writer: pipe::Sender::from_owned_fd_unchecked(output).map_err(|e| e.to_string())?,
            notes,
        },
    })
}

/// Checks that `fd` is a pipe or a socket open for reading (or, with `write`, for writing), and
/// makes it non-blocking, as the runtime needs. The gateway clears the flag again when it takes
/// its stdio back.
fn stream_end(fd: OwnedFd, write: bool) -> io::Result<OwnedFd> {
    if !may_hand_over(fd.as_raw_fd()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a pipe or a socket",
        ));
    }
    // SAFETY: fcntl on a descriptor `fd` owns.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let mode = flags & libc::O_ACCMODE;
    let fits = if write {
        mode == libc::O_WRONLY || mode == libc::O_RDWR
    } else {
        mode == libc::O_RDONLY || mode == libc::O_RDWR
    };
    if !fits {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not open in the direction its place needs",
        ));
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// The agent's stdin, line by line, through the notes' ring.
pub(crate) struct Lines {
    input: pipe::Receiver,
    notes: Arc<Mutex<Notes>>,
    ended: bool,
}

impl Lines {
    /// The next message (a line without its end), noted; `None` once the agent closed stdin.
    /// Waiting for a line to begin has no limit; once it has begun it must end within
    /// `deadline`. A line longer than a frame is dropped whole (and said so), as the gateway
    /// drops one; blank lines are skipped.
    pub(crate) async fn next(&mut self, deadline: Duration) -> io::Result<Option<Vec<u8>>> {
        let mut began: Option<tokio::time::Instant> = None;
        loop {
            match lock(&self.notes).next_line(self.ended) {
                Taken::Line(line) => return Ok(Some(line)),
                Taken::Dropped => {
                    tracing::warn!(target: "desk", "dropped a message longer than {MAX_FRAME} bytes from the agent");
                    continue;
                }
                Taken::Wanting if self.ended => return Ok(None),
                Taken::Wanting => {}
            }
            let read = async {
                loop {
                    self.input.readable().await?;
                    let fd = self.input.as_raw_fd();
                    match self.input.try_io(|| lock(&self.notes).read_input(fd)) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        read => return read,
                    }
                }
            };
            let n = match began {
                // A line has begun: the rest of it must come in time.
                Some(began) => tokio::time::timeout_at(began + deadline, read)
                    .await
                    .map_err(|_| {
                        io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!(
                                "a line from the agent began and did not end within {deadline:?}"
                            ),
                        )
                    })??,
                None => read.await?,
            };
            if n == 0 {
                self.ended = true;
            } else if began.is_none() {
                began = Some(tokio::time::Instant::now());
            }
        }
    }
}

/// The agent's stdout.
pub(crate) struct Output {
    writer: pipe::Sender,
    notes: Arc<Mutex<Notes>>,
}

impl Output {
    /// Writes one message to the agent as a line, in one write, and notes an answer as given.
    pub(crate) async fn send(&mut self, mut line: Vec<u8>) -> io::Result<()> {
        line.push(b'\n');
        // A line a pipe may take in pieces is marked while it is written: a desk that dies
        // half-way leaves the agent half a line, which the gateway ends before it writes.
        let long = line.len() > ATOMIC_LINE;
        if long {
            lock(&self.notes).mid_line(true);
        }
        self.writer.write_all(&line).await?;
        if long {
            lock(&self.notes).mid_line(false);
        }
        line.pop();
        // After the write: a desk that dies between the two leaves the request noted, and the
        // agent gets a second answer it ignores rather than none.
        lock(&self.notes).answered(&line);
        Ok(())
    }
}

fn lock(notes: &Mutex<Notes>) -> std::sync::MutexGuard<'_, Notes> {
    notes.lock().unwrap_or_else(|p| p.into_inner())
}
