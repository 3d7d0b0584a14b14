"""Tools over the spec: the gate (check), breaking-change diff, diagrams, vectors and the model checker.

Each tool module exposes ``cli(argv) -> int``, which ``meshd spec <tool>`` dispatches to; the tools that run the spec
against an implementation (check, vectors, model) take its core too, ``cli(argv, core)`` (see ``implementation``).
"""
