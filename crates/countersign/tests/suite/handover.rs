//! The agent's stdio handed from the gateway to the desk (Linux): the real `countersign mcp`
//! binary, spawned as agents spawn it (with pipes, as Python's and Rust's SDKs do, and with
//! sockets, as Node's does), and the desk's engine in this test process behind a real socket.
//! Once handed over, the agent's messages flow without the gateway (it can be stopped); the
//! gateway still ends the session when it goes; and a gateway that offers its stdio and then
//! sends anything else is closed without harm.
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

use crate::common;

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;
use countersign_wire::{Frame, Hello, Reach, Welcome};
use rmcp::ServiceExt;
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt};

fn signal(pid: u32, signal: libc::c_int) {
    // SAFETY: a signal to a child of this test.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

/// A plain agent on the built-in tools, and its gateway's process id.
async fn agent_and_pid(desk: &Desk, extra: &[&str]) -> (Agent, u32) {
    let db = desk.dir.path().join("app.sqlite");
    let mut args = vec!["--db", db.to_str().unwrap()];
    args.extend_from_slice(extra);
    let transport = TokioChildProcess::new(gateway_command(&desk.socket, &args)).unwrap();
    let pid = transport.id().unwrap();
    (plain_client().serve(transport).await.unwrap(), pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_stdio_handed_over_calls_and_approvals_flow_while_the_gateway_is_stopped() {
    let desk = desk().await;
    let (agent, pid) = agent_and_pid(&desk, &["--wait", "10"]).await;
    let r = call(&agent, "query", json!({"sql": "SELECT 1 AS one"})).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    signal(pid, libc::SIGSTOP);
    // Nothing passes through the stopped gateway: the desk reads the agent's stdin and writes
    // its stdout itself, and decides exactly as before.
    let flow = async {
        let r = call(&agent, "query", json!({"sql": "SELECT 2 AS two"})).await;
        assert_ne!(r.is_error, Some(true), "{r:?}");
        let r = call(
            &agent,
            "execute",
            json!({"sql": "CREATE TABLE t (x)", "confirm": true}),
        )
        .await;
        assert_eq!(refusal(&r).as_deref(), Some("no_token"), "{r:?}");
        let confirm = approved(
            &desk,
            &agent,
            "execute",
            json!({"sql": "CREATE TABLE t (x)"}),
        )
        .await;
        let r = call(&agent, "execute", confirm.clone()).await;
        assert_ne!(r.is_error, Some(true), "{r:?}");
        let r = call(&agent, "execute", confirm).await;
        assert_eq!(refusal(&r).as_deref(), Some("already_used"), "{r:?}");
    };
    let done = tokio::time::timeout(Duration::from_secs(30), flow).await;
    signal(pid, libc::SIGCONT);
    done.expect("calls did not flow while the gateway was stopped");
    agent.cancel().await.unwrap();
}

/// The test above can fail: with `--relay` every message passes through the gateway, so a stopped
/// gateway holds the call until it runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_relay_a_call_waits_for_a_stopped_gateway() {
    let desk = desk().await;
    let (agent, pid) = agent_and_pid(&desk, &["--relay"]).await;
    let r = call(&agent, "query", json!({"sql": "SELECT 1 AS one"})).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    signal(pid, libc::SIGSTOP);
    let peer = agent.peer().clone();
    let mut held =
        tokio::spawn(async move { call(&peer, "query", json!({"sql": "SELECT 2 AS two"})).await });
    let early = tokio::time::timeout(Duration::from_millis(500), &mut held).await;
    signal(pid, libc::SIGCONT);
    assert!(early.is_err(), "a relayed call passed a stopped gateway");
    let r = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .expect("the call did not complete once the gateway ran again")
        .unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    agent.cancel().await.unwrap();
}

/// The agent's side of a gateway whose stdin and stdout are sockets, one JSON line at a time.
struct SocketAgent {
    to: UnixStream,
    from: tokio::io::Lines<tokio::io::BufReader<tokio::net::UnixStream>>,
}

impl SocketAgent {
    fn send(&mut self, message: Value) {
        self.to
            .write_all(format!("{message}\n").as_bytes())
            .unwrap();
    }

    async fn answer(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(20), self.from.next_line())
            .await
            .expect("no answer within 20 s")
            .unwrap()
            .expect("the gateway's stdout closed");
        serde_json::from_str(&line).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_stdio_are_sockets_is_served_through_them_and_its_gateway_exits_0() {
    let desk = desk().await;
    let db = desk.dir.path().join("app.sqlite");
    let (to, gateway_in) = UnixStream::pair().unwrap();
    let (from, gateway_out) = UnixStream::pair().unwrap();
    let mut gateway = std::process::Command::new(env!("CARGO_BIN_EXE_countersign"))
        .args(["mcp", "--no-launch", "--socket"])
        .arg(&desk.socket)
        .arg("--db")
        .arg(&db)
        .stdin(OwnedFd::from(gateway_in))
        .stdout(OwnedFd::from(gateway_out))
        .spawn()
        .unwrap();
    from.set_nonblocking(true).unwrap();
    let from = tokio::net::UnixStream::from_std(from).unwrap();
    let mut agent = SocketAgent {
        to,
        from: tokio::io::BufReader::new(from).lines(),
    };
    agent.send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "socket-agent", "version": "1"}}}),
    );
    let init = agent.answer().await;
    assert_eq!(init["id"], 1, "{init}");
    assert!(init["result"]["serverInfo"].is_object(), "{init}");
    agent.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    signal(gateway.id(), libc::SIGSTOP);
    agent.send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "query", "arguments": {"sql": "SELECT 41 + 1 AS answer"}}}));
    let answer = tokio::time::timeout(Duration::from_secs(20), agent.answer()).await;
    signal(gateway.id(), libc::SIGCONT);
    let answer = answer.expect("no answer through the sockets while the gateway was stopped");
    assert_eq!(answer["id"], 2, "{answer}");
    assert!(answer.to_string().contains("42"), "{answer}");
    // Unknown methods are refused as before: the router judges every line.
    agent.send(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/frobnicate"}));
    let refused = agent.answer().await;
    assert_eq!(refused["id"], 3, "{refused}");
    assert!(refused["error"].is_object(), "{refused}");
    // The agent closes its stdin: the session ends and the gateway exits 0.
    agent.to.shutdown(std::net::Shutdown::Write).unwrap();
    let status = tokio::task::spawn_blocking(move || gateway.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateway_ends_the_session_though_the_desk_holds_the_agents_stdio() {
    let desk = desk().await;
    let (agent, pid) = agent_and_pid(&desk, &["--wait", "30"]).await;
    let mut changes = desk.engine.subscribe();
    let peer = agent.peer().clone();
    let waiting = tokio::spawn(async move {
        let args = json!({"sql": "DROP TABLE nothing"})
            .as_object()
            .cloned()
            .unwrap();
        peer.call_tool(rmcp::model::CallToolRequestParams::new("execute").with_arguments(args))
            .await
    });
    next_request(&mut changes).await;
    signal(pid, libc::SIGKILL);
    // The desk sees its gateway gone and withdraws the request (the agent, told its gateway
    // died, may say it cancels first, on the stdin the desk still reads); the agent's stdout
    // closes.
    let (_, removed) = next_removal(&mut changes).await;
    assert!(
        matches!(
            removed,
            countersign_engine::Removal::Disconnected | countersign_engine::Removal::Withdrawn
        ),
        "{removed:?}"
    );
    assert!(desk.engine.pending().is_empty());
    let ended = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the agent's call was not ended within 10 s of its gateway's death")
        .unwrap();
    assert!(ended.is_err(), "{ended:?}");
}

/// A connection that says hello offering its stdio, as a hand-written gateway: the welcome.
async fn offer(socket: &std::path::Path, dir: &std::path::Path) -> tokio::net::UnixStream {
    let mut stream = tokio::net::UnixStream::connect(socket).await.unwrap();
    let hello = Frame::Hello(Hello::Gateway {
        version: countersign_wire::PROTOCOL_VERSION,
        reach: Reach::Builtin {
            db: dir.join("a.sqlite").display().to_string(),
        },
        label: None,
        wait_ms: None,
        pid: std::process::id(),
        stdio: true,
    });
    countersign_wire::write_frame(&mut stream, &hello)
        .await
        .unwrap();
    match countersign_wire::read_frame(&mut stream).await.unwrap() {
        Frame::Welcome(Welcome::Accepted { stdio: true, .. }) => stream,
        other => panic!("the desk did not take the stdio offered: {other:?}"),
    }
}

/// Waits until the desk closes `stream` (a reset too: the desk closes on bytes it never read).
async fn closed(mut stream: tokio::net::UnixStream, what: &str) {
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest))
        .await
        .unwrap_or_else(|_| panic!("the desk kept a connection open that {what}"));
    match read {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("{what}: {e}"),
    }
    assert!(
        rest.is_empty(),
        "the desk answered one that {what}: {rest:?}"
    );
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let (read, write) = std::io::pipe().unwrap();
    (read.into(), write.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_offers_its_stdio_and_sends_anything_else_is_closed_and_the_desk_serves_on()
{
    use countersign_wire::stdio::{new_notes_file, send_descriptors};
    let desk = desk().await;
    let dir = desk.dir.path();
    let file = dir.join("plain.txt");
    std::fs::write(&file, "not a pipe").unwrap();
    let plain = std::fs::File::open(&file).unwrap();

    // A regular file as the agent's stdin.
    let stream = offer(&desk.socket, dir).await;
    let (_, out) = pipe();
    let notes = new_notes_file().unwrap();
    send_descriptors(
        stream.as_raw_fd(),
        &[plain.as_raw_fd(), out.as_raw_fd(), notes.as_raw_fd()],
    )
    .unwrap();
    closed(stream, "sent a file as stdin").await;

    // The write end of a pipe as stdin (it cannot be read).
    let stream = offer(&desk.socket, dir).await;
    let (_, write) = pipe();
    let (_, out) = pipe();
    send_descriptors(
        stream.as_raw_fd(),
        &[write.as_raw_fd(), out.as_raw_fd(), notes.as_raw_fd()],
    )
    .unwrap();
    closed(stream, "sent stdin the wrong way round").await;

    // Two descriptors instead of three.
    let stream = offer(&desk.socket, dir).await;
    let ((input, _), (_, out)) = (pipe(), pipe());
    send_descriptors(stream.as_raw_fd(), &[input.as_raw_fd(), out.as_raw_fd()]).unwrap();
    closed(stream, "sent two descriptors").await;

    // Notes that could be shrunk under the desk's mapping (a memory file that takes no seals).
    let stream = offer(&desk.socket, dir).await;
    // SAFETY: a static C string; the descriptor is new and owned below.
    let unsealable = unsafe { libc::memfd_create(c"unsealable".as_ptr(), libc::MFD_CLOEXEC) };
    // SAFETY: new and owned by nobody else.
    let unsealable = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(unsealable) };
    unsealable
        .set_len(countersign_wire::stdio::NOTES_SIZE)
        .unwrap();
    let ((input, _), (_, out)) = (pipe(), pipe());
    send_descriptors(
        stream.as_raw_fd(),
        &[input.as_raw_fd(), out.as_raw_fd(), unsealable.as_raw_fd()],
    )
    .unwrap();
    closed(stream, "sent notes that take no seal").await;

    // A frame where the descriptors should be.
    let mut stream = offer(&desk.socket, dir).await;
    let frame = Frame::Mcp(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec());
    countersign_wire::write_frame(&mut stream, &frame)
        .await
        .unwrap();
    closed(stream, "sent a frame instead of its stdio").await;

    // Nothing started, nothing waits, and a real agent is served as before.
    assert!(desk.children().is_empty());
    assert!(desk.engine.pending().is_empty());
    let agent = agent(&desk).await;
    let r = call(&agent, "query", json!({"sql": "SELECT 1 AS one"})).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    agent.cancel().await.unwrap();
}

/// The desk reads handed-over stdin with the bounds it reads frames with: a line that begins
/// and never ends closes the connection at the frame deadline; a gateway that offers and never
/// sends is closed at the hello deadline. Before that, a hand-written gateway's exchange works,
/// and the desk's notes keep the agent's opening for the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handed_over_input_is_bounded_as_frames_are() {
    use countersign_wire::stdio::{new_notes_file, read_back, send_descriptors};
    let desk = desk().await;
    let path = desk.dir.path().join("run/bounded.sock");
    let options = countersign_session::Options {
        frame_deadline: Duration::from_millis(300),
        hello_deadline: Duration::from_millis(300),
        ..countersign_session::Options::default()
    };
    let _served = countersign_session::serve_with(desk.engine.clone(), path.clone(), options)
        .await
        .unwrap();

    let stream = offer(&path, desk.dir.path()).await;
    let ((stdin, mut agent_in), (agent_out, stdout)) = (pipe(), pipe());
    let notes = new_notes_file().unwrap();
    send_descriptors(
        stream.as_raw_fd(),
        &[stdin.as_raw_fd(), stdout.as_raw_fd(), notes.as_raw_fd()],
    )
    .unwrap();
    let mut agent_in = std::fs::File::from(std::mem::replace(&mut agent_in, pipe().0));
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "by-hand", "version": "1"}}});
    agent_in
        .write_all(format!("{initialize}\n").as_bytes())
        .unwrap();
    let out = tokio::net::unix::pipe::Receiver::from_owned_fd(agent_out).unwrap();
    let mut lines = tokio::io::BufReader::new(out).lines();
    let answer = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("no answer to initialize")
        .unwrap()
        .unwrap();
    assert!(answer.contains("serverInfo"), "{answer}");
    // Noted before the desk took it (whether its answer is marked yet is a race with this read).
    let back = read_back(&notes).unwrap();
    assert_eq!(back.opening, Some(initialize.to_string().into_bytes()));
    // The gateway makes its stdin and stdout blocking again, as it may: the desk reads and
    // writes through descriptions of its own, so it never waits inside a read (were it to share
    // the flag, the half line below would hold its thread in read(2), past every deadline).
    for fd in [stdin.as_raw_fd(), stdout.as_raw_fd()] {
        // SAFETY: fcntl on descriptors this test owns.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    drop((stdin, stdout));

    // Half a line, then nothing: closed at the frame deadline, stdout too.
    agent_in.write_all(br#"{"jsonrpc":"2.0","id":1,"#).unwrap();
    let started = std::time::Instant::now();
    closed(stream, "began a line and never ended it").await;
    assert!(started.elapsed() >= Duration::from_millis(250));
    let end = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("the agent's stdout stayed open after the session ended")
        .unwrap();
    assert_eq!(end, None);
    // What the desk read of the half line and never took is the gateway's to read again.
    assert_eq!(
        read_back(&notes).unwrap().unread,
        br#"{"jsonrpc":"2.0","id":1,"#
    );

    // An offer and no descriptors: closed at the hello deadline.
    let stream = offer(&path, desk.dir.path()).await;
    closed(stream, "offered its stdio and never sent it").await;
}
