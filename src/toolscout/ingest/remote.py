"""Catalog locations that are URLs: which ones are documents to download (an OpenAPI spec by URL), which
are MCP endpoints (`live_mcp`), and the message for a scheme toolscout does not read (`htp://` is a typo,
not a file name).

A URL is read as a document when a format other than "mcp" is asked for, or when its path ends in .json,
.yaml or .yml (`/openapi.json`); any other http(s) URL is an MCP endpoint. Documents are fetched with the
standard library, so `toolscout index URL` needs no extra.

The fetch policy for a document by URL, here for `toolscout index` and the gateway's OpenAPI upstreams (which
fetch with httpx) alike: up to `MAX_REDIRECTS` redirects, each to http(s) and never from https to http
(`redirect_problem`); at most `MAX_DOCUMENT_BYTES`; an HTML page refused (`html_problem`); JSON or YAML by the
URL's suffix, else by its first character (`parse_document`).
"""

from __future__ import annotations

import re
import socket
import urllib.error
import urllib.request
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from ..errors import CatalogError
from .detect import STRUCTURED_SUFFIXES, parse_structured

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
READ_TIMEOUT_S = 30.0
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024  # a spec beyond this is refused, not read into memory whole
MAX_REDIRECTS = 5


def url_scheme(location: str) -> str | None:
    """The scheme of a `scheme://...` location (lower case), else None (a path, `mcp:...`, `module:attr`)."""
    match = _SCHEME.match(location)
    return match.group(1).lower() if match else None


def is_http_url(location: str) -> bool:
    """Whether `location` is an http:// or https:// URL (else a path, or another kind of location)."""
    return url_scheme(location) in ("http", "https")


def unsupported_scheme_problem(location: str) -> str | None:
    """Why `location` cannot be read, when it is a URL of a scheme other than http(s) (a typo such as
    'htp://', or ftp://); None otherwise."""
    scheme = url_scheme(location)
    if scheme is None or scheme in ("http", "https"):
        return None
    return (f"unsupported URL scheme {scheme!r} in {location!r}: give an http:// or https:// URL, or the path "
            "of a file")


def is_document_url(location: str, format: str | None) -> bool:
    """Whether an http(s) `location` is read as a document (see the module doc), not as an MCP endpoint."""
    if not is_http_url(location):
        return False
    if format is not None:
        return format != "mcp"
    return PurePosixPath(urlsplit(location).path).suffix.lower() in STRUCTURED_SUFFIXES


def redirect_problem(source: str, target: str) -> str | None:
    """Why a document at `source` is not read from `target`, where it redirects: a scheme other than http(s)
    (ftp://), or http from https (it would come unprotected); None when it is followed."""
    scheme, was = url_scheme(target), url_scheme(source)
    if scheme not in ("http", "https") or (was == "https" and scheme != "https"):
        return (f"{source} redirects to {target}, from {was} to {scheme}: refused; give that URL as the spec if "
                "it is meant")
    return None


def too_large_problem(url: str) -> str:
    return f"{url}: the document is larger than {MAX_DOCUMENT_BYTES // 2**20} MiB; download it and give its file"


def html_problem(url: str, content_type: str) -> str | None:
    """Why the answer at `url` is not a document, when it is an HTML page (a docs page given for the spec)."""
    if content_type.split(";")[0].strip().lower() != "text/html":
        return None
    return (f"{url}: the server answered with an HTML page, not a JSON or YAML document; give the URL of the "
            "spec itself (often .../openapi.json)")


def parse_document(data: bytes, url: str, lenient: bool = False, unique: bool = True) -> Any:
    """The JSON or YAML document downloaded from `url` (its suffix says which, else its first character)."""
    return parse_structured(data, url, PurePosixPath(urlsplit(url).path).suffix.lower(), unique, lenient)


class _Redirects(urllib.request.HTTPRedirectHandler):
    max_redirections = MAX_REDIRECTS

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 (urllib's signature)
        problem = redirect_problem(req.full_url, newurl)
        if problem:
            raise CatalogError(problem)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def fetch_document(url: str, timeout: float = READ_TIMEOUT_S, lenient: bool = False) -> Any:
    """The JSON or YAML document at `url`, parsed; CatalogError naming the URL and what to do when it cannot
    be downloaded or is not JSON/YAML."""
    request = urllib.request.Request(url, headers={"Accept": "application/json, application/yaml;q=0.9, */*;q=0.5"})
    try:
        with urllib.request.build_opener(_Redirects).open(request, timeout=timeout) as response:  # noqa: S310
            data = response.read(MAX_DOCUMENT_BYTES + 1)
            content_type = response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        raise CatalogError(f"{url}: the server answered HTTP {exc.code} {exc.reason}; check the URL, or download "
                           "the document and give its file") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        if isinstance(reason, (TimeoutError, socket.timeout)):
            raise CatalogError(f"{url}: no answer within {timeout:.0f}s; check that the server is up, or "
                               "download the document and give its file") from None
        raise CatalogError(f"{url}: could not be downloaded ({reason}); check the URL and that the server is "
                           "up") from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise CatalogError(too_large_problem(url))
    if problem := html_problem(url, content_type):
        raise CatalogError(problem)
    return parse_document(data, url, lenient=lenient)
