"""Tools over the spec: the gate (check), breaking-change diff, diagrams, vectors and the model checker.

Each tool module exposes ``cli(argv) -> int``, which ``meshd spec <tool>`` dispatches to.
"""
