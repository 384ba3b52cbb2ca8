//! The one way a string from an agent or an upstream reaches a screen ([`shown`]): escaped by
//! the preflight text's own rule, and flagged with why it may look like something it is not.
//! The desk's window and the team server's approvers' page both show strings through it, so a
//! person sees the same escapes and the same flags on either.

use crate::render;
use serde::Serialize;
use serde_json::Value;

/// Why a string deserves a second look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Flag {
    /// It holds characters that change the direction of the text around them (shown escaped).
    Bidi,
    /// It holds invisible characters: zero-width, joiners, the byte order mark... (shown escaped).
    Invisible,
    /// It holds characters beyond ASCII, which may look like others (`а` for `a`).
    NonAscii,
}

/// A string from an agent or an upstream, as the window shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Shown {
    /// The text to put on screen: JSON's escapes (a backslash doubled, a quote and control
    /// characters escaped) and every invisible or direction-changing character as `\u{...}`.
    pub text: String,
    /// Why the original deserves a second look; empty when it is plain ASCII.
    pub flags: Vec<Flag>,
}

fn is_bidi(c: char) -> bool {
    matches!(c, '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn add_flags(flags: &mut Vec<Flag>, s: &str) {
    let mut add = |flag| {
        if !flags.contains(&flag) {
            flags.push(flag);
        }
    };
    if s.chars().any(is_bidi) {
        add(Flag::Bidi);
    }
    if s.chars().any(|c| render::is_deceptive(c) && !is_bidi(c)) {
        add(Flag::Invisible);
    }
    if !s.is_ascii() {
        add(Flag::NonAscii);
    }
    flags.sort();
}

/// The one way a string from an agent or an upstream reaches the screen: escaped as the preflight
/// text escapes it, and flagged.
pub fn shown(s: &str) -> Shown {
    let mut flags = Vec::new();
    add_flags(&mut flags, s);
    Shown {
        text: render::escaped(s),
        flags,
    }
}

/// The plan's details as shown: the lines the preflight text shows under `Details:`, each string
/// in them escaped by the same rule as [`shown`], flagged for every key and string inside.
pub fn shown_details(details: &Value) -> Shown {
    fn walk(flags: &mut Vec<Flag>, value: &Value) {
        match value {
            Value::String(s) => add_flags(flags, s),
            Value::Array(items) => items.iter().for_each(|v| walk(flags, v)),
            Value::Object(map) => map.iter().for_each(|(k, v)| {
                add_flags(flags, k);
                walk(flags, v);
            }),
            _ => {}
        }
    }
    let mut flags = Vec::new();
    walk(&mut flags, details);
    Shown {
        text: render::details_text(details),
        flags,
    }
}

/// The agent as it names itself in `clientInfo`: its name and version, or `unknown agent`.
pub fn agent_name(client_info: &Value) -> String {
    let name = client_info
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("unknown agent");
    match client_info.get("version").and_then(Value::as_str) {
        Some(v) => format!("{name} {v}"),
        None => name.to_owned(),
    }
}

impl Shown {
    /// The text for a surface that reads markup (a desktop notification's body, which a
    /// freedesktop notification server may render as HTML-like markup): `&`, `<` and `>` as
    /// entities on top of the escaping already done.
    pub fn markup(&self) -> String {
        let mut out = String::with_capacity(self.text.len());
        for c in self.text.chars() {
            match c {
                '&' => out.push_str("&amp;"),
                '<' => out.push_str("&lt;"),
                '>' => out.push_str("&gt;"),
                c => out.push(c),
            }
        }
        out
    }
}
