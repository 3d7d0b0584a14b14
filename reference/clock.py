"""The wall clock the reference reads: ``time.time()``, plus the conformance harness's clock hook; and the one way a
time is written as text.

The launch contract (conformance/launch.py) passes ``{clock_file}``: a file holding a decimal number of seconds to
add to the wall clock, which the harness rewrites to move time forward (so a row can outlive its max age in a
bounded run). Without a file this is ``time.time``. The file is re-read when its modification time changes, at most
every ``RECHECK_S`` seconds, so a read on the hot path costs no system call.

Rules: a part that is handed a clock reads the time from it, never from ``time`` (the daemon hands its ``WallClock``
to the stores, the link, the event bus, the IPC context and the trace). Every timestamp written as text is
``rfc3339_ms``: RFC 3339 in UTC with milliseconds and ``Z``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

RECHECK_S = 0.05
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def rfc3339_ms(unix_ms: int) -> str:
    """``unix_ms`` as RFC 3339 UTC with milliseconds (``2026-05-03T12:00:00.000Z``)."""
    return (_EPOCH + timedelta(milliseconds=unix_ms)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def now_rfc3339(clock: Callable[[], float]) -> str:
    """The injected ``clock``'s now (seconds since the epoch) as ``rfc3339_ms``."""
    return rfc3339_ms(int(clock() * 1000))


def wall_ms() -> int:
    """The wall clock in unix milliseconds: the default of a part whose owner injects no clock."""
    return time.time_ns() // 1_000_000


class WallClock:
    """Seconds since the epoch, as a float; ``ms()`` as an int. Thread-safe."""

    def __init__(self, offset_file: str | Path | None = None):
        self.offset_file = Path(offset_file) if offset_file else None
        self._offset = 0.0
        self._mtime: int | None = None
        self._checked = 0.0
        self._lock = threading.Lock()
        self._refresh()

    def _refresh(self) -> None:
        if self.offset_file is None:
            return
        try:
            mtime = os.stat(self.offset_file).st_mtime_ns
        except OSError:
            return
        if mtime == self._mtime:
            return
        try:
            self._offset = float(self.offset_file.read_text(encoding="ascii").strip() or 0)
        except (OSError, ValueError):
            return
        self._mtime = mtime

    def __call__(self) -> float:
        if self.offset_file is not None:
            now = time.monotonic()
            if now - self._checked >= RECHECK_S:
                with self._lock:
                    self._checked = now
                    self._refresh()
        return time.time() + self._offset

    def ms(self) -> int:
        return int(self() * 1000)
