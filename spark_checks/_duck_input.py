"""DuckDB's reading of a trace: JSONL and Parquet, validated in SQL by ``spark_checks.validity``'s rules.

Theory of operation. JSONL files are read as blobs (``read_blob``) and split at ``\\n``: a file that is valid UTF-8
is decoded whole; one that is not is split on its hex digits (an aligned ``0A``) and each line decoded on its own, so
``not_utf8`` is a line's reason, not the file's. The line rules run as one ``CASE`` over the text in the order of
``validity.REASONS``, with yyjson's ``json_valid`` plus two repairs -- it accepts NaN/Infinity and trailing commas,
which ``LAX_TOKENS`` refuses outside strings -- and the schema tree rendered over ``json_type``/``json_extract``.
The valid lines become the flat rows (``format.FLAT_SCHEMA``, plus ``file`` and ``file_line``) of table ``ev``.

A Parquet dataset is a view; the tree is rendered over its typed columns (a row's JSON view, ``validity``) and
``ev`` is the plain view when nothing is invalid, else the valid rows only. The (node, line) positions two rows
hold are grouped first (table ``shared``); their rows are ``layout``.

File names. DuckDB reads every path it is given as a glob (``*``, ``?`` and ``[...]`` match other files:
``daemon-n[1].jsonl`` reads ``daemon-n1.jsonl``) and expands a leading ``~``; DuckDB 2.0 has no setting or function
that opens a path as it is written, and its only escape, a one-character class such as ``[[]``, still lists the
directory and leaves names that are not UTF-8 unreadable. So DuckDB is never given a name from the trace: each file
``inputs.locate`` listed is reached through a symbolic link ``<k>.jsonl`` / ``<k>.parquet`` in a new temporary
directory whose path is checked to be plain (``_links``), and the link's number maps back to the listed file, whose
name is what reports show. A JSONL trace is read into tables at once and its links removed; a Parquet trace's view
reads through them until ``Loaded.close``.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

from . import format as fmt
from . import validity as v
from .inputs import InputError, LocalFS, Trace, check_local_parquet, locate


class DuckDialect(v.SqlDialect):
    def regex(self, a: str, pattern: str) -> str:
        return self._derived(f"regexp_matches({a}, {lit(pattern)})", a)


#: a DuckDB literal
lit = DuckDialect().lit


def _json_path(path: v.Path) -> str:
    return "$." + ".".join(path)


def _type_sql(json: str, path: v.Path) -> str:
    """The tree's JSON type of a member (null when absent)."""
    at = lit(_json_path(path))
    return (f"CASE WHEN json_type({json}, {at}) IS NULL THEN NULL ELSE CASE json_type({json}, {at}) "
            f"WHEN 'VARCHAR' THEN 'string' WHEN 'BIGINT' THEN 'integer' "
            f"WHEN 'UBIGINT' THEN CASE WHEN TRY_CAST(json_extract_string({json}, {at}) AS BIGINT) IS NOT NULL "
            f"THEN 'integer' ELSE 'number' END WHEN 'BOOLEAN' THEN 'boolean' WHEN 'NULL' THEN 'null' "
            f"WHEN 'OBJECT' THEN 'object' WHEN 'ARRAY' THEN 'array' ELSE 'number' END END")


class JsonAccess(v.Access):
    """Members of the JSON column ``j``; ``t<k>`` columns hold each path's type (``type_columns``)."""

    def __init__(self, paths: list[v.Path]):
        self.index = {path: k for k, path in enumerate(paths)}

    def _t(self, path: v.Path) -> str:
        return f"t{self.index[path]}" if path else "'object'"

    def present(self, path: v.Path) -> str:
        return f"({self._t(path)} IS NOT NULL)"

    def type_is(self, path: v.Path, types: tuple[str, ...]) -> str:
        return f"coalesce({self._t(path)} IN ({', '.join(lit(t) for t in types)}), false)"

    def string(self, path: v.Path) -> str:
        return f"json_extract_string(j, {lit(_json_path(path))})"

    def integer(self, path: v.Path) -> str:
        return f"TRY_CAST(json_extract_string(j, {lit(_json_path(path))}) AS BIGINT)"

    def boolean(self, path: v.Path) -> str:
        return f"TRY_CAST(json_extract_string(j, {lit(_json_path(path))}) AS BOOLEAN)"

    def unknown_member(self, path: v.Path, allowed: tuple[str, ...]) -> str:
        keys = f"json_keys(j, {lit(_json_path(path))})" if path else "json_keys(j)"
        names = "[" + ", ".join(lit(n) for n in allowed) + "]"
        return f"list_filter({keys}, lambda k: NOT list_contains({names}, k))[1]"


@dataclass
class Loaded:
    trace: Trace
    invalid: list[dict[str, Any]]
    reasons: dict[str, int]
    links: str | None = None  # the directory of links a Parquet trace's ``ev`` reads through

    def close(self) -> None:
        """Remove the links; call it once ``ev`` is no longer read (after closing the connection)."""
        if self.links:
            shutil.rmtree(self.links, ignore_errors=True)
            self.links = None


def load(con: Any, paths: list[str], listed: int = fmt.INVALID_LISTED) -> Loaded:
    """Create ``ev`` (the valid events) in ``con`` from the trace ``paths`` name; raises ``inputs.InputError``.
    The caller calls ``Loaded.close`` when done with ``ev``."""
    trace = locate(paths, LocalFS("duckdb"))
    if trace.is_jsonl:
        return _jsonl(con, trace, listed)
    check_local_parquet(trace.parquet_files)
    return _parquet(con, trace, listed)


#: a path DuckDB reads as it is written: absolute, no glob character, no ``~``, no quote, no backslash
_PLAIN = re.compile(r"/[A-Za-z0-9._/+=@%,:-]*")


def _links(files: list[str], suffix: str) -> tuple[str, list[str]]:
    """A new temporary directory holding a link ``<k><suffix>`` to the ``k``-th of ``files``, and those links."""
    directory = tempfile.mkdtemp(prefix="meshtrace-duckdb-files-")
    try:
        if not _PLAIN.fullmatch(directory):
            raise InputError(f"the temporary directory {directory} has characters DuckDB reads as a pattern; "
                             "set TMPDIR to a plain path")
        links = []
        for k, target in enumerate(files):
            links.append(os.path.join(directory, f"{k}{suffix}"))
            os.symlink(os.path.abspath(target), links[-1])
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return directory, links


def _parquet(con: Any, trace: Trace, listed: int) -> Loaded:
    directory, links = _links(trace.parquet_files, ".parquet")
    try:
        return _parquet_view(con, trace, listed, directory, links)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise


#: rows of a Parquet file read at once when finding which file DuckDB could not read
PROBE_ROWS = 10_000


def read_parquet(con: Any, statement: str, files: list[tuple[str, str]]) -> None:
    """Run a statement that only reads the trace's Parquet ``files`` ((link, name) pairs): DuckDB's error there (a
    corrupt page behind an intact footer) is about the input, an ``InputError`` naming the file, as the other
    engines report it. DuckDB's message does not say which file: on this failure each is read whole, alone, until
    one fails -- streamed in batches of `PROBE_ROWS` and dropped, so no file's size is held in memory (an error of
    memory would name a readable file)."""
    import duckdb

    try:
        con.execute(statement)
    except duckdb.Error as exc:
        for link, name in files:
            try:
                rows = con.execute(f"SELECT * FROM read_parquet({lit(link)})")
                while rows.fetchmany(PROBE_ROWS):
                    pass
            except duckdb.Error as alone:
                raise InputError(f"{name}: not a readable Parquet file ({_cause(alone)})") from None
        raise InputError(f"not a readable Parquet file ({_cause(exc)})") from None


def _cause(error: Exception) -> str:
    """DuckDB's reason a Parquet file is unreadable, in the other engines' words where they have some."""
    said = str(error).splitlines()[0]
    return fmt.NOT_UTF8_COLUMN if "not valid UTF8" in said else said


def _parquet_view(con: Any, trace: Trace, listed: int, directory: str, links: list[str]) -> Loaded:
    files = ", ".join(lit(f) for f in links)
    columns = ", ".join(fmt.COLUMNS)
    con.execute(f"CREATE VIEW ev_all AS SELECT {columns} FROM read_parquet([{files}], hive_partitioning = false)")
    renderer = v.Renderer(DuckDialect(), v.ParquetAccess(DuckDialect()))
    tree = v.compile_event().tree
    # the positions more than one row holds, over every file (a node's rows span files and datasets): all their rows
    # are ``layout``; with none (the rule) the judging is the plain rules
    named = list(zip(links, trace.parquet_files, strict=True))
    read_parquet(con, "CREATE TEMP TABLE shared AS SELECT node, line FROM ev_all WHERE node IS NOT NULL AND line >= 0 "
                      "GROUP BY node, line HAVING count(*) > 1", named)
    unplaced = "line IS NULL OR line < 0"
    if con.execute("SELECT count(*) FROM shared").fetchone()[0]:
        unplaced += " OR EXISTS (SELECT 1 FROM shared s WHERE s.node = ev_all.node AND s.line = ev_all.line)"
    valid = f"(NOT ({unplaced}) AND {renderer.valid(tree)})"
    reason = f"CASE WHEN {unplaced} THEN 'layout' ELSE 'schema' END"
    message = (f"CASE WHEN {unplaced} THEN 'line: ' || coalesce(CAST(line AS VARCHAR), 'null') || ' ' || CASE "
               f"WHEN line IS NULL OR line < 0 THEN {lit(v.NOT_A_POSITION)} ELSE {lit(v.SHARED_POSITION)} END "
               f"ELSE {renderer.explain(tree)} END")
    read_parquet(con, f"CREATE TEMP TABLE bad AS SELECT coalesce(node, 'null') || '@line ' || "
                      f"coalesce(CAST(line AS VARCHAR), 'null') AS \"where\", {reason} AS reason, "
                      f"{message} AS message, node, line FROM ev_all WHERE NOT {valid}", named)
    reasons = dict(con.execute("SELECT reason, count(*) FROM bad GROUP BY reason").fetchall())
    invalid = [{"where": w, "reason": r, "message": m} for w, r, m in con.execute(
        f"SELECT \"where\", reason, message FROM bad ORDER BY node NULLS FIRST, line NULLS FIRST LIMIT {listed}"
    ).fetchall()]
    con.execute(f"CREATE VIEW ev AS SELECT * FROM ev_all{f' WHERE {valid}' if reasons else ''}")
    return Loaded(trace, invalid, reasons, directory)


def _jsonl(con: Any, trace: Trace, listed: int) -> Loaded:
    directory, links = _links([f.location for f in trace.jsonl], ".jsonl")
    try:
        con.execute("CREATE TEMP TABLE files (fi INTEGER, location VARCHAR, display VARCHAR)")
        con.executemany("INSERT INTO files VALUES (?, ?, ?)",
                        [(k, link, f.display) for k, (f, link) in enumerate(zip(trace.jsonl, links, strict=True))])
        locations = ", ".join(lit(link) for link in links)
        # the lines of each file: decoded whole when the file is UTF-8, else line by line from its hex digits
        con.execute(f"""
            CREATE TEMP TABLE parts AS
            SELECT f.fi, CASE WHEN try(decode(b.content)) IS NOT NULL THEN string_split(decode(b.content), chr(10))
                              ELSE list_transform(string_split(regexp_replace(hex(b.content),
                                     '((?:[0-9A-F]{{2}})*?)0A', '\\1|', 'g'), '|'),
                                   lambda h: try(decode(unhex(h)))) END AS parts
            FROM read_blob([{locations}]) b JOIN files f ON b.filename = f.location""")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    con.execute("""
        CREATE TEMP TABLE raw AS
        SELECT fi, n, text, n < total AS terminated FROM (
          SELECT fi, unnest(parts) AS text, unnest(range(1, len(parts) + 1)) AS n, len(parts) AS total FROM parts)
        WHERE NOT (n = total AND text IS NOT DISTINCT FROM '')""")
    lone = (f"regexp_matches(regexp_replace(regexp_replace(text, {lit(v.ESCAPED_BACKSLASH)}, '__', 'g'), "
            f"{lit(v.SURROGATE_PAIR)}, '__', 'g'), {lit(v.SURROGATE)})")
    def openings(text: str) -> str:
        return f"length(regexp_replace({text}, {lit(v.NOT_OPENING)}, '', 'g')) > {v.MAX_CONTAINERS}"

    blanked = (f"regexp_replace(regexp_replace(text, {lit(v.ESCAPE_PATTERN)}, '__', 'g'), "
               f"{lit(v.PLAIN_STRING_PATTERN)}, '\"\"', 'g')")
    nesting = f"({openings('text')} AND {openings(blanked)})"
    digits = lit(v.LONG_DIGITS_PATTERN)
    long_number = f"(regexp_matches(text, {digits}) AND regexp_matches({blanked}, {digits}))"
    lax = f"regexp_matches(regexp_replace(text, {lit(v.STRING_PATTERN)}, '\"\"', 'g'), {lit(v.LAX_TOKENS)})"
    con.execute(f"""
        CREATE TEMP TABLE lines AS
        SELECT fi, n, text, terminated, CASE
            WHEN text IS NULL THEN 'not_utf8'
            WHEN regexp_full_match(text, {lit(v.BLANK_PATTERN[1:-1])}) THEN 'blank'
            WHEN starts_with(text, chr(65279)) THEN 'bom'
            WHEN {lone} THEN 'lone_surrogate'
            WHEN {nesting} THEN 'nesting'
            WHEN {long_number} THEN 'long_number'
            WHEN NOT json_valid(text) THEN 'not_json'
            WHEN {lax} THEN 'not_json'
            WHEN json_type(text) <> 'OBJECT' THEN 'not_object'
          END AS reason
        FROM raw""")
    compiled = v.compile_event()
    paths = sorted(set(v.leaf_paths(compiled.tree)) | set(compiled.integer_paths)
                   | {p for p in compiled.object_paths if p})
    access = JsonAccess(paths)
    types = ", ".join(f"{_type_sql('j', p)} AS t{k}" for k, p in enumerate(paths))
    con.execute(f"""
        CREATE TEMP TABLE parsed AS
        SELECT fi, n, j, {types} FROM (SELECT fi, n, CAST(text AS JSON) AS j FROM lines WHERE reason IS NULL)""")
    duplicate = " OR ".join(
        f"coalesce(len(json_keys(j{', ' + lit(_json_path(p)) if p else ''})) <> "
        f"len(list_distinct(json_keys(j{', ' + lit(_json_path(p)) if p else ''}))), false)"
        for p in compiled.object_paths)
    integer = " OR ".join(f"coalesce({access._t(p)} = 'number', false)" for p in compiled.integer_paths)
    renderer = v.Renderer(DuckDialect(), access)
    con.execute(f"""
        CREATE TEMP TABLE judged AS
        SELECT fi, n, j, CASE WHEN {duplicate} THEN 'duplicate_member' WHEN {integer} THEN 'integer_literal'
                              WHEN NOT {renderer.valid(compiled.tree)} THEN 'schema' END AS reason,
               CASE WHEN {duplicate} THEN 'a member name appears twice in the event or its effects'
                    WHEN {integer} THEN {_integer_message(compiled, access)}
                    ELSE {renderer.explain(compiled.tree)} END AS message
        FROM parsed""")
    torn = ", ".join(lit(r) for r in v.TORN)
    con.execute(f"""
        CREATE TEMP TABLE bad AS
        SELECT l.fi, l.n, f.display || ':' || l.n AS "where",
               CASE WHEN l.reason IN ({torn}) AND NOT l.terminated THEN {lit(v.TORN_TAIL)}
                    ELSE coalesce(l.reason, j.reason) END AS reason,
               CASE WHEN l.reason IN ({torn}) AND NOT l.terminated THEN {lit(v.TORN_MESSAGE)}
                    WHEN l.reason IS NOT NULL THEN {_line_messages()} ELSE j.message END AS message
        FROM lines l JOIN files f USING (fi) LEFT JOIN judged j USING (fi, n)
        WHERE l.reason IS NOT NULL OR j.reason IS NOT NULL""")
    reasons = dict(con.execute("SELECT reason, count(*) FROM bad GROUP BY reason").fetchall())
    invalid = [{"where": w, "reason": r, "message": m} for w, r, m in con.execute(
        f"SELECT \"where\", reason, message FROM bad ORDER BY fi, n LIMIT {listed}").fetchall()]
    con.execute(f"""
        CREATE TEMP TABLE ev AS
        SELECT * EXCLUDE (fi) REPLACE (
            CAST(row_number() OVER (PARTITION BY node ORDER BY fi, file_line) - 1 AS BIGINT) AS line)
        FROM (SELECT fi, {', '.join(_flat_columns())}, f.display AS file, p.n AS file_line
              FROM judged p JOIN files f USING (fi) WHERE p.reason IS NULL)""")
    return Loaded(trace, invalid, reasons)


def _line_messages() -> str:
    return "CASE l.reason " + " ".join(f"WHEN {lit(r)} THEN {lit(text)}" for r, text in v.REASONS.items()) + " END"


def _integer_message(compiled: v.Compiled, access: JsonAccess) -> str:
    return "CASE " + " ".join(f"WHEN coalesce({access._t(p)} = 'number', false) THEN "
                              f"{lit(v.member(p) + ': ' + v.REASONS['integer_literal'])}"
                              for p in compiled.integer_paths) + " END"


def _flat_columns() -> list[str]:
    """SQL for each ``FLAT_SCHEMA`` column from the JSON event ``j`` (``line`` is numbered afterwards)."""
    sql = {"int8": "TINYINT", "int32": "INTEGER", "int64": "BIGINT", "bool": "BOOLEAN", "string": "VARCHAR"}
    out = []
    for path, column in v.member_columns().items():
        text = f"json_extract_string(j, {lit(_json_path(path))})"
        kind = str(fmt.FLAT_SCHEMA.field(column).type)
        value = f"unhex({text})" if column == "request_fingerprint" else f"CAST({text} AS {sql[kind]})"
        out.append(f"{value} AS {column}")
    out.insert(fmt.COLUMNS.index("line"), "CAST(NULL AS BIGINT) AS line")
    return out
