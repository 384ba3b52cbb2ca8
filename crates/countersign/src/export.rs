//! `countersign history --format jsonl|csv`: the desk's history handed over as a file a security
//! team's tools take, streamed from the store one event at a time (a year of history is never held
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

use countersign_store::HistoryReader;
pub use countersign_store::export::{CSV_COLUMNS, ExportError, ExportFormat};

/// What an export is written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table for people, newest first (at most `--limit`).
    Table,
    /// JSON lines, newest first (at most `--limit`).
    Json,
    /// JSON lines, oldest first, every event in the range, streamed.
    Jsonl,
    /// CSV with a header row, oldest first, every event in the range, streamed.
    Csv,
}

/// Why a text is not a time bound ([`parse_time`]). Each names the text given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TimeError {
    /// All digits, and more milliseconds than fit in 64 bits.
    #[error("{text:?}: too large for milliseconds since the epoch")]
    TooLarge {
        /// The text given.
        text: String,
        /// Why it does not parse as a number of milliseconds.
        #[source]
        source: std::num::ParseIntError,
    },
    /// Neither milliseconds, nor an RFC 3339 time, nor a day.
    #[error(
        "{text:?} is not a time: give milliseconds since the epoch, an RFC 3339 time \
         (2026-12-01T09:30:00Z) or a day (2026-12-01)"
    )]
    NotATime {
        /// The text given.
        text: String,
    },
    /// A time before the epoch, which history cannot hold.
    #[error("{text:?} is before 1970")]
    Before1970 {
        /// The text given.
        text: String,
    },
}

/// A time bound given as milliseconds since the epoch, an RFC 3339 time
/// (`2026-12-01T09:30:00Z`) or a day (`2026-12-01`, midnight UTC).
pub fn parse_time(text: &str) -> Result<u64, TimeError> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse::<u64>().map_err(|source| TimeError::TooLarge {
            text: text.to_owned(),
            source,
        });
    }
    let stamp = match text.parse::<jiff::Timestamp>() {
        Ok(stamp) => stamp,
        Err(_) => text
            .parse::<jiff::civil::Date>()
            .ok()
            .and_then(|day| {
                jiff::tz::TimeZone::UTC
                    .to_timestamp(day.to_datetime(jiff::civil::Time::midnight()))
                    .ok()
            })
            .ok_or_else(|| TimeError::NotATime {
                text: text.to_owned(),
            })?,
    };
    u64::try_from(stamp.as_millisecond()).map_err(|_| TimeError::Before1970 {
        text: text.to_owned(),
    })
}

/// Writes every event of `reader` from `since` to `until` to `out` as `format` (JSON lines or
/// CSV), oldest first; returns how many. See [`countersign_store::export`].
pub fn export(
    reader: &HistoryReader,
    format: Format,
    since: Option<u64>,
    until: Option<u64>,
    out: impl std::io::Write,
) -> Result<u64, ExportError> {
    let format = match format {
        Format::Csv => ExportFormat::Csv,
        _ => ExportFormat::Jsonl,
    };
    countersign_store::export::export(reader, format, since, until, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_read_as_milliseconds_rfc_3339_or_a_day_and_nothing_else() {
        assert_eq!(parse_time("1764581400000"), Ok(1_764_581_400_000));
        assert_eq!(parse_time("2026-12-01T09:30:00Z"), Ok(1_796_117_400_000));
        assert_eq!(
            parse_time("2026-12-01T10:30:00+01:00"),
            Ok(1_796_117_400_000)
        );
        assert_eq!(parse_time("2026-12-01"), Ok(1_796_083_200_000));
        for bad in [
            "",
            "yesterday",
            "2026-13-01",
            "-5",
            "1969-12-31T23:59:59Z",
            "99999999999999999999999",
        ] {
            assert!(parse_time(bad).is_err(), "{bad:?}");
        }
    }
}
