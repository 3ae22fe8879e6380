"""`/docs` (Swagger UI) and `/redoc` (ReDoc) with their JavaScript, CSS and icon served by the app itself.

FastAPI's own pages load these files from a public CDN, so on a host without internet they stay blank. The
files here come from the `fastapi-offline` package (Swagger UI 5 and ReDoc 2, the versions FastAPI's CDN
links name), read from its installed folder and answered under `/docs/assets/`.

ReDoc's side menu shows a "made by" link with a logo it loads from its vendor's CDN: the script is served with
the server's own icon in that URL's place, and the `/redoc` page's Content-Security-Policy lets it load
nothing but the server's own files.
"""

from __future__ import annotations

import html
from importlib import resources
from pathlib import Path

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.responses import FileResponse, HTMLResponse, Response

from tokenfront.server.errors import APIError

__all__ = ["DOCS_ASSETS", "DOCS_ASSETS_PREFIX", "api_docs_router"]

DOCS_ASSETS_PREFIX = "/docs/assets"
# The files the two pages load: name -> media type. Nothing else of the package's folder is answered.
DOCS_ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}

# The one URL ReDoc's script loads by itself (its side menu's logo); served with favicon.png's in its place.
_REDOC_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"

# ReDoc injects its styles at run time (hence 'unsafe-inline' for styles) and runs its search in a worker.
_REDOC_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; base-uri 'none'; form-action 'none'"
)
_REDOC_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="shortcut icon" href="{favicon}">
<style>body {{ margin: 0; padding: 0; }}</style>
</head>
<body>
<noscript>ReDoc needs JavaScript; the schema itself is at {openapi_url}.</noscript>
<redoc spec-url="{openapi_url}"></redoc>
<script src="{script}"></script>
</body>
</html>
"""


def _assets_folder() -> Path:
    return Path(str(resources.files("fastapi_offline") / "static"))


def api_docs_router(*, title: str, openapi_url: str) -> APIRouter:
    """GET `/docs`, `/redoc` and `/docs/assets/{name}`, all outside the OpenAPI schema."""
    router = APIRouter(include_in_schema=False)
    folder = _assets_folder()
    favicon = f"{DOCS_ASSETS_PREFIX}/favicon.png"
    patched: dict[str, bytes] = {}  # the ReDoc script with its logo URL replaced, read on first use

    @router.get("/docs")
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title} - Swagger UI",
            swagger_js_url=f"{DOCS_ASSETS_PREFIX}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS_PREFIX}/swagger-ui.css",
            swagger_favicon_url=favicon,
            # No validator badge: Swagger UI would send the schema's URL to a public validator.
            swagger_ui_parameters={"validatorUrl": None},
        )

    redoc_page = _REDOC_PAGE.format(
        title=html.escape(f"{title} - ReDoc"),
        favicon=html.escape(favicon),
        openapi_url=html.escape(openapi_url),
        script=html.escape(f"{DOCS_ASSETS_PREFIX}/redoc.standalone.js"),
    )

    @router.get("/redoc")
    async def redoc() -> HTMLResponse:
        return HTMLResponse(redoc_page, headers={"Content-Security-Policy": _REDOC_CSP})

    @router.get(DOCS_ASSETS_PREFIX + "/{name}")
    async def asset(name: str) -> Response:
        media_type = DOCS_ASSETS.get(name)
        if media_type is None:
            raise APIError(404, f"no documentation asset {name!r}", code="not_found")
        if name == "redoc.standalone.js":
            if name not in patched:
                patched[name] = (folder / name).read_bytes().replace(_REDOC_LOGO, favicon.encode())
            return Response(patched[name], media_type=media_type)
        return FileResponse(folder / name, media_type=media_type)

    return router
