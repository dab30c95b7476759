"""The MCP server: `search_tools` and `record_tool_use`, over stdio or streamable HTTP (official `mcp` SDK).

    toolscout serve DIR --mcp                       # stdio: what an MCP host launches
    toolscout serve DIR --mcp --port 8081           # MCP only, streamable HTTP at /mcp
    toolscout serve DIR                             # the HTTP API, with MCP mounted at /mcp

`search_tools(task, k=5, namespaces=None)` returns the tools' names, descriptions and input schemas
(plus namespace = the server that hosts each tool, id, score), best first, ready for the agent to
call. It returns an empty list when no tool fits the task (abstention). `record_tool_use(task, tool_ids,
outcome=None)` reports which tools served a task; the index learns from it at once (`toolscout.feedback`).
Over HTTP the caller's bearer token decides which namespaces it may see and whether it may report use,
as for the HTTP API; over stdio the host that launched the server may.

This is toolscout's one MCP surface: `ToolSearchMcp` is what those two tools do (who calls, the check on
a task, the search, what a found tool shows, recording use), and their arguments are declared here once
(`SearchArgs`, `RecordArgs`) and read as the HTTP API reads a body (`checked_arguments`: no unknown
arguments, no coercion, `k` within the API's bound, errors that name the argument). `build_mcp_server`
serves it on the SDK's `MCPServer`; the gateway's server (`gateway/mcp_server.py`) extends it on the SDK's
low-level server with `call_tool`, the upstreams' prompts and resources, and the upstreams it could not
search.
"""

# No `from __future__ import annotations` here: the SDK reads the tool function's annotations at run
# time, and they refer to a local value (Context, imported in build_mcp_server).
import contextlib
import logging
from typing import Annotated, Any, Iterator, Literal, Optional, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import Forbidden, InvalidRequest, ToolScoutError, is_blank
from ..feedback import LearnResult
from ..hits import Hits, abstained
from ..version import __version__
from .auth import AuthConfig, AuthError
from .schemas import DEFAULT_K, SearchedNamespace, ToolCount, said
from .service import ADMIN, Principal, ToolService, unknown_namespaces

INSTRUCTIONS = ("toolscout finds the right tools for a task in a large catalog. Call search_tools with the task in "
                "plain language (or a tool's name) before choosing a tool; call the tools it returns on the "
                "server named by their namespace. An empty result means no tool in the catalog fits. Afterwards, "
                "record_tool_use with the ids of the tools that served the task improves later searches.")

RECORD_DESCRIPTION = ("After calling tools that search_tools returned, report which of them served the task: toolscout "
                      "learns from it at once, so later searches for similar tasks rank those tools higher.")

SEARCH_DESCRIPTION = ("Find the tools that fit a task, best first. Returns each tool's name, description and input "
                      "schema (JSON Schema) ready to call, with the namespace (server) that hosts it. Returns no "
                      "tools when nothing in the catalog fits.")


# The arguments, declared once: both servers' input schemas and their checks (`checked_arguments`) come from
# these models; `build_mcp_server`'s functions take the same types.
SearchTask = Annotated[str, Field(min_length=1, max_length=1 << 20, description=(
    "The task in plain language (a whole conversation is fine), or a tool's name."))]
K = Annotated[ToolCount, Field(description="How many tools to return at most.")]
Namespaces = Annotated[Optional[list[SearchedNamespace]], Field(
    description='Only tools of these namespaces (servers); "": the tools with no namespace.')]
RecordTask = Annotated[str, Field(min_length=1, max_length=20000, description="The task as it was searched for.")]
ToolIds = Annotated[list[str], Field(min_length=1, max_length=64,
                                     description="The ids (from search_tools) of the tools that served it.")]
Outcome = Annotated[Optional[Literal["success", "failure"]],
                    Field(description="Whether they served it (default success).")]


class Arguments(BaseModel):
    # read as the HTTP API reads a body: no unknown arguments (a misspelt one would be ignored), no coercion
    # ("3" is not 3; 3.0 is JSON's 3)
    model_config = ConfigDict(extra="forbid", strict=True)


class SearchArgs(Arguments):
    task: SearchTask
    k: K = DEFAULT_K
    namespaces: Namespaces = None


class RecordArgs(Arguments):
    task: RecordTask
    tool_ids: ToolIds
    outcome: Outcome = None


OWN_ARGUMENTS = {"search_tools": SearchArgs, "record_tool_use": RecordArgs}
Args = TypeVar("Args", bound=Arguments)


def checked_arguments(tool: str, model: type[Args], arguments: Any) -> Args:
    """`arguments` of a call of `tool` as `model` reads them; InvalidRequest naming the argument at fault, in
    words (the first fault, as the HTTP API's message names its first)."""
    try:
        return model.model_validate(arguments)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error.get("loc", ())) or "arguments"
        if error.get("type") == "extra_forbidden":
            raise InvalidRequest(f"{tool}: {where}: unknown argument ({tool} takes "
                                 f"{', '.join(model.model_fields)})") from None
        raise InvalidRequest(f"{tool}: {where}: {said(error)}") from None


class FoundTool(BaseModel):
    name: str = Field(description="The tool's name, as its server knows it.")
    description: str
    input_schema: dict[str, Any] = Field(description="JSON Schema of the tool's arguments.")
    namespace: str | None = Field(None, description="The server or group the tool belongs to.")
    id: str = Field(description="Unique id in the catalog (namespace.name).")
    score: float = Field(description="Orders the tools (higher is better); not comparable across tasks.")
    match: str = Field(description="retrieval, name (the task named this tool) or always.")
    probability: Optional[float] = Field(None, ge=0, le=1, description=(
        "How likely the tool is one the task needs (calibrated: comparable across tasks and catalogs)."))


UNKNOWN_NAMESPACES = "Namespaces the search named that hold no tool the caller may see (a typo?)."
DEGRADED = ("Set when the index's LLM reranker could not rank the task: {stage, reason}; the tools are then the "
            "first stage's ranking.")


class SearchToolsResult(BaseModel):
    tools: list[FoundTool]
    abstained: bool = Field(description="True when no tool fits the task.")
    unknown_namespaces: list[str] = Field(default_factory=list, description=UNKNOWN_NAMESPACES)
    degraded: Optional[dict[str, str]] = Field(None, description=DEGRADED)


class RecordedUse(BaseModel):
    learned: int = Field(description="How many of the tools learned the task now (0 for a repeat or a failure).")
    duplicate: bool = Field(description="True when this source had reported the same task and tool before.")
    unknown_tools: list[str] = Field(description="Ids that name no tool the caller may see (ignored).")
    held_by_freeze: int = Field(description="How many of the tools were recorded but not taught: learning is frozen.")
    failures: int = Field(description="1 when the use was recorded as a failure (outcome failure: teaches nothing).")
    incidental: int = Field(description="How many of the tools were not taught because the task is nothing but "
                                        "numbers, dates and addresses.")
    capped: int = Field(description="How many of the tools were past the per-source cap (recorded, not taught).")
    note: str | None = Field(description="What the counts leave out, in words (learning frozen), else null.")

    @classmethod
    def of(cls, result: LearnResult) -> "RecordedUse":
        """The counts POST /feedback answers (`LearnResult.to_dict`, the one place they are said), for one use."""
        said = result.to_dict()
        return cls(duplicate=bool(result.duplicates), **{k: said[k] for k in cls.model_fields if k in said})


class ToolSearchMcp:
    """What a toolscout MCP server answers `search_tools` and `record_tool_use` with, whatever SDK layer
    carries the calls: who calls (`principal`), the check on a task, the search, what a found tool shows,
    and recording use. `build_mcp_server` serves it; the gateway's server extends it (`GatewayMcp`)."""

    found_tool: type[FoundTool] = FoundTool  # the fields a found tool shows

    def __init__(self, service: ToolService, *, auth: AuthConfig | None = None, stdio_principal: Principal = ADMIN,
                 metrics: Any = None):
        self.service, self.auth, self.stdio_principal, self.metrics = service, auth, stdio_principal, metrics

    def principal(self, request: Any, *, feedback: bool = False) -> Principal:
        """Who calls: over HTTP (`request`), its bearer token (AuthError when the token may not); over a pipe
        or in-process (no request), the host that launched the server."""
        if request is None:
            return self.piped_principal()
        if self.auth is None:  # an app built without tokens
            return self.stdio_principal
        return self.auth.authenticate(request.headers.get("authorization"), write=False, feedback=feedback)

    def piped_principal(self) -> Principal:
        return self.stdio_principal

    async def search_tools(self, task: str, k: int, principal: Principal, namespaces: list[str] | None,
                           session: str = "stdio") -> dict[str, Any]:
        """`search_tools`' answer: the found tools, best first, whether it abstained, and what `search` adds."""
        if is_blank(task):
            raise InvalidRequest("task must not be blank")
        hits, added = await self.search(task, k, principal, namespaces, session)
        found_nothing = abstained(hits)
        if self.metrics is not None:
            self.metrics.count("queries")
            self.metrics.count("abstained", found_nothing)
        return {"tools": [self.found(hit.to_dict()) for hit in hits], "abstained": found_nothing,
                "unknown_namespaces": unknown_namespaces(self.service, namespaces, principal, added), **added,
                **hits.degraded_dict()}

    async def search(self, task: str, k: int, principal: Principal, namespaces: list[str] | None,
                     session: str) -> tuple[Hits, dict[str, Any]]:
        """The hits for a task, and the fields the answer adds (none here; the gateway adds the upstreams it
        could not search). `session`: whose search it is, for a server that remembers."""
        return await self.service.search_async(task, k, principal=principal, namespaces=namespaces), {}

    def found(self, hit: dict[str, Any]) -> dict[str, Any]:
        """The fields of a hit's JSON (`Hit.to_dict`) that `search_tools` returns."""
        return {key: hit.get(key) for key in self.found_tool.model_fields}

    def record_tool_use(self, task: str, tool_ids: list[str], outcome: str | None, principal: Principal) -> RecordedUse:
        result = self.service.feedback([{"query": task, "tool_ids": tool_ids, "outcome": outcome}], principal)
        if self.metrics is not None:
            self.metrics.count("feedback_events", result.events)
            self.metrics.count("feedback_learned", result.taught)
        return RecordedUse.of(result)


def build_mcp_server(service: ToolService, *, auth: AuthConfig | None = None, stdio_principal: Principal = ADMIN,
                     metrics: Any = None):
    """An `MCPServer` answering `search_tools` and `record_tool_use` from `service` (`ToolSearchMcp`). Over HTTP
    the principal comes from the request's bearer token (`auth`); over stdio it is `stdio_principal`."""
    from mcp.server.mcpserver import Context
    from mcp.server.mcpserver.tools import Tool

    surface = ToolSearchMcp(service, auth=auth, stdio_principal=stdio_principal, metrics=metrics)

    async def search_tools(task: SearchTask, ctx: Context, k: K = DEFAULT_K,
                           namespaces: Namespaces = None) -> SearchToolsResult:
        with _told():
            answer = await surface.search_tools(task, k, _caller(surface, ctx), namespaces)
        return SearchToolsResult.model_validate(answer)

    def record_tool_use(task: RecordTask, tool_ids: ToolIds, ctx: Context, outcome: Outcome = None) -> RecordedUse:
        with _told():  # in a worker thread: it writes
            return surface.record_tool_use(task, tool_ids, outcome, _caller(surface, ctx, feedback=True))

    tools = [Tool.from_function(search_tools, title="Search tools", description=SEARCH_DESCRIPTION,
                                structured_output=True),
             Tool.from_function(record_tool_use, title="Record tool use", description=RECORD_DESCRIPTION,
                                structured_output=True)]
    # the input schemas of the argument models (they forbid unknown arguments, as `_check_arguments` does)
    return _mcp_server([tool.model_copy(update={"parameters": OWN_ARGUMENTS[tool.name].model_json_schema()})
                        for tool in tools])


async def _check_arguments(ctx: Any, call_next: Any) -> Any:
    """The server's middleware: a call of its own tools whose arguments `checked_arguments` refuses gets its
    message as an error result before the SDK reads them (the SDK ignores unknown arguments, takes "3" for 3,
    and answers a wrong one with pydantic's own text)."""
    params = ctx.params if ctx.method == "tools/call" and isinstance(ctx.params, dict) else {}
    model = OWN_ARGUMENTS.get(params.get("name"))
    if model is not None:
        try:
            checked_arguments(params["name"], model, params.get("arguments") or {})
        except InvalidRequest as exc:
            from mcp_types import CallToolResult, TextContent

            return CallToolResult(content=[TextContent(type="text", text=str(exc))], is_error=True)
    return await call_next(ctx)


def _mcp_server(tools: list) -> Any:
    from mcp.server import MCPServer

    root = logging.getLogger()
    guard = logging.NullHandler() if not root.handlers else None
    if guard is not None:  # MCPServer calls logging.basicConfig: keep the process's logging as it was
        root.addHandler(guard)
    try:
        return MCPServer("toolscout", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING",
                         tools=tools, middleware=[_check_arguments])
    finally:
        if guard is not None:
            root.removeHandler(guard)


def _caller(surface: ToolSearchMcp, ctx: Any, feedback: bool = False) -> Principal:
    """Who makes an `MCPServer` tool call: its context holds the HTTP request (None over stdio)."""
    request = getattr(getattr(ctx, "request_context", None), "request", None)
    try:
        return surface.principal(request, feedback=feedback)
    except AuthError as exc:  # the HTTP route checked the token already; this only guards misuse
        raise Forbidden(exc.message) from None


@contextlib.contextmanager
def _told() -> Iterator[None]:
    """toolscout's own errors reach the agent with their message: the SDK shows only the tool's name for any
    other exception (it takes them for crashes, and logs their traceback)."""
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        yield
    except ToolScoutError as exc:
        raise ToolError(str(exc)) from exc


def mcp_http_app(server: Any, *, host: str = "127.0.0.1", path: str = "/mcp", max_body_bytes: int = 1 << 20):
    """The streamable-HTTP Starlette app of `server` (stateless, JSON responses: one search per POST)."""
    return server.streamable_http_app(streamable_http_path=path, stateless_http=True, json_response=True,
                                      host=host, max_request_body_size=max_body_bytes)
