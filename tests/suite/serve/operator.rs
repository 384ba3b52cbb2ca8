//! The operator listener: Prometheus counts of what the server decided, health, and nothing
//! served to agents.

use super::*;

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
