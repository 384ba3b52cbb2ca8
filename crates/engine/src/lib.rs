//! The desk's engine: the authority behind the local socket.
//!
//! Everything trusted lives here, in the desk's process and never in the agent-spawned gateway:
//! the signing key, the policy, each connection's tenant, the approval queue, minting (only in
//! [`Engine::approve`], which the window calls on a person's click), verification of confirms,
//! the ledger spend and history. The window is a client of this library's API ([`Engine::pending`],
//! [`Engine::approve`], [`Engine::deny`], [`Engine::subscribe`]); gateways are clients of
//! [`socket::serve`]. No socket message approves or denies.
#![deny(missing_docs)]

mod engine;
pub mod socket;

pub use engine::{
    ApproveError, DEFAULT_TOKEN_TTL_MS, Engine, EngineConfig, EngineError, PendingRequest,
    QueueChange, Removal,
};
