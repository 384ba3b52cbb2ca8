//! A client whose own tool timeout is shorter than a person needs (Claude Code's
//! `MCP_TOOL_TIMEOUT`, Codex's `tool_timeout_sec`) cancels its waiting preflight and asks again:
//! the call stays in the desk's queue, marked, and the retry re-attaches to it and collects the
//! approval the person gave meanwhile. End to end: a real rmcp client spawns the real gateway,
//! the desk's engine runs in this process behind a real socket, and the approval is
//! `Engine::approve`, as a click makes it.

use crate::common;

use std::time::Duration;

use common::*;
use countersign_engine::{PendingRequest, QueueChange};
use rmcp::model::{CallToolRequest, CallToolRequestParams, ClientRequest, ServerResult};
use rmcp::service::PeerRequestOptions;
use serde_json::{Value, json};

/// The next change to the desk's queue that `pick` takes.
async fn next_change<T>(
    changes: &mut tokio::sync::broadcast::Receiver<QueueChange>,
    pick: impl Fn(QueueChange) -> Option<T>,
) -> T {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match changes.recv().await {
                Ok(change) => {
                    if let Some(found) = pick(change) {
                        return found;
                    }
                }
                Err(e) => panic!("the desk's queue closed: {e}"),
            }
        }
    })
    .await
    .expect("the change never came within 30 s")
}

fn marked(change: QueueChange) -> Option<PendingRequest> {
    match change {
        QueueChange::Updated { request }
            if request
                .call()
                .is_some_and(|c| c.stopped_waiting_at_ms.is_some()) =>
        {
            Some(*request)
        }
        _ => None,
    }
}

/// `tool` called with `args` by a client whose own timeout is `timeout`: what it gets (its
/// timeout's error when it gave up, after sending `notifications/cancelled`).
async fn call_with_timeout(
    agent: &Agent,
    tool: &str,
    args: &Value,
    timeout: Duration,
) -> Result<ServerResult, rmcp::ServiceError> {
    let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(obj(args.clone()));
    agent
        .send_request_with_option(
            ClientRequest::CallToolRequest(CallToolRequest::new(params)),
            PeerRequestOptions::with_timeout(timeout),
        )
        .await
        .unwrap()
        .await_response()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_times_out_before_the_click_collects_the_approval_when_it_asks_again() {
    let desk = desk().await;
    // The desk would wait 30 s; the client gives up after 1 s, as a short tool timeout does.
    let agent = agent_on(
        &desk.socket,
        &desk.dir.path().join("app.sqlite"),
        &["--wait", "30"],
    )
    .await;
    let args = json!({"sql": "CREATE TABLE kept (x)"});
    let mut changes = desk.engine.subscribe();
    let first = call_with_timeout(&agent, "execute", &args, Duration::from_secs(1)).await;
    assert!(
        matches!(first, Err(rmcp::ServiceError::Timeout { .. })),
        "{first:?}"
    );
    let asked = next_request(&mut changes).await;
    // The cancel reached the desk: the request is still there, marked, not withdrawn.
    let stopped = next_change(&mut changes, marked).await;
    assert_eq!(stopped.id, asked.id);
    let pending = desk.engine.pending();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert!(pending[0].call().unwrap().stopped_waiting_at_ms.is_some());
    // The person clicks while no agent waits.
    let typed = asked.type_target().then(|| asked.plan.target.clone());
    desk.engine
        .approve(asked.id, typed.as_deref())
        .await
        .unwrap();

    // The same call asked again re-attaches and collects the approval at once: no new request.
    let again = call(&agent, "execute", args.clone()).await;
    assert_ne!(again.is_error, Some(true), "{again:?}");
    let content = again.structured_content.clone().unwrap();
    assert_eq!(content["approved"], true, "{content}");
    assert!(desk.engine.pending().is_empty());
    let done = call(&agent, "execute", confirm_args(&args, &again)).await;
    assert_ne!(done.is_error, Some(true), "{done:?}");
    let replay = call(&agent, "execute", confirm_args(&args, &again)).await;
    assert_eq!(
        refusal(&replay).as_deref(),
        Some("already_used"),
        "{replay:?}"
    );
    let tables = call(
        &agent,
        "query",
        json!({"sql": "SELECT count(*) AS n FROM sqlite_master WHERE name = 'kept'"}),
    )
    .await;
    assert_eq!(tables.structured_content.unwrap()["rows"][0]["n"], 1);
    agent.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cancelling_and_asking_again_keeps_one_request_until_the_click() {
    let desk = desk().await;
    let agent = agent_on(
        &desk.socket,
        &desk.dir.path().join("app.sqlite"),
        &["--wait", "30"],
    )
    .await;
    let args = json!({"sql": "CREATE TABLE again (x)"});
    let mut changes = desk.engine.subscribe();
    // Three rounds of asking and giving up: one request all along, marked after each.
    let mut id = None;
    for _ in 0..3 {
        let params = CallToolRequestParams::new("execute").with_arguments(obj(args.clone()));
        let handle = agent
            .send_request_with_option(
                ClientRequest::CallToolRequest(CallToolRequest::new(params)),
                PeerRequestOptions::no_options(),
            )
            .await
            .unwrap();
        // Waiting again (a new request the first time, the mark gone after): then cancelled.
        let waiting = next_change(&mut changes, |c| match c {
            QueueChange::Added { request } => Some(request.id),
            QueueChange::Updated { request }
                if request
                    .call()
                    .is_some_and(|c| c.stopped_waiting_at_ms.is_none()) =>
            {
                Some(request.id)
            }
            _ => None,
        })
        .await;
        assert_eq!(
            *id.get_or_insert(waiting),
            waiting,
            "one request, re-attached"
        );
        handle
            .cancel(Some("the client's timeout".into()))
            .await
            .unwrap();
        let stopped = next_change(&mut changes, marked).await;
        assert_eq!(Some(stopped.id), id);
        assert_eq!(desk.engine.pending().len(), 1);
    }
    let id = id.unwrap();
    // Approved now; the next ask collects it.
    let request = desk.engine.pending().pop().unwrap();
    let typed = request.type_target().then(|| request.plan.target.clone());
    desk.engine.approve(id, typed.as_deref()).await.unwrap();
    let again = call(&agent, "execute", args.clone()).await;
    assert_eq!(again.structured_content.unwrap()["approved"], true);
    agent.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_disconnects_still_takes_its_marked_request_with_it() {
    let desk = desk().await;
    let agent = agent_on(
        &desk.socket,
        &desk.dir.path().join("app.sqlite"),
        &["--wait", "30"],
    )
    .await;
    let args = json!({"sql": "CREATE TABLE gone (x)"});
    let mut changes = desk.engine.subscribe();
    let _ = call_with_timeout(&agent, "execute", &args, Duration::from_millis(500)).await;
    let stopped = next_change(&mut changes, marked).await;
    agent.cancel().await.unwrap();
    let (id, reason) = next_removal(&mut changes).await;
    assert_eq!(
        (id, reason),
        (stopped.id, countersign_engine::Removal::Disconnected)
    );
    assert!(desk.engine.pending().is_empty());
    assert_eq!(
        desk.engine.approve(id, None).await,
        Err(countersign_engine::ApproveError::NotPending)
    );
}
