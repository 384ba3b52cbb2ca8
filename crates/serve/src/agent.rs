//! `countersign serve agent add|revoke|list`: the keys this server issues to agents without an
//! identity provider, kept in the server's own records (CONTROL_DSN, or `--data-dir`).

use std::io::Write;

use clap::Parser;
use countersign_serve::auth::new_agent_key;
use countersign_serve::cli::{AgentAction, AgentArgs};
use countersign_serve::run::open_records;
use countersign_serve::start::Dsn;
use countersign_store::{AgentKey, valid_agent_name};

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Runs the command; answers the exit code.
pub fn main() -> i32 {
    let args = AgentArgs::parse_from(
        std::iter::once(std::ffi::OsString::from("countersign serve agent"))
            .chain(std::env::args_os().skip(2)),
    );
    let dsn = std::env::var("CONTROL_DSN")
        .ok()
        .filter(|d| !d.trim().is_empty())
        .map(|d| Dsn::new(zeroize::Zeroizing::new(d)));
    // SAFETY: no other thread exists yet.
    unsafe { std::env::remove_var("CONTROL_DSN") };
    let Some(place) = dsn
        .as_ref()
        .map(|_| std::path::PathBuf::new())
        .or(args.data_dir.clone())
    else {
        eprintln!(
            "countersign serve agent: refused (no_records): set CONTROL_DSN (the server's control \
             database) or pass --data-dir DIR (a read-only server's records)"
        );
        return 2;
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("countersign serve agent: {e}");
            return 1;
        }
    };
    runtime.block_on(async move {
        let records = match open_records(dsn.as_ref(), &place).await {
            Ok(records) => records,
            Err(e) => {
                eprintln!("countersign serve agent: {e}");
                return e.exit_code();
            }
        };
        match args.action {
            AgentAction::Add { name } => {
                if !valid_agent_name(&name) {
                    eprintln!(
                        "countersign serve agent: refused (bad_name): an agent's name is 1 to {} \
                         letters, digits, '.', '_' or '-'",
                        countersign_store::MAX_AGENT_NAME_CHARS
                    );
                    return 2;
                }
                let (key, hash) = new_agent_key();
                let row = AgentKey {
                    name: name.clone(),
                    hash,
                    created_at_ms: now_ms(),
                    revoked_at_ms: None,
                };
                match records.put_agent_key(&row).await {
                    Ok(true) => {
                        let mut out = std::io::stdout().lock();
                        let _ = writeln!(out, "{}", key.as_str());
                        let _ = out.flush();
                        eprintln!(
                            "countersign serve agent: the key of agent {name} (tenant key:{name}) \
                             is above, shown this once: the server keeps only its hash. The agent \
                             sends it as `Authorization: Bearer <key>`; the server must run with \
                             --agent-keys. Revoke it with `countersign serve agent revoke {name}`."
                        );
                        0
                    }
                    Ok(false) => {
                        eprintln!(
                            "countersign serve agent: refused (name_taken): an agent named {name} \
                             exists (or existed: a revoked name is not reused). Choose another name."
                        );
                        2
                    }
                    Err(e) => {
                        eprintln!("countersign serve agent: {e}");
                        3
                    }
                }
            }
            AgentAction::Revoke { name } => match records.revoke_agent_key(&name, now_ms()).await {
                Ok(true) => {
                    eprintln!("countersign serve agent: agent {name}'s key is revoked");
                    0
                }
                Ok(false) => {
                    eprintln!(
                        "countersign serve agent: refused (not_found): no agent named {name} \
                         holds a key that is not revoked"
                    );
                    2
                }
                Err(e) => {
                    eprintln!("countersign serve agent: {e}");
                    3
                }
            },
            AgentAction::List => match records.agent_keys().await {
                Ok(keys) => {
                    let mut out = std::io::stdout().lock();
                    for key in keys {
                        let state = match key.revoked_at_ms {
                            Some(at) => format!("revoked at {at} ms"),
                            None => "active".into(),
                        };
                        let _ = writeln!(
                            out,
                            "{}\tkey:{}\tcreated at {} ms\t{state}",
                            key.name, key.name, key.created_at_ms
                        );
                    }
                    0
                }
                Err(e) => {
                    eprintln!("countersign serve agent: {e}");
                    3
                }
            },
        }
    })
}
