//! `servers.json`: the registry as a file a person can read (and edit, though an edit made
//! outside the desk waits for their click). It holds no secret value, only which keys are secret.
//!
//! The desk always writes the same text for the same registry (sorted names and keys, two-space
//! indent, a final newline), so the text it accepted can be compared with the file byte for byte.

use crate::error::RegistryError;
use std::collections::BTreeMap;

use countersign_wire::{ServerSpec, check_name};
use serde::{Deserialize, Serialize};

/// The file's name in the desk's config directory.
pub const FILE_NAME: &str = "servers.json";

/// The registry: servers by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Servers {
    /// Them.
    #[serde(default)]
    pub servers: BTreeMap<String, ServerSpec>,
}

impl Servers {
    /// Parses and checks the file's text: every name, command, URL, key and value.
    pub fn parse(text: &str) -> Result<Servers, RegistryError> {
        let invalid = |reason: String| RegistryError::Invalid {
            file: FILE_NAME,
            reason,
        };
        // Strict first: a name or key given twice would otherwise be read as its last spelling,
        // and a change could hide behind the first.
        let value = countersign_core::canonical::parse_strict(text)
            .map_err(|e| invalid(format!("{FILE_NAME} is not valid: {e}")))?;
        let servers: Servers = serde_json::from_value(value)
            .map_err(|e| invalid(format!("{FILE_NAME} is not valid: {e}")))?;
        for (name, spec) in &servers.servers {
            check_name(name).map_err(|e| invalid(format!("{FILE_NAME}: {e}")))?;
            spec.check()
                .map_err(|e| invalid(format!("{FILE_NAME}: server {name}: {e}")))?;
        }
        Ok(servers)
    }

    /// The text the desk writes for it.
    pub fn text(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("a registry serializes");
        text.push('\n');
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_registry_always_gives_the_same_text() {
        let text = r#"{"servers": {"b": {"command": ["b"]}, "a": {"url": "https://a.example/mcp", "headers": {"X": "1"}}}}"#;
        let servers = Servers::parse(text).unwrap();
        let written = servers.text();
        assert_eq!(Servers::parse(&written).unwrap(), servers);
        assert_eq!(Servers::parse(&written).unwrap().text(), written);
        assert!(written.find("\"a\"").unwrap() < written.find("\"b\"").unwrap());
    }

    #[test]
    fn a_bad_name_or_spec_in_the_file_is_refused() {
        assert!(Servers::parse(r#"{"servers": {"a b": {"command": ["x"]}}}"#).is_err());
        assert!(Servers::parse(r#"{"servers": {"a": {"command": []}}}"#).is_err());
        assert!(Servers::parse(r#"{"servers": {}, "extra": 1}"#).is_err());
        assert_eq!(Servers::parse("{}").unwrap(), Servers::default());
        assert!(
            Servers::parse(r#"{"servers": {"a": {"command": ["x"]}, "a": {"command": ["y"]}}}"#)
                .is_err()
        );
    }
}
