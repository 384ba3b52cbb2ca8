//! What a spend costs on each implementation of `Records`, side by side in one run: throughput
//! (spends per second, one after another and from 8 concurrent tasks) and the latency of a whole
//! confirm's ledger path, verify + spend (p50, p99), on the desk's SQLite file (WAL,
//! `synchronous=FULL`) and on PostgreSQL (`COUNTERSIGN_TEST_POSTGRES`, e.g. under
//! `.ci/with-postgres`, which is a local server with its default durability). Verify is core's
//! chain (token decode, signature, expiry, tenant, tool, target, plan) on a freshly minted token,
//! without the ledger; the spend follows. Prints a table; asserts nothing.
//!
//!   .ci/with-postgres cargo bench -p countersign-store --features postgres --bench records
#![allow(missing_docs)] // the bench harness's macros define an undocumented `pub fn main`

use std::sync::Arc;
use std::time::{Duration, Instant};

use countersign_core::token::{self, Claims, SigningKey};
use countersign_core::verify::{Confirm, verify};
use countersign_core::{MemoryLedger, Nonce, PlanHash};
use countersign_store::{Records, Sqlite, Store, StoreOptions};

const SEQUENTIAL: usize = 2_000;
const CONCURRENT_TASKS: usize = 8;
const PER_TASK: usize = 250;
const LATENCY_SAMPLES: usize = 2_000;
const EXPIRES_AT_MS: u64 = 4_000_000_000_000;

/// Fresh nonces: a per-run prefix and a counter, so runs against one database never collide.
fn nonce(run: u64, n: u64) -> Nonce {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&run.to_le_bytes());
    bytes[8..].copy_from_slice(&n.to_le_bytes());
    Nonce::from_bytes(bytes)
}

struct Figures {
    sequential_per_s: f64,
    concurrent_per_s: f64,
    p50: Duration,
    p99: Duration,
}

async fn measure(records: Arc<dyn Records>, run: u64) -> Figures {
    let mut n = 0;
    let started = Instant::now();
    for _ in 0..SEQUENTIAL {
        n += 1;
        records.spend(&nonce(run, n), EXPIRES_AT_MS).await.unwrap();
    }
    let sequential_per_s = SEQUENTIAL as f64 / started.elapsed().as_secs_f64();

    let started = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENT_TASKS as u64)
        .map(|task| {
            let records = records.clone();
            tokio::spawn(async move {
                for i in 0..PER_TASK as u64 {
                    let n = 1_000_000 * (task + 1) + i;
                    records.spend(&nonce(run, n), EXPIRES_AT_MS).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let concurrent_per_s = (CONCURRENT_TASKS * PER_TASK) as f64 / started.elapsed().as_secs_f64();

    let key = SigningKey::new(&[7u8; 32]).unwrap();
    let plan = PlanHash::of_bytes(b"DELETE FROM backups WHERE name = 'nightly'");
    let mut samples = Vec::with_capacity(LATENCY_SAMPLES);
    for i in 0..LATENCY_SAMPLES as u64 {
        let claims = Claims {
            tool: "delete_backup".into(),
            target: "nightly".into(),
            plan,
            tenant: "conn-1".into(),
            iat: 1_000,
            exp: EXPIRES_AT_MS,
            nonce: nonce(run, 10_000_000 + i),
        };
        let minted = token::mint(&key, &claims);
        let started = Instant::now();
        let confirm = Confirm {
            token: Some(minted.expose()),
            confirm_target: Some("nightly"),
            tenant: "conn-1",
            tool: "delete_backup",
            target: "nightly",
            plan,
        };
        // The chain without the ledger (not single-use here), then the spend.
        let verified = verify(&key, &confirm, false, 2_000, &mut MemoryLedger::new()).unwrap();
        records.spend(&verified.nonce, verified.exp).await.unwrap();
        samples.push(started.elapsed());
    }
    samples.sort();
    Figures {
        sequential_per_s,
        concurrent_per_s,
        p50: samples[samples.len() / 2],
        p99: samples[samples.len() * 99 / 100],
    }
}

fn row(name: &str, f: &Figures) {
    println!(
        "{name:<28} {:>14.0} {:>16.0} {:>12.3} {:>12.3}",
        f.sequential_per_s,
        f.concurrent_per_s,
        f.p50.as_secs_f64() * 1000.0,
        f.p99.as_secs_f64() * 1000.0
    );
}

fn main() {
    // `cargo test --benches` runs this with `--bench`-less arguments too; it is quick enough.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    println!(
        "{:<28} {:>14} {:>16} {:>12} {:>12}",
        "records", "seq spends/s", "8-task spends/s", "v+s p50 ms", "v+s p99 ms"
    );
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let store = Store::open(dir.path().join("countersign.db"), StoreOptions::default()).unwrap();
    let sqlite = runtime.block_on(measure(Arc::new(Sqlite::new(store)), run));
    row("SQLite (WAL, sync=FULL)", &sqlite);

    #[cfg(feature = "postgres")]
    match std::env::var("COUNTERSIGN_TEST_POSTGRES") {
        Ok(dsn) => {
            use countersign_store::{Postgres, PostgresOptions};
            let postgres = runtime.block_on(async {
                let records = Postgres::connect(&dsn, PostgresOptions::default())
                    .await
                    .unwrap();
                measure(Arc::new(records), run).await
            });
            row("PostgreSQL (local, pooled)", &postgres);
        }
        Err(_) => println!(
            "PostgreSQL: not measured (COUNTERSIGN_TEST_POSTGRES is not set): run \
             `.ci/with-postgres cargo bench -p countersign-store --features postgres --bench records`"
        ),
    }
    #[cfg(not(feature = "postgres"))]
    println!("PostgreSQL: not measured (build with --features postgres, under .ci/with-postgres)");
}
