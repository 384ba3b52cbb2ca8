//! Settings → Servers: the servers registered in the desk as the window lists them, and the
//! person's own edits (add, change, remove), which apply directly (docs/design.md, "Servers and
//! credentials": what the person does in the desk's own settings view is theirs).
//!
//! A registered server's command, working directory, URL and values may have come from a file
//! an agent wrote or from the command line, so every one of them reaches the screen through
//! [`view::shown`](crate::view::shown), escaped and flagged like anything else an agent sent. The
//! edit form needs the values themselves, to be typed over; a value is given back for that only
//! when it is printable ASCII (nothing in it to hide or to escape but a quote or backslash), and
//! a field the form could not fill keeps the value on record when it is left empty.
//!
//! A secret's value crosses once, from a password field to the keychain, and is never read back:
//! the list says only that it is secret, and an edit that leaves a secret's field empty keeps
//! the keychain's value (`Registry::put_directly_keeping`).

use std::collections::BTreeMap;

use countersign_registry::Registry;
use countersign_wire::{SecretText, ServerSpec, Setting, Upstream};
use serde::{Deserialize, Serialize};

use crate::Desk;
use crate::commands::off_the_ui;
use crate::ui_code::{UiCode, UiError};
use crate::view::{Shown, shown};

/// A string of a registered server, as the window shows it and, when that is safe, as the edit
/// form is filled with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Text {
    /// As shown: escaped and flagged.
    pub shown: Shown,
    /// The value itself when it is printable ASCII, to fill the edit form; `None` otherwise
    /// (the form then leaves the field empty, and empty keeps the value on record).
    pub editable: Option<String>,
}

fn text(s: &str) -> Text {
    let printable = s.chars().all(|c| c == ' ' || c.is_ascii_graphic());
    Text {
        shown: shown(s),
        editable: printable.then(|| s.to_owned()),
    }
}

/// An environment variable or header of a registered server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SettingView {
    /// Its name.
    pub key: Text,
    /// Whether its value lives in the keychain (and is never shown).
    pub secret: bool,
    /// Its value, when it is not secret.
    pub value: Option<Text>,
}

/// A registered server, as Settings → Servers lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServerView {
    /// Its name, to ask for it by (names are checked: ASCII letters, digits, `.`, `_`, `-`).
    pub name: String,
    /// Its name, as shown.
    pub name_shown: Shown,
    /// `stdio` (a command the desk starts) or `http` (a URL).
    pub kind: &'static str,
    /// The program and its arguments (stdio).
    pub command: Vec<Text>,
    /// The working directory (stdio), when one is set.
    pub cwd: Option<Text>,
    /// The URL (http).
    pub url: Option<Text>,
    /// Its environment variables (stdio) or headers (http), by name.
    pub settings: Vec<SettingView>,
}

impl ServerView {
    /// The view of `spec`, registered as `name`: never a secret's value (the spec holds none).
    pub fn new(name: &str, spec: &ServerSpec) -> Self {
        let (kind, command, cwd, url) = match &spec.upstream {
            Upstream::Stdio { command, cwd, .. } => (
                "stdio",
                command.iter().map(|a| text(a)).collect(),
                cwd.as_deref().map(text),
                None,
            ),
            Upstream::Http { url, .. } => ("http", Vec::new(), None, Some(text(url))),
        };
        let settings = spec
            .upstream
            .settings()
            .iter()
            .map(|(key, setting)| SettingView {
                key: text(key),
                secret: matches!(setting, Setting::Secret),
                value: match setting {
                    Setting::Plain(v) => Some(text(v)),
                    Setting::Secret => None,
                },
            })
            .collect();
        ServerView {
            name: name.to_owned(),
            name_shown: shown(name),
            kind,
            command,
            cwd,
            url,
            settings,
        }
    }
}

/// The registered servers, by name.
fn list(registry: &Registry) -> Vec<ServerView> {
    registry
        .servers()
        .iter()
        .map(|(name, spec)| ServerView::new(name, spec))
        .collect()
}

/// What reaches the server, as the form says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FormKind {
    /// A command the desk starts.
    Stdio,
    /// A URL.
    Http,
}

/// An environment variable or header as the form sends it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingForm {
    /// Its name.
    pub key: String,
    /// Whether its value goes to the keychain.
    pub secret: bool,
    /// Its value (typed into a password field when secret; never printed); `None`: keep the
    /// value on record (for a secret, the keychain's).
    pub value: Option<SecretText>,
}

/// The add or edit form of Settings → Servers.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerForm {
    /// The server's name.
    pub name: String,
    /// Whether the form edits the server `name` (else it adds one: an existing name is refused,
    /// so that Add never replaces a server unseen).
    pub editing: bool,
    /// A command or a URL.
    pub kind: FormKind,
    /// The program and its arguments, one each; `None`: keep the ones on record.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// The working directory (empty: none); `None`: keep the one on record.
    #[serde(default)]
    pub cwd: Option<String>,
    /// The URL; `None`: keep the one on record.
    #[serde(default)]
    pub url: Option<String>,
    /// The environment variables or headers. One left out is removed.
    #[serde(default)]
    pub settings: Vec<SettingForm>,
}

fn bad(message: impl Into<String>) -> UiError {
    UiError::new(UiCode::BadRequest, message)
}

/// The spec the form describes, and the secret values typed anew in it. `current` is the server
/// on record under the form's name: a field left as "keep" takes its value from there.
fn spec_of(
    form: ServerForm,
    current: Option<&ServerSpec>,
) -> Result<(ServerSpec, BTreeMap<String, SecretText>), UiError> {
    let kept = |what: &str| bad(format!("the form gives no {what}"));
    let mut values = BTreeMap::new();
    let mut secrets = BTreeMap::new();
    let current_settings = current.map(|c| c.upstream.settings());
    for row in form.settings {
        let key = row.key.trim().to_owned();
        if key.is_empty() {
            return Err(bad("an environment variable or header needs a name"));
        }
        if values.contains_key(&key) {
            return Err(bad(format!("{key} is given twice")));
        }
        let value = row.value.filter(|v| !v.expose().is_empty() || !row.secret);
        let setting = match (row.secret, value) {
            (true, Some(value)) => {
                secrets.insert(key.clone(), value);
                Setting::Secret
            }
            // The registry keeps the keychain's value, or says there is none.
            (true, None) => Setting::Secret,
            (false, Some(value)) => Setting::Plain(value.expose().to_owned()),
            (false, None) => match current_settings.and_then(|s| s.get(&key)) {
                Some(Setting::Plain(v)) => Setting::Plain(v.clone()),
                _ => return Err(bad(format!("no value was given for {key}"))),
            },
        };
        values.insert(key, setting);
    }
    let upstream = match form.kind {
        FormKind::Stdio => {
            let (current_command, current_cwd) = match current.map(|c| &c.upstream) {
                Some(Upstream::Stdio { command, cwd, .. }) => (Some(command), cwd.as_ref()),
                _ => (None, None),
            };
            let command = match form.command {
                Some(command) => command,
                None => current_command.cloned().ok_or_else(|| kept("command"))?,
            };
            let cwd = match form.cwd {
                Some(cwd) if cwd.is_empty() => None,
                Some(cwd) => Some(cwd),
                None => current_cwd.cloned(),
            };
            Upstream::Stdio {
                command,
                cwd,
                env: values,
            }
        }
        FormKind::Http => {
            let url = match (form.url, current.map(|c| &c.upstream)) {
                (Some(url), _) => url,
                (None, Some(Upstream::Http { url, .. })) => url.clone(),
                (None, _) => return Err(kept("URL")),
            };
            Upstream::Http {
                url: url.trim().to_owned(),
                headers: values,
            }
        }
    };
    Ok((ServerSpec { upstream }, secrets))
}

/// Adds or changes a server as the form says, at once.
async fn save(registry: &Registry, form: ServerForm) -> Result<(), UiError> {
    let name = form.name.trim().to_owned();
    let current = registry.servers().remove(&name);
    match (&current, form.editing) {
        (Some(_), false) => {
            return Err(UiError::new(
                UiCode::Exists,
                format!("a server named {name} is registered already: edit it instead"),
            ));
        }
        (None, true) => {
            return Err(UiError::new(
                UiCode::NoSuchServer,
                format!("no server named {name} is registered (removed meanwhile?)"),
            ));
        }
        _ => {}
    }
    let (spec, secrets) = spec_of(form, current.as_ref())?;
    registry
        .put_directly_keeping(&name, &spec, &secrets)
        .await?;
    tracing::info!(target: "desk", server = %name, "server saved in the settings view");
    Ok(())
}

/// The registered servers.
pub async fn servers(desk: &Desk) -> Result<Vec<ServerView>, UiError> {
    let registry = desk.registry.clone();
    off_the_ui(move || Ok(list(&registry))).await
}

/// Adds or changes a server (the person's own edit: it applies at once and is recorded in
/// history); answers with the servers as they are then.
pub async fn save_server(desk: &Desk, form: ServerForm) -> Result<Vec<ServerView>, UiError> {
    let registry = desk.registry.clone();
    save(&registry, form).await?;
    off_the_ui(move || Ok(list(&registry))).await
}

/// Removes a server and its secrets (the person's own edit); answers with the servers left.
pub async fn remove_server(desk: &Desk, name: String) -> Result<Vec<ServerView>, UiError> {
    let registry = desk.registry.clone();
    registry.remove_directly(&name).await?;
    tracing::info!(target: "desk", server = %name, "server removed in the settings view");
    off_the_ui(move || Ok(list(&registry))).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::contract::{expected, keys};
    use serde_json::{Value, json};

    fn spec(v: Value) -> ServerSpec {
        serde_json::from_value(v).unwrap()
    }

    fn form(v: Value) -> ServerForm {
        serde_json::from_value(v).unwrap()
    }

    fn gh() -> ServerSpec {
        spec(json!({
            "command": ["gh-server", "stdio"],
            "cwd": "/srv/gh",
            "env": {"GITHUB_TOKEN": {"secret": true}, "LOG": "info"}
        }))
    }

    #[test]
    fn the_window_receives_exactly_the_fields_of_its_contract() {
        let view = serde_json::to_value(ServerView::new("gh", &gh())).unwrap();
        assert_eq!(keys(&view), expected("ServerView"));
        assert_eq!(keys(&view["name_shown"]), expected("Shown"));
        assert_eq!(keys(&view["cwd"]), expected("Text"));
        assert_eq!(keys(&view["command"][0]), expected("Text"));
        assert_eq!(keys(&view["settings"][0]), expected("SettingView"));
        assert_eq!(keys(&view["cwd"]["shown"]), expected("Shown"));
    }

    #[test]
    fn a_secret_is_listed_as_secret_and_never_with_a_value() {
        let view = ServerView::new("gh", &gh());
        assert_eq!(view.kind, "stdio");
        let token = view
            .settings
            .iter()
            .find(|s| s.key.shown.text == "GITHUB_TOKEN")
            .unwrap();
        assert!(token.secret && token.value.is_none());
        let log = view
            .settings
            .iter()
            .find(|s| s.key.shown.text == "LOG")
            .unwrap();
        assert!(!log.secret);
        assert_eq!(
            log.value.as_ref().unwrap().editable.as_deref(),
            Some("info")
        );
    }

    #[test]
    fn strings_from_the_registry_are_escaped_and_flagged_and_only_printable_ascii_fills_the_form() {
        let sneaky = spec(json!({
            "command": ["run\u{202e}exe.txt", "--say=\"hi\""],
            "env": {"NOTE": "a\u{200b}b", "PLAIN": "x y"}
        }));
        let view = ServerView::new("s", &sneaky);
        let arg = &view.command[0];
        assert_eq!(arg.shown.text, "run\\u{202e}exe.txt");
        assert!(!arg.shown.flags.is_empty());
        assert_eq!(arg.editable, None);
        // A quote is escaped on screen, and the form gets the value itself.
        assert_eq!(view.command[1].shown.text, "--say=\\\"hi\\\"");
        assert_eq!(view.command[1].editable.as_deref(), Some("--say=\"hi\""));
        let note = view.settings[0].value.as_ref().unwrap();
        assert_eq!(note.shown.text, "a\\u{200b}b");
        assert_eq!(note.editable, None);
        let json = serde_json::to_string(&view).unwrap();
        assert!(
            !json.contains('\u{202e}') && !json.contains('\u{200b}'),
            "{json}"
        );
    }

    #[test]
    fn a_field_left_to_keep_takes_the_value_on_record() {
        let current = spec(json!({
            "command": ["run\u{202e}x"],
            "cwd": "/srv",
            "env": {"TOKEN": {"secret": true}, "NOTE": "a\u{200b}b"}
        }));
        let (spec, secrets) = spec_of(
            form(json!({
                "name": "s", "editing": true, "kind": "stdio", "command": null, "cwd": null,
                "settings": [
                    {"key": "TOKEN", "secret": true, "value": null},
                    {"key": "NOTE", "secret": false, "value": null},
                    {"key": "NEW", "secret": true, "value": "v"}
                ]
            })),
            Some(&current),
        )
        .unwrap();
        let Upstream::Stdio { command, cwd, env } = &spec.upstream else {
            panic!("{spec:?}")
        };
        assert_eq!(command, &vec!["run\u{202e}x".to_owned()]);
        assert_eq!(cwd.as_deref(), Some("/srv"));
        assert_eq!(env["NOTE"], Setting::Plain("a\u{200b}b".into()));
        assert_eq!(env["TOKEN"], Setting::Secret);
        // Only the secret typed anew travels; the registry keeps the keychain's for TOKEN.
        assert_eq!(secrets.keys().collect::<Vec<_>>(), ["NEW"]);
        // An empty working directory removes it.
        let (spec, _) = spec_of(
            form(
                json!({"name": "s", "editing": true, "kind": "stdio", "cwd": "", "command": ["x"]}),
            ),
            Some(&current),
        )
        .unwrap();
        assert!(matches!(spec.upstream, Upstream::Stdio { cwd: None, .. }));
    }

    #[test]
    fn a_new_server_must_say_everything_and_a_key_once() {
        let missing = [
            json!({"name": "s", "editing": false, "kind": "stdio"}),
            json!({"name": "s", "editing": false, "kind": "http"}),
            json!({"name": "s", "editing": false, "kind": "stdio", "command": ["x"],
                   "settings": [{"key": "A", "secret": false, "value": null}]}),
            json!({"name": "s", "editing": false, "kind": "stdio", "command": ["x"],
                   "settings": [{"key": "A", "secret": false, "value": "1"},
                                {"key": "A", "secret": true, "value": "2"}]}),
        ];
        for f in missing {
            let e = spec_of(form(f.clone()), None).unwrap_err();
            assert_eq!(e.code, UiCode::BadRequest, "{f}");
        }
    }

    #[test]
    fn the_form_never_prints_a_secret() {
        let f = form(json!({
            "name": "s", "editing": false, "kind": "http", "url": "https://e.example/mcp",
            "settings": [{"key": "Authorization", "secret": true, "value": "Bearer hunter2"}]
        }));
        assert!(!format!("{f:?}").contains("hunter2"));
        let (spec, secrets) = spec_of(f, None).unwrap();
        assert!(!format!("{spec:?} {secrets:?}").contains("hunter2"));
        assert_eq!(secrets["Authorization"].expose(), "Bearer hunter2");
    }
}
