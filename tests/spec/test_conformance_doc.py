"""CONFORMANCE.md: the spec's requirements and meshspec's profile in two tables, each row with what it rests on."""

from __future__ import annotations

import spec as spec_pkg
from spec.tools import conformance_doc

REGISTRY = spec_pkg.load_yaml(spec_pkg.SPEC_DIR / "requirements.yaml")["requirements"]
BY_ID = {r["id"]: r for r in REGISTRY}
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


def test_black_box_column_gives_the_reason_or_the_missing_case():
    assert f"| no: {BY_ID['AUTH-CONSTANT-TIME']['blackbox']} |" in row(PROFILE_PART, "AUTH-CONSTANT-TIME")
    assert "| yes (no conformance case yet) |" in row(SPEC_PART, "LIMIT-INFLIGHT")
    assert "| yes |" in row(SPEC_PART, "IPC-NEW-ROW")


def test_angle_brackets_outside_code_spans_are_escaped():
    line = row(SPEC_PART, "REC-INBOX-QUARANTINE")
    assert "inbox.db.corrupt-&lt;ts>, recreated" in line  # prose: escaped, or Markdown reads an HTML tag
    assert "`inbox.db.corrupt-<ts>`" in line  # a code span shows its text as it is


def test_a_new_split_id_without_a_recorded_run_is_not_yet_run():
    assert row(PROFILE_PART, "IPC-NEW-ROW-BODY").endswith("| not yet run |")
