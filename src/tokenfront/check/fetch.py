"""What `tokenfront check` asks each server: `GET /server_info`, then the probe corpus on `POST /tokenize`.

A server is read once into a `ServerReport`; nothing is compared here. A server that cannot be read at all
(connection refused, a timeout, a key refused, an answer that is no `/server_info`) gets a `problem` and no
more questions; a server without render routes (404 on `/tokenize`, or a tokenfront worker whose
`/server_info` says `"render_endpoints": false`) is still compared by its fingerprint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from tokenfront.core.fingerprint import Fingerprint
from tokenfront.probe_corpus import ProbeCase, refusal_message, token_ids
from tokenfront.tls import describe_tls_failure

# Statuses that mean "this route is not here" rather than "this request was refused".
_NO_ROUTE = frozenset({404, 405})
_KEY_REFUSED = frozenset({401, 403})


@dataclass(frozen=True)
class CaseAnswer:
    """A server's answer to one corpus case: its ids, or the status and message it refused the case with."""

    status: int
    ids: list[int] | None = None
    message: str | None = None


@dataclass
class ServerReport:
    """What one server said.

    `problem`: why the server could not be checked (None when it could); `has_info`: `/server_info` answered
    (a server that is not tokenfront, vLLM say, answers 404); `render_routes`: None until the corpus was
    asked, then whether `/tokenize` is there; `routes_note` says why not when it is not.
    """

    name: str
    url: str
    problem: str | None = None
    has_info: bool = False
    role: str | None = None
    model_names: tuple[str, ...] = ()
    fingerprint: Fingerprint | None = None
    render_routes: bool | None = None
    routes_note: str | None = None
    answers: dict[str, CaseAnswer] = field(default_factory=dict)


def fetch_server(
    client: httpx.Client, name: str, url: str, cases: Sequence[ProbeCase], *, api_key: str | None
) -> ServerReport:
    """Read `/server_info` of the server at `url`, then ask it each of `cases` on `/tokenize`."""
    report = ServerReport(name, url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    info = _get_json(client, report, "/server_info", headers)
    if report.problem is not None:
        return report
    if info is not None:
        _read_info(report, info)
    if report.render_routes is False:
        return report
    for case in cases:
        answer = _ask(client, report, case, headers)
        if answer is None:  # a problem, or no render routes: stop asking
            return report
        report.answers[case.name] = answer
    if cases:  # asked and answered: the route is there (None: nothing was asked)
        report.render_routes = True
    return report


def _get_json(
    client: httpx.Client, report: ServerReport, path: str, headers: dict[str, str]
) -> dict[str, Any] | None:
    """The JSON object `GET path` answers; None on a 404 (no such route); sets `report.problem` otherwise."""
    response = _send(client, report, "GET", path, headers)
    if response is None:
        return None
    if response.status_code in _NO_ROUTE:
        return None
    if response.status_code != 200:
        report.problem = _refused(response, path, bool(headers))
        return None
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        report.problem = (
            f"GET {path} answered something that is not a JSON object: is this a tokenfront server?"
        )
        return None
    return body


def _read_info(report: ServerReport, info: dict[str, Any]) -> None:
    report.has_info = True
    role = info.get("role")
    report.role = role if isinstance(role, str) else None
    names = info.get("served_model_names")
    if isinstance(names, list):
        report.model_names = tuple(name for name in names if isinstance(name, str))
    elif isinstance(info.get("model"), str):
        report.model_names = (info["model"],)
    report.fingerprint = Fingerprint.from_json(info.get("render_fingerprint"))
    if info.get("render_endpoints") is False:  # a tokenfront worker says so itself: no need to ask
        report.render_routes = False
        report.routes_note = "render routes off (start the worker with TOKENFRONT_ENABLE_RENDER_ENDPOINTS=1)"


def _ask(
    client: httpx.Client, report: ServerReport, case: ProbeCase, headers: dict[str, str]
) -> CaseAnswer | None:
    """One case on `/tokenize`; None when the server cannot be asked (a problem, or the route is not there)."""
    response = _send(client, report, "POST", "/tokenize", headers, json=dict(case.body))
    if response is None:
        return None
    if response.status_code in _NO_ROUTE:
        report.render_routes = False
        report.routes_note = f"no POST /tokenize (it answered {response.status_code})"
        return None
    if response.status_code in _KEY_REFUSED:
        report.problem = _refused(response, "/tokenize", bool(headers))
        return None
    if response.status_code != 200:
        return CaseAnswer(response.status_code, message=refusal_message(response))
    ids = token_ids(response)
    if ids is None:
        return CaseAnswer(response.status_code, message="the answer has no list of token ids")
    return CaseAnswer(200, ids=ids)


def _send(
    client: httpx.Client,
    report: ServerReport,
    method: str,
    path: str,
    headers: dict[str, str],
    json: Any = None,
) -> httpx.Response | None:
    try:
        return client.request(method, report.url + path, headers=headers, json=json)
    except httpx.HTTPError as exc:
        detail = str(exc).strip()
        report.problem = f"unreachable: {method} {path} failed ({type(exc).__name__}" + (
            f": {detail})" if detail else ")"
        )
        advice = describe_tls_failure(exc, ca_flag="--ca-certs")
        if advice:
            report.problem += f"; {advice}"
        return None


def _refused(response: httpx.Response, path: str, sent_key: bool) -> str:
    status = response.status_code
    if status in _KEY_REFUSED:
        what = "the key sent" if sent_key else "a request without a key"
        return (
            f"{path} answered {status} to {what}: give its key with --api-key (the renderer's, and the "
            "workers' unless --worker-api-key gives theirs)"
        )
    return f"{path} answered {status} ({refusal_message(response)})"
