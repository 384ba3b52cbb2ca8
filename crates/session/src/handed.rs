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
#![allow(unsafe_code)] // this module reaches the OS through libc; each unsafe block says why it is sound

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use countersign_wire::MAX_FRAME;
use countersign_wire::stdio::{End, HAND_OVER, Notes, Taken, end_of, receive_descriptors};
use tokio::io::Interest;
use tokio::net::UnixStream;
use tokio::net::unix::pipe;

/// The agent's stdin and stdout, taken from the gateway, and the notes the gateway reads back.
pub(crate) struct Handed {
    pub(crate) lines: Lines,
    pub(crate) output: Output,
}

/// Why the agent's stdio was not taken from the gateway: the connection is closed, and this is
/// said in the log.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandOverError {
    /// The welcome that says the desk takes the stdio could not be written.
    #[error("could not welcome the gateway: {0}")]
    Welcome(#[source] countersign_wire::FrameError),
    /// Nothing came within the deadline.
    #[error("the gateway sent no stdio within {0:?}")]
    Late(Duration),
    /// Receiving the descriptors failed.
    #[error("could not receive the gateway's stdio: {0}")]
    Receive(#[source] io::Error),
    /// Something else came than [`HAND_OVER`] with three descriptors.
    #[error(
        "the gateway sent {byte:?} with {count} descriptors{} instead of its stdio",
        and_more(.truncated)
    )]
    NotStdio {
        /// The byte sent with the descriptors, if any.
        byte: Option<u8>,
        /// How many descriptors came.
        count: usize,
        /// Whether more descriptors (or other control data) were sent than were asked for.
        truncated: bool,
    },
    /// The first descriptor is not usable as the agent's stdin.
    #[error("the agent's stdin: {0}")]
    Stdin(#[source] io::Error),
    /// The second descriptor is not usable as the agent's stdout.
    #[error("the agent's stdout: {0}")]
    Stdout(#[source] io::Error),
    /// The third descriptor is not a memory file the notes can live in.
    #[error("the gateway's notes: {0}")]
    Notes(#[source] io::Error),
}

/// What [`HandOverError::NotStdio`] adds when more descriptors were sent than taken.
fn and_more(truncated: &bool) -> &'static str {
    if *truncated { " and more" } else { "" }
}

/// Takes the descriptors the gateway sends after a welcome that said the desk would, within
/// `deadline`. The error says why, for the log.
pub(crate) async fn take(stream: &UnixStream, deadline: Duration) -> Result<Handed, HandOverError> {
    let fd = stream.as_raw_fd();
    let received = tokio::time::timeout(
        deadline,
        stream.async_io(Interest::READABLE, || receive_descriptors(fd, 3)),
    )
    .await
    .map_err(|_| HandOverError::Late(deadline))?
    .map_err(HandOverError::Receive)?;
    if received.byte != Some(HAND_OVER) || received.truncated || received.fds.len() != 3 {
        return Err(HandOverError::NotStdio {
            byte: received.byte,
            count: received.fds.len(),
            truncated: received.truncated,
        });
    }
    let mut fds = received.fds.into_iter();
    let (input, output, notes) = (fds.next(), fds.next(), fds.next());
    let (Some(input), Some(output), Some(notes)) = (input, output, notes) else {
        unreachable!("three descriptors were counted");
    };
    let (input, input_end) = stream_end(input, false).map_err(HandOverError::Stdin)?;
    let (output, output_end) = stream_end(output, true).map_err(HandOverError::Stdout)?;
    let notes = Notes::new(File::from(notes)).map_err(HandOverError::Notes)?;
    let notes = Arc::new(Mutex::new(notes));
    Ok(Handed {
        lines: Lines {
            // Any descriptor the runtime can wait on reads as a pipe's read end does.
            input: pipe::Receiver::from_owned_fd_unchecked(input).map_err(HandOverError::Stdin)?,
            end: input_end,
            notes: notes.clone(),
            ended: false,
        },
        output: Output {
            // As for stdin: any descriptor the runtime can wait on for room to write.
            writer: pipe::Sender::from_owned_fd_unchecked(output).map_err(HandOverError::Stdout)?,
            end: output_end,
            notes,
        },
    })
}

/// Checks that `fd` is a pipe or a Unix stream socket open for reading (or, with `write`, for
/// writing), and gives back the descriptor the desk uses. The desk never blocks on it and never
/// changes a flag the gateway shares: `O_NONBLOCK` belongs to the open file description, which
/// the gateway holds too and could clear again to wedge the desk's thread in a read or a write.
/// So a pipe is opened anew (through `/proc/self/fd`, a description of the desk's own,
/// non-blocking), and a socket is read and written with `MSG_DONTWAIT` whatever its flags say.
fn stream_end(fd: OwnedFd, write: bool) -> io::Result<(OwnedFd, End)> {
    let Some(end) = end_of(fd.as_raw_fd()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a pipe or a Unix stream socket",
        ));
    };
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
    match end {
        End::Socket => Ok((fd, end)),
        End::Pipe => {
            use std::os::unix::fs::OpenOptionsExt;
            let own = std::fs::OpenOptions::new()
                .read(!write)
                .write(write)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
            // The new description must be the same pipe (a descriptor swapped under /proc is not).
            let same = |a: &std::fs::Metadata, b: &std::fs::Metadata| {
                use std::os::unix::fs::MetadataExt;
                a.dev() == b.dev() && a.ino() == b.ino()
            };
            let theirs = std::fs::File::from(fd);
            if !same(&own.metadata()?, &theirs.metadata()?) {
                return Err(io::Error::other("the pipe changed while it was opened"));
            }
            Ok((own.into(), end))
        }
    }
}

/// The agent's stdin, line by line, through the notes' ring.
pub(crate) struct Lines {
    input: pipe::Receiver,
    end: End,
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
                    let (fd, end) = (self.input.as_raw_fd(), self.end);
                    match self.input.try_io(|| lock(&self.notes).read_input(fd, end)) {
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
    end: End,
    notes: Arc<Mutex<Notes>>,
}

impl Output {
    /// Writes one message to the agent as a line, in one write, and notes an answer as given.
    pub(crate) async fn send(&mut self, mut line: Vec<u8>) -> io::Result<()> {
        line.push(b'\n');
        // Marked while it is written (a store in memory, no system call): a desk that dies
        // half-way leaves the agent half a line, which the gateway ends before it writes.
        lock(&self.notes).mid_line(true);
        self.write_all(&line).await?;
        lock(&self.notes).mid_line(false);
        line.pop();
        // After the write: a desk that dies between the two leaves the request noted, and the
        // agent gets a second answer it ignores rather than none.
        lock(&self.notes).answered(&line);
        Ok(())
    }
}

impl Output {
    /// Writes all of `bytes`, waiting for room without ever blocking the thread.
    async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        let mut sent = 0;
        while sent < bytes.len() {
            self.writer.writable().await?;
            let (fd, end, rest) = (self.writer.as_raw_fd(), self.end, &bytes[sent..]);
            let wrote = self.writer.try_io(|| {
                // SAFETY: `rest` is valid for reads of its length for the call.
                let n = unsafe {
                    match end {
                        End::Pipe => libc::write(fd, rest.as_ptr().cast(), rest.len()),
                        End::Socket => libc::send(
                            fd,
                            rest.as_ptr().cast(),
                            rest.len(),
                            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                        ),
                    }
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match wrote {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

fn lock(notes: &Mutex<Notes>) -> std::sync::MutexGuard<'_, Notes> {
    countersign_core::sync::lock(notes)
}
