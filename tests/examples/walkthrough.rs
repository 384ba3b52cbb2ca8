//! A walkthrough of Countersign's trusted half, on the real parts: the HMAC secret from the OS
//! keychain, the desk's engine with its SQLite ledger and history, and the verification chain.
//! A sample agent connection asks for an open call, a `token` call and a `once` call, then tries
//! a replay, a changed plan and another connection's token, and the walkthrough prints what the
//! agent would receive at each step.
//!
//! The person's click is played by this program calling `Engine::approve`, as the tests do: the
//! desk's window is the only other caller, and no command, flag or message of the product
//! approves. Run it with `make run` (inside a D-Bus session with an unlocked keyring), or with
//! `--in-memory-secret` where there is no keychain.

use countersign_core::ServerId;
use countersign_core::Tenant;
use std::time::Duration;

use countersign_engine::{
    Accepted, Approved, Engine, EngineConfig, QueueChange, Stopped, ToolDecision,
};
use countersign_secret::{KeychainStore, MemoryStore, SecretStore};
use countersign_store::HistoryFilter;
use countersign_tests::calls::confirm_args;
use serde_json::{Value, json};

fn step(title: &str) {
    println!("\n\x1b[1m== {title}\x1b[0m");
}

/// What the walkthrough prints of one of the engine's answers.
trait Show {
    fn show(&self);
}

impl Show for Approved {
    fn show(&self) {
        println!("{}", self.text);
    }
}

impl Show for Accepted {
    fn show(&self) {
        println!(
            "accepted: the desk hands back the approved arguments {} (nonce {})",
            self.arguments, self.nonce
        );
    }
}

impl Show for Vec<ToolDecision> {
    fn show(&self) {
        for t in self {
            println!("  {:<14} {}", t.name, t.class.code());
        }
    }
}

impl<T: Show> Show for Result<T, Stopped> {
    fn show(&self) {
        match self {
            Ok(answer) => answer.show(),
            Err(Stopped::Refused { refusal, message }) => {
                println!("refused [{refusal}]: {message}")
            }
            Err(Stopped::Failed { code, message }) => {
                println!("error [{}]: {message}", code.code())
            }
        }
    }
}

fn show(response: &impl Show) {
    response.show();
}

/// A preflight, approved by the stand-in for the person's click as soon as it is queued.
async fn preflight_and_click(
    engine: &Engine,
    tenant: &Tenant,
    tool: &str,
    args: &Value,
) -> (String, String) {
    let mut changes = engine.subscribe();
    let clicker = engine.clone();
    let click = tokio::spawn(async move {
        while let Ok(change) = changes.recv().await {
            if let QueueChange::Added { request } = change {
                println!(
                    "(the desk shows request #{} for {:?}; a person clicks Approve)",
                    request.id, request.plan.target
                );
                let typed = request
                    .type_target()
                    .then_some(request.plan.target.as_str());
                clicker.approve(request.id, typed).await.expect("approve");
                return;
            }
        }
    });
    let response = engine
        .preflight(tenant, tool, args, Duration::from_secs(10))
        .await;
    click.await.unwrap();
    show(&response);
    match response {
        Ok(Approved { token, target, .. }) => (token, target),
        other => panic!("the preflight was not approved: {other:?}"),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let in_memory = std::env::args().any(|a| a == "--in-memory-secret");
    step("The secret");
    let secret = if in_memory {
        println!("in memory, by explicit choice: tokens die with this process");
        MemoryStore::new().load_or_create()
    } else {
        match KeychainStore::open_default().and_then(|k| k.load_or_create()) {
            Ok(s) => {
                println!(
                    "32 bytes in the OS keychain (Secret Service), created on first use, read back later"
                );
                Ok(s)
            }
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
    };
    let key = secret.expect("secret").signing_key();
    println!("{key:?}   <- what a Debug print of the key shows");

    let dir = std::env::temp_dir().join(format!("countersign-walkthrough-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("the walkthrough's directory");
    let mut config = EngineConfig::new();
    // The scripted clicker approves at once; a person's window enforces the delay.
    config.approve_delay_ms = 0;
    config.describer = Some(std::sync::Arc::new(
        countersign_session::SqlDescriber::default(),
    ));
    let records = std::sync::Arc::new(countersign_store::Sqlite::open_deferred(
        dir.join("desk.sqlite"),
        countersign_store::StoreOptions::default(),
    ));
    let engine = Engine::new(config, records, Ok(key));
    let tenant = {
        let t = engine.connect(ServerId::Command("builtin".into()));
        engine.set_client_info(&t, json!({"name": "sample-agent", "version": "1.0"}));
        t
    };
    let other = {
        let t = engine.connect(ServerId::Command("builtin".into()));
        engine.set_client_info(&t, json!({"name": "another-agent", "version": "1.0"}));
        t
    };

    step("The upstream's tools, classed by their annotations");
    let tools = vec![
        json!({"name": "query", "annotations": {"readOnlyHint": true}}),
        json!({"name": "create_backup", "annotations": {"readOnlyHint": false, "destructiveHint": false, "idempotentHint": true}}),
        json!({"name": "execute", "annotations": {"readOnlyHint": false, "destructiveHint": false}}),
        json!({"name": "delete_backup", "annotations": {"destructiveHint": true}}),
    ];
    show(&engine.register_tools(&tenant, tools.clone()).await);
    engine.register_tools(&other, tools).await.unwrap();

    step("An open call (query): forwarded by the gateway at once; the desk is not involved");

    step("A `token` call (create_backup): preflight, click, confirm twice within the token's life");
    let backup = json!({"name": "nightly"});
    let (token, target) = preflight_and_click(&engine, &tenant, "create_backup", &backup).await;
    for _ in 0..2 {
        show(
            &engine
                .confirm(
                    &tenant,
                    "create_backup",
                    &confirm_args(&backup, &target, &token),
                )
                .await,
        );
    }

    step("A `once` call (execute): preflight, click, confirm");
    let sql = json!({"sql": "UPDATE accounts SET plan = 'pro' WHERE id = 7"});
    let (token, target) = preflight_and_click(&engine, &tenant, "execute", &sql).await;
    let accepted = engine
        .confirm(&tenant, "execute", &confirm_args(&sql, &target, &token))
        .await;
    show(&accepted);
    if let Ok(Accepted { nonce, .. }) = &accepted {
        engine.outcome(&tenant, nonce, true, None).await.unwrap();
    }

    step("A replay of the same `once` token");
    show(
        &engine
            .confirm(&tenant, "execute", &confirm_args(&sql, &target, &token))
            .await,
    );

    step("A changed plan: approved one statement, confirming another");
    let (token, target) = preflight_and_click(
        &engine,
        &tenant,
        "execute",
        &json!({"sql": "DELETE FROM logs WHERE day < 7"}),
    )
    .await;
    let changed = json!({"sql": "DELETE FROM logs"});
    show(
        &engine
            .confirm(&tenant, "execute", &confirm_args(&changed, &target, &token))
            .await,
    );

    step("That token, presented by another agent connection");
    show(
        &engine
            .confirm(
                &other,
                "execute",
                &confirm_args(
                    &json!({"sql": "DELETE FROM logs WHERE day < 7"}),
                    &target,
                    &token,
                ),
            )
            .await,
    );

    step("A confirm that skipped the preflight, and a forged token");
    show(
        &engine
            .confirm(
                &tenant,
                "execute",
                &json!({"sql": "DROP TABLE accounts", "confirm": true, "confirmTarget": "execute"}),
            )
            .await,
    );
    show(
        &engine
            .confirm(
                &tenant,
                "execute",
                &confirm_args(
                    &json!({"sql": "DROP TABLE accounts"}),
                    "execute",
                    "cs1.e30.AAAA",
                ),
            )
            .await,
    );

    step("History (newest first; it never holds a token)");
    for e in engine
        .history(&HistoryFilter::default())
        .await
        .expect("history")
    {
        let refusal = match e.kind {
            countersign_core::telemetry::EventKind::Refused { refusal } => format!(" [{refusal}]"),
            _ => String::new(),
        };
        println!(
            "  {:<9}{:<16} {:<14} {:<22} nonce {}",
            e.kind.code(),
            refusal,
            e.tool,
            e.tenant,
            e.nonce.map(|n| n.to_hex()).unwrap_or("-".into())
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
