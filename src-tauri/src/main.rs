//! `countersign-desk`: the desk's entry point, and its window.
//!
//! Started any way but one (`countersign desk`, the desktop entry, a gateway, a request URL), it
//! becomes `countersign-headless-desk` (exec, same arguments, same process): the desk, which reads
//! the secret from the keychain, owns the policy, serves gateways on the local socket and runs
//! their sessions, and links no GUI toolkit (`countersign_headless_desk`).
//!
//! Started by that desk with [`WINDOW_FLAG`] and one end of a socket pair on [`CHANNEL_FD`], it is
//! the desk's window: the only process that maps GTK and WebKit, ended when idle, so that the desk
//! weighs little while nobody needs it. It brings GTK up at once but makes its window (and
//! with it WebKit's processes) only when the desk says `open`: the desk starts one ahead of need,
//! as a spare, so that a window opens without waiting for a process to start and GTK to come up.
//! It runs no command itself: each command the page invokes (Tauri has checked the window's
//! capability first) crosses the channel and runs in the desk, and the desk sends back the answer, the events
//! the page listens for, and when to show the window. It tells the desk when the window is shown,
//! focused, closed or loaded (the desk holds approvals then). When the channel closes (the desk
//! ended it, or the desk is gone) it exits: a window never outlives its desk.
//!
//! Its peer on the channel must be its parent (the kernel's word, `SO_PEERCRED`): a process started
//! any other way with something on descriptor 3 refuses it and exits. Inspector and code-loading
//! switches are scrubbed first thing (`countersign_headless_desk::start::harden`); webview automation and
//! devtools exist only in debug builds, and a release build is not dumpable.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]
#![allow(unsafe_code)] // this program takes its channel and hardens itself through libc; each unsafe block says why it is sound

use countersign_core::sync::lock;
use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use countersign_headless_desk::start::harden;
use countersign_headless_desk::window::channel::{
    self, CHANNEL_FD, FromWindow, ToWindow, WINDOW_FLAG,
};
use serde_json::{Value, json};
use tauri::{AppHandle, Emitter, Manager, WebviewWindowBuilder};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};

/// The approval window's label (`tauri.conf.json`, `capabilities/approval.json`).
const LABEL: &str = "main";

fn main() {
    if std::env::args().nth(1).as_deref() == Some(WINDOW_FLAG) {
        // SAFETY: first statement of the window's path: no other thread exists yet to read the
        // environment.
        let _hardened = unsafe { harden::harden() };
        window();
        return;
    }
    // The desk hardens itself first thing, and says in its log what it removed.
    become_authority();
}

/// Replaces this process with `countersign-headless-desk` from this program's own directory (never
/// from `PATH`), with the same arguments and environment.
fn become_authority() {
    use std::os::unix::process::CommandExt;

    let authority = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("countersign-headless-desk")));
    let Some(authority) = authority else {
        eprintln!("countersign-desk: cannot tell where this program is");
        std::process::exit(1);
    };
    let err = std::process::Command::new(&authority)
        .args(std::env::args_os().skip(1))
        .exec();
    eprintln!(
        "countersign-desk: could not run {} (it is installed beside this program): {err}",
        authority.display()
    );
    std::process::exit(1);
}

/// Why this window's process has no channel to its desk: it then exits, showing nothing.
#[derive(Debug, thiserror::Error)]
enum ChannelError {
    /// The descriptor is closed or not a socket: this program was not started by a desk.
    #[error("descriptor {CHANNEL_FD} is not the desk's channel")]
    NotASocket,
    /// The socket's peer is another process, or another account's.
    #[error("the peer on the channel is not the desk that started this window")]
    NotTheDesk,
    /// The socket could not be made non-blocking.
    #[error("the desk's channel: {0}")]
    Io(#[source] std::io::Error),
}

/// The channel on [`CHANNEL_FD`], if it is a Unix socket whose peer is this process's parent.
fn take_channel() -> Result<std::os::unix::net::UnixStream, ChannelError> {
    // SAFETY: an all-zero `stat` is a valid value of that plain C struct.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on a descriptor number only reads its status; a closed one fails.
    if unsafe { libc::fstat(CHANNEL_FD, &mut stat) } != 0
        || stat.st_mode & libc::S_IFMT != libc::S_IFSOCK
    {
        return Err(ChannelError::NotASocket);
    }
    // SAFETY: the descriptor is open (fstat said so) and nothing else in this process owns it.
    let stream = std::os::unix::net::UnixStream::from(unsafe { OwnedFd::from_raw_fd(CHANNEL_FD) });
    // SAFETY: an all-zero `ucred` is a valid value of that plain C struct.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let got = unsafe {
        libc::getsockopt(
            CHANNEL_FD,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    // SAFETY: getppid and geteuid have no preconditions.
    let (parent, me) = unsafe { (libc::getppid(), libc::geteuid()) };
    if got != 0 || cred.pid != parent || cred.uid != me {
        return Err(ChannelError::NotTheDesk);
    }
    // Set close-on-exec: WebKit's processes must not inherit the channel.
    // SAFETY: fcntl on our own open descriptor.
    unsafe {
        let flags = libc::fcntl(CHANNEL_FD, libc::F_GETFD);
        libc::fcntl(CHANNEL_FD, libc::F_SETFD, flags | libc::FD_CLOEXEC);
    }
    stream.set_nonblocking(true).map_err(ChannelError::Io)?;
    Ok(stream)
}

/// The window's side of the channel, in the app's state.
struct Link {
    to: mpsc::UnboundedSender<FromWindow>,
    waiting: Mutex<HashMap<u64, oneshot::Sender<Result<Value, Value>>>>,
    next: AtomicU64,
    /// What the window is: shown (visible) and focused, as last told to the desk.
    seen: Mutex<(bool, bool)>,
}

impl Link {
    /// Tells the desk how the window stands, when that changed.
    fn seen(&self, visible: Option<bool>, focused: Option<bool>) {
        let mut seen = lock(&self.seen);
        let now = (visible.unwrap_or(seen.0), focused.unwrap_or(seen.1));
        if now != *seen {
            *seen = now;
            let _ = self.to.send(FromWindow::Seen {
                visible: now.0,
                focused: now.1,
            });
        }
    }
}

/// Each command the page invokes goes to the desk; its answer comes back by the invoke's id.
fn forward(invoke: tauri::ipc::Invoke) -> bool {
    let app = invoke.message.webview().app_handle().clone();
    let command = invoke.message.command().to_owned();
    let args = match invoke.message.payload() {
        tauri::ipc::InvokeBody::Json(args) => Some(args.clone()),
        tauri::ipc::InvokeBody::Raw(_) => None,
    };
    invoke.resolver.respond_async(async move {
        let Some(args) = args else {
            return Err(tauri::ipc::InvokeError(json!({
                "code": "bad_request",
                "message": "the desk's commands take JSON arguments",
                "wait_ms": null,
            })));
        };
        let link = app.state::<Link>();
        let id = link.next.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        lock(&link.waiting).insert(id, answer);
        let _ = link.to.send(FromWindow::Invoke { id, command, args });
        match answered.await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(tauri::ipc::InvokeError(error)),
            Err(_) => Err(tauri::ipc::InvokeError(json!({
                "code": "internal",
                "message": "the desk is gone",
                "wait_ms": null,
            }))),
        }
    });
    true
}

/// The desk's window: until its channel closes.
fn window() {
    // A text-only window needs no accelerated compositing, and without it WebKit's web process
    // idles at about 60 MB less (measured under Xvfb). A user's own setting wins.
    // Nor does GTK need OpenGL here: without this, GDK loads the GL driver (Mesa and its LLVM,
    // about 30 MB) as it opens the display, only to pick visuals for GL. For both, a user's
    // own setting wins.
    for (name, value) in [
        ("WEBKIT_DISABLE_COMPOSITING_MODE", "1"),
        ("GDK_GL", "disable"),
    ] {
        if std::env::var_os(name).is_none() {
            // SAFETY: still single-threaded: no other thread reads the environment yet.
            unsafe {
                std::env::set_var(name, value);
            }
        }
    }
    let stream = match take_channel() {
        Ok(stream) => stream,
        Err(e) => {
            eprintln!("countersign-desk: {e}");
            std::process::exit(2);
        }
    };
    let (to, outbox) = mpsc::unbounded_channel();
    let link = Link {
        to,
        waiting: Mutex::new(HashMap::new()),
        next: AtomicU64::new(1),
        seen: Mutex::new((false, false)),
    };
    tauri::Builder::default()
        .manage(link)
        .invoke_handler(forward)
        .on_window_event(|window, event| {
            let link = window.app_handle().state::<Link>();
            match event {
                tauri::WindowEvent::Focused(focused) => link.seen(None, Some(*focused)),
                // Closing hides: the desk ends this process when it has been idle long enough.
                tauri::WindowEvent::CloseRequested { api, .. } => {
                    api.prevent_close();
                    let _ = window.hide();
                    link.seen(Some(false), Some(false));
                }
                _ => {}
            }
        })
        .on_page_load(|webview, payload| {
            if payload.event() == tauri::webview::PageLoadEvent::Finished {
                let _ = webview
                    .app_handle()
                    .state::<Link>()
                    .to
                    .send(FromWindow::Loaded {});
            }
        })
        // No window yet: the desk may have started this process ahead of need, and a web view
        // (WebKit's web and network processes with it) is made only when the desk says `open`.
        .setup(move |app| {
            tauri::async_runtime::spawn(talk(app.handle().clone(), stream, outbox));
            Ok(())
        })
        .build(tauri::generate_context!())
        .expect("the desk's window")
        .run(|_app, event| {
            // The window is only hidden when closed; the process ends with the channel.
            if let tauri::RunEvent::ExitRequested {
                code: None, api, ..
            } = event
            {
                api.prevent_exit();
            }
        });
}

/// A spare with nothing to show gives back the pages of the files it read to start: most of
/// what it holds is the code and tables of GTK and WebKit that the dynamic linker and GTK's start
/// touched, clean copies of files, which it alone maps. Each read-only file mapping that holds no
/// private copy of a page (nothing written to it, so nothing there differs from the file) is
/// dropped with `MADV_DONTNEED`; the kernel maps the pages again from the file, most likely still
/// in the page cache, when they are next used. Writable mappings, and read-only ones with
/// private copies (relocated tables, made read-only after relocation), are left as they are:
/// dropping those would lose what was written. (Android likewise reclaims the pages of the processes
/// it keeps cached, with `MADV_PAGEOUT`.) A failure changes nothing but the figure.
fn rest() {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return;
    };
    // (start, end, whether it may be dropped), of the mapping whose fields are being read.
    let mut mapping: Option<(usize, usize, bool)> = None;
    let flush = |mapping: Option<(usize, usize, bool)>| {
        if let Some((start, end, true)) = mapping {
            // SAFETY: a whole mapping of this process, read-only and file-backed with no private
            // page (its smaps fields said so): after MADV_DONTNEED its pages read the same from
            // the file. A failure leaves it as it was.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        }
    };
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or("");
        if let Some((start, end)) = first.split_once('-')
            && let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            )
        {
            flush(mapping.take());
            let perms = fields.next().unwrap_or("");
            let inode = fields.nth(2).unwrap_or("0");
            let file = inode != "0" && fields.next().is_some_and(|p| p.starts_with('/'));
            mapping = Some((
                start,
                end,
                file && perms.starts_with('r') && !perms.contains('w'),
            ));
        } else if matches!(first, "Anonymous:" | "Private_Dirty:")
            && fields.next() != Some("0")
            && let Some(m) = &mut mapping
        {
            m.2 = false;
        }
    }
    flush(mapping.take());
}

/// The window, made (hidden, unfocused, its page loading) when it is not made yet.
fn open(app: &AppHandle) -> Result<tauri::WebviewWindow, Box<dyn std::error::Error>> {
    if let Some(window) = app.get_webview_window(LABEL) {
        return Ok(window);
    }
    let config = app
        .config()
        .app
        .windows
        .iter()
        .find(|w| w.label == LABEL)
        .cloned()
        .ok_or("no window \"main\" in the configuration")?;
    Ok(WebviewWindowBuilder::from_config(app, &config)?
        .visible(false)
        .focused(false)
        .build()?)
}

/// Carries messages both ways until the channel closes; then the window's process exits.
async fn talk(
    app: AppHandle,
    stream: std::os::unix::net::UnixStream,
    mut outbox: mpsc::UnboundedReceiver<FromWindow>,
) {
    let stream = match tokio::net::UnixStream::from_std(stream) {
        Ok(stream) => stream,
        Err(e) => {
            eprintln!("countersign-desk: the desk's channel: {e}");
            app.exit(2);
            return;
        }
    };
    let (reader, mut writer) = stream.into_split();
    tauri::async_runtime::spawn(async move {
        while let Some(message) = outbox.recv().await {
            if writer.write_all(&channel::line(&message)).await.is_err() {
                break;
            }
        }
    });
    let mut reader = tokio::io::BufReader::new(reader);
    let mut line = Vec::new();
    loop {
        let message = match channel::read::<ToWindow, _>(&mut reader, &mut line).await {
            Ok(message) => message,
            Err(channel::ChannelError::Closed) => break,
            Err(e) => {
                eprintln!("countersign-desk: the desk's channel: {e}");
                break;
            }
        };
        let link = app.state::<Link>();
        match message {
            ToWindow::Answer { id, ok, err } => {
                if let Some(answer) = lock(&link.waiting).remove(&id) {
                    let _ = answer.send(match err {
                        Some(err) => Err(err),
                        None => Ok(ok),
                    });
                }
            }
            ToWindow::Emit { event, payload } => {
                let _ = app.emit(&event, payload);
            }
            ToWindow::Open {} => {
                if let Err(e) = open(&app) {
                    eprintln!("countersign-desk: the window: {e}");
                    break;
                }
            }
            ToWindow::Rest {} => rest(),
            ToWindow::Show {} => match open(&app) {
                Ok(window) => {
                    let _ = window.show();
                    let _ = window.unminimize();
                    let _ = window.set_focus();
                    link.seen(Some(true), None);
                }
                Err(e) => {
                    eprintln!("countersign-desk: the window: {e}");
                    break;
                }
            },
            ToWindow::Title { title } => {
                if let Some(window) = app.get_webview_window(LABEL) {
                    let _ = window.set_title(&title);
                }
            }
        }
    }
    app.exit(0);
}
