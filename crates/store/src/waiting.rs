//! Calls waiting for people on a team's server, shared by all its replicas.
//!
//! A gated call waits in the memory of the replica its agent reached: that replica holds the
//! call's arguments and answers the agent. People's desks may reach any replica. So each waiting
//! call is also written here, as the desks see it, under a number every replica agrees on; a
//! desk's decision on any replica is recorded on that row (once: the first verdict stands), and
//! the replica holding the call reads its decided rows and mints (or denies) there. A replica
//! keeps the expiry of every row it holds a call of moving while it lives (its own, and another
//! replica's that its agent asked again for), so a row stays in sight while any live replica
//! holds its call, whichever replica wrote it; a row no live replica holds expires on its own and
//! no desk sees it after that.
//!
//! One call has one row. Sharing a call writes it or, in the same upsert, finds the row of the
//! same call (server, tenant, plan) still to be had, which the database lets exist only once
//! (a unique index over a `joinable` mark that a deny, a minted token or a lapse clears). Two
//! replicas sharing one call at the same moment therefore join one row; two rows would split a
//! call's approvals, each short of the approvers it needs.

use countersign_core::PlanHash;
use countersign_core::approver::Verdict;

use rusqlite::TransactionBehavior;

use crate::error::{ms_from_sql, ms_to_sql};
use crate::{Store, StoreError};

pub(crate) const TABLE: &str = "waiting_call";

/// The most waiting calls read at once.
pub const MAX_WAITING_ROWS: usize = 1_000;

/// One waiting call, as the replicas share it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingCall {
    /// Its number among the server's waiting calls (given by the records; 0 before).
    pub id: u64,
    /// The replica that holds it.
    pub replica: String,
    /// Its id in that replica's queue.
    pub local_id: u64,
    /// The server's name in decisions (its `--approver-url`).
    pub server: String,
    /// Who asks.
    pub tenant: String,
    /// The plan's hash.
    pub plan: PlanHash,
    /// What desks are shown: the request, as JSON.
    pub request: String,
    /// How many distinct approvers must approve it.
    pub approvers: u8,
    /// When it arrived, ms since the epoch.
    pub arrived_at_ms: u64,
    /// Until when desks see it, ms since the epoch.
    pub expires_at_ms: u64,
    /// The decision, once there is one.
    pub verdict: Option<Verdict>,
    /// A deny's note.
    pub note: Option<String>,
    /// The replica that minted the token of its approval, once one did.
    pub minted_by: Option<String>,
}

pub(crate) const COLUMNS: &str = "id, replica, local_id, server, tenant, plan, request, approvers, \
     arrived_at_ms, expires_at_ms, verdict, note, minted_by";

/// What sharing a waiting call came to ([`Store::share_waiting`], and the same on PostgreSQL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedRow {
    /// A row of its own was written, under this number.
    New(u64),
    /// The same call was already shared (by another replica, or asked before): its row, which
    /// the call is now linked to. Undecided, it was kept in sight until the call's expiry.
    Joined(Box<WaitingCall>),
}

/// The row `shared` that sharing `call` came to, as [`SharedRow`]: the call's own if it names
/// the same replica and local id.
pub(crate) fn shared_row(call: &WaitingCall, shared: WaitingCall) -> SharedRow {
    if shared.replica == call.replica && shared.local_id == call.local_id {
        SharedRow::New(shared.id)
    } else {
        SharedRow::Joined(Box::new(shared))
    }
}

/// The two statements that share a call ([`Store::share_waiting`], and the same on PostgreSQL),
/// with parameters spelled `{p}1`, `{p}2`… (`$` or `?`). `joinable` is TRUE (SQLite: 1) on the
/// one row of a call that sharing it again joins, NULL on every other; the unique index over
/// (server, tenant, plan, joinable) lets one row of a call be joinable at a time (NULLs never
/// collide).
pub(crate) struct Sharing {
    /// Lapsed rows of the call (server, tenant, plan: `{p}1` to `{p}3`) that left desks' sight
    /// at or before `{p}4` are no longer joined: the call asked now gets a row of its own.
    pub(crate) retire: String,
    /// Writes the call (`{p}1` to `{p}9`, in the order of the columns named), or, on the
    /// `joinable` conflict, answers the existing row, with its expiry moved on if it is
    /// undecided. Any other conflict (a new row under a replica's local id already on record) is
    /// an error. Answers the row's [`COLUMNS`].
    pub(crate) share: String,
}

/// [`Sharing`] with parameters spelled `{p}1`, `{p}2`…
pub(crate) fn sharing(p: char) -> Sharing {
    Sharing {
        retire: format!(
            "UPDATE waiting_call SET joinable = NULL
             WHERE server = {p}1 AND tenant = {p}2 AND plan = {p}3 AND joinable IS NOT NULL
               AND expires_at_ms <= {p}4"
        ),
        share: format!(
            "INSERT INTO waiting_call (replica, local_id, server, tenant, plan, request,
                 approvers, arrived_at_ms, expires_at_ms, joinable)
             VALUES ({p}1, {p}2, {p}3, {p}4, {p}5, {p}6, {p}7, {p}8, {p}9, TRUE)
             ON CONFLICT (server, tenant, plan, joinable) DO UPDATE SET expires_at_ms =
                 CASE WHEN waiting_call.verdict IS NULL
                           AND excluded.expires_at_ms > waiting_call.expires_at_ms
                      THEN excluded.expires_at_ms ELSE waiting_call.expires_at_ms END
             RETURNING {COLUMNS}"
        ),
    }
}

/// [`sharing`] as SQLite spells it, made once.
static SHARING_SQLITE: std::sync::LazyLock<Sharing> = std::sync::LazyLock::new(|| sharing('?'));

/// A row's columns, as read.
pub(crate) type Row = (
    (i64, String, i64, String, String, String),
    (String, i64, i64, i64, Option<String>, Option<String>),
    Option<String>,
);

pub(crate) fn from_row(
    (
        (id, replica, local_id, server, tenant, plan),
        (request, approvers, arrived, expires, verdict, note),
        minted_by,
    ): Row,
) -> Result<WaitingCall, StoreError> {
    let invalid = |reason: &str| StoreError::InvalidRow {
        table: TABLE,
        reason: reason.to_owned(),
    };
    Ok(WaitingCall {
        id: ms_from_sql(id, TABLE)?,
        replica,
        local_id: ms_from_sql(local_id, TABLE)?,
        server,
        tenant,
        plan: PlanHash::from_hex(&plan).ok_or_else(|| invalid("a plan hash"))?,
        request,
        approvers: u8::try_from(approvers).map_err(|_| invalid("an approver count"))?,
        arrived_at_ms: ms_from_sql(arrived, TABLE)?,
        expires_at_ms: ms_from_sql(expires, TABLE)?,
        verdict: match verdict.as_deref() {
            None => None,
            Some("approve") => Some(Verdict::Approve),
            Some("deny") => Some(Verdict::Deny),
            Some(_) => return Err(invalid("a verdict")),
        },
        note,
        minted_by,
    })
}

/// A row's columns, in [`COLUMNS`]' order, as SQLite gives them.
fn read_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
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
        r.get(12)?,
    ))
}

impl Store {
    /// Shares waiting call `w`: writes it as a new row, or (a row of the same call, the same
    /// `server`, `tenant` and `plan`, is still to be had) joins that row instead and keeps it in
    /// sight until `w.expires_at_ms` if it is undecided. One upsert does both, so replicas
    /// sharing the same call at the same moment (two replicas proposing one edited rules file,
    /// an agent asking again on another replica) get one row, never two rows whose approvals
    /// would count apart. A row is to be had while it is undecided or approved with no token
    /// minted, and was in sight after `adopt_since`; one that lapsed before is no longer joined.
    pub fn share_waiting(
        &mut self,
        w: &WaitingCall,
        adopt_since: u64,
    ) -> Result<SharedRow, StoreError> {
        let (local, arrived, expires, since) = (
            ms_to_sql(w.local_id)?,
            ms_to_sql(w.arrived_at_ms)?,
            ms_to_sql(w.expires_at_ms)?,
            ms_to_sql(adopt_since)?,
        );
        let plan = w.plan.to_hex();
        let row = self.with_connection(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.prepare_cached(&SHARING_SQLITE.retire)?
                .execute(rusqlite::params![w.server, w.tenant, plan, since])?;
            let row = tx.prepare_cached(&SHARING_SQLITE.share)?.query_row(
                rusqlite::params![
                    w.replica,
                    local,
                    w.server,
                    w.tenant,
                    plan,
                    w.request,
                    i64::from(w.approvers),
                    arrived,
                    expires
                ],
                read_row,
            )?;
            tx.commit()?;
            Ok(row)
        })?;
        Ok(shared_row(w, from_row(row)?))
    }

    fn waiting_rows(
        &mut self,
        filter: &str,
        params: impl rusqlite::Params,
    ) -> Result<Vec<WaitingCall>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM waiting_call WHERE {filter} ORDER BY id LIMIT {MAX_WAITING_ROWS}"
        );
        self.with_connection(|conn| {
            let mut statement = conn.prepare_cached(&sql)?;
            let rows = statement
                .query_map(params, read_row)?
                .collect::<Result<Vec<Row>, _>>()?;
            rows.into_iter().map(from_row).collect()
        })
    }

    /// The undecided calls of `server` that desks may still see at `now`, oldest first.
    pub fn waiting_calls(
        &mut self,
        server: &str,
        now: u64,
    ) -> Result<Vec<WaitingCall>, StoreError> {
        let now = ms_to_sql(now)?;
        self.waiting_rows(
            "server = ?1 AND verdict IS NULL AND expires_at_ms > ?2",
            rusqlite::params![server, now],
        )
    }

    /// Waiting call `id`, decided or not.
    pub fn waiting_call(&mut self, id: u64) -> Result<Option<WaitingCall>, StoreError> {
        let id = ms_to_sql(id)?;
        Ok(self.waiting_rows("id = ?1", [id])?.pop())
    }

    /// The waiting calls among `ids` that are on record, decided or not, in one read (at most
    /// [`MAX_WAITING_ROWS`] ids; the rest are not read).
    pub fn waiting_calls_by_id(&mut self, ids: &[u64]) -> Result<Vec<WaitingCall>, StoreError> {
        let list = id_list(ids)?;
        self.waiting_rows("id IN (SELECT value FROM json_each(?1))", [list])
    }

    /// Records `verdict` on waiting call `id` (with a deny's `note`), unless it has one already:
    /// `false` then, and nothing changes. A decided call stays on record until `until`, for the
    /// replica whose agent asks again to find it.
    pub fn decide_waiting(
        &mut self,
        id: u64,
        verdict: Verdict,
        note: Option<&str>,
        until: u64,
    ) -> Result<bool, StoreError> {
        let (id, until) = (ms_to_sql(id)?, ms_to_sql(until)?);
        self.with_connection(|conn| {
            let changed = conn
                .prepare_cached(
                    "UPDATE waiting_call SET verdict = ?2, note = ?3, expires_at_ms = ?4,
                         joinable = CASE WHEN ?2 = 'deny' THEN NULL ELSE joinable END
                     WHERE id = ?1 AND verdict IS NULL",
                )?
                .execute(rusqlite::params![id, verdict.code(), note, until])?;
            Ok(changed == 1)
        })
    }

    /// Claims the minting of approved call `id`'s token for `replica`: `true` for the one
    /// replica that gets it.
    pub fn claim_mint(&mut self, id: u64, replica: &str) -> Result<bool, StoreError> {
        let id = ms_to_sql(id)?;
        self.with_connection(|conn| {
            let changed = conn
                .prepare_cached(
                    "UPDATE waiting_call SET minted_by = ?2, joinable = NULL
                     WHERE id = ?1 AND verdict = 'approve' AND minted_by IS NULL",
                )?
                .execute(rusqlite::params![id, replica])?;
            Ok(changed == 1)
        })
    }

    /// Forgets every call that left desks' sight before `before`; answers how many.
    pub fn prune_waiting(&mut self, before: u64) -> Result<usize, StoreError> {
        let before = ms_to_sql(before)?;
        self.with_connection(|conn| {
            Ok(conn
                .prepare_cached("DELETE FROM waiting_call WHERE expires_at_ms < ?1")?
                .execute([before])?)
        })
    }

    /// Waiting call `id` goes (its token was minted, or it was decided and carried out).
    pub fn forget_waiting(&mut self, id: u64) -> Result<(), StoreError> {
        let id = ms_to_sql(id)?;
        self.with_connection(|conn| {
            conn.prepare_cached("DELETE FROM waiting_call WHERE id = ?1")?
                .execute([id])?;
            Ok(())
        })
    }

    /// `replica`'s call `local_id` left its queue: its row goes.
    pub fn remove_waiting(&mut self, replica: &str, local_id: u64) -> Result<(), StoreError> {
        let local = ms_to_sql(local_id)?;
        self.with_connection(|conn| {
            conn.prepare_cached("DELETE FROM waiting_call WHERE replica = ?1 AND local_id = ?2")?
                .execute(rusqlite::params![replica, local])?;
            Ok(())
        })
    }

    /// `replica` lives: its undecided rows stay visible until `until`.
    pub fn refresh_waiting(&mut self, replica: &str, until: u64) -> Result<(), StoreError> {
        let until = ms_to_sql(until)?;
        self.with_connection(|conn| {
            conn.prepare_cached(
                "UPDATE waiting_call SET expires_at_ms = ?2 WHERE replica = ?1 AND verdict IS NULL",
            )?
            .execute(rusqlite::params![replica, until])?;
            Ok(())
        })
    }

    /// The undecided rows among `ids` (at most [`MAX_WAITING_ROWS`]; the rest are not kept)
    /// stay visible until `until`: a replica holds their calls, whichever replica wrote them.
    pub fn keep_waiting(&mut self, ids: &[u64], until: u64) -> Result<(), StoreError> {
        let until = ms_to_sql(until)?;
        let list = id_list(ids)?;
        self.with_connection(|conn| {
            conn.prepare_cached(
                "UPDATE waiting_call SET expires_at_ms = ?2
                 WHERE id IN (SELECT value FROM json_each(?1)) AND verdict IS NULL",
            )?
            .execute(rusqlite::params![list, until])?;
            Ok(())
        })
    }

    /// The distinct approvers whose kept decisions approve request `request` of `server` over
    /// `plan`.
    pub fn approved_by(
        &mut self,
        server: &str,
        request: u64,
        plan: &PlanHash,
    ) -> Result<Vec<String>, StoreError> {
        let request = ms_to_sql(request)?;
        self.with_connection(|conn| {
            let mut statement = conn.prepare_cached(&crate::decision::approvers_of('?'))?;
            let names = statement
                .query_map(rusqlite::params![server, request, plan.to_hex()], |r| {
                    r.get(0)
                })?
                .collect::<Result<Vec<String>, _>>()?;
            Ok(names)
        })
    }
}

/// At most [`MAX_WAITING_ROWS`] of `ids` as a JSON array, for `json_each` (the rest are left
/// out): one statement for many rows, its text the same whatever their number.
fn id_list(ids: &[u64]) -> Result<String, StoreError> {
    let ids = ids
        .iter()
        .take(MAX_WAITING_ROWS)
        .map(|id| ms_to_sql(*id))
        .collect::<Result<Vec<i64>, _>>()?;
    Ok(format!(
        "[{}]",
        ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
    ))
}
