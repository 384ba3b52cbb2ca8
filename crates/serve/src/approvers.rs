//! The approver listener: where people's desks connect to see this server's waiting calls and
//! send their decisions.
//!
//! Nothing an agent holds opens it. The listener speaks mutual TLS only, and a client is let in
//! only with a certificate whose key is a registered, unrevoked approver's Ed25519 key (a desk
//! makes a self-signed certificate of its approver key; the team registers the key with
//! `countersign serve approver add`). No bearer token is read here at all.
//!
//! A decision counts only when it is signed: the desk signs what the person read (the request,
//! its plan hash, tenant, tool, target, class, and until when the decision holds) with the same
//! key, over the name of this server (`--approver-url`). The server checks the signature against
//! the key of the connection it came on and that key's current registration, checks every
//! signed field against the waiting request, and keeps the decision in its records before the
//! engine mints anything. Policy may ask for several distinct approvers (`approvers = M`); the
//! token is minted when the M-th approval arrives. One deny ends the request.

use countersign_core::Tenant;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Extension;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use axum::routing::{get, post};
use base64::Engine as _;
use countersign_core::approver::{self, BadDecision, CHANGE_TENANT, Decision, Verdict};
use countersign_core::{GateClass, PlanHash};
use countersign_engine::{
    ApproveError, Asks, ChangeKind, Engine, PendingRequest, QueueChange, Removal, SharedFate,
    SharedRequests,
};
use countersign_store::{
    DecisionRecord, Evidence, MAX_WAITING_ROWS, Records, Roster, SharedRow, StoreError, WaitingCall,
};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::http::{json_response, refuse};

/// Where a desk reads the waiting calls.
pub const REQUESTS_PATH: &str = "/approver/v1/requests";

/// Where a desk sends a signed decision.
pub const DECISIONS_PATH: &str = "/approver/v1/decisions";

/// The longest a decision may stay good for: one signed for later is refused.
pub const MAX_DECISION_TTL_MS: u64 = 10 * 60 * 1_000;

/// The longest a desk's read of the waiting calls is held open waiting for a change.
pub const MAX_WAIT: Duration = Duration::from_secs(25);

/// The largest decision accepted, in bytes.
pub const MAX_DECISION_BYTES: usize = 16 * 1024;

/// The longest note a deny may carry to the agent, in characters.
pub const MAX_NOTE_CHARS: usize = 500;

/// How often the keys the TLS layer lets in are read again from the records (a revocation also
/// takes effect at once for decisions: each is checked against the records themselves).
pub const REFRESH: Duration = Duration::from_secs(2);

/// The public key of the approver a connection was made with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub [u8; 32]);

/// The Ed25519 public key a DER certificate is for, if it is an Ed25519 certificate.
pub fn ed25519_key(cert: &CertificateDer<'_>) -> Option<[u8; 32]> {
    // SubjectPublicKeyInfo of an Ed25519 key (RFC 8410): SEQUENCE { SEQUENCE { OID 1.3.101.112 },
    // BIT STRING (0 unused bits) key }.
    const PREFIX: [u8; 12] = [
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    let parsed = webpki::EndEntityCert::try_from(cert).ok()?;
    let spki = parsed.subject_public_key_info();
    let key = spki.as_ref().strip_prefix(&PREFIX[..])?;
    key.try_into().ok()
}

/// The keys the listener lets in: registered, unrevoked approvers', by key.
pub type Admitted = Arc<RwLock<HashMap<[u8; 32], String>>>;

/// rustls's check of a desk's certificate: its key must be an admitted approver's, and the
/// handshake must be signed with it (which proves the desk holds the private key). The
/// certificate's issuer and dates are not the trust: the key is.
#[derive(Debug)]
pub struct PinnedApprovers {
    admitted: Admitted,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl PinnedApprovers {
    /// Lets in the keys in `admitted`, as it is at each handshake.
    pub fn new(admitted: Admitted) -> Self {
        PinnedApprovers {
            admitted,
            algorithms: rustls::crypto::ring::default_provider().signature_verification_algorithms,
        }
    }
}

impl ClientCertVerifier for PinnedApprovers {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let refused = || {
            rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            )
        };
        let key = ed25519_key(end_entity).ok_or_else(refused)?;
        let admitted = self.admitted.read().unwrap_or_else(|p| p.into_inner());
        if admitted.contains_key(&key) {
            Ok(ClientCertVerified::assertion())
        } else {
            tracing::warn!(target: "approvers", key = %approver::public_key_text(&key), "a desk whose key is not a registered approver's was refused");
            Err(refused())
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }
}

/// Reads the admitted keys from `records` into `admitted`. A read that fails keeps the last keys
/// (and says so).
pub async fn refresh(records: &Arc<dyn Records>, admitted: &Admitted) {
    match records.members(Roster::Approvers).await {
        Ok(members) => {
            let keys = members
                .into_iter()
                .filter(|m| m.is_active())
                .map(|m| (m.key, m.name))
                .collect();
            *admitted.write().unwrap_or_else(|p| p.into_inner()) = keys;
        }
        Err(e) => tracing::warn!(target: "approvers", error = %e, "cannot read the approvers"),
    }
}

/// [`refresh`] every [`REFRESH`], until the task is dropped.
pub async fn keep_admitted(records: Arc<dyn Records>, admitted: Admitted) {
    loop {
        tokio::time::sleep(REFRESH).await;
        refresh(&records, &admitted).await;
    }
}

/// How long a replica's waiting calls stay in desks' sight without the replica saying it lives.
pub const LIVENESS: Duration = Duration::from_secs(10);

/// How long a call that left desks' sight stays on record before it is pruned.
pub const PRUNE_AFTER: Duration = Duration::from_secs(3600);

/// How long after a call's row left desks' sight (its replica died) the same call asked again on
/// another replica still finds that row, and brings it back under its number: as long as a
/// request whose agent stopped waiting stays in a queue.
pub const ADOPT_WITHIN: Duration =
    Duration::from_millis(countersign_engine::STOPPED_WAITING_GRACE_MS);

/// How often a replica reads the decisions on its calls (made on any replica): one indexed read
/// of the rows its waiting calls are linked to, and none while no call waits here. What bounds
/// the time from a decision on another replica to the waiting agent's answer.
pub const DECISIONS_EVERY: Duration = Duration::from_millis(40);

/// How often a desk's held read looks for changes made on other replicas.
const OTHERS_EVERY: Duration = Duration::from_millis(500);

/// What the shared records keep of a request waiting here.
struct Shared {
    tenant: String,
    plan: PlanHash,
    approvers: u8,
    json: String,
}

/// A call waiting here, and the shared row its decision comes on.
#[derive(Debug, Clone)]
struct Link {
    /// The row's number.
    row: u64,
    /// Whether the row is this replica's own.
    owned: bool,
    /// Whether it is a change of the rules ([`crate::rules`]), not a call.
    change: bool,
    /// The call's target (an approval here types it, as the person did at the desk).
    target: String,
}

/// What the approver listener serves.
pub struct Approvers {
    /// The authority whose requests wait here.
    pub engine: Engine,
    /// The records: approvers, decisions, and the calls waiting on every replica.
    pub records: Arc<dyn Records>,
    /// This server's name in decisions: its `--approver-url` (the same on every replica).
    pub server: String,
    /// This replica, among the server's.
    pub replica: String,
    /// How many distinct approvers a change of the rules needs (`--rules-approvers`).
    pub rules_approvers: u8,
    /// Each local waiting call's shared row, by local id. Held while a call is shared, so the
    /// mirror and a `requestState` being sealed never share one call twice.
    links: tokio::sync::Mutex<HashMap<u64, Link>>,
    /// Told when a verdict was put on a shared row here: the mirror carries it out at once
    /// instead of at its next reading (a verdict given on another replica is read then).
    decided_here: tokio::sync::Notify,
}

impl Approvers {
    /// The listener's state, for a replica named at random.
    pub fn new(engine: Engine, records: Arc<dyn Records>, server: String) -> Self {
        let replica: [u8; 8] = rand::random();
        Approvers {
            engine,
            records,
            server,
            replica: replica.iter().map(|b| format!("{b:02x}")).collect(),
            rules_approvers: 1,
            links: tokio::sync::Mutex::new(HashMap::new()),
            decided_here: tokio::sync::Notify::new(),
        }
    }

    /// The calls waiting on every replica, as a desk sees them (each under its shared number),
    /// and a digest that changes whenever they do.
    async fn waiting(&self) -> Result<(Vec<Value>, String), StoreError> {
        let now = self.engine.now_ms();
        let rows = self.records.waiting_calls(&self.server, now).await?;
        let mut requests = Vec::with_capacity(rows.len());
        for row in rows {
            let Ok(mut request) = serde_json::from_str::<Value>(&row.request) else {
                continue;
            };
            request["id"] = json!(row.id);
            let by = self
                .records
                .approved_by(&self.server, row.id, &row.plan)
                .await?;
            requests.push(json!({ "request": request, "approvedBy": by }));
        }
        let digest = Sha256::digest(serde_json::to_vec(&requests).unwrap_or_default());
        Ok((requests, hex16(&digest)))
    }

    /// Keeps this replica's waiting calls in the shared records, and carries out the decisions
    /// made on them on any replica, for as long as the engine lives.
    ///
    /// Each local waiting call is linked to one shared row: its own, or (an agent asking again
    /// on this replica for a call another replica already shares) that replica's. An approval
    /// is minted by exactly one replica, one where the agent waits now (it claims the mint in
    /// the records); a deny is carried out wherever the call waits.
    pub async fn mirror(self: Arc<Self>) {
        let mut changes = self.engine.subscribe();
        let mut decisions = tokio::time::interval(DECISIONS_EVERY);
        // A slow read is not followed by a burst of them.
        decisions.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut alive = tokio::time::interval(LIVENESS / 3);
        loop {
            tokio::select! {
                change = changes.recv() => match change {
                    Ok(QueueChange::Added { request }) => {
                        self.share(&request, &mut *self.links.lock().await).await;
                    }
                    Ok(QueueChange::Removed { id, reason }) => {
                        let gone = self.links.lock().await.remove(&id);
                        // Withdrawn (its agent's grace ran out here, or it declined): the agent
                        // may be waiting for the same call on another replica, which keeps the
                        // row in sight; unkept, it lapses within LIVENESS. Anything else that
                        // leaves here was decided: its row goes.
                        if let Some(link) = gone
                            && link.owned
                            && reason != Removal::Withdrawn
                            && let Err(e) = self.records.remove_waiting(&self.replica, id).await
                        {
                            tracing::warn!(target: "approvers", error = %e, "a call that left still shows to desks until it expires");
                        }
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        // Missed some: share whatever waits and is not shared yet.
                        let mut links = self.links.lock().await;
                        for request in self.engine.pending() {
                            self.share(&request, &mut links).await;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
                _ = decisions.tick() => self.carry_out().await,
                () = self.decided_here.notified() => self.carry_out().await,
                _ = alive.tick() => {
                    // Every row a call here is linked to, this replica's or another's (whose
                    // replica may have died while its agent asked again here): while a live
                    // replica holds a call, desks see it.
                    let rows: Vec<u64> = {
                        let links = self.links.lock().await;
                        let mut rows: Vec<u64> = links.values().map(|link| link.row).collect();
                        rows.sort_unstable();
                        rows.dedup();
                        rows
                    };
                    let until = self.engine.now_ms().saturating_add(LIVENESS.as_millis() as u64);
                    for chunk in rows.chunks(MAX_WAITING_ROWS) {
                        if let Err(e) = self.records.keep_waiting(chunk, until).await {
                            tracing::warn!(target: "approvers", error = %e, "cannot keep this replica's calls in sight");
                        }
                    }
                    // Calls out of sight for an hour (decided, or their replica gone) go.
                    let before = self.engine.now_ms().saturating_sub(PRUNE_AFTER.as_millis() as u64);
                    if let Err(e) = self.records.prune_waiting(before).await {
                        tracing::debug!(target: "approvers", error = %e, "cannot prune the waiting calls");
                    }
                }
            }
        }
    }

    /// Links `request` (a call, or a rules change) to a shared row, once: one already shared by
    /// another replica for the same tenant and plan (the agent asked again here; both replicas
    /// saw one edit of the rules file), or a new one of this replica. Which, the records decide
    /// in one upsert, so replicas sharing at the same moment meet on one row.
    ///
    /// The other replica may have died meanwhile (the reason its agent asked again here): its
    /// row is found even if it lapsed from desks' sight within [`ADOPT_WITHIN`], under the same
    /// number, and kept in sight from now on by this replica, which holds the call.
    async fn share(&self, request: &PendingRequest, links: &mut HashMap<u64, Link>) {
        if links.contains_key(&request.id) {
            return;
        }
        let Some(shared) = self.shareable(request) else {
            return;
        };
        let change = request.change().is_some();
        let now = self.engine.now_ms();
        let row = WaitingCall {
            id: 0,
            replica: self.replica.clone(),
            local_id: request.id,
            server: self.server.clone(),
            tenant: shared.tenant,
            plan: shared.plan,
            request: shared.json,
            approvers: shared.approvers,
            arrived_at_ms: request.arrived_at_ms,
            expires_at_ms: now.saturating_add(LIVENESS.as_millis() as u64),
            verdict: None,
            note: None,
            minted_by: None,
        };
        let since = now.saturating_sub(ADOPT_WITHIN.as_millis() as u64);
        // One upsert writes the call or joins the row of the same call already shared (the
        // agent asked again here; another replica proposed the same rules change at the same
        // moment), so one call never has two rows whose approvals would count apart.
        let (row, owned) = match self.records.share_waiting(&row, since).await {
            Ok(SharedRow::New(id)) => (id, true),
            Ok(SharedRow::Joined(row)) => (row.id, false),
            Err(e) => {
                tracing::warn!(target: "approvers", error = %e, "a waiting call could not be shared: desks do not see it");
                return;
            }
        };
        if change {
            // Rare (an edit of the rules file), and what an operator looks for when two replicas
            // saw one edit: the same number on both.
            let how = if owned { "shared" } else { "joined" };
            tracing::info!(target: "approvers", "a rules change waits for the approvers as request {row} ({how})");
        }
        links.insert(
            request.id,
            Link {
                row,
                owned,
                change,
                target: request.plan.target.clone(),
            },
        );
    }

    /// What of `request` the shared records keep, if it is shared at all: a call; or a change of
    /// the rules, listed with what a decision on a call carries (its tenant [`CHANGE_TENANT`],
    /// its plan's hash, which names both texts by hash, class `once`, no typed target, and
    /// `--rules-approvers`), so desks and the page decide it with the same signed decision. The
    /// engine's other changes (a tool's definition) are not the approvers' to decide.
    fn shareable(&self, request: &PendingRequest) -> Option<Shared> {
        match &request.asks {
            Asks::Call(call) => Some(Shared {
                tenant: call.tenant.to_string(),
                plan: call.plan_hash,
                approvers: call.approvers.max(1),
                json: serde_json::to_string(request).ok()?,
            }),
            Asks::Change(asked)
                if asked.change.kind == ChangeKind::Policy
                    && asked.change.subject == crate::rules::RECORD =>
            {
                let plan = request.plan.hash().ok()?;
                let approvers = self.rules_approvers.clamp(1, 9);
                let mut json = serde_json::to_value(request).ok()?;
                let asks = json.get_mut("asks")?.as_object_mut()?;
                asks.insert("tenant".into(), json!(CHANGE_TENANT));
                asks.insert("plan_hash".into(), json!(plan.to_hex()));
                asks.insert("class".into(), json!(GateClass::Once.code()));
                asks.insert("type_target".into(), json!(false));
                asks.insert("approvers".into(), json!(approvers));
                Some(Shared {
                    tenant: CHANGE_TENANT.to_owned(),
                    plan,
                    approvers,
                    json: json.to_string(),
                })
            }
            Asks::Change(_) => None,
        }
    }

    /// Carries out, here, the decisions made on any replica on the calls waiting here.
    async fn carry_out(&self) {
        let linked: Vec<(u64, Link)> = {
            let links = self.links.lock().await;
            links.iter().map(|(l, k)| (*l, k.clone())).collect()
        };
        if linked.is_empty() {
            return;
        }
        // One read for the calls waiting here (one per thousand of them), not one per call.
        let numbers: Vec<u64> = linked.iter().map(|(_, link)| link.row).collect();
        let mut rows: HashMap<u64, WaitingCall> = HashMap::with_capacity(numbers.len());
        for chunk in numbers.chunks(MAX_WAITING_ROWS) {
            match self.records.waiting_calls_by_id(chunk).await {
                Ok(read) => rows.extend(read.into_iter().map(|row| (row.id, row))),
                Err(e) => {
                    tracing::debug!(target: "approvers", error = %e, "cannot read the decisions");
                    return;
                }
            }
        }
        for (local, link) in linked {
            // Several local calls may share a row (asked again here): each reads it.
            let row = rows.get(&link.row).cloned();
            let done = match row {
                Some(row) => match row.verdict {
                    None => continue,
                    Some(Verdict::Deny) => Some(self.engine.deny(local, row.note.as_deref()).await),
                    // Minted where an agent waits now, by one replica only.
                    Some(Verdict::Approve) if row.minted_by.is_none() => {
                        if !self.engine.awaited(local) {
                            continue;
                        }
                        match self.records.claim_mint(row.id, &self.replica).await {
                            Ok(true) => {
                                let approved = self.engine.approve(local, Some(&link.target)).await;
                                let _ = self.records.forget_waiting(row.id).await;
                                Some(approved)
                            }
                            Ok(false) => continue,
                            Err(e) => {
                                tracing::warn!(target: "approvers", error = %e, "cannot claim an approval");
                                continue;
                            }
                        }
                    }
                    // Minted on another replica, for the agent that waited there; a change
                    // applied there (the record has it; this replica reads it from there).
                    Some(Verdict::Approve) => Some(self.elsewhere(local, &link)),
                },
                // Gone: its token was minted elsewhere (the minter forgets the row).
                None => Some(self.elsewhere(local, &link)),
            };
            // A denied row stays (out of desks' sight) until it expires, for the other
            // replicas where the call waits to read its note; pruned later.
            self.links.lock().await.remove(&local);
            if let Some(Err(e)) = done {
                tracing::debug!(target: "approvers", request = link.row, code = e.code(), "a decision was not carried out here: {e}");
            }
        }
    }

    /// Request `local`, linked by `link`, was carried out on another replica: a call's token
    /// minted there, a change applied there.
    fn elsewhere(&self, local: u64, link: &Link) -> Result<(), ApproveError> {
        if link.change {
            // This change alone: another change of the rules may wait here beside it (the file
            // was edited again), which the decision on this one says nothing about.
            return self.engine.withdraw_change_request(local);
        }
        self.engine.taken_elsewhere(local)
    }

    /// The approvers whose approvals of call `row` over `plan` count now: each person once, and
    /// only while they are on the roster (a desk key or a passkey not revoked). An approval by
    /// someone revoked since stops counting toward the call's M.
    async fn counted(&self, row: u64, plan: &PlanHash) -> Result<Vec<String>, StoreError> {
        let by = self.records.approved_by(&self.server, row, plan).await?;
        if by.is_empty() {
            return Ok(by);
        }
        let desks = self.records.members(Roster::Approvers).await?;
        let passkeys = self.records.passkeys().await?;
        Ok(by
            .into_iter()
            .filter(|name| {
                desks.iter().any(|m| &m.name == name && m.is_active())
                    || passkeys
                        .iter()
                        .any(|p| &p.approver == name && p.is_active())
            })
            .collect())
    }

    /// The approver on the records for `peer`, if it is still active.
    async fn approver(&self, peer: Peer) -> Result<String, Response> {
        match self.records.member(Roster::Approvers, &peer.0).await {
            Ok(Some(m)) if m.is_active() => Ok(m.name),
            Ok(_) => Err(refuse(
                StatusCode::FORBIDDEN,
                "approver_revoked",
                "this desk's key is not a registered approver's (revoked, or never added): \
                 nothing it sends counts",
            )),
            Err(e) => {
                tracing::warn!(target: "approvers", error = %e, "cannot read the approvers");
                Err(refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "records_unavailable",
                    "the server cannot read its approvers now; nothing was decided. Try again.",
                ))
            }
        }
    }
}

/// A `requestState` a 2026-07-28 client gets on one replica names the call's shared row, so its
/// retry continues on whichever replica it lands.
#[async_trait::async_trait]
impl SharedRequests for Approvers {
    async fn number(&self, local: u64) -> Option<u64> {
        let mut links = self.links.lock().await;
        if !links.contains_key(&local) {
            let request = self.engine.pending().into_iter().find(|r| r.id == local)?;
            self.share(&request, &mut links).await;
        }
        links.get(&local).map(|link| link.row)
    }

    async fn fate(&self, number: u64, tenant: &Tenant, plan: &PlanHash) -> SharedFate {
        let row = match self.records.waiting_call(number).await {
            Ok(row) => row,
            Err(e) => {
                tracing::warn!(target: "approvers", error = %e, "cannot read a shared call for a requestState");
                return SharedFate::Unreachable;
            }
        };
        let now = self.engine.now_ms();
        match row {
            Some(row)
                if row.server == self.server
                    && row.tenant == tenant.as_str()
                    && &row.plan == plan =>
            {
                match row.verdict {
                    Some(Verdict::Deny) => SharedFate::Denied { note: row.note },
                    _ if row.expires_at_ms <= now || row.minted_by.is_some() => SharedFate::Gone,
                    _ => SharedFate::Waiting,
                }
            }
            _ => SharedFate::Gone,
        }
    }
}

fn hex16(bytes: &[u8]) -> String {
    bytes[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The listener's routes; each request carries the connection's [`Peer`].
pub fn router(approvers: Arc<Approvers>) -> Router {
    Router::new()
        .route(REQUESTS_PATH, get(requests))
        .route(DECISIONS_PATH, post(decide))
        .with_state(approvers)
}

/// `GET /approver/v1/requests[?wait=SECONDS&seen=DIGEST]`: the waiting calls. With `seen` equal
/// to the current digest and a `wait`, the answer waits (at most [`MAX_WAIT`]) until they change.
async fn requests(
    State(a): State<Arc<Approvers>>,
    Extension(peer): Extension<Peer>,
    uri: Uri,
) -> Response {
    if let Err(refused) = a.approver(peer).await {
        return refused;
    }
    let (mut wait, mut seen) = (Duration::ZERO, None);
    for pair in uri.query().unwrap_or_default().split('&') {
        match pair.split_once('=') {
            Some(("wait", n)) => {
                wait = Duration::from_secs(n.parse().unwrap_or(0)).min(MAX_WAIT);
            }
            Some(("seen", d)) => seen = Some(d.to_owned()),
            _ => {}
        }
    }
    let deadline = tokio::time::Instant::now() + wait;
    let (list, digest) = loop {
        // Subscribed before the look: a change here between the look and the wait is not
        // missed; a change on another replica is seen at the next look.
        let mut changes = a.engine.subscribe();
        let (list, digest) = match a.waiting().await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(target: "approvers", error = %e, "cannot read the waiting calls");
                return refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "records_unavailable",
                    "the server cannot read its waiting calls now; ask again",
                );
            }
        };
        if seen.as_deref() != Some(digest.as_str()) || tokio::time::Instant::now() >= deadline {
            break (list, digest);
        }
        let next = (tokio::time::Instant::now() + OTHERS_EVERY).min(deadline);
        let _ = tokio::time::timeout_at(next, changes.recv()).await;
    };
    json_response(
        StatusCode::OK,
        &json!({ "server": a.server, "digest": digest, "requests": list }),
    )
}

/// A decision as a desk sends it: the signed fields, the signature, and a deny's note.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Sent {
    request: u64,
    verdict: String,
    plan: String,
    tenant: String,
    tool: String,
    target: String,
    class: String,
    expires_at_ms: u64,
    #[serde(default)]
    signature: Option<String>,
    #[serde(default)]
    note: Option<String>,
}

fn bad(code: &str, message: &str) -> Response {
    refuse(StatusCode::BAD_REQUEST, code, message)
}

/// `POST /approver/v1/decisions`: one signed decision.
async fn decide(
    State(a): State<Arc<Approvers>>,
    Extension(peer): Extension<Peer>,
    body: Bytes,
) -> Response {
    if body.len() > MAX_DECISION_BYTES {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            "a decision is a few hundred bytes",
        );
    }
    let Ok(sent) = serde_json::from_slice::<Sent>(&body) else {
        return bad(
            "malformed",
            "not a decision: {request, verdict, plan, tenant, tool, target, class, expiresAtMs, \
             signature[, note]}",
        );
    };
    let Some(signature) = sent.signature.as_deref() else {
        return bad(
            "unsigned",
            "the decision is not signed: nothing was decided",
        );
    };
    let Some(signature) = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(signature)
        .ok()
        .and_then(|s| <[u8; 64]>::try_from(s).ok())
    else {
        return bad(
            "unsigned",
            "the signature is not 64 bytes of base64url: nothing was decided",
        );
    };
    let verdict = match sent.verdict.as_str() {
        "approve" => Verdict::Approve,
        "deny" => Verdict::Deny,
        _ => return bad("malformed", "verdict is approve or deny"),
    };
    let (Some(plan), Some(class)) = (
        PlanHash::from_hex(&sent.plan),
        GateClass::from_code(&sent.class),
    ) else {
        return bad("malformed", "plan is 64 hex digits; class is token or once");
    };
    let note = sent.note.as_deref().map(str::trim).unwrap_or_default();
    if note.chars().count() > MAX_NOTE_CHARS {
        return bad("malformed", "a deny's note is at most 500 characters");
    }
    let name = match a.approver(peer).await {
        Ok(name) => name,
        Err(refused) => return refused,
    };
    let decision = Decision {
        server: &a.server,
        request: sent.request,
        verdict,
        plan: &plan,
        tenant: &sent.tenant,
        tool: &sent.tool,
        target: &sent.target,
        class,
        expires_at_ms: sent.expires_at_ms,
    };
    let now = a.engine.now_ms();
    // The connection's own key: a signature by any other key (another approver's, or none
    // registered) is worth nothing on it.
    if let Err(why) = approver::verify(&peer.0, &decision, &signature, now) {
        tracing::warn!(target: "approvers", approver = %name, request = sent.request, code = why.code(), "a decision was refused");
        let status = match why {
            BadDecision::Expired => StatusCode::CONFLICT,
            BadDecision::BadKey | BadDecision::BadSignature => StatusCode::FORBIDDEN,
        };
        return refuse(status, why.code(), &format!("{why}: nothing was decided"));
    }
    if sent.expires_at_ms > now.saturating_add(MAX_DECISION_TTL_MS) {
        return bad(
            "expires_too_late",
            "a decision holds for at most 10 minutes: nothing was decided",
        );
    }
    a.accept(&name, &decision, Evidence::Desk { signature }, note, now)
        .await
}

impl Approvers {
    /// Takes a decision whose signature was checked (a desk's or a passkey's): refuses it unless
    /// every signed field is the waiting call's own, keeps it with its `evidence` before anything
    /// is minted, and puts the verdict on the shared row when it is a deny or the M-th approval.
    pub(crate) async fn accept(
        &self,
        name: &str,
        decision: &Decision<'_>,
        evidence: Evidence,
        note: &str,
        now: u64,
    ) -> Response {
        let a = self;
        let sent = decision;
        let (plan, class, verdict) = (*decision.plan, decision.class, decision.verdict);
        // Every signed field must be the waiting call's own.
        let row = match a.records.waiting_call(sent.request).await {
            Ok(Some(row))
                if row.server == a.server && row.verdict.is_none() && row.expires_at_ms > now =>
            {
                row
            }
            Ok(_) => {
                return refuse(
                    StatusCode::NOT_FOUND,
                    "not_pending",
                    "no call with this number waits here (decided, withdrawn, or never asked)",
                );
            }
            Err(e) => return records_unavailable(&e),
        };
        let shown: Value = serde_json::from_str(&row.request).unwrap_or(Value::Null);
        let matches = row.plan == plan
            && row.tenant == sent.tenant
            && shown["plan"]["tool"].as_str() == Some(sent.tool)
            && shown["plan"]["target"].as_str() == Some(sent.target)
            && shown["asks"]["class"].as_str() == Some(class.code());
        if !matches {
            tracing::warn!(target: "approvers", approver = %name, request = sent.request, "a decision over another call than the one waiting was refused");
            return refuse(
                StatusCode::CONFLICT,
                "does_not_match",
                "the decision is about another call than the one waiting under this number (its \
                 plan, tenant, tool, target or class differ): nothing was decided",
            );
        }
        let record = DecisionRecord {
            approver: name.to_owned(),
            server: a.server.clone(),
            request: sent.request,
            verdict,
            plan,
            tenant: sent.tenant.to_owned(),
            tool: sent.tool.to_owned(),
            target: sent.target.to_owned(),
            class,
            expires_at_ms: sent.expires_at_ms,
            evidence,
            decided_at_ms: now,
        };
        // An approval this person already gave on this call (an assertion or a signature sent
        // again) is not kept twice: it counts once either way.
        if verdict == Verdict::Approve {
            match a.records.approved_by(&a.server, row.id, &plan).await {
                Ok(by) if by.iter().any(|n| n == name) => {
                    let counted = match a.counted(row.id, &plan).await {
                        Ok(counted) => counted,
                        Err(e) => return records_unavailable(&e),
                    };
                    return json_response(
                        StatusCode::ACCEPTED,
                        &json!({
                            "outcome": "recorded",
                            "approvals": counted.len(),
                            "needed": usize::from(row.approvers.max(1)),
                        }),
                    );
                }
                Ok(_) => {}
                Err(e) => return records_unavailable(&e),
            }
        }
        // Kept before anything is minted: no token without its signed decision on record.
        if let Err(e) = a.records.put_decision(&record).await {
            tracing::warn!(target: "approvers", error = %e, "cannot keep a decision");
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "records_unavailable",
                "the decision could not be kept, so it does not count: decide again",
            );
        }
        tracing::info!(target: "approvers", approver = %name, request = sent.request, verdict = verdict.code(), "decision accepted");
        let (count, needed, note) = match verdict {
            Verdict::Deny => {
                let note = if note.is_empty() {
                    format!("denied by approver {name}")
                } else {
                    format!("denied by approver {name}: {note}")
                };
                (0, 0, Some(note))
            }
            Verdict::Approve => {
                let by = match a.counted(row.id, &plan).await {
                    Ok(by) => by,
                    Err(e) => return records_unavailable(&e),
                };
                let needed = usize::from(row.approvers.max(1));
                if by.len() < needed {
                    return json_response(
                        StatusCode::ACCEPTED,
                        &json!({ "outcome": "recorded", "approvals": by.len(), "needed": needed }),
                    );
                }
                (by.len(), needed, None)
            }
        };
        // The verdict goes on the shared row; a replica where the call waits carries it out (it
        // holds the arguments and answers the agent). The first verdict stands, and stays on record
        // long enough for an agent asking again to find it.
        let until = now.saturating_add(MAX_DECISION_TTL_MS);
        let decided = a
            .records
            .decide_waiting(row.id, verdict, note.as_deref(), until)
            .await;
        if let Ok(true) = decided {
            // Carried out now if the call waits here (the mirror reads the row at once).
            a.decided_here.notify_one();
        }
        match decided {
            Ok(true) if verdict == Verdict::Deny => {
                json_response(StatusCode::OK, &json!({ "outcome": "denied" }))
            }
            Ok(true) => json_response(
                StatusCode::OK,
                &json!({ "outcome": "approved", "approvals": count, "needed": needed }),
            ),
            Ok(false) => refuse(
                StatusCode::CONFLICT,
                "decided",
                "another decision on this call came first",
            ),
            Err(e) => records_unavailable(&e),
        }
    }
}

fn records_unavailable(e: &StoreError) -> Response {
    tracing::warn!(target: "approvers", error = %e, "records unavailable");
    refuse(
        StatusCode::SERVICE_UNAVAILABLE,
        "records_unavailable",
        "the server cannot read or keep decisions now; nothing was decided. Decide again.",
    )
}
