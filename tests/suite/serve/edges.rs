//! The HTTP edges: Host, Origin, methods, media types, size, protocol revision, hostile
//! JSON-RPC and requests posing as notifications, refused before anything reaches the engine or
//! the upstream.

use super::*;

#[test]
fn http_edges_are_refused_before_anything_reaches_the_engine_or_the_upstream() {
    let server = Server::start(
        &[
            "--read-only",
            "--behind-tls-proxy",
            "--unauthenticated",
            "--allowed-origin",
            "https://app.example.com",
        ],
        &[],
    );
    let port = server.port;
    let ping = r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#;
    assert_eq!(post(port, &[], ping).0, 200);
    let status = |extra: &[(&str, &str)]| post(port, extra, ping).0;
    assert_eq!(status(&[("Host", "evil.example")]), 403, "DNS rebinding");
    assert_eq!(status(&[("Host", "localhost:1234")]), 200);
    assert_eq!(status(&[("Origin", "https://evil.example")]), 403);
    assert_eq!(status(&[("Origin", "null")]), 403);
    assert_eq!(status(&[("Origin", "https://app.example.com")]), 200);
    assert_eq!(status(&[("MCP-Protocol-Version", "1999-01-01")]), 400);
    // Methods and media types.
    let raw = |method: &str, headers: &[(&str, &str)], body: &[u8]| {
        exchange(
            TcpStream::connect(("127.0.0.1", port)).unwrap(),
            method,
            headers,
            body,
        )
    };
    let (code, head, _) = raw("GET", &[("Accept", "text/event-stream")], b"");
    assert_eq!(code, 405);
    assert!(head.contains("allow: post"), "{head}");
    assert_eq!(raw("DELETE", &[], b"").0, 405);
    assert_eq!(
        raw(
            "POST",
            &[
                ("Content-Type", "application/json"),
                ("Accept", "text/event-stream")
            ],
            ping.as_bytes()
        )
        .0,
        406
    );
    assert_eq!(
        raw(
            "POST",
            &[
                ("Content-Type", "text/plain"),
                ("Accept", "application/json")
            ],
            ping.as_bytes()
        )
        .0,
        415
    );
    let huge = vec![b' '; 4 * 1024 * 1024 + 1];
    assert_eq!(raw("POST", &JSON, &huge).0, 413);
    // Hostile JSON-RPC: answered by the router, never dispatched.
    let error = |body: &str| post(port, &[], body).2["error"]["code"].as_i64();
    assert_eq!(
        error(
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/call","params":{"name":"query","arguments":{"sql":"SELECT 1"}}}"#
        ),
        Some(-32600)
    );
    assert_eq!(
        error(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#),
        Some(-32600)
    );
    assert_eq!(
        error(r#"{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage","params":{}}"#),
        Some(-32601)
    );
    assert_eq!(
        error(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"query","name":"execute"}}"#
        ),
        Some(-32600)
    );
    // Two Content-Types, two revisions, routing headers that say something else than the
    // message, a request target naming another host.
    assert_eq!(
        raw(
            "POST",
            &[
                ("Content-Type", "application/json"),
                ("Content-Type", "text/plain"),
                ("Accept", "application/json")
            ],
            ping.as_bytes()
        )
        .0,
        415
    );
    assert_eq!(
        status(&[
            ("MCP-Protocol-Version", "2025-06-18"),
            ("MCP-Protocol-Version", "1999-01-01")
        ]),
        400
    );
    let call = r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"query","arguments":{"sql":"SELECT 1"}}}"#;
    assert_eq!(post(port, &[("Mcp-Method", "ping")], call).0, 400);
    assert_eq!(post(port, &[("Mcp-Name", "execute")], call).0, 400);
    assert_eq!(
        post(
            port,
            &[("Mcp-Method", "tools/call"), ("Mcp-Name", "query")],
            call
        )
        .0,
        200
    );
    let absolute = {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            s,
            "POST http://evil.example/mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{ping}",
            ping.len()
        )
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    assert!(absolute.starts_with("HTTP/1.1 403"), "{absolute}");
    // What needs a session a stateless server does not keep: refused, not sent upstream.
    assert_eq!(
        error(r#"{"jsonrpc":"2.0","id":9,"method":"logging/setLevel","params":{"level":"debug"}}"#),
        Some(-32601)
    );
    assert_eq!(
        error(
            r#"{"jsonrpc":"2.0","id":10,"method":"resources/subscribe","params":{"uri":"file:///x"}}"#
        ),
        Some(-32601)
    );
    // A client that never finishes its headers is cut (not held open forever).
    let mut slow = TcpStream::connect(("127.0.0.1", port)).unwrap();
    slow.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let began = Instant::now();
    let mut rest = Vec::new();
    let _ = slow.read_to_end(&mut rest);
    assert!(
        began.elapsed() < Duration::from_secs(25),
        "a half-sent request held its connection for {:?}",
        began.elapsed()
    );
    // A notification is accepted and goes nowhere.
    assert_eq!(
        post(
            port,
            &[],
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#
        )
        .0,
        202
    );
    let log = server.stop();
    assert!(!log.contains("ERROR"), "{log}");
}

#[test]
fn a_call_posing_as_a_notification_or_a_response_never_reaches_the_upstream() {
    let python = which("python3");
    let slow = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/slow_server.py");
    let dir = tempfile::tempdir().unwrap();
    let log_file = dir.path().join("ran.jsonl");
    let server = Server::start_before(
        &["--read-only", "--behind-tls-proxy", "--unauthenticated"],
        &[],
        Some(&[&python, slow.to_str().unwrap(), log_file.to_str().unwrap()]),
    );
    let port = server.port;
    // A tools/call without an id (a notification), and one shaped as a response: refused (400,
    // a JSON-RPC error without an id), never accepted, and sent nowhere.
    for disguised in [
        r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"sleep","arguments":{"seconds":0}}}"#,
        r#"{"jsonrpc":"2.0","id":5,"result":{"method":"tools/call","params":{"name":"sleep"}}}"#,
    ] {
        let (status, _, body) = post(port, &[], disguised);
        assert_eq!(status, 400, "{disguised}: {body}");
        assert_eq!(body["error"]["code"], -32600, "{disguised}: {body}");
    }
    // A real call after them, answered: the upstream has seen every message sent before it.
    let (status, _, answer) = post(
        port,
        &[],
        r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"pid","arguments":{}}}"#,
    );
    assert_eq!(status, 200, "{answer}");
    assert!(answer.get("result").is_some(), "{answer}");
    let log = server.stop();
    assert!(log.contains("pid started"), "the real call ran: {log}");
    assert!(
        !log.contains("sleep started"),
        "a disguised call ran: {log}"
    );
}

/// Issue 29, item 3: the streamable HTTP transport keeps `202 Accepted` for input the server
/// accepts. A request's method sent without an id (which its sender waits on, and which can never
/// be answered), a known notification in the wrong shape and a response to nothing are `400`
/// with a JSON-RPC error that has no id; genuine notifications are still `202`.
#[test]
fn a_request_sent_as_a_notification_is_refused_and_genuine_notifications_are_accepted() {
    let server = Server::start(
        &["--read-only", "--behind-tls-proxy", "--unauthenticated"],
        &[],
    );
    let port = server.port;
    let refused = [
        r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"query","arguments":{"sql":"SELECT 1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"tools/list"}"#,
        r#"{"jsonrpc":"2.0","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"ping"}"#,
        r#"{"jsonrpc":"2.0","method":"server/discover"}"#,
        r#"{"jsonrpc":"2.0","method":"resources/list"}"#,
        r#"{"jsonrpc":"2.0","method":"resources/read","params":{"uri":"file:///etc/passwd"}}"#,
        r#"{"jsonrpc":"2.0","method":"resources/templates/list"}"#,
        r#"{"jsonrpc":"2.0","method":"resources/subscribe","params":{"uri":"file:///x"}}"#,
        r#"{"jsonrpc":"2.0","method":"prompts/list"}"#,
        r#"{"jsonrpc":"2.0","method":"prompts/get","params":{"name":"p"}}"#,
        r#"{"jsonrpc":"2.0","method":"completion/complete","params":{"ref":{"type":"ref/prompt","name":"p"},"argument":{"name":"a","value":"b"}}}"#,
        r#"{"jsonrpc":"2.0","method":"logging/setLevel","params":{"level":"debug"}}"#,
        // A method no revision has, without an id: still not a notification.
        r#"{"jsonrpc":"2.0","method":"tools/delete_everything"}"#,
        // A known notification whose params are not of its shape.
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":"now"}"#,
        // A response, to nothing: this server never asks the client anything.
        r#"{"jsonrpc":"2.0","id":5,"result":{}}"#,
        r#"{"jsonrpc":"2.0","id":6,"error":{"code":-32601,"message":"no"}}"#,
    ];
    for message in refused {
        let (status, head, body) = post(port, &[], message);
        assert_eq!(status, 400, "{message}: {body}");
        assert!(head.contains("application/json"), "{head}");
        assert_eq!(body["jsonrpc"], "2.0", "{message}: {body}");
        assert_eq!(body["error"]["code"], -32600, "{message}: {body}");
        assert!(body.get("id").is_none(), "no id to answer: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{body}"
        );
    }
    let (_, _, body) = post(port, &[], refused[0]);
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("`tools/call`") && m.contains("with an id")),
        "{body}"
    );
    let accepted = [
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"reason":"gave up"}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t","progress":1}}"#,
        // One this server does not know: a notification is never answered, and ignored.
        r#"{"jsonrpc":"2.0","method":"notifications/something_newer"}"#,
    ];
    for message in accepted {
        let (status, _, body) = post(port, &[], message);
        assert_eq!(status, 202, "{message}: {body}");
        assert_eq!(body, Value::Null, "no body: {body}");
    }
    // The same requests with their ids are answered as usual (the listing once the upstream is
    // up, so that stopping never cuts its start short).
    let (status, _, answer) = post(port, &[], r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#);
    assert_eq!((status, &answer["id"]), (200, &json!(9)), "{answer}");
    let (status, _, answer) = post(
        port,
        &[],
        r#"{"jsonrpc":"2.0","id":10,"method":"tools/list"}"#,
    );
    assert_eq!(status, 200, "{answer}");
    assert!(answer["result"]["tools"].is_array(), "{answer}");
    let log = server.stop();
    assert!(!log.contains("ERROR"), "{log}");
}
