//! The OS keychain store: where the secret lives by default, so tokens survive a restart of the
//! desk and the secret never sits in a file an agent could read.
//!
//! Built on the keyring 4.x ecosystem: `keyring-core`'s `Entry` API over one credential-store crate
//! per platform (Secret Service over pure-Rust D-Bus on Linux, the login Keychain on macOS, the
//! Credential Manager on Windows). Each [`KeychainStore`] holds its own store object and builds its
//! entry from it, instead of installing keyring-core's process-wide default store, so nothing
//! global is touched and two stores (a test's, the desk's) never interfere.
//!
//! The value is saved as the entry's password: the secret's base64 text (see [`HmacSecret`]).

use std::sync::Arc;

use keyring_core::{CredentialStore, Entry};

use crate::{HmacSecret, SecretError, SecretStore};

/// The keychain service name Countersign's entries are filed under.
pub const SERVICE: &str = "countersign";
/// The account (user) name of the HMAC secret's entry.
pub const DEFAULT_ACCOUNT: &str = "hmac-secret";

/// The secret in the OS keychain, under a service and account name.
pub struct KeychainStore {
    entry: Entry,
    /// "`service`/`account` in the OS keychain", for messages.
    name: String,
}

impl KeychainStore {
    /// The desk's entry: service [`SERVICE`], account [`DEFAULT_ACCOUNT`].
    ///
    /// Fails with [`SecretError::NoKeychain`] when there is no usable keychain (on Linux: no
    /// session bus, or no Secret Service on it).
    pub fn open_default() -> Result<Self, SecretError> {
        Self::open(SERVICE, DEFAULT_ACCOUNT)
    }

    /// The entry with this service and account name. Connects to the keychain (on Linux, opens a
    /// Secret Service session over D-Bus) but reads nothing yet. Tests use a unique account and
    /// delete it afterwards.
    pub fn open(service: &str, account: &str) -> Result<Self, SecretError> {
        let store = open_platform_store()?;
        let name = format!("`{service}`/`{account}` in the OS keychain");
        let entry =
            Entry::new_in_store(&store, service, account).map_err(|e| from_keyring(e, &name))?;
        Ok(Self { entry, name })
    }

    fn fail(&self, err: keyring_core::Error) -> SecretError {
        from_keyring(err, &self.name)
    }
}

impl SecretStore for KeychainStore {
    fn load(&self) -> Result<Option<HmacSecret>, SecretError> {
        match self.entry.get_password() {
            Ok(text) => {
                let text = zeroize::Zeroizing::new(text);
                HmacSecret::from_stored_text(&text, &self.name).map(Some)
            }
            Err(keyring_core::Error::NoEntry) => Ok(None),
            Err(e) => Err(self.fail(e)),
        }
    }

    fn save(&self, secret: &HmacSecret) -> Result<(), SecretError> {
        self.entry
            .set_password(&secret.to_stored_text())
            .map_err(|e| self.fail(e))
    }

    fn delete(&self) -> Result<bool, SecretError> {
        match self.entry.delete_credential() {
            Ok(()) => Ok(true),
            Err(keyring_core::Error::NoEntry) => Ok(false),
            Err(e) => Err(self.fail(e)),
        }
    }
}

impl std::fmt::Debug for KeychainStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeychainStore")
            .field("entry", &self.name)
            .finish()
    }
}

/// This platform's credential store, or [`SecretError::NoKeychain`].
pub(crate) fn open_platform_store() -> Result<Arc<CredentialStore>, SecretError> {
    platform_store().map_err(|e| SecretError::NoKeychain {
        detail: describe_cause(&e),
    })
}

/// This platform's credential store. On Linux this connects to the Secret Service, so it fails
/// when there is no session bus or no provider on it.
fn platform_store() -> keyring_core::Result<Arc<CredentialStore>> {
    #[cfg(target_os = "linux")]
    let store: Arc<CredentialStore> = zbus_secret_service_keyring_store::Store::new()?;
    #[cfg(target_os = "macos")]
    let store: Arc<CredentialStore> = apple_native_keyring_store::keychain::Store::new()?;
    #[cfg(target_os = "windows")]
    let store: Arc<CredentialStore> = windows_native_keyring_store::Store::new()?;
    #[cfg(not(any(target_os = "linux", target_os = "macos", target_os = "windows")))]
    let store: Arc<CredentialStore> = return Err(keyring_core::Error::NotSupportedByStore(
        "Countersign supports the keychains of Linux (Secret Service), macOS and Windows".into(),
    ));
    Ok(store)
}

/// Maps a keychain error from an operation on an entry. Errors that carry the stored bytes
/// (`BadEncoding`, `BadDataFormat`) are reduced to a reason, so no secret reaches a message.
pub(crate) fn from_keyring(err: keyring_core::Error, entry: &str) -> SecretError {
    use keyring_core::Error as K;
    match err {
        K::NoStorageAccess(_) => SecretError::NoKeychain {
            detail: describe_cause(&err),
        },
        K::BadEncoding(_) => SecretError::Malformed {
            entry: entry.to_owned(),
            reason: "it is not UTF-8 text",
        },
        K::BadDataFormat(_, _) => SecretError::Malformed {
            entry: entry.to_owned(),
            reason: "the keychain could not decode it",
        },
        K::Ambiguous(ref matches) => SecretError::Platform {
            entry: entry.to_owned(),
            detail: format!(
                "{} keychain items match it; delete the extra ones in a keychain viewer",
                matches.len()
            ),
        },
        _ => SecretError::Platform {
            entry: entry.to_owned(),
            detail: describe(&err),
        },
    }
}

/// What the platform reported under keyring-core's wrapper ("Platform failure: ..."), which
/// would only repeat what a [`SecretError::NoKeychain`] message already says.
fn describe_cause(err: &keyring_core::Error) -> String {
    match std::error::Error::source(err) {
        Some(cause) => describe(cause),
        None => describe(err),
    }
}

/// The error and its causes, one line. Only for errors that hold no stored value.
fn describe(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
