"""The inspector page at `/` and the offline `/docs` / `/redoc`, over HTTP (the browser test is
test_inspector_browser.py): what is served, to whom, and that nothing in it points off the server.

The renderer is the session's real Qwen3 renderer process; the router and the worker are built in-process
(the router without a tokenizer, the worker on a scripted engine), which is enough to see what they mount.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from tokenfront.core.render import RenderPipeline
from tokenfront.options import RenderOptions
from tokenfront.server.api_docs import DOCS_ASSETS, DOCS_ASSETS_PREFIX
from tokenfront.server.inspector import INSPECTOR_ASSETS
from tokenfront.worker.app import create_worker_app
from tokenfront.worker.engine import Engine, EngineInfo, GenerationRequest, GenerationStream, TokenOutput

PAGE_ASSETS = {"/inspector/inspector.js", "/inspector/inspector.css"}
# An absolute or protocol-relative URL: `http://x`, `https://x`, `//x` in a src/href/url(), `ws://x`.
EXTERNAL = re.compile(r"\b(?:https?|wss?|ftp)://|(?:src|href|action)\s*=\s*[\"']?//|url\(\s*[\"']?//", re.I)


class _References(HTMLParser):
    """Every `src` and `href` of an HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found += [value for name, value in attrs if name in ("src", "href") and value is not None]


def references(html: str) -> list[str]:
    parser = _References()
    parser.feed(html)
    return parser.found


@pytest.fixture(scope="module")
def renderer(qwen3_renderer: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=qwen3_renderer.url, timeout=30.0) as http:
        yield http


def test_page_and_its_files(renderer: httpx.Client) -> None:
    page = renderer.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "connect-src 'self'" in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    # The page loads exactly its script and style sheet (plus an empty inline icon), and links the docs.
    refs = references(page.text)
    assert set(refs) == {*PAGE_ASSETS, "data:,", "/docs", "/redoc", "/openapi.json"}, refs
    bodies = {"/": page.text}
    for path in sorted(PAGE_ASSETS):
        answer = renderer.get(path)
        assert answer.status_code == 200, path
        expected = "text/javascript" if path.endswith(".js") else "text/css"
        assert answer.headers["content-type"].startswith(expected)
        assert len(answer.content) > 1000
        bodies[path] = answer.text
    assert len(bodies) == len(INSPECTOR_ASSETS) == 3
    for path, text in bodies.items():
        assert not EXTERNAL.findall(text), f"{path} names an external URL: {EXTERNAL.findall(text)}"
    # Server and user text reaches the page through textContent only: nothing is parsed as HTML.
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in bodies["/inspector/inspector.js"], sink
    # Static: the page says nothing about this server (its model, fingerprint) until the user's calls do.
    assert "Qwen3" not in page.text and 'fingerprint":' not in page.text


def test_the_page_is_not_in_the_api_schema(renderer: httpx.Client) -> None:
    paths = renderer.get("/openapi.json").json()["paths"]
    hidden = ["/", *PAGE_ASSETS, "/docs", "/redoc", DOCS_ASSETS_PREFIX + "/{name}"]
    assert [path for path in hidden if path in paths] == []
    assert "/v1/chat/completions/render" in paths  # the schema is still the API's


@pytest.mark.parametrize(
    ("page", "assets"),
    [
        ("/docs", {"swagger-ui-bundle.js", "swagger-ui.css", "favicon.png"}),
        ("/redoc", {"redoc.standalone.js", "favicon.png"}),
    ],
)
def test_docs_use_only_files_the_server_serves(renderer: httpx.Client, page: str, assets: set[str]) -> None:
    html = renderer.get(page)
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    refs = references(html.text)
    assert sorted(refs) == sorted(f"{DOCS_ASSETS_PREFIX}/{name}" for name in assets)
    # The inline start-up script names only the schema's local URL.
    assert not EXTERNAL.findall(html.text), EXTERNAL.findall(html.text)
    assert "'/openapi.json'" in html.text or '"/openapi.json"' in html.text
    for ref in refs:
        answer = renderer.get(ref)
        assert answer.status_code == 200, ref
        assert (
            answer.headers["content-type"].split(";")[0] == DOCS_ASSETS[ref.rsplit("/", 1)[1]].split(";")[0]
        )
        assert len(answer.content) > 500, ref
    if page == "/docs":
        # The bundle is Swagger UI 5 (OpenAPI 3.1, what FastAPI writes), and the validator badge is off.
        bundle = renderer.get(f"{DOCS_ASSETS_PREFIX}/swagger-ui-bundle.js").content
        assert len(bundle) > 1_000_000 and b"SwaggerUIBundle" in bundle
        assert '"validatorUrl": null' in html.text
    else:
        # ReDoc's one fetch of its own, its side menu's logo, is the server's icon; nothing else may load.
        script = renderer.get(f"{DOCS_ASSETS_PREFIX}/redoc.standalone.js").content
        assert b"cdn.redoc.ly" not in script and b'"/docs/assets/favicon.png"' in script
        assert "default-src 'self'" in html.headers["content-security-policy"]


def test_unknown_docs_asset_is_404(renderer: httpx.Client) -> None:
    for name in ("nope.js", "LICENSE", "..%2F__init__.py"):
        answer = renderer.get(f"{DOCS_ASSETS_PREFIX}/{name}")
        assert answer.status_code == 404, name
        assert answer.json()["error"]["message"], name


# --- who gets the page: the API key, the worker's switch -------------------------------------------------


def test_page_answers_without_the_key_and_the_api_does_not() -> None:
    # Imported here: the router module hides torch from the process it is imported in, and collection would
    # otherwise do that to every test module collected after this one.
    from tokenfront.router.app import RouterSettings, create_router_app

    app = create_router_app(None, RouterSettings(), api_key="secret")
    client = TestClient(app)  # no lifespan: nothing to check, no worker
    for path in ("/", *PAGE_ASSETS):
        assert client.get(path).status_code == 200, path
    for path in (
        "/server_info",
        "/workers",
        "/docs",
        "/openapi.json",
        f"{DOCS_ASSETS_PREFIX}/swagger-ui.css",
    ):
        answer = client.get(path)
        assert answer.status_code == 401, path
        assert answer.json()["error"]["code"] == "invalid_api_key"
    authorized = client.get("/server_info", headers={"Authorization": "Bearer secret"})
    assert authorized.status_code == 200 and authorized.json()["role"] == "router"
    # The open paths answer their static GET and nothing else.
    assert client.post("/", json={}).status_code == 405


class _IdleEngine(Engine):
    """An engine that is never asked to generate: the worker app needs one to be built."""

    info = EngineInfo("idle", 16, "sha256", 1, 1024, "cpu")
    vocab_size = 49152

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def submit(self, request: GenerationRequest) -> GenerationStream:
        async def nothing() -> AsyncIterator[TokenOutput]:
            return
            yield

        return GenerationStream(request.request_id, 0, 0, nothing())

    def abort(self, request_id: str) -> None:
        pass

    def kv_events(self, after: int, limit: int = 1000, log_id: str | None = None) -> dict[str, Any]:
        return {"events": []}


@pytest.fixture(scope="module")
def tiny_pipeline(checkpoint: Callable[[str], Path]) -> RenderPipeline:
    return RenderPipeline.load(RenderOptions(model=str(checkpoint("tiny-random"))))


def test_worker_has_the_page_only_with_its_render_routes(tiny_pipeline: RenderPipeline) -> None:
    answers = {}
    for enabled in (False, True):
        client = TestClient(create_worker_app(tiny_pipeline, _IdleEngine(), enable_render_endpoints=enabled))
        answers[enabled] = (client.get("/").status_code, client.get("/inspector/inspector.js").status_code)
        # The page renders through these: without them it could only fail.
        assert (client.post("/detokenize", json={"tokens": [1]}).status_code == 200) is enabled
        assert client.get("/docs").status_code == 200  # the docs are every server's
    assert answers == {False: (404, 404), True: (200, 200)}
