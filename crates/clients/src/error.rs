//! Why a client's file could not be read, rewritten or put back, as types install and uninstall
//! (and the desk's Settings → Clients) act on without reading strings.
//!
//! None of them holds the file's text: a client's file holds credentials, so a message quoting
//! it could quote a secret. Where a parser's own error renders the text (`toml_edit` quotes the
//! line, the YAML parser may), only its message and its place are kept, not the error itself.

use crate::EntryAt;
use crate::table::Format;

/// Why a text does not read as a client's file of its format.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    /// The file is not UTF-8 text.
    #[error("it is not UTF-8 (at byte {})", .0.valid_up_to())]
    NotUtf8(#[source] std::str::Utf8Error),
    /// JSON (with the comments and trailing commas some clients accept) that does not parse: what
    /// is wrong and where (the parser's error names no text).
    #[error("{} (line {}, column {})", .0.kind(), .0.line_display(), .0.column_display())]
    Json(#[source] jsonc_parser::errors::ParseError),
    /// TOML that does not parse: the parser's message and the line (its own rendering quotes the
    /// line, which could hold a secret, so it is not kept).
    #[error("{why}{}", on_line(.line))]
    Toml {
        /// What is wrong.
        why: String,
        /// The line, from 1, when the parser says where.
        line: Option<usize>,
    },
    /// YAML that does not parse: the line only (the parser's message may quote the text).
    #[error("it is not YAML that Countersign can read (line {line})")]
    Yaml {
        /// The line, from 1.
        line: usize,
    },
    /// A YAML file larger than any client's configuration: its tree would take seconds to build.
    #[error(
        "it is larger than {} KiB, more than any client's configuration, so it is not edited",
        .limit >> 10
    )]
    YamlTooLarge {
        /// The most bytes read, in bytes.
        limit: usize,
    },
    /// A YAML line indented with a tab: YAML forbids it, and an entry rewritten beside it would
    /// be indented differently from its neighbours.
    #[error("line {line} is indented with a tab, which YAML does not allow, so it is not edited")]
    YamlTab {
        /// The line, from 1.
        line: usize,
    },
    /// YAML that the reader would not give back byte for byte, so an edit could change more than
    /// the entry.
    #[error(
        "Countersign's YAML reader would not keep this file byte for byte, so it is not edited"
    )]
    YamlNotKept,
    /// A YAML file of more than one document: a client reads a file of one.
    #[error("it holds {documents} YAML documents, and a client reads a file of one")]
    YamlDocuments {
        /// How many documents it holds.
        documents: usize,
    },
}

/// " (line N)" when the line is known.
fn on_line(line: &Option<usize>) -> String {
    line.map(|line| format!(" (line {line})"))
        .unwrap_or_default()
}

impl ParseError {
    /// The format the text was read as (`None`: it is not text at all).
    pub fn format(&self) -> Option<Format> {
        match self {
            ParseError::NotUtf8(_) => None,
            ParseError::Json(_) => Some(Format::Json),
            ParseError::Toml { .. } => Some(Format::Toml),
            ParseError::Yaml { .. }
            | ParseError::YamlTooLarge { .. }
            | ParseError::YamlTab { .. }
            | ParseError::YamlNotKept
            | ParseError::YamlDocuments { .. } => Some(Format::Yaml),
        }
    }
}

/// Why install could not read or rewrite a client's file; the file was left as it was.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EditError {
    /// The file does not read as its format.
    #[error("{0}")]
    Parse(#[from] ParseError),
    /// The entry to rewrite is no longer in the file.
    #[error("the entry {at} is gone from the file")]
    Gone {
        /// The entry.
        at: EntryAt,
    },
    /// The entry to rewrite is not a mapping (YAML).
    #[error("the entry {at} is not a mapping")]
    NotAMapping {
        /// The entry.
        at: EntryAt,
    },
    /// Rewriting the entry would change the file outside it (YAML).
    #[error("rewriting {at} would change the file outside that entry, so it was not edited")]
    Outside {
        /// The entry.
        at: EntryAt,
    },
    /// The rewritten entry would not read back as the gateway.
    #[error(
        "the entry {at} would not read back as `countersign mcp` after the edit; the file was \
         left as it was"
    )]
    NotWrapped {
        /// The entry.
        at: EntryAt,
    },
    /// Uninstall found the texts of two entries overlapping in the file.
    #[error("two entries overlap in the file")]
    Overlap,
}

/// Why uninstall cannot put an entry install rewrote back alone; nothing was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PutBackError {
    /// The file before install has the entry in no form that can be cut out alone (twice, or
    /// written with dotted keys).
    #[error("the original file has it in no form that can be put back alone")]
    NotAloneInOriginal,
    /// Today's file has the entry in no form that can be replaced alone (twice, or written with
    /// dotted keys).
    #[error("it is not in the file once, in a form that can be replaced alone")]
    NotAloneNow,
    /// The file would not parse once the entries were put back.
    #[error("the file would not read back after putting it back: {0}")]
    NotReadBack(#[source] ParseError),
    /// The entry would not read back as the original had it.
    #[error("it would not read back as it was before install")]
    NotAsBefore,
    /// Putting the entries back would change more of the file than them.
    #[error("putting the entries back would change something else in the file")]
    ChangesElse,
    /// A TOML entry that is gone was an inline table: put back, it would land in whichever table
    /// ends the file.
    #[error(
        "it is gone from the file, and it was written inside another table; add it back by hand"
    )]
    GoneInsideTable,
    /// A JSON entry that is gone, and the object of entries it was in is gone too.
    #[error("it is gone from the file, and so is the object it was in; add it back by hand")]
    GoneWithItsObject,
    /// A YAML entry that is gone: YAML entries are put back only where they still are.
    #[error(
        "it is gone from the file, and a YAML entry is put back only where it still is; add it \
         back by hand"
    )]
    GoneFromYaml,
    /// The file, with the entries that are gone given their places, does not parse.
    #[error("{0}")]
    Parse(#[source] ParseError),
}

/// Why the backup of a file kept in the keychain cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupError {
    /// It is not JSON, or not a backup's shape (serde_json's message names a place, never the
    /// text).
    #[error("{0}")]
    Json(#[source] serde_json::Error),
    /// It is of a format this build does not read.
    #[error("it is of format {found}, and this countersign reads {reads}")]
    Format {
        /// Its format.
        found: u32,
        /// The one this build reads.
        reads: u32,
    },
    /// The file as it was before install, kept in it, does not parse.
    #[error("the file as it was before install cannot be read: {0}")]
    Original(#[source] ParseError),
    /// The file as install wrote it, kept in it, does not parse.
    #[error("the file as install wrote it cannot be read: {0}")]
    Installed(#[source] ParseError),
}
