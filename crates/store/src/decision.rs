//! Approvers' signed decisions, kept as the record of who approved or denied what.
//!
//! On a team's server a click happens at a person's desk, which signs it, or on the approvers'
//! page, where the person's passkey signs it; the server verifies the signature before anything
//! is minted and keeps the decision here, with what proves it, so anyone can check later that
//! this person decided exactly this: a desk's Ed25519 signature with the approver's public key
//! (`countersign_core::approver::verify`), a passkey's WebAuthn assertion (authenticator data,
//! client data, signature) with the credential's public key from the roster. Desks' decisions
//! and passkeys' live in two tables (their proofs differ in shape); they are read as one. Rows
//! are only ever added.

use countersign_core::approver::Verdict;
use countersign_core::{GateClass, PlanHash};

use crate::error::{ms_from_sql, ms_to_sql};
use crate::{Store, StoreError};

pub(crate) const TABLE: &str = "approver_decision";

/// The table of decisions a passkey signed.
pub(crate) const PASSKEY_TABLE: &str = "passkey_decision";

/// The most decisions [`Store::decisions`] answers with at once.
pub const MAX_DECISION_ROWS: usize = 10_000;

/// The largest part of a passkey's assertion kept (authenticator data, client data, signature,
/// credential id), in bytes: real ones are a few hundred.
pub const MAX_ASSERTION_PART_BYTES: usize = 4096;

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
    /// What proves the approver made it.
    pub evidence: Evidence,
    /// When the server accepted it, ms since the epoch.
    pub decided_at_ms: u64,
}

/// What proves a decision is its approver's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evidence {
    /// A desk's Ed25519 signature over the decision (`countersign_core::approver`).
    Desk {
        /// The signature.
        signature: [u8; 64],
    },
    /// A passkey's WebAuthn assertion whose challenge is the decision's
    /// (`Decision::passkey_challenge`).
    Passkey(Assertion),
}

/// A WebAuthn assertion as the authenticator and the browser made it: everything needed to check
/// it again later, with the credential's public key.
#[derive(Clone, PartialEq, Eq)]
pub struct Assertion {
    /// The credential that signed (its id on the roster).
    pub credential_id: Vec<u8>,
    /// The authenticator data (RP ID hash, flags, counter).
    pub authenticator_data: Vec<u8>,
    /// The browser's client data JSON (type, challenge, origin), as it was signed.
    pub client_data: Vec<u8>,
    /// The signature over the authenticator data and the client data's SHA-256.
    pub signature: Vec<u8>,
}

impl std::fmt::Debug for Assertion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Nothing in an assertion is secret, but its bytes make a log unreadable: sizes only.
        f.debug_struct("Assertion")
            .field("credential_id", &self.credential_id.len())
            .field("authenticator_data", &self.authenticator_data.len())
            .field("client_data", &self.client_data.len())
            .field("signature", &self.signature.len())
            .finish()
    }
}

/// A decision's columns, as stored.
pub(crate) struct Row {
    pub(crate) request: i64,
    pub(crate) verdict: &'static str,
    pub(crate) plan: String,
    pub(crate) class: &'static str,
    pub(crate) expires_at_ms: i64,
    pub(crate) decided_at_ms: i64,
    /// The table it goes to.
    pub(crate) table: &'static str,
    /// The signature column: a desk's 64 bytes, or a passkey's.
    pub(crate) signature: Vec<u8>,
    /// A passkey's credential id, authenticator data and client data.
    pub(crate) assertion: Option<(Vec<u8>, Vec<u8>, Vec<u8>)>,
}

pub(crate) fn to_row(d: &DecisionRecord) -> Result<Row, StoreError> {
    let (table, signature, assertion) = match &d.evidence {
        Evidence::Desk { signature } => (TABLE, signature.to_vec(), None),
        Evidence::Passkey(a) => {
            let parts = [
                &a.credential_id,
                &a.authenticator_data,
                &a.client_data,
                &a.signature,
            ];
            if parts
                .iter()
                .any(|p| p.is_empty() || p.len() > MAX_ASSERTION_PART_BYTES)
            {
                return Err(StoreError::InvalidRow {
                    table: PASSKEY_TABLE,
                    reason: format!(
                        "every part of an assertion is 1 to {MAX_ASSERTION_PART_BYTES} bytes"
                    ),
                });
            }
            (
                PASSKEY_TABLE,
                a.signature.clone(),
                Some((
                    a.credential_id.clone(),
                    a.authenticator_data.clone(),
                    a.client_data.clone(),
                )),
            )
        }
    };
    Ok(Row {
        request: ms_to_sql(d.request)?,
        verdict: d.verdict.code(),
        plan: d.plan.to_hex(),
        class: d.class.code(),
        expires_at_ms: ms_to_sql(d.expires_at_ms)?,
        decided_at_ms: ms_to_sql(d.decided_at_ms)?,
        table,
        signature,
        assertion,
    })
}

/// The columns both tables share, in the order both dialects write and select them.
pub(crate) const COLUMNS: &str = "approver, server, request, verdict, plan, tenant, tool, target, \
     class, expires_at_ms, signature, decided_at_ms";

/// The insert for `row`'s table, with parameters spelled `{p}1`… (`$` or `?`): [`COLUMNS`], then
/// a passkey's credential id, authenticator data and client data.
pub(crate) fn insert(row: &Row, p: char) -> String {
    let (extra, n) = match row.assertion {
        Some(_) => (", credential_id, authenticator_data, client_data", 15),
        None => ("", 12),
    };
    let values: Vec<String> = (1..=n).map(|i| format!("{p}{i}")).collect();
    format!(
        "INSERT INTO {} ({COLUMNS}{extra}) VALUES ({})",
        row.table,
        values.join(", ")
    )
}

/// The newest decisions of both tables, newest first, at most `{p}1`: [`COLUMNS`], then a
/// passkey's credential id, authenticator data and client data (NULL for a desk's).
pub(crate) fn newest(p: char) -> String {
    format!(
        "SELECT {COLUMNS}, credential_id, authenticator_data, client_data FROM (
             SELECT id, 0 AS kind, {COLUMNS}, NULL AS credential_id, NULL AS authenticator_data,
                    NULL AS client_data
               FROM {TABLE}
             UNION ALL
             SELECT id, 1 AS kind, {COLUMNS}, credential_id, authenticator_data, client_data
               FROM {PASSKEY_TABLE}
         ) AS kept
         ORDER BY decided_at_ms DESC, kind DESC, id DESC LIMIT {p}1"
    )
}

/// The distinct approvers approving `{p}2` of `{p}1` over `{p}3`, from either table: a person
/// with a desk key and passkeys counts once.
pub(crate) fn approvers_of(p: char) -> String {
    format!(
        "SELECT approver FROM {TABLE}
          WHERE server = {p}1 AND request = {p}2 AND plan = {p}3 AND verdict = 'approve'
         UNION
         SELECT approver FROM {PASSKEY_TABLE}
          WHERE server = {p}1 AND request = {p}2 AND plan = {p}3 AND verdict = 'approve'
         ORDER BY approver"
    )
}

/// A decision's row as read back, before it is checked.
pub(crate) struct Raw {
    pub(crate) approver: String,
    pub(crate) server: String,
    pub(crate) request: i64,
    pub(crate) verdict: String,
    pub(crate) plan: String,
    pub(crate) tenant: String,
    pub(crate) tool: String,
    pub(crate) target: String,
    pub(crate) class: String,
    pub(crate) expires_at_ms: i64,
    pub(crate) signature: Vec<u8>,
    pub(crate) decided_at_ms: i64,
    pub(crate) credential_id: Option<Vec<u8>>,
    pub(crate) authenticator_data: Option<Vec<u8>>,
    pub(crate) client_data: Option<Vec<u8>>,
}

/// A row as read back, into a decision; a damaged one is an error.
pub(crate) fn from_row(raw: Raw) -> Result<DecisionRecord, StoreError> {
    let invalid = |reason: String| StoreError::InvalidRow {
        table: TABLE,
        reason,
    };
    let evidence = match (raw.credential_id, raw.authenticator_data, raw.client_data) {
        (None, None, None) => Evidence::Desk {
            signature: raw
                .signature
                .try_into()
                .map_err(|_| invalid("a signature that is not 64 bytes".into()))?,
        },
        (Some(credential_id), Some(authenticator_data), Some(client_data)) => {
            Evidence::Passkey(Assertion {
                credential_id,
                authenticator_data,
                client_data,
                signature: raw.signature,
            })
        }
        _ => return Err(invalid("a passkey's assertion with a part missing".into())),
    };
    Ok(DecisionRecord {
        approver: raw.approver,
        server: raw.server,
        request: ms_from_sql(raw.request, TABLE)?,
        verdict: match raw.verdict.as_str() {
            "approve" => Verdict::Approve,
            "deny" => Verdict::Deny,
            other => return Err(invalid(format!("verdict {other:?}"))),
        },
        plan: PlanHash::from_hex(&raw.plan).ok_or_else(|| invalid("a plan hash".into()))?,
        tenant: raw.tenant,
        tool: raw.tool,
        target: raw.target,
        class: GateClass::from_code(&raw.class)
            .ok_or_else(|| invalid(format!("class {:?}", raw.class)))?,
        expires_at_ms: ms_from_sql(raw.expires_at_ms, TABLE)?,
        evidence,
        decided_at_ms: ms_from_sql(raw.decided_at_ms, TABLE)?,
    })
}

impl Store {
    /// Keeps a verified decision.
    pub fn put_decision(&mut self, d: &DecisionRecord) -> Result<(), StoreError> {
        let row = to_row(d)?;
        let sql = insert(&row, '?');
        self.with_connection(|conn| {
            let mut statement = conn.prepare_cached(&sql)?;
            let common = rusqlite::params![
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
                row.signature,
                row.decided_at_ms
            ];
            match &row.assertion {
                None => statement.execute(common)?,
                Some((credential, data, client)) => {
                    let mut all: Vec<&dyn rusqlite::ToSql> = common.to_vec();
                    all.extend([credential as &dyn rusqlite::ToSql, data, client]);
                    statement.execute(all.as_slice())?
                }
            };
            Ok(())
        })
    }

    /// The decisions kept, oldest first, at most `limit` (and never more than
    /// [`MAX_DECISION_ROWS`]) of the newest.
    pub fn decisions(&mut self, limit: usize) -> Result<Vec<DecisionRecord>, StoreError> {
        let limit = limit.min(MAX_DECISION_ROWS) as i64;
        let sql = newest('?');
        self.with_connection(|conn| {
            let mut statement = conn.prepare_cached(&sql)?;
            let rows = statement
                .query_map([limit], |r| {
                    Ok(Raw {
                        approver: r.get(0)?,
                        server: r.get(1)?,
                        request: r.get(2)?,
                        verdict: r.get(3)?,
                        plan: r.get(4)?,
                        tenant: r.get(5)?,
                        tool: r.get(6)?,
                        target: r.get(7)?,
                        class: r.get(8)?,
                        expires_at_ms: r.get(9)?,
                        signature: r.get(10)?,
                        decided_at_ms: r.get(11)?,
                        credential_id: r.get(12)?,
                        authenticator_data: r.get(13)?,
                        client_data: r.get(14)?,
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let mut kept = rows
                .into_iter()
                .map(from_row)
                .collect::<Result<Vec<_>, _>>()?;
            kept.reverse();
            Ok(kept)
        })
    }
}
