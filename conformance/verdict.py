"""Per-requirement verdicts inside a case.

A case declares the requirements it may check (``@case("id", "REQ-A", "REQ-B")``) and records, as it goes, which
of them its evidence passed or failed (the ``verdict`` fixture, one ``Verdicts`` per test node):

    verdict.expect("IPC-DONE-MATCH", response.status_code == 200, f"got {response.status_code}")
    with verdict.check("FP-PREFIX-409"):          # an AssertionError inside fails FP-PREFIX-409 and the case goes on
        assert body["daemon_fingerprint_prefix"] == expected
    verdict.require("OBX-BROKER-OUTCOMES", row is not None, "the row never reached dead")   # fails and ends the node

Rules of this file. A failed check fails only the requirements it names, so one broken row or one wrongly worded
answer never hides the rest of a case (behaviour is checked first, shape after). ``require`` ends the node after
recording (``Attributed``); ``blocked`` ends it with the named requirements skipped because a precondition the
implementation had to provide did not hold — a precondition is never a pass. A node that ends by an unattributed
failure fails the declared requirements it recorded nothing for; a node that passes with no explicit check passes
them all (a case whose every assertion serves all its requirements need not name them one by one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

# What a case may raise because of the implementation's behaviour (as opposed to a fault of the harness itself):
# a failed assertion, a wait that timed out, a connection the implementation broke, a body that is not JSON.
TARGET_FAILURES: tuple[type[BaseException], ...] = (AssertionError, TimeoutError, OSError, httpx.HTTPError,
                                                    ValueError)


class Attributed(Exception):
    """Ends a node whose failure is already recorded against its requirement(s)."""


class Blocked(Exception):
    """Ends a node whose remaining requirements cannot be checked: a precondition did not hold."""


@dataclass
class Check:
    """One piece of evidence about one requirement."""

    requirement: str
    outcome: str  # pass | fail | skip | error
    detail: str = ""


class HarnessMisuse(Exception):
    """A case used the recorder wrongly (a requirement it does not declare): a fault of the harness, never the
    implementation's (deliberately not a ValueError, which TARGET_FAILURES counts as the target's)."""


@dataclass
class Verdicts:
    """The checks one test node recorded."""

    node: str
    declared: tuple[str, ...]
    checks: list[Check] = field(default_factory=list)

    def _add(self, requirement: str, outcome: str, detail: str) -> None:
        if requirement not in self.declared:
            raise HarnessMisuse(f"{self.node}: {requirement} is not declared by this case (@case lists "
                             f"{', '.join(self.declared)})")
        self.checks.append(Check(requirement, outcome, detail[:2000]))

    def expect(self, requirement: str, ok: object, detail: str = "") -> bool:
        """Record ``requirement`` as passed when ``ok`` is truthy, else failed with ``detail``."""
        self._add(requirement, "pass" if ok else "fail", "" if ok else (detail or "expectation not met"))
        return bool(ok)

    def require(self, requirement: str, ok: object, detail: str = "") -> None:
        """Like ``expect``, but a failure ends the node (later steps depend on it)."""
        if not self.expect(requirement, ok, detail):
            raise Attributed(f"{requirement}: {detail}")

    def passed(self, *requirements: str) -> None:
        for requirement in requirements:
            self._add(requirement, "pass", "")

    def skip(self, requirement: str, reason: str) -> None:
        self._add(requirement, "skip", reason)

    def blocked(self, requirements: tuple[str, ...] | list[str], reason: str) -> None:
        """Skip ``requirements`` (those without evidence yet in this node) and end the node."""
        seen = {c.requirement for c in self.checks}
        for requirement in requirements:
            if requirement not in seen:
                self._add(requirement, "skip", f"not checkable: {reason}")
        raise Blocked(reason)

    @contextlib.contextmanager
    def check(self, *requirements: str, fatal: bool = False) -> Iterator[None]:
        """Pass ``requirements`` when the block completes; fail them (and go on, unless ``fatal``) when it raises a
        target failure (a failed assertion, a timeout, a broken connection, a body that is not JSON)."""
        try:
            yield
        except TARGET_FAILURES as exc:
            detail = describe(exc)
            for requirement in requirements:
                self._add(requirement, "fail", detail)
            if fatal:
                raise Attributed(detail) from exc
            return
        self.passed(*requirements)

    def recorded(self) -> set[str]:
        return {c.requirement for c in self.checks}


def describe(exc: BaseException) -> str:
    """A one-paragraph description of a failure for a report."""
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, AssertionError):
        return text
    return f"{type(exc).__name__}: {text}"
