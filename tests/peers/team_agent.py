"""The official Python SDK (`mcp` 2.3.0) as an agent of a team's `countersign serve` with several
replicas, driven by tests/serve.rs.

It connects over streamable HTTP to URL (a proxy in front of the replicas), closing its connection
after every request so that each request is routed afresh, in `mode="auto"` (MCP 2026-07-28), with
an elicitation callback (so the SDK declares URL elicitation). It calls the gated `execute` with
SQL once. The server answers `input_required` with a URL elicitation and a `requestState`; the
callback prints it as a step, then waits for one line on stdin (the test writes it once a person
approved, and once the proxy sends the next request to another replica) and answers "accept"; the
SDK's own retry carries the `requestState`, and the step `result` is the tool's real result.

Steps are printed to stdout as JSON lines, `{"step": NAME, ...}`.

Usage: team_agent.py URL SQL
"""

import asyncio
import json
import sys

import anyio
from mcp import Client
from mcp import types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def emit(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


async def elicited(ctx, params):
    emit("elicited", mode=getattr(params, "mode", None), url=getattr(params, "url", None))
    line = await anyio.to_thread.run_sync(sys.stdin.readline)
    emit("answering", line=line.strip())
    return types.ElicitResult(action="accept")


async def main(url, sql):
    # A new connection per request: the proxy in front routes each one on its own.
    http = create_mcp_http_client(headers={"Connection": "close"})
    # A stateless server keeps no session to end: no DELETE on close.
    transport = streamable_http_client(url, http_client=http, terminate_on_close=False)
    async with Client(transport, mode="auto", elicitation_callback=elicited) as client:
        emit("connected", protocol=client.protocol_version)
        result = await client.call_tool("execute", {"sql": sql})
        emit("result", result=result.model_dump(mode="json", by_alias=True, exclude_none=True))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:3]))
