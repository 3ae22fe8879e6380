"""The workers of a DNS name (`--worker-dns NAME:PORT[,protocol=...][,verify=probe]`): a Kubernetes headless
Service's A and AAAA records, one worker per address, `http://ADDRESS:PORT` (an IPv6 address in brackets).

The name is resolved with dnspython's asyncio resolver, so a slow DNS server never holds the event loop: with
the system's `/etc/resolv.conf` (its servers, search list and ndots, as the system's resolver applies them), or
with one server (`--worker-dns-server HOST[:PORT]`). A NAME that ends with a dot is absolute: no search list.

What an answer means (each resolution asks A and AAAA; the union of their addresses is the set):

- any address in either answer: those are the workers;
- no address at all, and every answer that said so was authoritative (its AA flag: NXDOMAIN, or the name with
  no A or AAAA record): the name has no workers now, and the set is empty. A Kubernetes headless Service
  scaled to zero answers so (CoreDNS is authoritative for the cluster's zone);
- no address, and some answer was not authoritative (a recursive resolver passing on NXDOMAIN, a search-list
  name answered by another server): not taken as an empty fleet; the last set stays, as on a failure;
- a failure (a timeout, SERVFAIL, REFUSED): the last set stays (`SourceUnavailable`).
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

import dns.asyncresolver
import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.resolver

from tokenfront.core.errors import TokenfrontError
from tokenfront.router.worker_sources import SourceUnavailable
from tokenfront.router.worker_spec import WorkerSpec, option_problem
from tokenfront.server_address import WorkerAddress, normalize_url

__all__ = ["RESOLVE_TIMEOUT", "DnsServer", "DnsWorkers", "WorkerDns", "make_resolver"]

# Seconds one resolution (A and AAAA together, every server and search-list name tried) may take.
RESOLVE_TIMEOUT = 5.0
_SYNTAX = "NAME:PORT[,protocol=openai|generate][,verify=probe][,model=NAME]"


@dataclass(frozen=True)
class DnsWorkers:
    """A `--worker-dns` value: the name, the port its workers listen on, and the options each worker gets."""

    name: str  # canonical (lower case, IDNA), with its final dot when it was given one
    port: int
    protocol: str = "openai"
    verify: str | None = None
    model: str | None = None  # the router's model its workers are pinned to (None: their names place them)

    @classmethod
    def parse(cls, text: str) -> DnsWorkers:
        """Read `NAME:PORT[,protocol=openai|generate][,verify=probe][,model=NAME]`; ValueError says what is
        wrong, in one line."""
        target, *options = text.split(",")
        host, colon, port = target.strip().rpartition(":")
        if not colon or not host:
            raise ValueError(f"{text!r}: expected {_SYNTAX} (the port the workers listen on is needed)")
        if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
            raise ValueError(f"{text!r}: the port must be a number from 1 to 65535, not {port!r}")
        if host.startswith("[") or _is_address(host):
            raise ValueError(
                f"{text!r}: {host} is an address, not a DNS name: give it as --worker http://{host}:{port}"
            )
        absolute = host.endswith(".")
        try:
            address = WorkerAddress.parse(f"http://{host}:{port}")
        except ValueError as exc:
            problem = str(exc).split(": ", 1)[-1].removesuffix("; expected http://HOST:PORT")
            raise ValueError(f"{text!r}: {problem}; expected {_SYNTAX}") from None
        found: dict[str, str] = {}
        for option in options:
            key, _, value = option.partition("=")
            key, value = key.strip().replace("_", "-"), value.strip()
            wrong = _option_problem(key, value, found)
            if wrong is not None:
                raise ValueError(f"{text!r}: {wrong}; expected {_SYNTAX}")
            found[key] = value
        workers = cls(
            address.host + ("." if absolute else ""),
            address.port,
            protocol=found.get("protocol", "openai"),
            verify=found.get("verify"),
            model=found.get("model"),
        )
        try:
            workers.spec("127.0.0.1")  # the options' own rules (verify=probe needs protocol=generate)
        except ValueError as exc:
            raise ValueError(f"{text!r}: {exc}") from None
        return workers

    def spec(self, address: str) -> WorkerSpec:
        """The worker at one of the name's addresses."""
        host = f"[{address}]" if ":" in address else address
        return WorkerSpec(
            normalize_url(f"http://{host}:{self.port}"),
            protocol=self.protocol,
            verify=self.verify,
            model=self.model,
        )


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _option_problem(key: str, value: str, found: dict[str, str]) -> str | None:
    if key in found:
        return f"{key} given twice"
    if key in ("kv-events", "kv-replay"):
        return f"{key} names one worker's ZMQ endpoint, and a DNS name has many workers"
    return option_problem(key, value)  # protocol, verify and model as in a --worker spec


@dataclass(frozen=True)
class DnsServer:
    """The one DNS server to ask (`--worker-dns-server HOST[:PORT]`): an address, not a name."""

    host: str
    port: int = 53

    @classmethod
    def parse(cls, text: str) -> DnsServer:
        """Read `ADDRESS`, `ADDRESS:PORT` or `[IPV6]:PORT`; ValueError says what is wrong, in one line."""
        value = text.strip()
        if value.startswith("["):
            host, bracket, rest = value[1:].partition("]")
            if not bracket or (rest and not rest.startswith(":")):
                raise ValueError(f"{text!r}: an IPv6 server is written [ADDRESS]:PORT")
            port = rest[1:] or "53"
        elif value.count(":") == 1:
            host, _, port = value.partition(":")
        else:
            host, port = value, "53"
        if not _is_address(host):
            raise ValueError(
                f"{text!r}: the DNS server must be an IP address (a name would need a DNS server of its own), "
                "optionally with :PORT"
            )
        if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
            raise ValueError(f"{text!r}: the port must be a number from 1 to 65535")
        return cls(str(ipaddress.ip_address(host)), int(port))


def make_resolver(server: DnsServer | None, timeout: float = RESOLVE_TIMEOUT) -> dns.asyncresolver.Resolver:
    """The resolver of the DNS sources: `server` alone, or the system's configuration. TokenfrontError (one
    line) when the system has none to read."""
    if server is None:
        try:
            resolver = dns.asyncresolver.Resolver()
        except dns.resolver.NoResolverConfiguration as exc:
            raise TokenfrontError(
                f"--worker-dns: the system's DNS configuration cannot be read ({exc}): give --worker-dns-server "
                "ADDRESS[:PORT]"
            ) from None
    else:
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = [server.host]
        resolver.port = server.port
    resolver.lifetime = timeout
    resolver.timeout = min(timeout, 2.0)  # one server's try; the lifetime bounds them all
    return resolver


class WorkerDns:
    """The workers of a DNS name, resolved again at each `read`."""

    def __init__(self, workers: DnsWorkers, resolver: dns.asyncresolver.Resolver) -> None:
        self.workers = workers
        self.resolver = resolver
        # Relative unless written with a final dot: the resolver's search list applies then.
        self._qname = dns.name.from_text(workers.name, origin=None)

    @property
    def name(self) -> str:
        return f"dns:{self.workers.name}"

    async def read(self) -> Sequence[WorkerSpec]:
        """One worker per address the name has now (module docstring: what each answer means)."""
        (v4, v4_authoritative), (v6, v6_authoritative) = await asyncio.gather(
            self._lookup("A"), self._lookup("AAAA")
        )
        addresses = [*sorted(set(v4), key=ipaddress.IPv4Address), *sorted(set(v6), key=ipaddress.IPv6Address)]
        if not addresses and not (v4_authoritative and v6_authoritative):
            raise SourceUnavailable(
                f"{self.workers.name} has no address, and the answer is not authoritative (a scale to zero is "
                "taken only from the name's own server)"
            )
        return [self.workers.spec(address) for address in addresses]

    async def _lookup(self, rdtype: str) -> tuple[list[str], bool]:
        """(the addresses of one record type, whether an answer without any was authoritative)."""
        try:
            answer = await self.resolver.resolve(self._qname, rdtype, raise_on_no_answer=False, search=True)
        except dns.resolver.NXDOMAIN as exc:
            return [], all(_authoritative(response) for response in exc.responses().values())
        except dns.exception.Timeout:
            raise SourceUnavailable(
                f"resolving {self.workers.name} ({rdtype}) timed out after {self.resolver.lifetime:g} s"
            ) from None
        except dns.exception.DNSException as exc:
            raise SourceUnavailable(f"resolving {self.workers.name} ({rdtype}) failed: {exc}") from None
        addresses = [record.address for record in answer.rrset] if answer.rrset is not None else []
        return addresses, bool(addresses) or _authoritative(answer.response)


def _authoritative(response: dns.message.Message | None) -> bool:
    return response is not None and bool(response.flags & dns.flags.AA)
