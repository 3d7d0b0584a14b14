"""CONFORMANCE.md: the spec's requirements and meshspec's profile in two tables, each row with what it rests on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

import spec as spec_pkg
from spec.tools import conformance_doc

REGISTRY = spec_pkg.load_yaml(spec_pkg.SPEC_DIR / "requirements.yaml")["requirements"]
BY_ID = {r["id"]: r for r in REGISTRY}
REPO = spec_pkg.SPEC_DIR.parent
DOC = conformance_doc.render()
SPEC_PART = DOC[DOC.index("### The spec's requirements"):DOC.index("### meshspec's profile")]
PROFILE_PART = DOC[DOC.index("### meshspec's profile"):]


def row(part: str, rid: str) -> str:
    return next(line for line in part.splitlines() if line.startswith(f"| `{rid}` |"))


def test_the_generated_file_is_current():
    assert conformance_doc.problems() == []


def test_spec_and_profile_requirements_are_in_separate_tables():
    for req in REGISTRY:
        part, other = (SPEC_PART, PROFILE_PART) if req["source"] == "spec" else (PROFILE_PART, SPEC_PART)
        assert f"| `{req['id']}` |" in part, req["id"]
        assert f"| `{req['id']}` |" not in other, req["id"]


def test_a_spec_row_quotes_its_citation():
    line = row(SPEC_PART, "FP-PREFIX-409")
    assert "**v0.9.0 §4.5.1**: “Every `409` carries the daemon's `request_fingerprint` (8-byte hex prefix)" in line


def test_a_profile_row_names_its_erratum_and_title_or_the_openapi_shape():
    assert "| E-26 — Which fingerprint a 409 names |" in row(PROFILE_PART, "FP-PREFIX-409-WHICH")
    assert "| OpenAPI shape (`spec/openapi.yaml`) |" in row(PROFILE_PART, "IPC-NEW-ROW-BODY")


def test_errata_titles_come_from_the_headings():
    titles = conformance_doc.errata_titles(spec_pkg.SPEC_DIR)
    assert len(titles) >= 35 and titles["E-27"].startswith("Host and bearer checks apply to TCP")
    for req in REGISTRY:
        if req["source"].startswith("errata:"):
            assert req["source"].removeprefix("errata:") in titles, req["id"]


def copied_spec(tmp_path: Path) -> Path:
    target = tmp_path / "repo" / "spec"
    shutil.copytree(spec_pkg.SPEC_DIR, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def edit_yaml(path: Path, change) -> None:
    document = yaml.safe_load(path.read_text())
    change(document)
    path.write_text(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))


def test_black_box_column_gives_the_reason_or_the_missing_case(tmp_path):
    assert f"| no: {BY_ID['AUTH-CONSTANT-TIME']['blackbox']} |" in row(PROFILE_PART, "AUTH-CONSTANT-TIME")
    assert "| yes |" in row(SPEC_PART, "IPC-NEW-ROW")
    spec_dir = copied_spec(tmp_path)  # a black-box MUST whose case is still awaited (listed in the baseline)
    edit_yaml(spec_dir / "requirements.yaml", lambda d: [
        r.__setitem__("tests", [t for t in r["tests"] if not t.startswith("conformance::")])
        for r in d["requirements"] if r["id"] == "LIMIT-INFLIGHT"])
    edit_yaml(spec_dir / "blackbox_baseline.yaml", lambda d: d["no_conformance_case"].append(
        {"id": "LIMIT-INFLIGHT", "awaits": "a case"}))
    doc = conformance_doc.render(spec_dir, REPO)
    assert "| yes (no conformance case yet) |" in row(doc[doc.index("### The spec's"):], "LIMIT-INFLIGHT")


def test_angle_brackets_outside_code_spans_are_escaped():
    line = row(SPEC_PART, "REC-INBOX-QUARANTINE")
    assert "inbox.db.corrupt-&lt;ts>, recreated" in line  # prose: escaped, or Markdown reads an HTML tag
    assert "`inbox.db.corrupt-<ts>`" in line  # a code span shows its text as it is


def test_a_requirement_without_a_recorded_run_is_not_yet_run(tmp_path):
    results = tmp_path / "conformance" / "reference-results.json"
    results.parent.mkdir()
    recorded = json.loads((REPO / "conformance" / "reference-results.json").read_text())
    recorded["requirements"] = [r for r in recorded["requirements"] if r["id"] != "IPC-NEW-ROW-BODY"]
    results.write_text(json.dumps(recorded))
    doc = conformance_doc.render(spec_pkg.SPEC_DIR, tmp_path)
    assert row(doc[doc.index("### meshspec's profile"):], "IPC-NEW-ROW-BODY").endswith("| not yet run |")


def test_a_row_names_the_files_that_enforce_it():
    assert "| `reference/daemon/guard.py` | pass |" in row(SPEC_PART, "AUTH-BEARER")


def test_the_implementation_column_comes_from_the_anchors(tmp_path):
    (tmp_path / "reference" / "daemon").mkdir(parents=True)
    (tmp_path / "reference" / "daemon" / "guard.py").write_text("X = 1  # req: AUTH-BEARER, AUTH-UDS-MODE\n")
    (tmp_path / "reference" / "app.py").write_text("# req: AUTH-BEARER -- and here\nY = 2\n")
    doc = conformance_doc.render(spec_pkg.SPEC_DIR, tmp_path)
    spec_part = doc[doc.index("### The spec's"):doc.index("### meshspec's profile")]
    assert "| `reference/app.py`<br>`reference/daemon/guard.py` | not yet run |" in row(spec_part, "AUTH-BEARER")
    assert "| `reference/daemon/guard.py` | not yet run |" in row(spec_part, "AUTH-UDS-MODE")
    assert row(spec_part, "AUTH-HOST").endswith("| — | not yet run |")
