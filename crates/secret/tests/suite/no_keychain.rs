//! When there is no usable keychain, the error is `SecretError::NoKeychain`, whose message says how
//! to fix it and names the in-memory opt-in, and not a platform failure. Two ways to lack one on
//! Linux: no session bus at all, and a Secret Service whose keyring is not unlocked.
//!
//! The bus address is read from the environment, which every test in a process shares, so each
//! test re-runs itself as a child process with the environment it needs instead of changing its
//! own.

#![cfg(target_os = "linux")]

use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;

use countersign_secret::{KeychainStore, SERVICE, SecretError, SecretStore};

/// Set in a child process: do the check instead of spawning.
const CHILD: &str = "COUNTERSIGN_SECRET_TEST_CHILD";

/// The tests' names as libtest knows them in this binary (its module path, without the crate).
const NO_BUS_TEST: &str =
    "no_keychain::without_a_session_bus_opening_the_keychain_says_no_keychain";
const LOCKED_TEST: &str = "no_keychain::a_keyring_that_was_never_unlocked_says_no_keychain";

#[test]
fn without_a_session_bus_opening_the_keychain_says_no_keychain() {
    if std::env::var_os(CHILD).is_some() {
        let err = KeychainStore::open(SERVICE, "test-no-session-bus").unwrap_err();
        check_no_keychain(&err);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let nowhere = dir.path().join("does-not-exist");

    // A bus address naming a socket that does not exist.
    let mut pointed = child(NO_BUS_TEST);
    pointed.env(
        "DBUS_SESSION_BUS_ADDRESS",
        format!("unix:path={}", nowhere.display()),
    );
    run(pointed, "bus address pointing at a missing socket");

    // No bus address at all, and no bus in the runtime directory.
    let mut unset = child(NO_BUS_TEST);
    unset
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .env("XDG_RUNTIME_DIR", &nowhere);
    run(unset, "no bus address");
}

#[test]
#[ignore = "needs dbus-run-session and gnome-keyring (run by the test command)"]
fn a_keyring_that_was_never_unlocked_says_no_keychain() {
    if std::env::var_os(CHILD).is_some() {
        // The bus activates gnome-keyring, which has no unlocked keyring to store into.
        let store = KeychainStore::open(SERVICE, "test-locked-keyring").unwrap();
        let err = store.load_or_create().unwrap_err();
        check_no_keychain(&err);
        return;
    }
    // A bus of its own, and throwaway keyring directories, so no real keyring is touched.
    let dir = tempfile::tempdir().unwrap();
    for sub in ["data", "config", "cache", "run"] {
        std::fs::create_dir(dir.path().join(sub)).unwrap();
    }
    let run_dir = dir.path().join("run");
    std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut under_bus = Command::new("timeout");
    under_bus
        .args(["120", "dbus-run-session", "--"])
        .arg(std::env::current_exe().unwrap())
        .args(child_args(LOCKED_TEST))
        .arg("--include-ignored")
        .env(CHILD, "1")
        .env("XDG_DATA_HOME", dir.path().join("data"))
        .env("XDG_CONFIG_HOME", dir.path().join("config"))
        .env("XDG_CACHE_HOME", dir.path().join("cache"))
        .env("XDG_RUNTIME_DIR", run_dir);
    run(under_bus, "a keyring that was never unlocked");
}

/// The checks made in the child.
fn check_no_keychain(err: &SecretError) {
    assert!(matches!(err, SecretError::NoKeychain { .. }), "{err:?}");
    let message = err.to_string();
    for expected in [
        "the OS keychain is not available",
        "Secret Service",
        "unlocked",
        "DBUS_SESSION_BUS_ADDRESS",
        "in-memory secret option",
        "every token dies when it exits",
    ] {
        assert!(
            message.contains(expected),
            "{expected:?} missing in: {message}"
        );
    }
    println!("NoKeychain message: {message}");
}

/// Arguments that make this test binary run only `test`, printing its output.
fn child_args(test: &str) -> [&str; 4] {
    [test, "--exact", "--nocapture", "--test-threads=1"]
}

/// This test binary as a child that runs only `test`.
fn child(test: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args(child_args(test)).env(CHILD, "1");
    command
}

fn run(mut command: Command, case: &str) {
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{case}: the child test failed or did not run\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // libtest may print the test's name on the same line, before the message.
    let message = stdout
        .lines()
        .find_map(|line| line.split_once("NoKeychain message: "))
        .map(|(_, message)| message)
        .unwrap_or_default();
    eprintln!("{case}: {message}");
}
