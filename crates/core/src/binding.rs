//! The MAC that binds a stored approval to what the person approved.
//!
//! The desk keeps each approval's arguments in its SQLite file, and executes those, not what a
//! confirm carries. A process that can write the file could otherwise change what runs after the
//! click. So every approval row carries a MAC under a key derived from the signing secret (never
//! the secret itself, and never the token key's own use) over everything that decides what runs:
//! the nonce, the tenant, the plan hash, the gate class, the expiry and the canonical arguments.
//! It is checked before a nonce is spent; a row that does not match is refused.

use hmac::Mac;
use serde_json::Value;

use crate::canonical::{self, CanonicalError};
use crate::gate::GateClass;
use crate::plan::PlanHash;
use crate::token::{Nonce, SigningKey};

/// What the derived key is for: a different label would give an unrelated key.
const LABEL: &[u8] = b"countersign approval binding v1";

/// Everything an approval MAC covers.
#[derive(Debug, Clone, Copy)]
pub struct Bound<'a> {
    /// The token's nonce.
    pub nonce: &'a Nonce,
    /// The connection the token was issued to.
    pub tenant: &'a str,
    /// The approved plan's hash.
    pub plan: &'a PlanHash,
    /// The gate class the approval was made under.
    pub class: GateClass,
    /// When the token expires, ms since the epoch.
    pub expires_at_ms: u64,
    /// The exact arguments approved.
    pub arguments: &'a Value,
}

fn mac_of(key: &SigningKey, bound: &Bound<'_>) -> Result<hmac::Hmac<sha2::Sha256>, CanonicalError> {
    let arguments = canonical::to_string(bound.arguments)?;
    let mut mac = key.derived(LABEL);
    // Each field ends in a newline or carries its length, so no two inputs encode alike.
    let head = format!(
        "{}\n{}\n{}\n{}\n{}:{}\n",
        bound.nonce.to_hex(),
        bound.plan.to_hex(),
        bound.class.code(),
        bound.expires_at_ms,
        bound.tenant.len(),
        bound.tenant,
    );
    mac.update(head.as_bytes());
    mac.update(arguments.as_bytes());
    Ok(mac)
}

/// The MAC of an approval. Fails only for arguments that have no canonical form (which a plan
/// could not have been made of).
pub fn approval_mac(key: &SigningKey, bound: &Bound<'_>) -> Result<[u8; 32], CanonicalError> {
    Ok(mac_of(key, bound)?.finalize().into_bytes().into())
}

/// Whether `mac` is the MAC of `bound` under `key`, compared in constant time.
pub fn approval_mac_matches(key: &SigningKey, bound: &Bound<'_>, mac: &[u8]) -> bool {
    mac_of(key, bound).is_ok_and(|m| m.verify_slice(mac).is_ok())
}

/// What the grant MAC's derived key is for: unrelated to the approval key.
const GRANT_LABEL: &[u8] = b"countersign grant binding v1";

/// The MAC of a grant (a person's widening of one approval, kept in the desk's file): `scope` is
/// the grant's every deciding field in one unambiguous text the engine builds. A row added or
/// edited behind the desk's back does not carry it, and is never honoured.
pub fn grant_mac(key: &SigningKey, scope: &str) -> [u8; 32] {
    let mut mac = key.derived(GRANT_LABEL);
    mac.update(scope.as_bytes());
    mac.finalize().into_bytes().into()
}

/// Whether `mac` is the grant MAC of `scope` under `key`, compared in constant time.
pub fn grant_mac_matches(key: &SigningKey, scope: &str, mac: &[u8]) -> bool {
    let mut expected = key.derived(GRANT_LABEL);
    expected.update(scope.as_bytes());
    expected.verify_slice(mac).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(byte: u8) -> SigningKey {
        SigningKey::new(&[byte; 32]).unwrap()
    }

    #[test]
    fn a_grant_mac_differs_from_the_approval_mac_and_from_another_scope() {
        let k = key(1);
        let mac = grant_mac(&k, "call\nsrv\n");
        assert!(grant_mac_matches(&k, "call\nsrv\n", &mac));
        assert!(!grant_mac_matches(&k, "call\nsrv2\n", &mac));
        assert!(!grant_mac_matches(&key(2), "call\nsrv\n", &mac));
        assert!(!grant_mac_matches(&k, "call\nsrv\n", &mac[..31]));
    }

    #[test]
    fn a_changed_argument_class_tenant_or_expiry_breaks_the_mac() {
        let nonce = Nonce::from_bytes([7; 16]);
        let plan = PlanHash::of_bytes(b"plan");
        let args = json!({"path": "/tmp/a", "n": 1});
        let bound = Bound {
            nonce: &nonce,
            tenant: "conn-1",
            plan: &plan,
            class: GateClass::Once,
            expires_at_ms: 10,
            arguments: &args,
        };
        let mac = approval_mac(&key(1), &bound).unwrap();
        assert!(approval_mac_matches(&key(1), &bound, &mac));
        // Key order and number spelling do not matter: the canonical form does.
        let same = json!({"n": 1.0, "path": "/tmp/a"});
        assert!(approval_mac_matches(
            &key(1),
            &Bound {
                arguments: &same,
                ..bound
            },
            &mac
        ));
        let other = json!({"path": "/etc/passwd", "n": 1});
        assert!(!approval_mac_matches(
            &key(1),
            &Bound {
                arguments: &other,
                ..bound
            },
            &mac
        ));
        assert!(!approval_mac_matches(
            &key(1),
            &Bound {
                class: GateClass::Token,
                ..bound
            },
            &mac
        ));
        assert!(!approval_mac_matches(
            &key(1),
            &Bound {
                tenant: "conn-2",
                ..bound
            },
            &mac
        ));
        assert!(!approval_mac_matches(
            &key(1),
            &Bound {
                expires_at_ms: 11,
                ..bound
            },
            &mac
        ));
        let other_nonce = Nonce::from_bytes([8; 16]);
        assert!(!approval_mac_matches(
            &key(1),
            &Bound {
                nonce: &other_nonce,
                ..bound
            },
            &mac
        ));
        assert!(
            !approval_mac_matches(&key(2), &bound, &mac),
            "another secret"
        );
        assert!(
            !approval_mac_matches(&key(1), &bound, &mac[..31]),
            "a short MAC"
        );
    }

    #[test]
    fn the_binding_key_is_not_the_token_key() {
        let nonce = Nonce::from_bytes([0; 16]);
        let plan = PlanHash::of_bytes(b"");
        let args = json!({});
        let bound = Bound {
            nonce: &nonce,
            tenant: "",
            plan: &plan,
            class: GateClass::Once,
            expires_at_ms: 0,
            arguments: &args,
        };
        let mac = approval_mac(&key(1), &bound).unwrap();
        let head = format!("{}\n{}\nonce\n0\n0:\n{{}}", nonce.to_hex(), plan.to_hex());
        assert_ne!(mac, crate::token::hmac_sha256(&[1; 32], head.as_bytes()));
    }
}
