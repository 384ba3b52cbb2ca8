//! Where Countersign keeps its files, per account: the desk's SQLite file (ledger, approved
//! arguments, history) and the built-in tools' default database, in the desk's data directory
//! (`~/.local/share/countersign` on Linux, in the home the password database records, or under
//! `$COUNTERSIGN_DESK_DIR`): the place the desk itself uses, found the same way.

use std::path::PathBuf;

use countersign_wire::DeskDirs;

/// The desk's directories; exits with the reason when the account has no home to put them in.
fn dirs() -> DeskDirs {
    DeskDirs::locate().unwrap_or_else(|e| {
        eprintln!("countersign: {e}");
        std::process::exit(2);
    })
}

/// The desk's SQLite file.
pub fn desk_db() -> PathBuf {
    dirs().store()
}

/// The built-in tools' default database.
pub fn builtin_db() -> PathBuf {
    dirs().builtin_db()
}
