//! History's commands: the rows the view lists, History → Save, and how the OpenTelemetry
//! collector fares.

use countersign_core::Tenant;
use std::os::unix::fs::OpenOptionsExt;

use countersign_store::{HistoryFilter, StoreOptions};
use serde::{Deserialize, Serialize};

use crate::Desk;
use crate::ui_code::{UiCode, UiError};
use crate::view::HistoryRow;

/// History, newest first, filtered.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
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
            let server = engine.server_of(&Tenant::recorded(event.tenant.as_str()));
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

/// The file History → Save writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SaveFormat {
    /// One JSON object per line.
    Jsonl,
    /// Comma-separated values with a header row.
    Csv,
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
pub async fn save_history(desk: &Desk, format: SaveFormat) -> Result<SavedView, UiError> {
    use countersign_store::export::{ExportFormat, export};
    let (format, extension) = match format {
        SaveFormat::Jsonl => (ExportFormat::Jsonl, "jsonl"),
        SaveFormat::Csv => (ExportFormat::Csv, "csv"),
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
