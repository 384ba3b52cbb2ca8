//! What may change while the engine runs: the token lifetime, the approve delay, the policy and
//! the signing key. Each takes effect for what happens next, never for what was minted before.

use countersign_core::policy::Policy;
use countersign_core::token::SigningKey;

use crate::authority::Engine;
use crate::config::NoKey;

impl Engine {
    /// The lifetime of tokens minted from now on.
    pub fn token_ttl_ms(&self) -> u64 {
        self.inner
            .live
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .token_ttl_ms
    }

    /// Changes the lifetime of tokens minted from now on (at least one second).
    pub fn set_token_ttl_ms(&self, ttl_ms: u64) {
        self.inner
            .live
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .token_ttl_ms = ttl_ms.max(1000);
    }

    /// Changes the approve delay (see [`EngineConfig::approve_delay_ms`]).
    pub fn set_approve_delay_ms(&self, delay_ms: u64) {
        self.inner
            .live
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .approve_delay_ms = delay_ms;
    }

    /// The policy in force.
    pub fn policy(&self) -> Policy {
        self.inner
            .live
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .policy
            .clone()
    }

    /// Replaces the policy. Tools are classed when a gateway registers them, so the new policy
    /// applies to each connection from its next tool listing.
    pub fn set_policy(&self, policy: Policy) {
        self.inner
            .live
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .policy = policy;
    }

    /// Why the engine cannot mint, if it cannot.
    pub fn secret_problem(&self) -> Option<String> {
        self.inner
            .key
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .err()
            .map(|no| no.why.clone())
    }

    /// Replaces the signing key (a rotated secret, or one that became available): every token
    /// minted with the old key stops verifying.
    pub fn set_key(&self, key: Result<SigningKey, NoKey>) {
        *self.inner.key.write().unwrap_or_else(|p| p.into_inner()) = key;
    }

    pub(crate) fn key(&self) -> Result<SigningKey, NoKey> {
        self.inner
            .key
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
