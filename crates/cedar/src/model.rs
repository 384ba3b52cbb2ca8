//! The entity model a policy is written against, and its Cedar schema.
//!
//! - **principal**: `Countersign::Tenant::"…"`, the caller (a tenant, `core::Tenant`'s text);
//! - **action**: `Countersign::Action::"…"`, the tool, one action per tool the server lists;
//! - **resource**: `Countersign::Server::"…"`, the server (`builtin:…`, a registered name);
//! - **context**: the plan (`target`, `action`, `summary`, `reversible`), the class the tool's
//!   annotations give (`class`: `open`, `token` or `once`; `destructive`), the hour of the day
//!   (`hour`, 0 to 23, UTC) and the call's `arguments`, typed per
//!   tool from the tool's input schema, so `context.arguments.sql` is a `String` for `execute`,
//!   and a rule naming an argument the tool does not take does not validate.
//!
//! Arguments of types Cedar has no values for (fractional numbers, `null`) are left out of the
//! schema, and so out of what a rule can name; a call whose arguments do not fit the declared
//! types is not evaluated as if they did (see [`crate::rules::Rules::decide`]).

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

/// The namespace of every type and action.
pub const NAMESPACE: &str = "Countersign";

/// The type of one argument, as Cedar can hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgType {
    /// A string.
    String,
    /// A whole number (JSON Schema `integer`).
    Long,
    /// A boolean.
    Bool,
    /// An object, each attribute with whether it is required.
    Record(BTreeMap<String, (ArgType, bool)>),
}

impl ArgType {
    /// The Cedar type of a JSON Schema, when Cedar has values for it: `None` for `number`,
    /// `null`, unions, arrays (a Cedar set forgets order and repeats, which a tool may not) and
    /// anything else it cannot hold. Such arguments are left out of the schema, so no rule can
    /// name them, and a call that carries one is not judged by the rules at all (see
    /// [`ArgType::fit`]).
    pub fn from_json_schema(schema: &Value) -> Option<ArgType> {
        match schema.get("type").and_then(Value::as_str) {
            Some("string") => Some(ArgType::String),
            Some("integer") => Some(ArgType::Long),
            Some("boolean") => Some(ArgType::Bool),
            Some("object") => Some(ArgType::Record(record(schema))),
            _ => None,
        }
    }

    /// The type as Cedar's JSON schema format writes it.
    fn to_schema_json(&self) -> Value {
        match self {
            ArgType::String => json!({ "type": "String" }),
            ArgType::Long => json!({ "type": "Long" }),
            ArgType::Bool => json!({ "type": "Boolean" }),
            ArgType::Record(attributes) => json!({
                "type": "Record",
                "attributes": attributes
                    .iter()
                    .map(|(name, (kind, required))| {
                        let mut attr = kind.to_schema_json();
                        attr["required"] = json!(required);
                        (name.clone(), attr)
                    })
                    .collect::<Map<String, Value>>(),
            }),
        }
    }

    /// `value` as this type, whole: `None` when any part of it is of another type, a required
    /// attribute is missing, or it carries an attribute the type does not declare (at any
    /// depth). The rules then see everything the tool will get, or the call is not theirs to
    /// judge: an argument they cannot see could change what an opened call does.
    pub fn fit(&self, value: &Value) -> Option<Value> {
        match (self, value) {
            (ArgType::String, Value::String(_)) | (ArgType::Bool, Value::Bool(_)) => {
                Some(value.clone())
            }
            (ArgType::Long, Value::Number(n)) => n.as_i64().map(|n| json!(n)),
            (ArgType::Record(attributes), Value::Object(given)) => {
                if given.keys().any(|k| !attributes.contains_key(k)) {
                    return None;
                }
                let mut out = Map::new();
                for (name, (kind, required)) in attributes {
                    match given.get(name) {
                        Some(v) => {
                            out.insert(name.clone(), kind.fit(v)?);
                        }
                        None if *required => return None,
                        None => {}
                    }
                }
                Some(Value::Object(out))
            }
            _ => None,
        }
    }
}

/// The attributes of an object's JSON Schema that Cedar can hold.
fn record(schema: &Value) -> BTreeMap<String, (ArgType, bool)> {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|properties| {
            properties
                .iter()
                .filter_map(|(name, property)| {
                    let kind = ArgType::from_json_schema(property)?;
                    Some((name.clone(), (kind, required.contains(&name.as_str()))))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A tool a policy can name: its name, what it takes, and what its annotations say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tool {
    /// The tool's name, the action's id.
    pub name: String,
    /// Its arguments, as Cedar can hold them.
    pub arguments: BTreeMap<String, (ArgType, bool)>,
    /// Whether its annotations say it is destructive (or say nothing, which counts as so).
    pub destructive: bool,
    /// The class its annotations give without a policy: `open`, `token` or `once`.
    pub class: &'static str,
}

impl Tool {
    /// A tool from its listing: `name`, its `inputSchema`, and whether it is destructive. Its
    /// class without a policy: `once` when destructive, `token` otherwise (a tool its
    /// annotations call read-only is made open with [`Tool::read_only`]).
    pub fn new(name: &str, input_schema: &Value, destructive: bool) -> Tool {
        Tool {
            name: name.to_owned(),
            arguments: record(input_schema),
            destructive,
            class: if destructive { "once" } else { "token" },
        }
    }

    /// The same tool, read-only by its annotations: open without a policy.
    pub fn read_only(mut self) -> Tool {
        self.class = "open";
        self.destructive = false;
        self
    }
}

/// `tools` with each name once: the tools of several servers that share a name become one
/// action, whose arguments are those every one of them declares with the same type (required
/// where every one requires it), destructive when any is, and of the strictest class any has.
/// A rule can then name only what holds for every tool of that name, and a call carrying an
/// argument that is not the same everywhere is not the rules' to judge.
pub fn merge(tools: impl IntoIterator<Item = Tool>) -> Vec<Tool> {
    let mut merged: Vec<Tool> = Vec::new();
    for tool in tools {
        let Some(same) = merged.iter_mut().find(|t| t.name == tool.name) else {
            merged.push(tool);
            continue;
        };
        same.arguments = std::mem::take(&mut same.arguments)
            .into_iter()
            .filter_map(|(name, (kind, required))| {
                let (theirs, also) = tool.arguments.get(&name)?;
                (*theirs == kind).then_some((name, (kind, required && *also)))
            })
            .collect();
        same.destructive |= tool.destructive;
        let rank = |c: &str| ["open", "token", "once"].iter().position(|x| *x == c);
        if rank(tool.class) > rank(same.class) {
            same.class = tool.class;
        }
    }
    merged.sort_by(|a, b| a.name.cmp(&b.name));
    merged
}

/// The context attributes every call has, beside its arguments.
fn context_type(tool: &Tool) -> Value {
    json!({
        "type": "Record",
        "attributes": {
            "target": { "type": "String" },
            "action": { "type": "String" },
            "summary": { "type": "String" },
            "reversible": { "type": "Boolean" },
            "class": { "type": "String" },
            "destructive": { "type": "Boolean" },
            "hour": { "type": "Long" },
            "arguments": ArgType::Record(tool.arguments.clone()).to_schema_json(),
        }
    })
}

/// The schema of `tools` in Cedar's JSON schema format.
pub fn schema_json(tools: &[Tool]) -> Value {
    let actions: Map<String, Value> = tools
        .iter()
        .map(|tool| {
            (
                tool.name.clone(),
                json!({
                    "appliesTo": {
                        "principalTypes": ["Tenant"],
                        "resourceTypes": ["Server"],
                        "context": context_type(tool),
                    }
                }),
            )
        })
        .collect();
    json!({
        NAMESPACE: {
            "entityTypes": { "Tenant": {}, "Server": {} },
            "actions": actions,
        }
    })
}

/// Why a schema could not be made (a tool whose shape Cedar refuses).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the tools' schema does not hold: {0}")]
pub struct SchemaError(pub String);

/// The Cedar schema of `tools`; two tools of one name are refused (which one a rule meant is
/// not for the schema to guess).
pub fn schema(tools: &[Tool]) -> Result<cedar_policy::Schema, SchemaError> {
    for (i, tool) in tools.iter().enumerate() {
        if tools[..i].iter().any(|t| t.name == tool.name) {
            return Err(SchemaError(format!("two tools are named {:?}", tool.name)));
        }
    }
    cedar_policy::Schema::from_json_value(schema_json(tools))
        .map_err(|e| SchemaError(e.to_string()))
}

/// One call, as a policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call<'a> {
    /// The caller.
    pub tenant: &'a str,
    /// The server.
    pub server: &'a str,
    /// The tool.
    pub tool: &'a str,
    /// The plan's target.
    pub target: &'a str,
    /// The plan's action.
    pub action: &'a str,
    /// The plan's summary.
    pub summary: &'a str,
    /// Whether the plan says it can be undone.
    pub reversible: bool,
    /// The class the tool's annotations give: `open`, `token` or `once`.
    pub class: &'a str,
    /// Whether the tool's annotations say it is destructive.
    pub destructive: bool,
    /// The hour of the day, 0 to 23.
    pub hour: u8,
    /// The arguments, as the agent sent them (and as they would be approved).
    pub arguments: &'a Value,
}

/// The entity uid of type `kind` and id `id` in the namespace.
pub fn uid(kind: &str, id: &str) -> cedar_policy::EntityUid {
    let kind: cedar_policy::EntityTypeName = format!("{NAMESPACE}::{kind}")
        .parse()
        .expect("the namespace's type names parse");
    cedar_policy::EntityUid::from_type_name_and_id(kind, cedar_policy::EntityId::new(id))
}

impl Call<'_> {
    /// The context as JSON, the arguments cut to what `tool` declares; `None` when they do not
    /// fit its types.
    pub fn context(&self, tool: &Tool) -> Option<Value> {
        let arguments = ArgType::Record(tool.arguments.clone()).fit(self.arguments)?;
        Some(json!({
            "target": self.target,
            "action": self.action,
            "summary": self.summary,
            "reversible": self.reversible,
            "class": self.class,
            "destructive": self.destructive,
            "hour": i64::from(self.hour),
            "arguments": arguments,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn execute() -> Tool {
        Tool::new(
            "execute",
            &json!({"type": "object", "properties": {
                "sql": {"type": "string"},
                "limit": {"type": "integer"},
                "ratio": {"type": "number"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "opts": {"type": "object", "properties": {"dry": {"type": "boolean"}}},
            }, "required": ["sql"]}),
            true,
        )
    }

    #[test]
    fn arguments_cedar_cannot_hold_are_left_out_and_the_rest_typed() {
        let tool = execute();
        assert_eq!(tool.arguments["sql"], (ArgType::String, true));
        assert_eq!(tool.arguments["limit"], (ArgType::Long, false));
        assert!(!tool.arguments.contains_key("ratio"));
        assert!(
            !tool.arguments.contains_key("tags"),
            "a set forgets order and repeats"
        );
        assert!(schema(std::slice::from_ref(&tool)).is_ok());
        assert!(
            schema(&[tool.clone(), tool]).is_err(),
            "two tools of one name"
        );
    }

    #[test]
    fn tools_of_one_name_on_several_servers_merge_into_what_holds_for_all() {
        let other = Tool::new(
            "execute",
            &json!({"type": "object", "properties": {
                "sql": {"type": "string"},
                "limit": {"type": "string"},
                "dry": {"type": "boolean"},
            }, "required": ["sql", "dry"]}),
            false,
        )
        .read_only();
        let merged = merge([execute(), other, Tool::new("a", &json!({}), false)]);
        assert_eq!(
            merged.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            ["a", "execute"]
        );
        let execute = &merged[1];
        assert_eq!(execute.arguments["sql"], (ArgType::String, true));
        assert!(
            !execute.arguments.contains_key("limit"),
            "of two types: nobody's"
        );
        assert!(
            !execute.arguments.contains_key("dry"),
            "not declared by both"
        );
        assert!(execute.destructive);
        assert_eq!(execute.class, "once", "the strictest");
        assert!(schema(&merged).is_ok());
    }

    #[test]
    fn a_call_fits_its_tool_or_is_not_evaluated_at_all() {
        let tool = execute();
        let args = json!({"sql": "SELECT 1", "limit": 3, "opts": {"dry": true}});
        let call = Call {
            tenant: "t",
            server: "s",
            tool: "execute",
            target: "users",
            action: "execute",
            summary: "",
            reversible: false,
            class: "once",
            destructive: true,
            hour: 9,
            arguments: &args,
        };
        let context = call.context(&tool).unwrap();
        assert_eq!(context["arguments"], args);
        // Anything the rules could not see, or of another type: not theirs to judge.
        for bad in [
            json!({"sql": 5}),
            json!({"limit": 3}),
            json!({"sql": "x", "limit": 1.5}),
            json!({"sql": "x", "ratio": 0.5}),
            json!({"sql": "x", "extra": true}),
            json!({"sql": "x", "opts": {"dry": true, "path": ".github/x"}}),
            json!({"sql": "x", "tags": ["a"]}),
            json!("x"),
        ] {
            let call = Call {
                arguments: &bad,
                ..call.clone()
            };
            assert_eq!(call.context(&tool), None, "{bad}");
        }
    }
}
