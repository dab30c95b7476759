"""An HTTP API behind the gateway, described by an OpenAPI 3 or Swagger 2 document: each operation is a tool.

A call makes the operation's HTTP request (`openapi_request.py`: where each argument goes, how it is written,
and which server). The result is the response: its text as content, `{"status", "content_type", "body"}` (the
body parsed when it is JSON) as structured content, and `isError` for a status of 400 or more. The base URL is
the config's `base_url` (for every operation), else the operation's own server, else the document's. The
document is read again every `relist_every` seconds, so a changed API is re-indexed without a restart. The
config's `headers` and `query` parameters (an API key) go on every call to the base URL's origin, and only
there (`_Secrets`; an operation's parameter of the same name is not an argument); no cookie is kept.

Its transport (docs/gateway.md, "When upstreams fail"): a call that cannot connect marks the upstream down
until a probe (with backoff) or a call reaches the service again; a call whose kept-alive connection turns
out closed is sent again on a new one when its method is idempotent, never otherwise, and one that was sent
says it may have run; redirects are followed for the document as `ingest.remote`'s fetch policy allows (the
one `toolscout index URL` keeps) and, for a call, for a GET or HEAD to the same origin only, any other being
an error result that names where it points.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import time
from http.cookiejar import CookieJar, DefaultCookiePolicy
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, Mapping
from urllib.parse import quote, quote_plus, unquote_plus, urlencode

import anyio
import httpx

from ..errors import CatalogError, DuplicateKey, ToolScoutError
from ..ingest import parse_tools
from ..ingest import remote
from ..ingest.common import LoadReport
from ..ingest.detect import read_structured
from ..ingest.live_mcp import error_reason
from ..tool import Tool
from .config import UpstreamSpec
from .openapi_request import Supplied, call_request, document_base_url, server_url, without_supplied
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
_TEXT_LIMIT = 100_000  # characters of a response body shown as text


class OpenApiUpstream:
    """One OpenAPI service behind the gateway (see the module doc)."""

    def __init__(self, spec: UpstreamSpec, *, relist_every: float = 300.0):
        self.spec = spec
        self.name, self.timeout, self.forward_headers = spec.name, spec.timeout, spec.forward_headers
        self.status = UpstreamStatus(spec.name, "openapi", spec.describe())
        self.relist_every = relist_every
        self.base_url: str | None = spec.base_url
        self._supplied = Supplied.of(spec.headers, spec.query)  # parameters the config sets: no arguments
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
        _LOG_REDACTION.hide(self.spec.query)
        # no secrets on the client (`_Secrets` places them), and no cookies kept: it serves every agent, so a
        # cookie one call was given would go with the next agent's calls
        async with httpx.AsyncClient(timeout=self.timeout, cookies=_no_cookies()) as http:
            self._http = http
            while True:
                try:
                    if self._unreached:
                        await self._probe()
                        self._came_up()
                    else:
                        await self._list(sink)
                        if not self._unreached:  # else a call found the service unreachable meanwhile: it stands
                            self._came_up()
                    delay = self.relist_every
                except Exception as exc:  # a spec that cannot be read (or recorded) now: keep what was indexed, retry
                    delay = self._backoff.next(0.0)
                    self._probe_at = time.monotonic() + delay
                    state = "up" if self.status.state == "up" else "down"
                    why = self._listing_problem(exc)
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

    def _unreached_reason(self, exc: BaseException, server: str | None = None) -> str:
        """Why `server` (the service's base URL when None or of its origin; else an operation's own) could
        not be reached, naming it."""
        if server is None or self._is_the_api(server):
            return f"its service at {self.base_url} could not be reached: {error_reason(exc)}"
        return f"the server {_origin_text(server)} the operation names could not be reached: {error_reason(exc)}"

    def _is_the_api(self, url: str) -> bool:
        """Whether `url` is at the configured API's origin (its base URL's): where the config's secrets go,
        and whose being unreachable takes the whole upstream down."""
        return _origin(httpx.URL(url)) == _origin(httpx.URL(self.base_url or ""))

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
        tools = [without_supplied(tool, self._supplied) for tool in tools]
        for warning in report.warnings:
            logger.warning("%s", warning)
        self._read_from = read_from
        try:
            self.base_url = self.spec.base_url or document_base_url(document, read_from)
        except CatalogError as exc:
            raise CatalogError(f"{where}: {exc} (openapi.{self.name}.base_url)") from None
        if self.base_url is None:
            raise CatalogError(f"{where} names no absolute server URL; give the API's address as base_url in "
                               f"the gateway config (openapi.{self.name}.base_url)")
        await sink(Listing(self.name, tools, tuple(report.skipped)))
        self.status.tools = len(tools)
        self.status.skipped = [{"where": w, "reason": why} for w, why in report.skipped]

    def _listing_problem(self, exc: Exception) -> str:
        """Why listing failed, for /health and the log: naming the document and what to do, without Python's
        class names (a CatalogError, ListingNotRecorded or ConfigError already says both)."""
        location = self.spec.spec or ""
        if isinstance(exc, ToolScoutError):  # ListingNotRecorded, CatalogError, ConfigError
            return str(exc)
        if isinstance(exc, (TimeoutError, httpx.TimeoutException)):
            return (f"the OpenAPI document at {location} did not arrive within {self.timeout:g}s (the timeout; "
                    f"raise it with openapi.{self.name}.timeout in the gateway config, or check the host)")
        if isinstance(exc, httpx.HTTPError):
            return (f"could not download the OpenAPI document at {location} ({exc or type(exc).__name__}); check "
                    f"openapi.{self.name}.spec and that the host is up")
        return f"reading the OpenAPI document at {location} failed: {error_reason(exc)}"

    async def _document(self) -> tuple[Any, str, str]:
        """The document, where the config says it is, and the URL it was read from (after redirects; what
        relative server URLs are resolved against)."""
        location = self.spec.spec or ""
        if not remote.is_http_url(location):
            read = functools.partial(read_structured, Path(location), location, lenient=True)
            return await anyio.to_thread.run_sync(_third_party, read), location, location
        assert self._http is not None
        secrets = _Secrets(_origin(httpx.URL(location)), self.spec.headers)
        response = await _following(self._http, self._http.build_request("GET", location), _document_follows,
                                    secrets, _send_capped)
        if response.has_redirect_location:
            raise CatalogError(f"{location} redirects more than {_MAX_REDIRECTS} times (last to "
                               f"{response.headers.get('location')})")
        if response.status_code >= 400:
            raise CatalogError(f"{response.url} answered HTTP {response.status_code} {response.reason_phrase}, not "
                               f"the OpenAPI document; check openapi.{self.name}.spec in the gateway config")
        html = remote.html_problem(location, response.headers.get("content-type", ""))
        if html:
            raise CatalogError(f"{html} as openapi.{self.name}.spec")
        read = functools.partial(remote.parse_document, response.content, location, True)
        return _third_party(read), location, str(response.url)

    # calls -------------------------------------------------------------------------------------
    async def call(self, tool: Tool, arguments: Mapping[str, Any], headers: Mapping[str, str],
                   relay: Relay = NO_RELAY) -> ToolResult:
        await self.wait_up(self.timeout)
        if self._http is None or self.base_url is None:
            raise UpstreamUnavailable(f"upstream {self.name!r} is unavailable: "
                                      f"{self.status.last_error or 'its OpenAPI document has not been read yet'}")
        server = self._base_url_of(tool)
        try:
            request = call_request(tool, arguments, server, headers, self._supplied)
        except CatalogError as exc:
            return error_result(f"upstream {self.name!r}: {exc}")
        what = f"the call of {tool.name}"
        try:
            ours = self._is_the_api(server)
            with anyio.fail_after(self.timeout):
                response = await _following(self._http, self._http.build_request(**request), _call_follows,
                                            self._secrets(), self._send)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # never sent: the server is not there
            if ours:  # the service is down; a server only some operations name is theirs alone
                self._unreachable(self._unreached_reason(exc))
            raise UpstreamUnavailable(f"upstream {self.name!r}: {what} was not sent: "
                                      f"{self._unreached_reason(exc, server)}") from None
        except (TimeoutError, httpx.TimeoutException):
            raise timed_out("openapi", self.name, tool.name, self.timeout) from None
        except (httpx.LocalProtocolError, httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            # refused by the gateway's HTTP client before sending: a header it cannot write, a URL not http(s)
            # or over its length limit (a query argument of 64 KiB)
            return error_result(f"upstream {self.name!r}: {what} was not sent (to {_origin_text(server)}): "
                                f"{error_reason(exc)}")
        except httpx.HTTPError as exc:  # the connection failed once the request was sent (and retried if safe)
            raise sent_and_lost(self.name, what, f"the connection to {_origin_text(server)} failed: "
                                f"{error_reason(exc)}") from None
        if self._unreached and ours:
            self._came_up()
        if response.has_redirect_location:
            return _redirect_result(response, hidden=self.spec.query)
        return _result(response)

    def _base_url_of(self, tool: Tool) -> str:
        """Where `tool`'s request goes: the config's base_url (the operator's choice, for every operation), else
        the operation's own server (or its path's: `raw["server"]`), else the document's."""
        server = tool.raw.get("server") if isinstance(tool.raw, Mapping) and not self.spec.base_url else None
        if not isinstance(server, Mapping) or not server.get("url"):
            return self.base_url or ""
        read_from = self._read_from
        relative_to = read_from if remote.is_http_url(read_from) else self.base_url or ""
        return server_url(server, f"{tool.name}: servers[0]", relative_to) or self.base_url or ""

    def _secrets(self) -> _Secrets:
        """The config's headers and query parameters, for the configured API's origin (its base URL's) only."""
        return _Secrets(_origin(httpx.URL(self.base_url or "")), self.spec.headers, self.spec.query)

    async def _send(self, http: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
        """One request of a call (or of a redirect it follows). Sent again once, on a new connection, when a
        kept-alive one turned out closed (the service closed it while idle: a race every keep-alive timeout
        invites) and sending it twice is safe: its method is idempotent (RFC 9110). A POST or PATCH is never
        sent twice: it may have been received."""
        try:
            return await http.send(request)
        except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as exc:
            if request.method not in _IDEMPOTENT:
                raise
            lost = exc
        async with httpx.AsyncClient(timeout=self.timeout) as fresh:  # its own pool: a new connection
            try:
                return await fresh.send(request)
            except (httpx.ConnectError, httpx.ConnectTimeout):  # not sent again, but it was sent once
                raise lost from None


_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
_MAX_REDIRECTS = remote.MAX_REDIRECTS  # a call's too
Send = Callable[[httpx.AsyncClient, httpx.Request], Awaitable[httpx.Response]]
Follows = Callable[[httpx.Request, httpx.URL], bool]  # whether a redirect from the request to the URL is followed


class _Unreached(CatalogError):
    """A probe could not connect to the service (the message says where and why)."""


class _Redaction(logging.Filter):
    """Takes the config's query pairs' values (API keys) out of the lines httpx and httpcore log: the URL of each
    request (INFO), the headers of each response (DEBUG: a Location may echo the query). Their levels stay
    as whoever configured logging set them."""

    LOGGERS = ("httpx", "httpcore.connection", "httpcore.http11", "httpcore.http2", "httpcore.proxy",
               "httpcore.socks")

    def __init__(self) -> None:
        super().__init__()
        self.pairs: list[re.Pattern[str]] = []

    def hide(self, query: Mapping[str, str]) -> None:
        """Redact the value of each `name=value` pair of `query` in a URL (name and value as written or
        URL-encoded) from now on, and nothing else: a short value (`json`) stays where it is not the pair's;
        installed on the first call."""
        self.pairs += [_query_pair(name, value) for name, value in query.items() if value]
        for name in self.LOGGERS if self.pairs else ():
            if self not in logging.getLogger(name).filters:
                logging.getLogger(name).addFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        redacted = functools.reduce(lambda line, pair: pair.sub(r"\1***", line), self.pairs, text)
        if redacted != text:
            record.msg, record.args = redacted, None
        return True


def _query_pair(name: str, value: str) -> re.Pattern[str]:
    """`name=value` as a whole pair of a URL's query: after `?`, `&` or `;`, and before the next one (or a
    fragment, a space, a quote, the end); group 1 is `name=`."""
    def forms(text: str) -> str:
        written = {text, quote_plus(text), quote(text), quote(text, safe="")}
        return "|".join(re.escape(form) for form in sorted(written, key=len, reverse=True))
    return re.compile(rf"(?<=[?&;])((?:{forms(name)})=)(?:{forms(value)})(?![^&;#\s\"'])")


_LOG_REDACTION = _Redaction()


class _Secrets:
    """The config's headers and query parameters (an API key), and the one origin they are sent to: each
    request (each redirect hop too) gets them only when it goes there, never any other host."""

    def __init__(self, origin: tuple, headers: Mapping[str, str], query: Mapping[str, str] | None = None):
        self.origin, self.headers, self.query = origin, dict(headers), dict(query or {})

    def placed(self, request: httpx.Request) -> httpx.Request:
        """`request` with the secrets when it goes to their origin, and without them (any a redirect's
        Location echoed too) when it does not."""
        ours = _origin(request.url) == self.origin
        for name in self.headers:
            request.headers.pop(name, None)
        if ours:
            request.headers.update(self.headers)
        request.url = _with_query(request.url, self.query if ours else {}, drop=self.query)
        return request


def _with_query(url: httpx.URL, extra: Mapping[str, str], drop: Iterable[str] = ()) -> httpx.URL:
    """`url` with the parameters `extra`, in place of any of the same name (or of a name in `drop`); the rest
    of its query stays as it was written (encoding it again would undo a `style`'s commas and brackets)."""
    dropped = {*extra, *drop}
    if not dropped:
        return url
    kept = [part for part in url.query.decode("ascii").split("&")
            if part and unquote_plus(part.split("=")[0]) not in dropped]
    query = "&".join([*kept, urlencode(extra)] if extra else kept)
    return url.copy_with(query=query.encode("ascii") or None)


async def _send_capped(http: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
    """The response to `request` for a document, its body read up to the fetch policy's cap (CatalogError
    beyond it: `ingest.remote`)."""
    response, body = await http.send(request, stream=True), bytearray()
    try:
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > remote.MAX_DOCUMENT_BYTES:
                raise CatalogError(remote.too_large_problem(str(request.url)))
    finally:
        await response.aclose()
    headers = [(k, v) for k, v in response.headers.multi_items()  # the body as decoded: no encoding, length
               if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
    return httpx.Response(response.status_code, headers=headers, content=bytes(body), request=request)


async def _following(http: httpx.AsyncClient, request: httpx.Request, follows: Follows, secrets: _Secrets,
                     send: Send) -> httpx.Response:
    """The response to `request`, its redirects followed (at most `_MAX_REDIRECTS`) while `follows(request,
    target)`; a redirect it does not follow is returned as it came. The `secrets` go on each hop to their
    own origin only (`_Secrets.placed`)."""
    for _ in range(_MAX_REDIRECTS + 1):
        response = await send(http, secrets.placed(request))
        if not response.has_redirect_location:
            return response
        target = request.url.join(response.headers["location"])
        if not follows(request, target):
            return response
        await response.aclose()
        dropped = {"host"} | {name.lower() for name in secrets.headers}  # `placed` puts them back where they go
        headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() not in dropped]
        method = "GET" if response.status_code == 303 and request.method != "HEAD" else request.method
        request = http.build_request(method, target, headers=headers)
    return response


def _no_cookies() -> CookieJar:
    """A jar that keeps no cookie: only the operation's cookie parameters, as each call gives them, are sent."""
    return CookieJar(DefaultCookiePolicy(allowed_domains=[]))


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host, url.port


def _origin_text(url: str) -> str:
    """`url`'s scheme, host and port, as people write them (no path or query: a message names the server)."""
    parsed = httpx.URL(url)
    return f"{parsed.scheme}://{parsed.netloc.decode('ascii')}"


def _document_follows(request: httpx.Request, target: httpx.URL) -> bool:
    """A document is read through any redirect the fetch policy allows (`ingest.remote.redirect_problem`)."""
    problem = remote.redirect_problem(str(request.url), str(target))
    if problem:
        raise CatalogError(problem)
    return True


def _call_follows(request: httpx.Request, target: httpx.URL) -> bool:
    """A call follows a redirect only as a GET or HEAD to the same origin (where the config's headers were
    meant to go); any other is the call's result, naming where it points (`_redirect_result`)."""
    return request.method in ("GET", "HEAD") and _origin(target) == _origin(request.url)


def _redirect_result(response: httpx.Response, hidden: Iterable[str]) -> ToolResult:
    """A redirect the gateway does not follow: an error that says where it points, never a silent success;
    without the query parameters named `hidden` (the config's: a Location often echoes the request's query)."""
    location = response.headers.get("location", "")
    try:
        location = str(_with_query(httpx.URL(location), {}, drop=hidden))
    except httpx.InvalidURL:  # not a URL: shown as it came, which carries no query httpx could read either
        pass
    summary = f"HTTP {response.status_code} {response.reason_phrase}".strip()
    return {"content": [{"type": "text", "text": f"{summary}: the API redirects this call to {location}, which the "
                                                 f"gateway does not follow (it follows up to {_MAX_REDIRECTS}, and "
                                                 "only of a GET or HEAD to the same server)"}],
            "structuredContent": {"status": response.status_code, "location": location,
                                  "content_type": response.headers.get("content-type", ""), "body": response.text},
            "isError": True}


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


def _third_party(read: Callable[..., Any]) -> Any:
    """A document an API publishes, read with `read(unique=...)`: a key it names twice is logged and the
    last kept, as its own readers do (an upstream down over a slip its operator cannot fix would be worse;
    a catalog given to `toolscout index` is refused for it)."""
    try:
        return read(unique=True)
    except DuplicateKey as exc:
        logger.warning("%s (the last one is kept)", exc)
        return read(unique=False)
