"""An MCP server over stdio whose calls take time: the upstream of tests/faults.rs.

Three tools:

  * `sleep` (read-only, so Countersign leaves it open) sleeps `seconds` and answers "slept";
    with `hangUp`, it closes its standard output first and exits once the sleep is over, never
    answering: an upstream whose output ends while its process lingers;
  * `pid` (read-only) answers this process's id, so a test can kill it;
  * `note` (not read-only, not idempotent: works once through Countersign) appends its `text`
    to LOG_FILE as one JSON line {"text", "pid"} after sleeping `seconds` (default 0), so that a
    test can count what ran, and by which process.

When a call starts it says so on stderr ("slow_server: <tool> started", flushed), which the desk
passes to the gateway's stderr: a test waits for that line to know the call is in progress.

Usage: slow_server.py LOG_FILE. Standard library only. Exits on end of input.
"""

import json
import os
import sys
import time

SUPPORTED_VERSIONS = ("2025-06-18", "2025-11-25")
DEFAULT_VERSION = "2025-11-25"

SECONDS = {"seconds": {"type": "number"}}

TOOLS = [
    {
        "name": "sleep",
        "description": "Sleeps for a while.",
        "annotations": {"readOnlyHint": True},
        "inputSchema": {
            "type": "object",
            "properties": {"hangUp": {"type": "boolean"}, **SECONDS},
        },
    },
    {
        "name": "pid",
        "description": "This server's process id.",
        "annotations": {"readOnlyHint": True},
        "inputSchema": {"type": "object", "properties": {}},
    },
    {
        "name": "note",
        "description": "Appends a line to the log, after a while.",
        "annotations": {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False},
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}, **SECONDS},
            "required": ["text"],
        },
    },
]


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def text_result(text):
    return {"content": [{"type": "text", "text": text}], "isError": False}


def call(log_path, params):
    name = params.get("name")
    arguments = params.get("arguments") or {}
    sys.stderr.write(f"slow_server: {name} started\n")
    sys.stderr.flush()
    if name == "sleep" and arguments.get("hangUp") is True:
        os.close(1)
        time.sleep(float(arguments.get("seconds", 0)))
        os._exit(0)
    time.sleep(float(arguments.get("seconds", 0)))
    if name == "sleep":
        return text_result("slept")
    if name == "pid":
        return text_result(str(os.getpid()))
    if name == "note":
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"text": arguments.get("text"), "pid": os.getpid()}) + "\n")
        return text_result("noted")
    return {"content": [{"type": "text", "text": f"no tool {name}"}], "isError": True}


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: slow_server.py LOG_FILE\n")
        sys.exit(2)
    log_path = sys.argv[1]
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        if "id" not in message or "method" not in message:
            continue  # notifications and responses: nothing to answer
        method, params = message["method"], message.get("params") or {}
        if method == "initialize":
            requested = params.get("protocolVersion")
            result = {
                "protocolVersion": requested if requested in SUPPORTED_VERSIONS else DEFAULT_VERSION,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "slow", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": TOOLS}
        elif method == "tools/call":
            result = call(log_path, params)
        elif method == "ping":
            result = {}
        else:
            send({"jsonrpc": "2.0", "id": message["id"],
                  "error": {"code": -32601, "message": f"no method {method}"}})
            continue
        send({"jsonrpc": "2.0", "id": message["id"], "result": result})


if __name__ == "__main__":
    main()
