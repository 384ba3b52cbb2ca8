//! The real MCP peers `.ci/setup tests` installs, pinned, under `target/peers` (never committed):
//! the reference servers from npm and the Python SDK in a virtual environment of its own. A test
//! whose peer is missing fails and says how to install it. Every suite finds them here.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// The reference server with every kind of tool, and its pinned version.
pub const SERVER_EVERYTHING: (&str, &str) =
    ("@modelcontextprotocol/server-everything", "2026.8.31");
/// The reference filesystem server, and its pinned version.
pub const SERVER_FILESYSTEM: (&str, &str) =
    ("@modelcontextprotocol/server-filesystem", "2026.8.31");
/// The Python SDK's pinned version.
pub const PYTHON_MCP: &str = "2.3.0";

/// Where `.ci/setup tests` installs the peers.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/peers")
}

fn missing(what: &str) -> String {
    format!(
        "{what} is not installed in target/peers: run .ci/setup tests (it installs the pinned MCP peers)"
    )
}

/// The launcher `bin` of an npm-installed server, after checking that the pinned version is
/// installed.
pub fn npm_server((package, version): (&str, &str), bin: &str) -> PathBuf {
    let manifest = dir()
        .join("node_modules")
        .join(package)
        .join("package.json");
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(&manifest)
            .unwrap_or_else(|_| panic!("{}", missing(&format!("{package}@{version}")))),
    )
    .unwrap();
    assert_eq!(
        manifest["version"],
        json!(version),
        "{}",
        missing(&format!("{package}@{version}"))
    );
    let bin = dir().join("node_modules/.bin").join(bin);
    assert!(bin.exists(), "{}", missing(&format!("{package}@{version}")));
    bin
}

/// The Python of the virtual environment the SDK is installed into.
pub fn python() -> PathBuf {
    let python = dir().join("venv/bin/python");
    assert!(
        python.exists(),
        "{}",
        missing(&format!("mcp=={PYTHON_MCP} (Python)"))
    );
    python
}

/// server-everything over streamable HTTP on a free port of loopback, killed when dropped, and
/// its URL: ready when it says so on its stderr (`… listening on port N`), no polling.
pub async fn server_everything_http() -> (tokio::process::Child, String) {
    let port = crate::ports::free_port();
    server_everything_http_on(port).await
}

/// [`server_everything_http`] on `port` (again, after one there was killed: a server started
/// anew, which knows none of the old one's sessions).
pub async fn server_everything_http_on(port: u16) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt;
    let mut child =
        tokio::process::Command::new(npm_server(SERVER_EVERYTHING, "mcp-server-everything"))
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let said = format!("listening on port {port}");
    let listening = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains(&said) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        listening,
        Ok(true),
        "server-everything did not say it listens on {port}"
    );
    // Its later output is read (and dropped), so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, format!("http://127.0.0.1:{port}/mcp"))
}
