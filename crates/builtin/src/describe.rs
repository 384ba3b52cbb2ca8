//! The built-in `execute` described by SQLite's own word, for the engine's planning.
//!
//! For an `execute` on the built-in tools' upstream ([`ServerId::Builtin`]), the plan's target is every table the SQL writes (and every other effect) and its
//! summary the statements' kinds and tables, as [`crate::rehearse`] finds them while preparing
//! the batch (never running it). A rehearsal that stops for a reason of the moment is
//! [`NotNow`]; one that stops because of the SQL itself is still a description (the same every
//! time).

use std::path::Path;

use countersign_core::ServerId;
use countersign_core::describe::{Describer, Description, NotNow};
use serde_json::{Map, Value};

use crate::rehearse::{self, Stopped};

/// Describes the built-in `execute`'s SQL (see the module's doc), on connections kept open
/// between descriptions ([`rehearse::Kept`]): a confirm describes its call again, and opening
/// the database for each was most of what describing cost.
#[derive(Debug, Default)]
pub struct SqlDescriber {
    kept: rehearse::Kept,
}

impl SqlDescriber {
    fn sql<'a>(
        server: &'a ServerId,
        tool: &str,
        arguments: &'a Map<String, Value>,
    ) -> Option<(&'a Path, &'a str)> {
        match (server, tool, arguments.get("sql")) {
            (ServerId::Builtin(db), "execute", Some(Value::String(sql))) if db.is_absolute() => {
                Some((db, sql))
            }
            _ => None,
        }
    }
}

impl Describer for SqlDescriber {
    fn describes(&self, server: &ServerId, tool: &str, arguments: &Map<String, Value>) -> bool {
        Self::sql(server, tool, arguments).is_some()
    }

    fn describe(
        &self,
        server: &ServerId,
        tool: &str,
        arguments: &Map<String, Value>,
    ) -> Result<Description, NotNow> {
        let Some((db, sql)) = Self::sql(server, tool, arguments) else {
            return Err(NotNow::Unavailable);
        };
        let described = self.kept.describe(db, sql);
        match described.transient() {
            Some(Stopped::TimeLimit) => Err(NotNow::TimeLimit(rehearse::TIME_LIMIT)),
            Some(Stopped::Busy) => Err(NotNow::Busy),
            Some(_) => Err(NotNow::Unavailable),
            None => Ok(Description {
                target: described.target(),
                summary: described.summary(),
            }),
        }
    }
}
