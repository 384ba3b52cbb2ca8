"""The official Python SDK (`mcp` 2.3.0) as an agent of `countersign serve`, driven by tests/serve.rs.

It connects over streamable HTTP with a bearer token, lists the tools, calls the open `query` and
the gated `execute` of the built-in SQLite tools, and prints each step to stdout as a JSON line,
`{"step": NAME, ...}`. MODE is the SDK's: "legacy" (the initialize handshake) or "auto".

Usage: http_agent.py MODE URL TOKEN
"""

import asyncio
import json
import sys

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def emit(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def dump(result):
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


async def main(mode, url, token):
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    # A stateless server keeps no session to end: no DELETE on close.
    transport = streamable_http_client(url, http_client=http, terminate_on_close=False)
    async with Client(transport, mode=mode) as client:
        emit("connected", protocol=client.protocol_version)
        tools = await client.list_tools()
        emit("tools", names=sorted(t.name for t in tools.tools))
        query = await client.call_tool("query", {"sql": "SELECT body FROM notes"})
        emit("query", result=dump(query))
        execute = await client.call_tool("execute", {"sql": "DELETE FROM notes"})
        emit("execute", result=dump(execute))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
