//! Describers: what names a call's plan by what the call would do, found out at planning time.
//!
//! Some tools' arguments do not say what they touch: `execute`'s SQL names its tables only to
//! whoever parses it. For such a call the engine asks a [`Describer`] for the target and summary
//! of its plan, as facts (the same every time for the same call), instead of knowing any tool
//! itself. A describer that cannot answer for a reason of the moment (a time limit, a lock, an
//! unreadable file) says so with [`NotNow`], and the call is answered busy: nothing becomes part
//! of a plan that the person could not rely on. The built-in SQLite tools implement it
//! (`countersign_builtin::SqlDescriber`); the engine depends on this trait, not on them.

use std::fmt;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::server::ServerId;

/// What a call does, as its plan names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    /// The target the person reads (and types, where policy asks).
    pub target: String,
    /// The summary the person reads.
    pub summary: String,
}

/// Why a call could not be described just now. Never a fact of the call: asking again may work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotNow {
    /// Describing it ran past the describer's time limit.
    #[error("describing it ran past {} s", .0.as_secs())]
    TimeLimit(Duration),
    /// What it would touch was locked by someone else.
    #[error("the database was busy: another connection held its lock")]
    Busy,
    /// What it would touch could not be read just now.
    #[error("the database could not be opened, read or written")]
    Unavailable,
}

/// Names the plans of the calls it knows by what they would do.
pub trait Describer: Send + Sync + fmt::Debug {
    /// Whether a call of `tool` with `arguments` on `server` is planned by describing it.
    /// Cheap: no I/O.
    fn describes(&self, server: &ServerId, tool: &str, arguments: &Map<String, Value>) -> bool;

    /// Describes the call. May block (it may read a database): the engine runs it off its async
    /// workers, one at a time per connection.
    fn describe(
        &self,
        server: &ServerId,
        tool: &str,
        arguments: &Map<String, Value>,
    ) -> Result<Description, NotNow>;
}
