"""The `tokenfront` command line: help text (docs/contract.md §1 shared options) and clear start-up errors, no tracebacks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

SHARED_OPTIONS = [
    "--model",
    "--tokenizer",
    "--chat-template",
    "--reasoning-parser",
    "--tool-call-parser",
    "--served-model-name",
    "--trust-remote-code",
    "--allow-request-chat-template",
]
SERVER_OPTIONS = ["--host", "--port", "--api-key", "--max-body-bytes"]


def tokenfront_command() -> list[str]:
    """The installed console script next to this interpreter, else `python -m tokenfront.cli`."""
    script = Path(sys.executable).parent / "tokenfront"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tokenfront.cli"]


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    result = subprocess.run(
        [*tokenfront_command(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    return result, time.monotonic() - start


def flat(text: str) -> str:
    return " ".join(text.split())


def assert_clear_startup_error(result: subprocess.CompletedProcess[str], elapsed: float) -> str:
    """Non-zero exit, one `error: ...` line on stderr, no traceback; returns the error line."""
    assert result.returncode != 0, (result.stdout, result.stderr)
    assert elapsed < 60, elapsed
    assert "Traceback" not in result.stderr, result.stderr
    assert "Traceback" not in result.stdout, result.stdout
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1, result.stderr
    return error_lines[0]


def test_top_level_help_lists_the_render_command() -> None:
    result, _ = run("--help")
    assert result.returncode == 0, result.stderr
    assert "render" in result.stdout
    assert "usage: tokenfront" in result.stdout


def test_render_help_lists_the_shared_and_server_options() -> None:
    result, _ = run("render", "--help")
    assert result.returncode == 0, result.stderr
    for option in [*SHARED_OPTIONS, *SERVER_OPTIONS]:
        assert option in result.stdout, option
    text = flat(result.stdout)
    assert "(default: 8100)" in text[text.index("--port") :], result.stdout


def test_version() -> None:
    result, _ = run("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("tokenfront ")


@pytest.mark.parametrize(
    "hub_env",
    [
        {"HF_HUB_OFFLINE": "1"},
        # No network: the hub endpoint refuses connections (a closed loopback port).
        {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"},
    ],
    ids=["hub-offline", "hub-unreachable"],
)
def test_hub_id_offline_fails_clearly(tmp_path: Path, hub_env: dict[str, str]) -> None:
    # An empty Hugging Face cache, so no earlier download can satisfy the id.
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"), **hub_env}
    result, elapsed = run("render", "--model", "Qwen/Qwen3-0.6B", "--port", "0", env=env)
    line = assert_clear_startup_error(result, elapsed)
    assert "Qwen/Qwen3-0.6B" in line
    assert "hub" in line.lower()
    assert "local" in line.lower() and "folder" in line.lower()


def test_nonexistent_model_path_fails_clearly() -> None:
    result, elapsed = run("render", "--model", "/nonexistent/path", "--port", "0")
    line = assert_clear_startup_error(result, elapsed)
    assert "/nonexistent/path" in line
    assert "does not exist" in line or "not found" in line.lower()


def test_unknown_reasoning_parser_fails_clearly(qwen3: Path) -> None:
    result, elapsed = run("render", "--model", str(qwen3), "--reasoning-parser", "nope", "--port", "0")
    line = assert_clear_startup_error(result, elapsed)
    assert "nope" in line
    for known in ("qwen3", "deepseek_r1", "laguna", "minimax_m3"):
        assert known in line, line


def test_unknown_tool_call_parser_fails_clearly(qwen3: Path) -> None:
    result, elapsed = run("render", "--model", str(qwen3), "--tool-call-parser", "nope", "--port", "0")
    line = assert_clear_startup_error(result, elapsed)
    assert "nope" in line
    assert "--tool-call-parser" in line
