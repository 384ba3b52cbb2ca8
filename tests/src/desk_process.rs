//! A desk started as a plain process (no WebDriver): wait until it listens, find it by its
//! socket, stop it by its pid.

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
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gone(pid) {
        assert!(
            Instant::now() < deadline,
            "process {pid} did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
