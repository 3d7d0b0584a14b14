"""The implementation's timing, as the harness knows it: read from the target, given on the command line, or the
meshspec defaults (E-14, E-15, E-35) — and the report always says which.

Cases never hard-code how long a retry, an ack timeout, a reconnect or a broker lease takes: they ask ``Timing``.
The retry schedule is E-14's: after the n-th failed attempt a row waits ``min(max, base * multiplier^(n-1))``,
± ``jitter`` of that; ``poll_ms`` is how coarse the implementation's scheduler is (a row due now may wait up to one
poll), and it widens only the upper bound.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from typing import Any

from spec import load_table

# How far a measured gap may stray from the declared schedule because of the machine (thread wake-ups, a loaded
# CI runner) rather than the implementation: below by ``EARLY_MS`` (clock granularity), above by ``LATE_MS``.
EARLY_MS = 15.0
LATE_MS = 200.0
#: the meshspec defaults: spec/tables/timing.yaml's schedules and keepalive, limits.yaml's read deadlines (E-43)
_TIMING = load_table("timing")
_RETRY, _RECONNECT = _TIMING["backoff"]["outbox_retry"], _TIMING["backoff"]["reconnect"]
_LIMITS = load_table("limits")["limits"]


@dataclass(frozen=True)
class Timing:
    """Declared timing of the implementation under test."""

    retry_base_ms: float = float(_RETRY["base_ms"])
    retry_max_ms: float = float(_RETRY["max_ms"])
    retry_multiplier: float = float(_RETRY["multiplier"])
    retry_jitter: float = float(_RETRY["jitter"])
    poll_ms: float = 0.0
    ack_timeout_s: float = 15.0
    reconnect_initial_ms: float = float(_RECONNECT["base_ms"])
    reconnect_max_ms: float = float(_RECONNECT["max_ms"])
    reconnect_multiplier: float = float(_RECONNECT["multiplier"])
    reconnect_jitter: float = float(_RECONNECT["jitter"])
    hello_timeout_s: float = 5.0
    keepalive_s: float = float(_TIMING["sse_keepalive_s"]["value"])
    header_read_s: float = float(_LIMITS["ipc_header_read_s"]["value"])
    body_read_s: float = float(_LIMITS["ipc_body_read_s"]["value"])
    source: str = "meshspec defaults (E-13, E-14, E-35, E-43): the target declared no timing"

    def retry_delay_ms(self, failures: int) -> float:
        """The nominal wait after the ``failures``-th failed attempt (1-based), before jitter."""
        return min(self.retry_max_ms, self.retry_base_ms * self.retry_multiplier ** max(failures - 1, 0))

    def retry_gap_bounds(self, failures: int) -> tuple[float, float]:
        """The (lowest, highest) gap in ms allowed between attempt ``failures`` and the next, when the broker
        answers at once."""
        nominal = self.retry_delay_ms(failures)
        return (nominal * (1 - self.retry_jitter) - EARLY_MS,
                nominal * (1 + self.retry_jitter) + self.poll_ms + LATE_MS)

    def reconnect_delay_ms(self, failures: int) -> float:
        return min(self.reconnect_max_ms, self.reconnect_initial_ms * self.reconnect_multiplier ** max(failures - 1, 0))

    def reconnect_gap_bounds(self, failures: int) -> tuple[float, float]:
        nominal = self.reconnect_delay_ms(failures)
        return (nominal * (1 - self.reconnect_jitter) - EARLY_MS,
                nominal * (1 + self.reconnect_jitter) + self.poll_ms + LATE_MS)

    def settle_s(self, attempts: int = 1) -> float:
        """A generous wait for a row to get through ``attempts`` retries and an ack timeout."""
        total = sum(self.retry_delay_ms(n) * (1 + self.retry_jitter) for n in range(1, attempts + 1)) / 1000
        return total + self.ack_timeout_s + (self.poll_ms / 1000) * (attempts + 1) + 5.0

    @property
    def reconnect_wait_s(self) -> float:
        """How long a broker outage may delay the next link: one full reconnect cap, plus margin."""
        return self.reconnect_max_ms * (1 + self.reconnect_jitter) / 1000 + self.hello_timeout_s + 5.0

    def with_values(self, values: dict[str, Any], source: str) -> Timing:
        known = {f.name for f in fields(self)} - {"source"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown timing key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return replace(self, **{k: float(v) for k, v in values.items()}, source=source)


def from_config_toml(text: str) -> dict[str, float]:
    """The timing a meshspec ``config.toml`` sets (the keys of the reference daemon's configuration)."""
    document = tomllib.loads(text)
    outbox, reconnect, broker, ipc = (document.get(k, {}) for k in ("outbox", "reconnect", "broker", "ipc"))
    mapping = {"retry_base_ms": outbox.get("retry_base_ms"), "retry_max_ms": outbox.get("retry_max_ms"),
               "retry_jitter": outbox.get("retry_jitter"), "ack_timeout_s": outbox.get("ack_timeout_s"),
               "reconnect_initial_ms": reconnect.get("initial_ms"), "reconnect_max_ms": reconnect.get("max_ms"),
               "reconnect_multiplier": reconnect.get("multiplier"), "reconnect_jitter": reconnect.get("jitter"),
               "hello_timeout_s": broker.get("hello_timeout_s"), "keepalive_s": ipc.get("keepalive_s"),
               "header_read_s": ipc.get("header_read_s"), "body_read_s": ipc.get("body_read_s")}
    return {k: float(v) for k, v in mapping.items() if v is not None}


def parse_cli(values: list[str]) -> dict[str, float]:
    """``--timing retry_base_ms=100,ack_timeout_s=3`` (repeatable) as a dict."""
    parsed: dict[str, float] = {}
    for value in values:
        for item in filter(None, (p.strip() for p in value.split(","))):
            key, sep, number = item.partition("=")
            if not sep:
                raise ValueError(f"--timing wants key=value, got {item!r}")
            parsed[key.strip()] = float(number)
    return parsed
