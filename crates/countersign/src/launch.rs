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

#[cfg(test)]
mod tests {
    use super::*;

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
