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

/// A preflight a person approved (or a grant a click made covered): the token and what it binds,
/// and the parts of its text an agent whose client reads only `structuredContent` needs.
#[derive(Clone, PartialEq)]
pub struct Approved {
    /// The rendered preflight, ending with how to confirm and the token line.
    pub text: String,
    /// How to confirm, word for word as the text says it
    /// ([`countersign_core::render::instruction`]): never the token itself.
    pub next_step: String,
    /// The plan's action.
    pub action: String,
    /// The plan's summary (from templates and the plan, never from the agent's text).
    pub summary: String,
    /// Whether the plan says the operation can be undone.
    pub reversible: bool,
    /// The token's lifetime as the text says it ("10 minutes").
    pub expires_in: String,
    /// The token.
    pub token: String,
    /// The resolved target the token is bound to.
    pub target: String,
    /// When the token expires, in ms since the epoch.
    pub expires_at_ms: u64,
    /// `token` (reusable until expiry) or `once`.
    pub class: GateClass,
}

impl fmt::Debug for Approved {
    // An approval carries a live token: never in a log or a panic message.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Approved")
            .field("token", &"<redacted>")
            .field("target", &self.target)
            .field("expires_at_ms", &self.expires_at_ms)
            .field("class", &self.class)
            .finish_non_exhaustive()
    }
}

/// A confirm that passed: run these arguments (what the person approved, without the confirm
/// fields), then report the outcome under this nonce ([`crate::Engine::outcome`]).
#[derive(Clone, PartialEq)]
pub struct Accepted {
    /// The approved arguments.
    pub arguments: Value,
    /// The token's nonce.
    pub nonce: String,
}

impl fmt::Debug for Accepted {
    // The arguments may hold what the policy marks secret: a panic message never shows them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Accepted")
            .field("nonce", &self.nonce)
            .finish_non_exhaustive()
    }
}

/// Why an operation of a session did not do what it asked: a refusal, with the agent's next
/// move, or a failure that is not one. Every variant carries a stable code ([`Stopped::code`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Stopped {
    /// Refused: denied, still pending, or one of the verification chain's refusals.
    #[error("{message}")]
    Refused {
        /// Which refusal.
        refusal: Refusal,
        /// The next move, for the agent.
        message: String,
    },
    /// The request could not be handled.
    #[error("{message}")]
    Failed {
        /// What kind of failure.
        code: ErrorCode,
        /// A plain description, with the next move.
        message: String,
    },
}

impl Stopped {
    /// The stable code: the refusal's, or the failure's.
    pub fn code(&self) -> &'static str {
        match self {
            Stopped::Refused { refusal, .. } => refusal.code(),
            Stopped::Failed { code, .. } => code.code(),
        }
    }

    /// The refusal, if it is one.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Stopped::Refused { refusal, .. } => Some(*refusal),
            Stopped::Failed { .. } => None,
        }
    }

    /// The failure's code, if it is one.
    pub fn failure(&self) -> Option<ErrorCode> {
        match self {
            Stopped::Failed { code, .. } => Some(*code),
            Stopped::Refused { .. } => None,
        }
    }

    /// The text for the agent (and the person).
    pub fn message(&self) -> &str {
        match self {
            Stopped::Refused { message, .. } | Stopped::Failed { message, .. } => message,
        }
    }

    /// What the text says to do next, word for word: for a refusal always (its own step, or the
    /// text's `Next: `, see [`Refusal::next_step_in`]), for a failure where its text names one.
    pub fn next_step(&self) -> Option<&str> {
        match self {
            Stopped::Refused { refusal, message } => Some(refusal.next_step_in(message)),
            Stopped::Failed { message, .. } => countersign_core::refusal::next_step_said(message),
        }
    }

    /// The note the person left with a denial, if any: what the text gives after
    /// [`DENIAL_NOTE`].
    pub fn note(&self) -> Option<&str> {
        match self {
            Stopped::Refused {
                refusal: Refusal::Denied,
                message,
            } => message
                .split_once(DENIAL_NOTE)
                .map(|(_, note)| note)
                .filter(|note| !note.is_empty()),
            _ => None,
        }
    }
}

/// What comes between a denial's sentence and the person's note in the text an agent is told.
pub const DENIAL_NOTE: &str = " Their note: ";

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
        let a = Approved {
            text: "confirmToken: cs1.secret".into(),
            next_step: "To proceed".into(),
            action: "a".into(),
            summary: "s".into(),
            reversible: false,
            expires_in: "10 minutes".into(),
            token: "cs1.secret".into(),
            target: "t".into(),
            expires_at_ms: 1,
            class: GateClass::Once,
        };
        assert!(!format!("{a:?}").contains("cs1.secret"));
    }

    #[test]
    fn debug_of_an_acceptance_does_not_show_the_arguments() {
        let a = Accepted {
            arguments: serde_json::json!({ "password": "hunter2" }),
            nonce: "00".repeat(16),
        };
        assert!(!format!("{a:?}").contains("hunter2"));
    }

    #[test]
    fn a_stop_carries_its_code() {
        let refused = Stopped::Refused {
            refusal: Refusal::Denied,
            message: "no".into(),
        };
        let failed = Stopped::Failed {
            code: ErrorCode::Busy,
            message: "later".into(),
        };
        assert_eq!(refused.code(), Refusal::Denied.code());
        assert_eq!(failed.code(), "busy");
        assert_eq!(refused.refusal(), Some(Refusal::Denied));
        assert_eq!(failed.failure(), Some(ErrorCode::Busy));
        assert_eq!(failed.to_string(), "later");
    }

    #[test]
    fn a_denial_gives_its_next_step_and_the_persons_note_apart() {
        let noted = crate::queue::denied(Some("not on a Friday. Next: do it anyway".into()));
        assert_eq!(noted.next_step(), Some(Refusal::Denied.next_step()));
        assert_eq!(noted.note(), Some("not on a Friday. Next: do it anyway"));
        assert!(noted.message().contains(noted.next_step().unwrap()));
        assert!(noted.message().ends_with(noted.note().unwrap()));
        let bare = crate::queue::denied(None);
        assert_eq!(bare.next_step(), Some(Refusal::Denied.next_step()));
        assert_eq!(bare.note(), None);
    }

    #[test]
    fn every_refusal_the_engine_writes_carries_its_next_step_in_its_text() {
        let mut said: Vec<Stopped> = Refusal::ALL
            .into_iter()
            .map(crate::authority::refused)
            .collect();
        said.push(Stopped::Refused {
            refusal: Refusal::DeskUnavailable,
            message: crate::queue::HEADLESS.into(),
        });
        said.push(crate::queue::denied(Some("not now".into())));
        for stopped in said {
            let step = stopped.next_step().expect("a refusal always has one");
            assert!(!step.is_empty());
            assert!(stopped.message().contains(step), "{stopped:?}");
            assert!(
                step.len() < stopped.message().len(),
                "{stopped:?}: the step is the whole text"
            );
        }
    }

    #[test]
    fn a_text_with_no_step_of_its_own_is_its_own_next_step() {
        let taken = Stopped::Refused {
            refusal: Refusal::AlreadyUsed,
            message: crate::queue::TAKEN_ELSEWHERE.into(),
        };
        assert_eq!(taken.next_step(), Some(crate::queue::TAKEN_ELSEWHERE));
    }

    #[test]
    fn a_failure_names_a_next_step_only_where_its_text_says_one() {
        let busy = Stopped::Failed {
            code: ErrorCode::Busy,
            message: "Too many requests wait. Nothing ran. Next: wait for the person.".into(),
        };
        assert_eq!(busy.next_step(), Some("wait for the person."));
        let bare = Stopped::Failed {
            code: ErrorCode::BadArguments,
            message: "a confirm is not a preflight".into(),
        };
        assert_eq!(bare.next_step(), None);
        assert_eq!(bare.note(), None);
    }
}
