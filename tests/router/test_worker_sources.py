"""Worker sources in-process: the file's lines, the DNS flags' grammar, and membership kept in step with a
source on a real `WorkerPool` over plain OpenAI servers on loopback (router/worker_sources.py, worker_file.py,
worker_dns.py). The real router, real workers and a real DNS server are in test_router_worker_sources.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import pytest

from conftest import PlainOpenAIServer
from tokenfront.core.errors import TokenfrontError
from tokenfront.router.kv_index import KvIndex
from tokenfront.router.worker import FLAG_SOURCE
from tokenfront.router.worker_allow import WorkerAllowList, parse_entry
from tokenfront.router.worker_dns import DnsServer, DnsWorkers
from tokenfront.router.worker_file import WorkerFile, parse_worker_lines
from tokenfront.router.worker_pool import PoolSettings, WorkerPool
from tokenfront.router.worker_sources import Admission, SourceMembers, SourceUnavailable
from tokenfront.router.worker_spec import WorkerSpec

# --- the file's lines -----------------------------------------------------------------------------------------


def test_a_file_lists_one_worker_a_line_and_skips_bad_lines_with_their_number() -> None:
    content = (
        b"# the fleet\n"
        b"http://10.0.0.1:8000\n"
        b"\n"
        b"   http://10.0.0.2:8000,protocol=generate   # a vLLM worker\n"
        b"10.0.0.3:8000\n"
        b"http://10.0.0.4:8000,colour=blue\n"
        b"http://10.0.0.1:8000/\n"
        b"http://10.0.0.5:8000,\xff\n"
        b"http://[fd00::6]:8000,kv-events=tcp://[fd00::6]:5557"
    )
    lines = parse_worker_lines(content)
    assert [spec.url for spec in lines.specs] == [
        "http://10.0.0.1:8000",
        "http://10.0.0.2:8000",
        "http://[fd00::6]:8000",
    ]
    assert lines.specs[1].protocol == "generate"
    assert lines.specs[2].kv_events == "tcp://[fd00::6]:5557"
    numbers = [number for number, _ in lines.problems]
    assert numbers == [5, 6, 7, 8]
    problems = dict(lines.problems)
    assert "the scheme must be http:// or https://" in problems[5]
    assert "unknown option 'colour'" in problems[6]
    assert problems[7] == "http://10.0.0.1:8000 is the worker of line 2 again"
    assert problems[8] == "not UTF-8 text"


def test_an_empty_file_lists_no_worker() -> None:
    assert parse_worker_lines(b"").specs == ()
    assert parse_worker_lines(b"# nobody yet\n\n").specs == ()


def test_a_missing_file_at_start_up_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(TokenfrontError, match=r"^--worker-file .*missing.txt: no such file \(give a file"):
        WorkerFile.open(tmp_path / "missing.txt")
    with pytest.raises(TokenfrontError, match="a directory, not a file"):
        WorkerFile.open(tmp_path)


def test_a_file_is_read_through_a_swapped_symlink_as_a_configmap_mount_swaps_it(tmp_path: Path) -> None:
    """Kubernetes writes a ConfigMap's new content into a new folder and swaps the `..data` symlink."""

    def publish(version: str, content: str) -> None:
        folder = tmp_path / version
        folder.mkdir()
        (folder / "workers").write_text(content)
        (tmp_path / "..data_tmp").symlink_to(version)
        os.replace(tmp_path / "..data_tmp", tmp_path / "..data")

    publish("v1", "http://10.0.0.1:8000\n")
    (tmp_path / "workers").symlink_to("..data/workers")
    source = WorkerFile.open(tmp_path / "workers")
    assert source.name == f"file:{tmp_path / 'workers'}"
    assert [spec.url for spec in asyncio.run(source.read())] == ["http://10.0.0.1:8000"]
    publish("v2", "http://10.0.0.1:8000\nhttp://10.0.0.2:8000\n")
    assert [spec.url for spec in asyncio.run(source.read())] == [
        "http://10.0.0.1:8000",
        "http://10.0.0.2:8000",
    ]
    (tmp_path / "..data").unlink()
    with pytest.raises(SourceUnavailable, match="no such file"):
        asyncio.run(source.read())


# --- the DNS flags --------------------------------------------------------------------------------------------


def test_a_dns_name_gives_one_worker_per_address() -> None:
    workers = DnsWorkers.parse("Workers.Tokenfront.svc.cluster.local:8000,protocol=generate,verify=probe")
    assert workers == DnsWorkers("workers.tokenfront.svc.cluster.local", 8000, "generate", "probe")
    assert workers.spec("10.1.2.3") == WorkerSpec("http://10.1.2.3:8000", protocol="generate", verify="probe")
    assert workers.spec("fd00::1").url == "http://[fd00::1]:8000"
    # A final dot is kept: the name is absolute, no search list applies.
    assert DnsWorkers.parse("workers.ns.svc.cluster.local.:80").name == "workers.ns.svc.cluster.local."


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("workers", "expected NAME:PORT"),
        ("workers:", "the port must be a number"),
        ("10.0.0.1:8000", "10.0.0.1 is an address, not a DNS name: give it as --worker http://10.0.0.1:8000"),
        ("[fd00::1]:8000", "is an address, not a DNS name"),
        ("workers:8000,kv-events=tcp://x:5557", "kv-events names one worker's ZMQ endpoint"),
        ("workers:8000,protocol=grpc", "protocol must be openai or generate"),
        ("workers:8000,protocol=generate,protocol=openai", "protocol given twice"),
        ("workers:8000,verify=probe", "verify=probe needs protocol=generate"),
        ("-workers:8000", "invalid label"),
    ],
)
def test_a_bad_dns_name_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"^'") as raised:
        DnsWorkers.parse(text)
    assert message in str(raised.value)


def test_a_dns_server_is_an_address_with_an_optional_port() -> None:
    assert DnsServer.parse("10.96.0.10") == DnsServer("10.96.0.10", 53)
    assert DnsServer.parse("127.0.0.1:5353") == DnsServer("127.0.0.1", 5353)
    assert DnsServer.parse("[fd00::a]:53") == DnsServer("fd00::a", 53)
    assert DnsServer.parse("fd00::a") == DnsServer("fd00::a", 53)
    for text, message in [
        ("kube-dns.kube-system", "must be an IP address"),
        ("127.0.0.1:0", "the port must be a number from 1 to 65535"),
        ("[fd00::a", "an IPv6 server is written [ADDRESS]:PORT"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            DnsServer.parse(text)


# --- membership kept in step with a source ----------------------------------------------------------------------


class Listed:
    """A source whose workers the test sets (`urls`, in the --worker grammar); `unavailable` makes reads fail."""

    name = "test:listed"

    def __init__(self) -> None:
        self.urls: list[str] = []
        self.unavailable: str | None = None

    async def read(self) -> Sequence[WorkerSpec]:
        if self.unavailable is not None:
            raise SourceUnavailable(self.unavailable)
        return [WorkerSpec.parse(url) for url in self.urls]


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the sources logged (not the pool's own lines)."""
    return [r.getMessage() for r in caplog.records if r.name == "tokenfront.router.worker_sources"]


def _run(scenario: Callable[[WorkerPool], Coroutine[Any, Any, None]]) -> None:
    async def main() -> None:
        pool = WorkerPool(KvIndex(), PoolSettings(health_interval=3600.0, health_timeout=2.0))
        try:
            await scenario(pool)
        finally:
            await pool.stop()

    asyncio.run(main())


@pytest.fixture
def servers(plain_servers: Callable[..., PlainOpenAIServer]) -> list[str]:
    return [plain_servers().url for _ in range(3)]


def test_a_source_adds_what_it_lists_and_removes_what_it_no_longer_lists(servers: list[str]) -> None:
    a, b, _ = servers
    source = Listed()

    async def scenario(pool: WorkerPool) -> None:
        members = SourceMembers(source, pool, Admission())
        source.urls = [a]
        await members.refresh()
        assert list(pool.workers) == [a]
        assert pool.workers[a].healthy and pool.workers[a].source == "test:listed"
        assert pool.workers[a].describe()["source"] == "test:listed"
        source.urls = [a, b]
        await members.refresh()
        assert sorted(pool.workers) == sorted([a, b]) and pool.workers[b].healthy
        gone = pool.workers[a]
        source.urls = [b]
        await members.refresh()
        assert list(pool.workers) == [b]
        assert not gone.healthy  # out of the active set: no new request goes to it
        assert members.owned == [b]

    _run(scenario)


def test_a_source_leaves_the_flags_and_the_admins_workers_alone(
    servers: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    a, b, c = servers
    source = Listed()

    async def scenario(pool: WorkerPool) -> None:
        await pool.add(WorkerSpec(a), source=FLAG_SOURCE)
        await pool.add(WorkerSpec(b))  # the admin API's
        members = SourceMembers(source, pool, Admission())
        # localhost is 127.0.0.1: the same worker, however spelled
        source.urls = [a.replace("127.0.0.1", "localhost"), b, c]
        with caplog.at_level(logging.WARNING, "tokenfront.router.worker_sources"):
            await members.refresh()
            await members.refresh()
        assert {url: worker.source for url, worker in pool.workers.items()} == {
            a: "flag",
            b: "admin",
            c: "test:listed",
        }
        left = {message.split(", not added: ")[1] for message in _messages(caplog) if "left to it" in message}
        assert (
            len([m for m in _messages(caplog) if "left to it" in m]) == 2
        )  # once each, not at every refresh
        assert left == {
            f"it is in the pool already as {a} (from flag), left to it",
            f"it is in the pool already as {b} (from admin), left to it",
        }
        source.urls = []
        await members.refresh()
        assert sorted(pool.workers) == sorted([a, b])

    _run(scenario)


def test_a_sources_worker_deleted_by_the_admin_comes_back_at_the_next_refresh(servers: list[str]) -> None:
    a, _, _ = servers
    source = Listed()

    async def scenario(pool: WorkerPool) -> None:
        members = SourceMembers(source, pool, Admission())
        source.urls = [a]
        await members.refresh()
        first = pool.workers[a]
        await pool.remove(a)  # what DELETE /workers does
        assert members.owned == []
        await members.refresh()
        assert pool.workers[a] is not first and pool.workers[a].healthy

    _run(scenario)


def test_changed_options_add_the_worker_again_with_them(servers: list[str]) -> None:
    a, _, _ = servers
    source = Listed()

    async def scenario(pool: WorkerPool) -> None:
        members = SourceMembers(source, pool, Admission())
        source.urls = [a]
        await members.refresh()
        source.urls = [f"{a},protocol=generate"]
        await members.refresh()
        assert pool.workers[a].protocol == "generate" and pool.workers[a].healthy

    _run(scenario)


def test_max_workers_refuses_a_sources_worker_once_and_adds_it_when_there_is_room(
    servers: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    a, b, c = servers
    source = Listed()

    async def scenario(pool: WorkerPool) -> None:
        await pool.add(WorkerSpec(a), source=FLAG_SOURCE)
        members = SourceMembers(source, pool, Admission(max_workers=2))
        source.urls = [b, c]
        with caplog.at_level(logging.WARNING, "tokenfront.router.worker_sources"):
            await members.refresh()
            await members.refresh()
        assert len(pool.workers) == 2
        full = [message for message in _messages(caplog) if "the pool is full" in message]
        assert len(full) == 1, full
        assert full[0].startswith("worker source test:listed lists http://127.0.0.1:")
        assert "(2 workers, the router's --max-workers)" in full[0]
        await pool.remove(a)
        await members.refresh()
        assert sorted(pool.workers) == sorted([b, c])

    _run(scenario)


def test_worker_allow_refuses_a_sources_worker_outside_it(
    servers: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    a, _, _ = servers
    source = Listed()
    allow = WorkerAllowList.of([parse_entry("10.0.0.0/8")])

    async def scenario(pool: WorkerPool) -> None:
        members = SourceMembers(source, pool, Admission(allow=allow))
        source.urls = [a]
        with caplog.at_level(logging.WARNING, "tokenfront.router.worker_sources"):
            await members.refresh()
        assert pool.workers == {}
        assert _messages(caplog) == [
            f"worker source test:listed lists {a}, not added: 127.0.0.1 is outside --worker-allow (10.0.0.0/8)"
        ]

    _run(scenario)


def test_a_source_that_cannot_be_read_keeps_its_workers_and_says_so_once(
    servers: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    a, b, _ = servers
    source = Listed()

    async def scenario(pool: WorkerPool) -> None:
        members = SourceMembers(source, pool, Admission())
        source.urls = [a, b]
        await members.refresh()
        source.unavailable = "no such file"
        with caplog.at_level(logging.INFO, "tokenfront.router.worker_sources"):
            for _ in range(3):
                await members.refresh()
            assert sorted(pool.workers) == sorted([a, b])
            source.unavailable = None
            source.urls = [a]
            await members.refresh()
        assert list(pool.workers) == [a]
        messages = _messages(caplog)
        assert messages[0] == (
            "worker source test:listed: no such file; keeping its last 2 workers until it can be read again"
        )
        assert messages[1] == "worker source test:listed can be read again"
        assert messages[2] == f"worker source test:listed no longer lists {b}: removing it"

    _run(scenario)
