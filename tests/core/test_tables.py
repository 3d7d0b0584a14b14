"""The decision-table engine: lookup, settle, totality and determinism, naming rows."""

from __future__ import annotations

import copy

import pytest

from reference.core import AmbiguousRow, DecisionTable, NoRow, UnknownInput, settle
from reference.core.broker_accept import check_status
from spec import load_table


def test_real_tables_are_total_and_deterministic():
    for name in ("ipc_lookup", "outbox", "broker_accept"):
        assert DecisionTable(load_table(name)).problems() == []


def test_removed_row_is_named():
    document = copy.deepcopy(load_table("ipc_lookup"))
    document["rows"] = [r for r in document["rows"] if r["id"] != "IPC-DEAD-MATCH"]
    table = DecisionTable(document)
    assert any("row_state=dead, fingerprint=match" in p for p in table.problems())
    with pytest.raises(NoRow, match="row_state=dead, fingerprint=match"):
        table.lookup(row_state="dead", fingerprint="match")


def test_duplicated_row_is_named():
    document = copy.deepcopy(load_table("ipc_lookup"))
    document["rows"].append(copy.deepcopy(document["rows"][3]))
    table = DecisionTable(document)
    problems = table.problems()
    assert any("duplicate row id IPC-INFLIGHT-MATCH" in p for p in problems)
    assert any("IPC-INFLIGHT-MATCH, IPC-INFLIGHT-MATCH overlap" in p for p in problems)
    with pytest.raises(AmbiguousRow):
        table.lookup(row_state="inflight", fingerprint="match")


def test_out_of_domain_values():
    document = copy.deepcopy(load_table("ipc_lookup"))
    document["rows"][0]["when"]["row_state"] = ["none", "zombie"]
    assert any("zombie" in p for p in DecisionTable(document).problems())
    table = DecisionTable(load_table("ipc_lookup"))
    with pytest.raises(UnknownInput):
        table.lookup(row_state="zombie", fingerprint="match")
    with pytest.raises(UnknownInput):
        table.lookup(row_state="none")
    with pytest.raises(UnknownInput):
        table.matching({"colour": "red"})


def test_settle_steps_through_the_accept_transaction():
    assert settle(b1="rejected").table_row == "BRK-B1-REJECT"
    assert settle(b1="ok") is None
    assert settle(b1="ok", drift="differs").conflict == "canonical_form_drift"
    assert settle(b1="ok", drift="same", claim="ours") is None
    assert settle(b1="ok", drift="same", claim="theirs", fingerprint="mismatch").http_status == "409"
    accepted = settle(b1="ok", drift="same", claim="ours", b2="ok", commit="ok")
    assert accepted.commits and accepted.effects == ("dedupe", "message", "history", "delivery")
    rolled_back = settle(b1="ok", drift="same", claim="ours", b2="ok", commit="failed")
    assert not rolled_back.commits


def test_settle_with_no_completion_returns_none():
    document = copy.deepcopy(load_table("broker_accept"))
    document["rows"] = [r for r in document["rows"] if r["id"] != "BRK-B1-REJECT"]
    table = DecisionTable(document)
    with pytest.raises(NoRow):
        table.settled(b1="rejected")


def test_check_status():
    assert check_status("B1", "payload_size") == (413, "payload_too_large")
    assert check_status("B2", "topic_exists") == (404, "destination_not_found")
    with pytest.raises(KeyError):
        check_status("B1", "nope")
