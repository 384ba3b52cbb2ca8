//! The seed's start rules, as `countersign serve` meets them: a refusal never binds the port;
//! TLS; the secret and the database password never in anything the server writes.

use super::*;

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

/// Issue 32, rules over arguments on a team's server: `--rules` that do not parse refuse the
/// start with the line and the code; rules that load forbid some calls of an open tool by what
/// they carry (on a read-only server, too), while its other calls run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_that_do_not_parse_refuse_the_start_and_rules_that_do_forbid_calls_by_their_arguments()
 {
    let dir = tempfile::tempdir().unwrap();
    let db = tools_db(dir.path());
    let bad = dir.path().join("bad.cedar");
    std::fs::write(
        &bad,
        "@class(\"open\")\npermit (principal, action, resource\n",
    )
    .unwrap();
    let stderr = refused_without_binding(
        &bin("countersign-serve"),
        &[
            "--read-only",
            "--behind-tls-proxy",
            "--unauthenticated",
            "--db",
            db.to_str().unwrap(),
            "--rules",
            bad.to_str().unwrap(),
        ],
        &[],
    );
    assert!(stderr.contains("policy_parse"), "{stderr}");
    assert!(stderr.contains("line 2"), "{stderr}");

    let rules = dir.path().join("rules.cedar");
    std::fs::write(
        &rules,
        "@reason(\"the secret table is not for agents\")\n\
         forbid (principal, action == Countersign::Action::\"query\", resource)\n\
         when { context.arguments.sql like \"*secret*\" };\n",
    )
    .unwrap();
    let server = Server::start_before(
        &[
            "--read-only",
            "--behind-tls-proxy",
            "--unauthenticated",
            "--db",
            db.to_str().unwrap(),
            "--rules",
            rules.to_str().unwrap(),
        ],
        &[],
        Some(&[]),
    );
    let agent = agent(&server.url()).await;
    let fine = call(&agent, "query", json!({"sql": "SELECT body FROM notes"})).await;
    assert_ne!(fine.is_error, Some(true), "{fine:?}");
    assert!(
        format!("{:?}", fine.structured_content).contains("hello"),
        "{fine:?}"
    );
    let secret = call(&agent, "query", json!({"sql": "SELECT * FROM secret"})).await;
    assert_eq!(refusal_of(&secret), json!("policy_forbidden"), "{secret:?}");
    assert!(
        text_of(&secret).contains("the secret table is not for agents"),
        "{secret:?}"
    );
    agent.cancel().await.unwrap();
}
