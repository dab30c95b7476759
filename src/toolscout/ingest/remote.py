"""Catalog locations that are URLs: which ones are documents to download (an OpenAPI spec by URL), which
are MCP endpoints (`live_mcp`), and the message for a scheme toolscout does not read (`htp://` is a typo,
not a file name).

A URL is read as a document when a format other than "mcp" is asked for, or when its path ends in .json,
.yaml or .yml (`/openapi.json`); any other http(s) URL is an MCP endpoint. Documents are fetched with the
standard library (redirects followed), so `toolscout index URL` needs no extra.
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


def url_scheme(location: str) -> str | None:
    """The scheme of a `scheme://...` location (lower case), else None (a path, `mcp:...`, `module:attr`)."""
    match = _SCHEME.match(location)
    return match.group(1).lower() if match else None


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
    if url_scheme(location) not in ("http", "https"):
        return False
    if format is not None:
        return format != "mcp"
    return PurePosixPath(urlsplit(location).path).suffix.lower() in STRUCTURED_SUFFIXES


def fetch_document(url: str, timeout: float = READ_TIMEOUT_S, lenient: bool = False) -> Any:
    """The JSON or YAML document at `url`, parsed; CatalogError naming the URL and what to do when it cannot
    be downloaded or is not JSON/YAML."""
    request = urllib.request.Request(url, headers={"Accept": "application/json, application/yaml;q=0.9, */*;q=0.5"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (http(s) only: checked)
            data = response.read(MAX_DOCUMENT_BYTES + 1)
            content_type = response.headers.get_content_type()
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
        raise CatalogError(f"{url}: the document is larger than {MAX_DOCUMENT_BYTES // 2**20} MiB; download it "
                           "and give its file")
    if content_type == "text/html":
        raise CatalogError(f"{url}: the server answered with an HTML page, not a JSON or YAML document; give the "
                           "URL of the spec itself (often .../openapi.json)")
    return parse_structured(data, url, PurePosixPath(urlsplit(url).path).suffix.lower(), lenient=lenient)
