"""The generator's faults: how often each thing goes wrong, and each daemon's outage schedule.

Theory of operation. ``--fault-rate`` scales every per-frame fault (``FaultRates``) and the mean gap between a
daemon's outages. Outages are link drops (the daemon keeps running, its broker link is down) and crashes (the
process is down, and with it the link); each daemon draws its own from its own random source, lazily and in time
order, so a story asking about any time sees the same schedule every other story sees. A new outage is announced to
``on_new`` when it is drawn (the mesh writes a link drop's disconnect and reconnect SSE events then).
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable
from dataclasses import dataclass

CRASH, LINK = 1, 2


@dataclass(frozen=True)
class FaultRates:
    """The probability of each fault at one ``--fault-rate``, and the mean gap between a daemon's outages."""

    frame_lost: float
    ack_lost: float
    late_ack: float
    broker_5xx: float
    b1_reject: float
    drift: float
    bad_destination: float
    push_lost: float
    client_ack_lost: float
    requeue_dead: float
    requeue_pending: float
    collision: float
    dup_post: float
    outage_gap_ms: float

    @classmethod
    def at(cls, fault_rate: float, send_interval_ms: int) -> FaultRates:
        f = fault_rate
        return cls(frame_lost=0.2 * f, ack_lost=0.2 * f, late_ack=0.3, broker_5xx=0.2 * f, b1_reject=0.05 * f,
                   drift=0.01 * f, bad_destination=0.05 * f, push_lost=0.1 * f, client_ack_lost=0.1 * f,
                   requeue_dead=0.5, requeue_pending=0.05, collision=0.2 * f, dup_post=min(0.6, 3 * f),
                   outage_gap_ms=send_interval_ms * 20 / f if f > 0 else 0.0)


class Outages:
    """A daemon's link drops and crashes, drawn lazily in time order from its own random source."""

    def __init__(self, rng: random.Random, mean_gap_ms: float, start: int):
        self.rng = rng
        self.mean_gap_ms = mean_gap_ms
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.kinds: list[int] = []
        self.horizon = start
        self.on_new: Callable[[int, int, int], None] | None = None

    def _extend(self, until: int) -> None:
        if self.mean_gap_ms <= 0:
            self.horizon = max(self.horizon, until + 1)
            return
        rng = self.rng
        while self.horizon <= until:
            start = self.horizon + 1 + int(rng.expovariate(1.0 / self.mean_gap_ms))
            if rng.random() < 0.3:
                kind = CRASH
                length = rng.randint(3_700_000, 5_000_000) if rng.random() < 0.02 else rng.randint(1_000, 15_000)
            else:
                kind, length = LINK, rng.randint(200, 3_000)
            self.starts.append(start)
            self.ends.append(start + length)
            self.kinds.append(kind)
            self.horizon = start + length
            if self.on_new is not None:
                self.on_new(start, start + length, kind)

    def covering(self, t: int) -> int:
        """Index of the outage in progress at ``t`` (start <= t < end), or -1."""
        if t >= self.horizon:
            self._extend(t)
        i = bisect.bisect_right(self.starts, t) - 1
        return i if i >= 0 and t < self.ends[i] else -1

    def first_between(self, a: int, b: int) -> int:
        """Index of the first outage starting in (a, b], or -1."""
        if b >= self.horizon:
            self._extend(b)
        i = bisect.bisect_right(self.starts, a)
        return i if i < len(self.starts) and self.starts[i] <= b else -1

    def up(self, t: int) -> int:
        """The first time >= t at which the daemon process runs (after any crash covering t)."""
        while True:
            i = self.covering(t)
            if i < 0 or self.kinds[i] != CRASH:
                return t
            t = self.ends[i] + 1

    def online(self, t: int) -> int:
        """The first time >= t at which the daemon runs and its broker link is up."""
        while True:
            i = self.covering(t)
            if i < 0:
                return t
            t = self.ends[i] + 1

    def is_online(self, t: int) -> bool:
        return self.covering(t) < 0

    def online_through(self, a: int, b: int) -> bool:
        return self.covering(a) < 0 and self.first_between(a, b) < 0
