"""List the tools of a running MCP server (official SDK client) and read them as `Tool`s.

Sources (what `load_tools` and `toolscout index` accept):

    mcp:COMMAND ARGS...          launch the server over stdio, e.g. "mcp:uvx mcp-server-git" (one argument,
                                 quoted in a shell; split like a shell would)
    http://HOST/PATH, https://...   a streamable-HTTP endpoint, e.g. http://localhost:8000/mcp (also with the
                                 prefix: mcp:http://...)

The tools go under the server's namespace: the caller's `namespace` when given (CLI: --namespace),
else the name the server reports in its initialize / discover result, else the command's or host's
name. So equal tool names on two servers get distinct ids (`github.search`, `jira.search`). Paginated
listings are followed to the end. `headers` (e.g. an Authorization header) go with every HTTP request.
"""

from __future__ import annotations

import builtins
import re
import shlex
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

from ..errors import CatalogError, MissingDependency
from ..tool import Tool
from .common import LoadReport

PREFIX = "mcp:"
_URL = re.compile(r"^https?://", re.IGNORECASE)
MAX_PAGES = 1000


def is_live_source(source: str) -> bool:
    return source.startswith(PREFIX) or bool(_URL.match(source))


def _command(source: str) -> str | None:
    """The command of an `mcp:COMMAND` source; None for an endpoint (`mcp:http://...` is one too: it
    was run as a command named 'http://...')."""
    rest = source[len(PREFIX):] if source.startswith(PREFIX) else None
    return None if rest is None or _URL.match(rest.strip()) else rest


def _endpoint(source: str) -> str:
    return source[len(PREFIX):].strip() if source.startswith(PREFIX) else source


def load_live_tools(source: str, namespace: str | None = None, lenient: bool = False,
                    report: LoadReport | None = None, timeout: float = 60.0,
                    headers: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None) -> list[Tool]:
    """Tools of the MCP server `source` (see the module doc), parsed as an MCP tools/list result."""
    from . import parse_tools

    server_name, tools = list_live_tools(source, timeout=timeout, headers=headers, env=env)
    namespace = namespace or server_name or _fallback_name(source)
    return parse_tools({"tools": tools}, format="mcp", lenient=lenient, source=source, namespace=namespace,
                       report=report)


def list_live_tools(source: str, timeout: float = 60.0, headers: Mapping[str, str] | None = None,
                    env: Mapping[str, str] | None = None) -> tuple[str | None, list[dict[str, Any]]]:
    """(the server's name or None, its tools as MCP wire objects) for `source`."""
    try:
        import anyio
        import mcp  # noqa: F401
    except ImportError:
        raise MissingDependency("mcp", "listing the tools of a running MCP server", extra="serve") from None
    target = _target(source, headers, env)
    try:
        return anyio.run(_list, target, timeout)
    except CatalogError:
        raise
    except TimeoutError:
        raise CatalogError(f"{source}: the MCP server did not answer within {timeout:.0f}s") from None
    except Exception as exc:  # transports raise many kinds (OSError, ExceptionGroup, McpError, HTTP errors)
        raise CatalogError(f"{source}: could not list the MCP server's tools: {error_reason(exc)}") from None


def _target(source: str, headers: Mapping[str, str] | None, env: Mapping[str, str] | None) -> Any:
    command = _command(source)
    if command is not None:
        from mcp import StdioServerParameters

        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise CatalogError(f"{source}: cannot split the command: {exc}") from None
        if not argv:
            raise CatalogError(f"{source}: give the command that starts the server, e.g. 'mcp:uvx mcp-server-git'")
        return StdioServerParameters(command=argv[0], args=argv[1:], env=dict(env) if env else None)
    if not headers:
        return _endpoint(source)
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    client = httpx2.AsyncClient(headers=dict(headers), timeout=30.0)
    return streamable_http_client(_endpoint(source), http_client=client)


async def _list(target: Any, timeout: float) -> tuple[str | None, list[dict[str, Any]]]:
    import anyio
    from mcp import Client

    with anyio.fail_after(timeout):
        async with Client(target) as client:
            info = client.server_info
            tools: list[dict[str, Any]] = []
            cursor = None
            for _ in range(MAX_PAGES):
                page = await client.list_tools(cursor=cursor)
                tools.extend(t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in page.tools)
                cursor = page.next_cursor
                if not cursor:
                    break
            name = info.name.strip() if info is not None and isinstance(info.name, str) else None
            return name or None, tools


def _fallback_name(source: str) -> str:
    command = _command(source)
    if command is not None:
        argv = shlex.split(command)
        words = [a for a in argv if not a.startswith("-")]
        name = Path(words[-1] if len(words) > 1 and words[0] in ("uvx", "npx", "python", "python3", "node")
                    else words[0]).stem
    else:
        name = urlsplit(_endpoint(source)).hostname or "mcp"
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name) or "mcp"


_EXCEPTION_GROUP = getattr(builtins, "BaseExceptionGroup", ())  # Python 3.11+; `isinstance(x, ())` is False


def error_reason(exc: BaseException) -> str:
    """The innermost useful message of an exception (task groups wrap the real error)."""
    while isinstance(exc, _EXCEPTION_GROUP) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
