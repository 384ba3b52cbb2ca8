//! The history of confirmation events: the audit trail the desk shows and a person can search.
//!
//! Every event (issued, accepted, refused with its code, replay, denied, executed with its
//! outcome) is written here and sent to `tracing` by the same call, so the trail and the logs
//! cannot drift apart. It is emitted even when writing fails: refusals and replays are never
//! dropped. What is stored is exactly a [`ConfirmEvent`], which has no token field; the table has
//! no token column either, and a test keeps it that way.

use countersign_core::telemetry::{ConfirmEvent, EventKind, Rejection};
use countersign_core::{Nonce, PlanHash, Refusal};
use rusqlite::TransactionBehavior;

use crate::error::{ms_from_sql, ms_to_sql};
use crate::{Store, StoreError};

const TABLE: &str = "history";

/// Which events [`Store::history`] returns. The default returns every event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryFilter {
    /// Only events of this tool.
    pub tool: Option<String>,
    /// Only events of this connection (agent session).
    pub tenant: Option<String>,
    /// Only events of this kind, by its code ([`EventKind::code`]: `issued`, `accepted`,
    /// `refused`, `replay`, `denied`, `executed`).
    pub kind: Option<String>,
    /// Only events about this nonce (ties a replay to the issuance it replays).
    pub nonce: Option<Nonce>,
    /// At most this many events (the newest).
    pub limit: Option<u32>,
}

impl HistoryFilter {
    /// Every event.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only events of `tool`.
    pub fn tool(mut self, tool: impl Into<String>) -> Self {
        self.tool = Some(tool.into());
        self
    }

    /// Only events of `tenant`.
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// Only events whose kind has the code of `kind` (its payload, such as the refusal, is not
    /// compared).
    pub fn kind(mut self, kind: EventKind) -> Self {
        self.kind = Some(kind.code().to_owned());
        self
    }

    /// Only events about `nonce`.
    pub fn nonce(mut self, nonce: Nonce) -> Self {
        self.nonce = Some(nonce);
        self
    }

    /// At most `limit` events, the newest.
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = Some(limit);
        self
    }
}

/// The columns a kind is stored in: its code, a refusal code, an execution's outcome.
fn kind_columns(
    kind: EventKind,
) -> Result<(&'static str, Option<&'static str>, Option<bool>), StoreError> {
    Ok(match kind {
        EventKind::Issued
        | EventKind::Accepted
        | EventKind::Replay
        | EventKind::Denied
        | EventKind::OutcomeUnknown
        | EventKind::Changed => (kind.code(), None, None),
        EventKind::Refused { refusal } => (kind.code(), Some(refusal.code()), None),
        EventKind::Executed { ok } => (kind.code(), None, Some(ok)),
        EventKind::Rejected { reason } => (kind.code(), Some(reason.code()), None),
        other => return Err(StoreError::UnknownEventKind(other.code())),
    })
}

fn kind_from_columns(
    code: &str,
    refusal: Option<&str>,
    ok: Option<bool>,
) -> Result<EventKind, String> {
    let kind = match (code, refusal, ok) {
        ("issued", None, None) => EventKind::Issued,
        ("accepted", None, None) => EventKind::Accepted,
        ("replay", None, None) => EventKind::Replay,
        ("denied", None, None) => EventKind::Denied,
        ("changed", None, None) => EventKind::Changed,
        ("outcome_unknown", None, None) => EventKind::OutcomeUnknown,
        ("refused", Some(refusal), None) => EventKind::Refused {
            refusal: Refusal::from_code(refusal)
                .ok_or_else(|| format!("unknown refusal code {refusal:?}"))?,
        },
        ("executed", None, Some(ok)) => EventKind::Executed { ok },
        ("rejected", Some(reason), None) => EventKind::Rejected {
            reason: Rejection::from_code(reason)
                .ok_or_else(|| format!("unknown rejection code {reason:?}"))?,
        },
        _ => {
            return Err(format!(
                "kind {code:?} with refusal {refusal:?} and ok {ok:?}"
            ));
        }
    };
    Ok(kind)
}

/// The most characters of an agent's or upstream's text (a tool name, a target, a note) history
/// keeps: a row is read back 500 at a time, and an agent must not fill the disk through them.
pub const MAX_STORED_CHARS: usize = 1024;

/// `text` as stored: whole if short enough, else its first [`MAX_STORED_CHARS`] characters and a
/// marker saying how much was cut, so that a cut is never mistaken for the whole.
pub fn capped(text: &str) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(MAX_STORED_CHARS) {
        None => std::borrow::Cow::Borrowed(text),
        Some((end, _)) => {
            let rest = text[end..].chars().count();
            std::borrow::Cow::Owned(format!("{}… [cut: {rest} more characters]", &text[..end]))
        }
    }
}

/// One history row as stored, before decoding (both stores read rows into this).
pub(crate) struct Row {
    pub(crate) at_ms: i64,
    pub(crate) kind: String,
    pub(crate) refusal: Option<String>,
    pub(crate) ok: Option<bool>,
    pub(crate) tool: String,
    pub(crate) target: Option<String>,
    pub(crate) tenant: String,
    pub(crate) nonce: Option<String>,
    pub(crate) plan: Option<String>,
    pub(crate) note: Option<String>,
}

/// An event as its columns are written (both stores write these): times in range, the agent's
/// texts capped, the kind split into its code, refusal and outcome.
pub(crate) struct Columns<'a> {
    pub(crate) at_ms: i64,
    pub(crate) kind: &'static str,
    pub(crate) refusal: Option<&'static str>,
    pub(crate) ok: Option<bool>,
    pub(crate) tool: std::borrow::Cow<'a, str>,
    pub(crate) target: Option<std::borrow::Cow<'a, str>>,
    pub(crate) tenant: &'a str,
    pub(crate) nonce: Option<String>,
    pub(crate) plan: Option<String>,
    pub(crate) note: Option<std::borrow::Cow<'a, str>>,
}

impl<'a> Columns<'a> {
    pub(crate) fn of(event: &'a ConfirmEvent) -> Result<Self, StoreError> {
        let (kind, refusal, ok) = kind_columns(event.kind)?;
        Ok(Columns {
            at_ms: ms_to_sql(event.at_ms)?,
            kind,
            refusal,
            ok,
            tool: capped(&event.tool),
            target: event.target.as_deref().map(capped),
            tenant: &event.tenant,
            nonce: event.nonce.map(|n| n.to_hex()),
            plan: event.plan.map(|p| p.to_hex()),
            note: event.note.as_deref().map(capped),
        })
    }
}

/// What every store's `record` does once its write has been tried: emits `event` to `tracing`
/// (target `confirm`, once per record, whether or not `stored` succeeded) and answers `stored`.
pub(crate) fn emitted(
    event: &ConfirmEvent,
    stored: Result<(), StoreError>,
) -> Result<(), StoreError> {
    event.emit();
    stored
}

impl Row {
    pub(crate) fn into_event(self) -> Result<ConfirmEvent, StoreError> {
        let invalid = |reason: String| StoreError::InvalidRow {
            table: TABLE,
            reason,
        };
        Ok(ConfirmEvent {
            at_ms: ms_from_sql(self.at_ms, TABLE)?,
            kind: kind_from_columns(&self.kind, self.refusal.as_deref(), self.ok)
                .map_err(invalid)?,
            tool: self.tool,
            target: self.target,
            tenant: self.tenant,
            nonce: self
                .nonce
                .map(|hex| Nonce::from_hex(&hex).ok_or_else(|| invalid(format!("nonce {hex:?}"))))
                .transpose()?,
            plan: self
                .plan
                .map(|hex| {
                    PlanHash::from_hex(&hex).ok_or_else(|| invalid(format!("plan hash {hex:?}")))
                })
                .transpose()?,
            note: self.note,
        })
    }
}

impl Store {
    /// Records `event` in history and emits it to `tracing` (target `confirm`).
    ///
    /// The event is emitted whether or not the write succeeds, so a refusal or a replay reaches
    /// the logs even when the file does not; the write's failure is returned.
    pub fn record(&mut self, event: &ConfirmEvent) -> Result<(), StoreError> {
        let stored = self.insert_event(event);
        emitted(event, stored)
    }

    fn insert_event(&mut self, event: &ConfirmEvent) -> Result<(), StoreError> {
        let c = Columns::of(event)?;
        self.with_connection(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.prepare_cached(
                "INSERT INTO history
                     (at_ms, kind, refusal, ok, tool, target, tenant, nonce, plan, note)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )?
            .execute(rusqlite::params![
                c.at_ms, c.kind, c.refusal, c.ok, c.tool, c.target, c.tenant, c.nonce, c.plan,
                c.note,
            ])?;
            tx.commit()?;
            Ok(())
        })
    }

    /// Recorded events that pass `filter`, newest first (by time, then by order of recording).
    pub fn history(&mut self, filter: &HistoryFilter) -> Result<Vec<ConfirmEvent>, StoreError> {
        self.with_connection(|conn| select(conn, filter))
    }
}

/// The events on `conn` that pass `filter`, newest first: [`Store::history`], and the read-only
/// [`HistoryReader`](crate::HistoryReader).
pub(crate) fn select(
    conn: &rusqlite::Connection,
    filter: &HistoryFilter,
) -> Result<Vec<ConfirmEvent>, StoreError> {
    let nonce = filter.nonce.map(|n| n.to_hex());
    // SQLite reads a negative LIMIT as "no limit".
    let limit = filter.limit.map_or(-1, i64::from);
    let mut statement = conn.prepare_cached(
        "SELECT at_ms, kind, refusal, ok, tool, target, tenant, nonce, plan, note
         FROM history
         WHERE (?1 IS NULL OR tool = ?1)
           AND (?2 IS NULL OR tenant = ?2)
           AND (?3 IS NULL OR kind = ?3)
           AND (?4 IS NULL OR nonce = ?4)
         ORDER BY at_ms DESC, id DESC
         LIMIT ?5",
    )?;
    let rows = statement
        .query_map(
            rusqlite::params![filter.tool, filter.tenant, filter.kind, nonce, limit],
            |row| {
                Ok(Row {
                    at_ms: row.get(0)?,
                    kind: row.get(1)?,
                    refusal: row.get(2)?,
                    ok: row.get(3)?,
                    tool: row.get(4)?,
                    target: row.get(5)?,
                    tenant: row.get(6)?,
                    nonce: row.get(7)?,
                    plan: row.get(8)?,
                    note: row.get(9)?,
                })
            },
        )?
        .collect::<Result<Vec<Row>, _>>()?;
    rows.into_iter().map(Row::into_event).collect()
}

/// Hands `each` every event on `conn` recorded at or after `since` and before `until` (ms since
/// the epoch; `None`: unbounded), oldest first in the order they were recorded, one row at a time
/// as SQLite reads it: however long the history, it is never held in memory. Returns how many
/// were handed over; stops at the first error, the store's or `each`'s.
pub(crate) fn each_between<E: From<StoreError>>(
    conn: &rusqlite::Connection,
    since: Option<u64>,
    until: Option<u64>,
    mut each: impl FnMut(ConfirmEvent) -> Result<(), E>,
) -> Result<u64, E> {
    let since = since.map(ms_to_sql).transpose()?;
    let until = until.map(ms_to_sql).transpose()?;
    let mut statement = conn
        .prepare_cached(
            "SELECT at_ms, kind, refusal, ok, tool, target, tenant, nonce, plan, note
             FROM history
             WHERE (?1 IS NULL OR at_ms >= ?1) AND (?2 IS NULL OR at_ms < ?2)
             ORDER BY id",
        )
        .map_err(StoreError::from)?;
    let mut rows = statement
        .query(rusqlite::params![since, until])
        .map_err(StoreError::from)?;
    let mut handed = 0;
    while let Some(row) = rows.next().map_err(StoreError::from)? {
        let read = Row {
            at_ms: row.get(0).map_err(StoreError::from)?,
            kind: row.get(1).map_err(StoreError::from)?,
            refusal: row.get(2).map_err(StoreError::from)?,
            ok: row.get(3).map_err(StoreError::from)?,
            tool: row.get(4).map_err(StoreError::from)?,
            target: row.get(5).map_err(StoreError::from)?,
            tenant: row.get(6).map_err(StoreError::from)?,
            nonce: row.get(7).map_err(StoreError::from)?,
            plan: row.get(8).map_err(StoreError::from)?,
            note: row.get(9).map_err(StoreError::from)?,
        };
        each(read.into_event()?)?;
        handed += 1;
    }
    Ok(handed)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    use super::*;
    use crate::test_support::{event, raw, short_timeout, temp_store};

    #[test]
    fn history_never_stores_a_token() {
        let (_dir, store) = temp_store();
        let conn = raw(&store);
        let mut columns = Vec::new();
        for table in ["spent_nonce", "approval", "history"] {
            let mut statement = conn
                .prepare("SELECT name FROM pragma_table_info(?1)")
                .unwrap();
            let names = statement
                .query_map([table], |r| r.get::<_, String>(0))
                .unwrap();
            columns.extend(names.map(|n| (table, n.unwrap())));
        }
        assert!(columns.len() > 15, "{columns:?}");
        for (table, column) in &columns {
            let lower = column.to_lowercase();
            assert!(
                !lower.contains("token") && !lower.contains("secret"),
                "{table}.{column}"
            );
        }
        // And an event, serialized, has no token field to fill one from.
        let json = serde_json::to_value(event(1, EventKind::Issued)).unwrap();
        assert!(
            json.as_object()
                .unwrap()
                .keys()
                .all(|k| !k.contains("token")),
            "{json}"
        );
    }

    #[test]
    fn damaged_history_row_is_an_invalid_row() {
        let (_dir, mut store) = temp_store();
        store
            .record(&event(
                1,
                EventKind::Refused {
                    refusal: Refusal::Expired,
                },
            ))
            .unwrap();
        raw(&store)
            .execute("UPDATE history SET refusal = 'approved'", [])
            .unwrap();
        assert!(matches!(
            store.history(&HistoryFilter::all()),
            Err(StoreError::InvalidRow {
                table: "history",
                ..
            })
        ));
    }

    /// Collects `(target, event field)` of every tracing event.
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<(String, String)>>>);

    struct EventField(Option<String>);

    impl Visit for EventField {
        fn record_str(&mut self, field: &Field, value: &str) {
            if field.name() == "event" {
                self.0 = Some(value.to_owned());
            }
        }
        fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
    }

    impl Subscriber for Capture {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut field = EventField(None);
            event.record(&mut field);
            if let Some(code) = field.0 {
                self.0
                    .lock()
                    .unwrap()
                    .push((event.metadata().target().to_owned(), code));
            }
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    #[test]
    fn record_emits_the_event_to_tracing() {
        let (_dir, mut store) = temp_store();
        let capture = Capture::default();
        tracing::subscriber::with_default(capture.clone(), || {
            store.record(&event(1, EventKind::Replay)).unwrap();
        });
        assert_eq!(
            *capture.0.lock().unwrap(),
            [("confirm".to_owned(), "replay".to_owned())]
        );
    }

    #[test]
    fn record_emits_even_when_the_write_fails() {
        let dir = tempfile::tempdir().unwrap();
        let parent = dir.path().join("not-a-directory");
        std::fs::write(&parent, b"").unwrap();
        let mut store = Store::open_deferred(parent.join("countersign.db"), short_timeout());
        let capture = Capture::default();
        let stored = tracing::subscriber::with_default(capture.clone(), || {
            store.record(&event(
                1,
                EventKind::Refused {
                    refusal: Refusal::LedgerUnreachable,
                },
            ))
        });
        assert!(matches!(stored, Err(StoreError::Open { .. })));
        assert!(
            capture
                .0
                .lock()
                .unwrap()
                .contains(&("confirm".to_owned(), "refused".to_owned()))
        );
    }

    #[test]
    fn long_agent_text_is_stored_cut_with_a_visible_marker() {
        let (_dir, mut store) = temp_store();
        let mut long = event(1, EventKind::Denied);
        long.target = Some("é".repeat(5000));
        long.note = Some("n".repeat(MAX_STORED_CHARS + 1));
        long.tool = "t".repeat(MAX_STORED_CHARS);
        store.record(&long).unwrap();
        let back = store.history(&HistoryFilter::all()).unwrap().remove(0);
        let target = back.target.unwrap();
        assert!(target.starts_with(&"é".repeat(MAX_STORED_CHARS)));
        assert!(
            target.ends_with("… [cut: 3976 more characters]"),
            "{target}"
        );
        assert!(back.note.unwrap().ends_with("[cut: 1 more characters]"));
        assert_eq!(back.tool, long.tool, "exactly the cap is kept whole");
    }
}
