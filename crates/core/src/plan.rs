//! A plan: what a gated call would do, as a person approves it.
//!
//! The hash covers what the operation IS (tool, target, action, summary, details, reversible),
//! never how it was displayed, so a confirm is refused exactly when the operation changed. It is
//! SHA-256 over the plan's RFC 8785 canonical JSON ([`crate::canonical`]), which keeps every value's
//! type and `null`, so anyone can recompute it from history with any JCS implementation.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use crate::canonical::{self, CanonicalError};
use crate::token::{hex_lower, parse_hex};

/// What a gated call would do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The tool that would run.
    pub tool: String,
    /// What it acts on, resolved by policy (e.g. a path or a table name).
    pub target: String,
    /// The operation, by default the tool's name.
    pub action: String,
    /// One line built from a template and the plan, never from text the agent wrote.
    pub summary: String,
    /// Everything else the operation depends on: for a gateway, the call's arguments.
    pub details: serde_json::Value,
    /// Whether the operation can be undone.
    pub reversible: bool,
}

impl Plan {
    /// The plan as the JSON object that is hashed.
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::json!({
            "tool": self.tool,
            "target": self.target,
            "action": self.action,
            "summary": self.summary,
            "details": self.details,
            "reversible": self.reversible,
        })
    }

    /// The plan's canonical JSON (RFC 8785), within the limits of [`crate::canonical`].
    pub fn canonical_json(&self) -> Result<String, CanonicalError> {
        canonical::to_string(&self.to_value())
    }

    /// SHA-256 over the canonical JSON.
    pub fn hash(&self) -> Result<PlanHash, CanonicalError> {
        Ok(PlanHash::of_bytes(self.canonical_json()?.as_bytes()))
    }
}

/// A plan's SHA-256. Displayed and serialized as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PlanHash([u8; 32]);

impl PlanHash {
    /// Wraps a digest.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// SHA-256 of `bytes`.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    /// The digest.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex_lower(&self.0)
    }

    /// Parses exactly 64 lowercase hex digits.
    pub fn from_hex(text: &str) -> Option<Self> {
        parse_hex::<32>(text).map(Self)
    }
}

impl fmt::Debug for PlanHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PlanHash({})", self.to_hex())
    }
}

impl fmt::Display for PlanHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl Serialize for PlanHash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for PlanHash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        PlanHash::from_hex(&text)
            .ok_or_else(|| serde::de::Error::custom("plan hash: 64 lowercase hex digits"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan() -> Plan {
        Plan {
            tool: "write_file".into(),
            target: "/tmp/a.txt".into(),
            action: "write_file".into(),
            summary: "write_file on /tmp/a.txt".into(),
            details: json!({"path": "/tmp/a.txt", "content": "hi"}),
            reversible: false,
        }
    }

    #[test]
    fn plan_hash_is_sha256_of_its_canonical_json() {
        let p = plan();
        let canonical = p.canonical_json().unwrap();
        assert_eq!(
            canonical,
            r#"{"action":"write_file","details":{"content":"hi","path":"/tmp/a.txt"},"reversible":false,"summary":"write_file on /tmp/a.txt","target":"/tmp/a.txt","tool":"write_file"}"#
        );
        assert_eq!(p.hash().unwrap(), PlanHash::of_bytes(canonical.as_bytes()));
    }

    #[test]
    fn every_plan_field_is_bound_by_the_hash() {
        let base = plan().hash().unwrap();
        let mut changes: Vec<Plan> = Vec::new();
        let mut p = plan();
        p.tool = "write_file2".into();
        changes.push(p);
        let mut p = plan();
        p.target = "/tmp/b.txt".into();
        changes.push(p);
        let mut p = plan();
        p.action = "overwrite".into();
        changes.push(p);
        let mut p = plan();
        p.summary = "something else".into();
        changes.push(p);
        let mut p = plan();
        p.details = json!({"path": "/tmp/a.txt", "content": "hi!"});
        changes.push(p);
        let mut p = plan();
        p.reversible = true;
        changes.push(p);
        for changed in changes {
            assert_ne!(changed.hash().unwrap(), base, "{changed:?}");
        }
    }

    #[test]
    fn string_two_and_number_two_hash_differently() {
        let mut a = plan();
        a.details = json!({"v": 2});
        let mut b = plan();
        b.details = json!({"v": "2"});
        assert_ne!(a.hash().unwrap(), b.hash().unwrap());
    }

    #[test]
    fn null_detail_differs_from_a_missing_one() {
        let mut a = plan();
        a.details = json!({"v": null});
        let mut b = plan();
        b.details = json!({});
        assert_ne!(a.hash().unwrap(), b.hash().unwrap());
    }

    #[test]
    fn plan_hash_hex_round_trips_strictly() {
        let h = plan().hash().unwrap();
        assert_eq!(PlanHash::from_hex(&h.to_hex()), Some(h));
        assert_eq!(PlanHash::from_hex(&h.to_hex().to_uppercase()), None);
        assert_eq!(PlanHash::from_hex(&h.to_hex()[1..]), None);
    }
}
