//! The team's upstreams, from a servers file every replica reads: the desk's `servers.json`
//! format, checked the desk's way (strict JSON, names, commands, URLs, keys).
//!
//! A value marked `{"secret": true}` is not in the file: each replica takes it from its own
//! environment (`COUNTERSIGN_SECRET_<SERVER>_<KEY>`, upper-cased, anything but letters and digits
//! as `_`) or from a file (`--secrets-dir DIR`: `DIR/<server>/<key>`, its bytes less one final
//! newline). A secret that is nowhere stops the start and is named (never its value). A stdio
//! server gets exactly the environment its entry lists, nothing of the server's own; an agent
//! never sees any of it.

use countersign_registry::Servers;
use countersign_session::reach::Headers;
use countersign_wire::{Reach, Setting, Upstream};
use zeroize::Zeroizing;

/// One upstream of the file, as a replica starts or reaches it.
#[derive(Debug)]
pub struct Configured {
    /// Its name in the file: its endpoint is `/mcp/<name>`, and policy and pins know it by it.
    pub name: String,
    /// What starts or reaches it.
    pub reach: Reach,
    /// Its headers (a URL's) and secret values (kept out of its stderr).
    pub headers: Headers,
}

/// Why the servers file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServersError {
    /// The file is not a valid servers file.
    #[error("--servers: {0}")]
    Invalid(String),
    /// The file names no server.
    #[error("--servers: the file names no server")]
    Empty,
    /// A secret value is in neither place.
    #[error(
        "server {server}: the secret {word} {key} is not set: put it in the environment as \
         {variable}, or in the file <--secrets-dir>/{server}/{key}"
    )]
    MissingSecret {
        /// The server.
        server: String,
        /// The key.
        key: String,
        /// "environment variable" or "header".
        word: &'static str,
        /// The variable that would hold it.
        variable: String,
    },
}

/// The environment variable that holds `server`'s secret `key`.
pub fn secret_variable(server: &str, key: &str) -> String {
    let part = |s: &str| {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_uppercase()
                } else {
                    '_'
                }
            })
            .collect::<String>()
    };
    format!("COUNTERSIGN_SECRET_{}_{}", part(server), part(key))
}

/// The upstreams of the servers file `text`, each secret value taken from `secret(server, key)`.
pub fn load(
    text: &str,
    secret: &mut dyn FnMut(&str, &str) -> Option<Zeroizing<String>>,
) -> Result<Vec<Configured>, ServersError> {
    let servers = Servers::parse(text).map_err(|e| ServersError::Invalid(e.to_string()))?;
    if servers.servers.is_empty() {
        return Err(ServersError::Empty);
    }
    let mut out = Vec::new();
    for (name, spec) in servers.servers {
        let word = spec.upstream.setting_word();
        let mut secrets = Vec::new();
        let mut values = Vec::new();
        for (key, setting) in spec.upstream.settings() {
            let value = match setting {
                Setting::Plain(v) => Zeroizing::new(v.clone()),
                Setting::Secret => {
                    let value = secret(&name, key).ok_or_else(|| ServersError::MissingSecret {
                        server: name.clone(),
                        key: key.clone(),
                        word,
                        variable: secret_variable(&name, key),
                    })?;
                    secrets.push(value.clone());
                    value
                }
            };
            values.push((key.clone(), value));
        }
        let (reach, headers) = match spec.upstream {
            Upstream::Stdio { command, cwd, .. } => (
                Reach::Command {
                    argv: command,
                    cwd: cwd.unwrap_or_default(),
                    env: values
                        .iter()
                        .map(|(k, v)| (k.clone(), v.as_str().to_owned()))
                        .collect(),
                },
                Headers::new(Vec::new(), secrets),
            ),
            Upstream::Http { url, .. } => (Reach::Url { url }, Headers::new(values, secrets)),
        };
        out.push(Configured {
            name,
            reach,
            headers,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"{"servers": {
        "github": {"command": ["github-mcp-server", "stdio"],
                   "env": {"GITHUB_TOKEN": {"secret": true}, "LOG": "warn"}},
        "api": {"url": "https://api.example.com/mcp", "headers": {"Authorization": {"secret": true}}}
    }}"#;

    #[test]
    fn secrets_come_from_the_replica_and_never_from_the_file() {
        let mut asked = Vec::new();
        let loaded = load(FILE, &mut |server, key| {
            asked.push(format!("{server}/{key}"));
            Some(Zeroizing::new(format!("value-of-{key}")))
        })
        .unwrap();
        assert_eq!(asked, ["api/Authorization", "github/GITHUB_TOKEN"]);
        let github = loaded.iter().find(|c| c.name == "github").unwrap();
        let Reach::Command { argv, env, .. } = &github.reach else {
            panic!()
        };
        assert_eq!(argv, &["github-mcp-server", "stdio"]);
        assert_eq!(
            env,
            &[
                (
                    "GITHUB_TOKEN".to_owned(),
                    "value-of-GITHUB_TOKEN".to_owned()
                ),
                ("LOG".to_owned(), "warn".to_owned())
            ]
        );
        // Nothing of the values in a Debug print.
        let shown = format!("{loaded:?}");
        assert!(!shown.contains("value-of-Authorization"), "{shown}");
    }

    #[test]
    fn a_missing_secret_names_where_it_would_be_and_a_bad_file_is_refused() {
        let err = load(FILE, &mut |_, _| None).unwrap_err();
        assert_eq!(
            err,
            ServersError::MissingSecret {
                server: "api".into(),
                key: "Authorization".into(),
                word: "header",
                variable: "COUNTERSIGN_SECRET_API_AUTHORIZATION".into(),
            }
        );
        assert_eq!(
            secret_variable("my-server.prod", "x-api-key"),
            "COUNTERSIGN_SECRET_MY_SERVER_PROD_X_API_KEY"
        );
        assert!(matches!(
            load(
                r#"{"servers": {"a": {"command": ["x"]}, "a": {"command": ["y"]}}}"#,
                &mut |_, _| None
            ),
            Err(ServersError::Invalid(_))
        ));
        assert_eq!(
            load(r#"{"servers": {}}"#, &mut |_, _| None).unwrap_err(),
            ServersError::Empty
        );
    }
}
