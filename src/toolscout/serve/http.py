"""The HTTP API (FastAPI) over one `ToolService`.

    POST   /search              {"query": "..."} or {"queries": [...]}, k, namespaces, ids, exclude_ids,
                                min_score / abstain, always_include, match_names, format
    GET    /tools               ?namespace=&offset=&limit=
    GET    /tools/{id}
    PUT    /tools/{id}          one tool (toolscout record); creates or replaces
    POST   /tools               {"tools": [records]} or {"catalog": <any catalog object>, "format", "namespace"}
    DELETE /tools/{id}
    POST   /tools/delete        {"ids": [...]}
    GET    /namespaces
    POST   /admin/compact       snapshot now (admin token)
    GET    /health, GET /metrics (Prometheus text), GET /openapi.json, GET /docs
    POST   /mcp                 the MCP endpoint (streamable HTTP, `search_tools`)

Errors are JSON `{"error": {"type", "message", "details"?}}`: 400 malformed JSON, 401 missing or
invalid token, 403 not allowed, 404 unknown tool or route, 405, 413 body over the limit, 415 not JSON,
422 a field is wrong or unknown (every model forbids extra fields), 503 writes disabled.
Writes are acknowledged only once journalled and fsync'd (see `service.py`).
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations at run time and
# they refer to names local to create_app (Reader, Writer).
import asyncio
import contextlib
import json
import logging
import time
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..errors import CatalogError
from ..tool import Tool
from .auth import AuthConfig, AuthError
from .metrics import Metrics
from .service import Principal, ServiceError, ServiceUnavailable, ToolService

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20
Text = Annotated[str, StringConstraints(min_length=1, max_length=4000)]
Ident = Annotated[str, StringConstraints(min_length=1, max_length=512)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SearchRequest(_Strict):
    query: Text | None = Field(None, description="One task in plain language (or a tool's name).")
    queries: list[Text] | None = Field(None, min_length=1, max_length=64, description="Several tasks at once.")
    k: int = Field(5, ge=1, le=100, description="Tools per query (name matches count; always_include does not).")
    namespaces: list[Ident] | None = Field(None, description="Only tools of these namespaces.")
    ids: list[Ident] | None = Field(None, description="Only these tool ids.")
    exclude_ids: list[Ident] = Field(default_factory=list, description="Never these tool ids.")
    abstain: bool = Field(True, description="Return nothing when no tool fits (the server's threshold).")
    min_score: float | None = Field(None, description="Abstention threshold for this request (overrides the server's).")
    always_include: list[Ident] = Field(default_factory=list, description="Tool ids to return in any case.")
    match_names: bool = Field(True, description="A query naming a tool ranks that tool first.")
    format: Literal["toolscout", "openai", "openai_responses", "anthropic"] = Field(
        "toolscout", description="Also return the hits as ready-made tool definitions for this API.")

    @model_validator(mode="after")
    def _one_of(self) -> "SearchRequest":
        if (self.query is None) == (self.queries is None):
            raise ValueError("give exactly one of 'query' or 'queries'")
        return self


class ToolIn(_Strict):
    """A tool record (the fields of `toolscout.Tool`). `id` defaults to `namespace.name` (or `name`)."""

    id: Ident | None = None
    name: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    description: str = Field("", max_length=20000)
    parameters: dict[str, Any] | None = None
    returns: dict[str, Any] | None = None
    namespace: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None
    tags: list[str] = Field(default_factory=list)
    category: str | None = None
    title: str | None = None
    method: str | None = None
    path: str | None = None
    examples: list[str] = Field(default_factory=list)
    limitations: str | None = None
    profile: dict[str, Any] | None = None
    usage: list[str] = Field(default_factory=list)
    raw: Any = None

    def to_tool(self) -> Tool:
        data = self.model_dump(exclude_none=True)
        if not data.get("id"):
            data["id"] = f"{self.namespace}.{self.name}" if self.namespace else self.name
        return Tool.from_dict(data)


class UpsertRequest(_Strict):
    tools: list[ToolIn] | None = Field(None, max_length=10000, description="Tool records.")
    catalog: Any = Field(None, description="Or: a catalog in any format toolscout reads (OpenAI, Anthropic, MCP "
                                           "tools/list, OpenAPI) as a JSON object.")
    format: str | None = Field(None, description="The catalog's format, when detection is not wanted.")
    namespace: str | None = Field(None, description="Namespace for the catalog's tools.")

    @model_validator(mode="after")
    def _one_of(self) -> "UpsertRequest":
        if (self.tools is None) == (self.catalog is None):
            raise ValueError("give exactly one of 'tools' or 'catalog'")
        if self.tools is not None and (self.format or self.namespace):
            raise ValueError("'format' and 'namespace' apply to 'catalog' only")
        return self


class DeleteRequest(_Strict):
    ids: list[Ident] = Field(min_length=1, max_length=10000)


class HitOut(BaseModel):
    rank: int
    id: str
    name: str
    namespace: str | None
    score: float
    match: str
    description: str
    input_schema: dict[str, Any]
    method: str | None = None
    path: str | None = None


class QueryResult(BaseModel):
    query: str
    abstained: bool
    hits: list[HitOut]
    tools: list[dict[str, Any]] | None = Field(None, description="The hits as tool definitions (when 'format' asks).")


class SearchResponse(BaseModel):
    results: list[QueryResult]
    version: int


class WriteResponse(BaseModel):
    version: int
    created: list[str]
    updated: list[str]
    unchanged: list[str]
    deleted: list[str]


class ErrorBody(BaseModel):
    type: str
    message: str
    details: list[dict[str, Any]] | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 413, 415, 422)}


# ------------------------------------------------------------------------------------- helpers

def _error(status: int, kind: str, message: str, details: list | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"type": kind, "message": message}
    if details:
        body["details"] = details
    return JSONResponse({"error": body}, status_code=status, headers=headers)


_KINDS = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
          413: "payload_too_large", 415: "unsupported_media_type", 422: "invalid_request", 503: "unavailable"}


def _hit_dict(hit: Any) -> dict[str, Any]:
    tool = hit.tool
    out = {"rank": hit.rank, "id": tool.id, "name": tool.name, "namespace": tool.namespace,
           "score": round(float(hit.score), 6), "match": hit.match, "description": tool.description,
           "input_schema": tool.input_schema()}
    if tool.method:
        out["method"], out["path"] = tool.method, tool.path
    return out


def tool_dict(tool: Tool) -> dict[str, Any]:
    data = tool.to_dict()
    data.pop("raw", None)
    return data


class _TooLarge(StarletteHTTPException):
    def __init__(self, limit: int):
        super().__init__(413, f"request body is larger than the limit of {limit} bytes")


class BodyLimit:
    """Refuses bodies over `max_bytes` with 413 (by Content-Length up front, else while reading) and
    bodies that are not JSON with 415 (on the API's own routes; /mcp checks its own)."""

    def __init__(self, app: Any, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await _error(413, _KINDS[413], f"request body is larger than the limit of {self.max_bytes} bytes")(
                scope, receive, send)
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        if not scope["path"].startswith("/mcp") and (length is None or length != "0") and media \
                and media != "application/json" and not media.endswith("+json"):
            return await _error(415, _KINDS[415], f"expected Content-Type application/json, got {media!r}")(
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


class Observe:
    """Records each request's route template, status and duration in `metrics`."""

    def __init__(self, app: Any, metrics: Metrics):
        self.app = app
        self.metrics = metrics

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
            route = scope.get("route")
            template = getattr(route, "path", None) or ("/mcp" if scope["path"].startswith("/mcp") else "unmatched")
            self.metrics.observe(scope["method"], template, status, time.perf_counter() - start)


class BearerGate:
    """Lets a request through to `app` only with a token `auth` accepts for reading (401 otherwise)."""

    def __init__(self, app: Any, auth: AuthConfig):
        self.app = app
        self.auth = auth

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        try:
            self.auth.authenticate(headers.get("authorization"), write=False)
        except AuthError as exc:
            response = _error(exc.status, _KINDS[exc.status], exc.message, headers={"WWW-Authenticate": "Bearer"})
            return await response(scope, receive, send)
        await self.app(scope, receive, send)


# ---------------------------------------------------------------------------------------- app

def create_app(service: ToolService, auth: AuthConfig | None = None, *, max_body_bytes: int = MAX_BODY_BYTES,
               mcp: bool = True, host: str = "127.0.0.1", close_service: bool = True) -> Any:
    """The ASGI app. `mcp`: also serve MCP (streamable HTTP) at /mcp. `close_service`: compact and
    release the pipeline directory at shutdown."""
    auth = auth or AuthConfig()
    metrics = Metrics()
    mcp_app = None
    if mcp:
        from .mcp import build_mcp_server, mcp_http_app

        mcp_app = mcp_http_app(build_mcp_server(service, auth=auth, metrics=metrics), host=host,
                               max_body_bytes=max_body_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        async with contextlib.AsyncExitStack() as stack:
            if mcp_app is not None:
                await stack.enter_async_context(mcp_app.router.lifespan_context(mcp_app))
            try:
                yield
            finally:
                if close_service:
                    import anyio.to_thread

                    await anyio.to_thread.run_sync(service.close)

    app = FastAPI(title="toolscout", version=__version__, lifespan=lifespan,
                  description="Tool retrieval for LLM agents: search a tool catalog with a task in plain language, "
                              "and keep the catalog up to date. Writes are durable when acknowledged.")
    app.state.service, app.state.metrics, app.state.auth = service, metrics, auth

    # errors ---------------------------------------------------------------------------------
    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            e = next(e for e in errors if e.get("type") == "json_invalid")
            reason = (e.get("ctx") or {}).get("error", "decode error")
            where = e.get("loc", ("body", "?"))[-1]
            return _error(400, "invalid_json", f"request body is not valid JSON ({reason} at character {where})")
        details = [{"field": ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body",
                    "message": "unknown field (not allowed)" if e.get("type") == "extra_forbidden" else e.get("msg"),
                    "type": e.get("type")} for e in errors]
        first = details[0]
        return _error(422, "invalid_request", f"{first['field']}: {first['message']}", details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = "no such route; see /docs for the API"
        return _error(exc.status_code, _KINDS.get(exc.status_code, "error"), message, headers=exc.headers)

    @app.exception_handler(AuthError)
    async def _auth(_request: Request, exc: AuthError) -> JSONResponse:
        headers = {"WWW-Authenticate": 'Bearer error="invalid_token"' if "invalid" in exc.message else "Bearer"} \
            if exc.status == 401 else None
        return _error(exc.status, _KINDS[exc.status], exc.message, headers=headers)

    @app.exception_handler(KeyError)
    async def _missing(_request: Request, exc: KeyError) -> JSONResponse:
        return _error(404, "not_found", str(exc.args[0]) if exc.args else "not found")

    @app.exception_handler(PermissionError)
    async def _forbidden(_request: Request, exc: PermissionError) -> JSONResponse:
        return _error(403, "forbidden", str(exc))

    @app.exception_handler(ServiceUnavailable)
    async def _unavailable(_request: Request, exc: ServiceUnavailable) -> JSONResponse:
        return _error(503, "unavailable", str(exc))

    @app.exception_handler(ServiceError)
    async def _service(_request: Request, exc: ServiceError) -> JSONResponse:
        return _error(503, "unavailable", str(exc))

    @app.exception_handler(ValueError)
    async def _invalid(_request: Request, exc: ValueError) -> JSONResponse:
        return _error(422, "invalid_request", str(exc))

    # auth -----------------------------------------------------------------------------------
    def reader(request: Request) -> Principal:
        return auth.authenticate(request.headers.get("authorization"), write=False)

    def writer(request: Request) -> Principal:
        return auth.authenticate(request.headers.get("authorization"), write=True)

    async def reader_in_loop(request: Request) -> Principal:  # a digest and a dict lookup: no thread needed
        return reader(request)

    Reader = Annotated[Principal, Depends(reader)]
    Writer = Annotated[Principal, Depends(writer)]

    # search ---------------------------------------------------------------------------------
    @app.post("/search", response_model=SearchResponse, responses=ERRORS, tags=["search"])
    async def search(body: SearchRequest, principal: Annotated[Principal, Depends(reader_in_loop)]) -> Response:
        """The best tools for one task or several, within the namespaces the caller may see."""
        # One query goes to the service's batcher and is awaited here, in the event loop (no thread
        # per request: two thread hops cost more CPU than the response itself). Several queries, and a
        # service that does not batch, are answered in a worker thread.
        min_score = body.min_score if body.min_score is not None else (service.min_score if body.abstain else None)
        options = dict(principal=principal, namespaces=body.namespaces, ids=body.ids, exclude_ids=body.exclude_ids,
                       min_score=min_score, always_include=body.always_include, match_names=body.match_names)
        submit = getattr(service, "search_future", None)
        future = submit(body.query, body.k, **options) if body.query is not None and submit is not None else None
        if future is None:
            return await run_in_threadpool(search_in_thread, body, principal, options)
        return search_response(body, principal, [body.query], [await asyncio.wrap_future(future)])

    def search_in_thread(body: SearchRequest, principal: Principal, options: dict) -> Response:
        queries = [body.query] if body.query is not None else list(body.queries or [])
        # one query goes in as a string: the service batches it with other clients' concurrent queries
        hits = service.search(body.query if body.query is not None else queries, body.k, **options)
        return search_response(body, principal, queries, [hits] if body.query is not None else hits)

    def search_response(body: SearchRequest, principal: Principal, queries: list[str], hits: list) -> Response:
        results = []
        for query, query_hits in zip(queries, hits):
            abstained = not any(h.match != "always" for h in query_hits)
            entry: dict[str, Any] = {"query": query, "abstained": abstained, "hits": [_hit_dict(h) for h in query_hits]}
            if body.format != "toolscout":
                entry["tools"] = _definitions(service, query_hits, body.format, principal)
            results.append(entry)
            metrics.count("queries")
            metrics.count("abstained", abstained)
            metrics.count("name_match", any(h.match == "name" for h in query_hits))
        return JSONResponse({"results": results, "version": service.version(principal)})

    # catalog reads --------------------------------------------------------------------------
    @app.get("/tools", responses=ERRORS, tags=["catalog"])
    def list_tools(principal: Reader, namespace: str | None = None, offset: Annotated[int, Query(ge=0)] = 0,
                   limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Response:
        """One page of the tools the caller may see, in catalog order."""
        total, tools = service.list(principal, namespace=namespace, offset=offset, limit=limit)
        return JSONResponse({"total": total, "offset": offset, "tools": [tool_dict(t) for t in tools]})

    @app.get("/tools/{tool_id:path}", responses=ERRORS, tags=["catalog"])
    def get_tool(tool_id: str, principal: Reader) -> Response:
        """One tool by id (404 for a tool outside the caller's namespaces, too)."""
        return JSONResponse(tool_dict(service.get(tool_id, principal)))

    @app.get("/namespaces", responses=ERRORS, tags=["catalog"])
    def namespaces(principal: Reader) -> Response:
        """Namespaces the caller may see, with their tool counts ("" = tools with no namespace)."""
        return JSONResponse({"namespaces": service.namespaces(principal)})

    # catalog writes -------------------------------------------------------------------------
    @app.put("/tools/{tool_id:path}", response_model=WriteResponse, responses=ERRORS, tags=["catalog"])
    def put_tool(tool_id: str, body: ToolIn, principal: Writer) -> Response:
        """Create or replace one tool (only its changed text is re-embedded). Durable when answered."""
        if body.id is not None and body.id != tool_id:
            raise ValueError(f"the body's id {body.id!r} differs from the path's {tool_id!r}")
        tool = body.model_copy(update={"id": tool_id}).to_tool()
        return JSONResponse(service.upsert([tool], principal).to_dict())

    @app.post("/tools", response_model=WriteResponse, responses=ERRORS, tags=["catalog"])
    def upsert_tools(body: UpsertRequest, principal: Writer) -> Response:
        """Create or replace many tools: toolscout records, or a whole catalog in any format."""
        if body.tools is not None:
            tools = [t.to_tool() for t in body.tools]
        else:
            from ..ingest import parse_tools

            try:
                tools = parse_tools(body.catalog, format=body.format, namespace=body.namespace, source="catalog")
            except CatalogError as exc:
                raise ValueError(str(exc)) from None
        return JSONResponse(service.upsert(tools, principal).to_dict())

    @app.delete("/tools/{tool_id:path}", response_model=WriteResponse, responses=ERRORS, tags=["catalog"])
    def delete_tool(tool_id: str, principal: Writer) -> Response:
        """Remove one tool. Durable when answered."""
        return JSONResponse(service.delete([tool_id], principal).to_dict())

    @app.post("/tools/delete", response_model=WriteResponse, responses=ERRORS, tags=["catalog"])
    def delete_tools(body: DeleteRequest, principal: Writer) -> Response:
        """Remove several tools at once (all or none: an unknown id fails the request)."""
        return JSONResponse(service.delete(body.ids, principal).to_dict())

    @app.post("/admin/compact", responses=ERRORS, tags=["admin"])
    def compact(principal: Writer) -> Response:
        """Write a full snapshot now and empty the journal (needs a token allowed every namespace)."""
        if principal.namespaces is not None:
            raise PermissionError("compaction needs a token that may write every namespace")
        did = service.compact()
        return JSONResponse({"compacted": did, **service.stats()})

    # operations -----------------------------------------------------------------------------
    @app.get("/health", tags=["operations"])
    def health() -> Response:
        """Liveness and catalog state (no token needed). 503 when writes are disabled after a failure."""
        stats = service.stats()
        ok = service.failed is None
        return JSONResponse({"status": "ok" if ok else "degraded", **stats}, status_code=200 if ok else 503)

    @app.get("/metrics", response_class=PlainTextResponse, tags=["operations"])
    def prometheus() -> Response:
        """Request counts and latency histograms, Prometheus text format."""
        stats = service.stats()
        gauges = {k: stats[k] for k in ("tools", "version", "journal_records", "journal_bytes", "compactions")}
        return PlainTextResponse(metrics.render(gauges), media_type="text/plain; version=0.0.4; charset=utf-8")

    if mcp_app is not None:
        from starlette.routing import Route

        app.router.routes.append(Route("/mcp", endpoint=BearerGate(mcp_app.router.routes[0].endpoint, auth),
                                       methods=["GET", "POST", "DELETE"], include_in_schema=False))

    return Observe(BodyLimit(app, max_body_bytes), metrics)


def _definitions(service: ToolService, hits: list, fmt: str, principal: Principal) -> list[dict[str, Any]]:
    from ..adapters import AgentNames, to_anthropic, to_openai

    names = AgentNames(lambda name: service.name_is_shared(name, principal))
    if fmt == "anthropic":
        return to_anthropic(hits, names=names)
    return to_openai(hits, style="responses" if fmt == "openai_responses" else "chat", names=names)
