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


# /docs draws the API's documentation with Swagger UI, which FastAPI's page loads from a CDN (FastAPI ships
# no copy, and bundling one would be a dependency of its own): offline it stays blank, so it says where the
# API is described without the network, until Swagger UI has loaded.
OFFLINE_NOTE = ('<p id="offline-note" style="font: 16px/1.5 sans-serif; margin: 2em">This page draws the API '
                'documentation with Swagger UI, loaded from cdn.jsdelivr.net, and it has not loaded (offline?). '
                'Without the network, the API is described in full at <a href="{root}/openapi.json">/openapi.json'
                '</a> (OpenAPI 3.1), and the playground at <a href="{root}/ui">/ui</a> works.</p>')
LOADED = '<script>if (window.SwaggerUIBundle) document.getElementById("offline-note").remove();</script>'


def api_docs(root: str, title: str) -> Response:
    """FastAPI's Swagger UI page for the API at `root`, with OFFLINE_NOTE (removed once Swagger UI loads; a
    script after the page's own runs even when theirs failed)."""
    from fastapi.openapi.docs import get_swagger_ui_html

    html = get_swagger_ui_html(openapi_url=f"{root}/openapi.json", title=title).body.decode()
    html = html.replace("<body>", "<body>" + OFFLINE_NOTE.format(root=root), 1)
    return Response(html.replace("</body>", LOADED + "</body>", 1), media_type="text/html; charset=utf-8")


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
