"""Start-up mistakes (issue 10, item 3): each is one `error:` line on stderr and a non-zero exit, no traceback,
found before anything heavy loads (no model, no "ready" line).

Real `tokenfront` processes; the folders with missing tokenizer files are made from the fixture checkpoints.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tokenfront.core.checkpoint import load_tokenizer
from tokenfront.core.errors import CheckpointError
from tokenfront.core.fingerprint import build_fingerprint, tokenizer_components

# What a process that got as far as loading would have printed.
LOADED_MARKERS = ("ready:", "loading model", "Loading weights", "Started server process", "serving on")


def tokenfront(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tokenfront.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """Non-zero exit; stderr is exactly one non-empty line, `error: ...`; nothing was loaded. Returns it."""
    assert result.returncode != 0, (result.stdout, result.stderr)
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    for marker in LOADED_MARKERS:
        assert marker not in output, output
    return lines[0]


@pytest.fixture(scope="module")
def tiny_random() -> Path:
    from tokenfront import fixtures

    return fixtures.ensure_checkpoint("tiny-random")


@pytest.fixture(scope="module")
def qwen3() -> Path:
    from tokenfront import fixtures

    return fixtures.ensure_checkpoint("qwen3")


@pytest.fixture
def folder_with(tmp_path: Path) -> Callable[..., Path]:
    """A checkpoint folder holding only the named files of a fixture checkpoint."""

    def make(source: Path, *names: str) -> Path:
        folder = tmp_path / f"{source.name}-{'-'.join(names) or 'empty'}"
        folder.mkdir()
        for name in names:
            shutil.copy(source / name, folder / name)
        return folder

    return make


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another server listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])


# -- tokenizer files -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["auto", "tokenizers"])
def test_config_only_folder_names_the_missing_tokenizer_files(
    folder_with: Callable[..., Path], qwen3: Path, backend: str
) -> None:
    # Qwen3's config alone: transformers builds a tokenizer with no vocabulary from it (it used to start
    # "ready (complete)" and fail every request, or die on "byte 0x54 has no token in vocabulary").
    folder = folder_with(qwen3, "config.json")
    for command in ("render", "route"):
        line = one_line_error(
            tokenfront(command, "--model", str(folder), "--port", "0", "--tokenizer-backend", backend)
        )
        assert str(folder) in line and "tokenizer.json / tokenizer_config.json" in line, line
        assert "only config.json" in line, line


def test_empty_folder_names_the_missing_tokenizer_files(
    folder_with: Callable[..., Path], qwen3: Path
) -> None:
    folder = folder_with(qwen3)
    line = one_line_error(tokenfront("render", "--model", str(folder), "--port", "0"))
    assert "tokenizer.json / tokenizer_config.json" in line and "it is empty" in line, line
    assert "sentencepiece" not in line, line


def test_tokenizer_config_without_vocabulary_names_tokenizer_json(
    folder_with: Callable[..., Path], tiny_random: Path
) -> None:
    folder = folder_with(tiny_random, "config.json", "tokenizer_config.json")
    line = one_line_error(tokenfront("render", "--model", str(folder), "--port", "0"))
    assert "no tokenizer.json" in line and "tokenizer.model" in line and "tekken.json" in line, line


def test_a_tokenizer_without_vocabulary_is_refused_and_never_complete(
    folder_with: Callable[..., Path], qwen3: Path
) -> None:
    folder = folder_with(qwen3, "config.json")
    with pytest.raises(CheckpointError, match="has no vocabulary"):
        load_tokenizer(folder, trust_remote_code=False)
    from transformers import AutoTokenizer

    empty = AutoTokenizer.from_pretrained(str(folder))  # what transformers builds from no vocabulary file
    assert empty("Hello")["input_ids"] == []
    fingerprint = build_fingerprint(
        model_type="qwen3",
        processor=None,
        chat_templates=None,
        tokenizer=empty,
        prompt_mode_reasoning_parser=None,
        forced_tool_call_prefix=None,
        default_chat_template_kwargs={},
        remote_code=False,
        info={},
        tokenizer_part=tokenizer_components(empty),
    )
    assert not fingerprint.complete
    assert any("no vocabulary" in reason for reason in fingerprint.incomplete_reasons), fingerprint
    # A real tokenizer is still complete.
    real = AutoTokenizer.from_pretrained(str(qwen3))
    assert build_fingerprint(
        model_type="qwen3",
        processor=None,
        chat_templates=None,
        tokenizer=real,
        prompt_mode_reasoning_parser=None,
        forced_tool_call_prefix=None,
        default_chat_template_kwargs={},
        remote_code=False,
        info={},
    ).complete


# -- other options -------------------------------------------------------------------------------------------


def test_the_same_worker_twice_is_one_line() -> None:
    for second in ("http://127.0.0.1:9/", "HTTP://127.0.0.1:9", "http://127.0.0.1:9"):
        line = one_line_error(
            tokenfront("route", "--worker", "http://127.0.0.1:9", "--worker", second, "--port", "0")
        )
        assert "--worker http://127.0.0.1:9 is given twice" in line, line


@pytest.mark.parametrize("command", ["render", "serve", "route"])
@pytest.mark.parametrize("port", ["99999", "-1", "eighty"])
def test_a_port_out_of_range_is_one_line(command: str, port: str, tiny_random: Path) -> None:
    line = one_line_error(tokenfront(command, "--model", str(tiny_random), "--port", port))
    assert "--port" in line and port in line, line


@pytest.mark.skipif(
    subprocess.run(
        [sys.executable, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
        capture_output=True,
    ).returncode
    == 0,
    reason="CUDA is available here",
)
def test_device_cuda_without_cuda_fails_before_loading(tiny_random: Path) -> None:
    line = one_line_error(tokenfront("serve", "--model", str(tiny_random), "--device", "cuda", "--port", "0"))
    assert "--device cuda" in line and "CUDA" in line and "--device cpu" in line, line


@pytest.mark.parametrize("command", ["render", "serve", "route"])
def test_a_busy_port_is_found_before_loading(command: str, busy_port: int, tiny_random: Path) -> None:
    result = tokenfront(command, "--model", str(tiny_random), "--port", str(busy_port))
    line = one_line_error(result)  # also: nothing was loaded, nothing said "ready"
    assert f"127.0.0.1:{busy_port}" in line and "already in use" in line, line


def test_a_busy_port_with_worker_processes_is_found_before_loading(busy_port: int, tiny_random: Path) -> None:
    result = tokenfront("render", "--model", str(tiny_random), "--port", str(busy_port), "--workers", "2")
    assert "already in use" in one_line_error(result)


def test_an_unknown_host_is_one_line(tiny_random: Path) -> None:
    line = one_line_error(
        tokenfront("render", "--model", str(tiny_random), "--host", "no-such-host.invalid", "--port", "0")
    )
    assert "cannot listen on no-such-host.invalid:0" in line, line


@pytest.mark.parametrize("command", ["render", "serve", "route"])
def test_a_nonexistent_model_path_is_one_line(command: str, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    line = one_line_error(tokenfront(command, "--model", str(missing), "--port", "0"))
    assert str(missing) in line and "does not exist" in line, line


def test_a_missing_chat_template_file_is_one_line(tiny_random: Path, tmp_path: Path) -> None:
    missing = tmp_path / "template.jinja"
    for command in ("render", "serve"):
        line = one_line_error(
            tokenfront(command, "--model", str(tiny_random), "--chat-template", str(missing), "--port", "0")
        )
        assert "--chat-template" in line and str(missing) in line, line


def test_an_unknown_parser_on_the_worker_is_one_line(tiny_random: Path) -> None:
    line = one_line_error(
        tokenfront("serve", "--model", str(tiny_random), "--reasoning-parser", "nope", "--port", "0")
    )
    assert "--reasoning-parser 'nope'" in line and "qwen3" in line, line


@pytest.mark.parametrize("command", ["render", "route"])
def test_an_empty_served_model_name_is_one_line(command: str, tiny_random: Path) -> None:
    line = one_line_error(
        tokenfront(command, "--model", str(tiny_random), "--served-model-name", "", "--port", "0")
    )
    assert "--served-model-name" in line and "empty" in line, line


@pytest.mark.parametrize(
    ("key", "problem"),
    [("", "is empty"), ("secret\n", "position 7"), ("two words", "position 4"), ("clé", "position 3")],
    ids=["empty", "newline", "space", "non-ascii"],
)
def test_an_unusable_api_key_from_the_environment_is_one_line(
    tiny_random: Path, key: str, problem: str
) -> None:
    result = tokenfront("render", "--model", str(tiny_random), "--port", "0", env={"TOKENFRONT_API_KEY": key})
    line = one_line_error(result)
    assert "$TOKENFRONT_API_KEY" in line and problem in line, line
    if key.strip():
        assert key.strip() not in line  # the key itself is never shown


def test_an_unusable_worker_api_key_is_one_line() -> None:
    result = tokenfront(
        "route", "--worker", "http://127.0.0.1:9", "--port", "0", env={"TOKENFRONT_WORKER_API_KEY": " "}
    )
    assert "--worker-api-key (or $TOKENFRONT_WORKER_API_KEY) is empty" in one_line_error(result)


@pytest.mark.parametrize(
    ("option", "value"),
    [("--shutdown-timeout", "-1"), ("--shutdown-timeout", "soon"), ("--max-body-bytes", "0")],
)
def test_bad_server_numbers_are_one_line(tiny_random: Path, option: str, value: str) -> None:
    line = one_line_error(tokenfront("render", "--model", str(tiny_random), option, value))
    assert option in line, line


def test_a_worker_on_a_folder_without_weights_is_one_line(qwen3: Path) -> None:
    line = one_line_error(tokenfront("serve", "--model", str(qwen3), "--port", "0"))
    assert "no weights" in line and str(qwen3) in line, line


def test_a_worker_on_a_folder_without_config_is_one_line(
    folder_with: Callable[..., Path], tiny_random: Path
) -> None:
    folder = folder_with(tiny_random, "tokenizer.json", "tokenizer_config.json")
    line = one_line_error(tokenfront("serve", "--model", str(folder), "--port", "0"))
    assert "no config.json" in line, line


def test_a_worker_on_truncated_weights_is_one_line(
    folder_with: Callable[..., Path], tiny_random: Path
) -> None:
    names = [p.name for p in tiny_random.iterdir() if p.is_file() and p.name != "model.safetensors"]
    folder = folder_with(tiny_random, *names)
    weights = (tiny_random / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(weights[: len(weights) // 2])  # an interrupted copy
    line = one_line_error(tokenfront("serve", "--model", str(folder), "--port", "0"))
    assert "unreadable model weights" in line and str(folder) in line, line


def test_a_missing_required_option_is_one_line() -> None:
    line = one_line_error(tokenfront("serve"))
    assert "--model" in line and "tokenfront serve --help" in line, line


def test_a_port_held_by_another_preforked_server_is_busy(tiny_random: Path) -> None:
    """SO_REUSEPORT lets pre-fork children share their parent's port; it must not let a second server of the same
    user join a port another pre-forked server holds (each would get part of the connections)."""
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        port = int(other.getsockname()[1])
        result = tokenfront("render", "--model", str(tiny_random), "--port", str(port), "--workers", "2")
    assert "already in use" in one_line_error(result)
