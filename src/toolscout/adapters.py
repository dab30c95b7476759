"""Agent adapters: hand search results to Anthropic, OpenAI and LangChain agents, and read their tools in.

Client-side tool search (the agent framework asks, your code answers with toolscout):

- Anthropic Messages API: offer `AnthropicToolSearch.tool()` as a tool and every catalog tool with
  `defer_loading: true` (`deferred_tools()`); when Claude calls the search tool, reply with
  `answer(tool_use_block)`: a `tool_result` whose content is `tool_reference` blocks naming the tools
  to load (a text block when nothing fits: toolscout abstains rather than offer weak matches).
- OpenAI Responses API: offer `OpenAIToolSearch.tool()` (a `tool_search` tool with
  `execution: "client"`); when the model emits a `tool_search_call` item, append `answer(item)`: a
  `tool_search_output` item with the loaded function definitions (grouped into namespaces on request).

Definitions: `to_openai(...)` (Chat Completions or Responses function tools), `to_anthropic(...)`.
Both APIs want names matching `^[a-zA-Z0-9_-]{1,64}$` and unique in one request; `AgentNames` gives
each tool such a name (its own name when that is valid and no other tool in the catalog shares it,
else `namespace__name`, shortened with a hash when too long) and maps a name the model used back to
the tool, so a call can be routed to the right server. One instance keeps every name it gave out, so an
agent keeps one for its lifetime (without `names=`, `to_openai`/`to_anthropic` qualify every namespaced tool,
since one search's hits do not say which names the catalog shares). Anthropic also wants property keys matching
`^[a-zA-Z0-9_.-]{1,64}$`: `to_anthropic` renames the others (`filter[status]` → `filter_status_`, at any
depth), and `AgentNames.arguments(name, input)` (or a tool search's `arguments`) gives a call's input back
under the tool's own keys (where the schema declares them; free-form values keep their keys).

Reading tools in: `from_openai`, `from_anthropic` (any shape `toolscout.ingest` reads),
`from_langchain` (LangChain `BaseTool`-like objects, duck-typed: `name`, `description`,
`args_schema` / `tool_call_schema`); `select_langchain` turns hits back into the caller's objects.

The search backend is a `ToolScout` or a `serve.ToolService` (anything with
`search(query, k, namespaces=...)` returning hits); extra keyword options go to every search
(e.g. `principal=` for a service, `min_score=` for abstention).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from .errors import is_blank
from .tool import Tool

NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_INVALID = re.compile(r"[^a-zA-Z0-9_-]+")
MAX_NAME = 64
_NAME_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions"})  # keyword: {name: schema}

# Python / informal type names found in real catalogs (the benchmark data uses "str", "int", ...).
_TYPE_ALIASES = {"str": "string", "string": "string", "int": "integer", "integer": "integer", "float": "number",
                 "number": "number", "double": "number", "bool": "boolean", "boolean": "boolean", "list": "array",
                 "array": "array", "tuple": "array", "dict": "object", "object": "object", "null": "null",
                 "none": "null", "any": None}

SEARCH_DESCRIPTION = ("Search the tool catalog for the tools a task needs. Describe the task (or name a tool) in "
                      "plain language; the best matching tools are loaded so you can call them. Returns nothing "
                      "when no tool fits.")


# ------------------------------------------------------------------------------------ schemas

def json_schema(tool: Tool) -> dict[str, Any]:
    """The tool's parameters as a JSON schema the provider APIs accept: an object at the root, and
    informal type names (`str`, `int`, `dict`, ...) mapped to JSON-schema types."""
    schema = _clean_schema(tool.input_schema())
    if not isinstance(schema, dict) or schema.get("type") != "object":
        schema = {"type": "object", "properties": dict(schema.get("properties") or {}) if isinstance(schema, dict)
                  else {}}
    schema.setdefault("properties", {})
    return schema


def _clean_schema(node: Any) -> Any:
    if isinstance(node, list):
        return [_clean_schema(x) for x in node]
    if not isinstance(node, Mapping):
        return node
    out = {}
    for key, value in node.items():
        if key == "type" and isinstance(value, str):
            mapped = _TYPE_ALIASES.get(value.strip().lower(), value)
            if mapped is not None:
                out[key] = mapped
            continue
        if key == "type" and isinstance(value, list):
            out[key] = [_TYPE_ALIASES.get(v.strip().lower(), v) if isinstance(v, str) else v for v in value
                        if not (isinstance(v, str) and _TYPE_ALIASES.get(v.strip().lower(), v) is None)]
            continue
        if key in _NAME_MAPS and isinstance(value, Mapping):
            out[key] = {k: _clean_schema(v) for k, v in value.items()}
        else:
            out[key] = _clean_schema(value)
    return out


# Anthropic's rule for the keys of `input_schema` properties (OpenAI documents none).
PROPERTY_KEY_PATTERN = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")
_INVALID_IN_KEY = re.compile(r"[^a-zA-Z0-9_.-]")


def property_renames(schema: Any) -> dict[str, str]:
    """{property key as the tool has it: the key an Anthropic schema gives it} for each key, at any depth, that
    breaks `PROPERTY_KEY_PATTERN` (an OpenAPI parameter `filter[status]` → `filter_status_`). A new key is
    never a key the schema has anywhere (a short hash of the original is added when the plain form is taken),
    so a call's arguments map back by key alone (`AgentNames.arguments`)."""
    keys = set(_property_keys(schema))
    taken = {key for key in keys if PROPERTY_KEY_PATTERN.match(key)}
    renames: dict[str, str] = {}
    for key in sorted(keys - taken):
        new = _INVALID_IN_KEY.sub("_", key)[:MAX_NAME] or "_"
        if new in taken:
            new = f"{new[:MAX_NAME - 9]}_{hashlib.sha1(key.encode('utf-8')).hexdigest()[:8]}"
        renames[key] = new
        taken.add(new)
    return renames


def _property_keys(node: Any) -> Iterable[str]:
    if isinstance(node, list):
        for item in node:
            yield from _property_keys(item)
    elif isinstance(node, Mapping):
        for key, value in node.items():
            if key == "properties" and isinstance(value, Mapping):
                yield from (str(k) for k in value)
            if key in _NAME_MAPS and isinstance(value, Mapping):
                yield from _property_keys(list(value.values()))  # a map of names: its values are schemas
            else:
                yield from _property_keys(value)


def _with_keys_renamed(node: Any, renames: Mapping[str, str]) -> Any:
    """`node` (a schema) with the property keys in `renames` renamed, in `properties` and `required`."""
    if isinstance(node, list):
        return [_with_keys_renamed(item, renames) for item in node]
    if not isinstance(node, Mapping):
        return node
    out = {}
    for key, value in node.items():
        if key in _NAME_MAPS and isinstance(value, Mapping):
            rename = renames if key == "properties" else {}
            out[key] = {rename.get(k, k): _with_keys_renamed(v, renames) for k, v in value.items()}
        elif key == "required" and isinstance(value, list) and isinstance(node.get("properties"), Mapping):
            out[key] = [renames.get(v, v) if isinstance(v, str) else v for v in value]
        else:
            out[key] = _with_keys_renamed(value, renames)
    return out


def _keys_restored(value: Any, schema: Any, restore: Mapping[str, str], root: Mapping) -> Any:
    """`value` (a call's input, or part of it) with the keys the offered `schema` renamed given back
    (`restore`: {offered key: the tool's own key}), walking the value and its schema together: keys of
    free-form data (an explicit `additionalProperties` map of the user's own labels, or a `patternProperties`
    match) stay exactly as the model sent them; every other key is restored (declared as a property, or
    under a schema part the walk does not know, such as `not`)."""
    node = _schema_at(schema, root)
    if isinstance(value, list):
        prefix, rest = _item_schemas(node)
        return [_keys_restored(item, prefix[i] if i < len(prefix) else rest, restore, root)
                for i, item in enumerate(value)]
    if not isinstance(value, Mapping):
        return value
    declared = _declared_properties(node, root, set())
    out = {}
    for key, item in value.items():
        if key in declared:
            out[restore.get(key, key)] = _keys_restored(item, declared[key], restore, root)
            continue
        free_form = _free_form_schema(node, key)
        if free_form is not None:  # the user's own key, as the model sent it
            out[key] = _keys_restored(item, free_form, restore, root)
        else:  # a schema part the walk does not know may declare it: give the tool its own key
            out[restore.get(key, key)] = _keys_restored(item, {}, restore, root)
    return out


def _item_schemas(node: Mapping) -> tuple[list, Any]:
    """(the schemas of an array's first items, the schema of the rest): `prefixItems` and `items`, or
    draft-04's tuple form, `items: [...]` and `additionalItems`."""
    items = node.get("items", {})
    if isinstance(items, list):
        return items, node.get("additionalItems", {})
    prefix = node.get("prefixItems")
    return (prefix if isinstance(prefix, list) else []), items


def _schema_at(schema: Any, root: Mapping) -> Mapping:
    """`schema` as a mapping, a local `$ref` (`#/$defs/X`, `#/definitions/X`) followed; {} for anything else."""
    for _ in range(32):  # a chain of references, not a cycle
        if not isinstance(schema, Mapping):
            return {}
        ref = schema.get("$ref")
        if not (isinstance(ref, str) and ref.startswith("#/")):
            return schema
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, Mapping) else None
        schema = target
    return {}


def _declared_properties(node: Mapping, root: Mapping, seen: set[int]) -> dict[str, Any]:
    """{property key: its schema} that `node` declares, itself or through its branches (`_branches`)."""
    if id(node) in seen:
        return {}
    seen.add(id(node))
    own = node.get("properties")
    declared = dict(own) if isinstance(own, Mapping) else {}
    for branch in _branches(node):
        declared.update(_declared_properties(_schema_at(branch, root), root, seen))
    return declared


def _branches(node: Mapping) -> list:
    """The subschemas whose properties an object of `node` may have: allOf/anyOf/oneOf, if/then/else and
    dependentSchemas (`not` declares none the object may have)."""
    branches = [b for combinator in ("allOf", "anyOf", "oneOf")
                for b in (node.get(combinator) if isinstance(node.get(combinator), list) else ())]
    branches += [node[part] for part in ("if", "then", "else") if part in node]
    dependent = node.get("dependentSchemas")
    return branches + (list(dependent.values()) if isinstance(dependent, Mapping) else [])


def _free_form_schema(node: Mapping, key: str) -> Any:
    """The schema `node` explicitly gives a key it does not declare, its `patternProperties` match, else its
    `additionalProperties` (a schema, or true); None when it gives none."""
    patterns = node.get("patternProperties")
    for pattern, schema in (patterns.items() if isinstance(patterns, Mapping) else ()):
        try:
            if re.search(pattern, key):
                return schema
        except re.error:
            continue
    extra = node.get("additionalProperties")
    return extra if isinstance(extra, Mapping) or extra is True else None


# -------------------------------------------------------------------------------------- names

class AgentNames:
    """Agent-facing names for catalog tools, and the way back from a name to the tool.

    `shared(name)` says whether more than one catalog tool has that name (a `ToolService` has
    `name_is_shared`; for a plain list of tools it is counted here).
    """

    def __init__(self, shared: Callable[[str], bool] | Iterable[Tool] | None = None, *, mark_squashed: bool = False):
        self._mark_squashed = mark_squashed  # a name squashed to the pattern carries its tool id's hash
        if shared is None:
            shared = ()
        if not callable(shared):
            counts = Counter(t.name for t in shared)
            shared = lambda name, counts=counts: counts.get(name, 0) > 1  # noqa: E731
        self._shared = shared
        self._tools: dict[str, Tool] = {}
        self._argument_names: dict[str, dict[str, str]] = {}  # name -> {key given out: the tool's own key}
        self._offered_schemas: dict[str, Mapping] = {}  # name -> the schema given out, where keys were renamed

    @classmethod
    def context_free(cls) -> "AgentNames":
        """Names that depend on the tool alone: every tool with a namespace is `namespace__name`. What
        `to_openai`/`to_anthropic` use without `names=`: they see one search's hits, not the catalog, and
        naming by those hits gave `gh.list_issues` and `gl.list_issues` the same name in two searches. A name
        that had to be squashed to the pattern carries a short hash of its tool's id (`files.read` and
        `files_read` of two tools with no namespace would squash alike in two calls)."""
        return cls(lambda name: True, mark_squashed=True)

    def name(self, tool: Tool) -> str:
        qualify = bool(tool.namespace) and self._shared(tool.name)
        base = f"{agent_namespace(tool.namespace)}__{tool.name}" if qualify else tool.name
        name = _INVALID.sub("_", base).strip("_") or "tool"
        if len(name) > MAX_NAME or (self._mark_squashed and name != base):
            digest = hashlib.sha1(tool.id.encode("utf-8")).hexdigest()[:8]
            name = f"{name[:MAX_NAME - 9]}_{digest}"
        known = self._tools.get(name)
        if known is not None and known.id != tool.id:  # two tools squashed to one name: tell them apart
            digest = hashlib.sha1(tool.id.encode("utf-8")).hexdigest()[:8]
            name = f"{name[:MAX_NAME - 9]}_{digest}"
        self._tools[name] = tool
        return name

    def tool(self, name: str) -> Tool:
        """The tool an agent-facing name (one given out by `name`) stands for."""
        try:
            return self._tools[name]
        except KeyError:
            raise KeyError(f"no tool was offered to the agent under the name {name!r}") from None

    def renamed_arguments(self, name: str, renames: Mapping[str, str], offered_schema: Mapping) -> None:
        """Note that the schema offered under `name`, `offered_schema`, has the property keys of `renames`
        renamed (`arguments` gives them back where that schema declares them)."""
        if renames:
            self._argument_names[name] = {new: key for key, new in renames.items()}
            self._offered_schemas[name] = offered_schema
        else:
            self._argument_names.pop(name, None)
            self._offered_schemas.pop(name, None)

    def argument_names(self, name: str) -> dict[str, str]:
        """{key the agent was given: the tool's own key} for the tool offered under `name` ({}: none renamed)."""
        return dict(self._argument_names.get(name, {}))

    def arguments(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """A call's arguments, as the model sent them to the tool offered under `name`, with the tool's own
        property keys (`filter_status_` → `filter[status]`) wherever the offered schema declares a renamed
        property, at any depth; keys of free-form values (`additionalProperties`) are the user's data and are
        kept as sent. What to call the tool with."""
        self.tool(name)  # an unknown name is an error, not a call with the arguments as they are
        if name not in self._argument_names:
            return dict(arguments)
        schema = self._offered_schemas[name]
        return _keys_restored(dict(arguments), schema, self._argument_names[name], schema)


def agent_namespace(namespace: str) -> str:
    """A namespace as an agent-facing name (`^[a-zA-Z0-9_-]{1,64}$`): itself when valid, else its valid
    characters with a short hash of the whole added, so that two namespaces that differ only in what is
    dropped stay apart ('株価-api' → 'api_' + 8 hex digits, '為替-api' another)."""
    if NAME_PATTERN.match(namespace):
        return namespace
    kept = _INVALID.sub("_", namespace).strip("_-")[:MAX_NAME - 9] or "ns"
    return f"{kept}_{hashlib.sha1(namespace.encode('utf-8')).hexdigest()[:8]}"


def _tools_of(items: Iterable[Any]) -> list[Tool]:
    """Tools from a mix of Tool and Hit objects (anything with `.tool`)."""
    return [item if isinstance(item, Tool) else item.tool for item in items]


# ------------------------------------------------------------------------------ definitions out

def to_openai(items: Iterable[Any], *, style: str = "chat", names: AgentNames | None = None,
              defer_loading: bool = False) -> list[dict[str, Any]]:
    """OpenAI function tools for tools or hits. `style`: "chat" (Chat Completions,
    `{"type": "function", "function": {...}}`) or "responses" (flat, `strict: false` because catalog
    schemas are not written for strict mode). `names`: pass one `AgentNames(scout.tools)` for an agent's
    lifetime to get short names (a tool's own name where no other catalog tool shares it) that stay the same
    across searches and name back (`names.tool`); without it every namespaced tool is `namespace__name`
    (`AgentNames.context_free`), so names never clash across calls."""
    if style not in ("chat", "responses"):
        raise ValueError(f"style must be 'chat' or 'responses', got {style!r}")
    tools = _tools_of(items)
    names = names or AgentNames.context_free()
    out = []
    for tool in tools:
        fn = {"name": names.name(tool), "description": tool.description or tool.title or tool.name,
              "parameters": json_schema(tool)}
        if style == "chat":
            out.append({"type": "function", "function": fn})
        else:
            out.append({"type": "function", **fn, "strict": False, **({"defer_loading": True} if defer_loading else {})})
    return out


def to_anthropic(items: Iterable[Any], *, names: AgentNames | None = None,
                 defer_loading: bool = False) -> list[dict[str, Any]]:
    """Anthropic Messages API tool definitions for tools or hits. `names`: as for `to_openai`."""
    tools = _tools_of(items)
    names = names or AgentNames.context_free()
    out = []
    for tool in tools:
        name, schema = names.name(tool), json_schema(tool)
        renames = property_renames(schema)  # Anthropic refuses keys like `filter[status]`: named back by `names`
        offered = _with_keys_renamed(schema, renames) if renames else schema
        names.renamed_arguments(name, renames, offered)
        spec = {"name": name, "description": tool.description or tool.title or tool.name, "input_schema": offered}
        if defer_loading:
            spec["defer_loading"] = True
        out.append(spec)
    return out


# ------------------------------------------------------------------------------- tool search

def _get(obj: Any, key: str, default: Any = None) -> Any:
    """A field of an API object given as a dict or as an SDK object."""
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


@runtime_checkable
class KnowsSharedNames(Protocol):
    """A search backend that can say whether more than one of its tools has a name (a `ToolService`:
    within what the caller may see); any other backend's names are counted over its `tools`."""

    def name_is_shared(self, name: str) -> bool: ...


class _ToolSearch:
    def __init__(self, backend: Any, *, k: int = 5, max_k: int = 20, namespaces: Iterable[str] | None = None,
                 names: AgentNames | None = None, **search_options: Any):
        self.backend = backend
        self.k = k
        self.max_k = max_k
        self.namespaces = None if namespaces is None else list(namespaces)
        self.search_options = search_options
        shared = backend.name_is_shared if isinstance(backend, KnowsSharedNames) else backend.tools
        self.names = names or AgentNames(shared)

    def _parameters(self) -> dict[str, Any]:
        return {"type": "object", "properties": {
            "query": {"type": "string", "description": "The task, or the name of a tool, in plain language."},
            "limit": {"type": "integer", "minimum": 1, "maximum": self.max_k,
                      "description": f"How many tools to load (default {self.k})."}},
            "required": ["query"]}

    def search(self, query: str, limit: Any = None) -> list[Any]:
        """Hits for one search request from the model (empty when nothing fits)."""
        if not isinstance(query, str) or is_blank(query):
            return []
        try:
            k = max(1, min(int(limit), self.max_k)) if limit is not None else self.k
        except (TypeError, ValueError):
            k = self.k
        return self.backend.search(query, k, namespaces=self.namespaces, **self.search_options)

    def resolve(self, name: str) -> Tool:
        """The catalog tool behind a name the model called (as offered by this adapter)."""
        return self.names.tool(name)

    def arguments(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The arguments of the model's call of `name`, under the tool's own property keys (Anthropic
        definitions rename keys such as `filter[status]`: `AgentNames.arguments`)."""
        return self.names.arguments(name, arguments)

    def _catalog(self) -> list[Tool]:
        tools = self.backend.tools
        if self.namespaces is not None:
            allowed = set(self.namespaces)
            tools = [t for t in tools if (t.namespace or "") in allowed]
        principal = self.search_options.get("principal")
        if principal is not None:
            tools = [t for t in tools if principal.sees(t)]
        return tools


class AnthropicToolSearch(_ToolSearch):
    """Client-side tool search for the Anthropic Messages API (see the module doc)."""

    def __init__(self, backend: Any, *, name: str = "tool_search", description: str = SEARCH_DESCRIPTION,
                 **options: Any):
        super().__init__(backend, **options)
        if not NAME_PATTERN.match(name):
            raise ValueError(f"tool name {name!r} must match {NAME_PATTERN.pattern}")
        self.name = name
        self.description = description

    def tool(self) -> dict[str, Any]:
        """The search tool to put in the request's `tools` (not deferred)."""
        return {"name": self.name, "description": self.description, "input_schema": self._parameters()}

    def deferred_tools(self, tools: Iterable[Any] | None = None) -> list[dict[str, Any]]:
        """Definitions (`defer_loading: true`) of every tool the search may return: a `tool_reference`
        only works for a tool present in the request."""
        return to_anthropic(self._catalog() if tools is None else tools, names=self.names, defer_loading=True)

    def is_call(self, block: Any) -> bool:
        return _get(block, "type") == "tool_use" and _get(block, "name") == self.name

    def answer(self, block: Any) -> dict[str, Any]:
        """The `tool_result` block answering a `tool_use` of the search tool."""
        if not self.is_call(block):
            raise ValueError(f"not a tool_use block of {self.name!r}")
        arguments = _get(block, "input") or {}
        hits = self.search(_get(arguments, "query"), _get(arguments, "limit"))
        if hits:
            content = [{"type": "tool_reference", "tool_name": self.names.name(h.tool)} for h in hits]
        else:
            content = [{"type": "text", "text": "No tool in the catalog fits this request."}]
        return {"type": "tool_result", "tool_use_id": _get(block, "id"), "content": content}


class OpenAIToolSearch(_ToolSearch):
    """Client-executed tool search for the OpenAI Responses API (see the module doc).

    `answer` reads the search text from `query` (or `goal` / `task`) in the call's arguments; a call
    in the default schema, `{"paths": [names]}`, loads the tools with those names.
    `group_namespaces=True` returns `{"type": "namespace", ...}` groups, one per tool namespace.
    """

    def __init__(self, backend: Any, *, description: str = SEARCH_DESCRIPTION, group_namespaces: bool = False,
                 **options: Any):
        super().__init__(backend, **options)
        self.description = description
        self.group_namespaces = group_namespaces

    def tool(self) -> dict[str, Any]:
        return {"type": "tool_search", "execution": "client", "description": self.description,
                "parameters": self._parameters()}

    def is_call(self, item: Any) -> bool:
        return _get(item, "type") == "tool_search_call" and _get(item, "execution", "client") == "client"

    def answer(self, item: Any) -> dict[str, Any]:
        """The `tool_search_output` input item answering a `tool_search_call` output item."""
        if not self.is_call(item):
            raise ValueError("not a client-executed tool_search_call item")
        arguments = _get(item, "arguments") or {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                arguments = {"query": arguments}
        query = next((arguments.get(key) for key in ("query", "goal", "task") if arguments.get(key)), None)
        if query is None and isinstance(arguments.get("paths"), list):
            tools = [self._by_name(p) for p in arguments["paths"]]
            tools = [t for t in tools if t is not None]
        else:
            tools = [h.tool for h in self.search(query, arguments.get("limit"))]
        return {"type": "tool_search_output", "call_id": _get(item, "call_id"), "execution": "client",
                "status": "completed", "tools": self._definitions(tools)}

    def _by_name(self, path: Any) -> Tool | None:
        if not isinstance(path, str) or not path.strip():
            return None
        try:
            return self.names.tool(path)
        except KeyError:  # not offered yet: a name (or namespace.name) the catalog knows
            hits = self.backend.search(path, 1, namespaces=self.namespaces, **self.search_options)
            return next((h.tool for h in hits if h.match == "name"), None)

    def _definitions(self, tools: Sequence[Tool]) -> list[dict[str, Any]]:
        functions = to_openai(tools, style="responses", names=self.names)
        if not self.group_namespaces:
            return functions
        groups: dict[str, list[dict[str, Any]]] = {}
        loose = []
        for tool, fn in zip(tools, functions):
            if tool.namespace:
                groups.setdefault(tool.namespace, []).append(fn)
            else:
                loose.append(fn)
        out = [{"type": "namespace", "name": agent_namespace(ns), "description": f"Tools of {ns}.",
                "tools": fns} for ns, fns in groups.items()]
        return out + loose


# ---------------------------------------------------------------------------------- tools in

def from_openai(definitions: Any, namespace: str | None = None) -> list[Tool]:
    """Tools from OpenAI function definitions (Chat Completions, Responses or legacy `functions`)."""
    from .ingest import parse_tools

    return parse_tools(definitions, format="openai", namespace=namespace, source="<openai tools>")


def from_anthropic(definitions: Any, namespace: str | None = None) -> list[Tool]:
    """Tools from Anthropic tool definitions (`name`, `description`, `input_schema`)."""
    from .ingest import parse_tools

    return parse_tools(definitions, format="anthropic", namespace=namespace, source="<anthropic tools>")


def from_langchain(tools: Iterable[Any], namespace: str | None = None) -> list[Tool]:
    """Tools from LangChain tools (`BaseTool` and friends), read by duck typing; `raw` keeps the object."""
    out = []
    for i, lc_tool in enumerate(tools):
        name = getattr(lc_tool, "name", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"LangChain tool #{i} ({type(lc_tool).__name__}) has no name")
        out.append(Tool(id=f"{namespace}.{name}" if namespace else name, name=name,
                        description=str(getattr(lc_tool, "description", "") or ""),
                        parameters=_langchain_schema(lc_tool), namespace=namespace, raw=lc_tool))
    ids = Counter(t.id for t in out)
    duplicated = [i for i, n in ids.items() if n > 1]
    if duplicated:
        raise ValueError(f"LangChain tools with the same name {duplicated[:3]}; give each set its own namespace")
    return out


def _langchain_schema(lc_tool: Any) -> dict[str, Any] | None:
    for attr in ("tool_call_schema", "args_schema"):
        schema = getattr(lc_tool, attr, None)
        if schema is None:
            continue
        if isinstance(schema, Mapping):
            return dict(schema)
        for method in ("model_json_schema", "schema"):  # pydantic v2, then v1
            fn = getattr(schema, method, None)
            if callable(fn):
                data = fn()
                data.pop("title", None)
                return data
    args = getattr(lc_tool, "args", None)
    if isinstance(args, Mapping):
        return {"type": "object", "properties": dict(args)}
    return None


def select_langchain(hits: Iterable[Any], tools: Iterable[Any]) -> list[Any]:
    """The caller's LangChain tool objects for `hits`, in hit order (hits whose tool is not among
    `tools` are skipped). Matches by name, or by `namespace.name` ids from `from_langchain`."""
    by_name = {getattr(t, "name", None): t for t in tools}
    out = []
    for hit in hits:
        tool = hit.tool if hasattr(hit, "tool") else hit
        lc_tool = by_name.get(tool.name)
        if lc_tool is not None and lc_tool not in out:
            out.append(lc_tool)
    return out
