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
"""

# No `from __future__ import annotations` here: the SDK reads the tool function's annotations at run
# time, and they refer to local values (max_k).
import logging
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, Field

from ..errors import Forbidden, InvalidRequest
from ..version import __version__
from .auth import AuthConfig, AuthError
from .service import ADMIN, Principal, ToolService

INSTRUCTIONS = ("toolscout finds the right tools for a task in a large catalog. Call search_tools with the task in "
                "plain language (or a tool's name) before choosing a tool; call the tools it returns on the "
                "server named by their namespace. An empty result means no tool in the catalog fits. Afterwards, "
                "record_tool_use with the ids of the tools that served the task improves later searches.")

RECORD_DESCRIPTION = ("After calling tools that search_tools returned, report which of them served the task: toolscout "
                      "learns from it at once, so later searches for similar tasks rank those tools higher.")

SEARCH_DESCRIPTION = ("Find the tools that fit a task, best first. Returns each tool's name, description and input "
                      "schema (JSON Schema) ready to call, with the namespace (server) that hosts it. Returns no "
                      "tools when nothing in the catalog fits.")


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


class SearchToolsResult(BaseModel):
    tools: list[FoundTool]
    abstained: bool = Field(description="True when no tool fits the task.")


class RecordedUse(BaseModel):
    learned: int = Field(description="How many of the tools learned the task now (0 for a repeat or a failure).")
    duplicate: bool = Field(description="True when this source had reported the same task and tool before.")
    unknown_tools: list[str] = Field(description="Ids that name no tool the caller may see (ignored).")


def build_mcp_server(service: ToolService, *, auth: AuthConfig | None = None, stdio_principal: Principal = ADMIN,
                     default_k: int = 5, max_k: int = 50, metrics: Any = None):
    """An `MCPServer` answering `search_tools` from `service`. Over HTTP the principal comes from the
    request's bearer token (`auth`); over stdio it is `stdio_principal`."""
    from mcp.server import MCPServer
    from mcp.server.mcpserver import Context

    root = logging.getLogger()
    guard = logging.NullHandler() if not root.handlers else None
    if guard is not None:  # MCPServer calls logging.basicConfig: keep the process's logging as it was
        root.addHandler(guard)
    try:
        server = MCPServer("toolscout", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")
    finally:
        if guard is not None:
            root.removeHandler(guard)

    def search_tools(
        task: Annotated[str, Field(min_length=1, max_length=1 << 20,
                                   description="The task in plain language (a whole conversation is fine), or a "
                                               "tool's name.")],
        ctx: Context,
        k: Annotated[int, Field(ge=1, le=max_k, description="How many tools to return at most.")] = default_k,
        namespaces: Annotated[Optional[list[str]],
                              Field(description="Only tools of these namespaces (servers).")] = None,
    ) -> SearchToolsResult:
        principal = _principal(ctx, auth, stdio_principal)
        if not task.strip():
            raise InvalidRequest("task must not be blank")
        hits = service.search(task, k, principal=principal, namespaces=namespaces)
        if metrics is not None:
            metrics.count("queries")
            metrics.count("abstained", not hits)
        return SearchToolsResult(tools=[FoundTool(**_found(h.to_dict())) for h in hits], abstained=not hits)

    def record_tool_use(
        task: Annotated[str, Field(min_length=1, max_length=20000,
                                   description="The task as it was searched for.")],
        tool_ids: Annotated[list[str], Field(min_length=1, max_length=64,
                                             description="The ids (from search_tools) of the tools that served it.")],
        ctx: Context,
        outcome: Annotated[Optional[Literal["success", "failure"]],
                           Field(description="Whether they served it (default success).")] = None,
    ) -> RecordedUse:
        principal = _principal(ctx, auth, stdio_principal, feedback=True)
        result = service.feedback([{"query": task, "tool_ids": tool_ids, "outcome": outcome}], principal)
        if metrics is not None:
            metrics.count("feedback_events", result.events)
            metrics.count("feedback_learned", len(result.learned))
        return RecordedUse(learned=len(result.learned), duplicate=bool(result.duplicates),
                           unknown_tools=result.unknown)

    server.add_tool(search_tools, name="search_tools", title="Search tools", description=SEARCH_DESCRIPTION,
                    structured_output=True)
    server.add_tool(record_tool_use, name="record_tool_use", title="Record tool use", description=RECORD_DESCRIPTION,
                    structured_output=True)
    return server


def _found(hit: dict[str, Any]) -> dict[str, Any]:
    """The fields of a hit's JSON (`Hit.to_dict`) that `search_tools` returns."""
    return {key: hit[key] for key in FoundTool.model_fields if key in hit}


def _principal(ctx: Any, auth: AuthConfig | None, stdio_principal: Principal, feedback: bool = False) -> Principal:
    request = getattr(getattr(ctx, "request_context", None), "request", None)
    if request is None or auth is None:  # stdio, or an in-process client
        return stdio_principal
    try:
        return auth.authenticate(request.headers.get("authorization"), write=False, feedback=feedback)
    except AuthError as exc:  # the HTTP route checked the token already; this only guards misuse
        raise Forbidden(exc.message) from None


def mcp_http_app(server: Any, *, host: str = "127.0.0.1", path: str = "/mcp", max_body_bytes: int = 1 << 20):
    """The streamable-HTTP Starlette app of `server` (stateless, JSON responses: one search per POST)."""
    return server.streamable_http_app(streamable_http_path=path, stateless_http=True, json_response=True,
                                      host=host, max_request_body_size=max_body_bytes)
