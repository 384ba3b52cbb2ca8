//! What a call would do, shown beside the plan while a person decides: a file as it is and as it
//! would be, a move's destination, the rows a SQL statement would gain, lose or change.
//!
//! A preview shows how things look now, so it is never part of the plan, its hash, the token or
//! what executes (the seed's rule): the desk computes it from the upstream and attaches it to the
//! waiting request for display only. What is here is pure: the shapes the window receives and
//! the bounded diff of two texts ([`file`]). Everything in a preview came from an upstream and is
//! hostile: the window escapes and flags every string of it. A preview that could not be made
//! says so ([`Preview::Unavailable`] and its [`Unavailable`] code); it never vanishes.

use serde::Serialize;

use crate::diff::{self, Row, RowKind};

/// The most bytes of a file, or of new content, a preview compares.
pub const MAX_FILE_BYTES: usize = 256 * 1024;

/// The most diff rows a preview carries; the rest are counted in `more`.
pub const MAX_ROWS: usize = 300;

/// Unchanged lines kept around each change.
pub const CONTEXT: usize = 3;

/// The most characters of one line shown.
pub const MAX_LINE_CHARS: usize = 400;

/// Why a preview could not be made: a code the window shows as "preview unavailable: <code>".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Unavailable {
    /// It took longer than the desk waits for a preview.
    #[error("time_limit")]
    TimeLimit,
    /// The file or the new content is larger than [`MAX_FILE_BYTES`].
    #[error("too_large")]
    TooLarge,
    /// The upstream's read tool answered an error or something that is not text.
    #[error("read_failed")]
    ReadFailed,
    /// The recipe's read tool is not listed by the upstream as `readOnlyHint: true`: the desk
    /// never calls a tool that may change something without a click.
    #[error("read_tool_not_read_only")]
    ReadToolNotReadOnly,
    /// The call's arguments lack what the recipe maps, or have the wrong type.
    #[error("bad_arguments")]
    BadArguments,
    /// The upstream could not be reached.
    #[error("upstream_unreachable")]
    UpstreamUnreachable,
    /// The statement does something a rolled-back rehearsal cannot undo, or cannot be attributed.
    #[error("not_rehearsable")]
    NotRehearsable,
    /// SQLite refused the statement.
    #[error("statement_failed")]
    StatementFailed,
    /// Another connection held the database.
    #[error("database_busy")]
    DatabaseBusy,
    /// Something else (the detail says what).
    #[error("failed")]
    Failed,
}

/// A preview as the window shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Preview {
    /// A file as it is now beside what it would be.
    File {
        /// The path as the call names it.
        path: String,
        /// Whether the file could be read (`false`: the read tool answered an error, which is
        /// how a file that does not exist yet reads; `note` holds what it said).
        existed: bool,
        /// What the read tool said instead of the file, when it did.
        note: Option<String>,
        /// The changed lines with [`CONTEXT`] lines around them, at most [`MAX_ROWS`].
        rows: Vec<Row>,
        /// Rows left out past [`MAX_ROWS`].
        more: usize,
        /// Whether nothing would change.
        unchanged: bool,
    },
    /// The upstream's own dry run of the call (a patch it printed), line by line.
    DryRun {
        /// The path as the call names it.
        path: String,
        /// Its lines, at most [`MAX_ROWS`].
        lines: Vec<String>,
        /// Lines left out.
        more: usize,
    },
    /// A move: where from, where to, and whether something is already there.
    Move {
        /// The source as the call names it.
        source: String,
        /// The destination as the call names it.
        destination: String,
        /// Whether the destination exists now (the upstream's read tool found it).
        destination_exists: bool,
    },
    /// A directory to be created, and whether it exists already.
    Directory {
        /// The path as the call names it.
        path: String,
        /// Whether something exists at the path now.
        exists: bool,
    },
    /// SQL rehearsed in a transaction that was rolled back: rows per table.
    Rows {
        /// Each table written.
        tables: Vec<TableRows>,
    },
    /// No preview could be made: the window says so, with the code.
    Unavailable {
        /// Why.
        reason: Unavailable,
        /// More about it, for the person (may quote the upstream: hostile).
        detail: String,
    },
}

/// Rows of one table before and after a rehearsal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableRows {
    /// The table.
    pub table: String,
    /// Rows now.
    pub before: u64,
    /// Rows after the statement.
    pub after: u64,
    /// Rows it adds.
    pub gained: u64,
    /// Rows it removes.
    pub lost: u64,
    /// Rows it changes.
    pub changed: u64,
    /// Only counted: `changed` is unknown.
    pub counted_only: bool,
}

impl Preview {
    /// A preview that could not be made.
    pub fn unavailable(reason: Unavailable, detail: impl Into<String>) -> Preview {
        Preview::Unavailable {
            reason,
            detail: cut(&detail.into(), MAX_LINE_CHARS),
        }
    }
}

/// `s`, at most `n` characters, an ellipsis marking a cut.
pub fn cut(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

/// The preview of writing `after` to `path`, which reads `before` now (`None`: the read tool
/// answered `note` instead). Only changed lines and their context are kept, bounded.
pub fn file(path: &str, before: Option<&str>, note: Option<&str>, after: &str) -> Preview {
    if before.is_some_and(|b| b.len() > MAX_FILE_BYTES) || after.len() > MAX_FILE_BYTES {
        return Preview::unavailable(
            Unavailable::TooLarge,
            format!("more than {} KiB to compare", MAX_FILE_BYTES / 1024),
        );
    }
    let all = diff::lines(before, Some(after));
    let unchanged = all.iter().all(|r| r.kind == RowKind::Same);
    let near_change: Vec<bool> = (0..all.len())
        .map(|i| {
            let from = i.saturating_sub(CONTEXT);
            let to = (i + CONTEXT + 1).min(all.len());
            all[from..to].iter().any(|r| r.kind != RowKind::Same)
        })
        .collect();
    let kept: Vec<Row> = all
        .into_iter()
        .zip(near_change)
        .filter(|(_, keep)| *keep)
        .map(|(row, _)| Row {
            before: row.before.map(|l| cut(&l, MAX_LINE_CHARS)),
            after: row.after.map(|l| cut(&l, MAX_LINE_CHARS)),
            ..row
        })
        .collect();
    let more = kept.len().saturating_sub(MAX_ROWS);
    Preview::File {
        path: path.to_owned(),
        existed: before.is_some(),
        note: note.map(|n| cut(n, MAX_LINE_CHARS)),
        rows: kept.into_iter().take(MAX_ROWS).collect(),
        more,
        unchanged,
    }
}

/// The preview of an upstream's dry run: its text, line by line, bounded.
pub fn dry_run(path: &str, text: &str) -> Preview {
    let lines: Vec<&str> = text.lines().collect();
    Preview::DryRun {
        path: path.to_owned(),
        more: lines.len().saturating_sub(MAX_ROWS),
        lines: lines
            .into_iter()
            .take(MAX_ROWS)
            .map(|l| cut(l, MAX_LINE_CHARS))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_preview_keeps_the_changed_lines_and_their_context() {
        let before: String = (1..=20).map(|i| format!("line {i}\n")).collect();
        let after = before.replace("line 10\n", "line ten\n");
        let Preview::File {
            rows,
            more,
            existed,
            unchanged,
            ..
        } = file("/a.txt", Some(&before), None, &after)
        else {
            panic!()
        };
        assert!(existed && !unchanged);
        assert_eq!(more, 0);
        assert_eq!(rows.len(), 1 + 2 * CONTEXT);
        let changed = rows.iter().find(|r| r.kind == RowKind::Changed).unwrap();
        assert_eq!(changed.before.as_deref(), Some("line 10"));
        assert_eq!(changed.after.as_deref(), Some("line ten"));
        assert_eq!(rows[0].before_line, Some(7));
    }

    #[test]
    fn a_new_file_is_all_added_and_says_what_the_read_tool_said() {
        let Preview::File {
            rows,
            existed,
            note,
            ..
        } = file("/n.txt", None, Some("ENOENT"), "a\nb\n")
        else {
            panic!()
        };
        assert!(!existed);
        assert_eq!(note.as_deref(), Some("ENOENT"));
        assert!(rows.iter().all(|r| r.kind == RowKind::Added));
    }

    #[test]
    fn a_large_diff_is_cut_and_says_how_much_more() {
        let after: String = (0..1000).map(|i| format!("{i}\n")).collect();
        let Preview::File { rows, more, .. } = file("/x", Some(""), None, &after) else {
            panic!()
        };
        assert_eq!(rows.len(), MAX_ROWS);
        assert_eq!(more, 1000 - MAX_ROWS);
        let long = "x".repeat(MAX_FILE_BYTES + 1);
        assert!(matches!(
            file("/x", Some("a"), None, &long),
            Preview::Unavailable {
                reason: Unavailable::TooLarge,
                ..
            }
        ));
        let Preview::File { rows, .. } = file("/x", Some("a"), None, &"y".repeat(5000)) else {
            panic!()
        };
        assert_eq!(
            rows[0].after.as_ref().unwrap().chars().count(),
            MAX_LINE_CHARS + 1
        );
    }

    #[test]
    fn an_unchanged_file_says_so() {
        let Preview::File {
            rows, unchanged, ..
        } = file("/x", Some("a\nb\n"), None, "a\nb\n")
        else {
            panic!()
        };
        assert!(unchanged && rows.is_empty());
    }

    #[test]
    fn previews_serialize_with_their_kind_and_reason_codes() {
        let p = Preview::unavailable(Unavailable::ReadToolNotReadOnly, "x");
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["kind"], "unavailable");
        assert_eq!(v["reason"], "read_tool_not_read_only");
        assert_eq!(Unavailable::TimeLimit.to_string(), "time_limit");
        let d = dry_run("/p", "--- a\n+++ b\n");
        assert_eq!(serde_json::to_value(&d).unwrap()["lines"][1], "+++ b");
    }
}
