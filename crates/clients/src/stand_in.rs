//! A desk held in memory, for tests of install and uninstall (feature `test-support`): the
//! registry takes every server it is given, and the keychain of backups keeps, gives back and
//! drops what it is told. One stand-in for every crate that tests these, so that what "the desk"
//! does in a test is written once.

use std::collections::BTreeMap;

use countersign_wire::{
    DeskError, RegistryAnswer, RegistryCode, RegistryRequest, SecretText, ServerSpec,
};

use crate::Registrar;

/// The desk, as far as install and uninstall are concerned.
#[derive(Debug, Default)]
pub struct StandInDesk {
    /// The servers registered, by name.
    pub servers: BTreeMap<String, ServerSpec>,
    /// The backups kept, by key.
    pub backups: BTreeMap<String, String>,
}

impl Registrar for StandInDesk {
    fn ask(
        &mut self,
        request: RegistryRequest,
        _waiting: &mut dyn FnMut(&str),
    ) -> Result<RegistryAnswer, DeskError> {
        Ok(match request {
            RegistryRequest::List => RegistryAnswer::Servers {
                servers: self.servers.clone(),
            },
            RegistryRequest::Put { name, spec, .. } => {
                self.servers.insert(name, spec);
                RegistryAnswer::Done {
                    message: "done".into(),
                }
            }
            RegistryRequest::KeepBackup { key, text } => {
                self.backups.insert(key, text.expose().to_owned());
                RegistryAnswer::Backup { text: None }
            }
            RegistryRequest::TakeBackup { key } => RegistryAnswer::Backup {
                text: self.backups.get(&key).map(|t| SecretText::new(t.clone())),
            },
            RegistryRequest::DropBackup { key } => {
                self.backups.remove(&key);
                RegistryAnswer::Backup { text: None }
            }
            _ => RegistryAnswer::Refused {
                code: RegistryCode::BadRequest,
                message: "not in this stand-in".into(),
            },
        })
    }
}
