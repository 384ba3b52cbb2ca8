//! From a gateway's hello to a running upstream: what the desk starts or connects, the identity
//! it will know that upstream by, and starting it again when it exits before its session ends.
//!
//! The identity is the desk's own word, never the gateway's: `builtin:<db path>` for the built-in
//! tools, the URL, or the command line itself for an ad-hoc command (policy is keyed by it, and
//! the person sees it). A registered server (`--server NAME`) is `server:NAME`, and what the
//! desk starts for it is what the registry has on record for the name, with the secret values
//! from the keychain: never what the gateway says. The prefix keeps a registered name apart from
//! an ad-hoc command of the same word, so neither shares the other's policy or pinned tools.
#![allow(unsafe_code)] // this module reaches the OS through libc; each unsafe block says why it is sound

use countersign_core::ServerId;
use countersign_core::sync::lock;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use countersign_wire::{Frame, Reach, RefusedCode};
use rmcp::model::{ProtocolVersion, ServerPeerInfo};
use rmcp::service::RunningService;
use rmcp::{ClientCacheConfig, ClientLifecycleMode, ClientServiceExt, Peer, RoleClient};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::children::Children;
use crate::lane::Lane;
use crate::raw::RawPassthroughTransport;
use crate::upstream::{Shared, UpstreamClient};
use crate::url_lane::{UrlLane, Watched};

/// Why a hello is not served.
#[derive(Debug)]
pub struct Unreached {
    /// For the gateway.
    pub code: RefusedCode,
    /// For the person reading the gateway's stderr.
    pub message: String,
}

impl Unreached {
    /// An upstream that exits again each time it is started.
    pub fn keeps_exiting() -> Self {
        unreached(
            RefusedCode::UpstreamFailed,
            "it exited again each time it was started",
        )
    }
}

fn unreached(code: RefusedCode, message: impl Into<String>) -> Unreached {
    Unreached {
        code,
        message: message.into(),
    }
}

/// The identity of an ad-hoc command: its command line. A first word holding `:` is always
/// quoted, so that no command line reads as an identity of another kind (`server:NAME`,
/// `builtin:PATH`, a URL) and takes over its policy and pinned tools.
pub fn command_identity(argv: &[String]) -> String {
    let line = countersign_core::render::command_line(argv);
    match argv.first() {
        Some(first) if first.contains(':') && !line.starts_with('\'') => {
            let rest = &line[countersign_core::render::shell_word(first).len()..];
            format!("'{}'{rest}", first.replace('\'', r"'\''"))
        }
        _ => line,
    }
}

/// The desk's name for what `reach` names, or why it cannot be reached at all. Checked before the
/// gateway is welcomed; nothing is started.
pub fn identity(reach: &Reach) -> Result<ServerId, Unreached> {
    match reach {
        Reach::Builtin { db } if Path::new(db).is_absolute() => Ok(ServerId::Builtin(db.into())),
        Reach::Builtin { db } => Err(unreached(
            RefusedCode::BadHello,
            format!("the built-in tools' database must be an absolute path, not {db:?}"),
        )),
        Reach::Url { url } if url.starts_with("http://") || url.starts_with("https://") => {
            Ok(ServerId::Url(url.clone()))
        }
        Reach::Url { url } => Err(unreached(
            RefusedCode::BadHello,
            format!("--url takes an http:// or https:// URL, not {url:?}"),
        )),
        Reach::Command { argv, .. } if !argv.is_empty() => {
            Ok(ServerId::Command(command_identity(argv)))
        }
        Reach::Command { .. } => Err(unreached(RefusedCode::BadHello, "no upstream command")),
        Reach::Server { name } => Err(unreached(
            RefusedCode::NoSuchServer,
            format!("the server {name:?} must be resolved through the desk's registry"),
        )),
        other => Err(unreached(
            RefusedCode::BadHello,
            format!("this desk cannot reach {other:?}"),
        )),
    }
}

/// A registered server's credentials as a start of its upstream uses them: the headers sent
/// with every request to a URL, and every secret value (environment or header), which is
/// replaced in what the upstream writes to its stderr before that reaches the gateway: a
/// server that prints its token must not hand it to the agent. Never printed.
#[derive(Clone, Default)]
pub struct Headers {
    headers: Vec<(String, zeroize::Zeroizing<String>)>,
    secrets: Arc<Vec<zeroize::Zeroizing<String>>>,
}

impl std::fmt::Debug for Headers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.headers.iter().map(|(k, _)| k))
            .finish()
    }
}

/// What replaces a secret value in an upstream's stderr.
const REDACTED: &[u8] = b"[secret withheld by Countersign]";

impl Headers {
    /// Headers sent with every request to a URL (none for a command), and the secret values to
    /// keep out of what the upstream writes to its stderr.
    pub fn new(
        headers: Vec<(String, zeroize::Zeroizing<String>)>,
        secrets: Vec<zeroize::Zeroizing<String>>,
    ) -> Self {
        Headers {
            headers,
            secrets: Arc::new(secrets),
        }
    }

    /// `chunk` with every secret value replaced. A value split across two chunks is not caught
    /// (the two halves go out): stderr is read in large chunks, so that is rare.
    fn redact(&self, chunk: Vec<u8>) -> Vec<u8> {
        let mut chunk = chunk;
        for secret in self.secrets.iter().filter(|s| !s.is_empty()) {
            let needle = secret.as_bytes();
            if !chunk.windows(needle.len()).any(|w| w == needle) {
                continue;
            }
            let mut out = Vec::with_capacity(chunk.len());
            let mut i = 0;
            while i < chunk.len() {
                if chunk[i..].starts_with(needle) {
                    out.extend_from_slice(REDACTED);
                    i += needle.len();
                } else {
                    out.push(chunk[i]);
                    i += 1;
                }
            }
            chunk = out;
        }
        chunk
    }
}

/// What `reach` names, as the desk will start or connect it, with its identity: a registered
/// server becomes the command or URL on record (its environment or headers with their secret
/// values); anything else is checked by [`identity`] and kept as it is.
pub fn resolve(
    reach: Reach,
    registry: Option<&countersign_registry::Registry>,
) -> Result<(Reach, Headers, ServerId), Unreached> {
    let Reach::Server { name } = reach else {
        let identity = identity(&reach)?;
        return Ok((reach, Headers::default(), identity));
    };
    let Some(registry) = registry else {
        return Err(unreached(
            RefusedCode::NoSuchServer,
            format!("no server named {name:?} is registered: this desk has no registry"),
        ));
    };
    let resolved = registry.resolve(&name).map_err(|e| match e {
        countersign_registry::ResolveError::NoSuchServer(_) => {
            unreached(RefusedCode::NoSuchServer, e.to_string())
        }
        other => unreached(RefusedCode::UpstreamFailed, other.to_string()),
    })?;
    let identity = ServerId::Registered(name.clone());
    let secret_keys = resolved.spec.upstream.secret_keys();
    let secrets: Arc<Vec<_>> = Arc::new(
        resolved
            .values
            .iter()
            .filter(|(k, _)| secret_keys.contains(k.as_str()))
            .map(|(_, v)| v.clone())
            .collect(),
    );
    let values = resolved.values;
    Ok(match resolved.spec.upstream {
        countersign_wire::Upstream::Stdio { command, cwd, .. } => (
            Reach::Command {
                argv: command,
                cwd: cwd.unwrap_or_default(),
                env: values
                    .into_iter()
                    .map(|(k, v)| (k, v.as_str().to_owned()))
                    .collect(),
            },
            Headers {
                headers: Vec::new(),
                secrets,
            },
            identity,
        ),
        countersign_wire::Upstream::Http { url, .. } => (
            Reach::Url { url },
            Headers {
                headers: values,
                secrets,
            },
            identity,
        ),
    })
}

/// How the desk opens its session with the upstream, chosen from the agent's first message:
/// the revision they would negotiate directly.
pub fn lifecycle(agent_probes_modern: bool) -> ClientLifecycleMode {
    if agent_probes_modern {
        // The agent opened with `server/discover`: probe the upstream the same way, and fall back
        // to the handshake where the upstream is older (the agent is then offered that too).
        ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: Some(ProtocolVersion::V_2025_11_25),
        }
    } else {
        ClientLifecycleMode::Initialize
    }
}

/// The upstream of one session.
///
/// Started when the agent's first message arrives. When it exits (it crashed, was killed, or
/// closed its end) the session stays: the next request that needs it starts it again the same
/// way, with the MCP handshake again, and marks the tool list stale, so that the tools are listed
/// and registered with the engine again before any call reaches the new process. The tenant
/// stays, so the person's pending decisions stay with the agent; a confirm is checked against
/// the tool as the new process lists it (a tool it no longer lists is refused, a changed one is
/// planned under its new listing, so a different plan is refused `plan_changed`).
pub struct Upstream {
    /// What is started or connected, and the headers sent to a URL: what a start uses. A
    /// registered server's are looked up again before each new start (see [`Self::registered`]).
    target: std::sync::Mutex<(Reach, Headers)>,
    /// The registered server this session reaches, by name, with the registry to ask.
    registered: Option<(countersign_registry::Registry, String)>,
    lifecycle: ClientLifecycleMode,
    out: mpsc::Sender<Frame>,
    children: Children,
    deadline: Duration,
    shared: Arc<Shared>,
    /// What the first start said about itself: what the agent was offered.
    info: Arc<ServerPeerInfo>,
    running: tokio::sync::Mutex<Running>,
    /// The open lane of the current start, while it runs: read by the connection's reader
    /// without waiting on `running` (see [`crate::lane`]).
    lane: std::sync::Mutex<Option<Arc<Lane>>>,
    /// The open lane of the current start of an upstream reached by URL (see
    /// [`crate::url_lane`]).
    url_lane: std::sync::Mutex<Option<Arc<UrlLane>>>,
    /// Cancelled when the session ends: a start under way gives up.
    ended: CancellationToken,
}

/// One start of the upstream: the client session toward it, and its process, when the desk
/// started one.
struct Opened {
    service: RunningService<RoleClient, UpstreamClient>,
    pid: Option<u32>,
    /// The open lane on this start, for a line-based upstream (see [`crate::lane`]).
    lane: Option<Arc<Lane>>,
    /// The open lane on this start, for an upstream reached by URL when no agent stands behind
    /// it (a team's server; see [`crate::url_lane`]).
    url_lane: Option<Arc<UrlLane>>,
    /// The HTTP client of this start, for an upstream reached by URL.
    http: Option<Watched>,
}

impl Opened {
    /// Whether it still runs. A process that has exited counts as gone at once, before the
    /// client session has read the end of its output: a request is never handed to a process
    /// known to be dead, where it could only be lost. So does a start whose output has ended or
    /// whose input broke, as its lane saw (see [`Lane::is_closed`]), even while its process
    /// lingers: the lane answers its own calls at the end of the output, before the client
    /// session has read that end, and an agent answered then must find the next call starting
    /// the upstream again. So does a URL upstream that has forgotten the start's session (see
    /// `Watched::spoiled` in [`crate::url_lane`]).
    fn is_running(&self) -> bool {
        !self.service.is_closed()
            && !self.service.peer().is_transport_closed()
            && !self.pid.is_some_and(has_exited)
            && !self.lane.as_ref().is_some_and(|lane| lane.is_closed())
            && !self.http.as_ref().is_some_and(Watched::spoiled)
    }
}

/// Whether the child `pid` of this process has exited (or been collected already). It is left
/// to be collected by whoever waits for it.
fn has_exited(pid: libc::id_t) -> bool {
    // SAFETY: an all-zero siginfo_t is a valid value for waitid to fill in.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is valid for writes for the whole call; WNOWAIT leaves the child waitable.
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            pid,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // ECHILD: collected already. Otherwise a pid is filled in only for a child that has exited.
    // SAFETY: waitid filled in `info` (or left it zeroed: no child has changed state).
    r != 0 || unsafe { info.si_pid() } != 0
}

/// The current start of the upstream.
struct Running {
    opened: Option<Opened>,
    /// Which start it is (1 for the first).
    start: u64,
}

/// The upstream as one request found it: the client session toward one start of it.
#[derive(Clone)]
pub struct Live {
    /// The client session's peer.
    pub peer: Peer<RoleClient>,
    start: u64,
}

fn ended() -> Unreached {
    unreached(RefusedCode::UpstreamFailed, "the session has ended")
}

impl Upstream {
    /// Starts or connects what `reach` names and opens the MCP session with it (`lifecycle`),
    /// within `deadline`. The upstream's stderr goes to `out` as `E` frames (dropped, not queued
    /// without bound, when the gateway is slow).
    ///
    /// `declared`: what the agent's `initialize` declared, when its first message was one; the
    /// upstream is offered that of roots, sampling and elicitation (see [`Shared::agent_declared`]).
    pub async fn start(
        reach: Reach,
        headers: Headers,
        lifecycle: ClientLifecycleMode,
        declared: Option<rmcp::model::ClientCapabilities>,
        out: mpsc::Sender<Frame>,
        children: Children,
        deadline: Duration,
    ) -> Result<Self, Unreached> {
        let shared = Shared::default();
        if let Some(declared) = declared {
            let _ = shared.agent_declared.set(declared);
        }
        let shared = Arc::new(shared);
        Self::open(shared, reach, headers, lifecycle, out, children, deadline).await
    }

    /// [`Self::start`] for an upstream no agent stands behind (a team's server, where many
    /// callers share it and each request is answered on its own): it is offered no roots,
    /// sampling or elicitation, and what it asks of an agent anyway is refused at once.
    pub async fn start_without_agent(
        reach: Reach,
        headers: Headers,
        lifecycle: ClientLifecycleMode,
        out: mpsc::Sender<Frame>,
        children: Children,
        deadline: Duration,
    ) -> Result<Self, Unreached> {
        let shared = Shared::default();
        shared
            .without_agent
            .store(true, std::sync::atomic::Ordering::Release);
        Self::open(
            Arc::new(shared),
            reach,
            headers,
            lifecycle,
            out,
            children,
            deadline,
        )
        .await
    }

    async fn open(
        shared: Arc<Shared>,
        reach: Reach,
        headers: Headers,
        lifecycle: ClientLifecycleMode,
        out: mpsc::Sender<Frame>,
        children: Children,
        deadline: Duration,
    ) -> Result<Self, Unreached> {
        let opened = open_within(
            deadline, &reach, &headers, &lifecycle, &out, &children, &shared,
        )
        .await?;
        let info = opened
            .service
            .peer()
            .peer_info()
            .expect("an initialized upstream has peer info");
        let lane = std::sync::Mutex::new(opened.lane.clone());
        let url_lane = std::sync::Mutex::new(opened.url_lane.clone());
        Ok(Self {
            target: std::sync::Mutex::new((reach, headers)),
            registered: None,
            lifecycle,
            out,
            children,
            deadline,
            shared,
            info,
            running: tokio::sync::Mutex::new(Running {
                opened: Some(opened),
                start: 1,
            }),
            lane,
            url_lane,
            ended: CancellationToken::new(),
        })
    }

    /// Marks this upstream as the registered server `name`: a new start (after the process
    /// exited) starts what the registry has on record for the name then, so a change the person
    /// approved applies, and a server they removed is not started again.
    pub fn registered(mut self, registry: countersign_registry::Registry, name: String) -> Self {
        self.registered = Some((registry, name));
        self
    }

    /// What a new start starts: for a registered server, looked up again.
    fn target(&self) -> Result<(Reach, Headers), Unreached> {
        if let Some((registry, name)) = &self.registered {
            let (reach, headers, _) =
                resolve(Reach::Server { name: name.clone() }, Some(registry))?;
            let mut target = lock(&self.target);
            *target = (reach, headers);
        }
        Ok(lock(&self.target).clone())
    }

    /// What the session's two halves share.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// What the upstream said about itself when it first started (capabilities, serverInfo,
    /// instructions, protocol version): what the agent is offered, for the whole session.
    pub fn info(&self) -> &ServerPeerInfo {
        &self.info
    }

    /// The upstream, running: the current start, or a new one when it has exited. A new start
    /// marks every listing out of date (see [`Shared::tools_changed`]).
    pub async fn live(&self) -> Result<Live, Unreached> {
        let mut running = self.running.lock().await;
        if let Some(opened) = running.opened.as_ref().filter(|o| o.is_running()) {
            return Ok(Live {
                peer: opened.service.peer().clone(),
                start: running.start,
            });
        }
        if self.ended.is_cancelled() {
            return Err(ended());
        }
        self.set_lanes((None, None));
        if let Some(old) = running.opened.take() {
            tracing::warn!(target: "session", start = running.start, "the upstream has exited; starting it again");
            // Ended already, or ending: this collects it (and kills what it left behind).
            let _ = old.service.cancel().await;
        }
        let (reach, headers) = self.target()?;
        let opened = tokio::select! {
            opened = open_within(
                self.deadline,
                &reach,
                &headers,
                &self.lifecycle,
                &self.out,
                &self.children,
                &self.shared,
            ) => opened?,
            _ = self.ended.cancelled() => return Err(ended()),
        };
        if let Some(info) = opened.service.peer().peer_info()
            && info.protocol_version != self.info.protocol_version
        {
            tracing::warn!(target: "session", was = %self.info.protocol_version, now = %info.protocol_version, "the upstream started again speaks another protocol revision; the agent keeps the one it negotiated");
        }
        // Whatever the old process listed, the engine learns the new one's tools before a call
        // reaches it.
        self.shared.tools_changed();
        running.start += 1;
        tracing::info!(target: "session", start = running.start, "the upstream started again");
        let live = Live {
            peer: opened.service.peer().clone(),
            start: running.start,
        };
        // The new start's lane stays unused until its tools are listed: they are stale now.
        self.set_lanes((opened.lane.clone(), opened.url_lane.clone()));
        running.opened = Some(opened);
        Ok(live)
    }

    /// Makes `lanes` the current start's (none: no lane takes a call until a start that has
    /// them runs).
    fn set_lanes(&self, lanes: (Option<Arc<Lane>>, Option<Arc<UrlLane>>)) {
        *lock(&self.lane) = lanes.0;
        *lock(&self.url_lane) = lanes.1;
    }

    /// The open lane of the current start, unless the upstream's output has ended or its
    /// process has exited (see [`crate::lane`]): as on the full path, a call is never handed to
    /// a process known to be dead.
    pub(crate) fn lane(&self) -> Option<Arc<Lane>> {
        lock(&self.lane)
            .clone()
            .filter(|lane| !lane.is_closed() && !lane.pid().is_some_and(has_exited))
    }

    /// Whether this upstream is reached by URL (it does not exit: its connection ends).
    pub(crate) fn by_url(&self) -> bool {
        matches!(lock(&self.target).0, Reach::Url { .. })
    }

    /// The open lane of the current start of an upstream reached by URL, while that start runs
    /// (see [`crate::url_lane`]).
    pub(crate) fn url_lane(&self) -> Option<Arc<UrlLane>> {
        lock(&self.url_lane)
            .clone()
            .filter(|lane| lane.is_running())
    }

    /// The current start's peer, if it is running; never starts one (for notifications, which a
    /// new start does not need).
    pub async fn running(&self) -> Option<Peer<RoleClient>> {
        let running = self.running.lock().await;
        running
            .opened
            .as_ref()
            .filter(|o| o.is_running())
            .map(|o| o.service.peer().clone())
    }

    /// Whether `live` is the current start and still running.
    pub async fn is_current(&self, live: &Live) -> bool {
        let running = self.running.lock().await;
        running.start == live.start && running.opened.as_ref().is_some_and(Opened::is_running)
    }

    /// Gives up on the start `live` came from (a request could not be handed to it, so it is
    /// not usable): the next [`Self::live`] starts a new one. A later start is left alone.
    pub async fn discard(&self, live: &Live) {
        let mut running = self.running.lock().await;
        if running.start == live.start
            && let Some(opened) = running.opened.as_mut()
        {
            self.set_lanes((None, None));
            let _ = opened
                .service
                .close_with_timeout(Duration::from_secs(5))
                .await;
        }
    }

    /// Ends the upstream with its session, gracefully (its stdin closes, it gets a moment, then
    /// its process group is killed). A start under way gives up.
    pub async fn stop(&self) {
        self.ended.cancel();
        self.set_lanes((None, None));
        let opened = self.running.lock().await.opened.take();
        if let Some(opened) = opened {
            let _ = opened.service.cancel().await;
        }
    }
}

/// [`open`] within `deadline`.
async fn open_within(
    deadline: Duration,
    reach: &Reach,
    headers: &Headers,
    lifecycle: &ClientLifecycleMode,
    out: &mpsc::Sender<Frame>,
    children: &Children,
    shared: &Arc<Shared>,
) -> Result<Opened, Unreached> {
    tokio::time::timeout(
        deadline,
        open(reach, headers, lifecycle.clone(), out, children, shared),
    )
    .await
    .unwrap_or_else(|_| {
        Err(unreached(
            RefusedCode::UpstreamFailed,
            format!(
                "the upstream did not complete the MCP handshake within {} s",
                deadline.as_secs()
            ),
        ))
    })
}

/// Starts or connects what `reach` names and opens the MCP session with it (`lifecycle`).
async fn open(
    reach: &Reach,
    headers: &Headers,
    lifecycle: ClientLifecycleMode,
    out: &mpsc::Sender<Frame>,
    children: &Children,
    shared: &Arc<Shared>,
) -> Result<Opened, Unreached> {
    // Checked again here, so that nothing `identity` refuses is ever started.
    identity(reach)?;
    let client = UpstreamClient::new(shared.clone());
    let failed = |e: &dyn std::fmt::Display| {
        unreached(
            RefusedCode::UpstreamFailed,
            format!("the upstream did not initialize: {e}"),
        )
    };
    let mut pid = None;
    let mut lane = None;
    let mut watched = None;
    let upstream = match reach {
        Reach::Builtin { db } => {
            let path = Path::new(db);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| {
                    unreached(
                        RefusedCode::UpstreamFailed,
                        format!("cannot create {}: {e}", dir.display()),
                    )
                })?;
            }
            let (ours, theirs) = tokio::io::duplex(1 << 20);
            let (their_read, their_write) = tokio::io::split(theirs);
            tokio::spawn(countersign_builtin::serve(
                path.to_owned(),
                their_read,
                their_write,
            ));
            let (read, write) = tokio::io::split(ours);
            let mut transport = RawPassthroughTransport::new(read, write);
            lane = Some(transport.open_lane(out.clone(), shared.clone()));
            client
                .serve_with_lifecycle(transport, lifecycle)
                .await
                .map_err(|e| failed(&e))?
        }
        Reach::Url { url } => {
            let mut custom = std::collections::HashMap::new();
            for (name, value) in &headers.headers {
                let bad = |what: &str| {
                    unreached(
                        RefusedCode::UpstreamFailed,
                        format!("the header {name:?} has an invalid {what}"),
                    )
                };
                let key = http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad("name"))?;
                let mut value =
                    http::HeaderValue::from_str(value.as_str()).map_err(|_| bad("value"))?;
                value.set_sensitive(true);
                custom.insert(key, value);
            }
            let config = rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(url.as_str())
                .custom_headers(custom);
            let http = Watched::new(http_client().map_err(|e| {
                unreached(
                    RefusedCode::UpstreamFailed,
                    format!("cannot make the HTTP client: {e}"),
                )
            })?);
            watched = Some((http.clone(), url.clone()));
            let transport =
                rmcp::transport::StreamableHttpClientTransport::with_client(http, config);
            client
                .serve_with_lifecycle(transport, lifecycle)
                .await
                .map_err(|e| failed(&e))?
        }
        Reach::Command { argv, cwd, env } => {
            let Some((program, args)) = argv.split_first() else {
                return Err(unreached(RefusedCode::BadHello, "no upstream command"));
            };
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(args).env_clear().envs(env.iter().cloned());
            if !cwd.is_empty() {
                cmd.current_dir(cwd);
            }
            let sink = out.clone();
            let credentials = headers.clone();
            let stderr = move |chunk: Vec<u8>| {
                let _ = sink.try_send(Frame::Stderr(credentials.redact(chunk)));
            };
            let (mut transport, stderr_done) =
                RawPassthroughTransport::spawn(cmd, stderr, children.clone()).map_err(|e| {
                    unreached(
                        RefusedCode::UpstreamFailed,
                        format!("cannot start the upstream `{program}`: {e}"),
                    )
                })?;
            pid = transport.pid();
            lane = Some(transport.open_lane(out.clone(), shared.clone()));
            match client.serve_with_lifecycle(transport, lifecycle).await {
                Ok(upstream) => upstream,
                Err(e) => {
                    // The server is gone (its group killed with the transport): what it said on
                    // stderr, usually why, goes to the gateway before the refusal.
                    let _ =
                        tokio::time::timeout(std::time::Duration::from_secs(2), stderr_done).await;
                    return Err(failed(&e));
                }
            }
        }
        // `identity` has refused everything else already; should a new kind slip through, it is
        // refused here too.
        other => {
            return Err(unreached(
                RefusedCode::BadHello,
                format!("this desk cannot reach {other:?}"),
            ));
        }
    };
    upstream
        .set_response_cache_config(ClientCacheConfig::disabled())
        .await;
    // The lane refuses what the upstream asks of an agent, as the client session does only
    // where no agent stands behind it: a team's server.
    let without_agent = shared
        .without_agent
        .load(std::sync::atomic::Ordering::Acquire);
    let url_lane = watched
        .as_ref()
        .filter(|_| without_agent)
        .and_then(|(http, url)| {
            let version = upstream.peer().peer_info()?.protocol_version.clone();
            Some(Arc::new(UrlLane::new(
                http.clone(),
                url,
                upstream.peer().clone(),
                &version,
                shared.clone(),
            )))
        });
    Ok(Opened {
        service: upstream,
        pid,
        lane,
        url_lane,
        http: watched.map(|(http, _)| http),
    })
}

/// The HTTP client an upstream reached by URL is spoken to with. Its connections are kept and
/// reused (rmcp's default client keeps none, for a stall a half-read answer can cause; an answer
/// is read whole here or its connection is not reused, and requests go out without Nagle's
/// delay), so a team's server does not open a TCP connection to its upstream per call. It
/// follows no redirect: an upstream that moves is configured anew, never followed with the
/// credentials its headers carry.
fn http_client() -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .tcp_nodelay(true)
        .pool_idle_timeout(std::time::Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_identity_reads_like_its_command_line() {
        let argv = ["npx", "-y", "@scope/server", "/home/a b", "it's"].map(String::from);
        assert_eq!(
            command_identity(&argv),
            r"npx -y @scope/server '/home/a b' 'it'\''s'"
        );
    }

    #[test]
    fn secret_values_in_an_upstreams_stderr_are_withheld() {
        let credentials = Headers {
            headers: Vec::new(),
            secrets: Arc::new(vec![zeroize::Zeroizing::new("tok-123".to_owned())]),
        };
        let out = credentials.redact(b"auth with tok-123 failed; tok-123!".to_vec());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "auth with [secret withheld by Countersign] failed; [secret withheld by Countersign]!"
        );
        assert_eq!(credentials.redact(b"nothing".to_vec()), b"nothing");
    }

    #[test]
    fn no_command_line_reads_as_a_registered_server_a_builtin_or_a_url() {
        for first in [
            "server:github",
            "builtin:/tmp/a.db",
            "https://example.com/mcp",
        ] {
            let argv = [first.to_owned(), "x:y".to_owned()];
            let identity = command_identity(&argv);
            assert_eq!(identity, format!("'{first}' x:y"));
            assert!(!identity.starts_with(first));
        }
    }
}
