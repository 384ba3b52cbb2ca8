//! Where Countersign keeps its files, per user: the desk's SQLite file (ledger, approved
//! arguments, history) and the built-in tools' default database, in the platform's data
//! directory (`~/.local/share/countersign` on Linux).

use std::path::PathBuf;

fn data_dir() -> PathBuf {
    directories::ProjectDirs::from("", "", "countersign")
        .map(|d| d.data_dir().to_owned())
        .unwrap_or_else(|| std::env::temp_dir().join("countersign"))
}

/// The desk's SQLite file.
pub fn desk_db() -> PathBuf {
    data_dir().join("desk.sqlite")
}

/// The built-in tools' default database.
pub fn builtin_db() -> PathBuf {
    data_dir().join("builtin.sqlite")
}
