//! The release artifacts, as a user installs them: the .deb carries the desk, `countersign`, the
//! icon and a desktop entry; and a release desk refuses a WebDriver session even when the
//! automation variable is set. Both need `.ci/release` to have run (the test command runs it).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

fn target() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target")
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
    for needed in ["usr/bin/countersign-desk", "usr/bin/countersign"] {
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

#[test]
#[ignore = "needs the release build from .ci/release and a display (run by the test command)"]
fn a_release_desk_refuses_a_webdriver_session_even_with_the_automation_variable_set() {
    assert!(
        std::env::var_os("DISPLAY").is_some(),
        "needs a display (run under Xvfb)"
    );
    let desk = target().join("release/countersign-desk");
    assert!(
        desk.exists(),
        "{} is missing: run .ci/release",
        desk.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // WebKitWebDriver directly, with the variable set, exactly as tauri-driver would start it.
    let mut driver = Command::new("WebKitWebDriver")
        .arg(format!("--port={port}"))
        .env("TAURI_WEBVIEW_AUTOMATION", "true")
        .env("XDG_DATA_HOME", dir.path().join("data"))
        .env("XDG_CONFIG_HOME", dir.path().join("config"))
        .env("COUNTERSIGN_SOCKET", dir.path().join("desk.sock"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("WebKitWebDriver");
    std::thread::sleep(Duration::from_secs(1));
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
    let _ = driver.kill();
    let _ = driver.wait();
    let _ = Command::new("pkill")
        .arg("-f")
        .arg(desk.display().to_string())
        .status();
    let text = String::from_utf8_lossy(&answer.stdout);
    assert!(
        !text.contains("\"sessionId\""),
        "a release desk accepted a WebDriver session: {text}"
    );
}
