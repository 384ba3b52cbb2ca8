//! Enrolling this desk with a team server: its one approver key in the keychain, the servers it
//! approves for (`approvers.json`, nothing secret), and the `countersign approver …` commands.

use std::collections::BTreeMap;
use std::path::Path;

use countersign_core::approver::{self, ApproverKey};
use countersign_secret::Items;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde::{Deserialize, Serialize};

use crate::seed::SeedError;

/// The keychain item that holds the approver key's 32 secret bytes (base64).
pub const KEY_ITEM: &str = "approver-key";

/// The file, in the desk's configuration folder, that lists the servers this desk approves for.
pub const FILE: &str = "approvers.json";

/// One server this desk approves for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Enrolled {
    /// The approver listener's URL, exactly as the server names itself (`--approver-url`).
    pub url: String,
    /// The certificate authority (PEM) that issued the listener's certificate.
    pub ca_pem: String,
}

/// `approvers.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Enrollments {
    /// By URL.
    pub servers: BTreeMap<String, Enrolled>,
}

/// Why `approvers.json` could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnrollmentsError {
    /// The file is there but cannot be read.
    #[error("{FILE}: {0}")]
    Read(#[source] std::io::Error),
    /// The file is not a list of enrollments.
    #[error("{FILE}: {0}")]
    Parse(#[source] serde_json::Error),
}

impl Enrollments {
    /// The enrollments in `config` (none when the file is missing).
    pub fn load(config: &Path) -> Result<Enrollments, EnrollmentsError> {
        match std::fs::read_to_string(config.join(FILE)) {
            Ok(text) => serde_json::from_str(&text).map_err(EnrollmentsError::Parse),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Enrollments::default()),
            Err(e) => Err(EnrollmentsError::Read(e)),
        }
    }

    fn save(&self, config: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(config)?;
        let text = serde_json::to_string_pretty(self)?;
        let temporary = config.join(format!("{FILE}.tmp"));
        std::fs::write(&temporary, text + "\n")?;
        std::fs::rename(&temporary, config.join(FILE))
    }
}

/// The desk's approver key from the keychain; made and stored first when `create` and there is
/// none.
pub fn key(items: &dyn Items, create: bool) -> Result<Option<ApproverKey>, SeedError> {
    Ok(
        crate::seed::stored(items, KEY_ITEM, "approver key", create)?
            .map(|seed| ApproverKey::from_seed(&seed)),
    )
}

/// `countersign approver enroll URL --ca FILE` and `countersign approver list|forget URL`, run by
/// the desk's program before any window: answers the exit code.
pub fn command(config: &Path, items: &dyn Items, args: &[String]) -> i32 {
    let me = "countersign approver";
    let usage = format!(
        "usage: {me} enroll URL --ca FILE | {me} list | {me} forget URL\n  enroll: approve the \
         calls of the team server whose approver listener is URL (https://…; FILE: the PEM \
         certificate authority of its certificate)"
    );
    let mut enrollments = match Enrollments::load(config) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("{me}: {e}");
            return 1;
        }
    };
    match args {
        [verb, url, ca_flag, ca] if verb == "enroll" && ca_flag == "--ca" => {
            if !url.starts_with("https://") || url.len() <= 8 || url.contains(char::is_whitespace) {
                eprintln!("{me}: refused (not_https): the approver listener's URL is https://…");
                return 2;
            }
            let ca_pem = match std::fs::read_to_string(ca) {
                Ok(text) if CertificateDer::pem_slice_iter(text.as_bytes()).any(|c| c.is_ok()) => {
                    text
                }
                _ => {
                    eprintln!("{me}: refused (bad_ca): {ca} holds no PEM certificate");
                    return 2;
                }
            };
            let key = match key(items, true) {
                Ok(Some(key)) => key,
                Ok(None) | Err(_) => {
                    eprintln!(
                        "{me}: refused (no_keychain): the approver key cannot be kept in the OS \
                         keychain; unlock it (or start its service) and enroll again"
                    );
                    return 3;
                }
            };
            enrollments.servers.insert(
                url.clone(),
                Enrolled {
                    url: url.clone(),
                    ca_pem,
                },
            );
            if let Err(e) = enrollments.save(config) {
                eprintln!("{me}: cannot write {FILE}: {e}");
                return 1;
            }
            let public = approver::public_key_text(&key.public());
            println!("countersign serve approver add NAME {public}");
            eprintln!(
                "{me}: enrolled with {url}. Ask the team that runs it to register this desk with \
                 the line above (NAME: yours). The desk connects to it from now on, and shows its \
                 waiting calls beside your own."
            );
            0
        }
        [verb] if verb == "list" => {
            let public = match key(items, false) {
                Ok(Some(key)) => approver::public_key_text(&key.public()),
                Ok(None) => "(no approver key yet)".into(),
                Err(e) => format!("(the keychain: {e})"),
            };
            println!("key\t{public}");
            for url in enrollments.servers.keys() {
                println!("server\t{url}");
            }
            0
        }
        [verb, url] if verb == "forget" => {
            if enrollments.servers.remove(url).is_none() {
                eprintln!("{me}: refused (not_found): this desk is not enrolled with {url}");
                return 2;
            }
            if let Err(e) = enrollments.save(config) {
                eprintln!("{me}: cannot write {FILE}: {e}");
                return 1;
            }
            eprintln!("{me}: {url} forgotten (the key stays: other servers may know it)");
            0
        }
        _ => {
            eprintln!("{usage}");
            2
        }
    }
}
