//! The desk where there is no display (a server, a container, an SSH session): it runs without a
//! window, open tools work through it, and every gated call is refused `desk_unavailable` with the
//! next move, because nobody could approve it. A gateway with no display starts the desk that way.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use countersign_tests::window::bin;
use rmcp::model::*;
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

/// The environment of a desk or gateway with no display, in its own directories.
fn headless(cmd: &mut tokio::process::Command, dir: &Path) {
    cmd.env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .env("XDG_DATA_HOME", dir.join("data"))
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .env("COUNTERSIGN_SOCKET", dir.join("desk.sock"))
        .env("RUST_LOG", "warn");
}

async fn agent(dir: &Path, launch: bool) -> RunningService<RoleClient, ClientConfig> {
    let mut cmd = tokio::process::Command::new(bin("countersign"));
    cmd.arg("mcp").arg("--db").arg(dir.join("app.sqlite"));
    if !launch {
        cmd.arg("--no-launch");
    }
    headless(&mut cmd, dir);
    let info = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("headless-agent", "1.0"),
    );
    info.serve(TokioChildProcess::new(cmd).unwrap())
        .await
        .unwrap()
}

async fn call(
    agent: &RunningService<RoleClient, ClientConfig>,
    tool: &str,
    args: Value,
) -> CallToolResult {
    agent
        .call_tool(
            CallToolRequestParams::new(tool.to_owned())
                .with_arguments(args.as_object().unwrap().clone()),
        )
        .await
        .unwrap()
}

/// Open calls work and a gated call is refused `desk_unavailable`, saying what to do.
async fn open_works_and_gated_is_refused(agent: &RunningService<RoleClient, ClientConfig>) {
    assert_eq!(agent.list_all_tools().await.unwrap().len(), 7);
    let r = call(agent, "query", json!({"sql": "SELECT 6 * 7 AS answer"})).await;
    assert_eq!(
        r.structured_content.unwrap()["rows"],
        json!([{"answer": 42}])
    );
    let r = call(agent, "execute", json!({"sql": "CREATE TABLE t (x)"})).await;
    assert_eq!(r.is_error, Some(true), "{r:?}");
    let s = r.structured_content.clone().unwrap();
    assert_eq!(s["refusal"], json!("desk_unavailable"), "{r:?}");
    assert!(
        s["message"].as_str().unwrap().contains("desktop session"),
        "{r:?}"
    );
    // Nothing ran: the table does not exist.
    let r = call(agent, "list_tables", json!({})).await;
    assert!(
        !format!("{:?}", r.structured_content).contains("\"t\""),
        "{r:?}"
    );
}

/// The pid of the desk answering on `socket`.
async fn desk_pid(socket: &PathBuf) -> i32 {
    let stream = tokio::net::UnixStream::connect(socket).await.unwrap();
    stream.peer_cred().unwrap().pid().unwrap()
}

async fn wait_for_socket(socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::UnixStream::connect(socket).await.is_err() {
        assert!(Instant::now() < deadline, "the desk did not listen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn terminate_and_wait(pid: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
    {
        assert!(
            Instant::now() < deadline,
            "the desk did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_desk_without_a_display_serves_open_tools_and_refuses_gated_calls() {
    let dir = tempfile::tempdir().unwrap();
    let mut desk = tokio::process::Command::new(bin("countersign-desk"));
    desk.arg("--in-memory-secret")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    headless(&mut desk, dir.path());
    let desk = desk.spawn().unwrap();
    wait_for_socket(&dir.path().join("desk.sock")).await;
    let agent = agent(dir.path(), false).await;
    open_works_and_gated_is_refused(&agent).await;
    agent.cancel().await.unwrap();
    terminate_and_wait(desk.id().unwrap() as i32);
    let out = desk.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no display"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_without_a_display_starts_the_desk_without_a_window() {
    let dir = tempfile::tempdir().unwrap();
    let agent = agent(dir.path(), true).await;
    open_works_and_gated_is_refused(&agent).await;
    agent.cancel().await.unwrap();
    terminate_and_wait(desk_pid(&dir.path().join("desk.sock")).await);
}
