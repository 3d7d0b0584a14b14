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
  are then judged by the tree rendered over their typed columns (``validity.ParquetAccess``).
* Invalid events are counted by reason and the first ``INVALID_LISTED`` fetched, in one small job; the checks then
  read the valid events only (no filter at all when nothing is invalid).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import format as fmt
from . import validity as v
from .inputs import HadoopFS, InputError, Trace, flat_type_problems, locate


class SparkDialect(v.Dialect):
    def __init__(self) -> None:
        from pyspark.sql import functions as F

        self.F = F

    def lit(self, value: Any) -> Any:
        if value is None:
            return self.F.lit(None).cast("string")
        return self.F.lit(value)

    # Long conjunctions are CASE chains: Spark's code generator splits a CASE's branches into methods, never an
    # AND's operands, and the schema's tree as one AND outgrows a Java method (64 KB).
    def and_(self, items: list[Any]) -> Any:
        if len(items) <= 2:
            return self.F.lit(True) if not items else items[0] if len(items) == 1 else items[0] & items[1]
        return self.when([(~item, self.F.lit(False)) for item in items], self.F.lit(True))

    def or_(self, items: list[Any]) -> Any:
        if len(items) <= 2:
            return self.F.lit(False) if not items else items[0] if len(items) == 1 else items[0] | items[1]
        return self.when([(item, self.F.lit(True)) for item in items], self.F.lit(False))

    def not_(self, item: Any) -> Any:
        return ~item

    def when(self, branches: list[tuple[Any, Any]], otherwise: Any) -> Any:
        out = None
        for condition, result in branches:
            out = self.F.when(condition, result) if out is None else out.when(condition, result)
        return out.otherwise(otherwise)

    def coalesce(self, items: list[Any]) -> Any:
        return items[0] if len(items) == 1 else self.F.coalesce(*items)

    def eq(self, a: Any, b: Any) -> Any:
        return a == b

    def cmp(self, a: Any, op: str, b: Any) -> Any:
        return {">=": a >= b, "<=": a <= b}[op]

    def length(self, a: Any) -> Any:
        return self.F.length(a)

    def matches(self, a: Any, pattern: str) -> Any:
        return a.rlike(pattern)

    def concat(self, items: list[Any]) -> Any:
        return self.F.concat(*items)

    def is_null(self, a: Any) -> Any:
        return a.isNull()

    def count_true(self, items: list[Any]) -> Any:
        out = None
        for item in items:
            term = item.cast("int")
            out = term if out is None else out + term
        return out

    def col(self, name: str) -> Any:
        return self.F.col(name)

    def in_(self, a: Any, values: list[Any]) -> Any:
        return self.F.coalesce(a.isin(*values), self.F.lit(False))

    def hex_lower(self, a: Any) -> Any:
        return self.F.lower(self.F.hex(a))

    def cast_long(self, a: Any) -> Any:
        return a.cast("long")


def _json_path(path: v.Path) -> str:
    return "$." + ".".join(path)


class JsonAccess(v.Access):
    """Members of the variant column ``e``; column ``t<k>`` holds path k's JSON type, ``text`` the line."""

    def __init__(self, paths: list[v.Path]):
        from pyspark.sql import functions as F

        self.F = F
        self.index = {path: k for k, path in enumerate(paths)}

    def t(self, path: v.Path) -> Any:
        return self.F.col(f"t{self.index[path]}") if path else self.F.lit("object")

    def present(self, path: v.Path) -> Any:
        return self.t(path).isNotNull()

    def type_is(self, path: v.Path, types: tuple[str, ...]) -> Any:
        return self.F.coalesce(self.t(path).isin(*types), self.F.lit(False))

    def _get(self, path: v.Path, kind: str) -> Any:
        return self.F.try_variant_get(self.F.col("e"), _json_path(path), kind)

    def string(self, path: v.Path) -> Any:
        return self._get(path, "string")

    def integer(self, path: v.Path) -> Any:
        return self._get(path, "bigint")

    def boolean(self, path: v.Path) -> Any:
        return self._get(path, "boolean")

    def unknown_member(self, path: v.Path, allowed: tuple[str, ...]) -> Any:
        F = self.F
        keys = F.json_object_keys(F.get_json_object("text", _json_path(path)) if path else F.col("text"))
        return F.try_element_at(F.array_except(keys, F.array(*[F.lit(n) for n in allowed])), F.lit(1))


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


def read(spark: Any, paths: list[str], listed: int = fmt.INVALID_LISTED) -> tuple[Any, Loaded]:
    """The valid events of the trace ``paths`` name as a DataFrame of ``format.COLUMNS`` (plus ``file`` and
    ``file_line`` for JSONL), and what was invalid. Raises ``inputs.InputError``."""
    trace = locate(paths, HadoopFS(spark))
    if trace.is_jsonl:
        valid, loaded = _split(_jsonl(spark, trace), ["fi", "n"], listed, trace)
        return number_lines(valid), loaded
    return _split(_parquet(spark, trace), ["node", "line"], listed, trace)


def _split(judged: Any, order: list[str], listed: int, trace: Trace) -> tuple[Any, Loaded]:
    from pyspark.sql import functions as F

    bad = judged.filter(F.col("reason").isNotNull())
    counts = {r["reason"]: r["n"] for r in bad.groupBy("reason").agg(F.count(F.lit(1)).alias("n")).collect()}
    invalid = []
    if counts:
        invalid = [{"where": r["where"], "reason": r["reason"], "message": _message(r.asDict())} for r in
                   bad.orderBy(*[F.col(c).asc_nulls_first() for c in order]).limit(listed).collect()]
    valid = judged.filter(F.col("reason").isNull()) if counts else judged
    return valid.drop("reason", "message", "where"), Loaded(trace, invalid, counts)


def _message(row: dict[str, Any]) -> str:
    """The message of one listed invalid event, on the driver: the rule's text, or the tree's explanation
    (``validity.explain``, the same words ``Renderer.explain`` gives in SQL) of the line's JSON or the row's view."""
    import json

    reason = row["reason"]
    if reason == v.TORN_TAIL:
        return v.TORN_MESSAGE
    if reason == "layout":
        return f"line: {'null' if row['line'] is None else row['line']} is not a position in the node's stream"
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


def _parquet(spark: Any, trace: Trace) -> Any:
    from pyspark.sql import functions as F

    from .spark import spark_schema

    _check_footers(spark, trace.parquet_files)
    frames = [spark.read.schema(spark_schema()).option("basePath", root).parquet(*files)
              for root, files in trace.datasets]
    frame = frames[0]
    for other in frames[1:]:
        frame = frame.unionByName(other)
    frame = frame.select(*fmt.COLUMNS)
    d = SparkDialect()
    renderer = v.Renderer(d, v.ParquetAccess(d))
    tree = v.compile_event().tree
    layout = F.col("line").isNull() | (F.col("line") < 0)
    reason = F.when(layout, "layout").when(~renderer.valid(tree), "schema")
    where = F.concat(F.coalesce(F.col("node"), F.lit("null")), F.lit("@line "),
                     F.coalesce(F.col("line").cast("string"), F.lit("null")))
    return frame.select("*", reason.alias("reason"), F.lit(None).cast("string").alias("message"),
                        where.alias("where"))


def _check_footers(spark: Any, files: list[str]) -> None:
    """Read each Parquet file's footer on the driver and compare its columns with ``format.FLAT_SCHEMA``."""
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    expected = {"INT32 INTEGER(8,true)": "int8", "INT32": "int32", "INT32 INTEGER(32,true)": "int32",
                "INT64": "int64", "INT64 INTEGER(64,true)": "int64", "BINARY STRING": "string",
                "BOOLEAN": "bool", "FIXED_LEN_BYTE_ARRAY(32)": "fixed_size_binary[32]"}
    problems: list[str] = []
    for location in files:
        try:
            path = jvm.org.apache.hadoop.fs.Path(location)
            reader = jvm.org.apache.parquet.hadoop.ParquetFileReader.open(
                jvm.org.apache.parquet.hadoop.util.HadoopInputFile.fromPath(path, conf))
            try:
                schema = reader.getFooter().getFileMetaData().getSchema()
            finally:
                reader.close()
        except Exception as exc:  # py4j's error for any unreadable file
            raise InputError(f"{location}: not a readable Parquet file ({str(exc).splitlines()[0]})") from None
        columns = {}
        for field in schema.getFields():
            name = field.getName()
            if not field.isPrimitive():
                columns[name] = "group"
                continue
            primitive = field.asPrimitiveType()
            text = primitive.getPrimitiveTypeName().name()
            if text == "FIXED_LEN_BYTE_ARRAY":
                text += f"({primitive.getTypeLength()})"
            annotation = field.getLogicalTypeAnnotation()
            if annotation is not None:
                text += " " + annotation.toString()
            columns[name] = expected.get(text, text)
        problems += flat_type_problems(columns, location)
    if problems:
        raise InputError("Parquet columns do not match the trace layout: " + "; ".join(problems[:5])
                         + (f"; and {len(problems) - 5} more" if len(problems) > 5 else ""))


#: ``file:///x`` and ``file:/x`` name one file (Hadoop lists the first, Spark's ``_metadata.file_path`` is the second)
EMPTY_AUTHORITY = r"^([A-Za-z][A-Za-z0-9+.-]*):///"


def _same_uri(location: str) -> str:
    import re

    return re.sub(EMPTY_AUTHORITY, r"\1:/", location)


def _jsonl(spark: Any, trace: Trace) -> Any:
    from pyspark.sql import functions as F

    from .spark import local_frame

    spark.conf.set("spark.sql.variant.allowDuplicateKeys", "true")  # found by json_object_keys, as the rules say
    files = local_frame(spark, [(k, _same_uri(f.location), f.display) for k, f in enumerate(trace.jsonl)],
                        "fi int, location string, display string")
    raw = (spark.read.text([f.location for f in trace.jsonl], wholetext=True)
           .select(F.regexp_replace("_metadata.file_path", EMPTY_AUTHORITY, "$1:/").alias("location"), "value")
           .join(F.broadcast(files), "location"))
    by_hex = F.transform(F.split(F.regexp_replace(F.hex(F.col("value").cast("binary")), "((?:[0-9A-F]{2})*?)0A",
                                                  "$1|"), r"\|", -1),
                         lambda h: F.unhex(h).cast("string"))
    parts = F.when(F.is_valid_utf8("value"), F.split("value", "\n", -1)).otherwise(by_hex)
    lines = (raw.select("fi", "display", F.size(parts).alias("total"), F.posexplode(parts).alias("pos", "text"))
             .select("fi", "display", (F.col("pos") + 1).alias("n"), "text",
                     (F.col("pos") + 1 < F.col("total")).alias("terminated"))
             .filter(~((F.col("n") == F.col("total")) & (F.col("text") == ""))))
    wrapped = F.try_parse_json(F.concat(F.lit("["), F.col("text"), F.lit("]")))
    lone = F.regexp_replace(F.regexp_replace("text", v.ESCAPED_BACKSLASH, "__"), v.SURROGATE_PAIR, "__") \
        .rlike(v.SURROGATE)
    lines = lines.select("*", wrapped.alias("w"))
    first = (F.when(~F.is_valid_utf8("text"), "not_utf8")
             .when(F.col("text").rlike(r"\A[ \t\r]*\z"), "blank")
             .when(F.col("text").startswith("\ufeff"), "bom")
             .when(lone, "lone_surrogate")
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

    def keys_repeat(path: v.Path) -> Any:
        keys = F.json_object_keys(F.get_json_object("text", _json_path(path)) if path else F.col("text"))
        return F.coalesce(F.size(keys) != F.size(F.array_distinct(keys)), F.lit(False))

    d = SparkDialect()
    duplicate = d.or_([keys_repeat(p) for p in compiled.object_paths])
    integer = d.or_([F.coalesce(access.t(p) == "number", F.lit(False)) for p in compiled.integer_paths])
    renderer = v.Renderer(d, access)
    torn = F.col("line_reason").isin(*v.TORN) & ~F.col("terminated")
    reason = (F.when(torn, v.TORN_TAIL).when(F.col("line_reason").isNotNull(), F.col("line_reason"))
              .when(duplicate, "duplicate_member").when(integer, "integer_literal")
              .when(~renderer.valid(compiled.tree), "schema"))
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
