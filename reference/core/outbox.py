"""The outbox state machine (spec/tables/outbox.yaml), sans IO.

Theory of operation: ``apply(row, event, policy)`` looks the (state, event) pair up in the table and returns a
``Transition``: the row as it must be persisted (``after``), an optional successor row (requeue), and the effects the
caller must perform (send the frame, arm the ack timer, log, count, emit an SSE event). Data effects -- the columns the
table says change -- are applied here, so every caller persists the same row for the same event. The fingerprint and
the payload are never touched after ``accept`` (§4.8: frozen for the row's lifecycle).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from spec import load_table, schema
from spec.decision import DecisionTable, TableError, decision_table

from .limits import limit
from .maxage import max_age_at

#: the statuses a row can have (spec/schemas/common/defs.json ``outbox_status``; the table's ``none`` is no row)
STATES: tuple[str, ...] = tuple(schema("common/defs")["$defs"]["outbox_status"]["enum"])
#: the states no event but requeue leaves (spec/tables/outbox.yaml ``terminal``)
TERMINAL = frozenset(name for name, state in load_table("outbox")["states"].items() if state["terminal"])
MAX_AGE_ERROR = "max_age_exceeded"
#: E-14's retry schedule and its defaults (spec/tables/timing.yaml ``backoff.outbox_retry``)
RETRY = load_table("timing")["backoff"]["outbox_retry"]


class TransitionError(TableError):
    """The (state, event) pair is impossible or unknown; the message names both."""

    def __init__(self, state: str, event: str, reason: str):
        super().__init__(f"outbox: event {event!r} cannot happen in state {state!r}: {reason}")
        self.state = state
        self.event = event


@dataclass(frozen=True)
class OutboxRow:
    """One outbox row (§4.5.2 plus E-20's ``history_id`` and ``max_age_at``). Times are unix milliseconds."""

    id: str
    client_message_id: str
    request_fingerprint: bytes
    payload: bytes
    enqueued_at: int
    next_attempt_at: int
    status: str = "pending"
    attempts: int = 0
    last_error: str | None = None
    delivered_at: int | None = None
    broker_message_id: str | None = None
    history_id: str | None = None
    aborted_at: int | None = None
    aborted_by: str | None = None
    superseded_by: str | None = None
    max_age_at: int | None = None


@dataclass(frozen=True)
class OutboxPolicy:
    """Retry timing (E-14). ``jitter`` is the fraction of the backoff that random jitter may add or remove."""

    retry_base_ms: int = RETRY["base_ms"]
    retry_max_ms: int = RETRY["max_ms"]
    jitter: float = RETRY["jitter"]
    max_age_hours: int | None = None


@dataclass(frozen=True)
class OutboxEvent:
    """An event for one row. Only the members the event's effects read need to be set.

    ``jitter_unit`` is a number in [-1, 1] the caller draws at random (the core has no random source).
    ``retry_after_ms`` is the wait a transient ack asked for (E-42), if it named one.
    """

    name: str
    now: int
    broker_message_id: str | None = None
    history_id: str | None = None
    error: str | None = None
    jitter_unit: float = 0.0
    retry_after_ms: int | None = None
    actor: str = "operator"
    successor_id: str | None = None
    successor_client_message_id: str | None = None


@dataclass(frozen=True)
class Transition:
    """What the table decided for one event."""

    table_row: str
    outcome: str  # transition | ignore | reject
    before: OutboxRow | None
    after: OutboxRow | None
    effects: tuple[str, ...] = ()
    successor: OutboxRow | None = None
    error: str | None = None
    reason: str | None = field(default=None, compare=False)
    event: str = ""


def backoff_ms(attempts: int, policy: OutboxPolicy, jitter_unit: float = 0.0) -> int:
    """``min(max, base * multiplier^(attempts-1))`` with ±``policy.jitter`` applied (E-14; the multiplier is
    timing.yaml's, 2)."""
    # req: OBX-BACKOFF -- no attempt limit: the exponent only caps the delay
    exponent = max(attempts - 1, 0)
    raw = policy.retry_base_ms * (RETRY["multiplier"] ** min(exponent, 32))
    capped = min(policy.retry_max_ms, raw)
    unit = max(-1.0, min(1.0, jitter_unit))
    return max(0, round(capped * (1 + policy.jitter * unit)))


def retry_after_delay_ms(attempts: int, policy: OutboxPolicy, jitter_unit: float = 0.0,
                         retry_after_ms: int | None = None) -> int:
    """The wait after a transient ack (E-42): the backoff, or the broker's retry_after_ms when that is longer (cut to
    retry_after_max_ms, spec/tables/limits.yaml)."""
    # req: OBX-RETRY-LATER
    asked = 0 if retry_after_ms is None else max(0, min(int(retry_after_ms), limit("retry_after_max_ms")))
    return max(backoff_ms(attempts, policy, jitter_unit), asked)


def new_row(
    outbox_id: str,
    client_message_id: str,
    fingerprint: bytes,
    payload: bytes,
    now: int,
    policy: OutboxPolicy,
) -> OutboxRow:
    """The row that ``accept`` inserts."""
    deadline = None if policy.max_age_hours is None else max_age_at(now, policy.max_age_hours)
    return OutboxRow(
        id=outbox_id,
        client_message_id=client_message_id,
        request_fingerprint=fingerprint,
        payload=payload,
        enqueued_at=now,
        next_attempt_at=now,
        max_age_at=deadline,
    )


def is_expired(row: OutboxRow, now: int) -> bool:
    """True when ``now`` is past the row's max age (E-14)."""
    # req: OBX-MAX-AGE-DEAD
    return row.max_age_at is not None and now > row.max_age_at


_ROW_FIELDS = frozenset(f.name for f in fields(OutboxRow))


def replace(row: OutboxRow, **changes: Any) -> OutboxRow:
    """``dataclasses.replace`` for rows, without re-running ``__init__`` (it checks nothing for ``OutboxRow``).

    ``dataclasses.replace`` walks every field on each call; the drain loop replaces rows several times per message.
    """
    unknown = changes.keys() - _ROW_FIELDS
    if unknown:
        raise TypeError(f"OutboxRow has no field {sorted(unknown)[0]!r}")
    copy = object.__new__(OutboxRow)
    copy.__dict__.update(row.__dict__)
    copy.__dict__.update(changes)
    return copy


# Data effects: how each named effect changes the row. Effects not listed here are IO the caller performs.
_DataEffect = Callable[[OutboxRow, OutboxEvent, OutboxPolicy], OutboxRow]
DATA_EFFECTS: dict[str, _DataEffect] = {
    "insert_row": lambda row, ev, pol: row,
    "freeze_fingerprint": lambda row, ev, pol: row,
    "set_max_age_at": lambda row, ev, pol: row,
    # req: OBX-DISPATCH
    "increment_attempts": lambda row, ev, pol: replace(row, attempts=row.attempts + 1),
    "set_broker_ids": lambda row, ev, pol: replace(
        row, broker_message_id=ev.broker_message_id, history_id=ev.history_id
    ),
    "set_delivered_at": lambda row, ev, pol: replace(row, delivered_at=ev.now),
    "set_last_error": lambda row, ev, pol: replace(row, last_error=ev.error or ev.name),
    # req: OBX-MAX-AGE-DEAD
    "set_last_error_max_age": lambda row, ev, pol: replace(row, last_error=MAX_AGE_ERROR),
    "schedule_backoff": lambda row, ev, pol: replace(  # a 5xx ack may ask for a longer wait too (E-42)
        row, next_attempt_at=ev.now + retry_after_delay_ms(row.attempts, pol, ev.jitter_unit, ev.retry_after_ms)
    ),
    "schedule_min_backoff": lambda row, ev, pol: replace(row, next_attempt_at=ev.now + pol.retry_base_ms),
    "schedule_retry_after": lambda row, ev, pol: replace(
        row, next_attempt_at=ev.now + retry_after_delay_ms(row.attempts, pol, ev.jitter_unit, ev.retry_after_ms)
    ),
    # req: REQUEUE-ATOMIC
    "set_aborted_audit": lambda row, ev, pol: replace(
        row, aborted_at=ev.now, aborted_by=ev.actor, superseded_by=ev.successor_id
    ),
    "insert_successor_pending": lambda row, ev, pol: row,
}
IO_EFFECTS = frozenset(
    {"arm_ack_timer", "send_frame", "log_info", "log_warn", "log_error", "count_history_pruned", "emit_outbox_dead"}
)
KNOWN_EFFECTS = frozenset(DATA_EFFECTS) | IO_EFFECTS

def table() -> DecisionTable:
    """The outbox table, loaded once from spec/tables/outbox.yaml."""
    return decision_table("outbox")


def apply(row: OutboxRow | None, event: OutboxEvent, policy: OutboxPolicy, decisions: DecisionTable | None = None
          ) -> Transition:
    """Apply ``event`` to ``row`` (``None`` before ``accept``) as the table says.

    ``accept`` is not applied here: the IPC path builds the row with ``new_row`` and records the
    ``OB-NONE-ACCEPT`` transition with ``accepted``.

    Raises:
        TransitionError: the pair is ``impossible`` in the table (or not in it at all).
    """
    decisions = decisions or table()
    state = "none" if row is None else row.status
    try:
        # req: OBX-BROKER-OUTCOMES, OBX-LATE-ACK, REC-ATTEMPTS-UNCHANGED -- the outbox table decides
        chosen = decisions.lookup(state=state, event=event.name)
    except TableError as exc:
        raise TransitionError(state, event.name, str(exc)) from exc
    then: dict[str, Any] = dict(chosen.then)
    outcome = then["outcome"]
    if outcome == "impossible":
        raise TransitionError(state, event.name, then.get("reason", "impossible"))
    # req: OBX-TERMINAL, REQUEUE-STATES-REFUSED -- the row stays as it was
    if outcome in ("ignore", "reject"):
        return Transition(chosen.id, outcome, row, row, error=then.get("error"), reason=then.get("reason"),
                          event=event.name)
    if row is None:
        raise TransitionError(state, event.name, "use new_row() and accepted() for accept")
    effects = tuple(then.get("effects", ()))
    after = replace(row, status=then["to"])
    for name in effects:
        step = DATA_EFFECTS.get(name)
        if step is not None:
            after = step(after, event, policy)
            # req: FP-FROZEN -- an effect that writes request_fingerprint or payload is refused, not applied
            if after.request_fingerprint is not row.request_fingerprint or after.payload is not row.payload:
                raise TransitionError(state, event.name, f"effect {name} would change the frozen request_fingerprint "
                                      "or payload")
    successor = None
    if "insert_successor_pending" in effects:
        if event.successor_id is None or event.successor_client_message_id is None:
            raise TransitionError(state, event.name, "requeue needs successor_id and successor_client_message_id")
        # req: REQUEUE-STATES, REQUEUE-ATOMIC, REQUEUE-SAME-FINGERPRINT
        successor = new_row(event.successor_id, event.successor_client_message_id, row.request_fingerprint,
                            row.payload, event.now, policy)
    io = tuple(name for name in effects if name in IO_EFFECTS)
    return Transition(chosen.id, "transition", row, after, io, successor, event=event.name)


def accepted(row: OutboxRow, decisions: DecisionTable | None = None) -> Transition:
    """The ``none -> pending`` transition for a row built by ``new_row``."""
    decisions = decisions or table()
    chosen = decisions.lookup(state="none", event="accept")
    effects = tuple(name for name in chosen.then.get("effects", ()) if name in IO_EFFECTS)
    return Transition(chosen.id, "transition", None, row, effects, event="accept")
