//! The `requestState` of the MCP 2026-07-28 flow: the desk's sealed note of which request a
//! client's retry continues.
//!
//! A 2026-07-28 client retries a call that answered `input_required` with the `requestState` it
//! was given, verbatim. That string comes back through the agent, so it is hostile input: the desk
//! seals it here and opens only what it sealed. A state is `csr1.<payload>.<tag>`: the base64url
//! (no padding) JSON [`StateClaims`] and the base64url HMAC-SHA256 tag over a domain label and
//! `csr1.<payload>`, under a key derived from the signing secret for this one purpose (never the
//! token key itself). Like tokens, it is signed, not encrypted (nothing in it is secret), and it
//! has one spelling: exact base64url, an exact tag length checked in constant time before the
//! claims are parsed, claims of exact types with no unknown or duplicate fields. Expiry is checked
//! here with time passed in; binding (tenant, tool, plan, request) and single use are the
//! caller's, which knows the call the state comes back with.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::Mac;
use serde::{Deserialize, Serialize};

use crate::plan::PlanHash;
use crate::token::{Nonce, SigningKey};

/// The version prefix of every state this module seals.
pub const VERSION: &str = "csr1";
/// What the derived key is for: a different label would give an unrelated key.
const LABEL: &[u8] = b"countersign/request-state/v1";
/// Longer strings are refused before any decoding work.
pub const MAX_STATE_LEN: usize = 2048;
const TAG_LEN: usize = 32;

/// What a state asserts. Every field is required and of an exact type; unknown fields are
/// refused. Times are milliseconds since the Unix epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateClaims {
    /// The connection (agent session) the state was given to.
    pub tenant: String,
    /// The tool of the call it continues.
    pub tool: String,
    /// The hash of the plan the person is shown.
    pub plan: PlanHash,
    /// The desk queue's id of the request.
    pub request: u64,
    /// When the state stops working (exclusive).
    pub exp: u64,
    /// 128 random bits: what single use is kept by.
    pub nonce: Nonce,
    /// How many times the desk has answered `input_required` for this call, this one included.
    pub round: u32,
}

/// Why a state string was refused. Every variant means the state was not sealed by this desk's
/// current key as it is, or is no longer usable; nothing of it is trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// Longer than [`MAX_STATE_LEN`].
    #[error("requestState is longer than {MAX_STATE_LEN} bytes")]
    TooLong,
    /// Not `csr1.<payload>.<tag>` in exact unpadded base64url, or a tag of the wrong length.
    #[error("requestState is not a state this desk seals")]
    Malformed,
    /// The tag does not match: forged, altered, or sealed under another key (the secret was
    /// rotated since).
    #[error("requestState was not sealed by this desk's current key")]
    BadSignature,
    /// Sealed, but the claims are not exactly the expected shape.
    #[error("requestState claims are malformed")]
    BadClaims,
    /// Its lifetime is over.
    #[error("requestState has expired")]
    Expired,
}

fn mac_of(key: &SigningKey, payload_b64: &str) -> hmac::Hmac<sha2::Sha256> {
    let mut mac = key.derived(LABEL);
    mac.update(VERSION.as_bytes());
    mac.update(b".");
    mac.update(payload_b64.as_bytes());
    mac
}

/// Seals `claims` into a state string.
pub fn seal(key: &SigningKey, claims: &StateClaims) -> String {
    let payload = serde_json::to_vec(claims).expect("state claims always serialize");
    let payload_b64 = URL_SAFE_NO_PAD.encode(payload);
    let tag = mac_of(key, &payload_b64).finalize().into_bytes();
    format!("{VERSION}.{payload_b64}.{}", URL_SAFE_NO_PAD.encode(tag))
}

/// Checks the tag of `text` and its expiry at `now_ms`, and returns its claims.
pub fn open(key: &SigningKey, text: &str, now_ms: u64) -> Result<StateClaims, StateError> {
    if text.len() > MAX_STATE_LEN {
        return Err(StateError::TooLong);
    }
    let mut parts = text.split('.');
    let (Some(VERSION), Some(payload_b64), Some(tag_b64), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(StateError::Malformed);
    };
    let tag = URL_SAFE_NO_PAD
        .decode(tag_b64)
        .map_err(|_| StateError::Malformed)?;
    if tag.len() != TAG_LEN {
        return Err(StateError::Malformed);
    }
    let payload = URL_SAFE_NO_PAD
        .decode(payload_b64)
        .map_err(|_| StateError::Malformed)?;
    mac_of(key, payload_b64)
        .verify_slice(&tag)
        .map_err(|_| StateError::BadSignature)?;
    // Strictly parsed: a key given twice is refused, not settled by whichever comes last.
    let claims: StateClaims = std::str::from_utf8(&payload)
        .ok()
        .and_then(|text| crate::canonical::parse_strict(text).ok())
        .and_then(|value| serde_json::from_value(value).ok())
        .ok_or(StateError::BadClaims)?;
    if now_ms >= claims.exp {
        return Err(StateError::Expired);
    }
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SigningKey {
        SigningKey::new(&[0x42; 32]).unwrap()
    }

    fn claims() -> StateClaims {
        StateClaims {
            tenant: "conn-1".into(),
            tool: "execute".into(),
            plan: PlanHash::from_bytes([9; 32]),
            request: 7,
            exp: 10_000,
            nonce: Nonce::from_bytes([3; 16]),
            round: 1,
        }
    }

    fn sign_raw(key: &SigningKey, payload: &[u8]) -> String {
        let payload_b64 = URL_SAFE_NO_PAD.encode(payload);
        let tag = mac_of(key, &payload_b64).finalize().into_bytes();
        format!("{VERSION}.{payload_b64}.{}", URL_SAFE_NO_PAD.encode(tag))
    }

    #[test]
    fn a_sealed_state_opens_to_its_claims() {
        let state = seal(&key(), &claims());
        assert!(state.starts_with("csr1."));
        assert_eq!(open(&key(), &state, 9_999), Ok(claims()));
    }

    #[test]
    fn an_expired_state_is_refused() {
        let state = seal(&key(), &claims());
        assert_eq!(open(&key(), &state, 10_000), Err(StateError::Expired));
    }

    #[test]
    fn a_state_sealed_under_another_key_is_refused() {
        let other = SigningKey::new(&[0x43; 32]).unwrap();
        let state = seal(&other, &claims());
        assert_eq!(open(&key(), &state, 0), Err(StateError::BadSignature));
    }

    #[test]
    fn a_token_tag_never_verifies_as_a_state_tag() {
        // Same key, same text signed the token way: the derived key differs.
        let payload_b64 = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims()).unwrap());
        let tag =
            crate::token::hmac_sha256(&[0x42; 32], format!("{VERSION}.{payload_b64}").as_bytes());
        let forged = format!("{VERSION}.{payload_b64}.{}", URL_SAFE_NO_PAD.encode(tag));
        assert_eq!(open(&key(), &forged, 0), Err(StateError::BadSignature));
    }

    #[test]
    fn a_tampered_payload_is_refused() {
        let state = seal(&key(), &claims());
        let (_, tag) = state.rsplit_once('.').unwrap();
        let mut other = claims();
        other.tool = "delete_backup".into();
        let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&other).unwrap());
        let forged = format!("{VERSION}.{payload}.{tag}");
        assert_eq!(open(&key(), &forged, 0), Err(StateError::BadSignature));
    }

    #[test]
    fn malformed_and_oversized_states_are_refused() {
        let state = seal(&key(), &claims());
        for bad in [
            String::new(),
            "csr1".into(),
            "csr1..".into(),
            format!("cs1{}", &state[4..]),
            format!("{state}."),
            format!("{state}="),
            state.replace('.', ".."),
            format!("{}A", &state[..state.len() - 1]),
        ] {
            assert!(open(&key(), &bad, 0).is_err(), "{bad:?}");
        }
        let long = format!("{state}{}", "A".repeat(MAX_STATE_LEN));
        assert_eq!(open(&key(), &long, 0), Err(StateError::TooLong));
    }

    #[test]
    fn claims_of_the_wrong_shape_are_refused_even_when_signed() {
        let mut extra = serde_json::to_value(claims()).unwrap();
        extra["approved"] = serde_json::json!(true);
        let mut wrong = serde_json::to_value(claims()).unwrap();
        wrong["request"] = serde_json::json!("7");
        let duplicate = br#"{"tenant":"conn-1","tenant":"conn-2","tool":"execute","plan":"0909090909090909090909090909090909090909090909090909090909090909","request":7,"exp":10000,"nonce":"03030303030303030303030303030303","round":1}"#;
        for payload in [
            serde_json::to_vec(&extra).unwrap(),
            serde_json::to_vec(&wrong).unwrap(),
            duplicate.to_vec(),
            b"null".to_vec(),
        ] {
            let state = sign_raw(&key(), &payload);
            assert_eq!(open(&key(), &state, 0), Err(StateError::BadClaims));
        }
    }
}
