//! Helpers shared by the cross-crate and multi-process tests.
//!
//! The ledger's promises are about processes, not threads: one nonce, many processes, exactly one
//! spend; a lock held by someone else; a write that the kernel refuses. These helpers start the
//! `ledger_child` program (the integration tests pass its path, `env!("CARGO_BIN_EXE_ledger_child")`),
//! wait until every child is ready, release them all at once by closing one shared pipe that is
//! every child's stdin, and parse what each reports. Nothing here prints.

pub mod account;
pub mod approver;
pub mod browser;
pub mod calls;
pub mod desk_process;
pub mod engine;
pub mod files;
pub mod group;
pub mod keyring;
pub mod measure;
pub mod otlp;
pub mod peers;
pub mod ports;
pub mod postgres;
pub mod proxy;
pub mod real_clients;
pub mod scripted_model;
pub mod team_server;
pub mod window;
pub mod xwindow;

use std::io::{BufRead, BufReader, Read, pipe};
use std::process::{ChildStdout, Command, ExitStatus, Stdio};

/// How a child's spend ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spend {
    /// The nonce was spent by this child.
    Ok,
    /// The nonce had been spent already.
    AlreadySpent,
    /// The ledger refused as unreachable.
    Unreachable,
    /// The store could not even be opened.
    OpenError,
}

/// One outcome line of a child: what happened, how long it took, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// What happened.
    pub spend: Spend,
    /// How long the spend (or the failed open) took, in microseconds.
    pub micros: u64,
    /// The reason, for `Unreachable` and `OpenError`.
    pub detail: String,
}

impl Outcome {
    /// Parses `OUTCOME<TAB>MICROSECONDS<TAB>DETAIL`; `None` for any other line.
    pub fn parse(line: &str) -> Option<Outcome> {
        let mut fields = line.splitn(3, '\t');
        let spend = match fields.next()? {
            "ok" => Spend::Ok,
            "already_spent" => Spend::AlreadySpent,
            "unreachable" => Spend::Unreachable,
            "open_error" => Spend::OpenError,
            _ => return None,
        };
        let micros = fields.next()?.parse().ok()?;
        let detail = fields.next().unwrap_or("").to_owned();
        Some(Outcome {
            spend,
            micros,
            detail,
        })
    }
}

/// Closing this releases every child of its group at the same moment: they all block reading
/// their stdin, one shared pipe, until it reports end of file.
#[derive(Debug)]
pub struct Release(Option<std::io::PipeWriter>);

impl Release {
    /// Releases the children now.
    pub fn release(&mut self) {
        self.0 = None;
    }
}

/// A running `ledger_child` that has printed its first line.
#[derive(Debug)]
pub struct LedgerChild {
    child: std::process::Child,
    stdout: BufReader<ChildStdout>,
    first_line: String,
}

/// What a child printed and how it exited.
#[derive(Debug)]
pub struct Finished {
    /// The first line (`ready`, `locked`, `limit N`, or an outcome if it failed early).
    pub first_line: String,
    /// Every later line of stdout.
    pub lines: Vec<String>,
    /// Everything it wrote on stderr (the store's tracing when asked for).
    pub stderr: String,
    /// How it exited.
    pub status: ExitStatus,
}

impl Finished {
    /// The outcome line: the first parseable line of stdout.
    pub fn outcome(&self) -> Option<Outcome> {
        std::iter::once(&self.first_line)
            .chain(&self.lines)
            .find_map(|l| Outcome::parse(l))
    }
}

impl LedgerChild {
    /// The first line the child printed.
    pub fn first_line(&self) -> &str {
        &self.first_line
    }

    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Kills the child (SIGKILL) without letting it clean up, and reaps it.
    pub fn kill(mut self) -> ExitStatus {
        self.child.kill().expect("kill the child");
        self.child.wait().expect("reap the child")
    }

    /// Waits for the child to exit and collects the rest of its output.
    pub fn finish(mut self) -> Finished {
        let mut lines = Vec::new();
        let mut line = String::new();
        while self.stdout.read_line(&mut line).expect("child stdout") > 0 {
            lines.push(line.trim_end().to_owned());
            line.clear();
        }
        let mut stderr = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            err.read_to_string(&mut stderr).expect("child stderr");
        }
        let status = self.child.wait().expect("reap the child");
        Finished {
            first_line: std::mem::take(&mut self.first_line),
            lines,
            stderr,
            status,
        }
    }
}

impl Drop for LedgerChild {
    // A test that fails before it reaps a child does not leave it running (a child reaped
    // already is not signalled again).
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `count` copies of `program` with `args` (and `envs`), all reading one shared pipe as
/// stdin, and returns once every one has printed its first line (so they are all ready, or have
/// failed). Stderr is captured.
pub fn spawn_group(
    program: &str,
    args: &[&str],
    envs: &[(&str, &str)],
    count: usize,
) -> (Release, Vec<LedgerChild>) {
    let (reader, writer) = pipe().expect("a pipe");
    let mut spawned = Vec::with_capacity(count);
    for _ in 0..count {
        let mut child = Command::new(program)
            .args(args)
            .envs(envs.iter().copied())
            .stdin(Stdio::from(
                reader.try_clone().expect("clone the pipe's read end"),
            ))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the child program");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        spawned.push((child, stdout));
    }
    drop(reader);
    let children = spawned
        .into_iter()
        .map(|(child, mut stdout)| {
            let mut first_line = String::new();
            stdout.read_line(&mut first_line).expect("child stdout");
            LedgerChild {
                child,
                stdout,
                first_line: first_line.trim_end().to_owned(),
            }
        })
        .collect();
    (Release(Some(writer)), children)
}

/// Asserts that every child of a group printed `ready` (none failed before the release).
pub fn assert_ready(children: &[LedgerChild]) {
    for child in children {
        assert_eq!(
            child.first_line(),
            "ready",
            "child {} was not ready",
            child.id()
        );
    }
}

/// Starts one child; see [`spawn_group`].
pub fn spawn_one(program: &str, args: &[&str]) -> (Release, LedgerChild) {
    let (release, mut children) = spawn_group(program, args, &[], 1);
    (release, children.pop().expect("one child"))
}
