"""Hand-made JSONL traces for the invariants that close the catalogue's gaps: each case breaks its invariant in the
ways the description names, next to the shapes it allows (a daemon or broker stopped between two events, a lease
whose event was lost), and the oracle and DuckDB must report exactly the listed (invariant, key, event, related)
identities, with the same detail texts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from trace_testkit import Broker, Daemon, fingerprint, same_answers

from spark_checks import format as fmt
from spark_checks import oracle
from spark_checks.catalogue import EventRef

A, B = fingerprint("a"), fingerprint("b")
PEER = "cd" * 32
Identity = tuple[str, tuple[tuple[str, str], ...], EventRef, EventRef | None]


def at(event: dict[str, Any]) -> EventRef:
    return EventRef(event["node"], event["seq"], event["seq"])


def ulid(n: int) -> str:
    return f"01JRW{n:021d}"


def dup_fingerprint() -> tuple[list[Any], set[Identity], str]:
    broker = Broker("broker-dup", mesh="m1")
    broker.commit("c-1", A, "M1")
    broker.decision("c-1", A, "BRK-ACCEPT", "M1")
    match_other = broker.decision("c-1", B, "BRK-DUP-MATCH", "M1")  # a mismatched retry answered 200 duplicate
    broker.decision("c-1", A, "BRK-DUP-MATCH", "M1")
    commit = broker.events[0]
    broker.commit("c-2", A, "M2")
    broker.decision("c-2", A, "BRK-ACCEPT", "M2")
    broker.decision("c-2", B, "BRK-DUP-MISMATCH", None)
    mismatch_same = broker.decision("c-2", A, "BRK-DUP-MISMATCH", None)  # the same fingerprint answered 409
    commit_2 = broker.events[4]
    broker.decision("c-3", B, "BRK-DUP-MATCH", "M3")  # its commit was never traced: nothing to compare
    return [broker], {
        ("TRC-DUP-FINGERPRINT", (("mesh", "m1"), ("client_message_id", "c-1")), at(match_other), at(commit)),
        ("TRC-DUP-FINGERPRINT", (("mesh", "m1"), ("client_message_id", "c-2")), at(mismatch_same), at(commit_2)),
    }, "TRC-DUP-FINGERPRINT"


def new_row_traced() -> tuple[list[Any], set[Identity], str]:
    daemon = Daemon("daemon-new")
    untraced = daemon.decision("n-1", A, "none", None, "IPC-NEW", 202, None)  # answered 202, never traced
    daemon.decision("n-2", A, "none", None, "IPC-NEW", 202, None)
    daemon.transition(ulid(2), "n-2", A, "none", "pending", "accept", "OB-NONE-ACCEPT", 0)
    daemon.transition(ulid(2), "n-2", A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 1)
    other = daemon.decision("n-3", A, "none", None, "IPC-NEW", 202, None)
    wrong = daemon.transition(ulid(3), "n-3", B, "none", "pending", "accept", "OB-NONE-ACCEPT", 0)
    first = daemon.decision("n-4", A, "none", None, "IPC-NEW", 202, None)
    gone = daemon.decision("n-4", A, "none", None, "IPC-NEW", 202, None)  # the id was free again
    # stopped between the decision and its accept, restarted: the row's next transition is its dispatch
    daemon.decision("n-5", A, "none", None, "IPC-NEW", 202, None)
    daemon.decision("n-6", A, "none", None, "IPC-NEW", 202, None)
    daemon.transition(ulid(6), "n-6", A, "none", "pending", "accept", "OB-NONE-ACCEPT", 0)
    daemon.transition(ulid(5), "n-5", A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 1)
    daemon.decision("n-7", A, "none", None, "IPC-NEW", 202, None)  # stopped for good before its accept
    return [daemon], {
        ("TRC-NEW-ROW-TRACED", (("node", "daemon-new"), ("client_message_id", "n-1")), at(untraced), None),
        ("TRC-NEW-ROW-TRACED", (("node", "daemon-new"), ("client_message_id", "n-3")), at(wrong), at(other)),
        ("TRC-NEW-ROW-TRACED", (("node", "daemon-new"), ("client_message_id", "n-4")), at(gone), at(first)),
    }, "TRC-NEW-ROW-TRACED"  # n-5's dispatch without a traced accept is TRC-OUTBOX-LEGAL's as well


def inflight_resolved() -> tuple[list[Any], set[Identity], str]:
    daemon = Daemon("daemon-inflight")
    daemon.done_row(ulid(1), "r-1", A)
    daemon.decision("r-2", A, "none", None, "IPC-NEW", 202, None)
    daemon.transition(ulid(2), "r-2", A, "none", "pending", "accept", "OB-NONE-ACCEPT", 0)
    stuck = daemon.transition(ulid(2), "r-2", A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 1)
    daemon.decision("r-3", A, "none", None, "IPC-NEW", 202, None)
    daemon.transition(ulid(3), "r-3", A, "none", "pending", "accept", "OB-NONE-ACCEPT", 0)
    edge = daemon.transition(ulid(3), "r-3", A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 1)
    daemon.wait(20_000 - 1)  # r-3: its ack timeout (15 s) and grace (5 s) end exactly at the last event
    daemon.decision("r-1", A, "done", True, "IPC-DONE-MATCH", 200, ulid(1))
    assert daemon.events[-1]["ts_ms"] == edge["ts_ms"] + 20_000 > stuck["ts_ms"] + 20_000
    return [daemon], {
        ("TRC-INFLIGHT-RESOLVED", (("node", "daemon-inflight"), ("outbox_id", ulid(2))), at(stuck), None),
    }, ""


def delivery_attempts() -> tuple[list[Any], set[Identity], str]:
    broker = Broker("broker-attempts", mesh="m2")
    found = set()
    for cmid, attempts, bad in (("d-1", (1, 1, 2), 1), ("d-2", (1, 3, 4), None), ("d-3", (2, 1), 1)):
        broker.commit(cmid, A, f"M-{cmid}")
        broker.decision(cmid, A, "BRK-ACCEPT", f"M-{cmid}")
        deliveries = [broker.delivery(cmid, f"M-{cmid}", PEER, attempt) for attempt in attempts]
        broker.ack(cmid, f"M-{cmid}", PEER)
        if bad is not None:
            found.add(("TRC-DELIVERY-ATTEMPTS", (("mesh", "m2"), ("delivery_id", f"M-{cmid}.0")),
                       at(deliveries[bad]), at(deliveries[bad - 1])))
    return [broker], found, ""


def inbox_seq_names_row() -> tuple[list[Any], set[Identity], str]:
    daemon = Daemon("daemon-inbox")
    row = daemon.inbox_insert(PEER, "i-1", True, 1)
    daemon.inbox_insert(PEER, "i-2", True, 2)
    daemon.inbox_insert(PEER, "i-2", False, 2)
    daemon.inbox_insert(PEER, "i-2", False, None)
    misnamed = daemon.inbox_insert(PEER, "i-1", False, 2)  # names i-2's row
    daemon.inbox_insert(PEER, "i-1", False, 3)
    daemon.inbox_insert(PEER, "i-3", False, 7)  # its insert predates the trace: nothing to compare
    return [daemon], {
        ("TRC-INBOX-SEQ-NAMES-ROW", (("recipient", PEER), ("client_message_id", "i-1")), at(misnamed), at(row)),
    }, ""


def inbox_seq_monotonic() -> tuple[list[Any], set[Identity], str]:
    daemon = Daemon("daemon-seqs")
    daemon.inbox_insert(PEER, "s-1", True, 1)
    before = daemon.inbox_insert(PEER, "s-2", True, 40)
    daemon.inbox_insert(PEER, "s-1", False, 1)
    reused = daemon.inbox_insert(PEER, "s-3", True, 40)
    daemon.inbox_insert(PEER, "s-4", True, 41)
    daemon.inbox_insert(PEER, "s-5", True, 3)  # backwards too: the node's first violation is reported
    return [daemon], {
        ("TRC-INBOX-SEQ-MONOTONIC", (("node", "daemon-seqs"),), at(reused), at(before)),
    }, ""


CASES: dict[str, Callable[[], tuple[list[Any], set[Identity], str]]] = {
    "TRC-DUP-FINGERPRINT": dup_fingerprint,
    "TRC-NEW-ROW-TRACED": new_row_traced,
    "TRC-INFLIGHT-RESOLVED": inflight_resolved,
    "TRC-DELIVERY-ATTEMPTS": delivery_attempts,
    "TRC-INBOX-SEQ-NAMES-ROW": inbox_seq_names_row,
    "TRC-INBOX-SEQ-MONOTONIC": inbox_seq_monotonic,
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_gap_is_reported_exactly_by_the_oracle_and_duckdb(tmp_path: Path, case: str):
    nodes, want, only = CASES[case]()
    files = [node.write_jsonl(tmp_path / "jsonl") for node in nodes]
    by_oracle = oracle.check(files)
    got = {v.identity for v in by_oracle.violations if not only or v.invariant == only}
    assert got == want
    pytest.importorskip("duckdb")
    from spark_checks import duck

    fmt.convert_jsonl(files, tmp_path / "parquet")
    by_duck = duck.check(tmp_path / "parquet")
    assert by_duck.identities() == by_oracle.identities()
    assert {v.identity: v.detail for v in by_duck.violations} == {v.identity: v.detail for v in by_oracle.violations}


@pytest.mark.spark
def test_spark_reports_the_same_in_one_run_over_every_case(spark, tmp_path: Path):
    from spark_checks.spark import SparkChecker

    files = [node.write_jsonl(tmp_path / "jsonl") for build in CASES.values() for node in build()[0]]
    fmt.convert_jsonl(files, tmp_path / "parquet")
    by_spark = SparkChecker(spark, chunk=4, limit=None).check(tmp_path / "parquet")  # chunk boundaries everywhere
    by_oracle = oracle.check(tmp_path / "parquet")  # the same input: evidence from JSONL also names file:line
    assert len(by_oracle.violations) == 11
    assert same_answers(by_spark, by_oracle) == []


@pytest.mark.parametrize("engine", ["oracle", "duckdb"])
def test_meshtrace_check_takes_the_daemons_ack_timeout(tmp_path: Path, engine: str):
    """r-2 was dispatched 20 003 ms before the daemon's last event: past 15 s + 5 s, within 16 s + 5 s."""
    from spark_checks.cli import main as meshtrace

    if engine == "duckdb":
        pytest.importorskip("duckdb")
    nodes, _, _ = inflight_resolved()
    trace = nodes[0].write_jsonl(tmp_path / "jsonl")
    report = tmp_path / "report.json"
    assert meshtrace(["check", str(trace), "--engine", engine, "--report", str(report)]) == 1
    assert json.loads(report.read_text())["settings"]["ack_timeout_ms"] == 15_000
    assert meshtrace(["check", str(trace), "--engine", engine, "--ack-timeout-ms", "16000"]) == 0
    assert meshtrace(["check", str(trace), "--engine", engine, "--ack-timeout-ms", "14000",
                      "--ack-grace-ms", "7000"]) == 0
