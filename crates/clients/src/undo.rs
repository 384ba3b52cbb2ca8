//! What uninstall puts back in a file the client has written since install did. Claude Code
//! rewrites `~/.claude.json` on every start (`numStartups`, `userID`, each project's
//! `lastSessionId`), Qwen Code adds `$version`, OpenCode `$schema`: restoring the whole original
//! would throw all of that away. So only the entries install rewrote are put back, each as the
//! original's own text, byte for byte, and every other byte of today's file stays as it is.
//!
//! An entry is found by its place (the keys down to it, [`EntryAt`]) in three texts: the file
//! before install, the file install wrote, and the file today. It counts as changed since install
//! when today's entry does not hold the same data as the one install wrote (the client may have
//! re-indented or reordered it: Claude Code writes the whole file anew; that is no change); a
//! comment added inside it is not kept, because the entry becomes the original's text again.
//! Changed entries are named and nothing is written, unless forced.
//!
//! Where an entry's text is depends on the format (the `pieces` of each format module): in JSON
//! and YAML, the byte range of the entry's value; in TOML, each table of the entry
//! (`[mcp_servers.x]`, `[mcp_servers.x.env]`, with the comments above its header) or its
//! `x = { ... }`. The edit is then checked the way install's is: the result must read back with
//! each entry as the original had it and everything else as today's file has it, or nothing is
//! written.

use std::collections::BTreeMap;
use std::ops::Range;

use serde_json::Value;

use crate::error::{ParseError, PutBackError};
use crate::table::{Format, Layout};
use crate::{Client, EntryAt, codex, json, yaml};

/// One stretch of a file's text that belongs to an entry. `id` tells apart the pieces of one
/// entry (a TOML table's header path); JSON and YAML entries are one piece each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) id: String,
    pub(crate) range: Range<usize>,
}

/// One of the three texts uninstall reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Text {
    /// The file before install.
    Original,
    /// The file as install wrote it.
    Installed,
    /// The file today.
    Current,
}

/// Why an entry cannot be put back.
#[derive(Debug)]
pub(crate) enum Undo {
    /// These entries hold something else than what install wrote (or are gone).
    Changed(Vec<EntryAt>),
    /// This entry cannot be put back in place, and why.
    Unplaced(EntryAt, PutBackError),
    /// One of the three texts cannot be read: which, and why (never its text).
    Unreadable(Text, ParseError),
    /// Today's file cannot be edited as it is: the texts of two entries overlap.
    Overlap,
}

/// Every entry's pieces in `text`; an entry found twice has none (which one is meant is not
/// clear).
fn pieces(client: Client, text: &str) -> Result<BTreeMap<EntryAt, Vec<Piece>>, ParseError> {
    let found = match client.spec().format {
        Format::Json => json::pieces(client, text)?,
        Format::Toml => codex::pieces(text)?,
        Format::Yaml => yaml::pieces(client, text)?,
    };
    let mut map = BTreeMap::new();
    for (at, pieces) in found {
        if map.insert(at.clone(), pieces).is_some() {
            map.insert(at, Vec::new());
        }
    }
    Ok(map)
}

/// The whole file as data: what is compared, never written.
fn plain(client: Client, text: &str) -> Result<Value, ParseError> {
    match client.spec().format {
        Format::Json => json::plain(text),
        Format::Toml => codex::plain(text),
        Format::Yaml => yaml::plain_value(text),
    }
}

/// The entry at `at` in `doc`, as data.
fn entry_value<'a>(client: Client, doc: &'a Value, at: &EntryAt) -> Option<&'a Value> {
    let mut v = doc;
    for p in &at.parents {
        v = v.get(p)?;
    }
    match client.spec().layout {
        Layout::ByName => v.as_object()?.get(&at.key),
        Layout::List(name_key) => v
            .as_array()?
            .iter()
            .enumerate()
            .find(|(i, item)| list_name(item, name_key, *i) == at.key)
            .map(|(_, item)| item),
    }
}

/// The name of a list item as `yaml::each_entry` gives it.
fn list_name(item: &Value, name_key: &str, i: usize) -> String {
    match item.get(name_key) {
        Some(Value::String(name)) => name.clone(),
        _ => format!("#{}", i + 1),
    }
}

/// `doc` without the entries at `entries` (a list item becomes `null`, so that the others keep
/// their places).
fn without(client: Client, mut doc: Value, entries: &[EntryAt]) -> Value {
    fn down<'a>(doc: &'a mut Value, parents: &[String]) -> Option<&'a mut Value> {
        let mut v = doc;
        for p in parents {
            v = v.get_mut(p)?;
        }
        Some(v)
    }
    for at in entries {
        let Some(v) = down(&mut doc, &at.parents) else {
            continue;
        };
        match client.spec().layout {
            Layout::ByName => {
                if let Some(object) = v.as_object_mut() {
                    object.remove(&at.key);
                }
            }
            Layout::List(name_key) => {
                if let Some(items) = v.as_array_mut()
                    && let Some(i) =
                        (0..items.len()).find(|i| list_name(&items[*i], name_key, *i) == at.key)
                {
                    items[i] = Value::Null;
                }
            }
        }
    }
    doc
}

/// The entries of `entries` whose data in `current` is not what install wrote in `installed`.
pub(crate) fn changed(
    client: Client,
    installed: &str,
    current: &str,
    entries: &[EntryAt],
) -> Result<Vec<EntryAt>, (Text, ParseError)> {
    let installed = plain(client, installed).map_err(|e| (Text::Installed, e))?;
    let current = plain(client, current).map_err(|e| (Text::Current, e))?;
    Ok(entries
        .iter()
        .filter(|at| {
            let now = entry_value(client, &current, at);
            now.is_none() || now != entry_value(client, &installed, at)
        })
        .cloned()
        .collect())
}

/// `current` with each entry of `entries` put back as `original` had it, byte for byte, and
/// every other byte as it is. Refuses when one of them changed since install wrote `installed`,
/// unless `force`; then a changed entry is put back anyway, and one that is gone is put back
/// where its object of entries is, where the format allows.
pub(crate) fn undo(
    client: Client,
    original: &str,
    installed: &str,
    current: &str,
    entries: &[EntryAt],
    force: bool,
) -> Result<String, Undo> {
    let changed = changed(client, installed, current, entries)
        .map_err(|(which, e)| Undo::Unreadable(which, e))?;
    if !changed.is_empty() && !force {
        return Err(Undo::Changed(changed));
    }
    let original_pieces =
        pieces(client, original).map_err(|e| Undo::Unreadable(Text::Original, e))?;
    let original_plain =
        plain(client, original).map_err(|e| Undo::Unreadable(Text::Original, e))?;
    let current_plain = plain(client, current).map_err(|e| Undo::Unreadable(Text::Current, e))?;
    let originals = |at: &EntryAt| -> Result<Vec<(String, &str)>, Undo> {
        let pieces = original_pieces
            .get(at)
            .filter(|p| !p.is_empty())
            .ok_or_else(|| Undo::Unplaced(at.clone(), PutBackError::NotAloneInOriginal))?;
        Ok(pieces
            .iter()
            .map(|p| (p.id.clone(), &original[p.range.clone()]))
            .collect())
    };

    // An entry that is gone (only when forced) first gets a place to be put back into.
    let mut text = current.to_owned();
    for at in entries {
        if entry_value(client, &current_plain, at).is_none() {
            let pieces = originals(at)?;
            text =
                place(client, &text, at, &pieces).map_err(|why| Undo::Unplaced(at.clone(), why))?;
        }
    }

    let now = pieces(client, &text).map_err(|e| Undo::Unreadable(Text::Current, e))?;
    let mut edits: Vec<(Range<usize>, &str)> = Vec::new();
    for at in entries {
        let originals = originals(at)?;
        let here = now
            .get(at)
            .filter(|p| !p.is_empty())
            .ok_or_else(|| Undo::Unplaced(at.clone(), PutBackError::NotAloneNow))?;
        // Each original piece where today's of the same id is; one today lacks, after the piece
        // before it; one only today has, removed.
        let mut after = here[0].range.start;
        for (id, original_text) in &originals {
            match here.iter().find(|p| p.id == *id) {
                Some(p) => {
                    edits.push((p.range.clone(), original_text));
                    after = p.range.end;
                }
                None => edits.push((after..after, original_text)),
            }
        }
        for p in here {
            if !originals.iter().any(|(id, _)| *id == p.id) {
                edits.push((p.range.clone(), ""));
            }
        }
    }
    // Stable: insertions at one place keep their order, and come after a piece ending there.
    edits.sort_by_key(|(range, _)| (range.start, range.end));
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (range, replacement) in &edits {
        if range.start < at {
            return Err(Undo::Overlap);
        }
        out.push_str(&text[at..range.start]);
        out.push_str(replacement);
        at = range.end;
    }
    out.push_str(&text[at..]);

    // The result must read as today's file with the original entries.
    let restored = plain(client, &out)
        .map_err(|e| Undo::Unplaced(entries[0].clone(), PutBackError::NotReadBack(e)))?;
    for at in entries {
        if entry_value(client, &restored, at) != entry_value(client, &original_plain, at) {
            return Err(Undo::Unplaced(at.clone(), PutBackError::NotAsBefore));
        }
    }
    if without(client, restored, entries) != without(client, current_plain, entries) {
        return Err(Undo::Unplaced(
            entries[0].clone(),
            PutBackError::ChangesElse,
        ));
    }
    Ok(out)
}

/// `text` with a place for the gone entry `at`, to be filled with `pieces` of the original.
fn place(
    client: Client,
    text: &str,
    at: &EntryAt,
    pieces: &[(String, &str)],
) -> Result<String, PutBackError> {
    match client.spec().format {
        Format::Json => json::place(client, text, at),
        Format::Toml => codex::place(text, pieces),
        Format::Yaml => Err(PutBackError::GoneFromYaml),
    }
}
