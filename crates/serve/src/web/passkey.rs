//! Passkeys through webauthn-rs-core: enrolling one, and checking an assertion over a challenge
//! that is ours (a sign-in's random one, or the digest of a decision).
//!
//! webauthn-rs-core does the cryptography and the WebAuthn checks (the client data's type,
//! challenge and origin; the RP ID hash; user presence and verification; the signature with the
//! credential's COSE key; the counter). What it leaves to its caller is kept here: user
//! verification is always required, the challenge of an assertion is set by us (the core draws
//! its own; its ceremony state is plain data, so ours replaces it before the check), and the
//! counter's move forward is recorded in the records by the caller in one statement, so two
//! replicas cannot both accept one assertion.
//!
//! [`verify_kept`] checks a kept decision's assertion again, offline, from the credential on
//! the exported roster: the same checks, with the counter left out (the roster's counter is the
//! newest; an old decision's is lower, as it should be).

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use countersign_store::Assertion;
use serde_json::{Value, json};
use url::Url;
use webauthn_rs_core::WebauthnCore;
use webauthn_rs_core::proto::{
    AuthenticationState, Credential, PublicKeyCredential, RegisterPublicKeyCredential,
    RegistrationState, RequestChallengeResponse, UserVerificationPolicy,
};

/// How long a browser gives a person to touch the authenticator.
const CEREMONY_TIMEOUT: Duration = Duration::from_secs(120);

/// Why a passkey ceremony did not succeed. Codes are stable; nothing here carries a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PasskeyError {
    /// The page's origin is not a URL a passkey can be bound to (https://, or http://localhost).
    #[error("the approvers' page origin must be https://HOST[:PORT] (or http://localhost:PORT)")]
    BadOrigin,
    /// What the browser sent is not a WebAuthn response of the expected kind.
    #[error("not a passkey response: {0}")]
    Malformed(String),
    /// The response does not check: another challenge, origin or RP, no user verification, a
    /// bad signature, a counter gone back, an unknown credential.
    #[error("the passkey's response does not check: {0}")]
    Refused(String),
    /// A ceremony state that we made and kept does not read back (a damaged row).
    #[error("a kept passkey ceremony does not read back: {0}")]
    BadState(String),
}

impl PasskeyError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            PasskeyError::BadOrigin => "bad_origin",
            PasskeyError::Malformed(_) => "malformed",
            PasskeyError::Refused(_) => "passkey_refused",
            PasskeyError::BadState(_) => "bad_state",
        }
    }
}

/// The relying party: this server's approvers' page, at one origin.
pub struct Relying {
    core: WebauthnCore,
    origin: Url,
}

impl std::fmt::Debug for Relying {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relying")
            .field("origin", &self.origin.as_str())
            .finish()
    }
}

/// What an assertion that checked says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The credential that signed.
    pub credential_id: Vec<u8>,
    /// Its signature counter now (0 for an authenticator that keeps none).
    pub counter: u32,
    /// The assertion, to keep.
    pub assertion: Assertion,
}

/// The origin `text` as a passkey can be bound to it: `https://HOST[:PORT]`, or
/// `http://localhost[:PORT]` (browsers treat localhost as secure), with nothing after.
pub fn origin(text: &str) -> Result<Url, PasskeyError> {
    let url = Url::parse(text).map_err(|_| PasskeyError::BadOrigin)?;
    let host = url.host_str().ok_or(PasskeyError::BadOrigin)?;
    let secure = url.scheme() == "https" || (url.scheme() == "http" && host == "localhost");
    let bare = url.path() == "/"
        && url.query().is_none()
        && url.fragment().is_none()
        && url.username().is_empty()
        && url.password().is_none();
    // An IP address is not a valid RP ID.
    let named = matches!(url.host(), Some(url::Host::Domain(_)));
    if secure && bare && named {
        Ok(url)
    } else {
        Err(PasskeyError::BadOrigin)
    }
}

impl Relying {
    /// The relying party of the page at `origin` (see [`origin`]); its RP ID is the host.
    pub fn new(origin: Url) -> Result<Relying, PasskeyError> {
        let rp_id = origin.host_str().ok_or(PasskeyError::BadOrigin)?.to_owned();
        let core = WebauthnCore::new_unsafe_experts_only(
            "Countersign approvers",
            &rp_id,
            vec![origin.clone()],
            CEREMONY_TIMEOUT,
            Some(false),
            Some(false),
        );
        Ok(Relying { core, origin })
    }

    /// The page's origin.
    pub fn origin(&self) -> &Url {
        &self.origin
    }

    /// Begins enrolling a passkey for approver `name` (`user_id`: stable bytes for the person),
    /// not one of `existing` (credential ids): the options for the browser, and the ceremony
    /// to keep until it finishes.
    pub fn begin_enrolment(
        &self,
        name: &str,
        user_id: &[u8],
        existing: Vec<Vec<u8>>,
    ) -> Result<(Value, String), PasskeyError> {
        let builder = self
            .core
            .new_challenge_register_builder(user_id, name, name)
            .map_err(|e| PasskeyError::Malformed(e.to_string()))?
            .user_verification_policy(UserVerificationPolicy::Required)
            .require_resident_key(true)
            .exclude_credentials(Some(existing.into_iter().map(Into::into).collect()));
        let (options, state) = self
            .core
            .generate_challenge_register(builder)
            .map_err(|e| PasskeyError::Malformed(e.to_string()))?;
        let state =
            serde_json::to_string(&state).map_err(|e| PasskeyError::BadState(e.to_string()))?;
        let options =
            serde_json::to_value(&options).map_err(|e| PasskeyError::BadState(e.to_string()))?;
        Ok((options, state))
    }

    /// Finishes an enrolment begun as `state` with the browser's `response`: the credential's
    /// id, the credential to keep (as JSON), and its signature counter so far.
    pub fn finish_enrolment(
        &self,
        response: &Value,
        state: &str,
    ) -> Result<(Vec<u8>, String, u32), PasskeyError> {
        let response: RegisterPublicKeyCredential = serde_json::from_value(response.clone())
            .map_err(|e| PasskeyError::Malformed(e.to_string()))?;
        let state: RegistrationState =
            serde_json::from_str(state).map_err(|e| PasskeyError::BadState(e.to_string()))?;
        let credential = self
            .core
            .register_credential(&response, &state, None)
            .map_err(|e| PasskeyError::Refused(e.to_string()))?;
        if !credential.user_verified {
            return Err(PasskeyError::Refused("no user verification".into()));
        }
        let id = credential.cred_id.as_slice().to_vec();
        let kept = serde_json::to_string(&credential)
            .map_err(|e| PasskeyError::BadState(e.to_string()))?;
        Ok((id, kept, credential.counter))
    }

    /// The browser's options for an assertion over `challenge` by one of `allowed` (credential
    /// ids; empty: any passkey of this site the person picks).
    pub fn assertion_options(
        &self,
        challenge: &[u8; 32],
        allowed: &[Vec<u8>],
    ) -> Result<Value, PasskeyError> {
        let (options, _) = self.state(&[], challenge)?;
        let mut options =
            serde_json::to_value(&options).map_err(|e| PasskeyError::BadState(e.to_string()))?;
        options["publicKey"]["allowCredentials"] = allowed
            .iter()
            .map(|id| json!({ "type": "public-key", "id": URL_SAFE_NO_PAD.encode(id) }))
            .collect();
        Ok(options)
    }

    /// Checks the browser's assertion `response` over `challenge` by `credential` (the kept
    /// JSON of the passkey whose id the response names). The caller records the counter.
    pub fn check(
        &self,
        response: &Value,
        credential: &str,
        challenge: &[u8; 32],
    ) -> Result<Checked, PasskeyError> {
        let response: PublicKeyCredential = serde_json::from_value(response.clone())
            .map_err(|e| PasskeyError::Malformed(e.to_string()))?;
        let credential: Credential =
            serde_json::from_str(credential).map_err(|e| PasskeyError::BadState(e.to_string()))?;
        check_with(&self.core, &response, credential, challenge)
    }

    /// The core's ceremony for `credentials`, with `challenge` in place of the one it drew.
    fn state(
        &self,
        credentials: &[Credential],
        challenge: &[u8; 32],
    ) -> Result<(RequestChallengeResponse, AuthenticationState), PasskeyError> {
        state(&self.core, credentials, challenge)
    }
}

/// The credential id a browser's assertion `response` names, if it is one.
pub fn asserted_id(response: &Value) -> Option<Vec<u8>> {
    let text = response.get("rawId")?.as_str()?;
    URL_SAFE_NO_PAD.decode(text.trim_end_matches('=')).ok()
}

fn state(
    core: &WebauthnCore,
    credentials: &[Credential],
    challenge: &[u8; 32],
) -> Result<(RequestChallengeResponse, AuthenticationState), PasskeyError> {
    let builder = core
        .new_challenge_authenticate_builder(
            credentials.to_vec(),
            Some(UserVerificationPolicy::Required),
        )
        .map_err(|e| PasskeyError::Malformed(e.to_string()))?;
    let (mut options, state) = core
        .generate_challenge_authenticate(builder)
        .map_err(|e| PasskeyError::Malformed(e.to_string()))?;
    // The core's ceremony state is plain data that it documents as safe to keep and read back;
    // its challenge is replaced by ours, and nothing else is touched.
    let mut state =
        serde_json::to_value(&state).map_err(|e| PasskeyError::BadState(e.to_string()))?;
    let ours = URL_SAFE_NO_PAD.encode(challenge);
    match state.get_mut("challenge") {
        Some(slot) => *slot = Value::String(ours.clone()),
        None => {
            return Err(PasskeyError::BadState(
                "no challenge in the ceremony".into(),
            ));
        }
    }
    let state: AuthenticationState =
        serde_json::from_value(state).map_err(|e| PasskeyError::BadState(e.to_string()))?;
    options.public_key.challenge = challenge.to_vec().into();
    Ok((options, state))
}

fn check_with(
    core: &WebauthnCore,
    response: &PublicKeyCredential,
    credential: Credential,
    challenge: &[u8; 32],
) -> Result<Checked, PasskeyError> {
    let (_, state) = state(core, std::slice::from_ref(&credential), challenge)?;
    let result = core
        .authenticate_credential(response, &state)
        .map_err(|e| PasskeyError::Refused(e.to_string()))?;
    if !result.user_verified() {
        return Err(PasskeyError::Refused("no user verification".into()));
    }
    Ok(Checked {
        credential_id: result.cred_id().as_slice().to_vec(),
        counter: result.counter(),
        assertion: Assertion {
            credential_id: response.raw_id.as_slice().to_vec(),
            authenticator_data: response.response.authenticator_data.as_slice().to_vec(),
            client_data: response.response.client_data_json.as_slice().to_vec(),
            signature: response.response.signature.as_slice().to_vec(),
        },
    })
}

/// Checks a kept assertion over `challenge` again, offline: by the passkey whose kept JSON is
/// `credential`, for the page at `origin`. The counter is not compared (the roster's is the
/// newest); everything else is checked as when it was made.
pub fn verify_kept(
    origin: Url,
    credential: &str,
    assertion: &Assertion,
    challenge: &[u8; 32],
) -> Result<(), PasskeyError> {
    let relying = Relying::new(origin)?;
    let mut credential: Credential =
        serde_json::from_str(credential).map_err(|e| PasskeyError::BadState(e.to_string()))?;
    credential.counter = 0;
    let response = json!({
        "id": URL_SAFE_NO_PAD.encode(&assertion.credential_id),
        "rawId": URL_SAFE_NO_PAD.encode(&assertion.credential_id),
        "type": "public-key",
        "response": {
            "authenticatorData": URL_SAFE_NO_PAD.encode(&assertion.authenticator_data),
            "clientDataJSON": URL_SAFE_NO_PAD.encode(&assertion.client_data),
            "signature": URL_SAFE_NO_PAD.encode(&assertion.signature),
        },
    });
    let response: PublicKeyCredential =
        serde_json::from_value(response).map_err(|e| PasskeyError::Malformed(e.to_string()))?;
    check_with(&relying.core, &response, credential, challenge).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_origin_is_https_or_localhost_named_and_bare() {
        for good in [
            "https://approve.example.com",
            "https://approve.example.com:8443/",
            "http://localhost:8080",
        ] {
            assert!(origin(good).is_ok(), "{good}");
        }
        for bad in [
            "http://approve.example.com",
            "https://127.0.0.1",
            "http://127.0.0.1:8080",
            "https://approve.example.com/page",
            "https://approve.example.com/?x=1",
            "https://user@approve.example.com",
            "ftp://approve.example.com",
            "not a url",
        ] {
            assert_eq!(origin(bad), Err(PasskeyError::BadOrigin), "{bad}");
        }
    }

    #[test]
    fn assertion_options_carry_our_challenge_and_the_allowed_credentials() {
        let relying = Relying::new(origin("https://approve.example.com").unwrap()).unwrap();
        let challenge = [7u8; 32];
        let options = relying
            .assertion_options(&challenge, &[vec![1, 2, 3]])
            .unwrap();
        let key = &options["publicKey"];
        assert_eq!(key["challenge"], URL_SAFE_NO_PAD.encode(challenge));
        assert_eq!(key["rpId"], "approve.example.com");
        assert_eq!(key["userVerification"], "required");
        assert_eq!(key["allowCredentials"][0]["id"], "AQID");
    }

    #[test]
    fn garbage_is_malformed_and_never_checks() {
        let relying = Relying::new(origin("https://approve.example.com").unwrap()).unwrap();
        for bad in [json!(null), json!({}), json!({"rawId": 5}), json!("x")] {
            let err = relying.check(&bad, "{}", &[0; 32]).unwrap_err();
            assert_eq!(err.code(), "malformed", "{bad}");
        }
    }
}
