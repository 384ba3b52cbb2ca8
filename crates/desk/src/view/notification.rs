//! The desktop notification's text for a new request: the same escaping and flags as the window,
//! plus markup entities where the notification server may read markup.

use countersign_engine::PendingRequest;
use serde_json::Value;

use super::{Flag, agent_name, shown};

/// The body of the desktop notification for a new request. `markup`: whether the platform's
/// notification server may read markup (freedesktop servers may; macOS and Windows show text).
pub fn notification_body(r: &PendingRequest, markup: bool) -> String {
    if let Some(change) = r.change() {
        let subject = shown(&change.subject);
        let warning = if subject.flags.is_empty() {
            ""
        } else {
            " (⚠ unusual characters, shown escaped)"
        };
        let subject = if markup {
            subject.markup()
        } else {
            subject.text
        };
        return format!(
            "A change to the desk waits for you: {} {subject}{warning}",
            change.kind.code()
        );
    }
    let parts = [
        shown(&agent_name(
            r.call().map_or(&Value::Null, |c| &c.client_info),
        )),
        shown(&r.plan.tool),
        shown(&r.plan.target),
    ];
    let mut flags: Vec<Flag> = parts.iter().flat_map(|p| p.flags.clone()).collect();
    flags.sort();
    let warning = match flags.first() {
        Some(Flag::Bidi) => " (⚠ direction-changing characters, shown escaped)",
        Some(Flag::Invisible) => " (⚠ invisible characters, shown escaped)",
        Some(Flag::NonAscii) => " (⚠ non-ASCII characters that may look like others)",
        None => "",
    };
    let [agent, tool, target] = parts.map(|p| if markup { p.markup() } else { p.text });
    format!("{agent} asks to run {tool} on {target}{warning}")
}
