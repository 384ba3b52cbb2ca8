//! The window's commands: the only way the front end reaches the engine.
//!
//! `approve` is the one path in the product that mints a token, and it is reachable only from the
//! approval window (see `capabilities/approval.json`). Errors cross as [`UiError`] codes.

use countersign_core::policy::Policy;
use countersign_store::HistoryFilter;
use serde::{Deserialize, Serialize};
use tauri::State;

use crate::Desk;
use crate::settings::Settings;
use crate::view::{HistoryRow, RequestView, UiError};

/// Every request waiting for a person.
#[tauri::command]
pub fn pending(desk: State<'_, Desk>) -> Vec<RequestView> {
    desk.engine
        .pending()
        .iter()
        .map(RequestView::from)
        .collect()
}

/// A person clicked Approve (after the delay, with the target typed where policy asks).
#[tauri::command]
pub fn approve(
    desk: State<'_, Desk>,
    id: u64,
    typed_target: Option<String>,
) -> Result<(), UiError> {
    Ok(desk.engine.approve(id, typed_target.as_deref())?)
}

/// A person clicked Deny, with an optional note for the agent.
#[tauri::command]
pub fn deny(desk: State<'_, Desk>, id: u64, note: Option<String>) -> Result<(), UiError> {
    Ok(desk.engine.deny(id, note.as_deref())?)
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
pub fn history(desk: State<'_, Desk>, query: HistoryQuery) -> Result<Vec<HistoryRow>, UiError> {
    let mut filter = HistoryFilter::default().limit(500);
    filter.tool = query.tool.filter(|t| !t.is_empty());
    filter.kind = query.kind.filter(|k| !k.is_empty());
    let events = desk
        .engine
        .history(&filter)
        .map_err(|e| UiError::new("store_failed", e))?;
    let wanted = query.server.filter(|s| !s.is_empty());
    let rows = events
        .iter()
        .filter_map(|event| {
            let server = desk.engine.server_of(&event.tenant);
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

#[tauri::command]
pub fn settings(desk: State<'_, Desk>) -> SettingsView {
    SettingsView {
        settings: desk.settings.lock().unwrap().clone(),
        policy: desk.dirs.policy_text(),
    }
}

#[tauri::command]
pub fn save_settings(desk: State<'_, Desk>, view: SettingsView) -> Result<SettingsView, UiError> {
    let settings = view.settings.sanitized();
    let policy: Policy = desk
        .dirs
        .save_policy(&view.policy)
        .map_err(|e| UiError::new("bad_policy", e))?;
    desk.dirs
        .save_settings(&settings)
        .map_err(|e| UiError::new("io", e.to_string()))?;
    desk.engine.set_policy(policy);
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
#[tauri::command]
pub fn rotate_secret(desk: State<'_, Desk>) -> Result<(), UiError> {
    desk.rotate_secret()
        .map_err(|e| UiError::new("no_secret", e))
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
        secret_problem: desk.engine.secret_problem(),
        approve_delay_ms: desk.settings.lock().unwrap().approve_delay_ms,
    }
}
