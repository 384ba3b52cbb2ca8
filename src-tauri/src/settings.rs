//! The desk's settings and policy files, in the user's config directory.
//!
//! `settings.json` holds what the settings view edits (token lifetime, approve delay); the policy
//! is `policy.toml` (DESIGN.md, "Gate classes and plans"), checked before it is saved, so a typo
//! never replaces a working policy. The approve delay can be raised, never set below one second.

use std::path::PathBuf;

use countersign_core::policy::Policy;
use serde::{Deserialize, Serialize};

/// The shortest approve delay, in ms: a click in the first second after a request appears, the
/// window regains focus or the content changes does nothing.
pub const MIN_APPROVE_DELAY_MS: u64 = 1000;

/// What the settings view edits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Token lifetime in minutes.
    pub token_minutes: u64,
    /// How long Approve stays disabled, in ms (at least [`MIN_APPROVE_DELAY_MS`]).
    pub approve_delay_ms: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            token_minutes: 10,
            approve_delay_ms: MIN_APPROVE_DELAY_MS,
        }
    }
}

impl Settings {
    /// Clamps values into their allowed ranges.
    pub fn sanitized(mut self) -> Self {
        self.approve_delay_ms = self.approve_delay_ms.clamp(MIN_APPROVE_DELAY_MS, 60_000);
        self.token_minutes = self.token_minutes.clamp(1, 24 * 60);
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
}

impl Dirs {
    /// The platform's per-user directories for Countersign.
    pub fn new() -> Self {
        match directories::ProjectDirs::from("", "", "countersign") {
            Some(d) => Dirs {
                data: d.data_dir().to_owned(),
                config: d.config_dir().to_owned(),
            },
            None => {
                let tmp = std::env::temp_dir().join("countersign");
                Dirs {
                    data: tmp.clone(),
                    config: tmp,
                }
            }
        }
    }

    /// The desk's SQLite file.
    pub fn store(&self) -> PathBuf {
        self.data.join("desk.sqlite")
    }

    fn settings_file(&self) -> PathBuf {
        self.config.join("settings.json")
    }

    fn policy_file(&self) -> PathBuf {
        self.config.join("policy.toml")
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

    /// Saves settings.
    pub fn save_settings(&self, settings: &Settings) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.config)?;
        std::fs::write(
            self.settings_file(),
            serde_json::to_vec_pretty(settings).expect("settings serialize"),
        )
    }

    /// The policy text as saved ("" when there is none).
    pub fn policy_text(&self) -> String {
        std::fs::read_to_string(self.policy_file()).unwrap_or_default()
    }

    /// The saved policy; a broken file is reported and the defaults apply.
    pub fn load_policy(&self) -> Policy {
        Policy::from_toml(&self.policy_text()).unwrap_or_else(|e| {
            tracing::warn!(target: "desk", "ignoring {}: {e}", self.policy_file().display());
            Policy::default()
        })
    }

    /// Checks and saves policy text; returns the parsed policy.
    pub fn save_policy(&self, text: &str) -> Result<Policy, String> {
        let policy = Policy::from_toml(text)?;
        std::fs::create_dir_all(&self.config).map_err(|e| e.to_string())?;
        std::fs::write(self.policy_file(), text).map_err(|e| e.to_string())?;
        Ok(policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approve_delay_can_be_raised_never_lowered_below_one_second() {
        let s = Settings {
            approve_delay_ms: 200,
            token_minutes: 10,
        }
        .sanitized();
        assert_eq!(s.approve_delay_ms, MIN_APPROVE_DELAY_MS);
        let s = Settings {
            approve_delay_ms: 3000,
            token_minutes: 10,
        }
        .sanitized();
        assert_eq!(s.approve_delay_ms, 3000);
    }

    #[test]
    fn a_broken_policy_is_refused_and_the_saved_one_kept() {
        let dir = std::env::temp_dir().join(format!("cs-settings-{}", std::process::id()));
        let dirs = Dirs {
            data: dir.clone(),
            config: dir.clone(),
        };
        dirs.save_policy("[servers.fs.tools.write_file]\nclass = \"token\"\n")
            .unwrap();
        assert!(
            dirs.save_policy("[servers.fs.tools.write_file]\nclass = \"maybe\"\n")
                .is_err()
        );
        assert!(dirs.policy_text().contains("\"token\""));
        let _ = std::fs::remove_dir_all(dir);
    }
}
