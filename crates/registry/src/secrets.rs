//! Where a server's secret values live in the keychain, and how a server is described to the
//! person deciding a change to it: every key and plain value, and for a secret only whether it
//! is kept, new or changed, never the value.

use std::collections::BTreeMap;

use countersign_wire::{SecretText, ServerSpec, Setting, Upstream};
use zeroize::Zeroizing;

/// The keychain account of `name`'s secret `key` in the desk `scope` (see [`scope_of`]):
/// `<scope>/server/<name>/env/<KEY>` or `<scope>/server/<name>/header/<Name>`.
pub(crate) fn account(scope: &str, name: &str, upstream: &Upstream, key: &str) -> String {
    let kind = match upstream {
        Upstream::Stdio { .. } => "env",
        Upstream::Http { .. } => "header",
    };
    format!("{scope}/server/{name}/{kind}/{key}")
}

/// The prefix of this desk's keychain accounts: `desk-` and the first 8 bytes of the SHA-256 of
/// its SQLite file's path, in hex. The keychain is the account's, shared by every desk it runs
/// (a second desk beside the person's, a test's): without the prefix, two desks registering the
/// same name would overwrite each other's secrets.
pub(crate) fn scope_of(store_path: &std::path::Path) -> String {
    use sha2::Digest;
    let path = std::fs::canonicalize(store_path).unwrap_or_else(|_| store_path.to_owned());
    let digest = sha2::Sha256::digest(path.as_os_str().as_encoded_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("desk-{hex}")
}

/// What the person is told about each secret of a proposed spec: a new value, a changed one, or
/// the one kept.
pub(crate) fn notes(
    spec: &ServerSpec,
    given: &BTreeMap<String, SecretText>,
    stored: &BTreeMap<String, Option<Zeroizing<String>>>,
) -> BTreeMap<String, &'static str> {
    spec.upstream
        .secret_keys()
        .into_iter()
        .map(|key| {
            let note = match (given.get(key), stored.get(key).and_then(Option::as_ref)) {
                (Some(new), Some(old)) if new.expose() == old.as_str() => "secret, unchanged",
                (Some(_), Some(_)) => "secret, A NEW VALUE",
                (Some(_), None) => "secret, new",
                (None, _) => "secret, kept",
            };
            (key.to_owned(), note)
        })
        .collect()
}

/// `spec` as lines the person reads in a change: one line per fact, so a line diff shows
/// exactly what changes.
pub(crate) fn describe(spec: &ServerSpec, notes: &BTreeMap<String, &'static str>) -> String {
    let mut lines = Vec::new();
    let word = match &spec.upstream {
        Upstream::Stdio { command, cwd, .. } => {
            lines.push(format!(
                "command: {}",
                countersign_core::render::command_line(command)
            ));
            if let Some(cwd) = cwd {
                lines.push(format!("working directory: {cwd}"));
            }
            "env"
        }
        Upstream::Http { url, .. } => {
            lines.push(format!("url: {url}"));
            "header"
        }
    };
    for (key, value) in spec.upstream.settings() {
        lines.push(match value {
            // A value with a control character (a line break could forge a line of its own) is
            // shown quoted and escaped; any other as it is (the window escapes what it shows).
            Setting::Plain(v) if v.chars().any(char::is_control) => {
                format!("{word} {key} = {}", countersign_core::render::quoted(v))
            }
            Setting::Plain(v) => format!("{word} {key} = {v}"),
            Setting::Secret => format!(
                "{word} {key} = ({})",
                notes.get(key).copied().unwrap_or("secret, in the keychain")
            ),
        });
    }
    lines.join("\n") + "\n"
}

/// Every server of `servers`, as [`describe`] puts each, under its name: how a change to the
/// whole registry (an edit of its file) is shown.
pub(crate) fn describe_all(servers: &crate::Servers) -> String {
    let mut text = String::new();
    for (name, spec) in &servers.servers {
        text.push_str(&format!("[{name}]\n"));
        text.push_str(&describe(spec, &BTreeMap::new()));
        text.push('\n');
    }
    text
}
