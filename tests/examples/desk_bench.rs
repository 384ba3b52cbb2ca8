//! Figures for the desk, printed, not asserted (the machines are shared and noisy): how long a
//! preflight takes to appear in the window (from the agent's call to the request in the page,
//! p50 and p95 over 30 requests; goal p95 ≤ 250 ms), and the desk's idle memory summed over its
//! processes (PSS of the desk and its web processes; goal ≤ 120 MB). Needs a display and the
//! keychain: `make bench` runs it under Xvfb in a throwaway D-Bus session. Latency is measured on
//! the debug desk (a release desk refuses WebDriver); memory on both, the release desk started
//! directly when `.ci/release` has built it.

use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use countersign_tests::measure::{desk_processes, pss_kb};
use countersign_tests::window::Desk;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

/// Prints each process's PSS and returns the sum, in MB.
fn print_memory(group: u32) -> f64 {
    let mut total = 0;
    for (pid, name) in desk_processes(group) {
        let kb = pss_kb(pid).unwrap_or(0);
        total += kb;
        println!(
            "  {name:<22} pid {pid:<7} PSS {:>8.1} MB",
            kb as f64 / 1024.0
        );
    }
    total as f64 / 1024.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let desk = Desk::start().await;
    let agent = desk.agent("bench-agent").await;
    let mut samples = Vec::new();
    for i in 0..30 {
        let peer = agent.peer().clone();
        let args = json!({"name": format!("bench-{i}")})
            .as_object()
            .cloned()
            .unwrap();
        let started = Instant::now();
        let call = tokio::spawn(async move {
            peer.call_tool(CallToolRequestParams::new("create_backup").with_arguments(args))
                .await
        });
        loop {
            let shown: Value = desk
                .browser
                .execute("const d = document.getElementById('detail'); return !d.hidden && document.getElementById('d-target').textContent", vec![])
                .await
                .unwrap();
            if shown.as_str() == Some(&format!("bench-{i}")) {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the request never appeared"
            );
        }
        samples.push(started.elapsed());
        desk.click("#deny").await;
        let _ = call.await;
    }
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    println!("desk bench");
    println!(
        "preflight call → request visible in the window: p50 {:.1} ms, p95 {:.1} ms (n = {}; goal p95 ≤ 250 ms; includes one WebDriver round trip of polling)",
        at(0.5).as_secs_f64() * 1e3,
        at(0.95).as_secs_f64() * 1e3,
        samples.len()
    );
    drop(agent);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let group = desk.process_group().expect("the driver's process group");
    let total = print_memory(group);
    println!("debug desk idle memory (PSS over its processes): {total:.1} MB");
    desk.stop().await;
    release_memory().await;
}

/// The release desk, started directly (no WebDriver) in its own directories, after 5 s idle.
async fn release_memory() {
    let desk = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/release/countersign-desk");
    if !desk.exists() {
        println!(
            "release desk idle memory: not measured ({} is missing: run .ci/release)",
            desk.display()
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(&desk)
        .env("COUNTERSIGN_DESK_DIR", dir.path())
        .env("COUNTERSIGN_SOCKET", dir.path().join("desk.sock"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let total = print_memory(child.id());
    println!("release desk idle memory (PSS over its processes): {total:.1} MB (goal ≤ 120 MB)");
    // SAFETY: ends only the group this function started.
    unsafe {
        libc::killpg(child.id() as i32, libc::SIGKILL);
    }
    let _ = child.wait();
}
