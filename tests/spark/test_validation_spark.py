"""Input validity with Spark: the same corpus, Parquet cases and exit codes as test_validation.py holds the oracle
and DuckDB to. A file of its own so that those run on any pytest worker while these share the Spark session's
(tests/conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_validation import (  # noqa: F401 (parquet_cases and string_cases are fixtures)
    CASES,
    CORPUS,
    VALID_PARQUET,
    check_percent_encoded,
    check_string_cases,
    check_tree_cases,
    parquet_cases,
    run,
    string_cases,
    wanted,
)

from spark_checks import format as fmt
from spark_checks import validity
from spark_checks.cli import main as meshtrace


@pytest.mark.spark
def test_spark_mixes_lines_as_the_driver_does(spark):
    from pyspark.sql import functions as F

    from spark_checks import _spark_input

    for low, high in ((0, 1000), (1 << 43, (1 << 43) + 5000), ((1 << 63) - 3000, (1 << 63) - 2)):
        for salt in (*_spark_input.SALTS, 0, _spark_input.WORD - 1):
            got = spark.range(low, high + 1).select(F.sum(_spark_input._mix(F.col("id"), salt)).alias("h")).first()
            assert got["h"] % _spark_input.WORD == _spark_input._range_hash(low, high, salt)


@pytest.mark.spark
def test_spark_reports_every_malformed_line_in_one_read(spark):
    from spark_checks import _spark_input

    frame, loaded = _spark_input.read(spark, [str(CORPUS)], listed=1000)
    assert sorted((e["where"], e["reason"]) for e in loaded.invalid) == sorted(
        pair for case in CASES for pair in wanted(case))
    crlf = frame.filter(frame.file == f"{CORPUS}/crlf.jsonl").orderBy("line").select("line", "file_line").collect()
    assert [(r["line"], r["file_line"]) for r in crlf] == [(k, k + 1) for k in range(29)]


#: the Parquet cases `make test` gives Spark: one of each path through its read (a column of the wrong type, the
#: schema's expression, a line outside the layout, lines shared across files, a shared line the statistics pass's
#: sums alone would miss, and a valid trace); `slow` (CI's slow-bounded) gives it the rest, each a check of its own
SPARK_QUICK = ("wrong_type", "bad_enum", "negative_line", "shared_line_two_files", "sum_kept_three_times",
               "another_nodes_line")


def spark_check(tmp_path: Path, *argv: str) -> tuple[int, dict | None]:
    return run(["check", *argv, "--engine", "spark", "--master", "local[2]"], tmp_path / "report.json")


def check_parquet_cases(cases: dict, tmp_path: Path, capsys) -> None:
    for name, (path, want) in cases.items():
        code, document = spark_check(tmp_path, f"file://{path}")
        assert code == (0 if name in VALID_PARQUET else 2), name
        if name == "wrong_type":
            assert "column seq is string, expected int64" in capsys.readouterr().err
        else:
            assert [(e["where"], e["reason"]) for e in document["invalid"]["lines"]] == want, name
            assert document["invalid"]["count"] == len(want), name


# the exit codes, the quick Parquet cases and the URIs are four tests, not one: each is a handful of checks of their
# own, and as one test they took 208-297 s of the 300 s timeout on a loaded 2-core machine
@pytest.mark.spark
def test_spark_exit_codes_of_the_corpus(spark, tmp_path: Path):
    by_id = {c["id"]: c for c in CASES}
    for case_id, level in (("misspelt_kind", "plain"), ("truncated_eof", "torn-tail"), ("truncated_eof", "plain")):
        argv = [str(CORPUS / by_id[case_id]["file"]), *(["--tolerate", level] if level != "plain" else [])]
        assert spark_check(tmp_path, *argv)[0] == by_id[case_id]["exit"][level], (case_id, level)


@pytest.mark.spark
def test_spark_judges_the_quick_parquet_cases(spark, parquet_cases, tmp_path: Path, capsys):  # noqa: F811
    assert set(SPARK_QUICK) <= set(parquet_cases)
    check_parquet_cases({name: parquet_cases[name] for name in SPARK_QUICK}, tmp_path, capsys)


@pytest.mark.spark
def test_spark_reads_file_uris_and_trace_directories(spark, parquet_cases, tmp_path: Path):  # noqa: F811
    path, want = parquet_cases["shared_line_two_files"]
    code, document = spark_check(tmp_path, f"file://{path}", "--tolerate", "invalid")
    assert code in (0, 1) and document["events"] == 259 - len(want)
    line = int(want[0][0].rsplit(" ", 1)[1])
    assert {e["message"] for e in document["invalid"]["lines"]} == {validity.layout_message(line)}
    trace = tmp_path / "t"
    fmt.convert_jsonl([CORPUS / "crlf.jsonl"], trace / "events")
    code, document = spark_check(tmp_path, f"file://{trace}")
    assert (code, document["events"]) == (0, 29)
    code, document = spark_check(tmp_path, f"file://{trace}", str(trace / "events"))  # read once
    assert (code, document["events"]) == (0, 29)
    assert trace == tmp_path / "t"
    (tmp_path / "linked").mkdir()  # a hard link too, as the other engines read it
    for f in (trace / "events").rglob("*.parquet"):
        os.link(f, tmp_path / "linked" / f"{f.parent.name}-{f.name}")
    code, document = spark_check(tmp_path, str(trace), str(tmp_path / "linked"))
    assert (code, document["events"]) == (0, 29)


@pytest.mark.spark
def test_spark_reads_percent_encoded_uris(spark, tmp_path: Path):
    fmt.convert_jsonl([CORPUS / "crlf.jsonl"], tmp_path / "t" / "events")
    check_percent_encoded(tmp_path, lambda argv: meshtrace(["check", *argv, "--engine", "spark", "--master",
                                                            "local[2]"]))


@pytest.mark.slow
@pytest.mark.spark
def test_spark_judges_every_other_parquet_case(spark, parquet_cases, tmp_path: Path, capsys):  # noqa: F811
    rest = {name: case for name, case in parquet_cases.items() if name not in SPARK_QUICK}
    assert rest
    check_parquet_cases(rest, tmp_path, capsys)


@pytest.mark.spark
def test_spark_finds_a_string_not_utf8_and_reads_string_layouts(spark, string_cases, capsys):  # noqa: F811
    """Spark reads a string column's bytes as they are: every row's strings are checked in the read's pass, and a
    file holding one that is not UTF-8 is refused by its name (as listed: a file URI), as DuckDB and pyarrow refuse
    it."""
    check_string_cases(string_cases,
                       lambda argv: meshtrace(["check", *argv, "--engine", "spark", "--master", "local[2]"]),
                       lambda: capsys.readouterr().err)


@pytest.mark.spark
def test_spark_refuses_a_tree_entry_no_engine_reads_alike(spark, tmp_path: Path, capsys):
    """Hadoop skips a name that is not UTF-8 and a link to nothing, and follows a link to a directory: a local tree
    is walked as the other engines walk it first, and refused with the same words."""
    check_tree_cases(tmp_path, lambda argv: meshtrace(["check", *argv, "--engine", "spark", "--master", "local[2]"]),
                     lambda: capsys.readouterr().err)
