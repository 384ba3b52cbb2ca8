//! The secret's tests against the real OS keychain, and without one.
//!
//! One test binary for the crate, one module per concern: every module links once, and
//! `cargo nextest run -p <crate> -E 'test(/^module::/)'` runs one concern alone.

mod keychain;
mod no_keychain;
