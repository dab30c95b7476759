"""The playground page served at /ui: plain HTML, JavaScript and CSS shipped with the package (no build
step, nothing fetched from anywhere else). The page calls the public HTTP API only, with the token the
user pastes into it, so it can do exactly what that token can do through the API."""

from importlib import resources

from starlette.responses import Response

from ...errors import NotFound

PAGE = "index.html"
ASSETS = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}

# The page renders untrusted tool text through textContent only; should that ever slip, the browser still
# runs no inline script, loads nothing from elsewhere and sends requests to this server only.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def page() -> Response:
    """The playground's HTML page."""
    return _file(PAGE, "text/html; charset=utf-8")


def asset(name: str) -> Response:
    """One of the page's own files (its script and style sheet); NotFound for any other name."""
    media = ASSETS.get(name)
    if media is None:
        raise NotFound(f"no playground file {name!r}; the playground is at /ui")
    return _file(name, media)


def _file(name: str, media: str) -> Response:
    body = resources.files(__name__).joinpath(name).read_bytes()
    return Response(body, media_type=media, headers=HEADERS)
