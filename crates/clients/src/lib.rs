//! The MCP clients whose configuration Countersign can protect in one step, where each keeps that
//! configuration, what a server entry in it means, and how it is rewritten and restored:
//! `countersign install --client NAME` and `uninstall` on the command line, Protect and Restore in
//! the desk's Settings → Clients.
//!
//! Why a crate of its own: both the command line and the desk rewrite these files, and neither
//! should link the other. The `countersign` binary is what agents start, so it stays small; the
//! desk is the authority, so it links nothing of the pipe. Each asks the desk's registry in its
//! own way (over the socket, or in the desk's own process) through [`Registrar`].
//!
//! An agent's client config usually holds each server's command and its credentials, so the agent
//! can reach the service around Countersign. Installing moves every server into the desk's
//! registry (each environment value and header into the keychain) and leaves the client only
//! `countersign mcp --server NAME`. The files are people's own, edited by hand and by the clients:
//! every other key, value, comment and blank line stays as it was, so the edit is made in place
//! on a lossless syntax tree (`jsonc-parser`'s CST, `toml_edit`, `yaml-edit`'s rowan tree),
//! never by re-serializing. Which client keeps what where is one row per client in [`table`].
#![forbid(unsafe_code)] // nothing here reaches past the safe language; keep it so

mod codex;
mod error;
mod install;
mod json;
mod registrar;
#[cfg(feature = "test-support")]
pub mod stand_in;
mod survey;
pub mod table;
mod undo;
mod yaml;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use countersign_wire::{SecretText, ServerSpec, Setting, Upstream};

pub use error::{BackupError, EditError, ParseError, PutBackError};
pub use install::{
    InstallError, Installation, Options, Registration, backup_key, install, plan, uninstall,
};
pub use registrar::Registrar;
pub use survey::{ClientState, Entries, Surveyed, survey};
use table::{Format, Spec, TABLE};

/// The clients `countersign install` knows. What each keeps where is its row of
/// [`table::TABLE`] ([`Client::spec`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Client {
    /// Claude Desktop: `claude_desktop_config.json`, `mcpServers`.
    ClaudeDesktop,
    /// Claude Code: `~/.claude.json`, `mcpServers` and each project's; or a project's `.mcp.json`.
    ClaudeCode,
    /// Cursor: `~/.cursor/mcp.json`, `mcpServers`.
    Cursor,
    /// VS Code: the user's `mcp.json`, `servers`.
    Vscode,
    /// Windsurf: `~/.codeium/windsurf/mcp_config.json`, `mcpServers`.
    Windsurf,
    /// Codex: `~/.codex/config.toml`, `[mcp_servers.NAME]`.
    Codex,
    /// Zed: `settings.json`, `context_servers`.
    Zed,
    /// Gemini CLI: `~/.gemini/settings.json`, `mcpServers`.
    Gemini,
    /// Cline (the VS Code extension): `cline_mcp_settings.json`, `mcpServers`.
    Cline,
    /// OpenCode: `~/.config/opencode/opencode.json`, `mcp`.
    Opencode,
    /// Crush: `~/.config/crush/crush.json`, `mcp`.
    Crush,
    /// Goose: `~/.config/goose/config.yaml`, `extensions`.
    Goose,
    /// Continue: `~/.continue/config.yaml`, the `mcpServers` list.
    Continue,
    /// Roo Code (the VS Code extension): `mcp_settings.json`, `mcpServers`.
    RooCode,
    /// Kilo Code (the VS Code extension): `mcp_settings.json`, `mcpServers`.
    KiloCode,
    /// Kilo Code's command line: `~/.kilocode/cli/global/settings/mcp_settings.json`.
    KiloCodeCli,
    /// Qwen Code: `~/.qwen/settings.json`, `mcpServers`.
    QwenCode,
    /// Amazon Q Developer CLI: `~/.aws/amazonq/mcp.json`, `mcpServers`.
    AmazonQ,
    /// Kiro: `~/.kiro/settings/mcp.json`, `mcpServers`.
    Kiro,
    /// LM Studio: `~/.lmstudio/mcp.json`, `mcpServers`.
    LmStudio,
    /// Factory Droid: `~/.factory/mcp.json`, `mcpServers`.
    FactoryDroid,
    /// GitHub Copilot CLI: `~/.copilot/mcp-config.json`, `mcpServers`.
    CopilotCli,
    /// Antigravity: `~/.gemini/antigravity/mcp_config.json`, `mcpServers`.
    Antigravity,
    /// JetBrains Junie: `~/.junie/mcp/mcp.json`, `mcpServers`.
    Junie,
    /// Amp: `~/.config/amp/settings.json`, `amp.mcpServers`.
    Amp,
    /// Trae: the user's `mcp.json`, `mcpServers`.
    Trae,
    /// VS Code Insiders: the user's `mcp.json`, `servers`.
    VscodeInsiders,
    /// BoltAI: `~/.boltai/mcp.json`, `mcpServers`.
    Boltai,
    /// AnythingLLM Desktop: `anythingllm_mcp_servers.json`, `mcpServers`.
    Anythingllm,
    /// MCPHub for Neovim: `~/.config/mcphub/servers.json`, `mcpServers`.
    Mcphub,
    /// Augment's Auggie CLI: `~/.augment/settings.json`, `mcpServers`.
    Augment,
}

/// Every client, in the order `--help` lists them.
pub const ALL: [Client; 31] = [
    Client::ClaudeDesktop,
    Client::ClaudeCode,
    Client::Cursor,
    Client::Vscode,
    Client::Windsurf,
    Client::Codex,
    Client::Zed,
    Client::Gemini,
    Client::Cline,
    Client::Opencode,
    Client::Crush,
    Client::Goose,
    Client::Continue,
    Client::RooCode,
    Client::KiloCode,
    Client::KiloCodeCli,
    Client::QwenCode,
    Client::AmazonQ,
    Client::Kiro,
    Client::LmStudio,
    Client::FactoryDroid,
    Client::CopilotCli,
    Client::Antigravity,
    Client::Junie,
    Client::Amp,
    Client::Trae,
    Client::VscodeInsiders,
    Client::Boltai,
    Client::Anythingllm,
    Client::Mcphub,
    Client::Augment,
];

/// The directories a client's configuration is found from, read from the environment in one
/// place ([`Places::here`]) so that the table below stays a pure function of them.
#[derive(Debug, Clone)]
pub struct Places {
    /// The home directory.
    pub home: PathBuf,
    /// `$XDG_CONFIG_HOME`, else `~/.config`.
    pub config_home: PathBuf,
    /// `$CODEX_HOME`, else `~/.codex`.
    pub codex_home: PathBuf,
    /// Whether the paths are macOS's (`~/Library/Application Support/...`).
    pub macos: bool,
}

impl Places {
    /// This process's: `$HOME` (what the clients themselves use), `$XDG_CONFIG_HOME`,
    /// `$CODEX_HOME`.
    pub fn here() -> Option<Places> {
        let home = std::env::home_dir().filter(|h| !h.as_os_str().is_empty())?;
        let var = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
        };
        Some(Places {
            config_home: var("XDG_CONFIG_HOME").unwrap_or_else(|| home.join(".config")),
            codex_home: var("CODEX_HOME").unwrap_or_else(|| home.join(".codex")),
            macos: cfg!(target_os = "macos"),
            home,
        })
    }

    /// macOS's `~/Library/Application Support`, or the XDG config directory elsewhere.
    fn app_config(&self) -> PathBuf {
        if self.macos {
            self.home.join("Library/Application Support")
        } else {
            self.config_home.clone()
        }
    }
}

impl Client {
    /// This client's row of the table: where it keeps what.
    pub fn spec(self) -> &'static Spec {
        let row = &TABLE[self as usize];
        debug_assert_eq!(row.client, self, "the table is in the order of ALL");
        row
    }

    /// The name on the command line (`claude-desktop`).
    pub fn id(self) -> &'static str {
        self.spec().id
    }

    /// The name a person knows (`Claude Desktop`).
    pub fn title(self) -> &'static str {
        self.spec().title
    }

    /// The client whose command-line name is `id`.
    pub fn from_id(id: &str) -> Option<Client> {
        ALL.into_iter().find(|c| c.id() == id)
    }

    /// The user's configuration file of this client.
    pub fn user_config(self, places: &Places) -> PathBuf {
        let (base, rel) = self.spec().file;
        let dir = match base {
            table::Base::Home => places.home.clone(),
            table::Base::ConfigHome => places.config_home.clone(),
            table::Base::AppConfig => places.app_config(),
            table::Base::CodexHome => places.codex_home.clone(),
        };
        dir.join(rel)
    }

    /// The configuration file of a project in `dir`, for the clients that read one.
    pub fn project_config(self, dir: &Path) -> Option<PathBuf> {
        self.spec().project.map(|file| dir.join(file))
    }
}

impl fmt::Display for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

/// Where an entry is in its file: the keys down to the object of entries, and its own key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct EntryAt {
    /// The keys from the top of the file to the object holding the entry.
    pub parents: Vec<String>,
    /// The entry's key: the client's name for the server.
    pub key: String,
}

impl fmt::Display for EntryAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, part) in self.parents.iter().chain([&self.key]).enumerate() {
            let plain = !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
            match (i, plain) {
                (0, true) => f.write_str(part)?,
                (_, true) => write!(f, ".{part}")?,
                (_, false) => write!(f, "[{part:?}]")?,
            }
        }
        Ok(())
    }
}

/// What one entry of a client's configuration is.
pub enum Found {
    /// Already `countersign mcp ...`: left alone.
    Wrapped,
    /// Something install leaves as it is, and why.
    Left(Leave),
    /// A server to register: its spec (every environment value and header secret) and those
    /// values.
    Server(Server),
}

/// Why an entry is left as it is, and what the person can do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leave {
    /// Why (never a value of the entry: it may be a secret one).
    pub why: String,
    /// The next move, when `why` does not already say it.
    pub next: Option<&'static str>,
}

impl Leave {
    /// `why`, with the next move.
    pub(crate) fn then(why: impl Into<String>, next: &'static str) -> Leave {
        Leave {
            why: why.into(),
            next: Some(next),
        }
    }
}

impl From<String> for Leave {
    fn from(why: String) -> Leave {
        Leave { why, next: None }
    }
}

impl From<&str> for Leave {
    fn from(why: &str) -> Leave {
        Leave::from(why.to_owned())
    }
}

/// The next move for an entry the client cannot be told how to reach through the desk.
pub(crate) const FIX_BY_HAND: &str =
    "correct the entry so that the client reads it, then run install again";

/// A server read from a client's entry.
pub struct Server {
    /// What the desk will run or reach.
    pub spec: ServerSpec,
    /// The value of each secret key of `spec`.
    pub secrets: BTreeMap<String, SecretText>,
}

/// How an entry reaches its server, as read from the file, before it becomes a [`Server`].
pub(crate) enum Reach {
    Command {
        program: String,
        args: Vec<String>,
        cwd: Option<String>,
        env: Vec<(String, String)>,
    },
    Url {
        url: String,
        headers: Vec<(String, String)>,
    },
}

/// Whether `program args` is already the gateway: `countersign mcp ...`.
pub(crate) fn is_wrapped(program: &str, args: &[String]) -> bool {
    let base = program.rsplit(['/', '\\']).next().unwrap_or(program);
    matches!(base, "countersign" | "countersign.exe") && args.first().is_some_and(|a| a == "mcp")
}

/// Whether `text` holds something `client` replaces before starting a server.
fn expands(client: Client, text: &str) -> bool {
    let expansion = client.spec().expansion;
    let dollar = expansion.dollar
        && text
            .as_bytes()
            .windows(2)
            .any(|w| w[0] == b'$' && (w[1] == b'{' || w[1] == b'_' || w[1].is_ascii_alphabetic()));
    dollar || expansion.markers.iter().any(|m| text.contains(m))
}

/// Turns what an entry says into a server for the desk, or the reason it is left as it is.
pub(crate) fn server_of(client: Client, reach: Reach) -> Found {
    let (texts, parts): (Vec<&str>, _) = match &reach {
        Reach::Command {
            program,
            args,
            cwd,
            env,
        } => {
            let mut t = vec![program.as_str()];
            t.extend(args.iter().map(String::as_str));
            t.extend(cwd.as_deref());
            t.extend(env.iter().map(|(_, v)| v.as_str()));
            (t, "its command, arguments or environment refer")
        }
        Reach::Url { url, headers } => {
            let mut t = vec![url.as_str()];
            t.extend(headers.iter().map(|(_, v)| v.as_str()));
            (t, "its URL or headers refer")
        }
    };
    let inherited = client.spec().expansion.empty
        && matches!(&reach, Reach::Command { env, .. } if env.iter().any(|(_, v)| v.is_empty()));
    if inherited {
        return Found::Left(
            format!(
                "its environment leaves a value empty (or `null`) for {} to take from its own \
                 environment; register it with `countersign server add` and the value instead",
                client.title()
            )
            .into(),
        );
    }
    if texts.iter().any(|t| expands(client, t)) {
        // Never say which value: it may be a secret one.
        return Found::Left(
            format!(
                "{parts} to a variable that {} fills in itself (`$...`); register it with \
                 `countersign server add` instead",
                client.title()
            )
            .into(),
        );
    }
    let secrets_of = |pairs: Vec<(String, String)>| {
        let mut settings = BTreeMap::new();
        let mut secrets = BTreeMap::new();
        for (key, value) in pairs {
            settings.insert(key.clone(), Setting::Secret);
            secrets.insert(key, SecretText::new(value));
        }
        (settings, secrets)
    };
    let (upstream, secrets) = match reach {
        Reach::Command {
            program,
            args,
            cwd,
            env,
        } => {
            let (env, secrets) = secrets_of(env);
            let mut command = vec![program];
            command.extend(args);
            (Upstream::Stdio { command, cwd, env }, secrets)
        }
        Reach::Url { url, headers } => {
            let (headers, secrets) = secrets_of(headers);
            (Upstream::Http { url, headers }, secrets)
        }
    };
    let spec = ServerSpec { upstream };
    // The desk checks the same; checking here leaves such an entry alone instead of stopping
    // the whole install halfway.
    if let Err(e) = spec.check().and_then(|()| spec.check_secrets(&secrets)) {
        return Found::Left(Leave::then(
            format!("the desk would not accept it: {e}"),
            "register it with `countersign server add`, which says what to change",
        ));
    }
    Found::Server(Server { spec, secrets })
}

/// A registry name from a client's key for a server: what [`countersign_wire::check_name`]
/// accepts, as close to the key as it can be.
pub fn name_from_key(key: &str) -> String {
    // Cline names a server by where it came from (`github.com/org/repo/tree/main/src/x`): the
    // last part is the name a person would give it.
    let key = key
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|last| !last.is_empty())
        .unwrap_or(key);
    let mut name: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let start = name
        .find(|c: char| c.is_ascii_alphanumeric())
        .unwrap_or(name.len());
    name.drain(..start);
    name.truncate(countersign_wire::MAX_NAME - 4); // room for a suffix
    name.truncate(name.trim_end_matches(['-', '.', '_']).len());
    if name.is_empty() {
        name.push_str("server");
    }
    name
}

/// Reads every entry of `client`'s file.
pub(crate) fn read_entries(
    client: Client,
    text: &str,
) -> Result<Vec<(EntryAt, Found)>, ParseError> {
    match client.spec().format {
        Format::Toml => codex::entries(client, text),
        Format::Json => json::entries(client, text),
        Format::Yaml => yaml::entries(client, text),
    }
}

/// The file with each entry in `names` rewritten to `program mcp --server NAME`.
pub(crate) fn rewrite(
    client: Client,
    text: &str,
    names: &[(EntryAt, String)],
    program: &str,
) -> Result<String, EditError> {
    match client.spec().format {
        Format::Toml => codex::rewrite(text, names, program),
        Format::Json => json::rewrite(client, text, names, program),
        Format::Yaml => yaml::rewrite(client, text, names, program),
    }
}

/// The arguments of the gateway for the registered server `name`.
pub(crate) fn gateway_args(name: &str) -> Vec<String> {
    vec!["mcp".into(), "--server".into(), name.into()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn places(macos: bool) -> Places {
        Places {
            home: "/home/alice".into(),
            config_home: "/home/alice/.config".into(),
            codex_home: "/home/alice/.codex".into(),
            macos,
        }
    }

    #[test]
    fn config_paths_follow_the_platform() {
        let linux = places(false);
        let mac = places(true);
        assert_eq!(
            Client::ClaudeDesktop.user_config(&linux),
            Path::new("/home/alice/.config/Claude/claude_desktop_config.json")
        );
        assert_eq!(
            Client::ClaudeDesktop.user_config(&mac),
            Path::new("/home/alice/Library/Application Support/Claude/claude_desktop_config.json")
        );
        assert_eq!(
            Client::Vscode.user_config(&mac),
            Path::new("/home/alice/Library/Application Support/Code/User/mcp.json")
        );
        assert_eq!(
            Client::Zed.user_config(&mac),
            Path::new("/home/alice/.config/zed/settings.json")
        );
        assert_eq!(
            Client::Codex.user_config(&linux),
            Path::new("/home/alice/.codex/config.toml")
        );
        assert_eq!(
            Client::ClaudeCode.project_config(Path::new("/home/alice/app")),
            Some(PathBuf::from("/home/alice/app/.mcp.json"))
        );
        assert_eq!(Client::Windsurf.project_config(Path::new("/x")), None);
    }

    #[test]
    fn every_client_has_its_command_line_name() {
        use clap::ValueEnum;
        for client in ALL {
            let value = client.to_possible_value().unwrap();
            assert_eq!(value.get_name(), client.id());
        }
        assert_eq!(Client::value_variants().len(), ALL.len());
    }

    #[test]
    fn the_table_has_one_row_per_client_in_order() {
        assert_eq!(TABLE.len(), ALL.len());
        for (row, client) in TABLE.iter().zip(ALL) {
            assert_eq!(row.client, client, "{}", row.id);
            assert_eq!(Client::from_id(row.id), Some(client));
            assert!(row.source.starts_with("https://"), "{}", row.id);
            assert!(!row.servers_at.is_empty());
        }
        let mut ids: Vec<_> = ALL.iter().map(|c| c.id()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), ALL.len(), "two clients share a name");
    }

    #[test]
    fn names_from_keys_are_names_the_desk_accepts() {
        for (key, name) in [
            ("github", "github"),
            ("My Server", "My-Server"),
            ("@scope/pkg", "pkg"),
            (
                "github.com/modelcontextprotocol/servers/tree/main/src/brave-search",
                "brave-search",
            ),
            ("a.b-", "a.b"),
            ("__x", "x"),
            ("日本", "server"),
            ("", "server"),
        ] {
            assert_eq!(name_from_key(key), name, "{key:?}");
            countersign_wire::check_name(&name_from_key(key)).unwrap();
        }
        countersign_wire::check_name(&format!("{}-99", name_from_key(&"a".repeat(300)))).unwrap();
    }

    #[test]
    fn only_countersign_mcp_counts_as_wrapped() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(is_wrapped(
            "/usr/local/bin/countersign",
            &args(&["mcp", "--server", "x"])
        ));
        assert!(is_wrapped("countersign", &args(&["mcp", "--", "npx", "y"])));
        assert!(!is_wrapped("countersign", &args(&["desk"])));
        assert!(!is_wrapped("/opt/countersign-tools/npx", &args(&["mcp"])));
    }

    #[test]
    fn an_entry_the_client_expands_is_left_without_naming_its_value() {
        let found = server_of(
            Client::ClaudeCode,
            Reach::Command {
                program: "npx".into(),
                args: vec![],
                cwd: None,
                env: vec![("TOKEN".into(), "${GITHUB_TOKEN}".into())],
            },
        );
        let Found::Left(left) = found else {
            panic!("expected the entry to be left")
        };
        assert!(!left.why.contains("GITHUB_TOKEN"), "{}", left.why);
        // Claude Desktop takes the same text literally.
        assert!(matches!(
            server_of(
                Client::ClaudeDesktop,
                Reach::Command {
                    program: "npx".into(),
                    args: vec![],
                    cwd: None,
                    env: vec![("TOKEN".into(), "a${b".into())],
                }
            ),
            Found::Server(_)
        ));
        assert!(expands(Client::Gemini, "$HOME/x"));
        assert!(!expands(Client::Gemini, "cost: 5$"));
    }
}
