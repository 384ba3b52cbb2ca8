//! 64 processes spend the same nonce at the same moment: exactly one succeeds, every other one is
//! told it was already spent, and none is refused as unreachable (busy).
//!
//! Threads in one process would share SQLite's in-process locks; only separate processes race on
//! the file locks the desk and its peers really contend for. Each round uses a fresh file; the
//! children are released together by closing the one pipe that is all their stdin.

use std::time::Instant;

use countersign_core::Nonce;
use countersign_store::{Store, StoreOptions};
use countersign_tests::{Spend, assert_ready, spawn_group};

const CHILD: &str = env!("CARGO_BIN_EXE_ledger_child");
const PROCESSES: usize = 64;
const ROUNDS: usize = 10;
/// Makes each child log the store's open retries on stderr, so the test can count them.
const LOG: (&str, &str) = ("COUNTERSIGN_CHILD_LOG", "countersign_store=debug");

struct Round {
    ok: usize,
    already_spent: usize,
    slowest_spend_ms: f64,
    slowest_open_ms: f64,
    open_retries: usize,
    a_retry: Option<String>,
    millis: u128,
}

/// Runs one round in `mode` (`spend`: the file exists and each child has it open before the
/// release; `open-and-spend`: the file does not exist and each child opens it after the release).
fn round(mode: &str, round: usize) -> Round {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let db = dir.path().join("countersign.db");
    let db_arg = db.to_str().unwrap();
    let nonce = Nonce::from_bytes([round as u8; 16]).to_hex();
    if mode == "spend" {
        // An existing, current ledger: the race is on the spend alone.
        drop(Store::open(&db, StoreOptions::default()).unwrap());
    }
    let started = Instant::now();
    let (mut release, children) = spawn_group(CHILD, &[mode, db_arg, &nonce], &[LOG], PROCESSES);
    assert_ready(&children);
    if mode == "open-and-spend" {
        assert!(
            !db.exists(),
            "the file must be brand new when the children are released"
        );
    }
    release.release();
    let finished: Vec<_> = children.into_iter().map(|c| c.finish()).collect();
    let millis = started.elapsed().as_millis();

    let mut result = Round {
        ok: 0,
        already_spent: 0,
        slowest_spend_ms: 0.0,
        slowest_open_ms: 0.0,
        open_retries: 0,
        a_retry: None,
        millis,
    };
    for child in &finished {
        assert!(child.status.success(), "a child failed: {child:?}");
        let outcome = child
            .outcome()
            .unwrap_or_else(|| panic!("no outcome from {child:?}"));
        match outcome.spend {
            Spend::Ok => result.ok += 1,
            Spend::AlreadySpent => result.already_spent += 1,
            Spend::Unreachable | Spend::OpenError => {
                panic!(
                    "{mode} round {round}: a child was refused: {outcome:?}\n{}",
                    child.stderr
                )
            }
        }
        result.slowest_spend_ms = result.slowest_spend_ms.max(outcome.micros as f64 / 1000.0);
        for line in child.stderr.lines().filter(|l| l.contains("retrying")) {
            result.open_retries += 1;
            result.a_retry.get_or_insert_with(|| line.to_owned());
        }
        for opened in child
            .lines
            .iter()
            .filter_map(|l| l.strip_prefix("opened\t"))
        {
            let ms = opened.parse::<f64>().unwrap() / 1000.0;
            result.slowest_open_ms = result.slowest_open_ms.max(ms);
        }
    }
    assert_eq!(
        result.ok, 1,
        "{mode} round {round}: exactly one spend succeeds"
    );
    assert_eq!(
        result.already_spent,
        PROCESSES - 1,
        "{mode} round {round}: the rest are replays"
    );
    result
}

fn race(mode: &str) {
    let mut a_retry = None;
    for n in 0..ROUNDS {
        let r = round(mode, n);
        eprintln!(
            "{mode} round {n}: {} ok, {} already spent, slowest open {:.1} ms, slowest spend {:.1} ms, \
             {} open retries, round {} ms",
            r.ok, r.already_spent, r.slowest_open_ms, r.slowest_spend_ms, r.open_retries, r.millis
        );
        a_retry = a_retry.or(r.a_retry);
    }
    if let Some(line) = a_retry {
        eprintln!("{mode}: an open that was retried: {line}");
    }
}

#[test]
fn sixty_four_processes_spending_one_nonce_spend_it_once() {
    race("spend");
}

#[test]
fn sixty_four_processes_opening_a_new_ledger_and_spending_one_nonce_spend_it_once() {
    race("open-and-spend");
}
