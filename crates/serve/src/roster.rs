//! `countersign serve agent add|revoke|list` and `countersign serve approver
//! add|invite|revoke|list|export`: the server's two rosters (agents' issued keys; approvers'
//! desk keys and passkeys), kept in its own records (CONTROL_DSN, or `--data-dir`).
#![allow(unsafe_code)] // this module reaches the OS through libc; each unsafe block says why it is sound

use std::io::Write;
use std::sync::Arc;

use clap::Parser;
use countersign_core::approver::{parse_public_key, public_key_text};
use countersign_serve::auth::new_agent_key;
use countersign_serve::cli::{AgentAction, AgentArgs, ApproverAction, ApproverArgs};
use countersign_serve::run::open_records;
use countersign_serve::start::Dsn;
use countersign_store::{
    Invite, MAX_MEMBER_NAME_CHARS, Member, Records, Roster, valid_member_name,
};

/// Now, as the system's clock says: when a member was added or revoked.
fn now_ms() -> u64 {
    use countersign_engine::Clock as _;
    countersign_engine::SystemClock.now_ms()
}

/// What one command does, whichever roster it is about.
enum Action {
    Add { name: String, key: Key },
    Invite { name: String, page: String },
    Revoke { name: String },
    List,
    Export,
}

/// The key an `add` registers.
enum Key {
    /// A fresh agent key, printed once.
    Fresh,
    /// An approver's public key, as given.
    Given(String),
}

/// Runs `countersign serve agent …`; answers the exit code.
pub fn agent() -> i32 {
    let args = AgentArgs::parse_from(
        std::iter::once(std::ffi::OsString::from("countersign serve agent"))
            .chain(std::env::args_os().skip(2)),
    );
    let action = match args.action {
        AgentAction::Add { name } => Action::Add {
            name,
            key: Key::Fresh,
        },
        AgentAction::Revoke { name } => Action::Revoke { name },
        AgentAction::List => Action::List,
    };
    run(Roster::Agents, args.data_dir, action)
}

/// Runs `countersign serve approver …`; answers the exit code.
pub fn approver() -> i32 {
    let args = ApproverArgs::parse_from(
        std::iter::once(std::ffi::OsString::from("countersign serve approver"))
            .chain(std::env::args_os().skip(2)),
    );
    let action = match args.action {
        ApproverAction::Add { name, public_key } => Action::Add {
            name,
            key: Key::Given(public_key),
        },
        ApproverAction::Invite { name, page } => Action::Invite { name, page },
        ApproverAction::Revoke { name } => Action::Revoke { name },
        ApproverAction::List => Action::List,
        ApproverAction::Export => Action::Export,
    };
    run(Roster::Approvers, args.data_dir, action)
}

fn run(roster: Roster, data_dir: Option<std::path::PathBuf>, action: Action) -> i32 {
    let me = match roster {
        Roster::Agents => "countersign serve agent",
        Roster::Approvers => "countersign serve approver",
    };
    with_records(me, data_dir, |records| async move {
        let done = match action {
            Action::Add { name, key } => add(roster, &records, name, key).await,
            Action::Invite { name, page } => invite(&records, name, &page).await,
            Action::Revoke { name } => revoke(roster, &records, &name).await,
            Action::List => list(roster, &records).await,
            Action::Export => export(&records).await,
        };
        match done {
            Ok(()) => 0,
            Err((code, message)) => {
                eprintln!("{me}: {message}");
                code
            }
        }
    })
}

/// Opens the server's records (CONTROL_DSN, read once and wiped from the environment, or
/// `data_dir`) and runs `work` on them; answers its exit code, or why the records could not be
/// opened (`me` names the command in messages).
pub fn with_records<F, Fut>(me: &str, data_dir: Option<std::path::PathBuf>, work: F) -> i32
where
    F: FnOnce(Arc<dyn Records>) -> Fut,
    Fut: std::future::Future<Output = i32>,
{
    let dsn = std::env::var("CONTROL_DSN")
        .ok()
        .filter(|d| !d.trim().is_empty())
        .map(|d| Dsn::new(zeroize::Zeroizing::new(d)));
    // SAFETY: no other thread exists yet.
    unsafe { std::env::remove_var("CONTROL_DSN") };
    let Some(place) = dsn.as_ref().map(|_| std::path::PathBuf::new()).or(data_dir) else {
        eprintln!(
            "{me}: refused (no_records): set CONTROL_DSN (the server's control database) or pass \
             --data-dir DIR (a read-only server's records)"
        );
        return 2;
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{me}: {e}");
            return 1;
        }
    };
    runtime.block_on(async move {
        match open_records(dsn.as_ref(), &place, None).await {
            Ok(records) => work(records).await,
            Err(e) => {
                eprintln!("{me}: {e}");
                e.exit_code()
            }
        }
    })
}

type Done = Result<(), (i32, String)>;

async fn add(roster: Roster, records: &Arc<dyn Records>, name: String, key: Key) -> Done {
    if !valid_member_name(&name) {
        return Err((
            2,
            format!(
                "refused (bad_name): a name is 1 to {MAX_MEMBER_NAME_CHARS} letters, digits, '.', \
                 '_' or '-'"
            ),
        ));
    }
    let (shown, stored) = match key {
        Key::Fresh => {
            let (key, hash) = new_agent_key();
            (Some(key), hash)
        }
        Key::Given(text) => match parse_public_key(&text) {
            Some(public) => (None, public),
            None => {
                return Err((
                    2,
                    "refused (bad_key): not an approver's public key: expected `ed25519:` and 43 \
                     base64url characters, as `countersign approver enroll` prints it"
                        .into(),
                ));
            }
        },
    };
    let member = Member {
        name: name.clone(),
        key: stored,
        created_at_ms: now_ms(),
        revoked_at_ms: None,
    };
    match records.put_member(roster, &member).await {
        Ok(true) => {}
        Ok(false) => {
            return Err((
                2,
                format!(
                    "refused (name_taken): {name} or this key is on the roster (or was: a revoked \
                     name or key is not reused). Choose another name, or enroll the desk again."
                ),
            ));
        }
        Err(e) => return Err((3, e.to_string())),
    }
    match (roster, shown) {
        (Roster::Agents, Some(key)) => {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}", key.as_str());
            let _ = out.flush();
            eprintln!(
                "countersign serve agent: the key of agent {name} (tenant key:{name}) is above, \
                 shown this once: the server keeps only its hash. The agent sends it as \
                 `Authorization: Bearer <key>`; the server must run with --agent-keys. Revoke it \
                 with `countersign serve agent revoke {name}`."
            );
        }
        _ => eprintln!(
            "countersign serve approver: {name} is registered ({}). Its desk connects to the \
             approver listener (--approver-listen) with a certificate of this key; revoke it with \
             `countersign serve approver revoke {name}`.",
            public_key_text(&stored)
        ),
    }
    Ok(())
}

async fn invite(records: &Arc<dyn Records>, name: String, page: &str) -> Done {
    if !valid_member_name(&name) {
        return Err((
            2,
            format!(
                "refused (bad_name): a name is 1 to {MAX_MEMBER_NAME_CHARS} letters, digits, '.', \
                 '_' or '-'"
            ),
        ));
    }
    let page = countersign_serve::web::passkey::origin(page).map_err(|_| {
        (
            2,
            "refused (bad_page): --page is the approvers' page's origin, https://HOST[:PORT] or \
             http://localhost:PORT (the server's --approver-web-origin)"
                .to_owned(),
        )
    })?;
    if countersign_serve::web::revoked(records, &name)
        .await
        .map_err(|e| (3, e.to_string()))?
    {
        return Err((
            2,
            format!(
                "refused (approver_revoked): {name} was revoked; a revoked name is not enrolled again"
            ),
        ));
    }
    let (code, hash) = countersign_serve::web::new_invite();
    let now = now_ms();
    let invite = Invite {
        hash,
        approver: name.clone(),
        created_at_ms: now,
        expires_at_ms: now.saturating_add(countersign_serve::web::INVITE_MS),
        ceremony: None,
        used_at_ms: None,
    };
    match records.put_invite(&invite).await {
        Ok(true) => {}
        Ok(false) => return Err((1, "refused (invite_taken): try again".into())),
        Err(e) => return Err((3, e.to_string())),
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}/invite#{code}", page.as_str().trim_end_matches('/'));
    let _ = out.flush();
    eprintln!(
        "countersign serve approver: the link above enrolls a passkey for {name}, once, within 15 \
         minutes; the server keeps only its hash. Send it to {name} over a channel you trust."
    );
    Ok(())
}

async fn export(records: &Arc<dyn Records>) -> Done {
    let members = records
        .members(Roster::Approvers)
        .await
        .map_err(|e| (3, e.to_string()))?;
    let passkeys = records.passkeys().await.map_err(|e| (3, e.to_string()))?;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "{}",
        countersign_serve::kept::roster_json(&members, &passkeys)
    );
    Ok(())
}

async fn revoke(roster: Roster, records: &Arc<dyn Records>, name: &str) -> Done {
    match records.revoke_member(roster, name, now_ms()).await {
        Ok(true) => {
            eprintln!("{name} is revoked");
            Ok(())
        }
        Ok(false) => Err((
            2,
            format!("refused (not_found): nobody named {name} is on the roster unrevoked"),
        )),
        Err(e) => Err((3, e.to_string())),
    }
}

async fn list(roster: Roster, records: &Arc<dyn Records>) -> Done {
    let members = records
        .members(roster)
        .await
        .map_err(|e| (3, e.to_string()))?;
    let mut out = std::io::stdout().lock();
    for m in members {
        let state = match m.revoked_at_ms {
            Some(at) => format!("revoked at {at} ms"),
            None => "active".into(),
        };
        let who = match roster {
            Roster::Agents => format!("key:{}", m.name),
            Roster::Approvers => public_key_text(&m.key),
        };
        let _ = writeln!(
            out,
            "{}\t{who}\tcreated at {} ms\t{state}",
            m.name, m.created_at_ms
        );
    }
    if roster == Roster::Approvers {
        use base64::Engine as _;
        let passkeys = records.passkeys().await.map_err(|e| (3, e.to_string()))?;
        for p in passkeys {
            let state = match p.revoked_at_ms {
                Some(at) => format!("revoked at {at} ms"),
                None => "active".into(),
            };
            let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&p.credential_id);
            let _ = writeln!(
                out,
                "{}\tpasskey:{id}\tcreated at {} ms\t{state}",
                p.approver, p.created_at_ms
            );
        }
    }
    Ok(())
}
