"""The reference text's client recipes, run verbatim against a real renderer (docs/contract.md §2).

The recipes are copied character for character from `reference/render-endpoints.txt` (the user's own
description); when that file is present, the test checks the copies still match it. `$WORKER` is a small
real HTTP server started by the test that records the JSON bodies it receives and answers `{}`.

The README's quick start (its `request.json` and the chat recipe with `$WORKER` rendering too) is run as
written against a real worker started as `make demo` starts it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from examples import REFERENCE_CHAT, REFERENCE_CHAT_IDS
from tokenizers import Tokenizer

REFERENCE_TEXT = Path("/work/shared/reference/render-endpoints.txt")
README = Path(__file__).resolve().parents[2] / "README.md"
# Where the quick start expects `make demo`'s worker; the test puts its own worker's URL there.
DEMO_URL = "http://127.0.0.1:8000"

COMPLETIONS_RECIPE = """\
curl -s $RENDERER/v1/completions/render -H 'Content-Type: application/json' -d @request.json \\
  | jq -c '.[] | .request + {prompt: .token_ids}' \\
  | while read -r body; do
      curl -s $WORKER/v1/completions -H 'Content-Type: application/json' -d "$body"
    done"""

CHAT_RECIPE = """\
curl -s $RENDERER/v1/chat/completions/render -H 'Content-Type: application/json' -d @request.json \\
  | jq '.request + {prompt_token_ids: .token_ids}' \\
  | curl -s $WORKER/v1/chat/completions -H 'Content-Type: application/json' -d @-"""

PYTHON_RECIPE = """\
import requests

rendered = requests.post(f"{RENDERER}/v1/chat/completions/render", json=body).json()
send = {**rendered["request"], "prompt_token_ids": rendered["token_ids"]}
reply = requests.post(f"{WORKER}/v1/chat/completions", json=send).json()"""


needs_jq = pytest.mark.skipif(
    shutil.which("jq") is None or shutil.which("curl") is None, reason="the shell recipes need jq and curl"
)


class RecordingWorker:
    """A real HTTP server on loopback standing in for an inference worker: records POSTed JSON, answers {}."""

    def __init__(self) -> None:
        self.received: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        worker = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = ("not JSON", raw)
                with worker._lock:
                    worker.received.append((self.path, body))
                payload = b"{}"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> RecordingWorker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def worker() -> Iterator[RecordingWorker]:
    with RecordingWorker() as recording:
        yield recording


@pytest.fixture(scope="module")
def hf_tokenizer(qwen3: Path) -> Tokenizer:
    return Tokenizer.from_file(str(qwen3 / "tokenizer.json"))


def run_recipe(script: str, *, renderer: str, worker: str, cwd: Path, request: dict[str, Any]) -> str:
    (cwd / "request.json").write_text(json.dumps(request, indent=2))
    result = subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        env={**os.environ, "RENDERER": renderer, "WORKER": worker},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert result.stderr == "", result.stderr
    return result.stdout


@pytest.mark.skipif(not REFERENCE_TEXT.exists(), reason="the reference text is not on this machine")
def test_recipes_are_verbatim_copies() -> None:
    text = REFERENCE_TEXT.read_text()
    for recipe in (COMPLETIONS_RECIPE, CHAT_RECIPE, PYTHON_RECIPE):
        assert recipe in text, recipe


@needs_jq
def test_completions_shell_recipe(
    qwen3_renderer: Any, worker: RecordingWorker, tmp_path: Path, hf_tokenizer: Tokenizer
) -> None:
    prompts = ["The capital of France is", "Hello, world", "def fib(n):"]
    request = {"model": "Qwen3-0.6B", "prompt": prompts, "max_tokens": 8, "temperature": 0}
    out = run_recipe(
        COMPLETIONS_RECIPE, renderer=qwen3_renderer.url, worker=worker.url, cwd=tmp_path, request=request
    )
    assert out == "{}" * len(prompts)
    ids = [hf_tokenizer.encode(prompt).ids for prompt in prompts]
    assert ids[0] == [785, 6722, 315, 9625, 374]
    # One body per prompt item, each the original request with the item's ids as its prompt.
    assert worker.received == [("/v1/completions", {**request, "prompt": item_ids}) for item_ids in ids]


@needs_jq
def test_completions_shell_recipe_with_id_prompts(
    qwen3_renderer: Any, worker: RecordingWorker, tmp_path: Path
) -> None:
    prompts = [[785, 6722, 315], [9625, 374]]
    request = {"prompt": prompts, "max_tokens": 4, "cache_salt": "s1"}
    run_recipe(
        COMPLETIONS_RECIPE, renderer=qwen3_renderer.url, worker=worker.url, cwd=tmp_path, request=request
    )
    assert worker.received == [("/v1/completions", {**request, "prompt": item}) for item in prompts]


@needs_jq
def test_chat_shell_recipe(qwen3_renderer: Any, worker: RecordingWorker, tmp_path: Path) -> None:
    out = run_recipe(
        CHAT_RECIPE, renderer=qwen3_renderer.url, worker=worker.url, cwd=tmp_path, request=REFERENCE_CHAT
    )
    assert out == "{}"
    assert worker.received == [
        ("/v1/chat/completions", {**REFERENCE_CHAT, "prompt_token_ids": REFERENCE_CHAT_IDS})
    ]


@needs_jq
def test_chat_shell_recipe_with_thinking_off(
    qwen3_renderer: Any, worker: RecordingWorker, tmp_path: Path
) -> None:
    request = {**REFERENCE_CHAT, "chat_template_kwargs": {"enable_thinking": False}, "cache_salt": "abc"}
    run_recipe(CHAT_RECIPE, renderer=qwen3_renderer.url, worker=worker.url, cwd=tmp_path, request=request)
    ids = [*REFERENCE_CHAT_IDS, 151667, 271, 151668, 271]
    assert worker.received == [("/v1/chat/completions", {**request, "prompt_token_ids": ids})]


def test_python_recipe(qwen3_renderer: Any, worker: RecordingWorker) -> None:
    namespace: dict[str, Any] = {"RENDERER": qwen3_renderer.url, "WORKER": worker.url, "body": REFERENCE_CHAT}
    exec(compile(PYTHON_RECIPE, "render-endpoints.txt", "exec"), namespace)
    assert namespace["reply"] == {}
    assert namespace["rendered"]["token_ids"] == REFERENCE_CHAT_IDS
    assert worker.received == [
        ("/v1/chat/completions", {**REFERENCE_CHAT, "prompt_token_ids": REFERENCE_CHAT_IDS})
    ]


def readme_quick_start() -> list[str]:
    """The shell blocks of the README's "Quick start" section, in order."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```sh\n(.*?)^```", section, flags=re.DOTALL | re.MULTILINE)


def _json_values(text: str) -> list[Any]:
    """Every JSON value in `text`, one after another (curl prints answers without separators)."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while at < len(text):
        if text[at].isspace():
            at += 1
            continue
        value, at = decoder.raw_decode(text, at)
        values.append(value)
    return values


def test_readme_quick_start_writes_request_json_before_the_reference_recipe() -> None:
    blocks = readme_quick_start()
    assert len(blocks) == 2, blocks
    script = "\n".join(blocks)
    # The reference's chat recipe, with the worker doing the rendering too (make demo mounts the render routes).
    recipe = CHAT_RECIPE.replace("$RENDERER", "$WORKER")
    assert recipe in blocks[1]
    assert blocks[1].index("cat > request.json <<'EOF'") < blocks[1].index(recipe)
    assert script.count(DEMO_URL) == 1 and script.startswith(f"WORKER={DEMO_URL}\n")


@pytest.mark.slow
@needs_jq
def test_readme_quick_start_runs_as_written(launch: Any, checkpoint: Any, tmp_path: Path) -> None:
    """The quick start's commands, pasted into bash, against a worker started with `make demo`'s arguments."""
    worker = launch(
        [
            "serve",
            "--model",
            str(checkpoint("smollm2")),
            "--served-model-name",
            "SmolLM2-135M-Instruct",
            "--tool-call-parser",
            "hermes",
        ],
        log_dir=tmp_path,
        env={"TOKENFRONT_ENABLE_RENDER_ENDPOINTS": "1"},
    )
    try:
        script = "\n".join(readme_quick_start()).replace(DEMO_URL, worker.url)
        result = subprocess.run(
            ["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, (result.stdout, result.stderr)
        assert result.stderr == ""
        question = [{"role": "user", "content": "What is the capital of France?"}]
        assert json.loads((tmp_path / "request.json").read_text()) == {"messages": question, "temperature": 0}
        direct, via_ids = _json_values(result.stdout)
        answer = "The capital of France is Paris."  # what the README says the worker answers
        assert [direct["choices"][0]["message"]["content"], via_ids["choices"][0]["message"]["content"]] == [
            answer,
            answer,
        ]
        # As the README says: 37 prompt tokens, the 2 full blocks of 16 left cached by the first request.
        assert via_ids["usage"]["prompt_tokens"] == 37
        assert via_ids["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
        metrics = httpx.get(f"{worker.url}/metrics", timeout=10).text
        assert 'tokenfront_worker_prompts_total{route="chat",source="rendered"} 1.0' in metrics
        assert 'tokenfront_worker_prompts_total{route="chat",source="token_ids"} 1.0' in metrics
    finally:
        worker.stop()
