//! One description per client: where it keeps its servers, in which format, and what an entry
//! says. The code that reads and rewrites files is per format (`json`, `codex`, `yaml`); what
//! differs between clients of one format (the key of the servers, `cmd` or `command`, `env` or
//! `environment`, which `type` a command entry has) is data here, taken from each client's own
//! documentation or source (`source`), so that adding a client is adding a row.
//!
//! Countersign runs on Linux and macOS; the Windows path of each client is kept for the table of
//! clients in docs/clients.md, so a person on Windows can still find the file the client reads.

use crate::Client;

/// How a client's file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// JSON, with the comments and trailing commas some clients accept (JSONC).
    Json,
    /// TOML.
    Toml,
    /// YAML.
    Yaml,
}

impl Format {
    /// How the format is named in the table of clients (docs/clients.md).
    pub fn name(self) -> &'static str {
        match self {
            Format::Json => "JSON",
            Format::Toml => "TOML",
            Format::Yaml => "YAML",
        }
    }
}

/// The directory a client's path starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Base {
    /// The home directory, on every system.
    Home,
    /// `$XDG_CONFIG_HOME` (else `~/.config`), on macOS too.
    ConfigHome,
    /// `~/Library/Application Support` on macOS, the XDG config directory elsewhere.
    AppConfig,
    /// `$CODEX_HOME`, else `~/.codex`.
    CodexHome,
}

/// How the entries sit under their key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// An object (mapping, table) of entries by name.
    ByName,
    /// A list of entries, each naming itself with this key (Continue's `mcpServers: - name: x`).
    List(&'static str),
}

/// What a client replaces in its entries before it starts a server: the desk would start the
/// server with the text itself, so such an entry is left to the person.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Expansion {
    /// `$VAR` (a `$` before a letter, `_` or `{`).
    pub(crate) dollar: bool,
    /// Text that starts a substitution (`${`, `{env:`, `$(`).
    pub(crate) markers: &'static [&'static str],
    /// An empty environment value means "the variable of the same name from the client's own
    /// environment" (MCPHub), so the desk would start the server with nothing there.
    pub(crate) empty: bool,
}

impl Expansion {
    /// Every string taken as written.
    pub(crate) const NONE: Expansion = Expansion {
        dollar: false,
        markers: &[],
        empty: false,
    };
    /// `${VAR}`, `${env:VAR}`, `${workspaceFolder}`, `${{ secrets.X }}` and the like.
    pub(crate) const BRACES: Expansion = Expansion {
        dollar: false,
        markers: &["${"],
        empty: false,
    };
    /// `$VAR` and `${VAR}`.
    pub(crate) const DOLLAR: Expansion = Expansion {
        dollar: true,
        markers: &[],
        empty: false,
    };
}

/// What an entry's keys are called, and what a rewritten entry looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    /// The key of the program (`command`; Goose's `cmd`).
    pub(crate) command: &'static str,
    /// The program and its arguments are one list in `command` (OpenCode).
    pub(crate) argv: bool,
    /// The key of the environment (`env`; OpenCode's `environment`, Goose's `envs`).
    pub(crate) env: &'static str,
    /// The keys that may hold a server's URL, in the order they are looked for.
    pub(crate) url_keys: &'static [&'static str],
    /// The `type` values that mean a command the client starts; the first is what a rewritten
    /// entry gets when its `type` said something else.
    pub(crate) stdio: &'static [&'static str],
    /// Whether a rewritten entry must say its `type` (VS Code reads `type` first; OpenCode and
    /// Goose require it).
    pub(crate) needs_type: bool,
    /// `url` means an SSE server, and `httpUrl` a streamable HTTP one (Gemini CLI, Qwen Code).
    pub(crate) url_is_sse: bool,
    /// Why an entry with neither a command nor a URL is left as it is.
    pub(crate) without_command: &'static str,
}

/// The shape most clients share: Claude Desktop's.
const CLAUDE: Shape = Shape {
    command: "command",
    argv: false,
    env: "env",
    url_keys: &["url", "serverUrl", "httpUrl"],
    stdio: &["stdio"],
    needs_type: false,
    url_is_sse: false,
    without_command: "it has no `command` or URL",
};

/// How much of a row was read in the client's own documentation or source, and not only in
/// third-party write-ups or installers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// The path, the format and the key are all in `source`.
    Own,
    /// All in the client's own documentation or source: `source`, and what this says besides.
    OwnAnd(&'static str),
    /// Only part is; this says which part, and where the rest is from.
    Partly(&'static str),
    /// None of it could be read in the client's own documentation or source; this says where it
    /// is from.
    Not(&'static str),
}

impl Checked {
    /// How the table of clients (docs/clients.md) says it.
    pub fn cell(self) -> &'static str {
        match self {
            Checked::Own | Checked::OwnAnd(_) => "yes",
            Checked::Partly(_) => "partly (below)",
            Checked::Not(_) => "**no** (below)",
        }
    }

    /// The sentence beneath the table, if the row needs one.
    pub fn sentence(self) -> Option<String> {
        match self {
            Checked::Own => None,
            Checked::OwnAnd(what) => Some(format!("confirmed from its own docs and {what}")),
            Checked::Partly(what) => Some(format!("partly confirmed: {what}")),
            Checked::Not(what) => {
                Some(format!("not confirmed from its own docs or source: {what}"))
            }
        }
    }
}

/// One client.
#[derive(Debug)]
pub struct Spec {
    /// The client this row describes (the table is in the order of [`crate::ALL`]).
    pub(crate) client: Client,
    /// Its name on the command line.
    pub id: &'static str,
    /// The name a person knows.
    pub title: &'static str,
    /// Where the path and the shape were read: the client's documentation or source.
    pub source: &'static str,
    /// How much of this row `source` (the client's own documentation or source) confirms.
    pub checked: Checked,
    /// What else a person should know about the file (another file the client also reads).
    pub note: Option<&'static str>,
    /// The user's configuration file on Linux and macOS.
    pub(crate) file: (Base, &'static str),
    /// The same file on Windows (for docs/clients.md; Countersign does not run there).
    pub windows: &'static str,
    /// A project's configuration file, relative to the project, for the clients that read one.
    pub(crate) project: Option<&'static str>,
    /// The file's format.
    pub format: Format,
    /// Where the entries are: paths of keys from the top of the file (`*` stands for every key
    /// at that level).
    pub(crate) servers_at: &'static [&'static [&'static str]],
    /// How the entries sit there.
    pub(crate) layout: Layout,
    /// What an entry's keys are called.
    pub(crate) shape: Shape,
    /// What the client replaces before it starts a server.
    pub(crate) expansion: Expansion,
}

impl Spec {
    /// The user's file on Linux and macOS as docs/clients.md shows it (`~/...`).
    pub fn unix_paths(&self) -> (String, String) {
        let (base, rel) = self.file;
        let linux = match base {
            Base::Home => format!("~/{rel}"),
            Base::ConfigHome | Base::AppConfig => format!("~/.config/{rel}"),
            Base::CodexHome => format!("~/.codex/{rel}"),
        };
        let mac = match base {
            Base::AppConfig => format!("~/Library/Application Support/{rel}"),
            _ => linux.clone(),
        };
        (linux, mac)
    }

    /// Where the servers are in the file, as docs/clients.md shows it.
    pub fn servers_key(&self) -> String {
        let paths: Vec<String> = self
            .servers_at
            .iter()
            .map(|path| {
                path.iter()
                    .map(|k| {
                        if k.contains('.') {
                            format!("\"{k}\"")
                        } else {
                            (*k).to_owned()
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(".")
            })
            .collect();
        let list = match self.layout {
            Layout::ByName => "",
            Layout::List(_) => " (a list)",
        };
        format!("{}{list}", paths.join(", "))
    }
}

/// VS Code's extensions keep their settings under its global storage.
macro_rules! vscode_storage {
    ($ext:literal, $file:literal) => {
        concat!("Code/User/globalStorage/", $ext, "/settings/", $file)
    };
}

/// Every client, in the order of [`crate::ALL`].
pub(crate) static TABLE: [Spec; 31] = [
    Spec {
        client: Client::ClaudeDesktop,
        id: "claude-desktop",
        title: "Claude Desktop",
        source: "https://modelcontextprotocol.io/quickstart/user",
        checked: Checked::Own,
        note: None,
        file: (Base::AppConfig, "Claude/claude_desktop_config.json"),
        windows: r"%APPDATA%\Claude\claude_desktop_config.json",
        project: None,
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        expansion: Expansion::NONE,
    },
    Spec {
        client: Client::ClaudeCode,
        id: "claude-code",
        title: "Claude Code",
        source: "https://docs.anthropic.com/en/docs/claude-code/mcp",
        checked: Checked::Own,
        note: None,
        file: (Base::Home, ".claude.json"),
        windows: r"%USERPROFILE%\.claude.json",
        project: Some(".mcp.json"),
        format: Format::Json,
        // `~/.claude.json` also holds each project's servers; a project's `.mcp.json` has only
        // the top level, so the same paths serve both.
        servers_at: &[&["mcpServers"], &["projects", "*", "mcpServers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::Cursor,
        id: "cursor",
        title: "Cursor",
        source: "https://docs.cursor.com/context/model-context-protocol",
        checked: Checked::Own,
        note: None,
        file: (Base::Home, ".cursor/mcp.json"),
        windows: r"%USERPROFILE%\.cursor\mcp.json",
        project: Some(".cursor/mcp.json"),
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::Vscode,
        id: "vscode",
        title: "VS Code",
        source: "https://code.visualstudio.com/docs/copilot/customization/mcp-servers",
        checked: Checked::Own,
        note: None,
        file: (Base::AppConfig, "Code/User/mcp.json"),
        windows: r"%APPDATA%\Code\User\mcp.json",
        project: Some(".vscode/mcp.json"),
        format: Format::Json,
        servers_at: &[&["servers"]],
        layout: Layout::ByName,
        shape: Shape {
            needs_type: true,
            ..CLAUDE
        },
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::Windsurf,
        id: "windsurf",
        title: "Windsurf",
        source: "https://docs.windsurf.com/windsurf/cascade/mcp",
        checked: Checked::Own,
        note: None,
        file: (Base::Home, ".codeium/windsurf/mcp_config.json"),
        windows: r"%USERPROFILE%\.codeium\windsurf\mcp_config.json",
        project: None,
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::Codex,
        id: "codex",
        title: "Codex",
        source: "https://github.com/openai/codex/blob/main/docs/config.md",
        checked: Checked::Own,
        note: None,
        file: (Base::CodexHome, "config.toml"),
        windows: r"%USERPROFILE%\.codex\config.toml",
        project: Some(".codex/config.toml"),
        format: Format::Toml,
        servers_at: &[&["mcp_servers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        expansion: Expansion::NONE,
    },
    Spec {
        client: Client::Zed,
        id: "zed",
        title: "Zed",
        source: "https://zed.dev/docs/ai/mcp",
        checked: Checked::Own,
        note: None,
        // Zed keeps `~/.config/zed` on macOS too.
        file: (Base::ConfigHome, "zed/settings.json"),
        windows: r"%APPDATA%\Zed\settings.json",
        project: Some(".zed/settings.json"),
        format: Format::Json,
        servers_at: &[&["context_servers"]],
        layout: Layout::ByName,
        shape: Shape {
            without_command: "a Zed extension provides it, and only the extension knows its command",
            ..CLAUDE
        },
        expansion: Expansion::NONE,
    },
    Spec {
        client: Client::Gemini,
        id: "gemini",
        title: "Gemini CLI",
        source: "https://github.com/google-gemini/gemini-cli/blob/main/docs/tools/mcp-server.md",
        checked: Checked::Own,
        note: None,
        file: (Base::Home, ".gemini/settings.json"),
        windows: r"%USERPROFILE%\.gemini\settings.json",
        project: Some(".gemini/settings.json"),
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: Shape {
            url_is_sse: true,
            ..CLAUDE
        },
        expansion: Expansion::DOLLAR,
    },
    Spec {
        client: Client::Cline,
        id: "cline",
        title: "Cline",
        source: "https://docs.cline.bot/mcp/configuring-mcp-servers",
        checked: Checked::Own,
        note: None,
        file: (
            Base::AppConfig,
            vscode_storage!("saoudrizwan.claude-dev", "cline_mcp_settings.json"),
        ),
        windows: r"%APPDATA%\Code\User\globalStorage\saoudrizwan.claude-dev\settings\cline_mcp_settings.json",
        project: None,
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        expansion: Expansion::NONE,
    },
    Spec {
        client: Client::Opencode,
        id: "opencode",
        title: "OpenCode",
        source: "https://opencode.ai/docs/mcp-servers/",
        checked: Checked::Own,
        note: Some("OpenCode also reads `opencode.jsonc` beside it; use `--config` for that file"),
        file: (Base::ConfigHome, "opencode/opencode.json"),
        windows: r"%USERPROFILE%\.config\opencode\opencode.json",
        project: Some("opencode.json"),
        format: Format::Json,
        // Version 2 of its config puts the entries one level down, under `servers`.
        servers_at: &[&["mcp", "servers"], &["mcp"]],
        layout: Layout::ByName,
        shape: Shape {
            argv: true,
            env: "environment",
            url_keys: &["url"],
            stdio: &["local"],
            needs_type: true,
            ..CLAUDE
        },
        // `{env:VAR}` and `{file:path}` anywhere in the config.
        expansion: Expansion {
            dollar: false,
            markers: &["{env:", "{file:"],
            empty: false,
        },
    },
    Spec {
        client: Client::Crush,
        id: "crush",
        title: "Crush",
        source: "https://github.com/charmbracelet/crush#mcps",
        checked: Checked::Own,
        note: None,
        file: (Base::ConfigHome, "crush/crush.json"),
        windows: r"%LOCALAPPDATA%\crush\crush.json",
        project: Some(".crush.json"),
        format: Format::Json,
        servers_at: &[&["mcp"]],
        layout: Layout::ByName,
        shape: Shape {
            url_keys: &["url"],
            ..CLAUDE
        },
        // `$VAR`, `${VAR}` and `$(command)` in commands, environments and headers.
        expansion: Expansion {
            dollar: true,
            markers: &["$("],
            empty: false,
        },
    },
    Spec {
        client: Client::Goose,
        id: "goose",
        title: "Goose",
        source: "https://block.github.io/goose/docs/guides/config-files",
        checked: Checked::Own,
        note: None,
        file: (Base::ConfigHome, "goose/config.yaml"),
        windows: r"%APPDATA%\Block\goose\config\config.yaml",
        project: None,
        format: Format::Yaml,
        servers_at: &[&["extensions"]],
        layout: Layout::ByName,
        shape: Shape {
            command: "cmd",
            env: "envs",
            url_keys: &["uri"],
            needs_type: true,
            without_command: "Goose runs it itself (a built-in or platform extension)",
            ..CLAUDE
        },
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::Continue,
        id: "continue",
        title: "Continue",
        source: "https://docs.continue.dev/reference#mcpservers",
        checked: Checked::Own,
        note: Some(
            "Continue also reads one file per server from `~/.continue/mcpServers/`; those are \
             not rewritten",
        ),
        file: (Base::Home, ".continue/config.yaml"),
        windows: r"%USERPROFILE%\.continue\config.yaml",
        project: None,
        format: Format::Yaml,
        servers_at: &[&["mcpServers"]],
        layout: Layout::List("name"),
        shape: Shape {
            url_keys: &["url"],
            ..CLAUDE
        },
        // `${{ secrets.NAME }}` and `${{ inputs.NAME }}`.
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::RooCode,
        id: "roo-code",
        title: "Roo Code",
        source: "https://docs.roocode.com/features/mcp/using-mcp-in-roo",
        checked: Checked::OwnAnd(
            "its source: the extension id `RooVeterinaryInc.roo-cline` in `src/package.json` of \
             RooCodeInc/Roo-Code (VS Code names the storage folder by the id in lower case), and \
             `mcp_settings.json` in the `settings` folder of that storage",
        ),
        note: None,
        file: (
            Base::AppConfig,
            vscode_storage!("rooveterinaryinc.roo-cline", "mcp_settings.json"),
        ),
        windows: r"%APPDATA%\Code\User\globalStorage\rooveterinaryinc.roo-cline\settings\mcp_settings.json",
        project: Some(".roo/mcp.json"),
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::KiloCode,
        id: "kilo-code",
        title: "Kilo Code",
        source: "https://kilo.ai/docs/features/mcp/using-mcp-in-kilo-code",
        checked: Checked::OwnAnd(
            "its source: the extension id `kilocode.kilo-code` (publisher and name in \
             `src/package.json` of Kilo-Org/kilocode)",
        ),
        note: None,
        file: (
            Base::AppConfig,
            vscode_storage!("kilocode.kilo-code", "mcp_settings.json"),
        ),
        windows: r"%APPDATA%\Code\User\globalStorage\kilocode.kilo-code\settings\mcp_settings.json",
        project: Some(".kilocode/mcp.json"),
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::KiloCodeCli,
        id: "kilo-code-cli",
        title: "Kilo Code CLI",
        source: "https://kilo.ai/docs/features/mcp/using-mcp-in-cli",
        checked: Checked::Own,
        note: None,
        file: (
            Base::Home,
            ".kilocode/cli/global/settings/mcp_settings.json",
        ),
        windows: r"%USERPROFILE%\.kilocode\cli\global\settings\mcp_settings.json",
        project: None,
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::QwenCode,
        id: "qwen-code",
        title: "Qwen Code",
        source: "https://github.com/QwenLM/qwen-code/blob/main/docs/users/features/mcp.md",
        checked: Checked::Own,
        note: None,
        file: (Base::Home, ".qwen/settings.json"),
        windows: r"%USERPROFILE%\.qwen\settings.json",
        project: Some(".qwen/settings.json"),
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: Shape {
            url_is_sse: true,
            ..CLAUDE
        },
        expansion: Expansion::DOLLAR,
    },
    Spec {
        client: Client::AmazonQ,
        id: "amazon-q",
        title: "Amazon Q Developer CLI",
        source: "https://docs.aws.amazon.com/amazonq/latest/qdeveloper-ug/command-line-mcp-configuration.html",
        checked: Checked::Own,
        note: Some(
            "newer versions read servers from agent files (`~/.aws/amazonq/cli-agents/`) and \
             this file only when an agent sets `useLegacyMcpJson`",
        ),
        file: (Base::Home, ".aws/amazonq/mcp.json"),
        windows: r"%USERPROFILE%\.aws\amazonq\mcp.json",
        project: Some(".amazonq/mcp.json"),
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::Kiro,
        id: "kiro",
        title: "Kiro",
        source: "https://kiro.dev/docs/mcp/configuration",
        checked: Checked::Own,
        note: None,
        file: (Base::Home, ".kiro/settings/mcp.json"),
        windows: r"%USERPROFILE%\.kiro\settings\mcp.json",
        project: Some(".kiro/settings/mcp.json"),
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::LmStudio,
        id: "lm-studio",
        title: "LM Studio",
        source: "https://lmstudio.ai/docs/app/mcp",
        checked: Checked::Own,
        note: None,
        file: (Base::Home, ".lmstudio/mcp.json"),
        windows: r"%USERPROFILE%\.lmstudio\mcp.json",
        project: None,
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::FactoryDroid,
        id: "factory-droid",
        title: "Factory Droid",
        source: "https://docs.factory.ai/cli/configuration/mcp",
        checked: Checked::Partly(
            "Factory's MCP page documents `droid mcp add` and `mcpServers` entries; the pages \
             we could read do not print the file's path, which is from third-party write-ups",
        ),
        note: None,
        file: (Base::Home, ".factory/mcp.json"),
        windows: r"%USERPROFILE%\.factory\mcp.json",
        project: Some(".factory/mcp.json"),
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::CopilotCli,
        id: "copilot-cli",
        title: "GitHub Copilot CLI",
        source: "https://docs.github.com/en/copilot/how-tos/copilot-cli/customize-copilot/add-mcp-servers",
        checked: Checked::Own,
        note: None,
        file: (Base::Home, ".copilot/mcp-config.json"),
        windows: r"%USERPROFILE%\.copilot\mcp-config.json",
        project: None,
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: Shape {
            stdio: &["local", "stdio"],
            needs_type: true,
            ..CLAUDE
        },
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::Antigravity,
        id: "antigravity",
        title: "Antigravity",
        source: "https://antigravity.google/docs/mcp",
        checked: Checked::Not(
            "the path is from third-party tools and write-ups (one reports \
             `~/.gemini/config/mcp_config.json` for the newer `agy` command line); Google's docs \
             we could read do not print it",
        ),
        note: None,
        file: (Base::Home, ".gemini/antigravity/mcp_config.json"),
        windows: r"%USERPROFILE%\.gemini\antigravity\mcp_config.json",
        project: None,
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::Junie,
        id: "junie",
        title: "JetBrains Junie",
        source: "https://junie.jetbrains.com/docs/junie-cli-mcp-configuration.html",
        checked: Checked::Partly(
            "JetBrains' Junie page confirms stdio servers given as JSON by command and arguments; \
             the path and the `mcpServers` key are from third-party tools that write Junie's \
             file",
        ),
        note: None,
        file: (Base::Home, ".junie/mcp/mcp.json"),
        windows: r"%USERPROFILE%\.junie\mcp\mcp.json",
        project: Some(".junie/mcp/mcp.json"),
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::Amp,
        id: "amp",
        title: "Amp",
        source: "https://ampcode.com/manual",
        checked: Checked::Partly(
            "the path and the `amp.mcpServers` key are from summaries of Amp's manual and \
             tools that write Amp's settings; we could not read the manual itself",
        ),
        note: Some("Amp also reads `settings.jsonc` beside it; use `--config` for that file"),
        file: (Base::ConfigHome, "amp/settings.json"),
        windows: r"%USERPROFILE%\.config\amp\settings.json",
        project: Some(".amp/settings.json"),
        format: Format::Json,
        // One key with a dot in it, not two levels.
        servers_at: &[&["amp.mcpServers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::Trae,
        id: "trae",
        title: "Trae",
        source: "https://docs.trae.ai/ide/model-context-protocol",
        checked: Checked::Partly(
            "Trae's docs confirm `mcpServers` JSON, a user `mcp.json` opened from Settings → \
             MCP, and `.trae/mcp.json` in a project; the user file's path is from a third-party \
             report (macOS), and Linux and Windows are assumed to follow VS Code's layout",
        ),
        note: None,
        file: (Base::AppConfig, "Trae/User/mcp.json"),
        windows: r"%APPDATA%\Trae\User\mcp.json",
        project: Some(".trae/mcp.json"),
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::VscodeInsiders,
        id: "vscode-insiders",
        title: "VS Code Insiders",
        source: "https://code.visualstudio.com/docs/copilot/customization/mcp-servers",
        checked: Checked::Partly(
            "VS Code's page names the user profile's `mcp.json` and `servers`; `Code - \
             Insiders` as the Insiders profile's folder is VS Code's naming, not printed there",
        ),
        note: None,
        file: (Base::AppConfig, "Code - Insiders/User/mcp.json"),
        windows: r"%APPDATA%\Code - Insiders\User\mcp.json",
        // The same `.vscode/mcp.json` as VS Code: `--client vscode --project`.
        project: None,
        format: Format::Json,
        servers_at: &[&["servers"]],
        layout: Layout::ByName,
        shape: Shape {
            needs_type: true,
            ..CLAUDE
        },
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::Boltai,
        id: "boltai",
        title: "BoltAI",
        source: "https://docs.boltai.com/docs/plugins/mcp-servers",
        checked: Checked::Not(
            "the path is from third-party lists of clients; BoltAI's docs we could read do not \
             print it",
        ),
        note: None,
        file: (Base::Home, ".boltai/mcp.json"),
        windows: "(macOS only)",
        project: None,
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::Anythingllm,
        id: "anythingllm",
        title: "AnythingLLM",
        source: "https://docs.anythingllm.com/mcp-compatibility/desktop",
        checked: Checked::Partly(
            "AnythingLLM's docs confirm `anythingllm_mcp_servers.json` with `mcpServers` in \
             the `plugins` folder of its storage; where the desktop app keeps that storage \
             (`anythingllm-desktop/storage`) is from third-party write-ups",
        ),
        note: None,
        file: (
            Base::AppConfig,
            "anythingllm-desktop/storage/plugins/anythingllm_mcp_servers.json",
        ),
        windows: r"%APPDATA%\anythingllm-desktop\storage\plugins\anythingllm_mcp_servers.json",
        project: None,
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        expansion: Expansion::BRACES,
    },
    Spec {
        client: Client::Mcphub,
        id: "mcphub",
        title: "MCPHub (Neovim)",
        source: "https://github.com/ravitemer/mcphub.nvim/blob/main/doc/mcp/servers_json.md",
        checked: Checked::Own,
        note: None,
        file: (Base::ConfigHome, "mcphub/servers.json"),
        windows: r"%USERPROFILE%\.config\mcphub\servers.json",
        project: Some(".mcphub/servers.json"),
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        // `${VAR}` and `${cmd: ...}` anywhere; in `env`, a value starting `$: ` is a shell
        // command's output, and an empty value (or `null`) is the variable of the same name.
        expansion: Expansion {
            dollar: false,
            markers: &["${", "$: "],
            empty: true,
        },
    },
    Spec {
        client: Client::Augment,
        id: "augment",
        title: "Augment (Auggie CLI)",
        source: "https://docs.augmentcode.com/cli/integrations",
        checked: Checked::Not(
            "the path and the `mcpServers` key are from Auggie's settings as installers write \
             them; Augment's docs we could read show only `auggie mcp add`",
        ),
        note: None,
        file: (Base::Home, ".augment/settings.json"),
        windows: r"%USERPROFILE%\.augment\settings.json",
        project: None,
        format: Format::Json,
        servers_at: &[&["mcpServers"]],
        layout: Layout::ByName,
        shape: CLAUDE,
        expansion: Expansion::BRACES,
    },
];

/// The clients whose own program the tests run through Countersign (tests/install.rs), by
/// `--client` name, at the version `.ci/setup tests` pins: `countersign install`, the client's
/// listing of the tools, open calls, a gated call that runs once after the click in the window,
/// `countersign uninstall`. Change a version here with the one in `.ci/setup`.
pub const RUN_IN_TESTS: [(&str, &str); 2] = [("claude-code", "2.1.332"), ("codex", "0.171.0")];

/// The table of clients in docs/clients.md, rendered from [`TABLE`] (a test keeps that copy
/// equal to it), and beneath it what could not be confirmed in each client's own documentation.
pub fn readme_table() -> String {
    let mut out = String::from(
        "| Client | `--client` | Linux | macOS | Windows | Format | Servers at | Source | Confirmed there | Its program in the tests |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for spec in &TABLE {
        let (linux, mac) = spec.unix_paths();
        let run = match RUN_IN_TESTS.iter().find(|(id, _)| *id == spec.id) {
            Some((_, version)) => format!("yes ({version})"),
            None => "no".to_owned(),
        };
        out.push_str(&format!(
            "| {} | `{}` | `{linux}` | `{mac}` | `{}` | {} | `{}` | [docs]({}) | {} | {run} |\n",
            spec.title,
            spec.id,
            spec.windows,
            spec.format.name(),
            spec.servers_key(),
            spec.source,
            spec.checked.cell()
        ));
    }
    out.push('\n');
    for spec in &TABLE {
        for line in [spec.checked.sentence(), spec.note.map(str::to_owned)]
            .into_iter()
            .flatten()
        {
            out.push_str(&format!("- {}: {line}.\n", spec.title));
        }
    }
    out
}
