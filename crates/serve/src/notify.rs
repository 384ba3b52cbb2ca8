//! Telling people a call waits: a webhook on each new request.
//!
//! A team's approvers are not always looking at their desks. On each new waiting call the
//! server posts to the configured webhooks: a generic JSON document (`--webhook URL`), Slack's
//! incoming-webhook shape (`--slack-webhook URL`), a Microsoft Teams workflow's Adaptive Card
//! (`--teams-webhook URL`), or a PagerDuty Events API v2 trigger (`--pagerduty-routing-key-file
//! FILE`). What is posted names who asks, the tool, the target, the class and the server, and,
//! when the server has an approvers' page, a link to that call on it; never the call's arguments
//! (a secret may be among them), a token or anything else the approval binds beyond what a person
//! needs to go and look. A webhook that fails is tried twice more and then given up on (logged):
//! the request still waits for the desks and the page, which do not depend on it.
//!
//! The text comes from the agent and the upstream (the tool's name, the target): in Slack's
//! shape `&`, `<` and `>` are escaped, so a target cannot ping a channel or hide a link; in
//! Teams' Markdown every character Markdown reads is escaped with a backslash, so a target cannot
//! make a link or a heading. The link is ours (the page's origin and the call's number).

use std::time::Duration;

use std::sync::Arc;

use countersign_engine::{Engine, PendingRequest, QueueChange, SharedRequests};
use serde_json::{Value, json};

/// How long one delivery may take.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// How many times a delivery is tried.
pub const ATTEMPTS: u32 = 3;

/// A webhook and its shape.
#[derive(Clone, PartialEq, Eq)]
pub enum Webhook {
    /// A generic JSON document.
    Json(String),
    /// Slack's incoming webhook (`{"text": …}`).
    Slack(String),
    /// A Microsoft Teams workflow's incoming webhook (an Adaptive Card message).
    Teams(String),
    /// PagerDuty's Events API v2: its URL and the integration's routing key (a secret: never
    /// logged, never printed by `Debug`).
    PagerDuty {
        /// The Events API's URL.
        url: String,
        /// The routing key.
        routing_key: zeroize::Zeroizing<String>,
    },
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Webhook::Json(url) => f.debug_tuple("Json").field(url).finish(),
            Webhook::Slack(url) => f.debug_tuple("Slack").field(url).finish(),
            Webhook::Teams(url) => f.debug_tuple("Teams").field(url).finish(),
            Webhook::PagerDuty { url, .. } => f
                .debug_struct("PagerDuty")
                .field("url", url)
                .finish_non_exhaustive(),
        }
    }
}

/// PagerDuty's Events API v2.
pub const PAGERDUTY_URL: &str = "https://events.pagerduty.com/v2/enqueue";

impl Webhook {
    fn url(&self) -> &str {
        match self {
            Webhook::Json(url) | Webhook::Slack(url) | Webhook::Teams(url) => url,
            Webhook::PagerDuty { url, .. } => url,
        }
    }

    /// The notice for `request` waiting on `server`, with the page's `link` to it if any.
    pub fn body(
        &self,
        server: &str,
        request: &PendingRequest,
        link: Option<&str>,
    ) -> Option<Value> {
        match self {
            Webhook::Json(_) => generic(server, request, link),
            Webhook::Slack(_) => slack(server, request, link),
            Webhook::Teams(_) => teams(server, request, link),
            Webhook::PagerDuty { routing_key, .. } => pagerduty(server, request, link, routing_key),
        }
    }
}

/// Where a notice's link points: the approvers' page, and the shared numbers of its calls.
#[derive(Clone)]
pub struct Page {
    /// The page's origin.
    pub origin: url::Url,
    /// The shared number of a call waiting here (the page's `/call/NUMBER`).
    pub numbers: Arc<dyn SharedRequests>,
}

/// The generic document for `request` waiting on `server`.
pub fn generic(server: &str, request: &PendingRequest, link: Option<&str>) -> Option<Value> {
    let call = request.call()?;
    let mut body = json!({
        "event": "request_waiting",
        "server": server,
        "request": request.id,
        "tenant": call.tenant,
        "tool": request.plan.tool,
        "target": request.plan.target,
        "summary": request.plan.summary,
        "class": call.class.code(),
        "approvers": call.approvers,
        "arrivedAtMs": request.arrived_at_ms,
    });
    if let Some(link) = link {
        body["link"] = json!(link);
    }
    Some(body)
}

/// Slack's escaping of text it would otherwise read as markup.
fn slack_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn uses(request: &PendingRequest) -> &'static str {
    match request.call() {
        Some(call) if call.class.is_single_use() => "works once",
        _ => "reusable until it expires",
    }
}

/// The Slack message for `request` waiting on `server`.
pub fn slack(server: &str, request: &PendingRequest, link: Option<&str>) -> Option<Value> {
    let call = request.call()?;
    let whereto = match link {
        Some(link) => format!("<{link}|Open the call> to approve or deny it."),
        None => "Approve or deny it at your desk.".to_owned(),
    };
    let text = format!(
        "Countersign: {} asks to run `{}` on `{}` ({}, {}). {whereto}",
        slack_escape(call.tenant.as_str()),
        slack_escape(&request.plan.tool).replace('`', "'"),
        slack_escape(&request.plan.target).replace('`', "'"),
        uses(request),
        slack_escape(server),
    );
    Some(json!({ "text": text }))
}

/// Every character Markdown (as Teams reads it) gives a meaning, escaped with a backslash; line
/// breaks as spaces.
fn markdown_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' | '`' | '*' | '_' | '{' | '}' | '[' | ']' | '(' | ')' | '#' | '+' | '-' | '.'
            | '!' | '|' | '<' | '>' | '~' | '&' => {
                out.push('\\');
                out.push(c);
            }
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// The Microsoft Teams message (an Adaptive Card) for `request` waiting on `server`.
pub fn teams(server: &str, request: &PendingRequest, link: Option<&str>) -> Option<Value> {
    let call = request.call()?;
    let text = format!(
        "Countersign: {} asks to run {} on {} ({}, {}).",
        markdown_escape(call.tenant.as_str()),
        markdown_escape(&request.plan.tool),
        markdown_escape(&request.plan.target),
        uses(request),
        markdown_escape(server),
    );
    let actions: Vec<Value> = link
        .map(|link| json!({ "type": "Action.OpenUrl", "title": "Open the call", "url": link }))
        .into_iter()
        .collect();
    Some(json!({
        "type": "message",
        "attachments": [{
            "contentType": "application/vnd.microsoft.card.adaptive",
            "content": {
                "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                "type": "AdaptiveCard",
                "version": "1.4",
                "body": [{ "type": "TextBlock", "text": text, "wrap": true }],
                "actions": actions,
            }
        }]
    }))
}

/// The PagerDuty Events API v2 trigger for `request` waiting on `server` (one incident per
/// call: its dedup key is the server and the request).
pub fn pagerduty(
    server: &str,
    request: &PendingRequest,
    link: Option<&str>,
    routing_key: &str,
) -> Option<Value> {
    let call = request.call()?;
    let summary: String = format!(
        "Countersign: {} asks to run {} on {} ({})",
        call.tenant.as_str(),
        request.plan.tool,
        request.plan.target,
        uses(request)
    )
    .chars()
    .take(1024)
    .collect();
    let links: Vec<Value> = link
        .map(|link| json!({ "href": link, "text": "Open the call" }))
        .into_iter()
        .collect();
    Some(json!({
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": format!("countersign:{server}:{}", request.id),
        "payload": {
            "summary": summary,
            "source": server,
            "severity": "info",
            "component": request.plan.tool,
            "custom_details": {
                "tenant": call.tenant,
                "tool": request.plan.tool,
                "target": request.plan.target,
                "class": call.class.code(),
                "approvers": call.approvers,
            },
        },
        "links": links,
    }))
}

/// Posts every new waiting call of `engine` to `hooks`, naming the server `server` and linking
/// to the call on the approvers' `page` if there is one, for as long as the engine lives.
///
/// Subscribes to the engine's queue when called, not when the future first runs: a call that
/// waits from the server's first moment (asked before a busy runtime got round to the spawned
/// task) is announced too.
pub fn run(
    engine: Engine,
    server: String,
    page: Option<Page>,
    hooks: Vec<Webhook>,
) -> impl std::future::Future<Output = ()> + Send {
    let changes = (!hooks.is_empty()).then(|| engine.subscribe());
    announce(changes, server, page, hooks)
}

async fn announce(
    changes: Option<tokio::sync::broadcast::Receiver<QueueChange>>,
    server: String,
    page: Option<Page>,
    hooks: Vec<Webhook>,
) {
    let Some(mut changes) = changes else {
        return;
    };
    let client = reqwest::Client::builder()
        .timeout(TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_default();
    loop {
        let request = match changes.recv().await {
            Ok(QueueChange::Added { request }) => request,
            Ok(_) => continue,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(target: "notify", missed, "too many requests at once: some were not announced");
                continue;
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        };
        // The call's number shared by the replicas (what the page and desks know it by).
        let number = match &page {
            Some(page) => page.numbers.number(request.id).await,
            None => None,
        };
        let link = page
            .as_ref()
            .zip(number)
            .map(|(page, row)| crate::web::call_link(&page.origin, row));
        for hook in &hooks {
            let Some(mut body) = hook.body(&server, &request, link.as_deref()) else {
                continue;
            };
            // The generic document's `request` is this replica's own number; `call` is the one
            // every replica, the page and desks share.
            if let (Webhook::Json(_), Some(number)) = (hook, number) {
                body["call"] = json!(number);
            }
            let (client, url) = (client.clone(), hook.url().to_owned());
            tokio::spawn(async move { deliver(client, url, body).await });
        }
    }
}

async fn deliver(client: reqwest::Client, url: String, body: Value) {
    let mut pause = Duration::from_millis(500);
    for attempt in 1..=ATTEMPTS {
        match client.post(&url).json(&body).send().await {
            Ok(answer) if answer.status().is_success() => return,
            Ok(answer) => {
                tracing::warn!(target: "notify", attempt, status = answer.status().as_u16(), "a webhook refused the notice")
            }
            Err(e) => tracing::warn!(target: "notify", attempt, "a webhook was not reached: {e}"),
        }
        tokio::time::sleep(pause).await;
        pause *= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use countersign_core::{GateClass, Plan, PlanHash};
    use countersign_engine::{Asks, CallRequest};

    fn request(target: &str) -> PendingRequest {
        PendingRequest {
            id: 3,
            plan: Plan {
                tool: "execute".into(),
                target: target.into(),
                action: "execute".into(),
                summary: "execute on notes".into(),
                details: json!({"sql": "DELETE FROM notes", "password": "hunter2"}),
                reversible: false,
            },
            arrived_at_ms: 5,
            text: "the plan, with hunter2 in it".into(),
            preview: None,
            asks: Asks::Call(CallRequest {
                tenant: countersign_core::Tenant::team(
                    "key:ci",
                    &countersign_core::ServerId::Registered("db".into()),
                ),
                client_info: json!({"name": "ci"}),
                server: "server:db".into(),
                plan_hash: PlanHash::from_bytes([1; 32]),
                class: GateClass::Once,
                type_target: true,
                approvers: 2,
                token_ttl_ms: 600_000,
                why: "annotations".into(),
                last_unknown_at_ms: None,
                stopped_waiting_at_ms: None,
                ruled: false,
                grant_max_minutes: None,
            }),
        }
    }

    #[test]
    fn a_notice_names_who_what_and_where_and_never_the_arguments() {
        let r = request("notes");
        let link = Some("https://approve.example.com/call/9");
        for body in [
            generic("https://team", &r, link),
            slack("https://team", &r, link),
            teams("https://team", &r, link),
            pagerduty("https://team", &r, link, "routing"),
        ] {
            let text = body.unwrap().to_string();
            assert!(
                text.contains("key:ci@server:db") && text.contains("execute"),
                "{text}"
            );
            assert!(
                text.contains("notes") && text.contains("https://team"),
                "{text}"
            );
            assert!(
                !text.contains("hunter2") && !text.contains("DELETE"),
                "{text}"
            );
        }
        assert_eq!(generic("s", &r, None).unwrap()["approvers"], 2);
    }

    #[test]
    fn every_shape_links_to_the_call_on_the_page_when_there_is_one() {
        let r = request("notes");
        let link = "https://approve.example.com/call/9";
        assert_eq!(generic("s", &r, Some(link)).unwrap()["link"], link);
        let slack = slack("s", &r, Some(link)).unwrap().to_string();
        assert!(
            slack.contains("<https://approve.example.com/call/9|Open the call>"),
            "{slack}"
        );
        let teams = teams("s", &r, Some(link)).unwrap();
        assert_eq!(
            teams["attachments"][0]["content"]["actions"][0]["url"],
            link
        );
        let pd = pagerduty("s", &r, Some(link), "key").unwrap();
        assert_eq!(pd["links"][0]["href"], link);
        assert_eq!(pd["event_action"], "trigger");
        assert_eq!(pd["routing_key"], "key");
        assert_eq!(pd["dedup_key"], "countersign:s:3");
        // Without a page: no link anywhere.
        assert!(generic("s", &r, None).unwrap().get("link").is_none());
        assert!(!slack_text(&r).contains("http"));
    }

    /// A call that waits before the notifier's task first runs (a busy runtime, the server's
    /// first moment) is announced all the same: the notifier subscribed when it was made.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_waiting_before_the_notifier_first_runs_is_announced() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let dir = tempfile::tempdir().unwrap();
        let store = countersign_store::Store::open(
            dir.path().join("records.db"),
            countersign_store::StoreOptions::default(),
        )
        .unwrap();
        let engine = Engine::new(
            countersign_engine::EngineConfig::new(),
            std::sync::Arc::new(countersign_store::Sqlite::new(store)),
            Ok(countersign_core::token::SigningKey::new(&[7; 32]).unwrap()),
        );
        // The webhook: answers 200 and hands over what was posted.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let (posted, mut notices) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let posted = posted.clone();
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    let mut chunk = [0u8; 4096];
                    // Enough of the request to know what it announces.
                    while !String::from_utf8_lossy(&seen).contains("execute") {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let _ = stream
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                        .await;
                    let _ = posted.send(String::from_utf8_lossy(&seen).into_owned());
                });
            }
        });

        // Made, not yet run.
        let announcing = run(
            engine.clone(),
            "test-server".into(),
            None,
            vec![Webhook::Json(url)],
        );
        let tenant = engine.connect(countersign_core::ServerId::Command("upstream".into()));
        engine
            .register_tools(&tenant, vec![json!({"name": "execute"})])
            .await
            .unwrap();
        let mut changes = engine.subscribe();
        let asking = {
            let engine = engine.clone();
            tokio::spawn(async move {
                let args = json!({"sql": "DELETE FROM notes"});
                engine
                    .preflight(&tenant, "execute", &args, Duration::from_secs(30))
                    .await
            })
        };
        // The call waits (announced to the queue's subscribers) before the notifier runs.
        loop {
            if let Ok(QueueChange::Added { .. }) = changes.recv().await {
                break;
            }
        }
        tokio::spawn(announcing);
        let notice = tokio::time::timeout(Duration::from_secs(10), notices.recv())
            .await
            .expect("the waiting call was announced")
            .unwrap();
        assert!(notice.contains("test-server"), "{notice}");
        asking.abort();
    }

    fn slack_text(r: &PendingRequest) -> String {
        slack("s", r, None).unwrap()["text"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn a_target_cannot_make_a_link_or_a_heading_in_teams() {
        let r = request("[click](https://evil.example) # big **bold**");
        let card = teams("s", &r, None).unwrap();
        let text = card["attachments"][0]["content"]["body"][0]["text"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            text.contains("\\[click\\]\\(https://evil\\.example\\)"),
            "{text}"
        );
        assert!(text.contains("\\# big \\*\\*bold\\*\\*"), "{text}");
        assert_eq!(card["attachments"][0]["content"]["actions"], json!([]));
    }

    #[test]
    fn a_pagerduty_routing_key_never_shows_in_debug() {
        let hook = Webhook::PagerDuty {
            url: PAGERDUTY_URL.into(),
            routing_key: zeroize::Zeroizing::new("R0UT1NGKEY".into()),
        };
        assert!(!format!("{hook:?}").contains("R0UT1NGKEY"));
    }

    #[test]
    fn a_target_cannot_ping_a_channel_or_hide_a_link_in_slack() {
        let r = request("<!channel> <https://evil.example|click> & `x`");
        let text = slack_text(&r);
        assert!(!text.contains('<') && !text.contains('>'), "{text}");
        assert!(
            text.contains("&lt;!channel&gt;") && text.contains("&amp;"),
            "{text}"
        );
        assert!(!text.contains("`x`"), "{text}");
    }
}
