//! `countersign mcp` end to end below the window: a real rmcp client spawns the real gateway
//! binary over stdio, the gateway serves the built-in tools on a real SQLite file, and the desk's
//! engine runs in this test process behind a real Unix socket. Approval happens the only way the
//! product allows: `Engine::approve` (which the window calls on a click), called here.

use crate::common;

use std::time::Duration;

use common::*;
use countersign_engine::QueueChange;
use serde_json::json;

async fn setup_table(desk: &Desk, agent: &Agent) {
    let confirm = approved(
        desk,
        agent,
        "execute",
        json!({"sql": "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"}),
    )
    .await;
    let r = call(agent, "execute", confirm).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
}

async fn count_rows(agent: &Agent) -> i64 {
    let r = call(
        agent,
        "query",
        json!({"sql": "SELECT count(*) AS n FROM t"}),
    )
    .await;
    r.structured_content.unwrap()["rows"][0]["n"]
        .as_i64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_are_listed_with_gated_ones_augmented_and_every_other_field_kept() {
    let desk = desk().await;
    let agent = agent(&desk).await;
    let tools = agent.peer().list_all_tools().await.unwrap();
    let by_name: std::collections::HashMap<_, _> =
        tools.iter().map(|t| (t.name.to_string(), t)).collect();
    assert_eq!(by_name.len(), 7);
    let query = by_name["query"];
    assert!(
        !query
            .input_schema
            .get("properties")
            .unwrap()
            .as_object()
            .unwrap()
            .contains_key("confirmToken")
    );
    let execute = by_name["execute"];
    let props = execute
        .input_schema
        .get("properties")
        .unwrap()
        .as_object()
        .unwrap();
    for name in ["sql", "confirm", "confirmTarget", "confirmToken"] {
        assert!(props.contains_key(name), "{name} missing");
    }
    assert!(
        execute
            .description
            .as_deref()
            .unwrap()
            .contains("Countersign")
    );
    assert_eq!(execute.title.as_deref(), Some("Execute SQL"));
    assert_eq!(
        execute.annotations.as_ref().unwrap().destructive_hint,
        Some(true)
    );
    let info = agent.peer().peer_info().unwrap();
    assert_eq!(
        info.server_info.as_ref().unwrap().name,
        "countersign-builtin"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_query_passes_through_without_the_desk_being_asked() {
    let desk = desk().await;
    let agent = agent(&desk).await;
    let r = call(&agent, "query", json!({"sql": "SELECT 1 AS one"})).await;
    assert_eq!(r.structured_content.unwrap()["rows"], json!([{"one": 1}]));
    assert!(desk.engine.pending().is_empty());
    let r = call(&agent, "query", json!({"sql": "SELEC nonsense"})).await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("syntax error"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_once_call_runs_once_and_its_replay_is_refused() {
    let desk = desk().await;
    let agent = agent(&desk).await;
    setup_table(&desk, &agent).await;
    let confirm = approved(
        &desk,
        &agent,
        "execute",
        json!({"sql": "INSERT INTO t (v) VALUES ('x')"}),
    )
    .await;
    let r = call(&agent, "execute", confirm.clone()).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(count_rows(&agent).await, 1);
    let again = call(&agent, "execute", confirm).await;
    assert_eq!(refusal(&again).as_deref(), Some("already_used"));
    assert!(text(&again).contains("may already be done"));
    assert_eq!(
        count_rows(&agent).await,
        1,
        "the upstream saw the insert once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflight_text_ends_with_how_to_confirm_and_the_token() {
    let desk = desk().await;
    let agent = agent(&desk).await;
    let click = click_approve(&desk.engine);
    let r = call(&agent, "create_backup", json!({"name": "nightly"})).await;
    click.await.unwrap();
    let body = text(&r);
    let token = r.structured_content.as_ref().unwrap()["confirmToken"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        body.contains("confirmTarget: \"nightly\", and confirmToken from this response."),
        "{body}"
    );
    assert!(
        body.ends_with(&format!(
            "confirmToken: {token} (expires in 10 minutes, works until it expires)"
        )),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_class_token_is_reused_within_its_life() {
    let desk = desk().await;
    let agent = agent(&desk).await;
    setup_table(&desk, &agent).await;
    let confirm = approved(&desk, &agent, "create_backup", json!({"name": "nightly"})).await;
    for _ in 0..3 {
        let r = call(&agent, "create_backup", confirm.clone()).await;
        assert_ne!(r.is_error, Some(true), "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_with_a_note_reaches_the_agent() {
    let desk = desk().await;
    let agent = agent(&desk).await;
    let engine = desk.engine.clone();
    let mut changes = engine.subscribe();
    let deny = tokio::spawn(async move {
        while let Ok(change) = changes.recv().await {
            if let QueueChange::Added { request } = change {
                engine
                    .deny(request.id, Some("use the staging database"))
                    .await
                    .unwrap();
                return;
            }
        }
    });
    let r = call(&agent, "execute", json!({"sql": "DROP TABLE t"})).await;
    deny.await.unwrap();
    assert_eq!(refusal(&r).as_deref(), Some("denied"));
    assert!(text(&r).contains("use the staging database"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecided_preflight_is_pending_and_calling_again_reattaches() {
    let desk = desk().await;
    let agent = agent_on(
        &desk.socket,
        &desk.dir.path().join("app.sqlite"),
        &["--wait", "1"],
    )
    .await;
    let args = json!({"sql": "CREATE TABLE p (x)"});
    let r = call(&agent, "execute", args.clone()).await;
    assert_eq!(refusal(&r).as_deref(), Some("pending"));
    let r = call(&agent, "execute", args.clone()).await;
    assert_eq!(refusal(&r).as_deref(), Some("pending"));
    let pending = desk.engine.pending();
    assert_eq!(pending.len(), 1, "one request, not two");
    let target = pending[0].plan.target.clone();
    desk.engine
        .approve(pending[0].id, Some(&target))
        .await
        .unwrap();
    let r = call(&agent, "execute", args).await;
    assert!(r.structured_content.unwrap()["confirmToken"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_arguments_are_refused_and_the_upstream_sees_nothing() {
    let desk = desk().await;
    let agent = agent(&desk).await;
    setup_table(&desk, &agent).await;
    let mut confirm = approved(
        &desk,
        &agent,
        "execute",
        json!({"sql": "INSERT INTO t (v) VALUES ('a')"}),
    )
    .await;
    confirm["sql"] = json!("INSERT INTO t (v) VALUES ('a'), ('b'), ('c')");
    let r = call(&agent, "execute", confirm).await;
    assert_eq!(refusal(&r).as_deref(), Some("plan_changed"));
    assert!(text(&r).contains("Do not retry"));
    assert_eq!(count_rows(&agent).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_from_another_gateway_connection_is_wrong_tenant() {
    let desk = desk().await;
    let first = agent(&desk).await;
    let second = agent(&desk).await;
    let confirm = approved(
        &desk,
        &first,
        "execute",
        json!({"sql": "CREATE TABLE w (x)"}),
    )
    .await;
    second.peer().list_all_tools().await.unwrap();
    let r = call(&second, "execute", confirm).await;
    assert_eq!(refusal(&r).as_deref(), Some("wrong_tenant"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_verification_refusal_reaches_the_agent() {
    let desk = desk().await;
    let agent = agent(&desk).await;
    // no_token
    let r = call(
        &agent,
        "execute",
        json!({"sql": "SELECT 1", "confirm": true, "confirmTarget": "execute"}),
    )
    .await;
    assert_eq!(refusal(&r).as_deref(), Some("no_token"));
    // bad_token
    let r = call(&agent, "execute", json!({"sql": "SELECT 1", "confirm": true, "confirmTarget": "execute", "confirmToken": "cs1.e30.AAAA"})).await;
    assert_eq!(refusal(&r).as_deref(), Some("bad_token"));
    // wrong_tool: a token for delete_backup presented to restore_backup, same arguments.
    let confirm = approved(&desk, &agent, "delete_backup", json!({"name": "old"})).await;
    let r = call(&agent, "restore_backup", confirm.clone()).await;
    assert_eq!(refusal(&r).as_deref(), Some("wrong_tool"));
    // wrong_target: confirmTarget naming something else.
    let mut other = confirm.clone();
    other["confirmTarget"] = json!("new");
    let r = call(&agent, "delete_backup", other).await;
    assert_eq!(refusal(&r).as_deref(), Some("wrong_target"));
    // wrong_target: the arguments name another target.
    let mut other = confirm.clone();
    other["name"] = json!("new");
    let r = call(&agent, "delete_backup", other).await;
    assert_eq!(refusal(&r).as_deref(), Some("wrong_target"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_token_is_refused() {
    let desk = desk_with(|c| c.token_ttl_ms = 1500).await;
    let agent = agent(&desk).await;
    let confirm = approved(
        &desk,
        &agent,
        "execute",
        json!({"sql": "CREATE TABLE e (x)"}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let r = call(&agent, "execute", confirm).await;
    assert_eq!(refusal(&r).as_deref(), Some("expired"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_held_by_another_writer_is_ledger_unreachable_and_nothing_runs() {
    let desk = desk_on(
        countersign_store::StoreOptions::default().with_busy_timeout(Duration::from_millis(200)),
        |_| {},
    )
    .await;
    let agent = agent(&desk).await;
    setup_table(&desk, &agent).await;
    let confirm = approved(
        &desk,
        &agent,
        "execute",
        json!({"sql": "INSERT INTO t (v) VALUES ('z')"}),
    )
    .await;
    // Another process-like writer holds the ledger's write lock past the busy timeout.
    let holder = rusqlite::Connection::open(desk.dir.path().join("desk.sqlite")).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let r = call(&agent, "execute", confirm.clone()).await;
    assert_eq!(refusal(&r).as_deref(), Some("ledger_unreachable"));
    assert!(text(&r).contains("Nothing was executed"));
    holder.execute_batch("ROLLBACK").unwrap();
    assert_eq!(count_rows(&agent).await, 0);
    // Failing closed spent nothing: the same token works once the ledger is back.
    let r = call(&agent, "execute", confirm).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(count_rows(&agent).await, 1);
}

/// Runs `countersign mcp EXTRA...` as an agent that sends `initialize` and closes stdin; its
/// exit code and stderr. The desk starts the upstream when the agent's first message arrives.
async fn gateway_alone(socket: &std::path::Path, extra: &[&str]) -> (i32, String) {
    use tokio::io::AsyncWriteExt;
    let mut cmd = gateway_command(socket, extra);
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "alone", "version": "1"}}});
    // The gateway may already have exited (no desk): a closed pipe is fine.
    let _ = stdin.write_all(format!("{initialize}\n").as_bytes()).await;
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("the gateway did not exit within 30 s")
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_desk_the_gateway_says_so_and_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nobody.sock");
    let db = dir.path().join("app.sqlite");
    let (code, stderr) = gateway_alone(&socket, &["--db", db.to_str().unwrap()]).await;
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("desk is not running"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_name_the_desk_does_not_know_is_refused_with_exit_4() {
    let desk = desk().await;
    let (code, stderr) = gateway_alone(&desk.socket, &["--server", "github"]).await;
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("no server named"), "{stderr}");
    assert!(stderr.contains("no_such_server"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_cannot_start_is_refused_and_its_stderr_reaches_the_agent_side() {
    let desk = desk().await;
    let (code, stderr) = gateway_alone(&desk.socket, &["--", "/nonexistent/server"]).await;
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("cannot start the upstream"), "{stderr}");
    let (code, stderr) = gateway_alone(
        &desk.socket,
        &[
            "--",
            "sh",
            "-c",
            "echo 'server: missing API key' >&2; exit 1",
        ],
    )
    .await;
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("server: missing API key"), "{stderr}");
    assert!(stderr.contains("upstream_failed"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_database_path_is_resolved_by_the_gateway_not_the_desk() {
    let desk = desk().await;
    let work = tempfile::tempdir().unwrap();
    let mut cmd = gateway_command(&desk.socket, &["--db", "rel.sqlite"]);
    cmd.current_dir(work.path());
    let agent = connect(cmd, plain_client()).await;
    let r = call(&agent, "list_tables", json!({})).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert!(work.path().join("rel.sqlite").exists());
}

/// The obedient test upstream, started through `sh` so that it can say who started it.
fn traced_upstream(dir: &std::path::Path) -> Vec<String> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/peers/obedient_server.py"
    );
    let log = dir.join("upstream.log");
    let trace = dir.join("trace");
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            "echo $$ $PPID \"$(pwd)\" \"$PASSED_THROUGH\" > '{}'; exec python3 '{script}' '{}'",
            trace.display(),
            log.display()
        ),
    ]
}

fn alive(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_desk_starts_the_upstream_with_the_agents_directory_and_environment_and_ends_it() {
    let desk = desk().await;
    let work = tempfile::tempdir().unwrap();
    let work_path = work.path().canonicalize().unwrap();
    let argv = traced_upstream(desk.dir.path());
    let mut args = vec!["--"];
    args.extend(argv.iter().map(String::as_str));
    let mut cmd = gateway_command(&desk.socket, &args);
    cmd.current_dir(&work_path)
        .env("PASSED_THROUGH", "from-the-client");
    let agent = connect(cmd, plain_client()).await;
    let tools = agent.peer().list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 2, "{tools:?}");
    let trace = std::fs::read_to_string(desk.dir.path().join("trace")).unwrap();
    let fields: Vec<&str> = trace.split_whitespace().collect();
    let (pid, parent): (i32, u32) = (fields[0].parse().unwrap(), fields[1].parse().unwrap());
    // The upstream is the desk's child (this test process runs the desk), never the gateway's.
    assert_eq!(parent, std::process::id(), "{trace}");
    assert_eq!(fields[2], work_path.display().to_string(), "{trace}");
    assert_eq!(fields[3], "from-the-client", "{trace}");
    assert!(alive(pid));
    // The agent goes away: the gateway exits, and the desk ends the upstream with the session.
    agent.cancel().await.unwrap();
    assert!(
        tokio::time::timeout(
            Duration::from_secs(10),
            countersign_tests::group::exited(pid as u32)
        )
        .await
        .is_ok(),
        "the upstream outlived its session"
    );
    assert!(desk.children().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_closed_ends_the_gateway_with_exit_0() {
    let desk = desk().await;
    let db = desk.dir.path().join("app.sqlite");
    let (code, stderr) = gateway_alone(&desk.socket, &["--db", db.to_str().unwrap()]).await;
    assert_eq!(code, 0, "{stderr}");
}

/// Regression: after a session, the desk kept its side of the connection open for the 5 s it
/// gives a writer to drain (the session, held by the connection's door, still held the writer's
/// sender), so a gateway whose agent closed stdin lingered 5 s, and so did any agent waiting for
/// its server to exit. It now ends with the session: well within the 5 s it used to wait out
/// (4 s leaves room for a loaded machine; the old path always took more than 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_session_a_gateway_whose_agent_closes_stdin_exits_without_waiting_out_the_desk() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let desk = desk().await;
    let db = desk.dir.path().join("app.sqlite");
    let mut cmd = gateway_command(&desk.socket, &["--db", db.to_str().unwrap()]);
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        // Ended with the test even when an assertion below fails first.
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "closer", "version": "1"}}});
    stdin
        .write_all(format!("{initialize}\n").as_bytes())
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(30), stdout.next_line())
        .await
        .expect("an answer to initialize")
        .unwrap()
        .expect("a line");
    assert!(answer.contains("\"result\""), "{answer}");
    let closed = std::time::Instant::now();
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the gateway did not exit within 30 s")
        .unwrap();
    let took = closed.elapsed();
    assert_eq!(status.code(), Some(0));
    assert!(
        took < Duration::from_secs(4),
        "the gateway took {took:?} to exit after its agent closed stdin"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_disconnect_withdraws_its_pending_requests() {
    let desk = desk().await;
    let agent = agent_on(
        &desk.socket,
        &desk.dir.path().join("app.sqlite"),
        &["--wait", "1"],
    )
    .await;
    let r = call(&agent, "execute", json!({"sql": "CREATE TABLE gone (x)"})).await;
    assert_eq!(refusal(&r).as_deref(), Some("pending"));
    assert_eq!(desk.engine.pending().len(), 1);
    let mut changes = desk.engine.subscribe();
    agent.cancel().await.unwrap();
    let removed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(QueueChange::Removed { reason, .. }) = changes.recv().await {
                return reason;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(removed, countersign_engine::Removal::Disconnected);
    assert!(desk.engine.pending().is_empty());
}

/// Speaks the socket protocol by hand: sends `frame` as a connection's first, and returns what
/// the desk answers (`None` when it closes the connection instead).
async fn raw_hello(
    socket: &std::path::Path,
    frame: countersign_wire::Frame,
) -> Option<countersign_wire::Frame> {
    let mut stream = tokio::net::UnixStream::connect(socket).await.unwrap();
    countersign_wire::write_frame(&mut stream, &frame)
        .await
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(10),
        countersign_wire::read_frame(&mut stream),
    )
    .await
    .expect("the desk neither answered nor closed within 10 s")
    .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hello_of_another_version_is_refused_and_a_connection_without_one_is_closed() {
    use countersign_wire::{Frame, Hello, Reach, RefusedCode, Welcome};
    let desk = desk().await;
    let old = Frame::Hello(Hello::Gateway {
        version: 1,
        reach: Reach::Builtin {
            db: desk.dir.path().join("a.sqlite").display().to_string(),
        },
        label: None,
        wait_ms: None,
        pid: 1,
        stdio: false,
    });
    match raw_hello(&desk.socket, old).await {
        Some(Frame::Welcome(Welcome::Refused { code, message })) => {
            assert_eq!(code, RefusedCode::VersionMismatch);
            assert!(message.contains("same release"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // An MCP message before any hello: closed, nothing answered, nothing started.
    let early = Frame::Mcp(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#.to_vec());
    assert_eq!(raw_hello(&desk.socket, early).await, None);
    // A relative database path would be resolved against the desk's directory: refused.
    let relative = Frame::Hello(Hello::Gateway {
        version: countersign_wire::PROTOCOL_VERSION,
        reach: Reach::Builtin {
            db: "app.sqlite".into(),
        },
        label: None,
        wait_ms: None,
        pid: 1,
        stdio: false,
    });
    match raw_hello(&desk.socket, relative).await {
        Some(Frame::Welcome(Welcome::Refused { code, .. })) => {
            assert_eq!(code, RefusedCode::BadHello)
        }
        other => panic!("{other:?}"),
    }
    assert!(desk.children().is_empty());
}

/// Slow input at the socket: a connection that says nothing, or sends only part of a hello, is
/// closed at the hello deadline and starts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_no_hello_in_time_is_closed_and_starts_nothing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let desk = desk().await;
    let path = desk.dir.path().join("run/slow.sock");
    let options = countersign_session::Options {
        hello_deadline: Duration::from_millis(300),
        ..countersign_session::Options::default()
    };
    let served = countersign_session::serve_with(desk.engine.clone(), path.clone(), options)
        .await
        .unwrap();
    for partial in [&b""[..], &[0, 0, 0, 200, b'H', b'{'][..]] {
        let mut stream = tokio::net::UnixStream::connect(&path).await.unwrap();
        stream.write_all(partial).await.unwrap();
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut byte))
            .await
            .expect("the desk kept a silent connection open past its hello deadline");
        assert_eq!(read.unwrap(), 0, "the desk answered instead of closing");
    }
    assert!(served.children().is_empty());
    assert!(desk.engine.pending().is_empty());
}

fn builtin_hello(dir: &std::path::Path) -> countersign_wire::Frame {
    countersign_wire::Frame::Hello(countersign_wire::Hello::Gateway {
        version: countersign_wire::PROTOCOL_VERSION,
        reach: countersign_wire::Reach::Builtin {
            db: dir.join("a.sqlite").display().to_string(),
        },
        label: None,
        wait_ms: None,
        pid: 1,
        stdio: false,
    })
}

/// A gateway that, after its welcome, starts a frame and never finishes it is closed at the frame
/// deadline: it cannot pin the memory of a frame it announced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_that_stops_short_is_closed_at_the_frame_deadline() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let desk = desk().await;
    let path = desk.dir.path().join("run/short.sock");
    let options = countersign_session::Options {
        frame_deadline: Duration::from_millis(300),
        ..countersign_session::Options::default()
    };
    let _served = countersign_session::serve_with(desk.engine.clone(), path.clone(), options)
        .await
        .unwrap();
    let mut stream = tokio::net::UnixStream::connect(&path).await.unwrap();
    countersign_wire::write_frame(&mut stream, &builtin_hello(desk.dir.path()))
        .await
        .unwrap();
    let welcome = countersign_wire::read_frame(&mut stream).await.unwrap();
    assert!(matches!(
        welcome,
        countersign_wire::Frame::Welcome(countersign_wire::Welcome::Accepted { .. })
    ));
    // 16 MiB announced, a few bytes sent, then nothing.
    let mut partial = (countersign_wire::MAX_FRAME as u32).to_be_bytes().to_vec();
    partial.extend_from_slice(b"M{\"jsonrpc\"");
    stream.write_all(&partial).await.unwrap();
    let started = std::time::Instant::now();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest))
        .await
        .expect("the desk kept a stalled frame open past its deadline")
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(250));
}

/// One account cannot take every thread: beyond the limit a connection is refused `busy` with a
/// next move, and a place given back is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_account_limit_are_refused_busy_until_one_closes() {
    use countersign_wire::{Frame, RefusedCode, Welcome};
    let desk = desk().await;
    let path = desk.dir.path().join("run/few.sock");
    let options = countersign_session::Options {
        max_connections: 3,
        ..countersign_session::Options::default()
    };
    let _served = countersign_session::serve_with(desk.engine.clone(), path.clone(), options)
        .await
        .unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut stream = tokio::net::UnixStream::connect(&path).await.unwrap();
        countersign_wire::write_frame(&mut stream, &builtin_hello(desk.dir.path()))
            .await
            .unwrap();
        let welcome = countersign_wire::read_frame(&mut stream).await.unwrap();
        assert!(matches!(welcome, Frame::Welcome(Welcome::Accepted { .. })));
        held.push(stream);
    }
    match raw_hello(&path, builtin_hello(desk.dir.path())).await {
        Some(Frame::Welcome(Welcome::Refused { code, message })) => {
            assert_eq!(code, RefusedCode::Busy);
            assert!(message.contains("Next:"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    drop(held.pop());
    // The session's thread gives its place back when it ends.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match raw_hello(&path, builtin_hello(desk.dir.path())).await {
            Some(Frame::Welcome(Welcome::Accepted { .. })) => break,
            _ if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => panic!("no place freed: {other:?}"),
        }
    }
}

/// A flood of preflights from one agent gets `busy` beyond the per-agent queue, through the
/// whole stack; the person's queue never holds more than the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_preflights_through_the_desk_is_refused_busy_beyond_the_cap() {
    let desk = desk().await;
    let agent = agent_on(
        &desk.socket,
        &desk.dir.path().join("app.sqlite"),
        &["--wait", "0"],
    )
    .await;
    let mut busy = 0;
    for n in 0..(countersign_engine::MAX_PENDING_PER_CONNECTION + 4) {
        let sql = format!("DELETE FROM t WHERE id = {n}");
        let r = call(&agent, "execute", json!({ "sql": sql })).await;
        let error = r.structured_content.as_ref().and_then(|s| s.get("error"));
        if error.and_then(|e| e.as_str()) == Some("busy") {
            assert!(text(&r).contains("Nothing was executed"), "{}", text(&r));
            busy += 1;
        } else {
            assert_eq!(refusal(&r).as_deref(), Some("pending"), "{r:?}");
        }
    }
    assert_eq!(busy, 4);
    assert_eq!(
        desk.engine.pending().len(),
        countersign_engine::MAX_PENDING_PER_CONNECTION
    );
    agent.cancel().await.unwrap();
}

/// One agent's open calls sent all at once (200 slow queries to the built-in tools, none waiting
/// for another's answer) hold the desk to a bounded number of threads for that connection: past
/// its blocking pool's cap they wait their turn instead of taking a thread each, and every one is
/// answered. The peak is sampled while they run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_open_calls_at_once_from_one_agent_take_a_bounded_number_of_the_desks_threads()
{
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let desk = desk().await;
    let path = desk.dir.path().join("run/many.sock");
    let _served = countersign_session::serve_with(
        desk.engine.clone(),
        path.clone(),
        countersign_session::Options::default(),
    )
    .await
    .unwrap();
    let db = desk.dir.path().join("app.sqlite");
    let agent = agent_on(&path, &db, &[]).await;
    // Its session and its built-in tools are up: what grows from here is the calls'.
    let r = call(&agent, "query", json!({"sql": "SELECT 1 AS one"})).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    let threads = || std::fs::read_dir("/proc/self/task").unwrap().count();
    let before = threads();
    let peak = Arc::new(AtomicUsize::new(before));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(threads(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000) \
                SELECT count(*) AS n FROM c";
    let calls: Vec<_> = (0..200)
        .map(|_| {
            let peer = agent.peer().clone();
            tokio::spawn(async move { call(&peer, "query", json!({ "sql": slow })).await })
        })
        .collect();
    for answered in calls {
        let r = answered.await.unwrap();
        assert_ne!(r.is_error, Some(true), "{r:?}");
    }
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    // The sampler's own thread is one of them.
    let grown = peak.load(Ordering::Relaxed).saturating_sub(before + 1);
    eprintln!("threads gained at the peak of 200 open calls at once: {grown}");
    assert!(
        grown <= 40,
        "the desk gained {grown} threads for one agent's 200 calls at once"
    );
    agent.cancel().await.unwrap();
}

/// A flood never holds up another agent (issue 29, item 9): 1,500 connections that never finish
/// their hello or their first frame (500 silent, 500 with half a hello, 500 with a hello and half
/// a message) and an agent that sends 2,000 preflights and never reads a byte of its answers, all
/// held open, and a fresh agent (its real gateway spawned, `initialize`, `tools/list`, an open
/// call) is answered while every one of them is still open: it waited for none of their
/// deadlines (set far beyond the test's own timeout here). Then the flood ends and the next
/// fresh agent is answered too. How long each took is printed; `flood_bench` measures the same
/// with the window, against the 1 s goal. The stalled connections hold no thread each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_agent_is_answered_while_a_flood_of_stalled_connections_and_an_agent_that_never_reads_hold_the_desk()
 {
    use countersign_wire::{Frame, Welcome};
    use tokio::io::AsyncWriteExt;
    let desk = desk().await;
    let path = desk.dir.path().join("run/flood.sock");
    let options = countersign_session::Options {
        hello_deadline: Duration::from_secs(600),
        frame_deadline: Duration::from_secs(600),
        ..countersign_session::Options::default()
    };
    let _served = countersign_session::serve_with(desk.engine.clone(), path.clone(), options)
        .await
        .unwrap();
    let db = desk.dir.path().join("app.sqlite");
    let threads = || std::fs::read_dir("/proc/self/task").unwrap().count();
    let threads_before = threads();

    let mut stalled = Vec::new();
    for n in 0..1_500 {
        let mut stream = tokio::net::UnixStream::connect(&path).await.unwrap();
        match n % 3 {
            0 => {}
            1 => stream.write_all(&[0, 0, 0, 200, b'H', b'{']).await.unwrap(),
            _ => {
                countersign_wire::write_frame(&mut stream, &builtin_hello(desk.dir.path()))
                    .await
                    .unwrap();
                let welcome = countersign_wire::read_frame(&mut stream).await.unwrap();
                assert!(matches!(welcome, Frame::Welcome(Welcome::Accepted { .. })));
                let mut half = 4_096u32.to_be_bytes().to_vec();
                half.extend_from_slice(b"M{\"jsonrpc\":\"2.0\"");
                stream.write_all(&half).await.unwrap();
            }
        }
        stalled.push(stream);
    }

    // The agent that never reads: its hello, MCP's handshake, then 2,000 preflights written as
    // fast as the desk takes them, while not one answer is read.
    let mut deaf = tokio::net::UnixStream::connect(&path).await.unwrap();
    countersign_wire::write_frame(&mut deaf, &builtin_hello(desk.dir.path()))
        .await
        .unwrap();
    let welcome = countersign_wire::read_frame(&mut deaf).await.unwrap();
    assert!(matches!(welcome, Frame::Welcome(Welcome::Accepted { .. })));
    let (_deaf_reader, mut deaf_writer) = deaf.into_split();
    let deaf_writes = tokio::spawn(async move {
        let mcp = |v: serde_json::Value| Frame::Mcp(serde_json::to_vec(&v).unwrap());
        let hello = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "deaf", "version": "1"}}});
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        for frame in [mcp(hello), mcp(initialized)] {
            countersign_wire::write_frame(&mut deaf_writer, &frame)
                .await
                .unwrap();
        }
        for n in 1..=2_000 {
            let call = json!({"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {
                "name": "execute", "arguments": {"sql": format!("DELETE FROM t WHERE id = {n}")}}});
            if countersign_wire::write_frame(&mut deaf_writer, &mcp(call))
                .await
                .is_err()
            {
                break;
            }
        }
        deaf_writer
    });
    // Its first preflight reaches the person's queue: the flood is in the desk, not in a buffer.
    let mut changes = desk.engine.subscribe();
    while desk.engine.pending().is_empty() {
        tokio::time::timeout(Duration::from_secs(30), changes.recv())
            .await
            .expect("the agent that never reads never reached the queue")
            .unwrap();
    }

    let fresh = |label: &'static str| {
        let db = db.clone();
        let path = path.clone();
        async move {
            let started = std::time::Instant::now();
            let agent = tokio::time::timeout(Duration::from_secs(60), async {
                let agent = agent_on(&path, &db, &[]).await;
                let tools = agent.peer().list_all_tools().await.unwrap();
                assert!(tools.iter().any(|t| t.name == "query"), "{tools:?}");
                let r = call(&agent, "query", json!({"sql": "SELECT 1 AS one"})).await;
                assert_ne!(r.is_error, Some(true), "{r:?}");
                agent
            })
            .await
            .unwrap_or_else(|_| panic!("a fresh agent {label} was not answered within 60 s"));
            eprintln!(
                "a fresh agent {label}: spawned, listed and answered in {:.0} ms",
                started.elapsed().as_secs_f64() * 1e3
            );
            agent.cancel().await.unwrap();
        }
    };
    fresh("during the flood").await;
    // A connection earns a thread with its first whole message: the 500 that said hello and
    // stalled mid-frame wait as tasks (a thread each cost about half a megabyte of the desk's
    // memory), so a thread each would be 500 or more. What grows besides is the deaf agent's
    // session, the fresh agent's, and the blocking pools': an agent has a few turns at the
    // records at once (`DESK_TURNS`), or its 2,000 calls would each wait there on a thread of the
    // blocking pool, ahead of everyone else, and a session's pool is capped (see the test of 200
    // open calls at once). How many threads the pools keep depends on how slow the machine is at
    // that moment: 8 to 14 gained with the machine otherwise idle, 185 once in a full parallel
    // `make test` before the sessions' pools were capped. So the bound sits between that and a
    // thread per stalled connection.
    let grown = threads().saturating_sub(threads_before);
    eprintln!("threads gained during the flood: {grown}");
    assert!(
        grown < 400,
        "the desk gained {grown} threads for 1,500 stalled connections and two agents"
    );

    // Every stalled connection is still open: the answer came while the flood held the desk,
    // not after some deadline cleared it.
    let mut byte = [0u8; 1];
    for (n, stream) in stalled.iter().enumerate() {
        match stream.try_read(&mut byte) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("stalled connection {n} was answered or closed: {other:?}"),
        }
    }
    // And the agent that never reads still has its preflights waiting for the person.
    assert!(!desk.engine.pending().is_empty());

    deaf_writes.abort();
    drop(stalled);
    fresh("after the flood").await;
}
