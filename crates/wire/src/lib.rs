//! The protocol between the gateway and the desk.
//!
//! The gateway is spawned by the agent and trusted with nothing; the desk holds the secret, the
//! policy and the ledger. This crate is everything they share: the message types and their
//! framing. It is deliberately small, so the gateway links no storage, keychain or GUI code.
//!
//! # Framing
//! Each message is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON. A frame
//! longer than [`MAX_FRAME`] is an error that closes the connection (the other side is broken or
//! hostile; nothing in it is read).
//!
//! # Conversation
//! The gateway opens with [`Request::Hello`] carrying [`PROTOCOL_VERSION`]; the desk answers
//! [`Response::Welcome`] with the tenant it assigned to this connection, or
//! [`Response::Error`] with [`ErrorCode::VersionMismatch`]. After that, every request carries an
//! `id` the gateway chose, and its response echoes it; requests run concurrently, so responses may
//! come in any order (a preflight waits for a person while other calls go on).
//!
//! There is no message that approves or denies: those exist only as the desk's own functions,
//! called from its window.
#![deny(missing_docs)]

use countersign_core::{GateClass, Refusal};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The environment variable that overrides the socket's path (for tests and unusual setups).
pub const SOCKET_ENV: &str = "COUNTERSIGN_SOCKET";

/// Where the desk listens: `$COUNTERSIGN_SOCKET` if set, else a path computed from the user id
/// alone, so that a gateway whose environment the agent's client stripped still finds the desk:
/// `/run/user/<uid>/countersign/desk.sock` where that runtime directory exists, else
/// `/tmp/countersign-<uid>/desk.sock`.
#[cfg(unix)]
pub fn socket_path() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os(SOCKET_ENV).filter(|p| !p.is_empty()) {
        return path.into();
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let runtime = std::path::PathBuf::from(format!("/run/user/{uid}"));
    if runtime.is_dir() {
        runtime.join("countersign").join("desk.sock")
    } else {
        std::path::PathBuf::from(format!("/tmp/countersign-{uid}")).join("desk.sock")
    }
}

/// The protocol version this build speaks. Both sides must speak the same one.
pub const PROTOCOL_VERSION: u32 = 1;

/// The largest frame accepted, in bytes (16 MiB: twice the largest canonical plan).
pub const MAX_FRAME: usize = 16 * 1024 * 1024;

/// A request from the gateway, with the id its response will echo.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope<T> {
    /// Chosen by the gateway, unique per connection.
    pub id: u64,
    /// The message.
    #[serde(flatten)]
    pub body: T,
}

/// What the gateway asks of the desk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Request {
    /// The first message: who is asking. The desk assigns the tenant; it never takes this
    /// message's word for identity, it only shows it to the person.
    Hello {
        /// [`PROTOCOL_VERSION`] of the gateway.
        version: u32,
        /// The agent's `clientInfo` from its MCP `initialize`, as sent.
        client_info: Value,
        /// The server's name: `--name`, else the upstream's `serverInfo.name`.
        server: String,
        /// The gateway's process id, for the person's information.
        pid: u32,
    },
    /// The upstream's tool definitions, every field as the upstream sent it. Sent again when the
    /// upstream's list changes.
    RegisterTools {
        /// Raw MCP tool objects.
        tools: Vec<Value>,
    },
    /// A gated call without `confirm`: build the plan, show it, wait up to `wait_ms` for a person.
    Preflight {
        /// The tool called.
        tool: String,
        /// The call's arguments, raw.
        arguments: Value,
        /// How long to wait for a decision before answering `pending`.
        wait_ms: u64,
    },
    /// The agent gave up on a preflight (cancelled it): remove it from the queue.
    Withdraw {
        /// The tool of the withdrawn call.
        tool: String,
        /// Its arguments, as in the preflight.
        arguments: Value,
    },
    /// A gated call with `confirm: true`: verify it in the seed's order and, for single-use
    /// tools, spend the nonce.
    Confirm {
        /// The tool called.
        tool: String,
        /// The call's arguments, raw, including `confirm`, `confirmTarget` and `confirmToken`.
        arguments: Value,
    },
    /// Another start of the desk asks this one to bring its window forward (the socket bind is
    /// the single-instance lock; the second instance exits after sending this).
    Focus,
    /// What became of an accepted call, for history.
    Outcome {
        /// The nonce of the token that was accepted.
        nonce: String,
        /// Whether the upstream reported success.
        ok: bool,
        /// A short description of a failure.
        note: Option<String>,
    },
}

/// How the desk classes one registered tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolDecision {
    /// The tool's name.
    pub name: String,
    /// Its gate class under the desk's policy.
    pub class: GateClass,
    /// Why it is not offered to the agent, if it is not (e.g. it already has an argument named
    /// `confirmToken`).
    pub withheld: Option<String>,
}

/// What the desk answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Response {
    /// The handshake succeeded.
    Welcome {
        /// The desk's [`PROTOCOL_VERSION`].
        version: u32,
        /// The tenant assigned to this connection.
        tenant: String,
    },
    /// The class of every registered tool.
    Classes {
        /// One per registered tool, in the order sent.
        tools: Vec<ToolDecision>,
    },
    /// A person approved: the preflight text and the token.
    Approved {
        /// The rendered preflight, ending with how to confirm and the token line.
        text: String,
        /// The token.
        token: String,
        /// The resolved target the token is bound to.
        target: String,
        /// When the token expires, in ms since the epoch.
        expires_at_ms: u64,
        /// `token` (reusable until expiry) or `once`.
        class: GateClass,
    },
    /// A confirm passed: run these arguments (what the person approved, without the confirm
    /// fields), then report the [`Request::Outcome`] under this nonce.
    Accepted {
        /// The approved arguments.
        arguments: Value,
        /// The token's nonce.
        nonce: String,
    },
    /// A refusal: denied, pending, or one of the verification chain's.
    Refused {
        /// Which.
        refusal: Refusal,
        /// The next move, for the agent.
        message: String,
    },
    /// Done, nothing to report.
    Done,
    /// The request could not be handled.
    Error {
        /// What kind of failure.
        code: ErrorCode,
        /// A plain description.
        message: String,
    },
}

/// Failures that are not refusals: the conversation itself went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// The two sides speak different protocol versions.
    VersionMismatch,
    /// A request before [`Request::Hello`], or a second hello.
    NotIntroduced,
    /// The tool was never registered, or is open, or was withheld.
    UnknownTool,
    /// The arguments cannot be planned (not an object, too deep, too large, unsafe numbers...).
    BadArguments,
    /// The desk cannot mint: no secret (keychain missing or locked).
    NoSecret,
    /// Anything else on the desk's side.
    Internal,
}

/// A framing failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The peer closed the connection cleanly between frames.
    #[error("connection closed")]
    Closed,
    /// A frame announced more than [`MAX_FRAME`] bytes.
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    /// A frame is not valid JSON of the expected shape.
    #[error("malformed frame: {0}")]
    Malformed(#[from] serde_json::Error),
    /// The socket failed.
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
}

/// Writes one frame.
pub async fn write_frame<W, T>(writer: &mut W, message: &T) -> Result<(), FrameError>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    let body = serde_json::to_vec(message)?;
    if body.len() > MAX_FRAME {
        return Err(FrameError::TooLarge(body.len()));
    }
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    writer.write_all(&frame).await?;
    writer.flush().await?;
    Ok(())
}

/// Reads one frame. [`FrameError::Closed`] when the peer closed cleanly before a new frame.
pub async fn read_frame<R, T>(reader: &mut R) -> Result<T, FrameError>
where
    R: AsyncRead + Unpin,
    T: for<'de> Deserialize<'de>,
{
    let mut len = [0u8; 4];
    match reader.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).await?;
    Ok(serde_json::from_slice(&body)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn frames_round_trip() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let sent = Envelope {
            id: 7,
            body: Request::Preflight {
                tool: "t".into(),
                arguments: json!({"a": 1}),
                wait_ms: 5,
            },
        };
        write_frame(&mut a, &sent).await.unwrap();
        let got: Envelope<Request> = read_frame(&mut b).await.unwrap();
        assert_eq!(got, sent);
    }

    #[tokio::test]
    async fn oversized_frame_is_refused_without_reading_it() {
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&((MAX_FRAME as u32) + 1).to_be_bytes())
            .await
            .unwrap();
        assert!(matches!(
            read_frame::<_, Value>(&mut b).await,
            Err(FrameError::TooLarge(_))
        ));
    }

    #[tokio::test]
    async fn malformed_frame_is_an_error_and_clean_close_is_closed() {
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&3u32.to_be_bytes()).await.unwrap();
        a.write_all(b"{x}").await.unwrap();
        drop(a);
        assert!(matches!(
            read_frame::<_, Value>(&mut b).await,
            Err(FrameError::Malformed(_))
        ));
        assert!(matches!(
            read_frame::<_, Value>(&mut b).await,
            Err(FrameError::Closed)
        ));
    }

    #[test]
    fn wire_names_are_stable() {
        let refused = Response::Refused {
            refusal: Refusal::AlreadyUsed,
            message: "m".into(),
        };
        assert_eq!(
            serde_json::to_value(&refused).unwrap(),
            json!({"type": "refused", "refusal": "already_used", "message": "m"})
        );
        let env = Envelope {
            id: 1,
            body: Request::Withdraw {
                tool: "t".into(),
                arguments: json!({}),
            },
        };
        assert_eq!(
            serde_json::to_value(&env).unwrap(),
            json!({"id": 1, "type": "withdraw", "tool": "t", "arguments": {}})
        );
    }
}
