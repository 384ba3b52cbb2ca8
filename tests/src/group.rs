//! A process a test starts, and everything it starts in turn, ended with the test: when the test
//! ends, fails or panics (the guard's drop), and, for the process itself, when the test's process
//! dies.
//!
//! The process leads a process group of its own (`setpgid`), which every program it starts joins
//! unless it leaves on purpose; dropping the guard sends the whole group SIGKILL and waits until
//! nothing of it runs. That is what ends a desk WebKitWebDriver started: killing the driver alone
//! left its desk running, a child of nobody. The leader also gets SIGKILL from the kernel when
//! the thread that started it ends (`PR_SET_PDEATHSIG`), so a test process killed outright (a
//! timeout) does not leave it behind either; what the leader started is still in the group, and
//! the next run's guards cannot reach it, which is why the drop is the main path.
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

use std::os::fd::FromRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A running process group this test started; ended, whole, on drop.
#[derive(Debug)]
pub struct Group {
    leader: Child,
    ended: bool,
}

impl Group {
    /// Starts `cmd` as the leader of a new process group. Start it from the thread that drops the
    /// guard: the leader's death signal follows the thread that started it.
    pub fn spawn(cmd: &mut Command) -> std::io::Result<Group> {
        cmd.process_group(0);
        // SAFETY: between fork and exec only prctl, which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(Group {
            leader: cmd.spawn()?,
            ended: false,
        })
    }

    /// The leader's pid, which is also the group's id.
    pub fn id(&self) -> u32 {
        self.leader.id()
    }

    /// The leader, for its stdio and its exit status.
    pub fn leader(&mut self) -> &mut Child {
        &mut self.leader
    }

    /// Every process of the group that still runs (zombies not counted).
    pub fn members(&self) -> Vec<u32> {
        members_of(self.id())
    }

    /// Sends the whole group SIGKILL, reaps the leader, and waits (up to 10 s) until no process
    /// of the group runs. Panics if one still does then, unless it is already panicking.
    pub fn end(&mut self) {
        if self.ended {
            return;
        }
        self.ended = true;
        let group = self.id();
        // SAFETY: killpg only sends a signal, to the group this guard started.
        unsafe { libc::killpg(group as i32, libc::SIGKILL) };
        let _ = self.leader.kill();
        let _ = self.leader.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = members_of(group);
            if left.is_empty() {
                return;
            }
            if Instant::now() > deadline {
                if !std::thread::panicking() {
                    panic!("processes of group {group} outlived SIGKILL: {left:?}");
                }
                return;
            }
            // Anything the group started since the first signal gets one too.
            // SAFETY: as above.
            unsafe { libc::killpg(group as i32, libc::SIGKILL) };
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.end();
    }
}

/// The processes of process group `group` that still run (zombies, which run nothing and wait
/// for their parent to reap them, not counted).
pub fn members_of(group: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            stat_of(pid).is_some_and(|(state, pgrp)| pgrp == group && state != 'Z' && state != 'X')
        })
        .collect()
}

/// The processes that still run with `name=value` in their environment (as far as this process
/// may read environments: all of them as root). A variable with a value unique to one test (its
/// own directory) finds what it started wherever it went, a daemon that left every group too.
pub fn carrying(name: &str, value: &str) -> Vec<u32> {
    let wanted = format!("{name}={value}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                env.split(|b| *b == 0)
                    .any(|entry| entry == wanted.as_bytes())
            }) && runs(pid)
        })
        .collect()
}

/// Waits until process `pid` exits (any process of this account, not only a child of ours): on
/// the kernel's word through a pidfd, which becomes readable when the process ends, never by
/// polling. A process already gone returns at once.
pub async fn exited(pid: u32) {
    let Some(fd) = pidfd(pid) else {
        return; // no such process: it has exited already
    };
    // SAFETY: the AsyncFd owns `fd`, which stays open and the same descriptor until it drops.
    let fd = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    }
    .map_err(|e| e.to_string())
    .expect("a pidfd registers with the runtime");
    let _ = fd.readable().await;
}

/// Whether process `pid` exits within `limit` (at once when it is gone already): [`exited`] for
/// code that blocks, waiting in `poll(2)` on the pidfd, never by polling the process table.
pub fn exits_within(pid: u32, limit: Duration) -> bool {
    let Some(fd) = pidfd(pid) else {
        return true; // no such process: it has exited already
    };
    let deadline = Instant::now() + limit;
    loop {
        let mut wanted = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&fd),
            events: libc::POLLIN,
            revents: 0,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one pollfd, valid for the call; poll writes only its `revents`.
        match unsafe { libc::poll(&mut wanted, 1, ms) } {
            0 => return false,
            n if n > 0 => return true,
            // A signal (another test's child ending: SIGCHLD) interrupted the wait: wait on for
            // what is left of the limit.
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => panic!("poll on a pidfd: {}", std::io::Error::last_os_error()),
        }
    }
}

/// A pidfd for `pid`, or `None` when there is no such process (it has exited and been reaped).
/// Any other failure (no pidfd support, no descriptors left) panics rather than passing for an
/// exit.
fn pidfd(pid: u32) -> Option<std::os::fd::OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; nothing of
    // ours is read or written.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        let error = std::io::Error::last_os_error();
        assert_eq!(
            error.raw_os_error(),
            Some(libc::ESRCH),
            "pidfd_open({pid}): {error}"
        );
        return None;
    }
    // SAFETY: `fd` was just returned by pidfd_open and is owned by nothing else.
    Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as std::os::fd::RawFd) })
}

/// Whether process `pid` still runs (it exists and is not a zombie).
pub fn runs(pid: u32) -> bool {
    stat_of(pid).is_some_and(|(state, _)| state != 'Z' && state != 'X')
}

/// A process's state and process group, from `/proc/PID/stat` (its name, in parentheses, may
/// hold spaces and parentheses: the fields start after the last `)`).
fn stat_of(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}

/// A D-Bus session bus of the test's own, in a group that ends with it. A program with a display
/// that finds no session bus (GTK, GIO, WebKit) starts one through `dbus-launch`, and that bus
/// daemon leaves its parent's session, so no group reaches it: it ran on after the test, one
/// more per desk. Given this bus's address, the program starts none, and what the bus starts in
/// turn (the accessibility bus) stays in its group.
#[derive(Debug)]
pub struct SessionBus {
    group: Group,
    address: String,
    _dir: tempfile::TempDir,
}

impl SessionBus {
    /// The bus a program this test starts should use: `None` when the test runs under one
    /// already (`DBUS_SESSION_BUS_ADDRESS`, e.g. the keychain's), which the program then uses.
    pub fn unless_given() -> Option<SessionBus> {
        std::env::var_os("DBUS_SESSION_BUS_ADDRESS")
            .is_none()
            .then(SessionBus::start)
    }

    /// Starts one, returning once it listens.
    pub fn start() -> SessionBus {
        use std::io::BufRead;
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new("dbus-daemon");
        cmd.args(["--session", "--nofork", "--print-address=1"])
            .arg(format!(
                "--address=unix:path={}",
                dir.path().join("bus").display()
            ))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        let mut group = Group::spawn(&mut cmd).expect("dbus-daemon");
        let mut address = String::new();
        std::io::BufReader::new(group.leader().stdout.take().unwrap())
            .read_line(&mut address)
            .unwrap();
        let address = address.trim().to_owned();
        assert!(!address.is_empty(), "dbus-daemon printed no address");
        SessionBus {
            group,
            address,
            _dir: dir,
        }
    }

    /// Its address, for `DBUS_SESSION_BUS_ADDRESS`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Its process group's id.
    pub fn id(&self) -> u32 {
        self.group.id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shell in a group of its own that starts two sleeps, prints their pids and waits.
    fn shell_with_grandchildren() -> (Group, Vec<u32>) {
        use std::io::BufRead;
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 300 & echo $!; sleep 300 & echo $!; wait"])
            .stdout(std::process::Stdio::piped());
        let mut group = Group::spawn(&mut cmd).unwrap();
        let out = group.leader().stdout.take().unwrap();
        let pids: Vec<u32> = std::io::BufReader::new(out)
            .lines()
            .take(2)
            .map(|l| l.unwrap().trim().parse().unwrap())
            .collect();
        (group, pids)
    }

    #[test]
    fn what_a_grouped_process_started_ends_when_the_guard_drops_in_a_panic() {
        let (group, pids) = shell_with_grandchildren();
        let leader = group.id();
        assert!(pids.iter().all(|&p| runs(p)), "{pids:?}");
        let mut members = group.members();
        members.sort_unstable();
        let mut expected = vec![leader, pids[0], pids[1]];
        expected.sort_unstable();
        assert_eq!(members, expected);
        let failed = std::thread::spawn(move || {
            let _group = group;
            panic!("the test failed");
        })
        .join();
        assert!(failed.is_err());
        for pid in [leader, pids[0], pids[1]] {
            assert!(!runs(pid), "{pid} still runs");
        }
        assert!(members_of(leader).is_empty());
    }

    #[test]
    fn a_grouped_process_dies_with_the_thread_that_started_it() {
        let (leader, children) = std::thread::spawn(|| {
            let (group, pids) = shell_with_grandchildren();
            let leader = group.id();
            // Not dropped: only the kernel's death signal can end the leader now.
            std::mem::forget(group);
            (leader, pids)
        })
        .join()
        .unwrap();
        assert!(
            exits_within(leader, Duration::from_secs(10)),
            "the leader outlived its thread"
        );
        // Its own children are still in its group: end them here, as a guard would.
        // SAFETY: the group this test started.
        unsafe { libc::killpg(leader as i32, libc::SIGKILL) };
        for &child in &children {
            assert!(exits_within(child, Duration::from_secs(10)), "{children:?}");
        }
    }

    #[tokio::test]
    async fn exited_wakes_when_a_process_that_is_not_our_child_ends_and_at_once_for_one_gone() {
        // A grandchild: `sh` starts `sleep` in the background, says its pid and exits, so the
        // sleeper is nobody's child of ours (init adopts it).
        let out = Command::new("sh")
            .args(["-c", "sleep 0.3 >/dev/null 2>&1 & echo $!"])
            .output()
            .unwrap();
        let pid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert!(runs(pid));
        tokio::time::timeout(Duration::from_secs(10), exited(pid))
            .await
            .expect("the exit was seen");
        assert!(!runs(pid));
        // Gone already: no wait at all.
        tokio::time::timeout(Duration::from_millis(500), exited(pid))
            .await
            .expect("a process already gone returns at once");
    }
}
