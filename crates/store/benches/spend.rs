//! What one durable ledger spend costs: `BEGIN IMMEDIATE`, one `INSERT`, `COMMIT` with WAL and
//! `synchronous=FULL`, on a real file (under the target directory, not a RAM-backed /tmp), with a
//! fresh nonce each iteration. The figure is dominated by the fsync of the WAL, which is the
//! point: a spend is on disk before the action it guards runs.
#![allow(missing_docs)] // the bench harness's macros define an undocumented `pub fn main`

use criterion::{Criterion, criterion_group, criterion_main};

use countersign_core::{Ledger, Nonce};
use countersign_store::{Store, StoreOptions};

fn spend(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a temporary directory");
    let mut store =
        Store::open(dir.path().join("countersign.db"), StoreOptions::default()).expect("the store");
    let mut counter: u128 = 0;
    c.bench_function("durable spend (WAL, synchronous=FULL, fresh nonce)", |b| {
        b.iter(|| {
            counter += 1;
            store
                .spend(&Nonce::from_bytes(counter.to_le_bytes()), u64::MAX)
                .expect("a fresh nonce spends");
        })
    });
}

criterion_group!(benches, spend);
criterion_main!(benches);
