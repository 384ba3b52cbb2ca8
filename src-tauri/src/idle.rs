//! A light idle desk: the window's webview is released while nobody needs it.
//!
//! The window costs most of the desk's memory: WebKit runs the page in a web process of its own
//! (about 150 MB with the desk's page). Closing the window hides it (the desk keeps serving, its
//! tray and sockets stay); once it has been hidden with nothing pending for the release delay
//! (`settings.json`'s `release_after_s`, 60 s unless set, 10 s to 24 h), the desk destroys it and
//! the web process exits. The next request, a second start asking for the window, or the tray's
//! Show creates it again from the same entry of `tauri.conf.json` (the label `main`, so the
//! approval capability, which is bound to that label, is the new window's and no other's; the same
//! URL, CSP and settings). Nothing is lost: the queue and history live in the engine and the
//! store, and the page reads them when it loads. WebKitGTK keeps its network process for the
//! application's whole life (wry keeps the web context so the next webview can use it): that one
//! stays.
//!
//! A recreated window never has an early Approve: the engine holds approvals when the window is
//! shown, when it gains focus and when its page has loaded (see `main.rs`), and the page holds its
//! button for the delay from when it renders a request.
//!
//! Creating and destroying both happen on the main thread, each decided from [`Life`] there, so a
//! request arriving while the window is being destroyed waits for the destruction to finish and
//! then creates the window; it never finds half a window. The timing ([`IdleClock`]) and the
//! transitions ([`Life`]) are plain functions of what they are told, tested without a clock or a
//! display.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tauri::{AppHandle, Manager, WebviewWindowBuilder};

/// The approval window's label (`tauri.conf.json`, `capabilities/approval.json`).
pub const LABEL: &str = "main";
use countersign_authority::settings::RELEASE_AFTER_S;

/// What the desk sees of its window at one look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// On screen (or minimized): a person may be looking at it.
    Shown,
    /// Closed by the person (hidden); the webview still runs.
    Hidden,
    /// No window: released, or being created again.
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

/// The window's life and idle clock, in the app's state.
pub struct Lifecycle {
    life: Mutex<Life>,
    clock: Mutex<IdleClock>,
}

impl Lifecycle {
    /// No window yet (`tauri.conf.json` creates none: the desk does, at start unless it starts
    /// in the tray, see `main.rs`), released after `after` idle.
    pub fn new(after: Duration) -> Self {
        Lifecycle {
            life: Mutex::new(Life::Released),
            clock: Mutex::new(IdleClock::new(after)),
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

/// Looks at the window every [`IdleClock::look_every`] and releases its webview when the clock
/// says so. Runs for the desk's life.
pub fn watch(app: &AppHandle) {
    let app = app.clone();
    tauri::async_runtime::spawn(async move {
        let every = app.state::<Lifecycle>().clock.lock().unwrap().look_every();
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let main = app.clone();
            let _ = app.run_on_main_thread(move || look(&main));
        }
    });
}

/// The queue changed: the idle wait starts over (see [`IdleClock::touch`]).
pub fn touch(app: &AppHandle) {
    if let Some(lifecycle) = app.try_state::<Lifecycle>() {
        lifecycle.clock.lock().unwrap().touch();
    }
}

/// The window is wanted (a request came, the tray's Show, a second start): shown, or only there.
pub fn want(app: &AppHandle, show: bool) {
    let main = app.clone();
    let _ = app.run_on_main_thread(move || {
        let lifecycle = main.state::<Lifecycle>();
        let (life, act) = {
            let mut life = lifecycle.life.lock().unwrap();
            let (next, act) = life.wanted(show);
            *life = next;
            (next, act)
        };
        tracing::debug!(target: "desk", ?life, ?act, "window wanted");
        act_on(&main, act);
    });
}

/// Called for every event of the run loop: the window's destruction (after Tauri has let go of
/// its label), and the exit Tauri asks for when the last window is gone, which the desk refuses
/// (it goes on serving; the tray's Quit exits with a code and is not refused).
pub fn on_run_event(app: &AppHandle, event: &tauri::RunEvent) {
    match event {
        tauri::RunEvent::WindowEvent {
            label,
            event: tauri::WindowEvent::Destroyed,
            ..
        } if label == LABEL => {
            let lifecycle = app.state::<Lifecycle>();
            let act = {
                let mut life = lifecycle.life.lock().unwrap();
                let (next, act) = life.destroyed();
                *life = next;
                act
            };
            tracing::info!(target: "desk", "window released: its web process ends");
            act_on(app, act);
            give_back_freed_memory();
        }
        tauri::RunEvent::ExitRequested {
            code: None, api, ..
        } => api.prevent_exit(),
        _ => {}
    }
}

/// Once the window's teardown has settled, hands the heap the window used and freed back to the
/// system (glibc keeps freed memory in its arenas otherwise): a few MB of the idle desk.
fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    tauri::async_runtime::spawn(async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let _ = tauri::async_runtime::spawn_blocking(|| {
            // SAFETY: malloc_trim has no preconditions; it only returns free memory to the OS.
            unsafe { libc::malloc_trim(0) };
        })
        .await;
    });
}

/// One look, on the main thread.
fn look(app: &AppHandle) {
    let Some(desk) = app.try_state::<crate::Desk>() else {
        return;
    };
    let window = app.get_webview_window(LABEL);
    let seen = match &window {
        None => Seen::Absent,
        Some(w) if w.is_visible().unwrap_or(true) => Seen::Shown,
        Some(_) => Seen::Hidden,
    };
    let pending = desk.pending().len();
    let lifecycle = app.state::<Lifecycle>();
    if !lifecycle
        .clock
        .lock()
        .unwrap()
        .should_release(Instant::now(), seen, pending)
    {
        return;
    }
    let act = {
        let mut life = lifecycle.life.lock().unwrap();
        let (next, act) = life.release();
        *life = next;
        act
    };
    act_on(app, act);
}

/// Does `act`, on the main thread.
fn act_on(app: &AppHandle, act: Act) {
    match act {
        Act::Nothing => {}
        Act::Show => {
            if let Some(window) = app.get_webview_window(LABEL) {
                let _ = window.show();
                let _ = window.unminimize();
                let _ = window.set_focus();
            }
        }
        Act::Destroy => {
            if let Some(window) = app.get_webview_window(LABEL) {
                tracing::info!(target: "desk", "window idle: releasing its webview");
                if let Err(e) = window.destroy() {
                    tracing::warn!(target: "desk", "could not release the window: {e}");
                }
            }
        }
        Act::Create(show) => create(app, show),
    }
}

/// Creates the window again from its entry in `tauri.conf.json`.
fn create(app: &AppHandle, show: bool) {
    if app.get_webview_window(LABEL).is_some() {
        // Not released after all (a destruction that failed): the one there is the window.
        act_on(app, if show { Act::Show } else { Act::Nothing });
        return;
    }
    let Some(config) = app
        .config()
        .app
        .windows
        .iter()
        .find(|w| w.label == LABEL)
        .cloned()
    else {
        tracing::error!(target: "desk", "no window {LABEL:?} in the configuration");
        return;
    };
    let built = WebviewWindowBuilder::from_config(app, &config)
        .and_then(|b| b.visible(show).focused(show).build());
    match built {
        Ok(window) => {
            tracing::info!(target: "desk", shown = show, "window created");
            if let Some(desk) = app.try_state::<crate::Desk>() {
                crate::update_count(app, &desk.engine);
            }
            if show {
                let _ = window.set_focus();
            }
        }
        Err(e) => {
            // The next request or Show tries again.
            tracing::error!(target: "desk", "could not create the window again: {e}");
            *app.state::<Lifecycle>().life.lock().unwrap() = Life::Released;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use countersign_authority::settings::MIN_RELEASE_AFTER_S;

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
        assert!(Duration::from_secs(MIN_RELEASE_AFTER_S) >= crate::pace::RAISE_GAP);
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
