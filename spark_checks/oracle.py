"""The single-process oracle: the same catalogue as the Spark checks, in plain Python, for small traces.

Theory of operation. Every per-subject invariant's subject lives in one dataset bucket (see ``format``), so the oracle
reads one bucket at a time and replays each subject's events in order, deciding transitions and IPC answers with the
tables themselves (``reference.core``'s ``DecisionTable`` lookups) rather than with a derived legal set as the Spark
checks do: two derivations of one catalogue. What needs the whole trace -- a node's seq and SSE event ids, its
message events and inbox inserts, each broker node's last ts, which meshes have broker events, requeue successors in
another bucket -- is gathered during the pass and decided at the end. A JSONL trace is checked as a single bucket.

Rules shared with ``spark_checks.spark`` (the tests hold the two to the same answers):

* a violation is reported once per (invariant, key), at its first violating event -- by ``(node, seq)``, or by
  ``line`` for the per-node invariants -- with the related event the catalogue names;
* evidence is the subject's events up to and including the violating one (its first event, the ``evidence_events -
  1`` before the violation, and the related event), or for ``pair`` invariants the related and the violating event,
  listed in file order (``catalogue.evidence_entries``);
* a detail is a case of ``catalogue.DETAILS`` with the value the replay computed (``fact``), rendered from the
  violating and the related event's rows.
"""

from __future__ import annotations

import itertools
import os
import time
from array import array
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from . import format as fmt
from .catalogue import (
    BY_ID,
    CATALOGUE,
    DEFAULT_ACK_GRACE_MS,
    DEFAULT_ACK_TIMEOUT_MS,
    DEFAULT_EVIDENCE_EVENTS,
    DEFAULT_HOOK_GRACE_MS,
    DEFAULT_HOOK_TIMEOUT_MS,
    DEFAULT_REDELIVERY_GRACE_MS,
    EventRef,
    Violation,
    detail_text,
    evidence_entries,
    hook_reply_id,
)
from .inputs import Trace, check_node_count

Ref = tuple[str, int, int]  # (node, seq, line)

OT_COLUMNS = ("node", "seq", "line", "ts_ms", "mesh", "client_message_id", "outbox_id", "request_fingerprint",
              "from_state", "to_state", "event", "table_row", "attempts", "max_age_at_ms", "broker_message_id",
              "superseded_by", "enqueued_at_ms")
IPC_COLUMNS = ("node", "seq", "line", "client_message_id", "request_fingerprint", "row_state", "fingerprint_match",
               "table_row", "http_status", "outbox_id")
AD_COLUMNS = ("node", "seq", "line", "mesh", "client_message_id", "table_row", "broker_message_id")
AC_COLUMNS = ("node", "seq", "line", "mesh", "client_message_id", "broker_message_id", "effects_dedupe",
              "effects_message", "effects_history", "effects_delivery", "recipients")
DL_COLUMNS = ("node", "seq", "line", "mesh", "client_message_id", "broker_message_id", "delivery_id",
              "lease_until_ms", "recipient")
DA_COLUMNS = ("node", "seq", "line", "mesh", "delivery_id", "recipient", "broker_message_id")
DUP_COLUMNS = ("node", "seq", "line", "mesh", "client_message_id", "table_row", "request_fingerprint")
ATTEMPT_COLUMNS = ("node", "seq", "line", "mesh", "delivery_id", "attempt")
INBOX_SEQ_COLUMNS = ("node", "seq", "line", "recipient", "client_message_id", "inserted", "inbox_seq")
II_COLUMNS = ("node", "seq", "line", "recipient", "client_message_id", "inserted")
HK_COLUMNS = ("node", "seq", "line", "ts_ms", "kind", "client_message_id", "hook", "reply_client_message_id")
NEW_ROW, REDELIVERY, MESSAGE = 0, 1, 2  # TRC-MESSAGE-EVENT-NEW-ROW's events: inbox_insert (inserted or not), message
ALL_COLUMNS = sorted({"kind", "source", "event_id", *OT_COLUMNS, *IPC_COLUMNS, *AD_COLUMNS, *AC_COLUMNS,
                      *DL_COLUMNS, *DA_COLUMNS, *II_COLUMNS, *DUP_COLUMNS, *ATTEMPT_COLUMNS, *INBOX_SEQ_COLUMNS,
                      *HK_COLUMNS})


@dataclass
class Report:
    """What a checker found; ``as_dict`` is the JSON report every checker writes.

    ``invalid_count`` counts the events rejected as invalid input (``spark_checks.validity``); ``invalid`` lists the
    first of them, each ``{"where": "<file>:<line>" or "<node>@line <n>", "reason": <code>, "message": <text>}``, and
    ``invalid_reasons`` counts them by reason.
    The invariants are checked over the valid events only.
    """

    engine: str
    trace: str
    events: int
    sources: list[str]
    seconds: float
    violations: list[Violation]
    counts: dict[str, int]
    invalid: list[dict[str, str]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    invalid_count: int = 0
    invalid_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No violation found (``counts``: a limited report lists fewer than it counts)."""
        return not any(self.counts.values())

    def limited(self, limit: int | None) -> Report:
        """This report listing at most ``limit`` violations per invariant, the same ones from every engine: those
        whose event comes first (node, seq, line), then whose related event does (none first), then by key. The
        counts are kept."""
        if limit is None:
            return self
        by_invariant: dict[str, list[Violation]] = defaultdict(list)
        for violation in self.violations:
            by_invariant[violation.invariant].append(violation)
        kept = [v for found in by_invariant.values() for v in sorted(found, key=listing_order)[:limit]]
        return replace(self, violations=sort_violations(kept))

    def identities(self) -> set[tuple[Any, ...]]:
        return {v.identity for v in self.violations}

    def keys(self) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
        return {(v.invariant, v.key) for v in self.violations}

    def as_dict(self) -> dict[str, Any]:
        present = set(self.sources)
        return {
            "engine": self.engine,
            "trace": self.trace,
            "events": self.events,
            "sources": self.sources,
            "seconds": round(self.seconds, 3),
            "events_per_second": round(self.events / self.seconds) if self.seconds > 0 else None,
            "settings": self.settings,
            "invalid": {"count": self.invalid_count, "reasons": dict(sorted(self.invalid_reasons.items())),
                        "lines": self.invalid},
            "invariants": [{**inv.as_dict(), "applies": inv.needs <= present,
                            "violations": self.counts.get(inv.id, 0)} for inv in CATALOGUE],
            "violations": [v.as_dict() for v in self.violations],
        }


def listing_order(violation: Violation) -> tuple[Any, ...]:
    """Which violations of an invariant a limited report lists first (``Report.limited``; Spark ranks alike)."""
    related = violation.related
    return (violation.event, related is not None, related or violation.event, violation.key)


def sort_violations(violations: Iterable[Violation]) -> list[Violation]:
    order = {inv.id: k for k, inv in enumerate(CATALOGUE)}
    return sorted(violations, key=lambda v: (order[v.invariant], v.key, v.event))


# --- the tables ---------------------------------------------------------------------------------------------------

class Tables:
    """Table decisions for the replay, memoised (``reference.core`` lookups)."""

    def __init__(self) -> None:
        from reference.core import ipc, outbox

        self._outbox = outbox.table()
        self._ipc = ipc.table()
        self.successor_rows = frozenset(row.id for row in self._outbox.rows
                                        if "insert_successor_pending" in row.then.get("effects", ()))
        #: the decisions that create an outbox row, as (table_row, http_status): the ipc_lookup rows whose mutation
        #: inserts one (IPC-NEW, 202)
        self.creating_decisions = frozenset((row.id, int(row.then["http_status"])) for row in self._ipc.rows
                                            if row.then.get("mutation") == "insert_pending")
        #: the transitions that create a successor row, the one their ``superseded_by`` names, as (from_state,
        #: event, to_state): the outbox rows whose effects insert it (a requeue of a pending or dead row to aborted)
        self.creating_transitions = frozenset(
            (state, event, row.then["to"]) for row in self._outbox.rows
            if "insert_successor_pending" in row.then.get("effects", ())
            for state in sorted(row.when["state"]) for event in sorted(row.when["event"]))
        self._transitions: dict[tuple[Any, ...], int | None] = {}
        self._answers: dict[tuple[Any, ...], bool] = {}

    def attempts_delta(self, from_state: str, event: str, to_state: str, table_row: str) -> int | None:
        """The attempts increment of a legal transition, or None when the table has no such transition."""
        key = (from_state, event, to_state, table_row)
        if key in self._transitions:
            return self._transitions[key]
        found: int | None = None
        if from_state == "none" and event == "requeue":
            found = 0 if to_state == "pending" and table_row in self.successor_rows else None
        else:
            try:
                row = self._outbox.lookup(state=from_state, event=event)
            except Exception:  # unknown state or event: not a legal transition
                row = None
            if row is not None and row.then.get("outcome") == "transition" and row.id == table_row and \
                    row.then.get("to") == to_state:
                found = 1 if "increment_attempts" in row.then.get("effects", ()) else 0
        self._transitions[key] = found
        return found

    def ipc_answer(self, row_state: str, match: bool | None) -> str | None:
        """The ipc_lookup answer for (row_state, fingerprint_match) as ``"<table_row> <http_status>"``, or None."""
        try:
            row = self._ipc.lookup(row_state=row_state, fingerprint="match" if match in (None, True) else "mismatch")
        except Exception:  # a row_state the table does not know: no answer
            return None
        return f"{row.id} {int(row.then['http_status'])}"

    def ipc_answer_ok(self, row_state: str, match: bool | None, table_row: str, http_status: int) -> bool:
        """Whether (table_row, http_status) is the ipc_lookup row for (row_state, fingerprint_match)."""
        key = (row_state, match, table_row, http_status)
        found = self._answers.get(key)
        if found is None:
            try:
                row = self._ipc.lookup(row_state=row_state, fingerprint="match" if match in (None, True) else
                                       "mismatch")
                found = row.id == table_row and int(row.then["http_status"]) == http_status
            except Exception:
                found = False
            self._answers[key] = found
        return found


# --- reading --------------------------------------------------------------------------------------------------

def _tuples(table: pa.Table, kind: str, columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
    part = table.filter(pc.equal(table["kind"], kind)).select(list(columns))
    if part.num_rows == 0:
        return []
    return list(zip(*(part[c].to_pylist() for c in columns), strict=True))


def _buckets(trace: Trace, invalid: _Invalid) -> Iterator[pa.Table]:
    """The valid events, one table per dataset bucket (a JSONL trace is one); invalid ones go to ``invalid``."""
    if trace.is_jsonl:
        read = fmt.read_jsonl(trace.jsonl)
        invalid.add([((k,), entry) for k, entry in enumerate(read.invalid)], read.reasons)
        yield fmt.rows_to_table(read.rows)
        return
    by_directory: dict[str, list[str]] = defaultdict(list)
    for path in trace.parquet_files:
        by_directory[os.path.dirname(path)].append(path)
    if fmt.split_subjects(by_directory):  # not laid out by bucket: the whole trace is one bucket, as a JSONL trace is
        by_directory = {"": list(trace.parquet_files)}
    # a node's rows span buckets, files and datasets: the positions two rows hold are found over the whole trace first
    shared = fmt.shared_positions(trace.parquet_files)
    for directory in sorted(by_directory):
        tables = [fmt.read_table(f, schema=fmt.FLAT_SCHEMA) for f in sorted(by_directory[directory])]
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        valid, listed, reasons = fmt.validate_table(table, shared=shared)
        invalid.add(listed, reasons)
        yield valid.select(ALL_COLUMNS)


@dataclass
class _Invalid:
    listed: list[tuple[tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)

    def add(self, listed: list[tuple[tuple[Any, ...], dict[str, Any]]], reasons: dict[str, int]) -> None:
        self.listed = sorted(self.listed + listed, key=lambda e: e[0])[:fmt.INVALID_LISTED]
        for reason, count in reasons.items():
            self.reasons[reason] = self.reasons.get(reason, 0) + count


def locate(paths: str | Path | list[str] | list[Path]) -> Trace:
    """The local trace ``paths`` name (paths or file: URIs); raises ``inputs.InputError``."""
    from .inputs import LocalFS, check_local_parquet
    from .inputs import locate as locate_trace

    trace = locate_trace([str(p) for p in ([paths] if isinstance(paths, str | Path) else paths)],
                         LocalFS("oracle"))
    check_local_parquet(trace.parquet_files)
    return trace


def _append(store: dict[str, tuple[array, ...]], node: str, types: str, *values: int) -> None:
    """Append ``values`` to ``node``'s compact columns in ``store`` (one ``array`` per value, of the type codes
    ``types``), made on first use."""
    columns = store.get(node)
    if columns is None:
        columns = store[node] = tuple(array(t) for t in types)
    for column, value in zip(columns, values, strict=True):
        column.append(value)


# --- the checker ------------------------------------------------------------------------------------------------

class Oracle:
    """Checks the whole catalogue in one process."""

    def __init__(self, redelivery_grace_ms: int = DEFAULT_REDELIVERY_GRACE_MS,
                 evidence_events: int = DEFAULT_EVIDENCE_EVENTS, ack_timeout_ms: int = DEFAULT_ACK_TIMEOUT_MS,
                 ack_grace_ms: int = DEFAULT_ACK_GRACE_MS, hook_timeout_ms: int = DEFAULT_HOOK_TIMEOUT_MS,
                 hook_grace_ms: int = DEFAULT_HOOK_GRACE_MS):
        self.grace = redelivery_grace_ms
        self.hook_timeout = hook_timeout_ms
        self.hook_grace = hook_grace_ms
        self.evidence_events = evidence_events
        self.ack_timeout = ack_timeout_ms
        self.ack_grace = ack_grace_ms
        self.tables = Tables()

    def check(self, paths: str | Path | list[str] | list[Path]) -> Report:
        """Check the valid events of a trace; invalid ones are reported in ``invalid``. Raises
        ``inputs.InputError`` when there is nothing to check (a missing path, no trace files, bad Parquet)."""
        started = time.monotonic()
        paths = [str(p) for p in ([paths] if isinstance(paths, str | Path) else paths)]
        trace = locate(paths)
        state = _State()
        invalid = _Invalid()
        for table in _buckets(trace, invalid):
            self._bucket(table, state)
        check_node_count(len(state.node_end))  # every valid event's node has its last ts there
        self._finish(state)
        self._settle_added(state)
        self._message_events(state)
        chosen = self._first(state.candidates)
        counts: dict[str, int] = defaultdict(int)
        for violation_key in chosen:
            counts[violation_key[0]] += 1
        violations = self._evidence(trace, chosen, state)
        return Report("oracle", ", ".join(paths), state.events, sorted(state.sources),
                      time.monotonic() - started, sort_violations(violations), dict(counts),
                      [entry for _, entry in invalid.listed],
                      {"redelivery_grace_ms": self.grace, "evidence_events": self.evidence_events,
                       "ack_timeout_ms": self.ack_timeout, "ack_grace_ms": self.ack_grace,
                       "hook_timeout_ms": self.hook_timeout, "hook_grace_ms": self.hook_grace},
                      sum(invalid.reasons.values()), invalid.reasons)

    # --- one bucket -------------------------------------------------------------------------------------------
    def _bucket(self, table: pa.Table, st: _State) -> None:
        st.events += table.num_rows
        self._node_level(table, st)
        ot = _tuples(table, "outbox_transition", OT_COLUMNS)
        ipc = _tuples(table, "ipc_decision", IPC_COLUMNS)
        self._rows(ot, ipc, st)
        ad = _tuples(table, "accept_decision", AD_COLUMNS)
        ac = _tuples(table, "accept_commit", AC_COLUMNS)
        dl = _tuples(table, "delivery", DL_COLUMNS)
        self._ledger(ot, ad, ac, dl, st)
        self._deliveries(dl, _tuples(table, "delivery_ack", DA_COLUMNS), st)
        self._inbox(_tuples(table, "inbox_insert", II_COLUMNS), st)
        self._new_rows(ot, ipc, st)
        self._inflight(ot, st)
        self._duplicates(_tuples(table, "accept_decision", DUP_COLUMNS), _tuples(table, "accept_commit", DUP_COLUMNS),
                         st)
        self._attempts(_tuples(table, "delivery", ATTEMPT_COLUMNS), st)
        self._inbox_seqs(_tuples(table, "inbox_insert", INBOX_SEQ_COLUMNS), st)
        self._published(_tuples(table, "inbox_insert", ("node", "seq", "line", "inserted")),
                        _tuples(table, "sse_event", ("node", "seq", "line", "event")), st)
        self._hooks(_tuples(table, "hook_enqueue", HK_COLUMNS) + _tuples(table, "hook_run", HK_COLUMNS), st)

    def _node_level(self, table: pa.Table, st: _State) -> None:
        columns = table.select(["node", "line", "seq", "ts_ms", "source", "mesh", "kind", "event_id"]).to_pydict()
        for node, line, seq, ts, source, mesh, kind, event_id in zip(
                columns["node"], columns["line"], columns["seq"], columns["ts_ms"], columns["source"],
                columns["mesh"], columns["kind"], columns["event_id"], strict=True):
            lines = st.lines.get(node)
            if lines is None:
                lines = st.lines[node] = (array("q"), array("q"))
            lines[0].append(line)
            lines[1].append(seq)
            if ts > st.node_end.get(node, -1):
                st.node_end[node] = ts
            if source not in st.sources:
                st.sources.add(source)
            if source == "broker" and mesh is not None:
                st.broker_meshes.add(mesh)
            if kind == "sse_event":
                _append(st.sse, node, "qqq", line, event_id, seq)

    def _rows(self, ot: list[tuple[Any, ...]], ipc: list[tuple[Any, ...]], st: _State) -> None:
        """TRC-OUTBOX-LEGAL, TRC-IPC-CONSISTENT, TRC-FP-FROZEN, TRC-ID-NEVER-FREED, TRC-MAX-AGE."""
        subjects: dict[tuple[str, str], list[tuple[int, int, tuple[Any, ...]]]] = defaultdict(list)
        for event in ot:
            subjects[(event[0], event[5])].append((event[1], 1, event))
            if event[10] == "requeue":
                if event[8] == "none":
                    st.successors.append(event)
                elif event[9] == "aborted":
                    st.aborted[(event[0], event[15])].append(event)
        for event in ipc:
            subjects[(event[0], event[3])].append((event[1], 0, event))
        # the rows the node's trace shows created (anywhere in it): named by a 202 IPC-NEW decision, or a requeue
        # successor named by another row's requeue. This bucket's; a first transition at `pending` whose row is not
        # among them is decided at the end (_starts), against the decisions naming a row of another bucket (kept in
        # st.created) and the requeues (st.aborted)
        rows_here = {(e[0], e[6]) for e in ot}
        creating = self.tables.creating_decisions
        created = {(e[0], e[9]) for e in ipc if (e[7], e[8]) in creating and e[9] is not None}
        st.created.update(created - rows_here)
        created.update((e[0], e[15]) for e in ot if (e[8], e[10], e[9]) in self.tables.creating_transitions
                       and e[15] is not None and e[15] != e[6])
        tables = self.tables
        for (node, cmid), events in subjects.items():
            events.sort(key=lambda e: (e[0], e[2][2]))
            last = None  # the previous transition of the subject (any of its rows)
            row_last: dict[Any, tuple[Any, ...]] = {}  # each row's previous transition: rows may interleave
            first = None  # the first transition
            made = None  # before any transition: the last decision creating a row (its transition's event lost, E-32)
            history: list[tuple[int, int, tuple[Any, ...]]] = []
            for seq, is_ot, event in events:
                history.append((seq, is_ot, event))
                if is_ot:
                    (_, _, _, _, _, _, oid, fp, from_state, to_state, ev, table_row, attempts, _, _, _, _) = event
                    previous = row_last.get(oid)  # the previous transition of the same outbox row
                    same_row = previous is not None
                    age_case = self._max_age_case(event, previous)
                    if age_case:
                        related = previous if age_case in ("max-age-raised", "max-age-enqueued-changed") else None
                        self._add(st, "TRC-MAX-AGE", (("node", node), ("outbox_id", oid)), event, related, age_case,
                                  self._prefix(history, event, kinds_ot_only=True, row=oid, related=related))
                    if first is None:
                        first = event
                    delta = tables.attempts_delta(from_state, ev, to_state, table_row)
                    # a row is created `none -> pending`; its first transition may start at `pending` when the
                    # daemon stopped between the commit that created it and that event (E-32), if the trace shows
                    # the row created
                    start = not same_row and from_state == "pending"
                    from_ok = from_state == previous[9] if previous is not None else (
                        from_state == "none" or (start and (node, oid) in created))
                    expected_attempts = (previous[12] if previous is not None else 0) + (delta or 0)
                    if start and not from_ok and delta is not None:
                        st.starts.append((event, attempts == expected_attempts, expected_attempts,
                                          self._prefix(history, event, kinds_ot_only=True, row=oid)))
                    elif delta is None or not from_ok or attempts != expected_attempts:
                        case = ("outbox-not-a-transition" if delta is None else
                                "outbox-from" if not from_ok else "outbox-attempts")
                        self._add(st, "TRC-OUTBOX-LEGAL", (("node", node), ("outbox_id", oid)), event,
                                  previous, case,
                                  self._prefix(history, event, kinds_ot_only=True, row=oid, related=previous),
                                  fact=expected_attempts)
                    if fp != first[7]:
                        self._add(st, "TRC-FP-FROZEN", (("node", node), ("outbox_id", oid)), event, first,
                                  "fp-changed",
                                  self._prefix(history, event, kinds_ot_only=True, row=oid, related=first))
                    if from_state == "none" and last is not None:
                        self._add(st, "TRC-ID-NEVER-FREED", (("node", node), ("client_message_id", cmid)), event,
                                  first, "id-freed", self._prefix(history, event, kinds_ot_only=True, related=first))
                    last = row_last[oid] = event
                else:
                    (_, _, _, _, fp, row_state, match, table_row, http_status, oid) = event
                    # what the lookup finds: the row as its last transition left it; before any, the row a decision
                    # created (`pending`, its fingerprint and id), else none
                    state = last[9] if last is not None else "pending" if made is not None else "none"
                    expected_match = (fp == first[7] if last is not None  # type: ignore[index]
                                      else fp == made[4] if made is not None else None)
                    known = last if last is not None else made
                    known_oid = None if known is None else known[6] if known is last else known[9]
                    problem, fact = "", None
                    if row_state != state:
                        problem, fact = "ipc-row-state", state
                    elif match is not expected_match:
                        problem, fact = "ipc-fingerprint-match", expected_match
                    elif not tables.ipc_answer_ok(row_state, match, table_row, http_status):
                        problem, fact = "ipc-answer", tables.ipc_answer(row_state, match)
                    elif known is not None and oid is not None and oid != known_oid:
                        problem = "ipc-outbox-id"
                    if problem:
                        self._add(st, "TRC-IPC-CONSISTENT", (("node", node), ("client_message_id", cmid)), event,
                                  known, problem, self._prefix(history, event, related=known), fact=fact)
                    if last is None and (table_row, http_status) in tables.creating_decisions and oid is not None:
                        made = event

    @staticmethod
    def _max_age_case(event: tuple[Any, ...], previous: tuple[Any, ...] | None) -> str:
        """The TRC-MAX-AGE case of an outbox transition (``previous``: the row's transition before it), or ''."""
        ts, table_row, max_age_at, enqueued_at = event[3], event[11], event[13], event[16]
        if table_row == "OB-PENDING-DISPATCH" and max_age_at is not None and ts > max_age_at:
            return "max-age-dispatched"
        if table_row == "OB-PENDING-MAX-AGE" and (max_age_at is None or ts <= max_age_at):
            return "max-age-aged-out"
        if previous is not None and previous[13] is not None and (max_age_at is None or max_age_at > previous[13]):
            return "max-age-raised"
        if previous is not None and enqueued_at != previous[16]:
            return "max-age-enqueued-changed"
        return ""

    def _ledger(self, ot: list[tuple[Any, ...]], ad: list[tuple[Any, ...]], ac: list[tuple[Any, ...]],
                dl: list[tuple[Any, ...]], st: _State) -> None:
        """TRC-ONE-MESSAGE, TRC-SIDE-EFFECTS, TRC-DONE-HAS-MESSAGE, TRC-DELIVERY-COMMITTED."""
        ledger: dict[tuple[str, str], dict[Any, dict[str, list[Ref]]]] = defaultdict(
            lambda: defaultdict(lambda: defaultdict(list)))
        for event in ad:
            node, seq, line, mesh, cmid, table_row, bmid = event
            if bmid is not None:
                ledger[(mesh, cmid)][bmid]["named"].append((node, seq, line))
                if table_row == "BRK-ACCEPT":
                    ledger[(mesh, cmid)][bmid]["accept"].append((node, seq, line))
        for event in ac:
            node, seq, line, mesh, cmid, bmid, dedupe, message, history, delivery, recipients = event
            ref = (node, seq, line)
            ledger[(mesh, cmid)][bmid]["commit"].append(ref)
            ledger[(mesh, cmid)][bmid]["named"].append(ref)
            if (dedupe, message, history, delivery) != (1, 1, 1, recipients):
                self._add(st, "TRC-SIDE-EFFECTS", (("mesh", mesh), ("client_message_id", cmid)), ref, None,
                          "side-effects-counts", [ref])
        for event in ot:
            if event[9] == "done":
                ledger[(event[4], event[5])][event[14]]["done"].append((event[0], event[1], event[2]))
        for event in dl:
            node, seq, line, mesh, cmid, bmid = event[:6]
            ledger[(mesh, cmid)][bmid]["delivery"].append((node, seq, line))
        for (mesh, cmid), by_bmid in ledger.items():
            key = (("mesh", mesh), ("client_message_id", cmid))
            firsts = sorted(min(roles["named"]) for roles in by_bmid.values() if roles["named"])
            if len(firsts) > 1:
                self._add(st, "TRC-ONE-MESSAGE", key, firsts[-1], firsts[0], "one-message-messages",
                          [firsts[0], firsts[-1]], fact=len(firsts))
            else:
                commits = [ref for roles in by_bmid.values() for ref in roles["commit"]]
                if len(commits) > 1:
                    self._add(st, "TRC-ONE-MESSAGE", key, max(commits), min(commits),
                              "one-message-commits", [min(commits), max(commits)], fact=len(commits))
            for roles in by_bmid.values():
                if roles["accept"] and not roles["commit"]:
                    ref = min(roles["accept"])
                    self._add(st, "TRC-SIDE-EFFECTS", key, ref, None, "side-effects-uncommitted", [ref])
                if roles["done"] and not roles["commit"]:
                    ref = min(roles["done"])
                    st.done_candidates.append((mesh, key, ref))
                if roles["delivery"] and not roles["commit"]:
                    ref = min(roles["delivery"])
                    self._add(st, "TRC-DELIVERY-COMMITTED", key, ref, None, "delivery-uncommitted", [ref])

    def _deliveries(self, dl: list[tuple[Any, ...]], da: list[tuple[Any, ...]], st: _State) -> None:
        """TRC-DELIVERY-ACKED (decided at the end, when each broker node's last ts is known), but for an ack that
        names no traced delivery (its recipient and broker message), decided here."""
        groups: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [[], [], set(), []])
        for node, seq, line, mesh, _cmid, bmid, did, lease, recipient in dl:
            groups[(mesh, did)][0].append(((node, seq, line), lease))
            groups[(mesh, did)][2].add((recipient, bmid))
        for node, seq, line, mesh, did, recipient, bmid in da:
            groups[(mesh, did)][1].append((node, seq, line))
            groups[(mesh, did)][3].append(((node, seq, line), (recipient, bmid)))
        for (mesh, did), (deliveries, acks, named, ack_names) in groups.items():
            unknown = [ref for ref, name in ack_names if name not in named]
            if unknown:
                ack = min(unknown)
                refs = sorted([ref for ref, _ in deliveries if ref <= ack] + [ref for ref in acks if ref <= ack])
                self._add(st, "TRC-DELIVERY-ACKED", (("mesh", mesh), ("delivery_id", did)), ack, None,
                          "delivery-ack-unknown", self._trim(refs))
            if not deliveries:
                continue
            deliveries.sort()
            st.delivery_candidates.append(((mesh, did), deliveries, sorted(acks)))

    def _inbox(self, ii: list[tuple[Any, ...]], st: _State) -> None:
        """TRC-ONE-INBOX-ROW."""
        inserted: dict[tuple[str, str], list[Ref]] = defaultdict(list)
        for node, seq, line, recipient, cmid, flag in ii:
            if flag:
                inserted[(recipient, cmid)].append((node, seq, line))
        for (recipient, cmid), refs in inserted.items():
            if len(refs) > 1:
                self._add(st, "TRC-ONE-INBOX-ROW", (("recipient", recipient), ("client_message_id", cmid)),
                          max(refs), min(refs), "inbox-rows", [min(refs), max(refs)], fact=len(refs))

    def _new_rows(self, ot: list[tuple[Any, ...]], ipc: list[tuple[Any, ...]], st: _State) -> None:
        """TRC-NEW-ROW-TRACED: what follows each 202 IPC-NEW decision of a (node, client_message_id); a decision
        followed by nothing of its row is decided at the end, against the ids whose first transition (from any
        state: an accept's event may be lost, E-32) its node traced later and dispatched."""
        subjects: dict[tuple[str, str], list[tuple[int, int, bool, tuple[Any, ...]]]] = defaultdict(list)
        creating = self.tables.creating_decisions
        for event in ot:
            subjects[(event[0], event[5])].append((event[1], event[2], True, event))
        for event in ipc:
            if event[5] == "none" or (event[7], event[8]) in creating:
                subjects[(event[0], event[3])].append((event[1], event[2], False, event))
        for (node, _), events in subjects.items():
            events.sort(key=lambda e: (e[0], e[1]))
            following = None  # the next transition, or decision that found no row
            for _, _, is_ot, event in reversed(events):
                if not is_ot and (event[7], event[8]) in creating:
                    fp, oid = event[4], event[9]
                    if following is None:
                        st.untraced_new.append(event)
                    elif not following[0]:
                        self._add(st, "TRC-NEW-ROW-TRACED", (("node", node), ("client_message_id", event[3])),
                                  following[1], event, "new-row-gone", [event, following[1]])
                    elif following[1][7] != fp or (oid is not None and following[1][6] != oid):
                        self._add(st, "TRC-NEW-ROW-TRACED", (("node", node), ("client_message_id", event[3])),
                                  following[1], event, "new-row-other-row", [event, following[1]])
                if is_ot or event[5] == "none":
                    following = (is_ot, event)
        created: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [None, False])
        for event in ot:
            subject = created[(event[0], event[5])]
            if subject[0] is None or event[1] < subject[0]:  # the id's first transition, whatever its `from`
                subject[0] = event[1]
            if event[10] == "dispatch":
                subject[1] = True
        for (node, _), (seq, dispatched) in created.items():
            if dispatched and seq is not None and seq > st.created_dispatched.get(node, -1):
                st.created_dispatched[node] = seq

    def _inflight(self, ot: list[tuple[Any, ...]], st: _State) -> None:
        """TRC-INFLIGHT-RESOLVED: the (node, client_message_id) subjects whose last transition leaves their row
        inflight (decided at the end, when each daemon node's last ts is known)."""
        last: dict[tuple[str, str], tuple[Any, ...]] = {}
        for event in ot:
            current = last.get((event[0], event[5]))
            if current is None or (event[1], event[2]) > (current[1], current[2]):
                last[(event[0], event[5])] = event
        st.inflight.extend(event for event in last.values() if event[9] == "inflight")

    def _duplicates(self, ad: list[tuple[Any, ...]], ac: list[tuple[Any, ...]], st: _State) -> None:
        """TRC-DUP-FINGERPRINT: each BRK-DUP-MATCH / BRK-DUP-MISMATCH decision against the first commit."""
        first: dict[tuple[str, str], tuple[Any, ...]] = {}
        for event in ac:
            current = first.get((event[3], event[4]))
            if current is None or event[:3] < current[:3]:
                first[(event[3], event[4])] = event
        for event in ad:
            commit = first.get((event[3], event[4]))
            if commit is None or event[5] not in ("BRK-DUP-MATCH", "BRK-DUP-MISMATCH"):
                continue
            same = event[6] == commit[6]
            if same != (event[5] == "BRK-DUP-MATCH"):
                self._add(st, "TRC-DUP-FINGERPRINT", (("mesh", event[3]), ("client_message_id", event[4])), event,
                          commit, "dup-mismatch-same-fingerprint" if same else "dup-match-other-fingerprint",
                          sorted([event[:3], commit[:3]]))

    def _attempts(self, dl: list[tuple[Any, ...]], st: _State) -> None:
        """TRC-DELIVERY-ATTEMPTS: consecutive deliveries of a (mesh, delivery_id) in (node, seq) order."""
        groups: dict[tuple[str, str], list[tuple[Any, ...]]] = defaultdict(list)
        for event in dl:
            groups[(event[3], event[4])].append(event)
        for (mesh, did), events in groups.items():
            events.sort()
            for before, after in itertools.pairwise(events):
                if after[5] <= before[5]:
                    self._add(st, "TRC-DELIVERY-ATTEMPTS", (("mesh", mesh), ("delivery_id", did)), after, before,
                              "attempt-not-increasing", [before[:3], after[:3]])
                    break

    def _inbox_seqs(self, ii: list[tuple[Any, ...]], st: _State) -> None:
        """TRC-INBOX-SEQ-NAMES-ROW, and the inserted rows' inbox_seq per node for TRC-INBOX-SEQ-MONOTONIC (decided at
        the end)."""
        subjects: dict[tuple[str, str], list[tuple[Any, ...]]] = defaultdict(list)
        for event in ii:
            node, seq, line, recipient, cmid, inserted, inbox_seq = event
            if inserted and inbox_seq is not None:
                found = st.inbox_seqs.get(node)
                if found is None:
                    found = st.inbox_seqs[node] = (array("q"), array("q"), array("q"))
                found[0].append(line)
                found[1].append(inbox_seq)
                found[2].append(seq)
            if inserted or inbox_seq is not None:
                subjects[(recipient, cmid)].append(event)
        for (recipient, cmid), events in subjects.items():
            rows = [e for e in events if e[5]]
            if not rows:
                continue
            held = {e[6] for e in rows}
            row = min(rows)
            for event in events:
                if not event[5] and event[6] not in held:
                    self._add(st, "TRC-INBOX-SEQ-NAMES-ROW", (("recipient", recipient), ("client_message_id", cmid)),
                              event, row, "inbox-seq-misnamed", sorted([event[:3], row[:3]]))

    def _hooks(self, events: list[tuple[Any, ...]], st: _State) -> None:
        """TRC-HOOK-ONCE, TRC-HOOK-ENQUEUED, TRC-HOOK-REPLY-ID, and the runs TRC-HOOK-RUN-FINISHED decides at the end
        (when each daemon node's last ts is known): per (node, client_message_id, hook), in (seq, line) order."""
        subjects: dict[tuple[str, str, str], list[tuple[Any, ...]]] = defaultdict(list)
        for event in events:
            subjects[(event[0], event[5], event[6])].append(event)
        for (node, cmid, hook), found in subjects.items():
            key = (("node", node), ("client_message_id", cmid), ("hook", hook))
            found.sort(key=lambda e: (e[1], e[2]))
            enqueues = [e for e in found if e[4] == "hook_enqueue"]
            runs = [e for e in found if e[4] == "hook_run"]
            for name, group in (("hook-enqueued-twice", enqueues), ("hook-finished-twice", runs)):
                if len(group) > 1:
                    self._add(st, "TRC-HOOK-ONCE", key, group[-1], group[0], name, [group[0][:3], group[-1][:3]],
                              fact=len(group))
            if runs and (not enqueues or enqueues[0][1:3] > runs[0][1:3]):
                related = enqueues[0] if enqueues else None
                self._add(st, "TRC-HOOK-ENQUEUED", key, runs[0], related, "hook-run-unenqueued",
                          sorted(e[:3] for e in (runs[0], related) if e is not None))
            if enqueues and not runs:
                st.hook_pending.append((*enqueues[0][:4], key))
            for run in runs:
                if run[7] is not None and run[7] != hook_reply_id(cmid, hook):
                    self._add(st, "TRC-HOOK-REPLY-ID", key, run, None, "hook-reply-id", [run[:3]])
                    break

    def _settle_added(self, st: _State) -> None:
        """The end of TRC-NEW-ROW-TRACED, TRC-INFLIGHT-RESOLVED, TRC-INBOX-SEQ-MONOTONIC and TRC-HOOK-RUN-FINISHED."""
        for node, seq, line, ts, key in st.hook_pending:
            end = st.node_end.get(node, 0)
            if ts + self.hook_timeout + self.hook_grace < end:
                self._add(st, "TRC-HOOK-RUN-FINISHED", key, (node, seq, line), None, "hook-run-unfinished",
                          [(node, seq, line)], fact=end)
        for event in st.untraced_new:
            later = st.created_dispatched.get(event[0], -1)
            if later > event[1]:
                self._add(st, "TRC-NEW-ROW-TRACED", (("node", event[0]), ("client_message_id", event[3])), event,
                          None, "new-row-untraced", [event[:3]], fact=later)
        for event in st.inflight:
            end = st.node_end.get(event[0], 0)
            if event[3] + self.ack_timeout + self.ack_grace < end:
                self._add(st, "TRC-INFLIGHT-RESOLVED", (("node", event[0]), ("outbox_id", event[6])), event, None,
                          "inflight-unresolved", [event[:3]], fact=end)
        for node, (lines, values, seqs) in st.inbox_seqs.items():
            order = sorted(range(len(lines)), key=lambda k: (lines[k], seqs[k]))
            for a, b in itertools.pairwise(order):
                if values[b] <= values[a]:
                    self._add(st, "TRC-INBOX-SEQ-MONOTONIC", (("node", node),), (node, seqs[b], lines[b]),
                              (node, seqs[a], lines[a]), "inbox_seq-not-increasing",
                              [(node, seqs[a], lines[a]), (node, seqs[b], lines[b])], by_line=True)
                    break

    @staticmethod
    def _published(ii: list[tuple[Any, ...]], sse: list[tuple[Any, ...]], st: _State) -> None:
        """The node's inbox inserts and message events, for TRC-MESSAGE-EVENT-NEW-ROW (decided at the end)."""
        for node, seq, line, code in itertools.chain(
                ((e[0], e[1], e[2], NEW_ROW if e[3] else REDELIVERY) for e in ii),
                ((e[0], e[1], e[2], MESSAGE) for e in sse if e[3] == "message")):
            _append(st.published, node, "qqb", line, seq, code)

    def _message_events(self, st: _State) -> None:
        """TRC-MESSAGE-EVENT-NEW-ROW: on a node with more message events than new inbox rows, the first message
        event (line order) that outnumbers the new rows before it, with the last inbox_insert before it."""
        for node, (lines, seqs, codes) in st.published.items():
            if codes.count(MESSAGE) <= codes.count(NEW_ROW):
                continue
            messages = rows = 0
            last: Ref | None = None
            for k in sorted(range(len(lines)), key=lambda k: (lines[k], seqs[k])):
                ref = (node, seqs[k], lines[k])
                if codes[k] != MESSAGE:
                    rows += codes[k] == NEW_ROW
                    last = ref
                    continue
                messages += 1
                if messages > rows:
                    self._add(st, "TRC-MESSAGE-EVENT-NEW-ROW", (("node", node),), ref, last,
                              "message-event-without-row", sorted(r for r in (last, ref) if r is not None),
                              by_line=True, fact=rows)
                    break

    # --- the end of the pass ----------------------------------------------------------------------------------
    def _finish(self, st: _State) -> None:
        for node, (lines, seqs) in st.lines.items():
            order = sorted(range(len(lines)), key=lambda k: (lines[k], seqs[k]))
            for a, b in itertools.pairwise(order):
                if seqs[b] <= seqs[a]:
                    self._add(st, "TRC-SEQ-MONOTONIC", (("node", node),), (node, seqs[b], lines[b]),
                              (node, seqs[a], lines[a]), "seq-not-increasing",
                              [(node, seqs[a], lines[a]), (node, seqs[b], lines[b])], by_line=True)
                    break
        for node, (lines, ids, seqs) in st.sse.items():
            order = sorted(range(len(lines)), key=lambda k: (lines[k], seqs[k]))
            for a, b in itertools.pairwise(order):
                if ids[b] <= ids[a]:
                    self._add(st, "TRC-EVENT-IDS-MONOTONIC", (("node", node),), (node, seqs[b], lines[b]),
                              (node, seqs[a], lines[a]), "event_id-not-increasing",
                              [(node, seqs[a], lines[a]), (node, seqs[b], lines[b])], by_line=True)
                    break
        for mesh, key, ref in st.done_candidates:
            if mesh in st.broker_meshes:
                self._add(st, "TRC-DONE-HAS-MESSAGE", key, ref, None, "done-uncommitted", [ref])
        for (mesh, did), deliveries, acks in st.delivery_candidates:
            last, lease = deliveries[-1]
            key = (("mesh", mesh), ("delivery_id", did))
            prefix = [ref for ref, _ in deliveries]
            ack = acks[0] if acks else None
            if ack is None:
                end = st.node_end.get(last[0], 0)
                if lease + self.grace < end:
                    self._add(st, "TRC-DELIVERY-ACKED", key, last, None, "delivery-unacked", self._trim(prefix),
                              fact=end)
            elif last > ack:
                refs = sorted(prefix + [a for a in acks if a < last])
                self._add(st, "TRC-DELIVERY-ACKED", key, last, ack, "delivery-after-ack", self._trim(refs, ack))
        self._starts(st)
        firsts: dict[tuple[str, str], tuple[Any, ...]] = {}  # each successor row's first `none -> pending`
        for successor in st.successors:
            current = firsts.get((successor[0], successor[6]))
            if current is None or (successor[1], successor[2]) < (current[1], current[2]):
                firsts[(successor[0], successor[6])] = successor
        for (node, oid), successor in firsts.items():
            fp, key, ref = successor[7], (("node", node), ("outbox_id", oid)), (node, successor[1], successor[2])
            retired = sorted(st.aborted.get((node, oid), ()), key=lambda e: (e[1], e[2]))
            rel = None if not retired else (retired[0][0], retired[0][1], retired[0][2])
            if retired and retired[0][7] != fp:
                self._add(st, "TRC-FP-FROZEN", key, ref, rel, "fp-successor", sorted([rel, ref]))
            # REQUEUE-ATOMIC, for a successor event the replay finds legal (else that is reported at the same event)
            if successor[12] != 0 or self.tables.attempts_delta("none", "requeue", successor[9],
                                                                successor[11]) is None:
                continue
            if not retired:
                self._add(st, "TRC-OUTBOX-LEGAL", key, ref, None, "outbox-successor-orphan", [ref])
            elif retired[0][11] != successor[11]:
                self._add(st, "TRC-OUTBOX-LEGAL", key, ref, rel, "outbox-successor-row", sorted([rel, ref]))

    def _starts(self, st: _State) -> None:
        """TRC-OUTBOX-LEGAL for each first transition at `pending` whose row its bucket did not show created: legal
        (but for its attempts) when the node's trace shows the row created anywhere, else `outbox-from`."""
        for event, attempts_ok, expected_attempts, evidence in st.starts:
            node, oid = event[0], event[6]
            made = (node, oid) in st.created or any(
                e[6] != oid and (e[8], e[10], e[9]) in self.tables.creating_transitions
                for e in st.aborted.get((node, oid), ()))
            if not made or not attempts_ok:
                self._add(st, "TRC-OUTBOX-LEGAL", (("node", node), ("outbox_id", oid)), event, None,
                          "outbox-attempts" if made else "outbox-from", evidence, fact=expected_attempts)

    # --- helpers ----------------------------------------------------------------------------------------------
    def _trim(self, refs: list[Ref], related: Ref | None = None) -> list[Ref]:
        keep = self.evidence_events - 1
        chosen = set(refs[:1] + refs[-keep:] if len(refs) > keep + 1 else refs)
        if related is not None:
            chosen.add(related)
        return sorted(chosen)

    def _prefix(self, history: list[tuple[int, int, tuple[Any, ...]]], event: tuple[Any, ...],
                kinds_ot_only: bool = False, row: str | None = None, related: tuple[Any, ...] | None = None
                ) -> list[Ref]:
        refs = []
        for _, is_ot, e in history:
            if kinds_ot_only and not is_ot:
                continue
            if row is not None and e[6] != row:
                continue
            refs.append((e[0], e[1], e[2]))
            if e is event:
                break
        return self._trim(refs, None if related is None else (related[0], related[1], related[2]))

    @staticmethod
    def _add(st: _State, invariant: str, key: tuple[tuple[str, str], ...], event: tuple[Any, ...],
             related: tuple[Any, ...] | None, detail: str, evidence: list[Ref], by_line: bool = False,
             fact: Any = None) -> None:
        """Record a candidate; ``event`` and ``related`` are event tuples or refs (both start node, seq, line);
        ``detail`` is a case of ``catalogue.DETAILS`` and ``fact`` its engine-computed value."""
        ref = (event[0], event[1], event[2])
        rel = None if related is None else (related[0], related[1], related[2])
        order = ("", ref[2]) if by_line else (ref[0], ref[1])
        order += ("", -1) if rel is None else (rel[0], rel[1])
        # two candidates of one key at the same (node, seq) pair -- a node that repeated a seq -- are ordered by
        # their lines, as every engine orders them
        order += (ref[2], -1 if rel is None else rel[2])
        st.candidates.append((invariant, key, order, ref, rel, (detail, fact), evidence))

    @staticmethod
    def _first(candidates: list[tuple[Any, ...]]) -> dict[tuple[str, Any], tuple[Any, ...]]:
        chosen: dict[tuple[str, Any], tuple[Any, ...]] = {}
        for candidate in candidates:
            key = (candidate[0], candidate[1])
            current = chosen.get(key)
            if current is None or candidate[2] < current[2]:
                chosen[key] = candidate
        return chosen

    def _evidence(self, trace: Trace, chosen: dict[tuple[str, Any], tuple[Any, ...]], st: _State
                  ) -> list[Violation]:
        wanted: set[tuple[str, int]] = {(ref[0], ref[2]) for c in chosen.values() for ref in (*c[6], c[3])}
        wanted |= {(c[4][0], c[4][2]) for c in chosen.values() if c[4] is not None}
        rows = load_rows(trace, wanted) if wanted else {}
        violations = []
        for (invariant, key), (_, _, _, ref, rel, (case, fact), evidence) in chosen.items():
            related = None if rel is None else rows[(rel[0], rel[2])]
            violations.append(Violation(
                invariant, key, EventRef(*ref), None if rel is None else EventRef(*rel),
                detail_text(case, rows[(ref[0], ref[2])], related, fact),
                evidence_entries(rows[(r[0], r[2])] for r in evidence if (r[0], r[2]) in rows)))
        return violations


@dataclass
class _State:
    events: int = 0
    sources: set[str] = field(default_factory=set)
    broker_meshes: set[str] = field(default_factory=set)
    node_end: dict[str, int] = field(default_factory=dict)
    lines: dict[str, tuple[array, array]] = field(default_factory=dict)
    sse: dict[str, tuple[array, array, array]] = field(default_factory=dict)
    successors: list[tuple[Any, ...]] = field(default_factory=list)
    created: set[tuple[str, str]] = field(default_factory=set)  # rows named by a decision of another bucket
    starts: list[tuple[Any, ...]] = field(default_factory=list)  # first transitions at `pending`, undecided
    aborted: dict[tuple[str, str], list[tuple[Any, ...]]] = field(default_factory=lambda: defaultdict(list))
    done_candidates: list[tuple[Any, ...]] = field(default_factory=list)
    delivery_candidates: list[tuple[Any, ...]] = field(default_factory=list)
    untraced_new: list[tuple[Any, ...]] = field(default_factory=list)
    created_dispatched: dict[str, int] = field(default_factory=dict)
    inflight: list[tuple[Any, ...]] = field(default_factory=list)
    inbox_seqs: dict[str, tuple[array, array, array]] = field(default_factory=dict)
    published: dict[str, tuple[array, array, array]] = field(default_factory=dict)  # (line, seq, NEW_ROW/...)
    hook_pending: list[tuple[Any, ...]] = field(default_factory=list)  # first enqueue of a run never marked
    candidates: list[tuple[Any, ...]] = field(default_factory=list)


def load_rows(trace: Trace | str | Path | list[str] | list[Path], wanted: set[tuple[str, int]]
              ) -> dict[tuple[str, int], dict[str, Any]]:
    """The flat rows of the valid events at the (node, line) positions in ``wanted`` (JSONL rows keep ``file`` and
    ``file_line``). A valid event's position is held by no other row, so no row read here shares one."""
    trace = trace if isinstance(trace, Trace) else locate(trace)
    found: dict[tuple[str, int], dict[str, Any]] = {}
    if trace.is_jsonl:
        for row in fmt.read_jsonl(trace.jsonl).rows:
            if (row["node"], row["line"]) in wanted:
                found[(row["node"], row["line"])] = row
        return found
    nodes = sorted({node for node, _ in wanted})
    for path in trace.parquet_files:
        table = fmt.read_table(path, schema=fmt.FLAT_SCHEMA, filters=[("node", "in", nodes)])
        if table.num_rows == 0:
            continue
        valid, _, _ = fmt.validate_table(table)
        for row in valid.to_pylist():
            if (row["node"], row["line"]) in wanted:
                found[(row["node"], row["line"])] = row
    return found


def validate(paths: str | Path | list[str] | list[Path]) -> tuple[int, list[dict[str, Any]], dict[str, int]]:
    """Read a trace as ``check`` does without checking the catalogue: (valid events, the first invalid ones, invalid
    counts by reason). Raises ``inputs.InputError`` when there is nothing to read or more nodes than the checks hold."""
    invalid = _Invalid()
    events, nodes = 0, set()
    for table in _buckets(locate(paths), invalid):
        events += table.num_rows
        nodes.update(table.column("node").unique().to_pylist())
    check_node_count(len(nodes))
    return events, [entry for _, entry in invalid.listed], invalid.reasons


def check(paths: str | Path | list[str] | list[Path], **options: Any) -> Report:
    """Check a trace (JSONL files or directories, or a Parquet dataset) with the oracle."""
    return Oracle(**options).check(paths)


__all__ = ["BY_ID", "Oracle", "Report", "check", "load_rows", "sort_violations", "validate"]
