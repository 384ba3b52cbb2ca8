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

/// Issue 19, item 3: `--format jsonl|csv` hands over every event of a range, oldest first, the
/// JSON exactly as recorded and the CSV with a header, quoting that survives commas, quotes and
/// newlines, and no cell a spreadsheet would run as a formula; bad bounds are refused.
#[test]
fn an_export_hands_over_every_event_of_its_range_oldest_first_and_nothing_runs_in_a_spreadsheet() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("desk.sqlite");
    let mut store = Store::open(&db, StoreOptions::default()).unwrap();
    let mut recorded = Vec::new();
    for (at, kind, note) in [
        (10, EventKind::Issued, None),
        (
            20,
            EventKind::Denied,
            Some("no, \"not\" today,\nsee ticket 7"),
        ),
        (30, EventKind::OutcomeUnknown, Some("the upstream exited")),
    ] {
        let mut e = event(at, "execute", kind);
        e.target = Some("=HYPERLINK(\"http://evil\")".into());
        e.note = note.map(str::to_owned);
        store.record(&e).unwrap();
        recorded.push(e);
    }
    drop(store);
    let before = bytes(&db);

    let out = history(&db, &["--format", "jsonl"]);
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<ConfirmEvent> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines, recorded, "every event, oldest first, as recorded");

    let out = history(&db, &["--format", "csv"]);
    assert!(out.status.success(), "{out:?}");
    let mut csv = csv::Reader::from_reader(out.stdout.as_slice());
    assert_eq!(
        csv.headers().unwrap().iter().collect::<Vec<_>>(),
        countersign::export::CSV_COLUMNS
    );
    let rows: Vec<csv::StringRecord> = csv.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 3);
    assert_eq!(&rows[0][0], "10");
    assert_eq!(&rows[0][1], "1970-01-01T00:00:00.01Z");
    assert_eq!(&rows[1][2], "denied");
    assert_eq!(&rows[1][9], "no, \"not\" today,\nsee ticket 7");
    assert_eq!(&rows[2][2], "outcome_unknown");
    assert_eq!(
        &rows[0][5], "'=HYPERLINK(\"http://evil\")",
        "written as text"
    );

    // A range: from 20 (included) to 30 (excluded).
    let out = history(&db, &["--format", "csv", "--since", "20", "--until", "30"]);
    let rows: Vec<csv::StringRecord> = csv::Reader::from_reader(out.stdout.as_slice())
        .records()
        .map(Result::unwrap)
        .collect();
    assert_eq!(rows.len(), 1);
    assert_eq!(&rows[0][0], "20");
    let out = history(&db, &["--format", "jsonl", "--since", "2026-12-01"]);
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");

    // Refused, with the reason: an empty range, a time that is none, a filter exports do not take.
    for args in [
        &["--format", "csv", "--since", "30", "--until", "20"][..],
        &["--format", "csv", "--since", "yesterday"],
        &["--format", "csv", "--tool", "execute"],
        &["--since", "20"],
    ] {
        let out = history(&db, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(!out.stderr.is_empty());
    }
    assert_eq!(bytes(&db), before, "the file was written to");
}

/// `countersign history ARGS…` (a check: `verify`, `head`).
fn check(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_countersign"))
        .arg("history")
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// A desk file with `n` events chained and signed by the returned key.
fn chained_file(dir: &Path, n: u64) -> (std::path::PathBuf, String) {
    let key = std::sync::Arc::new(countersign_core::chain::ChainKey::from_seed(&[3; 32]));
    let public = key.public_text();
    let db = dir.join("desk.sqlite");
    let mut store = Store::open(&db, StoreOptions::default().with_chain_key(key)).unwrap();
    for i in 1..=n {
        let mut e = event(i * 10, "execute", EventKind::Executed { ok: i % 2 == 0 });
        e.target = Some(format!("table{i}"));
        store.record(&e).unwrap();
    }
    (db, public)
}

#[test]
fn verify_checks_the_desks_file_and_names_an_edited_event() {
    let dir = tempfile::tempdir().unwrap();
    let (db, key) = chained_file(dir.path(), 5);
    let db_arg = db.to_str().unwrap();
    let (code, text) = check(&["verify", "--db", db_arg, "--key", &key]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("history intact: events #1 to #5"), "{text}");
    assert!(text.contains(&key), "{text}");

    // Without a key, the check says whose key it trusted.
    let (code, text) = check(&["verify", "--db", db_arg]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("the key the history names"), "{text}");

    // Another key: the head is not the desk's.
    let other = countersign_core::chain::ChainKey::from_seed(&[4; 32]).public_text();
    let (code, text) = check(&["verify", "--db", db_arg, "--key", &other]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("(wrong_key)"), "{text}");

    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute("UPDATE history SET ok = 1 WHERE seq = 3", [])
        .unwrap();
    let (code, text) = check(&["verify", "--db", db_arg, "--key", &key]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("history broken (edited): event #3 was edited"),
        "{text}"
    );
}

#[test]
fn a_head_kept_from_before_catches_a_file_whose_tail_was_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (db, key) = chained_file(dir.path(), 4);
    let db_arg = db.to_str().unwrap();
    let (code, head) = check(&["head", "--db", db_arg]);
    assert_eq!(code, 0, "{head}");
    let kept = dir.path().join("head.json");
    std::fs::write(&kept, &head).unwrap();
    let (code, text) = check(&[
        "verify",
        "--db",
        db_arg,
        "--key",
        &key,
        "--head",
        kept.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");

    // What a collector received of the last event: its number and hash.
    let conn = rusqlite::Connection::open(&db).unwrap();
    let last: String = conn
        .query_row("SELECT hash FROM history WHERE seq = 4", [], |r| r.get(0))
        .unwrap();
    let seen = format!("4:{last}");
    let (code, text) = check(&["verify", "--db", db_arg, "--key", &key, "--seen", &seen]);
    assert_eq!(code, 0, "{text}");
    // The last event and the head row go: what is left is a whole chain with no head.
    conn.execute_batch("DELETE FROM history WHERE seq = 4; DELETE FROM history_head;")
        .unwrap();
    let (code, text) = check(&[
        "verify",
        "--db",
        db_arg,
        "--key",
        &key,
        "--head",
        kept.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("(tail_cut)"), "{text}");
    assert!(text.contains("ends at event #3"), "{text}");
    // The same cut, caught against what the collector saw.
    let (code, text) = check(&["verify", "--db", db_arg, "--key", &key, "--seen", &seen]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("(tail_cut)"), "{text}");
    let (code, text) = check(&["verify", "--db", db_arg, "--seen", "4:nothex"]);
    assert_eq!(code, 2, "{text}");
}

#[test]
fn verify_checks_an_export_offline_and_names_each_change_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let (db, key) = chained_file(dir.path(), 5);
    let out = history(&db, &["--format", "jsonl"]);
    assert!(out.status.success(), "{out:?}");
    let export = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = export.lines().collect();
    assert_eq!(lines.len(), 6, "five events and the head: {export}");
    assert!(lines[5].starts_with("{\"head\":"), "{export}");
    let first: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(first["seq"], 1);
    assert_eq!(first["prev"], "0".repeat(64));

    let verify = |name: &str, lines: &[String]| {
        let path = dir.path().join(name);
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        check(&["verify", "--file", path.to_str().unwrap(), "--key", &key])
    };
    let owned: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    let (code, text) = verify("whole.jsonl", &owned);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("history intact: events #1 to #5"), "{text}");

    let mut edited = owned.clone();
    edited[1] = edited[1].replace("table2", "table9");
    let (code, text) = verify("edited.jsonl", &edited);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("(edited): event #2"), "{text}");

    let mut deleted = owned.clone();
    deleted.remove(2);
    let (code, text) = verify("deleted.jsonl", &deleted);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("(missing): events #3 to #3"), "{text}");

    let mut reordered = owned.clone();
    reordered.swap(1, 2);
    let (code, text) = verify("reordered.jsonl", &reordered);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("(reordered): event #2 comes after event #3"),
        "{text}"
    );

    let mut forged = owned.clone();
    let mut head: serde_json::Value = serde_json::from_str(&forged[5]).unwrap();
    head["head"]["atMs"] = serde_json::json!(1);
    forged[5] = head.to_string();
    let (code, text) = verify("forged.jsonl", &forged);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("(forged_head)"), "{text}");

    let mut cut = owned.clone();
    cut.remove(4);
    let (code, text) = verify("cut.jsonl", &cut);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("(tail_cut)"), "{text}");

    let mut no_head = owned.clone();
    no_head.pop();
    let (code, text) = verify("no-head.jsonl", &no_head);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("(no_head)"), "{text}");

    // A duplicated key could show one value and hash another: refused as unreadable.
    let mut duplicated = owned.clone();
    duplicated[0] = duplicated[0].replacen('{', "{\"tool\":\"other\",", 1);
    let (code, text) = verify("duplicated.jsonl", &duplicated);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("(unreadable): line 1"), "{text}");

    // A value of the wrong type (a number written as text): unreadable, not guessed at.
    let mut retyped = owned.clone();
    retyped[2] = retyped[2].replacen("\"seq\":3", "\"seq\":\"3\"", 1);
    assert_ne!(retyped[2], owned[2]);
    let (code, text) = verify("retyped.jsonl", &retyped);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("(unreadable): line 3"), "{text}");

    // The CSV export carries the chain's columns too.
    let out = history(&db, &["--format", "csv"]);
    let csv = String::from_utf8(out.stdout).unwrap();
    assert!(
        csv.lines().next().unwrap().ends_with(",seq,prev,hash"),
        "{csv}"
    );
}

#[test]
fn history_says_how_many_events_wait_for_an_unreachable_collector() {
    let dir = tempfile::tempdir().unwrap();
    let (db, _) = chained_file(dir.path(), 3);
    let mut store = Store::open(&db, StoreOptions::default()).unwrap();
    assert_eq!(
        store
            .export_claim(countersign_store::OTLP_SINK, "desk", 1_000, 10_000)
            .unwrap(),
        Some(0)
    );
    store
        .export_failed(
            countersign_store::OTLP_SINK,
            1_796_117_400_000,
            "connection refused",
        )
        .unwrap();
    drop(store);
    let out = history(&db, &[]);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(
            "3 events wait for the OpenTelemetry collector: it cannot be reached since \
             2026-12-01T09:30:00Z (connection refused)"
        ),
        "{said}"
    );
    // Nothing said when nothing waits.
    let mut store = Store::open(&db, StoreOptions::default()).unwrap();
    assert!(
        store
            .export_advance(countersign_store::OTLP_SINK, "desk", 0, 3)
            .unwrap()
    );
    drop(store);
    let out = history(&db, &["--format", "jsonl"]);
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("wait"),
        "{out:?}"
    );
}
