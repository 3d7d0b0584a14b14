"""`meshd spec model-check --hooks`: the hook-run model (claim -> process -> mark), explored exhaustively.

Theory of operation. Every decision comes from a sans-IO core (an argument, as for the outbox model in
``spec.tools.model``) reading the tables it is given: a message's arrival enqueues one run per matching hook
(``hook_enqueue``), every step of a run is the core's ``hook_apply`` over spec/tables/hook_runs.yaml, and a hook's
reply is the §4.5.1 lookup (``decide_send`` over spec/tables/ipc_lookup.yaml) under the id
``reply_client_message_id(message, hook)``. What a step stores follows the effects the table names: a run's result is
stored only by ``store_result``. So a test can hand in a broken table, or a core that mints a fresh reply id per
run, and watch a property fail with a shortest counterexample.

Abstraction. Every hook matches every message (matching is configuration, not lifecycle). A state holds, per
message, whether its inbox row exists and, per (message, hook) pair: the run (state, claims), the phase of its
process (none, running, replied), whether its result is stored, how many processes it spawned (saturated) and how
many outbox rows its replies inserted; plus the outbox rows under reply ids (id and the reply's variant) and the
crashes so far. A hook's process may reply once, with variant ``A`` or ``B`` (a re-run may reply differently),
then exit 0, exit non-zero or outrun its timeout, in any order the scheduler allows. The outbox row's own lifecycle
is the outbox model's; here a row, once inserted, stays. Faults: a daemon crash (bounded by ``max_crashes``) loses
every process and claim; the inbox, the runs and the outbox are durable. Arrivals are a client's: unfair.

Properties: state invariants ``InboxFirst`` (a run exists only for a stored message), ``EveryMatchEnqueued`` (a
stored message has a run for every hook), ``ReplyAtMostOnce`` (a pair's replies inserted at most one outbox row),
``MarkedAfterStored`` (a run is finished exactly when its result is stored), ``RanBeforeFinished`` (a finished run
spawned its hook at least once), ``ClaimHasProcess``; step invariants ``ConflictNeverMutates`` (a reply answered 409
changes no outbox row) and ``HistoryKept`` (a finished run never changes); and ``EveryMatchRuns`` (without crashes,
every run ends finished).
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from spec import load_table
from spec.decision import DecisionTable, TableError, decision_table
from spec.tools.explore import Action, Invariant, Progress, Result, StepInvariant, explore, format_trace
from spec.tools.implementation import Core

VARIANTS = ("A", "B")
FAULTS = frozenset({"Crash"})
UNFAIR = frozenset({"Arrive"})
TERMINAL = frozenset(name for name, state in load_table("hook_runs")["states"].items() if state["terminal"])
_FINGERPRINT = {variant: hashlib.sha256(b"reply " + variant.encode()).digest() for variant in VARIANTS}
_RETRY = load_table("timing")["backoff"]["outbox_retry"]
_POLICY = {"retry_base_ms": _RETRY["base_ms"], "retry_max_ms": _RETRY["max_ms"], "jitter": 0.0, "max_age_hours": 72}

STATE_INVARIANTS = ("InboxFirst", "EveryMatchEnqueued", "ReplyAtMostOnce", "MarkedAfterStored", "RanBeforeFinished",
                    "ClaimHasProcess")
STEP_INVARIANTS = ("ConflictNeverMutates", "HistoryKept")
LIVENESS = ("EveryMatchRuns",)


@dataclass(frozen=True)
class HookParams:
    """The bounds of one run of the hook model."""

    messages: int = 2
    hooks: int = 1
    max_claims: int = 2
    max_crashes: int = 2
    max_states: int = 3_000_000

    @classmethod
    def quick(cls) -> HookParams:
        """One message, two hooks: about two thousand states, under a second."""
        return cls(messages=1, hooks=2, max_claims=2, max_crashes=2)

    @classmethod
    def full(cls) -> HookParams:
        """Two messages, two hooks: about 1.7 million states, four minutes."""
        return cls(messages=2, hooks=2, max_claims=2, max_crashes=2)

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        return tuple((f"m{m}", f"h{h}") for m in range(1, self.messages + 1) for h in range(1, self.hooks + 1))


class RunView(NamedTuple):
    state: str
    claims: int

    def __str__(self) -> str:
        return f"{self.state}/c{self.claims}"


class State(NamedTuple):
    """Per message: ``inbox``; per pair: the rest but ``outbox`` (reply id, variant) and ``crashes``."""

    inbox: tuple[bool, ...]
    runs: tuple[RunView | None, ...]
    phase: tuple[str, ...]  # "" no process, "run" running, "replied" its reply was answered
    stored: tuple[bool, ...]
    spawned: tuple[int, ...]  # saturates at 2: "at least once" and "again" are what the properties read
    inserts: tuple[int, ...]
    outbox: frozenset[tuple[str, str]]
    crashes: int = 0


@dataclass(frozen=True)
class Step:
    """A step's label: the action, the pair it concerns and the table rows (or IPC answer) that decided it."""

    action: str
    detail: str
    rows: tuple[str, ...] = ()
    http_status: int | None = None

    def __str__(self) -> str:
        rows = f" [{', '.join(self.rows)}]" if self.rows else ""
        status = f" -> {self.http_status}" if self.http_status is not None else ""
        return f"{self.action}({self.detail}){rows}{status}"


class HookModel:
    """The hook-run model of one core over the given tables."""

    def __init__(self, core: Core, params: HookParams, hook_table: DecisionTable, ipc_table: DecisionTable):
        self.core, self.params, self.hook_table, self.ipc_table = core, params, hook_table, ipc_table
        self.pairs = params.pairs
        self.messages = tuple(dict.fromkeys(m for m, _ in self.pairs))
        self._policy = core.OutboxPolicy(**_POLICY)

    def initial(self) -> State:
        n, k = len(self.pairs), len(self.messages)
        return State((False,) * k, (None,) * n, ("",) * n, (False,) * n, (0,) * n, (0,) * n, frozenset())

    def done(self, state: State) -> bool:
        return all(run is None or run.state in TERMINAL for run in state.runs)

    @staticmethod
    def _set(values: tuple[Any, ...], index: int, value: Any) -> tuple[Any, ...]:
        return (*values[:index], value, *values[index + 1:])

    def _step(self, state: State, index: int, event: str, action: str) -> tuple[Step, State]:
        """Apply one table event to pair ``index``'s run; the effects decide what is stored and spawned."""
        message, hook = self.pairs[index]
        view = state.runs[index]
        run = self.core.HookRun(message, hook, view.state, view.claims)
        step = self.core.hook_apply(run, event, self.params.max_claims, self.hook_table)
        after = RunView(step.run.state, min(step.run.claims, self.params.max_claims))  # saturated: only the cap counts
        phase, stored, spawned = state.phase[index], state.stored[index], state.spawned[index]
        if step.outcome == "transition":
            if "spawn" in step.effects:
                phase, spawned = "run", min(spawned + 1, 2)
            elif after.state != "claimed":
                phase = ""  # the process exited, or was killed with its group
            stored = stored or "store_result" in step.effects
        return Step(action, f"{message},{hook}", (step.row,)), state._replace(
            runs=self._set(state.runs, index, after), phase=self._set(state.phase, index, phase),
            stored=self._set(state.stored, index, stored), spawned=self._set(state.spawned, index, spawned))

    # --- actions ------------------------------------------------------------------------------------------------
    def arrive(self, state: State) -> Iterator[tuple[Step, State]]:
        """A message arrives: its inbox row and one run per hook, in one transaction."""
        for m, message in enumerate(self.messages):
            if state.inbox[m]:
                continue  # a duplicate inbound gets no new row (§5): nothing to do
            runs, rows = list(state.runs), []
            for index, (owner, hook) in enumerate(self.pairs):
                if owner == message:
                    step = self.core.hook_enqueue(message, hook, self.hook_table)
                    runs[index], rows = RunView(step.run.state, step.run.claims), [*rows, step.row]
            yield Step("Arrive", message, tuple(rows)), state._replace(
                inbox=self._set(state.inbox, m, True), runs=tuple(runs))

    def claim(self, state: State) -> Iterator[tuple[Step, State]]:
        for index, run in enumerate(state.runs):
            if run is not None and run.state == "pending":
                yield self._step(state, index, "claim", "Claim")

    def reply(self, state: State) -> Iterator[tuple[Step, State]]:
        """A running hook replies (once per process): the §4.5.1 lookup under the pair's reply id."""
        for index, (message, hook) in enumerate(self.pairs):
            if state.phase[index] != "run":
                continue
            cmid = self.core.reply_client_message_id(message, hook)
            stored = next((variant for rid, variant in state.outbox if rid == cmid), None)
            for variant in VARIANTS:
                existing = None if stored is None else self.core.new_row(
                    f"row-{cmid}", cmid, _FINGERPRINT[stored], b"", 0, self._policy)
                decision = self.core.decide_send(existing, _FINGERPRINT[variant], cmid, self.ipc_table)
                outbox, inserts = state.outbox, state.inserts
                if decision.insert:
                    outbox = outbox | {(cmid, variant)}
                    inserts = self._set(inserts, index, inserts[index] + 1)
                yield (Step("Reply", f"{message},{hook},{variant}", (decision.table_row,), decision.http_status),
                       state._replace(phase=self._set(state.phase, index, "replied"), outbox=outbox, inserts=inserts))

    def _exits(self, state: State, event: str, action: str) -> Iterator[tuple[Step, State]]:
        for index, run in enumerate(state.runs):
            if run is not None and run.state == "claimed":
                yield self._step(state, index, event, action)

    def exit_ok(self, state: State) -> Iterator[tuple[Step, State]]:
        return self._exits(state, "exit_ok", "ExitOk")

    def exit_error(self, state: State) -> Iterator[tuple[Step, State]]:
        return self._exits(state, "exit_error", "ExitError")

    def timeout(self, state: State) -> Iterator[tuple[Step, State]]:
        return self._exits(state, "timeout", "Timeout")

    def crash(self, state: State) -> Iterator[tuple[Step, State]]:
        """The daemon dies and restarts: every claim is lost (its process group killed) and reset by the table."""
        if state.crashes >= self.params.max_crashes:
            return
        after, rows = state._replace(crashes=state.crashes + 1), []
        for index, run in enumerate(state.runs):
            if run is not None and run.state == "claimed":
                step, after = self._step(after, index, "claim_lost", "Crash")
                rows += step.rows
        yield Step("Crash", f"#{state.crashes + 1}", tuple(rows)), after

    def actions(self) -> list[Action]:
        return [Action("Arrive", self.arrive), Action("Claim", self.claim), Action("Reply", self.reply),
                Action("ExitOk", self.exit_ok), Action("ExitError", self.exit_error),
                Action("Timeout", self.timeout), Action("Crash", self.crash)]

    # --- properties -----------------------------------------------------------------------------------------------
    def invariants(self) -> list[Invariant]:
        owner = [self.messages.index(m) for m, _ in self.pairs]

        def inbox_first(state: State) -> bool:
            return all(run is None or state.inbox[owner[i]] for i, run in enumerate(state.runs))

        def every_match_enqueued(state: State) -> bool:
            return all(run is not None or not state.inbox[owner[i]] for i, run in enumerate(state.runs))

        def reply_at_most_once(state: State) -> bool:
            return all(n <= 1 for n in state.inserts)

        def marked_after_stored(state: State) -> bool:
            return all((run is not None and run.state in TERMINAL) == stored
                       for run, stored in zip(state.runs, state.stored, strict=True))

        def ran_before_finished(state: State) -> bool:
            return all(run is None or run.state not in TERMINAL or spawned >= 1
                       for run, spawned in zip(state.runs, state.spawned, strict=True))

        def claim_has_process(state: State) -> bool:
            return all((run is not None and run.state == "claimed") == (phase != "")
                       for run, phase in zip(state.runs, state.phase, strict=True))

        return [Invariant("InboxFirst", inbox_first), Invariant("EveryMatchEnqueued", every_match_enqueued),
                Invariant("ReplyAtMostOnce", reply_at_most_once), Invariant("MarkedAfterStored", marked_after_stored),
                Invariant("RanBeforeFinished", ran_before_finished), Invariant("ClaimHasProcess", claim_has_process)]

    def step_invariants(self) -> list[StepInvariant]:
        def conflict_never_mutates(state: State, action: str, label: Any, after: State) -> bool:
            return not (action == "Reply" and label.http_status == 409) or (
                after.outbox == state.outbox and after.inserts == state.inserts)

        def history_kept(state: State, action: str, label: Any, after: State) -> bool:
            return all(before is None or before.state not in TERMINAL or now == before
                       for before, now in zip(state.runs, after.runs, strict=True))

        return [StepInvariant("ConflictNeverMutates", conflict_never_mutates),
                StepInvariant("HistoryKept", history_kept)]

    def progress(self) -> Progress:
        return Progress("EveryMatchRuns", self.done, FAULTS, UNFAIR)

    def describe(self, state: State) -> str:
        runs = " ".join(f"{m},{h}={run}{'/' + phase if phase else ''}{'/stored' if stored else ''}"
                        for (m, h), run, phase, stored in zip(self.pairs, state.runs, state.phase, state.stored,
                                                              strict=True) if run is not None)
        inbox = ",".join(m for m, held in zip(self.messages, state.inbox, strict=True) if held)
        outbox = ",".join(f"{rid[:12]}…={variant}" for rid, variant in sorted(state.outbox))
        return f"inbox[{inbox or '-'}] runs[{runs or '-'}] outbox[{outbox or '-'}] crashes={state.crashes}"


def build(core: Core, params: HookParams | None = None, hook_table: DecisionTable | None = None,
          ipc_table: DecisionTable | None = None) -> HookModel:
    """The hook model of ``core`` over the given tables (the real ones from spec/tables by default)."""
    return HookModel(core, params or HookParams(), hook_table or decision_table("hook_runs"),
                     ipc_table or decision_table("ipc_lookup"))


def explore_model(model: HookModel) -> Result:
    """Explore ``model`` and check every property; a table's impossible pair is a violation of its action."""
    errors = (TableError, model.core.HookRunError)
    return explore([model.initial()], model.actions(), model.invariants(), model.step_invariants(),
                   model.progress(), max_states=model.params.max_states, errors=errors)


def format_report(result: Result, model: HookModel) -> list[str]:
    lines = [f"explored: {result.states} distinct states, {result.edges} edges, depth {result.depth}, "
             f"{result.seconds:.1f} s",
             f"checked:  invariants {', '.join(STATE_INVARIANTS)}; step properties {', '.join(STEP_INVARIANTS)}; "
             f"liveness {', '.join(LIVENESS)} (faults excluded: {', '.join(sorted(FAULTS))})"]
    if result.ok:
        return [*lines, "no violations"]
    for violation in result.violations:
        lines.append(f"VIOLATION {violation.invariant} ({violation.kind}): {violation.message}")
        lines += format_trace(violation, model.describe)
    return lines


def cli(argv: list[str], core: Core) -> int:
    """`meshd spec model-check --hooks [--quick|--full] [--messages N] [--hooks-per-message N] [--max-claims N]
    [--max-crashes N]`."""
    parser = argparse.ArgumentParser(prog="meshd spec model-check --hooks",
                                     description="Explore the hook-run model built from spec/tables.")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="one message, two hooks (under a second)")
    size.add_argument("--full", action="store_true", help="two messages, two hooks (minutes)")
    parser.add_argument("--messages", type=int)
    parser.add_argument("--hooks-per-message", type=int, dest="hooks")
    parser.add_argument("--max-claims", type=int)
    parser.add_argument("--max-crashes", type=int)
    parser.add_argument("--max-states", type=int)
    args = parser.parse_args(argv)
    params = HookParams.quick() if args.quick else HookParams.full() if args.full else HookParams()
    overrides = {name: getattr(args, name) for name in ("messages", "hooks", "max_claims", "max_crashes",
                                                        "max_states") if getattr(args, name) is not None}
    params = HookParams(**{**params.__dict__, **overrides})
    if params.messages < 1 or params.hooks < 1 or params.max_claims < 1 or params.max_crashes < 0:
        parser.error("--messages, --hooks-per-message and --max-claims must be >= 1, --max-crashes >= 0")
    print(f"model:    messages={params.messages} hooks={params.hooks} max_claims={params.max_claims} "
          f"max_crashes={params.max_crashes} reply variants={','.join(VARIANTS)}")
    model = build(core, params)
    print(f"tables:   {model.hook_table.id} ({len(model.hook_table.rows)} rows), "
          f"{model.ipc_table.id} ({len(model.ipc_table.rows)} rows)")
    result = explore_model(model)
    print("\n".join(format_report(result, model)), flush=True)
    return 0 if result.ok else 1
