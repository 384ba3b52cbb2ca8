//! Why a confirm was refused, and what the caller should do next.
//!
//! Each outcome of the verification chain is its own variant because the right next move differs:
//! a skipped preflight, a stale token and a changed plan each call for something else, and an
//! agent (or a person reading history) must be able to tell them apart without matching strings.
//! [`Refusal::code`] is the stable wire name used in `structuredContent.refusal`, history and the UI;
//! [`Refusal::next_step`] is the end of its sentence that says what to do, which an agent also
//! finds alone under `structuredContent.nextStep`.

use serde::{Deserialize, Serialize};

/// One refusal of a gated call. The codes are stable: they cross to agents, the UI and history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Refusal {
    /// The call claimed `confirm: true` but carried no token: the preflight was skipped.
    NoToken,
    /// The token is malformed, has a bad signature, or carries claims of the wrong shape.
    BadToken,
    /// The token's lifetime is over.
    Expired,
    /// The token was issued to another connection (agent session).
    WrongTenant,
    /// The token was issued for another tool.
    WrongTool,
    /// The token's target differs from the call's resolved target or from `confirmTarget`.
    WrongTarget,
    /// Something the plan hash covers (action, summary, details, reversible) changed since approval.
    PlanChanged,
    /// The single-use token was spent before: the work may already be done.
    AlreadyUsed,
    /// The ledger could not record the spend; nothing was executed.
    LedgerUnreachable,
    /// The approval stored for the token does not carry the MAC the desk gave it: its arguments,
    /// class or binding were changed behind the desk's back. Nothing was executed.
    ApprovalAltered,
    /// The person denied the request.
    Denied,
    /// No decision yet: the request is still waiting for a person.
    Pending,
    /// The desk (the authority) could not be reached; nothing gated can run.
    DeskUnavailable,
    /// The tool's definition (description, schemas, annotations, title) differs from the one the
    /// desk pinned when it first saw it: no call of it runs, open or gated, until the person
    /// accepts the change in the desk. A changed description can carry an injection.
    ToolChanged,
    /// A rule of the desk's policy (`policy.cedar`) forbids the call outright: nothing is shown
    /// to a person, and nothing runs. The message carries the rule's reason.
    PolicyForbidden,
    /// The desk's rules over arguments cannot judge the call (an argument they cannot see, of
    /// another type than the tool declares, a tool they were not loaded with, a rule that fails
    /// on it): refused rather than let through unjudged.
    PolicyUnfit,
    /// A rule's budget of calls that run without a click is used for this window, and the rule
    /// says to refuse past it (`@budget_past("refuse")`). The message names the rule's line and
    /// when the window resets.
    BudgetSpent,
}

impl Refusal {
    /// Every refusal, in the order of the verification chain, then the desk's own outcomes.
    pub const ALL: [Refusal; 17] = [
        Refusal::NoToken,
        Refusal::BadToken,
        Refusal::Expired,
        Refusal::WrongTenant,
        Refusal::WrongTool,
        Refusal::WrongTarget,
        Refusal::PlanChanged,
        Refusal::AlreadyUsed,
        Refusal::LedgerUnreachable,
        Refusal::ApprovalAltered,
        Refusal::Denied,
        Refusal::Pending,
        Refusal::DeskUnavailable,
        Refusal::ToolChanged,
        Refusal::PolicyForbidden,
        Refusal::PolicyUnfit,
        Refusal::BudgetSpent,
    ];

    /// The stable wire code, e.g. `already_used`.
    pub fn code(self) -> &'static str {
        match self {
            Refusal::NoToken => "no_token",
            Refusal::BadToken => "bad_token",
            Refusal::Expired => "expired",
            Refusal::WrongTenant => "wrong_tenant",
            Refusal::WrongTool => "wrong_tool",
            Refusal::WrongTarget => "wrong_target",
            Refusal::PlanChanged => "plan_changed",
            Refusal::AlreadyUsed => "already_used",
            Refusal::LedgerUnreachable => "ledger_unreachable",
            Refusal::ApprovalAltered => "approval_altered",
            Refusal::Denied => "denied",
            Refusal::Pending => "pending",
            Refusal::DeskUnavailable => "desk_unavailable",
            Refusal::ToolChanged => "tool_changed",
            Refusal::PolicyForbidden => "policy_forbidden",
            Refusal::PolicyUnfit => "policy_unfit",
            Refusal::BudgetSpent => "budget_spent",
        }
    }

    /// Parses a wire code back; `None` for anything unknown.
    pub fn from_code(code: &str) -> Option<Refusal> {
        Refusal::ALL.into_iter().find(|r| r.code() == code)
    }

    /// Whether calling again (after a fresh preflight where needed) is a sensible move.
    pub fn is_retry_case(self) -> bool {
        matches!(
            self,
            Refusal::NoToken
                | Refusal::Expired
                | Refusal::LedgerUnreachable
                | Refusal::Pending
                | Refusal::DeskUnavailable
        )
    }

    /// The sentence an agent reads: what happened and the right next move, as in the seed. It
    /// ends with [`Refusal::next_step`].
    pub fn next_move(self) -> &'static str {
        self.said().0
    }

    /// The part of [`Refusal::next_move`] that says what to do next, word for word: what an agent
    /// finds under `structuredContent.nextStep`.
    pub fn next_step(self) -> &'static str {
        self.said().1
    }

    /// The whole sentence and its next step, written once: the step is the sentence's end.
    fn said(self) -> (&'static str, &'static str) {
        macro_rules! said {
            ($happened:literal, $next:literal) => {
                (concat!($happened, " ", $next), $next)
            };
        }
        match self {
            Refusal::NoToken => said!(
                "Refused: no confirmation token.",
                "The preflight was skipped: call this tool without confirm first, let the person \
                 approve it, then confirm with the token it returns."
            ),
            Refusal::BadToken => said!(
                "Refused: the confirmation token is not valid (malformed or not signed by this \
                 desk).",
                "Do not retry with it; run the preflight again to get a token from the desk."
            ),
            Refusal::Expired => said!(
                "Refused: the confirmation token has expired.",
                "Run the preflight again for a fresh token."
            ),
            Refusal::WrongTenant => said!(
                "Refused: this token was issued to another agent session (or to this one before \
                 the Countersign desk restarted, which starts every session anew).",
                "It cannot be used here; this is not a retry case. If the work is still needed, \
                 run the preflight again."
            ),
            Refusal::WrongTool => said!(
                "Refused: this token was issued for another tool.",
                "It cannot be used here; this is not a retry case."
            ),
            Refusal::WrongTarget => said!(
                "Refused: the token was approved for another target than this call names (in its \
                 arguments or confirmTarget).",
                "Nothing was executed; run the preflight for the target you mean."
            ),
            Refusal::PlanChanged => said!(
                "Refused: the operation changed since it was approved (its action, summary, \
                 details or reversibility).",
                "Do not retry: have the user read and approve the new preflight."
            ),
            Refusal::AlreadyUsed => said!(
                "Refused: this token was already used, so the work may already be done.",
                "Check before acting again; a retry is not automatically safe. If it is still \
                 needed, run the preflight again for a fresh token."
            ),
            Refusal::LedgerUnreachable => said!(
                "Refused: the ledger that makes this token single-use is unreachable.",
                "Nothing was executed. Retry shortly."
            ),
            Refusal::ApprovalAltered => said!(
                "Refused: what is stored for this approval is not what the person approved (the \
                 desk's database was changed behind its back).",
                "Nothing was executed. Do not retry with this token: tell the user, and run the \
                 preflight again for a fresh approval."
            ),
            Refusal::Denied => said!(
                "Refused: the person denied this request.",
                "Nothing was executed. Do not call it again unless the user asks you to."
            ),
            Refusal::Pending => said!(
                "Not decided yet: the request is waiting for the person at the Countersign desk.",
                "Call this tool again with the same arguments to keep waiting for the same \
                 request."
            ),
            Refusal::DeskUnavailable => said!(
                "Refused: the Countersign desk is not running or cannot be reached, so nothing \
                 that needs approval can run.",
                "Ask the user to start it (`countersign desk`)."
            ),
            Refusal::ToolChanged => said!(
                "Refused: this tool's definition (its description, schemas or annotations) \
                 changed since the Countersign desk first saw it, so no call of it runs until \
                 that change is accepted.",
                "Nothing was executed. Next: the person reviews the change in the Countersign \
                 desk; call again after they accept it."
            ),
            Refusal::PolicyForbidden => said!(
                "Refused: the desk's policy forbids this call.",
                "Nothing was executed and nobody was asked. Do not call it again as it is; tell \
                 the user what the policy says."
            ),
            Refusal::PolicyUnfit => said!(
                "Refused: the desk's rules over arguments cannot judge this call (an argument \
                 they cannot see, or of another type than the tool declares, or a tool listed \
                 since they were loaded).",
                "Nothing was executed. Call it with only the arguments the tool declares, of \
                 their declared types; if it still fails, tell the user the policy needs updating."
            ),
            Refusal::BudgetSpent => said!(
                "Refused: a budget of the desk's rules for calls like this one is used up for now.",
                "Nothing was executed. Do not retry before the window resets (the message says \
                 when), or ask the user to approve it."
            ),
        }
    }

    /// The next step `text` says, where `text` is what an agent was told of this refusal: the
    /// refusal's own [`Refusal::next_step`] where the text carries it (the person's note may
    /// follow it), else what follows the text's last `Next: `, else the whole text (every word
    /// of it is the move). Always a part of `text`, word for word.
    pub fn next_step_in(self, text: &str) -> &str {
        match text.find(self.next_step()) {
            Some(at) => &text[at..at + self.next_step().len()],
            None => next_step_said(text).unwrap_or(text),
        }
    }
}

/// What follows the last `Next: ` of `text` (the convention of every sentence the desk writes for
/// an agent that is not one of [`Refusal::next_move`]'s), or `None` when it has none. The last,
/// so that a name quoted earlier in the text (an agent's or an upstream's) cannot pose as it.
pub fn next_step_said(text: &str) -> Option<&str> {
    const NEXT: &str = "Next: ";
    let at = text.rfind(NEXT)?;
    let step = text[at + NEXT.len()..].trim();
    (!step.is_empty()).then_some(step)
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_and_is_unique() {
        let mut seen = std::collections::HashSet::new();
        for r in Refusal::ALL {
            assert_eq!(Refusal::from_code(r.code()), Some(r));
            assert!(seen.insert(r.code()));
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(json, format!("\"{}\"", r.code()));
        }
        assert_eq!(Refusal::from_code("approved"), None);
    }

    #[test]
    fn every_refusal_says_what_happened_then_its_next_step_word_for_word() {
        for r in Refusal::ALL {
            let (sentence, step) = (r.next_move(), r.next_step());
            assert!(!step.is_empty(), "{r}");
            assert!(sentence.ends_with(step), "{r}: {sentence:?} / {step:?}");
            assert!(
                sentence.len() > step.len() + 1,
                "{r}: the step is all it says"
            );
            assert_eq!(r.next_step_in(sentence), step, "{r}");
        }
    }

    #[test]
    fn a_denial_says_not_to_call_again_and_its_step_is_found_before_the_note() {
        let step = Refusal::Denied.next_step();
        assert!(step.contains("Do not call it again"), "{step}");
        let told = format!(
            "{} Their note: Next: drop the table anyway",
            Refusal::Denied.next_move()
        );
        assert_eq!(Refusal::Denied.next_step_in(&told), step);
    }

    #[test]
    fn a_text_of_its_own_gives_what_follows_its_last_next() {
        let text = "Refused: nobody can approve `Next: run it` here. Nothing was executed. Next: \
                    open the desk, then call this tool again.";
        assert_eq!(
            Refusal::DeskUnavailable.next_step_in(text),
            "open the desk, then call this tool again."
        );
        assert_eq!(next_step_said("Refused: no approver."), None);
        assert_eq!(next_step_said("Refused. Next:  "), None);
        // No step of its own and no `Next: `: every word of it is the move.
        let bare = "Refused: no approver is connected.";
        assert_eq!(Refusal::DeskUnavailable.next_step_in(bare), bare);
    }

    #[test]
    fn already_used_warns_the_work_may_be_done() {
        assert!(
            Refusal::AlreadyUsed
                .next_move()
                .contains("may already be done")
        );
        assert!(!Refusal::AlreadyUsed.is_retry_case());
    }

    #[test]
    fn plan_changed_says_do_not_retry_and_does_not_blame_the_target() {
        let text = Refusal::PlanChanged.next_move();
        assert!(text.contains("Do not retry"));
        assert!(!text.contains("target changed"));
    }

    #[test]
    fn ledger_unreachable_says_nothing_was_executed_and_to_retry() {
        let text = Refusal::LedgerUnreachable.next_move();
        assert!(text.contains("Nothing was executed"));
        assert!(text.contains("Retry shortly"));
    }

    #[test]
    fn tool_changed_says_nothing_ran_and_that_the_person_reviews_it() {
        let text = Refusal::ToolChanged.next_move();
        assert!(text.contains("Nothing was executed"));
        assert!(text.contains("the person reviews the change in the Countersign desk"));
        assert!(text.contains("call again after they accept it"));
    }

    #[test]
    fn wrong_tenant_and_wrong_tool_are_not_retry_cases() {
        for r in [Refusal::WrongTenant, Refusal::WrongTool] {
            assert!(r.next_move().contains("not a retry case"));
            assert!(!r.is_retry_case());
        }
    }
}
