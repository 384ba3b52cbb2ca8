//! The desk's settings and policy files, in the account's config directory.
//!
//! `settings.json` holds what the settings view edits (token lifetime, approve delay) and the
//! accounts agents may connect from. The approve delay can be raised, never set below one
//! second. The policy (`policy.toml`) and the registry of servers (`servers.json`) are guarded
//! by `countersign_registry`: what applies is what the desk last accepted.
//!
//! The directories are the account's own, found from the password database and never from the
//! environment (see `countersign_wire::DeskDirs`), and each is 0700.
#![allow(unsafe_code)] // this module reaches the OS through libc; each unsafe block says why it is sound

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The shortest approve delay, in ms: a click in the first second after a request appears, the
/// window regains focus or the content changes does nothing.
pub const MIN_APPROVE_DELAY_MS: u64 = 1000;

/// How long the window stays hidden with nothing pending before its webview is released, unless
/// the settings say otherwise.
pub const RELEASE_AFTER_S: u64 = 60;
/// The shortest release delay the settings may set, in seconds.
pub const MIN_RELEASE_AFTER_S: u64 = 10;
/// The longest release delay the settings may set, in seconds.
pub const MAX_RELEASE_AFTER_S: u64 = 24 * 60 * 60;

/// What the settings view edits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Token lifetime in minutes.
    pub token_minutes: u64,
    /// How long Approve stays disabled, in ms (at least [`MIN_APPROVE_DELAY_MS`]).
    pub approve_delay_ms: u64,
    /// Accounts besides the desk's own, by name or uid, whose agents may connect (agents that run
    /// under accounts of their own): the desk then also listens on a socket they can reach. Read
    /// at start. `None` when a caller did not say (the settings view does not edit it): saving
    /// then keeps the list already saved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_accounts: Option<Vec<String>>,
    /// How long the window stays closed with nothing pending before the desk releases its
    /// webview, in seconds (`idle`; 10 s to 24 h; `None`: 60 s). Read at start; the settings view
    /// does not edit it, and saving from the view keeps the value already saved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_after_s: Option<u64>,
    /// The OpenTelemetry collector every confirm event is sent to (its OTLP/HTTP logs endpoint,
    /// such as `http://127.0.0.1:4318/v1/logs`), if any. `None` from the settings view: keep the
    /// one saved; an empty text: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            token_minutes: 10,
            approve_delay_ms: MIN_APPROVE_DELAY_MS,
            agent_accounts: None,
            release_after_s: None,
            otlp_endpoint: None,
        }
    }
}

impl Settings {
    /// Clamps values into their allowed ranges.
    pub fn sanitized(mut self) -> Self {
        self.approve_delay_ms = self.approve_delay_ms.clamp(MIN_APPROVE_DELAY_MS, 60_000);
        self.token_minutes = self.token_minutes.clamp(1, 24 * 60);
        self.release_after_s = self
            .release_after_s
            .map(|s| s.clamp(MIN_RELEASE_AFTER_S, MAX_RELEASE_AFTER_S));
        self
    }
}

/// Where the desk keeps its files.
#[derive(Debug, Clone)]
pub struct Dirs {
    /// Data: the SQLite file.
    pub data: PathBuf,
    /// Config: settings and policy.
    pub config: PathBuf,
    /// State: the log.
    pub state: PathBuf,
}

/// Why the desk's directories could not be had: the desk then does not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DirsError {
    /// Where they are could not be told (no home in the password database).
    #[error("cannot tell where the desk's directories are: {0}")]
    Locate(#[source] std::io::Error),
    /// One could not be created, or made private to this account.
    #[error("cannot set up {}: {source}", dir.display())]
    SetUp {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl Dirs {
    /// This account's directories for the desk, created 0700 (see
    /// `countersign_wire::DeskDirs::locate`: `$COUNTERSIGN_DESK_DIR`, else the platform's places
    /// in the home the password database records).
    pub fn new() -> Result<Self, DirsError> {
        let located = countersign_wire::DeskDirs::locate().map_err(DirsError::Locate)?;
        let dirs = Dirs {
            data: located.data,
            config: located.config,
            state: located.state,
        };
        for dir in [&dirs.config, &dirs.data, &dirs.state] {
            private_dir(dir).map_err(|source| DirsError::SetUp {
                dir: dir.clone(),
                source,
            })?;
        }
        Ok(dirs)
    }

    /// The desk's SQLite file.
    pub fn store(&self) -> PathBuf {
        countersign_wire::DeskDirs::store_in(&self.data)
    }

    fn settings_file(&self) -> PathBuf {
        self.config.join("settings.json")
    }

    /// The saved settings, or the defaults (a broken file is reported and ignored).
    pub fn load_settings(&self) -> Settings {
        match std::fs::read_to_string(self.settings_file()) {
            Ok(text) => serde_json::from_str::<Settings>(&text)
                .map(Settings::sanitized)
                .unwrap_or_else(|e| {
                    tracing::warn!(target: "desk", "ignoring {}: {e}", self.settings_file().display());
                    Settings::default()
                }),
            Err(_) => Settings::default(),
        }
    }

    /// Saves settings and answers them as saved. A value that is not given (agent accounts, the
    /// release delay, the collector) keeps the saved one; an empty collector endpoint clears it.
    pub fn save_settings(&self, settings: &Settings) -> std::io::Result<Settings> {
        private_dir(&self.config)?;
        let mut settings = settings.clone();
        if settings.agent_accounts.is_none()
            || settings.release_after_s.is_none()
            || settings.otlp_endpoint.is_none()
        {
            let saved = self.load_settings();
            settings.agent_accounts = settings.agent_accounts.or(saved.agent_accounts);
            settings.release_after_s = settings.release_after_s.or(saved.release_after_s);
            settings.otlp_endpoint = settings.otlp_endpoint.or(saved.otlp_endpoint);
        }
        settings.otlp_endpoint = settings
            .otlp_endpoint
            .map(|e| e.trim().to_owned())
            .filter(|e| !e.is_empty());
        std::fs::write(
            self.settings_file(),
            serde_json::to_vec_pretty(&settings).expect("settings serialize"),
        )?;
        Ok(settings)
    }
}

impl Settings {
    /// The user ids of [`Settings::agent_accounts`]; a name with no account is reported and left
    /// out, and so is the desk's own account (it is always served).
    pub fn agent_uids(&self) -> Vec<u32> {
        // SAFETY: getuid has no preconditions and cannot fail.
        // SAFETY: getuid takes nothing, cannot fail and touches no memory of ours.
        let me = unsafe { libc::getuid() };
        let mut uids = Vec::new();
        for account in self.agent_accounts.iter().flatten() {
            match countersign_wire::account_uid(account) {
                Ok(Some(uid)) if uid == me => {}
                Ok(Some(uid)) => uids.push(uid),
                Ok(None) => {
                    tracing::warn!(target: "desk", "agent_accounts: no account named {account:?}; left out")
                }
                Err(e) => {
                    tracing::warn!(target: "desk", "agent_accounts: cannot look {account:?} up ({e}); left out")
                }
            }
        }
        uids.sort_unstable();
        uids.dedup();
        uids
    }
}

/// Creates `dir` (and missing parents) 0700, and takes group and other permissions away from an
/// existing one of this account's.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::metadata(dir)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    // SAFETY: geteuid takes nothing, cannot fail and touches no memory of ours.
    let me = unsafe { libc::geteuid() };
    if meta.uid() == me && meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approve_delay_can_be_raised_never_lowered_below_one_second() {
        let s = Settings {
            approve_delay_ms: 200,
            ..Settings::default()
        }
        .sanitized();
        assert_eq!(s.approve_delay_ms, MIN_APPROVE_DELAY_MS);
        let s = Settings {
            approve_delay_ms: 3000,
            ..Settings::default()
        }
        .sanitized();
        assert_eq!(s.approve_delay_ms, 3000);
    }

    #[test]
    fn the_release_delay_is_bounded_and_kept_when_the_view_saves() {
        let bounded = |s| {
            Settings {
                release_after_s: Some(s),
                ..Settings::default()
            }
            .sanitized()
            .release_after_s
        };
        assert_eq!(bounded(0), Some(MIN_RELEASE_AFTER_S));
        assert_eq!(bounded(u64::MAX), Some(MAX_RELEASE_AFTER_S));
        assert_eq!(bounded(120), Some(120));
        let dir = std::env::temp_dir().join(format!("cs-release-{}", std::process::id()));
        let dirs = Dirs {
            data: dir.clone(),
            config: dir.clone(),
            state: dir.clone(),
        };
        dirs.save_settings(&Settings {
            release_after_s: Some(300),
            ..Settings::default()
        })
        .unwrap();
        let from_view: Settings =
            serde_json::from_str(r#"{"token_minutes": 5, "approve_delay_ms": 2000}"#).unwrap();
        dirs.save_settings(&from_view).unwrap();
        assert_eq!(dirs.load_settings().release_after_s, Some(300));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn saving_from_the_settings_view_keeps_the_agent_accounts() {
        let dir = std::env::temp_dir().join(format!("cs-accounts-{}", std::process::id()));
        let dirs = Dirs {
            data: dir.clone(),
            config: dir.clone(),
            state: dir.clone(),
        };
        let listed = Settings {
            agent_accounts: Some(vec!["agent".into(), "1234".into()]),
            ..Settings::default()
        };
        dirs.save_settings(&listed).unwrap();
        // The view sends only what it edits.
        let from_view: Settings =
            serde_json::from_str(r#"{"token_minutes": 5, "approve_delay_ms": 2000}"#).unwrap();
        dirs.save_settings(&from_view).unwrap();
        let saved = dirs.load_settings();
        assert_eq!(saved.token_minutes, 5);
        assert_eq!(saved.agent_accounts, listed.agent_accounts);
        // An explicit empty list clears it.
        dirs.save_settings(&Settings {
            agent_accounts: Some(vec![]),
            ..Settings::default()
        })
        .unwrap();
        assert_eq!(dirs.load_settings().agent_accounts, Some(vec![]));
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn agent_accounts_are_uids_without_the_desks_own_or_unknown_names() {
        // SAFETY: getuid takes nothing, cannot fail and touches no memory of ours.
        let me = unsafe { libc::getuid() };
        let s = Settings {
            agent_accounts: Some(vec![
                "4242".into(),
                me.to_string(),
                "no-such-account-countersign".into(),
                "4242".into(),
            ]),
            ..Settings::default()
        };
        assert_eq!(s.agent_uids(), vec![4242]);
    }
}
