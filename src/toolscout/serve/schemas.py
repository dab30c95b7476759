"""The HTTP API's request and response bodies (pydantic). Every request model forbids unknown fields."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from ..tool import Tool

# a task may be as long as the body allows (a whole conversation, an image in it): search reads the part
# that matters and says when it cut the rest (`truncated`, toolscout.conversation.focus)
Text = Annotated[str, StringConstraints(min_length=1, max_length=1 << 20)]
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
    explain: bool = Field(False, description="Add to each hit `matched`: the query's words found in the tool's "
                                             "text view (compared as BM25 terms: lowercase, stemmed, no stopwords).")
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


class FeedbackIn(_Strict):
    """One report of tool use: the task and the tools that served it."""

    query: Annotated[str, StringConstraints(min_length=1, max_length=20000)] = Field(
        description="The task the agent was given (as it searched for it).")
    tool_ids: list[Ident] = Field(min_length=1, max_length=64, description="The tools that served it.")
    source: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = Field(
        None, description="Who reports it (default: the caller's own source; only a trusted token names another).")
    outcome: Literal["success", "failure"] | None = Field(
        None, description="Whether the tools served the task (default success; a failure teaches nothing).")


class FeedbackBatchIn(_Strict):
    events: list[FeedbackIn] = Field(min_length=1, max_length=10000)


class RetrainRequest(_Strict):
    train: Literal["mlc", "refiner", "embed"] = Field(description="What to train on the feedback so far.")
    options: dict[str, Any] = Field(default_factory=dict, description="The trainer's settings (as `toolscout "
                                                                      "train METHOD -o KEY=VALUE`).")


class FeedbackResponse(BaseModel):
    events: int
    learned: int
    duplicates: int
    capped: int
    failures: int
    unknown_tools: list[str]
    version: int


class ForgetResponse(BaseModel):
    source: str
    tools: int
    version: int


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
    matched: list[str] | None = Field(None, description="The query's words (lowercased, once each, in query "
                                                        "order) whose stem occurs in the tool's text view; only "
                                                        "when the request asks to `explain`.")


class QueryResult(BaseModel):
    query: str
    abstained: bool
    truncated: bool = Field(description="True when the task was longer than search reads: it read the latest turns "
                                        "of a conversation, or the beginning of other text, without blobs.")
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
FEEDBACK_ERRORS = {**ERRORS, 429: {"model": ErrorResponse}}


ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 413, 415, 422)}
FEEDBACK_ERRORS = {**ERRORS, 429: {"model": ErrorResponse}}
