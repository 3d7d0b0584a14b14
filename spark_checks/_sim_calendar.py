"""The generator's calendar queue: where a mesh's events get their order and their per-node numbers.

Theory of operation. Stories push events with a timestamp as they play; the calendar keeps them in slots of
``2**SLOT_SHIFT`` ms and drains them in (ts, insertion) order. Draining is where each node's ``seq`` (and the SSE
``event_id`` and inbox sequence numbers) are assigned, so numbers follow trace order whatever order the stories
pushed in. A ``CALLBACK`` entry runs a deferred piece of a story instead of emitting (it may push into the slot
being drained). Draining stops once the mesh's share of events is emitted: cutting in time order keeps every
invariant true at the cut.

An armed node fault (``node_faults``) is played on the node's next eligible event: a seq or event-id fault on its
next ``sse_event`` (its ``seq`` or its ``event_id`` goes one back), an inbox fault on its next inserted
``inbox_insert`` (its ``inbox_seq`` repeats the one before); ``played_faults`` records which fault was played where.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from ._sim_trace import HE, HR, INBOX, SSE, Sink

SLOT_SHIFT = 10  # calendar slots of 1024 ms
CALLBACK = -1
SSE_FAULTS = ("non_monotonic_seq", "non_monotonic_event_id")
INBOX_FAULTS = ("inbox_seq_reused",)


class Calendar:
    """One mesh's pending events; ``advance`` emits them into the sink in trace order."""

    def __init__(self, sink: Sink, base_node: int, nodes: int, budget: int, flush_events: int):
        self.sink = sink
        self.base_node = base_node
        self.budget = budget
        self.flush_events = flush_events
        self.seqs = [0] * nodes
        self.event_ids = [0] * nodes
        self.inbox_seqs = [0] * nodes
        self.last_ts = [0] * nodes
        self.node_faults: list[tuple[str, int]] = []  # (kind, node) armed for the node's next eligible event
        self.played_faults: list[tuple[str, int]] = []
        self.slots: dict[int, list[tuple[Any, ...]]] = {}
        self.slot_heap: list[int] = []
        self.cur_slot: int | None = None
        self.cur_heap: list[tuple[Any, ...]] = []
        self.counter = 0
        self.emitted = 0

    def push(self, ts: int, kind: int, node: int, bucket: int, payload: Any) -> None:
        c = self.counter
        self.counter = c + 1
        slot = ts >> SLOT_SHIFT
        if slot == self.cur_slot:
            heapq.heappush(self.cur_heap, (ts, c, kind, node, bucket, payload))
            return
        entries = self.slots.get(slot)
        if entries is None:
            entries = self.slots[slot] = []
            heapq.heappush(self.slot_heap, slot)
        entries.append((ts, c, kind, node, bucket, payload))

    def later(self, ts: int, action: Callable[[int], None]) -> None:
        self.push(ts, CALLBACK, 0, 0, action)

    def advance(self, until_slot: int) -> bool:
        """Emit every event in slots before ``until_slot`` in (ts, insertion) order; False once the budget is spent.

        Emitting assigns each node's seq (and SSE event ids and inbox sequence numbers) and hands the event to the
        sink; a callback entry runs instead (and may add entries to the slot being drained).
        """
        slot_heap, slots = self.slot_heap, self.slots
        seqs, base, last_ts = self.seqs, self.base_node, self.last_ts
        sink = self.sink
        rows = sink.rows
        flush_every = self.flush_events
        budget = self.budget
        emitted = self.emitted
        heappop = heapq.heappop
        while slot_heap and slot_heap[0] < until_slot:
            slot = heappop(slot_heap)
            entries = slots.pop(slot)
            entries.sort()
            self.cur_slot = slot
            heap = self.cur_heap = []
            i, n = 0, len(entries)
            while True:
                if heap:
                    if i < n and entries[i] < heap[0]:
                        entry = entries[i]
                        i += 1
                    else:
                        entry = heappop(heap)
                elif i < n:
                    entry = entries[i]
                    i += 1
                else:
                    break
                ts, _, kind, node, bucket, payload = entry
                if kind == CALLBACK:
                    payload(ts)
                    continue
                local = node - base
                seq = seqs[local]
                seqs[local] = seq + 1
                last_ts[local] = ts
                if kind == SSE:
                    seq, payload = self._sse_payload(local, node, seq, payload)
                elif kind == INBOX:
                    recipient, mesh, cmid, bmid, did, inserted, cell = payload
                    if inserted:
                        value = self.inbox_seqs[local] + 1
                        if self.node_faults and value > 1:
                            value -= self._play(node, INBOX_FAULTS)
                        self.inbox_seqs[local] = value
                        cell[0] = value
                    payload = (recipient, mesh, cmid, bmid, did, inserted, cell[0])
                elif kind == HE:  # the inbox_seq of the row, emitted before it
                    payload = (*payload[:3], payload[3][0], payload[4])
                elif kind == HR:
                    payload = (*payload[:2], payload[2][0], *payload[3:])
                rows[kind][bucket].append((seq, ts, node, payload))
                emitted += 1
                if emitted % flush_every == 0:
                    sink.flush()
                if emitted >= budget:
                    self.emitted = emitted
                    self.cur_slot = None
                    return False
            self.cur_slot = None
        self.emitted = emitted
        return True

    def _sse_payload(self, local: int, node: int, seq: int, code: int) -> tuple[int, tuple[int, int, int]]:
        """(the seq to trace, (line, event_id, code)) of an SSE event; plays an armed seq or event-id fault."""
        line = seq
        event_id = self.event_ids[local] + 1
        if self.node_faults and seq > 0 and event_id > 1:
            fault = self._play(node, SSE_FAULTS)
            if fault == 1:
                seq -= 1
            elif fault == 2:
                event_id -= 1
        self.event_ids[local] = max(self.event_ids[local], event_id)
        return seq, (line, event_id, code)

    def _play(self, node: int, faults: tuple[str, ...]) -> int:
        """Play the first fault of ``faults`` armed for ``node``: its 1-based position in ``faults``, 0 if none."""
        for k, (fault, fault_node) in enumerate(self.node_faults):
            if fault_node == node and fault in faults:
                del self.node_faults[k]
                self.played_faults.append((fault, node))
                return faults.index(fault) + 1
        return 0
