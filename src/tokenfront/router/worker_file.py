"""A file of workers (`--worker-file PATH`): one worker spec a line, in the `--worker` grammar.

`#` starts a comment (to the end of the line: a worker spec never holds one), blank lines are ignored. A line
that is not a worker spec is logged with its number and skipped, and so is a worker given twice (however
spelled); the other lines apply. The path is opened again at each read, so a file replaced by a rename, or a
Kubernetes ConfigMap whose mount swaps a symlink, is read whole, old or new. A file that vanishes or cannot be
read keeps the workers it last listed (`SourceUnavailable`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenfront.core.errors import TokenfrontError
from tokenfront.router.worker_sources import SourceUnavailable
from tokenfront.router.worker_spec import WorkerSpec
from tokenfront.server_address import worker_identity

__all__ = ["MAX_FILE_BYTES", "FileLines", "WorkerFile", "parse_worker_lines"]

log = logging.getLogger(__name__)

# A file of worker specs larger than this is not read (4,096 workers of 2 KiB URLs and options fit).
MAX_FILE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class FileLines:
    """What a file of worker specs lists: the workers, and (line number, problem) for each line skipped."""

    specs: tuple[WorkerSpec, ...]
    problems: tuple[tuple[int, str], ...] = ()


def parse_worker_lines(content: bytes) -> FileLines:
    """Read a file of worker specs (one a line, `#` comments, blank lines ignored)."""
    specs: list[WorkerSpec] = []
    problems: list[tuple[int, str]] = []
    seen: dict[tuple[str, str, int], int] = {}
    for number, raw in enumerate(content.split(b"\n"), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            problems.append((number, "not UTF-8 text"))
            continue
        text = line.partition("#")[0].strip()
        if not text:
            continue
        try:
            spec = WorkerSpec.parse(text)
        except ValueError as exc:
            problems.append((number, str(exc)))
            continue
        identity = worker_identity(spec.url)
        if identity in seen:
            problems.append((number, f"{spec.url} is the worker of line {seen[identity]} again"))
            continue
        seen[identity] = number
        specs.append(spec)
    return FileLines(tuple(specs), tuple(problems))


class WorkerFile:
    """The workers a file lists, read again at each `read` (its lines parsed again when its content changed)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._content: bytes | None = None
        self._lines = FileLines(())

    @classmethod
    def open(cls, path: str | Path) -> WorkerFile:
        """The source of `path`; TokenfrontError (one line) when it cannot be read now (at start-up: a path
        mistyped is an error, not an empty fleet)."""
        source = cls(Path(path))
        try:
            source._read_bytes()
        except SourceUnavailable as exc:
            raise TokenfrontError(
                f"--worker-file {path}: {exc} (give a file of worker specs, one a line in the --worker grammar; "
                "an empty file lists no worker)"
            ) from None
        return source

    @property
    def name(self) -> str:
        return f"file:{self.path}"

    async def read(self) -> Sequence[WorkerSpec]:
        """The workers the file lists now; its bad lines are logged when its content changes."""
        content = await asyncio.to_thread(self._read_bytes)
        if content != self._content:
            self._lines = parse_worker_lines(content)
            self._content = content
            for number, problem in self._lines.problems:
                log.warning("worker file %s line %d skipped: %s", self.path, number, problem)
            skipped = len(self._lines.problems)
            log.info(
                "worker file %s lists %s%s",
                self.path,
                _count(len(self._lines.specs), "worker"),
                f" ({_count(skipped, 'line')} skipped)" if skipped else "",
            )
        return self._lines.specs

    def _read_bytes(self) -> bytes:
        try:
            with self.path.open("rb") as file:
                content = file.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            raise SourceUnavailable("no such file") from None
        except IsADirectoryError:
            raise SourceUnavailable("a directory, not a file") from None
        except OSError as exc:
            raise SourceUnavailable(f"cannot be read ({exc.strerror or exc})") from None
        if len(content) > MAX_FILE_BYTES:
            raise SourceUnavailable(f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
        return content


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"
