"""Input validity: every engine reports exactly the invalid lines of fixtures/traces/malformed with their reasons,
and ``meshtrace check`` exits as _expected.json says, plain and with --tolerate; Parquet rows are judged by the same
rules; the schema compiler agrees with jsonschema and refuses what it does not translate."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_checks import format as fmt
from spark_checks import validity
from spark_checks.cli import main as meshtrace
from spec import SCHEMA_BASE, fast_validator, schema_registry

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "traces" / "malformed"
CASES = json.loads((CORPUS / "_expected.json").read_text())["cases"]
LEVELS = ("plain", "torn-tail", "invalid")


def wanted(case: dict) -> list[tuple[str, str]]:
    return [(f"{CORPUS}/{case['file']}:{e['line']}", e["reason"]) for e in case["invalid"]]


def run(argv: list[str], report: Path) -> tuple[int, dict | None]:
    code = meshtrace([*argv, "--report", str(report)])
    document = json.loads(report.read_text()) if report.exists() else None
    if report.exists():
        report.unlink()
    return code, document


def check_percent_encoded(tmp_path: Path, check) -> None:
    """A ``file:`` URI names the local path its percent-escapes decode to, for the trace and for the report: the
    dataset ``t`` and one of its files as ``…/bucket%3D00/…`` are read once, the report lands in ``a report.json``.
    ``check`` runs ``meshtrace check`` with its arguments and one engine."""
    part = next((tmp_path / "t" / "events").rglob("*.parquet"))
    uri = "file://" + quote(str(part))
    assert "%3D" in uri
    report = tmp_path / "a report.json"
    assert check([f"file://{tmp_path}/t", uri, "--report", "file://" + quote(str(report))]) == 0
    assert json.loads(report.read_text())["events"] == 29


#: the cases DuckDB also runs one by one through the CLI (it reads the whole corpus at once in another test)
SAMPLE = ("misspelt_kind", "truncated_eof", "two_objects", "crlf", "empty_file", "blank_lines_only")


@pytest.mark.parametrize("engine, case", [("oracle", c) for c in CASES] + [("duckdb", c) for c in CASES
                                                                          if c["id"] in SAMPLE],
                         ids=[f"oracle-{c['id']}" for c in CASES] + [f"duckdb-{i}" for i in SAMPLE])
def test_each_malformed_trace_is_reported_line_by_line(tmp_path: Path, capsys, engine: str, case: dict):
    path = str(CORPUS / case["file"])
    exits = {}
    for level in LEVELS:
        code, document = run(["check", path, "--engine", engine, *(["--tolerate", level] if level != "plain" else [])],
                             tmp_path / "report.json")
        exits[level] = code
        if document is not None:
            assert [(e["where"], e["reason"]) for e in document["invalid"]["lines"]] == wanted(case)
            assert document["invalid"]["count"] == len(case["invalid"])
        else:
            assert case["file"] == "empty_file.jsonl"  # nothing to read is a usage error, no report
    assert exits == case["exit"]
    assert "Traceback" not in capsys.readouterr().err


def test_duckdb_reports_every_malformed_line_in_one_read():
    import duckdb

    from spark_checks._duck_input import load

    con = duckdb.connect()
    loaded = load(con, [str(CORPUS)], listed=1000)
    every = sorted(pair for case in CASES for pair in wanted(case))  # file order; no file has a line 10 before 9
    assert [(e["where"], e["reason"]) for e in loaded.invalid] == every
    crlf = con.execute("SELECT line, file_line FROM ev WHERE file = ? ORDER BY line",
                       [f"{CORPUS}/crlf.jsonl"]).fetchall()
    assert crlf == [(k, k + 1) for k in range(29)]


def test_validate_uses_the_same_rules_and_exit_codes(capsys):
    assert meshtrace(["validate", str(CORPUS / "status_fraction.jsonl")]) == 2
    assert f"{CORPUS}/status_fraction.jsonl:6: integer_literal: http_status" in capsys.readouterr().out
    assert meshtrace(["validate", str(CORPUS / "truncated_eof.jsonl"), "--tolerate", "torn-tail"]) == 0
    assert meshtrace(["validate", str(CORPUS / "crlf.jsonl")]) == 0


def test_messages_name_the_member_and_the_rule():
    from spark_checks import duck

    messages = {case: duck.check(str(CORPUS / f"{case}.jsonl")).invalid[0]["message"] for case in
                ("done_without_message", "extra_member", "broker_status_not", "seq_missing", "fingerprint_upper")}
    assert messages == {
        "done_without_message": "broker_message_id: must be string (type)",
        "extra_member": "extra: member not allowed (additionalProperties: false)",
        "broker_status_not": "status: must be 201 (const)",
        "seq_missing": "seq: required member missing",
        "fingerprint_upper": "request_fingerprint: must match ^[0-9a-f]{64}$ (pattern)",
    }


# --- Parquet ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def parquet_cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[tuple[str, str]]]]:
    """The mesh fixture as Parquet with one defect each, and the (where, reason) every engine must report."""
    root = tmp_path_factory.mktemp("parquet-cases")
    rows = fmt.read_jsonl([Path(__file__).resolve().parents[2] / "fixtures" / "traces" / "mesh"]).rows
    table = fmt.rows_to_table(rows)
    first = {kind: next(k for k, r in enumerate(rows) if r["kind"] == kind)
             for kind in ("outbox_transition", "sse_event", "accept_commit", "delivery")}

    def where(index: int, line: int | None = None) -> str:
        return f"{rows[index]['node']}@line {rows[index]['line'] if line is None else line}"

    made = {}
    for name, index, column, value, reason in (
            ("bad_enum", first["outbox_transition"], "table_row", "OB-BOGUS", "schema"),
            ("null_seq", first["sse_event"], "seq", None, "schema"),
            ("extra_member", first["sse_event"], "mesh", "m", "schema"),
            ("null_effects", first["accept_commit"], "effects_dedupe", None, "schema"),
            ("negative_line", first["delivery"], "line", -1, "layout")):
        changed = table.to_pylist()
        changed[index][column] = value
        fmt.write_dataset(pa.Table.from_pylist(changed, schema=fmt.FLAT_SCHEMA), root / name, 4)
        made[name] = (root / name, [(where(index, -1 if column == "line" else None), reason)])
    wrong = table.set_column(fmt.COLUMNS.index("seq"), "seq", pa.array([str(s) for s in table["seq"].to_pylist()]))
    (root / "wrong_type").mkdir()
    pq.write_table(wrong, root / "wrong_type" / "part-0.parquet")
    made["wrong_type"] = (root / "wrong_type", [])
    made.update(_shared_line_cases(root, rows))
    return made


#: the Parquet cases with nothing invalid (exit 0)
VALID_PARQUET = ("another_nodes_line",)


@pytest.fixture(scope="module")
def string_cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The mesh fixture as one Parquet file with a string column's bytes not UTF-8 (``bad_*``: unreadable to every
    engine, a usage error naming the file), or a string column in another Arrow layout (``layout_*``: the same
    Parquet strings, read as they are)."""
    root = tmp_path_factory.mktemp("string-cases")
    rows = fmt.read_jsonl([Path(__file__).resolve().parents[2] / "fixtures" / "traces" / "mesh"]).rows
    table = fmt.rows_to_table(rows)
    made = {}

    def write(name: str, changed: pa.Table) -> None:
        (root / name).mkdir()
        pq.write_table(changed, root / name / "part-0.parquet")
        made[name] = root / name / "part-0.parquet"

    for name, kind, column, raw in (("bad_node", "sse_event", "node", b"daemon-\xff"),
                                    ("bad_mesh_surrogate", "accept_commit", "mesh", b"m\xed\xa0\x80"),
                                    ("bad_client_message_id", "outbox_transition", "client_message_id", b"\xc3(")):
        index = next(k for k, r in enumerate(rows) if r["kind"] == kind)
        values = [None if v is None else v.encode() for v in table[column].to_pylist()]
        values[index] = raw
        column_index = fmt.COLUMNS.index(column)
        write(name, table.set_column(column_index, column, pa.array(values, pa.binary()).view(pa.string())))
    write("layout_large_string", table.set_column(fmt.COLUMNS.index("node"), "node",
                                                  table["node"].cast(pa.large_string())))
    write("layout_string_view", table.set_column(fmt.COLUMNS.index("kind"), "kind",
                                                 table["kind"].cast(pa.string_view())))
    return made


def check_string_cases(string_cases: dict[str, Path], check, err) -> None:
    """``check(argv)`` runs ``meshtrace check`` with one engine and ``err()`` reads what it printed to stderr."""
    for name, path in string_cases.items():
        if name.startswith("layout_"):
            assert check([str(path.parent)]) == 0, name
            continue
        for tolerate in ([], ["--tolerate", "invalid"]):
            assert check([str(path.parent), *tolerate]) == 2, name
            said = err()
            assert f"{path}: not a readable Parquet file (a string column holds bytes that are not UTF-8)" in said, \
                (name, said)
            assert "Traceback" not in said


def _shared_line_cases(root: Path, rows: list[dict]) -> dict[str, tuple[Path, list[tuple[str, str]]]]:
    """(node, line) positions held by more than one row: every one of those rows is ``layout``, within one file,
    across two buckets' files and three times over; a line another node holds too, and rows without a node, are
    not shared."""
    daemon = [k for k, r in enumerate(rows) if r["node"] == "daemon-04f40bdd6421836c"]
    i, j, k = daemon[3], daemon[4], daemon[5]
    line = rows[i]["line"]
    shared = f"daemon-04f40bdd6421836c@line {line}"

    def changed(changes: dict[int, dict]) -> list[dict]:
        return [{**r, **changes.get(n, {})} for n, r in enumerate(rows)]

    def write(name: str, files: list[list[dict]]) -> Path:
        for n, part in enumerate(files):
            (root / name / f"bucket={n:02d}").mkdir(parents=True)
            pq.write_table(pa.Table.from_pylist(part, schema=fmt.FLAT_SCHEMA),
                           root / name / f"bucket={n:02d}" / "part-0.parquet")
        return root / name

    one = changed({j: {"line": line}})
    three = changed({j: {"line": line}, k: {"line": line}})
    ends = {max(n for n, r in enumerate(rows) if r["node"] == node): {"line": 1000}
            for node in ("broker", "daemon-04f40bdd6421836c")}
    nameless = changed({i: {"node": None}, j: {"node": None, "line": line}})
    # the line above and below one row's, moved onto it: the node's count, range and sum of lines are unchanged
    at = {r["line"]: n for n, r in enumerate(rows) if r["node"] == "daemon-04f40bdd6421836c"}
    middle = rows[daemon[10]]["line"]
    kept = changed({at[middle - 1]: {"line": middle}, at[middle + 1]: {"line": middle}})
    return {
        "shared_line_one_file": (write("shared_line_one_file", [one]), [(shared, "layout")] * 2),
        "shared_line_two_files": (write("shared_line_two_files", [one[:j] + one[j + 1:], [one[j]]]),
                                  [(shared, "layout")] * 2),
        "line_held_three_times": (write("line_held_three_times", [three[:k], three[k:]]), [(shared, "layout")] * 3),
        "another_nodes_line": (write("another_nodes_line", [changed(ends)]), []),
        "sum_kept_three_times": (write("sum_kept_three_times", [kept]),
                                 [(f"daemon-04f40bdd6421836c@line {middle}", "layout")] * 3),
        "nameless_rows_one_line": (write("nameless_rows_one_line", [nameless]), [(f"null@line {line}", "schema")] * 2),
    }


@pytest.mark.parametrize("engine", ["oracle", "duckdb"])
def test_parquet_rows_are_judged_by_the_same_rules(parquet_cases, tmp_path: Path, capsys, engine: str):
    for name, (path, want) in parquet_cases.items():
        code, document = run(["check", str(path), "--engine", engine], tmp_path / "report.json")
        assert code == (0 if name in VALID_PARQUET else 2), name
        if name == "wrong_type":
            assert document is None
            assert "column seq is string, expected int64" in capsys.readouterr().err
        else:
            assert [(e["where"], e["reason"]) for e in document["invalid"]["lines"]] == want, name
            assert document["invalid"]["count"] == len(want), name


@pytest.mark.parametrize("engine", ["oracle", "duckdb"])
def test_a_string_not_utf8_makes_its_file_unreadable_and_string_layouts_are_strings(string_cases, capsys,
                                                                                     engine: str):
    check_string_cases(string_cases, lambda argv: meshtrace(["check", *argv, "--engine", engine]),
                       lambda: capsys.readouterr().err)
    assert meshtrace(["validate", str(string_cases["bad_node"].parent)]) == 2


def tree_cases(root: Path) -> dict[str, tuple[Path, str]]:
    """Trace directories holding an entry no engine would read alike, and what every engine says of it (exit 2): a
    file name that is not UTF-8, a symbolic link to nothing, a symbolic link to a directory -- inside a
    subdirectory too; each beside a valid file. The first two are skipped under a name starting with ``_``; a link
    to a directory is refused there too (Hadoop would follow it, here into a loop: it links to the tree's parent)."""
    line = json.dumps({"v": 1, "source": "daemon", "node": "n", "seq": 0, "ts_ms": 1, "kind": "sse_event",
                       "event_id": 1, "event": "peer_join"}).encode() + b"\n"
    made = {}
    for name, deeper in (("flat", ""), ("nested", "sub/")):
        cases = {"not_utf8": lambda d: (d / "daemon-\udcff.jsonl").write_bytes(line),
                 "dangling": lambda d: (d / "x.jsonl").symlink_to(root / "nowhere.jsonl"),
                 "directory_link": lambda d: (d / "linked").symlink_to(root, target_is_directory=True)}
        says = {"not_utf8": "daemon-\\xff.jsonl: a name that is not UTF-8 (Spark's Hadoop cannot list it); rename it",
                "dangling": "x.jsonl: a symbolic link to nothing",
                "directory_link": "linked: a symbolic link to a directory inside a trace directory"}
        for case, make in cases.items():
            trace = root / f"{name}-{case}"
            (trace / deeper).mkdir(parents=True)
            (trace / "a.jsonl").write_bytes(line)
            make(trace / deeper)
            made[f"{name}-{case}"] = (trace, f"{trace}/{deeper}{says[case]}")
            skipped = root / f"{name}-{case}-skipped"
            (skipped / "_hidden" / deeper).mkdir(parents=True)
            (skipped / "a.jsonl").write_bytes(line)
            make(skipped / "_hidden" / deeper)
            made[f"{name}-{case}-skipped"] = (skipped, f"{skipped}/_hidden/{deeper}{says[case]}"
                                                 if case == "directory_link" else "")
    return made


def check_tree_cases(root: Path, check, err) -> None:
    for name, (trace, says) in tree_cases(root).items():
        code = check([str(trace)])
        said = err()
        if not says:  # skipped, as every name starting with _ is
            assert code == 0, (name, said)
            continue
        assert code == 2, name
        assert f"meshtrace check: {says}" in said, (name, said)
        assert "Traceback" not in said


@pytest.mark.parametrize("engine", ["oracle", "duckdb"])
def test_a_tree_entry_no_engine_reads_alike_is_a_usage_error(tmp_path: Path, capsys, engine: str):
    check_tree_cases(tmp_path, lambda argv: meshtrace(["check", *argv, "--engine", engine]),
                     lambda: capsys.readouterr().err)


@pytest.mark.parametrize("engine", ["oracle", "duckdb"])
def test_rows_sharing_a_line_are_left_out_when_tolerated(parquet_cases, tmp_path: Path, engine: str):
    for name in ("shared_line_one_file", "shared_line_two_files", "line_held_three_times"):
        path, want = parquet_cases[name]
        code, document = run(["check", str(path), "--engine", engine, "--tolerate", "invalid"],
                             tmp_path / "report.json")
        assert code in (0, 1) and document["events"] == 259 - len(want), name
        line = int(want[0][0].rsplit(" ", 1)[1])
        assert {e["message"] for e in document["invalid"]["lines"]} == {validity.layout_message(line)}, name
        assert document["invalid"]["reasons"] == {"layout": len(want)}, name


# --- the compiler ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("schema, complaint", [
    ({"type": "string", "format": "date-time"}, "format"),
    ({"type": "object", "patternProperties": {"^x": {}}}, "patternProperties"),
    ({"type": "number"}, "type ['number']"),
    ({"type": "string", "pattern": "^\\d+$"}, "construct not translated"),
    ({"const": 1.5}, "const/enum value 1.5"),
    ({"type": "object", "additionalProperties": {"type": "string"}}, "additionalProperties other than false"),
])
def test_the_compiler_refuses_what_it_does_not_translate(schema: dict, complaint: str):
    base = SCHEMA_BASE + "trace/event.json"
    with pytest.raises(validity.SchemaNotUnderstood, match=complaint.replace("[", r"\[").replace("]", r"\]")):
        validity._Compiler(schema_registry(), base).compile(schema, (), base, "test")


def test_the_tree_and_jsonschema_agree_on_mutated_events():
    tree = validity.compile_event().tree
    # jsonschema-rs, an implementation of JSON Schema independent of the tree, asked for its verdict alone (is_valid
    # hands every instance it refuses to the Python reference validator for errors, the cost of the test)
    check = fast_validator("trace/event")
    mesh = Path(__file__).resolve().parents[2] / "fixtures" / "traces" / "mesh"
    events = [json.loads(line) for f in sorted(mesh.glob("*.jsonl")) for line in f.read_text().splitlines()]
    values = [None, "", "x", 0, -1, 1, 202, 409, 2**44, 2**31, True, [], {}, "none", "done", "pending", "B1",
              "BRK-ACCEPT", "IPC-NEW", "OB-PENDING-REQUEUE", "requeue", "0" * 64, "01ARZ3NDEKTSV4RRFFQ69G5FAV",
              "a" * 129, "sse_event", "<absent>"]
    rng = random.Random(12)
    disagreements = []
    for event in rng.sample(events, 60):
        for name in [*event, "extra"]:
            for value in values:
                mutated = dict(event)
                if value == "<absent>":
                    mutated.pop(name, None)
                else:
                    mutated[name] = value
                if validity.evaluate(tree, mutated) != check.verdict(mutated):
                    disagreements.append((name, value, event["kind"]))
    assert disagreements == []


def test_a_hex_pattern_on_bytes_is_their_length():
    """``SqlDialect.matches`` on the lowercase hex of bytes is ``octet_length``: the same answer as the regular
    expression for null and for bytes of every length up to 40, and only for a pattern of lowercase hex digits."""
    import duckdb

    from spark_checks._duck_input import DuckDialect

    d, pattern = DuckDialect(), r"^[0-9a-f]{64}\z"
    hexed = d.hex_lower(d.col("b"))
    fast, slow = d.matches(hexed, pattern), d.regex(hexed, pattern)
    assert "octet_length" in fast and "regexp" not in fast
    assert "regexp" in d.matches(hexed, pattern.upper()) and "regexp" in d.matches(d.col("b"), pattern)
    values = [None] + [bytes(random.Random(n).randrange(256) for _ in range(n)) for n in range(41)]
    connection = duckdb.connect()
    connection.register("blobs", pa.table({"b": pa.array(values, pa.binary())}))
    found = connection.sql(f"SELECT {fast} AS fast, {slow} AS slow FROM blobs").fetchall()
    assert len(found) == 42 and all(a == b for a, b in found)
    assert found[0] == (None, None) and [n for n, (a, _) in enumerate(found) if a] == [33]


def test_integer_members_come_from_the_schema():
    compiled = validity.compile_event()
    assert ("seq",) in compiled.integer_paths and ("effects", "dedupe") in compiled.integer_paths
    assert ("node",) not in compiled.integer_paths
    assert compiled.object_paths == ((), ("effects",))


# --- paths and URIs ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("engine", ["oracle", "duckdb"])
def test_other_schemes_are_a_clear_usage_error(capsys, engine: str):
    assert meshtrace(["check", "s3a://bucket/trace", "--engine", engine]) == 2
    assert f"the {engine} engine reads local paths and file:// URIs only" in capsys.readouterr().err


@pytest.mark.parametrize("engine", ["oracle", "duckdb"])
def test_file_uris_and_trace_directories(tmp_path: Path, engine: str):
    read = fmt.convert_jsonl([CORPUS / "crlf.jsonl"], tmp_path / "t" / "events")
    assert len(read.rows) == 29
    code, document = run(["check", f"file://{tmp_path}/t", "--engine", engine], tmp_path / "report.json")
    assert (code, document["events"]) == (0, 29)
    assert meshtrace(["check", str(tmp_path / "empty"), "--engine", engine]) == 2
    # one dataset named three ways, one JSONL file named twice: each file is read once
    again = [f"file://{tmp_path}/t", str(tmp_path / "t" / "events"), f"{tmp_path}/t/../t"]
    code, document = run(["check", *again, "--engine", engine], tmp_path / "report.json")
    assert (code, document["events"], document["invalid"]["count"]) == (0, 29, 0)
    check_percent_encoded(tmp_path, lambda argv: meshtrace(["check", *argv, "--engine", engine]))
    jsonl = CORPUS / "crlf.jsonl"
    code, document = run(["check", str(jsonl), f"file://{jsonl}", "--engine", engine], tmp_path / "report.json")
    assert (code, document["events"]) == (0, 29)
    (tmp_path / "linked").mkdir()  # a hard link is the same file under another path
    for f in (tmp_path / "t" / "events").rglob("*.parquet"):
        os.link(f, tmp_path / "linked" / f"{f.parent.name}-{f.name}")
    code, document = run(["check", str(tmp_path / "t"), str(tmp_path / "linked"), "--engine", engine],
                         tmp_path / "report.json")
    assert (code, document["events"]) == (0, 29)
    # trace files beside a trace directory's events/ would go unread: a usage error
    shutil.copytree(tmp_path / "t" / "events", tmp_path / "t" / "stray")
    assert meshtrace(["check", str(tmp_path / "t"), "--engine", engine]) == 2


# --- Spark -------------------------------------------------------------------------------------------------------

def _position_rows(nodes: dict[str, list[int]]) -> list[dict]:
    """``position_aggregates``' rows for nodes' lines, one row per line (as if each were a group of its own)."""
    from spark_checks import _spark_input

    return [{"pnode": node, "pn": 1, "pmin": x, "pmax": x, "psum": x,
             **{f"phash{k}": _spark_input._range_hash(x, x, salt) for k, salt in enumerate(_spark_input.SALTS)}}
            for node, lines in nodes.items() for x in lines]


#: a hostile pass's lines (node broker-m3-0001 of ``meshtrace generate --events 2000 --seed 3``, lines 0..372): the
#: rows at the -1 lines moved onto the others, found by lattice reduction to keep the count, the span, the plain sum
#: and an unsalted splitmix64 sum -- 15 lines held 2-4 times
LATTICE_MOVES = {2: 2, 3: 1, 4: -1, 7: -1, 8: -1, 10: -1, 11: 1, 12: -1, 13: 1, 14: -1, 16: -1, 18: 1, 20: -1, 22: 1,
                 23: 1, 24: -1, 26: -1, 27: 1, 28: 1, 30: 1, 34: -1, 36: -1, 37: -1, 38: 3, 39: 1, 42: -1, 43: -1,
                 45: 1, 46: -1, 50: 1, 51: -1, 55: -1, 58: 1}


def test_a_node_is_crowded_exactly_when_its_lines_are_not_their_range_once():
    import random

    from spark_checks._spark_input import crowded_nodes

    pick = random.Random(5)
    for _ in range(400):
        low, size = pick.choice([0, 1, 7, 1 << 40]), pick.randint(1, 12)
        lines = list(range(low, low + size))
        for _ in range(pick.randint(0, 3)):  # duplicate, drop or move lines, sums kept or not
            k = pick.randrange(len(lines))
            lines[k] = pick.choice([lines[pick.randrange(len(lines))], max(0, lines[k] + pick.randint(-2, 2))])
        want = {"n"} if sorted(lines) != list(range(min(lines), max(lines) + 1)) else set()
        assert crowded_nodes(_position_rows({"n": lines, "other": [3, 4, 5]})) == want, lines
    # sums kept by moving the lines above and below onto the middle: only the mixed sums differ
    assert crowded_nodes(_position_rows({"n": [0, 2, 2, 2, 4]})) == {"n"}
    moved = [x for x in range(373) if LATTICE_MOVES.get(x) != -1]
    moved += [x for x, k in LATTICE_MOVES.items() if k > 0 for _ in range(k)]
    assert (len(moved), sum(moved)) == (373, sum(range(373))) and max(moved) == 372
    assert crowded_nodes(_position_rows({"n": moved})) == {"n"}


def test_the_mixed_sums_are_salted_by_each_run():
    """Unsalted, the lattice moves above cancel the mixed sum: a trace could be written to pass; each run draws
    its salts after the trace is written."""
    import subprocess
    import sys

    from spark_checks import _spark_input

    mix = _spark_input._range_hash
    unsalted = [x for x in range(373) if LATTICE_MOVES.get(x) != -1]
    unsalted += [x for x, k in LATTICE_MOVES.items() if k > 0 for _ in range(k)]
    assert sum(mix(x, x, 0) for x in unsalted) % _spark_input.WORD == mix(0, 372, 0)
    drawn = {subprocess.run([sys.executable, "-c", "from spark_checks._spark_input import SALTS; print(SALTS)"],
                            capture_output=True, text=True, check=True).stdout for _ in range(2)}
    assert len(drawn) == 2
