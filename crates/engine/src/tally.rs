//! What the engine counts as it decides, for whoever keeps metrics (a team server's Prometheus
//! endpoint).
//!
//! The engine decides every call, so it is the one place that can count them without the counts
//! drifting from what happened: the events it writes to history ([`crate::Engine`]'s `record`)
//! are tallied as they are written, and the few answers that write no event (an open call
//! forwarded, a preflight answered `approved`, `denied` or `pending`, a preflight refused because
//! nobody can approve) are tallied where they are given. Nothing is kept here: each tally goes to
//! the [`Tally`] in the engine's configuration, if there is one, and the engine depends on no
//! metrics library (the desk has none).
//!
//! Every value is from a fixed set (a class, an outcome, a refusal code) or a duration: never a
//! tool, a target, a tenant or anything else an agent chooses.

use std::sync::Arc;
use std::time::Duration;

use countersign_core::GateClass;

/// What became of an agent's tool call, as far as this engine decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// An open tool's call, sent on to the upstream.
    Forwarded,
    /// A preflight answered with a token (a person approved, or a grant covered it).
    Approved,
    /// A preflight answered that a person denied it.
    Denied,
    /// A preflight answered before a person decided (the request still waits).
    Pending,
    /// Refused: by the verification chain, before it (a rejection), or because nobody can
    /// approve.
    Refused,
    /// A confirm of a works-once token already spent.
    Replay,
    /// A confirmed call ran, and the upstream reported success.
    ExecutedOk,
    /// A confirmed call ran, and the upstream reported an error (or it was never sent).
    ExecutedError,
    /// A confirmed call was handed to the upstream and its answer never came.
    OutcomeUnknown,
}

impl Outcome {
    /// Every outcome.
    pub const ALL: [Outcome; 9] = [
        Outcome::Forwarded,
        Outcome::Approved,
        Outcome::Denied,
        Outcome::Pending,
        Outcome::Refused,
        Outcome::Replay,
        Outcome::ExecutedOk,
        Outcome::ExecutedError,
        Outcome::OutcomeUnknown,
    ];

    /// The stable name, e.g. `executed_ok`.
    pub fn code(self) -> &'static str {
        match self {
            Outcome::Forwarded => "forwarded",
            Outcome::Approved => "approved",
            Outcome::Denied => "denied",
            Outcome::Pending => "pending",
            Outcome::Refused => "refused",
            Outcome::Replay => "replay",
            Outcome::ExecutedOk => "executed_ok",
            Outcome::ExecutedError => "executed_error",
            Outcome::OutcomeUnknown => "outcome_unknown",
        }
    }
}

/// How a nonce's spend against the records ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Spend {
    /// Spent now.
    Spent,
    /// Spent before: a replay.
    AlreadySpent,
    /// The records could not vouch for it (refused `ledger_unreachable`).
    Unreachable,
}

impl Spend {
    /// The stable name: `spent`, `already_spent`, `unreachable`.
    pub fn code(self) -> &'static str {
        match self {
            Spend::Spent => "spent",
            Spend::AlreadySpent => "already_spent",
            Spend::Unreachable => "unreachable",
        }
    }
}

/// One thing the engine decided, as a count.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Tallied {
    /// An agent's tool call ended (or was answered) with `outcome`. `class`: the tool's class on
    /// its connection, `None` for a tool the connection does not offer.
    Request {
        /// The tool's class.
        class: Option<GateClass>,
        /// What became of it.
        outcome: Outcome,
    },
    /// An agent was refused with `code`: a [`countersign_core::Refusal`]'s code or a
    /// [`countersign_core::telemetry::Rejection`]'s (fixed sets).
    Refusal {
        /// The code.
        code: &'static str,
    },
    /// A person decided a waiting call, `waited` after it was queued.
    Decided {
        /// Approved (else denied).
        approved: bool,
        /// From queued to decided, by the engine's clock.
        waited: Duration,
    },
    /// A nonce was spent against the records, which took `took`: the spend and the acceptance's
    /// history event ([`Records::spend_recording`](countersign_store::Records::spend_recording)),
    /// one after the other on the desk, together on PostgreSQL.
    Spent {
        /// How it ended.
        spend: Spend,
        /// How long the records took to answer.
        took: Duration,
    },
}

/// Where the engine's tallies go: a function the engine's owner gives it
/// ([`crate::EngineConfig::tally`]). Called on the deciding task, so it must be quick and must
/// not block (an increment, an observation).
#[derive(Clone)]
pub struct Tally(Arc<dyn Fn(Tallied) + Send + Sync>);

impl Tally {
    /// Tallies go to `f`.
    pub fn new(f: impl Fn(Tallied) + Send + Sync + 'static) -> Self {
        Tally(Arc::new(f))
    }

    pub(crate) fn count(&self, tallied: Tallied) {
        (self.0)(tallied)
    }
}

impl std::fmt::Debug for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tally(..)")
    }
}
