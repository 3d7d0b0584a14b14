"""fixtures/traces/mesh/, recorded from the reference broker and two reference daemons, stays valid: every line
against the trace schemas, every event kind present, every invariant of the catalogue applies and none is violated
(fixtures/README.md)."""

from __future__ import annotations

from pathlib import Path

from spark_checks import format as fmt
from spark_checks import oracle
from spark_checks.cli import validate_files

TRACE = Path(__file__).resolve().parents[2] / "fixtures" / "traces" / "mesh"
KINDS = {"ipc_decision", "outbox_transition", "inbox_insert", "sse_event", "accept_decision", "accept_commit",
         "delivery", "delivery_ack"}


def test_the_recorded_mesh_trace_validates_and_passes_every_invariant():
    files = fmt.jsonl_files([TRACE])
    assert len(files) == 3  # the broker and two daemons
    lines, problems = validate_files(files)
    assert problems == [] and lines > 200
    assert {row["kind"] for row in fmt.read_jsonl(files).rows} == KINDS
    report = oracle.check(files)
    assert report.events == lines
    assert report.violations == [], [(v.invariant, v.key, v.detail) for v in report.violations]
    assert all(invariant["applies"] for invariant in report.as_dict()["invariants"])
