"""POST /v1/send: validation phase A, the §4.5.1 lookup table row by row, id rules, fingerprints, concurrency."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from conformance.cases._support import outbox_rows, row_for, unique, wait_row
from conformance.peer import SILENT, conflict
from conformance.registry import case
from reference.core.ipc import table as ipc_table
from spec import SPEC_DIR, load_json

BODY = {"to": "#general", "message": "conformance"}
OTHER = {"to": "#general", "message": "conformance, but different"}
ULID_CHARS = set("0123456789ABCDEFGHJKMNPQRSTVWXYZ")


def post(api, body, key=None):
    return api.post("/v1/send", json=body, headers={"Idempotency-Key": key} if key else {})


def bring_to(api, broker, state: str, cmid: str) -> None:
    """Bring ``cmid``'s row into ``state`` using only the IPC surface and the scripted broker."""
    if state == "none":
        return
    if state == "pending":
        broker.hold()
        try:
            assert post(api, BODY, cmid).status_code == 202
            wait_row(api, cmid, "pending")
        except BaseException:
            broker.release()
            raise
        return
    outcome = {"inflight": SILENT, "done": None, "dead": conflict(), "aborted": conflict()}[state]
    if outcome is not None:
        broker.answer(cmid, outcome)
    assert post(api, BODY, cmid).status_code == 202
    wait_row(api, cmid, "dead" if state == "aborted" else state)
    if state == "aborted":
        row = row_for(api, cmid)
        assert api.post("/v1/outbox/requeue", json={"id": row["id"]}).status_code == 200
        wait_row(api, cmid, "aborted")


@case("ipc.lookup.row", "IPC-NEW-ROW", "IPC-PENDING-MATCH", "IPC-INFLIGHT-MATCH", "IPC-DONE-MATCH",
      "IPC-DONE-MISMATCH", "IPC-DEAD-MATCH", "IPC-CONFLICT-NO-MUTATION", "FP-PREFIX-409", "REQUEUE-NEVER-FREES",
      "IPC-STABLE-ID", "FP-FROZEN")
@pytest.mark.parametrize("row", ipc_table().rows, ids=lambda r: r.id)
def test_lookup_row(api, broker, row):
    """Each row of spec/tables/ipc_lookup.yaml, reached through the protocol and answered exactly."""
    state = next(iter(row.when["row_state"]))
    cmid = unique(row.id.lower())
    bring_to(api, broker, state, cmid)
    try:
        before = row_for(api, cmid)
        mismatch = row.when["fingerprint"] == frozenset({"mismatch"})
        response = post(api, OTHER if mismatch else BODY, cmid)
        after = row_for(api, cmid)
    finally:
        if state == "pending":
            broker.release()
    then = row.then
    assert response.status_code == then["http_status"], response.text
    body = response.json()
    if then["http_status"] == 409:
        assert body["error"] == "idempotency_key_reused"
        assert body["conflict"] == then["conflict"]
        assert body["client_message_id"] == cmid
        assert len(body["daemon_fingerprint_prefix"]) == 16
        assert after == before, "a 409 changed the row"
    else:
        assert (body["status"], body["duplicate"], body["client_message_id"]) == (then["status"],
                                                                                   then["duplicate"], cmid)
        if state != "none":
            assert after["id"] == before["id"] and after["request_fingerprint"] == before["request_fingerprint"]
    for member in then.get("include", ()):
        assert member in body, member
    if "broker_message_id" in then.get("include", ()):
        assert body["broker_message_id"] == before["broker_message_id"]
    if "reason" in then.get("include", ()):
        assert body["reason"] == (before["last_error"] or "")


INVALID = [
    ({"to": "@team", "message": "x"}, "destination_unresolvable"),
    ({"to": "*", "message": "x"}, "destination_unresolvable"),
    ({"to": "#general"}, "invalid_request"),
    ({"to": "#general", "message": "x", "priority": "urgent"}, "invalid_request"),
    ({"to": "#general", "message": "x", "meta": [1]}, "invalid_request"),
    ({"to": "#general", "message": "x", "surprise": 1}, "invalid_request"),
    ({"to": "#general", "message": "x", "meta": {"n": 9007199254740993}}, "meta_not_canonicalizable"),
]


@case("ipc.validation.consumes_nothing", "IPC-VALIDATION-CONSUMES-NOTHING", "ERR-PROBLEM-JSON")
def test_validation_consumes_nothing(api):
    cmid = unique("phase-a")
    for body, code in INVALID:
        response = post(api, body, cmid)
        assert response.status_code == 400, (body, response.text)
        assert response.headers["content-type"].startswith("application/problem+json")
        assert response.json()["error"] == code, body
    raw = api.post("/v1/send", content=b'{"to":"#a","to":"#b","message":"m"}', headers={
        "Content-Type": "application/json", "Idempotency-Key": cmid})
    assert raw.json()["error"] == "invalid_json"
    assert row_for(api, cmid) is None
    accepted = post(api, BODY, cmid)
    assert accepted.status_code == 202 and accepted.json()["duplicate"] is False


@case("ipc.id.precedence", "IPC-ID-PRECEDENCE")
def test_header_wins(api):
    header, body_id = unique("header"), unique("body")
    response = post(api, {**BODY, "client_message_id": body_id}, header)
    assert response.json()["client_message_id"] == header
    assert row_for(api, body_id) is None
    only_body = post(api, {**BODY, "client_message_id": body_id})
    assert only_body.json()["client_message_id"] == body_id


@case("ipc.id.minted", "IPC-ID-MINTED-ULID")
def test_minted_ids_are_ulids(api):
    ids = {post(api, BODY).json()["client_message_id"] for _ in range(3)}
    assert len(ids) == 3
    for value in ids:
        assert len(value) == 26 and set(value) <= ULID_CHARS and value[0] in "01234567"


@case("ipc.id.grammar", "IPC-ID-GRAMMAR")
@pytest.mark.parametrize("bad", ["has space", "a/b", "-leading", "x" * 129, "é"])
def test_id_grammar(api, bad):
    response = api.post("/v1/send", content=json.dumps(BODY).encode(),
                        headers={"Content-Type": "application/json", "Idempotency-Key": bad.encode("utf-8")})
    assert response.status_code == 400 and response.json()["error"] == "invalid_client_message_id"
    body_id = post(api, {**BODY, "client_message_id": bad})
    assert body_id.status_code == 400 and body_id.json()["error"] == "invalid_client_message_id"


def _fingerprint_vectors():
    return load_json(SPEC_DIR / "vectors" / "fingerprint.json")["vectors"]


@case("ipc.fingerprint.vectors", "FP-CANONICAL-FORM", "FP-JCS", "FP-EMPTY-META", "FP-DEFAULTS",
      "FP-META-REPRESENTABLE", "DEST-GRAMMAR")
@pytest.mark.parametrize("vector", _fingerprint_vectors(), ids=lambda v: v["id"])
def test_fingerprint_vector(api, vector):
    """Every spec/vectors/fingerprint.json vector, sent as its exact bytes: the 202 names the expected fingerprint."""
    expected = vector["expected"]
    key = vector["input"].get("idempotency_key")
    if expected.get("valid"):
        key = unique(vector["id"])
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    response = api.post("/v1/send", content=vector["input"]["body"].encode("utf-8"), headers=headers)
    if expected.get("valid"):
        assert response.status_code == 202, response.text
        assert response.json()["request_fingerprint"] == expected["fingerprint"]
    else:
        assert response.status_code == 400, response.text
        assert response.json()["error"] == expected["error"]


@case("ipc.concurrent.same_key", "IPC-SERIALIZED")
def test_concurrent_same_key(api, mesh_target):
    """64 concurrent identical POSTs: exactly one row, exactly one `duplicate: false`, one fingerprint."""
    cmid = unique("race")
    barrier = threading.Barrier(32)

    def one(_):
        with mesh_target.client(mesh_target.transports[0]) as client:
            barrier.wait()
            return client.post("/v1/send", json=BODY, headers={"Idempotency-Key": cmid})

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(one, range(32))) + list(pool.map(one, range(32)))
    for answer in answers:
        api.check(answer)
    assert all(a.status_code in (200, 202) for a in answers), {a.status_code for a in answers}
    assert sum(a.json()["duplicate"] is False for a in answers) == 1
    assert len({a.json()["request_fingerprint"] for a in answers}) == 1
    assert sum(r["client_message_id"] == cmid for r in outbox_rows(api)) == 1
