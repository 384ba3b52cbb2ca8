//! Who an upstream is, as the desk names it: never the gateway's word.
//!
//! The desk establishes each connection's upstream itself (a server registered in it, its
//! built-in tools on a file, a URL it connects to, or an ad-hoc command line it runs) and keys
//! policy, pins, grants and history by that name. It is a value of its own, not a string with a
//! prefix to parse back: whoever needs to know what kind of upstream it is matches on the enum;
//! [`ServerId::key`] is only the spelling records and policy files keep.

use std::fmt;
use std::path::PathBuf;

/// An upstream, as the desk identifies it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ServerId {
    /// A server registered in the desk, by its name.
    Registered(String),
    /// The built-in SQLite tools on the file at this absolute path.
    Builtin(PathBuf),
    /// An upstream the desk connects to at this URL.
    Url(String),
    /// An ad-hoc command line the desk runs, as it quotes it.
    Command(String),
}

impl ServerId {
    /// How policy files, pins, grants and history spell it: `server:NAME`, `builtin:PATH`, the
    /// URL, or the command line. Stable: what was recorded under it keeps its meaning.
    pub fn key(&self) -> String {
        match self {
            ServerId::Registered(name) => format!("server:{name}"),
            ServerId::Builtin(db) => format!("builtin:{}", db.display()),
            ServerId::Url(url) => url.clone(),
            ServerId::Command(line) => line.clone(),
        }
    }
}

impl fmt::Display for ServerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_keeps_the_spelling_records_were_made_under() {
        assert_eq!(ServerId::Registered("gh".into()).key(), "server:gh");
        assert_eq!(
            ServerId::Builtin("/d/app.db".into()).key(),
            "builtin:/d/app.db"
        );
        assert_eq!(ServerId::Url("https://x/mcp".into()).key(), "https://x/mcp");
        assert_eq!(ServerId::Command("npx srv".into()).key(), "npx srv");
    }

    #[test]
    fn a_command_that_looks_like_another_kind_is_still_a_command() {
        // The kind is the desk's to say, never read back from the text.
        let sneaky = ServerId::Command("builtin:/etc/passwd".into());
        assert!(!matches!(sneaky, ServerId::Builtin(_)));
    }
}
