//! Starting the desk from the command line or from a gateway.
//!
//! The desk is started detached (its own session, no inherited stdio), so it outlives the agent
//! that caused the start, and with an allow-listed environment: the display, the session bus, the
//! runtime directory and the desktop's name, locale, user name and PATH pass. Nothing that names
//! the desk's files passes: not `HOME`, not `XDG_CONFIG_HOME` or `XDG_DATA_HOME` (nor any other
//! `XDG_*` directory), not `COUNTERSIGN_*`. The desk finds its own from the password database,
//! and the toolkit it links (GTK, fontconfig, WebKit, which read `HOME` and `XDG_*` for themes,
//! fonts and web data) falls back to the same home, so an agent cannot choose the desk's policy,
//! settings, ledger or the fonts its window draws with. `LD_*`, `TAURI_*`, `WEBKIT_*` and
//! everything else the agent's process carried do not pass either, so an agent cannot inject code
//! or switch on webview automation or an inspector in the authority through its own environment.
//! The runtime directory may pass: the socket's path never depends on it (see
//! `countersign_wire::default_socket_path`), and a Wayland display is found through it.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Variables passed to the desk, exactly or (ending in `*`) by prefix.
pub const ALLOWED_ENV: &[&str] = &[
    "DISPLAY",
    "WAYLAND_DISPLAY",
    "XAUTHORITY",
    "DBUS_SESSION_BUS_ADDRESS",
    "XDG_RUNTIME_DIR",
    "XDG_SESSION_TYPE",
    "XDG_CURRENT_DESKTOP",
    "USER",
    "LOGNAME",
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_*",
];

/// Whether `name` may pass into the desk's environment.
pub fn allowed(name: &str) -> bool {
    ALLOWED_ENV.iter().any(|a| match a.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == *a,
    })
}

/// The desk program: `countersign-desk` next to this executable.
pub fn desk_program() -> PathBuf {
    let me = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("countersign"));
    me.with_file_name("countersign-desk")
}

/// The demo program: `countersign-demo` next to this executable.
pub fn demo_program() -> PathBuf {
    let me = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("countersign"));
    me.with_file_name("countersign-demo")
}

/// The team server: `countersign-serve` next to this executable.
pub fn serve_program() -> PathBuf {
    let me = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("countersign"));
    me.with_file_name("countersign-serve")
}

/// Starts the desk detached with the allow-listed environment; returns its pid.
pub fn start_desk(args: &[String]) -> std::io::Result<u32> {
    let mut cmd = Command::new(desk_program());
    cmd.args(args)
        .env_clear()
        .envs(std::env::vars_os().filter(|(k, _)| k.to_str().is_some_and(allowed)));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // Its own process group and session: the agent's terminal or process group ending does not
    // take the desk with it.
    cmd.process_group(0);
    let child = cmd.spawn()?;
    Ok(child.id())
}

/// How `countersign open` reached the desk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// The running desk was asked to show the request.
    Running,
    /// No desk answered: one was started with the URL (its pid).
    Started(u32),
}

/// Why `countersign open URL` showed nothing ([`open_request`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The URL is not a request URL: nothing was sent or started.
    #[error("not a request URL ({0}); a request URL is exactly countersign://request/<id>")]
    NotARequestUrl(#[source] countersign_wire::BadRequestUrl),
    /// The runtime that asks the desk could not be made.
    #[error("cannot ask the desk: {0}")]
    Runtime(#[source] std::io::Error),
    /// No desk answers at the socket, and none could be started.
    #[error("no desk answers and none could be started: {0}")]
    NotStarted(#[source] std::io::Error),
    /// Something is at the socket, but it did not take the request.
    #[error("the desk at {} did not answer: {source}", socket.display())]
    NoAnswer {
        /// The desk's socket.
        socket: PathBuf,
        /// What connecting or writing said.
        #[source]
        source: std::io::Error,
    },
}

/// `countersign open URL`: the running desk at `socket` comes forward showing the request the
/// URL names (a focus hello, nothing else: no message approves or denies), or, when none answers
/// there, a desk is started with the URL. The URL is read strictly first; anything else is an
/// error and nothing is sent or started.
pub fn open_request(url: &str, socket: &std::path::Path) -> Result<Opened, OpenError> {
    let id = countersign_wire::parse_request_url(url).map_err(OpenError::NotARequestUrl)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(OpenError::Runtime)?;
    let asked = runtime.block_on(countersign_wire::focus_desk(socket, Some(id)));
    match asked {
        Ok(()) => Ok(Opened::Running),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            start_desk(&[countersign_wire::request_url(id)])
                .map(Opened::Started)
                .map_err(OpenError::NotStarted)
        }
        Err(source) => Err(OpenError::NoAnswer {
            socket: socket.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_refuses_what_is_not_a_request_url_and_sends_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("desk.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        listener.set_nonblocking(true).unwrap();
        for url in [
            "countersign://request/1?approve=1",
            "countersign://request/1/approve",
            "COUNTERSIGN://request/1",
            "https://example.com/",
        ] {
            let refused = open_request(url, &socket).unwrap_err().to_string();
            assert!(refused.contains("countersign://request/<id>"), "{refused}");
        }
        assert!(listener.accept().is_err(), "nothing connected");
    }

    #[test]
    fn desk_environment_is_allow_listed() {
        for ok in [
            "DISPLAY",
            "DBUS_SESSION_BUS_ADDRESS",
            "XDG_RUNTIME_DIR",
            "LC_ALL",
            "PATH",
            "LANG",
        ] {
            assert!(allowed(ok), "{ok}");
        }
        for no in [
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "TAURI_WEBVIEW_AUTOMATION",
            "TAURI_DEV",
            "RUST_LOG",
            "SSH_AUTH_SOCK",
            "AWS_SECRET_ACCESS_KEY",
            // What would choose the desk's files, socket or fonts.
            "HOME",
            "XDG_CONFIG_HOME",
            "XDG_DATA_HOME",
            "XDG_STATE_HOME",
            "XDG_CACHE_HOME",
            "XDG_DATA_DIRS",
            "XDG_CONFIG_DIRS",
            "COUNTERSIGN_SOCKET",
            "COUNTERSIGN_DESK_DIR",
            // Inspectors and code the web view would load.
            "WEBKIT_INSPECTOR_SERVER",
            "WEBKIT_INSPECTOR_HTTP_SERVER",
            "WEBKIT_INJECTED_BUNDLE_PATH",
            "GTK_MODULES",
            "GST_PLUGIN_PATH",
        ] {
            assert!(!allowed(no), "{no}");
        }
    }
}
