"""Every /v1 route of the real daemon, each response validated against spec/openapi.yaml with openapi-core."""

from __future__ import annotations

import json
import time

from conformance.contract import ContractClient
from conformance.peer import SILENT, reject


def wait_for(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def test_every_route_conforms_over_both_transports(broker, daemon):
    """API-CONFORMS, API-VERSION, API-HEALTH, API-OUTBOX, API-PROFILE, API-PEERS, API-METRICS, API-COMPAT."""
    broker.config.peers = [{"pubkey": "cd" * 32, "displayName": "peer", "status": "idle"}]
    broker.answer("contract-dead", reject(404, "destination_not_found"))
    for make in (daemon.unix, daemon.tcp):
        with ContractClient(make()) as api:
            version = api.get("/v1/version").json()
            assert version["ipc_api"] == "v1"
            assert "client_message_id_dedupe" in version["broker_features_negotiated"]
            assert version["broker_feature_params"]["client_message_id_dedupe"]["version"] == 1
            health = api.get("/v1/health").json()
            assert health["connected"] is True and health["ok"] is True
            api.get("/v1/compat")
            metrics = api.get("/v1/metrics")
            assert "cm_daemon_outbox_depth" in metrics.text
            assert api.get("/v1/peers").json()["peers"][0]["displayName"] == "peer"
            profile = api.post("/v1/profile", json={"summary": "testing", "status": "working"})
            assert profile.json() == {"ok": True, "applied": ["summary", "status"]}
            api.post("/v1/profile", json={"nickname": "x"})
            api.post("/v1/profile", json={})
            sent = api.post("/v1/send", json={"to": "#general", "message": "contract"})
            assert sent.status_code == 202
            api.post("/v1/send", json={"to": "#general", "message": "x"}, headers={"Idempotency-Key": "bad id"})
            api.get("/v1/inbox", params={"limit": 5})
            api.get("/v1/inbox", params={"limit": 5000})
            api.get("/v1/outbox", params={"status": "pending"})
            api.get("/v1/nowhere")
            api.request("DELETE", "/v1/send")
            api.post("/v1/outbox/requeue", json={"id": "01ARZ3NDEKTSV4RRFFQ69G5FAV"})
            api.post("/v1/outbox/requeue", json={"id": "not-a-ulid"})
            assert api.deviations == [], api.deviations
    assert {"set_summary", "set_status"} <= {f["type"] for f in broker.received()}

    with ContractClient(daemon.unix()) as api:
        api.post("/v1/send", json={"to": "#general", "message": "dead"}, headers={"Idempotency-Key": "contract-dead"})
        dead = wait_for(lambda: api.get("/v1/outbox", params={"status": "dead"}).json()["items"])
        assert dead[0]["last_error"].startswith("404 destination_not_found")
        requeued = api.post("/v1/outbox/requeue", json={"id": dead[0]["id"]})
        assert requeued.status_code == 200
        api.post("/v1/outbox/requeue", json={"id": dead[0]["id"]})  # 409 outbox_requeue_state_invalid
        api.post("/v1/send", json={"to": "#general", "message": "dead"}, headers={"Idempotency-Key": "contract-dead"})
        assert api.deviations == [], api.deviations


def test_ack_without_status_is_a_retry(broker, daemon):
    """WS-ACK-STATUS: an ack without a valid status is a transient failure; the row is retried, then done."""
    broker.answer("no-status", SILENT)
    with daemon.unix() as client:
        assert client.post("/v1/send", json={"to": "#t", "message": "m"},
                           headers={"Idempotency-Key": "no-status"}).status_code == 202
        broker.wait_frame("send")
        broker.send_raw({"type": "ack", "id": "no-status", "client_message_id": "no-status", "messageId": "",
                         "queued": True})
        broker.wait_frame("send", 2)

        def row():
            items = client.get("/v1/outbox", params={"status": "done"}).json()["items"]
            return [r for r in items if r["client_message_id"] == "no-status"]

        done = wait_for(row)
        assert done[0]["attempts"] == 2
        assert "cm_daemon_invalid_inbound_total 1.0" in client.get("/v1/metrics").text


def test_invalid_inbound_push_is_dropped_and_counted(broker, daemon):
    """INB-SCHEMA: a push that fails its schema writes nothing, is not acknowledged, and is counted."""
    broker.send_raw({"type": "push", "messageId": "01M", "meshId": "mesh", "senderPubkey": "not hex",
                     "body": "x", "client_message_id": "evil", "createdAt": "2026-01-01T00:00:00Z",
                     "unexpected": True})
    broker.send_raw("{not json")
    broker.push(body="fine", client_message_id="good")
    broker.wait_frame("client_ack")
    with daemon.unix() as client:
        items = client.get("/v1/inbox").json()["items"]
        assert [i["client_message_id"] for i in items] == ["good"]
        metrics = client.get("/v1/metrics").text
    assert "cm_daemon_invalid_inbound_total 2.0" in metrics
    assert [a["clientMessageId"] for a in broker.received("client_ack")] == ["good"]
    assert json.loads(json.dumps(broker.received("client_ack")[0]))["delivery_id"]


def test_inbound_row_is_durable_before_its_client_ack(broker, daemon):
    """INB-DURABLE-BEFORE-ACK: at the moment each client_ack arrives, the row is already readable."""
    seen: dict[str, bool] = {}

    def on_receive(frame):
        if frame.get("type") == "client_ack":
            with daemon.unix() as client:
                ids = {i["client_message_id"] for i in client.get("/v1/inbox", params={"limit": 1000}).json()["items"]}
            seen[frame["clientMessageId"]] = frame["clientMessageId"] in ids

    broker.on_receive = on_receive
    for n in range(20):
        broker.push(body=f"m{n}", client_message_id=f"durable-{n}")
    broker.wait_for(lambda: len(seen) == 20, what="20 checked client_acks")
    assert all(seen.values()), seen
