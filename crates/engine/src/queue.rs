//! The approval queue: a preflight waits here for a person's decision.
//!
//! A preflight becomes a pending request keyed by (tenant, tool, plan hash): a second preflight
//! of the same plan on the same connection re-attaches to it instead of queueing a duplicate. A
//! decision is published through a `watch` channel to whoever waits; an approval whose caller
//! already gave up waiting stays collectable until its token expires. Changes to the queue go out
//! on a broadcast channel, so the window never polls. The queue is bounded per connection and in
//! all: a flood is refused with a next move, never dropped silently.
//!
//! An agent that stops waiting (it cancels, or its client's own tool timeout gives up on the call)
//! does not take its request off the queue: the request stays, marked, for
//! [`STOPPED_WAITING_GRACE_MS`], so that a person still reading it can approve it, and the same
//! call asked again re-attaches to it and collects that approval. Only after the grace does it
//! leave. A gateway that disconnects takes its requests with it: its tenant is gone, and no token
//! could be used by anyone after it.

use countersign_core::Tenant;
use std::sync::{Arc, Weak};
use std::time::Duration;

use countersign_core::telemetry::{ConfirmEvent, EventKind};
use countersign_core::{GateClass, Plan, PlanHash, Refusal, render};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{broadcast, watch};

use crate::answer::{Approved, ErrorCode, Stopped};
use crate::authority::{Engine, error, lock, refused};
use crate::change::Change;
use crate::planning::Call;
use crate::state::{Decision, Entry, Holds, Inner, State};
use crate::tally::{Outcome, Tallied};

/// What [`Engine::queue_preflight`] did with a call it did not refuse.
#[derive(Debug)]
pub enum Queued {
    /// The request waits for the person (new, or the same plan's request re-attached to).
    Waiting(Ticket),
    /// Approved at once by a live grant a person's click made: a token of its own.
    Granted(Approved),
    /// The rules over arguments (`policy.cedar`, accepted by the person) open this call: it runs
    /// without a click and without a token, as an open tool's call does, with exactly these
    /// arguments (the ones the rules judged; the caller sends nothing else).
    Open(serde_json::Map<String, Value>),
}

/// A request in the queue, as the preflight that queued it (or re-attached to it) holds it.
#[derive(Debug)]
pub struct Ticket {
    id: u64,
    plan_hash: PlanHash,
    new: bool,
    class: GateClass,
    decision: watch::Receiver<Option<Decision>>,
}

impl Ticket {
    /// The request's id in the queue.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The plan hash the request binds: what a preview of it is attached under.
    pub fn plan_hash(&self) -> PlanHash {
        self.plan_hash
    }

    /// Whether this preflight queued the request (rather than re-attaching to one that already
    /// waited): the one time a preview of it is worth making.
    pub fn is_new(&self) -> bool {
        self.new
    }
}

/// Why a desk without a window refuses every preflight, and what to do about it.
pub const HEADLESS: &str = "Refused: the Countersign desk is running without a window (no \
display), so nobody can approve this call. Nothing was executed. Next: open the Countersign desk \
in a desktop session (`countersign desk`), then call this tool again.";

/// The most requests one connection may have waiting for a person: more is a flood, not work.
pub const MAX_PENDING_PER_CONNECTION: usize = 16;

/// The most requests waiting for a person at once, from every connection together.
pub const MAX_PENDING: usize = 128;

/// How long a request whose agent stopped waiting for it (a cancel, or the client's own tool
/// timeout) stays in the queue for the same call to re-attach to, in ms: long enough for a
/// person to read, wait out the approve delay, type the target and click, and for the agent's
/// retry to come.
pub const STOPPED_WAITING_GRACE_MS: u64 = 2 * 60 * 1_000;

/// A request waiting for a person, as the window shows it: a tool call, or a change to the desk
/// itself. What both have is here; what only one has is in [`Asks`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingRequest {
    /// The queue's id for it.
    pub id: u64,
    /// For a call, the plan a token would bind. For a change, what names it where a plan is
    /// expected (history, notifications): tool `change:<kind>`, target its subject; nothing is
    /// ever minted for it.
    pub plan: Plan,
    /// When it arrived, ms since the epoch.
    pub arrived_at_ms: u64,
    /// The plan as plain text, exactly as hashed.
    pub text: String,
    /// What the call would do, as the desk found it while the request waits: shown, never
    /// hashed, minted or executed ([`Engine::attach_preview`]). Always `None` for a change.
    pub preview: Option<countersign_core::preview::Preview>,
    /// A call, or a change.
    pub asks: Asks,
}

/// What a waiting request asks for.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Asks {
    /// A gated tool call: approving it mints a token.
    Call(CallRequest),
    /// A change to the desk itself (a server, the policy, a tool's definition): approving it
    /// mints nothing.
    Change(ChangeRequest),
}

/// A gated tool call waiting for a person.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallRequest {
    /// The connection that asked.
    pub tenant: Tenant,
    /// The agent's `clientInfo`, as it sent it.
    pub client_info: Value,
    /// The server identity the desk gave the connection's upstream.
    pub server: String,
    /// The hash of the plan.
    pub plan_hash: PlanHash,
    /// `token` or `once`.
    pub class: GateClass,
    /// Whether approving needs the target typed.
    pub type_target: bool,
    /// How many distinct approvers must approve it (a team's server; 1 on the desk).
    pub approvers: u8,
    /// How long a token minted now would live.
    pub token_ttl_ms: u64,
    /// Why the tool has its class: the policy line that set it, or its annotations.
    pub why: String,
    /// When the last call of this same plan was handed to the upstream and its answer never
    /// came (its outcome is unknown: it may have run), if the history holds one: the person
    /// should know before approving it again.
    pub last_unknown_at_ms: Option<u64>,
    /// When the agent stopped waiting for this request (it cancelled the call, or its client's
    /// own timeout gave up on it), ms since the epoch; `None` while an agent waits, or since it
    /// asked again. A marked request stays [`STOPPED_WAITING_GRACE_MS`] from then: an approval
    /// given meanwhile is collected when the agent asks the same call again.
    #[serde(default)]
    pub stopped_waiting_at_ms: Option<u64>,
    /// Whether the rules over arguments (`policy.cedar`) gated this call, rather than its listing.
    #[serde(default)]
    pub ruled: bool,
    /// The longest a grant made from it may last, in minutes, where a rule says
    /// (`@grant_max_minutes`). A call the rules gate without saying is never widened.
    #[serde(default)]
    pub grant_max_minutes: Option<u64>,
}

/// A change to the desk waiting for a person.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChangeRequest {
    /// The change: what it is, as it is and as it would be.
    pub change: Change,
    /// For a tool's changed definition, the server identity whose tool it is.
    pub server: Option<String>,
}

impl PendingRequest {
    /// The call, if it is one.
    pub fn call(&self) -> Option<&CallRequest> {
        match &self.asks {
            Asks::Call(call) => Some(call),
            Asks::Change(_) => None,
        }
    }

    /// The change, if it is one.
    pub fn change(&self) -> Option<&Change> {
        match &self.asks {
            Asks::Change(c) => Some(&c.change),
            Asks::Call(_) => None,
        }
    }

    /// The server it concerns: a call's, or a tool change's (`None` for other changes).
    pub fn server(&self) -> Option<&str> {
        match &self.asks {
            Asks::Call(call) => Some(&call.server),
            Asks::Change(c) => c.server.as_deref(),
        }
    }

    /// Whether approving it needs the target typed (never for a change).
    pub fn type_target(&self) -> bool {
        self.call().is_some_and(|c| c.type_target)
    }
}

/// Why a request left the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Removal {
    /// A person approved it.
    Approved,
    /// A person denied it.
    Denied,
    /// The agent cancelled it.
    Withdrawn,
    /// Its gateway disconnected.
    Disconnected,
    /// On a team's server: approved, and taken by the agent's call on another replica.
    TakenElsewhere,
}

/// A change to the queue, for the window.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum QueueChange {
    /// A new request is waiting.
    Added {
        /// It.
        request: Box<PendingRequest>,
    },
    /// Someone asked for the window (a second start of the desk, or a
    /// `countersign://request/<id>` URL opened: then `request` is that id, which the window
    /// selects if it still waits). It never approves or denies.
    Focus {
        /// The request to show, if one was named.
        request: Option<u64>,
    },
    /// What a waiting request shows changed: a preview arrived (the approve delay starts
    /// again), or its agent stopped waiting for it or came back to it (what is approved is the
    /// same: the delay goes on as it was).
    Updated {
        /// It, as it is now.
        request: Box<PendingRequest>,
    },
    /// A request left the queue.
    Removed {
        /// Its id.
        id: u64,
        /// Why.
        reason: Removal,
    },
}

impl Engine {
    /// Changes to the queue from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<QueueChange> {
        self.inner.changes.subscribe()
    }

    /// Every request waiting for a person, oldest first (one whose agent stopped waiting, marked,
    /// until its grace ends).
    pub fn pending(&self) -> Vec<PendingRequest> {
        let now = self.now();
        let state = lock(&self.inner.state);
        state
            .requests
            .values()
            .filter(|e| e.decision.borrow().is_none() && !e.grace_over(now))
            .map(|e| e.view.clone())
            .collect()
    }

    /// Whether a preflight waits on request `id` right now (an agent is there to be answered).
    /// A team's server with several replicas mints an approval where its agent waits.
    pub fn awaited(&self, id: u64) -> bool {
        lock(&self.inner.state)
            .requests
            .get(&id)
            .is_some_and(|e| e.decision.receiver_count() > 0)
    }

    /// Asks the window to come forward.
    pub fn request_focus(&self) {
        self.publish(QueueChange::Focus { request: None });
    }

    /// Asks the window to come forward showing request `id` (a `countersign://request/<id>`
    /// URL). Only what is shown changes: whoever shows it holds approvals first, as for any
    /// focus, and nothing is approved or denied.
    pub fn request_focus_on(&self, id: u64) {
        self.publish(QueueChange::Focus { request: Some(id) });
    }

    /// Why a new request of `tenant` cannot be queued, if it cannot: a refusal with a next move,
    /// never a silent drop.
    pub(crate) fn queue_full(state: &State, tenant: &Tenant) -> Option<String> {
        // Changes to the desk are capped on their own (MAX_PENDING_CHANGES).
        let waiting = state
            .requests
            .values()
            .filter(|e| e.is_waiting() && !e.is_change());
        let (mine, all) = waiting.fold((0, 0), |(mine, all), e| {
            (
                mine + usize::from(e.tenant() == Some(tenant.as_str())),
                all + 1,
            )
        });
        if mine >= MAX_PENDING_PER_CONNECTION {
            Some(format!(
                "Refused: {mine} requests of this agent already wait for the person at the \
                 Countersign desk, the most it queues for one agent. Nothing was executed. Next: \
                 wait for the person to decide those (calling one again with the same arguments \
                 keeps waiting for it), or cancel the ones no longer needed, then call this again."
            ))
        } else if all >= MAX_PENDING {
            Some(format!(
                "Refused: {all} requests already wait for the person at the Countersign desk, the \
                 most it queues. Nothing was executed. Next: wait for the person to work through \
                 the queue, then call this again."
            ))
        } else {
            None
        }
    }

    /// Drops decided requests nobody collected whose token (or denial) has expired.
    pub(crate) fn sweep(state: &mut State, now: u64, ttl: u64) {
        state.requests.retain(|_, e| match &*e.decision.borrow() {
            None => true,
            Some(Decision::Approved(approved)) => approved.expires_at_ms > now,
            Some(Decision::Changed) => false,
            Some(Decision::Denied { .. } | Decision::TakenElsewhere) => {
                e.view.arrived_at_ms.saturating_add(ttl) > now
            }
        });
    }

    /// A preflight: queue the plan (or re-attach to the same plan's request) and wait up to
    /// `wait` for a person's decision: [`Engine::queue_preflight`], then [`Engine::decision`].
    pub async fn preflight(
        &self,
        tenant: &Tenant,
        tool: &str,
        arguments: &Value,
        wait: Duration,
    ) -> Result<Approved, Stopped> {
        match self.queue_preflight(tenant, tool, arguments).await? {
            Queued::Granted(approved) => Ok(approved),
            Queued::Waiting(ticket) => self.decision(ticket, wait).await,
            Queued::Open(_) => Err(error(
                ErrorCode::UnknownTool,
                format!("`{tool}` is open for this call by the desk's rules: it needs no approval"),
            )),
        }
    }

    /// The first half of a preflight: the call planned once, checked, and queued for the person
    /// (or re-attached to the same plan's request, or approved at once by a grant), or refused.
    /// A [`Ticket`] names the request: what a preview attaches to, and what
    /// [`Engine::decision`] waits on.
    pub async fn queue_preflight(
        &self,
        tenant: &Tenant,
        tool: &str,
        arguments: &Value,
    ) -> Result<Queued, Stopped> {
        let Call {
            rule,
            client_info,
            server,
            args,
            fields,
            plan,
            hash,
            open,
            opened_by,
            mut ruled,
            grant_max_minutes,
            budgets,
        } = match self.plan_aside(tenant, tool, arguments).await {
            Ok(call) => call,
            Err(stopped) => return Err(self.rejected(tenant, tool, stopped).await),
        };
        if fields.is_confirm() {
            let stopped = error(ErrorCode::BadArguments, "a confirm is not a preflight");
            return Err(self.rejected(tenant, tool, stopped).await);
        }
        let mut rule = rule;
        if open {
            match self
                .take_budgets(tenant, &server, tool, &budgets, None)
                .await
            {
                Ok(None) => {
                    // Nobody is asked, so no window is needed: the person's click was on the
                    // rules.
                    tracing::info!(target: "desk", tool = %tool, target = %plan.target, "opened by the rules over arguments: runs without a click");
                    self.tally_request(Some(GateClass::Open), Outcome::Forwarded);
                    // A call a person would have been asked about, run on the rules' word: on
                    // the record, with the rules' lines and the plan's hash.
                    if !opened_by.is_empty() {
                        let lines: Vec<String> = opened_by.iter().map(usize::to_string).collect();
                        self.record(ConfirmEvent {
                            at_ms: self.now(),
                            kind: EventKind::Opened,
                            tool: tool.to_owned(),
                            target: Some(plan.target.clone()),
                            tenant: tenant.to_string(),
                            nonce: None,
                            plan: Some(hash),
                            note: Some(format!(
                                "opened by policy.cedar line {}: ran without a click",
                                lines.join(", ")
                            )),
                        })
                        .await;
                    }
                    return Ok(Queued::Open(args));
                }
                Ok(Some(spent)) if spent.refuse => {
                    let stopped = crate::ruling::budget_spent(&spent, self.now());
                    return Err(self.rejected(tenant, tool, stopped).await);
                }
                Ok(Some(spent)) => {
                    // Past its budget, an opened call waits for a click, as the rule says.
                    if !rule.class.is_gated() {
                        rule.class = GateClass::Token;
                    }
                    rule.why = format!(
                        "policy.cedar line {}: this call would run without a click, but the rule's budget of {} {} per {} minutes is used; it needs a click",
                        spent.line, spent.limit, spent.counts, spent.minutes
                    );
                    ruled = true;
                }
                Err(stopped) => return Err(self.rejected(tenant, tool, stopped).await),
            }
        }
        if !self.inner.config.window {
            self.tally_request(Some(rule.class), Outcome::Refused);
            self.tally(Tallied::Refusal {
                code: Refusal::DeskUnavailable.code(),
            });
            return Err(Stopped::Refused {
                refusal: Refusal::DeskUnavailable,
                message: self.inner.config.nobody_to_ask.clone(),
            });
        }
        // A live grant a person's click made covers it: approved at once, a token of its own.
        // Grants that cannot be read refuse the call (an outage), never queue it as ungranted.
        // A call the rules over arguments gate is covered by a grant only where a rule says
        // how long one may last: a grant made before a rule asked more (two approvers, say)
        // must not answer for it.
        let limit = grant_max_minutes.map(|max_minutes| crate::grants::RuledGrant {
            max_minutes,
            class: rule.class,
            approvers: rule.approvers,
        });
        let granted = if ruled && grant_max_minutes.is_none() {
            None
        } else {
            let limit = if ruled { limit.as_ref() } else { None };
            match self
                .granted(tenant, &plan, hash, &args, &budgets, limit)
                .await
            {
                Ok(granted) => granted,
                Err(stopped) => return Err(self.rejected(tenant, tool, stopped).await),
            }
        };
        if let Some(approved) = granted {
            self.tally_request(Some(rule.class), Outcome::Approved);
            return Ok(Queued::Granted(approved));
        }
        let last_unknown = self.last_unknown(tool, &hash).await;
        // A request whose grace ended leaves first: asked again after it, the call is new.
        self.expire_stopped();
        let now = self.now();
        let ttl = self.token_ttl_ms();
        let queued = 'queued: {
            let mut state = lock(&self.inner.state);
            Self::sweep(&mut state, now, ttl);
            let existing = state
                .requests
                .iter_mut()
                .find(|(_, e)| e.is_call(tenant, tool, hash));
            match existing {
                Some((id, entry)) => {
                    let (id, decision) = (*id, entry.decision.subscribe());
                    // The agent is back: the mark goes, and the approve delay runs on as it was.
                    let back = entry.is_waiting() && entry.set_stopped_waiting(None);
                    let view = back.then(|| entry.view.clone());
                    drop(state);
                    if let Some(view) = view {
                        self.publish(QueueChange::Updated {
                            request: Box::new(view),
                        });
                    }
                    Ok((id, decision, false))
                }
                None => {
                    if let Some(full) = Self::queue_full(&state, tenant) {
                        break 'queued Err(full);
                    }
                    let id = state.next_id;
                    state.next_id += 1;
                    let view = PendingRequest {
                        id,
                        text: render::plan_text(&plan),
                        plan,
                        arrived_at_ms: now,
                        preview: None,
                        asks: Asks::Call(CallRequest {
                            tenant: tenant.to_owned(),
                            client_info,
                            server,
                            plan_hash: hash,
                            class: rule.class,
                            type_target: rule.type_target,
                            approvers: rule.approvers,
                            token_ttl_ms: ttl,
                            why: rule.why.clone(),
                            last_unknown_at_ms: last_unknown,
                            stopped_waiting_at_ms: None,
                            ruled,
                            grant_max_minutes,
                        }),
                    };
                    let (sender, receiver) = watch::channel(None);
                    state.requests.insert(
                        id,
                        Entry {
                            view: view.clone(),
                            holds: Holds::Call { arguments: args },
                            decision: sender,
                            approving: false,
                        },
                    );
                    drop(state);
                    self.publish(QueueChange::Added {
                        request: Box::new(view),
                    });
                    Ok((id, receiver, true))
                }
            }
        };
        match queued {
            Ok((id, decision, new)) => Ok(Queued::Waiting(Ticket {
                id,
                plan_hash: hash,
                new,
                class: rule.class,
                decision,
            })),
            Err(full) => Err(self
                .rejected(tenant, tool, error(ErrorCode::Busy, full))
                .await),
        }
    }

    /// The second half of a preflight: waits up to `wait` for the person's decision of the
    /// request `ticket` names, and collects it. Undecided by then: `pending`, and the request
    /// stays queued (calling again re-attaches to it).
    pub async fn decision(&self, ticket: Ticket, wait: Duration) -> Result<Approved, Stopped> {
        let Ticket {
            id,
            mut decision,
            class,
            ..
        } = ticket;
        let answer = self.collect(id, &mut decision, wait).await;
        let outcome = match &answer {
            Ok(_) => Outcome::Approved,
            Err(stopped) => match stopped.refusal() {
                Some(Refusal::Denied) => Outcome::Denied,
                Some(Refusal::Pending) => Outcome::Pending,
                Some(refusal) => {
                    self.tally(Tallied::Refusal {
                        code: refusal.code(),
                    });
                    Outcome::Refused
                }
                None => Outcome::Refused,
            },
        };
        self.tally_request(Some(class), outcome);
        answer
    }

    /// [`Self::decision`]'s wait and collection, uncounted.
    async fn collect(
        &self,
        id: u64,
        decision: &mut watch::Receiver<Option<Decision>>,
        wait: Duration,
    ) -> Result<Approved, Stopped> {
        let decided = tokio::time::timeout(wait, decision.wait_for(Option::is_some)).await;
        let decision = match decided {
            Ok(Ok(d)) => d.clone(),
            // Timed out: the request stays queued; calling again re-attaches to it.
            Err(_) => return Err(refused(Refusal::Pending)),
            // The request was withdrawn or its connection dropped while waiting.
            Ok(Err(_)) => return Err(refused(Refusal::Pending)),
        };
        // Collected: the decision has reached its agent, so the entry is done.
        lock(&self.inner.state).requests.remove(&id);
        match decision {
            Some(Decision::Approved(approved)) => Ok(approved),
            Some(Decision::Denied { note }) => Err(denied(note)),
            Some(Decision::TakenElsewhere) => Err(Stopped::Refused {
                refusal: Refusal::AlreadyUsed,
                message: TAKEN_ELSEWHERE.to_owned(),
            }),
            Some(Decision::Changed) | None => Err(refused(Refusal::Pending)),
        }
    }

    /// The agent cancelled a preflight: its request leaves the queue (if still undecided).
    pub fn withdraw(&self, tenant: &Tenant, tool: &str, arguments: &Value) -> Result<(), Stopped> {
        self.withdraw_planned(tenant, tool, self.plan_call(tenant, tool, arguments))
    }

    /// [`Self::withdraw`] of a call planned already. A call that cannot be described just now
    /// (its SQL met a lock or a time limit) withdraws nothing and says so: its request may wait.
    pub(crate) fn withdraw_planned(
        &self,
        tenant: &Tenant,
        tool: &str,
        planned: Result<Call, Stopped>,
    ) -> Result<(), Stopped> {
        // Nothing to withdraw from a call that could not have been queued.
        let Some(hash) = queued_hash(planned)? else {
            return Ok(());
        };
        let mut state = lock(&self.inner.state);
        let found = state
            .requests
            .iter()
            .find(|(_, e)| e.is_call(tenant, tool, hash) && e.decision.borrow().is_none())
            .map(|(id, _)| *id);
        if let Some(id) = found {
            state.requests.remove(&id);
            drop(state);
            self.publish(QueueChange::Removed {
                id,
                reason: Removal::Withdrawn,
            });
        }
        Ok(())
    }

    /// The agent stopped waiting for this preflight (it cancelled the call, or its client's own
    /// timeout gave up on it): its request stays in the queue, marked, for
    /// [`STOPPED_WAITING_GRACE_MS`], for the same call asked again to re-attach to (and collect an
    /// approval given meanwhile); then it leaves. A request another preflight of the same call
    /// still waits on is left as it is.
    pub fn stop_waiting(
        &self,
        tenant: &Tenant,
        tool: &str,
        arguments: &Value,
    ) -> Result<(), Stopped> {
        self.stop_waiting_planned(tenant, tool, self.plan_call(tenant, tool, arguments))
    }

    /// [`Self::stop_waiting`] of a call planned already. A call that cannot be described just
    /// now marks nothing and says so (its request waits as it was).
    pub(crate) fn stop_waiting_planned(
        &self,
        tenant: &Tenant,
        tool: &str,
        planned: Result<Call, Stopped>,
    ) -> Result<(), Stopped> {
        let Some(hash) = queued_hash(planned)? else {
            return Ok(());
        };
        let now = self.now();
        let mut state = lock(&self.inner.state);
        let marked = state
            .requests
            .values_mut()
            .find(|e| e.is_call(tenant, tool, hash) && e.is_waiting())
            // The one stopping still holds its receiver: anyone beyond it still waits.
            .filter(|e| e.decision.receiver_count() <= 1)
            .and_then(|e| e.set_stopped_waiting(Some(now)).then(|| e.view.clone()));
        drop(state);
        if let Some(view) = marked {
            self.publish(QueueChange::Updated {
                request: Box::new(view),
            });
            self.expire_stopped_later(STOPPED_WAITING_GRACE_MS);
        }
        Ok(())
    }

    /// Takes off the queue every undecided request whose agent stopped waiting for it
    /// [`STOPPED_WAITING_GRACE_MS`] ago or more, as withdrawn: how many. The engine does this
    /// itself when a grace ends (and before queueing a preflight); a host may call it too.
    pub fn expire_stopped(&self) -> usize {
        let now = self.now();
        let mut state = lock(&self.inner.state);
        let over: Vec<u64> = state
            .requests
            .iter()
            .filter(|(_, e)| e.is_waiting() && e.grace_over(now))
            .map(|(id, _)| *id)
            .collect();
        for id in &over {
            state.requests.remove(id);
            state.rearmed.remove(id);
        }
        drop(state);
        for id in &over {
            self.publish(QueueChange::Removed {
                id: *id,
                reason: Removal::Withdrawn,
            });
        }
        over.len()
    }

    /// Runs [`Self::expire_stopped`] once `after_ms` have passed (by the runtime's timer; what
    /// is over is still decided by the engine's clock), if there is a runtime to run it on. The
    /// task holds no engine alive.
    fn expire_stopped_later(&self, after_ms: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner: Weak<Inner> = Arc::downgrade(&self.inner);
        // From now, not from whenever the task first runs.
        let at = tokio::time::Instant::now() + Duration::from_millis(after_ms);
        runtime.spawn(async move {
            tokio::time::sleep_until(at).await;
            if let Some(inner) = inner.upgrade() {
                Engine { inner }.expire_stopped();
            }
        });
    }

    /// For the 2026-07-28 flow: the plan hash of this call of `tenant`'s, and the id of its
    /// request in the queue (waiting, or decided and not yet collected), if one is there. `None`
    /// when the call cannot be planned (the preflight says why).
    pub fn queued(
        &self,
        tenant: &Tenant,
        tool: &str,
        arguments: &Value,
    ) -> Option<(PlanHash, Option<u64>)> {
        self.queued_planned(tenant, tool, self.plan_call(tenant, tool, arguments))
    }

    /// [`Self::queued`] of a call planned already.
    pub(crate) fn queued_planned(
        &self,
        tenant: &Tenant,
        tool: &str,
        planned: Result<Call, Stopped>,
    ) -> Option<(PlanHash, Option<u64>)> {
        let Call { hash, .. } = planned.ok()?;
        let state = lock(&self.inner.state);
        let id = state
            .requests
            .iter()
            .find(|(_, e)| e.is_call(tenant, tool, hash))
            .map(|(id, _)| *id);
        Some((hash, id))
    }
}

/// What an agent hears of a call approved on a team's server and taken by its call on another
/// replica ([`Engine::taken_elsewhere`]).
pub const TAKEN_ELSEWHERE: &str = "Refused: this call was approved, and its token given where the \
agent's call waited for it, on another replica of this server, which ran it there. Nothing was \
executed here. If that was not you, call again: a new approval is needed.";

/// What the agent is told of a deny: the refusal, and the person's note.
pub(crate) fn denied(note: Option<String>) -> Stopped {
    let message = match note {
        Some(note) => format!("{} Their note: {note}", Refusal::Denied.next_move()),
        None => Refusal::Denied.next_move().to_owned(),
    };
    Stopped::Refused {
        refusal: Refusal::Denied,
        message,
    }
}

/// The plan hash a request of `planned` would be queued under: `None` for a call that could not
/// have been queued, and the refusal itself for one that cannot be described just now (its SQL
/// met a lock or a time limit), which may still be waiting.
fn queued_hash(planned: Result<Call, Stopped>) -> Result<Option<PlanHash>, Stopped> {
    match planned {
        Ok(Call { hash, .. }) => Ok(Some(hash)),
        Err(busy) if busy.failure() == Some(ErrorCode::Busy) => Err(busy),
        Err(_) => Ok(None),
    }
}
