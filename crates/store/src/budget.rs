//! Budgets of the rules over arguments: how much of a window's allowance calls that ran without
//! a click have taken, per rule, tenant, server and tool.
//!
//! A take is one statement (an insert that, on the window's existing row, adds only while the
//! sum stays within the limit), so two replicas taking the last unit at once cannot both get
//! it: one statement commits the row, the other finds it full. The same text runs on SQLite and
//! PostgreSQL (and keeps to CockroachDB's subset: `ON CONFLICT … DO UPDATE … WHERE`, `RETURNING`).

use crate::error::ms_to_sql;
use crate::{Store, StoreError};

const TABLE: &str = "rule_budget";

/// The statements of budgets, in either dialect.
pub(crate) struct Statements {
    pub(crate) take: String,
    pub(crate) prune: String,
}

/// The statements with parameters spelled `{p}1`, `{p}2`… (`$` or `?`).
pub(crate) fn statements(p: char) -> Statements {
    Statements {
        take: format!(
            "INSERT INTO {TABLE} (budget, window_start_ms, used) VALUES ({p}1, {p}2, {p}3)
             ON CONFLICT (budget, window_start_ms)
             DO UPDATE SET used = {TABLE}.used + {p}3 WHERE {TABLE}.used + {p}3 <= {p}4
             RETURNING used"
        ),
        prune: format!("DELETE FROM {TABLE} WHERE window_start_ms < {p}1"),
    }
}

/// The arguments of a take, checked: `None` when `amount` alone is more than `limit` (then no
/// window could hold it, and nothing is written).
pub(crate) fn checked(
    window_start_ms: u64,
    amount: u64,
    limit: u64,
) -> Result<Option<(i64, i64, i64)>, StoreError> {
    if amount > limit {
        return Ok(None);
    }
    // Within i64 as times are: a limit past it is one no window holds more than.
    let limit = limit.min(i64::MAX as u64) as i64;
    let amount = (amount as i64).min(limit);
    Ok(Some((ms_to_sql(window_start_ms)?, amount, limit)))
}

impl Store {
    /// Takes `amount` of budget `key`'s window starting at `window_start_ms`, which holds
    /// `limit`: `true` when it fit (and is now taken), `false` when the window has no room.
    pub fn take_budget(
        &mut self,
        key: &str,
        window_start_ms: u64,
        amount: u64,
        limit: u64,
    ) -> Result<bool, StoreError> {
        let Some((start, amount, limit)) = checked(window_start_ms, amount, limit)? else {
            return Ok(false);
        };
        let sql = statements('?').take;
        self.with_connection(|conn| {
            let mut statement = conn.prepare_cached(&sql)?;
            let mut rows = statement.query(rusqlite::params![key, start, amount, limit])?;
            Ok(rows.next()?.is_some())
        })
    }

    /// Forgets the windows that started before `before_ms`.
    pub fn prune_budgets(&mut self, before_ms: u64) -> Result<(), StoreError> {
        let before = ms_to_sql(before_ms)?;
        let sql = statements('?').prune;
        self.with_connection(|conn| {
            conn.prepare_cached(&sql)?.execute([before])?;
            Ok(())
        })
    }
}
