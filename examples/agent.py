"""An agent's first search and call through the gateway, with the official MCP SDK client.

    .venv/bin/python examples/agent.py [CONFIG] [TASK]

The client starts `toolscout gateway CONFIG` over stdio, as an MCP host does (default CONFIG:
examples/gateway.json, whose servers toolscout's own setup installs), searches for the task, calls the first
tool found whose input schema its arguments fill (what an LLM choosing among the results would do), and
prints what came back. The gateway records that call and learns from it (docs/learning.md): its index is kept
in .toolscout-gateway-demo/ (or $GATEWAY_INDEX), so a second run starts at once.
"""

import json
import os
import sys
import time
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parents[1]
CONFIG = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "examples" / "gateway.json")
TASK = sys.argv[2] if len(sys.argv) > 2 else "what time is it in Tokyo right now?"
ARGUMENTS = {"timezone": "Asia/Tokyo"}  # what an LLM would fill in for this task from the tool's schema
INDEX = os.environ.get("GATEWAY_INDEX", str(ROOT / ".toolscout-gateway-demo"))


async def main() -> None:
    gateway = StdioServerParameters(command=sys.executable, args=[
        "-m", "toolscout", "gateway", CONFIG, "--index", INDEX],
        env={"HF_HUB_OFFLINE": "1", "PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                                              os.environ.get("PATH", "")])})
    async with Client(gateway) as client:
        print("the agent sees:", [t.name for t in (await client.list_tools()).tools])
        found = await first_results(client)
        if not found:
            raise SystemExit("no server of the config answered within two minutes; see .toolscout-gateway-demo/"
                             "upstream-logs/")
        print(f"\nsearch_tools({TASK!r}):")
        for tool in found:
            state = "" if tool["available"] else "  (its server does not answer now)"
            print(f"  {tool['score']:.3f}  {tool['id']:<36} {tool['description'][:60]}{state}")
        # an LLM would pick the found tool whose schema its task can fill; this stand-in does the same
        best = next((t for t in found if set(t["input_schema"].get("required", [])) <= set(ARGUMENTS)), found[0])
        arguments = {k: v for k, v in ARGUMENTS.items() if k in best["input_schema"].get("properties", {})}
        result = await client.call_tool("call_tool", {"name": best["id"], "arguments": arguments})
        print(f"\ncall_tool({best['id']!r}, {json.dumps(arguments)}):")
        print("  " + (json.dumps(result.structured_content) if result.structured_content
                      else result.content[0].text).replace("\n", "\n  "))


async def first_results(client: Client) -> list[dict]:
    """The search's tools. A new gateway answers at once and its index fills as each server lists its tools
    (seconds); a restarted one answers from the index it kept while its servers reconnect. The demo waits
    for the time server's tools to be there and answering."""
    deadline = time.monotonic() + 120
    while True:
        tools = (await client.call_tool("search_tools", {"task": TASK, "k": 3})).structured_content["tools"]
        if any(t["namespace"] == "time" and t["available"] for t in tools) or time.monotonic() > deadline:
            return tools
        await anyio.sleep(0.5)


if __name__ == "__main__":
    anyio.run(main)
