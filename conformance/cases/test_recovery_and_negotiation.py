"""Crash recovery (§4.11) and feature negotiation (§15): cases that start, kill and restart fresh instances."""

from __future__ import annotations

import json

import pytest

from conformance.cases._support import row_for, unique, wait_row
from conformance.peer import ACCEPT_SILENTLY, PeerConfig, ScriptedBroker, fail
from conformance.registry import case

BODY = {"to": "#general", "message": "survive"}


@case("recovery.kill9_before_dispatch", "REC-NO-LOSS")
def test_kill9_right_after_202(launcher):
    """The broker is unreachable, the target answers 202 and is SIGKILLed: after restart the row reaches done once."""
    with ScriptedBroker() as peer:
        instance = launcher.launch("kill-early", broker=peer)
        peer.hold()
        cmid = unique("kill-early")
        with instance.unix() as client:
            assert client.post("/v1/send", json=BODY, headers={"Idempotency-Key": cmid}).status_code == 202
        instance.kill9()
        peer.held.clear()
        instance.start()
        with instance.unix() as client:
            wait_row(client, cmid, "done")
        sends = [f for f in peer.received("send") if f["client_message_id"] == cmid]
        assert len(sends) == 1
        assert sum(1 for m in peer.messages.values() if m["client_message_id"] == cmid) == 1


@case("recovery.kill9_inflight", "REC-INFLIGHT-TO-PENDING", "REC-NO-LOSS", "WS-SEND-SAME-BYTES")
def test_kill9_while_inflight(launcher):
    """The broker commits but never acks; the target dies inflight, recovers, retries: one message at the broker."""
    with ScriptedBroker() as peer:
        instance = launcher.launch("kill-inflight", broker=peer)
        cmid = unique("kill-inflight")
        peer.answer(cmid, ACCEPT_SILENTLY, fail())
        with instance.unix() as client:
            assert client.post("/v1/send", json=BODY, headers={"Idempotency-Key": cmid}).status_code == 202
            wait_row(client, cmid, "inflight")
        instance.kill9()
        instance.start()
        with instance.unix() as client:
            row = wait_row(client, cmid, "done", timeout=30)
        sends = [f for f in peer.received("send") if f["client_message_id"] == cmid]
        assert len(sends) >= 3 and len({f["request_fingerprint"] for f in sends}) == 1
        assert sum(1 for m in peer.messages.values() if m["client_message_id"] == cmid) == 1
        assert row["broker_message_id"] == peer.dedupe[cmid].broker_message_id


@case("recovery.restart_keeps_state", "ID-CONSUMED-NEVER-FREED")
def test_restart_keeps_consumed_ids(launcher):
    with ScriptedBroker() as peer:
        instance = launcher.launch("restart", broker=peer)
        cmid = unique("restart")
        with instance.unix() as client:
            client.post("/v1/send", json=BODY, headers={"Idempotency-Key": cmid})
            wait_row(client, cmid, "done")
        instance.kill9()
        instance.start()
        with instance.unix() as client:
            again = client.post("/v1/send", json={**BODY, "message": "other"}, headers={"Idempotency-Key": cmid})
            assert again.status_code == 409
            assert row_for(client, cmid)["status"] == "done"


BAD_NEGOTIATIONS = [
    ("below_floor", {"dedupe_retention_days": 2}, "feature_param_below_floor"),
    ("no_fingerprint", {"request_fingerprint": False}, "feature_param_invalid"),
    ("bad_version", {"version": 2}, "feature_param_invalid"),
    ("bad_mode", {"mode": "forever"}, "feature_param_invalid"),
    ("missing", None, "feature_unavailable"),
]


@case("negotiation.refused", "NEG-CLOSE-4010", "NEG-CLOSE-REASON-SHAPE", "NEG-PARAM-VALIDATION",
      "NEG-REQUIRE-DEDUPE")
@pytest.mark.parametrize(("name", "params", "kind"), BAD_NEGOTIATIONS, ids=[b[0] for b in BAD_NEGOTIATIONS])
def test_bad_negotiation_closes_4010(launcher, name, params, kind):
    config = PeerConfig()
    if params is None:
        del config.supported["client_message_id_dedupe"]
    else:
        config.supported["client_message_id_dedupe"]["params"].update(params)
    with ScriptedBroker(config) as peer:
        instance = launcher.launch(f"neg-{name}", broker=peer, wait=False)
        closed = peer.wait_close(timeout=30)
        assert closed.code == 4010, closed
        assert len(closed.reason.encode("utf-8")) <= 123
        reason = json.loads(closed.reason)
        assert reason["kind"] == kind and reason["feature"] == "client_message_id_dedupe"
        assert set(reason) <= {"kind", "feature", "detail"}
        assert instance.wait_exit(timeout=30) != 0
        assert not peer.received("send")


@case("negotiation.order", "NEG-ORDER")
def test_negotiation_comes_first(api, broker):
    cmid = unique("order")
    api.post("/v1/send", json=BODY, headers={"Idempotency-Key": cmid})
    wait_row(api, cmid, "done")
    by_connection: dict[int, list[str]] = {}
    for record in broker.frames:
        if record.direction == "in":
            by_connection.setdefault(record.connection, []).append(record.frame.get("type"))
    for kinds in by_connection.values():
        assert kinds[:2] == ["hello", "feature_negotiation_request"], kinds[:3]
