//! The desk: the authority a person approves in.
//!
//! One per user. It reads the HMAC secret from the OS keychain once at start, owns the policy,
//! serves gateways on the local socket (whose bind is the single-instance lock: a second start
//! asks the first to come forward and exits), runs each gateway's MCP session and upstream, and
//! shows each preflight in its window, where only a person's click mints a token. With no display
//! it runs without a window: open tools work, gated calls are refused `desk_unavailable`. Webview automation and devtools exist only in debug builds: a
//! release build clears the automation switch from its own environment before any webview exists.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

mod commands;
mod settings;
mod view;

use std::sync::Mutex;

use countersign_core::token::SigningKey;
use countersign_engine::{Engine, EngineConfig, QueueChange};
use countersign_secret::{KeychainStore, MemoryStore, SecretStore};
use countersign_session as socket;
use countersign_wire::{Frame, Hello, PROTOCOL_VERSION};
use tauri::menu::{Menu, MenuItem};
use tauri::tray::TrayIconBuilder;
use tauri::{AppHandle, Emitter, Manager};

use settings::{Dirs, Settings};

/// The desk's state, shared with its commands.
pub struct Desk {
    engine: Engine,
    dirs: Dirs,
    settings: Mutex<Settings>,
    secret: Box<dyn SecretStore>,
    _served: socket::Served,
}

impl Desk {
    /// Rotates the secret and gives the engine the new key.
    fn rotate_secret(&self) -> Result<(), String> {
        let secret = self.secret.rotate().map_err(|e| e.to_string())?;
        self.engine.set_key(Ok(secret.signing_key()));
        tracing::warn!(target: "desk", "secret rotated: every outstanding token stopped working");
        Ok(())
    }
}

fn load_key(store: &dyn SecretStore) -> Result<SigningKey, String> {
    store
        .load_or_create()
        .map(|s| s.signing_key())
        .map_err(|e| e.to_string())
}

/// Tells the desk already running to bring its window forward.
fn focus_running_desk(path: &std::path::Path) {
    let _ = tauri::async_runtime::block_on(async {
        let mut stream = tokio::net::UnixStream::connect(path).await?;
        let hello = Frame::Hello(Hello::Focus {
            version: PROTOCOL_VERSION,
        });
        countersign_wire::write_frame(&mut stream, &hello)
            .await
            .map_err(std::io::Error::other)?;
        // The running desk closes the connection once it has asked its window forward.
        let _ = countersign_wire::read_frame(&mut stream).await;
        Ok::<_, std::io::Error>(())
    });
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

fn init_logging() {
    let user = std::env::var("RUST_LOG").ok();
    let filter = user
        .as_deref()
        .and_then(|s| tracing_subscriber::EnvFilter::try_new(s).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("info"))
        .add_directive("confirm=info".parse().expect("a valid directive"));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .init();
}

/// Brings the window forward and refreshes the pending count in its title and the tray.
fn show(app: &AppHandle) {
    if let Some(window) = app.get_webview_window("main") {
        let _ = window.show();
        let _ = window.unminimize();
        let _ = window.set_focus();
    }
}

/// A desktop notification for a new request, when the window is hidden or not focused.
fn notify_if_unseen(app: &AppHandle, request: &countersign_engine::PendingRequest) {
    use tauri_plugin_notification::NotificationExt;
    let seen = app
        .get_webview_window("main")
        .is_some_and(|w| w.is_visible().unwrap_or(false) && w.is_focused().unwrap_or(false));
    if seen {
        return;
    }
    let r = view::RequestView::from(request);
    let body = format!("{} asks to run {} on {}", r.agent, r.tool, r.target_shown);
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

/// Sends the whole queue to the window (it is small), and updates the counts.
fn publish_queue(app: &AppHandle, engine: &Engine) {
    let pending: Vec<view::RequestView> = engine
        .pending()
        .iter()
        .map(view::RequestView::from)
        .collect();
    let _ = app.emit("queue://changed", &pending);
    update_count(app, engine);
}

fn update_count(app: &AppHandle, engine: &Engine) {
    let n = engine.pending().len();
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
    // Release builds never offer webview automation, whatever the environment says.
    #[cfg(not(debug_assertions))]
    // SAFETY: first statement of main: no other thread exists yet to read the environment.
    unsafe {
        std::env::remove_var("TAURI_WEBVIEW_AUTOMATION");
    }
    // A text-only window needs no accelerated compositing, and without it WebKit's web process
    // idles at about 60 MB less (measured under Xvfb). A user's own setting wins.
    if std::env::var_os("WEBKIT_DISABLE_COMPOSITING_MODE").is_none() {
        // SAFETY: still single-threaded: no other thread reads the environment yet.
        unsafe {
            std::env::set_var("WEBKIT_DISABLE_COMPOSITING_MODE", "1");
        }
    }
    init_logging();
    let in_memory = std::env::args().any(|a| a == "--in-memory-secret");
    let dirs = Dirs::new();
    let settings = dirs.load_settings();
    let secret: Box<dyn SecretStore> = if in_memory {
        tracing::warn!(target: "desk", "using an in-memory secret by request: every token dies with this desk");
        Box::new(MemoryStore::new())
    } else {
        match KeychainStore::open_default() {
            Ok(store) => Box::new(store),
            Err(e) => {
                // Still start: say so plainly, and mint nothing until it is fixed.
                eprintln!("countersign-desk: {e}");
                let key = Err(e.to_string());
                return run(dirs, settings, Box::new(Unavailable(e.to_string())), key);
            }
        }
    };
    let key = load_key(secret.as_ref());
    if let Err(e) = &key {
        eprintln!("countersign-desk: {e}");
    }
    run(dirs, settings, secret, key)
}

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
    secret: Box<dyn SecretStore>,
    key: Result<SigningKey, String>,
) {
    let window = has_display();
    let mut config = EngineConfig::new(dirs.store());
    config.policy = dirs.load_policy();
    config.token_ttl_ms = settings.token_minutes * 60_000;
    config.window = window;
    let engine = match Engine::new(config, key) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("countersign-desk: {e}");
            std::process::exit(1);
        }
    };
    let socket_path = countersign_wire::socket_path();
    let served =
        match tauri::async_runtime::block_on(socket::serve(engine.clone(), socket_path.clone())) {
            Ok(served) => served,
            Err(socket::SocketError::AlreadyRunning(_)) => {
                eprintln!("countersign-desk: already running; bringing its window forward");
                focus_running_desk(&socket_path);
                std::process::exit(0);
            }
            Err(e) => {
                eprintln!("countersign-desk: {e}");
                std::process::exit(1);
            }
        };
    if !window {
        headless(served);
        return;
    }
    let kill_upstreams = served.children().clone();
    let desk = Desk {
        engine: engine.clone(),
        dirs,
        settings: Mutex::new(settings),
        secret,
        _served: served,
    };

    tauri::Builder::default()
        .plugin(tauri_plugin_notification::init())
        .manage(desk)
        .invoke_handler(tauri::generate_handler![
            commands::pending,
            commands::approve,
            commands::deny,
            commands::history,
            commands::settings,
            commands::save_settings,
            commands::rotate_secret,
            commands::status,
        ])
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
            // Queue changes reach the window as events: it never polls.
            let mut changes = engine.subscribe();
            tauri::async_runtime::spawn(async move {
                loop {
                    match changes.recv().await {
                        Ok(change) => {
                            if let QueueChange::Added { request } = &change {
                                notify_if_unseen(&handle, request);
                            }
                            publish_queue(&handle, &engine);
                            if matches!(change, QueueChange::Added { .. } | QueueChange::Focus) {
                                show(&handle);
                            }
                        }
                        // Missed some changes: the whole queue is sent anyway.
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                            publish_queue(&handle, &engine)
                        }
                        Err(_) => break,
                    }
                }
            });
            Ok(())
        })
        .build(tauri::generate_context!())
        .expect("the desk's window")
        .run(move |_, event| {
            // Tauri exits the process without dropping what it manages: end the upstreams now.
            if let tauri::RunEvent::Exit = event {
                kill_upstreams.kill_all();
            }
        });
}

/// The desk with no display: the socket and the sessions, no window. Runs until SIGTERM or
/// SIGINT, then ends every upstream it started.
fn headless(served: socket::Served) {
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
    drop(served);
}
