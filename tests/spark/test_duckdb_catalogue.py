"""The DuckDB catalogue the bench compares Spark with answers exactly as the oracle does: the same violations, details
and evidence."""

from __future__ import annotations

import pytest
from trace_testkit import expected, same_answers

from spark_checks import oracle


def test_duckdb_agrees_with_the_oracle(traces):
    pytest.importorskip("duckdb")
    from spark_checks import duck

    for name in ("all", "clean", "non_monotonic_seq"):
        trace, manifest = traces[name]
        report = duck.check(trace)
        assert same_answers(report, oracle.check(trace)) == [], name
        assert {(v.invariant, v.key) for v in report.violations} == expected(manifest), name
