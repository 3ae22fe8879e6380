"""The inspector: a small page at `/` for people, served by the app itself (no CDN, no build step).

On a server that renders (the renderer, a worker with its render routes on, a router started with a
tokenizer) it renders a request through the server's own routes and shows each prompt token highlighted, with
its id on hover, the render answer and the fingerprint; on a router it also lists the workers (`GET
/workers`): their state, fingerprint match, the gate's reasons and their load.

The page and its two files are static and the same on every server: they carry no model name, fingerprint or
any other server fact. They answer without the API key (`INSPECTOR_PATHS` are open paths); everything the page
shows comes from API calls that send the key the user types into it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources

from fastapi import APIRouter
from starlette.responses import Response

__all__ = ["INSPECTOR_ASSETS", "INSPECTOR_PATHS", "inspector_router"]

# URL path -> (file under server/static/, media type).
INSPECTOR_ASSETS = {
    "/": ("inspector.html", "text/html; charset=utf-8"),
    "/inspector/inspector.js": ("inspector.js", "text/javascript; charset=utf-8"),
    "/inspector/inspector.css": ("inspector.css", "text/css; charset=utf-8"),
}
INSPECTOR_PATHS = frozenset(INSPECTOR_ASSETS)

# The page may load only its own files and call only its own server: a stray external URL fails in the
# browser instead of leaking a request, and no inline script or style can run.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _read(name: str) -> bytes:
    return (resources.files("tokenfront.server") / "static" / name).read_bytes()


def inspector_router() -> APIRouter:
    """GET `/` (the page) and its script and style sheet, read once from the package; outside the schema."""
    router = APIRouter(include_in_schema=False)
    for path, (name, media_type) in INSPECTOR_ASSETS.items():
        router.add_api_route(path, _asset_endpoint(_read(name), media_type), methods=["GET"])
    return router


def _asset_endpoint(content: bytes, media_type: str) -> Callable[[], Awaitable[Response]]:
    async def asset() -> Response:
        return Response(content, media_type=media_type, headers=_HEADERS)

    return asset
