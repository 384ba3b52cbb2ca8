//! The desk's start: everything `countersign-desk` does before and besides its window, in a form
//! both of its programs run (the window's, and `countersign-headless-desk` alone when there is no
//! window to make).
//!
//! The order matters and is kept here once: harden the process ([`harden`]), answer the one-shot
//! subcommands, read the request URL strictly ([`request_url`]), find the account's directories,
//! log ([`log_file`]), read the secret from the keychain (or say why not and start anyway, minting
//! nothing), open the engine and the registry, bind the socket (whose bind is the
//! single-instance lock), then the agents' socket and the schedules.

pub mod harden;
pub mod log_file;
pub mod request_url;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use countersign_core::token::SigningKey;
use countersign_engine::{Engine, EngineConfig, NoKey};
use countersign_registry::Registry;
use countersign_secret::{
    HmacSecret, Items, KeychainItems, KeychainStore, MemoryItems, MemoryStore, SecretError,
    SecretStore,
};
use countersign_session as socket;
use countersign_store::{Sqlite, StoreOptions};
use tokio::runtime::Handle;

use crate::Desk;
use crate::settings::{Dirs, Settings};
use crate::{approver, otlp, seed};

/// Starts the desk in the tray, without its window (and so without WebKit) until something is to
/// be decided: what a gateway passes when it starts the desk for an agent. `countersign desk`
/// and the desktop entry pass nothing, and open the window.
pub const TRAY_FLAG: &str = countersign_wire::DESK_IN_TRAY;

/// Whether a window can be shown: a display server is named in the environment.
pub fn has_display() -> bool {
    if cfg!(any(target_os = "macos", target_os = "windows")) {
        return true;
    }
    ["DISPLAY", "WAYLAND_DISPLAY"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|d| !d.is_empty()))
}

/// The one-shot subcommands the `countersign` binary runs through the desk's programs (they need
/// the keychain): `history-key` and `approver …`. `Some(exit code)` when `args` named one, which
/// has then run; `None` otherwise.
pub fn subcommand(args: &[String]) -> Option<i32> {
    match args.first().map(String::as_str) {
        // `countersign history key`: the public half of the chain key, made on first need.
        Some("history-key") => Some(
            match KeychainItems::open_default()
                .map_err(seed::SeedError::from)
                .and_then(|items| seed::chain_key(&items))
            {
                Ok(key) => {
                    println!("{}", key.public_text());
                    0
                }
                Err(e) => {
                    eprintln!("countersign history key: refused (no_keychain): {e}");
                    3
                }
            },
        ),
        // `countersign approver …` (enrolling this desk with team servers): done before any
        // window, with the OS keychain, and the process ends.
        Some("approver") => Some(match (Dirs::new(), KeychainItems::open_default()) {
            (Ok(dirs), Ok(items)) => approver::command(&dirs.config, &items, &args[1..]),
            (Err(e), _) => {
                eprintln!("countersign approver: {e}");
                1
            }
            (_, Err(e)) => {
                eprintln!("countersign approver: refused (no_keychain): {e}");
                3
            }
        }),
        _ => None,
    }
}

/// Logs to stderr (as `RUST_LOG` says, confirmation events always) and to the log file in the
/// state directory at `info` whatever the environment says: the file is the record that outlives
/// an outage of the store, so whoever started the desk does not get to thin it. rmcp's events
/// above `info` are never written, whatever `RUST_LOG` says: they print every MCP message whole,
/// and a confirm carries its token, as does the answer to an approved preflight.
pub fn init_logging(state: &std::path::Path) {
    use tracing_subscriber::filter::{FilterExt, filter_fn};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer};

    let confirm = || "confirm=info".parse().expect("a valid directive");
    let user = std::env::var("RUST_LOG").ok();
    let stderr_filter = user
        .as_deref()
        .and_then(|s| EnvFilter::try_new(s).ok())
        .unwrap_or_else(|| EnvFilter::new("info"))
        .add_directive(confirm())
        .and(filter_fn(|meta| {
            let rmcp = meta.target() == "rmcp" || meta.target().starts_with("rmcp::");
            !rmcp || *meta.level() <= tracing::Level::INFO
        }));
    let (file, file_error) = match log_file::RotatingFile::desk_log(state) {
        Ok(file) => (Some(file), None),
        Err(e) => (None, Some(e)),
    };
    let file_layer = file.map(|file| {
        tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(Mutex::new(file))
            .with_filter(EnvFilter::new("info").add_directive(confirm()))
    });
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(stderr_filter),
        )
        .with(file_layer)
        .init();
    if let Some(e) = file_error {
        tracing::error!(target: "desk", "no log file in {}: {e}; logging to stderr only", state.display());
    }
}

/// What a start read before opening anything: the directories, the settings, the secret and the
/// keychain's items, and the request URL on the command line.
pub struct Begun {
    /// The account's directories.
    pub dirs: Dirs,
    /// The settings as saved.
    pub settings: Settings,
    /// Where the secret is kept.
    pub secret: Arc<dyn SecretStore>,
    /// The signing key read from it, or why it could not be.
    pub key: Result<SigningKey, SecretError>,
    /// The keychain's items (the desk's other keys), or why they cannot be reached.
    pub items: Result<Arc<dyn Items>, SecretError>,
    /// The request a URL on the command line asks to show.
    pub open: Option<u64>,
    /// Started in the tray (`--tray`): no window until something is to be decided.
    pub in_tray: bool,
}

/// Everything before the engine: the subcommands (which end the process), the request URL (a bad
/// one ends it with 2), the directories, the log, the settings and the secret. Call first thing
/// in `main`, after [`harden::harden`].
pub fn begin(hardened: &harden::Hardened) -> Begun {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(code) = subcommand(&args) {
        std::process::exit(code);
    }
    let open = match request_url::from_args(args.iter().cloned()) {
        Ok(open) => open,
        Err(e) => {
            eprintln!("countersign-desk: {e}");
            std::process::exit(2);
        }
    };
    let dirs = match Dirs::new() {
        Ok(dirs) => dirs,
        Err(e) => {
            eprintln!("countersign-desk: {e}");
            std::process::exit(1);
        }
    };
    init_logging(&dirs.state);
    tracing::info!(
        target: "desk",
        version = env!("CARGO_PKG_VERSION"),
        pid = std::process::id(),
        config = %dirs.config.display(),
        data = %dirs.data.display(),
        state = %dirs.state.display(),
        "starting"
    );
    for name in &hardened.removed {
        tracing::warn!(target: "desk", "ignored {name} from the environment");
    }
    if let Some(e) = &hardened.dumpable {
        tracing::warn!(target: "desk", "could not make the desk undumpable: {e}");
    }
    let in_tray = args.iter().any(|a| a == TRAY_FLAG);
    let in_memory = args.iter().any(|a| a == "--in-memory-secret");
    let settings = dirs.load_settings();
    let secret: Arc<dyn SecretStore> = if in_memory {
        tracing::warn!(target: "desk", "using an in-memory secret by request: every token dies with this desk");
        Arc::new(MemoryStore::new())
    } else {
        match KeychainStore::open_default() {
            Ok(store) => Arc::new(store),
            Err(e) => {
                // Still start: say so plainly, and mint nothing until it is fixed.
                eprintln!("countersign-desk: {e}");
                return Begun {
                    dirs,
                    settings,
                    secret: Arc::new(Unavailable(e.to_string())),
                    key: Err(e.clone()),
                    items: Err(e),
                    open,
                    in_tray,
                };
            }
        }
    };
    let key = secret.load_or_create().map(|s| s.signing_key());
    if let Err(e) = &key {
        eprintln!("countersign-desk: {e}");
    }
    // Registered servers' credentials sit beside the secret: in memory when it is.
    let items: Result<Arc<dyn Items>, SecretError> = if in_memory {
        Ok(Arc::new(MemoryItems::new()))
    } else {
        KeychainItems::open_default().map(|items| Arc::new(items) as Arc<dyn Items>)
    };
    Begun {
        dirs,
        settings,
        secret,
        key,
        items,
        open,
        in_tray,
    }
}

/// A secret store that is not there: every operation says why.
struct Unavailable(String);

impl Unavailable {
    fn error(&self) -> SecretError {
        SecretError::NoKeychain {
            detail: self.0.clone(),
        }
    }
}

impl SecretStore for Unavailable {
    fn load(&self) -> Result<Option<HmacSecret>, SecretError> {
        Err(self.error())
    }
    fn save(&self, _: &HmacSecret) -> Result<(), SecretError> {
        Err(self.error())
    }
    fn delete(&self) -> Result<bool, SecretError> {
        Err(self.error())
    }
}

/// The engine, the registry and the sockets, serving; the schedules running on `rt`. A desk
/// already answering on the socket is asked to bring its window forward (or, for a start in the
/// tray with no URL, left alone) and this process exits 0; anything that cannot be opened ends
/// it with 1, saying why.
pub fn open(begun: Begun, window: bool, rt: &Handle) -> Desk {
    let Begun {
        dirs,
        settings,
        secret,
        key,
        items,
        open,
        in_tray,
    } = begun;
    let mut config = EngineConfig::new();
    let mut store_options = StoreOptions::default();
    // The history's head is signed with the chain key from the keychain; without a keychain,
    // events are still chained, and `countersign history verify` says which are not signed.
    match items
        .as_ref()
        .map_err(|e| e.to_string())
        .and_then(|i| seed::chain_key(i.as_ref()).map_err(|e| e.to_string()))
    {
        Ok(key) => {
            store_options = store_options.with_chain_key(Arc::new(key));
        }
        Err(e) => tracing::warn!(target: "desk", "history's head will not be signed: {e}"),
    }
    config.token_ttl_ms = settings.token_minutes * 60_000;
    config.approve_delay_ms = settings.approve_delay_ms;
    config.window = window;
    config.describer = Some(Arc::new(countersign_session::SqlDescriber::default()));
    let store = dirs.store();
    if let Some(dir) = store.parent().filter(|d| !d.as_os_str().is_empty())
        && let Err(e) = std::fs::create_dir_all(dir)
    {
        eprintln!(
            "countersign-desk: cannot create the data directory {}: {e}",
            dir.display()
        );
        std::process::exit(1);
    }
    // A file that cannot open now is reported by each call (which fails closed) and tried
    // again, rather than keeping the desk from starting.
    let records = Arc::new(Sqlite::open_deferred(&store, store_options));
    let engine = Engine::new(
        config,
        records.clone(),
        key.map_err(|e| NoKey::from(e.to_string())),
    );
    // The registry keeps what was accepted in the same records (one connection to the file).
    // What applies is what was last accepted: the policy and servers.json as they are on disk
    // are checked against it below, and an edit made outside the desk waits for the person.
    let remote_items = items.as_ref().ok().cloned();
    let registry = match Registry::open(&dirs.config, records, items, engine.clone()) {
        Ok(registry) => registry,
        Err(e) => {
            eprintln!("countersign-desk: cannot open the registry of servers: {e}");
            std::process::exit(1);
        }
    };
    engine.set_policy(registry.policy());
    engine.adopt_rules(registry.rules_text());
    let socket_path = countersign_wire::socket_path();
    let options = socket::Options {
        registry: Some(registry.clone()),
        ..socket::Options::default()
    };
    let served = match rt.block_on(socket::serve_with(
        engine.clone(),
        socket_path.clone(),
        options,
    )) {
        Ok(served) => served,
        // Two gateways that started a desk at once: the second leaves the first in the tray.
        Err(socket::SocketError::AlreadyRunning(_)) if in_tray && open.is_none() => {
            eprintln!("countersign-desk: already running");
            std::process::exit(0);
        }
        Err(socket::SocketError::AlreadyRunning(_)) => {
            eprintln!("countersign-desk: already running; bringing its window forward");
            if let Err(e) = rt.block_on(countersign_wire::focus_desk(&socket_path, open)) {
                eprintln!("countersign-desk: the running desk did not answer: {e}");
            }
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("countersign-desk: {e}");
            std::process::exit(1);
        }
    };
    let agents = serve_agents(&engine, &registry, settings.agent_uids(), rt);
    let _entered = rt.enter();
    let export = otlp::Export::new(dirs.store());
    if let Some(endpoint) = settings.otlp_endpoint.as_deref()
        && let Err(e) = export.apply(Some(endpoint))
    {
        tracing::warn!(target: "desk", "the OpenTelemetry collector in the settings is not used: {e}");
    }
    prune_on_a_schedule(&engine, rt);
    check_files_on_a_schedule(&registry, rt);
    // The team servers this desk approves for (only with a window to approve in): their waiting
    // calls join the queue.
    let remote = remote_items
        .filter(|_| window)
        .and_then(|items| approver::Remote::start(engine.clone(), dirs.config.clone(), &*items));
    Desk {
        export,
        remote,
        engine,
        dirs,
        settings: Mutex::new(settings),
        secret,
        keychain_problem: Mutex::new(None),
        registry,
        served,
        agents,
        wanted: Mutex::new(open),
    }
}

/// How often expired nonces and approvals, and history beyond what the store keeps, are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(60 * 60);

/// Prunes the store now and every [`PRUNE_EVERY`].
fn prune_on_a_schedule(engine: &Engine, rt: &Handle) {
    let engine = engine.clone();
    rt.spawn(async move {
        let mut every = tokio::time::interval(PRUNE_EVERY);
        loop {
            every.tick().await;
            match engine.prune().await {
                Ok(pruned) => tracing::info!(
                    target: "desk",
                    nonces = pruned.nonces,
                    approvals = pruned.approvals,
                    history = pruned.history,
                    "pruned the store"
                ),
                Err(e) => tracing::warn!(target: "desk", "could not prune the store: {e}"),
            }
        }
    });
}

/// How often the desk compares servers.json, policy.toml and policy.cedar with what it accepted.
const FILE_CHECK_EVERY: Duration = Duration::from_secs(2);

/// Compares the guarded files with what was accepted, now and every [`FILE_CHECK_EVERY`]: an
/// edit made outside the desk becomes a change the person decides.
fn check_files_on_a_schedule(registry: &Registry, rt: &Handle) {
    let registry = registry.clone();
    rt.spawn(async move {
        let mut every = tokio::time::interval(FILE_CHECK_EVERY);
        loop {
            every.tick().await;
            let registry = registry.clone();
            let _ = tokio::task::spawn_blocking(move || registry.check_files()).await;
        }
    });
}

/// The second socket, for the accounts the settings list (`countersign_wire::agents_socket_path`):
/// its directory 0711, the socket itself 0666, and each connection's account checked by the
/// desk against the list (the kernel says which account connected). Refused for one of those
/// accounts, a command or the built-in tools; a URL or a registered server is served. When it
/// cannot be set up the desk says why and serves its own account only.
fn serve_agents(
    engine: &Engine,
    registry: &Registry,
    uids: Vec<u32>,
    rt: &Handle,
) -> Option<socket::Served> {
    use std::os::unix::fs::PermissionsExt;

    if uids.is_empty() {
        return None;
    }
    let path = countersign_wire::agents_socket_path();
    let options = socket::Options {
        other_accounts: uids.clone(),
        registry: Some(registry.clone()),
        ..socket::Options::default()
    };
    let served = rt.block_on(socket::serve_with(engine.clone(), path.clone(), options));
    let served = match served {
        Ok(served) => served,
        Err(e) => {
            tracing::error!(target: "desk", "not serving agent accounts: {e}");
            eprintln!("countersign-desk: not serving agent accounts: {e}");
            return None;
        }
    };
    // Who may connect is decided per connection from the kernel's word; the file's mode only
    // lets the listed accounts' processes try.
    if let Err(e) = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)) {
        tracing::error!(target: "desk", "not serving agent accounts: {}: {e}", path.display());
        return None;
    }
    tracing::info!(target: "desk", socket = %path.display(), ?uids, "listening for agent accounts");
    Some(served)
}

/// The desk with no display: the sockets and the sessions, no window. Runs until SIGTERM or
/// SIGINT, then ends every upstream it started.
pub fn headless(desk: Desk, rt: &Handle) {
    eprintln!(
        "countersign-desk: no display: running without a window. Open tools work; calls that \
         need approval are refused until the desk runs in a desktop session."
    );
    rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            std::future::pending::<()>().await;
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    });
    tracing::info!(target: "desk", "stopping");
    let Desk { served, agents, .. } = desk;
    drop(agents);
    drop(served);
}
