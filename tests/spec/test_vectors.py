"""The language-neutral vectors under spec/vectors, one pytest test per vector (named skips are known gaps)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from reference import core
from spec import SPEC_DIR
from spec.tools import vectors


def _params(suite: str) -> list[Any]:
    params = []
    for vector in vectors.load_suite(suite)["vectors"]:
        marks = [pytest.mark.skip(reason=f"{vector['id']}: {vector['skip']}")] if "skip" in vector else []
        params.append(pytest.param(vector, id=vector["id"], marks=marks))
    return params


def _check(suite: str, vector: dict[str, Any]) -> None:
    differences = vectors.evaluate(core, suite, vector)
    assert not differences, f"{suite} {vector['id']} ({vector['description']}): " + "; ".join(differences)


@pytest.mark.parametrize("vector", _params("fingerprint"))
def test_fingerprint_vector(vector):
    _check("fingerprint", vector)


@pytest.mark.parametrize("vector", _params("jcs"))
def test_jcs_vector(vector):
    _check("jcs", vector)


@pytest.mark.parametrize("vector", _params("destination"))
def test_destination_vector(vector):
    _check("destination", vector)


@pytest.mark.parametrize("vector", _params("max_age"))
def test_max_age_vector(vector):
    _check("max_age", vector)


@pytest.mark.parametrize("vector", _params("features"))
def test_features_vector(vector):
    _check("features", vector)


@pytest.mark.parametrize("suite", vectors.SUITES)
def test_each_file_validates_against_its_schema(suite):
    document = vectors.load_suite(suite)
    assert vectors.schema_problems(suite, document) == []
    assert document["suite"] == suite


def test_vector_counts():
    counts = vectors.counts()
    assert counts["fingerprint"] >= 40
    assert counts["destination"] >= 20
    assert counts["max_age"] >= 15
    assert counts["features"] >= 20
    assert counts["jcs"] >= 6


def test_third_party_jcs_vectors_name_their_source():
    document = vectors.load_suite("jcs")
    for vector in document["vectors"]:
        assert vector["flags"] == ["third-party"]
        assert vector["source"]["repository"] == document["source"]["repository"]
        assert vector["source"]["input"]["commit"] in document["source"]["commits"]


def test_run_all_reports_no_problems():
    report = vectors.run_all(core)
    assert {name: list(result.problems) for name, result in report.items() if result.problems} == {}
    for result in report.values():
        assert result.failed == 0
        assert all(skip.detail for skip in result.skips), "every skip names its reason"
    assert vectors.problems(core) == []
    assert vectors.cli([], core) == 0


@pytest.fixture
def spec_copy(tmp_path: Path) -> Path:
    target = tmp_path / "spec"
    shutil.copytree(SPEC_DIR, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def _edit(spec_dir: Path, suite: str, edit) -> dict[str, Any]:
    path = spec_dir / "vectors" / f"{suite}.json"
    document = json.loads(path.read_text(encoding="utf-8"))
    edit(document)
    path.write_text(json.dumps(document), encoding="utf-8")
    return document


def _first_valid(document: dict[str, Any]) -> dict[str, Any]:
    return next(v for v in document["vectors"] if v["expected"].get("valid") and "skip" not in v)


def test_a_mutated_fingerprint_is_reported_by_id(spec_copy, capsys):
    mutated = {}

    def flip(document):
        vector = _first_valid(document)
        old = vector["expected"]["fingerprint"]
        vector["expected"]["fingerprint"] = ("0" if old[0] != "0" else "1") + old[1:]
        mutated.update(vector)

    _edit(spec_copy, "fingerprint", flip)
    found = vectors.run_suite(core, "fingerprint", spec_copy)
    assert len(found) == 1
    assert found[0].startswith(f"fingerprint {mutated['id']}: fingerprint: expected ")
    assert vectors.run_all(core, spec_copy)["fingerprint"].failed == 1
    assert vectors.cli(["--spec-dir", str(spec_copy)], core) == 1
    assert f"PROBLEM fingerprint {mutated['id']}" in capsys.readouterr().out


def test_a_skip_is_reported_as_skipped_never_passed(spec_copy):
    chosen = {}

    def skip_and_break(document):
        vector = _first_valid(document)
        vector["skip"] = "a named known gap"
        vector["expected"]["fingerprint"] = "f" * 64
        chosen.update(vector)

    _edit(spec_copy, "fingerprint", skip_and_break)
    result = vectors.run_all(core, spec_copy)["fingerprint"]
    assert result.problems == ()
    assert [skip.id for skip in result.skips if skip.detail.startswith("a named known gap")] == [chosen["id"]]
    _, outcomes = vectors.results(core, "fingerprint", spec_copy)
    assert {o.status for o in outcomes if o.id == chosen["id"]} == {vectors.SKIPPED}


def test_schema_violations_duplicate_ids_and_undeclared_flags_are_problems(spec_copy):
    def corrupt(document):
        document["vectors"].append(dict(document["vectors"][0]))
        document["vectors"][1]["flags"] = [*document["vectors"][1]["flags"], "never-declared"]

    _edit(spec_copy, "destination", corrupt)
    found = vectors.run_suite(core, "destination", spec_copy)
    assert any("dest-001: duplicate vector id" in p for p in found)
    assert any("flag 'never-declared' is not declared" in p for p in found)

    _edit(spec_copy, "max_age", lambda document: document["vectors"][0].pop("expected"))
    found = vectors.run_suite(core, "max_age", spec_copy)
    assert found and all(p.startswith("vectors/max_age.json: vectors/0") for p in found)


def test_a_missing_suite_file_is_a_problem(spec_copy):
    (spec_copy / "vectors" / "features.json").unlink()
    assert vectors.run_suite(core, "features", spec_copy) == ["vectors/features.json: missing"]
    assert vectors.counts(spec_copy)["features"] == 0


def test_an_unresolvable_schema_ref_is_a_problem_not_a_crash(spec_copy):
    path = spec_copy / "schemas" / "common" / "defs.json"
    document = json.loads(path.read_text(encoding="utf-8"))
    document["$id"] = "https://example.invalid/defs.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    found = vectors.run_suite(core, "fingerprint", spec_copy)
    assert len(found) == 1 and "unresolvable $ref" in found[0]
