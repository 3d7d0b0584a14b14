"""The single-process oracle on generated traces: silent on clean ones, exactly the injected violation otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest
from trace_testkit import expected, make_trace, skewed_trace

from spark_checks import oracle
from spark_checks.catalogue import BY_ID, INJECTIONS


@pytest.mark.parametrize("fault_rate", [0.0, 0.05, 0.5, 1.0])
@pytest.mark.parametrize("seed", [1, 2])
def test_clean_traces_pass_every_check(tmp_path: Path, seed: int, fault_rate: float):
    trace, manifest = make_trace(tmp_path, "t", seed=seed, fault_rate=fault_rate, events=15_000,
                                 send_interval_ms=3_000)
    report = oracle.check(trace)
    assert report.events == manifest["events"] == 15_000
    assert report.violations == []


@pytest.mark.parametrize("kind", list(INJECTIONS))
def test_each_injection_is_reported_as_exactly_its_violation(traces, kind: str):
    trace, manifest = traces[kind]
    assert [i["kind"] for i in manifest["injections"]] == [kind], manifest["dropped_injections"]
    report = oracle.check(trace)
    assert {(v.invariant, v.key) for v in report.violations} == expected(manifest)
    (violation,) = report.violations
    assert violation.invariant == INJECTIONS[kind]
    assert violation.evidence, "a violation comes with its evidence"
    event = violation.evidence[-1] if BY_ID[violation.invariant].evidence == "prefix" else None
    if event is not None:
        assert (event["node"], event["seq"]) == (violation.event.node, violation.event.seq)


def test_all_injections_at_once(traces):
    trace, manifest = traces["all"]
    assert len(manifest["injections"]) == len(INJECTIONS)
    assert {(v.invariant, v.key) for v in oracle.check(trace).violations} == expected(manifest)


def test_a_skewed_subject_is_replayed_in_full(tmp_path: Path):
    dataset, want = skewed_trace(tmp_path)
    assert {(v.invariant, v.key) for v in oracle.check(dataset).violations} == want


def test_the_report_names_the_requirements_and_what_applies(traces):
    document = oracle.check(traces["clean"][0]).as_dict()
    assert document["sources"] == ["broker", "daemon"]
    by_id = {inv["id"]: inv for inv in document["invariants"]}
    assert by_id["TRC-ONE-MESSAGE"]["requirements"][0] == "BRK-CONCURRENT-ONE-MESSAGE"
    assert all(inv["applies"] and inv["violations"] == 0 for inv in document["invariants"])
