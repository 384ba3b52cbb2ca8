//! The desk: the authority a person approves in.
//!
//! One per user. It reads the HMAC secret from the OS keychain once at start, owns the policy,
//! serves gateways on the local socket (whose bind is the single-instance lock: a second start
//! asks the first to come forward and exits), runs each gateway's MCP session and upstream, and
//! shows each preflight in its window, where only a person's click mints a token. With no display
//! it becomes `countersign-authority` (exec, same arguments), which runs without a window and
//! maps no GUI toolkit: open tools work, gated calls are refused `desk_unavailable`. Everything
//! but the window, the tray and the window's commands is in `countersign_authority`.
//!
//! It takes nothing that matters from the environment of whoever started it (often a gateway,
//! the agent's own process): its files are the account's own, found from the password database
//! (`countersign_authority::settings::Dirs`); inspector and code-loading switches are scrubbed
//! first thing (`countersign_authority::harden`);
//! webview automation and devtools exist only in debug builds, and a release build is not
//! dumpable. It logs to stderr and to `desk.log` in its state directory (`log_file`), since a
//! desk a gateway started has no terminal. With accounts listed in its settings it also listens
//! on a second socket they can reach, for agents that run under accounts of their own.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

mod focus;
mod idle;
mod pace;

use countersign_authority::{Desk, commands, desk, harden, view};
use countersign_engine::{Engine, QueueChange};
use tauri::menu::{Menu, MenuItem};
use tauri::tray::TrayIconBuilder;
use tauri::{AppHandle, Emitter, Manager};

/// The window as the desk's commands see it: events go to its page.
struct Page(AppHandle);

impl commands::Window for Page {
    fn emit(&self, event: &str, payload: serde_json::Value) {
        let _ = self.0.emit(event, payload);
    }
}

/// Every command the page invokes, by name ([`commands::invoke`]). Tauri has already checked the
/// name against the window's capability (`capabilities/approval.json`, granted to the approval
/// window's label alone) before this runs.
fn invoke(invoke: tauri::ipc::Invoke) -> bool {
    let app = invoke.message.webview().app_handle().clone();
    let command = invoke.message.command().to_owned();
    let arguments = match invoke.message.payload() {
        tauri::ipc::InvokeBody::Json(arguments) => Ok(arguments.clone()),
        tauri::ipc::InvokeBody::Raw(_) => Err(view::UiError::new(
            view::UiCode::BadRequest,
            "the desk's commands take JSON arguments",
        )),
    };
    invoke.resolver.respond_async(async move {
        let arguments = arguments.map_err(tauri::ipc::InvokeError::from)?;
        let desk = app.state::<Desk>();
        commands::invoke(&desk, &Page(app.clone()), &command, arguments)
            .await
            .map_err(tauri::ipc::InvokeError::from)
    });
    true
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
    if !desk::has_display() {
        // Nothing to show: the desk runs as `countersign-authority`, which links no WebKit.
        become_authority();
    }
    // A text-only window needs no accelerated compositing, and without it WebKit's web process
    // idles at about 60 MB less (measured under Xvfb). A user's own setting wins.
    if std::env::var_os("WEBKIT_DISABLE_COMPOSITING_MODE").is_none() {
        // SAFETY: still single-threaded: no other thread reads the environment yet.
        unsafe {
            std::env::set_var("WEBKIT_DISABLE_COMPOSITING_MODE", "1");
        }
    }
    let begun = desk::begin(&hardened);
    run(begun);
}

/// Replaces this process with `countersign-authority` from this program's own directory (never
/// from `PATH`), with the same arguments and environment: the desk without a window, in a program
/// that never maps WebKit or GTK. Returns only when it cannot (not installed beside this one):
/// this program then serves without a window itself, as the other would have.
fn become_authority() {
    use std::os::unix::process::CommandExt;

    let Some(authority) = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("countersign-authority")))
        .filter(|path| path.is_file())
    else {
        return;
    };
    let err = std::process::Command::new(&authority)
        .args(std::env::args_os().skip(1))
        .exec();
    eprintln!(
        "countersign-desk: could not run {}: {err}; serving without a window here",
        authority.display()
    );
}

fn run(begun: desk::Begun) {
    let window = desk::has_display();
    let in_tray = begun.in_tray;
    let open = begun.open;
    let wants_request = open.is_some();
    let release_after = idle::release_after(begun.settings.release_after_s);
    let rt = tauri::async_runtime::handle();
    let desk = desk::open(begun, window, rt.inner());
    if !window {
        desk::headless(desk, rt.inner());
        return;
    }
    let engine = desk.engine.clone();
    let kill_upstreams = desk.served.children().clone();
    let kill_agents_upstreams = desk.agents.as_ref().map(|a| a.children().clone());

    tauri::Builder::default()
        .plugin(tauri_plugin_notification::init())
        .manage(desk)
        .manage(idle::Lifecycle::new(release_after))
        .invoke_handler(invoke)
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
                let mut every = tokio::time::interval(desk::KEYCHAIN_CHECK_EVERY);
                loop {
                    every.tick().await;
                    let desk = asking.state::<Desk>();
                    commands::check_keychain(&desk, &Page(asking.clone())).await;
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
