"""An MCP server over stdio whose `write` never answers: the process dies in the middle of it, as a
server that crashes or is killed would. Driven by tests/desk.rs (a call handed over and never
answered is on record as `outcome_unknown`, and the window says so when the same call asks again).

It lists one tool, `write` (not read-only, not destructive, not idempotent, so Countersign gates it
as works-once; its `path` is the plan's target). Standard library only (the stdio loop is
stdio_peer.py).
"""

import os

from stdio_peer import serve

TOOLS = [
    {
        "name": "write",
        "description": "Would write text to a path; dies before answering.",
        "annotations": {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False},
        "inputSchema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
        },
    },
]


def call(_tool, _arguments, _send):
    # Gone mid-call: no answer, no clean exit.
    os._exit(3)


if __name__ == "__main__":
    serve("dying", lambda: TOOLS, call)
