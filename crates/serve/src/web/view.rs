//! A waiting call as the approvers' page shows it: the fields the desk's window shows for a
//! request, each string from an agent or an upstream escaped and flagged by
//! `countersign_core::shown` exactly as the desk does, built from the plan (never from rendered
//! text). The page only lays these out, as `textContent`.

use countersign_core::plan::Plan;
use countersign_core::shown::{agent_name, shown, shown_details};
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
