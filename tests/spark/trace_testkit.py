"""Helpers for the trace-check tests (a plain module: conftest.py is not importable)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from spark_checks import format as fmt
from spark_checks.generate import Params, generate
from spark_checks.oracle import Report

SMALL = 8_000  # events per generated test trace


def make_trace(root: Path, name: str, seed: int, inject: Iterable[str] = (), events: int = SMALL, **params: Any
               ) -> tuple[Path, dict[str, Any]]:
    """Generate a small trace under ``root/name``; returns (its directory, its manifest)."""
    out = root / name
    manifest = generate(out, Params(events=events, daemons=params.pop("daemons", 8), seed=seed,
                                    inject=tuple(inject), fault_rate=params.pop("fault_rate", 0.3), **params),
                        workers=1)
    return out, manifest


def expected(manifest: dict[str, Any]) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """The (invariant, key) pairs a checker must report for a generated trace."""
    return {(i["invariant"], tuple(i["key"].items())) for i in manifest["injections"]}


def found(report: Report, nodes: set[str] | None = None, meshes: set[str] | None = None
          ) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """The (invariant, key) pairs a report names, optionally only those whose event is on ``nodes`` of ``meshes``."""
    picked = set()
    for violation in report.violations:
        if nodes is not None and violation.event.node not in nodes:
            continue
        picked.add((violation.invariant, violation.key))
    return picked


def nodes_of(trace: Path) -> set[str]:
    return {row["node"] for directory in fmt.bucket_dirs(trace)
            for row in fmt.read_bucket(directory, ["node"]).to_pylist()}


# --- hand-made events: a skewed subject with violations deep inside it ------------------------------------------

def fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Node:
    """Writes schema-shaped events for one node, with seq = line and ts_ms one ms apart unless ``wait`` says."""

    source = ""

    def __init__(self, node: str, mesh: str = "mesh-skew"):
        self.node = node
        self.mesh = mesh
        self.seq = 0
        self.ts = 1_767_225_600_000
        self.events: list[dict[str, Any]] = []

    def _emit(self, kind: str, **members: Any) -> dict[str, Any]:
        event = {"v": 1, "source": self.source, "node": self.node, "seq": self.seq, "ts_ms": self.ts, "kind": kind,
                 **members}
        self.seq += 1
        self.ts += 1
        self.events.append(event)
        return event

    def wait(self, ms: int) -> None:
        self.ts += ms

    def write_jsonl(self, directory: Path) -> Path:
        """The events as ``<source>-<node>.jsonl`` in ``directory``, as the reference writes them."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.source}-{self.node}.jsonl"
        path.write_text("".join(json.dumps(event, separators=(",", ":")) + "\n" for event in self.events))
        return path


class Daemon(Node):
    """A daemon's outbox, IPC and inbox events."""

    source = "daemon"

    def transition(self, outbox_id: str, cmid: str, fp: str, from_state: str, to_state: str, event: str,
                   table_row: str, attempts: int, broker_message_id: str | None = None,
                   superseded_by: str | None = None) -> dict[str, Any]:
        return self._emit("outbox_transition", mesh=self.mesh, outbox_id=outbox_id, client_message_id=cmid,
                          request_fingerprint=fp, **{"from": from_state, "to": to_state}, event=event,
                          table_row=table_row, attempts=attempts, enqueued_at_ms=1_767_225_600_000,
                          max_age_at_ms=1_767_229_200_000, broker_message_id=broker_message_id,
                          superseded_by=superseded_by)

    def decision(self, cmid: str, fp: str, row_state: str, match: bool | None, table_row: str, status: int,
                 outbox_id: str | None) -> dict[str, Any]:
        return self._emit("ipc_decision", mesh=self.mesh, client_message_id=cmid, request_fingerprint=fp,
                          row_state=row_state, fingerprint_match=match, table_row=table_row, http_status=status,
                          outbox_id=outbox_id)

    def done_row(self, outbox_id: str, cmid: str, fp: str) -> None:
        """IPC-NEW, accept, dispatch, 201 -> done."""
        self.decision(cmid, fp, "none", None, "IPC-NEW", 202, None)
        self.transition(outbox_id, cmid, fp, "none", "pending", "accept", "OB-NONE-ACCEPT", 0)
        self.transition(outbox_id, cmid, fp, "pending", "inflight", "dispatch", "OB-PENDING-DISPATCH", 1)
        self.transition(outbox_id, cmid, fp, "inflight", "done", "ack_created", "OB-INFLIGHT-CREATED", 1,
                        broker_message_id="01JBROKERMESSAGE0000000001")

    def repost(self, cmid: str, fp: str, outbox_id: str, times: int) -> None:
        for _ in range(times):
            self.decision(cmid, fp, "done", True, "IPC-DONE-MATCH", 200, outbox_id)

    def inbox_insert(self, recipient: str, cmid: str, inserted: bool, inbox_seq: int | None,
                     broker_message_id: str = "01JBROKERMESSAGE0000000001") -> dict[str, Any]:
        return self._emit("inbox_insert", mesh=self.mesh, recipient=recipient, client_message_id=cmid,
                          broker_message_id=broker_message_id, delivery_id=f"{broker_message_id}.0", inserted=inserted,
                          inbox_seq=inbox_seq)

    def sse(self, event_id: int, event: str = "message") -> dict[str, Any]:
        return self._emit("sse_event", event_id=event_id, event=event)

    def hook_enqueue(self, cmid: str, hook: str, inbox_seq: int,
                     broker_message_id: str = "01JBROKERMESSAGE0000000001") -> dict[str, Any]:
        return self._emit("hook_enqueue", mesh=self.mesh, client_message_id=cmid,
                          broker_message_id=broker_message_id, inbox_seq=inbox_seq, hook=hook)

    def hook_run(self, cmid: str, hook: str, inbox_seq: int, to: str = "done", claims: int = 1,
                 reply: str | None = None, http_status: int | None = None) -> dict[str, Any]:
        return self._emit("hook_run", mesh=self.mesh, client_message_id=cmid, inbox_seq=inbox_seq, hook=hook, to=to,
                          claims=claims, reply_client_message_id=reply, http_status=http_status)


class Broker(Node):
    """A broker's accept decisions, commits, deliveries and acks."""

    source = "broker"
    member = "ab" * 32

    def commit(self, cmid: str, fp: str, broker_message_id: str, recipients: int = 1) -> dict[str, Any]:
        return self._emit("accept_commit", mesh=self.mesh, client_message_id=cmid,
                          broker_message_id=broker_message_id, request_fingerprint=fp, destination_kind="topic",
                          destination_ref="general", effects={"dedupe": 1, "message": 1, "history": 1,
                                                              "delivery": recipients}, recipients=recipients)

    def decision(self, cmid: str, fp: str, table_row: str, broker_message_id: str | None) -> dict[str, Any]:
        phase, status = {"BRK-ACCEPT": ("B3", 201), "BRK-DUP-MATCH": ("dedupe", 200),
                         "BRK-DUP-MISMATCH": ("dedupe", 409)}[table_row]
        return self._emit("accept_decision", mesh=self.mesh, client_message_id=cmid, request_fingerprint=fp,
                          table_row=table_row, phase=phase, status=status, broker_message_id=broker_message_id,
                          member=self.member)

    def delivery(self, cmid: str, broker_message_id: str, recipient: str, attempt: int) -> dict[str, Any]:
        return self._emit("delivery", mesh=self.mesh, broker_message_id=broker_message_id, client_message_id=cmid,
                          recipient=recipient, delivery_id=f"{broker_message_id}.0", attempt=attempt,
                          lease_until_ms=self.ts + 30_000)

    def ack(self, cmid: str, broker_message_id: str, recipient: str) -> dict[str, Any]:
        return self._emit("delivery_ack", mesh=self.mesh, broker_message_id=broker_message_id,
                          client_message_id=cmid, recipient=recipient, delivery_id=f"{broker_message_id}.0")


def skewed_trace(root: Path) -> tuple[Path, set[tuple[str, tuple[tuple[str, str], ...]]]]:
    """Two daemons whose hot rows have hundreds of events, with violations far from their first events.

    Returns the Parquet dataset and the (invariant, key) pairs a checker must report.
    """
    fp, other = fingerprint("hot"), fingerprint("other")
    a = Daemon("daemon-skew-a")
    oid = "01JSKEWR0W0000000000000001"
    a.done_row(oid, "hot-a", fp)
    a.repost("hot-a", fp, oid, 200)
    a.decision("hot-a", fp, "pending", True, "IPC-PENDING-MATCH", 202, oid)  # the row is done: inconsistent
    a.repost("hot-a", fp, oid, 100)
    a.transition(oid, "hot-a", other, "inflight", "done", "ack_created", "OB-INFLIGHT-CREATED", 1,
                 broker_message_id="m-hot-a")  # illegal (the row is done) + new fp
    a.repost("hot-a", fp, oid, 60)
    a.transition("01JSKEWR0W0000000000000002", "hot-a", fp, "none", "pending", "accept", "OB-NONE-ACCEPT", 0)  # freed
    b = Daemon("daemon-skew-b")
    b.done_row("01JSKEWR0W0000000000000003", "hot-b", fp)
    b.repost("hot-b", fp, "01JSKEWR0W0000000000000003", 400)  # heavy and clean
    rows = [fmt.event_to_row(e, e["seq"]) for e in a.events + b.events]
    dataset = root / "skew"
    fmt.write_dataset(fmt.rows_to_table(rows), dataset, buckets=4)
    want = {
        ("TRC-IPC-CONSISTENT", (("node", "daemon-skew-a"), ("client_message_id", "hot-a"))),
        ("TRC-OUTBOX-LEGAL", (("node", "daemon-skew-a"), ("outbox_id", oid))),
        ("TRC-FP-FROZEN", (("node", "daemon-skew-a"), ("outbox_id", oid))),
        ("TRC-ID-NEVER-FREED", (("node", "daemon-skew-a"), ("client_message_id", "hot-a"))),
    }
    return dataset, want


def same_answers(left: Report, right: Report) -> list[str]:
    """Differences between two reports' violations -- identity, detail text and evidence (locations and events) --
    as readable lines."""
    problems = [f"only in {left.engine}: {v}" for v in sorted(left.identities() - right.identities(), key=str)]
    problems += [f"only in {right.engine}: {v}" for v in sorted(right.identities() - left.identities(), key=str)]
    by_identity = {v.identity: v for v in right.violations}
    for violation in left.violations:
        theirs = by_identity.get(violation.identity)
        if theirs is None:
            continue
        if theirs.detail != violation.detail:
            problems.append(f"detail differs for {violation.identity}: {left.engine} {violation.detail!r}, "
                            f"{right.engine} {theirs.detail!r}")
        if theirs.evidence != violation.evidence:
            problems.append(f"evidence differs for {violation.identity}")
    return problems
