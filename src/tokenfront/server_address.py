"""A server's base URL: the rules a worker URL follows (`--worker`, `POST /workers`, a worker file or DNS name,
`tokenfront check --renderer/--worker`), its canonical spelling and the identity every spelling of one server
shares; and a ZMQ endpoint's rules (`kv-events=`, `--replica-peer`). Each mistake is a ValueError that says what
is wrong, for a 400 or one start-up line."""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

import idna

__all__ = [
    "MAX_URL_LENGTH",
    "WorkerAddress",
    "check_kv_endpoint",
    "normalize_url",
    "quoted",
    "worker_identity",
]

# A worker URL longer than this is refused (a base URL is a scheme, a host and a port).
MAX_URL_LENGTH = 2048
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Names of this machine's loopback interface: one worker, however it is spelled. A server bound to 0.0.0.0
# (or ::) answers on them too, and no second server can bind the same port on loopback.
_LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", "::", "::ffff:127.0.0.1"})
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
# The last label of a host WHATWG reads as a number (then the whole host must be a dotted IPv4 address).
_NUMERIC_LABEL = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)")


@dataclass(frozen=True)
class WorkerAddress:
    """A worker's base URL, validated: scheme, host (lower case, IDNA-encoded, IPv6 without brackets) and port."""

    scheme: str
    host: str
    port: int

    @property
    def url(self) -> str:
        """The canonical spelling: `scheme://host[:port]`, the port only when it is not the scheme's default."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = "" if self.port == _DEFAULT_PORTS[self.scheme] else f":{self.port}"
        return f"{self.scheme}://{host}{port}"

    @property
    def identity(self) -> tuple[str, str, int]:
        """What two spellings of one worker share: scheme, host (every loopback name alike) and port."""
        return (self.scheme, "loopback" if self.host in _LOOPBACK_HOSTS else self.host, self.port)

    @classmethod
    def parse(cls, url: Any) -> WorkerAddress:
        """Read a worker's base URL (`http(s)://HOST[:PORT][/]`); ValueError says what is wrong, in one line."""
        if not isinstance(url, str):
            raise ValueError(f"a worker URL must be a string, not {type(url).__name__}")
        shown = quoted(url)
        problem = _url_problem(url)
        if isinstance(problem, str):
            raise ValueError(f"worker URL {shown}: {problem}; expected http://HOST:PORT")
        return problem


def quoted(text: str, limit: int = 80) -> str:
    """`text` quoted for a message: escaped (control characters, lone surrogates) and cut to `limit`."""
    quoted = repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"
    return quoted.encode("ascii", "backslashreplace").decode("ascii")


def _url_problem(url: str) -> str | WorkerAddress:
    """The parsed address, or what is wrong with `url`."""
    if len(url) > MAX_URL_LENGTH:
        return f"too long (at most {MAX_URL_LENGTH} characters)"
    try:
        url.encode("utf-8")
    except UnicodeEncodeError:
        return "not valid Unicode (a lone surrogate)"
    if any(unicodedata.category(ch) == "Cc" for ch in url):
        return "contains a control character (CR, LF, NUL, tab, ...)"
    url = url.strip(" ")
    if any(ch.isspace() for ch in url):
        return "contains whitespace"
    scheme, separator, rest = url.partition("://")
    scheme = scheme.lower()
    if not separator or scheme not in _DEFAULT_PORTS:
        return "the scheme must be http:// or https://"
    end = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    if "?" in tail:
        return "has a query string (a worker URL is a base URL: scheme, host and port)"
    if "#" in tail:
        return "has a fragment (a worker URL is a base URL: scheme, host and port)"
    if tail not in ("", "/"):
        return f"has a path ({quoted(tail, 40)}): the router calls /health, /v1/... on the base URL itself"
    if "@" in authority:
        return "has user info (user:password@): give workers a key with --worker-api-key instead"
    if authority.startswith("["):
        host, bracket, port_text = authority[1:].partition("]")
        if not bracket or (port_text and not port_text.startswith(":")):
            return "an IPv6 host must be written [ADDRESS] or [ADDRESS]:PORT"
        port_text = port_text[1:]
        address = _ipv6(host)
        if address is None:
            return f"the host {quoted(host, 60)} in brackets is not an IPv6 address"
        host = address
    else:
        host, _, port_text = authority.rpartition(":") if ":" in authority else (authority, "", "")
        if ":" in host:
            return "an IPv6 host must be in brackets: http://[ADDRESS]:PORT"
        checked = _host_problem(host)
        if checked[1] is not None:
            return checked[1]
        host = checked[0]
    if port_text == "":
        port = _DEFAULT_PORTS[scheme]
    elif not (port_text.isascii() and port_text.isdigit()) or not 1 <= int(port_text) <= 65535:
        return f"the port must be a number from 1 to 65535, not {quoted(port_text, 20)}"
    else:
        port = int(port_text)
    return WorkerAddress(scheme, host, port)


def _ipv6(text: str) -> str | None:
    try:
        return ipaddress.IPv6Address(text).compressed
    except ValueError:
        return None


def _host_problem(host: str) -> tuple[str, str | None]:
    """(the host in its canonical form, None), or ("", what is wrong with it)."""
    if not host:
        return "", "has no host"
    host = host.lower()
    if host.endswith(".") and len(host) > 1:
        host = host[:-1]  # the fully qualified spelling of the same name
    if not host.isascii():
        try:
            host = idna.encode(host, uts46=True).decode("ascii")
        except (idna.IDNAError, UnicodeError) as exc:
            return "", f"the host {quoted(host, 60)} is not a valid internationalized name ({exc})"
    labels = host.split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        try:
            return str(ipaddress.IPv4Address(host)), None
        except ValueError:
            return "", f"the host {quoted(host, 60)} is not an IPv4 address (four numbers 0-255)"
    if len(host) > 253:
        return "", f"the host is {len(host)} characters long, at most 253"
    for label in labels:
        if not _LABEL.fullmatch(label):
            return "", (
                f"the host {quoted(host, 60)} has an invalid label {quoted(label, 40)} (letters, digits, "
                "'-' and '_', 1-63 characters, not starting or ending with '-')"
            )
        if label.startswith("xn--"):
            try:
                idna.decode(label)
            except (idna.IDNAError, UnicodeError) as exc:
                return (
                    "",
                    f"the host {quoted(host, 60)} has an invalid IDNA label {quoted(label, 40)} ({exc})",
                )
    return host, None


def normalize_url(url: Any) -> str:
    """A worker's base URL in its canonical spelling (`WorkerAddress.url`); ValueError says what is wrong."""
    return WorkerAddress.parse(url).url


def worker_identity(url: str) -> tuple[str, str, int]:
    """What every spelling of one worker's URL shares (`WorkerAddress.identity`); ValueError when invalid."""
    return WorkerAddress.parse(url).identity


def check_kv_endpoint(endpoint: Any, name: str) -> str:
    """A vLLM ZMQ endpoint (`tcp://HOST:PORT` or `ipc://PATH`) as given; ValueError says what is wrong."""
    if not isinstance(endpoint, str):
        raise ValueError(f"{name} must be a string")
    shown = quoted(endpoint)
    if not endpoint or len(endpoint) > MAX_URL_LENGTH:
        raise ValueError(f"{name} {shown}: expected tcp://HOST:PORT, at most {MAX_URL_LENGTH} characters")
    if not endpoint.isascii() or any(ch.isspace() or unicodedata.category(ch) == "Cc" for ch in endpoint):
        raise ValueError(f"{name} {shown}: only printable ASCII, no whitespace; expected tcp://HOST:PORT")
    scheme, separator, rest = endpoint.partition("://")
    if separator and scheme == "ipc" and rest:
        return endpoint
    host, colon, port = rest.rpartition(":")
    if scheme != "tcp" or not separator or not colon or not host:
        raise ValueError(f"{name} {shown}: expected tcp://HOST:PORT (or ipc://PATH)")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{name} {shown}: the port must be a number from 1 to 65535")
    return endpoint
