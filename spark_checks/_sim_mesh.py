"""One simulated mesh's members and ids: its daemons, its broker node, their buckets and topics, and seeded ids.

Rules of this file. Everything here is drawn from the mesh's own seeded random source (and each daemon's outages
from the daemon's own), so a mesh's trace depends on the parameters, the seed and the mesh's index only. Node ids
are worker-global (indexes into the sink's node names): a mesh's daemons come first, then its broker.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._sim_faults import LINK, FaultRates, Outages
from ._sim_trace import SSE, Sink

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from .generate import Params

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SSE_EVENTS = ("message", "outbox_dead", "daemon_disconnect", "daemon_reconnect")

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]  # 10 bits -> two Crockford characters


def ulid(ts_ms: int, entropy: int) -> str:
    """A ULID string for ``ts_ms`` with 80 bits of ``entropy`` (deterministic: the caller supplies the bits).

    Written here rather than with python-ulid because the simulation needs seeded, collision-free ids in about a
    microsecond each.
    """
    v = (ts_ms << 80) | (entropy & 0xFFFFFFFFFFFFFFFFFFFF)
    p = _PAIRS
    return (p[v >> 120] + p[(v >> 110) & 1023] + p[(v >> 100) & 1023] + p[(v >> 90) & 1023] + p[(v >> 80) & 1023]
            + p[(v >> 70) & 1023] + p[(v >> 60) & 1023] + p[(v >> 50) & 1023] + p[(v >> 40) & 1023]
            + p[(v >> 30) & 1023] + p[(v >> 20) & 1023] + p[(v >> 10) & 1023] + p[v & 1023])


@dataclass
class Daemon:
    index: int
    node: int  # worker-global node id
    name: str
    pubkey: str
    short: str
    outages: Outages
    sends: int = 0
    requeues: int = 0


class Mesh:
    """A mesh's daemons and broker node, registered with the sink, and the mesh's random source and ids."""

    def __init__(self, params: Params, index: int, daemon_count: int, sink: Sink, rates: FaultRates):
        self.params = params
        self.index = index
        self.rng = random.Random(params.seed * 1_000_003 + index * 7919 + 17)
        self.rnd = self.rng.random
        self.name = f"m{params.seed:x}-{index:04d}"
        self.mesh_i = len(sink.mesh_names)  # the name's index in the sink: what a ``mesh`` member holds
        sink.mesh_names.append(self.name)
        self.buckets = params.buckets
        first_node = len(sink.node_names)
        self.base_node = first_node
        self.daemons: list[Daemon] = []
        for d in range(daemon_count):
            pubkey = f"{self.rng.getrandbits(256):064x}"
            outages = Outages(random.Random(params.seed * 1_000_003 + index * 7919 + 101 * (d + 1)),
                              rates.outage_gap_ms, T0_MS)
            daemon = Daemon(d, first_node + d, f"daemon-{pubkey[:16]}", pubkey, pubkey[:8], outages)
            self.daemons.append(daemon)
            sink.node_names.append(daemon.name)
            sink.pubkeys.append(pubkey)
        self.broker_node = first_node + daemon_count
        sink.node_names.append(f"broker-{self.name}")
        sink.pubkeys.append(None)
        self.nodes = daemon_count + 1
        self.node_names = sink.node_names
        self.node_bucket = [zlib.crc32(name.encode()) % self.buckets for name in sink.node_names[first_node:]]
        # topics: subscribers of topic j are the daemons i with (i + j) % 2 == 0
        self.topics = [f"t{j}" for j in range(4)]
        self.subscribers = [tuple(i for i in range(daemon_count) if (i + j) % 2 == 0) for j in range(4)]
        self.sse = {name: sink.codes.code(SSE, (name,)) for name in SSE_EVENTS}
        self.entropy = 0

    def new_id(self, ts: int) -> str:
        self.entropy += 1
        return ulid(ts, (self.index << 48) | self.entropy)

    def bucket(self, client_message_id: str) -> int:
        return zlib.crc32(f"{self.name}\x00{client_message_id}".encode()) % self.buckets

    def announce_link_drops(self, push: Callable[[int, int, int, int, Any], None]) -> None:
        """Have each daemon write ``daemon_disconnect`` and ``daemon_reconnect`` around a link drop when it is drawn."""
        for daemon in self.daemons:
            daemon.outages.on_new = self._link_events(daemon, push)

    def _link_events(self, daemon: Daemon, push: Callable[[int, int, int, int, Any], None]
                     ) -> Callable[[int, int, int], None]:
        bucket = self.node_bucket[daemon.index]
        disconnect, reconnect = self.sse["daemon_disconnect"], self.sse["daemon_reconnect"]

        def on_new(start: int, end: int, kind: int) -> None:
            if kind == LINK:
                push(start, SSE, daemon.node, bucket, disconnect)
                push(end, SSE, daemon.node, bucket, reconnect)
        return on_new
