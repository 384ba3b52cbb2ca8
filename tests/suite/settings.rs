//! Settings → Servers and Settings → Clients, end to end: the real desk and window (WebDriver),
//! the real keychain (run under `.ci/with-keychain`, where this process and the desk share one
//! Secret Service) and the real `countersign` command beside them.
//!
//! Servers: a server added through the form with a secret environment variable is listed with
//! the secret masked, its value is in the keychain and in no file under the desk's directory; an
//! edit that leaves the secret's field empty keeps it; Remove forgets it. A server registered from
//! the command line with direction-changing and invisible characters is listed escaped and
//! flagged, and an edit that leaves those fields alone keeps them as they were.
//!
//! Clients: the desk pointed at a fake home (`COUNTERSIGN_CLIENTS_HOME`, honoured by debug
//! builds only) finds a Claude Desktop configuration with two servers, one with a token in its
//! environment; Protect registers both, rewrites the file to `countersign mcp --server NAME`
//! keeping its other keys, and leaves the token in no file; Restore brings the file back byte for
//! byte.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use countersign_secret::{Items, KeychainItems};
use countersign_tests::files;
use countersign_tests::window::{Desk, bin};
use fantoccini::Locator;
use serde_json::{Value, json};

/// A server name of this run's own: keychain items are shared with every other test's desk.
fn unique(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

/// The keychain account of `rest` (`server/NAME/env/KEY`) for `desk`: each desk keeps its items
/// under a prefix of its own, `desk-` and 8 bytes of the SHA-256 of its SQLite file's path.
fn account(desk: &Desk, rest: &str) -> String {
    let store = std::fs::canonicalize(desk.dir.path().join("data/desk.sqlite")).unwrap();
    let digest = countersign_core::PlanHash::of_bytes(store.as_os_str().as_encoded_bytes());
    format!("desk-{}/{rest}", &digest.to_hex()[..16])
}

/// `countersign server ARGS...` against `desk`: its exit code, stdout and stderr.
async fn server_command(desk: &Desk, args: &[&str]) -> (i32, String, String) {
    let child = tokio::process::Command::new(bin("countersign"))
        .arg("server")
        .args(args)
        .env("COUNTERSIGN_SOCKET", desk.socket())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("countersign server to finish")
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The servers as `countersign server list --json` prints them.
async fn listed(desk: &Desk) -> Value {
    let (code, out, err) = server_command(desk, &["list", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap()
}

/// Fails when any file under `dir` holds `secret`; the scan must have read the registry's file.
fn assert_in_no_file(dir: &Path, secret: &str) {
    let files = files::assert_in_no_file(&[dir], secret);
    assert!(
        files.iter().any(|f| f.ends_with("servers.json")),
        "the scan reads the registry's file: {files:?}"
    );
}

/// Opens Settings → Servers.
async fn open_servers(desk: &Desk) {
    desk.click("#tab-settings").await;
    desk.click("#st-servers").await;
}

/// Types `text` into the element `css` as a person would.
async fn type_into(desk: &Desk, css: &str, text: &str) {
    desk.browser()
        .find(Locator::Css(css))
        .await
        .unwrap()
        .send_keys(text)
        .await
        .unwrap();
}

/// The text of the Servers list row of `name` (empty when there is none).
async fn row_text(desk: &Desk, name: &str) -> String {
    let text: Value = desk
        .browser()
        .execute(
            "const row = document.querySelector(`#servers tr[data-server=\"${arguments[0]}\"]`); \
             return row ? row.innerText : '';",
            vec![json!(name)],
        )
        .await
        .unwrap();
    text.as_str().unwrap().to_owned()
}

async fn wait_for_row(desk: &Desk, name: &str, holding: &str) {
    let (name, holding) = (name.to_owned(), holding.to_owned());
    desk.until("the server's row", |d| {
        let (name, holding) = (name.clone(), holding.clone());
        Box::pin(async move { row_text(d, &name).await.contains(&holding) })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_added_in_settings_is_listed_with_its_secret_masked_and_its_value_in_no_file() {
    let desk = Desk::start().await;
    let name = unique("gh");
    let secret = format!("ghp_settings{}Sekret", std::process::id());
    let account = account(&desk, &format!("server/{name}/env/GITHUB_TOKEN"));
    let keychain = KeychainItems::open_default().unwrap();
    open_servers(&desk).await;
    desk.until("the empty list", |d| {
        Box::pin(async move { d.count("#sv-none:not([hidden])").await == 1 })
    })
    .await;

    // Add: a command, a secret environment variable typed into a password field, a plain one.
    desk.click("#sv-add").await;
    type_into(&desk, "#sv-name", &name).await;
    desk.set_value("#sv-command", "gh-server\nstdio").await;
    desk.click("#sv-add-setting").await;
    desk.click("#sv-add-setting").await;
    type_into(&desk, ".sv-setting:nth-child(1) .sv-key", "GITHUB_TOKEN").await;
    desk.click(".sv-setting:nth-child(1) .sv-secret").await;
    let kind: Value = desk
        .browser()
        .execute(
            "return document.querySelector('.sv-setting:nth-child(1) .sv-value').type",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        kind,
        json!("password"),
        "a secret is typed into a password field"
    );
    type_into(&desk, ".sv-setting:nth-child(1) .sv-value", &secret).await;
    type_into(&desk, ".sv-setting:nth-child(2) .sv-key", "LOG").await;
    type_into(&desk, ".sv-setting:nth-child(2) .sv-value", "info").await;
    desk.click("#sv-save").await;
    wait_for_row(&desk, &name, "secret (in the keychain)").await;
    desk.screenshot("settings-servers.png").await;

    let row = row_text(&desk, &name).await;
    assert!(row.contains("gh-server stdio"), "{row}");
    assert!(row.contains("LOG") && row.contains("info"), "{row}");
    assert!(
        !desk.page_text().await.contains(&secret),
        "the page holds the secret after saving"
    );
    let servers = listed(&desk).await;
    assert_eq!(
        servers[&name],
        json!({"command": ["gh-server", "stdio"], "env": {"GITHUB_TOKEN": {"secret": true}, "LOG": "info"}})
    );
    assert_eq!(
        keychain
            .get(&account)
            .unwrap()
            .as_deref()
            .map(String::as_str),
        Some(secret.as_str())
    );
    assert_in_no_file(desk.dir.path(), &secret);

    // Edit: the plain value changes, the secret's field is left empty and keeps the value.
    desk.click(&format!("#servers tr[data-server=\"{name}\"] .sv-edit"))
        .await;
    let filled: Value = desk
        .browser()
        .execute(
            "return [...document.querySelectorAll('.sv-setting .sv-value')].map(v => v.value)",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        filled,
        json!(["", "info"]),
        "a secret is never read back into the form"
    );
    desk.set_value(".sv-setting:nth-child(2) .sv-value", "debug")
        .await;
    desk.click("#sv-save").await;
    wait_for_row(&desk, &name, "debug").await;
    assert_eq!(
        listed(&desk).await[&name]["env"],
        json!({"GITHUB_TOKEN": {"secret": true}, "LOG": "debug"})
    );
    assert_eq!(
        keychain
            .get(&account)
            .unwrap()
            .as_deref()
            .map(String::as_str),
        Some(secret.as_str()),
        "the secret left empty is kept"
    );

    // The edits are the person's own: applied at once, recorded, never waiting for a click.
    assert!(!desk.visible_request().await);

    // Remove: asked once more, then gone with its secret.
    desk.click(&format!("#servers tr[data-server=\"{name}\"] .sv-remove"))
        .await;
    desk.click(&format!(
        "#servers tr[data-server=\"{name}\"] .sv-remove-now"
    ))
    .await;
    let gone = name.clone();
    desk.until("the row to go", |d| {
        let gone = gone.clone();
        Box::pin(async move { row_text(d, &gone).await.is_empty() })
    })
    .await;
    assert_eq!(listed(&desk).await.get(&name), None);
    assert_eq!(keychain.get(&account).unwrap(), None);
    assert_in_no_file(desk.dir.path(), &secret);
    desk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_registered_from_the_command_line_is_listed_escaped_and_an_edit_keeps_what_it_cannot_show()
 {
    let desk = Desk::start().await;
    let name = unique("odd");
    let program = "run\u{202e}txt.exe";
    let note = "a\u{200b}b";
    let (code, _, err) = server_command(
        &desk,
        &[
            "add",
            &name,
            "--env",
            &format!("NOTE={note}"),
            "--",
            program,
            "--flag",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    open_servers(&desk).await;
    wait_for_row(&desk, &name, "run\\u{202e}txt.exe").await;
    let row = row_text(&desk, &name).await;
    assert!(row.contains("a\\u{200b}b"), "{row}");
    assert!(
        !desk.page_text().await.contains(['\u{202e}', '\u{200b}']),
        "raw on the page"
    );
    let flags = desk
        .flags(&format!("#servers tr[data-server=\"{name}\"] .flag"))
        .await;
    assert!(flags.iter().any(|f| f.contains("bidi")), "{flags:?}");
    assert!(flags.iter().any(|f| f.contains("invisible")), "{flags:?}");

    // The form cannot show those values as they are: it leaves their fields empty, says what
    // they hold (escaped), and saving keeps them.
    desk.click(&format!("#servers tr[data-server=\"{name}\"] .sv-edit"))
        .await;
    let form: Value = desk
        .browser()
        .execute(
            "return [document.getElementById('sv-command').value, \
                     document.getElementById('sv-command').placeholder]",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(form[0], json!(""));
    assert!(
        form[1]
            .as_str()
            .unwrap()
            .contains("run\\u{202e}txt.exe --flag"),
        "{form}"
    );
    assert!(!desk.page_text().await.contains(['\u{202e}', '\u{200b}']));
    desk.click("#sv-add-setting").await;
    type_into(&desk, ".sv-setting:nth-child(2) .sv-key", "LOG").await;
    type_into(&desk, ".sv-setting:nth-child(2) .sv-value", "info").await;
    desk.click("#sv-save").await;
    wait_for_row(&desk, &name, "LOG").await;
    assert_eq!(
        listed(&desk).await[&name],
        json!({"command": [program, "--flag"], "env": {"LOG": "info", "NOTE": note}})
    );

    // Add never replaces a server unseen.
    desk.click("#sv-add").await;
    type_into(&desk, "#sv-name", &name).await;
    desk.set_value("#sv-command", "other").await;
    desk.click("#sv-save").await;
    desk.until("the refusal", |d| {
        Box::pin(async move { d.text("#sv-error").await.contains("registered already") })
    })
    .await;
    assert_eq!(listed(&desk).await[&name]["command"][0], json!(program));
    desk.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protect_in_settings_rewrites_a_claude_desktop_config_and_restore_brings_it_back_byte_for_byte()
 {
    let home = tempfile::tempdir().unwrap();
    let github = unique("github");
    let files = unique("files");
    let token = format!("ghp_clients{}TOKEN", std::process::id());
    let config = home
        .path()
        .join(".config/Claude/claude_desktop_config.json");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    // As a person keeps it: their own layout, a key Countersign has no business with.
    let original = r#"{
  "mcpServers": {
    "@GITHUB@": {
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-github"],
      "env": { "GITHUB_PERSONAL_ACCESS_TOKEN": "@TOKEN@" }
    },
    "@FILES@": { "command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv/notes"] }
  },
  "globalShortcut": "Ctrl+Space"
}
"#
    .replace("@GITHUB@", &github)
    .replace("@FILES@", &files)
    .replace("@TOKEN@", &token);
    serde_json::from_str::<Value>(&original).expect("the fixture is JSON");
    std::fs::write(&config, &original).unwrap();
    // Another client whose only server uses a variable the client fills in itself: listed with
    // why it is left as it is, and what to do instead.
    let cursor = home.path().join(".cursor/mcp.json");
    std::fs::create_dir_all(cursor.parent().unwrap()).unwrap();
    let cursor_text = r#"{ "mcpServers": { "workspace-files": { "command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "${workspaceFolder}"] } } }
"#;
    std::fs::write(&cursor, cursor_text).unwrap();
    let desk =
        Desk::start_with(&[("COUNTERSIGN_CLIENTS_HOME", home.path().to_str().unwrap())]).await;
    desk.click("#tab-settings").await;
    desk.click("#st-clients").await;
    let cursor_row = "#clients tr[data-client=\"cursor\"]";
    desk.until(
        "Cursor's entry left alone, with why and the next move",
        |d| {
            Box::pin(async move {
                let list = format!("{cursor_row} .cl-left");
                // The list may not be drawn yet: text() wants an element that is there.
                if !d.exists(&list).await {
                    return false;
                }
                let left = d.text(&list).await;
                left.contains("workspace-files")
                    && left.contains("fills in itself")
                    && left.contains("register it with `countersign server add` instead")
            })
        },
    )
    .await;
    let row = "#clients tr[data-client=\"claude-desktop\"]";
    desk.until("Claude Desktop with two servers", |d| {
        Box::pin(async move {
            d.exists(row).await
                && d.text(&format!("{row} .cl-count")).await == "2 servers, 0 through Countersign"
        })
    })
    .await;
    let path_shown = desk.text(&format!("{row} code")).await;
    assert!(
        path_shown.ends_with(".config/Claude/claude_desktop_config.json"),
        "{path_shown}"
    );

    desk.click(&format!("{row} .cl-protect")).await;
    desk.until("both servers through Countersign", |d| {
        Box::pin(async move {
            d.text(&format!("{row} .cl-count")).await == "2 servers, 2 through Countersign"
        })
    })
    .await;
    let summary = desk.text("#cl-summary").await;
    assert!(
        summary.contains(&format!("registered {github} in the desk")),
        "{summary}"
    );
    assert!(
        summary.contains("kept the original in the keychain"),
        "{summary}"
    );
    assert!(!summary.contains(&token), "{summary}");
    desk.screenshot("settings-clients.png").await;
    assert_eq!(
        std::fs::read_to_string(&cursor).unwrap(),
        cursor_text,
        "protecting one client leaves the others' files as they were"
    );

    let rewritten: Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    assert_eq!(rewritten["globalShortcut"], json!("Ctrl+Space"));
    for name in [&github, &files] {
        let entry = &rewritten["mcpServers"][name.as_str()];
        assert!(
            entry["command"].as_str().unwrap().ends_with("countersign"),
            "{entry}"
        );
        assert_eq!(entry["args"], json!(["mcp", "--server", name]));
        assert_eq!(entry.get("env"), None, "{entry}");
    }
    let servers = listed(&desk).await;
    assert_eq!(
        servers[&github]["env"],
        json!({"GITHUB_PERSONAL_ACCESS_TOKEN": {"secret": true}})
    );
    assert_eq!(
        servers[&files]["command"][2],
        json!("@modelcontextprotocol/server-filesystem")
    );
    let keychain = KeychainItems::open_default().unwrap();
    let account = account(
        &desk,
        &format!("server/{github}/env/GITHUB_PERSONAL_ACCESS_TOKEN"),
    );
    assert_eq!(
        keychain
            .get(&account)
            .unwrap()
            .as_deref()
            .map(String::as_str),
        Some(token.as_str())
    );
    files::assert_in_no_file(&[home.path(), desk.dir.path()], &token);

    desk.click(&format!("{row} .cl-restore")).await;
    desk.until("the restore's summary", |d| {
        Box::pin(async move { d.text("#cl-summary").await.contains("restored the file") })
    })
    .await;
    assert_eq!(std::fs::read(&config).unwrap(), original.as_bytes());
    desk.until("no server through Countersign again", |d| {
        Box::pin(async move {
            d.text(&format!("{row} .cl-count")).await == "2 servers, 0 through Countersign"
        })
    })
    .await;
    // Nothing more to restore: said with a code, the file untouched.
    desk.click(&format!("{row} .cl-restore")).await;
    desk.until("the refusal", |d| {
        Box::pin(async move { d.text("#cl-error").await.contains("nothing to restore") })
    })
    .await;
    assert_eq!(std::fs::read(&config).unwrap(), original.as_bytes());
    let _ = keychain.delete(&account);
    desk.stop().await;
}
