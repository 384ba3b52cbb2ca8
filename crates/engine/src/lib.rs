//! The desk's engine: the authority.
//!
//! Everything trusted lives here, in the desk's process and never in the agent-spawned gateway:
//! the signing key, the policy, each connection's tenant, the approval queue, minting (only in
//! [`Engine::approve`], which the window calls on a person's click), verification of confirms,
//! the ledger spend and history. Two kinds of callers use it: the window ([`Engine::pending`],
//! [`Engine::approve`], [`Engine::deny`], [`Engine::subscribe`]) and the desk's MCP sessions
//! (crates/session: [`Engine::connect`], [`Engine::register_tools`], [`Engine::open_call`],
//! [`Engine::preflight`], [`Engine::confirm`], [`Engine::outcome`]). Nothing here speaks MCP or touches a socket, and no
//! session call approves or denies. Requests to change the desk itself (a server, the policy, a
//! tool whose definition differs from its pin) wait in the same queue: [`Engine::propose`].
#![deny(missing_docs)]

mod answer;
mod change;
mod engine;

pub use answer::{Answer, ErrorCode, ToolDecision};
pub use change::{
    Change, ChangeDecision, ChangeKind, MAX_CHANGE_LABEL_CHARS, MAX_CHANGE_TEXT_CHARS,
    MAX_PENDING_CHANGES, MAX_PENDING_TOOL_CHANGES, PINNED_FIELDS,
};
pub use engine::grant::{
    GrantError, GrantOffer, MAX_GRANT_MINUTES, MAX_LIVE_GRANTS, MIN_PREFIX_SEGMENTS, PathError,
    Widening,
};
pub use engine::preview::builtin_db;
pub use engine::{
    ApproveError, DEFAULT_APPROVE_DELAY_MS, DEFAULT_TOKEN_TTL_MS, Engine, EngineConfig,
    EngineError, HEADLESS, MAX_PENDING, MAX_PENDING_PER_CONNECTION, MAX_SPENT_STATES,
    PendingRequest, QueueChange, Removal,
};
