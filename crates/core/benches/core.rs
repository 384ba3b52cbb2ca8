//! The core's hot paths, side by side in one run: minting, a full verification (reusable and
//! single-use against the in-memory ledger), and the canonical hash of a 1 MiB plan.
//! Targets on the reference machine: mint and verify at most 5 µs each.
#![allow(missing_docs)] // the bench harness's macros define an undocumented `pub fn main`

use std::hint::black_box;

use countersign_core::plan::Plan;
use countersign_core::token::{Claims, Nonce, SigningKey, mint};
use countersign_core::verify::{Confirm, verify};
use countersign_core::{MemoryLedger, PlanHash};
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;

fn claims(nonce: u128) -> Claims {
    Claims {
        tool: "execute".into(),
        target: "main.db".into(),
        plan: PlanHash::from_bytes([7; 32]),
        tenant: "conn-1".into(),
        iat: 1_000,
        exp: 601_000,
        nonce: Nonce::from_bytes(nonce.to_le_bytes()),
    }
}

fn confirm(token: &str) -> Confirm<'_> {
    Confirm {
        token: Some(token),
        confirm_target: Some("main.db"),
        tenant: "conn-1",
        tool: "execute",
        target: "main.db",
        plan: PlanHash::from_bytes([7; 32]),
    }
}

fn one_mib_plan() -> Plan {
    let rows: Vec<_> = (0..12_200)
        .map(|i| json!({"id": i, "name": format!("row-{i}"), "score": i as f64 / 7.0, "tags": ["a", "b", null], "ok": i % 2 == 0}))
        .collect();
    Plan {
        tool: "execute".into(),
        target: "main.db".into(),
        action: "insert".into(),
        summary: "Insert rows into main.db".into(),
        details: json!({"rows": rows, "table": "t"}),
        reversible: false,
    }
}

fn benches(c: &mut Criterion) {
    let key = SigningKey::new(&[0x33; 32]).unwrap();
    c.bench_function("mint", |b| {
        b.iter(|| mint(black_box(&key), black_box(&claims(1))))
    });

    let token = mint(&key, &claims(1));
    let mut ledger = MemoryLedger::new();
    c.bench_function("verify (token class)", |b| {
        b.iter(|| {
            verify(
                &key,
                black_box(&confirm(token.expose())),
                false,
                2_000,
                &mut ledger,
            )
            .unwrap()
        })
    });

    let mut n = 0u128;
    c.bench_function("verify (once class, in-memory ledger)", |b| {
        b.iter_batched(
            || {
                n += 1;
                mint(&key, &claims(n))
            },
            |t| verify(&key, &confirm(t.expose()), true, 2_000, &mut ledger).unwrap(),
            criterion::BatchSize::SmallInput,
        )
    });

    let plan = one_mib_plan();
    let size = plan.canonical_json().unwrap().len();
    eprintln!("canonical plan size: {size} bytes");
    let mut group = c.benchmark_group("plan hash");
    group.throughput(criterion::Throughput::Bytes(size as u64));
    group.bench_function("canonical hash of a 1 MiB plan", |b| {
        b.iter(|| black_box(&plan).hash().unwrap())
    });
    group.finish();
}

criterion_group!(core, benches);
criterion_main!(core);
