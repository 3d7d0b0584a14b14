"""The kill matrix: run meshconform against every mutant and miniature and record which requirements caught it.

    python -m tests.conformance.mutants.killmatrix [--json] [--only NAME ...] [--full] [--control] [--workers 2]
                                                   [--record tests/conformance/killmatrix.json]

Run it from the repository root. Each subject runs as ``meshconform run --launch TEMPLATE --select <its selection>
--strict --seed 1 --deadline <its deadline> --report-dir DIR --quiet`` in a subprocess (its own scripted broker and
daemon on 127.0.0.1; ``--strict`` so a SHOULD failure fails the run too). A subject is *killed* when one of the
requirements it is expected to fail has verdict ``fail`` in report.json, or, for a subject expected to be a harness
error, when meshconform exits 2 naming the launch failure. With ``--control`` (the reference through the same entry
point, on the union of every selection) a kill counts only when the control passes that requirement: a requirement the
reference fails too proves nothing about the mutant. A kill the union run does not confirm is checked once more against
the control on that subject's own selection (cases can disturb each other: the reference may fail a requirement only
after other cases ran), and that run decides. Exit status: 1 when any subject survived (known gaps included)
or the control failed, else 0. ``--record`` writes the matrix as JSON (tests/conformance/killmatrix.json
is the committed one).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import HARNESS_ERROR, MUTANTS, UNDETECTABLE, Mutant, template
from .miniatures import MINIATURES

REPO = Path(__file__).resolve().parents[3]
GRACE_S = 60.0  # how far past its --deadline a run may end (start-up, teardown, the report)
# What the control -- the reference itself -- fails today, and why. The control test tolerates exactly these; a kill
# by one of them is confirmed only where the control passes it (on the subject's own selection). Remove an entry once
# the reference passes it: the kill matrix then holds the reference to it again.
# None today: ERR-NO-5XX-ON-BAD-INPUT (a 5000-digit body was 500) and SSE-STREAM-LIMIT (a stream whose client left kept
# its slot until the next write) were, until main took the E-40 and E-43 fixes.
REFERENCE_FAILURES: dict[str, str] = {}


def control_subject(selection: Sequence[str]) -> Mutant:
    """The reference through the mutants' own entry point, nothing replaced, on ``selection`` (the control)."""
    return Mutant("reference", "the reference daemon via tests.conformance.mutants, nothing replaced (the control)",
                  (), select=tuple(selection), kind="control", launch=template("reference"), est_s=900,
                  deadline_s=1500)


@dataclass
class Verdict:
    """What one meshconform run made of one subject."""

    name: str
    kind: str
    description: str
    expected: list[str]
    selection: list[str]
    exit_code: int
    deadline_s: float = 600.0
    verdicts: dict[str, str] = field(default_factory=dict)  # requirement id -> verdict, for every checked one
    failed_cases: list[str] = field(default_factory=list)
    harness_errors: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    output_tail: str = ""
    own_control: dict[str, str] | None = None  # the control's verdicts on this subject's own selection, when run

    @property
    def killed_by(self) -> list[str]:
        """The expected requirements that failed (``harness_error`` when that was expected and happened)."""
        hits = [r for r in self.expected if self.verdicts.get(r) == "fail"]
        if HARNESS_ERROR in self.expected and self.exit_code == 2:
            hits.append(HARNESS_ERROR)
        return hits

    @property
    def killed(self) -> bool:
        return bool(self.killed_by)

    @property
    def also_failed(self) -> list[str]:
        """Requirements that failed although the subject was not expected to fail them."""
        return [r for r, v in self.verdicts.items() if v == "fail" and r not in self.expected]

    @property
    def passed(self) -> bool:
        """For the control: the run passed and no requirement failed."""
        return self.exit_code == 0 and "fail" not in self.verdicts.values()

    @property
    def in_time(self) -> bool:
        return self.duration_s <= self.deadline_s + GRACE_S

    def as_dict(self) -> dict:
        return {**asdict(self), "killed": self.killed, "killed_by": self.killed_by, "also_failed": self.also_failed}


def confirmed(row: Verdict, control: Verdict | None) -> list[str]:
    """The requirements that killed ``row`` and that the control passes: on ``row``'s own selection when that was
    run, else on the union of the selections (all of them when no control ran)."""
    reference = row.own_control if row.own_control is not None else None if control is None else control.verdicts
    if reference is None:
        return row.killed_by
    return [r for r in row.killed_by if r == HARNESS_ERROR or reference.get(r) == "pass"]


def _control(matrix: Sequence[Verdict]) -> Verdict | None:
    return next((r for r in matrix if r.kind == "control"), None)


def survivors(matrix: Sequence[Verdict]) -> list[Verdict]:
    """Subjects with no confirmed kill."""
    control = _control(matrix)
    return [r for r in matrix if r.kind != "control" and not confirmed(r, control)]


def subjects(only: Iterable[str] = ()) -> list[Mutant]:
    """Every runnable mutant, then every miniature (or just those named in ``only``)."""
    everything = {**MUTANTS, **MINIATURES}
    names = list(only) or list(everything)
    unknown = [n for n in names if n not in everything]
    if unknown:
        raise KeyError(f"unknown mutant or miniature: {', '.join(unknown)}")
    return [everything[n] for n in names]


def run_one(subject: Mutant, select: Sequence[str] | None = None, seed: int = 1) -> Verdict:
    """Run meshconform once against ``subject`` (``select=None``: its own selection; ``[]``: the whole suite)."""
    selection = list(subject.selection if select is None else select)
    with tempfile.TemporaryDirectory(prefix=f"killmatrix-{subject.name}-") as tmp:
        argv = [sys.executable, "-m", "conformance.cli", "run", "--launch", subject.template, "--strict",
                "--seed", str(seed), "--deadline", f"{subject.deadline_s:g}", "--case-timeout",
                f"{subject.case_timeout_s:g}", "--report-dir", tmp, "--quiet"]
        for item in selection:
            argv += ["--select", item]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        started = time.monotonic()
        try:
            done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False,
                                  timeout=subject.deadline_s + 2 * GRACE_S)
            exit_code, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:
            exit_code, output = -1, f"meshconform did not finish within {subject.deadline_s + 2 * GRACE_S:g} s: {exc}"
        verdict = Verdict(subject.name, subject.kind, subject.description, list(subject.kills), selection, exit_code,
                          deadline_s=subject.deadline_s, duration_s=round(time.monotonic() - started, 1),
                          output_tail=output[-3000:])
        report_path = Path(tmp) / "report.json"
        if report_path.exists():
            report = json.loads(report_path.read_text(encoding="utf-8"))
            verdict.verdicts = {r["id"]: r["verdict"] for r in report["requirements"]
                                if r["verdict"] != "not_checked"}
            verdict.failed_cases = [c["id"] for c in report["cases"] if c["outcome"] in ("failed", "error")]
            verdict.harness_errors = list(report["harness_errors"])
    return verdict


def run(mutants: Sequence[Mutant], select_by_expected: bool = True, workers: int = 2, seed: int = 1,
        console: Console | None = None) -> list[Verdict]:
    """Run every subject (``select_by_expected=False``: the whole suite each time), print the matrix, return it.

    Runs go ``workers`` at a time, the longest expected first; the matrix keeps the order of ``mutants``.
    """
    order = sorted(range(len(mutants)), key=lambda i: -mutants[i].est_s)
    with ThreadPoolExecutor(max(1, workers)) as pool:
        futures = {i: pool.submit(run_one, mutants[i], None if select_by_expected else [], seed) for i in order}
        matrix = [futures[i].result() for i in range(len(mutants))]
        control = _control(matrix)
        recheck = [row for row in matrix if control is not None and row.kind != "control" and row.killed
                   and not confirmed(row, control)]
        checks = [pool.submit(run_one, control_subject(row.selection), None, seed) for row in recheck]
        for row, check in zip(recheck, checks, strict=True):
            row.own_control = check.result().verdicts
    if console is not None:
        render(matrix, console)
    return matrix


_COLOR = {"fail": "red", "pass": "green", "skip": "yellow", "error": "magenta"}


def render(matrix: Sequence[Verdict], console: Console) -> None:
    """The matrix: each subject against its expected requirements, and whatever else failed."""
    control = _control(matrix)
    table = Table(title="meshconform kill matrix", show_lines=False)
    for column in ("subject", "kind", "expected requirement → verdict", "also failed", "result", "s"):
        table.add_column(column, overflow="fold")
    for row in matrix:
        cells = []
        for requirement in row.expected:
            if requirement == HARNESS_ERROR:
                value = f"exit {row.exit_code}"
                color = "red" if row.exit_code == 2 else "yellow"
            else:
                value = row.verdicts.get(requirement, "not run")
                color = _COLOR.get(value, "dim")
            cells.append(f"{requirement} → [{color}]{value}[/]")
        if row.kind == "control":
            result = "[green]passes[/]" if row.passed else f"[bold red]FAILS (exit {row.exit_code})[/]"
        elif confirmed(row, control):
            result = "[green]killed[/]" + ("" if row.in_time else " [bold red](past its deadline)[/]")
        elif row.killed:
            result = "[bold red]SURVIVED[/] (its kills fail on the control too)"
        else:
            result = "[bold red]SURVIVED[/]" + (" (known gap)" if _known_gap(row.name) else "")
        table.add_row(escape(row.name), row.kind, "\n".join(cells) or "—", " ".join(row.also_failed) or "—", result,
                      f"{row.duration_s:g}")
    for entry in UNDETECTABLE.values():
        table.add_row(escape(entry.name), "undetectable", " ".join(entry.kills), "—", "[dim]not run[/]", "—")
    console.print(table)
    survived = survivors(matrix)
    killed = sum(1 for r in matrix if r.kind != "control") - len(survived)
    console.print(f"killed {killed} of {killed + len(survived)}"
                  + (f"; [bold red]survived: {escape(', '.join(r.name for r in survived))}[/]" if survived else ""))
    if control is not None and not control.passed:
        console.print(f"[bold red]the control failed[/]: {escape(', '.join(control.also_failed))}")
    for row in survived:
        gap = _known_gap(row.name)
        seen = {r: row.verdicts.get(r, "not run") for r in row.expected}
        console.print(f"[yellow]{escape(row.name)}[/]: exit {row.exit_code}, expected {escape(str(seen))}"
                      + (f"; known gap: {escape(gap)}" if gap else ""))
    for entry in UNDETECTABLE.values():
        console.print(f"[dim]{escape(entry.name)} not run: {escape(entry.undetectable or '')}[/]")


def _known_gap(name: str) -> str | None:
    entry = MUTANTS.get(name) or MINIATURES.get(name)
    return None if entry is None else entry.known_gap


def record(matrix: Sequence[Verdict], path: Path, wall_s: float) -> None:
    """Write the matrix as JSON: per subject what was expected, what the report said, and the run's wall time."""
    control = _control(matrix)
    rows = []
    for row in matrix:
        rows.append({"name": row.name, "kind": row.kind, "expected": row.expected, "selection": row.selection,
                     "exit_code": row.exit_code,
                     "killed": bool(confirmed(row, control)) if row.kind != "control" else None,
                     "passed": row.passed if row.kind == "control" else None,
                     "killed_by": confirmed(row, control) if row.kind != "control" else [],
                     "failed_on_control_too": sorted(set(row.killed_by) - set(confirmed(row, control))),
                     "control_on_own_selection": row.own_control is not None,
                     "expected_verdicts": {r: row.verdicts.get(r, "not run") for r in row.expected
                                           if r != HARNESS_ERROR},
                     "also_failed": row.also_failed, "duration_s": row.duration_s, "deadline_s": row.deadline_s,
                     "known_gap": _known_gap(row.name)})
    survived = [r.name for r in survivors(matrix)]
    subjects_run = [r for r in matrix if r.kind != "control"]
    document = {"wall_s": round(wall_s, 1), "subjects": len(subjects_run), "killed": len(subjects_run) - len(survived),
                "survivors": survived,
                "control": None if control is None else {"passed": control.passed, "failed": control.also_failed},
                "undetectable": {m.name: m.undetectable for m in UNDETECTABLE.values()}, "matrix": rows}
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.conformance.mutants.killmatrix",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the matrix as JSON on stdout")
    parser.add_argument("--only", action="append", default=[], help="a mutant or miniature name (repeatable)")
    parser.add_argument("--full", action="store_true", help="run the whole suite against each, not its selection")
    parser.add_argument("--control", action="store_true", help="also run the reference on the union of selections")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--record", type=Path, help="write the matrix as JSON to this file")
    args = parser.parse_args(argv)
    chosen = subjects(args.only)
    if args.control:
        chosen.append(control_subject([] if args.full else sorted({item for m in chosen for item in m.selection})))
    console = Console(stderr=args.json, width=160)
    started = time.monotonic()
    matrix = run(chosen, select_by_expected=not args.full, workers=args.workers, seed=args.seed)
    if args.json:
        print(json.dumps([row.as_dict() for row in matrix], indent=2))
    render(matrix, console)
    wall = time.monotonic() - started
    console.print(f"wall time {wall:.0f} s with {args.workers} worker(s)")
    if args.record:
        record(matrix, args.record, wall)
    control = _control(matrix)
    return 1 if survivors(matrix) or (control is not None and not control.passed) else 0


if __name__ == "__main__":
    sys.exit(main())
