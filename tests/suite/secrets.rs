//! Secrets never leak: the HMAC secret (before and after a rotation), every token minted, and an
//! upstream's credential are nowhere the desk or the gateway write, and in no `Debug` print of the
//! types that carry them.
//!
//! One session through the real desk and window (WebDriver): a real MCP client starts the real
//! `countersign mcp -- python3 obedient_server.py` with `UPSTREAM_API_KEY` in its environment
//! (the desk starts the upstream with the gateway's environment); an open call; a preflight
//! approved by a click, confirmed, then replayed; one denied; one approved and left unused; the
//! settings saved and the secret rotated from the settings view, which kills the unused token;
//! one approved under the new secret, confirmed with changed arguments (refused), then as
//! approved. The desk and the gateway log at `trace` on stderr. Then every file under the desk's
//! directory (its database, WAL and SHM, log, settings, socket and, through `HOME`, `XDG_*` and
//! `TMPDIR`, whatever WebKit and GTK write for it), the desk's stderr and the gateway's, are read
//! as bytes while the desk runs, again after it stopped, and the database once more after a
//! checkpoint. The upstream's own call log is not the desk's: it is left out, and only checked
//! to hold no token and no secret (the desk sends the upstream what was approved, nothing more).
//!
//! Each value is looked for raw, as hex (both cases), as base64 and base64url at each of the three
//! alignments it could have inside a longer encoded text, as a `Debug` print of its bytes, and as
//! UTF-16. A token's nonce may appear (history keeps it); the whole token and its signature may
//! not. The secret read from the keychain is shown to be the desk's by verifying its tokens with
//! it, the credential is shown to have reached the upstream by reading the upstream's
//! environment, the scan is shown to have read this session's records by finding every token's
//! nonce in the checkpointed database, and the scanner is shown to find every spelling inside
//! other text. Every file scanned is listed with its size (`--no-capture` shows the list).
//!
//! Needs what the desk tests need (a display, tauri-driver) and the keychain the desk uses: run
//! under `.ci/with-keychain`, where this process and the desk share one Secret Service.

use std::collections::HashMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use countersign_core::token::{self, SigningKey};
use countersign_secret::{HmacSecret, KeychainStore, SecretStore};
use countersign_tests::calls::confirm_of;
use countersign_tests::desk_process;
use countersign_tests::files::files_under;
use countersign_tests::window::{Desk, OwnDisplay};
use countersign_wire::{Frame, FrameError, Hello, PROTOCOL_VERSION, Reach, RefusedCode, Welcome};
use rmcp::RoleClient;
use rmcp::model::*;
use rmcp::service::RunningService;
use serde_json::{Value, json};

/// How verbose the desk's and the gateway's stderr are: everything, as a person chasing a
/// problem might ask. (The desk's log file is kept at `info` whatever this says.)
const RUST_LOG: &str = "trace";

fn obedient_server() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("peers/obedient_server.py")
}

type Agent = RunningService<RoleClient, ClientConfig>;
type Call = tokio::task::JoinHandle<CallToolResult>;

fn call(agent: &Agent, tool: &str, arguments: &Value) -> Call {
    let peer = agent.peer().clone();
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(arguments.as_object().unwrap().clone());
    tokio::spawn(async move { peer.call_tool(params).await.unwrap() })
}

/// A result as a failure message may show it: its error flag and refusal, never its token.
fn outline(r: &CallToolResult) -> String {
    format!("isError={:?} refusal={:?}", r.is_error, refusal(r))
}

fn refusal(r: &CallToolResult) -> Option<String> {
    r.structured_content
        .as_ref()?
        .get("refusal")?
        .as_str()
        .map(str::to_owned)
}

fn token_of(preflight: &CallToolResult) -> String {
    preflight
        .structured_content
        .as_ref()
        .and_then(|s| s["confirmToken"].as_str())
        .unwrap_or_else(|| {
            panic!(
                "an approved preflight carries a token: {}",
                outline(preflight)
            )
        })
        .to_owned()
}

/// Waits out the approve delay, as a person reading the request would, and clicks Approve.
async fn read_then_approve(desk: &Desk) {
    desk.wait_for_request().await;
    desk.until("Approve to be enabled", |d| Box::pin(d.approve_enabled()))
        .await;
    desk.click("#approve").await;
}

/// A preflight of `write` approved by a click: its result, carrying a token.
async fn approved(desk: &Desk, agent: &Agent, arguments: &Value) -> CallToolResult {
    let pending = call(agent, "write", arguments);
    read_then_approve(desk).await;
    let preflight = pending.await.unwrap();
    assert_ne!(preflight.is_error, Some(true), "{}", outline(&preflight));
    desk.until("the queue to empty", |d| {
        Box::pin(async move { !d.visible_request().await })
    })
    .await;
    preflight
}

/// Random bytes from the kernel.
fn random<const N: usize>() -> [u8; N] {
    use std::io::Read;
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut bytes)
        .unwrap();
    bytes
}

fn hex(bytes: &[u8], upper: bool) -> String {
    bytes
        .iter()
        .map(|b| {
            if upper {
                format!("{b:02X}")
            } else {
                format!("{b:02x}")
            }
        })
        .collect()
}

/// One spelling of a value that must not appear.
#[derive(Clone)]
struct Needle {
    label: String,
    bytes: Vec<u8>,
}

/// Every spelling of `value` the scan looks for: raw; hex in both cases; base64 and base64url
/// at each alignment inside a longer encoded text (the characters that depend on `value` alone);
/// for bytes, a `Debug` print of them; for text, UTF-16 in both byte orders.
fn spellings(label: &str, value: &[u8], text: bool) -> Vec<Needle> {
    let mut out = vec![
        (format!("{label}, raw"), value.to_vec()),
        (format!("{label}, hex"), hex(value, false).into_bytes()),
        (format!("{label}, HEX"), hex(value, true).into_bytes()),
    ];
    for (name, engine) in [
        ("base64", &STANDARD_NO_PAD),
        ("base64url", &URL_SAFE_NO_PAD),
    ] {
        for shift in 0..3 {
            let mut shifted = vec![0u8; shift];
            shifted.extend_from_slice(value);
            let encoded = engine.encode(&shifted);
            let (start, end) = ((8 * shift).div_ceil(6), 8 * (shift + value.len()) / 6);
            out.push((
                format!("{label}, {name} at offset {shift}"),
                encoded.as_bytes()[start..end].to_vec(),
            ));
        }
    }
    if !text {
        // As a Rust `Debug` print of the bytes shows them, plain and pretty.
        out.push((
            format!("{label}, Debug of the bytes"),
            format!("{value:?}").into_bytes(),
        ));
        out.push((
            format!("{label}, Debug of the bytes, pretty"),
            format!("{value:#?}").into_bytes(),
        ));
    }
    if text {
        let units: Vec<u16> = String::from_utf8_lossy(value).encode_utf16().collect();
        out.push((
            format!("{label}, UTF-16LE"),
            units.iter().flat_map(|u| u.to_le_bytes()).collect(),
        ));
        out.push((
            format!("{label}, UTF-16BE"),
            units.iter().flat_map(|u| u.to_be_bytes()).collect(),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    out.into_iter()
        .filter(|(_, bytes)| seen.insert(bytes.clone()))
        .map(|(label, bytes)| Needle { label, bytes })
        .collect()
}

/// Finds every needle in a byte string in one pass: positions are screened by their first two
/// bytes, then by their first eight, before a whole needle is compared.
struct Scanner {
    needles: Vec<Needle>,
    pairs: Vec<bool>,
    heads: HashMap<[u8; 8], Vec<usize>>,
}

impl Scanner {
    fn new(needles: Vec<Needle>) -> Scanner {
        let mut pairs = vec![false; 1 << 16];
        let mut heads: HashMap<[u8; 8], Vec<usize>> = HashMap::new();
        for (i, n) in needles.iter().enumerate() {
            assert!(n.bytes.len() >= 16, "{} is too short to look for", n.label);
            pairs[usize::from(u16::from_le_bytes([n.bytes[0], n.bytes[1]]))] = true;
            heads
                .entry(n.bytes[..8].try_into().unwrap())
                .or_default()
                .push(i);
        }
        Scanner {
            needles,
            pairs,
            heads,
        }
    }

    /// `(offset, needle)` of every occurrence.
    fn find(&self, hay: &[u8]) -> Vec<(usize, usize)> {
        let mut hits = Vec::new();
        for at in 0..hay.len().saturating_sub(7) {
            if !self.pairs[usize::from(u16::from_le_bytes([hay[at], hay[at + 1]]))] {
                continue;
            }
            let Some(ids) = self.heads.get(&hay[at..at + 8]) else {
                continue;
            };
            for &id in ids {
                if hay[at..].starts_with(&self.needles[id].bytes) {
                    hits.push((at, id));
                }
            }
        }
        hits
    }
}

/// What the scan read, and what it found.
#[derive(Default)]
struct Scan {
    /// `(pass, name, bytes)` of everything read.
    read: Vec<(String, String, usize)>,
    /// Not regular files, so not read (the socket).
    skipped: Vec<String>,
    /// `(pass, name, offset, what, the text around it with every secret masked)`.
    leaks: Vec<(String, String, usize, String, String)>,
}

impl Scan {
    fn bytes(&mut self, scanner: &Scanner, pass: &str, name: &str, bytes: &[u8]) {
        self.read
            .push((pass.to_owned(), name.to_owned(), bytes.len()));
        let hits = scanner.find(bytes);
        // What a failure shows: the text around each hit, with every hit in the file masked.
        let mut masked = bytes.to_vec();
        for &(at, id) in &hits {
            masked[at..at + scanner.needles[id].bytes.len()].fill(b'#');
        }
        for (at, id) in hits {
            let around = &masked[at.saturating_sub(160)..(at + 200).min(masked.len())];
            self.leaks.push((
                pass.to_owned(),
                name.to_owned(),
                at,
                scanner.needles[id].label.clone(),
                String::from_utf8_lossy(around).into_owned(),
            ));
        }
    }

    fn file(&mut self, scanner: &Scanner, pass: &str, name: &str, path: &Path) {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        self.bytes(scanner, pass, name, &bytes);
    }

    /// Every file under `root`, named relative to it.
    fn tree(&mut self, scanner: &Scanner, pass: &str, root: &Path) {
        for path in files_under(root) {
            let name = path.strip_prefix(root).unwrap().display().to_string();
            let kind = std::fs::symlink_metadata(&path).unwrap().file_type();
            if kind.is_file() {
                self.file(scanner, pass, &name, &path);
            } else {
                let what = if kind.is_socket() {
                    "socket"
                } else if kind.is_symlink() {
                    "symlink"
                } else {
                    "not a regular file"
                };
                self.skipped.push(format!("{pass}: {name} ({what})"));
            }
        }
    }

    fn read_in(&self, pass: &str, name: &str) -> bool {
        self.read.iter().any(|(p, n, _)| p == pass && n == name)
    }
}

/// The child of `parent` whose command line names `arg` (the upstream the desk started, by its
/// own log file's path; the gateway names it too, but is not the desk's child).
fn child_with_arg(parent: i32, arg: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let ppid: i32 = stat.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        (ppid == parent && cmdline.split(|b| *b == 0).any(|a| a == arg.as_bytes())).then_some(pid)
    })
}

/// Removes the desk's directory (kept past the desk so it can be read after it stopped).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `Debug` prints (plain and pretty) of every socket-protocol type carrying this session's
/// values, and of the types that hold the secret and the tokens.
fn debug_prints(
    reach: &Reach,
    tokens: &[String],
    preflights: &[CallToolResult],
    confirms: &[Value],
    credential: &str,
    secrets: &[&HmacSecret],
    keychain: &KeychainStore,
) -> Vec<(String, String)> {
    let out = std::cell::RefCell::new(Vec::new());
    let add = |label: &str, value: &dyn std::fmt::Debug| {
        let mut out = out.borrow_mut();
        out.push((format!("{label} {{:?}}"), format!("{value:?}")));
        out.push((format!("{label} {{:#?}}"), format!("{value:#?}")));
    };
    let hello = Hello::Gateway {
        version: PROTOCOL_VERSION,
        reach: reach.clone(),
        label: Some("secrets-agent".into()),
        wait_ms: Some(40_000),
        pid: std::process::id(),
        stdio: false,
    };
    add("Reach::Command", reach);
    add("Hello::Gateway", &hello);
    add("Frame::Hello", &Frame::Hello(hello.clone()));
    add("Frame::Hello(Focus)", &Frame::Hello(Hello::focus(Some(7))));
    let accepted = Welcome::Accepted {
        version: PROTOCOL_VERSION,
        tenant: "t-1".into(),
        stdio: false,
    };
    add("Welcome::Accepted", &accepted);
    // The registry's requests and answers carry credentials and client config backups.
    let spec: countersign_wire::ServerSpec = serde_json::from_value(
        json!({"command": ["server"], "env": {"UPSTREAM_API_KEY": {"secret": true}}}),
    )
    .unwrap();
    let put = countersign_wire::RegistryRequest::Put {
        name: "upstream".into(),
        spec,
        secrets: [(
            "UPSTREAM_API_KEY".to_owned(),
            countersign_wire::SecretText::new(credential.to_owned()),
        )]
        .into(),
    };
    add("RegistryRequest::Put", &put);
    add(
        "Frame::Hello(Registry)",
        &Frame::Hello(Hello::Registry {
            version: PROTOCOL_VERSION,
            request: put.clone(),
        }),
    );
    let backup = countersign_wire::RegistryAnswer::Backup {
        text: Some(countersign_wire::SecretText::new(format!(
            "{{\"env\": {{\"UPSTREAM_API_KEY\": \"{credential}\"}}}}"
        ))),
    };
    add("Frame::Registry(Backup)", &Frame::Registry(backup));
    add("Frame::Welcome", &Frame::Welcome(accepted));
    for code in [
        RefusedCode::VersionMismatch,
        RefusedCode::NoSuchServer,
        RefusedCode::BadHello,
        RefusedCode::UpstreamFailed,
        RefusedCode::AccountNotAllowed,
        RefusedCode::Busy,
    ] {
        let refused = Welcome::Refused {
            code,
            message: "the upstream did not initialize: connection closed".into(),
        };
        add(
            &format!("Frame::Welcome(Refused {})", code.code()),
            &Frame::Welcome(refused),
        );
    }
    // The agent's messages as they cross the socket: each confirm, and each approved preflight's
    // answer.
    for (i, arguments) in confirms.iter().enumerate() {
        let message = json!({"jsonrpc": "2.0", "id": i + 10, "method": "tools/call",
                             "params": {"name": "write", "arguments": arguments}});
        add(
            &format!("Frame::Mcp(confirm {i})"),
            &Frame::Mcp(serde_json::to_vec(&message).unwrap()),
        );
    }
    for (i, preflight) in preflights.iter().enumerate() {
        let message = json!({"jsonrpc": "2.0", "id": i + 1, "result": preflight});
        add(
            &format!("Frame::Mcp(approved preflight {i})"),
            &Frame::Mcp(serde_json::to_vec(&message).unwrap()),
        );
    }
    add(
        "Frame::Stderr",
        &Frame::Stderr(format!("UPSTREAM_API_KEY={credential}\n").into_bytes()),
    );
    // Hellos that do not parse (a gateway of another version): the error says why, not what.
    let encoded = countersign_wire::encode(&Frame::Hello(hello)).unwrap();
    let body = &encoded[4..];
    let errors: Vec<FrameError> = vec![
        countersign_wire::decode(&body[..body.len() - 3]).unwrap_err(),
        countersign_wire::decode(
            format!(
                r#"H{{"type":"gateway","version":2,"reach":{{"kind":"command","argv":["x"],"cwd":"/","env":{{"UPSTREAM_API_KEY":"{credential}"}}}},"label":null,"wait_ms":null,"pid":1}}"#
            )
            .as_bytes(),
        )
        .unwrap_err(),
        countersign_wire::decode(
            format!(
                r#"H{{"type":"gateway","version":2,"reach":{{"kind":"registry","env":[["UPSTREAM_API_KEY","{credential}"]]}},"label":null,"wait_ms":null,"pid":1}}"#
            )
            .as_bytes(),
        )
        .unwrap_err(),
    ];
    for (i, e) in errors.iter().enumerate() {
        add(&format!("FrameError {i}"), e);
        out.borrow_mut()
            .push((format!("FrameError {i} Display"), e.to_string()));
    }
    for (i, secret) in secrets.iter().enumerate() {
        add(&format!("HmacSecret {i}"), secret);
        add(&format!("SigningKey {i}"), &secret.signing_key());
        for (j, text) in tokens.iter().enumerate() {
            if let Ok(claims) = token::decode(&secret.signing_key(), text) {
                let minted = token::mint(&secret.signing_key(), &claims);
                assert_eq!(minted.expose(), text, "token {j} re-mints from its claims");
                add(&format!("Token {j}"), &minted);
            }
        }
    }
    add("KeychainStore", keychain);
    for (i, preflight) in preflights.iter().enumerate() {
        let s = preflight.structured_content.as_ref().unwrap();
        let text: String = preflight
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect();
        let answer = countersign_engine::Approved {
            text,
            next_step: s["nextStep"].as_str().unwrap().to_owned(),
            action: s["action"].as_str().unwrap().to_owned(),
            summary: s["summary"].as_str().unwrap().to_owned(),
            reversible: s["reversible"].as_bool().unwrap(),
            expires_in: s["expiresIn"].as_str().unwrap().to_owned(),
            token: tokens[i].clone(),
            target: s["confirmTarget"].as_str().unwrap().to_owned(),
            expires_at_ms: 0,
            class: countersign_core::GateClass::Once,
        };
        add(&format!("engine Approved {i}"), &answer);
    }
    out.into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secret_tokens_and_an_upstream_credential_reach_no_file_no_stderr_and_no_debug_print() {
    // The keychain entry the desk reads at start; made first if there is none, as the desk would,
    // so that no other desk starting now can write a different one under it.
    let keychain = KeychainStore::open_default()
        .expect("the OS keychain: run this test under .ci/with-keychain");
    keychain.load_or_create().expect("the desk's secret");

    // Everything the desk writes goes under its directory: its own files, and through HOME,
    // XDG_* and TMPDIR whatever WebKit, GTK and the rest write for it.
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let xdg = [
        ("XDG_DATA_HOME", home.join(".local/share")),
        ("XDG_CONFIG_HOME", home.join(".config")),
        ("XDG_CACHE_HOME", home.join(".cache")),
        ("XDG_STATE_HOME", home.join(".local/state")),
        ("TMPDIR", home.join("tmp")),
    ];
    for (_, path) in &xdg {
        std::fs::create_dir_all(path).unwrap();
    }
    let captured = tempfile::tempdir().unwrap();
    let desk_stderr = captured.path().join("desk.stderr");
    let gateway_stderr = captured.path().join("gateway.stderr");
    let upstream = tempfile::tempdir().unwrap();
    let upstream_log = upstream.path().join("calls.jsonl");

    // A screen of its own. Two desk windows on one screen (no window manager: both at +0+0)
    // interfere: run beside a desk test on the shared screen, one or the other waited for Approve
    // to be enabled until it timed out (3 runs in 3; none in 4 on a screen of its own).
    let display = OwnDisplay::start();
    let mut env: Vec<(&str, &str)> = vec![
        ("RUST_LOG", RUST_LOG),
        ("HOME", home.to_str().unwrap()),
        ("DISPLAY", &display.name),
    ];
    env.extend(xdg.iter().map(|(k, v)| (*k, v.to_str().unwrap())));
    let mut desk =
        Desk::start_recording(dir, &env, std::fs::File::create(&desk_stderr).unwrap()).await;
    desk.dir.disable_cleanup(true);
    let root = desk.dir.path().to_owned();
    let _remove = RemoveOnDrop(root.clone());
    let desk_pid = desk_process::pid_at(&desk.socket()).await;

    // The agent, whose client gave the gateway an upstream credential.
    let credential = format!("sk-live-{}", hex(&random::<16>(), false));
    let agent_cwd = root.join("agent");
    std::fs::create_dir_all(&agent_cwd).unwrap();
    let server = obedient_server();
    let argv = [
        "python3",
        server.to_str().unwrap(),
        upstream_log.to_str().unwrap(),
    ];
    let gateway_env = [
        ("UPSTREAM_API_KEY", credential.as_str()),
        ("RUST_LOG", RUST_LOG),
    ];
    let agent = desk
        .agent_command(
            "secrets-agent",
            &argv,
            &gateway_env,
            &agent_cwd,
            std::fs::File::create(&gateway_stderr).unwrap(),
        )
        .await;
    let tools = agent.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "write"), "{tools:?}");
    // The credential reached the upstream, through the hello and the desk.
    let upstream_pid = child_with_arg(desk_pid, upstream_log.to_str().unwrap())
        .expect("the upstream runs as the desk's child, its log file on its command line");
    let environ = std::fs::read(format!("/proc/{upstream_pid}/environ")).unwrap();
    assert!(
        environ
            .split(|b| *b == 0)
            .any(|v| v == format!("UPSTREAM_API_KEY={credential}").as_bytes()),
        "the upstream was not given UPSTREAM_API_KEY from the gateway's environment"
    );

    // An open call.
    let read = call(&agent, "read", &json!({"path": "notes.txt"}))
        .await
        .unwrap();
    assert_ne!(read.is_error, Some(true), "{}", outline(&read));

    // Approved by a click, confirmed, replayed.
    let first = json!({"path": "notes.txt", "text": "first"});
    let p1 = approved(&desk, &agent, &first).await;
    let c1 = confirm_of(&p1, first);
    let done = call(&agent, "write", &c1).await.unwrap();
    assert_ne!(done.is_error, Some(true), "{}", outline(&done));
    let replay = call(&agent, "write", &c1).await.unwrap();
    assert_eq!(refusal(&replay).as_deref(), Some("already_used"));

    // Denied, with a note.
    let pending = call(
        &agent,
        "write",
        &json!({"path": "notes.txt", "text": "denied"}),
    );
    desk.wait_for_request().await;
    desk.set_value("#deny-note", "not this one").await;
    desk.click("#deny").await;
    let denied = pending.await.unwrap();
    assert_eq!(refusal(&denied).as_deref(), Some("denied"));
    desk.until("the denied request to leave the window", |d| {
        Box::pin(async move { !d.visible_request().await })
    })
    .await;

    // Approved and not used before the rotation.
    let second = json!({"path": "notes.txt", "text": "second"});
    let p2 = approved(&desk, &agent, &second).await;
    let c2 = confirm_of(&p2, second);

    // The secret the desk signed with: the keychain's, as the tokens it minted prove.
    let old = keychain
        .load()
        .unwrap()
        .expect("the desk's secret in the keychain");
    let old_key: SigningKey = old.signing_key();
    let (t1, t2) = (token_of(&p1), token_of(&p2));
    for (i, t) in [&t1, &t2].into_iter().enumerate() {
        assert!(
            token::decode(&old_key, t).is_ok(),
            "token {i} does not verify with the keychain's secret: the desk signs with another"
        );
    }

    // Settings saved, then the secret rotated, from the settings view.
    desk.click("#tab-settings").await;
    desk.until("the settings to load", |d| {
        Box::pin(async move {
            let v: Value = d
                .browser()
                .execute("return document.getElementById('s-minutes').value", vec![])
                .await
                .unwrap();
            v.as_str().is_some_and(|s| !s.is_empty())
        })
    })
    .await;
    desk.click("#s-save").await;
    desk.until("the settings to be saved", |d| {
        Box::pin(async move { d.text("#s-saved").await == "Saved." })
    })
    .await;
    desk.click("#s-rotate").await;
    desk.click("#s-rotate-now").await;
    desk.until("the rotation", |d| {
        Box::pin(async move { d.text("#s-error").await.starts_with("Rotated.") })
    })
    .await;
    desk.click("#tab-queue").await;
    let new = keychain.load().unwrap().expect("the rotated secret");
    assert!(new != old, "the rotation changed the keychain's secret");

    // The unused token died with the old secret.
    let dead = call(&agent, "write", &c2).await.unwrap();
    assert_eq!(
        refusal(&dead).as_deref(),
        Some("bad_token"),
        "{}",
        outline(&dead)
    );

    // Approved under the new secret; a changed plan refused, then the approved one confirmed.
    let third = json!({"path": "notes.txt", "text": "third"});
    let p3 = approved(&desk, &agent, &third).await;
    let t3 = token_of(&p3);
    assert!(
        token::decode(&new.signing_key(), &t3).is_ok(),
        "a token minted after the rotation verifies with the keychain's new secret"
    );
    assert!(token::decode(&new.signing_key(), &t1).is_err());
    let mut changed = confirm_of(&p3, third.clone());
    changed["text"] = json!("something else");
    let changed = call(&agent, "write", &changed).await.unwrap();
    assert_eq!(
        refusal(&changed).as_deref(),
        Some("plan_changed"),
        "{}",
        outline(&changed)
    );
    let c3 = confirm_of(&p3, third);
    let done = call(&agent, "write", &c3).await.unwrap();
    assert_ne!(done.is_error, Some(true), "{}", outline(&done));
    agent.cancel().await.unwrap();

    // What must appear nowhere.
    let tokens = [t1, t2, t3];
    let mut needles = Vec::new();
    for (name, secret) in [("the old secret", &old), ("the new secret", &new)] {
        needles.extend(spellings(name, secret.expose_bytes(), false));
    }
    let mut nonces = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let claims = token::decode(&old_key, t)
            .or_else(|_| token::decode(&new.signing_key(), t))
            .unwrap();
        nonces.push(claims.nonce.to_hex());
        needles.extend(spellings(&format!("token {i}"), t.as_bytes(), true));
        let tag_text = t.rsplit('.').next().unwrap();
        needles.extend(spellings(
            &format!("token {i}'s signature as it is written"),
            tag_text.as_bytes(),
            true,
        ));
        let tag = URL_SAFE_NO_PAD.decode(tag_text).unwrap();
        needles.extend(spellings(&format!("token {i}'s signature"), &tag, false));
    }
    // The desk sends the upstream what was approved, never a token or the secret: its call log
    // (which is its own, so not part of the scan below) is checked for those alone.
    let ours = Scanner::new(needles.clone());
    let sent = std::fs::read(&upstream_log).unwrap();
    let sent_leaks: Vec<&str> = ours
        .find(&sent)
        .iter()
        .map(|&(_, id)| ours.needles[id].label.as_str())
        .collect();
    assert!(
        sent_leaks.is_empty(),
        "the upstream was sent {sent_leaks:?}"
    );
    let ran: Vec<String> = String::from_utf8_lossy(&sent)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|call| call["method"] == "tools/call" && call["params"]["name"] == "write")
        .map(|call| {
            call["params"]["arguments"]["text"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        ran,
        ["first", "third"],
        "the upstream ran what was approved, once each"
    );
    needles.extend(spellings(
        "the upstream credential",
        credential.as_bytes(),
        true,
    ));
    let count = needles.len();
    let scanner = Scanner::new(needles);

    // The scanner finds each spelling in the middle of other bytes.
    for (i, n) in scanner.needles.iter().enumerate() {
        let mut hay = b"..xx".repeat(9);
        hay.extend_from_slice(&n.bytes);
        hay.extend_from_slice(b"yy..");
        assert!(
            scanner
                .find(&hay)
                .iter()
                .any(|&(at, id)| id == i && at == 36),
            "the scan misses {}",
            n.label
        );
    }

    // The Debug prints.
    let mut reach_env: Vec<(String, String)> = std::env::vars().collect();
    reach_env.extend(
        gateway_env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    let reach = Reach::Command {
        argv: argv.iter().map(|a| a.to_string()).collect(),
        cwd: agent_cwd.display().to_string(),
        env: reach_env,
    };
    let mut scan = Scan::default();
    let prints = debug_prints(
        &reach,
        &tokens,
        &[p1, p2, p3],
        &[c1, c2, c3],
        &credential,
        &[&old, &new],
        &keychain,
    );
    for (label, text) in &prints {
        scan.bytes(&scanner, "Debug", label, text.as_bytes());
    }

    // Every file, while the desk runs; the stderr of both.
    scan.tree(&scanner, "desk running", &root);
    scan.file(
        &scanner,
        "desk running",
        "(the gateway's stderr)",
        &gateway_stderr,
    );
    scan.file(
        &scanner,
        "desk running",
        "(the desk's stderr)",
        &desk_stderr,
    );

    // Again once the desk has stopped; then the database after a checkpoint.
    desk.stop().await;
    assert!(
        tokio::time::timeout(
            Duration::from_secs(10),
            countersign_tests::group::exited(desk_pid as u32)
        )
        .await
        .is_ok(),
        "the desk did not stop"
    );
    scan.tree(&scanner, "desk stopped", &root);
    scan.file(
        &scanner,
        "desk stopped",
        "(the desk's stderr)",
        &desk_stderr,
    );
    scan.file(
        &scanner,
        "desk stopped",
        "(the gateway's stderr)",
        &gateway_stderr,
    );
    let db = root.join("data/desk.sqlite");
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        let (busy, _, _): (i64, i64, i64) = conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap();
        assert_eq!(busy, 0, "the checkpoint completed");
    }
    scan.file(&scanner, "checkpointed", "data/desk.sqlite", &db);

    // What was read.
    println!(
        "looked for {count} spellings of 2 secrets, {} tokens (whole and signature) and 1 \
         upstream credential; not scanned: {} (the upstream's own call log)",
        tokens.len(),
        upstream_log.display()
    );
    for (pass, name, size) in &scan.read {
        println!("scanned [{pass}] {name}: {size} bytes");
    }
    for skipped in &scan.skipped {
        println!("not a file, not read: {skipped}");
    }

    // The scan covered what matters, and read this session's records.
    for name in [
        "data/desk.sqlite",
        "data/desk.sqlite-wal",
        "data/desk.sqlite-shm",
        "state/desk.log",
        "config/settings.json",
        "config/policy.toml",
    ] {
        assert!(scan.read_in("desk running", name), "{name} was not scanned");
    }
    assert!(scan.read_in("checkpointed", "data/desk.sqlite"));
    let records = std::fs::read(&db).unwrap();
    for (i, nonce) in nonces.iter().enumerate() {
        assert!(
            Scanner::new(spellings("nonce", nonce.as_bytes(), false))
                .find(&records)
                .iter()
                .any(|&(_, id)| id == 0),
            "token {i}'s nonce is not in the checkpointed database: the scan did not read this \
             session"
        );
    }
    let log = std::fs::read_to_string(root.join("state/desk.log")).unwrap();
    assert!(
        log.contains("gateway connected") && log.contains("secret rotated"),
        "the log holds this session"
    );
    let stderr = std::fs::read_to_string(&desk_stderr).unwrap();
    assert!(
        stderr.contains("secret rotated"),
        "the desk's stderr was captured"
    );

    assert!(
        scan.leaks.is_empty(),
        "found:\n{}",
        scan.leaks
            .iter()
            .map(|(pass, name, at, what, around)| format!(
                "  [{pass}] {name} at byte {at}: {what}, in (masked #): {around:?}"
            ))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
