//! The 2026-07-28 flow's `requestState`, driven by the authority: sealed under a key of its own
//! derived from the signing secret, checked by the chain in `countersign_core::request_state`
//! with the engine's clock, and used up once. The session only routes: it asks
//! [`Engine::resume_round`] and acts on the answer.
//!
//! On the desk a state names the request by its queue id and is used up in memory, per
//! connection. A team's server runs several replicas, and a client's retry lands on any of them:
//! there the host hands the engine its [`SharedRequests`], a state names the number every replica
//! knows the waiting call by, and a used state is spent in the shared nonce ledger (under
//! `request_state::ledger_nonce`), so it works once across all of them.

use countersign_core::Tenant;
use std::sync::Arc;

use async_trait::async_trait;
use countersign_core::request_state::{self, Retry, StateClaims, StateRefusal};
use countersign_core::token::Nonce;
use countersign_core::{PlanHash, SpendError};
use serde_json::Value;

use crate::answer::Stopped;
use crate::authority::{Engine, lock};
use crate::config::NoKey;

/// What a team's server with several replicas knows of its waiting calls: the numbers they are
/// shared under, and what became of them. The host (`serve`) keeps them in its control database.
#[async_trait]
pub trait SharedRequests: Send + Sync {
    /// The number every replica knows local request `local` by: shared now if it was not yet.
    /// `None` when it cannot be shared now.
    async fn number(&self, local: u64) -> Option<u64>;

    /// What became of shared request `number`, for `tenant`'s call planned to `plan`.
    async fn fate(&self, number: u64, tenant: &Tenant, plan: &PlanHash) -> SharedFate;
}

/// What became of a shared request ([`SharedRequests::fate`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedFate {
    /// It waits for the person (or was approved and not yet minted anywhere).
    Waiting,
    /// Denied, with the person's note.
    Denied {
        /// The note, if any.
        note: Option<String>,
    },
    /// Not there for this tenant and plan: never was, minted, expired or withdrawn.
    Gone,
    /// The shared records cannot be read now.
    Unreachable,
}

/// Why no state was sealed ([`Engine::seal_round`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unsealed {
    /// There is no secret to seal with.
    NoSecret(NoKey),
    /// The waiting call cannot be shared with the other replicas now: the agent is better told
    /// to call again (wherever it lands, the call is found) than handed a state that names it.
    NotShared,
}

/// What became of a client's retry with a `requestState` ([`Engine::resume_round`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resumed {
    /// Every binding holds and the state is used up: wait for the person again. `round` is the
    /// round the state was given on.
    Continue {
        /// Its round.
        round: u32,
    },
    /// Refused: nothing runs, and the refusal says the next move.
    Refused(StateRefusal),
    /// The call cannot be planned now: a preflight of it says why (and queues nothing).
    Unplanned,
    /// There is no secret to open it with: why.
    NoSecret(NoKey),
    /// The call was decided on another replica of a team's server: the answer (a deny and its
    /// note). The state is used up.
    Decided(Stopped),
}

/// The most used-up `requestState`s of the 2026-07-28 flow one connection keeps until they
/// expire; past it, its states are refused as used (failing closed) until the oldest expire.
pub const MAX_SPENT_STATES: usize = 4096;

impl Engine {
    /// Where this engine's waiting calls are shared with other replicas, from now on: set once,
    /// by a team's server, before any agent connects. `false` if it was set before.
    pub fn share_requests(&self, shared: Arc<dyn SharedRequests>) -> bool {
        self.inner.shared.set(shared).is_ok()
    }

    /// Seals a fresh `requestState` for round `round` of `tenant`'s call of `tool` planned to
    /// `plan`, whose request waits as `request` (here): it lives as long as a token would, under
    /// a key derived from the signing secret for that purpose alone. On a team's server it names
    /// the request by its shared number. `Err` says why there is none.
    pub async fn seal_round(
        &self,
        tenant: &Tenant,
        tool: &str,
        plan: PlanHash,
        request: u64,
        round: u32,
    ) -> Result<String, Unsealed> {
        let key = self.key().map_err(Unsealed::NoSecret)?;
        let number = match self.inner.shared.get() {
            Some(shared) => shared.number(request).await.ok_or(Unsealed::NotShared)?,
            None => request,
        };
        let claims = StateClaims {
            tenant: tenant.to_string(),
            tool: tool.to_owned(),
            plan,
            request: number,
            exp: self.now().saturating_add(self.token_ttl_ms()),
            nonce: Nonce::from_bytes(rand::random()),
            round,
        };
        Ok(request_state::seal(&key, &claims))
    }

    /// A client's retry of `tenant`'s call of `tool` with `arguments` and the `requestState` it
    /// was given: the chain of `countersign_core::request_state` (signature, expiry, tenant, tool,
    /// single use; then, once the call is planned, its plan and queued request), and the state
    /// used up. [`Resumed::Continue`] is the only answer on which the caller may go on waiting
    /// for the person.
    pub async fn resume_round(
        &self,
        tenant: &Tenant,
        tool: &str,
        arguments: &Value,
        state: &str,
    ) -> Resumed {
        let key = match self.key() {
            Ok(key) => key,
            Err(why) => return Resumed::NoSecret(why),
        };
        let retry = Retry {
            tenant: tenant.as_str(),
            tool,
        };
        let shared = self.inner.shared.get();
        // Shared: the ledger says whether it was used, at the spend (one round trip, not two).
        let opened = match request_state::check(&key, state, &retry, self.now(), |nonce| {
            shared.is_none() && self.request_state_used(tenant, nonce)
        }) {
            Ok(opened) => opened,
            Err(refusal) => return Resumed::Refused(refusal),
        };
        let Some((plan, queued)) = self.queued_aside(tenant, tool, arguments).await else {
            return Resumed::Unplanned;
        };
        let Some(shared) = shared else {
            let continued = match opened.continues(plan, queued) {
                Ok(continued) => continued,
                Err(refusal) => return Resumed::Refused(refusal),
            };
            let claims = continued.claims();
            if !self.spend_request_state(tenant, claims.nonce, claims.exp) {
                return Resumed::Refused(StateRefusal::Used);
            }
            return Resumed::Continue {
                round: claims.round,
            };
        };
        // A team's server: the state names the shared number, and the call may wait on any
        // replica (or on none any more).
        let number = opened.request();
        // (A plan other than the state's finds nothing here, and `continues` says PlanChanged.)
        let fate = shared.fate(number, tenant, &plan).await;
        let queued = match &fate {
            SharedFate::Waiting | SharedFate::Denied { .. } => Some(number),
            SharedFate::Gone => None,
            SharedFate::Unreachable => return Resumed::Refused(StateRefusal::Unreachable),
        };
        let continued = match opened.continues(plan, queued) {
            Ok(continued) => continued,
            Err(refusal) => return Resumed::Refused(refusal),
        };
        let claims = continued.claims();
        let used = request_state::ledger_nonce(&claims.nonce);
        match self.inner.store.spend(&used, claims.exp).await {
            Ok(()) => {}
            Err(SpendError::AlreadySpent) => return Resumed::Refused(StateRefusal::Used),
            Err(e) => {
                tracing::warn!(target: "rounds", error = %e, "cannot record a used requestState");
                return Resumed::Refused(StateRefusal::Unreachable);
            }
        }
        match fate {
            SharedFate::Denied { note } => Resumed::Decided(crate::queue::denied(note)),
            _ => Resumed::Continue {
                round: claims.round,
            },
        }
    }

    /// Whether `tenant` used up the `requestState` whose nonce is `nonce`.
    pub fn request_state_used(&self, tenant: &Tenant, nonce: &Nonce) -> bool {
        lock(&self.inner.state)
            .spent_states
            .get(tenant)
            .is_some_and(|spent| spent.contains_key(nonce))
    }

    /// Uses up `tenant`'s `requestState` (its nonce, until its expiry `exp`): `false` when it was
    /// used before, when [`MAX_SPENT_STATES`] unexpired ones are kept already (nothing is
    /// forgotten early), or when the connection is gone.
    pub fn spend_request_state(&self, tenant: &Tenant, nonce: Nonce, exp: u64) -> bool {
        let now = self.now();
        let mut state = lock(&self.inner.state);
        if !state.connections.contains_key(tenant) {
            return false;
        }
        let spent = state.spent_states.entry(tenant.to_owned()).or_default();
        if spent.contains_key(&nonce) {
            return false;
        }
        if spent.len() >= MAX_SPENT_STATES {
            spent.retain(|_, until| *until > now);
            if spent.len() >= MAX_SPENT_STATES {
                return false;
            }
        }
        spent.insert(nonce, exp);
        true
    }
}
