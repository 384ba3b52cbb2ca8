//! What `countersign mcp` costs an agent on a read-only tool, which it passes straight through.
//!
//! One run measures the latency of the same trivial upstream tool (`echo`) three ways, interleaved
//! in round-robin blocks so that machine noise hits all three alike:
//!
//! - direct: the client talks to the upstream;
//! - relay: through a process that copies bytes both ways and parses nothing (the floor for any
//!   process in the middle);
//! - gateway: through `countersign mcp --no-launch --socket <none> -- <upstream>` (no desk is
//!   needed for open tools).
//!
//! Then the gateway's idle resident memory (after `initialize`, `tools/list` and 1 s idle) and its
//! start-to-first-response time (spawn to the `initialize` response, median of several starts).
//! Goals: gateway median at most 1.10 × relay, idle RSS at most 10 MiB, start at most 50 ms.
//!
//! The upstream is this same program in upstream mode: an rmcp server with one read-only `echo`
//! tool, so the benchmark needs nothing installed. The relay is this program in relay mode too.
//! When the pinned `@modelcontextprotocol/server-everything` is installed under `target/peers`
//! (`.ci/setup tests` puts it there), its `echo` is measured the same three ways afterwards.
//!
//! `cargo bench -p countersign --bench passthrough [-- CALLS]`; environment:
//! `COUNTERSIGN_BENCH_CALLS` (default 10000 per setup), `COUNTERSIGN_BENCH_BLOCK` (calls per block,
//! default 100), `COUNTERSIGN_BENCH_STARTS` (default 20), `COUNTERSIGN_BENCH_EVERYTHING` (`0` to
//! skip server-everything, or the path of its `dist/index.js`). Run without `--bench` (as
//! `cargo test --all-targets` does) it only smoke-tests every path with a few calls.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use rmcp::model::*;
use rmcp::service::{RequestContext, RunningService};
use rmcp::{ErrorData, RoleClient, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Map, Value, json};

/// First argument that makes this program the trivial upstream server.
const UPSTREAM: &str = "__countersign_bench_upstream";
/// First argument that makes this program the byte relay; the upstream command follows.
const RELAY: &str = "__countersign_bench_relay";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some(UPSTREAM) => return upstream(),
        Some(RELAY) => relay(&args[1..]),
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
// The measurements.

struct Config {
    /// `--bench` was given: a real run (else a smoke test).
    full: bool,
    calls: usize,
    block: usize,
    starts: usize,
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
            .unwrap_or(if full { 100 } else { 20 })
            .max(1);
        let starts = env_number("COUNTERSIGN_BENCH_STARTS")
            .unwrap_or(if full { 20 } else { 3 })
            .max(1);
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

impl Running {
    async fn start(command: &[OsString], quiet: bool) -> Self {
        let mut cmd = tokio::process::Command::new(&command[0]);
        cmd.args(&command[1..])
            .env("RUST_LOG", "error")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(if quiet {
                Stdio::null()
            } else {
                Stdio::inherit()
            })
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {:?}: {e}", command[0]));
        let read = child.stdout.take().expect("piped stdout");
        let write = child.stdin.take().expect("piped stdin");
        let info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("bench-agent", "1.0"),
        );
        let client = info
            .serve((read, write))
            .await
            .unwrap_or_else(|e| panic!("{:?} did not initialize: {e}", command[0]));
        Self { client, child }
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

fn echo_params(message: &str) -> CallToolRequestParams {
    let arguments: Map<String, Value> = [("message".to_owned(), json!(message))]
        .into_iter()
        .collect();
    CallToolRequestParams::new("echo").with_arguments(arguments)
}

/// One call, timed from just before the request is sent to the parsed response.
async fn timed_call(client: &Client, params: CallToolRequestParams) -> Duration {
    let started = Instant::now();
    let result = client.peer().call_tool(params).await.expect("echo answers");
    let elapsed = started.elapsed();
    assert_ne!(result.is_error, Some(true), "echo failed: {result:?}");
    elapsed
}

struct Stats {
    median: Duration,
    p99: Duration,
}

fn stats(samples: &mut [Duration]) -> Stats {
    samples.sort_unstable();
    let n = samples.len();
    Stats {
        median: samples[n / 2],
        p99: samples[(n * 99).div_ceil(100).max(1) - 1],
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

/// CPU time a process has used so far, all its threads, from `/proc/<pid>/task/*/schedstat`.
fn cpu_time(pid: u32) -> Option<Duration> {
    let mut total = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(total))
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

/// The three ways to reach one upstream.
fn setups(upstream: &[OsString], socket: &Path, me: &Path) -> [(&'static str, Vec<OsString>); 3] {
    let mut relay = vec![me.into(), RELAY.into()];
    relay.extend(upstream.iter().cloned());
    let mut gateway: Vec<OsString> = vec![
        env!("CARGO_BIN_EXE_countersign").into(),
        "mcp".into(),
        "--no-launch".into(),
        "--socket".into(),
        socket.into(),
        "--".into(),
    ];
    gateway.extend(upstream.iter().cloned());
    [
        ("direct", upstream.to_vec()),
        ("relay", relay),
        ("gateway", gateway),
    ]
}

/// Latency of `echo` through each setup, interleaved in round-robin blocks; prints the figures and
/// the gateway's memory after the run.
async fn latency(
    config: &Config,
    title: &str,
    setups: &[(&'static str, Vec<OsString>); 3],
    quiet: bool,
) {
    println!();
    println!(
        "{title}: {} calls per setup, interleaved in blocks of {}",
        config.calls, config.block
    );
    let mut running = Vec::new();
    for (name, command) in setups {
        let r = Running::start(command, quiet).await;
        let tools = r.client.peer().list_all_tools().await.expect("tools/list");
        assert!(
            tools.iter().any(|t| t.name == "echo"),
            "{name}: no echo tool"
        );
        let check = r
            .client
            .peer()
            .call_tool(echo_params("hello"))
            .await
            .expect("echo answers");
        let text = check.content.first().and_then(|c| c.as_text());
        assert_eq!(
            text.map(|t| t.text.as_str()),
            Some("Echo: hello"),
            "{name}: {check:?}"
        );
        running.push(r);
    }
    // Warm-up, interleaved like the measurement.
    let warmup = (config.calls / 10).clamp(1, 500);
    for r in &running {
        for _ in 0..warmup {
            timed_call(&r.client, echo_params("warm-up")).await;
        }
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(config.calls); setups.len()];
    // CPU of the process in the middle (the relay, the gateway) over the measured calls.
    let cpu_before: Vec<_> = running.iter().map(|r| cpu_time(r.pid())).collect();
    let blocks = config.calls.div_ceil(config.block);
    for b in 0..blocks {
        let size = config.block.min(config.calls - b * config.block);
        // Rotate which setup goes first, so none always follows the same neighbour.
        for k in 0..setups.len() {
            let i = (b + k) % setups.len();
            for _ in 0..size {
                let d = timed_call(&running[i].client, echo_params("hello")).await;
                samples[i].push(d);
            }
        }
    }
    let cpu_per_call: Vec<Option<Duration>> = running
        .iter()
        .zip(cpu_before)
        .map(|(r, before)| Some((cpu_time(r.pid())? - before?) / config.calls as u32))
        .collect();
    let results: Vec<Stats> = samples.iter_mut().map(|s| stats(s)).collect();
    println!(
        "  {:<8} {:>12} {:>12} {:>26}",
        "setup", "median µs", "p99 µs", "CPU µs/call in the middle"
    );
    for (i, ((name, _), s)) in setups.iter().zip(&results).enumerate() {
        let cpu = match cpu_per_call[i] {
            Some(cpu) if i > 0 => format!("{:.1}", micros(cpu)),
            _ => "-".to_owned(),
        };
        println!(
            "  {:<8} {:>12.1} {:>12.1} {:>26}",
            name,
            micros(s.median),
            micros(s.p99),
            cpu
        );
    }
    let (direct, relay, gateway) = (&results[0], &results[1], &results[2]);
    let gateway_over_relay = gateway.median.as_secs_f64() / relay.median.as_secs_f64();
    println!(
        "  ratio relay/direct (median): {:.2}",
        relay.median.as_secs_f64() / direct.median.as_secs_f64()
    );
    println!("  ratio gateway/relay (median): {gateway_over_relay:.2}");
    println!(
        "  goal: gateway median ≤ 1.10 × relay: {} ({gateway_over_relay:.2} ×; gateway adds {:.1} µs over the relay)",
        met(gateway_over_relay <= 1.10),
        micros(gateway.median) - micros(relay.median)
    );
    println!(
        "  gateway memory after the run: {}",
        memory(running[2].pid())
    );
    for r in running {
        r.stop().await;
    }
}

async fn bench(config: Config) {
    let me = std::env::current_exe().expect("this program's path");
    let dir = tempfile::tempdir().expect("a temporary directory");
    // No desk listens here: open tools must not need one.
    let socket = dir.path().join("no-desk.sock");
    let ours: Vec<OsString> = vec![me.clone().into(), UPSTREAM.into()];
    let ours = setups(&ours, &socket, &me);

    println!(
        "countersign gateway bench{}",
        if config.full {
            ""
        } else {
            " (smoke test: pass --bench for real figures)"
        }
    );

    // Idle memory: initialize, tools/list, then 1 s of nothing.
    let idle = Running::start(&ours[2].1, false).await;
    idle.client
        .peer()
        .list_all_tools()
        .await
        .expect("tools/list");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_memory = memory(idle.pid());
    println!(
        "gateway idle memory: {idle_memory}; goal ≤ 10 MiB: {}",
        met(idle_memory.rss <= 10 * 1024)
    );
    idle.stop().await;

    // Start-to-first-response, the upstream alone alternating with the gateway in front of it.
    let mut gateway_starts = Vec::new();
    let mut upstream_starts = Vec::new();
    for _ in 0..config.starts {
        for (command, into) in [
            (&ours[2].1, &mut gateway_starts),
            (&ours[0].1, &mut upstream_starts),
        ] {
            let started = Instant::now();
            let r = Running::start(command, false).await;
            into.push(started.elapsed());
            r.stop().await;
        }
    }
    let gateway_start = median(gateway_starts);
    println!(
        "gateway start to first response (spawn to the initialize response, median of {}): {:.1} ms; goal ≤ 50 ms: {} (the upstream alone: {:.1} ms)",
        config.starts,
        millis(gateway_start),
        met(gateway_start <= Duration::from_millis(50)),
        millis(median(upstream_starts))
    );

    latency(&config, "trivial rmcp upstream (this bench)", &ours, false).await;

    if let Some(index) = &config.everything {
        let upstream: Vec<OsString> = vec!["node".into(), index.into(), "stdio".into()];
        let everything = setups(&upstream, &socket, &me);
        latency(
            &config,
            "@modelcontextprotocol/server-everything (node)",
            &everything,
            true,
        )
        .await;
    }
}
