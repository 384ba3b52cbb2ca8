"""An upstream on the official Python MCP SDK (`mcp` on PyPI): `MCPServer` over stdio.

Two tools: `whoami` (read-only) answers the protocol revision of the request it serves, as the
server negotiated it; `note` (not read-only, not idempotent: works once through Countersign)
appends its text to the file named on the command line.

Usage: python_server.py NOTES_FILE
"""

import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

notes = sys.argv[1]
server = MCPServer("python-upstream")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def whoami(ctx: Context) -> str:
    """The protocol revision this request was served under."""
    return f"protocol {ctx.protocol_version}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False))
def note(text: str) -> str:
    """Appends a line to the notes file."""
    with open(notes, "a") as f:
        f.write(text + "\n")
    return "noted"


if __name__ == "__main__":
    server.run("stdio")
