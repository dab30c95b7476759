"""The HTTP API's request and response bodies (pydantic). Every request model forbids unknown fields."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
    WrapValidator,
    model_validator,
)

from ..errors import BLANK_CHARACTERS, is_blank
from ..tool import Tool


def _integral(value: Any) -> Any:
    """JSON Schema counts 5.0 as an integer; strict validation would not."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _int(ge: int, le: int) -> Any:
    """An integer in [ge, le] that may come as 5.0 (JSON Schema counts it as an integer; strict pydantic not)."""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_integral)]


# The most tools one search over HTTP or MCP returns per task (the Python API has no such bound), and how many
# it returns when not told.
MAX_K = 100
DEFAULT_K = 5
ToolCount = _int(1, MAX_K)


def said(error: dict) -> str:
    """One pydantic validation error's message as people read it: a check of toolscout's own says it as written
    (pydantic prefixes "Value error, "), an unknown field that it is one. (Never pydantic's full text, which
    dumps the input and a link to its docs.)"""
    if error.get("type") == "extra_forbidden":
        return "unknown field (not allowed)"
    raised = (error.get("ctx") or {}).get("error")
    if error.get("type") == "value_error" and isinstance(raised, ValueError) and str(raised):
        return str(raised)
    return str(error.get("msg"))


# a task, id or name must hold more than BLANK_CHARACTERS: the schema says it as this pattern (spelled out:
# JavaScript's \s is a different set), the server as `is_blank`, from the same characters
NOT_BLANK = f"[^{BLANK_CHARACTERS}]"
BLANK = "must hold more than white space"


def _not_blank(value: str) -> str:
    if is_blank(value):  # the schema's pattern says the same
        raise ValueError(BLANK)
    return value


def not_blank(text_type: Any) -> Any:
    """`text_type` that must hold more than white space. The schema states the rule as a pattern; the check is
    Python's own (the same characters), so that a 422 names the field with a message people read instead of a
    character class."""
    return Annotated[text_type, Field(json_schema_extra={"pattern": NOT_BLANK}), AfterValidator(_not_blank)]


CatalogFormat = Literal["openai", "anthropic", "mcp", "openapi"]  # the ones a JSON body can hold

# a task may be as long as the body allows (a whole conversation, an image in it): search reads the part
# that matters and says when it cut the rest (`truncated`, toolscout.conversation.focus)
Text = not_blank(Annotated[str, StringConstraints(min_length=1, max_length=1 << 20)])
MAX_ID_CHARS = 512  # a tool id: what a write may name is what feedback may name
Ident = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS)]
MAX_NAMESPACE_CHARS = 256
# a namespace a search names: "" is the namespace of the tools that have none (as /namespaces lists them)
SearchedNamespace = Annotated[str, StringConstraints(max_length=MAX_NAMESPACE_CHARS)]


class _Strict(BaseModel):
    # No unknown fields, and no coercion (0 is not false, "5" is not 5): a body means what the schema says.
    # An optional field is typed without None and defaults to None: it may be left out, and an explicit
    # null is refused like any other wrong type (the schema has no null for it either).
    # JSON has no NaN or Infinity (Python's parser reads them): no number field takes them.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def _exactly_one_of(data: Any, *fields: str) -> Any:
    """A body (before its fields are read: what is wrong with one field matters less than sending both, or
    neither) that holds exactly one of `fields`; the schema says it with `_one_of`."""
    if isinstance(data, dict) and sum(field in data for field in fields) != 1:
        raise ValueError(f"give exactly one of {' or '.join(map(repr, fields))}")
    return data


def _one_of(*alternatives: str, exclusive: dict[str, tuple[str, ...]] | None = None) -> dict:
    """JSON Schema for "exactly one of these fields" (`exclusive`: fields each alternative rules out, too),
    so that the OpenAPI document says what the model validator enforces."""
    exclusive = exclusive or {}
    return {"oneOf": [{"required": [name], "not": {"anyOf": [{"required": [other]} for other in
                                                             (*[a for a in alternatives if a != name],
                                                              *exclusive.get(name, ()))]}}
                      for name in alternatives]}


def _not_empty(list_type: Any, what: str) -> Any:
    """`list_type` that must name something when given: an empty one would make a search find nothing. (The
    schema says minItems; the check is a message of toolscout's own, as `not_blank`'s.)"""
    def check(value: list) -> list:
        if not value:
            raise ValueError(f"names no {what}, so the search could find nothing: name one, or leave the field out")
        return value

    return Annotated[list_type, Field(json_schema_extra={"minItems": 1}), AfterValidator(check)]


class SearchRequest(_Strict):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_one_of("query", "queries"))

    query: Text = Field(None, description="One task in plain language (or a tool's name).")
    queries: Annotated[list[Text], Field(min_length=1, max_length=64)] = Field(
        None, description="Several tasks at once.")
    k: ToolCount = Field(DEFAULT_K, description="Tools per query (name matches count; always_include does not).")
    namespaces: _not_empty(list[SearchedNamespace], "namespace") | None = Field(
        None, description='Only tools of these namespaces ("": the tools with no namespace).')
    ids: _not_empty(list[Ident], "tool") | None = Field(None, description="Only these tool ids.")
    exclude_ids: list[Ident] = Field(default_factory=list, description="Never these tool ids.")
    abstain: bool = Field(True, description="Return nothing when no tool fits (the server's thresholds).")
    min_score: float | None = Field(None, description="Abstention threshold on the best score for this request "
                                                      "(overrides the server's).")
    min_probability: Annotated[float, Field(ge=0, le=1)] = Field(
        None, description="Abstention threshold on the best hit's probability for this request (overrides the "
                          "server's). Hits carry probabilities where the pipeline has a calibration (the default "
                          "one); elsewhere this never abstains.")
    always_include: list[Ident] = Field(default_factory=list, description="Tool ids to return in any case.")
    match_names: bool = Field(True, description="A query naming a tool ranks that tool first.")
    explain: bool = Field(False, description="Add to each hit `matched`: the query's words found in the tool's "
                                             "text view (compared as BM25 terms: lowercase, stemmed, no stopwords).")
    format: Literal["toolscout", "openai", "openai_responses", "anthropic"] = Field(
        "toolscout", description="Also return the hits as ready-made tool definitions for this API.")


    @model_validator(mode="before")
    @classmethod
    def _exactly_one(cls, data: Any) -> Any:
        return _exactly_one_of(data, "query", "queries")

    def named_ids(self) -> set[str]:
        """The ids the request asks for: in `ids` (only these) and `always_include` (these in any case)."""
        return {*(self.ids or ()), *self.always_include}

    def excluded_ids(self) -> list[str]:
        """Those of the ids it asks for that its `exclude_ids` takes out again (a search can never return them;
        one whose every id is excluded finds nothing: a 200 that says so, since the schema cannot forbid it)."""
        return sorted(self.named_ids() & set(self.exclude_ids))


class ToolFields(_Strict):
    """A tool record without its id (the body of PUT /tools/{id}, whose path names the tool)."""

    name: not_blank(Annotated[str, StringConstraints(min_length=1, max_length=256)])
    description: str = Field("", max_length=20000)
    parameters: dict[str, Any] | None = None
    returns: dict[str, Any] | None = None
    namespace: Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAMESPACE_CHARS)] | None = None
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

    @model_validator(mode="before")
    @classmethod
    def _id_in_path(cls, data: Any) -> Any:
        if cls is ToolFields and isinstance(data, dict) and "id" in data:
            raise ValueError("leave 'id' out of the body: PUT /tools/{id} takes the tool's id from the path")
        return data

    def to_tool(self, tool_id: str | None = None) -> Tool:
        data = self.model_dump(exclude_none=True)
        data["id"] = tool_id or data.get("id") or (f"{self.namespace}.{self.name}" if self.namespace else self.name)
        return Tool.from_dict(data)


class ToolIn(ToolFields):
    """A tool record (the fields of `toolscout.Tool`). `id` defaults to `namespace.name` (or `name`)."""

    id: not_blank(Ident) | None = None


# Every catalog format read over HTTP is a JSON object, or a non-empty array of objects (tools, servers).
CATALOG_SCHEMA = {"anyOf": [{"type": "object", "minProperties": 1},
                            {"type": "array", "minItems": 1, "items": {"type": "object"}}]}


class UpsertRequest(_Strict):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_one_of(
        "tools", "catalog", exclusive={"tools": ("format", "namespace")}))

    tools: Annotated[list[ToolIn], Field(min_length=1, max_length=10000)] = Field(
        None, description="Tool records.")
    catalog: Annotated[Any, WithJsonSchema(CATALOG_SCHEMA)] = Field(
        None, description="Or: a catalog in any format toolscout reads (OpenAI, Anthropic, MCP tools/list, OpenAPI) "
                          "as JSON. A catalog of the right JSON type can still be unreadable (a tool without a name, "
                          "two tools with one id): that is a 422 naming the entry at fault; one with no tools adds "
                          "nothing and says so in 'warnings'.")
    format: CatalogFormat = Field(None, description="The catalog's format, when detection is not wanted.")
    namespace: Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAMESPACE_CHARS)] = Field(
        None, description="Namespace for the catalog's tools.")

    @model_validator(mode="before")
    @classmethod
    def _exactly_one(cls, data: Any) -> Any:
        return _exactly_one_of(data, "tools", "catalog")

    @model_validator(mode="after")
    def _catalog_or_tools(self) -> "UpsertRequest":
        if self.tools is None and not (isinstance(self.catalog, (dict, list)) and self.catalog):
            raise ValueError("'catalog' must be a JSON object or array with something in it")
        if isinstance(self.catalog, list) and not all(isinstance(item, dict) for item in self.catalog):
            raise ValueError("'catalog' as an array holds objects (tools or servers) only")
        if self.tools is not None and (self.format or self.namespace):
            raise ValueError("'format' and 'namespace' apply to 'catalog' only")
        return self


class DeleteRequest(_Strict):
    ids: list[Ident] = Field(min_length=1, max_length=10000)


class FeedbackIn(_Strict):
    """One report of tool use: the task and the tools that served it."""

    query: not_blank(Annotated[str, StringConstraints(min_length=1, max_length=20000)]) = Field(
        description="The task the agent was given (as it searched for it).")
    tool_ids: list[Ident] = Field(min_length=1, max_length=64, description="The tools that served it.")
    source: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = Field(
        None, description="Who reports it (default: the caller's own source; only a trusted token names another).")
    outcome: Literal["success", "failure"] | None = Field(
        None, description="Whether the tools served the task (default success; a failure teaches nothing).")


class FeedbackBatchIn(_Strict):
    events: list[FeedbackIn] = Field(min_length=1, max_length=10000)


def _one_weight_error(value: Any, handler: Any) -> Any:
    """A weight fails as a whole, in words: pydantic would name each member of the union it tried
    (`weights.mt.constrained-float`, `weights.mt.literal['auto']`)."""
    try:
        return handler(value)
    except ValidationError:
        got = json.dumps(value, default=repr)
        raise ValueError(f"a number from 0 to 1, \"auto\" or null (automatic), got {got}") from None


# a namespace's learning weight as an operator sets it
Weight = Annotated[Annotated[float, Field(ge=0, le=1)] | Literal["auto"] | None, WrapValidator(_one_weight_error)]


class LearningSettingsIn(_Strict):
    weights: dict[Annotated[str, StringConstraints(max_length=200)], Weight] | None = Field(
        None, description='Learning weight per namespace, 0 to 1 ("auto" or null: automatic again, as `toolscout '
                          'learning weight` says it; "*": every namespace without its own).')

    def weights_set(self) -> dict[str, float | None] | None:
        """`weights` as the service takes them: "auto" is None."""
        return None if self.weights is None else {ns: None if w == "auto" else w for ns, w in self.weights.items()}
    freeze: bool | None = Field(None, description="true: learn nothing taught from now on (it is still recorded); "
                                                  "false: learn what was held back.")


class RollbackIn(_Strict):
    # seconds only: every date-time string the schema would allow is not one Python can read (years before 1,
    # leap seconds); `toolscout learning rollback --before` takes ISO 8601 and sends seconds
    before: float = Field(allow_inf_nan=False, description="Take back what was learned at or after this time "
                                                           "(seconds since the epoch, not milliseconds; a time "
                                                           "before 1970 or after now is refused).")
    dry_run: bool = Field(False, description="Only say what would be taken back (how many pairs, from which "
                                             "sources); change nothing.")

    def before_epoch(self) -> float:
        return float(self.before)


class RetrainOptions(_Strict):
    """The training settings a retraining over HTTP may change (the library and `toolscout learn --train`
    take every setting of the trainer)."""

    epochs: _int(1, 100) = None
    max_steps: _int(1, 1_000_000) = None
    batch_size: _int(1, 1024) = None
    lr: Annotated[float, Field(gt=0, le=1)] = None
    patience: _int(1, 1000) = None
    seed: _int(0, 2**31 - 1) = None



class RetrainRequest(_Strict):
    train: Literal["mlc", "refiner", "embed"] = Field(description="What to train on the feedback so far.")
    options: RetrainOptions = Field(default_factory=RetrainOptions, description="Training settings.")


class FeedbackResponse(BaseModel):
    events: int = Field(description="Events received.")
    learned: int = Field(description="(tool, request) pairs teaching the index now.")
    held_by_freeze: int = Field(description="(tool, request) pairs recorded but not learned, because learning is "
                                       "frozen; they teach once it is unfrozen.")
    duplicates: int = Field(description="(tool, request) pairs this source had reported before (counted once).")
    capped: int = Field(description="(tool, request) pairs past the source's per-tool cap (recorded, teaching "
                                    "nothing).")
    failures: int = Field(description="Events with outcome failure (recorded, teaching nothing).")
    incidental: int = Field(description="(tool, request) pairs whose request is nothing but numbers, dates and "
                                        "addresses (recorded, teaching nothing).")
    unknown_tools: list[str] = Field(description="Ids naming no tool the caller may see (ignored), each once; the "
                                                 "first 20.")
    unknown_tool_mentions: int = Field(description="How many times the events named such ids (an id named by "
                                                   "three events counts three).")
    note: str | None = Field(description="What the counts leave out, in words (learning frozen), else null.")
    version: int


class ForgetResponse(BaseModel):
    source: str
    tools: int = Field(description="How many tools the source had taught (they rank as if it never posted).")
    version: int
    note: str | None = Field(description="Set when the source has no feedback stored: nothing changed.")


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
    available: bool | None = Field(None, description="Whether the server that runs the tool answers now (a "
                                                     "gateway only).")
    probability: float | None = Field(None, ge=0, le=1, description=(
        "The calibrated probability that the tool is one the task needs, comparable across tasks and catalogs "
        "(`score` orders the hits); left out when the pipeline has no calibration, and for a tool the ranking "
        "did not return (a name match or always-included tool outside it)."))


class DegradedOut(BaseModel):
    stage: str = Field(description="The stage that could not rank the task, e.g. \"LLM reranker\".")
    reason: str = Field(description=(
        "Why, in coarse words (e.g. \"the LLM answered HTTP 500\", \"the LLM did not answer in time\"); the "
        "error in full is in the server's log."))


class QueryResult(BaseModel):
    query: str
    abstained: bool
    truncated: bool = Field(description="True when the task was longer than search reads: it read the latest turns "
                                        "of a conversation, or the beginning of other text, without blobs.")
    hits: list[HitOut]
    degraded: DegradedOut | None = Field(None, description=(
        "Set when a stage of the pipeline could not rank this task: the index's LLM reranker failed on it, so "
        "the hits are the first stage's (its scores and probabilities, as without the reranker). Left out "
        "otherwise."))
    tools: list[dict[str, Any]] | None = Field(None, description="The hits as tool definitions (when 'format' asks).")
    tool_ids: dict[str, str] | None = Field(None, description=(
        "With 'tools': the name each definition carries → the id of its tool, the id to call it by "
        "(a gateway's POST /tools/{id}/call)."))
    argument_names: dict[str, dict[str, str]] | None = Field(None, description=(
        "With 'tools', for definitions whose property keys were renamed (Anthropic's rule): name → {key in the "
        "definition: the tool's own key}, at any depth of a call's arguments; only when there are any."))


class SearchResponse(BaseModel):
    results: list[QueryResult]
    version: int
    unknown_namespaces: list[str] | None = Field(
        None, description="The request's namespaces that hold no tool the caller may see (a typo?); only when "
                          "there are any.")
    unknown_ids: list[str] | None = Field(
        None, description="The request's ids and always_include that name no tool the caller may see (a typo?); "
                          "only when there are any.")
    excluded_ids: list[str] | None = Field(
        None, description="The request's ids and always_include that its exclude_ids names too, so that no answer "
                          "holds them; only when there are any.")
    not_searchable: list[dict[str, str]] | None = Field(
        None, description="A gateway's only: the servers whose tools the search could not find, each "
                          "{server, status: starting | down, reason}.")


class WriteResponse(BaseModel):
    version: int
    created: list[str]
    updated: list[str]
    unchanged: list[str]
    deleted: list[str]
    warnings: list[str] | None = Field(None, description=(
        "For a `catalog` posted: what reading it skipped (tools no one can call, such as an API's server-side "
        "tools) or warned of (a catalog with no tools, $refs to other files left as they are), one line each."))


class ErrorBody(BaseModel):
    type: str
    message: str
    details: list[dict[str, Any]] | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 413, 415, 422)}
FEEDBACK_ERRORS = {**ERRORS, 429: {"model": ErrorResponse}}
RETRAIN_ERRORS = {**ERRORS, 409: {"model": ErrorResponse}}  # too little feedback, or one already running
