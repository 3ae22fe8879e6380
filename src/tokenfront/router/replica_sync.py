"""Router replicas sharing their in-flight load: a worker loaded by one replica is seen as loaded by all.

Every replica keeps the whole fleet's KV index from the workers' own events, so the caches look the same from
each of them; what a replica cannot see is the requests the *other* replicas sent. Without them each replica
counts a third of a worker's load (with three replicas), and they pile new conversations onto the same
workers. Dynamo's KV router shares the same thing between its replicas (``--router-replica-sync``: each
replica publishes the requests it adds and frees); this is tokenfront's, over ZMQ.

`tokenfront route --replica-sync-bind tcp://*:5600 --replica-peer tcp://router-1:5600 ...`: each replica binds a
PUB socket and subscribes to every peer's (a peer list may name the replica itself: its own messages are
skipped by router id, so every replica can be given the same list). Each message is one msgpack array, the
sender's router id second:

- ``[ROUTED, router_id, serial, worker_url, uncached_tokens, prompt_tokens, end, continued]``: a request
  was sent to the worker (``Policy.shared_load``: its tokens still to prefill there, its prompt's, where its
  prompt ends and which answered prompts it continues; zeros and None from a policy that tracks no tokens);
- ``[FIRST, router_id, serial]``: its first token came (its prefill is done);
- ``[DONE, router_id, serial]``: it ended;
- ``[BEAT, router_id, [serial, ...]]``, every ``heartbeat`` seconds: the requests the sender has in flight.

A receiving replica counts a peer's request in the worker's ``peer_requests`` (which the policy sees added to
its own ``active_requests``) and hands it to the policy (``on_peer_routed`` and the other ``on_peer_*`` hooks),
which tracks it as its own. PUB/SUB drops messages rather than block (a slow subscriber, a peer that restarted):
a beat that no longer lists a request ends it here, and a peer silent for ``peer_timeout`` seconds has all its
requests ended (a replica that died takes its load with it; a restarted one has a new router id). A request
whose ROUTED message was lost is not counted until it ends; one for a worker this replica does not have is
skipped. At most ``max_peer_requests`` requests are kept per peer (the oldest end first), and a malformed
message is dropped and counted: a peer can cost a bounded amount of memory and no error.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from tokenfront.core.errors import TokenfrontError
from tokenfront.router.policies.base import Policy, RouteRequest, SharedLoad, WorkerLoad
from tokenfront.router.worker import Worker
from tokenfront.router.worker_pool import WorkerPool
from tokenfront.server.tasks import cancel_and_wait

__all__ = ["DEFAULT_HEARTBEAT", "DEFAULT_PEER_TIMEOUT", "ReplicaSync"]

log = logging.getLogger(__name__)

ROUTED, FIRST, DONE, BEAT = 0, 1, 2, 3
DEFAULT_HEARTBEAT = 1.0
DEFAULT_PEER_TIMEOUT = 5.0
DEFAULT_MAX_PEER_REQUESTS = 65_536
# Messages a slow peer may have queued before this replica's PUB socket drops more (the beats mend the loss).
_SEND_HIGH_WATER = 100_000
_MAX_MESSAGE_BYTES = 1 << 20
_MAX_URL = 2048


@dataclass
class _PeerRequest:
    worker: Worker
    load: WorkerLoad


@dataclass
class _Peer:
    """What one peer replica has in flight, as its messages said, and when it was last heard."""

    router_id: str
    last_heard: float
    requests: dict[int, _PeerRequest] = field(default_factory=dict)


class ReplicaSync:
    """Publishes this replica's routed requests and applies its peers' (module docstring)."""

    def __init__(
        self,
        *,
        router_id: str,
        bind: str,
        peers: Sequence[str],
        policy: Policy,
        pool: WorkerPool,
        heartbeat: float = DEFAULT_HEARTBEAT,
        peer_timeout: float = DEFAULT_PEER_TIMEOUT,
        max_peer_requests: int = DEFAULT_MAX_PEER_REQUESTS,
    ) -> None:
        if not heartbeat > 0 or not peer_timeout > heartbeat:
            raise ValueError("heartbeat must be positive and peer_timeout longer than it")
        self.router_id = router_id
        self.bind = bind
        self.peers = tuple(peers)
        self.policy = policy
        self.pool = pool
        self.heartbeat = heartbeat
        self.peer_timeout = peer_timeout
        self.max_peer_requests = max_peer_requests
        self._serials = itertools.count(1)
        # This replica's requests in flight: (id(RouteRequest), worker url) -> serial (a retry on another
        # worker is another request for the peers).
        self._mine: dict[tuple[int, str], int] = {}
        self._peers: dict[str, _Peer] = {}
        # The PUB socket is bound here, at start-up (an address in use is one line before anything loads); the
        # subscriptions start with the event loop (`start`).
        self._pub_context = zmq.Context()
        pub = self._pub_context.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, _SEND_HIGH_WATER)
        try:
            pub.bind(bind)
        except zmq.ZMQError as exc:
            pub.close()
            self._pub_context.term()
            raise TokenfrontError(f"--replica-sync-bind {bind}: cannot bind it ({exc})") from None
        self._pub: zmq.Socket[bytes] | None = pub
        self._context: zmq.asyncio.Context | None = None
        self._sub: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.sent = 0
        self.dropped = 0  # messages this replica's PUB socket could not queue
        self.received = 0
        self.malformed = 0
        self._said_malformed = False

    # --- the peers, as this replica sees them ----------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """For /server_info: the endpoints, the peers heard and what they have in flight here."""
        now = time.monotonic()
        return {
            "bind": self.bind,
            "peers": list(self.peers),
            "heard": {
                peer.router_id: {
                    "requests": len(peer.requests),
                    "heard_seconds_ago": round(now - peer.last_heard, 3),
                }
                for peer in self._peers.values()
            },
            "sent": self.sent,
            "dropped": self.dropped,
            "received": self.received,
            "malformed": self.malformed,
        }

    # --- this replica's requests -----------------------------------------------------------------------------

    def routed(self, load: WorkerLoad, request: RouteRequest) -> None:
        """`request` was sent to the worker (after the policy's own `on_routed`): tell the peers."""
        serial = next(self._serials)
        self._mine[(id(request), load.url)] = serial
        shared = self.policy.shared_load(load, request) or SharedLoad()
        self._send(
            [
                ROUTED,
                self.router_id,
                serial,
                load.url,
                shared.uncached_tokens,
                shared.prompt_tokens,
                list(shared.end) if shared.end else None,
                [list(end) for end in shared.continued],
            ]
        )

    def first_token(self, load: WorkerLoad, request: RouteRequest) -> None:
        serial = self._mine.get((id(request), load.url))
        if serial is not None:
            self._send([FIRST, self.router_id, serial])

    def complete(self, load: WorkerLoad, request: RouteRequest) -> None:
        serial = self._mine.pop((id(request), load.url), None)
        if serial is not None:
            self._send([DONE, self.router_id, serial])

    def _send(self, message: list[Any]) -> None:
        if self._pub is None:
            return
        try:
            self._pub.send(msgpack.packb(message), zmq.NOBLOCK)
            self.sent += 1
        except zmq.Again:
            self.dropped += 1

    # --- life ------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Subscribe to every peer (ZMQ connects in the background and reconnects: a peer not up yet is heard
        once it is), and start the beats."""
        context = self._context = zmq.asyncio.Context()
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.MAXMSGSIZE, _MAX_MESSAGE_BYTES)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        for peer in self.peers:
            try:
                sub.connect(peer)
            except zmq.ZMQError as exc:
                log.warning("--replica-peer %s: cannot connect (%s); it is left out", peer, exc)
        self._sub = sub
        self._tasks = [asyncio.create_task(self._receive()), asyncio.create_task(self._beat())]
        log.info("replica sync: publishing on %s, subscribed to %d peers", self.bind, len(self.peers))

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks = []
        if self._sub is not None:
            self._sub.close()
            self._sub = None
        if self._pub is not None:
            self._pub.close()
            self._pub = None
            self._pub_context.term()
        if self._context is not None:
            self._context.term()
            self._context = None

    async def _beat(self) -> None:
        while True:
            self._send([BEAT, self.router_id, list(self._mine.values())])
            self._forget_silent(time.monotonic())
            await asyncio.sleep(self.heartbeat)

    async def _receive(self) -> None:
        assert self._sub is not None
        sub = self._sub
        while True:
            data = await sub.recv()
            self.received += 1
            try:
                self.apply(msgpack.unpackb(data, use_list=True, strict_map_key=True))
            except (ValueError, TypeError, IndexError, msgpack.UnpackException) as exc:
                self._malformed(exc)

    # --- peers' messages -------------------------------------------------------------------------------------

    def apply(self, message: Any) -> None:
        """One peer message (module docstring); ValueError or TypeError for one that is not."""
        if not isinstance(message, list) or len(message) < 3:
            raise ValueError("not a sync message")
        kind, router_id = message[0], message[1]
        if not isinstance(router_id, str) or len(router_id) > 64:
            raise ValueError("no router id")
        if router_id == self.router_id:
            return  # this replica's own, through a peer list that names it
        peer = self._peers.get(router_id)
        now = time.monotonic()
        if peer is None:
            peer = self._peers[router_id] = _Peer(router_id, now)
            log.info("replica sync: hearing peer router %s", router_id)
        peer.last_heard = now
        if kind == ROUTED:
            self._peer_routed(peer, message)
        elif kind == FIRST:
            held = peer.requests.get(_serial(message[2]))
            if held is not None:
                self.policy.on_peer_first_token(held.load, (router_id, message[2]))
        elif kind == DONE:
            self._end(peer, _serial(message[2]))
        elif kind == BEAT:
            listed = message[2]
            if not isinstance(listed, list):
                raise TypeError("a beat lists serials")
            still = set(listed)
            for serial in [serial for serial in peer.requests if serial not in still]:
                self._end(peer, serial)  # its DONE was lost
        else:
            raise ValueError(f"unknown message kind {kind!r}")

    def _peer_routed(self, peer: _Peer, message: list[Any]) -> None:
        _, router_id, serial, url, uncached, prompt, end, continued = message
        serial = _serial(serial)
        if not isinstance(url, str) or len(url) > _MAX_URL:
            raise ValueError("a worker url")
        worker = self.pool.find(url)  # the exact spelling first, a dict lookup
        if worker is None:
            return  # a worker this replica does not have (yet)
        if not isinstance(continued, list):
            raise TypeError("continued is a list")
        ends = tuple(e for e in map(_end, continued) if e is not None)
        shared = SharedLoad(_count(uncached), _count(prompt), _end(end), ends)
        self._end(peer, serial)  # the same serial twice counts once
        load = worker.load()
        peer.requests[serial] = _PeerRequest(worker, load)
        worker.peer_requests += 1
        self.policy.on_peer_routed(load, (router_id, serial), shared)
        if len(peer.requests) > self.max_peer_requests:
            self._end(peer, next(iter(peer.requests)))

    def _end(self, peer: _Peer, serial: int) -> None:
        held = peer.requests.pop(serial, None)
        if held is not None:
            held.worker.peer_requests -= 1
            self.policy.on_peer_complete(held.load, (peer.router_id, serial))

    def _forget_silent(self, now: float) -> None:
        """Peers not heard for `peer_timeout`: their requests end (a replica gone takes its load with it)."""
        for router_id, peer in list(self._peers.items()):
            if now - peer.last_heard > self.peer_timeout:
                for serial in list(peer.requests):
                    self._end(peer, serial)
                del self._peers[router_id]
                log.info(
                    "replica sync: peer router %s not heard for %g s; its requests are ended",
                    router_id,
                    self.peer_timeout,
                )

    def _malformed(self, exc: Exception) -> None:
        self.malformed += 1
        if not self._said_malformed:
            self._said_malformed = True
            log.warning(
                "replica sync: a malformed message was dropped (%s); later ones are only counted", exc
            )


def _serial(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError("a serial is an integer")
    return value


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError("a token count is a non-negative integer")
    return value


def _end(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2 or not all(isinstance(v, int) for v in value):
        raise ValueError("a prompt's end is [block index, block name]")
    return (value[0], value[1])
