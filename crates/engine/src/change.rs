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

use countersign_core::telemetry::{ConfirmEvent, EventKind};
use countersign_core::{Plan, PlanHash, canonical, render};
use countersign_store::ToolPin;
use serde::Serialize;
use serde_json::{Map, Value};
use tokio::sync::watch;

use crate::approve::ApproveError;
use crate::authority::{Engine, lock};
use crate::queue::{Asks, ChangeRequest, PendingRequest, QueueChange, Removal};
use crate::state::{Decision, Entry, Holds, State};

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
    /// What the change does, beside its text: for the rules over arguments, what it widens as a
    /// solver decided it (or that it is not known). `None` where nothing is said.
    pub analysis: Option<String>,
}

/// A change in the queue ([`Engine::queue_proposal`]), or refused a place in it.
#[must_use = "a proposal's decision is read by waiting for it"]
pub struct Proposal(Result<watch::Receiver<Option<Decision>>, ChangeDecision>);

impl Proposal {
    /// The person's decision, once made; at once, the desk's refusal to queue it.
    pub async fn decided(self) -> ChangeDecision {
        let mut decision = match self.0 {
            Ok(decision) => decision,
            Err(refused) => return refused,
        };
        let decided = decision
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|d| d.clone());
        match decided {
            Some(Decision::Changed) => ChangeDecision::Approved,
            Some(Decision::Denied { note }) => ChangeDecision::Denied { note },
            // The entry left the queue undecided.
            _ => ChangeDecision::Withdrawn,
        }
    }
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

/// The SHA-256 of `text`, in hex: how a change's plan names its old and new text.
pub fn text_hash(text: &str) -> String {
    PlanHash::of_bytes(text.as_bytes()).to_hex()
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
            analysis: self.analysis.map(|t| cut(t, MAX_CHANGE_TEXT_CHARS)),
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

/// Why a desk without a window denies every proposed change.
const NO_WINDOW_FOR_CHANGES: &str = "the Countersign desk is running without a window (no \
display), so nobody can review this change. Nothing was changed. Open the desk in a desktop \
session (`countersign desk`) and propose it again.";

impl Engine {
    /// Queues `change` for the person and waits for their decision. The same change (kind,
    /// subject, old and new text) proposed again while one waits re-attaches to it, so both callers
    /// get the one decision. Approving it mints nothing: it needs no signing key and no typed
    /// target, only the approve delay. The caller applies an approved change itself.
    ///
    /// Denied at once, with a note saying why, when the desk has no window (nobody could decide
    /// it) or [`MAX_PENDING_CHANGES`] changes already wait. A change whose caller stops waiting
    /// stays queued until it is decided or [withdrawn](Self::withdraw_change).
    pub async fn propose(&self, change: Change) -> ChangeDecision {
        self.queue_proposal(change).decided().await
    }

    /// [`Self::propose`]'s first half, done before it returns: `change` is in the queue (or
    /// refused) when this returns, and the [`Proposal`] waits for its decision. For a proposer
    /// that must queue a change and withdraw its stale ones under one lock of its own, so that
    /// a change analysed at length is never queued after it went stale
    /// (`countersign-serve`'s rules).
    pub fn queue_proposal(&self, change: Change) -> Proposal {
        let queued = {
            let mut state = lock(&self.inner.state);
            self.queue_change(&mut state, change, None)
        };
        Proposal(queued.map(|(decision, added)| {
            if let Some(view) = added {
                self.publish(QueueChange::Added {
                    request: Box::new(view),
                });
            }
            decision
        }))
    }

    /// Records a change to the desk that took effect without a click, because none was needed:
    /// a new server name (it reaches no existing secret), or the person's own edit in the
    /// settings view. History shows it as `changed`, like an approved change, with `note` saying
    /// why no click was asked. Never pass a secret.
    pub async fn record_change(&self, kind: ChangeKind, subject: &str, note: Option<String>) {
        self.record(ConfirmEvent {
            at_ms: self.now(),
            kind: EventKind::Changed,
            tool: format!("change:{}", kind.code()),
            target: Some(subject.to_owned()),
            tenant: String::new(),
            nonce: None,
            plan: None,
            note,
        })
        .await;
    }

    /// Withdraws the waiting changes of `kind` to `subject` (e.g. the registry file changed
    /// again, so what was proposed is no longer what would apply): whoever waits on one gets
    /// [`ChangeDecision::Withdrawn`].
    pub fn withdraw_change(&self, kind: ChangeKind, subject: &str) {
        let subject = cut(subject.to_owned(), MAX_CHANGE_LABEL_CHARS);
        self.withdraw_changes(|_, change| change.kind == kind && change.subject == subject);
    }

    /// Withdraws waiting change `id` alone (a team's server: the row it was shared under was
    /// carried out on another replica), as [`Self::withdraw_change`] does; no other change of
    /// its subject is touched. `NotPending`: no change `id` waits (decided, withdrawn, being
    /// approved, or a call).
    pub fn withdraw_change_request(&self, id: u64) -> Result<(), ApproveError> {
        match self.withdraw_changes(|request, _| request == id).as_slice() {
            [] => Err(ApproveError::NotPending),
            _ => Ok(()),
        }
    }

    /// Withdraws the waiting changes (not one being approved) that `which` picks, by id and
    /// change; answers their ids.
    fn withdraw_changes(&self, which: impl Fn(u64, &Change) -> bool) -> Vec<u64> {
        let mut state = lock(&self.inner.state);
        let ids: Vec<u64> = state
            .requests
            .iter()
            .filter(|(_, e)| e.is_waiting() && !e.approving)
            .filter(|(id, e)| e.view.change().is_some_and(|c| which(**id, c)))
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            state.requests.remove(id);
        }
        drop(state);
        for id in &ids {
            self.publish(QueueChange::Removed {
                id: *id,
                reason: Removal::Withdrawn,
            });
        }
        ids
    }

    /// Queues `change` (or finds the same one waiting). `repin`: for a tool, the pin approving
    /// it puts in force. The receiver sees the decision; the view is `Some` when the change is
    /// new, for the caller to publish once the lock is released.
    #[allow(clippy::type_complexity)]
    pub(crate) fn queue_change(
        &self,
        state: &mut State,
        change: Change,
        repin: Option<ToolPin>,
    ) -> Result<(watch::Receiver<Option<Decision>>, Option<PendingRequest>), ChangeDecision> {
        let change = change.bounded();
        if !self.inner.config.window {
            return Err(ChangeDecision::Denied {
                note: Some(NO_WINDOW_FOR_CHANGES.to_owned()),
            });
        }
        let same = state.requests.values().find(|e| {
            e.is_waiting()
                && e.view.change().is_some_and(|c| {
                    c.kind == change.kind
                        && c.subject == change.subject
                        && c.before == change.before
                        && c.after == change.after
                })
        });
        if let Some(entry) = same {
            return Ok((entry.decision.subscribe(), None));
        }
        let (waiting, tools) = state
            .requests
            .values()
            .filter(|e| e.is_waiting())
            .filter_map(|e| e.view.change())
            .fold((0, 0), |(all, tools), c| {
                (all + 1, tools + usize::from(c.kind == ChangeKind::Tool))
            });
        if change.kind == ChangeKind::Tool && tools >= MAX_PENDING_TOOL_CHANGES {
            tracing::warn!(target: "desk", subject = %change.subject, "tool change not queued: {tools} tool changes already wait");
            return Err(ChangeDecision::Denied {
                note: Some(format!(
                    "{tools} tool changes already wait for the person at the Countersign desk, \
                     the most it queues (the rest is kept for changes to servers and policy). \
                     The tool stays held back; it is proposed again at its next listing."
                )),
            });
        }
        if waiting >= MAX_PENDING_CHANGES {
            tracing::warn!(target: "desk", kind = change.kind.code(), subject = %change.subject, "change not queued: {waiting} changes already wait");
            return Err(ChangeDecision::Denied {
                note: Some(format!(
                    "{waiting} changes already wait for the person at the Countersign desk, the \
                     most it queues. Nothing was changed. Propose this again once they have \
                     decided some."
                )),
            });
        }
        let id = state.next_id;
        state.next_id += 1;
        let action = match (&change.before, &change.after) {
            (None, _) => "add",
            (_, None) => "remove",
            _ => "change",
        };
        // What names the change where a plan is expected (history, notifications, and a team
        // server's signed decisions): nothing is ever minted for it. It names both texts by
        // hash, so a decision signed over its hash is over exactly these texts.
        let plan = Plan {
            tool: format!("change:{}", change.kind.code()),
            target: change.subject.clone(),
            action: action.to_owned(),
            summary: change.summary.clone(),
            details: serde_json::json!({
                "origin": change.origin,
                "before_sha256": change.before.as_deref().map(text_hash),
                "after_sha256": change.after.as_deref().map(text_hash),
            }),
            reversible: true,
        };
        let view = PendingRequest {
            id,
            text: render::plan_text(&plan),
            plan,
            arrived_at_ms: self.now(),
            preview: None,
            asks: Asks::Change(ChangeRequest {
                change,
                server: repin.as_ref().map(|p| p.server.clone()),
            }),
        };
        let (sender, receiver) = watch::channel(None);
        state.requests.insert(
            id,
            Entry {
                view: view.clone(),
                holds: Holds::Change { repin },
                decision: sender,
                approving: false,
            },
        );
        Ok((receiver, Some(view)))
    }

    /// A person approved change request `id`: for a tool, its new definition is pinned (and
    /// calls of it pass from now on, on every connection that lists it); whoever proposed it is
    /// told. Nothing is minted.
    pub(crate) async fn approve_change(&self, id: u64) -> Result<(), ApproveError> {
        let now = self.now();
        let (view, repin) = {
            let mut state = lock(&self.inner.state);
            let entry = state
                .requests
                .get_mut(&id)
                .filter(|e| e.is_waiting() && !e.approving && e.is_change())
                .ok_or(ApproveError::NotPending)?;
            let wait_ms = self.approve_wait_ms(entry.view.arrived_at_ms, now);
            if wait_ms > 0 {
                return Err(ApproveError::TooSoon { wait_ms });
            }
            entry.approving = true;
            (entry.view.clone(), entry.repin().cloned())
        };
        if let Some(pin) = &repin {
            let pin = ToolPin {
                pinned_at_ms: now,
                ..pin.clone()
            };
            if let Err(e) = self.records().repin(&pin).await {
                if let Some(entry) = lock(&self.inner.state).requests.get_mut(&id) {
                    entry.approving = false;
                }
                return Err(ApproveError::Store(e.to_string()));
            }
        }
        {
            let mut state = lock(&self.inner.state);
            let entry = state.requests.remove(&id).ok_or(ApproveError::NotPending)?;
            entry.decision.send_replace(Some(Decision::Changed));
            if let Some(pin) = &repin {
                // The pin changed for every connection of this server: what each lists is
                // compared with the new one (a connection still listing the old definition is
                // held back now).
                for conn in state.connections.values_mut() {
                    if conn.server == pin.server
                        && let Some(listed) = conn.tools.get_mut(&pin.tool)
                    {
                        listed.pinned = listed.hash == pin.hash;
                    }
                }
            }
        }
        self.record(ConfirmEvent {
            at_ms: now,
            kind: EventKind::Changed,
            tool: view.plan.tool.clone(),
            target: Some(view.plan.target.clone()),
            tenant: String::new(),
            nonce: None,
            plan: None,
            note: None,
        })
        .await;
        self.publish(QueueChange::Removed {
            id,
            reason: Removal::Approved,
        });
        Ok(())
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
            analysis: None,
        }
        .bounded();
        assert!(change.subject.ends_with("[cut: 1 more characters]"));
        assert!(change.after.unwrap().ends_with("[cut: 2 more characters]"));
    }
}
