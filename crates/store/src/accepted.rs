//! The files a person may edit (the server registry `servers.json`, `policy.toml`) as the desk
//! last accepted them.
//!
//! The desk applies what is recorded here, not what the file says: an edit made in the desk's
//! own settings view is the person's and is recorded at once, but an edit made behind the desk's
//! back (by an agent with a shell, say) differs from the record, and is shown to the person as a
//! change that takes effect only after their click. Without the record there would be no "before"
//! to compare with.

use rusqlite::OptionalExtension;

use crate::error::{ms_from_sql, ms_to_sql};
use crate::{Store, StoreError};

pub(crate) const TABLE: &str = "accepted_file";

/// The most bytes of a file the desk accepts (registry and policy are small; a huge file is
/// refused, not stored).
pub const MAX_ACCEPTED_BYTES: usize = 4 * 1024 * 1024;

/// A file's text as last accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// Its text.
    pub text: String,
    /// When it was accepted, ms since the epoch.
    pub at_ms: u64,
}

/// Refuses a text larger than [`MAX_ACCEPTED_BYTES`] and a time out of range (both stores);
/// answers the time as stored.
pub(crate) fn checked(name: &str, text: &str, at_ms: u64) -> Result<i64, StoreError> {
    if text.len() > MAX_ACCEPTED_BYTES {
        return Err(StoreError::InvalidRow {
            table: TABLE,
            reason: format!("{name} is larger than {MAX_ACCEPTED_BYTES} bytes"),
        });
    }
    ms_to_sql(at_ms)
}

impl Store {
    /// The text of the file `name` as last accepted, if it ever was.
    pub fn accepted(&mut self, name: &str) -> Result<Option<Accepted>, StoreError> {
        self.with_connection(|conn| {
            let row = conn
                .prepare_cached("SELECT text, accepted_at_ms FROM accepted_file WHERE name = ?1")?
                .query_row([name], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
                })
                .optional()?;
            row.map(|(text, at)| {
                Ok(Accepted {
                    text,
                    at_ms: ms_from_sql(at, TABLE)?,
                })
            })
            .transpose()
        })
    }

    /// Records `text` as the accepted text of the file `name`.
    pub fn accept(&mut self, name: &str, text: &str, at_ms: u64) -> Result<(), StoreError> {
        let at = checked(name, text, at_ms)?;
        self.with_connection(|conn| {
            conn.prepare_cached(
                "INSERT INTO accepted_file (name, text, accepted_at_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (name) DO UPDATE
                     SET text = excluded.text, accepted_at_ms = excluded.accepted_at_ms",
            )?
            .execute(rusqlite::params![name, text, at])?;
            Ok(())
        })
    }

    /// Records `text` as the accepted text of `name` only if what is on record is `expected`
    /// (`None`: nothing yet): `false`, and nothing written, if the record moved since.
    pub fn replace_accepted(
        &mut self,
        name: &str,
        expected: Option<&str>,
        text: &str,
        at_ms: u64,
    ) -> Result<bool, StoreError> {
        let at = checked(name, text, at_ms)?;
        self.with_connection(|conn| {
            let changed = match expected {
                Some(expected) => conn
                    .prepare_cached(REPLACE_SQLITE)?
                    .execute(rusqlite::params![name, text, at, expected])?,
                None => conn
                    .prepare_cached(FIRST_SQLITE)?
                    .execute(rusqlite::params![name, text, at])?,
            };
            Ok(changed == 1)
        })
    }
}

/// [`Store::replace_accepted`] over a text on record (`?4`).
const REPLACE_SQLITE: &str = "UPDATE accepted_file SET text = ?2, accepted_at_ms = ?3
     WHERE name = ?1 AND text = ?4";

/// [`Store::replace_accepted`] where nothing is on record.
const FIRST_SQLITE: &str = "INSERT INTO accepted_file (name, text, accepted_at_ms)
     VALUES (?1, ?2, ?3) ON CONFLICT (name) DO NOTHING";
