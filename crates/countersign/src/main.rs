//! `countersign`: the command an agent's MCP configuration launches, and the commands that start
//! or query the desk.
#![allow(unsafe_code)] // this module reaches the OS through libc; each unsafe block says why it is sound

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use countersign::export::{ExportError, Format};
use countersign::{logging, paths};
use countersign_pipe::{self as pipe, launch};
use countersign_store::{HistoryFilter, HistoryReader, StoreOptions};
use countersign_wire::Reach;

/// A human countersignature on every mutating action an AI agent takes through MCP.
///
/// Put `countersign mcp -- <your usual MCP server command>` where your agent's configuration
/// starts an MCP server. The desk starts that server and decides every call: read-only tools pass
/// straight through; every other tool needs a preflight that a person approves in the Countersign
/// desk, then a confirm with the token it returns.
#[derive(Debug, Parser)]
#[command(name = "countersign", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve MCP on stdin/stdout: a pipe to the desk, which reaches the upstream MCP server (or
    /// the built-in tools) and decides every call.
    ///
    /// Examples:
    ///   countersign mcp -- npx -y @modelcontextprotocol/server-filesystem ~/projects
    ///   countersign mcp --name github -- github-mcp-server stdio
    ///   countersign mcp --url https://example.com/mcp
    ///   countersign mcp --db ./app.sqlite          (the built-in SQLite tools)
    ///
    /// The desk starts the upstream command as its own child, with this process's working
    /// directory and environment. stdout carries the protocol; logs and the upstream's stderr go
    /// to stderr (RUST_LOG sets how much).
    ///
    /// A desk is started when none answers at the socket computed from your user id; never for a
    /// socket chosen with --socket, $COUNTERSIGN_SOCKET or --desk-user.
    ///
    /// Exit codes: 0 the agent closed stdin or the session ended; 3 no desk answers and none could
    /// be started; 4 the desk refused (another version, no such server, the upstream failed to
    /// start, an account the desk does not list); 5 the connection to the desk broke.
    #[command(verbatim_doc_comment)]
    Mcp {
        /// A name for this server in the desk's log (a label only: the desk names and keys policy
        /// by what it reaches, never by this name).
        #[arg(long)]
        name: Option<String>,
        /// Seconds a preflight waits for a person before answering `pending` (the desk caps it).
        #[arg(long)]
        wait: Option<u64>,
        /// The SQLite file of the built-in tools (used when no upstream is given).
        #[arg(long)]
        db: Option<PathBuf>,
        /// A server registered in the desk, by name.
        #[arg(long, conflicts_with_all = ["upstream", "db", "url"])]
        server: Option<String>,
        /// The desk's socket (default: computed from your user id; or $COUNTERSIGN_SOCKET).
        #[arg(long)]
        socket: Option<PathBuf>,
        /// The account the desk runs under, by name or uid, when this agent runs under an account
        /// of its own that the desk's settings list (agent_accounts): connects to that desk's
        /// socket for agent accounts, and only to a desk of that account.
        #[arg(long, value_name = "ACCOUNT")]
        desk_user: Option<String>,
        /// Do not start the desk when none is running.
        #[arg(long)]
        no_launch: bool,
        /// Carry every message through this process, as frames on the desk's socket, instead of
        /// handing the agent's stdin and stdout to the desk (Linux, when both are pipes or
        /// sockets), which takes this process off the path of each message. Slower; decides
        /// nothing differently.
        #[arg(long)]
        relay: bool,
        /// Reach the upstream over streamable HTTP at this URL instead of starting a command.
        #[arg(long, conflicts_with_all = ["upstream", "db"])]
        url: Option<String>,
        /// The upstream MCP server's command and arguments, after `--`.
        #[arg(last = true)]
        upstream: Vec<String>,
    },
    /// Start the desk (the window where a person approves), detached.
    Desk {
        /// Arguments passed to the desk.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Open a request in the desk: `countersign open countersign://request/<id>` brings the
    /// desk's window forward showing that request (starting the desk when none runs). It approves
    /// nothing. Anything but exactly such a URL is refused and nothing happens.
    ///
    /// Exit codes: 0 asked; 1 the desk could not be reached or started; 2 not a request URL.
    #[command(verbatim_doc_comment)]
    Open {
        /// countersign://request/<id>
        url: String,
    },
    /// Walk through the whole flow with a scripted sample agent: you approve in the desk's window.
    Demo,
    /// Serve the authority to a team's agents over MCP's streamable HTTP (a program of its own,
    /// `countersign-serve`: `countersign serve --help` shows its options).
    #[command(disable_help_flag = true)]
    Serve {
        /// Passed to `countersign-serve` as they are.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Approve a team server's calls from this desk: `countersign approver enroll URL --ca FILE`
    /// makes the desk's approver key (in the OS keychain) and prints the line the team runs to
    /// register it; `countersign approver list`; `countersign approver forget URL`.
    #[command(disable_help_flag = true)]
    Approver {
        /// Passed to the desk's program as they are.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Print the configuration that puts Countersign in front of a server your agent uses.
    ///
    /// Example: countersign config --client claude-desktop -- npx -y @modelcontextprotocol/server-filesystem ~/projects
    Config {
        /// Which agent's configuration to print.
        #[arg(long, value_enum)]
        client: countersign::config::Client,
        /// The server's name (default: from the command).
        #[arg(long)]
        name: Option<String>,
        /// The server's command and arguments, after `--` (none: the built-in tools).
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Protect a client in one command: register each MCP server of its configuration in the
    /// desk (every environment value and header into the keychain) and rewrite each entry to
    /// `countersign mcp --server NAME`, keeping everything else of the file as it was.
    ///
    /// The original file is kept in the keychain first; `countersign uninstall` puts back the
    /// entries it rewrote.
    ///
    /// Examples:
    ///   countersign install --client claude-desktop --dry-run
    ///   countersign install --all          (every client found on this machine)
    #[command(verbatim_doc_comment)]
    Install {
        /// Which client's configuration.
        #[arg(long, value_enum, required_unless_present = "all")]
        client: Option<countersign_clients::Client>,
        /// Every client whose configuration is found on this machine, each reported in turn
        /// (see `countersign clients`).
        #[arg(long, conflicts_with_all = ["client", "config", "project"])]
        all: bool,
        /// Say what would change, and change nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        file: ConfigFile,
    },
    /// The MCP clients on this machine: for each one found, its configuration file, whether it
    /// is protected, which entries go through Countersign, which `install` would protect, and
    /// which it leaves alone (why, and what to do). Reads only; asks no desk.
    Clients,
    /// Undo `countersign install` of a client's configuration: each entry install rewrote is
    /// put back as it was, byte for byte, and the rest of the file stays as it is now (what the
    /// client wrote since is kept).
    ///
    /// Refused, naming them, when one of those entries was changed since install wrote it. An
    /// install made by an earlier countersign is undone as then: the whole file, when unchanged.
    /// The servers install registered stay registered in the desk (`countersign server remove
    /// NAME` removes one).
    Uninstall {
        /// Which client's configuration.
        #[arg(long, value_enum)]
        client: countersign_clients::Client,
        /// Put the entries back even if one was changed since install wrote it (that change is
        /// lost; the rest of the file is still kept).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        file: ConfigFile,
    },
    /// The servers registered in the desk: list, add, change or remove them. An agent's config
    /// then reaches one with `countersign mcp --server NAME`, and never holds its credentials.
    #[command(subcommand)]
    Server(countersign::server::ServerCommand),
    /// The desk's policy files.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Print the desk's history of approvals, confirms and refusals, newest first; export it;
    /// check its signed chain (`history verify`).
    #[command(args_conflicts_with_subcommands = true)]
    History {
        #[command(subcommand)]
        check: Option<HistoryCheck>,
        /// Print JSON lines instead of a table (the same as `--format json`).
        #[arg(long, conflicts_with = "format")]
        json: bool,
        /// `table` or `json`: the newest events, at most `--limit`, filtered by `--tool`.
        /// `jsonl` or `csv`: an export, every event from `--since` to `--until`, oldest first,
        /// streamed (CSV cells an agent chose that a spreadsheet would run as a formula start
        /// with `'`).
        #[arg(long, value_enum, default_value = "table")]
        format: countersign::export::Format,
        /// Only this tool (table and json).
        #[arg(long)]
        tool: Option<String>,
        /// At most this many events (table and json).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Exports only: events at or after this time (ms since the epoch, RFC 3339, or a day
        /// such as 2026-12-01, UTC).
        #[arg(long, value_parser = countersign::export::parse_time)]
        since: Option<u64>,
        /// Exports only: events before this time (as `--since`).
        #[arg(long, value_parser = countersign::export::parse_time)]
        until: Option<u64>,
        /// The desk's SQLite file (default: the desk's own).
        #[arg(long)]
        db: Option<PathBuf>,
    },
}

/// Checking the history's signed chain.
#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Print a policy.toml's classes, approvers and typed targets as rules over arguments
    /// (policy.cedar) that decide every call as it does. Save them as policy.cedar in the desk's
    /// config directory: the change waits for the person's click, shown as what it widens.
    /// Exit 0 printed, 2 when the file cannot be read or is not a policy.
    ToCedar {
        /// The policy.toml to convert.
        file: std::path::PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum HistoryCheck {
    /// Check that no event of the history was edited, deleted or reordered and that its head is
    /// signed by the desk's key; names the first event that breaks. Exit 0 intact, 1 broken,
    /// 2 when it cannot be read.
    Verify {
        /// An export to check (`history --format jsonl`) instead of the desk's file.
        #[arg(long)]
        file: Option<PathBuf>,
        /// The desk's public key (`ed25519:…`, as `history key` printed it, or a file holding
        /// it). Without it, signatures are checked against the key the history itself names.
        #[arg(long)]
        key: Option<String>,
        /// A head kept from before (what `history head` printed, or an earlier export): the
        /// history must still contain the event it signed. Catches a tail cut off and signed
        /// again. May be given more than once.
        #[arg(long)]
        head: Vec<PathBuf>,
        /// An event seen elsewhere, `SEQ:HASH` (a collector's `countersign.seq` and
        /// `countersign.chain.hash`): the history must still hold it, with that hash. Catches a
        /// tail cut off after the collector received it. May be given more than once.
        #[arg(long)]
        seen: Vec<String>,
        /// The desk's SQLite file (default: the desk's own).
        #[arg(long, conflicts_with = "file")]
        db: Option<PathBuf>,
    },
    /// Print the chain's signed head (one JSON line): keep it, and `verify --head` holds the
    /// history to it later.
    Head {
        /// The desk's SQLite file (default: the desk's own).
        #[arg(long)]
        db: Option<PathBuf>,
    },
    /// Print the desk's public chain key (`ed25519:…`), from the OS keychain: keep it where the
    /// desk's files are not, and give it to `verify --key`.
    Key,
}

/// Which configuration file of a client: the user's (found where the client keeps it), a
/// project's, or one given.
#[derive(Debug, clap::Args)]
struct ConfigFile {
    /// The configuration file (default: the user's, where the client keeps it).
    #[arg(long, value_name = "PATH", conflicts_with = "project")]
    config: Option<PathBuf>,
    /// The project configuration in the current directory (`.mcp.json` for Claude Code,
    /// `.vscode/mcp.json` for VS Code, ...).
    #[arg(long)]
    project: bool,
}

fn main() {
    logging::init();
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Mcp {
            name,
            wait,
            db,
            server,
            socket,
            desk_user,
            no_launch,
            relay,
            url,
            upstream,
        } => {
            let reach = if let Some(name) = server {
                Reach::Server { name }
            } else if let Some(url) = url {
                Reach::Url { url }
            } else if !upstream.is_empty() {
                pipe::command_reach(upstream)
            } else {
                pipe::builtin_reach(&db.unwrap_or_else(paths::builtin_db))
            };
            // SAFETY: getuid has no preconditions and cannot fail.
            let me = unsafe { libc::getuid() };
            let desk_uid = match &desk_user {
                None => me,
                Some(account) => match countersign_wire::account_uid(account) {
                    Ok(Some(uid)) => uid,
                    Ok(None) => {
                        eprintln!("countersign mcp: --desk-user: no account named {account:?}");
                        std::process::exit(2);
                    }
                    Err(e) => {
                        eprintln!("countersign mcp: --desk-user {account:?}: {e}");
                        std::process::exit(2);
                    }
                },
            };
            let (socket, socket_chosen_by) = if let Some(socket) = socket {
                (socket, Some("--socket"))
            } else if let Some(socket) = countersign_wire::socket_override() {
                (socket, Some(countersign_wire::SOCKET_ENV))
            } else if desk_uid != me {
                (
                    countersign_wire::agents_socket_path_of(desk_uid),
                    Some("--desk-user"),
                )
            } else {
                (countersign_wire::default_socket_path(), None)
            };
            mcp(pipe::Options {
                reach,
                label: name,
                wait: wait.map(Duration::from_secs),
                socket,
                socket_chosen_by,
                launch_desk: !no_launch,
                desk_uid,
                relay,
            })
        }
        Command::Desk { args } => match launch::start_desk(&args) {
            Ok(pid) => {
                eprintln!("countersign: desk started (pid {pid})");
                0
            }
            Err(err) => {
                eprintln!(
                    "countersign: cannot start the desk ({}): {err}",
                    launch::desk_program().display()
                );
                1
            }
        },
        Command::Open { url } => {
            if let Err(e) = countersign_wire::parse_request_url(&url) {
                eprintln!(
                    "countersign: not a request URL ({e}); a request URL is exactly \
                     countersign://request/<id>. Nothing was opened"
                );
                2
            } else {
                match launch::open_request(&url, &countersign_wire::socket_path()) {
                    Ok(launch::Opened::Running) => 0,
                    Ok(launch::Opened::Started(pid)) => {
                        eprintln!("countersign: desk started (pid {pid}) to show the request");
                        0
                    }
                    Err(e) => {
                        eprintln!("countersign: {e}");
                        1
                    }
                }
            }
        }
        Command::Serve { args } => {
            // A server for teams is a program of its own beside this one (HTTP, TLS, the
            // control database), so that the pipe agents start links none of it.
            let serve = launch::serve_program();
            let err = std::process::Command::new(&serve).args(args).exec();
            eprintln!(
                "countersign: cannot run the server ({}): {err}",
                serve.display()
            );
            1
        }
        Command::Approver { args } => {
            // The approver key lives in the keychain, which the desk's program reaches and this
            // one (which agents start) does not link.
            let desk = launch::desk_program();
            let err = std::process::Command::new(&desk)
                .arg("approver")
                .args(args)
                .exec();
            eprintln!(
                "countersign: cannot run the desk's program ({}): {err}",
                desk.display()
            );
            1
        }
        Command::Policy(PolicyCommand::ToCedar { file }) => {
            let converted = std::fs::read_to_string(&file)
                .map_err(|e| format!("cannot read {}: {}", file.display(), e.kind()))
                .and_then(|text| {
                    countersign::policy::to_cedar(&text)
                        .map_err(|e| format!("{}: {e}", file.display()))
                });
            match converted {
                Ok(cedar) => {
                    print!("{cedar}");
                    0
                }
                Err(why) => {
                    eprintln!("countersign policy to-cedar: {why}");
                    2
                }
            }
        }
        Command::Demo => {
            // The demo is an MCP client, a program of its own beside this one, so that the pipe
            // agents start links no MCP code. It takes this process's place, stdio and all.
            let demo = launch::demo_program();
            let err = std::process::Command::new(&demo).exec();
            eprintln!(
                "countersign: cannot run the demo ({}): {err}",
                demo.display()
            );
            1
        }
        Command::Config {
            client,
            name,
            command,
        } => {
            let name = name.unwrap_or_else(|| {
                if command.is_empty() {
                    "countersign".into()
                } else {
                    countersign::config::default_name(&command)
                }
            });
            let me = std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| "countersign".into());
            print!(
                "{}",
                countersign::config::render(client, &me, &name, &command)
            );
            0
        }
        Command::Install {
            client: Some(client),
            all: false,
            dry_run,
            file,
        } => install_or_uninstall(client, file, dry_run, false, countersign_clients::install),
        Command::Install { dry_run, .. } => install_all(dry_run),
        Command::Clients => list_clients(),
        Command::Uninstall {
            client,
            force,
            file,
        } => install_or_uninstall(client, file, false, force, countersign_clients::uninstall),
        Command::Server(command) => countersign::server::run(
            command,
            &mut countersign::registry::DeskAt::default_desk(),
            &mut countersign::server::read_secret,
            &mut std::io::stdout(),
        ),
        Command::History {
            check: Some(check), ..
        } => history_check(check),
        Command::History {
            check: None,
            json,
            format,
            tool,
            limit,
            since,
            until,
            db,
        } => history_command(json, format, tool, limit, since, until, db),
    };
    std::process::exit(code);
}

fn mcp(options: pipe::Options) -> i32 {
    match pipe::run(options) {
        Ok(()) => pipe::exit::OK,
        Err(err) => {
            eprintln!("countersign mcp: {err}");
            pipe::exit_code(&err)
        }
    }
}

type InstallStep = fn(
    &mut dyn countersign_clients::Registrar,
    &countersign_clients::Options,
    &mut dyn std::io::Write,
) -> Result<(), countersign_clients::InstallError>;

fn install_or_uninstall(
    client: countersign_clients::Client,
    file: ConfigFile,
    dry_run: bool,
    force: bool,
    step: InstallStep,
) -> i32 {
    let path = if let Some(path) = file.config {
        path
    } else if file.project {
        let here = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        match client.project_config(&here) {
            Some(path) => path,
            None => {
                eprintln!(
                    "countersign: {} has no project configuration; use --config PATH",
                    client.title()
                );
                return 2;
            }
        }
    } else {
        match countersign_clients::Places::here() {
            Some(places) => client.user_config(&places),
            None => {
                eprintln!("countersign: no home directory ($HOME); use --config PATH");
                return 2;
            }
        }
    };
    let program = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "countersign".into());
    let options = countersign_clients::Options {
        client,
        path,
        program,
        dry_run,
        force,
    };
    let mut desk = countersign::registry::DeskAt::default_desk();
    let mut stdout = std::io::stdout();
    match step(&mut desk, &options, &mut stdout) {
        Ok(()) => 0,
        Err(err) => {
            let _ = stdout.flush();
            eprintln!("countersign: {err}");
            match err {
                countersign_clients::InstallError::Desk(e) => pipe::exit_code(&e),
                _ => 1,
            }
        }
    }
}

/// `countersign clients`.
fn list_clients() -> i32 {
    let Some(places) = countersign_clients::Places::here() else {
        eprintln!("countersign: no home directory ($HOME)");
        return 2;
    };
    match countersign::clients::list(&places, &mut std::io::stdout()) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("countersign: {e}");
            1
        }
    }
}

/// `countersign install --all`.
fn install_all(dry_run: bool) -> i32 {
    let Some(places) = countersign_clients::Places::here() else {
        eprintln!("countersign: no home directory ($HOME)");
        return 2;
    };
    let program = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "countersign".into());
    let mut desk = countersign::registry::DeskAt::default_desk();
    let mut stdout = std::io::stdout();
    match countersign::clients::install_all(&mut desk, &places, &program, dry_run, &mut stdout) {
        Ok(all) if all.failed.is_empty() => 0,
        Ok(_) => 1,
        Err(err) => {
            let _ = stdout.flush();
            eprintln!("countersign: {err}");
            match err {
                countersign_clients::InstallError::Desk(e) => pipe::exit_code(&e),
                _ => 1,
            }
        }
    }
}

/// `countersign history`: the table or JSON of the newest events, or an export.
fn history_command(
    json: bool,
    format: Format,
    tool: Option<String>,
    limit: u32,
    since: Option<u64>,
    until: Option<u64>,
    db: Option<PathBuf>,
) -> i32 {
    let format = if json { Format::Json } else { format };
    let db = db.unwrap_or_else(paths::desk_db);
    match format {
        Format::Table | Format::Json => {
            if since.is_some() || until.is_some() {
                eprintln!(
                    "countersign: --since and --until bound an export: use --format jsonl or csv"
                );
                return 2;
            }
            history(db, format == Format::Json, tool, limit)
        }
        Format::Jsonl | Format::Csv => {
            if tool.is_some() {
                eprintln!(
                    "countersign: an export holds every event in its range: --tool is for the table"
                );
                return 2;
            }
            export_history(db, format, since, until)
        }
    }
}

/// `countersign history verify|head|key`.
fn history_check(check: HistoryCheck) -> i32 {
    use countersign::verify;
    match check {
        HistoryCheck::Key => {
            // The chain key lives in the keychain, which the desk's program reaches and this one
            // (which agents start) does not link.
            let desk = launch::desk_program();
            let err = std::process::Command::new(&desk).arg("history-key").exec();
            eprintln!(
                "countersign: cannot run the desk's program ({}): {err}",
                desk.display()
            );
            1
        }
        HistoryCheck::Head { db } => {
            let db = db.unwrap_or_else(paths::desk_db);
            let store = match open_history(&db) {
                Ok(store) => store,
                Err(code) => return code.max(1),
            };
            match store.heads() {
                Ok(heads) => match heads.head {
                    Some(head) => {
                        println!("{}", serde_json::json!({ "head": head.to_json() }));
                        0
                    }
                    None => {
                        eprintln!("countersign: the history has no signed head yet");
                        1
                    }
                },
                Err(err) => {
                    eprintln!("countersign: cannot read history: {err}");
                    2
                }
            }
        }
        HistoryCheck::Verify {
            file,
            key,
            head,
            seen,
            db,
        } => {
            let key = match key.as_deref().map(verify::read_key).transpose() {
                Ok(key) => key,
                Err(e) => {
                    eprintln!("countersign: {e}");
                    return 2;
                }
            };
            let mut walk = countersign_core::chain::Walk::new(key);
            for path in &head {
                match verify::read_heads(path) {
                    Ok(heads) => {
                        for kept in heads {
                            if let Err(broken) = walk.expect(kept) {
                                println!("{}", verify::report(&Err(broken), key.is_some()).0);
                                return 1;
                            }
                        }
                    }
                    Err(e) => {
                        eprintln!("countersign: --head {e}");
                        return 2;
                    }
                }
            }
            for point in &seen {
                match countersign_core::chain::seen_in(point) {
                    Ok((seq, hash)) => walk.expect_seen(seq, hash),
                    Err(e) => {
                        eprintln!("countersign: {e}");
                        return 2;
                    }
                }
            }
            let result = match file {
                Some(path) => match std::fs::File::open(&path) {
                    Ok(input) => verify::verify_export(input, walk),
                    Err(e) => {
                        eprintln!("countersign: {}: {e}", path.display());
                        return 2;
                    }
                },
                None => {
                    let db = db.unwrap_or_else(paths::desk_db);
                    let store = match open_history(&db) {
                        Ok(store) => store,
                        Err(code) => return code.max(2),
                    };
                    match store.verify(walk) {
                        Ok(result) => result,
                        Err(err) => {
                            eprintln!("countersign: cannot read history: {err}");
                            return 2;
                        }
                    }
                }
            };
            let (line, code) = verify::report(&result, key.is_some());
            println!("{line}");
            code
        }
    }
}

/// The desk's history file, read-only (the desk alone creates, converts and migrates it); `Err`
/// is the exit code, said on stderr: 0 when there is no file yet, 1 when it cannot be opened.
fn open_history(db: &std::path::Path) -> Result<HistoryReader, i32> {
    if !db.exists() {
        eprintln!(
            "countersign: no history yet ({} does not exist)",
            db.display()
        );
        return Err(0);
    }
    HistoryReader::open(db, &StoreOptions::default()).map_err(|err| {
        eprintln!("countersign: cannot open {}: {err}", db.display());
        1
    })
}

/// `countersign history --format jsonl|csv`: see [`countersign::export`].
fn export_history(db: PathBuf, format: Format, since: Option<u64>, until: Option<u64>) -> i32 {
    if let (Some(since), Some(until)) = (since, until)
        && since >= until
    {
        eprintln!("countersign: --since must be before --until");
        return 2;
    }
    let store = match open_history(&db) {
        Ok(store) => store,
        Err(code) => return code,
    };
    match countersign::export::export(&store, format, since, until, std::io::stdout().lock()) {
        Ok(n) => {
            eprintln!("countersign: exported {n} events");
            say_what_waits(&store);
            0
        }
        // The reader went away (`| head`): not an error of ours.
        Err(ExportError::Write(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(err) => {
            eprintln!("countersign: {err}");
            1
        }
    }
}

fn history(db: PathBuf, json: bool, tool: Option<String>, limit: u32) -> i32 {
    let store = match open_history(&db) {
        Ok(store) => store,
        Err(code) => return code,
    };
    let mut filter = HistoryFilter::default().limit(limit);
    if let Some(tool) = tool {
        filter = filter.tool(tool);
    }
    let events = match store.history(&filter) {
        Ok(events) => events,
        Err(err) => {
            eprintln!("countersign: cannot read history: {err}");
            return 1;
        }
    };
    for e in events {
        if json {
            println!("{}", serde_json::to_string(&e).expect("events serialize"));
        } else {
            println!("{}", e.table_row());
        }
    }
    say_what_waits(&store);
    0
}

/// Says on stderr how many events wait for the OpenTelemetry collector, when any do.
fn say_what_waits(store: &HistoryReader) {
    if let Ok(Some(status)) = store.export_status(countersign_store::OTLP_SINK)
        && status.waiting > 0
    {
        let why = match (status.failing_since_ms, &status.last_error) {
            (Some(since), error) => format!(
                ": it cannot be reached since {} ({})",
                jiff::Timestamp::from_millisecond(i64::try_from(since).unwrap_or(i64::MAX))
                    .map(|t| t.to_string())
                    .unwrap_or_else(|_| since.to_string()),
                error.as_deref().unwrap_or("no answer")
            ),
            (None, _) => String::new(),
        };
        eprintln!(
            "countersign: {} events wait for the OpenTelemetry collector{why}; nothing is lost, \
             they are sent when it answers",
            status.waiting
        );
    }
}
