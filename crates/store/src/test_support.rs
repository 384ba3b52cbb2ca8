//! Test fixtures, written once: a store on a fresh temporary file, and the nonces, approvals,
//! events, pins and grants the tests store in it.
//!
//! Two kinds of test use them: this crate's unit tests (what only the SQLite file does: damaged
//! rows, locks, reopening, migrations) and the suite that runs every behaviour of the records
//! against both stores (`tests/records.rs`), with the PostgreSQL fault tests beside it. Sharing
//! them keeps the rows a unit test damages the same rows the suite round-trips. Compiled for this
//! crate's own tests, and for other crates only with the `test-support` feature, which only
//! dev-dependencies enable: nothing the desk or `serve` ships contains this module.

use std::time::Duration;

use countersign_core::telemetry::{ConfirmEvent, EventKind, Rejection};
use countersign_core::{GateClass, Nonce, PlanHash, Refusal, SpendError};
use tempfile::TempDir;

use crate::{Approval, Grant, GrantKind, Store, StoreError, StoreOptions, ToolPin};

/// A store on a new file in a new temporary directory (kept alive by the returned guard).
pub fn temp_store() -> (TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("countersign.db"), StoreOptions::default()).unwrap();
    (dir, store)
}

/// Options with a short busy timeout, for tests that wait on a held lock.
pub fn short_timeout() -> StoreOptions {
    StoreOptions::default().with_busy_timeout(Duration::from_millis(200))
}

/// A second, raw connection to the store's file, for tests that tamper with it or hold locks.
pub fn raw(store: &Store) -> rusqlite::Connection {
    rusqlite::Connection::open(store.path()).unwrap()
}

/// A nonce whose bytes are all `n`.
pub fn nonce(n: u8) -> Nonce {
    Nonce::from_bytes([n; 16])
}

/// The reason of a spend refused as unreachable; panics on any other outcome.
pub fn unreachable(result: Result<(), SpendError>) -> String {
    match result {
        Err(SpendError::Unreachable(reason)) => reason,
        other => panic!("expected Unreachable, got {other:?}"),
    }
}

/// Asserts that of the outcomes of spends racing on one nonce, exactly one spent it and every
/// other one was told it was already spent (none refused as unreachable).
pub fn assert_spent_once(outcomes: &[Result<(), SpendError>]) {
    assert_eq!(
        outcomes.iter().filter(|o| o.is_ok()).count(),
        1,
        "{outcomes:?}"
    );
    assert!(
        outcomes
            .iter()
            .filter(|o| o.is_err())
            .all(|o| *o == Err(SpendError::AlreadySpent)),
        "{outcomes:?}"
    );
}

/// A single-use approval under `nonce(n)` expiring at `expires_at_ms`.
pub fn approval(n: u8, expires_at_ms: u64) -> Approval {
    Approval {
        nonce: nonce(n),
        tool: "delete_backup".into(),
        target: format!("backup-{n}"),
        tenant: "conn-1".into(),
        plan: PlanHash::from_bytes([n; 32]),
        arguments: serde_json::json!({ "name": format!("backup-{n}") }),
        issued_at_ms: expires_at_ms.saturating_sub(600_000),
        expires_at_ms,
        class: GateClass::Once,
        mac: Some([n; 32]),
    }
}

/// An event of `kind` at `at_ms`, with every optional field set.
pub fn event(at_ms: u64, kind: EventKind) -> ConfirmEvent {
    ConfirmEvent {
        at_ms,
        kind,
        tool: "execute".into(),
        target: Some("main.db".into()),
        tenant: "conn-1".into(),
        nonce: Some(nonce(7)),
        plan: Some(PlanHash::from_bytes([8; 32])),
        note: Some("a note".into()),
    }
}

/// The acceptance of the works-once confirm of `nonce(n)` at `at_ms`, as the engine records it
/// with the spend ([`crate::Records::spend_recording`]).
pub fn accepted(n: u8, at_ms: u64) -> ConfirmEvent {
    ConfirmEvent {
        nonce: Some(nonce(n)),
        ..event(at_ms, EventKind::Accepted)
    }
}

/// A confirm's outcome ([`crate::Records::spend_recording`]) as a spend's. Panics when the
/// nonce was spent and its event's write failed: every store here writes it.
pub fn spent(outcome: Result<Result<(), StoreError>, SpendError>) -> Result<(), SpendError> {
    outcome.map(|written| written.expect("a spent confirm's event is written"))
}

/// Every event kind, with each refusal and rejection that history can hold.
pub fn every_kind() -> Vec<EventKind> {
    let mut kinds = vec![
        EventKind::Issued,
        EventKind::Accepted,
        EventKind::Replay,
        EventKind::Denied,
        EventKind::Changed,
        EventKind::Opened,
        EventKind::Executed { ok: true },
        EventKind::Executed { ok: false },
        EventKind::OutcomeUnknown,
    ];
    kinds.extend(
        Refusal::ALL
            .into_iter()
            .map(|refusal| EventKind::Refused { refusal }),
    );
    kinds.extend(
        Rejection::ALL
            .into_iter()
            .map(|reason| EventKind::Rejected { reason }),
    );
    kinds
}

/// The pin of `server`'s `tool` at version `n` (its hash all `n`), taken at `at`.
pub fn pin(server: &str, tool: &str, n: u8, at: u64) -> ToolPin {
    ToolPin {
        server: server.into(),
        tool: tool.into(),
        hash: PlanHash::from_bytes([n; 32]),
        definition: format!("{{\"description\": \"version {n}\"}}"),
        pinned_at_ms: at,
    }
}

/// A grant of `kind` (a call grant with a plan, or a prefix grant for `conn-1`) granted at 1000
/// and expiring at `expires_at_ms`, not yet stored (`id` 0), never used.
pub fn grant(kind: GrantKind, expires_at_ms: u64) -> Grant {
    Grant {
        id: 0,
        kind,
        server: "builtin:/tmp/app.sqlite".into(),
        tool: "create_backup".into(),
        tenant: (kind == GrantKind::Prefix).then(|| "conn-1".into()),
        plan: (kind == GrantKind::Call).then(|| PlanHash::from_bytes([3; 32])),
        prefix: (kind == GrantKind::Prefix).then(|| "/home/a/docs".into()),
        target: "nightly".into(),
        summary: "create_backup on nightly".into(),
        class: GateClass::Token,
        definition: PlanHash::from_bytes([4; 32]),
        request: 7,
        granted_at_ms: 1_000,
        expires_at_ms,
        uses: 0,
        ended: None,
        mac: [9; 32],
    }
}
