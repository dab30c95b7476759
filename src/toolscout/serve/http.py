"""The HTTP API (FastAPI) over one `ToolService`.

    POST   /search              {"query": "..."} or {"queries": [...]}, k, namespaces, ids, exclude_ids,
                                min_score / min_probability / abstain, always_include, match_names, explain,
                                format (each hit: score, and its calibrated probability)
    GET    /tools               ?namespace=&offset=&limit=
    GET    /tools/{id}
    PUT    /tools/{id}          one tool (toolscout record); creates or replaces
    POST   /tools               {"tools": [records]} or {"catalog": <any catalog object>, "format", "namespace"}
                                (a catalog's answer lists its `warnings`: tools skipped, no tools, ...)
    DELETE /tools/{id}
    POST   /tools/delete        {"ids": [...]}
    GET    /namespaces
    POST   /feedback            {"query", "tool_ids", "source"?, "outcome"?} or {"events": [...]}: tool use, learned at once
    DELETE /feedback?source=S   take back everything source S taught
    POST   /admin/learn         {"train": "mlc"|"refiner"|"embed"}: retrain from the feedback in the background
    GET    /admin/learn         how the last retraining went
    POST   /admin/compact       snapshot now (admin token)
    GET    /health, GET /metrics (Prometheus text), GET /openapi.json, GET /docs
    GET    /ui                  the playground page (static; its own calls go to the API above, with the token)
    POST   /mcp                 the MCP endpoint (streamable HTTP, `search_tools`)

Errors are JSON `{"error": {"type", "message", "details"?}}`: 400 malformed JSON, 401 missing or
invalid token, 403 not allowed, 404 unknown tool or route, 405, 413 body over the limit (on /mcp: a
JSON-RPC error, as MCP clients read it) or more of one source's feedback events than its burst, 415 not JSON,
422 a field is wrong or unknown (every model forbids extra fields), 429 feedback over its source's limits
(with Retry-After when waiting helps), 503 writes disabled or storage unavailable, 500 a bug inside toolscout (logged with its traceback). Only toolscout's own error types
are mapped to 4xx (`toolscout.errors`): a stray KeyError or ValueError is a bug, and reads as one.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations at run time and
# they refer to names local to the route builders (Reader, Writer).
import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import CatalogError, Conflict, Forbidden, InvalidRequest, NotFound, RateLimited, TooLarge, Unavailable
from ..feedback import nothing_from
from ..hits import abstained as found_nothing
from ..hits import checked_queries
from ..query import Query as Task  # a task as search reads it (FastAPI's Query is a parameter)
from ..version import __version__
from . import ui
from .auth import AuthConfig, AuthError
from .errors import ServiceError
from .metrics import Metrics
from .middleware import (JSON, BearerGate, BodyLimit, InternalErrors, Observe, bearer_challenge, error_response,
                         internal_error_response)
from .schemas import (
    ERRORS,
    MAX_ID_CHARS,
    NOT_BLANK,
    FEEDBACK_ERRORS,
    RETRAIN_ERRORS,
    DeleteRequest,
    FeedbackBatchIn,
    FeedbackIn,
    FeedbackResponse,
    ForgetResponse,
    LearningSettingsIn,
    RollbackIn,
    RetrainRequest,
    SearchRequest,
    SearchResponse,
    ToolFields,
    UpsertRequest,
    WriteResponse,
    said,
)
from .service import Principal, ToolService, unknown_namespaces

MAX_BODY_BYTES = 1 << 20
MCP_MAX_BODY_BYTES = 64 << 20  # /mcp: tool calls carry files and images (and the gateway's stdio takes as much)
GAUGES = ("tools", "version", "journal_records", "journal_bytes", "compactions", "feedback_events",
          "feedback_failures", "feedback_learned", "feedback_sources")


class ApiExtension(Protocol):
    """What a deployment adds to the HTTP API: the gateway adds tool calls, upstream health and its own MCP
    server (`toolscout.gateway.http`)."""

    def add_routes(self, app: FastAPI, api: "Api") -> None:
        """Add its routes (and their error handlers) to `app`."""
        ...

    async def before_search(self, principal: Principal, namespaces: list[str] | None) -> dict[str, Any]:
        """Awaited before each `/search`; fields its answer adds (the gateway waits for upstreams still
        starting, and names those it could not search)."""
        ...

    def searched(self, principal: Principal, query: str, hits: list) -> None:
        """One search's hits, as `/search` answered them."""
        ...

    def tool_details(self, tool_id: str) -> dict[str, Any]:
        """Fields `/tools/{id}` adds for a tool."""
        ...

    def health(self, principal: Principal) -> dict[str, Any]:
        """Fields `/health` adds for a caller, as far as `principal` may read them (`ToolService.stats`)."""
        ...

    def mcp_app(self, api: "Api", host: str, max_body_bytes: int) -> Any:
        """The streamable-HTTP Starlette app that serves /mcp (bodies up to `max_body_bytes`)."""
        ...

    def running(self) -> contextlib.AbstractAsyncContextManager:
        """What runs while the app serves (entered at start-up, left at shutdown)."""
        ...


@dataclass
class Api:
    """What every route needs: the service, the metrics and the token rules."""

    service: ToolService
    metrics: Metrics
    auth: AuthConfig
    extension: ApiExtension | None = None

    def reader(self, request: Request) -> Principal:
        return self.auth.authenticate(request.headers.get("authorization"), write=False)

    def writer(self, request: Request) -> Principal:
        return self.auth.authenticate(request.headers.get("authorization"), write=True)

    # Who sees what of /health and /metrics (docs/serving.md, "What /health and /metrics show"): /health
    # answers everyone, for liveness probes, and shows the catalog as far as the caller may read it
    # (`ToolService.stats`); /metrics is all or nothing, since a scrape that lost series with its token would
    # read as series ending, and its gauges total over every namespace.

    def viewer(self, request: Request) -> Principal | None:
        """Whom /health shows the catalog to: the caller as a read would take it, or None (liveness only) where
        a read would be refused. Never an error: a probe's answer must not hang on a token."""
        try:
            return self.reader(request)
        except AuthError:
            return None

    def scraper(self, request: Request) -> Principal:
        """The caller of /metrics: one that may read every namespace (AuthError 401 / 403 otherwise)."""
        principal = self.reader(request)
        if not self.service.sees_everything(principal):
            raise AuthError(403, f"token {principal.name!r} may not read every namespace of the catalog, and "
                                 "/metrics tells of them all")
        return principal


def create_app(service: ToolService, auth: AuthConfig | None = None, *, max_body_bytes: int = MAX_BODY_BYTES,
               mcp: bool = True, host: str = "127.0.0.1", close_service: bool = True,
               extension: ApiExtension | None = None, mcp_max_body_bytes: int = MCP_MAX_BODY_BYTES,
               metrics: Metrics | None = None) -> Any:
    """The ASGI app. `mcp`: also serve MCP (streamable HTTP) at /mcp, taking bodies up to
    `mcp_max_body_bytes` (the API's own routes: `max_body_bytes`). `close_service`: compact and release the
    catalog at shutdown. `extension`: what a deployment adds (the gateway). `metrics`: what /metrics counts
    (new ones unless given: an extension's MCP server counts into the same)."""
    api = Api(service, metrics or Metrics(), auth or AuthConfig(), extension)
    mcp_app = (extension.mcp_app(api, host, mcp_max_body_bytes) if extension is not None
               else _mcp_app(api, host, mcp_max_body_bytes)) if mcp else None
    lifespan = _lifespan(service, mcp_app, close_service, extension)
    app = FastAPI(title="toolscout", version=__version__, lifespan=lifespan, docs_url=None,
                  description="Tool retrieval for LLM agents: search a tool catalog with a task in plain language, "
                              "and keep the catalog up to date. Writes are durable when acknowledged.")
    app.state.service, app.state.metrics, app.state.auth = service, api.metrics, api.auth
    _add_error_handlers(app)
    _add_search_routes(app, api)
    _add_catalog_routes(app, api)
    _add_feedback_routes(app, api)
    _add_operation_routes(app, api)
    _add_ui_routes(app)
    if extension is not None:
        extension.add_routes(app, api)
    if mcp_app is not None:
        from starlette.routing import Route

        app.router.routes.append(Route("/mcp", endpoint=BearerGate(mcp_app.router.routes[0].endpoint, api.auth),
                                       methods=["GET", "POST", "DELETE"], include_in_schema=False))
    return Observe(InternalErrors(BodyLimit(app, max_body_bytes, mcp_max_body_bytes)), api.metrics, app.router.routes)


def _mcp_app(api: Api, host: str, max_body_bytes: int):
    from .mcp import build_mcp_server, mcp_http_app

    return mcp_http_app(build_mcp_server(api.service, auth=api.auth, metrics=api.metrics), host=host,
                        max_body_bytes=max_body_bytes)


def _lifespan(service: ToolService, mcp_app: Any, close_service: bool, extension: ApiExtension | None):
    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        import anyio.to_thread

        async with contextlib.AsyncExitStack() as stack:
            if close_service:  # pushed first, so it runs last: what the extension writes as it stops is kept
                stack.push_async_callback(anyio.to_thread.run_sync, service.close)
            if mcp_app is not None:
                await stack.enter_async_context(mcp_app.router.lifespan_context(mcp_app))
            if extension is not None:
                await stack.enter_async_context(extension.running())
            yield

    return lifespan


# ------------------------------------------------------------------------------------- errors

# toolscout's own error types and their statuses; anything else is a 500 (see InternalErrors)
STATUS_OF = ((NotFound, 404), (Forbidden, 403), (Conflict, 409), (TooLarge, 413), (InvalidRequest, 422),
             (CatalogError, 422), (ServiceError, 503), (Unavailable, 503))


def _add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(AuthError, _auth_error)
    app.add_exception_handler(RateLimited, _rate_limited)
    for kind, status in STATUS_OF:
        app.add_exception_handler(kind, _mapped(status))
    app.add_exception_handler(Exception, lambda _request, _exc: internal_error_response())


def _mapped(status: int):
    async def handler(_request: Request, exc: Exception) -> JSONResponse:
        return error_response(status, str(exc))

    return handler


async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    invalid_json = next((e for e in errors if e.get("type") == "json_invalid"), None)
    if invalid_json is not None:
        reason = (invalid_json.get("ctx") or {}).get("error", "decode error")
        where = invalid_json.get("loc", ("body", "?"))[-1]
        return error_response(400, f"request body is not valid JSON ({reason} at character {where})",
                              kind="invalid_json")
    details = [{"field": ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body",
                "message": said(e), "type": e.get("type")} for e in _as_meant(errors)]
    first = details[0]
    return error_response(422, f"{first['field']}: {first['message']}", details)


def _as_meant(errors: list[dict]) -> list[dict]:
    """A body that may take one of several shapes (one feedback event, or {"events": [...]}) fails each: only
    the errors of the shape it meant, the one whose top-level fields it got right, without the shape's name in
    their fields (the other shape's errors, "query: Field required" for a batch, would only mislead)."""
    def shape(error: dict) -> str | None:
        loc = error.get("loc", ())
        return loc[1] if len(loc) > 2 and loc[0] == "body" and str(loc[1])[:1].isupper() else None

    if not any(shape(e) for e in errors):
        return errors
    misses: dict[str | None, int] = {}
    for error in errors:  # per shape, the errors of a top-level field missing or not its own
        misses[shape(error)] = misses.get(shape(error), 0) + (len(error.get("loc", ())) == 3)
    meant = min(misses, key=lambda name: misses[name])  # the first shape with the fewest (dicts keep order)
    return [{**e, "loc": ("body", *e["loc"][2:])} if shape(e) else e for e in errors if shape(e) in (meant, None)]


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    if exc.status_code == 404 and message == "Not Found":
        message = "no such route; see /docs for the API"
    if exc.status_code == 400 and message == "There was an error parsing the body":  # FastAPI's: it keeps the cause
        if isinstance(exc.__cause__, RecursionError):
            return error_response(400, "request body nests arrays or objects too deeply to read", kind="invalid_json")
        return error_response(400, "request body is not JSON text in UTF-8", kind="invalid_json")
    headers = exc.headers
    if exc.status_code == 405:  # Starlette names the first matching route's methods only; a path has several
        headers = {**(headers or {}), "Allow": ", ".join(_allowed_methods(request))}
    return error_response(exc.status_code, message, headers=headers)


def _allowed_methods(request: Request) -> list[str]:
    """The methods of the routes at the request's path: of its literal routes when it has any (the
    OpenAPI document's resource: /tools/delete), else of the templated ones (/tools/{tool_id})."""
    from starlette.routing import Match

    matching = [route for route in request.app.router.routes
                if getattr(route, "methods", None) and route.matches(request.scope)[0] != Match.NONE]
    literal = [route for route in matching if not route.param_convertors]
    return sorted({method for route in literal or matching for method in route.methods})


async def _rate_limited(_request: Request, exc: RateLimited) -> JSONResponse:
    headers = {"Retry-After": str(max(1, int(exc.retry_after + 0.999)))} if exc.retry_after is not None else None
    return error_response(429, str(exc), headers=headers, kind="rate_limited")


async def _auth_error(_request: Request, exc: AuthError) -> JSONResponse:
    return error_response(exc.status, exc.message, headers=bearer_challenge(exc))


# ------------------------------------------------------------------------------------- search

def _add_search_routes(app: FastAPI, api: Api) -> None:
    service, metrics = api.service, api.metrics

    async def reader_in_loop(request: Request) -> Principal:  # a digest and a dict lookup: no thread needed
        return api.reader(request)

    @app.post("/search", response_model=SearchResponse, responses=ERRORS, tags=["search"])
    async def search(body: SearchRequest, principal: Annotated[Principal, Depends(reader_in_loop)]) -> Response:
        """The best tools for one task or several, within the namespaces the caller may see."""
        # One query goes to the service's batcher and is awaited here, in the event loop (no thread
        # per request: two thread hops cost more CPU than the response itself). Several queries, and a
        # service that does not batch, are answered in a worker thread.
        min_score = body.min_score if body.min_score is not None else (service.min_score if body.abstain else None)
        min_probability = body.min_probability if body.min_probability is not None else \
            (service.min_probability if body.abstain else None)
        options = dict(principal=principal, namespaces=body.namespaces, ids=body.ids, exclude_ids=body.exclude_ids,
                       min_score=min_score, min_probability=min_probability, always_include=body.always_include,
                       match_names=body.match_names, explain=body.explain)
        # the tasks checked and focused once, here: the service takes them as they are, and the answer
        # says from them whether focusing cut anything
        tasks = checked_queries(body.query if body.query is not None else body.queries)
        added = await api.extension.before_search(principal, body.namespaces) if api.extension is not None else {}
        future = service.search_future(tasks[0], body.k, **options) if body.query is not None else None
        if future is None:
            return await run_in_threadpool(search_in_thread, body, principal, tasks, options, added)
        return search_response(body, principal, tasks, [await asyncio.wrap_future(future)], added)

    def search_in_thread(body: SearchRequest, principal: Principal, tasks: list[Task], options: dict,
                         added: dict) -> Response:
        return search_response(body, principal, tasks, service.search(tasks, body.k, **options), added)

    def search_response(body: SearchRequest, principal: Principal, tasks: list[Task], hits: list,
                        added: dict) -> Response:
        results = []
        sent = [body.query] if body.query is not None else list(body.queries)
        for query, task, query_hits in zip(sent, tasks, hits):
            abstained = found_nothing(query_hits)
            entry: dict[str, Any] = {"query": query, "abstained": abstained, "truncated": task.truncated,
                                     "hits": [h.to_dict() for h in query_hits], **query_hits.degraded_dict()}
            if body.format != "toolscout":
                entry.update(_definitions(service, query_hits, body.format, principal))
            results.append(entry)
            if api.extension is not None:
                api.extension.searched(principal, query, query_hits)
            metrics.count("queries")
            metrics.count("abstained", abstained)
            metrics.count("name_match", any(h.match == "name" for h in query_hits))
        # what the request names that no answer can hold (a typo, most likely), each only when there is some
        told = {"unknown_namespaces": unknown_namespaces(service, body.namespaces, principal, added),
                "unknown_ids": service.unknown_ids(body.named_ids(), principal), "excluded_ids": body.excluded_ids()}
        return JSON({"results": results, "version": service.version(principal), **added,
                     **{field: names for field, names in told.items() if names}})


def _definitions(service: ToolService, hits: list, fmt: str, principal: Principal) -> dict[str, Any]:
    """`tools`: the hits' definitions in `fmt`, ready for the model; `tool_ids`: {the name each is offered
    under: its tool id}, to call the tool the model picks (`/tools/{id}/call`, a gateway's route); and
    `argument_names` ({name: {key offered: the tool's own key}}, only for definitions that renamed keys)."""
    from ..adapters import AgentNames, to_anthropic, to_openai

    names = AgentNames(lambda name: service.name_is_shared(name, principal))
    if fmt == "anthropic":
        tools = to_anthropic(hits, names=names)
    else:
        tools = to_openai(hits, style="responses" if fmt == "openai_responses" else "chat", names=names)
    offered = [names.name(hit.tool) for hit in hits]  # the names the definitions carry, in their order
    out: dict[str, Any] = {"tools": tools, "tool_ids": {name: names.tool(name).id for name in offered}}
    renamed = {name: keys for name in offered if (keys := names.argument_names(name))}
    if renamed:
        out["argument_names"] = renamed
    return out


# ------------------------------------------------------------------------------------- catalog

def tool_dict(tool) -> dict[str, Any]:
    data = tool.to_dict()
    data.pop("raw", None)
    return data


ToolId = Annotated[str, Path(max_length=MAX_ID_CHARS)]  # what a write may name, feedback may name too
# a new tool's id says something (the service checks it; a stored blank one can still be read and deleted)
NewToolId = Annotated[str, Path(max_length=MAX_ID_CHARS, json_schema_extra={"pattern": NOT_BLANK})]


def _add_catalog_routes(app: FastAPI, api: Api) -> None:
    service = api.service
    Reader = Annotated[Principal, Depends(api.reader)]
    Writer = Annotated[Principal, Depends(api.writer)]

    @app.get("/tools", responses=ERRORS, tags=["catalog"])
    def list_tools(principal: Reader, namespace: str | None = None, offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
                   limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Response:
        """One page of the tools the caller may see, ordered by id."""
        total, tools = service.list(principal, namespace=namespace, offset=offset, limit=limit)
        return JSON({"total": total, "offset": offset, "tools": [tool_dict(t) for t in tools]})

    @app.get("/tools/{tool_id:path}", responses=ERRORS, tags=["catalog"])
    def get_tool(tool_id: str, principal: Reader) -> Response:
        """One tool by id (404 for a tool outside the caller's namespaces, too), with how much tool-use
        feedback taught it (`feedback`: requests learned, sources, events that named it)."""
        tool = service.get(tool_id, principal)
        details = api.extension.tool_details(tool_id) if api.extension is not None else {}
        return JSON({**tool_dict(tool), "feedback": service.feedback_of(tool_id, principal), **details})

    @app.get("/namespaces", responses=ERRORS, tags=["catalog"])
    def namespaces(principal: Reader) -> Response:
        """Namespaces the caller may see, with their tool counts ("" = tools with no namespace)."""
        return JSON({"namespaces": service.namespaces(principal)})

    @app.put("/tools/{tool_id:path}", response_model=WriteResponse, responses=ERRORS, tags=["catalog"])
    def put_tool(tool_id: NewToolId, body: ToolFields, principal: Writer) -> Response:
        """Create or replace one tool (only its changed text is re-embedded). Durable when answered."""
        return JSON(service.upsert([body.to_tool(tool_id)], principal).to_dict())

    @app.post("/tools", response_model=WriteResponse, responses=ERRORS, tags=["catalog"])
    def upsert_tools(body: UpsertRequest, principal: Writer) -> Response:
        """Create or replace many tools: toolscout records, or a whole catalog in any format (the answer then
        lists what reading it skipped or warned of)."""
        if body.tools is not None:
            return JSON(service.upsert([t.to_tool() for t in body.tools], principal).to_dict())
        from ..ingest import LoadReport, parse_tools

        report = LoadReport()
        tools = parse_tools(body.catalog, format=body.format, namespace=body.namespace, source="catalog", report=report)
        return JSON({**service.upsert(tools, principal).to_dict(), "warnings": report.notices()})

    @app.delete("/tools/{tool_id:path}", response_model=WriteResponse, responses=ERRORS, tags=["catalog"])
    def delete_tool(tool_id: str, principal: Writer) -> Response:
        """Remove one tool. Durable when answered."""
        return JSON(service.delete([tool_id], principal).to_dict())

    @app.post("/tools/delete", response_model=WriteResponse, responses=ERRORS, tags=["catalog"])
    def delete_tools(body: DeleteRequest, principal: Writer) -> Response:
        """Remove several tools at once (all or none: an unknown id fails the request)."""
        return JSON(service.delete(body.ids, principal).to_dict())


# ------------------------------------------------------------------------------------ feedback

def _add_feedback_routes(app: FastAPI, api: Api) -> None:
    service, metrics = api.service, api.metrics

    Writer = Annotated[Principal, Depends(api.writer)]

    def giver(request: Request) -> Principal:
        return api.auth.authenticate(request.headers.get("authorization"), write=False, feedback=True)

    Giver = Annotated[Principal, Depends(giver)]

    @app.post("/feedback", response_model=FeedbackResponse, responses=FEEDBACK_ERRORS, tags=["feedback"])
    def post_feedback(body: FeedbackIn | FeedbackBatchIn, principal: Giver) -> Response:
        """Report which tools served a task (one event, or `{"events": [...]}`); the index learns from it
        at once, durably. Tools the caller may not see count as unknown."""
        events = body.events if isinstance(body, FeedbackBatchIn) else [body]
        result = service.feedback([e.model_dump(exclude_none=True) for e in events], principal)
        metrics.count("feedback_events", result.events)
        metrics.count("feedback_learned", result.taught)
        return JSON({**result.to_dict(), "version": service.version(principal)})

    @app.post("/admin/learn", status_code=202, responses=RETRAIN_ERRORS, tags=["feedback"])
    def start_retraining(body: RetrainRequest, principal: Writer) -> Response:
        """Train `train` (mlc, refiner or embed) on the feedback so far, in the background; it is swapped in
        only if it ranks held-back feedback better. A token allowed every namespace. Poll GET /admin/learn.
        409 when too little feedback is stored to train and check on, or when a retraining is running."""
        state = service.retrain(body.train, principal, background=True, **body.options.model_dump(exclude_none=True))
        return JSON(state, status_code=202)

    @app.get("/admin/learn", responses=ERRORS, tags=["feedback"])
    def retraining_state(principal: Writer) -> Response:
        """How the last retraining went: running, swapped (it ranked better), kept (it did not), failed."""
        return JSON(service.retraining())

    @app.delete("/feedback", response_model=ForgetResponse, responses=ERRORS, tags=["feedback"])
    def delete_feedback(source: Annotated[str, Query(min_length=1, max_length=200)], principal: Giver) -> Response:
        """Take back everything feedback from `source` taught, exactly (a trusted token, or the source's own)."""
        touched = service.forget(source, principal)
        return JSON({"source": source, "tools": len(touched or ()), "version": service.version(principal),
                     "note": nothing_from(source) if touched is None else None})

    _add_learning_routes(app, api)


def _add_learning_routes(app: FastAPI, api: Api) -> None:
    service = api.service
    Reader = Annotated[Principal, Depends(api.reader)]
    Writer = Annotated[Principal, Depends(api.writer)]

    @app.get("/learning", responses=ERRORS, tags=["feedback"])
    def learning_report(principal: Reader) -> Response:
        """How learning from use is doing: every event is scored before it is learned (where the used tool
        ranked as served, untaught, and learned at full weight); the figures per namespace, the weight
        learning has in each (automatic unless set), whether it is frozen, and the calibration in force.
        `events_scored` and each figure's `events` count (event, tool) pairs: an event naming two tools is
        scored, and counted, once for each."""
        return JSON(service.learning(principal))

    @app.post("/learning", responses=ERRORS, tags=["feedback"])
    def set_learning(body: LearningSettingsIn, principal: Writer) -> Response:
        """Set learning's weight per namespace (0 to 1; null: automatic again; "*": every namespace without
        its own), or freeze it (`freeze: true`: what is taught from now on is recorded, not learned) and
        unfreeze it. A token allowed every namespace."""
        return JSON(service.set_learning(principal, weights=body.weights_set(), freeze=body.freeze))

    @app.post("/learning/rollback", responses=ERRORS, tags=["feedback"])
    def rollback_learning(body: RollbackIn, principal: Writer) -> Response:
        """Take back everything learned at or after `before` (seconds since the epoch): rankings are those of
        that time again; nothing else changes. `dry_run`: only say what would go (`taken_back` pairs, `learned`
        and `held_by_freeze` of them, per source). Taking back nothing changes nothing, not even the version.
        A token allowed every namespace."""
        said = service.rollback_learning(body.before_epoch(), principal, dry_run=body.dry_run)
        return JSON({"before": body.before_epoch(), **said, "version": service.version(principal)})


# ---------------------------------------------------------------------------------- operations

def _add_operation_routes(app: FastAPI, api: Api) -> None:
    service = api.service
    Writer = Annotated[Principal, Depends(api.writer)]

    @app.post("/admin/compact", responses=ERRORS, tags=["admin"])
    def compact(principal: Writer) -> Response:
        """Write a full snapshot now and empty the journal (needs a token allowed every namespace)."""
        if principal.namespaces is not None:
            raise Forbidden("compaction needs a token that may write every namespace")
        did = service.compact()
        return JSON({"compacted": did, **service.stats(principal)})

    @app.get("/health", tags=["operations"], responses={503: {"description": "Degraded: writes are disabled after a failure (the same body, status 'degraded')."}})
    def health(request: Request) -> Response:
        """Liveness (no token needed), and the catalog's state as far as the caller's token may read it.
        503 when writes are disabled after a failure."""
        viewer = api.viewer(request)
        body = service.stats(viewer)
        if api.extension is not None and viewer is not None:  # its fields name namespaces (a gateway's upstreams)
            body.update(api.extension.health(viewer))
        ok = service.failed is None
        return JSON({"status": "ok" if ok else "degraded", **body}, status_code=200 if ok else 503)

    @app.get("/metrics", response_class=PlainTextResponse, responses=ERRORS, tags=["operations"])
    def prometheus(request: Request) -> Response:
        """Request counts, latency histograms and the catalog's gauges, Prometheus text format: a caller who
        may read every namespace (401 without a token where reads need one, 403 for a token limited to some)."""
        api.scraper(request)
        stats = service.stats()
        gauges = {k: stats[k] for k in GAUGES if k in stats}
        return PlainTextResponse(api.metrics.render(gauges, service.learning()),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")


# ---------------------------------------------------------------------------------- playground

def _add_ui_routes(app: FastAPI) -> None:
    """The playground page and its files: static, no token (the page's API calls carry the user's),
    outside the OpenAPI schema."""

    @app.api_route("/ui", methods=["GET", "HEAD"], include_in_schema=False)
    def playground() -> Response:
        return ui.page()

    @app.get("/docs", include_in_schema=False)
    def api_docs(request: Request) -> Response:
        return ui.api_docs(request.scope.get("root_path", "").rstrip("/"), f"{app.title} - API docs")

    @app.api_route("/ui/{name}", methods=["GET", "HEAD"], include_in_schema=False)
    def playground_file(name: str) -> Response:
        return ui.asset(name)
