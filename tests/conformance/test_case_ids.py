"""conformance/case_ids.json, the case ids the spec gate reads instead of importing the harness, is current."""

from __future__ import annotations

import json

from conformance import registry
from conformance.cli import main as meshconform
from spec.tools import check


def test_committed_case_ids_are_current():
    assert registry.CASE_IDS_FILE.read_text(encoding="utf-8") == registry.case_ids_document(), (
        "conformance/case_ids.json is stale: run `meshconform list --write`")


def test_the_gate_reads_the_file_the_harness_writes():
    assert registry.CASES_DIR.parent.parent / check.CASE_IDS == registry.CASE_IDS_FILE


def test_list_write_writes_every_case_id_in_order(tmp_path, monkeypatch):
    target = tmp_path / "case_ids.json"
    monkeypatch.setattr(registry, "CASE_IDS_FILE", target)
    assert meshconform(["list", "--write"]) == 0
    assert json.loads(target.read_text(encoding="utf-8")) == {"cases": [c.id for c in registry.cases()]}
