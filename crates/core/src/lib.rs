//! The pure rules of Countersign.
//!
//! Everything that decides whether an action may run lives here, with no I/O, no clock reads and
//! no globals, so that every rule can be tested exactly and reused by the desk, the gateway and
//! any auditor: a plan and its canonical hash ([`plan`], [`canonical`]), the preflight text that
//! agrees with the hash ([`render`]), the signed token ([`token`]), the verification chain in the
//! seed's order ([`verify`]) with its typed refusals ([`refusal`]), the gate classes ([`gate`]) and
//! the ledger contract that single-use tokens are spent against ([`ledger`]), the history's hash
//! chain and its signed head ([`chain`]), and the line diff a
//! person reads before accepting a change to the desk ([`diff`]). Time is always a
//! parameter: milliseconds since the Unix epoch.
#![forbid(unsafe_code)] // nothing here reaches past the safe language; keep it so

pub mod approver;
pub mod binding;
pub mod canonical;
pub mod chain;
pub mod clock;
pub mod describe;
pub mod diff;
pub mod gate;
pub mod ledger;
pub mod page;
pub mod plan;
pub mod policy;
pub mod preview;
pub mod refusal;
pub mod render;
pub mod request_state;
pub mod server;
pub mod shown;
pub mod sync;
pub mod telemetry;
pub mod tenant;
pub mod token;
pub mod verify;

pub use canonical::CanonicalError;
pub use gate::GateClass;
pub use ledger::{Ledger, MemoryLedger, SpendError};
pub use plan::{Plan, PlanHash};
pub use refusal::Refusal;
pub use server::ServerId;
pub use tenant::Tenant;
pub use token::{Claims, Nonce, SigningKey, Token};
