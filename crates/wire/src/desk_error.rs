//! Why a conversation with the desk over its socket failed, as the side that opened it sees it:
//! `countersign mcp`, `countersign server` and `countersign install` (and the clients library
//! they share with the desk, whose settings view asks its own registry in the same terms). Each
//! cause is its own variant, so that a caller maps them to exit codes or to a window's codes
//! without reading message text.

/// Why talking to the desk stopped.
#[derive(Debug, thiserror::Error)]
pub enum DeskError {
    /// No desk answers (and starting one did not help).
    #[error("the Countersign desk is not running and could not be started ({0})")]
    Unreachable(String),
    /// No desk answers at a socket chosen by a flag or the environment, where no desk is started.
    #[error("{0}")]
    NoDeskAt(String),
    /// The desk refused the hello.
    #[error("the Countersign desk refused: {message} [{code}]")]
    Refused {
        /// The refusal's code.
        code: &'static str,
        /// Its sentence.
        message: String,
    },
    /// The connection broke.
    #[error("the connection to the Countersign desk was lost: {0}")]
    Lost(String),
}
