//! The core's tests beyond its unit tests: the RFC 8785 and RFC 4231 vectors, and properties over random input.
//!
//! One test binary for the crate, one module per concern: every module links once, and
//! `cargo nextest run -p <crate> -E 'test(/^module::/)'` runs one concern alone.

mod properties;
mod vectors;
