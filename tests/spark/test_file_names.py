"""Trace files whose names hold glob, URI and shell characters: every engine reads exactly the files ``inputs.locate``
lists (DuckDB and Spark both take a path for a glob pattern) and reports name those files.

Each hostile name sits next to the names its pattern would match (``n[1]`` by ``n1``, ``n{a,b}`` by ``na`` and
``nb``, ``n?x`` by ``nAx``, ``n*`` by all of them, ``n%41`` by ``nA`` once decoded), so reading the wrong file changes
the events and the violations, and the trace sits in a directory whose name starts with ``~`` and holds ``[1]``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from trace_testkit import Daemon, fingerprint, same_answers

from spark_checks import format as fmt
from spark_checks import oracle

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "traces" / "malformed"

NAMES = ["n[1]", "n1", "n{a,b}", "na", "nb", "n?x", "nAx", "n*", "n x", "n#h", "n%41", "nA", "n'q", 'n"q', "n;q",
         "n\\b", "né", "n,c", "n]c", "n}c"]
TOP = "~t [1]"  # a leading ~ (DuckDB expands it) and a bracket in a directory
BAD = "n[1]"  # repeats a seq on its last event
TORN = "n{a,b}"  # its file ends in a line that is not JSON: line 13, after 3 rows of 4 events


def write(root: Path) -> tuple[Path, Path]:
    """The trace as JSONL files and as a Parquet dataset (one file per node, named like the JSONL ones)."""
    jsonl, parquet = root / TOP / "jsonl", root / TOP / "parquet [2]{x,y}"
    parquet.mkdir(parents=True)
    for k, name in enumerate(NAMES):
        node = Daemon(name, mesh="m-names")
        for row in range(k % 3 + 1):
            node.done_row(f"01JRW{k:011d}{row:010d}", f"c-{k}-{row}", fingerprint(f"{name}/{row}"))
        if name == BAD:
            node.seq -= 1
            node.decision("c-again", fingerprint("again"), "none", None, "IPC-NEW", 202, None)
        path = node.write_jsonl(jsonl)
        if name == TORN:
            with path.open("a") as handle:
                handle.write("{not json\n")
        rows = [fmt.event_to_row(e, line) for line, e in enumerate(node.events)]
        pq.write_table(fmt.rows_to_table(rows), parquet / f"daemon-{name}.parquet")
    return jsonl, parquet


def check_names(report: Any, jsonl: str) -> None:
    """The violations and invalid lines a report must hold for the JSONL trace shown as ``jsonl``."""
    assert [(v.invariant, v.key) for v in report.violations] == [("TRC-SEQ-MONOTONIC", (("node", BAD),))]
    files = {e.get("file") for v in report.violations for e in v.evidence}
    assert files == {f"{jsonl}/daemon-{BAD}.jsonl"}, files
    assert [(e["where"], e["reason"]) for e in report.invalid] == [(f"{jsonl}/daemon-{TORN}.jsonl:13", "not_json")]


def test_the_oracle_and_duckdb_read_exactly_the_listed_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("duckdb")
    from spark_checks import duck

    write(tmp_path)
    monkeypatch.chdir(tmp_path)  # relative arguments: the first character DuckDB would see is the ~
    jsonl, parquet = f"{TOP}/jsonl", f"{TOP}/parquet [2]{{x,y}}"
    expected_events = sum(1 for f in (tmp_path / jsonl).iterdir() for line in f.read_text().splitlines()
                          if line.startswith('{"'))
    by_oracle = oracle.check(jsonl)
    check_names(by_oracle, jsonl)
    assert by_oracle.events == expected_events
    by_duck = duck.check(jsonl)
    assert same_answers(by_duck, by_oracle) == []
    assert by_duck.events == by_oracle.events
    check_names(by_duck, jsonl)
    by_oracle_pq, by_duck_pq = oracle.check(parquet), duck.check(parquet)
    assert [(v.invariant, v.key) for v in by_oracle_pq.violations] == [("TRC-SEQ-MONOTONIC", (("node", BAD),))]
    assert by_oracle_pq.events == expected_events
    assert same_answers(by_duck_pq, by_oracle_pq) == []
    assert by_duck_pq.events == by_oracle_pq.events


def test_the_library_reads_a_directory_as_the_engines_do(tmp_path: Path):
    """``format.read_jsonl`` given a directory reads the files ``meshtrace check`` reads, in its order: hidden names
    skipped, names in string order (a node split across ``a-b/`` and ``a/`` is numbered ``a-b/`` first, where path
    order puts ``a/`` first), so its ``line`` numbers are the engines'. It once listed every ``*.jsonl`` by path."""
    node = Daemon("n-split", mesh="m-names")
    for row in range(3):
        node.done_row(f"01JRW{row:021d}", f"c-{row}", fingerprint(str(row)))
    events = node.events
    (tmp_path / "t" / "a").mkdir(parents=True)
    (tmp_path / "t" / "a-b").mkdir()
    lines = [json.dumps(e) + "\n" for e in events]
    (tmp_path / "t" / "a-b" / "n.jsonl").write_text("".join(lines[:5]))
    (tmp_path / "t" / "a" / "n.jsonl").write_text("".join(lines[5:]))
    for hidden in ("_skipped.jsonl", ".skipped.jsonl"):
        (tmp_path / "t" / hidden).write_text(lines[0])
    read = fmt.read_jsonl([tmp_path / "t"])
    assert [(r["file"], r["seq"], r["line"]) for r in read.rows] == (
        [(f"{tmp_path}/t/a-b/n.jsonl", k, k) for k in range(5)]
        + [(f"{tmp_path}/t/a/n.jsonl", k, k) for k in range(5, len(events))])
    assert oracle.check(tmp_path / "t").violations == []


@pytest.mark.spark
def test_spark_reads_exactly_the_listed_files(spark, tmp_path: Path):
    from spark_checks.spark import SparkChecker

    jsonl, parquet = write(tmp_path)
    checker = SparkChecker(spark, limit=None)
    by_spark, by_oracle = checker.check(str(jsonl)), oracle.check(str(jsonl))
    check_names(by_oracle, str(jsonl))
    assert same_answers(by_spark, by_oracle) == []
    assert by_spark.events == by_oracle.events
    check_names(by_spark, str(jsonl))
    by_spark_pq, by_oracle_pq = checker.check(str(parquet)), oracle.check(str(parquet))
    assert same_answers(by_spark_pq, by_oracle_pq) == []
    assert by_spark_pq.events == by_oracle_pq.events


@pytest.mark.spark
def test_spark_refuses_a_file_name_with_a_colon_as_input(spark, tmp_path: Path):
    """Hadoop cannot open ``a:c.jsonl`` (its checksum file's relative name parses as a URI): exit 2 with the reason,
    before any job, while the oracle reads the file."""
    from spark_checks._spark_input import read
    from spark_checks.inputs import InputError

    (tmp_path / "daemon-a:c.jsonl").write_bytes((FIXTURES / "crlf.jsonl").read_bytes())
    with pytest.raises(InputError, match=r"daemon-a:c\.jsonl: Hadoop \(Spark\) cannot read a file whose name holds"):
        read(spark, [str(tmp_path)])
    assert oracle.check(tmp_path).events == 29
