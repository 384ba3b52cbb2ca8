//! Fixtures shared by the unit tests: a store on a fresh temporary file, nonces, events.

use std::time::Duration;

use countersign_core::telemetry::{ConfirmEvent, EventKind};
use countersign_core::{GateClass, Nonce, PlanHash};
use tempfile::TempDir;

use crate::{Approval, Store, StoreOptions};

/// A store on a new file in a new temporary directory (kept alive by the returned guard).
pub(crate) fn temp_store() -> (TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("countersign.db"), StoreOptions::default()).unwrap();
    (dir, store)
}

/// Options with a short busy timeout, for tests that wait on a held lock.
pub(crate) fn short_timeout() -> StoreOptions {
    StoreOptions::default().with_busy_timeout(Duration::from_millis(200))
}

/// A nonce whose bytes are all `n`.
pub(crate) fn nonce(n: u8) -> Nonce {
    Nonce::from_bytes([n; 16])
}

/// A single-use approval under `nonce(n)` expiring at `expires_at_ms`.
pub(crate) fn approval(n: u8, expires_at_ms: u64) -> Approval {
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
pub(crate) fn event(at_ms: u64, kind: EventKind) -> ConfirmEvent {
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

/// A second, raw connection to the store's file, for tests that tamper with it or hold locks.
pub(crate) fn raw(store: &Store) -> rusqlite::Connection {
    rusqlite::Connection::open(store.path()).unwrap()
}
