//! The engine value, and what every room of it uses: its state, its clock, the history it
//! writes and the queue changes it publishes.
//!
//! The rooms (queue, approve, confirm, change, listing, planning, describing, rounds, grants)
//! each add the methods of one concern to [`Engine`]; this file holds only what they share.

use std::sync::{Arc, Mutex, MutexGuard};

use countersign_core::Refusal;
use countersign_core::telemetry::{ConfirmEvent, EventKind};
use countersign_core::token::SigningKey;
use countersign_store::{HistoryFilter, Store};
use tokio::sync::broadcast;

use crate::answer::{Answer, ErrorCode};
use crate::config::{EngineConfig, EngineError};
use crate::describing;
use crate::queue::QueueChange;
use crate::state::{Inner, Live, State};

/// The desk's engine. Cheap to clone: every clone is the same engine.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("store", &self.inner.config.store_path)
            .finish_non_exhaustive()
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock must not take the desk down with it: the state is kept
    // consistent by each critical section, so recover it.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(crate) fn refused(refusal: Refusal) -> Answer {
    Answer::Refused {
        refusal,
        message: refusal.next_move().to_owned(),
    }
}

pub(crate) fn error(code: ErrorCode, message: impl Into<String>) -> Answer {
    Answer::Error {
        code,
        message: message.into(),
    }
}

impl Engine {
    /// Now, as the configured clock says.
    pub(crate) fn now(&self) -> u64 {
        self.inner.config.clock.now_ms()
    }

    /// Starts an engine. `key` is the signing key, or why there is none (a missing or locked
    /// keychain): the engine then runs, queues and shows requests, but mints nothing.
    pub fn new(
        config: EngineConfig,
        key: Result<SigningKey, String>,
    ) -> Result<Engine, EngineError> {
        if let Some(dir) = config
            .store_path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
        {
            std::fs::create_dir_all(dir).map_err(|source| EngineError::DataDir {
                path: dir.to_owned(),
                source,
            })?;
        }
        // Deferred: a ledger that cannot open now is reported per operation (fail closed), and
        // retried, rather than keeping the desk from starting.
        let store = Store::open_deferred(&config.store_path, config.store_options.clone());
        let (changes, _) = broadcast::channel(256);
        Ok(Engine {
            inner: Arc::new(Inner {
                live: std::sync::RwLock::new(Live {
                    policy: config.policy.clone(),
                    token_ttl_ms: config.token_ttl_ms,
                    approve_delay_ms: config.approve_delay_ms,
                    held_at_ms: 0,
                }),
                config,
                key: std::sync::RwLock::new(key),
                store: Mutex::new(store),
                state: Mutex::new(State {
                    next_id: 1,
                    ..State::default()
                }),
                changes,
                describing: Arc::new(tokio::sync::Semaphore::new(describing::MAX_DESCRIBING)),
            }),
        })
    }

    /// History, newest first.
    pub fn history(&self, filter: &HistoryFilter) -> Result<Vec<ConfirmEvent>, String> {
        lock(&self.inner.store)
            .history(filter)
            .map_err(|e| e.to_string())
    }

    pub(crate) fn record(&self, event: ConfirmEvent) {
        // History is the audit trail, but failing to write it must not turn a refusal into an
        // acceptance or lose the telemetry: the store emits the event whether or not the write
        // succeeds (once), and the failure is logged here.
        if let Err(err) = lock(&self.inner.store).record(&event) {
            tracing::error!(target: "desk", error = %err, "could not write history");
        }
    }

    /// Records a gated call refused before verification, and passes its answer on.
    pub(crate) fn rejected(&self, tenant: &str, tool: &str, answer: Answer) -> Answer {
        if let Answer::Refused {
            refusal: Refusal::ToolChanged,
            ..
        } = answer
        {
            return self.tool_changed(tenant, tool);
        }
        if let Answer::Error { code, message } = &answer
            && let Some(reason) = code.rejection()
        {
            self.record(ConfirmEvent {
                at_ms: self.now(),
                kind: EventKind::Rejected { reason },
                tool: tool.to_owned(),
                target: None,
                tenant: tenant.to_owned(),
                nonce: None,
                plan: None,
                note: Some(message.clone()),
            });
        }
        answer
    }

    /// Forgets what has expired (spent nonces, approvals) and the oldest history beyond what the
    /// store keeps. The desk calls this on a schedule.
    pub fn prune(&self) -> Result<countersign_store::Pruned, String> {
        lock(&self.inner.store)
            .prune(self.now())
            .map_err(|e| e.to_string())
    }

    pub(crate) fn publish(&self, change: QueueChange) {
        // No subscriber is not an error: the window may not be open yet.
        let _ = self.inner.changes.send(change);
    }
}
