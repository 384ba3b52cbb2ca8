//! Keys a team's server issues to agents that have no identity provider behind them.
//!
//! `countersign serve agent add NAME` makes a random key, shows it once, and keeps only its
//! SHA-256 hash here: whoever reads the records cannot call as the agent. A key is looked up by
//! that hash, names its agent (the tenant `key:NAME`), and stops working the moment it is
//! revoked. Revoked keys stay on record, so a name is never reused for another agent's history.

use rusqlite::OptionalExtension;

use crate::error::{ms_from_sql, ms_to_sql};
use crate::{Store, StoreError};

pub(crate) const TABLE: &str = "agent_key";

/// The longest agent name accepted.
pub const MAX_AGENT_NAME_CHARS: usize = 64;

/// An agent's key, as the records keep it (its hash, never the key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentKey {
    /// The agent's name: letters, digits, `.`, `_` and `-`.
    pub name: String,
    /// SHA-256 of the key.
    pub hash: [u8; 32],
    /// When it was made, ms since the epoch.
    pub created_at_ms: u64,
    /// When it was revoked, if it was.
    pub revoked_at_ms: Option<u64>,
}

/// Whether `name` may name an agent: 1 to [`MAX_AGENT_NAME_CHARS`] of letters, digits, `.`, `_`
/// and `-` (it becomes part of a tenant, shown to people and written to history).
pub fn valid_agent_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().count() <= MAX_AGENT_NAME_CHARS
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Refuses a name that may not name an agent, and a time out of range; answers the time as
/// stored.
pub(crate) fn checked(key: &AgentKey) -> Result<i64, StoreError> {
    if !valid_agent_name(&key.name) {
        return Err(StoreError::InvalidRow {
            table: TABLE,
            reason: format!(
                "an agent's name is 1 to {MAX_AGENT_NAME_CHARS} letters, digits, '.', '_' or '-'"
            ),
        });
    }
    ms_to_sql(key.created_at_ms)
}

/// A row as read, into a key.
pub(crate) fn from_row(
    name: String,
    hash: Vec<u8>,
    created: i64,
    revoked: Option<i64>,
) -> Result<AgentKey, StoreError> {
    let hash: [u8; 32] = hash.try_into().map_err(|_| StoreError::InvalidRow {
        table: TABLE,
        reason: "a key hash that is not 32 bytes".into(),
    })?;
    Ok(AgentKey {
        name,
        hash,
        created_at_ms: ms_from_sql(created, TABLE)?,
        revoked_at_ms: revoked.map(|r| ms_from_sql(r, TABLE)).transpose()?,
    })
}

impl Store {
    /// Records a new agent key. `false`: an agent of that name exists (revoked or not), and
    /// nothing was written.
    pub fn put_agent_key(&mut self, key: &AgentKey) -> Result<bool, StoreError> {
        let created = checked(key)?;
        self.with_connection(|conn| {
            let inserted = conn
                .prepare_cached(
                    "INSERT INTO agent_key (name, hash, created_at_ms) VALUES (?1, ?2, ?3)
                     ON CONFLICT DO NOTHING",
                )?
                .execute(rusqlite::params![key.name, key.hash.as_slice(), created])?;
            Ok(inserted == 1)
        })
    }

    /// The agent key whose hash is `hash`, revoked or not.
    pub fn agent_key(&mut self, hash: &[u8; 32]) -> Result<Option<AgentKey>, StoreError> {
        self.with_connection(|conn| {
            let row = conn
                .prepare_cached(
                    "SELECT name, hash, created_at_ms, revoked_at_ms FROM agent_key
                     WHERE hash = ?1",
                )?
                .query_row([hash.as_slice()], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })
                .optional()?;
            row.map(|(name, hash, created, revoked)| from_row(name, hash, created, revoked))
                .transpose()
        })
    }

    /// Revokes the key of agent `name` at `now`. `false`: no such agent, or already revoked.
    pub fn revoke_agent_key(&mut self, name: &str, now: u64) -> Result<bool, StoreError> {
        let now = ms_to_sql(now)?;
        self.with_connection(|conn| {
            let changed = conn
                .prepare_cached(
                    "UPDATE agent_key SET revoked_at_ms = ?2
                     WHERE name = ?1 AND revoked_at_ms IS NULL",
                )?
                .execute(rusqlite::params![name, now])?;
            Ok(changed == 1)
        })
    }

    /// Every agent key, by name.
    pub fn agent_keys(&mut self) -> Result<Vec<AgentKey>, StoreError> {
        self.with_connection(|conn| {
            let mut statement = conn.prepare_cached(
                "SELECT name, hash, created_at_ms, revoked_at_ms FROM agent_key ORDER BY name",
            )?;
            let rows = statement
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter()
                .map(|(name, hash, created, revoked)| from_row(name, hash, created, revoked))
                .collect()
        })
    }
}
