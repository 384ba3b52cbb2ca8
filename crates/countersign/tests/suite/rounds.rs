//! The MCP 2026-07-28 flow end to end below the window: an rmcp client that negotiated 2026-07-28
//! and handles URL elicitations calls a gated built-in tool through the real `countersign mcp`; the
//! desk answers `input_required` (an elicitation naming the request, a sealed `requestState`), the
//! person's click is `Engine::approve` called here, and the client's retry with the state gets the
//! tool's real result. Then every way around the click the state could offer: forged, altered,
//! oversized, replayed, another connection's, another tool's or arguments', sealed before the
//! secret was rotated, sent by an older client, sent beside confirm fields. Each is refused, and
//! nothing runs.

use crate::common;

use countersign_core::ServerId;
use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::*;
use countersign_core::token::SigningKey;
use countersign_engine::{PendingRequest, Removal};
use rmcp::model::*;
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{Peer, RoleClient};
use serde_json::{Value, json};

type Modern = RunningService<RoleClient, ClientConfig>;

/// A client that speaks 2026-07-28 (discover, no handshake) and declares URL elicitation, on the
/// built-in tools of `desk`.
async fn modern(desk: &Desk, name: &str) -> Modern {
    modern_with(
        desk,
        name,
        json!({"elicitation": {"url": {}, "form": {}}}),
        "2",
    )
    .await
}

/// A 2026-07-28 client declaring `capabilities`, whose gateway waits `wait` seconds.
async fn modern_with(desk: &Desk, name: &str, capabilities: Value, wait: &str) -> Modern {
    let db = desk.dir.path().join("app.sqlite");
    let cmd = gateway_command(
        &desk.socket,
        &["--db", db.to_str().unwrap(), "--wait", wait],
    );
    let capabilities: ClientCapabilities = serde_json::from_value(capabilities).unwrap();
    let client = ClientConfig::new(capabilities, Implementation::new(name.to_owned(), "1.0"));
    let lifecycle = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    client
        .serve_with_lifecycle(TokioChildProcess::new(cmd).unwrap(), lifecycle)
        .await
        .unwrap()
}

fn params(tool: &str, args: &Value) -> CallToolRequestParams {
    CallToolRequestParams::new(tool.to_owned()).with_arguments(obj(args.clone()))
}

/// One round, as the client sends it: `state` echoed, `answer` the elicitation's action.
async fn round(
    agent: &Peer<RoleClient>,
    tool: &str,
    args: &Value,
    state: Option<&str>,
    answer: Option<&str>,
) -> CallToolResponse {
    let mut p = params(tool, args);
    p.request_state = state.map(str::to_owned);
    if let Some(action) = answer {
        let responses: BTreeMap<String, Value> =
            BTreeMap::from([("countersign_desk".to_owned(), json!({"action": action}))]);
        p.input_responses = Some(responses);
    }
    agent.call_tool_once(p).await.unwrap()
}

fn input_required(r: CallToolResponse) -> InputRequiredResult {
    match r {
        CallToolResponse::InputRequired(ir) => ir,
        other => panic!("expected input_required, got {other:?}"),
    }
}

fn complete(r: CallToolResponse) -> CallToolResult {
    match r {
        CallToolResponse::Complete(r) => r,
        other => panic!("expected a complete result, got {other:?}"),
    }
}

/// The first round of `tool(args)`: the request it queued and the desk's answer.
async fn first_round(
    desk: &Desk,
    agent: &Peer<RoleClient>,
    tool: &str,
    args: &Value,
) -> (PendingRequest, InputRequiredResult) {
    let mut changes = desk.engine.subscribe();
    let answer = input_required(round(agent, tool, args, None, None).await);
    let request = next_request(&mut changes).await;
    (request, answer)
}

fn state_of(ir: &InputRequiredResult) -> String {
    ir.request_state.clone().expect("a requestState")
}

/// The retry of `execute(args)` with the state `ir` sealed and the elicitation answered
/// `action`: its complete result.
async fn retry(
    agent: &Peer<RoleClient>,
    args: &Value,
    ir: &InputRequiredResult,
    action: &str,
) -> CallToolResult {
    complete(round(agent, "execute", args, Some(&state_of(ir)), Some(action)).await)
}

/// The URL the desk's elicitation in `ir` names.
fn elicited_url(ir: &InputRequiredResult) -> String {
    let shown = serde_json::to_value(ir).unwrap();
    shown["inputRequests"]["countersign_desk"]["params"]["url"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn tables(agent: &Peer<RoleClient>) -> Value {
    call(agent, "list_tables", json!({}))
        .await
        .structured_content
        .unwrap()["rows"]
        .clone()
}

fn create(name: &str) -> Value {
    json!({"sql": format!("CREATE TABLE {name} (id INTEGER PRIMARY KEY)")})
}

/// Approves `request` as the click does.
async fn click(desk: &Desk, request: &PendingRequest) {
    let typed = request.type_target().then(|| request.plan.target.clone());
    desk.engine
        .approve(request.id, typed.as_deref())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_client_retries_with_the_state_after_the_click_and_gets_the_real_result_once() {
    let desk = desk().await;
    let agent = modern(&desk, "modern-agent").await;
    let args = create("mrtr");
    let (request, ir) = first_round(&desk, agent.peer(), "execute", &args).await;
    assert_eq!(request.plan.tool, "execute");
    assert_eq!(
        request.call().unwrap().client_info["name"],
        json!("modern-agent")
    );

    // The elicitation names the request in the desk; no token anywhere.
    let shown = serde_json::to_value(&ir).unwrap();
    assert_eq!(shown["resultType"], json!("input_required"));
    let ask = &shown["inputRequests"]["countersign_desk"];
    assert_eq!(ask["method"], json!("elicitation/create"), "{shown}");
    assert_eq!(ask["params"]["mode"], json!("url"));
    assert_eq!(
        ask["params"]["url"],
        json!(format!("countersign://request/{}", request.id))
    );
    assert!(
        ask["params"]["message"]
            .as_str()
            .unwrap()
            .contains("Countersign desk")
    );
    let state = state_of(&ir);
    assert!(state.starts_with("csr1."), "{state}");
    assert!(
        !shown.to_string().contains("cs1."),
        "a token reached the agent: {shown}"
    );

    // Retrying before the click: still waiting, a fresh state (state only), nothing ran.
    let waiting =
        input_required(round(agent.peer(), "execute", &args, Some(&state), Some("accept")).await);
    assert!(waiting.input_requests.is_none());
    let state2 = state_of(&waiting);
    assert_ne!(state2, state);
    assert_eq!(tables(agent.peer()).await, json!([]));

    click(&desk, &request).await;
    let done = complete(round(agent.peer(), "execute", &args, Some(&state2), None).await);
    assert_ne!(done.is_error, Some(true), "{done:?}");
    let seen = serde_json::to_value(&done).unwrap().to_string();
    assert!(!seen.contains("cs1."), "a token reached the agent: {seen}");
    assert_eq!(tables(agent.peer()).await, json!([{"name": "mrtr"}]));

    // Each state works once; the last one's call is done.
    for used in [&state, &state2] {
        let again = complete(round(agent.peer(), "execute", &args, Some(used), None).await);
        assert_eq!(
            refusal(&again).as_deref(),
            Some("already_used"),
            "{again:?}"
        );
    }
    let history = desk
        .engine
        .history(&countersign_store::HistoryFilter::default())
        .await
        .unwrap();
    let kinds: Vec<String> = history
        .iter()
        .filter(|e| e.tool == "execute")
        .map(|e| serde_json::to_value(e.kind).unwrap().to_string())
        .collect();
    let joined = kinds.join(" ");
    for kind in ["issued", "accepted", "executed"] {
        assert!(joined.contains(kind), "no {kind} event in {kinds:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_reaches_the_retry_with_the_persons_note_and_nothing_runs() {
    let desk = desk().await;
    let agent = modern(&desk, "modern-agent").await;
    let args = create("denied");
    let (request, ir) = first_round(&desk, agent.peer(), "execute", &args).await;
    desk.engine
        .deny(request.id, Some("not on a Friday"))
        .await
        .unwrap();
    let r = retry(agent.peer(), &args, &ir, "accept").await;
    assert_eq!(refusal(&r).as_deref(), Some("denied"));
    assert!(text(&r).contains("not on a Friday"), "{r:?}");
    assert_eq!(tables(agent.peer()).await, json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declined_elicitation_withdraws_the_request() {
    let desk = desk().await;
    let agent = modern(&desk, "modern-agent").await;
    let args = create("declined");
    let (request, ir) = first_round(&desk, agent.peer(), "execute", &args).await;
    let mut changes = desk.engine.subscribe();
    let r = retry(agent.peer(), &args, &ir, "decline").await;
    assert_eq!(
        r.structured_content.as_ref().unwrap()["error"],
        json!("withdrawn")
    );
    assert_eq!(
        next_removal(&mut changes).await,
        (request.id, Removal::Withdrawn)
    );
    assert!(desk.engine.pending().is_empty());
    assert_eq!(
        desk.engine
            .approve(request.id, Some(&request.plan.target))
            .await,
        Err(countersign_engine::ApproveError::NotPending)
    );
}

/// Every hostile state on one connection, the request approved: each is refused, and the table
/// is still missing afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_altered_oversized_misplaced_and_mixed_states_are_refused_and_nothing_runs() {
    let desk = desk().await;
    let agent = modern(&desk, "modern-agent").await;
    let args = create("target");
    let (request, ir) = first_round(&desk, agent.peer(), "execute", &args).await;
    let state = state_of(&ir);
    click(&desk, &request).await;

    let (_, payload, tag) = {
        let mut parts = state.split('.');
        (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap(),
        )
    };
    let mut claims: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
    claims["round"] = json!(1000);
    let altered = format!(
        "csr1.{}.{tag}",
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap())
    );
    let mut confirm_too = args.clone();
    confirm_too["confirm"] = json!(true);
    confirm_too["confirmToken"] = json!("cs1.a.b");
    confirm_too["confirmTarget"] = json!("target");

    let cases: Vec<(&str, Value, String, &str)> = vec![
        ("garbage", args.clone(), "not a state".into(), "bad_token"),
        ("empty", args.clone(), String::new(), "bad_token"),
        (
            "oversized",
            args.clone(),
            format!("{state}{}", "A".repeat(5000)),
            "bad_token",
        ),
        ("altered", args.clone(), altered, "bad_token"),
        (
            "another tool",
            json!({"name": "x"}),
            state.clone(),
            "wrong_tool",
        ),
        (
            "other arguments",
            create("other"),
            state.clone(),
            "plan_changed",
        ),
        (
            "beside confirm fields",
            confirm_too,
            state.clone(),
            "bad_token",
        ),
    ];
    for (what, call_args, sent, code) in cases {
        let tool = if what == "another tool" {
            "create_backup"
        } else {
            "execute"
        };
        let r = complete(round(agent.peer(), tool, &call_args, Some(&sent), Some("accept")).await);
        assert_eq!(refusal(&r).as_deref(), Some(code), "{what}: {r:?}");
        assert_eq!(r.is_error, Some(true), "{what}");
        assert_eq!(
            tables(agent.peer()).await,
            json!([]),
            "{what} ran something"
        );
    }
    // The genuine state still works once, after all that.
    let done = complete(round(agent.peer(), "execute", &args, Some(&state), None).await);
    assert_ne!(done.is_error, Some(true), "{done:?}");
    assert_eq!(tables(agent.peer()).await, json!([{"name": "target"}]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_from_another_connection_is_refused_wrong_tenant() {
    let desk = desk().await;
    let first = modern(&desk, "first").await;
    let second = modern(&desk, "second").await;
    let args = create("theirs");
    let (request, ir) = first_round(&desk, first.peer(), "execute", &args).await;
    click(&desk, &request).await;
    // The second agent lists its tools, so that its connection knows execute.
    let _ = second.peer().list_all_tools().await.unwrap();
    let r = retry(second.peer(), &args, &ir, "accept").await;
    assert_eq!(refusal(&r).as_deref(), Some("wrong_tenant"), "{r:?}");
    assert_eq!(tables(second.peer()).await, json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_sealed_before_the_secret_was_rotated_is_refused() {
    let desk = desk().await;
    let agent = modern(&desk, "modern-agent").await;
    let args = create("rotated");
    let (request, ir) = first_round(&desk, agent.peer(), "execute", &args).await;
    click(&desk, &request).await;
    // Another key than the one every test engine signs with (countersign_tests::engine::key).
    desk.engine.set_key(Ok(SigningKey::new(&[9; 32]).unwrap()));
    let r = retry(agent.peer(), &args, &ir, "accept").await;
    assert_eq!(refusal(&r).as_deref(), Some("bad_token"), "{r:?}");
    assert_eq!(tables(agent.peer()).await, json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_client_gets_the_text_flow_and_its_request_state_is_refused() {
    let desk = desk().await;
    let modern_agent = modern(&desk, "modern-agent").await;
    let args = create("legacy");
    let (request, ir) = first_round(&desk, modern_agent.peer(), "execute", &args).await;
    click(&desk, &request).await;

    // A client on the initialize handshake (2025-11-25): the preflight's text flow.
    let old = agent(&desk).await;
    let other = create("other");
    let click_it = click_approve(&desk.engine);
    let preflight = call(old.peer(), "execute", other.clone()).await;
    click_it.await.unwrap();
    assert!(
        preflight.structured_content.as_ref().unwrap()["confirmToken"].is_string(),
        "{preflight:?}"
    );
    // Its requestState (another connection's, from a newer client) is refused for its revision.
    let mut p = params("execute", &args);
    p.request_state = Some(state_of(&ir));
    let r = old.peer().call_tool(p).await.unwrap();
    assert_eq!(refusal(&r).as_deref(), Some("bad_token"), "{r:?}");
    assert!(text(&r).contains("older revision"), "{r:?}");
    assert_eq!(tables(old.peer()).await, json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_client_without_url_elicitation_keeps_the_text_flow() {
    let desk = desk().await;
    let agent = modern_with(
        &desk,
        "form-only",
        json!({"elicitation": {"form": {}}}),
        "10",
    )
    .await;
    let args = create("text_flow");
    let click_it = click_approve(&desk.engine);
    let preflight = complete(round(agent.peer(), "execute", &args, None, None).await);
    click_it.await.unwrap();
    let done = call(agent.peer(), "execute", confirm_args(&args, &preflight)).await;
    assert_ne!(done.is_error, Some(true), "{done:?}");
    assert_eq!(tables(agent.peer()).await, json!([{"name": "text_flow"}]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecided_request_is_answered_input_required_a_bounded_number_of_times_then_pending() {
    let desk = desk().await;
    let agent = modern_with(&desk, "impatient", json!({"elicitation": {"url": {}}}), "0").await;
    let args = create("undecided");
    let (request, ir) = first_round(&desk, agent.peer(), "execute", &args).await;
    let mut state = state_of(&ir);
    let mut rounds = 1;
    let last = loop {
        match round(agent.peer(), "execute", &args, Some(&state), None).await {
            CallToolResponse::InputRequired(ir) => {
                assert!(ir.input_requests.is_none(), "the elicitation is asked once");
                state = state_of(&ir);
                rounds += 1;
                assert!(rounds <= 8, "more than 8 rounds");
            }
            other => break complete(other),
        }
    };
    assert_eq!(rounds, 8);
    assert_eq!(refusal(&last).as_deref(), Some("pending"), "{last:?}");
    // The request still waits for the person; a new call re-attaches to it.
    assert_eq!(desk.engine.pending()[0].id, request.id);
    let (again, _) = queued_by_first_round(agent.peer(), "execute", &args).await;
    assert_eq!(again, request.id);
    assert_eq!(tables(agent.peer()).await, json!([]));
}

/// A first round for a call whose request is already queued: its id, from the elicitation's URL.
async fn queued_by_first_round(
    agent: &Peer<RoleClient>,
    tool: &str,
    args: &Value,
) -> (u64, InputRequiredResult) {
    let ir = input_required(round(agent, tool, args, None, None).await);
    let id = countersign_wire::parse_request_url(&elicited_url(&ir)).unwrap();
    (id, ir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spent_states_are_kept_per_connection_and_a_full_list_refuses_rather_than_forgets() {
    use countersign_core::Nonce;
    use countersign_engine::MAX_SPENT_STATES;
    let desk = desk().await;
    let engine = &desk.engine;
    let nonce = |i: u64| {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&i.to_be_bytes());
        Nonce::from_bytes(bytes)
    };
    let later = u64::MAX;
    let [a, b, c] =
        ["a", "b", "c"].map(|server| engine.connect(ServerId::Command(server.to_owned())));
    let (a, b, c) = (&a, &b, &c);
    assert!(!engine.spend_request_state(&countersign_core::Tenant::connection(0), nonce(0), later));
    assert!(engine.spend_request_state(a, nonce(0), later));
    assert!(engine.request_state_used(a, &nonce(0)));
    assert!(!engine.request_state_used(b, &nonce(0)));
    assert!(!engine.spend_request_state(a, nonce(0), later));
    for i in 1..MAX_SPENT_STATES as u64 {
        assert!(engine.spend_request_state(a, nonce(i), later));
    }
    // Full of unexpired states: a new one is refused, none is forgotten.
    assert!(!engine.spend_request_state(a, nonce(u64::MAX), later));
    assert!(engine.request_state_used(a, &nonce(1)));
    // Another connection is not held up by it.
    assert!(engine.spend_request_state(b, nonce(u64::MAX), later));
    // Expired ones make room (a forgotten state no longer opens anyway).
    for i in 0..MAX_SPENT_STATES as u64 {
        assert!(engine.spend_request_state(c, nonce(i), 1));
    }
    assert!(engine.spend_request_state(c, nonce(u64::MAX), later));
    assert!(!engine.request_state_used(c, &nonce(1)));
    // A connection's list goes with it, and it uses up nothing after.
    engine.disconnect(a).await;
    assert!(!engine.request_state_used(a, &nonce(1)));
    assert!(!engine.spend_request_state(a, nonce(7), later));
}

/// The next focus the engine publishes within `within`, skipping other changes.
async fn next_focus(
    changes: &mut tokio::sync::broadcast::Receiver<countersign_engine::QueueChange>,
    within: std::time::Duration,
) -> Option<Option<u64>> {
    tokio::time::timeout(within, async {
        loop {
            match changes.recv().await {
                Ok(countersign_engine::QueueChange::Focus { request }) => return request,
                Ok(_) => {}
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await
    .ok()
}

/// `countersign open URL` on the desk's socket: exit code and stderr.
async fn open(desk: &Desk, url: &str) -> (Option<i32>, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_countersign"))
        .arg("open")
        .arg(url)
        .env("COUNTERSIGN_SOCKET", &desk.socket)
        .output()
        .await
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The URL an elicitation names reaches the desk as a focus on that request and nothing else: the
/// request still waits, nothing is approved. Hostile forms of it exit 2 and send nothing, and a
/// focus hello whose request is not a number is malformed, not a focus.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_the_elicited_url_focuses_its_request_and_decides_nothing() {
    let desk = desk().await;
    let agent = modern(&desk, "opener").await;
    let (request, ir) = first_round(&desk, agent.peer(), "execute", &create("opened")).await;
    let url = elicited_url(&ir);
    assert_eq!(countersign_wire::parse_request_url(&url), Ok(request.id));
    let mut changes = desk.engine.subscribe();

    for bad in [
        format!("{url}?approve=1"),
        format!("{url}/approve"),
        format!("{url}#approve"),
        url.to_uppercase(),
        format!("{url} "),
        url.replace("request", "approve"),
        url.replace("countersign://", "countersign://user@"),
        url.replace(
            &request.id.to_string(),
            &format!("%{:02X}", b'0' + (request.id % 10) as u8),
        ),
        "countersign://request/99999999999999999999999".to_owned(),
        format!("countersign://request/{}", "\u{0661}"),
    ] {
        let (code, stderr) = open(&desk, &bad).await;
        assert_eq!(code, Some(2), "{bad:?}: {stderr}");
        assert!(stderr.contains("not a request URL"), "{stderr}");
    }
    assert_eq!(
        next_focus(&mut changes, std::time::Duration::from_millis(300)).await,
        None,
        "a refused URL reached the desk"
    );

    // A hello whose request is not a u64: malformed, dropped.
    let mut stream = tokio::net::UnixStream::connect(&desk.socket).await.unwrap();
    use tokio::io::AsyncWriteExt;
    let body = br#"H{"type":"focus","version":2,"request":"1"}"#;
    stream
        .write_all(&(body.len() as u32).to_be_bytes())
        .await
        .unwrap();
    stream.write_all(body).await.unwrap();
    assert_eq!(
        next_focus(&mut changes, std::time::Duration::from_millis(300)).await,
        None
    );

    let (code, stderr) = open(&desk, &url).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        next_focus(&mut changes, std::time::Duration::from_secs(5)).await,
        Some(Some(request.id))
    );
    assert!(desk.engine.pending().iter().any(|r| r.id == request.id));
    assert_eq!(tables(agent.peer()).await, json!([]));
}
