"""OpenAPI 3.x and Swagger 2.0 specs: one tool per operation.

- name: `operationId` (a number's text: YAML reads `operationId: 12345` as a number), else `METHOD /path`
  (e.g. `GET /pets/{petId}`); an operationId an earlier operation already has is `METHOD /path` too, with
  a warning (both stay callable); `method` (upper case) and `path` kept.
- description: summary + description; tags: the operation's tags (plus `deprecated` when it is).
- parameters: one JSON object schema. Path, query, header and cookie parameters (path-level ones
  included, operation-level ones overriding) become properties; path parameters and `required: true`
  ones are required; a name two locations share is `LOCATION_NAME` for the second (`query_id`). The
  request body (JSON first, then form media types; Swagger 2.0: the `in: body` parameter, found as the
  others are, by `$ref` or at path level) is merged in when it is a plain object, or an `allOf` of
  object parts (merged into one: `schema.merged_all_of`); a body field named as a parameter is
  `body_NAME`. Any other body (a oneOf/anyOf, an array, a string) becomes one `body` property, as the
  operation takes it (the text view lists a oneOf/anyOf's fields: `tool.parameter_lines`). A body's
  `readOnly` properties, at any depth, are left out (and out of `required`): the server sets them. Local `$ref`s
  are inlined (see `schema.py`); `xml` and `x-*` keywords are dropped.
- returns: the JSON schema of the lowest 2xx response that has one.
- namespace: the caller's, else `info.title` slugified ('Swagger Petstore' → 'swagger-petstore', '天気予報 API'
  → '天気予報-api': `common.slugify`).
- raw: {"method", "path", "operation" (as written), "parameter_locations" (property → path|query|
  header|cookie|body|formData), "body" ({"media_type", "whole": the property holding the whole body, or null
  when the body's properties were merged in}; the media type is the request body's chosen one, for Swagger
  2.0 the JSON one of `consumes` (else its first), or for formData multipart/form-data when a field is a
  file or `consumes` names only that, else the urlencoded form; absent without a body), "parameter_names"
  (property → its name in the request, for the properties renamed to keep two apart; absent when none was),
  "server" (the first of the operation's own `servers`, else of its path item's, as written; absent when
  neither names one, and the document's apply), "parameter_styles" (property → {"style", "explode"}: how its
  value is written, for the parameters whose OpenAPI 3 `style`/`explode` (Swagger 2.0: `collectionFormat`,
  csv by default, as the style that writes the same; a `content` parameter: "json") differ from their
  location's defaults, `DEFAULT_STYLES`; absent when none do)}: what an HTTP caller needs to place each
  argument (the gateway's OpenAPI upstream); and "deprecated": true when the operation is (`deprecated:
  true`), where `toolscout.deprecation` reads it as it reads any definition's flag.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..errors import CatalogError
from ..tool import Tool, json_type, parameter_lines
from .common import (
    Context,
    Entry,
    at,
    brief,
    collect,
    join_summary,
    make_tool,
    read_text,
    require_mapping,
    slugify,
)
from .schema import (Budget, RefResolver, branch_fields, is_plain_object, merged_all_of, object_schema,
                     without_read_only)

HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
_SWAGGER2_SCHEMA_KEYS = ("type", "format", "items", "enum", "default", "minimum", "maximum", "exclusiveMinimum",
                         "exclusiveMaximum", "minLength", "maxLength", "pattern", "minItems", "maxItems",
                         "uniqueItems", "multipleOf")


def parse(spec: Any, ctx: Context) -> list[Entry]:
    spec = require_mapping(ctx, spec, "", "an OpenAPI document (an object)")
    if "openapi" not in spec and "swagger" not in spec:
        raise ctx.error("", "not an OpenAPI document: it has no 'openapi' (3.x) or 'swagger' (2.0) field",
                        "check the file, or the format asked for")
    version = str(spec.get("openapi") or spec.get("swagger") or "")
    if not re.match(r"^(3\.|2\.0)", version):
        raise ctx.error("openapi" if "openapi" in spec else "swagger",
                        f"unsupported OpenAPI version {brief(version)}", "OpenAPI 3.x and Swagger 2.0 are supported")
    paths = spec.get("paths") or {}
    paths = require_mapping(ctx, paths, "paths", "an object of paths")
    ctx.empty_hint = "an OpenAPI document's tools are the operations under 'paths'" + (
        "; its 'webhooks' are requests the API sends, not operations to call" if spec.get("webhooks") else "")
    info = spec.get("info") if isinstance(spec.get("info"), Mapping) else {}
    title = info.get("title") if isinstance(info.get("title"), str) else ""
    namespace = ctx.namespace or slugify(title) or None
    resolver = RefResolver(spec, ctx)
    parser = _OperationParser(ctx, resolver, namespace, swagger2=version.startswith("2"),
                              consumes=spec.get("consumes"))
    return collect(ctx, _operations(ctx, resolver, paths), parser.parse)


def _operations(ctx: Context, resolver: RefResolver, paths: Mapping[str, Any]):
    for path, item in paths.items():
        where = at("paths", str(path))
        try:
            item = _path_item(ctx, resolver, item, where)
        except CatalogError as exc:  # lenient: the path item's operations are skipped, as a bad one would be
            if not ctx.lenient:
                raise
            ctx.skip(where, str(exc))
            continue
        shared = item.get("parameters") or []
        for method, op in item.items():  # document order
            if str(method).lower() in HTTP_METHODS:
                yield at(where, str(method)), (str(path), str(method).lower(), op, shared, where, item.get("servers"))


def _path_item(ctx: Context, resolver: RefResolver, item: Any, where: str) -> Mapping[str, Any]:
    item, _ = resolver.deref(item, where)
    if not isinstance(item, Mapping):
        raise ctx.error(where, f"a path item must be an object, got {json_type(item)}")
    return item


class _OperationParser:
    def __init__(self, ctx: Context, resolver: RefResolver, namespace: str | None, swagger2: bool,
                 consumes: Any = None):
        self.ctx, self.resolver, self.namespace, self.swagger2 = ctx, resolver, namespace, swagger2
        self.consumes = consumes  # Swagger 2.0: the media types the operations take, unless one says its own
        self.operation_ids: dict[str, str] = {}  # operationId -> the position of the operation that has it

    def parse(self, position: str, work: tuple) -> Tool:
        try:
            return self._parse(position, *work)
        except CatalogError as exc:  # a problem found inside components: say which operation needed it
            if position in str(exc):
                raise
            raise CatalogError(f"{exc} (needed by {position})") from None

    def _parse(self, position: str, path: str, method: str, op: Any, shared: Any, path_at: str,
               path_servers: Any) -> Tool:
        op = require_mapping(self.ctx, op, position, "an operation object")
        name = self._tool_name(position, op, method, path)
        budget = Budget()
        renamed: dict[str, str] = {}  # property -> the parameter's name in the request, where they differ
        styles: dict[str, dict[str, Any]] = {}  # property -> how its value is written, where not the default
        properties, required, locations, body_param = self._parameters(position, op, shared, path_at, budget,
                                                                       renamed, styles)
        body = self._merge_body(position, op, body_param, properties, required, locations, renamed, budget)
        tags = [t for t in self._list(op, position, "tags") if isinstance(t, str)]
        summary = read_text(self.ctx, op, position, "summary")
        description = read_text(self.ctx, op, position, "description")
        raw = {"method": method.upper(), "path": path, "operation": op, "parameter_locations": locations}
        if body is not None:
            raw["body"] = body
        if renamed:
            raw["parameter_names"] = renamed
        if styles:
            raw["parameter_styles"] = styles
        server = _own_server(op.get("servers")) or _own_server(path_servers)
        if server is not None:
            raw["server"] = server
        if op.get("deprecated") is True:  # where `toolscout.deprecation` reads a definition's own flag
            raw["deprecated"] = True
            tags.append("deprecated")
        return make_tool(self.ctx, position, self.namespace, name, description=join_summary(summary, description),
                         parameters=object_schema(properties, required), returns=self._returns(position, op),
                         tags=tuple(dict.fromkeys(tags)), method=method.upper(), path=path, raw=raw)

    def _tool_name(self, position: str, op: Mapping, method: str, path: str) -> str:
        """The operationId (a number, as YAML reads `operationId: 12345`, as its text), else `METHOD /path`;
        also `METHOD /path` for an operationId an earlier operation of the document has (real specs repeat
        one, for a GET and a PATCH of one path, say), with a warning, so that both operations can be called."""
        op_id = op.get("operationId")
        if isinstance(op_id, int) and not isinstance(op_id, bool):
            op_id = str(op_id)
        if op_id is not None and (not isinstance(op_id, str) or not op_id.strip()):
            raise self.ctx.error(at(position, "operationId"), "field 'operationId' must be a non-empty string")
        by_path = f"{method.upper()} {path}"
        if not op_id:
            return by_path
        op_id = op_id.strip()
        first = self.operation_ids.setdefault(op_id, position)
        if first != position:
            self.ctx.warn(f"{position}: operationId {brief(op_id)} is already the id of {first}; this "
                          f"operation's id is {brief(by_path)}, its method and path (give it an operationId of its "
                          "own to name it)")
            return by_path
        return op_id

    # ------------------------------------------------------------------------------- parameters
    def _parameters(self, position: str, op: Mapping, shared: Any, path_at: str, budget: Budget,
                    renamed: dict[str, str], styles: dict[str, dict[str, Any]]):
        """(properties, required, locations, the body parameter as (object, position) or None)."""
        properties: dict[str, Any] = {}
        required: list[str] = []
        locations: dict[str, str] = {}
        body = None
        for (name, location), (param, where) in self._chosen(position, op, shared, path_at).items():
            if location == "body":  # Swagger 2.0 body parameter: handled with the request body
                body = (param, where)
                continue
            key = _free_key(properties, name, location, renamed)
            schema = self.resolver.resolve(self._parameter_schema(param, where), at(where, "schema"), budget)
            if isinstance(param.get("description"), str) and param["description"].strip():
                schema = {**schema, "description": param["description"].strip()}
            properties[key] = schema
            locations[key] = location
            style = _swagger2_style(param, location) if self.swagger2 else _style(param, location)
            if style is not None:
                styles[key] = style
            if location == "path" or param.get("required") is True:
                required.append(key)
        return properties, required, locations, body

    def _chosen(self, position: str, op: Mapping, shared: Any, path_at: str) -> dict:
        """Each parameter, refs followed, by (name, in): path-level ones, then the operation's over them."""
        chosen: dict[tuple[str, str], tuple[Mapping, str]] = {}
        for owner_at, params in ((path_at, shared), (position, op.get("parameters") or [])):
            if not isinstance(params, list):
                raise self.ctx.error(at(owner_at, "parameters"), "field 'parameters' must be a list")
            for i, param in enumerate(params):
                where = at(at(owner_at, "parameters"), i)
                param, where = self.resolver.deref(param, where)
                param = require_mapping(self.ctx, param, where, "a parameter object")
                if isinstance(param.get("$ref"), str):  # left unresolved: it points into another file
                    raise self.ctx.error(where, f"the parameter is a $ref to another file ({brief(param['$ref'])}), "
                                         "which is not read", "bundle the spec into one file")
                name, location = param.get("name"), param.get("in")
                if not isinstance(name, str) or not name or not isinstance(location, str):
                    raise self.ctx.error(where, "a parameter needs string fields 'name' and 'in'")
                chosen[(name, location)] = (param, where)  # operation-level overrides path-level
        return chosen

    def _list(self, obj: Mapping, position: str, key: str) -> list:
        value = obj.get(key)
        if value is not None and not isinstance(value, list):
            raise self.ctx.error(at(position, key), f"field {key!r} must be a list, got {json_type(value)}")
        return value or []

    def _parameter_schema(self, param: Mapping, where: str) -> dict[str, Any]:
        if self.swagger2:
            schema = {k: param[k] for k in _SWAGGER2_SCHEMA_KEYS if k in param}
            if schema.get("type") == "file":
                schema = {"type": "string", "format": "binary"}
            return schema
        schema = self._schema_at(param.get("schema"), at(where, "schema"))
        if isinstance(schema, Mapping):
            return dict(schema)
        media = _json_media(param.get("content"))
        if media is not None and not isinstance(media, Mapping):
            raise self.ctx.error(at(where, "content"), "a media type's schema must be an object, got "
                                 f"{json_type(media)}")
        return dict(media) if media is not None else {}

    def _schema_at(self, schema: Any, where: str) -> Any:
        """`schema` (None when absent), refused when it cannot be a JSON schema (an object, or true/false)."""
        if schema is not None and not isinstance(schema, (Mapping, bool)):
            raise self.ctx.error(where, f"a schema must be a JSON schema object (or true/false), got "
                                 f"{json_type(schema)}")
        return schema

    # ------------------------------------------------------------------------------- request body
    def _merge_body(self, position: str, op: Mapping, body_param: tuple[Mapping, str] | None, properties: dict,
                    required: list, locations: dict, renamed: dict, budget: Budget) -> dict[str, Any] | None:
        """Add the request body's arguments (Swagger 2.0: `body_param`, the `in: body` parameter); returns
        where the body goes ({"media_type", "whole"}), or None."""
        if self.swagger2:
            consumes = op.get("consumes") if isinstance(op.get("consumes"), list) else self.consumes
            consumes = [str(m) for m in consumes] if isinstance(consumes, list) else []
            if body_param is None:
                return _swagger2_form(consumes, properties, locations)
            body, body_at = body_param
            media_type = min(consumes, key=lambda m: (m != "application/json", "json" not in m), default=None)
            schema_at, raw_schema = at(body_at, "schema"), body.get("schema")
            media_type = media_type or "application/json"
        else:
            if op.get("requestBody") is None:
                return None
            body, body_at = self.resolver.deref(op["requestBody"], at(position, "requestBody"))
            body = require_mapping(self.ctx, body, body_at, "a request body object")
            media_type, raw_schema = _body_media(body.get("content"))
            schema_at = at(at(at(body_at, "content"), media_type or "?"), "schema")
        if self._schema_at(raw_schema, schema_at) is None:
            return None
        schema = without_read_only(merged_all_of(self.resolver.resolve(raw_schema, schema_at, budget)))
        body_required = body.get("required") is True
        if is_plain_object(schema):
            body_required_names = schema.get("required") if body_required else None
            for name, prop in schema["properties"].items():
                key = _free_key(properties, name, "body", renamed)
                properties[key] = prop
                locations[key] = "body"
                if isinstance(body_required_names, list) and name in body_required_names:
                    required.append(key)
            return {"media_type": media_type, "whole": None}
        schema = _described_body(schema, body.get("description"))
        key = "body" if "body" not in properties else "request_body"
        properties[key] = schema
        locations[key] = "body"
        if body_required:
            required.append(key)
        return {"media_type": media_type, "whole": key}

    # ------------------------------------------------------------------------------- responses
    def _returns(self, position: str, op: Mapping) -> dict[str, Any] | None:
        responses = op.get("responses")
        if not isinstance(responses, Mapping):
            return None
        codes = {str(code): response for code, response in responses.items()}
        for code in sorted(c for c in codes if re.fullmatch(r"2\d\d", c)) + [c for c in codes if c.upper() == "2XX"]:
            where = at(at(position, "responses"), code)
            response, where = self.resolver.deref(codes[code], where)
            if not isinstance(response, Mapping):
                continue
            schema = response.get("schema") if self.swagger2 else _json_media(response.get("content"))
            if isinstance(schema, Mapping):  # a schema that is not an object describes nothing
                resolved = self.resolver.resolve(schema, where)
                if isinstance(resolved, Mapping):
                    return resolved
        return None


def _described_body(schema: Any, description: Any) -> Any:
    """A whole body's schema with words for the text view: the request body's description, and the fields
    of a oneOf/anyOf (or unmerged allOf) body's branches. Such a body stays one `body` argument, so that the
    schema an agent calls with keeps the choice (merging the branches would allow a mix no branch accepts),
    but a task says "a pet's nickname", not "body". Only here, where the argument is otherwise the bare word
    "body": listing the branches of every anyOf argument (Stripe's range filters) cost its tasks 1.45
    nDCG@10 points (benchmarks/long_descriptions.py)."""
    if not isinstance(schema, dict) or "description" in schema:
        return schema
    words = [description.strip()] if isinstance(description, str) and description.strip() else []
    fields = branch_fields(schema)
    if fields:
        words.append("; ".join(parameter_lines({"properties": fields})))
    return {**schema, "description": " ".join(words)} if words else schema


# How a parameter's value is written where OpenAPI 3 says nothing: `style` and `explode` by location.
DEFAULT_STYLES = {"query": ("form", True), "cookie": ("form", True), "formData": ("form", True),
                  "path": ("simple", False), "header": ("simple", False)}
_COLLECTION_FORMATS = {"csv": None, "ssv": "spaceDelimited", "tsv": "tabDelimited", "pipes": "pipeDelimited"}


def _style(param: Mapping, location: str) -> dict[str, Any] | None:
    """An OpenAPI 3 parameter's `style` and `explode` where they differ from its location's defaults (None where
    they do not); a parameter given as `content` (a media type) is written as JSON: style "json"."""
    if "schema" not in param and isinstance(param.get("content"), Mapping):
        return {"style": "json", "explode": False}
    default_style, _ = DEFAULT_STYLES.get(location, ("form", True))
    style = param.get("style") if isinstance(param.get("style"), str) else default_style
    explode = param["explode"] if isinstance(param.get("explode"), bool) else style == "form"
    return None if (style, explode) == DEFAULT_STYLES.get(location) else {"style": style, "explode": explode}


def _swagger2_style(param: Mapping, location: str) -> dict[str, Any] | None:
    """A Swagger 2.0 array parameter's `collectionFormat` (csv when it has none) as the OpenAPI 3 style that
    writes the same: csv is form or simple without explode, ssv/tsv/pipes the delimited ones, multi form."""
    if param.get("type") != "array":
        return None
    collection = param.get("collectionFormat") or "csv"
    if collection == "multi":
        return None if location in ("query", "formData") else {"style": "form", "explode": True}
    default_style, _ = DEFAULT_STYLES.get(location, ("form", True))
    style = _COLLECTION_FORMATS.get(str(collection)) or default_style
    return None if (style, False) == DEFAULT_STYLES.get(location) else {"style": style, "explode": False}


def _swagger2_form(consumes: list[str], properties: Mapping[str, Any], locations: Mapping[str, str]):
    """Where a Swagger 2.0 operation's formData goes: multipart/form-data when a field is a file or the
    operation takes only that, else application/x-www-form-urlencoded; None without formData."""
    form = [key for key, location in locations.items() if location == "formData"]
    if not form:
        return None
    has_file = any(isinstance(properties[key], Mapping) and properties[key].get("format") == "binary" for key in form)
    multipart = has_file or ("multipart/form-data" in consumes and "application/x-www-form-urlencoded" not in consumes)
    return {"media_type": "multipart/form-data" if multipart else "application/x-www-form-urlencoded", "whole": None}


def _own_server(servers: Any) -> Mapping[str, Any] | None:
    """The first Server Object of an operation's or path item's own `servers` (OpenAPI 3), which takes the place
    of the document's for that operation; None when it names none."""
    if isinstance(servers, list) and servers and isinstance(servers[0], Mapping) and servers[0].get("url"):
        return servers[0]
    return None


def _free_key(properties: Mapping[str, Any], name: str, location: str, renamed: dict[str, str]) -> str:
    """The property for parameter `name`: the name itself, or `LOCATION_NAME` (underscores added until free)
    when another location's parameter has it, noted in `renamed` so a caller sends it as `name`."""
    key = name
    if key in properties:
        key = f"{location}_{name}"
        while key in properties:
            key = f"_{key}"
        renamed[key] = name
    return key


def _json_media(content: Any) -> Any:
    """The schema of the JSON media type in a `content` map (application/json, then any +json)."""
    if not isinstance(content, Mapping):
        return None
    ordered = sorted(content, key=lambda m: (m != "application/json", "json" not in str(m)))
    for media_type in ordered:
        if "json" in str(media_type) and isinstance(content[media_type], Mapping):
            return content[media_type].get("schema")
    return None


def _body_media(content: Any) -> tuple[str | None, Any]:
    """(media type, schema) of a request body: JSON first, then forms, then whatever comes first."""
    if not isinstance(content, Mapping) or not content:
        return None, None
    preference = lambda m: (m != "application/json", "json" not in m,  # noqa: E731
                            m not in ("application/x-www-form-urlencoded", "multipart/form-data"))
    for media_type in sorted((str(m) for m in content), key=preference):
        media = content.get(media_type)
        if isinstance(media, Mapping) and media.get("schema") is not None:
            return media_type, media["schema"]
    return None, None
