//! Gate classes: how much proof a tool's call needs before it runs.
//!
//! The default comes from the tool's MCP annotations, read the way MCP's own defaults read them:
//! a tool that says nothing is assumed destructive and not idempotent, so it gets the strictest
//! class. Annotations are hints from the upstream, so only a literal `true`/`false` counts; anything
//! else is treated as absent, which again lands on the strict side. Policy may override the class.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How a tool is gated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateClass {
    /// Forwarded at once, no token (read-only tools).
    Open,
    /// Needs a valid token, which may be used again for the same plan until it expires.
    Token,
    /// Needs a valid token whose nonce is spent in the ledger first: it works exactly once.
    Once,
}

impl GateClass {
    /// The class MCP annotations call for (docs/design.md, "Gate classes and plans"):
    /// `readOnlyHint: true` is [`GateClass::Open`]; `readOnlyHint: false` (or absent) with
    /// `destructiveHint: false` and `idempotentHint: true` is [`GateClass::Token`]; everything
    /// else, including no annotations at all, is [`GateClass::Once`].
    pub fn from_annotations(annotations: Option<&Value>) -> GateClass {
        let hint = |name: &str| {
            annotations
                .and_then(|a| a.get(name))
                .and_then(Value::as_bool)
        };
        if hint("readOnlyHint") == Some(true) {
            GateClass::Open
        } else if hint("destructiveHint") == Some(false) && hint("idempotentHint") == Some(true) {
            GateClass::Token
        } else {
            GateClass::Once
        }
    }

    /// The stable name: `open`, `token`, `once`.
    pub fn code(self) -> &'static str {
        match self {
            GateClass::Open => "open",
            GateClass::Token => "token",
            GateClass::Once => "once",
        }
    }

    /// Parses a stable name.
    pub fn from_code(code: &str) -> Option<GateClass> {
        [GateClass::Open, GateClass::Token, GateClass::Once]
            .into_iter()
            .find(|c| c.code() == code)
    }

    /// Whether calls need a token at all.
    pub fn is_gated(self) -> bool {
        self != GateClass::Open
    }

    /// Whether the token's nonce is spent in the ledger.
    pub fn is_single_use(self) -> bool {
        self == GateClass::Once
    }
}

/// Whether the tool declares itself destructive: by MCP's default, a tool that is not read-only
/// and says nothing about it is. Drives the default for "reversible" and for typing the target.
pub fn is_destructive(annotations: Option<&Value>) -> bool {
    let hint = |name: &str| {
        annotations
            .and_then(|a| a.get(name))
            .and_then(Value::as_bool)
    };
    hint("readOnlyHint") != Some(true) && hint("destructiveHint") != Some(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn no_annotations_is_once() {
        assert_eq!(GateClass::from_annotations(None), GateClass::Once);
        assert_eq!(
            GateClass::from_annotations(Some(&json!({}))),
            GateClass::Once
        );
    }

    #[test]
    fn read_only_tool_is_open() {
        let a = json!({"readOnlyHint": true, "destructiveHint": true});
        assert_eq!(GateClass::from_annotations(Some(&a)), GateClass::Open);
    }

    #[test]
    fn non_destructive_idempotent_tool_is_token() {
        let a = json!({"readOnlyHint": false, "destructiveHint": false, "idempotentHint": true});
        assert_eq!(GateClass::from_annotations(Some(&a)), GateClass::Token);
        let a = json!({"destructiveHint": false, "idempotentHint": true});
        assert_eq!(GateClass::from_annotations(Some(&a)), GateClass::Token);
    }

    #[test]
    fn destructive_or_non_idempotent_tool_is_once() {
        for a in [
            json!({"readOnlyHint": false}),
            json!({"destructiveHint": true, "idempotentHint": true}),
            json!({"destructiveHint": false}),
            json!({"destructiveHint": false, "idempotentHint": false}),
            json!({"idempotentHint": true}),
        ] {
            assert_eq!(
                GateClass::from_annotations(Some(&a)),
                GateClass::Once,
                "{a}"
            );
        }
    }

    #[test]
    fn hints_that_are_not_booleans_count_as_absent() {
        let a = json!({"readOnlyHint": "true"});
        assert_eq!(GateClass::from_annotations(Some(&a)), GateClass::Once);
        let a = json!({"destructiveHint": 0, "idempotentHint": 1});
        assert_eq!(GateClass::from_annotations(Some(&a)), GateClass::Once);
    }

    #[test]
    fn destructive_follows_mcp_defaults() {
        assert!(is_destructive(None));
        assert!(is_destructive(Some(&json!({"readOnlyHint": false}))));
        assert!(!is_destructive(Some(&json!({"destructiveHint": false}))));
        assert!(!is_destructive(Some(&json!({"readOnlyHint": true}))));
    }

    #[test]
    fn class_codes_round_trip() {
        for c in [GateClass::Open, GateClass::Token, GateClass::Once] {
            assert_eq!(GateClass::from_code(c.code()), Some(c));
        }
        assert!(GateClass::Once.is_single_use() && !GateClass::Token.is_single_use());
        assert!(!GateClass::Open.is_gated());
    }
}
