//! People approving from their desks: only decisions signed by enough registered approvers over
//! the waiting call mint, and a person's click in the real desk window.

use super::*;

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

    // Alice approves: one of two. Again: still one (distinct people), and not kept twice. Bob:
    // minted.
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
        [("alice", "approve"), ("bob", "approve"), ("bob", "deny")]
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
                match &d.evidence {
                    countersign_store::Evidence::Desk { signature } => signature,
                    other => panic!("a desk's decision kept as {other:?}"),
                },
                d.decided_at_ms
            ),
            Ok(())
        );
    }
    // Each waiting call was announced to both webhooks, without its arguments.
    countersign_tests::postgres::wait_until("four notices", Duration::from_secs(20), || {
        countersign_core::sync::lock(&notices).len() >= 4
    });
    let notices = countersign_core::sync::lock(&notices).clone();
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
    assert_eq!(decided.len(), 3, "{lines}");
    // Newest first, as the history.
    assert_eq!(decided[2]["approver"], "alice");
    assert_eq!(decided[2]["approverKey"], alice.public_text().as_str());
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
