//! A waiting call (or a change of the server's rules) as the approvers' page shows it: the fields the desk's window shows for a
//! request, each string from an agent or an upstream escaped and flagged by
//! `countersign_core::shown` exactly as the desk does, built from the plan (never from rendered
//! text). The page only lays these out, as `textContent`.

use countersign_core::diff;
use countersign_core::plan::Plan;
use countersign_core::shown::{agent_name, shown, shown_details};
use countersign_engine::text_hash;
use countersign_store::WaitingCall;
use serde_json::{Value, json};

/// `row` as the page shows it, with the approvers who approved it so far; `None` for a row that
/// is not a call whose plan is the plan hashed (it is not shown at all).
pub(super) fn call(row: &WaitingCall, approved_by: &[String]) -> Option<Value> {
    let request: Value = serde_json::from_str(&row.request).ok()?;
    let plan: Plan = serde_json::from_value(request["plan"].clone()).ok()?;
    let asks = &request["asks"];
    if asks["kind"] != "call" || plan.hash().ok()? != row.plan {
        return None;
    }
    let class = asks["class"].as_str()?;
    Some(json!({
        "id": row.id,
        "agent": shown(&agent_name(&asks["client_info"])),
        "tenant": shown(&row.tenant),
        "server": shown(asks["server"].as_str().unwrap_or_default()),
        "tool": shown(&plan.tool),
        // Only compared with what the person types, never put on screen.
        "target": plan.target,
        "targetShown": shown(&plan.target),
        "action": shown(&plan.action),
        "summary": shown(&plan.summary),
        "reversible": plan.reversible,
        "worksOnce": class == "once",
        "typeTarget": asks["type_target"].as_bool().unwrap_or(false),
        "tokenTtlMs": asks["token_ttl_ms"].as_u64().unwrap_or(0),
        "arrivedAtMs": row.arrived_at_ms,
        "details": shown_details(&plan.details),
        "planHash": row.plan.to_hex(),
        "why": shown(asks["why"].as_str().unwrap_or_default()),
        "preview": request.get("preview").filter(|p| !p.is_null()).map(preview),
        "needed": row.approvers,
        "approvedBy": approved_by.iter().map(|n| shown(n)).collect::<Vec<_>>(),
    }))
}

/// `row` as the page shows it when it is a change of the server's rules (`crate::rules`): the
/// fields a call has, said of the change, and the change itself (what it does, as the solver
/// decided it, and old beside new as rows of a line diff made here, each line escaped and
/// flagged). `None` unless the plan is the plan hashed and names by hash exactly the texts shown.
pub(super) fn change(row: &WaitingCall, approved_by: &[String]) -> Option<Value> {
    let request: Value = serde_json::from_str(&row.request).ok()?;
    let plan: Plan = serde_json::from_value(request["plan"].clone()).ok()?;
    let asks = &request["asks"];
    let change = &asks["change"];
    if asks["kind"] != "change" || plan.hash().ok()? != row.plan {
        return None;
    }
    let (before, after) = (change["before"].as_str(), change["after"].as_str());
    let named = |text: Option<&str>, key: &str| {
        plan.details[key].as_str().map(str::to_owned) == text.map(text_hash)
    };
    if !named(before, "before_sha256") || !named(after, "after_sha256") {
        return None;
    }
    let rows: Vec<Value> = diff::lines(before, after)
        .iter()
        .map(|r| {
            json!({
                "kind": r.kind,
                "before": r.before.as_deref().map(shown),
                "after": r.after.as_deref().map(shown),
                "before_line": r.before_line,
                "after_line": r.after_line,
            })
        })
        .collect();
    let origin = change["origin"].as_str().unwrap_or_default();
    Some(json!({
        "id": row.id,
        "agent": shown(origin),
        "tenant": shown(&row.tenant),
        "server": shown(&row.server),
        "tool": shown(&plan.tool),
        "target": plan.target,
        "targetShown": shown(&plan.target),
        "action": shown(&plan.action),
        "summary": shown(&plan.summary),
        "reversible": true,
        "worksOnce": true,
        "typeTarget": false,
        "tokenTtlMs": 0,
        "arrivedAtMs": row.arrived_at_ms,
        "details": shown_details(&plan.details),
        "planHash": row.plan.to_hex(),
        "why": shown("a change of the rules waits for the approvers"),
        "preview": null,
        "needed": row.approvers,
        "approvedBy": approved_by.iter().map(|n| shown(n)).collect::<Vec<_>>(),
        "change": {
            "analysis": shown(change["analysis"].as_str().unwrap_or(
                "What it changes is not known (not_analysed); read the text",
            )),
            "rows": rows,
        },
    }))
}

/// What the engine previewed of the call, each string shown as every other.
fn preview(value: &Value) -> Value {
    fn walk(value: &Value) -> Value {
        match value {
            Value::String(s) => json!(shown(s)),
            Value::Array(items) => Value::Array(items.iter().map(walk).collect()),
            Value::Object(map) => {
                Value::Object(map.iter().map(|(k, v)| (k.clone(), walk(v))).collect())
            }
            other => other.clone(),
        }
    }
    walk(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use countersign_core::PlanHash;

    /// A waiting row of a change of the rules from `before` to `after`, as the mirror shares it.
    fn change_row(before: &str, after: &str) -> WaitingCall {
        let plan = Plan {
            tool: "change:policy".into(),
            target: "policy.cedar".into(),
            action: "change".into(),
            summary: "The rules change".into(),
            details: json!({"origin": "the --rules file", "before_sha256": text_hash(before),
                            "after_sha256": text_hash(after)}),
            reversible: true,
        };
        let hash = plan.hash().unwrap();
        let request = json!({
            "id": 3, "plan": plan, "text": "", "arrived_at_ms": 1, "preview": null,
            "asks": {"kind": "change", "tenant": "change", "class": "once",
                     "plan_hash": hash.to_hex(), "type_target": false, "approvers": 2,
                     "change": {"kind": "policy", "subject": "policy.cedar", "summary": "s",
                                "before": before, "after": after, "origin": "the --rules file",
                                "analysis": "It widens; calls the solver found: execute \u{202e}x"}},
        });
        WaitingCall {
            id: 3,
            replica: "r".into(),
            local_id: 1,
            server: "https://team".into(),
            tenant: "change".into(),
            plan: hash,
            request: request.to_string(),
            approvers: 2,
            arrived_at_ms: 1,
            expires_at_ms: 2,
            verdict: None,
            note: None,
            minted_by: None,
        }
    }

    #[test]
    fn a_rules_change_is_shown_as_what_it_does_and_old_beside_new_only_when_its_plan_names_the_texts()
     {
        let row = change_row("forbid (principal, action, resource);\n", "");
        let shown = change(&row, &["alice".to_owned()]).expect("shown");
        assert_eq!(shown["needed"], 2);
        assert_eq!(shown["typeTarget"], false);
        let analysis = &shown["change"]["analysis"];
        assert!(analysis["text"].as_str().unwrap().starts_with("It widens"));
        assert!(
            analysis["flags"]
                .as_array()
                .unwrap()
                .contains(&json!("bidi")),
            "flagged as every string is: {analysis}"
        );
        let rows = shown["change"]["rows"].as_array().unwrap();
        assert_eq!(rows[0]["kind"], "removed", "{rows:?}");
        // A call's view refuses it, and a change whose text is not the one its plan names is
        // not shown at all.
        assert!(call(&row, &[]).is_none());
        let mut other = row.clone();
        other.request = other
            .request
            .replace("forbid (principal", "permit (principal");
        assert!(change(&other, &[]).is_none());
        let mut rehashed = row;
        rehashed.plan = PlanHash::from_bytes([1; 32]);
        assert!(change(&rehashed, &[]).is_none());
    }
}
