//! The desk's Ed25519 keys in the OS keychain: the approver key (signing decisions for team
//! servers) and the chain key (signing the history's head). Each is 32 secret bytes, kept as one
//! keychain item in base64, made on first need and never written anywhere else.

use base64::Engine as _;
use countersign_secret::{Items, SecretError};
use zeroize::Zeroizing;

/// The keychain item that holds the chain key's 32 secret bytes (base64).
pub const CHAIN_ITEM: &str = "history-chain-key";

/// Why a key kept in the keychain could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SeedError {
    /// The keychain could not be read or written (missing, locked, or failing).
    #[error("{0}")]
    Keychain(#[from] SecretError),
    /// The item holds something else than 32 bytes in base64. It is left in place: replacing it
    /// would make a new key, which the servers (or the history's head) do not know.
    #[error("the {what} in the keychain is damaged")]
    Damaged {
        /// The key, as errors name it.
        what: String,
    },
}

/// The 32 secret bytes kept in `item`; made from the OS RNG and stored first when `create` and
/// there are none. `what` names the key in errors.
pub fn stored(
    items: &dyn Items,
    item: &str,
    what: &str,
    create: bool,
) -> Result<Option<Zeroizing<[u8; 32]>>, SeedError> {
    match read(items, item, what)? {
        Some(seed) => Ok(Some(seed)),
        None if create => make(items, item).map(Some),
        None => Ok(None),
    }
}

/// The 32 secret bytes kept in `item`, if there are any.
fn read(
    items: &dyn Items,
    item: &str,
    what: &str,
) -> Result<Option<Zeroizing<[u8; 32]>>, SeedError> {
    let Some(text) = items.get(item)? else {
        return Ok(None);
    };
    let damaged = || SeedError::Damaged {
        what: what.to_owned(),
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    let bytes = Zeroizing::new(b64.decode(text.trim()).map_err(|_| damaged())?);
    let seed: [u8; 32] = bytes.as_slice().try_into().map_err(|_| damaged())?;
    Ok(Some(Zeroizing::new(seed)))
}

/// 32 new secret bytes from the OS RNG, stored in `item` before they are returned.
fn make(items: &dyn Items, item: &str) -> Result<Zeroizing<[u8; 32]>, SeedError> {
    let seed = Zeroizing::new(rand::random::<[u8; 32]>());
    let text = Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(seed.as_slice()));
    items.set(item, &text)?;
    Ok(seed)
}

/// The desk's chain key, made on first need.
pub fn chain_key(items: &dyn Items) -> Result<countersign_core::chain::ChainKey, SeedError> {
    let seed = match read(items, CHAIN_ITEM, "history's chain key")? {
        Some(seed) => seed,
        None => make(items, CHAIN_ITEM)?,
    };
    Ok(countersign_core::chain::ChainKey::from_seed(&seed))
}

#[cfg(test)]
mod tests {
    use countersign_secret::MemoryItems;

    use super::*;

    #[test]
    fn a_key_is_made_once_and_read_back_the_same() {
        let items = MemoryItems::new();
        assert_eq!(stored(&items, "k", "key", false).unwrap(), None);
        let made = stored(&items, "k", "key", true).unwrap().unwrap();
        let again = stored(&items, "k", "key", true).unwrap().unwrap();
        assert_eq!(*made, *again);
        assert_eq!(chain_key(&items).unwrap(), chain_key(&items).unwrap());
    }

    #[test]
    fn a_damaged_item_is_said_so_and_not_replaced() {
        let items = MemoryItems::new();
        items.set("k", "not base64!").unwrap();
        let err = stored(&items, "k", "test key", true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("test key in the keychain is damaged"), "{err}");
        assert_eq!(
            items.get("k").unwrap().as_deref().map(|t| t.as_str()),
            Some("not base64!")
        );
    }
}
