"""The Python client (`tokenfront.client`, issue 11): the reference recipes' flow as methods, sync and async.

The end-to-end tests (marked slow) start, for the module, a real `tokenfront render` and a real `tokenfront
serve` on SmolLM2-135M-Instruct with the same options and served model name, plus a renderer that wants an
API key; each flow runs once with `Client` and once with `AsyncClient` (the `api` fixture gives both the same
synchronous face). What the worker received is read off its `/metrics`:
`tokenfront_worker_prompts_total{route, source}` counts prompts given as ids (`token_ids`) apart from prompts
it rendered itself (`rendered`). The fast tests check the pure parts (the worker bodies, the error mapping,
the event-stream reader) and the client against small real HTTP servers on loopback: unreachable ports,
scripted event streams.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import dataclasses
import io
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokenfront.client import (
    APIConnectionError,
    APIError,
    AsyncClient,
    AuthenticationError,
    BadRequestError,
    Client,
    InvalidResponseError,
    NotFoundError,
    RenderedChat,
    RenderedCompletion,
    ServerError,
    StreamError,
    TokenfrontError,
)
from tokenfront.client._exceptions import api_error
from tokenfront.client._streaming import DONE, decode_event_line

ROOT = Path(__file__).resolve().parents[2]
CLIENT_PACKAGE = ROOT / "src" / "tokenfront" / "client"
DOCS = ROOT / "docs" / "client.md"

MODEL = "smollm2-client"
FRANCE: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "max_tokens": 24,
    "temperature": 0,
}
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
NAMED_TOOL: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "What will the weather be in Lyon for the next three days?"}],
    "tools": [WEATHER_TOOL],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "max_tokens": 48,
    "temperature": 0,
}
# The reference text's chat render answer (its `token_ids` shortened).
REFERENCE_ANSWER: dict[str, Any] = {
    "schema_version": 1,
    "kind": "chat",
    "request_id": "chatcmpl-9651e194058642d9b538b695bb179c68",
    "token_ids": [151644, 8948, 198, 2610, 525, 50537],
    "model": "Qwen3-0.6B",
    "reasoning_ended": None,
    "reasoning_parser_kwargs": {"chat_template_kwargs": {}},
    "cache_salt": None,
    "request": {
        "model": "Qwen3-0.6B",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name three primary colors."},
        ],
        "max_tokens": 24,
        "temperature": 0,
    },
}


# --- the worker bodies: what the recipes send --------------------------------------------------------------


def test_chat_goes_as_request_plus_prompt_token_ids() -> None:
    rendered = RenderedChat.from_json(REFERENCE_ANSWER)
    assert rendered.request_id == REFERENCE_ANSWER["request_id"]
    assert rendered.model == "Qwen3-0.6B"
    assert rendered.reasoning_parser_kwargs == {"chat_template_kwargs": {}}
    assert rendered.cache_salt is None
    assert rendered.schema_version == 1 and rendered.kind == "chat"
    assert rendered.worker_path == "/v1/chat/completions"
    # The recipe: {**rendered["request"], "prompt_token_ids": rendered["token_ids"]}
    assert rendered.worker_body() == {
        **REFERENCE_ANSWER["request"],
        "prompt_token_ids": REFERENCE_ANSWER["token_ids"],
    }
    assert rendered.sends_token_ids is True
    # The body is a copy: changing it leaves the rendered request as the renderer answered it.
    rendered.worker_body()["model"] = "other"
    assert rendered.request["model"] == "Qwen3-0.6B"


@pytest.mark.parametrize(
    ("tool_choice", "named"),
    [
        ({"type": "function", "function": {"name": "get_weather"}}, True),
        ("required", False),
        ("auto", False),
        ("none", False),
        (None, False),
    ],
)
def test_only_a_named_tool_choice_goes_as_the_original_body(tool_choice: Any, named: bool) -> None:
    request = {**NAMED_TOOL, "tool_choice": tool_choice, "cache_salt": "salt-1"}
    answer = {**REFERENCE_ANSWER, "request": request, "cache_salt": "salt-1"}
    rendered = RenderedChat.from_json(answer)
    assert rendered.named_tool_choice is named
    assert rendered.sends_token_ids is not named
    expected = request if named else {**request, "prompt_token_ids": REFERENCE_ANSWER["token_ids"]}
    assert rendered.worker_body() == expected
    # cache_salt is carried by the request itself, whichever body goes.
    assert rendered.worker_body()["cache_salt"] == "salt-1" == rendered.cache_salt


def test_completion_items_go_with_their_ids_as_the_prompt() -> None:
    request: dict[str, Any] = {"model": "Qwen3-0.6B", "prompt": ["The capital of France is", "Hi"]}
    ids = [[785, 6722, 315, 9625, 374], [13048]]
    answer = [
        {
            **REFERENCE_ANSWER,
            "kind": "completion",
            "request_id": f"cmpl-1-{index}",
            "token_ids": ids[index],
            "reasoning_parser_kwargs": None,
            "request": {**request, "prompt": prompt},
        }
        for index, prompt in enumerate(request["prompt"])
    ]
    items = RenderedCompletion.list_from_json(answer)
    assert [item.request_id for item in items] == ["cmpl-1-0", "cmpl-1-1"]
    assert [item.worker_body() for item in items] == [
        {**request, "prompt": [785, 6722, 315, 9625, 374]},
        {**request, "prompt": [13048]},
    ]
    assert {item.worker_path for item in items} == {"/v1/completions"}


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ({**REFERENCE_ANSWER, "schema_version": 2}, "schema_version 2; this client reads 1"),
        ({**REFERENCE_ANSWER, "kind": "completion"}, "of kind 'chat', got 'completion'"),
        ({**REFERENCE_ANSWER, "token_ids": [1, "2"]}, "token_ids is not a list of integers"),
        ({**REFERENCE_ANSWER, "token_ids": [1, True]}, "token_ids is not a list of integers"),
        ({**REFERENCE_ANSWER, "request": "body"}, "request is not a JSON object"),
        ([REFERENCE_ANSWER], "a JSON object), got a list"),
    ],
)
def test_an_answer_that_is_not_a_render_answer_is_refused(answer: Any, message: str) -> None:
    with pytest.raises(InvalidResponseError, match=re.escape(message)) as caught:
        RenderedChat.from_json(answer, url="http://host/v1/chat/completions/render")
    assert caught.value.url == "http://host/v1/chat/completions/render"


def test_a_completions_answer_must_be_a_non_empty_list() -> None:
    with pytest.raises(InvalidResponseError, match="got an empty list"):
        RenderedCompletion.list_from_json([])
    with pytest.raises(InvalidResponseError, match="got an object"):
        RenderedCompletion.list_from_json({**REFERENCE_ANSWER, "kind": "completion"})


# --- errors: the OpenAI error as an exception ----------------------------------------------------------------


def test_api_errors_carry_the_openai_error() -> None:
    body = {
        "error": {
            "message": "invalid request: temperature: Input should be a valid number",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": None,
        }
    }
    error = api_error(400, body, url="http://r/v1/chat/completions/render")
    assert type(error) is BadRequestError
    assert (error.status_code, error.type, error.param, error.code) == (
        400,
        "invalid_request_error",
        "temperature",
        None,
    )
    assert error.message == "invalid request: temperature: Input should be a valid number"
    assert error.body == body
    assert str(error) == (
        "400 from POST http://r/v1/chat/completions/render: invalid request: temperature: "
        "Input should be a valid number (param=temperature)"
    )
    classes = {status: type(api_error(status, body, url="u")) for status in (401, 404, 422, 499, 503, 508)}
    assert classes == {
        401: AuthenticationError,
        404: NotFoundError,
        422: APIError,
        499: APIError,
        503: ServerError,
        508: ServerError,
    }
    # An answer that is not an OpenAI error (a proxy's page) keeps its text as the message.
    page = api_error(502, "<html>Bad Gateway</html>", url="u")
    assert type(page) is ServerError
    assert (page.message, page.type, page.param, page.code) == ("<html>Bad Gateway</html>", None, None, None)
    assert all(issubclass(cls, TokenfrontError) for cls in classes.values())


def test_event_stream_lines() -> None:
    url = "http://w/v1/chat/completions"
    assert decode_event_line('data: {"choices": []}', url=url) == {"choices": []}
    assert decode_event_line('data:{"a":1}', url=url) == {"a": 1}
    assert decode_event_line("data: [DONE]", url=url) == DONE
    for ignored in ("", ": keep-alive", "event: message", "id: 7", "retry: 100"):
        assert decode_event_line(ignored, url=url) is None
    with pytest.raises(StreamError) as caught:
        decode_event_line(
            'data: {"error": {"message": "generation failed", "type": "server_error", "param": null, '
            '"code": "engine"}}',
            url=url,
        )
    assert (caught.value.status_code, caught.value.type, caught.value.code) == (
        None,
        "server_error",
        "engine",
    )
    assert str(caught.value) == f"error in POST {url}: generation failed (code=engine)"
    with pytest.raises(InvalidResponseError, match="not JSON"):
        decode_event_line("data: {oops", url=url)
    with pytest.raises(InvalidResponseError, match="not a JSON object"):
        decode_event_line("data: [1, 2]", url=url)


def test_the_callers_mistakes_are_value_errors() -> None:
    with pytest.raises(ValueError, match="give renderer_url"):
        Client()
    rendered = RenderedChat.from_json(REFERENCE_ANSWER)
    with Client("http://127.0.0.1:9") as render_only:
        assert render_only.worker_url is None
        with pytest.raises(ValueError, match="no worker_url"):
            render_only.send_rendered(rendered)
    streaming = dataclasses.replace(rendered, request={**rendered.request, "stream": True})
    with Client(worker_url="http://127.0.0.1:9/") as client:
        # The renderer defaults to the worker (a worker with render endpoints renders too).
        assert client.renderer_url == client.worker_url == "http://127.0.0.1:9"
        with pytest.raises(ValueError, match="use stream_rendered"):
            client.send_rendered(streaming)
        with pytest.raises(TypeError, match="got dict"):
            client.send_rendered([REFERENCE_ANSWER])  # type: ignore[list-item]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_server_is_a_connection_error_naming_it() -> None:
    renderer, worker = f"http://127.0.0.1:{_closed_port()}", f"http://127.0.0.1:{_closed_port()}"
    rendered = RenderedChat.from_json(REFERENCE_ANSWER)
    with Client(renderer, worker, timeout=5.0) as client:
        with pytest.raises(
            APIConnectionError, match=f"could not reach the renderer at {renderer}/"
        ) as caught:
            client.render_chat(FRANCE)
        assert caught.value.url == f"{renderer}/v1/chat/completions/render"
        with pytest.raises(APIConnectionError, match=f"could not reach the worker at {worker}/"):
            client.send_rendered(rendered)
        with pytest.raises(APIConnectionError, match="the worker"):
            client.stream_rendered(rendered)

    async def main() -> list[str]:
        messages = []
        async with AsyncClient(renderer, worker, timeout=5.0) as client:
            for call in (client.render_completion({"prompt": "x"}), client.send_rendered(rendered)):
                try:
                    await call
                except APIConnectionError as exc:
                    messages.append(exc.message)
        return messages

    messages = asyncio.run(main())
    assert len(messages) == 2
    assert messages[0].startswith(f"could not reach the renderer at {renderer}/v1/completions/render")
    assert messages[1].startswith(f"could not reach the worker at {worker}/v1/chat/completions")


class ScriptedServer:
    """A real HTTP server on loopback that answers every POST with one scripted answer and records bodies."""

    def __init__(self, status: int, content_type: str, payload: bytes) -> None:
        self.received: list[tuple[str, bytes, str | None]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.received.append((self.path, body, self.headers.get("Authorization")))
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Connection", "close")
                self.end_headers()  # no Content-Length: the body ends when the connection closes
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _chunk(text: str) -> bytes:
    return b'data: {"choices": [{"index": 0, "delta": {"content": "%s"}}]}\n\n' % text.encode()


def _contents(chunks: list[dict[str, Any]]) -> str:
    return "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks)


@pytest.mark.parametrize(
    ("payload", "error", "message"),
    [
        (_chunk("Par") + _chunk("is") + b"data: [DONE]\n\n", None, None),
        (
            _chunk("Par")
            + b'data: {"error": {"message": "generation failed", "type": "server_error"}}\n\ndata: [DONE]\n\n',
            StreamError,
            "generation failed",
        ),
        (_chunk("Par"), APIConnectionError, "ended before `data: [DONE]`"),
        (_chunk("Par") + b"data: {oops\n\n", InvalidResponseError, "not JSON"),
    ],
)
def test_streams_sync_and_async(payload: bytes, error: type[Exception] | None, message: str | None) -> None:
    rendered = RenderedChat.from_json(REFERENCE_ANSWER)
    with ScriptedServer(200, "text/event-stream", payload) as worker:

        def read_sync() -> tuple[list[dict[str, Any]], Exception | None]:
            chunks: list[dict[str, Any]] = []
            with Client(worker_url=worker.url, api_key="k1") as client, client.stream_rendered(rendered) as s:
                try:
                    chunks.extend(s)
                except TokenfrontError as exc:
                    return chunks, exc
            return chunks, None

        async def read_async() -> tuple[list[dict[str, Any]], Exception | None]:
            chunks: list[dict[str, Any]] = []
            async with (
                AsyncClient(worker_url=worker.url, api_key="k1") as client,
                await client.stream_rendered(rendered) as stream,
            ):
                try:
                    async for chunk in stream:
                        chunks.append(chunk)
                except TokenfrontError as exc:
                    return chunks, exc
            return chunks, None

        results = [read_sync(), asyncio.run(read_async())]
    assert len(results) == 2
    for chunks, raised in results:
        assert _contents(chunks) == ("Paris" if error is None else "Par")
        if error is None:
            assert raised is None
        else:
            assert type(raised) is error, raised
            assert message is not None and message in str(raised)
    # Both streamed requests were the recipe's body with "stream": true, sent with the key.
    expected = {
        **REFERENCE_ANSWER["request"],
        "prompt_token_ids": REFERENCE_ANSWER["token_ids"],
        "stream": True,
    }
    assert [
        (path, httpx.Response(200, content=body).json(), auth) for path, body, auth in worker.received
    ] == [("/v1/chat/completions", expected, "Bearer k1")] * 2


def test_a_2xx_answer_that_is_not_json_is_an_invalid_response() -> None:
    with (
        ScriptedServer(200, "text/html", b"<html>welcome</html>") as server,
        Client(server.url) as client,
        pytest.raises(InvalidResponseError, match="renderer answered 200 with a body that is not JSON"),
    ):
        client.render_chat(FRANCE)


def test_an_error_answer_to_a_stream_raises_before_the_first_chunk() -> None:
    body = b'{"error": {"message": "busy", "type": "service_unavailable", "param": null, "code": "shutting"}}'
    rendered = RenderedChat.from_json(REFERENCE_ANSWER)
    with (
        ScriptedServer(503, "application/json", body) as worker,
        Client(worker_url=worker.url) as client,
        pytest.raises(ServerError) as caught,
    ):
        client.stream_rendered(rendered)
    assert (caught.value.status_code, caught.value.code, caught.value.message) == (503, "shutting", "busy")


# --- the client is a client: what it imports ----------------------------------------------------------------


def test_the_client_imports_only_httpx_orjson_and_itself() -> None:
    files = sorted(CLIENT_PACKAGE.glob("*.py"))
    assert len(files) == 5
    stdlib = set(sys.stdlib_module_names)
    imported = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
    foreign = {name for name in imported if name.split(".")[0] not in stdlib}
    assert foreign - {"httpx", "orjson"} == {
        "tokenfront.client._client",
        "tokenfront.client._exceptions",
        "tokenfront.client._models",
        "tokenfront.client._streaming",
    }


def test_importing_the_client_loads_no_server_and_no_torch() -> None:
    code = (
        "import sys, tokenfront.client\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'fastapi', 'starlette', 'uvicorn')\n"
        "       or m.startswith(('tokenfront.server', 'tokenfront.worker', 'tokenfront.router',"
        " 'tokenfront.renderer'))]\n"
        "print(sorted(bad))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# --- against a real renderer and worker ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def servers(
    launch: Callable[..., Any], checkpoint: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """A renderer and a worker on SmolLM2 with the same options, and a renderer that wants an API key."""
    log_dir = tmp_path_factory.mktemp("client-servers")
    options = ["--model", str(checkpoint("smollm2")), "--tool-call-parser", "hermes"]
    options += ["--served-model-name", MODEL]
    started: dict[str, Any] = {}
    try:
        started["renderer"] = launch(["render", *options], log_dir=log_dir)
        started["keyed_renderer"] = launch(["render", *options, "--api-key", "s3cret"], log_dir=log_dir)
        started["worker"] = launch(["serve", *options], log_dir=log_dir, timeout=240.0)
        yield started
    finally:
        codes = {name: server.stop() for name, server in started.items()}
        assert codes == dict.fromkeys(started, 0), codes


class Awaited:
    """An `AsyncClient` behind the `Client` methods the tests call, each awaited on one event loop (kept
    for the client's life, so its pooled connections stay on their loop)."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.loop = asyncio.new_event_loop()

    def render_chat(self, body: dict[str, Any]) -> RenderedChat:
        return self.loop.run_until_complete(self.client.render_chat(body))

    def render_completion(self, body: dict[str, Any]) -> list[RenderedCompletion]:
        return self.loop.run_until_complete(self.client.render_completion(body))

    def send_rendered(self, rendered: Any) -> Any:
        return self.loop.run_until_complete(self.client.send_rendered(rendered))

    def stream_rendered(self, rendered: Any) -> list[dict[str, Any]]:
        async def read() -> list[dict[str, Any]]:
            async with await self.client.stream_rendered(rendered) as stream:
                return [chunk async for chunk in stream]

        return self.loop.run_until_complete(read())

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()


class Synchronous:
    """A `Client`, with `stream_rendered` read to a list as `Awaited` reads it."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.render_chat = client.render_chat
        self.render_completion = client.render_completion
        self.send_rendered = client.send_rendered

    def stream_rendered(self, rendered: Any) -> list[dict[str, Any]]:
        with self.client.stream_rendered(rendered) as stream:
            return list(stream)

    def close(self) -> None:
        self.client.close()


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest, servers: dict[str, Any]) -> Iterator[Any]:
    urls = (servers["renderer"].url, servers["worker"].url)
    face = Synchronous(Client(*urls)) if request.param == "sync" else Awaited(AsyncClient(*urls))
    yield face
    face.close()


@pytest.fixture
def worker(servers: dict[str, Any]) -> Iterator[httpx.Client]:
    """A plain httpx client on the worker: the worker's own answers, and its /metrics."""
    with httpx.Client(base_url=servers["worker"].url, timeout=120.0) as client:
        yield client


def prompts(worker: httpx.Client, route: str) -> dict[str, float]:
    """`tokenfront_worker_prompts_total{route=route}` by source, off the worker's /metrics."""
    counts = {"token_ids": 0.0, "rendered": 0.0}
    for family in text_string_to_metric_families(worker.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "tokenfront_worker_prompts_total" and sample.labels.get("route") == route:
                counts[sample.labels["source"]] = float(sample.value)
    return counts


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {source: after[source] - before[source] for source in before}


@pytest.mark.slow
def test_chat_render_then_send_gives_the_workers_own_answer(api: Any, worker: httpx.Client) -> None:
    rendered = api.render_chat(FRANCE)
    assert rendered.request == FRANCE
    assert rendered.model == MODEL and rendered.cache_salt is None
    assert rendered.request_id.startswith("chatcmpl-")
    assert len(rendered.token_ids) > 10 and rendered.sends_token_ids

    before = prompts(worker, "chat")
    answer = api.send_rendered(rendered)
    # The worker took the ids: one prompt given as token ids, none rendered.
    assert delta(before, prompts(worker, "chat")) == {"token_ids": 1.0, "rendered": 0.0}
    assert answer["usage"]["prompt_tokens"] == len(rendered.token_ids)

    own = worker.post("/v1/chat/completions", json=FRANCE)
    assert own.status_code == 200, own.text
    content = answer["choices"][0]["message"]["content"]
    assert content == own.json()["choices"][0]["message"]["content"]
    assert "Paris" in content
    assert answer["choices"][0]["finish_reason"] == own.json()["choices"][0]["finish_reason"]


@pytest.mark.slow
def test_completions_with_two_prompts_go_one_request_per_item(api: Any, worker: httpx.Client) -> None:
    body = {"model": MODEL, "prompt": ["The capital of France is", "Water boils at"], "max_tokens": 8}
    body["temperature"] = 0
    items = api.render_completion(body)
    assert [item.request["prompt"] for item in items] == body["prompt"]
    assert all(item.request == {**body, "prompt": item.request["prompt"]} for item in items)

    before = prompts(worker, "completion")
    answers = api.send_rendered(items)
    assert delta(before, prompts(worker, "completion")) == {"token_ids": 2.0, "rendered": 0.0}

    own = worker.post("/v1/completions", json=body).json()
    texts = {choice["index"]: choice["text"] for choice in own["choices"]}
    compared = 0
    for index, (item, answer) in enumerate(zip(items, answers, strict=True)):
        assert answer["choices"][0]["text"] == texts[index]
        assert answer["usage"]["prompt_tokens"] == len(item.token_ids)
        compared += 1
    assert compared == 2
    # One item alone is one request with one answer.
    assert api.send_rendered(items[1])["choices"][0]["text"] == texts[1]


@pytest.mark.slow
def test_a_named_tool_choice_goes_as_the_original_body(api: Any, worker: httpx.Client) -> None:
    rendered = api.render_chat(NAMED_TOOL)
    assert rendered.named_tool_choice and not rendered.sends_token_ids

    before = prompts(worker, "chat")
    answer = api.send_rendered(rendered)
    # The worker rendered it itself (with the forced-call prefix): no ids were sent.
    assert delta(before, prompts(worker, "chat")) == {"token_ids": 0.0, "rendered": 1.0}
    [choice] = answer["choices"]
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert set(httpx.Response(200, content=call["function"]["arguments"]).json()) == {"city", "days"}

    # What the client avoids: the same request with the ids is the worker's 400.
    with_ids = worker.post(
        "/v1/chat/completions", json={**NAMED_TOOL, "prompt_token_ids": rendered.token_ids}
    )
    assert with_ids.status_code == 400
    assert with_ids.json()["error"]["code"] == "named_tool_choice_with_ids"


@pytest.mark.slow
def test_a_stream_gives_the_answers_chunks(api: Any, worker: httpx.Client) -> None:
    rendered = api.render_chat({**FRANCE, "stream": True})
    with pytest.raises(ValueError, match="use stream_rendered"):
        api.send_rendered(rendered)
    before = prompts(worker, "chat")
    chunks = api.stream_rendered(rendered)
    assert delta(before, prompts(worker, "chat")) == {"token_ids": 1.0, "rendered": 0.0}
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert chunks[-1]["choices"][0]["finish_reason"] is not None
    own = worker.post("/v1/chat/completions", json=FRANCE).json()
    assert _contents(chunks) == own["choices"][0]["message"]["content"]
    assert "Paris" in _contents(chunks)


@pytest.mark.slow
def test_a_bad_body_raises_with_the_openai_error(api: Any) -> None:
    with pytest.raises(BadRequestError) as caught:
        api.render_chat({**FRANCE, "temperature": "hot"})
    error = caught.value
    assert (error.status_code, error.type, error.param, error.code) == (
        400,
        "invalid_request_error",
        "temperature",
        None,
    )
    assert "temperature" in error.message
    assert error.url.endswith("/v1/chat/completions/render")

    # The worker's own 400: ids outside the vocabulary, sent through send_rendered.
    rendered = api.render_chat(FRANCE)
    with pytest.raises(BadRequestError) as caught:
        api.send_rendered(dataclasses.replace(rendered, token_ids=[*rendered.token_ids, 10**9]))
    error = caught.value
    assert (error.status_code, error.param, error.code) == (
        400,
        "prompt_token_ids",
        "token_id_out_of_vocabulary",
    )
    assert error.url.endswith("/v1/chat/completions") and "/render" not in error.url
    with pytest.raises(BadRequestError, match="token_id_out_of_vocabulary"):
        api.stream_rendered(dataclasses.replace(rendered, token_ids=[10**9]))


@pytest.mark.slow
def test_another_model_name_raises_not_found(api: Any) -> None:
    with pytest.raises(NotFoundError) as caught:
        api.render_completion({"model": "gpt-4", "prompt": "Hello"})
    assert (caught.value.status_code, caught.value.param, caught.value.code) == (
        404,
        "model",
        "model_not_found",
    )
    assert MODEL in caught.value.message
    # The worker's 404 for a rendered request renamed on the way.
    rendered = api.render_chat(FRANCE)
    with pytest.raises(NotFoundError) as caught:
        api.send_rendered(dataclasses.replace(rendered, request={**rendered.request, "model": "gpt-4"}))
    assert (caught.value.status_code, caught.value.code) == (404, "model_not_found")
    assert caught.value.url.endswith("/v1/chat/completions")


@pytest.mark.slow
def test_api_keys_go_to_their_server(servers: dict[str, Any]) -> None:
    keyed, worker_url = servers["keyed_renderer"].url, servers["worker"].url
    # The renderer's key goes to the renderer only: the worker (without a key) answers too.
    with Client(keyed, worker_url, renderer_api_key="s3cret") as client:
        answer = client.send_rendered(client.render_chat(FRANCE))
        assert "Paris" in answer["choices"][0]["message"]["content"]
    refused = 0
    for key in (None, "wrong"):
        with Client(keyed, api_key=key) as client, pytest.raises(AuthenticationError) as caught:
            client.render_chat(FRANCE)
        assert caught.value.status_code == 401
        refused += 1
    assert refused == 2


# --- docs/client.md: the examples run as written --------------------------------------------------------------


def docs_examples() -> list[tuple[str, str | None]]:
    """The python blocks of docs/client.md that are programs (they import the client; the others show a
    signature), each with the output the page shows for it: the first text block before the next python
    block, if any."""
    blocks = re.findall(r"```(python|text)\n(.*?)```", DOCS.read_text(), flags=re.S)
    examples: list[tuple[str, str | None]] = []
    for language, text in blocks:
        if language == "python":
            examples.append((text, None))
        elif examples and examples[-1][1] is None:
            examples[-1] = (examples[-1][0], text)
    return [(code, shown) for code, shown in examples if "from tokenfront.client import" in code]


def test_the_docs_examples_are_found() -> None:
    examples = docs_examples()
    assert len(examples) == 6
    assert sum(shown is not None for _, shown in examples) == 3


@pytest.mark.slow
def test_the_docs_examples_run_as_written(servers: dict[str, Any]) -> None:
    outputs = []
    for block, shown in docs_examples():
        code = block.replace("http://127.0.0.1:8100", servers["renderer"].url)
        code = code.replace("http://127.0.0.1:8000", servers["worker"].url)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, str(DOCS), "exec"), {"__name__": "docs_example"})
        # What the page says it prints, it prints (greedy decoding on the same checkpoint).
        assert shown is None or out.getvalue() == shown, (out.getvalue(), shown)
        outputs.append(out.getvalue())
    chat, tool, completions, stream, asynchronous, errors = outputs
    assert re.fullmatch(r"\d+ prompt tokens; ids sent: True\nTrue\n.*Paris.*\n", chat, flags=re.S), chat
    assert re.fullmatch(r"ids sent: False\nget_weather \{.*\"city\".*\}\n", tool), tool
    lines = completions.splitlines()
    assert len(lines) == 2 and lines[0].startswith("'The capital of France is' -> '")
    assert "Paris" in stream and stream.endswith("\n")
    first, second = asynchronous.splitlines()
    assert first == second == chat.splitlines()[2]  # streamed or not, the same greedy answer
    assert stream.splitlines() == [first]
    assert errors.splitlines() == [
        "400 temperature invalid request: temperature: Input should be a valid number",
        "404 model_not_found",
        "unreachable: http://127.0.0.1:9/v1/chat/completions/render",
    ]
