"""The one tool record, and the text views every retriever reads.

`Tool` is what every parser produces and every retriever, reranker and server consumes. The original
source object stays in `raw`; everything else is normalised so that a tool from an OpenAPI spec, an MCP
server or a Python function looks the same to the rest of the code.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
import reprlib
from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable, Mapping, Sequence

from .errors import SURROGATE_HINT, SURROGATE_PROBLEM, InvalidRequest, listed, lone_surrogate_at

# Profile fields written by document expansion (Tool-REX). `example_usage` is kept on the tool but left
# out of the retrieval text by default: the paper's ablation found it hurts retrieval.
PROFILE_FIELDS = ("function", "tags", "when_to_use", "limitations", "example_usage")
DEFAULT_PROFILE_FIELDS = ("function", "tags", "when_to_use", "limitations")
# What a tool's parameters schema may say its type is: 'dict' is how BFCL's function definitions spell it.
OBJECT_TYPES = ("object", "dict")


@dataclass(frozen=True)
class Tool:
    """A tool an agent can call.

    `id` is unique within a catalog; `title` is an optional human-readable name (MCP). `name` is what the agent calls; when the same name exists in two
    namespaces the parsers qualify the id as `namespace.name`. `parameters` and `returns` are JSON
    schemas (or None). `method`/`path` are set for HTTP operations. `profile` holds an LLM-written
    expansion (see `toolscout.expand`). `usage` holds example user requests known to need the tool
    (training queries or logs); views can append them. `raw` is the object the tool was parsed from.
    """

    id: str
    name: str
    description: str = ""
    parameters: Mapping[str, Any] | None = None
    returns: Mapping[str, Any] | None = None
    namespace: str | None = None
    tags: tuple[str, ...] = ()
    category: str | None = None
    title: str | None = None
    method: str | None = None
    path: str | None = None
    examples: tuple[str, ...] = ()
    limitations: str | None = None
    profile: Mapping[str, Any] | None = None
    usage: tuple[str, ...] = ()
    raw: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:  # a blank one is refused where tools are written
            raise InvalidRequest(f"tool id must be a non-empty string, got {self.id!r}")
        if not isinstance(self.name, str) or not self.name:
            raise InvalidRequest(f"tool {self.id!r}: name must be a non-empty string, got {self.name!r}")
        # every field a retriever reads is checked here, so a bad tool fails before any index takes it
        for names, kinds, what in ((("description",), str, "a string"),
                                   (("namespace", "category", "title", "method", "path", "limitations"),
                                    (str, type(None)), "a string"),
                                   (("parameters", "returns", "profile"), (Mapping, type(None)), "an object")):
            for name in names:
                value = getattr(self, name)
                if not isinstance(value, kinds):
                    raise InvalidRequest(f"tool {self.id!r}: {name} must be {what}, got {type(value).__name__}")
        # Accept lists from callers; store tuples so the record stays immutable.
        for name in ("tags", "examples", "usage"):
            value = getattr(self, name)
            if not isinstance(value, (tuple, list, type(None))):
                raise InvalidRequest(f"tool {self.id!r}: {name} must be a list of strings, got {type(value).__name__}")
            value = tuple(value or ())
            if not all(isinstance(item, str) for item in value):
                raise InvalidRequest(f"tool {self.id!r}: {name} must be a list of strings")
            object.__setattr__(self, name, value)
        problem = parameters_problem(self.parameters)
        if problem:
            field_at, why = problem
            raise InvalidRequest(f"tool {self.id!r}: parameters{'.' if field_at else ''}{field_at} {why}")
        # the text rule of catalog files (`ingest/guard.py`): no writer stores these; all fields read at once
        where = lone_surrogate_at({name: getattr(self, name) for name in TOOL_FIELDS}, "")
        if where is not None:
            raise InvalidRequest(f"tool {self.id!r}: {where}: {SURROGATE_PROBLEM}; {SURROGATE_HINT}")

    @classmethod
    def from_record(cls, data: Mapping[str, Any]) -> "Tool":
        """A tool as an index directory, its journal or the database stored it. Parameters stored before
        `parameters_problem` was every route's rule load as they were: refusing them would lose the tool."""
        try:
            return cls.from_dict(data)
        except InvalidRequest:
            if not isinstance(data.get("parameters"), Mapping) or not parameters_problem(data["parameters"]):
                raise
        return cls.from_dict({**data, "parameters": None}).keeping_parameters(data["parameters"])

    def keeping_parameters(self, parameters: Mapping[str, Any]) -> "Tool":
        """This tool with `parameters` as written, even where `parameters_problem` refuses them: what was
        stored before the rule, or what a live server the gateway proxies says it takes (the server accepts
        its own schema; refusing it would hide a tool that works)."""
        tool = replace(self, parameters=None)
        object.__setattr__(tool, "parameters", parameters)
        return tool

    def with_changes(self, **changes: Any) -> "Tool":
        return replace(self, **changes)

    def same_as(self, other: "Tool | None") -> bool:
        """Equal in every field, `raw` included: writing `other` over `self` would change nothing."""
        return other is not None and self == other and self.raw == other.raw

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; `from_dict(to_dict(t)) == t`."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = list(value)
            if value is None or value == [] or (f.name == "description" and value == ""):
                continue
            out[f.name] = value
        return out

    def to_record(self) -> dict[str, Any]:
        """`to_dict` made storable as JSON: a `raw` that is not plain JSON (a Python callable) becomes its repr.
        What index directories, the journal and the PostgreSQL store keep of a tool."""
        row = self.to_dict()
        if "raw" in row:
            try:
                json.dumps(row["raw"])
            except (TypeError, ValueError):
                row["raw"] = repr(row["raw"])
        return row

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Tool":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise InvalidRequest(f"unknown Tool field(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}" if self.namespace else self.name

    def input_schema(self) -> dict[str, Any]:
        """The parameters as a JSON schema an agent can be handed (an empty object schema if none)."""
        if self.parameters:
            return dict(self.parameters)
        return {"type": "object", "properties": {}}


TOOL_FIELDS = tuple(f.name for f in fields(Tool))


def parameters_problem(schema: Any) -> tuple[str, str] | None:
    """Why `schema` cannot be a tool's parameters, as (the field at fault under `parameters`, "" for itself;
    the problem), or None when it can. The one rule of every route a tool comes in by (catalog files, the
    HTTP API, `Tool` itself): arguments travel as one JSON object, so the schema describes an object, its
    `properties` map each argument to a schema (an object, or true/false) and `required` lists names.
    Everything else JSON Schema allows ($defs, additionalProperties, allOf, ...) is the schema's own."""
    if schema is None:
        return None
    if not isinstance(schema, Mapping):
        return "", f"must be a JSON schema object, got {json_type(schema)}"
    declared = schema.get("type")  # absent or null: unsaid; a list of types must allow an object
    allowed = declared if isinstance(declared, list) else [declared]
    if declared is not None and not any(isinstance(t, str) and t in OBJECT_TYPES for t in allowed):
        return "type", f"must be 'object' (tool arguments are one JSON object), got {reprlib.repr(declared)}"
    properties = schema.get("properties")
    if properties is None:  # absent, or null: what a Go server writes for an empty map
        properties = {}
    if not isinstance(properties, Mapping):
        what = json_type(properties)
        return "properties", f"must be an object mapping each argument's name to its schema, got {what}"
    for name, value in properties.items():
        if not isinstance(value, (Mapping, bool)):
            return f"properties.{name}", f"must be a JSON schema (an object, or true/false), got {json_type(value)}"
    required = schema.get("required")
    if required is not None and not isinstance(required, (list, tuple)):
        return "required", f"must be a list of argument names (strings), got {json_type(required)}"
    if not all(isinstance(r, str) for r in required or ()):
        return "required", "must be a list of argument names (strings), got array holding other values"
    return None


def json_type(value: Any) -> str:
    """The JSON name of `value`'s type, for messages about a file or request that holds it."""
    return {dict: "object", list: "array", tuple: "array", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


# --------------------------------------------------------------------------------------------- views

# How a view reads a tool's description (`TextView.descriptions`):
#   "plain"       markup reduced to its words and cut at DESCRIPTION_CHARS: an OpenAPI operation's KB of
#                 markdown would otherwise fill an encoder's window and push the name and parameters out;
#   "lead"        the plain description, or its first sentence where it is longer than LEAD_CHARS (the dense
#                 summary of a "plain" view);
#   "as-written"  whole and as written (views saved before descriptions were read as plain text).
DESCRIPTION_FORMS = ("plain", "lead", "as-written")
# the fields every saved view had before `descriptions` existed (a whole view without it reads as written)
SAVED_BEFORE_DESCRIPTIONS = frozenset({"name", "raw_name", "description", "parameters", "tags", "category",
                                       "profile_fields", "usage", "max_chars"})
DESCRIPTION_CHARS = 600  # chosen on long OpenAPI descriptions and the dev sets' train queries (README: text view)
LEAD_CHARS = 300

_MARKDOWN_LINK = re.compile(r"!?\[([^\[\]]*)\]\((?:[^()\s]|\([^()\s]*\))*\)")
_HTML_LINK = re.compile(r"<a\s[^<>]*>([^<]*)</a>", re.I)
_HTML_BREAK = re.compile(r"</p>\s*<p>|<br\s*/?>", re.I)
# a tag only as HTML writes one (attributes with values), so "<b and c>" or "n<p or p>n" in prose stay
_HTML_ATTRIBUTES = r"(?:\s+[\w:-]+\s*=\s*(?:\"[^\"]*\"|'[^']*'|[^\s\"'<>]+))*"
_HTML_TAG = re.compile(r"</?(?:p|a|code|br|ul|ol|li|strong|em|b|i|pre|span|div|details|summary|table|thead|tbody|tr"
                       r"|td|th|h[1-6]|blockquote|sup|sub|img|hr)" + _HTML_ATTRIBUTES + r"\s*/?>", re.I)
# an entity as written with its semicolon: `html.unescape` alone also reads "&copy" and "&reg" in a query
# string ("?limit=10&region=eu" lost its "region")
_ENTITY = re.compile(r"&(?:#\d+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);")
_URL_IN_PARENS = re.compile(r"\(\s*<?https?://[^\s<>()]*>?\s*\)")
_AUTOLINK = re.compile(r"<https?://[^\s<>]*>")
_URL = re.compile(r"https?://[^\s<>()\[\]]*[^\s<>()\[\].,;:!?'\"]")  # a sentence's full stop is not the URL's
_SPACE_BEFORE_STOP = re.compile(r"[ \t]+([.,;:!?])(?=\s|$)")
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+(?=[A-Z0-9\"'`(\[*])")
# words ending in a full stop that rarely end a sentence ("et al." and "etc." often do, so they are not here)
_ABBREVIATIONS = frozenset({"e.g.", "i.e.", "vs.", "approx.", "cf.", "Dr.", "Mr.", "Ms.", "Mrs.", "St.", "No.", "vol.",
                            "Inc.", "Ltd.", "Fig.", "Sec.", "Eq."})
_INITIALS = re.compile(r"(?:[A-Za-z]\.)+")  # "U.K.", "J."


def plain_text(text: str) -> str:
    """`text` with markup reduced to its words: a markdown or HTML link to its text, a URL dropped, common
    HTML tags removed (inside code spans too) and entities decoded; markdown emphasis, lists and code spans
    are left as written."""
    if "http" not in text and "](" not in text and "<" not in text and "&" not in text:
        return text
    text = _HTML_BREAK.sub("\n", _HTML_LINK.sub(r"\1", text))
    text = _ENTITY.sub(lambda entity: html.unescape(entity[0]), _HTML_TAG.sub("", text))
    text = _URL.sub("", _AUTOLINK.sub("", _URL_IN_PARENS.sub("", _MARKDOWN_LINK.sub(r"\1", text))))
    return re.sub(r"[ \t]{2,}", " ", _SPACE_BEFORE_STOP.sub(r"\1", text))


def cut_at_word(text: str, chars: int) -> str:
    """`text` cut to at most `chars` characters, at a word boundary where one is in the second half."""
    if len(text) <= chars:
        return text
    cut = text[:chars]
    space = cut.rfind(" ")
    return (cut[:space] if space > chars // 2 else cut).rstrip(" ,;:")


def lead_sentence(text: str, chars: int = LEAD_CHARS) -> str:
    """The first sentence of `text`'s first paragraph, at most `chars` characters."""
    paragraph = re.split(r"\n\s*\n", text.strip(), maxsplit=1)[0].strip()
    for end in _SENTENCE_END.finditer(paragraph):
        last_word = paragraph[:end.start()].rsplit(None, 1)[-1].rstrip("\"')]")
        if last_word not in _ABBREVIATIONS and not _INITIALS.fullmatch(last_word):
            return cut_at_word(paragraph[:end.start()], chars)
    return cut_at_word(paragraph, chars)


def description_text(description: str, form: str) -> str:
    """`description` as a view of form `form` (`DESCRIPTION_FORMS`) reads it."""
    if form == "as-written":
        return description
    plain = plain_text(description)
    if form == "lead":
        return plain if len(plain) <= LEAD_CHARS else lead_sentence(plain)
    return cut_at_word(plain, DESCRIPTION_CHARS)


_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NAME_SEPARATORS = re.compile(r"[_\-./:\s]+")


def split_identifier(name: str) -> str:
    """`getWeatherForecast` / `get_weather.forecast` / `v1/get-weather` → words separated by spaces."""
    parts = _NAME_SEPARATORS.split(name)
    words = []
    for part in parts:
        words.extend(w for w in _CAMEL_BOUNDARY.split(part) if w)
    return " ".join(words)


@dataclass(frozen=True)
class TextView:
    """Which parts of a tool go into the text that retrievers index.

    One view is used for both BM25 and dense retrieval so the two see the same document. The default
    is name + description + parameter names and descriptions, plus the retrieval-relevant profile
    fields when a tool has been expanded.
    """

    name: bool = True
    raw_name: bool = False  # also keep the identifier as written (`get_weather`), not only its words
    description: bool = True
    parameters: bool = True
    tags: bool = True
    category: bool = False
    profile_fields: tuple[str, ...] = DEFAULT_PROFILE_FIELDS
    usage: int = 0  # append up to this many known usage queries (document-side Tool2Vec)
    max_chars: int = 4000
    descriptions: str = "plain"  # how the description is read: one of DESCRIPTION_FORMS

    def __post_init__(self) -> None:
        if self.descriptions not in DESCRIPTION_FORMS:
            raise ValueError(f"text view: descriptions must be one of {', '.join(DESCRIPTION_FORMS)}, "
                             f"not {self.descriptions!r}")

    def to_dict(self) -> dict[str, Any]:
        """The view as saved. A view reading descriptions as written is saved as views were before the
        field existed (without it): a view saved then is saved unchanged (a PostgreSQL table's configuration,
        which older replicas read too, and the pipeline it is compared with)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["profile_fields"] = list(self.profile_fields)
        if self.descriptions == "as-written":
            del data["descriptions"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "TextView":
        if not data:
            return cls()
        data = dict(data)
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"text view: unknown setting(s) {unknown}; known: {sorted(f.name for f in fields(cls))} "
                             "(a view saved by a newer toolscout needs that version)")
        if "descriptions" not in data and set(data) >= SAVED_BEFORE_DESCRIPTIONS:
            # a view saved whole before descriptions were read as plain text (a partial one is written by
            # hand, and its other fields are today's defaults)
            data["descriptions"] = "as-written"
        if "profile_fields" in data:
            data["profile_fields"] = tuple(data["profile_fields"])
        return cls(**data)


def parameter_lines(schema: Mapping[str, Any] | None) -> list[str]:
    if not isinstance(schema, Mapping):
        return []
    props = schema.get("properties")
    if not isinstance(props, Mapping):
        return []
    lines = []
    for pname, spec in props.items():
        desc = spec.get("description", "") if isinstance(spec, Mapping) else ""
        words = split_identifier(str(pname))
        lines.append(f"{words}: {desc}".strip().rstrip(":") if desc else words)
    return lines


def tool_text(tool: Tool, view: TextView | None = None) -> str:
    """The text a retriever indexes for `tool` under `view`."""
    view = view or TextView()
    parts: list[str] = []
    if view.name:
        words = split_identifier(tool.name)
        if view.raw_name and words != tool.name:
            words = f"{tool.name} ({words})"
        if tool.title and tool.title.lower() != words.lower():
            words = f"{tool.title} ({words})"
        parts.append(words)
    if view.description and tool.description:
        parts.append(description_text(tool.description, view.descriptions))
    if view.category and tool.category:
        parts.append(f"Category: {tool.category}")
    if view.tags and tool.tags:
        parts.append("Tags: " + ", ".join(tool.tags))
    if view.parameters:
        params = parameter_lines(tool.parameters)
        if params:
            parts.append("Parameters: " + "; ".join(params))
    if tool.profile:
        parts.extend(_profile_parts(tool.profile, view.profile_fields))
    if view.usage and tool.usage:
        parts.append("Example requests: " + " | ".join(tool.usage[: view.usage]))
    return "\n".join(parts)[: view.max_chars]


def _profile_parts(profile: Mapping[str, Any], wanted: Sequence[str]) -> list[str]:
    out = []
    for key in wanted:
        value = profile.get(key)
        if not value:
            continue
        if isinstance(value, (list, tuple)):
            value = ", ".join(str(v) for v in value)
        out.append(f"{key.replace('_', ' ').capitalize()}: {value}")
    return out


def content_hash(text: str) -> str:
    """A short stable hash of an indexed text: equal hashes mean the stored vector is still valid."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def tools_by_id(tools: Iterable[Tool], what: str = "one batch") -> dict[str, Tool]:
    """The tools of one catalog or write, keyed by id: Tool objects only, no id twice."""
    out: dict[str, Tool] = {}
    for tool in listed(tools, "tools"):
        if not isinstance(tool, Tool):
            raise TypeError(f"expected Tool objects, got {type(tool).__name__}; use toolscout.load_tools to "
                            "parse catalogs")
        if tool.id in out:
            raise InvalidRequest(f"duplicate tool id {tool.id!r} in {what}")
        out[tool.id] = tool
    return out
