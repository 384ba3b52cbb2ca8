//! A policy in Cedar: loaded whole or refused whole, and what it decides for one call.
//!
//! What a rule says, besides Cedar's own `permit` and `forbid`, is in annotations:
//! - on a `permit`: `@class("open" | "token" | "once")` (required), `@approvers("1".."9")`,
//!   `@type_target("true" | "false")`, `@grant_max_minutes("N")`;
//! - on a `forbid`: `@reason("…")`, the refusal's words to the agent (required).
//!
//! A call that some `forbid` matches is refused outright. Otherwise the permits it satisfies
//! decide, and where several do, the strictest of each wins (the later class, the most
//! approvers, a typed target if any asks, the shortest grant): adding a rule never loosens what
//! another one says. A call no rule speaks to is not the policy's: the tool's annotations decide,
//! as without a policy.
//!
//! Loading is all or nothing: a policy that does not parse, does not validate against the
//! tools' schema (a tool it names that is not listed, an argument the tool does not take, a
//! type mismatch), carries an annotation it does not understand, or opens a destructive tool
//! through a rule that does not name it, is refused with the line and the reason, and whatever
//! was in force stays.

use std::collections::BTreeMap;

use cedar_policy::{
    ActionConstraint, Authorizer, Context, Decision, Effect, Entities, PolicySet, Request,
    ValidationMode, Validator,
};

use crate::model::{Call, NAMESPACE, Tool, schema, uid};

/// The classes a rule may give, from the loosest.
pub const CLASSES: [&str; 3] = ["open", "token", "once"];

/// Why a policy was refused. Each carries the line (from 1) where the trouble is, when there
/// is one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RulesError {
    /// Not Cedar.
    #[error("line {line}: {reason}")]
    Parse {
        /// The line.
        line: usize,
        /// Cedar's words.
        reason: String,
    },
    /// Cedar, but not valid against the tools' schema.
    #[error("line {line}: {reason}")]
    Invalid {
        /// The line.
        line: usize,
        /// The validator's words.
        reason: String,
    },
    /// An annotation missing, unknown, or with a value it cannot have.
    #[error("line {line}: {reason}")]
    Annotation {
        /// The line.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A rule that opens a destructive tool without naming it.
    #[error(
        "line {line}: this rule makes {tool}, which its annotations call destructive, open \
         without naming it: name it in the rule's action (action == Countersign::Action::\"{tool}\")"
    )]
    OpensDestructive {
        /// The line.
        line: usize,
        /// The tool.
        tool: String,
    },
    /// The tools' schema could not be made.
    #[error("{0}")]
    Schema(String),
}

impl RulesError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            RulesError::Parse { .. } => "policy_parse",
            RulesError::Invalid { .. } => "policy_invalid",
            RulesError::Annotation { .. } => "policy_annotation",
            RulesError::OpensDestructive { .. } => "policy_opens_destructive",
            RulesError::Schema(_) => "policy_schema",
        }
    }
}

/// What the policy decides for a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Refused outright, with the forbidding rule's reason.
    Forbidden {
        /// The reason, for the agent.
        reason: String,
    },
    /// The rules that match say how it is gated.
    Gated(Gate),
    /// No rule speaks to it: the tool's annotations decide.
    Unruled,
    /// The rules cannot judge it, so it is refused outright (a refusal of its own, so that
    /// nothing a rule would forbid gets through unjudged): its arguments carry something the
    /// rules cannot see or are of another type than the tool declares, its tool was listed after
    /// the rules were loaded (they are loaded again against the new listing), or a permit failed
    /// on it.
    Unfit,
}

/// How a call is gated, by the rules it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gate {
    /// `open`, `token` or `once`.
    pub class: &'static str,
    /// How many distinct people approve.
    pub approvers: u8,
    /// Whether the target must be typed, if a rule says.
    pub type_target: Option<bool>,
    /// The longest a grant may last, in minutes, if a rule says.
    pub grant_max_minutes: Option<u64>,
    /// The budgets of the matching rules: every one must have room for the call to run
    /// without a click.
    pub budgets: Vec<Budget>,
    /// The lines of the permits that decided it, in order: what history names for a call the
    /// rules opened.
    pub lines: Vec<usize>,
}

/// A rule's budget (`@budget`): at most `limit` units per window of `minutes`, per tenant,
/// server and tool, for calls that run without a click (opened by the rules, or covered by a
/// grant). Past it, such a call waits for a click, or is refused where the rule says
/// `@budget_past("refuse")`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// Names the rule across edits elsewhere in the text: the SHA-256 of its own text, in hex.
    pub rule: String,
    /// The rule's line.
    pub line: usize,
    /// How many units a window holds.
    pub limit: u64,
    /// How long a window is, in minutes (windows are aligned to the epoch).
    pub minutes: u64,
    /// What this call takes: 1, or the value of the argument the rule counts
    /// (`@budget_counts("rows")`).
    pub amount: u64,
    /// What it counts: `calls`, or the argument's name.
    pub counts: String,
    /// Whether a call past it is refused (`true`) or waits for a click.
    pub refuse: bool,
    /// Whether it is kept per grant (`@budget_per("grant")`): each grant's calls have a budget
    /// of their own, and calls under no grant do not take from it. Otherwise (`"caller"`, the
    /// default) it is kept per tenant, server and tool, whatever grant a call runs under.
    pub per_grant: bool,
}

/// A loaded policy: its rules, checked against the tools' schema.
#[derive(Debug, Clone)]
pub struct Rules {
    pub(crate) policies: PolicySet,
    pub(crate) schema: cedar_policy::Schema,
    pub(crate) tools: Vec<Tool>,
    /// Each rule's line, by its id.
    lines: BTreeMap<String, usize>,
    /// Rules that name a tool no server lists now: checked for syntax and annotations, not
    /// against a schema (there is none for that tool yet), and not in force. Every listed tool
    /// they name has its calls refused ([`Outcome::Unfit`]) until they load whole: a rule that
    /// waits never lets anything through meanwhile.
    pub(crate) deferred: Vec<cedar_policy::Policy>,
}

/// Where each top-level statement of `text` starts: the byte offset of its first character that
/// is not space or comment, in order (Cedar numbers the policies of a text in this order).
fn statement_starts(text: &str) -> Vec<usize> {
    let bytes = text.as_bytes();
    let (mut starts, mut at, mut start) = (Vec::new(), 0, None);
    while at < bytes.len() {
        match bytes[at] {
            b'/' if bytes.get(at + 1) == Some(&b'/') => {
                while at < bytes.len() && bytes[at] != b'\n' {
                    at += 1;
                }
                continue;
            }
            b'"' => {
                start.get_or_insert(at);
                at += 1;
                while at < bytes.len() && bytes[at] != b'"' {
                    at += if bytes[at] == b'\\' { 2 } else { 1 };
                }
            }
            b';' => {
                if let Some(s) = start.take() {
                    starts.push(s);
                }
            }
            c if c.is_ascii_whitespace() => {}
            _ => {
                start.get_or_insert(at);
            }
        }
        at += 1;
    }
    starts
}

/// The line (from 1) of byte offset `at` in `text`.
fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// The first line a diagnostic points at, or 1.
fn diagnostic_line(text: &str, diagnostic: &dyn miette::Diagnostic) -> usize {
    diagnostic
        .labels()
        .and_then(|mut labels| labels.next())
        .map(|label| line_of(text, label.offset()))
        .unwrap_or(1)
}

impl Rules {
    /// Loads `text` against `tools`: all of it, or a refusal with the line and the reason.
    pub fn parse(text: &str, tools: &[Tool]) -> Result<Rules, RulesError> {
        let schema = schema(tools).map_err(|e| RulesError::Schema(e.to_string()))?;
        let policies: PolicySet = text.parse().map_err(|e: cedar_policy::ParseErrors| {
            let first = e.iter().next();
            RulesError::Parse {
                line: first.map_or(1, |d| diagnostic_line(text, d)),
                reason: first.map_or_else(|| e.to_string(), ToString::to_string),
            }
        })?;
        let starts = statement_starts(text);
        let lines: BTreeMap<String, usize> = policies
            .policies()
            .map(|p| {
                let n: usize = p
                    .id()
                    .to_string()
                    .trim_start_matches("policy")
                    .parse()
                    .unwrap_or(0);
                (
                    p.id().to_string(),
                    starts.get(n).map_or(1, |&s| line_of(text, s)),
                )
            })
            .collect();
        // A rule naming a tool no server lists now waits (see `deferred`); the rest must
        // validate against the tools' schema.
        let listed = |action: &cedar_policy::EntityUid| {
            tools.iter().any(|t| uid("Action", &t.name) == *action)
        };
        let (mut kept, mut deferred) = (PolicySet::new(), Vec::new());
        let action_type = uid("Action", "").type_name().clone();
        for policy in policies.policies() {
            // An action that is not one of ours (`Action::"execute"` without the namespace) would
            // wait for a tool no server can list, and the rule would never apply: refused.
            let named = match policy.action_constraint() {
                ActionConstraint::Any => Vec::new(),
                ActionConstraint::Eq(one) => vec![one],
                ActionConstraint::In(many) => many,
            };
            if let Some(other) = named.iter().find(|a| *a.type_name() != action_type) {
                return Err(RulesError::Invalid {
                    line: lines.get(&policy.id().to_string()).copied().unwrap_or(1),
                    reason: format!(
                        "{other} is not a tool's action: write Countersign::Action::\"<tool>\""
                    ),
                });
            }
            let waits = match policy.action_constraint() {
                ActionConstraint::Any => false,
                ActionConstraint::Eq(one) => !listed(&one),
                ActionConstraint::In(many) => many.iter().any(|a| !listed(a)),
            };
            if waits {
                deferred.push(policy.clone());
            } else {
                kept.add(policy.clone()).map_err(|e| RulesError::Parse {
                    line: 1,
                    reason: e.to_string(),
                })?;
            }
        }
        let validated = Validator::new(schema.clone()).validate(&kept, ValidationMode::Strict);
        if let Some(first) = validated.validation_errors().next() {
            let line = lines
                .get(&first.policy_id().to_string())
                .copied()
                .unwrap_or_else(|| diagnostic_line(text, first));
            return Err(RulesError::Invalid {
                line,
                reason: first.to_string(),
            });
        }
        for policy in policies.policies() {
            let line = lines.get(&policy.id().to_string()).copied().unwrap_or(1);
            check_annotations(policy, line)?;
            // An open rule whose action is any tool (no `action ==` or `action in [...]`) must
            // not reach a destructive one. (Action groups are not part of the schema, so no
            // group can stand for a tool unnamed.)
            let opens_any = policy.effect() == Effect::Permit
                && policy.annotation("class") == Some("open")
                && matches!(policy.action_constraint(), ActionConstraint::Any);
            if opens_any && let Some(tool) = tools.iter().find(|t| t.destructive) {
                return Err(RulesError::OpensDestructive {
                    line,
                    tool: tool.name.clone(),
                });
            }
        }
        Ok(Rules {
            policies: kept,
            schema,
            tools: tools.to_vec(),
            lines,
            deferred,
        })
    }

    /// The line of the rule `id`.
    pub fn line(&self, id: &str) -> Option<usize> {
        self.lines.get(id).copied()
    }

    /// The tool `name` as the rules were loaded with it, if they were.
    pub fn tool(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// The tools named by rules that wait for a server to list them, sorted.
    pub fn waiting_for(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .deferred
            .iter()
            .flat_map(|p| match p.action_constraint() {
                ActionConstraint::Any => Vec::new(),
                ActionConstraint::Eq(one) => vec![one],
                ActionConstraint::In(many) => many,
            })
            .filter(|a| !self.tools.iter().any(|t| uid("Action", &t.name) == *a))
            .map(|a| a.id().unescaped().to_owned())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// The rules whose action can be `tool` (it names the tool, or any action), in force or
    /// waiting.
    fn reaching<'a>(&'a self, tool: &'a str) -> impl Iterator<Item = &'a cedar_policy::Policy> {
        let action = uid("Action", tool);
        self.policies
            .policies()
            .chain(self.deferred.iter())
            .filter(move |p| match p.action_constraint() {
                ActionConstraint::Any => true,
                ActionConstraint::Eq(one) => one == action,
                ActionConstraint::In(many) => many.contains(&action),
            })
    }

    /// Whether any rule may speak to calls of `tool`. When none does, its calls are the
    /// annotations' (and its arguments need not fit anything: a tool whose arguments Cedar
    /// cannot hold is judged as without a policy, unless a rule names it or any tool).
    pub fn speaks_to(&self, tool: &str) -> bool {
        self.reaching(tool).next().is_some()
    }

    /// Whether some call of `tool` may need more than running on its own: a `forbid`, or a
    /// permit of a class other than `open`, may reach it. A tool its annotations make open is
    /// then listed as gated, so that each of its calls is decided here.
    pub fn may_gate(&self, tool: &str) -> bool {
        self.reaching(tool).any(|p| {
            p.effect() == Effect::Forbid || p.annotation("class").is_some_and(|c| c != "open")
        })
    }

    /// What the rules decide for `call`.
    pub fn decide(&self, call: &Call<'_>) -> Outcome {
        if !self.speaks_to(call.tool) {
            return Outcome::Unruled;
        }
        let action = uid("Action", call.tool);
        let waits = self.deferred.iter().any(|p| match p.action_constraint() {
            ActionConstraint::Any => false,
            ActionConstraint::Eq(one) => one == action,
            ActionConstraint::In(many) => many.contains(&action),
        });
        if waits {
            return Outcome::Unfit;
        }
        let Some(tool) = self.tools.iter().find(|t| t.name == call.tool) else {
            return Outcome::Unfit;
        };
        let Some(context) = call.context(tool) else {
            return Outcome::Unfit;
        };
        let action = uid("Action", call.tool);
        let Ok(context) = Context::from_json_value(context, Some((&self.schema, &action))) else {
            return Outcome::Unfit;
        };
        let Ok(request) = Request::new(
            uid("Tenant", call.tenant),
            action,
            uid("Server", call.server),
            context,
            Some(&self.schema),
        ) else {
            return Outcome::Unfit;
        };
        let answer = Authorizer::new().is_authorized(&request, &self.policies, &Entities::empty());
        // Cedar skips a rule that fails on a call (an overflow on an argument, say). Skipping a
        // forbid would let the call through, and skipping a stricter permit would let a looser
        // one decide: a failed forbid forbids, a failed permit leaves the call unjudged.
        let mut failed_permit = false;
        for error in answer.diagnostics().errors() {
            let cedar_policy::AuthorizationError::PolicyEvaluationError(error) = error;
            match self.policies.policy(error.policy_id()) {
                Some(forbid) if forbid.effect() == Effect::Forbid => {
                    return Outcome::Forbidden {
                        reason: forbid.annotation("reason").unwrap_or_default().to_owned(),
                    };
                }
                _ => failed_permit = true,
            }
        }
        if failed_permit {
            return Outcome::Unfit;
        }
        let determining: Vec<_> = answer.diagnostics().reason().collect();
        if answer.decision() == Decision::Deny {
            // Denied by a forbid that matched, or by no permit matching.
            if let Some(forbid) = determining
                .iter()
                .filter_map(|id| self.policies.policy(id))
                .find(|p| p.effect() == Effect::Forbid)
            {
                return Outcome::Forbidden {
                    reason: forbid.annotation("reason").unwrap_or_default().to_owned(),
                };
            }
            return Outcome::Unruled;
        }
        let mut gate = Gate {
            class: "open",
            approvers: 1,
            type_target: None,
            grant_max_minutes: None,
            budgets: Vec::new(),
            lines: Vec::new(),
        };
        for policy in determining.iter().filter_map(|id| self.policies.policy(id)) {
            gate.lines
                .push(self.line(policy.id().as_ref()).unwrap_or(1));
            let class = policy.annotation("class").unwrap_or("once");
            if rank(class) > rank(gate.class) {
                gate.class = CLASSES[rank(class)];
            }
            if let Some(n) = policy.annotation("approvers").and_then(|n| n.parse().ok()) {
                gate.approvers = gate.approvers.max(n);
            }
            if let Some(t) = policy.annotation("type_target") {
                gate.type_target = Some(gate.type_target.unwrap_or(false) || t == "true");
            }
            if let Some(m) = policy
                .annotation("grant_max_minutes")
                .and_then(|m| m.parse().ok())
            {
                gate.grant_max_minutes = Some(gate.grant_max_minutes.map_or(m, |g: u64| g.min(m)));
            }
            if let Some(limit) = policy.annotation("budget").and_then(|n| n.parse().ok()) {
                // What the call takes: the counted argument's value, which must be there, whole
                // and not negative; a call that does not say cannot be measured against it.
                let counts = policy.annotation("budget_counts");
                // At least one a call: a call saying 0 still runs, so it still counts.
                let amount = match counts {
                    None => 1,
                    Some(name) => match call.arguments.get(name).and_then(|v| v.as_u64()) {
                        Some(n) => n.max(1),
                        None => return Outcome::Unfit,
                    },
                };
                let rule = sha256_hex(policy.to_string().as_bytes());
                // Two rules of the same text are one budget, taken once.
                if gate.budgets.iter().any(|b| b.rule == rule) {
                    continue;
                }
                gate.budgets.push(Budget {
                    rule,
                    line: self.line(policy.id().as_ref()).unwrap_or(1),
                    limit,
                    minutes: policy
                        .annotation("budget_minutes")
                        .and_then(|m| m.parse().ok())
                        .unwrap_or(60),
                    amount,
                    counts: counts.unwrap_or("calls").to_owned(),
                    refuse: policy.annotation("budget_past") == Some("refuse"),
                    per_grant: policy.annotation("budget_per") == Some("grant"),
                });
            }
        }
        gate.lines.sort_unstable();
        gate.lines.dedup();
        Outcome::Gated(gate)
    }
}

/// The SHA-256 of `bytes`, in hex.
fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The strictness of a class (its index in [`CLASSES`]); an unknown one counts as the strictest.
pub(crate) fn rank(class: &str) -> usize {
    CLASSES.iter().position(|c| *c == class).unwrap_or(2)
}

/// How a budget is kept, beside `@budget` itself: each needs a `@budget` on its rule.
const BUDGET_KEPT: [&str; 4] = [
    "budget_minutes",
    "budget_counts",
    "budget_past",
    "budget_per",
];

/// What a permit says of grants and budgets: what the solver does not compare (see
/// `crate::widening`).
pub(crate) const GRANTS_AND_BUDGETS: [&str; 6] = [
    "grant_max_minutes",
    "budget",
    BUDGET_KEPT[0],
    BUDGET_KEPT[1],
    BUDGET_KEPT[2],
    BUDGET_KEPT[3],
];

fn check_annotations(policy: &cedar_policy::Policy, line: usize) -> Result<(), RulesError> {
    let bad = |reason: String| RulesError::Annotation { line, reason };
    let allowed: &[&str] = match policy.effect() {
        Effect::Permit => &[
            "class",
            "approvers",
            "type_target",
            GRANTS_AND_BUDGETS[0],
            GRANTS_AND_BUDGETS[1],
            GRANTS_AND_BUDGETS[2],
            GRANTS_AND_BUDGETS[3],
            GRANTS_AND_BUDGETS[4],
            GRANTS_AND_BUDGETS[5],
            "id",
        ],
        Effect::Forbid => &["reason", "id"],
    };
    for (key, value) in policy.annotations() {
        if !allowed.contains(&key) {
            return Err(bad(format!(
                "@{key} is not an annotation a {} rule takes (it takes {})",
                if policy.effect() == Effect::Permit {
                    "permit"
                } else {
                    "forbid"
                },
                allowed.join(", ")
            )));
        }
        let fine = match key {
            "class" => CLASSES.contains(&value),
            "approvers" => value.parse::<u8>().is_ok_and(|n| (1..=9).contains(&n)),
            "type_target" => matches!(value, "true" | "false"),
            "grant_max_minutes" => value
                .parse::<u64>()
                .is_ok_and(|m| (1..=24 * 60).contains(&m)),
            "reason" => !value.trim().is_empty() && value.chars().count() <= 500,
            "budget" => value
                .parse::<u64>()
                .is_ok_and(|n| (1..=1_000_000_000).contains(&n)),
            "budget_minutes" => value
                .parse::<u64>()
                .is_ok_and(|m| (1..=31 * 24 * 60).contains(&m)),
            "budget_counts" => {
                !value.is_empty()
                    && value.len() <= 128
                    && value
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            }
            "budget_past" => matches!(value, "click" | "refuse"),
            "budget_per" => matches!(value, "caller" | "grant"),
            _ => true,
        };
        if !fine {
            return Err(bad(format!(
                "@{key}(\"{value}\") is not a value it can have"
            )));
        }
    }
    let budgeted = policy.annotation("budget").is_some();
    for key in BUDGET_KEPT {
        if policy.annotation(key).is_some() && !budgeted {
            return Err(bad(format!(
                "@{key} says how a budget is kept: give the rule @budget(\"N\") too"
            )));
        }
    }
    match policy.effect() {
        Effect::Permit if policy.annotation("class").is_none() => Err(bad(
            "a permit rule says its class: @class(\"open\"), @class(\"token\") or @class(\"once\")"
                .into(),
        )),
        Effect::Forbid if policy.annotation("reason").is_none() => Err(bad(
            "a forbid rule says why, for the agent: @reason(\"…\")".into(),
        )),
        _ => Ok(()),
    }
}

/// The namespace-qualified Cedar name of a tool's action, as a rule writes it.
pub fn action_name(tool: &str) -> String {
    format!(
        "{NAMESPACE}::Action::{}",
        serde_json::Value::String(tool.to_owned())
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// The built-in SQLite tools and a file writer, as a server lists them.
    pub(crate) fn tools() -> Vec<Tool> {
        vec![
            Tool::new(
                "query",
                &json!({"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]}),
                false,
            )
            .read_only(),
            Tool::new(
                "execute",
                &json!({"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]}),
                true,
            ),
            Tool::new(
                "write_file",
                &json!({"type": "object", "properties": {
                    "path": {"type": "string"}, "content": {"type": "string"}
                }, "required": ["path", "content"]}),
                true,
            ),
        ]
    }

    /// The docs' example policy: SELECT alone runs on its own on the built-in tools; writes
    /// under scratch/ run on their own, under .github/ once with two approvers; DROP is forbidden
    /// outside business hours.
    pub(crate) const EXAMPLE: &str = include_str!("../policies/example.cedar");

    fn call<'a>(tool: &'a str, arguments: &'a Value, hour: u8) -> Call<'a> {
        Call {
            tenant: "key:ci@builtin:app.sqlite",
            server: "builtin:app.sqlite",
            tool,
            target: "users",
            action: tool,
            summary: "",
            reversible: false,
            class: "once",
            destructive: true,
            hour,
            arguments,
        }
    }

    fn gate(class: &'static str, approvers: u8, type_target: Option<bool>) -> Outcome {
        Outcome::Gated(Gate {
            class,
            approvers,
            type_target,
            grant_max_minutes: None,
            budgets: Vec::new(),
            lines: Vec::new(),
        })
    }

    impl Rules {
        /// What `decide` says, without the deciding rules' lines (compared on their own).
        fn decided(&self, call: &Call<'_>) -> Outcome {
            match self.decide(call) {
                Outcome::Gated(mut gate) => {
                    gate.lines.clear();
                    Outcome::Gated(gate)
                }
                other => other,
            }
        }
    }

    #[test]
    fn the_example_policy_gates_each_call_by_its_arguments() {
        let rules = Rules::parse(EXAMPLE, &tools()).unwrap();
        let select = json!({"sql": "SELECT * FROM users"});
        let two = json!({"sql": "SELECT 1; DELETE FROM users"});
        let delete = json!({"sql": "DELETE FROM users"});
        let drop = json!({"sql": "DROP TABLE users"});
        let scratch = json!({"path": "scratch/notes.md", "content": "x"});
        let escape = json!({"path": "scratch/../.github/workflows/ci.yml", "content": "x"});
        let workflow = json!({"path": ".github/workflows/ci.yml", "content": "x"});
        // The rule that opens it is named by its line (its first, an annotation's).
        let Outcome::Gated(opened) = rules.decide(&call("execute", &select, 12)) else {
            panic!("not opened");
        };
        let line = EXAMPLE
            .lines()
            .position(|l| l.starts_with("// A single SELECT"))
            .unwrap()
            + 2;
        assert_eq!(opened.lines, vec![line]);
        assert_eq!(
            rules.decided(&call("execute", &select, 12)),
            gate("open", 1, None)
        );
        assert_eq!(
            rules.decided(&call("query", &select, 12)),
            gate("open", 1, None)
        );
        assert_eq!(rules.decided(&call("execute", &two, 12)), Outcome::Unruled);
        assert_eq!(
            rules.decided(&call("execute", &delete, 12)),
            Outcome::Unruled
        );
        assert_eq!(rules.decided(&call("execute", &drop, 12)), Outcome::Unruled);
        assert_eq!(
            rules.decided(&call("execute", &drop, 22)),
            Outcome::Forbidden {
                reason: "DROP runs only in business hours, 9 to 18".into()
            }
        );
        assert_eq!(
            rules.decided(&call("write_file", &scratch, 3)),
            gate("open", 1, None)
        );
        assert_eq!(
            rules.decided(&call("write_file", &escape, 3)),
            Outcome::Unruled
        );
        assert_eq!(
            rules.decided(&call("write_file", &workflow, 3)),
            gate("once", 2, Some(true))
        );
        // Arguments that do not fit the tool's types are never judged as if they did.
        let wrong = json!({"sql": 5});
        assert_eq!(rules.decided(&call("execute", &wrong, 12)), Outcome::Unfit);
        // A tool no rule names is the annotations' to decide, whatever its arguments; under a
        // rule of any action, a tool the rules were not loaded with cannot be judged.
        let unknown = json!({"items": [1, 2]});
        assert_eq!(
            rules.decided(&call("unlisted", &unknown, 12)),
            Outcome::Unruled
        );
        let any = Rules::parse(
            &format!("{EXAMPLE}\n@class(\"token\") permit (principal, action, resource);"),
            &tools(),
        )
        .unwrap();
        assert_eq!(any.decided(&call("unlisted", &unknown, 12)), Outcome::Unfit);
        // Something the rules cannot see: never opened by them.
        let hidden = json!({"sql": "SELECT 1", "mode": "write"});
        assert_eq!(rules.decided(&call("execute", &hidden, 12)), Outcome::Unfit);
    }

    #[test]
    fn only_a_forbid_or_a_stricter_permit_that_may_reach_a_tool_gates_its_listing() {
        let rules = Rules::parse(EXAMPLE, &tools()).unwrap();
        // query is opened by a rule, and nothing stricter names it.
        assert!(rules.speaks_to("query") && !rules.may_gate("query"));
        assert!(rules.may_gate("execute"), "a forbid names it");
        assert!(rules.may_gate("write_file"), "a once rule names it");
        assert!(!rules.speaks_to("read_file") && !rules.may_gate("read_file"));
        let any = Rules::parse(
            "@reason(\"no\") forbid (principal, action, resource) when { context.hour == 3 };",
            &tools(),
        )
        .unwrap();
        assert!(
            any.may_gate("read_file"),
            "a rule of any action reaches every tool"
        );
    }

    #[test]
    fn a_rule_that_fails_on_a_call_forbids_if_it_forbids_and_never_opens() {
        let tools = vec![Tool::new(
            "fetch",
            &json!({"type": "object", "properties": {"limit": {"type": "integer"}}, "required": ["limit"]}),
            false,
        )];
        let text = r#"
            @class("open") permit (principal, action == Countersign::Action::"fetch", resource);
            @reason("too many rows") forbid (principal, action == Countersign::Action::"fetch", resource)
            when { context.arguments.limit * 10 > 1000 };
        "#;
        let rules = Rules::parse(text, &tools).unwrap();
        let fine = json!({"limit": 5});
        assert_eq!(
            rules.decided(&call("fetch", &fine, 12)),
            gate("open", 1, None)
        );
        // 922337203685477581 * 10 overflows: the forbid fails, and forbids.
        let overflow = json!({"limit": 922_337_203_685_477_581_i64});
        assert_eq!(
            rules.decided(&call("fetch", &overflow, 12)),
            Outcome::Forbidden {
                reason: "too many rows".into()
            }
        );
        // A stricter permit that fails leaves the call unjudged, never open.
        let text = r#"
            @class("open") permit (principal, action == Countersign::Action::"fetch", resource);
            @class("once") permit (principal, action == Countersign::Action::"fetch", resource)
            when { context.arguments.limit * 10 > 1000 };
        "#;
        let rules = Rules::parse(text, &tools).unwrap();
        assert_eq!(rules.decided(&call("fetch", &overflow, 12)), Outcome::Unfit);
    }

    #[test]
    fn where_rules_overlap_the_strictest_of_each_wins() {
        let text = r#"
            @class("open") permit (principal, action == Countersign::Action::"write_file", resource)
            when { context.arguments.path like "docs/*" };
            @class("token") @approvers("3") @grant_max_minutes("30")
            permit (principal, action == Countersign::Action::"write_file", resource)
            when { context.arguments.path like "*.md" };
            @class("open") @type_target("false") @grant_max_minutes("10")
            permit (principal, action == Countersign::Action::"write_file", resource)
            when { context.arguments.path like "docs/*.md" };
        "#;
        let rules = Rules::parse(text, &tools()).unwrap();
        let both = json!({"path": "docs/a.md", "content": ""});
        assert_eq!(
            rules.decided(&call("write_file", &both, 1)),
            Outcome::Gated(Gate {
                class: "token",
                approvers: 3,
                type_target: Some(false),
                grant_max_minutes: Some(10),
                budgets: Vec::new(),
                lines: Vec::new(),
            })
        );
    }

    #[test]
    fn a_policy_that_does_not_hold_is_refused_whole_with_its_line() {
        let tools = tools();
        let cases: [(&str, &str, usize); 7] = [
            (
                "@class(\"open\")\npermit (principal, action, resource\n",
                "policy_parse",
                2,
            ),
            (
                "\n\n@class(\"open\")\npermit (principal, action == Countersign::Action::\"query\", resource)\nwhen { context.arguments.table == \"x\" };",
                "policy_invalid",
                3,
            ),
            (
                "@class(\"open\")\npermit (principal, action == Countersign::Action::\"query\", resource)\nwhen { context.arguments.sql == 5 };",
                "policy_invalid",
                1,
            ),
            (
                "// first\n@class(\"open\")\npermit (principal, action == Countersign::Action::\"query\", resource);\n\npermit (principal, action == Countersign::Action::\"query\", resource);",
                "policy_annotation",
                5,
            ),
            (
                "@class(\"loose\")\npermit (principal, action == Countersign::Action::\"query\", resource);",
                "policy_annotation",
                1,
            ),
            (
                "forbid (principal, action == Countersign::Action::\"execute\", resource);",
                "policy_annotation",
                1,
            ),
            (
                "@class(\"open\") @colour(\"red\")\npermit (principal, action == Countersign::Action::\"query\", resource);",
                "policy_annotation",
                1,
            ),
        ];
        for (text, code, line) in cases {
            let err = Rules::parse(text, &tools).unwrap_err();
            assert_eq!(err.code(), code, "{text}: {err}");
            let said = err.to_string();
            assert!(said.starts_with(&format!("line {line}:")), "{text}: {said}");
        }
    }

    #[test]
    fn a_rule_naming_a_tool_no_server_lists_waits_and_the_listed_tools_it_names_are_refused() {
        let text = "@class(\"open\")\npermit (principal, action in [Countersign::Action::\"query\", Countersign::Action::\"drop_db\"], resource)\nwhen { context.arguments.anything == \"x\" };\n@class(\"token\") @bogus(\"1\")\npermit (principal, action == Countersign::Action::\"later\", resource);";
        // Its annotations are still checked now.
        let err = Rules::parse(text, &tools()).unwrap_err();
        assert_eq!(err.code(), "policy_annotation", "{err}");
        let text = text.replace(" @bogus(\"1\")", "");
        let rules = Rules::parse(&text, &tools()).unwrap();
        assert_eq!(rules.waiting_for(), ["drop_db", "later"]);
        let args = json!({"sql": "SELECT 1"});
        assert_eq!(rules.decided(&call("query", &args, 12)), Outcome::Unfit);
        assert_eq!(rules.decided(&call("execute", &args, 12)), Outcome::Unruled);
        // Listed, the tool it waited for is in the schema, and the rule must validate then.
        let mut more = tools();
        more.push(Tool::new("drop_db", &json!({"type": "object"}), true));
        more.push(Tool::new("later", &json!({"type": "object"}), false));
        let err = Rules::parse(&text, &more).unwrap_err();
        assert_eq!(err.code(), "policy_invalid", "{err}");
    }

    #[test]
    fn an_action_outside_the_namespace_is_refused_never_left_waiting() {
        let text = "@reason(\"no\")\nforbid (principal, action == Action::\"execute\", resource);";
        let err = Rules::parse(text, &tools()).unwrap_err();
        assert_eq!(err.code(), "policy_invalid", "{err}");
        assert!(err.to_string().contains("Countersign::Action"), "{err}");
    }

    #[test]
    fn a_budget_is_taken_at_least_once_a_call_and_twice_written_rules_are_one_budget() {
        let export = vec![Tool::new(
            "export",
            &json!({"type": "object", "properties": {"rows": {"type": "integer"}}}),
            false,
        )];
        let rule = "@class(\"open\") @budget(\"10\") @budget_counts(\"rows\")\npermit (principal, action == Countersign::Action::\"export\", resource);\n";
        let rules = Rules::parse(&format!("{rule}{rule}"), &export).unwrap();
        let zero = json!({"rows": 0});
        let Outcome::Gated(gate) = rules.decided(&call("export", &zero, 12)) else {
            panic!("not gated");
        };
        assert_eq!(gate.budgets.len(), 1, "one text, one budget");
        assert_eq!(gate.budgets[0].amount, 1, "a call of 0 rows still runs");
        // A budget's keys only on a rule that has a budget.
        let lone = "@class(\"open\") @budget_past(\"refuse\")\npermit (principal, action == Countersign::Action::\"export\", resource);";
        assert_eq!(
            Rules::parse(lone, &export).unwrap_err().code(),
            "policy_annotation"
        );
        // Kept per caller unless the rule says per grant; nothing else.
        assert!(!gate.budgets[0].per_grant);
        let per = |value: &str, budget: &str| {
            format!(
                "@class(\"token\"){budget} @budget_per(\"{value}\")\npermit (principal, action == Countersign::Action::\"export\", resource);"
            )
        };
        let rules = Rules::parse(&per("grant", " @budget(\"3\")"), &export).unwrap();
        let Outcome::Gated(gate) = rules.decided(&call("export", &zero, 12)) else {
            panic!("not gated");
        };
        assert!(gate.budgets[0].per_grant);
        for (value, budget) in [("team", " @budget(\"3\")"), ("grant", "")] {
            assert_eq!(
                Rules::parse(&per(value, budget), &export)
                    .unwrap_err()
                    .code(),
                "policy_annotation",
                "{value}{budget}"
            );
        }
    }

    #[test]
    fn no_wildcard_opens_a_destructive_tool_unless_the_rule_names_it() {
        let tools = tools();
        let wildcard = "@class(\"open\")\npermit (principal, action, resource)\nwhen { context.target == \"scratch\" };";
        let err = Rules::parse(wildcard, &tools).unwrap_err();
        assert_eq!(err.code(), "policy_opens_destructive", "{err}");
        assert!(err.to_string().contains("execute"), "{err}");
        // A wildcard that only asks for a click is fine; so is naming the tool.
        assert!(
            Rules::parse(
                "@class(\"once\")\npermit (principal, action, resource);",
                &tools
            )
            .is_ok()
        );
        let named = "@class(\"open\")\npermit (principal, action == Countersign::Action::\"execute\", resource)\nwhen { context.arguments.sql == \"SELECT 1\" };";
        assert!(Rules::parse(named, &tools).is_ok());
        // With no destructive tool listed, a wildcard may open.
        let safe: Vec<Tool> = tools.into_iter().filter(|t| !t.destructive).collect();
        assert!(Rules::parse(wildcard, &safe).is_ok());
    }
}
