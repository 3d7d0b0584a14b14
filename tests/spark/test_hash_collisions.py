"""Values an invariant compares are compared as they are, in every engine: fixtures/traces/hash_collisions holds two
request fingerprints and two outbox ids whose ``xxhash64`` (Spark's, seed 42) is equal -- found by a hostile pass
with Pollard's rho -- in traces where comparing them by that hash hides a violation (TRC-FP-FROZEN,
TRC-IPC-CONSISTENT, TRC-NEW-ROW-TRACED, TRC-DUP-FINGERPRINT) or merges two outbox rows (TRC-OUTBOX-LEGAL)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trace_testkit import same_answers

from spark_checks import duck, oracle
from spark_checks import format as fmt
from spark_checks.spark import SparkChecker

TRACE = Path(__file__).resolve().parents[2] / "fixtures" / "traces" / "hash_collisions"
FINGERPRINTS = ("14010bde155fff7d" + "5a" * 24, "af7033b68ccaa2b9" + "5a" * 24)
OUTBOX_IDS = ("02HS0PYNVNGQX90000000000QQ", "0F04XX8WK5DZPW0000000000QQ")
#: (invariant, key) -> (event's node, seq; related seq) the oracle reports
WANT = {
    ("TRC-FP-FROZEN", (("node", "d-fp"), ("outbox_id", "01JRW000000000000000000001"))): ("d-fp", 1, 0),
    ("TRC-IPC-CONSISTENT", (("node", "d-ipc"), ("client_message_id", "c2"))): ("d-ipc", 2, 1),
    ("TRC-NEW-ROW-TRACED", (("node", "d-new"), ("client_message_id", "c3"))): ("d-new", 1, 0),
    ("TRC-DUP-FINGERPRINT", (("mesh", "m1"), ("client_message_id", "c4"))): ("b-dup", 2, 0),
    ("TRC-OUTBOX-LEGAL", (("node", "d-k"), ("outbox_id", OUTBOX_IDS[0]))): ("d-k", 0, None),
    ("TRC-OUTBOX-LEGAL", (("node", "d-k"), ("outbox_id", OUTBOX_IDS[1]))): ("d-k", 1, None),
    ("TRC-OUTBOX-LEGAL", (("node", "d-r"), ("outbox_id", OUTBOX_IDS[1]))): ("d-r", 1, None),
}


def reported(report) -> dict:
    return {(v.invariant, v.key): (v.event.node, v.event.seq, None if v.related is None else v.related.seq)
            for v in report.violations}


@pytest.mark.spark
def test_the_fixture_collides_in_sparks_hash(spark):
    from pyspark.sql import functions as F

    fingerprints = [bytes.fromhex(f) for f in FINGERPRINTS]
    row = spark.range(1).select(
        *[F.xxhash64(F.lit(v)).alias(f"f{k}") for k, v in enumerate(fingerprints)],
        *[F.xxhash64(F.lit(v)).alias(f"o{k}") for k, v in enumerate(OUTBOX_IDS)]).first()
    assert row["f0"] == row["f1"] and row["o0"] == row["o1"]


@pytest.mark.spark
def test_colliding_values_are_told_apart_by_every_engine(spark, tmp_path: Path):
    by_oracle = oracle.check(TRACE)
    assert reported(by_oracle) == WANT
    assert same_answers(by_oracle, SparkChecker(spark, limit=None).check(TRACE)) == []
    fmt.convert_jsonl(sorted(TRACE.glob("*.jsonl")), tmp_path / "parquet")
    by_oracle = oracle.check(tmp_path / "parquet")
    assert reported(by_oracle) == WANT
    for other in (duck.check(tmp_path / "parquet"), SparkChecker(spark, limit=None).check(tmp_path / "parquet")):
        assert same_answers(by_oracle, other) == [], other.engine
        assert other.counts == by_oracle.counts, other.engine
