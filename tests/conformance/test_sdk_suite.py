"""`meshconform sdk` tested as bowtie tests its harness: the Python SDK (the reference subject) passes every SDK-*
requirement, and the naive miniature (fixtures/sdk/naive_driver.py) fails each one for its own reason; plus the
launch contract's edges (a bad template, a driver that writes nothing or garbage)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.sdk_target import SdkLaunchError, check_template, run_driver
from spec import load_yaml

REPO = Path(__file__).resolve().parents[2]
SDK_REQUIREMENTS = sorted(r["id"] for r in load_yaml(REPO / "spec" / "requirements.yaml")["requirements"]
                          if "sdk" in r["subject"])
NAIVE = f"{sys.executable} {REPO / 'fixtures' / 'sdk' / 'naive_driver.py'} {{scenario}} {{results}}"
#: why the miniature fails each requirement: words its failure detail must hold
NAIVE_REASONS = {
    "SDK-DISCOVER-CONNECT": "discover gave unix",
    "SDK-DISCOVER-CHECK": "the SDK chose unix",
    "SDK-DISCOVER-TCP": "over TCP with the token file",
    "SDK-TOKEN-REREAD": "invalid_bearer_token",
    "SDK-SAME-KEY": "the keys of the attempts",
    "SDK-RETRY-AFTER": "retried after 0.",
    "SDK-TYPED-CONFLICT": "'conflict': None",
    "SDK-NO-RETRY-REFUSED": "sends made",
    "SDK-EVENTS-RESUME": "got [1, 2, 3, 4, 5, 7, 8, 9, 10]",
    "SDK-INBOX-CURSOR": "got [1, 2, 3]",
}


def suite(tmp_path: Path, *launch: str) -> tuple[int, dict]:
    report_dir = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "conformance.cli", "sdk", "--quiet", "--report-dir", str(report_dir),
                           *launch], capture_output=True, text=True, timeout=600, cwd=REPO)
    return done.returncode, json.loads((report_dir / "report.json").read_text())


def verdicts(report: dict) -> dict[str, dict]:
    return {row["id"]: row for row in report["requirements"] if row["id"] in SDK_REQUIREMENTS}


def test_the_python_sdk_passes_every_sdk_requirement(tmp_path):
    code, report = suite(tmp_path)
    assert {k: v["verdict"] for k, v in verdicts(report).items()} == dict.fromkeys(SDK_REQUIREMENTS, "pass")
    assert code == 0 and report["target"] == "sdk reference"


def test_the_naive_miniature_fails_each_sdk_requirement_for_its_reason(tmp_path):
    assert set(NAIVE_REASONS) == set(SDK_REQUIREMENTS)  # a new requirement needs its miniature failure here
    code, report = suite(tmp_path, "--launch", NAIVE)
    rows = verdicts(report)
    assert {k: v["verdict"] for k, v in rows.items()} == dict.fromkeys(SDK_REQUIREMENTS, "fail")
    for requirement, words in NAIVE_REASONS.items():
        details = " ".join(e["detail"] for e in rows[requirement]["evidence"] if e["outcome"] == "fail")
        assert words in details, (requirement, details)
    assert code == 1
    assert all("meshconform sdk --launch" in case["replay"] for case in report["cases"])


def test_a_template_without_its_placeholders_is_refused():
    with pytest.raises(SdkLaunchError, match="placeholders"):
        check_template("driver {scenarios}")


def test_a_driver_that_writes_garbage_nothing_other_steps_or_hangs_fails_each_step_with_its_log(tmp_path):
    import time

    scenario = {"state_dir": str(tmp_path), "mesh": "m", "steps": [{"op": "version"}, {"op": "discover"}]}

    def missing(results: list[dict]) -> list[str]:
        assert [(r["step"], r["op"], r["ok"]) for r in results] == [(0, "version", False), (1, "discover", False)]
        assert all(r["error"]["kind"] == "missing" and "driver.log ends" in r["error"]["message"] for r in results)
        return [r["error"]["message"] for r in results]

    garbage = f"{sys.executable} -c \"import sys; open(sys.argv[1], 'w').write('not json')\" {{results}}"
    assert "results.jsonl:1" in missing(run_driver(garbage, scenario, tmp_path / "g", 20))[0]
    crash = f"{sys.executable} -c \"import sys; print('boom'); sys.exit(7)\""
    assert all("exited 7" in m and "boom" in m for m in missing(run_driver(crash, scenario, tmp_path / "c", 20)))
    (tmp_path / "other.py").write_text("import json, sys\nopen(sys.argv[1], 'w').write(json.dumps("
                                       "{'step': 5, 'op': 'discover', 'ok': True, 'value': {}}) + '\\n')\n")
    other = f"{sys.executable} {tmp_path / 'other.py'} {{results}}"
    assert "not step 0" in missing(run_driver(other, scenario, tmp_path / "o", 20))[0]
    started = time.monotonic()
    hang = f"{sys.executable} -c 'import subprocess, time; subprocess.Popen([\"sleep\", \"300\"]); time.sleep(60)'"
    assert all("outran 2 s" in m for m in missing(run_driver(hang, scenario, tmp_path / "s", 2)))
    assert time.monotonic() - started < 10  # killed at its timeout, with its whole group


def test_a_template_runs_where_meshconform_runs(tmp_path, monkeypatch):
    (tmp_path / "driver.py").write_text("import sys; open(sys.argv[1], 'w').write('')\n")
    monkeypatch.chdir(tmp_path)
    results = run_driver(f"{sys.executable} driver.py {{results}}", {"state_dir": str(tmp_path), "mesh": "m",
                                                                    "steps": [{"op": "version"}]}, tmp_path / "w", 20)
    assert "exited 0" in results[0]["error"]["message"]  # it ran (relative path) and wrote nothing
