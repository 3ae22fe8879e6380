"""The router's render, bounded and in processes of its own (`--render-timeout`, `--render-processes`).

One real worker behind three real routers: one rendering as usual, one whose every render is late (a timeout of
a microsecond), one rendering in two render processes. A late render is routed by load and counted, and the
client's answer is the one it gets through the normal router; render processes answer as the router's own
process does, client errors included; a render process that dies is replaced.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from test_admin_auth import _start_up_error

from conftest import Fleet, forwarded, metric, router_command, wait_until

pytestmark = pytest.mark.slow  # real server processes: a worker and three routers

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour."}],
    [{"role": "user", "content": "Count: one, two, " + "three, " * 200}],
]
COMPLETIONS = [
    {"prompt": "The capital of France is"},
    {"prompt": ["Once upon a time", "In a galaxy far away"]},
    {"prompt": [1, 2, 3, 4, 5]},
]


@pytest.fixture(scope="module")
def routers(fleet: Fleet, tiny_random: Path) -> SimpleNamespace:
    # Client templates are allowed where a slow render is needed (the render process killed during one); the
    # fingerprint does not depend on it.
    allow = "--allow-request-chat-template"
    (worker,) = fleet.start_many(["serve", "--model", str(tiny_random), allow])
    normal, late, processes = fleet.start_many(
        router_command(tiny_random, [worker.url]),
        router_command(tiny_random, [worker.url], "--render-timeout", "0.000001"),
        router_command(tiny_random, [worker.url], "--render-processes", "2", "--render-timeout", "30", allow),
    )
    for router in (normal, late, processes):
        assert wait_until(lambda r=router: _forwarding(r), timeout=60.0), router.log()[-3000:]
    return SimpleNamespace(worker=worker, normal=normal, late=late, processes=processes)


@pytest.fixture(scope="module")
def clients(routers: SimpleNamespace) -> Iterator[SimpleNamespace]:
    with (
        httpx.Client(base_url=routers.normal.url, timeout=120.0) as normal,
        httpx.Client(base_url=routers.late.url, timeout=120.0) as late,
        httpx.Client(base_url=routers.processes.url, timeout=120.0) as processes,
    ):
        yield SimpleNamespace(normal=normal, late=late, processes=processes)


def _forwarding(router: Any) -> bool:
    return bool(httpx.get(f"{router.url}/workers", timeout=10.0).json()["gate"]["forwarding"])


def _chat(client: httpx.Client, messages: list[dict[str, Any]]) -> httpx.Response:
    response = client.post(
        "/v1/chat/completions", json={"messages": messages, "max_tokens": 12, "temperature": 0}
    )
    assert response.status_code == 200, response.text
    return response


def _completion(client: httpx.Client, body: dict[str, Any]) -> httpx.Response:
    response = client.post("/v1/completions", json={**body, "max_tokens": 12, "temperature": 0})
    assert response.status_code == 200, response.text
    return response


def _answers(response: httpx.Response) -> list[tuple[Any, ...]]:
    """What the client was answered: each choice's text (or message content) and finish reason."""
    return [
        (choice.get("text", choice.get("message", {}).get("content")), choice["finish_reason"])
        for choice in response.json()["choices"]
    ]


def _renders(router: Any, outcome: str) -> float:
    return metric(router.url, "tokenfront_router_renders_total", outcome=outcome)


def test_a_late_render_is_routed_by_load_and_answers_the_same(
    routers: SimpleNamespace, clients: SimpleNamespace
) -> None:
    rendered_before = metric(routers.worker.url, "tokenfront_worker_prompts_total", source="rendered")
    compared = 0
    for messages in CHATS:
        expected, got = _chat(clients.normal, messages), _chat(clients.late, messages)
        assert forwarded(expected) and not forwarded(got)
        assert _answers(got) == _answers(expected) and _answers(got)[0][0]
        compared += 1
    assert compared == len(CHATS) == 3
    # Every render was late: counted, routed by load alone (no ids: the worker rendered each one itself).
    assert _renders(routers.late, "late") == compared
    assert _renders(routers.late, "ok") == 0
    assert metric(routers.late.url, "tokenfront_router_not_forwarded_total", reason="render_late") == compared
    rendered_after = metric(routers.worker.url, "tokenfront_worker_prompts_total", source="rendered")
    assert rendered_after - rendered_before == compared
    # The router said so in its log, once (at most one warning a minute), and nothing went wrong.
    log = routers.late.log()
    assert log.count("not rendered within --render-timeout 1e-06 s") == 1, log[-3000:]
    assert "Traceback" not in log
    # The normal router's renders were in time, and timed.
    assert _renders(routers.normal, "ok") >= compared
    assert metric(routers.normal.url, "tokenfront_router_render_seconds_count") >= compared
    info = httpx.get(f"{routers.late.url}/server_info", timeout=10.0).json()
    assert info["render"] == {"timeout": 1e-06, "processes": None}


def test_render_processes_answer_as_the_routers_own_process(
    routers: SimpleNamespace, clients: SimpleNamespace
) -> None:
    info = httpx.get(f"{routers.processes.url}/server_info", timeout=10.0).json()
    assert info["render"] == {"timeout": 30.0, "processes": {"processes": 2, "ready": 2, "replaced": 0}}
    ok_before = _renders(routers.processes, "ok")
    compared = 0
    for messages in CHATS:
        expected, got = _chat(clients.normal, messages), _chat(clients.processes, messages)
        assert forwarded(got) and forwarded(expected)
        assert _answers(got) == _answers(expected)
        compared += 1
    for body in COMPLETIONS:
        expected, got = _completion(clients.normal, body), _completion(clients.processes, body)
        assert forwarded(got) == forwarded(expected)
        assert _answers(got) == _answers(expected) and len(_answers(got)) == len(_answers(expected))
        compared += 1
    assert compared == len(CHATS) + len(COMPLETIONS) == 6
    assert _renders(routers.processes, "ok") - ok_before == compared
    assert _renders(routers.processes, "late") == _renders(routers.processes, "failed") == 0


def test_a_clients_render_error_is_still_its_400_from_a_render_process(clients: SimpleNamespace) -> None:
    mistakes = [
        (
            "/v1/chat/completions",
            {"messages": CHATS[0], "chat_template_kwargs": {"messages": []}},
        ),
        ("/v1/chat/completions", {"messages": CHATS[0], "continue_final_message": True}),
        ("/v1/completions", {"prompt": "Hello", "suffix": "world"}),
        ("/v1/completions", {"prompt": [1, 2, 10**9]}),
    ]
    compared = 0
    for path, body in mistakes:
        expected = clients.normal.post(path, json=body)
        got = clients.processes.post(path, json=body)
        assert got.status_code == expected.status_code == 400, got.text
        assert got.json()["error"] == expected.json()["error"]
        assert got.json()["error"]["param"] is not None
        compared += 1
    assert compared == len(mistakes) == 4


# A client template that loops for about a second (3 M steps: under the 4 M a render may take).
SLOW_TEMPLATE = (
    "{% for i in range(3000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}{{ messages[0].content }}"
)


def test_a_render_process_that_dies_is_replaced(routers: SimpleNamespace, clients: SimpleNamespace) -> None:
    router = routers.processes
    before = _render_processes(router.process.pid)
    assert len(before) == 2, before
    failed_before = _renders(router, "failed")
    # Killed during a render: that render fails, the request is routed by load (the worker renders it) and
    # answered; the process is replaced.
    busy_before = {pid: _cpu_seconds(pid) for pid in before}
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(
            clients.processes.post,
            "/v1/chat/completions",
            json={"messages": CHATS[0], "chat_template": SLOW_TEMPLATE, "max_tokens": 4, "temperature": 0},
        )
        busy: list[int] = []
        assert wait_until(
            lambda: bool(busy.extend(p for p in before if _cpu_seconds(p) - busy_before[p] > 0.1) or busy),
            timeout=30.0,
        )
        os.kill(busy[0], signal.SIGKILL)  # the hostile event under test: a render process killed
        response = slow.result(timeout=120)
    assert response.status_code == 200, response.text
    assert not forwarded(response) and response.json()["choices"][0]["message"]["content"]
    assert _renders(router, "failed") - failed_before == 1
    assert metric(router.url, "tokenfront_router_not_forwarded_total", reason="render_failed") == 1
    _wait_replaced(router, 1)
    survivor = next(pid for pid in before if pid != busy[0])
    after = _render_processes(router.process.pid)
    assert len(after) == 2 and survivor in after and busy[0] not in after, (before, after)

    # Killed while idle: found at the next render, which goes to the other process; replaced again.
    os.kill(survivor, signal.SIGKILL)
    assert wait_until(lambda: survivor not in _render_processes(router.process.pid), timeout=30)
    compared = 0
    for messages in CHATS:
        # Whether its render went to the dead process (failed: routed by load) or another, the answer holds.
        assert _answers(_chat(clients.processes, messages)) == _answers(_chat(clients.normal, messages))
        compared += 1
    assert compared == 3
    _wait_replaced(router, 2)
    assert metric(router.url, "tokenfront_router_render_processes_replaced_total") == 2
    assert not set(before) & set(_render_processes(router.process.pid))
    assert _chat(clients.processes, CHATS[0]).headers["x-tokenfront-forwarded"] == "true"
    assert "Traceback" not in router.log()


def _wait_replaced(router: Any, replaced: int) -> None:
    url = f"{router.url}/server_info"
    expected = {"processes": 2, "ready": 2, "replaced": replaced}
    assert wait_until(
        lambda: httpx.get(url, timeout=10.0).json()["render"]["processes"] == expected, timeout=60.0
    ), httpx.get(url, timeout=10.0).json()["render"]


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _render_processes(router_pid: int) -> list[int]:
    """The router's render processes: its children that are multiprocessing spawns (not its resource
    tracker), oldest first."""
    found = []
    for task in Path(f"/proc/{router_pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                command = Path(f"/proc/{child}/cmdline").read_bytes()
                state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue  # gone meanwhile
            if b"spawn_main" in command and state != "Z":
                found.append(int(child))
    return sorted(found)


def test_render_flags_refused_at_start_up(tiny_random: Path) -> None:
    most = (os.cpu_count() or 1) * 4
    cases = [
        (["--render-processes", "-1"], "error: argument --render-processes: must not be negative"),
        (["--render-processes", "two"], "error: argument --render-processes: not an integer: 'two'"),
        (
            ["--model", str(tiny_random), "--render-processes", str(most + 1)],
            f"error: --render-processes {most + 1}: at most {most} (4 per CPU",
        ),
        (["--render-processes", "1"], "error: --render-processes needs --model or --tokenizer"),
        (["--render-timeout", "0"], "error: argument --render-timeout: must be more than 0"),
        (["--render-timeout", "-2"], "error: argument --render-timeout: must be more than 0"),
    ]
    refused = 0
    for args, line in cases:
        error = _start_up_error(args)  # exit 2, one `error:` line, no traceback
        assert error.startswith(line), error
        refused += 1
    assert refused == len(cases) == 6
