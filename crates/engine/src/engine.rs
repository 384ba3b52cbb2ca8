//! The approval queue and the request handlers behind the socket.
//!
//! A preflight becomes a pending request keyed by (tenant, tool, plan hash): a second preflight
//! of the same plan on the same connection re-attaches to it instead of queueing a duplicate. A
//! decision is published through a `watch` channel to whoever waits; an approval whose caller
//! already gave up waiting stays collectable until its token expires. Changes to the queue go out
//! on a broadcast channel, so the window never polls.
//!
//! The same queue holds requests to change the desk itself ([`Change`]: a server, the policy, a
//! tool whose definition differs from its pin). They are decided by the same click and delay but
//! mint nothing, and are capped on their own ([`MAX_PENDING_CHANGES`]). Tool definitions are
//! pinned per server identity at first sight (in the store); a tool listed with another
//! definition keeps being listed, but no call of it, open or gated, runs until the person accepts
//! the change, which re-pins it.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::answer::{Answer, ErrorCode, ToolDecision};
use crate::change::{self, Change, ChangeDecision, ChangeKind, MAX_PENDING_CHANGES};
use countersign_core::policy::{self, Policy, ToolRule};
use countersign_core::telemetry::{ConfirmEvent, EventKind, Rejection};
use countersign_core::token::{self, Claims, Nonce, SigningKey};
use countersign_core::verify::{self, Confirm};
use countersign_core::{GateClass, Plan, PlanHash, Refusal, binding, render};
use countersign_store::{Approval, HistoryFilter, Store, StoreOptions, ToolPin};
use serde::Serialize;
use serde_json::{Map, Value};
use tokio::sync::{broadcast, watch};

#[path = "grant.rs"]
pub(crate) mod grant;
#[path = "preview.rs"]
pub(crate) mod preview;

/// Why a desk without a window refuses every preflight, and what to do about it.
pub const HEADLESS: &str = "Refused: the Countersign desk is running without a window (no \
display), so nobody can approve this call. Nothing was executed. Next: open the Countersign desk \
in a desktop session (`countersign desk`), then call this tool again.";

/// Why a desk without a window denies every proposed change.
const NO_WINDOW_FOR_CHANGES: &str = "the Countersign desk is running without a window (no \
display), so nobody can review this change. Nothing was changed. Open the desk in a desktop \
session (`countersign desk`) and propose it again.";

/// Token lifetime unless configured otherwise: ten minutes.
pub const DEFAULT_TOKEN_TTL_MS: u64 = 10 * 60 * 1000;

/// The most requests one connection may have waiting for a person: more is a flood, not work.
pub const MAX_PENDING_PER_CONNECTION: usize = 16;

/// The most requests waiting for a person at once, from every connection together.
pub const MAX_PENDING: usize = 128;

/// The most used-up `requestState`s of the 2026-07-28 flow one connection keeps until they
/// expire; past it, its states are refused as used (failing closed) until the oldest expire.
pub const MAX_SPENT_STATES: usize = 4096;

/// How many disconnected connections' server names are kept for history to show.
const MAX_GONE_SERVERS: usize = 4096;

/// The approve delay unless configured otherwise: one second.
pub const DEFAULT_APPROVE_DELAY_MS: u64 = 1000;

/// How the engine is set up.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The SQLite file: ledger, approved arguments, history.
    pub store_path: PathBuf,
    /// Options for opening it.
    pub store_options: StoreOptions,
    /// The policy in force.
    pub policy: Policy,
    /// How long a minted token lives.
    pub token_ttl_ms: u64,
    /// Whether a window shows requests to a person. Without one (no display), gated calls are
    /// refused `desk_unavailable` at once: nobody could approve them.
    pub window: bool,
    /// How long after a request arrives, or the window is shown or focused again
    /// ([`Engine::hold_approvals`]), an approve of it is refused: the window disables its button
    /// for as long, and the engine enforces it too, so a script driving the page cannot click
    /// sooner. The desk never sets less than a second; tests below the window may set 0.
    pub approve_delay_ms: u64,
}

impl EngineConfig {
    /// Defaults for a store at `store_path`.
    pub fn new(store_path: impl Into<PathBuf>) -> Self {
        Self {
            store_path: store_path.into(),
            store_options: StoreOptions::default(),
            policy: Policy::default(),
            token_ttl_ms: DEFAULT_TOKEN_TTL_MS,
            window: true,
            approve_delay_ms: DEFAULT_APPROVE_DELAY_MS,
        }
    }
}

/// The engine could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The store's directory could not be created.
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Why an approval did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApproveError {
    /// No pending request has this id (decided, withdrawn, or never existed).
    #[error("no pending request with this id")]
    NotPending,
    /// Policy asks for the target to be typed, and what was typed differs.
    #[error("the target must be typed exactly to approve this request")]
    TargetNotTyped,
    /// There is no secret (keychain missing or locked): nothing can be minted.
    #[error("no secret: {0}")]
    NoSecret(String),
    /// The approved arguments could not be stored, so no token was minted.
    #[error("the approval could not be stored: {0}")]
    Store(String),
    /// The approve came sooner than the approve delay after the request arrived or after the
    /// window was last shown or focused: nothing was minted; approve again after `wait_ms`.
    #[error("too soon: Approve works {wait_ms} ms from now")]
    TooSoon {
        /// How long until an approve of this request is accepted.
        wait_ms: u64,
    },
}

impl ApproveError {
    /// A stable code for the UI.
    pub fn code(&self) -> &'static str {
        match self {
            ApproveError::NotPending => "not_pending",
            ApproveError::TargetNotTyped => "target_not_typed",
            ApproveError::NoSecret(_) => "no_secret",
            ApproveError::Store(_) => "store_failed",
            ApproveError::TooSoon { .. } => "too_soon",
        }
    }
}

/// A request waiting for a person, as the window shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingRequest {
    /// The queue's id for it.
    pub id: u64,
    /// The connection that asked.
    pub tenant: String,
    /// The agent's `clientInfo`, as it sent it.
    pub client_info: Value,
    /// The server (the gateway's `--name`, or the upstream's name).
    pub server: String,
    /// The plan a token would bind.
    pub plan: Plan,
    /// Its hash.
    pub plan_hash: PlanHash,
    /// `token` or `once`.
    pub class: GateClass,
    /// Whether approving needs the target typed.
    pub type_target: bool,
    /// How long a token minted now would live.
    pub token_ttl_ms: u64,
    /// When it arrived, ms since the epoch.
    pub arrived_at_ms: u64,
    /// The plan as plain text, exactly as hashed.
    pub text: String,
    /// For a request to change the desk itself (not a tool call): the change. Its `plan` then
    /// only names it (tool `change:<kind>`, target its subject); nothing is minted for it.
    pub change: Option<Change>,
    /// Why the tool has its class: the policy line that set it, or its annotations.
    pub why: String,
    /// What the call would do, as the desk found it while the request waits: shown, never
    /// hashed, minted or executed ([`Engine::attach_preview`]).
    pub preview: Option<countersign_core::preview::Preview>,
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
    /// What a waiting request shows changed (a preview arrived): the approve delay starts again.
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

/// A gated call, planned: see [`Engine::plan_call`].
struct Call {
    rule: ToolRule,
    client_info: Value,
    server: String,
    args: Map<String, Value>,
    fields: policy::ConfirmFields,
    plan: Plan,
    hash: PlanHash,
}

#[derive(Debug, Clone)]
enum Decision {
    /// The answer the waiting preflight gets: always an [`Answer::Approved`].
    Approved(Answer),
    /// A change was approved (and, for a tool, re-pinned).
    Changed,
    Denied {
        note: Option<String>,
    },
}

struct Entry {
    view: PendingRequest,
    arguments: Map<String, Value>,
    decision: watch::Sender<Option<Decision>>,
    /// An approve of it is writing its approval: a second approve or a deny finds it taken.
    approving: bool,
    /// For a tool's changed definition: the pin that approving it puts in force.
    repin: Option<ToolPin>,
}

impl Entry {
    fn is_change(&self) -> bool {
        self.view.change.is_some()
    }

    fn is_waiting(&self) -> bool {
        self.decision.borrow().is_none()
    }

    /// Whether this is the request of `tenant`'s call of `tool` planned to `hash`: the one key
    /// by which a call re-attaches to, withdraws, finds or previews its request.
    fn is_call(&self, tenant: &str, tool: &str, hash: PlanHash) -> bool {
        !self.is_change()
            && self.view.tenant == tenant
            && self.view.plan.tool == tool
            && self.view.plan_hash == hash
    }
}

/// One tool as a connection's upstream listed it.
struct Listed {
    rule: ToolRule,
    /// The hash of its definition as listed.
    hash: PlanHash,
    /// Whether that definition is the one pinned: calls of it run only while it is.
    pinned: bool,
}

struct Connection {
    client_info: Value,
    server: String,
    tools: HashMap<String, Listed>,
    /// This connection's one turn to describe SQL, taken before one of the desk's: one agent
    /// holds at most one of [`preview::MAX_DESCRIBING`], and leaves the others to the rest.
    own_turn: Arc<tokio::sync::Semaphore>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    connections: HashMap<String, Connection>,
    /// Every connection's server name, kept after it disconnects so history can show it (the
    /// newest [`MAX_GONE_SERVERS`] of those gone).
    servers: HashMap<String, String>,
    /// Disconnected tenants in the order they went, for pruning `servers`.
    gone: std::collections::VecDeque<String>,
    requests: BTreeMap<u64, Entry>,
    /// Accepted calls whose outcome is still to come, by tenant and nonce (a reusable token's
    /// nonce may be accepted more than once): each acceptance records one outcome.
    awaiting_outcome: HashMap<(String, Nonce), u32>,
    /// The `requestState`s of the 2026-07-28 flow used up, by connection, with their expiry (a
    /// state forgotten after its expiry no longer opens anyway).
    spent_states: HashMap<String, HashMap<Nonce, u64>>,
    /// When a preview last changed what a waiting request shows, by id: its approve delay runs
    /// from then.
    rearmed: HashMap<u64, u64>,
    /// Whether the session grants an earlier run of the desk left in the file were ended.
    session_grants_ended: bool,
    /// The tokens each grant minted, by grant number, with their expiry: a revoke takes back
    /// those not yet expired (see the grant module).
    grant_tokens: HashMap<u64, Vec<(Nonce, u64)>>,
}

/// What settings may change while the engine runs.
struct Live {
    policy: Policy,
    token_ttl_ms: u64,
    approve_delay_ms: u64,
    /// When the window was last shown or focused (ms since the epoch).
    held_at_ms: u64,
}

struct Inner {
    config: EngineConfig,
    live: std::sync::RwLock<Live>,
    key: std::sync::RwLock<Result<SigningKey, String>>,
    store: Mutex<Store>,
    state: Mutex<State>,
    changes: broadcast::Sender<QueueChange>,
    /// Turns to describe a call's SQL, across the desk ([`preview::MAX_DESCRIBING`]).
    describing: Arc<tokio::sync::Semaphore>,
}

/// The desk's engine. Cheap to clone: every clone is the same engine.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("store", &self.inner.config.store_path)
            .finish_non_exhaustive()
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock must not take the desk down with it: the state is kept
    // consistent by each critical section, so recover it.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What an approval's MAC covers, as the row holds it.
fn bound_of(approval: &Approval) -> binding::Bound<'_> {
    binding::Bound {
        nonce: &approval.nonce,
        tenant: &approval.tenant,
        plan: &approval.plan,
        class: approval.class,
        expires_at_ms: approval.expires_at_ms,
        arguments: &approval.arguments,
    }
}

fn refused(refusal: Refusal) -> Answer {
    Answer::Refused {
        refusal,
        message: refusal.next_move().to_owned(),
    }
}

fn error(code: ErrorCode, message: impl Into<String>) -> Answer {
    Answer::Error {
        code,
        message: message.into(),
    }
}

impl Engine {
    /// Starts an engine. `key` is the signing key, or why there is none (a missing or locked
    /// keychain): the engine then runs, queues and shows requests, but mints nothing.
    pub fn new(
        config: EngineConfig,
        key: Result<SigningKey, String>,
    ) -> Result<Engine, EngineError> {
        if let Some(dir) = config
            .store_path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
        {
            std::fs::create_dir_all(dir).map_err(|source| EngineError::DataDir {
                path: dir.to_owned(),
                source,
            })?;
        }
        // Deferred: a ledger that cannot open now is reported per operation (fail closed), and
        // retried, rather than keeping the desk from starting.
        let store = Store::open_deferred(&config.store_path, config.store_options.clone());
        let (changes, _) = broadcast::channel(256);
        Ok(Engine {
            inner: Arc::new(Inner {
                live: std::sync::RwLock::new(Live {
                    policy: config.policy.clone(),
                    token_ttl_ms: config.token_ttl_ms,
                    approve_delay_ms: config.approve_delay_ms,
                    held_at_ms: 0,
                }),
                config,
                key: std::sync::RwLock::new(key),
                store: Mutex::new(store),
                state: Mutex::new(State {
                    next_id: 1,
                    ..State::default()
                }),
                changes,
                describing: Arc::new(tokio::sync::Semaphore::new(preview::MAX_DESCRIBING)),
            }),
        })
    }

    /// The lifetime of tokens minted from now on.
    pub fn token_ttl_ms(&self) -> u64 {
        self.inner
            .live
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .token_ttl_ms
    }

    /// Changes the lifetime of tokens minted from now on (at least one second).
    pub fn set_token_ttl_ms(&self, ttl_ms: u64) {
        self.inner
            .live
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .token_ttl_ms = ttl_ms.max(1000);
    }

    /// Changes the approve delay (see [`EngineConfig::approve_delay_ms`]).
    pub fn set_approve_delay_ms(&self, delay_ms: u64) {
        self.inner
            .live
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .approve_delay_ms = delay_ms;
    }

    /// The window was just shown or regained focus: no approve is accepted until the approve
    /// delay has passed again, so a click aimed at whatever was on screen before lands on nothing.
    pub fn hold_approvals(&self) {
        self.inner
            .live
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .held_at_ms = now_ms();
    }

    /// How long until request `arrived_at_ms` may be approved (0: now).
    fn approve_wait_ms(&self, arrived_at_ms: u64, now: u64) -> u64 {
        let live = self.inner.live.read().unwrap_or_else(|p| p.into_inner());
        let from = arrived_at_ms.max(live.held_at_ms);
        from.saturating_add(live.approve_delay_ms)
            .saturating_sub(now)
    }

    /// The policy in force.
    pub fn policy(&self) -> Policy {
        self.inner
            .live
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .policy
            .clone()
    }

    /// Replaces the policy. Tools are classed when a gateway registers them, so the new policy
    /// applies to each connection from its next tool listing.
    pub fn set_policy(&self, policy: Policy) {
        self.inner
            .live
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .policy = policy;
    }

    /// Why the engine cannot mint, if it cannot.
    pub fn secret_problem(&self) -> Option<String> {
        self.inner
            .key
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .err()
            .cloned()
    }

    /// Replaces the signing key (a rotated secret, or one that became available): every token
    /// minted with the old key stops verifying.
    pub fn set_key(&self, key: Result<SigningKey, String>) {
        *self.inner.key.write().unwrap_or_else(|p| p.into_inner()) = key;
    }

    fn key(&self) -> Result<SigningKey, String> {
        self.inner
            .key
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The server name of a connection, also after it disconnected (for history).
    pub fn server_of(&self, tenant: &str) -> Option<String> {
        lock(&self.inner.state).servers.get(tenant).cloned()
    }

    /// Changes to the queue from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<QueueChange> {
        self.inner.changes.subscribe()
    }

    /// Every request waiting for a person, oldest first.
    pub fn pending(&self) -> Vec<PendingRequest> {
        let state = lock(&self.inner.state);
        state
            .requests
            .values()
            .filter(|e| e.decision.borrow().is_none())
            .map(|e| e.view.clone())
            .collect()
    }

    /// History, newest first.
    pub fn history(&self, filter: &HistoryFilter) -> Result<Vec<ConfirmEvent>, String> {
        lock(&self.inner.store)
            .history(filter)
            .map_err(|e| e.to_string())
    }

    fn record(&self, event: ConfirmEvent) {
        // History is the audit trail, but failing to write it must not turn a refusal into an
        // acceptance or lose the telemetry: the store emits the event whether or not the write
        // succeeds (once), and the failure is logged here.
        if let Err(err) = lock(&self.inner.store).record(&event) {
            tracing::error!(target: "desk", error = %err, "could not write history");
        }
    }

    /// Records a gated call refused before verification, and passes its answer on.
    fn rejected(&self, tenant: &str, tool: &str, answer: Answer) -> Answer {
        if let Answer::Refused {
            refusal: Refusal::ToolChanged,
            ..
        } = answer
        {
            return self.tool_changed(tenant, tool);
        }
        if let Answer::Error { code, message } = &answer
            && let Some(reason) = code.rejection()
        {
            self.record(ConfirmEvent {
                at_ms: now_ms(),
                kind: EventKind::Rejected { reason },
                tool: tool.to_owned(),
                target: None,
                tenant: tenant.to_owned(),
                nonce: None,
                plan: None,
                note: Some(message.clone()),
            });
        }
        answer
    }

    /// The session refused a call of `tool` before it reached the engine (the upstream does not
    /// list it): on the record like every other refusal.
    pub fn record_unlisted(&self, tenant: &str, tool: &str) {
        self.record(ConfirmEvent {
            at_ms: now_ms(),
            kind: EventKind::Rejected {
                reason: Rejection::UnlistedTool,
            },
            tool: tool.to_owned(),
            target: None,
            tenant: tenant.to_owned(),
            nonce: None,
            plan: None,
            note: None,
        });
    }

    /// Forgets what has expired (spent nonces, approvals) and the oldest history beyond what the
    /// store keeps. The desk calls this on a schedule.
    pub fn prune(&self) -> Result<countersign_store::Pruned, String> {
        lock(&self.inner.store)
            .prune(now_ms())
            .map_err(|e| e.to_string())
    }

    fn publish(&self, change: QueueChange) {
        // No subscriber is not an error: the window may not be open yet.
        let _ = self.inner.changes.send(change);
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

    /// A person approved request `id`: mint its token, keep the approved arguments with the
    /// nonce, and hand the preflight to whoever waits for it. `typed_target` is what the person
    /// typed, where policy asks for it. This is the only place a token is minted.
    pub fn approve(&self, id: u64, typed_target: Option<&str>) -> Result<(), ApproveError> {
        let is_change = lock(&self.inner.state)
            .requests
            .get(&id)
            .is_some_and(Entry::is_change);
        if is_change {
            return self.approve_change(id);
        }
        let key = self.key().map_err(ApproveError::NoSecret)?;
        let now = now_ms();
        // Under the lock only long enough to check the request and claim it: the durable write
        // below must not hold up the queue, the window or any other connection.
        let (view, arguments) = {
            let mut state = lock(&self.inner.state);
            let rearmed_at_ms = state.rearmed.get(&id).copied().unwrap_or(0);
            let entry = state
                .requests
                .get_mut(&id)
                .filter(|e| e.is_waiting() && !e.approving && !e.is_change())
                .ok_or(ApproveError::NotPending)?;
            let view = &entry.view;
            if view.type_target && typed_target != Some(view.plan.target.as_str()) {
                return Err(ApproveError::TargetNotTyped);
            }
            let wait_ms = self.approve_wait_ms(view.arrived_at_ms.max(rearmed_at_ms), now);
            if wait_ms > 0 {
                return Err(ApproveError::TooSoon { wait_ms });
            }
            entry.approving = true;
            (entry.view.clone(), entry.arguments.clone())
        };
        let release = |engine: &Engine| {
            if let Some(entry) = lock(&engine.inner.state).requests.get_mut(&id) {
                entry.approving = false;
            }
        };
        let minted = self.mint(
            &key,
            &mut lock(&self.inner.store),
            &view.tenant,
            &view.plan,
            view.plan_hash,
            view.class,
            arguments,
            now,
        );
        let (answer, claims) = match minted {
            Ok(minted) => minted,
            Err(e) => {
                release(self);
                return Err(e);
            }
        };
        let decision = Decision::Approved(answer);
        {
            let state = lock(&self.inner.state);
            // Withdrawn or disconnected while the approval was written: its token reaches no one,
            // and the stored approval expires unused.
            let Some(entry) = state.requests.get(&id) else {
                return Err(ApproveError::NotPending);
            };
            entry.decision.send_replace(Some(decision));
        }
        self.record(ConfirmEvent {
            at_ms: now,
            kind: EventKind::Issued,
            tool: claims.tool,
            target: Some(claims.target),
            tenant: claims.tenant,
            nonce: Some(claims.nonce),
            plan: Some(claims.plan),
            note: None,
        });
        self.publish(QueueChange::Removed {
            id,
            reason: Removal::Approved,
        });
        Ok(())
    }

    /// Mints a token for `plan` of `tenant` under `class`, after storing the approved
    /// `arguments` (bound by their MAC) in `store`: the answer the waiting preflight gets, and
    /// what the token claims. Only a click reaches this: [`Engine::approve`], or a grant a click
    /// made (see the grant module).
    #[allow(clippy::too_many_arguments)]
    fn mint(
        &self,
        key: &SigningKey,
        store: &mut Store,
        tenant: &str,
        plan: &Plan,
        hash: PlanHash,
        class: GateClass,
        arguments: Map<String, Value>,
        now: u64,
    ) -> Result<(Answer, Claims), ApproveError> {
        let claims = Claims {
            tool: plan.tool.clone(),
            target: plan.target.clone(),
            plan: hash,
            tenant: tenant.to_owned(),
            iat: now,
            exp: now.saturating_add(self.token_ttl_ms()),
            nonce: Nonce::from_bytes(rand::random()),
        };
        let arguments = Value::Object(arguments);
        let approval = Approval {
            nonce: claims.nonce,
            tool: claims.tool.clone(),
            target: claims.target.clone(),
            tenant: claims.tenant.clone(),
            plan: claims.plan,
            mac: None,
            arguments,
            class,
            issued_at_ms: claims.iat,
            expires_at_ms: claims.exp,
        };
        let mac = binding::approval_mac(key, &bound_of(&approval)).map_err(|e| {
            ApproveError::Store(format!("the arguments have no canonical form: {e}"))
        })?;
        let approval = Approval {
            mac: Some(mac),
            ..approval
        };
        // The approved arguments are durable before the token exists: a token whose arguments
        // were lost could never execute what the person read.
        store
            .put_approval(&approval)
            .map_err(|e| ApproveError::Store(e.to_string()))?;
        let token = token::mint(key, &claims);
        // The lifetime shown is the token's own, not the setting read again.
        let ttl_ms = claims.exp - claims.iat;
        let text = render::preflight(plan, &token, ttl_ms, class);
        let answer = Answer::Approved {
            text,
            token: token.expose().to_owned(),
            target: claims.target.clone(),
            expires_at_ms: claims.exp,
            class,
        };
        Ok((answer, claims))
    }

    /// A person denied request `id`, with an optional note for the agent.
    pub fn deny(&self, id: u64, note: Option<&str>) -> Result<(), ApproveError> {
        let note = note
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_owned);
        let mut state = lock(&self.inner.state);
        let entry = state
            .requests
            .get(&id)
            .filter(|e| e.is_waiting() && !e.approving)
            .ok_or(ApproveError::NotPending)?;
        entry
            .decision
            .send_replace(Some(Decision::Denied { note: note.clone() }));
        let is_change = entry.is_change();
        let event = ConfirmEvent {
            at_ms: now_ms(),
            kind: EventKind::Denied,
            tool: entry.view.plan.tool.clone(),
            target: Some(entry.view.plan.target.clone()),
            tenant: entry.view.tenant.clone(),
            nonce: None,
            // A change has no plan a token could bind.
            plan: (!is_change).then_some(entry.view.plan_hash),
            note,
        };
        if is_change {
            // Nobody collects a change's denial from the queue: whoever waits on it already
            // holds the decision.
            state.requests.remove(&id);
        }
        drop(state);
        self.record(event);
        self.publish(QueueChange::Removed {
            id,
            reason: Removal::Denied,
        });
        Ok(())
    }

    /// Queues `change` for the person and waits for their decision. The same change (kind,
    /// subject and new text) proposed again while one waits re-attaches to it, so both callers
    /// get the one decision. Approving it mints nothing: it needs no signing key and no typed
    /// target, only the approve delay. The caller applies an approved change itself.
    ///
    /// Denied at once, with a note saying why, when the desk has no window (nobody could decide
    /// it) or [`MAX_PENDING_CHANGES`] changes already wait. A change whose caller stops waiting
    /// stays queued until it is decided or [withdrawn](Self::withdraw_change).
    pub async fn propose(&self, change: Change) -> ChangeDecision {
        let queued = {
            let mut state = lock(&self.inner.state);
            self.queue_change(&mut state, change, None)
        };
        let mut decision = match queued {
            Ok((decision, added)) => {
                if let Some(view) = added {
                    self.publish(QueueChange::Added {
                        request: Box::new(view),
                    });
                }
                decision
            }
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

    /// Records a change to the desk that took effect without a click, because none was needed:
    /// a new server name (it reaches no existing secret), or the person's own edit in the
    /// settings view. History shows it as `changed`, like an approved change, with `note` saying
    /// why no click was asked. Never pass a secret.
    pub fn record_change(&self, kind: ChangeKind, subject: &str, note: Option<String>) {
        self.record(ConfirmEvent {
            at_ms: now_ms(),
            kind: EventKind::Changed,
            tool: format!("change:{}", kind.code()),
            target: Some(subject.to_owned()),
            tenant: String::new(),
            nonce: None,
            plan: None,
            note,
        });
    }

    /// Withdraws the waiting changes of `kind` to `subject` (e.g. the registry file changed
    /// again, so what was proposed is no longer what would apply): whoever waits on one gets
    /// [`ChangeDecision::Withdrawn`].
    pub fn withdraw_change(&self, kind: ChangeKind, subject: &str) {
        let subject = change::cut(subject.to_owned(), change::MAX_CHANGE_LABEL_CHARS);
        let mut state = lock(&self.inner.state);
        let ids: Vec<u64> = state
            .requests
            .iter()
            .filter(|(_, e)| e.is_waiting() && !e.approving)
            .filter(|(_, e)| {
                e.view
                    .change
                    .as_ref()
                    .is_some_and(|c| c.kind == kind && c.subject == subject)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            state.requests.remove(id);
        }
        drop(state);
        for id in ids {
            self.publish(QueueChange::Removed {
                id,
                reason: Removal::Withdrawn,
            });
        }
    }

    /// Queues `change` (or finds the same one waiting). `repin`: for a tool, the pin approving
    /// it puts in force. The receiver sees the decision; the view is `Some` when the change is
    /// new, for the caller to publish once the lock is released.
    #[allow(clippy::type_complexity)]
    fn queue_change(
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
                && e.view.change.as_ref().is_some_and(|c| {
                    c.kind == change.kind && c.subject == change.subject && c.after == change.after
                })
        });
        if let Some(entry) = same {
            return Ok((entry.decision.subscribe(), None));
        }
        let (waiting, tools) = state
            .requests
            .values()
            .filter(|e| e.is_waiting())
            .filter_map(|e| e.view.change.as_ref())
            .fold((0, 0), |(all, tools), c| {
                (all + 1, tools + usize::from(c.kind == ChangeKind::Tool))
            });
        if change.kind == ChangeKind::Tool && tools >= change::MAX_PENDING_TOOL_CHANGES {
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
        // What names the change where a plan is expected (history, notifications): nothing is
        // ever minted for it.
        let plan = Plan {
            tool: format!("change:{}", change.kind.code()),
            target: change.subject.clone(),
            action: action.to_owned(),
            summary: change.summary.clone(),
            details: serde_json::json!({ "origin": change.origin }),
            reversible: true,
        };
        let plan_hash = plan.hash().unwrap_or(PlanHash::from_bytes([0; 32]));
        let view = PendingRequest {
            id,
            tenant: String::new(),
            client_info: Value::Null,
            server: repin.as_ref().map(|p| p.server.clone()).unwrap_or_default(),
            text: render::plan_text(&plan),
            plan,
            plan_hash,
            class: GateClass::Once,
            type_target: false,
            token_ttl_ms: 0,
            arrived_at_ms: now_ms(),
            change: Some(change),
            why: String::new(),
            preview: None,
        };
        let (sender, receiver) = watch::channel(None);
        state.requests.insert(
            id,
            Entry {
                view: view.clone(),
                arguments: Map::new(),
                decision: sender,
                approving: false,
                repin,
            },
        );
        Ok((receiver, Some(view)))
    }

    /// A person approved change request `id`: for a tool, its new definition is pinned (and
    /// calls of it pass from now on, on every connection that lists it); whoever proposed it is
    /// told. Nothing is minted.
    fn approve_change(&self, id: u64) -> Result<(), ApproveError> {
        let now = now_ms();
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
            (entry.view.clone(), entry.repin.clone())
        };
        if let Some(pin) = &repin {
            let pin = ToolPin {
                pinned_at_ms: now,
                ..pin.clone()
            };
            if let Err(e) = lock(&self.inner.store).repin(&pin) {
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
        });
        self.publish(QueueChange::Removed {
            id,
            reason: Removal::Approved,
        });
        Ok(())
    }

    /// A connection was accepted: assign its tenant. `server` is the upstream's identity as the
    /// desk established it (a registered name, `builtin:<path>`, a URL, or an ad-hoc command
    /// line): policy is keyed by it and the person sees it. The tenant is the desk's own, random.
    pub fn connect(&self, server: String) -> String {
        let tenant = format!("conn-{:016x}", rand::random::<u64>());
        let mut state = lock(&self.inner.state);
        state.servers.insert(tenant.clone(), server.clone());
        state.connections.insert(
            tenant.clone(),
            Connection {
                client_info: Value::Null,
                server,
                tools: HashMap::new(),
                own_turn: Arc::new(tokio::sync::Semaphore::new(1)),
            },
        );
        tenant
    }

    /// The agent of `tenant` said who it is (its MCP `clientInfo`): shown to the person as the
    /// agent's own claim, never used to decide anything.
    pub fn set_client_info(&self, tenant: &str, client_info: Value) {
        if let Some(conn) = lock(&self.inner.state).connections.get_mut(tenant) {
            conn.client_info = client_info;
        }
    }

    /// A gateway went away: its pending requests leave the queue, and its session grants end.
    pub fn disconnect(&self, tenant: &str) {
        self.end_session_grants(tenant);
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
            .filter(|(_, e)| e.view.tenant == tenant)
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
    pub fn register_tools(&self, tenant: &str, tools: Vec<Value>) -> Answer {
        let policy = self.policy();
        let Some(server) = lock(&self.inner.state)
            .connections
            .get(tenant)
            .map(|c| c.server.clone())
        else {
            return error(ErrorCode::NotIntroduced, "unknown connection");
        };
        // A name listed twice could be read one way and called the other: offer neither.
        let mut seen = HashMap::<&str, usize>::new();
        for tool in &tools {
            if let Some(name) = tool.get("name").and_then(Value::as_str) {
                *seen.entry(name).or_default() += 1;
            }
        }
        let now = now_ms();
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
        let (pins, store_failed) = match lock(&self.inner.store).pin_first_seen(&candidates) {
            Ok(pins) => (pins, false),
            Err(e) => {
                // Deny by default: with no pin to compare with, no tool counts as unchanged.
                tracing::error!(target: "desk", server = %server, error = %e, "could not read the pinned tool definitions: every tool is held back");
                (Vec::new(), true)
            }
        };
        let pinned: HashMap<&str, &ToolPin> = pins.iter().map(|p| (p.tool.as_str(), p)).collect();
        let mut held_back = Vec::new();
        let mut decisions = Vec::with_capacity(tools.len());
        let mut state = lock(&self.inner.state);
        let Some(conn) = state.connections.get_mut(tenant) else {
            return error(ErrorCode::NotIntroduced, "unknown connection");
        };
        conn.tools.clear();
        for tool in &tools {
            // A tool without a string name cannot be called by name: it is not offered.
            let Some(name) = tool.get("name").and_then(Value::as_str).map(str::to_owned) else {
                continue;
            };
            let rule = policy.rule(&conn.server, tool);
            let withheld = if seen.get(name.as_str()).copied().unwrap_or(0) > 1 {
                Some("the upstream lists more than one tool under this name".to_owned())
            } else if rule.class.is_gated() {
                policy::withheld_reason(tool)
            } else {
                None
            };
            let mut listed_as = None;
            if let Some(reason) = &withheld {
                tracing::warn!(target: "desk", server = %conn.server, tool = %name, "tool withheld: {reason}");
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
            // With the pins unreadable there is nothing to accept against: the tool stays held
            // back until they can be read.
            if store_failed {
                continue;
            }
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
        Answer::Classes { tools: decisions }
    }

    /// Waiting tool changes of `server` that no connection of it lists any more (the tool went
    /// back to its pinned definition, changed again, or went): accepting one would pin what no
    /// upstream of it offers.
    fn stale_tool_changes(state: &State, server: &str) -> Vec<u64> {
        state
            .requests
            .iter()
            .filter(|(_, e)| e.is_waiting() && !e.approving)
            .filter_map(|(id, e)| {
                let pin = e.repin.as_ref().filter(|p| p.server == server)?;
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
    /// tool is listed, and its definition is the pinned one. [`Answer::Done`] when it may; a
    /// refusal or an error (recorded in history) when it may not. The session asks before every
    /// open call it forwards.
    pub fn open_call(&self, tenant: &str, tool: &str) -> Answer {
        let found = {
            let state = lock(&self.inner.state);
            state
                .connections
                .get(tenant)
                .map(|c| c.tools.get(tool).map(|l| l.pinned))
        };
        match found {
            None => error(ErrorCode::NotIntroduced, "unknown connection"),
            Some(None) => {
                let message = format!("`{tool}` is not a tool this connection offers");
                self.rejected(tenant, tool, error(ErrorCode::UnknownTool, message))
            }
            Some(Some(false)) => self.tool_changed(tenant, tool),
            Some(Some(true)) => Answer::Done,
        }
    }

    /// A call of a tool whose definition differs from its pin: refused, and on the record.
    fn tool_changed(&self, tenant: &str, tool: &str) -> Answer {
        self.record(ConfirmEvent {
            at_ms: now_ms(),
            kind: EventKind::Refused {
                refusal: Refusal::ToolChanged,
            },
            tool: tool.to_owned(),
            target: None,
            tenant: tenant.to_owned(),
            nonce: None,
            plan: None,
            note: None,
        });
        refused(Refusal::ToolChanged)
    }

    /// A gated call of a registered tool of `tenant`, planned under its rule: the one place that
    /// turns a tool name and raw arguments into the plan a person approves (or an error reply).
    fn plan_call(&self, tenant: &str, tool: &str, arguments: &Value) -> Result<Call, Answer> {
        self.plan_held(tenant, tool, arguments, None)
    }

    /// [`Self::plan_call`], by a caller that may hold a turn to describe SQL (`turn`); without
    /// one, a call that needs describing takes a free turn (its connection's and the desk's) or
    /// is answered busy.
    fn plan_held(
        &self,
        tenant: &str,
        tool: &str,
        arguments: &Value,
        turn: Option<&preview::Turn>,
    ) -> Result<Call, Answer> {
        let (rule, client_info, server, own_turn) = {
            let state = lock(&self.inner.state);
            let conn = state
                .connections
                .get(tenant)
                .ok_or_else(|| error(ErrorCode::NotIntroduced, "unknown connection"))?;
            match conn.tools.get(tool) {
                // Recorded by the caller that refuses the call (a withdraw refuses nothing).
                Some(listed) if !listed.pinned => return Err(refused(Refusal::ToolChanged)),
                Some(Listed { rule, .. }) if rule.class.is_gated() => (
                    rule.clone(),
                    conn.client_info.clone(),
                    conn.server.clone(),
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
        let plan = self.described(&server, tool, &rule, &args, plan, turn)?;
        let hash = plan.hash().map_err(|e| bad(&e))?;
        Ok(Call {
            rule,
            client_info,
            server,
            args,
            fields,
            plan,
            hash,
        })
    }

    /// Why a new request of `tenant` cannot be queued, if it cannot: a refusal with a next move,
    /// never a silent drop.
    fn queue_full(state: &State, tenant: &str) -> Option<String> {
        // Changes to the desk are capped on their own (MAX_PENDING_CHANGES).
        let waiting = state
            .requests
            .values()
            .filter(|e| e.is_waiting() && !e.is_change());
        let (mine, all) = waiting.fold((0, 0), |(mine, all), e| {
            (mine + usize::from(e.view.tenant == tenant), all + 1)
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
    fn sweep(state: &mut State, now: u64, ttl: u64) {
        state.requests.retain(|_, e| match &*e.decision.borrow() {
            None => true,
            Some(Decision::Approved(Answer::Approved { expires_at_ms, .. })) => {
                *expires_at_ms > now
            }
            Some(Decision::Approved(_)) | Some(Decision::Changed) => false,
            Some(Decision::Denied { .. }) => e.view.arrived_at_ms.saturating_add(ttl) > now,
        });
    }

    /// A preflight: queue the plan (or re-attach to the same plan's request) and wait up to
    /// `wait` for a person's decision.
    pub async fn preflight(
        &self,
        tenant: &str,
        tool: &str,
        arguments: &Value,
        wait: Duration,
    ) -> Answer {
        let Call {
            rule,
            client_info,
            server,
            args,
            fields,
            plan,
            hash,
        } = match self.plan_aside(tenant, tool, arguments).await {
            Ok(call) => call,
            Err(response) => return self.rejected(tenant, tool, response),
        };
        if fields.is_confirm() {
            let answer = error(ErrorCode::BadArguments, "a confirm is not a preflight");
            return self.rejected(tenant, tool, answer);
        }
        if !self.inner.config.window {
            return Answer::Refused {
                refusal: Refusal::DeskUnavailable,
                message: HEADLESS.to_owned(),
            };
        }
        // A live grant a person's click made covers it: approved at once, a token of its own.
        if let Some(answer) = self.granted(tenant, &plan, hash, &args) {
            return answer;
        }
        let now = now_ms();
        let ttl = self.token_ttl_ms();
        let (id, mut decision) = {
            let mut state = lock(&self.inner.state);
            Self::sweep(&mut state, now, ttl);
            let existing = state
                .requests
                .iter()
                .find(|(_, e)| e.is_call(tenant, tool, hash));
            match existing {
                Some((id, entry)) => (*id, entry.decision.subscribe()),
                None => {
                    if let Some(full) = Self::queue_full(&state, tenant) {
                        drop(state);
                        return self.rejected(tenant, tool, error(ErrorCode::Busy, full));
                    }
                    let id = state.next_id;
                    state.next_id += 1;
                    let view = PendingRequest {
                        id,
                        tenant: tenant.to_owned(),
                        client_info,
                        server,
                        text: render::plan_text(&plan),
                        plan,
                        plan_hash: hash,
                        class: rule.class,
                        type_target: rule.type_target,
                        token_ttl_ms: ttl,
                        arrived_at_ms: now,
                        change: None,
                        why: rule.why.clone(),
                        preview: None,
                    };
                    let (sender, receiver) = watch::channel(None);
                    state.requests.insert(
                        id,
                        Entry {
                            view: view.clone(),
                            arguments: args,
                            decision: sender,
                            approving: false,
                            repin: None,
                        },
                    );
                    drop(state);
                    self.publish(QueueChange::Added {
                        request: Box::new(view),
                    });
                    (id, receiver)
                }
            }
        };
        let decided = tokio::time::timeout(wait, decision.wait_for(Option::is_some)).await;
        let decision = match decided {
            Ok(Ok(d)) => d.clone(),
            // Timed out: the request stays queued; calling again re-attaches to it.
            Err(_) => return refused(Refusal::Pending),
            // The request was withdrawn or its connection dropped while waiting.
            Ok(Err(_)) => return refused(Refusal::Pending),
        };
        // Collected: the decision has reached its agent, so the entry is done.
        lock(&self.inner.state).requests.remove(&id);
        match decision {
            Some(Decision::Approved(answer)) => answer,
            Some(Decision::Denied { note }) => {
                let message = match note {
                    Some(note) => format!("{} Their note: {note}", Refusal::Denied.next_move()),
                    None => Refusal::Denied.next_move().to_owned(),
                };
                Answer::Refused {
                    refusal: Refusal::Denied,
                    message,
                }
            }
            Some(Decision::Changed) | None => refused(Refusal::Pending),
        }
    }

    /// The agent cancelled a preflight: its request leaves the queue (if still undecided).
    pub fn withdraw(&self, tenant: &str, tool: &str, arguments: &Value) -> Answer {
        self.withdraw_planned(tenant, tool, self.plan_call(tenant, tool, arguments))
    }

    /// [`Self::withdraw`] of a call planned already. A call that cannot be described just now
    /// (its SQL met a lock or a time limit) withdraws nothing and says so: its request may wait.
    fn withdraw_planned(&self, tenant: &str, tool: &str, planned: Result<Call, Answer>) -> Answer {
        let hash = match planned {
            Ok(Call { hash, .. }) => hash,
            Err(
                answer @ Answer::Error {
                    code: ErrorCode::Busy,
                    ..
                },
            ) => return answer,
            // Nothing to withdraw from a call that could not have been queued.
            Err(_) => return Answer::Done,
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
        Answer::Done
    }

    /// For the 2026-07-28 flow: the plan hash of this call of `tenant`'s, and the id of its
    /// request in the queue (waiting, or decided and not yet collected), if one is there. `None`
    /// when the call cannot be planned (the preflight says why).
    pub fn queued(
        &self,
        tenant: &str,
        tool: &str,
        arguments: &Value,
    ) -> Option<(PlanHash, Option<u64>)> {
        self.queued_planned(tenant, tool, self.plan_call(tenant, tool, arguments))
    }

    /// [`Self::queued`] of a call planned already.
    fn queued_planned(
        &self,
        tenant: &str,
        tool: &str,
        planned: Result<Call, Answer>,
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

    /// Seals a 2026-07-28 `requestState` under a key derived from the signing secret for that
    /// purpose alone; `Err` says why there is no secret.
    pub fn seal_request_state(
        &self,
        claims: &countersign_core::request_state::StateClaims,
    ) -> Result<String, String> {
        let key = self.key()?;
        Ok(countersign_core::request_state::seal(&key, claims))
    }

    /// Opens a `requestState` the agent sent back: sealed by this desk's current key as it is,
    /// and not expired. The outer `Err` says why there is no secret.
    pub fn open_request_state(
        &self,
        text: &str,
    ) -> Result<
        Result<
            countersign_core::request_state::StateClaims,
            countersign_core::request_state::StateError,
        >,
        String,
    > {
        let key = self.key()?;
        Ok(countersign_core::request_state::open(&key, text, now_ms()))
    }

    /// Whether `tenant` used up the `requestState` whose nonce is `nonce`.
    pub fn request_state_used(&self, tenant: &str, nonce: &Nonce) -> bool {
        lock(&self.inner.state)
            .spent_states
            .get(tenant)
            .is_some_and(|spent| spent.contains_key(nonce))
    }

    /// Uses up `tenant`'s `requestState` (its nonce, until its expiry `exp`): `false` when it was
    /// used before, when [`MAX_SPENT_STATES`] unexpired ones are kept already (nothing is
    /// forgotten early), or when the connection is gone.
    pub fn spend_request_state(&self, tenant: &str, nonce: Nonce, exp: u64) -> bool {
        let now = now_ms();
        let mut state = lock(&self.inner.state);
        if !state.connections.contains_key(tenant) {
            return false;
        }
        let spent = state.spent_states.entry(tenant.to_owned()).or_default();
        if spent.contains_key(&nonce) {
            return false;
        }
        if spent.len() >= MAX_SPENT_STATES {
            spent.retain(|_, until| *until > now);
            if spent.len() >= MAX_SPENT_STATES {
                return false;
            }
        }
        spent.insert(nonce, exp);
        true
    }

    /// A confirm: verify it in the seed's order, spend the nonce for single-use tools, and hand
    /// back the arguments the person approved.
    pub fn confirm(&self, tenant: &str, tool: &str, arguments: &Value) -> Answer {
        self.confirm_planned(tenant, tool, self.plan_call(tenant, tool, arguments))
    }

    /// [`Self::confirm`] of a call planned already (its description comes first, before any
    /// verification: a confirm that cannot be described now is refused and spends nothing).
    fn confirm_planned(&self, tenant: &str, tool: &str, planned: Result<Call, Answer>) -> Answer {
        let Call {
            rule,
            fields,
            plan,
            hash,
            ..
        } = match planned {
            Ok(call) => call,
            Err(response) => return self.rejected(tenant, tool, response),
        };
        let key = match self.key() {
            Ok(key) => key,
            Err(why) => return self.rejected(tenant, tool, error(ErrorCode::NoSecret, why)),
        };
        let key = &key;
        let now = now_ms();
        let confirm = Confirm {
            token: fields.token.as_deref(),
            confirm_target: fields.target.as_deref(),
            tenant,
            tool,
            target: &plan.target,
            plan: hash,
        };
        // What the token approved, read once, and only for a token whose signature holds (a
        // forged token never reaches the database). The row is never rewritten, so reading it
        // before the spend reads what the spend will cover.
        let approved = fields
            .token
            .as_deref()
            .and_then(|t| token::decode(key, t).ok())
            .map(|claims| lock(&self.inner.store).approval(&claims.nonce));
        // Whether the approval can run at all: read, bound by its MAC, for this plan. Anything
        // else is known before the spend, so the nonce is not spent for it: a refusal that says
        // "retry" must find the approval still usable.
        let usable: Result<Approval, Refusal> = match approved {
            // No token, or one that does not decode: the chain refuses it before any of this.
            None => Err(Refusal::BadToken),
            Some(Err(_)) => Err(Refusal::LedgerUnreachable),
            // Genuine but gone (pruned, or a store that was replaced): nothing may run that the
            // person did not read.
            Some(Ok(None)) => Err(Refusal::PlanChanged),
            Some(Ok(Some(approval))) if approval.plan != hash => Err(Refusal::PlanChanged),
            Some(Ok(Some(approval))) if !Self::bound(key, &approval) => {
                Err(Refusal::ApprovalAltered)
            }
            Some(Ok(Some(approval))) => Ok(approval),
        };
        // It counts under the stricter of the class it was made under and the tool's class now:
        // an upstream that re-lists a tool as idempotent after the click must not turn a
        // works-once approval into a reusable one. Nothing is spent for an approval that cannot
        // run (the chain still checks everything else, in order).
        let single_use = usable.is_ok()
            && (rule.class.is_single_use()
                || usable.as_ref().is_ok_and(|a| a.class.is_single_use()));
        let verdict = {
            let mut store = lock(&self.inner.store);
            verify::verify(key, &confirm, single_use, now, &mut *store)
        };
        let event = |kind, claims: Option<&Claims>| ConfirmEvent {
            at_ms: now,
            kind,
            tool: tool.to_owned(),
            target: Some(plan.target.clone()),
            tenant: tenant.to_owned(),
            nonce: claims.map(|c| c.nonce),
            plan: Some(hash),
            note: None,
        };
        let claims = match verdict {
            Err(rejected) => {
                self.record(event(
                    EventKind::for_refusal(rejected.refusal),
                    rejected.claims.as_deref(),
                ));
                return refused(rejected.refusal);
            }
            Ok(claims) => claims,
        };
        match usable {
            Ok(approval) => {
                self.record(event(EventKind::Accepted, Some(&claims)));
                *lock(&self.inner.state)
                    .awaiting_outcome
                    .entry((tenant.to_owned(), claims.nonce))
                    .or_default() += 1;
                Answer::Accepted {
                    arguments: approval.arguments,
                    nonce: claims.nonce.to_hex(),
                }
            }
            Err(refusal) => {
                if refusal == Refusal::ApprovalAltered {
                    tracing::error!(target: "desk", nonce = %claims.nonce.to_hex(), "an approval in the store does not carry its MAC: refused");
                }
                self.record(event(EventKind::Refused { refusal }, Some(&claims)));
                refused(refusal)
            }
        }
    }

    /// Whether `approval` carries the MAC the desk gave it when the person clicked.
    fn bound(key: &SigningKey, approval: &Approval) -> bool {
        approval
            .mac
            .is_some_and(|mac| binding::approval_mac_matches(key, &bound_of(approval), &mac))
    }

    /// What became of an accepted call: one outcome per acceptance, from the connection it was
    /// accepted on.
    pub fn outcome(&self, tenant: &str, nonce: &str, ok: bool, note: Option<String>) -> Answer {
        let Some(nonce) = Nonce::from_hex(nonce) else {
            return error(ErrorCode::BadArguments, "nonce: 32 lowercase hex digits");
        };
        {
            let mut state = lock(&self.inner.state);
            let key = (tenant.to_owned(), nonce);
            match state.awaiting_outcome.get_mut(&key) {
                Some(n) if *n > 1 => *n -= 1,
                Some(_) => {
                    state.awaiting_outcome.remove(&key);
                }
                None => {
                    return error(
                        ErrorCode::BadArguments,
                        "no accepted call of this connection awaits an outcome under this nonce",
                    );
                }
            }
        }
        let approval = lock(&self.inner.store).approval(&nonce).ok().flatten();
        let (tool, target, plan) = match approval {
            Some(a) => (a.tool, Some(a.target), Some(a.plan)),
            None => (String::new(), None, None),
        };
        self.record(ConfirmEvent {
            at_ms: now_ms(),
            kind: EventKind::Executed { ok },
            tool,
            target,
            tenant: tenant.to_owned(),
            nonce: Some(nonce),
            plan,
            note,
        });
        Answer::Done
    }
}
