"""The build: the package pyproject.toml describes, with the render hot path's modules compiled by mypyc.

A wheel (`pip install .`, the Dockerfiles, `make install`) holds each module below twice: its source, and a C
extension mypyc made of it, which Python imports instead. The first five made a one-line chat cost the renderer
9-20 % less CPU in three runs, `renderer/answers.py` another 4 % (docs/benchmarks.md). An editable install (`pip install -e .`) compiles nothing, so an edit runs at
once; so does any build with TOKENFRONT_PURE_PYTHON=1 (a machine without a C compiler).

Compiled modules keep their behaviour, with three rules of mypyc's (docs/architecture.md): their annotations are
checked when a value crosses into them, their classes cannot be subclassed by interpreted code, and a function
replaced at run time is not what their compiled calls call.
"""

import os
import shlex
import shutil
import sys
import sysconfig

from setuptools import setup

# The modules every direct render runs, request by request: the lean lane, its counts and request ids, the
# message normalization, Qwen3's native template and the render answers.
HOT_PATH = [
    "src/tokenfront/server/direct.py",
    "src/tokenfront/server/metrics.py",
    "src/tokenfront/server/request_ids.py",
    "src/tokenfront/core/messages.py",
    "src/tokenfront/core/native_templates/qwen3.py",
    "src/tokenfront/renderer/answers.py",
]

# setuptools runs this file once per PEP 517 hook (metadata, requirements, the wheel); mypyc analyses and writes
# C when mypycify is called, so only the commands that build extensions call it. Not editable_wheel: an
# extension module shadows its source, and an edit would not run until the next install.
COMPILING_COMMANDS = {"bdist_wheel", "build_ext", "build", "install"}


def extensions() -> list:
    if os.environ.get("TOKENFRONT_PURE_PYTHON") == "1" or not COMPILING_COMMANDS.intersection(sys.argv[1:]):
        return []
    # One clear line instead of a compiler error from deep inside setuptools.
    compiler = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")[0]
    if shutil.which(compiler) is None:
        sys.exit(
            f"tokenfront: the build compiles the render hot path with mypyc and needs a C compiler, and {compiler!r} "
            "is not there: install one (Debian: apt-get install gcc), or build with TOKENFRONT_PURE_PYTHON=1 "
            "(uncompiled, the same answers)"
        )
    from mypyc.build import mypycify

    # --follow-imports=skip: the other modules are typed Any here. Their calls are Python calls whatever mypyc
    # knows of them; following them cost 4 minutes of analysis a build, for no measured speed.
    options = ["--ignore-missing-imports", "--follow-imports=skip"]
    return mypycify([*options, *HOT_PATH], opt_level="3", group_name="tokenfront_hot_path")


setup(ext_modules=extensions())
