//! Stateless replicas on one database: a works-once token raced across two replicas runs once, a
//! call asked on one is approved through another, and a re-ask or a 2026-07-28 retry on another
//! replica finds the one call the desks see.
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

use super::*;

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
    // SAFETY: kill takes plain integers; the pid is our own child, not yet reaped.
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
    let python = countersign_tests::peers::python();
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
