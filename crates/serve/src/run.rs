//! Opening the records, starting the upstream, binding and serving: in that order, so that a
//! server that cannot do its work never takes its port.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use countersign_core::ServerId;
use countersign_core::chain::ChainKey;
use countersign_engine::{Engine, EngineConfig};
use countersign_session::reach::{self, Headers, Upstream};
use countersign_session::{Children, SqlDescriber};
use countersign_store::{
    Postgres, PostgresOptions, Records, Sqlite, Store, StoreError, StoreOptions,
};
use countersign_wire::Reach;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::approvers::{self, Approvers, Peer, PinnedApprovers};
use crate::auth::{self, Auth, Keys, OAuth};
use crate::guard::{self, Guard};
use crate::http::{self, Endpoint};
use crate::metrics::Metrics;
use crate::operator::{self, Operator};
use crate::start::{
    Authn, Dsn, KeySource, LOOPBACK_HOSTS, Mode, OAuthSettings, Start, Transport, Upstreams,
};
use crate::tls;

/// What a preflight is refused with while no person can approve on this server.
pub const NOBODY_TO_ASK: &str = "Refused: no person can approve calls on this Countersign \
server yet (no approver is connected), so this call cannot be approved. Nothing was executed. \
Next: ask the team that runs the server to connect an approver, then call this tool again.";

/// The most connections served at once.
pub const MAX_CONNECTIONS: usize = 1024;

/// The most requests in flight on one HTTP/2 connection.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 64;

/// How long a client has to send a request's headers (and, on HTTP/2, to answer a ping).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long requests in flight may take to finish once the server is told to stop.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(40);

/// How long the upstream has to start and answer its first handshake.
pub const UPSTREAM_DEADLINE: Duration = Duration::from_secs(30);

/// Why a server that passed its start rules still stopped. Each has an exit code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The TLS files cannot be used.
    #[error("TLS: {0}")]
    Tls(#[from] tls::TlsError),
    /// The issuer's key file cannot be used.
    #[error("{0}")]
    IssuerKey(#[from] auth::KeyFileError),
    /// The records' directory could not be made.
    #[error("cannot make the data directory: {0}")]
    DataDir(std::io::Error),
    /// The control database could not be reached or migrated (the DSN's password never shown).
    #[error("the control database: {0}")]
    Records(#[from] StoreError),
    /// The approvers' page's origin cannot bind passkeys (checked at start; kept for safety).
    #[error("the approvers' page: {0}")]
    WebOrigin(String),
    /// The upstream could not be started.
    #[error("the upstream: {0}")]
    Upstream(String),
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

impl RunError {
    /// The process's exit code: 2 for what the operator must fix in its setup, 3 when the
    /// control database is unreachable, 4 when the port cannot be bound, 5 for the upstream.
    pub fn exit_code(&self) -> i32 {
        match self {
            RunError::Tls(_)
            | RunError::IssuerKey(_)
            | RunError::DataDir(_)
            | RunError::WebOrigin(_) => 2,
            RunError::Records(_) => 3,
            RunError::Bind { .. } => 4,
            RunError::Upstream(_) => 5,
        }
    }
}

/// How callers are authenticated, with the issuer's key file read now (before anything is
/// bound).
fn authentication(authn: &Authn) -> Result<Auth, RunError> {
    Ok(match authn {
        Authn::Unauthenticated => Auth {
            oauth: None,
            unauthenticated: true,
            agent_keys: None,
            servers: Default::default(),
            read_keys: Default::default(),
        },
        Authn::Bearer { oauth: None, .. } => Auth {
            oauth: None,
            unauthenticated: false,
            agent_keys: None,
            servers: Default::default(),
            read_keys: Default::default(),
        },
        Authn::Bearer {
            oauth:
                Some(OAuthSettings {
                    issuer,
                    resource,
                    scope,
                    keys,
                }),
            ..
        } => {
            let keys = match keys {
                KeySource::Jwks(url) => Keys::jwks(url.clone()),
                KeySource::File(path) => {
                    let file = path.display().to_string();
                    let pem = std::fs::read(path).map_err(|e| auth::KeyFileError {
                        file: file.clone(),
                        why: e.kind().to_string(),
                    })?;
                    Keys::from_pem(&file, &pem)?
                }
            };
            Auth {
                oauth: Some(OAuth {
                    issuer: issuer.clone(),
                    resource: resource.clone(),
                    scope: scope.clone(),
                    keys,
                }),
                unauthenticated: false,
                agent_keys: None,
                servers: Default::default(),
                read_keys: Default::default(),
            }
        }
    })
}

/// The records of a server: its control database, or SQLite in `data_dir`. `chain`: the key
/// that signs the history's head (derived from the confirm secret, so every replica signs with
/// the same key); a read-only server has none, and its events are chained unsigned.
pub async fn open_records(
    dsn: Option<&Dsn>,
    data_dir: &std::path::Path,
    chain: Option<Arc<ChainKey>>,
) -> Result<Arc<dyn Records>, RunError> {
    match dsn {
        Some(dsn) => Ok(records(dsn, chain).await?),
        None => {
            std::fs::create_dir_all(data_dir).map_err(RunError::DataDir)?;
            let mut options = StoreOptions::default();
            if let Some(key) = chain {
                options = options.with_chain_key(key);
            }
            let store = Store::open_deferred(data_dir.join("serve.sqlite"), options);
            Ok(Arc::new(Sqlite::new(store)))
        }
    }
}

async fn records(dsn: &Dsn, chain: Option<Arc<ChainKey>>) -> Result<Arc<dyn Records>, StoreError> {
    let mut options = PostgresOptions::default().with_application_name("countersign-serve");
    if let Some(key) = chain {
        options = options.with_chain_key(key);
    }
    Ok(Arc::new(Postgres::connect(dsn.expose(), options).await?))
}

/// Where a started server listens.
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// The agents' address.
    pub agents: std::net::SocketAddr,
    /// The approvers' address, if there is an approver listener.
    pub approvers: Option<std::net::SocketAddr>,
    /// The approvers' page's address, if there is one.
    pub approver_web: Option<std::net::SocketAddr>,
    /// The operator listener's address (metrics, health), if there is one.
    pub operator: Option<std::net::SocketAddr>,
}

/// Runs the server until `stop` is cancelled. `ready` is told the bound addresses once it
/// listens.
pub async fn run(
    start: Start,
    stop: CancellationToken,
    ready: impl FnOnce(Bound),
) -> Result<(), RunError> {
    let mut approver_bound = None;
    let tls = match &start.transport {
        Transport::Tls { cert, key } => Some(tls::config(cert, key)?),
        Transport::Plain => None,
    };
    let mut auth = authentication(&start.authn)?;
    let (dsn, key, read_only) = match &start.mode {
        Mode::Writable { key, dsn } => (Some(dsn), Ok(key.clone()), false),
        Mode::ReadOnly { dsn } => (dsn.as_ref(), Err("read-only".into()), true),
    };
    // Records in SQLite without a directory named for them go in a temporary one, which lives
    // as long as the server.
    let temporary = match (&start.data_dir, dsn) {
        (None, None) => {
            tracing::warn!(target: "serve", "read-only without CONTROL_DSN or --data-dir: history and pins are kept only while this process runs");
            Some(
                tempfile::Builder::new()
                    .prefix("countersign-serve-")
                    .tempdir()
                    .map_err(RunError::DataDir)?,
            )
        }
        _ => None,
    };
    // Where SQLite records go (unused with a control database).
    let data_dir = start
        .data_dir
        .clone()
        .or_else(|| temporary.as_ref().map(|t| t.path().to_owned()))
        .unwrap_or_default();
    let chain = key
        .as_ref()
        .ok()
        .map(|k| Arc::new(ChainKey::from_secret(k)));
    if let Some(chain) = &chain {
        tracing::info!(target: "serve", chain_key = %chain.public_text(), "the history's head is signed with this key");
    }
    let records = open_records(dsn, &data_dir, chain).await?;
    // Confirm events to the team's collector: from the records, by the shared cursor, one
    // replica at a time.
    if let Some(collector) = start.otlp.clone() {
        let holder: [u8; 8] = rand::random();
        let holder: String = holder.iter().map(|b| format!("{b:02x}")).collect();
        let sender = countersign_otlp::Sender::new(
            records.clone(),
            collector,
            holder,
            Arc::new(countersign_engine::SystemClock),
        );
        tokio::spawn(sender.run(stop.child_token()));
    }
    if matches!(
        start.authn,
        Authn::Bearer {
            agent_keys: true,
            ..
        }
    ) {
        auth.agent_keys = Some(records.clone());
    }

    if start.secret_ignored {
        tracing::warn!(target: "serve", "a signing secret was given to a read-only server: it is not used");
    }
    let builtin = matches!(start.upstreams, Upstreams::One(Reach::Builtin { .. }));
    let mut config = EngineConfig::new();
    config.window = false;
    config.nobody_to_ask = NOBODY_TO_ASK.to_owned();
    config.read_only = read_only;
    config.token_ttl_ms = start.token_ttl_ms;
    config.policy = start.policy.clone();
    if builtin {
        config.describer = Some(Arc::new(SqlDescriber::default()));
    }
    if start.approvers.is_some() {
        // People decide at their desks or on the approvers' page, which hold the approve delay
        // before they sign (the page's is held by the server too); a request waits for them
        // (bounded by --wait) instead of being refused at once.
        config.window = true;
        config.approve_delay_ms = 0;
    }
    // What the engine decides is counted here, and read on the operator listener.
    let metrics = Metrics::new();
    config.tally = Some(metrics.tally());
    let engine = Engine::new(config, records.clone(), key);
    // The rules on record (the file's at a first start); loaded again against each upstream's
    // tools as it lists them.
    let rules = crate::rules::at_start(&*records, start.rules.as_deref(), engine.now_ms()).await?;
    engine.adopt_rules(rules);

    // Every upstream is started (and answers its handshake) before the port is bound.
    let configured: Vec<(Option<String>, Reach, Headers)> = match start.upstreams {
        Upstreams::One(reach) => vec![(None, reach, Headers::default())],
        Upstreams::Named(list) => list
            .into_iter()
            .map(|c| (Some(c.name), c.reach, c.headers))
            .collect(),
    };
    let in_flight = Arc::new(tokio::sync::Semaphore::new(http::MAX_IN_FLIGHT));
    let mut endpoints = Vec::new();
    for (name, reach, headers) in configured {
        let server = match &name {
            Some(name) => ServerId::Registered(name.clone()),
            None => reach::identity(&reach).map_err(|e| RunError::Upstream(e.message))?,
        };
        let named = |message: String| match &name {
            Some(name) => RunError::Upstream(format!("server {name}: {message}")),
            None => RunError::Upstream(message),
        };
        let (stderr, mut stderr_rx) = tokio::sync::mpsc::channel(64);
        let upstream = Upstream::start_without_agent(
            reach,
            headers,
            // Probed as a 2026-07-28 agent would (`server/discover`, then the handshake where
            // the upstream is older): the server speaks every revision up to its upstream's, and
            // agents of every era share this one session.
            reach::lifecycle(true),
            stderr,
            Children::default(),
            UPSTREAM_DEADLINE,
        )
        .await
        .map_err(|e| named(e.message))?;
        // The rules (and a change of them, shown to the approvers as what it widens) are loaded
        // against what the upstream lists from the start, not from an agent's first listing.
        if let Some(peer) = upstream.running().await {
            match tokio::time::timeout(UPSTREAM_DEADLINE, peer.list_all_tools()).await {
                Ok(Ok(tools)) => {
                    let tools: Vec<serde_json::Value> = tools
                        .iter()
                        .filter_map(|t| serde_json::to_value(t).ok())
                        .collect();
                    engine.rules_see_listing(&server, &tools);
                }
                Ok(Err(e)) => {
                    tracing::warn!(target: "serve", server = %server.key(), error = %e, "the upstream's tools could not be listed at start: the rules are loaded against them at an agent's first listing")
                }
                Err(_) => {
                    tracing::warn!(target: "serve", server = %server.key(), "the upstream did not list its tools in time at start: the rules are loaded against them at an agent's first listing")
                }
            }
        }
        let label = server.key();
        tokio::spawn(async move {
            while let Some(frame) = stderr_rx.recv().await {
                if let countersign_wire::Frame::Stderr(bytes) = frame {
                    tracing::info!(target: "upstream", server = %label, "{}", String::from_utf8_lossy(&bytes).trim_end());
                }
            }
        });
        let endpoint = Arc::new(Endpoint {
            engine: engine.clone(),
            upstream: Arc::new(upstream),
            server,
            wait: Duration::from_secs(start.wait_secs),
            in_flight: in_flight.clone(),
            gates: Default::default(),
        });
        endpoints.push((name, endpoint));
    }
    let upstreams: Vec<Arc<Upstream>> = endpoints.iter().map(|(_, e)| e.upstream.clone()).collect();
    auth.servers = endpoints
        .iter()
        .filter_map(|(name, _)| name.clone())
        .collect();
    let auth = Arc::new(auth);

    let guard = Arc::new(Guard::new(&start.allowed_hosts, &start.allowed_origins));
    let mcp = match &endpoints[..] {
        // One upstream: `/mcp`.
        [(None, endpoint)] => Router::new()
            .route(
                "/mcp",
                post(http::post).get(http::not_here).delete(http::not_here),
            )
            .with_state(endpoint.clone()),
        // The servers file's: `/mcp/<name>`, each its own endpoint.
        named => {
            let by_name: http::Named = Arc::new(
                named
                    .iter()
                    .filter_map(|(name, e)| Some((name.clone()?, e.clone())))
                    .collect(),
            );
            Router::new()
                .route(
                    "/mcp/{name}",
                    post(http::post_named)
                        .get(http::not_here)
                        .delete(http::not_here),
                )
                .with_state(by_name)
        }
    }
    .route_layer(axum::middleware::from_fn_with_state(
        auth.clone(),
        auth::layer,
    ));
    // Where a client learns how to get a token: for anyone, no token needed.
    let metadata = Router::new()
        .route("/.well-known/oauth-protected-resource", get(auth::metadata))
        .route(
            "/.well-known/oauth-protected-resource/mcp",
            get(auth::metadata),
        )
        .route(
            "/.well-known/oauth-protected-resource/mcp/{name}",
            get(auth::metadata_named),
        )
        .with_state(auth);
    let app = mcp
        .merge(metadata)
        .layer(axum::middleware::from_fn_with_state(guard, guard::layer));

    // The rules on record kept in force here, and edits of the file proposed to the approvers.
    tokio::spawn(
        crate::rules::TeamRules {
            engine: engine.clone(),
            records: records.clone(),
            file: start.rules_file.clone(),
            can_ask: start.approvers.is_some(),
        }
        .keep(),
    );

    // The approver listener: its TLS (read now, so a bad file stops the start) and its port,
    // bound before the agents' so that a server whose desks cannot connect never serves agents.
    let mut keeper = None;
    let mut mirror = None;
    let mut approver_web_bound = None;
    let (approver_side, web_side) = match &start.approvers {
        Some(approving) => {
            let mut state = Approvers::new(engine.clone(), records.clone(), approving.url.clone());
            state.rules_approvers = start.rules_approvers;
            let state = Arc::new(state);
            let page = approving.web.as_ref().map(|w| crate::notify::Page {
                origin: w.origin.clone(),
                numbers: state.clone(),
            });
            tokio::spawn(crate::notify::run(
                engine.clone(),
                approving.url.clone(),
                page,
                start.webhooks.clone(),
            ));
            // This replica's waiting calls go to the shared records, where any replica's desks
            // and pages see them, and decisions made on any replica come back to be carried out
            // here.
            mirror = Some(tokio::spawn(state.clone().mirror()));
            // A 2026-07-28 client's requestState names the shared row: its retry continues on
            // any replica, and each state is spent once across them all.
            engine.share_requests(state.clone());
            let desks = match &approving.desks {
                Some(listen) => {
                    let admitted: approvers::Admitted = Default::default();
                    approvers::refresh(&records, &admitted).await;
                    keeper = Some(tokio::spawn(approvers::keep_admitted(
                        records.clone(),
                        admitted.clone(),
                    )));
                    let config = tls::config_with_clients(
                        &listen.cert,
                        &listen.key,
                        Arc::new(PinnedApprovers::new(admitted)),
                    )?;
                    let (listener, bound) = bind(listen.listen).await?;
                    tracing::info!(target: "serve", "approvers connect on {bound} (mutual TLS) as {}", approving.url);
                    approver_bound = Some(bound);
                    Some((
                        listener,
                        tokio_rustls::TlsAcceptor::from(config),
                        approvers::router(state.clone()),
                    ))
                }
                None => None,
            };
            let web = match (&approving.web, &start.mode) {
                (Some(page), Mode::Writable { key, .. }) => {
                    let tls = match &page.tls {
                        Some((cert, key)) => {
                            Some(tokio_rustls::TlsAcceptor::from(tls::config(cert, key)?))
                        }
                        None => None,
                    };
                    let relying = crate::web::passkey::Relying::new(page.origin.clone())
                        .map_err(|e| RunError::WebOrigin(e.to_string()))?;
                    let (listener, bound) = bind(page.listen).await?;
                    let wire = if tls.is_some() { "TLS" } else { "plain HTTP" };
                    tracing::info!(target: "serve", "the approvers' page is on {bound} ({wire}) as {}", page.origin);
                    approver_web_bound = Some(bound);
                    let web = Arc::new(crate::web::Web {
                        approvers: state.clone(),
                        relying,
                        key: key.clone(),
                        approve_delay_ms: countersign_engine::DEFAULT_APPROVE_DELAY_MS,
                    });
                    Some((listener, tls, crate::web::router(web)))
                }
                _ => None,
            };
            (desks, web)
        }
        None => (None, None),
    };
    // The operator listener: bound before the agents' too, so a port taken stops the start.
    let mut operator_bound = None;
    let operator_side = match start.operator {
        Some(listen) => {
            let listener = TcpListener::bind(listen)
                .await
                .map_err(|source| RunError::Bind {
                    addr: listen,
                    source,
                })?;
            let bound = listener.local_addr().map_err(|source| RunError::Bind {
                addr: listen,
                source,
            })?;
            tracing::info!(target: "serve", "operators read /metrics, /healthz and /readyz on {bound} (plain HTTP, no credentials)");
            operator_bound = Some(bound);
            let hosts: Vec<String> = start
                .allowed_hosts
                .iter()
                .cloned()
                .chain(LOOPBACK_HOSTS.iter().map(|h| (*h).to_owned()))
                .collect();
            let state = Arc::new(Operator {
                metrics,
                engine: engine.clone(),
                records: records.clone(),
                guard: Guard::new(&hosts, &[]),
            });
            Some((listener, operator::router(state)))
        }
        None => None,
    };
    let listener = TcpListener::bind(start.listen)
        .await
        .map_err(|source| RunError::Bind {
            addr: start.listen,
            source,
        })?;
    let bound = listener.local_addr().map_err(|source| RunError::Bind {
        addr: start.listen,
        source,
    })?;
    let mode = if read_only { "read-only" } else { "writable" };
    let wire = if tls.is_some() {
        "TLS"
    } else {
        "plain HTTP (TLS by the proxy in front)"
    };
    tracing::info!(target: "serve", "listening on {bound} ({mode}, {wire})");
    ready(Bound {
        agents: bound,
        approvers: approver_bound,
        approver_web: approver_web_bound,
        operator: operator_bound,
    });
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let graceful = Arc::new(GracefulShutdown::new());
    let agents = tokio::spawn(serve_connections(
        listener,
        acceptor,
        move |_| app.clone(),
        stop.clone(),
        graceful.clone(),
    ));
    let desks = approver_side.map(|(listener, acceptor, approver_app)| {
        tokio::spawn(serve_connections(
            listener,
            Some(acceptor),
            move |peer: Option<Peer>| match peer {
                Some(peer) => approver_app.clone().layer(axum::Extension(peer)),
                // Never reached: the listener's TLS lets no one in without an approver's key.
                None => Router::new(),
            },
            stop.clone(),
            graceful.clone(),
        ))
    });
    let page = web_side.map(|(listener, acceptor, page_app)| {
        tokio::spawn(serve_connections(
            listener,
            acceptor,
            move |_| page_app.clone(),
            stop.clone(),
            graceful.clone(),
        ))
    });
    let operators = operator_side.map(|(listener, operator_app)| {
        tokio::spawn(serve_connections(
            listener,
            None,
            move |_| operator_app.clone(),
            stop.clone(),
            graceful.clone(),
        ))
    });
    let _ = agents.await;
    for side in [desks, page, operators].into_iter().flatten() {
        let _ = side.await;
    }
    let graceful = Arc::try_unwrap(graceful).unwrap_or_else(|_| GracefulShutdown::new());
    // Stopping: nothing new is accepted; what is in flight finishes (an accepted call records
    // its outcome), for as long as the grace lasts.
    tracing::info!(target: "serve", "stopping: finishing the requests in flight");
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(target: "serve", "requests still in flight after {} s: cut", SHUTDOWN_GRACE.as_secs());
    }
    for task in [keeper, mirror].into_iter().flatten() {
        task.abort();
    }
    for upstream in upstreams {
        upstream.stop().await;
    }
    drop(temporary);
    Ok(())
}

/// A listener on `addr`, and the address it got.
async fn bind(addr: std::net::SocketAddr) -> Result<(TcpListener, std::net::SocketAddr), RunError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| RunError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| RunError::Bind { addr, source })?;
    Ok((listener, bound))
}

/// Accepts connections on `listener` (TLS through `acceptor`, if any) and serves each with the
/// router `app` makes for its peer (the approver key of its client certificate, where there is
/// one), until `stop` is cancelled. Connections are watched by `graceful`.
async fn serve_connections(
    listener: TcpListener,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    app: impl Fn(Option<Peer>) -> Router + Send + Sync + 'static,
    stop: CancellationToken,
    graceful: Arc<GracefulShutdown>,
) {
    let app = Arc::new(app);
    let connections = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut refused_accepts = 0u64;
    loop {
        // At most MAX_CONNECTIONS at once: a flood of idle sockets waits in the kernel's
        // backlog instead of taking every descriptor the process has.
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            _ = stop.cancelled() => break,
        };
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors and the like: say so now and then, wait a moment
                    // rather than spin.
                    refused_accepts += 1;
                    if refused_accepts.is_power_of_two() {
                        tracing::warn!(target: "serve", refused = refused_accepts, "accept: {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        // An answer goes out as soon as it is written, never held for the client's ACK of the
        // last one (Nagle's algorithm): a kept-alive client's next request must not wait on it.
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let acceptor = acceptor.clone();
        // Taken here, in the accept loop: a shutdown that starts later still sees it.
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _permit = permit;
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            // A client that never finishes its headers (or goes quiet between requests) is cut.
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            builder
                .http2()
                .timer(TokioTimer::new())
                .keep_alive_interval(Some(HEADER_TIMEOUT))
                .keep_alive_timeout(HEADER_TIMEOUT)
                .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION);
            let served = match acceptor {
                Some(acceptor) => {
                    let Ok(Ok(tls)) =
                        tokio::time::timeout(tls::HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await
                    else {
                        return;
                    };
                    let peer = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|certs| certs.first())
                        .and_then(approvers::ed25519_key)
                        .map(Peer);
                    let service = TowerToHyperService::new(app(peer));
                    watcher
                        .watch(builder.serve_connection(TokioIo::new(tls), service))
                        .await
                }
                None => {
                    let service = TowerToHyperService::new(app(None));
                    watcher
                        .watch(builder.serve_connection(TokioIo::new(stream), service))
                        .await
                }
            };
            if let Err(e) = served {
                tracing::debug!(target: "serve", "connection: {e}");
            }
        });
    }
}
