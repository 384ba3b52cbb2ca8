"""The official Python SDK as the agent in front of `countersign mcp -- <an upstream>`.

Connects in MODE ("auto": probe 2026-07-28 with `server/discover`, fall back to the handshake;
"legacy": the handshake), asks the read-only `whoami` which revision the upstream served it
under, then preflights `note` (the test approves it at the desk), confirms it and replays the
confirm. Prints one JSON line per step: `{"step": NAME, ...}`.

Usage: python_pair.py MODE COUNTERSIGN SOCKET UPSTREAM...
"""

import asyncio
import json
import os
import sys

from mcp import Client, StdioServerParameters


def emit(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def text(result):
    return "\n".join(c.text for c in result.content if getattr(c, "text", None))


async def main(mode, countersign, socket, upstream):
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "RUST_LOG", "TMPDIR", "LANG")}
    server = StdioServerParameters(
        command=countersign,
        args=["mcp", "--no-launch", "--socket", socket, "--wait", "20", "--", *upstream],
        env=env,
    )
    async with Client(server, mode=mode) as client:
        emit("connected", protocol=client.protocol_version)
        whoami = await client.call_tool("whoami", {})
        emit("whoami", text=text(whoami), is_error=whoami.is_error)
        args = {"text": "from python"}
        preflight = await client.call_tool("note", args)
        approved = preflight.structured_content or {}
        emit("preflight", is_error=preflight.is_error, approved=approved.get("approved"))
        if preflight.is_error or "confirmToken" not in approved:
            return
        confirm = dict(args, confirm=True, confirmTarget=approved["confirmTarget"], confirmToken=approved["confirmToken"])
        done = await client.call_tool("note", confirm)
        emit("confirm", is_error=done.is_error, text=text(done))
        again = await client.call_tool("note", confirm)
        emit("replay", is_error=again.is_error, refusal=(again.structured_content or {}).get("refusal"))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))
