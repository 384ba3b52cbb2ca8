//! The keychain store against the real OS keychain (on Linux, a running, unlocked Secret Service).
//!
//! Ignored by a plain `cargo test`, because it needs that keychain; the project's test command
//! runs it inside a throwaway D-Bus session with an unlocked gnome-keyring:
//! `.ci/with-keychain cargo test -p countersign-secret -- --include-ignored`.
//! Each test uses its own account name and deletes its entry when it ends, even on failure, so it
//! never touches the desk's real entry.

use std::time::{SystemTime, UNIX_EPOCH};

use countersign_secret::{KeychainStore, SERVICE, SecretError, SecretStore};

/// A unique test entry, deleted on drop.
struct TestEntry {
    account: String,
}

impl TestEntry {
    fn new(test: &str) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        Self {
            account: format!("test-{test}-{}-{nanos}", std::process::id()),
        }
    }

    /// A fresh store object on this entry: what a later start of the desk would open.
    fn open(&self) -> KeychainStore {
        KeychainStore::open(SERVICE, &self.account).expect("open the OS keychain")
    }
}

impl Drop for TestEntry {
    fn drop(&mut self) {
        if let Ok(store) = KeychainStore::open(SERVICE, &self.account) {
            let _ = store.delete();
        }
    }
}

#[test]
#[ignore = "needs an unlocked Secret Service (run by the test command in a D-Bus session)"]
fn first_use_creates_the_secret_and_a_later_start_reads_the_same_bytes() {
    let entry = TestEntry::new("create");
    let first_start = entry.open();
    assert_eq!(first_start.load().unwrap(), None);
    let created = first_start.load_or_create().unwrap();
    assert_eq!(first_start.load().unwrap().as_ref(), Some(&created));

    let later_start = entry.open();
    let read = later_start.load().unwrap().expect("the secret persists");
    assert_eq!(read.expose_bytes(), created.expose_bytes());
    assert_eq!(later_start.load_or_create().unwrap(), created);
}

#[test]
#[ignore = "needs an unlocked Secret Service (run by the test command in a D-Bus session)"]
fn rotate_replaces_the_secret_for_later_starts() {
    let entry = TestEntry::new("rotate");
    let store = entry.open();
    let old = store.load_or_create().unwrap();
    let new = store.rotate().unwrap();
    assert_ne!(old, new);
    assert_eq!(store.load().unwrap().as_ref(), Some(&new));
    assert_eq!(entry.open().load_or_create().unwrap(), new);
}

#[test]
#[ignore = "needs an unlocked Secret Service (run by the test command in a D-Bus session)"]
fn delete_removes_the_entry_and_load_then_finds_none() {
    let entry = TestEntry::new("delete");
    let store = entry.open();
    let old = store.load_or_create().unwrap();
    assert!(store.delete().unwrap());
    assert_eq!(store.load().unwrap(), None);
    assert_eq!(entry.open().load().unwrap(), None);
    assert!(!store.delete().unwrap(), "deleting nothing is not an error");
    let fresh = entry.open().load_or_create().unwrap();
    assert_ne!(fresh, old);
}

#[test]
#[ignore = "needs an unlocked Secret Service (run by the test command in a D-Bus session)"]
fn a_wrong_value_in_the_keychain_is_refused_and_left_until_rotated() {
    let entry = TestEntry::new("wrong");
    // Written around the store, as another program or a hand edit would.
    let raw = keyring_entry(&entry.account);

    raw.set_password("c2l4dGVlbiBieXRlcyBvbmx5").unwrap(); // base64 of 18 bytes
    let store = entry.open();
    for err in [
        store.load().unwrap_err(),
        store.load_or_create().unwrap_err(),
    ] {
        assert!(
            matches!(err, SecretError::WrongLength { found: 18, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("rotate"), "{err}");
    }
    assert_eq!(raw.get_password().unwrap(), "c2l4dGVlbiBieXRlcyBvbmx5");

    raw.set_secret(&[0xff, 0xfe, 0x00, 0x80]).unwrap(); // not text at all
    let err = store.load_or_create().unwrap_err();
    assert!(matches!(err, SecretError::Malformed { .. }), "{err:?}");

    raw.set_password("not base64!").unwrap();
    let err = store.load_or_create().unwrap_err();
    assert!(matches!(err, SecretError::Malformed { .. }), "{err:?}");
    assert_eq!(raw.get_password().unwrap(), "not base64!");

    let rotated = store.rotate().unwrap();
    assert_eq!(entry.open().load().unwrap(), Some(rotated));
}

/// The same entry, opened with keyring-core directly.
fn keyring_entry(account: &str) -> keyring_core::Entry {
    #[cfg(target_os = "linux")]
    let store: std::sync::Arc<keyring_core::CredentialStore> =
        zbus_secret_service_keyring_store::Store::new().unwrap();
    #[cfg(target_os = "macos")]
    let store: std::sync::Arc<keyring_core::CredentialStore> =
        apple_native_keyring_store::keychain::Store::new().unwrap();
    #[cfg(target_os = "windows")]
    let store: std::sync::Arc<keyring_core::CredentialStore> =
        windows_native_keyring_store::Store::new().unwrap();
    keyring_core::Entry::new_in_store(&store, SERVICE, account).unwrap()
}
