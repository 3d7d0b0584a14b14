"""meshconform itself: verdicts, exit codes, reports, selection, skips that are never passes, plugin mode."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conformance import registry
from conformance.launch import REFERENCE_TEMPLATE, Launched
from conformance.peer import ScriptedBroker
from spark_checks.catalogue import CATALOGUE
from spec import SPEC_DIR, load_yaml, validator

REPO = SPEC_DIR.parent


def meshconform(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conformance.cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, cwd=REPO)


@pytest.fixture(scope="module")
def full_run(reference_conformance_run):
    """One full default run against the reference (the README's main job; shared with the trace checks)."""
    result, reports, _ = reference_conformance_run
    return result, reports


def test_reference_passes_every_must(full_run):
    result, reports = full_run
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((reports / "report.json").read_text())
    validator("report/conformance_report").validate(report)
    assert report["summary"]["verdict"] == "pass" and report["summary"]["must_failures"] == 0
    assert report["summary"]["cases"]["failed"] == report["summary"]["cases"]["error"] == 0
    checked = {r["id"] for r in report["requirements"] if r["verdict"] == "pass"}
    assert {"IPC-CONFLICT-NO-MUTATION", "REC-NO-LOSS", "NEG-CLOSE-4010", "API-CONFORMS",
            "ERR-NO-5XX-ON-BAD-INPUT", "SSE-REPLAY"} <= checked
    assert report["summary"]["spec"]["verdict"] == report["summary"]["profile"]["verdict"] == "pass"


def test_the_reference_trace_passes_every_applicable_invariant(full_run):
    """Every instance the run launched traced into its {trace_dir}; the oracle passes every invariant the daemon
    suite's trace can exercise, and the broker-relating ones are not judged (the scripted broker writes no trace)."""
    _, reports = full_run
    report = json.loads((reports / "report.json").read_text())
    section = report["traces"]
    assert section["verdict"] == "pass" and section["sources"] == ["daemon"]
    assert section["invalid"] == {"count": 0, "lines": []} and section["directory"] == str(reports / "trace")
    assert "main" in section["instances"]
    assert sorted(section["instances"]) == sorted(p.name for p in (reports / "trace").iterdir() if p.is_dir()
                                                  and any(f.stat().st_size for f in p.glob("*.jsonl")))
    verdicts = {row["id"]: (row["verdict"], row["reason"]) for row in section["invariants"]}
    assert verdicts.pop("TRC-INPUT-VALID")[0] == "pass"
    assert verdicts == {
        inv.id: ("not_judged", "not judged: the trace has no broker events (the harness's scripted broker writes "
                               "no trace)") if "broker" in inv.needs else ("pass", verdicts[inv.id][1])
        for inv in CATALOGUE}
    counted = {kind: sum(row["kind"] == kind and row["verdict"] == "pass" for row in section["invariants"])
               for kind in ("spec", "profile")}
    assert {kind: report["summary"][kind]["invariants"]["pass"] for kind in counted} == counted


def test_reports_are_well_formed(full_run):
    _, reports = full_run
    suites = ET.parse(reports / "junit.xml").getroot()
    assert suites.tag == "testsuites"
    assert [s.get("name") for s in suites] == ["meshconform.spec", "meshconform.profile", "meshconform.traces"]
    cases = [c for s in suites[:2] for c in s.iter("testcase")]
    checked = [r for r in json.loads((reports / "report.json").read_text())["requirements"]
               if r["verdict"] != "not_checked"]
    assert len(cases) == len(checked)
    assert [c.get("name") for c in suites[2].iter("testcase")] == ["TRC-INPUT-VALID", *(i.id for i in CATALOGUE)]
    assert all(c.find("properties") is not None for c in cases)
    page = (reports / "report.html").read_text()
    assert page.startswith("<!doctype html>") and "<script" not in page
    assert "src=" not in page and "href=" not in page, "the HTML report must be one self-contained file"
    assert "| Requirement | Level | Verdict |" in (reports / "report.md").read_text()
    assert "| Invariant | Part | Level | Verdict | Protects | Reason |" in (reports / "report.md").read_text()


def test_every_registered_case_ran(full_run):
    _, reports = full_run
    ran = {c["id"] for c in json.loads((reports / "report.json").read_text())["cases"]}
    assert ran == {c.id for c in registry.cases(registry.CASES_DIR)}


def test_select_by_requirement_and_replay_command(tmp_path):
    result = meshconform("run", "--select", "IPC-ID-PRECEDENCE", "--report-dir", str(tmp_path), "--seed", "3",
                         "--quiet")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert [c["id"] for c in report["cases"]] == ["ipc.id.precedence"]
    assert report["cases"][0]["replay"] == "meshconform run --target reference --select ipc.id.precedence --seed 3"


def test_unreachable_target_is_a_harness_error(tmp_path):
    result = meshconform("run", "--target", f"unix://{tmp_path}/nothing.sock", "--report-dir", str(tmp_path),
                         "--quiet")
    assert result.returncode == 2
    assert "cannot reach" in result.stderr


def test_external_target_without_broker_or_launch_skips_never_passes(tmp_path):
    """A daemon connected elsewhere: broker-scripted and restart cases skip with a reason, and skip is not pass."""
    with ScriptedBroker() as elsewhere:
        daemon = Launched(REFERENCE_TEMPLATE, tmp_path / "d", elsewhere.url).start()
        try:
            result = meshconform("run", "--target", f"unix://{daemon.socket_path}", "--report-dir",
                                 str(tmp_path / "r"), "--select", "ipc.lookup.row", "--select", "recovery.",
                                 "--select", "ipc.id.precedence", "--quiet")
        finally:
            daemon.stop()
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    outcomes = {c["id"]: c for c in report["cases"]}
    assert outcomes["ipc.lookup.row"]["outcome"] == "skipped"
    assert "scripted broker" in outcomes["ipc.lookup.row"]["detail"]
    assert outcomes["recovery.kill9_inflight"]["outcome"] == "skipped"
    assert "launch template" in outcomes["recovery.kill9_inflight"]["detail"]
    assert outcomes["ipc.id.precedence"]["outcome"] == "passed"
    verdicts = {r["id"]: r["verdict"] for r in report["requirements"]}
    assert verdicts["REC-NO-LOSS"] == "skip" and verdicts["IPC-PENDING-MATCH"] == "skip"
    assert result.returncode == 0


def test_plugin_mode(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "conformance.plugin", "-p", "no:cacheprovider",
                             str(registry.CASES_DIR), "-q", "-o", "addopts=", "--meshspec-select=ipc.id.minted",
                             f"--meshspec-report-dir={tmp_path}"], capture_output=True, text=True, cwd=REPO,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-2000:]
    assert json.loads((tmp_path / "report.json").read_text())["summary"]["verdict"] == "pass"


def test_registry_cases_name_known_requirements():
    known = {r["id"] for r in load_yaml(SPEC_DIR / "requirements.yaml")["requirements"]}
    for info in registry.cases():
        assert set(info.requirements) <= known, info
    assert len(set(registry.case_ids())) == len(registry.case_ids())


def test_list_command():
    result = meshconform("list", "--json")
    assert {c["id"] for c in json.loads(result.stdout)} == set(registry.case_ids())


def test_conformance_doc_records_the_reference(tmp_path):
    recorded = Path(REPO / "conformance" / "reference-results.json")
    if recorded.exists():
        data = json.loads(recorded.read_text())
        assert {r["id"] for r in data["requirements"]} == {
            r["id"] for r in load_yaml(SPEC_DIR / "requirements.yaml")["requirements"]}


def test_broker_suite_against_the_reference_broker_on_sqlite(tmp_path):
    result = meshconform("broker", "--report-dir", str(tmp_path), "--seed", "5", "--quiet")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    validator("report/conformance_report").validate(report)
    passed = {r["id"] for r in report["requirements"] if r["verdict"] == "pass"}
    assert {"BRK-HELLO-AUTH", "BRK-ADVERTISE", "BRK-ATOMIC", "BRK-CONCURRENT-ONE-MESSAGE", "BRK-B1-NO-WRITE",
            "BRK-B2-ROLLBACK", "BRK-REDELIVER"} <= passed
    assert {c["id"] for c in report["cases"]} == {c.id for c in registry.cases(registry.BROKER_CASES_DIR)}
    section = report["traces"]
    assert section["verdict"] == "pass" and section["instances"] == ["broker"] and section["sources"] == ["broker"]
    verdicts = {row["id"]: (row["verdict"], row["reason"]) for row in section["invariants"]}
    assert verdicts.pop("TRC-INPUT-VALID")[0] == "pass"
    assert verdicts == {
        inv.id: ("not_judged", "not judged: the trace has no daemon events (the harness's members write no trace)")
        if "daemon" in inv.needs else ("pass", verdicts[inv.id][1]) for inv in CATALOGUE}


@pytest.mark.postgres
def test_broker_suite_against_the_reference_broker_on_postgresql(tmp_path):
    from reference.broker.pgcluster import PgCluster, find_bindir

    if find_bindir() is None:
        pytest.skip("no PostgreSQL server binaries on this machine")
    with PgCluster() as cluster:
        dsn = cluster.dsn
        template = (f"{sys.executable} -m reference.cli broker serve --store {dsn} --listen 127.0.0.1:{{port}} "
                    "--dev --lease-s 1.0 --inline-bytes 65536")
        result = meshconform("broker", "--launch", template, "--store-dsn", dsn, "--report-dir", str(tmp_path),
                             "--quiet")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["summary"]["cases"]["skipped"] == 0


def test_the_reference_launched_by_a_template_declares_what_it_reads(tmp_path):
    """Launched through ``--launch`` (the harness does not know it is the reference), meshd writes its target
    description: the harness then times it by the config.toml it wrote and uses the clock hook -- not the spec's
    defaults, which would fail the reference's own reconnect and retry schedules."""
    from conformance import timing as timing_mod
    from conformance.target import HARNESS_CONFIG, Target

    target = Target("reference", template=REFERENCE_TEMPLATE, workdir=tmp_path)
    try:
        target.start()
        assert target.spec == "launch" and not target.is_reference
        assert target.reads_config and target.clock_hook
        declared = target.launched.description.get("timing")
        assert not list(validator("harness/target").iter_errors(target.launched.description.raw))
        for key, value in timing_mod.from_config_toml(HARNESS_CONFIG).items():
            assert declared[key] == value and getattr(target.timing, key) == value, key
        assert target.timing.reconnect_initial_ms == 100 and target.timing.retry_base_ms == 100
    finally:
        target.close()
