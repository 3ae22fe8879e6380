"""`hide_torch` (core/torch_guard.py): torch looks absent, and transformers' warning about that ("PyTorch was not
found. Models won't be available ...") never shows: alarming, and wrong where torch is installed. Checked in a
plain process and on the output of real `tokenfront render` and `tokenfront route` processes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

WARNING = "PyTorch was not found"

# Hide torch (or not), then import transformers and use a torch-free part of it.
SCRIPT = r"""
import logging
import sys

{hide}
logging.basicConfig()
import transformers
from transformers import AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
print(tokenizer.encode("Paris"))
logging.getLogger("transformers").warning("another transformers warning")
print(sys.modules.get("torch"))
"""


def _import_transformers(hide: str, checkpoint: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT.format(hide=hide), str(checkpoint)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_hidden_torch_brings_no_warning(qwen3: Path) -> None:
    result = _import_transformers(
        "from tokenfront.core.torch_guard import hide_torch\nassert hide_torch()", qwen3
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[59604]", "None"]  # Qwen3's id of "Paris"; torch hidden
    assert WARNING not in result.stderr
    assert "another transformers warning" in result.stderr  # only that one warning is dropped


def test_torch_hidden_without_the_guard_warns(qwen3: Path) -> None:
    # What the guard prevents: the check above would see the warning if it were still written.
    result = _import_transformers("sys.modules['torch'] = None", qwen3)
    assert result.returncode == 0, result.stderr
    # Once per handler that writes it: transformers' own, and the root's too where transformers propagates
    # (it does when CI=true is set).
    assert result.stderr.count(WARNING) >= 1, result.stderr


@pytest.mark.slow
def test_render_and_route_never_warn_about_torch(server_factory: Callable[..., Any], qwen3: Path) -> None:
    # torch is installed here, the case where the warning is plainly wrong.
    assert importlib.util.find_spec("torch") is not None
    renderer = server_factory("render", "--model", str(qwen3))
    router = server_factory("route", "--model", str(qwen3))
    chat = {"messages": [{"role": "user", "content": "Hi"}]}
    assert httpx.post(f"{renderer.url}/v1/chat/completions/render", json=chat).status_code == 200
    assert httpx.get(f"{router.url}/server_info").status_code == 200
    assert renderer.stop() == 0
    assert router.stop() == 0

    renderer_log, router_log = renderer.log(), router.log()
    # The logs are the processes' stdout and stderr, past the point where transformers was imported.
    assert "renderer ready: model qwen3" in renderer_log
    assert "router rendering with model qwen3" in router_log
    assert WARNING not in renderer_log
    assert WARNING not in router_log
