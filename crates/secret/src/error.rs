//! What can go wrong with the secret, as types the desk can act on without reading strings.
//!
//! The split that matters: "no keychain" (the user must fix their session, or opt into the
//! in-memory secret) is distinct from a keychain that answered with a failure, and both are
//! distinct from a stored value that is wrong (the user must rotate). No variant carries secret
//! bytes: the keychain library's errors that hold the raw value are reduced to a reason first.

/// How to get a keychain, for the current platform.
#[cfg(target_os = "linux")]
const KEYCHAIN_FIX: &str = "Countersign keeps its secret in the Secret Service: run it in a desktop \
    session whose keyring (GNOME Keyring, KeePassXC or KWallet) is running and unlocked, with \
    DBUS_SESSION_BUS_ADDRESS pointing at that session's bus.";
#[cfg(target_os = "macos")]
const KEYCHAIN_FIX: &str = "Countersign keeps its secret in the macOS Keychain: unlock your login \
    keychain and allow Countersign to use it.";
#[cfg(target_os = "windows")]
const KEYCHAIN_FIX: &str = "Countersign keeps its secret in the Windows Credential Manager: run it \
    as a signed-in user whose profile is loaded.";
#[cfg(not(any(target_os = "linux", target_os = "macos", target_os = "windows")))]
const KEYCHAIN_FIX: &str = "Countersign has no OS keychain support on this platform.";

/// What the user can do instead of fixing the keychain.
const IN_MEMORY_OPT_IN: &str = "Or start Countersign with its explicit in-memory secret option: \
    it then works without a keychain, but every token dies when it exits.";

/// An error from a [`SecretStore`](crate::SecretStore). Its messages never contain secret bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// There is no usable OS keychain: no Secret Service or no session bus, or the keychain is
    /// locked or access to it was refused. The message says how to fix it and names the
    /// in-memory opt-in.
    #[error("the OS keychain is not available ({detail}). {KEYCHAIN_FIX} {IN_MEMORY_OPT_IN}")]
    NoKeychain {
        /// What the keychain layer reported.
        detail: String,
    },
    /// The keychain was reached but the operation failed.
    #[error("the OS keychain failed on {entry}: {detail}")]
    Platform {
        /// The entry, e.g. "`countersign`/`hmac-secret` in the OS keychain".
        entry: String,
        /// What the keychain layer reported.
        detail: String,
    },
    /// The stored value decodes to the wrong number of bytes. It is left in place.
    #[error(
        "the secret stored in {entry} is {found} bytes long, not {len}; it was left in place, \
         because replacing it would silently invalidate every outstanding token: rotate the \
         secret to replace it",
        len = crate::SECRET_LEN
    )]
    WrongLength {
        /// The entry, e.g. "`countersign`/`hmac-secret` in the OS keychain".
        entry: String,
        /// How many bytes it decoded to.
        found: usize,
    },
    /// The stored value is not the expected text form (standard base64 with padding). It is left
    /// in place.
    #[error(
        "the secret stored in {entry} is malformed: {reason}; it was left in place, because \
         replacing it would silently invalidate every outstanding token: rotate the secret to \
         replace it"
    )]
    Malformed {
        /// The entry, e.g. "`countersign`/`hmac-secret` in the OS keychain".
        entry: String,
        /// What is wrong with it, without its content.
        reason: &'static str,
    },
    /// The operating system's random number generator failed, so no secret was made.
    #[error("the operating system's random number generator failed: {detail}")]
    Rng {
        /// What the RNG reported.
        detail: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_keychain_says_how_to_fix_it_and_names_the_in_memory_opt_in() {
        let message = SecretError::NoKeychain {
            detail: "no secret service provider or dbus session found".into(),
        }
        .to_string();
        assert!(
            message.starts_with("the OS keychain is not available"),
            "{message}"
        );
        assert!(message.contains(KEYCHAIN_FIX), "{message}");
        assert!(message.contains("in-memory secret option"), "{message}");
        assert!(
            message.contains("every token dies when it exits"),
            "{message}"
        );
    }

    #[test]
    fn a_wrong_value_says_to_rotate() {
        let message = SecretError::WrongLength {
            entry: "the in-memory store".into(),
            found: 16,
        }
        .to_string();
        assert!(message.contains("16 bytes long, not 32"), "{message}");
        assert!(message.contains("rotate the secret"), "{message}");
    }
}
