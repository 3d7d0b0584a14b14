"""The catalogue of trace invariants: ids, the requirements they protect, their subjects and their injections.

Rules of this file: one ``Invariant`` per check. The Spark checks (``spark_checks.spark``), the single-process oracle
(``spark_checks.oracle``), the DuckDB run in ``bench/trace_check.py`` and the generator's ``--inject`` kinds all name
invariants by these ids, and a violation of one is always reported under exactly one id. Each invariant names

* ``key``: the columns that identify its subject (a violation is reported once per distinct key, at the first
  violating event of that key);
* ``evidence``: ``prefix`` -- the subject's events (of ``kinds``) from the first up to and including the violating
  one -- or ``pair`` -- the two conflicting events (or the violating one alone when there is no second);
* ``needs``: the trace sources (``daemon``, ``broker``) that must have written events for the subject's mesh before
  the invariant applies. A trace recorded against a peer that writes no broker trace is not held to the invariants
  that relate daemon events to broker events.

Ordering: within one node, events are ordered by ``seq``; across nodes, by ``(node, seq)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DAEMON_KINDS = ("ipc_decision", "outbox_transition", "inbox_insert", "sse_event")
BROKER_KINDS = ("accept_decision", "accept_commit", "delivery", "delivery_ack", "history_pruned")
KINDS = DAEMON_KINDS + BROKER_KINDS

#: How long after a delivery's lease ran out the broker may take to deliver it again (its sweep interval), in ms.
DEFAULT_REDELIVERY_GRACE_MS = 5_000
#: The evidence of a ``prefix`` violation keeps the subject's first event and the events just before the violation.
DEFAULT_EVIDENCE_EVENTS = 16


@dataclass(frozen=True)
class Invariant:
    """One checked invariant."""

    id: str
    title: str
    requirements: tuple[str, ...]
    key: tuple[str, ...]
    kinds: tuple[str, ...]
    evidence: str
    injection: str
    description: str
    needs: frozenset[str] = field(default_factory=lambda: frozenset())
    errata: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "requirements": list(self.requirements),
                "errata": list(self.errata), "key": list(self.key), "kinds": list(self.kinds),
                "evidence": self.evidence, "needs": sorted(self.needs), "injection": self.injection,
                "description": self.description}


CATALOGUE: tuple[Invariant, ...] = (
    Invariant(
        "TRC-OUTBOX-LEGAL", "Outbox transitions are legal and replay per row",
        ("OBX-DISPATCH", "OBX-BROKER-OUTCOMES", "OBX-LATE-ACK", "OBX-TERMINAL", "REQUEUE-STATES",
         "REC-INFLIGHT-TO-PENDING"),
        ("node", "outbox_id"), ("outbox_transition",), "prefix", "illegal_transition",
        "Every outbox_transition is a `transition` row of spec/tables/outbox.yaml (from, event, to, table_row; a "
        "requeue successor is `none -> pending` with event requeue), and replayed in seq order per (node, "
        "client_message_id) its `from` is the previous transition's `to` for the same outbox row (`none` for the "
        "first transition of a row) and its `attempts` is the previous value plus one for a dispatch, else unchanged "
        "(0 for a new row).",
        frozenset({"daemon"}), ("E-14", "E-16", "E-17", "E-28")),
    Invariant(
        "TRC-IPC-CONSISTENT", "IPC decisions match the row state at that moment",
        ("IPC-NEW-ROW", "IPC-PENDING-MATCH", "IPC-INFLIGHT-MATCH", "IPC-DONE-MATCH", "IPC-DONE-MISMATCH",
         "IPC-DEAD-MATCH", "IPC-CONFLICT-NO-MUTATION", "IPC-SERIALIZED", "REQUEUE-NEVER-FREES"),
        ("node", "client_message_id"), ("ipc_decision", "outbox_transition"), "prefix", "ipc_decision_inconsistent",
        "Every ipc_decision's row_state is the state the traced transitions leave the (node, client_message_id) row "
        "in at that seq (`none` before its first transition); fingerprint_match is null for `none`, else whether "
        "the request fingerprint equals the row's frozen fingerprint (its first transition's); table_row and "
        "http_status are the spec/tables/ipc_lookup.yaml row for (row_state, fingerprint_match); a non-null "
        "outbox_id for an existing row names that row.",
        frozenset({"daemon"})),
    Invariant(
        "TRC-FP-FROZEN", "The request fingerprint is frozen for a row's lifecycle",
        ("FP-FROZEN", "REQUEUE-ATOMIC"),
        ("node", "outbox_id"), ("outbox_transition",), "prefix", "fingerprint_changed",
        "Every outbox_transition of a (node, client_message_id) carries the fingerprint of its first transition, and "
        "a requeue successor (`none -> pending`, event requeue) carries the fingerprint of the (first) row whose "
        "`superseded_by` names it.",
        frozenset({"daemon"})),
    Invariant(
        "TRC-ID-NEVER-FREED", "A consumed client_message_id is never freed",
        ("ID-CONSUMED-NEVER-FREED", "REQUEUE-NEVER-FREES"),
        ("node", "client_message_id"), ("outbox_transition",), "prefix", "id_freed",
        "Per (node, client_message_id) at most one outbox_transition starts from `none`: once a row exists for an "
        "id, no later row is created for it (not by a send, not by a requeue successor).",
        frozenset({"daemon"})),
    Invariant(
        "TRC-MAX-AGE", "Max age is respected",
        ("OBX-MAX-AGE-DEAD",),
        ("node", "outbox_id"), ("outbox_transition",), "prefix", "max_age_violated",
        "No row is dispatched (OB-PENDING-DISPATCH) at a ts_ms after its max_age_at_ms, and no row is aged out "
        "(OB-PENDING-MAX-AGE) at or before it.",
        frozenset({"daemon"}), ("E-05", "E-14")),
    Invariant(
        "TRC-ONE-MESSAGE", "At most one broker message per (mesh, client_message_id)",
        ("BRK-CONCURRENT-ONE-MESSAGE", "BRK-FIRST-INSERT", "BRK-DUP-MATCH"),
        ("mesh", "client_message_id"), ("accept_decision", "accept_commit"), "pair", "duplicate_broker_message",
        "Per (mesh, client_message_id) the broker commits at most once, and every 201 or 200 accept_decision names "
        "the same broker_message_id. Reported with the first event naming the earliest and the latest message.",
        frozenset({"broker"})),
    Invariant(
        "TRC-SIDE-EFFECTS", "Every commit has all its in-transaction side effects",
        ("BRK-ATOMIC", "BRK-FIRST-INSERT"),
        ("mesh", "client_message_id"), ("accept_decision", "accept_commit"), "pair", "missing_side_effect",
        "Every accept_commit inserted exactly one dedupe, message and history row and one delivery row per "
        "recipient (§4.7.1), and every BRK-ACCEPT decision (written after its transaction ended) has the commit of "
        "its broker_message_id. A commit without its decision is allowed: the broker may stop between the two.",
        frozenset({"broker"})),
    Invariant(
        "TRC-DONE-HAS-MESSAGE", "Every done row maps to a broker message",
        ("REC-NO-LOSS", "OBX-BROKER-OUTCOMES"),
        ("mesh", "client_message_id"), ("outbox_transition", "accept_commit"), "pair", "done_without_message",
        "Every outbox_transition to `done` names a broker_message_id the broker committed for the same (mesh, "
        "client_message_id). Applies to meshes whose broker wrote a trace.",
        frozenset({"daemon", "broker"})),
    Invariant(
        "TRC-DELIVERY-COMMITTED", "Only committed messages are delivered",
        ("BRK-DELIVERY-COMMITTED",),
        ("mesh", "client_message_id"), ("delivery", "accept_commit"), "pair", "delivery_uncommitted",
        "Every delivery names a broker_message_id the broker committed for the same (mesh, client_message_id).",
        frozenset({"broker"})),
    Invariant(
        "TRC-DELIVERY-ACKED", "Every delivery is eventually acked or still leased",
        ("BRK-REDELIVER",),
        ("mesh", "delivery_id"), ("delivery", "delivery_ack"), "prefix", "unacked_delivery",
        "Per (mesh, delivery_id): either a delivery_ack exists and no delivery follows it, or the latest delivery's "
        "lease_until_ms plus the redelivery grace is not before the broker node's last traced ts_ms (it may still "
        "be acked or delivered again).",
        frozenset({"broker"})),
    Invariant(
        "TRC-ONE-INBOX-ROW", "At most one inbox row per (recipient, client_message_id)",
        ("INB-DEDUPE",),
        ("recipient", "client_message_id"), ("inbox_insert",), "pair", "duplicate_inbox_row",
        "Per (recipient, client_message_id) at most one inbox_insert has inserted = true; redeliveries are "
        "recorded with inserted = false.",
        frozenset({"daemon"})),
    Invariant(
        "TRC-SEQ-MONOTONIC", "Trace seq strictly increases per node",
        (),
        ("node",), KINDS, "pair", "non_monotonic_seq",
        "Per node, seq strictly increases in file order (the `line` column), across restarts (spec/schemas/trace).",
        frozenset(), ("E-28",)),
    Invariant(
        "TRC-EVENT-IDS-MONOTONIC", "SSE event ids strictly increase per daemon",
        ("SSE-IDS-MONOTONIC",),
        ("node",), ("sse_event",), "pair", "non_monotonic_event_id",
        "Per daemon node, the event_id of sse_event events strictly increases in file order (E-13: persisted ids).",
        frozenset({"daemon"}), ("E-13",)),
)

BY_ID: dict[str, Invariant] = {inv.id: inv for inv in CATALOGUE}
INJECTIONS: dict[str, str] = {inv.injection: inv.id for inv in CATALOGUE}


def invariant(invariant_id: str) -> Invariant:
    """The invariant named ``invariant_id``; raises KeyError naming it."""
    try:
        return BY_ID[invariant_id]
    except KeyError:
        raise KeyError(f"unknown invariant {invariant_id!r}; known: {', '.join(BY_ID)}") from None


@dataclass(frozen=True, order=True)
class EventRef:
    """Where an event sits: its node, its seq and its line (position in the node's stream)."""

    node: str
    seq: int
    line: int

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "seq": self.seq, "line": self.line}


@dataclass(frozen=True)
class Violation:
    """One violated invariant for one subject key, at its first violating event."""

    invariant: str
    key: tuple[tuple[str, str], ...]
    event: EventRef
    related: EventRef | None = None
    detail: str = ""
    evidence: tuple[dict[str, Any], ...] = ()

    @property
    def identity(self) -> tuple[Any, ...]:
        """What two checkers must agree on: the invariant, the key, the violating and the related event."""
        return (self.invariant, self.key, self.event, self.related)

    def as_dict(self) -> dict[str, Any]:
        return {"invariant": self.invariant, "key": dict(self.key), "event": self.event.as_dict(),
                "related": None if self.related is None else self.related.as_dict(), "detail": self.detail,
                "evidence": list(self.evidence)}


def make_key(invariant_id: str, values: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The key tuple of ``invariant_id`` taken from ``values`` (an event or a dict of key columns)."""
    return tuple((name, str(values[name])) for name in BY_ID[invariant_id].key)


def catalogue_markdown() -> str:
    """The catalogue as a Markdown table (used by the README and ``meshtrace catalogue``)."""
    lines = ["| Id | Protects | Subject | Evidence | Injection | What is checked |", "|---|---|---|---|---|---|"]
    for inv in CATALOGUE:
        protects = ", ".join(f"`{r}`" for r in inv.requirements + inv.errata) or "—"
        lines.append(f"| `{inv.id}` | {protects} | {', '.join(inv.key)} | {inv.evidence} | `{inv.injection}` | "
                     f"{inv.description} |")
    return "\n".join(lines)
