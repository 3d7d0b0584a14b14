"""Hand-made violations: one subject for each ``catalogue.DETAILS`` case of the thirteen invariants the catalogue
started with (and of TRC-MESSAGE-EVENT-NEW-ROW and TRC-HOOK-*) that a schema-valid event can reach, written as JSONL
(one file per node), with the detail every engine must print for it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from spark_checks.catalogue import hook_reply_id

BASE = 1_767_225_600_000
MESH = "mesh-hand"
LATE = BASE + 3_600_000  # the max_age_at_ms of a row that never ages out here
A, B = (hashlib.sha256(text.encode()).hexdigest() for text in ("a", "b"))
RECIPIENT, MEMBER = (hashlib.sha256(text.encode()).hexdigest() for text in ("recipient", "member"))

Key = tuple[tuple[str, str], ...]


def ulid(n: int) -> str:
    """A valid ULID (common/defs ulid) numbered ``n``."""
    return f"01JH{n:022d}"


class Node:
    """One node's JSONL stream: seq counts up from 0 and ts_ms is BASE + seq unless an event says otherwise."""

    def __init__(self, source: str, node: str):
        self.source, self.node, self.seq = source, node, 0
        self.events: list[dict[str, Any]] = []

    def emit(self, kind: str, seq: int | None = None, ts_ms: int | None = None, **members: Any) -> dict[str, Any]:
        seq = self.seq if seq is None else seq
        event = {"v": 1, "source": self.source, "node": self.node, "seq": seq,
                 "ts_ms": BASE + seq if ts_ms is None else ts_ms, "kind": kind, **members}
        self.seq = seq + 1
        self.events.append(event)
        return event

    def transition(self, oid: str, cmid: str, fp: str, from_state: str, event: str, to_state: str, table_row: str,
                   attempts: int, broker_message_id: str | None = None, max_age_at_ms: int | None = LATE,
                   superseded_by: str | None = None, ts_ms: int | None = None) -> dict[str, Any]:
        return self.emit("outbox_transition", ts_ms=ts_ms, mesh=MESH, outbox_id=oid, client_message_id=cmid,
                         request_fingerprint=fp, **{"from": from_state, "to": to_state}, event=event,
                         table_row=table_row, attempts=attempts, enqueued_at_ms=BASE, max_age_at_ms=max_age_at_ms,
                         broker_message_id=broker_message_id, superseded_by=superseded_by)

    def decision(self, cmid: str, fp: str, row_state: str, match: bool | None, table_row: str, status: int,
                 oid: str | None) -> dict[str, Any]:
        return self.emit("ipc_decision", mesh=MESH, client_message_id=cmid, request_fingerprint=fp,
                         row_state=row_state, fingerprint_match=match, table_row=table_row, http_status=status,
                         outbox_id=oid)

    def accepted(self, oid: str, cmid: str, fp: str = A) -> None:
        """IPC-NEW and the new pending row."""
        self.decision(cmid, fp, "none", None, "IPC-NEW", 202, None)
        self.transition(oid, cmid, fp, "none", "accept", "pending", "OB-NONE-ACCEPT", 0)

    def sse(self, event_id: int, seq: int | None = None, event: str = "peer_join") -> dict[str, Any]:
        return self.emit("sse_event", seq=seq, event_id=event_id, event=event)

    def inbox(self, cmid: str, bmid: str, inbox_seq: int) -> dict[str, Any]:
        return self.emit("inbox_insert", mesh=MESH, recipient=RECIPIENT, client_message_id=cmid,
                         broker_message_id=bmid, delivery_id=f"{bmid}.0", inserted=True, inbox_seq=inbox_seq)

    def accept(self, cmid: str, bmid: str) -> dict[str, Any]:
        return self.emit("accept_decision", mesh=MESH, client_message_id=cmid, request_fingerprint=A,
                         table_row="BRK-ACCEPT", phase="B3", status=201, broker_message_id=bmid, member=MEMBER)

    def commit(self, cmid: str, bmid: str, history: int = 1, ts_ms: int | None = None) -> dict[str, Any]:
        return self.emit("accept_commit", ts_ms=ts_ms, mesh=MESH, client_message_id=cmid, broker_message_id=bmid,
                         request_fingerprint=A, destination_kind="topic", destination_ref="t0",
                         effects={"dedupe": 1, "message": 1, "history": history, "delivery": 1}, recipients=1)

    def delivery(self, cmid: str, bmid: str, attempt: int, lease_until_ms: int) -> dict[str, Any]:
        return self.emit("delivery", mesh=MESH, broker_message_id=bmid, client_message_id=cmid, recipient=RECIPIENT,
                         delivery_id=f"{bmid}.0", attempt=attempt, lease_until_ms=lease_until_ms)

    def ack(self, cmid: str, bmid: str) -> dict[str, Any]:
        return self.emit("delivery_ack", mesh=MESH, broker_message_id=bmid, client_message_id=cmid,
                         recipient=RECIPIENT, delivery_id=f"{bmid}.0")


def hand_made(root: Path) -> tuple[Path, dict[tuple[str, Key], str]]:
    """Write the trace under ``root/hand-made`` (one ``<node>.jsonl`` each); returns the directory and, per reported
    (invariant, key), the detail every engine must print."""
    d, s, i, b = Node("daemon", "daemon-a"), Node("daemon", "daemon-s"), Node("daemon", "daemon-i"), \
        Node("broker", "broker-h")
    want: dict[tuple[str, Key], str] = {}

    def row(invariant: str, oid: str) -> tuple[str, Key]:
        return invariant, (("node", "daemon-a"), ("outbox_id", oid))

    def cmid_key(invariant: str, cmid: str) -> tuple[str, Key]:
        return invariant, (("node", "daemon-a"), ("client_message_id", cmid))

    def message(invariant: str, cmid: str) -> tuple[str, Key]:
        return invariant, (("mesh", MESH), ("client_message_id", cmid))

    # TRC-OUTBOX-LEGAL (its outbox-not-a-transition case has no valid event: the schema ties each table_row to its
    # from, event and to)
    d.accepted(ulid(2), "c-from")
    d.transition(ulid(2), "c-from", A, "pending", "dispatch", "inflight", "OB-PENDING-DISPATCH", 1)
    d.transition(ulid(2), "c-from", A, "inflight", "ack_failed", "pending", "OB-INFLIGHT-FAILED", 1)
    d.transition(ulid(2), "c-from", A, "inflight", "ack_failed", "pending", "OB-INFLIGHT-FAILED", 1)
    want[row("TRC-OUTBOX-LEGAL", ulid(2))] = ("inflight --ack_failed--> pending (OB-INFLIGHT-FAILED), but the row "
                                              "was pending")
    d.accepted(ulid(3), "c-attempts")
    d.transition(ulid(3), "c-attempts", A, "pending", "dispatch", "inflight", "OB-PENDING-DISPATCH", 2)
    want[row("TRC-OUTBOX-LEGAL", ulid(3))] = ("pending --dispatch--> inflight (OB-PENDING-DISPATCH) with attempts 2, "
                                              "expected 1")
    d.transition(ulid(30), "c-requeued", A, "none", "accept", "pending", "OB-NONE-ACCEPT", 0)
    d.transition(ulid(30), "c-requeued", A, "pending", "requeue", "aborted", "OB-PENDING-REQUEUE", 0,
                 superseded_by=ulid(31))
    d.transition(ulid(31), "c-requeued.r1", A, "none", "requeue", "pending", "OB-DEAD-REQUEUE", 0)
    want[row("TRC-OUTBOX-LEGAL", ulid(31))] = (f"requeue successor {ulid(31)} traced with OB-DEAD-REQUEUE; the "
                                               f"retired row {ulid(30)} was requeued with OB-PENDING-REQUEUE")
    d.transition(ulid(32), "c-orphan.r1", A, "none", "requeue", "pending", "OB-DEAD-REQUEUE", 0)
    want[row("TRC-OUTBOX-LEGAL", ulid(32))] = (f"requeue successor {ulid(32)} (OB-DEAD-REQUEUE): no row was requeued "
                                               "in its favour (none names it in superseded_by)")
    # TRC-IPC-CONSISTENT (nor has its ipc-answer case: the schema ties each table_row to its row_state,
    # fingerprint_match and http_status)
    d.accepted(ulid(4), "c-ipc-state")
    d.decision("c-ipc-state", A, "inflight", True, "IPC-INFLIGHT-MATCH", 202, ulid(4))
    want[cmid_key("TRC-IPC-CONSISTENT", "c-ipc-state")] = ("IPC-INFLIGHT-MATCH 202 for row_state inflight, but the "
                                                           "row was pending")
    d.accepted(ulid(5), "c-ipc-match")
    d.decision("c-ipc-match", A, "pending", False, "IPC-PENDING-MISMATCH", 409, ulid(5))
    want[cmid_key("TRC-IPC-CONSISTENT", "c-ipc-match")] = (f"IPC-PENDING-MISMATCH 409 with fingerprint_match false "
                                                           f"for request fingerprint {A}, expected true")
    d.accepted(ulid(7), "c-ipc-oid")
    d.decision("c-ipc-oid", A, "pending", True, "IPC-PENDING-MATCH", 202, ulid(70))
    want[cmid_key("TRC-IPC-CONSISTENT", "c-ipc-oid")] = (f"IPC-PENDING-MATCH 202 names outbox_id {ulid(70)}, but "
                                                         f"the row is {ulid(7)}")
    # TRC-FP-FROZEN
    d.accepted(ulid(8), "c-fp")
    d.transition(ulid(8), "c-fp", B, "pending", "dispatch", "inflight", "OB-PENDING-DISPATCH", 1)
    want[row("TRC-FP-FROZEN", ulid(8))] = (f"pending --dispatch--> inflight carries fingerprint {B}; the row's "
                                           f"frozen fingerprint (its first transition's) is {A}")
    d.transition(ulid(9), "c-retired", A, "none", "accept", "pending", "OB-NONE-ACCEPT", 0)
    d.transition(ulid(9), "c-retired", A, "pending", "dispatch", "inflight", "OB-PENDING-DISPATCH", 1)
    d.transition(ulid(9), "c-retired", A, "inflight", "ack_rejected", "dead", "OB-INFLIGHT-REJECTED", 1)
    d.transition(ulid(9), "c-retired", A, "dead", "requeue", "aborted", "OB-DEAD-REQUEUE", 1, superseded_by=ulid(90))
    d.transition(ulid(90), "c-successor", B, "none", "requeue", "pending", "OB-DEAD-REQUEUE", 0)
    want[row("TRC-FP-FROZEN", ulid(90))] = (f"requeue successor {ulid(90)} carries fingerprint {B}; the retired row "
                                            f"{ulid(9)} carried {A}")
    # TRC-ID-NEVER-FREED
    d.accepted(ulid(10), "c-freed")
    d.transition(ulid(100), "c-freed", A, "none", "accept", "pending", "OB-NONE-ACCEPT", 0)
    want[cmid_key("TRC-ID-NEVER-FREED", "c-freed")] = (f"a new row {ulid(100)} (none --accept--> pending) for "
                                                       f"client_message_id c-freed, already bound to row {ulid(10)}")
    # TRC-MAX-AGE
    d.transition(ulid(11), "c-late", A, "none", "accept", "pending", "OB-NONE-ACCEPT", 0, max_age_at_ms=BASE)
    late = d.transition(ulid(11), "c-late", A, "pending", "dispatch", "inflight", "OB-PENDING-DISPATCH", 1,
                        max_age_at_ms=BASE)
    want[row("TRC-MAX-AGE", ulid(11))] = (f"dispatched (OB-PENDING-DISPATCH) at ts_ms {late['ts_ms']}, after its "
                                          f"max_age_at_ms {BASE}")
    d.accepted(ulid(12), "c-early")
    early = d.transition(ulid(12), "c-early", A, "pending", "max_age_exceeded", "dead", "OB-PENDING-MAX-AGE", 0)
    want[row("TRC-MAX-AGE", ulid(12))] = (f"aged out (OB-PENDING-MAX-AGE) at ts_ms {early['ts_ms']}, not after its "
                                          f"max_age_at_ms {LATE}")
    d.accepted(ulid(14), "c-raised")
    d.transition(ulid(14), "c-raised", A, "pending", "dispatch", "inflight", "OB-PENDING-DISPATCH", 1,
                 max_age_at_ms=LATE + 1)
    want[row("TRC-MAX-AGE", ulid(14))] = (f"pending --dispatch--> inflight raises max_age_at_ms to {LATE + 1}; the "
                                          f"row's previous transition had {LATE}")
    d.accepted(ulid(15), "c-enqueued")
    moved = d.transition(ulid(15), "c-enqueued", A, "pending", "dispatch", "inflight", "OB-PENDING-DISPATCH", 1)
    moved["enqueued_at_ms"] = BASE + 7  # the row's age would restart
    want[row("TRC-MAX-AGE", ulid(15))] = (f"pending --dispatch--> inflight carries enqueued_at_ms {BASE + 7}; the "
                                          f"row's previous transition had {BASE}")
    # TRC-DONE-HAS-MESSAGE
    d.accepted(ulid(13), "c-done")
    d.transition(ulid(13), "c-done", A, "pending", "dispatch", "inflight", "OB-PENDING-DISPATCH", 1)
    d.transition(ulid(13), "c-done", A, "inflight", "ack_created", "done", "OB-INFLIGHT-CREATED", 1,
                 broker_message_id="M-never")
    want[message("TRC-DONE-HAS-MESSAGE", "c-done")] = ("inflight --ack_created--> done with broker_message_id "
                                                       "M-never, which the broker never committed")
    # TRC-ONE-INBOX-ROW
    d.inbox("c-inbox", "M-inbox", 1)
    d.inbox("c-inbox", "M-inbox", 2)
    want["TRC-ONE-INBOX-ROW", (("recipient", RECIPIENT), ("client_message_id", "c-inbox"))] = (
        "2 inbox rows inserted for client_message_id c-inbox: inbox_seq 1 first, 2 last")
    # TRC-MESSAGE-EVENT-NEW-ROW: the two rows' message events, and one more
    d.sse(1, event="message")
    d.sse(2, event="message")
    extra = d.sse(3, event="message")
    want["TRC-MESSAGE-EVENT-NEW-ROW", (("node", "daemon-a"),)] = (
        f"message event_id 3 (seq {extra['seq']}, line {extra['seq']}) outnumbers the new inbox rows: it follows 2 "
        "inbox_insert with inserted = true and as many message events")
    # TRC-SEQ-MONOTONIC: seqs 0, 1, 5, 3, 6 in file order
    for seq, event_id in ((0, 1), (1, 2), (5, 3), (3, 4), (6, 5)):
        s.sse(event_id, seq=seq)
    want["TRC-SEQ-MONOTONIC", (("node", "daemon-s"),)] = "seq 3 at line 3 after seq 5 at line 2"
    # TRC-EVENT-IDS-MONOTONIC
    for event_id in (1, 2, 2):
        i.sse(event_id)
    want["TRC-EVENT-IDS-MONOTONIC", (("node", "daemon-i"),)] = ("event_id 2 (seq 2, line 2) after event_id 2 "
                                                                "(seq 1, line 1)")
    # TRC-ONE-MESSAGE
    b.accept("c-two", "M-first")
    b.commit("c-two", "M-first")
    b.accept("c-two", "M-second")
    b.commit("c-two", "M-second")
    want[message("TRC-ONE-MESSAGE", "c-two")] = ("2 broker messages for one client_message_id: M-first first, "
                                                 "M-second last")
    b.accept("c-twice", "M-twice")
    b.commit("c-twice", "M-twice")
    b.commit("c-twice", "M-twice")
    want[message("TRC-ONE-MESSAGE", "c-twice")] = "2 commits of broker message M-twice"
    # TRC-SIDE-EFFECTS
    b.accept("c-effects", "M-effects")
    b.commit("c-effects", "M-effects", history=0)
    want[message("TRC-SIDE-EFFECTS", "c-effects")] = ("commit of M-effects inserted dedupe=1 message=1 history=0 "
                                                      "delivery=1 for 1 recipient(s); expected 1, 1, 1 and 1")
    b.accept("c-lost", "M-lost")
    want[message("TRC-SIDE-EFFECTS", "c-lost")] = "BRK-ACCEPT of M-lost without its commit"
    # TRC-DELIVERY-COMMITTED
    b.delivery("c-ghost", "M-ghost", 1, LATE)
    want[message("TRC-DELIVERY-COMMITTED", "c-ghost")] = (f"delivery M-ghost.0 to {RECIPIENT} of broker message "
                                                          "M-ghost, which the broker never committed")
    # TRC-DELIVERY-ACKED
    b.accept("c-again", "M-again")
    b.commit("c-again", "M-again")
    b.delivery("c-again", "M-again", 1, LATE)
    acked = b.ack("c-again", "M-again")
    b.delivery("c-again", "M-again", 2, LATE)
    want["TRC-DELIVERY-ACKED", (("mesh", MESH), ("delivery_id", "M-again.0"))] = (
        f"delivery M-again.0 delivered again (attempt 2) after its ack at seq {acked['seq']}")
    b.ack("c-unknown", "M-unknown")
    want["TRC-DELIVERY-ACKED", (("mesh", MESH), ("delivery_id", "M-unknown.0"))] = (
        f"ack of delivery M-unknown.0 (broker message M-unknown, recipient {RECIPIENT}) names no delivery the broker "
        "traced")
    b.accept("c-unacked", "M-unacked")
    b.commit("c-unacked", "M-unacked")
    lease = b.delivery("c-unacked", "M-unacked", 1, BASE + 100)["lease_until_ms"]
    b.accept("c-last", "M-last")
    end = b.commit("c-last", "M-last", ts_ms=lease + 60_000)["ts_ms"]
    want["TRC-DELIVERY-ACKED", (("mesh", MESH), ("delivery_id", "M-unacked.0"))] = (
        f"delivery M-unacked.0 (attempt 1) never acked: its lease ended at {lease}, the broker traced until {end}")
    # TRC-HOOK-ONCE, TRC-HOOK-ENQUEUED, TRC-HOOK-RUN-FINISHED, TRC-HOOK-REPLY-ID, on a daemon of their own
    h = Node("daemon", "daemon-h")

    def hook_key(invariant: str, cmid: str, hook: str = "on-message") -> tuple[str, Key]:
        return invariant, (("node", "daemon-h"), ("client_message_id", cmid), ("hook", hook))

    def enqueue(cmid: str, inbox_seq: int, hook: str = "on-message", ts_ms: int | None = None) -> dict[str, Any]:
        return h.emit("hook_enqueue", ts_ms=ts_ms, mesh=MESH, client_message_id=cmid, broker_message_id="M-hook",
                      inbox_seq=inbox_seq, hook=hook)

    def run(cmid: str, inbox_seq: int, to: str = "done", reply: str | None = None,
            hook: str = "on-message") -> dict[str, Any]:
        return h.emit("hook_run", mesh=MESH, client_message_id=cmid, inbox_seq=inbox_seq, hook=hook, to=to, claims=1,
                      reply_client_message_id=reply, http_status=None if reply is None else 202)

    enqueue("c-hook-twice", 1)
    run("c-hook-twice", 1)
    enqueue("c-hook-twice", 2)
    want[hook_key("TRC-HOOK-ONCE", "c-hook-twice")] = ("2 hook_enqueue events for hook on-message of "
                                                        "client_message_id c-hook-twice: inbox_seq 1 first, 2 last")
    enqueue("c-hook-marked", 3)
    first = run("c-hook-marked", 3)
    run("c-hook-marked", 3, to="failed")
    want[hook_key("TRC-HOOK-ONCE", "c-hook-marked")] = (
        f"2 hook_run events for hook on-message of client_message_id c-hook-marked: done first (seq {first['seq']}), "
        "failed last")
    early = run("c-hook-early", 4, to="timed_out")
    late = enqueue("c-hook-early", 4)
    want[hook_key("TRC-HOOK-ENQUEUED", "c-hook-early")] = (
        f"hook on-message run for client_message_id c-hook-early marked timed_out at seq {early['seq']} before any "
        f"hook_enqueue of the pair (the first at seq {late['seq']})")
    alone = run("c-hook-alone", 5)
    want[hook_key("TRC-HOOK-ENQUEUED", "c-hook-alone")] = (
        f"hook on-message run for client_message_id c-hook-alone marked done at seq {alone['seq']} before any "
        "hook_enqueue of the pair (the first at seq none)")
    enqueue("c-hook-reply", 6, hook="on-dm")
    run("c-hook-reply", 6, reply=hook_reply_id("c-hook-reply", "on-message"), hook="on-dm")
    want[hook_key("TRC-HOOK-REPLY-ID", "c-hook-reply", "on-dm")] = (
        f"hook on-dm replied to client_message_id c-hook-reply under {hook_reply_id('c-hook-reply', 'on-message')}; "
        f"the id derived from the pair is {hook_reply_id('c-hook-reply', 'on-dm')}")
    pending = enqueue("c-hook-pending", 7)
    last = h.emit("sse_event", ts_ms=pending["ts_ms"] + 40_001, event_id=1, event="peer_join")
    want[hook_key("TRC-HOOK-RUN-FINISHED", "c-hook-pending")] = (
        f"hook on-message run for client_message_id c-hook-pending (inbox_seq 7) enqueued at ts_ms {pending['ts_ms']} "
        f"never marked finished; the daemon traced until {last['ts_ms']}")
    out = root / "hand-made"
    out.mkdir(parents=True)
    for node in (d, s, i, b, h):
        (out / f"{node.node}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in node.events))
    return out, want
