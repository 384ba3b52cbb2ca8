//! Previews on waiting requests, and the built-in `execute`'s plan named by what it writes.
//!
//! A preview is display-only: it is attached to a request already queued (found by tenant, tool
//! and plan hash, so it can only land on the request of the call it was made for), never hashed,
//! never minted, never executed. Because the person may now be reading something else than when
//! the request arrived, a preview that changes what is shown re-arms the approve delay exactly as
//! a new request does, and the window is told ([`QueueChange::Updated`]). A preview attached
//! while an approve of the request is being written is dropped: the click was made on what was
//! on screen.
//!
//! The built-in `execute` names its plan by SQLite's word (see `countersign_builtin::rehearse`):
//! its target is every table the SQL writes (and every other effect), its summary the statements'
//! kinds and tables, so a person approving `DELETE FROM users WHERE id = 7` types `users`. A
//! policy that sets a target or a summary for it keeps the person's own choice.

use std::path::Path;

use countersign_builtin::rehearse::{self, Mode};
use countersign_core::policy::{DEFAULT_SUMMARY, ToolRule};
use countersign_core::preview::Preview;
use countersign_core::{Plan, PlanHash};
use serde_json::{Map, Value};

use super::{Engine, QueueChange, lock, now_ms};

/// The identity prefix the desk gives its built-in tools (`builtin:<db path>`).
const BUILTIN: &str = "builtin:";

/// The database of a built-in server identity, if `server` is one.
pub fn builtin_db(server: &str) -> Option<&Path> {
    server
        .strip_prefix(BUILTIN)
        .map(Path::new)
        .filter(|p| p.is_absolute())
}

/// `plan` for a call of `tool` on `server`, with the built-in `execute` named by what its SQL
/// writes (as SQLite reports it while preparing it, now): other calls are returned as they are.
pub(super) fn described(
    server: &str,
    tool: &str,
    rule: &ToolRule,
    args: &Map<String, Value>,
    plan: Plan,
) -> Plan {
    let (Some(db), "execute", Some(Value::String(sql))) =
        (builtin_db(server), tool, args.get("sql"))
    else {
        return plan;
    };
    let described = rehearse::rehearse(db, sql, Mode::Describe);
    let target = match &rule.target {
        Some(_) => plan.target,
        None => described.target(),
    };
    let summary = if rule.summary == DEFAULT_SUMMARY {
        described.summary()
    } else {
        plan.summary
    };
    Plan {
        target,
        summary,
        ..plan
    }
}

impl Engine {
    /// Shows `preview` with the waiting request of `tenant` for `tool` whose plan hashes to
    /// `plan_hash`. Returns whether such a request waits. When the preview differs from the one
    /// shown, the approve delay starts again and the window is told; the same preview again
    /// changes nothing.
    pub fn attach_preview(
        &self,
        tenant: &str,
        tool: &str,
        plan_hash: PlanHash,
        preview: Preview,
    ) -> bool {
        let now = now_ms();
        let view = {
            let mut state = lock(&self.inner.state);
            let found = state
                .requests
                .iter_mut()
                .find(|(_, e)| {
                    !e.is_change()
                        && e.is_waiting()
                        && e.view.tenant == tenant
                        && e.view.plan.tool == tool
                        && e.view.plan_hash == plan_hash
                })
                .map(|(id, e)| (*id, e));
            let Some((id, entry)) = found else {
                return false;
            };
            if entry.approving {
                return true;
            }
            if entry.view.preview.as_ref() == Some(&preview) {
                return true;
            }
            entry.view.preview = Some(preview);
            let view = entry.view.clone();
            state.rearmed.insert(id, now);
            let live: Vec<u64> = state.requests.keys().copied().collect();
            state.rearmed.retain(|id, _| live.contains(id));
            view
        };
        self.publish(QueueChange::Updated {
            request: Box::new(view),
        });
        true
    }
}

impl Engine {
    /// The plan hash of this call of `tenant`'s (`arguments` as the agent sent them, planned as
    /// a preflight plans them), or `None` when it cannot be planned.
    pub fn call_hash(&self, tenant: &str, tool: &str, arguments: &Value) -> Option<PlanHash> {
        self.plan_call(tenant, tool, arguments)
            .ok()
            .map(|call| call.hash)
    }

    /// Whether a request of `tenant` for `tool` with plan `plan_hash` waits without a preview:
    /// the one time a preview of it is worth making.
    pub fn awaits_preview(&self, tenant: &str, tool: &str, plan_hash: PlanHash) -> bool {
        lock(&self.inner.state).requests.values().any(|e| {
            !e.is_change()
                && e.is_waiting()
                && !e.approving
                && e.view.preview.is_none()
                && e.view.tenant == tenant
                && e.view.plan.tool == tool
                && e.view.plan_hash == plan_hash
        })
    }
}
