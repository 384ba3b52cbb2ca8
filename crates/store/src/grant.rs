//! Grants: a person's widening of one approval, so later matching calls are approved without
//! another click until the grant expires, is revoked or (for a session grant) its connection ends.
//!
//! The engine decides what a grant covers and whether one may exist; this table only keeps them
//! durably, so that a revoke and the history's "by grant #n" survive a restart of the desk. Each
//! row carries the MAC the engine gave it at the click (under a key derived from the signing
//! secret): a row added or edited behind the desk's back is never honoured. The count of live
//! grants is checked in the same write transaction that adds one, so two clicks racing cannot
//! pass the cap together.

use countersign_core::{GateClass, PlanHash};
use rusqlite::{OptionalExtension, TransactionBehavior};

use crate::error::{ms_from_sql, ms_to_sql};
use crate::history::capped;
use crate::{Store, StoreError};

pub(crate) const TABLE: &str = "approval_grant";

/// The most grant rows read at once: more than the engine ever lets live, so a file padded with
/// rows cannot make a preflight read without end.
pub(crate) const MAX_READ: i64 = 1024;

/// What a grant covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantKind {
    /// The same call (server, tool and plan hash) for a while.
    Call,
    /// The tool on targets under a prefix, for one connection.
    Prefix,
}

impl GrantKind {
    /// The stable code: `call` or `prefix`.
    pub fn code(self) -> &'static str {
        match self {
            GrantKind::Call => "call",
            GrantKind::Prefix => "prefix",
        }
    }

    fn from_code(code: &str) -> Option<GrantKind> {
        match code {
            "call" => Some(GrantKind::Call),
            "prefix" => Some(GrantKind::Prefix),
            _ => None,
        }
    }
}

/// Why a grant stopped before its expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantEnd {
    /// The person revoked it.
    Revoked,
    /// Its connection ended (a session grant).
    Disconnected,
    /// The desk started again: no connection of before is alive, so no session grant is.
    Restarted,
}

impl GrantEnd {
    /// The stable code: `revoked`, `disconnected`, `restarted`.
    pub fn code(self) -> &'static str {
        match self {
            GrantEnd::Revoked => "revoked",
            GrantEnd::Disconnected => "disconnected",
            GrantEnd::Restarted => "restarted",
        }
    }
}

/// One grant as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Its number (assigned when stored; 0 before).
    pub id: u64,
    /// What it covers.
    pub kind: GrantKind,
    /// The server identity.
    pub server: String,
    /// The tool.
    pub tool: String,
    /// For a prefix grant: the connection it lives with.
    pub tenant: Option<String>,
    /// For a call grant: the plan hash it covers.
    pub plan: Option<PlanHash>,
    /// For a prefix grant: the prefix.
    pub prefix: Option<String>,
    /// The target of the request whose click made it.
    pub target: String,
    /// The summary of that request's plan.
    pub summary: String,
    /// The class of the tool when it was made: a stricter class later is not covered.
    pub class: GateClass,
    /// The hash of the tool's pinned definition when it was made.
    pub definition: PlanHash,
    /// The queue id of the request whose click made it.
    pub request: u64,
    /// When it was made, ms since the epoch.
    pub granted_at_ms: u64,
    /// When it stops, ms since the epoch.
    pub expires_at_ms: u64,
    /// How many calls it approved.
    pub uses: u64,
    /// When it ended before its expiry, and why.
    pub ended: Option<(u64, GrantEnd)>,
    /// The engine's MAC over its deciding fields.
    pub mac: [u8; 32],
}

pub(crate) fn invalid(reason: String) -> StoreError {
    StoreError::InvalidRow {
        table: TABLE,
        reason,
    }
}

pub(crate) const COLUMNS: &str = "id, kind, server, tool, tenant, plan, prefix, target, summary, class, \
                       definition, request, granted_at_ms, expires_at_ms, uses, ended_at_ms, \
                       ended, mac";

/// A grant row as stored, in [`COLUMNS`] order, before decoding (both stores read into this).
pub(crate) type Row = (
    i64,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    String,
    String,
    String,
    String,
    i64,
    i64,
    i64,
    i64,
    Option<i64>,
    Option<String>,
    Vec<u8>,
);

fn read_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
        r.get(9)?,
        r.get(10)?,
        r.get(11)?,
        r.get(12)?,
        r.get(13)?,
        r.get(14)?,
        r.get(15)?,
        r.get(16)?,
        r.get(17)?,
    ))
}

pub(crate) fn decode(row: Row) -> Result<Grant, StoreError> {
    let (
        id,
        kind,
        server,
        tool,
        tenant,
        plan,
        prefix,
        target,
        summary,
        class,
        definition,
        request,
        granted_at,
        expires_at,
        uses,
        ended_at,
        ended,
        mac,
    ) = row;
    let hash =
        |text: &str| PlanHash::from_hex(text).ok_or_else(|| invalid(format!("hash {text:?}")));
    let ended = match (ended_at, ended.as_deref()) {
        (None, None) => None,
        (Some(at), Some(why)) => Some((
            ms_from_sql(at, TABLE)?,
            match why {
                "revoked" => GrantEnd::Revoked,
                "disconnected" => GrantEnd::Disconnected,
                "restarted" => GrantEnd::Restarted,
                other => return Err(invalid(format!("ended {other:?}"))),
            },
        )),
        _ => return Err(invalid("ended without a time or a reason".into())),
    };
    Ok(Grant {
        id: u64::try_from(id).map_err(|_| invalid(format!("id {id}")))?,
        kind: GrantKind::from_code(&kind).ok_or_else(|| invalid(format!("kind {kind:?}")))?,
        server,
        tool,
        tenant,
        plan: plan.as_deref().map(hash).transpose()?,
        prefix,
        target,
        summary,
        class: GateClass::from_code(&class)
            .filter(|c| c.is_gated())
            .ok_or_else(|| invalid(format!("class {class:?}")))?,
        definition: hash(&definition)?,
        request: u64::try_from(request).map_err(|_| invalid(format!("request {request}")))?,
        granted_at_ms: ms_from_sql(granted_at, TABLE)?,
        expires_at_ms: ms_from_sql(expires_at, TABLE)?,
        uses: u64::try_from(uses).map_err(|_| invalid(format!("uses {uses}")))?,
        ended,
        mac: mac
            .try_into()
            .map_err(|_| invalid("a MAC that is not 32 bytes".into()))?,
    })
}

impl Store {
    /// Stores `grant` and answers its number, unless `max_live` grants already live at `now`
    /// (not ended, not expired): then nothing is stored and the answer is `None`.
    pub fn put_grant(
        &mut self,
        grant: &Grant,
        max_live: usize,
        now: u64,
    ) -> Result<Option<u64>, StoreError> {
        let now = ms_to_sql(now)?;
        let granted_at = ms_to_sql(grant.granted_at_ms)?;
        let expires_at = ms_to_sql(grant.expires_at_ms)?;
        let request = i64::try_from(grant.request).map_err(|_| invalid("request id".into()))?;
        self.with_connection(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let live: i64 = tx.query_row(
                "SELECT count(*) FROM approval_grant WHERE ended_at_ms IS NULL AND expires_at_ms > ?1",
                [now],
                |r| r.get(0),
            )?;
            if usize::try_from(live).unwrap_or(usize::MAX) >= max_live {
                return Ok(None);
            }
            tx.execute(
                "INSERT INTO approval_grant
                     (kind, server, tool, tenant, plan, prefix, target, summary, class,
                      definition, request, granted_at_ms, expires_at_ms, uses, mac)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, 0, ?14)",
                rusqlite::params![
                    grant.kind.code(),
                    grant.server,
                    grant.tool,
                    grant.tenant,
                    grant.plan.map(|p| p.to_hex()),
                    grant.prefix,
                    capped(&grant.target),
                    capped(&grant.summary),
                    grant.class.code(),
                    grant.definition.to_hex(),
                    request,
                    granted_at,
                    expires_at,
                    &grant.mac[..],
                ],
            )?;
            let id = tx.last_insert_rowid();
            tx.commit()?;
            Ok(Some(u64::try_from(id).map_err(|_| invalid(format!("id {id}")))?))
        })
    }

    /// The grants live at `now` (not ended, not expired), oldest first.
    pub fn live_grants(&mut self, now: u64) -> Result<Vec<Grant>, StoreError> {
        let now = ms_to_sql(now)?;
        let rows = self.with_connection(|conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM approval_grant
                 WHERE ended_at_ms IS NULL AND expires_at_ms > ?1 ORDER BY id LIMIT ?2"
            ))?;
            let rows = stmt
                .query_map(rusqlite::params![now, MAX_READ], read_row)?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })?;
        rows.into_iter().map(decode).collect()
    }

    /// Grant `id`, live or not.
    pub fn grant(&mut self, id: u64) -> Result<Option<Grant>, StoreError> {
        let Ok(id) = i64::try_from(id) else {
            return Ok(None);
        };
        let row = self.with_connection(|conn| {
            Ok(conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM approval_grant WHERE id = ?1"
                ))?
                .query_row([id], read_row)
                .optional()?)
        })?;
        row.map(decode).transpose()
    }

    /// Ends grant `id` at `now` for `why`; answers whether it was live until then.
    pub fn end_grant(&mut self, id: u64, now: u64, why: GrantEnd) -> Result<bool, StoreError> {
        let Ok(id) = i64::try_from(id) else {
            return Ok(false);
        };
        let now = ms_to_sql(now)?;
        self.with_connection(|conn| {
            Ok(conn.execute(
                "UPDATE approval_grant SET ended_at_ms = ?2, ended = ?3
                 WHERE id = ?1 AND ended_at_ms IS NULL AND expires_at_ms > ?2",
                rusqlite::params![id, now, why.code()],
            )? == 1)
        })
    }

    /// Ends the prefix grants of connection `tenant` (every connection's: `None`) still live at
    /// `now`; answers how many.
    pub fn end_prefix_grants(
        &mut self,
        tenant: Option<&str>,
        now: u64,
        why: GrantEnd,
    ) -> Result<usize, StoreError> {
        let now = ms_to_sql(now)?;
        self.with_connection(|conn| {
            Ok(conn.execute(
                "UPDATE approval_grant SET ended_at_ms = ?1, ended = ?2
                 WHERE kind = 'prefix' AND ended_at_ms IS NULL AND (?3 IS NULL OR tenant = ?3)",
                rusqlite::params![now, why.code(), tenant],
            )?)
        })
    }

    /// Counts one call approved by grant `id`.
    pub fn grant_used(&mut self, id: u64) -> Result<(), StoreError> {
        let Ok(id) = i64::try_from(id) else {
            return Ok(());
        };
        self.with_connection(|conn| {
            conn.execute(
                "UPDATE approval_grant SET uses = uses + 1 WHERE id = ?1",
                [id],
            )?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{grant, raw, temp_store};

    #[test]
    fn a_damaged_row_is_refused_not_guessed_at() {
        let (_dir, mut store) = temp_store();
        store
            .put_grant(&grant(GrantKind::Call, 10_000), 64, 1_000)
            .unwrap()
            .unwrap();
        raw(&store)
            .execute("UPDATE approval_grant SET plan = ?1", ["z".repeat(64)])
            .unwrap();
        assert!(matches!(
            store.live_grants(1_000),
            Err(StoreError::InvalidRow { .. })
        ));
    }
}
