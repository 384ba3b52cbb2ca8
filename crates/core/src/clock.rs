//! Where time comes from, as a trait: core reads no clock, and neither does any business logic
//! above it. The engine, `serve`, the collector's sender and the desk are each given a [`Clock`]
//! (the system's in production, one that stands still in tests), so one clock rules what a
//! process decides and records.

/// Where the time is read, in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now, in ms since the epoch.
    fn now_ms(&self) -> u64;
}
