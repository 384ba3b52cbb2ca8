//! The records the engine keeps, behind one trait with two real implementations.
//!
//! The desk keeps its records in one SQLite file ([`Sqlite`], over [`Store`]); `countersign serve`
//! runs the same engine on several machines at once, so its records must live in one database
//! that every replica shares ([`Postgres`](crate::Postgres), behind the `postgres` feature). The
//! engine holds an `Arc<dyn Records>` and does not know which: the promises it relies on (a nonce
//! spends once however many replicas present it, an approval is never overwritten, history is
//! newest first, a row expiring exactly at `now` survives a prune) are the trait's, and one test
//! suite holds both implementations to them.
//!
//! The methods are async because a network database answers later; SQLite's answers are
//! immediate, so [`Sqlite`] does its work inline under its lock (its waits are bounded by the
//! store's busy timeout, as they are on the desk today).

use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use countersign_core::approver::Verdict;
use countersign_core::chain::{Break, Intact, Walk};
use countersign_core::telemetry::ConfirmEvent;
use countersign_core::{Ledger, Nonce, PlanHash, SpendError};

use crate::{
    Accepted, Approval, DecisionRecord, ExportStatus, Grant, GrantEnd, HistoryFilter, Invite,
    Member, Passkey, Pruned, Recorded, Roster, SharedRow, Store, StoreError, ToolPin, WaitingCall,
};

/// Everything the engine keeps durably: the single-use nonce ledger, the arguments people
/// approved, the history of confirmation events, pinned tool definitions, grants, and the
/// accepted text of the files a person may edit.
///
/// Times are parameters, in milliseconds since the Unix epoch; no implementation reads the clock.
#[async_trait]
pub trait Records: Send + Sync + std::fmt::Debug {
    /// Records `nonce` as spent, durably, before the action it guards runs: ONE insert whose
    /// duplicate is the replay ([`SpendError::AlreadySpent`]). Anything that keeps the store from
    /// vouching for the spend is [`SpendError::Unreachable`], and the caller must refuse.
    /// `expires_at_ms` is the token's expiry, after which [`Records::prune`] may forget the row.
    async fn spend(&self, nonce: &Nonce, expires_at_ms: u64) -> Result<(), SpendError>;

    /// What an accepted works-once confirm writes: spends `nonce` as [`Records::spend`] does
    /// (the same refusals), and only when it is spent now, records `accepted` as
    /// [`Records::record`] does. `Ok(recorded)`: spent, and `recorded` says how the event's
    /// write went (emitted either way). On a refusal nothing is recorded: the caller records why.
    ///
    /// Here (the desk's file, where a spend is a local commit) the spend and then the record.
    /// PostgreSQL overrides it to put both in one transaction, so a confirm costs the database one
    /// commit rather than two; there the event is written only with the spend, never without it.
    async fn spend_recording(
        &self,
        nonce: &Nonce,
        expires_at_ms: u64,
        accepted: &ConfirmEvent,
    ) -> Result<Result<(), StoreError>, SpendError> {
        self.spend(nonce, expires_at_ms).await?;
        Ok(self.record(accepted).await)
    }

    /// Stores `approval` durably. A second approval under the same nonce is refused with
    /// [`StoreError::ApprovalExists`] (what a person approved is never replaced), and one of
    /// class `open` with [`StoreError::UngatedApproval`].
    async fn put_approval(&self, approval: &Approval) -> Result<(), StoreError>;

    /// The approval stored under `nonce`, or `None` (never stored, withdrawn, or pruned).
    async fn approval(&self, nonce: &Nonce) -> Result<Option<Approval>, StoreError>;

    /// Takes back the approval under `nonce` before its token expires; answers whether one was
    /// there.
    async fn withdraw_approval(&self, nonce: &Nonce) -> Result<bool, StoreError>;

    /// Records `event` in history and emits it to `tracing` (target `confirm`) once, whether or
    /// not the write succeeds; the write's failure is returned.
    async fn record(&self, event: &ConfirmEvent) -> Result<(), StoreError>;

    /// Recorded events that pass `filter`, newest first (by time, then by order of recording).
    async fn history(&self, filter: &HistoryFilter) -> Result<Vec<ConfirmEvent>, StoreError>;

    /// Checks the history's chain with `walk`, as one snapshot (see
    /// [`HistoryReader::verify`](crate::HistoryReader::verify)): the outer error is the store's,
    /// the inner one names the first event at which the chain breaks.
    async fn verify_history(&self, walk: Walk) -> Result<Result<Intact, Break>, StoreError>;

    /// Takes (or keeps) the right to send history to telemetry `sink` until `now_ms +
    /// lease_ms`, for `holder`, creating the sink's cursor at the start of history when there is
    /// none; answers the cursor while `holder` holds the lease (see [`crate::ExportStatus`]).
    async fn export_claim(
        &self,
        sink: &str,
        holder: &str,
        now_ms: u64,
        lease_ms: u64,
    ) -> Result<Option<u64>, StoreError>;

    /// At most `limit` events after chain number `seq`, in chain order, with their places.
    async fn recorded_after(&self, seq: u64, limit: u32) -> Result<Vec<Recorded>, StoreError>;

    /// Moves `sink`'s cursor from `from` to `to` (the sink acknowledged the events between) if
    /// `holder` holds the lease and nobody moved it meanwhile; answers whether it moved.
    async fn export_advance(
        &self,
        sink: &str,
        holder: &str,
        from: u64,
        to: u64,
    ) -> Result<bool, StoreError>;

    /// Notes that sending to `sink` failed at `now_ms` with `error`.
    async fn export_failed(&self, sink: &str, now_ms: u64, error: &str) -> Result<(), StoreError>;

    /// `sink`'s cursor and how many events wait for it; `None` when it has none.
    async fn export_status(&self, sink: &str) -> Result<Option<ExportStatus>, StoreError>;

    /// Forgets `sink` (no longer configured), so that its cursor holds back no prune.
    async fn export_forget(&self, sink: &str) -> Result<(), StoreError>;

    /// Deletes spent nonces and approvals that expired strictly before `now_ms` (one expiring
    /// exactly at `now_ms` is kept), history beyond the newest
    /// [`MAX_HISTORY_ROWS`](crate::MAX_HISTORY_ROWS) events and tool pins beyond the newest
    /// [`MAX_PINS`](crate::MAX_PINS) (never a registered server's); says how many of each.
    async fn prune(&self, now_ms: u64) -> Result<Pruned, StoreError>;

    /// The pins in force for `candidates`, pinning as given those of servers never seen before
    /// (at most [`MAX_PINS_PER_SERVER`](crate::MAX_PINS_PER_SERVER) per server); an existing pin
    /// is never replaced here. See [`Store::pin_first_seen`].
    async fn pin_first_seen(&self, candidates: &[ToolPin]) -> Result<Vec<ToolPin>, StoreError>;

    /// Replaces the pin of `pin.server`'s `pin.tool` (the person accepted a changed definition).
    async fn repin(&self, pin: &ToolPin) -> Result<(), StoreError>;

    /// The pin of `server`'s `tool`, if there is one.
    async fn tool_pin(&self, server: &str, tool: &str) -> Result<Option<ToolPin>, StoreError>;

    /// Stores `grant` and answers its number, unless `max_live` grants already live at `now`:
    /// then nothing is stored and the answer is `None`. The count and the insert are one
    /// transaction, so two racing clicks cannot pass the cap together.
    async fn put_grant(
        &self,
        grant: &Grant,
        max_live: usize,
        now: u64,
    ) -> Result<Option<u64>, StoreError>;

    /// The grants live at `now` (not ended, expiring after `now`), oldest first.
    async fn live_grants(&self, now: u64) -> Result<Vec<Grant>, StoreError>;

    /// Grant `id`, live or not.
    async fn grant(&self, id: u64) -> Result<Option<Grant>, StoreError>;

    /// Ends grant `id` at `now` for `why`; answers whether it was live until then.
    async fn end_grant(&self, id: u64, now: u64, why: GrantEnd) -> Result<bool, StoreError>;

    /// Ends the prefix grants of connection `tenant` (every connection's: `None`) still live at
    /// `now`; answers how many.
    async fn end_prefix_grants(
        &self,
        tenant: Option<&str>,
        now: u64,
        why: GrantEnd,
    ) -> Result<usize, StoreError>;

    /// Counts one call approved by grant `id`.
    async fn grant_used(&self, id: u64) -> Result<(), StoreError>;

    /// The text of the file `name` as last accepted, if it ever was.
    async fn accepted(&self, name: &str) -> Result<Option<Accepted>, StoreError>;

    /// Records `text` as the accepted text of the file `name` (refused past
    /// [`MAX_ACCEPTED_BYTES`](crate::MAX_ACCEPTED_BYTES)).
    async fn accept(&self, name: &str, text: &str, at_ms: u64) -> Result<(), StoreError>;

    /// Records `text` as the accepted text of `name` only if what is on record is still
    /// `expected` (`None`: nothing yet), in one statement: `false`, and nothing written, if it
    /// moved. For a change approved as "from this text to that one", which must not replace a
    /// text the approvers never saw.
    async fn replace_accepted(
        &self,
        name: &str,
        expected: Option<&str>,
        text: &str,
        at_ms: u64,
    ) -> Result<bool, StoreError>;

    /// Adds a member to `roster`. `false`: that name or that key is on the roster already
    /// (revoked or not), and nothing was written.
    async fn put_member(&self, roster: Roster, member: &Member) -> Result<bool, StoreError>;

    /// The member of `roster` whose key is `key`, revoked or not.
    async fn member(&self, roster: Roster, key: &[u8; 32]) -> Result<Option<Member>, StoreError>;

    /// Revokes member `name` of `roster`. `false`: no such member, or revoked already.
    async fn revoke_member(&self, roster: Roster, name: &str, now: u64)
    -> Result<bool, StoreError>;

    /// Every member of `roster`, by name.
    async fn members(&self, roster: Roster) -> Result<Vec<Member>, StoreError>;

    /// Keeps an approver's verified decision.
    async fn put_decision(&self, decision: &DecisionRecord) -> Result<(), StoreError>;

    /// The newest `limit` decisions (at most [`MAX_DECISION_ROWS`](crate::MAX_DECISION_ROWS)),
    /// oldest first.
    async fn decisions(&self, limit: usize) -> Result<Vec<DecisionRecord>, StoreError>;

    /// Shares a call waiting on a team's server: writes it under a new number, or joins the row
    /// of the same call (server, tenant, plan) still to be had (undecided, or approved with no
    /// token minted, and in sight after `adopt_since`), moving an undecided row's expiry on to
    /// the call's. At once: replicas sharing one call at the same moment get one row. A call
    /// shared again by its own replica answers its row again; writing a new row under a
    /// replica's local id already on record is an error.
    async fn share_waiting(
        &self,
        call: &WaitingCall,
        adopt_since: u64,
    ) -> Result<SharedRow, StoreError>;

    /// The undecided calls of `server` that desks may still see at `now`, oldest first.
    async fn waiting_calls(&self, server: &str, now: u64) -> Result<Vec<WaitingCall>, StoreError>;

    /// Waiting call `id`, decided or not.
    async fn waiting_call(&self, id: u64) -> Result<Option<WaitingCall>, StoreError>;

    /// The waiting calls among `ids` that are on record, decided or not: one read for all (at
    /// most [`crate::MAX_WAITING_ROWS`] ids are read).
    async fn waiting_calls_by_id(&self, ids: &[u64]) -> Result<Vec<WaitingCall>, StoreError>;

    /// Records `verdict` on waiting call `id` unless it has one: `false` then (the first
    /// verdict stands). The decided call stays on record until `until`.
    async fn decide_waiting(
        &self,
        id: u64,
        verdict: Verdict,
        note: Option<&str>,
        until: u64,
    ) -> Result<bool, StoreError>;

    /// Claims the minting of approved call `id`'s token for `replica`: `true` for exactly one.
    async fn claim_mint(&self, id: u64, replica: &str) -> Result<bool, StoreError>;

    /// Waiting call `id` goes.
    async fn forget_waiting(&self, id: u64) -> Result<(), StoreError>;

    /// Forgets every waiting call that left desks' sight before `before`; answers how many.
    async fn prune_waiting(&self, before: u64) -> Result<usize, StoreError>;

    /// `replica`'s call `local_id` left its queue.
    async fn remove_waiting(&self, replica: &str, local_id: u64) -> Result<(), StoreError>;

    /// `replica` lives: its undecided calls stay visible until `until`.
    async fn refresh_waiting(&self, replica: &str, until: u64) -> Result<(), StoreError>;

    /// The undecided calls among `ids` (at most [`crate::MAX_WAITING_ROWS`]) stay visible until
    /// `until`: a live replica holds each of them, whichever replica wrote its row.
    async fn keep_waiting(&self, ids: &[u64], until: u64) -> Result<(), StoreError>;

    /// The distinct approvers whose kept decisions approve `request` of `server` over `plan`
    /// (a person's desk and passkeys count once: decisions name the approver).
    async fn approved_by(
        &self,
        server: &str,
        request: u64,
        plan: &PlanHash,
    ) -> Result<Vec<String>, StoreError>;

    /// Enrolls `passkey`; `false`: its credential is on the roster already.
    async fn put_passkey(&self, passkey: &Passkey) -> Result<bool, StoreError>;

    /// The passkey with credential id `id`, revoked or not.
    async fn passkey(&self, id: &[u8]) -> Result<Option<Passkey>, StoreError>;

    /// Every passkey, by approver.
    async fn passkeys(&self) -> Result<Vec<Passkey>, StoreError>;

    /// Moves the unrevoked passkey `id`'s counter forward to `counter`, in one statement (two
    /// replicas cannot both move it to the same value); `false`: the assertion must not count.
    async fn advance_passkey(&self, id: &[u8], counter: u32) -> Result<bool, StoreError>;

    /// Keeps `invite`; `false`: its hash exists already.
    async fn put_invite(&self, invite: &Invite) -> Result<bool, StoreError>;

    /// The invite whose link hashes to `hash`.
    async fn invite(&self, hash: &[u8; 32]) -> Result<Option<Invite>, StoreError>;

    /// Keeps the registration `ceremony` begun with the unused, unexpired invite `hash`.
    async fn begin_invite(
        &self,
        hash: &[u8; 32],
        ceremony: &str,
        now: u64,
    ) -> Result<bool, StoreError>;

    /// Uses up the begun, unused, unexpired invite `hash` at `now`, once.
    async fn use_invite(&self, hash: &[u8; 32], now: u64) -> Result<Option<Invite>, StoreError>;

    /// Takes `amount` of budget `key`'s window starting at `window_start_ms`, which holds
    /// `limit`, in one statement: `true` when it fit (and is taken), `false` when it did not.
    /// Windows that started before `prune_before_ms` are forgotten first.
    async fn take_budget(
        &self,
        key: &str,
        window_start_ms: u64,
        amount: u64,
        limit: u64,
        prune_before_ms: u64,
    ) -> Result<bool, StoreError>;

    /// Keeps a sign-in `challenge` until `expires_at_ms` (and forgets the expired ones).
    async fn put_challenge(
        &self,
        challenge: &[u8; 32],
        expires_at_ms: u64,
        now: u64,
    ) -> Result<(), StoreError>;

    /// Takes the sign-in `challenge` once; `false` if it is unknown, used or expired.
    async fn take_challenge(&self, challenge: &[u8; 32], now: u64) -> Result<bool, StoreError>;
}

/// The desk's SQLite [`Store`] as [`Records`]: one connection behind a mutex, used on tokio's
/// blocking pool. A statement may wait for SQLite's lock (up to the busy timeout) or for the
/// disk: never on an async worker, where it would stall every other agent and the window.
#[derive(Debug)]
pub struct Sqlite {
    store: Arc<Mutex<Store>>,
}

impl Sqlite {
    /// `store` as records.
    pub fn new(store: Store) -> Self {
        Sqlite {
            store: Arc::new(Mutex::new(store)),
        }
    }

    /// The records of the SQLite file at `path`, opened when first used: a file that cannot
    /// open now is reported by each operation (which then fails closed) and tried again next
    /// time, rather than keeping a desk from starting ([`Store::open_deferred`]).
    pub fn open_deferred(path: impl AsRef<std::path::Path>, options: crate::StoreOptions) -> Self {
        Sqlite::new(Store::open_deferred(path.as_ref(), options))
    }

    /// The store, for what only SQLite has (its path, whether it is connected).
    ///
    /// A panic while the lock was held leaves the store as SQLite left it (every write is one
    /// transaction, rolled back unless committed), so a poisoned lock is taken over, not
    /// propagated.
    pub fn lock(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }

    /// Runs `op` on the store on the blocking pool, and answers what it answers (a panic in it
    /// goes on as a panic here).
    async fn off<T: Send + 'static>(&self, op: impl FnOnce(&mut Store) -> T + Send + 'static) -> T {
        let store = Arc::clone(&self.store);
        // What the store logs (every confirm event goes to tracing) keeps the caller's
        // subscriber and span, on whichever thread of the pool it runs.
        let dispatch = tracing::dispatcher::get_default(Clone::clone);
        let span = tracing::Span::current();
        let run = move || {
            tracing::dispatcher::with_default(&dispatch, || span.in_scope(|| op(&mut lock(&store))))
        };
        match tokio::task::spawn_blocking(run).await {
            Ok(value) => value,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}

fn lock(store: &Mutex<Store>) -> MutexGuard<'_, Store> {
    countersign_core::sync::lock(store)
}

impl From<Store> for Sqlite {
    fn from(store: Store) -> Self {
        Sqlite::new(store)
    }
}

#[async_trait]
impl Records for Sqlite {
    async fn spend(&self, nonce: &Nonce, expires_at_ms: u64) -> Result<(), SpendError> {
        let nonce = *nonce;
        self.off(move |s| s.spend(&nonce, expires_at_ms)).await
    }

    async fn put_approval(&self, approval: &Approval) -> Result<(), StoreError> {
        let approval = approval.clone();
        self.off(move |s| s.put_approval(&approval)).await
    }

    async fn approval(&self, nonce: &Nonce) -> Result<Option<Approval>, StoreError> {
        let nonce = *nonce;
        self.off(move |s| s.approval(&nonce)).await
    }

    async fn withdraw_approval(&self, nonce: &Nonce) -> Result<bool, StoreError> {
        let nonce = *nonce;
        self.off(move |s| s.withdraw_approval(&nonce)).await
    }

    async fn record(&self, event: &ConfirmEvent) -> Result<(), StoreError> {
        let event = event.clone();
        self.off(move |s| s.record(&event)).await
    }

    async fn history(&self, filter: &HistoryFilter) -> Result<Vec<ConfirmEvent>, StoreError> {
        let filter = filter.clone();
        self.off(move |s| s.history(&filter)).await
    }

    async fn verify_history(&self, walk: Walk) -> Result<Result<Intact, Break>, StoreError> {
        self.off(move |s| s.verify_history(walk)).await
    }

    async fn prune(&self, now_ms: u64) -> Result<Pruned, StoreError> {
        self.off(move |s| s.prune(now_ms)).await
    }

    async fn export_claim(
        &self,
        sink: &str,
        holder: &str,
        now_ms: u64,
        lease_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let (sink, holder) = (sink.to_owned(), holder.to_owned());
        self.off(move |s| s.export_claim(&sink, &holder, now_ms, lease_ms))
            .await
    }

    async fn recorded_after(&self, seq: u64, limit: u32) -> Result<Vec<Recorded>, StoreError> {
        self.off(move |s| s.recorded_after(seq, limit)).await
    }

    async fn export_advance(
        &self,
        sink: &str,
        holder: &str,
        from: u64,
        to: u64,
    ) -> Result<bool, StoreError> {
        let (sink, holder) = (sink.to_owned(), holder.to_owned());
        self.off(move |s| s.export_advance(&sink, &holder, from, to))
            .await
    }

    async fn export_failed(&self, sink: &str, now_ms: u64, error: &str) -> Result<(), StoreError> {
        let (sink, error) = (sink.to_owned(), error.to_owned());
        self.off(move |s| s.export_failed(&sink, now_ms, &error))
            .await
    }

    async fn export_status(&self, sink: &str) -> Result<Option<ExportStatus>, StoreError> {
        let sink = sink.to_owned();
        self.off(move |s| s.export_status(&sink)).await
    }

    async fn export_forget(&self, sink: &str) -> Result<(), StoreError> {
        let sink = sink.to_owned();
        self.off(move |s| s.export_forget(&sink)).await
    }

    async fn pin_first_seen(&self, candidates: &[ToolPin]) -> Result<Vec<ToolPin>, StoreError> {
        let candidates = candidates.to_vec();
        self.off(move |s| s.pin_first_seen(&candidates)).await
    }

    async fn repin(&self, pin: &ToolPin) -> Result<(), StoreError> {
        let pin = pin.clone();
        self.off(move |s| s.repin(&pin)).await
    }

    async fn tool_pin(&self, server: &str, tool: &str) -> Result<Option<ToolPin>, StoreError> {
        let (server, tool) = (server.to_owned(), tool.to_owned());
        self.off(move |s| s.tool_pin(&server, &tool)).await
    }

    async fn put_grant(
        &self,
        grant: &Grant,
        max_live: usize,
        now: u64,
    ) -> Result<Option<u64>, StoreError> {
        let grant = grant.clone();
        self.off(move |s| s.put_grant(&grant, max_live, now)).await
    }

    async fn live_grants(&self, now: u64) -> Result<Vec<Grant>, StoreError> {
        self.off(move |s| s.live_grants(now)).await
    }

    async fn grant(&self, id: u64) -> Result<Option<Grant>, StoreError> {
        self.off(move |s| s.grant(id)).await
    }

    async fn end_grant(&self, id: u64, now: u64, why: GrantEnd) -> Result<bool, StoreError> {
        self.off(move |s| s.end_grant(id, now, why)).await
    }

    async fn end_prefix_grants(
        &self,
        tenant: Option<&str>,
        now: u64,
        why: GrantEnd,
    ) -> Result<usize, StoreError> {
        let tenant = tenant.map(str::to_owned);
        self.off(move |s| s.end_prefix_grants(tenant.as_deref(), now, why))
            .await
    }

    async fn grant_used(&self, id: u64) -> Result<(), StoreError> {
        self.off(move |s| s.grant_used(id)).await
    }

    async fn accepted(&self, name: &str) -> Result<Option<Accepted>, StoreError> {
        let name = name.to_owned();
        self.off(move |s| s.accepted(&name)).await
    }

    async fn accept(&self, name: &str, text: &str, at_ms: u64) -> Result<(), StoreError> {
        let (name, text) = (name.to_owned(), text.to_owned());
        self.off(move |s| s.accept(&name, &text, at_ms)).await
    }

    async fn replace_accepted(
        &self,
        name: &str,
        expected: Option<&str>,
        text: &str,
        at_ms: u64,
    ) -> Result<bool, StoreError> {
        let (name, expected, text) = (
            name.to_owned(),
            expected.map(str::to_owned),
            text.to_owned(),
        );
        self.off(move |s| s.replace_accepted(&name, expected.as_deref(), &text, at_ms))
            .await
    }

    async fn put_member(&self, roster: Roster, member: &Member) -> Result<bool, StoreError> {
        let member = member.clone();
        self.off(move |s| s.put_member(roster, &member)).await
    }

    async fn member(&self, roster: Roster, key: &[u8; 32]) -> Result<Option<Member>, StoreError> {
        let key = *key;
        self.off(move |s| s.member(roster, &key)).await
    }

    async fn revoke_member(
        &self,
        roster: Roster,
        name: &str,
        now: u64,
    ) -> Result<bool, StoreError> {
        let name = name.to_owned();
        self.off(move |s| s.revoke_member(roster, &name, now)).await
    }

    async fn members(&self, roster: Roster) -> Result<Vec<Member>, StoreError> {
        self.off(move |s| s.members(roster)).await
    }

    async fn put_decision(&self, decision: &DecisionRecord) -> Result<(), StoreError> {
        let decision = decision.clone();
        self.off(move |s| s.put_decision(&decision)).await
    }

    async fn decisions(&self, limit: usize) -> Result<Vec<DecisionRecord>, StoreError> {
        self.off(move |s| s.decisions(limit)).await
    }

    async fn share_waiting(
        &self,
        call: &WaitingCall,
        adopt_since: u64,
    ) -> Result<SharedRow, StoreError> {
        let call = call.clone();
        self.off(move |s| s.share_waiting(&call, adopt_since)).await
    }

    async fn waiting_calls(&self, server: &str, now: u64) -> Result<Vec<WaitingCall>, StoreError> {
        let server = server.to_owned();
        self.off(move |s| s.waiting_calls(&server, now)).await
    }

    async fn waiting_call(&self, id: u64) -> Result<Option<WaitingCall>, StoreError> {
        self.off(move |s| s.waiting_call(id)).await
    }

    async fn waiting_calls_by_id(&self, ids: &[u64]) -> Result<Vec<WaitingCall>, StoreError> {
        let ids = ids.to_vec();
        self.off(move |s| s.waiting_calls_by_id(&ids)).await
    }

    async fn decide_waiting(
        &self,
        id: u64,
        verdict: Verdict,
        note: Option<&str>,
        until: u64,
    ) -> Result<bool, StoreError> {
        let note = note.map(str::to_owned);
        self.off(move |s| s.decide_waiting(id, verdict, note.as_deref(), until))
            .await
    }

    async fn claim_mint(&self, id: u64, replica: &str) -> Result<bool, StoreError> {
        let replica = replica.to_owned();
        self.off(move |s| s.claim_mint(id, &replica)).await
    }

    async fn forget_waiting(&self, id: u64) -> Result<(), StoreError> {
        self.off(move |s| s.forget_waiting(id)).await
    }

    async fn prune_waiting(&self, before: u64) -> Result<usize, StoreError> {
        self.off(move |s| s.prune_waiting(before)).await
    }

    async fn remove_waiting(&self, replica: &str, local_id: u64) -> Result<(), StoreError> {
        let replica = replica.to_owned();
        self.off(move |s| s.remove_waiting(&replica, local_id))
            .await
    }

    async fn refresh_waiting(&self, replica: &str, until: u64) -> Result<(), StoreError> {
        let replica = replica.to_owned();
        self.off(move |s| s.refresh_waiting(&replica, until)).await
    }

    async fn keep_waiting(&self, ids: &[u64], until: u64) -> Result<(), StoreError> {
        let ids = ids.to_vec();
        self.off(move |s| s.keep_waiting(&ids, until)).await
    }

    async fn approved_by(
        &self,
        server: &str,
        request: u64,
        plan: &PlanHash,
    ) -> Result<Vec<String>, StoreError> {
        let (server, plan) = (server.to_owned(), *plan);
        self.off(move |s| s.approved_by(&server, request, &plan))
            .await
    }

    async fn put_passkey(&self, passkey: &Passkey) -> Result<bool, StoreError> {
        let passkey = passkey.clone();
        self.off(move |s| s.put_passkey(&passkey)).await
    }

    async fn passkey(&self, id: &[u8]) -> Result<Option<Passkey>, StoreError> {
        let id = id.to_vec();
        self.off(move |s| s.passkey(&id)).await
    }

    async fn passkeys(&self) -> Result<Vec<Passkey>, StoreError> {
        self.off(|s| s.passkeys()).await
    }

    async fn advance_passkey(&self, id: &[u8], counter: u32) -> Result<bool, StoreError> {
        let id = id.to_vec();
        self.off(move |s| s.advance_passkey(&id, counter)).await
    }

    async fn put_invite(&self, invite: &Invite) -> Result<bool, StoreError> {
        let invite = invite.clone();
        self.off(move |s| s.put_invite(&invite)).await
    }

    async fn invite(&self, hash: &[u8; 32]) -> Result<Option<Invite>, StoreError> {
        let hash = *hash;
        self.off(move |s| s.invite(&hash)).await
    }

    async fn begin_invite(
        &self,
        hash: &[u8; 32],
        ceremony: &str,
        now: u64,
    ) -> Result<bool, StoreError> {
        let (hash, ceremony) = (*hash, ceremony.to_owned());
        self.off(move |s| s.begin_invite(&hash, &ceremony, now))
            .await
    }

    async fn use_invite(&self, hash: &[u8; 32], now: u64) -> Result<Option<Invite>, StoreError> {
        let hash = *hash;
        self.off(move |s| s.use_invite(&hash, now)).await
    }

    async fn take_budget(
        &self,
        key: &str,
        window_start_ms: u64,
        amount: u64,
        limit: u64,
        prune_before_ms: u64,
    ) -> Result<bool, StoreError> {
        let key = key.to_owned();
        self.off(move |s| {
            s.prune_budgets(prune_before_ms)?;
            s.take_budget(&key, window_start_ms, amount, limit)
        })
        .await
    }

    async fn put_challenge(
        &self,
        challenge: &[u8; 32],
        expires_at_ms: u64,
        now: u64,
    ) -> Result<(), StoreError> {
        let challenge = *challenge;
        self.off(move |s| s.put_challenge(&challenge, expires_at_ms, now))
            .await
    }

    async fn take_challenge(&self, challenge: &[u8; 32], now: u64) -> Result<bool, StoreError> {
        let challenge = *challenge;
        self.off(move |s| s.take_challenge(&challenge, now)).await
    }
}
