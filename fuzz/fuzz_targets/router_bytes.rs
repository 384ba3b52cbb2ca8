//! Any bytes an agent sends are judged by the desk's router without panicking, and a judgement
//! keeps its promises: what passes is one allow-listed method (or a response), typed as the same
//! method it named; what is refused is answered with a JSON-RPC error of a known code.
#![no_main]

use countersign_router::{NOTIFICATIONS, REQUESTS, Routed, route};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

pub fn check(bytes: &[u8]) {
    match route(bytes) {
        Routed::Pass(message) => {
            let typed = serde_json::to_value(&*message).expect("a passed message serializes");
            let original: Value =
                serde_json::from_slice(bytes).expect("what passed is JSON");
            match original.get("method").and_then(Value::as_str) {
                Some(method) => {
                    let allowed = if original.get("id").is_some() {
                        REQUESTS.contains(&method)
                    } else {
                        NOTIFICATIONS.contains(&method)
                    };
                    assert!(allowed, "{method} passed but is not allow-listed");
                    assert_eq!(
                        typed.get("method").and_then(Value::as_str),
                        Some(method),
                        "the typed message names another method than the agent sent"
                    );
                }
                None => assert!(
                    original.get("result").is_some() || original.get("error").is_some(),
                    "a message without a method passed that is not a response"
                ),
            }
        }
        Routed::Answer(answer) => {
            assert_eq!(answer["jsonrpc"], "2.0");
            let code = answer["error"]["code"].as_i64().expect("an error code");
            assert!(
                [-32700, -32600, -32601, -32602].contains(&code),
                "unexpected error code {code}"
            );
        }
        Routed::Drop(_) => {}
    }
}

fuzz_target!(|data: &[u8]| check(data));
