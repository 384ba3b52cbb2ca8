//! The 2026-07-28 flow's `requestState`, driven by the authority: sealed under a key of its own
//! derived from the signing secret, checked by the chain in `countersign_core::request_state`
//! with the engine's clock, and used up once per connection. The session only routes: it asks
//! [`Engine::resume_round`] and acts on the answer.

use countersign_core::PlanHash;
use countersign_core::request_state::{self, Retry, StateClaims, StateRefusal};
use countersign_core::token::Nonce;
use serde_json::Value;

use crate::authority::{Engine, lock};
use crate::config::NoKey;

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
}

/// The most used-up `requestState`s of the 2026-07-28 flow one connection keeps until they
/// expire; past it, its states are refused as used (failing closed) until the oldest expire.
pub const MAX_SPENT_STATES: usize = 4096;

impl Engine {
    /// Seals a fresh `requestState` for round `round` of `tenant`'s call of `tool` planned to
    /// `plan`, whose request waits as `request`: it lives as long as a token would, under a key
    /// derived from the signing secret for that purpose alone. `Err` says why there is no secret.
    pub fn seal_round(
        &self,
        tenant: &str,
        tool: &str,
        plan: PlanHash,
        request: u64,
        round: u32,
    ) -> Result<String, NoKey> {
        let key = self.key()?;
        let claims = StateClaims {
            tenant: tenant.to_owned(),
            tool: tool.to_owned(),
            plan,
            request,
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
        tenant: &str,
        tool: &str,
        arguments: &Value,
        state: &str,
    ) -> Resumed {
        let key = match self.key() {
            Ok(key) => key,
            Err(why) => return Resumed::NoSecret(why),
        };
        let retry = Retry { tenant, tool };
        let opened = match request_state::check(&key, state, &retry, self.now(), |nonce| {
            self.request_state_used(tenant, nonce)
        }) {
            Ok(opened) => opened,
            Err(refusal) => return Resumed::Refused(refusal),
        };
        let Some((plan, queued)) = self.queued_aside(tenant, tool, arguments).await else {
            return Resumed::Unplanned;
        };
        let continued = match opened.continues(plan, queued) {
            Ok(continued) => continued,
            Err(refusal) => return Resumed::Refused(refusal),
        };
        let claims = continued.claims();
        if !self.spend_request_state(tenant, claims.nonce, claims.exp) {
            return Resumed::Refused(StateRefusal::Used);
        }
        Resumed::Continue {
            round: claims.round,
        }
    }

    /// Whether `tenant` used up the `requestState` whose nonce is `nonce`.
    pub fn request_state_used(&self, tenant: &str, nonce: &Nonce) -> bool {
        lock(&self.inner.state)
            .spent_states
            .get(tenant)
            .is_some_and(|spent| spent.contains_key(nonce))
    }

    /// Uses up `tenant`'s `requestState` (its nonce, until its expiry `exp`): `false` when it was
    /// used before, when [`MAX_SPENT_STATES`] unexpired ones are kept already (nothing is
    /// forgotten early), or when the connection is gone.
    pub fn spend_request_state(&self, tenant: &str, nonce: Nonce, exp: u64) -> bool {
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
