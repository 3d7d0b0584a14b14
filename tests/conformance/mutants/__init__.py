"""Deliberately broken daemons: testing the tester (STYLE.md point 8, after bowtie's miniatures and fauxmplementations).

Theory of operation. A mutant is the reference daemon with ONE small, named deviation from the spec, injected through
the seam the daemon is built through: ``reference.daemon.runtime.Components``. Each mutant names the one component it
replaces (``seam``: ``outbox_store``, ``broker_link``, ``create_app``, ``parse_send`` ...) and supplies the
replacement -- a subclass of the reference's class that overrides one method, or a wrapper around the reference's
function -- so nothing in ``reference`` is patched: no module attribute is replaced, in this process or the daemon's.
``python -m tests.conformance.mutants NAME up ...`` parses ``meshd up``'s own arguments and runs the real ``cmd_up``
with those components; the gunicorn worker builds the daemon from them, and a restart (the recovery cases) does again.

``kills`` names the requirement ids the suite must fail the mutant for; ``select`` narrows the run to the cases that
can see the deviation (default: every case checking one of ``kills``). ``killmatrix.py`` runs the suite against each
mutant and each miniature (miniatures.py: standalone toy daemons) and records which requirements failed;
tests/conformance/test_mutants.py asserts every one is killed by an expected requirement.

Rules of this package. A replacement re-states the reference's behaviour with the deviation and nothing else: it
calls ``super()`` or the wrapped function wherever it can, and where it must re-state a method it reads the reference's
module-level helpers, never rebinds them. A deviation no black-box run can observe (``undetectable``) is listed with the
reason and never run; one the suite cannot kill yet (``known_gap``) names the harness change that would kill it.
The catalogue lives in ``_lookup.py`` (POST /v1/send), ``_outbox.py`` (the outbox, the broker link, negotiation),
``_inbound.py`` (inbox and events) and ``_transport.py`` (auth, limits, HTTP, lifecycle and identity).
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HARNESS_ERROR = "harness_error"
SEAMS = ("outbox_store", "inbox_store", "event_bus", "broker_link", "committer", "create_app", "parse_send",
         "check_host", "lock_state_dir")


@dataclass(frozen=True)
class Mutant:
    """One broken implementation: how it deviates, through which component, and the requirements that must catch it."""

    name: str
    description: str
    kills: tuple[str, ...]
    build: Callable[[], Any] | None = None  # returns the replacement for Components.<seam>
    select: tuple[str, ...] = ()
    kind: str = "mutant"  # mutant | miniature | control
    seam: str | None = None
    undetectable: str | None = None  # why no black-box case can kill it (never run)
    known_gap: str | None = None  # why the suite cannot kill it yet, and the harness change that would kill it
    launch: str = field(default="", compare=False)
    est_s: float = 10.0  # a rough run time, to schedule the longest runs first
    deadline_s: float = 600.0  # meshconform run --deadline
    case_timeout_s: float = 120.0  # meshconform run --case-timeout

    @property
    def selection(self) -> tuple[str, ...]:
        """The case or requirement ids ``meshconform run --select`` gets for this subject."""
        return self.select or tuple(k for k in self.kills if k != HARNESS_ERROR)

    @property
    def template(self) -> str:
        return self.launch or template(self.name)

    def components(self) -> Any:
        """The reference's ``Components`` with this mutant's one replacement."""
        from reference.daemon.runtime import Components

        if self.seam is None or self.build is None:
            return Components()
        return dataclasses.replace(Components(), **{self.seam: self.build()})


MUTANTS: dict[str, Mutant] = {}
UNDETECTABLE: dict[str, Mutant] = {}


def template(name: str) -> str:
    """The launch template that runs mutant ``name`` (conformance/launch.py has the placeholders); ``reference`` runs
    the reference through the same entry point with nothing replaced (the control). Run from the repository root."""
    return (f"{shlex.quote(sys.executable)} -m tests.conformance.mutants {name} --target-file {{target_file}} up "
            "--state-dir {state_dir} --broker-url {broker_url} --port {port} --clock-file {clock_file}")


def mutant(name: str, description: str, kills: tuple[str, ...], select: tuple[str, ...] = (), *, seam: str | None,
           undetectable: str | None = None, known_gap: str | None = None, est_s: float = 10.0
           ) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
    """Register the decorated ``build()`` -- it returns the replacement for ``Components.<seam>`` -- as ``name``."""
    if seam is not None and seam not in SEAMS:
        raise ValueError(f"mutant {name!r}: unknown seam {seam!r}; the seams are {', '.join(SEAMS)}")

    def register(build: Callable[[], Any]) -> Callable[[], Any]:
        if name in MUTANTS or name in UNDETECTABLE:
            raise ValueError(f"mutant {name!r} registered twice")
        entry = Mutant(name, description, kills, build, select, seam=seam, undetectable=undetectable,
                       known_gap=known_gap, est_s=est_s)
        (UNDETECTABLE if undetectable else MUTANTS)[name] = entry
        return build

    return register


def get(name: str) -> Mutant:
    """The mutant called ``name`` (runnable or undetectable)."""
    return MUTANTS.get(name) or UNDETECTABLE[name]


from . import _inbound, _lookup, _outbox, _transport  # noqa: E402, F401  (registers the catalogue)
