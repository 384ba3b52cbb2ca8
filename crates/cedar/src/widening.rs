//! What a policy change widens, proved by Cedar's symbolic compiler (SymCC) and a cvc5 process.
//!
//! For each tool, two regions of calls are compared between the old policy and the new:
//! - **runs without a click**: calls a `permit` with `@class("open")` allows and no `forbid`
//!   refuses. A call in it now and not before is a widening: it needed a click, or was
//!   forbidden, and now runs on its own.
//! - **refused outright**: calls some `forbid` matches. A call out of it now and in it before
//!   is a widening: it was forbidden and now reaches a person (or runs).
//!
//! Each comparison is one question to the solver: does the new region imply the old one (every
//! call in the new one is in the old)? A proof is "only tightens" for that region; a refutation
//! comes with a concrete call the solver found, shown as what it is ("execute with context … on
//! Server::"builtin:app.sqlite" would run without a click"). A change is said to only tighten
//! when every comparison of every tool is proved; when the solver is missing, fails, or runs out
//! of time, the answer says so and never claims a proof. Calls are compared within one tool's
//! schema; a tool added to the listing is a new schema, judged by the rules as they stand.
//!
//! This is the one part of the crate that is not pure: it runs the solver as a child process.

use std::path::Path;
use std::time::Duration;

use cedar_policy::{Effect, Policy, PolicyId, PolicySet, RequestEnv};
use cedar_policy_symcc::solver::LocalSolver;
use cedar_policy_symcc::{CedarSymCompiler, CompiledPolicySet};

use crate::model::{NAMESPACE, uid};
use crate::rules::Rules;

/// One call that the new policy lets through where the old did not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// The tool.
    pub tool: String,
    /// What changed for it: [`Example::RUNS_WITHOUT_A_CLICK`] or [`Example::NO_LONGER_FORBIDDEN`].
    pub change: &'static str,
    /// The call, as the solver found it: principal, resource and context in Cedar's syntax.
    pub call: String,
}

impl Example {
    /// It needed a click (or was forbidden) before, and runs on its own now.
    pub const RUNS_WITHOUT_A_CLICK: &'static str = "would run without a click";
    /// It was refused outright before, and is not now.
    pub const NO_LONGER_FORBIDDEN: &'static str = "is no longer forbidden";

    /// The sentence a person reads.
    pub fn sentence(&self) -> String {
        format!("{} with {} {}", self.tool, self.call, self.change)
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
    /// Not known: the solver is missing, failed, or ran out of time. Never read as a proof.
    Unknown(String),
}

/// The policies of `rules` that make up a region, under fresh ids (`tag` keeps the old and new
/// apart): for [`Region::Open`], the open permits and every forbid; for [`Region::NotForbidden`],
/// one permit of everything and every forbid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Region {
    Open,
    NotForbidden,
}

fn region(rules: &Rules, which: Region, tag: &str) -> PolicySet {
    let mut set = PolicySet::new();
    let mut n = 0;
    let mut add = |policy: Policy| {
        n += 1;
        let _ = set.add(policy.new_id(PolicyId::new(format!("{tag}{n}"))));
    };
    if which == Region::NotForbidden {
        add(Policy::parse(None, "permit(principal, action, resource);").expect("a permit parses"));
    }
    for policy in rules.policies.policies() {
        let keep = match policy.effect() {
            Effect::Forbid => true,
            Effect::Permit => which == Region::Open && policy.annotation("class") == Some("open"),
        };
        if keep {
            add(policy.clone());
        }
    }
    set
}

/// Whether the change from `old` to `new` widens what runs without a click or what is refused
/// outright, asked of the cvc5 executable at `solver` (`CVC5`), within `limit` in all.
pub async fn widening(old: &Rules, new: &Rules, solver: &Path, limit: Duration) -> Widening {
    match tokio::time::timeout(limit, compare(old, new, solver)).await {
        Ok(Ok(examples)) if examples.is_empty() => Widening::OnlyTightens,
        Ok(Ok(examples)) => Widening::Widens(examples),
        Ok(Err(why)) => Widening::Unknown(why),
        Err(_) => Widening::Unknown(format!(
            "the solver did not answer within {} s",
            limit.as_secs()
        )),
    }
}

async fn compare(old: &Rules, new: &Rules, solver: &Path) -> Result<Vec<Example>, String> {
    let local = LocalSolver::from_command(
        tokio::process::Command::new(solver)
            .args(["--lang", "smt"])
            .kill_on_drop(true),
    )
    .map_err(|e| format!("the solver ({}) could not start: {e}", solver.display()))?;
    let mut compiler =
        CedarSymCompiler::new(local).map_err(|e| format!("the solver refused to start: {e}"))?;
    let mut examples = Vec::new();
    let principal: cedar_policy::EntityTypeName = format!("{NAMESPACE}::Tenant").parse().unwrap();
    let resource: cedar_policy::EntityTypeName = format!("{NAMESPACE}::Server").parse().unwrap();
    for tool in &new.tools {
        // A tool the old policy's schema did not know is judged by the new rules alone.
        if !old.tools.iter().any(|t| t == tool) {
            continue;
        }
        let env = RequestEnv::new(
            principal.clone(),
            uid("Action", &tool.name),
            resource.clone(),
        );
        for (which, change) in [
            (Region::Open, Example::RUNS_WITHOUT_A_CLICK),
            (Region::NotForbidden, Example::NO_LONGER_FORBIDDEN),
        ] {
            let compile = |rules: &Rules, tag: &str| {
                CompiledPolicySet::compile(&region(rules, which, tag), &env, &new.schema)
                    .map_err(|e| format!("the policy could not be compiled for {}: {e}", tool.name))
            };
            let (after, before) = (compile(new, "new")?, compile(old, "old")?);
            let found = compiler
                .check_implies_with_counterexample_opt(&after, &before)
                .await
                .map_err(|e| format!("the solver failed on {}: {e}", tool.name))?;
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
        let new = format!("{EVERYTHING_CLICKS}\n{EXAMPLE}");
        let Widening::Widens(examples) = widens(EVERYTHING_CLICKS, &new).await else {
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
        assert!(forbid.call.contains("DROP"), "{}", forbid.sentence());
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
            matches!(missing, Widening::Unknown(ref why) if why.contains("could not start")),
            "{missing:?}"
        );
    }
}
