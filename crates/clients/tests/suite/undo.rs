//! Uninstall after the client has written its own file: Claude Code rewriting `~/.claude.json`
//! on every start, Qwen Code adding `$version`, OpenCode `$schema`, Codex its project trust.
//! Each test installs into a real file in a temporary directory, writes the file the way the
//! client does, uninstalls, and compares byte for byte with the client's file with only the
//! rewritten entries put back; an entry changed since is named and nothing written, unless
//! forced. The desk is a stand-in held in memory (its registry and its keychain of backups).

use std::fs;
use std::path::{Path, PathBuf};

use countersign_clients::{self as clients, Client, InstallError, Options};
use serde_json::{Value, json};

const PROGRAM: &str = "/usr/local/bin/countersign";

type Desk = countersign_clients::stand_in::StandInDesk;

struct File {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn file(name: &str, text: &str) -> File {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    fs::write(&path, text).unwrap();
    File { _dir: dir, path }
}

fn options(client: Client, path: &Path, force: bool) -> Options {
    Options {
        client,
        path: path.to_owned(),
        program: PROGRAM.into(),
        dry_run: false,
        force,
    }
}

fn install(desk: &mut Desk, client: Client, path: &Path) -> String {
    let mut out = Vec::new();
    clients::install(desk, &options(client, path, false), &mut out).unwrap();
    fs::read_to_string(path).unwrap()
}

fn uninstall(
    desk: &mut Desk,
    client: Client,
    path: &Path,
    force: bool,
) -> Result<String, InstallError> {
    let mut out = Vec::new();
    clients::uninstall(desk, &options(client, path, force), &mut out)?;
    Ok(String::from_utf8(out).unwrap())
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap()
}

/// The entries a refusal names.
fn named(err: &InstallError) -> Vec<String> {
    match err {
        InstallError::EditedSinceInstall { entries, .. } => entries.clone(),
        other => panic!("expected a refusal naming entries, got: {other}"),
    }
}

/// `value` as `JSON.stringify(value, null, 2)` writes it, `depth` levels in.
fn pretty_at(value: &Value, depth: usize) -> String {
    serde_json::to_string_pretty(value)
        .unwrap()
        .replace('\n', &format!("\n{}", "  ".repeat(depth)))
}

// Claude Code's `~/.claude.json`: entries at the top and in each project.

const CC_GITHUB: &str = r#"{
      "type": "stdio",
      "command": "github-mcp-server",
      "args": [
        "stdio"
      ],
      "env": {
        "GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_undoFixture0001"
      }
    }"#;

const CC_POSTGRES: &str = r#"{
          "type": "stdio",
          "command": "npx",
          "args": [
            "-y",
            "@modelcontextprotocol/server-postgres"
          ],
          "env": {
            "PGPASSWORD": "pg_undoFixture0002"
          }
        }"#;

fn claude_json() -> String {
    format!(
        r#"{{
  "numStartups": 41,
  "installMethod": "native",
  "autoUpdates": true,
  "mcpServers": {{
    "github": {CC_GITHUB}
  }},
  "projects": {{
    "/home/alice/shop": {{
      "allowedTools": [],
      "mcpServers": {{
        "postgres": {CC_POSTGRES}
      }},
      "hasTrustDialogAccepted": true
    }}
  }},
  "userID": "0123456789abcdef"
}}"#
    )
}

/// What Claude Code does on a start: reads the file, sets its counters and the session of the
/// project, adds a project, and writes the whole file anew (here with the keys sorted, which
/// also reorders every unrelated key and re-indents the rewritten entries).
fn claude_code_starts(text: &str) -> String {
    let mut config: Value = serde_json::from_str(text).unwrap();
    config["numStartups"] = json!(42);
    config["firstStartTime"] = json!("2025-06-01T09:00:00.000Z");
    config["userID"] = json!("fedcba9876543210");
    config["projects"]["/home/alice/shop"]["lastSessionId"] = json!("5f0c-session");
    config["projects"]["/home/alice/blog"] = json!({
        "allowedTools": [],
        "mcpServers": {"local": {"type": "stdio", "command": "blog-mcp", "args": []}},
        "lastSessionId": "77aa-session"
    });
    serde_json::to_string_pretty(&config).unwrap()
}

/// The client's file with each rewritten entry (as the client now writes it) put back as the
/// original's text.
fn claude_json_restored(client_file: &str, installed: &str) -> String {
    let installed: Value = serde_json::from_str(installed).unwrap();
    let github = pretty_at(&installed["mcpServers"]["github"], 2);
    let postgres = pretty_at(
        &installed["projects"]["/home/alice/shop"]["mcpServers"]["postgres"],
        4,
    );
    assert!(client_file.contains(&github) && client_file.contains(&postgres));
    client_file
        .replacen(&github, CC_GITHUB, 1)
        .replacen(&postgres, CC_POSTGRES, 1)
}

#[test]
fn claude_code_writing_its_whole_file_since_install_keeps_its_writes_and_gets_the_entries_back() {
    let f = file(".claude.json", &claude_json());
    let mut desk = Desk::default();
    let installed = install(&mut desk, Client::ClaudeCode, &f.path);
    assert!(!installed.contains("ghp_undoFixture0001"));
    let client_file = claude_code_starts(&installed);
    fs::write(&f.path, &client_file).unwrap();

    let report = uninstall(&mut desk, Client::ClaudeCode, &f.path, false).unwrap();
    let restored = read(&f.path);
    assert_eq!(restored, claude_json_restored(&client_file, &installed));
    assert!(
        report.contains("mcpServers.github")
            && report.contains("projects[\"/home/alice/shop\"].mcpServers.postgres"),
        "{report}"
    );
    // The client's writes are there, and so are the original entries, secrets included.
    let value: Value = serde_json::from_str(&restored).unwrap();
    assert_eq!(value["numStartups"], 42);
    assert_eq!(value["userID"], "fedcba9876543210");
    assert_eq!(
        value["projects"]["/home/alice/shop"]["lastSessionId"],
        "5f0c-session"
    );
    assert_eq!(
        value["projects"]["/home/alice/blog"]["mcpServers"]["local"]["command"],
        "blog-mcp"
    );
    let original: Value = serde_json::from_str(&claude_json()).unwrap();
    assert_eq!(value["mcpServers"], original["mcpServers"]);
    assert!(desk.backups.is_empty(), "the backup is dropped once undone");
}

#[test]
fn claude_code_an_entry_changed_since_is_named_and_the_file_left_until_forced() {
    let f = file(".claude.json", &claude_json());
    let mut desk = Desk::default();
    let installed = install(&mut desk, Client::ClaudeCode, &f.path);
    let mut config: Value = serde_json::from_str(&claude_code_starts(&installed)).unwrap();
    // Someone points the project's protected entry at another program.
    config["projects"]["/home/alice/shop"]["mcpServers"]["postgres"]["command"] = json!("evil");
    let touched = serde_json::to_string_pretty(&config).unwrap();
    fs::write(&f.path, &touched).unwrap();

    let err = uninstall(&mut desk, Client::ClaudeCode, &f.path, false).unwrap_err();
    assert_eq!(
        named(&err),
        ["projects[\"/home/alice/shop\"].mcpServers.postgres"]
    );
    assert!(err.to_string().contains("--force"), "{err}");
    assert_eq!(read(&f.path), touched, "nothing was written");
    assert_eq!(desk.backups.len(), 1, "the backup is kept");

    let report = uninstall(&mut desk, Client::ClaudeCode, &f.path, true).unwrap();
    assert!(report.contains("--force"), "{report}");
    let restored: Value = serde_json::from_str(&read(&f.path)).unwrap();
    let original: Value = serde_json::from_str(&claude_json()).unwrap();
    assert_eq!(
        restored["projects"]["/home/alice/shop"]["mcpServers"],
        original["projects"]["/home/alice/shop"]["mcpServers"]
    );
    assert_eq!(restored["numStartups"], 42, "the client's write is kept");
    assert!(read(&f.path).contains(CC_POSTGRES), "byte for byte");
}

#[test]
fn an_entry_removed_since_is_named_and_put_back_only_when_forced() {
    let f = file(".claude.json", &claude_json());
    let mut desk = Desk::default();
    let installed = install(&mut desk, Client::ClaudeCode, &f.path);
    let mut config: Value = serde_json::from_str(&installed).unwrap();
    config["mcpServers"]
        .as_object_mut()
        .unwrap()
        .remove("github");
    config["mcpServers"]["added"] = json!({"command": "added-mcp"});
    let touched = serde_json::to_string_pretty(&config).unwrap();
    fs::write(&f.path, &touched).unwrap();

    let err = uninstall(&mut desk, Client::ClaudeCode, &f.path, false).unwrap_err();
    assert_eq!(named(&err), ["mcpServers.github"]);
    assert_eq!(read(&f.path), touched);
    uninstall(&mut desk, Client::ClaudeCode, &f.path, true).unwrap();
    let text = read(&f.path);
    assert!(text.contains(&format!("\"github\": {CC_GITHUB}")), "{text}");
    let restored: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(restored["mcpServers"]["added"]["command"], "added-mcp");
}

#[test]
fn qwen_code_adding_its_version_is_kept() {
    let before = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/qwen-code/before.json"),
    )
    .unwrap();
    let f = file("settings.json", &before);
    let mut desk = Desk::default();
    let installed = install(&mut desk, Client::QwenCode, &f.path);
    let add = |text: &str| text.replacen("{\n", "{\n  \"$version\": 2,\n", 1);
    fs::write(&f.path, add(&installed)).unwrap();
    uninstall(&mut desk, Client::QwenCode, &f.path, false).unwrap();
    assert_eq!(read(&f.path), add(&before));
}

#[test]
fn opencode_jsonc_with_schema_and_comments_added_since_keeps_them() {
    let before = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/opencode/before.json"),
    )
    .unwrap();
    let without_schema = before.replacen(
        "  \"$schema\": \"https://opencode.ai/config.json\",\n",
        "",
        1,
    );
    assert_ne!(without_schema, before);
    let f = file("opencode.json", &without_schema);
    let mut desk = Desk::default();
    let installed = install(&mut desk, Client::Opencode, &f.path);
    assert!(installed.contains("\"command\": [\"/usr/local/bin/countersign\""));
    // OpenCode writes its `$schema`; the person adds a comment and changes the theme.
    let client = |text: &str| {
        text.replacen(
            "{\n",
            "{\n  \"$schema\": \"https://opencode.ai/config.json\",\n",
            1,
        )
        .replacen(
            "\"theme\": \"opencode\"",
            "\"theme\": \"tokyonight\" /* mine */",
            1,
        )
        .replacen(
            "  \"autoupdate\": true,\n",
            "  // updates\n  \"autoupdate\": false,\n",
            1,
        )
    };
    fs::write(&f.path, client(&installed)).unwrap();
    uninstall(&mut desk, Client::Opencode, &f.path, false).unwrap();
    assert_eq!(read(&f.path), client(&without_schema));
}

// Codex's `config.toml`: an entry of two tables, its env table removed by install.

const CODEX: &str = r#"# Codex configuration
model = "gpt-5-codex"

[mcp_servers]
fetch = { command = "npx", env = { KEY = "codexUndo0003" } } # inline

# Local servers
[mcp_servers.github]
command = "github-mcp-server" # installed with brew
args = ["stdio"]

[mcp_servers.github.env]
GITHUB_PERSONAL_ACCESS_TOKEN = "ghp_codexUndo0001"

[mcp_servers.docs]
command = "uvx"
args = ["docs-mcp"]
env = { DOCS_TOKEN = "codexUndo0002" }

[profiles.deep]
model = "gpt-5"
"#;

/// What Codex and its person do meanwhile: trust a project (a new table at the end), change
/// the model, comment a profile, add a server with `codex mcp add` between the protected ones.
fn codex_writes(text: &str) -> String {
    format!("{text}\n[projects.\"/home/alice/app\"]\ntrust_level = \"trusted\"\n")
        .replacen("model = \"gpt-5-codex\"", "model = \"gpt-5.1-codex\"", 1)
        .replacen("[profiles.deep]", "# for hard ones\n[profiles.deep]", 1)
        .replacen(
            "[mcp_servers.docs]",
            "[mcp_servers.added]\ncommand = \"added-mcp\"\n\n[mcp_servers.docs]",
            1,
        )
}

#[test]
fn codex_toml_written_since_keeps_its_tables_and_gets_the_entry_tables_back() {
    let f = file("config.toml", CODEX);
    let mut desk = Desk::default();
    let installed = install(&mut desk, Client::Codex, &f.path);
    assert!(
        !installed.contains("[mcp_servers.github.env]"),
        "{installed}"
    );
    assert!(!installed.contains("codexUndo"), "{installed}");
    fs::write(&f.path, codex_writes(&installed)).unwrap();
    uninstall(&mut desk, Client::Codex, &f.path, false).unwrap();
    assert_eq!(read(&f.path), codex_writes(CODEX));
}

#[test]
fn codex_an_entry_table_edited_since_is_named_and_forced_back() {
    let f = file("config.toml", CODEX);
    let mut desk = Desk::default();
    let installed = install(&mut desk, Client::Codex, &f.path);
    let touched = codex_writes(&installed).replacen(
        "args = [\"mcp\", \"--server\", \"docs\"]",
        "args = [\"mcp\", \"--server\", \"docs\"]\nenabled = false",
        1,
    );
    assert_ne!(touched, codex_writes(&installed));
    fs::write(&f.path, &touched).unwrap();
    let err = uninstall(&mut desk, Client::Codex, &f.path, false).unwrap_err();
    assert_eq!(named(&err), ["mcp_servers.docs"]);
    assert_eq!(read(&f.path), touched);
    uninstall(&mut desk, Client::Codex, &f.path, true).unwrap();
    assert_eq!(read(&f.path), codex_writes(CODEX));
}

#[test]
fn codex_entry_tables_removed_since_are_put_back_when_forced() {
    let f = file("config.toml", CODEX);
    let mut desk = Desk::default();
    let installed = install(&mut desk, Client::Codex, &f.path);
    let start = installed.find("# Local servers").unwrap();
    let end = installed.find("[mcp_servers.docs]").unwrap();
    let touched = format!("{}{}", &installed[..start], &installed[end..]);
    fs::write(&f.path, &touched).unwrap();
    let err = uninstall(&mut desk, Client::Codex, &f.path, false).unwrap_err();
    assert_eq!(named(&err), ["mcp_servers.github"]);
    uninstall(&mut desk, Client::Codex, &f.path, true).unwrap();
    let text = read(&f.path);
    assert!(
        text.ends_with(
            "# Local servers\n[mcp_servers.github]\ncommand = \"github-mcp-server\" # installed \
             with brew\nargs = [\"stdio\"]\n\n[mcp_servers.github.env]\n\
             GITHUB_PERSONAL_ACCESS_TOKEN = \"ghp_codexUndo0001\"\n"
        ),
        "{text}"
    );
    let value: toml_edit::DocumentMut = text.parse().unwrap();
    assert_eq!(
        value["mcp_servers"]["docs"]["env"]["DOCS_TOKEN"].as_str(),
        Some("codexUndo0002")
    );
}

// Continue's YAML list of entries.

#[test]
fn continue_yaml_list_entries_come_back_and_the_rest_stays_as_written_since() {
    let before = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/continue/before.yaml"),
    )
    .unwrap();
    let f = file("config.yaml", &before);
    let mut desk = Desk::default();
    let installed = install(&mut desk, Client::Continue, &f.path);
    let client = |text: &str| {
        format!("{text}\n# rules added later\nrules:\n  - Be brief\n")
            .replacen("version: 1.0.0", "version: 1.0.1  # bumped", 1)
            .replacen("schema: v1\n", "schema: v1\nnewKey: true\n", 1)
    };
    fs::write(&f.path, client(&installed)).unwrap();
    uninstall(&mut desk, Client::Continue, &f.path, false).unwrap();
    assert_eq!(read(&f.path), client(&before));
}

// Every client's fixture, with a key the client adds at the top and one at the end.

fn fixture(client: Client) -> (String, &'static str) {
    let ext = match client.spec().format {
        clients::table::Format::Json => "json",
        clients::table::Format::Toml => "toml",
        clients::table::Format::Yaml => "yaml",
    };
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(client.id())
        .join(format!("before.{ext}"));
    (fs::read_to_string(path).unwrap(), ext)
}

/// A write of the client's own outside the entries: a key at the top, and one at the end.
fn client_writes(ext: &str, text: &str) -> String {
    match ext {
        "json" => {
            let open = text.find('{').unwrap() + 1;
            let close = text.rfind('}').unwrap();
            let (head, body) = text[..close].split_at(open);
            let trailing = body.trim_end().ends_with(',');
            format!(
                "{head}\n  \"clientWroteFirst\": 1,{body}{}  \"clientWroteLast\": [1, 2]\n{}",
                if trailing { "\n" } else { ",\n" },
                &text[close..]
            )
        }
        "toml" => format!("client_wrote_first = 1\n{text}\n[client_wrote_last]\nx = 1\n"),
        _ => format!("clientWroteFirst: 1\n{text}clientWroteLast: [1, 2]\n"),
    }
}

#[test]
fn every_client_keeps_its_own_writes_through_uninstall_and_install_records_the_entries() {
    for client in clients::ALL {
        let (before, ext) = fixture(client);
        let f = file("config", &before);
        let mut desk = Desk::default();
        let installed = install(&mut desk, client, &f.path);
        // The keychain item says which entries install rewrote.
        let item: Value = serde_json::from_str(desk.backups.values().next().unwrap()).unwrap();
        let step = &item["steps"][0];
        assert_eq!(
            step["rewritten"]["installed"],
            installed,
            "{}: install recorded its entries",
            client.id()
        );
        assert!(
            !step["rewritten"]["entries"].as_array().unwrap().is_empty(),
            "{}",
            client.id()
        );
        let written = client_writes(ext, &installed);
        assert_ne!(written, installed);
        fs::write(&f.path, &written).unwrap();
        let report = uninstall(&mut desk, client, &f.path, false)
            .unwrap_or_else(|e| panic!("{}: {e}", client.id()));
        assert_eq!(
            read(&f.path),
            client_writes(ext, &before),
            "{}: {report}",
            client.id()
        );
    }
}

/// A backup of an install by an earlier countersign: no record of the entries.
fn as_before_the_record(desk: &mut Desk) {
    for item in desk.backups.values_mut() {
        let mut value: Value = serde_json::from_str(item).unwrap();
        for step in value["steps"].as_array_mut().unwrap() {
            step.as_object_mut().unwrap().remove("rewritten").unwrap();
        }
        *item = value.to_string();
    }
}

#[test]
fn an_install_made_before_the_record_is_restored_whole_when_unchanged_and_refused_otherwise() {
    let before = claude_json();
    let f = file(".claude.json", &before);
    let mut desk = Desk::default();
    let installed = install(&mut desk, Client::ClaudeCode, &f.path);
    as_before_the_record(&mut desk);
    let written = claude_code_starts(&installed);
    fs::write(&f.path, &written).unwrap();
    let err = uninstall(&mut desk, Client::ClaudeCode, &f.path, false).unwrap_err();
    assert!(named(&err).is_empty(), "{err}");
    assert!(err.to_string().contains("whole file"), "{err}");
    assert_eq!(read(&f.path), written);
    uninstall(&mut desk, Client::ClaudeCode, &f.path, true).unwrap();
    assert_eq!(read(&f.path), before, "--force: the whole original");

    let f = file(".claude.json", &before);
    let mut desk = Desk::default();
    install(&mut desk, Client::ClaudeCode, &f.path);
    as_before_the_record(&mut desk);
    uninstall(&mut desk, Client::ClaudeCode, &f.path, false).unwrap();
    assert_eq!(read(&f.path), before);
}

#[test]
fn a_rewritten_entry_moved_elsewhere_is_not_followed() {
    // The gateway entry is moved into another project; its original is not written there, nor
    // back in its place unless forced.
    let f = file(".claude.json", &claude_json());
    let mut desk = Desk::default();
    let installed = install(&mut desk, Client::ClaudeCode, &f.path);
    let mut config: Value = serde_json::from_str(&installed).unwrap();
    let entry = config["mcpServers"]
        .as_object_mut()
        .unwrap()
        .remove("github")
        .unwrap();
    config["projects"]["/home/alice/shop"]["mcpServers"]["github"] = entry;
    let touched = serde_json::to_string_pretty(&config).unwrap();
    fs::write(&f.path, &touched).unwrap();
    let err = uninstall(&mut desk, Client::ClaudeCode, &f.path, false).unwrap_err();
    assert_eq!(named(&err), ["mcpServers.github"]);
    assert_eq!(read(&f.path), touched);
    assert!(!read(&f.path).contains("ghp_undoFixture0001"));
}
