"""What a host sees of the gateway, through a second MCP client: the MCP Inspector's CLI (npm), over streamable
HTTP and over stdio, with real upstreams behind the gateway (the reference "everything" server from npm and
mcp-server-time from PyPI). What the gateway passes on is compared with what the same CLI gets from the
everything server asked directly."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("mcp")

from gateways import (  # noqa: E402
    inspector_cli,
    npm_everything,
    start_gateway,
    stop,
    time_server,
    wait_up,
    write_config,
)

pytestmark = pytest.mark.slow  # starts gateways, upstream servers and node

NO_NPM = "npm is not installed here: the Inspector CLI and the npm reference server cannot be installed"


def inspect(target: list[str], method: str, *options: str) -> dict:
    """One Inspector CLI run: its JSON answer (a failed run fails the test with what the CLI said). A server it
    starts inherits this process's environment (offline: conftest.py sets it)."""
    cli = inspector_cli()
    # the CLI looks for its own package.json at ../package.json relative to its working directory (and imports
    # it relative to itself): run it from its build folder so both resolve to its package
    args = ["node", str(cli), target[0], "--method", method, *options]
    if target[1:]:
        args += ["--", *target[1:]]  # the server's own arguments and options, which the CLI must not read
    run = subprocess.run(args, cwd=cli.parent, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, f"{' '.join(args)}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return json.loads(run.stdout)


def call(target: list[str], tool: str, **arguments) -> dict:
    pairs = [f"{key}={json.dumps(value)}" for key, value in arguments.items()]
    return inspect(target, "tools/call", "--tool-name", tool, *(["--tool-arg", *pairs] if pairs else []))


@pytest.fixture(scope="module")
def everything():
    path = npm_everything()
    if path is None or inspector_cli() is None:
        pytest.skip(NO_NPM)
    return path


@pytest.fixture(scope="module")
def direct(everything):
    """The everything server's own answers, through the same CLI (no gateway): what the gateway must pass on."""
    target = [str(everything), "stdio"]
    resources = [r["uri"] for r in inspect(target, "resources/list")["resources"]]
    return {"prompts": [p["name"] for p in inspect(target, "prompts/list")["prompts"]],
            "resources": resources,
            "prompt": inspect(target, "prompts/get", "--prompt-name", "args-prompt",
                              "--prompt-args", "city=Paris", "state=Texas")["messages"],
            "document": inspect(target, "resources/read", "--uri", resources[0])["contents"][0]}


def test_the_inspector_cli_over_http_searches_calls_and_reads_what_the_upstreams_offer(tmp_path, everything, direct):
    config = write_config(tmp_path, {"everything": {"command": str(everything), "args": ["stdio"]},
                                     "time": time_server()})
    proc, url = start_gateway(config, tmp_path / "index")
    try:
        wait_up(url, ["everything", "time"], proc)
        target = [f"{url}/mcp"]  # a URL ending in /mcp: the CLI speaks streamable HTTP
        assert [t["name"] for t in inspect(target, "tools/list")["tools"]] == ["search_tools", "call_tool",
                                                                               "record_tool_use"]
        found = call(target, "search_tools", task="add two numbers together", k=3)
        assert not found.get("isError") and found["structuredContent"]["tools"][0]["id"] == "everything.get-sum"
        summed = call(target, "call_tool", name="everything.get-sum", arguments={"a": 2, "b": 40})
        assert not summed.get("isError") and "42" in summed["content"][0]["text"]  # the server's own sum
        tokyo = call(target, "call_tool", name="time.get_current_time", arguments={"timezone": "Asia/Tokyo"})
        assert tokyo["structuredContent"]["datetime"].endswith("+09:00")  # mcp-server-time's own answer
        unknown = call(target, "call_tool", name="everything.get-summ", arguments={})
        assert unknown["isError"] and "everything.get-sum" in unknown["content"][0]["text"]  # the nearest id

        prompts = [p["name"] for p in inspect(target, "prompts/list")["prompts"]]
        assert prompts == [f"everything.{name}" for name in direct["prompts"]]
        prompt = inspect(target, "prompts/get", "--prompt-name", "everything.args-prompt",
                         "--prompt-args", "city=Paris", "state=Texas")
        assert prompt["messages"] == direct["prompt"]
        resources = [r["uri"] for r in inspect(target, "resources/list")["resources"]]
        assert resources == [f"toolscout://everything/{uri}" for uri in direct["resources"]]
        read = inspect(target, "resources/read", "--uri", resources[0])["contents"][0]
        assert read == {**direct["document"], "uri": resources[0]}  # the document itself, under the gateway's URI
    finally:
        stop(proc)


def test_the_inspector_cli_starts_the_gateway_over_stdio_and_finds_and_calls_a_tool(tmp_path):
    if inspector_cli() is None:
        pytest.skip(NO_NPM)
    config = write_config(tmp_path, {"time": time_server()})
    target = [sys.executable, "-m", "toolscout", "gateway", str(config), "--index", str(tmp_path / "index"),
              "--no-fsync"]
    # a new index: the first search waits for the time server to list its tools
    found = call(target, "search_tools", task="convert 9am London time to New York time")
    assert found["structuredContent"]["tools"][0]["id"] == "time.convert_time"
    converted = call(target, "call_tool", name="time.convert_time", arguments={
        "source_timezone": "Europe/London", "time": "09:00", "target_timezone": "America/New_York"})
    assert not converted.get("isError"), converted
    assert converted["structuredContent"]["target"]["datetime"][11:16] in {"04:00", "05:00"}  # 5 h or 4 h behind
