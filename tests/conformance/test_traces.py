"""The TRC verdicts of a run (conformance/traces.py): every invariant's violation fails it, in its part, located.

Two layers. The judging itself, on generated traces written out as JSONL (cheap): each injection kind of the catalogue
fails exactly its invariant, naming its key and the file and line of the violating event; a clean trace passes what it
exercises; invalid input fails TRC-INPUT-VALID and judges nothing else; a trace without broker events leaves the
broker invariants not judged, saying why; a target that writes nothing, or was not launched, is not judged at all.
And two short `meshconform run`s (one case each): a launch wrapper that plants a fingerprint change (spec) and a seq
going back (profile) in the reference's trace gets exactly those TRC verdicts failed, and the reference launched
without `{trace_dir}` gets every TRC verdict "not judged". The full reference run's verdicts are held in
test_harness.py (its one shared run).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import traces
from conformance.launch import REFERENCE_TEMPLATE, REFERENCE_TRACED_TEMPLATE
from spark_checks import format as fmt
from spark_checks.catalogue import CATALOGUE
from spark_checks.generate import Params, generate
from spec import SPEC_DIR, load_yaml, validator

REPO = SPEC_DIR.parent
SCRIPTED_BROKER = ("broker", "the harness's scripted broker writes no trace")
REGISTRY = {r["id"]: r for r in load_yaml(SPEC_DIR / "requirements.yaml")["requirements"]}


def generated(root: Path, name: str, inject: tuple[str, ...] = (), seed: int = 7, events: int = 3000
              ) -> tuple[Path, dict]:
    """A small generated trace written as JSONL, one file per node, into ``root/name`` (an instance's directory)."""
    manifest = generate(root / f"{name}.parquet", Params(events=events, daemons=8, seed=seed, inject=inject,
                                                         fault_rate=0.3), workers=1)
    fmt.write_jsonl(root / f"{name}.parquet", root / name)
    return root / name, manifest


def judged(root: Path, *names: str, silent: tuple[str, str] = SCRIPTED_BROKER) -> dict:
    section = traces.judge(traces.TraceSource(True, silent, {n: root / n for n in names}), root, kept=True)
    validator("report/conformance_report").evolve(
        schema={"$ref": "https://meshspec.dev/schemas/report/conformance_report.json#/properties/traces"}
    ).validate(section)
    return section


def rows(section: dict) -> dict[str, dict]:
    return {row["id"]: row for row in section["invariants"]}


def event_at(root: Path, where: str) -> dict:
    path, _, number = where.rpartition(":")
    return json.loads((root / path).read_text(encoding="utf-8").splitlines()[int(number) - 1])


def spec_kind(invariant) -> str:
    own = [REGISTRY[r] for r in invariant.requirements]
    return "spec" if own and all(r["source"] == "spec" for r in own) and not invariant.errata else "profile"


@pytest.mark.parametrize("invariant", CATALOGUE, ids=lambda inv: inv.id)
def test_each_injected_violation_fails_its_invariant_in_its_part_at_its_line(tmp_path, invariant):
    # a hook run is unfinished only once its daemon traced 40 s past its enqueue: 3000 events span about 22 s
    events = 6000 if invariant.id == "TRC-HOOK-RUN-FINISHED" else 3000
    _, manifest = generated(tmp_path, "main", (invariant.injection,), events=events)
    section = judged(tmp_path, "main")
    found = rows(section)
    assert {i for i, row in found.items() if row["verdict"] == "fail"} == {invariant.id}
    assert section["verdict"] == "fail" and found["TRC-INPUT-VALID"]["verdict"] == "pass"
    row = found[invariant.id]
    assert row["kind"] == spec_kind(invariant) and row["level"] == "MUST"
    assert row["protects"] == list(invariant.requirements) and row["errata"] == list(invariant.errata)
    assert [r for r in invariant.requirements if r not in row["cite"]] == []
    assert row["violations"] == len(manifest["injections"]) == 1
    evidence = row["evidence"][0]
    assert evidence["key"] == manifest["injections"][0]["key"]
    assert evidence["where"].startswith("main/") and evidence["where"] in evidence["events"]
    violating = event_at(tmp_path, evidence["where"])
    assert {name: str(violating[name]) for name in invariant.key} == evidence["key"]


def test_the_part_follows_what_an_invariant_protects():
    parts = {row["id"]: row["kind"] for row in traces.not_judged("a test")["invariants"]}
    assert parts["TRC-SEQ-MONOTONIC"] == "profile", "E-28 only: never a spec violation"
    assert parts["TRC-OUTBOX-LEGAL"] == "profile", "its legal transitions include E-14 and E-17 rows"
    assert parts["TRC-EVENT-IDS-MONOTONIC"] == parts["TRC-MAX-AGE"] == "profile"
    assert parts["TRC-FP-FROZEN"] == parts["TRC-ONE-MESSAGE"] == parts["TRC-ID-NEVER-FREED"] == "spec"
    assert parts["TRC-INPUT-VALID"] == "profile", "the trace format is meshspec's"
    assert {i: k for i, k in parts.items() if i != "TRC-INPUT-VALID"} == {inv.id: spec_kind(inv) for inv in CATALOGUE}


def test_a_clean_trace_passes_every_invariant_it_exercises(tmp_path):
    generated(tmp_path, "main")
    section = judged(tmp_path, "main")
    assert section["verdict"] == "pass" and section["sources"] == ["broker", "daemon"]
    assert section["instances"] == ["main"] and section["invalid"] == {"count": 0, "lines": []}
    assert {row["id"]: row["verdict"] for row in section["invariants"]} == {
        "TRC-INPUT-VALID": "pass", **{inv.id: "pass" for inv in CATALOGUE}}


def test_without_broker_events_the_broker_invariants_are_not_judged_and_say_why(tmp_path):
    directory, _ = generated(tmp_path, "main")
    for path in directory.glob("broker-*.jsonl"):
        path.unlink()
    found = rows(judged(tmp_path, "main"))
    for invariant in CATALOGUE:
        if "broker" in invariant.needs:
            assert found[invariant.id]["verdict"] == "not_judged"
            assert found[invariant.id]["reason"] == ("not judged: the trace has no broker events (the harness's "
                                                     "scripted broker writes no trace)")
        else:
            assert found[invariant.id]["verdict"] == "pass", invariant.id


def test_instances_are_checked_apart_and_located_by_instance(tmp_path):
    generated(tmp_path, "main")
    generated(tmp_path, "fresh", ("duplicate_inbox_row",), seed=11)
    section = judged(tmp_path, "main", "fresh")
    assert section["instances"] == ["main", "fresh"]
    row = rows(section)["TRC-ONE-INBOX-ROW"]
    assert row["verdict"] == "fail" and row["evidence"][0]["where"].startswith("fresh/")


def test_invalid_input_fails_its_own_verdict_naming_the_line_and_judges_nothing_else(tmp_path):
    directory, _ = generated(tmp_path, "main", ("fingerprint_changed",))
    path = sorted(directory.glob("daemon-*.jsonl"))[0]
    lines = path.read_text(encoding="utf-8").splitlines()
    event = json.loads(lines[4])
    event["seq"] = str(event["seq"])
    lines[4] = json.dumps(event)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    section = judged(tmp_path, "main")
    found = rows(section)
    assert section["verdict"] == "fail" and section["invalid"]["count"] == 1
    assert found["TRC-INPUT-VALID"]["verdict"] == "fail" and found["TRC-INPUT-VALID"]["violations"] == 1
    assert f"main/{path.name}:5" in found["TRC-INPUT-VALID"]["reason"]
    assert section["invalid"]["lines"][0]["where"] == f"main/{path.name}:5"
    assert {row["verdict"] for i, row in found.items() if i != "TRC-INPUT-VALID"} == {"not_judged"}
    assert found["TRC-FP-FROZEN"]["reason"] == "not judged: the trace holds 1 invalid line(s) (TRC-INPUT-VALID)"


def test_a_target_that_writes_nothing_or_was_not_launched_is_not_judged(tmp_path):
    (tmp_path / "main").mkdir()
    silent = judged(tmp_path, "main")
    assert silent["verdict"] == "not_judged" and silent["events"] == 0
    assert {(row["verdict"], row["reason"]) for row in silent["invariants"]} == {
        ("not_judged", "not judged: the target emits no traces (it wrote nothing to {trace_dir})")}
    unlaunched = traces.judge(traces.TraceSource(False, SCRIPTED_BROKER), None, kept=False)
    assert {row["verdict"] for row in unlaunched["invariants"]} == {"not_judged"}
    assert unlaunched["reason"].startswith("not judged: the harness did not launch the target")


# --- through meshconform run ----------------------------------------------------------------------------------------

def meshconform_run(template: str, out: Path) -> tuple[subprocess.CompletedProcess, dict]:
    result = subprocess.run([sys.executable, "-m", "conformance.cli", "run", "--launch", template, "--select",
                             "ipc.id.precedence", "--report-dir", str(out), "--seed", "3", "--quiet"],
                            capture_output=True, text=True, timeout=300, check=False, cwd=REPO)
    return result, json.loads((out / "report.json").read_text(encoding="utf-8"))


def test_a_run_whose_trace_has_planted_violations_fails_those_invariants_in_their_parts(tmp_path):
    template = f"{sys.executable} -m tests.conformance.planted fingerprint,seq -- {REFERENCE_TRACED_TEMPLATE}"
    result, report = meshconform_run(template, tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    validator("report/conformance_report").validate(report)
    planted = {p["invariant"]: p for p in json.loads((tmp_path / "trace" / "main.planted.json").read_text())}
    assert set(planted) == {"TRC-FP-FROZEN", "TRC-SEQ-MONOTONIC"}
    found = rows(report["traces"])
    assert {i for i, row in found.items() if row["verdict"] == "fail"} == set(planted)
    for invariant, where in planted.items():
        evidence = found[invariant]["evidence"][0]
        assert (evidence["key"], evidence["where"]) == (planted[invariant]["key"], where["where"])
    assert found["TRC-FP-FROZEN"]["kind"] == "spec" and found["TRC-FP-FROZEN"]["protects"] == ["FP-FROZEN",
                                                                                               "REQUEUE-ATOMIC"]
    assert found["TRC-SEQ-MONOTONIC"]["kind"] == "profile" and found["TRC-SEQ-MONOTONIC"]["errata"] == ["E-28"]
    summary = report["summary"]
    assert (summary["spec"]["must_failures"], summary["profile"]["must_failures"]) == (1, 1)
    assert summary["spec"]["invariants"]["fail"] == summary["profile"]["invariants"]["fail"] == 1
    assert {r["id"]: r["verdict"] for r in report["requirements"] if r["verdict"] != "not_checked"} == {
        "IPC-ID-PRECEDENCE": "pass"}, "the black-box verdicts are the reference's"
    assert "FAIL TRC-FP-FROZEN (MUST, spec, trace)" in result.stderr
    junit = (tmp_path / "junit.xml").read_text(encoding="utf-8")
    assert 'name="meshconform.traces"' in junit and 'classname="meshconform.traces.spec.MUST" name="TRC-FP-FROZEN"' \
        in junit


def test_a_run_whose_target_writes_no_trace_judges_no_invariant(tmp_path):
    result, report = meshconform_run(REFERENCE_TEMPLATE, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert report["traces"]["verdict"] == "not_judged" and report["traces"]["events"] == 0
    assert {(row["verdict"], row["reason"]) for row in report["traces"]["invariants"]} == {
        ("not_judged", "not judged: the target emits no traces (it wrote nothing to {trace_dir})")}
    spec_invariants = sum(spec_kind(inv) == "spec" for inv in CATALOGUE)
    assert report["summary"]["spec"]["invariants"] == {"pass": 0, "fail": 0, "not_judged": spec_invariants}
    assert "trace checks: not judged: the target emits no traces" in result.stderr
