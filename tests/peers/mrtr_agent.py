"""The official Python SDK (`mcp` 2.3.0) as an agent of the Countersign desk, driven by tests/rounds.rs.

It starts `countersign mcp` in front of the built-in SQLite tools and calls the gated `execute`
once, with an elicitation callback (so the SDK declares URL elicitation). In MODE "auto" the SDK
negotiates MCP 2026-07-28: the desk answers `input_required` with a URL elicitation; the callback
prints it as a step, then waits for one line on stdin (the test writes it once it has clicked
Approve in the real window) and answers "accept"; the SDK retries with the `requestState` itself
and the step `result` is the tool's real result. In MODE "legacy" (the initialize handshake) the
call is the preflight, answered once the person approves, and the script confirms with the token.

Every message the gateway sends this agent is copied to AGENT_IN_LOG: all the model could see.
Steps are printed to stdout as JSON lines, `{"step": NAME, ...}`.

Usage: mrtr_agent.py MODE COUNTERSIGN SOCKET DB SQL AGENT_IN_LOG
"""

import asyncio
import json
import os
import sys

import anyio
from mcp import Client, StdioServerParameters
from mcp import types


def emit(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def dump(result):
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


async def elicited(ctx, params):
    emit(
        "elicited",
        mode=getattr(params, "mode", None),
        url=getattr(params, "url", None),
        message=params.message,
    )
    # The person is at the desk now: wait until the test says it clicked.
    line = await anyio.to_thread.run_sync(sys.stdin.readline)
    emit("answering", line=line.strip())
    return types.ElicitResult(action="accept")


async def main(mode, countersign, socket, db, sql, agent_in_log):
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "RUST_LOG", "TMPDIR", "LANG")}
    gateway = [countersign, "mcp", "--no-launch", "--socket", socket, "--db", db, "--wait", "40"]
    server = StdioServerParameters(
        command="sh",
        args=["-c", 'log="$0"; shift; "$@" | tee -a "$log"', agent_in_log, "--", *gateway],
        env=env,
    )
    async with Client(server, mode=mode, elicitation_callback=elicited) as client:
        emit("connected", protocol=client.protocol_version)
        args = {"sql": sql}
        result = await client.call_tool("execute", args)
        emit("result", result=dump(result))
        approved = result.structured_content or {}
        if mode == "legacy" and "confirmToken" in approved:
            confirm = dict(
                args,
                confirm=True,
                confirmTarget=approved["confirmTarget"],
                confirmToken=approved["confirmToken"],
            )
            emit("confirm", result=dump(await client.call_tool("execute", confirm)))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:7]))
