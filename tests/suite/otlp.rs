//! Confirm events reach an OpenTelemetry collector from history, by the sink's cursor: a session's
//! events arrive once each and in order; while the collector is down they wait (and the records
//! say how many, and since when), across a restart of the sender; when it is back they all
//! arrive, none twice; two senders on the same records (two replicas) never both send.
//! The collector is real enough: it decodes the protobuf the sender posted (src/otlp.rs).

use std::sync::Arc;
use std::time::{Duration, Instant};

use countersign_core::chain::ChainKey;
use countersign_core::telemetry::{ConfirmEvent, EventKind, Rejection};
use countersign_core::{Nonce, PlanHash, Refusal};
use countersign_otlp::{SINK, Sender};
use countersign_store::{Records, Sqlite, Store, StoreOptions};
use countersign_tests::otlp::{Collector, attribute, seqs};
use tokio_util::sync::CancellationToken;

fn records(dir: &std::path::Path) -> Arc<dyn Records> {
    let options = StoreOptions::default().with_chain_key(Arc::new(ChainKey::from_seed(&[4; 32])));
    Arc::new(Sqlite::new(
        Store::open(dir.join("countersign.db"), options).unwrap(),
    ))
}

/// The events of one gated call's life and the refusals around it.
fn session(at: u64) -> Vec<ConfirmEvent> {
    let event = |kind, at_ms| ConfirmEvent {
        at_ms,
        kind,
        tool: "execute".into(),
        target: Some("users".into()),
        tenant: "conn-1".into(),
        nonce: Some(Nonce::from_bytes([7; 16])),
        plan: Some(PlanHash::from_bytes([8; 32])),
        note: None,
    };
    vec![
        event(EventKind::Issued, at),
        event(
            EventKind::Refused {
                refusal: Refusal::WrongTarget,
            },
            at + 1,
        ),
        event(EventKind::Accepted, at + 2),
        event(EventKind::Executed { ok: true }, at + 3),
        event(EventKind::Replay, at + 4),
        event(EventKind::Denied, at + 5),
        event(
            EventKind::Rejected {
                reason: Rejection::UnknownTool,
            },
            at + 6,
        ),
    ]
}

fn sender(records: &Arc<dyn Records>, collector: &Collector, holder: &str) -> CancellationToken {
    let target =
        countersign_otlp::Collector::new(&collector.endpoint(), "countersign-desk", holder)
            .unwrap();
    let stop = CancellationToken::new();
    let sender = Sender::new(
        records.clone(),
        target,
        holder,
        std::sync::Arc::new(countersign_engine::SystemClock),
    );
    tokio::spawn(sender.run(stop.clone()));
    stop
}

/// Waits (checking every 20 ms: the records have no event to wait on) until `ready` holds.
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut ready: impl FnMut() -> F) {
    let started = Instant::now();
    while !ready().await {
        assert!(started.elapsed() < Duration::from_secs(30), "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_events_arrive_once_each_in_order_and_wait_while_the_collector_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let records = records(dir.path());
    for e in session(1_000) {
        records.record(&e).await.unwrap();
    }
    let mut collector = Collector::start().await;
    let stop = sender(&records, &collector, "desk-1");
    let got = collector.wait_for(7, Duration::from_secs(30)).await;
    assert_eq!(seqs(&got), (1..=7).collect::<Vec<_>>());
    let kinds: Vec<String> = got
        .iter()
        .map(|r| attribute(r, "countersign.event").unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "issued", "refused", "accepted", "executed", "replay", "denied", "rejected"
        ]
    );
    let refused = &got[1];
    assert_eq!(
        attribute(refused, "countersign.code").unwrap(),
        "wrong_target"
    );
    assert_eq!(attribute(refused, "countersign.tool").unwrap(), "execute");
    assert_eq!(attribute(refused, "countersign.target").unwrap(), "users");
    assert_eq!(attribute(refused, "countersign.tenant").unwrap(), "conn-1");
    assert_eq!(
        attribute(refused, "countersign.plan_hash").unwrap(),
        PlanHash::from_bytes([8; 32]).to_hex()
    );
    assert_eq!(
        attribute(refused, "countersign.nonce").unwrap(),
        Nonce::from_bytes([7; 16]).to_hex()
    );
    assert_eq!(attribute(&got[3], "countersign.ok").unwrap(), "true");
    assert_eq!(refused.time_unix_nano, 1_001_000_000);
    assert_eq!(
        attribute(&got[1], "countersign.chain.prev"),
        attribute(&got[0], "countersign.chain.hash"),
        "each record names the one before"
    );
    let resource = collector.requests()[0].resource_logs[0]
        .resource
        .clone()
        .unwrap();
    assert!(
        resource.attributes.iter().any(|a| a.key == "service.name"),
        "{resource:?}"
    );
    until("the cursor reaches the head", || async {
        records.export_status(SINK).await.unwrap().unwrap().waiting == 0
    })
    .await;

    // Down: the next events wait, and the records say how many and since when.
    collector.down();
    for e in session(2_000).into_iter().take(5) {
        records.record(&e).await.unwrap();
    }
    until("the failure is noted", || async {
        records
            .export_status(SINK)
            .await
            .unwrap()
            .unwrap()
            .failing_since_ms
            .is_some()
    })
    .await;
    let status = records.export_status(SINK).await.unwrap().unwrap();
    assert_eq!((status.cursor, status.waiting), (7, 5), "{status:?}");
    assert!(
        status
            .last_error
            .as_deref()
            .unwrap()
            .contains("cannot be reached"),
        "{status:?}"
    );

    // The sender restarts (the desk restarts, the same holder) while the collector is still
    // down: nothing lost.
    stop.cancel();
    let stop = sender(&records, &collector, "desk-1");
    collector.up().await;
    let got = collector.wait_for(12, Duration::from_secs(30)).await;
    until("the cursor reaches the head again", || async {
        records.export_status(SINK).await.unwrap().unwrap().waiting == 0
    })
    .await;
    let status = records.export_status(SINK).await.unwrap().unwrap();
    assert_eq!(status.failing_since_ms, None);
    assert_eq!(seqs(&got), (1..=12).collect::<Vec<_>>());
    assert_eq!(
        seqs(&collector.records()),
        (1..=12).collect::<Vec<_>>(),
        "nothing twice"
    );
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_senders_on_the_same_records_send_each_event_once() {
    let dir = tempfile::tempdir().unwrap();
    let a = records(dir.path());
    let b = records(dir.path());
    let collector = Collector::start().await;
    let (stop_a, stop_b) = (
        sender(&a, &collector, "replica-a"),
        sender(&b, &collector, "replica-b"),
    );
    for round in 0..4 {
        for e in session(10_000 * (round + 1)) {
            a.record(&e).await.unwrap();
        }
    }
    collector.wait_for(28, Duration::from_secs(30)).await;
    until("the cursor reaches the head", || async {
        b.export_status(SINK).await.unwrap().unwrap().waiting == 0
    })
    .await;
    assert_eq!(seqs(&collector.records()), (1..=28).collect::<Vec<_>>());
    stop_a.cancel();
    stop_b.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_refuses_gets_every_event_again_and_a_huge_answer_is_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let records = records(dir.path());
    for e in session(1_000).into_iter().take(3) {
        records.record(&e).await.unwrap();
    }
    // 503: nothing is acknowledged; the batch comes again, and the events wait.
    let refusing = Collector::answering(503, b"busy".to_vec()).await;
    let stop = sender(&records, &refusing, "desk-1");
    let twice = refusing.wait_for(6, Duration::from_secs(30)).await;
    assert_eq!(seqs(&twice)[..6], [1, 2, 3, 1, 2, 3]);
    let status = records.export_status(SINK).await.unwrap().unwrap();
    assert_eq!((status.cursor, status.waiting), (0, 3), "{status:?}");
    assert!(
        status
            .last_error
            .as_deref()
            .unwrap()
            .contains("answered 503"),
        "{status:?}"
    );
    stop.cancel();
    // 200 with a body far longer than any answer: taken as acknowledged, never read whole.
    let huge = Collector::answering(200, vec![0xff; 8 * 1024 * 1024]).await;
    let stop = sender(&records, &huge, "desk-1");
    huge.wait_for(3, Duration::from_secs(30)).await;
    until("the cursor reaches the head", || async {
        records.export_status(SINK).await.unwrap().unwrap().waiting == 0
    })
    .await;
    stop.cancel();
}
