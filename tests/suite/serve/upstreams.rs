//! What is served: read-only serving, real peers (the Python SDK, server-everything), a servers
//! file with secrets from the replica, the policy file's classes, one resource per server, and a
//! call in flight at a stop.
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_offers_only_open_tools_and_runs_them() {
    let marker = "ignored-secret-that-must-not-linger-in-environ";
    let server = Server::start(
        &["--read-only", "--behind-tls-proxy", "--unauthenticated"],
        &[("CONFIRM_SECRET", marker)],
    );
    // Its environment block no longer holds the secret (what an upstream of the same account
    // could read in /proc).
    let environ = std::fs::read(format!("/proc/{}/environ", server.child.id())).unwrap_or_default();
    assert!(
        !String::from_utf8_lossy(&environ).contains(marker),
        "the secret stayed in the environment block"
    );
    let agent = agent(&server.url()).await;
    let mut names: Vec<String> = agent
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["describe_table", "list_tables", "query"]);
    let query = call(&agent, "query", json!({"sql": "SELECT body FROM notes"})).await;
    assert!(text_of(&query).contains("hello"), "{query:?}");
    let execute = call(&agent, "execute", json!({"sql": "DELETE FROM notes"})).await;
    assert_eq!(execute.is_error, Some(true));
    assert!(text_of(&execute).contains("read-only"), "{execute:?}");
    let after = call(
        &agent,
        "query",
        json!({"sql": "SELECT count(*) AS n FROM notes"}),
    )
    .await;
    assert!(
        text_of(&after).contains("\"n\":1"),
        "nothing was deleted: {after:?}"
    );
    agent.cancel().await.unwrap();
    // Stateless: no session is ever handed out.
    let (status, head, _) = post(
        server.port,
        &[],
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#,
    );
    assert_eq!(status, 200);
    assert!(!head.contains("mcp-session-id"), "{head}");
}

#[test]
fn real_peers_the_python_sdk_as_agent_and_server_everything_as_upstream() {
    let python = countersign_tests::peers::python();
    let everything = countersign_tests::peers::npm_server(
        countersign_tests::peers::SERVER_EVERYTHING,
        "mcp-server-everything",
    );
    // The official Python SDK, with an agent key, in both of its modes.
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("records");
    let (_, key, _) = agent_command(&data, &["add", "python-sdk"]);
    let server = Server::start(
        &[
            "--read-only",
            "--behind-tls-proxy",
            "--agent-keys",
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[],
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/http_agent.py");
    for mode in ["legacy", "auto"] {
        let out = Command::new(&python)
            .args([script.to_str().unwrap(), mode, &server.url(), key.trim()])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{mode}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let steps: Vec<Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let step = |name: &str| {
            steps
                .iter()
                .find(|s| s["step"] == name)
                .unwrap_or_else(|| panic!("{mode}: no {name} in {stdout}"))
                .clone()
        };
        assert_eq!(
            step("tools")["names"],
            json!(["describe_table", "list_tables", "query"]),
            "{mode}"
        );
        assert!(
            step("query")["result"].to_string().contains("hello"),
            "{mode}"
        );
        let execute = step("execute")["result"].clone();
        assert_eq!(execute["isError"], json!(true), "{mode}: {execute}");
        assert_eq!(execute["structuredContent"]["error"], "withheld", "{mode}");
    }
    drop(server);

    // The reference server `server-everything` as the upstream: its read-only tools pass
    // through; what it asks of an agent (roots) is refused at once, not waited on.
    let server = Server::start_before(
        &["--read-only", "--behind-tls-proxy", "--unauthenticated"],
        &[],
        Some(&[everything.to_str().unwrap(), "stdio"]),
    );
    let (status, _, listed) = post(
        server.port,
        &[],
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
    );
    assert_eq!(status, 200, "{listed}");
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"echo"), "{names:?}");
    let (_, _, echoed) = post(
        server.port,
        &[],
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"message":"through the server"}}}"#,
    );
    assert!(
        echoed["result"]
            .to_string()
            .contains("Echo: through the server"),
        "{echoed}"
    );
    let began = Instant::now();
    let (_, _, roots) = post(
        server.port,
        &[],
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"get-roots-list","arguments":{}}}"#,
    );
    assert!(
        roots.get("result").is_some() || roots.get("error").is_some(),
        "{roots}"
    );
    assert!(
        began.elapsed() < Duration::from_secs(20),
        "a request for the agent's roots was waited on for {:?}",
        began.elapsed()
    );
}

/// What a caller's listing decided is kept across its requests, but never past the upstream's
/// listing it came from (a second): an upstream that changes a tool's definition without saying
/// so has the tool's calls held back within that second, not run under the old decision.
#[test]
fn a_tool_the_upstream_changes_without_saying_is_held_back_within_a_second() {
    let python = which("python3");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/shifting_server.py");
    let server = Server::start_before(
        &["--read-only", "--behind-tls-proxy", "--unauthenticated"],
        &[],
        Some(&[python.as_str(), script.to_str().unwrap()]),
    );
    let call = |id: u32, tool: &str, arguments: Value| {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                          "params": {"name": tool, "arguments": arguments}});
        let (status, _, answer) = post(server.port, &[], &body.to_string());
        assert_eq!(status, 200, "{answer}");
        answer["result"].clone()
    };
    for id in 1..=5 {
        let looked = call(id, "lookup", json!({"word": "pin"}));
        assert_ne!(looked["isError"], json!(true), "{looked}");
    }
    let shifted = call(6, "shift", json!({"silently": true}));
    assert_ne!(shifted["isError"], json!(true), "{shifted}");
    let changed = Instant::now();
    let mut id = 7;
    let refused = loop {
        let looked = call(id, "lookup", json!({"word": "pin"}));
        if looked["isError"] == json!(true) {
            break looked;
        }
        assert!(
            changed.elapsed() < Duration::from_secs(3),
            "the changed tool still ran {:?} after its change: {looked}",
            changed.elapsed()
        );
        id += 1;
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        refused["structuredContent"]["refusal"], "tool_changed",
        "{refused}"
    );
}

#[test]
fn a_servers_file_serves_each_upstream_at_its_name_with_secrets_from_the_replica() {
    let python = which("python3");
    let peers_src = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("servers.json");
    std::fs::write(
        &file,
        json!({"servers": {
            "envs": {"command": [python, peers_src.join("env_server.py")],
                     "env": {"API_TOKEN": {"secret": true}, "MODE": "team"}},
            "echo": {"command": [python, peers_src.join("echo_server.py")]},
        }})
        .to_string(),
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let secret = "team-upstream-credential-7f3a";
    // A secret that is nowhere: refused before anything is bound, naming where it would be.
    let out = serve(
        &bin("countersign-serve"),
        &[
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--read-only",
            "--behind-tls-proxy",
            "--unauthenticated",
            "--servers",
            file,
        ],
        &[],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("COUNTERSIGN_SECRET_ENVS_API_TOKEN"),
        "{stderr}"
    );

    let mut args = vec!["--read-only", "--behind-tls-proxy", "--unauthenticated"];
    args.extend(["--servers", file]);
    let server = Server::start_before(
        &args,
        &[
            ("COUNTERSIGN_SECRET_ENVS_API_TOKEN", secret),
            ("CONFIRM_SECRET", "x".repeat(40).as_str()),
        ],
        Some(&[]),
    );
    let port = server.port;
    let at = |path: &str, body: &str| {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (status, _, body) = exchange_on(stream, "POST", path, &JSON, body.as_bytes());
        (
            status,
            serde_json::from_str::<Value>(&body).unwrap_or(Value::Null),
        )
    };
    let env = |name: &str| {
        let (status, body) = at(
            "/mcp/envs",
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {"name": "env", "arguments": {"name": name}}})
            .to_string(),
        );
        assert_eq!(status, 200, "{body}");
        body["result"]["structuredContent"]["value"].clone()
    };
    // The upstream has exactly its entry's environment: the secret from the replica, the plain
    // value from the file, and nothing of the server's own.
    assert_eq!(env("API_TOKEN"), json!(secret));
    assert_eq!(env("MODE"), json!("team"));
    assert_eq!(env("CONFIRM_SECRET"), Value::Null);
    assert_eq!(env("COUNTERSIGN_SECRET_ENVS_API_TOKEN"), Value::Null);
    assert_eq!(env("HOME"), Value::Null);
    // The other server, at its own name; its gated tool withheld on a read-only server.
    let (status, listed) = at(
        "/mcp/echo",
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    );
    assert_eq!(status, 200);
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["echo"]);
    assert_eq!(
        at("/mcp/nope", r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#).0,
        404
    );
    assert_eq!(
        at("/mcp", r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#).0,
        404
    );
    // Gone from the server's own environment block.
    let environ = std::fs::read(format!("/proc/{}/environ", server.child.id())).unwrap_or_default();
    assert!(!String::from_utf8_lossy(&environ).contains(secret));
    let log = server.stop();
    assert!(log.contains("listening on"), "{log}");
}

#[test]
fn the_policy_file_classes_a_servers_tools_and_a_bad_one_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let servers = echo_servers_file(dir.path());
    let policy = dir.path().join("policy.toml");
    // The read-only `echo` classed as works-once by the team: a read-only server withholds it.
    std::fs::write(
        &policy,
        "[servers.\"server:echo\".tools.echo]\nclass = \"once\"\n",
    )
    .unwrap();
    let args = [
        "--read-only",
        "--behind-tls-proxy",
        "--unauthenticated",
        "--servers",
        servers.to_str().unwrap(),
        "--policy",
        policy.to_str().unwrap(),
    ];
    let server = Server::start_before(&args, &[], Some(&[]));
    let stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    let (status, _, body) = exchange_on(
        stream,
        "POST",
        "/mcp/echo",
        &JSON,
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
    );
    assert_eq!(status, 200, "{body}");
    let listed: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(listed["result"]["tools"], json!([]), "{listed}");
    drop(server);
    std::fs::write(
        &policy,
        "[servers.echo.tools.echo]\nclass = \"sometimes\"\n",
    )
    .unwrap();
    let stderr = refused_without_binding(&bin("countersign-serve"), &args, &[]);
    assert!(stderr.contains("--policy"), "{stderr}");
}

#[test]
fn a_call_in_flight_when_the_server_is_told_to_stop_is_answered_before_it_stops() {
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
    let call = std::thread::spawn(move || {
        post(
            port,
            &[],
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sleep","arguments":{"seconds":2}}}"#,
        )
    });
    // The upstream says when the call has started (its stderr, in the server's log).
    server.until_logged("sleep started", 1, Duration::from_secs(30));
    // SAFETY: kill takes plain integers; the pid is our own child, not yet reaped.
    unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    let (status, _, answer) = call.join().unwrap();
    assert_eq!(status, 200, "{answer}");
    assert!(answer["result"].to_string().contains("slept"), "{answer}");
    // Then it stops, on its own.
    assert!(
        countersign_tests::group::exits_within(server.child.id(), Duration::from_secs(30)),
        "it did not stop"
    );
    assert!(server.log().contains("stopping"), "{}", server.log());
}

#[test]
fn each_server_of_the_file_is_its_own_resource_with_its_own_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let servers = echo_servers_file(dir.path());
    let issuer = Issuer::start();
    let mut args = oauth_args(&["--jwks-url", &issuer.jwks_url]);
    args.extend(["--servers".to_owned(), servers.to_str().unwrap().to_owned()]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Server::start_before(&refs, &[], Some(&[]));
    let list = |token: Option<&str>| {
        let stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        let bearer = token.map(|t| format!("Bearer {t}"));
        let mut headers = JSON.to_vec();
        if let Some(b) = &bearer {
            headers.push(("Authorization", b.as_str()));
        }
        exchange_on(
            stream,
            "POST",
            "/mcp/echo",
            &headers,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
        )
    };
    let (status, head, _) = list(None);
    assert_eq!(status, 401);
    assert!(
        head.contains(
            "resource_metadata=\"https://mcp.example.test/.well-known/oauth-protected-resource/mcp/echo\""
        ),
        "{head}"
    );
    let endpoint = format!("{RESOURCE}/echo");
    assert_eq!(list(Some(&issuer.token(json!({"aud": endpoint})))).0, 200);
    assert_eq!(list(Some(&issuer.token(json!({"aud": RESOURCE})))).0, 200);
    let (status, _, _) = list(Some(
        &issuer.token(json!({"aud": format!("{RESOURCE}/other")})),
    ));
    assert_eq!(status, 401, "a token for another server's endpoint");
    let meta = |path: &str| {
        let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let doc = meta("/.well-known/oauth-protected-resource/mcp/echo");
    let body: Value = serde_json::from_str(doc.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(body["resource"], json!(endpoint));
    assert!(meta("/.well-known/oauth-protected-resource/mcp/nope").starts_with("HTTP/1.1 404"));
}

/// The Python SDK's server over streamable HTTP (tests/peers/http_server.py) on a free port of
/// loopback, killed when dropped, and its URL: ready when it says so on its stderr.
struct PythonHttp {
    child: Child,
    url: String,
}

impl PythonHttp {
    fn start() -> PythonHttp {
        let python = countersign_tests::peers::python();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/http_server.py");
        let port = free_port();
        let mut child = Command::new(python)
            .args([script.to_str().unwrap(), &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (ready, told) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut said = Vec::new();
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if line.contains("Uvicorn running on") {
                    let _ = ready.send(Ok(()));
                }
                said.push(line);
                // Read on to the end, so the server never blocks on a full pipe; what it said
                // before it ended is the test's to show.
                if said.len() > 200 {
                    said.remove(0);
                }
            }
            let _ = ready.send(Err(said.join("\n")));
        });
        let ready = told.recv_timeout(Duration::from_secs(30));
        assert!(
            matches!(ready, Ok(Ok(()))),
            "the Python server did not start: {ready:?}"
        );
        PythonHttp {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

impl Drop for PythonHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An open tool's call to an upstream reached by URL goes straight to it, past both MCP sessions
/// (the open lane for URL upstreams), and everything the full path decides is decided the same:
/// the answer comes back under the caller's id, in the caller's revision; a tool the server does
/// not offer never reaches the upstream; a tool the upstream changes on a call's own stream is
/// refused on the very next call; a request the upstream makes of an agent is answered at once.
#[test]
fn open_calls_to_an_upstream_by_url_go_straight_and_are_decided_as_on_the_full_path() {
    let upstream = PythonHttp::start();
    let server = Server::start_before(
        &[
            "--read-only",
            "--behind-tls-proxy",
            "--unauthenticated",
            "--url",
            &upstream.url,
        ],
        &[],
        Some(&[]),
    );
    let post_with = |headers: &[(&str, &str)], body: Value| {
        let (status, _, answer) = post(server.port, headers, &body.to_string());
        assert_eq!(status, 200, "{answer}");
        answer
    };
    let call = |id: Value, tool: &str, arguments: Value| {
        post_with(
            &[],
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                   "params": {"name": tool, "arguments": arguments}}),
        )
    };
    let listed = post_with(
        &[],
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    );
    let mut names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["ask", "lookup", "shift", "whoami"], "{listed}");

    // What the upstream saw of each call: the first after a listing may list again on the full
    // path; the calls right after it go on the lane, under its own ids.
    let said = |answer: &Value| -> Value {
        let text = answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("{answer}"));
        serde_json::from_str(text).unwrap()
    };
    // Up to 12 calls, at least 2 on the lane: a loaded machine may let the listing's second run
    // out between two of them (that call then lists again on the full path).
    let mut seen = Vec::new();
    for id in 2..=13 {
        let answer = call(json!(id), "whoami", json!({}));
        assert_eq!(answer["id"], json!(id), "{answer}");
        // A caller before 2026-07-28 never sees `resultType`.
        assert!(answer["result"].get("resultType").is_none(), "{answer}");
        seen.push(said(&answer));
    }
    let lane: Vec<&Value> = seen
        .iter()
        .filter(|s| {
            s["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("countersign-open-"))
        })
        .collect();
    assert!(
        lane.len() >= 2,
        "the calls did not go on the lane: {seen:?}"
    );
    for s in &lane {
        // As rmcp's client sends a call at this revision: its per-request header says what it is.
        if s["protocol"].as_str() >= Some("2026-07-28") {
            assert_eq!(s["method"], "tools/call", "{s}");
        }
    }
    // Any id of the caller's comes back as it was, a progress token or not.
    let odd = json!("the caller's own id: ☃");
    let answer = post_with(
        &[],
        json!({"jsonrpc": "2.0", "id": odd, "method": "tools/call",
               "params": {"name": "whoami", "arguments": {}, "_meta": {"progressToken": "p-1"}}}),
    );
    assert_eq!(answer["id"], odd, "{answer}");
    assert_eq!(answer["result"]["isError"], json!(false), "{answer}");
    // The caller's own `_meta` keys go on, as on the full path; its progress token and its
    // lifecycle keys do not (this server speaks for itself upstream).
    let answer = post_with(
        &[],
        json!({"jsonrpc": "2.0", "id": 70, "method": "tools/call",
               "params": {"name": "whoami", "arguments": {}, "_meta": {
                   "progressToken": "p-2",
                   "example.com/trace": "t-1",
                   "io.modelcontextprotocol/clientInfo": {"name": "posing", "version": "1"}}}}),
    );
    // (Both paths send it so; the Python SDK names the progress token `progress_token`.)
    let meta = said(&answer)["meta"].clone();
    assert_eq!(meta["example.com/trace"], "t-1", "{meta}");
    assert!(!meta.to_string().contains("p-2"), "{meta}");
    assert_ne!(
        meta["io.modelcontextprotocol/clientInfo"]["name"], "posing",
        "{meta}"
    );
    // A caller on 2026-07-28 gets `resultType`.
    let answer = post_with(
        &[("MCP-Protocol-Version", "2026-07-28")],
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
               "params": {"name": "whoami", "arguments": {}}}),
    );
    assert_eq!(answer["result"]["resultType"], "complete", "{answer}");

    // Messages that try a way around the judging, sent where the lane would take a call: each is
    // refused before it, and nothing runs upstream (`whoami` and `lookup` count their runs).
    let runs = |id: u32| {
        said(&call(json!(id), "whoami", json!({})))["runs"]
            .as_u64()
            .unwrap()
    };
    let before = runs(80);
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":88,"method":"tools/call","params":{{"name":"lookup","arguments":{{"word":"{}"}}}}}}"#,
        "x".repeat(5 * 1024 * 1024)
    );
    let hostile: [(&[(&str, &str)], &str); 8] = [
        // Duplicate keys: which tool would run depends on who reads it.
        (
            &[],
            r#"{"jsonrpc":"2.0","id":81,"method":"tools/call","params":{"name":"note","name":"whoami","arguments":{}}}"#,
        ),
        (
            &[],
            r#"{"jsonrpc":"2.0","id":82,"id":83,"method":"tools/call","params":{"name":"whoami","arguments":{}}}"#,
        ),
        // A call posing as a notification (no id) and as a response.
        (
            &[],
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"whoami","arguments":{}}}"#,
        ),
        (
            &[],
            r#"{"jsonrpc":"2.0","id":84,"result":{},"method":"tools/call","params":{"name":"whoami","arguments":{}}}"#,
        ),
        // Wrong types.
        (
            &[],
            r#"{"jsonrpc":"2.0","id":85,"method":"tools/call","params":{"name":["whoami"],"arguments":{}}}"#,
        ),
        (
            &[],
            r#"{"jsonrpc":"2.0","id":86,"method":"tools/call","params":{"name":"lookup","arguments":"word=pin"}}"#,
        ),
        // A routing header that says another tool than the message.
        (
            &[("Mcp-Name", "whoami")],
            r#"{"jsonrpc":"2.0","id":87,"method":"tools/call","params":{"name":"lookup","arguments":{"word":"pin"}}}"#,
        ),
        // Past the body's limit.
        (&[], huge.as_str()),
    ];
    for (headers, body) in hostile {
        let (status, _, answer) = post(server.port, headers, body);
        let refused = status != 200
            || answer.get("error").is_some()
            || answer["result"]["isError"] == json!(true);
        assert!(refused, "{status} {answer} for {:.200}", body);
    }
    // A tool the upstream does not list (an invisible character in a listed one's name).
    let unlisted = call(json!(89), "who\u{200b}ami", json!({}));
    assert_eq!(unlisted["result"]["isError"], json!(true), "{unlisted}");
    assert_eq!(runs(90), before + 1, "something ran upstream");

    // A tool this server does not offer never reaches the upstream.
    let note = call(json!(8), "note", json!({"text": "x"}));
    assert_eq!(note["result"]["isError"], json!(true), "{note}");
    assert_eq!(said(&call(json!(9), "whoami", json!({})))["notes"], 0);

    // The upstream asks for the agent's roots: answered at once, never waited on.
    let began = Instant::now();
    let asked = call(json!(10), "ask", json!({}));
    assert!(asked.get("result").is_some(), "{asked}");
    assert!(
        began.elapsed() < Duration::from_secs(20),
        "{:?}",
        began.elapsed()
    );

    // `shift` changes `lookup` and says so on its own stream before it answers: the very next
    // call of `lookup` is refused, not run under the old decision.
    let looked = call(json!(11), "lookup", json!({"word": "pin"}));
    assert_eq!(looked["result"]["isError"], json!(false), "{looked}");
    let shifted = call(json!(12), "shift", json!({}));
    assert_eq!(shifted["result"]["isError"], json!(false), "{shifted}");
    let on_the_lane = shifted["result"]["content"][0]["text"]
        .as_str()
        .is_some_and(|t| t.contains("countersign-open-"));
    let changed = Instant::now();
    let mut id = 13;
    loop {
        let looked = call(json!(id), "lookup", json!({"word": "pin"}));
        if looked["result"]["structuredContent"]["refusal"] == "tool_changed" {
            break;
        }
        // On the lane the notification is read before the answer; on the full path (the
        // listing's second ran out just before `shift`) the client session reads it on its own
        // task, a moment later.
        assert!(
            !on_the_lane && changed.elapsed() < Duration::from_secs(3),
            "the changed tool still ran (shift on the lane: {on_the_lane}): {looked}"
        );
        id += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An upstream reached by URL that is started again forgets every session; server-everything
/// then answers the old session's requests `400` with an error that names no request (MCP asks
/// for `404`). That answer is the call's, at once, rather than a wait for ever, and the next call
/// opens a new session and runs, on the full path and then on the lane.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_by_url_started_again_answers_at_once_and_the_next_call_runs() {
    let port = free_port();
    let (mut everything, url) = countersign_tests::peers::server_everything_http_on(port).await;
    let server = Server::start_before(
        &[
            "--read-only",
            "--behind-tls-proxy",
            "--unauthenticated",
            "--url",
            &url,
        ],
        &[],
        Some(&[]),
    );
    let port_of_server = server.port;
    // Every request is given 20 s: one under a forgotten session must not be waited on.
    let ask = move |body: String| async move {
        let said = body.clone();
        tokio::time::timeout(
            Duration::from_secs(20),
            tokio::task::spawn_blocking(move || post(port_of_server, &[], &body)),
        )
        .await
        .unwrap_or_else(|_| panic!("waited on for 20 s: {said}"))
        .unwrap()
    };
    let echo = move |id: u32| {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                          "params": {"name": "echo", "arguments": {"message": "again"}}});
        let answered = ask(body.to_string());
        async move {
            let (status, _, answer) = answered.await;
            assert_eq!(status, 200, "{answer}");
            answer
        }
    };
    let ran = |answer: Value| {
        assert_eq!(
            answer["result"]["content"][0]["text"], "Echo: again",
            "{answer}"
        );
    };
    for id in 1..=3 {
        ran(echo(id).await);
    }
    everything.kill().await.unwrap();
    everything.wait().await.unwrap();
    let (mut again, _) = countersign_tests::peers::server_everything_http_on(port).await;
    // The first call under the forgotten session: answered (its error), not waited on.
    let first = echo(4).await;
    assert!(
        first.get("error").is_some() || first.get("result").is_some(),
        "{first}"
    );
    for id in 5..=7 {
        ran(echo(id).await);
    }
    // Again, with a request the client session sends itself (the full path): answered at once
    // too, and the call after it runs.
    again.kill().await.unwrap();
    again.wait().await.unwrap();
    let (_third, _) = countersign_tests::peers::server_everything_http_on(port).await;
    let listed = ask(r#"{"jsonrpc":"2.0","id":8,"method":"resources/list"}"#.into()).await;
    assert_eq!(listed.0, 200, "{}", listed.2);
    ran(echo(9).await);
    assert_eq!(
        server
            .log()
            .matches("the next request starts a new session")
            .count(),
        2,
        "{}",
        server.log()
    );
}
