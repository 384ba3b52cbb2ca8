//! Ports of loopback for the processes a test starts and that bind them themselves (tauri-driver
//! and its WebKitWebDriver, a window's inspector, a PostgreSQL, a server started again on the port
//! it had): the test chooses the port, and the child binds it a moment or seconds later.
//!
//! Why not a port the kernel hands out (`bind` to port 0) and then let go: tests run side by side,
//! each in a process of its own, and in that gap the same port could be handed to another test's
//! asking, or taken by another process first. Its child then cannot bind it, and the test waits
//! for a driver that is not there. (A WebDriver session once failed that way: its driver's
//! WebKitWebDriver took no connection for 30 s.)
//!
//! So a port comes from below the kernel's ephemeral range, which neither `bind` to port 0 nor
//! `connect` ever hands out, and is claimed for as long as the claiming process lives: by an
//! exclusive lock on a file named after it, in a folder every test process shares. The kernel
//! drops the lock when the process ends, however it ends, so nothing is left claimed.

use std::fs::File;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Mutex;

/// The claims of this process, held (so locked) until it exits.
static CLAIMED: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// The lowest port handed out here: above the well-known and common service ports.
const LOWEST: u16 = 20_000;

/// A TCP port of loopback that nobody listens on now, and that no other test process is given
/// while this one lives: a process this test starts may bind it later.
pub fn free_port() -> u16 {
    let (low, high) = range();
    let dir = claims_folder();
    let span = u32::from(high - low);
    // Start where another process is unlikely to: its claims start elsewhere.
    let start = std::process::id().wrapping_mul(7919) ^ nanos();
    for step in 0..span {
        let port = low + ((start.wrapping_add(step)) % span) as u16;
        let Ok(file) = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(port.to_string()))
        else {
            continue;
        };
        if file.try_lock().is_err() {
            continue; // Another test process (or this one) has it.
        }
        // Claimed; and nothing else (a service, a process left over) listens on it now.
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            countersign_core::sync::lock(&CLAIMED).push(file);
            return port;
        }
    }
    panic!("no free port of loopback between {low} and {high}");
}

/// The ports handed out: from [`LOWEST`] up to the kernel's ephemeral range.
fn range() -> (u16, u16) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    assert!(
        ephemeral_low > LOWEST + 1_000,
        "the kernel's ephemeral ports start at {ephemeral_low}: too low for the tests' own range"
    );
    (LOWEST, ephemeral_low)
}

/// The folder of claims, shared by every test process of this account.
fn claims_folder() -> PathBuf {
    let dir = std::env::temp_dir().join("countersign-test-ports");
    std::fs::create_dir_all(&dir).expect("the folder of claimed ports");
    dir
}

fn nanos() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_port_is_not_claimed_again_and_is_outside_the_ephemeral_range() {
        let (low, high) = range();
        let ports: Vec<u16> = (0..64).map(|_| free_port()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
        assert!(ports.iter().all(|p| (low..high).contains(p)), "{ports:?}");
    }
}
