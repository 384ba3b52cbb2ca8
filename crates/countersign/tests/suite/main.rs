//! `countersign` end to end: the real binary as agents start it, against the desk's engine in the test process, real MCP peers and clients.
//!
//! One test binary for the crate, one module per concern: every module links once, and
//! `cargo nextest run -p <crate> -E 'test(/^module::/)'` runs one concern alone.

mod clients;
mod common;
mod describing;
mod faults;
mod gateway;
mod handover;
mod history;
mod next_steps;
mod peers;
mod rounds;
mod router;
mod stopped;
