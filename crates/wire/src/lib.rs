//! The protocol between `countersign mcp` (the pipe an agent launches) and the desk.
//!
//! The gateway is spawned and controlled by the agent, so it is trusted with nothing and reaches
//! nothing: it says once what the agent wants reached, then carries MCP messages. The desk runs
//! the MCP session, the upstream and every decision. This crate is everything the two share, kept
//! small so that the gateway links no storage, keychain, MCP or GUI code.
//!
//! # Framing
//! Each frame is a 4-byte big-endian length `n`, then `n` bytes: one kind byte and the body.
//! A frame longer than [`MAX_FRAME`] is an error that closes the connection (the other side is
//! broken or hostile; nothing in it is read).
//!
//! | kind | body | direction |
//! | --- | --- | --- |
//! | `H` | [`Hello`] as JSON | gateway → desk, first frame only |
//! | `W` | [`Welcome`] as JSON | desk → gateway, the answer to the hello |
//! | `M` | one MCP (JSON-RPC) message, the bytes of one stdio line without its newline | both |
//! | `E` | bytes the upstream wrote to its stderr | desk → gateway |
//! | `R` | [`RegistryAnswer`] as JSON | desk → `countersign server`/`install`, after [`Hello::Registry`] |
//!
//! # Conversation
//! The gateway opens with [`Hello::Gateway`]: the [`PROTOCOL_VERSION`] it speaks and what to
//! reach ([`Reach`]). The desk starts or connects the upstream, then answers
//! [`Welcome::Accepted`] with the tenant it assigned to this connection, or [`Welcome::Refused`]
//! with a [`RefusedCode`] and a sentence for a person. After an acceptance both sides send `M`
//! frames until one closes: the agent's messages one way, the desk's answers, notifications and
//! requests (roots, sampling, elicitation) the other. A second start of the desk opens with
//! [`Hello::Focus`] instead (see [`focus_desk`]), which asks the running desk to bring its window
//! forward (showing the request a `countersign://request/<id>` URL names, when it carries one: see
//! [`parse_request_url`]). The command line's registry requests open with [`Hello::Registry`] (see
//! [`RegistryRequest`]): a proposal, which for anything but a new server waits for the person's
//! click in the window.
//!
//! On Linux, a gateway whose stdin and stdout are pipes or sockets offers them in its hello, and
//! a desk that takes them says so in its welcome: the gateway then sends them over the socket,
//! and the agent's MCP lines go to and from the desk directly instead of as `M` frames (see
//! [`stdio`]).
//!
//! There is no message that approves or denies, and none that carries policy, a class or an
//! identity: the desk decides those itself. A name in the hello is a display label only.

use std::fmt;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

mod desk_error;
#[cfg(unix)]
mod focus;
pub mod message;
mod open;
#[cfg(unix)]
mod place;
mod registry;
#[cfg(target_os = "linux")]
pub mod stdio;
#[cfg(unix)]
pub use place::{
    DESK_DIR_ENV, DeskDirs, SOCKET_ENV, account_home, account_uid, agents_socket_path,
    agents_socket_path_of, default_socket_path, prepare_socket_dir, socket_override, socket_path,
};

pub use desk_error::DeskError;

/// The argument a gateway starts the desk with: in the tray, its window (and WebKit with it) not
/// made until a request is there to be decided.
pub const DESK_IN_TRAY: &str = "--tray";
#[cfg(unix)]
pub use focus::{FOCUS_WAIT, focus_desk};
pub use open::{
    BadRequestUrl, MAX_REQUEST_URL, REQUEST_URL_PREFIX, parse_request_url, request_url,
};
pub use registry::{
    Invalid, MAX_NAME, RegistryAnswer, RegistryCode, RegistryRequest, SecretText, ServerSpec,
    Setting, Upstream, check_name,
};

/// The protocol version this build speaks. Both sides must speak the same one. Version 2: the
/// desk runs the MCP session and the upstream; the gateway is a pipe.
pub const PROTOCOL_VERSION: u32 = 2;

/// The largest frame accepted, in bytes (16 MiB: twice the largest canonical plan).
pub const MAX_FRAME: usize = 16 * 1024 * 1024;

/// What the agent wants reached, as the gateway was told on its command line.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Reach {
    /// The built-in SQLite tools on this file (`--db PATH`; absolute, resolved by the gateway).
    Builtin {
        /// The database file.
        db: String,
    },
    /// A streamable-HTTP MCP server (`--url URL`).
    Url {
        /// Its URL.
        url: String,
    },
    /// An ad-hoc stdio server (`-- CMD ARGS...`), started by the desk as its own child with the
    /// working directory and environment the agent's client gave the gateway.
    Command {
        /// The program and its arguments.
        argv: Vec<String>,
        /// The gateway's working directory.
        cwd: String,
        /// The gateway's environment, as pairs (values may be credentials: never printed).
        env: Vec<(String, String)>,
    },
    /// A server registered in the desk by name (`--server NAME`).
    Server {
        /// The registered name.
        name: String,
    },
}

impl fmt::Debug for Reach {
    // The environment may carry an upstream's credentials: names only, never values.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reach::Builtin { db } => f.debug_struct("Builtin").field("db", db).finish(),
            Reach::Url { url } => f.debug_struct("Url").field("url", url).finish(),
            Reach::Command { argv, cwd, env } => f
                .debug_struct("Command")
                .field("argv", argv)
                .field("cwd", cwd)
                .field("env", &env.iter().map(|(k, _)| k).collect::<Vec<_>>())
                .finish(),
            Reach::Server { name } => f.debug_struct("Server").field("name", name).finish(),
        }
    }
}

/// The first frame of a connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Hello {
    /// A gateway: relay MCP to what [`Reach`] names.
    Gateway {
        /// [`PROTOCOL_VERSION`] of the gateway.
        version: u32,
        /// What to reach.
        reach: Reach,
        /// A name to show the person (`--name`): a display label, never identity or policy.
        label: Option<String>,
        /// How long the agent would like a preflight to wait for a person (the desk caps it).
        wait_ms: Option<u64>,
        /// The gateway's process id, for the person's information.
        pid: u32,
        /// Whether the gateway can hand the agent's stdin and stdout to the desk (see
        /// `stdio`, Linux): it offers only when both are pipes or sockets. Absent on the wire
        /// when false, and a desk that predates it ignores it, so a mixed pair relays as before.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stdio: bool,
    },
    /// A second start of the desk, or `countersign open`: bring the running desk's window
    /// forward, showing `request` when one is named. Build it with [`Hello::focus`].
    Focus {
        /// [`PROTOCOL_VERSION`] of the second desk.
        version: u32,
        /// The request to show, from a `countersign://request/<id>` URL ([`parse_request_url`]).
        /// It only selects what the window shows; it never approves or denies. Absent on the wire
        /// when `None`, and a desk that predates it ignores it (a plain focus), so both sides of
        /// a mixed pair still understand each other.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request: Option<u64>,
    },
    /// `countersign server ...` or `countersign install`: a request to the registry of servers
    /// (see [`RegistryRequest`]), answered with `R` frames.
    Registry {
        /// [`PROTOCOL_VERSION`] of the command.
        version: u32,
        /// What it asks.
        request: RegistryRequest,
    },
}

impl Hello {
    /// A [`Hello::Focus`] of this build, showing `request` when given.
    pub fn focus(request: Option<u64>) -> Hello {
        Hello::Focus {
            version: PROTOCOL_VERSION,
            request,
        }
    }
}

/// The desk's answer to a [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Welcome {
    /// The upstream is reached; MCP may flow.
    Accepted {
        /// The desk's [`PROTOCOL_VERSION`].
        version: u32,
        /// The tenant assigned to this connection.
        tenant: String,
        /// The desk takes the stdio the gateway offered: the gateway sends it next (see
        /// `stdio`). Only ever true when the hello offered it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stdio: bool,
    },
    /// The desk will not serve this hello.
    Refused {
        /// Why, as a code.
        code: RefusedCode,
        /// Why, for a person.
        message: String,
    },
}

/// Why a hello was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RefusedCode {
    /// The two sides speak different protocol versions.
    VersionMismatch,
    /// `--server NAME` names no server registered in the desk.
    NoSuchServer,
    /// The hello is malformed (an empty command, a relative path, ...).
    BadHello,
    /// The upstream could not be started or did not complete the MCP handshake.
    UpstreamFailed,
    /// The gateway runs under another account than the desk's, and that account is not listed
    /// in the desk's settings, or asked for something only the desk's own account may ask for
    /// (a command or the built-in tools, which would run as the desk's account).
    AccountNotAllowed,
    /// The desk already serves as many connections of this account as it allows.
    Busy,
}

impl RefusedCode {
    /// The code as it appears on the wire.
    pub fn code(self) -> &'static str {
        match self {
            RefusedCode::VersionMismatch => "version_mismatch",
            RefusedCode::NoSuchServer => "no_such_server",
            RefusedCode::BadHello => "bad_hello",
            RefusedCode::UpstreamFailed => "upstream_failed",
            RefusedCode::AccountNotAllowed => "account_not_allowed",
            RefusedCode::Busy => "busy",
        }
    }
}

/// One frame.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Frame {
    /// `H`: the first frame of a connection.
    Hello(Hello),
    /// `W`: the desk's answer to it.
    Welcome(Welcome),
    /// `M`: one MCP message, as bytes (the desk parses it; it may be hostile).
    Mcp(Vec<u8>),
    /// `E`: bytes from the upstream's stderr.
    Stderr(Vec<u8>),
    /// `R`: the desk's answer to a [`Hello::Registry`].
    Registry(RegistryAnswer),
}

impl fmt::Debug for Frame {
    // MCP messages carry tokens and arguments: their size only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Frame::Hello(h) => f.debug_tuple("Hello").field(h).finish(),
            Frame::Welcome(w) => f.debug_tuple("Welcome").field(w).finish(),
            Frame::Mcp(b) => write!(f, "Mcp(<{} bytes>)", b.len()),
            Frame::Stderr(b) => write!(f, "Stderr(<{} bytes>)", b.len()),
            Frame::Registry(r) => f.debug_tuple("Registry").field(r).finish(),
        }
    }
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
    /// A frame has no kind byte, or one this version does not know.
    #[error("unknown frame kind {0:#04x}")]
    UnknownKind(u8),
    /// A control frame is not valid JSON of the expected shape.
    #[error("malformed frame: {0}")]
    Malformed(#[from] serde_json::Error),
    /// A frame began but did not complete within the deadline.
    #[error("a frame began but did not complete within {0:?}")]
    Stalled(std::time::Duration),
    /// The socket failed.
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
}

/// The bytes of one frame, length prefix included.
pub fn encode(frame: &Frame) -> Result<Vec<u8>, FrameError> {
    let control;
    let (kind, body): (u8, &[u8]) = match frame {
        Frame::Hello(h) => {
            control = serde_json::to_vec(h)?;
            (b'H', &control)
        }
        Frame::Welcome(w) => {
            control = serde_json::to_vec(w)?;
            (b'W', &control)
        }
        Frame::Mcp(m) => (b'M', m),
        Frame::Stderr(e) => (b'E', e),
        Frame::Registry(r) => {
            control = serde_json::to_vec(r)?;
            (b'R', &control)
        }
    };
    let len = body.len() + 1;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    let mut out = Vec::with_capacity(4 + len);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.push(kind);
    out.extend_from_slice(body);
    Ok(out)
}

/// Decodes the body of one frame (kind byte first), as read after its length.
pub fn decode(body: &[u8]) -> Result<Frame, FrameError> {
    let (&kind, rest) = body.split_first().ok_or(FrameError::UnknownKind(0))?;
    Ok(match kind {
        b'H' => Frame::Hello(serde_json::from_slice(rest)?),
        b'W' => Frame::Welcome(serde_json::from_slice(rest)?),
        b'M' => Frame::Mcp(rest.to_vec()),
        b'E' => Frame::Stderr(rest.to_vec()),
        b'R' => Frame::Registry(serde_json::from_slice(rest)?),
        other => return Err(FrameError::UnknownKind(other)),
    })
}

/// Writes one frame.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    writer: &mut W,
    frame: &Frame,
) -> Result<(), FrameError> {
    writer.write_all(&encode(frame)?).await?;
    writer.flush().await?;
    Ok(())
}

/// Reads one frame. [`FrameError::Closed`] when the peer closed cleanly before a new frame.
pub async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Frame, FrameError> {
    read_frame_within(reader, None).await
}

/// Reads one frame; once its first byte has arrived, the whole frame must arrive within
/// `deadline` (when given), else [`FrameError::Stalled`]. Waiting for a frame to begin has no
/// limit: a quiet connection is idle, not stuck.
///
/// Memory follows the bytes that arrived, not the length a frame announces: a peer that
/// announces 16 MiB and sends a byte holds a few KiB, not 16 MiB.
pub async fn read_frame_within<R: AsyncRead + Unpin>(
    reader: &mut R,
    deadline: Option<std::time::Duration>,
) -> Result<Frame, FrameError> {
    let mut len = [0u8; 4];
    match reader.read(&mut len[..1]).await {
        Ok(0) => return Err(FrameError::Closed),
        Ok(_) => {}
        Err(e) => return Err(e.into()),
    }
    let rest = async {
        reader.read_exact(&mut len[1..]).await?;
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_FRAME {
            return Err(FrameError::TooLarge(len));
        }
        let mut body = Vec::with_capacity(len.min(64 * 1024));
        (&mut *reader)
            .take(len as u64)
            .read_to_end(&mut body)
            .await?;
        if body.len() < len {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
        decode(&body)
    };
    match deadline {
        None => rest.await,
        Some(deadline) => tokio::time::timeout(deadline, rest)
            .await
            .unwrap_or(Err(FrameError::Stalled(deadline))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn frames_round_trip() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let sent = [
            Frame::Hello(Hello::Gateway {
                version: PROTOCOL_VERSION,
                reach: Reach::Command {
                    argv: vec!["srv".into(), "--x".into()],
                    cwd: "/w".into(),
                    env: vec![("K".into(), "V".into())],
                },
                label: Some("files".into()),
                wait_ms: Some(5),
                pid: 9,
                stdio: true,
            }),
            Frame::Welcome(Welcome::Accepted {
                version: PROTOCOL_VERSION,
                tenant: "t".into(),
                stdio: true,
            }),
            Frame::Mcp(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec()),
            Frame::Stderr(b"warning\n".to_vec()),
        ];
        for f in &sent {
            write_frame(&mut a, f).await.unwrap();
        }
        for f in &sent {
            assert_eq!(&read_frame(&mut b).await.unwrap(), f);
        }
    }

    #[tokio::test]
    async fn oversized_frame_is_refused_without_reading_it() {
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&((MAX_FRAME as u32) + 1).to_be_bytes())
            .await
            .unwrap();
        assert!(matches!(
            read_frame(&mut b).await,
            Err(FrameError::TooLarge(_))
        ));
    }

    #[tokio::test]
    async fn unknown_kind_and_malformed_control_frames_are_errors_and_clean_close_is_closed() {
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&2u32.to_be_bytes()).await.unwrap();
        a.write_all(b"Z{").await.unwrap();
        a.write_all(&4u32.to_be_bytes()).await.unwrap();
        a.write_all(b"H{x}").await.unwrap();
        a.write_all(&0u32.to_be_bytes()).await.unwrap();
        drop(a);
        assert!(matches!(
            read_frame(&mut b).await,
            Err(FrameError::UnknownKind(b'Z'))
        ));
        assert!(matches!(
            read_frame(&mut b).await,
            Err(FrameError::Malformed(_))
        ));
        assert!(matches!(
            read_frame(&mut b).await,
            Err(FrameError::UnknownKind(0))
        ));
        assert!(matches!(read_frame(&mut b).await, Err(FrameError::Closed)));
    }

    #[test]
    fn wire_names_are_stable() {
        let hello = Hello::Gateway {
            version: 2,
            reach: Reach::Builtin { db: "/d".into() },
            label: None,
            wait_ms: None,
            pid: 1,
            stdio: false,
        };
        // Without the offer, the hello is byte for byte what gateways before the field sent.
        assert_eq!(
            serde_json::to_value(&hello).unwrap(),
            json!({"type": "gateway", "version": 2, "reach": {"kind": "builtin", "db": "/d"},
                   "label": null, "wait_ms": null, "pid": 1})
        );
        let Hello::Gateway { stdio, .. } = serde_json::from_value(json!(
            {"type": "gateway", "version": 2, "reach": {"kind": "builtin", "db": "/d"},
             "label": null, "wait_ms": null, "pid": 1, "stdio": true}))
        .unwrap() else {
            unreachable!("a gateway hello reads as one");
        };
        assert!(stdio);
        let accepted = Welcome::Accepted {
            version: 2,
            tenant: "t".into(),
            stdio: false,
        };
        assert_eq!(
            serde_json::to_value(&accepted).unwrap(),
            json!({"type": "accepted", "version": 2, "tenant": "t"})
        );
        let refused = Welcome::Refused {
            code: RefusedCode::NoSuchServer,
            message: "m".into(),
        };
        assert_eq!(
            serde_json::to_value(&refused).unwrap(),
            json!({"type": "refused", "code": "no_such_server", "message": "m"})
        );
        assert_eq!(
            serde_json::to_value(RefusedCode::AccountNotAllowed).unwrap(),
            json!(RefusedCode::AccountNotAllowed.code())
        );
        assert_eq!(
            serde_json::to_value(Reach::Server { name: "gh".into() }).unwrap(),
            json!({"kind": "server", "name": "gh"})
        );
    }

    #[test]
    fn a_focus_hello_names_a_request_only_when_it_has_one_and_older_forms_still_read() {
        // Without a request, the hello is byte for byte what desks before the field sent.
        assert_eq!(
            serde_json::to_value(Hello::focus(None)).unwrap(),
            json!({"type": "focus", "version": PROTOCOL_VERSION})
        );
        assert_eq!(
            serde_json::to_value(Hello::focus(Some(7))).unwrap(),
            json!({"type": "focus", "version": PROTOCOL_VERSION, "request": 7})
        );
        // An older second desk's hello still reads, as a plain focus.
        let old: Hello = serde_json::from_value(json!({"type": "focus", "version": 2})).unwrap();
        assert_eq!(old, Hello::focus(None));
        // What an older desk reads from a newer hello: unknown fields are ignored.
        #[derive(Deserialize, PartialEq, Debug)]
        #[serde(tag = "type", rename_all = "snake_case")]
        enum OldHello {
            Focus { version: u32 },
        }
        let bytes = serde_json::to_vec(&Hello::focus(Some(7))).unwrap();
        assert_eq!(
            serde_json::from_slice::<OldHello>(&bytes).unwrap(),
            OldHello::Focus { version: 2 }
        );
        // A request that is not a u64 is a malformed hello, not a focus on something else.
        for bad in ["-1", "\"7\"", "1.5", "18446744073709551616", "[7]"] {
            let hello = format!(r#"{{"type": "focus", "version": 2, "request": {bad}}}"#);
            assert!(serde_json::from_str::<Hello>(&hello).is_err(), "{hello}");
        }
    }

    #[test]
    fn debug_never_prints_environment_values_or_messages() {
        let reach = Reach::Command {
            argv: vec!["srv".into()],
            cwd: "/".into(),
            env: vec![("GITHUB_TOKEN".into(), "ghp_secret".into())],
        };
        let shown = format!("{reach:?}");
        assert!(shown.contains("GITHUB_TOKEN") && !shown.contains("ghp_secret"));
        let frame = Frame::Mcp(br#"{"confirmToken":"cs1.abc"}"#.to_vec());
        assert!(!format!("{frame:?}").contains("cs1"));
    }
}
