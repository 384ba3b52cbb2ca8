//! The desk without its window: its start, its state and everything its window shows, in a crate
//! that links no GUI toolkit.
//!
//! Why apart from the window: WebKit and GTK cost a process tens of megabytes as soon as they
//! are linked, before any window exists (their relocations alone), and a desk spends most of its
//! life with nothing to show. So the desk's authority (the engine, the sockets, the store, the
//! keychain, the schedules) lives here, and two programs run it: the window's (`src-tauri`), and
//! `countersign-authority`, which `countersign-desk` becomes when there is no display to open a
//! window on, so that a desk without one never maps WebKit at all.

pub mod approver;
pub mod channel;
pub mod clients;
pub mod commands;
pub mod desk;
pub mod grants;
pub mod harden;
pub mod idle;
pub mod log_file;
pub mod otlp;
pub mod pace;
pub mod request_url;
pub mod seed;
pub mod servers;
pub mod settings;
pub mod view;
pub mod window;

pub use desk::Desk;
