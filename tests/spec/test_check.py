"""`meshd spec check`: green on the real tree, and red -- naming the culprit -- on each kind of breakage."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

import spec as spec_pkg
from reference import core
from reference.cli import main as meshd
from spec.tools import check

REPO = spec_pkg.SPEC_DIR.parent


@pytest.fixture
def tree(tmp_path) -> Path:
    """A copy of the spec tree (and the generated docs it checks), inside a copy of the repo root layout."""
    root = tmp_path / "repo"
    shutil.copytree(spec_pkg.SPEC_DIR, root / "spec", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "CONFORMANCE.md", root / "CONFORMANCE.md")
    (root / "conformance").mkdir()
    for name in ("reference-results.json", "case_ids.json"):
        shutil.copy(REPO / "conformance" / name, root / "conformance" / name)
    for tree in ("tests", "reference"):  # the registry's test ids, the implementation anchors
        shutil.copytree(REPO / tree, root / tree, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return root / "spec"


def run(spec_dir: Path) -> check.Report:
    return check.run(core, spec_dir, spec_dir.parent)


def edit_yaml(path: Path, change) -> None:
    document = yaml.safe_load(path.read_text())
    change(document)
    path.write_text(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))


def test_real_spec_passes(capsys):
    assert meshd(["spec", "check"]) == 0
    out = capsys.readouterr().out
    assert "spec check: OK" in out
    for area in ("openapi", "schemas", "tables", "vectors", "requirements", "provenance"):
        assert f"{area}:" in out
    assert " spec / " in out and "not black-box (with reasons)" in out


def test_copied_tree_passes(tree):
    report = run(tree)
    assert report.ok, report.problems


def test_removed_table_row_is_named(tree):
    edit_yaml(tree / "tables" / "outbox.yaml",
              lambda d: d.__setitem__("rows", [r for r in d["rows"] if r["id"] != "OB-INFLIGHT-CONFLICT"]))
    problems = run(tree).problems
    assert any("no row covers state=inflight, event=ack_conflict" in p for p in problems), problems


def test_duplicated_table_row_is_named(tree):
    def duplicate(document):
        row = next(r for r in document["rows"] if r["id"] == "IPC-DONE-MATCH")
        document["rows"].append(dict(row))
    edit_yaml(tree / "tables" / "ipc_lookup.yaml", duplicate)
    problems = run(tree).problems
    assert any("duplicate row id IPC-DONE-MATCH" in p for p in problems), problems
    assert any("IPC-DONE-MATCH, IPC-DONE-MATCH overlap on row_state=done, fingerprint=match" in p for p in problems)


def test_unknown_effect_is_named(tree):
    def rename(document):
        row = next(r for r in document["rows"] if r["id"] == "OB-PENDING-DISPATCH")
        row["then"]["effects"] = ["increment_attempts", "teleport"]
    edit_yaml(tree / "tables" / "outbox.yaml", rename)
    assert any("OB-PENDING-DISPATCH names effect 'teleport'" in p for p in run(tree).problems)


def test_table_schema_violation_is_named(tree):
    def corrupt(document):
        document["rows"][0]["then"]["http_status"] = 299
    edit_yaml(tree / "tables" / "ipc_lookup.yaml", corrupt)
    assert any(p.startswith("tables/ipc_lookup.yaml: rows/0/then/http_status") for p in run(tree).problems)


def test_invalid_schema_is_named(tree):
    path = tree / "schemas" / "common" / "defs.json"
    document = json.loads(path.read_text())
    document["$defs"]["ulid"]["type"] = "strin"
    path.write_text(json.dumps(document))
    assert any(p.startswith("schemas/common/defs.json: not a valid 2020-12 schema") for p in run(tree).problems)


def test_wrong_schema_id_is_named(tree):
    path = tree / "schemas" / "common" / "defs.json"
    document = json.loads(path.read_text())
    document["$id"] = "https://example.invalid/defs.json"
    path.write_text(json.dumps(document))
    assert any("schemas/common/defs.json: $id" in p for p in run(tree).problems)


def test_vector_disagreeing_with_the_core_is_named(tree):
    path = tree / "vectors" / "fingerprint.json"
    document = json.loads(path.read_text())
    victim = next(v for v in document["vectors"] if v["expected"].get("valid", True) and "fingerprint" in v["expected"])
    victim["expected"]["fingerprint"] = "0" * 64
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False))
    assert any(victim["id"] in p for p in run(tree).problems)


def test_must_without_test_is_named(tree):
    def untest(document):
        req = next(r for r in document["requirements"] if r["id"] == "FP-EMPTY-META")
        req["tests"] = []
    edit_yaml(tree / "requirements.yaml", untest)
    assert "requirements.yaml: MUST FP-EMPTY-META has no test" in run(tree).problems


def test_missing_test_function_is_named(tree):
    def bogus(document):
        req = next(r for r in document["requirements"] if r["id"] == "FP-EMPTY-META")
        req["tests"] = ["tests/core/test_fingerprint.py::test_that_does_not_exist"]
    edit_yaml(tree / "requirements.yaml", bogus)
    problems = run(tree).problems
    assert any("test tests/core/test_fingerprint.py::test_that_does_not_exist does not exist" in p for p in problems)


def test_stale_baseline_entry_is_named(tree):
    path = tree / "coverage_baseline.yaml"
    document = yaml.safe_load(path.read_text()) or {}
    document.setdefault("untested", []).append({"id": "FP-EMPTY-META", "awaits": "nothing"})
    path.write_text(yaml.safe_dump(document))
    assert any("FP-EMPTY-META now has a test" in p for p in run(tree).problems)


def test_an_effect_the_given_core_does_not_know_is_named(tree):
    class WithoutSendFrame:
        KNOWN_EFFECTS = core.KNOWN_EFFECTS - {"send_frame"}

        def __getattr__(self, name):
            return getattr(core, name)

    sending = [row["id"] for row in spec_pkg.load_table("outbox")["rows"]
               if "send_frame" in row["then"].get("effects", ())]
    assert sending == ["OB-PENDING-DISPATCH"]
    problems = check.run(WithoutSendFrame(), tree, tree.parent).problems
    assert [p for p in problems if p.startswith("tables/")] == [
        "tables/outbox.yaml: row OB-PENDING-DISPATCH names effect 'send_frame' the core does not know"]


def test_conformance_case_ids_come_from_the_file_the_harness_writes(tree):
    path = tree.parent / "conformance" / "case_ids.json"
    document = json.loads(path.read_text())
    document["cases"].remove("limits.inflight")
    path.write_text(json.dumps(document))
    problems = run(tree).problems
    assert "requirements.yaml: LIMIT-INFLIGHT: test conformance::limits.inflight does not exist" in problems
    path.unlink()
    assert "conformance/case_ids.json: missing (run `meshconform list --write`)" in run(tree).problems


def test_stale_conformance_doc_is_named(tree):
    edit_yaml(tree / "requirements.yaml",
              lambda d: d["requirements"][0].__setitem__("text", "A reworded requirement text for the test."))
    assert "CONFORMANCE.md: stale (run `meshd spec conformance-doc`)" in run(tree).problems


def test_unknown_errata_reference_is_named(tree):
    edit_yaml(tree / "requirements.yaml", lambda d: d["requirements"][0].__setitem__("source", "errata:E-99"))
    assert any("cites errata:E-99" in p for p in run(tree).problems)


def requirement(document, rid):
    return next(r for r in document["requirements"] if r["id"] == rid)


def edit_requirement(tree: Path, rid: str, change) -> None:
    edit_yaml(tree / "requirements.yaml", lambda d: change(requirement(d, rid)))


def edit_blackbox_baseline(tree: Path, change) -> None:
    edit_yaml(tree / "blackbox_baseline.yaml", lambda d: d.__setitem__("no_conformance_case",
                                                                        change(d["no_conformance_case"])))


def test_spec_requirement_without_cite_is_named(tree):
    edit_requirement(tree, "FP-PREFIX-409", lambda r: r.pop("cite"))
    assert any(p.startswith("requirements.yaml: FP-PREFIX-409: source spec needs a cite") for p in run(tree).problems)


def test_cite_on_a_meshspec_decision_is_named(tree):
    edit_requirement(tree, "FP-PREFIX-409-WHICH",
                     lambda r: r.__setitem__("cite", {"ref": "v0.9.0 §4.5.1", "text": "Every `409` carries ..."}))
    problems = run(tree).problems
    assert any(p.startswith("requirements.yaml: FP-PREFIX-409-WHICH: only a spec requirement carries a cite")
               for p in problems), problems


def test_malformed_cite_ref_is_named(tree):
    edit_requirement(tree, "FP-PREFIX-409", lambda r: r["cite"].__setitem__("ref", "§4.5.1 of the spec"))
    assert any("FP-PREFIX-409: cite ref '§4.5.1 of the spec' is not" in p for p in run(tree).problems)


def test_missing_subject_is_named(tree):
    edit_requirement(tree, "FP-JCS", lambda r: r.pop("subject"))
    assert "requirements.yaml: FP-JCS: no subject (daemon, broker, sdk)" in run(tree).problems


def test_missing_or_false_blackbox_is_named(tree):
    edit_requirement(tree, "FP-JCS", lambda r: r.pop("blackbox"))
    edit_requirement(tree, "FP-DEFAULTS", lambda r: r.__setitem__("blackbox", False))
    problems = run(tree).problems
    assert any(p.startswith("requirements.yaml: FP-JCS: no blackbox") for p in problems), problems
    assert any(p.startswith("requirements.yaml: FP-DEFAULTS: blackbox is False") for p in problems), problems


def test_blackbox_must_without_case_and_off_the_baseline_is_named(tree):
    edit_requirement(tree, "LIMIT-INFLIGHT",
                     lambda r: r.__setitem__("tests", [t for t in r["tests"] if not t.startswith("conformance::")]))
    problems = run(tree).problems
    assert any(p.startswith("requirements.yaml: black-box-checkable MUST LIMIT-INFLIGHT has no conformance case")
               for p in problems), problems


def test_requirement_made_blackbox_without_a_case_is_named(tree):
    edit_requirement(tree, "IPC-DURABLE-BEFORE-RESPONSE", lambda r: r.__setitem__("blackbox", True))
    problems = run(tree).problems
    assert any("black-box-checkable MUST IPC-DURABLE-BEFORE-RESPONSE has no conformance case" in p for p in problems)


def test_blackbox_baseline_entry_that_has_a_case_is_named(tree):
    edit_blackbox_baseline(tree, lambda entries: [*entries, {"id": "LIMIT-INFLIGHT", "awaits": "a case"}])
    problems = run(tree).problems
    assert ("blackbox_baseline.yaml: LIMIT-INFLIGHT now has a conformance case; remove it from the baseline"
            in problems), problems


def test_blackbox_baseline_entry_that_gained_a_case_is_named(tree):
    edit_blackbox_baseline(tree, lambda entries: [*entries, {"id": "LIMIT-INFLIGHT", "awaits": "a case"}])
    edit_requirement(tree, "LIMIT-INFLIGHT",
                     lambda r: r.__setitem__("tests", [t for t in r["tests"] if not t.startswith("conformance::")]))
    problems = run(tree).problems  # listed and without a case: accepted ...
    assert not [p for p in problems if "LIMIT-INFLIGHT" in p], problems
    edit_requirement(tree, "LIMIT-INFLIGHT", lambda r: r["tests"].append("conformance::limits.inflight"))
    problems = run(tree).problems  # ... until the case lands
    assert ("blackbox_baseline.yaml: LIMIT-INFLIGHT now has a conformance case; remove it from the baseline"
            in problems), problems


def test_blackbox_baseline_entry_that_is_no_blackbox_must_is_named(tree):
    edit_blackbox_baseline(tree, lambda entries: [*entries, {"id": "IPC-DURABLE-BEFORE-RESPONSE", "awaits": "x"}])
    assert ("blackbox_baseline.yaml: IPC-DURABLE-BEFORE-RESPONSE is not a black-box-checkable MUST; remove it"
            in run(tree).problems)


def test_blackbox_baseline_entry_naming_no_requirement_is_named(tree):
    edit_blackbox_baseline(tree, lambda entries: [*entries, {"id": "NO-SUCH-REQ", "awaits": "nothing"}])
    assert "blackbox_baseline.yaml: NO-SUCH-REQ is not a requirement" in run(tree).problems


def test_error_codes_must_match_openapi(tree):
    edit_yaml(tree / "tables" / "errors.yaml",
              lambda d: d["codes"].__setitem__("brand_new_code", {"status": 400, "title": "New"}))
    assert "openapi.yaml: ErrorCode enum lacks brand_new_code (tables/errors.yaml)" in run(tree).problems


def test_a_must_without_an_implementation_anchor_is_named(tree):
    guard = tree.parent / "reference" / "daemon" / "guard.py"
    guard.write_text(guard.read_text().replace("        # req: AUTH-CONSTANT-TIME\n", ""))
    assert ("reference/: MUST AUTH-CONSTANT-TIME has no implementation anchor (`# req: AUTH-CONSTANT-TIME` at the "
            "code that enforces it)") in run(tree).problems


def test_json_output(capsys):
    assert meshd(["spec", "check", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["ok"] is True and document["problems"] == []
