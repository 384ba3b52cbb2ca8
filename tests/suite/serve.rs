//! `countersign serve`, as a team's agents and operators meet it: the real binary, started as a
//! process, reached over TCP (plain and TLS), with the built-in tools as its upstream and (for a
//! writable server) a throwaway PostgreSQL server as its control database.
//!
//! What is tried: the seed's start rules (a refusal never binds the port, and `countersign serve`
//! refuses alike); the secret and the database password never in anything the server writes;
//! read-only serving only open tools; the HTTP edges (Host, Origin, methods, media types, size,
//! protocol revision, hostile JSON-RPC) refused before anything reaches the engine or upstream.
//!
//! This file holds what the tests share (the server as a process, HTTP exchanges, agents, the
//! test's own OAuth issuer, replicas on one database); the tests sit in one module per concern.
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

mod across_replicas;
mod approver_protocol;
mod approvers;
mod auth;
mod budgets;
mod edges;
mod operator;
mod outage;
mod passkeys;
mod replicas;
mod rules;
mod start;
mod upstreams;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use countersign_tests::approver::{Desk, first_waiting, now_ms, on_approver_listener, waiting_now};
use countersign_tests::ports::free_port;
use countersign_tests::postgres::shared_database;
use countersign_tests::window::bin;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::{Value, json};

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

/// A running server, killed when dropped; its stderr kept for the test to read.
struct Server {
    child: Child,
    port: u16,
    log: Arc<std::sync::Mutex<Vec<u8>>>,
    /// Told each time the log grows.
    logged: Arc<std::sync::Condvar>,
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
        let logged = Arc::new(std::sync::Condvar::new());
        let mut stderr = child.stderr.take().unwrap();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (sink, grew) = (log.clone(), logged.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            let mut told = false;
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut log = countersign_core::sync::lock(&sink);
                log.extend_from_slice(&buf[..n]);
                grew.notify_all();
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
            logged,
            _dir: dir,
        };
        assert!(ready.is_ok(), "the server did not start: {}", server.log());
        server
    }

    fn log(&self) -> String {
        String::from_utf8_lossy(&countersign_core::sync::lock(&self.log)).into_owned()
    }

    /// Waits (up to `limit`) until `text` is in the log `times` times, woken as the log grows
    /// (no polling); panics with the log if it never is.
    fn until_logged(&self, text: &str, times: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut log = countersign_core::sync::lock(&self.log);
        while String::from_utf8_lossy(&log).matches(text).count() < times {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "{text:?} not logged {times} times within {limit:?}: {}",
                String::from_utf8_lossy(&log)
            );
            log = self
                .logged
                .wait_timeout(log, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Stops it and hands back everything it wrote.
    fn stop(mut self) -> String {
        // SAFETY: kill takes plain integers; the pid is our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        // Given 10 s to stop on its own (it removes its temporary directory), then made to.
        countersign_tests::group::exits_within(self.child.id(), Duration::from_secs(10));
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
        // SAFETY: kill takes plain integers; the pid is our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        // Its exit, on the kernel's word (a pidfd), for up to 5 s; then made to.
        if !countersign_tests::group::exits_within(self.child.id(), Duration::from_secs(5)) {
            let _ = self.child.kill();
        }
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

fn self_signed(dir: &Path) -> (PathBuf, PathBuf, rustls::pki_types::CertificateDer<'static>) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    (cert, key, certified.cert.der().clone())
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
            countersign_core::sync::lock(&sink)
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

/// The structured content of a refused call: its `refusal` code.
fn refusal_of(result: &rmcp::model::CallToolResult) -> Value {
    result
        .structured_content
        .as_ref()
        .map(|c| c["refusal"].clone())
        .unwrap_or(Value::Null)
}
