"""Traces recorded from real runs of the reference implementation pass every check, in both checkers.

Two recordings. (1) The conformance suites themselves: ``meshconform run`` against the reference daemon and
``meshconform broker`` against the reference broker, each launched with ``--trace-dir``; each trace is checked on its
own (the daemon suite talks to the harness's scripted broker, which writes no trace). (2) A traced mesh: the
reference broker (SQLite, --dev) and two reference daemons exchanging messages on a topic, with the broker stopped
and restarted under load and the receiving daemon killed with SIGKILL and restarted; here the invariants that relate
daemon rows to broker commits apply too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conformance.broker_target import REFERENCE_BROKER, ReferenceBrokerProcess
from conformance.launch import REFERENCE_TEMPLATE, Launched
from spark_checks import format as fmt
from spark_checks import oracle
from spark_checks.cli import validate_files
from spark_checks.spark import SparkChecker

pytestmark = pytest.mark.spark
REPO = Path(__file__).resolve().parents[2]
BROKER_KINDS = {"accept_decision", "accept_commit", "delivery", "delivery_ack"}
DAEMON_KINDS = {"ipc_decision", "outbox_transition", "inbox_insert", "sse_event"}
#: the bound of `meshconform broker` against the reference broker, which `conformance_traces` runs
BROKER_RUN_S = 600
#: tests/conftest.py raises the timeout of the tests using these fixtures by their bounds (`fixture_timeout`)
FIXTURE_BOUNDS_S = {"conformance_traces": BROKER_RUN_S}


def meshconform(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conformance.cli", *args, "--quiet"], capture_output=True,
                          text=True, timeout=BROKER_RUN_S, check=False, cwd=REPO)


def check_both(spark, trace: Path, scratch: Path) -> tuple[oracle.Report, oracle.Report, set[str]]:
    """Validate every line against the trace schema, then check with the oracle and with Spark."""
    files = fmt.jsonl_files([trace])
    lines, problems = validate_files(files)
    assert problems == [] and lines > 0
    by_oracle = oracle.check(files)
    fmt.convert_jsonl(files, scratch / "parquet")
    by_spark = SparkChecker(spark, limit=None).check(scratch / "parquet")
    assert by_oracle.events == by_spark.events == lines
    assert by_oracle.identities() == by_spark.identities()
    return by_oracle, by_spark, {row["kind"] for row in fmt.read_jsonl(files).rows}


def applying(report: oracle.Report) -> set[str]:
    return {inv["id"] for inv in report.as_dict()["invariants"] if inv["applies"]}


@pytest.fixture(scope="module")
def conformance_traces(tmp_path_factory: pytest.TempPathFactory, reference_conformance_run) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("conformance-traces")
    daemon, _, daemon_trace = reference_conformance_run
    assert daemon.returncode == 0, daemon.stdout[-3000:] + daemon.stderr[-3000:]
    broker = meshconform("broker", "--launch", f"{REFERENCE_BROKER} --trace-dir {root / 'broker'} --trace-strict",
                         "--report-dir", str(root / "broker-report"), "--seed", "11")
    assert broker.returncode == 0, broker.stdout[-3000:] + broker.stderr[-3000:]
    return {"daemon": daemon_trace, "broker": root / "broker"}


def test_the_daemon_conformance_run_trace_passes_every_check(spark, conformance_traces, tmp_path: Path):
    by_oracle, by_spark, kinds = check_both(spark, conformance_traces["daemon"], tmp_path)
    assert kinds >= DAEMON_KINDS
    assert by_oracle.violations == [] and by_spark.violations == []
    assert {"TRC-OUTBOX-LEGAL", "TRC-IPC-CONSISTENT", "TRC-ONE-INBOX-ROW"} <= applying(by_spark)


def test_the_broker_conformance_run_trace_passes_every_check(spark, conformance_traces, tmp_path: Path):
    by_oracle, by_spark, kinds = check_both(spark, conformance_traces["broker"], tmp_path)
    assert kinds >= BROKER_KINDS
    assert by_oracle.violations == [] and by_spark.violations == []
    assert {"TRC-ONE-MESSAGE", "TRC-SIDE-EFFECTS", "TRC-DELIVERY-ACKED"} <= applying(by_spark)


# --- a traced mesh ------------------------------------------------------------------------------------------------

def outbox(daemon: Launched) -> list[dict]:
    with daemon.unix() as client:
        return client.get("/v1/outbox", params={"limit": 500}).json()["items"]


def inbox_ids(daemon: Launched) -> set[str]:
    found, cursor = set(), None
    with daemon.unix() as client:
        while True:
            page = client.get("/v1/inbox", params={"limit": 500, **({"cursor": cursor} if cursor else {})}).json()
            found |= {m["client_message_id"] for m in page["items"]}
            cursor = page.get("next_cursor")
            if not cursor or not page["items"]:
                return found


def wait_until(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def send(daemon: Launched, ids: range, prefix: str) -> None:
    with daemon.unix() as client:
        for i in ids:
            answer = client.post("/v1/send", json={"to": "#general", "message": f"{prefix} {i}"},
                                 headers={"Idempotency-Key": f"{prefix}-{i:03d}"})
            assert answer.status_code == 202, answer.text


@pytest.fixture(scope="module")
def mesh_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mesh")
    trace = root / "trace"
    broker = ReferenceBrokerProcess(root, trace).start()
    daemons = []
    try:
        for name in ("a", "b"):
            state = root / name
            state.mkdir(mode=0o700)
            (state / "config.toml").write_text(f'[trace]\ndir = "{trace}"\n[outbox]\nretry_base_ms = 100\n'
                                               'retry_max_ms = 500\n')
            daemon = Launched(REFERENCE_TEMPLATE, state, broker.url)
            daemons.append(daemon.start())
            daemon.wait_connected()
        a, b = daemons
        send(a, range(0, 60), "a")
        send(b, range(0, 20), "b")
        broker.stop()  # SIGTERM under load: both outboxes keep what the broker has not acked
        send(a, range(60, 100), "a")
        broker.start()
        b.kill9()  # the receiver dies while deliveries are in flight
        send(a, range(100, 140), "a")
        b.start()
        for daemon in daemons:
            daemon.wait_connected()
        send(b, range(20, 40), "b")
        wait_until(lambda: all(r["status"] == "done" for d in daemons for r in outbox(d)), "every row done")
        wait_until(lambda: {f"a-{i:03d}" for i in range(140)} <= inbox_ids(b), "b received everything")
        wait_until(lambda: {f"b-{i:03d}" for i in range(40)} <= inbox_ids(a), "a received everything")
        time.sleep(1.5)  # a lease: the last client_acks reach the broker's trace
    finally:
        for daemon in daemons:
            daemon.stop(timeout=20)
        broker.stop()
    return trace


def test_a_traced_mesh_across_a_broker_restart_and_a_receiver_kill9_passes_every_check(spark, mesh_trace,
                                                                                       tmp_path: Path):
    by_oracle, by_spark, kinds = check_both(spark, mesh_trace, tmp_path)
    assert kinds >= (DAEMON_KINDS | BROKER_KINDS)
    assert by_oracle.violations == [], [(v.invariant, v.key, v.detail) for v in by_oracle.violations]
    assert by_spark.violations == []
    document = by_spark.as_dict()
    assert document["sources"] == ["broker", "daemon"]
    assert all(inv["applies"] for inv in document["invariants"]), "every invariant is exercised"
    nodes = {path.name for path in mesh_trace.glob("*.jsonl")}
    assert len(nodes) == 3, nodes
    events = [json.loads(line) for line in (mesh_trace / next(n for n in nodes if n.startswith("broker"))).open()]
    assert sum(e["kind"] == "accept_commit" for e in events) == 180, "one commit per message"
