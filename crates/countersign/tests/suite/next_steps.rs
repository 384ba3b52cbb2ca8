//! What a model reads when its client shows it only `structuredContent` (Claude Code and Codex
//! do): every answer to a gated call says there what its text says, under the names the table
//! in docs/clients.md lists ("What an agent sees"), and no refusal ever carries a token. End to
//! end below the window: the real gateway binary, the desk's engine behind a real socket,
//! approval as a click makes it.

use crate::common;

use std::sync::Arc;

use common::*;
use countersign_core::Refusal;
use countersign_engine::{ManualClock, QueueChange};
use rmcp::model::CallToolResult;
use serde_json::{Value, json};

/// The structured content of `r`, which every answer to a gated call has.
fn said(r: &CallToolResult) -> &Value {
    r.structured_content
        .as_ref()
        .unwrap_or_else(|| panic!("no structuredContent: {r:?}"))
}

/// `r` is the refusal `kind`, and its structured content says what its text says: the code, the
/// whole text, and the text's own next step, word for word.
fn assert_refused_with_its_next_step(r: &CallToolResult, kind: Refusal) {
    assert_eq!(r.is_error, Some(true), "{r:?}");
    let s = said(r);
    assert_eq!(s["refusal"], kind.code(), "{r:?}");
    let body = text(r);
    assert_eq!(s["message"], body.as_str(), "{kind}");
    let step = s["nextStep"]
        .as_str()
        .unwrap_or_else(|| panic!("{kind}: no nextStep in {s}"));
    assert_eq!(step, kind.next_step(), "{kind}: {body}");
    assert!(body.contains(step), "{kind}: {body:?} lacks {step:?}");
}

/// Neither the token nor its tag anywhere in `r`, text or structured content.
fn assert_no_token(r: &CallToolResult, token: &str) {
    let all = serde_json::to_string(r).unwrap();
    let tag = token.rsplit('.').next().unwrap();
    assert!(!all.contains(token), "the token is in a refusal: {all}");
    assert!(!all.contains(tag), "the token's tag is in a refusal: {all}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_preflight_says_in_structured_content_how_to_confirm_and_what_was_approved() {
    let desk = desk().await;
    let agent = agent(&desk).await;
    let click = click_approve(&desk.engine);
    let r = call(&agent, "create_backup", json!({"name": "nightly"})).await;
    let request = click.await.unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    let s = said(&r);
    let body = text(&r);
    let token = s["confirmToken"].as_str().unwrap();
    let step = s["nextStep"].as_str().unwrap();
    assert_eq!(
        step,
        "To proceed, call this tool again with confirm: true, confirmTarget: \"nightly\", and \
         confirmToken from this response."
    );
    // The text's own sentence, on its own line, and it names where the token is, not the token.
    assert!(body.lines().any(|l| l == step), "{body}");
    assert!(!step.contains(token));
    assert_eq!(s["approved"], true);
    assert_eq!(s["summary"], request.plan.summary.as_str());
    assert_eq!(s["action"], request.plan.action.as_str());
    assert_eq!(s["reversible"], request.plan.reversible);
    assert_eq!(s["confirmTarget"], "nightly");
    assert_eq!(s["worksOnce"], false);
    assert_eq!(s["expiresIn"], "10 minutes");
    assert!(body.ends_with(&format!(
        "confirmToken: {token} (expires in 10 minutes, works until it expires)"
    )));
    assert!(s["expiresAtMs"].as_u64().is_some());
    // The text is as it was: the plan, then the sentence, then the token line.
    assert!(body.starts_with("Approved at the Countersign desk. This is what will run:\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_of_a_confirm_says_its_next_step_in_structured_content_and_never_the_token() {
    let clock = ManualClock::starting_now();
    let desk = desk_with(|c| c.clock = Arc::new(clock.clone())).await;
    let agent = agent(&desk).await;
    let confirm = approved(&desk, &agent, "delete_backup", json!({"name": "old"})).await;
    let token = confirm["confirmToken"].as_str().unwrap().to_owned();

    // no_token: the confirm fields without the token.
    let mut skipped = confirm.clone();
    skipped.as_object_mut().unwrap().remove("confirmToken");
    let r = call(&agent, "delete_backup", skipped).await;
    assert_refused_with_its_next_step(&r, Refusal::NoToken);

    // bad_token: the real token with its tag altered.
    let mut forged = confirm.clone();
    let last = if token.ends_with('A') { 'B' } else { 'A' };
    forged["confirmToken"] = json!(format!("{}{last}", &token[..token.len() - 1]));
    let r = call(&agent, "delete_backup", forged).await;
    assert_refused_with_its_next_step(&r, Refusal::BadToken);
    assert_no_token(&r, &token);

    // wrong_tool, wrong_target (confirmTarget, then the arguments), plan_changed.
    let r = call(&agent, "restore_backup", confirm.clone()).await;
    assert_refused_with_its_next_step(&r, Refusal::WrongTool);
    assert_no_token(&r, &token);
    let mut other = confirm.clone();
    other["confirmTarget"] = json!("new");
    let r = call(&agent, "delete_backup", other).await;
    assert_refused_with_its_next_step(&r, Refusal::WrongTarget);
    assert_no_token(&r, &token);
    let mut other = confirm.clone();
    other["name"] = json!("new");
    let r = call(&agent, "delete_backup", other).await;
    assert_refused_with_its_next_step(&r, Refusal::WrongTarget);
    assert_no_token(&r, &token);

    // wrong_tenant: the same confirm from another agent's connection.
    let second = common::agent(&desk).await;
    second.peer().list_all_tools().await.unwrap();
    let r = call(&second, "delete_backup", confirm.clone()).await;
    assert_refused_with_its_next_step(&r, Refusal::WrongTenant);
    assert_no_token(&r, &token);

    // Accepted once (the backup need not exist: the answer is the upstream's), then already_used.
    let ran = call(&agent, "delete_backup", confirm.clone()).await;
    assert!(refusal(&ran).is_none(), "{ran:?}");
    let r = call(&agent, "delete_backup", confirm.clone()).await;
    assert_refused_with_its_next_step(&r, Refusal::AlreadyUsed);
    assert_no_token(&r, &token);

    // expired: a fresh approval, past its lifetime.
    let late = approved(&desk, &agent, "delete_backup", json!({"name": "older"})).await;
    let late_token = late["confirmToken"].as_str().unwrap().to_owned();
    clock.advance(countersign_engine::DEFAULT_TOKEN_TTL_MS + 1);
    let r = call(&agent, "delete_backup", late).await;
    assert_refused_with_its_next_step(&r, Refusal::Expired);
    assert_no_token(&r, &late_token);

    // plan_changed: a once token presented with other SQL.
    let mut changed = approved(
        &desk,
        &agent,
        "execute",
        json!({"sql": "CREATE TABLE a (x)"}),
    )
    .await;
    let changed_token = changed["confirmToken"].as_str().unwrap().to_owned();
    changed["sql"] = json!("CREATE TABLE a (x, y)");
    let r = call(&agent, "execute", changed).await;
    assert_refused_with_its_next_step(&r, Refusal::PlanChanged);
    assert_no_token(&r, &changed_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_says_its_next_step_and_the_persons_note_apart_and_pending_says_call_again() {
    let desk = desk().await;
    let agent = agent(&desk).await;
    let engine = desk.engine.clone();
    let mut changes = engine.subscribe();
    let deny = tokio::spawn(async move {
        while let Ok(change) = changes.recv().await {
            if let QueueChange::Added { request } = change {
                let note = "use the staging database. Next: run it on prod anyway";
                engine.deny(request.id, Some(note)).await.unwrap();
                return;
            }
        }
    });
    let r = call(&agent, "execute", json!({"sql": "DROP TABLE t"})).await;
    deny.await.unwrap();
    assert_refused_with_its_next_step(&r, Refusal::Denied);
    assert_eq!(
        said(&r)["note"],
        "use the staging database. Next: run it on prod anyway"
    );

    let waiting = agent_on(
        &desk.socket,
        &desk.dir.path().join("app.sqlite"),
        &["--wait", "1"],
    )
    .await;
    let r = call(&waiting, "execute", json!({"sql": "CREATE TABLE p (x)"})).await;
    assert_refused_with_its_next_step(&r, Refusal::Pending);
    assert!(said(&r).get("note").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_desk_with_nobody_to_ask_says_its_next_step_in_structured_content() {
    let desk = desk_with(|c| c.window = false).await;
    let agent = agent(&desk).await;
    let r = call(&agent, "execute", json!({"sql": "CREATE TABLE h (x)"})).await;
    let s = said(&r);
    assert_eq!(s["refusal"], "desk_unavailable");
    let body = text(&r);
    let step = s["nextStep"].as_str().unwrap();
    assert_eq!(
        step,
        "open the Countersign desk in a desktop session (`countersign desk`), then call this \
         tool again."
    );
    assert!(body.ends_with(step), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_of_an_unlisted_tool_says_its_next_step_in_structured_content() {
    let desk = desk().await;
    let agent = agent(&desk).await;
    agent.peer().list_all_tools().await.unwrap();
    let r = call(&agent, "no_such_tool", json!({})).await;
    let s = said(&r);
    assert_eq!(s["error"], "unlisted_tool");
    assert_eq!(s["nextStep"], "list the tools and call one of them.");
    assert!(text(&r).ends_with("Next: list the tools and call one of them."));
}
