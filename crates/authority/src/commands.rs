//! The window's commands: the only way the front end reaches the engine.
//!
//! `approve` is the one path in the product that mints a token, and it is reachable only from the
//! approval window (see `capabilities/approval.json`). Errors cross as [`UiError`] codes.
//!
//! The page asks by name, with its arguments as JSON ([`invoke`]): the names are a closed list
//! ([`NAMES`], which the window's build also grants per window), each command's arguments are
//! read strictly (an unknown or missing field, a wrong type: `bad_request`, nothing run), and
//! anything else is refused. The answer is the command's view as JSON, or a [`UiError`]. Every
//! command that touches the disk or the keychain (the store's durable writes, history, settings
//! files, the secret) does that work on the blocking pool, so neither the window nor the
//! sessions' async workers wait on a disk.

use countersign_core::policy::Policy;
use std::os::unix::fs::OpenOptionsExt;

use countersign_store::{HistoryFilter, StoreOptions};
use serde::{Deserialize, Serialize};

use countersign_core::approver::Verdict;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::Desk;
use crate::approver::Remote;
use crate::settings::Settings;
use crate::view::{HistoryRow, RequestView, UiCode, UiError};

/// What the desk may tell its window unasked (the page listens for these events).
pub trait Window: Send + Sync {
    /// Sends `event` with `payload` to the window, if it is there.
    fn emit(&self, event: &str, payload: Value);
}

/// Every command the page may invoke, by the name it uses. The window's `build.rs` reads the same
/// file, so that its capability can grant them to the approval window and no other.
pub const NAMES: &[&str] = &include!("command_names.in");

/// The arguments of a command, read strictly from the page's JSON object (field names as the
/// page writes them, camelCase). Absent arguments are an empty object.
fn args<T: DeserializeOwned>(command: &str, args: Value) -> Result<T, UiError> {
    let args = match args {
        Value::Null => Value::Object(Default::default()),
        args => args,
    };
    serde_json::from_value(args).map_err(|e| {
        UiError::new(
            UiCode::BadRequest,
            format!("the arguments of {command} do not fit: {e}"),
        )
    })
}

/// No arguments at all.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Nothing {}

/// A request or grant, by number.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Id {
    id: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ApproveArgs {
    id: u64,
    typed_target: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WideningArgs {
    id: u64,
    typed_target: Option<String>,
    widening: countersign_engine::Widening,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DenyArgs {
    id: u64,
    note: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryArgs {
    query: HistoryQuery,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettingsArgs {
    view: SettingsView,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FormatArgs {
    format: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerArgs {
    form: crate::servers::ServerForm,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NameArgs {
    name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientArgs {
    id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RestoreArgs {
    id: String,
    force: bool,
}

/// A command the page asked for, its arguments read.
enum Call {
    Pending,
    Approve(ApproveArgs),
    Deny(DenyArgs),
    History(HistoryArgs),
    Settings,
    SaveSettings(SettingsArgs),
    ExportStatus,
    SaveHistory(FormatArgs),
    RotateSecret,
    Status,
    GrantOffer(Id),
    ApproveWidening(WideningArgs),
    Grants,
    RevokeGrant(Id),
    Servers,
    SaveServer(ServerArgs),
    RemoveServer(NameArgs),
    Clients,
    ProtectClient(ClientArgs),
    RestoreClient(RestoreArgs),
    TakeFocus,
}

impl Call {
    /// The command `command` names, with `arguments` read strictly; a name not in [`NAMES`] is
    /// refused `bad_request`.
    fn parse(command: &str, arguments: Value) -> Result<Call, UiError> {
        let none = |arguments| args::<Nothing>(command, arguments);
        Ok(match command {
            "pending" => none(arguments).map(|_| Call::Pending)?,
            "approve" => Call::Approve(args(command, arguments)?),
            "deny" => Call::Deny(args(command, arguments)?),
            "history" => Call::History(args(command, arguments)?),
            "settings" => none(arguments).map(|_| Call::Settings)?,
            "save_settings" => Call::SaveSettings(args(command, arguments)?),
            "export_status" => none(arguments).map(|_| Call::ExportStatus)?,
            "save_history" => Call::SaveHistory(args(command, arguments)?),
            "rotate_secret" => none(arguments).map(|_| Call::RotateSecret)?,
            "status" => none(arguments).map(|_| Call::Status)?,
            "grant_offer" => Call::GrantOffer(args(command, arguments)?),
            "approve_widening" => Call::ApproveWidening(args(command, arguments)?),
            "grants" => none(arguments).map(|_| Call::Grants)?,
            "revoke_grant" => Call::RevokeGrant(args(command, arguments)?),
            "servers" => none(arguments).map(|_| Call::Servers)?,
            "save_server" => Call::SaveServer(args(command, arguments)?),
            "remove_server" => Call::RemoveServer(args(command, arguments)?),
            "clients" => none(arguments).map(|_| Call::Clients)?,
            "protect_client" => Call::ProtectClient(args(command, arguments)?),
            "restore_client" => Call::RestoreClient(args(command, arguments)?),
            "take_focus" => none(arguments).map(|_| Call::TakeFocus)?,
            _ => {
                return Err(UiError::new(
                    UiCode::BadRequest,
                    "the window asked for a command the desk does not have",
                ));
            }
        })
    }
}

/// Runs the command the page named, with its arguments; answers its view as JSON. A name not in
/// [`NAMES`], or arguments that do not fit, are refused `bad_request` and run nothing.
pub async fn invoke(
    desk: &Desk,
    window: &dyn Window,
    command: &str,
    arguments: Value,
) -> Result<Value, UiError> {
    fn json<T: Serialize>(value: T) -> Result<Value, UiError> {
        serde_json::to_value(value).map_err(|e| UiError::new(UiCode::Internal, e.to_string()))
    }
    use crate::{clients, grants, servers};
    match Call::parse(command, arguments)? {
        Call::Pending => json(pending(desk).await?),
        Call::Approve(a) => json(approve(window, desk, a.id, a.typed_target).await?),
        Call::Deny(a) => json(deny(desk, a.id, a.note).await?),
        Call::History(a) => json(history(desk, a.query).await?),
        Call::Settings => json(settings(desk)),
        Call::SaveSettings(a) => json(save_settings(desk, a.view).await?),
        Call::ExportStatus => json(export_status(desk).await?),
        Call::SaveHistory(a) => json(save_history(desk, a.format).await?),
        Call::RotateSecret => json(rotate_secret(desk)?),
        Call::Status => json(status(desk)),
        Call::GrantOffer(Id { id }) => json(grants::grant_offer(desk, id).await?),
        Call::ApproveWidening(a) => {
            json(grants::approve_widening(window, desk, a.id, a.typed_target, a.widening).await?)
        }
        Call::Grants => json(grants::grants(desk).await?),
        Call::RevokeGrant(Id { id }) => json(grants::revoke_grant(desk, id).await?),
        Call::Servers => json(servers::servers(desk).await?),
        Call::SaveServer(a) => json(servers::save_server(desk, a.form).await?),
        Call::RemoveServer(a) => json(servers::remove_server(desk, a.name).await?),
        Call::Clients => json(clients::clients().await?),
        Call::ProtectClient(a) => json(clients::protect_client(desk, a.id).await?),
        Call::RestoreClient(a) => json(clients::restore_client(desk, a.id, a.force).await?),
        Call::TakeFocus => json(take_focus(desk)),
    }
}

/// Asks the keychain whether it still answers ([`Desk::check_keychain`]) and, when that changed,
/// tells the window (`secret://status`): its banner follows. `Some(why)` when nothing may be
/// minted now.
pub async fn check_keychain(desk: &Desk, window: &dyn Window) -> Option<String> {
    let answer = desk.check_keychain().await;
    if answer.changed {
        window.emit(
            "secret://status",
            serde_json::to_value(desk.secret_problem()).unwrap_or(Value::Null),
        );
    }
    answer.problem
}

/// The request a URL asked the window to show, once, as its decimal id (a string: a JavaScript
/// number is exact only to 2^53): the page asks when it loads and when told (`queue://focus`).
pub fn take_focus(desk: &Desk) -> Option<String> {
    desk.wanted.lock().unwrap().take().map(|id| id.to_string())
}

/// Every request waiting for a person.
///
/// Debug builds read `COUNTERSIGN_DEBUG_PENDING_LATE_MS`: the answer (read at once) is held that
/// long before it goes back, so a test can make the window's first read race the first
/// `queue://changed` event, as a slow machine does now and then.
pub async fn pending(desk: &Desk) -> Result<Vec<RequestView>, UiError> {
    let views = desk.pending().iter().map(RequestView::from).collect();
    #[cfg(debug_assertions)]
    if let Some(ms) = std::env::var("COUNTERSIGN_DEBUG_PENDING_LATE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        tokio::time::sleep(std::time::Duration::from_millis(ms.min(10_000))).await;
    }
    Ok(views)
}

/// Runs `work` on the blocking pool; a panic there is a UI error, not a crash of the window.
pub(crate) async fn off_the_ui<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, UiError> + Send + 'static,
) -> Result<T, UiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| UiError::new(UiCode::Internal, e.to_string()))?
}

/// A person clicked Approve (after the delay, with the target typed where policy asks).
pub async fn approve(
    window: &dyn Window,
    desk: &Desk,
    id: u64,
    typed_target: Option<String>,
) -> Result<(), UiError> {
    // Mint only while the keychain answers (see `check_keychain`).
    if let Some(why) = crate::commands::check_keychain(desk, window).await {
        return Err(UiError::new(
            UiCode::NoSecret,
            format!(
                "Nothing can be approved: {why}. Approvals already given keep working until they \
                 expire. Unlock the keychain (or start its service) and try again."
            ),
        ));
    }
    // A team server's request: signed here, decided there (`approver`).
    if let Some(remote) = desk.remote.as_ref().filter(|_| Remote::owns(id)) {
        return Ok(remote
            .decide(id, Verdict::Approve, typed_target.as_deref(), None)
            .await?);
    }
    Ok(desk.engine.approve(id, typed_target.as_deref()).await?)
}

/// A person clicked Deny, with an optional note for the agent.
pub async fn deny(desk: &Desk, id: u64, note: Option<String>) -> Result<(), UiError> {
    if let Some(remote) = desk.remote.as_ref().filter(|_| Remote::owns(id)) {
        return Ok(remote
            .decide(id, Verdict::Deny, None, note.as_deref())
            .await?);
    }
    Ok(desk.engine.deny(id, note.as_deref()).await?)
}

/// History, newest first, filtered.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct HistoryQuery {
    /// Only this tool.
    pub tool: Option<String>,
    /// Only this kind (`issued`, `accepted`, `refused`, `replay`, `denied`, `executed`, `rejected`).
    pub kind: Option<String>,
    /// Only events whose tenant's server is this (matched on the tenant's server name).
    pub server: Option<String>,
}

/// History, newest first, filtered; every string an agent or upstream sent shown escaped and
/// flagged.
pub async fn history(desk: &Desk, query: HistoryQuery) -> Result<Vec<HistoryRow>, UiError> {
    history_rows(&desk.engine, query).await
}

async fn history_rows(
    engine: &countersign_engine::Engine,
    query: HistoryQuery,
) -> Result<Vec<HistoryRow>, UiError> {
    let mut filter = HistoryFilter::default().limit(500);
    filter.tool = query.tool.filter(|t| !t.is_empty());
    filter.kind = query.kind.filter(|k| !k.is_empty());
    let events = engine
        .history(&filter)
        .await
        .map_err(|e| UiError::new(UiCode::StoreFailed, e.to_string()))?;
    let wanted = query.server.filter(|s| !s.is_empty());
    let rows = events
        .iter()
        .filter_map(|event| {
            let server = engine.server_of(&event.tenant);
            let row = HistoryRow::new(event, server.as_deref());
            // The server as it is, or as the window shows it (which is what a person can type).
            let matches = match &wanted {
                None => true,
                Some(s) => {
                    server.as_deref() == Some(s.as_str())
                        || row.server.as_ref().is_some_and(|shown| &shown.text == s)
                }
            };
            matches.then_some(row)
        })
        .collect();
    Ok(rows)
}

/// Settings and policy, as the settings view edits them.
#[derive(Debug, Serialize, Deserialize)]
pub struct SettingsView {
    /// The settings.
    pub settings: Settings,
    /// The policy file's text.
    pub policy: String,
}

// The settings files and the keychain are small, local and quick: these run on the async pool
// (`async`), off the UI thread, rather than holding a blocking thread each.
pub fn settings(desk: &Desk) -> SettingsView {
    SettingsView {
        settings: desk.settings.lock().unwrap().clone(),
        policy: desk.registry.accepted_text(countersign_registry::POLICY),
    }
}

/// Where History → Save put the export, and how many events it holds.
#[derive(Debug, Serialize)]
pub struct SavedView {
    /// The file written (new, 0600, in the desk's own data folder).
    pub path: String,
    /// How many events it holds.
    pub events: u64,
}

/// History → Save: every event, oldest first, as `format` (`jsonl` or `csv`), the same file
/// `countersign history --format` writes, streamed into a new file in the desk's data folder
/// (`exports/history-<time>.<format>`, private to the account); never over an existing file.
pub async fn save_history(desk: &Desk, format: String) -> Result<SavedView, UiError> {
    use countersign_store::export::{ExportFormat, export};
    let (format, extension) = match format.as_str() {
        "jsonl" => (ExportFormat::Jsonl, "jsonl"),
        "csv" => (ExportFormat::Csv, "csv"),
        _ => return Err(UiError::new(UiCode::BadRequest, "save as jsonl or csv")),
    };
    let store = desk.dirs.store();
    let folder = desk.dirs.data.join("exports");
    // The engine's clock, which stamps the events the file holds, names it.
    let stamp = desk.engine.now_ms();
    let io = |e: std::io::Error| UiError::new(UiCode::Io, e.to_string());
    tokio::task::spawn_blocking(move || {
        crate::settings::private_dir(&folder).map_err(io)?;
        let path = folder.join(format!("history-{stamp}.{extension}"));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        let reader = countersign_store::HistoryReader::open(&store, &StoreOptions::default())
            .map_err(|e| UiError::new(UiCode::StoreFailed, e.to_string()))?;
        let events = export(&reader, format, None, None, file)
            .map_err(|e| UiError::new(UiCode::Io, e.to_string()))?;
        Ok(SavedView {
            path: path.display().to_string(),
            events,
        })
    })
    .await
    .map_err(|e| UiError::new(UiCode::Internal, e.to_string()))?
}

/// How the OpenTelemetry collector fares (`None`: none is set), for the History view.
pub async fn export_status(desk: &Desk) -> Result<Option<crate::otlp::ExportView>, UiError> {
    desk.export
        .view()
        .await
        .map_err(|e| UiError::new(UiCode::StoreFailed, e.to_string()))
}

pub async fn save_settings(desk: &Desk, view: SettingsView) -> Result<SettingsView, UiError> {
    let settings = view.settings.sanitized();
    // The person's own edit applies directly; an unchanged policy is not saved (nor recorded).
    if view.policy != desk.registry.accepted_text(countersign_registry::POLICY) {
        Policy::from_toml(&view.policy)
            .map_err(|e| UiError::new(UiCode::BadPolicy, e.to_string()))?;
        desk.registry
            .save_policy_directly(&view.policy)
            .await
            .map_err(|e| {
                let code = match e {
                    countersign_registry::RegistryError::Invalid { .. } => UiCode::BadPolicy,
                    _ => UiCode::Io,
                };
                UiError::new(code, e.to_string())
            })?;
    }
    // A collector that cannot be used is said before anything is saved.
    if let Some(endpoint) = settings
        .otlp_endpoint
        .as_deref()
        .filter(|e| !e.trim().is_empty())
    {
        countersign_otlp::Collector::new(endpoint, "countersign-desk", "desk")
            .map_err(|e| UiError::new(UiCode::BadRequest, e.to_string()))?;
    }
    let before = desk.settings.lock().unwrap().otlp_endpoint.clone();
    let settings = desk
        .dirs
        .save_settings(&settings)
        .map_err(|e| UiError::new(UiCode::Io, e.to_string()))?;
    if settings.otlp_endpoint != before {
        desk.export
            .apply(settings.otlp_endpoint.as_deref())
            .map_err(|e| UiError::new(UiCode::BadRequest, e.to_string()))?;
    }
    desk.engine
        .set_token_ttl_ms(settings.token_minutes * 60_000);
    desk.engine.set_approve_delay_ms(settings.approve_delay_ms);
    *desk.settings.lock().unwrap() = settings.clone();
    Ok(SettingsView {
        settings,
        policy: view.policy,
    })
}

/// Replaces the secret: every outstanding token stops working.
pub fn rotate_secret(desk: &Desk) -> Result<(), UiError> {
    desk.rotate_secret()
        .map_err(|e| UiError::new(UiCode::from(&e), e.to_string()))
}

/// Whether the desk can mint, and what to tell the person if not.
#[derive(Debug, Serialize)]
pub struct Status {
    /// `None` when all is well; else why nothing can be approved.
    pub secret_problem: Option<String>,
    /// The approve delay in force, in ms.
    pub approve_delay_ms: u64,
}

pub fn status(desk: &Desk) -> Status {
    Status {
        secret_problem: desk.secret_problem(),
        approve_delay_ms: desk.settings.lock().unwrap().approve_delay_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(command: &str, arguments: Value) -> UiError {
        match Call::parse(command, arguments) {
            Ok(_) => panic!("{command} was taken"),
            Err(e) => e,
        }
    }

    #[test]
    fn every_name_parses_with_the_arguments_the_page_sends() {
        let sent = [
            ("pending", Value::Null),
            ("approve", json!({"id": 3, "typedTarget": null})),
            ("approve", json!({"id": 3, "typedTarget": "orders"})),
            ("deny", json!({"id": 3, "note": null})),
            (
                "history",
                json!({"query": {"tool": "", "kind": "", "server": ""}}),
            ),
            ("settings", json!({})),
            ("export_status", Value::Null),
            ("save_history", json!({"format": "csv"})),
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
            ("remove_server", json!({"name": "fs"})),
            ("clients", Value::Null),
            ("protect_client", json!({"id": "cursor"})),
            ("restore_client", json!({"id": "cursor", "force": false})),
            ("take_focus", Value::Null),
        ];
        for (command, arguments) in sent {
            assert!(NAMES.contains(&command));
            if let Err(e) = Call::parse(command, arguments.clone()) {
                panic!("{command} {arguments}: {e:?}");
            }
        }
    }

    #[test]
    fn an_unknown_command_or_arguments_that_do_not_fit_are_refused_and_run_nothing() {
        for command in [
            "",
            "approve ",
            "Approve",
            "plugin:approve",
            "approve_everything",
            "mint",
        ] {
            assert_eq!(
                refused(command, Value::Null).code,
                UiCode::BadRequest,
                "{command:?}"
            );
        }
        for (command, arguments) in [
            ("approve", json!({"id": "3"})),
            ("approve", json!({"id": -1})),
            ("approve", json!({"typedTarget": "x"})),
            (
                "approve",
                json!({"id": 3, "typedTarget": null, "bypass": true}),
            ),
            ("approve", json!({"id": 3, "typed_target": "x"})),
            ("approve", json!([3])),
            ("deny", json!({"id": 3.5})),
            ("pending", json!({"id": 3})),
            ("take_focus", json!({"request": 3})),
            ("restore_client", json!({"id": "cursor"})),
        ] {
            assert_eq!(
                refused(command, arguments.clone()).code,
                UiCode::BadRequest,
                "{command} {arguments}"
            );
        }
    }

    #[test]
    fn the_approval_capability_grants_exactly_these_commands() {
        let capability: Value = serde_json::from_str(include_str!(
            "../../../src-tauri/capabilities/approval.json"
        ))
        .unwrap();
        let granted: Vec<String> = capability["permissions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p.as_str()?.strip_prefix("allow-"))
            .map(|p| p.replace('-', "_"))
            .collect();
        let mut names = NAMES.to_vec();
        names.sort();
        let mut sorted = granted.clone();
        sorted.sort();
        assert_eq!(sorted, names);
        assert!(
            include_str!("../../../src-tauri/build.rs").contains("command_names.in"),
            "the window's build reads the same names"
        );
    }
}
