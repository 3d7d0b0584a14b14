"""The outbox table through ``apply``: every (state, event) pair, and the lifecycle properties."""

from __future__ import annotations

from dataclasses import replace

import pytest
from core_builders import make_row
from hypothesis import given
from hypothesis import strategies as st

from reference.core import OutboxEvent, OutboxPolicy, TransitionError, accepted, apply, backoff_ms, is_expired, outbox
from reference.core.outbox import IO_EFFECTS, table

EVENTS = list(table().inputs["event"])
STATES = list(table().inputs["state"])


def _event(name: str) -> OutboxEvent:
    return OutboxEvent(name, now=5_000, broker_message_id="01B", history_id="h1", error=f"{name}!",
                       successor_id="01NEW", successor_client_message_id="cmid-2")


@pytest.mark.parametrize("combo", list(table().combinations()), ids=lambda c: f"{c['state']}-{c['event']}")
def test_every_table_row(combo, policy):
    """Each (state, event) pair does exactly what its row says."""
    row = table().lookup(**combo)
    then = row.then
    existing = None if combo["state"] == "none" else make_row(combo["state"])
    if then["outcome"] == "impossible" or combo["event"] == "accept":
        with pytest.raises(TransitionError) as caught:
            apply(existing, _event(combo["event"]), policy)
        assert combo["event"] in str(caught.value)
        assert caught.value.state == combo["state"]
        return
    result = apply(existing, _event(combo["event"]), policy)
    assert result.table_row == row.id
    assert result.outcome == then["outcome"]
    if then["outcome"] != "transition":
        assert result.after == existing
        assert result.error == then.get("error")
        return
    assert result.after.status == then["to"]
    assert set(result.effects) == {e for e in then["effects"] if e in IO_EFFECTS}
    if "set_broker_ids" in then["effects"]:
        assert (result.after.broker_message_id, result.after.history_id) == ("01B", "h1")
    if "increment_attempts" in then["effects"]:
        assert result.after.attempts == existing.attempts + 1
    if "set_last_error" in then["effects"]:
        assert result.after.last_error == f"{combo['event']}!"
    if "schedule_backoff" in then["effects"] or "schedule_min_backoff" in then["effects"]:
        assert result.after.next_attempt_at > 5_000


def test_accept_is_none_to_pending():
    row = make_row()
    result = accepted(row)
    assert result.table_row == "OB-NONE-ACCEPT"
    assert (result.before, result.after) == (None, row)


def test_requeue_builds_successor(policy):
    dead = make_row("dead", last_error="409")
    result = apply(dead, _event("requeue"), policy)
    assert result.after.status == "aborted"
    audit = (result.after.aborted_at, result.after.aborted_by, result.after.superseded_by)
    assert audit == (5_000, "operator", "01NEW")
    successor = result.successor
    assert (successor.id, successor.client_message_id, successor.status) == ("01NEW", "cmid-2", "pending")
    assert (successor.request_fingerprint, successor.payload) == (dead.request_fingerprint, dead.payload)
    with pytest.raises(TransitionError):
        apply(dead, OutboxEvent("requeue", now=1), policy)


@given(st.lists(st.tuples(st.sampled_from(EVENTS), st.floats(min_value=-1, max_value=1)), max_size=30))
def test_no_event_changes_fingerprint_or_payload(steps):
    policy = OutboxPolicy(max_age_hours=72)
    row = make_row()
    for name, jitter in steps:
        try:
            result = apply(row, replace(_event(name), jitter_unit=jitter), policy)
        except TransitionError:
            continue
        assert result.after.request_fingerprint == row.request_fingerprint
        assert result.after.payload == row.payload
        assert result.after.client_message_id == row.client_message_id
        row = result.after


@pytest.mark.parametrize("field", ["request_fingerprint", "payload"])
def test_an_effect_that_would_change_the_frozen_fields_is_refused(monkeypatch, policy, field):
    monkeypatch.setitem(outbox.DATA_EFFECTS, "increment_attempts",
                        lambda row, ev, pol: outbox.replace(row, **{field: b"changed"}))
    with pytest.raises(TransitionError) as caught:
        apply(make_row("pending"), _event("dispatch"), policy)
    assert str(caught.value) == ("outbox: event 'dispatch' cannot happen in state 'pending': effect increment_attempts "
                                 "would change the frozen request_fingerprint or payload")


def test_no_transition_returns_to_none():
    for row in table().rows:
        assert row.then.get("to") != "none"


def test_a_rows_statuses_are_the_tables_states_but_none():
    """The outbox_status enum of spec/schemas/common/defs.json (STATES) and spec/tables/outbox.yaml name the same
    states; the terminal ones are done, dead and aborted."""
    assert (outbox.STATES, sorted(outbox.TERMINAL)) == (
        tuple(s for s in table().inputs["state"] if s != "none"), ["aborted", "dead", "done"])


@pytest.mark.parametrize("state", ["done", "dead", "aborted"])
def test_terminal_states_only_leave_by_requeue(state, policy):
    for event in EVENTS:
        try:
            result = apply(make_row(state), _event(event), policy)
        except TransitionError:
            continue
        if result.outcome == "transition":
            assert (state, event, result.after.status) == ("dead", "requeue", "aborted")
        else:
            assert result.after.status == state


def test_backoff_is_exponential_capped_and_jittered():
    policy = OutboxPolicy(retry_base_ms=500, retry_max_ms=30_000, jitter=0.25)
    assert [backoff_ms(a, policy) for a in (0, 1, 2, 3, 4, 5, 6, 7, 100)] == [
        500, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]
    assert backoff_ms(2, policy, 1.0) == 1250
    assert backoff_ms(2, policy, -1.0) == 750
    assert backoff_ms(2, policy, 9.0) == 1250


def test_max_age(policy):
    row = make_row()
    assert row.max_age_at == 1_000 + 72 * 3_600_000
    assert not is_expired(row, row.max_age_at)
    assert is_expired(row, row.max_age_at + 1)
    assert not is_expired(replace(row, max_age_at=None), 10**15)
    dead = apply(row, OutboxEvent("max_age_exceeded", now=row.max_age_at + 1), policy).after
    assert (dead.status, dead.last_error) == ("dead", "max_age_exceeded")
    inflight = make_row("inflight")
    assert apply(inflight, OutboxEvent("max_age_exceeded", now=10**15), policy).outcome == "ignore"


def test_unknown_event_is_a_typed_error(policy):
    with pytest.raises(TransitionError) as caught:
        apply(make_row("pending"), OutboxEvent("teleport", now=1), policy)
    assert (caught.value.state, caught.value.event) == ("pending", "teleport")


def test_transitions_name_their_event(policy):
    assert apply(make_row("pending"), _event("dispatch"), policy).event == "dispatch"
    assert apply(make_row("done"), _event("ack_created"), policy).event == "ack_created"
    assert accepted(make_row()).event == "accept"
