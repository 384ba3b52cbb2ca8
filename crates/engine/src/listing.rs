//! Connections and the tools their upstreams list: tenants, classes, pins.
//!
//! Each connection gets a random tenant of the desk's own. Its upstream's tool listing is classed
//! under the policy, and each definition compared with the one pinned for the server identity:
//! the first listing is pinned as it is; a tool whose definition differs, or one new to a server
//! already pinned, keeps being listed but no call of it runs (open or gated) until the person
//! accepts the change, which re-pins it.

use countersign_core::Tenant;
use std::collections::HashMap;

use countersign_core::policy;
use countersign_core::telemetry::{EventKind, Rejection};
use countersign_core::{Refusal, ServerId};
use countersign_store::ToolPin;
use serde_json::Value;

use crate::answer::{ErrorCode, Stopped, ToolDecision};
use crate::authority::{Engine, error, lock, outage, refused};
use crate::change::{self, Change, ChangeKind};
use crate::queue::{QueueChange, Removal};
use crate::state::{Connection, Listed, State};
use crate::tally::Outcome;

/// Why a gated tool is not offered by an engine set up read-only.
pub const READ_ONLY: &str = "this server is read-only: only tools that change nothing are offered";

/// The most callers attached at once ([`Engine::attach`]): each keeps the tools its upstream
/// listed, so an endless stream of new callers must not grow the engine without bound.
pub const MAX_ATTACHED: usize = 4096;

/// What [`Engine::attach`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attached {
    /// The caller's connection was made now (first sight, or made again after the engine
    /// forgot an idle caller): no tool of it is registered yet.
    Anew,
    /// The caller's connection was there, with the tools last registered for it.
    Again,
}

/// How many disconnected connections' server names are kept for history to show.
pub(crate) const MAX_GONE_SERVERS: usize = 4096;

impl Engine {
    /// The server name of a connection (its [`ServerId::key`]), also after it disconnected (for
    /// history).
    pub fn server_of(&self, tenant: &Tenant) -> Option<String> {
        lock(&self.inner.state).servers.get(tenant).cloned()
    }

    /// The upstream of connection `tenant` while it is connected.
    pub fn server_id_of(&self, tenant: &Tenant) -> Option<ServerId> {
        lock(&self.inner.state)
            .connections
            .get(tenant)
            .map(|c| c.id.clone())
    }

    /// The session refused a call of `tool` before it reached the engine (the upstream does not
    /// list it): on the record like every other refusal.
    pub async fn record_unlisted(&self, tenant: &Tenant, tool: &str) {
        let kind = EventKind::Rejected {
            reason: Rejection::UnlistedTool,
        };
        self.record(self.unplanned(kind, tenant, tool, None)).await;
    }

    /// A caller the host authenticated, on the upstream `id`: the connection under `tenant`, made
    /// on first sight and found again after (a team's server answers each HTTP request on its
    /// own, so the same caller comes back many times). The tenant names the caller and the
    /// server together: an approval binds its tenant, and must never verify on another server.
    /// A tenant already attached to another server keeps its first one.
    ///
    /// [`Attached::Anew`] says the connection was made now: it knows no tools until they are
    /// registered, so whatever a caller kept of an earlier listing no longer holds.
    pub fn attach(&self, tenant: &Tenant, id: ServerId) -> Result<Attached, Stopped> {
        let server = id.key();
        let now = self.now();
        let mut state = lock(&self.inner.state);
        if let Some(conn) = state.connections.get_mut(tenant) {
            return if conn.server == server {
                conn.attached_at_ms = Some(now);
                Ok(Attached::Again)
            } else {
                Err(error(
                    ErrorCode::Internal,
                    "this tenant is attached to another server",
                ))
            };
        }
        if state.connections.len() >= MAX_ATTACHED && !Self::forget_an_idle_caller(&mut state) {
            return Err(error(
                ErrorCode::Busy,
                format!(
                    "Refused: {MAX_ATTACHED} callers are attached to this server, the most it \
                     keeps. Nothing was executed. Next: call again later."
                ),
            ));
        }
        state.servers.insert(tenant.to_owned(), server.clone());
        state
            .connections
            .insert(tenant.to_owned(), Connection::new(id, Some(now)));
        Ok(Attached::Anew)
    }

    /// Forgets the attached caller seen longest ago that has nothing in the queue and no call
    /// awaiting its outcome (it is attached again, its tools listed again, when it comes back).
    /// `false`: every attached caller has something under way.
    fn forget_an_idle_caller(state: &mut State) -> bool {
        let busy = |tenant: &Tenant| {
            state
                .requests
                .values()
                .any(|e| e.tenant() == Some(tenant.as_str()))
                || state.awaiting_outcome.keys().any(|(t, _)| t == tenant)
        };
        let idlest = state
            .connections
            .iter()
            .filter_map(|(tenant, c)| c.attached_at_ms.map(|at| (at, tenant)))
            .filter(|(_, tenant)| !busy(tenant))
            .min()
            .map(|(_, tenant)| tenant.clone());
        let Some(tenant) = idlest else {
            return false;
        };
        state.connections.remove(&tenant);
        state.spent_states.remove(&tenant);
        true
    }

    /// A connection was accepted: assign its tenant. `id` is the upstream as the desk
    /// established it (a registered server, its built-in tools on a file, a URL, or an ad-hoc
    /// command line): policy is keyed by it and the person sees it. The tenant is the desk's
    /// own, random.
    pub fn connect(&self, id: ServerId) -> Tenant {
        let tenant = Tenant::connection(rand::random::<u64>());
        let server = id.key();
        let mut state = lock(&self.inner.state);
        state.servers.insert(tenant.clone(), server.clone());
        state
            .connections
            .insert(tenant.clone(), Connection::new(id, None));
        tenant
    }

    /// The agent of `tenant` said who it is (its MCP `clientInfo`): shown to the person as the
    /// agent's own claim, never used to decide anything.
    pub fn set_client_info(&self, tenant: &Tenant, client_info: Value) {
        if let Some(conn) = lock(&self.inner.state).connections.get_mut(tenant) {
            conn.client_info = client_info;
        }
    }

    /// A gateway went away: its pending requests leave the queue, and its session grants end.
    pub async fn disconnect(&self, tenant: &Tenant) {
        self.end_session_grants(tenant).await;
        let mut state = lock(&self.inner.state);
        if state.connections.remove(tenant).is_some() {
            state.gone.push_back(tenant.to_owned());
        }
        while state.gone.len() > MAX_GONE_SERVERS {
            if let Some(oldest) = state.gone.pop_front() {
                state.servers.remove(&oldest);
            }
        }
        state.awaiting_outcome.retain(|(t, _), _| t != tenant);
        state.spent_states.remove(tenant);
        let gone: Vec<u64> = state
            .requests
            .iter()
            .filter(|(_, e)| e.tenant() == Some(tenant.as_str()))
            .map(|(id, _)| *id)
            .collect();
        let mut withdrawn = Vec::new();
        for id in gone {
            if let Some(entry) = state.requests.remove(&id)
                && entry.decision.borrow().is_none()
            {
                withdrawn.push(id);
            }
        }
        drop(state);
        for id in withdrawn {
            self.publish(QueueChange::Removed {
                id,
                reason: Removal::Disconnected,
            });
        }
    }

    /// The upstream's tools for `tenant`: each one's class and whether it is withheld.
    ///
    /// Each tool's definition is compared with the one pinned for the connection's server: the
    /// server's first listing is pinned as it is; a tool whose definition differs, or a tool new
    /// to a server already pinned, keeps being listed, but its calls are refused `tool_changed`
    /// and the change is queued for the person (once: the same definition proposed again
    /// re-attaches). A tool no longer listed just goes; its pin stays.
    ///
    /// Pins that cannot be read (the records unreachable) are an outage, never "nothing pinned":
    /// the listing is refused `ledger_unreachable`, and so is every call of the connection until
    /// a later listing is compared with its pins.
    pub async fn register_tools(
        &self,
        tenant: &Tenant,
        tools: Vec<Value>,
    ) -> Result<Vec<ToolDecision>, Stopped> {
        let policy = self.policy();
        let Some(server) = lock(&self.inner.state)
            .connections
            .get(tenant)
            .map(|c| c.server.clone())
        else {
            return Err(error(ErrorCode::NotIntroduced, "unknown connection"));
        };
        let generation = self.rules_for_listing(&server, &tools);
        // A name listed twice could be read one way and called the other: offer neither.
        let mut seen = HashMap::<&str, usize>::new();
        for tool in &tools {
            if let Some(name) = tool.get("name").and_then(Value::as_str) {
                *seen.entry(name).or_default() += 1;
            }
        }
        let now = self.now();
        // The definitions as listed, and the pins in force for them, read (and taken at first
        // sight) before the queue's lock: the file must not hold up the queue.
        let listed: Vec<(&Value, ToolPin)> = tools
            .iter()
            .filter(|t| {
                t.get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| seen.get(n) == Some(&1))
            })
            .map(|tool| {
                let definition = change::definition(tool);
                let pin = ToolPin {
                    server: server.clone(),
                    tool: tool["name"].as_str().unwrap_or_default().to_owned(),
                    hash: change::definition_hash(&definition),
                    definition: change::definition_text(&definition),
                    pinned_at_ms: now,
                };
                (tool, pin)
            })
            .collect();
        let candidates: Vec<ToolPin> = listed.iter().map(|(_, pin)| pin.clone()).collect();
        let pins = match self.records().pin_first_seen(&candidates).await {
            Ok(pins) => pins,
            Err(e) => {
                // An outage, not a fact about the tools: with no pin to compare with, no tool is
                // known to be unchanged, nor changed. Nothing of this listing is offered, and
                // every call of the connection is refused `ledger_unreachable` until a listing
                // is compared again.
                tracing::error!(target: "desk", server = %server, error = %e, "could not read the pinned tool definitions: the listing and every call are refused ledger_unreachable until they can be read");
                if let Some(conn) = lock(&self.inner.state).connections.get_mut(tenant) {
                    conn.tools.clear();
                    conn.pins_unread = true;
                }
                return Err(outage());
            }
        };
        let pinned: HashMap<&str, &ToolPin> = pins.iter().map(|p| (p.tool.as_str(), p)).collect();
        let mut held_back = Vec::new();
        let mut decisions = Vec::with_capacity(tools.len());
        let mut state = lock(&self.inner.state);
        let Some(conn) = state.connections.get_mut(tenant) else {
            return Err(error(ErrorCode::NotIntroduced, "unknown connection"));
        };
        conn.tools.clear();
        conn.pins_unread = false;
        conn.rules_generation = generation;
        for tool in &tools {
            // A tool without a string name cannot be called by name: it is not offered.
            let Some(name) = tool.get("name").and_then(Value::as_str).map(str::to_owned) else {
                continue;
            };
            let mut rule = policy.rule(&conn.server, tool);
            // An open tool that a rule over arguments may gate is listed gated: each call of it
            // is then decided by the rules, and one they leave alone runs on its own.
            let by_rules = !rule.class.is_gated() && self.rules_may_gate(&name);
            if by_rules {
                rule.class = countersign_core::GateClass::Token;
                rule.why = format!(
                    "policy.cedar: a rule over arguments may gate some calls of it ({})",
                    rule.why
                );
            }
            let withheld = if seen.get(name.as_str()).copied().unwrap_or(0) > 1 {
                Some("the upstream lists more than one tool under this name".to_owned())
            } else if rule.class.is_gated() && !by_rules && self.inner.config.read_only {
                Some(READ_ONLY.to_owned())
            } else if rule.class.is_gated() {
                policy::withheld_reason(tool)
            } else {
                None
            };
            let mut listed_as = None;
            if let Some(reason) = &withheld
                && reason != READ_ONLY
            {
                tracing::warn!(target: "desk", server = %conn.server, tool = %name, "tool withheld: {reason}");
            }
            if withheld.is_some() {
            } else if let Some((_, candidate)) = listed.iter().find(|(t, _)| std::ptr::eq(*t, tool))
            {
                let pin = pinned.get(name.as_str());
                let is_pinned = pin.is_some_and(|p| p.hash == candidate.hash);
                if !is_pinned {
                    listed_as = Some(change::held_listing(
                        tool,
                        pin.map(|p| p.definition.as_str()),
                    ));
                    tracing::warn!(target: "desk", server = %conn.server, tool = %name, "tool definition differs from its pin, or the tool is new to a server the desk knows: calls held back until the person accepts it");
                    held_back.push((pin.map(|p| p.definition.clone()), candidate.clone()));
                }
                conn.tools.insert(
                    name.clone(),
                    Listed {
                        rule: rule.clone(),
                        hash: candidate.hash,
                        pinned: is_pinned,
                        by_rules,
                    },
                );
            }
            decisions.push(ToolDecision {
                name,
                class: rule.class,
                withheld,
                listed_as,
            });
        }
        let stale = Self::stale_tool_changes(&state, &server);
        let mut added = Vec::new();
        let mut removed = Vec::new();
        for id in stale {
            if state.requests.remove(&id).is_some() {
                removed.push(id);
            }
        }
        for (before, pin) in held_back {
            // A definition the window would cut cannot be accepted: the person would approve
            // text they never saw (an injection past the cut). It stays held back.
            if pin
                .definition
                .chars()
                .nth(change::MAX_CHANGE_TEXT_CHARS)
                .is_some()
            {
                tracing::warn!(target: "desk", server = %server, tool = %pin.tool, "tool definition too large to show whole: held back, and not offered for acceptance");
                continue;
            }
            // No pin: a tool new to a server the desk knows (a server's first listing pins all).
            let summary = match &before {
                Some(before) => change::tool_summary(&pin.tool, before, &pin.definition),
                None => format!(
                    "A new tool `{}`, not in the listing the desk pinned for this server",
                    pin.tool
                ),
            };
            let change = Change {
                kind: ChangeKind::Tool,
                subject: format!("{server} :: {}", pin.tool),
                summary,
                before,
                after: Some(pin.definition.clone()),
                origin: "the upstream's tool listing".to_owned(),
                analysis: None,
            };
            if let Ok((_, Some(view))) = self.queue_change(&mut state, change, Some(pin)) {
                added.push(view);
            }
        }
        drop(state);
        for id in removed {
            self.publish(QueueChange::Removed {
                id,
                reason: Removal::Withdrawn,
            });
        }
        for view in added {
            self.publish(QueueChange::Added {
                request: Box::new(view),
            });
        }
        Ok(decisions)
    }

    /// Waiting tool changes of `server` that no connection of it lists any more (the tool went
    /// back to its pinned definition, changed again, or went): accepting one would pin what no
    /// upstream of it offers.
    pub(crate) fn stale_tool_changes(state: &State, server: &str) -> Vec<u64> {
        state
            .requests
            .iter()
            .filter(|(_, e)| e.is_waiting() && !e.approving)
            .filter_map(|(id, e)| {
                let pin = e.repin().filter(|p| p.server == server)?;
                let offered = state.connections.values().any(|c| {
                    c.server == server
                        && c.tools
                            .get(&pin.tool)
                            .is_some_and(|l| !l.pinned && l.hash == pin.hash)
                });
                (!offered).then_some(*id)
            })
            .collect()
    }

    /// Whether an open tool's call may go to the upstream: the engine knows the connection, the
    /// tool is listed open, and its definition is the pinned one. `Ok` when it may; a
    /// refusal or an error (recorded in history) when it may not: `ledger_unreachable` while the
    /// connection's pins could not be read. The session asks before every open call it forwards.
    pub async fn open_call(&self, tenant: &Tenant, tool: &str) -> Result<(), Stopped> {
        let found = {
            let state = lock(&self.inner.state);
            state.connections.get(tenant).map(|c| {
                (
                    c.pins_unread,
                    c.tools.get(tool).map(|l| (l.pinned, l.rule.class)),
                    c.rules_generation,
                )
            })
        };
        // Listed open under other rules than those in force, and a rule now in force may gate
        // it: the call must be decided by the rules, so it does not go as open. The agent's
        // client lists again (the session does before its next call) and calls again.
        if let Some((false, _, generation)) = found
            && generation != self.rules_generation()
            && self.rules_may_gate(tool)
        {
            let message = format!(
                "Not run: the desk's rules changed since `{tool}` was listed, and they may decide \
                 its calls now. Nothing was executed. Next: call it again."
            );
            return Err(error(ErrorCode::Busy, message));
        }
        let found = found.map(|(unread, listed, _)| (unread, listed));
        let found = match found {
            Some((true, _)) => return Err(self.rejected(tenant, tool, outage()).await),
            found => found.map(|(_, listed)| listed),
        };
        match found {
            None => Err(error(ErrorCode::NotIntroduced, "unknown connection")),
            Some(None) => {
                let message = format!("`{tool}` is not a tool this connection offers");
                Err(self
                    .rejected(tenant, tool, error(ErrorCode::UnknownTool, message))
                    .await)
            }
            Some(Some((false, _))) => Err(self.tool_changed(tenant, tool).await),
            // Listed again as gated since the caller's gate was read (a definition accepted
            // since, or another of its requests listing meanwhile): never forwarded as open.
            Some(Some((true, class))) if class != countersign_core::GateClass::Open => {
                let message = format!(
                    "Not run: `{tool}` is no longer an open tool since it was listed, so this \
                     call needs a person's approval. Nothing was executed. Next: call it again."
                );
                Err(error(ErrorCode::Busy, message))
            }
            Some(Some((true, class))) => {
                self.tally_request(Some(class), Outcome::Forwarded);
                Ok(())
            }
        }
    }

    /// Whether an open tool's call may go to the upstream at once, with nothing to record: the
    /// engine knows the connection, the tool is listed, classed `open` and its definition is the
    /// pinned one. It counts nothing (see [`Engine::forwarded_open`]). When it says no, the call
    /// takes the session's full path, where [`Engine::open_call`] refuses it on the record: the
    /// session's open lane asks this before it writes a call to the upstream itself.
    pub fn forwards_open(&self, tenant: &Tenant, tool: &str) -> bool {
        lock(&self.inner.state)
            .connections
            .get(tenant)
            .filter(|c| !c.pins_unread && c.rules_generation == self.rules_generation())
            .and_then(|c| c.tools.get(tool))
            .is_some_and(|l| l.pinned && l.rule.class == countersign_core::GateClass::Open)
    }

    /// Counts an open tool's call that [`Engine::forwards_open`] let go to the upstream.
    pub fn forwarded_open(&self) {
        self.tally_request(Some(countersign_core::GateClass::Open), Outcome::Forwarded);
    }

    /// Whether a call of `tool` on connection `tenant` may run as listed now (the tool is listed
    /// and its definition is the pinned one): [`Engine::open_call`] without recording a refusal,
    /// for the desk's own calls (a preview reads through the upstream's tools).
    pub fn runs(&self, tenant: &Tenant, tool: &str) -> bool {
        lock(&self.inner.state)
            .connections
            .get(tenant)
            .filter(|c| !c.pins_unread)
            .and_then(|c| c.tools.get(tool))
            .is_some_and(|l| l.pinned)
    }

    /// A call of a tool whose definition differs from its pin: refused, and on the record.
    pub(crate) async fn tool_changed(&self, tenant: &Tenant, tool: &str) -> Stopped {
        let kind = EventKind::Refused {
            refusal: Refusal::ToolChanged,
        };
        self.record(self.unplanned(kind, tenant, tool, None)).await;
        refused(Refusal::ToolChanged)
    }
}
