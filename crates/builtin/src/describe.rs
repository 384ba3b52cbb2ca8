//! The built-in `execute` described by SQLite's own word, for the engine's planning.
//!
//! The desk names the built-in tools' upstream `builtin:<absolute db path>`; for an `execute`
//! there, the plan's target is every table the SQL writes (and every other effect) and its
//! summary the statements' kinds and tables, as [`crate::rehearse`] finds them while preparing
//! the batch (never running it). A rehearsal that stops for a reason of the moment is
//! [`NotNow`]; one that stops because of the SQL itself is still a description (the same every
//! time).

use std::path::Path;

use countersign_core::describe::{Describer, Description, NotNow};
use serde_json::{Map, Value};

use crate::rehearse::{self, Mode, Stopped};

/// The identity prefix the desk gives its built-in tools (`builtin:<db path>`).
const BUILTIN: &str = "builtin:";

/// The server identity the desk gives the built-in tools on the file at `db`.
pub fn builtin_server(db: &Path) -> String {
    format!("{BUILTIN}{}", db.display())
}

/// The database of a built-in server identity, if `server` is one.
pub fn builtin_db(server: &str) -> Option<&Path> {
    server
        .strip_prefix(BUILTIN)
        .map(Path::new)
        .filter(|p| p.is_absolute())
}

/// Describes the built-in `execute`'s SQL (see the module's doc).
#[derive(Debug, Clone, Copy, Default)]
pub struct SqlDescriber;

impl SqlDescriber {
    fn sql<'a>(
        server: &'a str,
        tool: &str,
        arguments: &'a Map<String, Value>,
    ) -> Option<(&'a Path, &'a str)> {
        match (builtin_db(server), tool, arguments.get("sql")) {
            (Some(db), "execute", Some(Value::String(sql))) => Some((db, sql)),
            _ => None,
        }
    }
}

impl Describer for SqlDescriber {
    fn describes(&self, server: &str, tool: &str, arguments: &Map<String, Value>) -> bool {
        Self::sql(server, tool, arguments).is_some()
    }

    fn describe(
        &self,
        server: &str,
        tool: &str,
        arguments: &Map<String, Value>,
    ) -> Result<Description, NotNow> {
        let Some((db, sql)) = Self::sql(server, tool, arguments) else {
            return Err(NotNow::Unavailable);
        };
        let described = rehearse::rehearse(db, sql, Mode::Describe);
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
