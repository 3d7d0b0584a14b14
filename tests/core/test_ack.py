"""spec/tables/ack_events.yaml through ``ack_event``: every row, every status the ack schema allows, and the statuses
it does not (E-10, E-42)."""

from __future__ import annotations

import pytest

from reference.core.ack import ack_event, status_input
from reference.core.outbox import table as outbox_table
from spec import validator
from spec.decision import decision_table

TABLE = decision_table("ack_events")
#: every status an ack's schema allows (spec/schemas/broker/ack.json ``status``), from 100 to 699
SCHEMA_STATUSES = [s for s in range(100, 700) if not list(validator("broker/ack#/properties/status").iter_errors(s))]


def _statuses(value: str) -> list[int]:
    """The concrete statuses a ``status`` input value stands for."""
    return [s for s in SCHEMA_STATUSES if status_input(s) == value]


def _values(row, name: str) -> list[str]:
    """The input values a row covers, in the domain's order (so the test ids are the same in every process)."""
    return [v for v in TABLE.inputs[name] if row.when[name] is None or v in row.when[name]]


CASES = [(row, value, history) for row in TABLE.rows
         for value in _values(row, "status") for history in _values(row, "history_available")]


@pytest.mark.parametrize(("row", "value", "history"), CASES, ids=lambda v: getattr(v, "id", v))
def test_every_row(row, value, history):
    """OBX-BROKER-OUTCOMES, OBX-RETRY-LATER, WS-ACK-STATUS: every status the ack schema allows that a row's
    ``status`` value stands for, with the row's history_available, is the row's event."""
    frame = {"history_available": history == "true", "error": "e"}
    if value == "invalid":
        found = ack_event({**frame, "status": 201}, invalid="'duplicate' is a required property")
        assert (found.event, found.table_row) == (row.then["event"], row.id)
        return
    statuses = _statuses(value)
    assert statuses, f"no status the ack schema allows is {value}"
    for status in statuses:
        found = ack_event({**frame, "status": status})
        assert (found.event, found.table_row) == (row.then["event"], row.id), status


def test_the_table_and_the_ack_schema_agree():
    """A status spec/schemas/broker/ack.json allows is never ``invalid``, and every input value of ``status`` but
    ``invalid`` stands for at least one such status (the rows above cover each value)."""
    assert [s for s in SCHEMA_STATUSES if status_input(s) == "invalid"] == []
    assert {status_input(s) for s in SCHEMA_STATUSES} == set(TABLE.inputs["status"]) - {"invalid"}


def test_the_events_are_the_outbox_tables_ack_events():
    """Every event a row names is an input of spec/tables/outbox.yaml; every ack_* event there but the timer's is
    named by a row."""
    events = {row.then["event"] for row in TABLE.rows}
    outbox_events = set(outbox_table().inputs["event"])
    assert events <= outbox_events
    assert {e for e in outbox_events if e.startswith("ack_")} - events == {"ack_timeout"}


@pytest.mark.parametrize("status", [None, "201", 201.0, True, 0, 199, 302, 600, 1009, -409])
def test_a_status_the_table_does_not_name_is_the_invalid_row(status):
    """WS-ACK-STATUS (E-10): an ack without a valid status -- missing, not an integer, or outside every listed
    status and class -- is ``invalid``: ack_failed, the row returns to pending."""
    found = ack_event({"status": status, "history_available": True})
    assert (found.event, found.table_row, found.error) == (
        "ack_failed", "ACK-INVALID", "invalid ack: no valid status (E-10)")


def test_a_schema_invalid_ack_is_invalid_whatever_its_status():
    """E-10, E-41: the caller found the frame failed the ack schema: a 201 without its ids is not a delivery."""
    found = ack_event({"status": 201}, invalid="'broker_message_id' is a required property")
    assert (found.event, found.table_row, found.error) == (
        "ack_failed", "ACK-INVALID", "invalid ack: 'broker_message_id' is a required property (E-10)")


@pytest.mark.parametrize(("frame", "error"), [
    ({"status": 201, "history_available": False}, None),
    ({"status": 200, "history_available": False}, None),
    ({"status": 409, "error": "idempotency_key_reused", "conflict": "request_fingerprint_mismatch",
      "broker_fingerprint_prefix": "00112233aabbccdd"},
     "409 idempotency_key_reused: request_fingerprint_mismatch (broker fingerprint 00112233aabbccdd)"),
    ({"status": 429, "error": "rate_limited", "retry_after_ms": 50}, "429 rate_limited"),
    ({"status": 404, "error": "destination_not_found", "detail": "no topic #x"},
     "404 destination_not_found: no topic #x"),
    ({"status": 503}, "503 error"),
])
def test_the_error_a_row_records(frame, error):
    """The last_error text: none when the broker has the message, else the ack's status, error and details."""
    assert ack_event(frame).error == error
