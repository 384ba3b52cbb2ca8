"""An MCP server over stdio that hands back exactly what it was given: the upstream of the load
bench (tests/examples/load_bench.rs).

It lists two tools:

  * `echo` (`readOnlyHint: true`, so Countersign forwards it at once);
  * `write` (not read-only, not destructive, not idempotent, so Countersign gates it as
    works-once; its `path` is the plan's target).

Both answer with their arguments, unchanged: as `structuredContent`, and as the text of one
content block (the same object as JSON), so a client can tell whose answer it received. Nothing
is written anywhere. Standard library only (the stdio loop is stdio_peer.py).
"""

from stdio_peer import serve, structured

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


def call(_tool, arguments, _send):
    return structured(arguments)


if __name__ == "__main__":
    serve("echo", lambda: TOOLS, call)
