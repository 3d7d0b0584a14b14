"""The trace formats: JSONL as the reference processes write it, and the flat Parquet layout used at scale.

Mapping (documented in spark_checks/README.md):

* One Parquet row per event; one column per trace member, named as in spec/schemas/trace, except ``from`` ->
  ``from_state``, ``to`` -> ``to_state`` and ``effects.{dedupe,message,history,delivery}`` ->
  ``effects_{dedupe,...}``. ``event`` holds the outbox event of an outbox_transition and the SSE event name of an
  sse_event. A member a kind does not have is null; a JSON null is null.
* ``request_fingerprint`` is 64 lowercase hex characters in JSON and 32 raw bytes (fixed_size_binary(32)) in Parquet.
* ``line`` exists only in Parquet: the event's 0-based position in its node's JSONL stream (the node's files in path
  order, invalid lines (``spark_checks.validity``) not counted). The generator writes ``line == seq`` unless it
  injects a seq fault.
* Datasets are Hive-partitioned by ``bucket`` (``<root>/bucket=NN/*.parquet``): ``bucket_of(mesh, client_message_id,
  node)``. Every per-subject invariant's subject lives in one bucket, so a single process can check a large dataset one
  bucket at a time (``split_subjects`` tells when a dataset from elsewhere is not laid out so).

A generated trace directory holds ``events/`` (the dataset) and ``manifest.json``.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .catalogue import BROKER_KINDS, DAEMON_KINDS
from .inputs import JsonlFile

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
    ("hook", pa.string()),
    ("claims", pa.int32()),
    ("reply_client_message_id", pa.string()),
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

def jsonl_files(paths: Iterable[Path | str]) -> list[Path]:
    """The ``*.jsonl`` files named by ``paths`` (files, or directories searched recursively), sorted."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found += sorted(path.rglob("*.jsonl"))
        else:
            found.append(path)
    return sorted(set(found))


#: invalid events listed in a report (all are counted)
INVALID_LISTED = 100


@dataclass
class JsonlRead:
    """The valid events of JSONL files as flat rows (``line`` set, ``file`` and ``file_line`` kept) and the invalid
    lines: ``invalid`` lists the first ``INVALID_LISTED`` in file order, ``invalid_count`` counts them all."""

    rows: list[dict[str, Any]]
    invalid: list[dict[str, Any]]
    reasons: dict[str, int]

    @property
    def invalid_count(self) -> int:
        return sum(self.reasons.values())


def _plain(value: Any) -> Any:
    """``value`` with every ``validity.FloatLiteral`` (a number written with a fraction or exponent, wherever it sits:
    a string member, the kind, inside effects) as a plain float, which the schema validator takes."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return float(value) if isinstance(value, float) and type(value) is not float else value


def schema_problem(event: dict[str, Any]) -> str | None:
    """The jsonschema library's message for an event that is not valid against trace/event.json, or None."""
    from jsonschema.exceptions import best_match

    from spec import fast_validator

    validator = fast_validator("trace/event")
    try:
        error = best_match(validator.iter_errors(event))
    except ValueError:  # a FloatLiteral, which the Rust validator does not take (rare: copied only then)
        event = _plain(event)
        error = best_match(validator.iter_errors(event))
    if error is None:
        return None
    kind = event.get("kind")
    if isinstance(kind, str) and kind in SOURCE_OF:  # name the member of the event's own kind, not the oneOf
        error = best_match(fast_validator(f"trace/{kind}").iter_errors(event)) or error
    where = ".".join(str(p) for p in error.absolute_path) or "event"
    return f"{where}: {error.message}"


def read_jsonl(files: list[Path | str | JsonlFile], listed: int = INVALID_LISTED) -> JsonlRead:
    """Every line of the JSONL files (or of the JSONL files of trace directories, as ``inputs.locate`` finds them:
    raises its ``InputError``), validated
    (``spark_checks.validity``): valid events as flat rows, invalid lines as ``{"where": "<file>:<line>", "reason",
    "message"}``.

    ``line`` counts the valid events of each node across its files in path order; ``file_line`` is the 1-based
    physical line.
    """
    from .validity import parse_line

    rows: list[dict[str, Any]] = []
    invalid: list[dict[str, Any]] = []
    reasons: dict[str, int] = {}
    lines: dict[str, int] = {}
    named = [item for item in files if isinstance(item, JsonlFile)]
    others = [str(item) for item in files if not isinstance(item, JsonlFile)]
    if others:  # the files, names and order `meshtrace check` reads (hidden names skipped, events/ entered)
        from .inputs import LocalFS, locate

        named += locate(others, LocalFS("oracle")).jsonl
    for source in named:
        with open(source.location, "rb") as handle:
            data = handle.read()
        parts = data.split(b"\n")
        if parts[-1] == b"":
            parts.pop()
        for number, raw in enumerate(parts, start=1):
            event, reason, message = parse_line(raw, number < len(parts) or data.endswith(b"\n"), schema_problem)
            if event is None:
                reasons[reason] = reasons.get(reason, 0) + 1
                if len(invalid) < listed:
                    invalid.append({"where": f"{source.display}:{number}", "reason": reason, "message": message})
                continue
            node = event["node"]
            line = lines.get(node, 0)
            lines[node] = line + 1
            row = event_to_row(event, line)
            row["file"], row["file_line"] = source.display, number
            rows.append(row)
    return JsonlRead(rows, invalid, reasons)


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Flat rows to an Arrow table with ``FLAT_SCHEMA`` (other keys, such as ``file``, are left out)."""
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
        pq.write_table(table.take(pa.array(indices)), str((directory / f"{prefix}-0.parquet").absolute()),
                       compression="zstd")  # absolute: Arrow reads a relative d:1/... as a URI


def convert_jsonl(files: list[Path | str | JsonlFile], root: Path, buckets: int = DEFAULT_BUCKETS,
                  tolerate: bool = False) -> JsonlRead:
    """Convert JSONL trace files into a Parquet dataset at ``root``; returns what was read.

    Nothing is written when a line is invalid, unless ``tolerate`` (the invalid lines are then left out).
    """
    read = read_jsonl(files)
    if read.invalid_count == 0 or tolerate:
        write_dataset(rows_to_table(read.rows), root, buckets)
    return read


def write_jsonl(root: Path, out: Path) -> int:
    """Write a Parquet dataset as JSONL, one ``<source>-<node>.jsonl`` per node in line order; returns events.

    Holds the dataset in memory: meant for small traces (tests, inspection).
    """
    return write_jsonl_table(read_table(dataset_path(root), schema=FLAT_SCHEMA), out)


def write_jsonl_table(table: pa.Table, out: Path) -> int:
    """Write flat rows as JSONL, one ``<source>-<node>.jsonl`` per node in line order; returns events."""
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


#: Why a Parquet file with a string that is not UTF-8 is unreadable, in every engine's words.
NOT_UTF8_COLUMN = "a string column holds bytes that are not UTF-8"


def read_table(source: Any, **options: Any) -> pa.Table:
    """``pq.read_table``; a file whose pages cannot be read (a corrupt page behind an intact footer) is an
    ``inputs.InputError``, as an unreadable footer is."""
    from .inputs import InputError

    try:
        table = pq.read_table(source, **options)
        table.validate(full=True)  # a string column's bytes are UTF-8, as DuckDB's and Spark's reads require
    except (OSError, pa.ArrowException) as exc:
        said = str(exc).splitlines()[0]
        if "Invalid UTF8" in said:
            said = NOT_UTF8_COLUMN
        raise InputError(f"{source}: not a readable Parquet file ({said})") from None
    return table


def read_files(files: Iterable[str]) -> pa.Table:
    """Parquet files (of ``FLAT_SCHEMA``'s columns) as one table."""
    tables = [read_table(f, schema=FLAT_SCHEMA) for f in files]
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


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
    tables = [read_table(f, columns=columns) for f in files]
    return pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]


def iter_rows(table: pa.Table) -> Iterator[dict[str, Any]]:
    """The rows of ``table`` as dicts."""
    yield from table.to_pylist()


# --- validation of Parquet rows (the oracle's) ----------------------------------------------------------------------

_MEMBER_OF = {**{column: column for column in COLUMNS}, **{c: m for m, c in RENAMED.items()}}


def event_view(row: dict[str, Any]) -> dict[str, Any]:
    """The JSON event a Parquet row stands for, to validate: ``row_to_event`` for its kind's members plus every
    non-null column its kind does not have, as the member it would be (an extra member)."""
    kind = row.get("kind")
    event = row_to_event(row) if kind in SOURCE_OF else {}
    for column in COLUMNS:
        value = row.get(column)
        if column == "line" or value is None:
            continue
        if column.startswith("effects_"):
            effects = event.setdefault("effects", {})
            if isinstance(effects, dict):
                effects.setdefault(column.removeprefix("effects_"), value)
            continue
        name = _MEMBER_OF[column]
        if name not in event:
            event[name] = bytes(value).hex() if column == "request_fingerprint" else value
    return event


#: The subjects a bucket must hold whole for the oracle to replay it alone: each tuple of columns, when none is null,
#: names one subject (a row's outbox and IPC events, a message at the broker, a delivery and its acks, an inbox row).
SUBJECT_KEYS = (("mesh", "client_message_id"), ("node", "client_message_id"), ("mesh", "delivery_id"),
                ("recipient", "client_message_id"))


def split_subjects(groups: dict[str, list[str]]) -> bool:
    """Whether a subject (``SUBJECT_KEYS``) has rows in more than one of the groups of Parquet files ``groups`` (a
    dataset's bucket directories): ``meshtrace convert`` never writes one, a Parquet trace from elsewhere may be laid
    out by node, by day or by anything else. Reads the key columns only."""
    import pyarrow.compute as pc

    if len(groups) <= 1:
        return False
    columns = sorted({c for key in SUBJECT_KEYS for c in key})
    parts = []
    for k, name in enumerate(sorted(groups)):
        for f in groups[name]:
            table = read_table(f, columns=columns, schema=FLAT_SCHEMA).select(columns)
            parts.append(table.append_column("group", pa.array([k] * table.num_rows, pa.int32())))
    table = pa.concat_tables(parts)
    for key in SUBJECT_KEYS:
        named = table.filter(pc.and_kleene(pc.is_valid(table[key[0]]), pc.is_valid(table[key[1]])))
        counted = named.select([*key, "group"]).group_by(list(key)).aggregate([("group", "count_distinct")])
        if counted.num_rows and pc.max(counted["group_count_distinct"]).as_py() > 1:
            return True
    return False


#: The most (node, line) pairs ``shared_positions`` holds in one pass over a trace.
POSITIONS_PER_PASS = 1 << 22


def shared_positions(files: Iterable[str]) -> set[tuple[str, int]]:
    """The (node, line) positions that more than one row of the Parquet ``files`` holds (a row with a null node,
    or a null or negative line, holds none). Reads only the two columns, in as many passes as keep each pass under
    ``POSITIONS_PER_PASS`` pairs: pass ``k`` groups the lines whose remainder by the number of passes is ``k``."""
    import pyarrow.compute as pc

    files = list(files)
    total = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    passes = max(1, -(-total // POSITIONS_PER_PASS))
    schema = pa.schema([FLAT_SCHEMA.field("node"), FLAT_SCHEMA.field("line")])
    shared: set[tuple[str, int]] = set()
    for k in range(passes):
        parts = []
        for f in files:
            pairs = read_table(f, columns=["node", "line"], schema=FLAT_SCHEMA).select(["node", "line"])
            keep = pc.and_kleene(pc.is_valid(pairs["node"]), pc.greater_equal(pairs["line"], 0))
            if passes > 1:
                remainder = pc.subtract(pairs["line"], pc.multiply(pc.divide(pairs["line"], passes), passes))
                keep = pc.and_kleene(keep, pc.equal(remainder, k))
            parts.append(pairs.filter(keep))
        pairs = pa.concat_tables(parts) if parts else schema.empty_table()
        counted = pairs.group_by(["node", "line"]).aggregate([([], "count_all")])
        held = counted.filter(pc.greater(counted["count_all"], 1))
        shared.update(zip(held["node"].to_pylist(), held["line"].to_pylist(), strict=True))
    return shared


def validate_table(table: pa.Table, listed: int = INVALID_LISTED, shared: set[tuple[str, int]] | None = None
                   ) -> tuple[pa.Table, list[tuple[tuple[Any, ...], dict[str, Any]]], dict[str, int]]:
    """The valid rows of a Parquet table, its first ``listed`` invalid rows as (order, ``{"where": "<node>@line <n>",
    "reason", "message"}``) in (node, line) order (nulls first), and how many are invalid for each reason.
    ``shared``: the trace's positions held by more than one row (``shared_positions``), whose rows are ``layout``."""
    from spec import fast_validator

    from .validity import layout_message

    check = fast_validator("trace/event")
    keep: list[bool] = []
    invalid: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    for row in table.to_pylist():
        line = row.get("line")
        reason = message = None
        if line is None or line < 0 or (shared and (row.get("node"), line) in shared):
            reason, message = "layout", layout_message(line)
        else:
            event = event_view(row)
            if not check.is_valid(event):
                reason, message = "schema", schema_problem(event)
        keep.append(reason is None)
        if reason is not None:
            node = row.get("node")
            invalid.append(((node is not None, node or "", line is not None, line or 0),
                            {"where": f"{_shown(node)}@line {_shown(line)}", "reason": reason, "message": message}))
    if not invalid:
        return table, [], {}
    invalid.sort(key=lambda e: e[0])
    reasons: dict[str, int] = {}
    for _, entry in invalid:
        reasons[entry["reason"]] = reasons.get(entry["reason"], 0) + 1
    return table.filter(pa.array(keep)), invalid[:listed], reasons


def _shown(value: Any) -> str:
    return "null" if value is None else str(value)
