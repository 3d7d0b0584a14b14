"""A trace recorded from a real run of the reference daemon passes every check, in both checkers.

The daemon runs under gunicorn against the conformance harness's scripted broker (which writes no broker trace, so
only the daemon-side invariants apply): a few hundred sends with duplicate and mismatched re-posts, 409, 4xx and 5xx
broker answers, inbound pushes and redeliveries, operator requeues, and a kill -9 while a row is inflight followed
by a restart.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest

from conformance.launch import REFERENCE_TEMPLATE, Launched
from conformance.peer import ACCEPT_SILENTLY, ScriptedBroker, conflict, fail, reject
from spark_checks import format as fmt
from spark_checks import oracle
from spark_checks.cli import validate_files
from spark_checks.spark import SparkChecker

pytestmark = pytest.mark.spark

CONFIG = """
[outbox]
retry_base_ms = 100
retry_max_ms = 400
ack_timeout_s = 2.0
[daemon]
drain_timeout_s = 2.0
[trace]
dir = "{trace_dir}"
"""
SENDS = 240


def rows(client: httpx.Client) -> list[dict]:
    found, cursor = [], None
    while True:
        page = client.get("/v1/outbox", params={"limit": 500, **({"cursor": cursor} if cursor else {})}).json()
        found += page["items"]
        cursor = page["next_cursor"]
        if not cursor:
            return found


def settle(daemon: Launched, timeout: float = 60.0) -> list[dict]:
    """Wait until no row is pending or inflight; returns the rows."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with daemon.unix() as client:
            current = rows(client)
        if all(r["status"] not in ("pending", "inflight") for r in current):
            return current
        time.sleep(0.2)
    raise AssertionError(f"rows still moving: {[r for r in current if r['status'] in ('pending', 'inflight')]}")


def record(broker: ScriptedBroker, daemon: Launched, trace_dir: Path, snapshot: Path) -> None:
    with daemon.unix() as client:
        for i in range(SENDS):
            cmid = f"ref-{i:03d}"
            if i % 12 == 5:
                broker.answer(cmid, conflict())
            elif i % 12 == 7:
                broker.answer(cmid, fail())
            elif i % 12 == 9:
                broker.answer(cmid, reject(404, "destination_not_found"))
            body = {"to": "#general", "message": f"message {i}"}
            assert client.post("/v1/send", json=body, headers={"Idempotency-Key": cmid}).status_code == 202
            if i % 5 == 0:  # a duplicate: 200/202 while the row lives, 409 once the broker has made it dead
                again = client.post("/v1/send", json=body, headers={"Idempotency-Key": cmid})
                dead = again.status_code == 409 and again.json().get("conflict") == "outbox_dead_fingerprint_match"
                assert again.status_code in (200, 202) or (dead and i % 12 in (5, 9)), again.text
            if i % 11 == 0:
                other = {"to": "#general", "message": f"another message {i}"}
                assert client.post("/v1/send", json=other, headers={"Idempotency-Key": cmid}).status_code == 409
    for j in range(40):
        frame = broker.push(body=f"inbound {j}", client_message_id=f"in-{j:02d}")
        if j % 4 == 0:  # a redelivery of the same delivery: the inbox keeps one row
            broker.push(body=f"inbound {j}", client_message_id=f"in-{j:02d}", delivery_id=frame["delivery_id"],
                        broker_message_id=frame["messageId"], attempt=2)
    settled = settle(daemon)
    assert {r["status"] for r in settled} == {"done", "dead"}
    with daemon.unix() as client:
        for row in [r for r in settled if r["status"] == "dead"][:10]:
            assert client.post("/v1/outbox/requeue", json={"id": row["id"]}).status_code == 200
            assert client.post("/v1/send", json={"to": "#general", "message": "late"},
                               headers={"Idempotency-Key": row["client_message_id"]}).status_code == 409
        for row in [r for r in settled if r["status"] == "done"][:20]:
            client.post("/v1/send", json={"to": "#general", "message": "whatever"},
                        headers={"Idempotency-Key": row["client_message_id"]})
    settle(daemon)
    shutil.copytree(trace_dir, snapshot)
    broker.answer("ref-crash", ACCEPT_SILENTLY, fail())
    with daemon.unix() as client:
        assert client.post("/v1/send", json={"to": "#general", "message": "crash"},
                           headers={"Idempotency-Key": "ref-crash"}).status_code == 202
    broker.wait_frame("send", count=1 + sum(1 for f in broker.received("send")
                                            if f["client_message_id"] != "ref-crash"))
    daemon.kill9()
    daemon.start()
    daemon.wait_connected()
    assert {r["status"] for r in settle(daemon)} <= {"done", "dead", "aborted"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("recorded")
    trace_dir, snapshot = root / "trace", root / "before-crash"
    state = root / "daemon"
    state.mkdir(mode=0o700)
    (state / "config.toml").write_text(CONFIG.format(trace_dir=trace_dir))
    with ScriptedBroker() as broker:
        daemon = Launched(REFERENCE_TEMPLATE, state, broker.url)
        try:
            daemon.start()
            daemon.wait_connected()
            record(broker, daemon, trace_dir, snapshot)
        finally:
            daemon.stop(timeout=10)
    return {"before-crash": snapshot, "whole": trace_dir}


def _check_both(spark, trace_dir: Path, tmp_path: Path) -> tuple[oracle.Report, oracle.Report]:
    files = fmt.jsonl_files([trace_dir])
    lines, problems = validate_files(files)
    assert problems == [] and lines > 1_000
    by_oracle = oracle.check(files)
    dataset = tmp_path / "parquet"
    fmt.convert_jsonl(files, dataset)
    by_spark = SparkChecker(spark, limit=None).check(dataset)
    assert by_oracle.events == by_spark.events == lines
    assert by_oracle.sources == by_spark.sources == ["daemon"]
    kinds = {row["kind"] for row in fmt.read_jsonl(files).rows}
    assert {"ipc_decision", "outbox_transition", "inbox_insert", "sse_event"} <= kinds
    return by_oracle, by_spark


def test_a_recorded_reference_run_passes_every_check(spark, recorded, tmp_path: Path):
    by_oracle, by_spark = _check_both(spark, recorded["before-crash"], tmp_path)
    assert by_oracle.violations == [] and by_spark.violations == []
    document = by_spark.as_dict()
    applies = {inv["id"]: inv["applies"] for inv in document["invariants"]}
    assert not applies["TRC-DONE-HAS-MESSAGE"] and applies["TRC-OUTBOX-LEGAL"]


def test_the_run_across_a_kill9_and_restart_passes_every_check(spark, recorded, tmp_path: Path):
    by_oracle, by_spark = _check_both(spark, recorded["whole"], tmp_path)
    assert by_oracle.identities() == by_spark.identities()
    assert by_oracle.violations == [], [(v.invariant, v.detail) for v in by_oracle.violations]
