//! `countersign clients` and `countersign install --all`: every client the machine has, through
//! the same survey the desk's Settings → Clients shows (`countersign_clients::survey`).
//!
//! `clients` only reads: it asks no desk and writes nothing. `install --all` runs, for each
//! client found, what `install --client X` runs, and goes on to the next client when one fails
//! (its file is then left as it was); it stops only when the desk cannot be reached, since every
//! client after would fail the same way.

use std::io::Write;

use countersign_clients::{self as clients, ClientState, InstallError, Options, Places, Registrar};

/// Prints every client found under `places`: its file, whether it is protected, which entries
/// go through Countersign, which install would protect, and which it leaves alone (why, and what
/// to do); then the clients not found, on one line.
pub fn list(places: &Places, out: &mut dyn Write) -> std::io::Result<()> {
    let mut not_found = Vec::new();
    for surveyed in clients::survey(places) {
        let client = surveyed.client;
        let entries = match surveyed.state {
            ClientState::NotFound => {
                not_found.push(client.title());
                continue;
            }
            ClientState::Unreadable(why) => {
                writeln!(
                    out,
                    "{} ({}): {}\n  cannot be read: {why}",
                    client.title(),
                    client.id(),
                    surveyed.path.display()
                )?;
                continue;
            }
            ClientState::Read(entries) => entries,
        };
        let status = if entries.servers() == 0 {
            "no MCP servers".to_owned()
        } else if entries.is_protected() {
            format!(
                "protected: {} of {} servers through Countersign",
                entries.protected.len(),
                entries.servers()
            )
        } else {
            format!(
                "NOT protected: {} of {} servers to protect (`countersign install --client {}`)",
                entries.to_protect.len(),
                entries.servers(),
                client.id()
            )
        };
        writeln!(
            out,
            "{} ({}): {}\n  {status}",
            client.title(),
            client.id(),
            surveyed.path.display()
        )?;
        for at in &entries.protected {
            writeln!(out, "  through Countersign: {at}")?;
        }
        for at in &entries.to_protect {
            writeln!(out, "  to protect: {at}")?;
        }
        for (at, left) in &entries.left {
            match left.next {
                Some(next) => writeln!(out, "  left alone: {at}: {}; next: {next}", left.why)?,
                None => writeln!(out, "  left alone: {at}: {}", left.why)?,
            }
        }
    }
    if !not_found.is_empty() {
        writeln!(out, "Not found on this machine: {}", not_found.join(", "))?;
    }
    Ok(())
}

/// What `install --all` did.
#[derive(Debug, Default)]
pub struct AllDone {
    /// The clients whose file was read (and protected, or already protected).
    pub done: Vec<&'static str>,
    /// The clients whose install failed, each with why.
    pub failed: Vec<(&'static str, String)>,
}

/// Protects every client found under `places` (or, with `dry_run`, says what it would do), each
/// reported on `out` as `install --client X` reports it. A client that fails is said and
/// skipped; an unreachable desk ends the walk with its error.
pub fn install_all(
    registrar: &mut dyn Registrar,
    places: &Places,
    program: &str,
    dry_run: bool,
    out: &mut dyn Write,
) -> Result<AllDone, InstallError> {
    let mut all = AllDone::default();
    let mut not_found = Vec::new();
    for surveyed in clients::survey(places) {
        let client = surveyed.client;
        if surveyed.state == ClientState::NotFound {
            not_found.push(client.title());
            continue;
        }
        let options = Options {
            client,
            path: surveyed.path,
            program: program.to_owned(),
            dry_run,
            force: false,
        };
        match clients::install(registrar, &options, out) {
            Ok(()) => all.done.push(client.title()),
            Err(InstallError::Desk(e)) => return Err(InstallError::Desk(e)),
            Err(e) => {
                let _ = writeln!(out, "  FAILED, left as it was: {e}");
                all.failed.push((client.title(), e.to_string()));
            }
        }
    }
    if !not_found.is_empty() {
        let _ = writeln!(out, "Not found on this machine: {}", not_found.join(", "));
    }
    let _ = match (all.done.len(), all.failed.len()) {
        (0, 0) => writeln!(out, "No client configuration was found."),
        (_, 0) => writeln!(out, "{} clients read, none failed.", all.done.len()),
        (_, n) => writeln!(
            out,
            "{} clients read; {n} failed: {}",
            all.done.len(),
            all.failed
                .iter()
                .map(|(title, _)| *title)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    Ok(all)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// The desk as far as install is concerned: a registry that takes every server, and backups.
    type Desk = countersign_clients::stand_in::StandInDesk;

    fn home() -> (tempfile::TempDir, Places) {
        let dir = tempfile::tempdir().unwrap();
        let places = Places {
            home: dir.path().to_owned(),
            config_home: dir.path().join(".config"),
            codex_home: dir.path().join(".codex"),
            macos: false,
        };
        (dir, places)
    }

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    const CURSOR: &str = r#"{"mcpServers": {
  "stripe": {"command": "npx", "args": ["@stripe/mcp"], "env": {"STRIPE_SECRET_KEY": "sk_test_allFixture0001"}},
  "files": {"command": "npx", "args": ["server-filesystem", "${workspaceFolder}"]}
}}
"#;

    const GOOSE: &str = "extensions:\n  github:\n    name: github\n    cmd: github-mcp-server\n    envs:\n      GITHUB_TOKEN: ghp_allFixture0002\n    type: stdio\n  events:\n    name: events\n    type: sse\n    uri: http://localhost:8931/sse\n";

    #[test]
    fn clients_lists_what_is_found_protected_and_left_alone_without_a_desk() {
        let (_dir, places) = home();
        write(&places.home.join(".cursor/mcp.json"), CURSOR);
        write(&places.config_home.join("goose/config.yaml"), GOOSE);
        write(&places.home.join(".gemini/settings.json"), "{ not json");
        let mut out = Vec::new();
        list(&places, &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(out.contains("Cursor (cursor): "), "{out}");
        assert!(
            out.contains(
                "NOT protected: 1 of 2 servers to protect (`countersign install --client cursor`)"
            ),
            "{out}"
        );
        assert!(out.contains("  to protect: mcpServers.stripe"), "{out}");
        assert!(
            out.contains("  left alone: mcpServers.files: its command"),
            "{out}"
        );
        assert!(
            out.contains("  left alone: extensions.events: it is an SSE server, and the desk reaches streamable HTTP servers only; next: "),
            "{out}"
        );
        assert!(out.contains("Gemini CLI (gemini): "), "{out}");
        assert!(out.contains("  cannot be read: "), "{out}");
        assert!(
            out.contains("Not found on this machine: Claude Desktop, Claude Code,"),
            "{out}"
        );
        assert!(!out.contains("Not found on this machine: Claude Desktop, Claude Code, Cursor"));
        assert!(!out.contains("sk_test_allFixture0001") && !out.contains("ghp_allFixture0002"));
    }

    #[test]
    fn install_all_protects_every_client_found_and_goes_on_past_one_that_fails() {
        let (_dir, places) = home();
        let cursor = places.home.join(".cursor/mcp.json");
        let goose = places.config_home.join("goose/config.yaml");
        let gemini = places.home.join(".gemini/settings.json");
        write(&cursor, CURSOR);
        write(&goose, GOOSE);
        write(&gemini, "{ not json");
        let mut desk = Desk::default();

        // A dry run changes nothing.
        let mut out = Vec::new();
        install_all(&mut desk, &places, "/usr/bin/countersign", true, &mut out).unwrap();
        assert!(desk.servers.is_empty() && desk.backups.is_empty());
        assert_eq!(std::fs::read_to_string(&cursor).unwrap(), CURSOR);

        let mut out = Vec::new();
        let all = install_all(&mut desk, &places, "/usr/bin/countersign", false, &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert_eq!(all.done, ["Cursor", "Goose"], "{out}");
        assert_eq!(all.failed.len(), 1, "{out}");
        assert_eq!(all.failed[0].0, "Gemini CLI");
        assert!(out.contains("  FAILED, left as it was: "), "{out}");
        assert!(
            out.contains("2 clients read; 1 failed: Gemini CLI"),
            "{out}"
        );
        assert!(desk.servers.contains_key("stripe") && desk.servers.contains_key("github"));
        assert!(
            !std::fs::read_to_string(&cursor)
                .unwrap()
                .contains("sk_test_allFixture0001")
        );
        assert!(
            !std::fs::read_to_string(&goose)
                .unwrap()
                .contains("ghp_allFixture0002")
        );
        assert!(!out.contains("sk_test_allFixture0001") && !out.contains("ghp_allFixture0002"));

        // Again: nothing to do anywhere; the survey now says protected.
        let mut again = Vec::new();
        install_all(
            &mut desk,
            &places,
            "/usr/bin/countersign",
            false,
            &mut again,
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(again)
                .unwrap()
                .matches("nothing to do")
                .count(),
            2
        );
        let mut listed = Vec::new();
        list(&places, &mut listed).unwrap();
        let listed = String::from_utf8(listed).unwrap();
        assert!(
            listed.contains("protected: 1 of 2 servers through Countersign"),
            "{listed}"
        );

        // Each file comes back byte for byte, as after `install --client X`.
        for (client, path, before) in [
            (countersign_clients::Client::Cursor, &cursor, CURSOR),
            (countersign_clients::Client::Goose, &goose, GOOSE),
        ] {
            let options = Options {
                client,
                path: path.clone(),
                program: "/usr/bin/countersign".into(),
                dry_run: false,
                force: false,
            };
            countersign_clients::uninstall(&mut desk, &options, &mut Vec::new()).unwrap();
            assert_eq!(std::fs::read_to_string(path).unwrap(), before);
        }
    }
}
