//! The other side of the multi-process ledger tests.
//!
//! Real races and real faults need real processes: separate address spaces, separate SQLite
//! connections, locks held by someone else. This program does one thing per run, prints one line
//! per step on stdout for the test to read, and logs the store's own tracing (to stderr) when
//! `COUNTERSIGN_CHILD_LOG` is set (e.g. `countersign_store=debug`).
//!
//! Usage: `ledger_child MODE DB [NONCE_HEX] [BUSY_MS]`, modes:
//! * `spend`: open the store, print `ready`, wait for EOF on stdin, spend, print the outcome.
//! * `open-and-spend`: print `ready`, wait for EOF on stdin, then open the store, print
//!   `opened<TAB>MICROSECONDS`, and spend.
//! * `spend-over-size-limit`: open the store, set `RLIMIT_FSIZE` to the current size of the WAL
//!   (ignoring `SIGXFSZ`, so a write past it fails with `EFBIG`), spend, print the outcome.
//! * `hold-write-lock`: `BEGIN IMMEDIATE` on the file, print `locked`, wait for EOF on stdin.
//! * `postgres-spend`: DB is a PostgreSQL DSN: connect (one pooled connection), print `ready`,
//!   wait for EOF on stdin, spend, print the outcome.
//!
//! An outcome line is `OUTCOME<TAB>MICROSECONDS<TAB>DETAIL` with OUTCOME one of `ok`,
//! `already_spent`, `unreachable`, `open_error`.
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use countersign_core::{Ledger, Nonce, SpendError};
use countersign_store::{Postgres, PostgresOptions, Records, Store, StoreOptions};

/// Far enough in the future that no test prunes it.
const EXPIRES_AT_MS: u64 = 4_000_000_000_000;

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .expect("the test reads stdout");
}

/// Blocks until the parent closes our stdin: the release signal shared by every child.
fn wait_for_release() {
    let mut rest = Vec::new();
    std::io::stdin().read_to_end(&mut rest).expect("stdin");
}

fn report(outcome: &str, started: Instant, detail: &str) {
    say(&format!(
        "{outcome}\t{}\t{}",
        started.elapsed().as_micros(),
        detail.replace(['\t', '\n'], " ")
    ));
}

fn spend(store: &mut Store, nonce: &Nonce) {
    let started = Instant::now();
    report_spend(started, store.spend(nonce, EXPIRES_AT_MS));
}

fn report_spend(started: Instant, outcome: Result<(), SpendError>) {
    match outcome {
        Ok(()) => report("ok", started, ""),
        Err(SpendError::AlreadySpent) => report("already_spent", started, ""),
        Err(SpendError::Unreachable(reason)) => report("unreachable", started, &reason),
        Err(other) => report("unreachable", started, &other.to_string()),
    }
}

fn open(db: &Path, options: StoreOptions) -> Option<Store> {
    let started = Instant::now();
    match Store::open(db, options) {
        Ok(store) => Some(store),
        Err(err) => {
            report("open_error", started, &err.to_string());
            None
        }
    }
}

fn wal_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// Makes every write that would grow a file past its current WAL size fail with `EFBIG`.
fn limit_file_size_to_the_wal(db: &Path) -> u64 {
    let limit = std::fs::metadata(wal_path(db))
        .map(|m| m.len())
        .unwrap_or(0);
    // SAFETY: plain libc calls on this single-threaded process's own signal disposition and
    // resource limits; the arguments are valid for their whole duration.
    unsafe {
        assert_ne!(libc::signal(libc::SIGXFSZ, libc::SIG_IGN), libc::SIG_ERR);
        let mut current = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut current), 0);
        let lowered = libc::rlimit {
            rlim_cur: limit as libc::rlim_t,
            rlim_max: current.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lowered), 0);
    }
    limit
}

fn main() {
    if let Ok(filter) = std::env::var("COUNTERSIGN_CHILD_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).expect("MODE");
    let db = PathBuf::from(args.get(1).expect("DB"));
    let nonce = args
        .get(2)
        .map(|hex| Nonce::from_hex(hex).expect("NONCE_HEX: 32 lowercase hex digits"));
    let busy_ms = args
        .get(3)
        .map_or(5_000, |ms| ms.parse::<u64>().expect("BUSY_MS"));
    let options = StoreOptions::default().with_busy_timeout(Duration::from_millis(busy_ms));

    match mode {
        "spend" => {
            let Some(mut store) = open(&db, options) else {
                return;
            };
            say("ready");
            wait_for_release();
            spend(&mut store, &nonce.expect("NONCE_HEX"));
        }
        "open-and-spend" => {
            say("ready");
            wait_for_release();
            let started = Instant::now();
            let Some(mut store) = open(&db, options) else {
                return;
            };
            say(&format!("opened\t{}", started.elapsed().as_micros()));
            spend(&mut store, &nonce.expect("NONCE_HEX"));
        }
        "spend-over-size-limit" => {
            let Some(mut store) = open(&db, options) else {
                return;
            };
            let limit = limit_file_size_to_the_wal(&db);
            say(&format!("limit\t{limit}"));
            spend(&mut store, &nonce.expect("NONCE_HEX"));
        }
        "hold-write-lock" => {
            let conn = rusqlite::Connection::open(&db).expect("open");
            conn.execute_batch("BEGIN IMMEDIATE")
                .expect("take the write lock");
            say("locked");
            wait_for_release();
            conn.execute_batch("ROLLBACK")
                .expect("release the write lock");
        }
        "postgres-spend" => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            let dsn = args.get(1).expect("DSN");
            let options = PostgresOptions::default().with_pool_size(1);
            let started = Instant::now();
            let records = match runtime.block_on(Postgres::connect(dsn, options)) {
                Ok(records) => records,
                Err(err) => return report("open_error", started, &err.to_string()),
            };
            say("ready");
            wait_for_release();
            let nonce = nonce.expect("NONCE_HEX");
            let started = Instant::now();
            report_spend(
                started,
                runtime.block_on(records.spend(&nonce, EXPIRES_AT_MS)),
            );
        }
        other => panic!("unknown mode {other:?}"),
    }
}
