//! `countersign policy to-cedar`: the classes, approvers and typed targets of a `policy.toml`,
//! written as rules over arguments (`policy.cedar`) that decide every call as the TOML does.
//!
//! The TOML's per-tool rule overrides its server's `all`; in Cedar the strictest matching rule
//! wins. So a server's `all` rule leaves out (`unless { action in [...] }`) the tools that set
//! the same key themselves. A key set without a class (`approvers = 2` alone) keeps the class the
//! tool's annotations give, as one rule per class (`when { context.class == "once" }`). What
//! Cedar rules do not say stays in the TOML, which stays in force beside them: target and summary
//! templates, `grants = true`, previews; the output says so in comments. One thing does not
//! convert: `class = "open"` for a whole server (a wildcard never opens a destructive tool in
//! Cedar), and the output says so instead of writing it.

use std::fmt::Write as _;

use countersign_core::GateClass;
use countersign_core::policy::{Policy, PolicyError, ToolPolicy};

/// The Cedar text of `toml`'s rules, or why `toml` is not a policy.
pub fn to_cedar(toml: &str) -> Result<String, PolicyError> {
    let policy = Policy::from_toml(toml)?;
    let mut out = String::from(
        "// Rules over arguments, converted from policy.toml by `countersign policy to-cedar`.\n\
         // policy.toml stays in force beside them for targets, summaries, grants and previews.\n\
         // Where a rule speaks to a call it decides the class, approvers and typed target; the\n\
         // TOML's decide only the calls no rule speaks to (and give `context.class`).\n",
    );
    for (server, rules) in &policy.servers {
        let resource = format!("resource == Countersign::Server::{}", quoted(server));
        for (tool, own) in &rules.tools {
            let action = format!("action == Countersign::Action::{}", quoted(tool));
            let place = format!("[servers.{}.tools.{}]", key(server), key(tool));
            // The tool's own keys, each falling back to the server's (as the TOML reads them).
            let merged = ToolPolicy {
                class: own.class.or(rules.all.class),
                approvers: own.approvers.or(rules.all.approvers),
                type_target: own.type_target.or(rules.all.type_target),
                ..ToolPolicy::default()
            };
            rule(&mut out, &place, &merged, &action, &resource, "");
            left_in_toml(&mut out, &place, own);
        }
        let place = format!("[servers.{}.all]", key(server));
        if rules.all.class == Some(GateClass::Open) {
            let _ = writeln!(
                out,
                "\n// {place} class = \"open\" is not converted: in Cedar a rule opens a tool only \
                 by naming it\n// (action == Countersign::Action::\"…\"), so that no wildcard \
                 reaches a destructive one."
            );
            continue;
        }
        // The tools that set their own keys are left to their own rules (the TOML's override).
        let named: Vec<String> = rules
            .tools
            .keys()
            .map(|t| format!("Countersign::Action::{}", quoted(t)))
            .collect();
        let unless = if named.is_empty() {
            String::new()
        } else {
            format!("\nunless {{ action in [{}] }}", named.join(", "))
        };
        rule(&mut out, &place, &rules.all, "action", &resource, &unless);
        left_in_toml(&mut out, &place, &rules.all);
    }
    Ok(out)
}

/// Writes the rule(s) for `keys` at `place`, if it sets any key Cedar says.
fn rule(
    out: &mut String,
    place: &str,
    keys: &ToolPolicy,
    action: &str,
    resource: &str,
    unless: &str,
) {
    if keys.class.is_none() && keys.approvers.is_none() && keys.type_target.is_none() {
        return;
    }
    let extra = |out: &mut String| {
        if let Some(n) = keys.approvers {
            let _ = write!(out, " @approvers(\"{n}\")");
        }
        if let Some(t) = keys.type_target {
            let _ = write!(out, " @type_target(\"{t}\")");
        }
    };
    let _ = writeln!(out, "\n// {place}");
    match keys.class {
        Some(class) => {
            let _ = write!(out, "@class(\"{}\")", class.code());
            extra(out);
            let _ = writeln!(out, "\npermit (principal, {action}, {resource}){unless};");
        }
        // The class the annotations give, kept: one rule per class a gated call can have.
        None => {
            for class in ["token", "once"] {
                let _ = write!(out, "@class(\"{class}\")");
                extra(out);
                let _ = writeln!(
                    out,
                    "\npermit (principal, {action}, {resource})\nwhen {{ context.class == \"{class}\" }}{unless};"
                );
            }
        }
    }
}

/// Says what of `keys` stays in the TOML.
fn left_in_toml(out: &mut String, place: &str, keys: &ToolPolicy) {
    let mut left = Vec::new();
    if keys.target.is_some() {
        left.push("target");
    }
    if keys.summary.is_some() {
        left.push("summary");
    }
    if keys.grants.is_some() {
        left.push("grants");
    }
    if !left.is_empty() {
        let _ = writeln!(out, "// {place} {}: stays in policy.toml", left.join(", "));
    }
}

/// `text` as a Cedar string literal (JSON's escapes are Cedar's).
fn quoted(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

/// A TOML key as the policy file writes it.
fn key(text: &str) -> String {
    if !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        text.to_owned()
    } else {
        quoted(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use countersign_cedar::{Call, Outcome, Rules, Tool};
    use serde_json::{Value, json};

    /// Tools as two servers list them: a read-only one, a token one, two destructive ones.
    fn listing() -> Vec<Value> {
        let path = json!({"type": "object", "properties": {"path": {"type": "string"}}});
        vec![
            json!({"name": "read_file", "annotations": {"readOnlyHint": true}, "inputSchema": path}),
            json!({"name": "backup", "annotations": {"destructiveHint": false, "idempotentHint": true}, "inputSchema": path}),
            json!({"name": "delete", "annotations": {"destructiveHint": true}, "inputSchema": path}),
            json!({"name": "write_file", "annotations": {"destructiveHint": true}, "inputSchema": path}),
        ]
    }

    /// What the converted rules decide for a call of `tool` on `server`, as (class, approvers,
    /// typed target), on top of the class the annotations give.
    fn decided(rules: &Rules, server: &str, listed: &Value) -> (GateClass, u8, Option<bool>) {
        let own = GateClass::from_annotations(listed.get("annotations"));
        let args = json!({"path": "a"});
        let call = Call {
            tenant: "t",
            server,
            tool: listed["name"].as_str().unwrap(),
            target: "a",
            action: "x",
            summary: "",
            reversible: false,
            class: own.code(),
            destructive: countersign_core::gate::is_destructive(listed.get("annotations")),
            hour: 12,
            arguments: &args,
        };
        match rules.decide(&call) {
            Outcome::Unruled => (own, 1, None),
            Outcome::Gated(g) => (
                GateClass::from_code(g.class).unwrap(),
                g.approvers,
                g.type_target,
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn converted_rules_class_every_tool_of_every_server_as_the_toml_does() {
        let toml = r#"
            [servers."server:files".all]
            approvers = 2
            [servers."server:files".tools.write_file]
            class = "token"
            type_target = true
            target = "path"
            [servers."server:files".tools.read_file]
            class = "once"

            [servers."builtin:app.sqlite".all]
            class = "once"
            type_target = false
            [servers."builtin:app.sqlite".tools.backup]
            approvers = 3
            summary = "{action} of {target}"
        "#;
        let cedar = to_cedar(toml).unwrap();
        let tools: Vec<Tool> = listing()
            .iter()
            .filter_map(countersign_engine::rules_tool)
            .collect();
        let rules = Rules::parse(&cedar, &tools).unwrap_or_else(|e| panic!("{e}\n{cedar}"));
        assert!(cedar.contains("target: stays in policy.toml"), "{cedar}");
        assert!(cedar.contains("summary: stays in policy.toml"), "{cedar}");
        let policy = Policy::from_toml(toml).unwrap();
        for server in ["server:files", "builtin:app.sqlite", "server:other"] {
            for listed in listing() {
                let toml_rule = policy.rule(server, &listed);
                let (class, approvers, typed) = decided(&rules, server, &listed);
                let name = listed["name"].as_str().unwrap();
                assert_eq!(class, toml_rule.class, "{server} {name}\n{cedar}");
                if class.is_gated() {
                    assert_eq!(approvers, toml_rule.approvers, "{server} {name}\n{cedar}");
                    if let Some(typed) = typed {
                        assert_eq!(typed, toml_rule.type_target, "{server} {name}\n{cedar}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_whole_server_opened_is_said_and_not_converted_and_bad_toml_is_refused() {
        let cedar = to_cedar("[servers.x.all]\nclass = \"open\"\n").unwrap();
        assert!(cedar.contains("is not converted"), "{cedar}");
        assert!(!cedar.contains("permit"), "{cedar}");
        assert!(to_cedar("[servers.x.all]\nclass = \"maybe\"\n").is_err());
        // An empty policy converts to rules that say nothing.
        let empty = to_cedar("").unwrap();
        assert!(Rules::parse(&empty, &[]).is_ok());
    }
}
