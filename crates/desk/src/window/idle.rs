//! A light idle desk: the window, and WebKit with it, exists only while somebody may need it.
//!
//! The window costs most of the desk's memory: GTK and WebKit, and the web and network processes
//! WebKit starts (about 150 MB with the desk's page). So it lives in a process of its own, which
//! the desk starts when there is something to show (`window`) and ends once the window has been
//! closed (hidden) with nothing pending for the release delay (`settings.json`'s
//! `release_after_s`, 60 s unless set, 10 s to 24 h): WebKit's processes end with it, and the desk
//! goes back to what it weighs without a window (and a spare window's process, GTK up, no window,
//! see `window`). The next request, a second start asking for the window, or the tray's Show
//! opens it again. Nothing is lost: the queue and history live in the
//! engine and the store, and the page reads them when it loads.
//!
//! A new window never has an early Approve: the engine holds approvals when the window is shown,
//! when it gains focus and when its page has loaded, and the page holds its button for the delay
//! from when it renders a request.
//!
//! Starting and ending are decided from [`Life`] under one lock, so a request arriving while the
//! window's process is ending waits for it to be gone and then starts a new one; it never finds
//! half a window. The timing ([`IdleClock`]) and the transitions ([`Life`]) are plain functions
//! of what they are told, tested without a clock or a display.

use std::time::{Duration, Instant};

use crate::settings::RELEASE_AFTER_S;

/// What the desk sees of its window at one look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// On screen (or minimized): a person may be looking at it.
    Shown,
    /// Closed by the person (hidden); its process still runs.
    Hidden,
    /// No window: released, or being started (its process has not said yet what its window is).
    Absent,
}

/// When to release: after the window has been hidden with nothing pending for the whole delay,
/// without a break.
#[derive(Debug, Clone)]
pub struct IdleClock {
    after: Duration,
    since: Option<Instant>,
}

impl IdleClock {
    /// Releases after `after` of idleness.
    pub fn new(after: Duration) -> Self {
        IdleClock { after, since: None }
    }

    /// How often to look: often enough that a release comes at most a fifth of the delay late,
    /// and at most once a second.
    pub fn look_every(&self) -> Duration {
        (self.after / 5).clamp(Duration::from_millis(50), Duration::from_secs(1))
    }

    /// The queue changed (a request came or went): the wait starts over, even when no look saw
    /// the request (one decided, or gone, between two looks).
    pub fn touch(&mut self) {
        self.since = None;
    }

    /// Whether to release now, given what was seen at `now` and how many requests wait. Anything
    /// but a hidden window with an empty queue starts the wait over.
    pub fn should_release(&mut self, now: Instant, seen: Seen, pending: usize) -> bool {
        if seen != Seen::Hidden || pending > 0 {
            self.since = None;
            return false;
        }
        let since = *self.since.get_or_insert(now);
        if now.saturating_duration_since(since) >= self.after {
            self.since = None;
            return true;
        }
        false
    }
}

/// Where the window is in its life. Read and changed on the main thread only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Life {
    /// The window exists (shown or hidden).
    Live,
    /// Its destruction was asked for and has not finished; `then` is what was asked for since:
    /// `Some(true)` to create it shown, `Some(false)` hidden, `None` nothing.
    Releasing {
        /// What to do once it is gone.
        then: Option<bool>,
    },
    /// No window, no web process.
    Released,
}

/// What to do to the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// Nothing now.
    Nothing,
    /// Bring the existing window forward.
    Show,
    /// Create the window, shown (`true`) or hidden with its page loaded (`false`).
    Create(bool),
    /// Destroy the window.
    Destroy,
}

impl Life {
    /// The window is wanted: shown (`show`), or just there with the queue loaded.
    pub fn wanted(self, show: bool) -> (Life, Act) {
        match self {
            Life::Live if show => (Life::Live, Act::Show),
            Life::Live => (Life::Live, Act::Nothing),
            Life::Releasing { then } => (
                Life::Releasing {
                    then: Some(then.unwrap_or(false) || show),
                },
                Act::Nothing,
            ),
            Life::Released => (Life::Live, Act::Create(show)),
        }
    }

    /// The idle clock says release.
    pub fn release(self) -> (Life, Act) {
        match self {
            Life::Live => (Life::Releasing { then: None }, Act::Destroy),
            other => (other, Act::Nothing),
        }
    }

    /// The window is gone (destroyed by the release, or otherwise): what was asked for meanwhile
    /// happens now.
    pub fn destroyed(self) -> (Life, Act) {
        match self {
            Life::Releasing { then: Some(show) } => (Life::Live, Act::Create(show)),
            _ => (Life::Released, Act::Nothing),
        }
    }
}

/// The release delay: `release_after_s` from the settings (already bounded), else the default.
/// Debug builds also read `COUNTERSIGN_DEBUG_RELEASE_AFTER_MS` (at least 100 ms), so the tests
/// and the bench need not wait a minute; it only changes when the webview is released.
pub fn release_after(settings_s: Option<u64>) -> Duration {
    #[cfg(debug_assertions)]
    if let Some(ms) = std::env::var("COUNTERSIGN_DEBUG_RELEASE_AFTER_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        return Duration::from_millis(ms.max(100));
    }
    Duration::from_secs(settings_s.unwrap_or(RELEASE_AFTER_S))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::MIN_RELEASE_AFTER_S;

    const AFTER: Duration = Duration::from_secs(60);

    #[test]
    fn a_hidden_window_with_nothing_pending_is_released_after_the_whole_delay() {
        let mut clock = IdleClock::new(AFTER);
        let t = Instant::now();
        assert!(!clock.should_release(t, Seen::Hidden, 0));
        assert!(!clock.should_release(t + Duration::from_secs(59), Seen::Hidden, 0));
        assert!(clock.should_release(t + AFTER, Seen::Hidden, 0));
        // Released once: the wait starts over.
        assert!(!clock.should_release(t + AFTER + Duration::from_secs(1), Seen::Hidden, 0));
    }

    #[test]
    fn a_shown_window_or_a_pending_request_starts_the_wait_over() {
        let mut clock = IdleClock::new(AFTER);
        let t = Instant::now();
        let s = Duration::from_secs;
        assert!(!clock.should_release(t, Seen::Hidden, 0));
        assert!(!clock.should_release(t + s(50), Seen::Shown, 0), "shown");
        assert!(!clock.should_release(t + s(60), Seen::Hidden, 0));
        assert!(
            !clock.should_release(t + s(100), Seen::Hidden, 1),
            "pending"
        );
        assert!(!clock.should_release(t + s(101), Seen::Hidden, 0));
        assert!(!clock.should_release(t + s(160), Seen::Hidden, 0));
        assert!(clock.should_release(t + s(161), Seen::Hidden, 0));
    }

    #[test]
    fn a_request_that_came_and_went_between_two_looks_starts_the_wait_over() {
        let mut clock = IdleClock::new(AFTER);
        let t = Instant::now();
        let s = Duration::from_secs;
        assert!(!clock.should_release(t, Seen::Hidden, 0));
        // At 59 s a request comes and is decided before the next look sees it.
        clock.touch();
        assert!(!clock.should_release(t + s(60), Seen::Hidden, 0));
        assert!(!clock.should_release(t + s(119), Seen::Hidden, 0));
        assert!(clock.should_release(t + s(120), Seen::Hidden, 0));
    }

    #[test]
    fn an_absent_window_is_never_released_again() {
        let mut clock = IdleClock::new(Duration::from_millis(100));
        let t = Instant::now();
        for ms in [0, 100, 1000, 60_000] {
            assert!(!clock.should_release(t + Duration::from_millis(ms), Seen::Absent, 0));
        }
    }

    #[test]
    fn the_clock_looks_often_enough_and_at_most_once_a_second() {
        assert_eq!(IdleClock::new(AFTER).look_every(), Duration::from_secs(1));
        assert_eq!(
            IdleClock::new(Duration::from_millis(500)).look_every(),
            Duration::from_millis(100)
        );
        assert_eq!(
            IdleClock::new(Duration::from_millis(100)).look_every(),
            Duration::from_millis(50)
        );
    }

    #[test]
    fn a_request_while_the_window_is_being_destroyed_creates_it_once_it_is_gone() {
        let (life, act) = Life::Live.release();
        assert_eq!(act, Act::Destroy);
        // A request that does not raise, then a Show, while the destruction runs: nothing yet.
        let (life, act) = life.wanted(false);
        assert_eq!(act, Act::Nothing);
        let (life, act) = life.wanted(true);
        assert_eq!(act, Act::Nothing);
        // Gone: created once, shown (the Show is not lost to the earlier request).
        let (life, act) = life.destroyed();
        assert_eq!((life, act), (Life::Live, Act::Create(true)));
        // A second release request while live destroys; released twice does nothing.
        assert_eq!(Life::Released.release(), (Life::Released, Act::Nothing));
        assert_eq!(
            Life::Releasing { then: None }.release(),
            (Life::Releasing { then: None }, Act::Nothing)
        );
    }

    #[test]
    fn a_released_window_is_created_on_the_next_request_and_only_once() {
        let (life, act) = Life::Releasing { then: None }.destroyed();
        assert_eq!((life, act), (Life::Released, Act::Nothing));
        let (life, act) = life.wanted(false);
        assert_eq!((life, act), (Life::Live, Act::Create(false)));
        // The next ones find it live: shown on a raise, left alone otherwise.
        assert_eq!(life.wanted(false), (Life::Live, Act::Nothing));
        assert_eq!(life.wanted(true), (Life::Live, Act::Show));
    }

    #[test]
    fn a_window_destroyed_some_other_way_counts_as_released() {
        assert_eq!(Life::Live.destroyed(), (Life::Released, Act::Nothing));
        assert_eq!(Life::Released.wanted(true), (Life::Live, Act::Create(true)));
    }

    #[test]
    fn a_release_never_comes_sooner_than_the_least_gap_between_two_raises() {
        // So the first request after a release may always raise the window it creates: a
        // release follows at least this long after the window was hidden, so after any raise.
        assert!(Duration::from_secs(MIN_RELEASE_AFTER_S) >= super::super::pace::RAISE_GAP);
    }

    #[test]
    fn the_release_delay_defaults_to_a_minute() {
        // Debug builds read the test knob: only when it is absent is the default in force.
        if std::env::var_os("COUNTERSIGN_DEBUG_RELEASE_AFTER_MS").is_none() {
            assert_eq!(release_after(None), Duration::from_secs(RELEASE_AFTER_S));
            assert_eq!(release_after(Some(30)), Duration::from_secs(30));
        }
    }
}
