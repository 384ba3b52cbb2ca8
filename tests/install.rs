//! Protecting a client in one command, end to end: a realistic client configuration with API
//! tokens in its servers' environments, the real `countersign install` and `uninstall`, the real
//! desk, window and keychain, and the client's own way of starting a server (the command and
//! arguments the rewritten file says). After install the file holds only Countersign entries and
//! its other keys, the tokens are in no file, the servers work through the desk and receive their
//! tokens, and the process the agent starts does not hold them; uninstall restores the file byte
//! for byte.

use std::path::Path;
use std::process::Stdio;

use countersign_tests::files::{assert_in_no_file, contains};
use countersign_tests::window::{Desk, bin};
use rmcp::model::*;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

fn env_server() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("peers/env_server.py")
        .display()
        .to_string()
}

/// `countersign ARGS...` against `desk`; its exit code, stdout and stderr.
fn countersign(desk: &Desk, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(bin("countersign"))
        .args(args)
        .env("COUNTERSIGN_SOCKET", desk.socket())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Starts a server the way the client would from its rewritten entry (`command` and `args`,
/// and nothing of the old entry's environment), calls its `env` tool for `var`, and checks that
/// the started process's environment does not hold `secret`. The value the upstream has.
async fn through_client_entry(
    desk: &Desk,
    command: &str,
    args: &[String],
    var: &str,
    secret: &str,
) -> Value {
    assert_eq!(command, bin("countersign").display().to_string());
    let mut cmd = tokio::process::Command::new(command);
    cmd.args(args)
        // The test's desk is not at the default socket; a real client needs nothing more.
        .env("COUNTERSIGN_SOCKET", desk.socket())
        .env("RUST_LOG", "warn");
    let transport = TokioChildProcess::new(cmd).unwrap();
    let pid = transport.id().expect("the gateway's pid");
    let agent: rmcp::service::RunningService<RoleClient, ClientConfig> = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("install-test".to_owned(), "1.0"),
    )
    .serve(transport)
    .await
    .unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(
        !contains(&environ, secret),
        "the agent-started gateway holds the secret in its environment"
    );
    let params = CallToolRequestParams::new("env")
        .with_arguments(json!({"name": var}).as_object().unwrap().clone());
    let result = agent.peer().call_tool(params).await.unwrap();
    let _ = agent.cancel().await;
    result.structured_content.unwrap()["value"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_desktop_install_moves_tokens_to_the_keychain_and_uninstall_restores_the_file() {
    let desk = Desk::start().await;
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("claude_desktop_config.json");
    let script = env_server();
    let token = "sk-claude-token-8c1e5";
    let original = format!(
        r#"{{
  "globalShortcut": "Ctrl+Space",
  "mcpServers": {{
    "notes": {{
      "command": "python3",
      "args": ["{script}"],
      "env": {{
        "NOTES_API_TOKEN": "{token}",
        "NOTES_REGION": "eu"
      }}
    }},
    "plain": {{
      "command": "python3",
      "args": ["{script}"]
    }}
  }},
  "preferences": {{ "theme": "dark" }}
}}
"#
    );
    std::fs::write(&config, &original).unwrap();
    let config_arg = config.display().to_string();

    let (code, out, err) = countersign(
        &desk,
        &[
            "install",
            "--client",
            "claude-desktop",
            "--config",
            &config_arg,
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("notes") && out.contains("plain"), "{out}");
    assert!(!out.contains(token) && !err.contains(token));

    let installed: Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    assert_eq!(installed["globalShortcut"], json!("Ctrl+Space"));
    assert_eq!(installed["preferences"], json!({"theme": "dark"}));
    let servers = installed["mcpServers"].as_object().unwrap();
    assert_eq!(servers.len(), 2);
    for (name, entry) in servers {
        let entry = entry.as_object().unwrap();
        assert!(entry.get("env").is_none(), "{name}: {entry:?}");
        let args: Vec<String> = serde_json::from_value(entry["args"].clone()).unwrap();
        assert_eq!(&args[..2], ["mcp", "--server"], "{name}");
    }
    assert_in_no_file(&[home.path(), desk.dir.path()], token);

    let notes = servers["notes"].as_object().unwrap();
    let args: Vec<String> = serde_json::from_value(notes["args"].clone()).unwrap();
    let command = notes["command"].as_str().unwrap();
    assert_eq!(
        through_client_entry(&desk, command, &args, "NOTES_API_TOKEN", token).await,
        json!(token)
    );
    assert_eq!(
        through_client_entry(&desk, command, &args, "NOTES_REGION", token).await,
        json!("eu")
    );
    let plain = servers["plain"].as_object().unwrap();
    let args: Vec<String> = serde_json::from_value(plain["args"].clone()).unwrap();
    assert_eq!(
        through_client_entry(&desk, command, &args, "NOTES_API_TOKEN", token).await,
        Value::Null
    );

    // Installing again changes nothing; uninstall gives back the very bytes.
    let before_again = std::fs::read(&config).unwrap();
    let (code, out, err) = countersign(
        &desk,
        &[
            "install",
            "--client",
            "claude-desktop",
            "--config",
            &config_arg,
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(std::fs::read(&config).unwrap(), before_again);
    let (code, out, err) = countersign(
        &desk,
        &[
            "uninstall",
            "--client",
            "claude-desktop",
            "--config",
            &config_arg,
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(std::fs::read_to_string(&config).unwrap(), original);
    desk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_install_keeps_comments_and_uninstall_restores_the_file() {
    let desk = Desk::start().await;
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("config.toml");
    let script = env_server();
    let token = "codex-token-4e7b0";
    let original = format!(
        r#"# Codex configuration
model = "gpt-5-codex"   # the default model

# The notes server, with its token
[mcp_servers.notes]
command = "python3"
args = ["{script}"]

[mcp_servers.notes.env]
NOTES_API_TOKEN = "{token}" # rotate monthly

[profiles.fast]
model = "gpt-5-mini"
"#
    );
    std::fs::write(&config, &original).unwrap();
    let config_arg = config.display().to_string();
    let (code, out, err) = countersign(
        &desk,
        &["install", "--client", "codex", "--config", &config_arg],
    );
    assert_eq!(code, 0, "{out}{err}");
    let installed = std::fs::read_to_string(&config).unwrap();
    for kept in [
        "# Codex configuration",
        "model = \"gpt-5-codex\"   # the default model",
        "# The notes server, with its token",
        "[profiles.fast]",
        "model = \"gpt-5-mini\"",
    ] {
        assert!(installed.contains(kept), "{kept:?} lost:\n{installed}");
    }
    assert!(!installed.contains(token), "{installed}");
    assert_in_no_file(&[home.path(), desk.dir.path()], token);
    let table: toml::Table = installed.parse().unwrap();
    let notes = table["mcp_servers"]["notes"].as_table().unwrap();
    assert!(notes.get("env").is_none(), "{notes:?}");
    let command = notes["command"].as_str().unwrap().to_owned();
    let args: Vec<String> = notes["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        through_client_entry(&desk, &command, &args, "NOTES_API_TOKEN", token).await,
        json!(token)
    );
    let (code, out, err) = countersign(
        &desk,
        &["uninstall", "--client", "codex", "--config", &config_arg],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(std::fs::read_to_string(&config).unwrap(), original);
    desk.stop().await;
}
