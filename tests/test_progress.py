"""Progress of long work (`tokenfront.progress`): plain lines at a bounded rate when stderr is not a terminal,
a bar redrawn in place when it is; and the fixture fetches and conversions reporting through it, in real
`tokenfront fixtures` processes on a fresh cache."""

from __future__ import annotations

import io
import os
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest

from tokenfront import fixtures
from tokenfront.fixtures.fetch import run_command
from tokenfront.progress import Progress

# A transfer of 270.1 MB in 64 kB chunks at 1 MB/s on a fake clock: 4122 updates over 270 s.
TRANSFER = r"""
import sys
from tokenfront.progress import Progress

now = [0.0]
progress = Progress("fetching smollm2", clock=lambda: now[0])
total, chunk, done, updates = 270_100_000, 65_536, 0, 0
while done < total:
    done = min(total, done + chunk)
    now[0] += chunk / 1e6
    progress.update(done, total=total)
    updates += 1
progress.close(f"fetching smollm2: 270.1 MB in {now[0]:.1f} s")
print(updates)
"""

LINE = re.compile(r"fetching smollm2: (\d+\.\d) (kB|MB) of 270\.1 MB \((\d+)%\)(, (\d+) s so far)?")


def _run_transfer() -> tuple[list[str], int]:
    """The transfer in a real process with stderr on a pipe: its stderr lines and its update count."""
    result = subprocess.run(
        [sys.executable, "-c", TRANSFER], capture_output=True, text=True, timeout=120, check=True
    )
    assert "\r" not in result.stderr
    return result.stderr.splitlines(), int(result.stdout)


def test_piped_progress_is_few_plain_lines() -> None:
    lines, updates = _run_transfer()

    assert updates == 4122
    assert lines[-1] == "fetching smollm2: 270.1 MB in 270.1 s"
    progress = [LINE.fullmatch(line) for line in lines[:-1]]
    assert all(progress), [line for line, match in zip(lines, progress, strict=False) if not match]
    percents = [int(match[3]) for match in progress if match]
    # A line at the start and at each tenth (11), and one about time after each 15 s without a new tenth
    # (a tenth takes 27 s here: 10): 21 lines for 4122 updates.
    assert len(percents) == 21
    assert percents[0] == 0 and percents[-1] == 100
    assert percents == sorted(percents)
    tenths = [match for match in progress if match and not match[4]]
    assert [int(match[3]) for match in tenths] == list(range(0, 101, 10))
    timed = [int(match[5]) for match in progress if match and match[4]]
    assert timed == [15, 42, 69, 96, 123, 150, 177, 204, 231, 258]


def test_a_longer_transfer_adds_only_a_line_per_quiet_interval() -> None:
    now = [0.0]
    stream = io.StringIO()
    progress = Progress("fetching smollm2", clock=lambda: now[0], stream=stream)
    total = 270_100_000
    for step in range(1, 27_011):  # 10 kB/s: 27010 s, a line per tenth and one per 15 s between
        now[0] += 1.0
        progress.update(step * 10_000, total=total)
    lines = stream.getvalue().splitlines()
    assert 27_010 / 15 - 11 < len(lines) < 27_010 / 15 + 12  # bounded by time, not by the 27010 updates
    assert lines[0] == "fetching smollm2: 10.0 kB of 270.1 MB (0%)"
    assert lines[-1].startswith("fetching smollm2: 270.1 MB of 270.1 MB (100%)")


def test_unknown_size_tells_the_time_it_takes() -> None:
    now = [0.0]
    stream = io.StringIO()
    progress = Progress("fetching qwen3", clock=lambda: now[0], stream=stream)
    for _ in range(100):  # 50 s of ticks while `npm pack` runs
        now[0] += 0.5
        progress.tick()
    progress.close("fetching qwen3: 16.3 MB in 50.0 s")
    assert stream.getvalue().splitlines() == [
        "fetching qwen3: 15 s so far",
        "fetching qwen3: 30 s so far",
        "fetching qwen3: 45 s so far",
        "fetching qwen3: 16.3 MB in 50.0 s",
    ]


def test_counted_steps_carry_their_note() -> None:
    now = [0.0]
    lines: list[str] = []
    progress = Progress("converting smollm2", unit="steps", emit=lines.append, clock=lambda: now[0])
    progress.update(0, total=4, note="reading the GGUF and dequantizing its weights")
    now[0] += 31.0
    progress.update(1, note="reading the tokenizer")
    now[0] += 0.5  # within a second of the last line: not written
    progress.update(2, note="writing model.safetensors")
    progress.close()
    assert lines == [
        "converting smollm2: 0 of 4 steps (0%), reading the GGUF and dequantizing its weights",
        "converting smollm2: 1 of 4 steps (25%), reading the tokenizer",
    ]


def _read_terminal(fd: int, process: subprocess.Popen[bytes]) -> bytes:
    """Everything written to a pty until the process exits and the pty is drained."""
    output = b""
    while True:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the other side is closed
                break
            if not chunk:
                break
            output += chunk
        elif process.poll() is not None:
            break
    return output


@pytest.mark.slow
def test_terminal_gets_a_bar() -> None:
    piped, _ = _run_transfer()  # the same script, on a pipe: no carriage return (checked there)
    leader, follower = os.openpty()
    process = subprocess.Popen(
        [sys.executable, "-c", TRANSFER], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=follower
    )
    os.close(follower)
    try:
        output = _read_terminal(leader, process).decode()
        assert process.wait(timeout=60) == 0
    finally:
        os.close(leader)
    assert process.stdout is not None
    assert int(process.stdout.read()) == 4122
    redraws = output.count("\r") - output.count("\r\n")
    assert redraws > 20, output[-2000:]  # the bar is redrawn in place, many more times than lines are written
    assert "fetching smollm2:" in output and "%|" in output  # tqdm's bar: label, percent, bar
    # The bar is cleared when the work ends; the summary line stays, as on a pipe.
    assert output.rstrip().endswith(piped[-1])
    assert not any(LINE.fullmatch(line.strip()) for line in output.replace("\r", "\n").splitlines())


def _fixtures_command(cache: Path, *names: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TOKENFRONT_CACHE": str(cache), "PIP_NO_CACHE_DIR": "1"}  # a real download
    return subprocess.run(
        [sys.executable, "-m", "tokenfront.cli", "fixtures", "--only", *names],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.slow
def test_fixture_download_reports_plain_progress_when_piped(tmp_path: Path) -> None:
    # mistral-tekken: the smallest fetch (a 6.6 MB wheel from PyPI), no torch.
    result = _fixtures_command(tmp_path, "mistral-tekken")

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"mistral-tekken\t{tmp_path / 'checkpoints' / 'mistral-tekken'}\n"
    assert "\r" not in result.stderr
    label = "tokenfront fixtures: fetching mistral-tekken: "
    lines = [line for line in result.stderr.splitlines() if line.startswith(label)]
    wheel = tmp_path / "downloads" / "mistral_common-1.13.1-py3-none-any.whl"
    size = f"{wheel.stat().st_size / 1e6:.1f} MB"
    counted = [
        re.fullmatch(rf"(\d+\.\d) (kB|MB) of {size} \((\d+)%\)", line[len(label) :]) for line in lines[:-1]
    ]
    assert counted and all(counted), lines  # pip's own counts, at least the line at the start
    percents = [int(match[3]) for match in counted if match]
    assert percents[0] == 0 and percents == sorted(percents)
    assert len(lines) <= 13  # a start, ten tenths and the summary at most, for a fetch of seconds
    assert re.fullmatch(rf"{label}{size} in \d+\.\d s", lines[-1]), lines[-1]


@pytest.mark.slow
def test_fixture_conversion_reports_its_steps(tmp_path: Path) -> None:
    # tiny-random is built (torch, in a subprocess) on smollm2: give the fresh cache the finished smollm2.
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "smollm2").symlink_to(fixtures.ensure_checkpoint("smollm2"))

    result = _fixtures_command(tmp_path, "tiny-random")

    assert result.returncode == 0, result.stderr
    assert (tmp_path / "checkpoints" / "tiny-random" / "model.safetensors").is_file()
    assert "\r" not in result.stderr
    label = "tokenfront fixtures: building tiny-random: "
    lines = [line[len(label) :] for line in result.stderr.splitlines() if line.startswith(label)]
    # The job's first step always shows; the second only if the first took a second or more.
    assert lines[0] == "0 of 2 steps (0%), drawing random weights"
    assert set(lines[1:]) <= {"1 of 2 steps (50%), writing model.safetensors"}, lines
    assert not any(line.startswith("Progress ") for line in result.stderr.splitlines())  # records consumed


def test_fixture_commands_keep_their_output_for_errors(tmp_path: Path) -> None:
    # A failing command's last lines (not its progress records) make the error message.
    script = "import sys\nprint('Progress 1 of 2'); print('the real trouble', file=sys.stderr); sys.exit(3)"
    lines: list[str] = []
    progress = Progress("fetching x", unit="steps", emit=lines.append)
    with pytest.raises(fixtures.FixtureError) as info:
        run_command([sys.executable, "-c", script], what="x", hint="(hint)", timeout=60, progress=progress)
    message = str(info.value)
    assert "exited with status 3" in message and "the real trouble" in message and "(hint)" in message
    tail = message.split("last lines of its output:\n", 1)[1]
    assert tail == "    the real trouble\n(hint)"
    assert lines == ["fetching x: 1 of 2 steps (50%)"]
