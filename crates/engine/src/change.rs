//! Requests to change the desk itself, queued for the same person and the same click as calls.
//!
//! Some changes must not take effect on anyone's word but the person's: a registered server's
//! command or secrets changed or removed from the command line, a policy file edited behind the
//! desk's back, a tool whose definition changed since the desk pinned it. Each is a [`Change`]
//! with the text as it is and as it would be; [`crate::Engine::propose`] queues it beside the
//! tool calls, the window shows old and new side by side, and Approve or Deny decide it with the
//! same approve delay. Approving a change mints nothing, so it needs no signing key and no typed
//! target. Who proposed it applies it once approved (for tools, the engine itself re-pins).
//!
//! What a change carries is bounded ([`MAX_CHANGE_TEXT_CHARS`], [`MAX_CHANGE_LABEL_CHARS`]) and
//! so is how many may wait ([`MAX_PENDING_CHANGES`]): no proposer can grow the queue or the
//! window's memory without bound.

use countersign_core::PlanHash;
use countersign_core::canonical;
use serde::Serialize;
use serde_json::{Map, Value};

/// The most changes waiting for a person at once. Changes do not count against an agent's
/// pending requests, and are capped on their own.
pub const MAX_PENDING_CHANGES: usize = 64;

/// The most of those that may be tool changes: an upstream decides what it lists, so its
/// listings alone must not fill the queue and turn away the person's own changes to servers
/// and policy, which always have the rest.
pub const MAX_PENDING_TOOL_CHANGES: usize = 48;

/// The most characters of a change's old or new text kept (and shown); the rest is cut with a
/// marker saying how much.
pub const MAX_CHANGE_TEXT_CHARS: usize = 64 * 1024;

/// The most characters of a change's subject, summary or origin kept.
pub const MAX_CHANGE_LABEL_CHARS: usize = 1024;

/// What a change is to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// A registered server (its command, URL, environment, secrets), changed or removed.
    Server,
    /// The policy file.
    Policy,
    /// A tool's definition, as its upstream lists it, against the one the desk pinned.
    Tool,
}

impl ChangeKind {
    /// A stable code: `server`, `policy`, `tool`.
    pub fn code(self) -> &'static str {
        match self {
            ChangeKind::Server => "server",
            ChangeKind::Policy => "policy",
            ChangeKind::Tool => "tool",
        }
    }
}

/// A proposed change to the desk, as the person is asked to decide it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// What it is to.
    pub kind: ChangeKind,
    /// Which one: a server's name, `policy.toml`, `<server identity> :: <tool>`.
    pub subject: String,
    /// One line: what changes.
    pub summary: String,
    /// The text as it is now (`None`: nothing yet).
    pub before: Option<String>,
    /// The text as it would be (`None`: removed).
    pub after: Option<String>,
    /// Who proposed it: `countersign server add (pid 123)`, `file edited outside the desk`, `the
    /// upstream's tool listing`.
    pub origin: String,
}

/// What the person decided about a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeDecision {
    /// Approved: the proposer applies it now.
    Approved,
    /// Denied (by the person, with their note; or by the desk, which cannot queue it: no window,
    /// or too many changes waiting, with a note saying so). Nothing changes.
    Denied {
        /// Why, when there is a note.
        note: Option<String>,
    },
    /// It left the queue undecided ([`crate::Engine::withdraw_change`]).
    Withdrawn,
}

/// `text` cut to `max` characters, with a marker saying how much was cut.
pub(crate) fn cut(text: String, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text,
        Some((end, _)) => {
            let rest = text[end..].chars().count();
            format!("{}… [cut: {rest} more characters]", &text[..end])
        }
    }
}

impl Change {
    /// The change with every text within its bound.
    pub(crate) fn bounded(self) -> Change {
        Change {
            kind: self.kind,
            subject: cut(self.subject, MAX_CHANGE_LABEL_CHARS),
            summary: cut(self.summary, MAX_CHANGE_LABEL_CHARS),
            before: self.before.map(|t| cut(t, MAX_CHANGE_TEXT_CHARS)),
            after: self.after.map(|t| cut(t, MAX_CHANGE_TEXT_CHARS)),
            origin: cut(self.origin, MAX_CHANGE_LABEL_CHARS),
        }
    }
}

/// The fields of a listed tool that the desk pins: what an agent reads and what decides its
/// class. Anything else the upstream sends (`_meta`, icons) may change freely.
pub const PINNED_FIELDS: [&str; 6] = [
    "name",
    "title",
    "description",
    "inputSchema",
    "outputSchema",
    "annotations",
];

/// The part of `tool` (a raw listing entry) that is pinned.
pub(crate) fn definition(tool: &Value) -> Value {
    let mut out = Map::new();
    for field in PINNED_FIELDS {
        if let Some(value) = tool.get(field) {
            out.insert(field.to_owned(), value.clone());
        }
    }
    Value::Object(out)
}

/// `value` with every object's keys in sorted order, whatever order the map keeps.
fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&map[k])))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// The definition's hash: SHA-256 of its canonical JSON (RFC 8785). A definition with no
/// canonical form (a number beyond what JCS allows) is hashed as its sorted compact JSON, which
/// still changes with any change of it.
pub(crate) fn definition_hash(definition: &Value) -> PlanHash {
    match canonical::to_string(definition) {
        Ok(text) => PlanHash::of_bytes(text.as_bytes()),
        Err(_) => {
            let text = serde_json::to_string(&sorted(definition)).unwrap_or_default();
            PlanHash::of_bytes(format!("noncanonical:{text}").as_bytes())
        }
    }
}

/// The definition as the person reads it: pretty-printed JSON with sorted keys.
pub(crate) fn definition_text(definition: &Value) -> String {
    serde_json::to_string_pretty(&sorted(definition)).unwrap_or_default()
}

/// What the agent is shown of a tool held back (see `ToolDecision::listed_as`): the listing
/// with every pinned field as the pin has it (a field the pin lacks is left out), or, with no
/// pin to show (a new tool, or a pin cut too short to read back), the name with a description
/// saying it waits for the person and an input schema that says nothing.
pub(crate) fn held_listing(tool: &Value, pinned: Option<&str>) -> Value {
    let mut listing = tool.as_object().cloned().unwrap_or_default();
    for field in PINNED_FIELDS {
        listing.remove(field);
    }
    let name = tool.get("name").cloned().unwrap_or(Value::Null);
    listing.insert("name".into(), name);
    match pinned.and_then(|p| serde_json::from_str::<Map<String, Value>>(p).ok()) {
        Some(pin) => {
            for field in PINNED_FIELDS.into_iter().filter(|f| *f != "name") {
                if let Some(value) = pin.get(field) {
                    listing.insert(field.into(), value.clone());
                }
            }
        }
        None => {
            listing.insert(
                "description".into(),
                Value::String(
                    "Held back by Countersign: the person has not yet accepted this tool's \
                     definition in the Countersign desk. Calls are refused until they do."
                        .into(),
                ),
            );
            listing.insert("inputSchema".into(), serde_json::json!({"type": "object"}));
        }
    }
    Value::Object(listing)
}

/// One line saying which fields of a tool's definition differ between `before` and `after`
/// (both JSON texts as [`definition_text`] writes them).
pub(crate) fn tool_summary(tool: &str, before: &str, after: &str) -> String {
    let parse = |t: &str| serde_json::from_str::<Value>(t).unwrap_or(Value::Null);
    let (old, new) = (parse(before), parse(after));
    let differing: Vec<&str> = PINNED_FIELDS
        .into_iter()
        .filter(|f| old.get(f) != new.get(f))
        .collect();
    if differing.is_empty() || old.is_null() {
        format!("The definition of the tool `{tool}` changed since the desk pinned it")
    } else {
        format!(
            "The tool `{tool}` changed its {} since the desk pinned it",
            differing.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_pinned_definition_leaves_out_what_may_change_freely() {
        let tool = json!({"name": "a", "description": "d", "_meta": {"x": 1}, "icons": []});
        assert_eq!(definition(&tool), json!({"name": "a", "description": "d"}));
        let moved = json!({"description": "d", "name": "a", "_meta": {"x": 2}});
        assert_eq!(
            definition_hash(&definition(&tool)),
            definition_hash(&definition(&moved))
        );
        let changed = json!({"name": "a", "description": "d."});
        assert_ne!(
            definition_hash(&definition(&tool)),
            definition_hash(&definition(&changed))
        );
    }

    #[test]
    fn definition_text_sorts_keys_at_every_depth() {
        let text = definition_text(
            &json!({"name": "a", "inputSchema": {"type": "object", "properties": {}}}),
        );
        assert_eq!(
            text,
            "{\n  \"inputSchema\": {\n    \"properties\": {},\n    \"type\": \"object\"\n  },\n  \"name\": \"a\"\n}"
        );
    }

    #[test]
    fn the_summary_names_the_fields_that_differ() {
        let old = definition_text(&json!({"name": "a", "description": "d"}));
        let new = definition_text(&json!({"name": "a", "description": "e", "annotations": {}}));
        assert_eq!(
            tool_summary("a", &old, &new),
            "The tool `a` changed its description, annotations since the desk pinned it"
        );
    }

    #[test]
    fn long_texts_are_cut_with_a_marker() {
        let change = Change {
            kind: ChangeKind::Policy,
            subject: "s".repeat(MAX_CHANGE_LABEL_CHARS + 1),
            summary: String::new(),
            before: None,
            after: Some("x".repeat(MAX_CHANGE_TEXT_CHARS + 2)),
            origin: String::new(),
        }
        .bounded();
        assert!(change.subject.ends_with("[cut: 1 more characters]"));
        assert!(change.after.unwrap().ends_with("[cut: 2 more characters]"));
    }
}
