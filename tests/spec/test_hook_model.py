"""The hook-run model: the real tables pass; each broken table, and a core that sends a re-run's reply as a new send,
fails the property it breaks with a shortest counterexample."""

from __future__ import annotations

import copy
import types

import pytest

from reference import core
from spec import load_table
from spec.decision import DecisionTable
from spec.tools import explore as ex
from spec.tools import hook_model as hm

QUICK = hm.HookParams.quick()


def broken(row_id: str, **then) -> DecisionTable:
    """The real hook_runs table with one row's ``then`` changed (a deep copy of the YAML document)."""
    document = copy.deepcopy(load_table("hook_runs"))
    rows = [row for row in document["rows"] if row["id"] == row_id]
    assert len(rows) == 1, row_id
    rows[0]["then"] = {**rows[0]["then"], **then}
    decisions = DecisionTable(document)
    assert decisions.problems() == []
    return decisions


def only(result: ex.Result, name: str) -> ex.Violation:
    found = [v for v in result.violations if v.invariant == name]
    assert found, f"expected {name}, got {[(v.invariant, v.message) for v in result.violations]}"
    return found[0]


def labels(violation: ex.Violation) -> list[str]:
    return [str(label) for label, _ in violation.trace]


@pytest.mark.parametrize("params", [hm.HookParams(), QUICK, hm.HookParams(messages=1, hooks=1, max_claims=3,
                                                                          max_crashes=3)],
                         ids=["default", "quick", "three-claims"])
def test_real_tables_have_no_violations(params):
    result = hm.explore_model(hm.build(core, params))
    assert result.violations == [] and result.ok and result.complete
    assert result.states > 100 and result.edges > result.states


def test_every_action_happens_in_the_real_model():
    """The model is not vacuous: every action, and both a 409 and a matching reply of a re-run, are reachable."""
    model = hm.build(core, hm.HookParams(messages=1, hooks=1))
    seen: set[str] = set()
    frontier, visited = [model.initial()], {model.initial()}
    while frontier:
        state = frontier.pop()
        for action in model.actions():
            for step, after in action.successors(state):
                seen.add(step.action if step.action != "Reply" else f"Reply {step.http_status}")
                if after not in visited:
                    visited.add(after)
                    frontier.append(after)
    assert seen == {"Arrive", "Claim", "Reply 202", "Reply 409", "ExitOk", "ExitError", "Timeout", "Crash"}
    finals = {run.state for state in visited for run in state.runs if run is not None}
    assert finals == {"pending", "claimed", "done", "failed", "timed_out"}


def test_marking_done_without_storing_the_result_breaks_marked_after_stored():
    table = broken("HR-CLAIMED-EXIT-OK", effects=["clear_claim", "revoke_capability"])
    violation = only(hm.explore_model(hm.build(core, QUICK, hook_table=table)), "MarkedAfterStored")
    assert violation.kind == "state"
    assert labels(violation) == ["Init", "Arrive(m1) [HR-NONE-ENQUEUE, HR-NONE-ENQUEUE]",
                                 "Claim(m1,h1) [HR-PENDING-CLAIM]", "ExitOk(m1,h1) [HR-CLAIMED-EXIT-OK]"]


def test_a_nonzero_exit_retried_forever_breaks_every_match_runs():
    table = broken("HR-CLAIMED-EXIT-ERROR", to="pending", effects=["clear_claim", "revoke_capability"])
    violation = only(hm.explore_model(hm.build(core, QUICK, hook_table=table)), "EveryMatchRuns")
    assert violation.kind == "cycle"
    assert any("ExitError" in label for label in labels(violation)[violation.loop_start:])


def test_a_lost_claim_that_is_dropped_breaks_every_match_runs_or_ran_before_finished():
    """A crash that finishes the run unstored (a message whose hook never ran to the end, silently)."""
    table = broken("HR-CLAIMED-CLAIM-LOST", to="done", effects=["clear_claim"])
    result = hm.explore_model(hm.build(core, QUICK, hook_table=table))
    violation = only(result, "MarkedAfterStored")
    assert labels(violation)[-1].startswith("Crash(#1) [HR-CLAIMED-CLAIM-LOST")


def test_an_enqueue_the_table_refuses_is_an_error_of_arrive():
    table = broken("HR-NONE-ENQUEUE", outcome="impossible", reason="broken")
    result = hm.explore_model(hm.build(core, QUICK, hook_table=table))
    violation = only(result, "ArriveError")
    assert violation.kind == "error" and "impossible" in violation.message


def test_a_reply_that_bypasses_the_lookup_breaks_reply_at_most_once():
    """A daemon that posts a re-run's reply as a new send (no §4.5.1 lookup under the derived id) sends it twice."""
    def decide_send(existing, fingerprint, client_message_id, decisions=None):
        return core.decide_send(None, fingerprint, client_message_id, decisions)

    naive = types.SimpleNamespace(**{name: getattr(core, name) for name in dir(core) if not name.startswith("__")})
    naive.decide_send = decide_send
    violation = only(hm.explore_model(hm.build(naive, hm.HookParams(messages=1, hooks=1))), "ReplyAtMostOnce")
    assert [label.split(" ")[0] for label in labels(violation)] == [
        "Init", "Arrive(m1)", "Claim(m1,h1)", "Reply(m1,h1,A)", "Crash(#1)", "Claim(m1,h1)", "Reply(m1,h1,A)"]


def test_a_reply_id_minted_per_run_breaks_reply_at_most_once():
    """The same, for a daemon that keys a reply by something of the run rather than (message, hook)."""
    minted = iter(range(10**6))

    naive = types.SimpleNamespace(**{name: getattr(core, name) for name in dir(core) if not name.startswith("__")})
    naive.reply_client_message_id = lambda message, hook: f"{message}.{hook}.{next(minted) % 2}"
    violation = only(hm.explore_model(hm.build(naive, hm.HookParams(messages=1, hooks=1))), "ReplyAtMostOnce")
    assert violation.kind == "state"


def test_the_cli_runs_the_hook_model(capsys):
    from spec.tools import model

    assert model.cli(["--hooks", "--quick"], core) == 0
    out = capsys.readouterr().out
    assert "hook_runs (15 rows)" in out and "no violations" in out
    assert "EveryMatchRuns" in out and "ReplyAtMostOnce" in out
