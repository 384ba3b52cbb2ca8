//! The window's commands: the only way the front end reaches the engine.
//!
//! `approve` is the one path in the product that mints a token, and it is reachable only from the
//! approval window (see `capabilities/approval.json`). Errors cross as [`UiError`] codes.
//!
//! Tauri runs a plain command on the UI thread. Every command that touches the disk or the
//! keychain (the store's durable writes, history, settings files, the secret) is `async` and does
//! that work on the blocking pool, so neither the window nor the sessions' async workers wait on
//! a disk; only `pending` and `status`, which read memory, stay plain.

use countersign_core::policy::Policy;
use std::os::unix::fs::OpenOptionsExt;

use countersign_store::{HistoryFilter, StoreOptions};
use serde::{Deserialize, Serialize};
use tauri::State;

use countersign_core::approver::Verdict;

use crate::Desk;
use crate::approver::Remote;
use crate::settings::Settings;
use crate::view::{HistoryRow, RequestView, UiCode, UiError};

/// Every request waiting for a person.
///
/// Debug builds read `COUNTERSIGN_DEBUG_PENDING_LATE_MS`: the answer (read at once) is held that
/// long before it goes back, so a test can make the window's first read race the first
/// `queue://changed` event, as a slow machine does now and then.
#[tauri::command]
pub async fn pending(desk: State<'_, Desk>) -> Result<Vec<RequestView>, UiError> {
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
    tauri::async_runtime::spawn_blocking(work)
        .await
        .map_err(|e| UiError::new(UiCode::Internal, e.to_string()))?
}

/// A person clicked Approve (after the delay, with the target typed where policy asks).
#[tauri::command]
pub async fn approve(
    app: tauri::AppHandle,
    desk: State<'_, Desk>,
    id: u64,
    typed_target: Option<String>,
) -> Result<(), UiError> {
    // Mint only while the keychain answers (see `check_keychain`).
    if let Some(why) = crate::check_keychain(&app).await {
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
#[tauri::command]
pub async fn deny(desk: State<'_, Desk>, id: u64, note: Option<String>) -> Result<(), UiError> {
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
#[tauri::command]
pub async fn history(
    desk: State<'_, Desk>,
    query: HistoryQuery,
) -> Result<Vec<HistoryRow>, UiError> {
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
#[tauri::command(async)]
pub fn settings(desk: State<'_, Desk>) -> SettingsView {
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
#[tauri::command]
pub async fn save_history(desk: State<'_, Desk>, format: String) -> Result<SavedView, UiError> {
    use countersign_store::export::{ExportFormat, export};
    let (format, extension) = match format.as_str() {
        "jsonl" => (ExportFormat::Jsonl, "jsonl"),
        "csv" => (ExportFormat::Csv, "csv"),
        _ => return Err(UiError::new(UiCode::BadRequest, "save as jsonl or csv")),
    };
    let store = desk.dirs.store();
    let folder = desk.dirs.data.join("exports");
    let io = |e: std::io::Error| UiError::new(UiCode::Io, e.to_string());
    tauri::async_runtime::spawn_blocking(move || {
        crate::settings::private_dir(&folder).map_err(io)?;
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
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
#[tauri::command]
pub async fn export_status(
    desk: State<'_, Desk>,
) -> Result<Option<crate::otlp::ExportView>, UiError> {
    desk.export
        .view()
        .await
        .map_err(|e| UiError::new(UiCode::StoreFailed, e))
}

#[tauri::command]
pub async fn save_settings(
    desk: State<'_, Desk>,
    view: SettingsView,
) -> Result<SettingsView, UiError> {
    let settings = view.settings.sanitized();
    // The person's own edit applies directly; an unchanged policy is not saved (nor recorded).
    if view.policy != desk.registry.accepted_text(countersign_registry::POLICY) {
        Policy::from_toml(&view.policy).map_err(|e| UiError::new(UiCode::BadPolicy, e))?;
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
            .map_err(|e| UiError::new(UiCode::BadRequest, e))?;
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
#[tauri::command(async)]
pub fn rotate_secret(desk: State<'_, Desk>) -> Result<(), UiError> {
    desk.rotate_secret()
        .map_err(|e| UiError::new(UiCode::NoSecret, e))
}

/// Whether the desk can mint, and what to tell the person if not.
#[derive(Debug, Serialize)]
pub struct Status {
    /// `None` when all is well; else why nothing can be approved.
    pub secret_problem: Option<String>,
    /// The approve delay in force, in ms.
    pub approve_delay_ms: u64,
}

#[tauri::command]
pub fn status(desk: State<'_, Desk>) -> Status {
    Status {
        secret_problem: desk.secret_problem(),
        approve_delay_ms: desk.settings.lock().unwrap().approve_delay_ms,
    }
}
