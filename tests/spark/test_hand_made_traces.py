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

import pyarrow as pa
import pyarrow.compute
import pytest
from trace_testkit import Broker, Daemon, fingerprint, same_answers

from spark_checks import format as fmt
from spark_checks import oracle
from spark_checks.catalogue import EventRef, hook_reply_id
from spark_checks.generate import Params, generate

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
    # stopped between the decision and its accept, restarted: the row's next transition is its dispatch
    daemon.decision("n-5", A, "none", None, "IPC-NEW", 202, ulid(5))
    daemon.decision("n-6", A, "none", None, "IPC-NEW", 202, None)
    daemon.transition(ulid(6), "n-6", A, "none", "pending", "accept", "OB-NONE-ACCEPT", 0)
    daemon.transition(ulid(5), "n-5", A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 1)
    daemon.decision("n-7", A, "none", None, "IPC-NEW", 202, None)  # stopped for good before its accept
    # after every dispatch (else the second decision, followed by nothing, is also new-row-untraced: n-5's first
    # transition, its dispatch, comes after it)
    first = daemon.decision("n-4", A, "none", None, "IPC-NEW", 202, None)
    gone = daemon.decision("n-4", A, "none", None, "IPC-NEW", 202, None)  # the id was free again
    return [daemon], {
        ("TRC-NEW-ROW-TRACED", (("node", "daemon-new"), ("client_message_id", "n-1")), at(untraced), None),
        ("TRC-NEW-ROW-TRACED", (("node", "daemon-new"), ("client_message_id", "n-3")), at(wrong), at(other)),
        ("TRC-NEW-ROW-TRACED", (("node", "daemon-new"), ("client_message_id", "n-4")), at(gone), at(first)),
    }, ""  # n-5's first traced transition is its dispatch: TRC-OUTBOX-LEGAL allows that too, its decision naming
    # the row (E-32)


def new_row_first_transitions() -> tuple[list[Any], set[Identity], str]:
    """TRC-NEW-ROW-TRACED's "an id whose first transition it traced after the decision" is the id's first
    transition from any state: a dispatch whose accept's event was lost (E-32) counts, and a later `none` start (a
    second row of the id) does not make an earlier id new (the engines once took each id's first `none` start)."""
    daemon = Daemon("daemon-first")
    untraced = daemon.decision("f-1", A, "none", None, "IPC-NEW", 202, ulid(31))
    daemon.decision("f-2", A, "none", None, "IPC-NEW", 202, ulid(32))
    daemon.transition(ulid(32), "f-2", A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 1)
    daemon.transition(ulid(32), "f-2", A, "inflight", "done", "ack_created", "OB-INFLIGHT-CREATED", 1,
                      broker_message_id="01JBROKERMESSAGE0000000001")
    other = Daemon("daemon-second")
    other.decision("s-2", A, "none", None, "IPC-NEW", 202, ulid(42))
    first = other.transition(ulid(42), "s-2", A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 1)
    other.transition(ulid(42), "s-2", A, "inflight", "done", "ack_created", "OB-INFLIGHT-CREATED", 1,
                     broker_message_id="01JBROKERMESSAGE0000000001")
    other.decision("s-1", A, "none", None, "IPC-NEW", 202, ulid(41))  # stopped for good before its accept
    again = other.transition(ulid(43), "s-2", A, "none", "pending", "accept", "OB-NONE-ACCEPT", 0)
    other.transition(ulid(43), "s-2", A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 1)
    return [daemon, other], {
        ("TRC-NEW-ROW-TRACED", (("node", "daemon-first"), ("client_message_id", "f-1")), at(untraced), None),
        ("TRC-ID-NEVER-FREED", (("node", "daemon-second"), ("client_message_id", "s-2")), at(again), at(first)),
    }, ""


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


def message_events() -> tuple[list[Any], set[Identity], str]:
    """A daemon writes a new row's inbox_insert before its message event (E-32)."""
    dup = Daemon("daemon-events")
    dup.inbox_insert(PEER, "e-1", True, 1)
    dup.sse(1)
    dup.sse(2, "peer_join")  # not a message event
    redelivery = dup.inbox_insert(PEER, "e-1", False, 1)
    published = dup.sse(3)  # the redelivery publishes
    dup.inbox_insert(PEER, "e-2", True, 2)
    dup.sse(4)
    first = Daemon("daemon-events-first")  # writes each event before its insert, and one too many
    early = first.sse(1)
    first.inbox_insert(PEER, "f-1", True, 1)
    first.sse(2)
    first.inbox_insert(PEER, "f-1", False, None)
    first.sse(3)
    first.sse(4, "replay_gap")
    stopped = Daemon("daemon-events-stopped")
    stopped.inbox_insert(PEER, "k-1", True, 1)  # stopped before its message event, restarted
    stopped.inbox_insert(PEER, "k-2", True, 2)
    stopped.sse(1)
    stopped.inbox_insert(PEER, "k-2", False, None)
    stopped.sse(2, "outbox_dead")
    before = Daemon("daemon-events-before")  # writes each event before its insert: passes while the counts agree
    for n in (1, 2):
        before.sse(n)
        before.inbox_insert(PEER, f"b-{n}", True, n)
    offset = Daemon("daemon-events-offset")  # the boundary: a new row without its event hides a duplicate's
    offset.inbox_insert(PEER, "o-1", True, 1)
    offset.inbox_insert(PEER, "o-1", False, 1)
    offset.sse(1)
    return [dup, first, stopped, before, offset], {
        ("TRC-MESSAGE-EVENT-NEW-ROW", (("node", "daemon-events"),), at(published), at(redelivery)),
        ("TRC-MESSAGE-EVENT-NEW-ROW", (("node", "daemon-events-first"),), at(early), None),
    }, ""


def max_age_kept() -> tuple[list[Any], set[Identity], str]:
    daemon = Daemon("daemon-age")
    found: set[Identity] = set()

    def row(n: int, *steps: tuple[int | None, int | None], wait: int = 0) -> list[dict[str, Any]]:
        """accept, dispatch (``wait`` ms later), ack_created of row ``n``, each with its (max_age_at_ms,
        enqueued_at_ms) change."""
        cmid, bmid = f"g-{n}", "01JBROKERMESSAGE0000000001"
        shapes = [("none", "pending", "accept", "OB-NONE-ACCEPT", 0, None),
                  ("pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 1, None),
                  ("inflight", "done", "ack_created", "OB-INFLIGHT-CREATED", 1, bmid)]
        events = []
        for (fr, to, ev, table_row, attempts, named), (max_age_at, enqueued_at) in zip(shapes, steps, strict=True):
            daemon.wait(wait if ev == "dispatch" else 0)
            event = daemon.transition(ulid(n), cmid, A, fr, to, ev, table_row, attempts, broker_message_id=named)
            event["max_age_at_ms"] = max_age_at
            if enqueued_at is not None:
                event["enqueued_at_ms"] = enqueued_at
            events.append(event)
        return events

    def key(n: int) -> tuple[tuple[str, str], ...]:
        return (("node", "daemon-age"), ("outbox_id", ulid(n)))

    t = daemon.ts
    # accepted with a deadline 1 s out, dispatched 5 s later by a transition claiming an hour (the V52 shape)
    accepted, dispatched, _ = row(1, (t + 1_000, None), (t + 3_600_000, None), (t + 3_600_000, None), wait=5_000)
    assert accepted["max_age_at_ms"] < dispatched["ts_ms"] < dispatched["max_age_at_ms"]
    found.add(("TRC-MAX-AGE", key(1), at(dispatched), at(accepted)))
    t = daemon.ts
    # lowered (a shorter negotiated max age caps a live row), and set on a row that had none: allowed
    row(2, (None, None), (t + 3_000_000, None), (t + 2_000_000, None))
    # raised to none after the dispatch, not over age at any dispatch: still a moved deadline
    _, sent, done = row(3, (t + 60_000, None), (t + 60_000, None), (None, None))
    found.add(("TRC-MAX-AGE", key(3), at(done), at(sent)))
    # the enqueue time moves (the row's age would restart)
    first, moved, _ = row(4, (t + 60_000, None), (t + 60_000, t + 50_000), (t + 60_000, t + 50_000))
    found.add(("TRC-MAX-AGE", key(4), at(moved), at(first)))
    # over age by its own deadline and raised at once: the dispatch after the deadline is what is reported
    daemon.wait(10_000)
    _, late, _ = row(5, (daemon.ts - 5_000, None), (daemon.ts - 4_000, None), (daemon.ts - 4_000, None))
    found.add(("TRC-MAX-AGE", key(5), at(late), None))
    return [daemon], found, "TRC-MAX-AGE"


def interleaved_rows() -> tuple[list[Any], set[Identity], str]:
    """Two rows of one client_message_id whose transitions interleave (the second row is the TRC-ID-NEVER-FREED
    violation): each row's transition is compared with the previous transition of the same row, not with the other
    row's that came between them -- so a legal step is not reported, and a moved deadline, a moved enqueue time, a
    wrong `from` and wrong attempts are, each against its own row's previous transition."""
    daemon = Daemon("daemon-mix")
    cmid = "x-1"

    def key(n: int) -> tuple[tuple[str, str], ...]:
        return (("node", "daemon-mix"), ("outbox_id", ulid(n)))

    first = daemon.transition(ulid(11), cmid, A, "none", "pending", "accept", "OB-NONE-ACCEPT", 0)
    daemon.transition(ulid(11), cmid, A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 1)
    second = daemon.transition(ulid(12), cmid, A, "none", "pending", "accept", "OB-NONE-ACCEPT", 0)
    back = daemon.transition(ulid(11), cmid, A, "inflight", "pending", "ack_timeout", "OB-INFLIGHT-FAILED", 1)
    raised = daemon.transition(ulid(11), cmid, A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 2)
    raised["max_age_at_ms"] += 60_000
    moved = daemon.transition(ulid(12), cmid, A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 1)
    moved["enqueued_at_ms"] += 1
    wrong_from = daemon.transition(ulid(11), cmid, A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 3)
    wrong_attempts = daemon.transition(ulid(12), cmid, A, "inflight", "pending", "ack_timeout", "OB-INFLIGHT-FAILED", 2)
    wrong_attempts["enqueued_at_ms"] += 1  # as the row's previous transition has it
    return [daemon], {
        ("TRC-ID-NEVER-FREED", (("node", "daemon-mix"), ("client_message_id", cmid)), at(second), at(first)),
        ("TRC-MAX-AGE", key(11), at(raised), at(back)),
        ("TRC-MAX-AGE", key(12), at(moved), at(second)),
        ("TRC-OUTBOX-LEGAL", key(11), at(wrong_from), at(raised)),
        ("TRC-OUTBOX-LEGAL", key(12), at(wrong_attempts), at(moved)),
    }, ""


def glued_keys() -> tuple[list[Any], set[Identity], str]:
    """Subjects whose key members, written one after another with a separator, read alike: a hook name or a mesh
    holding ``|`` (the schema allows it) against another node's or mesh's. Each subject is its own violation (a key
    is compared member by member; DuckDB once grouped by ``node || '|' || cmid || '|' || hook`` and reported one)."""
    wrong_reply = "hook." + "0" * 40
    a, b = Daemon("A"), Daemon("A|B")
    runs = []
    for daemon, cmid, hook in ((a, "B", "C|D"), (b, "C", "D")):
        daemon.hook_enqueue(cmid, hook, 1)
        daemon.hook_enqueue(cmid, hook, 1)  # enqueued twice: TRC-HOOK-ONCE
        runs.append((daemon, cmid, hook, daemon.hook_run(cmid, hook, 1, reply=wrong_reply, http_status=202)))
    found: set[Identity] = set()
    for daemon, cmid, hook, run in runs:
        key = (("node", daemon.node), ("client_message_id", cmid), ("hook", hook))
        found.add(("TRC-HOOK-REPLY-ID", key, at(run), None))
        first, second = [e for e in daemon.events if e["kind"] == "hook_enqueue"]
        found.add(("TRC-HOOK-ONCE", key, at(second), at(first)))
    brokers = []
    for broker, delivery_id in ((Broker("brk-1", mesh="M"), "X|Y"), (Broker("brk-2", mesh="M|X"), "Y")):
        broker.commit("c1", A, "01JBROKERMESSAGE0000000001")
        sent = broker.delivery("c1", "01JBROKERMESSAGE0000000001", PEER, 1)
        sent["delivery_id"] = delivery_id
        broker.wait(100_000)  # its lease ran out before the broker's last event, unacked
        broker.commit("c2", A, "01JBROKERMESSAGE0000000002")
        found.add(("TRC-DELIVERY-ACKED", (("mesh", broker.mesh), ("delivery_id", delivery_id)), at(sent), None))
        brokers.append(broker)
    return [a, b, *brokers], found, ""


def acks_name_deliveries() -> tuple[list[Any], set[Identity], str]:
    broker = Broker("broker-acks", mesh="m3")
    other = "ef" * 32
    found: set[Identity] = set()

    def key(cmid: str, mesh: str = "m3") -> tuple[tuple[str, str], ...]:
        return (("mesh", mesh), ("delivery_id", f"M-{cmid}.0"))

    for cmid in ("a-1", "a-2", "a-3", "a-4", "a-5", "a-6", "a-7"):
        broker.commit(cmid, A, f"M-{cmid}")
        broker.decision(cmid, A, "BRK-ACCEPT", f"M-{cmid}")
    broker.delivery("a-1", "M-a-1", PEER, 1)
    broker.ack("a-1", "M-a-1", PEER)
    broker.ack("a-1", "M-a-1", PEER)  # acked twice: the second settles nothing new, names the same delivery
    never = broker.ack("a-2", "M-a-2", PEER)  # never delivered
    found.add(("TRC-DELIVERY-ACKED", key("a-2"), at(never), None))
    broker.delivery("a-3", "M-a-3", PEER, 1)
    stranger = broker.ack("a-3", "M-a-3", other)  # another member's ack of PEER's delivery
    broker.ack("a-3", "M-a-3", PEER)
    found.add(("TRC-DELIVERY-ACKED", key("a-3"), at(stranger), None))
    broker.delivery("a-4", "M-a-4", PEER, 1)
    wrong = broker.ack("a-4", "M-a-4", PEER)
    wrong["broker_message_id"] = "M-a-1"  # names another message
    broker.ack("a-4", "M-a-4", PEER)
    found.add(("TRC-DELIVERY-ACKED", key("a-4"), at(wrong), None))
    broker.delivery("a-5", "M-a-5", PEER, 1)
    elsewhere = broker.ack("a-5", "M-a-5", PEER)
    elsewhere["mesh"] = "m4"  # on another mesh; the delivery on m3 is still leased
    found.add(("TRC-DELIVERY-ACKED", key("a-5", "m4"), at(elsewhere), None))
    early = broker.ack("a-6", "M-a-6", PEER)  # before its delivery: a delivery after the ack
    delivered = broker.delivery("a-6", "M-a-6", PEER, 1)
    found.add(("TRC-DELIVERY-ACKED", key("a-6"), at(delivered), at(early)))
    broker.delivery("a-7", "M-a-7", PEER, 1)
    broker.delivery("a-7", "M-a-7", PEER, 2)
    broker.ack("a-7", "M-a-7", PEER)
    return [broker], found, "TRC-DELIVERY-ACKED"


def outbox_first_and_successors() -> tuple[list[Any], set[Identity], str]:
    """A row's first traced transition, and requeue successors (REQUEUE-ATOMIC, the schema's 'same table_row')."""
    daemon = Daemon("daemon-outbox")

    def key(n: int) -> tuple[tuple[str, str], ...]:
        return (("node", "daemon-outbox"), ("outbox_id", ulid(n)))

    def retired(n: int, cmid: str, successor: int, table_row: str = "OB-DEAD-REQUEUE") -> dict[str, Any]:
        daemon.transition(ulid(n), cmid, A, "none", "pending", "accept", "OB-NONE-ACCEPT", 0)
        if table_row == "OB-PENDING-REQUEUE":
            return daemon.transition(ulid(n), cmid, A, "pending", "aborted", "requeue", table_row, 0,
                                     superseded_by=ulid(successor))
        daemon.transition(ulid(n), cmid, A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 1)
        daemon.transition(ulid(n), cmid, A, "inflight", "dead", "ack_rejected", "OB-INFLIGHT-REJECTED", 1)
        return daemon.transition(ulid(n), cmid, A, "dead", "aborted", "requeue", table_row, 1,
                                 superseded_by=ulid(successor))

    # stopped between the commit that created a row and its accept event, restarted: the first traced transition
    # starts at pending, attempts counted from 0, when the trace shows the row created (a 202 IPC-NEW naming it,
    # before or after), else it is reported
    daemon.decision("k-1", A, "none", None, "IPC-NEW", 202, ulid(1))
    daemon.transition(ulid(1), "k-1", A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 1)
    daemon.transition(ulid(1), "k-1", A, "inflight", "done", "ack_created", "OB-INFLIGHT-CREATED", 1,
                      broker_message_id="01JBROKERMESSAGE0000000001")
    nothing = daemon.transition(ulid(2), "k-2", A, "pending", "aborted", "requeue", "OB-PENDING-REQUEUE", 0,
                                superseded_by=ulid(23))
    daemon.transition(ulid(23), "k-2.r1", A, "none", "pending", "requeue", "OB-PENDING-REQUEUE", 0)
    daemon.decision("k-3", A, "none", None, "IPC-NEW", 202, ulid(3))
    bad_attempts = daemon.transition(ulid(3), "k-3", A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 2)
    names_another = daemon.decision("k-24", A, "none", None, "IPC-NEW", 202, ulid(25))
    another_row = daemon.transition(ulid(24), "k-24", A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH",
                                    1)
    # a decision naming the row that is not a 202 IPC-NEW (IPC-NEW is 202 by the schema) does not show it created
    not_new = daemon.transition(ulid(26), "k-26", A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 1)
    daemon.decision("k-26", A, "inflight", True, "IPC-INFLIGHT-MATCH", 202, ulid(26))
    daemon.decision("k-26", B, "inflight", False, "IPC-INFLIGHT-MISMATCH", 409, ulid(26))
    not_created = daemon.transition(ulid(4), "k-4", A, "inflight", "done", "ack_created", "OB-INFLIGHT-CREATED", 1,
                                    broker_message_id="01JBROKERMESSAGE0000000001")  # rows are created pending
    daemon.transition(ulid(5), "k-5", A, "none", "pending", "accept", "OB-NONE-ACCEPT", 0)
    second_row = daemon.transition(ulid(6), "k-5", A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 1)
    # requeue successors: traced with the old row's table_row, as the effect of one requeue
    retired(10, "q-1", 11)
    daemon.transition(ulid(11), "q-1.r1", A, "none", "pending", "requeue", "OB-DEAD-REQUEUE", 0)
    retired(12, "q-2", 13, "OB-PENDING-REQUEUE")
    daemon.transition(ulid(13), "q-2.r1", A, "none", "pending", "requeue", "OB-PENDING-REQUEUE", 0)
    old_row = retired(14, "q-3", 15)
    other_row = daemon.transition(ulid(15), "q-3.r1", A, "none", "pending", "requeue", "OB-PENDING-REQUEUE", 0)
    old_pending = retired(16, "q-4", 17, "OB-PENDING-REQUEUE")
    other_row_2 = daemon.transition(ulid(17), "q-4.r1", A, "none", "pending", "requeue", "OB-DEAD-REQUEUE", 0)
    daemon.transition(ulid(18), "q-5", A, "none", "pending", "accept", "OB-NONE-ACCEPT", 0)
    daemon.transition(ulid(18), "q-5", A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 1)
    daemon.transition(ulid(18), "q-5", A, "inflight", "dead", "ack_rejected", "OB-INFLIGHT-REJECTED", 1)
    orphan = daemon.transition(ulid(19), "q-5.r1", A, "none", "pending", "requeue", "OB-DEAD-REQUEUE", 0)
    # a successor whose own event is illegal is reported for that alone
    illegal = daemon.transition(ulid(20), "q-6.r1", A, "none", "pending", "requeue", "OB-DEAD-REQUEUE", 1)
    # the successor event lost to a stop after the old row's: the successor's first traced transition is its dispatch
    retired(21, "q-7", 22)
    daemon.transition(ulid(22), "q-7.r1", A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 1)
    daemon.transition(ulid(22), "q-7.r1", A, "inflight", "done", "ack_created", "OB-INFLIGHT-CREATED", 1,
                      broker_message_id="01JBROKERMESSAGE0000000001")
    return [daemon], {
        ("TRC-OUTBOX-LEGAL", key(2), at(nothing), None),
        ("TRC-OUTBOX-LEGAL", key(24), at(another_row), None),
        ("TRC-NEW-ROW-TRACED", (("node", "daemon-outbox"), ("client_message_id", "k-24")), at(another_row),
         at(names_another)),
        ("TRC-OUTBOX-LEGAL", key(26), at(not_new), None),
        ("TRC-OUTBOX-LEGAL", key(3), at(bad_attempts), None),
        ("TRC-OUTBOX-LEGAL", key(4), at(not_created), None),
        ("TRC-OUTBOX-LEGAL", key(6), at(second_row), None),
        ("TRC-OUTBOX-LEGAL", key(15), at(other_row), at(old_row)),
        ("TRC-OUTBOX-LEGAL", key(17), at(other_row_2), at(old_pending)),
        ("TRC-OUTBOX-LEGAL", key(19), at(orphan), None),
        ("TRC-OUTBOX-LEGAL", key(20), at(illegal), None),
    }, ""


def ipc_after_lost_creation() -> tuple[list[Any], set[Identity], str]:
    """Stopped between the commit of an IPC-NEW and its accept event, restarted (E-32): a re-post finds the row the
    decision created, `pending` with its fingerprint and outbox_id, before any transition is traced."""
    daemon = Daemon("daemon-lost")

    def key(cmid: str) -> tuple[tuple[str, str], ...]:
        return (("node", "daemon-lost"), ("client_message_id", cmid))

    daemon.decision("l-1", A, "none", None, "IPC-NEW", 202, ulid(31))
    daemon.decision("l-1", A, "pending", True, "IPC-PENDING-MATCH", 202, ulid(31))
    daemon.transition(ulid(31), "l-1", A, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 1)
    daemon.decision("l-1", B, "inflight", False, "IPC-INFLIGHT-MISMATCH", 409, ulid(31))
    daemon.decision("l-2", A, "none", None, "IPC-NEW", 202, ulid(32))
    daemon.decision("l-2", B, "pending", False, "IPC-PENDING-MISMATCH", 409, ulid(32))
    made_3 = daemon.decision("l-3", A, "none", None, "IPC-NEW", 202, ulid(33))
    found_none = daemon.decision("l-3", A, "none", None, "IPC-NEW", 202, ulid(33))  # the row exists
    made_4 = daemon.decision("l-4", A, "none", None, "IPC-NEW", 202, ulid(34))
    other_id = daemon.decision("l-4", A, "pending", True, "IPC-PENDING-MATCH", 202, ulid(35))
    made_5 = daemon.decision("l-5", A, "none", None, "IPC-NEW", 202, ulid(36))
    wrong_match = daemon.decision("l-5", A, "pending", False, "IPC-PENDING-MISMATCH", 409, ulid(36))
    daemon.decision("l-6", A, "none", None, "IPC-NEW", 202, None)  # names no row: nothing shows one created
    unnamed = daemon.decision("l-6", A, "pending", True, "IPC-PENDING-MATCH", 202, None)
    made_7 = daemon.decision("l-7", A, "none", None, "IPC-NEW", 202, ulid(37))  # re-posted across Spark's chunks
    for _ in range(9):
        daemon.decision("l-7", A, "pending", True, "IPC-PENDING-MATCH", 202, ulid(37))
    far = daemon.decision("l-7", A, "pending", True, "IPC-PENDING-MATCH", 202, ulid(38))
    return [daemon], {
        ("TRC-IPC-CONSISTENT", key("l-7"), at(far), at(made_7)),
        ("TRC-IPC-CONSISTENT", key("l-3"), at(found_none), at(made_3)),
        ("TRC-IPC-CONSISTENT", key("l-4"), at(other_id), at(made_4)),
        ("TRC-IPC-CONSISTENT", key("l-5"), at(wrong_match), at(made_5)),
        ("TRC-IPC-CONSISTENT", key("l-6"), at(unnamed), None),
    }, "TRC-IPC-CONSISTENT"


def hook_runs() -> tuple[list[Any], set[Identity], str]:
    """TRC-HOOK-*: a run enqueued twice, marked twice, marked before (or without) its enqueue, never marked while
    the daemon traced on, and a reply under another id; next to the shapes allowed: a run whose daemon stopped before
    it was marked, one still within its timeout, a failed and a timed-out run, a reply refused with 409."""
    daemon = Daemon("daemon-hooks", mesh="m-hooks")

    def key(cmid: str, hook: str = "on-message") -> tuple[tuple[str, str], ...]:
        return (("node", "daemon-hooks"), ("client_message_id", cmid), ("hook", hook))

    # allowed: enqueued, run, replied under the derived id (a re-run's reply answered 409 is still that id)
    daemon.inbox_insert(PEER, "h-1", True, 1)
    daemon.hook_enqueue("h-1", "on-message", 1)
    daemon.hook_enqueue("h-1", "on-topic-t0", 1)
    daemon.hook_run("h-1", "on-message", 1, reply=hook_reply_id("h-1", "on-message"), http_status=202)
    daemon.hook_run("h-1", "on-topic-t0", 1, to="timed_out", claims=2)
    daemon.hook_enqueue("h-2", "on-message", 2)
    daemon.hook_run("h-2", "on-message", 2, to="failed", reply=None)
    # a redelivery that enqueued the hook again, and a run marked twice
    first_enqueue = daemon.hook_enqueue("h-3", "on-message", 3)
    daemon.hook_run("h-3", "on-message", 3)
    again = daemon.hook_enqueue("h-3", "on-message", 3)
    first_run = daemon.hook_run("h-4", "on-message", 4)  # and no enqueue before it: unenqueued too
    second_run = daemon.hook_run("h-4", "on-message", 4, to="failed")
    # marked before its enqueue
    early = daemon.hook_run("h-5", "on-message", 5)
    late = daemon.hook_enqueue("h-5", "on-message", 5)
    # a reply under another id, twice: reported at the first
    daemon.hook_enqueue("h-6", "on-dm", 6)
    wrong = daemon.hook_run("h-6", "on-dm", 6, reply=hook_reply_id("h-6", "on-message"), http_status=202)
    # never marked: enqueued, then the daemon traced on for longer than the timeout and the grace
    unfinished = daemon.hook_enqueue("h-7", "on-message", 7)
    daemon.wait(40_001)
    daemon.sse(1, "daemon_reconnect")
    # still within its timeout when the trace ends
    daemon.hook_enqueue("h-8", "on-message", 8)
    daemon.wait(39_000)
    daemon.sse(2, "daemon_reconnect")
    return [daemon], {
        ("TRC-HOOK-ONCE", key("h-3"), at(again), at(first_enqueue)),
        ("TRC-HOOK-ONCE", key("h-4"), at(second_run), at(first_run)),
        ("TRC-HOOK-ENQUEUED", key("h-4"), at(first_run), None),
        ("TRC-HOOK-ENQUEUED", key("h-5"), at(early), at(late)),
        ("TRC-HOOK-REPLY-ID", key("h-6", "on-dm"), at(wrong), None),
        ("TRC-HOOK-RUN-FINISHED", key("h-7"), at(unfinished), None),
    }, ""


CASES: dict[str, Callable[[], tuple[list[Any], set[Identity], str]]] = {
    "TRC-HOOK-*": hook_runs,
    "TRC-IPC-CONSISTENT": ipc_after_lost_creation,
    "TRC-DUP-FINGERPRINT": dup_fingerprint,
    "TRC-NEW-ROW-TRACED": new_row_traced,
    "TRC-INFLIGHT-RESOLVED": inflight_resolved,
    "TRC-DELIVERY-ATTEMPTS": delivery_attempts,
    "TRC-INBOX-SEQ-NAMES-ROW": inbox_seq_names_row,
    "TRC-INBOX-SEQ-MONOTONIC": inbox_seq_monotonic,
    "TRC-MAX-AGE": max_age_kept,
    "TRC-DELIVERY-ACKED": acks_name_deliveries,
    "TRC-OUTBOX-LEGAL": outbox_first_and_successors,
    "TRC-MESSAGE-EVENT-NEW-ROW": message_events,
    "interleaved rows": interleaved_rows,
    "glued keys": glued_keys,
    "new rows' first transitions": new_row_first_transitions,
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


def test_the_oracle_does_not_trust_a_parquet_layout(tmp_path: Path):
    """A Parquet trace laid out by anything but ``meshtrace convert``'s buckets -- here a writer that rolls each node's
    events into a directory per period -- splits subjects across directories: the oracle finds that and replays the
    trace whole (bucket by bucket it reported 70 violations where there were 38, before the hook cases), so it
    reports what DuckDB does; a generated trace is still read bucket by bucket."""
    import pyarrow.parquet as pq

    pytest.importorskip("duckdb")
    from spark_checks import duck

    files = [node.write_jsonl(tmp_path / "jsonl") for build in CASES.values() for node in build()[0]]
    fmt.convert_jsonl(files, tmp_path / "bucketed")
    table = pq.read_table(tmp_path / "bucketed", schema=fmt.FLAT_SCHEMA)
    period = pa.compute.bit_wise_and(table["line"], 3)  # each node's lines 0-3 in period 0, 1, 2, 3, 0, ...
    for k in range(4):
        (tmp_path / "rolled" / f"period={k}").mkdir(parents=True)
        part = table.filter(pa.compute.equal(period, k)).select(fmt.FLAT_SCHEMA.names)
        pq.write_table(part, tmp_path / "rolled" / f"period={k}" / "part.parquet")

    def groups(root: Path) -> dict[str, list[str]]:
        return {str(d): [str(f) for f in d.glob("*.parquet")] for d in root.iterdir()}

    assert fmt.split_subjects(groups(tmp_path / "rolled"))
    # a generated trace's buckets hold their subjects whole (these cases reuse one delivery_id across messages)
    generate(tmp_path / "generated", Params(events=3000, daemons=4, seed=5))
    assert not fmt.split_subjects(groups(tmp_path / "generated" / "events"))
    by_oracle, by_duck = oracle.check(tmp_path / "rolled"), duck.check(tmp_path / "rolled")
    assert len(by_oracle.violations) == 57
    assert by_oracle.identities() == by_duck.identities() == oracle.check(tmp_path / "bucketed").identities()
    assert {v.identity: v.detail for v in by_duck.violations} == {v.identity: v.detail for v in by_oracle.violations}


@pytest.mark.spark
def test_spark_reports_the_same_in_one_run_over_every_case(spark, tmp_path: Path):
    from spark_checks.spark import SparkChecker

    files = [node.write_jsonl(tmp_path / "jsonl") for build in CASES.values() for node in build()[0]]
    fmt.convert_jsonl(files, tmp_path / "parquet")
    by_spark = SparkChecker(spark, chunk=4, limit=None).check(tmp_path / "parquet")  # chunk boundaries everywhere
    by_oracle = oracle.check(tmp_path / "parquet")  # the same input: evidence from JSONL also names file:line
    assert len(by_oracle.violations) == 57
    assert same_answers(by_spark, by_oracle) == []
    from spark_checks.cli import main as meshtrace

    report = tmp_path / "report.json"
    for limit in (0, 2):  # Spark fetches only what it lists: the same ones, and every count
        assert meshtrace(["check", str(tmp_path / "parquet"), "--engine", "spark", "--master", "local[2]",
                          "--limit", str(limit), "--report", str(report)]) == 1
        document = json.loads(report.read_text())
        assert listed(document) == expected_listing(by_oracle, limit), limit
        assert {i["id"]: i["violations"] for i in document["invariants"] if i["violations"]} == by_oracle.counts


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


def listed(document: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(v["invariant"], tuple(v["key"].items()), v["event"]["node"], v["event"]["seq"], v["event"]["line"])
            for v in document["violations"]]


def expected_listing(report: oracle.Report, limit: int) -> list[tuple[Any, ...]]:
    """What a report limited to ``limit`` per invariant lists: per invariant, the violations whose event comes first,
    then whose related event does (none first)."""
    kept = []
    for invariant in {v.invariant for v in report.violations}:
        found = [v for v in report.violations if v.invariant == invariant]
        kept += sorted(found, key=lambda v: (v.event, v.related is not None, v.related or v.event, v.key))[:limit]
    return listed({"violations": [v.as_dict() for v in oracle.sort_violations(kept)]})


@pytest.mark.parametrize("engine", ["oracle", "duckdb"])
def test_limit_lists_the_same_violations_and_counts_them_all(tmp_path: Path, engine: str):
    """``--limit N`` lists the same N violations per invariant in every engine and counts them all; any violation
    makes the exit code 1, even when none is listed (``--limit 0``: Spark once exited 0 then, the others ignored
    the limit)."""
    from spark_checks.cli import main as meshtrace

    if engine == "duckdb":
        pytest.importorskip("duckdb")
    files = [node.write_jsonl(tmp_path / "jsonl") for build in CASES.values() for node in build()[0]]
    whole = oracle.check(files)
    assert max(whole.counts.values()) >= 3
    report = tmp_path / "report.json"
    for limit in (0, 1, 2):
        assert meshtrace(["check", *map(str, files), "--engine", engine, "--limit", str(limit),
                          "--report", str(report)]) == 1
        document = json.loads(report.read_text())
        assert listed(document) == expected_listing(whole, limit), limit
        assert {i["id"]: i["violations"] for i in document["invariants"] if i["violations"]} == whole.counts
    clean = Daemon("daemon-clean")
    clean.done_row(ulid(90), "clean-1", A)
    assert meshtrace(["check", str(clean.write_jsonl(tmp_path / "clean")), "--engine", engine, "--limit", "0"]) == 0
