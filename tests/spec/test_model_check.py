"""The model checker: the real tables pass, each deliberately broken table fails the property it breaks with a
shortest counterexample, the explorer finds shortest traces, cycles and dead ends, and the TLC glue reads TLC.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator

import pytest

from reference import core
from spec import load_table
from spec.decision import DecisionTable
from spec.tools import explore as ex
from spec.tools import model as mc

QUICK = mc.ModelParams.quick()


def broken(table: str, row_id: str, **then) -> DecisionTable:
    """The real table with one row's ``then`` changed (the YAML document is deep-copied, never mutated)."""
    document = copy.deepcopy(load_table(table))
    rows = [row for row in document["rows"] if row["id"] == row_id]
    assert len(rows) == 1, row_id
    rows[0]["then"] = {**rows[0]["then"], **then}
    decisions = DecisionTable(document)
    assert decisions.problems() == [], "the broken table is still total and deterministic; the model must catch it"
    return decisions


def labels(violation: ex.Violation) -> list[str]:
    return [label for label, _ in violation.trace]


def only(result: ex.Result, name: str) -> ex.Violation:
    found = [v for v in result.violations if v.invariant == name]
    assert found, f"expected {name}, got {[(v.invariant, v.message) for v in result.violations]}"
    return found[0]


# --- the real tables ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("params", [mc.ModelParams(), mc.ModelParams(keys=2, spare=0)], ids=["default", "two-keys"])
def test_real_tables_have_no_violations(params):
    result = mc.check(core, params)
    assert result.violations == []
    assert result.ok and result.complete
    assert result.states > 1000
    assert result.edges > result.states


def test_the_real_tables_are_the_default():
    assert mc.check(core, QUICK).states == mc.check(core, QUICK, core.ipc.table(), core.outbox.table(),
                                                     core.broker_accept.table()).states


# --- (a) the IPC lookup table --------------------------------------------------------------------------------------
def test_pending_mismatch_accepted_breaks_fingerprint_frozen():
    ipc_table = broken("ipc_lookup", "IPC-PENDING-MISMATCH", http_status=202, status="queued", duplicate=False,
                       mutation="insert_pending")
    result = mc.check(core, QUICK, ipc_table=ipc_table)
    violation = only(result, "FingerprintFrozen")
    assert violation.kind == "step"
    assert labels(violation) == ["Init", "Post(k1,A) -> 202 queued [IPC-NEW]",
                                 "Post(k1,B) -> 202 queued [IPC-PENDING-MISMATCH]"]
    assert "ConflictNeverMutates" not in result.names()  # it answered 202, not 409


def test_done_mismatch_that_overwrites_breaks_conflict_never_mutates():
    ipc_table = broken("ipc_lookup", "IPC-DONE-MISMATCH", mutation="insert_pending")
    result = mc.check(core, QUICK, ipc_table=ipc_table)
    assert {"ConflictNeverMutates", "FingerprintFrozen"} <= result.names()
    violation = only(result, "ConflictNeverMutates")
    assert labels(violation)[-1] == "Post(k1,B) -> 409 outbox_done_fingerprint_mismatch [IPC-DONE-MISMATCH]"
    before, after = violation.trace[-2][1], violation.trace[-1][1]
    assert before.rows[0].status == "done" and after.rows[0].status == "pending"


# --- (b), (c) the broker accept table ------------------------------------------------------------------------------
def test_duplicate_that_commits_breaks_at_most_one_broker_message():
    broker_table = broken("broker_accept", "BRK-DUP-MATCH", http_status=201, transaction="commit",
                          effects=["dedupe", "message", "history", "delivery"])
    result = mc.check(core, QUICK, broker_table=broker_table)
    violation = only(result, "AtMostOneBrokerMessage")
    assert violation.kind == "state"
    assert "[BRK-DUP-MATCH]" in labels(violation)[-1]
    assert violation.trace[-1][1].messages[0] == 2
    # the shortest way to a second frame: one fault (an early ack timeout or a lost ack) and a retry
    assert len(violation.trace) <= 8


def test_accept_without_history_breaks_all_or_nothing():
    broker_table = broken("broker_accept", "BRK-ACCEPT", effects=["dedupe", "message", "delivery"])
    result = mc.check(core, QUICK, broker_table=broker_table)
    violation = only(result, "AllOrNothing")
    assert labels(violation) == [
        "Init",
        "Post(k1,A) -> 202 queued [IPC-NEW]",
        "Dispatch(k1) [OB-PENDING-DISPATCH]",
        "Broker(k1,A) -> 201 commit; b1=ok drift=same claim=ours fingerprint=match b2=ok commit=ok [BRK-ACCEPT]",
    ]
    last = violation.trace[-1][1]
    assert (last.dedupe[0], last.messages[0], last.history[0], last.delivery[0]) == ("A", 1, 0, 1)


# --- (d), (e) the outbox table: progress -------------------------------------------------------------------------
def test_inflight_never_recovered_breaks_termination():
    outbox_table = broken("outbox", "OB-INFLIGHT-RECOVER", outcome="ignore")
    result = mc.check(core, QUICK, outbox_table=outbox_table)
    assert result.complete  # the safety properties hold; progress is what fails
    violation = only(result, "Termination")
    assert violation.kind == "dead-end"
    assert labels(violation)[-1] == "CrashRestart() [OB-INFLIGHT-RECOVER ignore]"
    stuck = violation.trace[-1][1]
    assert stuck.rows[0].status == "inflight" and not stuck.timers and not stuck.channel


def test_inflight_conflict_back_to_pending_breaks_termination():
    outbox_table = broken("outbox", "OB-INFLIGHT-CONFLICT", to="pending",
                          effects=["set_last_error", "schedule_backoff"])
    result = mc.check(core, QUICK, outbox_table=outbox_table)
    violation = only(result, "Termination")
    assert violation.kind == "cycle"
    assert violation.loop_start is not None
    loop = violation.trace[violation.loop_start:]
    assert loop[0][1] == loop[-1][1]  # a lasso: the last state is the loop's first
    assert any("[OB-INFLIGHT-CONFLICT]" in label for label, _ in loop[1:])
    assert not any(label.split("(")[0] in mc.FAULTS for label, _ in loop[1:])  # no fault keeps it going


def test_table_with_a_hole_is_an_error_with_a_trace():
    document = copy.deepcopy(load_table("outbox"))
    document["rows"] = [row for row in document["rows"] if row["id"] != "OB-PENDING-DISPATCH"]
    result = mc.check(core, QUICK, outbox_table=DecisionTable(document))
    violation = only(result, "DispatchError")
    assert "'dispatch'" in violation.message and "'pending'" in violation.message
    assert labels(violation)[-1] == "Post(k1,A) -> 202 queued [IPC-NEW]"


def test_report_prints_numbered_trace():
    broker_table = broken("broker_accept", "BRK-ACCEPT", effects=["dedupe", "message", "delivery"])
    model = mc.build(core, QUICK, broker_table=broker_table)
    lines = mc.format_report(mc.explore_model(model), model)
    text = "\n".join(lines)
    assert "VIOLATION AllOrNothing (state)" in text
    assert re.search(r"^\s+3\. Broker\(k1,A\) -> 201 commit.*\[BRK-ACCEPT\]$", text, re.M)
    assert "k1:dedupe=A,msg=1,hist=0,deliv=1" in text


def test_cli_prints_counts_and_no_violations(capsys):
    assert mc.cli(["--quick", "--max-crashes", "0"], core) == 0
    out = capsys.readouterr().out
    assert "keys=k1 spare=s1" in out and "max_crashes=0" in out
    assert re.search(r"explored: \d+ distinct states, \d+ edges", out)
    assert out.rstrip().endswith("no violations")


def test_state_bound_is_a_failure():
    result = mc.check(core, mc.ModelParams(keys=1, spare=1, max_states=100))
    assert not result.ok and not result.complete
    assert result.names() == {ex.STATE_BOUND}


# --- the explorer on a hand-written model ------------------------------------------------------------------------
def counter(limit: int = 6, back: bool = False) -> list[ex.Action]:
    """A counter that steps +1 or jumps +3 up to ``limit`` (and, with ``back``, steps -2 from 5 on: a bug)."""

    def inc(x: int) -> Iterator[tuple[str, int]]:
        if x < limit:
            yield f"inc {x}->{x + 1}", x + 1

    def jump(x: int) -> Iterator[tuple[str, int]]:
        if x + 3 <= limit:
            yield f"jump {x}->{x + 3}", x + 3

    def down(x: int) -> Iterator[tuple[str, int]]:
        if back and x >= 5:
            yield f"down {x}->{x - 2}", x - 2

    return [ex.Action("inc", inc), ex.Action("jump", jump), ex.Action("down", down)]


def test_explorer_finds_the_shortest_trace():
    result = ex.explore([0], counter(), [ex.Invariant("NotFour", lambda x: x != 4)])
    violation = only(result, "NotFour")
    assert violation.trace == [("Init", 0), ("inc 0->1", 1), ("jump 1->4", 4)]
    assert not result.complete


def test_explorer_counts_states_and_edges():
    result = ex.explore([0], counter(limit=6))
    assert result.ok and result.states == 7
    assert result.edges == 6 + 4  # six incs, four jumps
    assert result.depth == 3  # 5 is three steps away


def test_explorer_checks_every_edge():
    monotone = ex.StepInvariant("Monotone", lambda x, action, label, y: y >= x)
    result = ex.explore([0], counter(back=True), step_invariants=[monotone])
    violation = only(result, "Monotone")
    assert violation.kind == "step"
    assert violation.trace == [("Init", 0), ("jump 0->3", 3), ("jump 3->6", 6), ("down 6->4", 4)]


def test_explorer_keeps_going_when_asked():
    invariants = [ex.Invariant("NotFour", lambda x: x != 4), ex.Invariant("NotSix", lambda x: x != 6)]
    assert only(ex.explore([0], counter(), invariants, stop_at_first=False), "NotSix").trace[-1] == ("jump 3->6", 6)
    assert ex.explore([0], counter(), invariants).names() == {"NotFour"}


def test_progress_reports_a_fault_free_cycle_as_a_lasso():
    progress = ex.Progress("Finishes", lambda x: x == 6)
    result = ex.explore([0], counter(back=True), progress=progress)
    violation = only(result, "Finishes")
    assert violation.kind == "cycle"
    # the unfinished state on a cycle that BFS reaches first is 3; the shortest loop back is 3 -> 4 -> 5 -> 3
    assert violation.trace == [("Init", 0), ("jump 0->3", 3), ("inc 3->4", 4), ("inc 4->5", 5), ("down 5->3", 3)]
    assert violation.loop_start == 1
    # the same cycle through a fault action is allowed: faults stop eventually
    assert ex.explore([0], counter(back=True), progress=ex.Progress("Finishes", lambda x: x == 6,
                                                                      frozenset({"down"}))).ok


def test_progress_reports_a_dead_end():
    def stop_at_four(x: int) -> Iterator[tuple[str, int]]:
        if x < 4:
            yield "inc", x + 1

    result = ex.explore([0], [ex.Action("inc", stop_at_four)], progress=ex.Progress("Finishes", lambda x: x == 6))
    violation = only(result, "Finishes")
    assert violation.kind == "dead-end"
    assert [state for _, state in violation.trace] == [0, 1, 2, 3, 4]


def test_progress_needs_a_fair_step():
    def inc(x: int) -> Iterator[tuple[str, int]]:
        if x < 6 and x != 2:
            yield "inc", x + 1

    def nudge(x: int) -> Iterator[tuple[str, int]]:
        if x == 2:
            yield "nudge", 3

    actions = [ex.Action("inc", inc), ex.Action("nudge", nudge)]
    assert ex.explore([0], actions, progress=ex.Progress("Finishes", lambda x: x == 6)).ok
    result = ex.explore([0], actions, progress=ex.Progress("Finishes", lambda x: x == 6, unfair=frozenset({"nudge"})))
    violation = only(result, "Finishes")
    assert violation.kind == "dead-end" and violation.trace[-1] == ("inc", 2)


def test_progress_ignores_stuttering():
    def stay(x: int) -> Iterator[tuple[str, int]]:
        yield "stay", x

    actions = [*counter(), ex.Action("stay", stay)]
    assert ex.explore([0], actions, progress=ex.Progress("Finishes", lambda x: x == 6)).ok


def test_explorer_bound_and_errors():
    def forever(x: int) -> Iterator[tuple[str, int]]:
        yield "inc", x + 1

    bounded = ex.explore([0], [ex.Action("inc", forever)], max_states=50)
    assert bounded.names() == {ex.STATE_BOUND} and bounded.states == 51 and not bounded.ok

    def fails(x: int) -> Iterator[tuple[str, int]]:
        if x == 2:
            raise LookupError("no row for x=2")
        yield "inc", x + 1

    result = ex.explore([0], [ex.Action("inc", fails)], errors=(LookupError,))
    violation = only(result, "incError")
    assert violation.kind == "error" and "no row for x=2" in violation.message
    assert violation.trace[-1] == ("inc", 2)
    with pytest.raises(LookupError):
        ex.explore([0], [ex.Action("inc", fails)])


# --- TLC ---------------------------------------------------------------------------------------------------------
TLC_OK = """\
TLC2 Version 2.18 of 20 March 2023 (rev: 3ea3222)
Running breadth-first search Model-Checking with fp 86 and seed -4587812232871447312 with 1 worker on 2 cores with \
1753MB heap and 64MB offheap memory [pid: 4242] (Linux 6.1.0 amd64, Eclipse Adoptium 17.0.9 x86_64, MSBDiskFPSet, \
DiskStateQueue).
Parsing file /tmp/meshspec-tlc-x1/Outbox.tla
Parsing file /tmp/tlc-13/Naturals.tla
Parsing file /tmp/tlc-13/Bags.tla
Parsing file /tmp/tlc-13/TLC.tla
Semantic processing of module Naturals
Semantic processing of module Bags
Semantic processing of module TLC
Semantic processing of module Outbox
Starting... (2026-11-22 10:00:00)
Implied-temporal checking--satisfiability problem has 4 branches.
Computing initial states...
Finished computing initial states: 1 distinct state generated at 2026-11-22 10:00:01.
Progress(12) at 2026-11-22 10:00:04: 101,204 states generated (101,204 s/min), 12,810 distinct states found, \
5,114 states left on queue.
Checking 4 branches of temporal properties for the current state space with 51240 total distinct states at \
(2026-11-22 10:00:04)
Finished checking temporal properties in 01s at 2026-11-22 10:00:05
Model checking completed. No error has been found.
  Estimates of the probability that TLC did not check all reachable states
  because two distinct states had the same fingerprint:
  calculated (optimistic):  val = 2.6E-10
243367 states generated, 30912 distinct states found, 0 states left on queue.
The depth of the complete state graph search is 25.
The average outdegree of the complete state graph is 1 (minimum is 0, the maximum 9 and the 95th percentile is 3).
Finished in 06s at (2026-11-22 10:00:06)
"""

TLC_INVARIANT = """\
Starting... (2026-11-22 10:00:00)
Computing initial states...
Finished computing initial states: 1 distinct state generated at 2026-11-22 10:00:00.
Error: Invariant AtMostOneBrokerMessage is violated.
Error: The behavior up to this point is:
State 1: <Initial predicate>
/\\ messages = [k1 |-> 0, s1 |-> 0]
/\\ crashes = 0

State 2: <Post line 196, col 3 to line 201, col 23 of module Outbox>
/\\ messages = [k1 |-> 0, s1 |-> 0]
/\\ crashes = 0

1,114 states generated, 460 distinct states found, 87 states left on queue.
The depth of the complete state graph search is 8.
Finished in 01s at (2026-11-22 10:00:01)
"""

TLC_TEMPORAL = """\
Checking temporal properties for the complete state space with 8248 total distinct states at (2026-11-22 10:00:03)
Error: Temporal properties were violated.

Error: The following behavior constitutes a counter-example:

State 1: <Initial predicate>
/\\ crashes = 0

Back to state 4: <DeliverAck line 230, col 3 to line 234, col 38 of module Outbox>

Finished checking temporal properties in 00s at 2026-11-22 10:00:03
16493 states generated, 2062 distinct states found, 0 states left on queue.
Finished in 03s at (2026-11-22 10:00:03)
"""

TLC_ACTION = """\
Error: Action property ConflictNeverMutates is violated.
120 states generated, 53 distinct states found, 0 states left on queue.
"""

TLC_BROKEN = """\
***Parse Error***
Was expecting "==== or more Module body"
Encountered "Beginning of definition" at line 12, column 1 in module Outbox
Fatal errors while parsing TLA+ spec in file Outbox
"""


def test_tlc_command_line():
    assert mc.tlc_command("/opt/tla/tla2tools.jar") == [
        "java", "-XX:+UseParallelGC", "-cp", "/opt/tla/tla2tools.jar", "tlc2.TLC", "-workers", "1", "-deadlock",
        "-config", "Outbox.cfg", "Outbox.tla",
    ]


@pytest.mark.parametrize(
    ("output", "verdict", "distinct", "violated"),
    [
        (TLC_OK, "ok", 30912, []),
        (TLC_INVARIANT, "violation", 460, ["AtMostOneBrokerMessage"]),
        (TLC_TEMPORAL, "violation", 2062, ["(temporal)"]),
        (TLC_ACTION, "violation", 53, ["ConflictNeverMutates"]),
        (TLC_BROKEN, "error", None, []),
        ("", "error", None, []),
    ],
    ids=["ok", "invariant", "temporal", "action", "parse-error", "empty"],
)
def test_parse_tlc_output(output, verdict, distinct, violated):
    parsed = mc.parse_tlc_output(output)
    assert (parsed.verdict, parsed.distinct_states, parsed.violated) == (verdict, distinct, violated)


def test_compare_with_tlc():
    ours = mc.check(core, QUICK)
    status, lines = mc.compare_with_tlc(mc.parse_tlc_output(TLC_TEMPORAL), ours)
    assert status == 1 and "VERDICTS DISAGREE" in lines
    status, lines = mc.compare_with_tlc(mc.parse_tlc_output(TLC_OK), ours)
    assert status == 0 and lines[-1] == "verdicts agree"
    assert any("distinct state counts differ (TLC 30912, python 2062)" in line for line in lines)
    status, lines = mc.compare_with_tlc(mc.parse_tlc_output(TLC_BROKEN), ours)
    assert status == 2 and "Fatal errors while parsing TLA+ spec in file Outbox" in lines


def test_cli_fails_when_tlc_cannot_run(tmp_path, capsys):
    assert mc.cli(["--quick", "--max-crashes", "0", "--tla2tools", str(tmp_path / "missing.jar")], core) == 2
    assert "TLC:      verdict error" in capsys.readouterr().out


# --- the TLA+ module and the Python model stay twins ---------------------------------------------------------------
def test_checked_in_cfg_is_the_default_params():
    assert (mc.MODEL_DIR / "Outbox.cfg").read_text(encoding="utf-8") == mc.render_cfg(mc.ModelParams())


def test_tla_defines_every_action_and_property_the_python_model_has():
    text = (mc.MODEL_DIR / "Outbox.tla").read_text(encoding="utf-8")
    defined = set(re.findall(r"^([A-Za-z]\w*)(?:\([^)]*\))? ==", text, re.M))
    model = mc.build(core, QUICK)
    names = {action.name for action in model.actions()}
    names |= {*mc.STATE_INVARIANTS, *mc.STEP_INVARIANTS, *mc.LIVENESS, "TypeOK", "Spec", "Init", "Next"}
    assert names <= defined, names - defined
    assert {v.name for v in model.invariants()} == set(mc.STATE_INVARIANTS)
    assert {v.name for v in model.step_invariants()} == set(mc.STEP_INVARIANTS)
    assert names >= mc.FAULTS
    cfg = mc.render_cfg(QUICK)
    for constant in ("NumKeys", "NumSpare", "MaxAttempts", "MaxCrashes"):
        assert re.search(rf"^ *{constant} = \d+$", cfg, re.M)
        assert constant in text
