"""A router's text log under forged input (issue 17, item 6): a newline from a client or a worker never starts
a line of its own.

One real router (no model: it starts in a second) with `--access-log`, in front of a stand-in worker whose
`/server_info` lists a model name carrying a forged log line; a client then asks for a path whose `%0A`
carries another. Both values reach the log (the worker's names in the model-names warning, the path in the
access line), escaped inside their own line. In-process checks of the formatter are in
tests/server/test_log_escaping.py.
"""

from __future__ import annotations

from typing import Any

import httpx

from conftest import Fleet, log_lines, router_command, wait_until

# Lines that would look like the router's own if they started a line.
FORGED_BY_WORKER = "2031-01-01 00:00:00,000 CRITICAL tokenfront: forged by the worker"
FORGED_BY_CLIENT = "2031-01-01 00:00:00,000 CRITICAL tokenfront: forged by the client"


def test_forged_lines_from_a_worker_and_a_client_stay_inside_their_line(
    fleet: Fleet, plain_servers: Any
) -> None:
    worker = plain_servers({"role": "worker", "served_model_names": [f"other\n{FORGED_BY_WORKER}\r\x1b[2K"]})
    router = fleet.start(
        *router_command(None, [worker.url], "--served-model-name", "real-model", "--access-log")
    )
    assert wait_until(lambda: log_lines(router, "model names differ"), timeout=30.0), router.log()[-3000:]
    path = "/x%0A" + FORGED_BY_CLIENT.replace(" ", "%20")
    response = httpx.get(router.url + path, timeout=30.0)
    assert response.status_code == 404
    assert wait_until(lambda: log_lines(router, "forged by the client"), timeout=30.0)

    lines = router.log().splitlines()
    assert not any(line.startswith("2031-") for line in lines), [line for line in lines if "forged" in line]
    (warning,) = log_lines(router, "forged by the worker")
    assert "WARNING tokenfront.router.worker_health: worker " in warning and "model names differ" in warning
    assert f"other\\n{FORGED_BY_WORKER}\\r\\x1b[2K" in warning
    (access,) = log_lines(router, "forged by the client")
    assert "INFO tokenfront.access: " in access and f'"GET /x\\n{FORGED_BY_CLIENT}" 404' in access
    raw = router.log_path.read_bytes()  # as written: read_text would turn a CR into a line break
    assert b"\r" not in raw and b"\x1b" not in raw
