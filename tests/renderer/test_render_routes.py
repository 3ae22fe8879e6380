"""HTTP-level tests of the standalone renderer (`tokenfront render`), against real server processes.

docs/contract.md §2 (render endpoints, errors), §6 (common routes, --api-key) and the reference text's examples.
Token ids are real Qwen3 ids; where a value is not copied from the reference text it is cross-checked with the
`tokenizers` library reading the checkpoint's own tokenizer.json (independent of tokenfront's pipeline).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from checks import RENDER_KEYS, assert_error, metric_value, raw_item_keys, raw_keys
from examples import FRANCE_IDS, REFERENCE_CHAT, REFERENCE_CHAT_IDS, REFERENCE_COMPLETION
from tokenizers import Tokenizer

CHAT = "/v1/chat/completions/render"
COMPLETIONS = "/v1/completions/render"

THINK_START, THINK_END, IM_END = 151667, 151668, 151645

CHAT_ID = re.compile(r"^chatcmpl-[0-9a-f]{32}$")
CMPL_ID = re.compile(r"^cmpl-([0-9a-f]{32})-(\d+)$")


# --- helpers ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_tokenizer(qwen3: Path) -> Tokenizer:
    """The checkpoint's tokenizer.json read by `tokenizers` directly: an independent source of expected ids."""
    return Tokenizer.from_file(str(qwen3 / "tokenizer.json"))


@pytest.fixture(scope="module")
def client(qwen3_renderer: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=qwen3_renderer.url, timeout=30.0) as http:
        yield http


# --- chat ------------------------------------------------------------------------------------------------


def test_reference_chat_example(client: httpx.Client, hf_tokenizer: Tokenizer) -> None:
    raw_body = json.dumps(REFERENCE_CHAT)
    response = client.post(CHAT, content=raw_body, headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert raw_keys(response.text) == RENDER_KEYS

    rendered = response.json()
    assert rendered["schema_version"] == 1
    assert rendered["kind"] == "chat"
    assert CHAT_ID.match(rendered["request_id"]), rendered["request_id"]
    assert rendered["token_ids"][:6] == [151644, 8948, 198, 2610, 525, 50537]
    assert rendered["token_ids"] == REFERENCE_CHAT_IDS
    chatml = (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nName three primary colors.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert rendered["token_ids"] == hf_tokenizer.encode(chatml, add_special_tokens=False).ids
    assert rendered["model"] == "Qwen3-0.6B"
    assert rendered["reasoning_ended"] is None
    assert rendered["reasoning_parser_kwargs"] == {"chat_template_kwargs": {}}
    assert rendered["cache_salt"] is None
    # The original body, unchanged: same values, same key order, `0` still an integer.
    assert rendered["request"] == REFERENCE_CHAT
    assert json.dumps(rendered["request"]) == raw_body
    assert isinstance(rendered["request"]["temperature"], int)


def test_chat_request_ids_are_fresh(client: httpx.Client) -> None:
    ids = {client.post(CHAT, json=REFERENCE_CHAT).json()["request_id"] for _ in range(3)}
    assert len(ids) == 3


def test_enable_thinking_false_ends_reasoning(client: httpx.Client) -> None:
    body = {**REFERENCE_CHAT, "chat_template_kwargs": {"enable_thinking": False}}
    response = client.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    rendered = response.json()
    # Qwen3 renders an empty, closed think block: "<think>\n\n</think>\n\n".
    assert rendered["token_ids"] == [*REFERENCE_CHAT_IDS, THINK_START, 271, THINK_END, 271]
    assert rendered["reasoning_ended"] is True
    assert rendered["reasoning_parser_kwargs"] == {"chat_template_kwargs": {"enable_thinking": False}}
    assert rendered["request"] == body


def test_enable_thinking_true_leaves_reasoning_open(client: httpx.Client) -> None:
    body = {**REFERENCE_CHAT, "chat_template_kwargs": {"enable_thinking": True}}
    rendered = client.post(CHAT, json=body).json()
    assert rendered["token_ids"] == REFERENCE_CHAT_IDS
    assert rendered["reasoning_ended"] is None
    assert rendered["reasoning_parser_kwargs"] == {"chat_template_kwargs": {"enable_thinking": True}}


def test_cache_salt_and_model_are_copied(client: httpx.Client) -> None:
    body = {**REFERENCE_CHAT, "cache_salt": "tenant-42"}
    rendered = client.post(CHAT, json=body).json()
    assert rendered["cache_salt"] == "tenant-42"
    assert rendered["model"] == "Qwen3-0.6B"
    assert rendered["token_ids"] == REFERENCE_CHAT_IDS

    completion = client.post(COMPLETIONS, json={**REFERENCE_COMPLETION, "cache_salt": "tenant-7"}).json()
    assert [item["cache_salt"] for item in completion] == ["tenant-7"]
    assert [item["model"] for item in completion] == ["Qwen3-0.6B"]


def test_body_without_model_renders_with_model_null(client: httpx.Client) -> None:
    body = {key: value for key, value in REFERENCE_CHAT.items() if key != "model"}
    response = client.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    rendered = response.json()
    assert rendered["model"] is None
    assert rendered["token_ids"] == REFERENCE_CHAT_IDS
    assert rendered["request"] == body
    assert "model" not in rendered["request"]

    response = client.post(COMPLETIONS, json={"prompt": "The capital of France is"})
    assert response.status_code == 200, response.text
    assert [(item["model"], item["token_ids"]) for item in response.json()] == [(None, FRANCE_IDS)]


def test_continue_final_message_leaves_the_last_turn_open(client: httpx.Client) -> None:
    body = {
        "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "The answer is"}],
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    response = client.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    ids = response.json()["token_ids"]
    # "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is" — no <|im_end|>.
    assert ids == [
        151644,
        872,
        198,
        87,
        IM_END,
        198,
        151644,
        77091,
        198,
        THINK_START,
        271,
        THINK_END,
        271,
        785,
        4226,
        374,
    ]


# --- completions -----------------------------------------------------------------------------------------


def test_reference_completion_example(client: httpx.Client) -> None:
    response = client.post(COMPLETIONS, json=REFERENCE_COMPLETION)
    assert response.status_code == 200, response.text
    assert raw_item_keys(response.text) == [RENDER_KEYS]
    [item] = response.json()
    assert item["schema_version"] == 1
    assert item["kind"] == "completion"
    match = CMPL_ID.match(item["request_id"])
    assert match and match.group(2) == "0", item["request_id"]
    assert item["token_ids"] == FRANCE_IDS
    assert item["model"] == "Qwen3-0.6B"
    assert item["reasoning_ended"] is None
    assert item["reasoning_parser_kwargs"] is None
    assert item["cache_salt"] is None
    assert item["request"] == REFERENCE_COMPLETION
    assert list(item["request"]) == list(REFERENCE_COMPLETION)


def _check_items(items: list[dict[str, Any]], body: dict[str, Any], prompts: list[Any]) -> None:
    assert len(items) == len(prompts)
    hexes = set()
    for index, (item, prompt) in enumerate(zip(items, prompts, strict=True)):
        assert item["kind"] == "completion"
        assert item["reasoning_parser_kwargs"] is None
        assert item["reasoning_ended"] is None
        match = CMPL_ID.match(item["request_id"])
        assert match, item["request_id"]
        assert int(match.group(2)) == index
        hexes.add(match.group(1))
        # Each item's request is the original body with its own prompt, as given.
        assert item["request"] == {**body, "prompt": prompt}
        assert list(item["request"]) == list(body)
    assert len(hexes) == 1, [item["request_id"] for item in items]


def test_completion_list_of_strings(client: httpx.Client, hf_tokenizer: Tokenizer) -> None:
    prompts = ["The capital of France is", "Hello, world", "def fib(n):"]
    body = {"model": "Qwen3-0.6B", "prompt": prompts, "max_tokens": 8, "temperature": 0}
    response = client.post(COMPLETIONS, json=body)
    assert response.status_code == 200, response.text
    assert raw_item_keys(response.text) == [RENDER_KEYS] * 3
    items = response.json()
    _check_items(items, body, prompts)
    assert items[0]["token_ids"] == FRANCE_IDS
    assert [item["token_ids"] for item in items] == [hf_tokenizer.encode(p).ids for p in prompts]


def test_completion_mixed_prompt_shapes_are_refused(client: httpx.Client) -> None:
    """A list mixing strings and id lists is none of the four prompt shapes (docs/contract.md §3; OpenAI and vLLM refuse it)."""
    prompts: list[Any] = ["The capital of France is", [785, 6722, 315], "The capital of France is"]
    response = client.post(COMPLETIONS, json={"model": "Qwen3-0.6B", "prompt": prompts, "max_tokens": 8})
    assert_error(
        response, 400, param="prompt", contains=("prompt has the wrong type", "list[int]", "list[str]")
    )


def test_completion_id_list_passes_through(client: httpx.Client) -> None:
    # Includes special tokens and the last id of the vocabulary: passed through unchanged, nothing added.
    ids = [151643, 785, 6722, 151644, 0, THINK_END]
    body = {"prompt": ids, "max_tokens": 4}
    response = client.post(COMPLETIONS, json=body)
    assert response.status_code == 200, response.text
    [item] = response.json()
    assert item["token_ids"] == ids
    assert item["request"] == body
    assert CMPL_ID.match(item["request_id"]).group(2) == "0"


def test_completion_list_of_id_lists(client: httpx.Client) -> None:
    prompts = [[785, 6722], [315, 9625, 374], [151643]]
    body = {"model": "Qwen3-0.6B", "prompt": prompts}
    response = client.post(COMPLETIONS, json=body)
    assert response.status_code == 200, response.text
    items = response.json()
    _check_items(items, body, prompts)
    assert [item["token_ids"] for item in items] == prompts


# --- errors ----------------------------------------------------------------------------------------------


def test_body_not_json(client: httpx.Client) -> None:
    for route in (CHAT, COMPLETIONS):
        response = client.post(route, content=b'{"messages": [', headers={"Content-Type": "application/json"})
        assert_error(response, 400, contains=("JSON",))


@pytest.mark.parametrize("raw", [b"[1, 2]", b'[{"prompt": "x"}]', b'"text"', b"null", b"42"])
def test_body_not_an_object(client: httpx.Client, raw: bytes) -> None:
    for route in (CHAT, COMPLETIONS):
        response = client.post(route, content=raw, headers={"Content-Type": "application/json"})
        assert_error(response, 400, contains=("object",))


def test_missing_messages(client: httpx.Client) -> None:
    response = client.post(CHAT, json={"model": "Qwen3-0.6B", "max_tokens": 3})
    assert_error(response, 400, param="messages", contains=("messages",))


def test_missing_prompt(client: httpx.Client) -> None:
    response = client.post(COMPLETIONS, json={"model": "Qwen3-0.6B"})
    assert_error(response, 400, param="prompt", contains=("prompt",))


def test_unknown_role(client: httpx.Client) -> None:
    response = client.post(CHAT, json={"messages": [{"role": "wizard", "content": "hi"}]})
    # The message names the field and the roles that are accepted.
    assert_error(response, 400, param="messages[0].role", contains=("role", "user", "assistant"))


def test_messages_of_the_wrong_type(client: httpx.Client) -> None:
    response = client.post(CHAT, json={"messages": "hi"})
    assert_error(response, 400, param="messages", contains=("messages", "list"))


def test_prompt_of_the_wrong_type(client: httpx.Client) -> None:
    """`param` is the request field (OpenAI's `param`), not a validator's internal union branch."""
    response = client.post(COMPLETIONS, json={"prompt": {"text": "hi"}})
    assert_error(response, 400, param="prompt", contains=("prompt",))


def test_field_of_the_wrong_type(client: httpx.Client) -> None:
    response = client.post(CHAT, json={**REFERENCE_CHAT, "temperature": "hot"})
    assert_error(response, 400, param="temperature", contains=("temperature",))


def test_image_part_is_not_yet_supported(client: httpx.Client) -> None:
    content = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    ]
    response = client.post(CHAT, json={"messages": [{"role": "user", "content": content}]})
    assert_error(response, 400, contains=("not yet supported",))


def test_audio_part_is_not_yet_supported(client: httpx.Client) -> None:
    content = [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]
    response = client.post(CHAT, json={"messages": [{"role": "user", "content": content}]})
    assert_error(response, 400, contains=("not yet supported",))


def test_request_chat_template_not_allowed_by_default(client: httpx.Client) -> None:
    body = {**REFERENCE_CHAT, "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}
    response = client.post(CHAT, json=body)
    assert_error(
        response,
        400,
        param="chat_template",
        code="chat_template_not_allowed",
        contains=("--allow-request-chat-template",),
    )


def test_continue_final_message_needs_add_generation_prompt_false(client: httpx.Client) -> None:
    body = {
        "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "The answer is"}],
        "continue_final_message": True,
    }
    assert_error(client.post(CHAT, json=body), 400, contains=("add_generation_prompt",))


@pytest.mark.parametrize(
    "prompt",
    [[785, 1_000_000], [-1], [785, -5, 6722], [[785], [6722, 10**12]]],
    ids=["too-large", "negative", "negative-inside", "in-second-list"],
)
def test_ids_outside_the_vocabulary(client: httpx.Client, prompt: list[Any]) -> None:
    response = client.post(COMPLETIONS, json={"prompt": prompt})
    error = assert_error(response, 400, contains=("token id",))
    assert error["param"] is not None and error["param"].startswith("prompt"), error


def test_empty_prompt_list(client: httpx.Client) -> None:
    assert_error(client.post(COMPLETIONS, json={"prompt": []}), 400, param="prompt", contains=("empty",))
    assert_error(client.post(COMPLETIONS, json={"prompt": [[]]}), 400, param="prompt", contains=("empty",))


def test_unknown_model(client: httpx.Client) -> None:
    for route, body in (
        (CHAT, {**REFERENCE_CHAT, "model": "gpt-4o"}),
        (COMPLETIONS, {**REFERENCE_COMPLETION, "model": "gpt-4o"}),
    ):
        response = client.post(route, json=body)
        assert_error(response, 404, param="model", code="model_not_found", contains=("gpt-4o", "Qwen3-0.6B"))


def test_unknown_route(client: httpx.Client) -> None:
    assert_error(client.post("/v1/chat/completions/rendr", json=REFERENCE_CHAT), 404)
    assert_error(client.get("/no/such/route"), 404)


def test_get_on_a_post_route(client: httpx.Client) -> None:
    for route in (CHAT, COMPLETIONS):
        assert_error(client.get(route), 405, contains=("GET",))


def test_no_client_input_gives_a_500(client: httpx.Client) -> None:
    """A batch of malformed bodies: every one is a 4xx in the OpenAI shape."""
    chat_bodies: list[Any] = [
        {"messages": []},
        {"messages": [{"content": "no role"}]},
        {"messages": [{"role": "user", "content": {"not": "a list"}}]},
        {"messages": [{"role": "user", "content": [1, 2]}]},
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "x"}}]}]},
        {"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}]},
        {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": "not an object"},
        {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"messages": []}},
        {"messages": [{"role": "user", "content": "x"}], "tools": "none"},
        {"messages": [{"role": "user", "content": "x"}], "model": 5},
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": -1},
        {"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]},
    ]
    completion_bodies: list[Any] = [
        {"prompt": [True]},
        {"prompt": [1.5]},
        {"prompt": None},
        {"prompt": ""},
        {"prompt": "x", "suffix": "y"},
        {"prompt": "x", "truncate_prompt_tokens": 0},
        {"prompt": "x", "echo": "yes"},
    ]
    for route, bodies in ((CHAT, chat_bodies), (COMPLETIONS, completion_bodies)):
        for body in bodies:
            response = client.post(route, json=body)
            assert 400 <= response.status_code < 500, (route, body, response.status_code, response.text)
            assert_error(response, response.status_code)


def test_template_raise_exception(server_factory: Callable[..., Any], qwen3: Path) -> None:
    """A template error raised by `raise_exception` is the client's 400, with the template's own message."""
    renderer = server_factory(
        "render", "--model", str(qwen3), "--chat-template", "{{ raise_exception('only tea is served here') }}"
    )
    response = httpx.post(
        f"{renderer.url}{CHAT}", json={"messages": [{"role": "user", "content": "coffee?"}]}
    )
    assert_error(response, 400, contains=("only tea is served here",))
    # Completions do not use the template.
    response = httpx.post(f"{renderer.url}{COMPLETIONS}", json={"prompt": "The capital of France is"})
    assert response.status_code == 200, response.text
    assert response.json()[0]["token_ids"] == FRANCE_IDS


def test_request_chat_template_when_allowed(
    server_factory: Callable[..., Any], qwen3: Path, hf_tokenizer: Tokenizer
) -> None:
    renderer = server_factory(
        "render",
        "--model",
        str(qwen3),
        "--allow-request-chat-template",
        "--reasoning-parser",
        "qwen3",
        "--served-model-name",
        "Qwen3-0.6B",
    )
    template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    body = {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        "chat_template": template,
    }
    response = httpx.post(f"{renderer.url}{CHAT}", json=body)
    assert response.status_code == 200, response.text
    rendered = response.json()
    expected = hf_tokenizer.encode("[system]Be brief.\n[user]hi\n>", add_special_tokens=False).ids
    assert rendered["token_ids"] == expected
    assert rendered["request"] == body
    # Without the field, the checkpoint's template is used as before.
    response = httpx.post(f"{renderer.url}{CHAT}", json=REFERENCE_CHAT)
    assert response.json()["token_ids"] == REFERENCE_CHAT_IDS
    # A request template that raises is still the client's 400; one that does not parse, too.
    response = httpx.post(
        f"{renderer.url}{CHAT}", json={**body, "chat_template": "{{ raise_exception('nope') }}"}
    )
    assert_error(response, 400, contains=("nope",))
    response = httpx.post(f"{renderer.url}{CHAT}", json={**body, "chat_template": "{% for %}"})
    assert_error(response, 400, param="chat_template")


def test_body_over_the_limit(server_factory: Callable[..., Any], qwen3: Path) -> None:
    renderer = server_factory("render", "--model", str(qwen3), "--max-body-bytes", "1000")
    small = {"prompt": "The capital of France is"}
    response = httpx.post(f"{renderer.url}{COMPLETIONS}", json=small)
    assert response.status_code == 200, response.text

    big = json.dumps({"prompt": "x" * 2000}).encode()
    for route in (COMPLETIONS, CHAT):
        response = httpx.post(
            f"{renderer.url}{route}", content=big, headers={"Content-Type": "application/json"}
        )
        assert_error(response, 413, contains=("1000",))

    # A chunked body (no Content-Length) over the limit is a 413 as well.
    def chunks() -> Iterator[bytes]:
        for start in range(0, len(big), 256):
            yield big[start : start + 256]

    response = httpx.post(
        f"{renderer.url}{COMPLETIONS}", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert "content-length" not in response.request.headers
    assert_error(response, 413, contains=("1000",))


# --- common routes ---------------------------------------------------------------------------------------


def test_health(client: httpx.Client) -> None:
    response = client.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_server_info(client: httpx.Client) -> None:
    response = client.get("/server_info")
    assert response.status_code == 200, response.text
    info = response.json()
    assert info["role"] == "renderer"
    assert info["model"] == "Qwen3-0.6B"
    assert info["schema_version"] == 1
    fingerprint = info["render_fingerprint"]
    assert set(fingerprint) == {"version", "digest", "compared", "complete", "incomplete_reasons", "info"}
    assert fingerprint["version"] == 1
    assert re.fullmatch(r"[0-9a-f]{64}", fingerprint["digest"])
    canonical = json.dumps(fingerprint["compared"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert fingerprint["digest"] == hashlib.sha256(canonical.encode()).hexdigest()
    assert isinstance(fingerprint["compared"], dict) and fingerprint["compared"]
    assert fingerprint["complete"] is True
    assert fingerprint["incomplete_reasons"] == []
    assert isinstance(fingerprint["info"], dict)
    # Not hashed: paths and names live in `info`, never in `compared`.
    assert "Qwen3-0.6B" not in json.dumps(fingerprint["compared"])
    assert "/checkpoints/qwen3" not in json.dumps(fingerprint["compared"])


def test_models(client: httpx.Client) -> None:
    response = client.get("/v1/models")
    assert response.status_code == 200, response.text
    listing = response.json()
    assert listing["object"] == "list"
    assert [model["id"] for model in listing["data"]] == ["Qwen3-0.6B"]
    assert all(model["object"] == "model" for model in listing["data"])


def test_metrics_count_render_requests(client: httpx.Client) -> None:
    def scrape() -> str:
        response = client.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        return response.text

    before = scrape()
    for _ in range(2):
        assert client.post(CHAT, json=REFERENCE_CHAT).status_code == 200
    assert client.post(COMPLETIONS, json={"prompt": ["a", "b", "c"]}).status_code == 200
    assert client.post(COMPLETIONS, json={"prompt": []}).status_code == 400
    after = scrape()

    def delta(name: str, labels: str) -> float:
        return metric_value(after, name, labels) - metric_value(before, name, labels)

    assert delta("tokenfront_rendered_prompts_total", 'kind="chat"') == 2
    assert delta("tokenfront_rendered_prompts_total", 'kind="completion"') == 3
    assert delta("tokenfront_rendered_tokens_total", 'kind="chat"') == 2 * len(REFERENCE_CHAT_IDS)
    assert delta("tokenfront_requests_total", f'route="{CHAT}",status="200"') == 2
    assert delta("tokenfront_requests_total", f'route="{COMPLETIONS}",status="200"') == 1
    assert delta("tokenfront_requests_total", f'route="{COMPLETIONS}",status="400"') == 1


def test_openapi_and_docs(client: httpx.Client) -> None:
    response = client.get("/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    assert "post" in paths[CHAT]
    assert "post" in paths[COMPLETIONS]
    docs = client.get("/docs")
    assert docs.status_code == 200
    assert docs.headers["content-type"].startswith("text/html")


# --- --api-key, shutdown ---------------------------------------------------------------------------------


def test_api_key(server_factory: Callable[..., Any], qwen3: Path) -> None:
    renderer = server_factory("render", "--model", str(qwen3), "--api-key", "secret")
    url = renderer.url
    assert_error(httpx.post(f"{url}{CHAT}", json=REFERENCE_CHAT | {"model": None}), 401, contains=("Bearer",))
    assert_error(
        httpx.post(f"{url}{COMPLETIONS}", json={"prompt": "x"}, headers={"Authorization": "Bearer wrong"}),
        401,
    )
    assert_error(httpx.get(f"{url}/server_info"), 401)
    assert_error(httpx.get(f"{url}/v1/models"), 401)

    ok = {"Authorization": "Bearer secret"}
    response = httpx.post(f"{url}{COMPLETIONS}", json={"prompt": "The capital of France is"}, headers=ok)
    assert response.status_code == 200, response.text
    assert response.json()[0]["token_ids"] == FRANCE_IDS
    response = httpx.post(f"{url}{CHAT}", json=REFERENCE_CHAT | {"model": None}, headers=ok)
    assert response.status_code == 200, response.text
    assert response.json()["token_ids"] == REFERENCE_CHAT_IDS
    assert httpx.get(f"{url}/server_info", headers=ok).json()["role"] == "renderer"

    health = httpx.get(f"{url}/health")
    assert health.status_code == 200
    assert health.json() == {"status": "ok"}


def test_graceful_shutdown(server_factory: Callable[..., Any], qwen3: Path) -> None:
    renderer = server_factory("render", "--model", str(qwen3))
    response = httpx.post(f"{renderer.url}{COMPLETIONS}", json={"prompt": "The capital of France is"})
    assert response.status_code == 200
    assert renderer.stop() == 0, renderer.log()
    assert "Traceback" not in renderer.log()


def test_json_body_without_json_content_type_says_what_to_do(client: httpx.Client) -> None:
    # curl's plain `-d` sends application/x-www-form-urlencoded; the message must name the missing header.
    response = client.post(
        COMPLETIONS,
        content=b'{"prompt": "hi"}',
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert_error(response, 400, contains=("Content-Type: application/json",))
