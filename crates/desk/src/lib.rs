//! The desk without its window: its start, its state and everything its window shows, in a crate
//! that links no GUI toolkit.
//!
//! Why apart from the window: WebKit and GTK cost a process tens of megabytes as soon as they
//! are linked, before any window exists (their relocations alone), and a desk spends most of its
//! life with nothing to show. So the desk's authority (the engine, the sockets, the store, the
//! keychain, the schedules) lives here, and two programs run it: the window's (`src-tauri`), and
//! `countersign-headless-desk`, which `countersign-desk` becomes when there is no display to open
//! a window on, so that a desk without one never maps WebKit at all.
//!
//! Its rooms:
//! - [`start`]: hardening, the one-shot subcommands, the request URL, the log, and the order in
//!   which the desk comes up;
//! - [`desk`]: the state the commands share;
//! - [`window`]: the window's process and its channel, the idle release, the pace of
//!   interruptions, the tray;
//! - [`commands`]: the page's commands, one typed enum, by domain (queue, grants, history,
//!   settings, servers, clients);
//! - [`view`]: what the page is sent, and the escaping and flags every outside string passes
//!   through;
//! - [`ui_code`]: the error codes the page branches on;
//! - [`approver`]: this desk as an approver of team servers;
//! - [`settings`], [`seed`] (the desk's keys in the keychain) and [`otlp`] (confirm events sent
//!   to a collector).

pub mod approver;
pub mod commands;
pub mod desk;
pub mod otlp;
pub mod seed;
pub mod settings;
pub mod start;
pub mod ui_code;
pub mod view;
pub mod window;

pub use desk::Desk;
