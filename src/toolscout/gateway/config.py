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

One bad server never stops the rest: an entry whose values cannot be resolved (a `${VAR}` that is not set
and has no default, a command that cannot be found) is read all the same, with the reason in its
`problem`; the gateway marks that server down with that reason and serves the others. So is a mistake in
an entry's shape (`args` that is not a list, a `timeout` that is not a number). `strict=True` (the CLI's
`--strict`) makes them an error instead: one error listing every problem of the file, not the first. A file
that is not a config at all, or a name that cannot be a namespace, is always an error.

Each entry's name becomes the namespace of its tools (ids `NAME.tool`), so names are letters, digits,
`_` and `-`. `${VAR}` (or `${VAR:-default}`) in `command`, `args`, `env`, `cwd`, `url`, `headers`, `query`,
`base_url` and `spec` is read from the gateway's environment (where hosts' mcp.json reads it) when the file
is read, so secrets stay out of the file; a variable that is not set and has no default is named, with the
file, the server and the field, in that server's `problem` (or in the error, when strict). An OpenAPI
entry's `query` holds parameters added to every call (an API key `in: query`); its `base_url` takes none.
toolscout's own keys per server: `timeout` (seconds one call may take, default 60), `enabled` (default
true; `disabled: true`, as some hosts write it, means the same as `enabled: false`) and `forwardHeaders`
(names of the agent's HTTP request headers passed on to this server's calls; none by default). Keys
toolscout does not know are kept out of the way with a warning, so a host's own keys (`autoApprove`, ...)
do not break the file; one a letter away from a key toolscout reads is a typo (said; an error when
strict), as is a key given twice in one object.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from ..defaults import usable_cores
from ..errors import ToolScoutError
from ..ingest.remote import is_http_url, unsupported_scheme_problem

DEFAULT_TIMEOUT_S = 60.0
PING_EVERY_S = 10.0  # how often the gateway pings each MCP upstream (mcp_upstream: what a missed ping does)
# How long searches wait, in all, for an upstream that is starting and has no tools in the index yet (a new
# index, a server new to the config), counted from the first search that waits for it (core.Gateway.searchable).
# 20 stdio servers on two busy cores listed their tools within 12 s of the gateway's start (docs/gateway.md).
SEARCH_WAIT_S = 10.0
# Upstreams start a few at a time (core.Gateway.run): each start is mostly CPU (an interpreter or node loading),
# and twenty at once on a laptop's cores starve the gateway's own first answers. A turn ends when the upstream
# is up or down, or after START_TURN_S, so a slow server holds the others back by that much at most.
START_TURN_S = 1.0
# A forwarded call's lesson waits this long for the calls after it, and they are learned as one batch
# (core.CallLearner): learning each call alone kept an agent's next search sharing the cores with it.
LEARN_GATHER_S = 0.25


def starts_at_once() -> int:
    """How many upstreams start together: one per core, at least two."""
    return max(2, usable_cores())


_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_VARIABLE = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")  # ${env:VAR}: VS Code's, Cursor's
_MCP_KEYS = {"command", "args", "env", "cwd", "url", "headers", "type", "transport", "timeout", "enabled",
             "disabled", "forwardHeaders", "forward_headers"}
_OPENAPI_KEYS = {"spec", "base_url", "baseUrl", "headers", "query", "timeout", "enabled", "disabled",
                 "forwardHeaders", "forward_headers"}
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
    query: Mapping[str, str] = field(default_factory=dict)  # an OpenAPI upstream's: added to every call's URL
    spec: str | None = None
    base_url: str | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    enabled: bool = True
    forward_headers: tuple[str, ...] = ()
    problem: str | None = None  # why this server cannot be started as configured (None: it can)

    def describe(self) -> str:
        """Where this upstream is, for people (no secrets: headers and env values are left out)."""
        if self.kind == "stdio":
            return " ".join([self.command or "", *self.args]).strip() or "(no command: see its problem)"
        if self.kind == "http":
            return self.url or "(no url: see its problem)"
        if not self.spec:
            return "(no spec: see its problem)"
        return f"{self.spec} ({self.base_url or 'the server the spec names'})"


def _not_forwarded(where: str, headers: Mapping[str, str], forwarded: tuple[str, ...]) -> Mapping[str, str]:
    """`headers`, refused when `forwardHeaders` names one of them too (header names are case-insensitive):
    the agent's value would take the place of the configured one (an API key)."""
    both = [key for key in headers if key.lower() in forwarded]
    if both:
        raise ConfigError(f"{where}: forwardHeaders names {both[0].lower()!r}, which {where.split(': ')[-1]}."
                          f"headers.{both[0]} sets: the agent's header would replace the configured one; "
                          "keep one of them")
    return headers


def _check_base_url(where: str, base_url: str | None) -> None:
    """A base URL is what each operation's path is appended to: a query or fragment in it would end up in the
    middle of the URL (and be dropped). Its value is not shown: a query often carries a key."""
    if base_url is None:
        return
    scheme_host_path, query, fragment = re.match(r"([^?#]*)(\?[^#]*)?(#.*)?", base_url).groups()
    if query or fragment:
        entry = where.split(": ")[-1]
        raise ConfigError(f"{where}.base_url: {scheme_host_path!r} is followed by a "
                          f"{'query string' if query else 'fragment'}; a base URL takes none (each call's path is "
                          f"appended to it): give query parameters every call needs (an API key) as {entry}.query")


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

    @property
    def problems(self) -> list[tuple[str, str]]:
        """(name, why) of each enabled server that cannot be started as configured."""
        return [(u.name, u.problem) for u in self.enabled if u.problem]


def load_config(path: str | os.PathLike, environ: Mapping[str, str] | None = None, *,
                strict: bool = False) -> GatewayConfig:
    """Read and check the config at `path`; `environ` (default: os.environ) resolves `${VAR}`. `strict`: an
    unset variable or a command that cannot be found is a ConfigError (else it is the server's `problem`)."""
    path = Path(path)
    repeated: list[str] = []
    try:
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_noting_repeats(repeated))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc}") from None
    message = None
    if repeated:  # JSON keeps the last of a repeated key: a server given twice silently loses its first entry
        message = (f"{path}: the key(s) {sorted(set(repeated))} appear twice in one object; only the last of "
                   "each is read")
    config = parse_config(data, path, os.environ if environ is None else environ, strict=strict,
                          found=[message] if message else [])
    return config if not repeated else replace(config, warnings=(message, *config.warnings))


def _noting_repeats(repeated: list[str]):
    """A json object hook that builds each object as json does and adds the keys it meets twice to `repeated`."""
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                repeated.append(key)
            out[key] = value
        return out
    return hook


def parse_config(data: Any, path: Path, environ: Mapping[str, str], *, strict: bool = False,
                 found: list[str] | None = None) -> GatewayConfig:
    """The config `data` read from `path`. `strict`: every mistake a start would warn of or mark a server down
    for (`found`: those met before, a key given twice) is one ConfigError listing them all, so one run shows
    what to fix, not the first of them."""
    if not isinstance(data, dict):
        raise ConfigError(f'{path}: expected an object like {{"mcpServers": {{"NAME": {{"command": ...}}}}}}')
    if "mcpServers" not in data and "openapi" not in data:
        raise ConfigError(f"{path}: no 'mcpServers' (nor 'openapi') section: nothing to put behind the gateway")
    reader = _Reader(path, environ, strict)
    if strict:
        reader.refused += found or []
    upstreams = [reader.entry(section, name, entry) for section in ("mcpServers", "openapi")
                 for name, entry in _section(data, section, path).items()]
    if not upstreams:
        raise ConfigError(f"{path}: 'mcpServers' (and 'openapi') name no server: nothing to put behind the gateway")
    unknown = sorted(set(data) - {"mcpServers", "openapi"})
    if unknown:
        reader.warnings.append(f"{path}: top-level key(s) {unknown} ignored")
    seen: set[str] = set()
    for upstream in upstreams:
        if upstream.name in seen:
            raise ConfigError(f"{path}: the name {upstream.name!r} is used twice (once in mcpServers, once in "
                              "openapi); names become namespaces and must be unique")
        seen.add(upstream.name)
    if len(reader.refused) == 1:
        raise ConfigError(reader.refused[0])
    if reader.refused:
        listed = "".join(f"\n  - {message}" for message in reader.refused)
        raise ConfigError(f"{path}: {len(reader.refused)} problems, and a strict gateway starts with none:{listed}")
    return GatewayConfig(path, tuple(upstreams), tuple(reader.warnings))


def _enabled_of(entry: dict) -> bool:
    """Whether an entry is enabled: `enabled: false` or, as some hosts write it, `disabled: true` turn it off."""
    return entry.get("enabled", True) is not False and entry.get("disabled", False) is not True


def _section(data: dict, key: str, path: Path) -> dict[str, Any]:
    section = data.get(key) or {}
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: '{key}' must be an object mapping each name to its settings")
    return section


class _Reader:
    """Reads one config's entries, collecting warnings; every error names the file, entry and field."""

    def __init__(self, path: Path, environ: Mapping[str, str], strict: bool = False):
        self.path, self.environ, self.strict, self.warnings = path, environ, strict, []
        self.refused: list[str] = []  # strict: every mistake met, reported together (`parse_config`)
        self.problem: str | None = None  # the entry being read: the first value that could not be resolved
        self.enabled = True  # the entry being read: whether it is enabled

    def entry(self, section: str, name: Any, entry: Any) -> UpstreamSpec:
        """One entry of `section` ("mcpServers" or "openapi"). An entry whose shape is wrong (args not a list,
        a timeout that is not a number, ...) is a server that is down with that reason, so one bad entry does
        not stop the others; when strict it is an error, as is a name that cannot be a namespace."""
        try:
            return self.openapi(name, entry) if section == "openapi" else self.mcp(name, entry)
        except ConfigError as exc:
            self.problem = None
            if not isinstance(name, str) or not _NAME.match(name):
                raise
            if self.strict:
                self.refused.append(str(exc))
            settings = entry if isinstance(entry, dict) else {}
            kind = "openapi" if section == "openapi" else "http" if "url" in settings else "stdio"
            return UpstreamSpec(name, kind, enabled=_enabled_of(settings), problem=str(exc))

    def mcp(self, name: str, entry: Any) -> UpstreamSpec:
        where = self._entry(name, entry, "mcpServers", _MCP_KEYS)
        kind = self._kind(where, entry)
        common = self._common(where, entry)
        if kind == "stdio":
            args = entry.get("args") or []
            if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
                raise ConfigError(f"{where}.args: must be a list of strings")
            command = self._path(self._expanded(where, entry, "command", required=True)) or ""
            args = [self._expand(f"{where}.args[{i}]", str(a)) for i, a in enumerate(args)]
            env, cwd = self._strings(where, entry, "env"), self._path(self._expanded(where, entry, "cwd"))
            if self.enabled and find_command(command) is None:
                self._unresolved(f"{where}.command: {missing_command(command)}")
            if self.enabled and cwd is not None and not Path(cwd).is_dir():
                self._unresolved(f"{where}.cwd: no such directory {cwd!r}")
            return UpstreamSpec(name, "stdio", command=command, args=tuple(args), env=env, cwd=cwd,
                                problem=self._take_problem(), **common)
        url = self._expanded(where, entry, "url", required=True) or ""
        if self.problem is None and not re.match(r"^https?://", url, re.IGNORECASE):  # else: a variable is unset
            raise ConfigError(f"{where}.url: must be an http:// or https:// URL, got {url!r}")
        headers = _not_forwarded(where, self._strings(where, entry, "headers"), common["forward_headers"])
        return UpstreamSpec(name, "http", url=url, headers=headers, problem=self._take_problem(), **common)

    def openapi(self, name: str, entry: Any) -> UpstreamSpec:
        where = self._entry(name, entry, "openapi", _OPENAPI_KEYS)
        common = self._common(where, entry)
        base_url = self._string(where, entry, "base_url") or self._string(where, entry, "baseUrl")
        spec = self._expand(f"{where}.spec", self._string(where, entry, "spec", required=True)) or ""
        if problem := unsupported_scheme_problem(spec):  # 'htp://...' is a typo, not a file beside the config
            self._unresolved(f"{where}.spec: {problem}")
        elif not is_http_url(spec):
            if not Path(spec).is_absolute():
                spec = str((self.path.parent / spec).resolve())  # relative to the config file, as people expect
            if self.enabled and not Path(spec).is_file():
                self._unresolved(f"{where}.spec: no such file {spec!r}")
        base_url = self._expand(f"{where}.base_url", base_url)
        _check_base_url(where, base_url)
        return UpstreamSpec(name, "openapi", spec=spec, base_url=base_url,
                            headers=_not_forwarded(where, self._strings(where, entry, "headers"),
                                                   common["forward_headers"]),
                            query=self._strings(where, entry, "query"),
                            problem=self._take_problem(), **common)

    def _unresolved(self, message: str) -> None:
        """A value of the entry being read cannot be resolved: an error when strict (for an enabled server),
        else its problem."""
        if self.strict and self.enabled:
            self.refused.append(message)
        self.problem = self.problem or message

    def _take_problem(self) -> str | None:
        problem, self.problem = self.problem, None
        return problem

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
        typos = {key: _near_miss(key, known - set(entry)) for key in unknown}
        for key, meant in typos.items():  # a near miss of a key toolscout reads is a typo, not a host's own key
            if meant is not None:
                message = f"{where}.{key}: not a key toolscout reads (ignored); did you mean {meant!r}?"
                (self.refused if self.strict else self.warnings).append(message)
        others = [key for key in unknown if typos[key] is None]
        if others:
            self.warnings.append(f"{where}: key(s) {others} ignored")
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
            typos = [f"{key!r} (did you mean {_near_miss(key, {'command', 'url'})!r}?)" for key in entry
                     if key not in _MCP_KEYS and _near_miss(key, {"command", "url"})]
            raise ConfigError(f"{where}: needs 'command' (a server the gateway starts over stdio) or 'url' "
                              "(a streamable-HTTP endpoint)" + (f"; it has {', '.join(typos)}" if typos else ""))
        kind = "stdio" if has_command else "http"
        if declared is not None and (declared == "stdio") != (kind == "stdio"):
            raise ConfigError(f"{where}.type: {declared!r} does not match the entry's "
                              f"{'command' if has_command else 'url'}")
        return kind

    def _common(self, where: str, entry: dict) -> dict[str, Any]:
        timeout = entry.get("timeout", DEFAULT_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 86_400:
            raise ConfigError(f"{where}.timeout: seconds one call may take, a number above 0, got {timeout!r}")
        if not isinstance(entry.get("enabled", True), bool) or not isinstance(entry.get("disabled", False), bool):
            raise ConfigError(f"{where}: 'enabled' and 'disabled' must be true or false")
        forward = entry.get("forwardHeaders", entry.get("forward_headers", []))
        if not isinstance(forward, list) or not all(isinstance(h, str) and h.strip() for h in forward):
            raise ConfigError(f"{where}.forwardHeaders: must be a list of header names")
        self.enabled = _enabled_of(entry)
        return {"timeout": float(timeout), "enabled": self.enabled,
                "forward_headers": tuple(h.strip().lower() for h in forward)}

    def _string(self, where: str, entry: dict, key: str, required: bool = False) -> str | None:
        value = entry.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{where}.{key}: must be a non-empty string")
        return value

    def _expanded(self, where: str, entry: dict, key: str, required: bool = False) -> str | None:
        """The string at `key`, its variables read from the environment (as hosts' mcp.json does)."""
        return self._expand(f"{where}.{key}", self._string(where, entry, key, required))

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
            self._unresolved(f"{where}: the environment variable {name} is not set (the config reads "
                             f"${{{name}}}); set it before starting the gateway, or write ${{{name}:-default}}")
            return ""

        return _VARIABLE.sub(value, text)


def _near_miss(key: str, known: set[str]) -> str | None:
    """The key toolscout reads that `key` looks like a slip of (`arg` for `args`, `Command`), or None. Only a
    letter or so apart: a host's own keys (`transportType`, `timeoutMs`) may resemble ours more loosely."""
    def alike(ours: str) -> bool:
        return abs(len(ours) - len(key)) <= 1 and \
            difflib.SequenceMatcher(None, key.lower(), ours.lower()).ratio() >= 0.8
    return next((ours for ours in sorted(known) if alike(ours)), None)


def find_command(command: str) -> str | None:
    """The executable a server's `command` names: a path as it is, a bare name on PATH, else beside the
    gateway's own interpreter (a server installed into its virtual environment, which need not be
    activated); None when there is none."""
    if os.sep in command:
        return command if os.path.isfile(command) and os.access(command, os.X_OK) else None
    found = shutil.which(command)
    if found:
        return found
    beside = Path(sys.executable).parent / command
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def missing_command(command: str) -> str:
    """Why `command` cannot be started (find_command found nothing), for people."""
    if os.sep in command:
        what = "is not executable" if os.path.isfile(command) else "does not exist"
        return f"the command {command!r} {what}"
    return (f"the command {command!r} was not found on PATH nor beside the gateway's interpreter "
            f"({Path(sys.executable).parent}); install it, or give its full path")
