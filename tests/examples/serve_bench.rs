//! `countersign serve`, measured and printed (figures are not asserted: the machines are shared
//! and noisy; a wrong answer makes the run exit 1). Needs PostgreSQL: `make bench` runs it under
//! `.ci/with-postgres`, with the servers built in release.
//!
//! Every figure is printed beside its floor, measured in the same run on the same machine and
//! database, and as a ratio to it:
//! - **the commit rate**: 16 clients doing single-row `INSERT`s on the same PostgreSQL (what
//!   `pgbench` does with a one-line script);
//! - **the works-once call straight to the upstream**: the built-in tools' `execute` run 16 at
//!   once in this process, on the same kind of file, as many calls as the confirms; run before
//!   the confirms and again after them (each on a fresh file), the floor being their mean;
//! - **the upstream's open call reached directly** (below), and through one bare relay: a
//!   process that copies bytes both ways and parses nothing (this program in relay mode), so the
//!   hop's own cost is told apart from the server's;
//! - **a decision row read**: from an `UPDATE` of a row to another connection, reading it in a
//!   loop, seeing it.
//!
//! 1. **Open calls.** A read-only `countersign serve` on the built-in tools is the upstream,
//!    reached directly over HTTP; a second `serve` stands in front of it (`--url`). The same
//!    `query` call in turn direct, through the bare relay and through the second server, first
//!    with one HTTP/1.1 connection per call, then on one kept-alive connection to each: median
//!    and p99 of each, and their ratios, in one run.
//! 2. **Confirms across two replicas.** Two writable replicas on one control database, with
//!    approver listeners. N works-once calls are asked on the first and approved through the
//!    second by a desk (a real signed decision each: the whole cycle per second is printed);
//!    then the N confirms go at once, alternately to each replica: confirms per second, and
//!    every one must run exactly once.
//! 3. **Memory.** The first replica's RSS idle, and after A agents (each with its own agent key,
//!    so its own tenant) listed the tools and made one call: per agent.
//!
//! Environment: `COUNTERSIGN_SERVE_BENCH_CALLS` (2000 per arm), `COUNTERSIGN_SERVE_BENCH_CONFIRMS`
//! (600: fewer make the confirms' figure a fraction of a second, and noisy),
//! `COUNTERSIGN_SERVE_BENCH_AGENTS` (100). To look into the confirms (the figure is
//! the default): `COUNTERSIGN_SERVE_BENCH_AT_ONCE` (16 confirms at once; were the confirms held
//! by a wait rather than by the cores, more at once would fill it) and
//! `COUNTERSIGN_SERVE_BENCH_KEPT_ALIVE` (`1`: each confirming thread keeps one connection to each
//! replica, as a pooling client does, instead of a connection per confirm).

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use countersign_core::approver::Verdict;
use countersign_tests::approver::{Desk, first_waiting, on_approver_listener};
use countersign_tests::measure;
use countersign_tests::ports::free_port;
use countersign_tests::team_server::{KeptAlive, call, micros, post, quantile, serve, tools_db};
use countersign_tests::window::bin;
use serde_json::json;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// First argument that makes this program the bare relay: `RELAY PORT` listens on a free port of
/// loopback, prints it, and copies each connection's bytes to and from `127.0.0.1:PORT`.
const RELAY: &str = "__countersign_serve_bench_relay";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(RELAY) {
        relay(args[2].parse().expect("relay: the upstream's port"));
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dsn = runtime.block_on(countersign_tests::postgres::shared_database());
    let dir = tempfile::tempdir().unwrap();
    let db = wal(tools_db(dir.path()));
    let db_arg = db.to_str().unwrap();

    // 1. Open calls: direct, and through a second server.
    let calls = env_or("COUNTERSIGN_SERVE_BENCH_CALLS", 2000);
    let direct = serve(
        &[
            "--read-only",
            "--unauthenticated",
            "--behind-tls-proxy",
            "--db",
            db_arg,
        ],
        &[],
    );
    let upstream = format!("http://127.0.0.1:{}/mcp", direct.port);
    let front = serve(
        &[
            "--read-only",
            "--unauthenticated",
            "--behind-tls-proxy",
            "--url",
            &upstream,
        ],
        &[],
    );
    let query = call("query", json!({"sql": "SELECT count(*) AS n FROM notes"}));
    for port in [direct.port, front.port] {
        let answer = post(port, &query, None);
        if answer["result"]["isError"] == json!(true) || answer["result"].is_null() {
            eprintln!("serve_bench: the query failed: {answer}");
            std::process::exit(1);
        }
    }
    let relayed = Relay::start(direct.port);
    let per_call = |port: u16| post(port, &query, None);
    open_arm(
        "one HTTP/1.1 connection per call",
        true,
        calls,
        [direct.pid(), relayed.pid(), front.pid()],
        [
            &mut || per_call(direct.port),
            &mut || per_call(relayed.port),
            &mut || per_call(front.port),
        ],
        1.3,
    );
    // The same, each on one connection kept alive.
    let (mut to_direct, mut to_relay, mut to_front) = (
        KeptAlive::connect(direct.port),
        KeptAlive::connect(relayed.port),
        KeptAlive::connect(front.port),
    );
    open_arm(
        "one kept-alive connection to each",
        false,
        calls,
        [direct.pid(), relayed.pid(), front.pid()],
        [
            &mut || to_direct.post(&query),
            &mut || to_relay.post(&query),
            &mut || to_front.post(&query),
        ],
        1.15,
    );
    drop((to_direct, to_relay, to_front));
    drop((front, relayed, direct));

    // The floors of the confirms and of the cycle.
    let floors_dir = tempfile::tempdir().unwrap();
    // Confirms and the straight floor run the same number of calls; the floor runs again after
    // the confirms, on a fresh file, and the figure is the mean of the two (a disk's fsync is the
    // noisiest part of it).
    let confirms = env_or("COUNTERSIGN_SERVE_BENCH_CONFIRMS", 600);
    let (straight_before, straight_cpu_before) =
        straight_to_upstream(&wal(tools_db(floors_dir.path())), confirms.max(320));
    let commits = runtime.block_on(commit_rate(&dsn, 4000));
    let mut row_read = runtime.block_on(decision_row_read(&dsn, 200));
    row_read.sort();
    println!("floors (this run, this machine, this database):");
    println!(
        "  PostgreSQL commit rate, 16 clients, single-row INSERTs    {commits:>9.0} inserts/s"
    );
    println!(
        "  execute straight to the built-in tools, 16 at once       {straight_before:>9.0} calls/s (before the confirms; {straight_cpu_before:.0} µs of CPU a call)"
    );
    println!(
        "  a decision row written → read by another connection      p50 {:>6.2} ms, p95 {:>6.2} ms",
        micros(quantile(&row_read, 0.5)) / 1e3,
        micros(quantile(&row_read, 0.95)) / 1e3
    );

    // 2. Confirms across two replicas.
    let agents = env_or("COUNTERSIGN_SERVE_BENCH_AGENTS", 100);
    // The figure is for 16; others tell a wait that holds the confirms (more at once
    // fill it) from the cores' work (more at once change nothing).
    let at_once = env_or("COUNTERSIGN_SERVE_BENCH_AT_ONCE", 16).max(1);
    let kept_alive = env_or("COUNTERSIGN_SERVE_BENCH_KEPT_ALIVE", 0) == 1;
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let trusted = certified.cert.der().clone();
    let desk = Desk::new(41);
    let roster = |args: &[&str]| {
        let out = Command::new(bin("countersign-serve"))
            .args(args)
            .env("CONTROL_DSN", &dsn)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    roster(&["approver", "add", "bench", &desk.public_text()]);
    let listeners = [free_port(), free_port()];
    let url = format!("https://localhost:{}", listeners[0]);
    let secret = "serve-bench-secret-0123456789abcdefghij";
    let replica = |listener: u16| {
        let listen = format!("127.0.0.1:{listener}");
        serve(
            &[
                "--behind-tls-proxy",
                "--agent-keys",
                "--wait",
                "60",
                "--db",
                db_arg,
                "--approver-listen",
                &listen,
                "--approver-url",
                &url,
                "--approver-cert",
                cert.to_str().unwrap(),
                "--approver-key",
                key.to_str().unwrap(),
            ],
            &[("CONFIRM_SECRET", secret), ("CONTROL_DSN", &dsn)],
        )
    };
    let (first, second) = (replica(listeners[0]), replica(listeners[1]));
    let agent_key = roster(&["agent", "add", "bench"]);
    let idle_kb = measure::rss_kb(first.pid()).unwrap_or(0);

    let cycle_started = Instant::now();
    let mut tokens = Vec::new();
    // From the decision accepted on the second replica to the agent's answer from the first.
    let mut answered_after = Vec::with_capacity(confirms);
    for i in 0..confirms {
        let sql = format!("INSERT INTO notes(body) VALUES ('c{i}')");
        let (port, bearer) = (first.port, agent_key.clone());
        let asking = {
            let sql = sql.clone();
            std::thread::spawn(move || {
                post(port, &call("execute", json!({"sql": sql})), Some(&bearer))
            })
        };
        let request = first_waiting(listeners[1], &trusted, &desk);
        let decision = desk.decide(&url, &request, Verdict::Approve, |_| {});
        let (status, body) = on_approver_listener(
            listeners[1],
            &trusted,
            Some(&desk),
            "POST",
            "/approver/v1/decisions",
            &[],
            &decision.to_string(),
        )
        .unwrap();
        if status != 200 {
            eprintln!("serve_bench: the decision was refused: {body}");
            std::process::exit(1);
        }
        let decided = Instant::now();
        let answer = asking.join().unwrap();
        answered_after.push(decided.elapsed());
        let content = answer["result"]["structuredContent"].clone();
        if content["approved"] != json!(true) {
            eprintln!("serve_bench: not approved: {answer}");
            std::process::exit(1);
        }
        tokens.push((sql, content));
    }
    let cycle = cycle_started.elapsed();
    let (ports, bearer) = ([first.port, second.port], Arc::new(agent_key.clone()));
    let cpu = |pid: u32| measure::cpu_time(pid).unwrap_or_default();
    let (replicas_before, database_before, bench_before) = (
        cpu(first.pid()) + cpu(second.pid()),
        postgres_cpu(),
        cpu(std::process::id()),
    );
    // A mark on stderr, for a profiler to start on (the confirms are the part worth profiling).
    eprintln!("serve_bench: confirming");
    let confirm_started = Instant::now();
    let workers: Vec<_> = tokens
        .chunks(tokens.len().div_ceil(at_once).max(1))
        .enumerate()
        .map(|(w, chunk)| {
            let (chunk, bearer) = (chunk.to_vec(), bearer.clone());
            std::thread::spawn(move || {
                let mut ran = 0;
                let mut kept = kept_alive
                    .then(|| ports.map(|port| KeptAlive::connect_as(port, Some(&bearer))));
                for (i, (sql, content)) in chunk.into_iter().enumerate() {
                    let arguments = json!({"sql": sql, "confirm": true,
                        "confirmTarget": content["confirmTarget"],
                        "confirmToken": content["confirmToken"]});
                    let (to, body) = ((w + i) % 2, call("execute", arguments));
                    let answer = match kept.as_mut() {
                        Some(kept) => kept[to].post(&body),
                        None => post(ports[to], &body, Some(&bearer)),
                    };
                    if answer["result"]["isError"] != json!(true) && !answer["result"].is_null() {
                        ran += 1;
                    }
                }
                ran
            })
        })
        .collect();
    let ran: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let confirm_time = confirm_started.elapsed();
    let replicas_cpu = cpu(first.pid()) + cpu(second.pid()) - replicas_before;
    let database_cpu = postgres_cpu().saturating_sub(database_before);
    let bench_cpu = cpu(std::process::id()).saturating_sub(bench_before);
    let rows: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("SELECT count(*) FROM notes", [], |r| r.get(0))
        .unwrap();
    println!("two replicas on one control database ({confirms} works-once calls):");
    println!(
        "  ask on one, approve through the other (signed), answered: {:>7.1} cycles/s",
        confirms as f64 / cycle.as_secs_f64()
    );
    answered_after.sort();
    let answered_p95 = quantile(&answered_after, 0.95);
    println!(
        "  decision accepted on the other replica to the agent's answer: p50 {:>6.1} ms, p95 {:>6.1} ms   (×{:.0} the row read's p95; target ≤ 100 ms p95)",
        micros(quantile(&answered_after, 0.5)) / 1e3,
        micros(answered_p95) / 1e3,
        answered_p95.as_secs_f64() / quantile(&row_read, 0.95).as_secs_f64()
    );
    let again_dir = tempfile::tempdir().unwrap();
    let (straight_after, straight_cpu_after) =
        straight_to_upstream(&wal(tools_db(again_dir.path())), confirms.max(320));
    let straight = (straight_before + straight_after) / 2.0;
    println!(
        "  execute straight again, after the confirms:                {straight_after:>7.0} calls/s (the floor: the mean, {straight:.0}/s; {straight_cpu_after:.0} µs of CPU a call)"
    );
    let rate = ran as f64 / confirm_time.as_secs_f64();
    let slower = commits.min(straight);
    let kept = if kept_alive { ", kept alive" } else { "" };
    println!(
        "  confirms, {at_once} at once, alternating replicas{kept}:               {rate:>7.1} confirms/s   ({:.0} % of the slower floor, {slower:.0}/s; target ≥ 50 % and ≥ 500/s)",
        100.0 * rate / slower
    );
    let per = |d: std::time::Duration| micros(d) / ran.max(1) as f64;
    println!(
        "  CPU per confirm (where the time went): replicas {:.0} µs, PostgreSQL {:.0} µs, this client {:.0} µs; wall {:.0} µs ({:.0} % of 2 cores busy)",
        per(replicas_cpu),
        per(database_cpu),
        per(bench_cpu),
        per(confirm_time),
        100.0 * (replicas_cpu + database_cpu + bench_cpu).as_secs_f64()
            / (2.0 * confirm_time.as_secs_f64())
    );
    let straight_cpu = (straight_cpu_before + straight_cpu_after) / 2.0;
    println!(
        "  a confirm's CPU in all is ×{:.1} a straight execute's ({straight_cpu:.0} µs): on a machine's cores shared by all, what bounds the confirms",
        per(replicas_cpu + database_cpu + bench_cpu) / straight_cpu.max(1.0)
    );
    if ran != confirms || rows != confirms as i64 {
        eprintln!(
            "serve_bench: {ran} confirms ran and {rows} rows exist, for {confirms} approvals"
        );
        std::process::exit(1);
    }

    // 3. Memory per agent: each its own key, so its own tenant.
    let before_kb = measure::rss_kb(first.pid()).unwrap_or(0);
    let keys: Vec<String> = (0..agents)
        .map(|i| roster(&["agent", "add", &format!("agent-{i}")]))
        .collect();
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let count = call("query", json!({"sql": "SELECT count(*) AS n FROM notes"}));
    for key in &keys {
        if post(first.port, &list, Some(key))["result"].is_null()
            || post(first.port, &count, Some(key))["result"].is_null()
        {
            eprintln!("serve_bench: an agent was not answered");
            std::process::exit(1);
        }
    }
    let loaded_kb = measure::rss_kb(first.pid()).unwrap_or(0);
    println!("memory of one replica (RSS):");
    println!(
        "  idle, just started                   {:>8} kB   (target ≤ 32768 kB)",
        idle_kb
    );
    println!("  after the confirms above             {:>8} kB", before_kb);
    println!(
        "  after {agents} more agents (list + one call each) {:>8} kB   ({:.1} kB per agent; target ≤ 16 kB)",
        loaded_kb,
        loaded_kb.saturating_sub(before_kb) as f64 / agents.max(1) as f64
    );
    drop((first, second));
}

/// The built-in tools' `execute` of a single-row `INSERT`, run straight (no MCP, no server) by
/// 16 threads at once on `db`, `calls` in all: calls per second, and the CPU this process spent
/// per call.
fn straight_to_upstream(db: &std::path::Path, calls: usize) -> (f64, f64) {
    let builtin = Arc::new(countersign_builtin::Builtin::new(db));
    let cpu_before = measure::cpu_time(std::process::id()).unwrap_or_default();
    let started = Instant::now();
    let threads: Vec<_> = (0..16)
        .map(|w| {
            let builtin = builtin.clone();
            std::thread::spawn(move || {
                for i in 0..calls / 16 {
                    let sql = format!("INSERT INTO notes(body) VALUES ('floor {w} {i}')");
                    let args = json!({ "sql": sql });
                    if let Err(why) = builtin.call("execute", args.as_object().unwrap()) {
                        eprintln!("serve_bench: execute straight failed: {why}");
                        std::process::exit(1);
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let (ran, took) = ((calls / 16 * 16) as f64, started.elapsed());
    let cpu = measure::cpu_time(std::process::id())
        .unwrap_or_default()
        .saturating_sub(cpu_before);
    (ran / took.as_secs_f64(), micros(cpu) / ran)
}

/// The database's commit rate: 16 connections each doing single-row `INSERT`s (prepared),
/// `inserts` in all: inserts per second.
async fn commit_rate(dsn: &str, inserts: usize) -> f64 {
    let admin = countersign_tests::postgres::admin(dsn).await;
    admin
        .batch_execute("CREATE TABLE IF NOT EXISTS bench_commit (n BIGINT NOT NULL)")
        .await
        .unwrap();
    let mut clients = Vec::new();
    for _ in 0..16 {
        let client = countersign_tests::postgres::admin(dsn).await;
        let insert = client
            .prepare("INSERT INTO bench_commit (n) VALUES ($1)")
            .await
            .unwrap();
        clients.push((client, insert));
    }
    let started = Instant::now();
    let each = inserts / 16;
    let workers: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(w, (client, insert))| {
            tokio::spawn(async move {
                for i in 0..each {
                    let n = (w * 1_000_000 + i) as i64;
                    client.execute(&insert, &[&n]).await.unwrap();
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    (each * 16) as f64 / started.elapsed().as_secs_f64()
}

/// How long after an `UPDATE` of a row returns another connection, reading it in a loop, sees
/// it: `samples` times. The floor of "a decision on one replica, read on another".
async fn decision_row_read(dsn: &str, samples: usize) -> Vec<std::time::Duration> {
    let writer = countersign_tests::postgres::admin(dsn).await;
    writer
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS bench_decision (id BIGINT PRIMARY KEY, verdict TEXT)",
        )
        .await
        .unwrap();
    let reader = Arc::new(countersign_tests::postgres::admin(dsn).await);
    let read = reader
        .prepare("SELECT verdict FROM bench_decision WHERE id = $1")
        .await
        .unwrap();
    let mut seen_after = Vec::with_capacity(samples);
    for i in 0..samples as i64 {
        writer
            .execute("INSERT INTO bench_decision (id) VALUES ($1)", &[&i])
            .await
            .unwrap();
        let looking = {
            let (reader, read) = (reader.clone(), read.clone());
            tokio::spawn(async move {
                loop {
                    let row = reader.query_one(&read, &[&i]).await.unwrap();
                    if row.get::<_, Option<String>>(0).is_some() {
                        return Instant::now();
                    }
                }
            })
        };
        let written = Instant::now();
        writer
            .execute(
                "UPDATE bench_decision SET verdict = 'approve' WHERE id = $1",
                &[&i],
            )
            .await
            .unwrap();
        let seen = looking.await.unwrap();
        seen_after.push(seen.saturating_duration_since(written));
    }
    seen_after
}

/// The CPU time of every PostgreSQL process on this machine (the bench's throwaway server is the
/// only one).
fn postgres_cpu() -> std::time::Duration {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return std::time::Duration::ZERO;
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == "postgres")
        })
        .filter_map(measure::cpu_time)
        .sum()
}

/// `db` in SQLite's write-ahead log mode (kept in the file): its readers do not wait for its
/// writer, as a database under load is usually run. The upstream's file of every measurement
/// here, and of its floor, alike.
fn wal(db: std::path::PathBuf) -> std::path::PathBuf {
    let mode: String = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    db
}

/// `calls` open calls each way, in turn (the order turning each round, so that no way always
/// follows the same other): straight to the upstream (the floor), through the bare relay,
/// through the front server (`processes`: the three's process ids, in that order). Prints the
/// median and p99 of each; the relay's median and the front's median and p99 as ratios of the
/// direct's; the front's median over the relay's (what the server adds beyond the hop, when both
/// hold their upstream connection); `goal`; and each process's CPU time per call.
fn open_arm(
    how: &str,
    per_connection: bool,
    calls: usize,
    processes: [u32; 3],
    ways: [&mut dyn FnMut() -> serde_json::Value; 3],
    goal: f64,
) {
    let cpu = |pid: u32| measure::cpu_time(pid).unwrap_or_default();
    let cpu_before = processes.map(cpu);
    let mut times: [Vec<std::time::Duration>; 3] = Default::default();
    for i in 0..calls * 3 {
        let way = (i + i / 3) % 3;
        let started = Instant::now();
        let answer = ways[way]();
        let took = started.elapsed();
        if answer["result"].is_null() {
            eprintln!("serve_bench: no result ({how}): {answer}");
            std::process::exit(1);
        }
        times[way].push(took);
    }
    let [direct, relay, front] = times.map(|mut t| {
        t.sort();
        (quantile(&t, 0.5), quantile(&t, 0.99))
    });
    let ratio = |a: std::time::Duration, b: std::time::Duration| a.as_secs_f64() / b.as_secs_f64();
    let relay_note = if per_connection {
        "; it connects to the upstream for each call, serve keeps its connection"
    } else {
        ""
    };
    println!("open calls ({calls} per way, in turn, {how}):");
    println!(
        "  upstream directly    p50 {:>8.0} µs   p99 {:>8.0} µs   (the floor)",
        micros(direct.0),
        micros(direct.1)
    );
    println!(
        "  through a bare relay p50 {:>8.0} µs   p99 {:>8.0} µs   (×{:.2} p50: bytes copied, nothing parsed{relay_note})",
        micros(relay.0),
        micros(relay.1),
        ratio(relay.0, direct.0)
    );
    println!(
        "  through serve        p50 {:>8.0} µs   p99 {:>8.0} µs   (×{:.2} p50, ×{:.2} p99; target ≤ ×{goal} p50; ×{:.2} the relay's p50)",
        micros(front.0),
        micros(front.1),
        ratio(front.0, direct.0),
        ratio(front.1, direct.1),
        ratio(front.0, relay.0)
    );
    // The upstream answers every call of the three ways; the relay and serve their own.
    let [upstream, relay, front] = [0, 1, 2].map(|k| {
        let spent = cpu(processes[k]).saturating_sub(cpu_before[k]);
        micros(spent) / (calls * if k == 0 { 3 } else { 1 }) as f64
    });
    println!(
        "  CPU per call: the upstream {upstream:.0} µs, the relay {relay:.0} µs, serve in front {front:.0} µs"
    );
}

/// The bare relay as a process of its own (this program in [`RELAY`] mode), killed when dropped,
/// and by the kernel when this program ends without dropping it (an `exit` on a wrong answer).
struct Relay {
    process: countersign_tests::group::Group,
    port: u16,
}

impl Relay {
    /// Its process id.
    fn pid(&self) -> u32 {
        self.process.id()
    }

    /// A relay in front of `127.0.0.1:upstream`, once it listens.
    fn start(upstream: u16) -> Relay {
        let mut process = countersign_tests::group::Group::spawn(
            Command::new(std::env::current_exe().unwrap())
                .args([RELAY, &upstream.to_string()])
                .stdout(Stdio::piped()),
        )
        .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(process.leader().stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().expect("the relay did not say its port");
        Relay { process, port }
    }
}

/// Relay mode: one thread, bytes copied both ways on each connection (the round-robin proxy of
/// the tests, with one backend), until killed.
fn relay(upstream: u16) -> ! {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let proxy = countersign_tests::proxy::RoundRobin::start(vec![upstream]).await;
        println!("{}", proxy.port());
        std::future::pending::<()>().await;
    });
    unreachable!("the relay runs until it is killed")
}
