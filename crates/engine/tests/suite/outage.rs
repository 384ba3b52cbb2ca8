//! The desk's records unreadable: every call is refused `ledger_unreachable` (an outage, retry
//! shortly, nothing executed), never `tool_changed`, "no grant" or a wait for a person; and once
//! the records can be read again, the same engine serves every kind of call again, a token
//! minted before the outage included.
//!
//! On a real SQLite file, made unreadable as a disk fault or a stray write would make it: the
//! file (with its `-wal` and `-shm`) set aside and other bytes put at its path. The store notices
//! the file was replaced, drops its connection, and every read fails until the very file is put
//! back. The only click is the engine's approve path.

use countersign_core::Tenant;
use std::path::{Path, PathBuf};
use std::time::Duration;

use countersign_core::{Refusal, ServerId};
use countersign_engine::authority::RECORDS_UNREADABLE;
use countersign_engine::{Accepted, Approved, Engine, QueueChange, Stopped};
use serde_json::{Value, json};

use countersign_tests::engine::Desk;

fn desk() -> Desk {
    Desk::new(|_| {})
}

fn tools() -> Vec<Value> {
    let id = json!({"type": "object", "properties": {"id": {"type": "string"}}});
    vec![
        json!({"name": "read", "annotations": {"readOnlyHint": true}}),
        // Destructive: class once, never grantable.
        json!({"name": "delete", "annotations": {"destructiveHint": true}, "inputSchema": id}),
        // Not destructive, idempotent: class token, and a grant may cover it.
        json!({"name": "backup", "annotations": {"destructiveHint": false, "idempotentHint": true},
               "inputSchema": id}),
    ]
}

async fn connect(engine: &Engine) -> Tenant {
    let tenant = engine.connect(ServerId::Command("outage-test-server".into()));
    engine.register_tools(&tenant, tools()).await.unwrap();
    tenant
}

/// The preflight of `tool` with `args`, approved by the engine's approve path as a click would:
/// the token and its target.
async fn approved(engine: &Engine, tenant: &Tenant, tool: &str, args: &Value) -> (String, String) {
    let mut changes = engine.subscribe();
    let clicker = engine.clone();
    let click = tokio::spawn(async move {
        loop {
            if let Ok(QueueChange::Added { request }) = changes.recv().await {
                // The target typed, as the window asks for a destructive tool.
                let typed = request.plan.target.clone();
                clicker.approve(request.id, Some(&typed)).await.unwrap();
                return;
            }
        }
    });
    let answer = engine
        .preflight(tenant, tool, args, Duration::from_secs(5))
        .await;
    click.await.unwrap();
    match answer {
        Ok(Approved { token, target, .. }) => (token, target),
        other => panic!("expected an approval, got {other:?}"),
    }
}

fn confirm_of(args: &Value, target: &str, token: &str) -> Value {
    let mut args = args.clone();
    args["confirm"] = json!(true);
    args["confirmTarget"] = json!(target);
    args["confirmToken"] = json!(token);
    args
}

/// The desk's records file made unreadable until [`Outage::end`].
struct Outage {
    path: PathBuf,
    aside: PathBuf,
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

impl Outage {
    fn begin(path: &Path) -> Outage {
        let aside = with_suffix(path, ".aside");
        for suffix in ["", "-wal", "-shm"] {
            let from = with_suffix(path, suffix);
            if from.exists() {
                std::fs::rename(&from, with_suffix(&aside, suffix)).unwrap();
            }
        }
        std::fs::write(
            path,
            b"not the desk's records: a disk that lost them".repeat(200),
        )
        .unwrap();
        Outage {
            path: path.to_owned(),
            aside,
        }
    }

    /// The very file back in its place.
    fn end(self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(with_suffix(&self.path, suffix));
            let from = with_suffix(&self.aside, suffix);
            if from.exists() {
                std::fs::rename(&from, with_suffix(&self.path, suffix)).unwrap();
            }
        }
    }
}

/// Whether `answer` is the outage's refusal, said as one.
fn is_outage<T: std::fmt::Debug>(answer: &Result<T, Stopped>) -> bool {
    match answer {
        Err(stopped) => {
            stopped.refusal() == Some(Refusal::LedgerUnreachable)
                && stopped.message() == RECORDS_UNREADABLE
        }
        Ok(_) => false,
    }
}

#[tokio::test]
async fn records_unreadable_refuse_every_kind_of_call_as_an_outage_and_serve_again_once_back() {
    let d = desk();
    let tenant = connect(&d.engine).await;
    let delete = json!({"id": "row-1"});
    let (token, target) = approved(&d.engine, &tenant, "delete", &delete).await;

    let outage = Outage::begin(&d.path);
    // The upstream's listing cannot be compared with the pins: an outage, not "nothing pinned".
    let listing = d.engine.register_tools(&tenant, tools()).await;
    assert!(is_outage(&listing), "{listing:?}");
    assert!(
        d.engine.pending().is_empty(),
        "no tool change is put to the person for an unreadable pin: {:?}",
        d.engine.pending()
    );
    // An open call, a gated preflight, and the confirm of a token minted before the outage.
    let open = d.engine.open_call(&tenant, "read").await;
    assert!(is_outage(&open), "{open:?}");
    let preflight = d
        .engine
        .preflight(&tenant, "delete", &json!({"id": "row-2"}), Duration::ZERO)
        .await;
    assert!(is_outage(&preflight), "{preflight:?}");
    assert!(
        d.engine.pending().is_empty(),
        "nothing asked of the person while the records are unreadable"
    );
    let confirm = d
        .engine
        .confirm(&tenant, "delete", &confirm_of(&delete, &target, &token))
        .await;
    assert!(is_outage(&confirm), "{confirm:?}");
    assert!(!d.engine.forwards_open(&tenant, "read"));

    // Back: the same engine, no restart. The listing compares, and every call runs again.
    outage.end();
    let listed = d.engine.register_tools(&tenant, tools()).await.unwrap();
    assert!(listed.iter().all(|t| t.listed_as.is_none()), "{listed:?}");
    assert_eq!(d.engine.open_call(&tenant, "read").await, Ok(()));
    assert!(d.engine.forwards_open(&tenant, "read"));
    let confirmed = d
        .engine
        .confirm(&tenant, "delete", &confirm_of(&delete, &target, &token))
        .await;
    assert!(
        matches!(confirmed, Ok(Accepted { .. })),
        "the token minted before the outage was never spent: {confirmed:?}"
    );
    let again = d
        .engine
        .confirm(&tenant, "delete", &confirm_of(&delete, &target, &token))
        .await;
    assert_eq!(
        again.as_ref().err().and_then(Stopped::refusal),
        Some(Refusal::AlreadyUsed),
        "{again:?}"
    );
    let (token, target) = approved(&d.engine, &tenant, "delete", &json!({"id": "row-2"})).await;
    let args = confirm_of(&json!({"id": "row-2"}), &target, &token);
    assert!(matches!(
        d.engine.confirm(&tenant, "delete", &args).await,
        Ok(Accepted { .. })
    ));
}

#[tokio::test]
async fn grants_unreadable_refuse_the_preflight_instead_of_putting_it_to_the_person() {
    let d = desk();
    // Listed and compared before the outage: the listing in force is known to be pinned.
    let tenant = connect(&d.engine).await;
    let outage = Outage::begin(&d.path);
    // A tool a grant may cover: its grants cannot be read, which is not "no grant".
    let preflight = d
        .engine
        .preflight(&tenant, "backup", &json!({"id": "nightly"}), Duration::ZERO)
        .await;
    assert!(is_outage(&preflight), "{preflight:?}");
    assert!(
        d.engine.pending().is_empty(),
        "the person is not asked for a call a grant of theirs may cover: {:?}",
        d.engine.pending()
    );
    outage.end();
    let preflight = d
        .engine
        .preflight(&tenant, "backup", &json!({"id": "nightly"}), Duration::ZERO)
        .await;
    assert_eq!(
        preflight.as_ref().err().and_then(Stopped::refusal),
        Some(Refusal::Pending),
        "back: it waits for the person as usual: {preflight:?}"
    );
}
