"""The recorded upstream runs (fixtures/interop/): the interop document is generated from them, and the check CI runs
(`make interop-check`) names every verdict that moved."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[2] / "fixtures" / "interop"


@pytest.fixture(scope="module")
def interop():
    spec = importlib.util.spec_from_file_location("interop_run", HERE / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_interop_document_is_generated_from_the_recorded_reports(interop):
    assert (HERE / "README.md").read_text(encoding="utf-8") == interop.document(), \
        "fixtures/interop/README.md is stale: python fixtures/interop/run.py --document-only"


@pytest.mark.parametrize("build", ["1.21.1", "1.37.0"])
def test_each_recorded_build_ended_in_verdicts_and_judged_most_daemon_requirements(interop, build):
    report = json.loads((HERE / build / "report.json").read_text(encoding="utf-8"))
    assert report["summary"]["exit_code"] == 1
    assert report["harness_errors"] == []
    assert all(r["verdict"] != "error" for r in report["requirements"])
    document = interop.document()
    section = document.split(f"## claudemesh-cli {build}", 1)[1]
    judged, total = (int(n) for n in section.split("A pass or fail verdict for ", 1)[1].split(" black-box")[0]
                     .split(" of the "))
    assert judged / total >= 0.9
    for row in report["requirements"]:
        if row["verdict"] == "fail":
            assert row["cite"], f"{row['id']} fails without citing what it violates"


def test_the_check_names_every_verdict_that_moved_and_a_changed_exit_code(interop):
    recorded = json.loads((HERE / "1.21.1" / "report.json").read_text(encoding="utf-8"))
    assert interop.check("1.21.1", recorded) == []
    fresh = copy.deepcopy(recorded)
    first, second = fresh["requirements"][0], fresh["requirements"][1]
    was_first, was_second = first["verdict"], second["verdict"]
    first["verdict"] = "skip" if was_first != "skip" else "pass"
    fresh["requirements"].remove(second)
    fresh["summary"]["exit_code"] = 0
    assert [m.split(" (")[0] for m in interop.check("1.21.1", fresh)] == [
        *sorted([f"{first['id']}: {was_first} -> {first['verdict']}", f"{second['id']}: {was_second} -> None"]),
        "exit code: 1 -> 0"]


def test_the_check_without_a_recording_says_how_to_make_one(interop):
    assert interop.check("0.0.0", {"requirements": [], "summary": {"exit_code": 0}}) == [
        "no recorded verdicts at fixtures/interop/0.0.0/report.json: record them with `make interop`"]


def test_a_moved_verdict_carries_the_fresh_runs_reason(interop):
    fresh = json.loads((HERE / "1.21.1" / "report.json").read_text(encoding="utf-8"))
    row = next(r for r in fresh["requirements"] if r["verdict"] == "pass")
    row.update(verdict="fail", reason="the broker received []")
    assert interop.check("1.21.1", fresh) == [f"{row['id']}: pass -> fail (the broker received [])"]
