"""Spark's reading of a trace: JSONL and Parquet from any Hadoop filesystem, validated by ``spark_checks.validity``.

Theory of operation (DataFrame operations only, no Python UDFs):

* The files are found through the session's Hadoop ``FileSystem`` (``inputs.HadoopFS``), so ``s3a://b/x`` stays a URI
  and a trace directory's ``events/`` is found on any filesystem.
* JSONL: each file is read whole (``wholetext``) and split at ``\\n`` with ``posexplode``, which gives every line its
  1-based number in the JVM. A file that is not valid UTF-8 is split on its hex digits instead (``split`` decodes, and
  would hide the bad bytes), and each line is judged on its own bytes. A line is parsed with ``try_parse_json`` wrapped
  in ``[...]`` (so text after the object is refused) with ``spark.sql.variant.allowDuplicateKeys`` on: duplicate
  names are then found with ``json_object_keys``, which keeps them. Each member's JSON type is
  ``schema_of_variant``'s, normalised to the tree's (``BIGINT`` is ``integer``; decimals and doubles, which is what
  ``5.0``, ``5e0`` and ``2**63`` parse to, are ``number``). Valid lines become flat rows with ``line`` numbered per
  node in (file, line) order, plus ``file`` and ``file_line``. A JSONL file must be under 2 GB (one string); traces
  that large belong in Parquet.
* Parquet: every file's footer is read on the driver and its columns compared with ``format.FLAT_SCHEMA``; the rows
  are then judged by the tree rendered over their typed columns (``validity.ParquetAccess``). The (node, line)
  positions two rows hold are ``layout``. Found by a caller's aggregation (``summary``), in the same pass: per node,
  the count, least and greatest line and three sums over the lines (`position_aggregates`). A node whose lines hold no
  position twice is a node whose count is its span and whose sums are the span's, two of them salted by the run
  (`crowded_nodes`); a node where any of that fails -- a duplicated line, or only a gap -- has its positions counted
  exactly, by one aggregation over the two columns of its rows (``_shared_positions``; of every row when more than
  `CROWDED_NAMED` nodes fail), and only when some are shared is the trace judged again with them joined. Without a
  caller's aggregation that exact count runs for every node first.
* Invalid events are counted by reason and the first ``INVALID_LISTED`` fetched, in one small job (a caller's own
  aggregation of a Parquet trace -- the Spark checks' statistics -- can take the count's place in it); the checks then
  read the valid events only: with nothing invalid, a Parquet trace's files as they are, with no validity expression
  in the plans.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from . import format as fmt
from . import validity as v
from .inputs import HadoopFS, InputError, Trace, flat_type_problems, locate


class SparkDialect(v.SqlDialect):
    """Spark SQL text: one ``F.expr`` per tree, parsed in the JVM."""

    INT = "INT"
    STRING = "STRING"

    def text(self, value: str) -> str:
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"

    # Long conjunctions are CASE chains: Spark's code generator splits a CASE's branches into methods, never an
    # AND's operands, and the schema's tree as one AND outgrows a Java method (64 KB).
    def _and_text(self, items: list[str]) -> str:
        if len(items) <= 2:
            return super()._and_text(items)
        return self.when([(self.not_(item), "false") for item in items], "true")

    def _or_text(self, items: list[str]) -> str:
        if len(items) <= 2:
            return super()._or_text(items)
        return self.when([(item, "true") for item in items], "false")

    def regex(self, a: str, pattern: str) -> str:
        return self._derived(f"rlike({a}, {self.lit(pattern)})", a)

    def quote(self, name: str) -> str:
        return f"`{name}`"


def _json_path(path: v.Path) -> str:
    return "$." + ".".join(path)


class JsonAccess(v.Access):
    """Members of the variant column ``e`` as Spark SQL; column ``t<k>`` holds path k's JSON type, ``text`` the
    line."""

    def __init__(self, paths: list[v.Path]):
        self.d = SparkDialect()
        self.index = {path: k for k, path in enumerate(paths)}

    def t(self, path: v.Path) -> str:
        return f"`t{self.index[path]}`" if path else "'object'"

    def present(self, path: v.Path) -> str:
        return f"({self.t(path)} IS NOT NULL)"

    def type_is(self, path: v.Path, types: tuple[str, ...]) -> str:
        return self.d.in_(self.t(path), list(types))

    def _get(self, path: v.Path, kind: str) -> str:
        return f"try_variant_get(`e`, {self.d.lit(_json_path(path))}, {self.d.lit(kind)})"

    def string(self, path: v.Path) -> str:
        return self._get(path, "string")

    def integer(self, path: v.Path) -> str:
        return self._get(path, "bigint")

    def boolean(self, path: v.Path) -> str:
        return self._get(path, "boolean")

    def unknown_member(self, path: v.Path, allowed: tuple[str, ...]) -> str:
        text = f"get_json_object(`text`, {self.d.lit(_json_path(path))})" if path else "`text`"
        names = ", ".join(self.d.lit(n) for n in allowed)
        return f"try_element_at(array_except(json_object_keys({text}), array({names})), 1)"


def variant_type(column: Any) -> Any:
    """``schema_of_variant`` of a member as the tree's JSON type (null when absent)."""
    from pyspark.sql import functions as F

    s = F.schema_of_variant(column)
    return (F.when(column.isNull(), None).when(s == "STRING", "string").when(s == "BIGINT", "integer")
            .when(s == "BOOLEAN", "boolean").when(s == "VOID", "null").when(s.startswith("OBJECT"), "object")
            .when(s.startswith("ARRAY"), "array").otherwise("number"))


@dataclass
class Loaded:
    trace: Trace
    invalid: list[dict[str, Any]]
    reasons: dict[str, int]
    #: the rows of the caller's ``summary`` aggregation for valid events, when it ran with the count
    summary: list[Any] | None = None
    #: every row of that aggregation, invalid events' included
    every: list[Any] | None = None


#: splitmix64's finalizer (Steele, Lea and Flood 2014), a bijection of 64-bit words, over a line plus a salt
MIX_ADD, MIX_1, MIX_2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
WORD = 1 << 64
#: two salts drawn for each run: a trace is written before its check draws them, so no trace can be made to cancel
#: the mixed sums (unsalted, a lattice reduction finds moved lines that keep one in 0.2 s)
SALTS = (secrets.randbits(64), secrets.randbits(64))
#: lines hashed at once on the driver (`_range_hash`): 32 MB of 64-bit words
RANGE_CHUNK = 1 << 22
#: the most crowded nodes the exact count is limited to by name; with more it counts every node's positions
CROWDED_NAMED = 1000


def _signed(value: int) -> int:
    return value - WORD if value >= WORD >> 1 else value


def _mix(column: Any, salt: int) -> Any:
    """splitmix64's finalizer of a long column plus ``salt`` (Spark's long arithmetic wraps: ANSI mode is off,
    session.SQL_CONF)."""
    from pyspark.sql import functions as F

    z = column.cast("long") + F.lit(_signed((salt + MIX_ADD) % WORD))
    z = z.bitwiseXOR(F.shiftrightunsigned(z, 30)) * F.lit(_signed(MIX_1))
    z = z.bitwiseXOR(F.shiftrightunsigned(z, 27)) * F.lit(_signed(MIX_2))
    return z.bitwiseXOR(F.shiftrightunsigned(z, 31))


def _range_hash(low: int, high: int, salt: int) -> int:
    """The sum of `_mix` with ``salt`` over low..high, modulo 2**64 (numpy's unsigned arithmetic wraps as Spark's
    does)."""
    import numpy as np

    total = 0
    for start in range(low, high + 1, RANGE_CHUNK):
        z = (np.arange(start, min(high + 1, start + RANGE_CHUNK), dtype=np.uint64)
             + np.uint64((salt + MIX_ADD) % WORD))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX_1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX_2)
        total += int((z ^ (z >> np.uint64(31))).sum(dtype=np.uint64))
    return total % WORD


def _holds_position() -> Any:
    """Whether a row holds a (node, line) position: it has a node, and a line that is not null or negative."""
    from pyspark.sql import functions as F

    return F.col("node").isNotNull() & (F.col("line") >= 0)


def position_key() -> Any:
    """The node of a row holding a position, else null: a grouping key of the caller's aggregation, beside its
    own."""
    from pyspark.sql import functions as F

    return F.when(_holds_position(), F.col("node")).alias("pnode")


def position_aggregates(inner: bool) -> list[Any]:
    """The aggregates `crowded_nodes` reads, per `position_key` group: over the rows (``inner``) or, in an outer
    aggregation, over the inner one's groups."""
    from pyspark.sql import functions as F

    mixed = [f"phash{k}" for k in range(len(SALTS))]
    if inner:
        held = _holds_position()
        line = F.when(held, F.col("line"))
        return [F.count(line).alias("pn"), F.min(line).alias("pmin"), F.max(line).alias("pmax"),
                F.sum(line).alias("psum"),
                *[F.sum(F.when(held, _mix(F.col("line"), salt))).alias(name)
                  for salt, name in zip(SALTS, mixed, strict=True)]]
    return [F.sum("pn").alias("pn"), F.min("pmin").alias("pmin"), F.max("pmax").alias("pmax"),
            F.sum("psum").alias("psum"), *[F.sum(name).alias(name) for name in mixed]]


def crowded_nodes(rows: list[Any]) -> set[str]:
    """The nodes whose positions may be held twice, from the rows of `position_aggregates`: a node's lines hold each
    position once when they number as many as their span, and their plain sum and their two salted `_mix` sums
    (modulo 2**64) are the span's. A duplicated line with no gap changes the count; with gaps, the sums must miss by
    exactly what the duplicates add, which for the plain sum a trace can be made to do, and for a mixed sum whose
    salt was drawn after the trace was written happens about once in 2**64 -- for both, once in 2**128, a heuristic
    figure: splitmix64 is a mixer, not a proven hash family -- so a node that passes holds no position twice."""
    nodes: dict[str, list[int]] = {}
    for row in rows:
        if row["pnode"] is None or not row["pn"]:
            continue
        first = [0, row["pmin"], row["pmax"], 0, *[0] * len(SALTS)]
        n, low, high, plain, *mixed = nodes.setdefault(row["pnode"], first)
        nodes[row["pnode"]] = [n + row["pn"], min(low, row["pmin"]), max(high, row["pmax"]), plain + row["psum"],
                               *[m + row[f"phash{k}"] for k, m in enumerate(mixed)]]
    crowded = set()
    for node, (n, low, high, plain, *mixed) in nodes.items():
        if (n != high - low + 1 or plain % WORD != (low + high) * n // 2 % WORD
                or any(m % WORD != _range_hash(low, high, salt) for m, salt in zip(mixed, SALTS, strict=True))):
            crowded.add(node)
    return crowded


def read(spark: Any, paths: list[str], listed: int = fmt.INVALID_LISTED,
         summary: Callable[[Any], Any] | None = None) -> tuple[Any, Loaded]:
    """The valid events of the trace ``paths`` name as a DataFrame of ``format.COLUMNS`` (plus ``file`` and
    ``file_line`` for JSONL), and what was invalid. Raises ``inputs.InputError``.

    ``summary`` (Parquet only: a JSONL line's ``line`` is numbered after the split) maps the judged events to an
    aggregation with a ``reason`` and a count ``n`` column, grouped by `position_key` too and carrying
    `position_aggregates`; it then replaces the count per reason and the count of shared positions, in the same job,
    and its rows with a null reason are ``Loaded.summary``.
    """
    trace = locate(paths, HadoopFS(spark))
    for location in [f.location for f in trace.jsonl] + trace.parquet_files:
        name = path_text(location).rsplit("/", 1)[-1]
        if ":" in name:  # Hadoop makes ".<name>.crc" a relative path, and a colon makes that a URI: it fails
            raise InputError(f"{path_text(location)}: Hadoop (Spark) cannot read a file whose name holds ':'; "
                             f"rename it, or check it with --engine duckdb or --engine oracle")
    if trace.is_jsonl:
        valid, loaded = _split(_jsonl(spark, trace), ["fi", "n"], listed, trace)
        return number_lines(valid), loaded
    frame = _parquet_frame(spark, trace)
    if summary is None:
        valid, loaded = _split(_judged(frame, _shared_positions(frame)), ["node", "line"], listed, trace, frame)
        _refuse_bad_strings(spark, trace, loaded)
        return valid, loaded
    valid, loaded = _split(_judged(frame, None), ["node", "line"], listed, trace, frame, summary)
    _refuse_bad_strings(spark, trace, loaded)
    crowded = crowded_nodes(loaded.every)
    if len(crowded) > CROWDED_NAMED:  # a filter naming them all would cost more to build than it saves
        shared = _shared_positions(frame)
    else:
        shared = _shared_positions(frame.filter(frame.node.isin(sorted(crowded)))) if crowded else None
    if shared is None:
        return valid, loaded
    return _split(_judged(frame, shared), ["node", "line"], listed, trace, frame, summary)


def _split(judged: Any, order: list[str], listed: int, trace: Trace, plain: Any = None,
           summary: Callable[[Any], Any] | None = None) -> tuple[Any, Loaded]:
    """The valid rows of ``judged`` and what was invalid. With nothing invalid the valid rows are ``plain`` (the
    rows before judging), when given: the checks' plans then carry no validity expression to analyse."""
    from pyspark.sql import functions as F

    if plain is None:
        # JSONL: the lines are parsed and judged once and kept; what follows reads the kept rows, so no plan after
        # this carries the parse and the schema's expression (inlined into each of the catalogue's reads, its
        # generated code ran a 2g driver out of heap)
        judged = judged.localCheckpoint()
    bad = judged.filter(F.col("reason").isNotNull())
    rows = every = None
    if summary is None:
        counts = {r["reason"]: r["n"] for r in bad.groupBy("reason").agg(F.count(F.lit(1)).alias("n")).collect()}
    else:
        rows, counts, every = [], {}, summary(judged).collect()
        for r in every:
            if r["reason"] is None:
                rows.append(r)
            else:
                counts[r["reason"]] = counts.get(r["reason"], 0) + r["n"]
    invalid = []
    if counts:
        invalid = [{"where": r["where"], "reason": r["reason"], "message": _message(r.asDict())} for r in
                   bad.orderBy(*[F.col(c).asc_nulls_first() for c in order]).limit(listed).collect()]
    if not counts and plain is not None:
        return plain, Loaded(trace, invalid, counts, rows, every)
    valid = judged.filter(F.col("reason").isNull()) if counts else judged
    valid = valid.drop("reason", "message", "where")
    if counts and plain is not None:  # a Parquet trace's tolerated invalid rows: its valid rows judged once more, kept
        valid = valid.localCheckpoint()
    return valid, Loaded(trace, invalid, counts, rows, every)


def _message(row: dict[str, Any]) -> str:
    """The message of one listed invalid event, on the driver: the rule's text, or the tree's explanation
    (``validity.explain``, the same words ``Renderer.explain`` gives in SQL) of the line's JSON or the row's view."""
    import json

    reason = row["reason"]
    if reason == v.TORN_TAIL:
        return v.TORN_MESSAGE
    if reason == "layout":
        return v.layout_message(row["line"])
    if reason not in ("integer_literal", "schema"):
        return v.REASONS[reason] if reason != "duplicate_member" else \
            "a member name appears twice in the event or its effects"
    if row.get("message") is None:  # a Parquet row
        return v.explain(fmt.event_view(row)) or v.REASONS[reason]
    event = json.loads(row["message"], parse_float=v.FloatLiteral)
    if reason == "integer_literal":
        for path in v.compile_event().integer_paths:
            value: Any = event
            for name in path:
                value = value.get(name) if isinstance(value, dict) else None
            if v.json_type(value) == "number":
                return f"{v.member(path)}: {v.REASONS['integer_literal']}"
    return v.explain(event) or v.REASONS[reason]


def _parquet_frame(spark: Any, trace: Trace) -> Any:
    from .spark import spark_schema

    _check_footers(spark, trace.parquet_files)
    # one scan of every file: a union of one scan per dataset would get a copy of the validity expression per
    # dataset (Catalyst pushes projections into a union's branches), each compiled on its own -- 33 datasets took
    # minutes. Files named one by one have no partition columns to discover (their directories are the base paths).
    return spark.read.schema(spark_schema()).parquet(*map(exact, trace.parquet_files)).select(*fmt.COLUMNS)


def _judged(frame: Any, shared: Any) -> Any:
    """The Parquet rows of ``frame`` with their ``reason`` (null when valid), ``message`` and ``where``; ``shared``:
    the positions more than one row holds (`_shared_positions`), or None."""
    from pyspark.sql import functions as F

    d = SparkDialect()
    renderer = v.Renderer(d, v.ParquetAccess(d))
    tree = v.compile_event().tree
    layout = F.col("line").isNull() | (F.col("line") < 0)
    rows = frame
    if shared is not None:  # rare: their rows are marked by a join, kept out of the plain trace's plans
        rows = frame.join(shared, ["node", "line"], "left").select(*fmt.COLUMNS, "shared")
        layout = layout | F.col("shared").isNotNull()
    # a string that is not UTF-8 makes its file unreadable, as it is to DuckDB and pyarrow (`_refuse_bad_strings`)
    reason = (F.when(~_strings_are_utf8(), NOT_UTF8).when(layout, "layout")
              .when(~F.expr(renderer.valid(tree)), "schema"))
    where = F.concat(F.coalesce(F.col("node"), F.lit("null")), F.lit("@line "),
                     F.coalesce(F.col("line").cast("string"), F.lit("null")))
    return rows.select(*fmt.COLUMNS, reason.alias("reason"), F.lit(None).cast("string").alias("message"),
                       where.alias("where"))


#: the reason `_judged` gives a row holding a string that is not UTF-8 (never reported: the read refuses its file)
NOT_UTF8 = "not_utf8"


def _strings_are_utf8() -> Any:
    """Whether every string column of a Parquet row holds UTF-8 (Spark reads a column's bytes as they are)."""
    from pyspark.sql import functions as F

    valid = None
    for field in fmt.FLAT_SCHEMA:
        if str(field.type) == "string":
            ok = F.coalesce(F.is_valid_utf8(field.name), F.lit(True))
            valid = ok if valid is None else valid & ok
    return valid


def _refuse_bad_strings(spark: Any, trace: Trace, loaded: Loaded) -> None:
    """Raise ``InputError`` naming a file with a string that is not UTF-8, when the judged rows found one: such a
    file is unreadable to every engine (``format.NOT_UTF8_COLUMN``), whatever ``--tolerate`` says."""
    from pyspark.sql import functions as F

    from .spark import spark_schema

    if NOT_UTF8 not in loaded.reasons:
        return
    files = spark.read.schema(spark_schema()).parquet(*map(exact, trace.parquet_files))
    [first] = files.filter(~_strings_are_utf8()).select(F.col("_metadata.file_path").alias("f")).limit(1).collect()
    listed = {_same_uri(location): location for location in trace.parquet_files}
    location = listed.get(_same_uri(first["f"]), first["f"])
    raise InputError(f"{location}: not a readable Parquet file ({fmt.NOT_UTF8_COLUMN})")


#: the most shared positions ``_shared_positions`` broadcasts (more are joined by a shuffle)
SHARED_BROADCAST = 100_000


def _shared_positions(frame: Any) -> Any:
    """The (node, line) positions more than one row of ``frame`` holds, with a ``shared`` column, or None when there
    are none. One small job: an aggregation over the two columns of every file (a node's rows span files and
    datasets), kept (``localCheckpoint``); a row with a null node or a null or negative line holds none."""
    from pyspark.sql import functions as F

    shared = (frame.select("node", "line").filter(_holds_position())
              .groupBy("node", "line").agg(F.count(F.lit(1)).alias("n")).filter(F.col("n") > 1)
              .select("node", "line", F.lit(True).alias("shared")).localCheckpoint())
    count = shared.count()
    if count == 0:
        return None
    return F.broadcast(shared) if count <= SHARED_BROADCAST else shared


#: a field of a Parquet schema's text (``MessageType.toString()``): repetition, type (with a length), name, annotation
FOOTER_FIELD = re.compile(r"(?:required|optional|repeated) (\w+)(?:\((\d+)\))? ([^\s;({]+)(?: \((.*)\))?;?")
#: a Parquet column's physical type and annotation -> its ``format.FLAT_SCHEMA`` type
FOOTER_TYPES = {"INT32 INTEGER(8,true)": "int8", "INT32": "int32", "INT32 INTEGER(32,true)": "int32",
                "INT64": "int64", "INT64 INTEGER(64,true)": "int64", "BINARY STRING": "string",
                "BOOLEAN": "bool", "FIXED_LEN_BYTE_ARRAY(32)": "fixed_size_binary[32]"}


def footer_columns(text: str) -> dict[str, str]:
    """The top-level columns of a Parquet schema's text and their ``FLAT_SCHEMA`` types (a group is ``group``, a
    field the text does not spell as expected is named by its line and typed ``unreadable``)."""
    columns: dict[str, str] = {}
    depth = 0
    for line in text.splitlines()[1:]:
        stripped = line.strip()
        if depth == 0 and stripped and stripped != "}":
            field = FOOTER_FIELD.match(stripped)
            if field is None:
                columns[stripped] = "unreadable"
            elif field[1] == "group":
                columns[field[3]] = "group"
            else:
                physical = field[1].upper() + (f"({field[2]})" if field[2] else "")
                physical += f" {field[4]}" if field[4] else ""
                columns[field[3]] = FOOTER_TYPES.get(physical, physical)
        depth += stripped.count("{") - stripped.count("}")
    return columns


def _check_footers(spark: Any, files: list[str]) -> None:
    """Read each Parquet file's footer on the driver and compare its columns with ``format.FLAT_SCHEMA``: a few
    py4j calls per file (the schema comes back as one text), each distinct schema parsed once."""
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    hadoop_path = jvm.org.apache.hadoop.fs.Path
    open_reader = jvm.org.apache.parquet.hadoop.ParquetFileReader.open
    input_file = jvm.org.apache.parquet.hadoop.util.HadoopInputFile.fromPath
    parsed: dict[str, dict[str, str]] = {}
    problems: list[str] = []
    for location in files:
        try:
            reader = open_reader(input_file(hadoop_path(path_text(location)), conf))
            try:
                text = reader.getFooter().getFileMetaData().getSchema().toString()
            finally:
                reader.close()
        except Exception as exc:  # py4j's error for any unreadable file
            raise InputError(f"{location}: not a readable Parquet file ({str(exc).splitlines()[0]})") from None
        if text not in parsed:
            parsed[text] = footer_columns(text)
        problems += flat_type_problems(parsed[text], location)
    if problems:
        raise InputError("Parquet columns do not match the trace layout: " + "; ".join(problems[:5])
                         + (f"; and {len(problems) - 5} more" if len(problems) > 5 else ""))


#: ``file:///x`` and ``file:/x`` name one file (Hadoop lists the first, Spark's ``_metadata.file_path`` is the second)
EMPTY_AUTHORITY = r"^([A-Za-z][A-Za-z0-9+.-]*):///"

#: the characters of Hadoop's glob patterns (``GlobPattern``, ``GlobExpander``), backslash its escape
HADOOP_GLOB = re.compile(r"([\\*?\[\]{}])")


def path_text(location: str) -> str:
    """A listed file (``inputs.HadoopFS``: a percent-encoded URI) as the text ``new Path(text)`` names it by."""
    return unquote(location)


def exact(location: str) -> str:
    """A listed file as a path Spark reads as written: Spark globs a path holding ``* ? [ ] { } \\``
    (``daemon-n[1].jsonl`` would read ``daemon-n1.jsonl``), so each is escaped with a backslash, which Hadoop's
    ``Globber`` takes off again (a component with no pattern left is looked up, not listed)."""
    return HADOOP_GLOB.sub(r"\\\1", path_text(location))


def _same_uri(location: str) -> str:
    return re.sub(EMPTY_AUTHORITY, r"\1:/", location)


def _jsonl(spark: Any, trace: Trace) -> Any:
    from pyspark.sql import functions as F

    from .spark import local_frame

    spark.conf.set("spark.sql.variant.allowDuplicateKeys", "true")  # found by json_object_keys, as the rules say
    files = local_frame(spark, [(k, _same_uri(f.location), f.display) for k, f in enumerate(trace.jsonl)],
                        "fi int, location string, display string")
    raw = (spark.read.text([exact(f.location) for f in trace.jsonl], wholetext=True)
           .select(F.regexp_replace("_metadata.file_path", EMPTY_AUTHORITY, "$1:/").alias("location"), "value")
           .join(F.broadcast(files), "location"))
    by_hex = F.transform(F.split(F.regexp_replace(F.hex(F.col("value").cast("binary")), "((?:[0-9A-F]{2})*?)0A",
                                                  "$1|"), r"\|", -1),
                         lambda h: F.unhex(h).cast("string"))
    parts = F.when(F.is_valid_utf8("value"), F.split("value", "\n", -1)).otherwise(by_hex)
    # a file's lines and their count are computed once per file, before the explode: an expression beside a
    # generator is evaluated above it, once per generated row (the whole file split again for each of its lines)
    lines = (raw.select("fi", "display", parts.alias("parts"))
             .select("fi", "display", F.size("parts").alias("total"), "parts")
             .select("fi", "display", "total", F.posexplode("parts").alias("pos", "text"))
             .select("fi", "display", (F.col("pos") + 1).alias("n"), "text",
                     (F.col("pos") + 1 < F.col("total")).alias("terminated"))
             .filter(~((F.col("n") == F.col("total")) & (F.col("text") == ""))))
    wrapped = F.try_parse_json(F.concat(F.lit("["), F.col("text"), F.lit("]")))
    lone = F.regexp_replace(F.regexp_replace("text", v.ESCAPED_BACKSLASH, "__"), v.SURROGATE_PAIR, "__") \
        .rlike(v.SURROGATE)
    def openings(text: Any) -> Any:
        return F.length(F.regexp_replace(text, v.NOT_OPENING, "")) > v.MAX_CONTAINERS

    blanked = F.regexp_replace(F.regexp_replace("text", v.ESCAPE_PATTERN, "__"), v.PLAIN_STRING_PATTERN, '""')
    nesting = openings(F.col("text")) & openings(blanked)
    long_number = F.col("text").rlike(v.LONG_DIGITS_PATTERN) & blanked.rlike(v.LONG_DIGITS_PATTERN)
    lines = lines.select("*", wrapped.alias("w"))
    first = (F.when(~F.is_valid_utf8("text"), "not_utf8")
             .when(F.col("text").rlike(r"\A[ \t\r]*\z"), "blank")
             .when(F.col("text").startswith("\ufeff"), "bom")
             .when(lone, "lone_surrogate")
             .when(nesting, "nesting")
             .when(long_number, "long_number")
             .when(F.col("w").isNull() | (F.size(F.col("w").cast("array<variant>")) != 1), "not_json"))
    lines = lines.select("fi", "display", "n", "text", "terminated", first.alias("line_reason"),
                         F.variant_get("w", "$[0]", "variant").alias("e"))
    lines = lines.withColumn("line_reason", F.coalesce(
        "line_reason", F.when(~F.schema_of_variant("e").startswith("OBJECT"), "not_object")))
    compiled = v.compile_event()
    paths = sorted(set(v.leaf_paths(compiled.tree)) | set(compiled.integer_paths)
                   | {p for p in compiled.object_paths if p})
    access = JsonAccess(paths)
    judged_line = F.col("line_reason").isNull()
    lines = lines.select("*", *[F.when(judged_line, variant_type(F.variant_get("e", _json_path(p), "variant")))
                                .alias(f"t{k}") for k, p in enumerate(paths)])

    def keys_repeat(path: v.Path) -> str:
        text = f"get_json_object(`text`, {d.lit(_json_path(path))})" if path else "`text`"
        return f"coalesce(size(json_object_keys({text})) != size(array_distinct(json_object_keys({text}))), false)"

    d = SparkDialect()
    duplicate = F.expr(d.or_([keys_repeat(p) for p in compiled.object_paths]))
    integer = F.expr(d.or_([d.true(d.eq(access.t(p), "'number'")) for p in compiled.integer_paths]))
    renderer = v.Renderer(d, access)
    torn = F.col("line_reason").isin(*v.TORN) & ~F.col("terminated")
    reason = (F.when(torn, v.TORN_TAIL).when(F.col("line_reason").isNotNull(), F.col("line_reason"))
              .when(duplicate, "duplicate_member").when(integer, "integer_literal")
              .when(~F.expr(renderer.valid(compiled.tree)), "schema"))
    judged = lines.select("*", reason.alias("reason"))
    judged = judged.select("*", F.when(F.col("reason").isNotNull(), F.col("text")).alias("message"),
                           F.concat("display", F.lit(":"), F.col("n").cast("string")).alias("where"))
    return judged.select("fi", "n", "reason", "message", "where", *_flat_columns(),
                         F.col("display").alias("file"), F.col("n").cast("long").alias("file_line"))


def number_lines(frame: Any) -> Any:
    """``line``: the 0-based position of each valid event in its node's stream, in (file, line) order."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    position = F.row_number().over(Window.partitionBy("node").orderBy("fi", "n")) - 1
    return frame.withColumn("line", position.cast("long")).drop("fi", "n")


def _flat_columns() -> list[Any]:
    """Each ``FLAT_SCHEMA`` column from the variant ``e`` (``line`` is numbered afterwards)."""
    from pyspark.sql import functions as F

    from .spark import spark_schema

    types = {f.name: f.dataType for f in spark_schema().fields}
    columns = v.member_columns()
    out = []
    for column in fmt.COLUMNS:
        if column == "line":
            out.append(F.lit(None).cast("long").alias("line"))
            continue
        path = next(p for p, c in columns.items() if c == column)
        if column == "request_fingerprint":
            value = F.unhex(F.try_variant_get("e", _json_path(path), "string"))
        else:
            value = F.try_variant_get("e", _json_path(path), types[column].simpleString())
        out.append(value.alias(column))
    return out
