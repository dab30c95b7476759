"""Real toolscout servers for the tests: `python -m toolscout.serve ...` in a subprocess on a free loopback
port, ready once /health answers (polled; a server that exits first fails the test with its stderr)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


# Each test process's server logs go in one folder, removed when that process exits, so a test that stops
# a server another way, or fails before stopping it, leaves nothing in the system's temporary folder.
_LOGS = tempfile.TemporaryDirectory(prefix="toolscout-test-logs-", ignore_cleanup_errors=True)


def log_file(prefix: str):
    """A new log file for a process a test starts (open for writing, kept after close)."""
    return tempfile.NamedTemporaryFile(prefix=prefix, suffix=".log", delete=False, dir=_LOGS.name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: list[str], port: int | None = None, token: str | None = None,
                 timeout: float = 120) -> tuple[subprocess.Popen, str]:
    """Start `toolscout.serve ARGS --port PORT` (TOOLSCOUT_TOKEN=token when given); (process, base URL)."""
    port = port or free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("TOOLSCOUT_TOKEN", None)
    if token:
        env["TOOLSCOUT_TOKEN"] = token
    # the log goes to a file, not a pipe: a pipe nobody reads would stall a server that logs a lot
    log = log_file("serve-")
    proc = subprocess.Popen([sys.executable, "-m", "toolscout.serve", *args, "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=log)
    proc.log_path = log.name
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, timeout)
    return proc, url


def wait_ready(proc: subprocess.Popen, url: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {server_log(proc)[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            proc.kill()
            raise AssertionError(f"server at {url} did not start in {timeout:.0f} s")
        time.sleep(0.1)  # polling interval, not a handshake: readiness is /health answering


def server_log(proc: subprocess.Popen) -> str:
    """What the server wrote to stderr so far."""
    return Path(proc.log_path).read_text(errors="replace")


def served_search(args: list[str], query: str, k: int) -> tuple[dict, list[dict]]:
    """Start `toolscout serve args`, and return its /health and the hits of one search for `query`; the
    server is stopped before returning."""
    proc, url = start_server(args)
    try:
        health = httpx.get(f"{url}/health").json()
        return health, httpx.post(f"{url}/search", json={"query": query, "k": k}).json()["results"][0]["hits"]
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """Stop the server and remove its log (a failing wait has already quoted it)."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
    log = getattr(proc, "log_path", None)  # servers and gateways this module's helpers started keep one
    if log:
        Path(log).unlink(missing_ok=True)


class DocumentHost:
    """Static documents on loopback, served from a thread: `{path: (content type, body)}`; a path mapped to
    None is a host that never answers (its request is held until the host stops)."""

    def __init__(self, documents: dict):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        released = self.released = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path in documents and documents[self.path] is None:
                    released.wait(30)  # hangs until the host stops
                    return
                content_type, body = documents.get(self.path, ("text/plain", None))
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", content_type)
                data = (body or "not found").encode()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "DocumentHost":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
