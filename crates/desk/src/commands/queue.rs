//! The queue's commands: what waits, Approve, Deny, and the request a URL asked to show.
//!
//! `approve` is one of the two paths in the product that mint a token (the other is
//! [`super::grants::approve_widening`]); both are reachable only from the approval window, and
//! both mint only while the keychain answers ([`check_keychain`]). A team server's request is
//! signed here and decided there ([`crate::approver`]).

use countersign_core::approver::Verdict;
use countersign_core::sync::lock;
use serde_json::Value;

use crate::Desk;
use crate::approver::Remote;
use crate::ui_code::{UiCode, UiError};
use crate::view::RequestView;
use crate::window::Windowed;

/// Asks the keychain whether it still answers ([`Desk::check_keychain`]) and, when that changed,
/// tells the window (`secret://status`): its banner follows. `Some(why)` when nothing may be
/// minted now.
pub async fn check_keychain(desk: &Desk, window: &Windowed) -> Option<String> {
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
    lock(&desk.wanted).take().map(|id| id.to_string())
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

/// A person clicked Approve (after the delay, with the target typed where policy asks).
pub async fn approve(
    window: &Windowed,
    desk: &Desk,
    id: u64,
    typed_target: Option<String>,
) -> Result<(), UiError> {
    // Mint only while the keychain answers (see `check_keychain`).
    if let Some(why) = check_keychain(desk, window).await {
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
