//! What the engine answers the session that asked, in its own terms.
//!
//! The session (crates/session) turns these into MCP tool results; the window never sees them.
//! They live here, not in the socket protocol, because no gateway ever receives one: the gateway
//! is a pipe, and the desk's own session is the engine's only caller besides the window.

use std::fmt;

use countersign_core::telemetry::Rejection;
use countersign_core::{GateClass, Refusal};
use serde_json::Value;

/// How the desk classes one listed tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolDecision {
    /// The tool's name.
    pub name: String,
    /// Its gate class under the desk's policy.
    pub class: GateClass,
    /// Why it is not offered to the agent, if it is not (e.g. it already has an argument named
    /// `confirmToken`).
    pub withheld: Option<String>,
    /// What the agent is shown in place of the upstream's listing of it while its definition
    /// waits for the person (changed or new, see [`crate::Engine::register_tools`]): the pinned
    /// definition, or for a new tool its name and a sentence saying it is held back. What the
    /// person has not accepted never reaches the agent: a description can carry an injection.
    pub listed_as: Option<Value>,
}

/// The engine's answer to one request of a session.
#[derive(Clone, PartialEq)]
#[non_exhaustive]
pub enum Answer {
    /// The class of every listed tool.
    Classes {
        /// One per listed tool, in the order given.
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
    /// fields), then report the outcome under this nonce.
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

impl fmt::Debug for Answer {
    // An approval carries a live token: never in a log or a panic message.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Answer::Classes { tools } => f.debug_struct("Classes").field("tools", tools).finish(),
            Answer::Approved {
                target,
                expires_at_ms,
                class,
                ..
            } => f
                .debug_struct("Approved")
                .field("token", &"<redacted>")
                .field("target", target)
                .field("expires_at_ms", expires_at_ms)
                .field("class", class)
                .finish_non_exhaustive(),
            Answer::Accepted { nonce, .. } => f
                .debug_struct("Accepted")
                .field("nonce", nonce)
                .finish_non_exhaustive(),
            Answer::Refused { refusal, message } => f
                .debug_struct("Refused")
                .field("refusal", refusal)
                .field("message", message)
                .finish(),
            Answer::Done => f.write_str("Done"),
            Answer::Error { code, message } => f
                .debug_struct("Error")
                .field("code", code)
                .field("message", message)
                .finish(),
        }
    }
}

/// Failures that are not refusals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The connection is unknown to the engine (it disconnected).
    NotIntroduced,
    /// The tool is not listed for this connection, is open, or was withheld.
    UnknownTool,
    /// The arguments cannot be planned (not an object, too deep, too large, unsafe numbers...).
    BadArguments,
    /// The desk cannot mint: no secret (keychain missing or locked).
    NoSecret,
    /// Too many requests already wait for a person, from this connection or from all, or the
    /// call's SQL could not be described just now (a lock, the time limit, every turn to
    /// describe taken): nothing ran, and the message says which and what to do.
    Busy,
    /// Anything else on the desk's side.
    Internal,
}

impl ErrorCode {
    /// A stable code.
    pub fn code(self) -> &'static str {
        match self {
            ErrorCode::NotIntroduced => "not_introduced",
            ErrorCode::UnknownTool => "unknown_tool",
            ErrorCode::BadArguments => "bad_arguments",
            ErrorCode::NoSecret => "no_secret",
            ErrorCode::Busy => "busy",
            ErrorCode::Internal => "internal",
        }
    }

    /// How history records this error, when it is a gated call refused before verification.
    pub fn rejection(self) -> Option<Rejection> {
        match self {
            ErrorCode::UnknownTool => Some(Rejection::UnknownTool),
            ErrorCode::BadArguments => Some(Rejection::BadArguments),
            ErrorCode::NoSecret => Some(Rejection::NoSecret),
            ErrorCode::Busy => Some(Rejection::Busy),
            ErrorCode::NotIntroduced | ErrorCode::Internal => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_of_an_approval_does_not_leak_the_token() {
        let a = Answer::Approved {
            text: "confirmToken: cs1.secret".into(),
            token: "cs1.secret".into(),
            target: "t".into(),
            expires_at_ms: 1,
            class: GateClass::Once,
        };
        assert!(!format!("{a:?}").contains("cs1.secret"));
    }
}
