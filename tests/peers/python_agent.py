"""A scripted agent on the official Python MCP SDK (`mcp` on PyPI), driven by tests/peers.rs.

It starts `countersign mcp` in front of the built-in SQLite tools, lists the tools, calls an open
tool, sends a preflight of a gated one (the test approves it at the desk), confirms with the token
and replays the confirm. Each step is printed to stdout as one JSON line:
`{"step": NAME, ...}`, results as the SDK parsed them (`model_dump(mode="json", by_alias=True)`),
so the test sees what this client understood, not the raw wire.

Usage: python_agent.py MODE COUNTERSIGN SOCKET DB WIRE_LOG
  MODE is the SDK's `Client(mode=...)`: "auto" (probe the newest protocol with `server/discover`,
  fall back to the initialize handshake) or "legacy" (the initialize handshake).
  WIRE_LOG is a file that receives a copy of every message this agent sends the gateway.
"""

import asyncio
import importlib.metadata
import json
import os
import sys

from mcp import Client, StdioServerParameters


def emit(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def dump(result):
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


async def main(mode, countersign, socket, db, wire_log):
    # The SDK passes the child only a small allow-list of the environment unless told otherwise.
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "RUST_LOG", "TMPDIR", "LANG")}
    gateway = [countersign, "mcp", "--no-launch", "--socket", socket, "--db", db, "--wait", "20"]
    server = StdioServerParameters(
        command="sh",
        args=["-c", 'tee -a "$0" | exec "$@"', wire_log, *gateway],
        env=env,
    )
    async with Client(server, mode=mode) as client:
        info = client.server_info
        emit(
            "connected",
            sdk=importlib.metadata.version("mcp"),
            protocol=client.protocol_version,
            server=info.name if info is not None else None,
        )

        tools = await client.list_tools()
        emit(
            "tools",
            tools=[
                {
                    "name": t.name,
                    "readOnly": bool(t.annotations and t.annotations.read_only_hint),
                    "properties": sorted((t.input_schema or {}).get("properties", {}).keys()),
                }
                for t in tools.tools
            ],
        )

        emit("open", result=dump(await client.call_tool("query", {"sql": "SELECT 41 + 1 AS answer"})))

        args = {"sql": "CREATE TABLE from_python (id INTEGER PRIMARY KEY)"}
        preflight = await client.call_tool("execute", args)
        emit("preflight", result=dump(preflight))
        approved = preflight.structured_content or {}
        if preflight.is_error or "confirmToken" not in approved:
            emit("stopped", reason="the preflight was not approved")
            return

        confirm = dict(
            args,
            confirm=True,
            confirmTarget=approved["confirmTarget"],
            confirmToken=approved["confirmToken"],
        )
        emit("confirm", result=dump(await client.call_tool("execute", confirm)))
        emit("replay", result=dump(await client.call_tool("execute", confirm)))
        emit("tables", result=dump(await client.call_tool("list_tables", {})))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
