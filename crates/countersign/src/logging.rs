//! Where `countersign` logs, and the one filter rule it never lets a user turn off.
//!
//! Logs go to stderr, because in `countersign mcp` stdout carries the protocol. The user's
//! `RUST_LOG` decides verbosity, except that confirmation events (target `confirm`) are always
//! kept: refusals and replays are the record that an approval boundary was tested, so the
//! project's own subscriber never samples or filters them out.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::Directive;

/// The default verbosity when `RUST_LOG` is unset or unreadable.
pub const DEFAULT_FILTER: &str = "warn";

/// The directive appended last to every filter, so no user directive can silence it.
fn confirm_directive() -> Directive {
    format!("{}=info", countersign_core::telemetry::TARGET)
        .parse()
        .expect("a valid directive")
}

/// The filter for a `RUST_LOG` value: the user's directives (or [`DEFAULT_FILTER`]), then
/// `confirm=info`, which replaces any directive of the user's for that target.
pub fn filter(rust_log: Option<&str>) -> EnvFilter {
    let base = rust_log
        .and_then(|spec| EnvFilter::try_new(spec).ok())
        .unwrap_or_else(|| EnvFilter::new(DEFAULT_FILTER));
    base.add_directive(confirm_directive())
}

/// Installs the stderr subscriber for this process. Call once, at the start of `main`.
pub fn init() {
    let rust_log = std::env::var("RUST_LOG").ok();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter(rust_log.as_deref()))
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use countersign_core::Refusal;
    use countersign_core::telemetry::{ConfirmEvent, EventKind};
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            countersign_core::sync::lock(&self.0).extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged_under(rust_log: &str, emit: impl FnOnce()) -> String {
        let capture = Capture::default();
        let writer = capture.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_env_filter(filter(Some(rust_log)))
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        String::from_utf8(countersign_core::sync::lock(&capture.0).clone()).unwrap()
    }

    fn event(kind: EventKind) -> ConfirmEvent {
        ConfirmEvent {
            at_ms: 1,
            kind,
            tool: "delete_backup".into(),
            target: Some("nightly".into()),
            tenant: "conn-7".into(),
            nonce: None,
            plan: None,
            note: None,
        }
    }

    #[test]
    fn refusals_and_replays_survive_any_user_filter() {
        for spec in [
            "off",
            "error",
            "confirm=off",
            "confirm=error",
            "off,confirm=off",
            "[{refusal}]=off",
            "not a filter %%",
        ] {
            let out = logged_under(spec, || {
                event(EventKind::Refused {
                    refusal: Refusal::PlanChanged,
                })
                .emit();
                event(EventKind::Replay).emit();
            });
            assert!(
                out.contains("plan_changed"),
                "refusal dropped under RUST_LOG={spec:?}: {out}"
            );
            assert!(
                out.contains("confirm replay"),
                "replay dropped under RUST_LOG={spec:?}: {out}"
            );
        }
    }

    #[test]
    fn issuance_and_acceptance_are_kept_too() {
        let out = logged_under("off", || {
            event(EventKind::Issued).emit();
            event(EventKind::Accepted).emit();
        });
        assert!(
            out.contains("confirm issued") && out.contains("confirm accepted"),
            "{out}"
        );
    }

    #[test]
    fn other_targets_follow_the_user_filter() {
        let out = logged_under("off", || tracing::warn!(target: "gateway", "noise"));
        assert!(!out.contains("noise"));
        let out = logged_under(
            "gateway=info",
            || tracing::warn!(target: "gateway", "signal"),
        );
        assert!(out.contains("signal"));
    }
}
