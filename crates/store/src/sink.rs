//! How far each telemetry sink (the OpenTelemetry collector) has acknowledged the history: the
//! cursor that makes sending never lossy and never double.
//!
//! Events are not handed to an in-memory queue that a restart or a full buffer would lose: they
//! stay in history, and a sender reads those after the sink's cursor, sends them, and moves the
//! cursor only once the collector acknowledged them. A sender that dies between sending and
//! moving the cursor sends that batch again (each record carries its chain number, so a
//! collector can tell); nothing is ever skipped. One sender at a time per sink, by a lease (the
//! replicas of a team's server share the records). The prune keeps every event a sink still
//! waits for.

use rusqlite::{OptionalExtension, TransactionBehavior};

use crate::error::{ms_from_sql, ms_to_sql};
use crate::history::{Recorded, capped};
use crate::{Store, StoreError};

/// The OpenTelemetry collector's sink: the one sink an authority sends to.
pub const OTLP_SINK: &str = "otlp";

/// What a sink's cursor says: how far it got, and how it fares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportStatus {
    /// The newest chain number the sink acknowledged.
    pub cursor: u64,
    /// How many recorded events it has not acknowledged yet.
    pub waiting: u64,
    /// Since when sending fails (none while it works).
    pub failing_since_ms: Option<u64>,
    /// The last failure, as the sender said it.
    pub last_error: Option<String>,
}

/// The longest error text kept.
const MAX_ERROR_CHARS: usize = 300;

fn seq_sql(seq: u64) -> Result<i64, StoreError> {
    i64::try_from(seq).map_err(|_| StoreError::TimeOutOfRange(seq))
}

impl Store {
    /// Takes (or keeps) the right to send to `sink` until `now_ms + lease_ms`, for `holder`;
    /// creates the sink's cursor at the start of history when there is none. Answers the cursor
    /// when `holder` holds the lease, `None` while another holder's lease runs.
    pub fn export_claim(
        &mut self,
        sink: &str,
        holder: &str,
        now_ms: u64,
        lease_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let now = ms_to_sql(now_ms)?;
        let until = ms_to_sql(now_ms.saturating_add(lease_ms))?;
        self.with_connection(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "INSERT INTO export_cursor (sink, seq) VALUES (?1, 0) ON CONFLICT (sink) DO NOTHING",
                [sink],
            )?;
            let claimed = tx.execute(
                "UPDATE export_cursor SET holder = ?2, lease_until_ms = ?3
                 WHERE sink = ?1 AND (holder IS NULL OR holder = ?2 OR lease_until_ms < ?4)",
                rusqlite::params![sink, holder, until, now],
            )?;
            let cursor: i64 = tx.query_row(
                "SELECT seq FROM export_cursor WHERE sink = ?1",
                [sink],
                |r| r.get(0),
            )?;
            tx.commit()?;
            Ok((claimed == 1).then(|| u64::try_from(cursor).unwrap_or_default()))
        })
    }

    /// At most `limit` events after chain number `seq`, in chain order, with their places.
    pub fn recorded_after(&mut self, seq: u64, limit: u32) -> Result<Vec<Recorded>, StoreError> {
        let after = seq_sql(seq)?;
        self.with_connection(|conn| crate::history::recorded_after(conn, after, limit))
    }

    /// Moves `sink`'s cursor from `from` to `to` once the sink acknowledged the events between,
    /// if `holder` still holds the lease and nobody moved it meanwhile; clears the failure.
    /// Answers whether it moved.
    pub fn export_advance(
        &mut self,
        sink: &str,
        holder: &str,
        from: u64,
        to: u64,
    ) -> Result<bool, StoreError> {
        let (from, to) = (seq_sql(from)?, seq_sql(to)?);
        self.with_connection(|conn| {
            Ok(conn.execute(
                "UPDATE export_cursor SET seq = ?4, failing_since_ms = NULL, last_error = NULL
                 WHERE sink = ?1 AND holder = ?2 AND seq = ?3",
                rusqlite::params![sink, holder, from, to],
            )? == 1)
        })
    }

    /// Notes that sending to `sink` failed at `now_ms` with `error` (the first failure's time is
    /// kept until a send succeeds).
    pub fn export_failed(
        &mut self,
        sink: &str,
        now_ms: u64,
        error: &str,
    ) -> Result<(), StoreError> {
        let now = ms_to_sql(now_ms)?;
        let error = capped_error(error);
        self.with_connection(|conn| {
            conn.execute(
                "UPDATE export_cursor
                 SET failing_since_ms = coalesce(failing_since_ms, ?2), last_error = ?3
                 WHERE sink = ?1",
                rusqlite::params![sink, now, error],
            )?;
            Ok(())
        })
    }

    /// `sink`'s cursor and how many events wait for it; `None` when it has none.
    pub fn export_status(&mut self, sink: &str) -> Result<Option<ExportStatus>, StoreError> {
        self.with_connection(|conn| status(conn, sink))
    }

    /// Forgets `sink` (no longer configured): its cursor no longer holds back the prune.
    pub fn export_forget(&mut self, sink: &str) -> Result<(), StoreError> {
        self.with_connection(|conn| {
            conn.execute("DELETE FROM export_cursor WHERE sink = ?1", [sink])?;
            Ok(())
        })
    }
}

/// An error as kept: capped, one line.
pub(crate) fn capped_error(error: &str) -> String {
    let line: String = error
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let cut = capped(&line);
    match cut.char_indices().nth(MAX_ERROR_CHARS) {
        None => cut.into_owned(),
        Some((end, _)) => format!("{}…", &cut[..end]),
    }
}

/// The status of `sink` on `conn` (also what the read-only reader answers).
pub(crate) fn status(
    conn: &rusqlite::Connection,
    sink: &str,
) -> Result<Option<ExportStatus>, StoreError> {
    let row: Option<(i64, Option<i64>, Option<String>)> = conn
        .query_row(
            "SELECT seq, failing_since_ms, last_error FROM export_cursor WHERE sink = ?1",
            [sink],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?;
    let Some((cursor, failing, error)) = row else {
        return Ok(None);
    };
    // Unchained rows (recorded before the chain, chained by the next event) wait too.
    let waiting: i64 = conn.query_row(
        "SELECT count(*) FROM history WHERE seq IS NULL OR seq > ?1",
        [cursor],
        |r| r.get(0),
    )?;
    Ok(Some(ExportStatus {
        cursor: u64::try_from(cursor).unwrap_or_default(),
        waiting: u64::try_from(waiting).unwrap_or_default(),
        failing_since_ms: failing
            .map(|ms| ms_from_sql(ms, "export_cursor"))
            .transpose()?,
        last_error: error,
    }))
}
