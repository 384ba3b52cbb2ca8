//! What the gateway and the desk read of an agent's message without taking it apart: whether it
//! is a request (its id and method), an answer (to which id) or a notification, and for a request
//! what it asked. The gateway answers for a lost desk from this, and the desk notes it for the
//! gateway when the agent's stdio is handed over (see `stdio`). Nothing here decides anything:
//! the desk's router judges every message.

use serde::Deserialize;

/// What a message is: requests are in flight until answers clear them. Read with serde from the message's bytes; everything else in it is skipped.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// A request: its id and method. Ids are compared as JSON text, so `1` and `"1"` stay apart.
    Request {
        /// The id.
        id: serde_json::Value,
        /// The method.
        method: String,
    },
    /// A response or error, to the request whose id is this JSON text.
    Response {
        /// The id, as JSON text.
        key: String,
    },
    /// A notification, or anything unreadable (the desk's router judges it).
    Other {
        /// The method, when there is one.
        method: Option<String>,
    },
}

#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    id: Option<serde_json::Value>,
    #[serde(default)]
    method: Option<String>,
}

impl Kind {
    /// Reads what kind of message `bytes` is.
    pub fn of(bytes: &[u8]) -> Kind {
        let Ok(head) = serde_json::from_slice::<Head>(bytes) else {
            return Kind::Other { method: None };
        };
        match (head.id, head.method) {
            (Some(id), Some(method)) => Kind::Request { id, method },
            (Some(id), None) => Kind::Response {
                key: id.to_string(),
            },
            (None, method) => Kind::Other { method },
        }
    }
}

/// What an agent's request was, for the answer it gets when the desk is lost.
#[derive(Debug, Clone, PartialEq)]
pub enum Asked {
    /// A `tools/call`: the tool, and whether it was a confirm (`confirm: true`).
    Call {
        /// The tool's name.
        tool: String,
        /// Whether the call carried `confirm: true`.
        confirm: bool,
    },
    /// Anything else.
    Other {
        /// The request's method.
        method: String,
    },
}

#[derive(Deserialize)]
struct CallHead {
    params: CallParams,
}

#[derive(Deserialize)]
struct CallParams {
    name: String,
    #[serde(default)]
    arguments: Option<CallArguments>,
}

#[derive(Deserialize)]
struct CallArguments {
    #[serde(default)]
    confirm: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct CancelHead {
    params: CancelParams,
}

#[derive(Deserialize)]
struct CancelParams {
    #[serde(rename = "requestId")]
    request_id: serde_json::Value,
}

impl Asked {
    /// What the request `bytes`, of `method`, asks.
    pub fn of(method: &str, bytes: &[u8]) -> Asked {
        if method != "tools/call" {
            return Asked::Other {
                method: method.to_owned(),
            };
        }
        match serde_json::from_slice::<CallHead>(bytes) {
            Ok(call) => Asked::Call {
                tool: call.params.name,
                confirm: call
                    .params
                    .arguments
                    .and_then(|a| a.confirm)
                    .is_some_and(|c| c == serde_json::Value::Bool(true)),
            },
            Err(_) => Asked::Other {
                method: method.to_owned(),
            },
        }
    }
}

/// The request a `notifications/cancelled` in `bytes` cancels, as JSON text.
pub fn cancelled(bytes: &[u8]) -> Option<String> {
    serde_json::from_slice::<CancelHead>(bytes)
        .ok()
        .map(|c| c.params.request_id.to_string())
}
