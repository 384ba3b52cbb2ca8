//! The desk's engine: the authority.
//!
//! Everything trusted lives here, in the desk's process and never in the agent-spawned gateway:
//! the signing key, the policy, each connection's tenant, the approval queue, minting (only in
//! [`Engine::approve`], which the window calls on a person's click), verification of confirms,
//! the ledger spend and history. Two kinds of callers use it: the window ([`Engine::pending`],
//! [`Engine::approve`], [`Engine::deny`], [`Engine::subscribe`]) and the desk's MCP sessions
//! (crates/session: [`Engine::connect`], [`Engine::register_tools`], [`Engine::open_call`],
//! [`Engine::preflight`], [`Engine::confirm`], [`Engine::outcome`]). Nothing here speaks MCP or
//! touches a socket, and no session call approves or denies. Requests to change the desk itself
//! (a server, the policy, a tool whose definition differs from its pin) wait in the same queue:
//! [`Engine::propose`].
//!
//! One room per concern, each adding the methods of its concern to [`Engine`]:
//!
//! | room | what it decides |
//! | --- | --- |
//! | [`authority`] | the engine value, its clock, history writes, queue events |
//! | `config`, [`clock`], `settings` | how it is set up; time; what may change while it runs |
//! | `state` | what it keeps in memory (the queue's entries, connections) |
//! | `listing` | connections, their tools' classes, pins against changed definitions |
//! | `planning` | a gated call turned into the plan a person approves |
//! | `describing` | the built-in `execute` named by what it writes; previews on waiting requests |
//! | `queue` | preflights waiting for a person, re-attaching, an agent that stopped waiting, withdrawing |
//! | `approve` | approve (the only place a token is minted) and deny |
//! | `confirm` | the verification chain, the ledger spend, outcomes |
//! | `change` | requests to change the desk itself |
//! | `rounds` | the 2026-07-28 flow's `requestState` |
//! | `ruling` | what the rules over arguments (`policy.cedar`) decide for one call |
//! | `grants` | a person's approval widened to later matching calls |
//! | [`tally`] | what it decided, as counts, for whoever keeps metrics |
#![forbid(unsafe_code)] // nothing here reaches past the safe language; keep it so

mod answer;
mod approve;
pub mod authority;
mod change;
pub mod clock;
mod config;
mod confirm;
mod describing;
mod grants;
mod listing;
mod planning;
mod queue;
mod rounds;
mod ruling;
mod settings;
mod state;
pub mod tally;

pub use answer::{Accepted, Approved, ErrorCode, Stopped, ToolDecision};
pub use approve::ApproveError;
pub use authority::Engine;
pub use change::{
    Change, ChangeDecision, ChangeKind, MAX_CHANGE_LABEL_CHARS, MAX_CHANGE_TEXT_CHARS,
    MAX_PENDING_CHANGES, MAX_PENDING_TOOL_CHANGES, PINNED_FIELDS, Proposal, text_hash,
};
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{DEFAULT_APPROVE_DELAY_MS, DEFAULT_TOKEN_TTL_MS, EngineConfig, NoKey};
pub use grants::{
    GrantError, GrantOffer, MAX_GRANT_MINUTES, MAX_LIVE_GRANTS, MIN_PREFIX_SEGMENTS, PathError,
    Widening,
};
pub use listing::{Attached, MAX_ATTACHED, READ_ONLY};
pub use queue::{
    Asks, CallRequest, ChangeRequest, HEADLESS, MAX_PENDING, MAX_PENDING_PER_CONNECTION,
    PendingRequest, QueueChange, Queued, Removal, STOPPED_WAITING_GRACE_MS, TAKEN_ELSEWHERE,
    Ticket,
};
pub use rounds::{MAX_SPENT_STATES, Resumed, SharedFate, SharedRequests, Unsealed};
pub use ruling::tool_of as rules_tool;
pub use tally::{Outcome, Spend, Tallied, Tally};
