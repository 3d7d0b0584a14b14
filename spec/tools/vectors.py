"""`meshd spec vectors`: run every test vector under spec/vectors against the reference core.

Theory of operation: each suite is one language-neutral JSON file, ``spec/vectors/<suite>.json``, validated first by
its own schema ``spec/schemas/vectors/<suite>.json`` (plus what a schema cannot say: unique ids, flags declared in the
file's ``flags`` map). Then every vector is evaluated: the core computes the vector's ``input`` and each member of
``expected`` is compared with what the core produced. A vector carrying ``"skip": "<reason>"`` is a named known gap: it
is reported as skipped with that reason, never as passed. Problems name the suite, the vector id and what differed.
The core is an argument (``spec.tools.implementation.Core``: ``meshd spec vectors`` hands it ``reference.core``); the
``jcs`` suite runs ``rfc8785``, the JCS library itself.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import rfc8785
from jsonschema import Draft202012Validator, FormatChecker
from referencing.exceptions import Unresolvable

import spec as spec_pkg
from spec import SPEC_DIR
from spec.tools.implementation import Core

SUITES = ("fingerprint", "jcs", "destination", "max_age", "features")
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"

__all__ = [
    "SUITES",
    "Outcome",
    "SuiteResult",
    "cli",
    "counts",
    "evaluate",
    "load_suite",
    "problems",
    "results",
    "run_all",
    "run_suite",
    "schema_problems",
]


@dataclass(frozen=True)
class Outcome:
    """What happened to one vector: ``status`` is passed, failed or skipped; ``detail`` says why."""

    suite: str
    id: str
    status: str
    detail: str = ""


@dataclass(frozen=True)
class SuiteResult:
    """One suite's counts and problems (schema problems and failed vectors)."""

    suite: str
    passed: int = 0
    skipped: int = 0
    failed: int = 0
    problems: tuple[str, ...] = field(default=())
    skips: tuple[Outcome, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.problems


def vector_path(name: str, spec_dir: Path = SPEC_DIR) -> Path:
    return Path(spec_dir) / "vectors" / f"{name}.json"


def load_suite(name: str, spec_dir: Path = SPEC_DIR) -> dict[str, Any]:
    """Parse ``spec/vectors/<name>.json``.

    Raises:
        KeyError: ``name`` is not a suite.
        OSError, json.JSONDecodeError: the file is missing or not JSON.
    """
    if name not in SUITES:
        raise KeyError(f"unknown vector suite {name!r}; suites are {', '.join(SUITES)}")
    return spec_pkg.load_json(vector_path(name, spec_dir))


def _validator(name: str, spec_dir: Path) -> Draft202012Validator:
    registry = spec_pkg.schema_registry(Path(spec_dir))
    schema = registry.contents(f"{spec_pkg.SCHEMA_BASE}vectors/{name}.json")
    return Draft202012Validator(schema, registry=registry, format_checker=FormatChecker())


def schema_problems(name: str, document: Any, spec_dir: Path = SPEC_DIR) -> list[str]:
    """Schema errors of one suite file, then duplicate ids and undeclared flags."""
    where = f"vectors/{name}.json"
    try:
        validator = _validator(name, spec_dir)
    except LookupError:
        return [f"{where}: no schema schemas/vectors/{name}.json"]
    try:
        errors = sorted(validator.iter_errors(document), key=lambda e: list(map(str, e.absolute_path)))
    except Unresolvable as exc:
        return [f"{where}: its schema has an unresolvable $ref: {exc}"]
    found = [f"{where}: {'/'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}" for error in errors]
    if found:
        return found
    seen: set[str] = set()
    declared = document.get("flags", {})
    for vector in document["vectors"]:
        if vector["id"] in seen:
            found.append(f"{where}: {vector['id']}: duplicate vector id")
        seen.add(vector["id"])
        found.extend(f"{where}: {vector['id']}: flag {flag!r} is not declared in the file's flags"
                     for flag in vector["flags"] if flag not in declared)
    return found


# -- evaluation: each returns the core's answer in the vector's `expected` vocabulary


def _fingerprint(core: Core, vector: Mapping[str, Any]) -> dict[str, Any]:
    body: str = vector["input"]["body"]
    try:
        request = core.parse_send(body.encode("utf-8"), vector["input"]["idempotency_key"])
    except core.RequestError as exc:
        return {"valid": False, "error": exc.code}
    item = request.fingerprint_input()
    return {
        "valid": True,
        "client_message_id": request.client_message_id,
        "destination_kind": request.destination_kind,
        "destination_ref": request.destination_ref,
        "priority": request.priority,
        "reply_to_id": request.reply_to_id,
        "meta_canonical": core.meta_canonical(item.meta).decode("utf-8"),
        "body_hash": core.body_hash(item.body),
        "canonical_hex": core.canonical_preimage(item).hex(),
        "fingerprint": request.fingerprint().hex(),
    }


def _jcs(core: Core, vector: Mapping[str, Any]) -> dict[str, Any]:
    return {"canonical": rfc8785.dumps(json.loads(vector["input"]["json"])).decode("utf-8")}


def _destination(core: Core, vector: Mapping[str, Any]) -> dict[str, Any]:
    try:
        destination = core.parse_destination(vector["input"]["to"])
    except core.DestinationError:
        return {"valid": False, "error": "destination_unresolvable"}
    return {"valid": True, "destination_kind": destination.kind, "destination_ref": destination.ref}


def _max_age(core: Core, vector: Mapping[str, Any]) -> dict[str, Any]:
    given = vector["input"]
    try:
        result = core.derive(given["mode"], retention_days=given.get("dedupe_retention_days"),
                        config_default_hours=given.get("config_default_hours"),
                        override_hours=given.get("override_hours"))
    except core.MaxAgeError as exc:
        return {"error": exc.code}
    return {"hours": result.hours, "source": result.source}


def _features(core: Core, vector: Mapping[str, Any]) -> dict[str, Any]:
    given = vector["input"]
    outcome = core.negotiate(given["response"], given["require"], given["optional"])
    if outcome.failure is None:
        accepted = {bit: dict(params) for bit, params in outcome.accepted.items()}
        return {"ok": True, "accepted": accepted, "warnings_count": len(outcome.warnings)}
    limit = vector["expected"].get("close_payload_max_bytes", 123)
    payload = outcome.failure.close_payload(limit)
    sent = json.loads(payload)
    answer: dict[str, Any] = {
        "ok": False,
        "close_reason": {"kind": outcome.failure.kind, "feature": outcome.failure.feature},
        "close_payload_max_bytes": limit,
    }
    # The payload itself must fit, keep kind and feature whole, and only ever shorten the detail.
    if len(payload.encode("utf-8")) > limit:
        answer["close_payload_max_bytes"] = f"payload is {len(payload.encode('utf-8'))} bytes: {payload}"
    elif sent.get("kind") != outcome.failure.kind or sent.get("feature") != outcome.failure.feature:
        answer["close_reason"] = {"kind": sent.get("kind"), "feature": sent.get("feature")}
    elif not outcome.failure.detail.startswith(sent.get("detail", "")):
        answer["close_payload_max_bytes"] = f"payload detail is not a prefix of the full detail: {payload}"
    return answer


EVALUATORS: dict[str, Callable[[Core, Mapping[str, Any]], dict[str, Any]]] = {
    "fingerprint": _fingerprint,
    "jcs": _jcs,
    "destination": _destination,
    "max_age": _max_age,
    "features": _features,
}


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 200 else f"{text[:200]}… ({len(text)} characters)"


def evaluate(core: Core, name: str, vector: Mapping[str, Any]) -> list[str]:
    """Compare the core's answer with ``vector["expected"]``; an empty list means the vector passes.

    Every member of ``expected`` is compared; members the core produces beyond them are not. A crash of the core on
    a vector's input is itself a difference (bad input must be a 4xx or a refusal, never a 5xx).
    """
    try:
        actual = EVALUATORS[name](core, vector)
    except Exception as exc:  # any exception from the core is a finding about that vector, not a harness crash
        return [f"the core raised {type(exc).__name__}: {exc}"]
    expected = vector["expected"]
    differences = []
    for key, want in expected.items():
        got = actual.get(key, "<absent>")
        if got != want:
            differences.append(f"{key}: expected {_show(want)}, the core gave {_show(got)}")
    if expected.get("valid") is True and actual.get("valid") is False:
        differences = [f"expected a valid request, the core refused it with {actual.get('error')}"]
    elif expected.get("valid") is False and actual.get("valid") is True:
        differences = [f"expected {expected.get('error')}, the core accepted it"]
    return differences


def results(core: Core, name: str, spec_dir: Path = SPEC_DIR) -> tuple[list[str], list[Outcome]]:
    """Schema problems of one suite and the outcome of each of its vectors (none if the file is invalid)."""
    where = f"vectors/{name}.json"
    try:
        document = load_suite(name, spec_dir)
    except OSError:
        return [f"{where}: missing"], []
    except json.JSONDecodeError as exc:
        return [f"{where}: not JSON: {exc}"], []
    found = schema_problems(name, document, spec_dir)
    if found:
        return found, []
    outcomes = []
    for vector in document["vectors"]:
        differences = evaluate(core, name, vector)
        if "skip" in vector:
            note = "" if differences else " (it now passes: the skip may be removed)"
            outcomes.append(Outcome(name, vector["id"], SKIPPED, vector["skip"] + note))
        elif differences:
            outcomes.append(Outcome(name, vector["id"], FAILED, "; ".join(differences)))
        else:
            outcomes.append(Outcome(name, vector["id"], PASSED))
    return [], outcomes


def run_suite(core: Core, name: str, spec_dir: Path = SPEC_DIR) -> list[str]:
    """Every problem of one suite: schema errors, then each failed vector as ``<suite> <id>: <what differed>``."""
    found, outcomes = results(core, name, spec_dir)
    return found + [f"{o.suite} {o.id}: {o.detail}" for o in outcomes if o.status == FAILED]


def run_all(core: Core, spec_dir: Path = SPEC_DIR) -> dict[str, SuiteResult]:
    """Run every suite; the result maps each suite to its counts, problems and skips."""
    report = {}
    for name in SUITES:
        found, outcomes = results(core, name, spec_dir)
        found += [f"{o.suite} {o.id}: {o.detail}" for o in outcomes if o.status == FAILED]
        report[name] = SuiteResult(
            suite=name,
            passed=sum(o.status == PASSED for o in outcomes),
            skipped=sum(o.status == SKIPPED for o in outcomes),
            failed=sum(o.status == FAILED for o in outcomes),
            problems=tuple(found),
            skips=tuple(o for o in outcomes if o.status == SKIPPED),
        )
    return report


def problems(core: Core, spec_dir: Path = SPEC_DIR) -> list[str]:
    """Every problem of every suite (what `meshd spec check` reports)."""
    return [problem for result in run_all(core, spec_dir).values() for problem in result.problems]


def counts(spec_dir: Path = SPEC_DIR) -> dict[str, int]:
    """Vectors per suite; a missing or unparsable file counts 0."""
    total = {}
    for name in SUITES:
        try:
            vectors = load_suite(name, spec_dir).get("vectors", [])
        except (OSError, ValueError):
            vectors = []
        total[name] = len(vectors) if isinstance(vectors, list) else 0
    return total


def cli(argv: list[str], core: Core) -> int:
    """`meshd spec vectors [--spec-dir DIR] [--suite NAME]...`: a pass count per suite; exit 1 on any problem."""
    parser = argparse.ArgumentParser(prog="meshd spec vectors", description=__doc__.splitlines()[0])
    parser.add_argument("--spec-dir", type=Path, default=SPEC_DIR)
    parser.add_argument("--suite", action="append", choices=SUITES, help="run only this suite (repeatable)")
    args = parser.parse_args(argv)
    chosen = args.suite or list(SUITES)
    report = {name: result for name, result in run_all(core, args.spec_dir).items() if name in chosen}
    for name, result in report.items():
        print(f"{name:<12} {result.passed} passed, {result.skipped} skipped, {result.failed} failed")
        for skip in result.skips:
            print(f"  skipped {skip.id}: {skip.detail}")
    found = [problem for result in report.values() for problem in result.problems]
    for problem in found:
        print(f"PROBLEM {problem}")
    return 1 if found else 0
