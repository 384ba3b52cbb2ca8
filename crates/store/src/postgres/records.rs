//! [`Records`] in PostgreSQL: the same tables and semantics as the desk's SQLite file, with the
//! same row decoding (shared with the SQLite code, so a damaged row is refused the same way).
//!
//! One-statement operations run on a pooled connection as they are (autocommit); operations that
//! read before they write (the grant cap, first-seen pins) and the prune run in one
//! `SERIALIZABLE` transaction each, retried on serialization failures, so that two replicas
//! racing cannot both pass a check the other invalidates.

use std::collections::HashMap;

use async_trait::async_trait;
use countersign_core::approver::Verdict;
use countersign_core::chain::{Break, ChainHash, ChainKey, Head, Intact, SignedHead, Walk};
use countersign_core::telemetry::ConfirmEvent;
use countersign_core::{Nonce, PlanHash, SpendError};
use tokio_postgres::error::SqlState;

use super::{Postgres, text};
use crate::budget;
use crate::error::ms_to_sql;
use crate::grant::{self, COLUMNS, MAX_READ};
use crate::pin::{self, MAX_DEFINITION_CHARS, cut};
use crate::{
    Accepted, Approval, DecisionRecord, ExportStatus, Grant, GrantEnd, HistoryFilter, Invite,
    MAX_DECISION_ROWS, MAX_HISTORY_ROWS, MAX_PINS, MAX_PINS_PER_SERVER, MAX_WAITING_ROWS, Member,
    Passkey, Pruned, Recorded, Records, Roster, SharedRow, StoreError, ToolPin, WaitingCall,
    accepted, approval, capped, decision, history, passkey, roster, waiting,
};

/// A pooled connection while a transaction may be open on it: dropped before it is settled (the
/// future appending was dropped, its caller gone), it is closed, never handed back to the pool
/// with the transaction and the tip's lock still held. Settled by taking it out (`.0.take()`)
/// to give it back.
struct Unsettled(Option<deadpool_postgres::Object>);

impl Unsettled {
    /// The connection, while it is held.
    fn conn(&self) -> Result<&deadpool_postgres::Object, StoreError> {
        self.0
            .as_ref()
            .ok_or_else(|| StoreError::PostgresUnavailable {
                target: "the history's writer".to_owned(),
                reason: "its connection was already given back".to_owned(),
            })
    }
}

impl Drop for Unsettled {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            drop(deadpool_postgres::Object::take(conn));
        }
    }
}

/// The most events appended to the chain in one transaction.
const MAX_BATCH: usize = 64;

/// The most events waiting for the writer; a caller past it waits to hand its event over.
const MAX_WAITING: usize = 1024;

/// Appends one replica's history events to the chain in batches.
///
/// Every event of every replica goes to one chain, in one order, under the lock of its tip row.
/// Appended one at a time, each event held that lock for its own round trips, and the replicas'
/// writers queued behind each other for it. Here one writer per replica takes every event
/// waiting when it is free and appends them in one transaction: one hold of the lock, one
/// signed head (of the last), the rows in one statement. The chain and what it proves are the
/// same; each caller still waits until its own event is committed (or failed), as before.
///
/// A batch that fails for its database (unreachable, or no answer in time) fails every event in
/// it with that error. One that fails for a statement (which could be one event's doing) is
/// appended again an event at a time, so each gets its own outcome and a bad event never costs
/// the others theirs.
///
/// An accepted works-once confirm hands over its nonce with its event
/// ([`Records::spend_recording`]): the batch spends it in the same transaction, and appends the
/// event only if the nonce was not spent before. So a confirm costs one commit, not two (its
/// own spend's, then its share of a batch's), and the spend keeps every rule of
/// [`Postgres::spend_nonce`]: one row per nonce, whichever replica wins; a batch whose outcome
/// is unknown leaves its nonces doubtful (burned before anything else on the next connection).
pub(crate) struct ChainWriter {
    queue: tokio::sync::mpsc::Sender<Appending>,
}

/// An event handed to the writer, the nonce to spend with it (if any), and where the writer says
/// how its append went.
struct Appending {
    event: ConfirmEvent,
    spend: Option<Spending>,
    told: Told,
}

/// A nonce spent in the transaction that appends its event.
#[derive(Clone, Copy)]
pub(crate) struct Spending {
    nonce: Nonce,
    /// The token's expiry; beyond BIGINT is "never", which keeps the row: the safe side.
    expires_at: i64,
}

impl Spending {
    pub(crate) fn new(nonce: Nonce, expires_at_ms: u64) -> Self {
        Spending {
            nonce,
            expires_at: i64::try_from(expires_at_ms).unwrap_or(i64::MAX),
        }
    }
}

/// Where the writer says how an event's append went: `Ok(true)` appended (and its nonce spent);
/// `Ok(false)` not appended, because its nonce was spent before (a replay).
type Told = tokio::sync::oneshot::Sender<Result<bool, StoreError>>;

/// What became of an event handed to the writer.
enum Handed {
    /// What the writer said.
    Told(Result<bool, StoreError>),
    /// Nothing: the writer stopped mid-batch (its runtime ended), and whether the batch
    /// committed is not known.
    Unheard,
}

impl ChainWriter {
    /// Starts the writer on the current Tokio runtime, appending with `writer` (a copy of the
    /// records without a writer of its own). It ends when the records it serves are dropped.
    pub(crate) fn start(writer: Postgres) -> Self {
        let (queue, mut waiting) = tokio::sync::mpsc::channel::<Appending>(MAX_WAITING);
        tokio::spawn(async move {
            while let Some(first) = waiting.recv().await {
                let mut batch = vec![first];
                while batch.len() < MAX_BATCH {
                    match waiting.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                writer.append_batch(batch).await;
            }
        });
        Self { queue }
    }

    /// Hands `event` (and the nonce to spend with it) to the writer and waits until it is
    /// appended, as [`Told`] says. `None`: the writer is not running, and nothing was handed to
    /// it.
    async fn append(&self, event: &ConfirmEvent, spend: Option<Spending>) -> Option<Handed> {
        let (told, outcome) = tokio::sync::oneshot::channel();
        let appending = Appending {
            event: event.clone(),
            spend,
            told,
        };
        self.queue.send(appending).await.ok()?;
        // Handed over and never answered: only a writer that stopped mid-batch does that.
        Some(outcome.await.map_or(Handed::Unheard, Handed::Told))
    }
}

impl Postgres {
    /// Appends `batch` and tells each event's caller how it went ([`ChainWriter`]).
    async fn append_batch(&self, batch: Vec<Appending>) {
        // Each caller emits its own event (`ConfirmEvent::emit`) once told, inside its own span;
        // a caller that stopped waiting has its event appended, and not emitted.
        let tell = |told: Told, stored: Result<bool, StoreError>| {
            let _ = told.send(stored);
        };
        // An event whose columns cannot be written (a time beyond the store's range) is refused
        // alone: it never reaches the batch.
        let mut events = Vec::with_capacity(batch.len());
        let mut spends = Vec::with_capacity(batch.len());
        let mut tells = Vec::with_capacity(batch.len());
        for Appending { event, spend, told } in batch {
            match history::Columns::of(&event) {
                Ok(_) => {
                    events.push(event);
                    spends.push(spend);
                    tells.push(told);
                }
                Err(err) => tell(told, Err(err)),
            }
        }
        if events.is_empty() {
            return;
        }
        match self.append(&events, &spends).await {
            Ok(appended) => {
                for (told, appended) in tells.into_iter().zip(appended) {
                    tell(told, Ok(appended));
                }
            }
            Err(err) if events.len() == 1 => {
                if let Some(told) = tells.pop() {
                    tell(told, Err(err));
                }
            }
            // The database's own failure, not the events': the same for each.
            Err(err) if self.outage_of(&err).is_some() => {
                for told in tells {
                    if let Some(outage) = self.outage_of(&err) {
                        tell(told, Err(outage));
                    }
                }
            }
            Err(_) => {
                for ((event, spend), told) in events.iter().zip(&spends).zip(tells) {
                    let stored = self
                        .append(std::slice::from_ref(event), std::slice::from_ref(spend))
                        .await
                        .map(|appended| appended.first().copied().unwrap_or(false));
                    tell(told, stored);
                }
            }
        }
    }

    /// Appends `events` to the chain, in this order, in one transaction under the tip's lock,
    /// and signs the head at the last of them. `spends[i]`, when given, is spent in the same
    /// transaction, and event `i` is appended only if it was not spent before. Answers, for each
    /// event, whether it was appended. An error whose outcome is unknown leaves every nonce of
    /// `spends` doubtful, as [`Postgres::spend_nonce`] leaves its one.
    pub(crate) async fn append(
        &self,
        events: &[ConfirmEvent],
        spends: &[Option<Spending>],
    ) -> Result<Vec<bool>, StoreError> {
        let mut rows = Vec::with_capacity(events.len());
        for event in events {
            let c = history::Columns::of(event)?;
            // What PostgreSQL keeps (no NUL in TEXT) is what the chain hashes.
            rows.push(ChainRow {
                at_ms: c.at_ms,
                kind: c.kind,
                refusal: c.refusal,
                ok: c.ok,
                tool: text(&c.tool).into_owned(),
                target: c.target.as_deref().map(|t| text(t).into_owned()),
                tenant: text(c.tenant).into_owned(),
                nonce: c.nonce,
                plan: c.plan,
                note: c.note.as_deref().map(|n| text(n).into_owned()),
                seq: 0,
                prev: String::new(),
                hash: String::new(),
            });
        }
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let spends: Vec<Option<Spending>> = (0..events.len())
            .map(|i| spends.get(i).copied().flatten())
            .collect();
        // A nonce held doubtful (a spend whose outcome was not known) is refused whatever the
        // database says, as `spend_nonce` refuses it: its event is not appended.
        let doubtful: Vec<bool> = {
            let doubts = self.doubts();
            spends
                .iter()
                .map(|s| s.is_some_and(|s| doubts.contains_key(&s.nonce)))
                .collect()
        };
        let mut pause = std::time::Duration::from_millis(5);
        let mut retries = 0;
        loop {
            let mut held = Unsettled(Some(self.connection().await?));
            let conn = held.conn()?;
            let attempt = tokio::time::timeout(
                self.statement_timeout,
                self.append_on(conn, &rows, &spends, &doubtful),
            )
            .await
            .unwrap_or(Err(StoreError::PostgresTimeout {
                after: self.statement_timeout,
            }));
            if let Err(err) = &attempt
                && err.outcome_unknown()
            {
                let mut doubts = self.doubts();
                for spend in spends.iter().flatten() {
                    doubts.insert(spend.nonce, spend.expires_at);
                    tracing::warn!(
                        nonce = %spend.nonce.to_hex(), error = %err,
                        "spend outcome unknown: refused, and the nonce is held as spent"
                    );
                }
            }
            // A transaction a failure left open ends here. A connection that cannot say so, or
            // whose state is unknown, never goes back to the pool (`held` closes it).
            let reusable = match &attempt {
                Ok(_) => true,
                Err(err) => {
                    !err.breaks_postgres_connection()
                        && tokio::time::timeout(
                            self.statement_timeout,
                            conn.batch_execute("ROLLBACK"),
                        )
                        .await
                        .is_ok_and(|rolled| rolled.is_ok())
                }
            };
            if reusable && let Some(conn) = held.0.take() {
                self.release(conn, attempt.as_ref().err());
            }
            drop(held);
            let err = match attempt {
                Ok(appended) => return Ok(appended),
                Err(err) => err,
            };
            // An engine that runs everything SERIALIZABLE (CockroachDB) answers 40001 where
            // PostgreSQL waits on the lock: retried, as every transaction here is.
            if err.sqlstate() == Some(&SqlState::T_R_SERIALIZATION_FAILURE)
                && retries < super::SERIALIZATION_RETRIES
            {
                retries += 1;
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_millis(100));
                continue;
            }
            return Err(err.after_retries(retries));
        }
    }

    /// One attempt of [`Postgres::append`] on `conn`, in two round trips: the transaction begun,
    /// the tip locked and the nonces spent together; then the rows, the tip and the signed head
    /// (one statement) and the commit together. The tip's lock is held from the first round
    /// trip's answer to the commit: while the rows are linked and the head signed, and for the
    /// second round trip. `spends` and `doubtful` as [`Postgres::append`] has them; answers
    /// which rows were appended.
    async fn append_on(
        &self,
        conn: &deadpool_postgres::ClientWrapper,
        rows: &[ChainRow],
        spends: &[Option<Spending>],
        doubtful: &[bool],
    ) -> Result<Vec<bool>, StoreError> {
        let pg = StoreError::Postgres;
        let write = match self.chain_key {
            Some(_) => CHAIN_WRITE_SIGNED,
            None => CHAIN_WRITE,
        };
        // The nonces this attempt spends: each once (a nonce given twice is spent by its first
        // event; the second is a replay), none held doubtful.
        let mut spending: Vec<&[u8]> = Vec::new();
        let mut expiring: Vec<i64> = Vec::new();
        for (spend, doubtful) in spends.iter().zip(doubtful) {
            if let Some(spend) = spend
                && !doubtful
                && !spending.contains(&&spend.nonce.as_bytes()[..])
            {
                spending.push(&spend.nonce.as_bytes()[..]);
                expiring.push(spend.expires_at);
            }
        }
        // Prepared once per pooled connection and kept: after the first time, no round trip.
        let (lock, write, spend) = tokio::try_join!(
            conn.prepare_cached(TIP_LOCK),
            conn.prepare_cached(write),
            conn.prepare_cached(SPEND_BATCH),
        )
        .map_err(pg)?;
        // Sent together (tokio-postgres pipelines what is polled at once), run in this order: a
        // statement's messages leave at its future's first poll, and `join!` polls in order. So
        // the lock, the spend and the write must stay prepared statements: one given as text
        // would be prepared first, and the COMMIT below could leave before the write. The spend
        // comes after the lock, so a replica's spends wait for the tip as its events do.
        let spent_now = async {
            if spending.is_empty() {
                return Ok(Vec::new());
            }
            conn.query(&spend, &[&spending, &expiring]).await
        };
        let (begun, tip, spent_now) = tokio::join!(
            conn.batch_execute("START TRANSACTION ISOLATION LEVEL READ COMMITTED"),
            conn.query_opt(&lock, &[]),
            spent_now,
        );
        if let Err(err) = begun {
            // No transaction: a spend sent behind the failed START may have committed alone.
            let mut doubts = self.doubts();
            for (nonce, expires_at) in spending.iter().zip(&expiring) {
                if let Ok(nonce) = <[u8; 16]>::try_from(*nonce) {
                    doubts.insert(Nonce::from_bytes(nonce), *expires_at);
                }
            }
            return Err(pg(err));
        }
        // The first of the two to fail says why (a lock that failed makes the spend after it
        // fail with 25P02, "transaction aborted"); both are answered before anything else is
        // sent, since a failed statement ends the transaction's use.
        let tip = tip.map_err(pg)?;
        let mut spent_now: Vec<Vec<u8>> = spent_now
            .map_err(pg)?
            .iter()
            .map(|row| row.try_get::<_, Vec<u8>>(0))
            .collect::<Result<_, _>>()
            .map_err(pg)?;
        // The tip, locked: replicas add events one batch at a time, in one order. The row is
        // made by the first append; a database where it is missing gets it here.
        let tip = match tip {
            Some(tip) => tip,
            None => {
                conn.execute(
                    "INSERT INTO history_tip (one, seq, hash) VALUES (1, 0, $1)
                     ON CONFLICT (one) DO NOTHING",
                    &[&ChainHash::GENESIS.to_hex()],
                )
                .await
                .map_err(pg)?;
                conn.query_one(&lock, &[]).await.map_err(pg)?
            }
        };
        // Which events are appended: those with no nonce to spend, and those whose nonce this
        // transaction spent (the first event that gave it).
        let appended: Vec<bool> = spends
            .iter()
            .map(|spend| match spend {
                None => true,
                Some(spend) => {
                    let now = spent_now
                        .iter()
                        .position(|n| n[..] == spend.nonce.as_bytes()[..]);
                    now.map(|at| spent_now.swap_remove(at)).is_some()
                }
            })
            .collect();
        let mut rows: Vec<ChainRow> = rows
            .iter()
            .zip(&appended)
            .filter(|(_, appended)| **appended)
            .map(|(row, _)| row.clone())
            .collect();
        let Some(at_ms) = rows.last().map(|row| row.at_ms) else {
            // Nothing to append: every event's nonce was spent before.
            conn.batch_execute("COMMIT").await.map_err(pg)?;
            return Ok(appended);
        };
        let at_ms = u64::try_from(at_ms).unwrap_or_default();
        let (mut last, mut prev) = tip_of(&tip)?;
        if last == 0 {
            let client: &tokio_postgres::Client = conn;
            (last, prev) = chain_unchained(client).await?;
        }
        // Linked after the tip held now (a retried attempt links them again).
        for row in &mut rows {
            let seq = last + 1;
            let hash = row.link(seq, prev);
            row.seq = i64::try_from(seq).map_err(|_| chain_range(seq))?;
            (row.prev, row.hash) = (prev.to_hex(), hash.to_hex());
            (last, prev) = (seq, hash);
        }
        let (seq_sql, hash_hex) = (
            i64::try_from(last).map_err(|_| chain_range(last))?,
            prev.to_hex(),
        );
        let signed = match &self.chain_key {
            Some(key) => {
                let head = key.sign(Head {
                    seq: last,
                    hash: prev,
                    at_ms,
                });
                Some((
                    ms_to_sql(head.head.at_ms)?,
                    head.key.to_vec(),
                    head.signature.to_vec(),
                ))
            }
            None => None,
        };
        let column =
            |value: fn(&ChainRow) -> &str| -> Vec<&str> { rows.iter().map(value).collect() };
        let maybe = |value: fn(&ChainRow) -> Option<&str>| -> Vec<Option<&str>> {
            rows.iter().map(value).collect()
        };
        let at: Vec<i64> = rows.iter().map(|r| r.at_ms).collect();
        let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
        let oks: Vec<Option<bool>> = rows.iter().map(|r| r.ok).collect();
        let (kind, tool, tenant) = (
            column(|r| r.kind),
            column(|r| &r.tool),
            column(|r| &r.tenant),
        );
        let (prevs, hashes) = (column(|r| &r.prev), column(|r| &r.hash));
        let (refusal, target, note) = (
            maybe(|r| r.refusal),
            maybe(|r| r.target.as_deref()),
            maybe(|r| r.note.as_deref()),
        );
        let (nonce, plan) = (maybe(|r| r.nonce.as_deref()), maybe(|r| r.plan.as_deref()));
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
            &at, &kind, &refusal, &oks, &tool, &target, &tenant, &nonce, &plan, &note, &seqs,
            &prevs, &hashes, &seq_sql, &hash_hex,
        ];
        if let Some((at, public, signature)) = &signed {
            params.extend([
                at as &(dyn tokio_postgres::types::ToSql + Sync),
                public,
                signature,
            ]);
        }
        // The write and the commit, sent together. Should the write fail, PostgreSQL ends the
        // transaction at the COMMIT without committing anything (and says ROLLBACK): the
        // write's own error is what this answers.
        let (written, committed) =
            tokio::join!(conn.execute(&write, &params), conn.batch_execute("COMMIT"));
        written.map_err(pg)?;
        committed.map_err(pg)?;
        Ok(appended)
    }

    /// Appends `event`, spending `spend` with it, through the replica's writer (or here, alone,
    /// when the writer is not running: its runtime ended, and nothing was handed to it).
    /// Answers whether it was appended, as [`Told`] says.
    async fn appended(
        &self,
        event: &ConfirmEvent,
        spend: Option<Spending>,
    ) -> Result<bool, StoreError> {
        if let Some(chain) = &self.chain {
            match chain.append(event, spend).await {
                Some(Handed::Told(stored)) => return stored,
                Some(Handed::Unheard) => {
                    // It may have committed: the nonce is held as spent, as after any answer
                    // that never came.
                    if let Some(spend) = spend {
                        self.doubts().insert(spend.nonce, spend.expires_at);
                    }
                    return Err(StoreError::PostgresUnavailable {
                        target: "the history's writer".to_owned(),
                        reason: "it stopped before it said whether the event was appended"
                            .to_owned(),
                    });
                }
                None => {}
            }
        }
        let appended = self.append(std::slice::from_ref(event), &[spend]).await?;
        Ok(appended.first().copied().unwrap_or(false))
    }

    /// When `err` says the database was unreachable or did not answer (not a fact about the
    /// events), the same error again, for another event of the batch.
    fn outage_of(&self, err: &StoreError) -> Option<StoreError> {
        match err {
            StoreError::PostgresTimeout { after } => {
                Some(StoreError::PostgresTimeout { after: *after })
            }
            StoreError::PostgresUnavailable { target, reason } => {
                Some(StoreError::PostgresUnavailable {
                    target: target.clone(),
                    reason: reason.clone(),
                })
            }
            err if err.breaks_postgres_connection() => Some(StoreError::PostgresUnavailable {
                target: self.target.clone(),
                reason: err.to_string(),
            }),
            _ => None,
        }
    }
}

fn chain_range(seq: u64) -> StoreError {
    StoreError::InvalidRow {
        table: "history",
        reason: format!("chain number {seq} beyond the store's range"),
    }
}

fn chain_hash(hex: &str, what: &str) -> Result<ChainHash, StoreError> {
    ChainHash::from_hex(hex).ok_or_else(|| StoreError::InvalidRow {
        table: "history",
        reason: format!("{what} {hex:?} is not a chain hash"),
    })
}

/// The tip row's number and hash.
fn tip_of(row: &tokio_postgres::Row) -> Result<(u64, ChainHash), StoreError> {
    let seq: i64 = row.try_get(0).map_err(StoreError::Postgres)?;
    let hash: String = row.try_get(1).map_err(StoreError::Postgres)?;
    Ok((
        u64::try_from(seq).unwrap_or_default(),
        chain_hash(&hash, "the chain's tip")?,
    ))
}

/// Chains the events recorded before the chain existed (none on a database that began with it),
/// oldest first, from the start; answers the new tip. Runs under the tip's lock.
async fn chain_unchained(
    tx: &impl tokio_postgres::GenericClient,
) -> Result<(u64, ChainHash), StoreError> {
    let pg = StoreError::Postgres;
    let rows = tx
        .query(
            "SELECT id, at_ms, kind, refusal, ok, tool, target, tenant, nonce, plan, note
             FROM history WHERE seq IS NULL ORDER BY at_ms, id",
            &[],
        )
        .await
        .map_err(pg)?;
    let (mut last, mut prev) = (0, ChainHash::GENESIS);
    for r in &rows {
        let id: i64 = r.try_get(0).map_err(pg)?;
        let row = history_row(r, 1).map_err(pg)?;
        let seq = last + 1;
        let hash = row.link(seq, prev).hash();
        let seq_sql = i64::try_from(seq).map_err(|_| chain_range(seq))?;
        tx.execute(
            "UPDATE history SET seq = $1, prev = $2, hash = $3 WHERE id = $4",
            &[&seq_sql, &prev.to_hex(), &hash.to_hex(), &id],
        )
        .await
        .map_err(pg)?;
        (last, prev) = (seq, hash);
    }
    Ok((last, prev))
}

/// Keeps `head` as the chain's `role`, replacing the one before.
async fn put_head(
    tx: &tokio_postgres::Transaction<'_>,
    role: &str,
    head: &SignedHead,
) -> Result<(), StoreError> {
    let seq = i64::try_from(head.head.seq).map_err(|_| chain_range(head.head.seq))?;
    tx.execute(
        HEAD_PUT,
        &[
            &role,
            &seq,
            &head.head.hash.to_hex(),
            &ms_to_sql(head.head.at_ms)?,
            &&head.key[..],
            &&head.signature[..],
        ],
    )
    .await
    .map_err(StoreError::Postgres)?;
    Ok(())
}

/// After a prune: signs where the chain now starts (see the SQLite store's `mark_start`).
async fn mark_start(
    tx: &tokio_postgres::Transaction<'_>,
    key: &ChainKey,
    now_ms: u64,
) -> Result<(), StoreError> {
    let oldest = tx
        .query_opt(
            "SELECT seq, prev FROM history WHERE seq IS NOT NULL ORDER BY seq LIMIT 1",
            &[],
        )
        .await
        .map_err(StoreError::Postgres)?;
    if let Some(row) = oldest {
        let seq: i64 = row.try_get(0).map_err(StoreError::Postgres)?;
        let prev: String = row.try_get(1).map_err(StoreError::Postgres)?;
        if seq > 1 {
            let head = Head {
                seq: u64::try_from(seq - 1).unwrap_or_default(),
                hash: chain_hash(&prev, "the oldest event's link")?,
                at_ms: now_ms,
            };
            put_head(tx, "start", &key.sign(head)).await?;
        }
    }
    Ok(())
}

/// The ten event columns of `r` from column `first` on.
fn history_row(
    r: &tokio_postgres::Row,
    first: usize,
) -> Result<history::Row, tokio_postgres::Error> {
    Ok(history::Row {
        at_ms: r.try_get(first)?,
        kind: r.try_get(first + 1)?,
        refusal: r.try_get(first + 2)?,
        ok: r.try_get(first + 3)?,
        tool: r.try_get(first + 4)?,
        target: r.try_get(first + 5)?,
        tenant: r.try_get(first + 6)?,
        nonce: r.try_get(first + 7)?,
        plan: r.try_get(first + 8)?,
        note: r.try_get(first + 9)?,
    })
}

fn grant_row(r: &tokio_postgres::Row) -> Result<grant::Row, tokio_postgres::Error> {
    Ok((
        r.try_get(0)?,
        r.try_get(1)?,
        r.try_get(2)?,
        r.try_get(3)?,
        r.try_get(4)?,
        r.try_get(5)?,
        r.try_get(6)?,
        r.try_get(7)?,
        r.try_get(8)?,
        r.try_get(9)?,
        r.try_get(10)?,
        r.try_get(11)?,
        r.try_get(12)?,
        r.try_get(13)?,
        r.try_get(14)?,
        r.try_get(15)?,
        r.try_get(16)?,
        r.try_get(17)?,
    ))
}

/// [`waiting::sharing`] as PostgreSQL spells it, made once.
static SHARING: std::sync::LazyLock<waiting::Sharing> =
    std::sync::LazyLock::new(|| waiting::sharing('$'));

/// Locks the history's tip: replicas add events one at a time, in one order.
const TIP_LOCK: &str = "SELECT seq, hash FROM history_tip WHERE one = 1 FOR UPDATE";

/// Spends a batch's nonces ($1, with their expiries $2): answers those spent now. A nonce spent
/// before (by any replica, committed or about to be) is left as it is and not answered.
const SPEND_BATCH: &str = "INSERT INTO spent_nonce (nonce, expires_at_ms)
     SELECT nonce, expires_at_ms FROM unnest($1::BYTEA[], $2::BIGINT[]) AS s(nonce, expires_at_ms)
     ON CONFLICT (nonce) DO NOTHING
     RETURNING nonce";

/// Adds one event to the history, linked into the chain.
/// The rows of a batch, given column by column as arrays ($1 to $13), added in the arrays'
/// order; and the tip moved to the last of them ($14, $15). One statement whatever the batch's
/// size, so it is prepared once per connection.
macro_rules! chain_write {
    ($then:literal) => {
        concat!(
            "WITH added AS (
                INSERT INTO history
                    (at_ms, kind, refusal, ok, tool, target, tenant, nonce, plan, note, seq,
                     prev, hash)
                SELECT at_ms, kind, refusal, ok, tool, target, tenant, nonce, plan, note, seq,
                       prev, hash
                FROM unnest($1::BIGINT[], $2::TEXT[], $3::TEXT[], $4::BOOLEAN[], $5::TEXT[],
                            $6::TEXT[], $7::TEXT[], $8::TEXT[], $9::TEXT[], $10::TEXT[],
                            $11::BIGINT[], $12::TEXT[], $13::TEXT[])
                     WITH ORDINALITY AS r(at_ms, kind, refusal, ok, tool, target, tenant, nonce,
                                          plan, note, seq, prev, hash, place)
                ORDER BY place
                RETURNING 1
            )",
            $then
        )
    };
}

/// [`chain_write!`] where no key signs the head.
const CHAIN_WRITE: &str =
    chain_write!(" UPDATE history_tip SET seq = $14::BIGINT, hash = $15::TEXT WHERE one = 1");

/// [`chain_write!`], and the head signed at the last row kept ($16 to $18: its time, the key,
/// the signature).
const CHAIN_WRITE_SIGNED: &str = chain_write!(
    ", tip AS (
        UPDATE history_tip SET seq = $14::BIGINT, hash = $15::TEXT WHERE one = 1 RETURNING 1
    )
    INSERT INTO history_head (role, seq, hash, at_ms, public_key, signature)
    VALUES ('head', $14, $15, $16, $17, $18)
    ON CONFLICT (role) DO UPDATE SET seq = excluded.seq, hash = excluded.hash,
        at_ms = excluded.at_ms, public_key = excluded.public_key,
        signature = excluded.signature"
);

/// A history row as PostgreSQL keeps it (no NUL in its text), with its place in the chain once
/// the tip is known.
#[derive(Clone)]
struct ChainRow {
    at_ms: i64,
    kind: &'static str,
    refusal: Option<&'static str>,
    ok: Option<bool>,
    tool: String,
    target: Option<String>,
    tenant: String,
    nonce: Option<String>,
    plan: Option<String>,
    note: Option<String>,
    seq: i64,
    prev: String,
    hash: String,
}

impl ChainRow {
    /// Its hash as event `seq` after `prev`: the link of exactly what is stored.
    fn link(&self, seq: u64, prev: ChainHash) -> ChainHash {
        history::Columns {
            at_ms: self.at_ms,
            kind: self.kind,
            refusal: self.refusal,
            ok: self.ok,
            tool: std::borrow::Cow::Borrowed(&self.tool),
            target: self.target.as_deref().map(std::borrow::Cow::Borrowed),
            tenant: &self.tenant,
            nonce: self.nonce.clone(),
            plan: self.plan.clone(),
            note: self.note.as_deref().map(std::borrow::Cow::Borrowed),
        }
        .link(seq, prev)
        .hash()
    }
}

/// Keeps the signed head of the chain (by role: `head`, `start`).
const HEAD_PUT: &str = "INSERT INTO history_head (role, seq, hash, at_ms, public_key, signature)
     VALUES ($1, $2, $3, $4, $5, $6)
     ON CONFLICT (role) DO UPDATE SET seq = excluded.seq, hash = excluded.hash,
         at_ms = excluded.at_ms, public_key = excluded.public_key,
         signature = excluded.signature";

/// Every pin of the servers and tools named (a superset of the pairs asked: the caller keeps
/// the ones it asked).
const PINS_READ: &str = "SELECT server, tool, hash, definition, pinned_at_ms FROM tool_pin
     WHERE server = ANY($1) AND tool = ANY($2)";

/// The pin of `server`'s `tool` (both already as stored), read on `client`.
async fn read_pin(
    client: &impl tokio_postgres::GenericClient,
    server: &str,
    tool: &str,
) -> Result<Option<ToolPin>, StoreError> {
    let row = client
        .query_opt(
            "SELECT hash, definition, pinned_at_ms FROM tool_pin WHERE server = $1 AND tool = $2",
            &[&server, &tool],
        )
        .await
        .map_err(StoreError::Postgres)?;
    let Some(row) = row else {
        return Ok(None);
    };
    let (hash, definition, pinned_at): (String, String, i64) = (
        row.try_get(0).map_err(StoreError::Postgres)?,
        row.try_get(1).map_err(StoreError::Postgres)?,
        row.try_get(2).map_err(StoreError::Postgres)?,
    );
    pin::decode(server, tool, &hash, definition, pinned_at).map(Some)
}

/// A server and tool name as pins key them (capped as history caps them, NUL-free).
fn pin_key(server: &str, tool: &str) -> (String, String) {
    (
        text(&capped(server)).into_owned(),
        text(&capped(tool)).into_owned(),
    )
}

#[async_trait]
impl Records for Postgres {
    async fn spend(&self, nonce: &Nonce, expires_at_ms: u64) -> Result<(), SpendError> {
        self.spend_nonce(nonce, expires_at_ms).await
    }

    async fn put_approval(&self, approval: &Approval) -> Result<(), StoreError> {
        let c = approval::Columns::of(approval)?;
        let nonce = &approval.nonce.as_bytes()[..];
        let plan = approval.plan.to_hex();
        let mac = approval.mac.as_ref().map(|m| &m[..]);
        let (tool, target, tenant) = (
            text(&approval.tool),
            text(&approval.target),
            text(&approval.tenant),
        );
        let inserted = on_connection!(self, |conn| conn.execute(
            "INSERT INTO approval
                 (nonce, tool, target, tenant, plan, arguments, issued_at_ms, expires_at_ms,
                  class, mac)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            &[
                &nonce,
                &tool.as_ref(),
                &target.as_ref(),
                &tenant.as_ref(),
                &plan,
                &c.arguments,
                &c.issued_at,
                &c.expires_at,
                &c.class,
                &mac,
            ],
        ));
        match inserted {
            Ok(_) => Ok(()),
            Err(err) if err.sqlstate() == Some(&SqlState::UNIQUE_VIOLATION) => {
                Err(StoreError::ApprovalExists(approval.nonce))
            }
            Err(err) => Err(err),
        }
    }

    async fn approval(&self, nonce: &Nonce) -> Result<Option<Approval>, StoreError> {
        let key = &nonce.as_bytes()[..];
        const SQL: &str = "SELECT tool, target, tenant, plan, arguments, issued_at_ms,
                                  expires_at_ms, class, mac
                           FROM approval WHERE nonce = $1";
        // Read on every confirm: prepared once per pooled connection.
        let row = on_connection!(self, |conn| async {
            let statement = conn.prepare_cached(SQL).await?;
            conn.query_opt(&statement, &[&key]).await
        })?;
        let Some(row) = row else {
            return Ok(None);
        };
        let get = StoreError::Postgres;
        approval::Row {
            tool: row.try_get(0).map_err(get)?,
            target: row.try_get(1).map_err(get)?,
            tenant: row.try_get(2).map_err(get)?,
            plan: row.try_get(3).map_err(get)?,
            arguments: row.try_get(4).map_err(get)?,
            issued_at: row.try_get(5).map_err(get)?,
            expires_at: row.try_get(6).map_err(get)?,
            class: row.try_get(7).map_err(get)?,
            mac: row.try_get(8).map_err(get)?,
        }
        .decode(nonce)
        .map(Some)
    }

    async fn withdraw_approval(&self, nonce: &Nonce) -> Result<bool, StoreError> {
        let key = &nonce.as_bytes()[..];
        let deleted = on_connection!(self, |conn| conn
            .execute("DELETE FROM approval WHERE nonce = $1", &[&key]))?;
        Ok(deleted == 1)
    }

    async fn spend_recording(
        &self,
        nonce: &Nonce,
        expires_at_ms: u64,
        accepted: &ConfirmEvent,
    ) -> Result<Result<(), StoreError>, SpendError> {
        // An event the history cannot hold (a time beyond its range) cannot carry the spend:
        // spent alone, then refused alone, as the trait's default does.
        if history::Columns::of(accepted).is_err() || self.doubts().contains_key(nonce) {
            self.spend_nonce(nonce, expires_at_ms).await?;
            return Ok(self.record(accepted).await);
        }
        match self
            .appended(accepted, Some(Spending::new(*nonce, expires_at_ms)))
            .await
        {
            Ok(true) => Ok(history::emitted(accepted, Ok(()))),
            Ok(false) => Err(SpendError::AlreadySpent),
            Err(err) => Err(SpendError::Unreachable(err.to_string())),
        }
    }

    async fn record(&self, event: &ConfirmEvent) -> Result<(), StoreError> {
        let stored = self.appended(event, None).await.map(|_| ());
        history::emitted(event, stored)
    }

    async fn history(&self, filter: &HistoryFilter) -> Result<Vec<ConfirmEvent>, StoreError> {
        let nonce = filter.nonce.map(|n| n.to_hex());
        let tool = filter.tool.as_deref().map(text);
        let tenant = filter.tenant.as_deref().map(text);
        let limit = filter.limit.map_or(i64::MAX, i64::from);
        let rows = on_connection!(self, |conn| conn.query(
            "SELECT at_ms, kind, refusal, ok, tool, target, tenant, nonce, plan, note
             FROM history
             WHERE ($1::TEXT IS NULL OR tool = $1)
               AND ($2::TEXT IS NULL OR tenant = $2)
               AND ($3::TEXT IS NULL OR kind = $3)
               AND ($4::TEXT IS NULL OR nonce = $4)
             ORDER BY at_ms DESC, id DESC
             LIMIT $5",
            &[
                &tool.as_deref(),
                &tenant.as_deref(),
                &filter.kind,
                &nonce,
                &limit
            ],
        ))?;
        rows.iter()
            .map(|r| {
                let row = history_row(r, 0).map_err(StoreError::Postgres)?;
                row.into_event()
            })
            .collect()
    }

    async fn export_claim(
        &self,
        sink: &str,
        holder: &str,
        now_ms: u64,
        lease_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let now = ms_to_sql(now_ms)?;
        let until = ms_to_sql(now_ms.saturating_add(lease_ms))?;
        let pg = StoreError::Postgres;
        serializable!(self, |tx| async {
            tx.execute(
                "INSERT INTO export_cursor (sink, seq) VALUES ($1, 0) ON CONFLICT (sink) DO NOTHING",
                &[&sink],
            )
            .await
            .map_err(pg)?;
            let claimed = tx
                .query_opt(
                    "UPDATE export_cursor SET holder = $2, lease_until_ms = $3
                     WHERE sink = $1 AND (holder IS NULL OR holder = $2 OR lease_until_ms < $4)
                     RETURNING seq",
                    &[&sink, &holder, &until, &now],
                )
                .await
                .map_err(pg)?;
            claimed
                .map(|r| {
                    r.try_get::<_, i64>(0)
                        .map(|seq| u64::try_from(seq).unwrap_or_default())
                })
                .transpose()
                .map_err(pg)
        })
    }

    async fn recorded_after(&self, seq: u64, limit: u32) -> Result<Vec<Recorded>, StoreError> {
        let after = i64::try_from(seq).map_err(|_| chain_range(seq))?;
        let limit = i64::from(limit);
        let rows = on_connection!(self, |conn| conn.query(
            "SELECT at_ms, kind, refusal, ok, tool, target, tenant, nonce, plan, note,
                    seq, prev, hash
             FROM history WHERE seq > $1 ORDER BY seq LIMIT $2",
            &[&after, &limit],
        ))?;
        let pg = StoreError::Postgres;
        rows.iter()
            .map(|r| {
                history::StoredLink::new(
                    history_row(r, 0).map_err(pg)?,
                    r.try_get(10).map_err(pg)?,
                    r.try_get(11).map_err(pg)?,
                    r.try_get(12).map_err(pg)?,
                )
                .into_recorded()
            })
            .collect()
    }

    async fn export_advance(
        &self,
        sink: &str,
        holder: &str,
        from: u64,
        to: u64,
    ) -> Result<bool, StoreError> {
        let from = i64::try_from(from).map_err(|_| chain_range(from))?;
        let to = i64::try_from(to).map_err(|_| chain_range(to))?;
        let moved = on_connection!(self, |conn| conn.execute(
            "UPDATE export_cursor SET seq = $4, failing_since_ms = NULL, last_error = NULL
             WHERE sink = $1 AND holder = $2 AND seq = $3",
            &[&sink, &holder, &from, &to],
        ))?;
        Ok(moved == 1)
    }

    async fn export_failed(&self, sink: &str, now_ms: u64, error: &str) -> Result<(), StoreError> {
        let now = ms_to_sql(now_ms)?;
        let error = text(&crate::sink::capped_error(error)).into_owned();
        on_connection!(self, |conn| conn.execute(
            "UPDATE export_cursor
             SET failing_since_ms = coalesce(failing_since_ms, $2), last_error = $3
             WHERE sink = $1",
            &[&sink, &now, &error],
        ))?;
        Ok(())
    }

    async fn export_status(&self, sink: &str) -> Result<Option<ExportStatus>, StoreError> {
        let row = on_connection!(self, |conn| conn.query_opt(
            "SELECT c.seq, c.failing_since_ms, c.last_error,
                    (SELECT count(*) FROM history h WHERE h.seq IS NULL OR h.seq > c.seq)
             FROM export_cursor c WHERE c.sink = $1",
            &[&sink],
        ))?;
        let Some(r) = row else {
            return Ok(None);
        };
        let pg = StoreError::Postgres;
        let cursor: i64 = r.try_get(0).map_err(pg)?;
        let failing: Option<i64> = r.try_get(1).map_err(pg)?;
        let waiting: i64 = r.try_get(3).map_err(pg)?;
        Ok(Some(ExportStatus {
            cursor: u64::try_from(cursor).unwrap_or_default(),
            waiting: u64::try_from(waiting).unwrap_or_default(),
            failing_since_ms: failing.map(|ms| u64::try_from(ms).unwrap_or_default()),
            last_error: r.try_get(2).map_err(pg)?,
        }))
    }

    async fn export_forget(&self, sink: &str) -> Result<(), StoreError> {
        on_connection!(self, |conn| conn
            .execute("DELETE FROM export_cursor WHERE sink = $1", &[&sink]))?;
        Ok(())
    }

    async fn verify_history(&self, mut walk: Walk) -> Result<Result<Intact, Break>, StoreError> {
        let pg = StoreError::Postgres;
        let mut conn = self.connection().await?;
        // One snapshot, read a page at a time by chain number: the rows and the heads of the same
        // moment, however long the history (no statement timeout: a long history takes long).
        let checked = async {
            let tx = conn
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await
                .map_err(pg)?;
            let mut after = 0_i64;
            let mut broken = None;
            'pages: loop {
                let rows = tx
                    .query(
                        "SELECT at_ms, kind, refusal, ok, tool, target, tenant, nonce, plan,
                                note, seq, prev, hash
                         FROM history WHERE seq > $1 ORDER BY seq LIMIT 1000",
                        &[&after],
                    )
                    .await
                    .map_err(pg)?;
                let Some(last) = rows.last() else {
                    break;
                };
                after = last.try_get(10).map_err(pg)?;
                for r in &rows {
                    let stored = history::StoredLink::new(
                        history_row(r, 0).map_err(pg)?,
                        r.try_get(10).map_err(pg)?,
                        r.try_get(11).map_err(pg)?,
                        r.try_get(12).map_err(pg)?,
                    );
                    if let Err(b) = stored
                        .link()
                        .and_then(|(link, hash)| walk.step(&link, hash))
                    {
                        broken = Some(b);
                        break 'pages;
                    }
                }
            }
            let unchained: i64 = tx
                .query_one("SELECT count(*) FROM history WHERE seq IS NULL", &[])
                .await
                .map_err(pg)?
                .try_get(0)
                .map_err(pg)?;
            let heads = tx
                .query(
                    "SELECT role, seq, hash, at_ms, public_key, signature FROM history_head",
                    &[],
                )
                .await
                .map_err(pg)?;
            tx.commit().await.map_err(pg)?;
            if let Some(b) = broken {
                return Ok(Err(b));
            }
            if unchained > 0 {
                return Ok(Err(Break::Unreadable {
                    at: format!("{unchained} events"),
                    reason: "they have no number in the chain (recorded before it existed; the \
                             next event chains them)"
                        .into(),
                }));
            }
            let (mut head, mut start) = (None, None);
            for r in &heads {
                let role: String = r.try_get(0).map_err(pg)?;
                let read = || {
                    history::head_of(
                        r.try_get(1).ok()?,
                        r.try_get(2).ok()?,
                        r.try_get(3).ok()?,
                        r.try_get(4).ok()?,
                        r.try_get(5).ok()?,
                    )
                };
                match role.as_str() {
                    "head" => head = read(),
                    "start" => start = read(),
                    _ => {}
                }
            }
            Ok::<_, StoreError>(walk.finish(head, start, false))
        }
        .await;
        self.release(conn, checked.as_ref().err());
        checked
    }

    async fn prune(&self, now_ms: u64) -> Result<Pruned, StoreError> {
        // A `now` beyond BIGINT is later than any stored expiry.
        let now = i64::try_from(now_ms).unwrap_or(i64::MAX);
        serializable!(self, |tx| async {
            let pg = StoreError::Postgres;
            let nonces = tx
                .execute("DELETE FROM spent_nonce WHERE expires_at_ms < $1", &[&now])
                .await
                .map_err(pg)?;
            let approvals = tx
                .execute("DELETE FROM approval WHERE expires_at_ms < $1", &[&now])
                .await
                .map_err(pg)?;
            // By chain number: on a distributed engine ids need not follow the order of commits.
            let history = tx
                .execute(
                    "DELETE FROM history WHERE seq <=
                             (SELECT seq FROM history ORDER BY seq DESC LIMIT 1 OFFSET $1)
                       AND seq <= (SELECT coalesce(min(seq), 9223372036854775807)
                                   FROM export_cursor)",
                    &[&MAX_HISTORY_ROWS],
                )
                .await
                .map_err(pg)?;
            if history > 0
                && let Some(key) = &self.chain_key
            {
                mark_start(&tx, key, now_ms).await?;
            }
            // Never a registered server's pins (see `Store::prune`).
            let pins = tx
                .execute(
                    "DELETE FROM tool_pin WHERE (server, tool) IN
                             (SELECT server, tool FROM tool_pin WHERE server NOT LIKE 'server:%'
                              ORDER BY pinned_at_ms DESC, server DESC, tool DESC OFFSET $1)",
                    &[&MAX_PINS],
                )
                .await
                .map_err(pg)?;
            let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
            Ok::<_, StoreError>(Pruned {
                nonces: count(nonces),
                approvals: count(approvals),
                history: count(history),
                pins: count(pins),
            })
        })
    }

    async fn pin_first_seen(&self, candidates: &[ToolPin]) -> Result<Vec<ToolPin>, StoreError> {
        let keys: Vec<(String, String)> = candidates
            .iter()
            .map(|c| pin_key(&c.server, &c.tool))
            .collect();
        let rows: Vec<(String, i64, String)> = candidates
            .iter()
            .map(|c| {
                Ok((
                    c.hash.to_hex(),
                    ms_to_sql(c.pinned_at_ms)?,
                    text(&cut(&c.definition, MAX_DEFINITION_CHARS)).into_owned(),
                ))
            })
            .collect::<Result<_, StoreError>>()?;
        // Most listings find every tool pinned: one read then, prepared once per connection,
        // with no transaction and no write. A tool found unpinned goes the careful way below.
        let (servers, tools): (Vec<&str>, Vec<&str>) = keys
            .iter()
            .map(|(server, tool)| (server.as_str(), tool.as_str()))
            .unzip();
        let read = on_connection!(self, |conn| async {
            let statement = conn.prepare_cached(PINS_READ).await?;
            conn.query(&statement, &[&servers, &tools]).await
        })?;
        let mut pinned = HashMap::with_capacity(read.len());
        for row in &read {
            let pg = StoreError::Postgres;
            let (server, tool): (String, String) =
                (row.try_get(0).map_err(pg)?, row.try_get(1).map_err(pg)?);
            let (hash, definition, pinned_at): (String, String, i64) = (
                row.try_get(2).map_err(pg)?,
                row.try_get(3).map_err(pg)?,
                row.try_get(4).map_err(pg)?,
            );
            let pin = pin::decode(&server, &tool, &hash, definition, pinned_at)?;
            pinned.insert((server, tool), pin);
        }
        if keys.iter().all(|key| pinned.contains_key(key)) {
            return Ok(keys
                .iter()
                .filter_map(|key| pinned.get(key).cloned())
                .collect());
        }
        serializable!(self, |tx| async {
            {
                let mut found = Vec::with_capacity(keys.len());
                for (server, tool) in &keys {
                    found.push(read_pin(&*tx, server, tool).await?);
                }
                if found.iter().all(Option::is_some) {
                    return Ok::<_, StoreError>(found.into_iter().flatten().collect());
                }
                // Whether each server was known before this listing: read once, before any
                // insert.
                let mut known = HashMap::<&str, bool>::new();
                for (server, _) in &keys {
                    if !known.contains_key(server.as_str()) {
                        let seen: bool = tx
                            .query_one(
                                "SELECT EXISTS (SELECT 1 FROM tool_pin WHERE server = $1)",
                                &[server],
                            )
                            .await
                            .and_then(|r| r.try_get(0))
                            .map_err(StoreError::Postgres)?;
                        known.insert(server, seen);
                    }
                }
                let mut pins = Vec::with_capacity(keys.len());
                let mut pinned_now = HashMap::<&str, usize>::new();
                for ((server, tool), (hash, at, definition)) in keys.iter().zip(&rows) {
                    let count = pinned_now.entry(server.as_str()).or_default();
                    if known[server.as_str()] || *count >= MAX_PINS_PER_SERVER {
                        if let Some(pin) = read_pin(&*tx, server, tool).await? {
                            pins.push(pin);
                        }
                        continue;
                    }
                    tx.execute(
                        "INSERT INTO tool_pin (server, tool, hash, definition, pinned_at_ms)
                         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (server, tool) DO NOTHING",
                        &[server, tool, hash, definition, at],
                    )
                    .await
                    .map_err(StoreError::Postgres)?;
                    let pin = read_pin(&*tx, server, tool).await?.ok_or_else(|| {
                        StoreError::InvalidRow {
                            table: pin::TABLE,
                            reason: "a pin just written is not there".into(),
                        }
                    })?;
                    pins.push(pin);
                    *count += 1;
                }
                Ok(pins)
            }
        })
    }

    async fn repin(&self, pin: &ToolPin) -> Result<(), StoreError> {
        let at = ms_to_sql(pin.pinned_at_ms)?;
        let (server, tool) = pin_key(&pin.server, &pin.tool);
        let hash = pin.hash.to_hex();
        let definition = text(&cut(&pin.definition, MAX_DEFINITION_CHARS)).into_owned();
        on_connection!(self, |conn| conn.execute(
            "INSERT INTO tool_pin (server, tool, hash, definition, pinned_at_ms)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (server, tool) DO UPDATE
                 SET hash = excluded.hash, definition = excluded.definition,
                     pinned_at_ms = excluded.pinned_at_ms",
            &[&server, &tool, &hash, &definition, &at],
        ))
        .map(|_| ())
    }

    async fn tool_pin(&self, server: &str, tool: &str) -> Result<Option<ToolPin>, StoreError> {
        let (server, tool) = pin_key(server, tool);
        let conn = self.connection().await?;
        let result =
            match tokio::time::timeout(self.statement_timeout, read_pin(&**conn, &server, &tool))
                .await
            {
                Ok(result) => result,
                Err(_) => Err(StoreError::PostgresTimeout {
                    after: self.statement_timeout,
                }),
            };
        self.release(conn, result.as_ref().err());
        result
    }

    async fn put_grant(
        &self,
        grant: &Grant,
        max_live: usize,
        now: u64,
    ) -> Result<Option<u64>, StoreError> {
        let now = ms_to_sql(now)?;
        let granted_at = ms_to_sql(grant.granted_at_ms)?;
        let expires_at = ms_to_sql(grant.expires_at_ms)?;
        let request =
            i64::try_from(grant.request).map_err(|_| grant::invalid("request id".into()))?;
        let (server, tool) = (text(&grant.server), text(&grant.tool));
        let tenant = grant.tenant.as_deref().map(text);
        let prefix = grant.prefix.as_deref().map(text);
        let target = text(&capped(&grant.target)).into_owned();
        let summary = text(&capped(&grant.summary)).into_owned();
        let plan = grant.plan.map(|p| p.to_hex());
        let definition = grant.definition.to_hex();
        let mac = &grant.mac[..];
        let id: Option<i64> = serializable!(self, |tx| async {
            {
                let pg = StoreError::Postgres;
                let live: i64 = tx
                    .query_one(
                        "SELECT count(*) FROM approval_grant
                             WHERE ended_at_ms IS NULL AND expires_at_ms > $1",
                        &[&now],
                    )
                    .await
                    .and_then(|r| r.try_get(0))
                    .map_err(pg)?;
                if usize::try_from(live).unwrap_or(usize::MAX) >= max_live {
                    return Ok::<_, StoreError>(None);
                }
                let id: i64 = tx
                    .query_one(
                        "INSERT INTO approval_grant
                                 (kind, server, tool, tenant, plan, prefix, target, summary,
                                  class, definition, request, granted_at_ms, expires_at_ms,
                                  uses, mac)
                             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, 0,
                                     $14)
                             RETURNING id",
                        &[
                            &grant.kind.code(),
                            &server.as_ref(),
                            &tool.as_ref(),
                            &tenant.as_deref(),
                            &plan,
                            &prefix.as_deref(),
                            &target,
                            &summary,
                            &grant.class.code(),
                            &definition,
                            &request,
                            &granted_at,
                            &expires_at,
                            &mac,
                        ],
                    )
                    .await
                    .and_then(|r| r.try_get(0))
                    .map_err(pg)?;
                Ok(Some(id))
            }
        })?;
        id.map(|id| u64::try_from(id).map_err(|_| grant::invalid(format!("id {id}"))))
            .transpose()
    }

    async fn live_grants(&self, now: u64) -> Result<Vec<Grant>, StoreError> {
        let now = ms_to_sql(now)?;
        let sql = format!(
            "SELECT {COLUMNS} FROM approval_grant
             WHERE ended_at_ms IS NULL AND expires_at_ms > $1 ORDER BY id LIMIT $2"
        );
        let rows = on_connection!(self, |conn| conn.query(&sql, &[&now, &MAX_READ]))?;
        rows.iter()
            .map(|r| grant::decode(grant_row(r).map_err(StoreError::Postgres)?))
            .collect()
    }

    async fn grant(&self, id: u64) -> Result<Option<Grant>, StoreError> {
        let Ok(id) = i64::try_from(id) else {
            return Ok(None);
        };
        let sql = format!("SELECT {COLUMNS} FROM approval_grant WHERE id = $1");
        let row = on_connection!(self, |conn| conn.query_opt(&sql, &[&id]))?;
        row.map(|r| grant::decode(grant_row(&r).map_err(StoreError::Postgres)?))
            .transpose()
    }

    async fn end_grant(&self, id: u64, now: u64, why: GrantEnd) -> Result<bool, StoreError> {
        let Ok(id) = i64::try_from(id) else {
            return Ok(false);
        };
        let now = ms_to_sql(now)?;
        let why = why.code();
        let ended = on_connection!(self, |conn| conn.execute(
            "UPDATE approval_grant SET ended_at_ms = $2, ended = $3
             WHERE id = $1 AND ended_at_ms IS NULL AND expires_at_ms > $2",
            &[&id, &now, &why],
        ))?;
        Ok(ended == 1)
    }

    async fn end_prefix_grants(
        &self,
        tenant: Option<&str>,
        now: u64,
        why: GrantEnd,
    ) -> Result<usize, StoreError> {
        let now = ms_to_sql(now)?;
        let why = why.code();
        let tenant = tenant.map(text);
        let tenant = tenant.as_deref();
        let ended = on_connection!(self, |conn| conn.execute(
            "UPDATE approval_grant SET ended_at_ms = $1, ended = $2
             WHERE kind = 'prefix' AND ended_at_ms IS NULL AND ($3::TEXT IS NULL OR tenant = $3)",
            &[&now, &why, &tenant],
        ))?;
        Ok(usize::try_from(ended).unwrap_or(usize::MAX))
    }

    async fn grant_used(&self, id: u64) -> Result<(), StoreError> {
        let Ok(id) = i64::try_from(id) else {
            return Ok(());
        };
        on_connection!(self, |conn| conn.execute(
            "UPDATE approval_grant SET uses = uses + 1 WHERE id = $1",
            &[&id],
        ))
        .map(|_| ())
    }

    async fn accepted(&self, name: &str) -> Result<Option<Accepted>, StoreError> {
        let name = text(name);
        let row = on_connection!(self, |conn| conn.query_opt(
            "SELECT text, accepted_at_ms FROM accepted_file WHERE name = $1",
            &[&name.as_ref()],
        ))?;
        row.map(|r| {
            let text: String = r.try_get(0).map_err(StoreError::Postgres)?;
            let at: i64 = r.try_get(1).map_err(StoreError::Postgres)?;
            Ok(Accepted {
                text,
                at_ms: crate::error::ms_from_sql(at, accepted::TABLE)?,
            })
        })
        .transpose()
    }

    async fn accept(&self, name: &str, body: &str, at_ms: u64) -> Result<(), StoreError> {
        let at = accepted::checked(name, body, at_ms)?;
        let (name, body) = (text(name), text(body));
        on_connection!(self, |conn| conn.execute(
            "INSERT INTO accepted_file (name, text, accepted_at_ms) VALUES ($1, $2, $3)
             ON CONFLICT (name) DO UPDATE
                 SET text = excluded.text, accepted_at_ms = excluded.accepted_at_ms",
            &[&name.as_ref(), &body.as_ref(), &at],
        ))
        .map(|_| ())
    }

    async fn replace_accepted(
        &self,
        name: &str,
        expected: Option<&str>,
        body: &str,
        at_ms: u64,
    ) -> Result<bool, StoreError> {
        let at = accepted::checked(name, body, at_ms)?;
        let (name, body) = (text(name), text(body));
        let expected = expected.map(text);
        let changed = match &expected {
            Some(expected) => on_connection!(self, |conn| conn.execute(
                "UPDATE accepted_file SET text = $2, accepted_at_ms = $3
                 WHERE name = $1 AND text = $4",
                &[&name.as_ref(), &body.as_ref(), &at, &expected.as_ref()],
            ))?,
            None => on_connection!(self, |conn| conn.execute(
                "INSERT INTO accepted_file (name, text, accepted_at_ms) VALUES ($1, $2, $3)
                 ON CONFLICT (name) DO NOTHING",
                &[&name.as_ref(), &body.as_ref(), &at],
            ))?,
        };
        Ok(changed == 1)
    }

    async fn put_member(&self, roster: Roster, member: &Member) -> Result<bool, StoreError> {
        let created = roster::checked(roster, member)?;
        let sql = roster::statements(roster, '$').insert;
        let key = member.key.as_slice();
        let inserted = on_connection!(self, |conn| conn
            .execute(sql.as_str(), &[&member.name, &key, &created],))?;
        Ok(inserted == 1)
    }

    async fn member(&self, roster: Roster, key: &[u8; 32]) -> Result<Option<Member>, StoreError> {
        let sql = roster::statements(roster, '$').by_key;
        let key = key.as_slice();
        let row = on_connection!(self, |conn| conn.query_opt(sql.as_str(), &[&key]))?;
        row.map(|r| member_row(roster, &r)).transpose()
    }

    async fn revoke_member(
        &self,
        roster: Roster,
        name: &str,
        now: u64,
    ) -> Result<bool, StoreError> {
        let now = ms_to_sql(now)?;
        let name = text(name);
        let sql = roster::statements(roster, '$').revoke;
        let passkeys = passkey::statements('$').revoke;
        let approvers = roster == Roster::Approvers;
        // An approver's desk key and passkeys end together, in one transaction.
        let pg = StoreError::Postgres;
        let changed = serializable!(self, |tx| async {
            let mut changed = tx
                .execute(sql.as_str(), &[&name.as_ref(), &now])
                .await
                .map_err(pg)?;
            if approvers {
                changed += tx
                    .execute(passkeys.as_str(), &[&name.as_ref(), &now])
                    .await
                    .map_err(pg)?;
            }
            Ok::<_, StoreError>(changed)
        })?;
        Ok(changed > 0)
    }

    async fn members(&self, roster: Roster) -> Result<Vec<Member>, StoreError> {
        let sql = roster::statements(roster, '$').all;
        let rows = on_connection!(self, |conn| conn.query(sql.as_str(), &[]))?;
        rows.iter().map(|r| member_row(roster, r)).collect()
    }

    async fn put_decision(&self, d: &DecisionRecord) -> Result<(), StoreError> {
        let row = decision::to_row(d)?;
        let sql = decision::insert(&row, '$');
        let (approver, server) = (text(&d.approver), text(&d.server));
        let (tenant, tool, target) = (text(&d.tenant), text(&d.tool), text(&d.target));
        let (approver, server) = (approver.as_ref(), server.as_ref());
        let (tenant, tool, target) = (tenant.as_ref(), tool.as_ref(), target.as_ref());
        let signature = row.signature.as_slice();
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
            &approver,
            &server,
            &row.request,
            &row.verdict,
            &row.plan,
            &tenant,
            &tool,
            &target,
            &row.class,
            &row.expires_at_ms,
            &signature,
            &row.decided_at_ms,
        ];
        let assertion = row
            .assertion
            .as_ref()
            .map(|(c, a, d)| (c.as_slice(), a.as_slice(), d.as_slice()));
        if let Some((credential, data, client)) = &assertion {
            params.extend([
                credential as &(dyn tokio_postgres::types::ToSql + Sync),
                data,
                client,
            ]);
        }
        on_connection!(self, |conn| conn.execute(sql.as_str(), &params)).map(|_| ())
    }

    async fn decisions(&self, limit: usize) -> Result<Vec<DecisionRecord>, StoreError> {
        let limit = limit.min(MAX_DECISION_ROWS) as i64;
        let sql = decision::newest('$');
        let rows = on_connection!(self, |conn| conn.query(sql.as_str(), &[&limit]))?;
        let mut kept = rows
            .iter()
            .map(decision_row)
            .collect::<Result<Vec<_>, _>>()?;
        kept.reverse();
        Ok(kept)
    }

    async fn share_waiting(
        &self,
        w: &WaitingCall,
        adopt_since: u64,
    ) -> Result<SharedRow, StoreError> {
        let (local, arrived, expires, since) = (
            ms_to_sql(w.local_id)?,
            ms_to_sql(w.arrived_at_ms)?,
            ms_to_sql(w.expires_at_ms)?,
            ms_to_sql(adopt_since)?,
        );
        let (replica, server, tenant, request) = (
            text(&w.replica),
            text(&w.server),
            text(&w.tenant),
            text(&w.request),
        );
        let (plan, approvers) = (w.plan.to_hex(), i64::from(w.approvers));
        // See crate::waiting: the first statement stops a long-lapsed row being joined; the
        // second writes the call, or (the unique index over the `joinable` mark refusing a
        // second row of one call) answers the row already there, under its lock, so replicas
        // sharing one call at once meet on one row. Each statement is atomic on its own, and
        // each is its own implicit transaction with a one-row answer: the kind CockroachDB
        // retries itself on a serialization failure (40001) before answering, so neither is
        // wrapped in a transaction of ours (which would hand such retries to us). Not tried on
        // CockroachDB or YugabyteDB here.
        let row = on_connection!(self, |conn| async {
            conn.execute(
                SHARING.retire.as_str(),
                &[&server.as_ref(), &tenant.as_ref(), &plan, &since],
            )
            .await?;
            conn.query_one(
                SHARING.share.as_str(),
                &[
                    &replica.as_ref(),
                    &local,
                    &server.as_ref(),
                    &tenant.as_ref(),
                    &plan,
                    &request.as_ref(),
                    &approvers,
                    &arrived,
                    &expires,
                ],
            )
            .await
        })?;
        Ok(waiting::shared_row(w, waiting_row(&row)?))
    }

    async fn waiting_calls(&self, server: &str, now: u64) -> Result<Vec<WaitingCall>, StoreError> {
        let (server, now) = (text(server), ms_to_sql(now)?);
        let sql = waiting_sql("server = $1 AND verdict IS NULL AND expires_at_ms > $2");
        let rows = on_connection!(self, |conn| conn
            .query(sql.as_str(), &[&server.as_ref(), &now]))?;
        rows.iter().map(waiting_row).collect()
    }

    async fn waiting_call(&self, id: u64) -> Result<Option<WaitingCall>, StoreError> {
        let id = ms_to_sql(id)?;
        let sql = waiting_sql("id = $1");
        let rows = on_connection!(self, |conn| conn.query(sql.as_str(), &[&id]))?;
        rows.iter().map(waiting_row).next().transpose()
    }

    async fn waiting_calls_by_id(&self, ids: &[u64]) -> Result<Vec<WaitingCall>, StoreError> {
        let ids = ids
            .iter()
            .take(MAX_WAITING_ROWS)
            .map(|id| ms_to_sql(*id))
            .collect::<Result<Vec<i64>, _>>()?;
        let sql = waiting_sql("id = ANY($1)");
        let rows = on_connection!(self, |conn| conn.query(sql.as_str(), &[&ids]))?;
        rows.iter().map(waiting_row).collect()
    }

    async fn decide_waiting(
        &self,
        id: u64,
        verdict: Verdict,
        note: Option<&str>,
        until: u64,
    ) -> Result<bool, StoreError> {
        let (id, until) = (ms_to_sql(id)?, ms_to_sql(until)?);
        let note = note.map(text);
        let note = note.as_deref();
        let changed = on_connection!(self, |conn| conn.execute(
            "UPDATE waiting_call SET verdict = $2, note = $3, expires_at_ms = $4,
                 joinable = CASE WHEN $2 = 'deny' THEN NULL ELSE joinable END
             WHERE id = $1 AND verdict IS NULL",
            &[&id, &verdict.code(), &note, &until],
        ))?;
        Ok(changed == 1)
    }

    async fn claim_mint(&self, id: u64, replica: &str) -> Result<bool, StoreError> {
        let (id, replica) = (ms_to_sql(id)?, text(replica));
        let changed = on_connection!(self, |conn| conn.execute(
            "UPDATE waiting_call SET minted_by = $2, joinable = NULL
             WHERE id = $1 AND verdict = 'approve' AND minted_by IS NULL",
            &[&id, &replica.as_ref()],
        ))?;
        Ok(changed == 1)
    }

    async fn prune_waiting(&self, before: u64) -> Result<usize, StoreError> {
        let before = ms_to_sql(before)?;
        let pruned = on_connection!(self, |conn| conn.execute(
            "DELETE FROM waiting_call WHERE expires_at_ms < $1",
            &[&before]
        ))?;
        Ok(pruned as usize)
    }

    async fn forget_waiting(&self, id: u64) -> Result<(), StoreError> {
        let id = ms_to_sql(id)?;
        on_connection!(self, |conn| conn
            .execute("DELETE FROM waiting_call WHERE id = $1", &[&id]))
        .map(|_| ())
    }

    async fn remove_waiting(&self, replica: &str, local_id: u64) -> Result<(), StoreError> {
        let (replica, local) = (text(replica), ms_to_sql(local_id)?);
        on_connection!(self, |conn| conn.execute(
            "DELETE FROM waiting_call WHERE replica = $1 AND local_id = $2",
            &[&replica.as_ref(), &local],
        ))
        .map(|_| ())
    }

    async fn refresh_waiting(&self, replica: &str, until: u64) -> Result<(), StoreError> {
        let (replica, until) = (text(replica), ms_to_sql(until)?);
        on_connection!(self, |conn| conn.execute(
            "UPDATE waiting_call SET expires_at_ms = $2 WHERE replica = $1 AND verdict IS NULL",
            &[&replica.as_ref(), &until],
        ))
        .map(|_| ())
    }

    async fn keep_waiting(&self, ids: &[u64], until: u64) -> Result<(), StoreError> {
        let until = ms_to_sql(until)?;
        let ids = ids
            .iter()
            .take(MAX_WAITING_ROWS)
            .map(|id| ms_to_sql(*id))
            .collect::<Result<Vec<i64>, _>>()?;
        on_connection!(self, |conn| conn.execute(
            "UPDATE waiting_call SET expires_at_ms = $2 WHERE id = ANY($1) AND verdict IS NULL",
            &[&ids, &until],
        ))
        .map(|_| ())
    }

    async fn approved_by(
        &self,
        server: &str,
        request: u64,
        plan: &PlanHash,
    ) -> Result<Vec<String>, StoreError> {
        let (server, request, plan) = (text(server), ms_to_sql(request)?, plan.to_hex());
        let sql = decision::approvers_of('$');
        let rows = on_connection!(self, |conn| conn
            .query(sql.as_str(), &[&server.as_ref(), &request, &plan],))?;
        rows.iter()
            .map(|r| r.try_get(0).map_err(StoreError::Postgres))
            .collect()
    }

    async fn put_passkey(&self, p: &Passkey) -> Result<bool, StoreError> {
        let (counter, created) = passkey::checked(p)?;
        let sql = passkey::statements('$').insert;
        let name = text(&p.approver);
        let (id, credential) = (p.credential_id.as_slice(), text(&p.credential));
        let inserted = on_connection!(self, |conn| conn.execute(
            sql.as_str(),
            &[
                &name.as_ref(),
                &id,
                &credential.as_ref(),
                &counter,
                &created
            ],
        ))?;
        Ok(inserted == 1)
    }

    async fn passkey(&self, id: &[u8]) -> Result<Option<Passkey>, StoreError> {
        let sql = passkey::statements('$').by_id;
        let row = on_connection!(self, |conn| conn.query_opt(sql.as_str(), &[&id]))?;
        row.map(|r| passkey_row(&r)).transpose()
    }

    async fn passkeys(&self) -> Result<Vec<Passkey>, StoreError> {
        let sql = passkey::statements('$').all;
        let rows = on_connection!(self, |conn| conn.query(sql.as_str(), &[]))?;
        rows.iter().map(passkey_row).collect()
    }

    async fn advance_passkey(&self, id: &[u8], counter: u32) -> Result<bool, StoreError> {
        let sql = passkey::statements('$').advance;
        let counter = i64::from(counter);
        let changed = on_connection!(self, |conn| conn.execute(sql.as_str(), &[&id, &counter]))?;
        Ok(changed == 1)
    }

    async fn put_invite(&self, invite: &Invite) -> Result<bool, StoreError> {
        let (created, expires) = passkey::checked_invite(invite)?;
        let sql = passkey::statements('$').put_invite;
        let (hash, name) = (invite.hash.as_slice(), text(&invite.approver));
        let inserted = on_connection!(self, |conn| conn
            .execute(sql.as_str(), &[&hash, &name.as_ref(), &created, &expires],))?;
        Ok(inserted == 1)
    }

    async fn invite(&self, hash: &[u8; 32]) -> Result<Option<Invite>, StoreError> {
        let sql = passkey::statements('$').invite;
        let hash = hash.as_slice();
        let row = on_connection!(self, |conn| conn.query_opt(sql.as_str(), &[&hash]))?;
        row.map(|r| invite_row(&r)).transpose()
    }

    async fn begin_invite(
        &self,
        hash: &[u8; 32],
        ceremony: &str,
        now: u64,
    ) -> Result<bool, StoreError> {
        if ceremony.len() > passkey::MAX_CEREMONY_BYTES {
            return Err(StoreError::InvalidRow {
                table: "approver_invite",
                reason: "a ceremony over 16 KiB".into(),
            });
        }
        let sql = passkey::statements('$').begin_invite;
        let (hash, ceremony, now) = (hash.as_slice(), text(ceremony), ms_to_sql(now)?);
        let changed = on_connection!(self, |conn| conn
            .execute(sql.as_str(), &[&hash, &ceremony.as_ref(), &now],))?;
        Ok(changed == 1)
    }

    async fn take_budget(
        &self,
        key: &str,
        window_start_ms: u64,
        amount: u64,
        limit: u64,
        prune_before_ms: u64,
    ) -> Result<bool, StoreError> {
        let sql = budget::statements('$');
        let before = ms_to_sql(prune_before_ms)?;
        on_connection!(self, |conn| conn.execute(sql.prune.as_str(), &[&before]))?;
        let Some((start, amount, limit)) = budget::checked(window_start_ms, amount, limit)? else {
            return Ok(false);
        };
        let row = on_connection!(self, |conn| conn
            .query_opt(sql.take.as_str(), &[&key, &start, &amount, &limit]))?;
        Ok(row.is_some())
    }

    async fn use_invite(&self, hash: &[u8; 32], now: u64) -> Result<Option<Invite>, StoreError> {
        let sql = passkey::statements('$').use_invite;
        let (hash, now) = (hash.as_slice(), ms_to_sql(now)?);
        let row = on_connection!(self, |conn| conn.query_opt(sql.as_str(), &[&hash, &now]))?;
        row.map(|r| invite_row(&r)).transpose()
    }

    async fn put_challenge(
        &self,
        challenge: &[u8; 32],
        expires_at_ms: u64,
        now: u64,
    ) -> Result<(), StoreError> {
        let sql = passkey::statements('$');
        let (challenge, expires, now) = (
            challenge.as_slice(),
            ms_to_sql(expires_at_ms)?,
            ms_to_sql(now)?,
        );
        on_connection!(self, |conn| conn
            .execute(sql.prune_challenges.as_str(), &[&now]))?;
        on_connection!(self, |conn| conn
            .execute(sql.put_challenge.as_str(), &[&challenge, &expires],))
        .map(|_| ())
    }

    async fn take_challenge(&self, challenge: &[u8; 32], now: u64) -> Result<bool, StoreError> {
        let sql = passkey::statements('$').take_challenge;
        let (challenge, now) = (challenge.as_slice(), ms_to_sql(now)?);
        let taken = on_connection!(self, |conn| conn.execute(sql.as_str(), &[&challenge, &now]))?;
        Ok(taken == 1)
    }
}

fn waiting_sql(filter: &str) -> String {
    format!(
        "SELECT {} FROM waiting_call WHERE {filter} ORDER BY id LIMIT {}",
        waiting::COLUMNS,
        MAX_WAITING_ROWS
    )
}

fn waiting_row(r: &tokio_postgres::Row) -> Result<WaitingCall, StoreError> {
    let get = |r: &tokio_postgres::Row| -> Result<waiting::Row, tokio_postgres::Error> {
        Ok((
            (
                r.try_get(0)?,
                r.try_get(1)?,
                r.try_get(2)?,
                r.try_get(3)?,
                r.try_get(4)?,
                r.try_get(5)?,
            ),
            (
                r.try_get(6)?,
                r.try_get(7)?,
                r.try_get(8)?,
                r.try_get(9)?,
                r.try_get(10)?,
                r.try_get(11)?,
            ),
            r.try_get(12)?,
        ))
    };
    waiting::from_row(get(r).map_err(StoreError::Postgres)?)
}

fn member_row(roster: Roster, r: &tokio_postgres::Row) -> Result<Member, StoreError> {
    let get = |r: &tokio_postgres::Row| -> Result<_, tokio_postgres::Error> {
        Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?))
    };
    let (name, key, created, revoked) = get(r).map_err(StoreError::Postgres)?;
    roster::from_row(roster, name, key, created, revoked)
}

fn decision_row(r: &tokio_postgres::Row) -> Result<DecisionRecord, StoreError> {
    let get = |r: &tokio_postgres::Row| -> Result<_, tokio_postgres::Error> {
        Ok(decision::Raw {
            approver: r.try_get(0)?,
            server: r.try_get(1)?,
            request: r.try_get(2)?,
            verdict: r.try_get(3)?,
            plan: r.try_get(4)?,
            tenant: r.try_get(5)?,
            tool: r.try_get(6)?,
            target: r.try_get(7)?,
            class: r.try_get(8)?,
            expires_at_ms: r.try_get(9)?,
            signature: r.try_get(10)?,
            decided_at_ms: r.try_get(11)?,
            credential_id: r.try_get(12)?,
            authenticator_data: r.try_get(13)?,
            client_data: r.try_get(14)?,
        })
    };
    decision::from_row(get(r).map_err(StoreError::Postgres)?)
}

fn passkey_row(r: &tokio_postgres::Row) -> Result<Passkey, StoreError> {
    let get = |r: &tokio_postgres::Row| -> Result<_, tokio_postgres::Error> {
        Ok((
            r.try_get(0)?,
            r.try_get(1)?,
            r.try_get(2)?,
            r.try_get(3)?,
            r.try_get(4)?,
            r.try_get(5)?,
        ))
    };
    let (a, i, c, n, t, v) = get(r).map_err(StoreError::Postgres)?;
    passkey::from_row(a, i, c, n, t, v)
}

fn invite_row(r: &tokio_postgres::Row) -> Result<Invite, StoreError> {
    let get = |r: &tokio_postgres::Row| -> Result<_, tokio_postgres::Error> {
        Ok((
            r.try_get(0)?,
            r.try_get(1)?,
            r.try_get(2)?,
            r.try_get(3)?,
            r.try_get(4)?,
            r.try_get(5)?,
        ))
    };
    let (h, a, c, e, s, u) = get(r).map_err(StoreError::Postgres)?;
    passkey::invite_from_row(h, a, c, e, s, u)
}
