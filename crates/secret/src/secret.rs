//! The secret value itself, and the text form it is stored in.
//!
//! A separate type (rather than a byte vector) so the secret cannot leak by accident: it is wiped
//! from memory when dropped, its `Debug` prints nothing of it, and it has no `Display` and no
//! serialization. The stored form is shared by both stores so a value that is wrong in the keychain
//! is refused the same way, and tested the same way, as one in memory.
//!
//! Stored form: the 32 bytes in standard base64 with padding (44 characters), saved as the
//! keychain entry's password (text) rather than as raw bytes. Some Secret Service providers (KDE
//! Wallet) only hold UTF-8 text, and text keeps the entry readable in a keychain viewer.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use countersign_core::token::{MIN_KEY_LEN, SigningKey};
use rand::TryRngCore as _;
use rand::rngs::OsRng;
use subtle::ConstantTimeEq as _;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use crate::SecretError;

/// The length of the secret in bytes.
pub const SECRET_LEN: usize = 32;

// A secret of SECRET_LEN bytes is always long enough to be a signing key.
const _: () = assert!(SECRET_LEN >= MIN_KEY_LEN);

/// The 32-byte HMAC secret. Zeroized on drop; `Debug` prints `HmacSecret(<redacted>)`; there is no
/// `Display` and no serialization. Equality is compared in constant time.
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct HmacSecret([u8; SECRET_LEN]);

impl HmacSecret {
    /// A new secret from the operating system's RNG.
    pub fn generate() -> Result<Self, SecretError> {
        let mut secret = Self([0; SECRET_LEN]);
        OsRng
            .try_fill_bytes(&mut secret.0)
            .map_err(|e| SecretError::Rng {
                detail: e.to_string(),
            })?;
        Ok(secret)
    }

    /// A secret with the given bytes, for tests and fixtures. Real secrets come from
    /// [`generate`](Self::generate). The caller's array is a copy this type cannot wipe.
    pub fn from_bytes(bytes: [u8; SECRET_LEN]) -> Self {
        Self(bytes)
    }

    /// The raw bytes. Named so that every place that reads the secret out stands out in review.
    pub fn expose_bytes(&self) -> &[u8; SECRET_LEN] {
        &self.0
    }

    /// The key that signs and verifies confirmation tokens.
    pub fn signing_key(&self) -> SigningKey {
        SigningKey::new(&self.0).expect("SECRET_LEN >= MIN_KEY_LEN, checked at compile time")
    }

    /// The stored text form: standard base64 with padding. Wiped when dropped.
    pub(crate) fn to_stored_text(&self) -> Zeroizing<String> {
        Zeroizing::new(STANDARD.encode(self.0))
    }

    /// Parses the stored text form. `entry` names where it came from, for the error message.
    pub(crate) fn from_stored_text(text: &str, entry: &str) -> Result<Self, SecretError> {
        let bytes = Zeroizing::new(STANDARD.decode(text).map_err(|_| SecretError::Malformed {
            entry: entry.to_owned(),
            reason: "it is not standard base64 text",
        })?);
        let array: [u8; SECRET_LEN] =
            bytes
                .as_slice()
                .try_into()
                .map_err(|_| SecretError::WrongLength {
                    entry: entry.to_owned(),
                    found: bytes.len(),
                })?;
        Ok(Self(array))
    }
}

impl fmt::Debug for HmacSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HmacSecret(<redacted>)")
    }
}

impl PartialEq for HmacSecret {
    fn eq(&self, other: &Self) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}

impl Eq for HmacSecret {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_does_not_leak_the_bytes() {
        let secret = HmacSecret::from_bytes([0xab; SECRET_LEN]);
        let printed = format!("{secret:?} {secret:#?}");
        assert!(printed.contains("<redacted>"), "{printed}");
        for leak in ["ab", "AB", "171", "q6ur"] {
            assert!(!printed.contains(leak), "{printed} contains {leak}");
        }
    }

    #[test]
    fn generated_secrets_differ() {
        let a = HmacSecret::generate().unwrap();
        let b = HmacSecret::generate().unwrap();
        assert_ne!(a, b);
        assert_ne!(a.expose_bytes(), &[0; SECRET_LEN]);
    }

    #[test]
    fn stored_text_round_trips_as_44_base64_characters() {
        let secret = HmacSecret::generate().unwrap();
        let text = secret.to_stored_text();
        assert_eq!(text.len(), 44);
        assert_eq!(HmacSecret::from_stored_text(&text, "test").unwrap(), secret);
    }

    #[test]
    fn stored_text_of_the_wrong_length_is_refused() {
        for len in [0, 16, 31, 33, 64] {
            let text = STANDARD.encode(vec![7u8; len]);
            let err = HmacSecret::from_stored_text(&text, "test").unwrap_err();
            assert!(
                matches!(err, SecretError::WrongLength { found, .. } if found == len),
                "{err:?}"
            );
        }
    }

    #[test]
    fn stored_text_that_is_not_base64_is_refused() {
        let good = HmacSecret::generate().unwrap().to_stored_text();
        for text in [
            "not base64!",
            "AAAA=AAA",
            &format!("{}\n", &*good),
            &good[..43],
        ] {
            let err = HmacSecret::from_stored_text(text, "test").unwrap_err();
            assert!(
                matches!(err, SecretError::Malformed { .. }),
                "{text:?}: {err:?}"
            );
        }
    }

    #[test]
    fn the_signing_key_is_made_from_the_secret() {
        let secret = HmacSecret::from_bytes([9; SECRET_LEN]);
        let key = secret.signing_key();
        assert!(!format!("{key:?}").contains("9, 9"));
    }
}
