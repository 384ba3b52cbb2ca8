//! Issue 32, a team server's rules over arguments: an edit of the `--rules` file never takes
//! effect on its own. It waits for `--rules-approvers` approvers, who are shown it as a change
//! (old beside new, and what it widens as the solver found it) through the same signed decisions
//! as calls; approved, it is in force on every replica; a text that does not load is never
//! proposed. Real processes, a real database, real MCP clients over streamable HTTP, the cvc5
//! that `.ci/setup tests` installs.

use super::*;
use countersign_core::approver::Verdict;

const NO_DROP: &str = "@id(\"no-drop\") @reason(\"no DROP from agents\")\n\
forbid (principal, action == Countersign::Action::\"execute\", resource)\n\
when { context.arguments.sql like \"*DROP*\" };\n";

const OPEN_INSERTS: &str = "@id(\"open-inserts\") @class(\"open\")\n\
permit (principal, action == Countersign::Action::\"execute\", resource)\n\
when { context.arguments.sql like \"INSERT INTO notes*\" && !(context.arguments.sql like \"*;*\") };\n";

/// The change of the rules the approver listener at `port` lists, once one is listed.
fn listed_change(
    port: u16,
    trusted: &rustls::pki_types::CertificateDer<'static>,
    desk: &Desk,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(change) = waiting_now(port, trusted, desk)
            .into_iter()
            .find(|r| r["asks"]["kind"] == "change")
        {
            return change;
        }
        assert!(
            Instant::now() < deadline,
            "no change of the rules was listed within 90 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn a_rules_edit_waits_for_two_approvers_shown_with_what_it_widens_then_opens_the_call_on_every_replica()
 {
    let dsn = shared_database().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, trusted) = self_signed(dir.path());
    let db = tools_db(dir.path());
    let (alice, bob) = (Desk::new(61), Desk::new(62));
    let env = [("CONTROL_DSN", dsn.as_str())];
    add_approvers(&env, &[("alice", &alice), ("bob", &bob)]);
    let rules = dir.path().join("policy.cedar");
    std::fs::write(&rules, NO_DROP).unwrap();
    let solver = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/peers/bin/cvc5");
    let solver = std::env::var("CVC5").unwrap_or_else(|_| solver.to_string_lossy().into_owned());
    let listeners = [free_port(), free_port()];
    let url = format!("https://localhost:{}", listeners[0]);
    let env = [
        ("CONFIRM_SECRET", "team-rules-secret-0123456789abcdef"),
        ("CONTROL_DSN", dsn.as_str()),
        ("CVC5", solver.as_str()),
    ];
    let replica = |port: u16| {
        let mut args = approver_args("--unauthenticated", &db, port, &url, &cert, &key);
        args.extend(
            ["--rules", rules.to_str().unwrap(), "--rules-approvers", "2"].map(String::from),
        );
        Server::start_before(&strs(&args), &env, Some(&[]))
    };
    let (a, b) = (replica(listeners[0]), replica(listeners[1]));
    let insert = json!({"sql": "INSERT INTO notes(body) VALUES ('by the rules')"});

    // Before: the INSERT waits for a person (alice denies it, to end it).
    let agent_b = Arc::new(agent(&b.url()).await);
    let asking = {
        let (agent, insert) = (agent_b.clone(), insert.clone());
        tokio::spawn(async move { call(&agent, "execute", insert).await })
    };
    let (port, trusted_a) = (listeners[0], trusted.clone());
    let denied = tokio::task::spawn_blocking(move || {
        let alice = Desk::new(61);
        let request = first_waiting(port, &trusted_a, &alice);
        assert_eq!(request["asks"]["kind"], "call", "{request}");
        let url = format!("https://localhost:{port}");
        let decision = alice.decide(&url, &request, Verdict::Deny, |_| {});
        alice.send(port, &trusted_a, &decision)
    })
    .await
    .unwrap();
    assert_eq!(denied.0, 200, "{denied:?}");
    assert_eq!(asking.await.unwrap().is_error, Some(true));

    // The edit: proposed to the approvers, not in force.
    let widened = format!("{NO_DROP}\n{OPEN_INSERTS}");
    std::fs::write(&rules, &widened).unwrap();
    let (port, trusted_b) = (listeners[1], trusted.clone());
    let change =
        tokio::task::spawn_blocking(move || listed_change(port, &trusted_b, &Desk::new(62)))
            .await
            .unwrap();
    // Both replicas read the same file: each proposes the edit, and both are linked to the one
    // row desks see, whose approvals count together (a second row would split them).
    let waits_as = "a rules change waits for the approvers as request ";
    let numbers: Vec<String> = [&a, &b]
        .iter()
        .map(|server| {
            server.until_logged(waits_as, 1, Duration::from_secs(30));
            let log = server.log();
            let after = &log[log.find(waits_as).unwrap() + waits_as.len()..];
            after.chars().take_while(char::is_ascii_digit).collect()
        })
        .collect();
    assert_eq!(numbers[0], numbers[1], "one row for both replicas");
    assert_eq!(numbers[0], change["id"].to_string(), "{change}");
    let asks = &change["asks"];
    assert_eq!(asks["tenant"], "change", "{change}");
    assert_eq!(asks["class"], "once", "{change}");
    assert_eq!(asks["approvers"], 2, "{change}");
    assert_eq!(asks["change"]["before"], NO_DROP, "{change}");
    assert_eq!(asks["change"]["after"], widened.as_str(), "{change}");
    let analysis = asks["change"]["analysis"].as_str().unwrap();
    assert!(
        analysis.starts_with("It widens") && analysis.contains("execute"),
        "the approvers are told what it widens: {analysis}"
    );
    // The plan names both texts by hash: what is signed is what was shown.
    let plan: countersign_core::Plan = serde_json::from_value(change["plan"].clone()).unwrap();
    assert_eq!(
        plan.details["after_sha256"],
        countersign_engine::text_hash(&widened)
    );
    assert_eq!(
        plan.hash().unwrap().to_hex(),
        asks["plan_hash"].as_str().unwrap()
    );

    // A decision over other text (another plan hash) is refused; one approval of two is not
    // enough.
    let decide = |desk: Desk, port: u16, change: Value, tamper: bool| {
        let trusted = trusted.clone();
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            let decision = desk.decide(&url, &change, Verdict::Approve, |fields| {
                if tamper {
                    fields.plan = countersign_core::PlanHash::of_bytes(b"other rules");
                }
            });
            desk.send(port, &trusted, &decision)
        })
    };
    let tampered = decide(Desk::new(61), listeners[0], change.clone(), true)
        .await
        .unwrap();
    assert_eq!(tampered.0, 409, "{tampered:?}");
    assert_eq!(tampered.1["error"], "does_not_match", "{tampered:?}");
    let first = decide(Desk::new(61), listeners[0], change.clone(), false)
        .await
        .unwrap();
    assert_eq!(first.0, 202, "{first:?}");
    let client = countersign_tests::postgres::admin(&dsn).await;
    let on_record = || async {
        client
            .query_one(
                "SELECT text FROM accepted_file WHERE name = 'policy.cedar'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, String>(0)
    };
    assert_eq!(
        on_record().await,
        NO_DROP,
        "one approval of two changes nothing"
    );

    // The second approval (through the other replica): on record, in force on both.
    let second = decide(Desk::new(62), listeners[1], change.clone(), false)
        .await
        .unwrap();
    assert_eq!(second.0, 200, "{second:?}");
    for server in [&a, &b] {
        server.until_logged(
            "the rules on record changed: in force here now",
            1,
            Duration::from_secs(30),
        );
    }
    assert_eq!(on_record().await, widened);
    for server in [&a, &b] {
        let agent = agent(&server.url()).await;
        let ran = call(&agent, "execute", insert.clone()).await;
        assert_ne!(ran.is_error, Some(true), "{ran:?}");
    }
    assert_eq!(
        notes_in(&db),
        3,
        "the INSERT ran on each replica without a click (beside the one row there was)"
    );
    // DROP stays forbidden.
    let agent = agent(&a.url()).await;
    let dropped = call(&agent, "execute", json!({"sql": "DROP TABLE notes"})).await;
    assert_eq!(
        refusal_of(&dropped),
        json!("policy_forbidden"),
        "{dropped:?}"
    );

    // A text that does not load is never proposed; the rules on record stay.
    std::fs::write(&rules, "permit (principal, action, resource) when {").unwrap();
    a.until_logged(
        "does not load, so it is not proposed",
        1,
        Duration::from_secs(30),
    );
    let listed = waiting_now(listeners[0], &trusted, &alice);
    assert!(
        listed.iter().all(|r| r["asks"]["kind"] != "change"),
        "{listed:?}"
    );
    assert_eq!(on_record().await, widened);
    drop((a, b, bob));
}
