"""The scale run: one large generated trace with every kind injected, checked by Spark and by the oracle.

Marked `slow`. The size is MESHSPEC_SLOW_EVENTS (default 20M for `make slow`; CI's bounded run uses 2M): large
enough that the trace spans many Parquet files per bucket, the hot subjects are chunked, and the checks run as real
multi-task Spark jobs. Both checkers must report exactly the injected violations, with the same evidence.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from trace_testkit import expected, same_answers

from spark_checks import oracle
from spark_checks.catalogue import INJECTIONS
from spark_checks.generate import Params, generate
from spark_checks.spark import SparkChecker

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _events() -> int:
    text = os.environ.get("MESHSPEC_SLOW_EVENTS", "20M").strip().upper()
    return int(float(text[:-1]) * 1_000_000) if text.endswith("M") else int(text)


@pytest.mark.timeout(3600)
def test_a_large_trace_with_every_kind_injected(spark, tmp_path: Path):
    events = _events()
    manifest = generate(tmp_path / "trace", Params(events=events, daemons=128, seed=2026, inject=tuple(INJECTIONS),
                                                   flush_events=250_000), workers=2)
    assert manifest["events"] == events
    want = expected(manifest)
    assert {invariant for invariant, _ in want} == set(INJECTIONS.values())
    report = SparkChecker(spark, limit=None).check(tmp_path / "trace")
    assert report.events == manifest["events"]
    assert {(v.invariant, v.key) for v in report.violations} == want
    assert same_answers(report, oracle.check(tmp_path / "trace")) == []
