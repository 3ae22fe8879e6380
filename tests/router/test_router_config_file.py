"""`route --config FILE.toml` (router/config_file.py) and the rule that places a worker in one of the router's
models (router/model_placement.py): what a file declares, every mistake in one line (exit 2 from the command,
never a traceback), and which model a worker's names, or its pin, make it serve."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tokenfront.router.config_file import ConfigError, read_router_config
from tokenfront.router.model_placement import ModelPlacement
from tokenfront.router.worker_dns import DnsWorkers
from tokenfront.router.worker_spec import WorkerSpec


def _config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "models.toml"
    path.write_text(text)
    return str(path)


def test_a_config_declares_each_models_rendering_flags_and_workers(tmp_path: Path, qwen3: Path) -> None:
    path = _config(
        tmp_path,
        f'[[models]]\nmodel = "{qwen3}"\nserved_model_name = ["a", "b"]\nreasoning_parser = "qwen3"\n'
        "default_chat_template_kwargs = {enable_thinking = false}\ntrust_remote_code = false\n"
        'workers = ["http://w1:8000", "http://w2:8000,model=b"]\n\n'
        f'[[models]]\ntokenizer = "{qwen3}"\nserved_model_name = "c"\ntokenizer_mode = "hf"\n'
        "allow_request_chat_template = true\n",
    )
    first, second = read_router_config(path)
    assert first.args.model == str(qwen3) and first.args.served_model_name == ["a", "b"]
    assert first.args.reasoning_parser == "qwen3"
    assert first.args.default_chat_template_kwargs == {"enable_thinking": False}
    assert first.args.trust_remote_code is False and first.args.tokenizer_mode == "auto"  # the CLI's defaults
    assert first.workers == (WorkerSpec("http://w1:8000"), WorkerSpec("http://w2:8000", model="b"))
    assert second.args.model is None and second.args.tokenizer == str(qwen3)
    assert second.args.served_model_name == ["c"] and second.args.tokenizer_mode == "hf"
    assert second.args.allow_request_chat_template is True and second.workers == ()
    assert first.where.endswith("models[0]") and second.where.endswith("models[1]")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[[models]]\nmodel = "{m}"\ncolour = "red"\n',
            "models[0]: unknown key 'colour'; a model's keys are",
        ),
        (
            '[[models]]\nserved_model_name = "x"\n',
            'models[0]: no checkpoint: give model = "FOLDER or hub id"',
        ),
        ('[[models]]\nmodel = "{m}"\ntokenizer_mode = "weird"\n', "invalid choice: 'weird'"),
        ('[[models]]\nmodel = "{m}"\ntrust_remote_code = "yes"\n', "trust_remote_code must be true or false"),
        ('[[models]]\nmodel = "{m}"\nchat_template = 3\n', "chat_template must be a string"),
        ('[[models]]\nmodel = "{m}"\nserved_model_name = []\n', "must be a name or a list of names"),
        ('[[models]]\nmodel = "{m}"\nserved_model_name = [" "]\n', "a model name must not be empty"),
        ('[[models]]\nmodel = "{m}"\nworkers = "http://w:1"\n', "workers must be a list of strings"),
        ('[[models]]\nmodel = "{m}"\nworkers = ["http://w:1,colour=red"]\n', "unknown option 'colour'"),
        (
            '[[models]]\nmodel = "{m}"\nserved_model_name = "a"\nworkers = ["http://w:1,model=b"]\n',
            "pinned to model=b, not one of this model's names (a)",
        ),
        (
            '[[models]]\nmodel = "{m}"\nserved_model_name = ["a", "b"]\n'
            '[[models]]\nmodel = "{m}"\nserved_model_name = "b"\n',
            "models[1]: served_model_name 'b' is given to",
        ),
        ("models = 3\n", "no models: declare each one in a [[models]] table"),
        ("[server]\nport = 1\n", "unknown top-level key 'server'; the file declares models only"),
        ("[[models]\n", "not valid TOML"),
    ],
)
def test_a_config_mistake_is_one_line(tmp_path: Path, qwen3: Path, text: str, message: str) -> None:
    path = _config(tmp_path, text.replace("{m}", str(qwen3)))
    with pytest.raises(ConfigError) as caught:
        read_router_config(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"--config {path}")


def test_a_config_that_cannot_be_read(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        read_router_config(str(tmp_path / "missing.toml"))


def _route(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tokenfront.cli", "route", "--port", "0", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    return line


def test_route_refuses_a_bad_config_in_one_line(
    tmp_path: Path, qwen3: Path, checkpoint: Callable[[str], Path]
) -> None:
    good = _config(tmp_path, f'[[models]]\nmodel = "{qwen3}"\n')
    line = _one_error_line(_route("--config", good, "--model", str(qwen3)))
    assert "--config cannot be combined with --model" in line
    line = _one_error_line(_route("--config", good, "--reasoning-parser", "qwen3"))
    assert "give --reasoning-parser in its [[models]] tables" in line
    missing = _config(tmp_path, '[[models]]\nmodel = "/no/such/checkpoint"\n')
    assert "models[0]: model folder '/no/such/checkpoint' does not exist" in _one_error_line(
        _route("--config", missing)
    )
    # Two checkpoints named alike serve one default name: found once the pipelines are loaded.
    twice = _config(tmp_path, f'[[models]]\nmodel = "{qwen3}"\n[[models]]\nmodel = "{qwen3}"\n')
    assert "the served model name 'qwen3' is given to two models" in _one_error_line(
        _route("--config", twice)
    )
    pinned = _one_error_line(_route("--model", str(qwen3), "--worker", "http://127.0.0.1:9,model=other"))
    assert "model=other is not a model this router serves (it serves qwen3)" in pinned


def test_one_model_takes_every_worker() -> None:
    placement = ModelPlacement([("a", "b")])
    assert placement.place(None, None).model == "a"
    assert placement.place(None, ("a", "b")) == placement.place(None, ("b", "a"))
    assert placement.place(None, ("a", "b")).note is None
    other = placement.place(None, ("z",))
    assert other.model == "a"  # a single-model router sends it requests that name no model, as it always did
    assert other.note is not None and "it serves z, not a, b" in other.note


def test_several_models_place_a_worker_by_its_names_or_its_pin() -> None:
    placement = ModelPlacement([("a", "a2"), ("b",)])
    assert placement.several and placement.all_names() == ["a", "a2", "b"]
    assert placement.place(None, ("b",)).model == "b"
    assert placement.place(None, ("a2",)).model == "a"
    partial = placement.place(None, ("a2",)).note
    assert partial is not None and "not a " in partial  # serves a2 only: requests naming `a` stay away
    unnamed = placement.place(None, None)
    assert unnamed.model is None and unnamed.note is not None and "model=NAME" in unnamed.note
    foreign = placement.place(None, ("z",))
    assert (
        foreign.model is None and foreign.note is not None and "none of this router's models" in foreign.note
    )
    assert placement.place("b", None).model == "b"
    pinned_elsewhere = placement.place("b", ("a",))
    assert pinned_elsewhere.model == "b" and pinned_elsewhere.note is not None
    unknown_pin = placement.place("zz", ("a",))
    assert unknown_pin.model is None and unknown_pin.note is not None and "model=zz" in unknown_pin.note


def test_two_models_cannot_share_a_name() -> None:
    with pytest.raises(ValueError, match="'a' is given to two models"):
        ModelPlacement([("a",), ("b", "a")])


def test_a_worker_spec_pins_a_model() -> None:
    assert WorkerSpec.parse("http://w:1,model=qwen3").model == "qwen3"
    assert WorkerSpec.parse("http://w:1").model is None
    with pytest.raises(ValueError, match="model needs a value"):
        WorkerSpec.parse("http://w:1,model=")
    # Every worker of a DNS name (one Kubernetes Service per model) pinned alike.
    assert DnsWorkers.parse("workers.svc:8000,model=qwen3").spec("10.0.0.7").model == "qwen3"
    with pytest.raises(ValueError, match="model needs a value"):
        DnsWorkers.parse("workers.svc:8000,model=")
