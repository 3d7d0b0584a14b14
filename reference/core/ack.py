"""Which outbox event a broker ``ack`` frame is (E-10, E-42): spec/tables/ack_events.yaml decides.

Rules of this file: the ack's ``status`` is looked up as itself when the table's ``status`` domain lists it, else as
its class (``4xx``, ``5xx``) when the domain lists that, else as ``invalid`` -- so a status the table does not name
(a 302, a 600, a string) is the table's ``invalid`` row, and an ack the caller found schema-invalid is ``invalid``
whatever its status. Nothing else picks the event. The ``last_error`` text a dead or retried row records is composed
here from the ack's own members; an event that takes an inflight row to ``done`` (spec/tables/outbox.yaml) records
none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spec.decision import decision_table

__all__ = ["AckEvent", "ack_event", "status_input"]

TABLE = "ack_events"
INVALID = "invalid"


@dataclass(frozen=True)
class AckEvent:
    """The outbox event of one ack, the ``last_error`` it records (None for 201 and 200) and the table row."""

    event: str
    error: str | None
    table_row: str


def status_input(status: Any) -> str:
    """The table's ``status`` input for an ack status: the status, its class, or ``invalid``."""
    domain = decision_table(TABLE).inputs["status"]
    if not isinstance(status, int) or isinstance(status, bool):
        return INVALID
    for value in (str(status), f"{status // 100}xx"):
        if value in domain:
            return value
    return INVALID


def ack_event(frame: Mapping[str, Any], invalid: str | None = None) -> AckEvent:
    """The outbox event for an ack frame; ``invalid`` says why it failed spec/schemas/broker/ack.json, if it did."""
    status = INVALID if invalid is not None else status_input(frame.get("status"))
    history = "false" if frame.get("history_available") is False else "true"
    # req: OBX-BROKER-OUTCOMES, OBX-RETRY-LATER, WS-ACK-STATUS -- the table's row, nothing else, picks the event
    row = decision_table(TABLE).lookup(status=status, history_available=history)
    return AckEvent(row.then["event"], _error(row.then["event"], status, frame, invalid), row.id)


def _error(event: str, status: str, frame: Mapping[str, Any], invalid: str | None) -> str | None:
    if status == INVALID:
        return f"invalid ack: {invalid or 'no valid status'} (E-10)"
    if decision_table("outbox").lookup(state="inflight", event=event).then.get("to") == "done":
        return None  # the broker has the message: nothing went wrong
    text = f"{frame['status']} {frame.get('error', 'error')}"
    for member in ("conflict", "detail"):
        if frame.get(member):
            text += f": {frame[member]}"
    if frame.get("broker_fingerprint_prefix"):
        text += f" (broker fingerprint {frame['broker_fingerprint_prefix']})"
    return text
