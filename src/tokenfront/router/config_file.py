"""`route --config FILE.toml`: the models of a router that serves several (docs/operations.md, "Several models").

The file declares models only (every other setting stays a flag), as an array of tables:

    [[models]]
    model = "/models/qwen3"                    # or tokenizer = "..."
    served_model_name = ["qwen3"]              # default: the checkpoint folder's name, as --served-model-name
    reasoning_parser = "qwen3"                 # any rendering flag, `_` for `-`
    workers = ["http://10.0.0.5:8000"]         # optional, in the --worker grammar; pinned to this model

Each table's keys are the rendering flags of `route` (`options.add_render_arguments`), read by the same
argparse actions as the command line — the same choices, the same JSON check, the same defaults — so a model
here renders exactly as `route --model ...` with those flags would. What cannot be right is refused with one
`ConfigError` line naming the file, the table and the key: a file that is not TOML, no `[[models]]`, an
unknown key, a value of the wrong kind, a table without `model` or `tokenizer`, two tables giving one served
name, a worker spec that does not parse.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import tomllib

from tokenfront.core.errors import TokenfrontError
from tokenfront.options import add_render_arguments
from tokenfront.router.worker_spec import WorkerSpec

__all__ = [
    "ConfigError",
    "ModelConfig",
    "check_model",
    "parse_router_config",
    "pinned_specs",
    "read_router_config",
]

WORKERS_KEY = "workers"


class ConfigError(TokenfrontError):
    """The config file cannot be used: one line saying where and what to change."""


@dataclass(frozen=True)
class ModelConfig:
    """One `[[models]]` table: the rendering arguments (a namespace as `route`'s parser gives, for the same
    code that builds a pipeline from the command line), and the workers it lists."""

    where: str  # "FILE, models[N]" for messages
    args: argparse.Namespace
    workers: tuple[WorkerSpec, ...] = ()


class _TableParser(argparse.ArgumentParser):
    """The rendering flags' parser, raising instead of exiting (the caller says which table)."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def _rendering_parser() -> _TableParser:
    parser = _TableParser(add_help=False, allow_abbrev=False)
    add_render_arguments(parser, model_required=False)
    return parser


def rendering_keys() -> dict[str, argparse.Action]:
    """The keys a `[[models]]` table may give (besides `workers`): each rendering flag's name, `_` for `-`."""
    return {
        action.dest: action
        for action in _rendering_parser()._actions
        if action.option_strings and action.dest != "help"
    }


def read_router_config(path: str) -> list[ModelConfig]:
    """The models `path` declares, in its order. ConfigError (one line) for anything that cannot be right."""
    try:
        data = Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot be read ({exc.strerror or exc})") from None
    return parse_router_config(data, path)


def parse_router_config(data: bytes, path: str) -> list[ModelConfig]:
    """The models the content `data` of the file `path` declares (what `read_router_config` read, or what a
    reload read: `router.config_reload`). ConfigError (one line) for anything that cannot be right."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"--config {path}: not UTF-8 text (a TOML file is)") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config {path}: not valid TOML ({exc})") from None
    unknown = sorted(set(document) - {"models"})
    if unknown:
        raise ConfigError(
            f"--config {path}: unknown top-level key {unknown[0]!r}; the file declares models only "
            "([[models]] tables), every other setting is a flag of `tokenfront route`"
        )
    tables = document.get("models")
    if not isinstance(tables, list) or not tables or not all(isinstance(table, dict) for table in tables):
        raise ConfigError(
            f'--config {path}: no models: declare each one in a [[models]] table (with model = "CHECKPOINT")'
        )
    models = [_read_model(f"--config {path}, models[{index}]", table) for index, table in enumerate(tables)]
    _check_names(models)
    return models


def check_model(model: ModelConfig) -> None:
    """The mistakes in a table found without loading anything (`server.startup.check_rendering`: a folder or
    a template file that does not exist, an unknown parser), as a ConfigError naming the file and the table."""
    from tokenfront.server.startup import check_rendering

    try:
        check_rendering(model.args)
    except TokenfrontError as exc:
        raise ConfigError(f"{model.where}: {exc}") from None


def pinned_specs(model: ModelConfig, served_model_names: Sequence[str]) -> list[WorkerSpec]:
    """The workers a table lists, pinned to its model (`model=` its first served name) unless their spec pins
    them already; ConfigError when one is pinned to a name the model (loaded: `served_model_names`) lacks."""
    specs: list[WorkerSpec] = []
    for spec in model.workers:
        if spec.model is not None and spec.model not in served_model_names:
            raise ConfigError(
                f"{model.where}: worker {spec.url} is pinned to model={spec.model}, not one of this model's "
                f"names ({', '.join(served_model_names)})"
            )
        specs.append(
            spec if spec.model is not None else dataclasses.replace(spec, model=served_model_names[0])
        )
    return specs


def _read_model(where: str, table: dict[str, Any]) -> ModelConfig:
    """One table: its rendering arguments through the command line's parser, and its workers."""
    keys = rendering_keys()
    argv: list[str] = []
    names: list[str] | None = None
    workers: tuple[WorkerSpec, ...] = ()
    for key, value in table.items():
        if key == WORKERS_KEY:
            workers = _workers(where, value)
            continue
        action = keys.get(key)
        if action is None:
            known = ", ".join([*sorted(keys), WORKERS_KEY])
            raise ConfigError(f"{where}: unknown key {key!r}; a model's keys are {known}")
        flag = action.option_strings[0]
        if action.nargs == 0:  # a switch (--trust-remote-code)
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: {key} must be true or false, not {value!r}")
            argv += [flag] if value else []
        elif key == "served_model_name":
            names = _names(where, key, value)
        elif isinstance(value, dict):
            argv.append(f"{flag}={_json(value)}")
        elif isinstance(value, str):
            argv.append(f"{flag}={value}")
        else:
            raise ConfigError(f"{where}: {key} must be a string, not {value!r}")
    try:
        args = _rendering_parser().parse_args(argv)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not args.model and not args.tokenizer:
        raise ConfigError(f'{where}: no checkpoint: give model = "FOLDER or hub id" (or tokenizer = "...")')
    args.served_model_name = names or []
    if workers and names is not None:
        for spec in workers:
            if spec.model is not None and spec.model not in names:
                raise ConfigError(
                    f"{where}: worker {spec.url} is pinned to model={spec.model}, not one of this model's names "
                    f"({', '.join(names)})"
                )
    return ModelConfig(where, args, workers)


def _names(where: str, key: str, value: Any) -> list[str]:
    """`served_model_name`: a name, or a list of names, none empty."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(name, str) for name in names):
        raise ConfigError(f"{where}: {key} must be a name or a list of names, not {value!r}")
    if not all(name.strip() for name in names):
        raise ConfigError(f"{where}: {key}: a model name must not be empty")
    return names


def _workers(where: str, value: Any) -> tuple[WorkerSpec, ...]:
    """`workers`: a list of specs in the --worker grammar."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(
            f"{where}: workers must be a list of strings in the --worker grammar, not {value!r}"
        )
    specs = []
    for item in value:
        try:
            specs.append(WorkerSpec.parse(item))
        except ValueError as exc:
            raise ConfigError(f"{where}: workers: {exc}") from None
    return tuple(specs)


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value)


def _check_names(models: Sequence[ModelConfig]) -> None:
    """Two tables giving one served name: the second is refused (the names of tables that give none are the
    checkpoint folders', checked once the pipelines are loaded)."""
    seen: dict[str, str] = {}
    for model in models:
        for name in model.args.served_model_name:
            if name in seen:
                raise ConfigError(
                    f"{model.where}: served_model_name {name!r} is given to {seen[name]} too: each name must "
                    "name one model"
                )
            seen[name] = model.where
