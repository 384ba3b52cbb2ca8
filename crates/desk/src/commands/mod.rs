//! The window's commands: the only way the front end reaches the engine.
//!
//! The page asks by name, with its arguments as JSON; [`Command::parse`] reads the two into one
//! typed [`Command`], strictly (an unknown name, an unknown or missing field, a wrong type:
//! `bad_request`, nothing run), and [`run`] runs it. The answer is the command's view as JSON, or
//! a [`UiError`]. The names the page may use are [`NAMES`] (`names.in`, which the window's build
//! also reads to grant them to the approval window and no other); tests check that the enum,
//! that file, the capability and `ui/api.js` name the same commands.
//!
//! The rooms: [`queue`] (what waits, Approve, Deny), [`grants`], [`history`], [`settings`],
//! [`servers`] and [`clients`]. Every command that touches the disk or the keychain (the store's
//! durable writes, history, settings files, the secret) does that work on the blocking pool, so
//! neither the window nor the sessions' async workers wait on a disk.

pub mod clients;
pub mod grants;
pub mod history;
pub mod queue;
pub mod servers;
pub mod settings;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Desk;
use crate::ui_code::{UiCode, UiError};
use crate::window::Windowed;

/// Every command the page may invoke, by the name it uses. The window's `build.rs` reads the same
/// file, so that its capability can grant them to the approval window and no other.
pub const NAMES: &[&str] = &include!("names.in");

/// A command the page asked for, its arguments read. The page writes argument names in
/// camelCase; a command without arguments takes none (an empty object, or nothing).
///
/// Not `Debug`: [`Command::SaveServer`] carries secret values typed into the form.
#[derive(Deserialize)]
#[serde(
    tag = "command",
    rename_all = "snake_case",
    rename_all_fields = "camelCase",
    deny_unknown_fields
)]
pub enum Command {
    /// Every request waiting for a person.
    Pending {},
    /// A person clicked Approve on request `id`, with the target typed where policy asks.
    Approve {
        /// The request.
        id: u64,
        /// What the person typed, where the view asks for the target.
        typed_target: Option<String>,
    },
    /// A person clicked Deny on request `id`, with an optional note for the agent.
    Deny {
        /// The request.
        id: u64,
        /// The note for the agent.
        note: Option<String>,
    },
    /// History rows, newest first, filtered.
    History {
        /// The filter.
        query: history::HistoryQuery,
    },
    /// The settings and the policy in force.
    Settings {},
    /// Settings → Save.
    SaveSettings {
        /// The settings and the policy's text as the view edited them.
        view: settings::SettingsView,
    },
    /// How the OpenTelemetry collector fares.
    ExportStatus {},
    /// History → Save.
    SaveHistory {
        /// The file's format.
        format: history::SaveFormat,
    },
    /// Replace the secret: every outstanding token stops working.
    RotateSecret {},
    /// Whether the desk can mint, and the approve delay.
    Status {},
    /// What may be offered beside Approve for request `id`.
    GrantOffer {
        /// The request.
        id: u64,
    },
    /// Approve request `id` and make a grant.
    ApproveWidening {
        /// The request.
        id: u64,
        /// What the person typed, where the view asks for the target.
        typed_target: Option<String>,
        /// The grant asked for.
        widening: countersign_engine::Widening,
    },
    /// The live grants.
    Grants {},
    /// Revoke grant `id`.
    RevokeGrant {
        /// The grant.
        id: u64,
    },
    /// The registered servers.
    Servers {},
    /// Add or change a server.
    SaveServer {
        /// The form as the person filled it (secret values among it).
        form: servers::ServerForm,
    },
    /// Remove a server and its secrets.
    RemoveServer {
        /// The server.
        name: String,
    },
    /// The MCP clients found on this account.
    Clients {},
    /// Protect a client (what `countersign install --client ID` does).
    ProtectClient {
        /// The client.
        id: String,
    },
    /// Restore a client's file as it was before Protect.
    RestoreClient {
        /// The client.
        id: String,
        /// Even when it was edited since.
        force: bool,
    },
    /// The request a URL asked the window to show, once.
    TakeFocus {},
}

impl Command {
    /// The command `name` names, with `arguments` (an object, or null for none) read strictly;
    /// anything else is refused `bad_request`.
    pub fn parse(name: &str, arguments: Value) -> Result<Command, UiError> {
        let bad = |why: String| UiError::new(UiCode::BadRequest, why);
        let mut object = match arguments {
            Value::Null => serde_json::Map::new(),
            Value::Object(object) => object,
            _ => return Err(bad(format!("the arguments of {name} are not an object"))),
        };
        if !NAMES.contains(&name) {
            return Err(bad(
                "the window asked for a command the desk does not have".into()
            ));
        }
        // The name is the tag: arguments may not name another command.
        if object.contains_key("command") {
            return Err(bad(format!("the arguments of {name} do not fit")));
        }
        object.insert("command".into(), Value::String(name.into()));
        serde_json::from_value(Value::Object(object))
            .map_err(|e| bad(format!("the arguments of {name} do not fit: {e}")))
    }

    /// The name the page uses for it: one of [`NAMES`], and safe to log (its arguments are not).
    pub fn name(&self) -> &'static str {
        match self {
            Command::Pending {} => "pending",
            Command::Approve { .. } => "approve",
            Command::Deny { .. } => "deny",
            Command::History { .. } => "history",
            Command::Settings {} => "settings",
            Command::SaveSettings { .. } => "save_settings",
            Command::ExportStatus {} => "export_status",
            Command::SaveHistory { .. } => "save_history",
            Command::RotateSecret {} => "rotate_secret",
            Command::Status {} => "status",
            Command::GrantOffer { .. } => "grant_offer",
            Command::ApproveWidening { .. } => "approve_widening",
            Command::Grants {} => "grants",
            Command::RevokeGrant { .. } => "revoke_grant",
            Command::Servers {} => "servers",
            Command::SaveServer { .. } => "save_server",
            Command::RemoveServer { .. } => "remove_server",
            Command::Clients {} => "clients",
            Command::ProtectClient { .. } => "protect_client",
            Command::RestoreClient { .. } => "restore_client",
            Command::TakeFocus {} => "take_focus",
        }
    }
}

/// Runs `command` for the page of `window`; answers its view as JSON.
pub async fn run(desk: &Desk, window: &Windowed, command: Command) -> Result<Value, UiError> {
    fn json<T: Serialize>(value: T) -> Result<Value, UiError> {
        serde_json::to_value(value).map_err(|e| UiError::new(UiCode::Internal, e.to_string()))
    }
    match command {
        Command::Pending {} => json(queue::pending(desk).await?),
        Command::Approve { id, typed_target } => {
            json(queue::approve(window, desk, id, typed_target).await?)
        }
        Command::Deny { id, note } => json(queue::deny(desk, id, note).await?),
        Command::History { query } => json(history::history(desk, query).await?),
        Command::Settings {} => json(settings::settings(desk)),
        Command::SaveSettings { view } => json(settings::save_settings(desk, view).await?),
        Command::ExportStatus {} => json(history::export_status(desk).await?),
        Command::SaveHistory { format } => json(history::save_history(desk, format).await?),
        Command::RotateSecret {} => json(settings::rotate_secret(desk)?),
        Command::Status {} => json(settings::status(desk)),
        Command::GrantOffer { id } => json(grants::grant_offer(desk, id).await?),
        Command::ApproveWidening {
            id,
            typed_target,
            widening,
        } => json(grants::approve_widening(window, desk, id, typed_target, widening).await?),
        Command::Grants {} => json(grants::grants(desk).await?),
        Command::RevokeGrant { id } => json(grants::revoke_grant(desk, id).await?),
        Command::Servers {} => json(servers::servers(desk).await?),
        Command::SaveServer { form } => json(servers::save_server(desk, form).await?),
        Command::RemoveServer { name } => json(servers::remove_server(desk, name).await?),
        Command::Clients {} => json(clients::clients().await?),
        Command::ProtectClient { id } => json(clients::protect_client(desk, id).await?),
        Command::RestoreClient { id, force } => {
            json(clients::restore_client(desk, id, force).await?)
        }
        Command::TakeFocus {} => json(queue::take_focus(desk)),
    }
}

/// Runs `work` on the blocking pool; a panic there is a UI error, not a crash of the window.
pub(crate) async fn off_the_ui<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, UiError> + Send + 'static,
) -> Result<T, UiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| UiError::new(UiCode::Internal, e.to_string()))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(name: &str, arguments: Value) -> UiError {
        match Command::parse(name, arguments) {
            Ok(_) => panic!("{name} was taken"),
            Err(e) => e,
        }
    }

    /// Each command with the arguments the page sends (`ui/api.js`), every command at least once.
    fn sent() -> Vec<(&'static str, Value)> {
        vec![
            ("pending", Value::Null),
            ("approve", json!({"id": 3, "typedTarget": null})),
            ("approve", json!({"id": 3, "typedTarget": "orders"})),
            ("deny", json!({"id": 3, "note": null})),
            ("deny", json!({"id": 3, "note": "not on a Friday"})),
            (
                "history",
                json!({"query": {"tool": "", "kind": "", "server": ""}}),
            ),
            ("settings", json!({})),
            (
                "save_settings",
                json!({"view": {
                    "settings": {"token_minutes": 5, "approve_delay_ms": 1500},
                    "policy": "[servers]\n"
                }}),
            ),
            ("export_status", Value::Null),
            ("save_history", json!({"format": "csv"})),
            ("save_history", json!({"format": "jsonl"})),
            ("rotate_secret", Value::Null),
            ("status", Value::Null),
            ("grant_offer", json!({"id": 3})),
            (
                "approve_widening",
                json!({"id": 3, "typedTarget": null,
                "widening": {"kind": "call", "minutes": 5}}),
            ),
            ("grants", Value::Null),
            ("revoke_grant", json!({"id": 1})),
            ("servers", Value::Null),
            (
                "save_server",
                json!({"form": {
                    "name": "fs", "editing": false, "kind": "stdio",
                    "command": ["npx", "server-filesystem", "/tmp"], "cwd": "",
                    "settings": [{"key": "TOKEN", "secret": true, "value": "s3cret"}]
                }}),
            ),
            (
                "save_server",
                json!({"form": {
                    "name": "api", "editing": true, "kind": "http",
                    "url": "https://example.test/mcp",
                    "settings": [{"key": "Authorization", "secret": true, "value": null}]
                }}),
            ),
            ("remove_server", json!({"name": "fs"})),
            ("clients", Value::Null),
            ("protect_client", json!({"id": "cursor"})),
            ("restore_client", json!({"id": "cursor", "force": false})),
            ("take_focus", Value::Null),
        ]
    }

    #[test]
    fn every_command_parses_with_the_arguments_the_page_sends() {
        let mut named = Vec::new();
        for (name, arguments) in sent() {
            match Command::parse(name, arguments.clone()) {
                Ok(command) => {
                    assert_eq!(command.name(), name, "{arguments}");
                    named.push(name);
                }
                Err(e) => panic!("{name} {arguments}: {e:?}"),
            }
        }
        named.sort();
        named.dedup();
        let mut names = NAMES.to_vec();
        names.sort();
        assert_eq!(named, names, "every command has a parse test");
    }

    #[test]
    fn the_arguments_arrive_as_the_page_wrote_them() {
        let Ok(Command::Approve { id, typed_target }) =
            Command::parse("approve", json!({"id": 7, "typedTarget": "orders"}))
        else {
            panic!("approve")
        };
        assert_eq!((id, typed_target.as_deref()), (7, Some("orders")));
        let Ok(Command::SaveServer { form }) = Command::parse("save_server", sent()[18].1.clone())
        else {
            panic!("save_server")
        };
        assert_eq!(form.name, "fs");
        assert_eq!(form.settings.len(), 1);
        assert!(form.settings[0].secret);
        let Ok(Command::SaveSettings { view }) =
            Command::parse("save_settings", sent()[7].1.clone())
        else {
            panic!("save_settings")
        };
        assert_eq!(view.settings.token_minutes, 5);
        assert_eq!(view.policy, "[servers]\n");
    }

    #[test]
    fn the_enum_the_names_file_the_capability_and_the_page_name_the_same_commands() {
        // The enum's own list, as serde spells it when a name is not one of them.
        let unknown = serde_json::from_value::<Command>(json!({"command": "?"}))
            .err()
            .expect("no such command")
            .to_string();
        let listed = unknown
            .split("expected one of ")
            .nth(1)
            .expect("serde lists the variants");
        let mut variants: Vec<&str> = listed
            .split(", ")
            .map(|v| v.trim_matches('`').trim_end_matches('`'))
            .map(|v| v.split('`').next().unwrap_or(v))
            .collect();
        variants.sort();
        let mut names = NAMES.to_vec();
        names.sort();
        assert_eq!(variants, names, "the enum and names.in");

        let capability: Value = serde_json::from_str(include_str!(
            "../../../../src-tauri/capabilities/approval.json"
        ))
        .unwrap();
        let mut granted: Vec<String> = capability["permissions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p.as_str()?.strip_prefix("allow-"))
            .map(|p| p.replace('-', "_"))
            .collect();
        granted.sort();
        assert_eq!(granted, names, "the approval window's capability");

        let page = include_str!("../../../../ui/api.js");
        let mut invoked: Vec<&str> = page
            .split("invoke(\"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .collect();
        invoked.sort();
        invoked.dedup();
        assert_eq!(invoked, names, "ui/api.js invokes each command");

        let build = include_str!("../../../../src-tauri/build.rs");
        assert!(
            build.contains("commands/names.in"),
            "the window's build reads the same names"
        );
    }

    #[test]
    fn an_unknown_command_or_arguments_that_do_not_fit_are_refused_and_run_nothing() {
        for name in [
            "",
            "approve ",
            "Approve",
            "plugin:approve",
            "approve_everything",
            "mint",
            "command",
        ] {
            assert_eq!(
                refused(name, Value::Null).code,
                UiCode::BadRequest,
                "{name:?}"
            );
        }
        for (name, arguments) in [
            ("approve", json!({"id": "3"})),
            ("approve", json!({"id": -1})),
            ("approve", json!({"typedTarget": "x"})),
            (
                "approve",
                json!({"id": 3, "typedTarget": null, "bypass": true}),
            ),
            ("approve", json!({"id": 3, "typed_target": "x"})),
            ("approve", json!([3])),
            ("approve", json!(3)),
            // The arguments may not name another command than the one invoked.
            ("pending", json!({"command": "approve", "id": 3})),
            ("approve", json!({"command": "approve", "id": 3})),
            ("deny", json!({"id": 3.5})),
            ("pending", json!({"id": 3})),
            ("take_focus", json!({"request": 3})),
            ("restore_client", json!({"id": "cursor"})),
            ("save_history", json!({"format": "xml"})),
            ("save_history", json!({"format": "CSV"})),
            ("history", json!({"query": {"tool": "", "limit": 10}})),
            ("save_server", json!({"form": {"name": "fs"}})),
            (
                "save_server",
                json!({"form": {"name": "fs", "editing": false, "kind": "ftp"}}),
            ),
            ("save_settings", json!({"view": {"policy": ""}})),
        ] {
            assert_eq!(
                refused(name, arguments.clone()).code,
                UiCode::BadRequest,
                "{name} {arguments}"
            );
        }
    }
}
