//! The desk under a flood, measured and printed (not asserted: the machines are shared and
//! noisy). One account opens 1,500 connections that never finish introducing themselves or
//! never finish a frame (500 silent, 500 with half a hello, 500 with a hello and then half a
//! message), one agent sends 2,000 preflights that nobody answers, and another sends 2,000 more
//! and never reads a byte of its answers. Meanwhile a fresh agent's first answer (its gateway
//! spawned, `initialize`, `tools/list`, one open call; goal: within 1 s) is timed before, as the
//! preflights arrive, 2 s on and after; a normal agent's open calls are timed (goal: each within
//! 1 s), the window's responsiveness is timed through WebDriver, and the desk's memory (PSS over
//! its processes) is printed before, during and after. `make bench` runs it under Xvfb with the
//! keychain.

use std::time::{Duration, Instant};

use countersign_tests::measure::desk_pss_mb;
use countersign_tests::window::Desk;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

fn percentiles(mut samples: Vec<Duration>) -> String {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    format!(
        "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (n = {})",
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        samples.last().unwrap().as_secs_f64() * 1e3,
        samples.len()
    )
}

/// Times `n` open calls of a normal agent, one after another.
async fn open_calls(agent: &rmcp::Peer<rmcp::RoleClient>, n: usize) -> Vec<Duration> {
    let mut samples = Vec::new();
    for _ in 0..n {
        let args = json!({"sql": "SELECT 1 AS one"})
            .as_object()
            .cloned()
            .unwrap();
        let started = Instant::now();
        agent
            .call_tool(CallToolRequestParams::new("query").with_arguments(args))
            .await
            .expect("an open call answered");
        samples.push(started.elapsed());
    }
    samples
}

/// Times a fresh agent: its gateway spawned, `initialize`, `tools/list` and one open call
/// answered (goal: within 1 s, during a flood and after it).
async fn fresh_agent(desk: &Desk, name: &str) -> Duration {
    let started = Instant::now();
    let agent = desk.agent(name).await;
    let initialized = started.elapsed();
    let listed = agent
        .peer()
        .list_all_tools()
        .await
        .expect("a fresh agent's listing");
    assert!(!listed.is_empty(), "the fresh agent was listed no tools");
    let listed = started.elapsed();
    let _ = open_calls(agent.peer(), 1).await;
    let took = started.elapsed();
    eprintln!("{name}: initialized {initialized:?}, listed {listed:?}, called {took:?}");
    drop(agent);
    took
}

/// Times `n` WebDriver round trips that read the queue from the page.
async fn window_round_trips(desk: &Desk, n: usize) -> Vec<Duration> {
    let mut samples = Vec::new();
    for _ in 0..n {
        let started = Instant::now();
        let _: Value = desk
            .browser()
            .execute(
                "return document.getElementById('queue').children.length",
                vec![],
            )
            .await
            .unwrap();
        samples.push(started.elapsed());
    }
    samples
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    countersign_tests::measure::raise_descriptor_limit();
    let desk = Desk::start().await;
    let group = desk.process_group().expect("the driver's process group");
    let normal = desk.agent("normal-agent").await;
    let flood = desk.agent("flooding-agent").await;
    let _ = open_calls(normal.peer(), 5).await;
    println!("flood bench");
    println!(
        "before: a fresh agent's first answer in {:.0} ms",
        fresh_agent(&desk, "fresh-agent-before").await.as_secs_f64() * 1e3
    );
    println!(
        "before: open call {}; window round trip {}; desk memory {:.1} MB",
        percentiles(open_calls(normal.peer(), 50).await),
        percentiles(window_round_trips(&desk, 20).await),
        desk_pss_mb(group)
    );

    // 1,500 connections that never get anywhere.
    let mut held = Vec::new();
    let mut refused = 0;
    let hello = countersign_wire::encode(&countersign_wire::Frame::Hello(
        countersign_wire::Hello::Gateway {
            version: countersign_wire::PROTOCOL_VERSION,
            reach: countersign_wire::Reach::Builtin {
                db: desk.dir.path().join("app.sqlite").display().to_string(),
            },
            label: None,
            wait_ms: None,
            pid: std::process::id(),
            stdio: false,
        },
    ))
    .unwrap();
    let opened = Instant::now();
    for i in 0..1500 {
        let Ok(mut stream) = tokio::net::UnixStream::connect(desk.socket()).await else {
            refused += 1;
            continue;
        };
        let sent = match i % 3 {
            0 => Ok(()),
            // Half a hello: announced, never finished.
            1 => stream.write_all(&hello[..hello.len() / 2]).await,
            // A hello, then half of a 16 MiB message.
            _ => {
                let mut bytes = hello.clone();
                bytes.extend_from_slice(&(16u32 << 20).to_be_bytes());
                bytes.extend_from_slice(b"M{\"jsonrpc\":\"2.0\"");
                stream.write_all(&bytes).await
            }
        };
        if sent.is_err() {
            refused += 1;
        }
        held.push(stream);
    }
    println!(
        "opened {} stalled connections in {:.1} s ({refused} could not connect or write)",
        held.len(),
        opened.elapsed().as_secs_f64()
    );

    // 2,000 preflights nobody answers, all at once.
    let mut calls = Vec::new();
    for n in 0..2000 {
        let peer = flood.peer().clone();
        calls.push(tokio::spawn(async move {
            let sql = format!("DELETE FROM t WHERE id = {n}");
            let args = json!({ "sql": sql }).as_object().cloned().unwrap();
            let r = peer
                .call_tool(CallToolRequestParams::new("execute").with_arguments(args))
                .await;
            r.ok()
                .and_then(|r| r.structured_content)
                .and_then(|s| s.get("error").or(s.get("refusal")).cloned())
                .and_then(|c| c.as_str().map(str::to_owned))
                .unwrap_or_else(|| "none".into())
        }));
    }
    // And an agent that sends 2,000 preflights and never reads a byte of what it is answered: a
    // gateway whose stdout nobody reads.
    let mut deaf = tokio::process::Command::new(countersign_tests::window::bin("countersign"))
        .args(["mcp", "--no-launch", "--socket"])
        .arg(desk.socket())
        .arg("--db")
        .arg(desk.dir.path().join("app.sqlite"))
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("a gateway for the agent that never reads");
    let mut deaf_in = deaf.stdin.take().expect("its stdin");
    let _deaf_out = deaf.stdout.take().expect("its stdout, never read");
    let deaf_writer = tokio::spawn(async move {
        let mut lines = String::from(concat!(
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"deaf-agent","version":"1"}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            "\n"
        ));
        for n in 1..=2000 {
            lines.push_str(&format!(
                r#"{{"jsonrpc":"2.0","id":{n},"method":"tools/call","params":{{"name":"execute","arguments":{{"sql":"DELETE FROM t WHERE id = {n}"}}}}}}"#
            ));
            lines.push('\n');
        }
        // Blocks once the desk stops reading (its answers fill the pipe nobody reads).
        let _ = deaf_in.write_all(lines.as_bytes()).await;
        deaf_in
    });

    // A fresh agent while the preflights arrive, and another once they have all been taken in.
    tokio::time::sleep(Duration::from_millis(100)).await;
    println!(
        "during: a fresh agent's first answer (spawn, initialize, tools/list, one open call) in {:.0} ms; goal ≤ 1000 ms",
        fresh_agent(&desk, "fresh-agent-during").await.as_secs_f64() * 1e3
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "during, 2 s on: a fresh agent's first answer in {:.0} ms; goal ≤ 1000 ms",
        fresh_agent(&desk, "fresh-agent-during-later")
            .await
            .as_secs_f64()
            * 1e3
    );
    println!(
        "during: open call {}; window round trip {}; desk memory {:.1} MB",
        percentiles(open_calls(normal.peer(), 50).await),
        percentiles(window_round_trips(&desk, 20).await),
        desk_pss_mb(group)
    );
    let queued: Value = desk
        .browser()
        .execute(
            "return document.getElementById('queue').children.length",
            vec![],
        )
        .await
        .unwrap();
    println!("requests in the window's queue: {queued}");

    // Every stalled connection meets its deadline (hello 10 s, frame 30 s).
    tokio::time::sleep(Duration::from_secs(32)).await;
    let mut closed = 0;
    let mut by_kind = [0; 3];
    for (i, stream) in held.iter().enumerate() {
        let before = closed;
        // Those that said hello got a welcome first: read past it to the end, if it came.
        let mut buf = [0u8; 4096];
        loop {
            match stream.try_read(&mut buf) {
                Ok(0) => {
                    closed += 1;
                    break;
                }
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    closed += 1;
                    break;
                }
            }
        }
        by_kind[i % 3] += closed - before;
    }
    println!("closed by kind (silent, half a hello, half a message): {by_kind:?}");
    println!(
        "after the deadlines: {closed} of {} stalled connections closed by the desk",
        held.len()
    );
    drop(held);
    let mut codes = std::collections::BTreeMap::<String, usize>::new();
    for call in calls {
        *codes.entry(call.await.unwrap()).or_default() += 1;
    }
    println!("the 2,000 preflights ended as: {codes:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "after: a fresh agent's first answer in {:.0} ms; goal ≤ 1000 ms",
        fresh_agent(&desk, "fresh-agent-after").await.as_secs_f64() * 1e3
    );
    println!(
        "after: open call {}; window round trip {}; desk memory {:.1} MB",
        percentiles(open_calls(normal.peer(), 50).await),
        percentiles(window_round_trips(&desk, 20).await),
        desk_pss_mb(group)
    );
    drop(normal);
    drop(flood);
    deaf_writer.abort();
    drop(deaf);
    desk.stop().await;
}
