"""The decision-table interpreter for ``spec/tables``: lookup, totality and determinism.

Rules of this file: a decision table has finite ``inputs`` (name -> domain) and ``rows`` whose ``when`` maps every
input to a value, a list of values, or ``"*"``. A table is *total* when every combination of input values matches at
least one row and *deterministic* when none matches two. ``problems()`` names every violation; ``lookup()`` raises a
typed error that names the inputs when a combination matches no row or several.

``lookup()`` is on the daemon's hot path (every accept, dispatch and ack): the first lookup of a combination scans the
rows and checks the inputs; its answer is memoised, keyed by the inputs exactly as passed, so later lookups of that
combination are one dict hit. Only answers are memoised: a lookup that raised scans (and raises) again next time.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from spec import load_table

__all__ = ["AmbiguousRow", "DecisionTable", "NoRow", "Row", "TableError", "UnknownInput", "decision_table"]

WILDCARD = "*"


class TableError(Exception):
    """A table lookup failed; the message names the table and the inputs."""


class UnknownInput(TableError):
    """An input value is outside the input's declared domain."""


class NoRow(TableError):
    """No row covers this combination of inputs."""


class AmbiguousRow(TableError):
    """More than one row covers this combination of inputs."""


@dataclass(frozen=True)
class Row:
    """One row of a decision table."""

    id: str
    when: Mapping[str, frozenset[str] | None]  # None is the wildcard
    then: Mapping[str, Any]
    requirements: tuple[str, ...]

    def matches(self, inputs: Mapping[str, str]) -> bool:
        return all(allowed is None or inputs[name] in allowed for name, allowed in self.when.items())


class DecisionTable:
    """A decision table over finite input domains."""

    def __init__(self, document: Mapping[str, Any]):
        self.id: str = document["id"]
        self.document = document
        self.inputs: dict[str, tuple[str, ...]] = {k: tuple(map(str, v)) for k, v in document["inputs"].items()}
        self.rows: tuple[Row, ...] = tuple(self._row(raw) for raw in document["rows"])
        self._memo: dict[tuple[tuple[str, str], ...], Row] = {}

    def _row(self, raw: Mapping[str, Any]) -> Row:
        when: dict[str, frozenset[str] | None] = {}
        for name in self.inputs:
            cell = raw["when"].get(name, WILDCARD)
            if cell == WILDCARD:
                when[name] = None
            elif isinstance(cell, list):
                when[name] = frozenset(map(str, cell))
            else:
                when[name] = frozenset({str(cell)})
        return Row(raw["id"], when, raw.get("then", {}), tuple(raw.get("requirements", ())))

    def combinations(self) -> Iterator[dict[str, str]]:
        """Every combination of input values, in declaration order."""
        names = list(self.inputs)
        for values in itertools.product(*(self.inputs[n] for n in names)):
            yield dict(zip(names, values, strict=True))

    def matching(self, inputs: Mapping[str, str]) -> list[Row]:
        """The rows whose ``when`` covers ``inputs``."""
        for name, value in inputs.items():
            if name not in self.inputs:
                raise UnknownInput(f"{self.id}: unknown input {name!r}")
            if value not in self.inputs[name]:
                raise UnknownInput(f"{self.id}: {name}={value!r} is outside {list(self.inputs[name])}")
        return [row for row in self.rows if row.matches(inputs)]

    def lookup(self, **inputs: str) -> Row:
        """The one row covering ``inputs``; raises ``NoRow`` or ``AmbiguousRow`` naming them."""
        key = tuple(inputs.items())
        row = self._memo.get(key)
        if row is None:
            row = self._memo[key] = self._scan(inputs)
        return row

    def _scan(self, inputs: Mapping[str, str]) -> Row:
        missing = set(self.inputs) - set(inputs)
        if missing:
            raise UnknownInput(f"{self.id}: inputs {sorted(missing)} not given")
        rows = self.matching(inputs)
        if not rows:
            raise NoRow(f"{self.id}: no row for {_show(inputs)}")
        if len(rows) > 1:
            raise AmbiguousRow(f"{self.id}: rows {[r.id for r in rows]} all cover {_show(inputs)}")
        return rows[0]

    def settled(self, **known: str) -> Row | None:
        """The row every completion of the unknown inputs leads to, or ``None`` while that is still open.

        Callers that evaluate inputs one step at a time (the broker's accept transaction) use this to learn, after
        each step, whether the outcome is already decided.
        """
        unknown = [n for n in self.inputs if n not in known]
        found: set[str] = set()
        by_id = {}
        for values in itertools.product(*(self.inputs[n] for n in unknown)):
            row = self.lookup(**known, **dict(zip(unknown, values, strict=True)))
            found.add(row.id)
            by_id[row.id] = row
            if len(found) > 1:
                return None
        return by_id[found.pop()] if found else None

    def problems(self) -> list[str]:
        """Totality and determinism violations, each naming the rows or the uncovered inputs."""
        found: list[str] = []
        seen_ids: set[str] = set()
        for row in self.rows:
            if row.id in seen_ids:
                found.append(f"{self.id}: duplicate row id {row.id}")
            seen_ids.add(row.id)
            for name, allowed in row.when.items():
                for value in sorted(allowed or ()):
                    if value not in self.inputs[name]:
                        found.append(f"{self.id}: row {row.id} uses {name}={value!r} outside its domain")
        for combo in self.combinations():
            rows = [row for row in self.rows if row.matches(combo)]
            if not rows:
                found.append(f"{self.id}: no row covers {_show(combo)} (a row was removed?)")
            elif len(rows) > 1:
                found.append(f"{self.id}: rows {', '.join(r.id for r in rows)} overlap on {_show(combo)}")
        return found


def _show(inputs: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in inputs.items())


@functools.cache
def decision_table(name: str) -> DecisionTable:
    """The decision table ``spec/tables/<name>.yaml``, loaded once per process."""
    return DecisionTable(load_table(name))
