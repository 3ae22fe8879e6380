"""deploy/monitoring/ checked with Debian's promtool, and against the rest of deploy/.

- `promtool check rules` on rules.yml, `promtool test rules` on rules_test.yml (one unit test per alert, each
  firing for some series and not for others); and a broken rule fails those unit tests.
- prometheus.yml passes `promtool check config` once its key files exist, and scrapes every job with a
  bearer token read from a file.
- Every dashboard query parses as PromQL (promtool checks it as a recording rule), and reads the dashboard's
  Prometheus variable; every recording rule is read by an alert or the dashboard.
- The ServiceMonitors select the Services of deploy/kubernetes/ by their labels, name their ports, and send the
  key each Service's pods are started with.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from shipped_monitoring import MONITORING, dashboard, debian_binary, expressions, recorded_names, rules

MANIFESTS = MONITORING.parent / "kubernetes"
RECORDED_NAME = re.compile(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b")


def _run(*command: object, cwd: Path = MONITORING) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(part) for part in command], cwd=cwd, capture_output=True, text=True, timeout=60
    )


@pytest.fixture(scope="module")
def promtool() -> Path:
    return debian_binary("promtool")


def _alerts() -> set[str]:
    return {rule["alert"] for group in rules()["groups"] for rule in group["rules"] if "alert" in rule}


def test_promtool_checks_the_rules(promtool: Path) -> None:
    result = _run(promtool, "check", "rules", "rules.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    count = sum(len(group["rules"]) for group in rules()["groups"])
    assert f"SUCCESS: {count} rules found" in result.stdout


def test_promtool_unit_tests_of_every_alert_pass(promtool: Path) -> None:
    result = _run(promtool, "test", "rules", "rules_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    tests = yaml.safe_load((MONITORING / "rules_test.yml").read_text(encoding="utf-8"))["tests"]
    firing = {
        check["alertname"]
        for test in tests
        for check in test.get("alert_rule_test", ())
        if check["exp_alerts"]
    }
    quiet = {
        check["alertname"]
        for test in tests
        for check in test.get("alert_rule_test", ())
        if not check["exp_alerts"]
    }
    alerts = _alerts()
    assert firing == alerts  # each alert is seen firing for some series ...
    assert quiet == alerts  # ... and not firing, before its `for` is over or for series that do not qualify


def test_a_broken_rule_fails_its_unit_test(promtool: Path, tmp_path: Path) -> None:
    # The unit tests can fail: ForwardingOff on the wrong value, and the 5xx alert's threshold ten times higher.
    text = (MONITORING / "rules.yml").read_text(encoding="utf-8")
    broken = text.replace(
        "expr: tokenfront_router_forwarding == 0", "expr: tokenfront_router_forwarding == 1"
    )
    broken = broken.replace(
        "ratio_rate5m > 0.05\n        for: 5m\n        labels:\n          severity: critical",
        "ratio_rate5m > 0.5\n        for: 5m\n        labels:\n          severity: critical",
    )
    assert broken.count("== 1") == text.count("== 1") + 1 and "> 0.5\n" in broken
    (tmp_path / "rules.yml").write_text(broken, encoding="utf-8")
    (tmp_path / "rules_test.yml").write_text((MONITORING / "rules_test.yml").read_text(encoding="utf-8"))
    result = _run(promtool, "test", "rules", "rules_test.yml", cwd=tmp_path)
    assert result.returncode != 0
    failed = set(re.findall(r"alertname: (\w+), time", result.stdout + result.stderr))
    assert failed == {"TokenfrontForwardingOff", "TokenfrontHigh5xxRate"}, result.stdout


def test_the_scrape_config_checks_and_sends_a_bearer_token_from_a_file(
    promtool: Path, tmp_path: Path
) -> None:
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text(encoding="utf-8"))
    assert config["rule_files"] == ["rules.yml"]
    keys = {}
    for job in config["scrape_configs"]:
        auth = job["authorization"]
        assert auth.get("type", "Bearer") == "Bearer" and "credentials" not in auth, job["job_name"]
        keys[job["job_name"]] = auth["credentials_file"]
        # promtool checks that the key files exist: give it some
        local = tmp_path / Path(auth["credentials_file"]).name
        local.write_text("a-key\n")
        auth["credentials_file"] = str(local)
    # Routers and renderers take the clients' key, workers the routers' --worker-api-key.
    assert keys["tokenfront-router"] == keys["tokenfront-renderer"] != keys["tokenfront-worker"]
    config["rule_files"] = [str(MONITORING / "rules.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    result = _run(promtool, "check", "config", tmp_path / "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_every_dashboard_query_parses_and_reads_the_prometheus_variable(
    promtool: Path, tmp_path: Path
) -> None:
    queries = [(where, expr) for where, expr in expressions() if where.startswith(("panel", "annotation"))]
    assert len(queries) > 30
    checked = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query:{i}", "expr": expr} for i, (_, expr) in enumerate(queries)
                ],
            }
        ]
    }
    (tmp_path / "queries.yml").write_text(yaml.safe_dump(checked), encoding="utf-8")
    result = _run(promtool, "check", "rules", tmp_path / "queries.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    board = dashboard()
    variables = {variable["name"]: variable for variable in board["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    panels = [panel for panel in board["panels"] if panel["type"] != "row"]
    assert len({panel["id"] for panel in board["panels"]}) == len(board["panels"])
    for panel in panels:
        assert panel["targets"], panel["title"]
        for source in (panel["datasource"], *(target["datasource"] for target in panel["targets"])):
            assert source == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


def test_every_recording_rule_is_read() -> None:
    recorded = recorded_names()
    read = {
        name for where, expr in expressions() for name in RECORDED_NAME.findall(expr) if where not in recorded
    }
    assert recorded == read


# ---- the ServiceMonitors against deploy/kubernetes/ ----


def _manifests() -> list[dict[str, Any]]:
    documents = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            documents += [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]
    return documents


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", ()):
        assert expression["operator"] == "In", expression  # the only operator used here
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def _api_key_secret(workload: dict[str, Any]) -> tuple[str, str]:
    """The Secret name and key a workload's server reads its --api-key from (TOKENFRONT_API_KEY)."""
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    (env,) = [env for env in container["env"] if env["name"] == "TOKENFRONT_API_KEY"]
    reference = env["valueFrom"]["secretKeyRef"]
    return reference["name"], reference["key"]


def test_the_service_monitors_scrape_every_service_with_its_pods_key() -> None:
    documents = _manifests()
    namespace = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text(encoding="utf-8"))["namespace"]
    services = [doc for doc in documents if doc["kind"] == "Service"]
    workloads = [doc for doc in documents if doc["kind"] in ("Deployment", "StatefulSet")]
    monitors = list(yaml.safe_load_all((MONITORING / "servicemonitor.yaml").read_text(encoding="utf-8")))
    scraped: list[str] = []
    for monitor in monitors:
        assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor")
        assert monitor["metadata"]["namespace"] == namespace
        selected = [
            svc for svc in services if _selects(monitor["spec"]["selector"], svc["metadata"]["labels"])
        ]
        assert selected, monitor["metadata"]["name"]
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["path"] == "/metrics" and endpoint["authorization"]["type"] == "Bearer"
        secret = endpoint["authorization"]["credentials"]
        for service in selected:
            scraped.append(service["metadata"]["name"])
            assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
            pods = [
                w
                for w in workloads
                if _selects(
                    {"matchLabels": service["spec"]["selector"]}, w["spec"]["template"]["metadata"]["labels"]
                )
            ]
            assert pods, service["metadata"]["name"]
            for workload in pods:
                assert _api_key_secret(workload) == (secret["name"], secret["key"]), workload["metadata"][
                    "name"
                ]
    # Each Service that serves HTTP once; the routers' headless peers Service (replica sync over ZMQ only) none.
    http = [
        svc["metadata"]["name"] for svc in services if "http" in {p["name"] for p in svc["spec"]["ports"]}
    ]
    assert sorted(scraped) == sorted(http)
    assert "tokenfront-router-peers" in {svc["metadata"]["name"] for svc in services}
    assert "tokenfront-router-peers" not in scraped
