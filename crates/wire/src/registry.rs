//! The registry's part of the protocol: what `countersign server ...` and `countersign install`
//! ask of the desk, and how it answers.
//!
//! A registered server is a name the desk runs a command (or reaches a URL) for, with an
//! environment or headers whose secret values live in the OS keychain, never in a file. The
//! command line only proposes: a new name takes effect at once (it reaches no existing secret), a
//! change or removal of an existing one waits for the person's click in the window, and the
//! answer follows the decision. Only the desk's own account may ask (a listed agent account may
//! not: a registered command runs as the person).
//!
//! The conversation is one [`Hello::Registry`](crate::Hello::Registry), then one or two `R`
//! frames ([`RegistryAnswer`]): [`RegistryAnswer::Waiting`] first when the person must decide,
//! then the outcome.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use zeroize::Zeroizing;

/// The longest server name.
pub const MAX_NAME: usize = 64;
/// The most environment variables or headers of one server.
pub const MAX_SETTINGS: usize = 256;
/// The longest value, command argument or URL, in bytes.
pub const MAX_VALUE: usize = 64 * 1024;

/// A server registered in the desk, as the registry file holds it and the command line shows it:
/// secret values are never in it, only which keys are secret.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawSpec")]
pub struct ServerSpec {
    /// What reaches it: a command the desk starts, or a URL.
    pub upstream: Upstream,
}

impl Serialize for ServerSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.upstream.serialize(s)
    }
}

/// A spec as written: exactly one of `command` and `url`, and only the keys that go with it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    command: Option<Vec<String>>,
    cwd: Option<String>,
    env: Option<BTreeMap<String, Setting>>,
    url: Option<String>,
    headers: Option<BTreeMap<String, Setting>>,
}

impl TryFrom<RawSpec> for ServerSpec {
    type Error = Invalid;

    fn try_from(raw: RawSpec) -> Result<Self, Invalid> {
        let upstream = match raw {
            RawSpec {
                command: Some(command),
                cwd,
                env,
                url: None,
                headers: None,
            } => Upstream::Stdio {
                command,
                cwd,
                env: env.unwrap_or_default(),
            },
            RawSpec {
                command: None,
                cwd: None,
                env: None,
                url: Some(url),
                headers,
            } => Upstream::Http {
                url,
                headers: headers.unwrap_or_default(),
            },
            _ => {
                return Err(Invalid(
                    "a server has a `command` (with `cwd` and `env`) or a `url` (with                      `headers`), not both or neither"
                        .into(),
                ));
            }
        };
        Ok(ServerSpec { upstream })
    }
}

/// How the desk reaches a registered server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Upstream {
    /// A stdio server the desk starts as its own child.
    Stdio {
        /// The program and its arguments.
        command: Vec<String>,
        /// The working directory (the desk's own when absent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<String>,
        /// Its whole environment: nothing else of the desk's is passed on.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        env: BTreeMap<String, Setting>,
    },
    /// A streamable-HTTP server.
    Http {
        /// Its URL.
        url: String,
        /// Headers sent with every request.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        headers: BTreeMap<String, Setting>,
    },
}

impl Upstream {
    /// The environment variables or headers.
    pub fn settings(&self) -> &BTreeMap<String, Setting> {
        match self {
            Upstream::Stdio { env, .. } => env,
            Upstream::Http { headers, .. } => headers,
        }
    }

    /// The names of the secret ones.
    pub fn secret_keys(&self) -> BTreeSet<&str> {
        self.settings()
            .iter()
            .filter(|(_, v)| matches!(v, Setting::Secret))
            .map(|(k, _)| k.as_str())
            .collect()
    }

    /// "environment variable" or "header".
    pub fn setting_word(&self) -> &'static str {
        match self {
            Upstream::Stdio { .. } => "environment variable",
            Upstream::Http { .. } => "header",
        }
    }
}

/// The value of an environment variable or header: kept in the registry file, or secret (in the
/// OS keychain; the file says only that it is secret, as `{"secret": true}`).
#[derive(Clone, PartialEq, Eq)]
pub enum Setting {
    /// A value that may sit in a file.
    Plain(String),
    /// A value kept in the OS keychain.
    Secret,
}

impl fmt::Debug for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Setting::Plain(v) => write!(f, "{v:?}"),
            Setting::Secret => f.write_str("<secret>"),
        }
    }
}

impl Serialize for Setting {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Mark {
            secret: bool,
        }
        match self {
            Setting::Plain(v) => s.serialize_str(v),
            Setting::Secret => Mark { secret: true }.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Setting {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Mark {
            secret: bool,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Plain(String),
            Mark(Mark),
        }
        match Either::deserialize(d)? {
            Either::Plain(v) => Ok(Setting::Plain(v)),
            Either::Mark(Mark { secret: true }) => Ok(Setting::Secret),
            Either::Mark(Mark { secret: false }) => Err(serde::de::Error::custom(
                "a value is a string, or {\"secret\": true} for one kept in the keychain",
            )),
        }
    }
}

/// A secret value on its way to the desk (or a backup on its way back): never printed, wiped
/// from memory when dropped.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretText(Zeroizing<String>);

impl SecretText {
    /// Wraps `text`.
    pub fn new(text: String) -> Self {
        Self(Zeroizing::new(text))
    }

    /// The value itself: for the keychain, the upstream's environment, a restored file.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<secret: {} bytes>", self.0.len())
    }
}

/// What the command line asks of the registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum RegistryRequest {
    /// The registered servers.
    List,
    /// Register `name` as `spec`, with a value for each secret key of it. A new name takes
    /// effect at once; for an existing one this is a change the person decides (identical:
    /// nothing to do).
    Put {
        /// The server's name.
        name: String,
        /// What it is.
        spec: ServerSpec,
        /// A value for each secret key of `spec`, and no other.
        secrets: BTreeMap<String, SecretText>,
    },
    /// Remove `name` (the person decides) and its secrets.
    Remove {
        /// The server's name.
        name: String,
    },
    /// Keep `text` in the keychain under `key`: the original of a client's configuration that
    /// `countersign install` rewrote (it holds the credentials it had).
    KeepBackup {
        /// Which backup (client and file).
        key: String,
        /// The file's original bytes, as text.
        text: SecretText,
    },
    /// The backup kept under `key`, if any.
    TakeBackup {
        /// Which backup.
        key: String,
    },
    /// Forget the backup kept under `key`.
    DropBackup {
        /// Which backup.
        key: String,
    },
}

/// The desk's answer to a [`RegistryRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
#[non_exhaustive]
pub enum RegistryAnswer {
    /// The registered servers, by name.
    Servers {
        /// Them.
        servers: BTreeMap<String, ServerSpec>,
    },
    /// Done: the change took effect (or there was nothing to change).
    Done {
        /// What happened, for a person.
        message: String,
    },
    /// The change is shown in the desk's window; its outcome follows.
    Waiting {
        /// What the person is asked, for the terminal.
        message: String,
    },
    /// The person denied the change (or it was withdrawn): nothing changed.
    Denied {
        /// Why, for a person (the person's note, if they wrote one).
        message: String,
    },
    /// A backup, or none under that key.
    Backup {
        /// It.
        text: Option<SecretText>,
    },
    /// The request cannot be served.
    Refused {
        /// Why, as a code.
        code: RegistryCode,
        /// Why, for a person.
        message: String,
    },
}

/// Why a registry request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RegistryCode {
    /// No server has that name.
    NoSuchServer,
    /// The request is malformed: a bad name, key or value, a missing or extra secret.
    BadRequest,
    /// The OS keychain cannot hold or give the secrets.
    NoKeychain,
    /// Only the desk's own account may change the registry.
    AccountNotAllowed,
    /// The desk could not store the change.
    Failed,
}

impl RegistryCode {
    /// The code as it appears on the wire.
    pub fn code(self) -> &'static str {
        match self {
            RegistryCode::NoSuchServer => "no_such_server",
            RegistryCode::BadRequest => "bad_request",
            RegistryCode::NoKeychain => "no_keychain",
            RegistryCode::AccountNotAllowed => "account_not_allowed",
            RegistryCode::Failed => "failed",
        }
    }
}

/// Why a name, key or value is not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

/// Checks a server's name: 1 to [`MAX_NAME`] ASCII letters, digits, `.`, `_` or `-`, starting
/// with a letter or digit. Names are shown to the person and typed into configs, so nothing that
/// can look like something else.
pub fn check_name(name: &str) -> Result<(), Invalid> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(Invalid(format!(
            "a server name is 1 to {MAX_NAME} ASCII letters, digits, '.', '_' or '-', starting \
             with a letter or digit, not {name:?}"
        )))
    }
}

fn check_value(what: &str, value: &str) -> Result<(), Invalid> {
    if value.len() > MAX_VALUE {
        return Err(Invalid(format!("{what} is longer than {MAX_VALUE} bytes")));
    }
    if value.contains('\0') {
        return Err(Invalid(format!("{what} contains a NUL character")));
    }
    Ok(())
}

impl ServerSpec {
    /// Checks everything the desk will run or send: a command and URL that can be used, keys
    /// that are environment variable or header names, no NUL, nothing absurdly large.
    pub fn check(&self) -> Result<(), Invalid> {
        let settings = self.upstream.settings();
        if settings.len() > MAX_SETTINGS {
            return Err(Invalid(format!(
                "more than {MAX_SETTINGS} {}s",
                self.upstream.setting_word()
            )));
        }
        match &self.upstream {
            Upstream::Stdio { command, cwd, env } => {
                if command.is_empty() || command[0].is_empty() {
                    return Err(Invalid("a stdio server needs a command".into()));
                }
                if command.len() > MAX_SETTINGS {
                    return Err(Invalid(format!("more than {MAX_SETTINGS} arguments")));
                }
                for arg in command {
                    check_value("an argument", arg)?;
                }
                if let Some(cwd) = cwd {
                    check_value("the working directory", cwd)?;
                    if !cwd.starts_with('/') {
                        return Err(Invalid(format!(
                            "the working directory must be an absolute path, not {cwd:?}"
                        )));
                    }
                }
                for (key, value) in env {
                    let ok = key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                        && key.len() <= 256;
                    if !ok {
                        return Err(Invalid(format!(
                            "{key:?} is not an environment variable name (ASCII letters, digits \
                             and '_', not starting with a digit)"
                        )));
                    }
                    if let Setting::Plain(v) = value {
                        check_value(&format!("the value of {key}"), v)?;
                    }
                }
            }
            Upstream::Http { url, headers } => {
                check_value("the URL", url)?;
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(Invalid(format!(
                        "the URL must be http:// or https://, not {url:?}"
                    )));
                }
                for (key, value) in headers {
                    let ok = !key.is_empty()
                        && key.len() <= 256
                        && key
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                    if !ok {
                        return Err(Invalid(format!("{key:?} is not an HTTP header name")));
                    }
                    if let Setting::Plain(v) = value {
                        check_value(&format!("the header {key}"), v)?;
                        if v.contains(['\r', '\n']) {
                            return Err(Invalid(format!("the header {key} contains a line break")));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Checks that `secrets` holds a value for each secret key of this spec and nothing else,
    /// and that each value can be used.
    pub fn check_secrets(&self, secrets: &BTreeMap<String, SecretText>) -> Result<(), Invalid> {
        let wanted = self.upstream.secret_keys();
        for key in secrets.keys() {
            if !wanted.contains(key.as_str()) {
                return Err(Invalid(format!(
                    "a secret value was given for {key}, which is not a secret {} of this server",
                    self.upstream.setting_word()
                )));
            }
        }
        for key in wanted {
            let Some(value) = secrets.get(key) else {
                return Err(Invalid(format!("no value was given for the secret {key}")));
            };
            check_value(&format!("the secret {key}"), value.expose())?;
            if matches!(self.upstream, Upstream::Http { .. })
                && value.expose().contains(['\r', '\n'])
            {
                return Err(Invalid(format!(
                    "the secret header {key} contains a line break"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stdio(env: serde_json::Value) -> ServerSpec {
        serde_json::from_value(json!({"command": ["gh-server", "stdio"], "env": env})).unwrap()
    }

    #[test]
    fn a_secret_setting_is_a_mark_in_the_file_and_never_its_value() {
        let spec = stdio(json!({"LOG": "info", "TOKEN": {"secret": true}}));
        assert_eq!(spec.upstream.secret_keys(), BTreeSet::from(["TOKEN"]));
        assert_eq!(
            serde_json::to_value(&spec).unwrap(),
            json!({"command": ["gh-server", "stdio"], "env": {"LOG": "info", "TOKEN": {"secret": true}}})
        );
        assert!(
            serde_json::from_value::<ServerSpec>(
                json!({"command": ["x"], "env": {"T": {"secret": false}}})
            )
            .is_err()
        );
        assert!(
            serde_json::from_value::<ServerSpec>(json!({"command": ["x"], "bogus": 1})).is_err()
        );
        assert!(
            serde_json::from_value::<ServerSpec>(json!({"command": ["x"], "url": "https://e"}))
                .is_err()
        );
        assert!(serde_json::from_value::<ServerSpec>(json!({})).is_err());
    }

    #[test]
    fn a_url_server_has_headers() {
        let spec: ServerSpec = serde_json::from_value(
            json!({"url": "https://example.com/mcp", "headers": {"Authorization": {"secret": true}}}),
        )
        .unwrap();
        assert!(matches!(spec.upstream, Upstream::Http { .. }));
        spec.check().unwrap();
    }

    #[test]
    fn names_that_could_look_like_others_are_refused() {
        for bad in [
            "",
            "-x",
            "gіthub",
            "git hub",
            "a/b",
            "x\u{200b}",
            &"a".repeat(65),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["github", "my-server.2", "A_b"] {
            check_name(good).unwrap();
        }
    }

    #[test]
    fn bad_keys_and_values_are_refused() {
        assert!(stdio(json!({"1X": "v"})).check().is_err());
        assert!(stdio(json!({"X=Y": "v"})).check().is_err());
        assert!(stdio(json!({"X": "a\0b"})).check().is_err());
        let relative: ServerSpec =
            serde_json::from_value(json!({"command": ["x"], "cwd": "rel"})).unwrap();
        assert!(relative.check().is_err());
        let header: ServerSpec = serde_json::from_value(
            json!({"url": "https://e.com", "headers": {"X": "a\r\nInjected: 1"}}),
        )
        .unwrap();
        assert!(header.check().is_err());
        let ftp: ServerSpec = serde_json::from_value(json!({"url": "ftp://e.com"})).unwrap();
        assert!(ftp.check().is_err());
    }

    #[test]
    fn secrets_must_match_the_secret_keys_exactly() {
        let spec = stdio(json!({"TOKEN": {"secret": true}, "LOG": "info"}));
        let given = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), SecretText::new(v.to_string())))
                .collect::<BTreeMap<_, _>>()
        };
        spec.check_secrets(&given(&[("TOKEN", "t")])).unwrap();
        assert!(spec.check_secrets(&given(&[])).is_err());
        assert!(
            spec.check_secrets(&given(&[("TOKEN", "t"), ("LOG", "x")]))
                .is_err()
        );
    }

    #[test]
    fn debug_never_shows_a_secret_value() {
        let request = RegistryRequest::Put {
            name: "gh".into(),
            spec: stdio(json!({"TOKEN": {"secret": true}})),
            secrets: BTreeMap::from([("TOKEN".into(), SecretText::new("ghp_hunter2".into()))]),
        };
        let shown = format!("{request:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        let backup = RegistryAnswer::Backup {
            text: Some(SecretText::new("ghp_hunter2".into())),
        };
        assert!(!format!("{backup:?}").contains("hunter2"));
    }
}
