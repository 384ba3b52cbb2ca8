//! Opening `countersign://request/<id>`: the window comes forward showing that request.
//!
//! A 2026-07-28 client is sent that URL for a gated call (see the session's `rounds`); the
//! desktop entry hands it to the desk (`countersign-desk URL`, `%u`), and `countersign open URL`
//! sends it too. A second desk passes it to the running one in its focus hello; a first start
//! keeps it for the page it is about to load. Either way the page takes it once
//! (`countersign_authority::commands::take_focus`) and selects that request if it still waits, or says it no longer does.
//!
//! The URL is read strictly (`countersign_wire::parse_request_url`): anything that is not exactly
//! such a URL is refused with a sentence and the desk does nothing. It only chooses what is shown:
//! nothing here approves or denies, and the engine holds approvals for the delay before the
//! window can show the request (as for any focus), so a click aimed at what was on screen before
//! lands on nothing.

use countersign_authority::Desk;
use tauri::{AppHandle, Emitter, Manager};

/// A URL asked for request `id`: approvals are held first (the engine's delay starts again),
/// then the page is told to take it and select it.
pub fn asked(app: &AppHandle, id: u64) {
    tracing::info!(target: "desk", request = id, "a request URL was opened");
    crate::hold_approvals(app);
    *app.state::<Desk>().wanted.lock().unwrap() = Some(id);
    let _ = app.emit("queue://focus", ());
}
