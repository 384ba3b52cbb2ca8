//! Approvers' passkeys, the one-time links that enroll them, and the challenges of signing in.
//!
//! A person who approves for a team's server from a phone or a browser holds a passkey (a
//! WebAuthn credential) instead of, or beside, a desk's Ed25519 key. The roster keeps, per
//! credential, what the verifier needs to check its assertions (the public key, as the verifier's
//! own JSON record of the credential) and its signature counter, which only goes forward: an
//! assertion whose counter does not move past the kept one is refused, so two replicas cannot
//! both accept one assertion, and a cloned authenticator shows. Nothing here is secret.
//!
//! A passkey is enrolled only through an invite: `countersign serve approver invite NAME` makes
//! a random link secret and keeps only its SHA-256 here, with its expiry; the registration
//! ceremony begun with it is kept on the same row (any replica may finish it), and the invite is
//! used up by the one update that finishes it. Revoking a name revokes its desk key and every
//! passkey at once ([`Store::revoke_member`](crate::Store::revoke_member)).
//!
//! Sign-in challenges are random and kept until used once or expired: a sign-in assertion
//! replayed (on any replica) finds its challenge gone.

use rusqlite::OptionalExtension;

use crate::error::{ms_from_sql, ms_to_sql};
use crate::roster::valid_member_name;
use crate::{Store, StoreError};

pub(crate) const TABLE: &str = "approver_passkey";
const INVITES: &str = "approver_invite";

/// The longest credential id kept (WebAuthn allows 1023 bytes).
pub const MAX_CREDENTIAL_ID_BYTES: usize = 1023;

/// The largest verifier's record of a credential kept, in bytes (a P-256 key's is a few hundred).
pub const MAX_CREDENTIAL_BYTES: usize = 16 * 1024;

/// The largest registration ceremony kept on an invite, in bytes.
pub const MAX_CEREMONY_BYTES: usize = 16 * 1024;

/// One passkey of one approver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Passkey {
    /// The approver it belongs to, by name: the same name as a desk key's counts as one person.
    pub approver: String,
    /// The credential's id, as the authenticator made it.
    pub credential_id: Vec<u8>,
    /// The verifier's record of the credential (its public key, algorithm and flags), as JSON.
    pub credential: String,
    /// The highest signature counter accepted so far (0 for an authenticator that keeps none).
    pub counter: u32,
    /// When it was enrolled, ms since the epoch.
    pub created_at_ms: u64,
    /// When it was revoked, if it was.
    pub revoked_at_ms: Option<u64>,
}

impl Passkey {
    /// Whether it still counts.
    pub fn is_active(&self) -> bool {
        self.revoked_at_ms.is_none()
    }
}

/// A one-time link that enrolls a passkey for an approver.
#[derive(Clone, PartialEq, Eq)]
pub struct Invite {
    /// SHA-256 of the link's secret (the secret itself is never kept).
    pub hash: [u8; 32],
    /// The approver the passkey will be for.
    pub approver: String,
    /// When it was made, ms since the epoch.
    pub created_at_ms: u64,
    /// Until when it can be used.
    pub expires_at_ms: u64,
    /// The registration ceremony begun with it, if one was (the verifier's state, as JSON).
    pub ceremony: Option<String>,
    /// When it was used, if it was.
    pub used_at_ms: Option<u64>,
}

impl std::fmt::Debug for Invite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invite")
            .field("approver", &self.approver)
            .field("expires_at_ms", &self.expires_at_ms)
            .field("begun", &self.ceremony.is_some())
            .field("used_at_ms", &self.used_at_ms)
            .finish_non_exhaustive()
    }
}

fn invalid(table: &'static str, reason: &str) -> StoreError {
    StoreError::InvalidRow {
        table,
        reason: reason.into(),
    }
}

/// Refuses a passkey that the tables would not hold as it is.
pub(crate) fn checked(p: &Passkey) -> Result<(i64, i64), StoreError> {
    if !valid_member_name(&p.approver) {
        return Err(invalid(TABLE, "not a member's name"));
    }
    if p.credential_id.is_empty() || p.credential_id.len() > MAX_CREDENTIAL_ID_BYTES {
        return Err(invalid(TABLE, "a credential id is 1 to 1023 bytes"));
    }
    if p.credential.len() > MAX_CREDENTIAL_BYTES {
        return Err(invalid(TABLE, "a credential's record over 16 KiB"));
    }
    Ok((i64::from(p.counter), ms_to_sql(p.created_at_ms)?))
}

/// Refuses an invite that the tables would not hold as it is.
pub(crate) fn checked_invite(i: &Invite) -> Result<(i64, i64), StoreError> {
    if !valid_member_name(&i.approver) {
        return Err(invalid(INVITES, "not a member's name"));
    }
    Ok((ms_to_sql(i.created_at_ms)?, ms_to_sql(i.expires_at_ms)?))
}

/// A passkey's row as read back.
pub(crate) fn from_row(
    approver: String,
    credential_id: Vec<u8>,
    credential: String,
    counter: i64,
    created: i64,
    revoked: Option<i64>,
) -> Result<Passkey, StoreError> {
    Ok(Passkey {
        approver,
        credential_id,
        credential,
        counter: u32::try_from(counter).map_err(|_| invalid(TABLE, "a counter out of range"))?,
        created_at_ms: ms_from_sql(created, TABLE)?,
        revoked_at_ms: revoked.map(|r| ms_from_sql(r, TABLE)).transpose()?,
    })
}

/// An invite's row as read back.
pub(crate) fn invite_from_row(
    hash: Vec<u8>,
    approver: String,
    created: i64,
    expires: i64,
    ceremony: Option<String>,
    used: Option<i64>,
) -> Result<Invite, StoreError> {
    Ok(Invite {
        hash: hash
            .try_into()
            .map_err(|_| invalid(INVITES, "a hash that is not 32 bytes"))?,
        approver,
        created_at_ms: ms_from_sql(created, INVITES)?,
        expires_at_ms: ms_from_sql(expires, INVITES)?,
        ceremony,
        used_at_ms: used.map(|u| ms_from_sql(u, INVITES)).transpose()?,
    })
}

/// The statements of passkeys, invites and challenges, in either dialect.
pub(crate) struct Statements {
    pub(crate) insert: String,
    pub(crate) by_id: String,
    pub(crate) all: String,
    pub(crate) advance: String,
    pub(crate) revoke: String,
    pub(crate) put_invite: String,
    pub(crate) invite: String,
    pub(crate) begin_invite: String,
    pub(crate) use_invite: String,
    pub(crate) prune_challenges: String,
    pub(crate) put_challenge: String,
    pub(crate) take_challenge: String,
}

const PASSKEY_COLUMNS: &str =
    "name, credential_id, credential, counter, created_at_ms, revoked_at_ms";
const INVITE_COLUMNS: &str = "hash, name, created_at_ms, expires_at_ms, ceremony, used_at_ms";

/// The statements with parameters spelled `{p}1`, `{p}2`… (`$` or `?`).
pub(crate) fn statements(p: char) -> Statements {
    Statements {
        insert: format!(
            "INSERT INTO {TABLE} (name, credential_id, credential, counter, created_at_ms)
             VALUES ({p}1, {p}2, {p}3, {p}4, {p}5) ON CONFLICT DO NOTHING"
        ),
        by_id: format!("SELECT {PASSKEY_COLUMNS} FROM {TABLE} WHERE credential_id = {p}1"),
        all: format!("SELECT {PASSKEY_COLUMNS} FROM {TABLE} ORDER BY name, created_at_ms"),
        // The counter only goes forward; an authenticator that keeps none (0) may stay at 0.
        advance: format!(
            "UPDATE {TABLE} SET counter = {p}2
              WHERE credential_id = {p}1 AND revoked_at_ms IS NULL
                AND (counter < {p}2 OR (counter = 0 AND {p}2 = 0))"
        ),
        revoke: format!(
            "UPDATE {TABLE} SET revoked_at_ms = {p}2 WHERE name = {p}1 AND revoked_at_ms IS NULL"
        ),
        put_invite: format!(
            "INSERT INTO {INVITES} (hash, name, created_at_ms, expires_at_ms)
             VALUES ({p}1, {p}2, {p}3, {p}4) ON CONFLICT DO NOTHING"
        ),
        invite: format!("SELECT {INVITE_COLUMNS} FROM {INVITES} WHERE hash = {p}1"),
        begin_invite: format!(
            "UPDATE {INVITES} SET ceremony = {p}2
              WHERE hash = {p}1 AND used_at_ms IS NULL AND expires_at_ms > {p}3"
        ),
        use_invite: format!(
            "UPDATE {INVITES} SET used_at_ms = {p}2
              WHERE hash = {p}1 AND used_at_ms IS NULL AND expires_at_ms > {p}2
                AND ceremony IS NOT NULL
             RETURNING {INVITE_COLUMNS}"
        ),
        prune_challenges: format!("DELETE FROM passkey_challenge WHERE expires_at_ms <= {p}1"),
        put_challenge: format!(
            "INSERT INTO passkey_challenge (challenge, expires_at_ms) VALUES ({p}1, {p}2)"
        ),
        take_challenge: format!(
            "DELETE FROM passkey_challenge WHERE challenge = {p}1 AND expires_at_ms > {p}2"
        ),
    }
}

type PasskeyRow = (String, Vec<u8>, String, i64, i64, Option<i64>);
type InviteRow = (Vec<u8>, String, i64, i64, Option<String>, Option<i64>);

fn passkey_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<PasskeyRow> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
    ))
}

fn invite_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<InviteRow> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
    ))
}

impl Store {
    /// Enrolls `passkey`. `false`: its credential is on the roster already (revoked or not), and
    /// nothing was written.
    pub fn put_passkey(&mut self, passkey: &Passkey) -> Result<bool, StoreError> {
        let (counter, created) = checked(passkey)?;
        let sql = statements('?').insert;
        self.with_connection(|conn| {
            let inserted = conn.prepare_cached(&sql)?.execute(rusqlite::params![
                passkey.approver,
                passkey.credential_id,
                passkey.credential,
                counter,
                created
            ])?;
            Ok(inserted == 1)
        })
    }

    /// The passkey whose credential id is `id`, revoked or not.
    pub fn passkey(&mut self, id: &[u8]) -> Result<Option<Passkey>, StoreError> {
        let sql = statements('?').by_id;
        self.with_connection(|conn| {
            let row = conn
                .prepare_cached(&sql)?
                .query_row([id], passkey_row)
                .optional()?;
            row.map(|(a, i, c, n, t, r)| from_row(a, i, c, n, t, r))
                .transpose()
        })
    }

    /// Every passkey, by approver.
    pub fn passkeys(&mut self) -> Result<Vec<Passkey>, StoreError> {
        let sql = statements('?').all;
        self.with_connection(|conn| {
            let rows = conn
                .prepare_cached(&sql)?
                .query_map([], passkey_row)?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter()
                .map(|(a, i, c, n, t, r)| from_row(a, i, c, n, t, r))
                .collect()
        })
    }

    /// Moves the counter of the unrevoked passkey `id` to `counter`, if that is forward (or both
    /// are 0). `false`: revoked, unknown, or a counter that did not move forward (a replay, or a
    /// cloned authenticator): the assertion must not count.
    pub fn advance_passkey(&mut self, id: &[u8], counter: u32) -> Result<bool, StoreError> {
        let sql = statements('?').advance;
        self.with_connection(|conn| {
            let changed = conn
                .prepare_cached(&sql)?
                .execute(rusqlite::params![id, i64::from(counter)])?;
            Ok(changed == 1)
        })
    }

    /// Keeps `invite`. `false`: an invite with this hash exists already.
    pub fn put_invite(&mut self, invite: &Invite) -> Result<bool, StoreError> {
        let (created, expires) = checked_invite(invite)?;
        let sql = statements('?').put_invite;
        self.with_connection(|conn| {
            let inserted = conn.prepare_cached(&sql)?.execute(rusqlite::params![
                invite.hash.as_slice(),
                invite.approver,
                created,
                expires
            ])?;
            Ok(inserted == 1)
        })
    }

    /// The invite whose link hashes to `hash`, used or not.
    pub fn invite(&mut self, hash: &[u8; 32]) -> Result<Option<Invite>, StoreError> {
        let sql = statements('?').invite;
        self.with_connection(|conn| {
            let row = conn
                .prepare_cached(&sql)?
                .query_row([hash.as_slice()], invite_row)
                .optional()?;
            row.map(|(h, a, c, e, s, u)| invite_from_row(h, a, c, e, s, u))
                .transpose()
        })
    }

    /// Keeps the registration ceremony begun with the unused, unexpired invite `hash` (a later
    /// one replaces it: the person may start again). `false`: no such invite at `now`.
    pub fn begin_invite(
        &mut self,
        hash: &[u8; 32],
        ceremony: &str,
        now: u64,
    ) -> Result<bool, StoreError> {
        if ceremony.len() > MAX_CEREMONY_BYTES {
            return Err(invalid(INVITES, "a ceremony over 16 KiB"));
        }
        let now = ms_to_sql(now)?;
        let sql = statements('?').begin_invite;
        self.with_connection(|conn| {
            let changed = conn.prepare_cached(&sql)?.execute(rusqlite::params![
                hash.as_slice(),
                ceremony,
                now
            ])?;
            Ok(changed == 1)
        })
    }

    /// Uses up the invite `hash` at `now`, once: answers it (with its ceremony) if it was unused,
    /// unexpired and begun; `None` otherwise, and it stays as it was.
    pub fn use_invite(&mut self, hash: &[u8; 32], now: u64) -> Result<Option<Invite>, StoreError> {
        let now = ms_to_sql(now)?;
        let sql = statements('?').use_invite;
        self.with_connection(|conn| {
            let row = conn
                .prepare_cached(&sql)?
                .query_row(rusqlite::params![hash.as_slice(), now], invite_row)
                .optional()?;
            row.map(|(h, a, c, e, s, u)| invite_from_row(h, a, c, e, s, u))
                .transpose()
        })
    }

    /// Keeps a sign-in `challenge` until `expires_at_ms`, and forgets the expired ones.
    pub fn put_challenge(
        &mut self,
        challenge: &[u8; 32],
        expires_at_ms: u64,
        now: u64,
    ) -> Result<(), StoreError> {
        let (expires, now) = (ms_to_sql(expires_at_ms)?, ms_to_sql(now)?);
        let sql = statements('?');
        self.with_connection(|conn| {
            conn.prepare_cached(&sql.prune_challenges)?.execute([now])?;
            conn.prepare_cached(&sql.put_challenge)?
                .execute(rusqlite::params![challenge.as_slice(), expires])?;
            Ok(())
        })
    }

    /// Takes the sign-in `challenge`, once: `true` if it was kept and unexpired at `now` (and it
    /// is gone now), `false` otherwise.
    pub fn take_challenge(&mut self, challenge: &[u8; 32], now: u64) -> Result<bool, StoreError> {
        let now = ms_to_sql(now)?;
        let sql = statements('?').take_challenge;
        self.with_connection(|conn| {
            let taken = conn
                .prepare_cached(&sql)?
                .execute(rusqlite::params![challenge.as_slice(), now])?;
            Ok(taken == 1)
        })
    }
}
