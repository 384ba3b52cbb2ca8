//! The history's chain on a real SQLite file: each change someone could make to the file behind
//! the desk's back (an edited row, a deleted one, rows moved, a forged or re-signed head, a tail
//! cut off) is made with plain SQL, and [`HistoryReader::verify`] must name it.

use std::sync::Arc;

use countersign_core::Refusal;
use countersign_core::chain::{Break, ChainKey, SignedHead};
use countersign_core::telemetry::EventKind;
use tempfile::TempDir;

use crate::test_support::{event, raw};
use crate::{HistoryReader, Store, StoreOptions};

fn key() -> Arc<ChainKey> {
    Arc::new(ChainKey::from_seed(&[5; 32]))
}

/// A store whose head is signed by [`key`], with `n` events recorded (targets t1..tn).
fn recorded(n: u64) -> (TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions::default().with_chain_key(key());
    let mut store = Store::open(dir.path().join("countersign.db"), options).unwrap();
    for i in 1..=n {
        store.record(&numbered(i)).unwrap();
    }
    (dir, store)
}

fn numbered(i: u64) -> countersign_core::telemetry::ConfirmEvent {
    let mut e = event(
        1_000 + i,
        if i.is_multiple_of(2) {
            EventKind::Issued
        } else {
            EventKind::Refused {
                refusal: Refusal::Expired,
            }
        },
    );
    e.target = Some(format!("t{i}"));
    e
}

fn verify(store: &Store, kept: &[SignedHead]) -> Result<countersign_core::chain::Intact, Break> {
    let mut walk = countersign_core::chain::Walk::new(Some(key().public()));
    for head in kept {
        walk.expect(*head)?;
    }
    HistoryReader::open(store.path(), &StoreOptions::default())
        .unwrap()
        .verify(walk)
        .unwrap()
}

fn head(store: &Store) -> SignedHead {
    HistoryReader::open(store.path(), &StoreOptions::default())
        .unwrap()
        .heads()
        .unwrap()
        .head
        .unwrap()
}

#[test]
fn a_history_recorded_with_the_key_verifies_whole() {
    let (_dir, store) = recorded(6);
    let intact = verify(&store, &[]).unwrap();
    assert_eq!((intact.first, intact.last), (Some(1), Some(6)));
    assert_eq!(intact.head.unwrap().head.seq, 6);
    assert!(!intact.pruned_before);
}

#[test]
fn an_edited_row_is_named() {
    let (_dir, store) = recorded(6);
    raw(&store)
        .execute("UPDATE history SET target = 'users' WHERE seq = 3", [])
        .unwrap();
    assert_eq!(verify(&store, &[]), Err(Break::Edited { seq: 3 }));
}

#[test]
fn an_edited_row_given_a_new_hash_is_named_at_the_next() {
    let (_dir, store) = recorded(6);
    let conn = raw(&store);
    conn.execute("UPDATE history SET target = 'users' WHERE seq = 3", [])
        .unwrap();
    // Whoever edits can hash the row again (the hash is public); not the rest of the chain.
    let reader = HistoryReader::open(store.path(), &StoreOptions::default()).unwrap();
    let mut rehashed = None;
    reader
        .each_link(|stored| {
            let (link, _) = stored.link().unwrap();
            if link.seq == 3 {
                rehashed = Some(link.hash().to_hex());
            }
            Ok::<_, crate::StoreError>(())
        })
        .unwrap();
    conn.execute(
        "UPDATE history SET hash = ?1 WHERE seq = 3",
        [rehashed.unwrap()],
    )
    .unwrap();
    assert_eq!(
        verify(&store, &[]),
        Err(Break::Unlinked { seq: 4, after: 3 })
    );
}

#[test]
fn a_deleted_row_is_named() {
    let (_dir, store) = recorded(6);
    raw(&store)
        .execute("DELETE FROM history WHERE seq = 2", [])
        .unwrap();
    assert_eq!(verify(&store, &[]), Err(Break::Missing { from: 2, to: 2 }));
}

#[test]
fn rows_moved_are_named() {
    let (_dir, store) = recorded(6);
    // Swap the 3rd and 4th rows' places in the file: every column, ids kept.
    let conn = raw(&store);
    conn.execute_batch(
        "CREATE TEMP TABLE moved AS SELECT * FROM history WHERE seq IN (3, 4);
         DELETE FROM history WHERE seq IN (3, 4);
         INSERT INTO history SELECT id + CASE seq WHEN 3 THEN 1 ELSE -1 END, at_ms, kind,
             refusal, ok, tool, target, tenant, nonce, plan, note, seq, prev, hash FROM moved;",
    )
    .unwrap();
    assert_eq!(
        verify(&store, &[]),
        Err(Break::Reordered { seq: 3, after: 4 })
    );
}

#[test]
fn a_forged_head_is_named() {
    let (_dir, store) = recorded(6);
    raw(&store)
        .execute(
            "UPDATE history_head SET signature = zeroblob(64) WHERE role = 'head'",
            [],
        )
        .unwrap();
    assert_eq!(verify(&store, &[]), Err(Break::ForgedHead { seq: 6 }));
}

#[test]
fn a_head_signed_by_another_key_is_named() {
    let (_dir, store) = recorded(3);
    let mut other = head(&store);
    let resigned = ChainKey::from_seed(&[6; 32]).sign(other.head);
    other.key = resigned.key;
    other.signature = resigned.signature;
    raw(&store)
        .execute(
            "UPDATE history_head SET public_key = ?1, signature = ?2 WHERE role = 'head'",
            rusqlite::params![&other.key[..], &other.signature[..]],
        )
        .unwrap();
    assert!(matches!(
        verify(&store, &[]),
        Err(Break::WrongKey { seq: 3, .. })
    ));
}

#[test]
fn a_tail_cut_off_is_named_against_the_head_the_file_kept() {
    let (_dir, store) = recorded(6);
    raw(&store)
        .execute("DELETE FROM history WHERE seq > 4", [])
        .unwrap();
    assert_eq!(
        verify(&store, &[]),
        Err(Break::TailCut { last: 4, head: 6 })
    );
}

#[test]
fn a_tail_cut_off_and_signed_again_is_named_against_a_head_kept_elsewhere() {
    let (_dir, mut store) = recorded(6);
    let kept = head(&store);
    store.record(&numbered(7)).unwrap();
    // Someone who holds the key cuts #5 to #7 and signs #4 as the head.
    let conn = raw(&store);
    conn.execute("DELETE FROM history WHERE seq > 4", [])
        .unwrap();
    let four: String = conn
        .query_row("SELECT hash FROM history WHERE seq = 4", [], |r| r.get(0))
        .unwrap();
    let resigned = key().sign(countersign_core::chain::Head {
        seq: 4,
        hash: countersign_core::chain::ChainHash::from_hex(&four).unwrap(),
        at_ms: 2_000,
    });
    conn.execute(
        "UPDATE history_head SET seq = 4, hash = ?1, at_ms = 2000, signature = ?2
         WHERE role = 'head'",
        rusqlite::params![four, &resigned.signature[..]],
    )
    .unwrap();
    assert!(verify(&store, &[]).is_ok(), "the file alone holds");
    assert_eq!(
        verify(&store, &[kept]),
        Err(Break::TailCut { last: 4, head: 6 })
    );
}

#[test]
fn events_recorded_without_the_key_are_chained_and_said_to_be_unsigned() {
    let (dir, store) = recorded(3);
    drop(store);
    let mut unsigned =
        Store::open(dir.path().join("countersign.db"), StoreOptions::default()).unwrap();
    unsigned.record(&numbered(4)).unwrap();
    assert_eq!(verify(&unsigned, &[]), Err(Break::Unsigned { from: 4 }));
}

#[test]
fn events_recorded_before_the_chain_are_chained_by_the_next_event() {
    let (_dir, mut store) = recorded(0);
    let conn = raw(&store);
    for i in 1..=3 {
        conn.execute(
            "INSERT INTO history (at_ms, kind, refusal, tool, target, tenant)
             VALUES (?1, 'refused', 'expired', 'execute', ?2, 'conn-1')",
            rusqlite::params![i, format!("old{i}")],
        )
        .unwrap();
    }
    assert!(matches!(verify(&store, &[]), Err(Break::Unreadable { .. })));
    store.record(&numbered(4)).unwrap();
    let intact = verify(&store, &[]).unwrap();
    assert_eq!((intact.first, intact.last), (Some(1), Some(4)));
}

#[test]
fn a_prune_signs_where_the_chain_starts_and_a_deletion_at_the_start_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions::default()
        .with_chain_key(key())
        .with_history_rows(3);
    let mut store = Store::open(dir.path().join("countersign.db"), options).unwrap();
    for i in 1..=8 {
        store.record(&numbered(i)).unwrap();
    }
    assert_eq!(store.prune(5_000).unwrap().history, 5);
    let intact = verify(&store, &[]).unwrap();
    assert_eq!((intact.first, intact.last), (Some(6), Some(8)));
    assert!(intact.pruned_before);
    // Deleting the oldest kept event looks like a prune, but nothing signed says so.
    raw(&store)
        .execute("DELETE FROM history WHERE seq = 6", [])
        .unwrap();
    assert_eq!(verify(&store, &[]), Err(Break::UnmarkedStart { seq: 7 }));
}

#[test]
fn a_deletion_at_the_start_of_an_unpruned_history_is_named() {
    let (_dir, store) = recorded(4);
    raw(&store)
        .execute("DELETE FROM history WHERE seq = 1", [])
        .unwrap();
    assert_eq!(verify(&store, &[]), Err(Break::UnmarkedStart { seq: 2 }));
}
