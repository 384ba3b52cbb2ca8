//! What a policy change widens, proved by Cedar's symbolic compiler (SymCC) and a cvc5 process.
//!
//! For each tool of the new listing, two regions of calls are compared between the old policy
//! and the new:
//! - **runs without a click**: what [`Rules::decide`] opens. No `forbid` matches, no permit of
//!   a stricter class matches (the strictest matching rule wins), and either an `@class("open")`
//!   permit matches or no permit does and the tool's annotations make it open. Built as one
//!   Cedar policy set: the forbids; every stricter permit turned into a forbid; the open
//!   permits; and, for a tool open by its annotations, a permit of every call of it.
//! - **refused outright**: calls some `forbid` matches. A call out of it now and in it before
//!   is a widening: it was forbidden and now reaches a person (or runs).
//! - **works once no more**: what needs at most a token (`open` or `token`), built as the first
//!   region one class up; asked where the old rules (or the tool's annotations) ask `once`.
//! - **fewer approvers**: for each number of approvers N ≥ 2 the old rules ask, the calls no
//!   rule asks N or more of (every permit asking N or more turned into a forbid, beside the
//!   forbids).
//! - **no typed target**: the calls no rule asks the target typed of, where the old rules ask it
//!   of some.
//!
//! Each comparison is one question to the solver: does the new region imply the old one (every
//! call in the new one is in the old)? A refutation comes with a concrete call the solver found,
//! shown as what it is. A change is said to only tighten when every comparison of every tool was
//! made and proved; a tool whose old rules cannot be read against its listing now, a solver that
//! is missing, fails or runs out of time, each is an answer of its own that never claims a proof.
//! Where the solver models a rule that fails on a call as not matching, the region it reasons
//! about is larger than what [`Rules::decide`] opens (which refuses such calls): a widening may
//! be shown that is not one, never the other way. The last two regions reason as if a call no
//! rule speaks to needed one approver and no typed target (the listing's policy may ask more),
//! which again can only show a widening that is not one. Not analysed: a grant's length and the
//! budgets; a change that touches them and is otherwise proved is said to be not known
//! ([`WideningError::NotAnalysed`]), never "only tightens".
//!
//! This is the one part of the crate that is not pure: it runs the solver as a child process.

use std::path::Path;
use std::time::Duration;

use cedar_policy::{Effect, Policy, PolicyId, PolicySet, RequestEnv};
use cedar_policy_symcc::solver::LocalSolver;
use cedar_policy_symcc::{CedarSymCompiler, CompiledPolicySet};

use crate::model::{NAMESPACE, Tool, uid};
use crate::rules::{GRANTS_AND_BUDGETS, Rules, rank};

/// One call that the new policy lets through where the old did not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// The tool.
    pub tool: String,
    /// What changed for it: [`Example::RUNS_WITHOUT_A_CLICK`] or [`Example::NO_LONGER_FORBIDDEN`].
    pub change: &'static str,
    /// The call, as the solver found it: context, principal and resource in Cedar's syntax.
    pub call: String,
}

impl Example {
    /// It needed a click (or was forbidden) before, and runs on its own now.
    pub const RUNS_WITHOUT_A_CLICK: &'static str = "would run without a click";
    /// It was refused outright before, and is not now.
    pub const NO_LONGER_FORBIDDEN: &'static str = "is no longer forbidden";
    /// It needed a works-once token before, and a token that works until it expires (or no
    /// click) now.
    pub const NO_LONGER_ONCE: &'static str = "would no longer be works-once";
    /// It needed its target typed before, and not now.
    pub const NO_LONGER_TYPED: &'static str = "would no longer need its target typed";

    /// It needed `n` or more approvers before, and fewer now.
    pub fn fewer_approvers(n: u8) -> &'static str {
        const SAID: [&str; 8] = [
            "would need fewer than 2 approvers",
            "would need fewer than 3 approvers",
            "would need fewer than 4 approvers",
            "would need fewer than 5 approvers",
            "would need fewer than 6 approvers",
            "would need fewer than 7 approvers",
            "would need fewer than 8 approvers",
            "would need fewer than 9 approvers",
        ];
        SAID[usize::from(n.clamp(2, 9) - 2)]
    }

    /// The sentence a person reads.
    pub fn sentence(&self) -> String {
        format!("{} with {} {}", self.tool, self.call, self.change)
    }
}

/// Why the solver could not say.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WideningError {
    /// The solver could not be started (not installed where `CVC5` says).
    #[error("the solver ({path}) could not start: {reason}")]
    SolverMissing {
        /// Where it was looked for.
        path: String,
        /// What the system said.
        reason: String,
    },
    /// The solver failed, or answered "unknown", on a tool's question.
    #[error("the solver failed on {tool}: {reason}")]
    SolverFailed {
        /// The tool asked about.
        tool: String,
        /// What went wrong.
        reason: String,
    },
    /// A policy could not be read against a tool's listing now (a tool whose arguments changed,
    /// or that the old schema did not know).
    #[error("the policies cannot be compared for {tool}: {reason}")]
    Incomparable {
        /// The tool.
        tool: String,
        /// Why.
        reason: String,
    },
    /// The solver did not answer in time.
    #[error("the solver did not answer within {0} s")]
    Timeout(u64),
    /// Everything the solver compares was proved not to widen, but the change touches what it
    /// does not compare (a grant's length, a budget): read those lines.
    #[error(
        "nothing runs without a click, is let through, needs fewer approvers or loses works-once \
         or a typed target that did not before (proved), but it changes {0}, which is not analysed"
    )]
    NotAnalysed(String),
}

impl WideningError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            WideningError::SolverMissing { .. } => "solver_missing",
            WideningError::SolverFailed { .. } => "solver_failed",
            WideningError::Incomparable { .. } => "incomparable",
            WideningError::Timeout(_) => "solver_timeout",
            WideningError::NotAnalysed(_) => "not_analysed",
        }
    }
}

/// What a change does, as far as the solver could say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Widening {
    /// Proved, for every tool: nothing runs without a click that did not before, and nothing
    /// forbidden before is let through.
    OnlyTightens,
    /// Widens: for each way, one call the solver found.
    Widens(Vec<Example>),
    /// Not known. Never read as a proof.
    Unknown(WideningError),
}

/// Which region of calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Region {
    /// What runs without a click.
    Open,
    /// What is not refused outright.
    NotForbidden,
    /// What needs at most a token (`open` or `token`, never `once`).
    AtMostToken,
    /// What no rule asks this many approvers or more of.
    FewerApprovers(u8),
    /// What no rule asks the target typed of.
    Untyped,
}

/// A permit's number of approvers (1 unless it says).
fn approvers(policy: &Policy) -> u8 {
    policy
        .annotation("approvers")
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

/// `policy` with its effect turned to forbid, under `id` (for `tool`'s comparison).
fn as_forbid(policy: &Policy, id: PolicyId, tool: &Tool) -> Result<Policy, WideningError> {
    let mut json = policy.to_json().map_err(|e| incomparable(tool, e))?;
    json["effect"] = serde_json::Value::String("forbid".into());
    Policy::from_json(Some(id), json).map_err(|e| incomparable(tool, e))
}

/// The comparison for `tool` could not be set up.
fn incomparable(tool: &Tool, why: impl std::fmt::Display) -> WideningError {
    WideningError::Incomparable {
        tool: tool.name.clone(),
        reason: why.to_string(),
    }
}

/// The policy set of `which` region of `rules` for `tool`, under fresh ids (`tag` keeps the old
/// and new apart).
fn region(
    rules: &Rules,
    tool: &Tool,
    which: Region,
    tag: &str,
) -> Result<PolicySet, WideningError> {
    let mut set = PolicySet::new();
    let mut n = 0;
    let mut next = || {
        n += 1;
        PolicyId::new(format!("{tag}{n}"))
    };
    let add =
        |set: &mut PolicySet, policy: Policy| set.add(policy).map_err(|e| incomparable(tool, e));
    let parse = |id: PolicyId, text: String| {
        Policy::parse(Some(id), text).map_err(|e| incomparable(tool, e))
    };
    // The class a region lets through at most, for the two regions of classes.
    let loosest = match which {
        Region::Open => Some(rank("open")),
        Region::AtMostToken => Some(rank("token")),
        _ => None,
    };
    let every_call = match loosest {
        // A call no permit speaks to has the class the tool's annotations give.
        Some(most) => rank(tool.class) <= most,
        None => true,
    };
    if every_call {
        let text = format!(
            "permit(principal, action == {NAMESPACE}::Action::{}, resource);",
            serde_json::Value::String(tool.name.clone())
        );
        add(&mut set, parse(next(), text)?)?;
    }
    for policy in rules.policies.policies() {
        if policy.effect() == Effect::Forbid {
            add(&mut set, policy.new_id(next()))?;
            continue;
        }
        let keeps_out = match which {
            Region::NotForbidden => continue,
            // A stricter permit that matches keeps the call out; a loose enough one lets it in.
            Region::Open | Region::AtMostToken => {
                let class = rank(policy.annotation("class").unwrap_or("once"));
                if class <= loosest.unwrap_or(0) {
                    add(&mut set, policy.new_id(next()))?;
                    continue;
                }
                true
            }
            Region::FewerApprovers(n) => approvers(policy) >= n,
            Region::Untyped => policy.annotation("type_target") == Some("true"),
        };
        if keeps_out {
            add(&mut set, as_forbid(policy, next(), tool)?)?;
        }
    }
    Ok(set)
}

/// Whether the change from `old` to `new` widens what runs without a click or what is refused
/// outright, asked of the cvc5 executable at `solver` (`CVC5`), within `limit` in all.
pub async fn widening(old: &Rules, new: &Rules, solver: &Path, limit: Duration) -> Widening {
    // Rules that wait for a tool no server lists now are not in force and have no schema to be
    // compared under: what they will do once it is listed is not analysed, so nothing is proved.
    let waiting = new.waiting_for();
    match tokio::time::timeout(limit, compare(old, new, solver)).await {
        Ok(Ok(examples)) if examples.is_empty() && !waiting.is_empty() => {
            Widening::Unknown(WideningError::Incomparable {
                tool: waiting.join(", "),
                reason: "rules name these tools, which no server lists now: they are not in \
                         force, and what they will do once listed is not analysed"
                    .into(),
            })
        }
        Ok(Ok(examples)) if examples.is_empty() => match unanalysed(old, new) {
            Some(what) => Widening::Unknown(WideningError::NotAnalysed(what)),
            None => Widening::OnlyTightens,
        },
        Ok(Ok(examples)) => Widening::Widens(examples),
        Ok(Err(why)) => Widening::Unknown(why),
        Err(_) => Widening::Unknown(WideningError::Timeout(limit.as_secs())),
    }
}

/// What is asked of the solver for `tool`: what runs without a click and what is not forbidden,
/// always; works-once, approvers and a typed target where the old rules (or the tool's
/// annotations) ask them, for nothing else can be lost.
fn questions(old: &Rules, tool: &Tool) -> Vec<(Region, &'static str)> {
    let mut asked = vec![
        (Region::Open, Example::RUNS_WITHOUT_A_CLICK),
        (Region::NotForbidden, Example::NO_LONGER_FORBIDDEN),
    ];
    let permits: Vec<&Policy> = old
        .policies
        .policies()
        .filter(|p| p.effect() == Effect::Permit)
        .collect();
    if tool.class == "once"
        || permits
            .iter()
            .any(|p| p.annotation("class") == Some("once"))
    {
        asked.push((Region::AtMostToken, Example::NO_LONGER_ONCE));
    }
    let mut numbers: Vec<u8> = permits
        .iter()
        .map(|p| approvers(p))
        .filter(|n| *n >= 2)
        .collect();
    numbers.sort_unstable();
    numbers.dedup();
    for n in numbers {
        asked.push((Region::FewerApprovers(n), Example::fewer_approvers(n)));
    }
    if permits
        .iter()
        .any(|p| p.annotation("type_target") == Some("true"))
    {
        asked.push((Region::Untyped, Example::NO_LONGER_TYPED));
    }
    asked
}

/// What the two texts say of grants and budgets, rule by rule, where they differ: the solver
/// does not compare those, so a change of them is never called proved.
fn unanalysed(old: &Rules, new: &Rules) -> Option<String> {
    const KEYS: [&str; 6] = GRANTS_AND_BUDGETS;
    let said = |rules: &Rules| {
        let mut all: Vec<String> = rules
            .policies
            .policies()
            .filter(|p| KEYS.iter().any(|k| p.annotation(k).is_some()))
            .map(|p| {
                let mut text = p.to_string();
                // The rule as said, without its id (the same rule under another id is the same).
                if let Some(id) = p.annotation("id") {
                    text = text.replace(&format!("@id({})", serde_json::Value::from(id)), "");
                }
                text
            })
            .collect();
        all.sort();
        all
    };
    (said(old) != said(new)).then(|| "a grant's length or a budget".to_owned())
}

async fn compare(old: &Rules, new: &Rules, solver: &Path) -> Result<Vec<Example>, WideningError> {
    let missing = |reason: String| WideningError::SolverMissing {
        path: solver.display().to_string(),
        reason,
    };
    let local = LocalSolver::from_command(
        tokio::process::Command::new(solver)
            .args(["--lang", "smt"])
            .kill_on_drop(true),
    )
    .map_err(|e| missing(e.to_string()))?;
    let mut compiler = CedarSymCompiler::new(local).map_err(|e| missing(e.to_string()))?;
    let mut examples = Vec::new();
    let principal = uid("Tenant", "").type_name().clone();
    let resource = uid("Server", "").type_name().clone();
    // Every tool of the new listing is compared: none is skipped as new or changed.
    for tool in &new.tools {
        let env = RequestEnv::new(
            principal.clone(),
            uid("Action", &tool.name),
            resource.clone(),
        );
        for (which, change) in questions(old, tool) {
            let after = region(new, tool, which, "new")?;
            let after = CompiledPolicySet::compile(&after, &env, &new.schema)
                .map_err(|e| incomparable(tool, e))?;
            // The old rules, read against this tool as it is listed now (and as the old
            // annotations would have classed it, which are the tool's).
            let before = region(old, tool, which, "old")?;
            let before = CompiledPolicySet::compile(&before, &env, &new.schema)
                .map_err(|e| incomparable(tool, e))?;
            let found = compiler
                .check_implies_with_counterexample_opt(&after, &before)
                .await
                .map_err(|e| WideningError::SolverFailed {
                    tool: tool.name.clone(),
                    reason: e.to_string(),
                })?;
            if let Some(env) = found {
                let request = &env.request;
                let call = format!(
                    "context {} as {} on {}",
                    request
                        .context()
                        .map_or_else(|| "{}".to_owned(), ToString::to_string),
                    request
                        .principal()
                        .map_or_else(String::new, ToString::to_string),
                    request
                        .resource()
                        .map_or_else(String::new, ToString::to_string),
                );
                examples.push(Example {
                    tool: tool.name.clone(),
                    change,
                    call,
                });
            }
        }
    }
    let _ = compiler.solver_mut().clean_up().await;
    Ok(examples)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::tests::{EXAMPLE, tools};

    /// The cvc5 executable: `CVC5`, or the one `.ci/setup tests` puts under target/peers.
    fn solver() -> std::path::PathBuf {
        let path = std::env::var_os("CVC5")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/peers/bin/cvc5")
            });
        assert!(
            path.exists(),
            "no cvc5 at {}: run `.ci/setup tests` (or name one with CVC5)",
            path.display()
        );
        path
    }

    const EVERYTHING_CLICKS: &str = "@class(\"once\")\npermit (principal, action, resource);";

    async fn widens(old: &str, new: &str) -> Widening {
        let (old, new) = (
            Rules::parse(old, &tools()).unwrap(),
            Rules::parse(new, &tools()).unwrap(),
        );
        widening(&old, &new, &solver(), Duration::from_secs(120)).await
    }

    #[tokio::test]
    #[ignore = "needs cvc5: `.ci/setup tests` installs it (the test command runs ignored tests)"]
    async fn an_added_open_rule_is_shown_as_a_call_it_lets_run_without_a_click() {
        // (Added beside a rule that asks a click of everything, the open rules would open
        // nothing: the strictest matching rule wins. So the example replaces it.)
        let new = format!("{EVERYTHING_CLICKS}\n{EXAMPLE}");
        assert_eq!(
            widens(EVERYTHING_CLICKS, &new).await,
            Widening::OnlyTightens
        );
        let Widening::Widens(examples) = widens(EVERYTHING_CLICKS, EXAMPLE).await else {
            panic!("an open rule added was not found to widen");
        };
        let tools: Vec<(&str, &str)> = examples
            .iter()
            .map(|e| (e.tool.as_str(), e.change))
            .collect();
        for tool in ["query", "execute", "write_file"] {
            assert!(
                tools.contains(&(tool, Example::RUNS_WITHOUT_A_CLICK)),
                "{tool}: {examples:?}"
            );
        }
        // The call found is one the new rule lets through: a single SELECT, a path under scratch/.
        let execute = examples.iter().find(|e| e.tool == "execute").unwrap();
        assert!(execute.call.contains("SELECT "), "{}", execute.sentence());
        assert!(!execute.call.contains(';'), "{}", execute.sentence());
        let write = examples.iter().find(|e| e.tool == "write_file").unwrap();
        assert!(write.call.contains("scratch/"), "{}", write.sentence());
        assert!(write.sentence().ends_with("would run without a click"));
    }

    #[tokio::test]
    #[ignore = "needs cvc5: `.ci/setup tests` installs it (the test command runs ignored tests)"]
    async fn removing_an_open_rule_or_adding_a_forbid_is_proved_to_only_tighten() {
        let without_scratch = EXAMPLE.replace(
            "@class(\"open\")\npermit (principal, action == Countersign::Action::\"write_file\", resource)\nwhen { context.arguments.path like \"scratch/*\" && !(context.arguments.path like \"*..*\") };",
            "",
        );
        assert_ne!(without_scratch, EXAMPLE);
        assert_eq!(
            widens(EXAMPLE, &without_scratch).await,
            Widening::OnlyTightens
        );
        let with_forbid = format!(
            "{EXAMPLE}\n@reason(\"no deletes\")\nforbid (principal, action == Countersign::Action::\"execute\", resource)\nwhen {{ context.arguments.sql like \"*DELETE*\" }};"
        );
        assert_eq!(widens(EXAMPLE, &with_forbid).await, Widening::OnlyTightens);
        assert_eq!(widens(EXAMPLE, EXAMPLE).await, Widening::OnlyTightens);
    }

    #[tokio::test]
    #[ignore = "needs cvc5: `.ci/setup tests` installs it (the test command runs ignored tests)"]
    async fn a_narrowed_forbid_is_shown_as_a_call_no_longer_forbidden() {
        let night_only = EXAMPLE.replace(
            "(context.hour < 9 || context.hour >= 18)",
            "context.hour < 6",
        );
        assert_ne!(night_only, EXAMPLE);
        let Widening::Widens(examples) = widens(EXAMPLE, &night_only).await else {
            panic!("a narrowed forbid was not found to widen");
        };
        let forbid = examples
            .iter()
            .find(|e| e.change == Example::NO_LONGER_FORBIDDEN)
            .unwrap_or_else(|| panic!("{examples:?}"));
        assert_eq!(forbid.tool, "execute");
        assert!(
            forbid.call.to_lowercase().contains("drop"),
            "{}",
            forbid.sentence()
        );
    }

    fn file_tool(name: &str, arguments: &[&str]) -> Tool {
        let properties: serde_json::Map<String, serde_json::Value> = arguments
            .iter()
            .map(|a| ((*a).to_owned(), serde_json::json!({"type": "string"})))
            .collect();
        Tool::new(
            name,
            &serde_json::json!({"type": "object", "properties": properties, "required": arguments}),
            true,
        )
    }

    async fn widens_with(old: (&str, &[Tool]), new: (&str, &[Tool])) -> Widening {
        let (old, new) = (
            Rules::parse(old.0, old.1).unwrap(),
            Rules::parse(new.0, new.1).unwrap(),
        );
        widening(&old, &new, &solver(), Duration::from_secs(120)).await
    }

    #[tokio::test]
    #[ignore = "needs cvc5: `.ci/setup tests` installs it (the test command runs ignored tests)"]
    async fn removing_a_stricter_rule_that_overlapped_an_open_one_is_shown_as_opening() {
        let tools = [file_tool("write", &["path"])];
        let both = r#"
            @class("open") permit (principal, action == Countersign::Action::"write", resource)
            when { context.arguments.path like "scratch/*" };
            @class("once") permit (principal, action == Countersign::Action::"write", resource)
            when { context.arguments.path like "scratch/secret/*" };
        "#;
        let open_only = r#"
            @class("open") permit (principal, action == Countersign::Action::"write", resource)
            when { context.arguments.path like "scratch/*" };
        "#;
        let Widening::Widens(found) = widens_with((both, &tools), (open_only, &tools)).await else {
            panic!("removing the stricter overlap was not found to widen");
        };
        assert!(
            found[0].call.contains("scratch/secret/"),
            "{}",
            found[0].sentence()
        );
        // The other way round only tightens.
        assert_eq!(
            widens_with((open_only, &tools), (both, &tools)).await,
            Widening::OnlyTightens
        );
    }

    #[tokio::test]
    #[ignore = "needs cvc5: `.ci/setup tests` installs it (the test command runs ignored tests)"]
    async fn a_rule_removed_from_a_tool_open_by_its_annotations_is_shown_as_opening() {
        let tools = [file_tool("read", &["path"]).read_only()];
        let gated = r#"
            @class("once") permit (principal, action == Countersign::Action::"read", resource)
            when { context.arguments.path like ".ssh/*" };
        "#;
        let Widening::Widens(found) = widens_with((gated, &tools), ("", &tools)).await else {
            panic!("unruled calls of an open tool were not counted");
        };
        assert!(found[0].call.contains(".ssh/"), "{}", found[0].sentence());
    }

    #[tokio::test]
    #[ignore = "needs cvc5: `.ci/setup tests` installs it (the test command runs ignored tests)"]
    async fn a_newly_listed_tool_is_compared_and_one_whose_shape_changed_is_never_proved() {
        let before = [file_tool("write", &["path"])];
        let after = [
            file_tool("write", &["path"]),
            file_tool("upload", &["path"]),
        ];
        let opens_upload = r#"
            @class("open") permit (principal, action == Countersign::Action::"upload", resource)
            when { context.arguments.path like "public/*" };
        "#;
        let Widening::Widens(found) = widens_with(("", &before), (opens_upload, &after)).await
        else {
            panic!("a rule opening a newly listed tool was not found to widen");
        };
        assert_eq!(found[0].tool, "upload");
        // The old rules name an argument the tool no longer takes: not comparable, said so.
        let on_path = r#"
            @class("open") permit (principal, action == Countersign::Action::"write", resource)
            when { context.arguments.path like "scratch/*" };
        "#;
        let renamed = [file_tool("write", &["file"])];
        let answer = widens_with((on_path, &before), ("", &renamed)).await;
        assert!(
            matches!(answer, Widening::Unknown(ref why) if why.code() == "incomparable"),
            "{answer:?}"
        );
    }

    #[tokio::test]
    #[ignore = "needs cvc5: `.ci/setup tests` installs it (the test command runs ignored tests)"]
    async fn fewer_approvers_no_typed_target_and_no_longer_once_are_each_shown_as_a_widening() {
        let tools = [file_tool("write", &["path"])];
        let strict = r#"@class("once") @approvers("2") @type_target("true")
            permit (principal, action == Countersign::Action::"write", resource)
            when { context.arguments.path like ".github/*" };"#;
        let one = strict.replace(r#"@approvers("2") "#, "");
        let untyped = strict.replace(r#"@type_target("true")"#, "");
        let token = strict.replace(r#"@class("once")"#, r#"@class("token")"#);
        for (looser, change) in [
            (one, Example::fewer_approvers(2)),
            (untyped, Example::NO_LONGER_TYPED),
            (token, Example::NO_LONGER_ONCE),
        ] {
            let Widening::Widens(found) = widens_with((strict, &tools), (&looser, &tools)).await
            else {
                panic!("{change}: not found to widen");
            };
            let shown = found
                .iter()
                .find(|e| e.change == change)
                .unwrap_or_else(|| panic!("{change}: {found:?}"));
            assert!(shown.call.contains(".github/"), "{}", shown.sentence());
            // Back the other way: proved to only tighten.
            assert_eq!(
                widens_with((&looser, &tools), (strict, &tools)).await,
                Widening::OnlyTightens,
                "{change}"
            );
        }
        // A grant's length changed: not compared, so never said to only tighten.
        let granted = strict.replace(
            r#"@class("once")"#,
            r#"@class("once") @grant_max_minutes("10")"#,
        );
        let longer = granted.replace(r#"@grant_max_minutes("10")"#, r#"@grant_max_minutes("60")"#);
        let answer = widens_with((&granted, &tools), (&longer, &tools)).await;
        assert!(
            matches!(answer, Widening::Unknown(ref why) if why.code() == "not_analysed"),
            "{answer:?}"
        );
    }

    #[tokio::test]
    #[ignore = "needs cvc5: `.ci/setup tests` installs it (the test command runs ignored tests)"]
    async fn out_of_time_is_unknown_and_never_a_proof() {
        // Two texts that differ: the solver must be asked (the same text compiles to the same
        // terms, which may be decided without a question, in no time at all).
        let (old, new) = (
            Rules::parse(EVERYTHING_CLICKS, &tools()).unwrap(),
            Rules::parse(EXAMPLE, &tools()).unwrap(),
        );
        let answer = widening(&old, &new, &solver(), Duration::from_nanos(1)).await;
        assert!(
            matches!(answer, Widening::Unknown(ref why) if why.code() == "solver_timeout"),
            "{answer:?}"
        );
    }

    #[tokio::test]
    async fn without_a_solver_or_in_time_nothing_is_claimed() {
        let rules = Rules::parse(EXAMPLE, &tools()).unwrap();
        let missing = widening(
            &rules,
            &rules,
            Path::new("/nonexistent/cvc5"),
            Duration::from_secs(5),
        )
        .await;
        assert!(
            matches!(missing, Widening::Unknown(ref why) if why.code() == "solver_missing"),
            "{missing:?}"
        );
    }
}
