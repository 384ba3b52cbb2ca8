//! The engine value, and what every room of it uses: its state, its clock, the history it
//! writes and the queue changes it publishes.
//!
//! The rooms (queue, approve, confirm, change, listing, planning, describing, rounds, grants)
//! each add the methods of one concern to [`Engine`]; this file holds only what they share.

use countersign_core::Tenant;
use std::sync::{Arc, Mutex};

/// The one poison-tolerant lock (see `countersign_core::sync`), as the engine's rooms import it.
pub(crate) use countersign_core::sync::lock;
use countersign_core::telemetry::{ConfirmEvent, EventKind};
use countersign_core::token::SigningKey;
use countersign_core::{GateClass, Refusal};
use countersign_store::{HistoryFilter, Records, StoreError};
use tokio::sync::broadcast;

use crate::answer::{ErrorCode, Stopped};
use crate::config::{EngineConfig, NoKey};
use crate::describing;
use crate::queue::QueueChange;
use crate::state::{Inner, Live, State};
use crate::tally::{Outcome, Tallied};

/// The desk's engine. Cheap to clone: every clone is the same engine.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("records", &self.inner.store)
            .finish_non_exhaustive()
    }
}

pub(crate) fn refused(refusal: Refusal) -> Stopped {
    Stopped::Refused {
        refusal,
        message: refusal.next_move().to_owned(),
    }
}

/// What an agent is told when a call could not be checked because the records (the desk's file,
/// a team server's control database) could not be read: an outage, never a statement about the
/// tools, the pins or the grants.
pub const RECORDS_UNREADABLE: &str = "Refused: Countersign cannot read the records it checks \
    every call against (the control database, or the desk's records file) right now. This is an \
    outage, not a change to the tools. Nothing was executed. Retry shortly.";

/// The refusal of a call whose records could not be read: `ledger_unreachable`, with
/// [`RECORDS_UNREADABLE`]. Every failed read of a record on a call's way ends here, never in a
/// `None`, an empty list or a "not pinned".
pub(crate) fn outage() -> Stopped {
    Stopped::Refused {
        refusal: Refusal::LedgerUnreachable,
        message: RECORDS_UNREADABLE.to_owned(),
    }
}

pub(crate) fn error(code: ErrorCode, message: impl Into<String>) -> Stopped {
    Stopped::Failed {
        code,
        message: message.into(),
    }
}

impl Engine {
    /// Now, as the configured clock says.
    pub(crate) fn now(&self) -> u64 {
        self.inner.config.clock.now_ms()
    }

    /// Now, in ms since the epoch, as the engine's clock says: for what sits beside the engine
    /// and records times with it (the registry's accepted files), so one clock rules them all.
    pub fn now_ms(&self) -> u64 {
        self.now()
    }

    /// Starts an engine whose records live in `records`: the desk's SQLite file
    /// (`countersign_store::Sqlite`), PostgreSQL for a team's server, or any other implementation
    /// of the trait; the engine opens no file itself. `key` is the signing key, or why there is
    /// none (a missing or locked keychain): the engine then runs, queues and shows requests, but
    /// mints nothing.
    pub fn new(
        config: EngineConfig,
        records: Arc<dyn Records>,
        key: Result<SigningKey, NoKey>,
    ) -> Engine {
        let (changes, _) = broadcast::channel(256);
        Engine {
            inner: Arc::new(Inner {
                live: std::sync::RwLock::new(Live {
                    policy: config.policy.clone(),
                    token_ttl_ms: config.token_ttl_ms,
                    approve_delay_ms: config.approve_delay_ms,
                    held_at_ms: 0,
                }),
                config,
                key: std::sync::RwLock::new(key),
                store: records,
                grants_turn: tokio::sync::Mutex::new(false),
                state: Mutex::new(State {
                    next_id: 1,
                    ..State::default()
                }),
                changes,
                describing: Arc::new(tokio::sync::Semaphore::new(describing::MAX_DESCRIBING)),
                shared: std::sync::OnceLock::new(),
                ruling: std::sync::RwLock::default(),
            }),
        }
    }

    /// History, newest first.
    pub async fn history(&self, filter: &HistoryFilter) -> Result<Vec<ConfirmEvent>, StoreError> {
        self.inner.store.history(filter).await
    }

    /// The records: ledger, approvals, history, pins, grants.
    pub(crate) fn records(&self) -> &dyn Records {
        self.inner.store.as_ref()
    }

    /// Counts `tallied`, where the configuration says counts go.
    pub(crate) fn tally(&self, tallied: Tallied) {
        if let Some(tally) = &self.inner.config.tally {
            tally.count(tallied);
        }
    }

    /// Counts a call of `class` that ended with `outcome`.
    pub(crate) fn tally_request(&self, class: Option<GateClass>, outcome: Outcome) {
        self.tally(Tallied::Request { class, outcome });
    }

    /// Counts what `event` says of an agent's call: the one place history's events become
    /// counts. Issued, denied and accepted events are a person's decision or a step on the way:
    /// the preflight's answer and the execution are what count as the call's outcome.
    fn tally_event(&self, event: &ConfirmEvent) {
        if self.inner.config.tally.is_none() {
            return;
        }
        let (outcome, code) = match event.kind {
            EventKind::Refused { refusal } => (Outcome::Refused, Some(refusal.code())),
            EventKind::Replay => (Outcome::Replay, Some(Refusal::AlreadyUsed.code())),
            EventKind::Rejected { reason } => (Outcome::Refused, Some(reason.code())),
            EventKind::Executed { ok: true } => (Outcome::ExecutedOk, None),
            EventKind::Executed { ok: false } => (Outcome::ExecutedError, None),
            EventKind::OutcomeUnknown => (Outcome::OutcomeUnknown, None),
            _ => return,
        };
        let class = lock(&self.inner.state)
            .connections
            .get(event.tenant.as_str())
            .and_then(|c| c.tools.get(&event.tool))
            .map(|listed| listed.rule.class);
        self.tally_request(class, outcome);
        if let Some(code) = code {
            self.tally(Tallied::Refusal { code });
        }
    }

    /// Writes `event` to history (and to `tracing`, once, whatever becomes of the write), and
    /// counts it.
    pub(crate) async fn record(&self, event: ConfirmEvent) {
        let written = self.inner.store.record(&event).await;
        self.recorded(&event, written);
    }

    /// Counts `event`, whose write to history (done by the store, which emitted it) went as
    /// `written`, and logs a failed write.
    pub(crate) fn recorded(&self, event: &ConfirmEvent, written: Result<(), StoreError>) {
        self.tally_event(event);
        // History is the audit trail, but failing to write it must not turn a refusal into an
        // acceptance or lose the telemetry: the store emits the event whether or not the write
        // succeeds (once), and the failure is logged here.
        if let Err(err) = written {
            tracing::error!(target: "desk", error = %err, "could not write history");
        }
    }

    /// The history event of `tenant`'s call of `tool` decided before it had a plan (unlisted, a
    /// changed definition, arguments that cannot be planned): no target, nonce or plan hash.
    pub(crate) fn unplanned(
        &self,
        kind: EventKind,
        tenant: &Tenant,
        tool: &str,
        note: Option<String>,
    ) -> ConfirmEvent {
        ConfirmEvent {
            at_ms: self.now(),
            kind,
            tool: tool.to_owned(),
            target: None,
            tenant: tenant.to_string(),
            nonce: None,
            plan: None,
            note,
        }
    }

    /// Records a gated call refused before verification, and passes why on.
    pub(crate) async fn rejected(&self, tenant: &Tenant, tool: &str, stopped: Stopped) -> Stopped {
        if stopped.refusal() == Some(Refusal::ToolChanged) {
            return self.tool_changed(tenant, tool).await;
        }
        if stopped.refusal() == Some(Refusal::LedgerUnreachable) {
            // Its history write fails too, most likely: the event still reaches `tracing` and the
            // counts, so an outage shows in the metrics as the refusals it caused.
            let kind = EventKind::Refused {
                refusal: Refusal::LedgerUnreachable,
            };
            self.record(self.unplanned(kind, tenant, tool, None)).await;
            return stopped;
        }
        if let Stopped::Refused {
            refusal:
                refusal @ (Refusal::PolicyForbidden | Refusal::PolicyUnfit | Refusal::BudgetSpent),
            message,
        } = &stopped
        {
            // The rules' refusal, on the record with what the agent was told (the rule's reason).
            let kind = EventKind::Refused { refusal: *refusal };
            self.record(self.unplanned(kind, tenant, tool, Some(message.clone())))
                .await;
            self.tally(crate::tally::Tallied::Refusal {
                code: refusal.code(),
            });
            return stopped;
        }
        if let Stopped::Failed { code, message } = &stopped
            && let Some(reason) = code.rejection()
        {
            let kind = EventKind::Rejected { reason };
            self.record(self.unplanned(kind, tenant, tool, Some(message.clone())))
                .await;
        }
        stopped
    }

    /// Forgets what has expired (spent nonces, approvals) and the oldest history beyond what the
    /// store keeps. The desk calls this on a schedule.
    pub async fn prune(&self) -> Result<countersign_store::Pruned, StoreError> {
        self.inner.store.prune(self.now()).await
    }

    pub(crate) fn publish(&self, change: QueueChange) {
        // No subscriber is not an error: the window may not be open yet.
        let _ = self.inner.changes.send(change);
    }

    /// Tells whoever follows the queue (the window) of a change to requests kept outside this
    /// engine: a team server's, which the desk shows beside its own. It decides nothing: a
    /// subscriber reads the queue again and may notify the person.
    pub fn announce(&self, change: QueueChange) {
        self.publish(change);
    }
}
