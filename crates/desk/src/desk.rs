//! The desk's state, which its window's commands share: the engine, the registry, the sockets,
//! the settings, the keychain's last answer, and the team servers it approves for. It is made
//! once, by [`crate::start`].

use countersign_core::sync::lock;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use countersign_engine::{Engine, PendingRequest};
use countersign_registry::Registry;
use countersign_secret::{SecretError, SecretStore};
use countersign_session as socket;

use crate::settings::{Dirs, Settings};
use crate::{approver, otlp};

/// The desk's state, shared with its window's commands.
pub struct Desk {
    /// The engine: queue, minting, verification, history.
    pub engine: Engine,
    /// The account's directories.
    pub dirs: Dirs,
    /// The settings in force.
    pub settings: Mutex<Settings>,
    /// Where the secret is kept (the OS keychain, or memory when asked for explicitly).
    pub secret: Arc<dyn SecretStore>,
    /// Why the keychain could not be read when last asked (`None`: it could).
    pub keychain_problem: Mutex<Option<String>>,
    /// Registered servers, and the guard on servers.json and policy.toml.
    pub registry: Registry,
    /// The desk's own socket, which gateways reach.
    pub served: socket::Served,
    /// The socket for agents of other accounts, when the settings name any.
    pub agents: Option<socket::Served>,
    /// The team servers this desk approves for, when it is enrolled with any.
    pub remote: Option<approver::Remote>,
    /// Confirm events sent to the OpenTelemetry collector of the settings, if any.
    pub export: otlp::Export,
    /// The request a URL last asked the window to show, until the page takes it.
    pub wanted: Mutex<Option<u64>>,
}

impl Desk {
    /// Rotates the secret and gives the engine the new key.
    pub fn rotate_secret(&self) -> Result<(), SecretError> {
        let secret = self.secret.rotate()?;
        self.engine.set_key(Ok(secret.signing_key()));
        tracing::warn!(target: "desk", "secret rotated: every outstanding token stopped working");
        Ok(())
    }

    /// Every request waiting for this person: the desk's own, then team servers'.
    pub fn pending(&self) -> Vec<PendingRequest> {
        pending_of(&self.engine, self.remote.as_ref())
    }

    /// Why nothing can be approved right now, if so: no key at all, or a keychain that stopped
    /// answering since.
    pub fn secret_problem(&self) -> Option<String> {
        self.engine
            .secret_problem()
            .or_else(|| lock(&self.keychain_problem).clone())
    }

    /// Asks the keychain for the secret, on the blocking pool, and records whether it answered;
    /// `Some` when what it says changed since last asked. The desk mints only while the keychain
    /// answers: a keychain that was locked or whose service went away means the person's secrets
    /// are not to be used, so Approve stops with a banner. Verifying tokens already minted goes on
    /// with the key read at start: those approvals were given while the keychain was there, and
    /// refusing them would only strand work the person already allowed; they still expire.
    pub async fn check_keychain(&self) -> KeychainAnswer {
        // No key at all (the keychain was missing at start): that is the problem to show, as it
        // was said then.
        if let Some(problem) = self.engine.secret_problem() {
            return KeychainAnswer {
                problem: Some(problem),
                changed: false,
            };
        }
        let secret = self.secret.clone();
        let asked = tokio::task::spawn_blocking(move || match secret.load() {
            Ok(Some(_)) => None,
            Ok(None) => Some("the secret is no longer in the OS keychain".to_owned()),
            Err(e) => Some(e.to_string()),
        });
        let problem = match tokio::time::timeout(KEYCHAIN_ANSWER, asked).await {
            Ok(Ok(problem)) => problem,
            Ok(Err(e)) => Some(format!("asking the keychain failed: {e}")),
            Err(_) => Some(format!(
                "the OS keychain did not answer within {} s (locked?)",
                KEYCHAIN_ANSWER.as_secs()
            )),
        };
        let changed = {
            let mut last = lock(&self.keychain_problem);
            let changed = *last != problem;
            *last = problem.clone();
            changed
        };
        if changed {
            match &problem {
                Some(why) => tracing::error!(target: "desk", "minting stopped: {why}"),
                None => {
                    tracing::warn!(target: "desk", "the keychain answers again: minting resumed")
                }
            }
        }
        KeychainAnswer { problem, changed }
    }
}

/// What [`Desk::check_keychain`] heard.
pub struct KeychainAnswer {
    /// Why the keychain cannot be used now, if so.
    pub problem: Option<String>,
    /// Whether that differs from the last answer (the window's banner is to follow).
    pub changed: bool,
}

/// How long the keychain may take to answer before the desk counts it as unavailable (a locked
/// keychain may wait for a prompt nobody answers).
const KEYCHAIN_ANSWER: Duration = Duration::from_secs(5);

/// How often the desk asks the keychain whether it is still there, to show or clear the banner.
pub const KEYCHAIN_CHECK_EVERY: Duration = Duration::from_secs(30);

/// The desk's own waiting requests, then those of the team servers it approves for.
pub fn pending_of(engine: &Engine, remote: Option<&approver::Remote>) -> Vec<PendingRequest> {
    let mut pending = engine.pending();
    if let Some(remote) = remote {
        pending.extend(remote.pending());
    }
    pending
}
