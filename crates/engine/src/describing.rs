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
//! A call the configured [`Describer`] knows is named by what it would do (the built-in
//! `execute`: by SQLite's word, `countersign_builtin::SqlDescriber`): its target is every table
//! the SQL writes (and every other effect), its summary the statements' kinds and tables, so a
//! person approving `DELETE FROM users WHERE id = 7` types `users`. A policy that sets a target or
//! a summary for it keeps the person's own choice (one that sets both has nothing described). The
//! engine knows no tool itself: it asks the describer.
//!
//! Describing is not free: a batch is run and rolled back (up to the rehearsal's time limit and
//! its wait for a lock), so it never runs on the desk's async workers, where a few hostile calls
//! would stall every other agent and the window. The async paths ([`Engine::preflight`] and the
//! `*_aside` calls the sessions use) describe on the blocking pool, and at most
//! [`MAX_DESCRIBING`] descriptions run at once across the desk, one per connection: a call waits
//! for its connection's turn, then for one of the desk's, asynchronously and up to [`TURN_WAIT`]
//! in all, then is answered busy. So an agent sending endless batches holds one of the desk's
//! turns at most, and leaves the other to the rest. A description that stops for a
//! reason of the moment (the time limit, a lock, an I/O error: [`NotNow`]) is an error answer of
//! the call, never part of a plan.

use countersign_core::Tenant;
use std::sync::Arc;
use std::time::Duration;

use countersign_core::describe::{Describer, Description, NotNow};
use countersign_core::policy::{DEFAULT_SUMMARY, ToolRule};
use countersign_core::preview::Preview;
use countersign_core::{Plan, PlanHash, ServerId};
use serde_json::{Map, Value};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::answer::{Accepted, ErrorCode, Stopped};
use crate::authority::{Engine, error, lock};
use crate::planning::Call;
use crate::queue::QueueChange;

/// The most descriptions of SQL that run at once across the desk (at most one per connection).
pub const MAX_DESCRIBING: usize = 2;

/// A turn to describe SQL: its connection's one and one of the desk's, held until dropped.
pub(super) struct Turn {
    _own: OwnedSemaphorePermit,
    _desk: OwnedSemaphorePermit,
}

/// How long a call waits for a turn to be described before it is answered busy.
pub const TURN_WAIT: Duration = Duration::from_secs(10);

/// Whether the call is planned by describing it: the configured describer knows it, and the
/// policy did not name both its target and its summary (the person's own choice stands).
fn to_describe(
    describer: Option<&dyn Describer>,
    server: &ServerId,
    tool: &str,
    rule: &ToolRule,
    args: &Map<String, Value>,
) -> bool {
    let named_by_policy = rule.target.is_some() && rule.summary != DEFAULT_SUMMARY;
    !named_by_policy && describer.is_some_and(|d| d.describes(server, tool, args))
}

/// The answer to a call that could not be described just now: nothing ran, call again.
fn not_described(why: &NotNow) -> Stopped {
    error(
        ErrorCode::Busy,
        format!(
            "Nothing was executed. The Countersign desk could not describe this SQL just now \
             ({why}), so there is no plan for a person to approve. Next: call again shortly with \
             the same arguments, or split the batch into smaller calls."
        ),
    )
}

/// The answer to a call that found every turn to describe SQL taken for [`TURN_WAIT`].
fn no_turn() -> Stopped {
    error(
        ErrorCode::Busy,
        format!(
            "Nothing was executed. The Countersign desk is describing other SQL (at most \
             {MAX_DESCRIBING} at once) and this call waited {} s for its turn. Next: call again \
             shortly with the same arguments.",
            TURN_WAIT.as_secs()
        ),
    )
}

impl Engine {
    /// `plan` for a call of `tool` on `server`, with the built-in `execute` named by what its SQL
    /// writes (as SQLite reports it while preparing it, now): other calls are returned as they
    /// are. `turn` is the caller's turn to describe, or its connection's turns: a free one of
    /// those and of the desk's is then taken, or the call is answered busy. A description that
    /// stops for a reason of the moment is an error.
    pub(super) fn described(
        &self,
        server: &ServerId,
        tool: &str,
        rule: &ToolRule,
        args: &Map<String, Value>,
        plan: Plan,
        turn: Result<&Turn, &Arc<Semaphore>>,
    ) -> Result<Plan, Stopped> {
        let describer = self.inner.config.describer.as_deref();
        let Some(describer) =
            describer.filter(|_| to_describe(describer, server, tool, rule, args))
        else {
            return Ok(plan);
        };
        let _taken = match turn {
            Ok(_) => None,
            Err(own) => {
                let own = Arc::clone(own).try_acquire_owned().map_err(|_| no_turn())?;
                let desk = Arc::clone(&self.inner.describing)
                    .try_acquire_owned()
                    .map_err(|_| no_turn())?;
                Some(Turn {
                    _own: own,
                    _desk: desk,
                })
            }
        };
        let described = describer
            .describe(server, tool, args)
            .map_err(|why| not_described(&why))?;
        Ok(described_plan(rule, plan, &described))
    }

    /// The turns of `tenant`'s connection, if planning this call of its describes SQL.
    pub(crate) fn describes(
        &self,
        tenant: &Tenant,
        tool: &str,
        arguments: &Value,
    ) -> Option<Arc<Semaphore>> {
        let state = lock(&self.inner.state);
        state.connections.get(tenant).and_then(|c| {
            let listed = c.tools.get(tool)?;
            let args = arguments.as_object()?;
            let describer = self.inner.config.describer.as_deref();
            to_describe(describer, &c.id, tool, &listed.rule, args).then(|| Arc::clone(&c.own_turn))
        })
    }

    /// Plans a call from async code: a call that describes SQL waits for its connection's turn,
    /// then for one of the desk's (asynchronously, up to [`TURN_WAIT`] in all), and is described
    /// on the blocking pool, never on an async worker.
    pub(super) async fn plan_aside(
        &self,
        tenant: &Tenant,
        tool: &str,
        arguments: &Value,
    ) -> Result<Call, Stopped> {
        let Some(own) = self.describes(tenant, tool, arguments) else {
            return self.plan_call(tenant, tool, arguments);
        };
        let desk = Arc::clone(&self.inner.describing);
        let waited = tokio::time::timeout(TURN_WAIT, async move {
            let own = own.acquire_owned().await?;
            let desk = desk.acquire_owned().await?;
            Ok::<_, tokio::sync::AcquireError>(Turn {
                _own: own,
                _desk: desk,
            })
        })
        .await;
        let Ok(Ok(turn)) = waited else {
            return Err(no_turn());
        };
        let (engine, tenant, tool, arguments) = (
            self.clone(),
            tenant.to_owned(),
            tool.to_owned(),
            arguments.clone(),
        );
        // The turn is held until the description ends, even when the caller stops waiting.
        tokio::task::spawn_blocking(move || {
            engine.plan_held(&tenant, &tool, &arguments, Some(&turn))
        })
        .await
        .unwrap_or_else(|_| {
            Err(error(
                ErrorCode::Internal,
                "describing the call stopped unexpectedly",
            ))
        })
    }

    /// [`Engine::confirm`] from async code: described off the async workers (see [`Self::plan_aside`]).
    pub async fn confirm_aside(
        &self,
        tenant: &Tenant,
        tool: &str,
        arguments: &Value,
    ) -> Result<Accepted, Stopped> {
        let planned = self.plan_aside(tenant, tool, arguments).await;
        self.confirm_planned(tenant, tool, planned).await
    }

    /// [`Engine::withdraw`] from async code: described off the async workers.
    pub async fn withdraw_aside(
        &self,
        tenant: &Tenant,
        tool: &str,
        arguments: &Value,
    ) -> Result<(), Stopped> {
        let planned = self.plan_aside(tenant, tool, arguments).await;
        self.withdraw_planned(tenant, tool, planned)
    }

    /// [`Engine::stop_waiting`] from async code: described off the async workers.
    pub async fn stop_waiting_aside(
        &self,
        tenant: &Tenant,
        tool: &str,
        arguments: &Value,
    ) -> Result<(), Stopped> {
        let planned = self.plan_aside(tenant, tool, arguments).await;
        self.stop_waiting_planned(tenant, tool, planned)
    }

    /// [`Engine::queued`] from async code: described off the async workers.
    pub async fn queued_aside(
        &self,
        tenant: &Tenant,
        tool: &str,
        arguments: &Value,
    ) -> Option<(PlanHash, Option<u64>)> {
        let planned = self.plan_aside(tenant, tool, arguments).await;
        self.queued_planned(tenant, tool, planned)
    }
}

/// `plan` with the target and summary `described` gives, where the policy left them unset.
fn described_plan(rule: &ToolRule, plan: Plan, described: &Description) -> Plan {
    let target = match &rule.target {
        Some(_) => plan.target,
        None => described.target.clone(),
    };
    let summary = if rule.summary == DEFAULT_SUMMARY {
        described.summary.clone()
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
        tenant: &Tenant,
        tool: &str,
        plan_hash: PlanHash,
        preview: Preview,
    ) -> bool {
        let now = self.now();
        let view = {
            let mut state = lock(&self.inner.state);
            let found = state
                .requests
                .iter_mut()
                .find(|(_, e)| e.is_call(tenant, tool, plan_hash) && e.is_waiting())
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
    pub fn call_hash(&self, tenant: &Tenant, tool: &str, arguments: &Value) -> Option<PlanHash> {
        self.plan_call(tenant, tool, arguments)
            .ok()
            .map(|call| call.hash)
    }

    /// Whether a request of `tenant` for `tool` with plan `plan_hash` waits without a preview:
    /// the one time a preview of it is worth making.
    pub fn awaits_preview(&self, tenant: &Tenant, tool: &str, plan_hash: PlanHash) -> bool {
        lock(&self.inner.state).requests.values().any(|e| {
            e.is_call(tenant, tool, plan_hash)
                && e.is_waiting()
                && !e.approving
                && e.view.preview.is_none()
        })
    }
}
