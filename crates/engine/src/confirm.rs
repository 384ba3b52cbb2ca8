//! The confirm: the seed's verification chain, the ledger spend, and the outcome.
//!
//! A confirm is verified in the seed's order (token, signature, expiry, tenant, tool, target,
//! plan hash), then for single-use tools the nonce is spent before anything runs; what runs is
//! the arguments the person approved, read from the store and checked against their MAC. Each
//! acceptance records exactly one outcome, from the connection it was accepted on.

use std::collections::hash_map::Entry;

use countersign_core::Tenant;
use countersign_core::binding;
use countersign_core::telemetry::{ConfirmEvent, EventKind};
use countersign_core::token::{self, Claims, Nonce, SigningKey};
use countersign_core::verify::{self, Confirm};
use countersign_core::{PlanHash, Refusal, SpendError};
use countersign_store::{Approval, HistoryFilter};
use serde_json::Value;

use crate::answer::{Accepted, ErrorCode, Stopped};
use crate::authority::{Engine, error, lock, refused};
use crate::planning::Call;
use crate::state::Awaiting;
use crate::tally::{Spend, Tallied};

/// How many of a tool's newest history events are read to find how the last call of the same
/// plan ended ([`Engine::last_unknown`]), each time a call is queued for a person.
pub const LAST_OUTCOMES_READ: u32 = 200;

/// What an approval's MAC covers, as the row holds it.
pub(crate) fn bound_of(approval: &Approval) -> binding::Bound<'_> {
    binding::Bound {
        nonce: &approval.nonce,
        tenant: &approval.tenant,
        plan: &approval.plan,
        class: approval.class,
        expires_at_ms: approval.expires_at_ms,
        arguments: &approval.arguments,
    }
}

impl Engine {
    /// A confirm: verify it in the seed's order, spend the nonce for single-use tools, and hand
    /// back the arguments the person approved.
    pub async fn confirm(
        &self,
        tenant: &Tenant,
        tool: &str,
        arguments: &Value,
    ) -> Result<Accepted, Stopped> {
        self.confirm_planned(tenant, tool, self.plan_call(tenant, tool, arguments))
            .await
    }

    /// [`Self::confirm`] of a call planned already (its description comes first, before any
    /// verification: a confirm that cannot be described now is refused and spends nothing).
    pub(crate) async fn confirm_planned(
        &self,
        tenant: &Tenant,
        tool: &str,
        planned: Result<Call, Stopped>,
    ) -> Result<Accepted, Stopped> {
        let Call {
            rule,
            fields,
            plan,
            hash,
            ..
        } = match planned {
            Ok(call) => call,
            Err(stopped) => return Err(self.rejected(tenant, tool, stopped).await),
        };
        let key = match self.key() {
            Ok(key) => key,
            Err(why) => {
                return Err(self
                    .rejected(tenant, tool, error(ErrorCode::NoSecret, why.why))
                    .await);
            }
        };
        let key = &key;
        let now = self.now();
        let confirm = Confirm {
            token: fields.token.as_deref(),
            confirm_target: fields.target.as_deref(),
            tenant: tenant.as_str(),
            tool,
            target: &plan.target,
            plan: hash,
        };
        // What the token approved, read once, and only for a token whose signature holds (a
        // forged token never reaches the database). The row is never rewritten, so reading it
        // before the spend reads what the spend will cover.
        let approved = match fields
            .token
            .as_deref()
            .and_then(|t| token::decode(key, t).ok())
        {
            Some(claims) => Some(self.records().approval(&claims.nonce).await),
            None => None,
        };
        // Whether the approval can run at all: read, bound by its MAC, for this plan. Anything
        // else is known before the spend, so the nonce is not spent for it: a refusal that says
        // "retry" must find the approval still usable.
        let usable: Result<Approval, Refusal> = match approved {
            // No token, or one that does not decode: the chain refuses it before any of this.
            None => Err(Refusal::BadToken),
            Some(Err(_)) => Err(Refusal::LedgerUnreachable),
            // Genuine but gone (pruned, or a store that was replaced): nothing may run that the
            // person did not read.
            Some(Ok(None)) => Err(Refusal::PlanChanged),
            Some(Ok(Some(approval))) if approval.plan != hash => Err(Refusal::PlanChanged),
            Some(Ok(Some(approval))) if !Self::bound(key, &approval) => {
                Err(Refusal::ApprovalAltered)
            }
            Some(Ok(Some(approval))) => Ok(approval),
        };
        // It counts under the stricter of the class it was made under and the tool's class now:
        // an upstream that re-lists a tool as idempotent after the click must not turn a
        // works-once approval into a reusable one. Nothing is spent for an approval that cannot
        // run (the chain still checks everything else, in order).
        let single_use = usable.is_ok()
            && (rule.class.is_single_use()
                || usable.as_ref().is_ok_and(|a| a.class.is_single_use()));
        let event = |kind, claims: Option<&Claims>| ConfirmEvent {
            at_ms: now,
            kind,
            tool: tool.to_owned(),
            target: Some(plan.target.clone()),
            tenant: tenant.to_string(),
            nonce: claims.map(|c| c.nonce),
            plan: Some(hash),
            note: None,
        };
        // Whether the acceptance is already in history: a spend records it with itself.
        let mut accepted_recorded = false;
        let verdict = match verify::check(key, &confirm, now) {
            Ok(claims) if single_use => {
                // Timed for the ledger's latency (a measurement, not a decision: the engine's
                // clock decides, this only says how long the records took).
                let started = std::time::Instant::now();
                let accepted = event(EventKind::Accepted, Some(&claims));
                let spent = match self
                    .records()
                    .spend_recording(&claims.nonce, claims.exp, &accepted)
                    .await
                {
                    Ok(written) => {
                        self.recorded(&accepted, written);
                        accepted_recorded = true;
                        Ok(())
                    }
                    Err(refused) => Err(refused),
                };
                let spend = match &spent {
                    Ok(()) => Spend::Spent,
                    Err(SpendError::AlreadySpent) => Spend::AlreadySpent,
                    Err(_) => Spend::Unreachable,
                };
                self.tally(Tallied::Spent {
                    spend,
                    took: started.elapsed(),
                });
                verify::spent_as(claims, spent)
            }
            verdict => verdict,
        };
        let claims = match verdict {
            Err(rejected) => {
                self.record(event(
                    EventKind::for_refusal(rejected.refusal),
                    rejected.claims.as_deref(),
                ))
                .await;
                return Err(refused(rejected.refusal));
            }
            Ok(claims) => claims,
        };
        match usable {
            Ok(approval) => {
                if !accepted_recorded {
                    self.record(event(EventKind::Accepted, Some(&claims))).await;
                }
                lock(&self.inner.state)
                    .awaiting_outcome
                    .entry((tenant.to_owned(), claims.nonce))
                    .or_insert_with(|| Awaiting {
                        count: 0,
                        tool: approval.tool.clone(),
                        target: approval.target.clone(),
                        plan: approval.plan,
                    })
                    .count += 1;
                Ok(Accepted {
                    arguments: approval.arguments,
                    nonce: claims.nonce.to_hex(),
                })
            }
            Err(refusal) => {
                if refusal == Refusal::ApprovalAltered {
                    tracing::error!(target: "desk", nonce = %claims.nonce.to_hex(), "an approval in the store does not carry its MAC: refused");
                }
                self.record(event(EventKind::Refused { refusal }, Some(&claims)))
                    .await;
                Err(refused(refusal))
            }
        }
    }

    /// Whether `approval` carries the MAC the desk gave it when the person clicked.
    pub(crate) fn bound(key: &SigningKey, approval: &Approval) -> bool {
        approval
            .mac
            .is_some_and(|mac| binding::approval_mac_matches(key, &bound_of(approval), &mac))
    }

    /// What became of an accepted call: one outcome per acceptance, from the connection it was
    /// accepted on.
    pub async fn outcome(
        &self,
        tenant: &Tenant,
        nonce: &str,
        ok: bool,
        note: Option<String>,
    ) -> Result<(), Stopped> {
        self.finished(tenant, nonce, EventKind::Executed { ok }, note)
            .await
    }

    /// An accepted call was handed to the upstream and its answer never came (it died, the
    /// connection broke, the wait ran out): recorded as `outcome_unknown`, not as failed, and
    /// shown to the person the next time the same plan asks ([`CallRequest::last_unknown_at_ms`]).
    /// In place of [`Engine::outcome`], once per acceptance.
    ///
    /// [`CallRequest::last_unknown_at_ms`]: crate::CallRequest::last_unknown_at_ms
    pub async fn outcome_unknown(
        &self,
        tenant: &Tenant,
        nonce: &str,
        note: Option<String>,
    ) -> Result<(), Stopped> {
        self.finished(tenant, nonce, EventKind::OutcomeUnknown, note)
            .await
    }

    /// When the newest recorded end of a call of `tool` planned to `plan` (among the last
    /// [`LAST_OUTCOMES_READ`] events of the tool) left its outcome unknown: that time.
    pub(crate) async fn last_unknown(&self, tool: &str, plan: &PlanHash) -> Option<u64> {
        let filter = HistoryFilter {
            tool: Some(tool.to_owned()),
            limit: Some(LAST_OUTCOMES_READ),
            ..HistoryFilter::default()
        };
        let events = self.records().history(&filter).await.ok()?;
        // Newest first: the first end of this plan says how it last ended.
        let last = events.into_iter().find(|e| {
            e.plan.as_ref() == Some(plan)
                && matches!(
                    e.kind,
                    EventKind::Executed { .. } | EventKind::OutcomeUnknown
                )
        })?;
        (last.kind == EventKind::OutcomeUnknown).then_some(last.at_ms)
    }

    async fn finished(
        &self,
        tenant: &Tenant,
        nonce: &str,
        kind: EventKind,
        note: Option<String>,
    ) -> Result<(), Stopped> {
        let Some(nonce) = Nonce::from_hex(nonce) else {
            return Err(error(
                ErrorCode::BadArguments,
                "nonce: 32 lowercase hex digits",
            ));
        };
        let awaited = {
            let mut state = lock(&self.inner.state);
            let key = (tenant.to_owned(), nonce);
            match state.awaiting_outcome.entry(key) {
                Entry::Occupied(mut awaiting) if awaiting.get().count > 1 => {
                    awaiting.get_mut().count -= 1;
                    awaiting.get().clone()
                }
                Entry::Occupied(awaiting) => awaiting.remove(),
                Entry::Vacant(_) => {
                    return Err(error(
                        ErrorCode::BadArguments,
                        "no accepted call of this connection awaits an outcome under this nonce",
                    ));
                }
            }
        };
        let (tool, target, plan) = (awaited.tool, Some(awaited.target), Some(awaited.plan));
        self.record(ConfirmEvent {
            at_ms: self.now(),
            kind,
            tool,
            target,
            tenant: tenant.to_string(),
            nonce: Some(nonce),
            plan,
            note,
        })
        .await;
        Ok(())
    }
}
