"""The wall clock the reference reads: ``time.time()``, plus the conformance harness's clock hook.

The launch contract (conformance/launch.py) passes ``{clock_file}``: a file holding a decimal number of seconds to
add to the wall clock, which the harness rewrites to move time forward (so a row can outlive its max age in a
bounded run). Without a file this is ``time.time``. The file is re-read when its modification time changes, at most
every ``RECHECK_S`` seconds, so a read on the hot path costs no system call.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

RECHECK_S = 0.05


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
