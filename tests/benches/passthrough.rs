//! What `countersign mcp` and the desk behind it cost an agent on a read-only tool, which the
//! desk forwards at once.
//!
//! One run measures the latency of the same trivial upstream tool (`echo`) four or five ways,
//! interleaved in round-robin blocks so that machine noise hits all of them alike, each from a raw
//! stdio client (one line written, one line read, blocking; protocol 2025-11-25), so that the
//! figures are the arms' and not a client library's:
//!
//! - direct: the client talks to the upstream;
//! - relay: through one process that copies bytes both ways and parses nothing (the floor for any
//!   process in the middle);
//! - 2 relays: relay → relay → upstream (the floor for two processes in the middle);
//! - pipe+desk: through `countersign mcp --no-launch --socket <sock> -- <upstream>`, the pipe, to
//!   a desk that starts the upstream as its own child and runs the MCP session (routing, the gate
//!   decision; an open call on the session's open lane). The pipe hands the agent's stdio to the
//!   desk (its stdin and stdout are pipes here), so only the desk is in the path of a call, though
//!   the pipe process is there, as the two relays are;
//! - pipe+desk --relay: the same with `--relay`, every message through the pipe and the socket
//!   (the path before the hand-over, and still the path after a desk restarts);
//! - guardian: mcp-guardian's proxy (0.6) in its log-only profile, the peer to beat, when it is
//!   installed (`COUNTERSIGN_BENCH_GUARDIAN`, the PATH, or `target/peers/bin`; it is not on
//!   crates.io, so the bench prints how to build it when it is missing).
//!
//! Each arm prints median, p90 and p99, and the CPU time per call of its processes in the middle
//! (for pipe+desk: the pipe's plus the desk's), then the same three for each block's first call
//! alone ("after a pause": the other arms' blocks have run meanwhile, and had the CPUs' caches,
//! as an agent's call after it has thought), then how often per call the scheduler put the
//! middle's processes on a CPU and how long they waited for one while runnable: on a machine with
//! few cores that is where a middle's latency goes beyond its own CPU time. Goals: pipe+desk
//! median ≤ 1.10 × the two relays', its p99 ≤ 1.25 × theirs, and its median below mcp-guardian's.
//!
//! Blocks are of 10 calls. In blocks of 100 the first calls were 1 in 100, right at the p99: which
//! side of it they fell on decided an arm's p99, and the ratio swung from 0.96 to 1.54 between
//! runs of the same build. In blocks of 10 the calls after a pause are 1 in 10, so the p99 is
//! their tail, read from a thousand of them, and the back-to-back calls (the other nine) are
//! still most of the median.
//!
//! Then, for `countersign mcp`:
//! - idle resident memory (VmRSS after `initialize`, `tools/list` and 1 s idle); goal ≤ 5 MiB;
//! - start time: spawn to the first `tools/list` answer (through `initialize`) with the desk
//!   already running, next to the same for one bare relay in front of the upstream, alternating,
//!   medians of several starts; goal: at most 30 ms more than the relay.
//!
//! And for the desk: its added resident memory per connected agent, upstream processes excluded
//! (they are the desk's children, separate processes). A fresh desk's VmRSS (and RssAnon) is read
//! idle, then with 1, 10 and 50 agents connected (cumulatively; each agent a `countersign mcp`
//! process with an initialized session and one `tools/list` answered), and the delta per agent
//! is printed against the idle desk and against the previous step.
//!
//! The desk runs in a child process: this same program in desk mode (the real engine, with a fixed
//! in-memory key and a SQLite file in a temporary directory, served by `countersign_session::serve`
//! on a socket there, on a multi-thread Tokio runtime like the desk app's). So it shares neither
//! the measuring client's current-thread runtime nor its memory: the client's timing is not
//! distorted by the desk's work, and the desk's VmRSS is its own. It exits when its stdin closes.
//! The upstream is this program in upstream mode: an rmcp server with one read-only `echo` tool,
//! so the benchmark needs nothing installed. The relay is this program in relay mode too.
//! When the pinned `@modelcontextprotocol/server-everything` is installed under `target/peers`
//! (`.ci/setup tests` puts it there), its `echo` is measured the same four ways afterwards, and
//! its start time; so is the start time of `@modelcontextprotocol/server-filesystem` beside it,
//! serving a temporary folder (the two real upstreams whose start the clients saw slowed).
//!
//! `cargo build --release -p countersign && cargo bench -p countersign-tests --bench passthrough [-- CALLS]`; environment:
//! `COUNTERSIGN_BENCH_CALLS` (default 10000 per arm), `COUNTERSIGN_BENCH_BLOCK` (calls per block,
//! default 10), `COUNTERSIGN_BENCH_STARTS` (default 20), `COUNTERSIGN_BENCH_AGENTS` (the agent
//! counts for the desk's memory, default `1,10,50`), `COUNTERSIGN_BENCH_EVERYTHING` (`0` to skip
//! server-everything, or the path of its `dist/index.js`). Run without `--bench` (as
//! `cargo test --all-targets` does) it only smoke-tests every arm with a few calls, 3 starts and
//! 1 and 2 agents. Any one step (a start, a listing, a call) that takes over 30 s fails the run.
#![allow(missing_docs)] // the bench harness's macros define an undocumented `pub fn main`

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Write as _};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use countersign_core::token::SigningKey;
use countersign_engine::{Engine, EngineConfig};
use rmcp::model::*;
use rmcp::service::{RequestContext, RunningService};
use rmcp::{ErrorData, RoleClient, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt};

/// First argument that makes this program the trivial upstream server.
const UPSTREAM: &str = "__countersign_bench_upstream";
/// First argument that makes this program the byte relay; the upstream command follows.
const RELAY: &str = "__countersign_bench_relay";
/// First argument that makes this program the desk; the socket and SQLite paths follow.
const DESK: &str = "__countersign_bench_desk";
/// The line the desk prints on stdout once its socket is bound.
const DESK_READY: &str = "desk ready";

/// `countersign mcp`'s idle VmRSS goal, in kB (5 MiB).
const PIPE_IDLE_RSS_GOAL_KB: u64 = 5 * 1024;
/// How much slower than one bare relay the pipe may be to its first `tools/list` answer.
const PIPE_START_GOAL_EXTRA: Duration = Duration::from_millis(30);
/// pipe+desk median over the two relays' median.
const LATENCY_GOAL_RATIO: f64 = 1.10;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some(UPSTREAM) => return upstream(),
        Some(RELAY) => relay(&args[1..]),
        Some(DESK) => desk(&args[1..]),
        _ => {}
    }
    let config = Config::new(&args);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime")
        .block_on(bench(config));
}

// ---------------------------------------------------------------------------------------------
// The trivial upstream.

struct Echo;

impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("bench-echo", "1.0"))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let echo = json!({
            "name": "echo",
            "description": "Echoes back the input.",
            "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]},
            "annotations": {"readOnlyHint": true, "openWorldHint": false},
        });
        let echo = serde_json::from_value(echo).expect("a valid tool");
        Ok(ListToolsResult::with_all_items(vec![echo]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let message = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("message"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        Ok(CallToolResult::success(vec![ContentBlock::text(format!("Echo: {message}"))]).into())
    }
}

fn upstream() {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime")
        .block_on(async {
            let running = Echo
                .serve(rmcp::transport::stdio_pipes())
                .await
                .expect("the agent initializes");
            let _ = running.waiting().await;
        });
}

// ---------------------------------------------------------------------------------------------
// The bare byte relay: starts the upstream and copies stdin to it and its stdout back, unbuffered,
// parsing nothing. Exits when the upstream's stdout closes.

fn relay(command: &[String]) -> ! {
    let (program, args) = command.split_first().expect("relay: an upstream command");
    let mut child = std::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("relay: cannot start {program}: {e}"));
    let mut to_child = child.stdin.take().expect("piped stdin");
    let mut from_child = child.stdout.take().expect("piped stdout");
    // Duplicated descriptors as plain files: no std buffering on either side.
    let dup = |fd: std::os::fd::BorrowedFd<'_>| File::from(fd.try_clone_to_owned().expect("dup"));
    let mut stdin = dup(io::stdin().as_fd());
    let mut stdout = dup(io::stdout().as_fd());
    // Dropping `to_child` when the agent closes stdin lets the upstream exit.
    std::thread::spawn(move || io::copy(&mut stdin, &mut to_child));
    let _ = io::copy(&mut from_child, &mut stdout);
    let _ = child.wait();
    std::process::exit(0)
}

// ---------------------------------------------------------------------------------------------
// The desk: the real engine and socket server, in a process of its own, on a multi-thread
// runtime as in the desk app. Prints `DESK_READY` once the socket is bound; stops (killing the
// upstreams it started) when its stdin closes.

fn desk(args: &[String]) -> ! {
    let [socket, db] = args else {
        panic!("desk: expected SOCKET DB, got {args:?}");
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    runtime.block_on(async {
        let key = SigningKey::new(&[42; 32]).expect("a 32-byte key");
        let mut config = EngineConfig::new();
        config.describer = Some(std::sync::Arc::new(
            countersign_session::SqlDescriber::default(),
        ));
        let records = std::sync::Arc::new(countersign_store::Sqlite::open_deferred(
            db,
            countersign_store::StoreOptions::default(),
        ));
        let engine = Engine::new(config, records, Ok(key));
        let served = countersign_session::serve(engine, PathBuf::from(socket))
            .await
            .expect("the desk serves its socket");
        {
            let mut out = io::stdout().lock();
            writeln!(out, "{DESK_READY}").expect("stdout");
            out.flush().expect("stdout");
        }
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 64];
        while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
        drop(served);
    });
    std::process::exit(0)
}

/// A desk running in a child process, and where it listens.
struct DeskProcess {
    child: tokio::process::Child,
    socket: PathBuf,
    _stdout: tokio::io::BufReader<tokio::process::ChildStdout>,
    _dir: tempfile::TempDir,
}

impl DeskProcess {
    async fn start(me: &Path) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let socket = dir.path().join("run/desk.sock");
        let mut child = tokio::process::Command::new(me)
            .arg(DESK)
            .arg(&socket)
            .arg(dir.path().join("desk.sqlite"))
            .env("RUST_LOG", "error")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("the desk starts");
        let mut stdout = tokio::io::BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(30), stdout.read_line(&mut line))
            .await
            .expect("the desk is ready within 30 s")
            .expect("the desk's stdout");
        assert_eq!(line.trim(), DESK_READY, "the desk did not start");
        Self {
            child,
            socket,
            _stdout: stdout,
            _dir: dir,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("the desk is running")
    }

    /// Closes the desk's stdin and waits (briefly) for it to exit.
    async fn stop(mut self) {
        drop(self.child.stdin.take());
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The measurements.

struct Config {
    /// `--bench` was given: a real run (else a smoke test).
    full: bool,
    calls: usize,
    block: usize,
    starts: usize,
    agents: Vec<usize>,
    everything: Option<PathBuf>,
}

fn env_number(name: &str) -> Option<usize> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
    )
}

impl Config {
    fn new(args: &[String]) -> Self {
        let full = args.iter().any(|a| a == "--bench");
        let arg_calls = args.iter().find_map(|a| a.parse::<usize>().ok());
        let calls = arg_calls
            .or_else(|| env_number("COUNTERSIGN_BENCH_CALLS"))
            .unwrap_or(if full { 10_000 } else { 60 })
            .max(1);
        let block = env_number("COUNTERSIGN_BENCH_BLOCK")
            .unwrap_or(if full { 10 } else { 20 })
            .max(1);
        let starts = env_number("COUNTERSIGN_BENCH_STARTS")
            .unwrap_or(if full { 20 } else { 3 })
            .max(1);
        let mut agents: Vec<usize> = match std::env::var("COUNTERSIGN_BENCH_AGENTS") {
            Ok(list) => list
                .split(',')
                .map(|n| {
                    n.trim().parse().unwrap_or_else(|_| {
                        panic!("COUNTERSIGN_BENCH_AGENTS={list:?} is not a list of numbers")
                    })
                })
                .filter(|&n| n > 0)
                .collect(),
            Err(_) if full => vec![1, 10, 50],
            Err(_) => vec![1, 2],
        };
        agents.sort_unstable();
        agents.dedup();
        let everything = match std::env::var_os("COUNTERSIGN_BENCH_EVERYTHING") {
            Some(v) if v == "0" || v.is_empty() => None,
            Some(path) => Some(PathBuf::from(path)),
            None => {
                let default = Path::new(env!("CARGO_MANIFEST_DIR")).join(
                    "../../target/peers/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
                );
                default.is_file().then_some(default)
            }
        };
        Self {
            full,
            calls,
            block,
            starts,
            agents,
            everything,
        }
    }
}

type Client = RunningService<RoleClient, ClientConfig>;

/// A started MCP server and the client connected to it.
struct Running {
    client: Client,
    child: tokio::process::Child,
}

/// `command` with `env`, its stdin and stdout piped, its stderr shown unless `quiet`, logging
/// errors only.
fn piped(command: &[OsString], env: &[(OsString, OsString)], quiet: bool) -> std::process::Command {
    let mut cmd = std::process::Command::new(&command[0]);
    cmd.args(&command[1..])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("RUST_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(if quiet {
            Stdio::null()
        } else {
            Stdio::inherit()
        });
    cmd
}

impl Running {
    async fn start(command: &[OsString], quiet: bool) -> Self {
        let mut cmd = tokio::process::Command::from(piped(command, &[], quiet));
        cmd.kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {:?}: {e}", command[0]));
        let read = child.stdout.take().expect("piped stdout");
        let write = child.stdin.take().expect("piped stdin");
        let info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("bench-agent", "1.0"),
        );
        let client = within(STEP_DEADLINE, "initialize", info.serve((read, write)))
            .await
            .unwrap_or_else(|e| panic!("{:?} did not initialize: {e}", command[0]));
        Self { client, child }
    }

    /// Starts `command`, and asks for its tools: it must list `tool`.
    async fn start_listed(command: &[OsString], quiet: bool, tool: &str) -> Self {
        let r = Self::start(command, quiet).await;
        let tools = within(
            STEP_DEADLINE,
            "tools/list",
            r.client.peer().list_all_tools(),
        )
        .await
        .expect("tools/list");
        assert!(
            tools.iter().any(|t| t.name == tool),
            "{:?}: no {tool} tool in {tools:?}",
            command[0]
        );
        r
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("still running")
    }

    /// Closes the client's side and waits (briefly) for the server to exit.
    async fn stop(mut self) {
        let _ = self.client.cancel().await;
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// How long any one step (a start, a listing, a call) may take before the bench gives up: a hung
/// pipe or desk fails the run (and `cargo test --all-targets`) instead of wedging it.
const STEP_DEADLINE: Duration = Duration::from_secs(30);

/// `future`'s output, or a panic naming `what` when it takes longer than `deadline`.
async fn within<F: std::future::Future>(deadline: Duration, what: &str, future: F) -> F::Output {
    tokio::time::timeout(deadline, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {} s", deadline.as_secs()))
}

struct Stats {
    median: Duration,
    p90: Duration,
    p99: Duration,
}

fn stats(samples: &mut [Duration]) -> Stats {
    samples.sort_unstable();
    let n = samples.len();
    let percentile = |p: usize| samples[(n * p).div_ceil(100).max(1) - 1];
    Stats {
        median: samples[n / 2],
        p90: percentile(90),
        p99: percentile(99),
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

/// Resident memory of a process from `/proc/<pid>/status`, in kB.
struct Memory {
    rss: u64,
    peak: u64,
    anon: u64,
    file: u64,
}

fn memory(pid: u32) -> Memory {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    Memory {
        rss: field("VmRSS:"),
        peak: field("VmHWM:"),
        anon: field("RssAnon:"),
        file: field("RssFile:"),
    }
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "VmRSS {} kB ({:.1} MiB: anonymous {} kB, file-backed {} kB), peak VmHWM {} kB",
            self.rss,
            self.rss as f64 / 1024.0,
            self.anon,
            self.file,
            self.peak
        )
    }
}

/// What the scheduler has counted for a process so far, all its threads summed, from
/// `/proc/<pid>/task/*/schedstat`: time on a CPU, time runnable but waiting for one, and how many
/// times a thread was put on a CPU. On a machine with few cores the last two say where a
/// middle's latency goes beyond its own CPU time: each wake-up is a context switch, and a thread
/// woken while the cores are busy waits its turn.
#[derive(Clone, Copy, Default)]
struct Sched {
    cpu: Duration,
    waiting: Duration,
    slices: u64,
}

impl std::ops::Sub for Sched {
    type Output = Sched;
    fn sub(self, before: Sched) -> Sched {
        Sched {
            cpu: self.cpu.saturating_sub(before.cpu),
            waiting: self.waiting.saturating_sub(before.waiting),
            slices: self.slices.saturating_sub(before.slices),
        }
    }
}

fn sched(pid: u32) -> Option<Sched> {
    let mut total = Sched::default();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        let mut fields = stat.split_whitespace().map(str::parse::<u64>);
        total.cpu += Duration::from_nanos(fields.next()?.ok()?);
        total.waiting += Duration::from_nanos(fields.next()?.ok()?);
        total.slices += fields.next()?.ok()?;
    }
    Some(total)
}

/// The direct children of a process, any of its threads' (`/proc/<pid>/task/*/children`).
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The process started for an arm and its first descendants: `pid`, its child, that one's, ...
fn chain(pid: u32) -> Vec<u32> {
    let mut chain = vec![pid];
    while let Some(&child) = children(*chain.last().expect("non-empty")).first() {
        chain.push(child);
    }
    chain
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

/// One way to reach the upstream.
struct Arm {
    name: &'static str,
    command: Vec<OsString>,
    /// The desk's pid, when the arm goes through it.
    desk: Option<u32>,
    /// Variables the arm's process is started with (mcp-guardian's home for its files).
    env: Vec<(OsString, OsString)>,
}

impl Arm {
    /// The processes between the client and the upstream, for an arm started as `pid`: the pipe
    /// and the desk, or every process of the chain but the last (the upstream).
    fn middle(&self, pid: u32) -> Vec<u32> {
        match self.desk {
            Some(desk) => vec![pid, desk],
            None => {
                let mut chain = chain(pid);
                chain.pop();
                chain
            }
        }
    }
}

/// `countersign mcp --no-launch --socket SOCKET [--relay] -- UPSTREAM...`.
fn pipe_command(socket: &Path, upstream: &[OsString], relay: bool) -> Vec<OsString> {
    let mut pipe: Vec<OsString> = vec![
        countersign_tests::window::bin("countersign").into(),
        "mcp".into(),
        "--no-launch".into(),
        "--socket".into(),
        socket.into(),
    ];
    if relay {
        pipe.push("--relay".into());
    }
    pipe.push("--".into());
    pipe.extend(upstream.iter().cloned());
    pipe
}

/// `COMMAND...` behind one bare relay (this program in relay mode).
fn relayed(me: &Path, command: &[OsString]) -> Vec<OsString> {
    let mut relay = vec![me.into(), RELAY.into()];
    relay.extend(command.iter().cloned());
    relay
}

/// mcp-guardian's proxy, for the peer arm: `COUNTERSIGN_BENCH_GUARDIAN` (its path, or `0` to
/// skip it), else `mcp-guardian-proxy` on the PATH, else under `target/peers/bin`.
fn guardian() -> Option<PathBuf> {
    match std::env::var_os("COUNTERSIGN_BENCH_GUARDIAN") {
        Some(v) if v == "0" || v.is_empty() => return None,
        Some(path) => return Some(PathBuf::from(path)),
        None => {}
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("mcp-guardian-proxy"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let peers =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/peers/bin/mcp-guardian-proxy");
        peers.is_file().then_some(peers)
    })
}

/// How to get mcp-guardian when it is missing: it is not on crates.io, and its repository pins
/// a toolchain of its own.
const GUARDIAN_HOWTO: &str = "mcp-guardian (the peer arm) is not installed: to measure it, \
    `git clone https://github.com/eqtylab/mcp-guardian && cd mcp-guardian && rm rust-toolchain && \
    cargo build --release -p mcp-guardian-proxy`, then put target/release/mcp-guardian-proxy on \
    the PATH, in target/peers/bin, or name it in COUNTERSIGN_BENCH_GUARDIAN";

/// The ways to reach one upstream: direct, one relay, two relays, the pipe and the desk (handed
/// over, and with `--relay` to `relay_desk`), and mcp-guardian's proxy in its log-only profile when it is installed (its files in `home`).
fn arms(
    upstream: &[OsString],
    desk: &DeskProcess,
    relay_desk: &DeskProcess,
    me: &Path,
    guardian: Option<(&Path, &Path)>,
) -> Vec<Arm> {
    let relay = relayed(me, upstream);
    let relays = relayed(me, &relay);
    let arm = |name, command| Arm {
        name,
        command,
        desk: None,
        env: Vec::new(),
    };
    let mut arms = vec![
        arm("direct", upstream.to_vec()),
        arm("relay", relay),
        arm("2 relays", relays),
        Arm {
            name: "pipe+desk",
            command: pipe_command(&desk.socket, upstream, false),
            desk: Some(desk.pid()),
            env: Vec::new(),
        },
        Arm {
            name: "pipe+desk --relay",
            command: pipe_command(&relay_desk.socket, upstream, true),
            desk: Some(relay_desk.pid()),
            env: Vec::new(),
        },
    ];
    if let Some((program, home)) = guardian {
        let mut command: Vec<OsString> = vec![
            program.into(),
            "--name".into(),
            "bench".into(),
            "--guard-profile".into(),
            "mcp-guardian.log-only".into(),
            "--".into(),
        ];
        command.extend(upstream.iter().cloned());
        arms.push(Arm {
            name: "guardian",
            command,
            desk: None,
            env: vec![("HOME".into(), home.into())],
        });
    }
    arms
}

/// A raw stdio MCP client, as the agent's side of one arm: it writes each request as one line
/// and reads lines until the answer with its id, parsing nothing else, so that the figures are
/// the arm's and not a client library's. Blocking I/O on this thread: no runtime in the timing.
struct RawClient {
    child: std::process::Child,
    to: std::process::ChildStdin,
    from: io::BufReader<std::process::ChildStdout>,
    next: u64,
    line: String,
}

/// The revision the raw client asks for: the one most agents speak today.
const CLIENT_REVISION: &str = "2025-11-25";

impl RawClient {
    fn start(arm: &Arm, quiet: bool) -> Self {
        let command = &arm.command;
        let mut child = piped(command, &arm.env, quiet)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {:?}: {e}", command[0]));
        let to = child.stdin.take().expect("piped stdin");
        let from = io::BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut client = Self {
            child,
            to,
            from,
            next: 0,
            line: String::new(),
        };
        let init = client.request(
            "initialize",
            json!({"protocolVersion": CLIENT_REVISION, "capabilities": {}, "clientInfo": {"name": "bench-agent", "version": "1.0"}}),
        );
        assert!(init.get("result").is_some(), "{}: {init}", arm.name);
        client.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string());
        let tools = client.request("tools/list", json!({}));
        let listed = tools["result"]["tools"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["name"] == "echo"));
        assert!(listed, "{}: no echo tool in {tools}", arm.name);
        client
    }

    fn send(&mut self, line: &str) {
        use std::io::Write as _;
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        self.to.write_all(&bytes).expect("the arm reads its stdin");
    }

    /// Sends a request and returns its answer (skipping notifications and anything else).
    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        self.send(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
        );
        self.answer(id)
    }

    /// Reads the arm's next line into `self.line`; returns when it arrived.
    fn next_line(&mut self) -> Instant {
        use std::io::BufRead as _;
        self.line.clear();
        let n = self
            .from
            .read_line(&mut self.line)
            .expect("the arm's stdout");
        let arrived = Instant::now();
        assert!(n > 0, "the arm closed its stdout");
        arrived
    }

    /// The next line that answers `id`, parsed.
    fn answer(&mut self, id: u64) -> Value {
        loop {
            self.next_line();
            let value: Value = match serde_json::from_str(&self.line) {
                Ok(v) => v,
                Err(_) => continue,
            };
            if value.get("id") == Some(&json!(id)) && value.get("method").is_none() {
                return value;
            }
        }
    }

    /// One `echo` call, timed from just before the request is written to its answer read.
    fn call(&mut self) -> Duration {
        self.next += 1;
        let id = self.next;
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"message":"hello"}}}}}}"#
        );
        let started = Instant::now();
        self.send(&line);
        // Each line is parsed after the clock has read when it arrived: the answer's time is
        // when its line was read, and notifications on the way (server-everything says its tool
        // list changed) are skipped.
        loop {
            let elapsed = self.next_line() - started;
            let answer: Value = serde_json::from_str(&self.line).expect("a message in JSON");
            if answer.get("method").is_some() {
                continue;
            }
            assert_eq!(answer["id"], json!(id), "{answer}");
            assert_eq!(
                answer["result"]["content"][0]["text"],
                json!("Echo: hello"),
                "{answer}"
            );
            return elapsed;
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Closes the arm's stdin and waits (briefly) for it to exit.
    fn stop(mut self) {
        drop(self.to);
        for _ in 0..100 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// p99 of pipe+desk over the two relays' p99.
const TAIL_GOAL_RATIO: f64 = 1.25;

/// How many blocks the calls of one arm make.
fn blocks_of(config: &Config) -> usize {
    config.calls.div_ceil(config.block)
}

/// Latency of `echo` through each arm, interleaved in round-robin blocks; prints the figures and
/// the pipe's and the desk's memory after the run.
fn latency(config: &Config, title: &str, arms: &[Arm], quiet: bool) {
    println!();
    println!(
        "{title}: {} calls per arm, interleaved in blocks of {}; a raw stdio client on protocol {CLIENT_REVISION}",
        config.calls, config.block
    );
    let mut running: Vec<RawClient> = arms
        .iter()
        .map(|arm| RawClient::start(arm, quiet))
        .collect();
    let middles: Vec<Vec<u32>> = arms
        .iter()
        .zip(&running)
        .map(|(arm, r)| arm.middle(r.pid()))
        .collect();
    let sched_now =
        |pids: &[u32]| -> Vec<Option<Sched>> { pids.iter().map(|&p| sched(p)).collect() };
    // Warm-up, interleaved like the measurement.
    let warmup = (config.calls / 10).clamp(1, 500);
    for r in &mut running {
        for _ in 0..warmup {
            r.call();
        }
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(config.calls); arms.len()];
    // Each block's first call, which comes after the other arms' blocks: a pause of a few
    // milliseconds, in which the other arms' processes have had the CPUs' caches.
    let mut paused: Vec<Vec<Duration>> = vec![Vec::with_capacity(blocks_of(config)); arms.len()];
    // CPU of the processes in the middle (relays; the pipe and the desk) over the measured calls.
    let sched_before: Vec<_> = middles.iter().map(|m| sched_now(m)).collect();
    for b in 0..blocks_of(config) {
        let size = config.block.min(config.calls - b * config.block);
        // Rotate which arm goes first, so none always follows the same neighbour.
        for k in 0..arms.len() {
            let i = (b + k) % arms.len();
            for call in 0..size {
                let d = running[i].call();
                samples[i].push(d);
                if call == 0 {
                    paused[i].push(d);
                }
            }
        }
    }
    // Per process in the middle, in the order of `Arm::middle`.
    // Totals over the measured calls, per process in the middle.
    let sched_over_calls: Vec<Option<Vec<Sched>>> = middles
        .iter()
        .zip(sched_before)
        .map(|(m, before)| {
            sched_now(m)
                .into_iter()
                .zip(before)
                .map(|(now, before)| Some(now? - before?))
                .collect()
        })
        .collect();
    let cpu_per_call: Vec<Option<Vec<Duration>>> = sched_over_calls
        .iter()
        .map(|each| {
            each.as_ref()
                .map(|each| each.iter().map(|s| s.cpu / config.calls as u32).collect())
        })
        .collect();
    let results: Vec<Stats> = samples.iter_mut().map(|s| stats(s)).collect();
    let after_pause: Vec<Stats> = paused.iter_mut().map(|s| stats(s)).collect();
    println!(
        "  {:<17} {:>11} {:>11} {:>11}   CPU µs/call in the middle",
        "arm", "median µs", "p90 µs", "p99 µs"
    );
    for ((arm, s), cpu) in arms.iter().zip(&results).zip(&cpu_per_call) {
        let cpu = match cpu.as_deref() {
            None | Some([]) => "-".to_owned(),
            Some([one]) => format!("{:.1}", micros(*one)),
            Some(each) => {
                let total: Duration = each.iter().sum();
                let parts: Vec<String> = each
                    .iter()
                    .enumerate()
                    .map(|(i, d)| match (arm.desk, i) {
                        (Some(_), 0) => format!("pipe {:.1}", micros(*d)),
                        (Some(_), _) => format!("desk {:.1}", micros(*d)),
                        (None, _) => format!("{:.1}", micros(*d)),
                    })
                    .collect();
                format!("{:.1} ({})", micros(total), parts.join(" + "))
            }
        };
        println!(
            "  {:<17} {:>11.1} {:>11.1} {:>11.1}   {}",
            arm.name,
            micros(s.median),
            micros(s.p90),
            micros(s.p99),
            cpu
        );
    }
    println!(
        "  {:<17} {:>11} {:>11} {:>11}   after a pause: each block's first call ({} per arm)",
        "arm",
        "median µs",
        "p90 µs",
        "p99 µs",
        paused[0].len()
    );
    for (arm, s) in arms.iter().zip(&after_pause) {
        println!(
            "  {:<17} {:>11.1} {:>11.1} {:>11.1}",
            arm.name,
            micros(s.median),
            micros(s.p90),
            micros(s.p99)
        );
    }
    println!(
        "  {:<17} {:>11} {:>11}   the processes in the middle, per call: times put on a CPU \
         (each wake-up a context switch), µs runnable but waiting for a CPU",
        "arm", "on a CPU", "waiting µs"
    );
    for (arm, each) in arms.iter().zip(&sched_over_calls) {
        let Some(each) = each.as_deref().filter(|e| !e.is_empty()) else {
            continue;
        };
        let total = each.iter().fold(Sched::default(), |a, s| Sched {
            cpu: a.cpu + s.cpu,
            waiting: a.waiting + s.waiting,
            slices: a.slices + s.slices,
        });
        let calls = config.calls as f64;
        println!(
            "  {:<17} {:>11.2} {:>11.1}",
            arm.name,
            total.slices as f64 / calls,
            micros(total.waiting) / calls
        );
    }
    let ratio = |a: &Stats, b: &Stats| a.median.as_secs_f64() / b.median.as_secs_f64();
    let (direct, relay, relays, pipe, relayed) = (
        &results[0],
        &results[1],
        &results[2],
        &results[3],
        &results[4],
    );
    println!(
        "  ratio relay/direct (median): {:.2}; 2 relays/relay: {:.2}",
        ratio(relay, direct),
        ratio(relays, relay)
    );
    let pipe_over_relays = ratio(pipe, relays);
    println!(
        "  goal: pipe+desk median ≤ {LATENCY_GOAL_RATIO:.2} × 2 relays: {} ({pipe_over_relays:.2} ×; pipe+desk adds {:.1} µs over the two relays)",
        met(pipe_over_relays <= LATENCY_GOAL_RATIO),
        micros(pipe.median) - micros(relays.median)
    );
    let tail = pipe.p99.as_secs_f64() / relays.p99.as_secs_f64();
    println!(
        "  goal: pipe+desk p99 ≤ {TAIL_GOAL_RATIO:.2} × 2 relays' p99: {} ({tail:.2} ×; after a pause: median {:.2} ×, p90 {:.2} ×)",
        met(tail <= TAIL_GOAL_RATIO),
        ratio(&after_pause[3], &after_pause[2]),
        after_pause[3].p90.as_secs_f64() / after_pause[2].p90.as_secs_f64()
    );
    println!(
        "  pipe+desk with --relay (every message through the pipe and the socket): median {:.2} × 2 relays; pipe+desk handed over is {:.2} × it",
        ratio(relayed, relays),
        ratio(pipe, relayed)
    );
    match results.get(5) {
        Some(guardian) => {
            let over = ratio(pipe, guardian);
            println!(
                "  goal: pipe+desk faster than mcp-guardian (log-only) at the median: {} ({over:.2} × its median; p99 {:.2} × its p99)",
                met(over < 1.0),
                pipe.p99.as_secs_f64() / guardian.p99.as_secs_f64()
            );
        }
        None => println!("  {GUARDIAN_HOWTO}"),
    }
    println!("  pipe memory after the run: {}", memory(running[3].pid()));
    if let Some(desk) = arms[3].desk {
        println!("  desk memory after the run: {}", memory(desk));
    }
    for r in running {
        r.stop();
    }
}

/// The desk's added memory per connected agent: a fresh desk, read idle and then with each count
/// of agents connected (cumulatively), each agent a pipe with one `tools/list` answered.
async fn desk_memory(config: &Config, me: &Path, upstream: &[OsString]) {
    let desk = DeskProcess::start(me).await;
    let settle = Duration::from_millis(if config.full { 500 } else { 100 });
    let command = pipe_command(&desk.socket, upstream, false);
    tokio::time::sleep(settle).await;
    let idle = memory(desk.pid());
    println!();
    println!(
        "desk memory per connected agent (its own VmRSS; the upstreams are other processes): idle {} kB (RssAnon {} kB)",
        idle.rss, idle.anon
    );
    println!(
        "  {:>6} {:>11} {:>14} {:>16} {:>18} {:>20}",
        "agents",
        "VmRSS kB",
        "RssAnon kB",
        "kB/agent (RSS)",
        "kB/agent (anon)",
        "kB/agent since prev"
    );
    let mut agents = Vec::new();
    let mut previous = (0usize, idle.rss);
    for &count in &config.agents {
        while agents.len() < count {
            agents.push(Running::start_listed(&command, true, "echo").await);
        }
        tokio::time::sleep(settle).await;
        let now = memory(desk.pid());
        let per = |now: u64, before: u64, n: usize| (now as f64 - before as f64) / n as f64;
        println!(
            "  {:>6} {:>11} {:>14} {:>16.1} {:>18.1} {:>20.1}",
            count,
            now.rss,
            now.anon,
            per(now.rss, idle.rss, count),
            per(now.anon, idle.anon, count),
            per(now.rss, previous.1, count - previous.0),
        );
        previous = (count, now.rss);
    }
    assert_eq!(
        desk_children_count(desk.pid()),
        agents.len(),
        "one upstream per agent"
    );
    println!(
        "  desk memory with every agent connected: {}",
        memory(desk.pid())
    );
    for r in agents {
        r.stop().await;
    }
    desk.stop().await;
}

/// How many processes the desk has started (one upstream per connected agent).
fn desk_children_count(pid: u32) -> usize {
    children(pid).len()
}

/// Start to the first `tools/list` answer, one relay alternating with the pipe (desk running):
/// medians of `config.starts` each, and the difference beside its goal. Each start must list
/// `tool`.
async fn starts(config: &Config, upstream: &str, arms: &[Arm], tool: &str) {
    let (relay, pipe) = (&arms[1].command, &arms[3].command);
    let mut pipe_starts = Vec::new();
    let mut relay_starts = Vec::new();
    for _ in 0..config.starts {
        for (command, into) in [(pipe, &mut pipe_starts), (relay, &mut relay_starts)] {
            let started = Instant::now();
            let r = Running::start_listed(command, false, tool).await;
            into.push(started.elapsed());
            r.stop().await;
        }
    }
    let (pipe_start, relay_start) = (median(pipe_starts), median(relay_starts));
    let extra = pipe_start.saturating_sub(relay_start);
    println!(
        "{upstream}: start to the first tools/list answer (spawn, initialize, tools/list; median of {}): pipe+desk {:.1} ms, one relay {:.1} ms; goal ≤ {} ms more than the relay: {} ({:+.1} ms)",
        config.starts,
        millis(pipe_start),
        millis(relay_start),
        PIPE_START_GOAL_EXTRA.as_millis(),
        met(extra <= PIPE_START_GOAL_EXTRA),
        millis(pipe_start) - millis(relay_start)
    );
}

async fn bench(config: Config) {
    let me = std::env::current_exe().expect("this program's path");
    let upstream: Vec<OsString> = vec![me.clone().into(), UPSTREAM.into()];

    println!(
        "countersign pipe + desk bench{}",
        if config.full {
            ""
        } else {
            " (smoke test: pass --bench for real figures)"
        }
    );
    let desk = DeskProcess::start(&me).await;
    // A desk of its own for the --relay arm, so that each desk's CPU and scheduler figures are
    // its arm's alone.
    let relay_desk = DeskProcess::start(&me).await;
    let guardian = guardian();
    let guardian_home = tempfile::tempdir().expect("a temporary directory");
    let guardian = guardian.as_deref().map(|p| (p, guardian_home.path()));
    let ours = arms(&upstream, &desk, &relay_desk, &me, guardian);
    let pipe = &ours[3].command;

    // Idle memory: initialize, tools/list, then 1 s of nothing.
    let idle = Running::start_listed(pipe, false, "echo").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_memory = memory(idle.pid());
    println!(
        "countersign mcp idle memory: {idle_memory}; goal ≤ {} MiB: {}",
        PIPE_IDLE_RSS_GOAL_KB / 1024,
        met(idle_memory.rss <= PIPE_IDLE_RSS_GOAL_KB)
    );
    idle.stop().await;

    starts(&config, "trivial rmcp upstream (this bench)", &ours, "echo").await;

    latency(&config, "trivial rmcp upstream (this bench)", &ours, false);

    desk_memory(&config, &me, &upstream).await;

    if let Some(index) = &config.everything {
        let upstream: Vec<OsString> = vec!["node".into(), index.into(), "stdio".into()];
        let everything = arms(&upstream, &desk, &relay_desk, &me, guardian);
        starts(
            &config,
            "@modelcontextprotocol/server-everything (node)",
            &everything,
            "echo",
        )
        .await;
        latency(
            &config,
            "@modelcontextprotocol/server-everything (node)",
            &everything,
            true,
        );
    }
    // The filesystem server beside it (same install): its start only, as clients start it.
    if let Some(index) = config.everything.as_ref().and_then(|everything| {
        let filesystem = everything
            .parent()?
            .parent()?
            .parent()?
            .join("server-filesystem/dist/index.js");
        filesystem.is_file().then_some(filesystem)
    }) {
        let served = tempfile::tempdir().expect("a folder to serve");
        let upstream: Vec<OsString> = vec![
            "node".into(),
            index.into(),
            served.path().as_os_str().to_owned(),
        ];
        let filesystem = arms(&upstream, &desk, &relay_desk, &me, guardian);
        starts(
            &config,
            "@modelcontextprotocol/server-filesystem (node)",
            &filesystem,
            "read_text_file",
        )
        .await;
    }
    desk.stop().await;
    relay_desk.stop().await;
}
