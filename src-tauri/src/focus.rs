//! Opening `countersign://request/<id>`: the window comes forward showing that request.
//!
//! A 2026-07-28 client is sent that URL for a gated call (see the session's `rounds`); the
//! desktop entry hands it to the desk (`countersign-desk URL`, `%u`), and `countersign open URL`
//! sends it too. A second desk passes it to the running one in its focus hello; a first start
//! keeps it for the page it is about to load. Either way the page takes it once
//! ([`take_focus`]) and selects that request if it still waits, or says it no longer does.
//!
//! The URL is read strictly (`countersign_wire::parse_request_url`): anything that is not exactly
//! such a URL is refused with a sentence and the desk does nothing. It only chooses what is shown:
//! nothing here approves or denies, and the engine holds approvals for the delay before the
//! window can show the request (as for any focus), so a click aimed at what was on screen before
//! lands on nothing.

use std::sync::Mutex;

use tauri::{AppHandle, Emitter, Manager, State};

/// The request a URL last asked the window to show, until the page takes it.
#[derive(Default)]
pub struct Wanted(Mutex<Option<u64>>);

impl Wanted {
    /// Wanted from the start (a first start of the desk with a URL).
    pub fn new(request: Option<u64>) -> Self {
        Wanted(Mutex::new(request))
    }
}

/// The request a URL on the desk's command line names, if any. The arguments that are not
/// options (not starting with `-`) are read as one request URL: at most one, read strictly.
pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<Option<u64>, String> {
    let mut urls = args.into_iter().filter(|a| !a.starts_with('-'));
    let Some(url) = urls.next() else {
        return Ok(None);
    };
    if urls.next().is_some() {
        return Err("at most one countersign://request/<id> URL may be opened at a time".into());
    }
    countersign_wire::parse_request_url(&url)
        .map(Some)
        .map_err(|e| {
            format!(
                "not a request URL ({e}); it opens nothing. A request URL is exactly \
                 countersign://request/<id>"
            )
        })
}

/// A URL asked for request `id`: approvals are held first (the engine's delay starts again),
/// then the page is told to take it and select it.
pub fn asked(app: &AppHandle, id: u64) {
    tracing::info!(target: "desk", request = id, "a request URL was opened");
    crate::hold_approvals(app);
    *app.state::<Wanted>().0.lock().unwrap() = Some(id);
    let _ = app.emit("queue://focus", ());
}

/// The request a URL asked the window to show, once, as its decimal id (a string: a JavaScript
/// number is exact only to 2^53): the page asks when it loads and when told (`queue://focus`).
#[tauri::command]
pub fn take_focus(wanted: State<'_, Wanted>) -> Option<String> {
    wanted.0.lock().unwrap().take().map(|id| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_desk_started_with_a_request_url_wants_that_request() {
        assert_eq!(from_args(args(&[])), Ok(None));
        assert_eq!(from_args(args(&["--in-memory-secret"])), Ok(None));
        assert_eq!(
            from_args(args(&["--in-memory-secret", "countersign://request/12"])),
            Ok(Some(12))
        );
    }

    #[test]
    fn anything_but_one_strict_request_url_is_refused() {
        for bad in [
            &["countersign://request/1?approve=1"][..],
            &["countersign://request/1/approve"],
            &["COUNTERSIGN://request/1"],
            &["https://example.com/"],
            &["countersign://request/99999999999999999999999"],
            &["countersign://request/1", "countersign://request/2"],
            &[""],
        ] {
            let refused = from_args(args(bad)).unwrap_err();
            assert!(refused.contains("countersign://request/<id>"), "{refused}");
        }
    }
}
