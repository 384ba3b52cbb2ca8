//! Rules over arguments (`policy.cedar`) in the engine: the docs' example policy, loaded against
//! a server's real listing, decides each call by its arguments, as a gateway's preflights reach
//! it, on a real SQLite file. Nothing here approves: what needs a click waits in the queue.

use std::sync::Arc;

use countersign_core::{GateClass, Refusal, ServerId, Tenant};
use countersign_engine::{Engine, GrantError, ManualClock, Queued, Stopped};
use countersign_store::HistoryFilter;
use countersign_tests::engine::Desk;
use serde_json::{Value, json};

/// The docs' example: a single SELECT runs on its own on query/execute; writes under scratch/
/// run on their own, under .github/ once with two approvers and the target typed; DROP is
/// forbidden outside 9 to 18.
const EXAMPLE: &str = include_str!("../../../cedar/policies/example.cedar");

/// Noon, 2026-12-05 (UTC): inside business hours.
const NOON_MS: u64 = 1_796_472_000_000;

fn tools() -> Vec<Value> {
    let sql =
        json!({"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]});
    vec![
        json!({"name": "query", "annotations": {"readOnlyHint": true}, "inputSchema": sql}),
        json!({"name": "execute", "annotations": {"destructiveHint": true}, "inputSchema": sql}),
        json!({"name": "write_file", "annotations": {"destructiveHint": true}, "inputSchema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        }}),
        json!({"name": "read_file", "annotations": {"readOnlyHint": true}, "inputSchema": {
            "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
        }}),
        // An argument Cedar cannot hold (an array): no rule names the tool, so the annotations
        // decide, as without rules.
        json!({"name": "edit_file", "annotations": {"destructiveHint": true}, "inputSchema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "edits": {"type": "array"}},
            "required": ["path", "edits"],
        }}),
    ]
}

/// A desk whose clock reads noon, nothing listed.
fn desk_at_noon() -> (Desk, ManualClock) {
    let clock = ManualClock::at(NOON_MS);
    let own = clock.clone();
    (Desk::new(move |config| config.clock = Arc::new(own)), clock)
}

/// A desk at noon, its server listed, the example in force.
async fn desk() -> (Desk, ManualClock, Tenant) {
    let (d, clock) = desk_at_noon();
    let tenant = d.engine.connect(ServerId::Command("files-and-sql".into()));
    d.engine.register_tools(&tenant, tools()).await.unwrap();
    d.engine.set_rules(Some(EXAMPLE.to_owned())).unwrap();
    // Listed again under the rules (a listing classes tools with the rules then in force).
    d.engine.register_tools(&tenant, tools()).await.unwrap();
    (d, clock, tenant)
}

async fn ask(engine: &Engine, tenant: &Tenant, tool: &str, args: Value) -> Result<Queued, Stopped> {
    engine.queue_preflight(tenant, tool, &args).await
}

fn refusal(answer: Result<Queued, Stopped>) -> (Refusal, String) {
    match answer {
        Err(Stopped::Refused { refusal, message }) => (refusal, message),
        other => panic!("not refused: {other:?}"),
    }
}

#[tokio::test]
async fn a_single_select_runs_without_a_click_and_a_delete_waits_for_one() {
    let (d, _, tenant) = desk().await;
    let select = ask(
        &d.engine,
        &tenant,
        "execute",
        json!({"sql": "SELECT * FROM users"}),
    )
    .await;
    assert!(matches!(select, Ok(Queued::Open(_))), "{select:?}");
    assert!(d.engine.pending().is_empty(), "nobody was asked");
    // Run on the rules' word, it is on the record: the rules' line, the target, the plan.
    let history = d.engine.history(&HistoryFilter::default()).await.unwrap();
    let opened: Vec<_> = history
        .iter()
        .filter(|e| e.kind.code() == "opened")
        .collect();
    assert_eq!(opened.len(), 1, "{history:?}");
    // A rule's line is its first, the annotation's just above its `permit` (counted from 1).
    let line = EXAMPLE
        .lines()
        .position(|l| l.starts_with("permit (principal, action in [Countersign::Action::\"query\""))
        .unwrap();
    assert_eq!(
        opened[0].note.as_deref(),
        Some(format!("opened by policy.cedar line {line}: ran without a click").as_str()),
        "{:?}",
        opened[0]
    );
    assert_eq!(opened[0].tool, "execute");
    assert!(opened[0].plan.is_some());
    // A second statement after the SELECT is not the rule's to open.
    let two = ask(
        &d.engine,
        &tenant,
        "execute",
        json!({"sql": "SELECT 1; DELETE FROM users"}),
    )
    .await;
    assert!(matches!(two, Ok(Queued::Waiting(_))), "{two:?}");
    let delete = ask(
        &d.engine,
        &tenant,
        "execute",
        json!({"sql": "DELETE FROM users"}),
    )
    .await;
    assert!(matches!(delete, Ok(Queued::Waiting(_))), "{delete:?}");
    let waiting = d.engine.pending();
    assert_eq!(waiting.len(), 2);
    let call = waiting[1].call().unwrap();
    assert_eq!(call.class, GateClass::Once, "as the annotations class it");
    assert!(!call.ruled, "no rule spoke to it: its listing decided");
}

#[tokio::test]
async fn writes_under_scratch_open_and_under_github_need_two_approvers_and_the_target_typed() {
    let (d, _, tenant) = desk().await;
    let scratch = json!({"path": "scratch/notes.txt", "content": "x"});
    assert!(matches!(
        ask(&d.engine, &tenant, "write_file", scratch).await,
        Ok(Queued::Open(_))
    ));
    // Climbing out of scratch/ is not under it.
    let out = json!({"path": "scratch/../.github/workflows/ci.yml", "content": "x"});
    assert!(matches!(
        ask(&d.engine, &tenant, "write_file", out).await,
        Ok(Queued::Waiting(_))
    ));
    let workflow = json!({"path": ".github/workflows/ci.yml", "content": "x"});
    let Ok(Queued::Waiting(_)) = ask(&d.engine, &tenant, "write_file", workflow).await else {
        panic!("a write under .github/ did not wait for a person");
    };
    let request = d.engine.pending().pop().unwrap();
    let call = request.call().unwrap();
    assert!(call.ruled);
    assert_eq!(call.class, GateClass::Once);
    assert_eq!(call.approvers, 2);
    assert!(call.type_target);
    assert!(call.why.contains("policy.cedar"), "{}", call.why);
    // The rules gate it and none says a grant may cover it: no grant is offered.
    let offer = d.engine.grant_offer(request.id).unwrap();
    assert!(!offer.call, "{offer:?}");
    assert_eq!(offer.call_code, Some(GrantError::Ruled.code()));
}

#[tokio::test]
async fn drop_is_forbidden_outside_business_hours_with_the_rules_reason_and_on_the_record() {
    let (d, clock, tenant) = desk().await;
    let drop = json!({"sql": "DROP TABLE users"});
    // At noon it waits for a person, as any destructive call.
    assert!(matches!(
        ask(&d.engine, &tenant, "execute", drop.clone()).await,
        Ok(Queued::Waiting(_))
    ));
    clock.advance(8 * 3_600_000); // 20:00
    let (code, message) = refusal(ask(&d.engine, &tenant, "execute", drop).await);
    assert_eq!(code, Refusal::PolicyForbidden);
    assert!(
        message.contains("DROP runs only in business hours"),
        "{message}"
    );
    assert!(
        message.ends_with(Refusal::PolicyForbidden.next_step()),
        "{message}"
    );
    assert_eq!(
        d.engine.pending().len(),
        1,
        "nothing more was shown to anyone"
    );
    let history = d.engine.history(&HistoryFilter::default()).await.unwrap();
    assert!(
        history
            .iter()
            .any(|e| format!("{:?}", e.kind).contains("PolicyForbidden")),
        "the refusal is on the record"
    );
}

#[tokio::test]
async fn a_call_the_rules_cannot_see_whole_is_refused_never_opened() {
    let (d, _, tenant) = desk().await;
    for args in [
        json!({"sql": "SELECT 1", "mode": "write"}),
        json!({"sql": 5}),
        json!({"sql": "SELECT 1", "sql2": ["DROP TABLE users"]}),
    ] {
        let (code, _) = refusal(ask(&d.engine, &tenant, "execute", args.clone()).await);
        assert_eq!(code, Refusal::PolicyUnfit, "{args}");
    }
    // A tool no rule names is the annotations' to decide, whatever Cedar can hold of it.
    let edit = json!({"path": "a.txt", "edits": [{"old": "a", "new": "b"}]});
    assert!(matches!(
        ask(&d.engine, &tenant, "edit_file", edit).await,
        Ok(Queued::Waiting(_))
    ));
}

#[tokio::test]
async fn a_read_only_tool_a_rule_may_forbid_is_listed_gated_and_its_other_calls_run_on_their_own() {
    let (d, clock, tenant) = desk().await;
    let forbid = format!(
        "{EXAMPLE}\n@reason(\"no reading secrets at night\")\n\
         forbid (principal, action == Countersign::Action::\"read_file\", resource)\n\
         when {{ context.arguments.path like \"secrets/*\" && context.hour < 6 }};"
    );
    d.engine.set_rules(Some(forbid)).unwrap();
    let listed = d.engine.register_tools(&tenant, tools()).await.unwrap();
    let class = |name: &str| listed.iter().find(|t| t.name == name).unwrap().class;
    assert_eq!(
        class("read_file"),
        GateClass::Token,
        "listed gated: a forbid may reach it"
    );
    assert_eq!(
        class("query"),
        GateClass::Open,
        "only an open rule names it"
    );
    let secret = json!({"path": "secrets/key"});
    assert!(matches!(
        ask(&d.engine, &tenant, "read_file", secret.clone()).await,
        Ok(Queued::Open(_))
    ));
    clock.advance(15 * 3_600_000); // 03:00 the next day
    let (code, message) = refusal(ask(&d.engine, &tenant, "read_file", secret).await);
    assert_eq!(code, Refusal::PolicyForbidden);
    assert!(message.contains("no reading secrets at night"), "{message}");
    assert!(matches!(
        ask(
            &d.engine,
            &tenant,
            "read_file",
            json!({"path": "README.md"})
        )
        .await,
        Ok(Queued::Open(_))
    ));
    assert!(d.engine.pending().is_empty());
}

#[tokio::test]
async fn rules_that_do_not_load_are_refused_whole_with_the_line_and_the_last_ones_stay() {
    let (d, _, tenant) = desk().await;
    let bad = format!(
        "{EXAMPLE}\n@class(\"open\")\npermit (principal, action == Countersign::Action::\"execute\", resource)\nwhen {{ context.arguments.table == \"x\" }};"
    );
    let lines = bad.lines().count();
    let e = d.engine.set_rules(Some(bad)).unwrap_err();
    assert_eq!(e.code(), "policy_invalid", "{e}");
    assert!(
        e.to_string().starts_with(&format!("line {}", lines - 2)),
        "{e}"
    );
    // A wildcard that would open a destructive tool is refused, and says which.
    let wide = "@class(\"open\")\npermit (principal, action, resource);".to_owned();
    let e = d.engine.set_rules(Some(wide)).unwrap_err();
    assert_eq!(e.code(), "policy_opens_destructive", "{e}");
    // The example is still in force.
    let select = ask(&d.engine, &tenant, "execute", json!({"sql": "SELECT 1"})).await;
    assert!(matches!(select, Ok(Queued::Open(_))), "{select:?}");
    // No rules: everything as the listing classes it.
    d.engine.set_rules(None).unwrap();
    let select = ask(&d.engine, &tenant, "execute", json!({"sql": "SELECT 1"})).await;
    assert!(matches!(select, Ok(Queued::Waiting(_))), "{select:?}");
}

#[tokio::test]
async fn a_server_listing_a_tool_the_rules_were_not_loaded_with_gets_it_refused_where_a_rule_reaches_it()
 {
    let (d, _, _) = desk().await;
    let any = format!(
        "{EXAMPLE}\n@class(\"token\")\npermit (principal, action, resource) when {{ context.hour >= 0 }};"
    );
    d.engine.set_rules(Some(any)).unwrap();
    // Another server lists execute with sql of another type: the rules naming sql no longer
    // load against both, so they stay as they were, and its calls are not judged by them.
    let other = d.engine.connect(ServerId::Command("other".into()));
    let listing = vec![
        json!({"name": "execute", "annotations": {"destructiveHint": true},
        "inputSchema": {"type": "object", "properties": {"sql": {"type": "integer"}}}}),
    ];
    d.engine.register_tools(&other, listing).await.unwrap();
    assert_eq!(
        d.engine.rules_problem().map(|e| e.code()),
        Some("policy_invalid")
    );
    let new_tool = d.engine.connect(ServerId::Command("third".into()));
    d.engine
        .register_tools(
            &new_tool,
            vec![json!({"name": "rm", "inputSchema": {"type": "object"}})],
        )
        .await
        .unwrap();
    let (code, _) = refusal(ask(&d.engine, &new_tool, "rm", json!({})).await);
    assert_eq!(
        code,
        Refusal::PolicyUnfit,
        "a rule of any action reaches it, unloaded"
    );
}

/// A budget of 2 SELECTs per hour: two run without a click, the third waits for a person, and a
/// new window opens again; with `@budget_past("refuse")` the third is refused, saying which rule
/// and when it resets; counted by an argument, a call takes what it says.
#[tokio::test]
async fn a_rules_budget_lets_that_many_run_without_a_click_per_window_then_asks_or_refuses() {
    let (d, clock, tenant) = desk().await;
    let budget = "@class(\"open\") @budget(\"2\") @budget_minutes(\"60\")\n\
        permit (principal, action == Countersign::Action::\"execute\", resource)\n\
        when { context.arguments.sql like \"SELECT *\" };";
    d.engine.set_rules(Some(budget.to_owned())).unwrap();
    let select = || json!({"sql": "SELECT 1"});
    for _ in 0..2 {
        assert!(matches!(
            ask(&d.engine, &tenant, "execute", select()).await,
            Ok(Queued::Open(_))
        ));
    }
    let third = ask(&d.engine, &tenant, "execute", select()).await;
    assert!(matches!(third, Ok(Queued::Waiting(_))), "{third:?}");
    let call = d.engine.pending()[0].call().unwrap().clone();
    assert!(
        call.ruled
            && call
                .why
                .contains("budget of 2 calls per 60 minutes is used"),
        "{}",
        call.why
    );
    // A new connection of the desk is the same person's: no new budget.
    let again = d.engine.connect(ServerId::Command("files-and-sql".into()));
    d.engine.register_tools(&again, tools()).await.unwrap();
    let fourth = ask(&d.engine, &again, "execute", select()).await;
    assert!(matches!(fourth, Ok(Queued::Waiting(_))), "{fourth:?}");
    // The next window has room again (the first began at noon, on the hour).
    clock.advance(60 * 60_000);
    assert!(matches!(
        ask(&d.engine, &tenant, "execute", select()).await,
        Ok(Queued::Open(_))
    ));

    let refuse = budget.replace(
        "@budget_minutes(\"60\")",
        "@budget_minutes(\"60\") @budget_past(\"refuse\")",
    );
    d.engine.set_rules(Some(refuse)).unwrap();
    // Another rule text: a budget of its own, with its own two.
    for _ in 0..2 {
        assert!(matches!(
            ask(&d.engine, &tenant, "execute", select()).await,
            Ok(Queued::Open(_))
        ));
    }
    let (code, message) = refusal(ask(&d.engine, &tenant, "execute", select()).await);
    assert_eq!(code, Refusal::BudgetSpent);
    assert!(message.contains("2 calls per 60 minutes"), "{message}");
    assert!(message.contains("policy.cedar line 1"), "{message}");
    assert!(message.contains("resets in 3600 s"), "{message}");
    let history = d.engine.history(&HistoryFilter::default()).await.unwrap();
    assert!(
        history
            .iter()
            .any(|e| format!("{:?}", e.kind).contains("BudgetSpent"))
    );
}

#[tokio::test]
async fn a_budget_counted_by_an_argument_takes_what_each_call_says_and_refuses_a_call_that_does_not_say()
 {
    let (d, clock) = desk_at_noon();
    let tenant = d.engine.connect(ServerId::Command("exporter".into()));
    let export = json!({"name": "export", "annotations": {"destructiveHint": true}, "inputSchema": {
        "type": "object",
        "properties": {"table": {"type": "string"}, "rows": {"type": "integer"}},
        "required": ["table"],
    }});
    d.engine
        .register_tools(&tenant, vec![export])
        .await
        .unwrap();
    d.engine
        .set_rules(Some(
            "@class(\"open\") @budget(\"100\") @budget_counts(\"rows\") @budget_past(\"refuse\")\n\
             permit (principal, action == Countersign::Action::\"export\", resource);"
                .to_owned(),
        ))
        .unwrap();
    let rows = |n: u64| json!({"table": "users", "rows": n});
    assert!(matches!(
        ask(&d.engine, &tenant, "export", rows(60)).await,
        Ok(Queued::Open(_))
    ));
    assert!(matches!(
        ask(&d.engine, &tenant, "export", rows(40)).await,
        Ok(Queued::Open(_))
    ));
    let (code, message) = refusal(ask(&d.engine, &tenant, "export", rows(1)).await);
    assert_eq!(code, Refusal::BudgetSpent);
    assert!(message.contains("100 of `rows`"), "{message}");
    // A call that does not say how many it takes cannot be measured: never opened.
    let (code, _) = refusal(ask(&d.engine, &tenant, "export", json!({"table": "users"})).await);
    assert_eq!(code, Refusal::PolicyUnfit);
    // More than a whole window holds: never.
    clock.advance(60 * 60_000);
    let (code, _) = refusal(ask(&d.engine, &tenant, "export", rows(101)).await);
    assert_eq!(code, Refusal::BudgetSpent);
    assert!(matches!(
        ask(&d.engine, &tenant, "export", rows(100)).await,
        Ok(Queued::Open(_))
    ));
}

/// Rules accepted while a connection is open reach the tools it listed open: such a call is not
/// forwarded as open (the open lane and the full path both say no) until the listing is taken
/// again under the new rules, which then decide it.
#[tokio::test]
async fn rules_accepted_after_a_listing_stop_its_open_tools_from_running_as_open() {
    let (d, _) = desk_at_noon();
    let tenant = d.engine.connect(ServerId::Command("files".into()));
    d.engine.register_tools(&tenant, tools()).await.unwrap();
    assert!(
        d.engine.forwards_open(&tenant, "read_file"),
        "open, no rules"
    );
    d.engine
        .set_rules(Some(
            "@reason(\"no secrets\")\nforbid (principal, action == Countersign::Action::\"read_file\", resource)\n\
             when { context.arguments.path like \"secrets/*\" };"
                .to_owned(),
        ))
        .unwrap();
    assert!(
        !d.engine.forwards_open(&tenant, "read_file"),
        "the lane says no"
    );
    let stale = d.engine.open_call(&tenant, "read_file").await;
    assert!(
        matches!(
            stale,
            Err(Stopped::Failed {
                code: countersign_engine::ErrorCode::Busy,
                ..
            })
        ),
        "{stale:?}"
    );
    // A tool no rule may gate still runs as open meanwhile.
    assert!(d.engine.open_call(&tenant, "query").await.is_ok());
    // Listed again, the tool is gated and each call decided.
    let listed = d.engine.register_tools(&tenant, tools()).await.unwrap();
    assert_eq!(
        listed.iter().find(|t| t.name == "read_file").unwrap().class,
        GateClass::Token
    );
    let (code, _) = refusal(
        ask(
            &d.engine,
            &tenant,
            "read_file",
            json!({"path": "secrets/key"}),
        )
        .await,
    );
    assert_eq!(code, Refusal::PolicyForbidden);
    assert!(matches!(
        ask(
            &d.engine,
            &tenant,
            "read_file",
            json!({"path": "README.md"})
        )
        .await,
        Ok(Queued::Open(_))
    ));
}

/// Rules that stop loading keep the tools they were loaded with; a call of a tool another server
/// has since made destructive under the same name is refused, never judged by the old facts.
#[tokio::test]
async fn rules_that_stop_loading_refuse_a_tool_whose_listing_changed_under_them() {
    let (d, _, tenant) = desk().await;
    let wildcard = "@class(\"once\")\npermit (principal, action, resource) when { context.hour >= 0 };\n\
        @class(\"open\")\npermit (principal, action == Countersign::Action::\"query\", resource);";
    d.engine.set_rules(Some(wildcard.to_owned())).unwrap();
    d.engine.register_tools(&tenant, tools()).await.unwrap();
    let sql = json!({"sql": "SELECT 1"});
    assert!(matches!(
        ask(&d.engine, &tenant, "query", sql.clone()).await,
        Ok(Queued::Waiting(_))
    ));
    // Another server lists a query of another shape: the merge no longer matches what the rules
    // were loaded with, the reload fails, and calls of query are not the old rules' any more.
    let other = d.engine.connect(ServerId::Command("other".into()));
    let listing = vec![
        json!({"name": "query", "annotations": {"destructiveHint": true},
        "inputSchema": {"type": "object", "properties": {"sql": {"type": "integer"}}}}),
    ];
    d.engine.register_tools(&other, listing).await.unwrap();
    let (code, _) = refusal(ask(&d.engine, &tenant, "query", sql).await);
    assert_eq!(code, Refusal::PolicyUnfit);
}
