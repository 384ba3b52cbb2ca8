//! A request's preview, as the window shows it: every string in it came from an upstream (a
//! file's lines, a path, what a read tool said, a table's name) and reaches the screen through
//! [`shown`], escaped and flagged like the plan's own fields. The window only lays it out.

use countersign_core::preview::Preview;
use serde::Serialize;

use super::{DiffRow, Shown, shown};

/// What a call would do, as the window shows it beside the plan.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PreviewView {
    /// A file as it is now beside what it would be: changed lines and their context.
    File {
        /// The path.
        path: Shown,
        /// Whether the file could be read now.
        existed: bool,
        /// What the read tool said instead of the file.
        note: Option<Shown>,
        /// The rows.
        rows: Vec<DiffRow>,
        /// Rows left out.
        more: usize,
        /// Whether nothing would change.
        unchanged: bool,
    },
    /// The upstream's own dry run, line by line.
    DryRun {
        /// The path.
        path: Shown,
        /// Its lines.
        lines: Vec<Shown>,
        /// Lines left out.
        more: usize,
    },
    /// A move.
    Move {
        /// From.
        source: Shown,
        /// To.
        destination: Shown,
        /// Whether something is at the destination now.
        destination_exists: bool,
    },
    /// A directory to create.
    Directory {
        /// The path.
        path: Shown,
        /// Whether something is there now.
        exists: bool,
    },
    /// Rows per table of SQL rehearsed and rolled back.
    Rows {
        /// Each table.
        tables: Vec<TableView>,
    },
    /// No preview: why.
    Unavailable {
        /// The code (`time_limit`, `read_failed`, ...).
        reason: String,
        /// More about it.
        detail: Shown,
    },
}

/// One table's rows before and after.
#[derive(Debug, Clone, Serialize)]
pub struct TableView {
    /// The table.
    pub table: Shown,
    /// Rows now.
    pub before: u64,
    /// Rows after.
    pub after: u64,
    /// Rows added.
    pub gained: u64,
    /// Rows removed.
    pub lost: u64,
    /// Rows changed.
    pub changed: u64,
    /// Only counted: `changed` unknown.
    pub counted_only: bool,
}

impl From<&Preview> for PreviewView {
    fn from(p: &Preview) -> Self {
        match p {
            Preview::File {
                path,
                existed,
                note,
                rows,
                more,
                unchanged,
            } => PreviewView::File {
                path: shown(path),
                existed: *existed,
                note: note.as_deref().map(shown),
                rows: rows.iter().map(DiffRow::from).collect(),
                more: *more,
                unchanged: *unchanged,
            },
            Preview::DryRun { path, lines, more } => PreviewView::DryRun {
                path: shown(path),
                lines: lines.iter().map(|l| shown(l)).collect(),
                more: *more,
            },
            Preview::Move {
                source,
                destination,
                destination_exists,
            } => PreviewView::Move {
                source: shown(source),
                destination: shown(destination),
                destination_exists: *destination_exists,
            },
            Preview::Directory { path, exists } => PreviewView::Directory {
                path: shown(path),
                exists: *exists,
            },
            Preview::Rows { tables } => PreviewView::Rows {
                tables: tables
                    .iter()
                    .map(|t| TableView {
                        table: shown(&t.table),
                        before: t.before,
                        after: t.after,
                        gained: t.gained,
                        lost: t.lost,
                        changed: t.changed,
                        counted_only: t.counted_only,
                    })
                    .collect(),
            },
            Preview::Unavailable { reason, detail } => PreviewView::Unavailable {
                reason: reason.to_string(),
                detail: shown(detail),
            },
            // A kind this window does not know is still never silent.
            #[allow(unreachable_patterns)]
            _ => PreviewView::Unavailable {
                reason: "failed".to_owned(),
                detail: shown("this window cannot show this preview"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use countersign_core::preview::{self, Unavailable};

    #[test]
    fn every_upstream_string_in_a_preview_is_escaped_and_flagged() {
        let p = preview::file(
            "/a\u{202e}txt",
            Some("old\n"),
            None,
            "new \u{200b}line\n<b>x</b>\n",
        );
        let v = serde_json::to_value(PreviewView::from(&p)).unwrap();
        assert_eq!(v["kind"], "file");
        assert_eq!(v["path"]["flags"], serde_json::json!(["bidi", "non_ascii"]));
        let after = &v["rows"][0]["after"];
        assert!(
            after["text"].as_str().unwrap().contains("\\u{200b}"),
            "{after}"
        );
        assert_eq!(
            v["rows"][1]["after"]["text"], "<b>x</b>",
            "text, never markup"
        );
        let v = serde_json::to_value(PreviewView::from(&Preview::unavailable(
            Unavailable::ReadFailed,
            "boom",
        )))
        .unwrap();
        assert_eq!(v["reason"], "read_failed");
        assert_eq!(v["detail"]["text"], "boom");
    }
}
