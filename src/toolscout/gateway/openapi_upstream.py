"""An HTTP API behind the gateway, described by an OpenAPI 3 or Swagger 2 document: each operation is a tool.

A call makes the operation's HTTP request: each argument goes where the document puts it (the path, the query,
a header, a cookie, or the body, sent as the media type the document gives it: JSON of any `+json` type, a
form urlencoded or multipart, or a string as it is), written as its style says, as recorded by the OpenAPI
parser (`Tool.raw["parameter_locations"]`, `["parameter_names"]`, `["parameter_styles"]` and `["body"]`). The
result is the response: its text as content, `{"status", "content_type", "body"}` (the body parsed when it is
JSON) as structured content, and `isError` for a status of 400 or more. An argument the operation does not
take is refused before any request is made. A header the config's `headers` sets (an API key) is taken out of
the tools' schemas, and refused as an argument: the configured value is the one sent.

The base URL is the config's `base_url` (for every operation), else the operation's own first server, else
its path's, else the document's (relative ones, and none at all, resolved against the URL the document was read
from, as OpenAPI specifies; `{variables}` filled in with their defaults). The document is read again every
`relist_every` seconds, so a changed API is re-indexed without a restart. The config's `query`
parameters go on every call.

Its transport (docs/gateway.md, "When upstreams fail"): a call that cannot connect marks the upstream down
until a probe (with backoff) or a call reaches the service again; a call whose kept-alive connection turns
out closed is sent again on a new one when its method is idempotent, never otherwise, and one that was sent
says it may have run; redirects are followed for the document (not from https to http) and, for a call, for
a GET or HEAD to the same origin only, any other being an error result that names where it points.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Collection, Iterable, Mapping
from urllib.parse import quote, unquote_plus, urlencode, urljoin

import anyio
import httpx

from ..errors import CatalogError, DuplicateKey
from ..ingest import parse_tools
from ..ingest.common import LoadReport
from ..ingest.detect import parse_json, read_structured
from ..ingest.guard import check_tree
from ..ingest.live_mcp import error_reason
from ..ingest.openapi import DEFAULT_STYLES
from ..ingest.yaml_loader import load as load_yaml
from ..tool import Tool
from .config import UpstreamSpec
from .upstream import (
    NO_RELAY,
    Backoff,
    Extras,
    Listing,
    ListingNotRecorded,
    ListingSink,
    Notice,
    Relay,
    ToolResult,
    UpstreamRefused,
    UpstreamStatus,
    UpstreamUnavailable,
    error_result,
    next_attempt,
    sent_and_lost,
    timed_out,
)

logger = logging.getLogger(__name__)
# httpx logs each request's URL at INFO, and with it the config's `query` (an API key): the gateway's own log
# lines say what matters about a call
logging.getLogger("httpx").setLevel(max(logging.getLogger("httpx").level, logging.WARNING))
_TEXT_LIMIT = 100_000  # characters of a response body shown as text


class OpenApiUpstream:
    """One OpenAPI service behind the gateway (see the module doc)."""

    def __init__(self, spec: UpstreamSpec, *, relist_every: float = 300.0):
        self.spec = spec
        self.name, self.timeout, self.forward_headers = spec.name, spec.timeout, spec.forward_headers
        self.status = UpstreamStatus(spec.name, "openapi", spec.describe())
        self.relist_every = relist_every
        self.base_url: str | None = spec.base_url
        self._read_from = spec.spec or ""  # the URL the document was last read from (after redirects)
        self.extras = Extras()  # an HTTP API has no prompts or resources
        self._http: httpx.AsyncClient | None = None
        self._relist: anyio.Event | None = None
        self._read: anyio.Event | None = None  # set once the document has been read (or failed to be)
        self._unreached = False  # a call could not connect to the service: down until a probe or call reaches it
        self._backoff, self._probe_at = Backoff(), 0.0  # of reading the document, or probing the service

    async def run(self, sink: ListingSink, notice: Notice | None = None) -> None:
        self._relist, self._read = anyio.Event(), self._read or anyio.Event()
        if self.spec.problem:
            self.status.change("down", f"not started: {self.spec.problem}")
            logger.warning("upstream %s is down: %s", self.name, self.status.last_error)
            self._read.set()
            await anyio.sleep_forever()
        async with httpx.AsyncClient(headers=dict(self.spec.headers), timeout=self.timeout) as http:
            self._http = http
            while True:
                try:
                    await (self._probe() if self._unreached else self._list(sink))
                    self._came_up()
                    delay = self.relist_every
                except Exception as exc:  # a spec that cannot be read (or recorded) now: keep what was indexed, retry
                    delay = self._backoff.next(0.0)
                    self._probe_at = time.monotonic() + delay
                    state = "up" if self.status.state == "up" else "down"
                    why = str(exc) if isinstance(exc, (ListingNotRecorded, _Unreached)) else \
                        f"reading the OpenAPI document failed: {error_reason(exc)}"
                    self.status.change(state, f"{why} ({next_attempt(delay)})")
                    logger.warning("upstream %s: %s", self.name, self.status.last_error)
                self._read.set()
                await self._wait(delay)

    async def _wait(self, delay: float) -> None:
        """Until `delay` has passed or a re-list is asked for; a probe of an unreachable service waits its turn
        (`_probe_at`) whatever woke the supervisor."""
        assert self._relist is not None
        with anyio.move_on_after(delay):
            await self._relist.wait()
        self._relist = anyio.Event()
        if self._unreached:
            await anyio.sleep(max(0.0, self._probe_at - time.monotonic()))

    def _came_up(self) -> None:
        """Its document was read, or its service answered again after a call found it unreachable."""
        self._unreached, self._backoff = False, Backoff()
        if self.status.state != "up":
            self.status.connects += 1
        self.status.change("up")

    def _unreachable(self, why: str) -> None:
        """A call could not connect to the service: the upstream is down (its tools `available: false`) until
        a probe (`_probe`, with backoff) or a call reaches it again."""
        if not self._unreached:
            delay = self._backoff.next(0.0)
            self._unreached, self._probe_at = True, time.monotonic() + delay
            self.status.change("down", f"{why} ({next_attempt(delay)})")
            logger.warning("upstream %s is down: %s", self.name, self.status.last_error)
            if self._relist is not None:
                self._relist.set()  # the supervisor probes it then, with backoff after

    async def _probe(self) -> None:
        """Whether the service answers: a HEAD request to its base URL, which any answer passes (a 404 too:
        the service is there). _Unreached when it cannot be connected to."""
        assert self._http is not None and self.base_url is not None
        try:
            await self._http.head(self.base_url)
        except httpx.HTTPError as exc:
            raise _Unreached(f"{self._unreached_reason(exc)}; probed with HEAD {self.base_url}") from None

    def _unreached_reason(self, exc: BaseException) -> str:
        return f"its service at {self.base_url} could not be reached: {error_reason(exc)}"

    async def relist(self) -> None:
        if self._relist is not None:
            self._relist.set()

    async def wait_up(self, within: float) -> bool:
        if self.status.state == "starting":
            if self._read is None:  # its start is scheduled and has not run yet: it sets this one
                self._read = anyio.Event()
            with anyio.move_on_after(within):
                await self._read.wait()
        return self.status.state == "up"

    async def request(self, method: str, params: Mapping[str, Any], relay: Relay = NO_RELAY) -> dict[str, Any]:
        raise UpstreamRefused(f"upstream {self.name!r} is an HTTP API: it has no {method.split('/')[0]}", -32601)

    async def _list(self, sink: ListingSink) -> None:
        document, where, read_from = await self._document()
        report = LoadReport()
        tools = parse_tools(document, format="openapi", lenient=True, source=where, namespace=self.name,
                            report=report, as_served=True)
        tools = [_without_supplied(tool, self.spec.headers) for tool in tools]
        for warning in report.warnings:
            logger.warning("%s", warning)
        self._read_from = read_from
        try:
            self.base_url = self.spec.base_url or _base_url(document, read_from)
        except CatalogError as exc:
            raise CatalogError(f"{where}: {exc} (openapi.{self.name}.base_url)") from None
        if self.base_url is None:
            raise CatalogError(f"{where} names no absolute server URL; give the API's address as base_url in "
                               f"the gateway config (openapi.{self.name}.base_url)")
        await sink(Listing(self.name, tools, tuple(report.skipped)))
        self.status.tools = len(tools)
        self.status.skipped = [{"where": w, "reason": why} for w, why in report.skipped]

    async def _document(self) -> tuple[Any, str, str]:
        """The document, where the config says it is, and the URL it was read from (after redirects; what
        relative server URLs are resolved against)."""
        location = self.spec.spec or ""
        if not location.lower().startswith(("http://", "https://")):
            read = functools.partial(read_structured, Path(location), location)
            return await anyio.to_thread.run_sync(_third_party, read), location, location
        assert self._http is not None
        response = await _following(self._http, self._http.build_request("GET", location), _document_follows,
                                    private=self.spec.headers)
        if response.has_redirect_location:
            raise CatalogError(f"{location} redirects more than {_MAX_REDIRECTS} times (last to "
                               f"{response.headers.get('location')})")
        if response.status_code >= 400:
            raise CatalogError(f"{response.url} answered HTTP {response.status_code} {response.reason_phrase}")
        text = response.text
        parse = parse_json if text.lstrip()[:1] in ("{", "[") else load_yaml
        document = _third_party(functools.partial(parse, text, location))
        check_tree(document, location, json_only=True)
        return document, location, str(response.url)

    # calls -------------------------------------------------------------------------------------
    async def call(self, tool: Tool, arguments: Mapping[str, Any], headers: Mapping[str, str],
                   relay: Relay = NO_RELAY) -> ToolResult:
        await self.wait_up(self.timeout)
        if self._http is None or self.base_url is None:
            raise UpstreamUnavailable(f"upstream {self.name!r} is unavailable: "
                                      f"{self.status.last_error or 'its OpenAPI document has not been read yet'}")
        try:
            request = _request(tool, arguments, self._base_url_of(tool), headers, supplied=self.spec.headers)
        except CatalogError as exc:
            return error_result(f"upstream {self.name!r}: {exc}")
        what = f"the call of {tool.name}"
        try:
            with anyio.fail_after(self.timeout):
                response = await _following(self._http, self._http.build_request(**request), _call_follows, self._send)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # never sent: the service is not there
            self._unreachable(self._unreached_reason(exc))
            raise UpstreamUnavailable(f"upstream {self.name!r}: {what} was not sent: "
                                      f"{self._unreached_reason(exc)}") from None
        except (TimeoutError, httpx.TimeoutException):
            raise timed_out("openapi", self.name, tool.name, self.timeout) from None
        except httpx.LocalProtocolError as exc:  # refused by the gateway's HTTP client before sending
            return error_result(f"upstream {self.name!r}: {what} was not sent: {error_reason(exc)}")
        except httpx.HTTPError as exc:  # the connection failed once the request was sent (and retried if safe)
            raise sent_and_lost(self.name, what, f"the connection to {self.base_url} failed: "
                                f"{error_reason(exc)}") from None
        if self._unreached:
            self._came_up()
        return _redirect_result(response) if response.has_redirect_location else _result(response)

    def _base_url_of(self, tool: Tool) -> str:
        """Where `tool`'s request goes: the config's base_url (the operator's choice, for every operation), else
        the operation's own server (or its path's: `raw["server"]`), else the document's."""
        server = tool.raw.get("server") if isinstance(tool.raw, Mapping) and not self.spec.base_url else None
        if not isinstance(server, Mapping) or not server.get("url"):
            return self.base_url or ""
        read_from = self._read_from
        relative_to = read_from if read_from.lower().startswith(("http://", "https://")) else self.base_url or ""
        return _server_url(server, f"{tool.name}: servers[0]", relative_to) or self.base_url or ""

    async def _send(self, http: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
        """One request of a call (or of a redirect it follows), with the config's query parameters (over any
        argument's). Sent again once, on a new connection, when a kept-alive one turned out closed (the
        service closed it while idle: a race every keep-alive timeout invites) and sending it twice is safe:
        its method is idempotent (RFC 9110). A POST or PATCH is never sent twice: it may have been received."""
        request.url = _with_query(request.url, self.spec.query)
        try:
            return await http.send(request)
        except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError):
            if request.method not in _IDEMPOTENT:
                raise
        async with httpx.AsyncClient(timeout=self.timeout) as fresh:  # its own pool: a new connection
            return await fresh.send(request)


_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
_MAX_REDIRECTS = 5
Send = Callable[[httpx.AsyncClient, httpx.Request], Awaitable[httpx.Response]]
Follows = Callable[[httpx.Request, httpx.URL], bool]  # whether a redirect from the request to the URL is followed


class _Unreached(CatalogError):
    """A probe could not connect to the service (the message says where and why)."""


def _with_query(url: httpx.URL, extra: Mapping[str, str]) -> httpx.URL:
    """`url` with the parameters `extra`, in place of any of the same name; the rest of its query stays as it
    was written (encoding it again would undo a `style`'s commas and brackets)."""
    if not extra:
        return url
    kept = [part for part in url.query.decode("ascii").split("&")
            if part and unquote_plus(part.split("=")[0]) not in extra]
    return url.copy_with(query="&".join([*kept, urlencode(extra)]).encode("ascii"))


async def _send_once(http: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
    return await http.send(request)


async def _following(http: httpx.AsyncClient, request: httpx.Request, follows: Follows, send: Send = _send_once,
                     private: Iterable[str] = ()) -> httpx.Response:
    """The response to `request`, its redirects followed (at most `_MAX_REDIRECTS`) while `follows(request,
    target)`; a redirect it does not follow is returned as it came. The headers named `private` (the
    config's, secrets) go to the first origin only."""
    for _ in range(_MAX_REDIRECTS + 1):
        response = await send(http, request)
        if not response.has_redirect_location:
            return response
        target = request.url.join(response.headers["location"])
        if not follows(request, target):
            return response
        await response.aclose()
        dropped = {"host"} | ({name.lower() for name in private} if _origin(target) != _origin(request.url) else set())
        headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() not in dropped]
        method = "GET" if response.status_code == 303 and request.method != "HEAD" else request.method
        request = http.build_request(method, target, headers=headers)
    return response


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host, url.port


def _document_follows(request: httpx.Request, target: httpx.URL) -> bool:
    """A document is read through any redirect but one from https to http (it would come unprotected)."""
    if request.url.scheme == "https" and target.scheme != "https":
        raise CatalogError(f"{request.url} redirects to {target}, from https to {target.scheme}: refused; give "
                           "that URL as the spec if it is meant")
    return True


def _call_follows(request: httpx.Request, target: httpx.URL) -> bool:
    """A call follows a redirect only as a GET or HEAD to the same origin (where the config's headers were
    meant to go); any other is the call's result, naming where it points (`_redirect_result`)."""
    return request.method in ("GET", "HEAD") and _origin(target) == _origin(request.url)


def _redirect_result(response: httpx.Response) -> ToolResult:
    """A redirect the gateway does not follow: an error that says where it points, never a silent success."""
    location = response.headers.get("location", "")
    summary = f"HTTP {response.status_code} {response.reason_phrase}".strip()
    return {"content": [{"type": "text", "text": f"{summary}: the API redirects this call to {location}, which the "
                                                 f"gateway does not follow (it follows up to {_MAX_REDIRECTS}, and "
                                                 "only of a GET or HEAD to the same server)"}],
            "structuredContent": {"status": response.status_code, "location": location,
                                  "content_type": response.headers.get("content-type", ""), "body": response.text},
            "isError": True}


def _request(tool: Tool, arguments: Mapping[str, Any], base_url: str, forwarded: Mapping[str, str],
             supplied: Collection[str] = ()) -> dict:
    """httpx request arguments for one call of `tool` (CatalogError for an argument it does not take, or for a
    header the config `supplied`: the configured value is sent, never an argument in its place)."""
    raw = tool.raw if isinstance(tool.raw, Mapping) else {}
    locations: Mapping[str, str] = raw.get("parameter_locations") or {}
    configured = {header.lower() for header in supplied}
    unknown = sorted(set(arguments) - set(locations), key=lambda name: (name.lower() not in configured, name))
    if unknown and unknown[0].lower() in configured:
        raise CatalogError(f"{tool.name}: the header {unknown[0]!r} is set by the gateway's config; leave it out")
    if unknown:
        raise CatalogError(f"{tool.name} takes no argument {unknown[0]!r}; it takes {sorted(locations) or 'none'}")
    sent_as: Mapping[str, str] = raw.get("parameter_names") or {}  # `query_id` is the query's `id`
    styles: Mapping[str, Mapping[str, Any]] = raw.get("parameter_styles") or {}
    path, query = str(raw.get("path") or tool.path or ""), []
    placed: dict[str, dict[str, Any]] = {"header": {}, "cookie": {}, "body": {}, "formData": {}}
    for argument, value in arguments.items():
        location, name = locations[argument], sent_as.get(argument, argument)
        if value is None and location != "body":  # a model's "no value": left out (a body's null is JSON's)
            continue
        style, explode = _style_of(styles.get(argument), location)
        if location == "path":
            path = path.replace("{" + name + "}", _path_text(name, value, style, explode))
        elif location == "query":
            query += _query_parts(name, value, style, explode)
        elif location == "header" and name.lower() in configured:
            raise CatalogError(f"{tool.name}: the header {name!r} is set by the gateway's config; leave it out")
        elif location in ("header", "cookie"):
            text = _text(value) if style == "json" else ",".join(_items(value, explode, str))
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
    """A path parameter: simple `a,b`, label `.a.b` / `.a,b`, matrix `;id=a;id=b` / `;id=a,b`."""
    if style == "json":
        return _encoded(_text(value))
    items = _items(value, explode, _encoded)
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


def _without_supplied(tool: Tool, supplied: Mapping[str, str]) -> Tool:
    """`tool` without the header parameters the gateway's config supplies (an API key): the model is neither
    shown them nor told they are required, so it does not invent a value (which would then be refused)."""
    raw = tool.raw if isinstance(tool.raw, Mapping) else {}
    locations: Mapping[str, str] = raw.get("parameter_locations") or {}
    sent_as: Mapping[str, str] = raw.get("parameter_names") or {}
    configured = {header.lower() for header in supplied}
    dropped = {argument for argument, location in locations.items()
               if location == "header" and sent_as.get(argument, argument).lower() in configured}
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


def _result(response: httpx.Response) -> ToolResult:
    content_type = response.headers.get("content-type", "")
    text = response.text
    try:
        body: Any = json.loads(text) if "json" in content_type or text.lstrip()[:1] in ("{", "[") else text
    except ValueError:
        body = text
    shown = text if len(text) <= _TEXT_LIMIT else text[:_TEXT_LIMIT] + f"... ({len(text)} characters in all)"
    summary = f"HTTP {response.status_code} {response.reason_phrase}".strip()
    return {"content": [{"type": "text", "text": f"{summary}\n{shown}" if shown else summary}],
            "structuredContent": {"status": response.status_code, "content_type": content_type, "body": body},
            "isError": response.status_code >= 400}


def _base_url(document: Any, location: str) -> str | None:
    """The document's first server: OpenAPI 3 `servers[0].url` (its variables filled in; none is `/`: the
    document's own server), or Swagger 2 `schemes`/`host`/`basePath` (no host or scheme: the document's own). A
    relative URL is resolved against the URL the document was read from; read from a file, it names no server
    (None)."""
    if not isinstance(document, Mapping):
        return None
    served = httpx.URL(location) if location.lower().startswith(("http://", "https://")) else None
    if "swagger" in document:
        host = document.get("host") or (served.netloc.decode("ascii") if served else None)
        if not host:
            return None
        schemes = document.get("schemes") or [served.scheme if served else "https"]
        return f"{schemes[0]}://{host}{document.get('basePath') or ''}"
    servers = document.get("servers")
    if isinstance(servers, list) and servers and isinstance(servers[0], Mapping) and servers[0].get("url"):
        return _server_url(servers[0], "servers[0]", location)
    return urljoin(location, "/") if served else None


def _server_url(server: Mapping[str, Any], where: str, location: str) -> str | None:
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
    if url.lower().startswith(("http://", "https://")):
        return url
    return urljoin(location, url) if location.lower().startswith(("http://", "https://")) else None


def _path_names(path: str) -> list[str]:
    return re.findall(r"\{([^}/]+)\}", path)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _third_party(read: Callable[..., Any]) -> Any:
    """A document an API publishes, read with `read(unique=...)`: a key it names twice is logged and the
    last kept, as its own readers do (an upstream down over a slip its operator cannot fix would be worse;
    a catalog given to `toolscout index` is refused for it)."""
    try:
        return read(unique=True)
    except DuplicateKey as exc:
        logger.warning("%s (the last one is kept)", exc)
        return read(unique=False)
