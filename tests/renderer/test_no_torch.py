"""The renderer never imports torch (docs/contract.md §1: tokenizer, config and template files only, no weights, no torch).

Three checks, meaningful whether or not torch is installed in the environment:

- the running `qwen3_renderer` process, after serving a chat and a completions request, has no torch shared
  object mapped (`/proc/<pid>/maps`);
- a renderer process started with an import recorder (a `sitecustomize` on PYTHONPATH installing a
  `sys.meta_path` finder) never *attempts* `import torch` — an attempt is recorded even when torch is absent
  and the import would fail, so the check does not depend on torch being installed; availability probes
  (`importlib.util.find_spec("torch")`, which import nothing) are not counted;
- in a plain subprocess, importing `tokenfront.renderer.app` and `tokenfront.core.render`, loading a
  RenderPipeline on Qwen3 and rendering leaves `"torch"` out of `sys.modules`, with no import attempt either.

When torch IS importable in the environment (as it is wherever a worker also runs), these are the real proof:
any code path that imports torch loads it, and the maps / sys.modules checks see it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from examples import FRANCE_IDS, REFERENCE_CHAT, REFERENCE_CHAT_IDS

TORCH_IMPORTABLE = importlib.util.find_spec("torch") is not None
ENVIRONMENT = "torch is importable here" if TORCH_IMPORTABLE else "torch is not installed here"


# A sys.meta_path finder that records every real attempt to import torch (or a torch submodule), with the stack
# that made it, and then lets the import proceed as it would have (it finds nothing itself).
RECORDER = r"""
import json as _json
import os as _os
import sys as _sys
import traceback as _traceback

_TORCH_IMPORT_ATTEMPTS = []


class _TorchImportRecorder:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            caller = _sys._getframe(2).f_code.co_name
            # `import torch` / importlib.import_module go through _find_and_load_unlocked;
            # importlib.util.find_spec (an availability probe that imports nothing) does not.
            if caller != "find_spec":
                stack = "".join(_traceback.format_stack()[:-1][-25:])
                _TORCH_IMPORT_ATTEMPTS.append({"module": name, "stack": stack})
                log = _os.environ.get("TOKENFRONT_TEST_TORCH_LOG")
                if log:
                    with open(log, "a") as handle:
                        handle.write(_json.dumps({"module": name, "stack": stack}) + "\n")
        return None


_sys.meta_path.insert(0, _TorchImportRecorder())
"""

PIPELINE_SCRIPT = (
    RECORDER
    + r"""
import json
import sys
from pathlib import Path

import tokenfront.core.render
import tokenfront.renderer.app
from tokenfront.core.render import RenderPipeline
from tokenfront.options import RenderOptions
from tokenfront.protocol import ChatCompletionRequest, CompletionRequest

pipeline = RenderPipeline.load(RenderOptions(model=sys.argv[1], reasoning_parser="qwen3"))
chat = pipeline.render_chat(ChatCompletionRequest.model_validate(json.loads(sys.argv[2])))
completion = pipeline.render_completion(CompletionRequest.model_validate({"prompt": "The capital of France is"}))
tokenfront.renderer.app.create_renderer_app(pipeline)
print(json.dumps({
    "chat": chat.token_ids,
    "completion": [item.token_ids for item in completion],
    # A None entry is the renderer's guard (core/torch_guard.py) marking torch absent, not a loaded module.
    "torch_in_sys_modules": sorted(
        name for name in sys.modules
        if (name == "torch" or name.startswith("torch.")) and sys.modules[name] is not None
    ),
    "attempts": _TORCH_IMPORT_ATTEMPTS,
}))
"""
)


def _torch_mappings(pid: int) -> list[str]:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return sorted(
        {
            line.split()[-1]
            for line in maps.splitlines()
            if "libtorch" in line or "/torch/" in line or "libc10" in line
        }
    )


def _describe(attempts: list[dict[str, str]]) -> str:
    if not attempts:
        return ""
    first = attempts[0]
    return f"{len(attempts)} torch import attempt(s); first ({first['module']}) from:\n{first['stack']}"


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_running_renderer_maps_no_torch(qwen3_renderer: Any) -> None:
    url = qwen3_renderer.url
    chat = httpx.post(f"{url}/v1/chat/completions/render", json={**REFERENCE_CHAT, "model": "Qwen3-0.6B"})
    assert chat.status_code == 200, chat.text
    assert chat.json()["token_ids"] == REFERENCE_CHAT_IDS
    completion = httpx.post(f"{url}/v1/completions/render", json={"prompt": "The capital of France is"})
    assert completion.status_code == 200, completion.text
    assert completion.json()[0]["token_ids"] == FRANCE_IDS

    pid = qwen3_renderer.process.pid
    assert qwen3_renderer.process.poll() is None
    assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-m", b"tokenfront.cli"]
    mapped = _torch_mappings(pid)
    assert mapped == [], f"the renderer process has torch mapped ({ENVIRONMENT}): {mapped}"


def test_renderer_process_never_attempts_to_import_torch(
    server_factory: Callable[..., Any], qwen3: Path, tmp_path: Path
) -> None:
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    marker = tmp_path / "recorder-active"
    (site_dir / "sitecustomize.py").write_text(RECORDER + f"\nopen({str(marker)!r}, 'w').close()\n")
    log = tmp_path / "torch-imports.jsonl"
    python_path = [str(site_dir), *filter(None, [os.environ.get("PYTHONPATH")])]
    renderer = server_factory(
        "render",
        "--model",
        str(qwen3),
        "--reasoning-parser",
        "qwen3",
        "--served-model-name",
        "Qwen3-0.6B",
        env={"PYTHONPATH": os.pathsep.join(python_path), "TOKENFRONT_TEST_TORCH_LOG": str(log)},
    )
    chat = httpx.post(f"{renderer.url}/v1/chat/completions/render", json=REFERENCE_CHAT)
    assert chat.status_code == 200, chat.text
    assert chat.json()["token_ids"] == REFERENCE_CHAT_IDS
    completion = httpx.post(
        f"{renderer.url}/v1/completions/render", json={"prompt": ["The capital of France is"]}
    )
    assert completion.json()[0]["token_ids"] == FRANCE_IDS
    # The protocol routes too: /tokenize reads the config through transformers' config classes (max_model_len),
    # /v1/messages/render probes the template on first use.
    tokenized = httpx.post(f"{renderer.url}/tokenize", json={"prompt": "The capital of France is"})
    assert tokenized.json()["tokens"] == FRANCE_IDS
    assert tokenized.json()["max_model_len"] == 32768
    messages = {"model": "Qwen3-0.6B", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    assert httpx.post(f"{renderer.url}/v1/messages/render", json=messages).status_code == 200
    assert httpx.post(f"{renderer.url}/v1/responses/render", json={"input": "Hi"}).status_code == 200
    if Path(f"/proc/{renderer.process.pid}/maps").exists():
        mapped = _torch_mappings(renderer.process.pid)
    else:
        mapped = []
    renderer.stop()

    assert marker.exists(), "the import recorder did not run in the renderer process"
    attempts = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    assert attempts == [], f"({ENVIRONMENT}) " + _describe(attempts)
    assert mapped == []


def test_render_pipeline_never_imports_torch(qwen3: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PIPELINE_SCRIPT, str(qwen3), json.dumps(REFERENCE_CHAT)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["chat"] == REFERENCE_CHAT_IDS
    assert report["completion"] == [FRANCE_IDS]
    assert report["attempts"] == [], f"({ENVIRONMENT}) " + _describe(report["attempts"])
    assert report["torch_in_sys_modules"] == [], ENVIRONMENT
