//! The desk: the authority a person approves in.
//!
//! One per user. It reads the HMAC secret from the OS keychain once at start, owns the policy,
//! serves gateways on the local socket (whose bind is the single-instance lock: a second start
//! asks the first to come forward and exits), runs each gateway's MCP session and upstream, and
//! shows each preflight in its window, where only a person's click mints a token. With no display
//! it runs without a window: open tools work, gated calls are refused `desk_unavailable`.
//!
//! It takes nothing that matters from the environment of whoever started it (often a gateway,
//! the agent's own process): its files are the account's own, found from the password database
//! (`settings::Dirs`); inspector and code-loading switches are scrubbed first thing (`harden`);
//! webview automation and devtools exist only in debug builds, and a release build is not
//! dumpable. It logs to stderr and to `desk.log` in its state directory (`log_file`), since a
//! desk a gateway started has no terminal. With accounts listed in its settings it also listens
//! on a second socket they can reach, for agents that run under accounts of their own.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

mod approver;
mod clients;
mod commands;
mod focus;
mod grants;
mod harden;
mod idle;
mod log_file;
mod otlp;
mod pace;
mod seed;
mod servers;
mod settings;
mod view;

use std::sync::Mutex;

use countersign_core::token::SigningKey;
use countersign_engine::{Engine, EngineConfig, QueueChange};
use countersign_registry::Registry;
use countersign_secret::{
    Items, KeychainItems, KeychainStore, MemoryItems, MemoryStore, SecretError, SecretStore,
};
use countersign_session as socket;
use tauri::menu::{Menu, MenuItem};
use tauri::tray::TrayIconBuilder;
use tauri::{AppHandle, Emitter, Manager};

use settings::{Dirs, Settings};

/// The desk's state, shared with its commands.
pub struct Desk {
    engine: Engine,
    dirs: Dirs,
    settings: Mutex<Settings>,
    secret: std::sync::Arc<dyn SecretStore>,
    /// Why the keychain could not be read when last asked (`None`: it could).
    keychain_problem: Mutex<Option<String>>,
    /// Registered servers, and the guard on servers.json and policy.toml.
    registry: Registry,
    _served: socket::Served,
    _agents: Option<socket::Served>,
    /// The team servers this desk approves for, when it is enrolled with any.
    remote: Option<approver::Remote>,
    /// Confirm events sent to the OpenTelemetry collector of the settings, if any.
    export: otlp::Export,
}

impl Desk {
    /// Rotates the secret and gives the engine the new key.
    fn rotate_secret(&self) -> Result<(), String> {
        let secret = self.secret.rotate().map_err(|e| e.to_string())?;
        self.engine.set_key(Ok(secret.signing_key()));
        tracing::warn!(target: "desk", "secret rotated: every outstanding token stopped working");
        Ok(())
    }

    /// Every request waiting for this person: the desk's own, then team servers'.
    fn pending(&self) -> Vec<countersign_engine::PendingRequest> {
        pending_of(&self.engine, self.remote.as_ref())
    }

    /// Why nothing can be approved right now, if so: no key at all, or a keychain that stopped
    /// answering since.
    fn secret_problem(&self) -> Option<String> {
        self.engine
            .secret_problem()
            .or_else(|| self.keychain_problem.lock().unwrap().clone())
    }
}

/// How long the keychain may take to answer before the desk counts it as unavailable (a locked
/// keychain may wait for a prompt nobody answers).
const KEYCHAIN_ANSWER: std::time::Duration = std::time::Duration::from_secs(5);

/// How often the desk asks the keychain whether it is still there, to show or clear the banner.
const KEYCHAIN_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// Asks the keychain for the secret, on the blocking pool, and records and announces
/// (`secret://status`) whether it answered. The desk mints only while the keychain answers: a
/// keychain that was locked or whose service went away means the person's secrets are not to be
/// used, so Approve stops with a banner. Verifying tokens already minted goes on with the key
/// read at start: those approvals were given while the keychain was there, and refusing them
/// would only strand work the person already allowed; they still expire as always.
pub(crate) async fn check_keychain(app: &AppHandle) -> Option<String> {
    let desk = app.state::<Desk>();
    // No key at all (the keychain was missing at start): that is the problem to show, as it was
    // said then.
    if let Some(problem) = desk.engine.secret_problem() {
        return Some(problem);
    }
    let secret = desk.secret.clone();
    let asked = tauri::async_runtime::spawn_blocking(move || match secret.load() {
        Ok(Some(_)) => None,
        Ok(None) => Some("the secret is no longer in the OS keychain".to_owned()),
        Err(e) => Some(e.to_string()),
    });
    let problem = match tokio::time::timeout(KEYCHAIN_ANSWER, asked).await {
        Ok(Ok(problem)) => problem,
        Ok(Err(e)) => Some(format!("asking the keychain failed: {e}")),
        Err(_) => Some(format!(
            "the OS keychain did not answer within {} s (locked?)",
            KEYCHAIN_ANSWER.as_secs()
        )),
    };
    let changed = {
        let mut last = desk.keychain_problem.lock().unwrap();
        let changed = *last != problem;
        *last = problem.clone();
        changed
    };
    if changed {
        match &problem {
            Some(why) => tracing::error!(target: "desk", "minting stopped: {why}"),
            None => tracing::warn!(target: "desk", "the keychain answers again: minting resumed"),
        }
        let _ = app.emit("secret://status", desk.secret_problem());
    }
    problem
}

fn load_key(store: &dyn SecretStore) -> Result<SigningKey, String> {
    store
        .load_or_create()
        .map(|s| s.signing_key())
        .map_err(|e| e.to_string())
}

/// Tells the desk already running to bring its window forward, showing `request` if given.
fn focus_running_desk(path: &std::path::Path, request: Option<u64>) {
    if let Err(e) = tauri::async_runtime::block_on(countersign_wire::focus_desk(path, request)) {
        eprintln!("countersign-desk: the running desk did not answer: {e}");
    }
}

/// Whether a window can be shown: a display server is named in the environment.
fn has_display() -> bool {
    if cfg!(any(target_os = "macos", target_os = "windows")) {
        return true;
    }
    ["DISPLAY", "WAYLAND_DISPLAY"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|d| !d.is_empty()))
}

/// Logs to stderr (as `RUST_LOG` says, confirmation events always) and to the log file in the
/// state directory at `info` whatever the environment says: the file is the record that outlives
/// an outage of the store, so whoever started the desk does not get to thin it. rmcp's events
/// above `info` are never written, whatever `RUST_LOG` says: they print every MCP message whole,
/// and a confirm carries its token, as does the answer to an approved preflight.
fn init_logging(state: &std::path::Path) {
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

/// The window was just shown or regained focus: the engine accepts no approve until the approve
/// delay has passed again, and the window disables Approve for as long. The engine holds first,
/// so the window's own wait always ends after the engine's.
fn hold_approvals(app: &AppHandle) {
    if let Some(desk) = app.try_state::<Desk>() {
        desk.engine.hold_approvals();
    }
    let _ = app.emit("approvals://held", ());
}

/// Brings the window forward (creating it again when it was released, `idle`); the engine holds
/// approvals for the delay first.
fn show(app: &AppHandle) {
    hold_approvals(app);
    idle::want(app, true);
}

/// A desktop notification for new requests (the newest, and how many more came with it), when
/// the window is hidden or not focused.
fn notify_if_unseen(app: &AppHandle, request: &countersign_engine::PendingRequest, more: usize) {
    use tauri_plugin_notification::NotificationExt;
    let seen = app
        .get_webview_window("main")
        .is_some_and(|w| w.is_visible().unwrap_or(false) && w.is_focused().unwrap_or(false));
    if seen {
        return;
    }
    // Freedesktop notification servers may render the body as markup; macOS and Windows do not.
    let markup = cfg!(all(unix, not(target_os = "macos")));
    let mut body = view::notification_body(request, markup);
    if more > 0 {
        body.push_str(&format!(" (and {more} more)"));
    }
    if let Err(e) = app
        .notification()
        .builder()
        .title("Countersign: approval needed")
        .body(body)
        .show()
    {
        tracing::debug!(target: "desk", "no desktop notification: {e}");
    }
}

/// The desk's own waiting requests, then those of the team servers it approves for.
fn pending_of(
    engine: &Engine,
    remote: Option<&approver::Remote>,
) -> Vec<countersign_engine::PendingRequest> {
    let mut pending = engine.pending();
    if let Some(remote) = remote {
        pending.extend(remote.pending());
    }
    pending
}

/// Sends the whole queue to the window (it is small), and updates the counts.
fn publish_queue(app: &AppHandle, engine: &Engine) {
    let pending = match app.try_state::<Desk>() {
        Some(desk) => desk.pending(),
        None => engine.pending(),
    };
    let views: Vec<view::RequestView> = pending.iter().map(view::RequestView::from).collect();
    let _ = app.emit("queue://changed", &views);
    update_count(app, engine);
}

fn update_count(app: &AppHandle, engine: &Engine) {
    let n = match app.try_state::<Desk>() {
        Some(desk) => desk.pending().len(),
        None => engine.pending().len(),
    };
    let title = if n == 0 {
        "Countersign".to_owned()
    } else {
        format!("Countersign ({n} pending)")
    };
    if let Some(window) = app.get_webview_window("main") {
        let _ = window.set_title(&title);
    }
    if let Some(tray) = app.tray_by_id("countersign") {
        let _ = tray.set_tooltip(Some(&title));
        let _ = tray.set_title(if n == 0 { None } else { Some(n.to_string()) });
    }
}

fn main() {
    // SAFETY: first statement of main: no other thread exists yet to read the environment.
    let hardened = unsafe { harden::harden() };
    // A text-only window needs no accelerated compositing, and without it WebKit's web process
    // idles at about 60 MB less (measured under Xvfb). A user's own setting wins.
    if std::env::var_os("WEBKIT_DISABLE_COMPOSITING_MODE").is_none() {
        // SAFETY: still single-threaded: no other thread reads the environment yet.
        unsafe {
            std::env::set_var("WEBKIT_DISABLE_COMPOSITING_MODE", "1");
        }
    }
    // `countersign approver …` (enrolling this desk with team servers): done before any window,
    // with the OS keychain, and the process ends.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("history-key") {
        // `countersign history key`: the public half of the chain key, made on first need.
        let code = match KeychainItems::open_default()
            .map_err(|e| e.to_string())
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
        };
        std::process::exit(code);
    }
    if args.first().map(String::as_str) == Some("approver") {
        let code = match (Dirs::new(), KeychainItems::open_default()) {
            (Ok(dirs), Ok(items)) => approver::command(&dirs.config, &items, &args[1..]),
            (Err(e), _) => {
                eprintln!("countersign approver: {e}");
                1
            }
            (_, Err(e)) => {
                eprintln!("countersign approver: refused (no_keychain): {e}");
                3
            }
        };
        std::process::exit(code);
    }
    // A request URL to open (`countersign://request/<id>`, from the desktop entry or `countersign
    // open`): read strictly before anything starts; anything else does nothing.
    let open = match focus::from_args(std::env::args().skip(1)) {
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
    let in_memory = std::env::args().any(|a| a == "--in-memory-secret");
    let settings = dirs.load_settings();
    let secret: std::sync::Arc<dyn SecretStore> = if in_memory {
        tracing::warn!(target: "desk", "using an in-memory secret by request: every token dies with this desk");
        std::sync::Arc::new(MemoryStore::new())
    } else {
        match KeychainStore::open_default() {
            Ok(store) => std::sync::Arc::new(store),
            Err(e) => {
                // Still start: say so plainly, and mint nothing until it is fixed.
                eprintln!("countersign-desk: {e}");
                let key = Err(e.to_string());
                return run(
                    dirs,
                    settings,
                    std::sync::Arc::new(Unavailable(e.to_string())),
                    key,
                    Err(e),
                    open,
                );
            }
        }
    };
    let key = load_key(secret.as_ref());
    if let Err(e) = &key {
        eprintln!("countersign-desk: {e}");
    }
    // Registered servers' credentials sit beside the secret: in memory when it is.
    let items: Result<std::sync::Arc<dyn Items>, SecretError> = if in_memory {
        Ok(std::sync::Arc::new(MemoryItems::new()))
    } else {
        KeychainItems::open_default()
            .map(|items| std::sync::Arc::new(items) as std::sync::Arc<dyn Items>)
    };
    run(dirs, settings, secret, key, items, open)
}

/// Starts the desk in the tray, without its window (and so without WebKit) until something is to
/// be decided: what a gateway passes when it starts the desk for an agent. `countersign desk`
/// and the desktop entry pass nothing, and open the window.
const TRAY_FLAG: &str = countersign_wire::DESK_IN_TRAY;

/// A secret store that is not there: every operation says why.
struct Unavailable(String);

impl SecretStore for Unavailable {
    fn load(
        &self,
    ) -> Result<Option<countersign_secret::HmacSecret>, countersign_secret::SecretError> {
        Err(countersign_secret::SecretError::NoKeychain {
            detail: self.0.clone(),
        })
    }
    fn save(
        &self,
        _: &countersign_secret::HmacSecret,
    ) -> Result<(), countersign_secret::SecretError> {
        Err(countersign_secret::SecretError::NoKeychain {
            detail: self.0.clone(),
        })
    }
    fn delete(&self) -> Result<bool, countersign_secret::SecretError> {
        Err(countersign_secret::SecretError::NoKeychain {
            detail: self.0.clone(),
        })
    }
}

fn run(
    dirs: Dirs,
    settings: Settings,
    secret: std::sync::Arc<dyn SecretStore>,
    key: Result<SigningKey, String>,
    items: Result<std::sync::Arc<dyn Items>, SecretError>,
    open: Option<u64>,
) {
    let window = has_display();
    let in_tray = std::env::args().any(|a| a == TRAY_FLAG);
    let wants_request = open.is_some();
    let mut config = EngineConfig::new(dirs.store());
    // The history's head is signed with the chain key from the keychain; without a keychain,
    // events are still chained, and `countersign history verify` says which are not signed.
    match items
        .as_ref()
        .map_err(|e| e.to_string())
        .and_then(|i| seed::chain_key(i.as_ref()))
    {
        Ok(key) => {
            config.store_options = config
                .store_options
                .with_chain_key(std::sync::Arc::new(key));
        }
        Err(e) => tracing::warn!(target: "desk", "history's head will not be signed: {e}"),
    }
    config.token_ttl_ms = settings.token_minutes * 60_000;
    config.approve_delay_ms = settings.approve_delay_ms;
    config.window = window;
    config.describer = Some(std::sync::Arc::new(countersign_session::SqlDescriber));
    let engine = match Engine::new(config, key.map_err(Into::into)) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("countersign-desk: {e}");
            std::process::exit(1);
        }
    };
    // What applies is what was last accepted: the policy and servers.json as they are on disk
    // are checked against it below, and an edit made outside the desk waits for the person.
    let remote_items = items.as_ref().ok().cloned();
    let registry = match Registry::open(&dirs.config, &dirs.store(), items, engine.clone()) {
        Ok(registry) => registry,
        Err(e) => {
            eprintln!("countersign-desk: cannot open the registry of servers: {e}");
            std::process::exit(1);
        }
    };
    engine.set_policy(registry.policy());
    let socket_path = countersign_wire::socket_path();
    let options = socket::Options {
        registry: Some(registry.clone()),
        ..socket::Options::default()
    };
    let served = match tauri::async_runtime::block_on(socket::serve_with(
        engine.clone(),
        socket_path.clone(),
        options,
    )) {
        Ok(served) => served,
        // Two gateways that started a desk at once: the second leaves the first in the tray.
        Err(socket::SocketError::AlreadyRunning(_)) if in_tray && !wants_request => {
            eprintln!("countersign-desk: already running");
            std::process::exit(0);
        }
        Err(socket::SocketError::AlreadyRunning(_)) => {
            eprintln!("countersign-desk: already running; bringing its window forward");
            focus_running_desk(&socket_path, open);
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("countersign-desk: {e}");
            std::process::exit(1);
        }
    };
    let agents = serve_agents(&engine, &registry, settings.agent_uids());
    let export = otlp::Export::new(dirs.store());
    if let Some(endpoint) = settings.otlp_endpoint.as_deref()
        && let Err(e) = export.apply(Some(endpoint))
    {
        tracing::warn!(target: "desk", "the OpenTelemetry collector in the settings is not used: {e}");
    }
    prune_on_a_schedule(&engine);
    check_files_on_a_schedule(&registry);
    if !window {
        headless(served, agents);
        return;
    }
    let release_after = idle::release_after(settings.release_after_s);
    let kill_upstreams = served.children().clone();
    let kill_agents_upstreams = agents.as_ref().map(|a| a.children().clone());
    // The team servers this desk approves for: their waiting calls join the queue.
    let remote = remote_items
        .and_then(|items| approver::Remote::start(engine.clone(), dirs.config.clone(), &*items));
    let desk = Desk {
        export,
        remote,
        engine: engine.clone(),
        dirs,
        settings: Mutex::new(settings),
        secret,
        keychain_problem: Mutex::new(None),
        registry,
        _served: served,
        _agents: agents,
    };

    tauri::Builder::default()
        .plugin(tauri_plugin_notification::init())
        .manage(desk)
        .manage(idle::Lifecycle::new(release_after))
        .manage(focus::Wanted::new(open))
        .invoke_handler(tauri::generate_handler![
            commands::pending,
            commands::approve,
            commands::deny,
            commands::history,
            commands::settings,
            commands::save_settings,
            commands::export_status,
            commands::save_history,
            commands::rotate_secret,
            commands::status,
            grants::grant_offer,
            grants::approve_widening,
            grants::grants,
            grants::revoke_grant,
            servers::servers,
            servers::save_server,
            servers::remove_server,
            clients::clients,
            clients::protect_client,
            clients::restore_client,
            focus::take_focus,
        ])
        .on_window_event(|window, event| {
            match event {
                tauri::WindowEvent::Focused(true) => hold_approvals(window.app_handle()),
                // Closing hides: the desk goes on serving, and releases the webview when idle.
                tauri::WindowEvent::CloseRequested { api, .. } if window.label() == idle::LABEL => {
                    api.prevent_close();
                    let _ = window.hide();
                }
                _ => {}
            }
        })
        // A page that has loaded (the window created again after a release, too) holds
        // approvals: the delay runs from when the request can be on screen.
        .on_page_load(|webview, payload| {
            if payload.event() == tauri::webview::PageLoadEvent::Finished {
                hold_approvals(webview.app_handle());
            }
        })
        .setup(move |app| {
            let handle = app.handle().clone();
            let quit = MenuItem::with_id(app, "quit", "Quit Countersign", true, None::<&str>)?;
            let open = MenuItem::with_id(app, "show", "Show", true, None::<&str>)?;
            let menu = Menu::with_items(app, &[&open, &quit])?;
            let tray = TrayIconBuilder::with_id("countersign")
                .tooltip("Countersign")
                .menu(&menu)
                .on_menu_event(|app, event| match event.id.as_ref() {
                    "quit" => app.exit(0),
                    _ => show(app),
                });
            let tray = match app.default_window_icon() {
                Some(icon) => tray.icon(icon.clone()),
                None => tray,
            };
            if let Err(e) = tray.build(app) {
                tracing::warn!(target: "desk", "no tray icon: {e}");
            }
            idle::watch(&handle);
            // Whether the keychain still answers, now and then: the banner follows it.
            let asking = handle.clone();
            tauri::async_runtime::spawn(async move {
                let mut every = tokio::time::interval(KEYCHAIN_CHECK_EVERY);
                loop {
                    every.tick().await;
                    check_keychain(&asking).await;
                }
            });
            // Queue changes reach the window as events: it never polls. Changes that arrive
            // together go out as one update, and raising the window or notifying is paced
            // (`pace`), so a flood of requests cannot turn into a flood of interruptions.
            let mut changes = engine.subscribe();
            // The window, unless the desk was started in the tray (by a gateway, for an agent,
            // with nothing to decide: the first request brings it) and no URL asks for one. The
            // socket serves before this runs, so a request may be waiting already (queued before
            // the subscription above, it brings no event): then the window comes for it.
            let windowed = !in_tray || wants_request || !engine.pending().is_empty();
            if windowed {
                idle::want(&handle, true);
            }
            tracing::info!(target: "desk", in_tray = !windowed, "ready");
            tauri::async_runtime::spawn(async move {
                use tokio::sync::broadcast::error::RecvError;
                let mut interruptions = pace::Interruptions::default();
                'changes: loop {
                    let mut batch = pace::Batch::default();
                    let mut newest = None;
                    let mut absorb = |change: QueueChange, batch: &mut pace::Batch| match change {
                        QueueChange::Added { request } => {
                            batch.added += 1;
                            newest = Some(request);
                        }
                        QueueChange::Focus { request } => {
                            batch.focus = true;
                            if let Some(id) = request {
                                focus::asked(&handle, id);
                            }
                        }
                        QueueChange::Removed { .. } | QueueChange::Updated { .. } => {}
                    };
                    match changes.recv().await {
                        Ok(change) => absorb(change, &mut batch),
                        // Missed some changes: the whole queue is sent anyway.
                        Err(RecvError::Lagged(_)) => {}
                        Err(RecvError::Closed) => break,
                    }
                    // The first change goes out at once (a person deciding one request sees the
                    // next without delay); whatever follows within `GATHER` goes out together.
                    publish_queue(&handle, &engine);
                    idle::touch(&handle);
                    if batch.added > 0 {
                        // A released window starts coming back at once, hidden until the raise
                        // below shows it (when the pace allows one).
                        idle::want(&handle, false);
                    }
                    let until = tokio::time::Instant::now() + pace::GATHER;
                    let mut more = false;
                    loop {
                        match tokio::time::timeout_at(until, changes.recv()).await {
                            Ok(Ok(change)) => {
                                absorb(change, &mut batch);
                                more = true;
                            }
                            Ok(Err(RecvError::Lagged(_))) => more = true,
                            Ok(Err(RecvError::Closed)) => break 'changes,
                            Err(_) => break,
                        }
                    }
                    if more {
                        publish_queue(&handle, &engine);
                    }
                    let actions = interruptions.decide(&batch, std::time::Instant::now());
                    if let (Some(added), Some(request)) = (actions.notify, &newest) {
                        notify_if_unseen(&handle, request, added.saturating_sub(1));
                    }
                    if actions.raise {
                        show(&handle);
                    } else if batch.added > 0 {
                        // Released while idle: the window comes back, loaded, for the tray.
                        idle::want(&handle, false);
                    }
                }
            });
            Ok(())
        })
        .build(tauri::generate_context!())
        .expect("the desk's window")
        .run(move |app, event| {
            idle::on_run_event(app, &event);
            // Tauri exits the process without dropping what it manages: end the upstreams now.
            if let tauri::RunEvent::Exit = event {
                kill_upstreams.kill_all();
                if let Some(children) = &kill_agents_upstreams {
                    children.kill_all();
                }
            }
        });
}

/// How often expired nonces and approvals, and history beyond what the store keeps, are pruned.
const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(60 * 60);

/// Prunes the store at start and then every [`PRUNE_EVERY`].
fn prune_on_a_schedule(engine: &Engine) {
    let engine = engine.clone();
    tauri::async_runtime::spawn(async move {
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

/// How often the desk compares servers.json and policy.toml with what it accepted.
const FILE_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Compares the guarded files with what was accepted, now and every [`FILE_CHECK_EVERY`]: an
/// edit made outside the desk becomes a change the person decides.
fn check_files_on_a_schedule(registry: &Registry) {
    let registry = registry.clone();
    tauri::async_runtime::spawn(async move {
        let mut every = tokio::time::interval(FILE_CHECK_EVERY);
        loop {
            every.tick().await;
            let registry = registry.clone();
            let _ = tauri::async_runtime::spawn_blocking(move || registry.check_files()).await;
        }
    });
}

/// The second socket, for the accounts the settings list (`countersign_wire::agents_socket_path`):
/// its directory 0711, the socket itself 0666, and each connection's account checked by the
/// desk against the list (the kernel says which account connected). Refused for one of those
/// accounts, a command or the built-in tools; a URL or a registered server is served. When it
/// cannot be set up the desk says why and serves its own account only.
fn serve_agents(engine: &Engine, registry: &Registry, uids: Vec<u32>) -> Option<socket::Served> {
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
    let served =
        tauri::async_runtime::block_on(socket::serve_with(engine.clone(), path.clone(), options));
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
fn headless(served: socket::Served, agents: Option<socket::Served>) {
    eprintln!(
        "countersign-desk: no display: running without a window. Open tools work; calls that \
         need approval are refused until the desk runs in a desktop session."
    );
    tauri::async_runtime::block_on(async {
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
    drop(agents);
    drop(served);
}
