"""`meshd spec check`: the spec gate.

It validates, in order: the OpenAPI document; every JSON Schema against the 2020-12 metaschema (and that its `$id`
matches its path); every table against its table schema; decision-table totality and determinism (naming the rows);
that the core knows every effect the outbox table names; every vector against its schema and against the core; the
requirement registry (unique ids, existing tests, every MUST tested or listed in the coverage baseline, no stale
baseline entry; every `source: spec` requirement quoting the spec in `cite`, no cite on a meshspec decision; every
black-box-checkable MUST checked by a conformance case or listed in the black-box baseline, no stale entry there);
that the OpenAPI error codes equal spec/tables/errors.yaml; that CONFORMANCE.md and STATE_MACHINES.md are current;
and that every MUST has an implementation anchor in reference/ (spec/tools/anchors.py). It prints one line of counts
per area and exits 1 naming every problem.

The gate imports no implementation and no harness: the core is an argument (``meshd spec check`` hands it
``reference.core``), and the conformance case ids are read from ``conformance/case_ids.json``, which the harness
writes (``meshconform list --write``; a test fails while it is stale).
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry

import spec as spec_pkg
from spec.decision import DecisionTable
from spec.tools.implementation import Core

TABLE_SCHEMAS = {
    "outbox": "tables/outbox",
    "hook_runs": "tables/hook_runs",
    "ipc_lookup": "tables/ipc_lookup",
    "broker_accept": "tables/broker_accept",
    "features": "tables/features",
    "max_age": "tables/max_age",
    "errors": "tables/errors",
    "limits": "tables/limits",
    "close_codes": "tables/close_codes",
    "exit_codes": "tables/exit_codes",
    "timing": "tables/timing",
}
CATALOGUE_SCHEMA = "tables/catalogue"
CASE_IDS = Path("conformance") / "case_ids.json"
TEST_ID = re.compile(r"^(?P<path>tests/[A-Za-z0-9_/]+\.py)::(?P<name>[A-Za-z0-9_]+)$")
# `v0.9.0 §4.5.1`, `v3 §3.3`, `v0.9.0 §4.5b, §4.6.1`: a round of the upstream series and sections of it.
CITE_REF = re.compile(r"^v(?:0\.9\.0|[1-9]|10) §\d+(?:\.\d+)*[a-z]?(?:, §\d+(?:\.\d+)*[a-z]?)*$")


@dataclass
class Report:
    """Problems found and one line of counts per area."""

    problems: list[str] = field(default_factory=list)
    counts: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def _registry(spec_dir: Path) -> Registry:
    return spec_pkg.schema_registry.__wrapped__(spec_dir)


def _validator(spec_dir: Path, ref: str) -> Draft202012Validator:
    registry = _registry(spec_dir)
    return Draft202012Validator(registry.contents(f"{spec_pkg.SCHEMA_BASE}{ref}.json"), registry=registry)


def _errors(validator: Draft202012Validator, document: Any, where: str) -> list[str]:
    return [
        f"{where}: {'/'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}"
        for error in sorted(validator.iter_errors(document), key=lambda e: list(map(str, e.absolute_path)))
    ]


def check_openapi(spec_dir: Path, report: Report) -> dict[str, Any] | None:
    from openapi_spec_validator import validate
    from openapi_spec_validator.readers import read_from_filename

    path = spec_dir / "openapi.yaml"
    if not path.exists():
        report.problems.append("openapi.yaml: missing")
        return None
    try:
        document, base_uri = read_from_filename(str(path))
        validate(document, base_uri=base_uri)
    except Exception as exc:  # the validator raises many types; each is a finding, not a crash
        report.problems.append(f"openapi.yaml: invalid: {str(exc).splitlines()[0]}")
        return None
    operations = sum(
        1 for item in document.get("paths", {}).values() for method in item
        if method in {"get", "post", "put", "patch", "delete"}
    )
    report.counts["openapi"] = f"{len(document.get('paths', {}))} routes, {operations} operations"
    return document


def check_schemas(spec_dir: Path, report: Report) -> None:
    files = sorted((spec_dir / "schemas").rglob("*.json"))
    for path in files:
        rel = path.relative_to(spec_dir / "schemas").as_posix()
        try:
            document = spec_pkg.load_json(path)
        except json.JSONDecodeError as exc:
            report.problems.append(f"schemas/{rel}: not JSON: {exc}")
            continue
        expected_id = f"{spec_pkg.SCHEMA_BASE}{rel}"
        if document.get("$id") != expected_id:
            report.problems.append(f"schemas/{rel}: $id {document.get('$id')!r} should be {expected_id!r}")
        for error in Draft202012Validator(Draft202012Validator.META_SCHEMA).iter_errors(document):
            report.problems.append(f"schemas/{rel}: not a valid 2020-12 schema: {error.message}")
    report.counts["schemas"] = f"{len(files)} JSON Schemas"


def check_tables(spec_dir: Path, report: Report, requirement_ids: set[str], known_effects: frozenset[str]) -> None:
    rows = 0
    combos = 0
    paths = sorted((spec_dir / "tables").glob("*.yaml"))
    for path in paths:
        name = path.stem
        document = spec_pkg.load_yaml(path)
        where = f"tables/{path.name}"
        if not isinstance(document, dict):
            report.problems.append(f"{where}: not a mapping")
            continue
        if document.get("id") != name:
            report.problems.append(f"{where}: id {document.get('id')!r} should be {name!r}")
        fallback = "tables/decision_table" if document.get("kind") == "decision" else CATALOGUE_SCHEMA
        ref = TABLE_SCHEMAS.get(name, fallback)
        found = _errors(_validator(spec_dir, ref), document, where)
        report.problems.extend(found)
        if found or document.get("kind") != "decision":
            continue
        table = DecisionTable(document)
        report.problems.extend(f"{where}: {p}" for p in table.problems())
        rows += len(table.rows)
        combos += sum(1 for _ in table.combinations())
        for row in table.rows:
            for req in row.requirements:
                if req not in requirement_ids:
                    report.problems.append(f"{where}: row {row.id} names unknown requirement {req}")
            if name == "outbox":
                for effect in row.then.get("effects", ()):
                    if effect not in known_effects:
                        report.problems.append(f"{where}: row {row.id} names effect {effect!r} the core does not know")
    report.counts["tables"] = f"{len(paths)} tables, {rows} decision rows covering {combos} input combinations"


def check_error_codes(spec_dir: Path, openapi: dict[str, Any] | None, report: Report) -> None:
    if openapi is None:
        return
    codes = set(spec_pkg.load_yaml(spec_dir / "tables" / "errors.yaml")["codes"])
    enum = set(openapi.get("components", {}).get("schemas", {}).get("ErrorCode", {}).get("enum", []))
    for code in sorted(codes - enum):
        report.problems.append(f"openapi.yaml: ErrorCode enum lacks {code} (tables/errors.yaml)")
    for code in sorted(enum - codes):
        report.problems.append(f"openapi.yaml: ErrorCode {code} is not in tables/errors.yaml")


@functools.cache
def _test_names(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return frozenset(
        node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    )


def test_exists(test_id: str, repo_root: Path, conformance_cases: Callable[[], set[str]]) -> bool:
    """True when a registry test id names an existing pytest function or conformance case."""
    if test_id.startswith("conformance::"):
        return test_id.removeprefix("conformance::") in conformance_cases()
    match = TEST_ID.match(test_id)
    if match is None:
        return False
    path = repo_root / match["path"]
    return path.is_file() and match["name"] in _test_names(path)


def _conformance_cases(repo_root: Path, report: Report) -> set[str]:
    """The case ids in ``conformance/case_ids.json``; a missing or unreadable file is one problem and no cases."""
    path = repo_root / CASE_IDS
    if not path.is_file():
        report.problems.append(f"{CASE_IDS.as_posix()}: missing (run `meshconform list --write`)")
        return set()
    try:
        return set(spec_pkg.load_json(path)["cases"])
    except (ValueError, KeyError, TypeError) as exc:
        report.problems.append(f"{CASE_IDS.as_posix()}: not a list of case ids ({exc!r}); run `meshconform list "
                               "--write`")
        return set()


def check_requirements(spec_dir: Path, repo_root: Path, report: Report) -> set[str]:
    path = spec_dir / "requirements.yaml"
    document = spec_pkg.load_yaml(path)
    report.problems.extend(_errors(_validator(spec_dir, "tables/requirements"), document, "requirements.yaml"))
    requirements = document.get("requirements", []) if isinstance(document, dict) else []
    ids = [r.get("id") for r in requirements]
    for dup in sorted({i for i in ids if ids.count(i) > 1}):
        report.problems.append(f"requirements.yaml: duplicate id {dup}")
    errata = set(re.findall(r"^## (E-\d{2})\b", (spec_dir / "ERRATA.md").read_text(encoding="utf-8"), re.M))
    baseline = load_baseline(spec_dir)
    blackbox_baseline = load_blackbox_baseline(spec_dir)
    cases = functools.cache(lambda: _conformance_cases(repo_root, report))
    untested_musts = []
    awaiting_case = []
    linked = 0
    for req in requirements:
        source = str(req.get("source", ""))
        if source.startswith("errata:") and source.removeprefix("errata:") not in errata:
            report.problems.append(f"requirements.yaml: {req['id']} cites {source}, not in ERRATA.md")
        report.problems.extend(f"requirements.yaml: {req.get('id')}: {p}" for p in _provenance_problems(req))
        existing = []
        for test_id in req.get("tests", []):
            if test_exists(test_id, repo_root, cases):
                existing.append(test_id)
            else:
                report.problems.append(f"requirements.yaml: {req['id']}: test {test_id} does not exist")
        linked += len(existing)
        if req.get("level") == "MUST" and not existing:
            untested_musts.append(req["id"])
            if req["id"] not in baseline:
                report.problems.append(f"requirements.yaml: MUST {req['id']} has no test")
        if is_blackbox_must(req) and not any(t.startswith("conformance::") for t in existing):
            awaiting_case.append(req["id"])
            if req["id"] not in blackbox_baseline:
                report.problems.append(
                    f"requirements.yaml: black-box-checkable MUST {req['id']} has no conformance case "
                    "(add one, or list it in blackbox_baseline.yaml)")
    for rid in sorted(set(baseline) - set(untested_musts)):
        if rid in ids:
            report.problems.append(f"coverage_baseline.yaml: {rid} now has a test; remove it from the baseline")
        else:
            report.problems.append(f"coverage_baseline.yaml: {rid} is not a requirement")
    by_id = {r.get("id"): r for r in requirements}
    for rid in sorted(set(blackbox_baseline) - set(awaiting_case)):
        if rid not in by_id:
            report.problems.append(f"blackbox_baseline.yaml: {rid} is not a requirement")
        elif not is_blackbox_must(by_id[rid]):
            report.problems.append(f"blackbox_baseline.yaml: {rid} is not a black-box-checkable MUST; remove it")
        else:
            report.problems.append(f"blackbox_baseline.yaml: {rid} now has a conformance case; remove it from the "
                                   "baseline")
    levels = {lvl: sum(1 for r in requirements if r.get("level") == lvl) for lvl in ("MUST", "SHOULD", "MAY")}
    report.counts["requirements"] = (
        f"{len(requirements)} requirements ({levels['MUST']} MUST, {levels['SHOULD']} SHOULD, {levels['MAY']} MAY), "
        f"{linked} test links, {len(untested_musts)} MUSTs awaiting tests (coverage baseline)"
    )
    report.counts["provenance"] = _provenance_counts(requirements, len(awaiting_case))
    return {i for i in ids if isinstance(i, str)}


def is_blackbox_must(req: dict[str, Any]) -> bool:
    """A MUST that a black-box harness can check (``blackbox: true``)."""
    return req.get("level") == "MUST" and req.get("blackbox") is True


def _provenance_problems(req: dict[str, Any]) -> list[str]:
    """What is wrong with a requirement's source, cite, subject and blackbox (the schema says it too, by index)."""
    found = []
    source, cite = req.get("source"), req.get("cite")
    if source == "spec" and not cite:
        found.append("source spec needs a cite: the spec's sentence it rests on (else it is an erratum's or openapi)")
    if cite and source != "spec":
        found.append(f"only a spec requirement carries a cite (source is {source}; a decision is cited by its source)")
    if isinstance(cite, dict) and not CITE_REF.match(str(cite.get("ref", ""))):
        found.append(f"cite ref {cite.get('ref')!r} is not `v<round> §<section>[, §<section>]`")
    if not req.get("subject"):
        found.append("no subject (daemon, broker, sdk)")
    blackbox = req.get("blackbox")
    if blackbox is None:
        found.append("no blackbox (true, or why a black-box harness cannot check it)")
    elif blackbox is not True and not (isinstance(blackbox, str) and blackbox.strip()):
        found.append(f"blackbox is {blackbox!r}: true, or the reason a black-box harness cannot check it")
    return found


def _provenance_counts(requirements: list[dict[str, Any]], awaiting_case: int) -> str:
    sources = [str(r.get("source", "")) for r in requirements]
    spec = sum(1 for s in sources if s == "spec")
    errata = sum(1 for s in sources if s.startswith("errata:"))
    openapi = sum(1 for s in sources if s == "openapi")
    musts = [r for r in requirements if is_blackbox_must(r)]
    daemon = sum(1 for r in musts if "daemon" in r.get("subject", ()))
    broker = sum(1 for r in musts if "broker" in r.get("subject", ()))
    sdk = sum(1 for r in musts if "sdk" in r.get("subject", ()))
    opaque = sum(1 for r in requirements if isinstance(r.get("blackbox"), str))
    return (
        f"{spec} spec / {errata + openapi} profile ({errata} errata, {openapi} openapi); black-box-checkable MUSTs: "
        f"{daemon} daemon, {broker} broker, {sdk} sdk; {opaque} not black-box (with reasons); {awaiting_case} "
        "black-box MUSTs awaiting a conformance case (blackbox baseline)"
    )


def load_baseline(spec_dir: Path) -> dict[str, str]:
    """The coverage baseline: MUST ids allowed to have no test yet, each with what it awaits."""
    path = spec_dir / "coverage_baseline.yaml"
    if not path.exists():
        return {}
    document = spec_pkg.load_yaml(path) or {}
    return {entry["id"]: entry.get("awaits", "") for entry in document.get("untested", [])}


def load_blackbox_baseline(spec_dir: Path) -> dict[str, str]:
    """The black-box baseline: black-box-checkable MUST ids allowed to have no conformance case yet, each with what
    the case has to do."""
    path = spec_dir / "blackbox_baseline.yaml"
    if not path.exists():
        return {}
    document = spec_pkg.load_yaml(path) or {}
    return {entry["id"]: entry.get("awaits", "") for entry in document.get("no_conformance_case", [])}


def check_vectors(spec_dir: Path, report: Report, core: Core) -> None:
    try:
        from spec.tools import vectors
    except ImportError:
        report.problems.append("spec/tools/vectors.py: missing")
        return
    report.problems.extend(vectors.problems(core, spec_dir))
    counts = vectors.counts(spec_dir)
    report.counts["vectors"] = ", ".join(f"{n} {suite}" for suite, n in sorted(counts.items())) or "none"


def check_generated(spec_dir: Path, repo_root: Path, report: Report) -> None:
    from spec.tools import conformance_doc

    report.problems.extend(conformance_doc.problems(spec_dir, repo_root))
    try:
        from spec.tools import diagrams
    except ImportError:
        report.problems.append("spec/tools/diagrams.py: missing")
        return
    report.problems.extend(diagrams.problems(spec_dir))


def check_anchors(spec_dir: Path, repo_root: Path, report: Report) -> None:
    from spec.tools import anchors

    found = anchors.audit(spec_dir, repo_root)
    report.problems.extend(found.problems)
    report.counts["anchors"] = found.summary


def run(core: Core, spec_dir: Path = spec_pkg.SPEC_DIR, repo_root: Path | None = None) -> Report:
    """Run every check over ``spec_dir`` against ``core``; test ids resolve against ``repo_root`` (default: its
    parent)."""
    spec_dir = spec_dir.resolve()
    repo_root = (repo_root or spec_dir.parent).resolve()
    report = Report()
    openapi = check_openapi(spec_dir, report)
    check_schemas(spec_dir, report)
    requirement_ids = check_requirements(spec_dir, repo_root, report)
    check_tables(spec_dir, report, requirement_ids, core.KNOWN_EFFECTS)
    check_error_codes(spec_dir, openapi, report)
    check_vectors(spec_dir, report, core)
    check_generated(spec_dir, repo_root, report)
    check_anchors(spec_dir, repo_root, report)
    return report


def cli(argv: list[str], core: Core) -> int:
    """`meshd spec check [--spec-dir DIR] [--repo-root DIR] [--json]`."""
    parser = argparse.ArgumentParser(prog="meshd spec check", description=__doc__.splitlines()[0])
    parser.add_argument("--spec-dir", type=Path, default=spec_pkg.SPEC_DIR)
    parser.add_argument("--repo-root", type=Path, default=None)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    report = run(core, args.spec_dir, args.repo_root)
    if args.json:
        print(json.dumps({"ok": report.ok, "counts": report.counts, "problems": report.problems}, indent=2))
        return 0 if report.ok else 1
    for area, line in report.counts.items():
        print(f"{area:>13}: {line}")
    for problem in report.problems:
        print(f"FAIL {problem}")
    print("spec check: OK" if report.ok else f"spec check: {len(report.problems)} problem(s)")
    return 0 if report.ok else 1
