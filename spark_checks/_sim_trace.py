"""The generator's trace encoding: events as compact tuples in memory, the flat Parquet layout on disk.

Rules of this file. The simulation hands over one event as ``(seq, ts_ms, node, payload)``: ``node`` indexes the
sink's node names, and ``payload`` is the kind's members after (seq, ts_ms, node) in the order ``LAYOUT`` gives. A
``mesh`` member is an index into the sink's mesh names, a ``pubkey:NAME`` member is a node index whose member key
is written as ``NAME``, and a tuple of names is one ``code`` member: an index into ``Codes``, the registry of that
kind's value combinations (categorical members travel as one small integer and become strings at flush time).
Events are buffered per (kind, bucket) and flushed as one row group per bucket, so memory stays bounded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .catalogue import KINDS
from .format import FLAT_SCHEMA

IPC, OT, INBOX, SSE, HE, HR, AD, AC, DL, DA, HP = range(len(KINDS))
KIND_NAMES = KINDS

LAYOUT: dict[int, tuple[str | tuple[str, ...], ...]] = {
    IPC: ("mesh", "client_message_id", "request_fingerprint",
          ("row_state", "fingerprint_match", "table_row", "http_status"), "outbox_id"),
    OT: ("mesh", "outbox_id", "client_message_id", "request_fingerprint", ("from_state", "to_state", "event",
         "table_row"), "attempts", "enqueued_at_ms", "max_age_at_ms", "broker_message_id", "superseded_by"),
    INBOX: ("pubkey:recipient", "mesh", "client_message_id", "broker_message_id", "delivery_id", "inserted",
            "inbox_seq"),
    SSE: ("line", "event_id", ("event",)),
    HE: ("mesh", "client_message_id", "broker_message_id", "inbox_seq", ("hook",)),
    HR: ("mesh", "client_message_id", "inbox_seq", ("hook", "to_state", "claims", "http_status"),
         "reply_client_message_id"),
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
              "destination_kind", "destination_ref", "member", "recipient", "hook"]


def _const(value: Any, kind: pa.DataType, n: int) -> pa.Array:
    return pa.array([value], kind).take(pa.array(np.zeros(n, dtype=np.int32)))


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
            # absolute: Arrow reads a relative name whose first part holds ':' (d:1/...) as a URI
            writer = self.writers[bucket] = pq.ParquetWriter(str(path.absolute()), FLAT_SCHEMA, compression="zstd",
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
