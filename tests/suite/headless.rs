//! The desk where there is no display (a server, a container, an SSH session): it runs without a
//! window, as `countersign-headless-desk` (which maps no GUI toolkit), open tools work through it, and every gated call is refused `desk_unavailable` with the
//! next move, because nobody could approve it. A gateway with no display starts the desk that way,
//! in the account's own directories whatever the agent's environment says, and starts none for a
//! socket the environment chose. The desk logs to a file in its state directory, keeps its
//! directories 0700, and refuses a socket directory that someone else controls.
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use std::os::unix::fs::PermissionsExt;

use countersign_tests::account::{Account, files_under, is_root};
use countersign_tests::desk_process;
use countersign_tests::window::bin;
use rmcp::model::*;
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

/// The environment of a desk or gateway with no display, in its own directories.
fn headless(cmd: &mut tokio::process::Command, dir: &Path) {
    cmd.env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .env("COUNTERSIGN_DESK_DIR", dir)
        .env("COUNTERSIGN_SOCKET", dir.join("desk.sock"))
        .env("RUST_LOG", "warn");
}

/// A desk with no display, an in-memory secret and its files in `dir`, once its socket answers.
async fn start_desk(dir: &Path) -> tokio::process::Child {
    let mut desk = tokio::process::Command::new(bin("countersign-desk"));
    desk.arg("--in-memory-secret")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    headless(&mut desk, dir);
    let desk = desk.spawn().unwrap();
    desk_process::wait_for_socket(&dir.join("desk.sock")).await;
    desk
}

async fn agent(dir: &Path, launch: bool) -> RunningService<RoleClient, ClientConfig> {
    let mut cmd = tokio::process::Command::new(bin("countersign"));
    cmd.arg("mcp").arg("--db").arg(dir.join("app.sqlite"));
    if !launch {
        cmd.arg("--no-launch");
    }
    headless(&mut cmd, dir);
    let info = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("headless-agent", "1.0"),
    );
    info.serve(TokioChildProcess::new(cmd).unwrap())
        .await
        .unwrap()
}

async fn call(
    agent: &RunningService<RoleClient, ClientConfig>,
    tool: &str,
    args: Value,
) -> CallToolResult {
    agent
        .call_tool(
            CallToolRequestParams::new(tool.to_owned())
                .with_arguments(args.as_object().unwrap().clone()),
        )
        .await
        .unwrap()
}

/// Open calls work and a gated call is refused `desk_unavailable`, saying what to do.
async fn open_works_and_gated_is_refused(agent: &RunningService<RoleClient, ClientConfig>) {
    assert_eq!(agent.list_all_tools().await.unwrap().len(), 7);
    let r = call(agent, "query", json!({"sql": "SELECT 6 * 7 AS answer"})).await;
    assert_eq!(
        r.structured_content.unwrap()["rows"],
        json!([{"answer": 42}])
    );
    let r = call(agent, "execute", json!({"sql": "CREATE TABLE t (x)"})).await;
    assert_eq!(r.is_error, Some(true), "{r:?}");
    let s = r.structured_content.clone().unwrap();
    assert_eq!(s["refusal"], json!("desk_unavailable"), "{r:?}");
    assert!(
        s["message"].as_str().unwrap().contains("desktop session"),
        "{r:?}"
    );
    // Nothing ran: the table does not exist.
    let r = call(agent, "list_tables", json!({})).await;
    assert!(
        !format!("{:?}", r.structured_content).contains("\"t\""),
        "{r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_desk_without_a_display_serves_open_tools_and_refuses_gated_calls() {
    let dir = tempfile::tempdir().unwrap();
    let desk = start_desk(dir.path()).await;
    // What answers is the same process, now `countersign-headless-desk`: no GUI toolkit mapped.
    let pid = desk.id().unwrap() as i32;
    assert_eq!(
        desk_process::pid_at(&dir.path().join("desk.sock")).await,
        pid
    );
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert!(
        exe.ends_with("countersign-headless-desk"),
        "{}",
        exe.display()
    );
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    for toolkit in [
        "libwebkit2gtk",
        "libjavascriptcoregtk",
        "libgtk-3",
        "libgdk-3",
    ] {
        assert!(!maps.contains(toolkit), "{toolkit} is mapped:\n{maps}");
    }
    let agent = agent(dir.path(), false).await;
    open_works_and_gated_is_refused(&agent).await;
    agent.cancel().await.unwrap();
    desk_process::terminate(desk.id().unwrap() as i32);
    let out = desk.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no display"), "{stderr}");
}

/// A desk whose settings name an OpenTelemetry collector sends it every confirm event, as they
/// happen: here a confirm with a forged token, refused (the collector decodes the protobuf).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_desk_sends_its_confirm_events_to_the_collector_of_its_settings() {
    let dir = tempfile::tempdir().unwrap();
    let collector = countersign_tests::otlp::Collector::start().await;
    std::fs::create_dir_all(dir.path().join("config")).unwrap();
    std::fs::write(
        dir.path().join("config/settings.json"),
        serde_json::to_vec(&json!({
            "token_minutes": 10,
            "approve_delay_ms": 1000,
            "otlp_endpoint": collector.endpoint(),
        }))
        .unwrap(),
    )
    .unwrap();
    let desk = start_desk(dir.path()).await;
    let agent = agent(dir.path(), false).await;
    open_works_and_gated_is_refused(&agent).await;
    let forged = call(
        &agent,
        "execute",
        json!({"sql": "CREATE TABLE t (x)", "confirm": true, "confirmTarget": "t",
               "confirmToken": "v1.forged.token"}),
    )
    .await;
    assert_eq!(forged.is_error, Some(true), "{forged:?}");
    let records = collector
        .wait_for(1, std::time::Duration::from_secs(30))
        .await;
    let refused = &records[0];
    assert_eq!(
        countersign_tests::otlp::attribute(refused, "countersign.event").as_deref(),
        Some("refused"),
        "{refused:?}"
    );
    assert_eq!(
        countersign_tests::otlp::attribute(refused, "countersign.code").as_deref(),
        Some("bad_token"),
        "{refused:?}"
    );
    assert_eq!(
        countersign_tests::otlp::attribute(refused, "countersign.tool").as_deref(),
        Some("execute")
    );
    assert_eq!(countersign_tests::otlp::seqs(&records)[0], 1);
    agent.cancel().await.unwrap();
    desk_process::terminate(desk.id().unwrap() as i32);
    desk.wait_with_output().await.unwrap();
}

/// The end-to-end case of "the desk's files are the person's": an agent under a fresh account,
/// with no display, whose environment points `HOME`, every `XDG_*` directory and
/// `COUNTERSIGN_DESK_DIR` at a directory it controls. Its gateway starts the desk, which runs
/// without a window (open tools work, gated calls are `desk_unavailable`) and keeps its database,
/// settings and log in the account's home from the password database; nothing at all is written
/// in the agent's directories.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_starts_the_desk_in_the_accounts_own_home_whatever_the_agents_environment_says() {
    let Some(account) = Account::create("a desk started under a fresh account") else {
        return;
    };
    // The agent's directories: the account's to write, so writing there would succeed.
    let attacker = tempfile::tempdir().unwrap();
    let bait = ["home", "data", "config", "state", "cache", "desk"];
    for sub in bait {
        std::fs::create_dir(attacker.path().join(sub)).unwrap();
    }
    account.give(attacker.path());
    let at = |sub: &str| attacker.path().join(sub);
    let mut cmd = account.command(bin("countersign"));
    cmd.arg("mcp")
        .arg("--db")
        .arg(account.home.join("app.sqlite"))
        .env("HOME", at("home"))
        .env("XDG_DATA_HOME", at("data"))
        .env("XDG_CONFIG_HOME", at("config"))
        .env("XDG_STATE_HOME", at("state"))
        .env("XDG_CACHE_HOME", at("cache"))
        .env("COUNTERSIGN_DESK_DIR", at("desk"))
        .env("RUST_LOG", "warn");
    let info = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("fresh-account-agent", "1.0"),
    );
    let agent = info
        .serve(TokioChildProcess::new(cmd).unwrap())
        .await
        .unwrap();
    open_works_and_gated_is_refused(&agent).await;
    agent.cancel().await.unwrap();

    // The desk this account's gateway computes (no runtime directory: no login session).
    let socket = PathBuf::from(format!("/tmp/countersign-{}/desk.sock", account.uid));
    let pid = desk_process::pid_at(&socket).await;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    // Started for an agent, with nothing to decide: in the tray, no window until a request.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    assert!(
        args.contains(&countersign_wire::DESK_IN_TRAY.as_bytes()),
        "{:?}",
        String::from_utf8_lossy(&cmdline)
    );
    desk_process::terminate(pid);
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.contains(&account.uid.to_string())),
        "the desk runs as the account: {status}"
    );
    let home = &account.home;
    let logged = std::fs::read_to_string(home.join(".local/state/countersign/desk.log")).unwrap();
    let start = logged.lines().find(|l| l.contains("starting")).unwrap();
    assert!(
        start.contains(&format!(
            "data={}",
            home.join(".local/share/countersign").display()
        )),
        "{start}"
    );
    for dir in [
        ".config/countersign",
        ".local/share/countersign",
        ".local/state/countersign",
    ] {
        let mode = std::fs::metadata(home.join(dir))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o700, "{dir}");
    }
    let written = files_under(attacker.path());
    assert!(
        written.is_empty(),
        "the desk wrote in the agent's directories: {written:?}"
    );
}

/// A gateway told (by the environment or a flag) to use a socket where no desk answers starts
/// none, since a desk it started would listen at the default socket, and says how to start one
/// there.
#[test]
fn a_gateway_whose_socket_was_chosen_starts_no_desk_and_says_how_to() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("desk.sock");
    for (how, flag) in [("env", false), ("flag", true)] {
        let mut cmd = std::process::Command::new(bin("countersign"));
        cmd.arg("mcp")
            .arg("--db")
            .arg(dir.path().join("app.sqlite"))
            .env("RUST_LOG", "warn")
            .env_remove("DISPLAY")
            .stdin(Stdio::null());
        if flag {
            cmd.arg("--socket").arg(&socket);
        } else {
            cmd.env("COUNTERSIGN_SOCKET", &socket);
        }
        let started = Instant::now();
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{how}: {stderr}");
        assert!(
            stderr.contains("the Countersign desk is not running at")
                && stderr.contains(&socket.display().to_string())
                && stderr.contains(&format!(
                    "COUNTERSIGN_SOCKET={} countersign-desk",
                    socket.display()
                )),
            "{how}: {stderr}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{how}: it waited for a desk to start"
        );
        assert!(!socket.exists(), "{how}: a desk listens there");
    }
}

/// The log file in the state directory has the desk's start line even when `RUST_LOG` keeps
/// stderr quiet (a desk a gateway started has no stderr anyone reads); the desk's directories
/// are 0700.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_desk_writes_its_start_line_to_the_log_in_its_state_dir() {
    let dir = tempfile::tempdir().unwrap();
    let mut desk = tokio::process::Command::new(bin("countersign-desk"));
    desk.arg("--in-memory-secret")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    headless(&mut desk, dir.path());
    let desk = desk.spawn().unwrap();
    let socket = dir.path().join("desk.sock");
    desk_process::wait_for_socket(&socket).await;
    let log = dir.path().join("state/desk.log");
    let logged = std::fs::read_to_string(&log).unwrap();
    let start = logged
        .lines()
        .find(|l| l.contains("starting"))
        .unwrap_or_else(|| panic!("no start line in {}: {logged}", log.display()));
    assert!(
        start.contains(&format!("pid={}", desk.id().unwrap())),
        "{start}"
    );
    assert!(logged.contains("listening"), "{logged}");
    assert!(!logged.contains("\x1b["), "no terminal colours in the file");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    for sub in ["config", "data", "state"] {
        assert_eq!(mode(&dir.path().join(sub)), 0o700, "{sub}");
    }
    assert_eq!(mode(&log), 0o600);
    desk_process::terminate(desk.id().unwrap() as i32);
}

/// The socket's directory may be in the shared temporary directory (`/tmp/countersign-<uid>`,
/// where there is no per-user runtime directory): a desk refuses one that other accounts can
/// write into or that another account owns, and says why, instead of listening where someone
/// else could replace its socket. Here the desk's socket is pointed into such a directory; the
/// check is the same one the fallback path goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_desk_refuses_a_socket_directory_someone_else_controls() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("countersign-shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let run = |expect: &str| {
        let out = std::process::Command::new(bin("countersign-desk"))
            .arg("--in-memory-secret")
            .env_remove("DISPLAY")
            .env_remove("WAYLAND_DISPLAY")
            .env("COUNTERSIGN_DESK_DIR", dir.path())
            .env("COUNTERSIGN_SOCKET", shared.join("desk.sock"))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("refusing the socket directory") && stderr.contains(expect),
            "{stderr}"
        );
        assert!(!shared.join("desk.sock").exists());
    };
    run("its mode 0777 lets other accounts write into it");
    if !is_root() {
        println!("skipped the other account's directory: giving it away needs root");
        return;
    }
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&shared, Some(65534), Some(65534)).unwrap();
    run("it belongs to uid 65534");
}

/// The window's program takes its channel only from the desk that started it: started by anyone
/// else with descriptor 3 open on something (nothing, a file, a socket whose other end another
/// process holds), it refuses it before reading a byte and exits 2, without a window. It needs
/// no display to say so: the check comes before GTK.
#[test]
fn the_windows_program_refuses_a_channel_that_is_not_its_parent_desks() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;

    let window = |fd3: Option<i32>, through_a_shell: bool| {
        let mut cmd = if through_a_shell {
            // A shell between: the program's parent is the shell, the socket's peer this test.
            let mut sh = std::process::Command::new("sh");
            sh.arg("-c").arg(format!(
                "{} --window-of-desk; exit $?",
                bin("countersign-desk").display()
            ));
            sh
        } else {
            let mut cmd = std::process::Command::new(bin("countersign-desk"));
            cmd.arg("--window-of-desk");
            cmd
        };
        cmd.env_remove("DISPLAY")
            .env_remove("WAYLAND_DISPLAY")
            .stdin(Stdio::null());
        if let Some(fd) = fd3 {
            // SAFETY: dup2 between fork and exec, async-signal-safe.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::dup2(fd, 3) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = window(None, false);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("not the desk's channel"), "{stderr}");
    let file = tempfile::tempfile().unwrap();
    let (code, stderr) = window(Some(file.as_raw_fd()), false);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("not the desk's channel"), "{stderr}");
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let (code, stderr) = window(Some(theirs.as_raw_fd()), true);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("not the desk that started this window"),
        "{stderr}"
    );
    // Nothing was read from it, and nothing written.
    ours.set_nonblocking(true).unwrap();
    drop(theirs);
    let mut buf = [0u8; 16];
    assert_eq!(std::io::Read::read(&mut &ours, &mut buf).unwrap(), 0);
}

/// Issue 32, rules over arguments through the real gateway and a real MCP client: the desk's
/// `policy.cedar` (found at its first start) opens a single `CREATE TABLE notes` or `INSERT INTO
/// notes`, which run with no window and no token; forbids `DROP` and deleting backups outright
/// with the rule's reason; refuses a call carrying an argument the rules cannot see; and leaves
/// every other write to a person (here: nobody to ask, so `desk_unavailable`). Nothing refused
/// ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rules_over_arguments_open_forbid_and_gate_each_call_by_what_it_carries() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("config")).unwrap();
    std::fs::write(
        dir.path().join("config/policy.cedar"),
        r#"
        @class("open")
        permit (principal, action == Countersign::Action::"execute", resource)
        when {
          (context.arguments.sql like "CREATE TABLE notes *" || context.arguments.sql like "INSERT INTO notes *")
          && !(context.arguments.sql like "*;*")
        };
        @reason("nobody drops tables from an agent")
        forbid (principal, action == Countersign::Action::"execute", resource)
        when { context.arguments.sql like "*DROP*" };
        @reason("backups are deleted by people only")
        forbid (principal, action == Countersign::Action::"delete_backup", resource);
        "#,
    )
    .unwrap();
    let _desk = start_desk(dir.path()).await;
    let agent = agent(dir.path(), false).await;
    let ran = |r: &CallToolResult| r.is_error != Some(true);
    let refusal = |r: &CallToolResult| {
        r.structured_content
            .as_ref()
            .map(|s| s["refusal"].clone())
            .unwrap_or_default()
    };
    let r = call(&agent, "execute", json!({"sql": "CREATE TABLE notes (x)"})).await;
    assert!(ran(&r), "opened by a rule: {r:?}");
    let r = call(
        &agent,
        "execute",
        json!({"sql": "INSERT INTO notes VALUES (1)"}),
    )
    .await;
    assert!(ran(&r), "opened by a rule: {r:?}");
    // A second statement is not the rule's to open, and DROP is forbidden with the reason.
    let r = call(
        &agent,
        "execute",
        json!({"sql": "INSERT INTO notes VALUES (2); DROP TABLE notes"}),
    )
    .await;
    assert_eq!(refusal(&r), json!("policy_forbidden"), "{r:?}");
    assert!(
        format!("{r:?}").contains("nobody drops tables from an agent"),
        "{r:?}"
    );
    let r = call(&agent, "delete_backup", json!({"name": "nightly"})).await;
    assert_eq!(refusal(&r), json!("policy_forbidden"), "{r:?}");
    // What the rules cannot see whole is never opened by them.
    let r = call(
        &agent,
        "execute",
        json!({"sql": "INSERT INTO notes VALUES (3)", "mode": "fast"}),
    )
    .await;
    assert_eq!(refusal(&r), json!("policy_unfit"), "{r:?}");
    // Anything else is a person's to approve, and there is nobody to ask here.
    let r = call(&agent, "execute", json!({"sql": "DELETE FROM notes"})).await;
    assert_eq!(refusal(&r), json!("desk_unavailable"), "{r:?}");
    let r = call(
        &agent,
        "query",
        json!({"sql": "SELECT count(*) AS n FROM notes"}),
    )
    .await;
    assert_eq!(
        r.structured_content.unwrap()["rows"],
        json!([{"n": 1}]),
        "only the opened insert ran"
    );
    agent.cancel().await.unwrap();
}
