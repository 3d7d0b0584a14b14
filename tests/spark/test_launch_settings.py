"""What a local driver is launched with, from the trace it will check (no JVM starts here): the event count a
trace's files give without being read, and the JIT settings a small trace's driver gets."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from spark_checks import format as fmt
from spark_checks.inputs import JSONL_BYTES_PER_EVENT, estimated_events
from spark_checks.session import SMALL_TRACE_EVENTS, SMALL_TRACE_JAVA_OPTIONS, local_settings


def _parquet(path: Path, rows: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    empty = {f.name: [None] * rows for f in fmt.FLAT_SCHEMA}
    pq.write_table(pa.Table.from_pydict(empty, schema=fmt.FLAT_SCHEMA), path)


def test_parquet_rows_are_counted_from_the_footers_of_every_file(tmp_path: Path):
    _parquet(tmp_path / "t" / "events" / "bucket=00" / "part-0.parquet", 7)
    _parquet(tmp_path / "t" / "events" / "bucket=01" / "part-0.parquet", 5)
    assert estimated_events([str(tmp_path / "t")]) == 12
    assert estimated_events([f"file://{tmp_path / 't' / 'events'}"]) == 12
    # a file named twice is read once, as the check reads it
    assert estimated_events([str(tmp_path / "t"), str(tmp_path / "t" / "events" / "bucket=00" / "part-0.parquet")]) \
        == 12


def test_jsonl_events_are_estimated_from_the_size_and_unknowable_input_gives_none(tmp_path: Path):
    (tmp_path / "a.jsonl").write_bytes(b"x" * (JSONL_BYTES_PER_EVENT * 3 + 1))
    (tmp_path / "b.jsonl").write_bytes(b"x" * JSONL_BYTES_PER_EVENT)
    assert estimated_events([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 4
    assert estimated_events(["s3a://bucket/trace"]) is None  # a Hadoop URI: not read on the driver
    assert estimated_events([str(tmp_path / "missing")]) is None  # the check gives the error
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    assert estimated_events([str(tmp_path / "bad.parquet")]) is None


def test_only_a_driver_known_to_check_a_small_trace_compiles_with_c1_alone():
    def options(events: int | None) -> str:
        return local_settings(expected_events=events)["spark.driver.extraJavaOptions"]

    assert SMALL_TRACE_JAVA_OPTIONS in options(0)
    assert SMALL_TRACE_JAVA_OPTIONS in options(SMALL_TRACE_EVENTS)
    assert "TieredStopAtLevel" not in options(SMALL_TRACE_EVENTS + 1)
    assert "TieredStopAtLevel" not in options(None)
    # C1 alone gets a fifth of tiered compilation's code cache unless given it: a check fills that, then runs
    # interpreted
    assert "-XX:ReservedCodeCacheSize=240m" in SMALL_TRACE_JAVA_OPTIONS
    assert options(0).startswith(local_settings()["spark.driver.extraJavaOptions"])
