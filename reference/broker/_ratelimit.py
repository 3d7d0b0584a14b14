"""The B1 rate limit (§4.6.2): one token bucket per (mesh, member), in memory.

Written here rather than taken from a library: the spec's v0.9.0 limiter is "an external limiter checked in B1" and
the reference needs only a dozen lines of arithmetic; the idempotent Lua limiter is a deferred follow-up.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from reference.broker.store import AcceptRequest


class TokenBuckets:
    """``allow(request)`` spends one token of the sender's bucket: ``rate`` tokens a second, at most ``burst``.

    ``rate <= 0`` disables the limit. The store calls ``allow`` last among the B1 checks, so frames refused for
    another reason spend nothing.
    """

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self.burst = max(1, burst)
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str], tuple[float, float]] = {}  # key -> (tokens, at)

    def allow(self, request: AcceptRequest) -> bool:
        if self.rate <= 0:
            return True
        key = (request.mesh_id, request.sender_pubkey)
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                return False
            self._buckets[key] = (tokens - 1.0, now)
            return True

    def retry_after_ms(self, request: AcceptRequest) -> int | None:
        """How long until the sender's bucket holds a token again (what a 429 ack tells the daemon, E-42)."""
        if self.rate <= 0:
            return None
        key = (request.mesh_id, request.sender_pubkey)
        with self._lock:
            tokens, at = self._buckets.get(key, (float(self.burst), self._clock()))
        tokens = min(float(self.burst), tokens + (self._clock() - at) * self.rate)
        return max(1, math.ceil((1.0 - tokens) / self.rate * 1000)) if tokens < 1.0 else 1
