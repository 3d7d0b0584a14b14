"""The hook-run core: every (state, event) pair of spec/tables/hook_runs.yaml, the claim cap, and the reply id."""

from __future__ import annotations

import contextlib
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference.core import hooks, is_client_message_id
from spec import load_table

DOCUMENT = load_table("hook_runs")
STATES = DOCUMENT["inputs"]["state"]
EVENTS = DOCUMENT["inputs"]["event"]


def test_the_table_is_total_and_deterministic():
    assert hooks.table().problems() == []


@pytest.mark.parametrize(("state", "event"), list(itertools.product(STATES, EVENTS)))
def test_every_pair_does_what_its_row_says(state, event):
    row = hooks.table().lookup(state=state, event=event)
    run = hooks.HookRun("m1", "on-message", state, claims=1)
    if row.then["outcome"] == "impossible":
        with pytest.raises(hooks.HookRunError) as raised:
            hooks.apply(run, event, max_claims=2) if event != "claim_lost_final" else \
                hooks.apply(run, event, max_claims=1)
        assert (raised.value.state, raised.value.event) == (state, event)
        assert repr(state) in str(raised.value) and repr(event) in str(raised.value)
        return
    step = hooks.apply(run, event, max_claims=1 if event == "claim_lost_final" else 2)
    assert step.row == row.id
    if row.then["outcome"] == "ignore":
        assert (step.run, step.effects) == (run, ())
    else:
        assert step.run.state == row.then["to"] and step.effects == tuple(row.then["effects"])
        assert step.run.claims == run.claims + (event == "claim")


def test_a_finished_run_never_changes():
    for state, event in itertools.product(sorted(hooks.TERMINAL), EVENTS):
        run = hooks.HookRun("m1", "h", state, 1)
        with contextlib.suppress(hooks.HookRunError):
            assert hooks.apply(run, event, max_claims=2).run == run


def test_every_finish_stores_the_result_and_nothing_else_does():
    for row in hooks.table().rows:
        then = row.then
        if then["outcome"] != "transition":
            continue
        assert ("store_result" in then["effects"]) == (then["to"] in hooks.TERMINAL), row.id
        assert set(then["effects"]) <= hooks.EFFECTS, row.id
    named = {e for row in hooks.table().rows for e in row.then.get("effects", ())}
    assert named == hooks.EFFECTS


@pytest.mark.parametrize(("claims", "max_claims", "to", "row"), [
    (1, 2, "pending", "HR-CLAIMED-CLAIM-LOST"), (1, 1, "failed", "HR-CLAIMED-CLAIM-LOST-FINAL"),
    (2, 2, "failed", "HR-CLAIMED-CLAIM-LOST-FINAL"), (5, 3, "failed", "HR-CLAIMED-CLAIM-LOST-FINAL"),
    (2, 3, "pending", "HR-CLAIMED-CLAIM-LOST")])
def test_a_lost_claim_runs_again_until_the_cap(claims, max_claims, to, row):
    step = hooks.apply(hooks.HookRun("m1", "h", "claimed", claims), "claim_lost", max_claims)
    assert (step.run.state, step.row) == (to, row)
    assert "kill_group" in step.effects and step.run.claims == claims


def test_a_whole_life_with_one_crash():
    step = hooks.enqueue("m1", "on-message")
    assert (step.row, step.run.state, step.effects) == ("HR-NONE-ENQUEUE", "pending", ("insert_run",))
    step = hooks.apply(step.run, "claim", 2)
    assert step.run.claims == 1 and "spawn" in step.effects and "grant_capability" in step.effects
    step = hooks.apply(hooks.apply(step.run, "claim_lost", 2).run, "claim", 2)
    assert (step.run.state, step.run.claims) == ("claimed", 2)
    step = hooks.apply(step.run, "exit_ok", 2)
    assert step.run.state == "done" and "store_result" in step.effects


@pytest.mark.parametrize("bad", [0, -1])
def test_max_claims_below_one_is_refused(bad):
    with pytest.raises(ValueError, match="max_claims"):
        hooks.apply(hooks.HookRun("m", "h", "claimed", 1), "claim_lost", bad)


def test_an_unknown_event_is_the_tables_error():
    from spec.decision import UnknownInput

    with pytest.raises(UnknownInput):
        hooks.apply(hooks.HookRun("m", "h", "pending"), "finish", 2)


# --- the reply id (E-48) ---------------------------------------------------------------------------------------
NAMES = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1, max_size=40)


@given(NAMES, NAMES)
def test_a_reply_id_is_a_valid_client_message_id_and_stable(message, hook):
    reply = hooks.reply_client_message_id(message, hook)
    assert is_client_message_id(reply) and reply == hooks.reply_client_message_id(message, hook)
    assert reply.startswith(hooks.REPLY_ID_PREFIX) and len(reply) == len(hooks.REPLY_ID_PREFIX) + 40


@given(NAMES, NAMES, NAMES, NAMES)
def test_distinct_pairs_get_distinct_reply_ids(m1, h1, m2, h2):
    if (m1, h1) != (m2, h2):
        assert hooks.reply_client_message_id(m1, h1) != hooks.reply_client_message_id(m2, h2)


def test_the_separator_keeps_pairs_apart():
    assert hooks.reply_client_message_id("ab", "c") != hooks.reply_client_message_id("a", "bc")
    assert hooks.reply_client_message_id("m1", "on-message") == "hook.e974da054f4972380025d32bccf4a685d84e792a"


@pytest.mark.parametrize(("message", "hook"), [("", "h"), ("m", ""), ("m\x00", "h"), ("m", "h\x00")])
def test_a_reply_id_needs_both_names(message, hook):
    with pytest.raises(ValueError):
        hooks.reply_client_message_id(message, hook)
