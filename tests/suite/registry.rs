//! Servers registered in the desk, end to end: the real `countersign server` command, the real
//! desk and window (WebDriver), the real keychain, and a real upstream that says what its
//! environment holds. A new name takes effect at once; a change proposed from the command line,
//! or made to `servers.json` behind the desk's back, does nothing until the person clicks; the
//! secret values reach the upstream and no file.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use countersign_tests::files::assert_in_no_file;
use countersign_tests::window::{Desk, bin};
use rmcp::model::*;
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

fn env_server() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("peers/env_server.py")
        .display()
        .to_string()
}

/// `countersign server ARGS...` against `desk`, with `stdin` as its input (the secret values).
fn server_command(desk: &Desk, args: &[&str], stdin: &str) -> tokio::process::Child {
    let mut child = tokio::process::Command::new(bin("countersign"))
        .arg("server")
        .args(args)
        .env("COUNTERSIGN_SOCKET", desk.socket())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let stdin = stdin.to_owned();
    tokio::spawn(async move {
        let _ = input.write_all(stdin.as_bytes()).await;
    });
    child
}

async fn finished(child: tokio::process::Child) -> (i32, String, String) {
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the command to finish")
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// An agent reaching the registered server `name` through `countersign mcp --server NAME`, with
/// nothing of the server's in its environment.
async fn agent(desk: &Desk, name: &str) -> RunningService<RoleClient, ClientConfig> {
    let mut cmd = tokio::process::Command::new(bin("countersign"));
    cmd.args(["mcp", "--no-launch", "--server", name, "--socket"])
        .arg(desk.socket())
        .env("RUST_LOG", "warn");
    let info = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("registry-test".to_owned(), "1.0"),
    );
    tokio::time::timeout(
        Duration::from_secs(30),
        info.serve(TokioChildProcess::new(cmd).unwrap()),
    )
    .await
    .expect("the gateway's handshake within 30 s")
    .unwrap()
}

/// What the upstream says variable `var` holds.
async fn upstream_env(desk: &Desk, server: &str, var: &str) -> Value {
    let agent = agent(desk, server).await;
    let params = CallToolRequestParams::new("env")
        .with_arguments(json!({"name": var}).as_object().unwrap().clone());
    let result = agent.peer().call_tool(params).await.unwrap();
    let _ = agent.cancel().await;
    result.structured_content.unwrap()["value"].clone()
}

async fn listed(desk: &Desk) -> Value {
    let (code, out, err) = finished(server_command(desk, &["list", "--json"], "")).await;
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_from_the_command_line_does_nothing_until_the_person_clicks() {
    let desk = Desk::start().await;
    let script = env_server();
    // A new name: at once, with its secret read from stdin.
    let (code, out, err) = finished(server_command(
        &desk,
        &[
            "add",
            "envy",
            "--env",
            "MODE=one",
            "--secret-env",
            "API_TOKEN",
            "--",
            "python3",
            &script,
        ],
        "tok-first-3f9a\n",
    ))
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("registered the server envy"), "{out}");
    assert_eq!(
        upstream_env(&desk, "envy", "API_TOKEN").await,
        json!("tok-first-3f9a")
    );
    assert_eq!(upstream_env(&desk, "envy", "MODE").await, json!("one"));
    assert_eq!(
        listed(&desk).await["envy"]["env"]["API_TOKEN"],
        json!({"secret": true})
    );

    // A change of it: shown in the window, and nothing changes until the click.
    let change = server_command(
        &desk,
        &[
            "add",
            "envy",
            "--env",
            "MODE=two",
            "--secret-env",
            "API_TOKEN",
            "--",
            "python3",
            &script,
        ],
        "tok-second-77c1\n",
    );
    desk.wait_for_request().await;
    let page = desk.page_text().await;
    assert!(page.contains("MODE = two"), "{page}");
    assert!(page.contains("A NEW VALUE"), "{page}");
    assert!(
        !page.contains("tok-second-77c1") && !page.contains("tok-first-3f9a"),
        "{page}"
    );
    assert_eq!(listed(&desk).await["envy"]["env"]["MODE"], json!("one"));
    assert_eq!(upstream_env(&desk, "envy", "MODE").await, json!("one"));
    assert_eq!(
        upstream_env(&desk, "envy", "API_TOKEN").await,
        json!("tok-first-3f9a")
    );
    desk.until("Approve to be enabled", |d| Box::pin(d.approve_enabled()))
        .await;
    desk.click("#approve").await;
    let (code, out, err) = finished(change).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("is shown in the Countersign desk's window"),
        "{out}"
    );
    assert!(out.contains("the person approved"), "{out}");
    assert_eq!(upstream_env(&desk, "envy", "MODE").await, json!("two"));
    assert_eq!(
        upstream_env(&desk, "envy", "API_TOKEN").await,
        json!("tok-second-77c1")
    );

    // A removal the person denies: still there.
    let removal = server_command(&desk, &["remove", "envy"], "");
    desk.wait_for_request().await;
    desk.click("#deny").await;
    let (code, _, err) = finished(removal).await;
    assert_eq!(code, 1);
    assert!(err.contains("denied"), "{err}");
    assert_eq!(upstream_env(&desk, "envy", "MODE").await, json!("two"));

    // The agent side never holds a value, and no file of the desk does either.
    assert_in_no_file(&[desk.dir.path()], "tok-first-3f9a");
    assert_in_no_file(&[desk.dir.path()], "tok-second-77c1");
    desk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_json_edited_behind_the_desks_back_waits_for_the_person() {
    let desk = Desk::start().await;
    let script = env_server();
    let (code, _, err) = finished(server_command(
        &desk,
        &[
            "add",
            "envy",
            "--secret-env",
            "API_TOKEN",
            "--",
            "python3",
            &script,
        ],
        "tok-file-5b2e\n",
    ))
    .await;
    assert_eq!(code, 0, "{err}");
    // An agent with a shell points the server at its own program, keeping the secret's name.
    let file = desk.dir.path().join("config/servers.json");
    let accepted = std::fs::read_to_string(&file).unwrap();
    let edited = accepted.replace("\"python3\"", "\"/bin/echo\"");
    assert_ne!(edited, accepted);
    std::fs::write(&file, &edited).unwrap();
    desk.wait_for_request().await;
    let page = desk.page_text().await;
    assert!(page.contains("servers.json"), "{page}");
    assert!(page.contains("/bin/echo"), "{page}");
    // Until the person decides, the server is what was accepted.
    assert_eq!(
        upstream_env(&desk, "envy", "API_TOKEN").await,
        json!("tok-file-5b2e")
    );
    desk.click("#deny").await;
    desk.until("servers.json to be written back", |_| {
        let file = file.clone();
        let accepted = accepted.clone();
        Box::pin(async move { std::fs::read_to_string(&file).unwrap() == accepted })
    })
    .await;
    assert_eq!(
        upstream_env(&desk, "envy", "API_TOKEN").await,
        json!("tok-file-5b2e")
    );
    desk.stop().await;
}

/// Calls `tool` of `agent` with `arguments`; the structured result, or the error's text.
async fn call(
    agent: &RunningService<RoleClient, ClientConfig>,
    tool: &str,
    arguments: Value,
) -> Result<Value, String> {
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(arguments.as_object().unwrap().clone());
    // Every call is answered (its upstream's exit included): one that is not fails here, named,
    // instead of holding the test until the harness ends it.
    let answered = tokio::time::timeout(Duration::from_secs(30), agent.peer().call_tool(params))
        .await
        .unwrap_or_else(|_| panic!("the call of `{tool}` was not answered within 30 s"));
    match answered {
        Ok(r) if r.is_error != Some(true) => Ok(r.structured_content.unwrap_or(Value::Null)),
        Ok(r) => Err(format!("{:?}", r.content)),
        Err(e) => Err(e.to_string()),
    }
}

/// Ends the upstream's process, then calls `env` for `var`: again while the call reached the
/// exiting process or was about to be sent to it (answered "exited while running" or "exited
/// just before"), so that what answers is a new start.
async fn exit_then_env(
    agent: &RunningService<RoleClient, ClientConfig>,
    var: &str,
) -> Result<Value, String> {
    let _ = call(agent, "exit", json!({})).await;
    for _ in 0..50 {
        match call(agent, "env", json!({"name": var})).await {
            // The old process's exit, seen while a call was running or just before one was sent.
            Err(e) if e.contains("exited (it crashed or was killed)") => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
    panic!("the upstream was not started again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_started_again_runs_what_the_person_approved_and_never_a_removed_server() {
    let desk = Desk::start().await;
    let script = env_server();
    let add = |mode: &str| {
        server_command(
            &desk,
            &[
                "add",
                "envy",
                "--env",
                &format!("MODE={mode}"),
                "--",
                "python3",
                &script,
            ],
            "",
        )
    };
    let (code, _, err) = finished(add("one")).await;
    assert_eq!(code, 0, "{err}");
    let agent = agent(&desk, "envy").await;
    assert_eq!(
        call(&agent, "env", json!({"name": "MODE"})).await.unwrap()["value"],
        json!("one")
    );

    // Approved while the session runs: its process keeps what it was started with...
    let change = add("two");
    desk.wait_for_request().await;
    desk.until("Approve to be enabled", |d| Box::pin(d.approve_enabled()))
        .await;
    desk.click("#approve").await;
    assert_eq!(finished(change).await.0, 0);
    assert_eq!(
        call(&agent, "env", json!({"name": "MODE"})).await.unwrap()["value"],
        json!("one")
    );
    // ...and once it exits, the desk starts what is on record now.
    assert_eq!(
        exit_then_env(&agent, "MODE").await.unwrap()["value"],
        json!("two")
    );

    // Removed: not started again.
    let removal = server_command(&desk, &["remove", "envy"], "");
    desk.wait_for_request().await;
    desk.until("Approve to be enabled", |d| Box::pin(d.approve_enabled()))
        .await;
    desk.click("#approve").await;
    assert_eq!(finished(removal).await.0, 0);
    let after = exit_then_env(&agent, "MODE").await;
    assert!(
        after.as_ref().is_err_and(|e| e.contains("no server named")),
        "{after:?}"
    );
    let _ = agent.cancel().await;
    desk.stop().await;
}
