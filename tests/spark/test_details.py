"""What a violation says: one detail text per case in every engine, evidence in file order with where each event
sits, the report's shape (spec/schemas/report/trace_report.json) and step timings that are never negative."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from detail_cases import hand_made
from trace_testkit import same_answers

from spark_checks import format as fmt
from spark_checks import oracle
from spark_checks.cli import evidence_lines
from spark_checks.spark import SparkChecker
from spec import validator


@pytest.fixture(scope="module")
def hand(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """The hand-made violations as JSONL, the same converted to Parquet, and the detail each must get."""
    root = tmp_path_factory.mktemp("details")
    jsonl, want = hand_made(root)
    parquet = root / "parquet"
    fmt.convert_jsonl([jsonl], parquet)
    return jsonl, parquet, want


def test_the_hand_made_events_are_valid_trace_events(hand):
    jsonl, _, _ = hand
    check = validator("trace/event")
    for path in sorted(jsonl.glob("*.jsonl")):
        for number, text in enumerate(path.read_text().splitlines(), start=1):
            assert [e.message for e in check.iter_errors(json.loads(text))] == [], f"{path.name}:{number}"


def test_the_oracle_names_the_values_of_each_violation(hand):
    jsonl, parquet, want = hand
    for trace in (jsonl, parquet):
        assert {(v.invariant, v.key): v.detail for v in oracle.check(trace).violations} == want


def test_duckdb_reports_the_oracles_details_and_evidence(hand, traces):
    pytest.importorskip("duckdb")
    from spark_checks import duck

    jsonl, parquet, want = hand
    for trace in (jsonl, parquet):  # JSONL evidence carries file and file_line
        report = duck.check([trace])
        assert {(v.invariant, v.key): v.detail for v in report.violations} == want
        assert same_answers(report, oracle.check(trace)) == []
    trace, _ = traces["all"]
    assert same_answers(duck.check(trace), oracle.check(trace)) == []


def test_evidence_is_in_file_order_with_each_events_place(hand):
    jsonl, parquet, _ = hand
    file = str(jsonl / "daemon-s.jsonl")
    for trace, places in ((jsonl, [(file, 3), (file, 4)]), (parquet, [(None, None), (None, None)])):
        report = oracle.check(trace)
        (seq,) = [v for v in report.violations if v.invariant == "TRC-SEQ-MONOTONIC"]
        assert [(e["node"], e["line"], e["seq"], e["event"]["seq"]) for e in seq.evidence] == [
            ("daemon-s", 2, 5, 5), ("daemon-s", 3, 3, 3)]
        assert [(e["file"], e["file_line"]) for e in seq.evidence] == places
        for violation in report.violations:
            places = [(e["node"], e["line"]) for e in violation.evidence]
            assert places == sorted(places), violation.invariant
            assert (violation.event.node, violation.event.line) in places, violation.invariant


def test_the_printer_shows_where_each_evidence_event_sits(hand):
    jsonl, parquet, _ = hand
    events = ['{"v":1,"source":"daemon","node":"daemon-s","seq":5,"ts_ms":1767225600005,"kind":"sse_event",'
              '"event_id":3,"event":"peer_join"}',
              '{"v":1,"source":"daemon","node":"daemon-s","seq":3,"ts_ms":1767225600003,"kind":"sse_event",'
              '"event_id":4,"event":"peer_join"}']
    file = jsonl / "daemon-s.jsonl"
    for trace, where in ((parquet, ("", "")), (jsonl, (f" {file}:3", f" {file}:4"))):
        document = oracle.check(trace).as_dict()
        (seq,) = [v for v in document["violations"] if v["invariant"] == "TRC-SEQ-MONOTONIC"]
        assert evidence_lines(seq) == [f"  * daemon-s line 2 seq 5{where[0]}  {events[0]}",
                                       f"  > daemon-s line 3 seq 3{where[1]}  {events[1]}"]


def test_the_report_follows_its_schema(hand, traces):
    pytest.importorskip("duckdb")
    from spark_checks import duck

    jsonl, parquet, _ = hand
    check = validator("report/trace_report")
    for report in (oracle.check(jsonl), oracle.check(parquet), duck.check(parquet), oracle.check(traces["all"][0])):
        document = json.loads(json.dumps(report.as_dict(), default=str))
        assert [e.message for e in check.iter_errors(document)] == [], report.engine


def test_step_timings_are_never_negative(monkeypatch):
    """Rounded steps that add up to more than the time taken must not leave the last one at -0.0."""
    from spark_checks import spark as spark_module

    clock = iter([0.0004, 0.0008, 0.0009])
    monkeypatch.setattr(spark_module, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    checker = SparkChecker(None)
    for name in ("stats", "catalogue", "evidence"):
        checker._mark(name, 0.0)
    assert checker.timings == {"stats": 0.0, "catalogue": 0.0, "evidence": 0.0}
    assert all(math.copysign(1.0, seconds) == 1.0 for seconds in checker.timings.values())
    assert "-0.0" not in json.dumps(checker.timings)
