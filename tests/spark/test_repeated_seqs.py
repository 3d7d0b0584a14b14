"""Events of one node that share a seq (a node that wrote a seq twice: valid input, and a TRC-SEQ-MONOTONIC
violation) tie in every (node, seq) order the catalogue uses. Every engine breaks such a tie by the events' lines:
for a subject's first and last event, for the event a value is taken from, and for the first violation of a key.
Before, Spark took either event of a tie in the shuffle's order (TRC-ONE-MESSAGE named one broker message as both
the first and the last), and DuckDB and the oracle each kept the first of two tied violations of a key in an order
of their own. The cases were found by a hostile pass on the catalogue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trace_testkit import Broker, Daemon, fingerprint, same_answers

from spark_checks import duck, oracle
from spark_checks import format as fmt
from spark_checks.catalogue import EventRef
from spark_checks.spark import SparkChecker

A, B = fingerprint("a"), fingerprint("b")
PEER, OTHER = "cd" * 32, "ef" * 32


def tie(node: Broker | Daemon) -> dict[str, Any]:
    """The node's last event takes the seq of the event before it (the same pk, the next line)."""
    node.events[-1]["seq"] = node.events[-2]["seq"]
    node.seq -= 1
    return node.events[-1]


def at(event: dict[str, Any], line: int) -> EventRef:
    return EventRef(event["node"], event["seq"], line)


def tied_trace(directory: Path) -> tuple[list[Path], dict[tuple[str, str], tuple[EventRef, EventRef | None]]]:
    """JSONL files whose subjects meet ties in each family of first and last events, and the (event, related)
    the oracle must report for some of them, by (invariant, client_message_id or delivery subject)."""
    want: dict[tuple[str, str], tuple[EventRef, EventRef | None]] = {}
    broker = Broker("brk-tie", mesh="mt")

    def line() -> int:
        return len(broker.events) - 1

    # TRC-ONE-MESSAGE: two broker messages whose first events tie: the first is the earlier line, the last the later
    low = broker.commit("t1", A, "M-t1a")
    low_line = line()
    broker.commit("t1", A, "M-t1b")
    high = tie(broker)
    want[("TRC-ONE-MESSAGE", "t1")] = (at(high, line()), at(low, low_line))
    # three, the last two tied
    broker.commit("t2", A, "M-t2a")
    middle = broker.commit("t2", A, "M-t2b")
    middle_line = line()
    broker.commit("t2", A, "M-t2c")
    last = tie(broker)
    want[("TRC-ONE-MESSAGE", "t2")] = (at(last, line()), at(broker.events[middle_line - 1], middle_line - 1))
    assert middle["seq"] == last["seq"]
    # one message committed twice at one seq: the last commit is the later line
    first_commit = broker.commit("t3", A, "M-t3")
    first_line = line()
    broker.commit("t3", A, "M-t3")
    second_commit = tie(broker)
    want[("TRC-ONE-MESSAGE", "t3")] = (at(second_commit, line()), at(first_commit, first_line))
    # TRC-SIDE-EFFECTS: two broker messages' commits with wrong effects at one seq: the earlier line is reported
    bad = broker.commit("t4", A, "M-t4a", recipients=2)
    bad["effects"]["delivery"] = 1
    bad_line = line()
    other_bad = broker.commit("t4", A, "M-t4b", recipients=2)
    other_bad["effects"]["delivery"] = 1
    tie(broker)
    want[("TRC-SIDE-EFFECTS", "t4")] = (at(bad, bad_line), None)
    # three broker messages accepted at one seq and never committed: the first violation of the key is the earliest
    # line (the key's violations tie on (node, seq))
    uncommitted = broker.decision("t11", A, "BRK-ACCEPT", "M-t11a")
    uncommitted_line = line()
    broker.decision("t11", A, "BRK-ACCEPT", "M-t11b")
    tie(broker)
    broker.decision("t11", A, "BRK-ACCEPT", "M-t11c")
    tie(broker)
    want[("TRC-SIDE-EFFECTS", "t11")] = (at(uncommitted, uncommitted_line), None)
    # TRC-DELIVERY-ACKED: the last delivery of a delivery tied with an earlier one, never acked
    broker.commit("t5", A, "M-t5")
    broker.delivery("t5", "M-t5", PEER, 1)
    broker.delivery("t5", "M-t5", PEER, 2)
    tie(broker)
    # an ack tied with a delivery after it
    broker.commit("t6", A, "M-t6")
    broker.delivery("t6", "M-t6", PEER, 1)
    broker.ack("t6", "M-t6", PEER)
    broker.delivery("t6", "M-t6", PEER, 2)
    tie(broker)
    # TRC-DUP-FINGERPRINT: the subject's first commit is one of two tied commits of other fingerprints
    broker.commit("t7", B, "M-t7b")
    broker.commit("t7", A, "M-t7a")
    tie(broker)
    broker.decision("t7", A, "BRK-DUP-MATCH", "M-t7a")
    broker.wait(120_000)
    broker.commit("t-end", A, "M-end")

    daemon = Daemon("dmn-tie", mesh="mt")
    # TRC-ONE-INBOX-ROW: two inserted rows for one message at one seq
    daemon.inbox_insert(OTHER, "t8", True, 1)
    daemon.inbox_insert(OTHER, "t8", True, 2)
    tie(daemon)
    # TRC-HOOK-ONCE: a hook enqueued twice at one seq, then run twice at one seq
    daemon.hook_enqueue("t9", "on-message", 3)
    daemon.hook_enqueue("t9", "on-message", 3)
    tie(daemon)
    daemon.hook_run("t9", "on-message", 3)
    daemon.hook_run("t9", "on-message", 3)
    tie(daemon)
    # TRC-FP-FROZEN for a requeue successor: two rows superseded by one successor, their events tied
    daemon.done_row("01JRW000000000000000000051", "t10", A)
    daemon.transition("01JRW000000000000000000052", "t10", A, "none", "pending", "requeue", "OB-DEAD-REQUEUE", 0)
    daemon.transition("01JRW000000000000000000053", "t10", B, "dead", "aborted", "requeue", "OB-DEAD-REQUEUE", 0,
                      superseded_by="01JRW000000000000000000052")
    tie(daemon)
    daemon.wait(120_000)
    daemon.sse(1, "daemon_reconnect")
    files = [broker.write_jsonl(directory), daemon.write_jsonl(directory)]
    return files, want


@pytest.mark.spark
def test_every_engine_breaks_a_tie_on_one_seq_by_the_lines(spark, tmp_path: Path):
    files, want = tied_trace(tmp_path / "jsonl")
    by_oracle = oracle.check(files)
    assert by_oracle.invalid_count == 0
    assert by_oracle.counts.get("TRC-SEQ-MONOTONIC", 0) == 2  # one per node: the ties are there
    chosen = {(v.invariant, dict(v.key).get("client_message_id", "")): (v.event, v.related)
              for v in by_oracle.violations}
    for case, refs in want.items():
        assert chosen.get(case) == refs, case
    assert same_answers(by_oracle, SparkChecker(spark, limit=None).check(files)) == []
    # evidence names where each event is (a JSONL file's line or a Parquet row): Parquet against Parquet
    fmt.convert_jsonl(files, tmp_path / "parquet")
    by_oracle = oracle.check(tmp_path / "parquet")
    assert {(v.invariant, dict(v.key).get("client_message_id", "")): (v.event, v.related)
            for v in by_oracle.violations} == chosen
    for other in (duck.check(tmp_path / "parquet"), SparkChecker(spark, limit=None).check(tmp_path / "parquet")):
        assert same_answers(by_oracle, other) == [], other.engine
        assert other.counts == by_oracle.counts, other.engine
