//! `countersign history` reads the desk's file without writing to it: the events as the store
//! recorded them (newest first, filtered), the file left byte for byte as it was, and a file of a
//! newer Countersign refused rather than read or converted.

use std::path::Path;
use std::process::Command;

use countersign_core::telemetry::{ConfirmEvent, EventKind};
use countersign_store::{HistoryFilter, Store, StoreOptions};

fn event(at_ms: u64, tool: &str, kind: EventKind) -> ConfirmEvent {
    ConfirmEvent {
        at_ms,
        kind,
        tool: tool.into(),
        target: Some("main.db".into()),
        tenant: "conn-1".into(),
        nonce: None,
        plan: None,
        note: None,
    }
}

fn history(db: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_countersign"))
        .arg("history")
        .arg("--db")
        .arg(db)
        .args(args)
        .output()
        .unwrap()
}

/// The bytes of the desk's file (SQLite may create an empty `-wal` and `-shm` beside it, as any
/// reader of a WAL file does; the file itself must not change).
fn bytes(db: &Path) -> Vec<u8> {
    std::fs::read(db).unwrap()
}

#[test]
fn history_prints_what_the_desk_recorded_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("desk.sqlite");
    let mut store = Store::open(&db, StoreOptions::default()).unwrap();
    store
        .record(&event(10, "execute", EventKind::Issued))
        .unwrap();
    store
        .record(&event(20, "query", EventKind::Accepted))
        .unwrap();
    store
        .record(&event(30, "execute", EventKind::Executed { ok: true }))
        .unwrap();
    let expected: Vec<String> = store
        .history(&HistoryFilter::default().tool("execute").limit(5))
        .unwrap()
        .iter()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect();
    drop(store);
    let before = bytes(&db);

    let out = history(&db, &["--json", "--tool", "execute", "--limit", "5"]);
    assert!(out.status.success(), "{out:?}");
    let printed: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(printed, expected);
    assert_eq!(printed.len(), 2);

    let table = history(&db, &[]);
    assert!(table.status.success(), "{table:?}");
    let table = String::from_utf8(table.stdout).unwrap();
    assert_eq!(table.lines().count(), 3, "{table}");
    assert!(
        table.lines().next().unwrap().contains("executed"),
        "{table}"
    );

    assert_eq!(bytes(&db), before, "the file was written to");
}

#[test]
fn a_file_of_a_newer_countersign_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("desk.sqlite");
    drop(Store::open(&db, StoreOptions::default()).unwrap());
    rusqlite::Connection::open(&db)
        .unwrap()
        .pragma_update(None, "user_version", 999)
        .unwrap();
    let before = bytes(&db);
    let out = history(&db, &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("newer"), "{stderr}");
    assert_eq!(bytes(&db), before);
}

#[test]
fn no_file_is_no_history_yet_and_none_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("desk.sqlite");
    let out = history(&db, &[]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("no history yet")
    );
    assert!(!db.exists());
}
