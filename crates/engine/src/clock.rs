//! Time, as the engine is given it.
//!
//! The engine decides with time (a token's expiry, the approve delay, when a grant ends, what may
//! be pruned) but never reads the system's clock in its logic: it asks the [`Clock`] in its
//! configuration. The desk and a server pass [`SystemClock`]; tests pass a [`ManualClock`] and
//! move it forward instead of sleeping, so a test of a ten-minute expiry takes no time and cannot
//! flake on a loaded machine.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

pub use countersign_core::clock::Clock;

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that stands still until told to move: for tests. Clones share one time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock that reads `now_ms` until moved.
    pub fn at(now_ms: u64) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(now_ms)),
        }
    }

    /// A clock that starts at the system's time now (so times it gives look like real ones in
    /// history and in the window).
    pub fn starting_now() -> Self {
        Self::at(SystemClock.now_ms())
    }

    /// Moves the clock forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_advanced_and_clones_share_it() {
        let clock = ManualClock::at(1_000);
        let other = clock.clone();
        assert_eq!(clock.now_ms(), 1_000);
        other.advance(250);
        assert_eq!(clock.now_ms(), 1_250);
    }

    #[test]
    fn the_system_clock_reads_a_time_after_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }
}
