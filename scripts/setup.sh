#!/usr/bin/env bash
# Create .venv (if missing) and install toolscout with everything its tests and servers need.
# torch is installed first, pinned, so pip takes the CPU build instead of a multi-GB CUDA one.
# The playground's browser test drives Debian's chromium (Playwright's own browser download cannot work
# here): installed when apt-get is available and we are root; otherwise that test skips with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.toolscout-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  python -m pip install --quiet --upgrade pip
  # --no-compile: Python compiles each module the first time it is imported (and keeps it), instead of pip
  # compiling all of torch's and the other packages' modules up front, most of which nothing here imports.
  # (A module with invalid escape sequences then warns once, when first compiled: ranx's do, on Python 3.12+.)
  python -m pip install --quiet --no-compile torch==2.13.0
  python -m pip install --quiet --no-compile -e ".[all]"
  touch "$stamp"
fi

install_chromium() {
  [ -x /usr/bin/chromium ] && return 0
  command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ] || return 0
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q chromium >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } \
    || echo "setup: could not install Debian's chromium; the browser test (tests/test_ui.py) will skip" >&2
}
install_chromium || true

# From npm, for the gateway's tests: a real third-party MCP server (the reference "everything" server) and a
# second MCP client (the MCP Inspector's CLI, tests/test_gateway_inspector.py), installed where the tests look
# for them. Without npm those tests skip, saying so.
install_npm_tools() {
  command -v npm >/dev/null 2>&1 || return 0
  [ -x .npm-upstreams/node_modules/.bin/mcp-server-everything ] \
    && [ -f .npm-upstreams/node_modules/@modelcontextprotocol/inspector-cli/build/index.js ] && return 0
  mkdir -p .npm-upstreams
  npm install --prefix .npm-upstreams --no-audit --no-fund --silent @modelcontextprotocol/server-everything@2026.8.31 \
    @modelcontextprotocol/inspector-cli@1.0.3 >/dev/null 2>&1 \
    || echo "setup: npm could not install @modelcontextprotocol/server-everything and inspector-cli" >&2
}
install_npm_tools
