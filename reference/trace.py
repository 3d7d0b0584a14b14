"""Trace events as JSONL (spec/schemas/trace): what the reference daemon and broker write with --trace-dir.

One file per node (`<dir>/<source>-<node>.jsonl`). ``seq`` is strictly increasing per node and continues across
restarts (the writer resumes after the last line of an existing file), so a node's events are totally ordered even
when the process crashed in between. Each line is one ``write`` to a descriptor opened with O_APPEND, never split by a
buffer, so a process killed between two events leaves no torn line and processes appending to one file never
interleave inside a line; tracing is observability, not durability, so there is no fsync.
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
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        if os.fstat(self._fd).st_size > 0:
            self._terminate_partial_line()

    def _terminate_partial_line(self) -> None:
        with self.path.open("rb") as handle:
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                self._write(b"\n")

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # a regular file takes it in one write; a short one (a full disk, a signal) goes on
            view = view[os.write(self._fd, view):]

    def emit(self, kind: str, **members: Any) -> dict[str, Any]:
        """Write one event of ``kind``; returns it."""
        with self._lock:
            self._seq += 1
            event = {"v": 1, "source": self.source, "node": self.node, "seq": self._seq,
                     "ts_ms": int(self._clock() * 1000), "kind": kind, **members}
            if self._check is not None:
                self._check(event)
            self._write((json.dumps(event, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8"))
            return event

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def schema_check(event: dict[str, Any]) -> None:
    """Raise when ``event`` does not match spec/schemas/trace/event.json (used by tests and --trace-strict)."""
    from spec import validator

    validator("trace/event").validate(event)
