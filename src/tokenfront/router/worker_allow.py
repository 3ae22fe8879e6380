"""Which addresses a router may take as workers (`--worker-allow CIDR|HOST`, repeatable).

Without an allow-list a router takes any worker address it is given: its admin (`--admin-api-key`) is
trusted. With one, every worker URL (from `--worker` at start-up or `POST /workers`), and every vLLM ZMQ KV
event endpoint with it, must either name an allowed host (`--worker-allow worker-0.workers.svc`: the name as
written, compared in its canonical form) or lie in an allowed network (`--worker-allow 10.0.0.0/8`): an
address by itself, a name by every address it resolves to (one outside is enough to refuse it; a name that
does not resolve is refused). So a leaked admin key, or an admin's typo, cannot aim the router at this
machine's loopback ports or another network.

The check runs when a worker is added, before anything is sent to it. A name is resolved then, not on each
connection: a name whose DNS answers can change to an address outside the list (DNS rebinding) is allowed
safely only by name, or by address.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tokenfront.server_address import WorkerAddress

__all__ = ["ALLOW_FLAG", "Network", "Refusal", "WorkerAllowList", "parse_entry"]

ALLOW_FLAG = "--worker-allow"
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
# A refusal: the field at fault ("url", "kv_events", "kv_replay") and why.
Refusal = tuple[str, str]
# A vLLM ZMQ `ipc://PATH` endpoint is a socket on this machine: allowed when loopback is.
_LOOPBACK = ipaddress.ip_address("127.0.0.1")


def parse_entry(text: str) -> Network | str:
    """One `--worker-allow` entry: a network (`10.0.0.0/8`, `fd00::/8`, or one address), or a host name in
    its canonical form. ValueError says what is wrong, in one line."""
    entry = text.strip()
    if "/" in entry:
        try:
            return ipaddress.ip_network(entry, strict=True)
        except ValueError as exc:
            raise ValueError(
                f"{text!r} is not a network in CIDR notation (10.0.0.0/8, fd00::/8): {exc}"
            ) from None
    address = _address(entry.removeprefix("[").removesuffix("]"))
    if address is not None:
        return ipaddress.ip_network(address)
    if ":" in entry:
        raise ValueError(f"{text!r}: give a host name or an address, without a port or scheme")
    try:
        return WorkerAddress.parse(f"http://{entry}").host
    except ValueError as exc:
        problem = str(exc).split(": ", 1)[-1].removesuffix("; expected http://HOST:PORT")
        raise ValueError(f"{text!r} is neither a network (CIDR) nor a host name: {problem}") from None


@dataclass(frozen=True)
class WorkerAllowList:
    """The networks and host names a worker may be at (`--worker-allow`)."""

    networks: tuple[Network, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def of(cls, entries: Iterable[Network | str]) -> WorkerAllowList:
        """The list of parsed entries (`parse_entry`)."""
        entries = list(entries)
        networks = tuple(entry for entry in entries if not isinstance(entry, str))
        return cls(networks, frozenset(entry for entry in entries if isinstance(entry, str)))

    def describe(self) -> str:
        """The entries, as an operator gave them: for messages."""
        return ", ".join([*(str(network) for network in self.networks), *sorted(self.hosts)])

    def refusal(self, url: str, endpoints: Sequence[tuple[str, str | None]] = ()) -> Refusal | None:
        """Why a worker at `url` (a valid worker URL) with its vLLM ZMQ `endpoints` ((field, `tcp://HOST:PORT`
        or `ipc://PATH`), None ones skipped) may not be added: (the field at fault, why, to follow the URL in a
        message); None when it may.
        Resolves names, so it blocks: on the event loop use `refusal_in_thread`."""
        address = WorkerAddress.parse(url)
        problem = self._host_problem(address.host, address.port)
        if problem is not None:
            return "url", problem
        for field, endpoint in endpoints:
            problem = self._endpoint_problem(endpoint) if endpoint is not None else None
            if problem is not None:
                return field, f"{field} {endpoint}: {problem}"
        return None

    async def refusal_in_thread(
        self, url: str, endpoints: Sequence[tuple[str, str | None]] = (), *, timeout: float
    ) -> Refusal | None:
        """`refusal` off the event loop, its name lookups bounded by `timeout` seconds (then refused)."""
        try:
            return await asyncio.wait_for(asyncio.to_thread(self.refusal, url, endpoints), timeout)
        except asyncio.TimeoutError:
            return "url", (
                f"its host did not resolve within {timeout:g} s, so it cannot be checked against {ALLOW_FLAG} "
                f"({self.describe()})"
            )

    def _host_problem(self, host: str, port: int) -> str | None:
        if host in self.hosts:
            return None
        outside = f"outside {ALLOW_FLAG} ({self.describe()})"
        address = _address(host)
        if address is not None:
            return None if self._allows(address) else f"{host} is {outside}"
        if not self.networks:
            return f"the host {host} is not one of the hosts {ALLOW_FLAG} names ({self.describe()})"
        try:
            found = set(_resolve(host, port))
        except (OSError, UnicodeError, ValueError) as exc:
            return (
                f"the host {host} does not resolve ({exc}), so it cannot be checked against {ALLOW_FLAG}: "
                "allow it by name, or give its address"
            )
        refused = sorted(str(ip) for ip in found if not self._allows(ip))
        if refused or not found:
            return f"the host {host} resolves to {', '.join(refused) or 'no address'}, {outside}"
        return None

    def _endpoint_problem(self, endpoint: str) -> str | None:
        scheme, _, rest = endpoint.partition("://")
        if scheme == "ipc":
            return (
                None
                if self._allows(_LOOPBACK)
                else f"a socket on this machine, and loopback is not in {ALLOW_FLAG}"
            )
        host, _, port = rest.rpartition(":")
        try:
            address = WorkerAddress.parse(f"http://{host}:{port}")
        except ValueError as exc:
            return str(exc).split(": ", 1)[-1]
        return self._host_problem(address.host, address.port)

    def _allows(self, address: Address) -> bool:
        address = _unmapped(address)
        return any(address in network for network in self.networks if network.version == address.version)


def _address(text: str) -> Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _unmapped(address: Address) -> Address:
    """An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) as the IPv4 address it reaches."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _resolve(host: str, port: int) -> list[Address]:
    """The addresses a connection to `host` may go to (what the system resolver gives, as httpx would ask)."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [_unmapped(ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])) for *_, sockaddr in found]
