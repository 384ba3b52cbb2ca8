//! What the desk does before anything else, while it is still one thread and no web view exists.
//!
//! A desk is often started by a gateway, the agent's own process, and any process of the same
//! account could start one: what the desk inherits must not turn it into the agent's instrument.
//! So, first thing in `main`:
//!
//! * Variables that load code into the web view or its processes (`WEBKIT_INJECTED_BUNDLE_PATH`,
//!   GTK and GIO modules, GStreamer plugins), switch its sandbox off, open GTK's interactive
//!   inspector (`GTK_DEBUG`) or set JavaScriptCore options (`JSC_*`, which include test-only
//!   powers) are removed from the environment, so neither WebKit in this process nor the WebKit
//!   processes it starts ever see them. A gateway already passes none of them; this holds for a
//!   desk started any other way too.
//! * Release builds also remove the variables that open an inspector or remote-debugging port on
//!   the web view (`WEBKIT_INSPECTOR_SERVER`, `WEBKIT_INSPECTOR_HTTP_SERVER`: WebKit's WebDriver
//!   drives a browser through the first) and `TAURI_WEBVIEW_AUTOMATION`, so WebDriver and the
//!   inspector work only in debug builds, where the window's tests need them; and they make the
//!   process not dumpable: on Linux `PR_SET_DUMPABLE` 0 (a process of the same account can no
//!   longer attach to it or read its memory, its environment or its open files through `/proc`,
//!   where the HMAC key lives), on macOS `PT_DENY_ATTACH`; on both no core file. Debug builds
//!   stay debuggable.
#![allow(unsafe_code)] // this module reaches the OS through libc; each unsafe block says why it is sound

/// Removed by name.
const SCRUBBED: &[&str] = &[
    "WEBKIT_INJECTED_BUNDLE_PATH",
    "WEBKIT_DISABLE_SANDBOX_THIS_IS_DANGEROUS",
    "WEBKIT_ENABLE_DEBUG_PERMISSIONS_IN_SANDBOX",
    "GTK_DEBUG",
    "GTK_MODULES",
    "GTK3_MODULES",
    "GTK_PATH",
    "GIO_EXTRA_MODULES",
    "GIO_MODULE_DIR",
    "GDK_PIXBUF_MODULE_FILE",
    "GDK_PIXBUF_MODULEDIR",
    "GST_REGISTRY",
    "GST_REGISTRY_1_0",
];

/// Removed by prefix: every JavaScriptCore option, every GStreamer plugin path.
const SCRUBBED_PREFIXES: &[&str] = &["JSC_", "GST_PLUGIN"];

/// Removed in release builds: automation, and every inspector switch WebKit has or may gain.
fn automation_or_inspector(name: &str) -> bool {
    name == "TAURI_WEBVIEW_AUTOMATION" || name.starts_with("WEBKIT_INSPECTOR")
}

/// Whether `name` is removed from the desk's environment.
fn scrubbed(name: &str) -> bool {
    SCRUBBED.contains(&name)
        || SCRUBBED_PREFIXES.iter().any(|p| name.starts_with(p))
        || (cfg!(not(debug_assertions)) && automation_or_inspector(name))
}

/// What [`harden`] did, to be logged once logging is up.
#[derive(Debug, Default)]
pub struct Hardened {
    /// The variables removed from the environment.
    pub removed: Vec<String>,
    /// Why the process could not be made undumpable, if it could not.
    pub dumpable: Option<std::io::Error>,
}

/// Scrubs the environment and, in release builds, makes the process undumpable.
///
/// # Safety
/// Call first thing in `main`, before any other thread exists: it changes the environment.
pub unsafe fn harden() -> Hardened {
    let removed: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| scrubbed(k))
        .collect();
    for name in &removed {
        // SAFETY: the caller guarantees no other thread exists to read the environment.
        unsafe { std::env::remove_var(name) };
    }
    Hardened {
        removed,
        dumpable: not_dumpable().err(),
    }
}

#[cfg(all(target_os = "linux", not(debug_assertions)))]
fn not_dumpable() -> std::io::Result<()> {
    no_core_file()?;
    // SAFETY: PR_SET_DUMPABLE takes plain integers and touches no memory of ours.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(all(target_os = "macos", not(debug_assertions)))]
fn not_dumpable() -> std::io::Result<()> {
    no_core_file()?;
    // SAFETY: PT_DENY_ATTACH takes no address or data.
    if unsafe { libc::ptrace(libc::PT_DENY_ATTACH, 0, std::ptr::null_mut(), 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(all(
    not(debug_assertions),
    not(any(target_os = "linux", target_os = "macos"))
))]
fn not_dumpable() -> std::io::Result<()> {
    no_core_file()
}

#[cfg(debug_assertions)]
fn not_dumpable() -> std::io::Result<()> {
    Ok(())
}

#[cfg(not(debug_assertions))]
fn no_core_file() -> std::io::Result<()> {
    let none = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `none` is a valid rlimit for the duration of the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inspector_code_loading_and_sandbox_switches_are_scrubbed_and_the_rest_kept() {
        for name in [
            "WEBKIT_INJECTED_BUNDLE_PATH",
            "WEBKIT_DISABLE_SANDBOX_THIS_IS_DANGEROUS",
            "JSC_useDollarVM",
            "GTK_DEBUG",
            "GTK_MODULES",
            "GST_PLUGIN_PATH",
            "GST_PLUGIN_SYSTEM_PATH_1_0",
        ] {
            assert!(scrubbed(name), "{name}");
        }
        for name in [
            "DISPLAY",
            "WEBKIT_DISABLE_COMPOSITING_MODE",
            "DBUS_SESSION_BUS_ADDRESS",
            "PATH",
            "RUST_LOG",
        ] {
            assert!(!scrubbed(name), "{name}");
        }
        // WebDriver drives the debug desk through these; a release desk never offers them.
        for name in [
            "TAURI_WEBVIEW_AUTOMATION",
            "WEBKIT_INSPECTOR_SERVER",
            "WEBKIT_INSPECTOR_HTTP_SERVER",
        ] {
            assert_eq!(scrubbed(name), cfg!(not(debug_assertions)), "{name}");
        }
    }
}
