//! Properties of the canonical hash and the rendering, over arbitrary JSON.
//!
//! Key order and whitespace in the text an agent sends never change the hash; any change of a
//! value or of its type does, and changes the rendered preflight too, so the token binds exactly
//! what the person read.

use countersign_core::canonical::{self, MAX_SAFE_INTEGER};
use countersign_core::plan::Plan;
use countersign_core::render::plan_text;
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Map, Number, Value, json};

fn arb_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-(MAX_SAFE_INTEGER as i64)..=(MAX_SAFE_INTEGER as i64)).prop_map(|i| json!(i)),
        any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        any::<String>().prop_map(Value::String),
        "[a-z\\u{202e}\\u{200b} é😂]{0,6}".prop_map(Value::String),
    ]
}

fn arb_json() -> impl Strategy<Value = Value> {
    arb_leaf().prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn next(seed: &mut u64) -> usize {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*seed >> 33) as usize
}

/// Writes `value` as JSON text with object members in an order driven by `seed` and with
/// whitespace sprinkled between tokens, the way different clients might send it.
fn scramble(value: &Value, seed: &mut u64, out: &mut String) {
    let ws = [" ", "", "\n  ", "\t", ""];
    out.push_str(ws[next(seed) % ws.len()]);
    match value {
        Value::Object(map) => {
            let mut members: Vec<_> = map.iter().collect();
            for i in (1..members.len()).rev() {
                members.swap(i, next(seed) % (i + 1));
            }
            out.push('{');
            for (i, (k, v)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::to_string(k).unwrap());
                out.push_str(ws[next(seed) % ws.len()]);
                out.push(':');
                scramble(v, seed, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                scramble(v, seed, out);
            }
            out.push(']');
        }
        other => out.push_str(&serde_json::to_string(other).unwrap()),
    }
    out.push_str(ws[next(seed) % ws.len()]);
}

fn plan(details: Value) -> Plan {
    Plan {
        tool: "t".into(),
        target: "x".into(),
        action: "a".into(),
        summary: "s".into(),
        details,
        reversible: true,
    }
}

/// Paths (as JSON pointers) to every node of `value`.
fn pointers(value: &Value, here: String, out: &mut Vec<String>) {
    out.push(here.clone());
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                pointers(
                    v,
                    format!("{here}/{}", k.replace('~', "~0").replace('/', "~1")),
                    out,
                );
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                pointers(v, format!("{here}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// A different value, or the same-looking value with another type.
fn mutate(value: &Value, kind: usize) -> Value {
    match (value, kind % 2) {
        (Value::Null, 0) => json!(false),
        (Value::Null, _) => json!("null"),
        (Value::Bool(b), 0) => json!(!b),
        (Value::Bool(b), _) => json!(b.to_string()),
        (Value::Number(n), 0) => {
            let mut text = String::new();
            canonical::write_number(&mut text, n).unwrap();
            json!(text)
        }
        (Value::Number(n), _) => match n.as_f64() {
            Some(f) if f.abs() < 1e15 => json!(f + 1.0),
            _ => json!(0),
        },
        (Value::String(s), 0) => json!(format!("{s}!")),
        (Value::String(s), _) => match s.parse::<i64>() {
            Ok(_) => json!([s]),
            Err(_) => json!(s.len()),
        },
        (Value::Array(items), 0) => {
            let mut items = items.clone();
            items.push(Value::Null);
            Value::Array(items)
        }
        (Value::Array(_), _) => json!({}),
        (Value::Object(map), 0) => {
            let mut map = map.clone();
            let mut k = String::from("added");
            while map.contains_key(&k) {
                k.push('_');
            }
            map.insert(k, Value::Null);
            Value::Object(map)
        }
        (Value::Object(_), _) => json!([]),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn key_order_and_whitespace_never_change_the_hash(value in arb_json(), seed in any::<u64>()) {
        let mut text = String::new();
        let mut s = seed;
        scramble(&value, &mut s, &mut text);
        let reparsed = canonical::parse_strict(&text).unwrap();
        prop_assert_eq!(plan(reparsed.clone()).hash().unwrap(), plan(value.clone()).hash().unwrap());
        prop_assert_eq!(plan_text(&plan(reparsed)), plan_text(&plan(value)));
    }

    #[test]
    fn any_change_of_a_value_or_its_type_changes_hash_and_rendering(
        value in arb_json(), at in any::<Index>(), kind in 0usize..2,
    ) {
        let mut paths = Vec::new();
        pointers(&value, String::new(), &mut paths);
        let path = at.get(&paths);
        let mut changed = value.clone();
        let slot = if path.is_empty() { &mut changed } else { changed.pointer_mut(path).unwrap() };
        *slot = mutate(slot, kind);
        let (before, after) = (plan(value), plan(changed));
        prop_assert_ne!(before.hash().unwrap(), after.hash().unwrap());
        prop_assert_ne!(plan_text(&before), plan_text(&after));
    }

    #[test]
    fn canonical_text_is_a_fixed_point(value in arb_json()) {
        let once = canonical::to_string(&value).unwrap();
        let twice = canonical::to_string(&canonical::parse_strict(&once).unwrap()).unwrap();
        prop_assert_eq!(once, twice);
    }
}
