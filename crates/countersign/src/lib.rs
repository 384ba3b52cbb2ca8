//! The `countersign` command's library half: what its subcommands share, kept out of `main.rs` so
//! that tests can reach it. The binary stays small and never links the GUI toolkit: agents start
//! one gateway per MCP server, so it must start fast and idle light.
#![deny(missing_docs)]

pub mod config;
pub mod launch;
pub mod logging;
pub mod paths;
pub mod pipe;
pub mod registry;
pub mod server;
