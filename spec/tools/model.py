"""`meshd spec model-check`: the outbox + broker dedupe model, explored exhaustively, built from the tables.

Theory of operation. This is the Python twin of ``spec/model/Outbox.tla``: the same variables, the same actions,
the same bounds, so that TLC and this explorer reach the same number of distinct states. The difference is where the
decisions come from. The TLA+ module transcribes the three tables by hand; here every decision is made by a sans-IO
core (an argument, ``spec.tools.implementation.Core``: ``meshd spec model-check`` hands it ``reference.core``) reading
the tables it is given (``DecisionTable`` objects, the real ones from ``spec/tables`` by default):

* a client POST calls the core's ``decide_send`` (the §4.5.1 lookup table) and, when it says insert, ``new_row`` and
  ``accepted``;
* every outbox event (dispatch, an ack, a timeout, a lost link, max age, crash recovery, requeue) calls the core's
  ``apply``; its IO effects ``send_frame`` and ``arm_ack_timer`` are performed by the model;
* the broker's accept transaction calls the core's ``settle`` after learning each input in order
  (B1, canonical-form drift, whose dedupe row, fingerprint, B2, commit) and branches only on inputs the outcome still
  depends on. A ``commit`` applies the effects the row lists, all in one step; anything else changes nothing.

So a test can hand in a deliberately broken table and watch an invariant fail with a shortest counterexample.

Abstraction. A state holds, per ``client_message_id``: the outbox row reduced to (status, request variant,
attempts saturated at ``max_attempts``, successor id); the broker's dedupe row (the variant it stored) and its
message, history and delivery row counts; plus the daemon's armed ack timers, the network channel (a bag of send
frames and acks, unordered: a reconnect may reorder), and the number of crashes so far. Time is abstract: backoff
and ``next_attempt_at`` are not kept (a pending row may be dispatched at any time) and "the row is older than its max
age" and "the ack timer fired" are nondeterministic events (jitter 0, a fixed ``OutboxPolicy``). An ack timer only
exists while its row is ``inflight``. A request has one of two variants, ``A`` and ``B``; a retry with the same
variant has a matching fingerprint. The first request for a key is called ``A`` (renaming the variants of one key is
a symmetry of the model), so a client POSTs ``A`` to a free key and ``A`` or ``B`` to a used one.

Faults are what the network, the broker's database and the host may do to us: a broker commit that fails (5xx), a
lost frame or ack, a dropped link, an ack timer that fires while the answer is still on its way, a daemon crash (and
restart: the channel and the timers are lost, and every row gets ``crash_recovery``). Faults that hit a row are
enabled only while its ``attempts`` is below ``max_attempts`` (after that the broker is reachable and reliable), and
crashes are bounded by ``max_crashes``; this keeps the state space finite and is the "broker eventually reachable"
assumption of ``Termination``. Clients and the operator are not faults: a client may POST any key with either
variant at any time, and the operator may requeue any row onto the first unused id of the spare pool.

Properties: state invariants ``AtMostOneBrokerMessage``, ``AllOrNothing``, ``DoneMeansAccepted``; step invariants
``ConflictNeverMutates``, ``ConsumedNeverFreed``, ``FingerprintFrozen``; and ``Termination`` (the explorer's progress
check with the fault actions excluded). A table that answers "impossible" for an event the model produces (or has no
row for it) is reported as an error of that action, with its trace; a row a table sends to status ``none`` counts as
freed. Results of the pure core calls are memoised per run.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from spec import SPEC_DIR, load_table
from spec.decision import DecisionTable, TableError, decision_table
from spec.tools.explore import Action, Invariant, Progress, Result, StepInvariant, explore, format_trace
from spec.tools.implementation import Core

MODEL_DIR = SPEC_DIR / "model"
VARIANTS = ("A", "B")
TERMINAL = frozenset(name for name, state in load_table("outbox")["states"].items() if state["terminal"])
FAULTS = frozenset({"BrokerCommitFail", "LoseMessage", "LinkDrop", "AckTimeoutEarly", "CrashRestart"})
UNFAIR = frozenset({"Post", "Requeue", "MaxAge"})  # clients, the operator and the clock: no fairness in Outbox.tla
_RETRY = load_table("timing")["backoff"]["outbox_retry"]
#: the OutboxPolicy of a model run: E-14's schedule without jitter (timing.yaml)
POLICY = {"retry_base_ms": _RETRY["base_ms"], "retry_max_ms": _RETRY["max_ms"], "jitter": 0.0, "max_age_hours": 72}
NOW = 0
_FINGERPRINT = {variant: hashlib.sha256(variant.encode()).digest() for variant in VARIANTS}
_VARIANT = {digest: variant for variant, digest in _FINGERPRINT.items()}

STATE_INVARIANTS = ("AtMostOneBrokerMessage", "AllOrNothing", "DoneMeansAccepted")
STEP_INVARIANTS = ("ConflictNeverMutates", "ConsumedNeverFreed", "FingerprintFrozen")
LIVENESS = ("Termination",)


@dataclass(frozen=True)
class ModelParams:
    """The bounds of one model run (the TLA+ CONSTANTS)."""

    keys: int = 1  # client_message_ids k1..kN that clients POST
    spare: int = 2  # ids s1..sN the operator's requeue takes its fresh ids from, in order
    max_attempts: int = 2  # attempts saturate here; faults hit a row only below it
    max_crashes: int = 1
    max_states: int = 3_000_000

    @classmethod
    def quick(cls) -> ModelParams:
        """One key, one spare id: about two thousand states, under a second."""
        return cls(keys=1, spare=1, max_attempts=2, max_crashes=1)

    @classmethod
    def full(cls) -> ModelParams:
        """Two keys and one spare id: about a quarter of a million states, a minute or two."""
        return cls(keys=2, spare=1, max_attempts=2, max_crashes=1)

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(f"k{n}" for n in range(1, self.keys + 1))

    @property
    def spare_ids(self) -> tuple[str, ...]:
        return tuple(f"s{n}" for n in range(1, self.spare + 1))

    @property
    def ids(self) -> tuple[str, ...]:
        return self.key_ids + self.spare_ids


class RowView(NamedTuple):
    """An outbox row as the model keeps it."""

    status: str
    variant: str
    attempts: int
    successor: str = ""

    def __str__(self) -> str:
        tail = f"->{self.successor}" if self.successor else ""
        return f"{self.status}/{self.variant}/a{self.attempts}{tail}"


Message = tuple[str, str, str]  # ("send", id, variant) or ("ack", id, outbox event)


class State(NamedTuple):
    """One model state (a tuple, so hashing and equality run at C speed); per-id tuples follow ``ModelParams.ids``."""

    rows: tuple[RowView | None, ...]
    timers: frozenset[str]
    channel: tuple[tuple[Message, int], ...]  # a bag, sorted
    dedupe: tuple[str | None, ...]
    messages: tuple[int, ...]
    history: tuple[int, ...]
    delivery: tuple[int, ...]
    crashes: int = 0


@dataclass(frozen=True)
class Step:
    """The label of one model step: what happened and which table rows decided it."""

    action: str
    args: str
    outcome: str = ""
    rows: tuple[str, ...] = ()
    http_status: int | None = None

    def __str__(self) -> str:
        text = f"{self.action}({self.args})"
        if self.outcome:
            text += f" -> {self.outcome}"
        if self.rows:
            text += f" [{', '.join(self.rows)}]"
        return text


def _put(channel: tuple[tuple[Message, int], ...], message: Message) -> tuple[tuple[Message, int], ...]:
    bag = dict(channel)
    bag[message] = bag.get(message, 0) + 1
    return tuple(sorted(bag.items()))


def _take(channel: tuple[tuple[Message, int], ...], message: Message) -> tuple[tuple[Message, int], ...]:
    bag = dict(channel)
    bag[message] -= 1
    if not bag[message]:
        del bag[message]
    return tuple(sorted(bag.items()))


def _ack_event(http_status: str) -> str:
    """The outbox event a broker answer becomes (§4.5b, E-10; no retention pruning in the model)."""
    if http_status == "201":
        return "ack_created"
    if http_status == "200":
        return "ack_duplicate_history"
    if http_status == "409":
        return "ack_conflict"
    if http_status.startswith("4"):
        return "ack_rejected"
    return "ack_failed"  # 5xx, or anything without a valid status


class OutboxModel:
    """The model's actions and properties over the given tables."""

    def __init__(self, core: Core, params: ModelParams, ipc_table: DecisionTable, outbox_table: DecisionTable,
                 broker_table: DecisionTable):
        self.core = core
        self.policy = core.OutboxPolicy(**POLICY)
        self.params = params
        self.ipc_table = ipc_table
        self.outbox_table = outbox_table
        self.broker_table = broker_table
        self.ids = params.ids
        self.position = {cmid: n for n, cmid in enumerate(self.ids)}
        self._applied: dict[tuple[Any, ...], tuple[str, str, tuple[str, ...], RowView | None, RowView | None]] = {}
        self._decided: dict[tuple[Any, ...], Any] = {}  # the core's decisions and settled outcomes
        self._settled: dict[tuple[tuple[str, str], ...], Any] = {}
        self._branches: dict[tuple[str | None, str], list[tuple[dict[str, str], Any]]] = {}

    # --- states -----------------------------------------------------------------------------------------------
    def initial(self) -> State:
        """No rows, nothing in flight, an empty broker."""
        nothing = tuple(None for _ in self.ids)
        zero = tuple(0 for _ in self.ids)
        return State(nothing, frozenset(), (), nothing, zero, zero, zero, 0)

    def row(self, state: State, cmid: str) -> RowView | None:
        """The row for ``cmid``, or ``None``."""
        return state.rows[self.position[cmid]]

    def _with_rows(self, state: State, changes: dict[str, RowView | None], **other: Any) -> State:
        rows = list(state.rows)
        for cmid, view in changes.items():
            rows[self.position[cmid]] = view
        timers = other.pop("timers", state.timers)
        timers = frozenset(t for t in timers if (r := rows[self.position[t]]) is not None and r.status == "inflight")
        return state._replace(rows=tuple(rows), timers=timers, **other)

    def done(self, state: State) -> bool:
        """Every accepted send has ended: each row is done, dead or aborted."""
        return all(view is None or view.status in TERMINAL for view in state.rows)

    def fault_allowed(self, state: State, cmid: str) -> bool:
        """Faults hit a row only while its attempts are below ``max_attempts``."""
        view = self.row(state, cmid)
        return view is not None and view.attempts < self.params.max_attempts

    # --- the core, through the given tables ---------------------------------------------------------------------
    def _outbox_row(self, cmid: str, view: RowView) -> Any:
        return self.core.OutboxRow(id=cmid, client_message_id=cmid, request_fingerprint=_FINGERPRINT[view.variant],
                                   payload=view.variant.encode(), enqueued_at=NOW, next_attempt_at=NOW,
                                   status=view.status, attempts=view.attempts, superseded_by=view.successor or None,
                                   max_age_at=NOW + 72 * 3_600_000)

    def _view(self, row: Any) -> RowView | None:
        if row is None or row.status == "none":
            return None
        return RowView(row.status, _VARIANT[row.request_fingerprint], min(row.attempts, self.params.max_attempts),
                       row.superseded_by or "")

    def _apply(self, cmid: str, view: RowView | None, event: str, successor: str = ""
               ) -> tuple[str, str, tuple[str, ...], RowView | None, RowView | None]:
        """The core's ``apply``: (table row, outcome, IO effects, row after, successor row)."""
        key = (view, event, successor)
        if key not in self._applied:
            existing = None if view is None else self._outbox_row(cmid, view)
            result = self.core.apply(existing, self.core.OutboxEvent(
                event, now=NOW, broker_message_id="bm", history_id="h", error=event, jitter_unit=0.0,
                successor_id=successor or None, successor_client_message_id=successor or None,
            ), self.policy, self.outbox_table)
            self._applied[key] = (result.table_row, result.outcome, result.effects, self._view(result.after),
                                  self._view(result.successor))
        return self._applied[key]

    def _event(self, state: State, cmid: str, event: str, successor: str = "", **other: Any) -> tuple[str, State]:
        """Apply one outbox event to ``cmid``'s row and perform its IO effects; returns (table row, next state)."""
        table_row, outcome, effects, after, successor_row = self._apply(cmid, self.row(state, cmid), event, successor)
        changes: dict[str, RowView | None] = {cmid: after}
        if successor_row is not None:
            changes[successor] = successor_row
        channel = other.pop("channel", state.channel)
        timers = set(other.pop("timers", state.timers))
        if "send_frame" in effects and after is not None:
            channel = _put(channel, ("send", cmid, after.variant))
        if "arm_ack_timer" in effects:
            timers.add(cmid)
        label = table_row if outcome == "transition" else f"{table_row} {outcome}"
        return label, self._with_rows(state, changes, channel=channel, timers=frozenset(timers), **other)

    def _decide(self, view: RowView | None, cmid: str, variant: str) -> Any:
        key = (view, variant)
        if key not in self._decided:
            existing = None if view is None else self._outbox_row(cmid, view)
            self._decided[key] = self.core.decide_send(existing, _FINGERPRINT[variant], cmid, self.ipc_table)
        return self._decided[key]

    def _settle(self, known: dict[str, str]) -> Any:
        key = tuple(known.items())
        if key not in self._settled:
            self._settled[key] = self.core.settle(self.broker_table, **known)
        return self._settled[key]

    def _broker_branches(self, stored: str | None, variant: str) -> list[tuple[dict[str, str], Any]]:
        """Every way the accept transaction can go: (the inputs it learned, the settled outcome)."""
        key = (stored, variant)
        if key not in self._branches:
            self._branches[key] = list(self._walk_broker(stored, variant))
        return self._branches[key]

    def _walk_broker(self, stored: str | None, variant: str) -> Iterator[tuple[dict[str, str], Any]]:
        claim = "ours" if stored is None else "theirs"
        given = {"claim": claim, "fingerprint": "match" if claim == "ours" or stored == variant else "mismatch"}
        order = [(name, (given[name],) if name in given else values)
                 for name, values in self.broker_table.inputs.items()]

        def walk(known: dict[str, str], rest: list[tuple[str, tuple[str, ...]]]) -> Iterator[tuple[dict, Any]]:
            settled = self._settle(known)
            if settled is not None:
                yield known, settled
                return
            if not rest:
                raise TableError(f"{self.broker_table.id}: no outcome for {known}")
            (name, values), tail = rest[0], rest[1:]
            for value in values:
                yield from walk({**known, name: value}, tail)

        yield from walk({}, order)

    # --- actions ----------------------------------------------------------------------------------------------
    def post(self, state: State) -> Iterator[tuple[Step, State]]:
        """A client POSTs /v1/send for any key with either variant (§4.5.1)."""
        for cmid in self.params.key_ids:
            view = self.row(state, cmid)
            for variant in VARIANTS if view is not None else VARIANTS[:1]:
                decision = self._decide(view, cmid, variant)
                after = state
                if decision.insert:
                    row = self.core.new_row(cmid, cmid, _FINGERPRINT[variant], variant.encode(), NOW, self.policy)
                    inserted = self.core.accepted(row, self.outbox_table)
                    after = self._with_rows(state, {cmid: self._view(inserted.after)})
                outcome = decision.body.get("conflict") or decision.body.get("status", "")
                yield Step("Post", f"{cmid},{variant}", f"{decision.http_status} {outcome}", (decision.table_row,),
                           decision.http_status), after

    def dispatch(self, state: State) -> Iterator[tuple[Step, State]]:
        """The drain loop sends a pending row."""
        for cmid in self.ids:
            view = self.row(state, cmid)
            if view is not None and view.status == "pending":
                label, after = self._event(state, cmid, "dispatch")
                yield Step("Dispatch", cmid, rows=(label,)), after

    def _broker(self, state: State, failing: bool) -> Iterator[tuple[Step, State]]:
        for message, _ in state.channel:
            kind, cmid, variant = message
            if kind != "send":
                continue
            at = self.position[cmid]
            for known, settled in self._broker_branches(state.dedupe[at], variant):
                if (known.get("commit") == "failed") != failing:
                    continue
                if failing and not self.fault_allowed(state, cmid):
                    continue
                dedupe, messages, history, delivery = (list(state.dedupe), list(state.messages),
                                                       list(state.history), list(state.delivery))
                if settled.commits:
                    if "dedupe" in settled.effects and dedupe[at] is None:
                        dedupe[at] = variant
                    for effect, counts in (("message", messages), ("history", history), ("delivery", delivery)):
                        if effect in settled.effects:
                            counts[at] += 1
                event = _ack_event(settled.http_status)
                channel = _put(_take(state.channel, message), ("ack", cmid, event))
                after = state._replace(channel=channel, dedupe=tuple(dedupe), messages=tuple(messages),
                                history=tuple(history), delivery=tuple(delivery))
                inputs = " ".join(f"{k}={v}" for k, v in known.items())
                yield Step("BrokerCommitFail" if failing else "Broker", f"{cmid},{variant}",
                           f"{settled.http_status} {settled.transaction}; {inputs}", (settled.table_row,)), after

    def broker(self, state: State) -> Iterator[tuple[Step, State]]:
        """The broker takes a send frame and runs its accept transaction (commit not failing)."""
        return self._broker(state, failing=False)

    def broker_commit_fail(self, state: State) -> Iterator[tuple[Step, State]]:
        """Fault: the accept transaction reaches COMMIT and it fails (rolled back, 5xx)."""
        return self._broker(state, failing=True)

    def deliver_ack(self, state: State) -> Iterator[tuple[Step, State]]:
        """The daemon receives an ack and applies it to the row with that client_message_id."""
        for message, _ in state.channel:
            kind, cmid, event = message
            if kind == "ack":
                label, after = self._event(state, cmid, event, channel=_take(state.channel, message))
                yield Step("DeliverAck", f"{cmid},{event}", rows=(label,)), after

    def _in_flight(self, state: State, cmid: str) -> bool:
        return any(message[1] == cmid for message, _ in state.channel)

    def _timeout(self, state: State, early: bool) -> Iterator[tuple[Step, State]]:
        for cmid in self.ids:
            if cmid not in state.timers or self._in_flight(state, cmid) != early:
                continue
            if early and not self.fault_allowed(state, cmid):
                continue
            label, after = self._event(state, cmid, "ack_timeout")
            yield Step("AckTimeoutEarly" if early else "AckTimeout", cmid, rows=(label,)), after

    def ack_timeout(self, state: State) -> Iterator[tuple[Step, State]]:
        """The ack timer fires and nothing for the row is left in flight."""
        return self._timeout(state, early=False)

    def ack_timeout_early(self, state: State) -> Iterator[tuple[Step, State]]:
        """Fault: the ack timer fires while the frame or its ack is still on the way."""
        return self._timeout(state, early=True)

    def lose_message(self, state: State) -> Iterator[tuple[Step, State]]:
        """Fault: one frame or ack is lost."""
        for message, _ in state.channel:
            if self.fault_allowed(state, message[1]):
                yield Step("LoseMessage", ",".join(message)), state._replace(channel=_take(state.channel, message))

    def link_drop(self, state: State) -> Iterator[tuple[Step, State]]:
        """Fault: the WebSocket drops; everything in flight is lost; waiting rows get ``link_lost``."""
        if not any(self.fault_allowed(state, cmid) for cmid in state.timers):
            return
        after = state._replace(channel=())
        labels = []
        for cmid in self.ids:
            if cmid in state.timers:
                label, after = self._event(after, cmid, "link_lost")
                labels.append(label)
        yield Step("LinkDrop", "", rows=tuple(labels)), after

    def crash_restart(self, state: State) -> Iterator[tuple[Step, State]]:
        """Fault: the daemon crashes and restarts; channel and timers are lost; recovery runs on every row (§4.11)."""
        if state.crashes >= self.params.max_crashes:
            return
        after = state._replace(channel=(), timers=frozenset(), crashes=state.crashes + 1)
        labels = []
        for cmid in self.ids:
            if self.row(after, cmid) is not None:
                label, after = self._event(after, cmid, "crash_recovery")
                labels.append(label)
        yield Step("CrashRestart", "", rows=tuple(labels)), after

    def max_age(self, state: State) -> Iterator[tuple[Step, State]]:
        """Time passes: a pending row is found older than its max age at a dispatch attempt (E-14)."""
        for cmid in self.ids:
            view = self.row(state, cmid)
            if view is not None and view.status == "pending":
                label, after = self._event(state, cmid, "max_age_exceeded")
                yield Step("MaxAge", cmid, rows=(label,)), after

    def requeue(self, state: State) -> Iterator[tuple[Step, State]]:
        """The operator requeues any row onto the first unused spare id (§4.5.3, E-09)."""
        fresh = next((s for s in self.params.spare_ids if self.row(state, s) is None), None)
        if fresh is None:
            return
        for cmid in self.ids:
            if self.row(state, cmid) is not None:
                label, after = self._event(state, cmid, "requeue", successor=fresh)
                yield Step("Requeue", f"{cmid}->{fresh}", rows=(label,)), after

    def actions(self) -> list[Action]:
        """The model's actions, named as in Outbox.tla."""
        return [
            Action("Post", self.post),
            Action("Dispatch", self.dispatch),
            Action("Broker", self.broker),
            Action("BrokerCommitFail", self.broker_commit_fail),
            Action("DeliverAck", self.deliver_ack),
            Action("AckTimeout", self.ack_timeout),
            Action("AckTimeoutEarly", self.ack_timeout_early),
            Action("LoseMessage", self.lose_message),
            Action("LinkDrop", self.link_drop),
            Action("CrashRestart", self.crash_restart),
            Action("MaxAge", self.max_age),
            Action("Requeue", self.requeue),
        ]

    # --- properties -------------------------------------------------------------------------------------------
    def invariants(self) -> list[Invariant]:
        """The state invariants."""

        def at_most_one(state: State) -> bool:
            return all(count <= 1 for count in state.messages)

        def all_or_nothing(state: State) -> bool:
            return all(
                (stored is not None) == (m > 0) == (h > 0) == (d > 0)
                for stored, m, h, d in zip(state.dedupe, state.messages, state.history, state.delivery, strict=True)
            )

        def done_means_accepted(state: State) -> bool:
            return all(view is None or view.status != "done" or stored is not None
                       for view, stored in zip(state.rows, state.dedupe, strict=True))

        return [Invariant("AtMostOneBrokerMessage", at_most_one), Invariant("AllOrNothing", all_or_nothing),
                Invariant("DoneMeansAccepted", done_means_accepted)]

    def step_invariants(self) -> list[StepInvariant]:
        """The action properties, checked on every edge."""

        def conflict_never_mutates(state: State, action: str, label: Any, after: State) -> bool:
            return not (action == "Post" and label.http_status == 409) or after == state

        def consumed_never_freed(state: State, action: str, label: Any, after: State) -> bool:
            pairs = zip(state.rows, after.rows, strict=True)
            return after.rows == state.rows or all(b is not None for a, b in pairs if a is not None)

        def fingerprint_frozen(state: State, action: str, label: Any, after: State) -> bool:
            pairs = zip(state.rows, after.rows, strict=True)
            return after.rows == state.rows or all(a.variant == b.variant for a, b in pairs if a and b)

        return [StepInvariant("ConflictNeverMutates", conflict_never_mutates),
                StepInvariant("ConsumedNeverFreed", consumed_never_freed),
                StepInvariant("FingerprintFrozen", fingerprint_frozen)]

    def progress(self) -> Progress:
        """Termination: without faults every accepted send ends done, dead or aborted."""
        return Progress("Termination", self.done, FAULTS, UNFAIR)

    def describe(self, state: State) -> str:
        """The state in one line: rows, timers, channel, broker rows, crashes."""
        rows = " ".join(f"{cmid}={view}" for cmid, view in zip(self.ids, state.rows, strict=True) if view)
        channel = " ".join(f"{kind}({cmid},{what})" + (f"x{count}" if count > 1 else "")
                           for (kind, cmid, what), count in state.channel)
        broker = " ".join(
            f"{cmid}:dedupe={stored or '-'},msg={m},hist={h},deliv={d}"
            for cmid, stored, m, h, d in zip(self.ids, state.dedupe, state.messages, state.history, state.delivery,
                                             strict=True)
            if stored is not None or m or h or d
        )
        timers = ",".join(sorted(state.timers))
        return (f"rows[{rows or '-'}] timers[{timers or '-'}] channel[{channel or '-'}] broker[{broker or '-'}] "
                f"crashes={state.crashes}")


def build(
    core: Core,
    params: ModelParams | None = None,
    ipc_table: DecisionTable | None = None,
    outbox_table: DecisionTable | None = None,
    broker_table: DecisionTable | None = None,
) -> OutboxModel:
    """The model of ``core`` over the given tables (the real ones from spec/tables by default)."""
    return OutboxModel(core, params or ModelParams(), ipc_table or decision_table("ipc_lookup"),
                       outbox_table or decision_table("outbox"), broker_table or decision_table("broker_accept"))


def explore_model(model: OutboxModel) -> Result:
    """Explore ``model`` and check every property."""
    return explore([model.initial()], model.actions(), model.invariants(), model.step_invariants(),
                   model.progress(), max_states=model.params.max_states, errors=(TableError,))


def check(
    core: Core,
    params: ModelParams | None = None,
    ipc_table: DecisionTable | None = None,
    outbox_table: DecisionTable | None = None,
    broker_table: DecisionTable | None = None,
) -> Result:
    """Explore the model of ``core`` over the given tables (the real ones by default) and check every property."""
    return explore_model(build(core, params, ipc_table, outbox_table, broker_table))


# --- TLC -------------------------------------------------------------------------------------------------------
@dataclass
class TlcResult:
    """What TLC said: ``verdict`` is ``ok``, ``violation`` or ``error`` (it did not finish)."""

    verdict: str
    distinct_states: int | None = None
    violated: list[str] = field(default_factory=list)
    output: str = ""


_DISTINCT = re.compile(r"([\d,]+) distinct states? found")
_VIOLATED = (
    re.compile(r"^Error: Invariant (\w+) is violated", re.M),
    re.compile(r"^Error: Action property (\w+) is violated", re.M),
    re.compile(r"^Error: Temporal property (\w+) was violated", re.M),
)


def render_cfg(params: ModelParams) -> str:
    """The TLC configuration for ``params`` (``spec/model/Outbox.cfg`` is this for ``ModelParams()``)."""
    invariants = "\n".join(f"    {name}" for name in ("TypeOK", *STATE_INVARIANTS))
    properties = "\n".join(f"    {name}" for name in (*STEP_INVARIANTS, *LIVENESS))
    return (
        "\\* Generated by spec/tools/model.py (render_cfg); spec/model/Outbox.cfg is the default ModelParams.\n"
        "\\* The Python model explores the same bounds: regenerate this file rather than editing it.\n"
        "SPECIFICATION Spec\n"
        "CONSTANTS\n"
        f"    NumKeys = {params.keys}\n"
        f"    NumSpare = {params.spare}\n"
        f"    MaxAttempts = {params.max_attempts}\n"
        f"    MaxCrashes = {params.max_crashes}\n"
        f"INVARIANTS\n{invariants}\n"
        f"PROPERTIES\n{properties}\n"
    )


def tlc_command(jar: str | Path, config: str = "Outbox.cfg", module: str = "Outbox.tla", java: str = "java"
                ) -> list[str]:
    """The TLC command line, run inside a directory holding ``module`` and ``config``."""
    return [java, "-XX:+UseParallelGC", "-cp", str(jar), "tlc2.TLC", "-workers", "1", "-deadlock",
            "-config", config, module]


def parse_tlc_output(text: str) -> TlcResult:
    """Read TLC's verdict, its distinct state count and the names of violated properties from its output."""
    counts = _DISTINCT.findall(text)
    distinct = int(counts[-1].replace(",", "")) if counts else None
    violated: list[str] = []
    for pattern in _VIOLATED:
        violated += pattern.findall(text)
    if "Error: Temporal properties were violated" in text:
        violated.append("(temporal)")
    if "Error: Deadlock reached" in text:
        violated.append("(deadlock)")
    if violated:
        verdict = "violation"
    elif "Model checking completed. No error has been found." in text:
        verdict = "ok"
    else:
        verdict = "error"
    return TlcResult(verdict, distinct, violated, text)


def run_tlc(jar: str | Path, params: ModelParams, timeout: float | None = None, java: str = "java") -> TlcResult:
    """Run TLC on ``spec/model/Outbox.tla`` with the configuration for ``params`` in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="meshspec-tlc-") as work:
        shutil.copy(MODEL_DIR / "Outbox.tla", Path(work) / "Outbox.tla")
        (Path(work) / "Outbox.cfg").write_text(render_cfg(params), encoding="utf-8")
        try:
            done = subprocess.run(tlc_command(Path(jar).resolve(), java=java), cwd=work, capture_output=True,
                                  text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return TlcResult("error", output=str(exc))
        return parse_tlc_output(done.stdout + done.stderr)


# --- CLI -------------------------------------------------------------------------------------------------------
def format_report(result: Result, model: OutboxModel) -> list[str]:
    """The explorer's findings as printed lines: counts, the properties checked, each violation with its trace."""
    lines = [
        f"explored: {result.states} distinct states, {result.edges} edges, depth {result.depth}, "
        f"{result.seconds:.1f} s",
        f"checked:  invariants {', '.join(STATE_INVARIANTS)}; step properties {', '.join(STEP_INVARIANTS)}; "
        f"liveness {', '.join(LIVENESS)} (faults excluded: {', '.join(sorted(FAULTS))})",
    ]
    if result.ok:
        return [*lines, "no violations"]
    for violation in result.violations:
        lines.append(f"VIOLATION {violation.invariant} ({violation.kind}): {violation.message}")
        lines += format_trace(violation, model.describe)
    return lines


def compare_with_tlc(tlc: TlcResult, result: Result) -> tuple[int, list[str]]:
    """Compare TLC's verdict and distinct state count with ours: (exit status, lines to print).

    The status is 0 when the verdicts agree, 1 when they disagree and 2 when TLC did not finish. Differing state
    counts are reported but are not a failure by themselves.
    """
    ours = "ok" if result.ok else "violation"
    counted = "?" if tlc.distinct_states is None else str(tlc.distinct_states)
    violated = f", violated {', '.join(tlc.violated)}" if tlc.violated else ""
    lines = [f"TLC:      verdict {tlc.verdict}, {counted} distinct states{violated}",
             f"python:   verdict {ours}, {result.states} distinct states"]
    if tlc.verdict == "error":
        return 2, [*lines, "TLC did not finish; the end of its output:", *tlc.output.splitlines()[-20:]]
    if tlc.distinct_states is not None and tlc.distinct_states != result.states:
        lines.append(f"note: the distinct state counts differ (TLC {tlc.distinct_states}, python {result.states})")
    if tlc.verdict != ours:
        return 1, [*lines, "VERDICTS DISAGREE"]
    return 0, [*lines, "verdicts agree"]


def cli(argv: list[str], core: Core) -> int:
    """`meshd spec model-check [--quick|--full] [--keys N] [--max-attempts N] [--max-crashes N] [--tla2tools JAR]`."""
    if "--hooks" in argv:  # the hook-run model (spec.tools.hook_model) instead of the outbox's
        from spec.tools import hook_model

        return hook_model.cli([a for a in argv if a != "--hooks"], core)
    parser = argparse.ArgumentParser(prog="meshd spec model-check",
                                     description="Explore the outbox + broker dedupe model built from spec/tables.")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="one key, one spare id (under a second)")
    size.add_argument("--full", action="store_true", help="two keys, one spare id (a minute or two)")
    parser.add_argument("--keys", type=int, help="client_message_ids the clients use")
    parser.add_argument("--spare", type=int, help="fresh ids available to requeue")
    parser.add_argument("--max-attempts", type=int, help="attempts saturate here; faults only below it")
    parser.add_argument("--max-crashes", type=int)
    parser.add_argument("--max-states", type=int, help="give up (and fail) beyond this many states")
    parser.add_argument("--tla2tools", default=os.environ.get("TLA2TOOLS_JAR"),
                        help="also run TLC from this tla2tools.jar (default: $TLA2TOOLS_JAR)")
    parser.add_argument("--tlc-timeout", type=float, default=None, help="seconds")
    parser.add_argument("--hooks", action="store_true", help="the hook-run model instead (spec/tools/hook_model.py)")
    args = parser.parse_args(argv)
    params = ModelParams.quick() if args.quick else ModelParams.full() if args.full else ModelParams()
    overrides = {name: getattr(args, name) for name in ("keys", "spare", "max_attempts", "max_crashes", "max_states")
                 if getattr(args, name) is not None}
    params = replace(params, **overrides)
    if params.keys < 1 or params.spare < 0 or params.max_attempts < 1 or params.max_crashes < 0:
        parser.error("--keys and --max-attempts must be >= 1, --spare and --max-crashes >= 0")
    print(f"model:    keys={','.join(params.key_ids)} spare={','.join(params.spare_ids) or '-'} "
          f"variants={','.join(VARIANTS)} max_attempts={params.max_attempts} max_crashes={params.max_crashes}")
    model = build(core, params)
    print("tables:   " + ", ".join(f"{t.id} ({len(t.rows)} rows)"
                                   for t in (model.ipc_table, model.outbox_table, model.broker_table)))
    result = explore_model(model)
    print("\n".join(format_report(result, model)), flush=True)
    status = 0 if result.ok else 1
    if args.tla2tools:
        print(f"running TLC ({args.tla2tools}) ...", flush=True)
        compared, lines = compare_with_tlc(run_tlc(args.tla2tools, params, timeout=args.tlc_timeout), result)
        print("\n".join(lines))
        status = compared or status
    return status
