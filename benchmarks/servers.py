"""Server processes for the benchmarks: start one on a free loopback port, wait for /health, stop it by pid.

Also reads what the benchmarks report about a server from /proc: the CPU time and the resident memory of
the process and all its descendants (uvicorn or granian workers, vLLM's helper processes, a simulated fleet's
processes); and, for a `tokenfront simulate` fleet, its command, its workers' URLs, whether it kept up with its
clock (`step_lag`) and whether a router in front of it had to take its workers out (`taken_out`).
"""

from __future__ import annotations

import collections
import http.client
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HOST = "127.0.0.1"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# vLLM's servers, offline and quiet: no hub, no usage reports.
_VLLM_OFFLINE = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
# A base URL as `tokenfront simulate` prints each worker's, one a line.
_PRINTED_URL = re.compile(r"^http://127\.0\.0\.1:(\d+)$", re.MULTILINE)
# A simulated fleet's processes by default: one per this many workers (at most one per core). One event loop
# carries 128 busy simulated GPUs of the agentic workload at speedup 0.05 on this 2-core machine beside a
# router and the load client (docs/simulation.md).
WORKERS_PER_SIM_PROCESS = 128
# How long a simulated worker keeps an idle connection (`--keep-alive-timeout`; 5 s by default). A router drops
# its pooled connections after 4 s idle, by its own clock: a router whose event loop runs a second late (a loaded
# 2-core machine) reuses one the worker is closing, gets no answer and takes the worker out (447 times in one
# 256-worker run: "/health unreachable (RemoteProtocolError...)"). A minute takes that race out of the fleet
# benchmarks; docs/routing.md says what the router should do about it.
SIM_KEEP_ALIVE_SECONDS = 60.0
# The line a router logs when it takes a worker out of its active set, and why (`router/workers.py`).
_TAKEN_OUT = re.compile(r"taken out of the active set: (.{1,80})")
_ENGINE_GAUGE = re.compile(r"^tokenfront_engine_(\w+) (\S+)$", re.MULTILINE)


def free_port() -> int:
    """A port nothing listens on right now, on loopback."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """A server process started by a benchmark, stopped by its own pid."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    launched_at: float = field(default_factory=time.monotonic)
    healthy_after: float | None = None  # seconds from launch to the first 200 on /health
    settled_after: float | None = None  # seconds from launch until the process tree went idle after that
    idle_memory: dict[str, int] | None = None  # `memory()` once settled, before any request
    command_extra: list[str] = field(default_factory=list)  # what it was given beyond its model and address
    version: str = "unknown"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def pids(self) -> list[int]:
        """The process and every live descendant of it."""
        return [self.pid, *_descendants(self.pid)]

    def cpu_seconds(self) -> float:
        """utime + stime of the process tree, reaped children included (cutime + cstime)."""
        ticks = 0
        for pid in self.pids():
            fields = _stat_fields(pid)
            if fields is not None:
                # Fields after the command name: state is index 0, so utime..cstime are 11..14.
                ticks += sum(int(value) for value in fields[11:15])
        return ticks / CLOCK_TICKS

    def memory(self) -> dict[str, int]:
        """VmRSS summed over the process tree (shared pages count once per process), and PSS likewise."""
        rss = pss = processes = 0
        for pid in self.pids():
            status = _read(f"/proc/{pid}/status")
            if status is None:
                continue
            processes += 1
            rss += _kilobytes(status, "VmRSS:") * 1024
            rollup = _read(f"/proc/{pid}/smaps_rollup")
            pss += _kilobytes(rollup, "Pss:") * 1024 if rollup else 0
        return {"rss_bytes": rss, "pss_bytes": pss, "processes": processes}

    def wait_settled(self, timeout: float = 120.0, *, window: float = 0.5, threshold: float = 0.05) -> bool:
        """Wait until the process tree uses under `threshold` cores over `window` seconds (work a server does
        after it answers /health, such as building a tokenizer in the background, is over); record
        `settled_after`. False after `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            before = self.cpu_seconds()
            time.sleep(window)
            if (self.cpu_seconds() - before) / window < threshold:
                self.settled_after = time.monotonic() - window - self.launched_at
                return True
        return False

    def wait_for_log(self, text: str, timeout: float, *, interval: float = 0.1) -> bool:
        """Wait until the server's log holds `text`; False after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log_path.read_text(errors="replace"):
                return True
            time.sleep(interval)
        return False

    def stop(self) -> int:
        """SIGTERM (a graceful shutdown), then SIGKILL if it has not exited in 30 s; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return int(self.process.returncode)


def launch(
    name: str,
    command: Sequence[str],
    *,
    port: int,
    log_dir: Path,
    env: dict[str, str] | None = None,
) -> Server:
    """Start `command` (which must make the server listen on HOST:port), its output going to a log file."""
    log_path = log_dir / f"{name}-{port}.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            list(command), stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    return Server(name, process, port, log_path)


def launch_tokenfront(
    args: Sequence[str],
    *,
    log_dir: Path,
    env: dict[str, str] | None = None,
    name: str | None = None,
    cpus: str | None = None,
) -> Server:
    """`python -m tokenfront.cli ARGS --host 127.0.0.1 --port P`, with this interpreter (on the cores
    ``cpus``, `taskset -c` style, when given)."""
    port = free_port()
    command = [sys.executable, "-m", "tokenfront.cli", *args, "--host", HOST, "--port", str(port)]
    return launch(name or args[0], [*_pinned(cpus), *command], port=port, log_dir=log_dir, env=env)


def vllm_rs_binary(venv: Path) -> Path | None:
    """vLLM's Rust frontend inside a venv holding vllm (``site-packages/vllm/vllm-rs``), None without it."""
    found = sorted(venv.glob("lib/python*/site-packages/vllm/vllm-rs"))
    return found[-1] if found else None


def vllm_rs_option(value: str) -> Path:
    """``--vllm-rs``: the binary itself, or a venv holding vllm (its ``site-packages/vllm/vllm-rs``)."""
    path = Path(value).expanduser()
    if path.is_file():
        return path
    binary = vllm_rs_binary(path)
    if binary is None:
        raise RuntimeError(f"--vllm-rs {value}: neither the vllm-rs binary nor a venv holding vllm")
    return binary


def launch_vllm_rs(
    binary: Path,
    model: str,
    *,
    log_dir: Path,
    extra_args: Sequence[str] = (),
    name: str = "vllm-rs",
    cpus: str | None = None,
) -> Server:
    """vLLM's Rust render server: `vllm-rs render MODEL --host 127.0.0.1 --port P`, offline."""
    port = free_port()
    command = [str(binary), "render", model, "--host", HOST, "--port", str(port), *extra_args]
    return launch(name, [*_pinned(cpus), *command], port=port, log_dir=log_dir, env=_VLLM_OFFLINE)


def launch_vllm_render(
    venv: Path,
    model: str,
    *,
    log_dir: Path,
    extra_args: Sequence[str] = (),
    name: str = "vllm",
    env: dict[str, str] | None = None,
    cpus: str | None = None,
) -> Server:
    """vLLM's CPU render server: `VENV/bin/vllm launch render MODEL --host 127.0.0.1 --port P`, offline;
    `env` adds to its environment."""
    port = free_port()
    command = [str(venv / "bin" / "vllm"), "launch", "render", model, "--host", HOST, "--port", str(port)]
    environment = {"VLLM_TARGET_DEVICE": "cpu", **_VLLM_OFFLINE}
    return launch(
        name,
        [*_pinned(cpus), *command, *extra_args],
        port=port,
        log_dir=log_dir,
        env={**environment, **(env or {})},
    )


def _pinned(cpus: str | None) -> list[str]:
    """The command prefix running a server on the cores ``cpus`` only (`taskset` execs the command: the
    server keeps its pid, and every process it starts inherits the cores)."""
    return [] if cpus is None else ["taskset", "-c", cpus]


def wait_healthy(servers: Iterable[Server], timeout: float = 300.0, interval: float = 0.05) -> None:
    """Poll each server's /health until it answers 200, recording `healthy_after`; raise with its log if it
    exits or does not answer in `timeout` seconds."""
    pending = list(servers)
    deadline = time.monotonic() + timeout
    while pending:
        for server in list(pending):
            if server.process.poll() is not None:
                raise RuntimeError(
                    f"{server.name} ({server.url}) exited with {server.process.returncode}:\n{server.log_tail()}"
                )
            if _health_status(server.port) == 200:
                server.healthy_after = time.monotonic() - server.launched_at
                pending.remove(server)
        if pending:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{pending[0].name} ({pending[0].url}) did not start:\n{pending[0].log_tail()}"
                )
            time.sleep(interval)


def wait_for_urls(fleet: Server, workers: int, timeout: float = 300.0) -> list[int]:
    """The ports of a `tokenfront simulate` fleet's workers, read from its output once it has printed all of
    them; RuntimeError with its log if it exits or has not printed them in `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ports = [int(port) for port in _PRINTED_URL.findall(fleet.log_path.read_text(errors="replace"))]
        if len(ports) >= workers:
            return ports[:workers]
        if fleet.process.poll() is not None:
            raise RuntimeError(f"the fleet exited with {fleet.process.returncode}:\n{fleet.log_tail()}")
        time.sleep(0.2)
    raise RuntimeError(f"the fleet did not print {workers} URLs in {timeout} s:\n{fleet.log_tail()}")


def sim_processes(workers: int) -> int:
    """A simulated fleet's processes by default: one per `WORKERS_PER_SIM_PROCESS` workers, at most one per core."""
    return max(1, min(os.cpu_count() or 1, math.ceil(workers / WORKERS_PER_SIM_PROCESS)))


def simulate_command(model: Path, workers: int, processes: int, *extra: str) -> list[str]:
    """`tokenfront simulate` of `workers` on any free loopback ports in `processes` processes, keeping idle
    connections `SIM_KEEP_ALIVE_SECONDS`, with `extra` flags (`launch` it with port 0, then `wait_for_urls`)."""
    command = [sys.executable, "-m", "tokenfront.cli", "simulate", "--model", str(model)]
    command += ["--workers", str(workers), "--processes", str(processes), "--host", HOST, "--port", "0"]
    return [*command, "--keep-alive-timeout", str(SIM_KEEP_ALIVE_SECONDS), *extra]


def engine_gauges(urls: Sequence[str]) -> list[dict[str, float]]:
    """Each simulated worker's `tokenfront_engine_*` gauges from its /metrics (requests, modelled seconds,
    lateness), named without the prefix."""
    gauges = []
    with httpx.Client(timeout=30) as client:
        for url in urls:
            text = client.get(f"{url}/metrics").text
            gauges.append({name: float(value) for name, value in _ENGINE_GAUGE.findall(text)})
    return gauges


def step_lag(gauges: Sequence[dict[str, float]]) -> dict[str, float | None]:
    """How late the fleet's engine steps ended on its clock, in wall milliseconds: the mean over every step of
    every worker, and the largest. A mean near a step's wall time (its modelled ~8-250 ms over the speedup)
    means the machine, not the modelled GPUs, set the pace."""
    steps = sum(gauge.get("steps", 0.0) for gauge in gauges)
    total = sum(gauge.get("lag_seconds_total", 0.0) for gauge in gauges)
    largest = max((gauge.get("lag_seconds_max", 0.0) for gauge in gauges), default=0.0)
    return {
        "engine_lag_mean_ms": round(1000 * total / steps, 2) if steps else None,
        "engine_lag_max_ms": round(1000 * largest, 1),
    }


def taken_out(router: Server) -> dict[str, int]:
    """How many times the router took a worker out of its active set, by reason (from its log)."""
    log = router.log_path.read_text(errors="replace")
    return dict(collections.Counter(match.group(1) for match in _TAKEN_OUT.finditer(log)).most_common())


def stop_all(servers: Iterable[Server]) -> None:
    """Stop servers in the reverse order of their start, each by its own pid."""
    for server in reversed(list(servers)):
        server.stop()


def machine_cpu_seconds() -> float:
    """CPU time the whole machine has spent busy (every core; all but idle and iowait), from /proc/stat."""
    values = _cpu_ticks()
    return (sum(values[:8]) - values[3] - values[4]) / CLOCK_TICKS


def machine_interrupt_seconds() -> tuple[float, float]:
    """CPU time the whole machine spent in interrupts (hard and soft: on loopback, most of the network's work,
    charged to no process) and stolen by the hypervisor, from /proc/stat: ``(interrupts, steal)``."""
    values = _cpu_ticks()
    return (values[5] + values[6]) / CLOCK_TICKS, values[7] / CLOCK_TICKS


def _cpu_ticks() -> list[int]:
    """The machine's CPU time by kind (user, nice, system, idle, iowait, irq, softirq, steal, ...), in clock
    ticks, from the first line of /proc/stat."""
    stat = _read("/proc/stat") or ""
    return [int(value) for value in stat.splitlines()[0].split()[1:]]


def wait_quiet(timeout: float, *, window: float = 0.5, threshold: float = 0.1) -> float | None:
    """Wait until the machine's busy CPU over `window` seconds is under `threshold` cores (call it while
    everything this benchmark runs is idle); return the seconds waited, or None after `timeout`."""
    started = time.monotonic()
    while True:
        before = machine_cpu_seconds()
        time.sleep(window)
        if (machine_cpu_seconds() - before) / window < threshold:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            return None


def _health_status(port: int) -> int | None:
    # http.client rather than httpx: polling every 50 ms must not take CPU from the server starting up.
    connection = http.client.HTTPConnection(HOST, port, timeout=1.0)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read()
    except OSError:  # the process exited meanwhile, or the file is not readable
        return None


def _stat_fields(pid: int) -> list[str] | None:
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    # The command name is in parentheses and may hold spaces: split after its closing one.
    return stat[stat.rindex(")") + 2 :].split()


def _kilobytes(text: str, key: str) -> int:
    for line in text.splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found
