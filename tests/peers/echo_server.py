"""An MCP server over stdio that hands back exactly what it was given: the upstream of the load
bench (tests/examples/load_bench.rs).

It lists two tools:

  * `echo` (`readOnlyHint: true`, so Countersign forwards it at once);
  * `write` (not read-only, not destructive, not idempotent, so Countersign gates it as
    works-once; its `path` is the plan's target).

Both answer with their arguments, unchanged: as `structuredContent`, and as the text of one
content block (the same object as JSON), so a client can tell whose answer it received. Nothing
is written anywhere. Standard library only; one JSON-RPC message per line; exits on end of input.
"""

import json
import sys

SUPPORTED_VERSIONS = ("2025-06-18", "2025-11-25")
DEFAULT_VERSION = "2025-11-25"

TOOLS = [
    {
        "name": "echo",
        "description": "Returns its arguments.",
        "annotations": {"readOnlyHint": True},
        "inputSchema": {"type": "object", "additionalProperties": True},
    },
    {
        "name": "write",
        "description": "Pretends to write text to a path; returns its arguments.",
        "annotations": {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False},
        "inputSchema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
        },
    },
]
NAMES = {tool["name"] for tool in TOOLS}


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
            "serverInfo": {"name": "echo", "version": "1"},
        }
    elif method == "ping":
        reply["result"] = {}
    elif method == "tools/list":
        reply["result"] = {"tools": TOOLS}
    elif method == "tools/call" and params.get("name") in NAMES:
        arguments = params.get("arguments") or {}
        reply["result"] = {
            "content": [{"type": "text", "text": json.dumps(arguments, sort_keys=True)}],
            "structuredContent": arguments,
            "isError": False,
        }
    elif method == "tools/call":
        reply["error"] = {"code": -32602, "message": f"no tool {params.get('name')!r}"}
    else:
        reply["error"] = {"code": -32601, "message": f"no method {method!r}"}
    return reply


def main():
    out = sys.stdout
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, list):
            replies = [r for r in map(answer, message) if r is not None]
            reply = replies or None
        else:
            reply = answer(message)
        if reply is not None:
            out.write(json.dumps(reply) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
