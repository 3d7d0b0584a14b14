"""`meshtrace generate`: simulate many daemons and their brokers on the sans-IO core and write the trace as Parquet.

Theory of operation. The daemons are grouped into meshes of ``mesh_size``; each mesh has its own broker node and is
simulated independently (its own seeded random source), so a trace depends on the parameters and the seed only,
never on how many worker processes ran it. Worker ``w`` simulates meshes ``w, w + W, ...`` one after the other.

Within a mesh, every send is played out as a *story* the moment the client posts it: the IPC decision, the outbox
row's whole lifecycle (dispatch, broker answer, retries, timeouts, late acks, link losses, crash recovery, max age,
operator requeue), the broker's accept decision and commit, and the deliveries to every recipient (redelivered at
each lease expiry until a recipient acks). Every decision comes from ``reference.core`` -- the outbox and IPC tables,
the broker's accept table, backoff and max age -- memoised per input shape (the tables are tiny). Each daemon has an
outage schedule (link drops and crashes, drawn lazily in time order) that every story consults, so all rows inflight
at a crash are recovered at the restart, and a recipient that is down is delivered to again after its lease.

Story events are timestamped and go into a calendar queue; the queue is drained in (ts, insertion) order, which is
where each node's ``seq`` (and SSE event ids and inbox sequence numbers) are assigned. A mesh stops after its share
of ``--events``: cutting in time order keeps every invariant true at the cut. Emitted events are buffered per (kind,
bucket) and flushed as one row group per bucket every ``flush_events`` events, so memory stays bounded.

Injections (``--inject KIND``) replace one eligible story of a mesh by a hand-played happy path that breaks exactly
one invariant (see ``catalogue.INJECTIONS``); the manifest lists each one with the key a checker must report.
"""

from __future__ import annotations

import bisect
import gc
import heapq
import json
import math
import multiprocessing
import os
import random
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .catalogue import DEFAULT_REDELIVERY_GRACE_MS, INJECTIONS
from .format import DEFAULT_BUCKETS, FLAT_SCHEMA

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SLOT_SHIFT = 10  # calendar slots of 1024 ms
LEASE_MS = 30_000
LEASE_MAX_MS = 600_000
ACK_TIMEOUT_MS = 10_000
FORCED_LEASE_MS = 1_000  # the lease of an injected delivery fault
HISTORY_RETENTION_MS = 600_000  # topic t3 keeps message rows for 10 minutes (history_pruned after)
MAX_REQUEUES = 2

IPC, OT, INBOX, SSE, AD, AC, DL, DA, HP = range(9)
SUCCESS = frozenset({"ack_created", "ack_duplicate_history", "ack_duplicate_pruned"})
KIND_NAMES = ("ipc_decision", "outbox_transition", "inbox_insert", "sse_event", "accept_decision", "accept_commit",
              "delivery", "delivery_ack", "history_pruned")
CALLBACK = -1
CRASH, LINK = 1, 2

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]  # 10 bits -> two Crockford characters


def ulid(ts_ms: int, entropy: int) -> str:
    """A ULID string for ``ts_ms`` with 80 bits of ``entropy`` (deterministic: the caller supplies the bits).

    Written here rather than with python-ulid because the simulation needs seeded, collision-free ids in about a
    microsecond each.
    """
    v = (ts_ms << 80) | (entropy & 0xFFFFFFFFFFFFFFFFFFFF)
    p = _PAIRS
    return (p[v >> 120] + p[(v >> 110) & 1023] + p[(v >> 100) & 1023] + p[(v >> 90) & 1023] + p[(v >> 80) & 1023]
            + p[(v >> 70) & 1023] + p[(v >> 60) & 1023] + p[(v >> 50) & 1023] + p[(v >> 40) & 1023]
            + p[(v >> 30) & 1023] + p[(v >> 20) & 1023] + p[(v >> 10) & 1023] + p[v & 1023])


# --- the core, memoised ---------------------------------------------------------------------------------------

class Core:
    """Every decision the simulation makes, taken from ``reference.core`` once per input shape."""

    def __init__(self) -> None:
        from reference.core import OutboxPolicy, derive

        self.policy = OutboxPolicy(retry_base_ms=500, retry_max_ms=30_000, jitter=0.25,
                                   max_age_hours=derive("retention_scoped", 7, override_hours=1).hours)
        self.max_age_ms = int(self.policy.max_age_hours) * 3_600_000
        self._ipc: dict[tuple[str, bool | None], tuple[str, int]] = {}
        self._transition: dict[tuple[str, str], tuple[str, str, int, tuple[str, ...]] | None] = {}
        self._broker: dict[tuple[str, ...], tuple[str, str]] = {}
        self._status: dict[tuple[str, str], int] = {}

    def ipc(self, state: str, match: bool | None) -> tuple[str, int]:
        """(table_row, http_status) of the §4.5.1 decision for a row in ``state`` (``none``: no row)."""
        key = (state, match)
        found = self._ipc.get(key)
        if found is None:
            from reference.core import OutboxRow, decide_send

            stored, other = b"\x01" * 32, b"\x02" * 32
            existing = None if state == "none" else OutboxRow(
                id="0" * 26, client_message_id="x", request_fingerprint=stored, payload=b"", enqueued_at=0,
                next_attempt_at=0, status=state)
            decision = decide_send(existing, stored if match in (None, True) else other, "x")
            found = self._ipc[key] = (decision.table_row, decision.http_status)
        return found

    def transition(self, state: str, event: str) -> tuple[str, str, int, tuple[str, ...]] | None:
        """(table_row, to, attempts delta, io effects) for ``event`` on a row in ``state``; None when ignored."""
        key = (state, event)
        if key in self._transition:
            return self._transition[key]
        from reference.core import OutboxEvent, OutboxRow, accepted, apply, new_row

        if state == "none":
            row = new_row("0" * 26, "x", b"\x01" * 32, b"", 0, self.policy)
            result = accepted(row)
            found = (result.table_row, "pending", 0, result.effects)
        else:
            row = OutboxRow(id="0" * 26, client_message_id="x", request_fingerprint=b"\x01" * 32, payload=b"",
                            enqueued_at=0, next_attempt_at=0, status=state, attempts=3)
            result = apply(row, OutboxEvent(event, now=0, broker_message_id="b", history_id="h",
                                            successor_id="1" * 26, successor_client_message_id="y"), self.policy)
            if result.outcome != "transition":
                found = None
            else:
                assert result.after is not None
                found = (result.table_row, result.after.status, result.after.attempts - 3, result.effects)
        self._transition[key] = found
        return found

    def broker(self, b1: str, drift: str, claim: str, fingerprint: str, b2: str, commit: str) -> tuple[str, str]:
        """(table_row, phase) of the broker's accept decision (spec/tables/broker_accept.yaml)."""
        key = (b1, drift, claim, fingerprint, b2, commit)
        found = self._broker.get(key)
        if found is None:
            from reference.core import settle

            settled = settle(b1=b1, drift=drift, claim=claim, fingerprint=fingerprint, b2=b2, commit=commit)
            assert settled is not None
            found = self._broker[key] = (settled.table_row, settled.phase)
        return found

    def check_status(self, phase: str, check: str) -> int:
        key = (phase, check)
        if key not in self._status:
            from reference.core.broker_accept import check_status

            self._status[key] = check_status(phase, check)[0]
        return self._status[key]

    def backoff(self, attempts: int, jitter_unit: float) -> int:
        from reference.core import backoff_ms

        return backoff_ms(attempts, self.policy, jitter_unit)

    @staticmethod
    def fingerprint(destination_kind: str, destination_ref: str, body: str) -> bytes:
        from reference.core import FingerprintInput, request_fingerprint

        return request_fingerprint(FingerprintInput(destination_kind, destination_ref, "", "next", None, body))


# --- parameters, daemons, outages ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Params:
    """What a generated trace depends on."""

    events: int
    daemons: int
    keys: int | None = None
    seed: int = 0
    fault_rate: float = 0.05
    inject: tuple[str, ...] = ()
    buckets: int = DEFAULT_BUCKETS
    mesh_size: int = 8
    send_interval_ms: int = 1_000
    hot_fraction: float = 0.002
    flush_events: int = 1_000_000
    redelivery_grace_ms: int = DEFAULT_REDELIVERY_GRACE_MS

    def __post_init__(self) -> None:
        problems = [f"{name} must be at least {low} (got {getattr(self, name)})"
                    for name, low in (("events", 1), ("daemons", 1), ("buckets", 1), ("mesh_size", 1),
                                      ("send_interval_ms", 1), ("flush_events", 1), ("redelivery_grace_ms", 0))
                    if getattr(self, name) < low]
        if self.keys is not None and self.keys < 1:
            problems.append(f"keys must be at least 1 (got {self.keys})")
        problems += [f"{name} must be between 0 and 1 (got {getattr(self, name)})"
                     for name in ("fault_rate", "hot_fraction") if not 0.0 <= getattr(self, name) <= 1.0]
        if problems:
            raise ValueError("; ".join(problems))

    def meshes(self) -> int:
        return max(1, math.ceil(self.daemons / self.mesh_size))

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "inject": list(self.inject)}


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


@dataclass
class Daemon:
    index: int
    node: int  # worker-global node id
    name: str
    pubkey: str
    short: str
    outages: Outages
    sends: int = 0
    requeues: int = 0


@dataclass
class Dedupe:
    """The broker's dedupe row for one (mesh, client_message_id), as the stories sharing it see it."""

    bmid: str | None = None
    fp: bytes | None = None
    pruned_at: int | None = None


@dataclass
class Row:
    oid: str
    cmid: str
    fp: bytes
    enq: int
    max_age_at: int
    bucket: int
    state: str = "pending"
    attempts: int = 0
    bmid: str | None = None
    times: list[int] = field(default_factory=list)
    states: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Destination:
    kind: str
    ref: str
    recipients: tuple[int, ...]
    ok: bool
    b2_check: str = ""


# --- the writer -------------------------------------------------------------------------------------------------

def _const(value: Any, kind: pa.DataType, n: int) -> pa.Array:
    return pa.array([value], kind).take(pa.array(np.zeros(n, dtype=np.int32)))


# Kind layouts: the payload of each kind after (seq, ts_ms, node). ``mesh`` is an index into the sink's mesh names;
# a tuple of names is one ``code`` column: an index into the sink's registry of that kind's value combinations
# (categorical members travel as one small integer and become strings at flush time).
LAYOUT: dict[int, tuple[str | tuple[str, ...], ...]] = {
    IPC: ("mesh", "client_message_id", "request_fingerprint",
          ("row_state", "fingerprint_match", "table_row", "http_status"), "outbox_id"),
    OT: ("mesh", "outbox_id", "client_message_id", "request_fingerprint", ("from_state", "to_state", "event",
         "table_row"), "attempts", "enqueued_at_ms", "max_age_at_ms", "broker_message_id", "superseded_by"),
    INBOX: ("pubkey:recipient", "mesh", "client_message_id", "broker_message_id", "delivery_id", "inserted",
            "inbox_seq"),
    SSE: ("line", "event_id", ("event",)),
    AD: ("mesh", "client_message_id", "request_fingerprint", ("table_row", "phase", "status"), "broker_message_id",
         "pubkey:member"),
    AC: ("mesh", "client_message_id", "broker_message_id", "request_fingerprint", ("destination_kind",
         "effects_dedupe", "effects_message", "effects_history", "effects_delivery", "recipients"),
         "destination_ref"),
    DL: ("mesh", "broker_message_id", "client_message_id", "pubkey:recipient", "delivery_id", "attempt",
         "lease_until_ms"),
    DA: ("mesh", "broker_message_id", "client_message_id", "pubkey:recipient", "delivery_id"),
    HP: ("mesh", "broker_message_id", "client_message_id"),
}


# Low-cardinality columns get Parquet dictionary pages; ids and fingerprints are written plain.
DICTIONARY = ["source", "node", "kind", "mesh", "from_state", "to_state", "event", "table_row", "row_state", "phase",
              "destination_kind", "destination_ref", "member", "recipient"]


class Codes:
    """Per kind, the distinct combinations of its categorical members, numbered in order of first use."""

    def __init__(self) -> None:
        self.index: list[dict[tuple[Any, ...], int]] = [{} for _ in KIND_NAMES]
        self.values: list[list[tuple[Any, ...]]] = [[] for _ in KIND_NAMES]

    def code(self, kind: int, value: tuple[Any, ...]) -> int:
        found = self.index[kind].get(value)
        if found is None:
            found = self.index[kind][value] = len(self.values[kind])
            self.values[kind].append(value)
        return found


class Sink:
    """Buffers emitted events per (kind, bucket) and writes one row group per bucket per flush."""

    def __init__(self, root: Path, buckets: int, worker: int, codes: Codes, rows_per_file: int = 8_000_000):
        self.root = root
        self.buckets = buckets
        self.worker = worker
        self.codes = codes
        self.rows_per_file = rows_per_file
        self.rows: list[list[list[tuple[Any, ...]]]] = [[[] for _ in range(buckets)] for _ in KIND_NAMES]
        self.node_names: list[str] = []
        self.pubkeys: list[str | None] = []  # each node's member key (None for a broker)
        self.mesh_names: list[str] = []
        self.writers: dict[int, pq.ParquetWriter] = {}
        self.file_rows: dict[int, int] = {}
        self.file_index: dict[int, int] = {}
        self.written = 0
        self.by_kind = [0] * len(KIND_NAMES)

    def _table(self, kind: int, rows: list[tuple[Any, ...]], nodes: pa.Array, meshes: pa.Array,
               pubkeys: pa.Array) -> pa.Table:
        n = len(rows)
        seqs, tss, node_ids, payloads = zip(*rows, strict=True)
        data: dict[str, pa.Array] = {}
        seq = pa.array(seqs, pa.int64())
        data["seq"] = seq
        data["ts_ms"] = pa.array(tss, pa.int64())
        data["node"] = nodes.take(pa.array(node_ids, pa.int32()))
        for spec, values in zip(LAYOUT[kind], zip(*payloads, strict=True), strict=True):
            if spec == "mesh":
                data["mesh"] = meshes.take(pa.array(values, pa.int32()))
            elif isinstance(spec, str) and spec.startswith("pubkey:"):
                data[spec[7:]] = pubkeys.take(pa.array(values, pa.int32()))
            elif isinstance(spec, tuple):
                codes = pa.array(values, pa.int32())
                combos = self.codes.values[kind]
                for k, name in enumerate(spec):
                    dictionary = pa.array([combo[k] for combo in combos], FLAT_SCHEMA.field(name).type)
                    data[name] = dictionary.take(codes)
            else:
                data[spec] = pa.array(values, FLAT_SCHEMA.field(spec).type)
        if "line" not in data:
            data["line"] = seq
        data["v"] = _const(1, pa.int8(), n)
        data["kind"] = _const(KIND_NAMES[kind], pa.string(), n)
        data["source"] = _const("daemon" if kind < AD else "broker", pa.string(), n)
        arrays = [data[f.name] if f.name in data else pa.nulls(n, f.type) for f in FLAT_SCHEMA]
        return pa.Table.from_arrays(arrays, schema=FLAT_SCHEMA)

    def flush(self) -> None:
        nodes = pa.array(self.node_names, pa.string())
        meshes = pa.array(self.mesh_names, pa.string())
        pubkeys = pa.array(self.pubkeys, pa.string())
        for bucket in range(self.buckets):
            tables = []
            for kind in range(len(KIND_NAMES)):
                rows = self.rows[kind][bucket]
                if rows:
                    tables.append(self._table(kind, rows, nodes, meshes, pubkeys))
                    self.by_kind[kind] += len(rows)
                    self.rows[kind][bucket] = []
            if tables:
                self._write(bucket, pa.concat_tables(tables))

    def _write(self, bucket: int, table: pa.Table) -> None:
        writer = self.writers.get(bucket)
        if writer is not None and self.file_rows[bucket] >= self.rows_per_file:
            writer.close()
            writer = None
        if writer is None:
            index = self.file_index.get(bucket, 0)
            self.file_index[bucket] = index + 1
            directory = self.root / f"bucket={bucket:02d}"
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / f"part-w{self.worker:03d}-{index:04d}.parquet"
            writer = self.writers[bucket] = pq.ParquetWriter(path, FLAT_SCHEMA, compression="zstd",
                                                             compression_level=1, use_dictionary=DICTIONARY)
            self.file_rows[bucket] = 0
        writer.write_table(table, row_group_size=table.num_rows)
        self.file_rows[bucket] += table.num_rows
        self.written += table.num_rows

    def close(self) -> None:
        self.flush()
        for writer in self.writers.values():
            writer.close()
        self.writers.clear()


# --- one mesh ---------------------------------------------------------------------------------------------------

@dataclass
class Injection:
    kind: str
    invariant: str
    key: dict[str, str]
    needs_ts: int = 0  # realised when the mesh emitted past this ts (of ``needs_node`` when set)
    needs_node: int | None = None
    realised: bool = False


class MeshSim:
    """Simulates one mesh and streams its events into a ``Sink``."""

    def __init__(self, params: Params, index: int, daemon_count: int, budget: int, story_budget: int,
                 injections: Sequence[str], hot_posts: int, sink: Sink, core: Core):
        self.p = params
        self.index = index
        self.sink = sink
        self.codes = sink.codes
        self.core = core
        self.budget = budget
        self.story_budget = story_budget
        self.rng = random.Random(params.seed * 1_000_003 + index * 7919 + 17)
        self.rnd = self.rng.random
        self.mesh = f"m{params.seed:x}-{index:04d}"
        self.mesh_i = len(sink.mesh_names)
        sink.mesh_names.append(self.mesh)
        self.buckets = params.buckets
        f = params.fault_rate
        self.p_frame_lost = 0.2 * f
        self.p_ack_lost = 0.2 * f
        self.p_late_ack = 0.3
        self.p_5xx = 0.2 * f
        self.p_b1 = 0.05 * f
        self.p_drift = 0.01 * f
        self.p_bad_destination = 0.05 * f
        self.p_push_lost = 0.1 * f
        self.p_client_ack_lost = 0.1 * f
        self.p_requeue_dead = 0.5
        self.p_requeue_pending = 0.05
        self.p_collision = 0.2 * f
        self.p_dup_post = min(0.6, 3 * f)
        mean_gap = params.send_interval_ms * 20 / f if f > 0 else 0.0
        first_node = len(sink.node_names)
        self.base_node = first_node
        self.daemons: list[Daemon] = []
        for d in range(daemon_count):
            pubkey = f"{self.rng.getrandbits(256):064x}"
            outages = Outages(random.Random(params.seed * 1_000_003 + index * 7919 + 101 * (d + 1)), mean_gap, T0_MS)
            daemon = Daemon(d, first_node + d, f"daemon-{pubkey[:16]}", pubkey, pubkey[:8], outages)
            outages.on_new = self._outage_events(daemon)
            self.daemons.append(daemon)
            sink.node_names.append(daemon.name)
            sink.pubkeys.append(pubkey)
        self.broker_node = first_node + daemon_count
        sink.node_names.append(f"broker-{self.mesh}")
        sink.pubkeys.append(None)
        self.seqs = [0] * (daemon_count + 1)
        self.event_ids = [0] * (daemon_count + 1)
        self.inbox_seqs = [0] * (daemon_count + 1)
        self.last_ts = [0] * (daemon_count + 1)
        self.node_bucket = [zlib.crc32(name.encode()) % self.buckets for name in sink.node_names[first_node:]]
        # topics: subscribers of topic j are the daemons i with (i + j) % 2 == 0
        self.topics = [f"t{j}" for j in range(4)]
        self.subscribers = [tuple(i for i in range(daemon_count) if (i + j) % 2 == 0) for j in range(4)]
        # memoised decisions with their codes
        self._transitions: dict[tuple[str, str], tuple[str, int, tuple[str, ...], int, str] | None] = {}
        self._ipc: dict[tuple[str, bool | None], int] = {}
        self._sse = {name: self.codes.code(SSE, (name,)) for name in (
            "message", "outbox_dead", "daemon_disconnect", "daemon_reconnect")}
        # calendar
        self.slots: dict[int, list[tuple[Any, ...]]] = {}
        self.slot_heap: list[int] = []
        self.cur_slot: int | None = None
        self.cur_heap: list[tuple[Any, ...]] = []
        self.counter = 0
        self.emitted = 0
        self.stories = 0
        self.entropy = 0
        self.pending_injections = list(injections)
        self.injections: list[Injection] = []
        self.sse_faults: list[tuple[str, int]] = []  # (kind, node) armed for the next eligible sse_event
        self.hot_posts = hot_posts
        self.hot_started = 0
        rate = daemon_count / params.send_interval_ms * 14.0  # events per ms, roughly
        self.hot_interval = max(1, int(budget / rate / max(1, hot_posts))) if hot_posts else 0

    # --- calendar ---------------------------------------------------------------------------------------------
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
        flush_every = self.p.flush_events
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
                        self.inbox_seqs[local] = value
                        cell[0] = value
                    payload = (recipient, mesh, cmid, bmid, did, inserted, cell[0])
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
        if self.sse_faults and seq > 0 and event_id > 1:
            for k, (fault, fault_node) in enumerate(self.sse_faults):
                if fault_node == node:
                    if fault == "non_monotonic_seq":
                        seq -= 1
                    else:
                        event_id -= 1
                    del self.sse_faults[k]
                    self._realise_sse(fault, node)
                    break
        self.event_ids[local] = max(self.event_ids[local], event_id)
        return seq, (line, event_id, code)

    # --- ids ----------------------------------------------------------------------------------------------------
    def new_id(self, ts: int) -> str:
        self.entropy += 1
        return ulid(ts, (self.index << 48) | self.entropy)

    def bucket(self, cmid: str) -> int:
        return zlib.crc32(f"{self.mesh}\x00{cmid}".encode()) % self.buckets

    # --- payloads -----------------------------------------------------------------------------------------------
    def ipc_code(self, state: str, match: bool | None) -> int:
        key = (state, match)
        code = self._ipc.get(key)
        if code is None:
            table_row, status = self.core.ipc(state, match)
            code = self._ipc[key] = self.codes.code(IPC, (state, match, table_row, status))
        return code

    def decide(self, state: str, event: str) -> tuple[str, int, tuple[str, ...], int, str] | None:
        """(to, attempts delta, io effects, code, table_row) of ``event`` on a row in ``state``; None if ignored."""
        key = (state, event)
        if key in self._transitions:
            return self._transitions[key]
        decided = self.core.transition(state, event)
        found = None
        if decided is not None:
            table_row, to, delta, effects = decided
            found = (to, delta, effects, self.codes.code(OT, (state, to, event, table_row)), table_row)
        self._transitions[key] = found
        return found

    def ot_code(self, from_state: str, to_state: str, event: str, table_row: str) -> int:
        return self.codes.code(OT, (from_state, to_state, event, table_row))

    # --- daemon-level events --------------------------------------------------------------------------------
    def _outage_events(self, daemon: Daemon) -> Callable[[int, int, int], None]:
        def on_new(start: int, end: int, kind: int) -> None:
            if kind == LINK:
                bucket = self.node_bucket[daemon.index]
                self.push(start, SSE, daemon.node, bucket, self._sse["daemon_disconnect"])
                self.push(end, SSE, daemon.node, bucket, self._sse["daemon_reconnect"])
        return on_new

    def transition(self, daemon: Daemon, row: Row, t: int, event: str, superseded_by: str | None = None) -> str:
        decided = self.decide(row.state, event)
        if decided is None:
            return row.state
        to, delta, effects, code, _ = decided
        row.state = to
        row.attempts += delta
        row.times.append(t)
        row.states.append(to)
        self.push(t, OT, daemon.node, row.bucket,
                  (self.mesh_i, row.oid, row.cmid, row.fp, code, row.attempts, row.enq, row.max_age_at, row.bmid,
                   superseded_by))
        if "emit_outbox_dead" in effects:
            self.push(t, SSE, daemon.node, self.node_bucket[daemon.index], self._sse["outbox_dead"])
        return to

    def new_row(self, daemon: Daemon, t: int, cmid: str, fp: bytes, max_age_at: int | None = None,
                bucket: int | None = None) -> Row:
        """The accept transition (OB-NONE-ACCEPT) of a new row."""
        max_age_at = t + self.core.max_age_ms if max_age_at is None else max_age_at
        row = Row(self.new_id(t), cmid, fp, t, max_age_at, self.bucket(cmid) if bucket is None else bucket,
                  times=[t], states=["pending"])
        code = self.decide("none", "accept")[3]  # type: ignore[index]
        self.push(t, OT, daemon.node, row.bucket, (self.mesh_i, row.oid, cmid, fp, code, 0, t, max_age_at, None,
                                                   None))
        return row

    def post(self, daemon: Daemon, t: int, cmid: str, fp: bytes, bucket: int, state: str, match: bool | None,
             oid: str | None) -> None:
        """One POST /v1/send reaching the §4.5.1 lookup."""
        self.push(t, IPC, daemon.node, bucket, (self.mesh_i, cmid, fp, self.ipc_code(state, match), oid))

    # --- destinations -------------------------------------------------------------------------------------------
    def destination(self, sender: int) -> Destination:
        rnd = self.rnd
        roll = rnd()
        n = len(self.daemons)
        if rnd() < self.p_bad_destination:
            if roll < 0.5:
                return Destination("topic", "t-missing", (), False, "topic_exists")
            return Destination("dm", f"{self.rng.getrandbits(256):064x}", (), False, "recipient_is_member")
        if roll < 0.6:
            j = int(rnd() * 4)
            return Destination("topic", self.topics[j], tuple(i for i in self.subscribers[j] if i != sender), True)
        if roll < 0.9 and n > 1:
            other = int(rnd() * (n - 1))
            other += other >= sender
            return Destination("dm", self.daemons[other].pubkey, (other,), True)
        consumer = 0 if sender != 0 or n == 1 else 1
        return Destination("queue", "q0", (consumer,), True)

    # --- the broker -----------------------------------------------------------------------------------------------
    def broker_receive(self, daemon: Daemon, row: Row, t: int, dest: Destination, dd: Dedupe, faults: bool
                       ) -> tuple[str, int]:
        """The broker decides one send frame at ``t``; returns the daemon's ack event and the status."""
        rnd = self.rnd
        b1 = "rejected" if faults and rnd() < self.p_b1 else "ok"
        drift = "differs" if faults and rnd() < self.p_drift else "same"
        claim = "theirs" if dd.bmid is not None else "ours"
        fingerprint = "match" if dd.fp is None or dd.fp == row.fp else "mismatch"
        b2 = "ok" if dest.ok else "rejected"
        commit = "failed" if faults and rnd() < self.p_5xx else "ok"
        table_row, phase = self.core.broker(b1, drift, claim, fingerprint, b2, commit)
        bmid = None
        if table_row == "BRK-ACCEPT":
            status, event = 201, "ack_created"
            bmid = self.new_id(t)
            dd.bmid, dd.fp = bmid, row.fp
            self.commit(row.cmid, row.bucket, row.fp, bmid, t, dest)
        elif table_row == "BRK-DUP-MATCH":
            status, bmid = 200, dd.bmid
            event = "ack_duplicate_pruned" if dd.pruned_at is not None and dd.pruned_at <= t else \
                "ack_duplicate_history"
        elif table_row in ("BRK-DUP-MISMATCH", "BRK-DRIFT"):
            status, event = 409, "ack_conflict"
        elif table_row == "BRK-B1-REJECT":
            check = ("rate_limit", "payload_size", "membership")[int(rnd() * 3)]
            status = self.core.check_status("B1", check)
            event = "ack_retry_later" if check == "rate_limit" else "ack_rejected"  # a rate limit is transient (E-42)
        elif table_row == "BRK-B2-REJECT":
            status, event = self.core.check_status("B2", dest.b2_check or "topic_exists"), "ack_rejected"
        else:
            status, event = 503, "ack_failed"
        self.decision(t, row.cmid, row.bucket, row.fp, table_row, phase, status, bmid, daemon.node)
        if table_row == "BRK-ACCEPT" and dest.ref == "t3":
            dd.pruned_at = t + HISTORY_RETENTION_MS
            self.push(dd.pruned_at, HP, self.broker_node, row.bucket, (self.mesh_i, bmid, row.cmid))
        return event, status

    def decision(self, t: int, cmid: str, bucket: int, fp: bytes, table_row: str, phase: str, status: int,
                 bmid: str | None, member: int) -> None:
        """An accept_decision; ``member`` is the sending daemon's node id (its key is written)."""
        code = self.codes.code(AD, (table_row, phase, status))
        self.push(t, AD, self.broker_node, bucket, (self.mesh_i, cmid, fp, code, bmid, member))

    def commit(self, cmid: str, bucket: int, fp: bytes, bmid: str, t: int, dest: Destination, history: int = 1,
               deliver: bool = True) -> None:
        n = len(dest.recipients) if deliver else 0
        code = self.codes.code(AC, (dest.kind, 1, 1, history, n, n))
        self.push(t, AC, self.broker_node, bucket, (self.mesh_i, cmid, bmid, fp, code, dest.ref))
        if deliver:
            for recipient in dest.recipients:
                self.deliver(recipient, bmid, cmid, bucket, t)

    def deliver(self, r: int, bmid: str, cmid: str, bucket: int, t: int, mode: str = "") -> str:
        """Deliver one message to daemon ``r`` until it acks; ``mode`` plays an injected fault instead."""
        recipient = self.daemons[r]
        outages = recipient.outages
        rnd = self.rnd
        push = self.push
        mesh, node = self.mesh_i, recipient.node
        did = f"{bmid}.{r}"
        attempt = 1
        t += 1 + int(rnd() * 4)
        cell: list[Any] | None = None
        broker = self.broker_node
        faults = not mode
        p_push_lost, p_ack_lost = self.p_push_lost, self.p_client_ack_lost
        while True:
            lease = t + (FORCED_LEASE_MS if mode else min(LEASE_MS << min(attempt - 1, 10), LEASE_MAX_MS))
            push(t, DL, broker, bucket, (mesh, bmid, cmid, node, did, attempt, lease))
            t_insert = t + 1 + int(rnd() * 4)
            if (faults and rnd() < p_push_lost) or outages.covering(t_insert) >= 0:
                t, attempt = lease, attempt + 1
                continue
            first = cell is None or (mode == "duplicate_inbox_row" and attempt == 2)
            if first:
                cell = [None]
                push(t_insert, SSE, node, self.node_bucket[r], self._sse["message"])
            push(t_insert, INBOX, node, bucket, (node, mesh, cmid, bmid, did, first, cell))
            if mode == "unacked_delivery":
                return did
            t_ack = t_insert + 1 + int(rnd() * 4)
            lost = (faults and rnd() < p_ack_lost) or (mode == "duplicate_inbox_row" and attempt == 1)
            if lost or outages.first_between(t_insert, t_ack) >= 0:
                t, attempt = lease, attempt + 1
                continue
            push(t_ack, DA, broker, bucket, (mesh, bmid, cmid, node, did))
            return did

    # --- stories ------------------------------------------------------------------------------------------------
    def start_send(self, daemon: Daemon, t0: int) -> None:
        """A client posts a new send to ``daemon`` at ``t0``."""
        self.stories += 1
        daemon.sends += 1
        if self.pending_injections and self.stories > 10 and self._try_injection(daemon, t0):
            return
        if self.hot_started < (2 if self.hot_posts else 0) and self.stories > 4 and self._try_hot(daemon, t0):
            return
        cmid = f"{daemon.short}-{daemon.sends:x}"
        dest = self.destination(daemon.index)
        self.play(daemon, t0, cmid, dest, Dedupe(), f"{cmid}:0", dups=True)

    def play(self, daemon: Daemon, t0: int, cmid: str, dest: Destination, dd: Dedupe, body: str, dups: bool,
             depth: int = 0) -> Row:
        """POST, accept and the row's whole lifecycle; returns the row (its timeline filled)."""
        fp = self.core.fingerprint(dest.kind, dest.ref, body)
        bucket = self.bucket(cmid)
        self.post(daemon, t0, cmid, fp, bucket, "none", None, None)
        row = self.new_row(daemon, t0, cmid, fp, bucket=bucket)
        self.run_row(daemon, row, t0 + 1 + int(self.rnd() * 20), dest, dd, depth)
        if dups and self.rnd() < self.p_dup_post:
            self.duplicate_posts(daemon, row, dest, t0)
        return row

    def run_row(self, daemon: Daemon, row: Row, t: int, dest: Destination, dd: Dedupe, depth: int) -> None:
        rnd = self.rnd
        core = self.core
        outages = daemon.outages
        transition = self.transition
        while True:
            t = outages.online(t)
            if t > row.max_age_at:
                transition(daemon, row, t, "max_age_exceeded")
                self.after_dead(daemon, row, t, dest, depth)
                return
            transition(daemon, row, t, "dispatch")
            t_broker = t + 1 + int(rnd() * 8)
            t_ack = t_broker + 1 + int(rnd() * 8)
            cut = outages.first_between(t, t_ack)
            decided = (cut < 0 or outages.starts[cut] > t_broker) and rnd() >= self.p_frame_lost
            event = ""
            if decided:
                event, _ = self.broker_receive(daemon, row, t_broker, dest, dd, True)
            lost = not decided or rnd() < self.p_ack_lost
            if cut < 0 and lost:
                t_timeout = t + ACK_TIMEOUT_MS
                cut = outages.first_between(t_ack, t_timeout)
                if cut < 0:
                    transition(daemon, row, t_timeout, "ack_timeout")
                    if decided and rnd() < self.p_late_ack:
                        t_late = t_timeout + 1 + int(rnd() * 400)
                        if event in SUCCESS:
                            row.bmid = dd.bmid
                        if outages.covering(t_late) < 0 and transition(daemon, row, t_late, event) in (
                                "done", "dead"):
                            self._settled(daemon, row, t_late, dd, dest, depth)
                            return
                    t = t_timeout + core.backoff(row.attempts, rnd() * 2 - 1)
                    continue
            if cut >= 0:
                start, end = outages.starts[cut], outages.ends[cut]
                if outages.kinds[cut] == CRASH:
                    transition(daemon, row, end, "crash_recovery")
                    t = end + core.policy.retry_base_ms
                else:
                    transition(daemon, row, start, "link_lost")
                    t = max(end + 1, start + core.backoff(row.attempts, rnd() * 2 - 1))
                continue
            if event in SUCCESS:
                row.bmid = dd.bmid
            to = transition(daemon, row, t_ack, event)
            if to == "pending":
                t = t_ack + core.backoff(row.attempts, rnd() * 2 - 1)
                if depth < MAX_REQUEUES and rnd() < self.p_requeue_pending:
                    t_req = outages.up(t_ack + (t - t_ack) // 2)
                    if t_req < t and row.state == "pending":
                        self.requeue(daemon, row, t_req, dest, depth)
                        return
                continue
            self._settled(daemon, row, t_ack, dd, dest, depth)
            return

    def _settled(self, daemon: Daemon, row: Row, t: int, dd: Dedupe, dest: Destination, depth: int) -> None:
        if row.state == "done":
            if depth == 0 and dd.bmid is not None and self.rnd() < self.p_collision and len(self.daemons) > 1:
                self.later(t + 30_000 + int(self.rnd() * 60_000),
                           lambda ts: self.collide(ts, daemon.index, row.cmid, dd, dest))
        elif row.state == "dead":
            self.after_dead(daemon, row, t, dest, depth)

    def after_dead(self, daemon: Daemon, row: Row, t: int, dest: Destination, depth: int) -> None:
        if depth < MAX_REQUEUES and self.rnd() < self.p_requeue_dead:
            self.requeue(daemon, row, daemon.outages.up(t + 5_000 + int(self.rnd() * 55_000)), dest, depth)

    def requeue(self, daemon: Daemon, row: Row, t: int, dest: Destination, depth: int,
                new_cmid: str | None = None) -> Row:
        """Operator requeue (§4.5.3): the row goes aborted, a successor with a fresh id starts pending."""
        daemon.requeues += 1
        cmid = new_cmid or f"{row.cmid}.r{daemon.requeues:x}"
        successor_oid = self.new_id(t)
        table_row = self.decide(row.state, "requeue")[4]  # type: ignore[index]
        self.transition(daemon, row, t, "requeue", superseded_by=successor_oid)
        successor = Row(successor_oid, cmid, row.fp, t, t + self.core.max_age_ms, self.bucket(cmid), times=[t],
                        states=["pending"])
        self.push(t, OT, daemon.node, successor.bucket,
                  (self.mesh_i, successor_oid, cmid, row.fp, self.ot_code("none", "pending", "requeue", table_row),
                   0, t, successor.max_age_at, None, None))
        if new_cmid is None:
            self.run_row(daemon, successor, t + 1 + int(self.rnd() * 20), dest, Dedupe(), depth + 1)
        return successor

    def collide(self, t: int, original: int, cmid: str, dd: Dedupe, dest: Destination) -> None:
        """Another daemon of the mesh sends with an id the broker already holds (same or different body)."""
        others = [d for d in self.daemons if d.index != original and d.outages.up(t) == t]
        if not others:
            return
        daemon = others[int(self.rnd() * len(others))]
        same = self.rnd() < 0.3
        body = f"{cmid}:0" if same else f"{cmid}:collision"
        self.play(daemon, t, cmid, dest, dd, body, dups=False, depth=MAX_REQUEUES)

    @staticmethod
    def state_at(row: Row, t: int) -> str:
        return row.states[bisect.bisect_right(row.times, t) - 1]

    def duplicate_posts(self, daemon: Daemon, row: Row, dest: Destination, t0: int) -> None:
        rnd = self.rnd
        other_fp: bytes | None = None
        count = 1
        while rnd() < 0.5 and count < 8:
            count += 1
        horizon = max(row.times[-1] + 5_000, t0 + 3_000)
        for _ in range(count):
            t = t0 + 1 + (int(rnd() * 3_000) if rnd() < 0.7 else int(rnd() * (horizon - t0)))
            if daemon.outages.up(t) != t:
                continue
            match = rnd() < 0.85
            if not match and other_fp is None:
                other_fp = self.core.fingerprint(dest.kind, dest.ref, f"{row.cmid}:other")
            self.post(daemon, t, row.cmid, row.fp if match else other_fp, row.bucket,  # type: ignore[arg-type]
                      self.state_at(row, t), match, row.oid)

    # --- hot keys: a client re-posting one id in a tight loop -------------------------------------------------
    def _try_hot(self, daemon: Daemon, t0: int) -> bool:
        dest = Destination("queue", "q0", (), True)
        if not daemon.outages.online_through(t0, t0 + 100):
            return False
        self.hot_started += 1
        cmid = f"{daemon.short}-hot{self.hot_started}"
        row = self.happy(daemon, t0, cmid, dest)
        other = self.core.fingerprint(dest.kind, dest.ref, f"{cmid}:other")
        remaining = [self.hot_posts]

        def hammer(ts: int) -> None:
            t = ts
            for _ in range(min(256, remaining[0])):
                t += self.hot_interval
                if daemon.outages.up(t) != t:
                    continue
                match = self.rnd() < 0.9
                self.post(daemon, t, cmid, row.fp if match else other, row.bucket, self.state_at(row, t), match,
                          row.oid)
            remaining[0] -= 256
            if remaining[0] > 0:
                self.later(t + 1, hammer)

        self.later(row.times[-1] + 1, hammer)
        return True

    # --- injections -----------------------------------------------------------------------------------------
    def happy(self, daemon: Daemon, t0: int, cmid: str, dest: Destination, inject: str = "") -> Row:
        """The fault-free path of one send, with ``inject`` played into it."""
        core = self.core
        fp = core.fingerprint(dest.kind, dest.ref, f"{cmid}:0")
        bucket = self.bucket(cmid)
        self.post(daemon, t0, cmid, fp, bucket, "none", None, None)
        row = self.new_row(daemon, t0, cmid, fp, t0 + 1 if inject == "max_age_violated" else None, bucket)
        t = t0 + 5
        self.transition(daemon, row, t, "dispatch")
        t_broker = t + 3
        dd = Dedupe()
        if inject == "id_freed":
            event, _ = self.broker_receive(daemon, row, t_broker, dest, dd, False)
            self.transition(daemon, row, t_broker + 3, event)
            self.requeue(daemon, row, t_broker + 1_000, dest, MAX_REQUEUES, new_cmid=row.cmid)
            return row
        table_row, phase = core.broker("ok", "same", "ours", "match", "ok", "ok")
        bmid = dd.bmid = self.new_id(t_broker)
        dd.fp = fp
        self.commit(cmid, bucket, fp, bmid, t_broker, dest, 0 if inject == "missing_side_effect" else 1,
                    deliver=False)
        self.decision(t_broker, cmid, bucket, fp, table_row, phase, 201, bmid, daemon.node)
        for k, recipient in enumerate(dest.recipients):
            mode = inject if k == 0 and inject in ("unacked_delivery", "duplicate_inbox_row") else ""
            did = self.deliver(recipient, bmid, cmid, bucket, t_broker, mode)
            if mode == "unacked_delivery":
                self._record("unacked_delivery", {"mesh": self.mesh, "delivery_id": did},
                             needs_ts=t_broker + 20 + FORCED_LEASE_MS + self.p.redelivery_grace_ms,
                             needs_node=self.broker_node)
            elif mode == "duplicate_inbox_row":
                self._record(mode, {"recipient": self.daemons[recipient].pubkey, "client_message_id": cmid},
                             needs_ts=t_broker + FORCED_LEASE_MS + 100)
        t_ack = t_broker + 3
        row.bmid = bmid
        if inject == "done_without_message":
            row.bmid = self.new_id(t_ack)
        if inject == "fingerprint_changed":
            row.fp = core.fingerprint(dest.kind, dest.ref, f"{cmid}:changed")
        self.transition(daemon, row, t_ack, "ack_created")
        if inject == "illegal_transition":
            failed = self.decide("inflight", "ack_failed")[4]  # type: ignore[index]
            self.push(t_ack + 1_000, OT, daemon.node, bucket,
                      (self.mesh_i, row.oid, cmid, fp, self.ot_code("inflight", "pending", "ack_failed", failed),
                       row.attempts, row.enq, row.max_age_at, row.bmid, None))
        elif inject == "ipc_decision_inconsistent":
            self.post(daemon, t_ack + 500, cmid, fp, bucket, "pending", True, row.oid)
        elif inject == "duplicate_broker_message":
            t_dup = t_ack + 2_000
            other = self.new_id(t_dup)
            self.commit(cmid, bucket, fp, other, t_dup, dest, deliver=False)
            self.decision(t_dup, cmid, bucket, fp, table_row, phase, 201, other, daemon.node)
        elif inject == "delivery_uncommitted":
            t_dl = t_ack + 1_000
            phantom = self.new_id(t_dl)
            recipient = self.daemons[dest.recipients[0]]
            did = f"{phantom}.{recipient.index}"
            self.push(t_dl, DL, self.broker_node, bucket,
                      (self.mesh_i, phantom, cmid, recipient.node, did, 1, t_dl + LEASE_MS))
            self.push(t_dl + 3, DA, self.broker_node, bucket, (self.mesh_i, phantom, cmid, recipient.node, did))
        return row

    def _record(self, kind: str, key: dict[str, str], needs_ts: int = 0, needs_node: int | None = None) -> None:
        self.injections.append(Injection(kind, INJECTIONS[kind], key, needs_ts, needs_node))

    def _realise_sse(self, kind: str, node: int) -> None:
        for injection in self.injections:
            if injection.kind == kind and injection.needs_ts < 0 and injection.key["node"] == \
                    self.sink.node_names[node]:
                injection.realised = True

    def _try_injection(self, daemon: Daemon, t0: int) -> bool:
        kind = self.pending_injections[0]
        if kind in ("non_monotonic_seq", "non_monotonic_event_id"):
            self.pending_injections.pop(0)
            self.sse_faults.append((kind, daemon.node))
            self.injections.append(Injection(kind, INJECTIONS[kind], {"node": daemon.name}, needs_ts=-1))
            return False
        if kind == "id_freed":
            dest = Destination("topic", "t-missing", (), False, "topic_exists")
        else:
            j = max(range(4), key=lambda j: sum(i != daemon.index for i in self.subscribers[j]))
            dest = Destination("topic", self.topics[j],
                               tuple(i for i in self.subscribers[j] if i != daemon.index), True)
            if not dest.recipients and kind in ("unacked_delivery", "duplicate_inbox_row", "delivery_uncommitted"):
                return False
        window = t0 + 8_000
        if not daemon.outages.online_through(t0, window) or not all(
                self.daemons[r].outages.online_through(t0, window) for r in dest.recipients):
            return False
        self.pending_injections.pop(0)
        cmid = f"{daemon.short}-{daemon.sends:x}"
        row = self.happy(daemon, t0, cmid, dest, kind)
        end = t0 + 5_000
        if kind in ("illegal_transition", "fingerprint_changed", "max_age_violated"):
            self._record(kind, {"node": daemon.name, "outbox_id": row.oid}, end)
        elif kind in ("ipc_decision_inconsistent", "id_freed"):
            self._record(kind, {"node": daemon.name, "client_message_id": cmid}, end)
        elif kind in ("duplicate_broker_message", "missing_side_effect", "done_without_message",
                      "delivery_uncommitted"):
            self._record(kind, {"mesh": self.mesh, "client_message_id": cmid}, end)
        return True

    # --- the main loop --------------------------------------------------------------------------------------
    def run(self) -> None:
        sends: list[tuple[int, int]] = []
        interval = self.p.send_interval_ms
        for d in self.daemons:
            heapq.heappush(sends, (T0_MS + int(self.rnd() * interval), d.index))
        spent = False
        expovariate = self.rng.expovariate
        while sends and self.stories < self.story_budget:
            t, d = heapq.heappop(sends)
            for other in self.daemons:  # outages (and their SSE events) are drawn before the calendar passes them
                other.outages.covering(t)
            if not self.advance(t >> SLOT_SHIFT):
                spent = True
                break
            daemon = self.daemons[d]
            up = daemon.outages.up(t)
            if up != t:
                heapq.heappush(sends, (up + int(self.rnd() * interval), d))
                continue
            self.start_send(daemon, t)
            heapq.heappush(sends, (t + 1 + int(expovariate(1.0 / interval)), d))
        if not spent:
            self.advance(1 << 62)
        for kind in self.pending_injections:
            self.injections.append(Injection(kind, INJECTIONS[kind], {}, needs_ts=-1))
        for injection in self.injections:
            if injection.needs_ts >= 0:
                last = max(self.last_ts) if injection.needs_node is None else \
                    self.last_ts[injection.needs_node - self.base_node]
                injection.realised = last > injection.needs_ts


# --- workers and the entry point --------------------------------------------------------------------------------

def _split(total: int, weights: Sequence[int]) -> list[int]:
    whole = sum(weights)
    shares = [total * w // whole for w in weights]
    for k in range(total - sum(shares)):
        shares[k % len(shares)] += 1
    return shares


def _plan(p: Params) -> list[dict[str, Any]]:
    meshes = p.meshes()
    sizes = [min(p.mesh_size, p.daemons - m * p.mesh_size) for m in range(meshes)]
    budgets = _split(p.events, sizes)
    stories = _split(p.keys if p.keys is not None else p.events, sizes)
    injections: list[list[str]] = [[] for _ in range(meshes)]
    for k, kind in enumerate(p.inject):
        injections[k % meshes].append(kind)
    hot = int(p.hot_fraction * p.events / 2)
    return [{"index": m, "daemons": sizes[m], "budget": budgets[m], "stories": stories[m],
             "injections": injections[m], "hot_posts": hot if m == 0 and hot >= 16 else 0} for m in range(meshes)]


def _run_worker(args: tuple[Params, str, int, list[dict[str, Any]]]) -> dict[str, Any]:
    params, root, worker, plans = args
    collecting = gc.isenabled()
    gc.disable()  # millions of live tuples and no reference cycles worth collecting: the scans only cost time
    try:
        return _simulate(params, root, worker, plans)
    finally:
        if collecting:
            gc.enable()


def _simulate(params: Params, root: str, worker: int, plans: list[dict[str, Any]]) -> dict[str, Any]:
    sink = Sink(Path(root), params.buckets, worker, Codes())
    core = Core()
    injections: list[dict[str, Any]] = []
    events = 0
    for plan in plans:
        sim = MeshSim(params, plan["index"], plan["daemons"], plan["budget"], plan["stories"], plan["injections"],
                      plan["hot_posts"], sink, core)
        sim.run()
        events += sim.emitted
        for injection in sim.injections:
            injections.append({"kind": injection.kind, "invariant": injection.invariant, "key": injection.key,
                               "realised": injection.realised, "mesh": plan["index"]})
    sink.close()
    return {"events": events, "by_kind": sink.by_kind, "injections": injections, "written": sink.written}


def generate(out: Path, params: Params, workers: int | None = None,
             progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Generate a trace into ``out`` (``out/events/bucket=NN/*.parquet`` and ``out/manifest.json``)."""
    unknown = [k for k in params.inject if k not in INJECTIONS]
    if unknown:
        raise ValueError(f"unknown injection kind(s) {unknown}; known: {', '.join(INJECTIONS)}")
    started = time.monotonic()
    root = out / "events"
    if root.exists() and any(root.rglob("*.parquet")):
        raise FileExistsError(f"{root} already holds a trace")
    root.mkdir(parents=True, exist_ok=True)
    plans = _plan(params)
    workers = max(1, min(workers or os.cpu_count() or 1, len(plans)))
    jobs = [(params, str(root), w, [plan for plan in plans if plan["index"] % workers == w]) for w in range(workers)]
    if workers == 1:
        results = [_run_worker(jobs[0])]
    else:
        context = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn")
        with context.Pool(workers) as pool:
            results = pool.map(_run_worker, jobs)
    by_kind = [sum(r["by_kind"][k] for r in results) for k in range(len(KIND_NAMES))]
    injections = sorted((i for r in results for i in r["injections"]), key=lambda i: (i["mesh"], i["kind"]))
    manifest = {
        "format": "meshtrace/1",
        "params": params.as_dict(),
        "workers": workers,
        "events": sum(r["events"] for r in results),
        "by_kind": dict(zip(KIND_NAMES, by_kind, strict=True)),
        "sources": sorted({"daemon"} | ({"broker"} if any(by_kind[AD:]) else set())),
        "meshes": len(plans),
        "buckets": params.buckets,
        "injections": [i for i in injections if i["realised"]],
        "dropped_injections": [i for i in injections if not i["realised"]],
        "seconds": round(time.monotonic() - started, 3),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if progress is not None:
        progress(f"{manifest['events']} events in {manifest['seconds']} s")
    return manifest
