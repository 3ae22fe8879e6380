"""`POST /tokenize` and `POST /detokenize` (docs/contract.md §11): vLLM 0.33's request and response schemas, on a real
`tokenfront render` process (Qwen3, `qwen3` reasoning parser).

Expected answers are vLLM's own, pinned in `data/vllm_protocol_pins.json`: written by
`python -m benchmarks.compare_vllm_protocol --write-pins` from vLLM 0.33's render server on the same checkpoint
(the script also compares both servers live). Where a value is checked beyond the pins, the source is the
`tokenizers` library reading the checkpoint's tokenizer.json, independent of tokenfront.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from checks import assert_error
from protocol_cases import DETOKENIZE_CASES, TOKENIZE_CASES
from tokenizers import Tokenizer

from tokenfront.renderer.routes import RENDER_PATHS

PINS = json.loads((Path(__file__).parent / "data" / "vllm_protocol_pins.json").read_text(encoding="utf-8"))
CHAT = "/v1/chat/completions/render"


@pytest.fixture(scope="module")
def client(qwen3_renderer: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=qwen3_renderer.url, timeout=30.0) as http:
        yield http


@pytest.fixture(scope="module")
def hf_tokenizer(qwen3: Path) -> Tokenizer:
    return Tokenizer.from_file(str(qwen3 / "tokenizer.json"))


def test_tokenize_answers_equal_vllms(client: httpx.Client) -> None:
    compared = 0
    for name, body in TOKENIZE_CASES:
        response = client.post("/tokenize", json=body)
        assert response.status_code == 200, (name, response.text)
        assert list(response.json()) == ["count", "max_model_len", "tokens", "token_strs"], name
        assert response.json() == PINS["tokenize"][name], name
        compared += 1
    assert compared == len(TOKENIZE_CASES) == 10


def test_detokenize_answers_equal_vllms(client: httpx.Client) -> None:
    compared = 0
    for name, body in DETOKENIZE_CASES:
        response = client.post("/detokenize", json=body)
        assert response.status_code == 200, (name, response.text)
        assert response.json() == PINS["detokenize"][name], name
        compared += 1
    assert compared == len(DETOKENIZE_CASES) == 5


def test_text_tokenize_fields(client: httpx.Client, hf_tokenizer: Tokenizer) -> None:
    text = "Hello<|im_end|> 你好 🌍"
    answer = client.post("/tokenize", json={"prompt": text, "return_token_strs": True}).json()
    expected = hf_tokenizer.encode(text, add_special_tokens=True)
    assert answer["tokens"] == expected.ids
    assert answer["token_strs"] == expected.tokens
    assert answer["count"] == len(answer["tokens"]) == 7
    assert answer["max_model_len"] == 32768  # Qwen3's config class default: vLLM's max_model_len
    assert client.post("/tokenize", json={"prompt": text}).json()["token_strs"] is None


def test_chat_tokenize_is_the_chat_render(client: httpx.Client) -> None:
    """The same messages give the same ids on /tokenize and on /v1/chat/completions/render."""
    for name, body in TOKENIZE_CASES:
        if "messages" not in body or body.get("tools") == []:  # the chat route refuses `tools: []`
            continue
        chat = {key: value for key, value in body.items() if key != "return_token_strs"}
        rendered = client.post(CHAT, json=chat)
        assert rendered.status_code == 200, (name, rendered.text)
        assert client.post("/tokenize", json=body).json()["tokens"] == rendered.json()["token_ids"], name


def test_detokenize_round_trips_text(client: httpx.Client) -> None:
    text = "  Mañana: 東京 🚀\n\tdef f(x): return x  "
    ids = client.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()["tokens"]
    assert client.post("/detokenize", json={"tokens": ids}).json() == {"prompt": text}


@pytest.mark.parametrize(
    ("route", "body", "status", "param", "code"),
    [
        ("/tokenize", {}, 400, None, None),
        ("/tokenize", {"prompt": ["a", "b"]}, 400, "prompt", None),
        ("/tokenize", {"messages": []}, 400, "messages", None),
        ("/tokenize", {"prompt": "x", "model": "nope"}, 404, "model", "model_not_found"),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ 'x' }}"},
            400,
            "chat_template",
            "chat_template_not_allowed",
        ),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": "Hi"}], "continue_final_message": True},
            400,
            "continue_final_message",
            None,
        ),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens", "token_id_out_of_vocabulary"),
        # vLLM 0.33 decodes an id past the vocabulary to ""; docs/contract.md §2 makes it a 400 (benchmarks list it).
        ("/detokenize", {"tokens": [9707, 151669]}, 400, "tokens", "token_id_out_of_vocabulary"),
        ("/detokenize", {"tokens": "9707"}, 400, "tokens", None),
        ("/detokenize", {}, 400, "tokens", None),
    ],
)
def test_refusals(
    client: httpx.Client, route: str, body: dict[str, Any], status: int, param: str | None, code: str | None
) -> None:
    error = assert_error(client.post(route, json=body), status, param=param, code=code)
    assert "Traceback" not in error["message"]


def test_detokenize_out_of_vocabulary_names_the_id(client: httpx.Client) -> None:
    error = assert_error(client.post("/detokenize", json={"tokens": [9707, 151669]}), 400)
    assert (
        error["message"] == "tokens[1] = 151669 is not a token id of this model (valid ids are 0 to 151668)"
    )


def test_routes_are_documented(client: httpx.Client) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert [path for path in RENDER_PATHS if "post" in paths.get(path, {})] == list(RENDER_PATHS)
    assert len(RENDER_PATHS) == 6
