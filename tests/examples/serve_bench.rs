//! `countersign serve`, measured and printed (figures are not asserted: the machines are shared
//! and noisy; a wrong answer makes the run exit 1). Needs PostgreSQL: `make bench` runs it under
//! `.ci/with-postgres`.
//!
//! 1. **Open calls.** A read-only `countersign serve` on the built-in tools is the upstream,
//!    reached directly over HTTP; a second `serve` stands in front of it (`--url`). The same
//!    `query` call, one HTTP/1.1 request per call, alternately direct and through the second
//!    server: median and p99 of each, and their ratio, in one run.
//! 2. **Confirms across two replicas.** Two writable replicas on one control database, with
//!    approver listeners. N works-once calls are asked on the first and approved through the
//!    second by a desk (a real signed decision each: the whole cycle per second is printed);
//!    then the N confirms go at once, alternately to each replica: confirms per second, and
//!    every one must run exactly once.
//! 3. **Memory.** The first replica's RSS idle, and after A agents (each with its own agent key,
//!    so its own tenant) listed the tools and made one call: per agent.
//!
//! Environment: `COUNTERSIGN_SERVE_BENCH_CALLS` (2000 per arm), `COUNTERSIGN_SERVE_BENCH_CONFIRMS`
//! (200), `COUNTERSIGN_SERVE_BENCH_AGENTS` (100).

use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use countersign_core::approver::Verdict;
use countersign_tests::approver::{Desk, first_waiting, on_approver_listener};
use countersign_tests::measure;
use countersign_tests::team_server::{call, micros, post, quantile, serve, tools_db};
use countersign_tests::window::{bin, free_port};
use serde_json::json;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dsn = runtime.block_on(countersign_tests::postgres::shared_database());
    let dir = tempfile::tempdir().unwrap();
    let db = tools_db(dir.path());
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
    let (mut direct_times, mut front_times) = (Vec::new(), Vec::new());
    for i in 0..calls * 2 {
        let (port, times) = if i % 2 == 0 {
            (direct.port, &mut direct_times)
        } else {
            (front.port, &mut front_times)
        };
        let started = Instant::now();
        let answer = post(port, &query, None);
        times.push(started.elapsed());
        if answer["result"].is_null() {
            eprintln!("serve_bench: no result: {answer}");
            std::process::exit(1);
        }
    }
    direct_times.sort();
    front_times.sort();
    let (d50, d99) = (quantile(&direct_times, 0.5), quantile(&direct_times, 0.99));
    let (f50, f99) = (quantile(&front_times, 0.5), quantile(&front_times, 0.99));
    println!("open calls ({calls} per arm, interleaved, one HTTP/1.1 connection per call):");
    println!(
        "  upstream directly    p50 {:>8.0} µs   p99 {:>8.0} µs",
        micros(d50),
        micros(d99)
    );
    println!(
        "  through serve        p50 {:>8.0} µs   p99 {:>8.0} µs   (×{:.2} p50, ×{:.2} p99)",
        micros(f50),
        micros(f99),
        f50.as_secs_f64() / d50.as_secs_f64(),
        f99.as_secs_f64() / d99.as_secs_f64()
    );
    drop((front, direct));

    // 2. Confirms across two replicas.
    let confirms = env_or("COUNTERSIGN_SERVE_BENCH_CONFIRMS", 200);
    let agents = env_or("COUNTERSIGN_SERVE_BENCH_AGENTS", 100);
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
    let idle_kb = measure::rss_kb(first.child.id()).unwrap_or(0);

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
    let confirm_started = Instant::now();
    let workers: Vec<_> = tokens
        .chunks(tokens.len().div_ceil(16).max(1))
        .enumerate()
        .map(|(w, chunk)| {
            let (chunk, bearer) = (chunk.to_vec(), bearer.clone());
            std::thread::spawn(move || {
                let mut ran = 0;
                for (i, (sql, content)) in chunk.into_iter().enumerate() {
                    let arguments = json!({"sql": sql, "confirm": true,
                        "confirmTarget": content["confirmTarget"],
                        "confirmToken": content["confirmToken"]});
                    let answer = post(
                        ports[(w + i) % 2],
                        &call("execute", arguments),
                        Some(&bearer),
                    );
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
    println!(
        "  decision accepted on the other replica to the agent's answer: p50 {:>6.1} ms, p95 {:>6.1} ms",
        micros(quantile(&answered_after, 0.5)) / 1e3,
        micros(quantile(&answered_after, 0.95)) / 1e3
    );
    println!(
        "  confirms, 16 at once, alternating replicas:               {:>7.1} confirms/s",
        ran as f64 / confirm_time.as_secs_f64()
    );
    if ran != confirms || rows != confirms as i64 {
        eprintln!(
            "serve_bench: {ran} confirms ran and {rows} rows exist, for {confirms} approvals"
        );
        std::process::exit(1);
    }

    // 3. Memory per agent: each its own key, so its own tenant.
    let before_kb = measure::rss_kb(first.child.id()).unwrap_or(0);
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
    let loaded_kb = measure::rss_kb(first.child.id()).unwrap_or(0);
    println!("memory of one replica (RSS):");
    println!("  idle, just started                   {:>8} kB", idle_kb);
    println!("  after the confirms above             {:>8} kB", before_kb);
    println!(
        "  after {agents} more agents (list + one call each) {:>8} kB   ({:.1} kB per agent)",
        loaded_kb,
        loaded_kb.saturating_sub(before_kb) as f64 / agents.max(1) as f64
    );
    drop((first, second));
}
