//! What the window is sent: plain data, each field named in `ui/contract.json` (a test checks the
//! two agree), strings the front end only ever puts into `textContent`.
//!
//! The target is sent twice: as it is, and as shown, with invisible and direction-changing
//! characters escaped (the same rule as the preflight text) and flags that say why it looks odd,
//! so that `safe\u{202e}txt.exe` cannot pass for another name.

use countersign_core::render;
use countersign_engine::PendingRequest;
use serde::Serialize;
use serde_json::Value;

/// A request in the queue, as the approval view shows it.
#[derive(Debug, Clone, Serialize)]
pub struct RequestView {
    /// The queue's id.
    pub id: u64,
    /// The agent: `clientInfo` name and version.
    pub agent: String,
    /// The server the gateway stands in front of.
    pub server: String,
    /// The tool.
    pub tool: String,
    /// The target, as it is.
    pub target: String,
    /// The target, as shown: deceptive characters escaped.
    pub target_shown: String,
    /// Why the target looks odd: `bidi`, `invisible`, `non_ascii`.
    pub target_flags: Vec<&'static str>,
    /// The action.
    pub action: String,
    /// The summary.
    pub summary: String,
    /// Whether it can be undone.
    pub reversible: bool,
    /// Whether the token works once (`once`) or until it expires (`token`).
    pub works_once: bool,
    /// Whether Approve needs the target typed.
    pub type_target: bool,
    /// How long the token would live, in ms.
    pub token_ttl_ms: u64,
    /// When it arrived, ms since the epoch.
    pub arrived_at_ms: u64,
    /// The details exactly as hashed: sorted keys, types visible.
    pub details: String,
    /// The plan hash.
    pub plan_hash: String,
}

fn is_bidi(c: char) -> bool {
    matches!(c, '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Why a target deserves a second look.
pub fn target_flags(target: &str) -> Vec<&'static str> {
    let mut flags = Vec::new();
    if target.chars().any(is_bidi) {
        flags.push("bidi");
    }
    if target
        .chars()
        .any(|c| render::is_deceptive(c) && !is_bidi(c))
    {
        flags.push("invisible");
    }
    if !target.is_ascii() {
        flags.push("non_ascii");
    }
    flags
}

/// A string as shown: invisible, direction-changing and control characters escaped as `\u{...}`,
/// the rest as it is.
pub fn visible(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if render::is_deceptive(c) || c.is_control() {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

fn agent_name(client_info: &Value) -> String {
    let name = client_info
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("unknown agent");
    match client_info.get("version").and_then(Value::as_str) {
        Some(v) => format!("{name} {v}"),
        None => name.to_owned(),
    }
}

impl From<&PendingRequest> for RequestView {
    fn from(r: &PendingRequest) -> Self {
        let shown = render::quoted(&r.plan.target);
        let details = r
            .text
            .split_once("Details:")
            .map_or(String::new(), |(_, d)| d.trim_start_matches(' ').to_owned());
        RequestView {
            id: r.id,
            agent: visible(&agent_name(&r.client_info)),
            server: visible(&r.server),
            tool: visible(&r.plan.tool),
            target: r.plan.target.clone(),
            target_shown: shown[1..shown.len() - 1].to_owned(),
            target_flags: target_flags(&r.plan.target),
            action: visible(&r.plan.action),
            summary: visible(&r.plan.summary),
            reversible: r.plan.reversible,
            works_once: r.class.is_single_use(),
            type_target: r.type_target,
            token_ttl_ms: r.token_ttl_ms,
            arrived_at_ms: r.arrived_at_ms,
            details: details.trim_start_matches('\n').to_owned(),
            plan_hash: r.plan_hash.to_hex(),
        }
    }
}

/// An error as the window receives it: a stable code to branch on, and a sentence to show.
#[derive(Debug, Clone, Serialize)]
pub struct UiError {
    /// Stable: `not_pending`, `target_not_typed`, `no_secret`, `store_failed`, `bad_policy`, `io`.
    pub code: &'static str,
    /// For the person.
    pub message: String,
}

impl UiError {
    /// An error with a code and a message.
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<countersign_engine::ApproveError> for UiError {
    fn from(e: countersign_engine::ApproveError) -> Self {
        UiError::new(e.code(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_receives_exactly_the_fields_of_its_contract() {
        let contract: serde_json::Value =
            serde_json::from_str(include_str!("../../ui/contract.json"))
                .expect("contract.json parses");
        let keys = |v: serde_json::Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        let expected = |name: &str| -> Vec<String> {
            let mut k: Vec<String> = contract[name]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect();
            k.sort();
            k
        };
        let plan = countersign_core::Plan {
            tool: "t".into(),
            target: "x".into(),
            action: "t".into(),
            summary: "t on x".into(),
            details: serde_json::json!({"a": 1}),
            reversible: false,
        };
        let request = PendingRequest {
            id: 1,
            tenant: "c".into(),
            client_info: serde_json::json!({"name": "agent"}),
            server: "s".into(),
            text: countersign_core::render::plan_text(&plan),
            plan_hash: plan.hash().unwrap(),
            plan,
            class: countersign_core::GateClass::Once,
            type_target: false,
            token_ttl_ms: 600_000,
            arrived_at_ms: 0,
        };
        assert_eq!(
            keys(serde_json::to_value(RequestView::from(&request)).unwrap()),
            expected("RequestView")
        );
        assert_eq!(
            keys(serde_json::to_value(UiError::new("io", "m")).unwrap()),
            expected("UiError")
        );
        let event = countersign_core::telemetry::ConfirmEvent {
            at_ms: 1,
            kind: countersign_core::telemetry::EventKind::Refused {
                refusal: countersign_core::Refusal::Expired,
            },
            tool: "t".into(),
            target: None,
            tenant: "c".into(),
            nonce: None,
            plan: None,
            note: None,
        };
        let row = serde_json::to_value(crate::commands::HistoryRow {
            event,
            server: None,
        })
        .unwrap();
        let allowed = expected("HistoryRow");
        for key in keys(row) {
            assert!(
                allowed.contains(&key),
                "history field {key} is not in contract.json"
            );
        }
    }

    #[test]
    fn agent_text_shows_invisible_characters_escaped() {
        assert_eq!(
            visible("delete on a\u{202e}b\n"),
            "delete on a\\u{202e}b\\u{a}"
        );
        assert_eq!(visible("plain text"), "plain text");
    }

    #[test]
    fn bidi_and_zero_width_targets_are_flagged_and_escaped() {
        let target = "invoice\u{202e}fdp.exe\u{200b}";
        assert_eq!(target_flags(target), vec!["bidi", "invisible", "non_ascii"]);
        let shown = render::quoted(target);
        assert!(shown.contains("\\u{202e}") && shown.contains("\\u{200b}"));
        assert!(target_flags("/tmp/a.txt").is_empty());
        assert_eq!(
            target_flags("pаypal.com"),
            vec!["non_ascii"],
            "a Cyrillic а is a look-alike"
        );
    }
}
