"""Trace tools: validate recorded traces against spec/schemas/trace (and, with the Spark checks, their invariants)."""
