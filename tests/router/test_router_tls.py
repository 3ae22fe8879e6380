"""TLS on every server and on the router's way to its workers, with certificates the test makes (trustme).

A renderer, a simulated worker that asks for client certificates (mutual TLS) and a router over HTTPS, the
router verifying its worker against the test's CA and showing its own client certificate; a router given
another CA keeps the worker out and says what to do; `tokenfront check` likewise; the mistakes an operator
can make with the flags are one line and exit 2 before anything loads.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from conftest import Fleet, chat, forwarded, router_command, wait_until

pytestmark = pytest.mark.slow  # real server processes


class Certificates:
    """A CA, a server certificate for 127.0.0.1 signed by it, a client certificate, and another CA."""

    def __init__(self, folder: Path) -> None:
        self.ca = trustme.CA()
        self.other_ca = trustme.CA()
        self.folder = folder
        self.ca_file = self._write("ca.pem", self.ca.cert_pem.bytes())
        self.other_ca_file = self._write("other-ca.pem", self.other_ca.cert_pem.bytes())
        server = self.ca.issue_cert("127.0.0.1", "localhost")
        self.cert_file = self._write("server.pem", b"".join(pem.bytes() for pem in server.cert_chain_pems))
        self.key_file = self._write("server.key", server.private_key_pem.bytes())
        client = self.ca.issue_cert("router@tokenfront.test")
        self.client_file = self._write("client.pem", client.private_key_and_cert_chain_pem.bytes())
        stranger = self.other_ca.issue_cert("127.0.0.1")
        self.stranger_key = self._write("stranger.key", stranger.private_key_pem.bytes())

    def _write(self, name: str, data: bytes) -> str:
        path = self.folder / name
        path.write_bytes(data)
        return str(path)

    def server_flags(self, *, client_certificates: bool = False) -> list[str]:
        flags = ["--ssl-certfile", self.cert_file, "--ssl-keyfile", self.key_file]
        return [*flags, "--ssl-ca-certs", self.ca_file] if client_certificates else flags

    def client_context(self, *, with_certificate: bool = False) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file)
        if with_certificate:
            context.load_cert_chain(self.client_file)
        return context


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return Certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def worker(fleet: Fleet, qwen3: Path, certificates: Certificates) -> Any:
    """A simulated worker that serves HTTPS and takes only clients with a certificate of the test's CA."""
    return fleet.start(
        "serve",
        "--engine",
        "simulated",
        "--model",
        str(qwen3),
        *certificates.server_flags(client_certificates=True),
        verify=certificates.client_context(with_certificate=True),
    )


@pytest.fixture(scope="module")
def router(fleet: Fleet, qwen3: Path, worker: Any, certificates: Certificates) -> Any:
    """A router over HTTPS, verifying its worker against the test's CA, with the client certificate."""
    command = router_command(
        qwen3,
        [worker.url],
        "--worker-ca-certs",
        certificates.ca_file,
        "--worker-certfile",
        certificates.client_file,
        *certificates.server_flags(),
    )
    return fleet.start(*command, verify=certificates.client_context())


def test_a_renderer_serves_https_with_its_certificate(
    fleet: Fleet, qwen3: Path, certificates: Certificates
) -> None:
    renderer = fleet.start(
        "render", "--model", str(qwen3), *certificates.server_flags(), verify=certificates.client_context()
    )
    assert renderer.url.startswith("https://")
    body = {"model": "qwen3", "messages": [{"role": "user", "content": "hello over TLS"}]}
    with httpx.Client(base_url=renderer.url, verify=certificates.client_context()) as client:
        rendered = client.post("/v1/chat/completions/render", json=body)
    assert rendered.status_code == 200, rendered.text
    assert len(rendered.json()["token_ids"]) > 5
    assert "serving on https://127.0.0.1:" in renderer.log()
    # Its certificate is the test CA's, which the system does not trust.
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{renderer.url}/health")
    # Plain HTTP on the TLS port gets no answer.
    with pytest.raises(httpx.HTTPError):
        httpx.get(renderer.url.replace("https://", "http://") + "/health", timeout=5)


def test_a_worker_with_ssl_ca_certs_takes_only_clients_with_a_certificate(
    worker: Any, certificates: Certificates
) -> None:
    with httpx.Client(verify=certificates.client_context(with_certificate=True)) as client:
        assert client.get(f"{worker.url}/health").status_code == 200
    with httpx.Client(verify=certificates.client_context()) as client, pytest.raises(httpx.HTTPError):
        # TLS 1.3: the refusal arrives with the first read, after the handshake seemed done.
        client.get(f"{worker.url}/health")


def test_the_router_verifies_its_https_worker_and_forwards_over_tls(
    router: Any, worker: Any, certificates: Certificates
) -> None:
    with httpx.Client(base_url=router.url, verify=certificates.client_context(), timeout=60) as client:
        assert wait_until(lambda: _state(client, worker.url)["state"] == "healthy", timeout=30), _state(
            client, worker.url
        )
        responses = [
            chat(client, [{"role": "user", "content": f"question {seed} over TLS"}]) for seed in range(3)
        ]
    assert all(forwarded(response) for response in responses)
    assert all(response.json()["choices"][0]["message"]["content"] for response in responses)


def test_a_router_given_another_ca_keeps_the_worker_out_and_says_why(
    fleet: Fleet, qwen3: Path, worker: Any, certificates: Certificates
) -> None:
    command = router_command(
        qwen3,
        [worker.url],
        "--worker-ca-certs",
        certificates.other_ca_file,
        "--worker-certfile",
        certificates.client_file,
    )
    router = fleet.start(*command)
    with httpx.Client(base_url=router.url, timeout=30) as client:
        assert wait_until(lambda: _state(client, worker.url).get("problem") is not None, timeout=30)
        state = _state(client, worker.url)
        answer = client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        )
    assert state["state"] == "unhealthy", state
    assert "CERTIFICATE_VERIFY_FAILED" in state["problem"], state
    assert "give the CA that signed it with --worker-ca-certs" in state["problem"], state
    assert answer.status_code == 503, answer.text


def test_check_verifies_https_servers_with_its_ca(
    router: Any, worker: Any, certificates: Certificates
) -> None:
    base = [sys.executable, "-m", "tokenfront.cli", "check", "--renderer", router.url, "--worker", worker.url]
    trusted = _run([*base, "--ca-certs", certificates.ca_file, "--certfile", certificates.client_file])
    assert trusted.returncode == 0, trusted.stdout + trusted.stderr
    untrusted = _run(base)
    assert untrusted.returncode == 2, untrusted.stdout + untrusted.stderr
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stdout, untrusted.stdout
    assert "give the CA that signed it with --ca-certs" in untrusted.stdout, untrusted.stdout


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ssl-certfile", "{missing}"], "error: --ssl-certfile {missing}: no such file"),
        (
            ["--ssl-keyfile", "{key}"],
            "error: --ssl-keyfile needs --ssl-certfile (the server's certificate, PEM)",
        ),
        (
            ["--ssl-certfile", "{cert}", "--ssl-keyfile", "{stranger}"],
            "error: --ssl-certfile / --ssl-keyfile: the key does not belong to the certificate",
        ),
        (
            ["--ssl-certfile", "{ca}"],
            "error: --ssl-certfile: not a PEM certificate and private key",
        ),
        (
            ["--ssl-certfile", "{cert}", "--ssl-keyfile", "{key}", "--ssl-ca-certs", "{key}"],
            "error: --ssl-ca-certs {key}: not a PEM bundle of CA certificates",
        ),
    ],
)
def test_tls_mistakes_are_one_line_before_anything_loads(
    certificates: Certificates, flags: list[str], message: str
) -> None:
    names = {
        "missing": str(certificates.folder / "missing.pem"),
        "key": certificates.key_file,
        "cert": certificates.cert_file,
        "stranger": certificates.stranger_key,
        "ca": certificates.ca_file,
    }
    # A checkpoint that does not exist: the TLS files are checked first, so its error never shows.
    command = ["render", "--model", "/nonexistent/checkpoint", *(flag.format(**names) for flag in flags)]
    result = _run([sys.executable, "-m", "tokenfront.cli", *command])
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(message.format(**names)), lines[0]


def test_router_client_certificate_mistakes_are_one_line(certificates: Certificates) -> None:
    result = _run(
        [
            sys.executable,
            "-m",
            "tokenfront.cli",
            "route",
            "--worker",
            "https://127.0.0.1:1",
            "--worker-keyfile",
            certificates.key_file,
        ]
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: --worker-keyfile needs --worker-certfile (the client certificate, PEM)"
    ), result.stderr


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def _state(client: httpx.Client, url: str) -> dict[str, Any]:
    return next(item for item in client.get("/workers").json()["workers"] if item["url"] == url)
