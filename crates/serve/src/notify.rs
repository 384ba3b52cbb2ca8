//! Telling people a call waits: a webhook on each new request.
//!
//! A team's approvers are not always looking at their desks. On each new waiting call the
//! server posts to the configured webhooks: a generic JSON document (`--webhook URL`) or Slack's
//! incoming-webhook shape (`--slack-webhook URL`). What is posted names who asks, the tool, the
//! target, the class and the server; never the call's arguments (a secret may be among them), a
//! token or anything else the approval binds beyond what a person needs to go and look. A
//! webhook that fails is tried twice more and then given up on (logged): the request still
//! waits for the desks, which do not depend on it.
//!
//! The text comes from the agent and the upstream (the tool's name, the target): in Slack's
//! shape `&`, `<` and `>` are escaped, so a target cannot ping a channel or hide a link.

use std::time::Duration;

use countersign_engine::{Engine, PendingRequest, QueueChange};
use serde_json::{Value, json};

/// How long one delivery may take.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// How many times a delivery is tried.
pub const ATTEMPTS: u32 = 3;

/// A webhook and its shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Webhook {
    /// A generic JSON document.
    Json(String),
    /// Slack's incoming webhook (`{"text": …}`).
    Slack(String),
}

impl Webhook {
    fn url(&self) -> &str {
        match self {
            Webhook::Json(url) | Webhook::Slack(url) => url,
        }
    }
}

/// The generic document for `request` waiting on `server`.
pub fn generic(server: &str, request: &PendingRequest) -> Option<Value> {
    let call = request.call()?;
    Some(json!({
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
    }))
}

/// Slack's escaping of text it would otherwise read as markup.
fn slack_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The Slack message for `request` waiting on `server`.
pub fn slack(server: &str, request: &PendingRequest) -> Option<Value> {
    let call = request.call()?;
    let text = format!(
        "Countersign: {} asks to run `{}` on `{}` ({}, {}). Approve or deny it at your desk.",
        slack_escape(call.tenant.as_str()),
        slack_escape(&request.plan.tool).replace('`', "'"),
        slack_escape(&request.plan.target).replace('`', "'"),
        if call.class.is_single_use() {
            "works once"
        } else {
            "reusable until it expires"
        },
        slack_escape(server),
    );
    Some(json!({ "text": text }))
}

/// Posts every new waiting call of `engine` to `hooks`, naming the server `server`, for as long
/// as the engine lives.
pub async fn run(engine: Engine, server: String, hooks: Vec<Webhook>) {
    if hooks.is_empty() {
        return;
    }
    let client = reqwest::Client::builder()
        .timeout(TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_default();
    let mut changes = engine.subscribe();
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
        for hook in &hooks {
            let body = match hook {
                Webhook::Json(_) => generic(&server, &request),
                Webhook::Slack(_) => slack(&server, &request),
            };
            let Some(body) = body else { continue };
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
            }),
        }
    }

    #[test]
    fn a_notice_names_who_what_and_where_and_never_the_arguments() {
        let r = request("notes");
        for body in [generic("https://team", &r), slack("https://team", &r)] {
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
        assert_eq!(generic("s", &r).unwrap()["approvers"], 2);
    }

    #[test]
    fn a_target_cannot_ping_a_channel_or_hide_a_link_in_slack() {
        let r = request("<!channel> <https://evil.example|click> & `x`");
        let text = slack("s", &r).unwrap()["text"].as_str().unwrap().to_owned();
        assert!(!text.contains('<') && !text.contains('>'), "{text}");
        assert!(
            text.contains("&lt;!channel&gt;") && text.contains("&amp;"),
            "{text}"
        );
        assert!(!text.contains("`x`"), "{text}");
    }
}
