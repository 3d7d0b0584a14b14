"""The TRC verdicts: the traces an implementation wrote during a run, checked with the trace oracle.

Theory of operation. The launch contract hands every instance the harness starts a ``{trace_dir}`` (launch.py): one
directory per instance, kept across that instance's restarts, so every incarnation of a node appends to the same
directory and its ``seq`` goes on increasing (spec/schemas/trace). The reference writes its trace there
(``--trace-dir {trace_dir}``); another implementation may write spec/schemas/trace JSONL there too. Once the run is
over and every instance has stopped, each instance's directory is checked on its own with the single-process oracle
(``spark_checks.oracle``; no Spark), and its findings become one verdict per invariant of the catalogue
(``spark_checks.catalogue``), reported beside the black-box verdicts.

Rules of this file:

* A target that wrote no trace event gets every TRC verdict ``not_judged`` -- never ``pass`` or ``fail``: the spec
  asks for no trace, and a target the harness did not launch was handed no ``{trace_dir}``.
* An invariant the trace cannot exercise is ``not_judged``, naming why: it relates events of a source the run has
  none of (the oracle's ``applies``: the daemon suite's scripted broker and the broker suite's members write no
  trace), or the trace holds no event of the kinds it checks. A pass needs evidence.
* Input that is not valid against spec/schemas/trace fails ``TRC-INPUT-VALID``, naming the first invalid lines, and
  leaves every invariant ``not_judged``: a dropped event can hide a violation as easily as it can fake one.
* Spec or profile. An invariant is a **spec** verdict only when every requirement it protects is the spec's own and it
  rests on no erratum; one that protects an erratum's decision (TRC-SEQ-MONOTONIC: E-28 only) or judges against
  tables that hold errata rows (TRC-OUTBOX-LEGAL: E-14, E-16, E-17, E-28) is a **profile** verdict, so a third party's
  choice where the spec is silent is never called a spec violation. ``TRC-INPUT-VALID`` is profile: the trace format
  is meshspec's. A verdict's level is the strongest level among the requirements it protects (MUST without any).
* A violation names its invariant, its key and where its event sits: ``<instance>/<file>:<line>`` under the trace
  root (1-based line of the JSONL file), with the related event and the evidence located the same way.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import spec as spec_pkg

from .report import cite, errata_titles, kind_of

INPUT_VALID = "TRC-INPUT-VALID"
#: violations (and invalid lines) a verdict shows; the count says how many there were
SHOWN = 5
LEVELS = ("MUST", "SHOULD", "MAY")


@dataclass
class TraceSource:
    """What the run handed out and where: filled by the fixture that starts the target (daemon or broker).

    ``handed`` is False when the harness launched nothing (a target reached by URL or socket); ``silent`` names the
    trace source the harness's own peers play without writing a trace, and says so (``broker`` for the daemon suite's
    scripted broker, ``daemon`` for the broker suite's members)."""

    handed: bool
    silent: tuple[str, str]
    instances: dict[str, Path] = field(default_factory=dict)


def _level(requirements: list[dict[str, Any]]) -> str:
    return min((r["level"] for r in requirements), key=LEVELS.index, default="MUST")


def _row(invariant: Any, registry: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The verdict row of one catalogue invariant, before its verdict is known."""
    protected = [registry[r] for r in invariant.requirements if r in registry]
    spec_only = bool(protected) and all(kind_of(r) == "spec" for r in protected) and not invariant.errata
    cites = [f"{r['id']}: {cite(r)}" for r in protected]
    cites += [f"meshspec {e} — {errata_titles().get(e, '(erratum)')}" for e in invariant.errata
              if not any(r.get("source") == f"errata:{e}" for r in protected)]
    return {"id": invariant.id, "title": invariant.title, "kind": "spec" if spec_only else "profile",
            "level": _level(protected), "protects": list(invariant.requirements), "errata": list(invariant.errata),
            "cite": " · ".join(cites), "verdict": "not_judged", "reason": "", "violations": 0, "evidence": []}


def _input_row() -> dict[str, Any]:
    return {"id": INPUT_VALID, "title": "Every trace line is an event valid against spec/schemas/trace",
            "kind": "profile", "level": "MUST", "protects": [], "errata": [],
            "cite": "meshspec spec/schemas/trace: the trace format (meshspec's own; the spec defines no trace)",
            "verdict": "not_judged", "reason": "", "violations": 0, "evidence": []}


@dataclass
class _Lines:
    """Where each event of one instance's trace sits: (node, position in the node's stream) and (node, seq) ->
    ``file:line``, and how many events of each kind there are."""

    by_position: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    by_seq: dict[tuple[str, int], str] = field(default_factory=dict)
    kinds: Counter = field(default_factory=Counter)

    @classmethod
    def read(cls, files: list[Path], root: Path) -> _Lines:
        found = cls()
        positions: dict[str, int] = {}
        for path in files:
            name = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
            with path.open(encoding="utf-8", errors="replace") as handle:
                for number, text in enumerate(handle, start=1):
                    try:
                        event = json.loads(text)
                        node, seq = event["node"], event.get("seq")
                    except (ValueError, KeyError, TypeError):
                        continue
                    if not isinstance(node, str):
                        continue
                    where = f"{name}:{number}"
                    position = positions.get(node, 0)
                    positions[node] = position + 1
                    found.by_position[(node, position)] = (where, seq)
                    if isinstance(seq, int):
                        found.by_seq.setdefault((node, seq), where)
                    found.kinds[event.get("kind")] += 1
        return found

    def where(self, node: str, seq: int, line: int | None = None) -> str:
        """The ``file:line`` of the event ``node``/``seq`` (at ``line``, its position, when two share a seq)."""
        if line is not None:
            located = self.by_position.get((node, line))
            if located is not None and located[1] == seq:
                return located[0]
        return self.by_seq.get((node, seq), f"{node} seq {seq} (not found in the files)")


def _relative(where: str, root: Path) -> str:
    prefix = f"{root}/"
    return where.removeprefix(prefix)


def _section(root: Path | None, kept: bool) -> dict[str, Any]:
    from spark_checks.catalogue import CATALOGUE

    registry = {r["id"]: r for r in spec_pkg.load_yaml(spec_pkg.SPEC_DIR / "requirements.yaml")["requirements"]}
    return {"verdict": "not_judged", "reason": "", "directory": str(root) if kept and root else None,
            "instances": [], "events": 0, "sources": [], "invalid": {"count": 0, "lines": []}, "seconds": 0.0,
            "invariants": [_input_row(), *(_row(inv, registry) for inv in CATALOGUE)]}


def _finish(section: dict[str, Any], verdict: str, reason: str, started: float) -> dict[str, Any]:
    for row in section["invariants"]:
        if not row["reason"]:
            row["reason"] = reason
    section.update(verdict=verdict, reason=reason, seconds=round(time.monotonic() - started, 3))
    return section


def not_judged(reason: str, root: Path | None = None, kept: bool = False) -> dict[str, Any]:
    """A ``traces`` section whose every verdict is ``not_judged`` for ``reason``."""
    return _finish(_section(root, kept), "not_judged", f"not judged: {reason}", time.monotonic())


def judge(source: TraceSource | None, root: Path | None, kept: bool) -> dict[str, Any]:
    """Check every instance's trace directory with the oracle; returns the report's ``traces`` section."""
    from spark_checks import format as fmt
    from spark_checks import oracle
    from spark_checks.catalogue import CATALOGUE

    started = time.monotonic()
    if source is None:
        return not_judged("no case started the target", root, kept)
    if not source.handed:
        return not_judged("the harness did not launch the target, so it handed it no {trace_dir} (give --launch)",
                          root, kept)
    section = _section(root, kept)
    rows = section["invariants"]
    traced = {name: fmt.jsonl_files([path]) for name, path in source.instances.items() if path.is_dir()}
    traced = {name: files for name, files in traced.items() if files and any(f.stat().st_size for f in files)}
    if not traced:
        return not_judged("the target emits no traces (it wrote nothing to {trace_dir})", root, kept)
    checker = oracle.Oracle()
    by_row = {row["id"]: row for row in rows}
    sources: set[str] = set()
    applies: dict[str, bool] = dict.fromkeys(by_row, False)
    kinds: Counter = Counter()
    invalid: list[dict[str, Any]] = []
    invalid_count = 0
    for name, files in traced.items():
        report = checker.check(files)
        lines = _Lines.read(files, root or source.instances[name].parent)
        section["instances"].append(name)
        section["events"] += report.events
        sources |= set(report.sources)
        kinds += lines.kinds
        invalid_count += report.invalid_count
        invalid += [{**entry, "where": _relative(str(entry["where"]), root)} if root else entry
                    for entry in report.invalid]
        for entry in report.as_dict()["invariants"]:
            applies[entry["id"]] = applies[entry["id"]] or entry["applies"]
        for violation in report.violations:
            row = by_row[violation.invariant]
            row["violations"] += 1
            if len(row["evidence"]) < SHOWN:
                refs = {(r.node, r.seq): r.line for r in (violation.related, violation.event) if r is not None}
                event, related = violation.event, violation.related
                row["evidence"].append({
                    "key": dict(violation.key), "where": lines.where(event.node, event.seq, event.line),
                    "related": None if related is None else lines.where(related.node, related.seq, related.line),
                    "detail": violation.detail,
                    "events": [lines.where(e["node"], e["seq"], refs.get((e["node"], e["seq"])))
                               for e in violation.evidence if "node" in e and "seq" in e]})
    section.update(sources=sorted(sources), invalid={"count": invalid_count, "lines": invalid[:SHOWN]})
    events = section["events"]
    if invalid_count:
        first = "; ".join(f"{e['where']}: {e.get('message') or e.get('reason')}" for e in invalid[:3])
        by_row[INPUT_VALID].update(verdict="fail", violations=invalid_count,
                                   reason=f"{invalid_count} trace line(s) invalid against spec/schemas/trace: {first}")
        for row in rows[1:]:
            row.update(verdict="not_judged", violations=0, evidence=[],
                       reason=f"not judged: the trace holds {invalid_count} invalid line(s) ({INPUT_VALID})")
        return _finish(section, "fail", f"{invalid_count} invalid trace line(s) in {events} event(s)", started)
    by_row[INPUT_VALID].update(verdict="pass", reason=f"{events} event(s) valid")
    for invariant in CATALOGUE:
        row = by_row[invariant.id]
        if row["violations"]:
            shown = row["evidence"][0]
            key = ", ".join(f"{k}={v}" for k, v in shown["key"].items())
            row.update(verdict="fail", reason=f"{row['violations']} violation(s); first: {key} at {shown['where']}: "
                                              f"{shown['detail']}")
        elif not applies[invariant.id]:
            missing = sorted(invariant.needs - sources)
            why = f" ({source.silent[1]})" if source.silent[0] in missing else ""
            row.update(reason=f"not judged: the trace has no {' or '.join(missing)} events{why}" if missing else
                       f"not judged: no instance's trace holds both {' and '.join(sorted(invariant.needs))} events")
        elif not any(kinds[k] for k in invariant.kinds):
            row.update(reason=f"not judged: the trace holds no {' or '.join(invariant.kinds)} event")
        else:
            row.update(verdict="pass", reason=f"held over {sum(kinds[k] for k in invariant.kinds)} event(s)")
    failed = [row["id"] for row in rows if row["verdict"] == "fail"]
    return _finish(section, "fail" if failed else "pass",
                   f"{len(failed)} invariant(s) violated: {', '.join(failed)}" if failed else
                   f"{events} event(s) from {len(traced)} instance(s) checked", started)
