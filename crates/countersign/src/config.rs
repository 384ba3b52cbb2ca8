//! `countersign config`: the snippet that puts Countersign in front of a server an agent already
//! uses, in the shape each client reads (Claude Desktop, Claude Code and Cursor read
//! `{"mcpServers": {...}}`; VS Code reads `{"servers": {...}}` with `"type": "stdio"`).

use countersign_core::render::shell_word;
use serde_json::{Value, json};

/// The agents `countersign config` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Client {
    /// Claude Code: `.mcp.json`, or `claude mcp add`.
    ClaudeCode,
    /// Claude Desktop: `claude_desktop_config.json`.
    ClaudeDesktop,
    /// Cursor: `.cursor/mcp.json`.
    Cursor,
    /// VS Code: `.vscode/mcp.json`.
    Vscode,
}

/// A server name from its command: the package for `npx -y @scope/pkg`, else the program's name.
pub fn default_name(command: &[String]) -> String {
    let program = command.first().map(String::as_str).unwrap_or("server");
    let base = |s: &str| s.rsplit('/').next().unwrap_or(s).to_owned();
    let runner = matches!(base(program).as_str(), "npx" | "uvx" | "bunx" | "pnpx");
    if runner && let Some(package) = command.iter().skip(1).find(|a| !a.starts_with('-')) {
        // `@scope/pkg@1.2.3` is `pkg`: the version goes, the scope goes with the path.
        let package = package
            .rsplit_once('@')
            .filter(|(p, _)| !p.is_empty())
            .map_or(package.as_str(), |(p, _)| p);
        return base(package);
    }
    base(program)
}

/// The arguments for `countersign` that wrap `command` under `name`.
fn wrapped_args(name: &str, command: &[String]) -> Vec<String> {
    let mut args = vec!["mcp".to_owned(), "--name".to_owned(), name.to_owned()];
    if !command.is_empty() {
        args.push("--".to_owned());
        args.extend(command.iter().cloned());
    }
    args
}

/// The JSON snippet for `client`; `countersign` is the path of this program.
pub fn snippet(client: Client, countersign: &str, name: &str, command: &[String]) -> Value {
    let args = wrapped_args(name, command);
    match client {
        Client::Vscode => {
            json!({ "servers": { name: { "type": "stdio", "command": countersign, "args": args } } })
        }
        _ => json!({ "mcpServers": { name: { "command": countersign, "args": args } } }),
    }
}

/// What `countersign config` prints.
pub fn render(client: Client, countersign: &str, name: &str, command: &[String]) -> String {
    let json =
        serde_json::to_string_pretty(&snippet(client, countersign, name, command)).expect("JSON");
    let file = match client {
        Client::ClaudeCode => "Add to .mcp.json in your project (or run the command below):",
        Client::ClaudeDesktop => "Add to claude_desktop_config.json (merge into \"mcpServers\"):",
        Client::Cursor => "Add to .cursor/mcp.json (merge into \"mcpServers\"):",
        Client::Vscode => "Add to .vscode/mcp.json (merge into \"servers\"):",
    };
    let mut out = format!("{file}\n{json}\n");
    if client == Client::ClaudeCode {
        let mut words = vec![
            "claude".to_owned(),
            "mcp".to_owned(),
            "add".to_owned(),
            shell_word(name),
            "--".to_owned(),
            shell_word(countersign),
        ];
        words.extend(wrapped_args(name, command).iter().map(|w| shell_word(w)));
        out.push_str(&format!("\n{}\n", words.join(" ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn names_come_from_the_package_or_the_program() {
        assert_eq!(
            default_name(&cmd(&[
                "npx",
                "-y",
                "@modelcontextprotocol/server-filesystem",
                "/home"
            ])),
            "server-filesystem"
        );
        assert_eq!(
            default_name(&cmd(&[
                "npx",
                "-y",
                "@modelcontextprotocol/server-everything@2026.8.31"
            ])),
            "server-everything"
        );
        assert_eq!(
            default_name(&cmd(&["/usr/local/bin/github-mcp-server", "stdio"])),
            "github-mcp-server"
        );
        assert_eq!(
            default_name(&cmd(&["uvx", "mcp-server-git"])),
            "mcp-server-git"
        );
    }

    #[test]
    fn claude_desktop_and_cursor_get_mcp_servers() {
        for client in [Client::ClaudeDesktop, Client::Cursor, Client::ClaudeCode] {
            let s = snippet(
                client,
                "/usr/bin/countersign",
                "fs",
                &cmd(&["npx", "-y", "pkg", "/tmp"]),
            );
            assert_eq!(
                s,
                json!({"mcpServers": {"fs": {"command": "/usr/bin/countersign", "args": ["mcp", "--name", "fs", "--", "npx", "-y", "pkg", "/tmp"]}}})
            );
        }
    }

    #[test]
    fn vscode_gets_servers_with_type_stdio() {
        let s = snippet(
            Client::Vscode,
            "countersign",
            "git",
            &cmd(&["uvx", "mcp-server-git"]),
        );
        assert_eq!(
            s,
            json!({"servers": {"git": {"type": "stdio", "command": "countersign", "args": ["mcp", "--name", "git", "--", "uvx", "mcp-server-git"]}}})
        );
    }

    #[test]
    fn claude_code_also_gets_a_quoted_command_line() {
        let out = render(
            Client::ClaudeCode,
            "/opt/my apps/countersign",
            "fs",
            &cmd(&["npx", "-y", "pkg", "/tmp/it's here"]),
        );
        assert!(out.ends_with("claude mcp add fs -- '/opt/my apps/countersign' mcp --name fs -- npx -y pkg '/tmp/it'\\''s here'\n"), "{out}");
    }

    #[test]
    fn no_command_means_the_built_in_tools() {
        let s = snippet(Client::Cursor, "countersign", "builtin", &[]);
        assert_eq!(
            s["mcpServers"]["builtin"]["args"],
            json!(["mcp", "--name", "builtin"])
        );
    }
}
