//! Issue 32, budgets that hold across replicas: 64 agents of one tenant, half on each of two
//! `countersign-serve` replicas on one PostgreSQL database, call at once an `execute` the rules
//! open within a budget of 5 per hour. Exactly 5 run; the other 59 are refused `budget_spent`
//! (the rule says to refuse past it), each naming the rule and when the window resets. Real
//! processes, a real database, real MCP clients over streamable HTTP.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn sixty_four_agents_across_two_replicas_against_a_budget_of_five_run_exactly_five() {
    let dsn = shared_database().await;
    let dir = tempfile::tempdir().unwrap();
    let db = tools_db(dir.path());
    let rules = dir.path().join("rules.cedar");
    std::fs::write(
        &rules,
        "@class(\"open\") @budget(\"5\") @budget_minutes(\"60\") @budget_past(\"refuse\")\n\
         permit (principal, action == Countersign::Action::\"execute\", resource)\n\
         when { context.arguments.sql like \"INSERT INTO notes*\" && !(context.arguments.sql like \"*;*\") };\n",
    )
    .unwrap();
    let env = [("CONTROL_DSN", dsn.as_str())];
    let (code, agent_key, note) = roster_command("agent", &env, &["add", "ci"]);
    assert_eq!(code, 0, "{note}");
    let agent_key = agent_key.trim().to_owned();
    let env = [
        ("CONFIRM_SECRET", "budget-race-secret-0123456789abcdef"),
        ("CONTROL_DSN", dsn.as_str()),
    ];
    let args = [
        "--behind-tls-proxy",
        "--agent-keys",
        "--db",
        db.to_str().unwrap(),
        "--rules",
        rules.to_str().unwrap(),
    ];
    let (a, b) = (
        Server::start_before(&args, &env, Some(&[])),
        Server::start_before(&args, &env, Some(&[])),
    );
    let mut agents = Vec::new();
    for n in 0..64 {
        let url = if n % 2 == 0 { a.url() } else { b.url() };
        agents.push(agent_with_key(url, &agent_key).await);
    }
    // Every agent is connected and listed; then all call at once.
    let start = Arc::new(tokio::sync::Barrier::new(agents.len()));
    let calls: Vec<_> = agents
        .iter()
        .enumerate()
        .map(|(n, agent)| {
            let (agent, start) = (agent.clone(), start.clone());
            tokio::spawn(async move {
                agent.list_all_tools().await.unwrap();
                start.wait().await;
                let sql = format!("INSERT INTO notes(body) VALUES ('agent {n}')");
                let arguments = json!({ "sql": sql }).as_object().unwrap().clone();
                agent
                    .call_tool(CallToolRequestParams::new("execute").with_arguments(arguments))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let (mut ran, mut spent) = (0, 0);
    for call in calls {
        let result = call.await.unwrap();
        if result.is_error != Some(true) {
            ran += 1;
            continue;
        }
        assert_eq!(refusal_of(&result), json!("budget_spent"), "{result:?}");
        let said = text_of(&result);
        assert!(said.contains("5 calls per 60 minutes"), "{said}");
        assert!(said.contains("resets in"), "{said}");
        spent += 1;
    }
    assert_eq!((ran, spent), (5, 59), "exactly the budget ran");
    // The table holds its first row and the five, whichever replica ran them.
    assert_eq!(notes_in(&db), 6);
    for agent in agents {
        if let Ok(agent) = Arc::try_unwrap(agent) {
            let _ = agent.cancel().await;
        }
    }
    drop((a, b));
}
