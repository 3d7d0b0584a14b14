"""The §4.5.1 lookup table through ``decide_send``: every row, and the properties the spec states about them."""

from __future__ import annotations

import pytest
from core_builders import make_row
from hypothesis import given
from hypothesis import strategies as st

from reference.core import decide_send
from reference.core.ipc import table

STATES = ["none", "pending", "inflight", "done", "dead", "aborted"]
STORED = b"\x01" * 32
OTHER = b"\x02" * 32


def _existing(state: str):
    if state == "none":
        return None
    return make_row(state, STORED, broker_message_id="01BROKER", history_id="h-1", last_error="rejected: 403")


@pytest.mark.parametrize("row", table().rows, ids=lambda r: r.id)
def test_table_row(row):
    """Each row of spec/tables/ipc_lookup.yaml is reached and answered exactly as it says."""
    state = next(iter(row.when["row_state"]))
    fingerprint = STORED if row.when["fingerprint"] in (None, frozenset({"match"})) else OTHER
    existing = _existing(state)
    decision = decide_send(existing, fingerprint, "cmid-1")
    then = row.then
    assert decision.table_row == row.id
    assert decision.http_status == then["http_status"]
    assert decision.insert is (then["mutation"] == "insert_pending")
    if then["http_status"] == 409:
        assert decision.body["error"] == "idempotency_key_reused"
        assert decision.body["conflict"] == then["conflict"]
    else:
        assert decision.body["status"] == then["status"]
        assert decision.body["duplicate"] is then["duplicate"]
    for member in then.get("include", ()):
        assert member in decision.body
    if "reason" in then.get("include", ()):
        assert decision.body["reason"] == "rejected: 403"
    if "broker_message_id" in then.get("include", ()):
        assert decision.body["broker_message_id"] == "01BROKER"


def test_dead_match_reason_is_empty_without_last_error():
    decision = decide_send(make_row("dead", STORED), STORED, "cmid-1")
    assert decision.body["reason"] == ""


@given(st.sampled_from(STATES), st.booleans(), st.binary(min_size=32, max_size=32))
def test_conflicts_never_insert(state, match, other):
    """A 409 never asks for a write; only the no-row case inserts."""
    existing = _existing(state)
    fingerprint = STORED if match or other == STORED else other
    decision = decide_send(existing, fingerprint, "cmid-1")
    assert decision.insert is (state == "none")
    if decision.http_status == 409:
        assert not decision.insert


@given(st.sampled_from(STATES[1:]), st.binary(min_size=32, max_size=32))
def test_every_conflict_carries_the_fingerprint_prefix(state, fingerprint):
    decision = decide_send(_existing(state), fingerprint, "cmid-1")
    if decision.is_conflict:
        assert decision.body["daemon_fingerprint_prefix"] == fingerprint[:8].hex()
        assert len(decision.body["daemon_fingerprint_prefix"]) == 16


def test_success_bodies_echo_the_id_and_fingerprint():
    for state in ("none", "pending", "inflight", "done"):
        decision = decide_send(_existing(state), STORED, "my-id")
        assert decision.body["client_message_id"] == "my-id"
        assert decision.body["request_fingerprint"] == STORED.hex()


def test_fingerprint_match_reported():
    assert decide_send(None, STORED, "x").fingerprint_match is None
    assert decide_send(_existing("pending"), STORED, "x").fingerprint_match is True
    assert decide_send(_existing("pending"), OTHER, "x").fingerprint_match is False


def test_decision_names_the_fingerprint_and_existing_row():
    decision = decide_send(_existing("dead"), OTHER, "cmid-1")
    assert decision.request_fingerprint == OTHER
    assert decision.outbox_id == "01ROW"
    assert decide_send(None, OTHER, "cmid-1").outbox_id is None
