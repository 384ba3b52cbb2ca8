//! A person's browser for the approvers' page: Debian's Chromium, headless, driven through its
//! ChromeDriver, with the WebDriver virtual authenticator (CTAP2, internal transport, resident
//! keys, user verification) standing in for the person's passkey.
//!
//! The virtual authenticator is the W3C WebAuthn spec's WebDriver extension
//! (`/session/{id}/webauthn/...`), which fantoccini does not wrap: its commands go through
//! fantoccini's raw command interface ([`Raw`]).
#![allow(unsafe_code)] // ending the browser's process group reaches the OS through libc; the block says why it is sound

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder};
use serde_json::{Map, Value, json};
use tokio::io::AsyncBufReadExt;

use crate::ports::free_port;

/// A headless Chromium with a virtual authenticator; killed (with its driver) when dropped.
pub struct Browser {
    /// The WebDriver session.
    pub client: Client,
    /// The virtual authenticator's id.
    pub authenticator: String,
    _driver: tokio::process::Child,
    _profile: tempfile::TempDir,
}

/// One WebDriver command of the session that fantoccini does not wrap.
#[derive(Debug)]
pub struct Raw {
    /// The path after `/session/{id}/`.
    pub path: String,
    /// `POST` with this body, or `GET` when `None`.
    pub body: Option<Value>,
    /// `DELETE` instead.
    pub delete: bool,
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(pid) = self._driver.id() {
            // SAFETY: killpg only sends a signal, to the group this browser's driver leads.
            unsafe {
                libc::killpg(pid as i32, libc::SIGKILL);
            }
        }
    }
}

impl WebDriverCompatibleCommand for Raw {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/{}",
            session_id.unwrap_or(""),
            self.path
        ))
    }

    fn method_and_body(&self, _request_url: &url::Url) -> (http::Method, Option<String>) {
        match (&self.body, self.delete) {
            (_, true) => (http::Method::DELETE, None),
            (Some(body), false) => (http::Method::POST, Some(body.to_string())),
            (None, false) => (http::Method::GET, None),
        }
    }
}

/// Debian's Chromium binary.
pub fn chromium() -> PathBuf {
    let path = PathBuf::from("/usr/bin/chromium");
    assert!(
        path.exists(),
        "chromium is missing: `.ci/setup tests` installs Debian's chromium and chromium-driver"
    );
    path
}

impl Browser {
    /// A fresh browser (its own profile) with a window of `width` × `height`, and one virtual
    /// authenticator that verifies its user.
    pub async fn start(width: u32, height: u32) -> Browser {
        let _ = chromium();
        let port = free_port();
        let mut driver = tokio::process::Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            // A group of its own, with the Chromium it starts: ended whole when dropped, even
            // when a test fails before it closes its session.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver (Debian's chromium-driver) starts");
        // It says when it listens.
        let mut lines = tokio::io::BufReader::new(driver.stdout.take().unwrap()).lines();
        let started = tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("started successfully") {
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(started, Ok(true), "chromedriver did not start");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let profile = tempfile::tempdir().unwrap();
        let mut caps = Map::new();
        caps.insert("browserName".into(), json!("chrome"));
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium(),
                // The page's viewport exactly (a window has a minimum width a phone's is under).
                "mobileEmulation": {
                    "deviceMetrics": { "width": width, "height": height, "pixelRatio": 1 },
                },
                "args": [
                    "--headless=new",
                    // The tests run as root, where Chromium's sandbox cannot start.
                    "--no-sandbox",
                    "--disable-dev-shm-usage",
                    "--disable-gpu",
                    format!("--window-size={width},{height}"),
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let client = ClientBuilder::native()
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("a WebDriver session on Chromium");
        let mut browser = Browser {
            client,
            authenticator: String::new(),
            _driver: driver,
            _profile: profile,
        };
        browser.authenticator = browser.add_authenticator().await;
        browser
    }

    /// Runs a raw command of this session; answers its `value`.
    pub async fn raw(&self, path: &str, body: Option<Value>) -> Value {
        self.client
            .issue_cmd(Raw {
                path: path.into(),
                body,
                delete: false,
            })
            .await
            .unwrap_or_else(|e| panic!("WebDriver {path}: {e}"))
    }

    /// Adds a virtual authenticator (CTAP2, internal, resident keys, user verification, a user
    /// who consents and verifies); answers its id.
    pub async fn add_authenticator(&self) -> String {
        let id = self
            .raw(
                "webauthn/authenticator",
                Some(json!({
                    "protocol": "ctap2",
                    "transport": "internal",
                    "hasResidentKey": true,
                    "hasUserVerification": true,
                    "isUserConsenting": true,
                    "isUserVerified": true,
                })),
            )
            .await;
        id.as_str().expect("an authenticator id").to_owned()
    }

    /// Whether the authenticator verifies its user from now on.
    pub async fn set_user_verified(&self, verified: bool) {
        self.raw(
            &format!("webauthn/authenticator/{}/uv", self.authenticator),
            Some(json!({ "isUserVerified": verified })),
        )
        .await;
    }

    /// The credentials the authenticator holds (each with its id, private key and sign count).
    pub async fn credentials(&self) -> Vec<Value> {
        self.raw(
            &format!("webauthn/authenticator/{}/credentials", self.authenticator),
            None,
        )
        .await
        .as_array()
        .cloned()
        .unwrap_or_default()
    }

    /// Puts `credential` (as [`Browser::credentials`] answered it) into the authenticator, as
    /// a copy of an authenticator would hold it.
    pub async fn add_credential(&self, credential: &Value) {
        self.raw(
            &format!("webauthn/authenticator/{}/credential", self.authenticator),
            Some(credential.clone()),
        )
        .await;
    }

    /// Forgets every credential of the authenticator.
    pub async fn remove_credentials(&self) {
        self.client
            .issue_cmd(Raw {
                path: format!("webauthn/authenticator/{}/credentials", self.authenticator),
                body: None,
                delete: true,
            })
            .await
            .expect("credentials removed");
    }

    /// Runs WebAuthn in the page: `navigator.credentials.get` with the server's request options
    /// (`options`, as the page's API answers them), with `user_verification` in place of theirs
    /// when given; answers the assertion as the page would send it.
    pub async fn assert(&self, options: &Value, user_verification: Option<&str>) -> Value {
        let script = r#"
            const [options, uv, done] = arguments;
            const bytes = (t) => { const b = t.replace(/-/g, "+").replace(/_/g, "/");
              const raw = atob(b + "===".slice((b.length + 3) % 4));
              return Uint8Array.from(raw, (c) => c.charCodeAt(0)).buffer; };
            const text = (buf) => { let r = ""; for (const x of new Uint8Array(buf)) r += String.fromCharCode(x);
              return btoa(r).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, ""); };
            const key = structuredClone(options.publicKey);
            key.challenge = bytes(key.challenge);
            key.allowCredentials = (key.allowCredentials || []).map((c) => ({ ...c, id: bytes(c.id) }));
            if (uv) key.userVerification = uv;
            navigator.credentials.get({ publicKey: key }).then((c) => done({
              id: c.id, rawId: text(c.rawId), type: c.type, extensions: {},
              response: { clientDataJSON: text(c.response.clientDataJSON),
                authenticatorData: text(c.response.authenticatorData),
                signature: text(c.response.signature),
                userHandle: c.response.userHandle ? text(c.response.userHandle) : undefined } }),
              (e) => done({ error: String(e) }));
        "#;
        let answer = self
            .client
            .execute_async(script, vec![options.clone(), json!(user_verification)])
            .await
            .expect("the script ran");
        assert!(
            answer.get("error").is_none(),
            "WebAuthn in the page: {answer}"
        );
        answer
    }

    /// `fetch` from the page (same origin, its cookie): answers `[status, body]`.
    pub async fn fetch(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let script = r#"
            const [method, path, body, done] = arguments;
            const init = { method, credentials: "same-origin", headers: {} };
            if (body !== null) { init.headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
            fetch(path, init).then(async (r) => done([r.status, await r.json().catch(() => null)]),
              (e) => done([0, String(e)]));
        "#;
        let answer = self
            .client
            .execute_async(script, vec![json!(method), json!(path), json!(body)])
            .await
            .expect("the script ran");
        (answer[0].as_u64().unwrap_or(0) as u16, answer[1].clone())
    }
}

impl Browser {
    /// The README's picture `tests/readme/<name>.png`, taken of this page as it is now (the
    /// browser's own screenshot of its viewport), so it cannot drift from what the page shows.
    /// What it shows that matters is kept beside it in `<name>.txt`: the page's text (with each
    /// `(from, to)` of `replace` applied, for what differs between runs) and a SHA-256 of every
    /// file in `files`. Every run writes both under target/screenshots and fails when the record
    /// differs from the committed one; with `COUNTERSIGN_UPDATE_README=1` it writes both into
    /// tests/readme instead (then commit them). The picture is not compared byte for byte: fonts
    /// differ between machines.
    pub async fn readme_picture(
        &self,
        name: &str,
        files: &[PathBuf],
        replace: &[(String, String)],
    ) {
        let text: Value = self
            .client
            .execute("return document.body.innerText", vec![])
            .await
            .unwrap();
        let mut text = text.as_str().unwrap_or_default().to_owned();
        for (from, to) in replace {
            text = text.replace(from, to);
        }
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut record = format!(
            "What tests/readme/{name}.png shows, written with it by the test that takes it \
             (COUNTERSIGN_UPDATE_README=1); every other run checks the page against it.\n\n"
        );
        for file in files {
            let digest =
                countersign_core::PlanHash::of_bytes(&std::fs::read(root.join(file)).unwrap());
            record.push_str(&format!("{} sha256:{}\n", file.display(), digest.to_hex()));
        }
        record.push_str(&format!("\n{}\n", text.trim_end()));
        let png = self.client.screenshot().await.expect("a screenshot");
        let shots = root.join("target/screenshots");
        std::fs::create_dir_all(&shots).unwrap();
        std::fs::write(shots.join(format!("{name}.png")), &png).unwrap();
        std::fs::write(shots.join(format!("{name}.txt")), &record).unwrap();
        let readme = root.join("tests/readme");
        if std::env::var_os("COUNTERSIGN_UPDATE_README").is_some_and(|v| v == "1") {
            std::fs::write(readme.join(format!("{name}.png")), &png).unwrap();
            std::fs::write(readme.join(format!("{name}.txt")), &record).unwrap();
            return;
        }
        let committed =
            std::fs::read_to_string(readme.join(format!("{name}.txt"))).unwrap_or_default();
        assert!(
            committed == record,
            "tests/readme/{name}.png no longer shows what the page shows (see \
             target/screenshots/{name}.png and .txt); run the test again with \
             COUNTERSIGN_UPDATE_README=1 and commit tests/readme.\n--- committed\n{committed}\n\
             --- now\n{record}"
        );
    }
}
