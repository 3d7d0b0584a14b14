"""Server-sent events (E-13): persisted first, streamed second, replayed after Last-Event-ID.

``publish`` appends the event to inbox.db (its id is the SSE id) and wakes every open stream; a stream replays what
it missed from the table, so a client that reconnects with Last-Event-ID sees every retained event after it, in
order, at least once. Streams count against ``max_streams`` of their own transport (429 too_many_streams above it),
not against the request in-flight cap. A stream whose client has gone frees its slot at once (E-43): each stream
carries a ``gone()`` probe of its connection; a stream looks at it whenever it wakes (at least once a second), and
a new stream that finds its transport full reclaims the slots of the gone ones before it answers 429.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from reference.clock import now_rfc3339
from reference.core.limits import limit
from spec import load_table

from .problems import Problem

#: the longest an idle stream waits before it looks at its connection again
WAKE_S = 1.0


class EventBus:
    """Publishes events through the inbox store and feeds the SSE streams."""

    def __init__(self, inbox: Any, max_streams: int = int(limit("ipc_streams_per_transport")),
                 keepalive_s: float = float(load_table("timing")["sse_keepalive_s"]["value"]), trace: Any = None,
                 batch: int = 500, clock: Callable[[], float] = time.time):
        self.inbox = inbox
        self.clock = clock
        self.max_streams = max_streams
        self.keepalive_s = keepalive_s
        self.trace = trace
        self.batch = batch
        self._cond = threading.Condition()
        self._open: dict[str, dict[object, Callable[[], bool]]] = {}  # transport -> stream token -> gone()
        self._closed = False

    def publish(self, name: str, payload: dict[str, Any]) -> int:
        """Persist one event and wake the streams; returns its id."""
        event_id = self.inbox.append_event(name, payload)
        self.notify(event_id, name)
        return event_id

    def notify(self, event_id: int, name: str) -> None:
        """Wake the streams for an event that is already persisted (e.g. by the inbox insert's transaction)."""
        if self.trace is not None:
            self.trace.emit("sse_event", event_id=event_id, event=name)
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def streams(self) -> int:
        return sum(len(streams) for streams in self._open.values())

    def open_stream(self, last_event_id: int | None, transport: str = "unix",
                    gone: Callable[[], bool] | None = None) -> Iterator[bytes]:
        """Reserve a stream slot of ``transport`` and return its body iterator (raises Problem too_many_streams).

        ``gone()`` says whether the stream's client has disconnected; its slot is then freed without waiting for a
        write to fail.
        """
        token = object()
        with self._cond:
            streams = self._open.setdefault(transport, {})
            if len(streams) >= self.max_streams:
                for other, probe in list(streams.items()):
                    # req: SSE-SLOT-RECLAIM -- a full transport first frees the slots of clients that have gone
                    if _gone(probe):
                        del streams[other]  # the stream notices on its next wake and ends
                self._cond.notify_all()
            if len(streams) >= self.max_streams:
                # req: SSE-STREAM-LIMIT, IPC-TRANSPORT-CAPACITY -- per transport
                problem = Problem("too_many_streams", f"at most {self.max_streams} event streams at once over "
                                  f"{transport}")
                problem.headers["Retry-After"] = "5"
                raise problem
            streams[token] = gone or _never
        start = self.inbox.last_event_id() if last_event_id is None else last_event_id
        return self._stream(start, last_event_id is not None, transport, token)

    def _holds(self, transport: str, token: object) -> bool:
        """Whether the stream still holds its slot: its client is there and nobody reclaimed it."""
        probe = self._open.get(transport, {}).get(token)
        if probe is None:
            return False
        # req: SSE-SLOT-RECLAIM
        if _gone(probe):
            with self._cond:
                self._open[transport].pop(token, None)
            return False
        return True

    def _stream(self, after: int, replaying: bool, transport: str = "unix", token: object = None) -> Iterator[bytes]:
        try:
            yield b": connected\n\n"
            if replaying:
                oldest = self.inbox.oldest_event_id()
                if oldest is None:  # nothing retained: the next event gets the next id
                    oldest = self.inbox.last_event_id() + 1
                if after < oldest - 1:
                    gap = {"requested_after": after, "oldest_available": oldest, "ts": now_rfc3339(self.clock)}
                    yield format_event(None, "replay_gap", gap)
            cursor = after
            last_write = time.monotonic()
            while not self._closed and self._holds(transport, token):
                # req: SSE-REPLAY -- every retained event after Last-Event-ID, in id order, then live
                rows = self.inbox.events_after(cursor, self.batch)
                if rows:
                    for event in rows:
                        cursor = event.id
                        yield format_event(event.id, event.name, event.payload)
                    last_write = time.monotonic()
                    continue
                with self._cond:
                    if self._closed:
                        break
                    wait = self.keepalive_s - (time.monotonic() - last_write)
                    if wait > 0:
                        self._cond.wait(timeout=min(wait, WAKE_S))
                if time.monotonic() - last_write >= self.keepalive_s:
                    # req: SSE-KEEPALIVE
                    yield b": keepalive\n\n"
                    last_write = time.monotonic()
        finally:
            with self._cond:
                self._open.get(transport, {}).pop(token, None)


def _never() -> bool:
    return False


def _gone(probe: Callable[[], bool]) -> bool:
    try:
        return bool(probe())
    except Exception:  # a probe that fails cannot tell: the stream keeps its slot
        return False


def format_event(event_id: int | None, name: str, payload: dict[str, Any] | str) -> bytes:
    """One SSE event: id (when persisted), event name, one line of JSON data."""
    # req: SSE-PAYLOADS -- one line of JSON: the object its publisher built to spec/schemas/sse/<event>.json
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    # req: SSE-IDS-MONOTONIC -- the SSE id is the persisted event id
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {name}\ndata: {data}\n\n".encode()
