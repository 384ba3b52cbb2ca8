//! The people and programs a team's server knows by a key: agents without an identity provider,
//! and approvers.
//!
//! Both rosters keep one 32-byte key per name and nothing secret:
//! - **agents**: `countersign serve agent add NAME` makes a random key, shows it once, and keeps
//!   only its SHA-256 hash here, so whoever reads the records cannot call as the agent. The
//!   agent's tenant is `key:NAME`.
//! - **approvers**: `countersign serve approver add NAME PUBKEY` keeps the Ed25519 public key of
//!   a person's desk, which signs that person's decisions and its TLS client certificate.
//!
//! A member is looked up by its key and stops counting the moment it is revoked. Revoked members
//! stay on record, so a name is never reused for someone else's history, and neither is a key.

use rusqlite::OptionalExtension;

use crate::error::{ms_from_sql, ms_to_sql};
use crate::{Store, StoreError};

/// The longest member name accepted.
pub const MAX_MEMBER_NAME_CHARS: usize = 64;

/// Which roster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Roster {
    /// Agents holding a key the server issued; the key is the SHA-256 of what the agent sends.
    Agents,
    /// People who approve at their desks; the key is their Ed25519 public key.
    Approvers,
}

impl Roster {
    /// The table, and the key's column in it (constants: safe to put in a statement).
    pub(crate) fn table(self) -> (&'static str, &'static str) {
        match self {
            Roster::Agents => ("agent_key", "hash"),
            Roster::Approvers => ("approver", "public_key"),
        }
    }
}

/// One member of a roster, as the records keep it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its name: letters, digits, `.`, `_` and `-`.
    pub name: String,
    /// An agent's key hash, or an approver's public key.
    pub key: [u8; 32],
    /// When it was added, ms since the epoch.
    pub created_at_ms: u64,
    /// When it was revoked, if it was.
    pub revoked_at_ms: Option<u64>,
}

impl Member {
    /// Whether it still counts.
    pub fn is_active(&self) -> bool {
        self.revoked_at_ms.is_none()
    }
}

/// Whether `name` may name a member: 1 to [`MAX_MEMBER_NAME_CHARS`] of letters, digits, `.`,
/// `_` and `-` (it becomes part of a tenant or a decision, shown to people and written to
/// history).
pub fn valid_member_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().count() <= MAX_MEMBER_NAME_CHARS
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Refuses a name that may not name a member, and a time out of range; answers the time as
/// stored.
pub(crate) fn checked(roster: Roster, member: &Member) -> Result<i64, StoreError> {
    if !valid_member_name(&member.name) {
        return Err(StoreError::InvalidRow {
            table: roster.table().0,
            reason: format!(
                "a name is 1 to {MAX_MEMBER_NAME_CHARS} letters, digits, '.', '_' or '-'"
            ),
        });
    }
    ms_to_sql(member.created_at_ms)
}

/// A row as read, into a member.
pub(crate) fn from_row(
    roster: Roster,
    name: String,
    key: Vec<u8>,
    created: i64,
    revoked: Option<i64>,
) -> Result<Member, StoreError> {
    let table = roster.table().0;
    let key: [u8; 32] = key.try_into().map_err(|_| StoreError::InvalidRow {
        table,
        reason: "a key that is not 32 bytes".into(),
    })?;
    Ok(Member {
        name,
        key,
        created_at_ms: ms_from_sql(created, table)?,
        revoked_at_ms: revoked.map(|r| ms_from_sql(r, table)).transpose()?,
    })
}

/// The statements of a roster, in either dialect (`$1` and `?1` alike are numbered).
pub(crate) struct Statements {
    pub(crate) insert: String,
    pub(crate) by_key: String,
    pub(crate) revoke: String,
    pub(crate) all: String,
}

/// The statements for `roster`, with parameters spelled `{p}1`, `{p}2`… (`$` or `?`).
pub(crate) fn statements(roster: Roster, p: char) -> Statements {
    let (table, key) = roster.table();
    Statements {
        insert: format!(
            "INSERT INTO {table} (name, {key}, created_at_ms) VALUES ({p}1, {p}2, {p}3)
             ON CONFLICT DO NOTHING"
        ),
        by_key: format!(
            "SELECT name, {key}, created_at_ms, revoked_at_ms FROM {table} WHERE {key} = {p}1"
        ),
        revoke: format!(
            "UPDATE {table} SET revoked_at_ms = {p}2 WHERE name = {p}1 AND revoked_at_ms IS NULL"
        ),
        all: format!("SELECT name, {key}, created_at_ms, revoked_at_ms FROM {table} ORDER BY name"),
    }
}

impl Store {
    /// Adds a member to `roster`. `false`: that name or that key is on the roster already
    /// (revoked or not), and nothing was written.
    pub fn put_member(&mut self, roster: Roster, member: &Member) -> Result<bool, StoreError> {
        let created = checked(roster, member)?;
        let sql = statements(roster, '?').insert;
        self.with_connection(|conn| {
            let inserted = conn.prepare_cached(&sql)?.execute(rusqlite::params![
                member.name,
                member.key.as_slice(),
                created
            ])?;
            Ok(inserted == 1)
        })
    }

    /// The member of `roster` whose key is `key`, revoked or not.
    pub fn member(&mut self, roster: Roster, key: &[u8; 32]) -> Result<Option<Member>, StoreError> {
        let sql = statements(roster, '?').by_key;
        self.with_connection(|conn| {
            let row = conn
                .prepare_cached(&sql)?
                .query_row([key.as_slice()], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })
                .optional()?;
            row.map(|(name, key, created, revoked)| from_row(roster, name, key, created, revoked))
                .transpose()
        })
    }

    /// Revokes member `name` of `roster` at `now` (an approver's desk key and every passkey of
    /// theirs). `false`: no such member, or revoked already.
    pub fn revoke_member(
        &mut self,
        roster: Roster,
        name: &str,
        now: u64,
    ) -> Result<bool, StoreError> {
        let now = ms_to_sql(now)?;
        let sql = statements(roster, '?').revoke;
        let passkeys = crate::passkey::statements('?').revoke;
        self.with_connection(|conn| {
            // An approver's desk key and passkeys end together, in one transaction.
            let tx = conn.transaction()?;
            let mut changed = tx
                .prepare_cached(&sql)?
                .execute(rusqlite::params![name, now])?;
            if roster == Roster::Approvers {
                changed += tx
                    .prepare_cached(&passkeys)?
                    .execute(rusqlite::params![name, now])?;
            }
            tx.commit()?;
            Ok(changed > 0)
        })
    }

    /// Every member of `roster`, by name.
    pub fn members(&mut self, roster: Roster) -> Result<Vec<Member>, StoreError> {
        let sql = statements(roster, '?').all;
        self.with_connection(|conn| {
            let mut statement = conn.prepare_cached(&sql)?;
            let rows = statement
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter()
                .map(|(name, key, created, revoked)| from_row(roster, name, key, created, revoked))
                .collect()
        })
    }
}
