//! Rules over arguments (`policy.cedar`): what the Cedar rules in force decide for one call.
//!
//! The TOML policy classes a tool once, when it is listed; the rules look at each call (its
//! arguments, plan, the hour) and may refuse it outright, open it, or ask more of it (a stricter
//! class, more approvers, a typed target, a shorter grant). The engine keeps the text last
//! accepted and the tools each server listed; the rules are loaded against the tools of every
//! server at once ([`countersign_cedar::merge`]), again whenever a listing changes what they see.
//! A text that does not load is refused whole by whoever proposed it ([`Engine::set_rules`]); one
//! that stops loading against a later listing stays in force as it was last loaded, and a call of
//! a tool it was not loaded with is refused `policy_unfit` wherever a rule may reach it.
//!
//! Loading and deciding are pure (`countersign_cedar::rules`); what a change widens needs a
//! solver process and is asked by the desk and `serve`, not here.

use std::collections::BTreeMap;
use std::sync::Arc;

use countersign_cedar::{Budget, Outcome, Rules, RulesError, Tool};
use countersign_core::policy::ToolRule;
use countersign_core::{GateClass, Refusal, Tenant, gate};
use serde_json::Value;

use crate::answer::Stopped;
use crate::authority::Engine;

/// The rules in force and what they were loaded against.
#[derive(Default)]
pub(crate) struct Ruling {
    /// The text in force; `None`: no rules.
    text: Option<String>,
    /// Each server's tools as it last listed them, as the rules see them.
    tools: BTreeMap<String, Vec<Tool>>,
    /// The text, loaded against the merge of `tools` (`None` without a text).
    rules: Option<Arc<Rules>>,
    /// Why the text did not load against the tools listed since it last did, if it did not.
    problem: Option<RulesError>,
    /// The tools of every server as listed now, merged (what `rules` would be loaded against).
    merged: Vec<Tool>,
    /// Counts every change of the text or of the rules in force: a listing classed under
    /// another generation is out of date (see [`Engine::rules_generation`]).
    generation: u64,
}

impl Ruling {
    fn merged(&self) -> Vec<Tool> {
        self.merged.clone()
    }

    /// Whether some call of `tool` may be the rules' to decide: a rule may gate it, or there is a
    /// text in force that could not be loaded (then every call is refused until it loads).
    pub(crate) fn may_gate(&self, tool: &str) -> bool {
        match (&self.rules, &self.text) {
            (Some(rules), _) => rules.may_gate(tool),
            (None, text) => text.is_some(),
        }
    }
}

/// A tool as the rules see it, from its listing (its annotations read as the engine reads
/// them): the one place a listing becomes a `countersign_cedar::Tool`.
pub fn tool_of(listed: &Value) -> Option<Tool> {
    let name = listed.get("name").and_then(Value::as_str)?;
    let annotations = listed.get("annotations");
    let schema = listed.get("inputSchema").cloned().unwrap_or(Value::Null);
    let tool = Tool::new(name, &schema, gate::is_destructive(annotations));
    Some(match GateClass::from_annotations(annotations) {
        GateClass::Open => tool.read_only(),
        GateClass::Token => Tool {
            class: "token",
            ..tool
        },
        GateClass::Once => Tool {
            class: "once",
            ..tool
        },
    })
}

/// What the rules make of one planned call.
pub(crate) enum Ruled {
    /// As the listing classed it (no rules, or none speaks to the call).
    AsListed,
    /// Runs without a click, within the budgets; the lines of the rules that opened it (none:
    /// open by its annotations, no rule speaking to it).
    Open(Vec<Budget>, Vec<usize>),
    /// Gated as the rule says: the rule, the longest grant, the budgets a grant's call takes.
    Gated(ToolRule, Option<u64>, Vec<Budget>),
}

/// The longest window a budget may have (`@budget_minutes`), in ms: older windows are forgotten.
const LONGEST_WINDOW_MS: u64 = 31 * 24 * 60 * 60_000;

/// The refusal of a call past `budget`, at `now`: which budget, and when it resets.
pub(crate) fn budget_spent(budget: &Budget, now: u64) -> Stopped {
    let window = budget.minutes * 60_000;
    let resets_at = (now - now % window).saturating_add(window);
    let counted = if budget.counts == "calls" {
        format!("{} calls", budget.limit)
    } else {
        format!("{} of `{}`", budget.limit, budget.counts)
    };
    let counted = if budget.per_grant {
        format!("{counted} per grant")
    } else {
        counted
    };
    Stopped::Refused {
        refusal: Refusal::BudgetSpent,
        message: format!(
            "Refused: the desk's rules allow {counted} per {} minutes without a click \
             (policy.cedar line {}), and this window's is used; it resets in {} s \
             (at {resets_at} ms since the epoch). {}",
            budget.minutes,
            budget.line,
            resets_at.saturating_sub(now).div_ceil(1000),
            Refusal::BudgetSpent.next_step()
        ),
    }
}

impl Engine {
    /// Loads `text` as the rules in force (`None`: none), against the tools every server listed.
    /// Refused whole, with the line and the reason, when it does not load; then what was in force
    /// stays.
    pub fn set_rules(&self, text: Option<String>) -> Result<(), RulesError> {
        let mut ruling = self.ruling_mut();
        let rules = match &text {
            Some(text) => Some(Arc::new(Rules::parse(text, &ruling.merged())?)),
            None => None,
        };
        ruling.text = text;
        ruling.rules = rules;
        ruling.problem = None;
        ruling.generation += 1;
        Ok(())
    }

    /// Takes `text` as the rules in force whatever it loads to now: the text a person accepted
    /// before, at a start. Rules that name a tool no server lists yet wait for it (see
    /// `countersign_cedar::Rules`); a text that does not load at all is kept, its problem said,
    /// and every gated call is refused `policy_unfit` until a listing lets it load: never judged
    /// as if there were no rules.
    pub fn adopt_rules(&self, text: Option<String>) {
        let mut ruling = self.ruling_mut();
        let loaded = text
            .as_deref()
            .map(|text| Rules::parse(text, &ruling.merged()));
        match loaded {
            None => {
                ruling.rules = None;
                ruling.problem = None;
            }
            Some(Ok(rules)) => {
                ruling.rules = Some(Arc::new(rules));
                ruling.problem = None;
            }
            Some(Err(e)) => {
                tracing::error!(target: "desk", code = e.code(), "policy.cedar does not load ({e}): every gated call is refused policy_unfit until it does");
                ruling.rules = None;
                ruling.problem = Some(e);
            }
        }
        ruling.text = text;
        ruling.generation += 1;
    }

    /// Whether `text` would load as the rules, against the tools every server listed.
    pub fn check_rules(&self, text: &str) -> Result<(), RulesError> {
        Rules::parse(text, &self.ruling().merged()).map(drop)
    }

    /// The rules in force, loaded.
    pub fn rules(&self) -> Option<Arc<Rules>> {
        self.ruling().rules.clone()
    }

    /// `text` loaded against the tools every server listed, for comparing with the rules in
    /// force (see `countersign_cedar::widening`).
    pub fn load_rules(&self, text: &str) -> Result<Rules, RulesError> {
        Rules::parse(text, &self.ruling().merged())
    }

    /// Why the rules in force no longer load against what the servers list now, if they do not:
    /// they stay as last loaded, and calls of tools they do not know are refused where a rule
    /// may reach them.
    pub fn rules_problem(&self) -> Option<RulesError> {
        self.ruling().problem.clone()
    }

    /// A server listed `tools`: the rules are loaded again when that changes what they see.
    /// Returns the rules to class the listing with.
    pub(crate) fn rules_for_listing(&self, server: &str, tools: &[Value]) -> u64 {
        let tools: Vec<Tool> = tools.iter().filter_map(tool_of).collect();
        let mut ruling = self.ruling_mut();
        if ruling.tools.get(server) == Some(&tools) {
            return ruling.generation;
        }
        ruling.tools.insert(server.to_owned(), tools);
        ruling.merged = countersign_cedar::merge(ruling.tools.values().flatten().cloned());
        if let Some(text) = ruling.text.clone() {
            match Rules::parse(&text, &ruling.merged()) {
                Ok(rules) => {
                    ruling.rules = Some(Arc::new(rules));
                    ruling.problem = None;
                    ruling.generation += 1;
                }
                Err(e) => {
                    tracing::error!(target: "desk", server = %server, code = e.code(), "policy.cedar does not load against this listing ({e}): the rules stay as last loaded, and calls of tools they do not know are refused policy_unfit where a rule may reach them");
                    ruling.problem = Some(e);
                }
            }
        }
        ruling.generation
    }

    /// `server` listed `tools` outside any agent's connection (a team server reads each
    /// upstream's listing at start): the rules, and a change of them, are loaded and compared
    /// against it from then on, not only from an agent's first listing.
    pub fn rules_see_listing(&self, server: &countersign_core::ServerId, tools: &[Value]) {
        self.rules_for_listing(&server.key(), tools);
    }

    /// The generation of the rules: it changes whenever the text or the rules in force do. A
    /// listing classed under another is out of date, and is taken again before a call of it
    /// goes anywhere (an open tool a new rule may gate must not run as open).
    pub fn rules_generation(&self) -> u64 {
        self.ruling().generation
    }

    /// Whether some call of `tool` may be the rules' to decide now.
    pub(crate) fn rules_may_gate(&self, tool: &str) -> bool {
        self.ruling().may_gate(tool)
    }

    /// What the rules decide for a call of `tool` on `server`, planned as `plan` under `rule`
    /// (its class as listed; `by_rules` when the listing gated an open tool because a rule may).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rule_call(
        &self,
        tenant: &Tenant,
        server: &str,
        tool: &str,
        rule: &ToolRule,
        by_rules: bool,
        plan: &countersign_core::Plan,
        arguments: &Value,
    ) -> Result<Ruled, Stopped> {
        let (rules, text, stale) = {
            let ruling = self.ruling();
            // Rules that no longer load against what the servers list keep the tools they were
            // loaded with: a call of a tool that is not listed as they knew it (another server's
            // same-named tool made it destructive, say) is not theirs to judge.
            let stale = ruling.problem.is_some()
                && ruling.rules.as_ref().is_some_and(|rules| {
                    rules.tool(tool) != ruling.merged.iter().find(|t| t.name == tool)
                });
            (ruling.rules.clone(), ruling.text.is_some(), stale)
        };
        if stale {
            return Err(crate::authority::refused(Refusal::PolicyUnfit));
        }
        let Some(rules) = rules else {
            if text {
                // A text in force that does not load: nothing is judged as if it were not there.
                return Err(crate::authority::refused(Refusal::PolicyUnfit));
            }
            return Ok(if by_rules {
                Ruled::Open(Vec::new(), Vec::new())
            } else {
                Ruled::AsListed
            });
        };
        let own = if by_rules {
            GateClass::Open
        } else {
            rule.class
        };
        let hour = ((self.now() / 3_600_000) % 24) as u8;
        let call = countersign_cedar::Call {
            tenant: tenant.as_str(),
            server,
            tool,
            target: &plan.target,
            action: &plan.action,
            summary: &plan.summary,
            reversible: plan.reversible,
            class: own.code(),
            destructive: rule.destructive,
            hour,
            arguments,
        };
        match rules.decide(&call) {
            Outcome::Unruled if own == GateClass::Open => Ok(Ruled::Open(Vec::new(), Vec::new())),
            Outcome::Unruled => Ok(Ruled::AsListed),
            Outcome::Forbidden { reason } => Err(Stopped::Refused {
                refusal: Refusal::PolicyForbidden,
                message: format!(
                    "Refused: the desk's policy forbids this call: {}. {}",
                    reason.trim_end_matches('.'),
                    Refusal::PolicyForbidden.next_step()
                ),
            }),
            Outcome::Unfit => Err(crate::authority::refused(Refusal::PolicyUnfit)),
            Outcome::Gated(gate) => {
                let class = GateClass::from_code(gate.class).unwrap_or(GateClass::Once);
                if class == GateClass::Open {
                    return Ok(Ruled::Open(gate.budgets, gate.lines));
                }
                let mut rule = rule.clone();
                rule.class = class;
                rule.approvers = gate.approvers;
                if let Some(typed) = gate.type_target {
                    rule.type_target = typed;
                }
                rule.why = format!(
                    "policy.cedar: the rules over arguments class this call \"{}\"",
                    class.code()
                );
                Ok(Ruled::Gated(rule, gate.grant_max_minutes, gate.budgets))
            }
        }
    }

    /// Takes what a call of `tool` on `server` by `tenant` costs of each of `budgets`, now: the
    /// first budget with no room left, if one has none (the ones before it stay taken: a call
    /// refused past one budget still counted against the others, which never lets more run).
    /// Records that cannot be reached are an outage, never room.
    pub(crate) async fn take_budgets(
        &self,
        tenant: &Tenant,
        server: &str,
        tool: &str,
        budgets: &[Budget],
        grant: Option<u64>,
    ) -> Result<Option<Budget>, Stopped> {
        let now = self.now();
        for budget in budgets {
            let window = budget.minutes.max(1) * 60_000;
            // One key per rule, caller, server and tool, in a form no part can blur (a JSON
            // array). On the desk every connection is the same person's: its budget is the
            // desk's, not the connection's (a reconnect must not start a new one).
            let caller = if tenant.is_connection() {
                "desk".to_owned()
            } else {
                tenant.as_str().to_owned()
            };
            // A budget kept per grant counts each grant's calls apart (a grant's id is never
            // given twice); a call under no grant takes nothing from it.
            let caller = match (budget.per_grant, grant) {
                (false, _) => caller,
                (true, Some(id)) => format!("grant {id}"),
                (true, None) => continue,
            };
            let key = serde_json::json!([budget.rule, caller, server, tool]).to_string();
            let taken = self
                .records()
                .take_budget(
                    &key,
                    now - now % window,
                    budget.amount,
                    budget.limit,
                    now.saturating_sub(LONGEST_WINDOW_MS),
                )
                .await;
            match taken {
                Ok(true) => {}
                Ok(false) => return Ok(Some(budget.clone())),
                Err(e) => {
                    tracing::error!(target: "desk", error = %e, "a rule's budget could not be read: the call is refused ledger_unreachable");
                    return Err(crate::authority::outage());
                }
            }
        }
        Ok(None)
    }

    fn ruling(&self) -> std::sync::RwLockReadGuard<'_, Ruling> {
        self.inner.ruling.read().unwrap_or_else(|p| p.into_inner())
    }

    fn ruling_mut(&self) -> std::sync::RwLockWriteGuard<'_, Ruling> {
        self.inner.ruling.write().unwrap_or_else(|p| p.into_inner())
    }
}
