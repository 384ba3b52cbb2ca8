//! Approvers' signed decisions, kept as the record of who approved or denied what.
//!
//! On a team's server a click happens at a person's desk, which signs it; the server verifies
//! the signature before anything is minted and keeps the decision here, signature and all, so
//! anyone can check later, with the approver's public key, that this person decided exactly
//! this (`countersign_core::approver::verify`). Rows are only ever added.

use countersign_core::approver::Verdict;
use countersign_core::{GateClass, PlanHash};

use crate::error::{ms_from_sql, ms_to_sql};
use crate::{Store, StoreError};

pub(crate) const TABLE: &str = "approver_decision";

/// The most decisions [`Store::decisions`] answers with at once.
pub const MAX_DECISION_ROWS: usize = 10_000;

/// One verified decision of one approver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionRecord {
    /// The approver, by its name on the roster.
    pub approver: String,
    /// The server the decision names (as the approver enrolled with it).
    pub server: String,
    /// The request's id on that server.
    pub request: u64,
    /// Approve or deny.
    pub verdict: Verdict,
    /// The plan hash the approver read.
    pub plan: PlanHash,
    /// The caller the request was from.
    pub tenant: String,
    /// The tool.
    pub tool: String,
    /// The target.
    pub target: String,
    /// The gate class shown.
    pub class: GateClass,
    /// Until when the decision could be acted on, ms since the epoch.
    pub expires_at_ms: u64,
    /// The approver's Ed25519 signature over the decision.
    pub signature: [u8; 64],
    /// When the server accepted it, ms since the epoch.
    pub decided_at_ms: u64,
}

/// A decision's columns, as stored.
pub(crate) struct Row {
    pub(crate) request: i64,
    pub(crate) verdict: &'static str,
    pub(crate) plan: String,
    pub(crate) class: &'static str,
    pub(crate) expires_at_ms: i64,
    pub(crate) decided_at_ms: i64,
}

pub(crate) fn to_row(d: &DecisionRecord) -> Result<Row, StoreError> {
    Ok(Row {
        request: ms_to_sql(d.request)?,
        verdict: d.verdict.code(),
        plan: d.plan.to_hex(),
        class: d.class.code(),
        expires_at_ms: ms_to_sql(d.expires_at_ms)?,
        decided_at_ms: ms_to_sql(d.decided_at_ms)?,
    })
}

/// The columns in the order both dialects select them.
pub(crate) const COLUMNS: &str = "approver, server, request, verdict, plan, tenant, tool, target, \
     class, expires_at_ms, signature, decided_at_ms";

/// A row as read back.
#[allow(clippy::too_many_arguments)]
pub(crate) fn from_row(
    approver: String,
    server: String,
    request: i64,
    verdict: String,
    plan: String,
    tenant: String,
    tool: String,
    target: String,
    class: String,
    expires_at_ms: i64,
    signature: Vec<u8>,
    decided_at_ms: i64,
) -> Result<DecisionRecord, StoreError> {
    let invalid = |reason: String| StoreError::InvalidRow {
        table: TABLE,
        reason,
    };
    Ok(DecisionRecord {
        approver,
        server,
        request: ms_from_sql(request, TABLE)?,
        verdict: match verdict.as_str() {
            "approve" => Verdict::Approve,
            "deny" => Verdict::Deny,
            other => return Err(invalid(format!("verdict {other:?}"))),
        },
        plan: PlanHash::from_hex(&plan).ok_or_else(|| invalid("a plan hash".into()))?,
        tenant,
        tool,
        target,
        class: GateClass::from_code(&class).ok_or_else(|| invalid(format!("class {class:?}")))?,
        expires_at_ms: ms_from_sql(expires_at_ms, TABLE)?,
        signature: signature
            .try_into()
            .map_err(|_| invalid("a signature that is not 64 bytes".into()))?,
        decided_at_ms: ms_from_sql(decided_at_ms, TABLE)?,
    })
}

impl Store {
    /// Keeps a verified decision.
    pub fn put_decision(&mut self, d: &DecisionRecord) -> Result<(), StoreError> {
        let row = to_row(d)?;
        self.with_connection(|conn| {
            conn.prepare_cached(&format!(
                "INSERT INTO approver_decision ({COLUMNS})
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
            ))?
            .execute(rusqlite::params![
                d.approver,
                d.server,
                row.request,
                row.verdict,
                row.plan,
                d.tenant,
                d.tool,
                d.target,
                row.class,
                row.expires_at_ms,
                d.signature.as_slice(),
                row.decided_at_ms
            ])?;
            Ok(())
        })
    }

    /// The decisions kept, oldest first, at most `limit` (and never more than
    /// [`MAX_DECISION_ROWS`]) of the newest.
    pub fn decisions(&mut self, limit: usize) -> Result<Vec<DecisionRecord>, StoreError> {
        let limit = limit.min(MAX_DECISION_ROWS) as i64;
        self.with_connection(|conn| {
            let mut statement = conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM (SELECT * FROM approver_decision ORDER BY id DESC LIMIT ?1)
                 ORDER BY id"
            ))?;
            let rows = statement
                .query_map([limit], |r| {
                    Ok((
                        (
                            r.get(0)?,
                            r.get(1)?,
                            r.get(2)?,
                            r.get(3)?,
                            r.get(4)?,
                            r.get(5)?,
                        ),
                        (
                            r.get(6)?,
                            r.get(7)?,
                            r.get(8)?,
                            r.get(9)?,
                            r.get(10)?,
                            r.get(11)?,
                        ),
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter()
                .map(|((a, s, r, v, p, te), (to, ta, c, e, sig, at))| {
                    from_row(a, s, r, v, p, te, to, ta, c, e, sig, at)
                })
                .collect()
        })
    }
}
