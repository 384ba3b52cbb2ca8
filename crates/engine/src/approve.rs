//! A person's decision: approve (the only place a token is minted) or deny.
//!
//! An approve passes the approve delay (counted from the request's arrival, its last preview, and
//! the window's last show or focus) and, where policy asks, the typed target; then the approved
//! arguments are stored, bound by their MAC, before the token exists. A deny carries the
//! person's note to the agent.

use countersign_core::Tenant;
use std::time::Duration;

use countersign_core::telemetry::{ConfirmEvent, EventKind};
use countersign_core::token::{self, Claims, Nonce, SigningKey};
use countersign_core::{GateClass, Plan, PlanHash, binding, render};
use countersign_store::Approval;
use serde_json::{Map, Value};

use crate::answer::Approved;
use crate::authority::{Engine, lock};
use crate::confirm::bound_of;
use crate::queue::{QueueChange, Removal};
use crate::state::{Decision, Entry};
use crate::tally::Tallied;

/// Why an approval did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApproveError {
    /// No pending request has this id (decided, withdrawn, or never existed).
    #[error("no pending request with this id")]
    NotPending,
    /// Policy asks for the target to be typed, and what was typed differs.
    #[error("the target must be typed exactly to approve this request")]
    TargetNotTyped,
    /// There is no secret (keychain missing or locked): nothing can be minted.
    #[error("no secret: {0}")]
    NoSecret(String),
    /// The approved arguments could not be stored, so no token was minted.
    #[error("the approval could not be stored: {0}")]
    Store(String),
    /// The approve came sooner than the approve delay after the request arrived or after the
    /// window was last shown or focused: nothing was minted; approve again after `wait_ms`.
    #[error("too soon: Approve works {wait_ms} ms from now")]
    TooSoon {
        /// How long until an approve of this request is accepted.
        wait_ms: u64,
    },
}

impl ApproveError {
    /// A stable code for the UI.
    pub fn code(&self) -> &'static str {
        match self {
            ApproveError::NotPending => "not_pending",
            ApproveError::TargetNotTyped => "target_not_typed",
            ApproveError::NoSecret(_) => "no_secret",
            ApproveError::Store(_) => "store_failed",
            ApproveError::TooSoon { .. } => "too_soon",
        }
    }
}

/// The history event of a token minted at `at_ms` with `claims` (`note`: how, when not by a
/// click on the request itself).
pub(crate) fn issued(claims: Claims, at_ms: u64, note: Option<String>) -> ConfirmEvent {
    ConfirmEvent {
        at_ms,
        kind: EventKind::Issued,
        tool: claims.tool,
        target: Some(claims.target),
        tenant: claims.tenant,
        nonce: Some(claims.nonce),
        plan: Some(claims.plan),
        note,
    }
}

/// A request an approve has claimed (`approving`): let go on drop, unless forgotten once the
/// decision is made.
struct Claimed<'a> {
    engine: &'a Engine,
    id: u64,
}

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        if let Some(entry) = lock(&self.engine.inner.state).requests.get_mut(&self.id) {
            entry.approving = false;
        }
    }
}

impl Engine {
    /// The window was just shown or regained focus: no approve is accepted until the approve
    /// delay has passed again, so a click aimed at whatever was on screen before lands on nothing.
    pub fn hold_approvals(&self) {
        self.inner
            .live
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .held_at_ms = self.now();
    }

    /// How long until a request that arrived at `arrived_at_ms` may be approved, now (0: now):
    /// the approve delay from its arrival and from the window's last show or focus. The desk
    /// holds a team server's requests to it too, before it signs a decision on one.
    pub fn approve_wait(&self, arrived_at_ms: u64) -> u64 {
        self.approve_wait_ms(arrived_at_ms, self.now())
    }

    /// How long until request `arrived_at_ms` may be approved (0: now).
    pub(crate) fn approve_wait_ms(&self, arrived_at_ms: u64, now: u64) -> u64 {
        let live = self.inner.live.read().unwrap_or_else(|p| p.into_inner());
        let from = arrived_at_ms.max(live.held_at_ms);
        from.saturating_add(live.approve_delay_ms)
            .saturating_sub(now)
    }

    /// A person approved request `id`: mint its token, keep the approved arguments with the
    /// nonce, and hand the preflight to whoever waits for it. `typed_target` is what the person
    /// typed, where policy asks for it. This is the only place a token is minted.
    pub async fn approve(&self, id: u64, typed_target: Option<&str>) -> Result<(), ApproveError> {
        let is_change = lock(&self.inner.state)
            .requests
            .get(&id)
            .is_some_and(Entry::is_change);
        if is_change {
            return self.approve_change(id).await;
        }
        let key = self.key().map_err(|no| ApproveError::NoSecret(no.why))?;
        let now = self.now();
        // Under the lock only long enough to check the request and claim it: the durable write
        // below must not hold up the queue, the window or any other connection.
        let (view, call, arguments) = {
            let mut state = lock(&self.inner.state);
            let rearmed_at_ms = state.rearmed.get(&id).copied().unwrap_or(0);
            let entry = state
                .requests
                .get_mut(&id)
                .filter(|e| e.is_waiting() && !e.approving && !e.is_change())
                .ok_or(ApproveError::NotPending)?;
            let view = &entry.view;
            let (Some(call), Some(arguments)) = (view.call(), entry.arguments()) else {
                return Err(ApproveError::NotPending);
            };
            if call.type_target && typed_target != Some(view.plan.target.as_str()) {
                return Err(ApproveError::TargetNotTyped);
            }
            let wait_ms = self.approve_wait_ms(view.arrived_at_ms.max(rearmed_at_ms), now);
            if wait_ms > 0 {
                return Err(ApproveError::TooSoon { wait_ms });
            }
            let taken = (view.clone(), call.clone(), arguments.clone());
            entry.approving = true;
            taken
        };
        // Whatever ends this approve early (a failed write, or the caller dropping it while the
        // write is under way), the request is free to be approved or denied again.
        let claimed = Claimed { engine: self, id };
        let (answer, claims) = self
            .mint(
                &key,
                &call.tenant,
                &view.plan,
                call.plan_hash,
                call.class,
                arguments,
                now,
            )
            .await?;
        std::mem::forget(claimed);
        let decision = Decision::Approved(answer);
        {
            let state = lock(&self.inner.state);
            // Withdrawn or disconnected while the approval was written: its token reaches no one,
            // and the stored approval expires unused.
            let Some(entry) = state.requests.get(&id) else {
                return Err(ApproveError::NotPending);
            };
            entry.decision.send_replace(Some(decision));
        }
        self.tally(Tallied::Decided {
            approved: true,
            waited: Duration::from_millis(now.saturating_sub(view.arrived_at_ms)),
        });
        self.record(issued(claims, now, None)).await;
        self.publish(QueueChange::Removed {
            id,
            reason: Removal::Approved,
        });
        Ok(())
    }

    /// Mints a token for `plan` of `tenant` under `class`, after storing the approved
    /// `arguments` (bound by their MAC) in `store`: the answer the waiting preflight gets, and
    /// what the token claims. Only a click reaches this: [`Engine::approve`], or a grant a click
    /// made (see the grant module).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn mint(
        &self,
        key: &SigningKey,
        tenant: &Tenant,
        plan: &Plan,
        hash: PlanHash,
        class: GateClass,
        arguments: Map<String, Value>,
        now: u64,
    ) -> Result<(Approved, Claims), ApproveError> {
        let claims = Claims {
            tool: plan.tool.clone(),
            target: plan.target.clone(),
            plan: hash,
            tenant: tenant.to_string(),
            iat: now,
            exp: now.saturating_add(self.token_ttl_ms()),
            nonce: Nonce::from_bytes(rand::random()),
        };
        let arguments = Value::Object(arguments);
        let approval = Approval {
            nonce: claims.nonce,
            tool: claims.tool.clone(),
            target: claims.target.clone(),
            tenant: claims.tenant.clone(),
            plan: claims.plan,
            mac: None,
            arguments,
            class,
            issued_at_ms: claims.iat,
            expires_at_ms: claims.exp,
        };
        let mac = binding::approval_mac(key, &bound_of(&approval)).map_err(|e| {
            ApproveError::Store(format!("the arguments have no canonical form: {e}"))
        })?;
        let approval = Approval {
            mac: Some(mac),
            ..approval
        };
        // The approved arguments are durable before the token exists: a token whose arguments
        // were lost could never execute what the person read.
        self.records()
            .put_approval(&approval)
            .await
            .map_err(|e| ApproveError::Store(e.to_string()))?;
        let token = token::mint(key, &claims);
        // The lifetime shown is the token's own, not the setting read again.
        let ttl_ms = claims.exp - claims.iat;
        let text = render::preflight(plan, &token, ttl_ms, class);
        let answer = Approved {
            text,
            next_step: render::instruction(&plan.target),
            action: plan.action.clone(),
            summary: plan.summary.clone(),
            reversible: plan.reversible,
            expires_in: render::lifetime_text(ttl_ms),
            token: token.expose().to_owned(),
            target: claims.target.clone(),
            expires_at_ms: claims.exp,
            class,
        };
        Ok((answer, claims))
    }

    /// On a team's server: request `id` was approved on the shared record and its token minted
    /// by another replica, where the agent's call waited. This copy ends, answered
    /// [`crate::queue::TAKEN_ELSEWHERE`] (`already_used`) if an agent collects it here; nothing
    /// is recorded (the minting replica records the approval).
    pub fn taken_elsewhere(&self, id: u64) -> Result<(), ApproveError> {
        {
            let state = lock(&self.inner.state);
            let entry = state
                .requests
                .get(&id)
                .filter(|e| e.is_waiting() && !e.approving && !e.is_change())
                .ok_or(ApproveError::NotPending)?;
            entry.decision.send_replace(Some(Decision::TakenElsewhere));
        }
        self.publish(QueueChange::Removed {
            id,
            reason: Removal::TakenElsewhere,
        });
        Ok(())
    }

    /// A person denied request `id`, with an optional note for the agent.
    pub async fn deny(&self, id: u64, note: Option<&str>) -> Result<(), ApproveError> {
        let note = note
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_owned);
        let event = {
            let mut state = lock(&self.inner.state);
            let entry = state
                .requests
                .get(&id)
                .filter(|e| e.is_waiting() && !e.approving)
                .ok_or(ApproveError::NotPending)?;
            entry
                .decision
                .send_replace(Some(Decision::Denied { note: note.clone() }));
            let is_change = entry.is_change();
            let now = self.now();
            if !is_change {
                self.tally(Tallied::Decided {
                    approved: false,
                    waited: Duration::from_millis(now.saturating_sub(entry.view.arrived_at_ms)),
                });
            }
            let event = ConfirmEvent {
                at_ms: now,
                kind: EventKind::Denied,
                tool: entry.view.plan.tool.clone(),
                target: Some(entry.view.plan.target.clone()),
                tenant: entry.tenant().unwrap_or_default().to_owned(),
                nonce: None,
                // A change has no plan a token could bind.
                plan: entry.view.call().map(|c| c.plan_hash),
                note,
            };
            if is_change {
                // Nobody collects a change's denial from the queue: whoever waits on it already
                // holds the decision.
                state.requests.remove(&id);
            }
            event
        };
        self.record(event).await;
        self.publish(QueueChange::Removed {
            id,
            reason: Removal::Denied,
        });
        Ok(())
    }
}
