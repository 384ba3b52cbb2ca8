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
//! on a lossless syntax tree (`jsonc-parser`'s CST, `toml_edit`), never by re-serializing.
//!
//! Goose and Continue keep YAML; no YAML editor for Rust keeps comments, so they are not here.
#![deny(missing_docs)]

mod codex;
mod install;
mod json;
mod registrar;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use countersign_wire::{SecretText, ServerSpec, Setting, Upstream};

pub use install::{
    InstallError, Installation, Options, Registration, backup_key, install, plan, uninstall,
};
pub use registrar::Registrar;

/// The clients `countersign install` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

/// Every client, in the order `--help` lists them.
pub const ALL: [Client; 9] = [
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

/// Which `${...}` (or `$VAR`) a client replaces in its entries before it starts a server: the
/// desk would start the server with the text itself, so such an entry is left to the person.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expansion {
    /// None: every string is taken as written.
    None,
    /// `${VAR}`, `${env:VAR}`, `${workspaceFolder}` and the like.
    Braces,
    /// `$VAR` and `${VAR}`.
    Dollar,
}

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
    /// The name on the command line (`claude-desktop`).
    pub fn id(self) -> &'static str {
        match self {
            Client::ClaudeDesktop => "claude-desktop",
            Client::ClaudeCode => "claude-code",
            Client::Cursor => "cursor",
            Client::Vscode => "vscode",
            Client::Windsurf => "windsurf",
            Client::Codex => "codex",
            Client::Zed => "zed",
            Client::Gemini => "gemini",
            Client::Cline => "cline",
        }
    }

    /// The name a person knows (`Claude Desktop`).
    pub fn title(self) -> &'static str {
        match self {
            Client::ClaudeDesktop => "Claude Desktop",
            Client::ClaudeCode => "Claude Code",
            Client::Cursor => "Cursor",
            Client::Vscode => "VS Code",
            Client::Windsurf => "Windsurf",
            Client::Codex => "Codex",
            Client::Zed => "Zed",
            Client::Gemini => "Gemini CLI",
            Client::Cline => "Cline",
        }
    }

    /// The user's configuration file of this client.
    pub fn user_config(self, places: &Places) -> PathBuf {
        let home = &places.home;
        match self {
            Client::ClaudeDesktop => places
                .app_config()
                .join("Claude/claude_desktop_config.json"),
            Client::ClaudeCode => home.join(".claude.json"),
            Client::Cursor => home.join(".cursor/mcp.json"),
            Client::Vscode => places.app_config().join("Code/User/mcp.json"),
            Client::Windsurf => home.join(".codeium/windsurf/mcp_config.json"),
            Client::Codex => places.codex_home.join("config.toml"),
            // Zed keeps `~/.config/zed` on macOS too.
            Client::Zed => places.config_home.join("zed/settings.json"),
            Client::Gemini => home.join(".gemini/settings.json"),
            Client::Cline => places.app_config().join(
                "Code/User/globalStorage/saoudrizwan.claude-dev/settings/cline_mcp_settings.json",
            ),
        }
    }

    /// The configuration file of a project in `dir`, for the clients that read one.
    pub fn project_config(self, dir: &Path) -> Option<PathBuf> {
        let file = match self {
            Client::ClaudeCode => ".mcp.json",
            Client::Cursor => ".cursor/mcp.json",
            Client::Vscode => ".vscode/mcp.json",
            Client::Codex => ".codex/config.toml",
            Client::Zed => ".zed/settings.json",
            Client::Gemini => ".gemini/settings.json",
            Client::ClaudeDesktop | Client::Windsurf | Client::Cline => return None,
        };
        Some(dir.join(file))
    }

    /// Where the server entries are: paths of keys from the top of the file to an object of
    /// entries by name (`*` stands for every key at that level).
    fn servers_at(self) -> &'static [&'static [&'static str]] {
        match self {
            // `~/.claude.json` also holds each project's servers; a project's `.mcp.json` has
            // only the top level, so the same paths serve both.
            Client::ClaudeCode => &[&["mcpServers"], &["projects", "*", "mcpServers"]],
            Client::Vscode => &[&["servers"]],
            Client::Zed => &[&["context_servers"]],
            Client::Codex => &[&["mcp_servers"]],
            _ => &[&["mcpServers"]],
        }
    }

    fn expansion(self) -> Expansion {
        match self {
            Client::ClaudeDesktop | Client::Zed | Client::Cline | Client::Codex => Expansion::None,
            Client::Gemini => Expansion::Dollar,
            Client::ClaudeCode | Client::Cursor | Client::Vscode | Client::Windsurf => {
                Expansion::Braces
            }
        }
    }

    /// Whether its file is TOML (else JSON with comments).
    fn is_toml(self) -> bool {
        self == Client::Codex
    }
}

impl fmt::Display for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

/// Where an entry is in its file: the keys down to the object of entries, and its own key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
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
    Left(String),
    /// A server to register: its spec (every environment value and header secret) and those
    /// values.
    Server(Server),
}

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
    match client.expansion() {
        Expansion::None => false,
        Expansion::Braces => text.contains("${"),
        Expansion::Dollar => text
            .as_bytes()
            .windows(2)
            .any(|w| w[0] == b'$' && (w[1] == b'{' || w[1] == b'_' || w[1].is_ascii_alphabetic())),
    }
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
    if texts.iter().any(|t| expands(client, t)) {
        // Never say which value: it may be a secret one.
        return Found::Left(format!(
            "{parts} to a variable that {} fills in itself (`$...`); register it with \
             `countersign server add` instead",
            client.title()
        ));
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
        return Found::Left(format!("the desk would not accept it: {e}"));
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
pub(crate) fn read_entries(client: Client, text: &str) -> Result<Vec<(EntryAt, Found)>, String> {
    if client.is_toml() {
        codex::entries(client, text)
    } else {
        json::entries(client, text)
    }
}

/// The file with each entry in `names` rewritten to `program mcp --server NAME`.
pub(crate) fn rewrite(
    client: Client,
    text: &str,
    names: &[(EntryAt, String)],
    program: &str,
) -> Result<String, String> {
    if client.is_toml() {
        codex::rewrite(text, names, program)
    } else {
        json::rewrite(client, text, names, program)
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
        let Found::Left(why) = found else {
            panic!("expected the entry to be left")
        };
        assert!(!why.contains("GITHUB_TOKEN"), "{why}");
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
