//! The HMAC secret that signs Countersign's confirmation tokens, and where it is kept.
//!
//! Tokens must survive a restart of the desk, so the secret has to outlive the process; and it must
//! never sit in a file an agent could read, so it lives in the OS keychain (Secret Service, macOS
//! Keychain, Windows Credential Manager). This crate owns that one value: it draws it from the OS
//! RNG on first use, reads it back on later starts, rotates it (which kills every outstanding
//! token) and deletes it. A machine without a usable keychain gets a plain error that says how to
//! fix it; the only alternative is the explicit in-memory store, whose tokens die with the process.
//!
//! ```
//! use countersign_secret::{MemoryStore, SecretStore};
//!
//! let store = MemoryStore::new();
//! let secret = store.load_or_create()?;
//! assert_eq!(store.load()?, Some(secret));
//! # Ok::<(), countersign_secret::SecretError>(())
//! ```

#![forbid(unsafe_code)] // nothing here reaches past the safe language; keep it so

mod error;
mod items;
mod keychain;
mod memory;
mod secret;

pub use error::SecretError;
pub use items::{Items, KeychainItems, MemoryItems};
pub use keychain::{DEFAULT_ACCOUNT, KeychainStore, SERVICE};
pub use memory::MemoryStore;
pub use secret::{HmacSecret, SECRET_LEN};

/// Where the HMAC secret is kept. Two implementations: [`KeychainStore`] (the OS keychain, the
/// default) and [`MemoryStore`] (the explicit opt-in for machines without a keychain, and the test
/// double).
///
/// The required methods are the storage primitives; [`load_or_create`](Self::load_or_create) and
/// [`rotate`](Self::rotate) are built on them and are what the desk calls.
pub trait SecretStore: Send + Sync {
    /// The stored secret, or `None` when none has been stored (or it was deleted).
    ///
    /// A stored value that is not exactly [`SECRET_LEN`] bytes of base64 is an error
    /// ([`SecretError::WrongLength`] or [`SecretError::Malformed`]), never `None`: treating it as
    /// absent would replace it and silently kill outstanding tokens.
    fn load(&self) -> Result<Option<HmacSecret>, SecretError>;

    /// Stores `secret`, replacing whatever was stored.
    fn save(&self, secret: &HmacSecret) -> Result<(), SecretError>;

    /// Removes the stored secret. Returns whether there was one; deleting nothing is not an error.
    fn delete(&self) -> Result<bool, SecretError>;

    /// The stored secret; on first use, a new one from the OS RNG, stored before it is returned.
    ///
    /// A malformed stored value is returned as an error, not replaced: the fix is an explicit
    /// [`rotate`](Self::rotate). Two processes calling this at the same moment on an empty store
    /// could each create a secret, and the later write wins; the desk is a single instance.
    fn load_or_create(&self) -> Result<HmacSecret, SecretError> {
        if let Some(secret) = self.load()? {
            return Ok(secret);
        }
        let secret = HmacSecret::generate()?;
        self.save(&secret)?;
        tracing::info!("created a new HMAC secret");
        Ok(secret)
    }

    /// Replaces the secret with a new one from the OS RNG and returns it. Every token signed with
    /// the old secret stops verifying. Works whatever was stored before, malformed values included.
    fn rotate(&self) -> Result<HmacSecret, SecretError> {
        let secret = HmacSecret::generate()?;
        self.save(&secret)?;
        tracing::info!("rotated the HMAC secret: outstanding tokens no longer verify");
        Ok(secret)
    }
}
