"""Take docs/playground.png: the playground page over the bundled MCP reference servers catalog.

    python scripts/playground_screenshot.py [--out docs/playground.png]

Indexes the catalog with the default pipeline, starts `toolscout serve` on a free loopback port with a
token, teaches the tool that fits the task from a little feedback, then drives Debian's chromium (headless, through
Playwright for Python) the way a user would: token, task, top tool, a namespace.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from toolscout import ToolScout, load_tools

ROOT = Path(__file__).resolve().parents[1]
CATALOG = ROOT / "src/toolscout/data/catalogs/mcp_reference_servers.json"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
TOKEN = "playground-screenshot"
TASK = "show the last 20 lines of the server log file"
TAUGHT = "filesystem.read_text_file"
FEEDBACK = ["tail the error log", "print the end of build.log", "what does the newest log entry say"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs/playground.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        index = Path(tmp) / "index"
        ToolScout.from_tools(load_tools(CATALOG)).save(index)  # the default pipeline, as `toolscout index`
        url, server = serve(index)
        try:
            prepare(url)
            screenshot(url, args.out)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
    print(f"wrote {args.out}")


def serve(index: Path) -> tuple[str, subprocess.Popen]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "toolscout.serve", str(index), "--port", str(port),
                               "--token", TOKEN, "--no-fsync"], env={**os.environ, "HF_HUB_OFFLINE": "1"})
    for _ in range(1200):
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return url, server
        except httpx.HTTPError:
            pass
        try:
            server.wait(timeout=0.1)
            raise SystemExit("toolscout serve exited")
        except subprocess.TimeoutExpired:
            pass
    server.kill()
    raise SystemExit("toolscout serve did not start")


def prepare(url: str) -> None:
    """Feedback for the tool that fits the task, so the page has counts to show."""
    events = [{"query": q, "tool_ids": [TAUGHT], "source": f"agent-{i % 2}"} for i, q in enumerate(FEEDBACK)]
    httpx.post(f"{url}/feedback", json={"events": events}, headers={"authorization": f"Bearer {TOKEN}"},
               timeout=30).raise_for_status()


def screenshot(url: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.goto(f"{url}/ui")
        page.fill("#token", TOKEN)
        page.click("#token-form button[type=submit]")
        page.locator("[data-testid=namespace] button[data-namespace=memory]").click()
        page.get_by_test_id("catalog-tool").first.wait_for()
        page.fill("#task", TASK)
        page.click("#search-button")
        page.locator(f"[data-testid=hit][data-id='{TAUGHT}'] [data-testid=open-tool]").click()
        page.get_by_test_id("schema").wait_for()
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out))
        browser.close()


if __name__ == "__main__":
    main()
