"""What the tests' small MCP servers share: the stdio loop (one JSON-RPC message per line, batches
too), `initialize`, `ping`, `tools/list` and the errors for unknown tools and methods. Each server
gives its name, its tools and what a call of each does. Standard library only.
"""

import json
import sys

SUPPORTED_VERSIONS = ("2025-06-18", "2025-11-25")
DEFAULT_VERSION = "2025-11-25"


class ExitAfter(Exception):
    """Raised by a call: answer with `result`, then end the process."""

    def __init__(self, result):
        super().__init__()
        self.result = result


def serve(name, tools, call, list_changed=False):
    """Serves on stdin/stdout until end of input. `tools()` lists the tools; `call(tool,
    arguments, send)` answers a call of a listed one with a result, may `send(message)` first
    (a notification), and may raise ExitAfter."""
    out = sys.stdout

    def send(message):
        out.write(json.dumps(message) + "\n")
        out.flush()

    def answer(message):
        if not isinstance(message, dict) or "method" not in message or "id" not in message:
            return None, False
        method = message["method"]
        params = message.get("params") or {}
        reply = {"jsonrpc": "2.0", "id": message["id"]}
        exiting = False
        if method == "initialize":
            requested = params.get("protocolVersion")
            capabilities = {"tools": {"listChanged": True} if list_changed else {}}
            reply["result"] = {
                "protocolVersion": requested if requested in SUPPORTED_VERSIONS else DEFAULT_VERSION,
                "capabilities": capabilities,
                "serverInfo": {"name": name, "version": "1"},
            }
        elif method == "ping":
            reply["result"] = {}
        elif method == "tools/list":
            reply["result"] = {"tools": tools()}
        elif method == "tools/call" and params.get("name") in {t["name"] for t in tools()}:
            try:
                reply["result"] = call(params["name"], params.get("arguments") or {}, send)
            except ExitAfter as done:
                reply["result"] = done.result
                exiting = True
        elif method == "tools/call":
            reply["error"] = {"code": -32602, "message": f"no tool {params.get('name')!r}"}
        else:
            reply["error"] = {"code": -32601, "message": f"no method {method!r}"}
        return reply, exiting

    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, list):
            answered = [answer(m) for m in message]
            replies = [r for r, _ in answered if r is not None]
            if replies:
                send(replies)
            if any(e for _, e in answered):
                sys.exit(0)
            continue
        reply, exiting = answer(message)
        if reply is not None:
            send(reply)
        if exiting:
            sys.exit(0)


def structured(result):
    """A tool result carrying `result` as structuredContent and as the text of one block."""
    return {
        "content": [{"type": "text", "text": json.dumps(result, sort_keys=True)}],
        "structuredContent": result,
        "isError": False,
    }
