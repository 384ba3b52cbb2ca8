//! `countersign-serve` (also `countersign serve`): the start rules, then the server.
#![allow(unsafe_code)] // this module reaches the OS through libc; each unsafe block says why it is sound

use std::io::Write;
use std::os::unix::ffi::OsStringExt;

use clap::Parser;
use countersign_serve::cli::Args;

mod history;
mod roster;
mod verify;
use countersign_serve::start::{self, Given, OWN_VARIABLES};
use tokio_util::sync::CancellationToken;
use zeroize::Zeroizing;

fn refuse(code: &str, message: &dyn std::fmt::Display, exit: i32) -> ! {
    let _ = writeln!(
        std::io::stderr(),
        "countersign serve: refused ({code}): {message}"
    );
    std::process::exit(exit);
}

/// Wipes the server's own variables from its environment block (their bytes, not only the
/// pointers: `/proc/PID/environ` shows the block as the process started) and makes the process
/// undumpable, so that a process of the same account (an upstream it starts, say) can read
/// neither that file nor the process's memory.
/// This machine's name, for the collector to tell replicas apart (`unknown` when unreadable).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

fn forget_own_variables() {
    let secrets: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with("COUNTERSIGN_SECRET_"))
        .collect();
    let names = OWN_VARIABLES.iter().map(|n| n.to_string()).chain(secrets);
    for name in names {
        let Ok(cname) = std::ffi::CString::new(name.as_str()) else {
            continue;
        };
        // SAFETY: no other thread exists yet (the runtime starts below), so nothing reads or
        // changes the environment meanwhile; getenv's pointer is to the value's bytes in the
        // environment block, valid until the variable is changed, and only they are zeroed.
        unsafe {
            let value = libc::getenv(cname.as_ptr());
            if !value.is_null() {
                let len = libc::strlen(value);
                std::ptr::write_bytes(value, 0, len);
            }
            std::env::remove_var(&name);
        }
    }
    // SAFETY: prctl with PR_SET_DUMPABLE takes plain integers.
    #[cfg(target_os = "linux")]
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
}

/// What is logged: `RUST_LOG` (default `info`), but never rmcp's message dumps or the database
/// driver's statement parameters, which carry tools' arguments and confirm tokens.
fn log_filter() -> tracing_subscriber::EnvFilter {
    let asked = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
    tracing_subscriber::EnvFilter::try_new(format!("{asked},rmcp=warn,tokio_postgres=info"))
        .unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new("info,rmcp=warn,tokio_postgres=info")
        })
}

/// The upstreams of the servers file at `path`, each secret value from the environment or from
/// `secrets_dir`; a refusal (exit 2) naming what is missing, never a value.
fn servers(
    path: &std::path::Path,
    secrets_dir: Option<&std::path::Path>,
) -> Vec<countersign_serve::servers::Configured> {
    use countersign_serve::servers::{load, secret_variable};
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
        refuse(
            "servers",
            &format!("cannot read --servers {}: {}", path.display(), e.kind()),
            2,
        )
    });
    let mut secret = |server: &str, key: &str| -> Option<Zeroizing<String>> {
        if let Ok(value) = std::env::var(secret_variable(server, key)) {
            return Some(Zeroizing::new(value));
        }
        let file = secrets_dir?.join(server).join(key);
        let mut text = Zeroizing::new(std::fs::read_to_string(file).ok()?);
        if text.ends_with('\n') {
            text.pop();
        }
        Some(text)
    };
    load(&text, &mut secret).unwrap_or_else(|e| refuse("servers", &e, 2))
}

fn main() {
    match std::env::args_os().nth(1) {
        Some(a) if a == "agent" => std::process::exit(roster::agent()),
        Some(a) if a == "approver" => std::process::exit(roster::approver()),
        Some(a) if a == "history" => std::process::exit(history::main()),
        Some(a) if a == "verify-decisions" => std::process::exit(verify::main()),
        _ => {}
    }
    let args = Args::parse();
    // Read once, then gone from the environment (see forget_own_variables).
    let var = |name: &str| std::env::var_os(name).map(OsStringExt::into_vec);
    let given = Given {
        confirm_secret: var("CONFIRM_SECRET").map(Zeroizing::new),
        // A read-only server ignores a secret: it does not read the file either.
        secret_file: args
            .secret_file
            .as_ref()
            .filter(|_| !args.read_only)
            .map(|path| match std::fs::read(path) {
                Ok(bytes) => Zeroizing::new(bytes),
                Err(e) => refuse(
                    "secret_file",
                    &format!("cannot read --secret-file {}: {}", path.display(), e.kind()),
                    2,
                ),
            }),
        confirm_ttl_ms: var("CONFIRM_TTL_MS").map(|v| String::from_utf8_lossy(&v).into_owned()),
        otlp: {
            let instance = format!("{}-{}", hostname(), std::process::id());
            let collector = match &args.otlp_endpoint {
                Some(endpoint) => {
                    countersign_otlp::Collector::new(endpoint, "countersign-serve", &instance)
                        .map(Some)
                }
                None => countersign_otlp::Collector::from_env(
                    |name| std::env::var(name).ok(),
                    "countersign-serve",
                    &instance,
                ),
            };
            collector.unwrap_or_else(|why| refuse("otlp", &why.to_string(), 2))
        },
        control_dsn: var("CONTROL_DSN")
            .map(|v| Zeroizing::new(String::from_utf8_lossy(&v).into_owned())),
        servers: args
            .servers
            .as_ref()
            .map(|path| servers(path, args.secrets_dir.as_deref())),
        policy: args.policy.as_ref().map(|path| {
            let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
                refuse(
                    "policy",
                    &format!("cannot read --policy {}: {}", path.display(), e.kind()),
                    2,
                )
            });
            countersign_core::policy::Policy::from_toml(&text).unwrap_or_else(|why| {
                refuse("policy", &format!("--policy {}: {why}", path.display()), 2)
            })
        }),
        rules: args.rules.as_ref().map(|path| {
            let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
                refuse(
                    "rules",
                    &format!("cannot read --rules {}: {}", path.display(), e.kind()),
                    2,
                )
            });
            // Whole or not at all: what can be checked before any upstream lists its tools
            // (the syntax, the annotations) is checked now.
            if let Err(why) = countersign_cedar::Rules::parse(&text, &[]) {
                refuse(why.code(), &format!("--rules {}: {why}", path.display()), 2)
            }
            text
        }),
    };
    forget_own_variables();
    let cwd = std::env::current_dir().unwrap_or_default();
    let start = match start::check(&args, given, &cwd) {
        Ok(start) => start,
        Err(e) => refuse(e.code(), &e, 2),
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(log_filter())
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => refuse("runtime", &e, 1),
    };
    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    let code = runtime.block_on(async move {
        tokio::spawn(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
            on_signal.cancel();
        });
        match countersign_serve::run::run(start, stop, |_| {}).await {
            Ok(()) => 0,
            Err(e) => {
                tracing::error!(target: "serve", code = e.exit_code(), "{e}");
                let _ = writeln!(std::io::stderr(), "countersign serve: {e}");
                e.exit_code()
            }
        }
    });
    std::process::exit(code);
}
