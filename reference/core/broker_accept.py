"""The broker's accept decision (spec/tables/broker_accept.yaml), one step at a time.

The broker's transaction learns its inputs in order: B1 checks, the fingerprint recomputation, whose dedupe row the
read-back returns, the fingerprint comparison, the B2 destination checks, the commit. After each step it calls
``settle(...)`` with what it knows; a ``Settled`` answer means the outcome no longer depends on the remaining steps
(the caller rolls back or commits as ``transaction`` says). ``None`` means carry on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spec.decision import DecisionTable, decision_table


def table() -> DecisionTable:
    """The accept table, loaded once from spec/tables/broker_accept.yaml."""
    return decision_table("broker_accept")


@dataclass(frozen=True)
class Settled:
    """A decided accept outcome."""

    table_row: str
    phase: str
    http_status: str  # "201", "200", "409", "4xx" or "5xx": the concrete 4xx comes from the failed check
    transaction: str  # none | rollback | commit
    effects: tuple[str, ...]
    conflict: str | None
    include: tuple[str, ...]
    metric: str | None

    @property
    def commits(self) -> bool:
        return self.transaction == "commit"


#: settle() answers for the spec's table, keyed by the known inputs as passed (a finite set: the inputs' domains)
_SETTLED: dict[tuple[tuple[str, str], ...], Settled | None] = {}


def settle(decisions: DecisionTable | None = None, **known: str) -> Settled | None:
    """The outcome if ``known`` inputs already decide it, else ``None``.

    With the spec's own table (``decisions`` None) the answer for a combination is memoised: the broker asks after
    every step of every accept. Only answers are memoised; inputs outside the domains raise every time.
    """
    if decisions is not None:
        return _settle(decisions, known)
    key = tuple(known.items())
    try:
        return _SETTLED[key]
    except KeyError:
        answer = _SETTLED[key] = _settle(table(), known)
        return answer


def _settle(decisions: DecisionTable, known: dict[str, str]) -> Settled | None:
    row = decisions.settled(**known)
    if row is None:
        return None
    then: dict[str, Any] = dict(row.then)
    return Settled(
        table_row=row.id,
        phase=then["phase"],
        http_status=str(then["http_status"]),
        transaction=then["transaction"],
        effects=tuple(then.get("effects", ())),
        conflict=then.get("conflict"),
        include=tuple(then.get("include", ())),
        metric=then.get("metric"),
    )


def check_status(phase: str, check: str) -> tuple[int, str]:
    """The (HTTP status, error code) of a failed B1 or B2 check, from the table."""
    key = {"B1": "b1_checks", "B2": "b2_checks"}[phase]
    for entry in table().document[key]:
        if entry["check"] == check:
            return int(entry["http_status"]), entry["error"]
    raise KeyError(f"broker_accept: no {phase} check named {check!r}")
