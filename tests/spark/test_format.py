"""The JSONL <-> Parquet mapping and the generator's output format."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
from trace_testkit import make_trace

from spark_checks import format as fmt
from spark_checks.cli import validate_files
from spark_checks.generate import Params, generate


def test_generated_events_are_schema_valid_and_round_trip_through_jsonl(tmp_path: Path):
    trace, manifest = make_trace(tmp_path, "t", seed=5, events=6_000)
    jsonl = tmp_path / "jsonl"
    assert fmt.write_jsonl(trace, jsonl) == manifest["events"] == 6_000
    files = sorted(jsonl.glob("*.jsonl"))
    lines, problems = validate_files(files)
    assert (lines, problems) == (6_000, [])
    back = tmp_path / "back"
    read = fmt.convert_jsonl(files, back)
    assert (len(read.rows), read.invalid, read.reasons) == (6_000, [], {})
    original = sorted(pq.read_table(fmt.dataset_path(trace), schema=fmt.FLAT_SCHEMA).to_pylist(),
                      key=lambda r: (r["node"], r["line"]))
    again = sorted(pq.read_table(back, schema=fmt.FLAT_SCHEMA).to_pylist(), key=lambda r: (r["node"], r["line"]))
    assert original == again


def test_an_invalid_line_is_reported_and_not_counted_in_line(tmp_path: Path):
    event = {"v": 1, "source": "daemon", "node": "d", "seq": 0, "ts_ms": 1, "kind": "sse_event", "event_id": 1,
             "event": "message"}
    path = tmp_path / "daemon-d.jsonl"
    path.write_text(json.dumps(event) + '\n{"v":1,"sou\n' + json.dumps({**event, "seq": 1, "event_id": 2}) + "\n")
    read = fmt.read_jsonl([path])
    assert [(r["seq"], r["line"], r["file"], r["file_line"]) for r in read.rows] == [(0, 0, str(path), 1),
                                                                                    (1, 1, str(path), 3)]
    assert [(e["where"], e["reason"]) for e in read.invalid] == [(f"{path}:2", "not_json")]
    assert read.reasons == {"not_json": 1}


def test_convert_refuses_invalid_input_unless_tolerated(tmp_path: Path):
    event = {"v": 1, "source": "daemon", "node": "d", "seq": 0, "ts_ms": 1, "kind": "sse_event", "event_id": 1,
             "event": "message"}
    path = tmp_path / "daemon-d.jsonl"
    path.write_text(json.dumps(event) + "\n" + json.dumps({**event, "seq": 1, "event_id": 2.5}) + "\n")
    assert fmt.convert_jsonl([path], tmp_path / "refused").reasons == {"integer_literal": 1}
    assert not (tmp_path / "refused").exists()
    assert len(fmt.convert_jsonl([path], tmp_path / "kept", tolerate=True).rows) == 1
    assert pq.read_table(tmp_path / "kept").num_rows == 1


def test_every_subject_lives_in_one_bucket(tmp_path: Path):
    trace, _ = make_trace(tmp_path, "t", seed=6, events=6_000)
    seen: dict[tuple[str, str], str] = {}
    for directory in fmt.bucket_dirs(trace):
        for row in fmt.read_bucket(directory, ["mesh", "client_message_id"]).to_pylist():
            if row["client_message_id"] is not None:
                assert seen.setdefault((row["mesh"], row["client_message_id"]), directory.name) == directory.name


def test_the_trace_depends_on_the_parameters_not_on_the_worker_count(tmp_path: Path):
    params = Params(events=8_000, daemons=20, seed=11, fault_rate=0.3)
    one = generate(tmp_path / "one", params, workers=1)
    two = generate(tmp_path / "two", params, workers=2)
    assert one["events"] == two["events"] == 8_000

    def rows(root: Path) -> list[dict]:
        return sorted(pq.read_table(fmt.dataset_path(root), schema=fmt.FLAT_SCHEMA).to_pylist(),
                      key=lambda r: (r["node"], r["line"]))

    assert rows(tmp_path / "one") == rows(tmp_path / "two")
