//! The confirmation token: the desk's signed proof that a person approved this plan.
//!
//! A token is `cs1.<payload>.<tag>`: a version, the base64url (no padding) JSON claims, and the
//! base64url HMAC-SHA256 tag over a domain-separation label followed by `cs1.<payload>`. It is not
//! encrypted, because nothing in it is secret; it only has to be unforgeable. Decoding is strict so
//! that one token has exactly one spelling: exact base64url without padding or stray trailing bits,
//! an exact tag length, claims of exact types with no unknown or duplicate fields, and the tag
//! compared in constant time before the claims are even parsed.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::Sha256;
use zeroize::Zeroizing;

use crate::plan::PlanHash;

/// The version prefix of every token this module mints.
pub const VERSION: &str = "cs1";
/// Prepended to what is signed so a tag made for anything else never verifies as a token.
const DOMAIN_LABEL: &[u8] = b"countersign/confirm-token/v1\0";
/// The shortest key accepted, in bytes.
pub const MIN_KEY_LEN: usize = 32;
/// Longer strings are refused before any decoding work.
pub const MAX_TOKEN_LEN: usize = 4096;
const TAG_LEN: usize = 32;

type HmacSha256 = Hmac<Sha256>;

/// HMAC-SHA256 of `data` under `key`: the primitive tokens are signed with, exposed so that the
/// RFC 4231 test vectors can pin it.
pub fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC accepts keys of any length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// The HMAC key. Zeroized on drop; its `Debug` prints nothing of it.
#[derive(Clone)]
pub struct SigningKey(Zeroizing<Vec<u8>>);

/// A key that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// Fewer than [`MIN_KEY_LEN`] bytes.
    #[error("a signing key needs at least {MIN_KEY_LEN} bytes, got {0}")]
    TooShort(usize),
}

impl SigningKey {
    /// Wraps key material of at least [`MIN_KEY_LEN`] bytes.
    pub fn new(bytes: &[u8]) -> Result<Self, KeyError> {
        if bytes.len() < MIN_KEY_LEN {
            return Err(KeyError::TooShort(bytes.len()));
        }
        Ok(Self(Zeroizing::new(bytes.to_vec())))
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.0).expect("HMAC accepts keys of any length")
    }

    /// 32 bytes derived from this key for `label` (HMAC of the label under this key): key material
    /// for another use of the same secret, which never reveals the secret or the token key.
    pub(crate) fn derived_bytes(&self, label: &[u8]) -> Zeroizing<[u8; 32]> {
        Zeroizing::new(hmac_sha256(&self.0, label))
    }

    /// A MAC under a key derived from this one for `label` (HMAC of the label under this key):
    /// other uses of the secret never sign with the token key itself.
    pub(crate) fn derived(&self, label: &[u8]) -> HmacSha256 {
        let derived = Zeroizing::new(hmac_sha256(&self.0, label));
        HmacSha256::new_from_slice(&derived[..]).expect("HMAC accepts keys of any length")
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningKey(<redacted>)")
    }
}

/// 128 random bits naming one approval. Not secret: it may be logged, and ties a replay to the
/// issuance it replays.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Nonce([u8; 16]);

impl Nonce {
    /// A nonce from bytes the caller drew from a cryptographic RNG.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The raw bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Lowercase hex, 32 characters.
    pub fn to_hex(&self) -> String {
        hex_lower(&self.0)
    }

    /// Parses exactly 32 lowercase hex characters.
    pub fn from_hex(text: &str) -> Option<Self> {
        parse_hex::<16>(text).map(Self)
    }
}

impl fmt::Debug for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Nonce({})", self.to_hex())
    }
}

impl fmt::Display for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl Serialize for Nonce {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for Nonce {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Nonce::from_hex(&text)
            .ok_or_else(|| serde::de::Error::custom("nonce: 32 lowercase hex digits"))
    }
}

pub(crate) fn hex_lower(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
    out
}

/// Strict: exactly `2 * N` lowercase hex digits.
pub(crate) fn parse_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let bytes = text.as_bytes();
    if bytes.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        out[i] = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(out)
}

/// What a token asserts. Every field is required and of an exact type; unknown fields are refused.
/// Times are milliseconds since the Unix epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claims {
    /// The tool the approval is for.
    pub tool: String,
    /// The resolved target the person saw.
    pub target: String,
    /// The hash of the approved plan.
    pub plan: PlanHash,
    /// The connection (agent session) the token was issued to.
    pub tenant: String,
    /// When the person approved, in ms since the epoch.
    pub iat: u64,
    /// When the token stops working, in ms since the epoch (exclusive).
    pub exp: u64,
    /// 128 random bits; the ledger key for single-use tokens.
    pub nonce: Nonce,
}

/// A minted token. Its `Debug` is redacted so it never lands in a log by accident; read it with
/// [`Token::expose`] only where it is handed to the agent.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// The token text, for the one place it belongs: the approved preflight's response.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Why a token string was refused. Every variant surfaces to agents as `bad_token`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// Longer than [`MAX_TOKEN_LEN`].
    #[error("token is longer than {MAX_TOKEN_LEN} bytes")]
    TooLong,
    /// Not three dot-separated parts.
    #[error("token is not of the form version.payload.tag")]
    Malformed,
    /// A version this build does not know.
    #[error("token version is not {VERSION}")]
    UnknownVersion,
    /// A part is not exact base64url without padding.
    #[error("token part is not exact unpadded base64url")]
    BadEncoding,
    /// The tag is not 32 bytes.
    #[error("token tag has the wrong length")]
    BadTagLength,
    /// The tag does not match: forged, tampered with, or signed by another key.
    #[error("token signature does not verify")]
    BadSignature,
    /// Signed, but the claims are not exactly the expected shape.
    #[error("token claims are malformed")]
    BadClaims,
}

fn signed_part(mac: &mut HmacSha256, payload_b64: &str) {
    mac.update(DOMAIN_LABEL);
    mac.update(VERSION.as_bytes());
    mac.update(b".");
    mac.update(payload_b64.as_bytes());
}

/// Signs `claims` into a token.
pub fn mint(key: &SigningKey, claims: &Claims) -> Token {
    let payload = serde_json::to_vec(claims).expect("claims always serialize");
    let payload_b64 = URL_SAFE_NO_PAD.encode(payload);
    let mut mac = key.mac();
    signed_part(&mut mac, &payload_b64);
    let tag_b64 = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    let mut text = String::with_capacity(VERSION.len() + payload_b64.len() + tag_b64.len() + 2);
    text.push_str(VERSION);
    text.push('.');
    text.push_str(&payload_b64);
    text.push('.');
    text.push_str(&tag_b64);
    Token(text)
}

/// Checks the signature of `text` and returns its claims. Says nothing about expiry or binding:
/// that is the verification chain's job.
pub fn decode(key: &SigningKey, text: &str) -> Result<Claims, TokenError> {
    if text.len() > MAX_TOKEN_LEN {
        return Err(TokenError::TooLong);
    }
    let mut parts = text.split('.');
    let (Some(version), Some(payload_b64), Some(tag_b64), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed);
    };
    if version != VERSION {
        return Err(TokenError::UnknownVersion);
    }
    let tag = URL_SAFE_NO_PAD
        .decode(tag_b64)
        .map_err(|_| TokenError::BadEncoding)?;
    if tag.len() != TAG_LEN {
        return Err(TokenError::BadTagLength);
    }
    // The payload's spelling is checked before the tag so that the signed text has one encoding.
    let payload = URL_SAFE_NO_PAD
        .decode(payload_b64)
        .map_err(|_| TokenError::BadEncoding)?;
    let mut mac = key.mac();
    signed_part(&mut mac, payload_b64);
    mac.verify_slice(&tag)
        .map_err(|_| TokenError::BadSignature)?;
    let claims: Claims = serde_json::from_slice(&payload).map_err(|_| TokenError::BadClaims)?;
    if claims.iat > claims.exp {
        return Err(TokenError::BadClaims);
    }
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn key() -> SigningKey {
        SigningKey::new(&[0x42; 32]).unwrap()
    }

    fn claims() -> Claims {
        Claims {
            tool: "delete_backup".into(),
            target: "nightly.db".into(),
            plan: PlanHash::from_bytes([9; 32]),
            tenant: "conn-1".into(),
            iat: 1_000,
            exp: 601_000,
            nonce: Nonce::from_bytes([3; 16]),
        }
    }

    /// Signs an arbitrary payload as a token would be signed, to test claim parsing past the tag.
    fn sign_raw(key: &SigningKey, payload: &[u8]) -> String {
        let payload_b64 = URL_SAFE_NO_PAD.encode(payload);
        let mut mac = key.mac();
        signed_part(&mut mac, &payload_b64);
        format!(
            "{VERSION}.{payload_b64}.{}",
            URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
        )
    }

    fn claims_json() -> serde_json::Value {
        serde_json::to_value(claims()).unwrap()
    }

    fn with(field: &str, value: serde_json::Value) -> Vec<u8> {
        let mut v = claims_json();
        v[field] = value;
        serde_json::to_vec(&v).unwrap()
    }

    #[test]
    fn minted_token_decodes_to_its_claims() {
        let token = mint(&key(), &claims());
        assert!(token.expose().starts_with("cs1."));
        assert_eq!(decode(&key(), token.expose()), Ok(claims()));
    }

    #[test]
    fn token_from_another_key_is_refused() {
        let other = SigningKey::new(&[0x43; 32]).unwrap();
        let token = mint(&other, &claims());
        assert_eq!(
            decode(&key(), token.expose()),
            Err(TokenError::BadSignature)
        );
    }

    #[test]
    fn short_key_is_refused() {
        assert_eq!(
            SigningKey::new(&[1; 31]).unwrap_err(),
            KeyError::TooShort(31)
        );
    }

    #[test]
    fn debug_does_not_leak_key_or_token() {
        let key = SigningKey::new(&[0xAB; 32]).unwrap();
        let printed = format!("{key:?}");
        assert!(
            !printed.contains("171") && !printed.to_lowercase().contains("ab"),
            "{printed}"
        );
        let token = mint(&key, &claims());
        let printed = format!("{token:?}");
        assert!(
            !printed.contains(token.expose()) && !printed.contains("cs1."),
            "{printed}"
        );
    }

    #[test]
    fn every_single_bit_flip_of_the_token_text_is_refused() {
        let token = mint(&key(), &claims());
        let bytes = token.expose().as_bytes().to_vec();
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut flipped = bytes.clone();
                flipped[i] ^= 1 << bit;
                let Ok(text) = std::str::from_utf8(&flipped) else {
                    continue;
                };
                assert!(
                    decode(&key(), text).is_err(),
                    "flip of bit {bit} in byte {i} accepted"
                );
            }
        }
    }

    #[test]
    fn every_single_bit_flip_of_payload_and_tag_bytes_is_refused() {
        let token = mint(&key(), &claims());
        let parts: Vec<&str> = token.expose().split('.').collect();
        let payload = URL_SAFE_NO_PAD.decode(parts[1]).unwrap();
        let tag = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        for (which, original) in [(1, &payload), (2, &tag)] {
            for i in 0..original.len() {
                for bit in 0..8 {
                    let mut bytes = original.clone();
                    bytes[i] ^= 1 << bit;
                    let mut p = parts.clone();
                    let encoded = URL_SAFE_NO_PAD.encode(&bytes);
                    p[which] = &encoded;
                    let text = p.join(".");
                    assert_eq!(
                        decode(&key(), &text),
                        Err(TokenError::BadSignature),
                        "flip of bit {bit} in byte {i} of part {which} accepted"
                    );
                }
            }
        }
    }

    #[test]
    fn padded_base64_is_refused() {
        let token = mint(&key(), &claims());
        let text = format!("{}=", token.expose());
        assert_eq!(decode(&key(), &text), Err(TokenError::BadEncoding));
    }

    #[test]
    fn standard_base64_alphabet_is_refused() {
        // Re-spell the tag with '+' and '/' where base64url has '-' and '_'.
        let mut found = None;
        for n in 0u8..=255 {
            let mut c = claims();
            c.nonce = Nonce::from_bytes([n; 16]);
            let token = mint(&key(), &c);
            let tag = token.expose().rsplit('.').next().unwrap();
            if tag.contains('-') || tag.contains('_') {
                found = Some(token);
                break;
            }
        }
        let token = found.expect("some tag uses - or _");
        let respelled = token.expose().replace('-', "+").replace('_', "/");
        assert_eq!(decode(&key(), &respelled), Err(TokenError::BadEncoding));
    }

    #[test]
    fn truncated_or_extended_tag_is_refused() {
        let token = mint(&key(), &claims());
        let (head, tag) = token.expose().rsplit_once('.').unwrap();
        let short = URL_SAFE_NO_PAD.encode(&URL_SAFE_NO_PAD.decode(tag).unwrap()[..31]);
        assert_eq!(
            decode(&key(), &format!("{head}.{short}")),
            Err(TokenError::BadTagLength)
        );
        let mut long = URL_SAFE_NO_PAD.decode(tag).unwrap();
        long.push(0);
        let long = URL_SAFE_NO_PAD.encode(&long);
        assert_eq!(
            decode(&key(), &format!("{head}.{long}")),
            Err(TokenError::BadTagLength)
        );
    }

    #[test]
    fn wrong_shape_is_refused() {
        for text in [
            "",
            "cs1",
            "cs1.",
            "cs1..",
            "cs1.a.b.c",
            "cs2.e30.AAAA",
            " cs1.e30.AAAA",
        ] {
            assert!(decode(&key(), text).is_err(), "{text:?} accepted");
        }
        let token = mint(&key(), &claims());
        let v2 = token.expose().replacen("cs1", "cs2", 1);
        assert_eq!(decode(&key(), &v2), Err(TokenError::UnknownVersion));
    }

    #[test]
    fn overlong_token_is_refused_before_decoding() {
        let text = "a".repeat(MAX_TOKEN_LEN + 1);
        assert_eq!(decode(&key(), &text), Err(TokenError::TooLong));
    }

    #[test]
    fn exp_as_string_is_refused() {
        let text = sign_raw(&key(), &with("exp", "601000".into()));
        assert_eq!(decode(&key(), &text), Err(TokenError::BadClaims));
    }

    #[test]
    fn exp_as_float_null_or_negative_is_refused() {
        for bad in [
            serde_json::json!(601000.0),
            serde_json::json!(601000.5),
            serde_json::Value::Null,
            serde_json::json!(-1),
        ] {
            let text = sign_raw(&key(), &with("exp", bad.clone()));
            assert_eq!(
                decode(&key(), &text),
                Err(TokenError::BadClaims),
                "exp = {bad}"
            );
        }
    }

    #[test]
    fn missing_exp_is_refused_never_read_as_no_expiry() {
        let mut v = claims_json();
        v.as_object_mut().unwrap().remove("exp");
        let text = sign_raw(&key(), &serde_json::to_vec(&v).unwrap());
        assert_eq!(decode(&key(), &text), Err(TokenError::BadClaims));
    }

    #[test]
    fn unknown_claim_is_refused() {
        let text = sign_raw(&key(), &with("admin", true.into()));
        assert_eq!(decode(&key(), &text), Err(TokenError::BadClaims));
    }

    #[test]
    fn duplicate_claim_is_refused() {
        let payload = br#"{"tool":"a","target":"b","plan":"0909090909090909090909090909090909090909090909090909090909090909","tenant":"t","iat":1,"exp":2,"exp":999999999999,"nonce":"03030303030303030303030303030303"}"#;
        assert_eq!(
            decode(&key(), &sign_raw(&key(), payload)),
            Err(TokenError::BadClaims)
        );
    }

    #[test]
    fn claims_of_wrong_types_are_refused() {
        for (field, bad) in [
            ("tool", serde_json::json!(5)),
            ("tenant", serde_json::Value::Null),
            ("iat", serde_json::json!("1000")),
            ("nonce", serde_json::json!("0303")),
            (
                "nonce",
                serde_json::json!("0303030303030303030303030303030G"),
            ),
            ("plan", serde_json::json!("09")),
            ("plan", serde_json::json!("0A".repeat(32))),
        ] {
            let text = sign_raw(&key(), &with(field, bad.clone()));
            assert_eq!(
                decode(&key(), &text),
                Err(TokenError::BadClaims),
                "{field} = {bad}"
            );
        }
    }

    #[test]
    fn issued_after_expiry_is_refused() {
        let text = sign_raw(&key(), &with("iat", 700_000.into()));
        assert_eq!(decode(&key(), &text), Err(TokenError::BadClaims));
    }

    #[test]
    fn non_object_payload_is_refused() {
        for payload in [&b"[]"[..], b"null", b"\"x\"", b"{", b"\xff"] {
            assert_eq!(
                decode(&key(), &sign_raw(&key(), payload)),
                Err(TokenError::BadClaims)
            );
        }
    }
}
