//! What the approvers' page of a team's server carries between requests, signed so that any
//! replica can check it and nobody else can make it: the session a passkey sign-in opens, and
//! the mark of when a call was shown.
//!
//! Both are MACs under keys derived from the server's signing secret (one label each, never the
//! token key itself), so replicas that share the secret share them, and a page can neither forge
//! nor stretch them. Neither is a permission to decide: a decision always needs a fresh passkey
//! assertion over the decision itself ([`crate::approver::Decision::passkey_challenge`]). The
//! session lets a person list the waiting calls; the mark lets the server hold the approve delay
//! from the moment the page had the call, as a desk holds it from the moment it showed it.
//! Pure: times are parameters.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::Mac as _;

use crate::token::SigningKey;

const SESSION_LABEL: &[u8] = b"countersign approver page session v1";
const SEEN_LABEL: &[u8] = b"countersign approver page seen v1";

/// The longest a page session lasts: listing needs no more, deciding always needs a passkey.
pub const SESSION_MS: u64 = 15 * 60 * 1_000;

/// A signed-in approver on the page.
#[derive(Clone, PartialEq, Eq)]
pub struct Session {
    /// The approver, by name on the roster.
    pub approver: String,
    /// The passkey that signed in (its credential id).
    pub credential: Vec<u8>,
    /// When the session ends, ms since the epoch.
    pub expires_at_ms: u64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("approver", &self.approver)
            .field("expires_at_ms", &self.expires_at_ms)
            .finish_non_exhaustive()
    }
}

fn session_mac(key: &SigningKey, body: &str) -> [u8; 32] {
    let mut mac = key.derived(SESSION_LABEL);
    mac.update(body.as_bytes());
    mac.finalize().into_bytes().into()
}

impl Session {
    /// The cookie's value: `v1.NAME.CREDENTIAL.EXPIRES.MAC` (name and credential in base64url).
    pub fn cookie(&self, key: &SigningKey) -> String {
        let body = format!(
            "v1.{}.{}.{}",
            URL_SAFE_NO_PAD.encode(self.approver.as_bytes()),
            URL_SAFE_NO_PAD.encode(&self.credential),
            self.expires_at_ms
        );
        let mac = session_mac(key, &body);
        format!("{body}.{}", URL_SAFE_NO_PAD.encode(mac))
    }

    /// The session a cookie's value carries, if this key made it and it has not ended at
    /// `now_ms`. Whether its approver and passkey still count is the roster's to say.
    pub fn from_cookie(key: &SigningKey, text: &str, now_ms: u64) -> Option<Session> {
        if text.len() > 4096 {
            return None;
        }
        let (body, mac) = text.rsplit_once('.')?;
        let mac = URL_SAFE_NO_PAD.decode(mac).ok()?;
        let mut check = key.derived(SESSION_LABEL);
        check.update(body.as_bytes());
        check.verify_slice(&mac).ok()?;
        let mut parts = body.split('.');
        let (Some("v1"), Some(name), Some(credential), Some(expires), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        let approver = String::from_utf8(URL_SAFE_NO_PAD.decode(name).ok()?).ok()?;
        let credential = URL_SAFE_NO_PAD.decode(credential).ok()?;
        let expires_at_ms: u64 = expires.parse().ok()?;
        (now_ms < expires_at_ms).then_some(Session {
            approver,
            credential,
            expires_at_ms,
        })
    }
}

/// The mark that the page had call `row` at `at_ms`: `AT.MAC`.
pub fn seen_mark(key: &SigningKey, row: u64, at_ms: u64) -> String {
    let mut mac = key.derived(SEEN_LABEL);
    mac.update(format!("{row}.{at_ms}").as_bytes());
    format!(
        "{at_ms}.{}",
        URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    )
}

/// When the page had call `row`, if `mark` is this key's mark of that call.
pub fn seen_at(key: &SigningKey, row: u64, mark: &str) -> Option<u64> {
    if mark.len() > 128 {
        return None;
    }
    let (at, mac) = mark.split_once('.')?;
    let at_ms: u64 = at.parse().ok()?;
    let mac = URL_SAFE_NO_PAD.decode(mac).ok()?;
    let mut check = key.derived(SEEN_LABEL);
    check.update(format!("{row}.{at_ms}").as_bytes());
    check.verify_slice(&mac).ok()?;
    Some(at_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> SigningKey {
        SigningKey::new(&[n; 32]).unwrap()
    }

    fn session() -> Session {
        Session {
            approver: "alice".into(),
            credential: vec![1, 2, 3],
            expires_at_ms: 10_000,
        }
    }

    #[test]
    fn a_session_reads_back_until_it_ends_and_only_under_its_key() {
        let cookie = session().cookie(&key(1));
        assert_eq!(
            Session::from_cookie(&key(1), &cookie, 9_999),
            Some(session())
        );
        assert_eq!(Session::from_cookie(&key(1), &cookie, 10_000), None);
        assert_eq!(Session::from_cookie(&key(2), &cookie, 0), None);
    }

    #[test]
    fn a_session_edited_in_any_part_is_nothing() {
        let cookie = session().cookie(&key(1));
        let other = Session {
            approver: "mallory".into(),
            ..session()
        }
        .cookie(&key(1));
        // Another's body under this one's MAC, a longer life, a flipped MAC, extra parts.
        let (body, mac) = cookie.rsplit_once('.').unwrap();
        let (other_body, _) = other.rsplit_once('.').unwrap();
        let longer = body.replace(".10000", ".99999999");
        let mut flipped = mac.to_owned();
        flipped.replace_range(0..1, if mac.starts_with('A') { "B" } else { "A" });
        for bad in [
            format!("{other_body}.{mac}"),
            format!("{longer}.{mac}"),
            format!("{body}.{flipped}"),
            format!("{body}.x.{mac}"),
            String::new(),
            "v1".into(),
            "a".repeat(5000),
        ] {
            assert_eq!(Session::from_cookie(&key(1), &bad, 0), None, "{bad}");
        }
    }

    #[test]
    fn a_seen_mark_names_one_call_and_one_time() {
        let mark = seen_mark(&key(1), 7, 1_234);
        assert_eq!(seen_at(&key(1), 7, &mark), Some(1_234));
        assert_eq!(seen_at(&key(1), 8, &mark), None);
        assert_eq!(seen_at(&key(2), 7, &mark), None);
        let (_, mac) = mark.split_once('.').unwrap();
        assert_eq!(seen_at(&key(1), 7, &format!("1000.{mac}")), None);
    }
}
