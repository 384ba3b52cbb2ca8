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
pub fn confirm_of(preflight: &CallToolResult, mut arguments: Value) -> Value {
    let s = preflight.structured_content.as_ref().unwrap();
    arguments["confirm"] = json!(true);
    arguments["confirmTarget"] = s["confirmTarget"].clone();
    arguments["confirmToken"] = s["confirmToken"].clone();
    arguments
}
