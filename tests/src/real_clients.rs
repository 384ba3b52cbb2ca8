//! Real MCP clients under test: Claude Code and Codex, the programs people run, at the versions
//! `.ci/setup tests` pins under `target/peers`, each with a home of its own, its model pointed at
//! the test's [`ScriptedModel`](crate::scripted_model::ScriptedModel) on loopback (a dummy API
//! key), and nothing of the test's environment but what a person's shell would give it.
//!
//! A client finds the desk as it would on a person's machine: through the socket path computed
//! from the user id, never `COUNTERSIGN_SOCKET` (Codex starts its servers with a short list of
//! variables and drops the rest). For that path to lead to the test's desk, the client, the
//! `countersign` commands beside it and every gateway it starts run in a mount namespace of their
//! own (`unshare --mount`, root), where `/run/user` is a fresh tmpfs and
//! `/run/user/<uid>/countersign` is the test desk's directory, bound there. Nothing outside that
//! namespace changes.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use countersign_core::sync::lock;

use crate::scripted_model::Wire;
use crate::window::bin;

/// Which client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Claude Code (`@anthropic-ai/claude-code`), `claude -p`.
    ClaudeCode,
    /// Codex (`@openai/codex`), `codex exec`.
    Codex,
}

/// A client with a home of its own.
pub struct RealClient {
    /// Which client.
    pub kind: Kind,
    /// Its home directory (its configuration, its own state).
    pub home: tempfile::TempDir,
}

/// The programs `.ci/setup tests` installs.
fn peers_bin(name: &str) -> PathBuf {
    let path = crate::peers::dir().join("node_modules/.bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: run .ci/setup tests",
        path.display()
    );
    path
}

/// Claude Code's `Elicitation` hook: the person's "Open" on Claude Code's prompt to open the
/// Countersign desk for a request (a URL elicitation of `countersign://request/<id>`), which
/// `claude -p` cannot show and so declines, and the desk then withdraws the call. It accepts that
/// prompt only, and records every elicitation it is asked about. Accepting opens nothing and
/// approves nothing: the call still waits for the click in the desk's window.
const ANSWER_OPEN_DESK: &str = r#"input=$(cat)
printf '%s\n' "$input" >> "$HOME/.claude/elicitations.log"
case "$input" in
*'"countersign://request/'*)
  echo '{"hookSpecificOutput":{"hookEventName":"Elicitation","action":"accept"}}' ;;
esac
"#;

/// What runs in the namespace before the client: `/run/user/<uid>/countersign` becomes the
/// desk's directory (`$1`), then the command (the rest) takes the shell's place.
const IN_NAMESPACE: &str = r#"set -e
uid=$(id -u)
mount -t tmpfs -o mode=0755 countersign-test /run/user
mkdir -m 0700 -p "/run/user/$uid/countersign"
mount --bind "$1" "/run/user/$uid/countersign"
shift
exec "$@"
"#;

impl RealClient {
    /// A client of `kind` with an empty home; for Claude Code, with the answer a person gives to
    /// its prompt to open the desk (see [`ANSWER_OPEN_DESK`]).
    pub fn new(kind: Kind) -> RealClient {
        let _ = peers_bin(kind.program());
        let home = tempfile::tempdir().unwrap();
        if kind == Kind::ClaudeCode {
            let dir = home.path().join(".claude");
            std::fs::create_dir_all(&dir).unwrap();
            let hook = dir.join("open-desk.sh");
            std::fs::write(&hook, ANSWER_OPEN_DESK).unwrap();
            let settings = serde_json::json!({"hooks": {"Elicitation": [{"hooks": [
                {"type": "command", "command": format!("sh {}", hook.display())}
            ]}]}});
            std::fs::write(dir.join("settings.json"), settings.to_string()).unwrap();
        }
        RealClient { kind, home }
    }

    /// The elicitations Claude Code's hook was asked about (one JSON line each).
    pub fn elicitations(&self) -> String {
        std::fs::read_to_string(self.home.path().join(".claude/elicitations.log"))
            .unwrap_or_default()
    }

    /// The user's configuration file the client reads its MCP servers from.
    pub fn config(&self) -> PathBuf {
        match self.kind {
            Kind::ClaudeCode => self.home.path().join(".claude.json"),
            Kind::Codex => self.home.path().join(".codex/config.toml"),
        }
    }

    /// How its model API speaks.
    pub fn wire(&self) -> Wire {
        match self.kind {
            Kind::ClaudeCode => Wire::Messages,
            Kind::Codex => Wire::Responses,
        }
    }

    /// A command run as the client's user would run it in a shell: its home, a plain `PATH`, and
    /// the desk of `desk_dir` at the socket path computed from the user id.
    pub fn command(&self, desk_dir: &Path, program: &Path) -> tokio::process::Command {
        assert!(
            Path::new("/run/user").is_dir(),
            "the client tests bind the desk under /run/user, which this system lacks"
        );
        let mut cmd = tokio::process::Command::new("unshare");
        cmd.args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            IN_NAMESPACE,
            "sh",
        ])
        .arg(desk_dir)
        .arg(program)
        .env_clear()
        .env("HOME", self.home.path())
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("LANG", "C.UTF-8")
        .env("RUST_LOG", "warn")
        .current_dir(self.home.path())
        .stdin(Stdio::null())
        .kill_on_drop(true);
        cmd
    }

    /// `countersign ARGS...` as the client's user, against the desk of `desk_dir`: its exit
    /// code, stdout and stderr.
    pub async fn countersign(&self, desk_dir: &Path, args: &[&str]) -> (i32, String, String) {
        let out = self
            .command(desk_dir, &bin("countersign"))
            .args(args)
            .output()
            .await
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs the client once on `prompt` with its model at `127.0.0.1:model_port`, allowed the
    /// tools of `servers`; it exits when the model's script ends (or is killed after 100 s).
    pub async fn run(
        &self,
        desk_dir: &Path,
        model_port: u16,
        servers: &[&str],
        prompt: &str,
    ) -> Output {
        let mut cmd = self.command(desk_dir, &peers_bin(self.kind.program()));
        match self.kind {
            Kind::ClaudeCode => {
                let allowed: Vec<String> = servers.iter().map(|s| format!("mcp__{s}")).collect();
                cmd.args(["-p", prompt, "--output-format", "json", "--allowedTools"])
                    .arg(allowed.join(","))
                    .env(
                        "ANTHROPIC_BASE_URL",
                        format!("http://127.0.0.1:{model_port}"),
                    )
                    .env("ANTHROPIC_API_KEY", "dummy")
                    .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
                    .env("DISABLE_TELEMETRY", "1")
                    .env("DISABLE_AUTOUPDATER", "1")
                    // Every tool in the request's `tools`, not behind a search tool.
                    .env("ENABLE_TOOL_SEARCH", "false");
            }
            Kind::Codex => {
                cmd.args(["exec", "--skip-git-repo-check", prompt])
                    .env("SCRIPTED_MODEL_KEY", "dummy");
            }
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        // Both outputs are read as they come, so that a client that never ends still says what
        // it printed: a run cut at its limit panics with both, not with a bare timeout.
        let stdout = read_all(child.stdout.take());
        let stderr = read_all(child.stderr.take());
        let status = match tokio::time::timeout(Duration::from_secs(100), child.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => {
                let _ = child.kill().await;
                let (stdout, stderr) = (settle(stdout).await, settle(stderr).await);
                panic!(
                    "{:?} did not end within 100 s\n--- its stdout:\n{}\n--- its stderr:\n{}",
                    self.kind,
                    String::from_utf8_lossy(&stdout),
                    String::from_utf8_lossy(&stderr)
                );
            }
        };
        Output {
            status,
            stdout: settle(stdout).await,
            stderr: settle(stderr).await,
        }
    }

    /// What Codex's configuration needs besides its servers: the test's model as its provider,
    /// no approval prompts of its own (Countersign's window is the approval), servers waited for
    /// at start, and no plugins (which would reach the network).
    pub fn codex_settings(model_port: u16) -> String {
        format!(
            r#"model = "scripted"
model_provider = "scripted"
approval_policy = "never"
sandbox_mode = "read-only"
mcp_optional_startup_grace_ms = 0

[model_providers.scripted]
name = "scripted"
base_url = "http://127.0.0.1:{model_port}/v1"
wire_api = "responses"
env_key = "SCRIPTED_MODEL_KEY"

[features]
plugins = false
"#
        )
    }
}

impl Kind {
    /// The program's name under `node_modules/.bin`.
    pub fn program(self) -> &'static str {
        match self {
            Kind::ClaudeCode => "claude",
            Kind::Codex => "codex",
        }
    }

    /// Its npm package.
    pub fn package(self) -> &'static str {
        match self {
            Kind::ClaudeCode => "@anthropic-ai/claude-code",
            Kind::Codex => "@openai/codex",
        }
    }

    /// The version `.ci/setup tests` pins for it.
    pub fn pinned(self) -> String {
        let setup =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/setup"))
                .unwrap();
        let prefix = format!("{}@", self.package());
        setup
            .split_whitespace()
            .find_map(|word| word.trim_end_matches(')').strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!(".ci/setup pins no {}", self.package()))
            .to_owned()
    }

    /// What the installed program says its version is (`--version`).
    pub async fn installed_version(self) -> String {
        let out = tokio::process::Command::new(peers_bin(self.program()))
            .arg("--version")
            .env("HOME", tempfile::tempdir().unwrap().path())
            .output()
            .await
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Its name for `countersign install --client`.
    pub fn id(self) -> &'static str {
        match self {
            Kind::ClaudeCode => "claude-code",
            Kind::Codex => "codex",
        }
    }
}

/// A pipe being read to its end in a task of its own, and what it has read so far.
type Reading = (
    tokio::task::JoinHandle<()>,
    std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
);

/// Reads `pipe` to its end in a task of its own, keeping each chunk as it comes.
fn read_all<R>(pipe: Option<R>) -> Reading
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    let read = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let into = read.clone();
    let task = tokio::spawn(async move {
        let Some(mut pipe) = pipe else { return };
        let mut chunk = [0u8; 8192];
        while let Ok(n @ 1..) = tokio::io::AsyncReadExt::read(&mut pipe, &mut chunk).await {
            lock(&into).extend_from_slice(&chunk[..n]);
        }
    });
    (task, read)
}

/// What a [`read_all`] read, waiting at most 5 s for the pipe's end: a process the client
/// started may hold it open after the client ended; then what came until then.
async fn settle((task, read): Reading) -> Vec<u8> {
    if tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .is_err()
    {
        let mut bytes = std::mem::take(&mut *lock(&read));
        bytes.extend_from_slice(b"\n(the pipe was still open 5 s after the client ended)");
        return bytes;
    }
    std::mem::take(&mut *lock(&read))
}
