"""The ZMQ address a server binds (`serve --kv-events-endpoint`, `route --replica-sync-bind`), checked at start-up."""

from __future__ import annotations

from tokenfront.core.errors import TokenfrontError

__all__ = ["check_bind_endpoint"]


def check_bind_endpoint(endpoint: str, flag: str) -> str:
    """A ZMQ endpoint this server can bind (`tcp://HOST:PORT`, `tcp://*:PORT`, `ipc://PATH`), else one line."""
    scheme, _, rest = endpoint.partition("://")
    if scheme == "ipc" and rest:
        return endpoint
    host, _, port = rest.rpartition(":")
    if scheme != "tcp" or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise TokenfrontError(
            f"{flag} {endpoint}: give the address to bind as tcp://HOST:PORT (tcp://*:5557 for every interface) "
            "or ipc://PATH"
        )
    return endpoint
