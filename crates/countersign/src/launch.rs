//! Starting the desk from the command line or from a gateway.
//!
//! The desk is started detached (its own session, no inherited stdio), so it outlives the agent
//! that caused the start, and with an allow-listed environment: display, session bus, home, XDG,
//! locale and PATH pass; `LD_*`, `TAURI_*` and everything else the agent's process carried do not,
//! so an agent cannot inject code or switch on webview automation in the authority through its
//! own environment.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Variables passed to the desk, exactly or (ending in `*`) by prefix.
pub const ALLOWED_ENV: &[&str] = &[
    "DISPLAY",
    "WAYLAND_DISPLAY",
    "XAUTHORITY",
    "DBUS_SESSION_BUS_ADDRESS",
    "HOME",
    "USER",
    "LOGNAME",
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "XDG_*",
    "COUNTERSIGN_SOCKET",
];

/// Whether `name` may pass into the desk's environment.
pub fn allowed(name: &str) -> bool {
    if name.starts_with("LD_") || name.starts_with("TAURI_") {
        return false;
    }
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
            "HOME",
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
        ] {
            assert!(!allowed(no), "{no}");
        }
    }
}
