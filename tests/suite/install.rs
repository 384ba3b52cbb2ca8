//! Protecting a client in one command, end to end: a realistic client configuration with API
//! tokens in its servers' environments, the real `countersign install` and `uninstall`, the real
//! desk, window and keychain, and the client's own way of starting a server (the command and
//! arguments the rewritten file says). After install the file holds only Countersign entries and
//! its other keys, the tokens are in no file, the servers work through the desk and receive their
//! tokens, and the process the agent starts does not hold them; uninstall restores the file byte
//! for byte. Then the clients themselves, Claude Code and Codex (the pinned programs), talking to a
//! model of the test's own on loopback: installed the same way, they list the tools through the
//! desk, make an open call, wait on a gated call until the test clicks Approve in the window,
//! confirm once, are refused the replay, and uninstall undoes the install.

use std::path::Path;
use std::process::Stdio;

use countersign_tests::files::{assert_in_no_file, contains};
use countersign_tests::real_clients::{Kind, RealClient};
use countersign_tests::scripted_model::{Move, ScriptedModel};
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

/// How many tool results the model's script gets back from `kind`.
fn moves_made(kind: Kind) -> usize {
    match kind {
        Kind::Codex => 5,
        Kind::ClaudeCode => 4,
    }
}

/// The users the built-in tools' database holds.
fn users(db: &Path) -> i64 {
    rusqlite::Connection::open(db)
        .unwrap()
        .query_row("SELECT count(*) FROM users", [], |r| r.get(0))
        .unwrap()
}

/// The original configuration of `client`: `notes` (a server with a token in its environment,
/// which install moves to the keychain) and `db` (the desk's built-in tools on `db`, already
/// through Countersign), plus for Codex its model provider and its own settings.
fn real_client_config(client: &RealClient, model_port: u16, db: &Path, token: &str) -> String {
    let script = env_server();
    let countersign = bin("countersign").display().to_string();
    let db = db.display().to_string();
    match client.kind {
        Kind::ClaudeCode => serde_json::to_string_pretty(&json!({
            "mcpServers": {
                "notes": {
                    "command": "python3",
                    "args": [script],
                    "env": {"NOTES_API_TOKEN": token, "NOTES_REGION": "eu"}
                },
                "db": {"command": countersign, "args": ["mcp", "--db", db]}
            }
        }))
        .unwrap(),
        Kind::Codex => format!(
            "{}\n# The notes server, with its token\n[mcp_servers.notes]\ncommand = \"python3\"\n\
             args = [\"{script}\"]\ndefault_tools_approval_mode = \"approve\"\n\n\
             [mcp_servers.notes.env]\nNOTES_API_TOKEN = \"{token}\"\nNOTES_REGION = \"eu\"\n\n\
             [mcp_servers.db]\ncommand = \"{countersign}\"\nargs = [\"mcp\", \"--db\", \"{db}\"]\n\
             default_tools_approval_mode = \"approve\"\n",
            RealClient::codex_settings(model_port)
        ),
    }
}

/// Item 11 of issue 29: a real client, installed through `countersign install`, lists the tools
/// through the desk, makes open calls, and a gated call that waits for the click in the real
/// window and then runs once: Codex with the token it confirms with, refused when it replays it;
/// Claude Code at the click itself (it takes the desk's prompt to open it), and the same call
/// again waits for a click of its own (denied here). `countersign uninstall` undoes the install.
async fn a_real_client_runs_the_approval_flow_through_the_installed_desk(kind: Kind) {
    let started = std::time::Instant::now();
    // The program is the one the setup pins (the table in docs/clients.md names that version).
    let version = kind.installed_version().await;
    assert!(
        version.split_whitespace().any(|w| w == kind.pinned()),
        "{kind:?} says {version:?}, the setup pins {}: run .ci/setup tests",
        kind.pinned()
    );
    let desk = Desk::start().await;
    let db = desk.dir.path().join("app.sqlite");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(
            "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);
             INSERT INTO users (name) VALUES ('ada'), ('bob'), ('cy');",
        )
        .unwrap();
    let insert = json!({"sql": "INSERT INTO users (name) VALUES ('dee')"});
    let call = |server: &str, tool: &str, arguments: Value| Move::Call {
        server: server.into(),
        tool: tool.into(),
        arguments,
    };
    let confirm = Move::Confirm {
        server: "db".into(),
        tool: "execute".into(),
        arguments: insert.clone(),
        from: 2,
    };
    let mut moves = vec![
        call("notes", "env", json!({"name": "NOTES_REGION"})),
        call(
            "db",
            "query",
            json!({"sql": "SELECT count(*) AS n FROM users"}),
        ),
        call("db", "execute", insert.clone()),
    ];
    // Codex speaks the preflight/confirm flow: a token after the click, a confirm with it, and
    // the same confirm again (the replay). Claude Code takes the desk's prompt to open it (a URL
    // elicitation, answered as a person would, see real_clients) and its call runs at the
    // click; the same call again is a request of its own, which waits for a click of its own.
    match kind {
        Kind::Codex => moves.extend([confirm.clone(), confirm]),
        Kind::ClaudeCode => moves.push(call("db", "execute", insert.clone())),
    }
    moves.push(Move::Say("dee is added".into()));
    let client = RealClient::new(kind);
    let model = ScriptedModel::start(client.wire(), moves).await;
    let token = "sk-notes-token-7f3a9";
    let original = real_client_config(&client, model.port(), &db, token);
    let config = client.config();
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::write(&config, &original).unwrap();

    let (code, out, err) = client
        .countersign(desk.dir.path(), &["install", "--client", kind.id()])
        .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("notes"), "{out}");
    let installed = std::fs::read(&config).unwrap();
    assert!(!contains(&installed, token));
    assert_in_no_file(&[client.home.path(), desk.dir.path()], token);

    let run = {
        let (dir, port) = (desk.dir.path().to_owned(), model.port());
        let client = &client;
        async move {
            client
                .run(&dir, port, &["notes", "db"], "Add a user named dee.")
                .await
        }
    };
    let approve = async {
        desk.wait_for_request().await;
        // The client waits on the preflight: the model has the two open calls' results only.
        assert_eq!(
            model.seen().handed.len(),
            2,
            "{:?}\nelicitations: {}",
            model.seen().handed,
            client.elicitations()
        );
        let agent = desk.text("#d-agent").await;
        eprintln!("{kind:?} shows in the window as {agent:?}");
        assert_eq!(users(&db), 3, "nothing runs before the click");
        // The target the desk worked out from the statement, as the window shows it.
        desk.until("the request's target", |d| {
            Box::pin(async move { !d.text("#d-target").await.is_empty() })
        })
        .await;
        let target = desk.text("#d-target").await;
        assert_eq!(target, "users");
        desk.browser()
            .find(fantoccini::Locator::Css("#typed-target"))
            .await
            .unwrap()
            .send_keys(&target)
            .await
            .unwrap();
        desk.until("Approve to be enabled", |d| Box::pin(d.approve_enabled()))
            .await;
        let approved = desk.shown_id().await;
        desk.click("#approve").await;
        eprintln!("{kind:?}: request {approved:?} approved");
        if kind == Kind::ClaudeCode {
            // The same call again, once the first has run: a new request, denied this time.
            model
                .until_seen(
                    "the call to run",
                    std::time::Duration::from_secs(30),
                    |seen| seen.handed.len() >= 3,
                )
                .await;
            assert_eq!(users(&db), 4, "the approved call ran once");
            // Told apart from the approved one by its id: the same plan, and a busy window may
            // still show the first for a moment (a click on Deny there would decide nothing).
            desk.until("the same call again, as a request of its own", move |d| {
                let approved = approved.clone();
                Box::pin(async move { d.shown_id().await.is_some_and(|id| Some(id) != approved) })
            })
            .await;
            let again = desk.shown_id().await;
            eprintln!("{kind:?}: the same call again is {again:?}; denying it");
            // A click can land while the window lays the queue out again around it (the first
            // request leaving, the second arriving) and then hit the note field above Deny, as
            // the screen showed when this first failed: it decides nothing, and a person would
            // click again. At most three clicks of the real button, each followed by a wait for
            // the request to leave the window.
            for click in 1.. {
                desk.click("#deny").await;
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
                let mut left = false;
                while !left && std::time::Instant::now() < deadline {
                    left = desk.shown_id().await != again;
                    if !left {
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                }
                if left {
                    break;
                }
                desk.screenshot(&format!("deny-click-{click}-decided-nothing.png"))
                    .await;
                assert!(click < 3, "{kind:?}: three clicks on Deny decided nothing");
                eprintln!("{kind:?}: the click on Deny decided nothing; clicking again");
            }
        }
    };
    tokio::pin!(run);
    let output = tokio::select! {
        output = &mut run => panic!(
            "{kind:?} ended before its request reached the window: {}\n{}\nthe model was \
             handed {:?}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            model.seen().handed
        ),
        () = approve => run.await,
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{kind:?}: {stdout}\n{stderr}");
    let seen = model.seen();
    assert!(seen.unread.is_empty(), "{:?}", seen.unread);

    // The client's own listing, through the installed entries and the desk.
    for tool in ["notes/env", "db/list_tables", "db/query", "db/execute"] {
        assert!(
            seen.schema(tool).is_some(),
            "{kind:?} listed no {tool}: {:?}",
            seen.listed.iter().map(|(n, _)| n).collect::<Vec<_>>()
        );
    }
    // The gated tool as the desk offers it: with the confirm fields.
    let execute = seen.schema("db/execute").unwrap();
    assert!(
        execute["properties"]["confirmToken"].is_object(),
        "{execute}"
    );
    let handed = &seen.handed;
    let calls: Vec<&str> = handed.iter().map(|h| h.call.as_str()).collect();
    assert_eq!(
        calls,
        [
            "notes/env",
            "db/query",
            "db/execute",
            "db/execute",
            "db/execute"
        ][..moves_made(kind)],
        "{handed:?}"
    );
    // The open calls: the region the desk keeps for notes, and the table as it was.
    let region = handed[0].structured().unwrap_or_default();
    assert_eq!(region["value"], json!("eu"), "{:?}", handed[0]);
    let count = handed[1].structured().unwrap_or_default();
    assert_eq!(count["rows"], json!([{"n": 3}]), "{:?}", handed[1]);
    match kind {
        Kind::Codex => {
            // The preflight, answered after the click with the token.
            let preflight = handed[2].structured().unwrap_or_default();
            assert!(preflight["confirmToken"].is_string(), "{:?}", handed[2]);
            assert_eq!(preflight["confirmTarget"], json!("users"));
            // The confirm ran the statement, once; the replay was refused and ran nothing.
            assert!(
                !handed[3].text.contains("refusal"),
                "the confirm was refused: {:?}",
                handed[3]
            );
            let replay = handed[4].structured().unwrap_or_default();
            assert_eq!(replay["refusal"], json!("already_used"), "{:?}", handed[4]);
        }
        Kind::ClaudeCode => {
            // The prompt to open the desk was for this request, and accepted.
            let asked = client.elicitations();
            assert!(asked.contains("countersign://request/"), "{asked}");
            // The call ran at the click, once; the same call again was denied and ran nothing.
            let ran = handed[2].structured().unwrap_or_default();
            assert_eq!(ran["changes"], json!(1), "{:?}", handed[2]);
            // Claude Code hands an error result's text, not its structuredContent.
            assert_eq!(handed[3].is_error, Some(true), "{:?}", handed[3]);
            assert!(
                handed[3]
                    .text
                    .starts_with("Refused: the person denied this request."),
                "{:?}",
                handed[3]
            );
        }
    }
    assert_eq!(users(&db), 4);
    assert!(stdout.contains("dee is added"), "{stdout}");

    let before_uninstall = std::fs::read(&config).unwrap();
    let (code, out, err) = client
        .countersign(desk.dir.path(), &["uninstall", "--client", kind.id()])
        .await;
    assert_eq!(code, 0, "{out}{err}");
    let restored = std::fs::read_to_string(&config).unwrap();
    if before_uninstall == installed {
        assert_eq!(restored, original);
    } else {
        // The client wrote keys of its own into the file (Claude Code does at each start): the
        // servers are the original's again, and the client's keys stay.
        let restored: Value = serde_json::from_str(&restored).unwrap();
        let original: Value = serde_json::from_str(&original).unwrap();
        assert_eq!(restored["mcpServers"], original["mcpServers"]);
        let written: Value = serde_json::from_slice(&before_uninstall).unwrap();
        for key in written.as_object().unwrap().keys() {
            assert!(restored.get(key).is_some(), "{key} was lost: {restored}");
        }
    }
    drop(model);
    desk.stop().await;
    eprintln!("{kind:?}: the whole flow took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_installed_lists_the_tools_and_runs_a_gated_call_once_at_the_click() {
    a_real_client_runs_the_approval_flow_through_the_installed_desk(Kind::ClaudeCode).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_installed_lists_calls_waits_for_the_click_and_confirms_once() {
    a_real_client_runs_the_approval_flow_through_the_installed_desk(Kind::Codex).await;
}
