//! Codex's `config.toml`: `[mcp_servers.NAME]` tables (or inline tables under `[mcp_servers]`),
//! read and edited with `toml_edit`, which keeps comments, blank lines and the order of keys.
//!
//! An entry keeps what is about how Codex uses the server (`enabled`, `startup_timeout_sec`,
//! `tool_timeout_sec`, `enabled_tools`, ...) and loses what is about how to reach it (`env`,
//! `cwd`, `url`, `http_headers`). Entries that take values from Codex's own environment
//! (`env_vars`, `bearer_token_env_var`, `env_http_headers`) are left as they are: the desk does
//! not have that environment.

use std::ops::Range;

use serde_json::json;
use toml_edit::{Array, Document, DocumentMut, Item, Table, TableLike, Value};

use super::{Client, EntryAt, Found, Reach, gateway_args, is_wrapped, server_of};
use crate::error::{EditError, ParseError, PutBackError};
use crate::undo::Piece;

const SERVERS: &str = "mcp_servers";

/// Keys that say how Codex reaches a server: the rewritten entry loses them.
const REACH_KEYS: [&str; 4] = ["env", "cwd", "url", "http_headers"];

/// Keys whose values come from Codex's environment.
const FROM_CODEX_ENV: [&str; 3] = ["env_vars", "bearer_token_env_var", "env_http_headers"];

/// The message and the line of a TOML error only: toml_edit's own rendering quotes the line,
/// which could hold a secret.
fn reduced(text: &str, e: &toml_edit::TomlError) -> ParseError {
    ParseError::Toml {
        why: e.message().trim_end().to_owned(),
        line: e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1),
    }
}

fn parse(text: &str) -> Result<DocumentMut, ParseError> {
    text.parse::<DocumentMut>().map_err(|e| reduced(text, &e))
}

fn text_of(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.value().clone()),
        Value::Integer(i) => Some(i.value().to_string()),
        Value::Boolean(b) => Some(b.value().to_string()),
        _ => None,
    }
}

fn strings(item: Option<&Item>) -> Option<Vec<String>> {
    match item {
        None => Some(Vec::new()),
        Some(item) => item.as_array()?.iter().map(text_of).collect(),
    }
}

fn pairs(item: Option<&Item>) -> Option<Vec<(String, String)>> {
    match item {
        None => Some(Vec::new()),
        Some(item) => item
            .as_table_like()?
            .iter()
            .map(|(k, v)| Some((k.to_owned(), text_of(v.as_value()?)?)))
            .collect(),
    }
}

/// Every entry of the file and what it is.
pub(super) fn entries(client: Client, text: &str) -> Result<Vec<(EntryAt, Found)>, ParseError> {
    let doc = parse(text)?;
    let Some(servers) = doc.get(SERVERS).and_then(Item::as_table_like) else {
        return Ok(Vec::new());
    };
    Ok(servers
        .iter()
        .map(|(key, item)| {
            let at = EntryAt {
                parents: vec![SERVERS.to_owned()],
                key: key.to_owned(),
            };
            let found = match item.as_table_like() {
                Some(entry) => read_entry(client, entry),
                None => Found::Left("it is not a table".into()),
            };
            (at, found)
        })
        .collect())
}

fn read_entry(client: Client, entry: &dyn TableLike) -> Found {
    let str_of = |key: &str| entry.get(key).and_then(Item::as_str);
    if let Some(program) = str_of("command") {
        let (Some(args), Some(env)) = (strings(entry.get("args")), pairs(entry.get("env"))) else {
            return Found::Left("its `args` or `env` is not what Codex reads".into());
        };
        if is_wrapped(program, &args) {
            return Found::Wrapped;
        }
        if let Some(key) = FROM_CODEX_ENV.iter().find(|k| entry.contains_key(k)) {
            return from_codex_env(key);
        }
        let cwd = match entry.get("cwd") {
            None => None,
            Some(item) => match item.as_str() {
                Some(cwd) => Some(cwd.to_owned()),
                None => return Found::Left("its `cwd` is not text".into()),
            },
        };
        return server_of(
            client,
            Reach::Command {
                program: program.to_owned(),
                args,
                cwd,
                env,
            },
        );
    }
    if let Some(url) = str_of("url") {
        if let Some(key) = FROM_CODEX_ENV.iter().find(|k| entry.contains_key(k)) {
            return from_codex_env(key);
        }
        let Some(headers) = pairs(entry.get("http_headers")) else {
            return Found::Left("its `http_headers` is not a table of text".into());
        };
        return server_of(
            client,
            Reach::Url {
                url: url.to_owned(),
                headers,
            },
        );
    }
    Found::Left("it has no `command` or `url`".into())
}

fn from_codex_env(key: &str) -> Found {
    Found::Left(
        format!(
            "its `{key}` takes values from Codex's own environment, which the desk does not \
             have; register it with `countersign server add` instead"
        )
        .into(),
    )
}

/// Sets `key` to `value`, keeping the spaces and comment around the old value.
fn set_keeping_decor(entry: &mut dyn TableLike, key: &str, mut value: Value) {
    match entry.get_mut(key).and_then(Item::as_value_mut) {
        Some(old) => {
            *value.decor_mut() = old.decor().clone();
            *old = value;
        }
        None => {
            entry.insert(key, Item::Value(value));
        }
    }
}

/// The file with each entry in `names` rewritten to `program mcp --server NAME`.
pub(super) fn rewrite(
    text: &str,
    names: &[(EntryAt, String)],
    program: &str,
) -> Result<String, EditError> {
    let mut doc = parse(text)?;
    for (at, name) in names {
        let entry = doc
            .get_mut(SERVERS)
            .and_then(Item::as_table_like_mut)
            .and_then(|servers| servers.get_mut(&at.key))
            .and_then(Item::as_table_like_mut)
            .ok_or_else(|| EditError::Gone { at: at.clone() })?;
        set_keeping_decor(entry, "command", Value::from(program));
        let args: Array = gateway_args(name).into_iter().collect();
        set_keeping_decor(entry, "args", Value::Array(args));
        for key in REACH_KEYS {
            entry.remove(key);
        }
    }
    Ok(doc.to_string())
}

fn parse_spanned(text: &str) -> Result<Document<&str>, ParseError> {
    Document::parse(text).map_err(|e| reduced(text, &e))
}

/// Every table header of `table` and below: where its text starts (the comments and blank
/// lines above it, which `toml_edit` keeps with it) and its path.
fn headers(table: &Table, path: &[String], out: &mut Vec<(usize, Vec<String>)>) {
    for (key, item) in table.iter() {
        let mut here = path.to_vec();
        here.push(key.to_owned());
        let header = |t: &Table, here: Vec<String>, out: &mut Vec<(usize, Vec<String>)>| {
            if !t.is_implicit()
                && !t.is_dotted()
                && let Some(span) = t.span()
            {
                let start = t
                    .decor()
                    .prefix()
                    .and_then(|p| p.span())
                    .map_or(span.start, |p| p.start.min(span.start));
                out.push((start, here.clone()));
            }
            headers(t, &here, out);
        };
        match item {
            Item::Table(t) => header(t, here, out),
            Item::ArrayOfTables(tables) => {
                for (i, t) in tables.iter().enumerate() {
                    let mut one = here.clone();
                    one.push(format!("[{i}]"));
                    header(t, one, out);
                }
            }
            _ => {}
        }
    }
}

/// Where each entry's text is, for uninstall: each table of the entry (from the comments above
/// its header to the next table's), or its `key = { ... }` when it is an inline table. An entry
/// written with dotted keys has no pieces, and is restored only with the whole file.
pub(super) fn pieces(text: &str) -> Result<Vec<(EntryAt, Vec<Piece>)>, ParseError> {
    let doc = parse_spanned(text)?;
    let mut starts = Vec::new();
    headers(doc.as_table(), &[], &mut starts);
    starts.sort();
    let end_of_tables = doc
        .trailing()
        .span()
        .map_or(text.len(), |s| s.start)
        .max(starts.last().map_or(0, |(s, _)| *s));
    let sections: Vec<(Range<usize>, &Vec<String>)> = starts
        .iter()
        .enumerate()
        .map(|(i, (start, path))| {
            let end = starts.get(i + 1).map_or(end_of_tables, |(next, _)| *next);
            (*start..end, path)
        })
        .collect();
    let Some(servers) = doc.get(SERVERS).and_then(Item::as_table_like) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (key, item) in servers.iter() {
        let at = EntryAt {
            parents: vec![SERVERS.to_owned()],
            key: key.to_owned(),
        };
        let pieces = match item {
            Item::Table(t) if !t.is_dotted() => sections
                .iter()
                .filter(|(_, path)| path.len() >= 2 && path[0] == SERVERS && path[1] == key)
                .map(|(range, path)| Piece {
                    id: path.join("\u{0}"),
                    range: range.clone(),
                })
                .collect(),
            Item::Value(value) => match (servers.key(key).and_then(|k| k.span()), value.span()) {
                (Some(k), Some(v)) if k.start <= v.end => vec![Piece {
                    id: "=".into(),
                    range: k.start..v.end,
                }],
                _ => Vec::new(),
            },
            _ => Vec::new(),
        };
        out.push((at, pieces));
    }
    Ok(out)
}

fn plain_value(value: &Value) -> serde_json::Value {
    match value {
        Value::String(s) => json!(s.value()),
        Value::Integer(i) => json!(i.value()),
        Value::Float(f) => json!({"$float": f.value().to_string()}),
        Value::Boolean(b) => json!(b.value()),
        Value::Datetime(d) => json!({"$datetime": d.value().to_string()}),
        Value::Array(a) => a.iter().map(plain_value).collect(),
        Value::InlineTable(t) => t
            .iter()
            .map(|(k, v)| (k.to_owned(), plain_value(v)))
            .collect(),
    }
}

fn plain_item(item: &Item) -> serde_json::Value {
    match item {
        Item::None => serde_json::Value::Null,
        Item::Value(v) => plain_value(v),
        Item::Table(t) => t
            .iter()
            .map(|(k, v)| (k.to_owned(), plain_item(v)))
            .collect(),
        Item::ArrayOfTables(a) => a
            .iter()
            .map(|t| {
                let map: serde_json::Map<String, serde_json::Value> = t
                    .iter()
                    .map(|(k, v)| (k.to_owned(), plain_item(v)))
                    .collect();
                serde_json::Value::Object(map)
            })
            .collect(),
    }
}

/// The file as data, for uninstall to compare.
pub(super) fn plain(text: &str) -> Result<serde_json::Value, ParseError> {
    Ok(plain_item(parse_spanned(text)?.as_item()))
}

/// `text` with the original tables of a gone entry added at its end; an entry that was an
/// inline table is not put back (it would land in whichever table ends the file).
pub(super) fn place(text: &str, pieces: &[(String, &str)]) -> Result<String, PutBackError> {
    if pieces.iter().any(|(id, _)| id == "=") {
        return Err(PutBackError::GoneInsideTable);
    }
    let mut out = text.to_owned();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    for (_, piece) in pieces {
        out.push_str(piece);
    }
    Ok(out)
}
