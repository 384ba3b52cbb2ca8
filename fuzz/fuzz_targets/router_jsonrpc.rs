//! Structured JSON-RPC for the desk's router: well-formed messages with methods from the allow
//! lists, near misses of them (case, whitespace, look-alike and invisible characters), any id
//! type and params of every shape. The same promises as `router_bytes` hold.
#![no_main]

use arbitrary::Arbitrary;
use countersign_router::{NOTIFICATIONS, REQUESTS, Routed, route};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value, json};

#[derive(Debug, Arbitrary)]
enum Id {
    None,
    Int(i64),
    Text(String),
    Float(f64),
    Null,
    Bool(bool),
    Object,
}

#[derive(Debug, Arbitrary)]
enum Method {
    Request(u8),
    Notification(u8),
    Near(u8, u8),
    Any(String),
    Missing,
}

#[derive(Debug, Arbitrary)]
enum Params {
    None,
    Object(Vec<(String, ParamValue)>),
    Array,
    Text(String),
}

#[derive(Debug, Arbitrary)]
enum ParamValue {
    Text(String),
    Int(i64),
    Nested(Vec<(String, String)>),
    Null,
}

#[derive(Debug, Arbitrary)]
struct Message {
    version: Option<String>,
    id: Id,
    method: Method,
    params: Params,
    extra: Vec<(String, String)>,
    raw_duplicate: bool,
}

/// A near miss of an allow-listed name.
fn near(name: &str, how: u8) -> String {
    match how % 6 {
        0 => name.to_uppercase(),
        1 => format!("{name} "),
        2 => format!("{name}\u{200b}"),
        3 => name.replace('o', "\u{43e}"),
        4 => format!("{name}/extra"),
        _ => name.replace('/', "\u{2215}"),
    }
}

fn param(value: &ParamValue) -> Value {
    match value {
        ParamValue::Text(t) => json!(t),
        ParamValue::Int(i) => json!(i),
        ParamValue::Nested(pairs) => {
            Value::Object(pairs.iter().map(|(k, v)| (k.clone(), json!(v))).collect())
        }
        ParamValue::Null => Value::Null,
    }
}

fuzz_target!(|m: Message| {
    let mut object = Map::new();
    object.insert("jsonrpc".into(), json!(m.version.as_deref().unwrap_or("2.0")));
    let id = match &m.id {
        Id::None => None,
        Id::Int(i) => Some(json!(i)),
        Id::Text(t) => Some(json!(t)),
        Id::Float(f) => serde_json::Number::from_f64(*f).map(Value::Number),
        Id::Null => Some(Value::Null),
        Id::Bool(b) => Some(json!(b)),
        Id::Object => Some(json!({"id": 1})),
    };
    if let Some(id) = id {
        object.insert("id".into(), id);
    }
    let method = match &m.method {
        Method::Request(i) => Some(REQUESTS[*i as usize % REQUESTS.len()].to_owned()),
        Method::Notification(i) => {
            Some(NOTIFICATIONS[*i as usize % NOTIFICATIONS.len()].to_owned())
        }
        Method::Near(i, how) => Some(near(REQUESTS[*i as usize % REQUESTS.len()], *how)),
        Method::Any(s) => Some(s.clone()),
        Method::Missing => None,
    };
    if let Some(method) = method {
        object.insert("method".into(), json!(method));
    }
    match &m.params {
        Params::None => {}
        Params::Object(pairs) => {
            let params: Map<String, Value> =
                pairs.iter().map(|(k, v)| (k.clone(), param(v))).collect();
            object.insert("params".into(), Value::Object(params));
        }
        Params::Array => {
            object.insert("params".into(), json!([1, 2]));
        }
        Params::Text(t) => {
            object.insert("params".into(), json!(t));
        }
    }
    for (k, v) in &m.extra {
        object.entry(k.clone()).or_insert_with(|| json!(v));
    }
    let mut text = Value::Object(object).to_string();
    if m.raw_duplicate {
        // The same key twice: one reader could take the first, another the last.
        text = text.replacen('{', "{\"method\":\"tools/call\",", 1);
    }
    let judged = route(text.as_bytes());
    if m.raw_duplicate && text.matches("\"method\"").count() > 1 {
        assert!(
            !matches!(judged, Routed::Pass(_)),
            "a message with a duplicate key passed"
        );
    }
    if let Method::Near(..) = m.method
        && let Routed::Pass(message) = &judged
    {
        let typed = serde_json::to_value(&**message).unwrap();
        let name = typed.get("method").and_then(Value::as_str).unwrap_or("");
        assert!(
            REQUESTS.contains(&name) || NOTIFICATIONS.contains(&name) || name.is_empty(),
            "a near miss passed as {name}"
        );
    }
    if let Routed::Pass(message) = &judged
        && let Some(method) = serde_json::to_value(&**message)
            .unwrap()
            .get("method")
            .and_then(Value::as_str)
    {
        assert!(
            REQUESTS.contains(&method) || NOTIFICATIONS.contains(&method),
            "{method} passed but is not allow-listed"
        );
    }
});
