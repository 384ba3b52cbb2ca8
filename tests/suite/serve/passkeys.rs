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

    // A hostile target on a phone's screen: escaped and flagged as the desk shows it (the
    // README's picture of the page).
    let hostile = "reports\u{202e}txt.exe\u{200b}";
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(&format!("CREATE TABLE \"{hostile}\"(body TEXT)"))
        .unwrap();
    let asking = {
        let (agent, sql) = (
            on_a.clone(),
            json!({"sql": format!("DELETE FROM \"{hostile}\"")}),
        );
        tokio::spawn(async move { call(&agent, "execute", sql).await })
    };
    let calls = until_listed(&browser, 1).await;
    // (The target keeps the SQL's quotes, escaped as JSON escapes them.)
    let escaped = "\\\"reports\\u{202e}txt.exe\\u{200b}\\\"";
    assert_eq!(calls[0]["targetShown"]["text"], escaped, "{calls:?}");
    assert_eq!(
        calls[0]["targetShown"]["flags"],
        json!(["bidi", "invisible", "non_ascii"])
    );
    browser
        .client
        .goto(&format!("{origin}/call/{}", calls[0]["id"]))
        .await
        .unwrap();
    let on_screen = shown(&browser, "#c-target").await.text().await.unwrap();
    assert_eq!(on_screen, escaped, "the raw target reached the screen");
    let flags = browser
        .client
        .find_all(Locator::Css("#c-target-flags .flag"))
        .await
        .unwrap()
        .len();
    assert_eq!(flags, 3);
    let tenant = calls[0]["tenant"]["text"].as_str().unwrap().to_owned();
    browser
        .readme_picture(
            "approvers-page",
            &[
                "crates/serve/src/web/page/index.html".into(),
                "crates/serve/src/web/page/page.js".into(),
                "crates/serve/src/web/page/page.css".into(),
                "ui/shown.js".into(),
            ],
            &[
                (dir.path().to_str().unwrap().to_owned(), "$DIR".to_owned()),
                (tenant, "$TENANT".to_owned()),
            ],
        )
        .await;
    asking.abort();

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
    let verify = |decisions: &Path| verify_decisions(&roster_file, &origin, decisions);
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

/// Issue 32 on the approvers' page: an edit of a team server's `--rules` shows on the phone as a
/// change, with what it widens and old beside new; a passkey approves it with the same signed
/// decision as a call's, which proves offline; the rules are in force at once, and the call they
/// open runs without a click.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL and Chromium: run under .ci/with-postgres"]
async fn a_rules_change_shows_on_the_page_as_what_it_widens_and_a_passkey_approves_it() {
    let dsn = shared_database().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = self_signed(dir.path());
    let db = tools_db(dir.path());
    let env = [("CONTROL_DSN", dsn.as_str())];
    let (listen, web) = (free_port(), free_port());
    let url = format!("https://approvers.example.test:{listen}");
    let origin = format!("http://localhost:{web}");
    let rules = dir.path().join("policy.cedar");
    let before = "@id(\"no-drop\") @reason(\"no DROP from agents\")\n\
        forbid (principal, action == Countersign::Action::\"execute\", resource)\n\
        when { context.arguments.sql like \"*DROP*\" };\n";
    std::fs::write(&rules, before).unwrap();
    let solver = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/peers/bin/cvc5");
    let solver = std::env::var("CVC5").unwrap_or_else(|_| solver.to_string_lossy().into_owned());
    let server_env = [
        ("CONFIRM_SECRET", "passkey-rules-secret-0123456789abcdef"),
        ("CONTROL_DSN", dsn.as_str()),
        ("CVC5", solver.as_str()),
    ];
    let mut args = page_args(&db, listen, &url, (&cert, &key), web, &origin);
    args.extend(["--rules".to_owned(), rules.to_str().unwrap().to_owned()]);
    let server = Server::start_before(&strs(&args), &server_env, Some(&[]));
    let (code, link, note) =
        roster_command("approver", &env, &["invite", "pat", "--page", &origin]);
    assert_eq!(code, 0, "{note}");
    let browser = Browser::start(390, 844).await;
    enroll_and_sign_in(&browser, link.trim(), "pat").await;

    let after = format!(
        "{before}\n@id(\"open-inserts\") @class(\"open\")\n\
         permit (principal, action == Countersign::Action::\"execute\", resource)\n\
         when {{ context.arguments.sql like \"INSERT INTO notes*\" }};\n"
    );
    std::fs::write(&rules, &after).unwrap();
    let calls = until_listed(&browser, 1).await;
    assert_eq!(calls[0]["tool"]["text"], "change:policy", "{calls:?}");
    browser
        .client
        .goto(&format!("{origin}/call/{}", calls[0]["id"]))
        .await
        .unwrap();
    let analysis = shown(&browser, "#c-change:not([hidden]) #c-analysis")
        .await
        .text()
        .await
        .unwrap();
    assert!(
        analysis.starts_with("It widens") && analysis.contains("execute"),
        "{analysis}"
    );
    let added = browser
        .client
        .find_all(Locator::Css("#c-rows tr.row-added"))
        .await
        .unwrap()
        .len();
    assert!(
        added >= 3,
        "the new rule's lines are marked added ({added})"
    );
    assert_eq!(
        decide_on_page(&browser, "policy.cedar", true, "").await,
        "approved"
    );
    server.until_logged(
        "the rules on record changed: in force here now",
        1,
        Duration::from_secs(30),
    );
    let agent = agent(&server.url()).await;
    let ran = call(
        &agent,
        "execute",
        json!({"sql": "INSERT INTO notes(body) VALUES ('opened by the rules')"}),
    )
    .await;
    assert_ne!(ran.is_error, Some(true), "{ran:?}");

    // The passkey's decision over the change is kept and proves offline like a call's.
    let (code, decisions, note) = roster_command("history", &env, &["--decisions", "--json"]);
    assert_eq!(code, 0, "{note}");
    assert!(decisions.contains("\"tenant\":\"change\""), "{decisions}");
    let (code, roster, note) = roster_command("approver", &env, &["export"]);
    assert_eq!(code, 0, "{note}");
    let (roster_file, decisions_file) =
        (dir.path().join("roster.json"), dir.path().join("d.jsonl"));
    std::fs::write(&roster_file, &roster).unwrap();
    std::fs::write(&decisions_file, &decisions).unwrap();
    let (code, proven, note) = verify_decisions(&roster_file, &origin, &decisions_file);
    assert_eq!(code, 0, "{proven}{note}");
    drop(server);
}

/// `countersign serve verify-decisions` of the kept `decisions` against the exported `roster`,
/// for passkeys bound to `origin`: its exit code, stdout and stderr.
fn verify_decisions(roster: &Path, origin: &str, decisions: &Path) -> (i32, String, String) {
    roster_command(
        "verify-decisions",
        &[],
        &[
            "--roster",
            roster.to_str().unwrap(),
            "--origin",
            origin,
            decisions.to_str().unwrap(),
        ],
    )
}

/// Another site's page, served by the test on a port of loopback: any path answers a blank
/// HTML page with no policy of ours. Answers the port.
fn evil_page() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut head = [0u8; 4096];
            let _ = stream.read(&mut head);
            let page = "<!doctype html><title>elsewhere</title><p>another site";
            let _ = stream.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{page}",
                    page.len()
                )
                .as_bytes(),
            );
        }
    });
    port
}

/// Signs in anew on `browser`'s page: the answer of `signin/finish`.
async fn sign_in(browser: &Browser) -> (u16, Value) {
    let (_, body) = browser
        .fetch("POST", "/api/v1/signin/begin", Some(&json!({})))
        .await;
    let assertion = browser.assert(&body["options"], None).await;
    browser
        .fetch(
            "POST",
            "/api/v1/signin/finish",
            Some(&json!({ "credential": assertion })),
        )
        .await
}

/// The page's waiting calls, as its API lists them to `browser`'s session.
async fn listed(browser: &Browser) -> Vec<Value> {
    let (status, body) = browser.fetch("GET", "/api/v1/requests", None).await;
    assert_eq!(status, 200, "{body}");
    body["calls"].as_array().cloned().unwrap_or_default()
}

/// Waits until `n` calls wait on the page.
async fn until_listed(browser: &Browser, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let calls = listed(browser).await;
        if calls.len() >= n {
            return calls;
        }
        assert!(
            Instant::now() < deadline,
            "{n} calls never waited: {calls:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `decide/begin` for `call` with `verdict` (its target typed): the options and the expiry.
async fn begin(browser: &Browser, call: &Value, verdict: &str) -> (Value, u64) {
    let (status, body) = browser
        .fetch(
            "POST",
            "/api/v1/decide/begin",
            Some(&json!({"request": call["id"], "verdict": verdict, "typed": call["target"]})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    (
        body["options"].clone(),
        body["expiresAtMs"].as_u64().unwrap(),
    )
}

/// `decide/finish` for `call` with `verdict`, `expires` and `credential`: status and body.
async fn finish(
    browser: &Browser,
    call: &Value,
    verdict: &str,
    expires: u64,
    credential: &Value,
) -> (u16, Value) {
    browser
        .fetch(
            "POST",
            "/api/v1/decide/finish",
            Some(&json!({
                "request": call["id"], "verdict": verdict, "typed": call["target"],
                "seen": call["seen"], "expiresAtMs": expires, "credential": credential,
            })),
        )
        .await
}

/// A raw HTTP exchange with the page's listener on `port`, as a program other than the page.
fn page_exchange(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, answer)
}

/// Issue 31, item 5: every way around the person that was tried, on one server with the page at
/// one origin and a second replica serving it at another; none of them mints anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL and Chromium: run under .ci/with-postgres"]
async fn assertions_replayed_moved_borrowed_unverified_cloned_or_from_elsewhere_mint_nothing() {
    let dsn = shared_database().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = self_signed(dir.path());
    let db = tools_db(dir.path());
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch("CREATE TABLE audit(id INTEGER PRIMARY KEY, body TEXT)")
        .unwrap();
    let env = [("CONTROL_DSN", dsn.as_str())];
    let (listen_a, listen_b, web_a, web_b) = (free_port(), free_port(), free_port(), free_port());
    let url = format!("https://approvers.example.test:{listen_a}");
    let origin = format!("http://localhost:{web_a}");
    let elsewhere = format!("http://localhost:{web_b}");
    let secret = "passkey-attacks-secret-0123456789abcdef";
    let replica_env = [("CONFIRM_SECRET", secret), ("CONTROL_DSN", dsn.as_str())];
    let a = Server::start_before(
        &strs(&page_args(
            &db,
            listen_a,
            &url,
            (&cert, &key),
            web_a,
            &origin,
        )),
        &replica_env,
        Some(&[]),
    );
    // The same server's page at another origin (same RP ID: the passkey works there too).
    let b = Server::start_before(
        &strs(&page_args(
            &db,
            listen_b,
            &url,
            (&cert, &key),
            web_b,
            &elsewhere,
        )),
        &replica_env,
        Some(&[]),
    );
    let invite = |name: &str| {
        let (code, link, note) =
            roster_command("approver", &env, &["invite", name, "--page", &origin]);
        assert_eq!(code, 0, "{note}");
        link.trim().to_owned()
    };
    let pat_link = invite("pat");
    let pat = Browser::start(1280, 800).await;
    enroll_and_sign_in(&pat, &pat_link, "pat").await;
    let sam = Browser::start(1280, 800).await;
    enroll_and_sign_in(&sam, &invite("sam"), "sam").await;

    // An invite used twice, and one expired, enroll nothing.
    let late = invite("late");
    countersign_tests::postgres::admin(&dsn)
        .await
        .execute(
            "UPDATE approver_invite SET expires_at_ms = 1 WHERE name = 'late'",
            &[],
        )
        .await
        .unwrap();
    for link in [&pat_link, &late] {
        let code = link.split('#').nth(1).unwrap();
        let (status, body) = pat
            .fetch(
                "POST",
                "/api/v1/enroll/begin",
                Some(&json!({"invite": code})),
            )
            .await;
        assert_eq!(
            (status, body["error"].as_str()),
            (404, Some("invite_unusable")),
            "{body}"
        );
    }

    // Three calls wait: X and Y on notes (other plans), Z on another table.
    let agent_a = Arc::new(agent(&a.url()).await);
    let sqls = [
        "INSERT INTO notes(body) VALUES ('x')",
        "DELETE FROM notes",
        "INSERT INTO audit(body) VALUES ('z')",
    ];
    let asking: Vec<_> = sqls
        .iter()
        .map(|sql| {
            let (agent, args) = (agent_a.clone(), json!({ "sql": sql }));
            tokio::spawn(async move { call(&agent, "execute", args).await })
        })
        .collect();
    let calls = until_listed(&pat, 3).await;
    let by_sql = |sql: &str| -> Value {
        calls
            .iter()
            .find(|c| {
                c["details"]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .contains(sql)
            })
            .cloned()
            .unwrap()
    };
    let (x, y, z) = (by_sql(sqls[0]), by_sql(sqls[1]), by_sql(sqls[2]));
    assert_ne!(x["planHash"], y["planHash"]);
    assert_eq!(z["target"], "audit");
    // Approved the moment the page had it: the server holds the approve delay too.
    let (options, expires) = begin(&pat, &x, "approve").await;
    let hasty = pat.assert(&options, None).await;
    // The page's mark of the call from a listing just now.
    let fresh = listed(&pat)
        .await
        .into_iter()
        .find(|c| c["id"] == x["id"])
        .unwrap();
    let (status, body) = finish(&pat, &fresh, "approve", expires, &hasty).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("too_soon")),
        "{body}"
    );
    // Past the approve delay since the page had them (a deliberate wait).
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    // A sign-in's assertion offered as a decision.
    let (_, begun) = pat
        .fetch("POST", "/api/v1/signin/begin", Some(&json!({})))
        .await;
    let signin = pat.assert(&begun["options"], None).await;
    let (status, body) = finish(&pat, &x, "approve", expires, &signin).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("passkey_refused")),
        "{body}"
    );

    // A session cookie and no fresh assertion.
    let (status, body) = pat
        .fetch(
            "POST",
            "/api/v1/decide/finish",
            Some(&json!({"request": x["id"], "verdict": "approve", "typed": x["target"], "seen": x["seen"]})),
        )
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("unsigned")),
        "{body}"
    );

    // An assertion over X, moved to Y (another plan), to Z (another target), to another
    // verdict, to another expiry: the challenge is the server's digest of each, so none checks.
    let (options, expires) = begin(&pat, &x, "approve").await;
    let over_x = pat.assert(&options, None).await;
    for (call, verdict, expiry) in [
        (&y, "approve", expires),
        (&z, "approve", expires),
        (&x, "deny", expires),
        (&x, "approve", expires - 1),
    ] {
        let (status, body) = finish(&pat, call, verdict, expiry, &over_x).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (403, Some("passkey_refused")),
            "{body}"
        );
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("challenge differs"),
            "{body}"
        );
    }

    // Another approver's passkey signing for pat's session.
    let (sam_options, sam_expires) = begin(&sam, &x, "approve").await;
    let by_sam = sam.assert(&sam_options, None).await;
    let (status, body) = finish(&pat, &x, "approve", sam_expires, &by_sam).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("another_approver")),
        "{body}"
    );

    // No user verification.
    pat.set_user_verified(false).await;
    let (options, expires) = begin(&pat, &x, "approve").await;
    let unverified = pat.assert(&options, Some("discouraged")).await;
    pat.set_user_verified(true).await;
    let (status, body) = finish(&pat, &x, "approve", expires, &unverified).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("passkey_refused")),
        "{body}"
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("user verified bit"),
        "{body}"
    );

    // Made on the page at another origin (the challenge A gave, the client data naming B).
    let (options, expires) = begin(&pat, &x, "approve").await;
    pat.client.goto(&elsewhere).await.unwrap();
    let from_elsewhere = pat.assert(&options, None).await;
    pat.client.goto(&origin).await.unwrap();
    let (status, body) = finish(&pat, &x, "approve", expires, &from_elsewhere).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("passkey_refused")),
        "{body}"
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("origin does not match"),
        "{body}"
    );

    // A request to decide from another site's page, with the person's cookie (a page of the
    // test's own on another port of localhost: the same site, so the browser attaches the
    // SameSite=Strict cookie; a cross-origin POST it sends without asking, no-cors and
    // text/plain), and one as a program would send it.
    let evil = evil_page();
    pat.client
        .goto(&format!("http://localhost:{evil}/"))
        .await
        .unwrap();
    let forged =
        json!({"request": x["id"], "verdict": "approve", "typed": x["target"]}).to_string();
    let script = r#"
        const [url, body, done] = arguments;
        fetch(url, { method: "POST", mode: "no-cors", credentials: "include",
          headers: { "Content-Type": "text/plain" }, body }).then(() => done("sent"), (e) => done(String(e)));
    "#;
    let sent = pat
        .client
        .execute_async(
            script,
            vec![
                json!(format!("{origin}/api/v1/decide/begin")),
                json!(forged),
            ],
        )
        .await
        .unwrap();
    assert_eq!(sent, "sent", "the cross-site request was not sent");
    pat.client.goto(&origin).await.unwrap();
    let (status, answer) = page_exchange(
        web_a,
        "POST",
        "/api/v1/decide/begin",
        &[
            ("Origin", "http://evil.example"),
            ("Content-Type", "application/json"),
        ],
        &forged,
    );
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("cross_origin"), "{answer}");
    // Both were refused at the door: the browser's (whose answer it cannot read) and the
    // program's; the server says so in its log, written by another process (read as it comes).
    a.until_logged(
        "from another origin was refused",
        2,
        Duration::from_secs(10),
    );

    // The real decision on X, then the same assertion replayed: for X again, and for Y.
    let (options, expires) = begin(&pat, &x, "approve").await;
    let good = pat.assert(&options, None).await;
    let (status, body) = finish(&pat, &x, "approve", expires, &good).await;
    assert_eq!(status, 200, "{body}");
    for call in [&x, &y] {
        let (status, body) = finish(&pat, call, "approve", expires, &good).await;
        assert_ne!(status, 200, "a replayed assertion counted: {body}");
    }

    // A cloned authenticator: a copy of pat's credential taken now; the original signs in
    // again (its counter moves on, and the server keeps it); then the copy signs in, its
    // counter no further than the one kept.
    let copy = pat
        .credentials()
        .await
        .into_iter()
        .next()
        .expect("pat's credential");
    let (status, body) = sign_in(&pat).await;
    assert_eq!(status, 200, "{body}");
    let clone = Browser::start(1280, 800).await;
    clone.add_credential(&copy).await;
    clone.client.goto(&origin).await.unwrap();
    let (status, body) = sign_in(&clone).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("counter_went_back")),
        "{body}"
    );
    // A sign-in assertion replayed: its challenge was good once.
    let (_, begun) = pat
        .fetch("POST", "/api/v1/signin/begin", Some(&json!({})))
        .await;
    let once = pat.assert(&begun["options"], None).await;
    let (status, _) = pat
        .fetch(
            "POST",
            "/api/v1/signin/finish",
            Some(&json!({"credential": once})),
        )
        .await;
    assert_eq!(status, 200);
    let (status, body) = pat
        .fetch(
            "POST",
            "/api/v1/signin/finish",
            Some(&json!({"credential": once})),
        )
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("challenge_unknown")),
        "{body}"
    );

    // A revoked approver's open session lists nothing and decides nothing.
    let (code, _, note) = roster_command("approver", &env, &["revoke", "sam"]);
    assert_eq!(code, 0, "{note}");
    let (status, body) = sam.fetch("GET", "/api/v1/requests", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("approver_revoked")),
        "{body}"
    );

    // Only the one real approval was kept; Y and Z still wait; nothing ran.
    let (_, decisions, _) = roster_command("history", &env, &["--decisions", "--json"]);
    assert_eq!(decisions.lines().count(), 1, "{decisions}");
    let left: Vec<Value> = listed(&pat).await;
    let mut waiting: Vec<&str> = left.iter().filter_map(|c| c["target"].as_str()).collect();
    waiting.sort_unstable();
    assert_eq!(waiting, ["audit", "notes"], "{left:?}");
    assert_eq!(notes_in(&db), 1);
    for task in asking {
        task.abort();
    }
    drop((a, b));
}

/// Two of two: a person's real desk window and another person's passkey on the page (after that
/// person's own desk key and passkey together counted once); the official Python SDK agent,
/// waiting on the call, gets the tool's result; the webhook's notice links to the call on the
/// page, and the link opens it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL, Chromium and the desk's window: run under .ci/with-postgres"]
async fn a_desk_window_and_a_passkey_make_two_of_two_and_the_python_sdk_agent_gets_its_result() {
    use countersign_core::approver::Verdict;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let python = countersign_tests::peers::python();
    let dsn = shared_database().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, trusted) = self_signed(dir.path());
    let db = tools_db(dir.path());
    let policy = two_approvers_for_execute(dir.path(), &db);
    let env = [("CONTROL_DSN", dsn.as_str())];
    let (listen, web) = (free_port(), free_port());
    let url = format!("https://localhost:{listen}");
    let origin = format!("http://localhost:{web}");

    // Dana approves in her desk's window; pat holds a desk key and a passkey.
    let desk_dir = tempfile::tempdir().unwrap();
    let enroll = Command::new(bin("countersign"))
        .args(["approver", "enroll", &url, "--ca", cert.to_str().unwrap()])
        .env("COUNTERSIGN_DESK_DIR", desk_dir.path())
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&enroll.stdout).into_owned();
    let dana_key = printed
        .trim()
        .strip_prefix("countersign serve approver add NAME ")
        .unwrap_or_else(|| panic!("{printed}"))
        .to_owned();
    let (code, _, note) = roster_command("approver", &env, &["add", "dana", &dana_key]);
    assert_eq!(code, 0, "{note}");
    let (pat_desk, rex) = (Desk::new(61), Desk::new(62));
    add_approvers(&env, &[("pat", &pat_desk), ("rex", &rex)]);

    let (receiver, notices) = webhook_receiver();
    let routing_key = dir.path().join("pagerduty.key");
    std::fs::write(&routing_key, "R0UT1NG-KEY-0123\n").unwrap();
    let rules = dir.path().join("policy.cedar");
    std::fs::write(&rules, "").unwrap();
    let solver = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/peers/bin/cvc5");
    let solver = std::env::var("CVC5").unwrap_or_else(|_| solver.to_string_lossy().into_owned());
    let mut args = page_args(&db, listen, &url, (&cert, &key), web, &origin);
    args.extend([
        "--rules".to_owned(),
        rules.to_str().unwrap().to_owned(),
        "--policy".to_owned(),
        policy.to_str().unwrap().to_owned(),
        "--webhook".to_owned(),
        format!("http://127.0.0.1:{receiver}/hook"),
        "--teams-webhook".to_owned(),
        format!("http://127.0.0.1:{receiver}/teams"),
        "--pagerduty-routing-key-file".to_owned(),
        routing_key.to_str().unwrap().to_owned(),
        "--pagerduty-url".to_owned(),
        format!("http://127.0.0.1:{receiver}/pagerduty"),
    ]);
    let server = Server::start_before(
        &strs(&args),
        &[
            (
                "CONFIRM_SECRET",
                "two-of-two-passkey-secret-0123456789abcdef",
            ),
            ("CONTROL_DSN", &dsn),
            ("CVC5", &solver),
        ],
        Some(&[]),
    );
    let (code, link, note) =
        roster_command("approver", &env, &["invite", "pat", "--page", &origin]);
    assert_eq!(code, 0, "{note}");
    let browser = Browser::start(390, 844).await;
    enroll_and_sign_in(&browser, link.trim(), "pat").await;
    let desk = countersign_tests::window::Desk::start_in(desk_dir, &[]).await;

    // The Python SDK asks; the call waits for two people.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/team_agent.py");
    let mut agent = tokio::process::Command::new(&python)
        .arg(script)
        .arg(server.url())
        .arg("DELETE FROM notes")
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
    assert_eq!(next_step().await["step"], "connected");
    assert_eq!(next_step().await["step"], "elicited");

    // The notice links to the call on the page (never its arguments); the link opens it.
    countersign_tests::postgres::wait_until("three notices", Duration::from_secs(20), || {
        countersign_core::sync::lock(&notices).len() >= 3
    });
    let received = countersign_core::sync::lock(&notices).clone();
    let by_path = |path: &str| -> Value {
        let (_, body) = received.iter().find(|(p, _)| p == path).unwrap();
        serde_json::from_str(body).unwrap()
    };
    let notice = by_path("/hook");
    let call_link = notice["link"].as_str().unwrap_or_default().to_owned();
    assert_eq!(
        call_link,
        format!("{origin}/call/{}", notice["call"]),
        "the generic notice names the shared number: {notice}"
    );
    assert!(
        call_link.starts_with(&format!("{origin}/call/")),
        "{notice}"
    );
    let teams = by_path("/teams");
    assert_eq!(
        teams["attachments"][0]["content"]["actions"][0]["url"],
        call_link.as_str(),
        "{teams}"
    );
    let pagerduty = by_path("/pagerduty");
    assert_eq!(
        pagerduty["links"][0]["href"],
        call_link.as_str(),
        "{pagerduty}"
    );
    assert_eq!(pagerduty["routing_key"], "R0UT1NG-KEY-0123");
    assert_eq!(pagerduty["event_action"], "trigger");
    for (_, body) in &received {
        assert!(!body.contains("DELETE FROM notes"), "{body}");
    }
    assert!(
        !server.log().contains("R0UT1NG-KEY-0123"),
        "the routing key was logged"
    );
    browser.client.goto(&call_link).await.unwrap();
    shown(&browser, "#call:not([hidden])").await;
    let opened = shown(&browser, "#c-target").await.text().await.unwrap();
    assert_eq!(opened, "notes");

    // Rex approves at his desk, and is revoked: his approval stops counting.
    let (status, body) = tokio::task::spawn_blocking({
        let (url, trusted) = (url.clone(), trusted.clone());
        move || {
            let request = first_waiting(listen, &trusted, &rex);
            let decision = rex.decide(&url, &request, Verdict::Approve, |_| {});
            rex.send(listen, &trusted, &decision)
        }
    })
    .await
    .unwrap();
    assert_eq!((status, &body["approvals"]), (202, &json!(1)), "{body}");
    let (code, _, note) = roster_command("approver", &env, &["revoke", "rex"]);
    assert_eq!(code, 0, "{note}");

    // Pat's passkey, then pat's desk key: one person, one of two (rex no longer counts).
    assert_eq!(
        decide_on_page(&browser, "notes", true, "").await,
        "recorded"
    );
    let counted = browser
        .client
        .find(Locator::Id("outcome"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(counted.contains("1 of 2"), "{counted}");
    let (status, body) = tokio::task::spawn_blocking({
        let (url, trusted) = (url.clone(), trusted.clone());
        move || {
            let request = first_waiting(listen, &trusted, &pat_desk);
            let decision = pat_desk.decide(&url, &request, Verdict::Approve, |_| {});
            pat_desk.send(listen, &trusted, &decision)
        }
    })
    .await
    .unwrap();
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["approvals"], 1, "pat counted twice: {body}");

    // Dana in her window: two of two.
    desk.wait_for_request().await;
    let target = desk.text("#d-target").await;
    if !desk.enabled("#approve").await && desk.exists("#typed:not([hidden])").await {
        desk.set_value("#typed-target", &target).await;
    }
    desk.until("Approve to be enabled", |d| Box::pin(d.approve_enabled()))
        .await;
    desk.click("#approve").await;

    stdin.write_all(b"approved\n").await.unwrap();
    assert_eq!(next_step().await["step"], "answering");
    let result = next_step().await;
    assert_eq!(result["step"], "result", "{result}");
    assert_ne!(result["result"]["isError"], json!(true), "{result}");
    assert_eq!(notes_in(&db), 0, "the delete ran");
    // Kept: rex's (revoked since), pat's passkey's, dana's; pat's desk's second approval is not
    // kept twice.
    let (_, decisions, _) = roster_command("history", &env, &["--decisions", "--json"]);
    let mut kept: Vec<(String, String)> = decisions
        .lines()
        .map(|l| {
            let d: Value = serde_json::from_str(l).unwrap();
            (
                d["approver"].as_str().unwrap().to_owned(),
                d["by"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    kept.sort();
    assert_eq!(
        kept,
        [
            ("dana".to_owned(), "desk".to_owned()),
            ("pat".to_owned(), "passkey".to_owned()),
            ("rex".to_owned(), "desk".to_owned()),
        ]
    );
    assert!(agent.wait().await.unwrap().success());

    // An edit of the server's rules reaches dana's window as a change of that server's rules:
    // what it widens beside the diff, approved with the real button (one approver is asked).
    std::fs::write(
        &rules,
        "@id(\"open-inserts\") @class(\"open\")\n\
         permit (principal, action == Countersign::Action::\"execute\", resource)\n\
         when { context.arguments.sql like \"INSERT INTO notes*\" };\n",
    )
    .unwrap();
    desk.wait_for_request().await;
    desk.until("the rules change in the window", |d| {
        Box::pin(d.exists("#c-analysis-row:not([hidden])"))
    })
    .await;
    let analysis = desk.text("#c-analysis").await;
    assert!(
        analysis.starts_with("It widens") && analysis.contains("execute"),
        "{analysis}"
    );
    let subject = desk.text("#c-subject").await;
    assert_eq!(subject, "policy.cedar");
    desk.until("Approve to be enabled", |d| Box::pin(d.approve_enabled()))
        .await;
    desk.click("#approve").await;
    server.until_logged(
        "the rules on record changed: in force here now",
        1,
        Duration::from_secs(30),
    );
    let opened = insert_the_rules_open(&server).await;
    assert_ne!(opened.is_error, Some(true), "{opened:?}");
    desk.stop().await;
    drop(server);
}

/// An INSERT the rules open, called on `server` by a new agent: it runs without a click.
async fn insert_the_rules_open(server: &Server) -> rmcp::model::CallToolResult {
    let agent = agent(&server.url()).await;
    call(
        &agent,
        "execute",
        json!({"sql": "INSERT INTO notes(body) VALUES ('opened at a desk')"}),
    )
    .await
}

/// The page served over TLS by the server itself (its own certificate), with no desks' listener:
/// the page's policy on every answer, its API answering at its origin; and the start rules for
/// approvers without a place, or a page whose origin a passkey cannot be bound to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn the_page_is_served_over_tls_in_process_with_its_policy_and_bad_origins_never_start() {
    let dsn = shared_database().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, trusted) = self_signed(dir.path());
    let db = tools_db(dir.path());
    let web = free_port();
    let origin = format!("https://localhost:{web}");
    let base = [
        "--behind-tls-proxy",
        "--unauthenticated",
        "--db",
        db.to_str().unwrap(),
        "--approver-url",
        "https://approvers.example.test",
    ];
    let env = [
        ("CONFIRM_SECRET", "tls-page-secret-0123456789abcdef"),
        ("CONTROL_DSN", dsn.as_str()),
    ];
    let listen = format!("127.0.0.1:{web}");
    let mut args = base.to_vec();
    args.extend([
        "--approver-web",
        &listen,
        "--approver-web-origin",
        &origin,
        "--approver-web-cert",
        cert.to_str().unwrap(),
        "--approver-web-key",
        key.to_str().unwrap(),
    ]);
    let server = Server::start_before(&args, &env, Some(&[]));
    let exchange = |method: &str, path: &str, headers: &[(&str, &str)], body: &str| {
        countersign_tests::approver::over_tls(web, &trusted, None, method, path, headers, body)
            .unwrap()
    };
    let (status, head, page) = exchange("GET", "/", &[], "");
    assert_eq!(status, 200, "{head}");
    let head = head.to_ascii_lowercase();
    assert!(
        head.contains("content-security-policy: default-src 'none'; script-src 'self'"),
        "{head}"
    );
    assert!(head.contains("x-frame-options: deny"), "{head}");
    assert!(head.contains("x-content-type-options: nosniff"), "{head}");
    assert!(
        page.contains("<script type=\"module\" src=\"/page.js\">"),
        "{page}"
    );
    let (status, _, begun) = exchange("POST", "/api/v1/signin/begin", &[("Origin", &origin)], "{}");
    assert_eq!(status, 200, "{begun}");
    let begun: Value = serde_json::from_str(&begun).unwrap();
    assert_eq!(
        begun["options"]["publicKey"]["rpId"], "localhost",
        "{begun}"
    );
    // Listing without a session: signed out.
    let (status, _, _) = exchange("GET", "/api/v1/requests", &[], "");
    assert_eq!(status, 401);
    drop(server);

    // Refused at start, nothing bound: approvers with no place, a listener with no name, an
    // origin a passkey cannot be bound to.
    for (extra, code) in [
        (vec![], "approvers_nowhere"),
        (
            vec![
                "--approver-web",
                &listen,
                "--approver-web-origin",
                "http://approve.example.com",
            ],
            "bad_web_origin",
        ),
        (
            vec![
                "--approver-web",
                &listen,
                "--approver-web-origin",
                "https://127.0.0.1",
            ],
            "bad_web_origin",
        ),
        (
            vec![
                "--approver-web",
                &listen,
                "--approver-web-origin",
                &origin,
                "--pagerduty-routing-key-file",
                "no-such-file",
            ],
            "bad_routing_key",
        ),
    ] {
        let mut args = base.to_vec();
        args.extend(extra);
        let said = refused_without_binding(&bin("countersign-serve"), &args, &env);
        assert!(said.contains(code), "{said}");
    }
}
