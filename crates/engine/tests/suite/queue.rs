//! The engine's queue and request handlers, driven as the window and a gateway would drive them,
//! on a real SQLite file. Approval happens only through `Engine::approve`, as a click would.

use countersign_core::Tenant;
use countersign_tests::engine as support;

use countersign_core::ServerId;
use std::time::Duration;

use countersign_core::token::SigningKey;
use countersign_core::{GateClass, Refusal};
use countersign_engine::{Accepted, Approved, Attached, ErrorCode, NoKey, Stopped};
use countersign_engine::{ApproveError, Engine, QueueChange, Removal};
use countersign_store::HistoryFilter;
use serde_json::{Value, json};

use support::Desk;

fn desk_with(ttl_ms: u64, key: Result<SigningKey, NoKey>) -> Desk {
    Desk::with_key(key, |config| config.token_ttl_ms = ttl_ms)
}

fn desk() -> Desk {
    desk_with(600_000, Ok(support::key()))
}

fn tools() -> Vec<Value> {
    vec![
        json!({"name": "read", "annotations": {"readOnlyHint": true}}),
        json!({"name": "delete", "annotations": {"destructiveHint": true}, "inputSchema": {"type": "object", "properties": {"id": {"type": "string"}}}}),
        json!({"name": "backup", "annotations": {"destructiveHint": false, "idempotentHint": true}}),
        json!({"name": "execute"}),
        json!({"name": "sneaky", "inputSchema": {"type": "object", "properties": {"confirmToken": {}}}}),
    ]
}

async fn connect(engine: &Engine) -> Tenant {
    let tenant = {
        let t = engine.connect(ServerId::Command("test-server".into()));
        engine.set_client_info(&t, json!({"name": "test-agent", "version": "1"}));
        t
    };
    engine.register_tools(&tenant, tools()).await.unwrap();
    tenant
}

const WAIT: Duration = Duration::from_secs(5);

/// Approves the next request to arrive on the queue, as a click would.
fn approve_next(engine: &Engine, typed: Option<&'static str>) -> tokio::task::JoinHandle<u64> {
    let engine = engine.clone();
    let mut changes = engine.subscribe();
    tokio::spawn(async move {
        loop {
            if let Ok(QueueChange::Added { request }) = changes.recv().await {
                engine.approve(request.id, typed).await.unwrap();
                return request.id;
            }
        }
    })
}

fn confirm_args(args: &Value, target: &str, token: &str) -> Value {
    let mut args = args.clone();
    args["confirm"] = json!(true);
    args["confirmTarget"] = json!(target);
    args["confirmToken"] = json!(token);
    args
}

async fn approved(
    engine: &Engine,
    tenant: &Tenant,
    tool: &str,
    args: &Value,
) -> (String, String, String) {
    let click = approve_next(engine, None);
    let response = engine.preflight(tenant, tool, args, WAIT).await;
    click.await.unwrap();
    match response {
        Ok(Approved {
            text,
            token,
            target,
            ..
        }) => (text, token, target),
        other => panic!("expected approval, got {other:?}"),
    }
}

/// The person accepts every tool definition change waiting in the queue (a re-listing that
/// changed annotations is held back until then).
async fn accept_tool_changes(engine: &Engine) {
    for request in engine.pending() {
        if request.change().is_some() {
            engine.approve(request.id, None).await.unwrap();
        }
    }
}

fn refusal<T>(response: &Result<T, Stopped>) -> Option<Refusal> {
    response.as_ref().err().and_then(Stopped::refusal)
}

#[tokio::test]
async fn classes_follow_annotations_and_confirm_named_tools_are_withheld() {
    let d = desk();
    let tenant = {
        let t = d.engine.connect(ServerId::Command("s".into()));
        d.engine.set_client_info(&t, json!({}));
        t
    };
    let Ok(tools) = d.engine.register_tools(&tenant, tools()).await else {
        panic!()
    };
    let classes: Vec<_> = tools
        .iter()
        .map(|t| (t.name.as_str(), t.class, t.withheld.is_some()))
        .collect();
    assert_eq!(
        classes,
        vec![
            ("read", GateClass::Open, false),
            ("delete", GateClass::Once, false),
            ("backup", GateClass::Token, false),
            ("execute", GateClass::Once, false),
            ("sneaky", GateClass::Once, true),
        ]
    );
}

#[tokio::test]
async fn approved_once_call_executes_the_approved_arguments_exactly_once() {
    let d = desk();
    let tenant = connect(&d.engine).await;
    let args = json!({"sql": "DELETE FROM t", "n": 2});
    let (text, token, target) = approved(&d.engine, &tenant, "execute", &args).await;
    assert!(text.contains("works once"));
    assert_eq!(target, "execute");
    let first = d
        .engine
        .confirm(&tenant, "execute", &confirm_args(&args, &target, &token))
        .await;
    let Ok(Accepted { arguments, nonce }) = first else {
        panic!("{first:?}")
    };
    assert_eq!(arguments, args);
    assert_eq!(d.engine.outcome(&tenant, &nonce, true, None).await, Ok(()));
    let second = d
        .engine
        .confirm(&tenant, "execute", &confirm_args(&args, &target, &token))
        .await;
    assert_eq!(refusal(&second), Some(Refusal::AlreadyUsed));
    assert_eq!(d.engine.server_of(&tenant).as_deref(), Some("test-server"));
    let kinds: Vec<String> = d
        .engine
        .history(&HistoryFilter::default())
        .await
        .unwrap()
        .iter()
        .map(|e| e.kind.code().to_owned())
        .collect();
    assert_eq!(kinds, ["replay", "executed", "accepted", "issued"]);
}

#[tokio::test]
async fn reusable_token_works_again_within_its_life() {
    let d = desk();
    let tenant = connect(&d.engine).await;
    let args = json!({"name": "nightly"});
    let (text, token, target) = approved(&d.engine, &tenant, "backup", &args).await;
    assert!(text.contains("works until it expires"));
    for _ in 0..3 {
        let r = d
            .engine
            .confirm(&tenant, "backup", &confirm_args(&args, &target, &token))
            .await;
        assert!(matches!(r, Ok(Accepted { .. })), "{r:?}");
    }
}

#[tokio::test]
async fn changed_arguments_are_plan_changed_and_another_connection_is_wrong_tenant() {
    let d = desk();
    let tenant = connect(&d.engine).await;
    let args = json!({"path": "/a", "content": "x"});
    let (_, token, target) = approved(&d.engine, &tenant, "execute", &args).await;
    let changed = json!({"path": "/a", "content": "y"});
    assert_eq!(
        refusal(
            &d.engine
                .confirm(&tenant, "execute", &confirm_args(&changed, &target, &token))
                .await
        ),
        Some(Refusal::PlanChanged)
    );
    let other = connect(&d.engine).await;
    assert_eq!(
        refusal(
            &d.engine
                .confirm(&other, "execute", &confirm_args(&args, &target, &token))
                .await
        ),
        Some(Refusal::WrongTenant)
    );
    // Neither refusal spent the nonce.
    assert!(matches!(
        d.engine
            .confirm(&tenant, "execute", &confirm_args(&args, &target, &token))
            .await,
        Ok(Accepted { .. })
    ));
}

#[tokio::test]
async fn deny_reaches_the_agent_with_the_note() {
    let d = desk();
    let tenant = connect(&d.engine).await;
    let engine = d.engine.clone();
    let mut changes = engine.subscribe();
    let deny = tokio::spawn(async move {
        if let Ok(QueueChange::Added { request }) = changes.recv().await {
            engine
                .deny(request.id, Some("not on a Friday"))
                .await
                .unwrap();
        }
    });
    let r = d
        .engine
        .preflight(&tenant, "execute", &json!({"sql": "x"}), WAIT)
        .await;
    deny.await.unwrap();
    let Err(Stopped::Refused { refusal, message }) = r else {
        panic!("{r:?}")
    };
    assert_eq!(refusal, Refusal::Denied);
    assert!(message.contains("not on a Friday"));
}

#[tokio::test]
async fn pending_preflight_reattaches_to_the_same_request() {
    let d = desk();
    let tenant = connect(&d.engine).await;
    let args = json!({"sql": "x"});
    let r = d
        .engine
        .preflight(&tenant, "execute", &args, Duration::from_millis(50))
        .await;
    assert_eq!(refusal(&r), Some(Refusal::Pending));
    let r = d
        .engine
        .preflight(&tenant, "execute", &args, Duration::from_millis(50))
        .await;
    assert_eq!(refusal(&r), Some(Refusal::Pending));
    let pending = d.engine.pending();
    assert_eq!(
        pending.len(),
        1,
        "a second preflight of the same plan is not a second entry"
    );
    // Approved while nobody waits: the next call with the same arguments collects it.
    d.engine.approve(pending[0].id, None).await.unwrap();
    assert!(matches!(
        d.engine.preflight(&tenant, "execute", &args, WAIT).await,
        Ok(Approved { .. })
    ));
    assert!(d.engine.pending().is_empty());
}

#[tokio::test]
async fn withdraw_and_disconnect_remove_pending_requests() {
    let d = desk();
    let tenant = connect(&d.engine).await;
    let mut changes = d.engine.subscribe();
    let args = json!({"sql": "x"});
    let _ = d
        .engine
        .preflight(&tenant, "execute", &args, Duration::from_millis(10))
        .await;
    let _ = d
        .engine
        .preflight(
            &tenant,
            "delete",
            &json!({"id": 1}),
            Duration::from_millis(10),
        )
        .await;
    assert_eq!(d.engine.pending().len(), 2);
    let _ = d.engine.withdraw(&tenant, "execute", &args);
    assert_eq!(d.engine.pending().len(), 1);
    d.engine.disconnect(&tenant).await;
    assert!(d.engine.pending().is_empty());
    let mut removals = Vec::new();
    while let Ok(change) = changes.try_recv() {
        if let QueueChange::Removed { reason, .. } = change {
            removals.push(reason);
        }
    }
    assert_eq!(removals, [Removal::Withdrawn, Removal::Disconnected]);
}

#[tokio::test]
async fn destructive_requests_need_the_target_typed() {
    let d = desk();
    let tenant = connect(&d.engine).await;
    let _ = d
        .engine
        .preflight(
            &tenant,
            "delete",
            &json!({"id": "backup-7"}),
            Duration::from_millis(10),
        )
        .await;
    let id = d.engine.pending()[0].id;
    assert!(d.engine.pending()[0].type_target());
    assert_eq!(
        d.engine.approve(id, None).await,
        Err(ApproveError::TargetNotTyped)
    );
    assert_eq!(
        d.engine.approve(id, Some("backup-")).await,
        Err(ApproveError::TargetNotTyped)
    );
    assert_eq!(d.engine.approve(id, Some("backup-7")).await, Ok(()));
    assert_eq!(
        d.engine.approve(id, Some("backup-7")).await,
        Err(ApproveError::NotPending)
    );
}

#[tokio::test]
async fn without_a_secret_nothing_is_minted() {
    let d = desk_with(600_000, Err("the OS keychain is locked".into()));
    assert_eq!(
        d.engine.secret_problem().as_deref(),
        Some("the OS keychain is locked")
    );
    let tenant = connect(&d.engine).await;
    let _ = d
        .engine
        .preflight(&tenant, "execute", &json!({}), Duration::from_millis(10))
        .await;
    let id = d.engine.pending()[0].id;
    assert!(matches!(
        d.engine.approve(id, None).await,
        Err(ApproveError::NoSecret(_))
    ));
    let r = d
        .engine
        .confirm(
            &tenant,
            "execute",
            &json!({"confirm": true, "confirmToken": "cs1.a.b"}),
        )
        .await;
    assert!(matches!(
        r,
        Err(Stopped::Failed {
            code: ErrorCode::NoSecret,
            ..
        })
    ));
}

#[tokio::test]
async fn expired_token_is_refused() {
    let d = desk_with(200, Ok(support::key()));
    let tenant = connect(&d.engine).await;
    let args = json!({"sql": "x"});
    let (_, token, target) = approved(&d.engine, &tenant, "execute", &args).await;
    d.clock.advance(200);
    assert_eq!(
        refusal(
            &d.engine
                .confirm(&tenant, "execute", &confirm_args(&args, &target, &token))
                .await
        ),
        Some(Refusal::Expired)
    );
}

#[tokio::test]
async fn open_and_unknown_tools_are_not_gated_here() {
    let d = desk();
    let tenant = connect(&d.engine).await;
    let r = d.engine.preflight(&tenant, "read", &json!({}), WAIT).await;
    assert!(matches!(
        r,
        Err(Stopped::Failed {
            code: ErrorCode::UnknownTool,
            ..
        })
    ));
    let r = d.engine.confirm(&tenant, "sneaky", &json!({})).await;
    assert!(matches!(
        r,
        Err(Stopped::Failed {
            code: ErrorCode::UnknownTool,
            ..
        })
    ));
}

/// The re-listing attack: a tool listed as works-once gets a click, then the upstream lists it
/// again as idempotent (class `token`, reusable). The approval keeps the class it was made under.
#[tokio::test]
async fn a_relisted_tool_does_not_turn_a_works_once_approval_into_a_reusable_one() {
    let d = desk();
    let tenant = d.engine.connect(ServerId::Command("s".into()));
    let append = |idempotent: bool| {
        vec![json!({"name": "append", "annotations": {
            "readOnlyHint": false, "destructiveHint": false, "idempotentHint": idempotent}})]
    };
    d.engine
        .register_tools(&tenant, append(false))
        .await
        .unwrap();
    let args = json!({"line": "charge the card"});
    let (_, token, target) = approved(&d.engine, &tenant, "append", &args).await;
    let Ok(tools) = d.engine.register_tools(&tenant, append(true)).await else {
        panic!("no classes");
    };
    assert_eq!(
        tools[0].class,
        GateClass::Token,
        "the listing now says token"
    );
    accept_tool_changes(&d.engine).await;
    let confirm = confirm_args(&args, &target, &token);
    let first = d.engine.confirm(&tenant, "append", &confirm).await;
    assert!(matches!(first, Ok(Accepted { .. })), "{first:?}");
    let again = d.engine.confirm(&tenant, "append", &confirm).await;
    assert_eq!(refusal(&again), Some(Refusal::AlreadyUsed), "{again:?}");
}

/// The other way round: a token-class approval under a listing that became stricter spends.
#[tokio::test]
async fn a_confirm_is_checked_under_the_stricter_of_recorded_and_current_class() {
    let d = desk();
    let tenant = connect(&d.engine).await;
    let args = json!({"name": "nightly"});
    let (_, token, target) = approved(&d.engine, &tenant, "backup", &args).await;
    // Still not destructive (the plan is the same), but no longer idempotent: works once now.
    let stricter = vec![json!({"name": "backup", "annotations": {
        "destructiveHint": false, "idempotentHint": false}})];
    d.engine.register_tools(&tenant, stricter).await.unwrap();
    accept_tool_changes(&d.engine).await;
    let confirm = confirm_args(&args, &target, &token);
    let first = d.engine.confirm(&tenant, "backup", &confirm).await;
    assert!(matches!(first, Ok(Accepted { .. })), "{first:?}");
    let again = d.engine.confirm(&tenant, "backup", &confirm).await;
    assert_eq!(refusal(&again), Some(Refusal::AlreadyUsed), "{again:?}");
}

#[tokio::test]
async fn a_name_listed_twice_is_withheld() {
    let d = desk();
    let tenant = d.engine.connect(ServerId::Command("s".into()));
    let twice = vec![
        json!({"name": "write", "annotations": {"readOnlyHint": true}}),
        json!({"name": "write"}),
    ];
    let Ok(tools) = d.engine.register_tools(&tenant, twice).await else {
        panic!("no classes");
    };
    assert!(tools.iter().all(|t| t.withheld.is_some()), "{tools:?}");
    let r = d
        .engine
        .preflight(&tenant, "write", &json!({}), Duration::from_millis(10))
        .await;
    assert!(
        matches!(
            r,
            Err(Stopped::Failed {
                code: ErrorCode::UnknownTool,
                ..
            })
        ),
        "{r:?}"
    );
}

#[tokio::test]
async fn without_a_window_preflights_are_desk_unavailable_and_nothing_is_queued() {
    let d = Desk::new(|config| config.window = false);
    let engine = d.engine;
    let tenant = connect(&engine).await;
    let r = engine
        .preflight(&tenant, "execute", &json!({"sql": "x"}), WAIT)
        .await;
    let Err(Stopped::Refused { refusal, message }) = r else {
        panic!("{r:?}");
    };
    assert_eq!(refusal, Refusal::DeskUnavailable);
    assert!(message.contains("desktop session"), "{message}");
    assert!(engine.pending().is_empty());
}

/// A second connection to the desk's file, as another process that can write it would have.
fn behind_the_desks_back(d: &Desk, sql: &str) {
    let conn = rusqlite::Connection::open(&d.path).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.execute_batch(sql).unwrap();
}

async fn kinds(engine: &Engine) -> Vec<String> {
    engine
        .history(&HistoryFilter::default())
        .await
        .unwrap()
        .iter()
        .map(|e| match e.kind {
            countersign_core::telemetry::EventKind::Rejected { reason } => {
                format!("rejected:{}", reason.code())
            }
            countersign_core::telemetry::EventKind::Refused { refusal } => {
                format!("refused:{}", refusal.code())
            }
            kind => kind.code().to_owned(),
        })
        .collect()
}

#[tokio::test]
async fn an_approve_sooner_than_the_delay_after_arrival_or_a_hold_is_refused() {
    let d = Desk::new(|config| config.approve_delay_ms = 400);
    let (engine, clock) = (d.engine.clone(), d.clock.clone());
    let tenant = connect(&engine).await;
    let args = json!({"sql": "DELETE FROM t"});
    let waiting = {
        let (engine, tenant, args) = (engine.clone(), tenant.clone(), args.clone());
        tokio::spawn(async move { engine.preflight(&tenant, "execute", &args, WAIT).await })
    };
    support::until(&engine, || !engine.pending().is_empty()).await;
    let id = engine.pending()[0].id;
    assert!(
        matches!(engine.approve(id, None).await, Err(ApproveError::TooSoon { wait_ms }) if wait_ms > 0 && wait_ms <= 400)
    );
    clock.advance(450);
    // The window came forward again: what is on screen may have changed under the pointer.
    engine.hold_approvals();
    assert!(matches!(
        engine.approve(id, None).await,
        Err(ApproveError::TooSoon { .. })
    ));
    assert_eq!(
        engine.pending().len(),
        1,
        "a refused approve leaves it pending"
    );
    clock.advance(399);
    assert!(matches!(
        engine.approve(id, None).await,
        Err(ApproveError::TooSoon { wait_ms: 1 })
    ));
    clock.advance(1);
    assert_eq!(engine.approve(id, None).await, Ok(()));
    assert!(matches!(waiting.await.unwrap(), Ok(Approved { .. })));
}

#[tokio::test]
async fn an_approval_edited_in_the_file_is_refused_and_spends_nothing() {
    let d = desk();
    let tenant = connect(&d.engine).await;
    let args = json!({"sql": "DELETE FROM t WHERE id = 7"});
    let (_, token, target) = approved(&d.engine, &tenant, "execute", &args).await;
    let confirm = confirm_args(&args, &target, &token);
    // Someone with write access to the file swaps what runs, keeping the plan hash.
    behind_the_desks_back(
        &d,
        "UPDATE approval SET arguments = '{\"sql\":\"DELETE FROM t\"}';",
    );
    let r = d.engine.confirm(&tenant, "execute", &confirm).await;
    assert_eq!(refusal(&r), Some(Refusal::ApprovalAltered), "{r:?}");
    // A row that lost its MAC (or one written before MACs) is refused the same way.
    behind_the_desks_back(
        &d,
        "UPDATE approval SET arguments = '{\"sql\":\"DELETE FROM t WHERE id = 7\"}', mac = NULL;",
    );
    let r = d.engine.confirm(&tenant, "execute", &confirm).await;
    assert_eq!(refusal(&r), Some(Refusal::ApprovalAltered), "{r:?}");
    assert!(
        kinds(&d.engine).await.starts_with(&[
            "refused:approval_altered".into(),
            "refused:approval_altered".into()
        ]),
        "{:?}",
        kinds(&d.engine).await
    );
}

#[tokio::test]
async fn an_approval_that_cannot_be_read_spends_nothing_so_retrying_works() {
    let d = desk();
    let tenant = connect(&d.engine).await;
    let args = json!({"sql": "DELETE FROM t WHERE id = 8"});
    let (_, token, target) = approved(&d.engine, &tenant, "execute", &args).await;
    let confirm = confirm_args(&args, &target, &token);
    behind_the_desks_back(&d, "ALTER TABLE approval RENAME TO approval_away;");
    let r = d.engine.confirm(&tenant, "execute", &confirm).await;
    assert_eq!(refusal(&r), Some(Refusal::LedgerUnreachable), "{r:?}");
    let Err(Stopped::Refused { message, .. }) = &r else {
        unreachable!()
    };
    assert!(message.contains("Retry shortly"));
    behind_the_desks_back(&d, "ALTER TABLE approval_away RENAME TO approval;");
    // "Retry shortly" was the truth: the once-token still works, exactly once.
    let r = d.engine.confirm(&tenant, "execute", &confirm).await;
    assert!(matches!(r, Ok(Accepted { .. })), "{r:?}");
    let r = d.engine.confirm(&tenant, "execute", &confirm).await;
    assert_eq!(refusal(&r), Some(Refusal::AlreadyUsed));
}

#[tokio::test]
async fn one_outcome_is_accepted_per_accepted_call_and_only_from_its_connection() {
    let d = desk();
    let tenant = connect(&d.engine).await;
    let other = connect(&d.engine).await;
    let args = json!({"sql": "DELETE FROM t WHERE id = 9"});
    let (_, token, target) = approved(&d.engine, &tenant, "execute", &args).await;
    let nonce = match d
        .engine
        .confirm(&tenant, "execute", &confirm_args(&args, &target, &token))
        .await
    {
        Ok(Accepted { nonce, .. }) => nonce,
        other => panic!("{other:?}"),
    };
    let not_accepted = |a: Result<(), Stopped>| {
        matches!(
            a,
            Err(Stopped::Failed {
                code: ErrorCode::BadArguments,
                ..
            })
        )
    };
    assert!(not_accepted(
        d.engine.outcome(&other, &nonce, true, None).await
    ));
    assert_eq!(
        d.engine
            .outcome(&tenant, &nonce, false, Some("boom".into()))
            .await,
        Ok(())
    );
    assert!(
        not_accepted(d.engine.outcome(&tenant, &nonce, true, None).await),
        "a second outcome"
    );
    // An approved nonce that was never confirmed has no outcome to give.
    let args = json!({"sql": "DELETE FROM t WHERE id = 10"});
    approved(&d.engine, &tenant, "execute", &args).await;
    let issued = d.engine.history(&HistoryFilter::default()).await.unwrap()[0]
        .nonce
        .unwrap();
    assert!(not_accepted(
        d.engine
            .outcome(&tenant, &issued.to_hex(), true, None)
            .await
    ));
    let executed = kinds(&d.engine)
        .await
        .iter()
        .filter(|k| *k == "executed")
        .count();
    assert_eq!(executed, 1);
}

#[tokio::test]
async fn calls_refused_before_verification_are_on_the_record() {
    let d = desk();
    let tenant = connect(&d.engine).await;
    let _ = d
        .engine
        .confirm(&tenant, "no_such_tool", &json!({"confirm": true}))
        .await;
    let _ = d
        .engine
        .confirm(
            &tenant,
            "delete",
            &json!({"id": {"deep": 1}, "confirm": true, "confirmToken": 5}),
        )
        .await;
    let _ = d
        .engine
        .preflight(
            &tenant,
            "execute",
            &json!({"confirm": true}),
            Duration::ZERO,
        )
        .await;
    d.engine.record_unlisted(&tenant, "hidden").await;
    let no_secret = desk_with(600_000, Err("locked".into()));
    let t2 = connect(&no_secret.engine).await;
    let _ = no_secret
        .engine
        .confirm(
            &t2,
            "execute",
            &json!({"confirm": true, "confirmToken": "cs1.a.b"}),
        )
        .await;
    assert_eq!(
        kinds(&d.engine).await,
        [
            "rejected:unlisted_tool",
            "rejected:bad_arguments",
            "rejected:bad_arguments",
            "rejected:unknown_tool"
        ]
    );
    assert_eq!(kinds(&no_secret.engine).await, ["rejected:no_secret"]);
}

#[tokio::test]
async fn a_flood_of_preflights_is_refused_busy_with_a_next_move_and_others_still_queue() {
    let d = desk();
    let flood = connect(&d.engine).await;
    let calm = connect(&d.engine).await;
    let preflight = |tenant: &Tenant, n: usize| {
        let engine = d.engine.clone();
        let tenant = tenant.to_owned();
        async move {
            engine
                .preflight(
                    &tenant,
                    "execute",
                    &json!({ "sql": format!("DELETE FROM t WHERE id = {n}") }),
                    Duration::ZERO,
                )
                .await
        }
    };
    for n in 0..countersign_engine::MAX_PENDING_PER_CONNECTION {
        assert_eq!(refusal(&preflight(&flood, n).await), Some(Refusal::Pending));
    }
    let over = preflight(&flood, 999).await;
    let Err(Stopped::Failed {
        code: ErrorCode::Busy,
        message,
    }) = &over
    else {
        panic!("{over:?}")
    };
    assert!(
        message.contains("Nothing was executed") && message.contains("Next:"),
        "{message}"
    );
    // Asking again for a request already queued still re-attaches to it.
    assert_eq!(refusal(&preflight(&flood, 3).await), Some(Refusal::Pending));
    assert_eq!(refusal(&preflight(&calm, 0).await), Some(Refusal::Pending));
    assert_eq!(
        d.engine.pending().len(),
        countersign_engine::MAX_PENDING_PER_CONNECTION + 1
    );
}

/// Log lines, kept for the test to read.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        countersign_core::sync::lock(&self.0).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn an_event_history_cannot_keep_is_still_logged_once_and_the_failure_said() {
    let d = desk();
    let tenant = connect(&d.engine).await;
    // The desk opens its file on first use.
    d.engine.history(&HistoryFilter::default()).await.unwrap();
    behind_the_desks_back(&d, "ALTER TABLE history RENAME TO history_away;");
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // This test runs on one thread: the subscriber set for it sees what the engine logs.
    let logging = tracing::subscriber::set_default(subscriber);
    d.engine.record_unlisted(&tenant, "hidden").await;
    drop(logging);
    let log = String::from_utf8(countersign_core::sync::lock(&captured.0).clone()).unwrap();
    assert_eq!(log.matches("confirm rejected").count(), 1, "{log}");
    assert!(log.contains("could not write history"), "{log}");
}

#[tokio::test]
async fn a_read_only_engine_withholds_every_gated_tool_and_queues_nothing() {
    let d = Desk::with_key(Err(NoKey::from("read-only")), |config| {
        config.read_only = true
    });
    let engine = d.engine;
    let tenant = engine.connect(ServerId::Command("s".into()));
    let decided = engine.register_tools(&tenant, tools()).await.unwrap();
    let offered: Vec<&str> = decided
        .iter()
        .filter(|d| d.withheld.is_none())
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(offered, ["read"]);
    assert!(
        decided
            .iter()
            .filter(|d| d.name != "read")
            .all(|d| d.withheld.as_deref() == Some(countersign_engine::READ_ONLY)),
        "{decided:?}"
    );
    assert_eq!(engine.open_call(&tenant, "read").await, Ok(()));
    let preflight = engine
        .queue_preflight(&tenant, "delete", &json!({"id": "1"}))
        .await;
    assert!(
        matches!(
            preflight,
            Err(Stopped::Failed {
                code: ErrorCode::UnknownTool,
                ..
            })
        ),
        "{preflight:?}"
    );
    assert!(engine.pending().is_empty());
}

#[tokio::test]
async fn without_a_window_a_preflight_is_refused_with_the_hosts_own_words() {
    let d = Desk::new(|config| {
        config.window = false;
        config.nobody_to_ask = "Refused: no approver is connected.".into();
    });
    let engine = d.engine;
    let tenant = connect(&engine).await;
    let r = engine
        .preflight(&tenant, "execute", &json!({"sql": "x"}), WAIT)
        .await;
    assert_eq!(
        r,
        Err(Stopped::Refused {
            refusal: Refusal::DeskUnavailable,
            message: "Refused: no approver is connected.".into()
        })
    );
    assert!(engine.pending().is_empty());
}

#[tokio::test]
async fn an_attached_caller_is_found_again_and_keeps_its_first_server() {
    let d = desk();
    let tenant = &Tenant::team("key:ci-runner", &ServerId::Command("srv".into()));
    assert_eq!(
        d.engine.attach(tenant, ServerId::Command("srv".into())),
        Ok(Attached::Anew)
    );
    d.engine.register_tools(tenant, tools()).await.unwrap();
    // The same caller again (a new HTTP request): the same connection, its tools still listed.
    assert_eq!(
        d.engine.attach(tenant, ServerId::Command("srv".into())),
        Ok(Attached::Again)
    );
    assert_eq!(d.engine.open_call(tenant, "read").await, Ok(()));
    assert_eq!(d.engine.server_of(tenant).as_deref(), Some("srv"));
    // Never moved to another server: its approvals must not follow it there.
    let moved = d.engine.attach(tenant, ServerId::Command("other".into()));
    assert!(matches!(moved, Err(Stopped::Failed { .. })), "{moved:?}");
    assert_eq!(d.engine.server_of(tenant).as_deref(), Some("srv"));
}

#[tokio::test]
async fn a_full_engine_forgets_the_idlest_caller_never_one_with_a_request_waiting() {
    use countersign_engine::MAX_ATTACHED;
    let d = desk();
    let server = || ServerId::Command("srv".into());
    let caller = |name: &str| Tenant::team(name, &server());
    // The oldest caller has a request waiting for the person.
    d.engine.attach(&caller("busy"), server()).unwrap();
    d.engine
        .register_tools(&caller("busy"), tools())
        .await
        .unwrap();
    let queued = d
        .engine
        .queue_preflight(&caller("busy"), "execute", &json!({"sql": "x"}))
        .await;
    assert!(matches!(queued, Ok(countersign_engine::Queued::Waiting(_))));
    d.clock.advance(1);
    d.engine.attach(&caller("idle"), server()).unwrap();
    for n in 2..MAX_ATTACHED {
        d.clock.advance(1);
        d.engine
            .attach(&caller(&format!("caller-{n}")), server())
            .unwrap();
    }
    d.clock.advance(1);
    d.engine.attach(&caller("newcomer"), server()).unwrap();
    assert_eq!(
        d.engine.server_of(&caller("newcomer")).as_deref(),
        Some("srv")
    );
    // The idle one went; the busy one, older still, kept its connection and its request.
    let waiting = d.engine.pending();
    assert_eq!(waiting.len(), 1);
    assert_eq!(d.engine.open_call(&caller("busy"), "read").await, Ok(()));
    assert!(matches!(
        d.engine.open_call(&caller("idle"), "read").await,
        Err(Stopped::Failed {
            code: ErrorCode::NotIntroduced,
            ..
        })
    ));
    // Back again: attached anew, so whatever it kept of its listing must be listed again.
    assert_eq!(
        d.engine.attach(&caller("idle"), server()),
        Ok(Attached::Anew)
    );
}

/// A team's server: a call approved on the shared record and taken by the agent's call on
/// another replica ends here as `already_used`, saying so (never as a person's deny, and with
/// nothing recorded here); the next call of it is a new request.
#[tokio::test]
async fn a_call_taken_on_another_replica_is_already_used_here_and_the_next_is_new() {
    let d = desk();
    let tenant = connect(&d.engine).await;
    let args = json!({"sql": "x"});
    let mut changes = d.engine.subscribe();
    let r = d
        .engine
        .preflight(&tenant, "execute", &args, Duration::ZERO)
        .await;
    assert_eq!(refusal(&r), Some(Refusal::Pending));
    let id = d.engine.pending()[0].id;
    d.engine.taken_elsewhere(id).unwrap();
    assert_eq!(d.engine.taken_elsewhere(id), Err(ApproveError::NotPending));
    let mut removed = None;
    while let Ok(change) = changes.try_recv() {
        if let QueueChange::Removed { id: gone, reason } = change {
            removed = Some((gone, reason));
        }
    }
    assert_eq!(removed, Some((id, Removal::TakenElsewhere)));
    assert!(d.engine.pending().is_empty(), "out of the person's queue");
    match d.engine.preflight(&tenant, "execute", &args, WAIT).await {
        Err(Stopped::Refused { refusal, message }) => {
            assert_eq!(refusal, Refusal::AlreadyUsed);
            assert!(message.contains("another replica"), "{message}");
            assert!(!message.contains("denied"), "{message}");
        }
        other => panic!("expected already_used, got {other:?}"),
    }
    let r = d
        .engine
        .preflight(&tenant, "execute", &args, Duration::ZERO)
        .await;
    assert_eq!(
        refusal(&r),
        Some(Refusal::Pending),
        "the next ask is a new call"
    );
    let history = d.engine.history(&HistoryFilter::default()).await.unwrap();
    assert!(
        history
            .iter()
            .all(|e| e.kind != countersign_core::telemetry::EventKind::Denied),
        "nothing recorded as a deny"
    );
}

/// Issue 19, item 4: a call handed to its server and never answered is recorded
/// `outcome_unknown` (not failed), and the next time the same plan asks, the person is shown
/// when; once the same plan has run to a known end, it no longer is.
#[tokio::test]
async fn an_unanswered_call_is_outcome_unknown_and_the_next_identical_request_says_when() {
    let d = desk();
    let tenant = connect(&d.engine).await;
    let args = json!({"sql": "DELETE FROM t"});
    let run = |note: Option<&'static str>, known: bool| {
        let (engine, tenant, args) = (d.engine.clone(), tenant.clone(), args.clone());
        async move {
            let (_, token, target) = approved(&engine, &tenant, "execute", &args).await;
            let accepted = engine
                .confirm(&tenant, "execute", &confirm_args(&args, &target, &token))
                .await
                .unwrap();
            let note = note.map(str::to_owned);
            if known {
                engine
                    .outcome(&tenant, &accepted.nonce, true, note)
                    .await
                    .unwrap();
            } else {
                engine
                    .outcome_unknown(&tenant, &accepted.nonce, note)
                    .await
                    .unwrap();
            }
        }
    };
    let queued_unknown = |args: Value| {
        let (engine, tenant) = (d.engine.clone(), tenant.clone());
        async move {
            let r = engine
                .preflight(&tenant, "execute", &args, Duration::ZERO)
                .await;
            assert_eq!(refusal(&r), Some(Refusal::Pending));
            let pending = engine.pending();
            let last = pending[0].call().unwrap().last_unknown_at_ms;
            engine.withdraw(&tenant, "execute", &args).unwrap();
            last
        }
    };
    assert_eq!(queued_unknown(args.clone()).await, None, "never ran");
    d.clock.advance(5_000);
    let when = d.engine.now_ms();
    run(Some("the upstream exited during the call"), false).await;
    let history = d.engine.history(&HistoryFilter::default()).await.unwrap();
    assert_eq!(
        history[0].kind,
        countersign_core::telemetry::EventKind::OutcomeUnknown
    );
    assert_eq!(history[0].kind.code(), "outcome_unknown");
    d.clock.advance(5_000);
    assert_eq!(queued_unknown(args.clone()).await, Some(when));
    // Another plan of the same tool: nothing to say.
    assert_eq!(queued_unknown(json!({"sql": "DELETE FROM u"})).await, None);
    // The same plan ran to a known end since: nothing to say either.
    run(None, true).await;
    assert_eq!(queued_unknown(args.clone()).await, None);
}
