"""A small explicit-state explorer: breadth-first search, shortest counterexamples, and a progress check.

Theory of operation. A model is a set of initial states and named actions; an action maps a state to the
``(label, next_state)`` pairs it can step to (a label says what happened, e.g. which table row decided it). States
must be hashable and immutable. ``explore`` runs a breadth-first search from the initial states and keeps, for
every state, the state it was first reached from and the label of that step. Because the search is breadth-first,
walking those parent pointers back from any state gives a *shortest* trace to it, which is the counterexample we
report:

* a **state invariant** (``Invariant``) is checked on every reached state;
* a **step invariant** (``StepInvariant``) is checked on every edge ``(state, action, label, next_state)``,
  including steps that leave the state unchanged (TLA+'s ``[][A]_vars`` action properties);
* the **state bound** stops the search and reports ``StateBound`` when more than ``max_states`` states are reached,
  so a broken model that grows without limit fails loudly instead of running forever;
* an exception of a type listed in ``errors`` raised by an action (a table that answers "impossible") is reported
  as a violation named after the action, with the trace that led there.

By default the search stops at the first state or step that violates anything (as TLC does), reporting every
property that state or step violates; with ``stop_at_first=False`` it goes on, never expanding a state that
violates a state invariant, and keeps the first violation of each property.

The **progress check** (``Progress``) is the explicit-state form of "without further faults, every run terminates
in a done state". Take the reachable graph and drop the edges of the *fault* actions and the self-loops (stuttering
steps change nothing). In what is left, no reachable state that is not *done* may lie on a cycle (an infinite
fault-free run that never finishes) and none may be a dead end (a run that stops unfinished). Cycles are found as
the strongly connected components of that subgraph (Tarjan, iteratively); a violation is reported as a lasso: the
shortest trace to a state on the cycle, followed by the cycle back to it (``loop_start`` marks where the loop
begins). The check runs only when the search completed without a safety violation, because it needs the whole
graph. Actions named ``unfair`` (clients, the operator, the clock) may step but need not: their edges count for
cycles, but a state whose only fault-free steps are theirs counts as a dead end. If the check passes, every
fault-free run makes finitely many steps, and a run that stops does so in a done state or where a fair action stays
enabled, which weak fairness forbids: so termination under weak fairness of the fair fault-free actions follows.

Why we carry our own explorer: we evaluated the ``musil`` package (0.36.x), an explicit-state checker with safety,
deadlock, liveness and LTL checking. It fits, but it requires Python >= 3.12 while meshspec supports 3.11, the
interpreter on our CI machines. What we need is a breadth-first search with parent pointers and a strongly connected
components pass, which is a page of code (ERRATA E-25).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

Trace = list[tuple[str, Any]]

INIT_LABEL = "Init"
STATE_BOUND = "StateBound"


@dataclass(frozen=True)
class Action:
    """A named action: ``successors(state)`` yields ``(label, next_state)`` pairs."""

    name: str
    successors: Callable[[Any], Iterable[tuple[Any, Any]]]


@dataclass(frozen=True)
class Invariant:
    """A predicate every reachable state must satisfy."""

    name: str
    holds: Callable[[Any], bool]


@dataclass(frozen=True)
class StepInvariant:
    """A predicate every step ``(state, action name, label, next_state)`` must satisfy."""

    name: str
    holds: Callable[[Any, str, Any, Any], bool]


@dataclass(frozen=True)
class Progress:
    """Without fault actions, every reachable state that is not ``done`` must go on to a ``done`` state.

    ``unfair`` names actions that may happen but need not (a client, an operator, the clock): their steps count for
    cycles, but a state whose only fault-free steps are unfair ones is a dead end.
    """

    name: str
    done: Callable[[Any], bool]
    faults: frozenset[str] = frozenset()
    unfair: frozenset[str] = frozenset()


@dataclass
class Violation:
    """One violated property and its shortest counterexample.

    ``trace`` is a list of ``(label, state)`` steps starting with ``("Init", initial_state)``; for a lasso
    ``loop_start`` is the index of the state the final step returns to.
    """

    invariant: str
    kind: str  # state | step | error | dead-end | cycle | bound
    message: str
    trace: Trace
    loop_start: int | None = None


@dataclass
class Result:
    """What an exploration found."""

    states: int
    edges: int
    violations: list[Violation] = field(default_factory=list)
    complete: bool = True
    depth: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """The search finished and nothing was violated."""
        return self.complete and not self.violations

    def names(self) -> set[str]:
        """The names of the violated properties."""
        return {v.invariant for v in self.violations}


class _Graph:
    """States by index, BFS parent pointers, and (for progress) the fault-free successor lists."""

    def __init__(self) -> None:
        self.index: dict[Any, int] = {}
        self.states: list[Any] = []
        self.parent: list[tuple[int, Any] | None] = []
        self.depth: list[int] = []
        self.calm: list[list[tuple[int, Any]]] = []  # fault-free, non-stuttering edges
        self.fair: list[bool] = []  # has a fault-free, non-stuttering edge of a fair action

    def add(self, state: Any, parent: tuple[int, Any] | None) -> tuple[int, bool]:
        found = self.index.get(state)
        if found is not None:
            return found, False
        number = len(self.states)
        self.index[state] = number
        self.states.append(state)
        self.parent.append(parent)
        self.depth.append(0 if parent is None else self.depth[parent[0]] + 1)
        self.calm.append([])
        self.fair.append(False)
        return number, True

    def trace(self, number: int) -> Trace:
        steps: Trace = []
        current: int | None = number
        while current is not None:
            link = self.parent[current]
            steps.append((INIT_LABEL if link is None else str(link[1]), self.states[current]))
            current = None if link is None else link[0]
        steps.reverse()
        return steps


def explore(
    initial: Iterable[Any],
    actions: Sequence[Action],
    invariants: Sequence[Invariant] = (),
    step_invariants: Sequence[StepInvariant] = (),
    progress: Progress | None = None,
    max_states: int = 1_000_000,
    errors: tuple[type[BaseException], ...] = (),
    stop_at_first: bool = True,
) -> Result:
    """Explore every reachable state breadth-first and check the given properties (see the module docstring).

    With ``stop_at_first`` (as TLC) the search ends at the first state or step that violates something, reporting
    every property that state or step violates; otherwise it goes on and keeps the first violation of each.
    """
    started = time.monotonic()
    graph = _Graph()
    violations: dict[str, Violation] = {}
    queue: deque[int] = deque()
    calm = progress is not None
    faults = progress.faults if progress is not None else frozenset()
    unfair = progress.unfair if progress is not None else frozenset()
    edges = 0

    def report(name: str, kind: str, message: str, trace: Trace, loop_start: int | None = None) -> None:
        if name not in violations:
            violations[name] = Violation(name, kind, message, trace, loop_start)

    def broken_invariants(number: int) -> bool:
        state = graph.states[number]
        broken = False
        for invariant in invariants:
            if not invariant.holds(state):
                report(invariant.name, "state", f"invariant {invariant.name} is violated", graph.trace(number))
                broken = True
        return broken

    def expand(number: int) -> bool:
        """Expand one state; False stops the search."""
        nonlocal edges
        state = graph.states[number]
        for action in actions:
            try:
                steps = list(action.successors(state))
            except errors as exc:
                report(f"{action.name}Error", "error", f"{action.name}: {exc}", graph.trace(number))
                if stop_at_first:
                    return False
                continue
            for label, after in steps:
                edges += 1
                stepped_wrong = False
                for invariant in step_invariants:
                    if not invariant.holds(state, action.name, label, after):
                        trace = [*graph.trace(number), (str(label), after)]
                        report(invariant.name, "step", f"step invariant {invariant.name} is violated", trace)
                        stepped_wrong = True
                if stepped_wrong and stop_at_first:
                    return False
                target, new = graph.add(after, (number, label))
                if calm and target != number and action.name not in faults:
                    graph.calm[number].append((target, label))
                    graph.fair[number] = graph.fair[number] or action.name not in unfair
                if not new:
                    continue
                if len(graph.states) > max_states:
                    report(STATE_BOUND, "bound", f"more than {max_states} states; raise the bound or shrink the "
                           "model", graph.trace(target))
                    return False
                if broken_invariants(target):
                    if stop_at_first:
                        return False
                else:
                    queue.append(target)
        return True

    complete = True
    for state in initial:
        number, new = graph.add(state, None)
        if new and not broken_invariants(number):
            queue.append(number)
    if violations and stop_at_first:
        queue.clear()
        complete = False
    while queue:
        if not expand(queue.popleft()):
            complete = False
            break

    if progress is not None and complete and not violations:
        for violation in _progress(graph, progress):
            report(violation.invariant, violation.kind, violation.message, violation.trace, violation.loop_start)

    return Result(
        states=len(graph.states),
        edges=edges,
        violations=list(violations.values()),
        complete=complete,
        depth=max(graph.depth, default=0),
        seconds=time.monotonic() - started,
    )


def _progress(graph: _Graph, progress: Progress) -> list[Violation]:
    found: list[Violation] = []
    done = [progress.done(state) for state in graph.states]
    for number, fair in enumerate(graph.fair):
        if not done[number] and not fair:
            found.append(Violation(progress.name, "dead-end", f"{progress.name}: a state that is not done has no "
                                   "fault-free step of a fair action", graph.trace(number)))
            break
    looping = [c for c in _strongly_connected(graph.calm) if len(c) > 1 and not all(done[n] for n in c)]
    if looping:
        # the unfinished state on a cycle that BFS reached first has the shortest prefix
        start, component = min((min(n for n in c if not done[n]), c) for c in looping)
        cycle = _cycle_through(graph.calm, start, set(component))
        prefix = graph.trace(start)
        found.append(Violation(progress.name, "cycle", f"{progress.name}: a fault-free cycle never reaches a done "
                               "state", prefix + [(str(label), graph.states[n]) for label, n in cycle],
                               len(prefix) - 1))
    return found


def _strongly_connected(successors: list[list[tuple[int, Any]]]) -> list[list[int]]:
    """Tarjan's algorithm without recursion; components come out in reverse topological order."""
    count = len(successors)
    index = [-1] * count
    low = [0] * count
    on_stack = [False] * count
    stack: list[int] = []
    components: list[list[int]] = []
    counter = 0
    for root in range(count):
        if index[root] != -1:
            continue
        work = [(root, 0)]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = True
        while work:
            node, position = work[-1]
            edges = successors[node]
            if position < len(edges):
                work[-1] = (node, position + 1)
                target = edges[position][0]
                if index[target] == -1:
                    index[target] = low[target] = counter
                    counter += 1
                    stack.append(target)
                    on_stack[target] = True
                    work.append((target, 0))
                elif on_stack[target]:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack[member] = False
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    return components


def _cycle_through(successors: list[list[tuple[int, Any]]], start: int, within: set[int]) -> list[tuple[Any, int]]:
    """The shortest path of (label, state) steps from ``start`` back to ``start`` inside one component."""
    parent: dict[int, tuple[int, Any]] = {}
    queue = deque([start])
    seen = {start}
    while queue:
        node = queue.popleft()
        for target, label in successors[node]:
            if target not in within:
                continue
            if target == start:
                path = [(label, start)]
                while node != start:
                    previous, step = parent[node]
                    path.append((step, node))
                    node = previous
                path.reverse()
                return path
            if target not in seen:
                seen.add(target)
                parent[target] = (node, label)
                queue.append(target)
    raise AssertionError("a strongly connected component always has a cycle through each member")


def format_trace(violation: Violation, show: Callable[[Any], str] = repr) -> list[str]:
    """The counterexample as numbered lines: step number, label, and ``show(state)``."""
    lines = []
    for number, (label, state) in enumerate(violation.trace):
        marker = " <- loop starts here" if violation.loop_start == number else ""
        lines.append(f"  {number:>3}. {label}{marker}")
        lines.append(f"       {show(state)}")
    if violation.loop_start is not None:
        lines.append(f"       (back to step {violation.loop_start})")
    return lines
