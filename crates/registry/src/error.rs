//! What can go wrong in the registry itself, as types rather than strings: the window and the
//! command line say each in its own words, and nobody matches on message text.

use std::path::PathBuf;

use countersign_store::StoreError;

/// A failure of the registry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The desk's records (where what was accepted of each guarded file is kept) could not be
    /// opened, read or written.
    #[error("the desk's records: {0}")]
    Records(#[from] StoreError),
    /// A text of a guarded file is not valid: nothing of it applies.
    #[error("{reason}")]
    Invalid {
        /// The file's name.
        file: &'static str,
        /// What is wrong, naming the file.
        reason: String,
    },
    /// The keychain that holds servers' secrets is unavailable: why.
    #[error("{0}")]
    NoKeychain(String),
    /// A guarded file could not be written.
    #[error("cannot write {}: {source}", .path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What the system reported.
        #[source]
        source: std::io::Error,
    },
}
