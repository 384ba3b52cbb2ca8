//! Confirmation events: what history records and what goes to `tracing` under target `confirm`.
//!
//! One event type serves both, so the audit trail and the logs cannot drift apart. Refusals and
//! replays are security events (the record that an approval boundary was tested): they are emitted
//! at `WARN`, and the project's subscriber always enables target `confirm`, whatever the user's
//! filter says. The token itself is never part of an event; the nonce is, since it ties a replay to
//! the issuance it replays.

use serde::{Deserialize, Serialize};

use crate::plan::PlanHash;
use crate::refusal::Refusal;
use crate::token::Nonce;

/// The `tracing` target of every confirmation event.
pub const TARGET: &str = "confirm";

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// A person approved and a token was minted.
    Issued,
    /// A confirm passed verification (and, for single-use tools, its nonce was spent).
    Accepted,
    /// A confirm was refused; `refusal` says why (never `already_used`: that is [`EventKind::Replay`]).
    Refused {
        /// The refusal code.
        refusal: Refusal,
    },
    /// A spent single-use token was presented again.
    Replay,
    /// A person denied the request.
    Denied,
    /// The approved action ran; `ok` says whether the upstream reported success.
    Executed {
        /// Whether the execution succeeded.
        ok: bool,
    },
    /// A gated call (a preflight or a confirm) was refused before verification could begin:
    /// `reason` says why. Probing with unknown tools or bad arguments is on the record too.
    Rejected {
        /// Why.
        reason: Rejection,
    },
    /// The approved action was handed to the upstream and its answer never came (the upstream
    /// died, the connection broke, the wait ran out): whether it ran, in whole or in part, is
    /// not known. Not a failure: it may have run.
    OutcomeUnknown,
    /// A person approved a change to the desk itself (a registered server, the policy, a tool
    /// definition): `tool` is `change:<kind>`, `target` what changes. A denied change is
    /// [`EventKind::Denied`] with the same `tool` and `target`.
    Changed,
    /// The rules over arguments (`policy.cedar`) opened a call a person would otherwise have
    /// been asked about: it ran without a click, with nothing minted. `note` names the rules'
    /// lines; `plan` is the plan's hash. (A call open by its annotations is not recorded, as
    /// before rules.)
    Opened,
}

/// Why a gated call was refused before the verification chain: the codes an agent receives in
/// `structuredContent.error`, and that history stores in its refusal column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Rejection {
    /// The tool is not a gated tool this connection offers.
    UnknownTool,
    /// The upstream does not list the tool at all: the desk cannot tell what it does.
    UnlistedTool,
    /// The arguments cannot be planned (not an object, too deep, too large, a confirm sent as a
    /// preflight...).
    BadArguments,
    /// The desk has no secret (keychain missing or locked): nothing can be minted or verified.
    NoSecret,
    /// Too many requests already wait for a person.
    Busy,
}

impl Rejection {
    /// Every rejection.
    pub const ALL: [Rejection; 5] = [
        Rejection::UnknownTool,
        Rejection::UnlistedTool,
        Rejection::BadArguments,
        Rejection::NoSecret,
        Rejection::Busy,
    ];

    /// The stable code, e.g. `unknown_tool`.
    pub fn code(self) -> &'static str {
        match self {
            Rejection::UnknownTool => "unknown_tool",
            Rejection::UnlistedTool => "unlisted_tool",
            Rejection::BadArguments => "bad_arguments",
            Rejection::NoSecret => "no_secret",
            Rejection::Busy => "busy",
        }
    }

    /// Parses a code back; `None` for anything unknown.
    pub fn from_code(code: &str) -> Option<Rejection> {
        Rejection::ALL.into_iter().find(|r| r.code() == code)
    }
}

impl EventKind {
    /// The history code: `issued`, `accepted`, `refused`, `replay`, `denied`, `executed`,
    /// `outcome_unknown`, `rejected`, `changed`, `opened`.
    pub fn code(self) -> &'static str {
        match self {
            EventKind::Issued => "issued",
            EventKind::Accepted => "accepted",
            EventKind::Refused { .. } => "refused",
            EventKind::Replay => "replay",
            EventKind::Denied => "denied",
            EventKind::Executed { .. } => "executed",
            EventKind::OutcomeUnknown => "outcome_unknown",
            EventKind::Rejected { .. } => "rejected",
            EventKind::Changed => "changed",
            EventKind::Opened => "opened",
        }
    }

    /// The kind as history stores it: its code, the refusal's or rejection's code (for the kinds
    /// that carry one), and an execution's outcome. The chain ([`crate::chain::Link`]) hashes
    /// these same values.
    pub fn columns(self) -> (&'static str, Option<&'static str>, Option<bool>) {
        match self {
            EventKind::Refused { refusal } => (self.code(), Some(refusal.code()), None),
            EventKind::Rejected { reason } => (self.code(), Some(reason.code()), None),
            EventKind::Executed { ok } => (self.code(), None, Some(ok)),
            EventKind::Issued
            | EventKind::Accepted
            | EventKind::Replay
            | EventKind::Denied
            | EventKind::OutcomeUnknown
            | EventKind::Changed
            | EventKind::Opened => (self.code(), None, None),
        }
    }

    /// The event for a refusal of the verification chain: `already_used` is a replay.
    pub fn for_refusal(refusal: Refusal) -> EventKind {
        match refusal {
            Refusal::AlreadyUsed => EventKind::Replay,
            Refusal::Denied => EventKind::Denied,
            refusal => EventKind::Refused { refusal },
        }
    }

    /// Whether this is a security event that must never be sampled or filtered out.
    pub fn is_security_event(self) -> bool {
        matches!(
            self,
            EventKind::Refused { .. } | EventKind::Replay | EventKind::Rejected { .. }
        )
    }
}

/// One confirmation event. Contains no token, by construction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfirmEvent {
    /// When it happened, in ms since the Unix epoch.
    pub at_ms: u64,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
    /// The tool concerned.
    pub tool: String,
    /// The resolved target, when one was known.
    pub target: Option<String>,
    /// The connection (agent session) concerned.
    pub tenant: String,
    /// The token's nonce, when a token was involved and could be read.
    pub nonce: Option<Nonce>,
    /// The plan hash, when known.
    pub plan: Option<PlanHash>,
    /// A short free text: a denial's note, an execution's error.
    pub note: Option<String>,
}

impl ConfirmEvent {
    /// The event as one line of a table, for people at a terminal (`history`): time, kind, its
    /// refusal code or outcome, tool, target and tenant, in fixed columns.
    pub fn table_row(&self) -> String {
        let detail = match self.kind {
            EventKind::Refused { refusal } => refusal.code(),
            EventKind::Executed { ok: true } => "ok",
            EventKind::Executed { ok: false } => "failed",
            EventKind::OutcomeUnknown => "unknown",
            _ => "",
        };
        format!(
            "{:>13}  {:<9} {:<18} {:<20} {:<24} {}",
            self.at_ms,
            self.kind.code(),
            detail,
            self.tool,
            self.target.as_deref().unwrap_or("-"),
            self.tenant
        )
    }

    /// Sends the event to `tracing` under target [`TARGET`]: security events at `WARN`, the rest
    /// at `INFO`. Emitting is not installing: the core never sets a subscriber.
    pub fn emit(&self) {
        let nonce = self.nonce.map(|n| n.to_hex());
        let plan = self.plan.map(|p| p.to_hex());
        let refusal = match self.kind {
            EventKind::Refused { refusal } => Some(refusal.code()),
            EventKind::Replay => Some(Refusal::AlreadyUsed.code()),
            EventKind::Rejected { reason } => Some(reason.code()),
            _ => None,
        };
        macro_rules! event {
            ($level:expr) => {
                tracing::event!(
                    target: TARGET,
                    $level,
                    event = self.kind.code(),
                    refusal = refusal,
                    tool = %self.tool,
                    target = self.target.as_deref(),
                    tenant = %self.tenant,
                    nonce = nonce.as_deref(),
                    plan = plan.as_deref(),
                    at_ms = self.at_ms,
                    "confirm {}",
                    self.kind.code()
                )
            };
        }
        if self.kind.is_security_event() {
            event!(tracing::Level::WARN);
        } else {
            event!(tracing::Level::INFO);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn already_used_is_recorded_as_a_replay() {
        assert_eq!(
            EventKind::for_refusal(Refusal::AlreadyUsed),
            EventKind::Replay
        );
        assert_eq!(
            EventKind::for_refusal(Refusal::Expired),
            EventKind::Refused {
                refusal: Refusal::Expired
            }
        );
        assert!(EventKind::Replay.is_security_event());
        assert!(!EventKind::Issued.is_security_event());
    }

    #[test]
    fn event_serializes_with_its_kind_and_refusal_code() {
        let event = ConfirmEvent {
            at_ms: 5,
            kind: EventKind::Refused {
                refusal: Refusal::PlanChanged,
            },
            tool: "execute".into(),
            target: Some("db".into()),
            tenant: "c1".into(),
            nonce: None,
            plan: None,
            note: None,
        };
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["kind"], "refused");
        assert_eq!(json["refusal"], "plan_changed");
        let back: ConfirmEvent = serde_json::from_value(json).unwrap();
        assert_eq!(back, event);
    }
}
