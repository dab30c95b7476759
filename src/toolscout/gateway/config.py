"""The gateway's upstreams, read from the `mcpServers` JSON that Claude Desktop, Cursor and LiveMCPBench use.

    {"mcpServers": {
        "time":   {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}, "cwd": "/srv"},
        "github": {"url": "https://api.example.com/mcp", "headers": {"Authorization": "Bearer ${GITHUB_TOKEN}"}},
        "slow":   {"command": "node", "args": ["slow.js"], "timeout": 120, "enabled": false}},
     "openapi": {
        "petstore": {"spec": "petstore.yaml", "base_url": "https://petstore.example.com/v3",
                     "headers": {"api_key": "${PETSTORE_KEY}"}}}}

A relative `spec`, and a relative `command` or `cwd` with a `/` in it, are relative to the config file; a
bare command name is looked up on PATH, then beside the gateway's own interpreter (a server installed into
toolscout's virtual environment works without activating it; `mcp_upstream`), and a bare `cwd` name is
taken as the server's process takes it (relative to where the gateway runs).

Each entry's name becomes the namespace of its tools (ids `NAME.tool`), so names are letters, digits,
`_` and `-`. `${VAR}` (or `${VAR:-default}`) in `env`, `headers` and `base_url` is read from the
gateway's environment when the file is read, so secrets stay out of the file; a variable that is not set
and has no default is an error naming the file, the server and the field. toolscout's own keys per server:
`timeout` (seconds one call may take, default 60), `enabled` (default true; `disabled: true`, as some
hosts write it, means the same as `enabled: false`) and `forwardHeaders` (names of the agent's HTTP
request headers passed on to this server's calls; none by default). Keys toolscout does not know are kept
out of the way with a warning, so a host's own keys (`autoApprove`, ...) do not break the file.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..errors import ToolScoutError

DEFAULT_TIMEOUT_S = 60.0
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_MCP_KEYS = {"command", "args", "env", "cwd", "url", "headers", "type", "transport", "timeout", "enabled",
             "disabled", "forwardHeaders", "forward_headers"}
_OPENAPI_KEYS = {"spec", "base_url", "baseUrl", "headers", "timeout", "enabled", "disabled", "forwardHeaders",
                 "forward_headers"}
_HTTP_TYPES = {"http", "streamable-http", "streamable_http", "streamableHttp"}


class ConfigError(ToolScoutError, ValueError):
    """The gateway's config file is wrong; the message names the file, the server and the field."""


@dataclass(frozen=True)
class UpstreamSpec:
    """One upstream as the config describes it. `kind`: "stdio" (a command the gateway starts), "http" (a
    streamable-HTTP MCP endpoint) or "openapi" (an HTTP API described by an OpenAPI document)."""

    name: str
    kind: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    spec: str | None = None
    base_url: str | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    enabled: bool = True
    forward_headers: tuple[str, ...] = ()

    def describe(self) -> str:
        """Where this upstream is, for people (no secrets: headers and env values are left out)."""
        if self.kind == "stdio":
            return " ".join([self.command or "", *self.args]).strip()
        return self.url if self.kind == "http" else f"{self.spec} ({self.base_url or 'servers[0] of the spec'})"


@dataclass(frozen=True)
class GatewayConfig:
    path: Path
    upstreams: tuple[UpstreamSpec, ...]
    warnings: tuple[str, ...] = ()

    @property
    def enabled(self) -> list[UpstreamSpec]:
        return [u for u in self.upstreams if u.enabled]

    def names(self) -> list[str]:
        return [u.name for u in self.upstreams]


def load_config(path: str | os.PathLike, environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """Read and check the config at `path`; `environ` (default: os.environ) resolves `${VAR}`."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc}") from None
    return parse_config(data, path, os.environ if environ is None else environ)


def parse_config(data: Any, path: Path, environ: Mapping[str, str]) -> GatewayConfig:
    if not isinstance(data, dict):
        raise ConfigError(f'{path}: expected an object like {{"mcpServers": {{"NAME": {{"command": ...}}}}}}')
    if "mcpServers" not in data and "openapi" not in data:
        raise ConfigError(f"{path}: no 'mcpServers' (nor 'openapi') section: nothing to put behind the gateway")
    reader = _Reader(path, environ)
    upstreams = [reader.mcp(name, entry) for name, entry in _section(data, "mcpServers", path).items()]
    upstreams += [reader.openapi(name, entry) for name, entry in _section(data, "openapi", path).items()]
    unknown = sorted(set(data) - {"mcpServers", "openapi"})
    if unknown:
        reader.warnings.append(f"{path}: top-level key(s) {unknown} ignored")
    seen: set[str] = set()
    for upstream in upstreams:
        if upstream.name in seen:
            raise ConfigError(f"{path}: the name {upstream.name!r} is used twice (once in mcpServers, once in "
                              "openapi); names become namespaces and must be unique")
        seen.add(upstream.name)
    return GatewayConfig(path, tuple(upstreams), tuple(reader.warnings))


def _section(data: dict, key: str, path: Path) -> dict[str, Any]:
    section = data.get(key) or {}
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: '{key}' must be an object mapping each name to its settings")
    return section


class _Reader:
    """Reads one config's entries, collecting warnings; every error names the file, entry and field."""

    def __init__(self, path: Path, environ: Mapping[str, str]):
        self.path, self.environ, self.warnings = path, environ, []

    def mcp(self, name: str, entry: Any) -> UpstreamSpec:
        where = self._entry(name, entry, "mcpServers", _MCP_KEYS)
        kind = self._kind(where, entry)
        common = self._common(where, entry)
        if kind == "stdio":
            args = entry.get("args") or []
            if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
                raise ConfigError(f"{where}.args: must be a list of strings")
            return UpstreamSpec(name, "stdio", command=self._path(self._string(where, entry, "command", required=True)),
                                args=tuple(str(a) for a in args), env=self._strings(where, entry, "env"),
                                cwd=self._path(self._string(where, entry, "cwd")), **common)
        url = self._string(where, entry, "url", required=True)
        if not re.match(r"^https?://", url, re.IGNORECASE):
            raise ConfigError(f"{where}.url: must be an http:// or https:// URL, got {url!r}")
        return UpstreamSpec(name, "http", url=url, headers=self._strings(where, entry, "headers"), **common)

    def openapi(self, name: str, entry: Any) -> UpstreamSpec:
        where = self._entry(name, entry, "openapi", _OPENAPI_KEYS)
        base_url = self._string(where, entry, "base_url") or self._string(where, entry, "baseUrl")
        spec = self._string(where, entry, "spec", required=True)
        if not re.match(r"^https?://", spec, re.IGNORECASE) and not Path(spec).is_absolute():
            spec = str((self.path.parent / spec).resolve())  # relative to the config file, as people expect
        return UpstreamSpec(name, "openapi", spec=spec, base_url=self._expand(f"{where}.base_url", base_url),
                            headers=self._strings(where, entry, "headers"), **self._common(where, entry))

    def _path(self, value: str | None) -> str | None:
        """A relative path with a '/' in it, relative to the config file; a bare name is left as it is (a
        command is looked up when the server starts: on PATH, then beside the gateway's interpreter)."""
        if value is None or "/" not in value or Path(value).is_absolute():
            return value
        return str((self.path.parent / value).resolve())

    # ----------------------------------------------------------------------------------- fields
    def _entry(self, name: Any, entry: Any, section: str, known: set[str]) -> str:
        where = f"{self.path}: {section}.{name}"
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(f"{where}: a server name is 1 to 64 letters, digits, '_' or '-' (it becomes the "
                              "namespace of the server's tools, and tool ids are NAME.tool)")
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: must be an object of settings")
        unknown = sorted(set(entry) - known)
        if unknown:
            self.warnings.append(f"{where}: key(s) {unknown} ignored")
        return where

    def _kind(self, where: str, entry: dict) -> str:
        declared = entry.get("type", entry.get("transport"))
        if declared is not None and declared not in _HTTP_TYPES | {"stdio"}:
            raise ConfigError(f"{where}.type: {declared!r} is not supported; use 'stdio' (with 'command') or "
                              "'http' (streamable HTTP, with 'url')")
        has_command, has_url = "command" in entry, "url" in entry
        if has_command and has_url:
            raise ConfigError(f"{where}: give either 'command' (a server the gateway starts) or 'url', not both")
        if not has_command and not has_url:
            raise ConfigError(f"{where}: needs 'command' (a server the gateway starts over stdio) or 'url' "
                              "(a streamable-HTTP endpoint)")
        kind = "stdio" if has_command else "http"
        if declared is not None and (declared == "stdio") != (kind == "stdio"):
            raise ConfigError(f"{where}.type: {declared!r} does not match the entry's "
                              f"{'command' if has_command else 'url'}")
        return kind

    def _common(self, where: str, entry: dict) -> dict[str, Any]:
        timeout = entry.get("timeout", DEFAULT_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 86_400:
            raise ConfigError(f"{where}.timeout: seconds one call may take, a number above 0, got {timeout!r}")
        enabled = entry.get("enabled", True)
        disabled = entry.get("disabled", False)
        if not isinstance(enabled, bool) or not isinstance(disabled, bool):
            raise ConfigError(f"{where}: 'enabled' and 'disabled' must be true or false")
        forward = entry.get("forwardHeaders", entry.get("forward_headers", []))
        if not isinstance(forward, list) or not all(isinstance(h, str) and h.strip() for h in forward):
            raise ConfigError(f"{where}.forwardHeaders: must be a list of header names")
        return {"timeout": float(timeout), "enabled": enabled and not disabled,
                "forward_headers": tuple(h.strip().lower() for h in forward)}

    def _string(self, where: str, entry: dict, key: str, required: bool = False) -> str | None:
        value = entry.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{where}.{key}: must be a non-empty string")
        return value

    def _strings(self, where: str, entry: dict, key: str) -> dict[str, str]:
        value = entry.get(key) or {}
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{where}.{key}: must be an object of names to strings")
        out = {}
        for name, text in value.items():
            if not isinstance(text, (str, int, float)) or isinstance(text, bool):
                raise ConfigError(f"{where}.{key}.{name}: must be a string")
            out[name] = self._expand(f"{where}.{key}.{name}", str(text))
        return out

    def _expand(self, where: str, text: str | None) -> str | None:
        """`text` with each `${VAR}` / `${VAR:-default}` replaced from the gateway's environment."""
        if text is None:
            return None

        def value(match: re.Match) -> str:
            name, default = match.group(1), match.group(2)
            if name in self.environ:
                return self.environ[name]
            if default is not None:
                return default
            raise ConfigError(f"{where}: the environment variable {name} is not set (the config reads "
                              f"${{{name}}}); set it before starting the gateway, or write ${{{name}:-default}}")

        return _VARIABLE.sub(value, text)
