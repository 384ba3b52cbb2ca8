//! `countersign serve`, as a team's agents and operators meet it: the real binary, started as a
//! process, reached over TCP (plain and TLS), with the built-in tools as its upstream and (for a
//! writable server) a throwaway PostgreSQL server as its control database.
//!
//! What is tried: the seed's start rules (a refusal never binds the port, and `countersign serve`
//! refuses alike); the secret and the database password never in anything the server writes;
//! read-only serving only open tools; the HTTP edges (Host, Origin, methods, media types, size,
//! protocol revision, hostile JSON-RPC) refused before anything reaches the engine or upstream.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use countersign_tests::approver::{Desk, first_waiting, now_ms, on_approver_listener, waiting_now};
use countersign_tests::postgres::shared_database;
use countersign_tests::window::bin;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::{Value, json};

/// A port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `countersign-serve` with `args`, an environment of only PATH, HOME and `env`, its output
/// captured.
fn serve(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", std::env::var("HOME").unwrap_or_default())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn refused_without_binding(program: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut all = vec!["--listen", listen.as_str()];
    all.extend_from_slice(args);
    let out = serve(program, &all, env).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains("listening"), "{stderr}");
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the port was bound by a server that refused to start"
    );
    stderr
}

#[test]
fn a_writable_server_without_its_secret_or_control_database_refuses_and_never_binds() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.sqlite");
    let db = db.to_str().unwrap();
    for program in [bin("countersign-serve"), bin("countersign")] {
        let prefix: &[&str] = if program.ends_with("countersign") {
            &["serve"]
        } else {
            &[]
        };
        let run = |rest: &[&str], env: &[(&str, &str)]| {
            let port = free_port();
            let listen = format!("127.0.0.1:{port}");
            let mut all: Vec<&str> = prefix.to_vec();
            all.extend(["--listen", listen.as_str()]);
            all.extend_from_slice(rest);
            all.extend(["--db", db]);
            let out = serve(&program, &all, env).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            assert_eq!(out.status.code(), Some(2), "{stderr}");
            assert!(!stderr.contains("listening"), "{stderr}");
            assert!(
                TcpStream::connect(("127.0.0.1", port)).is_err(),
                "the port was bound by a server that refused to start"
            );
            stderr
        };
        let no_secret = run(
            &["--behind-tls-proxy"],
            &[("CONTROL_DSN", "host=127.0.0.1")],
        );
        assert!(
            no_secret.contains("CONFIRM_SECRET") && no_secret.contains("--read-only"),
            "{no_secret}"
        );
        let secret = "s".repeat(40);
        let no_dsn = run(&["--behind-tls-proxy"], &[("CONFIRM_SECRET", &secret)]);
        assert!(no_dsn.contains("CONTROL_DSN"), "{no_dsn}");
        let short = run(
            &["--behind-tls-proxy"],
            &[
                ("CONFIRM_SECRET", "short-secret-31-bytes-long-xxxx"),
                ("CONTROL_DSN", "host=127.0.0.1"),
                ("RUST_LOG", "trace"),
            ],
        );
        assert!(short.contains("31 bytes"), "{short}");
        assert!(!short.contains("short-secret"), "{short}");
        let no_tls = run(&[], &[("CONFIRM_SECRET", &secret), ("CONTROL_DSN", "x")]);
        assert!(no_tls.contains("--behind-tls-proxy"), "{no_tls}");
    }
}

#[test]
fn unusable_tls_files_and_a_public_address_without_host_names_refuse_before_binding() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.sqlite");
    let cert = dir.path().join("cert.pem");
    std::fs::write(&cert, "not a certificate").unwrap();
    let key = dir.path().join("key.pem");
    std::fs::write(
        &key,
        "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let stderr = refused_without_binding(
        &bin("countersign-serve"),
        &[
            "--read-only",
            "--unauthenticated",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--db",
            db.to_str().unwrap(),
        ],
        &[],
    );
    assert!(stderr.contains("cert.pem"), "{stderr}");
    assert!(
        !stderr.contains("c2VjcmV0"),
        "the key's text is never quoted: {stderr}"
    );
    let out = serve(
        &bin("countersign-serve"),
        &[
            "--listen",
            "0.0.0.0:0",
            "--read-only",
            "--behind-tls-proxy",
            "--unauthenticated",
            "--db",
            db.to_str().unwrap(),
        ],
        &[],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--allowed-host"));
}

/// A running server, killed when dropped; its stderr kept for the test to read.
struct Server {
    child: Child,
    port: u16,
    log: Arc<std::sync::Mutex<Vec<u8>>>,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Server {
        Server::start_before(args, env, None)
    }

    /// A server in front of `upstream` (a stdio server's command line) instead of the built-in
    /// tools on a small database.
    fn start_before(args: &[&str], env: &[(&str, &str)], upstream: Option<&[&str]>) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let db = tools_db(dir.path());
        // Port 0 is refused nowhere, but the test must know the port: take a free one.
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut all = vec!["--listen", listen.as_str()];
        all.extend_from_slice(args);
        match upstream {
            // The arguments name the upstreams (a servers file).
            Some([]) => {}
            Some(command) => {
                all.push("--");
                all.extend_from_slice(command);
            }
            None => all.extend(["--db", db.to_str().unwrap()]),
        }
        let mut child = serve(&bin("countersign-serve"), &all, env).spawn().unwrap();
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut stderr = child.stderr.take().unwrap();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            let mut told = false;
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut log = sink.lock().unwrap();
                log.extend_from_slice(&buf[..n]);
                if !told && String::from_utf8_lossy(&log).contains("listening on") {
                    told = true;
                    let _ = ready_tx.send(());
                }
            }
        });
        let ready = ready_rx.recv_timeout(Duration::from_secs(60));
        let server = Server {
            child,
            port,
            log,
            _dir: dir,
        };
        assert!(ready.is_ok(), "the server did not start: {}", server.log());
        server
    }

    fn log(&self) -> String {
        String::from_utf8_lossy(&self.log.lock().unwrap()).into_owned()
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Stops it and hands back everything it wrote.
    fn stop(mut self) -> String {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut stdout = String::new();
        if let Some(mut out) = self.child.stdout.take() {
            let _ = out.read_to_string(&mut stdout);
        }
        format!("{stdout}{}", self.log())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Asked to stop first, so it removes its temporary directory; then made to.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && !matches!(self.child.try_wait(), Ok(Some(_))) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request over `stream`: the status, the headers (lowercased) and the body.
fn exchange(
    stream: impl Read + Write,
    method: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, String) {
    exchange_on(stream, method, "/mcp", headers, body)
}

/// [`exchange`] on `path`.
fn exchange_on(
    mut stream: impl Read + Write,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, String) {
    let mut request = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        request.push_str("Host: 127.0.0.1\r\n");
    }
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    stream.write_all(request.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_ascii_lowercase(), body.to_owned())
}

const JSON: [(&str, &str); 2] = [
    ("Content-Type", "application/json"),
    ("Accept", "application/json, text/event-stream"),
];

fn post(port: u16, extra: &[(&str, &str)], body: &str) -> (u16, String, Value) {
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut headers = JSON.to_vec();
    headers.extend_from_slice(extra);
    let (status, head, body) = exchange(stream, "POST", &headers, body.as_bytes());
    let value = serde_json::from_str(&body).unwrap_or(Value::Null);
    (status, head, value)
}

async fn agent(url: &str) -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
    ().serve(StreamableHttpClientTransport::from_uri(url))
        .await
        .unwrap()
}

/// `tool` called with `arguments` (an object), as the agent does.
async fn call(
    agent: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    tool: &'static str,
    arguments: Value,
) -> rmcp::model::CallToolResult {
    let arguments = arguments
        .as_object()
        .cloned()
        .expect("arguments are an object");
    agent
        .call_tool(CallToolRequestParams::new(tool).with_arguments(arguments))
        .await
        .unwrap()
}

fn text_of(result: &rmcp::model::CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect()
}

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

fn self_signed(dir: &Path) -> (PathBuf, PathBuf, rustls::pki_types::CertificateDer<'static>) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    (cert, key, certified.cert.der().clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_a_client_trusting_the_certificate_is_answered_and_plain_http_is_not() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key, der) = self_signed(certs.path());
    let server = Server::start(
        &[
            "--read-only",
            "--unauthenticated",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
        &[],
    );
    let port = server.port;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let answer = tokio::task::spawn_blocking(move || {
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let tls = rustls::StreamOwned::new(conn, tcp);
        let mut headers = JSON.to_vec();
        headers.push(("Host", "localhost"));
        exchange(
            tls,
            "POST",
            &headers,
            br#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#,
        )
    })
    .await
    .unwrap();
    assert_eq!(answer.0, 200, "{answer:?}");
    assert!(answer.2.contains("list_tables"), "{answer:?}");
    // Plain HTTP to the TLS port: no MCP answer comes back.
    let plain = tokio::task::spawn_blocking(move || {
        let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        exchange(
            tcp,
            "POST",
            &JSON,
            br#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#,
        )
    })
    .await
    .unwrap();
    assert_ne!(plain.0, 200);
    assert!(!plain.2.contains("list_tables"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn a_writable_server_writes_neither_its_secret_nor_the_database_password_anywhere() {
    let dsn = shared_database().await;
    let secret = "marker-secret-0123456789-abcdefghijklmnopq";
    // Its confirm events go to the team's collector, named by the standard variables; the
    // collector's API key is a secret like the others.
    let collector = countersign_tests::otlp::Collector::start().await;
    let base = collector.endpoint().trim_end_matches("/v1/logs").to_owned();
    let server = Server::start(
        &["--behind-tls-proxy", "--unauthenticated"],
        &[
            ("CONFIRM_SECRET", secret),
            ("CONTROL_DSN", &dsn),
            ("CONFIRM_TTL_MS", "120000"),
            ("RUST_LOG", "trace"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &base),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "api-key=collector-key-marker-77",
            ),
        ],
    );
    let agent = agent(&server.url()).await;
    let tools = agent.list_all_tools().await.unwrap();
    let execute = tools
        .iter()
        .find(|t| t.name == "execute")
        .expect("a writable server offers the gated tools");
    let schema = serde_json::to_string(&execute.input_schema).unwrap();
    assert!(schema.contains("confirmToken"), "{schema}");
    let preflight = call(&agent, "execute", json!({"sql": "DELETE FROM notes"})).await;
    assert_eq!(preflight.is_error, Some(true));
    assert_eq!(
        preflight.structured_content.as_ref().unwrap()["refusal"],
        "desk_unavailable",
        "{preflight:?}"
    );
    assert!(text_of(&preflight).contains("no approver is connected"));
    // A forged confirm: refused, and nothing ran.
    let forged = call(
        &agent,
        "execute",
        json!({"sql": "DELETE FROM notes", "confirm": true, "confirmTarget": "notes",
               "confirmToken": "cs1.AAAA.BBBB"}),
    )
    .await;
    assert_eq!(forged.is_error, Some(true), "{forged:?}");
    let count = call(
        &agent,
        "query",
        json!({"sql": "SELECT count(*) AS n FROM notes"}),
    )
    .await;
    assert!(text_of(&count).contains("\"n\":1"), "{count:?}");
    agent.cancel().await.unwrap();
    // Its events are in the control database.
    let client = countersign_tests::postgres::admin(&dsn).await;
    let rows = client
        .query("SELECT kind, refusal, tool, tenant FROM history", &[])
        .await
        .unwrap();
    let events: Vec<(String, Option<String>, String, String)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert!(
        events
            .iter()
            .any(|(kind, refusal, tool, tenant)| kind == "refused"
                && refusal.as_deref() == Some("bad_token")
                && tool == "execute"
                && tenant.starts_with("unauthenticated@")),
        "the forged confirm is on the record, under the caller and the server: {events:?}"
    );
    // And at the collector, decoded from the protobuf it was sent.
    let sent = collector
        .wait_for(events.len(), std::time::Duration::from_secs(30))
        .await;
    assert_eq!(
        countersign_tests::otlp::seqs(&sent),
        (1..=events.len() as u64).collect::<Vec<_>>()
    );
    assert!(
        sent.iter().any(|r| {
            countersign_tests::otlp::attribute(r, "countersign.code").as_deref()
                == Some("bad_token")
        }),
        "{sent:?}"
    );
    // What the collector holds checks the control database's chain: the last event it
    // received must still be there, with that hash.
    let last = sent.last().unwrap();
    let seen = format!(
        "{}:{}",
        countersign_tests::otlp::attribute(last, "countersign.seq").unwrap(),
        countersign_tests::otlp::attribute(last, "countersign.chain.hash").unwrap()
    );
    let (code, verdict, note) = roster_command(
        "history",
        &[("CONTROL_DSN", &dsn)],
        &["--verify", "--seen", &seen],
    );
    assert_eq!(code, 0, "{verdict}{note}");
    assert!(
        verdict.starts_with("history intact: events #1 to #"),
        "{verdict}"
    );
    let written = server.stop();
    assert!(
        !written.contains("collector-key-marker"),
        "the collector's key was written"
    );
    assert!(written.contains("listening on"), "{written}");
    assert!(!written.contains(secret), "the secret was written");
    assert!(
        !written.contains("marker-secret"),
        "part of the secret was written"
    );
    let password = dsn
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("password="));
    if let Some(password) = password {
        assert!(
            !written.contains(password),
            "the database password was written"
        );
    }
}

/// The test's own OAuth issuer: a signing key, its JWKS served on loopback, tokens on demand.
struct Issuer {
    key: rcgen::KeyPair,
    jwks_url: String,
}

const ISSUER: &str = "https://id.example.test";
const RESOURCE: &str = "https://mcp.example.test/mcp";

impl Issuer {
    fn start() -> Issuer {
        use base64::Engine as _;
        let key = rcgen::KeyPair::generate().unwrap();
        let raw = key.public_key_raw();
        assert_eq!(raw.len(), 65, "an uncompressed P-256 point");
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let jwks = json!({"keys": [{
            "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": "k1",
            "x": b64(&raw[1..33]), "y": b64(&raw[33..]),
        }]})
        .to_string();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf);
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{jwks}",
                    jwks.len()
                );
            }
        });
        Issuer {
            key,
            jwks_url: format!("http://127.0.0.1:{port}/jwks"),
        }
    }

    /// A token signed with `key` (the issuer's unless another is given), with `claims` over
    /// the defaults (this issuer, this resource, subject alice, an hour to live, scope mcp).
    fn token_signed(key: &rcgen::KeyPair, claims: Value) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let mut all = json!({
            "iss": ISSUER, "aud": RESOURCE, "sub": "alice", "exp": now + 3600, "iat": now,
            "scope": "openid mcp",
        });
        for (k, v) in claims.as_object().unwrap() {
            all[k] = v.clone();
        }
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        header.kid = Some("k1".into());
        let encoding =
            jsonwebtoken::EncodingKey::from_ec_pem(key.serialize_pem().as_bytes()).unwrap();
        jsonwebtoken::encode(&header, &all, &encoding).unwrap()
    }

    fn token(&self, claims: Value) -> String {
        Self::token_signed(&self.key, claims)
    }
}

fn oauth_args(issuer_keys: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--read-only",
        "--behind-tls-proxy",
        "--issuer",
        ISSUER,
        "--resource",
        RESOURCE,
        "--scope",
        "mcp",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(issuer_keys.iter().map(|s| s.to_string()));
    args
}

fn list_with(port: u16, token: Option<&str>) -> (u16, String, Value) {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut extra = vec![];
    if let Some(b) = &bearer {
        extra.push(("Authorization", b.as_str()));
    }
    post(
        port,
        &extra,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
    )
}

#[test]
fn only_a_token_of_the_issuer_for_this_resource_with_its_scope_gets_in() {
    let issuer = Issuer::start();
    let args = oauth_args(&["--jwks-url", &issuer.jwks_url]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Server::start(&refs, &[]);
    let port = server.port;

    let good = issuer.token(json!({}));
    let (status, _, body) = list_with(port, Some(&good));
    assert_eq!(status, 200, "{body}");
    assert!(body.to_string().contains("list_tables"));

    // No token: 401, and where to learn how to get one.
    let (status, head, _) = list_with(port, None);
    assert_eq!(status, 401);
    assert!(
        head.contains("www-authenticate: bearer")
            && head.contains(
                "resource_metadata=\"https://mcp.example.test/.well-known/oauth-protected-resource/mcp\""
            ),
        "{head}"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let forger = rcgen::KeyPair::generate().unwrap();
    for (why, token) in [
        (
            "another key signed it",
            Issuer::token_signed(&forger, json!({})),
        ),
        (
            "another audience",
            issuer.token(json!({"aud": "https://other.example.test/mcp"})),
        ),
        ("expired", issuer.token(json!({"exp": now - 600}))),
        (
            "another issuer",
            issuer.token(json!({"iss": "https://evil.example.test"})),
        ),
        ("no subject", issuer.token(json!({"sub": ""}))),
        ("not a JWT", "csk_not-a-jwt".to_owned()),
        ("tampered", {
            let mut parts: Vec<String> = good.split('.').map(str::to_owned).collect();
            parts[1] = issuer
                .token(json!({"sub": "mallory"}))
                .split('.')
                .nth(1)
                .unwrap()
                .to_owned();
            parts.join(".")
        }),
    ] {
        let (status, head, body) = list_with(port, Some(&token));
        assert_eq!(status, 401, "{why}: {body}");
        assert!(head.contains("error=\"invalid_token\""), "{why}: {head}");
        assert!(!body.to_string().contains("list_tables"), "{why}");
    }
    // A valid token without the scope: 403 naming the scope.
    let (status, head, _) = list_with(port, Some(&issuer.token(json!({"scope": "openid"}))));
    assert_eq!(status, 403);
    assert!(
        head.contains("error=\"insufficient_scope\"") && head.contains("scope=\"mcp\""),
        "{head}"
    );
    // The metadata, for anyone.
    let meta = {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            s,
            "GET /.well-known/oauth-protected-resource/mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let doc: Value = serde_json::from_str(meta.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(doc["resource"], RESOURCE);
    assert_eq!(doc["authorization_servers"], json!([ISSUER]));
    assert_eq!(doc["scopes_supported"], json!(["mcp"]));
    let log = server.stop();
    assert!(
        !log.contains(&good),
        "a bearer token was written to the log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_is_the_tokens_subject_whatever_the_agent_says_about_itself() {
    let issuer = Issuer::start();
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("issuer.pem");
    std::fs::write(&pem, issuer.key.public_key_pem()).unwrap();
    let data = dir.path().join("data");
    let mut args = oauth_args(&["--jwt-key-file", pem.to_str().unwrap()]);
    args.extend(["--data-dir".to_owned(), data.to_str().unwrap().to_owned()]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Server::start(&refs, &[]);
    let token = issuer.token(json!({"sub": "alice"}));
    let bearer = format!("Bearer {token}");
    // The agent claims to be someone else, in clientInfo and in _meta, and calls a tool the
    // read-only server does not offer: refused, and on the record under the token's subject.
    let (status, _, body) = post(
        server.port,
        &[
            ("Authorization", bearer.as_str()),
            ("MCP-Protocol-Version", "2025-11-25"),
        ],
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"no_such_tool","arguments":{},"_meta":{"tenant":"bob","io.modelcontextprotocol/clientInfo":{"name":"bob"}}}}"#,
    );
    assert_eq!(status, 200, "{body}");
    let history = countersign_store::HistoryReader::open(
        data.join("serve.sqlite"),
        &countersign_store::StoreOptions::default(),
    )
    .unwrap();
    let events = history
        .history(&countersign_store::HistoryFilter::default())
        .unwrap();
    assert!(!events.is_empty(), "the refusal is on the record");
    for event in &events {
        assert!(
            event
                .tenant
                .starts_with("jwt:https://id.example.test#alice@"),
            "{event:?}"
        );
    }
}

/// `countersign serve agent ARGS` on the records in `data`: its exit code, stdout and stderr.
fn agent_command(data: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["agent", "--data-dir", data.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = serve(&bin("countersign-serve"), &all, &[])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_agent_key_gets_its_agent_in_until_it_is_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("records");
    let (code, key, note) = agent_command(&data, &["add", "ci-runner"]);
    assert_eq!(code, 0, "{note}");
    let key = key.trim().to_owned();
    assert!(key.starts_with("csk_") && key.len() > 40, "{key}");
    assert!(!note.contains(&key), "the key goes to stdout alone");
    let (code, _, note) = agent_command(&data, &["add", "ci-runner"]);
    assert_eq!(code, 2, "a name is never given twice: {note}");
    assert_eq!(agent_command(&data, &["add", "not a name"]).0, 2);
    let (_, other, _) = agent_command(&data, &["add", "nightly"]);
    let other = other.trim().to_owned();

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
    let port = server.port;
    assert_eq!(list_with(port, Some(&key)).0, 200);
    assert_eq!(list_with(port, Some(&other)).0, 200);
    assert_eq!(list_with(port, None).0, 401);
    let mut forged = key.clone();
    forged.pop();
    forged.push(if key.ends_with('A') { 'B' } else { 'A' });
    let (status, head, _) = list_with(port, Some(&forged));
    assert_eq!(status, 401);
    assert!(head.contains("invalid_token"), "{head}");
    assert_eq!(list_with(port, Some("csk_")).0, 401);
    // A JWT where only agent keys are accepted: refused.
    let issuer = Issuer::start();
    assert_eq!(list_with(port, Some(&issuer.token(json!({})))).0, 401);

    // The call is on the record under the key's agent.
    let bearer = format!("Bearer {key}");
    post(
        port,
        &[("Authorization", bearer.as_str())],
        r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"no_such_tool","arguments":{}}}"#,
    );
    let history = countersign_store::HistoryReader::open(
        data.join("serve.sqlite"),
        &countersign_store::StoreOptions::default(),
    )
    .unwrap();
    let events = history
        .history(&countersign_store::HistoryFilter::default())
        .unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.tenant.starts_with("key:ci-runner@")),
        "{events:?}"
    );

    // Revoked: the very next request is refused; the other agent keeps working.
    let (code, _, note) = agent_command(&data, &["revoke", "ci-runner"]);
    assert_eq!(code, 0, "{note}");
    assert_eq!(list_with(port, Some(&key)).0, 401);
    assert_eq!(list_with(port, Some(&other)).0, 200);
    assert_eq!(agent_command(&data, &["revoke", "ci-runner"]).0, 2);
    let (code, listed, _) = agent_command(&data, &["list"]);
    assert_eq!(code, 0);
    assert!(
        listed.contains("ci-runner") && listed.contains("revoked"),
        "{listed}"
    );
    assert!(
        listed.contains("nightly") && listed.contains("active"),
        "{listed}"
    );
    assert!(
        !listed.contains(&key) && !listed.contains(&other),
        "{listed}"
    );
    let log = server.stop();
    assert!(
        !log.contains(&key) && !log.contains(&other),
        "a key reached the log"
    );
}

#[test]
fn agent_keys_are_refused_by_a_server_that_does_not_accept_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("records");
    let (_, key, _) = agent_command(&data, &["add", "ci"]);
    let issuer = Issuer::start();
    let mut args = oauth_args(&["--jwks-url", &issuer.jwks_url]);
    args.extend(["--data-dir".to_owned(), data.to_str().unwrap().to_owned()]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Server::start(&refs, &[]);
    let (status, _, body) = list_with(server.port, Some(key.trim()));
    assert_eq!(status, 401, "{body}");
    assert_eq!(
        list_with(server.port, Some(&issuer.token(json!({})))).0,
        200
    );
}

/// Where `.ci/setup tests` installs the pinned MCP peers.
fn peers() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/peers")
}

#[test]
fn real_peers_the_python_sdk_as_agent_and_server_everything_as_upstream() {
    let python = peers().join("venv/bin/python");
    let everything = peers().join("node_modules/.bin/mcp-server-everything");
    assert!(
        python.exists() && everything.exists(),
        "the MCP peers are not installed in target/peers: run .ci/setup tests"
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

/// A servers file in `dir` naming one server, `echo` (tests/peers/echo_server.py).
fn echo_servers_file(dir: &Path) -> PathBuf {
    let echo = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/echo_server.py");
    let servers = dir.join("servers.json");
    let file = json!({"servers": {"echo": {"command": [which("python3"), echo]}}});
    std::fs::write(&servers, file.to_string()).unwrap();
    servers
}

/// The absolute path of `program`, as the PATH finds it.
fn which(program: &str) -> String {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|dir| Path::new(dir).join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} is not on the PATH"))
        .to_str()
        .unwrap()
        .to_owned()
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
    let mut server = Server::start_before(
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
    let began = Instant::now();
    while !server.log().contains("sleep started") {
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    let (status, _, answer) = call.join().unwrap();
    assert_eq!(status, 200, "{answer}");
    assert!(answer["result"].to_string().contains("slept"), "{answer}");
    // Then it stops, on its own.
    let stopped = Instant::now();
    while !matches!(server.child.try_wait(), Ok(Some(_))) {
        assert!(
            stopped.elapsed() < Duration::from_secs(30),
            "it did not stop"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
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

/// `countersign serve ROSTER ARGS` with `env`: its exit code, stdout and stderr.
/// Registers each desk's key as an approver of the roster in `env`'s control database.
fn add_approvers(env: &[(&str, &str)], desks: &[(&str, &Desk)]) {
    for (name, desk) in desks {
        let (code, _, note) = roster_command("approver", env, &["add", name, &desk.public_text()]);
        assert_eq!(code, 0, "{note}");
    }
}

/// A policy file in `dir` asking two distinct approvers for the built-in `execute` on `db`.
fn two_approvers_for_execute(dir: &Path, db: &Path) -> PathBuf {
    let policy = dir.join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "[servers.\"builtin:{}\".tools.execute]\napprovers = 2\n",
            db.display()
        ),
    )
    .unwrap();
    policy
}

/// An agent of the server at `url`, presenting the agent key `key`.
async fn agent_with_key(
    url: String,
    key: &str,
) -> Arc<rmcp::service::RunningService<rmcp::RoleClient, ()>> {
    let transport = StreamableHttpClientTransport::from_config(
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(url)
            .auth_header(key.to_owned()),
    );
    Arc::new(().serve(transport).await.unwrap())
}

fn roster_command(roster: &str, env: &[(&str, &str)], args: &[&str]) -> (i32, String, String) {
    let mut all = vec![roster];
    all.extend_from_slice(args);
    let out = serve(&bin("countersign-serve"), &all, env)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn only_decisions_signed_by_enough_registered_approvers_over_the_waiting_call_mint() {
    use countersign_core::approver::Verdict;
    let dsn = shared_database().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, trusted) = self_signed(dir.path());
    let db = tools_db(dir.path());
    // Two distinct people must approve a delete.
    let policy = two_approvers_for_execute(dir.path(), &db);
    let env = [("CONTROL_DSN", dsn.as_str())];
    let (alice, bob, carol, mallory) = (Desk::new(1), Desk::new(2), Desk::new(3), Desk::new(4));
    add_approvers(&env, &[("alice", &alice), ("bob", &bob), ("carol", &carol)]);
    for bad in ["ed25519:AAAA", "not-a-key", &alice.public_text()] {
        let (code, _, note) = roster_command("approver", &env, &["add", "eve", bad]);
        assert_eq!(code, 2, "{bad}: {note}");
    }
    let (code, agent_key, note) = roster_command("agent", &env, &["add", "ci"]);
    assert_eq!(code, 0, "{note}");
    let agent_key = agent_key.trim().to_owned();

    let approver_port = free_port();
    let approver_url = format!("https://localhost:{approver_port}");
    let (receiver, notices) = webhook_receiver();
    let mut args = approver_args(
        "--agent-keys",
        &db,
        approver_port,
        &approver_url,
        &cert,
        &key,
    );
    args.extend([
        "--webhook".to_owned(),
        format!("http://127.0.0.1:{receiver}/hook"),
        "--slack-webhook".to_owned(),
        format!("http://127.0.0.1:{receiver}/slack"),
        "--policy".to_owned(),
        policy.to_str().unwrap().to_owned(),
    ]);
    let secret = "approvers-test-secret-0123456789abcdef";
    let server = Server::start_before(
        &strs(&args),
        &[("CONFIRM_SECRET", secret), ("CONTROL_DSN", &dsn)],
        Some(&[]),
    );
    let listener_trusted = trusted.clone();
    let listener = move |desk: Option<&Desk>,
                         method: &str,
                         path: &str,
                         headers: &[(&str, &str)],
                         body: &str| {
        on_approver_listener(
            approver_port,
            &listener_trusted,
            desk,
            method,
            path,
            headers,
            body,
        )
    };
    let listener = Arc::new(listener);

    // The agent asks; its preflight waits for people.
    let agent = agent_with_key(server.url(), &agent_key).await;
    let asking = {
        let agent = agent.clone();
        tokio::spawn(
            async move { call(&agent, "execute", json!({"sql": "DELETE FROM notes"})).await },
        )
    };
    // Alice's desk reads the waiting calls, waiting on the listener for one to arrive.
    let request = {
        let trusted = trusted.clone();
        tokio::task::spawn_blocking(move || first_waiting(approver_port, &trusted, &Desk::new(1)))
            .await
            .unwrap()
    };
    assert_eq!(request["plan"]["tool"], "execute");
    assert_eq!(request["asks"]["approvers"], 2, "{request}");
    assert!(
        request["asks"]["tenant"]
            .as_str()
            .unwrap()
            .starts_with("key:ci@"),
        "{request}"
    );
    let url = format!("https://localhost:{approver_port}");
    let post = |desk: Option<&Desk>, body: Value| {
        listener(
            desk,
            "POST",
            "/approver/v1/decisions",
            &[],
            &body.to_string(),
        )
    };

    // Ways around the signatures, each of which must mint nothing.
    // An agent's key, without a desk's certificate: the listener's TLS lets it nowhere.
    let bearer = format!("Bearer {agent_key}");
    let with_token = listener(
        None,
        "GET",
        "/approver/v1/requests",
        &[("Authorization", &bearer)],
        "",
    );
    assert!(with_token.is_err(), "{with_token:?}");
    let approve = alice.decide(&url, &request, Verdict::Approve, |_| {});
    let with_token = post(None, approve.clone());
    assert!(with_token.is_err(), "{with_token:?}");
    // A desk whose key nobody registered: refused at TLS.
    assert!(post(Some(&mallory), approve.clone()).is_err());
    // Bytes that are no decision, on Alice's own connection: refused before any check.
    let raw = |body: String| {
        listener(Some(&alice), "POST", "/approver/v1/decisions", &[], &body).unwrap()
    };
    let mut extra = approve.clone();
    extra["approver"] = json!("bob");
    let text = approve.to_string();
    let duplicated = format!(
        "{},\"plan\":\"{}\"}}",
        &text[..text.len() - 1],
        "ab".repeat(32)
    );
    for (body, code) in [
        ("{".to_owned(), "malformed"),
        ("[]".to_owned(), "malformed"),
        (json!({"request": "1"}).to_string(), "malformed"),
        (extra.to_string(), "malformed"),
        (" ".repeat(20_000), "too_large"),
    ] {
        let (status, answer) = raw(body);
        assert_eq!(answer["error"].as_str(), Some(code), "{status} {answer}");
    }
    // A second `plan` after the signed one: a duplicate key is no decision either.
    let (status, answer) = raw(duplicated);
    assert_eq!((status, answer["error"].as_str()), (400, Some("malformed")));
    // Unsigned, on Alice's own connection.
    let mut unsigned = approve.clone();
    unsigned.as_object_mut().unwrap().remove("signature");
    let (status, body) = post(Some(&alice), unsigned).unwrap();
    assert_eq!((status, body["error"].as_str()), (400, Some("unsigned")));
    // Signed by a key the server does not know, sent on Alice's connection.
    let (status, body) = post(
        Some(&alice),
        mallory.decide(&url, &request, Verdict::Approve, |_| {}),
    )
    .unwrap();
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("bad_signature"))
    );
    // Signed by Bob, sent on Alice's connection: a decision is its connection's approver's.
    let (status, body) = post(
        Some(&alice),
        bob.decide(&url, &request, Verdict::Approve, |_| {}),
    )
    .unwrap();
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("bad_signature"))
    );
    // Signed for another server.
    let other = alice.decide(&url, &request, Verdict::Approve, |f| {
        f.server = "https://other.example.com".into()
    });
    let (status, body) = post(Some(&alice), other).unwrap();
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("bad_signature"))
    );
    // Over another plan hash, signed and sent as such.
    let mut another = request.clone();
    another["asks"]["plan_hash"] = json!("ab".repeat(32));
    let (status, body) = post(
        Some(&alice),
        alice.decide(&url, &another, Verdict::Approve, |_| {}),
    )
    .unwrap();
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("does_not_match"))
    );
    // Another target, signed as such.
    let mut elsewhere = request.clone();
    elsewhere["plan"]["target"] = json!("users");
    let (status, body) = post(
        Some(&alice),
        alice.decide(&url, &elsewhere, Verdict::Approve, |_| {}),
    )
    .unwrap();
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("does_not_match"))
    );
    // A signature over one plan with another plan sent: the signature does not hold.
    let mut swapped = approve.clone();
    swapped["plan"] = json!("cd".repeat(32));
    let (status, body) = post(Some(&alice), swapped).unwrap();
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("bad_signature"))
    );
    // Expired, or good for longer than a decision may be.
    let stale = alice.decide(&url, &request, Verdict::Approve, |f| {
        f.expires_at_ms = 1_000
    });
    let (status, body) = post(Some(&alice), stale).unwrap();
    assert_eq!((status, body["error"].as_str()), (409, Some("expired")));
    let lasting = alice.decide(&url, &request, Verdict::Approve, |f| {
        f.expires_at_ms = now_ms() + 3_600_000
    });
    let (status, body) = post(Some(&alice), lasting).unwrap();
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("expires_too_late"))
    );
    // A revoked approver: its signed approval is refused (at TLS once the listener has read the
    // roster again, as the records say before that).
    let (code, _, note) = roster_command("approver", &env, &["revoke", "carol"]);
    assert_eq!(code, 0, "{note}");
    match post(
        Some(&carol),
        carol.decide(&url, &request, Verdict::Approve, |_| {}),
    ) {
        Err(_) => {}
        Ok((status, body)) => {
            assert_eq!(
                (status, body["error"].as_str()),
                (403, Some("approver_revoked"))
            )
        }
    }
    // Nothing of that counted: the call still waits, approved by nobody.
    let (status, body) = listener(Some(&alice), "GET", "/approver/v1/requests", &[], "").unwrap();
    assert_eq!(status, 200);
    assert_eq!(body["requests"][0]["approvedBy"], json!([]), "{body}");
    assert_eq!(
        body["server"],
        url.as_str(),
        "the listener names itself as desks enrolled"
    );
    assert!(!asking.is_finished());

    // Alice approves: one of two. Again: still one (distinct people). Bob: minted.
    let (status, body) = post(Some(&alice), approve.clone()).unwrap();
    assert_eq!(
        (status, &body["outcome"]),
        (202, &json!("recorded")),
        "{body}"
    );
    let (status, body) = post(
        Some(&alice),
        alice.decide(&url, &request, Verdict::Approve, |_| {}),
    )
    .unwrap();
    assert_eq!((status, &body["approvals"]), (202, &json!(1)), "{body}");
    assert!(!asking.is_finished());
    let (status, body) = post(
        Some(&bob),
        bob.decide(&url, &request, Verdict::Approve, |_| {}),
    )
    .unwrap();
    assert_eq!(
        (status, &body["outcome"]),
        (200, &json!("approved")),
        "{body}"
    );
    let approved = asking.await.unwrap();
    let content = approved.structured_content.clone().unwrap();
    assert_eq!(content["approved"], true, "{approved:?}");
    let confirmed = call(
        &agent,
        "execute",
        json!({"sql": "DELETE FROM notes", "confirm": true,
               "confirmTarget": content["confirmTarget"], "confirmToken": content["confirmToken"]}),
    )
    .await;
    assert_ne!(confirmed.is_error, Some(true), "{confirmed:?}");
    // A late decision on the decided call finds nothing waiting.
    let (status, body) = post(
        Some(&alice),
        alice.decide(&url, &request, Verdict::Deny, |_| {}),
    )
    .unwrap();
    assert_eq!((status, body["error"].as_str()), (404, Some("not_pending")));

    // A deny by one approver ends the next call, with its note, and mints nothing.
    let asking = {
        let agent = agent.clone();
        tokio::spawn(async move {
            call(
                &agent,
                "execute",
                json!({"sql": "DELETE FROM notes WHERE id = 7"}),
            )
            .await
        })
    };
    let next = loop {
        let (_, body) =
            listener(Some(&bob), "GET", "/approver/v1/requests?wait=1", &[], "").unwrap();
        if let Some(first) = body["requests"].as_array().and_then(|r| r.first()) {
            break first["request"].clone();
        }
        tokio::task::yield_now().await;
    };
    let mut deny = bob.decide(&url, &next, Verdict::Deny, |_| {});
    deny["note"] = json!("not on a Friday");
    let (status, body) = post(Some(&bob), deny).unwrap();
    assert_eq!(
        (status, &body["outcome"]),
        (200, &json!("denied")),
        "{body}"
    );
    let denied = asking.await.unwrap();
    assert_eq!(denied.is_error, Some(true), "{denied:?}");
    let said = text_of(&denied);
    assert!(
        said.contains("denied by approver bob") && said.contains("not on a Friday"),
        "{said}"
    );

    // Every accepted decision is on the record with its signature, and checks against its
    // approver's key; none of the refused ones is.
    let records =
        countersign_store::Postgres::connect(&dsn, countersign_store::PostgresOptions::default())
            .await
            .unwrap();
    use countersign_store::Records as _;
    let kept = records.decisions(100).await.unwrap();
    let who: Vec<(&str, &str)> = kept
        .iter()
        .map(|d| (d.approver.as_str(), d.verdict.code()))
        .collect();
    assert_eq!(
        who,
        [
            ("alice", "approve"),
            ("alice", "approve"),
            ("bob", "approve"),
            ("bob", "deny")
        ]
    );
    for d in &kept {
        let desk = if d.approver == "alice" { &alice } else { &bob };
        let decision = countersign_core::approver::Decision {
            server: &d.server,
            request: d.request,
            verdict: d.verdict,
            plan: &d.plan,
            tenant: &d.tenant,
            tool: &d.tool,
            target: &d.target,
            class: d.class,
            expires_at_ms: d.expires_at_ms,
        };
        assert_eq!(
            countersign_core::approver::verify(
                &desk.key.public(),
                &decision,
                &d.signature,
                d.decided_at_ms
            ),
            Ok(())
        );
    }
    // Each waiting call was announced to both webhooks, without its arguments.
    countersign_tests::postgres::wait_until("four notices", Duration::from_secs(20), || {
        notices.lock().unwrap().len() >= 4
    });
    let notices = notices.lock().unwrap().clone();
    for path in ["/hook", "/slack"] {
        let bodies: Vec<&String> = notices
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, b)| b)
            .collect();
        assert_eq!(bodies.len(), 2, "{path}: {notices:?}");
        for body in bodies {
            assert!(
                body.contains("key:ci@") && body.contains("execute"),
                "{body}"
            );
            assert!(body.contains("notes") && body.contains(&url), "{body}");
            assert!(
                // The summary ("DELETE from notes") is the describer's, never the SQL itself.
                !body.contains("DELETE FROM") && !body.contains("WHERE"),
                "{body}"
            );
            assert!(
                !body.contains(&agent_key) && !body.contains(secret),
                "{body}"
            );
        }
    }
    let first: Value =
        serde_json::from_str(&notices.iter().find(|(p, _)| p == "/hook").unwrap().1).unwrap();
    assert_eq!(first["event"], "request_waiting");
    assert_eq!(first["approvers"], 2);

    // `countersign serve history`: the confirm events, and the decisions with their keys.
    let (code, events, note) = roster_command("history", &env, &["--json"]);
    assert_eq!(code, 0, "{note}");
    let kinds: Vec<String> = events
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["kind"].to_string())
        .collect();
    for kind in ["issued", "accepted", "denied"] {
        assert!(kinds.iter().any(|k| k.contains(kind)), "{kind} in {events}");
    }
    let (code, table, _) = roster_command("history", &env, &["--tool", "execute"]);
    assert_eq!(code, 0);
    assert!(
        table.contains("issued") && table.contains("key:ci@"),
        "{table}"
    );
    let (code, lines, note) = roster_command("history", &env, &["--decisions", "--json"]);
    assert_eq!(code, 0, "{note}");
    let decided: Vec<Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(decided.len(), 4, "{lines}");
    // Newest first, as the history.
    assert_eq!(decided[3]["approver"], "alice");
    assert_eq!(decided[3]["approverKey"], alice.public_text().as_str());
    assert_eq!(decided[0]["approver"], "bob");
    assert_eq!(decided[0]["verdict"], "deny");
    // The history is one chain, its head signed with the key derived from the secret (the one
    // the server logged at start), and a check against any other key says so.
    let chain = countersign_core::chain::ChainKey::from_secret(
        &countersign_core::SigningKey::new(secret.as_bytes()).unwrap(),
    )
    .public_text();
    let (code, verdict, note) = roster_command("history", &env, &["--verify", "--key", &chain]);
    assert_eq!(code, 0, "{verdict}{note}");
    assert!(
        verdict.starts_with("history intact: events #1 to #"),
        "{verdict}"
    );
    let other = countersign_core::chain::ChainKey::from_seed(&[1; 32]).public_text();
    let (code, verdict, _) = roster_command("history", &env, &["--verify", "--key", &other]);
    assert_eq!(code, 1, "{verdict}");
    assert!(verdict.contains("(wrong_key)"), "{verdict}");
    let log = server.stop();
    assert!(
        log.contains(&chain),
        "the chain key is logged at start: {log}"
    );
    assert!(!log.contains(secret), "the secret was written");
    assert!(!log.contains(&agent_key), "the agent's key was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn a_person_approves_a_team_servers_call_in_the_desk_window_and_only_then_it_runs() {
    let dsn = shared_database().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = self_signed(dir.path());
    let db = tools_db(dir.path());
    let approver_port = free_port();
    let url = format!("https://localhost:{approver_port}");

    // The desk enrolls: its key goes to the keychain, and it prints the line the team runs.
    let desk_dir = tempfile::tempdir().unwrap();
    let enroll = Command::new(bin("countersign"))
        .args(["approver", "enroll", &url, "--ca", cert.to_str().unwrap()])
        .env("COUNTERSIGN_DESK_DIR", desk_dir.path())
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&enroll.stdout).into_owned();
    assert_eq!(
        enroll.status.code(),
        Some(0),
        "{printed}{}",
        String::from_utf8_lossy(&enroll.stderr)
    );
    let public = printed
        .trim()
        .strip_prefix("countersign serve approver add NAME ")
        .unwrap_or_else(|| panic!("{printed}"))
        .to_owned();
    assert!(countersign_core::approver::parse_public_key(&public).is_some());
    // Not https, or no certificate authority: refused, nothing enrolled.
    let refused = Command::new(bin("countersign"))
        .args([
            "approver",
            "enroll",
            "http://localhost:1",
            "--ca",
            cert.to_str().unwrap(),
        ])
        .env("COUNTERSIGN_DESK_DIR", desk_dir.path())
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let env = [("CONTROL_DSN", dsn.as_str())];
    let (code, _, note) = roster_command("approver", &env, &["add", "dana", &public]);
    assert_eq!(code, 0, "{note}");

    let args = approver_args("--unauthenticated", &db, approver_port, &url, &cert, &key);
    let server = Server::start_before(
        &strs(&args),
        &[
            ("CONFIRM_SECRET", "window-approver-secret-0123456789abcdef"),
            ("CONTROL_DSN", &dsn),
        ],
        Some(&[]),
    );
    let desk = countersign_tests::window::Desk::start_in(desk_dir, &[]).await;

    let agent = Arc::new(agent(&server.url()).await);
    let delete = json!({"sql": "DELETE FROM notes"});
    let asking = {
        let (agent, delete) = (agent.clone(), delete.clone());
        tokio::spawn(async move { call(&agent, "execute", delete).await })
    };
    // The team server's call shows in the desk's own window, marked with the server.
    desk.wait_for_request().await;
    let shown_server = desk.text("#d-server").await;
    assert!(shown_server.contains(&url), "{shown_server}");
    assert_eq!(desk.text("#d-tool").await, "execute");
    assert!(!asking.is_finished());
    // The same protections as for the desk's own requests: the target typed, the delay waited.
    let target = desk.text("#d-target").await;
    if !desk.enabled("#approve").await && desk.exists("#typed:not([hidden])").await {
        desk.set_value("#typed-target", &target).await;
    }
    desk.until("Approve to be enabled", |d| Box::pin(d.approve_enabled()))
        .await;
    desk.click("#approve").await;
    let approved = asking.await.unwrap();
    let content = approved.structured_content.clone().unwrap();
    assert_eq!(content["approved"], true, "{approved:?}");
    let confirm = confirm_of(&delete, &content);
    let done = call(&agent, "execute", confirm).await;
    assert_ne!(done.is_error, Some(true), "{done:?}");
    desk.until("the queue to empty", |d| {
        Box::pin(async move { !d.visible_request().await })
    })
    .await;

    // Denied in the window: the agent is told, with the approver's name.
    let asking = {
        let agent = agent.clone();
        tokio::spawn(async move {
            call(
                &agent,
                "execute",
                json!({"sql": "DELETE FROM notes WHERE id = 9"}),
            )
            .await
        })
    };
    desk.wait_for_request().await;
    desk.click("#deny").await;
    let denied = asking.await.unwrap();
    assert_eq!(denied.is_error, Some(true), "{denied:?}");
    assert!(
        text_of(&denied).contains("denied by approver dana"),
        "{denied:?}"
    );

    // Both decisions are on the server's record under the desk's approver.
    let records =
        countersign_store::Postgres::connect(&dsn, countersign_store::PostgresOptions::default())
            .await
            .unwrap();
    use countersign_store::Records as _;
    let kept: Vec<(String, &str)> = records
        .decisions(10)
        .await
        .unwrap()
        .iter()
        .map(|d| (d.approver.clone(), d.verdict.code()))
        .collect();
    assert_eq!(
        kept,
        [("dana".to_owned(), "approve"), ("dana".to_owned(), "deny")]
    );
    desk.stop().await;
    drop(server);
}

/// The (path, body) of every POST a webhook receiver answered.
type Notices = Arc<std::sync::Mutex<Vec<(String, String)>>>;

/// A webhook receiver on loopback: its port, and what it received.
fn webhook_receiver() -> (u16, Notices) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let got = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = got.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            // Headers, then as many body bytes as Content-Length says.
            let (head, length) = loop {
                let Ok(n) = stream.read(&mut chunk) else {
                    break (String::new(), 0);
                };
                if n == 0 {
                    break (String::new(), 0);
                }
                buf.extend_from_slice(&chunk[..n]);
                if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end + 4);
                    let length = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    break (head, length);
                }
            };
            while buf.len() < length {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
            sink.lock()
                .unwrap()
                .push((path, String::from_utf8_lossy(&buf).into_owned()));
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    (port, got)
}

/// The built-in tools' database in `dir`: a table `notes` with one row.
fn tools_db(dir: &Path) -> PathBuf {
    let db = dir.join("tools.sqlite");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(
            "CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT); \
             INSERT INTO notes(body) VALUES ('hello');",
        )
        .unwrap();
    db
}

/// How many rows `notes` has in `db`.
fn notes_in(db: &Path) -> i64 {
    rusqlite::Connection::open(db)
        .unwrap()
        .query_row("SELECT count(*) FROM notes", [], |r| r.get(0))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn the_control_database_down_between_approval_and_confirm_runs_nothing_until_it_is_back() {
    let postgres = countersign_tests::postgres::PrivateServer::start();
    let dsn = countersign_tests::postgres::fresh_database(&postgres.dsn()).await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, trusted) = self_signed(dir.path());
    let db = tools_db(dir.path());
    let alice = Desk::new(11);
    let env = [("CONTROL_DSN", dsn.as_str())];
    let (code, _, note) = roster_command("approver", &env, &["add", "alice", &alice.public_text()]);
    assert_eq!(code, 0, "{note}");
    let port = free_port();
    let url = format!("https://localhost:{port}");
    let args = approver_args("--unauthenticated", &db, port, &url, &cert, &key);
    let server = Server::start_before(
        &strs(&args),
        &[
            ("CONFIRM_SECRET", "database-down-secret-0123456789abcdef"),
            ("CONTROL_DSN", &dsn),
        ],
        Some(&[]),
    );
    let agent = Arc::new(agent(&server.url()).await);
    let delete = json!({"sql": "DELETE FROM notes"});
    let approved = |agent: Arc<rmcp::service::RunningService<rmcp::RoleClient, ()>>| {
        let (trusted, delete) = (trusted.clone(), delete.clone());
        async move {
            let asking = {
                let agent = agent.clone();
                tokio::spawn(async move { call(&agent, "execute", delete).await })
            };
            let request =
                tokio::task::spawn_blocking(move || Desk::new(11).approve_first(port, &trusted))
                    .await
                    .unwrap();
            assert_eq!(request.0, 200, "{request:?}");
            asking.await.unwrap().structured_content.unwrap()
        }
    };

    let content = approved(agent.clone()).await;
    assert_eq!(content["approved"], true, "{content}");
    // The control database goes down between the approval and the confirm: refused, nothing ran.
    postgres.stop_immediately();
    let refused = call(&agent, "execute", confirm_of(&delete, &content)).await;
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    assert_eq!(notes_in(&db), 1, "nothing ran while the records were down");
    // Back: a new preflight is approved and its confirm runs, once.
    postgres.start_again();
    let content = approved(agent.clone()).await;
    let done = call(&agent, "execute", confirm_of(&delete, &content)).await;
    assert_ne!(done.is_error, Some(true), "{done:?}");
    assert_eq!(notes_in(&db), 0);
    let again = call(&agent, "execute", confirm_of(&delete, &content)).await;
    assert_eq!(
        again.is_error,
        Some(true),
        "a works-once token works once: {again:?}"
    );
    drop(server);
}

/// `GET path` on the operator listener at `port`, with `headers`: the status and the body.
fn operator_get(port: u16, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (status, _, body) = exchange_on(stream, "GET", path, headers, b"");
    (status, body)
}

/// The value of the sample `name` with exactly `labels` in a Prometheus text exposition, read
/// line by line (`name{k="v",...} value`); `None` when no such sample is there.
fn sample(exposition: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut wanted: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    wanted.sort();
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (series_name, mut have) = match series.split_once('{') {
                Some((n, rest)) => {
                    let inner = rest.strip_suffix('}')?;
                    let pairs: Option<Vec<(String, String)>> = inner
                        .split(',')
                        .filter(|p| !p.is_empty())
                        .map(|p| {
                            let (k, v) = p.split_once('=')?;
                            Some((k.to_owned(), v.trim_matches('"').to_owned()))
                        })
                        .collect();
                    (n, pairs?)
                }
                None => (series, Vec::new()),
            };
            have.sort();
            (series_name == name && have == wanted)
                .then(|| value.parse().ok())
                .flatten()
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn the_operator_listener_counts_what_the_server_decided_and_serves_nothing_to_agents() {
    let dsn = shared_database().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, trusted) = self_signed(dir.path());
    let db = tools_db(dir.path());
    let env = [("CONTROL_DSN", dsn.as_str())];
    let alice = Desk::new(21);
    let (code, _, note) = roster_command("approver", &env, &["add", "alice", &alice.public_text()]);
    assert_eq!(code, 0, "{note}");
    let (code, agent_key, note) = roster_command("agent", &env, &["add", "metered"]);
    assert_eq!(code, 0, "{note}");
    let agent_key = agent_key.trim().to_owned();
    let port = free_port();
    let url = format!("https://localhost:{port}");
    let operator = free_port();
    let mut args = approver_args("--agent-keys", &db, port, &url, &cert, &key);
    args.extend([
        "--operator-listen".to_owned(),
        format!("127.0.0.1:{operator}"),
    ]);
    let server = Server::start_before(
        &strs(&args),
        &[
            ("CONFIRM_SECRET", "operator-metrics-secret-0123456789abcdef"),
            ("CONTROL_DSN", &dsn),
        ],
        Some(&[]),
    );
    let agent = agent_with_key(server.url(), &agent_key).await;

    // Two open calls, forwarded.
    for _ in 0..2 {
        let read = call(&agent, "query", json!({"sql": "SELECT body FROM notes"})).await;
        assert!(text_of(&read).contains("hello"), "{read:?}");
    }
    // A gated call, approved at a desk, then confirmed: it runs.
    let delete = json!({"sql": "DELETE FROM notes"});
    let asking = {
        let (agent, delete) = (agent.clone(), delete.clone());
        tokio::spawn(async move { call(&agent, "execute", delete).await })
    };
    let decided = {
        let trusted = trusted.clone();
        tokio::task::spawn_blocking(move || Desk::new(21).approve_first(port, &trusted))
            .await
            .unwrap()
    };
    assert_eq!(decided.0, 200, "{decided:?}");
    let content = asking.await.unwrap().structured_content.unwrap();
    assert_eq!(content["approved"], true, "{content}");
    let done = call(&agent, "execute", confirm_of(&delete, &content)).await;
    assert_ne!(done.is_error, Some(true), "{done:?}");
    assert_eq!(notes_in(&db), 0);
    // A confirm with a token nobody minted: refused.
    let mut forged = confirm_of(&delete, &content);
    forged["confirmToken"] = json!("not-a-token");
    let refused = call(&agent, "execute", forged).await;
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    // The works-once token again: a replay.
    let again = call(&agent, "execute", confirm_of(&delete, &content)).await;
    assert_eq!(again.is_error, Some(true), "{again:?}");

    // The scrape: exactly what happened, by class and outcome.
    let (status, text) = operator_get(operator, "/metrics", &[]);
    assert_eq!(status, 200, "{text}");
    let requests = |class: &str, outcome: &str| {
        sample(
            &text,
            "countersign_requests_total",
            &[("class", class), ("outcome", outcome)],
        )
    };
    for (class, outcome, n) in [
        ("open", "forwarded", 2.0),
        ("once", "approved", 1.0),
        ("once", "executed_ok", 1.0),
        ("once", "refused", 1.0),
        ("once", "replay", 1.0),
        ("once", "pending", 0.0),
        ("once", "denied", 0.0),
        ("once", "executed_error", 0.0),
        ("once", "outcome_unknown", 0.0),
        ("token", "approved", 0.0),
        ("none", "refused", 0.0),
    ] {
        assert_eq!(
            requests(class, outcome),
            Some(n),
            "{class} {outcome}:\n{text}"
        );
    }
    let refusals = |code: &str| sample(&text, "countersign_refusals_total", &[("code", code)]);
    assert_eq!(refusals("bad_token"), Some(1.0), "{text}");
    assert_eq!(refusals("already_used"), Some(1.0), "{text}");
    assert_eq!(sample(&text, "countersign_waiting_calls", &[]), Some(0.0));
    let count = |name: &str, label: (&str, &str)| sample(&text, name, &[label]);
    assert_eq!(
        count(
            "countersign_decision_seconds_count",
            ("decision", "approved")
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        count("countersign_decision_seconds_count", ("decision", "denied")),
        Some(0.0)
    );
    assert_eq!(
        count(
            "countersign_ledger_spend_seconds_count",
            ("result", "spent")
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        count(
            "countersign_ledger_spend_seconds_count",
            ("result", "already_spent")
        ),
        Some(1.0)
    );
    // Nothing an agent chose is a label: no tool, target or tenant anywhere in the text.
    for chosen in ["DELETE", "query", "notes", "metered", &agent_key] {
        assert!(!text.contains(chosen), "{chosen} in\n{text}");
    }

    // Health, and readiness (the control database answers).
    assert_eq!(operator_get(operator, "/healthz", &[]).0, 200);
    assert_eq!(operator_get(operator, "/readyz", &[]).0, 200);
    // An agent's token opens nothing here: refused before anything is read.
    let bearer = format!("Bearer {agent_key}");
    let (status, body) = operator_get(operator, "/metrics", &[("Authorization", &bearer)]);
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("no_credentials_here") && !body.contains("countersign_requests"));
    // A name a web page could point here (DNS rebinding), and a browser's request: refused.
    let (status, _) = operator_get(operator, "/metrics", &[("Host", "evil.example")]);
    assert_eq!(status, 403);
    let (status, _) = operator_get(operator, "/metrics", &[("Origin", "https://evil.example")]);
    assert_eq!(status, 403);
    // Nothing of the agents' endpoint is here, and nothing of this listener is on the agents'
    // port, with or without the agent's token.
    let (status, _) = operator_get(operator, "/mcp", &[]);
    assert_eq!(status, 404);
    for path in ["/metrics", "/healthz", "/readyz"] {
        for headers in [vec![], vec![("Authorization", bearer.as_str())]] {
            let (status, body) = operator_get(server.port, path, &headers);
            assert_eq!(status, 404, "{path} on the agents' port: {body}");
            assert!(!body.contains("countersign_"), "{body}");
        }
    }
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn sixty_four_agents_racing_one_works_once_token_across_two_replicas_run_it_once() {
    use countersign_core::approver::Verdict;
    let dsn = shared_database().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, trusted) = self_signed(dir.path());
    let db = tools_db(dir.path());
    let alice = Desk::new(21);
    let env = [("CONTROL_DSN", dsn.as_str())];
    let (code, _, note) = roster_command("approver", &env, &["add", "alice", &alice.public_text()]);
    assert_eq!(code, 0, "{note}");
    let secret = "two-replicas-secret-0123456789abcdef";
    let approver_port = free_port();
    let url = format!("https://localhost:{approver_port}");
    let replica_env = [("CONFIRM_SECRET", secret), ("CONTROL_DSN", dsn.as_str())];
    let args = approver_args("--unauthenticated", &db, approver_port, &url, &cert, &key);
    let first = Server::start_before(&strs(&args), &replica_env, Some(&[]));
    // The second replica has no approver listener: it only confirms.
    let second = Server::start_before(&strs(&args[..6]), &replica_env, Some(&[]));

    // One approval, on the first replica.
    let insert = json!({"sql": "INSERT INTO notes(body) VALUES ('race')"});
    let agent = Arc::new(agent(&first.url()).await);
    let asking = {
        let (agent, insert) = (agent.clone(), insert.clone());
        tokio::spawn(async move { call(&agent, "execute", insert).await })
    };
    let decided = tokio::task::spawn_blocking(move || {
        let alice = Desk::new(21);
        let request = first_waiting(approver_port, &trusted, &alice);
        let decision = alice.decide(&url, &request, Verdict::Approve, |_| {});
        alice.send(approver_port, &trusted, &decision)
    })
    .await
    .unwrap();
    assert_eq!(decided.0, 200, "{decided:?}");
    let content = asking.await.unwrap().structured_content.unwrap();
    assert_eq!(content["worksOnce"], true, "{content}");
    let arguments = confirm_of(&insert, &content);
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": "execute", "arguments": arguments}})
    .to_string();

    // 64 agents confirm at once through one address, a round-robin proxy in front of both.
    let proxy = countersign_tests::proxy::RoundRobin::start(vec![first.port, second.port]).await;
    let port = proxy.port();
    let start = Arc::new(std::sync::Barrier::new(64));
    let racers: Vec<_> = (0..64)
        .map(|_| {
            let (call, start) = (call.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let (status, _, body) = post(port, &[], &call);
                assert_eq!(status, 200, "{body}");
                let result = &body["result"];
                if result["isError"] == json!(true) {
                    result["structuredContent"]["refusal"]
                        .as_str()
                        .unwrap_or("an error")
                        .to_owned()
                } else {
                    "executed".to_owned()
                }
            })
        })
        .collect();
    let outcomes: Vec<String> = racers.into_iter().map(|r| r.join().unwrap()).collect();
    let executed = outcomes.iter().filter(|o| *o == "executed").count();
    let used = outcomes.iter().filter(|o| *o == "already_used").count();
    assert_eq!((executed, used), (1, 63), "{outcomes:?}");
    let raced: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("SELECT count(*) FROM notes WHERE body = 'race'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(raced, 1, "exactly one upstream execution");
    let client = countersign_tests::postgres::admin(&dsn).await;
    let spent: i64 = client
        .query_one("SELECT count(*) FROM spent_nonce", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(spent, 1, "one ledger row");
    drop((first, second));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn a_call_asked_on_one_replica_is_approved_through_another_and_confirmed_on_a_third() {
    use countersign_core::approver::Verdict;
    let dsn = shared_database().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, trusted) = self_signed(dir.path());
    let db = tools_db(dir.path());
    let alice = Desk::new(31);
    let env = [("CONTROL_DSN", dsn.as_str())];
    let (code, _, note) = roster_command("approver", &env, &["add", "alice", &alice.public_text()]);
    assert_eq!(code, 0, "{note}");
    // Three replicas, each with an approver listener of its own, one name for desks.
    let listeners = [free_port(), free_port(), free_port()];
    let url = format!("https://approvers.example.test:{}", listeners[0]);
    let env = [
        ("CONFIRM_SECRET", "three-replicas-secret-0123456789abcdef"),
        ("CONTROL_DSN", dsn.as_str()),
    ];
    let replica = |port: u16| {
        let args = approver_args("--unauthenticated", &db, port, &url, &cert, &key);
        Server::start_before(&strs(&args), &env, Some(&[]))
    };
    let (a, b, c) = (
        replica(listeners[0]),
        replica(listeners[1]),
        replica(listeners[2]),
    );

    // Asked on A; the desk reads it through B and approves there.
    let insert = json!({"sql": "INSERT INTO notes(body) VALUES ('across')"});
    let on_a = Arc::new(agent(&a.url()).await);
    let asking = {
        let (agent, insert) = (on_a.clone(), insert.clone());
        tokio::spawn(async move { call(&agent, "execute", insert).await })
    };
    let through_b = listeners[1];
    let (trusted_b, url_b) = (trusted.clone(), url.clone());
    let decided = tokio::task::spawn_blocking(move || {
        let alice = Desk::new(31);
        let request = first_waiting(through_b, &trusted_b, &alice);
        // Every replica's desks see the same call under the same number.
        for port in [listeners[0], listeners[2]] {
            let seen = waiting_now(port, &trusted_b, &alice);
            assert_eq!(seen.len(), 1, "{seen:?}");
            assert_eq!(seen[0]["id"], request["id"]);
        }
        let decision = alice.decide(&url_b, &request, Verdict::Approve, |_| {});
        alice.send(through_b, &trusted_b, &decision)
    })
    .await
    .unwrap();
    assert_eq!(decided.0, 200, "{decided:?}");
    let content = asking.await.unwrap().structured_content.unwrap();
    assert_eq!(content["approved"], true, "{content}");
    // Confirmed on C.
    let on_c = agent(&c.url()).await;
    let confirm = confirm_of(&insert, &content);
    let done = call(&on_c, "execute", confirm.clone()).await;
    assert_ne!(done.is_error, Some(true), "{done:?}");
    let again = call(&on_c, "execute", confirm).await;
    assert_eq!(again.is_error, Some(true), "works once: {again:?}");
    let across = |db: &Path| -> i64 {
        rusqlite::Connection::open(db)
            .unwrap()
            .query_row(
                "SELECT count(*) FROM notes WHERE body = 'across'",
                [],
                |r| r.get(0),
            )
            .unwrap()
    };
    assert_eq!(across(&db), 1);
    // Decided: no replica's desks see it any more.
    let alice_again = Desk::new(31);
    for port in listeners {
        assert!(waiting_now(port, &trusted, &alice_again).is_empty());
    }

    // A asked again and killed while the call waits: the agent's call there ends. Asked again
    // on B, the call re-attaches to the one desks already see (no second entry), the desk
    // approves it, B mints for the agent waiting there, and it runs once.
    let asking = {
        let (agent, insert) = (on_a.clone(), insert.clone());
        tokio::spawn(async move {
            agent
                .call_tool(
                    CallToolRequestParams::new("execute")
                        .with_arguments(insert.as_object().unwrap().clone()),
                )
                .await
        })
    };
    let seen = {
        let trusted = trusted.clone();
        tokio::task::spawn_blocking(move || first_waiting(listeners[1], &trusted, &Desk::new(31)))
            .await
            .unwrap()
    };
    let mut a = a;
    unsafe { libc::kill(a.child.id() as i32, libc::SIGKILL) };
    let _ = a.child.wait();
    let ended = asking.await.unwrap();
    assert!(
        ended.is_err() || ended.as_ref().unwrap().is_error == Some(true),
        "{ended:?}"
    );
    let on_b = Arc::new(agent(&b.url()).await);
    let asking = {
        let (agent, insert) = (on_b.clone(), insert.clone());
        tokio::spawn(async move { call(&agent, "execute", insert).await })
    };
    let (trusted_b, url_b) = (trusted.clone(), url.clone());
    let decided = tokio::task::spawn_blocking(move || {
        let alice = Desk::new(31);
        // One entry for the call, whichever replicas it was asked on.
        let listed = waiting_now(listeners[2], &trusted_b, &alice);
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0]["id"], seen["id"]);
        let decision = alice.decide(&url_b, &seen, Verdict::Approve, |_| {});
        alice.send(listeners[2], &trusted_b, &decision)
    })
    .await
    .unwrap();
    assert_eq!(decided.0, 200, "{decided:?}");
    let content = asking.await.unwrap().structured_content.unwrap();
    let confirm = confirm_of(&insert, &content);
    let done = call(&on_b, "execute", confirm).await;
    assert_ne!(done.is_error, Some(true), "{done:?}");
    assert_eq!(across(&db), 2, "one run per approved call, none twice");
    drop((b, c));
}

/// A writable server's arguments: agents on loopback (`agents`: `--unauthenticated` or
/// `--agent-keys`), a preflight waiting up to a minute, the built-in tools on `db`, and an
/// approver listener on `port` that desks know as `url`, with `cert` and `key`.
fn approver_args(
    agents: &str,
    db: &Path,
    port: u16,
    url: &str,
    cert: &Path,
    key: &Path,
) -> Vec<String> {
    [
        "--behind-tls-proxy",
        agents,
        "--wait",
        "60",
        "--db",
        db.to_str().unwrap(),
        "--approver-listen",
        &format!("127.0.0.1:{port}"),
        "--approver-url",
        url,
        "--approver-cert",
        cert.to_str().unwrap(),
        "--approver-key",
        key.to_str().unwrap(),
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect()
}

/// `args` as `Server::start_before` takes them.
fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// `arguments` as the confirm of the approved preflight whose structured content is `content`.
fn confirm_of(arguments: &Value, content: &Value) -> Value {
    let mut confirm = arguments.clone();
    confirm["confirm"] = json!(true);
    confirm["confirmTarget"] = content["confirmTarget"].clone();
    confirm["confirmToken"] = content["confirmToken"].clone();
    confirm
}

/// Two replicas of one writable server (`--unauthenticated`, the built-in tools on one file) on
/// the shared PostgreSQL database, each with its approver listener under one `--approver-url`,
/// and the approver alice (the test desk of `seed`) registered. `wait` is `--wait`'s seconds.
struct TwoReplicas {
    a: Server,
    b: Server,
    /// The built-in tools' database file.
    db: PathBuf,
    /// The listeners' ports, A's then B's.
    listeners: [u16; 2],
    /// The server's name in decisions.
    url: String,
    /// The listeners' certificate, as desks trust it.
    trusted: rustls::pki_types::CertificateDer<'static>,
    _dir: tempfile::TempDir,
}

async fn two_replicas(seed: u8, secret: &str, wait: &str) -> TwoReplicas {
    let dsn = shared_database().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, trusted) = self_signed(dir.path());
    let db = tools_db(dir.path());
    let alice = Desk::new(seed);
    let env = [("CONTROL_DSN", dsn.as_str())];
    let (code, _, note) = roster_command("approver", &env, &["add", "alice", &alice.public_text()]);
    assert_eq!(code, 0, "{note}");
    let listeners = [free_port(), free_port()];
    let url = format!("https://approvers.example.test:{}", listeners[0]);
    let env = [("CONFIRM_SECRET", secret), ("CONTROL_DSN", dsn.as_str())];
    let replica = |port: u16| {
        let mut args = approver_args("--unauthenticated", &db, port, &url, &cert, &key);
        let at = args.iter().position(|a| a == "--wait").unwrap();
        args[at + 1] = wait.into();
        Server::start_before(&strs(&args), &env, Some(&[]))
    };
    let (a, b) = (replica(listeners[0]), replica(listeners[1]));
    TwoReplicas {
        a,
        b,
        db,
        listeners,
        url,
        trusted,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn an_agent_told_pending_that_asks_again_on_another_replica_gets_the_one_call_desks_see() {
    use countersign_core::approver::Verdict;
    // A short wait: the agent is told `pending` and asks again, as older clients do.
    let TwoReplicas {
        a,
        b,
        db,
        listeners,
        url,
        trusted,
        _dir,
    } = two_replicas(51, "pending-again-secret-0123456789abcdef", "5").await;
    let insert = json!({"sql": "INSERT INTO notes(body) VALUES ('again')"});

    // Asked on A, nobody decides in time: pending.
    let on_a = agent(&a.url()).await;
    let first = call(&on_a, "execute", insert.clone()).await;
    assert_eq!(
        first.structured_content.as_ref().unwrap()["refusal"],
        "pending",
        "{first:?}"
    );
    // Asked again, on B: one entry for desks, the same one; approved while the agent waits on B.
    let on_b = Arc::new(agent(&b.url()).await);
    let asking = {
        let (agent, insert) = (on_b.clone(), insert.clone());
        tokio::spawn(async move { call(&agent, "execute", insert).await })
    };
    let trusted_b = trusted.clone();
    let (listed, decided) = tokio::task::spawn_blocking(move || {
        let alice = Desk::new(51);
        let request = first_waiting(listeners[1], &trusted_b, &alice);
        let listed = waiting_now(listeners[0], &trusted_b, &alice);
        let decision = alice.decide(&url, &request, Verdict::Approve, |_| {});
        (listed, alice.send(listeners[1], &trusted_b, &decision))
    })
    .await
    .unwrap();
    assert_eq!(
        listed.len(),
        1,
        "one call, asked on two replicas: {listed:?}"
    );
    assert_eq!(decided.0, 200, "{decided:?}");
    let content = asking.await.unwrap().structured_content.unwrap();
    assert_eq!(
        content["approved"], true,
        "B minted for the agent waiting there: {content}"
    );
    let done = call(&on_b, "execute", confirm_of(&insert, &content)).await;
    assert_ne!(done.is_error, Some(true), "{done:?}");
    let again: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("SELECT count(*) FROM notes WHERE body = 'again'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(again, 1);
    // A's copy of the call was told it was taken elsewhere: asked on A again, the agent hears
    // that, as the approval already used (never a second token from the one approval, and
    // never said to be a person's deny), and the next ask is a new call.
    let third = call(&on_a, "execute", insert.clone()).await;
    assert_eq!(
        third.structured_content.as_ref().unwrap()["refusal"],
        "already_used",
        "{third:?}"
    );
    assert!(!text_of(&third).contains("denied"), "{third:?}");
    assert!(text_of(&third).contains("on another replica"), "{third:?}");
    let fourth = call(&on_a, "execute", insert.clone()).await;
    assert_eq!(
        fourth.structured_content.as_ref().unwrap()["refusal"],
        "pending",
        "{fourth:?}"
    );
    let again: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("SELECT count(*) FROM notes WHERE body = 'again'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(again, 1, "one approval, one run");
    drop((a, b));
}

/// Issue 17, item 6: the 2026-07-28 flow across replicas. The official Python SDK in `auto` mode
/// (tests/peers/team_agent.py), through one address in front of two replicas: its call of the
/// gated `execute` reaches replica A and is answered `input_required` with a `requestState`; a
/// person approves at a desk; the proxy now sends the SDK's own retry to replica B, where
/// nothing of the call waited. B opens the state (sealed under the secret both replicas share,
/// naming the call's shared row), finds the approved call, mints there, and the agent gets the
/// tool's real result: one run, and the call leaves the desks' queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn a_2026_07_28_client_approved_on_one_replica_gets_its_result_from_another_by_its_own_retry()
{
    use countersign_core::approver::Verdict;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let python = peers().join("venv/bin/python");
    assert!(
        python.exists(),
        "the Python MCP SDK is not installed in target/peers: run .ci/setup tests"
    );
    let TwoReplicas {
        a,
        b,
        db,
        listeners,
        url,
        trusted,
        _dir,
    } = two_replicas(52, "modern-across-replicas-0123456789abcdef", "60").await;
    let proxy = countersign_tests::proxy::RoundRobin::start(vec![a.port, b.port]).await;
    proxy.pin(Some(0));

    let sql = "INSERT INTO notes(body) VALUES ('modern')";
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/team_agent.py");
    let mut agent = tokio::process::Command::new(&python)
        .arg(script)
        .arg(format!("http://127.0.0.1:{}/mcp", proxy.port()))
        .arg(sql)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = agent.stdin.take().unwrap();
    let mut steps = tokio::io::BufReader::new(agent.stdout.take().unwrap()).lines();
    let mut next_step = async || -> Value {
        let line = tokio::time::timeout(Duration::from_secs(60), steps.next_line())
            .await
            .expect("the agent said nothing for 60 s")
            .unwrap()
            .expect("the agent ended");
        serde_json::from_str(&line).unwrap()
    };
    let connected = next_step().await;
    assert_eq!(connected["protocol"], "2026-07-28", "{connected}");
    let elicited = next_step().await;
    assert_eq!(elicited["step"], "elicited", "{elicited}");
    assert_eq!(elicited["mode"], "url", "{elicited}");

    // The person approves at the desk, while the agent is away (nobody waits on A).
    let trusted_b = trusted.clone();
    let decided = tokio::task::spawn_blocking(move || {
        let alice = Desk::new(52);
        let request = first_waiting(listeners[1], &trusted_b, &alice);
        let decision = alice.decide(&url, &request, Verdict::Approve, |_| {});
        alice.send(listeners[1], &trusted_b, &decision)
    })
    .await
    .unwrap();
    assert_eq!(decided.0, 200, "{decided:?}");
    // The balancer moves the agent: its retry reaches B.
    proxy.pin(Some(1));
    stdin.write_all(b"approved\n").await.unwrap();
    assert_eq!(next_step().await["step"], "answering");
    let result = next_step().await;
    assert_eq!(result["step"], "result", "{result}");
    let result = &result["result"];
    assert_ne!(result["isError"], json!(true), "{result}");
    assert!(
        result.to_string().contains("changes"),
        "the tool's own result: {result}"
    );
    let runs: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM notes WHERE body = 'modern'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(runs, 1, "one approval, one run");
    // Minted on B, so nothing of the call is left for desks.
    let trusted_a = trusted.clone();
    let left =
        tokio::task::spawn_blocking(move || waiting_now(listeners[0], &trusted_a, &Desk::new(52)))
            .await
            .unwrap();
    assert!(left.is_empty(), "{left:?}");
    assert!(agent.wait().await.unwrap().success());

    // Hostile retries, raw, on both replicas: states this server never sealed, or altered, or
    // beside confirm fields. Each is refused and nothing runs.
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"url": {}}},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    });
    let forged = format!("csr1.{}.{}", "eyJ0ZW5hbnQiOiJ4In0", "A".repeat(43));
    let huge = format!("csr1.{}.x", "A".repeat(100_000));
    let attempts = [
        json!({"sql": "INSERT INTO notes(body) VALUES ('hostile')"}),
        json!({"sql": "INSERT INTO notes(body) VALUES ('hostile')", "confirm": true}),
    ];
    for port in [a.port, b.port] {
        for state in [forged.as_str(), "csr1..", huge.as_str(), "not a state"] {
            for arguments in &attempts {
                let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                    "params": {"name": "execute", "arguments": arguments,
                               "requestState": state, "_meta": meta}});
                let (status, _, body) = post(
                    port,
                    &[
                        ("MCP-Protocol-Version", "2026-07-28"),
                        ("Mcp-Method", "tools/call"),
                        ("Mcp-Name", "execute"),
                    ],
                    &call.to_string(),
                );
                // Through to the state's chain (not stopped at the door), and refused there.
                assert_eq!(status, 200, "{body}");
                assert_eq!(
                    body["result"]["structuredContent"]["refusal"], "bad_token",
                    "{body}"
                );
            }
        }
    }
    let hostile: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM notes WHERE body = 'hostile'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(hostile, 0, "a hostile requestState ran something");
    drop((a, b, proxy));
}

// ---------------------------------------------------------------------------------------------
// The approver protocol, as docs/approver-protocol.md writes it down.

/// Replicas killed and restarted while a call waits for its person.
mod replicas;

/// The approver protocol document against a real server: a listing has exactly the members and
/// types of the document's example; a decision built, canonicalised, signed and encoded as the
/// document says (its examples and tables, read here; never the crates' own types) is accepted and
/// the agent's call runs; each refusal the document lists is what the server answers, with the
/// status it gives.
mod approver_protocol {
    use super::*;
    use countersign_core::approver::ApproverKey;
    use serde_json::Map;

    /// The document, as the repository holds it.
    fn document() -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/approver-protocol.md");
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The document after its `<!-- marker -->`.
    fn after<'a>(doc: &'a str, marker: &str) -> &'a str {
        let tag = format!("<!-- {marker} -->");
        let at = doc
            .find(&tag)
            .unwrap_or_else(|| panic!("the document has no {tag}"));
        &doc[at + tag.len()..]
    }

    /// The JSON example marked `<!-- example: NAME -->`: the fenced json block after the mark.
    fn example(doc: &str, name: &str) -> Value {
        let rest = after(doc, &format!("example: {name}"));
        let open = rest
            .find("```json")
            .expect("a ```json block after the mark")
            + 7;
        let close = open + rest[open..].find("```").expect("the block's end");
        serde_json::from_str(&rest[open..close]).unwrap_or_else(|e| panic!("example {name}: {e}"))
    }

    /// The rows of the table marked `<!-- table: NAME -->`, header and rule left out.
    fn table(doc: &str, name: &str) -> Vec<Vec<String>> {
        after(doc, &format!("table: {name}"))
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2)
            .map(|l| {
                l.trim()
                    .trim_matches('|')
                    .split('|')
                    .map(|c| c.trim().to_owned())
                    .collect()
            })
            .collect()
    }

    /// The first `code span` of `text`.
    fn code(text: &str) -> Option<&str> {
        let start = text.find('`')? + 1;
        let end = start + text[start..].find('`')?;
        Some(&text[start..end])
    }

    fn kind(v: &Value) -> &'static str {
        match v {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(n) if n.is_u64() || n.is_i64() => "integer",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        }
    }

    /// Where `real` differs from `example` in its members' names and JSON types, nested: an
    /// array's elements each against the example's first; a free-form member by its type alone.
    fn differences(
        path: &str,
        example: &Value,
        real: &Value,
        free: &[&str],
        out: &mut Vec<String>,
    ) {
        if kind(example) != kind(real) {
            out.push(format!(
                "{path}: the document has {}, the server {}",
                kind(example),
                kind(real)
            ));
            return;
        }
        if free.contains(&path) {
            return;
        }
        let join = |k: &str| {
            if path.is_empty() {
                k.to_owned()
            } else {
                format!("{path}.{k}")
            }
        };
        match (example, real) {
            (Value::Object(e), Value::Object(r)) => {
                for k in e.keys().filter(|k| !r.contains_key(*k)) {
                    out.push(format!("{}: in the document, not in the server's", join(k)));
                }
                for k in r.keys().filter(|k| !e.contains_key(*k)) {
                    out.push(format!("{}: in the server's, not in the document", join(k)));
                }
                for (k, ev) in e {
                    if let Some(rv) = r.get(k) {
                        differences(&join(k), ev, rv, free, out);
                    }
                }
            }
            (Value::Array(e), Value::Array(r)) => match e.first() {
                Some(first) => {
                    for rv in r {
                        differences(&format!("{path}[]"), first, rv, free, out);
                    }
                }
                None => out.push(format!("{path}: the document's example array is empty")),
            },
            _ => {}
        }
    }

    /// `real` has exactly the shape of the document's example `name`.
    fn shaped_like(doc: &str, name: &str, real: &Value) {
        let mark = "<!-- free-form:";
        let at = doc
            .find(mark)
            .expect("the document marks the free-form members")
            + mark.len();
        let free_line = doc[at..].lines().next().unwrap_or_default();
        let free: Vec<&str> = free_line
            .trim_end_matches("-->")
            .split_whitespace()
            .collect();
        let mut out = Vec::new();
        differences("", &example(doc, name), real, &free, &mut out);
        assert!(out.is_empty(), "{name}: {out:#?}\nthe server's: {real:#}");
    }

    /// One signed member, as the document's table of them says.
    struct Field {
        /// Its name in the signed object.
        name: String,
        /// `string` or `integer`.
        kind: String,
        /// Its name in the body sent, if sent.
        sent: Option<String>,
        /// Where it comes from: `$.…` in the listing, or what the client chooses.
        from: String,
    }

    /// The domain label (with its line feed) and the signed members, in the canonical order.
    fn signing(doc: &str) -> (String, Vec<Field>) {
        let label = code(after(doc, "value: domain-label")).unwrap();
        assert!(
            after(doc, "value: domain-label").contains("one line feed (0x0A)"),
            "the label is followed by one line feed"
        );
        let fields: Vec<Field> = table(doc, "signed-fields")
            .into_iter()
            .map(|row| Field {
                name: code(&row[0]).unwrap().to_owned(),
                kind: row[1].clone(),
                sent: code(&row[2]).map(str::to_owned),
                from: match code(&row[3]) {
                    Some(path) if path.starts_with("$.") => path.to_owned(),
                    _ => row[3].clone(),
                },
            })
            .collect();
        // RFC 8785: members sorted by their UTF-16 code units; the table says it is in that order.
        let names: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
        assert_eq!(
            names, sorted,
            "the signed members are listed in canonical order"
        );
        (format!("{label}\n"), fields)
    }

    /// The value at `path` (`$.server`, `$.requests[i].request.id`) in `listing`, for its
    /// `item`-th request.
    fn at<'a>(listing: &'a Value, item: usize, path: &str) -> &'a Value {
        let mut here = listing;
        for step in path.strip_prefix("$.").unwrap().split('.') {
            here = match step.strip_suffix("[i]") {
                Some(array) => &here[array][item],
                None => &here[step],
            };
        }
        assert!(!here.is_null(), "{path} is in the listing: {listing}");
        here
    }

    /// The signed values for the `item`-th request of `listing`, with the client's choices.
    fn values(
        fields: &[Field],
        listing: &Value,
        item: usize,
        verdict: &str,
        expires_at_ms: u64,
    ) -> Map<String, Value> {
        fields
            .iter()
            .map(|f| {
                let value = if f.from.starts_with("$.") {
                    at(listing, item, &f.from).clone()
                } else if f.name == "verdict" {
                    assert!(f.from.contains("approve") && f.from.contains("deny"));
                    json!(verdict)
                } else if f.name == "expiresAtMs" {
                    assert!(f.from.contains("600,000"), "{}", f.from);
                    json!(expires_at_ms)
                } else {
                    panic!("the document takes {} from {:?}", f.name, f.from)
                };
                (f.name.clone(), value)
            })
            .collect()
    }

    /// The bytes signed: the label, then the RFC 8785 text of the signed members, written as
    /// the document spells it out (in order, no whitespace, strings escaped minimally).
    fn message(label: &str, fields: &[Field], values: &Map<String, Value>) -> Vec<u8> {
        let members: Vec<String> = fields
            .iter()
            .map(|f| {
                let value = &values[&f.name];
                let text = match f.kind.as_str() {
                    "string" => serde_json::to_string(value.as_str().unwrap()).unwrap(),
                    "integer" => {
                        let n = value.as_u64().unwrap();
                        assert!(n < 1 << 53, "{} is at most 2^53 - 1", f.name);
                        n.to_string()
                    }
                    other => panic!("a signed member of type {other}"),
                };
                format!("{}:{text}", serde_json::to_string(&f.name).unwrap())
            })
            .collect();
        format!("{label}{{{}}}", members.join(",")).into_bytes()
    }

    /// The document's signature of `message` by `key`: Ed25519, in unpadded base64url.
    fn signature(key: &ApproverKey, message: &[u8]) -> String {
        use base64::Engine as _;
        use rcgen::SigningKey as _;
        let pair = rcgen::KeyPair::try_from(key.pkcs8_der().as_slice()).unwrap();
        let signature = pair.sign(message).unwrap();
        assert_eq!(signature.len(), 64);
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(signature)
    }

    /// The body sent: the sent members, then the signature.
    fn body(fields: &[Field], values: &Map<String, Value>, signature: &str) -> Value {
        let mut body: Map<String, Value> = fields
            .iter()
            .filter_map(|f| Some((f.sent.clone()?, values[&f.name].clone())))
            .collect();
        body.insert("signature".into(), json!(signature));
        Value::Object(body)
    }

    /// A decision on the `item`-th request of `listing` by `desk`, from the document alone.
    fn decision(
        doc: &str,
        desk: &Desk,
        listing: &Value,
        item: usize,
        verdict: &str,
        change: impl FnOnce(&mut Map<String, Value>),
    ) -> Value {
        let (label, fields) = signing(doc);
        let mut values = values(&fields, listing, item, verdict, now_ms() + 60_000);
        change(&mut values);
        let signed = signature(&desk.key, &message(&label, &fields, &values));
        body(&fields, &values, &signed)
    }

    #[test]
    fn the_documents_worked_example_and_decisions_are_the_signatures_the_server_checks() {
        let doc = document();
        let vector = example(&doc, "vector");
        let seed: Vec<u8> = (0..32)
            .map(|i| u8::from_str_radix(&vector["seed"].as_str().unwrap()[2 * i..2 * i + 2], 16))
            .collect::<Result<_, _>>()
            .unwrap();
        let key = ApproverKey::from_seed(&seed.try_into().unwrap());
        assert_eq!(
            countersign_core::approver::public_key_text(&key.public()),
            vector["public"].as_str().unwrap()
        );
        let listing = json!({
            "server": vector["listing"]["server"],
            "requests": [{"request": vector["listing"]["request"]}],
        });
        let (label, fields) = signing(&doc);
        for (verdict, name) in [("approve", "decision-approve"), ("deny", "decision-deny")] {
            let expires = vector["expiresAtMs"].as_u64().unwrap();
            let values = values(&fields, &listing, 0, verdict, expires);
            let bytes = message(&label, &fields, &values);
            let signed = signature(&key, &bytes);
            if verdict == "approve" {
                assert_eq!(String::from_utf8(bytes.clone()).unwrap(), vector["message"]);
                assert_eq!(signed, vector["signature"].as_str().unwrap());
            }
            // The bytes are the ones the server checks, and so is the signature.
            let plan = countersign_core::PlanHash::from_hex(values["plan"].as_str().unwrap());
            let plan = plan.unwrap();
            let decision = countersign_core::approver::Decision {
                server: values["server"].as_str().unwrap(),
                request: values["request"].as_u64().unwrap(),
                verdict: if verdict == "approve" {
                    countersign_core::approver::Verdict::Approve
                } else {
                    countersign_core::approver::Verdict::Deny
                },
                plan: &plan,
                tenant: values["tenant"].as_str().unwrap(),
                tool: values["tool"].as_str().unwrap(),
                target: values["target"].as_str().unwrap(),
                class: countersign_core::GateClass::from_code(values["class"].as_str().unwrap())
                    .unwrap(),
                expires_at_ms: expires,
            };
            assert_eq!(decision.signed_bytes(), bytes);
            use base64::Engine as _;
            let raw: [u8; 64] = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(&signed)
                .unwrap()
                .try_into()
                .unwrap();
            assert_eq!(
                countersign_core::approver::verify(&key.public(), &decision, &raw, expires - 1),
                Ok(())
            );
            // The document's decision examples are this decision, sent.
            let mut sent = body(&fields, &values, &signed);
            if verdict == "deny" {
                sent["note"] = example(&doc, name)["note"].clone();
            }
            assert_eq!(sent, example(&doc, name), "{name}");
        }
    }

    /// A kept-open connection to the approver listener at `port` as `desk` (HTTP/1.1 keep-alive),
    /// for what must happen on one connection: a revocation while it is open, two decisions sent
    /// at one moment.
    struct Connection(rustls::StreamOwned<rustls::ClientConnection, TcpStream>);

    impl Connection {
        fn open(
            port: u16,
            trusted: &rustls::pki_types::CertificateDer<'static>,
            desk: &Desk,
        ) -> Self {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(trusted.clone()).unwrap();
            let config = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(
                vec![desk.cert.clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(desk.key.pkcs8_der().to_vec().into()),
            )
            .unwrap();
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let tls = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
            let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(40))).unwrap();
            let mut connection = Connection(rustls::StreamOwned::new(tls, tcp));
            // Through the handshake and one answer: let in.
            let (status, body) = connection.ask("GET", "/approver/v1/requests", "");
            assert_eq!(status, 200, "{body}");
            connection
        }

        fn send(&mut self, method: &str, path: &str, body: &str) {
            let request = format!(
                "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            self.0.write_all(request.as_bytes()).unwrap();
            self.0.flush().unwrap();
        }

        fn answer(&mut self) -> (u16, Value) {
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            let head_end = loop {
                if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                    break at + 4;
                }
                let n = self.0.read(&mut buf).unwrap();
                assert!(n > 0, "the connection ended");
                got.extend_from_slice(&buf[..n]);
            };
            let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
            let status = head.split(' ').nth(1).unwrap().parse().unwrap();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |n| n.trim().parse().unwrap());
            while got.len() < head_end + length {
                let n = self.0.read(&mut buf).unwrap();
                assert!(n > 0, "the connection ended");
                got.extend_from_slice(&buf[..n]);
            }
            let body = &got[head_end..head_end + length];
            (status, serde_json::from_slice(body).unwrap_or(Value::Null))
        }

        fn ask(&mut self, method: &str, path: &str, body: &str) -> (u16, Value) {
            self.send(method, path, body);
            self.answer()
        }
    }

    /// The listing as `desk` reads it once a call waits (long-polling as the document says).
    fn listing_with_a_call(
        port: u16,
        trusted: &rustls::pki_types::CertificateDer<'static>,
        desk: &Desk,
    ) -> Value {
        let mut seen = String::new();
        loop {
            let path = format!("/approver/v1/requests?wait=20&seen={seen}");
            let (status, body) =
                on_approver_listener(port, trusted, Some(desk), "GET", &path, &[], "").unwrap();
            assert_eq!(status, 200, "{body}");
            if body["requests"].as_array().is_some_and(|r| !r.is_empty()) {
                return body;
            }
            seen = body["digest"].as_str().unwrap().to_owned();
        }
    }

    type Asking = tokio::task::JoinHandle<rmcp::model::CallToolResult>;

    fn ask(agent: &Arc<rmcp::service::RunningService<rmcp::RoleClient, ()>>, sql: &str) -> Asking {
        let (agent, arguments) = (agent.clone(), json!({ "sql": sql }));
        tokio::spawn(async move { call(&agent, "execute", arguments).await })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
    async fn a_decision_built_from_the_document_alone_is_approved_and_the_agents_call_runs() {
        let doc = document();
        let dsn = shared_database().await;
        let dir = tempfile::tempdir().unwrap();
        let (cert, key, trusted) = self_signed(dir.path());
        let db = tools_db(dir.path());
        let policy = two_approvers_for_execute(dir.path(), &db);
        let env = [("CONTROL_DSN", dsn.as_str())];
        let (alice, bob) = (Desk::new(61), Desk::new(62));
        add_approvers(&env, &[("alice", &alice), ("bob", &bob)]);
        let (code, agent_key, note) = roster_command("agent", &env, &["add", "ci"]);
        assert_eq!(code, 0, "{note}");
        let port = free_port();
        let url = format!("https://localhost:{port}");
        let mut args = approver_args("--agent-keys", &db, port, &url, &cert, &key);
        args.extend(["--policy".to_owned(), policy.to_str().unwrap().to_owned()]);
        let server = Server::start_before(
            &strs(&args),
            &[
                ("CONFIRM_SECRET", "approver-protocol-secret-0123456789ab"),
                ("CONTROL_DSN", &dsn),
            ],
            Some(&[]),
        );
        let agent = agent_with_key(server.url(), agent_key.trim()).await;
        let delete = json!({"sql": "DELETE FROM notes"});
        let asking = ask(&agent, "DELETE FROM notes");

        // The listing: the document's members and types, nested; its server is the URL.
        let listing = listing_with_a_call(port, &trusted, &alice);
        shaped_like(&doc, "listing", &listing);
        assert_eq!(listing["server"], url.as_str());
        assert_eq!(listing["requests"][0]["approvedBy"], json!([]));
        // The plan hashes to its plan_hash, as a client is told to check.
        let request = &listing["requests"][0]["request"];
        let plan: countersign_core::Plan = serde_json::from_value(request["plan"].clone()).unwrap();
        assert_eq!(plan.hash().unwrap().to_hex(), request["asks"]["plan_hash"]);

        // Alice's approval, from the document: recorded, one of two.
        let approve = decision(&doc, &alice, &listing, 0, "approve", |_| {});
        shaped_like(&doc, "decision-approve", &approve);
        let (status, answer) = alice.send(port, &trusted, &approve);
        assert_eq!(status, 202, "{answer}");
        shaped_like(&doc, "answer-recorded", &answer);
        assert_eq!(
            answer,
            json!({"outcome": "recorded", "approvals": 1, "needed": 2})
        );
        assert!(!asking.is_finished());
        // The listing now names her; a held read with its digest waits, then says the same.
        let (status, now) = on_approver_listener(
            port,
            &trusted,
            Some(&bob),
            "GET",
            "/approver/v1/requests",
            &[],
            "",
        )
        .unwrap();
        assert_eq!(status, 200);
        shaped_like(&doc, "listing", &now);
        assert_eq!(now["requests"][0]["approvedBy"], json!(["alice"]));
        let held = format!(
            "/approver/v1/requests?wait=1&seen={}",
            now["digest"].as_str().unwrap()
        );
        let started = Instant::now();
        let (_, again) =
            on_approver_listener(port, &trusted, Some(&bob), "GET", &held, &[], "").unwrap();
        assert!(started.elapsed() >= Duration::from_millis(900));
        assert_eq!(again["digest"], now["digest"]);

        // Bob's, from the document: approved; the agent's call runs.
        let approve = decision(&doc, &bob, &now, 0, "approve", |_| {});
        let (status, answer) = bob.send(port, &trusted, &approve);
        assert_eq!(status, 200, "{answer}");
        shaped_like(&doc, "answer-approved", &answer);
        assert_eq!(
            answer,
            json!({"outcome": "approved", "approvals": 2, "needed": 2})
        );
        let content = asking.await.unwrap().structured_content.unwrap();
        assert_eq!(content["approved"], true, "{content}");
        let ran = call(&agent, "execute", confirm_of(&delete, &content)).await;
        assert_ne!(ran.is_error, Some(true), "{ran:?}");
        assert_eq!(notes_in(&db), 0, "the approved call ran");

        // A deny with a note, shaped like the document's: the agent is told who and why.
        let asking = ask(&agent, "DELETE FROM notes WHERE id = 7");
        let listing = listing_with_a_call(port, &trusted, &alice);
        let mut deny = decision(&doc, &alice, &listing, 0, "deny", |_| {});
        deny["note"] = json!("not on a Friday");
        shaped_like(&doc, "decision-deny", &deny);
        let (status, answer) = alice.send(port, &trusted, &deny);
        assert_eq!(status, 200, "{answer}");
        shaped_like(&doc, "answer-denied", &answer);
        let denied = asking.await.unwrap();
        assert_eq!(denied.is_error, Some(true), "{denied:?}");
        assert!(
            text_of(&denied).contains("denied by approver alice: not on a Friday"),
            "{denied:?}"
        );
        drop(server);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
    async fn each_refusal_the_document_lists_is_what_serve_answers_with_its_status() {
        let doc = document();
        let statuses: std::collections::BTreeMap<String, u16> = table(&doc, "errors")
            .into_iter()
            .map(|row| (code(&row[0]).unwrap().to_owned(), row[1].parse().unwrap()))
            .collect();
        let error_example = example(&doc, "error");
        let answered = std::cell::RefCell::new(std::collections::BTreeSet::new());
        let refused = |case: &str, code: &str, (status, body): (u16, Value)| {
            let documented = *statuses
                .get(code)
                .unwrap_or_else(|| panic!("{case}: `{code}` is not in the document's table"));
            assert_eq!(
                (status, body["error"].as_str()),
                (documented, Some(code)),
                "{case}: {body}"
            );
            let mut out = Vec::new();
            differences("", &error_example, &body, &[], &mut out);
            assert!(out.is_empty(), "{case}: {out:?}");
            answered.borrow_mut().insert(code.to_owned());
        };

        let postgres = countersign_tests::postgres::PrivateServer::start();
        let dsn = countersign_tests::postgres::fresh_database(&postgres.dsn()).await;
        let dir = tempfile::tempdir().unwrap();
        let (cert, key, trusted) = self_signed(dir.path());
        let db = tools_db(dir.path());
        let env = [("CONTROL_DSN", dsn.as_str())];
        let (alice, bob, carol) = (Desk::new(71), Desk::new(72), Desk::new(73));
        add_approvers(&env, &[("alice", &alice), ("bob", &bob), ("carol", &carol)]);
        let port = free_port();
        let url = format!("https://localhost:{port}");
        let args = approver_args("--unauthenticated", &db, port, &url, &cert, &key);
        let server = Server::start_before(
            &strs(&args),
            &[
                ("CONFIRM_SECRET", "approver-protocol-errors-0123456789ab"),
                ("CONTROL_DSN", &dsn),
            ],
            Some(&[]),
        );
        let agent = Arc::new(agent(&server.url()).await);
        let asking = ask(&agent, "DELETE FROM notes");
        let listing = listing_with_a_call(port, &trusted, &alice);
        let number = listing["requests"][0]["request"]["id"].as_u64().unwrap();
        let post = |desk: &Desk, body: &str| {
            on_approver_listener(
                port,
                &trusted,
                Some(desk),
                "POST",
                "/approver/v1/decisions",
                &[],
                body,
            )
            .unwrap()
        };
        let good = decision(&doc, &alice, &listing, 0, "approve", |_| {});
        let with = |change: &dyn Fn(&mut Value)| {
            let mut body = good.clone();
            change(&mut body);
            body.to_string()
        };

        // Size: one byte over the limit; at the limit it is read (and refused for what it says).
        refused(
            "over 16,384 bytes",
            "too_large",
            post(&alice, &" ".repeat(16_385)),
        );
        let elsewhere = decision(&doc, &alice, &listing, 0, "approve", |v| {
            v["request"] = json!(number + 1_000_000)
        })
        .to_string();
        let padded = format!("{elsewhere}{}", " ".repeat(16_384 - elsewhere.len()));
        refused("at 16,384 bytes", "not_pending", post(&alice, &padded));
        // Not a decision's members.
        let text = good.to_string();
        let twice = format!(
            "{},\"plan\":\"{}\"}}",
            &text[..text.len() - 1],
            "ab".repeat(32)
        );
        for (case, body) in [
            ("not JSON", "{".to_owned()),
            ("an array", "[]".to_owned()),
            ("another member", with(&|b| b["server"] = json!(url))),
            ("a member twice", twice),
            (
                "a member missing",
                with(&|b| {
                    b.as_object_mut().unwrap().remove("tenant");
                }),
            ),
            (
                "a number as a string",
                with(&|b| b["request"] = json!(number.to_string())),
            ),
            ("another verdict", with(&|b| b["verdict"] = json!("maybe"))),
            (
                "a plan in capitals",
                with(&|b| b["plan"] = json!(b["plan"].as_str().unwrap().to_uppercase())),
            ),
            ("no such class", with(&|b| b["class"] = json!("never"))),
            ("a long note", with(&|b| b["note"] = json!("n".repeat(501)))),
        ] {
            refused(case, "malformed", post(&alice, &body));
        }
        // Unsigned, or a signature not in the document's encoding.
        for (case, body) in [
            (
                "no signature",
                with(&|b| {
                    b.as_object_mut().unwrap().remove("signature");
                }),
            ),
            ("a null signature", with(&|b| b["signature"] = Value::Null)),
            (
                "padded base64url",
                with(&|b| {
                    b["signature"] = json!(format!("{}==", b["signature"].as_str().unwrap()))
                }),
            ),
            (
                "63 bytes",
                with(&|b| b["signature"] = json!(&b["signature"].as_str().unwrap()[..84])),
            ),
        ] {
            refused(case, "unsigned", post(&alice, &body));
        }
        // Signatures that do not hold on this connection, for this server, over what is sent.
        let bobs = decision(&doc, &bob, &listing, 0, "approve", |_| {});
        refused(
            "Bob's, on Alice's connection",
            "bad_signature",
            post(&alice, &bobs.to_string()),
        );
        let other = decision(&doc, &alice, &listing, 0, "approve", |v| {
            v["server"] = json!("https://other.example.com:9443")
        });
        refused(
            "for another server",
            "bad_signature",
            post(&alice, &other.to_string()),
        );
        let swapped = with(&|b| b["tool"] = json!("drop_table"));
        refused(
            "a sent field changed",
            "bad_signature",
            post(&alice, &swapped),
        );
        let stale_and_bad = decision(&doc, &bob, &listing, 0, "approve", |v| {
            v["expiresAtMs"] = json!(1_000)
        });
        refused(
            "expired and badly signed",
            "bad_signature",
            post(&alice, &stale_and_bad.to_string()),
        );
        // Times.
        let stale = decision(&doc, &alice, &listing, 0, "approve", |v| {
            v["expiresAtMs"] = json!(now_ms() - 1_000)
        });
        refused("expired", "expired", post(&alice, &stale.to_string()));
        let lasting = decision(&doc, &alice, &listing, 0, "approve", |v| {
            v["expiresAtMs"] = json!(now_ms() + 11 * 60_000)
        });
        refused(
            "eleven minutes",
            "expires_too_late",
            post(&alice, &lasting.to_string()),
        );
        // Another call than the one waiting, signed as such.
        for (case, member, value) in [
            ("another target", "target", json!("users")),
            ("another tenant", "tenant", json!("key:mallory@server:x")),
            ("another plan", "plan", json!("cd".repeat(32))),
            ("another class", "class", json!("token")),
            ("an open class", "class", json!("open")),
        ] {
            let body = decision(&doc, &alice, &listing, 0, "approve", |v| v[member] = value);
            refused(case, "does_not_match", post(&alice, &body.to_string()));
        }
        refused("no such call", "not_pending", post(&alice, &elsewhere));
        // None of that counted. The good one does; sent again, nothing waits.
        let (status, answer) = post(&alice, &good.to_string());
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["outcome"], "approved");
        assert_eq!(
            asking.await.unwrap().structured_content.unwrap()["approved"],
            true
        );
        refused(
            "decided already",
            "not_pending",
            post(&alice, &good.to_string()),
        );

        // Two decisions at one moment on one call: one counts, the other is `decided` (or, if it
        // came after, `not_pending`).
        for round in 0.. {
            assert!(round < 10, "no two decisions met in ten rounds");
            let asking = ask(&agent, &format!("DELETE FROM notes WHERE id = {round}"));
            let listing = listing_with_a_call(port, &trusted, &alice);
            let mut pair = [
                (
                    Connection::open(port, &trusted, &alice),
                    decision(&doc, &alice, &listing, 0, "approve", |_| {}),
                ),
                (
                    Connection::open(port, &trusted, &bob),
                    decision(&doc, &bob, &listing, 0, "deny", |_| {}),
                ),
            ];
            for (connection, body) in &mut pair {
                connection.send("POST", "/approver/v1/decisions", &body.to_string());
            }
            let answers: Vec<(u16, Value)> = pair.iter_mut().map(|(c, _)| c.answer()).collect();
            asking.await.unwrap();
            let (won, lost): (Vec<_>, Vec<_>) = answers.into_iter().partition(|(s, _)| *s == 200);
            assert_eq!((won.len(), lost.len()), (1, 1), "{won:?} {lost:?}");
            let (status, body) = lost.into_iter().next().unwrap();
            if body["error"] == "decided" {
                refused("two at one moment", "decided", (status, body));
                break;
            }
            refused("two, one after the other", "not_pending", (status, body));
        }

        // Revoked while connected: every request on the open connection is refused, then the
        // handshake is.
        let mut open = Connection::open(port, &trusted, &carol);
        let (code, _, note) = roster_command("approver", &env, &["revoke", "carol"]);
        assert_eq!(code, 0, "{note}");
        refused(
            "reading, revoked",
            "approver_revoked",
            open.ask("GET", "/approver/v1/requests", ""),
        );
        let carols = decision(&doc, &carol, &listing, 0, "approve", |_| {});
        refused(
            "deciding, revoked",
            "approver_revoked",
            open.ask("POST", "/approver/v1/decisions", &carols.to_string()),
        );
        countersign_tests::postgres::wait_until(
            "the handshake refused",
            Duration::from_secs(10),
            || {
                on_approver_listener(
                    port,
                    &trusted,
                    Some(&carol),
                    "GET",
                    "/approver/v1/requests",
                    &[],
                    "",
                )
                .is_err()
            },
        );

        // `bad_key` cannot be answered: the roster takes no key that is not a usable Ed25519 key
        // (the identity point here), and the handshake lets in only the roster's keys.
        use base64::Engine as _;
        let mut identity = [0u8; 32];
        identity[0] = 1;
        let weak = format!(
            "ed25519:{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(identity)
        );
        let (code, _, note) = roster_command("approver", &env, &["add", "weak", &weak]);
        assert_eq!(code, 2, "{note}");
        assert!(note.contains("bad_key"), "{note}");
        assert!(after(&doc, "table: errors").contains("Never answered today"));
        answered.borrow_mut().insert("bad_key".to_owned());

        // The records down: reading and deciding are refused, nothing decided.
        postgres.stop_immediately();
        let asked = on_approver_listener(
            port,
            &trusted,
            Some(&alice),
            "GET",
            "/approver/v1/requests",
            &[],
            "",
        );
        refused(
            "reading, records down",
            "records_unavailable",
            asked.unwrap(),
        );
        refused(
            "deciding, records down",
            "records_unavailable",
            post(&alice, &good.to_string()),
        );

        let listed: std::collections::BTreeSet<String> = statuses.keys().cloned().collect();
        assert_eq!(
            answered.into_inner(),
            listed,
            "each code the document lists, and only those"
        );
        drop(server);
    }
}

/// The structured content of a refused call: its `refusal` code.
fn refusal_of(result: &rmcp::model::CallToolResult) -> Value {
    result
        .structured_content
        .as_ref()
        .map(|c| c["refusal"].clone())
        .unwrap_or(Value::Null)
}

/// Issue 29, item 2: the control database down is said as an outage (`ledger_unreachable`: retry
/// shortly, nothing was executed) to every kind of call, never as a changed tool; once it is back,
/// the same server, never restarted, serves them all again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn the_control_database_down_is_an_outage_to_every_call_and_the_same_server_serves_again_once_it_is_back()
 {
    let postgres = countersign_tests::postgres::PrivateServer::start();
    let dsn = countersign_tests::postgres::fresh_database(&postgres.dsn()).await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, trusted) = self_signed(dir.path());
    let db = tools_db(dir.path());
    let alice = Desk::new(29);
    let env = [("CONTROL_DSN", dsn.as_str())];
    let (code, _, note) = roster_command("approver", &env, &["add", "alice", &alice.public_text()]);
    assert_eq!(code, 0, "{note}");
    let port = free_port();
    let url = format!("https://localhost:{port}");
    let operator = free_port();
    let mut args = approver_args("--unauthenticated", &db, port, &url, &cert, &key);
    args.extend([
        "--operator-listen".to_owned(),
        format!("127.0.0.1:{operator}"),
    ]);
    let server = Server::start_before(
        &strs(&args),
        &[
            ("CONFIRM_SECRET", "outage-said-as-outage-0123456789abcdef"),
            ("CONTROL_DSN", &dsn),
        ],
        Some(&[]),
    );
    let agent = Arc::new(agent(&server.url()).await);
    let delete = json!({"sql": "DELETE FROM notes"});
    // A works-once token, approved at alice's desk before the outage.
    let asking = {
        let (agent, delete) = (agent.clone(), delete.clone());
        tokio::spawn(async move { call(&agent, "execute", delete).await })
    };
    let trusting = trusted.clone();
    let clicked = tokio::task::spawn_blocking(move || Desk::new(29).approve_first(port, &trusting))
        .await
        .unwrap();
    assert_eq!(clicked.0, 200, "{clicked:?}");
    let content = asking.await.unwrap().structured_content.unwrap();
    assert_eq!(content["approved"], true, "{content}");
    let query = json!({"sql": "SELECT count(*) FROM notes"});
    assert_ne!(
        call(&agent, "query", query.clone()).await.is_error,
        Some(true)
    );

    postgres.stop_immediately();
    assert_eq!(operator_get(operator, "/readyz", &[]).0, 503);
    // tools/list: a JSON-RPC error that says the outage (a listing would be cached by the
    // client, and an empty or held-back one says something untrue about the tools).
    let listed = agent.list_all_tools().await;
    let Err(rmcp::ServiceError::McpError(error)) = &listed else {
        panic!("a listing during the outage: {listed:?}");
    };
    assert_eq!(
        error.data.as_ref().map(|d| d["error"].clone()),
        Some(json!("ledger_unreachable")),
        "{error:?}"
    );
    assert!(
        error.message.contains("Retry shortly") && !error.message.contains("held back"),
        "{error:?}"
    );
    // An open call, a gated preflight, and the confirm of the token approved before.
    let outage_calls = [
        ("query", query.clone()),
        ("execute", json!({"sql": "DELETE FROM notes WHERE id = 1"})),
        ("execute", confirm_of(&delete, &content)),
    ];
    for (tool, arguments) in &outage_calls {
        let refused = call(&agent, tool, arguments.clone()).await;
        assert_eq!(refused.is_error, Some(true), "{tool}: {refused:?}");
        assert_eq!(
            refusal_of(&refused),
            json!("ledger_unreachable"),
            "{tool}: {refused:?}"
        );
        let text = text_of(&refused);
        assert!(
            text.contains("Nothing was executed") && text.contains("Retry shortly"),
            "{text}"
        );
        assert!(!text.contains("Countersign desk"), "{text}");
    }
    assert_eq!(notes_in(&db), 1, "nothing ran while the records were down");
    assert!(
        !server
            .log()
            .contains("tool definition differs from its pin"),
        "an outage is never taken for a changed tool: {}",
        server.log()
    );

    // Back, and the same server serves every kind of call again.
    postgres.start_again();
    countersign_tests::postgres::wait_until("ready again", Duration::from_secs(30), || {
        operator_get(operator, "/readyz", &[]).0 == 200
    });
    let tools = agent.list_all_tools().await.unwrap();
    assert!(
        tools.iter().any(|t| t.name == "query") && tools.iter().any(|t| t.name == "execute"),
        "{tools:?}"
    );
    assert_ne!(call(&agent, "query", query).await.is_error, Some(true));
    let done = call(&agent, "execute", confirm_of(&delete, &content)).await;
    assert_ne!(
        done.is_error,
        Some(true),
        "the token approved before the outage was never spent: {done:?}"
    );
    assert_eq!(notes_in(&db), 0);
    let again = call(&agent, "execute", confirm_of(&delete, &content)).await;
    assert_eq!(refusal_of(&again), json!("already_used"), "{again:?}");
    drop(server);
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
