"""TLS: a server's certificate (and the client certificates it asks for), and the contexts tokenfront's own
clients (the router to its workers, `tokenfront check`) verify servers with.

Every server takes `--ssl-certfile` and `--ssl-keyfile` (PEM; serve HTTPS) and `--ssl-ca-certs` (PEM bundle:
every client must then present a certificate signed by one of these CAs, mutual TLS); uvicorn serves with
them. Each file is loaded here at start-up, before anything else, so a wrong path, a file that is not PEM or a
key that does not match its certificate is one line and exit 2, not a traceback when the first client
connects.

Clients verify a server against the system's trust (certifi's bundle, as httpx does; `SSL_CERT_FILE` honoured)
or, given a CA bundle (`--worker-ca-certs`, `check --ca-certs`), against that bundle alone; a client
certificate (`--worker-certfile` / `--worker-keyfile`) is presented to servers that ask for one.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenfront.core.errors import TokenfrontError

__all__ = ["ClientTls", "ServerTls", "TlsError", "describe_tls_failure"]


class TlsError(TokenfrontError):
    """A certificate, key or CA bundle that cannot be used (a start-up problem, said in one line)."""


def _readable(path: str, flag: str) -> str:
    file = Path(path)
    if not file.is_file():
        raise TlsError(f"{flag} {path}: no such file")
    try:
        with file.open("rb"):
            pass
    except OSError as exc:
        raise TlsError(f"{flag} {path}: cannot be read ({exc.strerror})") from exc
    return str(file)


def _load_chain(context: ssl.SSLContext, certfile: str, keyfile: str | None, flags: str) -> None:
    try:
        context.load_cert_chain(certfile, keyfile)
    except ssl.SSLError as exc:
        reason = exc.reason or exc.strerror or str(exc)
        if "KEY_VALUES_MISMATCH" in str(exc) or reason == "KEY_VALUES_MISMATCH":
            raise TlsError(f"{flags}: the key does not belong to the certificate") from exc
        raise TlsError(f"{flags}: not a PEM certificate and private key ({reason})") from exc


def _load_cas(context: ssl.SSLContext, cafile: str, flag: str) -> None:
    try:
        context.load_verify_locations(cafile=cafile)
    except (ssl.SSLError, ValueError) as exc:
        raise TlsError(f"{flag} {cafile}: not a PEM bundle of CA certificates ({exc})") from exc


@dataclass(frozen=True)
class ServerTls:
    """A server's `--ssl-*` flags, checked: `uvicorn_options()` are what its uvicorn config takes."""

    certfile: str
    keyfile: str | None = None
    ca_certs: str | None = None

    @classmethod
    def from_flags(cls, certfile: str | None, keyfile: str | None, ca_certs: str | None) -> ServerTls | None:
        """The checked settings, or None for plain HTTP (no flag given); TlsError names the flag at fault."""
        if certfile is None:
            if keyfile is not None or ca_certs is not None:
                given = "--ssl-keyfile" if keyfile is not None else "--ssl-ca-certs"
                raise TlsError(f"{given} needs --ssl-certfile (the server's certificate, PEM)")
            return None
        settings = cls(
            _readable(certfile, "--ssl-certfile"),
            None if keyfile is None else _readable(keyfile, "--ssl-keyfile"),
            None if ca_certs is None else _readable(ca_certs, "--ssl-ca-certs"),
        )
        settings.context()  # every file loads now, not at the first connection
        return settings

    def context(self) -> ssl.SSLContext:
        """The server's SSL context (what uvicorn builds from the same files)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        flags = "--ssl-certfile" if self.keyfile is None else "--ssl-certfile / --ssl-keyfile"
        _load_chain(context, self.certfile, self.keyfile, flags)
        if self.ca_certs is not None:
            _load_cas(context, self.ca_certs, "--ssl-ca-certs")
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def uvicorn_options(self) -> dict[str, Any]:
        """The uvicorn.Config arguments: its own TLS, client certificates required with a CA bundle."""
        return {
            "ssl_certfile": self.certfile,
            "ssl_keyfile": self.keyfile,
            "ssl_ca_certs": self.ca_certs,
            "ssl_cert_reqs": ssl.CERT_REQUIRED if self.ca_certs is not None else ssl.CERT_NONE,
        }


@dataclass(frozen=True)
class ClientTls:
    """How a tokenfront client verifies HTTPS servers, and the certificate it presents to those that ask."""

    ca_certs: str | None = None
    certfile: str | None = None
    keyfile: str | None = None

    @classmethod
    def from_flags(
        cls,
        ca_certs: str | None,
        certfile: str | None,
        keyfile: str | None,
        *,
        prefix: str,
    ) -> ClientTls:
        """The checked settings of flags named `{prefix}ca-certs`, `{prefix}certfile`, `{prefix}keyfile`."""
        if keyfile is not None and certfile is None:
            raise TlsError(f"{prefix}keyfile needs {prefix}certfile (the client certificate, PEM)")
        settings = cls(
            None if ca_certs is None else _readable(ca_certs, f"{prefix}ca-certs"),
            None if certfile is None else _readable(certfile, f"{prefix}certfile"),
            None if keyfile is None else _readable(keyfile, f"{prefix}keyfile"),
        )
        settings._build(prefix)
        return settings

    def context(self) -> ssl.SSLContext:
        """A new client context: hostname and certificate checked, against the bundle or the system's trust."""
        return self._build("")

    def _build(self, prefix: str) -> ssl.SSLContext:
        if self.ca_certs is None:
            import httpx  # the trust httpx's own clients have: certifi's bundle, SSL_CERT_FILE / SSL_CERT_DIR

            context = httpx.create_ssl_context()
        else:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # hostname and chain checked; this bundle alone
            _load_cas(context, self.ca_certs, f"{prefix}ca-certs")
        if self.certfile is not None:
            flags = f"{prefix}certfile" if self.keyfile is None else f"{prefix}certfile / {prefix}keyfile"
            _load_chain(context, self.certfile, self.keyfile, flags)
        return context


def describe_tls_failure(exc: BaseException, *, ca_flag: str) -> str | None:
    """What to do about a failed TLS handshake, or None when `exc` (or its cause) is not one."""
    seen: BaseException | None = exc
    while seen is not None:
        text = str(seen)
        if isinstance(seen, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in text:
            detail = getattr(seen, "verify_message", None) or "certificate verify failed"
            return (
                f"its TLS certificate is not trusted ({detail}): give the CA that signed it with {ca_flag}, "
                "or check that the URL's host name is one the certificate names"
            )
        if "WRONG_VERSION_NUMBER" in text or "record layer failure" in text:
            return "it does not speak TLS on that port: use an http:// URL, or start it with --ssl-certfile"
        if "CERTIFICATE_REQUIRED" in text or "TLSV13_ALERT_CERTIFICATE_REQUIRED" in text:
            return "it asks for a client certificate (mutual TLS): give one with the client certificate flags"
        seen = seen.__cause__ or seen.__context__
    return None
