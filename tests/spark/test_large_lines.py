"""A Parquet row's ``line`` is any non-negative long that no other row of its node holds. The per-node orderings
(SSE event ids, inbox seqs, seqs, message events against new rows) order by it; Spark once packed ``(line, seq)``
into one long (``line << 23``) and ordered lines of 2**40 or more wrongly. Here the hand-made cases' lines are moved
far up -- a node's order kept -- and every engine must still report what the oracle does."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from test_hand_made_traces import CASES
from trace_testkit import same_answers

from spark_checks import duck, oracle
from spark_checks import format as fmt
from spark_checks.spark import SparkChecker

#: the offsets added to the lines of each node in turn: past 2**40, and near the top of a long
OFFSETS = (1 << 41, (1 << 62) + 12_345, 1 << 50)


@pytest.mark.spark
def test_lines_far_above_2_to_the_40_order_as_in_the_oracle(spark, tmp_path: Path):
    files = [node.write_jsonl(tmp_path / "jsonl") for name in ("TRC-MESSAGE-EVENT-NEW-ROW", "TRC-INBOX-SEQ-MONOTONIC",
                                                             "TRC-HOOK-*") for node in CASES[name]()[0]]
    fmt.convert_jsonl(files, tmp_path / "parquet")
    table = pq.read_table(tmp_path / "parquet", schema=fmt.FLAT_SCHEMA).select(fmt.FLAT_SCHEMA.names)
    nodes = sorted(set(table["node"].to_pylist()))
    offset = pa.array([OFFSETS[nodes.index(node) % len(OFFSETS)] for node in table["node"].to_pylist()], pa.int64())
    table = table.set_column(table.schema.get_field_index("line"), fmt.FLAT_SCHEMA.field("line"),
                             pc.add(table["line"], offset))
    (tmp_path / "far" / "events").mkdir(parents=True)
    pq.write_table(table, tmp_path / "far" / "events" / "part-0.parquet")
    by_oracle = oracle.check(tmp_path / "far")
    assert by_oracle.invalid_count == 0
    assert {"TRC-MESSAGE-EVENT-NEW-ROW", "TRC-INBOX-SEQ-MONOTONIC"} <= set(by_oracle.counts)
    assert max(v.event.line for v in by_oracle.violations) > 1 << 40
    # small chunks: the per-node orderings cross chunk boundaries, where Spark compares a chunk's head and tail
    for other in (duck.check(tmp_path / "far"), SparkChecker(spark, limit=None).check(tmp_path / "far"),
                  SparkChecker(spark, limit=None, chunk=2).check(tmp_path / "far")):
        assert same_answers(by_oracle, other) == [], other.engine
        assert other.counts == by_oracle.counts, other.engine
