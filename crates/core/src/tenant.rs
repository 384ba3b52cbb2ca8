//! Who a call is for: the tenant that a token, an approval, a grant and a history event are
//! bound to, and that a confirm is checked against (`wrong_tenant`).
//!
//! Why a type of its own: a tenant is decided by the authority, never said by the agent. On a
//! desk it is the gateway connection the desk assigned ([`Tenant::connection`]); on a team server
//! it is the authenticated caller together with the server ([`Tenant::team`]). Spelling it in one
//! place keeps every host building it the same way, and a `&Tenant` parameter cannot be handed
//! an agent's string by mistake where a `&str` could. A tenant read back from the records or
//! from a token the authority itself signed is [`Tenant::recorded`].
//!
//! A tenant is not a secret (it is shown to the person and kept in history), so `Debug` and
//! `Display` print it.

use crate::server::ServerId;

/// Who a call is for (see the module's doc).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Tenant(String);

impl Tenant {
    /// A desk's gateway connection, by the random number the desk drew for it:
    /// `conn-` and 16 hexadecimal digits.
    pub fn connection(random: u64) -> Tenant {
        Tenant(format!("conn-{random:016x}"))
    }

    /// A team server's caller on `server`: the caller as authenticated (`jwt:ISSUER#SUBJECT`,
    /// `key:NAME`, or `unauthenticated` on loopback), `@`, and the server. A server of the
    /// servers file is named (`server:NAME`); any other by the first 8 bytes of the SHA-256 of its
    /// identity in hexadecimal (`upstream:HEX`), because that identity may be a command line or
    /// a URL carrying a credential, and the tenant is shown and kept in history.
    pub fn team(caller: &str, server: &ServerId) -> Tenant {
        let server = match server {
            ServerId::Registered(name) => format!("server:{name}"),
            other => {
                use sha2::Digest as _;
                let digest = sha2::Sha256::digest(other.key().as_bytes());
                let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
                format!("upstream:{hex}")
            }
        };
        Tenant(format!("{caller}@{server}"))
    }

    /// A tenant as the authority recorded it: read back from the records (a waiting call, an
    /// approval, a grant, history) or from a token or request state the authority signed. Never
    /// for text an agent sent.
    pub fn recorded(text: impl Into<String>) -> Tenant {
        Tenant(text.into())
    }

    /// Whether this is a desk's gateway connection ([`Tenant::connection`]): a team's caller
    /// always carries `@` and its server.
    pub fn is_connection(&self) -> bool {
        self.0.starts_with("conn-") && !self.0.contains('@')
    }

    /// The tenant as text, as records, tokens and history keep it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tenant({:?})", self.0)
    }
}

impl AsRef<str> for Tenant {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for Tenant {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for Tenant {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Tenant {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_conn_and_sixteen_hex_digits() {
        assert_eq!(Tenant::connection(0xab).as_str(), "conn-00000000000000ab");
        assert_ne!(Tenant::connection(1), Tenant::connection(2));
    }

    #[test]
    fn a_team_caller_names_a_registered_server_and_digests_any_other() {
        let named = Tenant::team("key:ci", &ServerId::Registered("db".into()));
        assert_eq!(named.as_str(), "key:ci@server:db");
        let secret_url = ServerId::Url("https://user:hunter2@example.test/mcp".into());
        let digested = Tenant::team("key:ci", &secret_url);
        assert!(digested.as_str().starts_with("key:ci@upstream:"));
        assert_eq!(digested.as_str().len(), "key:ci@upstream:".len() + 16);
        assert!(!digested.as_str().contains("hunter2"));
        assert_ne!(Tenant::team("key:other", &secret_url), digested);
    }

    #[test]
    fn a_recorded_tenant_is_the_same_tenant_and_serializes_as_its_text() {
        let t = Tenant::connection(7);
        assert_eq!(Tenant::recorded(t.as_str()), t);
        assert_eq!(
            serde_json::to_value(&t).unwrap(),
            serde_json::json!(t.as_str())
        );
        assert_eq!(format!("{t}"), t.as_str());
    }
}
