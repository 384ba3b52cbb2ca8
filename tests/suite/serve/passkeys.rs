//! Issue 31: approving from any device. The approvers' page of `countersign serve`, in Debian's
//! Chromium (headless, a phone's 390×844 screen) through ChromeDriver, with the WebDriver virtual
//! authenticator as the person's passkey: enrolled by a one-time invite, signed in, a call
//! waiting on one replica approved through the page another replica serves, the agent's call
//! run once, the kept decision proven offline from the exported roster; a deny with a note.

use super::*;
use countersign_tests::browser::Browser;
use fantoccini::Locator;

/// A writable server's arguments (as `approver_args`) with the approvers' page on `web`,
/// answering as `origin`.
fn page_args(
    db: &Path,
    listen: u16,
    url: &str,
    (cert, key): (&Path, &Path),
    web: u16,
    origin: &str,
) -> Vec<String> {
    let mut args = approver_args("--unauthenticated", db, listen, url, cert, key);
    args.extend([
        "--approver-web".to_owned(),
        format!("127.0.0.1:{web}"),
        "--approver-web-origin".to_owned(),
        origin.to_owned(),
    ]);
    args
}

/// Waits (the page is another program's: WebDriver polls it) for the element `css`.
async fn shown(browser: &Browser, css: &str) -> fantoccini::elements::Element {
    browser
        .client
        .wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css} never showed: {e}"))
}

/// Enrolls a passkey for `name` by the link `invite` prints, and signs in with it.
async fn enroll_and_sign_in(browser: &Browser, invite: &str, name: &str) {
    browser.client.goto(invite).await.unwrap();
    shown(browser, "#enroll:not([hidden]) #enroll-go")
        .await
        .click()
        .await
        .unwrap();
    let enrolled = shown(browser, "#enrolled").await.text().await.unwrap();
    assert!(enrolled.contains(name), "{enrolled}");
    shown(browser, "#signin-go").await.click().await.unwrap();
    shown(browser, "#who:not([hidden])").await;
    let who = browser
        .client
        .find(Locator::Id("who-name"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(who, name);
}

/// Picks the waiting call whose target is `target` on the page, and decides it with the buttons
/// a person presses (Approve waits out the delay); answers the outcome the page shows.
async fn decide_on_page(browser: &Browser, target: &str, approve: bool, note: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    let item = loop {
        if Instant::now() > deadline {
            let listed = browser.fetch("GET", "/api/v1/requests", None).await;
            panic!("no waiting call on {target} shows on the page; the page's API says {listed:?}");
        }
        let items = browser
            .client
            .find_all(Locator::Css("#calls button"))
            .await
            .unwrap();
        let mut found = None;
        for item in items {
            if item.text().await.unwrap_or_default().contains(target) {
                found = Some(item);
                break;
            }
        }
        if let Some(item) = found {
            break item;
        }
        // The list is refreshed by the page every 2 s.
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    item.click().await.unwrap();
    let shown_target = shown(browser, "#c-target").await.text().await.unwrap();
    assert!(shown_target.contains(target), "{shown_target}");
    if approve {
        // Disabled for the approve delay, then a click.
        assert!(
            browser
                .client
                .find(Locator::Id("approve"))
                .await
                .unwrap()
                .attr("disabled")
                .await
                .unwrap()
                .is_some(),
            "Approve is enabled before the delay"
        );
        // Policy asks the target typed for this tool: typed as a person reads it.
        let typed = browser.client.find(Locator::Id("typed")).await.unwrap();
        if typed.attr("hidden").await.unwrap().is_none() {
            let field = browser
                .client
                .find(Locator::Id("typed-input"))
                .await
                .unwrap();
            field.send_keys(target).await.unwrap();
        }
        shown(browser, "#approve:not([disabled])")
            .await
            .click()
            .await
            .unwrap();
    } else {
        let field = browser.client.find(Locator::Id("note")).await.unwrap();
        field.send_keys(note).await.unwrap();
        browser
            .client
            .find(Locator::Id("deny"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
    }
    shown(browser, "#outcome[data-outcome]")
        .await
        .attr("data-outcome")
        .await
        .unwrap()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL and Chromium: run under .ci/with-postgres"]
async fn a_passkey_enrolled_by_invite_approves_through_one_replica_a_call_waiting_on_another_and_the_decision_proves_offline()
 {
    let dsn = shared_database().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = self_signed(dir.path());
    let db = tools_db(dir.path());
    let env = [("CONTROL_DSN", dsn.as_str())];
    let (listen_a, listen_b, web_a, web_b) = (free_port(), free_port(), free_port(), free_port());
    let url = format!("https://approvers.example.test:{listen_a}");
    // One origin for the page, as behind one name in front of the replicas; the browser reaches
    // B's listener.
    let origin = format!("http://localhost:{web_b}");
    let secret = "passkey-replicas-secret-0123456789abcdef";
    let replica_env = [("CONFIRM_SECRET", secret), ("CONTROL_DSN", dsn.as_str())];
    let replica = |listen: u16, web: u16| {
        let args = page_args(&db, listen, &url, (&cert, &key), web, &origin);
        Server::start_before(&strs(&args), &replica_env, Some(&[]))
    };
    let (a, b) = (replica(listen_a, web_a), replica(listen_b, web_b));

    let (code, link, note) =
        roster_command("approver", &env, &["invite", "pat", "--page", &origin]);
    assert_eq!(code, 0, "{note}");
    let link = link.trim();
    assert!(link.starts_with(&format!("{origin}/invite#")), "{link}");
    let browser = Browser::start(390, 844).await;
    enroll_and_sign_in(&browser, link, "pat").await;
    // The invite worked once.
    let (_, listed, _) = roster_command("approver", &env, &["list"]);
    assert!(listed.contains("pat\tpasskey:"), "{listed}");

    // An agent asks on A; the person approves on B's page.
    let on_a = Arc::new(agent(&a.url()).await);
    let insert = json!({"sql": "INSERT INTO notes(body) VALUES ('by passkey')"});
    let asking = {
        let (agent, insert) = (on_a.clone(), insert.clone());
        tokio::spawn(async move { call(&agent, "execute", insert).await })
    };
    assert_eq!(
        decide_on_page(&browser, "notes", true, "").await,
        "approved"
    );
    let content = asking.await.unwrap().structured_content.unwrap();
    assert_eq!(content["approved"], true, "{content}");
    let on_b = agent(&b.url()).await;
    let done = call(&on_b, "execute", confirm_of(&insert, &content)).await;
    assert_ne!(done.is_error, Some(true), "{done:?}");
    let runs: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM notes WHERE body = 'by passkey'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(runs, 1, "one approval, one run");

    // A deny with a note reaches the agent.
    let delete = json!({"sql": "DELETE FROM notes"});
    let asking = {
        let (agent, delete) = (on_a.clone(), delete.clone());
        tokio::spawn(async move { call(&agent, "execute", delete).await })
    };
    assert_eq!(
        decide_on_page(&browser, "notes", false, "not on a Friday").await,
        "denied"
    );
    let denied = asking.await.unwrap();
    assert_eq!(denied.is_error, Some(true), "{denied:?}");
    assert!(text_of(&denied).contains("not on a Friday"), "{denied:?}");

    // Both decisions are kept with their assertions, and prove offline from the roster.
    let (code, decisions, note) = roster_command("history", &env, &["--decisions", "--json"]);
    assert_eq!(code, 0, "{note}");
    let lines: Vec<Value> = decisions
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{decisions}");
    for line in &lines {
        assert_eq!(line["by"], "passkey", "{line}");
        assert_eq!(line["approver"], "pat", "{line}");
        assert!(
            line["authenticatorData"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
        );
    }
    let (code, roster, note) = roster_command("approver", &env, &["export"]);
    assert_eq!(code, 0, "{note}");
    let roster_file = dir.path().join("roster.json");
    let decisions_file = dir.path().join("decisions.jsonl");
    std::fs::write(&roster_file, &roster).unwrap();
    std::fs::write(&decisions_file, &decisions).unwrap();
    let verify = |decisions: &Path| {
        roster_command(
            "verify-decisions",
            &[],
            &[
                "--roster",
                roster_file.to_str().unwrap(),
                "--origin",
                &origin,
                decisions.to_str().unwrap(),
            ],
        )
    };
    let (code, proven, note) = verify(&decisions_file);
    assert_eq!(code, 0, "{proven}{note}");
    assert_eq!(
        proven.lines().filter(|l| l.starts_with("proven")).count(),
        2
    );
    // A kept decision edited after the fact (its verdict, its target) proves nothing.
    // (Newest first: the deny, then the approval.)
    assert_eq!(lines[0]["verdict"], "deny");
    let mut edited = lines[0].clone();
    edited["verdict"] = json!("approve");
    let mut retargeted = lines[1].clone();
    retargeted["target"] = json!("users");
    let edited_file = dir.path().join("edited.jsonl");
    std::fs::write(&edited_file, format!("{edited}\n{retargeted}\n")).unwrap();
    let (code, out, _) = verify(&edited_file);
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("UNPROVEN")).count(),
        2,
        "{out}"
    );
    drop((a, b));
}
