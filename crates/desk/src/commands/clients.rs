//! Settings → Clients: the MCP clients whose configuration the desk finds on this account, and
//! Protect and Restore, which do in the desk what `countersign install --client X` and
//! `countersign uninstall --client X` do from a terminal (the same library,
//! `countersign_clients`), and show what they printed.
//!
//! The desk asks its own registry as the command line asks it over the socket ([`InDesk`]
//! implements `Registrar` with `Registry::handle`): a new server name takes effect at once; one
//! registered already under another spec is a change shown in this same window, which takes
//! effect when the person approves it. So Protect runs on the blocking pool, never on the UI
//! thread, and may wait for that click.
//!
//! Where the files are: under the account's home as the password database records it, never
//! `$HOME`, `$XDG_CONFIG_HOME` or `$CODEX_HOME` (a gateway, the agent's process, may have started
//! the desk with an environment of its choosing). For tests, a debug build takes the home from
//! [`CLIENTS_HOME_ENV`] (then `.config` and `.codex` under it); a release build ignores it.
#![allow(unsafe_code)] // this module reaches the OS through libc; each unsafe block says why it is sound

use std::path::PathBuf;

use countersign_clients::{
    self as clients, Client, ClientState, InstallError, Options, Places, Registrar, Surveyed,
};
use countersign_registry::Registry;
use countersign_wire::{DeskError, RegistryAnswer, RegistryRequest};
use serde::Serialize;

use crate::Desk;
use crate::commands::off_the_ui;
use crate::ui_code::{UiCode, UiError};
use crate::view::{Shown, shown};

/// In debug builds only: the home directory the desk looks for clients' configurations under,
/// instead of the account's own (tests point it at a fake home). Absent from release builds.
#[cfg(debug_assertions)]
pub const CLIENTS_HOME_ENV: &str = "COUNTERSIGN_CLIENTS_HOME";

/// The directories clients keep their configuration in, for this account.
fn places() -> Result<Places, UiError> {
    let home = match test_home() {
        Some(home) => home,
        None => {
            // SAFETY: getuid has no preconditions and cannot fail.
            let uid = unsafe { libc::getuid() };
            countersign_wire::account_home(uid)
                .ok()
                .flatten()
                .ok_or_else(|| {
                    UiError::new(
                        UiCode::Io,
                        format!(
                            "uid {uid} has no home directory in the password database: no \
                             client configuration can be found"
                        ),
                    )
                })?
        }
    };
    Ok(Places {
        config_home: home.join(".config"),
        codex_home: home.join(".codex"),
        macos: cfg!(target_os = "macos"),
        home,
    })
}

#[cfg(debug_assertions)]
fn test_home() -> Option<PathBuf> {
    std::env::var_os(CLIENTS_HOME_ENV)
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .filter(|h| h.is_absolute())
}

#[cfg(not(debug_assertions))]
fn test_home() -> Option<PathBuf> {
    None
}

/// The `countersign` program the rewritten entries start: the one installed beside the desk,
/// else whichever `countersign` the client finds on its PATH.
fn program() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("countersign")))
        .filter(|p| p.is_file())
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "countersign".into())
}

/// A client, as Settings → Clients lists it: what `countersign clients` prints for it (the same
/// survey, `countersign_clients::survey`).
#[derive(Debug, Clone, Serialize)]
pub struct ClientView {
    /// Its name on the command line (`claude-desktop`): what Protect and Restore are asked with.
    pub id: &'static str,
    /// The name a person knows (`Claude Desktop`).
    pub title: &'static str,
    /// Its configuration file (a path under the home, shown escaped like any other text).
    pub path: Shown,
    /// Whether that file exists.
    pub exists: bool,
    /// How many MCP servers it has.
    pub servers: usize,
    /// How many of them already go through Countersign (`countersign mcp ...`).
    pub protected: usize,
    /// How many Protect would leave as they are.
    pub left: usize,
    /// Those entries, each with why and the next move.
    pub left_alone: Vec<LeftAloneView>,
    /// Why the file cannot be read, when it cannot.
    pub problem: Option<Shown>,
}

/// An entry Protect leaves as it is.
#[derive(Debug, Clone, Serialize)]
pub struct LeftAloneView {
    /// Where it is in the file (`mcpServers.github`).
    pub at: Shown,
    /// Why it is left.
    pub why: Shown,
    /// What the person can do, when `why` does not say it.
    pub next: Option<Shown>,
}

fn view_of(surveyed: Surveyed) -> ClientView {
    let client = surveyed.client;
    let mut view = ClientView {
        id: client.id(),
        title: client.title(),
        path: shown(&surveyed.path.display().to_string()),
        exists: surveyed.state != ClientState::NotFound,
        servers: 0,
        protected: 0,
        left: 0,
        left_alone: Vec::new(),
        problem: None,
    };
    match surveyed.state {
        ClientState::NotFound => {}
        ClientState::Unreadable(why) => view.problem = Some(shown(&why)),
        ClientState::Read(entries) => {
            view.servers = entries.servers();
            view.protected = entries.protected.len();
            view.left = entries.left.len();
            view.left_alone = entries
                .left
                .iter()
                .map(|(at, left)| LeftAloneView {
                    at: shown(&at.to_string()),
                    why: shown(&left.why),
                    next: left.next.map(shown),
                })
                .collect();
        }
    }
    view
}

/// Every client, those found on this account first (each group in the table's order).
fn list() -> Result<Vec<ClientView>, UiError> {
    let places = places()?;
    let mut views: Vec<ClientView> = clients::survey(&places).into_iter().map(view_of).collect();
    views.sort_by_key(|v| !v.exists);
    Ok(views)
}

/// The desk's own registry, asked as the command line asks it over the socket.
struct InDesk {
    registry: Registry,
    origin: String,
}

impl Registrar for InDesk {
    fn ask(
        &mut self,
        request: RegistryRequest,
        waiting: &mut dyn FnMut(&str),
    ) -> Result<RegistryAnswer, DeskError> {
        // On the blocking pool (see `off_the_ui`): a change to a registered server waits here
        // for the person's click in the window.
        let answer = tokio::runtime::Handle::current().block_on(self.registry.handle(
            request,
            &self.origin,
            |answer| {
                if let RegistryAnswer::Waiting { message } = &answer {
                    waiting(message);
                }
            },
        ));
        Ok(answer)
    }
}

/// What Protect or Restore did: the lines it printed, and the clients as they are now.
#[derive(Debug, Clone, Serialize)]
pub struct ClientAction {
    /// What `countersign install` or `uninstall` would have printed, line by line, each shown
    /// escaped (a configuration's keys and paths are the file's own text).
    pub lines: Vec<Shown>,
    /// The clients, after.
    pub clients: Vec<ClientView>,
}

/// The stable code of an install or uninstall error, for the window to branch on.
fn code_of(e: &InstallError) -> UiCode {
    match e {
        InstallError::NoConfig { .. } => UiCode::NoConfig,
        InstallError::Read { .. } | InstallError::Write { .. } => UiCode::Io,
        InstallError::Parse { .. } => UiCode::BadConfig,
        InstallError::Desk(_) => UiCode::Internal,
        InstallError::Refused { code, .. } => UiCode::from(*code),
        InstallError::Denied { .. } => UiCode::Denied,
        InstallError::ChangedMeanwhile { .. } => UiCode::ChangedMeanwhile,
        InstallError::NoBackup { .. } => UiCode::NoBackup,
        InstallError::EditedSinceInstall { .. } => UiCode::EditedSinceInstall,
        InstallError::BadBackup { .. } => UiCode::BadBackup,
        _ => UiCode::Internal,
    }
}

fn lines_of(out: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(out)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Which of the two the person asked for.
#[derive(Clone, Copy)]
enum Step {
    Protect,
    Restore { force: bool },
}

fn run(registry: &Registry, id: &str, step: Step) -> Result<ClientAction, UiError> {
    let client = Client::from_id(id)
        .ok_or_else(|| UiError::new(UiCode::BadRequest, format!("no client is called {id:?}")))?;
    let options = Options {
        client,
        path: client.user_config(&places()?),
        program: program(),
        dry_run: false,
        force: matches!(step, Step::Restore { force: true }),
    };
    let mut registrar = InDesk {
        registry: registry.clone(),
        origin: format!(
            "the desk's settings view ({} {})",
            match step {
                Step::Protect => "Protect",
                Step::Restore { .. } => "Restore",
            },
            client.title()
        ),
    };
    let mut out = Vec::new();
    let done = match step {
        Step::Protect => clients::install(&mut registrar, &options, &mut out),
        Step::Restore { .. } => clients::uninstall(&mut registrar, &options, &mut out),
    };
    let mut lines = lines_of(&out);
    match done {
        Ok(()) => {
            tracing::info!(target: "desk", client = id, "client configuration changed in the settings view");
            Ok(ClientAction {
                lines: lines.iter().map(|l| shown(l)).collect(),
                clients: list()?,
            })
        }
        Err(e) => {
            // Never a secret: install's errors and summary name keys, paths and codes only.
            lines.push(e.to_string());
            let message = lines
                .iter()
                .map(|l| shown(l).text)
                .collect::<Vec<_>>()
                .join("\n");
            Err(UiError::new(code_of(&e), message))
        }
    }
}

/// The clients found on this account.
pub async fn clients() -> Result<Vec<ClientView>, UiError> {
    off_the_ui(list).await
}

/// Protect: registers each of the client's servers in the desk (their environment values and
/// headers into the keychain), keeps the original file in the keychain, and rewrites each entry
/// to `countersign mcp --server NAME`.
pub async fn protect_client(desk: &Desk, id: String) -> Result<ClientAction, UiError> {
    let registry = desk.registry.clone();
    off_the_ui(move || run(&registry, &id, Step::Protect)).await
}

/// Restore: the client's file as it was before Protect, byte for byte (`force`: even when it
/// was edited since, losing those edits). The servers stay registered.
pub async fn restore_client(desk: &Desk, id: String, force: bool) -> Result<ClientAction, UiError> {
    let registry = desk.registry.clone();
    off_the_ui(move || run(&registry, &id, Step::Restore { force })).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::contract::{expected, keys};

    #[test]
    fn the_window_receives_exactly_the_fields_of_its_contract() {
        let view = ClientView {
            id: "claude-desktop",
            title: "Claude Desktop",
            path: shown("/home/a/.config/Claude/claude_desktop_config.json"),
            exists: true,
            servers: 2,
            protected: 1,
            left: 1,
            left_alone: vec![LeftAloneView {
                at: shown("mcpServers.events"),
                why: shown("it is an SSE server"),
                next: Some(shown("keep it")),
            }],
            problem: Some(shown("x")),
        };
        let action = serde_json::to_value(ClientAction {
            lines: vec![shown("Claude Desktop: /x")],
            clients: vec![view],
        })
        .unwrap();
        assert_eq!(keys(&action), expected("ClientAction"));
        assert_eq!(keys(&action["clients"][0]), expected("ClientView"));
        assert_eq!(keys(&action["clients"][0]["path"]), expected("Shown"));
        assert_eq!(
            keys(&action["clients"][0]["left_alone"][0]),
            expected("LeftAloneView")
        );
        assert_eq!(keys(&action["lines"][0]), expected("Shown"));
    }

    #[test]
    fn a_summary_line_with_direction_changing_characters_is_shown_escaped() {
        let lines =
            lines_of("  already through Countersign: mcpServers[\"a\u{202e}b\"]\n".as_bytes());
        let line = shown(&lines[0]);
        assert!(!line.text.contains('\u{202e}'), "{}", line.text);
        assert!(!line.flags.is_empty());
    }
}
