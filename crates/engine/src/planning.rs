//! A gated call turned into the plan a person approves: the one place that does it.
//!
//! The connection's listed rule decides whether the call is gated at all; the policy builds the
//! plan from the arguments (never from text the agent wrote); the built-in `execute` is named by
//! what its SQL writes (see the describing room); the plan's hash is what a token binds.

use countersign_core::Tenant;
use std::sync::Arc;

use countersign_core::policy::{self, ToolRule};
use countersign_core::{Plan, PlanHash, Refusal};
use serde_json::{Map, Value};

use crate::answer::{ErrorCode, Stopped};
use crate::authority::{Engine, error, lock, outage, refused};
use crate::describing;
use crate::ruling::Ruled;
use crate::state::Listed;

/// A gated call, planned: see [`Engine::plan_call`].
pub(crate) struct Call {
    pub(crate) rule: ToolRule,
    pub(crate) client_info: Value,
    pub(crate) server: String,
    pub(crate) args: Map<String, Value>,
    pub(crate) fields: policy::ConfirmFields,
    pub(crate) plan: Plan,
    pub(crate) hash: PlanHash,
    /// The rules over arguments open this call: it runs without a click (a preflight of it is
    /// answered by running it, see [`crate::Queued::Open`]).
    pub(crate) open: bool,
    /// The lines of the rules that opened it (empty when it is open by its annotations, or not
    /// open): a call a rule opened is on the record.
    pub(crate) opened_by: Vec<usize>,
    /// The rules over arguments gated it (rather than its listing).
    pub(crate) ruled: bool,
    /// The longest a grant of it may last, in minutes, where a rule says.
    pub(crate) grant_max_minutes: Option<u64>,
    /// The rules' budgets a click-less run of it takes from.
    pub(crate) budgets: Vec<countersign_cedar::Budget>,
}

impl Engine {
    /// A gated call of a registered tool of `tenant`, planned under its rule: the one place that
    /// turns a tool name and raw arguments into the plan a person approves (or an error reply).
    pub(crate) fn plan_call(
        &self,
        tenant: &Tenant,
        tool: &str,
        arguments: &Value,
    ) -> Result<Call, Stopped> {
        self.plan_held(tenant, tool, arguments, None)
    }

    /// [`Self::plan_call`], by a caller that may hold a turn to describe SQL (`turn`); without
    /// one, a call that needs describing takes a free turn (its connection's and the desk's) or
    /// is answered busy.
    pub(crate) fn plan_held(
        &self,
        tenant: &Tenant,
        tool: &str,
        arguments: &Value,
        turn: Option<&describing::Turn>,
    ) -> Result<Call, Stopped> {
        let (rule, by_rules, client_info, server, id, own_turn) = {
            let state = lock(&self.inner.state);
            let conn = state
                .connections
                .get(tenant)
                .ok_or_else(|| error(ErrorCode::NotIntroduced, "unknown connection"))?;
            if conn.pins_unread {
                // Its listing could not be compared with the pins: an outage, said as one.
                return Err(outage());
            }
            match conn.tools.get(tool) {
                // Recorded by the caller that refuses the call (a withdraw refuses nothing).
                Some(listed) if !listed.pinned => return Err(refused(Refusal::ToolChanged)),
                Some(Listed { rule, by_rules, .. }) if rule.class.is_gated() => (
                    rule.clone(),
                    *by_rules,
                    conn.client_info.clone(),
                    conn.server.clone(),
                    conn.id.clone(),
                    Arc::clone(&conn.own_turn),
                ),
                Some(_) => {
                    let message = format!("`{tool}` is open: it needs no approval");
                    return Err(error(ErrorCode::UnknownTool, message));
                }
                None => {
                    let message = format!("`{tool}` is not a tool this connection offers");
                    return Err(error(ErrorCode::UnknownTool, message));
                }
            }
        };
        let bad = |e: &dyn std::fmt::Display| error(ErrorCode::BadArguments, e.to_string());
        let (args, fields) = policy::split_confirm(arguments).map_err(|e| bad(&e))?;
        let plan = policy::plan(&rule, tool, &args).map_err(|e| bad(&e))?;
        let turn = turn.ok_or(&own_turn);
        let plan = self.described(&id, tool, &rule, &args, plan, turn)?;
        let hash = plan.hash().map_err(|e| bad(&e))?;
        // The rules over arguments see the call as planned (and described): they may refuse it,
        // open it, or ask more of it than its listing did.
        let ruled = self.rule_call(
            tenant,
            &server,
            tool,
            &rule,
            by_rules,
            &plan,
            &Value::Object(args.clone()),
        )?;
        let (rule, open, ruled, grant_max_minutes, budgets, opened_by) = match ruled {
            Ruled::AsListed => (rule, false, false, None, Vec::new(), Vec::new()),
            Ruled::Open(budgets, lines) => (rule, true, false, None, budgets, lines),
            Ruled::Gated(rule, grant, budgets) => (rule, false, true, grant, budgets, Vec::new()),
        };
        Ok(Call {
            rule,
            client_info,
            server,
            args,
            fields,
            plan,
            hash,
            open,
            opened_by,
            ruled,
            grant_max_minutes,
            budgets,
        })
    }
}
