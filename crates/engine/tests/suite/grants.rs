//! Grants below the window: a person's Approve with a widening (`Engine::approve_widening`, as
//! the window's click calls it), and every way a later call might try to ride on a grant it is
//! not covered by. On a real SQLite file; the only click is the engine's approve path.

use countersign_core::ServerId;
use countersign_core::Tenant;
use std::time::Duration;

use countersign_core::policy::Policy;
use countersign_core::{GateClass, Refusal};
use countersign_engine::Stopped;
use countersign_engine::{
    Accepted, ApproveError, Approved, Engine, GrantError, MAX_LIVE_GRANTS, QueueChange, Widening,
};
use countersign_store::{GrantKind, HistoryFilter};
use serde_json::{Value, json};

use countersign_tests::engine::Desk;

fn desk_with(policy: Policy) -> Desk {
    Desk::new(|config| config.policy = policy)
}

fn desk() -> Desk {
    desk_with(Policy::default())
}

fn tools() -> Vec<Value> {
    let path = json!({"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}});
    vec![
        // Not destructive, not idempotent: class once.
        json!({"name": "write", "annotations": {"destructiveHint": false}, "inputSchema": path}),
        // Not destructive, idempotent: class token.
        json!({"name": "backup", "annotations": {"destructiveHint": false, "idempotentHint": true},
               "inputSchema": {"type": "object", "properties": {"name": {"type": "string"}}}}),
        json!({"name": "delete", "annotations": {"destructiveHint": true}, "inputSchema": path}),
        // No annotations: destructive as MCP reads it.
        json!({"name": "plain", "inputSchema": path}),
        // Two paths; the target is the source.
        json!({"name": "copy", "annotations": {"destructiveHint": false},
               "inputSchema": {"type": "object", "properties": {
                   "source": {"type": "string"}, "destination": {"type": "string"}}}}),
    ]
}

async fn connect(engine: &Engine, server: &str) -> Tenant {
    let tenant = engine.connect(ServerId::Command(server.into()));
    engine.set_client_info(&tenant, json!({"name": "agent"}));
    engine.register_tools(&tenant, tools()).await.unwrap();
    tenant
}

const WAIT: Duration = Duration::from_secs(5);
const SHORT: Duration = Duration::from_millis(200);

/// Runs the preflight; the next request to arrive gets `click` (the window's Approve, widened or
/// not). Answers the preflight's answer and the click's result.
async fn clicked<T: Send + 'static, F: std::future::Future<Output = T> + Send + 'static>(
    engine: &Engine,
    tenant: &Tenant,
    tool: &str,
    args: &Value,
    click: impl FnOnce(Engine, u64) -> F + Send + 'static,
) -> (Result<Approved, Stopped>, T) {
    let mut changes = engine.subscribe();
    let e = engine.clone();
    let clicker = tokio::spawn(async move {
        loop {
            if let Ok(QueueChange::Added { request }) = changes.recv().await {
                return click(e, request.id).await;
            }
        }
    });
    let answer = engine.preflight(tenant, tool, args, WAIT).await;
    (answer, clicker.await.unwrap())
}

/// A preflight that waits `SHORT` for a click nobody gives: whether it was approved at once.
async fn at_once(
    engine: &Engine,
    tenant: &Tenant,
    tool: &str,
    args: &Value,
) -> Result<Approved, Stopped> {
    engine.preflight(tenant, tool, args, SHORT).await
}

fn is_approved(answer: &Result<Approved, Stopped>) -> bool {
    matches!(answer, Ok(Approved { .. }))
}

fn is_pending(answer: &Result<Approved, Stopped>) -> bool {
    matches!(
        answer,
        Err(Stopped::Refused {
            refusal: Refusal::Pending,
            ..
        })
    )
}

fn widen_call(minutes: u64) -> Widening {
    Widening::Call { minutes }
}

fn widen_prefix(prefix: &str) -> Widening {
    Widening::Prefix {
        prefix: prefix.into(),
        minutes: 30,
    }
}

/// Grants `widening` on `tool(args)` by a click; answers the grant's number.
async fn granted(d: &Desk, tenant: &Tenant, tool: &str, args: &Value, widening: Widening) -> u64 {
    let (answer, result) = clicked(
        &d.engine,
        tenant,
        tool,
        args,
        move |e: Engine, id| async move { e.approve_widening(id, None, &widening).await },
    )
    .await;
    assert!(is_approved(&answer), "{answer:?}");
    result.unwrap()
}

async fn confirm(
    engine: &Engine,
    tenant: &Tenant,
    tool: &str,
    args: &Value,
    answer: &Result<Approved, Stopped>,
) -> Result<Accepted, Stopped> {
    let Ok(Approved { token, target, .. }) = answer else {
        panic!("not approved: {answer:?}");
    };
    let mut args = args.clone();
    args["confirm"] = json!(true);
    args["confirmTarget"] = json!(target);
    args["confirmToken"] = json!(token);
    engine.confirm(tenant, tool, &args).await
}

async fn notes(engine: &Engine) -> Vec<String> {
    engine
        .history(&HistoryFilter::default())
        .await
        .unwrap()
        .iter()
        .filter_map(|e| e.note.clone())
        .collect()
}

#[tokio::test]
async fn a_call_grant_approves_the_same_call_again_without_a_click_with_a_token_of_its_own() {
    let d = desk();
    let tenant = connect(&d.engine, "srv").await;
    let args = json!({"name": "nightly"});
    let number = granted(&d, &tenant, "backup", &args, widen_call(15)).await;
    let first = at_once(&d.engine, &tenant, "backup", &args).await;
    let second = at_once(&d.engine, &tenant, "backup", &args).await;
    assert!(is_approved(&first) && is_approved(&second), "{first:?}");
    let (Ok(Approved { token: a, .. }), Ok(Approved { token: b, .. })) = (&first, &second) else {
        unreachable!()
    };
    assert_ne!(a, b, "each call gets a token minted for it");
    assert!(d.engine.pending().is_empty(), "nothing waits for a click");
    let ran = confirm(&d.engine, &tenant, "backup", &args, &first).await;
    assert!(matches!(ran, Ok(Accepted { .. })), "{ran:?}");
    // History says which grant, when and that a click made it.
    let notes = notes(&d.engine).await;
    let by_grant: Vec<_> = notes
        .iter()
        .filter(|n| n.starts_with(&format!("by grant #{number}, granted at ")))
        .collect();
    assert_eq!(by_grant.len(), 2, "{notes:?}");
    assert!(by_grant[0].ends_with(" UTC by a click"), "{notes:?}");
    assert!(
        notes.iter().any(|n| n.starts_with(&format!(
            "grant #{number}: backup for this same call, 15 minutes, by a click on request #"
        ))),
        "{notes:?}"
    );
    let grants = d.engine.grants().await.unwrap();
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0].uses, 2);
    assert_eq!(grants[0].kind, GrantKind::Call);
}

#[tokio::test]
async fn a_call_grant_covers_only_the_same_plan_on_the_same_server() {
    let d = desk();
    let tenant = connect(&d.engine, "srv").await;
    granted(
        &d,
        &tenant,
        "backup",
        &json!({"name": "nightly"}),
        widen_call(15),
    )
    .await;
    // Another argument: another plan.
    let other = at_once(&d.engine, &tenant, "backup", &json!({"name": "weekly"})).await;
    assert!(is_pending(&other), "{other:?}");
    // The same call on another connection to the same server is covered (the grant is for the
    // call on that server), on a connection to another server it is not.
    let same_server = connect(&d.engine, "srv").await;
    let covered = at_once(
        &d.engine,
        &same_server,
        "backup",
        &json!({"name": "nightly"}),
    )
    .await;
    assert!(is_approved(&covered), "{covered:?}");
    let other_server = connect(&d.engine, "srv-2").await;
    let not = at_once(
        &d.engine,
        &other_server,
        "backup",
        &json!({"name": "nightly"}),
    )
    .await;
    assert!(is_pending(&not), "{not:?}");
}

#[tokio::test]
async fn a_revoked_grant_stops_the_next_call() {
    let d = desk();
    let tenant = connect(&d.engine, "srv").await;
    let args = json!({"name": "nightly"});
    let number = granted(&d, &tenant, "backup", &args, widen_call(15)).await;
    assert!(is_approved(
        &at_once(&d.engine, &tenant, "backup", &args).await
    ));
    d.engine.revoke_grant(number).await.unwrap();
    assert!(d.engine.grants().await.unwrap().is_empty());
    let next = at_once(&d.engine, &tenant, "backup", &args).await;
    assert!(is_pending(&next), "{next:?}");
    assert_eq!(d.engine.pending().len(), 1, "it waits for a click");
    // Revoking again, or a number never given, says so.
    assert_eq!(
        d.engine.revoke_grant(number).await,
        Err(GrantError::NoSuchGrant)
    );
    assert_eq!(
        d.engine.revoke_grant(999).await,
        Err(GrantError::NoSuchGrant)
    );
    assert!(
        notes(&d.engine)
            .await
            .contains(&format!("grant #{number} revoked by a click"))
    );
}

#[tokio::test]
async fn a_destructive_or_unannotated_tool_is_never_widened_and_nothing_is_approved() {
    let d = desk();
    let tenant = connect(&d.engine, "srv").await;
    for tool in ["delete", "plain"] {
        let args = json!({"path": "/home/a/docs/x.txt"});
        let typed: &'static str = "/home/a/docs/x.txt";
        let (answer, result) = clicked(
            &d.engine,
            &tenant,
            tool,
            &args,
            move |e: Engine, id| async move {
                let offer = e.grant_offer(id).unwrap();
                let refused = e
                    .approve_widening(id, Some(typed), &Widening::Call { minutes: 5 })
                    .await;
                // The plain Approve still works.
                e.approve(id, Some(typed)).await.unwrap();
                (offer, refused)
            },
        )
        .await;
        let (offer, refused) = result;
        assert_eq!(refused, Err(GrantError::Destructive), "{tool}");
        assert!(!offer.call && !offer.prefix, "{offer:?}");
        assert_eq!(offer.call_code, Some("destructive"));
        assert!(is_approved(&answer));
    }
    assert!(d.engine.grants().await.unwrap().is_empty());
    let again = at_once(
        &d.engine,
        &tenant,
        "delete",
        &json!({"path": "/home/a/docs/x.txt"}),
    )
    .await;
    assert!(is_pending(&again), "{again:?}");
}

#[tokio::test]
async fn a_policy_may_allow_grants_for_a_destructive_tool_and_each_token_still_works_once() {
    let policy = Policy::from_toml("[servers.srv.tools.delete]\ngrants = true").unwrap();
    let d = desk_with(policy);
    let tenant = connect(&d.engine, "srv").await;
    let args = json!({"path": "/home/a/docs/x.txt"});
    let (answer, result) = clicked(
        &d.engine,
        &tenant,
        "delete",
        &args,
        move |e: Engine, id| async move {
            // The typed target is still asked of the click that makes the grant.
            let untyped = e
                .approve_widening(id, None, &Widening::Call { minutes: 5 })
                .await;
            let typed = e
                .approve_widening(
                    id,
                    Some("/home/a/docs/x.txt"),
                    &Widening::Call { minutes: 5 },
                )
                .await;
            (untyped, typed)
        },
    )
    .await;
    assert_eq!(
        result.0,
        Err(GrantError::Approve(ApproveError::TargetNotTyped))
    );
    result.1.unwrap();
    assert!(is_approved(&answer));
    let next = at_once(&d.engine, &tenant, "delete", &args).await;
    assert!(
        matches!(
            next,
            Ok(Approved {
                class: GateClass::Once,
                ..
            })
        ),
        "{next:?}"
    );
    let ran = confirm(&d.engine, &tenant, "delete", &args, &next).await;
    assert!(matches!(ran, Ok(Accepted { .. })), "{ran:?}");
    let replay = confirm(&d.engine, &tenant, "delete", &args, &next).await;
    assert!(
        matches!(
            replay,
            Err(Stopped::Refused {
                refusal: Refusal::AlreadyUsed,
                ..
            })
        ),
        "{replay:?}"
    );
}

#[tokio::test]
async fn a_widening_waits_out_the_approve_delay_like_approve() {
    let d = Desk::new(|config| config.approve_delay_ms = 60_000);
    let engine = d.engine.clone();
    let tenant = connect(&engine, "srv").await;
    let args = json!({"name": "nightly"});
    let (answer, result) = clicked(
        &engine,
        &tenant,
        "backup",
        &args,
        move |e: Engine, id| async move {
            e.approve_widening(id, None, &Widening::Call { minutes: 5 })
                .await
        },
    )
    .await;
    assert!(
        matches!(
            result,
            Err(GrantError::Approve(ApproveError::TooSoon { .. }))
        ),
        "{result:?}"
    );
    assert!(!is_approved(&answer));
    assert!(engine.grants().await.unwrap().is_empty());
}

#[tokio::test]
async fn durations_past_eight_hours_or_zero_are_refused_before_anything_is_approved() {
    let d = desk();
    let tenant = connect(&d.engine, "srv").await;
    let args = json!({"name": "nightly"});
    let (answer, results) = clicked(
        &d.engine,
        &tenant,
        "backup",
        &args,
        move |e: Engine, id| async move {
            let mut results = Vec::new();
            for minutes in [0, 481, u64::MAX] {
                results.push(
                    e.approve_widening(id, None, &Widening::Call { minutes })
                        .await,
                );
            }
            let prefix = e
                .approve_widening(
                    id,
                    None,
                    &Widening::Prefix {
                        prefix: "/home/a".into(),
                        minutes: 481,
                    },
                )
                .await;
            e.deny(id, None).await.unwrap();
            (results, prefix)
        },
    )
    .await;
    for r in results.0 {
        assert_eq!(r, Err(GrantError::Duration));
    }
    // The target `nightly` is no path: no prefix covers it.
    assert!(
        matches!(results.1, Err(GrantError::NotUnder | GrantError::Target(_))),
        "{:?}",
        results.1
    );
    assert!(matches!(
        answer,
        Err(Stopped::Refused {
            refusal: Refusal::Denied,
            ..
        })
    ));
    assert!(d.engine.grants().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_prefix_grant_covers_targets_under_it_on_this_connection_only() {
    let d = desk();
    let tenant = connect(&d.engine, "srv").await;
    let args = |path: &str| json!({"path": path, "content": "x"});
    let (answer, offer) = clicked(
        &d.engine,
        &tenant,
        "write",
        &args("/home/a/docs/x.txt"),
        move |e: Engine, id| async move {
            let offer = e.grant_offer(id).unwrap();
            e.approve_widening(
                id,
                None,
                &Widening::Prefix {
                    prefix: "/home/a/docs".into(),
                    minutes: 30,
                },
            )
            .await
            .unwrap();
            offer
        },
    )
    .await;
    assert!(is_approved(&answer));
    assert!(offer.call && offer.prefix, "{offer:?}");
    assert_eq!(offer.default_prefix.as_deref(), Some("/home/a/docs"));
    for covered in [
        "/home/a/docs/y.txt",
        "/home/a/docs/sub/z.txt",
        "/home/a/docs",
    ] {
        let r = at_once(&d.engine, &tenant, "write", &args(covered)).await;
        assert!(is_approved(&r), "{covered}: {r:?}");
    }
    for attack in [
        "/home/a/docsX/y.txt",
        "/home/a/docs/../secret",
        "/home/a/docs/./y",
        "/home/a/docs//y",
        "/home/a/docs/y/",
        "/home/a/docs/\u{202e}txt.exe",
        "/home/a/docs/y\u{200b}",
        "/home/a/docs/%2e%2e/b",
        "/home/a/d\u{43e}cs/y",
        "/HOME/a/docs/y",
        "home/a/docs/y",
        "/home/a/other",
    ] {
        let r = at_once(&d.engine, &tenant, "write", &args(attack)).await;
        assert!(!is_approved(&r), "{attack:?} rode on the grant: {r:?}");
        // Leave the queue as it was for the next attempt.
        let _ = d.engine.withdraw(&tenant, "write", &args(attack));
    }
    // Another tool of the same connection, and the same tool on another connection, are not.
    let other_tool = at_once(&d.engine, &tenant, "backup", &json!({"name": "x"})).await;
    assert!(is_pending(&other_tool));
    let other = connect(&d.engine, "srv").await;
    let r = at_once(&d.engine, &other, "write", &args("/home/a/docs/y.txt")).await;
    assert!(is_pending(&r), "{r:?}");
}

#[tokio::test]
async fn a_prefix_must_cover_the_clicked_target_and_be_long_enough() {
    let d = desk();
    let tenant = connect(&d.engine, "srv").await;
    let args = json!({"path": "/home/a/docs/x.txt", "content": "x"});
    let (_, results) = clicked(
        &d.engine,
        &tenant,
        "write",
        &args,
        move |e: Engine, id| async move {
            let mut results = Vec::new();
            for p in [
                "",
                "/",
                "/home",
                "/home/b",
                "/home/a/do",
                "/home/a/../a",
                "/home/a/",
            ] {
                let prefix = Widening::Prefix {
                    prefix: p.into(),
                    minutes: 5,
                };
                results.push((p, e.approve_widening(id, None, &prefix).await));
            }
            e.deny(id, None).await.unwrap();
            results
        },
    )
    .await;
    for (prefix, result) in results {
        assert!(
            matches!(result, Err(GrantError::Prefix(_) | GrantError::NotUnder)),
            "{prefix:?}: {result:?}"
        );
    }
    assert!(d.engine.grants().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_session_grant_ends_with_its_connection_and_with_a_restart() {
    let d = desk();
    let tenant = connect(&d.engine, "srv").await;
    let args = json!({"path": "/home/a/docs/x.txt", "content": "x"});
    granted(&d, &tenant, "write", &args, widen_prefix("/home/a/docs")).await;
    granted(&d, &tenant, "backup", &json!({"name": "n"}), widen_call(30)).await;
    assert_eq!(d.engine.grants().await.unwrap().len(), 2);
    d.engine.disconnect(&tenant).await;
    let kinds: Vec<_> = d
        .engine
        .grants()
        .await
        .unwrap()
        .iter()
        .map(|g| g.kind)
        .collect();
    assert_eq!(kinds, vec![GrantKind::Call]);

    // A session grant whose desk stops without its connection ending is not resurrected.
    let tenant = connect(&d.engine, "srv").await;
    granted(&d, &tenant, "write", &args, widen_prefix("/home/a/docs")).await;
    assert_eq!(d.engine.grants().await.unwrap().len(), 2);
    let restarted = d.again(|_| {});
    let kinds: Vec<_> = restarted
        .grants()
        .await
        .unwrap()
        .iter()
        .map(|g| g.kind)
        .collect();
    assert_eq!(
        kinds,
        vec![GrantKind::Call],
        "the call grant outlives a restart"
    );
    let tenant = connect(&restarted, "srv").await;
    let r = at_once(
        &restarted,
        &tenant,
        "write",
        &json!({"path": "/home/a/docs/y", "content": "x"}),
    )
    .await;
    assert!(is_pending(&r), "{r:?}");
    let r = at_once(&restarted, &tenant, "backup", &json!({"name": "n"})).await;
    assert!(is_approved(&r), "{r:?}");
}

#[tokio::test]
async fn a_changed_definition_or_a_stricter_class_is_not_covered() {
    let d = desk();
    let tenant = connect(&d.engine, "srv").await;
    let args = json!({"name": "nightly"});
    granted(&d, &tenant, "backup", &args, widen_call(30)).await;
    // The upstream re-lists `backup` as not idempotent (class once, stricter); the person accepts
    // the new definition. The grant was made for the old one under `token`.
    let mut relisted = tools();
    relisted[1]["annotations"]["idempotentHint"] = json!(false);
    d.engine.register_tools(&tenant, relisted).await.unwrap();
    for request in d.engine.pending() {
        if request.change().is_some() {
            d.engine.approve(request.id, None).await.unwrap();
        }
    }
    let r = at_once(&d.engine, &tenant, "backup", &args).await;
    assert!(is_pending(&r), "{r:?}");
}

#[tokio::test]
async fn a_grant_row_written_behind_the_desks_back_covers_nothing() {
    let d = desk();
    let tenant = connect(&d.engine, "srv").await;
    let args = json!({"name": "nightly"});
    granted(&d, &tenant, "backup", &args, widen_call(1)).await;
    let conn = rusqlite::Connection::open(&d.path).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    // Lengthen it past what the click gave.
    conn.execute(
        "UPDATE approval_grant SET expires_at_ms = expires_at_ms + 3600000",
        [],
    )
    .unwrap();
    assert!(
        d.engine.grants().await.unwrap().is_empty(),
        "an edited grant is not listed"
    );
    let r = at_once(&d.engine, &tenant, "backup", &args).await;
    assert!(is_pending(&r), "{r:?}");
}

#[tokio::test]
async fn no_more_than_the_cap_of_grants_live() {
    let d = desk();
    let tenant = connect(&d.engine, "srv").await;
    for n in 0..MAX_LIVE_GRANTS {
        granted(
            &d,
            &tenant,
            "backup",
            &json!({"name": format!("b{n}")}),
            widen_call(5),
        )
        .await;
    }
    let (answer, result) = clicked(
        &d.engine,
        &tenant,
        "backup",
        &json!({"name": "one-more"}),
        move |e: Engine, id| async move {
            let r = e
                .approve_widening(id, None, &Widening::Call { minutes: 5 })
                .await;
            e.deny(id, None).await.unwrap();
            r
        },
    )
    .await;
    assert_eq!(result, Err(GrantError::TooMany));
    assert!(!is_approved(&answer));
    assert_eq!(d.engine.grants().await.unwrap().len(), MAX_LIVE_GRANTS);
}

#[tokio::test]
async fn a_change_to_the_desk_is_never_widened() {
    let d = desk();
    let tenant = connect(&d.engine, "srv").await;
    let mut relisted = tools();
    relisted[0]["description"] = json!("now with an injection");
    d.engine.register_tools(&tenant, relisted).await.unwrap();
    let change = d
        .engine
        .pending()
        .into_iter()
        .find(|r| r.change().is_some())
        .unwrap();
    assert_eq!(
        d.engine
            .approve_widening(change.id, None, &Widening::Call { minutes: 5 })
            .await,
        Err(GrantError::Change)
    );
    assert_eq!(
        d.engine.grant_offer(change.id).unwrap().call_code,
        Some("change_not_grantable")
    );
    assert!(
        d.engine.pending().iter().any(|r| r.id == change.id),
        "still waiting"
    );
}

#[tokio::test]
async fn a_prefix_grant_covers_no_call_with_another_path_argument_outside_the_prefix() {
    let d = desk();
    let tenant = connect(&d.engine, "srv").await;
    let copy = |from: &str, to: &str| json!({"source": from, "destination": to});
    // The click's own call must be under the prefix in every path it names.
    let (_, refused) = clicked(
        &d.engine,
        &tenant,
        "copy",
        &copy("/home/a/docs/x", "/tmp/out"),
        move |e: Engine, id| async move {
            let r = e
                .approve_widening(id, None, &widen_prefix("/home/a/docs"))
                .await;
            e.deny(id, None).await.unwrap();
            r
        },
    )
    .await;
    assert_eq!(refused, Err(GrantError::NotUnder));
    granted(
        &d,
        &tenant,
        "copy",
        &copy("/home/a/docs/x", "/home/a/docs/y"),
        widen_prefix("/home/a/docs"),
    )
    .await;
    let inside = at_once(
        &d.engine,
        &tenant,
        "copy",
        &copy("/home/a/docs/1", "/home/a/docs/2"),
    )
    .await;
    assert!(is_approved(&inside), "{inside:?}");
    for (from, to) in [
        ("/home/a/docs/1", "/etc/cron.d/evil"),
        ("/home/a/docs/1", "/home/a/docs/../../../etc/x"),
    ] {
        let r = at_once(&d.engine, &tenant, "copy", &copy(from, to)).await;
        assert!(is_pending(&r), "{to}: {r:?}");
    }
}

/// A tool whose paths are not all top-level arguments named `path`: a file name beside its
/// directory, and a list of items each with its own path.
fn batch_tools() -> Vec<Value> {
    vec![
        json!({"name": "batch", "annotations": {"destructiveHint": false},
        "inputSchema": {"type": "object", "properties": {
            "path": {"type": "string"}, "file_name": {"type": "string"},
            "outputFolder": {"type": "string"}, "items": {"type": "array"},
            "options": {"type": "object"}}}}),
    ]
}

#[tokio::test]
async fn a_prefix_grant_covers_no_call_with_a_nested_or_file_named_path_outside_the_prefix() {
    let d = desk();
    let tenant = d.engine.connect(ServerId::Command("srv".into()));
    d.engine
        .register_tools(&tenant, batch_tools())
        .await
        .unwrap();
    let clicked_call = json!({"path": "/home/a/docs/x", "items": [{"path": "/home/a/docs/y"}]});
    granted(
        &d,
        &tenant,
        "batch",
        &clicked_call,
        widen_prefix("/home/a/docs"),
    )
    .await;
    let inside = json!({"path": "/home/a/docs/z", "items": [{"path": "/home/a/docs/w"}]});
    let r = at_once(&d.engine, &tenant, "batch", &inside).await;
    assert!(is_approved(&r), "{r:?}");
    for attack in [
        json!({"path": "/home/a/docs/z", "items": [{"path": "/etc/cron.d/evil"}]}),
        json!({"path": "/home/a/docs/z", "options": {"path": "/etc/cron.d/evil"}}),
        json!({"path": "/home/a/docs/z", "options": {"backup": {"dest": "/etc/x"}}}),
        json!({"path": "/home/a/docs", "file_name": "../../../etc/passwd"}),
        json!({"path": "/home/a/docs", "outputFolder": "/etc"}),
        json!({"path": "/home/a/docs/z", "items": [[{"file": "/etc/x"}]]}),
    ] {
        let r = at_once(&d.engine, &tenant, "batch", &attack).await;
        assert!(is_pending(&r), "{attack} rode on the grant: {r:?}");
        let _ = d.engine.withdraw(&tenant, "batch", &attack);
    }
}

fn is_accepted(answer: &Result<Accepted, Stopped>) -> bool {
    matches!(answer, Ok(Accepted { .. }))
}

#[tokio::test]
async fn tokens_a_grant_minted_execute_nothing_once_it_is_revoked() {
    let d = desk();
    let tenant = connect(&d.engine, "srv").await;
    // A reusable (token-class) call grant, and a works-once prefix grant.
    let backup = json!({"name": "nightly"});
    let call = granted(&d, &tenant, "backup", &backup, widen_call(15)).await;
    let write = |p: &str| json!({"path": p, "content": "x"});
    let prefix = granted(
        &d,
        &tenant,
        "write",
        &write("/home/a/docs/0"),
        widen_prefix("/home/a/docs"),
    )
    .await;
    // While they live, the agent collects tokens it does not use yet.
    let collected_backup = at_once(&d.engine, &tenant, "backup", &backup).await;
    assert!(is_approved(&collected_backup));
    // One used now: a token-class token may be used again until it expires.
    assert!(is_accepted(
        &confirm(&d.engine, &tenant, "backup", &backup, &collected_backup).await
    ));
    let mut collected_writes = Vec::new();
    for n in 1..=3 {
        let args = write(&format!("/home/a/docs/{n}"));
        let answer = at_once(&d.engine, &tenant, "write", &args).await;
        assert!(is_approved(&answer), "{answer:?}");
        collected_writes.push((args, answer));
    }
    // The person revokes both: nothing they approved without a click runs after that.
    d.engine.revoke_grant(call).await.unwrap();
    d.engine.revoke_grant(prefix).await.unwrap();
    let again = confirm(&d.engine, &tenant, "backup", &backup, &collected_backup).await;
    assert!(
        !is_accepted(&again),
        "a revoked grant's token ran: {again:?}"
    );
    for (args, answer) in &collected_writes {
        let r = confirm(&d.engine, &tenant, "write", args, answer).await;
        assert!(!is_accepted(&r), "a revoked grant's token ran: {r:?}");
    }
}

#[tokio::test]
async fn revoking_a_grant_leaves_the_clicks_own_approval_alone() {
    let d = desk();
    let tenant = connect(&d.engine, "srv").await;
    let backup = json!({"name": "nightly"});
    let (answer, number) =
        clicked(
            &d.engine,
            &tenant,
            "backup",
            &backup,
            move |e: Engine, id| async move {
                e.approve_widening(id, None, &widen_call(15)).await.unwrap()
            },
        )
        .await;
    d.engine.revoke_grant(number).await.unwrap();
    // The person clicked Approve on this one: revoking the widening does not take it back.
    assert!(is_accepted(
        &confirm(&d.engine, &tenant, "backup", &backup, &answer).await
    ));
}

/// Issue 32, a rule's budget kept per grant (`@budget_per("grant")`): the calls a grant covers
/// run without a click up to the rule's N for that grant; past it, a covered call waits for a
/// click; another grant has N of its own.
#[tokio::test]
async fn a_budget_kept_per_grant_runs_each_grants_own_n_calls_and_then_waits_for_a_click() {
    let d = desk();
    let tenant = connect(&d.engine, "files").await;
    d.engine
        .set_rules(Some(
            "@class(\"token\") @grant_max_minutes(\"30\") @budget(\"2\") @budget_per(\"grant\")\n\
             permit (principal, action == Countersign::Action::\"backup\", resource);"
                .to_owned(),
        ))
        .unwrap();
    // Listed again under the rules.
    d.engine.register_tools(&tenant, tools()).await.unwrap();
    for name in ["nightly", "weekly"] {
        let args = json!({ "name": name });
        granted(&d, &tenant, "backup", &args, widen_call(10)).await;
        for n in 1..=2 {
            let answer = at_once(&d.engine, &tenant, "backup", &args).await;
            assert!(is_approved(&answer), "{name}, call {n}: {answer:?}");
        }
        let past = at_once(&d.engine, &tenant, "backup", &args).await;
        assert!(is_pending(&past), "{name}: {past:?}");
    }
}
