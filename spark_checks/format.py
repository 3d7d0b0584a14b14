"""The trace formats: JSONL as the reference processes write it, and the flat Parquet layout used at scale.

Mapping (documented in spark_checks/README.md):

* One Parquet row per event; one column per trace member, named as in spec/schemas/trace, except ``from`` ->
  ``from_state``, ``to`` -> ``to_state`` and ``effects.{dedupe,message,history,delivery}`` ->
  ``effects_{dedupe,...}``. ``event`` holds the outbox event of an outbox_transition and the SSE event name of an
  sse_event. A member a kind does not have is null; a JSON null is null.
* ``request_fingerprint`` is 64 lowercase hex characters in JSON and 32 raw bytes (fixed_size_binary(32)) in Parquet.
* ``line`` exists only in Parquet: the event's 0-based position in its node's JSONL stream (the node's files in path
  order, blank and unparsable lines not counted). The generator writes ``line == seq`` unless it injects a seq fault.
* Datasets are Hive-partitioned by ``bucket`` (``<root>/bucket=NN/*.parquet``): ``bucket_of(mesh, client_message_id,
  node)``. Every per-subject invariant's subject lives in one bucket, so a single process can check a large dataset one
  bucket at a time.

A generated trace directory holds ``events/`` (the dataset) and ``manifest.json``.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .catalogue import BROKER_KINDS, DAEMON_KINDS

DEFAULT_BUCKETS = 16

FLAT_SCHEMA = pa.schema([
    ("v", pa.int8()),
    ("source", pa.string()),
    ("node", pa.string()),
    ("seq", pa.int64()),
    ("line", pa.int64()),
    ("ts_ms", pa.int64()),
    ("kind", pa.string()),
    ("mesh", pa.string()),
    ("client_message_id", pa.string()),
    ("outbox_id", pa.string()),
    ("request_fingerprint", pa.binary(32)),
    ("broker_message_id", pa.string()),
    ("from_state", pa.string()),
    ("to_state", pa.string()),
    ("event", pa.string()),
    ("table_row", pa.string()),
    ("attempts", pa.int32()),
    ("enqueued_at_ms", pa.int64()),
    ("max_age_at_ms", pa.int64()),
    ("superseded_by", pa.string()),
    ("row_state", pa.string()),
    ("fingerprint_match", pa.bool_()),
    ("http_status", pa.int32()),
    ("phase", pa.string()),
    ("status", pa.int32()),
    ("member", pa.string()),
    ("destination_kind", pa.string()),
    ("destination_ref", pa.string()),
    ("effects_dedupe", pa.int32()),
    ("effects_message", pa.int32()),
    ("effects_history", pa.int32()),
    ("effects_delivery", pa.int32()),
    ("recipients", pa.int32()),
    ("recipient", pa.string()),
    ("delivery_id", pa.string()),
    ("attempt", pa.int32()),
    ("lease_until_ms", pa.int64()),
    ("inserted", pa.bool_()),
    ("inbox_seq", pa.int64()),
    ("event_id", pa.int64()),
])
COLUMNS: tuple[str, ...] = tuple(FLAT_SCHEMA.names)
RENAMED = {"from": "from_state", "to": "to_state"}
EFFECTS = ("dedupe", "message", "history", "delivery")
SOURCE_OF = {**{k: "daemon" for k in DAEMON_KINDS}, **{k: "broker" for k in BROKER_KINDS}}


def _members_by_kind() -> dict[str, tuple[str, ...]]:
    """Each kind's JSON members in schema order (spec/schemas/trace/<kind>.json ``required``)."""
    from spec import SPEC_DIR, load_json

    return {kind: tuple(load_json(SPEC_DIR / "schemas" / "trace" / f"{kind}.json")["required"])
            for kind in SOURCE_OF}


_MEMBERS: dict[str, tuple[str, ...]] | None = None


def members(kind: str) -> tuple[str, ...]:
    """The JSON members of ``kind``, in the order the schema lists them."""
    global _MEMBERS
    if _MEMBERS is None:
        _MEMBERS = _members_by_kind()
    return _MEMBERS[kind]


def bucket_of(mesh: str | None, client_message_id: str | None, node: str, buckets: int) -> int:
    """The dataset partition of an event: crc32 of ``mesh \\0 client_message_id``, or of ``node`` without an id."""
    text = f"{mesh}\x00{client_message_id}" if client_message_id is not None else node
    return zlib.crc32(text.encode("utf-8")) % buckets


# --- JSON <-> flat rows ---------------------------------------------------------------------------------------

def event_to_row(event: dict[str, Any], line: int) -> dict[str, Any]:
    """One JSON event as a flat row (every column present)."""
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    for name, value in event.items():
        if name == "effects":
            for effect in EFFECTS:
                row[f"effects_{effect}"] = (value or {}).get(effect)
        elif name == "request_fingerprint":
            row[name] = None if value is None else bytes.fromhex(value)
        else:
            column = RENAMED.get(name, name)
            if column in row:
                row[column] = value
    row["line"] = line
    return row


def row_to_event(row: dict[str, Any]) -> dict[str, Any]:
    """A flat row back to its JSON event (the kind's members only, in schema order)."""
    event: dict[str, Any] = {}
    for name in members(row["kind"]):
        if name == "effects":
            event[name] = {effect: row[f"effects_{effect}"] for effect in EFFECTS}
        elif name == "request_fingerprint":
            value = row[name]
            event[name] = None if value is None else bytes(value).hex()
        else:
            event[name] = row[RENAMED.get(name, name)]
    return event


# --- JSONL ------------------------------------------------------------------------------------------------------

def jsonl_files(paths: Iterable[Path]) -> list[Path]:
    """The ``*.jsonl`` files named by ``paths`` (files, or directories searched recursively), sorted."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(path.rglob("*.jsonl"))
        else:
            found.append(path)
    return sorted(set(found))


def read_jsonl(paths: Iterable[Path]) -> tuple[list[dict[str, Any]], list[str]]:
    """Every event of the JSONL files as flat rows with ``line`` set, and the lines skipped (file:line: why).

    ``line`` counts the parsed events of each node across its files in path order. A line that is not a JSON object
    with a ``node`` (e.g. torn by a kill -9 mid-write) is skipped and reported.
    """
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    lines: dict[str, int] = {}
    for path in jsonl_files(paths):
        with path.open(encoding="utf-8") as handle:
            for number, text in enumerate(handle, start=1):
                if not text.strip():
                    continue
                try:
                    event = json.loads(text)
                    node = event["node"]
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    skipped.append(f"{path}:{number}: {type(exc).__name__}")
                    continue
                line = lines.get(node, 0)
                lines[node] = line + 1
                rows.append(event_to_row(event, line))
    return rows, skipped


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Flat rows to an Arrow table with ``FLAT_SCHEMA``."""
    return pa.Table.from_pylist(rows, schema=FLAT_SCHEMA)


def write_dataset(table: pa.Table, root: Path, buckets: int = DEFAULT_BUCKETS, prefix: str = "part") -> None:
    """Write ``table`` as the bucket-partitioned dataset at ``root`` (one file per bucket)."""
    columns = table.to_pydict()
    bucket_ids = [bucket_of(m, c, n, buckets) for m, c, n in
                  zip(columns["mesh"], columns["client_message_id"], columns["node"], strict=True)]
    by_bucket: dict[int, list[int]] = {}
    for index, bucket in enumerate(bucket_ids):
        by_bucket.setdefault(bucket, []).append(index)
    for bucket, indices in sorted(by_bucket.items()):
        directory = root / f"bucket={bucket:02d}"
        directory.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.take(pa.array(indices)), directory / f"{prefix}-0.parquet", compression="zstd")


def convert_jsonl(paths: Iterable[Path], root: Path, buckets: int = DEFAULT_BUCKETS) -> tuple[int, list[str]]:
    """Convert JSONL trace files into a Parquet dataset at ``root``; returns (events, skipped lines)."""
    rows, skipped = read_jsonl(paths)
    write_dataset(rows_to_table(rows), root, buckets)
    return len(rows), skipped


def write_jsonl(root: Path, out: Path) -> int:
    """Write a Parquet dataset as JSONL, one ``<source>-<node>.jsonl`` per node in line order; returns events.

    Holds the dataset in memory: meant for small traces (tests, inspection).
    """
    table = pq.read_table(dataset_path(root), schema=FLAT_SCHEMA)
    out.mkdir(parents=True, exist_ok=True)
    by_node: dict[str, list[dict[str, Any]]] = {}
    for row in table.to_pylist():
        by_node.setdefault(row["node"], []).append(row)
    for node, rows in by_node.items():
        rows.sort(key=lambda r: r["line"])
        name = f"{rows[0]['source']}-{node.replace(':', '_').replace('/', '_')}.jsonl"
        with (out / name).open("w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row_to_event(row), separators=(",", ":"), ensure_ascii=False) + "\n")
    return table.num_rows


# --- datasets ---------------------------------------------------------------------------------------------------

def dataset_path(path: Path) -> Path:
    """The Parquet dataset inside a trace directory (``<dir>/events``) or ``path`` itself."""
    return path / "events" if (path / "events").is_dir() else path


def is_jsonl(paths: Iterable[Path]) -> bool:
    """True when ``paths`` name JSONL files (or directories holding them) rather than a Parquet dataset."""
    paths = list(paths)
    if any(p.is_file() and p.suffix == ".jsonl" for p in paths):
        return True
    return any(p.is_dir() and not any(dataset_path(p).rglob("*.parquet")) and any(p.rglob("*.jsonl"))
               for p in paths)


def bucket_dirs(root: Path) -> list[Path]:
    """The ``bucket=NN`` directories of a dataset (or ``[root]`` when it is not partitioned)."""
    root = dataset_path(root)
    found = sorted(p for p in root.glob("bucket=*") if p.is_dir())
    return found or [root]


def parquet_files(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.parquet"))


def read_bucket(directory: Path, columns: list[str] | None = None) -> pa.Table:
    """Every event of one bucket directory (all its files) as one table."""
    files = parquet_files(directory)
    if not files:
        return FLAT_SCHEMA.empty_table() if columns is None else pa.schema(
            [FLAT_SCHEMA.field(c) for c in columns]).empty_table()
    tables = [pq.read_table(f, columns=columns) for f in files]
    return pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]


def iter_rows(table: pa.Table) -> Iterator[dict[str, Any]]:
    """The rows of ``table`` as dicts."""
    yield from table.to_pylist()
