//! The desk's history handed over as a file a security team's tools take (`countersign history
//! --format jsonl|csv`, and the desk's History → Save), streamed from the store one event at a time (a year of history is never held
//! in memory), oldest first, optionally bounded by `--since` and `--until`.
//!
//! JSON lines carry each event exactly as the store keeps it (the same objects as `--json`), with
//! its place in the history's chain (`seq`, `prev`, `hash`); when the export reaches the newest
//! event, its last line is the chain's signed head (`{"head": …}`), so `countersign history
//! verify --file` can check the export offline. CSV has one header row and fixed columns, the
//! chain's among them. Text an agent or an upstream chose (tool, target, tenant,
//! note) is hostile: in CSV a cell of it that a spreadsheet would read as a formula (it starts
//! with `=`, `+`, `-`, `@`, a tab or a carriage return) is written with a leading `'`, as OWASP
//! advises; JSON lines are never altered.

use std::io::Write;

use crate::{Chained, HistoryReader, Recorded, StoreError};
use countersign_core::telemetry::{ConfirmEvent, EventKind};

/// What an export is written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// JSON lines, oldest first, every event in the range, streamed, ending with the signed head
    /// when the export reaches it.
    Jsonl,
    /// CSV with a header row, oldest first, every event in the range, streamed.
    Csv,
}

/// The CSV columns, in order.
pub const CSV_COLUMNS: [&str; 14] = [
    "at_ms", "at", "kind", "code", "tool", "target", "tenant", "nonce", "plan", "note", "ok",
    "seq", "prev", "hash",
];

/// Why an export stopped.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The store could not be read.
    #[error("cannot read history: {0}")]
    Store(#[from] StoreError),
    /// The output could not be written (a closed pipe, a full disk).
    #[error("cannot write the export: {0}")]
    Write(#[from] std::io::Error),
    /// A row could not be encoded as CSV.
    #[error("cannot write the export: {0}")]
    Csv(#[from] csv::Error),
}

/// Writes every event of `reader` from `since` to `until` to `out` as `format` (JSON lines or
/// CSV), oldest first; returns how many.
pub fn export(
    reader: &HistoryReader,
    format: ExportFormat,
    since: Option<u64>,
    until: Option<u64>,
    out: impl Write,
) -> Result<u64, ExportError> {
    match format {
        ExportFormat::Csv => {
            let mut csv = csv::Writer::from_writer(out);
            csv.write_record(CSV_COLUMNS)?;
            let (n, _) = reader.each_between(since, until, |recorded: Recorded| {
                csv.write_record(csv_row(&recorded.event, recorded.chained))?;
                Ok::<_, ExportError>(())
            })?;
            csv.flush()?;
            Ok(n)
        }
        ExportFormat::Jsonl => {
            let mut out = std::io::BufWriter::new(out);
            let mut last = None;
            let (n, heads) = reader.each_between(since, until, |recorded: Recorded| {
                serde_json::to_writer(&mut out, &line(&recorded)).map_err(std::io::Error::from)?;
                out.write_all(b"\n")?;
                last = recorded.chained.map(|c| c.seq);
                Ok::<_, ExportError>(())
            })?;
            // The head closes an export that reaches it: with it, the export is checked offline.
            if let Some(head) = heads.head
                && last == Some(head.head.seq)
            {
                serde_json::to_writer(&mut out, &serde_json::json!({ "head": head.to_json() }))
                    .map_err(std::io::Error::from)?;
                out.write_all(b"\n")?;
            }
            out.flush()?;
            Ok(n)
        }
    }
}

/// One event as a JSON line: the event's own fields, then its place in the chain.
fn line(recorded: &Recorded) -> serde_json::Value {
    let mut value = serde_json::to_value(&recorded.event).expect("events serialize");
    if let (Some(object), Some(chained)) = (value.as_object_mut(), recorded.chained) {
        object.insert("seq".into(), chained.seq.into());
        object.insert("prev".into(), chained.prev.to_hex().into());
        object.insert("hash".into(), chained.hash.to_hex().into());
    }
    value
}

/// One event as the CSV columns ([`CSV_COLUMNS`]).
fn csv_row(event: &ConfirmEvent, chained: Option<Chained>) -> [String; 14] {
    let code = match event.kind {
        EventKind::Refused { refusal } => refusal.code(),
        EventKind::Rejected { reason } => reason.code(),
        EventKind::Replay => countersign_core::Refusal::AlreadyUsed.code(),
        _ => "",
    };
    let ok = match event.kind {
        EventKind::Executed { ok } => ok.to_string(),
        _ => String::new(),
    };
    let at = i64::try_from(event.at_ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map(|t| t.to_string())
        .unwrap_or_default();
    [
        event.at_ms.to_string(),
        at,
        event.kind.code().to_owned(),
        code.to_owned(),
        cell(&event.tool),
        event.target.as_deref().map(cell).unwrap_or_default(),
        cell(&event.tenant),
        event.nonce.map(|n| n.to_hex()).unwrap_or_default(),
        event.plan.map(|p| p.to_hex()).unwrap_or_default(),
        event.note.as_deref().map(cell).unwrap_or_default(),
        ok,
        chained.map(|c| c.seq.to_string()).unwrap_or_default(),
        chained.map(|c| c.prev.to_hex()).unwrap_or_default(),
        chained.map(|c| c.hash.to_hex()).unwrap_or_default(),
    ]
}

/// Text someone else chose, as a CSV cell no spreadsheet runs as a formula.
fn cell(text: &str) -> String {
    match text.chars().next() {
        Some('=' | '+' | '-' | '@' | '\t' | '\r') => format!("'{text}"),
        _ => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_a_spreadsheet_would_run_as_a_formula_is_written_as_text() {
        for formula in [
            "=HYPERLINK(\"http://x\")",
            "+1",
            "-2+3",
            "@SUM(A1)",
            "\tx",
            "\rx",
        ] {
            assert_eq!(cell(formula), format!("'{formula}"));
        }
        for plain in ["execute", "main.db", "", "a=b", "key:ci"] {
            assert_eq!(cell(plain), plain);
        }
    }
}
