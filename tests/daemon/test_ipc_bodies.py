"""POST /v1/profile and POST /v1/outbox/requeue bodies are validated by their JSON Schemas at the boundary
(spec/schemas/ipc/profile_request.json, requeue_request.json) and a failure is the 400 the route documents."""

from __future__ import annotations

import json

import falcon.testing
import pytest

from reference.daemon.app import DaemonContext, create_app

TOKEN = "secret-token-value"
ROW_ID = "01KQPNCXVVHHDXD4WENMGHK0CD"


class _Link:
    def __init__(self):
        self.frames: list[dict] = []

    def send_frames(self, frames):
        self.frames.extend(frames)


@pytest.fixture
def ipc():
    """A client of the IPC app, the frames its link was handed and the requeue calls it made."""
    link, requeues = _Link(), []
    config = {"ipc": {"max_inflight": 64}, "daemon": {"mesh": "m"}, "broker": {}}
    ctx = DaemonContext(config=config, token=TOKEN, outbox=None, inbox=None, link=link, events=None, committer=None,
                        metrics=None, member_pubkey="5b" * 32)

    def requeue(outbox_id, new_client_message_id, actor):
        requeues.append((outbox_id, new_client_message_id, actor))
        return {"aborted_row_id": outbox_id, "new_row_id": "01KQPNDHCVDMW26RKGQQM5G9QR",
                "new_client_message_id": new_client_message_id or "01KQPNDJC3QR4791669ZP3R7YZ"}

    client = falcon.testing.TestClient(create_app(ctx, requeue))

    def post(path: str, body) -> tuple[int, dict]:
        result = client.simulate_post(path, body=json.dumps(body), extras={"meshd.transport": "tcp"}, headers={
            "Authorization": f"Bearer {TOKEN}", "Host": "localhost", "Content-Type": "application/json"})
        return result.status_code, result.json

    return post, link.frames, requeues


def _refusal(answer: tuple[int, dict]) -> tuple[int, str, list | None]:
    status, body = answer
    return status, body["error"], body.get("invalid_params")


@pytest.mark.parametrize(("body", "frames"), [
    ({"summary": "reviewing PR 881", "status": "working"},
     [{"type": "set_summary", "summary": "reviewing PR 881"}, {"type": "set_status", "status": "working"}]),
    ({"capabilities": ["deploy", "rollback"], "visible": True, "bio": "x" * 4096, "title": "SRE"},
     [{"type": "set_visible", "visible": True},
      {"type": "set_profile", "title": "SRE", "bio": "x" * 4096, "capabilities": ["deploy", "rollback"]}]),
])
def test_a_valid_profile_goes_out_as_its_set_frames(ipc, body, frames):
    """API-PROFILE, API-PROFILE-FIELDS: each member in the frame that carries it; ``applied`` in request order."""
    post, sent, _ = ipc
    assert post("/v1/profile", body) == (200, {"ok": True, "applied": list(body)})
    assert sent == frames


@pytest.mark.parametrize(("body", "refusal"), [
    ({}, (400, "invalid_request", None)),
    ({"nickname": "x"}, (400, "invalid_request", [{"name": "nickname", "reason": "unknown member"}])),
    ({"summary": "s" * 1025}, (400, "invalid_request", [{"name": "summary", "reason": "fails maxLength 1024"}])),
    ({"status": "away"},
     (400, "invalid_request", [{"name": "status", "reason": 'fails enum ["idle", "working", "dnd"]'}])),
    ({"visible": "yes"}, (400, "invalid_request", [{"name": "visible", "reason": "must be boolean"}])),
    ({"capabilities": ["a", "a"]},
     (400, "invalid_request", [{"name": "capabilities", "reason": "fails uniqueItems true"}])),
    ({"capabilities": [""]}, (400, "invalid_request", [{"name": "capabilities", "reason": "fails minLength 1"}])),
])
def test_a_profile_its_schema_refuses_is_invalid_request_and_forwards_nothing(ipc, body, refusal):
    """The profile_request schema decides: an empty object, an unknown member, a member over its limit or of the
    wrong type is 400 invalid_request naming the member; nothing reaches the broker."""
    post, sent, _ = ipc
    assert _refusal(post("/v1/profile", body)) == refusal
    assert sent == []


@pytest.mark.parametrize(("body", "refusal"), [
    ({}, (400, "invalid_request", [{"name": "id", "reason": "required"}])),
    ({"id": "cmid-1"},
     (400, "invalid_request", [{"name": "id", "reason": 'fails pattern "^[0-7][0-9A-HJKMNP-TV-Z]{25}$"'}])),
    ({"id": ROW_ID, "reason": "x"}, (400, "invalid_request", [{"name": "reason", "reason": "unknown member"}])),
    ({"id": ROW_ID, "new_client_message_id": "has space"},
     (400, "invalid_client_message_id",
      [{"name": "new_client_message_id", "reason": 'fails pattern "^[A-Za-z0-9][A-Za-z0-9._:~-]{0,127}$"'}])),
    ({"id": ROW_ID, "new_client_message_id": 7},
     (400, "invalid_client_message_id", [{"name": "new_client_message_id", "reason": "must be string"}])),
])
def test_a_requeue_its_schema_refuses_is_the_documented_400_and_requeues_nothing(ipc, body, refusal):
    """The requeue_request schema decides: a missing or malformed id or an unknown member is invalid_request, a
    new_client_message_id outside the E-02 grammar is invalid_client_message_id (spec/openapi.yaml)."""
    post, _, requeues = ipc
    assert _refusal(post("/v1/outbox/requeue", body)) == refusal
    assert requeues == []


def test_a_valid_requeue_reaches_the_requeue(ipc):
    """A body the schema accepts is requeued as given, by the operator."""
    post, _, requeues = ipc
    assert post("/v1/outbox/requeue", {"id": ROW_ID, "new_client_message_id": "cmid_retry_1"}) == (200, {
        "aborted_row_id": ROW_ID, "new_row_id": "01KQPNDHCVDMW26RKGQQM5G9QR", "new_client_message_id": "cmid_retry_1"})
    assert post("/v1/outbox/requeue", {"id": ROW_ID})[0] == 200
    assert requeues == [(ROW_ID, "cmid_retry_1", "operator"), (ROW_ID, None, "operator")]
