//! The enrolled servers' waiting calls in this desk's queue ([`Remote`]): read over mutual TLS,
//! taken only when the plan shown is the plan hashed, and decided by a signed decision sent back.

use countersign_core::Tenant;
use countersign_core::sync::lock;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use countersign_core::approver::{ApproverKey, CHANGE_TENANT, Decision, Verdict};
use countersign_core::{GateClass, Plan, PlanHash};
use countersign_engine::{
    Asks, CallRequest, Change, ChangeKind, ChangeRequest, Engine, MAX_CHANGE_LABEL_CHARS,
    MAX_CHANGE_TEXT_CHARS, PendingRequest, QueueChange, Removal, text_hash,
};
use countersign_secret::Items;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};

use super::enroll::{Enrolled, Enrollments, key};

/// Where a remote request's id starts: above every id the local queue will ever give, and
/// within what the window's JavaScript holds exactly (2^53).
pub const REMOTE_IDS: u64 = 1 << 52;

/// How long a signed decision holds: long enough to cross the network, short enough that a
/// decision held back is soon worth nothing.
pub const DECISION_TTL_MS: u64 = 60_000;

/// How long one read of a server's waiting calls is held open.
const WAIT_S: u64 = 25;

/// How long one exchange with a server may take, beyond [`WAIT_S`].
const EXCHANGE: Duration = Duration::from_secs(WAIT_S + 10);

/// A request waiting on a team server, as this desk holds it.
#[derive(Debug, Clone)]
struct Waiting {
    /// As the window shows it (its id in this desk's remote range).
    shown: PendingRequest,
    /// The server's own id for it.
    remote_id: u64,
    /// The server.
    url: String,
    /// What a decision on it signs beside its plan's text.
    signed: Signed,
}

/// What a decision on a listed request signs, beside the server, the request's number, the
/// verdict, the tool and the target: for a call, its own; for a change of the server's rules,
/// the change's plan hash, [`CHANGE_TENANT`], `once`, and no typed target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Signed {
    pub plan_hash: PlanHash,
    pub tenant: String,
    pub class: GateClass,
    pub type_target: bool,
}

/// A request a server listed, as this desk takes it.
pub(super) struct Listed {
    pub id: u64,
    pub plan: Plan,
    pub text: String,
    pub asks: Asks,
    pub signed: Signed,
}

/// The request a server listed, if it is one this desk takes: a call ([`parse`]) or a change of
/// the server's rules ([`parse_change`]).
pub(super) fn listed(request: &Value, url: &str) -> Option<Listed> {
    if let Some((id, call, plan, text)) = parse(request, url) {
        let signed = Signed {
            plan_hash: call.plan_hash,
            tenant: call.tenant.to_string(),
            class: call.class,
            type_target: call.type_target,
        };
        return Some(Listed {
            id,
            plan,
            text,
            asks: Asks::Call(call),
            signed,
        });
    }
    let (id, change, plan, text) = parse_change(request, url)?;
    let signed = Signed {
        plan_hash: plan.hash().ok()?,
        tenant: CHANGE_TENANT.to_owned(),
        class: GateClass::Once,
        type_target: false,
    };
    Some(Listed {
        id,
        plan,
        text,
        asks: Asks::Change(change),
        signed,
    })
}

/// What the window's queue holds from team servers, and how to reach them.
#[derive(Clone)]
pub struct Remote {
    engine: Engine,
    key: Arc<ApproverKey>,
    waiting: Arc<Mutex<BTreeMap<u64, Waiting>>>,
    clients: Arc<Mutex<BTreeMap<String, Arc<rustls::ClientConfig>>>>,
    next_id: Arc<std::sync::atomic::AtomicU64>,
}

/// Why a decision on a remote request did not go through.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// No such remote request waits.
    #[error("no request with this id waits on a team server")]
    NotPending,
    /// Policy asks for the target typed, and what was typed differs.
    #[error("the target must be typed exactly to approve this request")]
    TargetNotTyped,
    /// Sooner than the approve delay.
    #[error("too soon: Approve works {wait_ms} ms from now")]
    TooSoon {
        /// How long until it does.
        wait_ms: u64,
    },
    /// The server refused the decision: nothing was decided.
    #[error("the team server did not take the decision ({code}): {message}")]
    Refused {
        /// The server's code.
        code: String,
        /// Its message.
        message: String,
    },
    /// The server could not be reached, or did not answer: nothing was decided.
    #[error("the team server did not take the decision (unreachable): {0}")]
    Unreachable(#[source] ExchangeError),
}

/// Why this desk could not make its TLS client for a team server.
#[derive(Debug, thiserror::Error)]
enum ClientError {
    /// The certificate authority, or this desk's key as a client certificate, was refused.
    #[error("{0}")]
    Tls(#[from] rustls::Error),
    /// The self-signed certificate of the approver key could not be made.
    #[error("{0}")]
    Certificate(#[from] rcgen::Error),
}

/// Why one exchange with a team server's approver listener did not come back with an answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExchangeError {
    /// The URL with the path after it is not a URI.
    #[error("{0}")]
    Uri(#[source] hyper::http::uri::InvalidUri),
    /// The URL names no host.
    #[error("no host")]
    NoHost,
    /// The TCP connection, or the TLS handshake over it, failed.
    #[error("{0}")]
    Connect(#[source] std::io::Error),
    /// The host is not a name TLS can check a certificate against.
    #[error("{0}")]
    ServerName(#[source] rustls::pki_types::InvalidDnsNameError),
    /// The request could not be made.
    #[error("{0}")]
    Request(#[source] hyper::http::Error),
    /// HTTP failed: the handshake, the request or reading the answer.
    #[error("{0}")]
    Http(#[source] hyper::Error),
    /// No answer within the exchange's time.
    #[error("no answer in time")]
    Timeout,
}

impl Remote {
    /// Whether `id` names a request of a team server.
    pub fn owns(id: u64) -> bool {
        id >= REMOTE_IDS
    }

    /// Starts reading the waiting calls of every enrolled server in `config` (and of servers
    /// enrolled later: the file is read again now and then). `None` when this desk is enrolled
    /// nowhere or has no approver key.
    pub fn start(engine: Engine, config: PathBuf, items: &dyn Items) -> Option<Remote> {
        let enrollments = Enrollments::load(&config)
            .map_err(|e| tracing::warn!(target: "approver", "{e}"))
            .ok()?;
        if enrollments.servers.is_empty() {
            return None;
        }
        let key = match key(items, false) {
            Ok(Some(key)) => Arc::new(key),
            Ok(None) => {
                tracing::warn!(target: "approver", "enrolled with team servers, but the keychain holds no approver key: enroll again");
                return None;
            }
            Err(e) => {
                tracing::warn!(target: "approver", "the approver key: {e}");
                return None;
            }
        };
        let remote = Remote {
            engine,
            key,
            waiting: Default::default(),
            clients: Default::default(),
            next_id: Arc::new(std::sync::atomic::AtomicU64::new(REMOTE_IDS)),
        };
        let supervisor = remote.clone();
        tokio::spawn(async move { supervisor.supervise(config).await });
        Some(remote)
    }

    /// Keeps one reader per enrolled server, reading the enrollments again every 10 s.
    async fn supervise(self, config: PathBuf) {
        let mut running: BTreeMap<String, tokio::task::JoinHandle<()>> = BTreeMap::new();
        loop {
            let enrolled = Enrollments::load(&config).unwrap_or_default();
            running.retain(|url, task| {
                let keep = enrolled.servers.contains_key(url);
                if !keep {
                    task.abort();
                }
                keep
            });
            for (url, server) in enrolled.servers {
                if running.contains_key(&url) {
                    continue;
                }
                match self.client(&server) {
                    Ok(client) => {
                        lock(&self.clients).insert(url.clone(), client.clone());
                        let reader = self.clone();
                        let task = tokio::spawn({
                            let url = url.clone();
                            async move { reader.read(url, client).await }
                        });
                        running.insert(url, task);
                    }
                    Err(e) => {
                        tracing::warn!(target: "approver", server = %url, "cannot connect: {e}")
                    }
                }
            }
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
    }

    /// The TLS client for `server`: its CA as the only root, this desk's key as its client
    /// certificate.
    fn client(&self, server: &Enrolled) -> Result<Arc<rustls::ClientConfig>, ClientError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(server.ca_pem.as_bytes()).flatten() {
            roots.add(cert)?;
        }
        let pkcs8 = self.key.pkcs8_der();
        let pair = rcgen::KeyPair::try_from(pkcs8.as_slice())?;
        let cert = rcgen::CertificateParams::new(vec!["countersign-approver".to_owned()])?
            .self_signed(&pair)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::Pkcs8(pkcs8.to_vec().into()),
            )?;
        Ok(Arc::new(config))
    }

    /// One exchange with the server at `url` (path and query after it): the status and JSON.
    async fn exchange(
        client: Arc<rustls::ClientConfig>,
        url: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), ExchangeError> {
        let uri: hyper::Uri = format!("{}{path}", url.trim_end_matches('/'))
            .parse()
            .map_err(ExchangeError::Uri)?;
        let host = uri.host().ok_or(ExchangeError::NoHost)?.to_owned();
        let port = uri.port_u16().unwrap_or(443);
        let work = async {
            let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
                .await
                .map_err(ExchangeError::Connect)?;
            let name = ServerName::try_from(host.clone()).map_err(ExchangeError::ServerName)?;
            let tls = tokio_rustls::TlsConnector::from(client)
                .connect(name, tcp)
                .await
                .map_err(ExchangeError::Connect)?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                    .await
                    .map_err(ExchangeError::Http)?;
            tokio::spawn(connection);
            let bytes = body.map(|b| b.to_string()).unwrap_or_default();
            let request = hyper::Request::builder()
                .method(method)
                .uri(path)
                .header(hyper::header::HOST, format!("{host}:{port}"))
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(bytes)))
                .map_err(ExchangeError::Request)?;
            let response = sender
                .send_request(request)
                .await
                .map_err(ExchangeError::Http)?;
            let status = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(ExchangeError::Http)?
                .to_bytes();
            Ok::<_, ExchangeError>((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
        };
        tokio::time::timeout(EXCHANGE, work)
            .await
            .map_err(|_| ExchangeError::Timeout)?
    }

    /// Reads `url`'s waiting calls for as long as the desk runs, waiting on the server for
    /// changes; a failure clears them from the queue and tries again, backing off.
    async fn read(self, url: String, client: Arc<rustls::ClientConfig>) {
        let mut seen = String::new();
        let mut pause = Duration::from_secs(1);
        loop {
            let path = format!("/approver/v1/requests?wait={WAIT_S}&seen={seen}");
            match Self::exchange(client.clone(), &url, "GET", &path, None).await {
                Ok((200, body)) => {
                    pause = Duration::from_secs(1);
                    seen = body["digest"].as_str().unwrap_or_default().to_owned();
                    if body["server"].as_str() != Some(url.as_str()) {
                        tracing::warn!(target: "approver", server = %url, "the server names itself otherwise: its requests are not shown");
                        self.replace(&url, Vec::new());
                    } else {
                        let list = body["requests"].as_array().cloned().unwrap_or_default();
                        self.replace(&url, list);
                    }
                    continue;
                }
                Ok((status, body)) => {
                    tracing::warn!(target: "approver", server = %url, status, code = %body["error"], "the server refused this desk");
                }
                Err(e) => tracing::warn!(target: "approver", server = %url, "unreachable: {e}"),
            }
            self.replace(&url, Vec::new());
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(30));
        }
    }

    /// The server at `url` now has `list` waiting: the queue follows, and the window hears of
    /// what arrived and what left.
    fn replace(&self, url: &str, list: Vec<Value>) {
        let mut changes = Vec::new();
        {
            let mut waiting = lock(&self.waiting);
            let mut kept = Vec::new();
            for item in list {
                let Some(parsed) = listed(&item["request"], url) else {
                    tracing::warn!(target: "approver", server = %url, "a request that is neither a call nor a change of the server's rules was left out");
                    continue;
                };
                let (remote_id, plan_hash) = (parsed.id, parsed.signed.plan_hash);
                let existing = waiting.iter().find(|(_, w)| {
                    w.url == url && w.remote_id == remote_id && w.signed.plan_hash == plan_hash
                });
                let id = match existing {
                    Some((id, _)) => *id,
                    None => {
                        let id = self
                            .next_id
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let signed = parsed.signed.clone();
                        let shown = shown(id, parsed, self.engine.now_ms());
                        changes.push(QueueChange::Added {
                            request: Box::new(shown.clone()),
                        });
                        waiting.insert(
                            id,
                            Waiting {
                                shown,
                                remote_id,
                                url: url.to_owned(),
                                signed,
                            },
                        );
                        id
                    }
                };
                kept.push(id);
            }
            let gone: Vec<u64> = waiting
                .iter()
                .filter(|(id, w)| w.url == url && !kept.contains(id))
                .map(|(id, _)| *id)
                .collect();
            for id in gone {
                waiting.remove(&id);
                changes.push(QueueChange::Removed {
                    id,
                    reason: Removal::Withdrawn,
                });
            }
        }
        for change in changes {
            self.engine.announce(change);
        }
    }

    /// The team servers' waiting calls, oldest first.
    pub fn pending(&self) -> Vec<PendingRequest> {
        let mut list: Vec<PendingRequest> = lock(&self.waiting)
            .values()
            .map(|w| w.shown.clone())
            .collect();
        list.sort_by_key(|r| (r.arrived_at_ms, r.id));
        list
    }

    /// The person approved (or denied, with `note`) remote request `id`: the decision is signed
    /// and sent; the request leaves this desk's queue once the server took it.
    pub async fn decide(
        &self,
        id: u64,
        verdict: Verdict,
        typed_target: Option<&str>,
        note: Option<&str>,
    ) -> Result<(), RemoteError> {
        let waiting = lock(&self.waiting)
            .get(&id)
            .cloned()
            .ok_or(RemoteError::NotPending)?;
        let signed = &waiting.signed;
        let plan = &waiting.shown.plan;
        if verdict == Verdict::Approve {
            if signed.type_target && typed_target != Some(plan.target.as_str()) {
                return Err(RemoteError::TargetNotTyped);
            }
            // The same approve delay as for local requests: from its arrival in this queue, and
            // from the window's last show or focus.
            let wait_ms = self.engine.approve_wait(waiting.shown.arrived_at_ms);
            if wait_ms > 0 {
                return Err(RemoteError::TooSoon { wait_ms });
            }
        }
        let expires_at_ms = self.engine.now_ms().saturating_add(DECISION_TTL_MS);
        let decision = Decision {
            server: &waiting.url,
            request: waiting.remote_id,
            verdict,
            plan: &signed.plan_hash,
            tenant: &signed.tenant,
            tool: &plan.tool,
            target: &plan.target,
            class: signed.class,
            expires_at_ms,
        };
        let signature =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.key.sign(&decision));
        let mut body = json!({
            "request": waiting.remote_id,
            "verdict": verdict.code(),
            "plan": signed.plan_hash.to_hex(),
            "tenant": signed.tenant,
            "tool": plan.tool,
            "target": plan.target,
            "class": signed.class.code(),
            "expiresAtMs": expires_at_ms,
            "signature": signature,
        });
        if let Some(note) = note.map(str::trim).filter(|n| !n.is_empty()) {
            body["note"] = json!(note);
        }
        let client = lock(&self.clients)
            .get(&waiting.url)
            .cloned()
            .ok_or(RemoteError::NotPending)?;
        let answer = Self::exchange(
            client,
            &waiting.url,
            "POST",
            "/approver/v1/decisions",
            Some(body),
        )
        .await;
        match answer {
            Ok((200 | 202, _)) => {
                // Decided (or this person's approval counted, and others' are awaited there):
                // it leaves this desk's queue.
                lock(&self.waiting).remove(&id);
                self.engine.announce(QueueChange::Removed {
                    id,
                    reason: if verdict == Verdict::Approve {
                        Removal::Approved
                    } else {
                        Removal::Denied
                    },
                });
                Ok(())
            }
            Ok((_, body)) => Err(RemoteError::Refused {
                code: body["error"].as_str().unwrap_or("refused").to_owned(),
                message: body["message"].as_str().unwrap_or_default().to_owned(),
            }),
            Err(e) => Err(RemoteError::Unreachable(e)),
        }
    }
}

/// The call a server listed, if it is one: its id there, and the request as the queue holds it.
pub(super) fn parse(request: &Value, url: &str) -> Option<(u64, CallRequest, Plan, String)> {
    let id = request["id"].as_u64()?;
    let plan: Plan = serde_json::from_value(request["plan"].clone()).ok()?;
    let text = request["text"].as_str()?.to_owned();
    let asks = &request["asks"];
    if asks["kind"] != "call" {
        return None;
    }
    let call = CallRequest {
        tenant: Tenant::recorded(asks["tenant"].as_str()?),
        client_info: asks["client_info"].clone(),
        server: format!("{} at {url}", asks["server"].as_str()?),
        plan_hash: PlanHash::from_hex(asks["plan_hash"].as_str()?)?,
        class: GateClass::from_code(asks["class"].as_str()?).filter(|c| c.is_gated())?,
        type_target: asks["type_target"].as_bool()?,
        approvers: asks["approvers"]
            .as_u64()
            .map_or(1, |n| n.clamp(1, 9) as u8),
        token_ttl_ms: asks["token_ttl_ms"].as_u64()?,
        why: asks["why"].as_str().unwrap_or_default().to_owned(),
        last_unknown_at_ms: asks["last_unknown_at_ms"].as_u64(),
        stopped_waiting_at_ms: asks["stopped_waiting_at_ms"].as_u64(),
        ruled: false,
        grant_max_minutes: None,
    };
    // The plan shown must be the plan hashed: a server that sends another is not believed.
    if plan.hash().ok()? != call.plan_hash {
        return None;
    }
    Some((id, call, plan, text))
}

/// The change of its rules a server listed, if it is one: its id there, and the change as the
/// queue holds it. Only a change of `policy.cedar` under [`CHANGE_TENANT`], class `once`, whose
/// plan is the plan hashed and names by hash exactly the two texts shown, each short enough to
/// be shown whole: what the person approves is what they read.
pub(super) fn parse_change(
    request: &Value,
    url: &str,
) -> Option<(u64, ChangeRequest, Plan, String)> {
    let id = request["id"].as_u64()?;
    let plan: Plan = serde_json::from_value(request["plan"].clone()).ok()?;
    let text = request["text"].as_str()?.to_owned();
    let asks = &request["asks"];
    let change = &asks["change"];
    if asks["kind"] != "change"
        || asks["tenant"] != CHANGE_TENANT
        || asks["class"] != GateClass::Once.code()
        || change["kind"] != ChangeKind::Policy.code()
        || change["subject"] != RULES_RECORD
        || plan.tool != format!("change:{}", ChangeKind::Policy.code())
        || plan.target != RULES_RECORD
    {
        return None;
    }
    if plan.hash().ok()? != PlanHash::from_hex(asks["plan_hash"].as_str()?)? {
        return None;
    }
    let text_of = |key: &str| -> Option<Option<String>> {
        match &change[key] {
            Value::Null => Some(None),
            Value::String(t) if t.chars().nth(MAX_CHANGE_TEXT_CHARS).is_none() => {
                Some(Some(t.clone()))
            }
            _ => None,
        }
    };
    let (before, after) = (text_of("before")?, text_of("after")?);
    let named = |text: &Option<String>, key: &str| {
        plan.details[key].as_str().map(str::to_owned) == text.as_deref().map(text_hash)
    };
    if !named(&before, "before_sha256") || !named(&after, "after_sha256") {
        return None;
    }
    let label = |key: &str| -> Option<String> {
        let t = change[key].as_str()?;
        t.chars()
            .nth(MAX_CHANGE_LABEL_CHARS)
            .is_none()
            .then(|| t.to_owned())
    };
    let change = Change {
        kind: ChangeKind::Policy,
        subject: RULES_RECORD.to_owned(),
        summary: label("summary")?,
        before,
        after,
        origin: format!("{} at {url}", label("origin")?),
        analysis: match &change["analysis"] {
            Value::Null => None,
            Value::String(t) if t.chars().nth(MAX_CHANGE_TEXT_CHARS).is_none() => Some(t.clone()),
            _ => return None,
        },
    };
    Some((
        id,
        ChangeRequest {
            change,
            server: Some(url.to_owned()),
        },
        plan,
        text,
    ))
}

/// The name of a team server's rules, as its changes are listed.
const RULES_RECORD: &str = "policy.cedar";

/// The request as this desk's queue holds it, under `id`; it arrived at `now`.
pub(super) fn shown(id: u64, listed: Listed, now: u64) -> PendingRequest {
    PendingRequest {
        id,
        plan: listed.plan,
        arrived_at_ms: now,
        text: listed.text,
        preview: None,
        asks: listed.asks,
    }
}
