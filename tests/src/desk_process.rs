//! A desk started as a plain process (no WebDriver): wait until it listens, find it by its
//! socket, stop it by its pid.
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

use std::path::Path;
use std::time::{Duration, Instant};

/// Waits (up to 20 s) until something accepts connections on `socket`.
pub async fn wait_for_socket(socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::UnixStream::connect(socket).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the desk did not listen at {}",
            socket.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The pid of the process answering on `socket` (the kernel's word).
pub async fn pid_at(socket: &Path) -> i32 {
    let stream = tokio::net::UnixStream::connect(socket).await.unwrap();
    stream.peer_cred().unwrap().pid().unwrap()
}

/// Whether `pid` is gone (or a zombie nobody reaped yet).
pub fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.contains(") Z "),
        Err(_) => true,
    }
}

/// Sends SIGTERM to `pid` and waits (up to 10 s) until it has exited.
pub fn terminate(pid: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    assert!(
        crate::group::exits_within(pid as u32, Duration::from_secs(10)),
        "process {pid} did not stop on SIGTERM"
    );
}

/// `desk_child SOCKET DB --approve` (the desk's engine and sessions without the window,
/// approving each request through `Engine::approve`) in a process of its own.
pub struct DeskChild {
    child: tokio::process::Child,
    /// Its pid.
    pub pid: u32,
}

impl DeskChild {
    /// Starts it and waits (up to 20 s) until it says it listens.
    pub async fn start(socket: &Path, db: &Path) -> DeskChild {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(crate::window::bin("desk_child"))
            .arg(socket)
            .arg(db)
            .arg("--approve")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("desk_child starts");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("the desk child did not start within 20 s")
            .unwrap();
        assert_eq!(ready.as_deref(), Some("READY"));
        let pid = child.id().unwrap();
        DeskChild { child, pid }
    }

    /// Kills it with SIGKILL, as a crash would, and reaps it.
    pub async fn killed(mut self) {
        // SAFETY: a signal to our own child.
        unsafe {
            libc::kill(self.pid as i32, libc::SIGKILL);
        }
        let _ = self.child.wait().await;
    }

    /// Closes its stdin, which ends it cleanly; kills it if it has not ended within 10 s.
    pub async fn stop(mut self) {
        drop(self.child.stdin.take());
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}
