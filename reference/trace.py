"""Trace events as JSONL (spec/schemas/trace): what the reference daemon and broker write with --trace-dir.

One file per node (`<dir>/<source>-<node>.jsonl`). ``seq`` is strictly increasing per node and continues across
restarts (the writer resumes after the last line of an existing file), so a node's events are totally ordered even
when the process crashed in between. Lines are flushed as written; tracing is observability, not durability, so
there is no fsync.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _last_seq(path: Path) -> int:
    """The seq of the last complete line, or -1."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 65536))
            tail = handle.read().splitlines()
    except FileNotFoundError:
        return -1
    for line in reversed(tail):
        try:
            return int(json.loads(line)["seq"])
        except (ValueError, KeyError, TypeError):
            continue
    return -1


class TraceWriter:
    """Appends schema-shaped trace events for one node; thread-safe."""

    def __init__(self, directory: Path, source: str, node: str, clock: Callable[[], float] = time.time,
                 check: Callable[[dict[str, Any]], None] | None = None):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{source}-{node.replace(':', '_').replace('/', '_')}.jsonl"
        self.source = source
        self.node = node
        self._clock = clock
        self._check = check
        self._lock = threading.Lock()
        self._seq = _last_seq(self.path)
        self._handle = self.path.open("a", encoding="utf-8")
        if self._handle.tell() > 0:
            self._terminate_partial_line()

    def _terminate_partial_line(self) -> None:
        with self.path.open("rb") as handle:
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                self._handle.write("\n")

    def emit(self, kind: str, **members: Any) -> dict[str, Any]:
        """Write one event of ``kind``; returns it."""
        with self._lock:
            self._seq += 1
            event = {"v": 1, "source": self.source, "node": self.node, "seq": self._seq,
                     "ts_ms": int(self._clock() * 1000), "kind": kind, **members}
            if self._check is not None:
                self._check(event)
            self._handle.write(json.dumps(event, separators=(",", ":"), ensure_ascii=False) + "\n")
            self._handle.flush()
            return event

    def close(self) -> None:
        with self._lock:
            self._handle.close()


def schema_check(event: dict[str, Any]) -> None:
    """Raise when ``event`` does not match spec/schemas/trace/event.json (used by tests and --trace-strict)."""
    from spec import validator

    validator("trace/event").validate(event)
