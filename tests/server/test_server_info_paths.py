"""`GET /server_info` names no path of this machine unless the server was started with `--show-paths` (issue 17,
item 6): any client may read it, and the fingerprint's digest does not depend on where the checkpoint is.

A renderer and a router on SmolLM2's folder and a worker on the tiny random one, each started with and
without the flag, as real processes on loopback. The bodies must differ in the paths and nothing else: the
same digest, the same fields otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tokenfront.server.app import PATH_INFO_KEYS

pytestmark = pytest.mark.slow  # six real servers, two of them loading a model


def test_server_info_names_paths_only_with_show_paths(
    launch: Callable[..., Any], checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    smollm2, tiny = checkpoint("smollm2"), checkpoint("tiny-random")
    commands = {
        "renderer": ["render", "--model", str(smollm2)],
        "router": ["route", "--model", str(smollm2)],
        "worker": ["serve", "--model", str(tiny)],
    }
    folders = {"renderer": smollm2, "router": smollm2, "worker": tiny}
    runs = [(role, shown) for role in commands for shown in (False, True)]
    bodies: dict[tuple[str, bool], str] = {}
    with ThreadPoolExecutor(len(runs)) as pool:
        starting = {
            run: pool.submit(
                launch,
                [*commands[run[0]], *(["--show-paths"] if run[1] else [])],
                log_dir=tmp_path,
                timeout=240.0,
            )
            for run in runs
        }
    try:
        for run, future in starting.items():
            bodies[run] = httpx.get(f"{future.result().url}/server_info", timeout=30.0).text
    finally:  # every server that started is stopped, by its own pid, whichever failed
        stopped = [future.result().stop() for future in starting.values() if future.exception() is None]
    assert stopped == [0] * len(runs)
    compared = 0
    for role, folder in folders.items():
        hidden, shown = bodies[(role, False)], bodies[(role, True)]
        assert str(folder) not in hidden and str(folder.parent) not in hidden, hidden
        info = json.loads(shown)["render_fingerprint"]["info"]
        assert {key: info.get(key) for key in PATH_INFO_KEYS} == {
            "model_path": str(folder),
            "tokenizer_path": str(folder),
        }, f"{role} with --show-paths: {shown}"
        without, with_paths = json.loads(hidden), json.loads(shown)
        assert role == without["role"] == with_paths["role"] and set(without) == set(with_paths)
        hidden_fingerprint, shown_fingerprint = (
            without["render_fingerprint"],
            with_paths["render_fingerprint"],
        )
        assert hidden_fingerprint["digest"] == shown_fingerprint["digest"]
        assert set(hidden_fingerprint["info"]) == set(shown_fingerprint["info"]) - set(PATH_INFO_KEYS)
        compared += 1
    assert compared == len(folders) == 3
