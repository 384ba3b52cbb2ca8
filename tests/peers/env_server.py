"""An MCP server over stdio that tells what its environment holds: the upstream of the registry
tests (tests/registry.rs), which check that a registered server receives the values the desk has
on record for it (its secrets from the keychain) and nothing from the agent's side.

It lists two tools, both `readOnlyHint: true` (so Countersign forwards them at once): `env`,
given `{"name": "VAR"}`, answers `{"name": "VAR", "value": <the value, or null when unset>}` as
`structuredContent` and as the text of one content block; `exit` answers, then the process
exits (so a test can see what the desk starts next). Standard library
only; one JSON-RPC message per line; exits on end of input.
"""

import json
import os
import sys

SUPPORTED_VERSIONS = ("2025-06-18", "2025-11-25")
DEFAULT_VERSION = "2025-11-25"

TOOLS = [
    {
        "name": "env",
        "description": "Returns the value of one environment variable of this server.",
        "annotations": {"readOnlyHint": True},
        "inputSchema": {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
        },
    },
    {
        "name": "exit",
        "description": "Answers, then ends this server's process.",
        "annotations": {"readOnlyHint": True},
        "inputSchema": {"type": "object"},
    },
]


def answer(message):
    """The response to one message, or None for a notification or a response."""
    if not isinstance(message, dict) or "method" not in message or "id" not in message:
        return None
    method = message["method"]
    params = message.get("params") or {}
    reply = {"jsonrpc": "2.0", "id": message["id"]}
    if method == "initialize":
        requested = params.get("protocolVersion")
        reply["result"] = {
            "protocolVersion": requested if requested in SUPPORTED_VERSIONS else DEFAULT_VERSION,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "env", "version": "1"},
        }
    elif method == "ping":
        reply["result"] = {}
    elif method == "tools/list":
        reply["result"] = {"tools": TOOLS}
    elif method == "tools/call" and params.get("name") == "env":
        name = str((params.get("arguments") or {}).get("name"))
        result = {"name": name, "value": os.environ.get(name)}
        reply["result"] = {
            "content": [{"type": "text", "text": json.dumps(result, sort_keys=True)}],
            "structuredContent": result,
            "isError": False,
        }
    elif method == "tools/call" and params.get("name") == "exit":
        reply["result"] = {"content": [{"type": "text", "text": "exiting"}], "isError": False}
    elif method == "tools/call":
        reply["error"] = {"code": -32602, "message": f"no tool {params.get('name')!r}"}
    else:
        reply["error"] = {"code": -32601, "message": f"no method {method!r}"}
    return reply


def main():
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except ValueError:
            continue
        reply = answer(message)
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
            if message.get("method") == "tools/call" and message["params"].get("name") == "exit":
                sys.exit(0)


if __name__ == "__main__":
    main()
