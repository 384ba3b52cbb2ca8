//! An approver's decision, signed at a person's desk and checked by a team's server.
//!
//! On a team's server (`countersign serve`) the click happens on another machine: a person's
//! desk, connected to the server. The server must not take the desk's word for it, so the desk
//! signs each decision with its approver key (Ed25519; the private half never leaves that desk's
//! keychain), and the server checks the signature against the public keys of its registered
//! approvers before any replica mints a token, and keeps it with the approval as the record of
//! who approved what. What is signed is everything the token would bind and more: the server,
//! the request, the plan hash, the tenant, the tool, the target, the class and the expiry of the
//! decision, canonically encoded after a domain label, so a signature made for one request,
//! plan or server is worth nothing for another. Pure: no I/O, no clock.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde_json::json;
use zeroize::Zeroizing;

use crate::canonical;
use crate::gate::GateClass;
use crate::plan::PlanHash;

/// What precedes every signed decision: a signature over anything else is not a decision.
pub const DOMAIN: &str = "countersign approver decision v1\n";

/// The tenant a change to a team server's own rules is listed and decided under: no agent asks
/// it, and no agent's tenant is this (agents' are `key:…`, `oauth:…`, `conn-…`). Its class is
/// `once`: an approval applies it once, and it mints nothing.
pub const CHANGE_TENANT: &str = "change";

/// What an approver decides about one waiting request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Approve it.
    Approve,
    /// Deny it.
    Deny,
}

impl Verdict {
    /// A stable code.
    pub fn code(self) -> &'static str {
        match self {
            Verdict::Approve => "approve",
            Verdict::Deny => "deny",
        }
    }
}

/// One decision, as signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision<'a> {
    /// The server the request waits on, as the approver's desk enrolled with it.
    pub server: &'a str,
    /// The request's id on that server.
    pub request: u64,
    /// Approve or deny.
    pub verdict: Verdict,
    /// The hash of the plan the person read.
    pub plan: &'a PlanHash,
    /// The caller the request is from.
    pub tenant: &'a str,
    /// The tool.
    pub tool: &'a str,
    /// The target.
    pub target: &'a str,
    /// The tool's gate class as shown.
    pub class: GateClass,
    /// Until when the decision may be acted on, ms since the epoch: a decision held back and
    /// delivered later is worth nothing after it.
    pub expires_at_ms: u64,
}

impl Decision<'_> {
    /// The bytes signed: [`DOMAIN`], then the decision as RFC 8785 canonical JSON. A decision
    /// with no canonical form (an integer beyond 2^53 − 1 that no IEEE double holds) is the
    /// domain label alone, which [`verify`] never accepts.
    pub fn signed_bytes(&self) -> Vec<u8> {
        self.canonical_bytes()
            .unwrap_or_else(|| DOMAIN.as_bytes().to_vec())
    }

    /// [`Decision::signed_bytes`], if the decision has a canonical form.
    fn canonical_bytes(&self) -> Option<Vec<u8>> {
        let value = json!({
            "server": self.server,
            "request": self.request,
            "verdict": self.verdict.code(),
            "plan": self.plan.to_hex(),
            "tenant": self.tenant,
            "tool": self.tool,
            "target": self.target,
            "class": self.class.code(),
            "expiresAtMs": self.expires_at_ms,
        });
        let text = canonical::to_string(&value).ok()?;
        Some([DOMAIN.as_bytes(), text.as_bytes()].concat())
    }
}

/// What precedes a decision that a person's passkey signs: a WebAuthn assertion over another
/// challenge (a sign-in, or a desk's decision bytes) is not a decision.
pub const PASSKEY_DOMAIN: &str = "countersign passkey decision v1\n";

impl Decision<'_> {
    /// The WebAuthn challenge of this decision: SHA-256 of [`PASSKEY_DOMAIN`] and the decision's
    /// RFC 8785 canonical JSON (the same fields a desk signs). The server computes it from the
    /// waiting call, never from what a page sends, so the person's authenticator signs the very
    /// plan; anyone holding the kept assertion and the credential's public key can recompute it.
    /// `None` for a decision with no canonical form, which no passkey can sign.
    pub fn passkey_challenge(&self) -> Option<[u8; 32]> {
        use sha2::Digest as _;
        let signed = self.canonical_bytes()?;
        let body = &signed[DOMAIN.len()..];
        let mut digest = sha2::Sha256::new();
        digest.update(PASSKEY_DOMAIN.as_bytes());
        digest.update(body);
        Some(digest.finalize().into())
    }
}

/// An approver's key pair, as its desk keeps it.
pub struct ApproverKey(SigningKey);

impl std::fmt::Debug for ApproverKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ApproverKey").field(&"<redacted>").finish()
    }
}

impl ApproverKey {
    /// The key pair of the 32 secret bytes `seed` (from the desk's keychain, or fresh random
    /// bytes for a new approver).
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        ApproverKey(SigningKey::from_bytes(seed))
    }

    /// The secret bytes, for the keychain.
    pub fn seed(&self) -> Zeroizing<[u8; 32]> {
        Zeroizing::new(self.0.to_bytes())
    }

    /// The key as PKCS#8 (RFC 8410, version 1) DER, for TLS libraries: the desk's client
    /// certificate is made of this same key.
    pub fn pkcs8_der(&self) -> Zeroizing<Vec<u8>> {
        // SEQUENCE { INTEGER 0, SEQUENCE { OID 1.3.101.112 }, OCTET STRING { OCTET STRING seed } }
        const PREFIX: [u8; 16] = [
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20,
        ];
        let mut der = Zeroizing::new(Vec::with_capacity(48));
        der.extend_from_slice(&PREFIX);
        der.extend_from_slice(self.0.as_bytes());
        der
    }

    /// The public half, which the team registers.
    pub fn public(&self) -> [u8; 32] {
        self.0.verifying_key().to_bytes()
    }

    /// The signature of `decision`.
    pub fn sign(&self, decision: &Decision<'_>) -> [u8; 64] {
        self.0.sign(&decision.signed_bytes()).to_bytes()
    }
}

/// How an approver's public key is written where people copy it: `ed25519:` and the 32 bytes in
/// unpadded base64url.
pub fn public_key_text(public: &[u8; 32]) -> String {
    use base64::Engine as _;
    format!(
        "ed25519:{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(public)
    )
}

/// The key that [`public_key_text`] wrote, if `text` is exactly such a key (surrounding
/// whitespace aside) and a usable Ed25519 public key: not a weak key, nor one off the curve.
pub fn parse_public_key(text: &str) -> Option<[u8; 32]> {
    use base64::Engine as _;
    let encoded = text.trim().strip_prefix("ed25519:")?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(encoded)
        .ok()?;
    let public: [u8; 32] = bytes.try_into().ok()?;
    let key = VerifyingKey::from_bytes(&public).ok()?;
    (!key.is_weak()).then_some(public)
}

/// Why a signed decision is not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadDecision {
    /// The public key is not a valid Ed25519 point.
    #[error("the approver's public key is not a valid Ed25519 key")]
    BadKey,
    /// The signature does not check against the key over this decision.
    #[error("the signature does not match this decision and this approver")]
    BadSignature,
    /// The decision's time to be acted on has passed.
    #[error("the decision expired")]
    Expired,
}

impl BadDecision {
    /// A stable code.
    pub fn code(self) -> &'static str {
        match self {
            BadDecision::BadKey => "bad_key",
            BadDecision::BadSignature => "bad_signature",
            BadDecision::Expired => "expired",
        }
    }
}

/// Checks `signature` over `decision` against the approver `public` key, at `now_ms`. Strict
/// verification: a signature that is malleable or made with a weak key is refused.
pub fn verify(
    public: &[u8; 32],
    decision: &Decision<'_>,
    signature: &[u8; 64],
    now_ms: u64,
) -> Result<(), BadDecision> {
    let key = VerifyingKey::from_bytes(public).map_err(|_| BadDecision::BadKey)?;
    if key.is_weak() {
        return Err(BadDecision::BadKey);
    }
    // Without a canonical form the signed bytes would be the domain label alone, the same for
    // every such decision: a signature over them is worth nothing for any.
    let signed = decision
        .canonical_bytes()
        .ok_or(BadDecision::BadSignature)?;
    key.verify_strict(&signed, &Signature::from_bytes(signature))
        .map_err(|_| BadDecision::BadSignature)?;
    if now_ms >= decision.expires_at_ms {
        return Err(BadDecision::Expired);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(n: u8) -> PlanHash {
        PlanHash::from_bytes([n; 32])
    }

    fn decision(plan: &PlanHash) -> Decision<'_> {
        Decision {
            server: "https://mcp.example.com/approvers",
            request: 7,
            verdict: Verdict::Approve,
            plan,
            tenant: "key:ci@server:db",
            tool: "execute",
            target: "users",
            class: GateClass::Once,
            expires_at_ms: 2_000,
        }
    }

    #[test]
    fn a_passkey_challenge_differs_for_every_field_and_from_a_desk_signature_s_bytes() {
        let p = plan(9);
        let q = plan(8);
        let d = decision(&p);
        let challenge = d.passkey_challenge().unwrap();
        // Stable: the same decision, the same challenge (an offline check recomputes it).
        assert_eq!(decision(&p).passkey_challenge(), Some(challenge));
        let changed = [
            Decision {
                server: "https://other.example.com/approvers",
                ..d
            },
            Decision { request: 8, ..d },
            Decision {
                verdict: Verdict::Deny,
                ..d
            },
            Decision { plan: &q, ..d },
            Decision {
                tenant: "key:other@server:db",
                ..d
            },
            Decision { tool: "query", ..d },
            Decision {
                target: "users ",
                ..d
            },
            Decision {
                class: GateClass::Token,
                ..d
            },
            Decision {
                expires_at_ms: 2_001,
                ..d
            },
        ];
        for other in changed {
            assert_ne!(other.passkey_challenge(), Some(challenge), "{other:?}");
        }
        // Its own domain: not the digest of the bytes a desk signs.
        use sha2::Digest as _;
        let desk: [u8; 32] = sha2::Sha256::digest(d.signed_bytes()).into();
        assert_ne!(desk, challenge);
        // No canonical form, no challenge.
        assert_eq!(
            Decision {
                request: 1 << 60,
                ..d
            }
            .passkey_challenge(),
            None
        );
    }

    #[test]
    fn a_decision_signed_by_the_approver_checks_until_it_expires() {
        let key = ApproverKey::from_seed(&[1; 32]);
        let p = plan(9);
        let d = decision(&p);
        let sig = key.sign(&d);
        assert_eq!(verify(&key.public(), &d, &sig, 1_999), Ok(()));
        assert_eq!(
            verify(&key.public(), &d, &sig, 2_000),
            Err(BadDecision::Expired)
        );
    }

    #[test]
    fn a_signature_is_worth_nothing_for_any_other_field_or_key() {
        let key = ApproverKey::from_seed(&[1; 32]);
        let other = ApproverKey::from_seed(&[2; 32]);
        let p = plan(9);
        let d = decision(&p);
        let sig = key.sign(&d);
        let q = plan(8);
        let changed = [
            Decision {
                server: "https://other.example.com/approvers",
                ..d
            },
            Decision { request: 8, ..d },
            Decision {
                verdict: Verdict::Deny,
                ..d
            },
            Decision { plan: &q, ..d },
            Decision {
                tenant: "key:other@server:db",
                ..d
            },
            Decision { tool: "drop", ..d },
            Decision {
                target: "orders",
                ..d
            },
            Decision {
                class: GateClass::Token,
                ..d
            },
            Decision {
                expires_at_ms: 3_000,
                ..d
            },
        ];
        for c in &changed {
            assert_eq!(
                verify(&key.public(), c, &sig, 0),
                Err(BadDecision::BadSignature),
                "{c:?}"
            );
        }
        assert_eq!(
            verify(&other.public(), &d, &sig, 0),
            Err(BadDecision::BadSignature)
        );
        let mut flipped = sig;
        flipped[0] ^= 1;
        assert_eq!(
            verify(&key.public(), &d, &flipped, 0),
            Err(BadDecision::BadSignature)
        );
        // The identity point and other weak keys are refused, whatever the signature.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert_eq!(verify(&identity, &d, &sig, 0), Err(BadDecision::BadKey));
    }

    #[test]
    fn a_signature_over_the_domain_label_alone_is_worth_nothing_for_a_decision_beyond_2_53() {
        let key = ApproverKey::from_seed(&[1; 32]);
        let p = plan(9);
        let d = decision(&p);
        let bare = key.0.sign(DOMAIN.as_bytes()).to_bytes();
        // 2^53 + 1: no IEEE double holds it, so it has no canonical spelling.
        let beyond = canonical::MAX_SAFE_INTEGER + 2;
        for c in [
            Decision {
                request: beyond,
                ..d
            },
            Decision {
                expires_at_ms: beyond,
                ..d
            },
        ] {
            assert_eq!(c.signed_bytes(), DOMAIN.as_bytes(), "{c:?}");
            assert_eq!(
                verify(&key.public(), &c, &bare, 0),
                Err(BadDecision::BadSignature),
                "{c:?}"
            );
            assert_eq!(
                verify(&key.public(), &c, &key.sign(&c), 0),
                Err(BadDecision::BadSignature),
                "{c:?}"
            );
        }
        // At the limit a decision is still one.
        let at = Decision {
            request: canonical::MAX_SAFE_INTEGER,
            ..d
        };
        assert_eq!(verify(&key.public(), &at, &key.sign(&at), 0), Ok(()));
    }

    #[test]
    fn the_signed_bytes_are_the_domain_then_canonical_json() {
        let p = plan(9);
        let bytes = decision(&p).signed_bytes();
        let text = String::from_utf8(bytes).unwrap();
        let (domain, json) = text.split_at(DOMAIN.len());
        assert_eq!(domain, DOMAIN);
        // Keys sorted, no spaces: RFC 8785.
        assert!(
            json.starts_with(r#"{"class":"once","expiresAtMs":2000,"plan":""#),
            "{json}"
        );
        assert_eq!(
            canonical::to_string(&serde_json::from_str(json).unwrap()).unwrap(),
            json
        );
    }

    #[test]
    fn a_public_key_reads_back_from_its_text_and_nothing_else_does() {
        let key = ApproverKey::from_seed(&[3; 32]);
        let text = public_key_text(&key.public());
        assert!(
            text.starts_with("ed25519:") && text.len() == 8 + 43,
            "{text}"
        );
        assert_eq!(parse_public_key(&format!(" {text}\n")), Some(key.public()));
        let mut identity = [0u8; 32];
        identity[0] = 1;
        for bad in [
            text.trim_start_matches("ed25519:").to_owned(),
            format!("{text}A"),
            format!("{text}="),
            text.replace("ed25519:", "ed448:"),
            public_key_text(&identity),
            String::new(),
        ] {
            assert_eq!(parse_public_key(&bad), None, "{bad}");
        }
    }

    #[test]
    fn the_pkcs8_form_is_rfc_8410s_own_example() {
        // RFC 8410, section 10.3: the private key and its PKCS#8 PEM body.
        let seed = [
            0xd4, 0xee, 0x72, 0xdb, 0xf9, 0x13, 0x58, 0x4a, 0xd5, 0xb6, 0xd8, 0xf1, 0xf7, 0x69,
            0xf8, 0xad, 0x3a, 0xfe, 0x7c, 0x28, 0xcb, 0xf1, 0xd4, 0xfb, 0xe0, 0x97, 0xa8, 0x8f,
            0x44, 0x75, 0x58, 0x42,
        ];
        use base64::Engine as _;
        let der = ApproverKey::from_seed(&seed).pkcs8_der();
        assert_eq!(
            base64::engine::general_purpose::STANDARD.encode(der.as_slice()),
            "MC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC"
        );
    }

    #[test]
    fn debug_of_a_key_never_shows_it() {
        let key = ApproverKey::from_seed(&[7; 32]);
        assert!(!format!("{key:?}").contains("7"));
        assert_eq!(ApproverKey::from_seed(&key.seed()).public(), key.public());
    }
}
