//! Other values the desk keeps in the OS keychain: registered servers' credentials (one item per
//! environment value or header) and the originals of client configurations that `countersign
//! install` rewrote. Like the HMAC secret, none of them may sit in a file an agent could read.
//!
//! Each value is one item under the desk's service ([`SERVICE`]), named by an account string the
//! caller chooses (e.g. `server/github/env/GITHUB_TOKEN`). Values are text, handed out in
//! [`Zeroizing`] strings, and never appear in an error or a `Debug` print.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use keyring_core::{CredentialStore, Entry};
use zeroize::Zeroizing;

use crate::SecretError;
use crate::keychain::{SERVICE, from_keyring, open_platform_store};

/// Where the desk's other secret values are kept: [`KeychainItems`], or [`MemoryItems`] (tests,
/// and the explicit in-memory opt-in, where they die with the desk).
pub trait Items: Send + Sync {
    /// The value named `account`, or `None` when there is none.
    fn get(&self, account: &str) -> Result<Option<Zeroizing<String>>, SecretError>;
    /// Stores `value` as `account`, replacing what was there.
    fn set(&self, account: &str, value: &str) -> Result<(), SecretError>;
    /// Removes `account`; whether there was one.
    fn delete(&self, account: &str) -> Result<bool, SecretError>;
}

/// Items in the OS keychain, under [`SERVICE`] (or another service, for tests).
pub struct KeychainItems {
    store: Arc<CredentialStore>,
    service: String,
}

impl KeychainItems {
    /// The desk's items: service [`SERVICE`]. Fails with [`SecretError::NoKeychain`] when there
    /// is no usable keychain.
    pub fn open_default() -> Result<Self, SecretError> {
        Self::open(SERVICE)
    }

    /// Items under `service`.
    pub fn open(service: &str) -> Result<Self, SecretError> {
        Ok(Self {
            store: open_platform_store()?,
            service: service.to_owned(),
        })
    }

    fn entry(&self, account: &str) -> Result<(Entry, String), SecretError> {
        let name = format!("`{}`/`{account}` in the OS keychain", self.service);
        let entry = Entry::new_in_store(&self.store, &self.service, account)
            .map_err(|e| from_keyring(e, &name))?;
        Ok((entry, name))
    }
}

impl Items for KeychainItems {
    fn get(&self, account: &str) -> Result<Option<Zeroizing<String>>, SecretError> {
        let (entry, name) = self.entry(account)?;
        match entry.get_password() {
            Ok(text) => Ok(Some(Zeroizing::new(text))),
            Err(keyring_core::Error::NoEntry) => Ok(None),
            Err(e) => Err(from_keyring(e, &name)),
        }
    }

    fn set(&self, account: &str, value: &str) -> Result<(), SecretError> {
        let (entry, name) = self.entry(account)?;
        entry
            .set_password(value)
            .map_err(|e| from_keyring(e, &name))
    }

    fn delete(&self, account: &str) -> Result<bool, SecretError> {
        let (entry, name) = self.entry(account)?;
        match entry.delete_credential() {
            Ok(()) => Ok(true),
            Err(keyring_core::Error::NoEntry) => Ok(false),
            Err(e) => Err(from_keyring(e, &name)),
        }
    }
}

impl std::fmt::Debug for KeychainItems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeychainItems")
            .field("service", &self.service)
            .finish()
    }
}

/// Items in this process's memory: gone when it exits.
#[derive(Default)]
pub struct MemoryItems {
    values: Mutex<BTreeMap<String, Zeroizing<String>>>,
}

impl MemoryItems {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Zeroizing<String>>> {
        countersign_core::sync::lock(&self.values)
    }
}

impl Items for MemoryItems {
    fn get(&self, account: &str) -> Result<Option<Zeroizing<String>>, SecretError> {
        Ok(self.lock().get(account).cloned())
    }

    fn set(&self, account: &str, value: &str) -> Result<(), SecretError> {
        self.lock()
            .insert(account.to_owned(), Zeroizing::new(value.to_owned()));
        Ok(())
    }

    fn delete(&self, account: &str) -> Result<bool, SecretError> {
        Ok(self.lock().remove(account).is_some())
    }
}

impl std::fmt::Debug for MemoryItems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryItems")
            .field("accounts", &self.lock().keys().collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_items_store_replace_and_delete() {
        let items = MemoryItems::new();
        assert_eq!(items.get("a").unwrap(), None);
        items.set("a", "one").unwrap();
        items.set("a", "two").unwrap();
        assert_eq!(
            items.get("a").unwrap().as_deref().map(String::as_str),
            Some("two")
        );
        assert!(items.delete("a").unwrap());
        assert!(!items.delete("a").unwrap());
    }

    #[test]
    fn debug_shows_names_never_values() {
        let items = MemoryItems::new();
        items.set("server/gh/env/TOKEN", "ghp_hunter2").unwrap();
        let shown = format!("{items:?}");
        assert!(
            shown.contains("TOKEN") && !shown.contains("hunter2"),
            "{shown}"
        );
    }
}
