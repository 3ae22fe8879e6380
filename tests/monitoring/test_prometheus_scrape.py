"""A real Prometheus (Debian's) scraping a real renderer, router and workers with their bearer tokens, and
evaluating the shipped rules.

The module starts, on loopback, a renderer and a router on Qwen3 and two simulated workers behind the router
(`serve --engine simulated`: Qwen3's tokenizer files, no weights): one on Qwen3, and one on SmolLM2, whose
rendering differs from the router's and so keeps the gate closed. Prometheus gets deploy/monitoring/
prometheus.yml with the servers as targets, the keys in files, one second between scrapes and evaluations, and
deploy/monitoring/rules.yml with every alert's `for` cut to one second (the expressions are the shipped ones).
Every process is stopped by its own pid at the end of the module.

- Every metric the rules and the dashboard name is on a real server's /metrics (histograms as `_bucket`,
  `_sum`, `_count`, counters as `_total`), and the labels they select on are the metric's own.
- Prometheus scrapes every server with its token, and a job without one is refused (401); the forwarding
  alerts fire for the SmolLM2 worker; stopping the Qwen3 worker's process makes TokenfrontWorkerUnhealthy fire
  for it. Each wait polls Prometheus's /api/v1/alerts against a deadline.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from shipped_monitoring import MONITORING, debian_binary, expressions, recorded_names

pytestmark = pytest.mark.slow  # four servers and a Prometheus: tens of seconds

API_KEY = "monitoring-test-key"
WORKER_KEY = "monitoring-test-worker-key"
WAIT = 90.0  # seconds an alert may take to fire (a ceiling, not a measurement: about 5 s here)
METRIC_NAME = re.compile(r"\b(?:[a-z_]+:)?tokenfront_[a-z0-9_]+(?::[a-z0-9_]+)?\b")
SELECTOR = re.compile(r"\b([a-z_][a-z0-9_:]*)\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


@dataclass
class Monitored:
    renderer: Any
    router: Any
    worker: Any  # the Qwen3 worker: the one the router routes to
    other_worker: Any  # the SmolLM2 worker: blocks forwarding

    def scraped(self) -> list[tuple[Any, str]]:
        """The servers whose /metrics the names are looked up on, each with its key."""
        return [(self.renderer, API_KEY), (self.router, API_KEY), (self.worker, WORKER_KEY)]


@pytest.fixture(scope="module")
def monitored(
    launch: Callable[..., Any], checkpoint: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Monitored]:
    log_dir = tmp_path_factory.mktemp("monitored")
    qwen3, smollm2 = checkpoint("qwen3"), checkpoint("smollm2")
    commands = [
        ["render", "--model", str(qwen3), "--api-key", API_KEY],
        ["serve", "--engine", "simulated", "--model", str(qwen3), "--api-key", WORKER_KEY],
        ["serve", "--engine", "simulated", "--model", str(smollm2), "--api-key", WORKER_KEY],
    ]
    started: list[Any] = []
    try:
        with ThreadPoolExecutor(len(commands)) as pool:
            futures = [pool.submit(launch, command, log_dir=log_dir, timeout=240.0) for command in commands]
            for future in futures:
                started.append(future.result())
        renderer, worker, other = started
        router_args = ["route", "--model", str(qwen3), "--api-key", API_KEY, "--worker-api-key", WORKER_KEY]
        router_args += ["--worker", worker.url, "--worker", other.url]
        router_args += ["--health-interval", "0.5", "--kv-events-interval", "0.2"]
        router = launch(router_args, log_dir=log_dir, timeout=240.0)
        started.append(router)
        yield Monitored(renderer, router, worker, other)
    finally:
        for server in started:
            server.stop()


def _metrics(server: Any, key: str = API_KEY) -> str:
    response = httpx.get(f"{server.url}/metrics", headers={"authorization": f"Bearer {key}"}, timeout=30)
    response.raise_for_status()
    return response.text


def _post(server: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    response = httpx.post(
        f"{server.url}{path}", json=body, headers={"authorization": f"Bearer {API_KEY}"}, timeout=60
    )
    response.raise_for_status()
    return response


def _traffic(monitored: Monitored) -> None:
    """Requests that give the labelled metrics samples: chats through the router, renders on the renderer,
    one large enough to go to the render thread."""
    chat = {"model": "qwen3", "messages": [{"role": "user", "content": "Name a river."}], "max_tokens": 4}
    for _ in range(3):
        _post(monitored.router, "/v1/chat/completions", chat)
    _post(monitored.renderer, "/v1/chat/completions/render", chat)
    large = {"model": "qwen3", "messages": [{"role": "user", "content": "river " * 20_000}]}
    _post(monitored.renderer, "/v1/chat/completions/render", large)
    _post(monitored.renderer, "/v1/completions/render", {"model": "qwen3", "prompt": "A river"})


def _exposed(text: str) -> tuple[set[str], dict[str, set[str]]]:
    """The sample names a /metrics text can have (from its TYPE lines, samples or not), and for the samples
    it has, each name's label names."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names.update(name + suffix for suffix in SUFFIXES.get(kind, ("",)))
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return names, labels


def test_every_metric_the_rules_and_dashboard_name_is_on_a_real_server(monitored: Monitored) -> None:
    _traffic(monitored)
    exposed: set[str] = set()
    label_names: dict[str, set[str]] = {}
    for server, key in monitored.scraped():
        names, labels = _exposed(_metrics(server, key))
        exposed |= names
        for name, found in labels.items():
            label_names.setdefault(name, set()).update(found)
    used = {name for _, expr in expressions() for name in METRIC_NAME.findall(expr)}
    assert {name for name in used if ":" in name} <= recorded_names()
    missing = sorted(name for name in used if ":" not in name and name not in exposed)
    assert not missing, missing
    # The new metrics are among them.
    assert {"tokenfront_render_queued", "tokenfront_render_wait_seconds_bucket"} <= used
    assert {"tokenfront_router_worker_state", "tokenfront_router_kv_events_age_seconds"} <= used
    # Labels selected on: each is the metric's own, wherever the metric has samples here.
    checked = 0
    for where, expr in expressions():
        for name, matchers in SELECTOR.findall(expr):
            if ":" in name or name not in label_names:
                continue
            for label in MATCHER.findall(matchers):
                assert label in label_names[name] | {"job", "instance"}, (where, name, label)
                checked += 1
    assert checked >= 8
    # One render went to the render thread, and waited there (its queue is empty again).
    renderer_text = _metrics(monitored.renderer)
    assert _sample(renderer_text, "tokenfront_render_wait_seconds_count") >= 1
    assert _sample(renderer_text, "tokenfront_render_queued") == 0


def _sample(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"no sample {name}{labels or ''}")


# ---- a real Prometheus ----


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _target(server: Any) -> str:
    return urlsplit(server.url).netloc


def _config(monitored: Monitored, directory: Path) -> Path:
    """deploy/monitoring/prometheus.yml pointed at the test's servers and key files, scraping and evaluating
    every second, with one more job that sends no key; and rules.yml with each `for` cut to one second."""
    rules = yaml.safe_load((MONITORING / "rules.yml").read_text(encoding="utf-8"))
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "1s"
    (directory / "rules.yml").write_text(yaml.safe_dump(rules), encoding="utf-8")
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text(encoding="utf-8"))
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"}
    config["rule_files"] = [str(directory / "rules.yml")]
    (directory / "api-key").write_text(API_KEY + "\n")
    (directory / "worker-api-key").write_text(WORKER_KEY + "\n")
    targets = {
        "tokenfront-router": [monitored.router],
        "tokenfront-renderer": [monitored.renderer],
        "tokenfront-worker": [monitored.worker, monitored.other_worker],
    }
    for job in config["scrape_configs"]:
        key = "worker-api-key" if job["job_name"] == "tokenfront-worker" else "api-key"
        job["authorization"]["credentials_file"] = str(directory / key)
        job["static_configs"] = [{"targets": [_target(server) for server in targets[job["job_name"]]]}]
    config["scrape_configs"].append(
        {
            "job_name": "tokenfront-renderer-without-key",
            "static_configs": [{"targets": [_target(monitored.renderer)]}],
        }
    )
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def prometheus_url(monitored: Monitored, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    prometheus = debian_binary("prometheus")
    directory = tmp_path_factory.mktemp("prometheus")
    port = _free_port()
    command = [
        str(prometheus),
        f"--config.file={_config(monitored, directory)}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    log_path = directory / "prometheus.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        ready = _wait_for(lambda: _ready(url, process, log_path), timeout=60)
        assert ready, log_path.read_text(errors="replace")[-3000:]
        yield url
    finally:
        process.terminate()  # its own pid
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _ready(url: str, process: subprocess.Popen[bytes], log_path: Path) -> bool:
    if process.poll() is not None:
        raise AssertionError(
            f"prometheus exited with {process.returncode}:\n{log_path.read_text(errors='replace')}"
        )
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _wait_for(condition: Callable[[], Any], timeout: float = WAIT) -> Any:
    """Poll `condition` until it returns something true or `timeout` seconds pass; its last result."""
    deadline = time.monotonic() + timeout
    result = condition()
    while not result and time.monotonic() < deadline:
        time.sleep(0.2)
        result = condition()
    return result


def _api(url: str, path: str, **params: str) -> Any:
    answer = httpx.get(f"{url}/api/v1/{path}", params=params, timeout=10).json()
    assert answer["status"] == "success", answer
    return answer["data"]


def _firing(url: str, alertname: str, **labels: str) -> list[dict[str, Any]]:
    return [
        alert
        for alert in _api(url, "alerts")["alerts"]
        if alert["labels"]["alertname"] == alertname
        and alert["state"] == "firing"
        and all(alert["labels"].get(k) == v for k, v in labels.items())
    ]


def _targets(url: str) -> dict[tuple[str, str], dict[str, Any]]:
    active = _api(url, "targets")["activeTargets"]
    return {(t["labels"]["job"], t["labels"]["instance"]): t for t in active}


def test_prometheus_scrapes_every_server_with_its_token(prometheus_url: str, monitored: Monitored) -> None:
    def scraped() -> dict[tuple[str, str], dict[str, Any]] | None:
        targets = _targets(prometheus_url)
        return targets if all(t["health"] != "unknown" for t in targets.values()) else None

    targets = _wait_for(scraped, timeout=30)
    assert targets, _targets(prometheus_url)
    health = {key: (t["health"], t["lastError"]) for key, t in targets.items()}
    renderer = _target(monitored.renderer)
    expected_up = [
        ("tokenfront-router", _target(monitored.router)),
        ("tokenfront-renderer", renderer),
        ("tokenfront-worker", _target(monitored.worker)),
        ("tokenfront-worker", _target(monitored.other_worker)),
    ]
    for key in expected_up:
        assert health[key] == ("up", ""), health
    state, error = health[("tokenfront-renderer-without-key", renderer)]
    assert state == "down" and "401" in error, health
    # What it scraped is the servers' own: the router's gauge of its workers, by the labels the rules use.
    query = 'tokenfront_router_worker_state{state="healthy"}'
    result = _wait_for(lambda: _api(prometheus_url, "query", query=query)["result"], timeout=30)
    values = {sample["metric"]["worker"]: sample["value"][1] for sample in result}
    assert values == {monitored.worker.url: "1", monitored.other_worker.url: "1"}
    # The job without a key is down, and the shipped rule says so.
    assert _wait_for(
        lambda: _firing(prometheus_url, "TokenfrontScrapeFailing", job="tokenfront-renderer-without-key")
    )


def test_the_forwarding_alerts_fire_for_a_worker_that_renders_differently(
    prometheus_url: str, monitored: Monitored
) -> None:
    blocking = _wait_for(lambda: _firing(prometheus_url, "TokenfrontWorkerBlocksForwarding"))
    assert [alert["labels"]["worker"] for alert in blocking] == [monitored.other_worker.url]
    (forwarding_off,) = _wait_for(lambda: _firing(prometheus_url, "TokenfrontForwardingOff"))
    assert forwarding_off["labels"]["job"] == "tokenfront-router"
    assert forwarding_off["labels"]["severity"] == "warning"
    assert forwarding_off["annotations"]["summary"] == (
        f"The router on {_target(monitored.router)} forwards no token ids"
    )
    assert not _firing(prometheus_url, "TokenfrontWorkerUnhealthy")  # both workers pass their checks


def test_a_worker_down_fires_worker_unhealthy(prometheus_url: str, monitored: Monitored) -> None:
    # Last in the module: it stops the worker the router routes to.
    assert not _firing(prometheus_url, "TokenfrontWorkerUnhealthy")
    monitored.worker.stop()  # SIGTERM to its own pid
    (alert,) = _wait_for(lambda: _firing(prometheus_url, "TokenfrontWorkerUnhealthy"))
    assert alert["labels"]["worker"] == monitored.worker.url
    assert alert["labels"]["state"] == "unhealthy"
    assert alert["annotations"]["summary"] == (
        f"Worker {monitored.worker.url} is unhealthy on the router {_target(monitored.router)}"
    )
    # Prometheus now finds the stopped worker's own target down too.
    assert _wait_for(
        lambda: _targets(prometheus_url)[("tokenfront-worker", _target(monitored.worker))]["health"] == "down"
    )
