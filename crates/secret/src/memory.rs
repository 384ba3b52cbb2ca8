//! The in-memory store: the explicit opt-in for machines without a usable keychain, and the test
//! double for everything that needs a [`SecretStore`].
//!
//! It exists so the desk can still run when the user chooses it knowingly: the secret lives only in
//! this process, so every token dies when the process exits, and nothing ever reaches the disk. It
//! holds the same stored text form as the keychain, so a wrong stored value is refused here exactly
//! as it is there.

use std::sync::{Mutex, MutexGuard};

use zeroize::Zeroizing;

use crate::{HmacSecret, SecretError, SecretStore};

/// How this store names itself in error messages.
const ENTRY: &str = "the in-memory store";

/// A [`SecretStore`] in this process's memory. Tokens signed with its secret die with the process.
#[derive(Default)]
pub struct MemoryStore {
    stored: Mutex<Option<Zeroizing<String>>>,
}

impl MemoryStore {
    /// An empty store: the first [`load_or_create`](SecretStore::load_or_create) creates the
    /// secret.
    pub fn new() -> Self {
        Self::default()
    }

    /// A store already holding `text` as its stored value, as a keychain entry written earlier
    /// (or damaged) would. For tests of how a wrong stored value is handled.
    pub fn with_stored_text(text: &str) -> Self {
        Self {
            stored: Mutex::new(Some(Zeroizing::new(text.to_owned()))),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Zeroizing<String>>> {
        // The guarded value is replaced whole, so a panic elsewhere cannot leave it half-written.
        countersign_core::sync::lock(&self.stored)
    }
}

impl SecretStore for MemoryStore {
    fn load(&self) -> Result<Option<HmacSecret>, SecretError> {
        self.lock()
            .as_ref()
            .map(|text| HmacSecret::from_stored_text(text, ENTRY))
            .transpose()
    }

    fn save(&self, secret: &HmacSecret) -> Result<(), SecretError> {
        *self.lock() = Some(secret.to_stored_text());
        Ok(())
    }

    fn delete(&self) -> Result<bool, SecretError> {
        Ok(self.lock().take().is_some())
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("holds_a_value", &self.lock().is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;

    use super::*;
    use crate::SECRET_LEN;

    #[test]
    fn first_use_creates_a_secret() {
        let store = MemoryStore::new();
        assert_eq!(store.load().unwrap(), None);
        let created = store.load_or_create().unwrap();
        assert_eq!(store.load().unwrap(), Some(created));
    }

    #[test]
    fn later_calls_read_back_the_same_secret() {
        let store = MemoryStore::new();
        let first = store.load_or_create().unwrap();
        let again = store.load_or_create().unwrap();
        assert_eq!(first, again);
        assert_eq!(first.expose_bytes(), again.expose_bytes());
    }

    #[test]
    fn rotate_replaces_the_secret() {
        let store = MemoryStore::new();
        let old = store.load_or_create().unwrap();
        let new = store.rotate().unwrap();
        assert_ne!(old, new);
        assert_eq!(store.load().unwrap(), Some(new));
    }

    #[test]
    fn rotate_on_an_empty_store_creates_one() {
        let store = MemoryStore::new();
        let new = store.rotate().unwrap();
        assert_eq!(store.load_or_create().unwrap(), new);
    }

    #[test]
    fn delete_removes_the_secret_and_says_whether_there_was_one() {
        let store = MemoryStore::new();
        assert!(!store.delete().unwrap());
        let old = store.load_or_create().unwrap();
        assert!(store.delete().unwrap());
        assert_eq!(store.load().unwrap(), None);
        assert!(!store.delete().unwrap());
        assert_ne!(store.load_or_create().unwrap(), old);
    }

    #[test]
    fn save_then_load_gives_the_same_bytes() {
        let store = MemoryStore::new();
        store
            .save(&HmacSecret::from_bytes([5; SECRET_LEN]))
            .unwrap();
        assert_eq!(
            store.load().unwrap().unwrap().expose_bytes(),
            &[5; SECRET_LEN]
        );
    }

    #[test]
    fn a_stored_value_of_the_wrong_length_is_refused_not_replaced() {
        let short = STANDARD.encode([1u8; 16]);
        let store = MemoryStore::with_stored_text(&short);
        for err in [
            store.load().unwrap_err(),
            store.load_or_create().unwrap_err(),
        ] {
            assert_eq!(
                err,
                SecretError::WrongLength {
                    entry: ENTRY.into(),
                    found: 16
                }
            );
        }
        // Still there, still refused: only rotate replaces it.
        assert!(store.load().is_err());
        let rotated = store.rotate().unwrap();
        assert_eq!(store.load().unwrap(), Some(rotated));
    }

    #[test]
    fn a_malformed_stored_value_is_refused_not_replaced() {
        let store = MemoryStore::with_stored_text("not base64 at all");
        assert!(matches!(
            store.load_or_create(),
            Err(SecretError::Malformed { .. })
        ));
        assert!(matches!(store.load(), Err(SecretError::Malformed { .. })));
        store.rotate().unwrap();
        assert!(store.load().unwrap().is_some());
    }

    #[test]
    fn errors_and_debug_never_show_the_secret() {
        let store = MemoryStore::new();
        let secret = store.load_or_create().unwrap();
        let text = secret.to_stored_text();
        let printed = format!("{store:?} {secret:?}");
        assert!(!printed.contains(text.as_str()), "{printed}");
        assert!(printed.contains("<redacted>"), "{printed}");

        let bad = format!("{}AA==", &text[..40]);
        let store = MemoryStore::with_stored_text(&bad);
        let message = store.load().unwrap_err().to_string();
        assert!(!message.contains(&bad[..40]), "{message}");
    }
}
