//! Describing the built-in `execute`'s SQL never holds up the desk: a batch is run and rolled
//! back to be described, so a hostile agent's slow batches are described off the desk's async
//! runtimes (each connection's session runs on a thread and runtime of its own), a few at a time
//! across the desk, while that agent's other calls and every other agent's go on. Checked by
//! order, not by durations, through the real gateway binary.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use serde_json::json;

/// A batch whose first statement never ends on its own (reading a table, so the database's shared
/// lock shows it running): describing it runs into the time limit.
const ENDLESS: &str = "WITH RECURSIVE n(i) AS (SELECT count(*) FROM audit UNION ALL \
                       SELECT i + 1 FROM n) SELECT count(*) FROM n; DELETE FROM audit";

/// How many of them the hostile agent sends at once (more than the desk describes at once).
const HOSTILE_CALLS: usize = 6;

/// Whether some connection reads `db` right now (a rehearsal holds its shared lock).
fn being_read(db: &std::path::Path) -> bool {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.busy_timeout(Duration::ZERO).unwrap();
    match conn.execute_batch("BEGIN EXCLUSIVE") {
        Ok(()) => {
            conn.execute_batch("ROLLBACK").unwrap();
            false
        }
        Err(_) => true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_batches_being_described_never_hold_up_another_agents_open_call() {
    let desk = desk().await;
    let hostile_db = desk.dir.path().join("hostile.sqlite");
    rusqlite::Connection::open(&hostile_db)
        .unwrap()
        .execute_batch("CREATE TABLE audit (what TEXT)")
        .unwrap();
    let hostile = agent_on(&desk.socket, &hostile_db, &["--wait", "10"]).await;
    let other = agent_on(&desk.socket, &desk.dir.path().join("other.sqlite"), &[]).await;
    // Both upstreams are running before anything is sent.
    for agent in [&hostile, &other] {
        let r = call(agent, "query", json!({"sql": "SELECT 1 AS one"})).await;
        assert_ne!(r.is_error, Some(true), "{r:?}");
    }
    let order: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let mut sent = Vec::new();
    for _ in 0..HOSTILE_CALLS {
        let (peer, order) = (hostile.peer().clone(), Arc::clone(&order));
        sent.push(tokio::spawn(async move {
            let r = call(&peer, "execute", json!({ "sql": ENDLESS })).await;
            countersign_core::sync::lock(&order).push("hostile");
            r
        }));
    }
    // The desk is describing (a rehearsal reads the hostile database) before the other call.
    let mut tries = 0;
    while !being_read(&hostile_db) {
        tries += 1;
        assert!(tries < 2_000, "the desk never started describing");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let r = call(&other, "query", json!({"sql": "SELECT 2 AS two"})).await;
    countersign_core::sync::lock(&order).push("open");
    assert_eq!(
        r.structured_content.unwrap()["rows"],
        json!([{"two": 2}]),
        "the other agent's open call was answered"
    );
    let r = call(&other, "list_tables", json!({})).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    countersign_core::sync::lock(&order).push("open");
    // The hostile connection's own open call is not stuck behind its batches either.
    let r = call(&hostile, "query", json!({"sql": "SELECT 3 AS three"})).await;
    countersign_core::sync::lock(&order).push("open");
    assert_eq!(r.structured_content.unwrap()["rows"], json!([{"three": 3}]));
    for hostile in sent {
        let r = hostile.await.unwrap();
        assert_eq!(r.is_error, Some(true), "{r:?}");
        let said = text(&r);
        assert!(
            said.starts_with("Nothing was executed.") || said.contains("Nothing was executed."),
            "{said}"
        );
    }
    let order = countersign_core::sync::lock(&order).clone();
    assert_eq!(
        &order[..3],
        ["open", "open", "open"],
        "the open calls were answered before any hostile batch: {order:?}"
    );
    assert_eq!(order.len(), 3 + HOSTILE_CALLS);
    assert!(
        desk.engine.pending().is_empty(),
        "no plan naming unknown waits for a person"
    );
}
