//! Reading and rewriting real clients' configuration files, and undoing it.
//!
//! One test binary for the crate, one module per concern: every module links once, and
//! `cargo nextest run -p <crate> -E 'test(/^module::/)'` runs one concern alone.

mod clients;
mod undo;
