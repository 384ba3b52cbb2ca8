//! The desk's window under test: a desk in its own directories, started as a person starts it
//! (its window is a process the desk starts), a WebDriver session attached to that window through
//! tauri-driver and WebKitWebDriver (debug builds only: the window's WebKit then serves its
//! inspector on a port the test chose, and allows automation), and real MCP clients connected to
//! it through `countersign mcp`. When the desk ends its window and starts another, the test
//! attaches a new session to the new one ([`Desk::follow_window`]).
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use rmcp::model::*;
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Map, Value, json};

use crate::ports::free_port;

/// The workspace's target directory (this test binary lives in `<target>/<profile>/deps`).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (cargo build --workspace)",
        path.display()
    );
    path
}

/// tauri-driver, as `cargo install` puts it.
pub fn tauri_driver() -> PathBuf {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cargo"));
    let path = home.join("bin/tauri-driver");
    assert!(
        path.exists(),
        "tauri-driver is missing: run .ci/setup tests"
    );
    path
}

/// Screenshots land here, outside git.
pub fn screenshots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A desk in its own directories, with a WebDriver session on its window.
pub struct Desk {
    /// Its data, config and socket.
    pub dir: tempfile::TempDir,
    /// The desk, leading a process group of its own (its window and WebKit's processes in it).
    desk: crate::group::Group,
    driver: Driver,
    /// The WebDriver session on the window that runs now.
    browser: std::sync::Mutex<Client>,
    /// The screen of its own it runs on, unless the test gave it one (`DISPLAY` in its env).
    display: Option<OwnDisplay>,
    /// The session bus of its own its window uses, unless the test runs under one or gave it
    /// one: without it GTK starts a bus that outlives every process group.
    _bus: Option<crate::group::SessionBus>,
}

impl Desk {
    /// Starts a desk with the real keychain.
    pub async fn start() -> Desk {
        Desk::start_with(&[]).await
    }

    /// Starts a desk with extra environment.
    pub async fn start_with(env: &[(&str, &str)]) -> Desk {
        Desk::start_configured(env, None).await
    }

    /// Starts a desk whose settings file holds `settings` (as the settings view saves it).
    pub async fn start_with_settings(settings: Value) -> Desk {
        Desk::start_configured(&[], Some(settings)).await
    }

    /// Starts a desk with extra environment and, when given, a settings file holding `settings`.
    pub async fn start_configured(env: &[(&str, &str)], settings: Option<Value>) -> Desk {
        Desk::launch(tempfile::tempdir().unwrap(), env, settings, Stdio::null()).await
    }

    /// Starts a desk whose files are under `dir` (prepared by the test: its `config` folder may
    /// hold files already), with extra environment.
    pub async fn start_in(dir: tempfile::TempDir, env: &[(&str, &str)]) -> Desk {
        Desk::launch(dir, env, None, Stdio::null()).await
    }

    /// Its socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("desk.sock")
    }

    /// A real MCP client connected through `countersign mcp` to this desk and the built-in tools.
    pub async fn agent(&self, name: &str) -> RunningService<RoleClient, ClientConfig> {
        self.agent_on(name, &self.dir.path().join("app.sqlite"))
            .await
    }

    /// A real MCP client connected to this desk's built-in tools on the database file `db`.
    pub async fn agent_on(
        &self,
        name: &str,
        db: &std::path::Path,
    ) -> RunningService<RoleClient, ClientConfig> {
        let mut cmd = tokio::process::Command::new(bin("countersign"));
        cmd.arg("mcp")
            .arg("--no-launch")
            .arg("--wait")
            .arg("40")
            .arg("--socket")
            .arg(self.socket());
        cmd.arg("--db").arg(db);
        cmd.env("RUST_LOG", "warn");
        let info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new(name.to_owned(), "1.0"),
        );
        info.serve(TokioChildProcess::new(cmd).unwrap())
            .await
            .unwrap()
    }

    /// Whether an element matches.
    pub async fn exists(&self, css: &str) -> bool {
        self.browser().find(Locator::Css(css)).await.is_ok()
    }

    /// An element's text. An element the window replaced between finding it and reading it
    /// (a view re-rendered on an update) is found again.
    pub async fn text(&self, css: &str) -> String {
        for _ in 0..20 {
            let element = self.browser().find(Locator::Css(css)).await.unwrap();
            match element.text().await {
                Ok(text) => return text,
                Err(fantoccini::error::CmdError::Standard(e))
                    if e.error == fantoccini::error::ErrorStatus::StaleElementReference =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("reading the text of {css}: {e}"),
            }
        }
        panic!("{css} was replaced on every read");
    }

    /// Whether a request is shown.
    pub async fn visible_request(&self) -> bool {
        let hidden: Value = self
            .browser()
            .execute("return document.getElementById('detail').hidden", vec![])
            .await
            .unwrap();
        hidden == json!(false)
    }

    /// The id of the request the window shows (its queue entry's `data-id`), if it shows one.
    pub async fn shown_id(&self) -> Option<String> {
        let id: Value = self
            .browser()
            .execute(
                "const li = document.querySelector('#queue li.selected');
                 return li && !document.getElementById('detail').hidden ? li.dataset.id : null",
                vec![],
            )
            .await
            .unwrap();
        id.as_str().map(str::to_owned)
    }

    /// Waits (up to 30 s) until the page's `predicate` (a JavaScript expression) holds, on the
    /// page's own events: a `MutationObserver` checks it again after each change of the
    /// document, and nothing polls. The page must stay loaded meanwhile (use [`Desk::until`]
    /// across a window the desk releases and creates again).
    pub async fn until_page(&self, what: &str, predicate: &str) {
        let script = format!(
            "const done = arguments[arguments.length - 1];
             const check = () => {{ try {{ return !!({predicate}); }} catch (e) {{ return false; }} }};
             if (check()) {{ done(true); return; }}
             const seen = new MutationObserver(() => {{
               if (check()) {{ seen.disconnect(); done(true); }}
             }});
             seen.observe(document, {{subtree: true, childList: true, attributes: true, characterData: true}});"
        );
        let held = tokio::time::timeout(
            Duration::from_secs(30),
            self.browser().execute_async(&script, vec![]),
        )
        .await;
        assert!(
            matches!(held, Ok(Ok(Value::Bool(true)))),
            "timed out waiting for {what}: {held:?}"
        );
    }

    /// Waits (up to 30 s) until `check` holds, asking again every 50 ms: for what publishes no
    /// event a test can wait on (another process's state, a window the desk replaces).
    pub async fn until<F>(&self, what: &str, check: F)
    where
        F: for<'a> Fn(&'a Desk) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + 'a>>,
    {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !check(self).await {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits for a request to be shown.
    pub async fn wait_for_request(&self) {
        self.until("a request in the window", |d| Box::pin(d.visible_request()))
            .await;
    }

    /// Whether Approve is enabled.
    pub async fn approve_enabled(&self) -> bool {
        self.enabled("#approve").await
    }

    /// Whether the element `css` selects (a button, an option) is enabled.
    pub async fn enabled(&self, css: &str) -> bool {
        let disabled: Value = self
            .browser()
            .execute(
                "return document.querySelector(arguments[0]).disabled",
                vec![json!(css)],
            )
            .await
            .unwrap();
        disabled == json!(false)
    }

    /// Clicks an element. An option is brought into sight first, its list scrolled to as a person
    /// scrolls to it: WebKitWebDriver scrolls to an element it clicks, but not to a list that
    /// holds an option.
    pub async fn click(&self, css: &str) {
        let element = self.browser().find(Locator::Css(css)).await.unwrap();
        self.browser()
            .execute(
                "const el = document.querySelector(arguments[0]); \
                 const list = el && el.closest('select'); \
                 if (list) list.scrollIntoView({block: 'nearest'});",
                vec![json!(css)],
            )
            .await
            .unwrap();
        element.click().await.unwrap();
    }

    /// Saves a screenshot of the whole screen under target/screenshots.
    pub async fn screenshot(&self, name: &str) {
        self.shoot(name, None).await;
    }

    /// Takes a picture from the X server, as a person would see the screen (WebKit's own snapshot
    /// can stall when accelerated compositing is off, which the desk turns off to save memory),
    /// cut to `crop` (x, y, width, height) when given, without metadata.
    async fn shoot(&self, name: &str, crop: Option<(u64, u64, u64, u64)>) -> PathBuf {
        // Let the page paint what the DOM already says.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let path = screenshots().join(name);
        let mut import = tokio::process::Command::new("import");
        // The screen the desk runs on: its own, unless the test gave it one (then `DISPLAY`).
        if let Some(display) = &self.display {
            import.args(["-display", &display.name]);
        }
        import.args(["-window", "root"]);
        if let Some((x, y, w, h)) = crop {
            import.args(["-crop", &format!("{w}x{h}+{x}+{y}"), "+repage"]);
        }
        let shot = import.arg("-strip").arg(&path).status();
        let status = tokio::time::timeout(Duration::from_secs(20), shot)
            .await
            .unwrap_or_else(|_| panic!("the screenshot {name} did not come back"))
            .expect("ImageMagick's import (installed by .ci/setup)");
        assert!(status.success(), "import could not take {}", path.display());
        path
    }

    /// The README's picture `tests/readme/<name>.png`, taken of this window as it is now, so that
    /// it cannot drift from what the window shows. What the picture shows that matters is kept
    /// beside it in `<name>.txt`: the window's text (this desk's directory written `$DIR`) and a
    /// SHA-256 of every file of `ui/`. Every run takes the picture into target/screenshots and
    /// fails when that record differs from the committed one; with `COUNTERSIGN_UPDATE_README=1`
    /// it writes both files instead (then commit them). The picture itself is not compared byte
    /// for byte: fonts and anti-aliasing differ between machines, and a picture that changed on
    /// every run would dirty the tree.
    pub async fn readme_picture(&self, name: &str) {
        let text: Value = self
            .browser()
            .execute("return document.body.innerText", vec![])
            .await
            .unwrap();
        let dir = self.dir.path().to_str().unwrap();
        let text = text.as_str().unwrap().replace(dir, "$DIR");
        let ui = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../ui");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&ui)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        let mut record = format!(
            "What tests/readme/{name}.png shows, written with it by the desk test that takes it \
             (COUNTERSIGN_UPDATE_README=1); every other run checks the window against it.\n\n"
        );
        for file in files {
            let digest = countersign_core::PlanHash::of_bytes(&std::fs::read(&file).unwrap());
            let file = file.file_name().unwrap().to_string_lossy().into_owned();
            record.push_str(&format!("ui/{file} sha256:{}\n", digest.to_hex()));
        }
        record.push_str(&format!("\n{}\n", text.trim_end()));
        let rect = self.browser().get_window_rect().await.unwrap();
        let shot = self.shoot(&format!("{name}.png"), Some(rect)).await;
        std::fs::write(screenshots().join(format!("{name}.txt")), &record).unwrap();
        let readme = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("readme");
        if std::env::var_os("COUNTERSIGN_UPDATE_README").is_some_and(|v| v == "1") {
            std::fs::copy(&shot, readme.join(format!("{name}.png"))).unwrap();
            std::fs::write(readme.join(format!("{name}.txt")), &record).unwrap();
            return;
        }
        let committed =
            std::fs::read_to_string(readme.join(format!("{name}.txt"))).unwrap_or_default();
        assert!(
            committed == record,
            "tests/readme/{name}.png no longer shows what the window shows (see \
             target/screenshots/{name}.png and .txt); run the desk tests again with \
             COUNTERSIGN_UPDATE_README=1 and commit tests/readme.\n--- committed\n{committed}\n\
             --- now\n{record}"
        );
    }

    /// Calls a desk command through the page's own IPC, as a script in the window could:
    /// `Ok(value)` or `Err(the UiError)`.
    pub async fn invoke(&self, command: &str, args: Value) -> Result<Value, Value> {
        let answer: Value = self
            .browser()
            .execute_async(
                "const [command, args, done] = arguments; \
                 window.__TAURI__.core.invoke(command, args).then( \
                   (v) => done({ ok: v === undefined ? null : v }), (e) => done({ err: e }))",
                vec![json!(command), args],
            )
            .await
            .unwrap();
        match answer.get("err") {
            Some(e) => Err(e.clone()),
            None => Ok(answer["ok"].clone()),
        }
    }

    /// Everything the page holds as text: its title, its visible and hidden text, every
    /// attribute, and every field's value.
    pub async fn page_text(&self) -> String {
        let text: Value = self
            .browser()
            .execute(
                "const parts = [document.title, document.body.innerText, \
                   document.documentElement.textContent]; \
                 for (const el of document.querySelectorAll('*')) { \
                   for (const a of el.attributes) parts.push(a.value); \
                   if (typeof el.value === 'string') parts.push(el.value); \
                 } \
                 return parts.join('\\n');",
                vec![],
            )
            .await
            .unwrap();
        text.as_str().unwrap().to_owned()
    }

    /// Sets a field's value as a person typing (or pasting) it would, `input` event included.
    pub async fn set_value(&self, css: &str, value: &str) {
        self.browser()
            .execute(
                "const [css, value] = arguments; const el = document.querySelector(css); \
                 el.value = value; el.dispatchEvent(new Event('input'));",
                vec![json!(css), json!(value)],
            )
            .await
            .unwrap();
    }

    /// A field's value (empty when there is no such field).
    pub async fn value(&self, css: &str) -> String {
        let v: Value = self
            .browser()
            .execute(
                "const el = document.querySelector(arguments[0]); return el ? el.value : '';",
                vec![json!(css)],
            )
            .await
            .unwrap();
        v.as_str().unwrap_or_default().to_owned()
    }

    /// How many elements match `css`.
    pub async fn count(&self, css: &str) -> usize {
        let n: Value = self
            .browser()
            .execute(
                "return document.querySelectorAll(arguments[0]).length",
                vec![json!(css)],
            )
            .await
            .unwrap();
        n.as_u64().unwrap() as usize
    }

    /// The `data-flag`s of the elements matching `css`.
    pub async fn flags(&self, css: &str) -> Vec<String> {
        let flags: Value = self
            .browser()
            .execute(
                "return [...document.querySelectorAll(arguments[0])].map(e => e.dataset.flag)",
                vec![json!(css)],
            )
            .await
            .unwrap();
        serde_json::from_value(flags).unwrap()
    }

    /// Ends the session (the process group ends on drop).
    pub async fn stop(self) {
        let _ = self.browser().clone().close().await;
    }
}

impl Drop for Desk {
    fn drop(&mut self) {
        // The desk with its window and WebKit's processes, the group whole, before its files and
        // its screen go (the driver's group ends when it is dropped, after this).
        self.desk.end();
    }
}

/// A WebDriver session, through tauri-driver on `port`, on the desk's window: tried until the
/// window's process serves its inspector (up to 30 s).
async fn attach(port: u16) -> Client {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match new_session(port).await {
            Ok(browser) => return browser,
            Err(e) => {
                assert!(Instant::now() < deadline, "no WebDriver session: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// One try at a WebDriver session through tauri-driver on `port`.
async fn new_session(port: u16) -> Result<Client, fantoccini::error::NewSessionError> {
    let mut caps = Map::new();
    caps.insert("browserName".into(), json!("wry"));
    // tauri-driver wants an application; with a target to attach to, WebKitWebDriver starts none.
    caps.insert(
        "tauri:options".into(),
        json!({ "application": bin("countersign-desk"), "args": [] }),
    );
    ClientBuilder::native()
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
}

/// tauri-driver on ports of its own, leading a process group of its own with the WebKitWebDriver
/// it starts, which attaches to the window's inspector. Its group ends, whole, when it is dropped.
struct Driver {
    /// tauri-driver, leading the group.
    group: crate::group::Group,
    /// Where WebDriver clients connect.
    port: u16,
    /// Its WebKitWebDriver's.
    native: u16,
    /// What it and its WebKitWebDriver write on stderr.
    said: tempfile::NamedTempFile,
}

impl Driver {
    /// Starts one for the window whose inspector serves on `inspector`, on the desk's screen and
    /// session bus.
    fn start(
        inspector: &str,
        display: Option<(&str, String)>,
        bus: Option<(&str, String)>,
    ) -> Driver {
        let port = free_port();
        let native = free_port();
        let said = tempfile::NamedTempFile::new().unwrap();
        let group = crate::group::Group::spawn(
            std::process::Command::new(tauri_driver())
                .args([
                    "--port",
                    &port.to_string(),
                    "--native-port",
                    &native.to_string(),
                ])
                .env("WEBDRIVER_TARGET_ADDR", inspector)
                .envs(display)
                .envs(bus)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(said.reopen().unwrap()),
        )
        .unwrap();
        Driver {
            group,
            port,
            native,
            said,
        }
    }

    /// A session on the window, once tauri-driver and its WebKitWebDriver take connections and
    /// the window serves its inspector; or why there will be none, as soon as that is known:
    /// tauri-driver ended, or its WebKitWebDriver never listened or stopped (tauri-driver then
    /// answers nothing at all).
    async fn session(&mut self) -> Result<Client, String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        for (port, who) in [
            (self.port, "tauri-driver"),
            (self.native, "WebKitWebDriver"),
        ] {
            while !listens(port).await {
                if let Ok(Some(status)) = self.group.leader().try_wait() {
                    return Err(format!("tauri-driver ended ({status})"));
                }
                // WebKitWebDriver that cannot listen says so and ends; tauri-driver stays.
                if self.said().contains("FATAL") {
                    return Err(format!("{who} gave up"));
                }
                if Instant::now() >= deadline {
                    return Err(format!("{who} did not listen on port {port} in 20 s"));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match new_session(self.port).await {
                Ok(browser) => return Ok(browser),
                Err(e) if !listens(self.native).await => {
                    return Err(format!("WebKitWebDriver stopped listening: {e}"));
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("no session in 30 s: {e}"));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// The end of what it and its WebKitWebDriver wrote on stderr.
    fn said(&self) -> String {
        let said = std::fs::read(self.said.path()).unwrap_or_default();
        String::from_utf8_lossy(&said[said.len().saturating_sub(2_000)..]).into_owned()
    }
}

/// Whether something takes connections on `port` of loopback.
async fn listens(port: u16) -> bool {
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_ok()
}

impl Desk {
    /// The process group of the desk, its window and WebKit's processes.
    pub fn process_group(&self) -> Option<u32> {
        Some(self.desk.id())
    }
}

impl Desk {
    /// The X display the desk's window is on.
    pub fn display_name(&self) -> String {
        match &self.display {
            Some(own) => own.name.clone(),
            None => std::env::var("DISPLAY").expect("DISPLAY"),
        }
    }

    /// Closes the window as a person does with the window manager's close button
    /// (`WM_DELETE_WINDOW`); the desk hides it and goes on serving.
    pub async fn close_window(&self) {
        let asked = crate::xwindow::close_by_title(&self.display_name(), "Countersign");
        assert_eq!(asked, 1, "one window of the desk's on screen to close");
    }

    /// The desk's pid (the process answering on its socket).
    pub async fn pid(&self) -> u32 {
        crate::desk_process::pid_at(&self.socket()).await as u32
    }

    /// The desk's window processes (`countersign-desk --window-of-desk`): the open window's and
    /// the spare's.
    pub fn window_processes(desk_pid: u32) -> Vec<u32> {
        crate::measure::descendants(desk_pid)
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|a| a.split(|b| *b == 0).any(|a| a == b"--window-of-desk"))
            })
            .collect()
    }

    /// The parent of process `pid`, from `/proc`.
    pub fn parent_of(pid: u32) -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the command name in parentheses: the state, then the parent's pid.
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    }

    /// The desk's web processes now (WebKit's web processes among its descendants).
    pub fn web_processes(desk_pid: u32) -> Vec<u32> {
        crate::measure::descendants(desk_pid)
            .into_iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim().starts_with("WebKitWebProces"))
            })
            .collect()
    }

    /// After the desk started its window again (it ended the old one while idle), attaches a new
    /// WebDriver session to the new one and waits (up to 30 s) until its page has loaded. A
    /// session on a window that still runs is kept.
    pub async fn follow_window(&self) {
        if self.loaded().await {
            return;
        }
        let _ = self.browser().close().await;
        let deadline = Instant::now() + Duration::from_secs(30);
        *countersign_core::sync::lock(&self.browser) = attach(self.driver.port).await;
        while !self.loaded().await {
            assert!(
                Instant::now() < deadline,
                "no window of the desk's to drive"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether the session's window shows the desk's page.
    async fn loaded(&self) -> bool {
        self.exists("#empty").await || self.exists("#detail").await
    }

    /// The WebDriver session on the window that runs now.
    pub fn browser(&self) -> Client {
        countersign_core::sync::lock(&self.browser).clone()
    }
}

impl Desk {
    /// Starts a desk whose files are all under `dir` (its `COUNTERSIGN_DESK_DIR` and socket),
    /// with extra environment, writing its stderr (and its window's) to `stderr`.
    pub async fn start_recording(
        dir: tempfile::TempDir,
        env: &[(&str, &str)],
        stderr: std::fs::File,
    ) -> Desk {
        Desk::launch(dir, env, None, stderr.into()).await
    }

    /// Starts a desk with its files under `dir`, extra environment, the settings file holding
    /// `settings` when given, and its stderr going to `stderr`; attaches a WebDriver session to its
    /// window and waits until the window has loaded.
    async fn launch(
        dir: tempfile::TempDir,
        env: &[(&str, &str)],
        settings: Option<Value>,
        stderr: Stdio,
    ) -> Desk {
        // Each desk on a screen of its own: windows of desks running side by side on one screen
        // take focus from each other, and a window that regains focus holds Approve again, so a
        // test could wait for Approve until it timed out.
        let display = (!env.iter().any(|(k, _)| *k == "DISPLAY")).then(OwnDisplay::start);
        let own_display = display.as_ref().map(|d| ("DISPLAY", d.name.clone()));
        let bus = (!env.iter().any(|(k, _)| *k == "DBUS_SESSION_BUS_ADDRESS"))
            .then(crate::group::SessionBus::unless_given)
            .flatten();
        let own_bus = bus
            .as_ref()
            .map(|b| ("DBUS_SESSION_BUS_ADDRESS", b.address().to_owned()));
        for sub in ["data", "config"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        if let Some(settings) = settings {
            let file = dir.path().join("config/settings.json");
            std::fs::write(file, settings.to_string()).unwrap();
        }
        // The window's WebKit serves its inspector here (debug builds read these; release builds
        // remove them), and WebKitWebDriver attaches to it instead of starting a browser.
        let inspector = format!("127.0.0.1:{}", free_port());
        // Its own process group: its window and WebKit's processes end with it, also when the
        // launch itself fails.
        let desk = crate::group::Group::spawn(
            std::process::Command::new(bin("countersign-desk"))
                .env("COUNTERSIGN_DESK_DIR", dir.path())
                .env("COUNTERSIGN_SOCKET", dir.path().join("desk.sock"))
                .env("RUST_LOG", "warn")
                .env("WEBKIT_INSPECTOR_SERVER", &inspector)
                .env("TAURI_WEBVIEW_AUTOMATION", "true")
                .envs(env.iter().copied())
                .envs(own_display.clone())
                .envs(own_bus.clone())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(stderr),
        )
        .unwrap();
        crate::desk_process::wait_for_socket(&dir.path().join("desk.sock")).await;
        // A driver whose WebKitWebDriver could not start (or stopped) answers nothing, ever:
        // another takes its place, on ports of its own, and what the ones before said is shown if
        // none serves.
        let mut failed = Vec::new();
        let (driver, browser) = loop {
            let mut driver = Driver::start(&inspector, own_display.clone(), own_bus.clone());
            match driver.session().await {
                Ok(browser) => break (driver, browser),
                Err(why) => {
                    let why = format!("{why}; it said: {}", driver.said());
                    eprintln!("a WebDriver driver failed, another takes its place: {why}");
                    failed.push(why);
                    assert!(
                        failed.len() < 3,
                        "no WebDriver session on the desk's window: {failed:#?}"
                    );
                }
            }
        };
        let desk = Desk {
            dir,
            desk,
            driver,
            browser: std::sync::Mutex::new(browser),
            display,
            _bus: bus,
        };
        desk.until("the window to load", |d| {
            Box::pin(async move { d.exists("#empty").await })
        })
        .await;
        desk
    }

    /// A real MCP client connected through `countersign mcp -- ARGV...` to this desk: an ad-hoc
    /// stdio upstream, which the desk starts with the gateway's environment (this process's,
    /// plus `env`). The gateway runs in `cwd` and writes its stderr to `stderr`.
    pub async fn agent_command(
        &self,
        name: &str,
        argv: &[&str],
        env: &[(&str, &str)],
        cwd: &std::path::Path,
        stderr: std::fs::File,
    ) -> RunningService<RoleClient, ClientConfig> {
        let mut cmd = tokio::process::Command::new(bin("countersign"));
        cmd.arg("mcp")
            .arg("--no-launch")
            .arg("--wait")
            .arg("40")
            .arg("--socket")
            .arg(self.socket())
            .arg("--")
            .args(argv)
            .current_dir(cwd)
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied());
        let (transport, _) = TokioChildProcess::builder(cmd)
            .stderr(stderr)
            .spawn()
            .unwrap();
        let info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new(name.to_owned(), "1.0"),
        );
        info.serve(transport).await.unwrap()
    }
}

/// An X display of a test's own (Xvfb), for a desk whose window must not share the screen, and
/// so the focus, with the windows of desk tests running beside it. Ends with it.
pub struct OwnDisplay {
    server: std::process::Child,
    /// Xvfb's stdout, kept open: it writes its display number there again each time it resets
    /// (its last client gone), and a closed pipe would kill it with SIGPIPE.
    _said: std::io::BufReader<std::process::ChildStdout>,
    /// The `DISPLAY` value, e.g. `:42`.
    pub name: String,
}

impl OwnDisplay {
    /// Starts Xvfb on a free display number (Xvfb picks it) and waits until it accepts clients.
    pub fn start() -> OwnDisplay {
        use std::io::BufRead;
        // A number of its own, drawn from a wide range, rather than the first free one: tests
        // start and end displays side by side, and two servers reaching for the same low number
        // as a third lets it go can leave one of them without its socket ("cannot open display").
        // Xvfb refuses a number whose lock another holds: then another number.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos() as u64
            ^ (u64::from(std::process::id()) << 20);
        for attempt in 0..20u64 {
            let number = 1000
                + (seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(attempt * 7919))
                    % 29000;
            let mut server = std::process::Command::new("Xvfb")
                .args([
                    &format!(":{number}"),
                    "-displayfd",
                    "1",
                    "-screen",
                    "0",
                    "1280x800x24",
                    "-nolisten",
                    "tcp",
                    // No reset when the last client leaves: a test's look (one connection, then
                    // none) must not restart the server under the desk's window.
                    "-noreset",
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("Xvfb (installed by .ci/setup)");
            let mut said = String::new();
            let mut out = std::io::BufReader::new(server.stdout.take().unwrap());
            let _ = out.read_line(&mut said);
            if said.trim() == number.to_string() {
                return OwnDisplay {
                    server,
                    _said: out,
                    name: format!(":{number}"),
                };
            }
            // It did not take the number (in use): it has exited, or ends now.
            let _ = server.kill();
            let _ = server.wait();
        }
        panic!("Xvfb took none of 20 display numbers");
    }
}

impl Drop for OwnDisplay {
    fn drop(&mut self) {
        // SIGTERM, not SIGKILL: Xvfb then removes its lock file and socket. One killed outright
        // leaves them, and two servers starting at once may both take the stale number, the
        // second unlinking the first's socket (seen once: a test's own display "cannot open").
        // SAFETY: kill has no memory preconditions; the pid is our unreaped child.
        unsafe { libc::kill(self.server.id() as i32, libc::SIGTERM) };
        // Its exit, on the kernel's word (a pidfd), for up to 5 s; then made to.
        if !crate::group::exits_within(self.server.id(), Duration::from_secs(5)) {
            let _ = self.server.kill();
        }
        let _ = self.server.wait();
    }
}
