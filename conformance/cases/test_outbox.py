"""The outbox lifecycle driven by broker outcomes (§4.5b, §4.6), retries, and the requeue audit trail (§4.5.3)."""

from __future__ import annotations

import itertools

import pytest

from conformance.cases._support import read_events, row_for, unique, wait_row
from conformance.peer import ACCEPT_SILENTLY, DROP, SILENT, ScriptedBroker, conflict, duplicate, fail, reject
from conformance.registry import case
from conformance.target import HARNESS_CONFIG

BODY = {"to": "#general", "message": "lifecycle"}


def send(api, cmid, body=BODY):
    response = api.post("/v1/send", json=body, headers={"Idempotency-Key": cmid})
    assert response.status_code == 202, response.text
    return response.json()


OUTCOMES = [
    ("created", None, "done"),
    ("duplicate_history", duplicate(True), "done"),
    ("duplicate_pruned", duplicate(False), "done"),
    ("conflict", conflict(), "dead"),
    ("drift", conflict("canonical_form_drift"), "dead"),
    ("reject_404", reject(404, "destination_not_found"), "dead"),
    ("reject_413", reject(413, "payload_too_large"), "dead"),
    ("fail_then_created", fail(503), "done"),
]


@case("outbox.broker_outcome", "OBX-BROKER-OUTCOMES", "OBX-DISPATCH", "WS-ACK-STATUS")
@pytest.mark.parametrize(("name", "outcome", "final"), OUTCOMES, ids=[o[0] for o in OUTCOMES])
def test_broker_outcome(api, broker, name, outcome, final):
    """201 / 200 → done; 409 / other 4xx → dead; 5xx → retried (then done)."""
    cmid = unique(name)
    if outcome is not None:
        broker.answer(cmid, outcome)
    send(api, cmid)
    row = wait_row(api, cmid, final)
    sends = [f for f in broker.received("send") if f["client_message_id"] == cmid]
    assert row["attempts"] == len(sends) >= 1
    if final == "done":
        acked = [a for a in broker.sent("ack") if a["client_message_id"] == cmid and a["status"] in (200, 201)]
        assert row["broker_message_id"] == acked[-1]["broker_message_id"]
    else:
        assert row["last_error"], "a dead row records why"
        assert len(sends) == 1, "a permanent refusal is not retried"


@case("outbox.transient_failures", "OBX-BROKER-OUTCOMES", "OBX-BACKOFF", "WS-SEND-SAME-BYTES")
@pytest.mark.parametrize("transient", ["timeout", "link_lost", "status_less_ack"])
def test_transient_failures_are_retried_with_the_same_bytes(api, broker, transient):
    cmid = unique(transient)
    if transient == "timeout":
        broker.answer(cmid, SILENT)
    elif transient == "link_lost":
        broker.answer(cmid, DROP)
    else:
        broker.answer(cmid, SILENT)
    send(api, cmid)
    if transient == "status_less_ack":
        broker.wait_for(lambda: any(f["client_message_id"] == cmid for f in broker.received("send")))
        broker.send_raw({"type": "ack", "id": cmid, "client_message_id": cmid, "messageId": "", "queued": True})
    row = wait_row(api, cmid, "done", timeout=30)
    sends = [f for f in broker.received("send") if f["client_message_id"] == cmid]
    assert len(sends) >= 2 and row["attempts"] >= 2
    keys = ("request_fingerprint", "destination_kind", "destination_ref", "priority", "reply_to_id", "meta", "body")
    assert len({tuple(repr(f.get(k)) for k in keys) for f in sends}) == 1, "every retry sends the same request"


@case("outbox.backoff", "OBX-BACKOFF")
def test_backoff_grows(api, broker):
    """Four 5xx answers: the gaps between attempts grow (exponential backoff, bounded jitter)."""
    cmid = unique("backoff")
    broker.answer(cmid, fail(), fail(), fail(), fail())
    send(api, cmid)
    wait_row(api, cmid, "done", timeout=60)
    times = [r.at for r in broker.frames if r.direction == "in" and r.frame.get("type") == "send"
             and r.frame.get("client_message_id") == cmid]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(gaps) == 4
    assert gaps[3] > gaps[0], f"retry gaps did not grow: {gaps}"


@case("outbox.dead_event", "OBX-DEAD-EVENT")
def test_dead_rows_are_announced(api, broker, mesh_target):
    cmid = unique("dead-event")
    with mesh_target.client(mesh_target.transports[0]) as client:
        start = client.get("/v1/health")  # connection warm-up; event ids are read from the stream itself
        assert start.status_code == 200
        broker.answer(cmid, conflict())
        send(api, cmid)
        wait_row(api, cmid, "dead")
        events = read_events(client, {"Last-Event-ID": "0"},
                             lambda evs: any(e["event"] == "outbox_dead" and e["json"].get("client_message_id") == cmid
                                             for e in evs))
    dead = [e for e in events if e["event"] == "outbox_dead" and e["json"]["client_message_id"] == cmid]
    assert dead and dead[0]["json"]["conflict"] == "request_fingerprint_mismatch"


@case("outbox.requeue", "REQUEUE-ATOMIC", "REQUEUE-STATES", "REQUEUE-FRESH-ID", "REQUEUE-NEVER-FREES",
      "ID-CONSUMED-NEVER-FREED", "API-OUTBOX")
def test_requeue_audit_trail(api, broker):
    cmid = unique("requeue")
    broker.answer(cmid, reject(404, "destination_not_found"))
    send(api, cmid)
    dead = wait_row(api, cmid, "dead")
    fresh = unique("requeued")
    result = api.post("/v1/outbox/requeue", json={"id": dead["id"], "new_client_message_id": fresh})
    assert result.status_code == 200, result.text
    body = result.json()
    assert body["aborted_row_id"] == dead["id"] and body["new_client_message_id"] == fresh
    old = row_for(api, cmid)
    assert old["status"] == "aborted" and old["aborted_at"] and old["aborted_by"] == "operator"
    assert old["superseded_by"] == body["new_row_id"]
    new = wait_row(api, fresh, "done")
    assert new["id"] == body["new_row_id"] and new["request_fingerprint"] == dead["request_fingerprint"]
    again = api.post("/v1/outbox/requeue", json={"id": dead["id"]})
    assert (again.status_code, again.json()["error"]) == (409, "outbox_requeue_state_invalid")
    done = api.post("/v1/outbox/requeue", json={"id": new["id"]})
    assert (done.status_code, done.json()["error"]) == (409, "outbox_requeue_state_invalid")
    other = unique("other")
    send(api, other)
    wait_row(api, other, "done")
    in_use = unique("in-use")
    broker.answer(in_use, conflict())
    send(api, in_use)
    victim = wait_row(api, in_use, "dead")
    taken = api.post("/v1/outbox/requeue", json={"id": victim["id"], "new_client_message_id": other})
    assert (taken.status_code, taken.json().get("conflict")) == (409, "requeue_new_id_in_use")
    assert api.post("/v1/outbox/requeue", json={"id": "01ARZ3NDEKTSV4RRFFQ69G5FAV"}).status_code == 404
    reused = api.post("/v1/send", json=BODY, headers={"Idempotency-Key": cmid})
    assert reused.status_code == 409 and reused.json()["conflict"].startswith("outbox_aborted")


@case("outbox.late_ack", "OBX-LATE-ACK")
def test_late_ack_after_timeout_is_applied(launcher):
    """The broker commits but answers only after the ack timeout: the late 201 moves the pending row to done.

    Retries are slowed down so the late ack meets the row in `pending` (not in a retry's `inflight`), and every
    later attempt is ignored, so only the late ack can finish the row.
    """
    config = HARNESS_CONFIG.replace("retry_base_ms = 100", "retry_base_ms = 8000").replace(
        "retry_max_ms = 500", "retry_max_ms = 8000")
    with ScriptedBroker() as peer:
        instance = launcher.launch("late-ack", config=config, broker=peer)
        cmid = unique("late")
        peer.answer(cmid, ACCEPT_SILENTLY, *[SILENT] * 20)
        with instance.unix() as client:
            assert client.post("/v1/send", json=BODY, headers={"Idempotency-Key": cmid}).status_code == 202
            wait_row(client, cmid, "pending", attempted=True, timeout=30)
            entry = peer.dedupe[cmid]
            peer.send_raw({"type": "ack", "id": cmid, "client_message_id": cmid, "status": 201,
                           "messageId": entry.broker_message_id, "queued": True,
                           "broker_message_id": entry.broker_message_id, "history_id": entry.history_id,
                           "duplicate": False})
            row = wait_row(client, cmid, "done", timeout=4)
        assert row["broker_message_id"] == entry.broker_message_id
        assert [f["client_message_id"] for f in peer.received("send")].count(cmid) == 1
