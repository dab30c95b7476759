"""Real gateways for the tests: `python -m toolscout gateway CONFIG --port P` in a subprocess, in front of
real upstreams (the stub server of tests/fixtures/mcp_stub.py, mcp-server-time from PyPI, an OpenAPI app on
loopback), and waits that poll the gateway's own /health (never a sleep used as a handshake)."""

# No `from __future__ import annotations`: FastAPI reads the OpenAPI app's annotations at run time.
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import httpx

from servers import free_port, log_file, stop, wait_ready

STUB = Path(__file__).parent / "fixtures" / "mcp_stub.py"
RAW = Path(__file__).parent / "fixtures" / "raw_mcp_server.py"
TIME_SERVER = Path(sys.executable).parent / "mcp-server-time"


def stub(name: str, *args: str, **settings) -> dict:
    """A config entry for the stub server (its own name as argv[1])."""
    return {"command": sys.executable, "args": [str(STUB), name, *args], **settings}


def raw_server(name: str, tools_file: Path, **settings) -> dict:
    """A config entry for the hand-written 2025-protocol server that sends its tools unchecked."""
    return {"command": sys.executable, "args": [str(RAW), name, str(tools_file)], **settings}


def time_server(**settings) -> dict:
    """mcp-server-time, the reference time server installed from PyPI with toolscout's test extra."""
    if not TIME_SERVER.exists():
        raise AssertionError(f"{TIME_SERVER} is missing: `pip install -e '.[test]'` installs mcp-server-time")
    return {"command": str(TIME_SERVER), **settings}


def write_config(folder: Path, servers: dict, openapi: dict | None = None) -> Path:
    path = folder / "servers.json"
    data = {"mcpServers": servers}
    if openapi:
        data["openapi"] = openapi
    path.write_text(json.dumps(data, indent=1))
    return path


def start_gateway(config: Path, index: Path, *flags: str, timeout: float = 180) -> "tuple[subprocess.Popen, str]":
    """The gateway over HTTP; returns (process, base URL) once its /health answers."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("TOOLSCOUT_TOKEN", None)
    log = log_file("gateway-")
    proc = subprocess.Popen([sys.executable, "-m", "toolscout", "gateway", str(config), "--index", str(index),
                             "--port", str(port), "--no-fsync", "--log-level", "info", *flags],
                            env=env, stdout=subprocess.DEVNULL, stderr=log)
    proc.log_path = log.name
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, timeout)
    return proc, url


def wait_for(check: Callable[[], object], what: str, timeout: float = 60, proc: "subprocess.Popen | None" = None):
    """Poll `check` until it returns something true; fail with `what` after `timeout` seconds."""
    deadline = time.time() + timeout
    while True:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the gateway exited while waiting for {what}: "
                                 f"{Path(proc.log_path).read_text()[-3000:]}")
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)  # polling interval: readiness is what `check` reads


def upstreams(url: str) -> dict[str, dict]:
    return {u["name"]: u for u in httpx.get(f"{url}/health", timeout=10).json()["upstreams"]}


def wait_up(url: str, names, proc=None, timeout: float = 120, connects: int = 1) -> dict[str, dict]:
    """Wait until every upstream in `names` is up (and has connected `connects` times) and indexed."""
    seen: dict[str, dict] = {}

    def ready():
        seen.update(upstreams(url))
        return seen if all(seen[n]["state"] == "up" and seen[n]["connects"] >= connects for n in names) else None

    try:
        return wait_for(ready, f"upstreams {sorted(names)} up", timeout, proc)
    except AssertionError as exc:
        states = {n: (seen[n]["state"], seen[n]["last_error"]) for n in names if n in seen}
        raise AssertionError(f"{exc}; their states: {states}") from None


def learned_all(url: str) -> bool:
    return httpx.get(f"{url}/health", timeout=10).json()["learning_from_calls"]["pending"] == 0


class OpenApiApp:
    """A small HTTP API on loopback, served by uvicorn in a thread, that answers with what it received."""

    def __init__(self):
        from fastapi import FastAPI, Request
        from pydantic import BaseModel

        class Item(BaseModel):
            name: str
            price: float

        app = FastAPI(title="shop")

        @app.get("/items/{item_id}", operation_id="getItem", summary="Look up an item of the shop by its id")
        def get_item(item_id: int, request: Request, verbose: bool = False):
            return {"item_id": item_id, "verbose": verbose, "x_user": request.headers.get("x-user"),
                    "x_secret": request.headers.get("x-secret")}

        @app.post("/items", operation_id="createItem", summary="Add a new item for sale to the shop", status_code=201)
        def create_item(item: Item):
            return {"created": item.model_dump()}

        @app.get("/broken", operation_id="brokenEndpoint", summary="An endpoint that fails on the server")
        def broken():
            raise RuntimeError("server-side failure")

        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "OpenApiApp":
        self.thread.start()
        wait_for(lambda: self.server.started, "the OpenAPI app to start", 30)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


NPM_TOOLS = Path(__file__).resolve().parents[1] / ".npm-upstreams" / "node_modules"


def npm_installed(relative: str, package: str) -> "Path | None":
    """A file of an npm package as scripts/setup.sh installs it under .npm-upstreams (None when this machine
    has no npm; a failure when npm is there and the package is not)."""
    path = NPM_TOOLS / relative
    if path.exists():
        return path
    if shutil.which("npm") is None:
        return None
    raise AssertionError(f"{path} is missing though npm is installed: run scripts/setup.sh, which installs "
                         f"{package} there")


def npm_everything() -> "Path | None":
    """The bin of @modelcontextprotocol/server-everything (None when this machine has no npm)."""
    return npm_installed(".bin/mcp-server-everything", "@modelcontextprotocol/server-everything")


def inspector_cli() -> "Path | None":
    """The MCP Inspector's CLI entry point (None when this machine has no npm)."""
    return npm_installed("@modelcontextprotocol/inspector-cli/build/index.js", "@modelcontextprotocol/inspector-cli")


def everything_tapped(wire: Path) -> "dict | None":
    """A config entry for the npm everything server whose stdin is copied to `wire` on its way in (`tee`), so a
    test reads what the gateway sent it; None when npm is not installed here."""
    everything = npm_everything()
    if everything is None:
        return None
    return {"command": "sh", "args": ["-c", f'tee "{wire}" | "{everything}" stdio']}


def sent_upstream(wire: Path) -> "list[dict]":
    """The JSON-RPC messages the gateway has sent a tapped server so far."""
    if not wire.exists():
        return []
    return [json.loads(line) for line in wire.read_text().splitlines() if line.strip()]


def gateway_stdio(config: Path, index: "Path | None", *flags: str) -> "object":
    """StdioServerParameters that start a gateway over stdio (the SDK client launches it); `index` None: the
    config's default index (under $XDG_STATE_HOME, which the caller's environment may point anywhere)."""
    from mcp import StdioServerParameters

    where = ["--index", str(index)] if index is not None else []
    return StdioServerParameters(command=sys.executable, args=["-m", "toolscout", "gateway", str(config), *where,
                                                               "--no-fsync", *flags], env=stdio_env())


def stdio_env() -> dict:
    """The environment of a gateway the SDK client starts (it passes on only what it is given): offline, the
    caller's PATH, and the PYTHONPATH and XDG_STATE_HOME it runs under, if any (a worktree's source)."""
    env = {"HF_HUB_OFFLINE": "1", "PATH": os.environ.get("PATH", "")}
    env.update({k: os.environ[k] for k in ("PYTHONPATH", "XDG_STATE_HOME") if k in os.environ})
    return env


__all__ = ["stop"]
