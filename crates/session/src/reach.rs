//! From a gateway's hello to a running upstream: what the desk starts or connects, and the
//! identity it will know that upstream by.
//!
//! The identity is the desk's own word, never the gateway's: `builtin:<db path>` for the built-in
//! tools, the URL, or the command line itself for an ad-hoc command (policy is keyed by it, and
//! the person sees it). A registered server (`--server NAME`) will be the registry's name; until
//! the registry exists, every name is answered "no such server".

use std::path::Path;
use std::sync::Arc;

use countersign_wire::{Frame, Reach, RefusedCode};
use rmcp::model::ProtocolVersion;
use rmcp::service::RunningService;
use rmcp::{ClientCacheConfig, ClientLifecycleMode, ClientServiceExt, RoleClient};
use tokio::sync::mpsc;

use crate::children::Children;
use crate::raw::RawPassthroughTransport;
use crate::upstream::{Shared, UpstreamClient};

/// An upstream reached and initialized (the desk's name for it is [`identity`]'s).
pub struct Reached {
    /// The client session toward it.
    pub upstream: RunningService<RoleClient, UpstreamClient>,
    /// What the session's two halves share.
    pub shared: Arc<Shared>,
}

/// Why a hello is not served.
#[derive(Debug)]
pub struct Unreached {
    /// For the gateway.
    pub code: RefusedCode,
    /// For the person reading the gateway's stderr.
    pub message: String,
}

fn unreached(code: RefusedCode, message: impl Into<String>) -> Unreached {
    Unreached {
        code,
        message: message.into(),
    }
}

/// An argument as a shell would need it written: the identity of a command reads like the
/// command line a person would type, and arguments with spaces stay distinguishable.
fn quoted(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
    if plain {
        arg.to_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

/// The identity of an ad-hoc command: its command line.
pub fn command_identity(argv: &[String]) -> String {
    argv.iter().map(|a| quoted(a)).collect::<Vec<_>>().join(" ")
}

/// The desk's name for what `reach` names, or why it cannot be reached at all. Checked before the
/// gateway is welcomed; nothing is started.
pub fn identity(reach: &Reach) -> Result<String, Unreached> {
    match reach {
        Reach::Builtin { db } if Path::new(db).is_absolute() => Ok(format!("builtin:{db}")),
        Reach::Builtin { db } => Err(unreached(
            RefusedCode::BadHello,
            format!("the built-in tools' database must be an absolute path, not {db:?}"),
        )),
        Reach::Url { url } if url.starts_with("http://") || url.starts_with("https://") => {
            Ok(url.clone())
        }
        Reach::Url { url } => Err(unreached(
            RefusedCode::BadHello,
            format!("--url takes an http:// or https:// URL, not {url:?}"),
        )),
        Reach::Command { argv, .. } if !argv.is_empty() => Ok(command_identity(argv)),
        Reach::Command { .. } => Err(unreached(RefusedCode::BadHello, "no upstream command")),
        Reach::Server { name } => Err(unreached(
            RefusedCode::NoSuchServer,
            format!(
                "no server named {name:?} is registered in the desk (servers cannot be \
                 registered yet: use -- CMD ARGS..., --url URL or --db PATH)"
            ),
        )),
        other => Err(unreached(
            RefusedCode::BadHello,
            format!("this desk cannot reach {other:?}"),
        )),
    }
}

/// How the desk opens its session with the upstream, chosen from the agent's first message:
/// the revision they would negotiate directly.
pub fn lifecycle(agent_probes_modern: bool) -> ClientLifecycleMode {
    if agent_probes_modern {
        // The agent opened with `server/discover`: probe the upstream the same way, and fall back
        // to the handshake where the upstream is older (the agent is then offered that too).
        ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: Some(ProtocolVersion::V_2025_11_25),
        }
    } else {
        ClientLifecycleMode::Initialize
    }
}

/// Starts or connects what `reach` names and opens the MCP session with it (`lifecycle`). The
/// upstream's stderr goes to `out` as `E` frames (dropped, not queued without bound, when the
/// gateway is slow).
pub async fn reach(
    reach: &Reach,
    lifecycle: ClientLifecycleMode,
    out: &mpsc::Sender<Frame>,
    children: &Children,
) -> Result<Reached, Unreached> {
    // Checked again here, so that nothing `identity` refuses is ever started.
    identity(reach)?;
    let shared = Arc::new(Shared::default());
    let client = UpstreamClient::new(shared.clone());
    let failed = |e: &dyn std::fmt::Display| {
        unreached(
            RefusedCode::UpstreamFailed,
            format!("the upstream did not initialize: {e}"),
        )
    };
    let upstream = match reach {
        Reach::Builtin { db } => {
            let path = Path::new(db);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| {
                    unreached(
                        RefusedCode::UpstreamFailed,
                        format!("cannot create {}: {e}", dir.display()),
                    )
                })?;
            }
            let (ours, theirs) = tokio::io::duplex(1 << 20);
            let (their_read, their_write) = tokio::io::split(theirs);
            tokio::spawn(countersign_builtin::serve(
                path.to_owned(),
                their_read,
                their_write,
            ));
            let (read, write) = tokio::io::split(ours);
            client
                .serve_with_lifecycle(RawPassthroughTransport::new(read, write), lifecycle)
                .await
                .map_err(|e| failed(&e))?
        }
        Reach::Url { url } => {
            let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url.as_str());
            client
                .serve_with_lifecycle(transport, lifecycle)
                .await
                .map_err(|e| failed(&e))?
        }
        Reach::Command { argv, cwd, env } => {
            let Some((program, args)) = argv.split_first() else {
                return Err(unreached(RefusedCode::BadHello, "no upstream command"));
            };
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(args).env_clear().envs(env.iter().cloned());
            if !cwd.is_empty() {
                cmd.current_dir(cwd);
            }
            let sink = out.clone();
            let stderr = move |chunk: Vec<u8>| {
                let _ = sink.try_send(Frame::Stderr(chunk));
            };
            let (transport, stderr_done) =
                RawPassthroughTransport::spawn(cmd, stderr, children.clone()).map_err(|e| {
                    unreached(
                        RefusedCode::UpstreamFailed,
                        format!("cannot start the upstream `{program}`: {e}"),
                    )
                })?;
            match client.serve_with_lifecycle(transport, lifecycle).await {
                Ok(upstream) => upstream,
                Err(e) => {
                    // The server is gone (its group killed with the transport): what it said on
                    // stderr, usually why, goes to the gateway before the refusal.
                    let _ =
                        tokio::time::timeout(std::time::Duration::from_secs(2), stderr_done).await;
                    return Err(failed(&e));
                }
            }
        }
        // `identity` has refused everything else already; should a new kind slip through, it is
        // refused here too.
        other => {
            return Err(unreached(
                RefusedCode::BadHello,
                format!("this desk cannot reach {other:?}"),
            ));
        }
    };
    upstream
        .set_response_cache_config(ClientCacheConfig::disabled())
        .await;
    Ok(Reached { upstream, shared })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_identity_reads_like_its_command_line() {
        let argv = ["npx", "-y", "@scope/server", "/home/a b", "it's"].map(String::from);
        assert_eq!(
            command_identity(&argv),
            r"npx -y @scope/server '/home/a b' 'it'\''s'"
        );
    }
}
