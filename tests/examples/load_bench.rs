//! The desk under load, measured and printed (figures are not asserted: the machines are shared
//! and noisy; a response lost, crossed or duplicated makes the run exit 1).
//!
//! The desk is `desk_child --approve`: the engine, store file and socket server without the
//! window, approving every request through `Engine::approve` as the window's button does. Every
//! agent is an rmcp client talking to its own `countersign mcp --no-launch --socket S --
//! python3 tests/peers/echo_server.py`, so each has a real upstream, started by the desk: `echo`
//! (read-only, so open) and `write` (gated, works-once) both answer with their arguments.
//!
//! 1. Load: 32 agents at once, each making 500 open calls (2 in flight) while it runs 20
//!    preflights, each approved by the engine and then confirmed. Every call carries a nonce of
//!    its own and its answer must carry the same one back (an answer with another call's nonce is
//!    "crossed"); between each client and its pipe the JSON-RPC lines are tapped, and every
//!    request id must get exactly one response (none missing, none twice, none unasked for).
//!    Printed: latency of open calls and of preflight → decision (p50, p99, max), the CPU time of
//!    the desk and, separately, of the upstreams and the pipes over the calls (utime + stime), and
//!    memory: the desk's PSS alone and summed with its children (the upstreams).
//!    Then the open calls alone, beside a direct connection: the same agents, calls and lanes,
//!    once through the desk and once with each agent connected straight to its own upstream (no
//!    pipe, no desk), one after the other: calls per second, p50 and p99 of each, and the ratios.
//! 2. Churn: 200 agents connecting and disconnecting in a loop for a minute, at most 16 at a
//!    time; each cycle starts a pipe, initializes, makes one open call and closes. The desk's
//!    threads, open descriptors, children and memory are printed before and after (each after a
//!    short settle), with the processes of this run still alive anywhere on the machine.
//!
//! `make bench` runs it (about a minute and a half). Environment, to shrink it:
//! `COUNTERSIGN_LOAD_AGENTS` (32), `COUNTERSIGN_LOAD_CALLS` (500 open calls per agent),
//! `COUNTERSIGN_LOAD_PREFLIGHTS` (20 per agent), `COUNTERSIGN_LOAD_INFLIGHT` (2 open calls in
//! flight per agent), `COUNTERSIGN_LOAD_CHURN_AGENTS` (200), `COUNTERSIGN_LOAD_CHURN_PARALLEL`
//! (16), `COUNTERSIGN_LOAD_CHURN_SECS` (60), `COUNTERSIGN_LOAD_SETTLE_SECS` (3).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use countersign_tests::desk_process::DeskChild;
use countersign_tests::measure;
use rmcp::model::*;
use rmcp::service::RunningService;
use rmcp::{Peer, RoleClient, ServiceExt};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// How long one call may take before it counts as lost.
const CALL_DEADLINE: Duration = Duration::from_secs(60);

struct Config {
    agents: usize,
    calls: usize,
    preflights: usize,
    inflight: usize,
    churn_agents: usize,
    churn_parallel: usize,
    churn: Duration,
    settle: Duration,
}

impl Config {
    fn from_env() -> Config {
        let number = |name: &str, default: usize| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        Config {
            agents: number("COUNTERSIGN_LOAD_AGENTS", 32),
            calls: number("COUNTERSIGN_LOAD_CALLS", 500),
            preflights: number("COUNTERSIGN_LOAD_PREFLIGHTS", 20),
            inflight: number("COUNTERSIGN_LOAD_INFLIGHT", 2).max(1),
            churn_agents: number("COUNTERSIGN_LOAD_CHURN_AGENTS", 200),
            churn_parallel: number("COUNTERSIGN_LOAD_CHURN_PARALLEL", 16).max(1),
            churn: Duration::from_secs(number("COUNTERSIGN_LOAD_CHURN_SECS", 60) as u64),
            settle: Duration::from_secs(number("COUNTERSIGN_LOAD_SETTLE_SECS", 3) as u64),
        }
    }
}

fn echo_server() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("peers/echo_server.py")
}

/// A small generator for the nonces, seeded from the clock.
struct Random(u64);

impl Random {
    fn seeded(salt: u64) -> Random {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        Random((now ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

// ---------------------------------------------------------------------------------------------
// The desk.

/// What the desk looks like from `/proc` at one moment.
struct Snapshot {
    threads: u64,
    fds: usize,
    children: usize,
    zombies: usize,
    rss_kb: u64,
    pss_kb: u64,
    pss_anon_kb: u64,
    pss_with_children_kb: u64,
    /// Upstreams and pipes of this run alive anywhere on the machine.
    upstreams_anywhere: usize,
    pipes_anywhere: usize,
}

fn snapshot(desk: u32, marker: &str) -> Snapshot {
    let children = measure::children(desk);
    let zombies = children
        .iter()
        .filter(|&&p| measure::state(p) == Some('Z'))
        .count();
    let pss_kb = measure::pss_kb(desk).unwrap_or(0);
    let pss_with_children_kb = pss_kb
        + measure::descendants(desk)
            .into_iter()
            .map(|p| measure::pss_kb(p).unwrap_or(0))
            .sum::<u64>();
    let (upstreams_anywhere, pipes_anywhere) = ours_anywhere(marker);
    Snapshot {
        threads: measure::threads(desk).unwrap_or(0),
        fds: measure::open_fds(desk).unwrap_or(0),
        children: children.len(),
        zombies,
        rss_kb: measure::rss_kb(desk).unwrap_or(0),
        pss_kb,
        pss_anon_kb: measure::pss_anon_kb(desk).unwrap_or(0),
        pss_with_children_kb,
        upstreams_anywhere,
        pipes_anywhere,
    }
}

/// The upstreams and the pipes of this run alive anywhere (whoever their parent now is), found by
/// their command lines: every upstream is given the run's directory as a last argument, and every
/// pipe names the run's socket.
fn ours_anywhere(marker: &str) -> (usize, usize) {
    let (mut upstreams, mut pipes) = (0, 0);
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return (0, 0);
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().parse::<u32>().is_err() {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if !args.iter().any(|a| a.contains(marker)) {
            continue;
        }
        if args.first().is_some_and(|a| a.ends_with("countersign")) {
            pipes += 1;
        } else if args.iter().any(|a| a.ends_with("echo_server.py")) {
            upstreams += 1;
        }
    }
    (upstreams, pipes)
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// One table: the desk's threads, open descriptors, children (and zombies among them), memory
/// (RSS; PSS, its anonymous part, and PSS summed with its children's), and the upstreams and
/// pipes of this run alive anywhere on the machine.
fn print_snapshots(rows: &[(&str, &Snapshot)]) {
    println!(
        "  {:<44} {:>7} {:>5} {:>8} {:>7} {:>7} {:>7} {:>9} {:>9} {:>15}",
        "desk process",
        "threads",
        "fds",
        "children",
        "zombies",
        "RSS MB",
        "PSS MB",
        "anon MB",
        "+children",
        "alive: up, pipe"
    );
    for (name, s) in rows {
        println!(
            "  {:<44} {:>7} {:>5} {:>8} {:>7} {:>7.1} {:>7.1} {:>9.1} {:>9.1} {:>15}",
            name,
            s.threads,
            s.fds,
            s.children,
            s.zombies,
            mb(s.rss_kb),
            mb(s.pss_kb),
            mb(s.pss_anon_kb),
            mb(s.pss_with_children_kb),
            format!("{}, {}", s.upstreams_anywhere, s.pipes_anywhere)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// An agent: an rmcp client on a pipe, with the JSON-RPC lines between them tapped.

/// How often each request id crossed the tap toward the pipe, and each response id back.
#[derive(Default)]
struct Wire {
    requests: HashMap<String, u32>,
    responses: HashMap<String, u32>,
}

/// What the tap found wrong: ids asked and never answered, answered twice, answered unasked.
#[derive(Default, Debug, Clone, Copy)]
struct WireCheck {
    requests: usize,
    unanswered: usize,
    answered_twice: usize,
    unasked: usize,
}

impl std::ops::AddAssign for WireCheck {
    fn add_assign(&mut self, other: WireCheck) {
        self.requests += other.requests;
        self.unanswered += other.unanswered;
        self.answered_twice += other.answered_twice;
        self.unasked += other.unasked;
    }
}

impl Wire {
    fn check(&self) -> WireCheck {
        WireCheck {
            requests: self.requests.len(),
            unanswered: self
                .requests
                .keys()
                .filter(|id| !self.responses.contains_key(*id))
                .count(),
            answered_twice: self.requests.values().filter(|&&n| n > 1).count()
                + self.responses.values().filter(|&&n| n > 1).count(),
            unasked: self
                .responses
                .keys()
                .filter(|id| !self.requests.contains_key(*id))
                .count(),
        }
    }
}

/// Copies JSON-RPC lines from `from` to `to`, counting the ids of requests (`method` and `id`) or
/// of responses (`id`, no `method`) into `counts`.
async fn tap(
    from: impl tokio::io::AsyncRead + Unpin,
    mut to: impl tokio::io::AsyncWrite + Unpin,
    wire: Arc<Mutex<Wire>>,
    requests: bool,
) {
    let mut from = BufReader::with_capacity(64 * 1024, from);
    let mut line = Vec::new();
    loop {
        line.clear();
        match from.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if let Ok(message) = serde_json::from_slice::<Value>(&line) {
            let is_request = message.get("method").is_some();
            if let Some(id) = message.get("id")
                && is_request == requests
            {
                let mut wire = countersign_core::sync::lock(&wire);
                let counts = if requests {
                    &mut wire.requests
                } else {
                    &mut wire.responses
                };
                *counts.entry(id.to_string()).or_default() += 1;
            }
        }
        if to.write_all(&line).await.is_err() || to.flush().await.is_err() {
            break;
        }
    }
}

/// `countersign mcp --no-launch --socket S -- python3 echo_server.py RUN_DIR`.
fn pipe_command(socket: &Path, run_dir: &Path, name: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(countersign_tests::window::bin("countersign"));
    cmd.arg("mcp")
        .arg("--no-launch")
        .arg("--wait")
        .arg("120")
        .arg("--name")
        .arg(name)
        .arg("--socket")
        .arg(socket)
        .arg("--")
        .arg("python3")
        .arg(echo_server())
        .arg(run_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    cmd
}

struct Agent {
    client: RunningService<RoleClient, ClientConfig>,
    pipe: tokio::process::Child,
    wire: Arc<Mutex<Wire>>,
    taps: Vec<tokio::task::JoinHandle<()>>,
}

impl Agent {
    /// Starts a pipe, initializes through the tap, and checks both tools are listed.
    async fn connect(socket: &Path, run_dir: &Path, name: &str) -> Result<Agent, String> {
        let mut pipe = pipe_command(socket, run_dir, name)
            .spawn()
            .map_err(|e| format!("countersign mcp did not start: {e}"))?;
        let (pipe_in, pipe_out) = (pipe.stdin.take().unwrap(), pipe.stdout.take().unwrap());
        let (to_client, client_reads) = tokio::io::duplex(64 * 1024);
        let (client_writes, from_client) = tokio::io::duplex(64 * 1024);
        let wire = Arc::new(Mutex::new(Wire::default()));
        let taps = vec![
            tokio::spawn(tap(pipe_out, to_client, wire.clone(), false)),
            tokio::spawn(tap(from_client, pipe_in, wire.clone(), true)),
        ];
        let info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new(name, "1.0"),
        );
        let client = tokio::time::timeout(CALL_DEADLINE, info.serve((client_reads, client_writes)))
            .await
            .map_err(|_| "no answer to initialize".to_owned())?
            .map_err(|e| format!("initialize: {e}"))?;
        let tools = tokio::time::timeout(CALL_DEADLINE, client.peer().list_all_tools())
            .await
            .map_err(|_| "no answer to tools/list".to_owned())?
            .map_err(|e| format!("tools/list: {e}"))?;
        for wanted in ["echo", "write"] {
            if !tools.iter().any(|t| t.name == wanted) {
                return Err(format!("`{wanted}` is not listed"));
            }
        }
        Ok(Agent {
            client,
            pipe,
            wire,
            taps,
        })
    }

    fn peer(&self) -> Peer<RoleClient> {
        self.client.peer().clone()
    }

    /// Closes the client's side; the pipe must exit on its own (killed after 10 s, and said so).
    async fn close(mut self) -> (WireCheck, bool) {
        let _ = self.client.cancel().await;
        let exited = tokio::time::timeout(Duration::from_secs(10), self.pipe.wait())
            .await
            .is_ok();
        if !exited {
            let _ = self.pipe.kill().await;
        }
        for tap in self.taps {
            let _ = tokio::time::timeout(Duration::from_secs(5), tap).await;
        }
        let check = countersign_core::sync::lock(&self.wire).check();
        (check, exited)
    }
}

/// What one call's answer was, by its nonce.
enum Answer {
    Own,
    /// Another call's nonce came back.
    Crossed(String),
    /// No answer within the deadline, or the session broke.
    Lost(String),
    /// An answer that carries no nonce at all (an error, a refusal).
    Wrong(String),
}

async fn call(
    peer: &Peer<RoleClient>,
    tool: &str,
    arguments: &Map<String, Value>,
) -> Result<CallToolResult, String> {
    let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments.clone());
    match tokio::time::timeout(CALL_DEADLINE, peer.call_tool(params)).await {
        Ok(Ok(result)) => Ok(result),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {} s", CALL_DEADLINE.as_secs())),
    }
}

/// Whether `result` carries `field` = `nonce` in its structured content (and the same object as
/// its text, for an echo).
fn judge(result: &CallToolResult, field: &str, nonce: &str, expected: Option<&Value>) -> Answer {
    let Some(structured) = &result.structured_content else {
        return Answer::Wrong(format!("no structured content: {result:?}"));
    };
    match structured.get(field).and_then(Value::as_str) {
        Some(got) if got == nonce => {}
        Some(got) => return Answer::Crossed(got.to_owned()),
        None => return Answer::Wrong(format!("no `{field}` in {structured}")),
    }
    if let Some(expected) = expected {
        if structured != expected {
            return Answer::Wrong(format!("{structured} is not {expected}"));
        }
        let text: Option<Value> = result
            .content
            .first()
            .and_then(|c| c.as_text())
            .and_then(|t| serde_json::from_str(&t.text).ok());
        if text.as_ref() != Some(expected) {
            return Answer::Wrong(format!("the text {text:?} is not {expected}"));
        }
    }
    Answer::Own
}

/// What one agent of the load saw.
#[derive(Default)]
struct Tally {
    open: Vec<Duration>,
    preflight: Vec<Duration>,
    confirm: Vec<Duration>,
    own: usize,
    crossed: usize,
    lost: usize,
    wrong: usize,
    examples: Vec<String>,
}

impl Tally {
    fn count(&mut self, what: &str, answer: Answer) -> bool {
        let problem = match answer {
            Answer::Own => {
                self.own += 1;
                return true;
            }
            Answer::Crossed(other) => {
                self.crossed += 1;
                format!("{what}: crossed, carried {other}")
            }
            Answer::Lost(why) => {
                self.lost += 1;
                format!("{what}: lost: {why}")
            }
            Answer::Wrong(why) => {
                self.wrong += 1;
                format!("{what}: {why}")
            }
        };
        if self.examples.len() < 3 {
            self.examples.push(problem);
        }
        false
    }

    fn merge(&mut self, other: Tally) {
        self.open.extend(other.open);
        self.preflight.extend(other.preflight);
        self.confirm.extend(other.confirm);
        self.own += other.own;
        self.crossed += other.crossed;
        self.lost += other.lost;
        self.wrong += other.wrong;
        for e in other.examples {
            if self.examples.len() < 5 {
                self.examples.push(e);
            }
        }
    }
}

/// `count` open calls, one after another, each with a nonce of its own.
async fn open_calls(peer: Peer<RoleClient>, agent: usize, lane: usize, count: usize) -> Tally {
    let mut tally = Tally::default();
    let mut random = Random::seeded((agent * 1000 + lane) as u64);
    for n in 0..count {
        let nonce = format!("a{agent}-l{lane}-o{n}-{:016x}", random.next());
        let arguments = json!({ "nonce": nonce, "agent": agent, "seq": n });
        let map = arguments.as_object().unwrap();
        let started = Instant::now();
        let answer = match call(&peer, "echo", map).await {
            Ok(result) => {
                tally.open.push(started.elapsed());
                judge(&result, "nonce", &nonce, Some(&arguments))
            }
            Err(e) => Answer::Lost(e),
        };
        tally.count(&format!("echo {nonce}"), answer);
    }
    tally
}

/// `count` preflights of `write`, each approved by the desk child, then confirmed.
async fn preflights(peer: Peer<RoleClient>, agent: usize, count: usize) -> Tally {
    let mut tally = Tally::default();
    let mut random = Random::seeded((agent * 1000 + 999) as u64);
    for n in 0..count {
        let nonce = format!("a{agent}-w{n}-{:016x}", random.next());
        let path = format!("/load/{nonce}");
        let arguments = json!({ "path": path, "text": nonce });
        let started = Instant::now();
        let pre = match call(&peer, "write", arguments.as_object().unwrap()).await {
            Ok(result) => result,
            Err(e) => {
                tally.count(&format!("preflight {nonce}"), Answer::Lost(e));
                continue;
            }
        };
        tally.preflight.push(started.elapsed());
        let token = pre
            .structured_content
            .as_ref()
            .and_then(|s| s.get("confirmToken"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let verdict = match &token {
            Some(_) => judge(&pre, "confirmTarget", &path, None),
            None => Answer::Wrong(format!("not approved: {:?}", pre.structured_content)),
        };
        if !tally.count(&format!("preflight {nonce}"), verdict) {
            continue;
        }
        let mut confirm = arguments.clone();
        confirm["confirm"] = json!(true);
        confirm["confirmTarget"] = json!(path);
        confirm["confirmToken"] = json!(token);
        let started = Instant::now();
        let answer = match call(&peer, "write", confirm.as_object().unwrap()).await {
            Ok(result) => {
                tally.confirm.push(started.elapsed());
                // What runs is what was approved: the upstream hands back the preflight's arguments.
                judge(&result, "text", &nonce, Some(&arguments))
            }
            Err(e) => Answer::Lost(e),
        };
        tally.count(&format!("confirm {nonce}"), answer);
    }
    tally
}

fn percentiles(samples: &mut [Duration]) -> String {
    if samples.is_empty() {
        return "no samples".to_owned();
    }
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    format!(
        "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (n = {})",
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        samples.last().unwrap().as_secs_f64() * 1e3,
        samples.len()
    )
}

fn cpu_of(pids: &[u32]) -> HashMap<u32, Duration> {
    pids.iter()
        .filter_map(|&p| Some((p, measure::cpu_time(p)?)))
        .collect()
}

/// CPU used between two readings by the processes present in both.
fn cpu_between(before: &HashMap<u32, Duration>, after: &HashMap<u32, Duration>) -> Duration {
    after
        .iter()
        .filter_map(|(p, a)| Some(a.saturating_sub(*before.get(p)?)))
        .sum()
}

// ---------------------------------------------------------------------------------------------

/// Phase 1. Returns whether every answer was the caller's own, exactly once.
/// An agent connected straight to its own upstream: the floor the desk is compared with.
async fn direct_agent(
    run_dir: &Path,
    name: &str,
) -> Result<RunningService<RoleClient, ClientConfig>, String> {
    let mut cmd = tokio::process::Command::new("python3");
    cmd.arg(echo_server()).arg(run_dir);
    let transport = rmcp::transport::TokioChildProcess::builder(cmd)
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("the upstream did not start: {e}"))?
        .0;
    let info = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new(name, "1.0"),
    );
    tokio::time::timeout(CALL_DEADLINE, info.serve(transport))
        .await
        .map_err(|_| "no answer to initialize".to_owned())?
        .map_err(|e| format!("initialize: {e}"))
}

/// Open calls alone from `peers` (`config.calls` each, `config.inflight` in flight): the tally
/// and the wall time.
async fn open_only(config: &Config, peers: &[Peer<RoleClient>]) -> (Tally, Duration) {
    let started = Instant::now();
    let mut work = tokio::task::JoinSet::new();
    for (i, peer) in peers.iter().enumerate() {
        for lane in 0..config.inflight {
            let share =
                config.calls / config.inflight + usize::from(lane < config.calls % config.inflight);
            work.spawn(open_calls(peer.clone(), i, lane, share));
        }
    }
    let mut tally = Tally::default();
    while let Some(joined) = work.join_next().await {
        tally.merge(joined.unwrap());
    }
    (tally, started.elapsed())
}

/// The open calls through the desk beside the same calls made directly.
async fn beside_direct(config: &Config, socket: &Path, run_dir: &Path) -> bool {
    println!();
    println!(
        "1b. open calls alone: {} agents × {} open calls ({} in flight), through the desk, then each agent straight to its upstream",
        config.agents, config.calls, config.inflight
    );
    let mut through = Vec::new();
    for i in 0..config.agents {
        match Agent::connect(socket, run_dir, &format!("open-agent-{i}")).await {
            Ok(agent) => through.push(agent),
            Err(e) => println!("  agent {i} did not connect through the desk: {e}"),
        }
    }
    let peers: Vec<_> = through.iter().map(Agent::peer).collect();
    let (mut desk, desk_wall) = open_only(config, &peers).await;
    for agent in through {
        agent.close().await;
    }
    let mut direct_agents = Vec::new();
    for i in 0..config.agents {
        match direct_agent(run_dir, &format!("direct-agent-{i}")).await {
            Ok(agent) => direct_agents.push(agent),
            Err(e) => println!("  agent {i} did not connect directly: {e}"),
        }
    }
    let peers: Vec<_> = direct_agents.iter().map(|a| a.peer().clone()).collect();
    let (mut direct, direct_wall) = open_only(config, &peers).await;
    for agent in direct_agents {
        let _ = agent.cancel().await;
    }
    let rate = |t: &Tally, wall: Duration| t.open.len() as f64 / wall.as_secs_f64();
    let p = |t: &mut Tally, q: f64| {
        t.open.sort_unstable();
        t.open
            .get(((t.open.len().max(1) - 1) as f64 * q).round() as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    let (desk_rate, direct_rate) = (rate(&desk, desk_wall), rate(&direct, direct_wall));
    let (desk_p50, direct_p50) = (p(&mut desk, 0.5), p(&mut direct, 0.5));
    let (desk_p99, direct_p99) = (p(&mut desk, 0.99), p(&mut direct, 0.99));
    println!(
        "  through the desk: {:.0} calls/s, p50 {:.1} ms, p99 {:.1} ms (n = {})",
        desk_rate,
        desk_p50,
        desk_p99,
        desk.open.len()
    );
    println!(
        "  direct:           {:.0} calls/s, p50 {:.1} ms, p99 {:.1} ms (n = {})",
        direct_rate,
        direct_p50,
        direct_p99,
        direct.open.len()
    );
    println!(
        "  desk / direct:    calls/s ×{:.2}, p50 ×{:.2}, p99 ×{:.2}",
        desk_rate / direct_rate.max(f64::MIN_POSITIVE),
        desk_p50 / direct_p50.max(f64::MIN_POSITIVE),
        desk_p99 / direct_p99.max(f64::MIN_POSITIVE)
    );
    for e in desk.examples.iter().chain(&direct.examples) {
        println!("    e.g. {e}");
    }
    desk.crossed + desk.lost + desk.wrong + direct.crossed + direct.lost + direct.wrong == 0
}

async fn load(config: &Config, desk: &DeskChild, socket: &Path, run_dir: &Path) -> bool {
    println!();
    println!(
        "1. load: {} agents at once, each {} open calls ({} in flight) and {} preflights approved by the engine, then confirmed",
        config.agents, config.calls, config.inflight, config.preflights
    );
    let started = Instant::now();
    let mut connecting = tokio::task::JoinSet::new();
    for i in 0..config.agents {
        let (socket, run_dir) = (socket.to_owned(), run_dir.to_owned());
        connecting.spawn(async move {
            (
                i,
                Agent::connect(&socket, &run_dir, &format!("load-agent-{i}")).await,
            )
        });
    }
    let mut agents = Vec::new();
    while let Some(joined) = connecting.join_next().await {
        match joined.unwrap() {
            (_, Ok(agent)) => agents.push(agent),
            (i, Err(e)) => println!("  agent {i} did not connect: {e}"),
        }
    }
    println!(
        "  {} agents connected and listed in {:.1} s",
        agents.len(),
        started.elapsed().as_secs_f64()
    );
    let connected = snapshot(desk.pid, &run_dir.display().to_string());
    let upstreams = measure::children(desk.pid);
    let pipes: Vec<u32> = agents.iter().filter_map(|a| a.pipe.id()).collect();
    let desk_cpu = measure::cpu_time(desk.pid);
    let upstream_cpu = cpu_of(&upstreams);
    let pipe_cpu = cpu_of(&pipes);
    let own_cpu = measure::cpu_time(std::process::id());

    let started = Instant::now();
    let mut work = tokio::task::JoinSet::new();
    for (i, agent) in agents.iter().enumerate() {
        for lane in 0..config.inflight {
            let share =
                config.calls / config.inflight + usize::from(lane < config.calls % config.inflight);
            work.spawn(open_calls(agent.peer(), i, lane, share));
        }
        work.spawn(preflights(agent.peer(), i, config.preflights));
    }
    let mut tally = Tally::default();
    while let Some(joined) = work.join_next().await {
        tally.merge(joined.unwrap());
    }
    let wall = started.elapsed();
    let desk_cpu = measure::cpu_time(desk.pid)
        .zip(desk_cpu)
        .map(|(a, b)| a.saturating_sub(b));
    let upstream_cpu = cpu_between(&upstream_cpu, &cpu_of(&upstreams));
    let pipe_cpu = cpu_between(&pipe_cpu, &cpu_of(&pipes));
    let own_cpu = measure::cpu_time(std::process::id())
        .zip(own_cpu)
        .map(|(a, b)| a.saturating_sub(b));
    let loaded = snapshot(desk.pid, &run_dir.display().to_string());

    let mut wire = WireCheck::default();
    let mut stuck = 0;
    for agent in agents {
        let (check, exited) = agent.close().await;
        wire += check;
        stuck += usize::from(!exited);
    }

    let calls = tally.open.len() + tally.preflight.len() + tally.confirm.len();
    println!(
        "  {} calls answered in {:.1} s ({:.0} calls/s): {} open, {} preflights, {} confirms",
        calls,
        wall.as_secs_f64(),
        calls as f64 / wall.as_secs_f64(),
        tally.open.len(),
        tally.preflight.len(),
        tally.confirm.len()
    );
    println!(
        "  open call latency:             {}",
        percentiles(&mut tally.open)
    );
    println!(
        "  preflight → decision latency:  {}",
        percentiles(&mut tally.preflight)
    );
    println!(
        "  confirm → upstream's answer:   {}",
        percentiles(&mut tally.confirm)
    );
    println!(
        "  answers: {} carried their own nonce; {} crossed (another call's nonce), {} lost, {} wrong (no nonce: an error or a refusal)",
        tally.own, tally.crossed, tally.lost, tally.wrong
    );
    println!(
        "  on the wire (tapped between each client and its pipe): {} requests; {} unanswered, {} answered twice (or sent twice), {} answers to ids never asked",
        wire.requests, wire.unanswered, wire.answered_twice, wire.unasked
    );
    for e in &tally.examples {
        println!("    e.g. {e}");
    }
    if stuck > 0 {
        println!("  {stuck} pipes did not exit within 10 s of their agent closing (killed)");
    }
    let secs =
        |d: Option<Duration>| d.map_or("?".to_owned(), |d| format!("{:.2}", d.as_secs_f64()));
    let per_call = |d: Option<Duration>| {
        d.map_or("?".to_owned(), |d| {
            format!("{:.0}", d.as_secs_f64() * 1e6 / calls.max(1) as f64)
        })
    };
    println!(
        "  CPU over the calls (utime + stime, s; µs per call): desk {} s ({} µs/call); the {} upstreams {} s ({} µs/call); the {} pipes {} s ({} µs/call); this bench (the clients) {} s; wall {:.1} s on {} cores",
        secs(desk_cpu),
        per_call(desk_cpu),
        upstreams.len(),
        secs(Some(upstream_cpu)),
        per_call(Some(upstream_cpu)),
        pipes.len(),
        secs(Some(pipe_cpu)),
        per_call(Some(pipe_cpu)),
        secs(own_cpu),
        wall.as_secs_f64(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    print_snapshots(&[
        ("with the agents connected, before the calls", &connected),
        ("with the agents connected, after the calls", &loaded),
    ]);
    tally.crossed + tally.lost + tally.wrong + wire.unanswered + wire.answered_twice + wire.unasked
        == 0
}

/// One churn cycle: a pipe, initialize, one open call, close. Ok(duration) or why not.
async fn churn_cycle(
    socket: &Path,
    run_dir: &Path,
    agent: usize,
    n: usize,
) -> Result<Duration, String> {
    let started = Instant::now();
    let connected = Agent::connect(socket, run_dir, &format!("churn-agent-{agent}")).await?;
    let nonce = format!(
        "c{agent}-{n}-{:016x}",
        Random::seeded((agent * 7919 + n) as u64).next()
    );
    let arguments = json!({ "nonce": nonce });
    let answer = match call(
        &connected.client.peer().clone(),
        "echo",
        arguments.as_object().unwrap(),
    )
    .await
    {
        Ok(result) => judge(&result, "nonce", &nonce, Some(&arguments)),
        Err(e) => Answer::Lost(e),
    };
    let (wire, exited) = connected.close().await;
    match answer {
        Answer::Own => {}
        Answer::Crossed(other) => return Err(format!("crossed: carried {other}")),
        Answer::Lost(why) => return Err(format!("lost: {why}")),
        Answer::Wrong(why) => return Err(why),
    }
    if wire.unanswered + wire.answered_twice + wire.unasked > 0 {
        return Err(format!("on the wire: {wire:?}"));
    }
    if !exited {
        return Err("the pipe did not exit within 10 s of its agent closing".to_owned());
    }
    Ok(started.elapsed())
}

/// Phase 2. Returns whether every cycle succeeded.
async fn churn(config: &Config, desk: &DeskChild, socket: &Path, run_dir: &Path) -> bool {
    println!();
    println!(
        "2. churn: {} agents connecting and disconnecting in a loop for {} s, at most {} at a time (each: start `countersign mcp`, initialize, list, one open call, close)",
        config.churn_agents,
        config.churn.as_secs(),
        config.churn_parallel
    );
    let marker = run_dir.display().to_string();
    tokio::time::sleep(config.settle).await;
    let before = snapshot(desk.pid, &marker);
    let gate = Arc::new(tokio::sync::Semaphore::new(config.churn_parallel));
    let deadline = Instant::now() + config.churn;
    let mut agents = tokio::task::JoinSet::new();
    for agent in 0..config.churn_agents {
        let (gate, socket, run_dir) = (gate.clone(), socket.to_owned(), run_dir.to_owned());
        agents.spawn(async move {
            let mut done = Vec::new();
            let mut failed = Vec::new();
            for n in 0.. {
                // The semaphore is fair: the agents take turns.
                let _turn = gate.acquire().await.unwrap();
                if Instant::now() >= deadline {
                    break;
                }
                match churn_cycle(&socket, &run_dir, agent, n).await {
                    Ok(d) => done.push(d),
                    Err(e) => failed.push(e),
                }
            }
            (done, failed)
        });
    }
    let started = Instant::now();
    let mut cycles = Vec::new();
    let mut failures = Vec::new();
    let mut agents_cycled = 0;
    while let Some(joined) = agents.join_next().await {
        let (done, failed) = joined.unwrap();
        agents_cycled += usize::from(!done.is_empty() || !failed.is_empty());
        cycles.extend(done);
        failures.extend(failed);
    }
    let wall = started.elapsed();
    println!(
        "  {} cycles done in {:.1} s ({:.1} cycles/s) by {} agents; {} failed",
        cycles.len() + failures.len(),
        wall.as_secs_f64(),
        (cycles.len() + failures.len()) as f64 / wall.as_secs_f64(),
        agents_cycled,
        failures.len()
    );
    for e in failures.iter().take(5) {
        println!("    e.g. {e}");
    }
    println!(
        "  one cycle, start to the pipe's exit: {}",
        percentiles(&mut cycles)
    );
    tokio::time::sleep(config.settle).await;
    let after = snapshot(desk.pid, &marker);
    println!("  (each after {} s of settling)", config.settle.as_secs());
    print_snapshots(&[("before the churn", &before), ("after the churn", &after)]);
    println!(
        "  change: threads {:+}, fds {:+}, children {:+}, RSS {:+.1} MB, PSS {:+.1} MB",
        after.threads as i64 - before.threads as i64,
        after.fds as i64 - before.fds as i64,
        after.children as i64 - before.children as i64,
        mb(after.rss_kb) - mb(before.rss_kb),
        mb(after.pss_kb) - mb(before.pss_kb)
    );
    failures.is_empty()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    countersign_tests::measure::raise_descriptor_limit();
    let config = Config::from_env();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("desk.sock");
    let db = dir.path().join("desk.sqlite");
    let desk = DeskChild::start(&socket, &db).await;
    println!(
        "load bench: desk_child --approve (the engine, store and sessions without the window; debug build), one python3 echo upstream per agent; times in ms, CPU in s, memory in MB (1 MB = 1024 kB), PSS from smaps_rollup"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let fresh = snapshot(desk.pid, &dir.path().display().to_string());
    print_snapshots(&[("fresh, idle", &fresh)]);
    let answered = load(&config, &desk, &socket, dir.path()).await;
    let answered = beside_direct(&config, &socket, dir.path()).await && answered;
    let cycled = churn(&config, &desk, &socket, dir.path()).await;
    desk.stop().await;
    println!();
    println!(
        "verdict: load {}; churn {}",
        if answered {
            "every answer its caller's own, exactly once"
        } else {
            "PROBLEMS (see above)"
        },
        if cycled {
            "every cycle answered and closed"
        } else {
            "FAILURES (see above)"
        }
    );
    if !(answered && cycled) {
        std::process::exit(1);
    }
}
