//! `countersign install` and `uninstall` on realistic configurations of every client, against a
//! desk stand-in held in memory: the rewritten file is compared byte for byte with a golden
//! file (`tests/clients/<client>/after.*`), and so are what the desk was asked to register
//! (`registered.json`) and what the command printed (`report.txt`).
//!
//! `COUNTERSIGN_UPDATE_GOLDEN=1 cargo nextest run -p countersign-clients --test clients` writes the
//! goldens anew; read every changed one before committing it.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use countersign_clients::{self as clients, Client, InstallError, Options, Registrar};
use countersign_wire::{DeskError, RegistryAnswer, RegistryCode, RegistryRequest, ServerSpec};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const PROGRAM: &str = "/usr/local/bin/countersign";

/// What a registered server holds in the stand-in.
#[derive(Clone, PartialEq, Debug)]
struct Held {
    spec: ServerSpec,
    secrets: BTreeMap<String, String>,
}

/// The desk, as far as install is concerned: a registry and a keychain of backups.
#[derive(Default)]
struct FakeDesk {
    servers: BTreeMap<String, Held>,
    backups: BTreeMap<String, String>,
    /// Every Put, in order.
    puts: Vec<(String, Held)>,
    /// Every KeepBackup, DropBackup or Put (what changes the desk).
    changes: usize,
    /// The answer to a Put of this name.
    deny: Option<String>,
}

impl Registrar for FakeDesk {
    fn ask(
        &mut self,
        request: RegistryRequest,
        _waiting: &mut dyn FnMut(&str),
    ) -> Result<RegistryAnswer, DeskError> {
        let done = || RegistryAnswer::Done {
            message: "done".into(),
        };
        Ok(match request {
            RegistryRequest::List => RegistryAnswer::Servers {
                servers: self
                    .servers
                    .iter()
                    .map(|(k, v)| (k.clone(), v.spec.clone()))
                    .collect(),
            },
            RegistryRequest::Put {
                name,
                spec,
                secrets,
            } => {
                if self.deny.as_deref() == Some(name.as_str()) {
                    return Ok(RegistryAnswer::Denied {
                        message: "not this one".into(),
                    });
                }
                spec.check().unwrap();
                spec.check_secrets(&secrets).unwrap();
                let held = Held {
                    spec,
                    secrets: secrets
                        .iter()
                        .map(|(k, v)| (k.clone(), v.expose().to_owned()))
                        .collect(),
                };
                // A changed existing server would wait for a click; the tests never ask that.
                if let Some(old) = self.servers.get(&name) {
                    assert_eq!(*old, held, "install changed the existing server {name}");
                }
                self.changes += 1;
                self.puts.push((name.clone(), held.clone()));
                self.servers.insert(name, held);
                done()
            }
            // As the desk does (crates/registry): a kept or dropped backup is answered with
            // an empty `Backup`.
            RegistryRequest::KeepBackup { key, text } => {
                self.changes += 1;
                self.backups.insert(key, text.expose().to_owned());
                RegistryAnswer::Backup { text: None }
            }
            RegistryRequest::TakeBackup { key } => RegistryAnswer::Backup {
                text: self
                    .backups
                    .get(&key)
                    .map(|t| countersign_wire::SecretText::new(t.clone())),
            },
            RegistryRequest::DropBackup { key } => {
                self.changes += 1;
                self.backups.remove(&key);
                RegistryAnswer::Backup { text: None }
            }
            _ => RegistryAnswer::Refused {
                code: RegistryCode::BadRequest,
                message: "not in this stand-in".into(),
            },
        })
    }
}

/// `value` pretty-printed with every object's keys sorted, whatever order `serde_json`'s maps
/// keep (insertion order when a dependency turns on `preserve_order`).
fn sorted_pretty(value: &Value) -> String {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                Value::Object(
                    keys.into_iter()
                        .map(|k| (k.clone(), sorted(&map[k])))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    serde_json::to_string_pretty(&sorted(value)).unwrap()
}

fn golden_dir(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(case)
}

fn updating() -> bool {
    std::env::var_os("COUNTERSIGN_UPDATE_GOLDEN").is_some_and(|v| v == "1")
}

/// Compares `actual` with the golden file `name` of `case` (or writes it when updating).
fn check_golden(case: &str, name: &str, actual: &str) {
    let path = golden_dir(case).join(name);
    if updating() {
        fs::write(&path, actual).unwrap();
        return;
    }
    let expected = fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (COUNTERSIGN_UPDATE_GOLDEN=1 records it)",
            path.display()
        )
    });
    assert!(
        expected == actual,
        "{} differs from what install produced:\n{actual}",
        path.display()
    );
}

/// A config file of `case`'s `before.<ext>` in a fresh directory.
struct Setup {
    _dir: tempfile::TempDir,
    path: PathBuf,
    before: String,
}

fn setup(case: &str, ext: &str, file_name: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let before = fs::read_to_string(golden_dir(case).join(format!("before.{ext}"))).unwrap();
    let path = dir.path().join(file_name);
    fs::write(&path, &before).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
    Setup {
        _dir: dir,
        path,
        before,
    }
}

fn options(client: Client, path: &Path) -> Options {
    Options {
        client,
        path: path.to_owned(),
        program: PROGRAM.into(),
        dry_run: false,
        force: false,
    }
}

fn run(
    step: fn(&mut dyn Registrar, &Options, &mut dyn std::io::Write) -> Result<(), InstallError>,
    desk: &mut FakeDesk,
    options: &Options,
) -> (Result<(), InstallError>, String) {
    let mut out = Vec::new();
    let result = step(desk, options, &mut out);
    (result, String::from_utf8(out).unwrap())
}

/// The whole life of one client's file: dry run, install, install again, uninstall.
fn golden(client: Client, case: &str, ext: &str, file_name: &str) {
    let s = setup(case, ext, file_name);
    let mut desk = FakeDesk::default();
    let shown = |report: &str| report.replace(&s.path.display().to_string(), "<config>");

    // --dry-run: says what it would do, asks the desk nothing that changes it, writes nothing.
    let dry = Options {
        dry_run: true,
        ..options(client, &s.path)
    };
    let (result, dry_report) = run(clients::install, &mut desk, &dry);
    result.unwrap();
    assert_eq!(fs::read_to_string(&s.path).unwrap(), s.before);
    assert_eq!(desk.changes, 0, "a dry run changed the desk");
    assert!(dry_report.contains("nothing was changed (--dry-run)"));

    // Install.
    let (result, report) = run(clients::install, &mut desk, &options(client, &s.path));
    result.unwrap();
    let after = fs::read_to_string(&s.path).unwrap();
    check_golden(case, &format!("after.{ext}"), &after);
    let mode = fs::metadata(&s.path).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o640, "install kept the file's mode");

    let registered: serde_json::Map<String, Value> = desk
        .puts
        .iter()
        .map(|(name, held)| {
            (
                name.clone(),
                json!({"spec": held.spec, "secrets": held.secrets}),
            )
        })
        .collect();
    check_golden(
        case,
        "registered.json",
        &format!("{}\n", sorted_pretty(&Value::Object(registered))),
    );
    check_golden(
        case,
        "report.txt",
        &format!(
            "$ install --dry-run\n{}\n$ install\n{}",
            shown(&dry_report),
            shown(&report)
        ),
    );
    assert!(!desk.puts.is_empty(), "the fixture has servers to register");
    assert!(
        desk.puts.iter().any(|(_, held)| !held.secrets.is_empty()),
        "the fixture has a secret to move into the keychain, so the checks below check something"
    );
    for (name, held) in &desk.puts {
        for value in held.secrets.values() {
            assert!(
                !after.contains(value.as_str()),
                "{name}'s secret is in the file"
            );
            assert!(
                !report.contains(value.as_str()),
                "{name}'s secret was printed"
            );
            assert!(!dry_report.contains(value.as_str()));
            assert!(s.before.contains(value.as_str()));
        }
        // YAML writes the arguments as a list of lines; install reads every rewritten entry
        // back as `countersign mcp` in every format.
        let wrapped = if ext == "yaml" {
            let lines: Vec<&str> = after.lines().map(str::trim).collect();
            lines
                .windows(2)
                .any(|w| w[0] == "- '--server'" && w[1] == format!("- {name}"))
        } else {
            after.contains(&format!("\"--server\", \"{name}\""))
        };
        assert!(wrapped, "{name} is wrapped");
    }
    // The keychain item: the original file, the hash of what install wrote, and the servers
    // this install registered; held by the desk, so no secret of it is in the file.
    assert_eq!(desk.backups.len(), 1);
    let (key, item) = desk.backups.iter().next().unwrap();
    assert_eq!(
        key,
        &clients::backup_key(client, &fs::canonicalize(&s.path).unwrap())
    );
    let item: Value = serde_json::from_str(item).unwrap();
    let steps = item["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1, "one install, one step");
    assert_eq!(steps[0]["original"], s.before.as_str());
    let written = format!("{:x}", Sha256::digest(after.as_bytes()));
    assert_eq!(steps[0]["installed_sha256"], written.as_str());
    let mut put: Vec<&str> = desk.puts.iter().map(|(n, _)| n.as_str()).collect();
    let mut kept: Vec<&str> = steps[0]["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    put.sort();
    kept.sort();
    assert_eq!(
        kept, put,
        "the keychain item names the servers this install registered"
    );

    // Install again: nothing to do, nothing asked, nothing written.
    let changes = desk.changes;
    let (result, again) = run(clients::install, &mut desk, &options(client, &s.path));
    result.unwrap();
    assert!(again.contains("nothing to do"), "{again}");
    assert_eq!(desk.changes, changes);
    assert_eq!(fs::read_to_string(&s.path).unwrap(), after);

    // Uninstall: the original, byte for byte; the backup gone; the servers still registered.
    let (result, undone) = run(clients::uninstall, &mut desk, &options(client, &s.path));
    result.unwrap();
    assert_eq!(fs::read(&s.path).unwrap(), s.before.as_bytes());
    assert!(desk.backups.is_empty());
    assert!(
        undone.contains("countersign server remove NAME"),
        "{undone}"
    );
    for held in desk.puts.iter().map(|(_, held)| held) {
        for value in held.secrets.values() {
            assert!(!again.contains(value.as_str()), "a secret was printed");
            assert!(!undone.contains(value.as_str()), "a secret was printed");
        }
    }
    assert!(!desk.servers.is_empty());
    let mode = fs::metadata(&s.path).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o640, "uninstall kept the file's mode");
}

#[test]
fn claude_desktop_config_is_protected_and_restored() {
    golden(
        Client::ClaudeDesktop,
        "claude-desktop",
        "json",
        "claude_desktop_config.json",
    );
}

#[test]
fn claude_code_user_config_with_projects_is_protected_and_restored() {
    golden(Client::ClaudeCode, "claude-code", "json", ".claude.json");
}

#[test]
fn claude_code_project_config_is_protected_and_restored() {
    golden(
        Client::ClaudeCode,
        "claude-code-project",
        "json",
        ".mcp.json",
    );
}

#[test]
fn cursor_config_is_protected_and_restored() {
    golden(Client::Cursor, "cursor", "json", "mcp.json");
}

#[test]
fn vscode_config_with_comments_is_protected_and_restored() {
    golden(Client::Vscode, "vscode", "json", "mcp.json");
}

#[test]
fn windsurf_config_is_protected_and_restored() {
    golden(Client::Windsurf, "windsurf", "json", "mcp_config.json");
}

#[test]
fn codex_toml_with_comments_is_protected_and_restored() {
    golden(Client::Codex, "codex", "toml", "config.toml");
}

#[test]
fn zed_settings_with_comments_are_protected_and_restored() {
    golden(Client::Zed, "zed", "json", "settings.json");
}

#[test]
fn gemini_settings_are_protected_and_restored() {
    golden(Client::Gemini, "gemini", "json", "settings.json");
}

#[test]
fn cline_settings_are_protected_and_restored() {
    golden(Client::Cline, "cline", "json", "cline_mcp_settings.json");
}

/// The clients after the first nine, each with `tests/clients/<id>/before.<ext>` (the file name
/// the client uses): the same life as theirs, driven from this list.
const MORE: [(Client, &str); 22] = [
    (Client::Opencode, "opencode.json"),
    (Client::Crush, "crush.json"),
    (Client::Goose, "config.yaml"),
    (Client::Continue, "config.yaml"),
    (Client::RooCode, "mcp_settings.json"),
    (Client::KiloCode, "mcp_settings.json"),
    (Client::KiloCodeCli, "mcp_settings.json"),
    (Client::QwenCode, "settings.json"),
    (Client::AmazonQ, "mcp.json"),
    (Client::Kiro, "mcp.json"),
    (Client::LmStudio, "mcp.json"),
    (Client::FactoryDroid, "mcp.json"),
    (Client::CopilotCli, "mcp-config.json"),
    (Client::Antigravity, "mcp_config.json"),
    (Client::Junie, "mcp.json"),
    (Client::Amp, "settings.json"),
    (Client::Trae, "mcp.json"),
    (Client::VscodeInsiders, "mcp.json"),
    (Client::Boltai, "mcp.json"),
    (Client::Anythingllm, "anythingllm_mcp_servers.json"),
    (Client::Mcphub, "servers.json"),
    (Client::Augment, "settings.json"),
];

/// The clients the tests above give a life of their own.
const NINE: [Client; 9] = [
    Client::ClaudeDesktop,
    Client::ClaudeCode,
    Client::Cursor,
    Client::Vscode,
    Client::Windsurf,
    Client::Codex,
    Client::Zed,
    Client::Gemini,
    Client::Cline,
];

fn extension(client: Client) -> &'static str {
    match client.spec().format {
        clients::table::Format::Json => "json",
        clients::table::Format::Toml => "toml",
        clients::table::Format::Yaml => "yaml",
    }
}

#[test]
fn every_other_client_is_protected_and_restored() {
    let mut failed = Vec::new();
    for (client, file_name) in MORE {
        let life = std::panic::catch_unwind(|| {
            golden(client, client.id(), extension(client), file_name);
        });
        if life.is_err() {
            failed.push(client.id());
        }
    }
    assert!(
        failed.is_empty(),
        "these clients failed (see above): {failed:?}"
    );
}

#[test]
fn every_client_has_a_golden_life() {
    for client in clients::ALL {
        assert!(
            NINE.contains(&client) || MORE.iter().any(|(c, _)| *c == client),
            "{} has no golden test",
            client.id()
        );
        let before = golden_dir(client.id()).join(format!("before.{}", extension(client)));
        assert!(before.is_file(), "{} is missing", before.display());
    }
}

/// The table of clients in docs/clients.md is the table the code reads
/// (`COUNTERSIGN_UPDATE_GOLDEN=1` writes it anew between its two markers).
#[test]
fn the_clients_page_lists_every_client_as_the_table_does() {
    const START: &str = "<!-- clients table: crates/clients/src/table.rs -->\n";
    const END: &str = "<!-- end of clients table -->";
    let page_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/clients.md");
    let page = fs::read_to_string(&page_path).unwrap();
    let (head, rest) = page
        .split_once(START)
        .expect("docs/clients.md has the table's start");
    let (table, tail) = rest
        .split_once(END)
        .expect("docs/clients.md has the table's end");
    let expected = clients::table::readme_table();
    if updating() {
        fs::write(&page_path, format!("{head}{START}{expected}{END}{tail}")).unwrap();
        return;
    }
    assert!(
        table == expected,
        "docs/clients.md's table of clients differs from crates/clients/src/table.rs:\n{expected}"
    );
    // A client the table says the tests run is one of the table's, at the version the test
    // setup installs (tests/suite/install.rs checks the program it runs against the same pin).
    let setup =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.ci/setup")).unwrap();
    for (id, version) in clients::table::RUN_IN_TESTS {
        assert!(Client::from_id(id).is_some(), "{id} is not in the table");
        assert!(
            setup.contains(&format!("@{version}")),
            ".ci/setup pins no {id} at {version}"
        );
    }
}

#[test]
fn a_denied_server_leaves_the_file_and_the_backup_as_they_were() {
    let s = setup("claude-desktop", "json", "claude_desktop_config.json");
    let mut desk = FakeDesk {
        deny: Some("linear".into()),
        ..FakeDesk::default()
    };
    let (result, _) = run(
        clients::install,
        &mut desk,
        &options(Client::ClaudeDesktop, &s.path),
    );
    let err = result.unwrap_err();
    assert!(matches!(err, InstallError::Denied { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains("was left as it was"), "{message}");
    // Those registered before it are said to stay.
    assert!(message.contains("github"), "{message}");
    assert_eq!(fs::read_to_string(&s.path).unwrap(), s.before);
    assert!(
        desk.backups.is_empty(),
        "the backup of a failed install was taken back"
    );
}

#[test]
fn uninstall_refuses_to_lose_an_edit_of_a_rewritten_entry_unless_forced() {
    let s = setup("cursor", "json", "mcp.json");
    let mut desk = FakeDesk::default();
    let opts = options(Client::Cursor, &s.path);
    run(clients::install, &mut desk, &opts).0.unwrap();
    // The person points the protected entry elsewhere, and adds a key of their own.
    let edited = fs::read_to_string(&s.path)
        .unwrap()
        .replacen(
            &format!("\"command\": \"{PROGRAM}\""),
            "\"command\": \"elsewhere\"",
            1,
        )
        .replace("\n}", ",\n  \"x\": 1\n}");
    fs::write(&s.path, &edited).unwrap();

    let err = run(clients::uninstall, &mut desk, &opts).0.unwrap_err();
    let InstallError::EditedSinceInstall { entries, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(entries, &["mcpServers.stripe"], "{err}");
    assert!(err.to_string().contains("mcpServers.stripe"), "{err}");
    assert!(err.to_string().contains("--force"));
    assert_eq!(fs::read_to_string(&s.path).unwrap(), edited);

    let forced = Options {
        force: true,
        ..opts
    };
    run(clients::uninstall, &mut desk, &forced).0.unwrap();
    // Every entry as it was; the person's own key stays.
    assert_eq!(
        fs::read_to_string(&s.path).unwrap(),
        s.before.replace("\n}", ",\n  \"x\": 1\n}")
    );
}

#[test]
fn uninstall_of_a_yaml_file_keeps_a_comment_added_since_and_refuses_an_edited_entry() {
    let s = setup("goose", "yaml", "config.yaml");
    let mut desk = FakeDesk::default();
    let opts = options(Client::Goose, &s.path);
    run(clients::install, &mut desk, &opts).0.unwrap();
    let installed = fs::read_to_string(&s.path).unwrap();
    let edited = format!("{installed}# edited by hand\n").replacen(
        "GOOSE_MODE: smart_approve",
        "GOOSE_MODE: auto",
        1,
    );
    fs::write(&s.path, &edited).unwrap();
    // The person also turns the protected GitHub entry off.
    let github = installed.find("  github:").unwrap();
    let off = installed[github..].find("enabled: true").unwrap() + github;
    let touched = format!(
        "{}enabled: false{}",
        &edited[..off],
        &edited[off + "enabled: true".len()..]
    );
    fs::write(&s.path, &touched).unwrap();

    let err = run(clients::uninstall, &mut desk, &opts).0.unwrap_err();
    let InstallError::EditedSinceInstall { entries, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(entries, &["extensions.github"], "{err}");
    assert_eq!(fs::read_to_string(&s.path).unwrap(), touched);
    let forced = Options {
        force: true,
        ..opts
    };
    run(clients::uninstall, &mut desk, &forced).0.unwrap();
    assert_eq!(
        fs::read_to_string(&s.path).unwrap(),
        format!("{}# edited by hand\n", s.before).replacen(
            "GOOSE_MODE: smart_approve",
            "GOOSE_MODE: auto",
            1
        )
    );
}

#[test]
fn a_second_install_keeps_the_first_original_for_uninstall_to_reach() {
    let s = setup("claude-desktop", "json", "claude_desktop_config.json");
    let mut desk = FakeDesk::default();
    let opts = options(Client::ClaudeDesktop, &s.path);
    run(clients::install, &mut desk, &opts).0.unwrap();
    let first = fs::read_to_string(&s.path).unwrap();
    // The person adds a server by hand, then protects it too.
    let added = first.replacen(
        "\"mcpServers\": {",
        "\"mcpServers\": {\n    \"slack\": {\"command\": \"slack-mcp\", \"env\": {\"SLACK_TOKEN\": \"xoxb-second0001\"}},",
        1,
    );
    fs::write(&s.path, &added).unwrap();
    run(clients::install, &mut desk, &opts).0.unwrap();
    assert!(
        !fs::read_to_string(&s.path)
            .unwrap()
            .contains("xoxb-second0001")
    );
    assert_eq!(
        desk.servers["slack"].secrets["SLACK_TOKEN"],
        "xoxb-second0001"
    );

    let (result, report) = run(clients::uninstall, &mut desk, &opts);
    result.unwrap();
    assert_eq!(fs::read_to_string(&s.path).unwrap(), added);
    assert!(report.contains("an earlier install"), "{report}");
    assert!(!report.contains("--force"), "{report}");
    // Going further back puts the first install's entries back and keeps the one added by hand.
    run(clients::uninstall, &mut desk, &opts).0.unwrap();
    assert_eq!(
        fs::read_to_string(&s.path).unwrap(),
        s.before.replacen(
            "\"mcpServers\": {",
            "\"mcpServers\": {\n    \"slack\": {\"command\": \"slack-mcp\", \"env\": {\"SLACK_TOKEN\": \"xoxb-second0001\"}},",
            1,
        )
    );
    assert!(desk.backups.is_empty());
}

#[test]
fn a_name_registered_for_another_server_gets_a_suffix() {
    let s = setup("claude-desktop", "json", "claude_desktop_config.json");
    let other: ServerSpec = serde_json::from_value(json!({"command": ["other-github"]})).unwrap();
    let mut desk = FakeDesk::default();
    desk.servers.insert(
        "github".into(),
        Held {
            spec: other.clone(),
            secrets: BTreeMap::new(),
        },
    );
    run(
        clients::install,
        &mut desk,
        &options(Client::ClaudeDesktop, &s.path),
    )
    .0
    .unwrap();
    assert_eq!(desk.servers["github"].spec, other, "untouched");
    assert!(desk.servers.contains_key("github-2"));
    let after = fs::read_to_string(&s.path).unwrap();
    assert!(after.contains("\"--server\", \"github-2\""), "{after}");
}

#[test]
fn uninstall_without_an_install_says_there_is_nothing_to_restore() {
    let s = setup("zed", "json", "settings.json");
    let mut desk = FakeDesk::default();
    let err = run(
        clients::uninstall,
        &mut desk,
        &options(Client::Zed, &s.path),
    )
    .0
    .unwrap_err();
    assert!(matches!(err, InstallError::NoBackup { .. }), "{err}");
    assert_eq!(fs::read_to_string(&s.path).unwrap(), s.before);
}

#[test]
fn a_config_that_does_not_parse_is_refused_without_quoting_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    fs::write(
        &path,
        "[mcp_servers.x]\ncommand = \"x\"\nenv = { TOKEN = \"sk_unterminated0001 }\n",
    )
    .unwrap();
    let mut desk = FakeDesk::default();
    let err = run(clients::install, &mut desk, &options(Client::Codex, &path))
        .0
        .unwrap_err();
    assert!(matches!(err, InstallError::Parse { .. }), "{err}");
    assert!(!err.to_string().contains("sk_unterminated0001"), "{err}");
    assert!(!format!("{err:?}").contains("sk_unterminated0001"));
}

#[test]
fn a_missing_config_says_where_it_was_looked_for() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.json");
    let mut desk = FakeDesk::default();
    let err = run(clients::install, &mut desk, &options(Client::Cursor, &path))
        .0
        .unwrap_err();
    assert!(err.to_string().contains("absent.json"), "{err}");
}

#[test]
fn a_symlinked_config_is_edited_where_it_lives() {
    let s = setup("windsurf", "json", "mcp_config.json");
    let link = s.path.with_file_name("link.json");
    std::os::unix::fs::symlink(&s.path, &link).unwrap();
    let mut desk = FakeDesk::default();
    run(
        clients::install,
        &mut desk,
        &options(Client::Windsurf, &link),
    )
    .0
    .unwrap();
    assert!(
        fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(
        !fs::read_to_string(&s.path)
            .unwrap()
            .contains("BSA_windsurfFixture0001")
    );
    run(
        clients::uninstall,
        &mut desk,
        &options(Client::Windsurf, &s.path),
    )
    .0
    .unwrap();
    assert_eq!(fs::read_to_string(&s.path).unwrap(), s.before);
}
