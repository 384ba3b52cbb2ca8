//! The schema, as a list of numbered steps, and the one way a file is brought up to date.
//!
//! The desk, every gateway-facing helper and the tests may open the same file at the same moment,
//! possibly a file that does not exist yet. So the version (`PRAGMA user_version`) is read once
//! without a lock (the common case, a current file, takes no write lock at all), and if steps are
//! missing they are applied inside a `BEGIN IMMEDIATE` transaction that reads the version AGAIN
//! under the write lock: whoever comes second finds the work done and changes nothing. A file
//! from a newer build is refused rather than guessed at, and a file of another program is left
//! alone.

use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

use crate::error::{StoreError, open_error};

/// Marks the file as Countersign's (`PRAGMA application_id`): "CSG1" in ASCII.
pub const APPLICATION_ID: i32 = 0x4353_4731;

/// One migration: what it does, and its SQL. Step `n` (from 1) brings the file to version `n`.
struct Step {
    /// Why the step exists, logged when it runs.
    purpose: &'static str,
    sql: &'static str,
}

/// Every step ever shipped, in order. Append only: never edit or reorder a shipped step.
const STEPS: &[Step] = &[
    Step {
        purpose: "ledger of spent nonces, approved arguments, history of confirmation events",
        sql: "
        -- One row per spent single-use nonce. The primary key IS the replay check: spending is a
        -- plain INSERT whose duplicate-key error means the token was used before. WITHOUT ROWID
        -- keeps it one b-tree, so a spend writes as few pages as possible.
        CREATE TABLE spent_nonce (
            nonce          BLOB    NOT NULL PRIMARY KEY CHECK (length(nonce) = 16),
            expires_at_ms  INTEGER NOT NULL
        ) STRICT, WITHOUT ROWID;

        -- What a person approved, kept so that what runs is what they read, across restarts.
        CREATE TABLE approval (
            nonce          BLOB    NOT NULL PRIMARY KEY CHECK (length(nonce) = 16),
            tool           TEXT    NOT NULL,
            target         TEXT    NOT NULL,
            tenant         TEXT    NOT NULL,
            plan           TEXT    NOT NULL CHECK (length(plan) = 64),
            arguments      TEXT    NOT NULL,
            issued_at_ms   INTEGER NOT NULL,
            expires_at_ms  INTEGER NOT NULL
        ) STRICT;

        -- Every confirmation event. There is deliberately no column for a token.
        CREATE TABLE history (
            id             INTEGER PRIMARY KEY,
            at_ms          INTEGER NOT NULL,
            kind           TEXT    NOT NULL,
            refusal        TEXT,
            ok             INTEGER CHECK (ok IN (0, 1)),
            tool           TEXT    NOT NULL,
            target         TEXT,
            tenant         TEXT    NOT NULL,
            nonce          TEXT    CHECK (length(nonce) = 32),
            plan           TEXT    CHECK (length(plan) = 64),
            note           TEXT
        ) STRICT;
        CREATE INDEX history_newest ON history (at_ms DESC, id DESC);
    ",
    },
    Step {
        purpose: "approvals record the gate class they were made under",
        sql: "
        -- A confirm is checked under the stricter of this class and the tool's current one. Rows
        -- written before the column existed count as the stricter `once`.
        ALTER TABLE approval
            ADD COLUMN class TEXT NOT NULL DEFAULT 'once' CHECK (class IN ('token', 'once'));
    ",
    },
    Step {
        purpose: "approvals carry a MAC binding their arguments to the click",
        sql: "
        -- A MAC under a key derived from the signing secret over nonce, tenant, plan, class,
        -- expiry and arguments: an edit of the row is refused instead of executed. Rows written
        -- before the column existed have none, and are refused the same way.
        ALTER TABLE approval ADD COLUMN mac BLOB CHECK (mac IS NULL OR length(mac) = 32);
    ",
    },
    Step {
        purpose: "tool definitions pinned per server identity when first seen",
        sql: "
        -- What each server's tool looked like when the desk first saw it (or when the person last
        -- accepted a change to it): calls of a tool whose listing differs are held back.
        CREATE TABLE tool_pin (
            server         TEXT    NOT NULL,
            tool           TEXT    NOT NULL,
            hash           TEXT    NOT NULL CHECK (length(hash) = 64),
            definition     TEXT    NOT NULL,
            pinned_at_ms   INTEGER NOT NULL,
            PRIMARY KEY (server, tool)
        ) STRICT;
        CREATE INDEX tool_pin_oldest ON tool_pin (pinned_at_ms);
    ",
    },
    Step {
        purpose: "the text of each file a person may edit, as the desk last accepted it",
        sql: "
        -- servers.json and policy.toml as last accepted (by the person's settings view or their
        -- click on a change): what applies. An edit of the file made behind the desk's back
        -- differs from this and waits for the person.
        CREATE TABLE accepted_file (
            name            TEXT    NOT NULL PRIMARY KEY,
            text            TEXT    NOT NULL,
            accepted_at_ms  INTEGER NOT NULL
        ) STRICT;
    ",
    },
    Step {
        purpose: "grants: a person's widening of one approval to later matching calls",
        sql: "
        -- A call grant covers the same server, tool and plan hash; a prefix grant the tool on
        -- targets under a prefix, for one connection (tenant). Each row carries the engine's MAC
        -- over what decides what it covers; ended_at_ms and ended say when and why it stopped
        -- before its expiry (revoked, disconnected, restarted).
        CREATE TABLE approval_grant (
            id             INTEGER PRIMARY KEY,
            kind           TEXT    NOT NULL CHECK (kind IN ('call', 'prefix')),
            server         TEXT    NOT NULL,
            tool           TEXT    NOT NULL,
            tenant         TEXT,
            plan           TEXT    CHECK (plan IS NULL OR length(plan) = 64),
            prefix         TEXT,
            target         TEXT    NOT NULL,
            summary        TEXT    NOT NULL,
            class          TEXT    NOT NULL CHECK (class IN ('token', 'once')),
            definition     TEXT    NOT NULL CHECK (length(definition) = 64),
            request        INTEGER NOT NULL,
            granted_at_ms  INTEGER NOT NULL,
            expires_at_ms  INTEGER NOT NULL,
            uses           INTEGER NOT NULL DEFAULT 0,
            ended_at_ms    INTEGER,
            ended          TEXT    CHECK (ended IN ('revoked', 'disconnected', 'restarted')),
            mac            BLOB    NOT NULL CHECK (length(mac) = 32),
            CHECK ((kind = 'call' AND plan IS NOT NULL)
                OR (kind = 'prefix' AND tenant IS NOT NULL AND prefix IS NOT NULL))
        ) STRICT;
        CREATE INDEX approval_grant_live ON approval_grant (expires_at_ms) WHERE ended_at_ms IS NULL;
    ",
    },
    Step {
        purpose: "agent keys a team's server issued (their hashes only)",
        sql: "
        -- A key is found by its hash; a revoked key stays, so its name is never reused.
        CREATE TABLE agent_key (
            name           TEXT    NOT NULL PRIMARY KEY,
            hash           BLOB    NOT NULL UNIQUE CHECK (length(hash) = 32),
            created_at_ms  INTEGER NOT NULL,
            revoked_at_ms  INTEGER
        ) STRICT;
    ",
    },
    Step {
        purpose: "approvers of a team's server, and their signed decisions",
        sql: "
        -- An approver is its desk's Ed25519 public key; a revoked one stays, so neither its
        -- name nor its key is ever reused.
        CREATE TABLE approver (
            name           TEXT    NOT NULL PRIMARY KEY,
            public_key     BLOB    NOT NULL UNIQUE CHECK (length(public_key) = 32),
            created_at_ms  INTEGER NOT NULL,
            revoked_at_ms  INTEGER
        ) STRICT;
        -- Each verified decision, with its signature: only ever added to.
        CREATE TABLE approver_decision (
            id             INTEGER PRIMARY KEY,
            approver       TEXT    NOT NULL,
            server         TEXT    NOT NULL,
            request        INTEGER NOT NULL,
            verdict        TEXT    NOT NULL CHECK (verdict IN ('approve', 'deny')),
            plan           TEXT    NOT NULL CHECK (length(plan) = 64),
            tenant         TEXT    NOT NULL,
            tool           TEXT    NOT NULL,
            target         TEXT    NOT NULL,
            class          TEXT    NOT NULL CHECK (class IN ('open', 'token', 'once')),
            expires_at_ms  INTEGER NOT NULL,
            signature      BLOB    NOT NULL CHECK (length(signature) = 64),
            decided_at_ms  INTEGER NOT NULL
        ) STRICT;

        -- Calls waiting for people on a team's server, shared by its replicas (see waiting.rs).
        CREATE TABLE waiting_call (
            id             INTEGER PRIMARY KEY,
            replica        TEXT    NOT NULL,
            local_id       INTEGER NOT NULL,
            server         TEXT    NOT NULL,
            tenant         TEXT    NOT NULL,
            plan           TEXT    NOT NULL CHECK (length(plan) = 64),
            request        TEXT    NOT NULL,
            approvers      INTEGER NOT NULL CHECK (approvers BETWEEN 1 AND 9),
            arrived_at_ms  INTEGER NOT NULL,
            expires_at_ms  INTEGER NOT NULL,
            verdict        TEXT    CHECK (verdict IN ('approve', 'deny')),
            note           TEXT,
            minted_by      TEXT,
            UNIQUE (replica, local_id)
        ) STRICT;
        CREATE INDEX approver_decision_request ON approver_decision (server, request);
    ",
    },
    Step {
        purpose: "history as a hash chain with a signed head",
        sql: "
        -- Each event's number in the chain, the hash of the event before it and its own hash
        -- (countersign_core::chain). Rows written before this step have none until the next event
        -- is recorded, which chains them first, in the order they were recorded.
        ALTER TABLE history ADD COLUMN seq INTEGER CHECK (seq IS NULL OR seq > 0);
        ALTER TABLE history ADD COLUMN prev TEXT CHECK (prev IS NULL OR length(prev) = 64);
        ALTER TABLE history ADD COLUMN hash TEXT CHECK (hash IS NULL OR length(hash) = 64);
        CREATE UNIQUE INDEX history_seq ON history (seq);
        -- The newest event's hash signed with the authority's chain key ('head'), and, once old
        -- events are pruned, the last pruned event's hash signed the same way ('start').
        CREATE TABLE history_head (
            role           TEXT    NOT NULL PRIMARY KEY CHECK (role IN ('head', 'start')),
            seq            INTEGER NOT NULL,
            hash           TEXT    NOT NULL CHECK (length(hash) = 64),
            at_ms          INTEGER NOT NULL,
            public_key     BLOB    NOT NULL CHECK (length(public_key) = 32),
            signature      BLOB    NOT NULL CHECK (length(signature) = 64)
        ) STRICT;
    ",
    },
    Step {
        purpose: "how far each telemetry sink has acknowledged the history",
        sql: "
        -- One row per sink (the OpenTelemetry collector): the newest chain number it
        -- acknowledged, who sends to it now (one sender at a time, by a lease), and since when
        -- it fails, so the window and `countersign history` can say how many events wait.
        -- History is never pruned past the lowest cursor: an event waits until it is sent.
        CREATE TABLE export_cursor (
            sink             TEXT    NOT NULL PRIMARY KEY,
            seq              INTEGER NOT NULL CHECK (seq >= 0),
            holder           TEXT,
            lease_until_ms   INTEGER,
            failing_since_ms INTEGER,
            last_error       TEXT
        ) STRICT;
    ",
    },
    Step {
        purpose: "approvers' passkeys, their invites and sign-in challenges, and decisions passkeys signed",
        sql: "
        -- A passkey (WebAuthn credential) of an approver, beside or instead of a desk key: the
        -- verifier's record of it (public key, algorithm, flags; nothing secret) and the highest
        -- signature counter accepted. A revoked one stays, so its credential is never reused.
        CREATE TABLE approver_passkey (
            credential_id  BLOB    NOT NULL PRIMARY KEY
                           CHECK (length(credential_id) BETWEEN 1 AND 1023),
            name           TEXT    NOT NULL,
            credential     TEXT    NOT NULL,
            counter        INTEGER NOT NULL CHECK (counter >= 0),
            created_at_ms  INTEGER NOT NULL,
            revoked_at_ms  INTEGER
        ) STRICT;
        CREATE INDEX approver_passkey_name ON approver_passkey (name);
        -- One-time links that enroll a passkey: only the hash of the link's secret; the
        -- registration ceremony begun with it, so any replica can finish it; when it was used.
        CREATE TABLE approver_invite (
            hash           BLOB    NOT NULL PRIMARY KEY CHECK (length(hash) = 32),
            name           TEXT    NOT NULL,
            created_at_ms  INTEGER NOT NULL,
            expires_at_ms  INTEGER NOT NULL,
            ceremony       TEXT,
            used_at_ms     INTEGER
        ) STRICT;
        -- Sign-in challenges, each good once until it expires.
        CREATE TABLE passkey_challenge (
            challenge      BLOB    NOT NULL PRIMARY KEY CHECK (length(challenge) = 32),
            expires_at_ms  INTEGER NOT NULL
        ) STRICT;
        -- Each decision a passkey signed, with the whole assertion: only ever added to.
        CREATE TABLE passkey_decision (
            id                  INTEGER PRIMARY KEY,
            approver            TEXT    NOT NULL,
            server              TEXT    NOT NULL,
            request             INTEGER NOT NULL,
            verdict             TEXT    NOT NULL CHECK (verdict IN ('approve', 'deny')),
            plan                TEXT    NOT NULL CHECK (length(plan) = 64),
            tenant              TEXT    NOT NULL,
            tool                TEXT    NOT NULL,
            target              TEXT    NOT NULL,
            class               TEXT    NOT NULL CHECK (class IN ('open', 'token', 'once')),
            expires_at_ms       INTEGER NOT NULL,
            credential_id       BLOB    NOT NULL,
            authenticator_data  BLOB    NOT NULL,
            client_data         BLOB    NOT NULL,
            signature           BLOB    NOT NULL,
            decided_at_ms       INTEGER NOT NULL
        ) STRICT;
        CREATE INDEX passkey_decision_request ON passkey_decision (server, request);
    ",
    },
    Step {
        purpose: "the budgets of the rules over arguments, per window",
        sql: "
        -- How much of a window a budget's click-less calls took (crate::budget).
        CREATE TABLE rule_budget (
            budget           TEXT    NOT NULL,
            window_start_ms  INTEGER NOT NULL,
            used             INTEGER NOT NULL CHECK (used >= 0),
            PRIMARY KEY (budget, window_start_ms)
        ) STRICT;
    ",
    },
    Step {
        purpose: "one shared row per waiting call, however many replicas share it at once",
        sql: "
        -- 1 on the one row of a call (server, tenant, plan) that sharing the call again joins:
        -- undecided, or approved with no token minted, and not lapsed long ago. NULL on every
        -- other row; NULLs never collide in the unique index, so it allows one such row per call
        -- (crate::waiting). Rows written before this step are not joinable.
        ALTER TABLE waiting_call ADD COLUMN joinable INTEGER CHECK (joinable IS NULL OR joinable = 1);
        CREATE UNIQUE INDEX waiting_call_joinable ON waiting_call (server, tenant, plan, joinable);
    ",
    },
];

/// The version from which history is chained ([`crate::history`]).
pub const CHAIN_VERSION: i64 = 9;

/// The version from which telemetry sinks keep cursors ([`crate::ExportStatus`]).
pub const EXPORT_VERSION: i64 = 10;

/// The schema version this build writes and understands.
pub const SCHEMA_VERSION: i64 = STEPS.len() as i64;

fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA user_version", [], |row| row.get(0))
}

fn application_id(conn: &Connection) -> rusqlite::Result<i32> {
    conn.query_row("PRAGMA application_id", [], |row| row.get(0))
}

/// Refuses files of newer builds and of other programs; says whether steps are missing.
fn needs_steps(conn: &Connection, path: &Path) -> Result<i64, StoreError> {
    let found = user_version(conn).map_err(open_error(path, "reading the schema version"))?;
    let app = application_id(conn).map_err(open_error(path, "reading the application id"))?;
    if app != 0 && app != APPLICATION_ID {
        return Err(StoreError::NotAStore {
            path: path.to_owned(),
            reason: format!("application_id is {app:#x}"),
        });
    }
    if found < 0 {
        return Err(StoreError::NotAStore {
            path: path.to_owned(),
            reason: format!("user_version is {found}"),
        });
    }
    if found > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: path.to_owned(),
            found,
            known: SCHEMA_VERSION,
        });
    }
    Ok(found)
}

/// Brings the file at `path`, open on `conn`, to [`SCHEMA_VERSION`].
pub(crate) fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    if needs_steps(conn, path)? == SCHEMA_VERSION {
        return Ok(());
    }
    let migrating = open_error(path, "migrating");
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(&migrating)?;
    // Under the write lock now: another process may have migrated since the first look. If so,
    // write nothing (dropping the transaction ends it) and hold the lock no longer.
    let found = needs_steps(&tx, path)?;
    if found == SCHEMA_VERSION {
        return Ok(());
    }
    for (index, step) in STEPS.iter().enumerate().skip(found as usize) {
        tracing::info!(path = %path.display(), version = index + 1, purpose = step.purpose, "store migration");
        tx.execute_batch(step.sql).map_err(&migrating)?;
    }
    if found == 0 {
        tx.pragma_update(None, "application_id", APPLICATION_ID)
            .map_err(&migrating)?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(&migrating)?;
    tx.commit().map_err(&migrating)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier};

    use countersign_core::{GateClass, Ledger, SpendError};

    use super::*;
    use crate::test_support::{approval, nonce, raw, temp_store};
    use crate::{Store, StoreOptions};

    #[test]
    fn fresh_file_is_migrated_to_the_latest_version() {
        let (_dir, store) = temp_store();
        let conn = raw(&store);
        assert_eq!(user_version(&conn).unwrap(), SCHEMA_VERSION);
        assert_eq!(application_id(&conn).unwrap(), APPLICATION_ID);
        for table in [
            "spent_nonce",
            "approval",
            "history",
            "tool_pin",
            "approval_grant",
        ] {
            let n: i64 = conn
                .query_row(
                    "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?1",
                    [table],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(n, 1, "{table}");
        }
    }

    #[test]
    fn reopening_a_current_file_keeps_its_rows() {
        let (dir, mut store) = temp_store();
        store.spend(&nonce(1), 10).unwrap();
        drop(store);
        for _ in 0..3 {
            let mut store =
                Store::open(dir.path().join("countersign.db"), StoreOptions::default()).unwrap();
            assert_eq!(store.spend(&nonce(1), 10), Err(SpendError::AlreadySpent));
        }
    }

    /// A file as a build that knew only the first `version` steps left it.
    fn file_at_version(path: &Path, version: usize) -> rusqlite::Connection {
        let conn = rusqlite::Connection::open(path).unwrap();
        for step in &STEPS[..version] {
            conn.execute_batch(step.sql).unwrap();
        }
        conn.pragma_update(None, "application_id", APPLICATION_ID)
            .unwrap();
        conn.pragma_update(None, "user_version", version as i64)
            .unwrap();
        conn
    }

    #[test]
    fn version_1_file_migrates_and_old_approvals_read_back_as_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("countersign.db");
        let conn = file_at_version(&path, 1);
        conn.execute(
            "INSERT INTO approval
                 (nonce, tool, target, tenant, plan, arguments, issued_at_ms, expires_at_ms)
             VALUES (?1, 'delete_backup', 'backup-1', 'conn-1', ?2, '{\"name\":\"backup-1\"}', 1, 700000)",
            rusqlite::params![&nonce(1).as_bytes()[..], "ab".repeat(32)],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO spent_nonce (nonce, expires_at_ms) VALUES (?1, 10)",
            [&nonce(2).as_bytes()[..]],
        )
        .unwrap();
        drop(conn);

        let mut store = Store::open(&path, StoreOptions::default()).unwrap();
        assert_eq!(user_version(&raw(&store)).unwrap(), SCHEMA_VERSION);
        let old = store.approval(&nonce(1)).unwrap().unwrap();
        assert_eq!(old.class, GateClass::Once);
        assert_eq!(old.target, "backup-1");
        assert_eq!(old.arguments, serde_json::json!({"name": "backup-1"}));
        // The rest of the file is kept, and new approvals record their class.
        assert_eq!(store.spend(&nonce(2), 10), Err(SpendError::AlreadySpent));
        let mut token = approval(3, 700_000);
        token.class = GateClass::Token;
        store.put_approval(&token).unwrap();
        drop(store);
        let mut store = Store::open(&path, StoreOptions::default()).unwrap();
        assert_eq!(store.approval(&nonce(3)).unwrap(), Some(token));
        assert_eq!(
            store.approval(&nonce(1)).unwrap().unwrap().class,
            GateClass::Once
        );
    }

    #[test]
    fn newer_schema_is_refused() {
        let (dir, store) = temp_store();
        let path = dir.path().join("countersign.db");
        raw(&store).pragma_update(None, "user_version", 99).unwrap();
        drop(store);
        match Store::open(&path, StoreOptions::default()) {
            Err(StoreError::NewerSchema {
                found: 99,
                known: SCHEMA_VERSION,
                ..
            }) => {}
            other => panic!("expected NewerSchema, got {other:?}"),
        }
        // The ledger refuses rather than guess at a schema it does not know.
        let mut store = Store::open_deferred(&path, StoreOptions::default());
        match store.spend(&nonce(1), 10) {
            Err(SpendError::Unreachable(reason)) => assert!(reason.contains("newer"), "{reason}"),
            other => panic!("expected Unreachable, got {other:?}"),
        }
        // Nothing was changed in the file.
        let conn = rusqlite::Connection::open(&path).unwrap();
        assert_eq!(user_version(&conn).unwrap(), 99);
    }

    #[test]
    fn another_programs_database_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("other.db");
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA application_id = 1234; CREATE TABLE notes (body TEXT);")
            .unwrap();
        drop(conn);
        assert!(matches!(
            Store::open(&path, StoreOptions::default()),
            Err(StoreError::NotAStore { .. })
        ));
    }

    #[test]
    fn concurrent_first_opens_all_succeed() {
        for _round in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("countersign.db");
            let threads = 16;
            let barrier = Arc::new(Barrier::new(threads));
            let results: Vec<_> = (0..threads)
                .map(|_| {
                    let (path, barrier) = (path.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        Store::open(path, StoreOptions::default()).map(|_| ())
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|t| t.join().unwrap())
                .collect();
            for result in results {
                result.unwrap();
            }
            let conn = rusqlite::Connection::open(&path).unwrap();
            assert_eq!(user_version(&conn).unwrap(), SCHEMA_VERSION);
        }
    }
}
