"""An MCP server over stdio that tells what its environment holds: the upstream of the registry
tests (tests/registry.rs), which check that a registered server receives the values the desk has
on record for it (its secrets from the keychain) and nothing from the agent's side.

It lists two tools, both `readOnlyHint: true` (so Countersign forwards them at once): `env`,
given `{"name": "VAR"}`, answers `{"name": "VAR", "value": <the value, or null when unset>}` as
`structuredContent` and as the text of one content block; `exit` answers, then the process
exits (so a test can see what the desk starts next). Standard library
only (the stdio loop is stdio_peer.py).
"""

import os

from stdio_peer import ExitAfter, serve, structured

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


def call(tool, arguments, _send):
    if tool == "exit":
        raise ExitAfter({"content": [{"type": "text", "text": "exiting"}], "isError": False})
    name = str(arguments.get("name"))
    return structured({"name": name, "value": os.environ.get(name)})


if __name__ == "__main__":
    serve("env", lambda: TOOLS, call)
