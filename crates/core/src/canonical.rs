//! RFC 8785 (JSON Canonicalization Scheme) for plans.
//!
//! A plan hash must be recomputable by anyone, in any language, from what history records, and it
//! must keep every value's type (`2` is not `"2"`, `null` is not a missing key), because the window
//! shows types and a token must bind what the person read. JCS gives exactly that: object members
//! sorted by their UTF-16 code units, no whitespace, ECMAScript number formatting, minimal string
//! escaping. On top of RFC 8785 this module refuses what would make the hash lie or the process
//! fall over: duplicate keys and lone surrogates in raw text ([`parse_strict`]), integers beyond
//! ±(2^53−1) that an IEEE double would silently round, non-finite numbers, nesting deeper than
//! [`MAX_DEPTH`] and canonical text larger than [`MAX_BYTES`] — each a clear error, never a panic
//! or a stack overflow.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// The deepest nesting of arrays and objects accepted, counting the outermost container as 1.
/// A plan's own object is one level, so its details may nest [`MAX_DEPTH`] − 1 deep.
pub const MAX_DEPTH: usize = 64;
/// The largest canonical text accepted, in bytes (8 MiB). Also bounds the raw text
/// [`parse_strict`] reads.
pub const MAX_BYTES: usize = 8 * 1024 * 1024;
/// The largest integer magnitude an IEEE double holds exactly (2^53 − 1).
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Why a value cannot be canonicalized (and so cannot be planned or approved).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CanonicalError {
    /// Arrays and objects nest deeper than [`MAX_DEPTH`].
    #[error("value nests deeper than {limit} levels")]
    TooDeep {
        /// The limit that was passed.
        limit: usize,
    },
    /// The canonical text (or the raw input) is larger than [`MAX_BYTES`].
    #[error("value is larger than {limit} bytes")]
    TooLarge {
        /// The limit that was passed.
        limit: usize,
    },
    /// The same key appears twice in one object of the raw text.
    #[error("duplicate key {0:?} in one object")]
    DuplicateKey(String),
    /// An integer outside ±(2^53−1), which would silently round to another number.
    #[error("integer {0} is beyond ±(2^53-1) and would silently round")]
    UnsafeInteger(String),
    /// NaN or an infinity: JSON has no spelling for them.
    #[error("number is not finite")]
    NonFinite,
    /// The raw text is not JSON (this includes lone surrogates and trailing data).
    #[error("not valid JSON: {0}")]
    InvalidJson(String),
}

/// The canonical (RFC 8785) text of `value`.
pub fn to_string(value: &Value) -> Result<String, CanonicalError> {
    let mut out = String::new();
    write_value(&mut out, value, 0)?;
    Ok(out)
}

fn write_value(out: &mut String, value: &Value, depth: usize) -> Result<(), CanonicalError> {
    if out.len() > MAX_BYTES {
        return Err(CanonicalError::TooLarge { limit: MAX_BYTES });
    }
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => write_number(out, n)?,
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            let depth = enter(depth)?;
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item, depth)?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            let depth = enter(depth)?;
            out.push('{');
            for (i, (key, item)) in sorted_members(map).into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, key);
                out.push(':');
                write_value(out, item, depth)?;
            }
            out.push('}');
        }
    }
    if out.len() > MAX_BYTES {
        return Err(CanonicalError::TooLarge { limit: MAX_BYTES });
    }
    Ok(())
}

fn enter(depth: usize) -> Result<usize, CanonicalError> {
    if depth >= MAX_DEPTH {
        Err(CanonicalError::TooDeep { limit: MAX_DEPTH })
    } else {
        Ok(depth + 1)
    }
}

/// Object members in RFC 8785 order: keys compared as UTF-16 code units. This differs from
/// byte (or code point) order for characters outside the Basic Multilingual Plane.
pub fn sorted_members(map: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut members: Vec<(&String, &Value)> = map.iter().collect();
    members.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
    members
}

/// Writes a string as ECMAScript's `JSON.stringify` does: only `"`, `\` and C0 controls escaped,
/// with the short forms where they exist and lowercase `\u00xx` otherwise.
pub fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.push_str("\\u00");
                out.push(HEX[(c as usize) >> 4] as char);
                out.push(HEX[(c as usize) & 15] as char);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Writes a number in ECMAScript's `Number.prototype.toString` form, refusing what would not
/// survive a round trip through an IEEE double.
pub fn write_number(out: &mut String, n: &Number) -> Result<(), CanonicalError> {
    let integer = n
        .as_u64()
        .map(|u| (u, false))
        .or_else(|| n.as_i64().map(|i| (i.unsigned_abs(), true)));
    match integer {
        Some((magnitude, _)) if magnitude <= MAX_SAFE_INTEGER => out.push_str(&n.to_string()),
        Some(_) => out.push_str(&exact_as_double(&n.to_string())?),
        None => write_f64(out, n.as_f64().ok_or(CanonicalError::NonFinite)?)?,
    }
    Ok(())
}

/// An integer beyond ±(2^53−1) is accepted only when its canonical spelling is its own decimal
/// text, i.e. when reading it as a double and writing it back loses nothing (`9007199254740992`,
/// or `862744801135835000`, which is how RFC 8785 itself writes a large double). Anything else,
/// such as `9007199254740993`, would silently become another number and is refused.
fn exact_as_double(decimal: &str) -> Result<String, CanonicalError> {
    let unsafe_integer = || CanonicalError::UnsafeInteger(decimal.to_owned());
    let f: f64 = decimal.parse().map_err(|_| unsafe_integer())?;
    let mut canonical = String::new();
    write_f64(&mut canonical, f).map_err(|_| unsafe_integer())?;
    if canonical == decimal {
        Ok(canonical)
    } else {
        Err(unsafe_integer())
    }
}

/// Checks every integer literal of (valid) JSON text with [`exact_as_double`]. Needed because a
/// plain parse turns literals beyond 64 bits into doubles silently, before any visitor sees them.
fn check_integer_literals(text: &str) -> Result<(), CanonicalError> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < bytes.len()
                    && matches!(bytes[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                let literal = &text[start..i];
                let digits = literal.trim_start_matches('-');
                // 15 digits always fit below 2^53; only longer integer literals need a look.
                if digits.len() > 15 && digits.bytes().all(|b| b.is_ascii_digit()) {
                    let magnitude_safe = digits.parse::<u64>().is_ok_and(|m| m <= MAX_SAFE_INTEGER);
                    if !magnitude_safe {
                        exact_as_double(literal)?;
                    }
                }
            }
            _ => i += 1,
        }
    }
    Ok(())
}

fn write_f64(out: &mut String, f: f64) -> Result<(), CanonicalError> {
    if !f.is_finite() {
        return Err(CanonicalError::NonFinite);
    }
    if f == 0.0 {
        // Both zeros print as "0".
        out.push('0');
        return Ok(());
    }
    if f < 0.0 {
        out.push('-');
    }
    // Rust's `{:e}` gives the shortest digits that round-trip, as ECMAScript requires; only the
    // layout differs, so take the digits and the exponent and lay them out ECMAScript's way.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exponent) = sci.split_once('e').expect("{:e} always has an exponent");
    let exponent: i32 = exponent.parse().expect("{:e} writes a decimal exponent");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let k = digits.len() as i32;
    let n = exponent + 1;
    if k <= n && n <= 21 {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        out.push_str(&digits[..n as usize]);
        out.push('.');
        out.push_str(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(&digits);
    } else {
        out.push_str(&digits[..1]);
        if k > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if n - 1 < 0 { '-' } else { '+' });
        out.push_str(&(n - 1).abs().to_string());
    }
    Ok(())
}

/// Parses raw JSON text, refusing what a plain parse would silently accept: duplicate keys (a
/// plain parse keeps the last, so the hash would bind a value the sender may not have meant),
/// nesting deeper than [`MAX_DEPTH`], text larger than [`MAX_BYTES`], integers beyond ±(2^53−1).
/// Lone surrogates and trailing data are refused as invalid JSON.
pub fn parse_strict(text: &str) -> Result<Value, CanonicalError> {
    if text.len() > MAX_BYTES {
        return Err(CanonicalError::TooLarge { limit: MAX_BYTES });
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let value = StrictSeed { depth: 0 }
        .deserialize(&mut de)
        .map_err(classify)?;
    de.end().map_err(classify)?;
    // Only now is the text known to be JSON, which the literal scan relies on.
    check_integer_literals(text)?;
    Ok(value)
}

/// Turns serde_json's error back into our typed error when it carries one of ours.
fn classify(err: serde_json::Error) -> CanonicalError {
    let text = err.to_string();
    for (prefix, build) in [
        (
            TOO_DEEP,
            (|_| CanonicalError::TooDeep { limit: MAX_DEPTH }) as fn(&str) -> CanonicalError,
        ),
        (DUPLICATE, |rest| {
            CanonicalError::DuplicateKey(rest.to_owned())
        }),
    ] {
        if let Some(rest) = text.strip_prefix(prefix) {
            // serde_json appends " at line L column C"; the payload ends before it.
            let rest = rest.rsplit_once(" at line ").map_or(rest, |(r, _)| r);
            return build(rest);
        }
    }
    CanonicalError::InvalidJson(text)
}

const TOO_DEEP: &str = "countersign:too-deep:";
const DUPLICATE: &str = "countersign:duplicate-key:";

struct StrictSeed {
    depth: usize,
}

impl StrictSeed {
    fn child<E: de::Error>(&self) -> Result<StrictSeed, E> {
        enter(self.depth)
            .map(|depth| StrictSeed { depth })
            .map_err(|_| E::custom(TOO_DEEP))
    }
}

impl<'de> DeserializeSeed<'de> for StrictSeed {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictSeed {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    // Integers beyond the safe range are kept as they came; `write_number` decides whether they
    // are exact doubles, and `check_integer_literals` covers the ones a parse turns into doubles.
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("number is not finite"))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self.child()?)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            let value = access.next_value_seed(self.child()?)?;
            if map.contains_key(&key) {
                return Err(de::Error::custom(format_args!("{DUPLICATE}{key}")));
            }
            map.insert(key, value);
        }
        Ok(Value::Object(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canon(text: &str) -> Result<String, CanonicalError> {
        to_string(&parse_strict(text)?)
    }

    #[test]
    fn numbers_print_as_ecmascript_does() {
        for (input, expected) in [
            ("0", "0"),
            ("-0.0", "0"),
            ("1", "1"),
            ("-1", "-1"),
            ("56.0", "56"),
            ("4.50", "4.5"),
            ("2e-3", "0.002"),
            ("1E30", "1e+30"),
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("123456789012345680000", "123456789012345680000"),
            ("0.000001", "0.000001"),
            ("0.0000001", "1e-7"),
            ("1.5e-7", "1.5e-7"),
            ("-1.25e+25", "-1.25e+25"),
            ("333333333.33333329", "333333333.3333333"),
            ("0.000000000000000000000000001", "1e-27"),
            ("9007199254740991", "9007199254740991"),
            ("-9007199254740991", "-9007199254740991"),
            ("5e-324", "5e-324"),
            // Correct rounding of long literals needs serde_json's `float_roundtrip`.
            ("1.2345678901234568e20", "123456789012345680000"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
        ] {
            assert_eq!(canon(input).unwrap(), expected, "{input}");
        }
    }

    #[test]
    fn integers_beyond_two_to_the_53_are_refused() {
        for text in [
            "9007199254740993",
            "-9007199254740993",
            "18446744073709551615",
            "[1, {\"a\": 9007199254740993}]",
            "1152921504606846976",
            "123456789012345680001",
            "99999999999999999999999",
        ] {
            assert!(
                matches!(canon(text), Err(CanonicalError::UnsafeInteger(_))),
                "{text}"
            );
        }
        let value = json!({"big": u64::MAX});
        assert!(matches!(
            to_string(&value),
            Err(CanonicalError::UnsafeInteger(_))
        ));
        let value = json!({"big": (1u64 << 53) + 1});
        assert!(matches!(
            to_string(&value),
            Err(CanonicalError::UnsafeInteger(_))
        ));
    }

    #[test]
    fn large_integers_that_are_exact_doubles_keep_their_spelling() {
        // What RFC 8785 writes for a large double must read back as the same value.
        for text in [
            "9007199254740992",
            "-9007199254740992",
            "862744801135835000",
            "100000000000000000000",
        ] {
            assert_eq!(canon(text).unwrap(), text.trim_start_matches('+'));
        }
        assert_eq!(to_string(&json!(1u64 << 53)).unwrap(), "9007199254740992");
    }

    #[test]
    fn duplicate_keys_are_refused() {
        assert_eq!(
            canon(r#"{"a":1,"a":2}"#),
            Err(CanonicalError::DuplicateKey("a".into()))
        );
        assert_eq!(
            canon(r#"{"x":{"b":1,"b":1}}"#),
            Err(CanonicalError::DuplicateKey("b".into()))
        );
    }

    #[test]
    fn lone_surrogates_are_refused() {
        for text in [r#""\ud800""#, r#""\udc00x""#, r#"{"\ud83d":1}"#] {
            assert!(
                matches!(canon(text), Err(CanonicalError::InvalidJson(_))),
                "{text}"
            );
        }
        assert_eq!(canon(r#""\ud83d\ude02""#).unwrap(), "\"\u{1F602}\"");
    }

    #[test]
    fn non_finite_numbers_are_refused() {
        for text in ["NaN", "Infinity", "-Infinity", "1e400"] {
            assert!(canon(text).is_err(), "{text}");
        }
        let mut out = String::new();
        assert_eq!(
            write_f64(&mut out, f64::NAN),
            Err(CanonicalError::NonFinite)
        );
        assert_eq!(
            write_f64(&mut out, f64::INFINITY),
            Err(CanonicalError::NonFinite)
        );
    }

    #[test]
    fn nesting_beyond_the_limit_is_a_clear_error_not_a_stack_overflow() {
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(canon(&ok).is_ok());
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert_eq!(
            canon(&deep),
            Err(CanonicalError::TooDeep { limit: MAX_DEPTH })
        );
        // Far deeper than any stack would survive if recursion were unbounded.
        let abyss = format!("{}{}", "{\"a\":".repeat(100_000), "}".repeat(100_000));
        assert_eq!(
            canon(&abyss),
            Err(CanonicalError::TooDeep { limit: MAX_DEPTH })
        );
        // A value built in memory, not parsed, is bounded the same way.
        let mut value = json!(1);
        for _ in 0..(MAX_DEPTH + 1) {
            value = json!([value]);
        }
        assert_eq!(
            to_string(&value),
            Err(CanonicalError::TooDeep { limit: MAX_DEPTH })
        );
    }

    #[test]
    fn oversized_values_are_refused() {
        let big = json!({"blob": "x".repeat(MAX_BYTES)});
        assert_eq!(
            to_string(&big),
            Err(CanonicalError::TooLarge { limit: MAX_BYTES })
        );
        let text = format!("\"{}\"", "x".repeat(MAX_BYTES));
        assert_eq!(
            parse_strict(&text),
            Err(CanonicalError::TooLarge { limit: MAX_BYTES })
        );
    }

    #[test]
    fn trailing_data_is_refused() {
        assert!(matches!(
            canon("{} {}"),
            Err(CanonicalError::InvalidJson(_))
        ));
    }

    #[test]
    fn keys_sort_by_utf16_code_units_not_code_points() {
        // U+1F602 is D83D DE02 in UTF-16, which sorts before U+FB33 though its code point is larger.
        let text = to_string(&json!({"\u{FB33}": 1, "\u{1F602}": 2})).unwrap();
        assert_eq!(text, "{\"\u{1F602}\":2,\"\u{FB33}\":1}");
    }

    #[test]
    fn controls_are_escaped_lowercase_and_the_rest_is_literal() {
        let text = to_string(&json!("\u{0f}\n\"\\/\u{7f}\u{2028}é")).unwrap();
        assert_eq!(text, "\"\\u000f\\n\\\"\\\\/\u{7f}\u{2028}é\"");
    }
}
