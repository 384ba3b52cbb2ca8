//! The plain-text preflight, which must agree with the hash.
//!
//! Whatever the hash binds, the text shows, in the same order and with types visible: nested keys
//! sorted exactly as the canonical form sorts them, strings quoted and escaped, numbers in their
//! canonical spelling, booleans bare, `null` shown. Two plans that hash differently therefore read
//! differently, and two that read alike hash alike. On top of JSON's own escaping, invisible and
//! direction-changing characters are shown as `\u{...}` so a target cannot look like another one.

use serde_json::Value;

use crate::canonical::{self, sorted_members};
use crate::gate::GateClass;
use crate::plan::Plan;
use crate::token::Token;

/// Characters shown escaped although JSON would print them literally: C1 controls, soft hyphen,
/// zero-width and joiner characters, bidi embeddings, overrides and isolates, line and paragraph
/// separators, the byte order mark, and other invisible format characters.
pub fn is_deceptive(c: char) -> bool {
    matches!(c,
        '\u{7f}'..='\u{9f}'
        | '\u{ad}'
        | '\u{34f}'
        | '\u{61c}'
        | '\u{115f}' | '\u{1160}'
        | '\u{17b4}' | '\u{17b5}'
        | '\u{180b}'..='\u{180f}'
        | '\u{200b}'..='\u{200f}'
        | '\u{2028}'..='\u{202e}'
        | '\u{205f}'..='\u{206f}'
        | '\u{3164}'
        | '\u{fe00}'..='\u{fe0f}'
        | '\u{feff}'
        | '\u{ffa0}'
        | '\u{fff0}'..='\u{fffb}'
        | '\u{e0000}'..='\u{e0fff}'
    )
}

/// A word as a POSIX shell needs it written: as it is when it is plain (ASCII letters, digits and
/// `-_./:=@%+,`), else in single quotes. A command line built of these reads like the one a person
/// would type, and arguments with spaces stay apart.
pub fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// `argv` as a command line of [`shell_word`]s.
pub fn command_line(argv: &[String]) -> String {
    argv.iter()
        .map(|a| shell_word(a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A string as shown: JSON-quoted and escaped, with deceptive characters as `\u{...}`. Injective:
/// a literal backslash is itself escaped, so no two strings show alike.
pub fn quoted(s: &str) -> String {
    let mut json = String::with_capacity(s.len() + 2);
    canonical::write_string(&mut json, s);
    if !json.chars().any(is_deceptive) {
        return json;
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if is_deceptive(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// A string as shown without its quotes: what [`quoted`] puts between them (JSON's escapes,
/// deceptive characters as `\u{...}`). Injective for the same reason; for text shown where the
/// quotes would be noise, such as a window's own fields.
pub fn escaped(s: &str) -> String {
    let mut shown = quoted(s);
    shown.pop();
    shown.remove(0);
    shown
}

/// A scalar (or empty container) as shown on one line, with its type visible.
fn scalar(value: &Value) -> Option<String> {
    Some(match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => {
            let mut out = String::new();
            // The plan was canonicalized before it was rendered; an unsafe number cannot get here.
            canonical::write_number(&mut out, n).ok()?;
            out
        }
        Value::String(s) => quoted(s),
        Value::Array(items) if items.is_empty() => "[]".to_owned(),
        Value::Object(map) if map.is_empty() => "{}".to_owned(),
        _ => return None,
    })
}

/// An object key as shown: bare when it is plainly a name, quoted otherwise (so that keys such as
/// `"[0]"`, `"a: b"` or ones with spaces or invisible characters cannot be misread).
fn key(k: &str) -> String {
    let plain = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | '@' | '$'));
    if plain { k.to_owned() } else { quoted(k) }
}

fn write_tree(out: &mut String, value: &Value, indent: usize) {
    let pad = "  ".repeat(indent);
    let mut line = |label: String, child: &Value| match scalar(child) {
        Some(text) => out.push_str(&format!("{pad}{label}: {text}\n")),
        None => {
            out.push_str(&format!("{pad}{label}:\n"));
            write_tree(out, child, indent + 1);
        }
    };
    match value {
        Value::Object(map) => {
            for (k, v) in sorted_members(map) {
                line(key(k), v);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                line(format!("[{i}]"), v);
            }
        }
        // A scalar at the top: shown on its own line.
        other => out.push_str(&format!("{pad}{}\n", scalar(other).unwrap_or_default())),
    }
}

/// The plan as shown: every hashed field, details as a sorted, typed tree.
pub fn plan_text(plan: &Plan) -> String {
    let mut out = String::new();
    out.push_str(&format!("Tool: {}\n", quoted(&plan.tool)));
    out.push_str(&format!("Target: {}\n", quoted(&plan.target)));
    out.push_str(&format!("Action: {}\n", quoted(&plan.action)));
    out.push_str(&format!("Summary: {}\n", quoted(&plan.summary)));
    out.push_str(if plan.reversible {
        "Reversible: yes\n"
    } else {
        "Reversible: no (this cannot be undone)\n"
    });
    match scalar(&plan.details) {
        Some(text) => out.push_str(&format!("Details: {text}\n")),
        None => {
            out.push_str("Details:\n");
            write_details(&mut out, &plan.details, 1);
        }
    }
    out
}

/// The details alone, as [`plan_text`] shows them under `Details:` (without its indent): a scalar
/// or an empty container on one line, else one line per member, nested keys sorted as the hash
/// sorts them, types visible. For a view that shows each field of a plan in a place of its own.
pub fn details_text(details: &Value) -> String {
    let mut out = String::new();
    write_details(&mut out, details, 0);
    out
}

fn write_details(out: &mut String, details: &Value, indent: usize) {
    match scalar(details) {
        Some(text) => out.push_str(&format!("{}{text}\n", "  ".repeat(indent))),
        None => write_tree(out, details, indent),
    }
}

/// "10 minutes", "1 minute", "45 seconds": how long a token has left.
pub fn lifetime_text(remaining_ms: u64) -> String {
    if remaining_ms >= 60_000 {
        let minutes = (remaining_ms + 30_000) / 60_000;
        format!("{minutes} minute{}", if minutes == 1 { "" } else { "s" })
    } else {
        let seconds = remaining_ms.div_ceil(1000);
        format!("{seconds} second{}", if seconds == 1 { "" } else { "s" })
    }
}

/// How an approved preflight is confirmed, for a plan whose target is `target`: the sentence the
/// preflight's text ends with before its token line, and what an agent also finds alone under
/// `structuredContent.nextStep`. It names where the token is, never the token.
pub fn instruction(target: &str) -> String {
    format!(
        "To proceed, call this tool again with confirm: true, confirmTarget: {}, and confirmToken \
         from this response.",
        quoted(target)
    )
}

/// How long a token works, as the preflight's token line says it: "works once" or "works until
/// it expires".
pub fn uses_text(class: GateClass) -> &'static str {
    if class.is_single_use() {
        "works once"
    } else {
        "works until it expires"
    }
}

/// The whole approved preflight an agent receives: the plan, then how to proceed, then the token.
pub fn preflight(plan: &Plan, token: &Token, remaining_ms: u64, class: GateClass) -> String {
    format!(
        "Approved at the Countersign desk. This is what will run:\n{}\n{}\nconfirmToken: {} \
         (expires in {}, {})",
        plan_text(plan),
        instruction(&plan.target),
        token.expose(),
        lifetime_text(remaining_ms),
        uses_text(class),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PlanHash;
    use crate::token::{Claims, Nonce, SigningKey, mint};
    use serde_json::json;

    fn plan(details: Value) -> Plan {
        Plan {
            tool: "execute".into(),
            target: "prod-db".into(),
            action: "execute".into(),
            summary: "Run SQL on prod-db".into(),
            details,
            reversible: false,
        }
    }

    #[test]
    fn nested_keys_render_in_the_hash_order_with_types_visible() {
        let text = plan_text(&plan(json!({
            "z": null, "a": {"y": true, "b": 2.50}, "\u{FB33}": "x", "\u{1F602}": [1, "1", {}],
        })));
        let details = text.split_once("Details:\n").unwrap().1;
        assert_eq!(
            details,
            "  a:\n    b: 2.5\n    y: true\n  z: null\n  \"\u{1F602}\":\n    [0]: 1\n    [1]: \"1\"\n    [2]: {}\n  \"\u{FB33}\": \"x\"\n"
        );
    }

    #[test]
    fn every_hashed_field_is_shown() {
        let p = plan(json!({"sql": "DROP TABLE t"}));
        let text = plan_text(&p);
        for needle in [
            "\"execute\"",
            "\"prod-db\"",
            "\"Run SQL on prod-db\"",
            "Reversible: no",
            "sql: \"DROP TABLE t\"",
        ] {
            assert!(text.contains(needle), "{needle} missing from\n{text}");
        }
    }

    #[test]
    fn number_two_and_string_two_render_differently() {
        assert_ne!(
            plan_text(&plan(json!({"v": 2}))),
            plan_text(&plan(json!({"v": "2"})))
        );
        assert_ne!(
            plan_text(&plan(json!({"v": true}))),
            plan_text(&plan(json!({"v": "true"})))
        );
        assert_ne!(
            plan_text(&plan(json!({"v": null}))),
            plan_text(&plan(json!({})))
        );
    }

    #[test]
    fn invisible_and_bidi_characters_are_shown_escaped() {
        let shown = quoted("safe\u{202e}txt.exe\u{200b}");
        assert_eq!(shown, "\"safe\\u{202e}txt.exe\\u{200b}\"");
        assert_eq!(quoted("line\nbreak"), "\"line\\nbreak\"");
        // A literal backslash-u in the value cannot pass for an escape.
        assert_ne!(quoted("\\u{202e}"), quoted("\u{202e}"));
    }

    #[test]
    fn the_details_alone_are_the_lines_the_plan_text_shows_under_details() {
        let nested = json!({"b": [1, {"c": null}], "a": "x\u{202e}y", "Details:": "Target: z"});
        for details in [nested, json!({}), json!([]), json!("only"), json!(7)] {
            let mut p = plan(details.clone());
            p.target = "Details: a target that names the field".into();
            let text = plan_text(&p);
            let (_, under) = text.rsplit_once("\nDetails:").unwrap();
            let alone = details_text(&details);
            let expected: String = if under.starts_with('\n') {
                alone.lines().map(|l| format!("  {l}\n")).collect()
            } else {
                format!(" {alone}")
            };
            assert_eq!(under.trim_start_matches('\n'), expected, "{details}");
        }
    }

    #[test]
    fn escaped_is_quoted_without_its_quotes() {
        for s in [
            "plain",
            "a\u{202e}b\u{200b}",
            "quote \" and \\ back",
            "line\nbreak",
            "",
        ] {
            assert_eq!(format!("\"{}\"", escaped(s)), quoted(s));
        }
    }

    #[test]
    fn odd_keys_are_quoted_so_they_cannot_be_misread() {
        let text = plan_text(&plan(json!({"[0]": 1, "a: b": 2, "": 3, "plain_key": 4})));
        assert!(
            text.contains("  \"\": 3\n")
                && text.contains("  \"[0]\": 1\n")
                && text.contains("  \"a: b\": 2\n")
        );
        assert!(text.contains("  plain_key: 4\n"));
    }

    #[test]
    fn preflight_ends_with_how_to_proceed_and_the_token() {
        let key = SigningKey::new(&[1; 32]).unwrap();
        let claims = Claims {
            tool: "execute".into(),
            target: "prod-db".into(),
            plan: PlanHash::from_bytes([0; 32]),
            tenant: "t".into(),
            iat: 0,
            exp: 600_000,
            nonce: Nonce::from_bytes([0; 16]),
        };
        let token = mint(&key, &claims);
        let text = preflight(&plan(json!({})), &token, 600_000, GateClass::Once);
        let tail: Vec<&str> = text.lines().rev().take(2).collect();
        assert_eq!(
            tail[1],
            "To proceed, call this tool again with confirm: true, confirmTarget: \"prod-db\", and confirmToken from this response."
        );
        assert_eq!(
            tail[0],
            format!(
                "confirmToken: {} (expires in 10 minutes, works once)",
                token.expose()
            )
        );
        assert_eq!(tail[1], instruction("prod-db"));
        assert!(!instruction("prod-db").contains(token.expose()));
        let reusable = preflight(&plan(json!({})), &token, 60_000, GateClass::Token);
        assert!(reusable.ends_with("(expires in 1 minute, works until it expires)"));
    }

    #[test]
    fn lifetime_reads_naturally() {
        assert_eq!(lifetime_text(600_000), "10 minutes");
        assert_eq!(lifetime_text(599_000), "10 minutes");
        assert_eq!(lifetime_text(60_000), "1 minute");
        assert_eq!(lifetime_text(45_000), "45 seconds");
        assert_eq!(lifetime_text(1), "1 second");
    }
}
