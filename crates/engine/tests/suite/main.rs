//! The engine's tests, driven as the window and a gateway drive it, on real SQLite files.
//!
//! One test binary for the crate, one module per concern: every module links once, and
//! `cargo nextest run -p <crate> -E 'test(/^module::/)'` runs one concern alone.

mod changes;
mod describing;
mod grants;
mod outage;
mod previews;
mod queue;
mod rounds;
mod rules;
mod stopped;
