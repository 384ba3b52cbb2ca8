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
//! claims are parsed, claims of exact types with no unknown or duplicate fields.
//!
//! The chain a retry goes through lives here too, beside the token's ([`crate::verify`]), in the
//! same spirit: cheapest and most definite first, time passed in. [`check`] opens the state
//! (signature, expiry) and checks who sends it back (tenant, tool) and that it was not used
//! before; only then may the caller spend the work of planning the call, and
//! [`Opened::continues`] checks the plan and the queued request. Nothing else hands out a
//! [`Continued`], which is what using the state up takes: a caller that forgets a binding has
//! nothing to spend.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::Mac;
use serde::{Deserialize, Serialize};

use crate::plan::PlanHash;
use crate::refusal::Refusal;
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
    /// The request's number: the desk queue's id, or, on a team's server with several
    /// replicas, the number every replica knows the waiting call by.
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

/// What a used state's ledger entry is derived under ([`ledger_nonce`]).
const LEDGER_LABEL: &[u8] = b"countersign/request-state-used/v1";

/// The nonce a used state is recorded under in the nonce ledger, where a team's replicas share
/// what was spent: derived from the state's own nonce under a label of its own, so it is never
/// a token's nonce, and a state spent on one replica is spent on all.
pub fn ledger_nonce(nonce: &Nonce) -> Nonce {
    use sha2::Digest;
    let mut hash = sha2::Sha256::new();
    hash.update(LEDGER_LABEL);
    hash.update(nonce.as_bytes());
    let digest = hash.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    Nonce::from_bytes(bytes)
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

/// Why a retry's `requestState` was refused: each maps to a refusal code of the chain and says
/// the next move. Nothing of a refused state is trusted and nothing runs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StateRefusal {
    /// Its lifetime is over (`expired`).
    #[error("the requestState has expired")]
    Expired,
    /// Not sealed by this desk's current key as it is (`bad_token`).
    #[error("the requestState is not one this desk sealed: {0}")]
    NotOurs(StateError),
    /// Given to another connection (`wrong_tenant`).
    #[error("the requestState was given to another agent session")]
    WrongTenant,
    /// It continues a call of another tool (`wrong_tool`).
    #[error("the requestState continues a call of another tool")]
    WrongTool,
    /// Used before: each state works once (`already_used`).
    #[error("the requestState was used before")]
    Used,
    /// The arguments differ from those of the request it continues (`plan_changed`).
    #[error("the arguments differ from those of the request the requestState continues")]
    PlanChanged,
    /// The request it continues no longer waits (`expired`).
    #[error("the request the requestState continues is no longer queued")]
    RequestGone,
    /// Where used states are recorded cannot be reached now, so whether this one was used is
    /// not known (`ledger_unreachable`): refused, failing closed.
    #[error("the record of used requestStates cannot be reached")]
    Unreachable,
}

const AGAIN: &str =
    "Next: call the tool again without requestState; the desk asks the person anew.";

impl StateRefusal {
    /// The refusal code of the chain this amounts to.
    pub fn refusal(&self) -> Refusal {
        match self {
            StateRefusal::Expired | StateRefusal::RequestGone => Refusal::Expired,
            StateRefusal::NotOurs(_) => Refusal::BadToken,
            StateRefusal::WrongTenant => Refusal::WrongTenant,
            StateRefusal::WrongTool => Refusal::WrongTool,
            StateRefusal::Used => Refusal::AlreadyUsed,
            StateRefusal::PlanChanged => Refusal::PlanChanged,
            StateRefusal::Unreachable => Refusal::LedgerUnreachable,
        }
    }

    /// What the agent is told: why, and the next move.
    pub fn message(&self) -> String {
        let why = match self {
            StateRefusal::Expired => format!("the requestState has expired. {AGAIN}"),
            StateRefusal::NotOurs(e) => format!(
                "the requestState is not one this Countersign desk sealed ({e}). Do not retry \
                 with it. {AGAIN}"
            ),
            StateRefusal::WrongTenant => {
                format!("this requestState was given to another agent session. {AGAIN}")
            }
            StateRefusal::WrongTool => {
                format!("this requestState continues a call of another tool. {AGAIN}")
            }
            StateRefusal::Used => "this requestState was used before: each works once, and the \
                retry it answered got a new one or the call's result. Next: retry with the \
                newest requestState, or call the tool again without one."
                .to_owned(),
            StateRefusal::PlanChanged => "the arguments differ from those of the request this \
                requestState continues, which is what the person reads. Next: retry with the \
                arguments unchanged, or call the tool again without requestState to ask for the \
                new ones."
                .to_owned(),
            StateRefusal::RequestGone => format!(
                "the request this requestState continues is no longer in the Countersign desk \
                 (withdrawn, decided and collected, or expired). {AGAIN}"
            ),
            StateRefusal::Unreachable => "the record of used requestStates cannot be reached, \
                so this one may have been used already. Next: retry with the same requestState \
                in a moment; if it is then refused as used, call the tool again without one."
                .to_owned(),
        };
        format!("Refused: {why} Nothing was executed.")
    }
}

/// Who sends a state back: the connection the desk assigned and the tool called. Every field is
/// required.
#[derive(Debug, Clone, Copy)]
pub struct Retry<'a> {
    /// The connection the retry arrived on.
    pub tenant: &'a str,
    /// The tool it calls.
    pub tool: &'a str,
}

/// A state that opened and belongs to its retry; the plan and request are still to be checked.
#[derive(Debug)]
#[must_use = "a state is usable only once `continues` checked the plan and the request"]
pub struct Opened(StateClaims);

/// A state checked against every binding: the only thing a state is used up with.
#[derive(Debug)]
pub struct Continued(StateClaims);

impl Continued {
    /// Its claims.
    pub fn claims(&self) -> &StateClaims {
        &self.0
    }
}

/// The first half of the chain, before the call is planned: signature and expiry at `now_ms`,
/// tenant, tool, and whether the state was `used` before.
pub fn check(
    key: &SigningKey,
    text: &str,
    retry: &Retry<'_>,
    now_ms: u64,
    used: impl FnOnce(&Nonce) -> bool,
) -> Result<Opened, StateRefusal> {
    let claims = match open(key, text, now_ms) {
        Ok(claims) => claims,
        Err(StateError::Expired) => return Err(StateRefusal::Expired),
        Err(e) => return Err(StateRefusal::NotOurs(e)),
    };
    if claims.tenant != retry.tenant {
        return Err(StateRefusal::WrongTenant);
    }
    if claims.tool != retry.tool {
        return Err(StateRefusal::WrongTool);
    }
    if used(&claims.nonce) {
        return Err(StateRefusal::Used);
    }
    Ok(Opened(claims))
}

impl Opened {
    /// Its claims (the round it is on, for the answer).
    pub fn claims(&self) -> &StateClaims {
        &self.0
    }

    /// The request the state names (see [`StateClaims::request`]): what `queued` must be.
    pub fn request(&self) -> u64 {
        self.0.request
    }

    /// The second half: the retry's arguments plan to `plan`, and the call's request in the queue
    /// now is `queued` (`None`: none waits).
    pub fn continues(self, plan: PlanHash, queued: Option<u64>) -> Result<Continued, StateRefusal> {
        if plan != self.0.plan {
            return Err(StateRefusal::PlanChanged);
        }
        if queued != Some(self.0.request) {
            return Err(StateRefusal::RequestGone);
        }
        Ok(Continued(self.0))
    }
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

    fn retry() -> Retry<'static> {
        Retry {
            tenant: "conn-1",
            tool: "execute",
        }
    }

    #[test]
    fn the_chain_refuses_another_tenant_another_tool_and_a_used_state_before_any_planning() {
        let state = seal(&key(), &claims());
        let other_tenant = Retry {
            tenant: "conn-2",
            ..retry()
        };
        let other_tool = Retry {
            tool: "delete_backup",
            ..retry()
        };
        let refused = |r: Result<Opened, StateRefusal>| r.map(|_| ()).unwrap_err();
        assert_eq!(
            refused(check(&key(), &state, &other_tenant, 0, |_| false)),
            StateRefusal::WrongTenant
        );
        assert_eq!(
            refused(check(&key(), &state, &other_tool, 0, |_| false)),
            StateRefusal::WrongTool
        );
        assert_eq!(
            refused(check(&key(), &state, &retry(), 0, |_| true)),
            StateRefusal::Used
        );
        assert_eq!(
            refused(check(&key(), &state, &retry(), 10_000, |_| false)),
            StateRefusal::Expired
        );
        assert_eq!(
            refused(check(&key(), "csr1.x.y", &retry(), 0, |_| false)),
            StateRefusal::NotOurs(StateError::Malformed)
        );
    }

    #[test]
    fn a_state_continues_only_its_own_plan_and_queued_request() {
        let state = seal(&key(), &claims());
        let opened = || check(&key(), &state, &retry(), 0, |_| false).unwrap();
        assert_eq!(
            opened()
                .continues(PlanHash::from_bytes([1; 32]), Some(7))
                .unwrap_err(),
            StateRefusal::PlanChanged
        );
        assert_eq!(
            opened()
                .continues(PlanHash::from_bytes([9; 32]), Some(8))
                .unwrap_err(),
            StateRefusal::RequestGone
        );
        assert_eq!(
            opened()
                .continues(PlanHash::from_bytes([9; 32]), None)
                .unwrap_err(),
            StateRefusal::RequestGone
        );
        let continued = opened()
            .continues(PlanHash::from_bytes([9; 32]), Some(7))
            .unwrap();
        assert_eq!(continued.claims(), &claims());
        assert_eq!(opened().request(), 7);
    }

    #[test]
    fn a_used_states_ledger_entry_is_its_own_and_never_the_states_nonce() {
        let a = Nonce::from_bytes([3; 16]);
        let b = Nonce::from_bytes([4; 16]);
        assert_eq!(ledger_nonce(&a), ledger_nonce(&a));
        assert_ne!(ledger_nonce(&a), ledger_nonce(&b));
        assert_ne!(ledger_nonce(&a), a);
    }

    #[test]
    fn every_state_refusal_says_nothing_ran_and_maps_to_a_chain_code() {
        for r in [
            StateRefusal::Expired,
            StateRefusal::NotOurs(StateError::BadSignature),
            StateRefusal::WrongTenant,
            StateRefusal::WrongTool,
            StateRefusal::Used,
            StateRefusal::PlanChanged,
            StateRefusal::RequestGone,
            StateRefusal::Unreachable,
        ] {
            assert!(r.message().contains("Nothing was executed."), "{r:?}");
            assert_ne!(r.refusal(), Refusal::Pending);
        }
    }
}
