"""The HTTP request a call of an OpenAPI operation makes, and where it goes.

Each argument goes where the document puts it (the path, the query, a header, a cookie, or the body), as the
OpenAPI parser recorded it (`Tool.raw["parameter_locations"]`, `["parameter_names"]`, `["parameter_styles"]`,
`["body"]` and `["server"]`: ingest/openapi.py), written as its style says (OpenAPI 3 "Style Values"; Swagger
2.0's collectionFormat arrives as the style that writes the same). The body is sent as the media type the
document gives it. A header or query parameter the gateway's config sets (an API key: `Supplied`) is out of
the tools' schemas and refused as an argument: the configured value is the one sent. The server is the operation's own, else its path's, else
the document's, with `{variables}` filled in by their defaults and relative URLs resolved against the URL the
document was read from. The transport (sending, retries, redirects) is `openapi_upstream.py`'s.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping
from urllib.parse import quote, urljoin

import httpx

from ..errors import CatalogError
from ..ingest.openapi import DEFAULT_STYLES
from ..ingest.remote import is_http_url
from ..tool import Tool


@dataclass(frozen=True)
class Supplied:
    """The parameters the gateway's config sets on every call (an API key): its `headers` (names matched
    case-insensitively, as HTTP does) and `query` parameters. An operation's parameter of such a name is out
    of its tool's schema and refused as an argument: the configured value is the one sent."""

    headers: frozenset[str] = frozenset()
    query: frozenset[str] = frozenset()

    @classmethod
    def of(cls, headers: Collection[str] = (), query: Collection[str] = ()) -> "Supplied":
        return cls(frozenset(header.lower() for header in headers), frozenset(query))

    def where(self, location: str, name: str) -> str | None:
        """What the config sets under `name` at `location` ("the header 'X-Api-Key'"), else None."""
        if location == "header" and name.lower() in self.headers:
            return f"the header {name!r}"
        if location == "query" and name in self.query:
            return f"the query parameter {name!r}"
        return None

    def refusal(self, tool: Tool, what: str) -> CatalogError:
        return CatalogError(f"{tool.name}: {what} is set by the gateway's config; leave it out")


def call_request(tool: Tool, arguments: Mapping[str, Any], base_url: str, forwarded: Mapping[str, str],
                 supplied: Supplied = Supplied()) -> dict:
    """httpx request arguments for one call of `tool` (CatalogError for an argument it does not take, or for a
    parameter the config `supplied`: the configured value is sent, never an argument in its place)."""
    raw = tool.raw if isinstance(tool.raw, Mapping) else {}
    locations: Mapping[str, str] = raw.get("parameter_locations") or {}
    unknown = sorted(set(arguments) - set(locations))
    configured = [what for name in unknown for what in (supplied.where("header", name), supplied.where("query", name))
                  if what]
    if configured:
        raise supplied.refusal(tool, configured[0])
    if unknown:
        raise CatalogError(f"{tool.name} takes no argument {unknown[0]!r}; it takes {sorted(locations) or 'none'}")
    sent_as: Mapping[str, str] = raw.get("parameter_names") or {}  # `query_id` is the query's `id`
    styles: Mapping[str, Mapping[str, Any]] = raw.get("parameter_styles") or {}
    path, query = str(raw.get("path") or tool.path or ""), []
    placed: dict[str, dict[str, Any]] = {"header": {}, "cookie": {}, "body": {}, "formData": {}}
    for argument, value in arguments.items():
        location, name = locations[argument], sent_as.get(argument, argument)
        if supplied.where(location, name):
            raise supplied.refusal(tool, str(supplied.where(location, name)))
        if value is None and location != "body":  # a model's "no value": left out (a body's null is JSON's)
            continue
        style, explode = _style_of(styles.get(argument), location)
        if location == "path":
            path = path.replace("{" + name + "}", _path_text(name, value, style, explode))
        elif location == "query":
            query += _query_parts(name, value, style, explode)
        elif location in ("header", "cookie"):
            text = _text(value) if style == "json" else _FORM_DELIMITERS.get(style, ",").join(_items(value, explode, str))
            placed[location][name] = _line_text(tool, location, argument, text)
        elif location == "formData":
            placed["formData"][name] = _form_value(value, style, explode)
        else:
            placed["body"][name] = value
    missing = sorted(set(_path_names(path)))
    if missing:
        raise CatalogError(f"{tool.name} needs the path argument {missing[0]!r} (not null)")
    url = base_url.rstrip("/") + "/" + path.lstrip("/") + ("?" + "&".join(query) if query else "")
    request: dict[str, Any] = {"method": str(raw.get("method") or tool.method or "GET"), "url": url,
                               "headers": {**forwarded, **placed["header"]},
                               "cookies": placed["cookie"] or None}
    content = placed["formData"] or placed["body"]
    if content:
        sent, content_type = _body(raw.get("body") or {}, content, _binary_fields(tool, sent_as))
        request.update(sent)
        if content_type:
            request["headers"]["Content-Type"] = content_type
    return request


# Serialization (OpenAPI 3 "Style Values"; Swagger 2.0's collectionFormat arrives as the style that writes the
# same: ingest/openapi.py). Values are percent-encoded in paths and queries; the delimiters a style puts
# between them are not, so the upstream can split them apart again.
_QUERY_DELIMITERS = {"form": ",", "spaceDelimited": "%20", "pipeDelimited": "%7C", "tabDelimited": "%09"}
_FORM_DELIMITERS = {"form": ",", "spaceDelimited": " ", "pipeDelimited": "|", "tabDelimited": "\t"}
_DELIMITED = ("spaceDelimited", "pipeDelimited", "tabDelimited")  # path and header: Swagger 2.0's ssv, pipes, tsv


def _style_of(style: Mapping[str, Any] | None, location: str) -> tuple[str, bool]:
    if isinstance(style, Mapping) and isinstance(style.get("style"), str):
        return style["style"], style.get("explode") is True
    return DEFAULT_STYLES.get(location, ("form", True))


def _encoded(text: str) -> str:
    return quote(text, safe="")


def _items(value: Any, explode: bool, encode: Callable[[str], str]) -> list[str]:
    """The parts a style joins: an array's items; an object's `key=value` pairs (exploded) or its keys and
    values in turn; a lone value."""
    if isinstance(value, list):
        return [encode(_text(item)) for item in value]
    if isinstance(value, Mapping):
        pairs = [(encode(str(key)), encode(_text(item))) for key, item in value.items()]
        return [f"{key}={item}" for key, item in pairs] if explode else [part for pair in pairs for part in pair]
    return [encode(_text(value))]


def _path_text(name: str, value: Any, style: str, explode: bool) -> str:
    """A path parameter: simple `a,b`, label `.a.b` / `.a,b`, matrix `;id=a;id=b` / `;id=a,b`; Swagger 2.0's
    pipes, ssv and tsv `a%7Cb`, `a%20b`, `a%09b`."""
    if style == "json":
        return _encoded(_text(value))
    items = _items(value, explode, _encoded)
    if style in _DELIMITED:
        return _QUERY_DELIMITERS[style].join(items)
    if style == "label":
        return "." + ("." if explode else ",").join(items)
    if style == "matrix":
        if explode and isinstance(value, (list, Mapping)):
            return "".join(f";{name}={item}" if isinstance(value, list) else f";{item}" for item in items)
        return f";{name}=" + ",".join(items)
    return ",".join(items)


def _query_parts(name: str, value: Any, style: str, explode: bool) -> list[str]:
    """A query parameter as `key=value` parts: form (exploded: `id=1&id=2`, an object's `k=v` each; else
    `id=1,2`), spaceDelimited / pipeDelimited (`id=1%201`, `id=1%7C2`), deepObject (`f%5Bk%5D=v`)."""
    key = _encoded(name)
    if style == "json" or not isinstance(value, (list, Mapping)):
        return [f"{key}={_encoded(_text(value))}"]
    if style == "deepObject" and isinstance(value, Mapping):
        return [f"{_encoded(f'{name}[{k}]')}={_encoded(_text(v))}" for k, v in value.items()]
    if explode:
        return [part if isinstance(value, Mapping) else f"{key}={part}" for part in _items(value, True, _encoded)]
    return [f"{key}=" + _QUERY_DELIMITERS.get(style, ",").join(_items(value, False, _encoded))]


def _form_value(value: Any, style: str, explode: bool) -> Any:
    """A Swagger 2.0 formData argument: an array joined as its collectionFormat says (multi: one field each)."""
    if isinstance(value, list):
        items = [_text(item) for item in value]
        return items if explode else _FORM_DELIMITERS.get(style, ",").join(items)
    return _text(value)


def without_supplied(tool: Tool, supplied: Supplied) -> Tool:
    """`tool` without the header and query parameters the gateway's config supplies (an API key): the model
    is neither shown them nor told they are required, so it does not invent a value (which would then be
    refused)."""
    raw = tool.raw if isinstance(tool.raw, Mapping) else {}
    locations: Mapping[str, str] = raw.get("parameter_locations") or {}
    sent_as: Mapping[str, str] = raw.get("parameter_names") or {}
    dropped = {argument for argument, location in locations.items()
               if supplied.where(location, sent_as.get(argument, argument))}
    if not dropped or not isinstance(tool.parameters, Mapping):
        return tool
    properties = tool.parameters.get("properties") or {}
    parameters = {**tool.parameters, "properties": {k: v for k, v in properties.items() if k not in dropped}}
    if isinstance(tool.parameters.get("required"), list):
        parameters["required"] = [name for name in tool.parameters["required"] if name not in dropped]
    raw = {**raw, "parameter_locations": {k: v for k, v in locations.items() if k not in dropped}}
    return tool.with_changes(raw=raw, parameters=None).keeping_parameters(parameters)


def _line_text(tool: Tool, location: str, argument: str, text: str) -> str:
    """A header or cookie argument's text, refused (naming the argument) when it cannot go on a header line as
    it is: a non-ASCII character cannot be encoded there, a line break would start another header, and a `;`
    another cookie."""
    if not re.fullmatch(r"[\x20-\x7e]*", text) or (location == "cookie" and ";" in text):
        rule = "printable ASCII text" + (" without ;" if location == "cookie" else "")
        raise CatalogError(f"{tool.name}: the {location} argument {argument!r} must be {rule}, got {text!r}")
    return text


def _body(body: Mapping[str, Any], values: dict[str, Any], binary: set[str]) -> tuple[dict[str, Any], str | None]:
    """(httpx arguments, Content-Type) for the body, sent as the media type the document gives it (JSON when it
    gives none):
    a form urlencoded or as multipart (a `binary` field as a file part, the argument's text its content), a
    JSON type (`application/merge-patch+json` too) as JSON, any other a string argument as it is."""
    whole = body.get("whole")
    content = values[whole] if whole in values else values
    media = str(body.get("media_type") or "application/json")
    if media == "multipart/form-data" and isinstance(content, Mapping):
        return {"files": [_part(name, item, name in binary) for name, value in content.items()
                          for item in (value if isinstance(value, list) else [value])]}, None  # httpx: its boundary
    if "form" in media and isinstance(content, Mapping):
        return {"data": {k: v if isinstance(v, list) else _text(v) for k, v in content.items()}}, None
    if "json" in media or not isinstance(content, str):
        text = json.dumps(content, ensure_ascii=False, separators=(",", ":"))
        return {"content": text.encode()}, media if "json" in media else "application/json"
    return {"content": content.encode()}, media


def _part(name: str, value: Any, is_file: bool) -> tuple[str, tuple]:
    """One multipart field: a file part (named as its field) or a plain one."""
    data = _text(value).encode()
    return (name, (name, data, "application/octet-stream") if is_file else (None, data))


def _binary_fields(tool: Tool, sent_as: Mapping[str, str]) -> set[str]:
    """The body fields that are files (`format: binary`; Swagger 2.0's `type: file`), by their names on the wire."""
    properties = (tool.parameters or {}).get("properties") or {}
    return {sent_as.get(key, key) for key, schema in properties.items()
            if isinstance(schema, Mapping) and schema.get("format") == "binary"}


def document_base_url(document: Any, location: str) -> str | None:
    """The document's first server: OpenAPI 3 `servers[0].url` (its variables filled in; none is `/`: the
    document's own server), or Swagger 2 `schemes`/`host`/`basePath` (no host or scheme: the document's own). A
    relative URL is resolved against the URL the document was read from; read from a file, it names no server
    (None)."""
    if not isinstance(document, Mapping):
        return None
    served = httpx.URL(location) if is_http_url(location) else None
    if "swagger" in document:
        host = document.get("host") or (served.netloc.decode("ascii") if served else None)
        if not host:
            return None
        schemes = document.get("schemes") or [served.scheme if served else "https"]
        return f"{schemes[0]}://{host}{document.get('basePath') or ''}"
    servers = document.get("servers")
    if isinstance(servers, list) and servers and isinstance(servers[0], Mapping) and servers[0].get("url"):
        return server_url(servers[0], "servers[0]", location)
    return urljoin(location, "/") if served else None


def server_url(server: Mapping[str, Any], where: str, location: str) -> str | None:
    """A Server Object's URL with each `{variable}` replaced by its `default` (what the defaults are for), made
    absolute against the document's URL; None for a relative one when the document is a file. CatalogError
    for a variable the server does not give a default."""
    variables = server.get("variables") if isinstance(server.get("variables"), Mapping) else {}

    def default(match: re.Match) -> str:
        variable = variables.get(match.group(1))
        if not isinstance(variable, Mapping) or variable.get("default") is None:
            raise CatalogError(f"{where}.url {server['url']!r} has the variable {{{match.group(1)}}} with no "
                               f"default; give the API's address as base_url in the gateway config")
        return str(variable["default"])

    url = re.sub(r"\{([^{}]+)\}", default, str(server["url"]))
    if is_http_url(url):
        return url
    return urljoin(location, url) if is_http_url(location) else None


def _path_names(path: str) -> list[str]:
    return re.findall(r"\{([^}/]+)\}", path)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)
