"""The build (setup.py): the wheel compiles the render hot path with mypyc; TOKENFRONT_PURE_PYTHON=1 does not.

- The installed package (`make install-test` installs the built wheel) imports each module setup.py lists as a
  C extension, and the module's source beside it is the current src/ (tests/conftest.py stops a run when not);
  `tokenfront --version` names those modules.
  An editable install compiles nothing: the test is skipped there, with the reason, and fails under CI.
- A wheel built with TOKENFRONT_PURE_PYTHON=1 (a machine without a C compiler) holds the same package files as
  src/ and no extension module; a compiled build on a machine without that compiler stops with one line saying
  both ways out.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from installed_build import SOURCE, installed_package

ROOT = SOURCE.parent.parent


def hot_path() -> list[str]:
    """The module names setup.py compiles, read from its HOT_PATH list."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    (paths,) = (
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["HOT_PATH"]
    )
    return [".".join(Path(path).relative_to("src").with_suffix("").parts) for path in paths]


def test_the_installed_hot_path_is_compiled() -> None:
    if installed_package() == SOURCE:
        reason = (
            "tokenfront is installed editable (pure Python): `make install-test` installs the compiled wheel"
        )
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            pytest.fail(f"{reason}; under CI the tests run on the wheel")
        pytest.skip(reason)
    modules = hot_path()
    assert len(modules) == 6 and "tokenfront.server.direct" in modules
    for name in modules:
        path = Path(importlib.import_module(name).__file__ or "")
        assert path.name.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), f"{name}: {path}"
        assert path.parent.is_relative_to(installed_package())
    # `tokenfront --version` says so, naming the same modules.
    version = subprocess.run(
        [Path(sys.executable).parent / "tokenfront", "--version"], capture_output=True, text=True, check=True
    ).stdout
    listed = ", ".join(sorted(name.removeprefix("tokenfront.") for name in modules))
    assert version == f"tokenfront 0.1.0 (6 modules compiled by mypyc: {listed})\n"


def test_a_pure_python_wheel_compiles_nothing(tmp_path: Path) -> None:
    # The venv's own setuptools, no build isolation: no download, and no mypy imported (it is never asked to).
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            tmp_path,
            ROOT,
        ],
        env={**os.environ, "TOKENFRONT_PURE_PYTHON": "1"},
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("tokenfront-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = {name for name in archive.namelist() if name.startswith("tokenfront/")}
    expected = {
        str(path.relative_to(SOURCE.parent))
        for path in SOURCE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert len(expected) > 150
    assert names == expected
    # Installed, such a build says it is pure Python (the source tree's own modules: nothing compiled there).
    version = subprocess.run(
        [sys.executable, "-m", "tokenfront.cli", "--version"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(SOURCE.parent)},
    ).stdout
    assert version == "tokenfront 0.1.0 (pure Python: no module compiled)\n"


def test_a_build_without_a_c_compiler_says_what_to_do(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-gcc"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path, ROOT],
        env={**os.environ, "CC": f"{missing} -pthread"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode != 0
    assert (
        f"tokenfront: the build compiles the render hot path with mypyc and needs a C compiler, and '{missing}' "
        "is not there: install one (Debian: apt-get install gcc), or build with TOKENFRONT_PURE_PYTHON=1"
    ) in " ".join((build.stdout + build.stderr).split())
    assert not list(tmp_path.glob("*.whl"))
