//! What the engine keeps in memory while it runs, shared by every room.
//!
//! The queue (each request waiting for a person, or decided and not yet collected), the
//! connections with the tools their upstream listed, and the bookkeeping that must not outlive
//! the desk: acceptances awaiting their outcome, used-up `requestState`s, grants' tokens. One
//! mutex guards it all; every critical section leaves it consistent and none does I/O.

use countersign_core::Tenant;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};

use countersign_core::policy::{Policy, ToolRule};
use countersign_core::token::{Nonce, SigningKey};
use countersign_core::{PlanHash, ServerId};
use countersign_store::{Records, ToolPin};
use serde_json::{Map, Value};
use tokio::sync::{broadcast, watch};

use crate::answer::Approved;
use crate::config::{EngineConfig, NoKey};
use crate::queue::{PendingRequest, QueueChange};

#[derive(Debug, Clone)]
/// What a person decided of a request.
pub(crate) enum Decision {
    /// What the waiting preflight gets.
    Approved(Approved),
    /// A change was approved (and, for a tool, re-pinned).
    Changed,
    /// Denied, with the person's note for the agent.
    Denied {
        /// The note, if any.
        note: Option<String>,
    },
    /// Approved on a team's server, and the token minted on another replica, where the agent's
    /// call waited: nothing for this copy of the call.
    TakenElsewhere,
}

pub(crate) struct Entry {
    pub(crate) view: PendingRequest,
    /// What deciding it needs beside what the window shows.
    pub(crate) holds: Holds,
    pub(crate) decision: watch::Sender<Option<Decision>>,
    /// An approve of it is writing its approval: a second approve or a deny finds it taken.
    pub(crate) approving: bool,
}

/// What a queue entry keeps beside its view, by kind: no kind carries the other's fields.
pub(crate) enum Holds {
    /// A call: the arguments an approval stores and a confirm executes.
    Call {
        /// The arguments, without the confirm fields.
        arguments: Map<String, Value>,
    },
    /// A change: for a tool's changed definition, the pin approving it puts in force.
    Change {
        /// The pin, for a tool.
        repin: Option<ToolPin>,
    },
}

impl Entry {
    pub(crate) fn is_change(&self) -> bool {
        matches!(self.holds, Holds::Change { .. })
    }

    pub(crate) fn is_waiting(&self) -> bool {
        self.decision.borrow().is_none()
    }

    /// Marks (`Some(at)`) or unmarks (`None`) a call's request as one its agent stopped waiting
    /// for: whether that changed anything.
    pub(crate) fn set_stopped_waiting(&mut self, at: Option<u64>) -> bool {
        match &mut self.view.asks {
            crate::queue::Asks::Call(call) if call.stopped_waiting_at_ms != at => {
                call.stopped_waiting_at_ms = at;
                true
            }
            _ => false,
        }
    }

    /// Whether its agent stopped waiting for it long enough ago that its grace is over at `now`.
    pub(crate) fn grace_over(&self, now: u64) -> bool {
        self.view
            .call()
            .and_then(|c| c.stopped_waiting_at_ms)
            .is_some_and(|at| at.saturating_add(crate::queue::STOPPED_WAITING_GRACE_MS) <= now)
    }

    /// The connection that asked, for a call.
    pub(crate) fn tenant(&self) -> Option<&str> {
        self.view.call().map(|c| c.tenant.as_str())
    }

    /// For a call, its arguments.
    pub(crate) fn arguments(&self) -> Option<&Map<String, Value>> {
        match &self.holds {
            Holds::Call { arguments } => Some(arguments),
            Holds::Change { .. } => None,
        }
    }

    /// For a tool's changed definition, the pin approving it puts in force.
    pub(crate) fn repin(&self) -> Option<&ToolPin> {
        match &self.holds {
            Holds::Change { repin } => repin.as_ref(),
            Holds::Call { .. } => None,
        }
    }

    /// Whether this is the request of `tenant`'s call of `tool` planned to `hash`: the one key
    /// by which a call re-attaches to, withdraws, finds or previews its request.
    pub(crate) fn is_call(&self, tenant: &Tenant, tool: &str, hash: PlanHash) -> bool {
        self.view.call().is_some_and(|c| {
            c.tenant == *tenant && c.plan_hash == hash && self.view.plan.tool == tool
        })
    }
}

/// One tool as a connection's upstream listed it.
pub(crate) struct Listed {
    pub(crate) rule: ToolRule,
    /// The hash of its definition as listed.
    pub(crate) hash: PlanHash,
    /// Whether that definition is the one pinned: calls of it run only while it is.
    pub(crate) pinned: bool,
    /// Open by its annotations or the TOML policy, and listed gated because a rule over
    /// arguments may gate some of its calls: a call the rules leave alone runs on its own.
    pub(crate) by_rules: bool,
}

pub(crate) struct Connection {
    pub(crate) client_info: Value,
    /// The upstream, as the desk identifies it.
    pub(crate) id: ServerId,
    /// Its key (`ServerId::key`): what policy, pins and grants are keyed by.
    pub(crate) server: String,
    pub(crate) tools: HashMap<String, Listed>,
    /// The pins its last listing was to be compared with could not be read (an outage of the
    /// records): nothing of it is known to be pinned or changed, so every call of it is refused
    /// `ledger_unreachable` until a listing is compared again.
    pub(crate) pins_unread: bool,
    /// The generation of the rules over arguments its last listing was classed under
    /// ([`crate::Engine::rules_generation`]): under another, its open tools are not taken as open.
    pub(crate) rules_generation: u64,
    /// This connection's one turn to describe SQL, taken before one of the desk's: one agent
    /// holds at most one of [`crate::describing::MAX_DESCRIBING`], and leaves the others to the rest.
    pub(crate) own_turn: Arc<tokio::sync::Semaphore>,
    /// When a host last attached it ([`crate::Engine::attach`]): the one seen longest ago, with
    /// nothing in the queue or awaiting an outcome, is forgotten first when the engine is full.
    /// `None` for a connection the desk made, which ends when its gateway goes.
    pub(crate) attached_at_ms: Option<u64>,
}

impl Connection {
    /// A connection to the upstream `id`, its tools not listed yet; `attached_at_ms` for one a
    /// host attached ([`crate::Engine::attach`]), `None` for the desk's own.
    pub(crate) fn new(id: ServerId, attached_at_ms: Option<u64>) -> Self {
        Connection {
            client_info: Value::Null,
            server: id.key(),
            id,
            tools: HashMap::new(),
            pins_unread: false,
            // Never a generation the rules had: nothing is taken as open until it is listed.
            rules_generation: u64::MAX,
            own_turn: Arc::new(tokio::sync::Semaphore::new(1)),
            attached_at_ms,
        }
    }
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) next_id: u64,
    pub(crate) connections: HashMap<Tenant, Connection>,
    /// Every connection's server name, kept after it disconnects so history can show it (the
    /// newest [`crate::listing::MAX_GONE_SERVERS`] of those gone).
    pub(crate) servers: HashMap<Tenant, String>,
    /// Disconnected tenants in the order they went, for pruning `servers`.
    pub(crate) gone: VecDeque<Tenant>,
    pub(crate) requests: BTreeMap<u64, Entry>,
    /// Accepted calls whose outcome is still to come, by tenant and nonce (a reusable token's
    /// nonce may be accepted more than once): each acceptance records one outcome.
    pub(crate) awaiting_outcome: HashMap<(Tenant, Nonce), Awaiting>,
    /// The `requestState`s of the 2026-07-28 flow used up, by connection, with their expiry (a
    /// state forgotten after its expiry no longer opens anyway).
    pub(crate) spent_states: HashMap<Tenant, HashMap<Nonce, u64>>,
    /// When a preview last changed what a waiting request shows, by id: its approve delay runs
    /// from then.
    pub(crate) rearmed: HashMap<u64, u64>,
    /// The tokens each grant minted, by grant number, with their expiry: a revoke takes back
    /// those not yet expired (see the grant module).
    pub(crate) grant_tokens: HashMap<u64, Vec<(Nonce, u64)>>,
}

/// What settings may change while the engine runs.
pub(crate) struct Live {
    pub(crate) policy: Policy,
    pub(crate) token_ttl_ms: u64,
    pub(crate) approve_delay_ms: u64,
    /// When the window was last shown or focused (ms since the epoch).
    pub(crate) held_at_ms: u64,
}

pub(crate) struct Inner {
    pub(crate) config: EngineConfig,
    pub(crate) live: RwLock<Live>,
    pub(crate) key: RwLock<Result<SigningKey, NoKey>>,
    /// Where the records live.
    pub(crate) store: Arc<dyn Records>,
    /// Held from reading a grant through minting what it covers, and by a revoke: a revoke waits
    /// for a grant's mint in flight and is seen by the next. It holds whether the session grants
    /// an earlier run left in the records were ended.
    pub(crate) grants_turn: tokio::sync::Mutex<bool>,
    pub(crate) state: Mutex<State>,
    pub(crate) changes: broadcast::Sender<QueueChange>,
    /// Turns to describe a call's SQL, across the desk ([`crate::describing::MAX_DESCRIBING`]).
    pub(crate) describing: Arc<tokio::sync::Semaphore>,
    /// Where a team's server shares its waiting calls with its other replicas (unset on a desk).
    pub(crate) shared: std::sync::OnceLock<Arc<dyn crate::rounds::SharedRequests>>,
    /// The rules over arguments in force, and the tools they were loaded against.
    pub(crate) ruling: RwLock<crate::ruling::Ruling>,
}

/// An accepted call whose outcome is still to come: how many acceptances of its nonce await one,
/// and what its outcome is recorded under (the approval's tool, target and plan, kept here so
/// the outcome needs no read of the approval again).
#[derive(Debug, Clone)]
pub(crate) struct Awaiting {
    pub(crate) count: u32,
    pub(crate) tool: String,
    pub(crate) target: String,
    pub(crate) plan: countersign_core::PlanHash,
}
