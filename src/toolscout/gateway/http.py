"""The gateway's HTTP API: `toolscout serve`'s API (`serve/http.py`) over the gateway's catalog, plus

    POST /tools/{id}/call   {"arguments": {...}}: forward one call; the upstream's result as MCP gives it,
                            `{"content": [...], "structuredContent"?, "isError"}` (200, whatever the tool
                            answered); 404 unknown tool, 409 held until approved, 502 the upstream cannot be
                            reached (504 when it did not answer in time), naming it; 503 while the gateway
                            shuts down (a call in flight is cancelled after a grace of 1.5 s)
    POST /mcp               the gateway's MCP server (`mcp_server.py`), streamable HTTP with sessions; its
                            answers are event streams (a call's progress rides them); a body over
                            --mcp-max-body is refused with a JSON-RPC error

`/search` waits for upstreams still starting with no tools indexed, as `search_tools` does, and names those it
could not search (`not_searchable`); `/health` lists each upstream the caller may read with its state, tool count and last error; `/tools/{id}` adds the tool's
upstream, whether it answers now, and its definition record (fingerprint, changes, held). A platform that
uses OpenAI or Anthropic function calling searches with `/search` and executes through this route.
"""

import contextlib
from pathlib import Path
from typing import Annotated, Any, AsyncIterator

import anyio
import anyio.to_thread

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from ..serve.auth import ANONYMOUS, AuthConfig, AuthError
from ..serve.http import Api, create_app
from ..serve.metrics import Metrics
from ..serve.middleware import JSON, error_response
from ..serve.schemas import ERRORS, ErrorResponse
from ..serve.service import Principal
from .core import Gateway, http_session
from .hosts import serve_hosts
from .mcp_server import GatewayMcp
from .upstream import UpstreamUnavailable

CALL_ERRORS = {**ERRORS, 409: {"model": ErrorResponse}, 502: {"model": ErrorResponse},
               503: {"model": ErrorResponse}, 504: {"model": ErrorResponse}}


class CallRequest(BaseModel, extra="forbid"):
    arguments: dict[str, Any] = Field(default_factory=dict, description="The tool's arguments (its input schema).")


class CallResponse(BaseModel):
    content: list[dict[str, Any]]
    structuredContent: dict[str, Any] | None = None
    isError: bool = False


def gateway_app(gateway: Gateway, auth: AuthConfig, *, expose: str = "none", index: Path | None = None,
                **options: Any) -> Any:
    """The gateway's HTTP app: `toolscout serve`'s API over the gateway's catalog, with the gateway's routes and its
    MCP server at /mcp, which reads the same tokens and counts into the same metrics. `index`: whose socket stdio
    gateways attach to; `options` go to `create_app` (host, max_body_bytes, mcp_max_body_bytes)."""
    metrics = Metrics()
    mcp = GatewayMcp(gateway, auth=auth, metrics=metrics, expose=expose)
    return create_app(gateway.service, auth, metrics=metrics, extension=GatewayApi(gateway, mcp, index), **options)


class GatewayApi:
    """The gateway's additions to the HTTP API (`serve.http.ApiExtension`); `mcp` serves /mcp."""

    def __init__(self, gateway: Gateway, mcp: GatewayMcp, index: Path | None = None):
        self.gateway, self.mcp, self.index = gateway, mcp, index  # index: whose socket stdio gateways attach to

    def add_routes(self, app: FastAPI, api: Api) -> None:
        gateway = self.gateway

        def caller(request: Request) -> Principal:
            principal = api.reader(request)
            if principal is ANONYMOUS:  # reads may be open, but a call acts on someone's behalf: 401, as a
                # write without a token is (the credentials are missing, not insufficient)
                raise AuthError(401, "calling tools through this gateway needs a bearer token "
                                     "(Authorization: Bearer TOKEN)")
            return principal

        @app.post("/tools/{tool_id:path}/call", response_model=CallResponse, responses=CALL_ERRORS, tags=["gateway"])
        async def call_tool(tool_id: str, body: CallRequest, request: Request,
                            principal: Annotated[Principal, Depends(caller)]) -> Response:
            """Forward one call of the tool to the upstream that runs it, and return its result as it came."""
            result = await gateway.call(tool_id, body.arguments, principal=principal,
                                        session=http_session(principal), headers=dict(request.headers))
            return JSON(result)

        app.add_exception_handler(UpstreamUnavailable, _unavailable)

    async def before_search(self, principal: Principal, namespaces: list[str] | None) -> dict[str, Any]:
        return {"not_searchable": await self.gateway.searchable(principal, namespaces)}

    def searched(self, principal: Principal, query: str, hits: list) -> None:
        self.gateway.searched(http_session(principal), query, hits)

    def tool_details(self, tool_id: str) -> dict[str, Any]:
        return self.gateway.tool_details(tool_id)

    def health(self, principal: Principal) -> dict[str, Any]:
        return self.gateway.health(principal)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The upstreams are supervised while the app serves (and stdio gateways on the same index attach to
        this one: hosts.py); at its end, calls still in flight are shut down (runtime.serve_http does it as
        soon as the signal comes) before the upstreams are stopped."""
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self.gateway.run)
            if self.index is not None:
                await tasks.start(serve_hosts, self.mcp, self.index)
            try:
                yield
            finally:
                await self.gateway.shutdown()
                tasks.cancel_scope.cancel()
        await anyio.to_thread.run_sync(self.gateway.close)

    def mcp_app(self, api: Api, host: str, max_body_bytes: int) -> Any:
        # sessions: a 2025-protocol client keeps one (Mcp-Session-Id), which is what calls are attributed to;
        # answers as event streams, which carry a call's progress and an upstream's elicitation to the agent
        return self.mcp.server.streamable_http_app(streamable_http_path="/mcp", stateless_http=False,
                                                   json_response=False, host=host,
                                                   max_request_body_size=max_body_bytes)


async def _unavailable(_request: Request, exc: UpstreamUnavailable) -> Response:
    return error_response(504 if exc.timed_out else 502, str(exc), kind="upstream_unavailable")
