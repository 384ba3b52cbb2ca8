//! The arguments a person approved, kept with the nonce of the token minted for them.
//!
//! Countersign executes what was approved, not what the confirm carries: the confirm's arguments
//! must hash equal, and then the stored value is what is forwarded. The desk may restart between
//! the click and the confirm, so the approval lives in the file, keyed by nonce, and is never
//! overwritten once written. It also records the gate class it was made under, so that a confirm
//! can be checked under the stricter of that class and the tool's current one: a listing that
//! changes after the click never turns a single-use approval into a reusable one.

use countersign_core::{GateClass, Nonce, PlanHash};
use rusqlite::{OptionalExtension, TransactionBehavior, ffi};

use crate::error::{ms_from_sql, ms_to_sql};
use crate::{Store, StoreError};

const TABLE: &str = "approval";

/// What a person approved: the exact arguments, and what the token minted for them binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    /// The token's nonce: the key.
    pub nonce: Nonce,
    /// The tool the approval is for.
    pub tool: String,
    /// The resolved target the person saw.
    pub target: String,
    /// The connection (agent session) the token was issued to.
    pub tenant: String,
    /// The hash of the approved plan.
    pub plan: PlanHash,
    /// The exact arguments the person approved, as the JSON value the desk will forward.
    pub arguments: serde_json::Value,
    /// When the person approved, in ms since the epoch.
    pub issued_at_ms: u64,
    /// When the token stops working, in ms since the epoch.
    pub expires_at_ms: u64,
    /// The gate class the approval was made under: [`GateClass::Token`] or [`GateClass::Once`]
    /// (an [`GateClass::Open`] tool needs no approval, and storing one is refused). Rows written
    /// before the class was recorded read back as [`GateClass::Once`].
    pub class: GateClass,
    /// The MAC binding this row to the click (see `countersign_core::binding`); `None` for rows
    /// written before it existed. The store keeps it; the desk checks it.
    pub mac: Option<[u8; 32]>,
}

/// An approval row as stored, before decoding (both stores read rows into this).
pub(crate) struct Row {
    pub(crate) tool: String,
    pub(crate) target: String,
    pub(crate) tenant: String,
    pub(crate) plan: String,
    pub(crate) arguments: String,
    pub(crate) issued_at: i64,
    pub(crate) expires_at: i64,
    pub(crate) class: String,
    pub(crate) mac: Option<Vec<u8>>,
}

/// The columns of `approval` as both stores write them, after refusing an approval of an open
/// tool and times out of range.
pub(crate) struct Columns {
    pub(crate) class: &'static str,
    pub(crate) issued_at: i64,
    pub(crate) expires_at: i64,
    pub(crate) arguments: String,
}

impl Columns {
    pub(crate) fn of(approval: &Approval) -> Result<Self, StoreError> {
        if !approval.class.is_gated() {
            return Err(StoreError::UngatedApproval(approval.nonce));
        }
        Ok(Columns {
            class: approval.class.code(),
            issued_at: ms_to_sql(approval.issued_at_ms)?,
            expires_at: ms_to_sql(approval.expires_at_ms)?,
            arguments: approval.arguments.to_string(),
        })
    }
}

impl Row {
    /// The approval this row under `nonce` holds; a row that does not decode is
    /// [`StoreError::InvalidRow`].
    pub(crate) fn decode(self, nonce: &Nonce) -> Result<Approval, StoreError> {
        let Row {
            tool,
            target,
            tenant,
            plan,
            arguments,
            issued_at,
            expires_at,
            class,
            mac,
        } = self;
        let invalid = |reason: String| StoreError::InvalidRow {
            table: TABLE,
            reason,
        };
        Ok(Approval {
            nonce: *nonce,
            tool,
            target,
            tenant,
            plan: PlanHash::from_hex(&plan)
                .ok_or_else(|| invalid(format!("plan hash {plan:?} is not 64 hex digits")))?,
            arguments: serde_json::from_str(&arguments)
                .map_err(|err| invalid(format!("arguments are not JSON: {err}")))?,
            issued_at_ms: ms_from_sql(issued_at, TABLE)?,
            expires_at_ms: ms_from_sql(expires_at, TABLE)?,
            class: GateClass::from_code(&class)
                .filter(|c| c.is_gated())
                .ok_or_else(|| invalid(format!("gate class {class:?} is not token or once")))?,
            mac: mac
                .map(|m| <[u8; 32]>::try_from(m.as_slice()))
                .transpose()
                .map_err(|_| invalid("mac is not 32 bytes".to_owned()))?,
        })
    }
}

impl Store {
    /// Stores `approval` durably. A second approval under the same nonce is refused with
    /// [`StoreError::ApprovalExists`]: what a person approved is never replaced. An approval of
    /// class [`GateClass::Open`] is refused with [`StoreError::UngatedApproval`].
    pub fn put_approval(&mut self, approval: &Approval) -> Result<(), StoreError> {
        let Columns {
            class,
            issued_at,
            expires_at,
            arguments,
        } = Columns::of(approval)?;
        self.with_connection(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let inserted = tx.execute(
                "INSERT INTO approval
                     (nonce, tool, target, tenant, plan, arguments, issued_at_ms, expires_at_ms,
                      class, mac)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                rusqlite::params![
                    &approval.nonce.as_bytes()[..],
                    approval.tool,
                    approval.target,
                    approval.tenant,
                    approval.plan.to_hex(),
                    arguments,
                    issued_at,
                    expires_at,
                    class,
                    approval.mac.as_ref().map(|m| &m[..]),
                ],
            );
            match inserted {
                Ok(_) => {}
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.extended_code == ffi::SQLITE_CONSTRAINT_PRIMARYKEY =>
                {
                    return Err(StoreError::ApprovalExists(approval.nonce));
                }
                Err(err) => return Err(err.into()),
            }
            tx.commit()?;
            Ok(())
        })
    }

    /// Takes back the approval stored under `nonce` before its token expires (the grant that
    /// approved it without a click was revoked): a confirm of that token then finds nothing to
    /// execute. Answers whether one was there. Nothing else ever removes an approval early.
    pub fn withdraw_approval(&mut self, nonce: &Nonce) -> Result<bool, StoreError> {
        self.with_connection(|conn| {
            Ok(conn.execute(
                "DELETE FROM approval WHERE nonce = ?1",
                [&nonce.as_bytes()[..]],
            )? == 1)
        })
    }

    /// The approval stored under `nonce`, or `None` if there is none (never stored, or pruned
    /// after it expired).
    pub fn approval(&mut self, nonce: &Nonce) -> Result<Option<Approval>, StoreError> {
        let row = self.with_connection(|conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT tool, target, tenant, plan, arguments, issued_at_ms, expires_at_ms,
                            class, mac
                     FROM approval WHERE nonce = ?1",
                )?
                .query_row([&nonce.as_bytes()[..]], |row| {
                    Ok(Row {
                        tool: row.get(0)?,
                        target: row.get(1)?,
                        tenant: row.get(2)?,
                        plan: row.get(3)?,
                        arguments: row.get(4)?,
                        issued_at: row.get(5)?,
                        expires_at: row.get(6)?,
                        class: row.get(7)?,
                        mac: row.get(8)?,
                    })
                })
                .optional()?)
        })?;
        row.map(|row| row.decode(nonce)).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreOptions;
    use crate::test_support::{approval, nonce, raw, temp_store};

    #[test]
    fn approval_survives_reopen() {
        let (dir, mut store) = temp_store();
        let approved = approval(1, 700_000);
        store.put_approval(&approved).unwrap();
        drop(store);
        let mut store =
            Store::open(dir.path().join("countersign.db"), StoreOptions::default()).unwrap();
        assert_eq!(store.approval(&nonce(1)).unwrap(), Some(approved));
    }

    #[test]
    fn approval_class_survives_reopen() {
        let (dir, mut store) = temp_store();
        let once = approval(1, 700_000);
        let mut token = approval(2, 700_000);
        token.class = GateClass::Token;
        store.put_approval(&once).unwrap();
        store.put_approval(&token).unwrap();
        drop(store);
        let mut store =
            Store::open(dir.path().join("countersign.db"), StoreOptions::default()).unwrap();
        assert_eq!(
            store.approval(&nonce(1)).unwrap().unwrap().class,
            GateClass::Once
        );
        assert_eq!(
            store.approval(&nonce(2)).unwrap().unwrap().class,
            GateClass::Token
        );
    }

    #[test]
    fn unknown_class_read_back_is_an_invalid_row() {
        let (_dir, mut store) = temp_store();
        store.put_approval(&approval(1, 10)).unwrap();
        let conn = raw(&store);
        // The column's CHECK already refuses anything else; only a hand edit gets past it.
        assert!(
            conn.execute("UPDATE approval SET class = 'open'", [])
                .is_err()
        );
        conn.pragma_update(None, "ignore_check_constraints", true)
            .unwrap();
        for bad in ["open", "sometimes", "ONCE"] {
            conn.execute("UPDATE approval SET class = ?1", [bad])
                .unwrap();
            match store.approval(&nonce(1)) {
                Err(StoreError::InvalidRow {
                    table: "approval",
                    reason,
                }) => assert!(reason.contains(bad), "{reason}"),
                other => panic!("expected InvalidRow for {bad:?}, got {other:?}"),
            }
        }
        assert!(store.is_connected());
    }

    #[test]
    fn damaged_approval_row_is_an_invalid_row() {
        let (_dir, mut store) = temp_store();
        store.put_approval(&approval(1, 10)).unwrap();
        raw(&store)
            .execute("UPDATE approval SET arguments = '{not json'", [])
            .unwrap();
        assert!(matches!(
            store.approval(&nonce(1)),
            Err(StoreError::InvalidRow {
                table: "approval",
                ..
            })
        ));
        assert!(store.is_connected());
    }
}
