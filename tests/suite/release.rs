//! The release artifacts, as a user installs them: the .deb carries the desk, `countersign`,
//! `countersign-demo` and `countersign-headless-desk`, the icon and a desktop entry; a release desk refuses a WebDriver session
//! even when the automation variable is set, cannot be read by other processes of its account (not
//! dumpable), and opens no inspector port whatever its environment says, has no knob to shorten
//! its idle release, and with its window closed keeps serving and releases its webview after its
//! settings' delay. They need `.ci/release` to have run (the test command runs it). Every process
//! they start leads a process group that ends with the test, passed or failed (`group::Group`),
//! the desks WebKitWebDriver starts included.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use countersign_tests::account::{self, Account};
use countersign_tests::group::{self, Group, SessionBus};

fn target() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target")
}

/// The release desk `.ci/release` builds.
fn release_desk() -> PathBuf {
    let desk = target().join("release/countersign-desk");
    assert!(
        desk.exists(),
        "{} is missing: run .ci/release",
        desk.display()
    );
    desk
}

fn deb() -> PathBuf {
    let dir = target().join("release/bundle/deb");
    let found = std::fs::read_dir(&dir)
        .unwrap_or_else(|_| panic!("{} is missing: run .ci/release", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"));
    found.unwrap_or_else(|| panic!("no .deb in {}: run .ci/release", dir.display()))
}

#[test]
#[ignore = "needs the release bundle from .ci/release (run by the test command)"]
fn the_deb_installs_the_desk_countersign_the_icon_and_a_desktop_entry() {
    let out = Command::new("dpkg-deb")
        .arg("-c")
        .arg(deb())
        .output()
        .expect("dpkg-deb");
    assert!(out.status.success());
    let listing = String::from_utf8_lossy(&out.stdout);
    // Paths as dpkg-deb lists them, with or without a leading "./".
    let paths: Vec<&str> = listing
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .map(|p| p.trim_start_matches("./"))
        .collect();
    for needed in [
        "usr/bin/countersign-desk",
        "usr/bin/countersign",
        "usr/bin/countersign-demo",
        "usr/bin/countersign-headless-desk",
    ] {
        assert!(
            paths.contains(&needed),
            "{needed} is not in the .deb:\n{listing}"
        );
    }
    for needed in ["usr/share/applications/", "usr/share/icons/hicolor/"] {
        assert!(
            paths.iter().any(|p| p.starts_with(needed)),
            "{needed} is not in the .deb:\n{listing}"
        );
    }
    assert!(
        listing
            .lines()
            .any(|l| l.contains("usr/share/applications/") && l.trim_end().ends_with(".desktop")),
        "{listing}"
    );
    assert!(
        listing
            .lines()
            .any(|l| l.contains("hicolor") && l.trim_end().ends_with(".png")),
        "{listing}"
    );
    // The desktop entry takes countersign:// URLs (a request the 2026-07-28 flow names) and
    // passes the URL to the desk.
    let unpacked = tempfile::tempdir().unwrap();
    let status = Command::new("dpkg-deb")
        .arg("-x")
        .arg(deb())
        .arg(unpacked.path())
        .status()
        .expect("dpkg-deb");
    assert!(status.success());
    let entry = std::fs::read_dir(unpacked.path().join("usr/share/applications"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "desktop"))
        .expect("a desktop entry");
    let entry = std::fs::read_to_string(entry).unwrap();
    let lines: Vec<&str> = entry.lines().map(str::trim).collect();
    assert!(
        lines.contains(&"MimeType=x-scheme-handler/countersign;"),
        "{entry}"
    );
    assert!(lines.contains(&"Exec=countersign-desk %u"), "{entry}");
    let fields = Command::new("dpkg-deb")
        .arg("-f")
        .arg(deb())
        .arg("Package")
        .arg("Depends")
        .output()
        .unwrap();
    let fields = String::from_utf8_lossy(&fields.stdout);
    assert!(fields.contains("libwebkit2gtk-4.1"), "{fields}");
}

/// WebKitWebDriver, asked for a session on a release desk with the automation variable set,
/// gets none; the desk it started for the attempt ends with the test (it was left running,
/// a child of nobody, when only the driver was killed).
#[test]
#[ignore = "needs the release build from .ci/release and a display (run by the test command)"]
fn a_release_desk_refuses_a_webdriver_session_even_with_the_automation_variable_set() {
    assert!(
        std::env::var_os("DISPLAY").is_some(),
        "needs a display (run under Xvfb)"
    );
    let desk = release_desk();
    let dir = tempfile::tempdir().unwrap();
    let port = countersign_tests::ports::free_port();
    let bus = SessionBus::unless_given();
    // WebKitWebDriver directly, with the variable set, exactly as tauri-driver would start it,
    // leading a process group of its own: the desk it starts for the session joins it.
    let mut driver = Group::spawn(
        Command::new("WebKitWebDriver")
            .arg(format!("--port={port}"))
            .env("TAURI_WEBVIEW_AUTOMATION", "true")
            .env("COUNTERSIGN_DESK_DIR", dir.path())
            .env("COUNTERSIGN_SOCKET", dir.path().join("desk.sock"))
            .envs(bus_env(&bus))
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .expect("WebKitWebDriver");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "WebKitWebDriver did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    let body = serde_json::json!({"capabilities": {"alwaysMatch": {"webkitgtk:browserOptions": {"binary": desk, "args": ["--in-memory-secret"]}}}});
    let answer = Command::new("curl")
        .args([
            "-s",
            "-m",
            "25",
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "-d",
        ])
        .arg(body.to_string())
        .arg(format!("http://127.0.0.1:{port}/session"))
        .output()
        .expect("curl");
    // What the attempt left running: the driver, and the desk it started (now
    // `countersign-headless-desk`, its name cut to 15 bytes by the kernel, with its spare window's process under it).
    let started: Vec<(u32, String)> = driver
        .members()
        .into_iter()
        .map(|pid| {
            let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            (pid, name.trim().to_owned())
        })
        .collect();
    let text = String::from_utf8_lossy(&answer.stdout);
    assert!(
        !text.contains("\"sessionId\""),
        "a release desk accepted a WebDriver session: {text}"
    );
    // The check below can fail: the desk was started, in the driver's group.
    assert!(
        started
            .iter()
            .any(|(_, name)| name.starts_with("countersign-hea")),
        "no desk in the driver's group: {started:?}"
    );
    // Ending the driver's group ends the desk with it: nothing of this test runs on.
    let group = driver.id();
    driver.end();
    let left: Vec<&(u32, String)> = started
        .iter()
        .filter(|(pid, _)| group::runs(*pid))
        .collect();
    assert!(left.is_empty(), "left running after the test: {left:?}");
    assert!(group::members_of(group).is_empty());
    // Nor anything that left the group: every process started for this test carries its
    // directory in its environment.
    let dir_value = dir.path().display().to_string();
    let escaped = group::carrying("COUNTERSIGN_DESK_DIR", &dir_value);
    assert!(escaped.is_empty(), "left the group and ran on: {escaped:?}");
}

/// What a program this test starts is given to reach the test's own session bus, if it has one.
fn bus_env(bus: &Option<SessionBus>) -> Option<(&'static str, String)> {
    bus.as_ref()
        .map(|b| ("DBUS_SESSION_BUS_ADDRESS", b.address().to_owned()))
}

/// The desk at `program`, headless, in its own directory, as `account` when given (else as
/// this process's account), leading a process group that ends with the guard.
fn start_headless(program: &Path, dir: &Path, account: Option<&Account>) -> Group {
    let mut cmd = match account {
        Some(account) => account.std_command(program),
        None => Command::new(program),
    };
    cmd.arg("--in-memory-secret")
        .env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .env("COUNTERSIGN_DESK_DIR", dir)
        .env("COUNTERSIGN_SOCKET", dir.join("desk.sock"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Group::spawn(&mut cmd).expect("the desk")
}

fn wait_for_socket(socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        assert!(Instant::now() < deadline, "the desk did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether `account` (or this process's account) can read `path`.
fn readable_by(account: Option<&Account>, path: &str) -> bool {
    match account {
        Some(account) => account
            .std_command("cat")
            .arg(path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success(),
        None => std::fs::read(path).is_ok(),
    }
}

/// A release desk cannot be read by other processes of its own account: its environment in
/// `/proc` needs the ptrace access a non-dumpable process refuses (as do its memory, its open
/// files and attaching a debugger), and it leaves no core file. The debug desk, started the same way, is readable: the check can
/// tell the difference. As root (CI) the desks run under a fresh account, since root may read
/// any process.
#[test]
#[ignore = "needs the release build from .ci/release (run by the test command)"]
fn a_release_desk_is_not_dumpable_so_its_own_account_cannot_read_it() {
    let release = release_desk();
    let debug = target().join("debug/countersign-desk");
    let account = if account::is_root() {
        Some(Account::create("desks under an account that is not root").expect("useradd"))
    } else {
        None
    };
    for (program, dumpable) in [(&debug, true), (&release, false)] {
        let dir = tempfile::tempdir().unwrap();
        if let Some(account) = &account {
            account.give(dir.path());
        }
        let mut desk = start_headless(program, dir.path(), account.as_ref());
        wait_for_socket(&dir.path().join("desk.sock"));
        let pid = desk.id();
        let environ = format!("/proc/{pid}/environ");
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let core = limits
            .lines()
            .find(|l| l.starts_with("Max core file size"))
            .unwrap()
            .split_whitespace()
            .nth(4)
            .unwrap()
            .to_owned();
        let environ_readable = readable_by(account.as_ref(), &environ);
        desk.end();
        let what = program.display();
        assert_eq!(environ_readable, dumpable, "{what}: /proc/PID/environ");
        if !dumpable {
            assert_eq!(core, "0", "{what}: core file size limit");
        }
    }
}

/// What became of an inspector variable given to a WebKit program.
struct Inspected {
    /// Whether the port it named accepted a connection once the web view was up.
    port_open: bool,
    /// The WebKit processes it started that had an inspector variable in their environment.
    leaked: Vec<String>,
}

/// Starts `cmd` in a process group of its own with `var` naming a free local port, waits until
/// it has started a WebKit web process (its web view exists; WebKit starts the inspector server
/// with the web context, before that process) and 2 s more, looks, and ends the group (which
/// also ends if the look fails).
fn inspect(mut cmd: Command, var: &str) -> Inspected {
    let port = countersign_tests::ports::free_port();
    let bus = SessionBus::unless_given();
    let mut group = Group::spawn(
        cmd.env(var, format!("127.0.0.1:{port}"))
            .envs(bus_env(&bus))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .expect("the program");
    let pid = group.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    let web = loop {
        let web = webkit_children(pid);
        if web
            .iter()
            .any(|(_, name)| name.starts_with("WebKitWebProces"))
        {
            break web;
        }
        assert!(Instant::now() < deadline, "no WebKit web process started");
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_secs(2));
    let port_open = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
    let leaked = web
        .iter()
        .filter(|(child, _)| {
            std::fs::read(format!("/proc/{child}/environ"))
                .map(|e| String::from_utf8_lossy(&e).contains("WEBKIT_INSPECTOR"))
                .unwrap_or(false)
        })
        .map(|(_, name)| name.clone())
        .collect();
    group.end();
    Inspected { port_open, leaked }
}

/// A release desk started with one of WebKit's inspector variables set (as an agent could set
/// them for a desk its gateway starts, or a WebDriver session would) opens no inspector port,
/// and the WebKit processes it starts do not have it in their environment either; its log says
/// it ignored the variable. The control: WebKitGTK's own MiniBrowser, the same library without
/// the scrub, opens the port under the same wait.
#[test]
#[ignore = "needs the release build from .ci/release and a display (run by the test command)"]
fn a_release_desk_opens_no_inspector_port_whatever_its_environment_says() {
    assert!(
        std::env::var_os("DISPLAY").is_some(),
        "needs a display (run under Xvfb)"
    );
    let desk = release_desk();
    let mini = Path::new("/usr/lib/x86_64-linux-gnu/webkit2gtk-4.1/MiniBrowser");
    for var in ["WEBKIT_INSPECTOR_SERVER", "WEBKIT_INSPECTOR_HTTP_SERVER"] {
        if mini.exists() {
            let mut control = Command::new(mini);
            control.arg("about:blank");
            assert!(
                inspect(control, var).port_open,
                "{var}: the control did not open its port; this check shows nothing here"
            );
        } else {
            println!("no control: {} is missing", mini.display());
        }
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(&desk);
        cmd.arg("--in-memory-secret")
            .env("COUNTERSIGN_DESK_DIR", dir.path())
            .env("COUNTERSIGN_SOCKET", dir.path().join("desk.sock"));
        let seen = inspect(cmd, var);
        assert!(!seen.port_open, "{var} opened its port in the desk");
        assert!(seen.leaked.is_empty(), "{var} reached {:?}", seen.leaked);
        let log = std::fs::read_to_string(dir.path().join("state/desk.log")).unwrap();
        assert!(
            log.contains(&format!("ignored {var} from the environment")),
            "{log}"
        );
    }
}

/// The processes under `pid` (its window's process, and WebKit's under that) whose name starts
/// with "WebKit": (pid, name).
fn webkit_children(pid: u32) -> Vec<(u32, String)> {
    countersign_tests::measure::descendants(pid)
        .into_iter()
        .filter_map(|child| {
            let name = std::fs::read_to_string(format!("/proc/{child}/comm")).ok()?;
            let name = name.trim();
            name.starts_with("WebKit").then(|| (child, name.to_owned()))
        })
        .collect()
}

/// The debug desk's knob that shortens the idle release (for its tests and bench) is compiled
/// out of a release desk: its name is nowhere in its programs.
#[test]
#[ignore = "needs the release build from .ci/release (run by the test command)"]
fn a_release_desk_has_no_knob_to_shorten_the_idle_release() {
    let desk = release_desk();
    for program in [
        desk.clone(),
        desk.with_file_name("countersign-headless-desk"),
    ] {
        let bytes = std::fs::read(&program).unwrap();
        let knob = b"COUNTERSIGN_DEBUG_RELEASE_AFTER_MS";
        assert!(
            !bytes.windows(knob.len()).any(|w| w == knob),
            "{}",
            program.display()
        );
    }
}

/// A release desk whose window is closed goes on serving and, after the release delay its
/// settings give (10 s, the least), ends its window's process, and WebKit's with it; the desk
/// itself maps neither GTK nor WebKit.
#[test]
#[ignore = "needs the release build from .ci/release and a display (run by the test command)"]
fn a_closed_release_desk_keeps_serving_and_releases_its_webview_after_the_settings_delay() {
    let display = std::env::var("DISPLAY").expect("needs a display (run under Xvfb)");
    let desk = release_desk();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("config")).unwrap();
    std::fs::write(
        dir.path().join("config/settings.json"),
        r#"{"token_minutes": 10, "approve_delay_ms": 1000, "release_after_s": 10}"#,
    )
    .unwrap();
    let socket = dir.path().join("desk.sock");
    let bus = SessionBus::unless_given();
    let mut group = Group::spawn(
        Command::new(&desk)
            .arg("--in-memory-secret")
            .env("COUNTERSIGN_DESK_DIR", dir.path())
            .env("COUNTERSIGN_SOCKET", &socket)
            .env("DISPLAY", &display)
            .envs(bus_env(&bus))
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .unwrap();
    let pid = group.id();
    wait_for_socket(&socket);
    let web = |pid| {
        webkit_children(pid)
            .into_iter()
            .filter(|(_, name)| name.starts_with("WebKitWebProces"))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut asked = 0;
    while asked == 0 || web(pid) == 0 {
        assert!(Instant::now() < deadline, "no window with a web process");
        std::thread::sleep(Duration::from_millis(100));
        if web(pid) > 0 && asked == 0 {
            asked = countersign_tests::xwindow::close_by_title(&display, "Countersign");
        }
    }
    // The window's process: the one under the desk that is not WebKit's.
    let window = countersign_tests::measure::descendants(pid)
        .into_iter()
        .find(|p| !webkit_children(pid).iter().any(|(w, _)| w == p))
        .expect("the window's process");
    let closed = Instant::now();
    while web(pid) > 0 {
        assert!(
            closed.elapsed() < Duration::from_secs(60),
            "the web process outlived the release delay"
        );
        assert!(
            std::os::unix::net::UnixStream::connect(&socket).is_ok(),
            "the desk stopped serving when its window closed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        closed.elapsed() >= Duration::from_secs(9),
        "released before its delay"
    );
    assert!(std::os::unix::net::UnixStream::connect(&socket).is_ok());
    // The window's whole process went, GTK and WebKit with it: the desk maps neither. What may
    // stay under it is one spare window's process, which makes no window and starts no WebKit
    // process until the desk has something to show.
    assert!(
        countersign_tests::group::exits_within(window, Duration::from_secs(10)),
        "the window's process outlived its release"
    );
    std::thread::sleep(Duration::from_secs(1));
    let under = countersign_tests::measure::descendants(pid);
    assert!(
        under.len() <= 1,
        "more than a spare under the desk: {under:?}"
    );
    for spare in &under {
        let args = std::fs::read(format!("/proc/{spare}/cmdline")).unwrap_or_default();
        assert!(
            args.split(|b| *b == 0).any(|a| a == b"--window-of-desk"),
            "not a window's process under the desk: {}",
            String::from_utf8_lossy(&args)
        );
    }
    assert!(
        webkit_children(pid).is_empty(),
        "WebKit runs after the release"
    );
    assert_eq!(
        countersign_tests::xwindow::titles(&display)
            .iter()
            .filter(|t| t.starts_with("Countersign"))
            .count(),
        0,
        "a window after the release"
    );
    // Readable as root (as CI runs); a release desk is not dumpable to its own account.
    if let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) {
        assert!(
            !maps.contains("libwebkit2gtk") && !maps.contains("libgtk-3"),
            "{maps}"
        );
    }
    group.end();
}
