//! Kept decisions, checked again by anyone: the JSON `countersign serve history --decisions
//! --json` prints, the roster `countersign serve approver export` prints, and the offline check
//! `countersign serve verify-decisions` runs on the two.
//!
//! A desk's decision is proven by its Ed25519 signature under the approver's registered key
//! (`countersign_core::approver::verify`). A passkey's is proven by its WebAuthn assertion: the
//! challenge the authenticator signed must be the digest of this very decision
//! (`Decision::passkey_challenge`), the client data must name the page's origin, the
//! authenticator data its RP ID with user verification, and the signature must check under the
//! credential's public key from the roster. Nothing is taken from the line on trust: every field
//! of the decision is recomputed into what was signed.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use countersign_core::approver::{self, Decision, Verdict, parse_public_key, public_key_text};
use countersign_core::{GateClass, PlanHash};
use countersign_store::{Assertion, DecisionRecord, Evidence, Member, Passkey};
use serde_json::{Value, json};

/// Why a kept decision is not proven. Codes are stable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unproven {
    /// The line is not a kept decision (a field missing or of the wrong type).
    #[error("not a kept decision: {0}")]
    Malformed(&'static str),
    /// Nobody of that name (or no such passkey of theirs) is on the roster.
    #[error("the roster has no {0} for this approver")]
    NotOnRoster(&'static str),
    /// A desk's signature that does not check.
    #[error("the desk's signature does not match this decision and this approver's key")]
    BadSignature,
    /// A passkey's decision, and no origin to check it against.
    #[error("a passkey's decision needs the page's origin (--origin)")]
    NoOrigin,
    /// A passkey's assertion that does not check.
    #[error("the passkey's assertion does not prove this decision: {0}")]
    BadAssertion(String),
}

impl Unproven {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            Unproven::Malformed(_) => "malformed",
            Unproven::NotOnRoster(_) => "not_on_roster",
            Unproven::BadSignature => "bad_signature",
            Unproven::NoOrigin => "no_origin",
            Unproven::BadAssertion(_) => "bad_assertion",
        }
    }
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A kept decision as one JSON line, with the proof it was kept with.
pub fn decision_json(d: &DecisionRecord, approvers: &[Member]) -> Value {
    let mut line = json!({
        "decidedAtMs": d.decided_at_ms,
        "approver": d.approver,
        "server": d.server,
        "request": d.request,
        "verdict": d.verdict.code(),
        "plan": d.plan.to_hex(),
        "tenant": d.tenant,
        "tool": d.tool,
        "target": d.target,
        "class": d.class.code(),
        "expiresAtMs": d.expires_at_ms,
    });
    match &d.evidence {
        Evidence::Desk { signature } => {
            line["by"] = json!("desk");
            line["approverKey"] = json!(
                approvers
                    .iter()
                    .find(|a| a.name == d.approver)
                    .map(|a| public_key_text(&a.key))
                    .unwrap_or_default()
            );
            line["signature"] = json!(b64(signature));
        }
        Evidence::Passkey(a) => {
            line["by"] = json!("passkey");
            line["credentialId"] = json!(b64(&a.credential_id));
            line["authenticatorData"] = json!(b64(&a.authenticator_data));
            line["clientDataJSON"] = json!(b64(&a.client_data));
            line["signature"] = json!(b64(&a.signature));
        }
    }
    line
}

/// The roster as JSON: desk keys and passkeys (their public credentials), revoked ones too.
pub fn roster_json(members: &[Member], passkeys: &[Passkey]) -> Value {
    json!({
        "approvers": members.iter().map(|m| json!({
            "name": m.name,
            "key": public_key_text(&m.key),
            "createdAtMs": m.created_at_ms,
            "revokedAtMs": m.revoked_at_ms,
        })).collect::<Vec<_>>(),
        "passkeys": passkeys.iter().map(|p| json!({
            "approver": p.approver,
            "credentialId": b64(&p.credential_id),
            "credential": serde_json::from_str::<Value>(&p.credential).unwrap_or(Value::Null),
            "createdAtMs": p.created_at_ms,
            "revokedAtMs": p.revoked_at_ms,
        })).collect::<Vec<_>>(),
    })
}

fn text<'a>(line: &'a Value, field: &'static str) -> Result<&'a str, Unproven> {
    line[field].as_str().ok_or(Unproven::Malformed(field))
}

fn bytes(line: &Value, field: &'static str) -> Result<Vec<u8>, Unproven> {
    URL_SAFE_NO_PAD
        .decode(text(line, field)?)
        .map_err(|_| Unproven::Malformed(field))
}

/// Checks one kept decision `line` against `roster` (as [`roster_json`] writes it), offline;
/// passkeys' decisions against the page at `origin`.
pub fn verify(roster: &Value, origin: Option<&url::Url>, line: &Value) -> Result<(), Unproven> {
    let plan = PlanHash::from_hex(text(line, "plan")?).ok_or(Unproven::Malformed("plan"))?;
    let decision = Decision {
        server: text(line, "server")?,
        request: line["request"]
            .as_u64()
            .ok_or(Unproven::Malformed("request"))?,
        verdict: match text(line, "verdict")? {
            "approve" => Verdict::Approve,
            "deny" => Verdict::Deny,
            _ => return Err(Unproven::Malformed("verdict")),
        },
        plan: &plan,
        tenant: text(line, "tenant")?,
        tool: text(line, "tool")?,
        target: text(line, "target")?,
        class: GateClass::from_code(text(line, "class")?).ok_or(Unproven::Malformed("class"))?,
        expires_at_ms: line["expiresAtMs"]
            .as_u64()
            .ok_or(Unproven::Malformed("expiresAtMs"))?,
    };
    let approver = text(line, "approver")?;
    match text(line, "by")? {
        "desk" => {
            let key = roster["approvers"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|a| a["name"] == approver)
                .and_then(|a| parse_public_key(a["key"].as_str()?))
                .ok_or(Unproven::NotOnRoster("desk key"))?;
            let signature: [u8; 64] = bytes(line, "signature")?
                .try_into()
                .map_err(|_| Unproven::Malformed("signature"))?;
            // Proven as signed: the time it was acted on is the record's, not now's.
            let at = decision.expires_at_ms.saturating_sub(1);
            approver::verify(&key, &decision, &signature, at).map_err(|_| Unproven::BadSignature)
        }
        "passkey" => {
            let origin = origin.ok_or(Unproven::NoOrigin)?;
            let id = text(line, "credentialId")?;
            let credential = roster["passkeys"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["approver"] == approver && p["credentialId"] == id)
                .map(|p| p["credential"].to_string())
                .ok_or(Unproven::NotOnRoster("passkey"))?;
            let assertion = Assertion {
                credential_id: bytes(line, "credentialId")?,
                authenticator_data: bytes(line, "authenticatorData")?,
                client_data: bytes(line, "clientDataJSON")?,
                signature: bytes(line, "signature")?,
            };
            let challenge = decision
                .passkey_challenge()
                .ok_or(Unproven::Malformed("request"))?;
            crate::web::passkey::verify_kept(origin.clone(), &credential, &assertion, &challenge)
                .map_err(|e| Unproven::BadAssertion(e.to_string()))
        }
        _ => Err(Unproven::Malformed("by")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use countersign_core::approver::ApproverKey;

    fn desk_line(key: &ApproverKey, target: &str) -> (Value, Value) {
        let plan = PlanHash::from_bytes([4; 32]);
        let record = DecisionRecord {
            approver: "alice".into(),
            server: "https://team.example.com/approvers".into(),
            request: 9,
            verdict: Verdict::Approve,
            plan,
            tenant: "key:ci@server:db".into(),
            tool: "execute".into(),
            target: target.into(),
            class: GateClass::Once,
            expires_at_ms: 5_000,
            evidence: Evidence::Desk {
                signature: key.sign(&Decision {
                    server: "https://team.example.com/approvers",
                    request: 9,
                    verdict: Verdict::Approve,
                    plan: &plan,
                    tenant: "key:ci@server:db",
                    tool: "execute",
                    target: "users",
                    class: GateClass::Once,
                    expires_at_ms: 5_000,
                }),
            },
            decided_at_ms: 1_000,
        };
        let member = Member {
            name: "alice".into(),
            key: key.public(),
            created_at_ms: 0,
            revoked_at_ms: None,
        };
        (
            decision_json(&record, std::slice::from_ref(&member)),
            roster_json(&[member], &[]),
        )
    }

    #[test]
    fn a_desk_decision_is_proven_by_its_key_and_nothing_else() {
        let key = ApproverKey::from_seed(&[3; 32]);
        let (line, roster) = desk_line(&key, "users");
        assert_eq!(verify(&roster, None, &line), Ok(()));
        // Any field changed after the fact: not proven.
        for (field, value) in [
            ("target", json!("orders")),
            ("verdict", json!("deny")),
            ("request", json!(10)),
            ("tenant", json!("key:other@server:db")),
            ("expiresAtMs", json!(5_001)),
        ] {
            let mut edited = line.clone();
            edited[field] = value;
            assert_eq!(
                verify(&roster, None, &edited),
                Err(Unproven::BadSignature),
                "{field}"
            );
        }
        // Another person's key on the roster under that name: not proven.
        let (_, other) = desk_line(&ApproverKey::from_seed(&[4; 32]), "users");
        assert_eq!(verify(&other, None, &line), Err(Unproven::BadSignature));
        // Nobody of that name.
        assert_eq!(
            verify(&json!({"approvers": []}), None, &line),
            Err(Unproven::NotOnRoster("desk key"))
        );
    }

    #[test]
    fn a_passkey_decision_needs_the_origin_and_its_credential_on_the_roster() {
        let mut line = json!({
            "approver": "bob", "server": "s", "request": 1, "verdict": "approve",
            "plan": "00".repeat(32), "tenant": "t", "tool": "x", "target": "y",
            "class": "once", "expiresAtMs": 10, "by": "passkey", "credentialId": "AQID",
            "authenticatorData": "AA", "clientDataJSON": "AA", "signature": "AA",
        });
        assert_eq!(verify(&json!({}), None, &line), Err(Unproven::NoOrigin));
        let origin = url::Url::parse("https://approve.example.com").unwrap();
        assert_eq!(
            verify(&json!({"passkeys": []}), Some(&origin), &line),
            Err(Unproven::NotOnRoster("passkey"))
        );
        line["by"] = json!("fax");
        assert_eq!(
            verify(&json!({}), Some(&origin), &line),
            Err(Unproven::Malformed("by"))
        );
    }
}
