//! An agent under an account of its own: the strong setup of the threat model. The desk serves
//! its own account on its usual socket, and the accounts its settings list on a second socket
//! they can reach; every other account is refused with a reason, and a listed one may reach a URL
//! (or a registered server) but never have the desk run a command or open a file as the person.
//! Root only (a second account is created with `useradd` and removed after); elsewhere the test
//! says why it skips.

use std::path::Path;
use std::process::Stdio;

use countersign_tests::account::Account;
use countersign_tests::desk_process;
use countersign_tests::window::bin;
use rmcp::ServiceExt;
use rmcp::model::*;
use rmcp::transport::TokioChildProcess;
use serde_json::json;

/// server-everything over streamable HTTP on a free port; its URL.
async fn http_upstream() -> (tokio::process::Child, String) {
    countersign_tests::peers::server_everything_http().await
}

/// A headless desk of this (root) account in `dir`, with `agent_accounts` in its settings.
async fn desk(dir: &Path, agent_accounts: &[&str]) -> tokio::process::Child {
    std::fs::create_dir_all(dir.join("config")).unwrap();
    std::fs::write(
        dir.join("config/settings.json"),
        json!({ "agent_accounts": agent_accounts }).to_string(),
    )
    .unwrap();
    let child = tokio::process::Command::new(bin("countersign-desk"))
        .arg("--in-memory-secret")
        .env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .env("COUNTERSIGN_DESK_DIR", dir)
        .env("COUNTERSIGN_SOCKET", dir.join("run/desk.sock"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    desk_process::wait_for_socket(&dir.join("run/desk.sock")).await;
    // The desk binds the agents' socket after its own, and only then opens the directory to
    // other accounts (0711): a listed account's gateway, or a look at the mode, waits for it.
    if !agent_accounts.is_empty() {
        desk_process::wait_for_socket(&dir.join("run/agents.sock")).await;
    }
    child
}

/// `countersign mcp` as `account`, with stdin closed, against the desk of root at `socket`.
fn gateway_output(account: &Account, socket: &Path, reach: &[&str]) -> (Option<i32>, String) {
    let out = account
        .std_command(bin("countersign"))
        .arg("mcp")
        .arg("--desk-user")
        .arg("root")
        .arg("--socket")
        .arg(socket)
        .args(reach)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_account_connects_only_when_the_desk_lists_it() {
    let Some(agent) = Account::create("an agent under its own account") else {
        return;
    };
    let (_upstream, url) = http_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    // The agent's account must pass through the test's directory to the socket directory, as it
    // passes through /tmp to the real one.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .unwrap();
    let own = dir.path().join("run/desk.sock");
    let agents = dir.path().join("run/agents.sock");

    // Nobody listed: no socket for other accounts, and the socket directory (0700) and the
    // desk's own socket (0600) are closed to them.
    let mut first = desk(dir.path(), &[]).await;
    assert!(!agents.exists());
    for socket in [&agents, &own] {
        let (code, stderr) = gateway_output(&agent, socket, &["--url", &url]);
        assert_eq!(code, Some(3), "{stderr}");
        assert!(stderr.contains("Permission denied"), "{stderr}");
    }
    desk_process::terminate(first.id().unwrap() as i32);
    let _ = first.wait().await;

    // Another account listed, not this one: the desk answers, and refuses it by account.
    let mut second = desk(dir.path(), &["nobody"]).await;
    let (code, stderr) = gateway_output(&agent, &agents, &["--url", &url]);
    assert_eq!(code, Some(4), "{stderr}");
    assert!(
        stderr.contains("account_not_allowed")
            && stderr.contains(&format!("uid {} is not listed", agent.uid)),
        "{stderr}"
    );
    desk_process::terminate(second.id().unwrap() as i32);
    let _ = second.wait().await;

    // Listed by name: a URL is served end to end; a command or the built-in tools, which would
    // run as the desk's account, are refused.
    let mut third = desk(dir.path(), &[&agent.name]).await;
    let mode = |p: &Path| {
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions())
            & 0o777
    };
    assert_eq!(mode(&dir.path().join("run")), 0o711);
    assert_eq!(mode(&own), 0o600, "the desk's own socket stays its own");
    let mut cmd = agent.command(bin("countersign"));
    cmd.arg("mcp")
        .arg("--desk-user")
        .arg("root")
        .arg("--socket")
        .arg(&agents)
        .arg("--url")
        .arg(&url)
        .env("RUST_LOG", "warn");
    let client = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("agent-account", "1.0"),
    )
    .serve(TokioChildProcess::new(cmd).unwrap())
    .await
    .unwrap();
    let r = client
        .call_tool(
            CallToolRequestParams::new("echo").with_arguments(
                json!({"message": "from another account"})
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
        )
        .await
        .unwrap();
    assert!(
        format!("{:?}", r.content).contains("Echo: from another account"),
        "{r:?}"
    );
    client.cancel().await.unwrap();
    for reach in [
        vec!["--db", "/root/.local/share/countersign/desk.sqlite"],
        vec!["--", "/bin/sh", "-c", "id > /root/owned"],
    ] {
        let (code, stderr) = gateway_output(&agent, &agents, &reach);
        assert_eq!(code, Some(4), "{reach:?}: {stderr}");
        assert!(
            stderr.contains("account_not_allowed") && stderr.contains("agent account"),
            "{reach:?}: {stderr}"
        );
    }
    assert!(!Path::new("/root/owned").exists());
    // Its gateway answers only to a desk of the account it was told: the same socket, with
    // another --desk-user, is refused before any hello.
    let out = agent
        .std_command(bin("countersign"))
        .args(["mcp", "--desk-user", "nobody", "--socket"])
        .arg(&agents)
        .args(["--url", &url])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("the socket belongs to uid 0, not to the desk's account"),
        "{stderr}"
    );
    // A registered server is the desk's own: only its account registers one. The agent
    // account speaks the protocol by hand (its `countersign server` would not even talk to a
    // socket of another account) and asks to register a command, which would run as root.
    let hello = json!({"type": "registry", "version": countersign_wire::PROTOCOL_VERSION,
        "request": {"op": "put", "name": "owned",
                    "spec": {"command": ["/bin/sh", "-c", "id > /root/owned"]}, "secrets": {}}});
    let out = agent
        .std_command("python3")
        .arg("-c")
        .arg(RAW_HELLO)
        .arg(&agents)
        .arg(hello.to_string())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(
        answer.contains("account_not_allowed") && answer.contains("only the desk's own account"),
        "{answer} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Root's own command line registers a URL server, and the agent account reaches it by name.
    let out = std::process::Command::new(bin("countersign"))
        .args(["server", "add", "everything", "--url", &url])
        .env("COUNTERSIGN_SOCKET", &own)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = std::process::Command::new(bin("countersign"))
        .args(["server", "list", "--json"])
        .env("COUNTERSIGN_SOCKET", &own)
        .output()
        .unwrap();
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(listed.get("owned").is_none(), "{listed}");
    let mut cmd = agent.command(bin("countersign"));
    cmd.args(["mcp", "--desk-user", "root", "--socket"])
        .arg(&agents)
        .args(["--server", "everything"])
        .env("RUST_LOG", "warn");
    let client = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("agent-account", "1.0"),
    )
    .serve(TokioChildProcess::new(cmd).unwrap())
    .await
    .unwrap();
    let r = client
        .call_tool(
            CallToolRequestParams::new("echo")
                .with_arguments(json!({"message": "by name"}).as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    assert!(
        format!("{:?}", r.content).contains("Echo: by name"),
        "{r:?}"
    );
    client.cancel().await.unwrap();
    desk_process::terminate(third.id().unwrap() as i32);
    let _ = third.wait().await;
}

/// Sends one hello (argv[2], JSON) on the socket argv[1] and prints the body of the answer.
const RAW_HELLO: &str = r#"
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
body = b"H" + sys.argv[2].encode()
s.sendall(struct.pack(">I", len(body)) + body)
def exactly(n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data
n = struct.unpack(">I", exactly(4))[0]
print(exactly(n)[1:].decode())
"#;
