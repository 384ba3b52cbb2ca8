//! The `countersign` command's library half: what its subcommands share, kept out of `main.rs` so
//! that tests can reach it. The pipe (`countersign mcp`) and the desk's launcher are the crate
//! `countersign-pipe`, which links our `wire` alone. The binary stays small and never links the GUI toolkit, MCP code or the
//! store's writer: agents start one gateway per MCP server, so it must start fast and idle light,
//! and taking one over must gain nothing. The demo, an MCP client, is a program of its own
//! (`countersign-demo`); the clients' files are read and rewritten by `countersign-clients`, which
//! the desk uses too.

pub mod clients;
pub mod config;
pub mod export;
pub mod logging;
pub mod paths;
pub mod policy;
pub mod registry;
pub mod server;
pub mod verify;
