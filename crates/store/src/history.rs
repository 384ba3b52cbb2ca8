//! The history of confirmation events: the audit trail the desk shows and a person can search.
//!
//! Every event (issued, accepted, refused with its code, replay, denied, executed with its
//! outcome) is written here and sent to `tracing` by the same call, so the trail and the logs
//! cannot drift apart. It is emitted even when writing fails: refusals and replays are never
//! dropped. What is stored is exactly a [`ConfirmEvent`], which has no token field; the table has
//! no token column either, and a test keeps it that way.

use countersign_core::chain::{Break, ChainHash, ChainKey, Head, Intact, Link, SignedHead, Walk};
use countersign_core::telemetry::{ConfirmEvent, EventKind, Rejection};
use countersign_core::{Nonce, PlanHash, Refusal};
use rusqlite::{OptionalExtension, TransactionBehavior};

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

/// Why a stored row's kind columns name no event kind.
#[derive(Debug, thiserror::Error)]
enum BadKind {
    /// A refused event names a refusal code this build does not know.
    #[error("unknown refusal code {0:?}")]
    Refusal(String),
    /// A rejected event names a rejection code this build does not know.
    #[error("unknown rejection code {0:?}")]
    Rejection(String),
    /// The kind, refusal and outcome columns do not go together.
    #[error("kind {code:?} with refusal {refusal:?} and ok {ok:?}")]
    Mismatched {
        /// The kind column.
        code: String,
        /// The refusal column.
        refusal: Option<String>,
        /// The outcome column.
        ok: Option<bool>,
    },
}

fn kind_from_columns(
    code: &str,
    refusal: Option<&str>,
    ok: Option<bool>,
) -> Result<EventKind, BadKind> {
    let kind = match (code, refusal, ok) {
        ("issued", None, None) => EventKind::Issued,
        ("accepted", None, None) => EventKind::Accepted,
        ("replay", None, None) => EventKind::Replay,
        ("denied", None, None) => EventKind::Denied,
        ("changed", None, None) => EventKind::Changed,
        ("opened", None, None) => EventKind::Opened,
        ("outcome_unknown", None, None) => EventKind::OutcomeUnknown,
        ("refused", Some(refusal), None) => EventKind::Refused {
            refusal: Refusal::from_code(refusal)
                .ok_or_else(|| BadKind::Refusal(refusal.to_owned()))?,
        },
        ("executed", None, Some(ok)) => EventKind::Executed { ok },
        ("rejected", Some(reason), None) => EventKind::Rejected {
            reason: Rejection::from_code(reason)
                .ok_or_else(|| BadKind::Rejection(reason.to_owned()))?,
        },
        _ => {
            return Err(BadKind::Mismatched {
                code: code.to_owned(),
                refusal: refusal.map(str::to_owned),
                ok,
            });
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
#[derive(Debug)]
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
    /// The link these columns make as event `seq` after `prev`.
    pub(crate) fn link(&self, seq: u64, prev: ChainHash) -> Link<'_> {
        Link {
            seq,
            // Stored from a u64, so never negative.
            at_ms: u64::try_from(self.at_ms).unwrap_or_default(),
            kind: self.kind,
            refusal: self.refusal,
            ok: self.ok,
            tool: &self.tool,
            target: self.target.as_deref(),
            tenant: self.tenant,
            nonce: self.nonce.as_deref(),
            plan: self.plan.as_deref(),
            note: self.note.as_deref(),
            prev,
        }
    }

    pub(crate) fn of(event: &'a ConfirmEvent) -> Result<Self, StoreError> {
        let (kind, refusal, ok) = event.kind.columns();
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
    /// The link this row makes as event `seq` after `prev`, exactly as stored (a row whose time
    /// is negative was edited, and hashes as 0, which its stored hash will not match).
    pub(crate) fn link(&self, seq: u64, prev: ChainHash) -> Link<'_> {
        Link {
            seq,
            at_ms: u64::try_from(self.at_ms).unwrap_or_default(),
            kind: &self.kind,
            refusal: self.refusal.as_deref(),
            ok: self.ok,
            tool: &self.tool,
            target: self.target.as_deref(),
            tenant: &self.tenant,
            nonce: self.nonce.as_deref(),
            plan: self.plan.as_deref(),
            note: self.note.as_deref(),
            prev,
        }
    }

    pub(crate) fn into_event(self) -> Result<ConfirmEvent, StoreError> {
        let invalid = |reason: String| StoreError::InvalidRow {
            table: TABLE,
            reason,
        };
        Ok(ConfirmEvent {
            at_ms: ms_from_sql(self.at_ms, TABLE)?,
            kind: kind_from_columns(&self.kind, self.refusal.as_deref(), self.ok)
                .map_err(|bad| invalid(bad.to_string()))?,
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
        let key = self.options.chain_key.clone();
        self.with_connection(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let (last, prev) = chain_tip(&tx)?;
            let seq = last + 1;
            let hash = c.link(seq, prev).hash();
            tx.prepare_cached(
                "INSERT INTO history
                     (at_ms, kind, refusal, ok, tool, target, tenant, nonce, plan, note,
                      seq, prev, hash)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            )?
            .execute(rusqlite::params![
                c.at_ms,
                c.kind,
                c.refusal,
                c.ok,
                c.tool,
                c.target,
                c.tenant,
                c.nonce,
                c.plan,
                c.note,
                seq_to_sql(seq)?,
                prev.to_hex(),
                hash.to_hex(),
            ])?;
            if let Some(key) = &key {
                let head = Head {
                    seq,
                    hash,
                    at_ms: event.at_ms,
                };
                put_head(&tx, "head", &key.sign(head))?;
            }
            tx.commit()?;
            Ok(())
        })
    }

    /// Checks the history's chain: see [`HistoryReader::verify`](crate::HistoryReader::verify).
    pub fn verify_history(&mut self, walk: Walk) -> Result<Result<Intact, Break>, StoreError> {
        self.with_connection(|conn| verify(conn, walk))
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
            |row| row_at(row, 0),
        )?
        .collect::<Result<Vec<Row>, _>>()?;
    rows.into_iter().map(Row::into_event).collect()
}

fn seq_to_sql(seq: u64) -> Result<i64, StoreError> {
    i64::try_from(seq).map_err(|_| StoreError::InvalidRow {
        table: TABLE,
        reason: format!("chain number {seq} beyond the store's range"),
    })
}

fn chain_hash(hex: &str, what: &str) -> Result<ChainHash, StoreError> {
    ChainHash::from_hex(hex).ok_or_else(|| StoreError::InvalidRow {
        table: TABLE,
        reason: format!("{what} {hex:?} is not a chain hash"),
    })
}

/// The newest event's number and hash, to chain the next one to ((0, genesis) when there is
/// none). Events recorded before the chain existed are chained first, in the order they were
/// recorded, so the chain covers every event the file holds from here on.
fn chain_tip(tx: &rusqlite::Transaction<'_>) -> Result<(u64, ChainHash), StoreError> {
    let newest: Option<(Option<i64>, Option<String>)> = tx
        .prepare_cached("SELECT seq, hash FROM history ORDER BY id DESC LIMIT 1")?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    match newest {
        None => Ok((0, ChainHash::GENESIS)),
        Some((Some(seq), Some(hash))) => Ok((
            u64::try_from(seq).unwrap_or_default(),
            chain_hash(&hash, "the newest event's hash")?,
        )),
        Some(_) => chain_unchained(tx),
    }
}

/// How many unchained rows are read at a time while chaining them.
const CHAIN_BATCH: i64 = 1_000;

/// Chains every row that has no place in the chain yet (rows recorded before the chain existed),
/// oldest first, after the newest chained one; answers the new tip.
fn chain_unchained(tx: &rusqlite::Transaction<'_>) -> Result<(u64, ChainHash), StoreError> {
    let chained: Option<(i64, String)> = tx
        .query_row(
            "SELECT seq, hash FROM history WHERE seq IS NOT NULL ORDER BY id DESC LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let (mut last, mut prev) = match chained {
        Some((seq, hash)) => (
            u64::try_from(seq).unwrap_or_default(),
            chain_hash(&hash, "a chained event's hash")?,
        ),
        None => (0, ChainHash::GENESIS),
    };
    let mut after_id = i64::MIN;
    loop {
        let batch: Vec<(i64, Row)> = tx
            .prepare_cached(
                "SELECT id, at_ms, kind, refusal, ok, tool, target, tenant, nonce, plan, note
                 FROM history WHERE seq IS NULL AND id > ?1 ORDER BY id LIMIT ?2",
            )?
            .query_map(rusqlite::params![after_id, CHAIN_BATCH], |r| {
                Ok((r.get(0)?, row_at(r, 1)?))
            })?
            .collect::<Result<_, _>>()?;
        let Some((id, _)) = batch.last() else {
            break;
        };
        after_id = *id;
        let mut update =
            tx.prepare_cached("UPDATE history SET seq = ?1, prev = ?2, hash = ?3 WHERE id = ?4")?;
        for (id, row) in &batch {
            let seq = last + 1;
            let hash = row.link(seq, prev).hash();
            update.execute(rusqlite::params![
                seq_to_sql(seq)?,
                prev.to_hex(),
                hash.to_hex(),
                id
            ])?;
            (last, prev) = (seq, hash);
        }
    }
    Ok((last, prev))
}

/// Keeps `head` as the chain's `role` (`head` or `start`), replacing the one before.
fn put_head(
    tx: &rusqlite::Transaction<'_>,
    role: &str,
    head: &SignedHead,
) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO history_head (role, seq, hash, at_ms, public_key, signature)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (role) DO UPDATE SET seq = excluded.seq, hash = excluded.hash,
             at_ms = excluded.at_ms, public_key = excluded.public_key,
             signature = excluded.signature",
    )?
    .execute(rusqlite::params![
        role,
        seq_to_sql(head.head.seq)?,
        head.head.hash.to_hex(),
        crate::error::ms_to_sql(head.head.at_ms)?,
        &head.key[..],
        &head.signature[..],
    ])?;
    Ok(())
}

/// After old events were pruned: signs where the chain now starts (the last pruned event's
/// number and hash, which the oldest kept event names before it), so a check can tell a prune
/// from a deletion.
pub(crate) fn mark_start(
    tx: &rusqlite::Transaction<'_>,
    key: &ChainKey,
    now_ms: u64,
) -> Result<(), StoreError> {
    let oldest: Option<(Option<i64>, Option<String>)> = tx
        .query_row(
            "SELECT seq, prev FROM history ORDER BY id LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    if let Some((Some(seq), Some(prev))) = oldest
        && seq > 1
    {
        let head = Head {
            seq: u64::try_from(seq - 1).unwrap_or_default(),
            hash: chain_hash(&prev, "the oldest event's link")?,
            at_ms: now_ms,
        };
        put_head(tx, "start", &key.sign(head))?;
    }
    Ok(())
}

/// The chain's place of an event as stored: its number, the hash before it, its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chained {
    /// Its number in the chain.
    pub seq: u64,
    /// The hash of the event before it.
    pub prev: ChainHash,
    /// Its own hash.
    pub hash: ChainHash,
}

/// One event as it is recorded: the event, and its place in the chain (none for an event
/// recorded before the chain existed and not chained yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The event.
    pub event: ConfirmEvent,
    /// Its place in the chain.
    pub chained: Option<Chained>,
}

/// One row exactly as stored, for checking the chain: nothing is decoded, so an edit that makes a
/// row unreadable as an event is still found as an edit.
#[derive(Debug)]
pub struct StoredLink {
    row: Row,
    seq: Option<i64>,
    prev: Option<String>,
    hash: Option<String>,
}

impl StoredLink {
    /// The event this row holds, with its place in the chain (none while unchained).
    pub(crate) fn into_recorded(self) -> Result<Recorded, StoreError> {
        let chained = match (self.seq, &self.prev, &self.hash) {
            (Some(seq), Some(prev), Some(hash)) => Some(Chained {
                seq: u64::try_from(seq).map_err(|_| StoreError::InvalidRow {
                    table: TABLE,
                    reason: format!("chain number {seq}"),
                })?,
                prev: chain_hash(prev, "a link")?,
                hash: chain_hash(hash, "a hash")?,
            }),
            _ => None,
        };
        Ok(Recorded {
            event: self.row.into_event()?,
            chained,
        })
    }

    /// A row as read by a store, with its chain columns.
    #[cfg(feature = "postgres")]
    pub(crate) fn new(
        row: Row,
        seq: Option<i64>,
        prev: Option<String>,
        hash: Option<String>,
    ) -> Self {
        StoredLink {
            row,
            seq,
            prev,
            hash,
        }
    }

    /// The link this row is, and the hash stored with it; or why the row has no place in a chain
    /// (no number or hash, or values that are not one).
    pub fn link(&self) -> Result<(Link<'_>, ChainHash), countersign_core::chain::Break> {
        let unreadable = |reason: String| countersign_core::chain::Break::Unreadable {
            at: match self.seq {
                Some(seq) => format!("event #{seq}"),
                None => "an event with no number".to_owned(),
            },
            reason,
        };
        let seq = self
            .seq
            .and_then(|s| u64::try_from(s).ok())
            .ok_or_else(|| unreadable("it has no number in the chain".into()))?;
        let read = |text: &Option<String>, what: &str| {
            text.as_deref()
                .and_then(ChainHash::from_hex)
                .ok_or_else(|| unreadable(format!("its {what} is not a chain hash")))
        };
        let prev = read(&self.prev, "link to the one before")?;
        let hash = read(&self.hash, "hash")?;
        Ok((self.row.link(seq, prev), hash))
    }
}

/// The signed heads a file keeps: the newest (`head`) and, after a prune, where the chain starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Heads {
    /// The head: the newest event's hash, signed as it was recorded.
    pub head: Option<SignedHead>,
    /// Where a pruned chain starts: the last pruned event's hash, signed at the prune.
    pub start: Option<SignedHead>,
}

/// A signed head from its stored columns (both stores keep the same ones), or none when they
/// are not one.
pub(crate) fn head_of(
    seq: i64,
    hash: String,
    at_ms: i64,
    key: Vec<u8>,
    signature: Vec<u8>,
) -> Option<SignedHead> {
    Some(SignedHead {
        head: Head {
            seq: u64::try_from(seq).ok()?,
            hash: ChainHash::from_hex(&hash)?,
            at_ms: u64::try_from(at_ms).ok()?,
        },
        key: key.try_into().ok()?,
        signature: signature.try_into().ok()?,
    })
}

/// The heads on `conn`; a stored head that is not one (a damaged row) reads as none, which the
/// check then reports.
pub(crate) fn heads(conn: &rusqlite::Connection) -> Result<Heads, StoreError> {
    let mut heads = Heads::default();
    let mut statement = conn
        .prepare_cached("SELECT role, seq, hash, at_ms, public_key, signature FROM history_head")?;
    let mut rows = statement.query([])?;
    while let Some(r) = rows.next()? {
        let role: String = r.get(0)?;
        let read = || {
            head_of(
                r.get(1).ok()?,
                r.get(2).ok()?,
                r.get(3).ok()?,
                r.get(4).ok()?,
                r.get(5).ok()?,
            )
        };
        match role.as_str() {
            "head" => heads.head = read(),
            "start" => heads.start = read(),
            _ => {}
        }
    }
    Ok(heads)
}

/// Checks the chain on `conn` as one snapshot: see
/// [`HistoryReader::verify`](crate::HistoryReader::verify).
pub(crate) fn verify(
    conn: &rusqlite::Connection,
    mut walk: Walk,
) -> Result<Result<Intact, Break>, StoreError> {
    let snapshot = conn.unchecked_transaction()?;
    let mut broken = None;
    each_link(&snapshot, |stored: StoredLink| {
        if broken.is_none()
            && let Err(b) = stored
                .link()
                .and_then(|(link, hash)| walk.step(&link, hash))
        {
            broken = Some(b);
        }
        Ok::<_, StoreError>(())
    })?;
    let heads = heads(&snapshot)?;
    snapshot.commit()?;
    if let Some(b) = broken {
        return Ok(Err(b));
    }
    Ok(walk.finish(heads.head, heads.start, false))
}

/// Hands `each` every row on `conn` in the order it was recorded, exactly as stored.
pub(crate) fn each_link<E: From<StoreError>>(
    conn: &rusqlite::Connection,
    mut each: impl FnMut(StoredLink) -> Result<(), E>,
) -> Result<u64, E> {
    let mut statement = conn
        .prepare_cached(
            "SELECT at_ms, kind, refusal, ok, tool, target, tenant, nonce, plan, note,
                    seq, prev, hash
             FROM history ORDER BY id",
        )
        .map_err(StoreError::from)?;
    let mut rows = statement.query([]).map_err(StoreError::from)?;
    let mut handed = 0;
    while let Some(r) = rows.next().map_err(StoreError::from)? {
        let link = stored_link_at(r).map_err(StoreError::from)?;
        each(link)?;
        handed += 1;
    }
    Ok(handed)
}

/// At most `limit` chained events after chain number `after`, in chain order.
pub(crate) fn recorded_after(
    conn: &rusqlite::Connection,
    after: i64,
    limit: u32,
) -> Result<Vec<Recorded>, StoreError> {
    let mut statement = conn.prepare_cached(
        "SELECT at_ms, kind, refusal, ok, tool, target, tenant, nonce, plan, note, seq, prev, hash
         FROM history WHERE seq > ?1 ORDER BY seq LIMIT ?2",
    )?;
    let stored = statement
        .query_map(rusqlite::params![after, limit], stored_link_at)?
        .collect::<Result<Vec<_>, _>>()?;
    stored.into_iter().map(StoredLink::into_recorded).collect()
}

/// A row of the ten event columns and then `seq`, `prev`, `hash`, exactly as stored.
fn stored_link_at(r: &rusqlite::Row<'_>) -> rusqlite::Result<StoredLink> {
    Ok(StoredLink {
        row: row_at(r, 0)?,
        seq: r.get(10)?,
        prev: r.get(11)?,
        hash: r.get(12)?,
    })
}

/// The ten event columns of `r`, from column `first` on.
fn row_at(r: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<Row> {
    Ok(Row {
        at_ms: r.get(first)?,
        kind: r.get(first + 1)?,
        refusal: r.get(first + 2)?,
        ok: r.get(first + 3)?,
        tool: r.get(first + 4)?,
        target: r.get(first + 5)?,
        tenant: r.get(first + 6)?,
        nonce: r.get(first + 7)?,
        plan: r.get(first + 8)?,
        note: r.get(first + 9)?,
    })
}

/// Hands `each` every event on `conn` recorded at or after `since` and before `until` (ms since
/// the epoch; `None`: unbounded), oldest first in the order they were recorded, one row at a time
/// as SQLite reads it: however long the history, it is never held in memory. Returns how many
/// were handed over; stops at the first error, the store's or `each`'s.
pub(crate) fn each_between<E: From<StoreError>>(
    conn: &rusqlite::Connection,
    chain: bool,
    since: Option<u64>,
    until: Option<u64>,
    mut each: impl FnMut(Recorded) -> Result<(), E>,
) -> Result<u64, E> {
    let since = since.map(ms_to_sql).transpose()?;
    let until = until.map(ms_to_sql).transpose()?;
    // A file from before the chain has no chain columns: read them as none.
    let sql = if chain {
        "SELECT at_ms, kind, refusal, ok, tool, target, tenant, nonce, plan, note, seq, prev, hash
         FROM history
         WHERE (?1 IS NULL OR at_ms >= ?1) AND (?2 IS NULL OR at_ms < ?2)
         ORDER BY id"
    } else {
        "SELECT at_ms, kind, refusal, ok, tool, target, tenant, nonce, plan, note,
                NULL, NULL, NULL
         FROM history
         WHERE (?1 IS NULL OR at_ms >= ?1) AND (?2 IS NULL OR at_ms < ?2)
         ORDER BY id"
    };
    let mut statement = conn.prepare_cached(sql).map_err(StoreError::from)?;
    let mut rows = statement
        .query(rusqlite::params![since, until])
        .map_err(StoreError::from)?;
    let mut handed = 0;
    while let Some(r) = rows.next().map_err(StoreError::from)? {
        let stored = stored_link_at(r).map_err(StoreError::from)?;
        each(stored.into_recorded()?)?;
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
                countersign_core::sync::lock(&self.0)
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
            *countersign_core::sync::lock(&capture.0),
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
            countersign_core::sync::lock(&capture.0)
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
