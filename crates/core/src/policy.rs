//! Policy: from a tool's definition and a call's arguments to the plan a person approves.
//!
//! The desk owns the policy (a TOML file it reads; evaluating it is pure and lives here). Per
//! server and per tool it may set the gate class, a target template (`{owner}/{repo}`, or just an
//! argument name), a summary template, and whether approving needs the target typed. Without a
//! rule: the class comes from the tool's annotations, the target is the first present argument
//! among [`TARGET_KEYS`] that the tool's own `inputSchema` declares (its `properties` keys; an
//! argument the tool does not declare is never the target, so an agent cannot steer what the
//! person is shown by adding a decoy), else the tool's name; the action is the tool's name,
//! reversible is "not destructive", and typing the target is required for tools annotated
//! destructive. A target set by policy (a template or an argument name) is the person's own
//! choice and is used as written.
//! Summaries come from templates and plan fields, never from free text the agent wrote.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::canonical::{self, CanonicalError};
use crate::gate::{self, GateClass};
use crate::plan::Plan;

/// Argument names tried, in order, for a call's default target (docs/design.md, "Gate classes
/// and plans"); only those the tool's `inputSchema` declares are considered.
pub const TARGET_KEYS: &[&str] = &[
    "path",
    "source",
    "uri",
    "url",
    "name",
    "id",
    "table",
    "repo",
    "file",
    "key",
    "database",
    "branch",
    "cluster",
    "resource",
    "destination",
    "target",
];

/// The default summary template.
pub const DEFAULT_SUMMARY: &str = "{action} on {target}";

/// The arguments Countersign adds to gated tools; an upstream tool that already has one of them
/// cannot be offered.
pub const CONFIRM_ARGUMENTS: [&str; 3] = ["confirm", "confirmTarget", "confirmToken"];

/// The policy file's shape.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Rules per server name (`--name`, else the upstream's `serverInfo.name`).
    #[serde(default)]
    pub servers: BTreeMap<String, ServerPolicy>,
    /// Recipes for previewing calls (`[[preview]]`), tried before the built-in ones
    /// ([`default_recipes`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preview: Vec<PreviewRecipe>,
}

/// What a preview recipe does with a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PreviewKind {
    /// The call writes `content` to `path`: the file is read through `read`, and the window
    /// shows it beside the new content.
    Write,
    /// The call moves `source` to `destination`: `read` is asked about the destination, and the
    /// window shows both and whether the destination exists.
    Move,
    /// The call creates the directory `path`: `read` is asked about it, and the window shows
    /// whether it exists.
    CreateDir,
    /// server-filesystem's `edit_file`: the upstream's own dry run (`dryRun: true`) of the same
    /// edits, re-serialized by the desk. Only the built-in recipe has it: a policy cannot make the
    /// desk call a tool that is not read-only.
    #[serde(skip_deserializing)]
    Edit,
}

/// A recipe for previewing one tool's calls: which read-only tool of the same upstream to ask,
/// and which of the call's arguments mean what. The read tool must be listed by that upstream
/// with `readOnlyHint: true`, or the preview is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreviewRecipe {
    /// The server it applies to; every server when unset.
    pub server: Option<String>,
    /// The tool whose calls it previews.
    pub tool: String,
    /// What the call does.
    pub kind: PreviewKind,
    /// The read-only tool asked (called with `{"path": ...}`); unused for [`PreviewKind::Edit`].
    #[serde(default)]
    pub read: Option<String>,
    /// The argument naming the file or directory.
    #[serde(default = "default_path")]
    pub path: String,
    /// The argument holding the new content.
    #[serde(default = "default_content")]
    pub content: String,
    /// The argument naming what moves.
    #[serde(default = "default_source")]
    pub source: String,
    /// The argument naming where it moves.
    #[serde(default = "default_destination")]
    pub destination: String,
}

fn default_path() -> String {
    "path".to_owned()
}
fn default_content() -> String {
    "content".to_owned()
}
fn default_source() -> String {
    "source".to_owned()
}
fn default_destination() -> String {
    "destination".to_owned()
}

/// The built-in recipes: server-filesystem's `write_file`, `edit_file`, `move_file` and
/// `create_directory` (on any server listing them with its read-only `read_text_file` and
/// `get_file_info`).
pub fn default_recipes() -> Vec<PreviewRecipe> {
    let recipe = |tool: &str, kind, read: Option<&str>| PreviewRecipe {
        server: None,
        tool: tool.to_owned(),
        kind,
        read: read.map(str::to_owned),
        path: default_path(),
        content: default_content(),
        source: default_source(),
        destination: default_destination(),
    };
    vec![
        recipe("write_file", PreviewKind::Write, Some("read_text_file")),
        recipe("edit_file", PreviewKind::Edit, None),
        recipe("move_file", PreviewKind::Move, Some("get_file_info")),
        recipe(
            "create_directory",
            PreviewKind::CreateDir,
            Some("get_file_info"),
        ),
    ]
}

/// Rules for one server.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerPolicy {
    /// Applies to every tool of the server, under the tool's own rule.
    #[serde(default)]
    pub all: ToolPolicy,
    /// Rules per tool name.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolPolicy>,
}

/// Overrides for a tool; what is unset falls back to the server's `all`, then to the defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolPolicy {
    /// The gate class.
    pub class: Option<GateClass>,
    /// Target template: `{owner}/{repo}`, or a bare argument name.
    pub target: Option<String>,
    /// Summary template: `{tool}`, `{action}`, `{target}` and argument names in braces.
    pub summary: Option<String>,
    /// Whether approving needs the target typed.
    pub type_target: Option<bool>,
    /// Whether a person may widen an approval of this tool into a grant (later matching calls
    /// approved without a click) although the tool is destructive or asks for its target typed.
    /// Unset: grants only for tools that are neither.
    pub grants: Option<bool>,
    /// How many distinct approvers must approve a call, on a team's server (1 to
    /// [`MAX_APPROVERS`]; unset: 1). The desk has one person and asks one.
    pub approvers: Option<u8>,
}

/// The most distinct approvers a policy may ask for one call.
pub const MAX_APPROVERS: u8 = 9;

/// What policy decided for one tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolRule {
    /// The gate class.
    pub class: GateClass,
    /// Whether the tool is (by annotation) destructive; drives `reversible`.
    pub destructive: bool,
    /// Whether approving needs the target typed.
    pub type_target: bool,
    /// The target template, if any.
    pub target: Option<String>,
    /// The summary template.
    pub summary: String,
    /// The argument names the tool's `inputSchema` declares (its `properties` keys), sorted.
    /// Only these can be the default target; a tool that declares none is its own target.
    #[serde(default)]
    pub declared: Vec<String>,
    /// Why the tool has its class, for the person: the policy line that set it, or the
    /// annotations (or their absence) it follows from.
    #[serde(default)]
    pub why: String,
    /// Whether policy lets a person widen an approval of this tool into a grant even though it
    /// is destructive or asks for its target typed (`grants = true`).
    #[serde(default)]
    pub grants: bool,
    /// How many distinct approvers must approve a call on a team's server.
    #[serde(default = "one")]
    pub approvers: u8,
}

fn one() -> u8 {
    1
}

/// Why a policy's text was refused ([`Policy::from_toml`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The text is not TOML, or not in a policy's shape (an unknown key, a value of the wrong
    /// type); the message says where.
    #[error("{0}")]
    Toml(#[source] toml::de::Error),
    /// A rule asks for a number of approvers out of 1 to [`MAX_APPROVERS`].
    #[error("[{table}] approvers = {approvers}: it must be 1 to {MAX_APPROVERS}")]
    Approvers {
        /// The rule's table, e.g. `servers.db.all`.
        table: String,
        /// The number it asks for.
        approvers: u8,
    },
}

impl Policy {
    /// Parses the TOML text of a policy file. An `approvers` count out of 1 to
    /// [`MAX_APPROVERS`] is refused, naming where it is.
    pub fn from_toml(text: &str) -> Result<Policy, PolicyError> {
        let policy: Policy = toml::from_str(text).map_err(PolicyError::Toml)?;
        for (server, rules) in &policy.servers {
            let named = std::iter::once(("all".to_owned(), &rules.all)).chain(
                rules
                    .tools
                    .iter()
                    .map(|(tool, rule)| (format!("tools.{}", toml_key(tool)), rule)),
            );
            for (place, rule) in named {
                if let Some(n) = rule.approvers
                    && !(1..=MAX_APPROVERS).contains(&n)
                {
                    return Err(PolicyError::Approvers {
                        table: format!("servers.{}.{place}", toml_key(server)),
                        approvers: n,
                    });
                }
            }
        }
        Ok(policy)
    }

    /// The rule for `tool` (a raw MCP tool definition) of `server`.
    pub fn rule(&self, server: &str, tool: &Value) -> ToolRule {
        let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
        let annotations = tool.get("annotations");
        let server_policy = self.servers.get(server);
        let own = server_policy.and_then(|s| s.tools.get(name));
        let all = server_policy.map(|s| &s.all);
        let pick = |f: fn(&ToolPolicy) -> Option<&String>| {
            own.and_then(f).or_else(|| all.and_then(f)).cloned()
        };
        let destructive = gate::is_destructive(annotations);
        let (class, why) = match (own.and_then(|p| p.class), all.and_then(|p| p.class)) {
            (Some(class), _) => (
                class,
                format!(
                    "policy: [servers.{}.tools.{}] class = \"{}\"",
                    toml_key(server),
                    toml_key(name),
                    class.code()
                ),
            ),
            (None, Some(class)) => (
                class,
                format!(
                    "policy: [servers.{}.all] class = \"{}\"",
                    toml_key(server),
                    class.code()
                ),
            ),
            (None, None) => (
                GateClass::from_annotations(annotations),
                annotation_reason(annotations),
            ),
        };
        ToolRule {
            class,
            why,
            destructive,
            type_target: own
                .and_then(|p| p.type_target)
                .or_else(|| all.and_then(|p| p.type_target))
                .unwrap_or(
                    destructive
                        && annotations.and_then(|a| a.get("destructiveHint"))
                            == Some(&Value::Bool(true)),
                ),
            target: pick(|p| p.target.as_ref()),
            summary: pick(|p| p.summary.as_ref()).unwrap_or_else(|| DEFAULT_SUMMARY.to_owned()),
            declared: declared_arguments(tool),
            grants: own
                .and_then(|p| p.grants)
                .or_else(|| all.and_then(|p| p.grants))
                .unwrap_or(false),
            approvers: own
                .and_then(|p| p.approvers)
                .or_else(|| all.and_then(|p| p.approvers))
                .unwrap_or(1)
                .clamp(1, MAX_APPROVERS),
        }
    }
}

impl Policy {
    /// The recipe that previews calls of `tool` on `server`: the policy's own first, then the
    /// built-in ones.
    pub fn recipe(&self, server: &str, tool: &str) -> Option<PreviewRecipe> {
        self.preview
            .iter()
            .cloned()
            .chain(default_recipes())
            .find(|r| r.tool == tool && r.server.as_deref().is_none_or(|s| s == server))
    }
}

/// A key as the policy file writes it: bare when it can be, quoted otherwise.
fn toml_key(key: &str) -> String {
    if !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        key.to_owned()
    } else {
        serde_json::to_string(key).unwrap_or_default()
    }
}

/// Why annotations (or none) give a tool its class, in the words of MCP's hints.
pub fn annotation_reason(annotations: Option<&Value>) -> String {
    let hint = |name: &str| {
        annotations
            .and_then(|a| a.get(name))
            .and_then(Value::as_bool)
    };
    let (read_only, destructive, idempotent) = (
        hint("readOnlyHint"),
        hint("destructiveHint"),
        hint("idempotentHint"),
    );
    if read_only == Some(true) {
        return "annotation readOnlyHint: true".to_owned();
    }
    if read_only.is_none() && destructive.is_none() && idempotent.is_none() {
        return "no annotations: MCP's defaults assume a tool may be destructive and is not \
                idempotent"
            .to_owned();
    }
    let given: Vec<String> = [
        ("readOnlyHint", read_only),
        ("destructiveHint", destructive),
        ("idempotentHint", idempotent),
    ]
    .iter()
    .filter_map(|(name, value)| value.map(|v| format!("{name}: {v}")))
    .collect();
    let mut why = format!("annotations {}", given.join(", "));
    if destructive.is_none() {
        why.push_str(" (destructiveHint unset: MCP's default is true)");
    } else if destructive == Some(false) && idempotent.is_none() {
        why.push_str(" (idempotentHint unset: MCP's default is false)");
    }
    why
}

/// The argument names `tool` (a raw MCP tool definition) declares: the keys of
/// `inputSchema.properties`, sorted; none if it has no such object.
fn declared_arguments(tool: &Value) -> Vec<String> {
    tool.pointer("/inputSchema/properties")
        .and_then(Value::as_object)
        .map(|properties| properties.keys().cloned().collect::<Vec<_>>())
        .map(|mut names| {
            names.sort();
            names
        })
        .unwrap_or_default()
}

/// Why a call cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// The arguments are not a JSON object.
    #[error("tool arguments must be a JSON object")]
    NotAnObject,
    /// `confirm` is present but not a boolean.
    #[error("confirm must be true or false")]
    ConfirmNotBoolean,
    /// `confirmTarget` or `confirmToken` is present but not a string.
    #[error("{0} must be a string")]
    NotAString(&'static str),
    /// The arguments cannot be hashed.
    #[error(transparent)]
    Canonical(#[from] CanonicalError),
}

/// The confirm fields of a call, taken out of its arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfirmFields {
    /// `confirm`, if present.
    pub confirm: Option<bool>,
    /// `confirmTarget`, if present.
    pub target: Option<String>,
    /// `confirmToken`, if present.
    pub token: Option<String>,
}

impl ConfirmFields {
    /// Whether this call is a confirm (`confirm: true`), not a preflight.
    pub fn is_confirm(&self) -> bool {
        self.confirm == Some(true)
    }
}

/// Splits a call's arguments into the operation's own arguments and the confirm fields.
/// Absent arguments (`null`) count as an empty object.
pub fn split_confirm(arguments: &Value) -> Result<(Map<String, Value>, ConfirmFields), PlanError> {
    let mut args = match arguments {
        Value::Object(map) => map.clone(),
        Value::Null => Map::new(),
        _ => return Err(PlanError::NotAnObject),
    };
    let confirm = match args.remove("confirm") {
        None => None,
        Some(Value::Bool(b)) => Some(b),
        Some(_) => return Err(PlanError::ConfirmNotBoolean),
    };
    let mut string = |name: &'static str| match args.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(PlanError::NotAString(name)),
    };
    let target = string("confirmTarget")?;
    let token = string("confirmToken")?;
    Ok((
        args,
        ConfirmFields {
            confirm,
            target,
            token,
        },
    ))
}

/// A value as it appears inside a target or summary: strings bare, anything else canonical.
fn inline(value: &Value) -> Result<String, CanonicalError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        other => canonical::to_string(other),
    }
}

/// Fills `{name}` placeholders from `lookup`; an unknown name stays visible as `<name missing>`,
/// a fact about the call rather than a guess.
fn fill(template: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        out.push_str(&rest[..open]);
        let name = &rest[open + 1..open + close];
        out.push_str(&lookup(name).unwrap_or_else(|| format!("<{name} missing>")));
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}

/// The plan for a call of `tool` with `arguments` (confirm fields already removed).
pub fn plan(
    rule: &ToolRule,
    tool: &str,
    arguments: &Map<String, Value>,
) -> Result<Plan, PlanError> {
    let details = Value::Object(arguments.clone());
    // Refuse what cannot be hashed before anything else is built from it.
    canonical::to_string(&details)?;
    let arg = |name: &str| arguments.get(name).and_then(|v| inline(v).ok());
    let target = match &rule.target {
        Some(t) if t.contains('{') => Some(fill(t, arg)),
        Some(name) => Some(arg(name).unwrap_or_else(|| format!("<{name} missing>"))),
        // Only an argument the tool itself declares: an undeclared one is never the target.
        None => TARGET_KEYS
            .iter()
            .filter(|k| rule.declared.iter().any(|d| d == *k))
            .find_map(|k| {
                arguments
                    .get(*k)
                    .filter(|v| !v.is_null())
                    .and_then(|v| inline(v).ok())
            }),
    };
    // A tool with nothing to name acts on itself: "execute", not "execute on execute".
    let summary_template = match &target {
        None if rule.summary == DEFAULT_SUMMARY => "{action}",
        _ => rule.summary.as_str(),
    };
    let target = target.unwrap_or_else(|| tool.to_owned());
    let action = tool.to_owned();
    let summary = fill(summary_template, |name| match name {
        "tool" | "action" => Some(tool.to_owned()),
        "target" => Some(target.clone()),
        other => arg(other),
    });
    Ok(Plan {
        tool: tool.to_owned(),
        target,
        action,
        summary,
        details,
        reversible: !rule.destructive,
    })
}

/// Why a tool cannot be offered gated: it already uses one of [`CONFIRM_ARGUMENTS`].
pub fn withheld_reason(tool: &Value) -> Option<String> {
    let properties = tool
        .pointer("/inputSchema/properties")
        .and_then(Value::as_object)?;
    CONFIRM_ARGUMENTS.iter().find(|a| properties.contains_key(**a)).map(|a| {
        format!("the tool already has an argument named `{a}`, which Countersign needs for its confirm step")
    })
}

/// The sentence added to a gated tool's description.
pub fn gated_sentence(class: GateClass) -> &'static str {
    match class {
        GateClass::Once => {
            "Countersign: this tool needs a person's approval. Call it first without confirm to get a \
             preflight; once approved, call again with the same arguments plus confirm: true, \
             confirmTarget and confirmToken. The token works once."
        }
        _ => {
            "Countersign: this tool needs a person's approval. Call it first without confirm to get a \
             preflight; once approved, call again with the same arguments plus confirm: true, \
             confirmTarget and confirmToken. The token works until it expires."
        }
    }
}

/// A gated tool as the agent sees it: `confirm`, `confirmTarget` and `confirmToken` added to its
/// input schema, a sentence added to its description, its `outputSchema` removed (results differ
/// between preflight and execution). Every other field is kept as the upstream sent it.
pub fn augment(tool: &Value, class: GateClass) -> Value {
    let mut tool = tool.clone();
    let Some(obj) = tool.as_object_mut() else {
        return tool;
    };
    obj.remove("outputSchema");
    let description = match obj.get("description").and_then(Value::as_str) {
        Some(d) if !d.is_empty() => format!("{d}\n\n{}", gated_sentence(class)),
        _ => gated_sentence(class).to_owned(),
    };
    obj.insert("description".into(), Value::String(description));
    let schema = obj
        .entry("inputSchema")
        .or_insert_with(|| serde_json::json!({"type": "object"}));
    if let Some(schema) = schema.as_object_mut() {
        let properties = schema
            .entry("properties")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(properties) = properties.as_object_mut() {
            properties.insert(
                "confirm".into(),
                serde_json::json!({"type": "boolean", "description": "true to execute an approved preflight"}),
            );
            properties.insert(
                "confirmTarget".into(),
                serde_json::json!({"type": "string", "description": "the target named by the approved preflight"}),
            );
            properties.insert(
                "confirmToken".into(),
                serde_json::json!({"type": "string", "description": "the confirmToken from the approved preflight"}),
            );
        }
    }
    tool
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(annotations: Value) -> Value {
        json!({"name": "write_file", "description": "Write a file", "annotations": annotations,
               "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}},
               "outputSchema": {"type": "object"}, "_meta": {"x": 1}, "title": "Write"})
    }

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn default_target_is_the_first_known_argument_else_the_tool() {
        let rule = Policy::default().rule("fs", &tool(json!({})));
        let p = plan(
            &rule,
            "write_file",
            &args(json!({"content": "x", "name": "n", "path": "/a"})),
        )
        .unwrap();
        assert_eq!(p.target, "/a");
        let p = plan(&rule, "write_file", &args(json!({"content": "x"}))).unwrap();
        assert_eq!(p.target, "write_file");
        assert_eq!(p.summary, "write_file");
    }

    #[test]
    fn undeclared_argument_is_never_the_target() {
        // server-filesystem's move_file declares only source and destination; `path` is a decoy
        // the agent added, and must not be what the person is shown and asked to type.
        let move_file = json!({"name": "move_file", "inputSchema": {"type": "object",
            "properties": {"source": {"type": "string"}, "destination": {"type": "string"}}}});
        let rule = Policy::default().rule("filesystem", &move_file);
        assert_eq!(rule.declared, ["destination", "source"]);
        let p = plan(
            &rule,
            "move_file",
            &args(json!({"source": "a.txt", "destination": "b.txt", "path": "notes.txt"})),
        )
        .unwrap();
        assert_eq!(p.target, "a.txt");
        assert_eq!(p.summary, "move_file on a.txt");
        // The decoy is still part of what is approved and hashed.
        assert_eq!(p.details["path"], "notes.txt");
    }

    #[test]
    fn tool_without_declared_arguments_is_its_own_target() {
        for definition in [
            json!({"name": "execute"}),
            json!({"name": "execute", "inputSchema": {"type": "object"}}),
            json!({"name": "execute", "inputSchema": {"type": "object", "properties": {}}}),
            json!({"name": "execute", "inputSchema": {"type": "object", "properties": ["path"]}}),
        ] {
            let rule = Policy::default().rule("db", &definition);
            assert!(rule.declared.is_empty(), "{definition}");
            let p = plan(
                &rule,
                "execute",
                &args(json!({"path": "/etc/passwd", "name": "n"})),
            )
            .unwrap();
            assert_eq!(p.target, "execute", "{definition}");
            assert_eq!(p.summary, "execute", "{definition}");
        }
    }

    #[test]
    fn default_target_follows_the_documented_key_order() {
        let all = TARGET_KEYS
            .iter()
            .map(|k| ((*k).to_owned(), json!({"type": "string"})))
            .collect::<Map<_, _>>();
        let rule = Policy::default().rule(
            "s",
            &json!({"name": "t", "inputSchema": {"type": "object", "properties": all}}),
        );
        assert_eq!(
            &TARGET_KEYS[..8],
            [
                "path", "source", "uri", "url", "name", "id", "table", "repo"
            ]
        );
        // Each key wins over every key after it.
        for (i, key) in TARGET_KEYS.iter().enumerate() {
            let call = TARGET_KEYS[i..]
                .iter()
                .map(|k| ((*k).to_owned(), json!(format!("v-{k}"))))
                .collect::<Map<_, _>>();
            assert_eq!(plan(&rule, "t", &call).unwrap().target, format!("v-{key}"));
        }
    }

    #[test]
    fn policy_target_may_name_an_undeclared_argument() {
        let policy = Policy::from_toml(
            "[servers.fs.tools.move_file]\ntarget = \"path\"\n[servers.fs.tools.copy]\ntarget = \"{path}\"",
        )
        .unwrap();
        let call = args(json!({"source": "a.txt", "path": "notes.txt"}));
        for tool in ["move_file", "copy"] {
            let rule = policy.rule(
                "fs",
                &json!({"name": tool, "inputSchema": {"type": "object",
                    "properties": {"source": {"type": "string"}}}}),
            );
            assert_eq!(plan(&rule, tool, &call).unwrap().target, "notes.txt");
        }
    }

    #[test]
    fn destructive_tool_is_irreversible_and_needs_the_target_typed() {
        let rule = Policy::default().rule("fs", &tool(json!({"destructiveHint": true})));
        assert!(rule.destructive && rule.type_target);
        assert_eq!(rule.class, GateClass::Once);
        let p = plan(&rule, "write_file", &args(json!({"path": "/a"}))).unwrap();
        assert!(!p.reversible);
        let rule = Policy::default().rule(
            "fs",
            &tool(json!({"destructiveHint": false, "idempotentHint": true})),
        );
        assert!(!rule.destructive && !rule.type_target);
        assert_eq!(rule.class, GateClass::Token);
    }

    #[test]
    fn approvers_are_one_unless_the_policy_asks_more_per_tool_or_server_within_bounds() {
        let drop = json!({"name": "drop_table"});
        assert_eq!(Policy::default().rule("db", &drop).approvers, 1);
        let policy = Policy::from_toml(
            "[servers.db.all]\napprovers = 2\n[servers.db.tools.drop_table]\napprovers = 3",
        )
        .unwrap();
        assert_eq!(policy.rule("db", &drop).approvers, 3);
        assert_eq!(policy.rule("db", &json!({"name": "insert"})).approvers, 2);
        assert_eq!(policy.rule("fs", &drop).approvers, 1);
        for bad in [
            "[servers.db.all]\napprovers = 0",
            "[servers.db.tools.\"a b\"]\napprovers = 10",
            "[servers.db.all]\napprovers = -1",
            "[servers.db.all]\napprovers = 300",
        ] {
            let err = Policy::from_toml(bad).unwrap_err().to_string();
            assert!(
                err.contains("approvers") || err.contains("invalid"),
                "{bad}: {err}"
            );
        }
        assert!(
            Policy::from_toml("[servers.db.tools.\"a b\"]\napprovers = 10")
                .unwrap_err()
                .to_string()
                .contains("[servers.db.tools.\"a b\"]")
        );
    }

    #[test]
    fn grants_are_off_unless_the_policy_allows_them_per_tool_or_server() {
        let destructive =
            json!({"name": "delete_backup", "annotations": {"destructiveHint": true}});
        assert!(!Policy::default().rule("db", &destructive).grants);
        let policy = Policy::from_toml(
            "[servers.db.tools.delete_backup]\ngrants = true\n[servers.fs.all]\ngrants = true\n[servers.fs.tools.move_file]\ngrants = false",
        )
        .unwrap();
        assert!(policy.rule("db", &destructive).grants);
        // Another server's tool of the same name is not covered.
        assert!(!policy.rule("other", &destructive).grants);
        assert!(policy.rule("fs", &json!({"name": "write_file"})).grants);
        // A tool's own rule wins over the server's.
        assert!(!policy.rule("fs", &json!({"name": "move_file"})).grants);
        assert!(Policy::from_toml("[servers.db.tools.x]\ngrants = \"yes\"").is_err());
    }

    #[test]
    fn policy_overrides_class_target_summary_and_typing() {
        let policy = Policy::from_toml(
            r#"
            [servers.github.all]
            type_target = true
            [servers.github.tools.create_issue]
            class = "token"
            target = "{owner}/{repo}"
            summary = "Open an issue in {target} titled {title}"
            "#,
        )
        .unwrap();
        let rule = policy.rule("github", &json!({"name": "create_issue"}));
        assert_eq!(rule.class, GateClass::Token);
        assert!(rule.type_target);
        let p = plan(
            &rule,
            "create_issue",
            &args(json!({"owner": "o", "repo": "r", "title": "Bug"})),
        )
        .unwrap();
        assert_eq!(p.target, "o/r");
        assert_eq!(p.summary, "Open an issue in o/r titled Bug");
        let p = plan(&rule, "create_issue", &args(json!({"owner": "o"}))).unwrap();
        assert_eq!(p.target, "o/<repo missing>");
        // Another server is untouched.
        assert_eq!(
            policy.rule("other", &json!({"name": "create_issue"})).class,
            GateClass::Once
        );
    }

    #[test]
    fn each_rule_says_why_it_has_its_class() {
        let rule = Policy::default().rule("fs", &tool(json!({"destructiveHint": true})));
        assert_eq!(rule.why, "annotations destructiveHint: true");
        let rule = Policy::default().rule("fs", &json!({"name": "x"}));
        assert!(
            rule.why.starts_with("no annotations: MCP's defaults"),
            "{}",
            rule.why
        );
        let rule = Policy::default().rule("fs", &tool(json!({"readOnlyHint": false})));
        assert_eq!(
            rule.why,
            "annotations readOnlyHint: false (destructiveHint unset: MCP's default is true)"
        );
        let rule = Policy::default().rule(
            "fs",
            &tool(json!({"destructiveHint": false, "idempotentHint": true})),
        );
        assert_eq!(
            rule.why,
            "annotations destructiveHint: false, idempotentHint: true"
        );
        let policy = Policy::from_toml(
            "[servers.\"server:my fs\".tools.write_file]\nclass = \"token\"\n[servers.db.all]\nclass = \"once\"",
        )
        .unwrap();
        assert_eq!(
            policy.rule("server:my fs", &tool(json!({}))).why,
            "policy: [servers.\"server:my fs\".tools.write_file] class = \"token\""
        );
        assert_eq!(
            policy.rule("db", &tool(json!({"readOnlyHint": true}))).why,
            "policy: [servers.db.all] class = \"once\""
        );
    }

    #[test]
    fn preview_recipes_come_from_the_policy_first_then_the_built_in_ones() {
        let policy = Policy::from_toml(
            r#"
            [[preview]]
            server = "notes"
            tool = "save_note"
            kind = "write"
            read = "read_note"
            path = "file"
            content = "text"
            "#,
        )
        .unwrap();
        let r = policy.recipe("notes", "save_note").unwrap();
        assert_eq!(
            (r.kind, r.read.as_deref()),
            (PreviewKind::Write, Some("read_note"))
        );
        assert_eq!((r.path.as_str(), r.content.as_str()), ("file", "text"));
        assert_eq!(policy.recipe("other", "save_note"), None);
        let r = policy.recipe("anything", "write_file").unwrap();
        assert_eq!(r.read.as_deref(), Some("read_text_file"));
        assert_eq!(
            policy.recipe("s", "edit_file").unwrap().kind,
            PreviewKind::Edit
        );
        // A policy cannot ask for the dry-run kind (it calls a tool that is not read-only).
        assert!(Policy::from_toml("[[preview]]\ntool = \"t\"\nkind = \"edit\"").is_err());
        assert!(
            Policy::from_toml("[[preview]]\ntool = \"t\"\nkind = \"write\"\nwhat = 1").is_err()
        );
    }

    #[test]
    fn unknown_policy_keys_are_refused() {
        assert!(Policy::from_toml("[servers.x.tools.y]\nclas = \"open\"").is_err());
        assert!(Policy::from_toml("[servers.x.tools.y]\nclass = \"sometimes\"").is_err());
    }

    #[test]
    fn confirm_fields_are_split_from_the_arguments() {
        let (rest, fields) =
            split_confirm(&json!({"path": "/a", "confirm": true, "confirmTarget": "/a", "confirmToken": "cs1.x.y"})).unwrap();
        assert_eq!(Value::Object(rest), json!({"path": "/a"}));
        assert!(fields.is_confirm());
        assert_eq!(fields.token.as_deref(), Some("cs1.x.y"));
        assert_eq!(
            split_confirm(&json!({"confirm": "true"})),
            Err(PlanError::ConfirmNotBoolean)
        );
        assert_eq!(
            split_confirm(&json!({"confirmToken": 5})),
            Err(PlanError::NotAString("confirmToken"))
        );
        assert_eq!(split_confirm(&json!([1])), Err(PlanError::NotAnObject));
        assert!(split_confirm(&Value::Null).unwrap().0.is_empty());
    }

    #[test]
    fn preflight_and_confirm_arguments_plan_the_same() {
        let rule = Policy::default().rule("fs", &tool(json!({})));
        let (pre, _) = split_confirm(&json!({"path": "/a", "n": 2})).unwrap();
        let (conf, _) =
            split_confirm(&json!({"confirm": true, "n": 2, "confirmToken": "t", "path": "/a"}))
                .unwrap();
        assert_eq!(
            plan(&rule, "w", &pre).unwrap().hash(),
            plan(&rule, "w", &conf).unwrap().hash()
        );
    }

    #[test]
    fn unhashable_arguments_are_refused() {
        let rule = Policy::default().rule("fs", &tool(json!({})));
        let big = args(json!({"n": u64::MAX}));
        assert!(matches!(
            plan(&rule, "w", &big),
            Err(PlanError::Canonical(_))
        ));
    }

    #[test]
    fn augmented_tool_keeps_every_other_field() {
        let t = tool(json!({"destructiveHint": true}));
        let a = augment(&t, GateClass::Once);
        assert!(a.get("outputSchema").is_none());
        assert_eq!(a["_meta"], json!({"x": 1}));
        assert_eq!(a["title"], "Write");
        assert_eq!(a["annotations"], json!({"destructiveHint": true}));
        assert!(
            a["description"]
                .as_str()
                .unwrap()
                .starts_with("Write a file\n\nCountersign:")
        );
        for name in CONFIRM_ARGUMENTS {
            assert!(a["inputSchema"]["properties"].get(name).is_some());
        }
        assert_eq!(
            a["inputSchema"]["properties"]["path"],
            json!({"type": "string"})
        );
    }

    #[test]
    fn tool_with_a_confirm_argument_is_withheld() {
        let t = json!({"name": "x", "inputSchema": {"type": "object", "properties": {"confirmToken": {}}}});
        assert!(withheld_reason(&t).unwrap().contains("confirmToken"));
        assert_eq!(withheld_reason(&tool(json!({}))), None);
    }
}
