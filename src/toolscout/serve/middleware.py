"""ASGI layers around the HTTP API: body limits and media types, request metrics, bearer tokens for the
MCP endpoint, and the last line of defence that turns an unexpected exception into a logged 500."""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Sequence

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from .auth import AuthConfig, AuthError
from .metrics import Metrics

logger = logging.getLogger("toolscout.serve")

KINDS = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
         409: "conflict", 413: "payload_too_large", 415: "unsupported_media_type", 422: "invalid_request",
         500: "internal_error", 503: "unavailable"}


try:  # orjson writes the same JSON several times faster: a search response is much of a request's CPU
    import orjson
except ImportError:  # pragma: no cover - orjson ships with the serve extra
    orjson = None


def _dumps(content: Any) -> bytes:
    if orjson is not None:
        try:
            return orjson.dumps(content)
        except TypeError:  # an integer beyond 64 bits (JSON allows it, a tool's schema may hold one)
            pass
    return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


class JSON(Response):
    """A JSON response (orjson when installed)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return _dumps(content)


def error_response(status: int, message: str, details: list | None = None, headers: dict[str, str] | None = None,
                   kind: str | None = None) -> JSONResponse:
    """The one error shape: `{"error": {"type", "message", "details"?}}`."""
    body: dict[str, Any] = {"type": kind or KINDS.get(status, "error"), "message": message}
    if details:
        body["details"] = details
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def too_large(limit: int) -> str:
    return f"request body is larger than the limit of {limit} bytes (the server's --max-body)"


class _TooLarge(StarletteHTTPException):
    def __init__(self, limit: int):
        super().__init__(413, too_large(limit))


class BodyLimit:
    """Refuses bodies over `max_bytes` with 413 (by Content-Length up front, else while reading) and
    bodies that are not JSON with 415 (on the API's own routes; /mcp checks its own). The MCP endpoint has
    its own limit, `mcp_max_bytes` (tool calls carry files and images), and answers it as MCP clients
    understand: a JSON-RPC error whose message says the limit."""

    def __init__(self, app: Any, max_bytes: int, mcp_max_bytes: int | None = None):
        self.app = app
        self.max_bytes = max_bytes
        self.mcp_max_bytes = mcp_max_bytes or max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        length = headers.get("content-length")
        if scope["path"].startswith("/mcp"):
            return await self._mcp(scope, receive, send, length)
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await error_response(413, too_large(self.max_bytes))(
                scope, receive, send)
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        if (length is None or length != "0") and media and media != "application/json" and not media.endswith("+json"):
            return await error_response(415, f"expected Content-Type application/json, got {media!r}")(
                scope, receive, send)
        received = 0
        limit = self.max_bytes

        async def limited() -> dict:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _TooLarge(limit)
            return message

        await self.app(scope, limited, send)

    async def _mcp(self, scope: dict, receive: Any, send: Any, length: str | None) -> None:
        """/mcp: the body read whole (the SDK reads it whole too), refused as a JSON-RPC error when too large."""
        limit = self.mcp_max_bytes
        if length is not None and length.isdigit() and int(length) > limit:
            return await jsonrpc_too_large(int(length), limit)(scope, receive, send)
        body, messages = 0, []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            body += len(message.get("body", b""))
            if body > limit:
                return await jsonrpc_too_large(body, limit)(scope, receive, send)
            if not message.get("more_body", False):
                break

        async def replay() -> dict:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


def jsonrpc_too_large(size: int, limit: int) -> JSONResponse:
    """413 with a JSON-RPC error, which MCP clients show as its message."""
    message = (f"the request ({size} bytes{' so far' if size <= limit else ''}) is larger than this MCP endpoint "
               f"takes: {limit} bytes (the server's --mcp-max-body)")
    return jsonrpc_refusal(413, message)


def jsonrpc_refusal(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """/mcp's answer to a request it refuses before reading it (id null): a JSON-RPC error, whose message MCP
    clients show (the SDK's client reads no REST error body: it would say "Server returned an error response")."""
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}},
                        status_code=status, headers=headers)


def bearer_challenge(exc: AuthError) -> dict[str, str] | None:
    """The WWW-Authenticate header of an AuthError's answer: a 401 asks for a bearer token, and names an invalid
    one as such (RFC 6750); a 403 has none."""
    if exc.status != 401:
        return None
    return {"WWW-Authenticate": 'Bearer error="invalid_token"' if "invalid" in exc.message else "Bearer"}


class Observe:
    """Records each request's route template, status and duration in `metrics`. `routes`: the app's, to name
    the route of a request answered before it was routed (a body too large, of the wrong type)."""

    def __init__(self, app: Any, metrics: Metrics, routes: Sequence[Any] = ()):
        self.app = app
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 500

        async def record_status(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            self.metrics.observe(scope["method"], self._template(scope), status, time.perf_counter() - start)

    def _template(self, scope: dict) -> str:
        """The route template of the request (`/tools/{tool_id}`): the one it was routed to, else the first
        whose path matches it; `/mcp` for the MCP endpoint; `unmatched` for a path the app does not have."""
        from starlette.routing import Match

        path = getattr(scope.get("route"), "path", None)
        if path:
            return path
        if scope["path"].startswith("/mcp"):
            return "/mcp"
        routed = next((route for route in self.routes if route.matches(scope)[0] != Match.NONE), None)
        return getattr(routed, "path", None) or "unmatched"


class BearerGate:
    """Lets a request through to `app` (an MCP endpoint) only with a token `auth` accepts for reading; 401
    otherwise, with a JSON-RPC error that MCP clients show."""

    def __init__(self, app: Any, auth: AuthConfig):
        self.app = app
        self.auth = auth

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        try:
            self.auth.authenticate(headers.get("authorization"), write=False)
        except AuthError as exc:
            response = jsonrpc_refusal(exc.status, exc.message, headers=bearer_challenge(exc))
            return await response(scope, receive, send)
        await self.app(scope, receive, send)


class InternalErrors:
    """A bug inside toolscout must read as one: an exception no handler mapped is logged with its
    traceback, and the client gets a 500 JSON error (FastAPI's own handler sends it; this layer logs the
    exception it re-raises, and answers itself when nothing was sent yet)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watch(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:
            logger.exception("internal error answering %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await internal_error_response()(scope, receive, send)


def internal_error_response() -> JSONResponse:
    return error_response(500, "internal error in toolscout; the server log has the details")
