//! Who gets in: OAuth bearer tokens of the configured issuer for this resource, and agent keys;
//! the tenant is the token's subject, never what the agent says.

use super::*;

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

    // Revoked: refused within 2 s (a replica takes a key it read active for at most
    // AGENT_KEY_FRESH), and from then on; the other agent keeps working.
    let (code, _, note) = agent_command(&data, &["revoke", "ci-runner"]);
    let revoked = Instant::now();
    assert_eq!(code, 0, "{note}");
    while list_with(port, Some(&key)).0 != 401 {
        assert!(
            revoked.elapsed() < Duration::from_secs(2),
            "a revoked key still got in after 2 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for _ in 0..3 {
        assert_eq!(list_with(port, Some(&key)).0, 401);
    }
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
