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

Ordering: within one node, events are ordered by ``seq``; across nodes, by ``(node, seq)``; events of one node that
share a seq (a repeated seq, itself a TRC-SEQ-MONOTONIC violation) by ``line``. A key's first violation is the one
whose event comes first, then whose related event does (none before any), then by the two lines. Evidence is shown
in file order instead, by ``(node, line)`` (``evidence_entries``), so a seq that goes backwards shows as one; its
entries say where each event sits. A violation's ``detail`` is one of ``DETAILS`` filled by ``detail_text``, the
same text in every engine.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

DAEMON_KINDS = ("ipc_decision", "outbox_transition", "inbox_insert", "sse_event", "hook_enqueue", "hook_run")
BROKER_KINDS = ("accept_decision", "accept_commit", "delivery", "delivery_ack", "history_pruned")
KINDS = DAEMON_KINDS + BROKER_KINDS

#: How long after a delivery's lease ran out the broker may take to deliver it again (its sweep interval), in ms.
DEFAULT_REDELIVERY_GRACE_MS = 5_000
#: How long a daemon waits for a dispatched row's ack before ack_timeout, in ms: the reference daemon's default
#: ``[outbox] ack_timeout_s`` (15 s). The spec leaves it to configuration and the trace does not record it, so a check
#: of a daemon configured with a longer one must be told (``--ack-timeout-ms``).
DEFAULT_ACK_TIMEOUT_MS = 15_000
#: How late after its ack timeout a daemon may trace an inflight row's resolution (its loop's turn), in ms.
DEFAULT_ACK_GRACE_MS = 5_000
#: How long a hook run may take from its enqueue to its mark, in ms: the reference daemon's default ``[hooks]
#: default_timeout_s`` (30 s). As with the ack timeout, the trace does not record a hook's timeout_s, so a check of a
#: daemon whose hooks run longer must be told (``--hook-timeout-ms``).
DEFAULT_HOOK_TIMEOUT_MS = 30_000
#: How late after its timeout a daemon may trace a run's mark: the SIGKILL grace (limits.yaml hook_kill_grace_s, 5 s)
#: and a worker's turn, in ms.
DEFAULT_HOOK_GRACE_MS = 10_000
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
        ("OBX-DISPATCH", "OBX-BROKER-OUTCOMES", "OBX-LATE-ACK", "OBX-TERMINAL", "REQUEUE-STATES", "REQUEUE-ATOMIC",
         "REC-INFLIGHT-TO-PENDING"),
        ("node", "outbox_id"), ("outbox_transition",), "prefix", "illegal_transition",
        "Every outbox_transition is a `transition` row of spec/tables/outbox.yaml (from, event, to, table_row; a "
        "requeue successor is `none -> pending` with event requeue), and replayed in seq order per (node, "
        "client_message_id) its `from` is the previous transition's `to` for the same outbox row and its `attempts` "
        "is the previous value plus one for a dispatch, else unchanged. A row's first transition starts from `none` "
        "with attempts 0, or from `pending` (every row is created pending, attempts 0: a daemon stopped between "
        "the commit that created it and that event, restarted, E-32) only when the node's trace shows the row "
        "created: an ipc_decision of that node whose outbox_id is that row, on an ipc_lookup row that inserts one "
        "(IPC-NEW, 202), or a requeue of another row of the node whose superseded_by names it, on an outbox row "
        "that inserts the successor (pending or dead to aborted), anywhere in the node's trace; both sets are read "
        "from spec/tables. A "
        "requeue successor's `none -> pending` is the effect of one requeue (REQUEUE-ATOMIC): a row whose "
        "`superseded_by` names it went to `aborted` by a requeue, and the successor carries that row's table_row "
        "(spec/schemas/trace/outbox_transition.json); with several such rows, the first is compared.",
        frozenset({"daemon"}), ("E-14", "E-16", "E-17", "E-28", "E-32")),
    Invariant(
        "TRC-IPC-CONSISTENT", "IPC decisions match the row state at that moment",
        ("IPC-NEW-ROW", "IPC-PENDING-MATCH", "IPC-INFLIGHT-MATCH", "IPC-DONE-MATCH", "IPC-DONE-MISMATCH",
         "IPC-DEAD-MATCH", "IPC-CONFLICT-NO-MUTATION", "IPC-SERIALIZED", "REQUEUE-NEVER-FREES"),
        ("node", "client_message_id"), ("ipc_decision", "outbox_transition"), "prefix", "ipc_decision_inconsistent",
        "Every ipc_decision's row_state is the state the traced transitions leave the (node, client_message_id) row "
        "in at that seq; before its first transition, `pending` after a decision that created the row (an "
        "ipc_lookup row whose mutation inserts one, IPC-NEW 202, naming an outbox_id: the transition's event was "
        "lost to a kill, E-32), else `none`; fingerprint_match is null for `none`, else whether the request "
        "fingerprint equals the row's frozen fingerprint (its first transition's, or the creating decision's); "
        "table_row and http_status are the spec/tables/ipc_lookup.yaml row for (row_state, fingerprint_match); a "
        "non-null outbox_id for an existing row names that row.",
        frozenset({"daemon"}), ("E-32",)),
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
        "(OB-PENDING-MAX-AGE) at or before it. The deadline cannot be moved to launder an old row: every transition "
        "of a row carries the enqueued_at_ms of the row's previous transition (set once, at insert) and a "
        "max_age_at_ms not above the previous one (a shorter negotiated max age lowers a live row's deadline, or sets "
        "one it lacked; nothing raises it), so a row's own max_age_at_ms is its lowest.",
        frozenset({"daemon"}), ("E-05", "E-14")),
    Invariant(
        "TRC-NEW-ROW-TRACED", "The row a 202 IPC-NEW inserted is traced",
        ("IPC-NEW-ROW", "FP-FROZEN", "ID-CONSUMED-NEVER-FREED"),
        ("node", "client_message_id"), ("ipc_decision", "outbox_transition"), "pair", "new_row_untraced",
        "Per (node, client_message_id), the first event after a 202 IPC-NEW ipc_decision (seq order) that is an "
        "outbox_transition or an ipc_decision with row_state `none` is a transition carrying the decision's "
        "request_fingerprint (and its outbox_id when the decision names one): the row's accept (`none -> pending`) "
        "or, for a daemon stopped between the two events (the reference writes the decision first, both after the "
        "one commit) and restarted, a later transition of the same row; never a lookup that finds no row. When "
        "neither follows, the daemon must not have dispatched the row of an id whose first transition it traced "
        "after the decision (a row due after this one, which was due when it was accepted).",
        frozenset({"daemon"}), ("E-32",)),
    Invariant(
        "TRC-INFLIGHT-RESOLVED", "Every inflight row is resolved",
        ("OBX-BROKER-OUTCOMES", "REC-INFLIGHT-TO-PENDING"),
        ("node", "outbox_id"), ("outbox_transition",), "pair", "inflight_unresolved",
        "Per (node, client_message_id) whose last traced transition leaves its row `inflight` (a dispatch): its "
        "ts_ms plus the ack timeout (`--ack-timeout-ms`, 15 s, the reference daemon's default [outbox] "
        "ack_timeout_s; the trace does not record it) plus a grace (`--ack-grace-ms`, 5 s) is not before the daemon "
        "node's last traced ts_ms. An inflight row is acked, times out (ack_timeout), loses its link (link_lost) "
        "or is recovered at the next start (crash_recovery, traced before the daemon serves); a daemon stopped with "
        "it inflight traces nothing after.",
        frozenset({"daemon"}), ("E-16", "E-32")),
    Invariant(
        "TRC-ONE-MESSAGE", "At most one broker message per (mesh, client_message_id)",
        ("BRK-CONCURRENT-ONE-MESSAGE", "BRK-FIRST-INSERT"),
        ("mesh", "client_message_id"), ("accept_decision", "accept_commit"), "pair", "duplicate_broker_message",
        "Per (mesh, client_message_id) the broker commits at most once, and every 201 or 200 accept_decision names "
        "the same broker_message_id. Reported with the first event naming the earliest and the latest message; "
        "several commits (one message) are reported at the last commit, with the first.",
        frozenset({"broker"})),
    Invariant(
        "TRC-DUP-FINGERPRINT", "A duplicate is answered by its fingerprint",
        ("BRK-DUP-MATCH", "BRK-DUP-MISMATCH"),
        ("mesh", "client_message_id"), ("accept_decision", "accept_commit"), "pair", "mismatch_answered_duplicate",
        "Per (mesh, client_message_id), every BRK-DUP-MATCH accept_decision (200 duplicate) carries the "
        "request_fingerprint of the broker's first accept_commit, and every BRK-DUP-MISMATCH one (409 "
        "request_fingerprint_mismatch) carries another: drift ruled out (E-21), the fingerprint a frame claims is "
        "the broker's own computation. Without a traced commit (the broker may stop between its commit and the "
        "event) nothing is compared.",
        frozenset({"broker"}), ("E-21",)),
    Invariant(
        "TRC-SIDE-EFFECTS", "Every commit has all its in-transaction side effects",
        ("BRK-ATOMIC", "BRK-FIRST-INSERT"),
        ("mesh", "client_message_id"), ("accept_decision", "accept_commit"), "pair", "missing_side_effect",
        "Every accept_commit inserted exactly one dedupe, message and history row and one delivery row per "
        "recipient (§4.7.1), and every BRK-ACCEPT decision (written after its transaction ended) has the commit of "
        "its broker_message_id for the same (mesh, client_message_id) (a commit under another client_message_id is "
        "not its commit). A commit without its decision is allowed: the broker may stop between the two.",
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
        "TRC-DELIVERY-ACKED", "Every delivery is eventually acked or still leased, and every ack names a delivery",
        ("BRK-REDELIVER", "BRK-CLIENT-ACK"),
        ("mesh", "delivery_id"), ("delivery", "delivery_ack"), "prefix", "unacked_delivery",
        "Per (mesh, delivery_id): without a delivery_ack, the latest delivery's lease_until_ms plus the redelivery "
        "grace is not before the broker node's last traced ts_ms (it may still be acked or delivered again), else "
        "it is reported at that delivery; with one, no delivery follows the first ack, whatever its lease (an "
        "acked delivery is never delivered again: reported at the latest delivery, with the first ack). Every "
        "delivery_ack names a delivery the broker traced: one of the same "
        "(mesh, delivery_id) with the ack's recipient and broker_message_id (a client_ack settles only its own "
        "delivery, E-36); the delivery comes first (E-32), so an ack before it shows as a delivery after the ack.",
        frozenset({"broker"}), ("E-32", "E-36")),
    Invariant(
        "TRC-DELIVERY-ATTEMPTS", "A delivery's attempt grows with every lease",
        ("BRK-REDELIVER-LEASE",),
        ("mesh", "delivery_id"), ("delivery",), "pair", "delivery_attempt_repeated",
        "Per (mesh, delivery_id), every delivery's attempt is higher than the one of the delivery before it "
        "((node, seq) order): the broker adds one to the attempt it stores with the delivery row at every lease, "
        "across restarts too (spec/schemas/trace/delivery.json: 1, then +1 per redelivery). A step of more than one "
        "is no violation: it is a lease whose event was lost to a broker stopped between the lease's commit and the "
        "event (E-32).",
        frozenset({"broker"}), ("E-28", "E-32")),
    Invariant(
        "TRC-ONE-INBOX-ROW", "At most one inbox row per (recipient, client_message_id)",
        ("INB-DEDUPE",),
        ("recipient", "client_message_id"), ("inbox_insert",), "pair", "duplicate_inbox_row",
        "Per (recipient, client_message_id) at most one inbox_insert has inserted = true; redeliveries are "
        "recorded with inserted = false. Reported at the last of them, with the first.",
        frozenset({"daemon"})),
    Invariant(
        "TRC-INBOX-SEQ-NAMES-ROW", "A redelivery names the inbox row it found",
        ("INB-DEDUPE",),
        ("recipient", "client_message_id"), ("inbox_insert",), "pair", "inbox_seq_misnamed",
        "Per (recipient, client_message_id), an inbox_insert with inserted = false and a non-null inbox_seq names "
        "the row the inbox holds: the inbox_seq of an inbox_insert with inserted = true of the same (recipient, "
        "client_message_id), reported with the first of those. Without a traced insert (the row predates the trace, "
        "or the daemon stopped between its commit and the event) nothing is compared.",
        frozenset({"daemon"}), ("E-12",)),
    Invariant(
        "TRC-INBOX-SEQ-MONOTONIC", "New inbox rows get strictly increasing inbox_seq",
        ("INBOX-CURSOR", "INBOX-IDS-AFTER-RECREATE"),
        ("node",), ("inbox_insert",), "pair", "inbox_seq_reused",
        "Per daemon node, the inbox_seq of inbox_insert events with inserted = true strictly increases in file order "
        "(the `line` column): every new row gets a new, higher seq, across restarts and in an inbox recreated after "
        "a quarantine (E-45).",
        frozenset({"daemon"}), ("E-12", "E-45")),
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
    Invariant(
        "TRC-MESSAGE-EVENT-NEW-ROW", "Only a new inbox row publishes a message event",
        ("INB-DEDUPE-EVENT",),
        ("node",), ("inbox_insert", "sse_event"), "pair", "duplicate_message_event",
        "Per daemon node, the sse_events with event `message` are no more than the inbox_insert events with "
        "inserted = true: a new row publishes one, a redelivery (inserted = false) none. An sse_event names no inbox "
        "row (only its event_id), so this is a count over the node's whole trace; it is reported at the first "
        "message event, in file order (the `line` column), that outnumbers the new rows before it, with the last "
        "inbox_insert before it. A daemon writes a new row's inbox_insert before its message event (E-32), so a "
        "daemon stopped between the two leaves a row without its event, which the count allows; an SSE replay after "
        "Last-Event-ID re-sends persisted events and traces none. Not caught: a duplicate's event on a node where as "
        "many new rows lack their message event (their daemon stopped between the two events). A daemon that "
        "writes a row's event before its insert (against E-32) passes while its counts agree; when they do not, it "
        "is reported at its first message event that runs ahead of the rows, not necessarily the duplicate's.",
        frozenset({"daemon"}), ("E-13", "E-32")),
    Invariant(
        "TRC-HOOK-ONCE", "A message runs each hook once, and a run is marked once",
        ("HOOK-NEW-ROWS-ONLY", "HOOK-CLAIM-PROCESS-MARK", "HOOK-NONZERO-NOT-RETRIED"),
        ("node", "client_message_id", "hook"), ("hook_enqueue", "hook_run"), "pair", "hook_run_twice",
        "Per (node, client_message_id, hook) at most one hook_enqueue (only a new inbox row gets runs; a redelivery "
        "none) and at most one hook_run (a finished run is history: never claimed, run or marked again, a failed or "
        "timed-out one included). Reported at the last of them, with the first.",
        frozenset({"daemon"}), ("E-48",)),
    Invariant(
        "TRC-HOOK-ENQUEUED", "A hook runs only for a stored message",
        ("HOOK-INBOX-FIRST",),
        ("node", "client_message_id", "hook"), ("hook_enqueue", "hook_run"), "pair", "hook_run_unenqueued",
        "Per (node, client_message_id, hook), the first hook_run follows (seq order) a hook_enqueue: the run was "
        "written with the message's inbox row, before anything could claim it. Reported at the first hook_run, with "
        "the first hook_enqueue when one follows it. Not allowed for: a daemon killed between the commit that stored "
        "a message and its events, which loses the hook_enqueue (E-32) and runs the hook after its restart.",
        frozenset({"daemon"}), ("E-32", "E-48")),
    Invariant(
        "TRC-HOOK-RUN-FINISHED", "Every enqueued hook run is marked finished",
        ("HOOK-EVERY-MATCH", "HOOK-CLAIM-RESET"),
        ("node", "client_message_id", "hook"), ("hook_enqueue", "hook_run"), "pair", "hook_run_unfinished",
        "Per (node, client_message_id, hook) with a hook_enqueue and no hook_run: the first hook_enqueue's ts_ms plus "
        "the hook timeout (`--hook-timeout-ms`, 30 s, the reference daemon's default [hooks] default_timeout_s; "
        "the trace does not record it) plus a grace (`--hook-grace-ms`, 10 s: the SIGKILL grace and a worker's "
        "turn) is not before the daemon node's last traced ts_ms. A run is claimed, run and marked done, failed or "
        "timed_out; a lost claim runs again (after a restart, at the start) until hooks.max_claims; a daemon "
        "stopped with runs pending traces nothing after. The bound assumes the pool keeps up (a run waits pending "
        "while every worker is busy) and a daemon that restarts soon after a crash.",
        frozenset({"daemon"}), ("E-48",)),
    Invariant(
        "TRC-HOOK-REPLY-ID", "A hook replies under the id derived from (message, hook)",
        ("HOOK-REPLY-ID", "HOOK-REPLY-ONCE"),
        ("node", "client_message_id", "hook"), ("hook_run",), "pair", "hook_reply_id_wrong",
        "Every hook_run with a reply_client_message_id names \"hook.\" followed by the first 40 hex digits of "
        "sha256(client_message_id, 0x00, hook) (UTF-8): the id every run of the pair submits its reply under, so a "
        "re-run meets the first run's outbox row (E-48). Reported at the first hook_run naming another.",
        frozenset({"daemon"}), ("E-48",)),
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
    """One violated invariant for one subject key, at its first violating event; ``detail`` is ``detail_text``'s,
    ``evidence`` the ``evidence_entries`` that show it."""

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


# --- what a violation says ---------------------------------------------------------------------------------------
#: Every engine describes a violation by a case of this table, the violating event ``e``, the related event ``r`` and
#: one value the engine computed itself (``fact``: an expected state, attempts or answer, a count, the broker's last
#: ts), and renders it with ``detail_text``: the oracle, DuckDB and Spark print byte-identical details. A case is a
#: printf template (``%s`` only) and, per ``%s``, where its value comes from: ``e.<column>`` or ``r.<column>`` (flat
#: columns, ``line`` included; ``r.<column>|text`` reads ``text`` when there is no related event; a name of ``DERIVED``
#: is computed from the row) or ``fact``.
DETAILS: dict[str, tuple[str, tuple[str, ...]]] = {
    # TRC-OUTBOX-LEGAL
    "outbox-not-a-transition": ("%s --%s--> %s (%s) is not a transition of spec/tables/outbox.yaml",
                                ("e.from_state", "e.event", "e.to_state", "e.table_row")),
    "outbox-from": ("%s --%s--> %s (%s), but the row was %s",
                    ("e.from_state", "e.event", "e.to_state", "e.table_row", "r.to_state|none")),
    "outbox-attempts": ("%s --%s--> %s (%s) with attempts %s, expected %s",
                        ("e.from_state", "e.event", "e.to_state", "e.table_row", "e.attempts", "fact")),
    "outbox-successor-row": ("requeue successor %s traced with %s; the retired row %s was requeued with %s",
                             ("e.outbox_id", "e.table_row", "r.outbox_id", "r.table_row")),
    "outbox-successor-orphan": ("requeue successor %s (%s): no row was requeued in its favour (none names it in "
                                "superseded_by)", ("e.outbox_id", "e.table_row")),
    # TRC-IPC-CONSISTENT
    "ipc-row-state": ("%s %s for row_state %s, but the row was %s",
                      ("e.table_row", "e.http_status", "e.row_state", "fact")),
    "ipc-fingerprint-match": ("%s %s with fingerprint_match %s for request fingerprint %s, expected %s",
                              ("e.table_row", "e.http_status", "e.fingerprint_match", "e.request_fingerprint",
                               "fact")),
    "ipc-answer": ("%s %s for (row_state %s, fingerprint_match %s); spec/tables/ipc_lookup.yaml answers %s",
                   ("e.table_row", "e.http_status", "e.row_state", "e.fingerprint_match", "fact")),
    "ipc-outbox-id": ("%s %s names outbox_id %s, but the row is %s",
                      ("e.table_row", "e.http_status", "e.outbox_id", "r.outbox_id")),
    # TRC-FP-FROZEN
    "fp-changed": ("%s --%s--> %s carries fingerprint %s; the row's frozen fingerprint (its first transition's) is %s",
                   ("e.from_state", "e.event", "e.to_state", "e.request_fingerprint", "r.request_fingerprint")),
    "fp-successor": ("requeue successor %s carries fingerprint %s; the retired row %s carried %s",
                     ("e.outbox_id", "e.request_fingerprint", "r.outbox_id", "r.request_fingerprint")),
    # TRC-ID-NEVER-FREED
    "id-freed": ("a new row %s (%s --%s--> %s) for client_message_id %s, already bound to row %s",
                 ("e.outbox_id", "e.from_state", "e.event", "e.to_state", "e.client_message_id", "r.outbox_id")),
    # TRC-MAX-AGE
    "max-age-dispatched": ("dispatched (%s) at ts_ms %s, after its max_age_at_ms %s",
                           ("e.table_row", "e.ts_ms", "e.max_age_at_ms")),
    "max-age-aged-out": ("aged out (%s) at ts_ms %s, not after its max_age_at_ms %s",
                         ("e.table_row", "e.ts_ms", "e.max_age_at_ms")),
    "max-age-raised": ("%s --%s--> %s raises max_age_at_ms to %s; the row's previous transition had %s",
                       ("e.from_state", "e.event", "e.to_state", "e.max_age_at_ms", "r.max_age_at_ms")),
    "max-age-enqueued-changed": ("%s --%s--> %s carries enqueued_at_ms %s; the row's previous transition had %s",
                                 ("e.from_state", "e.event", "e.to_state", "e.enqueued_at_ms", "r.enqueued_at_ms")),
    # TRC-ONE-MESSAGE
    "one-message-messages": ("%s broker messages for one client_message_id: %s first, %s last",
                             ("fact", "r.broker_message_id", "e.broker_message_id")),
    "one-message-commits": ("%s commits of broker message %s", ("fact", "e.broker_message_id")),
    # TRC-SIDE-EFFECTS
    "side-effects-counts": ("commit of %s inserted dedupe=%s message=%s history=%s delivery=%s for %s recipient(s); "
                            "expected 1, 1, 1 and %s",
                            ("e.broker_message_id", "e.effects_dedupe", "e.effects_message", "e.effects_history",
                             "e.effects_delivery", "e.recipients", "e.recipients")),
    "side-effects-uncommitted": ("%s of %s without its commit", ("e.table_row", "e.broker_message_id")),
    # TRC-DONE-HAS-MESSAGE
    "done-uncommitted": ("%s --%s--> done with broker_message_id %s, which the broker never committed",
                         ("e.from_state", "e.event", "e.broker_message_id")),
    # TRC-DELIVERY-COMMITTED
    "delivery-uncommitted": ("delivery %s to %s of broker message %s, which the broker never committed",
                             ("e.delivery_id", "e.recipient", "e.broker_message_id")),
    # TRC-DELIVERY-ACKED
    "delivery-unacked": ("delivery %s (attempt %s) never acked: its lease ended at %s, the broker traced until %s",
                         ("e.delivery_id", "e.attempt", "e.lease_until_ms", "fact")),
    "delivery-after-ack": ("delivery %s delivered again (attempt %s) after its ack at seq %s",
                           ("e.delivery_id", "e.attempt", "r.seq")),
    "delivery-ack-unknown": ("ack of delivery %s (broker message %s, recipient %s) names no delivery the broker "
                             "traced", ("e.delivery_id", "e.broker_message_id", "e.recipient")),
    # TRC-ONE-INBOX-ROW
    "inbox-rows": ("%s inbox rows inserted for client_message_id %s: inbox_seq %s first, %s last",
                   ("fact", "e.client_message_id", "r.inbox_seq", "e.inbox_seq")),
    # TRC-SEQ-MONOTONIC, TRC-EVENT-IDS-MONOTONIC: ``<column>-not-increasing``
    "seq-not-increasing": ("seq %s at line %s after seq %s at line %s", ("e.seq", "e.line", "r.seq", "r.line")),
    "event_id-not-increasing": ("event_id %s (seq %s, line %s) after event_id %s (seq %s, line %s)",
                                ("e.event_id", "e.seq", "e.line", "r.event_id", "r.seq", "r.line")),
    # TRC-NEW-ROW-TRACED
    "new-row-other-row": ("%s --%s--> %s of row %s with fingerprint %s follows %s %s (outbox_id %s) for "
                          "fingerprint %s",
                          ("e.from_state", "e.event", "e.to_state", "e.outbox_id", "e.request_fingerprint",
                           "r.table_row", "r.http_status", "r.outbox_id", "r.request_fingerprint")),
    "new-row-gone": ("%s %s found no row for client_message_id %s after %s %s at seq %s",
                     ("e.table_row", "e.http_status", "e.client_message_id", "r.table_row", "r.http_status",
                      "r.seq")),
    "new-row-untraced": ("%s %s for client_message_id %s: no transition of its row follows, yet the daemon "
                         "dispatched a row it created later (at seq %s)",
                         ("e.table_row", "e.http_status", "e.client_message_id", "fact")),
    # TRC-INFLIGHT-RESOLVED
    "inflight-unresolved": ("row %s still inflight: dispatched at ts_ms %s (attempts %s), the daemon traced until %s",
                            ("e.outbox_id", "e.ts_ms", "e.attempts", "fact")),
    # TRC-DUP-FINGERPRINT
    "dup-match-other-fingerprint": ("%s %s for fingerprint %s; the committed message %s has %s",
                                    ("e.table_row", "e.status", "e.request_fingerprint", "r.broker_message_id",
                                     "r.request_fingerprint")),
    "dup-mismatch-same-fingerprint": ("%s %s for fingerprint %s, the one of the committed message %s",
                                      ("e.table_row", "e.status", "e.request_fingerprint", "r.broker_message_id")),
    # TRC-DELIVERY-ATTEMPTS
    "attempt-not-increasing": ("delivery %s with attempt %s after attempt %s (seq %s)",
                               ("e.delivery_id", "e.attempt", "r.attempt", "r.seq")),
    # TRC-INBOX-SEQ-NAMES-ROW
    "inbox-seq-misnamed": ("redelivery of client_message_id %s names inbox_seq %s; the row was inserted with "
                           "inbox_seq %s", ("e.client_message_id", "e.inbox_seq", "r.inbox_seq")),
    # TRC-INBOX-SEQ-MONOTONIC (``<column>-not-increasing``)
    "inbox_seq-not-increasing": ("inbox_seq %s (seq %s, line %s) inserted after inbox_seq %s (seq %s, line %s)",
                                 ("e.inbox_seq", "e.seq", "e.line", "r.inbox_seq", "r.seq", "r.line")),
    # TRC-MESSAGE-EVENT-NEW-ROW
    "message-event-without-row": ("message event_id %s (seq %s, line %s) outnumbers the new inbox rows: it follows %s "
                                  "inbox_insert with inserted = true and as many message events",
                                  ("e.event_id", "e.seq", "e.line", "fact")),
    # TRC-HOOK-ONCE
    "hook-enqueued-twice": ("%s hook_enqueue events for hook %s of client_message_id %s: inbox_seq %s first, %s last",
                            ("fact", "e.hook", "e.client_message_id", "r.inbox_seq", "e.inbox_seq")),
    "hook-finished-twice": ("%s hook_run events for hook %s of client_message_id %s: %s first (seq %s), %s last",
                            ("fact", "e.hook", "e.client_message_id", "r.to_state", "r.seq", "e.to_state")),
    # TRC-HOOK-ENQUEUED
    "hook-run-unenqueued": ("hook %s run for client_message_id %s marked %s at seq %s before any hook_enqueue of "
                            "the pair (the first at seq %s)",
                            ("e.hook", "e.client_message_id", "e.to_state", "e.seq", "r.seq|none")),
    # TRC-HOOK-RUN-FINISHED
    "hook-run-unfinished": ("hook %s run for client_message_id %s (inbox_seq %s) enqueued at ts_ms %s never marked "
                            "finished; the daemon traced until %s",
                            ("e.hook", "e.client_message_id", "e.inbox_seq", "e.ts_ms", "fact")),
    # TRC-HOOK-REPLY-ID
    "hook-reply-id": ("hook %s replied to client_message_id %s under %s; the id derived from the pair is %s",
                      ("e.hook", "e.client_message_id", "e.reply_client_message_id", "e.hook_reply_id")),
}


def hook_reply_id(client_message_id: str, hook: str) -> str:
    """The client_message_id of ``hook``'s reply to the inbound ``client_message_id`` (HOOK-REPLY-ID, E-48): "hook."
    and the first 40 hex digits of sha256 over the two in UTF-8, joined by a 0x00 byte."""
    digest = hashlib.sha256(client_message_id.encode() + b"\x00" + hook.encode()).hexdigest()
    return "hook." + digest[:40]


#: values a detail computes from an event's row (what an engine need not carry through its aggregations)
DERIVED: dict[str, Any] = {
    "hook_reply_id": lambda row: hook_reply_id(row["client_message_id"], row["hook"]),
}


def detail_value(value: Any) -> str:
    """A value as a detail prints it: ``null``, ``true``/``false``, a fingerprint in lowercase hex, else ``str``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return str(value)


def detail_text(case: str | None, event: dict[str, Any], related: dict[str, Any] | None, fact: Any = None) -> str:
    """The detail of a violation: ``case`` of ``DETAILS`` filled from the flat rows of the violating and the related
    event and the engine's ``fact``. A ``case`` that ``DETAILS`` does not name is taken as finished text."""
    found = DETAILS.get(case or "")
    if found is None:
        return case or ""
    template, sources = found
    values = []
    for source in sources:
        if source == "fact":
            values.append(detail_value(fact))
            continue
        side, _, column = source.partition(".")
        column, _, absent = column.partition("|")
        row = event if side == "e" else related
        if row is not None and column in DERIVED:
            values.append(detail_value(DERIVED[column](row)))
            continue
        values.append(absent if row is None and absent else detail_value(None if row is None else row.get(column)))
    return template % tuple(values)


def evidence_entry(row: dict[str, Any]) -> dict[str, Any]:
    """One evidence entry from an event's flat row: where it sits -- its node, seq and ``line`` (0-based position in
    the node's stream) and, when the input was JSONL and the reader kept it, its ``file`` and 1-based ``file_line``
    -- and the JSON event."""
    from .format import row_to_event

    return {"node": row["node"], "seq": row["seq"], "line": row["line"], "file": row.get("file"),
            "file_line": row.get("file_line"), "event": row_to_event(row)}


def evidence_entries(rows: Iterable[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """Evidence entries in file order: by (node, line), whatever the events' seqs say."""
    return tuple(evidence_entry(row) for row in sorted(rows, key=lambda r: (r["node"], r["line"])))


def catalogue_markdown() -> str:
    """The catalogue as a Markdown table (used by the README and ``meshtrace catalogue``)."""
    lines = ["| Id | Protects | Subject | Evidence | Injection | What is checked |", "|---|---|---|---|---|---|"]
    for inv in CATALOGUE:
        protects = ", ".join(f"`{r}`" for r in inv.requirements + inv.errata) or "—"
        lines.append(f"| `{inv.id}` | {protects} | {', '.join(inv.key)} | {inv.evidence} | `{inv.injection}` | "
                     f"{inv.description} |")
    return "\n".join(lines)
