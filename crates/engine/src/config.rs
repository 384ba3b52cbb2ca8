//! How an engine is set up, and why it could not start.

use std::sync::Arc;

use countersign_core::describe::Describer;
use countersign_core::policy::Policy;

use crate::clock::{Clock, SystemClock};

/// Token lifetime unless configured otherwise: ten minutes.
pub const DEFAULT_TOKEN_TTL_MS: u64 = 10 * 60 * 1000;

/// The approve delay unless configured otherwise: one second.
pub const DEFAULT_APPROVE_DELAY_MS: u64 = 1000;

/// How the engine is set up.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The policy in force.
    pub policy: Policy,
    /// How long a minted token lives.
    pub token_ttl_ms: u64,
    /// Whether a window shows requests to a person. Without one (no display), gated calls are
    /// refused `desk_unavailable` at once: nobody could approve them.
    pub window: bool,
    /// How long after a request arrives, or the window is shown or focused again
    /// ([`crate::Engine::hold_approvals`]), an approve of it is refused: the window disables its button
    /// for as long, and the engine enforces it too, so a script driving the page cannot click
    /// sooner. The desk never sets less than a second; tests below the window may set 0.
    pub approve_delay_ms: u64,
    /// Where the engine reads the time: [`SystemClock`] unless a test passes a
    /// [`crate::ManualClock`].
    pub clock: Arc<dyn Clock>,
    /// What names the plans of calls whose arguments do not say what they touch (the built-in
    /// `execute`): `None` describes nothing, and such calls are planned from their arguments.
    pub describer: Option<Arc<dyn Describer>>,
    /// What a preflight is refused with when `window` is false: why nobody can approve it, and
    /// the next move (the desk's words by default; a team's server says its own).
    pub nobody_to_ask: String,
    /// Only tools that change nothing are offered: every gated tool is withheld, so nothing
    /// is ever queued, minted or spent (a team's server started `--read-only`).
    pub read_only: bool,
    /// Where the engine's counts go ([`crate::tally`]): a team server's metrics. `None` counts
    /// nothing.
    pub tally: Option<crate::Tally>,
}

impl EngineConfig {
    /// The defaults: the desk's policy default, ten-minute tokens, a window, a one-second
    /// approve delay, the system clock. Where the records live is not configuration: the
    /// engine is given them ([`crate::Engine::new`]).
    pub fn new() -> Self {
        Self {
            policy: Policy::default(),
            token_ttl_ms: DEFAULT_TOKEN_TTL_MS,
            window: true,
            approve_delay_ms: DEFAULT_APPROVE_DELAY_MS,
            clock: Arc::new(SystemClock),
            describer: None,
            nobody_to_ask: crate::queue::HEADLESS.to_owned(),
            read_only: false,
            tally: None,
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// Why the engine has no signing key (a missing or locked keychain, a secret not yet made): it
/// runs, queues and shows requests, but mints nothing until a key is set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{why}")]
pub struct NoKey {
    /// Why, for the person (never a secret).
    pub why: String,
}

impl From<String> for NoKey {
    fn from(why: String) -> Self {
        NoKey { why }
    }
}

impl From<&str> for NoKey {
    fn from(why: &str) -> Self {
        NoKey {
            why: why.to_owned(),
        }
    }
}
