"""Group commit for POST /v1/send: concurrent accepts share one SQLite transaction and one fsync.

Theory of operation: request threads hand their send to ``submit`` as an ``AcceptItem`` (its client_message_id,
request_fingerprint and payload already computed on the request's thread) and block. One committer thread
takes the first waiting item, gathers whatever else arrives within ``window_s`` (up to ``max_batch``; with a zero
window, whatever queued while the previous batch was committing), runs ``store.accept_batch`` -- one BEGIN IMMEDIATE
... COMMIT, each item decided in arrival order exactly as if alone -- and only then wakes every submitter with its own
answer. So every 202 still follows the fsync of its row (§4.1), and N concurrent accepts cost one fsync instead of N.

This is on the hot path of every send, so the hand-off is as cheap as CPython allows: a C ``SimpleQueue`` in, and a
pre-acquired ``threading.Lock`` per submitter as the wake-up latch out (a ``Future`` costs a Condition and a list).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .store import Accepted, AcceptItem

_STOP = object()


class _Waiter:
    """One submitter's latch: ``wait`` blocks until the committer calls ``set`` (once)."""

    __slots__ = ("_done", "_error", "_result")

    def __init__(self) -> None:
        self._done = threading.Lock()
        self._done.acquire()
        self._result: Any = None
        self._error: BaseException | None = None

    def set(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result = result
        self._error = error
        self._done.release()

    def wait(self, timeout: float | None) -> Any:
        if not self._done.acquire(timeout=-1 if timeout is None else timeout):
            raise TimeoutError(f"the group commit did not answer within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result


class GroupCommitter:
    """Batches accepts for ``accept_batch(items) -> list[result]`` (``OutboxStore.accept_batch``)."""

    def __init__(self, accept_batch: Callable[[Sequence[AcceptItem]], Sequence[Accepted]], window_s: float = 0.002,
                 max_batch: int = 256):
        self._accept_batch = accept_batch
        self._window_s = window_s
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="meshd-group-commit", daemon=True)
        self._thread.start()
        self.batches = 0
        self.items = 0

    def submit(self, item: AcceptItem, timeout: float | None = 30.0) -> Accepted:
        """Accept ``item`` durably and return its result (re-raising the batch's exception, if any)."""
        waiter = _Waiter()
        self._queue.put((item, waiter))
        return waiter.wait(timeout)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            stop = False
            try:
                while len(batch) < self._max_batch:
                    entry = self._queue.get(timeout=self._window_s) if self._window_s > 0 else self._queue.get_nowait()
                    if entry is _STOP:
                        stop = True
                        break
                    batch.append(entry)
            except queue.Empty:
                pass
            self._commit(batch)
            if stop:
                return

    def _commit(self, batch: list[tuple[AcceptItem, _Waiter]]) -> None:
        try:
            # req: IPC-DURABLE-BEFORE-RESPONSE -- every submitter wakes only after the batch's COMMIT
            results = self._accept_batch([item for item, _ in batch])
        except BaseException as exc:  # every waiter must learn the batch failed
            for _, waiter in batch:
                waiter.set(error=exc)
            return
        self.batches += 1
        self.items += len(batch)
        for (_, waiter), result in zip(batch, results, strict=True):
            waiter.set(result)

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout=5)
