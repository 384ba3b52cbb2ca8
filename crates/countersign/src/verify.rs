//! `countersign history verify`, `history head`: checking the history's chain offline.
//!
//! The desk chains every event to the one before and signs the newest hash with its chain key
//! (`countersign_core::chain`). Anyone with the desk's file, or an export of it
//! (`countersign history --format jsonl`), and the desk's public key (`countersign history key`)
//! can check that nothing was edited, deleted or reordered since, and that the head is the desk's:
//! this program names the first event at which the chain breaks. A head kept from before
//! (`--head FILE`: the output of `countersign history head`, or an earlier export) catches what
//! the chain alone cannot: a tail cut off by someone holding the key, who then signed the shorter
//! chain again.
//!
//! Exports are read one line at a time and never held in memory; a line longer than any event
//! the desk writes is refused rather than read.

use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};

use countersign_core::approver::parse_public_key;
use countersign_core::canonical::parse_strict;
use countersign_core::chain::{
    Break, ChainHash, HeadsError, Intact, Link, SignedHead, Walk, describe, heads_in,
};
use countersign_core::telemetry::ConfirmEvent;
use serde::Deserialize;

/// The longest line of an export read: far beyond an event (texts are capped at 1,024
/// characters each), far below what could exhaust memory.
const MAX_LINE: u64 = 256 * 1024;

/// Why `--key` gave no key to check signatures against ([`read_key`]). Each names the text given.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The text is not a key, and no file of that name can be read.
    #[error("--key {text:?}: neither a key (ed25519:…) nor a readable file: {source}")]
    Unreadable {
        /// The text given.
        text: String,
        /// Why it could not be read as a file.
        #[source]
        source: std::io::Error,
    },
    /// The text names a file, which does not hold a key.
    #[error("--key {text:?}: the file does not hold a key (ed25519:…)")]
    NotAKey {
        /// The text given.
        text: String,
    },
}

/// The key to check signatures against: `ed25519:…` as `countersign history key` printed it,
/// or a file holding that text.
pub fn read_key(text: &str) -> Result<[u8; 32], KeyError> {
    if let Some(key) = parse_public_key(text) {
        return Ok(key);
    }
    let from_file = std::fs::read_to_string(text).map_err(|source| KeyError::Unreadable {
        text: text.to_owned(),
        source,
    })?;
    parse_public_key(&from_file).ok_or_else(|| KeyError::NotAKey {
        text: text.to_owned(),
    })
}

/// Why a file of kept heads gave none ([`read_heads`]). Each names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeadFileError {
    /// The file could not be opened or read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file holds no signed head, or a line that says it is one and is not.
    #[error("{}: {source}", path.display())]
    Heads {
        /// The file.
        path: PathBuf,
        /// Which line, or that there is none.
        #[source]
        source: HeadsError,
    },
}

/// Every signed head in the file at `path` (see [`countersign_core::chain::heads_in`]).
pub fn read_heads(path: &Path) -> Result<Vec<SignedHead>, HeadFileError> {
    let read = |source| HeadFileError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read)?;
    let mut text = String::new();
    file.take(64 * MAX_LINE)
        .read_to_string(&mut text)
        .map_err(read)?;
    heads_in(&text).map_err(|source| HeadFileError::Heads {
        path: path.to_owned(),
        source,
    })
}

/// An export's event line: the event, and its place in the chain.
#[derive(Deserialize)]
struct EventLine {
    #[serde(flatten)]
    event: ConfirmEvent,
    seq: u64,
    prev: String,
    hash: String,
}

/// Checks the export read from `input` (JSON lines, as `history --format jsonl` wrote them) with
/// `walk` (its key, the heads kept and events seen elsewhere). An export may begin
/// anywhere (`--since`); it must end with its signed head, or a head in `kept` must name its last
/// event.
pub fn verify_export(input: impl Read, mut walk: Walk) -> Result<Intact, Break> {
    let unreadable = |number: u64, reason: String| Break::Unreadable {
        at: format!("line {number}"),
        reason,
    };
    let mut head = None;
    let mut lines = Lines::new(input);
    loop {
        let (number, line) = match lines.next_line() {
            Ok(Some(line)) => line,
            Ok(None) => break,
            Err(e) => return Err(unreadable(lines.number, e.to_string())),
        };
        if head.is_some() {
            return Err(unreadable(number, "a line after the signed head".into()));
        }
        // Strict: a duplicated key could show one value to a reader and hash another.
        let value = parse_strict(&line).map_err(|e| unreadable(number, e.to_string()))?;
        if let Some(signed) = value.get("head") {
            let signed = SignedHead::from_json(signed)
                .ok_or_else(|| unreadable(number, "not a signed head".into()))?;
            head = Some(signed);
            continue;
        }
        let read: EventLine =
            serde_json::from_value(value).map_err(|e| unreadable(number, e.to_string()))?;
        let hash = |text: &str, what: &str| {
            ChainHash::from_hex(text)
                .ok_or_else(|| unreadable(number, format!("its {what} is not a chain hash")))
        };
        let prev = hash(&read.prev, "prev")?;
        let stored = hash(&read.hash, "hash")?;
        let event = &read.event;
        let (kind, refusal, ok) = event.kind.columns();
        let nonce = event.nonce.map(|n| n.to_hex());
        let plan = event.plan.map(|p| p.to_hex());
        let link = Link {
            seq: read.seq,
            at_ms: event.at_ms,
            kind,
            refusal,
            ok,
            tool: &event.tool,
            target: event.target.as_deref(),
            tenant: &event.tenant,
            nonce: nonce.as_deref(),
            plan: plan.as_deref(),
            note: event.note.as_deref(),
            prev,
        };
        walk.step(&link, stored)?;
    }
    walk.finish(head, None, true)
}

/// What a check found, for people: the line printed and the exit code (0 intact, 1 broken).
pub fn report(result: &Result<Intact, Break>, key_given: bool) -> (String, i32) {
    (describe(result, key_given), i32::from(result.is_err()))
}

/// Lines of a reader, each at most [`MAX_LINE`] bytes, numbered from 1; an empty last line is
/// none.
struct Lines<R> {
    input: std::io::BufReader<R>,
    number: u64,
}

impl<R: Read> Lines<R> {
    fn new(input: R) -> Self {
        Lines {
            input: std::io::BufReader::new(input),
            number: 0,
        }
    }

    fn next_line(&mut self) -> std::io::Result<Option<(u64, String)>> {
        let mut line = Vec::new();
        let read = (&mut self.input)
            .take(MAX_LINE + 1)
            .read_until(b'\n', &mut line)?;
        if read == 0 {
            return Ok(None);
        }
        self.number += 1;
        if line.len() as u64 > MAX_LINE {
            return Err(std::io::Error::other(format!(
                "line {} is longer than {MAX_LINE} bytes",
                self.number
            )));
        }
        if line.last() == Some(&b'\n') {
            line.pop();
        }
        let text = String::from_utf8(line)
            .map_err(|_| std::io::Error::other(format!("line {} is not UTF-8", self.number)))?;
        Ok(Some((self.number, text)))
    }
}
