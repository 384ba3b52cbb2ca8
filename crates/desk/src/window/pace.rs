//! How often the desk may interrupt the person.
//!
//! An agent can queue requests as fast as it can send them (up to the engine's caps), and a
//! second desk start can be repeated in a loop. Neither may turn into a window that steals focus
//! many times a second, a notification per request, or a page that re-renders the whole queue on
//! every change. Changes that arrive together are handled together, and each interruption has a
//! least gap between two of its kind. Time is passed in, so the rules are tested without a clock.

use std::time::{Duration, Instant};

/// The least gap between two window raises for new requests.
pub const RAISE_GAP: Duration = Duration::from_secs(10);
/// The least gap between two raises asked for by a second start of the desk.
pub const FOCUS_GAP: Duration = Duration::from_secs(2);
/// The least gap between two desktop notifications.
pub const NOTIFY_GAP: Duration = Duration::from_secs(5);
/// After sending the window a queue change, how long the desk gathers further changes into one
/// more update.
pub const GATHER: Duration = Duration::from_millis(50);

/// One kind of interruption, allowed at most once per `gap`.
#[derive(Debug, Clone)]
pub struct Pace {
    gap: Duration,
    last: Option<Instant>,
}

impl Pace {
    /// At most once per `gap`.
    pub fn new(gap: Duration) -> Self {
        Pace { gap, last: None }
    }

    /// Whether the interruption may happen at `now`; if so, it counts as having happened.
    pub fn allow(&mut self, now: Instant) -> bool {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.gap => false,
            _ => {
                self.last = Some(now);
                true
            }
        }
    }
}

/// A batch of queue changes: the first, and what followed within [`GATHER`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Batch {
    /// New requests in the batch.
    pub added: usize,
    /// Whether a second start of the desk asked for the window.
    pub focus: bool,
}

/// The desk's interruptions.
#[derive(Debug, Clone)]
pub struct Interruptions {
    raise: Pace,
    focus: Pace,
    notify: Pace,
}

/// What to do for a batch.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Actions {
    /// Bring the window forward.
    pub raise: bool,
    /// Send a desktop notification about this many new requests.
    pub notify: Option<usize>,
}

impl Default for Interruptions {
    fn default() -> Self {
        Interruptions {
            raise: Pace::new(RAISE_GAP),
            focus: Pace::new(FOCUS_GAP),
            notify: Pace::new(NOTIFY_GAP),
        }
    }
}

impl Interruptions {
    /// What `batch` may do at `now`. The window's queue, title and tray are always updated (once
    /// per batch); raising the window and notifying are paced.
    pub fn decide(&mut self, batch: &Batch, now: Instant) -> Actions {
        let raise_for_new = batch.added > 0 && self.raise.allow(now);
        let raise_for_focus = batch.focus && self.focus.allow(now);
        let notify = (batch.added > 0 && self.notify.allow(now)).then_some(batch.added);
        Actions {
            raise: raise_for_new || raise_for_focus,
            notify,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_requests_raises_the_window_once_per_gap_and_notifies_once_per_gap() {
        let mut i = Interruptions::default();
        let start = Instant::now();
        let batch = Batch {
            added: 1,
            focus: false,
        };
        let mut raises = 0;
        let mut notes = 0;
        // A new request every 100 ms for 30 s.
        for n in 0..300 {
            let a = i.decide(&batch, start + Duration::from_millis(100 * n));
            raises += usize::from(a.raise);
            notes += usize::from(a.notify.is_some());
        }
        assert_eq!(raises, 3, "once per {RAISE_GAP:?}");
        assert_eq!(notes, 6, "once per {NOTIFY_GAP:?}");
    }

    #[test]
    fn repeated_second_starts_raise_at_most_once_per_focus_gap() {
        let mut i = Interruptions::default();
        let start = Instant::now();
        let focus = Batch {
            added: 0,
            focus: true,
        };
        let raised: Vec<bool> = [0, 500, 1999, 2000, 2100]
            .iter()
            .map(|ms| i.decide(&focus, start + Duration::from_millis(*ms)).raise)
            .collect();
        assert_eq!(raised, [true, false, false, true, false]);
        assert_eq!(
            i.decide(&focus, start).notify,
            None,
            "focus alone notifies nothing"
        );
    }

    #[test]
    fn a_batch_of_many_requests_is_one_notification_that_counts_them() {
        let mut i = Interruptions::default();
        let a = i.decide(
            &Batch {
                added: 7,
                focus: false,
            },
            Instant::now(),
        );
        assert_eq!(
            a,
            Actions {
                raise: true,
                notify: Some(7)
            }
        );
    }
}
