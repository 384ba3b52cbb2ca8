//! The desk with a display: its window in a process of its own, started when there is something
//! to show and ended when idle (`idle`), over a channel only the desk holds (`channel`); its tray;
//! its desktop notifications; and the loop that turns queue changes into all of those.
//!
//! The desk itself links no GUI toolkit: the window's process (`countersign-desk` started with
//! [`WINDOW_FLAG`]) is the only one that maps GTK and WebKit, and WebKit's processes are its
//! children, so they all end with it. Such a process makes its window only when the desk says
//! `open`: after each release, and in the tray, the desk keeps one spare, started and with GTK
//! up but no window and no WebKit process (a fraction of a window's memory), so that a request
//! from the light state waits for the web view and its page, not for a process and GTK too.
//!
//! The tray is a StatusNotifierItem spoken over D-Bus (`ksni`), and notifications go over D-Bus
//! too (`notify-rust`): neither needs GTK.
//!
//! The window's process runs no command itself: each invoke crosses the channel and runs here
//! ([`commands::run`]), with the engine's checks (an approve sooner than the delay since the
//! window was shown, focused or loaded is refused whatever the page does).
#![allow(unsafe_code)] // this module reaches the OS through libc; each unsafe block says why it is sound

use countersign_core::sync::lock;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use countersign_engine::{PendingRequest, QueueChange};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::sync::{Notify, mpsc};

pub mod channel;
pub mod idle;
pub mod pace;
mod tray;

use channel::{CHANNEL_FD, FromWindow, ToWindow, WINDOW_FLAG};
use idle::{Act, IdleClock, Life, Seen};
pub use tray::Tray;

use crate::commands::{self, Command};
use crate::desk::Desk;
use crate::view;

/// How long a window's process may take to end once its channel is closed, before it is killed.
const END_WITHIN: Duration = Duration::from_secs(5);

/// The desk's window, as the desk drives it.
pub struct Windowed {
    desk: Arc<Desk>,
    /// `countersign-desk`, beside this program; `None` when this program cannot tell where it is
    /// (never looked up in `PATH`: whatever answers there would be handed the channel).
    program: Option<PathBuf>,
    state: Mutex<State>,
    tray: Mutex<Option<ksni::Handle<Tray>>>,
    /// The tray's Quit.
    pub quit: Notify,
}

struct State {
    life: Life,
    clock: IdleClock,
    /// The process whose window is open (shown or hidden).
    running: Option<Running>,
    /// A window's process started ahead of need, GTK up, no window made (see [`Windowed::spare`]).
    spare: Option<Running>,
    /// Counts the processes started, so that the end of an old one is not taken for the new one's.
    started: u64,
}

/// The window's process while it runs.
struct Running {
    number: u64,
    pid: u32,
    to: mpsc::UnboundedSender<ToWindow>,
    visible: bool,
    focused: bool,
    /// Whether the process has told the desk anything about its window (seen, or its page
    /// loaded). Until it has, the window is being started, not hidden: a process slow to start
    /// (a loaded machine) must not be released before its window ever showed.
    heard: bool,
    /// Opened in what was a spare, shown when `Some(true)`, its page not loaded yet: a spare may
    /// have ended just as it was taken, and then the window is opened once more, in a new process.
    from_spare: Option<bool>,
}

impl Running {
    /// Drops the sender: the writer ends, the channel closes, and the window's process with it.
    fn close(&mut self) {
        self.to = mpsc::unbounded_channel().0;
    }

    /// Closes the channel and kills the process.
    fn kill(&mut self) {
        self.close();
        // Still our child, not yet reaped (`ended` forgets it after the reap), so the pid is its
        // own.
        if self.pid > 0 {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
        }
    }
}

impl State {
    /// Window process `number`, the open window's or the spare.
    fn process(&mut self, number: u64) -> Option<&mut Running> {
        let State { running, spare, .. } = self;
        [running, spare]
            .into_iter()
            .flatten()
            .find(|r| r.number == number)
    }
}

impl Windowed {
    /// The desk's window, none yet, released after `release_after` idle.
    pub fn new(desk: Arc<Desk>, release_after: Duration) -> Arc<Windowed> {
        let program = std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.join("countersign-desk")));
        Arc::new(Windowed {
            desk,
            program,
            state: Mutex::new(State {
                life: Life::Released,
                clock: IdleClock::new(release_after),
                running: None,
                spare: None,
                started: 0,
            }),
            tray: Mutex::new(None),
            quit: Notify::new(),
        })
    }

    /// Sends `event` to the page, when a window runs.
    pub fn emit(&self, event: &str, payload: Value) {
        self.send(ToWindow::Emit {
            event: event.to_owned(),
            payload,
        });
    }

    fn send(&self, message: ToWindow) {
        if let Some(running) = &lock(&self.state).running {
            let _ = running.to.send(message);
        }
    }

    /// The window was just shown or regained focus, or its page loaded: the engine accepts no
    /// approve until the approve delay has passed again, and the page disables Approve for as
    /// long. The engine holds first, so the page's own wait always ends after the engine's.
    pub fn hold_approvals(&self) {
        self.desk.engine.hold_approvals();
        self.emit("approvals://held", Value::Null);
    }

    /// Brings the window forward (starting its process when there is none); the engine holds
    /// approvals for the delay first.
    pub fn show(self: &Arc<Self>) {
        self.hold_approvals();
        self.want(true);
    }

    /// The window is wanted: shown, or only there with the queue loaded.
    pub fn want(self: &Arc<Self>, show: bool) {
        let mut state = lock(&self.state);
        let (life, act) = state.life.wanted(show);
        state.life = life;
        tracing::debug!(target: "desk", ?life, ?act, "window wanted");
        self.act_on(&mut state, act);
    }

    /// The queue changed: the idle wait starts over.
    pub fn touch(&self) {
        lock(&self.state).clock.touch();
    }

    fn act_on(self: &Arc<Self>, state: &mut State, act: Act) {
        match act {
            Act::Nothing => {}
            Act::Show => {
                if let Some(running) = &state.running {
                    let _ = running.to.send(ToWindow::Show {});
                }
            }
            // Closing the channel ends the process; `ended` follows when it has.
            Act::Destroy => {
                if let Some(running) = &mut state.running {
                    tracing::info!(target: "desk", "window idle: ending its process");
                    running.close();
                }
            }
            Act::Create(show) => {
                if let Err(e) = self.start(state, show) {
                    // The next request or Show tries again.
                    tracing::error!(target: "desk", "could not start the window: {e}");
                    state.life = Life::Released;
                }
            }
        }
    }

    /// Opens the window, shown when `show`, in the spare process when there is one, else in a
    /// new one.
    fn start(self: &Arc<Self>, state: &mut State, show: bool) -> std::io::Result<()> {
        let running = match state.spare.take() {
            Some(spare) => Running {
                from_spare: Some(show),
                heard: false,
                ..spare
            },
            None => self.spawn(state)?,
        };
        let _ = running.to.send(ToWindow::Open {});
        if show {
            let _ = running.to.send(ToWindow::Show {});
        }
        let _ = running.to.send(ToWindow::Title {
            title: self.title(),
        });
        tracing::info!(target: "desk", shown = show, pid = running.pid, "window opened");
        state.running = Some(running);
        Ok(())
    }

    /// Starts a spare window's process, when there is none: the next window opens in it, without
    /// waiting for a process to start and GTK to come up (about half of the time a request takes
    /// to show from a released window). It makes no window and no web view until told, so it
    /// costs a fraction of a window. A spare that ends by itself is not replaced until a window
    /// has been opened and released again, so a display that is gone costs one start, not a loop.
    fn spare(self: &Arc<Self>, state: &mut State) {
        if state.spare.is_some() {
            return;
        }
        match self.spawn(state) {
            Ok(spare) => {
                tracing::debug!(target: "desk", pid = spare.pid, "spare window process started");
                let _ = spare.to.send(ToWindow::Rest {});
                state.spare = Some(spare);
            }
            Err(e) => tracing::warn!(target: "desk", "could not start a spare window process: {e}"),
        }
    }

    /// Starts a window's process with its end of a new channel; it makes no window until told.
    fn spawn(self: &Arc<Self>, state: &mut State) -> std::io::Result<Running> {
        use std::os::unix::process::CommandExt;

        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        let theirs = OwnedFd::from(theirs);
        let fd = theirs.as_raw_fd();
        let program = self.program.as_ref().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "cannot tell where this program is, so not where the window's is",
            )
        })?;
        let mut command = std::process::Command::new(program);
        command.arg(WINDOW_FLAG).stdin(std::process::Stdio::null());
        // SAFETY: between fork and exec only async-signal-safe calls: dup2 (which also clears
        // close-on-exec on the copy) and fcntl.
        unsafe {
            command.pre_exec(move || {
                if fd == CHANNEL_FD {
                    let flags = libc::fcntl(fd, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if libc::dup2(fd, CHANNEL_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = tokio::process::Command::from(command).spawn()?;
        drop(theirs);
        ours.set_nonblocking(true)?;
        let stream = tokio::net::UnixStream::from_std(ours)?;
        let (reader, mut writer) = stream.into_split();
        let (to, mut outbox) = mpsc::unbounded_channel::<ToWindow>();
        state.started += 1;
        let number = state.started;
        let running = Running {
            number,
            pid: child.id().unwrap_or(0),
            to,
            visible: false,
            focused: false,
            heard: false,
            from_spare: None,
        };
        tracing::info!(target: "desk", pid = running.pid, "window's process started");
        tokio::spawn(async move {
            while let Some(message) = outbox.recv().await {
                if writer.write_all(&channel::line(&message)).await.is_err() {
                    break;
                }
            }
            // The sender was dropped (release, or the desk ending): the window's process sees
            // the channel close and ends.
            let _ = writer.shutdown().await;
        });
        let me = self.clone();
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(reader);
            let mut line = Vec::new();
            loop {
                match channel::read::<FromWindow, _>(&mut reader, &mut line).await {
                    Ok(message) => me.heard(number, message),
                    Err(channel::ChannelError::Malformed(e)) => {
                        tracing::warn!(target: "desk", "the window sent something else: {e}");
                        break;
                    }
                    Err(_) => break,
                }
            }
            // It stops talking: it is ended, at once or after a grace.
            me.end(number);
        });
        let me = self.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            tracing::info!(target: "desk", ?status, "window's process ended");
            me.ended(number);
        });
        Ok(running)
    }

    /// Closes window `number`'s channel, and kills its process if it has not ended within
    /// [`END_WITHIN`].
    fn end(self: &Arc<Self>, number: u64) {
        {
            let mut state = lock(&self.state);
            match state.process(number) {
                Some(running) => running.close(),
                None => return,
            }
        }
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(END_WITHIN).await;
            let mut state = lock(&me.state);
            if let Some(running) = state.process(number) {
                tracing::warn!(target: "desk", "a window's process did not end: killing it");
                running.kill();
            }
        });
    }

    /// Ends the window's processes now (the desk is stopping). WebKit's processes end when
    /// their parent does.
    pub fn kill_window(&self) {
        let mut state = lock(&self.state);
        let State { running, spare, .. } = &mut *state;
        for process in [running, spare].into_iter().flatten() {
            process.kill();
        }
    }

    /// Window `number`'s process has ended.
    fn ended(self: &Arc<Self>, number: u64) {
        let mut state = lock(&self.state);
        if state.spare.as_ref().is_some_and(|s| s.number == number) {
            // Not replaced until the next release (see `spare`).
            tracing::info!(target: "desk", "the spare window process ended");
            state.spare = None;
            return;
        }
        let Some(gone) = state.running.take_if(|r| r.number == number) else {
            return;
        };
        if let (Some(show), Life::Live) = (gone.from_spare, state.life) {
            // The spare ended as it was taken (its end not yet seen): once more, in a new one.
            tracing::warn!(target: "desk", "the spare window process was gone: starting another");
            let act = Act::Create(show);
            self.act_on(&mut state, act);
            return;
        }
        let released = matches!(state.life, Life::Releasing { .. });
        let (life, act) = state.life.destroyed();
        state.life = life;
        self.act_on(&mut state, act);
        // Released by the desk, with nothing asked for since: the next window opens in a spare.
        // (A window that ended by itself, crashed or its display gone, gets none.)
        if released && state.life == Life::Released {
            self.spare(&mut state);
        }
    }

    /// A message from window `number`.
    fn heard(self: &Arc<Self>, number: u64, message: FromWindow) {
        let spare = {
            let state = lock(&self.state);
            state.spare.as_ref().is_some_and(|s| s.number == number)
        };
        if spare {
            // A spare has no window and no page: it has nothing to say.
            tracing::warn!(target: "desk", "the spare window process spoke: ending it");
            self.end(number);
            return;
        }
        match message {
            FromWindow::Invoke { id, command, args } => {
                let me = self.clone();
                tokio::spawn(async move {
                    let (name, answer) = match Command::parse(&command, args) {
                        Ok(command) => {
                            (command.name(), commands::run(&me.desk, &me, command).await)
                        }
                        Err(e) => ("(unknown)", Err(e)),
                    };
                    // The command's name only (one of ours, or not): its arguments may carry
                    // what a person typed.
                    tracing::debug!(target: "desk::page", command = name, ok = answer.is_ok(), "answered");
                    let answer = match answer {
                        Ok(ok) => ToWindow::Answer { id, ok, err: None },
                        Err(e) => ToWindow::Answer {
                            id,
                            ok: Value::Null,
                            err: Some(serde_json::to_value(e).unwrap_or(Value::Null)),
                        },
                    };
                    let state = lock(&me.state);
                    if let Some(running) = state.running.as_ref().filter(|r| r.number == number) {
                        let _ = running.to.send(answer);
                    }
                });
            }
            FromWindow::Seen { visible, focused } => {
                let hold = {
                    let mut state = lock(&self.state);
                    let Some(running) = state.running.as_mut().filter(|r| r.number == number)
                    else {
                        return;
                    };
                    tracing::debug!(target: "desk::page", visible, focused, "seen");
                    let hold = (focused && !running.focused) || (visible && !running.visible);
                    running.visible = visible;
                    running.focused = focused;
                    running.heard = true;
                    hold
                };
                if hold {
                    self.hold_approvals();
                }
            }
            // A page that has loaded (a new window's, too) holds approvals: the delay runs from
            // when the request can be on screen.
            FromWindow::Loaded {} => {
                tracing::debug!(target: "desk::page", "loaded");
                // A window now, whatever it was started as (see `Running::from_spare`).
                if let Some(running) = lock(&self.state).process(number) {
                    running.from_spare = None;
                    running.heard = true;
                }
                self.hold_approvals();
            }
        }
    }

    /// One look at the window: ended once hidden with nothing pending for the release delay.
    fn look(self: &Arc<Self>) {
        let pending = self.desk.pending().len();
        let mut state = lock(&self.state);
        let seen = match &state.running {
            None => Seen::Absent,
            Some(r) if !r.heard => Seen::Absent,
            Some(r) if r.visible => Seen::Shown,
            Some(_) => Seen::Hidden,
        };
        if !state.clock.should_release(Instant::now(), seen, pending) {
            return;
        }
        let (life, act) = state.life.release();
        state.life = life;
        self.act_on(&mut state, act);
    }

    /// "Countersign", with the count of waiting requests when there are any.
    fn title(&self) -> String {
        match self.desk.pending().len() {
            0 => "Countersign".to_owned(),
            n => format!("Countersign ({n} pending)"),
        }
    }

    /// The window's title and the tray's say how many requests wait.
    fn update_count(&self) {
        let title = self.title();
        self.send(ToWindow::Title {
            title: title.clone(),
        });
        let tray = lock(&self.tray).clone();
        if let Some(tray) = tray {
            tokio::spawn(async move {
                tray.update(|t| t.title = title).await;
            });
        }
    }

    /// Sends the whole queue to the page (it is small), and updates the counts.
    fn publish_queue(&self) {
        let views: Vec<view::RequestView> = self
            .desk
            .pending()
            .iter()
            .map(view::RequestView::from)
            .collect();
        self.emit(
            "queue://changed",
            serde_json::to_value(&views).unwrap_or(Value::Null),
        );
        self.update_count();
    }

    /// A desktop notification for new requests (the newest, and how many more came with it),
    /// when the window is not on screen with the focus.
    fn notify_if_unseen(&self, request: &PendingRequest, more: usize) {
        let seen = matches!(&lock(&self.state).running, Some(r) if r.visible && r.focused);
        if seen {
            return;
        }
        // Freedesktop notification servers may render the body as markup.
        let mut body = view::notification_body(request, true);
        if more > 0 {
            body.push_str(&format!(" (and {more} more)"));
        }
        tokio::task::spawn_blocking(move || {
            if let Err(e) = notify_rust::Notification::new()
                .summary("Countersign: approval needed")
                .body(&body)
                .appname("Countersign")
                .show()
            {
                tracing::debug!(target: "desk", "no desktop notification: {e}");
            }
        });
    }

    /// A request URL asked for request `id`: approvals are held first (the engine's delay starts
    /// again), then the page is told to take it and select it.
    fn asked(self: &Arc<Self>, id: u64) {
        tracing::info!(target: "desk", request = id, "a request URL was opened");
        self.hold_approvals();
        *lock(&self.desk.wanted) = Some(id);
        self.emit("queue://focus", Value::Null);
    }
}

/// The desk with a display, until SIGTERM, SIGINT or the tray's Quit: the tray, the idle watch,
/// the queue loop, and the window at start unless the desk started in the tray (`in_tray`, by a
/// gateway, for an agent, with nothing to decide: the first request brings it) and no URL asks
/// for one. Ends the upstreams and the window before returning.
pub fn run(desk: Desk, in_tray: bool, release_after: Duration, rt: &tokio::runtime::Handle) {
    let _entered = rt.enter();
    let desk = Arc::new(desk);
    let windowed = Windowed::new(desk.clone(), release_after);
    rt.block_on(async {
        let tray = Tray {
            title: windowed.title(),
            windowed: Arc::downgrade(&windowed),
            rt: rt.clone(),
        };
        match ksni::TrayMethods::spawn(tray).await {
            Ok(handle) => *lock(&windowed.tray) = Some(handle),
            Err(e) => tracing::info!(target: "desk", "no tray icon: {e}"),
        }
    });
    // The idle watch.
    let watching = windowed.clone();
    rt.spawn(async move {
        let every = lock(&watching.state).clock.look_every();
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            watching.look();
        }
    });
    // Whether the keychain still answers, now and then: the banner follows it.
    let asking = windowed.clone();
    rt.spawn(async move {
        let mut every = tokio::time::interval(crate::desk::KEYCHAIN_CHECK_EVERY);
        loop {
            every.tick().await;
            commands::queue::check_keychain(&asking.desk, &asking).await;
        }
    });
    // Queue changes reach the page as events: it never polls. The socket serves before this
    // runs, so a request may be waiting already (queued before the subscription, it brings no
    // event): then the window comes for it.
    let changes = desk.engine.subscribe();
    let windowed_now = !in_tray || lock(&desk.wanted).is_some() || !desk.pending().is_empty();
    if windowed_now {
        windowed.want(true);
    } else {
        // In the tray: the first request's window opens in a spare.
        windowed.spare(&mut lock(&windowed.state));
    }
    tracing::info!(target: "desk", in_tray = !windowed_now, "ready");
    rt.spawn(queue_loop(windowed.clone(), changes));
    rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            windowed.quit.notified().await;
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
            _ = windowed.quit.notified() => {}
        }
    });
    tracing::info!(target: "desk", "stopping");
    windowed.kill_window();
    desk.served.children().kill_all();
    if let Some(agents) = &desk.agents {
        agents.children().kill_all();
    }
}

/// Turns queue changes into page updates, window raises and notifications. Changes that arrive
/// together go out as one update, and raising the window or notifying is paced (`pace`), so a
/// flood of requests cannot turn into a flood of interruptions.
async fn queue_loop(
    windowed: Arc<Windowed>,
    mut changes: tokio::sync::broadcast::Receiver<QueueChange>,
) {
    use tokio::sync::broadcast::error::RecvError;
    let mut interruptions = pace::Interruptions::default();
    'changes: loop {
        let mut batch = pace::Batch::default();
        let mut newest = None;
        let mut absorb = |change: QueueChange, batch: &mut pace::Batch| match change {
            QueueChange::Added { request } => {
                batch.added += 1;
                newest = Some(request);
            }
            QueueChange::Focus { request } => {
                batch.focus = true;
                if let Some(id) = request {
                    windowed.asked(id);
                }
            }
            QueueChange::Removed { .. } | QueueChange::Updated { .. } => {}
        };
        match changes.recv().await {
            Ok(change) => absorb(change, &mut batch),
            // Missed some changes: the whole queue is sent anyway.
            Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => break,
        }
        // The first change goes out at once (a person deciding one request sees the next
        // without delay); whatever follows within `GATHER` goes out together.
        windowed.publish_queue();
        windowed.touch();
        if batch.added > 0 {
            // A released window starts coming back at once, hidden until the raise below shows
            // it (when the pace allows one).
            windowed.want(false);
        }
        let until = tokio::time::Instant::now() + pace::GATHER;
        let mut more = false;
        loop {
            match tokio::time::timeout_at(until, changes.recv()).await {
                Ok(Ok(change)) => {
                    absorb(change, &mut batch);
                    more = true;
                }
                Ok(Err(RecvError::Lagged(_))) => more = true,
                Ok(Err(RecvError::Closed)) => break 'changes,
                Err(_) => break,
            }
        }
        if more {
            windowed.publish_queue();
        }
        let actions = interruptions.decide(&batch, std::time::Instant::now());
        if let (Some(added), Some(request)) = (actions.notify, &newest) {
            windowed.notify_if_unseen(request, added.saturating_sub(1));
        }
        if actions.raise {
            windowed.show();
        } else if batch.added > 0 {
            // Released while idle: the window comes back, loaded, for the tray.
            windowed.want(false);
        }
    }
}
