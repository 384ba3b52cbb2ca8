//! The desk: the authority a person approves in (window, tray, secret, policy, ledger, history).
//!
//! The Tauri application arrives with the desk's own work; until then this binary only says so,
//! so that `countersign desk` has a stable name to launch and the workspace keeps its final shape.

fn main() {
    eprintln!("countersign-desk: the approval window is not built yet; nothing can be approved.");
    std::process::exit(2);
}
