//! Policy over arguments, in Cedar.
//!
//! Why it exists: `policy.toml` decides per server and per tool, so a person clicks as often for
//! `execute` with `SELECT 1` as for `DROP TABLE`. Cedar rules look at the call itself (its
//! arguments, target, class, the hour) and say how it is gated, or refuse it; and because Cedar
//! has a symbolic compiler, a change to the rules can be shown as what it widens, with a call the
//! solver found, instead of as a line diff nobody can judge.
//!
//! - [`model`]: the entity model (tenant, tool, server, the call's context) and its schema;
//! - [`rules`]: a policy loaded whole or refused whole, and what it decides for one call (pure);
//! - `widening` (feature `widening`, on by default): what a change widens, proved or refuted by
//!   cvc5 (a child process).

pub mod model;
pub mod rules;
#[cfg(feature = "widening")]
pub mod widening;

pub use model::{ArgType, Call, Tool, merge, schema};
pub use rules::{Budget, Gate, Outcome, Rules, RulesError};
#[cfg(feature = "widening")]
pub use widening::{Example, Widening, widening};
