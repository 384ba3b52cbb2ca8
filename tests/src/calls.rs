//! A gated call from a test's agent, as the window tests make it: sent in a task of its own (its
//! preflight waits for the click the test then makes in the window), and its confirm built from
//! the token the click minted.

use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, CallToolResult, ClientConfig};
use rmcp::service::RunningService;
use serde_json::{Value, json};

/// A call under way: its result once the desk answers.
pub type Call = tokio::task::JoinHandle<CallToolResult>;

/// Sends `tool(arguments)` (a JSON object) from `agent` in a task of its own.
pub fn call(
    agent: &RunningService<RoleClient, ClientConfig>,
    tool: &str,
    arguments: Value,
) -> Call {
    let peer = agent.peer().clone();
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(arguments.as_object().cloned().unwrap());
    tokio::spawn(async move { peer.call_tool(params).await.unwrap() })
}

/// `arguments` with the confirm fields of an approved `preflight`: `confirm`, its target and its
/// token.
pub fn confirm_of(preflight: &CallToolResult, arguments: Value) -> Value {
    let s = preflight.structured_content.as_ref().unwrap();
    let (target, token) = (&s["confirmTarget"], &s["confirmToken"]);
    confirm_args(
        &arguments,
        target.as_str().unwrap(),
        token.as_str().unwrap(),
    )
}

/// `arguments` with the confirm fields: `confirm`, `target` and `token`.
pub fn confirm_args(arguments: &Value, target: &str, token: &str) -> Value {
    let mut arguments = arguments.clone();
    arguments["confirm"] = json!(true);
    arguments["confirmTarget"] = json!(target);
    arguments["confirmToken"] = json!(token);
    arguments
}
