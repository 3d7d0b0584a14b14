"""Inbound messages (§5): dedupe, client_ack, the inbox cursor, SSE and Last-Event-ID replay. Transports and auth
(§3.2, §3.4): socket mode, bearer, query token, Host, Origin, size limits."""

from __future__ import annotations

import json
import os
import stat

import httpx
import pytest

from conformance.cases._support import http_request, pipelined, read_events, unique
from conformance.registry import case
from spec import validator


def inbox_all(api, **params):
    items, cursor = [], None
    while True:
        page = api.get("/v1/inbox", params={**params, **({"cursor": cursor} if cursor else {}), "limit": 7}).json()
        items += page["items"]
        if not page["items"]:
            return items, page["next_cursor"]
        cursor = page["next_cursor"]


@case("inbound.dedupe_and_ack", "INB-DEDUPE", "INB-DURABLE-BEFORE-ACK")
def test_dedupe_and_ack(api, broker):
    cmid = unique("in")
    seen = {}

    def on_receive(frame):
        if frame.get("type") == "client_ack" and frame.get("clientMessageId") == cmid:
            seen[frame["delivery_id"]] = any(i["client_message_id"] == cmid for i in inbox_all(api)[0])

    broker.on_receive = on_receive
    try:
        first = broker.push(body="hello", client_message_id=cmid)
        second = broker.push(body="hello again", client_message_id=cmid, attempt=2)
        broker.wait_for(lambda: len(seen) == 2, what="both client_acks checked")
    finally:
        broker.on_receive = None
    assert seen == {first["delivery_id"]: True, second["delivery_id"]: True}
    rows = [i for i in inbox_all(api)[0] if i["client_message_id"] == cmid]
    assert len(rows) == 1 and rows[0]["body"] == "hello" and rows[0]["broker_message_id"] == first["messageId"]


@case("inbound.invalid_frames", "INB-SCHEMA")
def test_invalid_pushes_are_dropped(api, broker):
    cmid = unique("evil")
    broker.send_raw({"type": "push", "messageId": "01M", "meshId": "m", "senderPubkey": "zz", "body": "x",
                     "client_message_id": cmid, "createdAt": "2026-01-01T00:00:00Z", "sneaky": True})
    good = unique("good")
    broker.push(body="fine", client_message_id=good)
    broker.wait_for(lambda: any(a.get("clientMessageId") == good for a in broker.received("client_ack")))
    ids = {i["client_message_id"] for i in inbox_all(api)[0]}
    assert good in ids and cmid not in ids
    assert not any(a.get("clientMessageId") == cmid for a in broker.received("client_ack"))


@case("inbound.cursor_paging", "INBOX-CURSOR", "INBOX-FILTERS")
def test_cursor_paging_and_filters(api, broker):
    sender = "ef" * 32
    topic = "paging"
    pushed = [unique("page") for _ in range(16)]
    for n, cmid in enumerate(pushed):
        broker.push(body=f"p{n}", client_message_id=cmid, sender=sender if n % 2 else "ab" * 32,
                    topic=topic if n % 4 == 0 else None)
    broker.wait_for(lambda: {a.get("clientMessageId") for a in broker.received("client_ack")} >= set(pushed))
    items, resume = inbox_all(api)
    ids = [i["client_message_id"] for i in items]
    assert len(ids) == len(set(ids)), "a page boundary repeated a row"
    assert [i for i in ids if i in pushed] == pushed, "rows out of order or missing"
    seqs = [i["seq"] for i in items]
    assert seqs == sorted(seqs)
    assert resume, "next_cursor lets a consumer resume"
    later = unique("later")
    broker.push(body="later", client_message_id=later)
    broker.wait_for(lambda: any(a.get("clientMessageId") == later for a in broker.received("client_ack")))
    assert [i["client_message_id"] for i in api.get("/v1/inbox", params={"cursor": resume}).json()["items"]] == [later]
    by_sender = {i["client_message_id"] for i in inbox_all(api, **{"from": sender})[0]}
    assert by_sender == {c for n, c in enumerate(pushed) if n % 2}
    by_topic = {i["client_message_id"] for i in inbox_all(api, topic=topic)[0]}
    assert by_topic == {c for n, c in enumerate(pushed) if n % 4 == 0}
    assert api.get("/v1/inbox", params={"cursor": "!!not-ours!!"}).status_code == 400


@case("events.replay", "SSE-IDS-MONOTONIC", "SSE-REPLAY", "SSE-PAYLOADS")
def test_sse_replay(api, broker, mesh_target):
    marks = [unique("sse") for _ in range(3)]
    for cmid in marks:
        broker.push(body=cmid, client_message_id=cmid)
    broker.wait_for(lambda: {a.get("clientMessageId") for a in broker.received("client_ack")} >= set(marks))

    def has_all(events):
        return {e["json"].get("client_message_id") for e in events if e["event"] == "message"} >= set(marks)

    with mesh_target.client(mesh_target.transports[0]) as client:
        events = read_events(client, {"Last-Event-ID": "0"}, has_all)
        ids = [int(e["id"]) for e in events if e.get("id")]
        assert ids == sorted(ids) and len(ids) == len(set(ids))
        for event in events:
            errors = list(validator(f"sse/{event['event']}").iter_errors(event["json"]))
            assert not errors, (event["event"], errors[0].message)
        first = next(e for e in events if e["event"] == "message" and e["json"]["client_message_id"] == marks[0])
        replay = read_events(client, {"Last-Event-ID": first["id"]},
                             lambda evs: any(e["json"].get("client_message_id") == marks[2] for e in evs))
    replayed = [e["json"].get("client_message_id") for e in replay if e["event"] == "message"]
    assert marks[0] not in replayed and replayed[:2] == marks[1:]


@case("transport.auth", "AUTH-BEARER", "AUTH-TOKEN-QUERY", "AUTH-HOST", "AUTH-ORIGIN")
def test_tcp_auth_matrix(tcp_api, mesh_target):
    base = str(tcp_api.client.base_url)
    token = tcp_api.client.headers["Authorization"].split(" ", 1)[1]
    with httpx.Client(base_url=base, verify=False) as anonymous:
        for near in (token[:-1], token + "x", token.upper() if token != token.upper() else token.lower()):
            almost = anonymous.get("/v1/health", headers={"Authorization": f"Bearer {near}"})
            tcp_api.check(almost)
            assert (almost.status_code, almost.json()["error"]) == (401, "invalid_bearer_token"), near
        response = anonymous.get("/v1/health")
        tcp_api.check(response)
        assert (response.status_code, response.json()["error"]) == (401, "missing_bearer_token")
        wrong = anonymous.get("/v1/health", headers={"Authorization": "Bearer not-the-token"})
        tcp_api.check(wrong)
        assert (wrong.status_code, wrong.json()["error"]) == (401, "invalid_bearer_token")
    assert tcp_api.get("/v1/health", params={"token": token}).json()["error"] == "token_in_query"
    assert tcp_api.get("/v1/health", headers={"Host": "attacker.example"}).json()["error"] == "forbidden_host"
    assert tcp_api.get("/v1/health", headers={"Origin": "https://attacker.example"}).json()["error"] == \
        "forbidden_origin"
    port = base.rsplit(":", 1)[1]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        assert tcp_api.get("/v1/health", headers={"Host": host}).status_code == 200, host


@case("transport.socket_mode", "AUTH-UDS-MODE", "AUTH-TOKEN-FILE")
def test_socket_and_token_modes(mesh_target):
    instance = mesh_target.launched
    if instance is None:
        pytest.skip("the harness does not know where the target keeps its socket and token")
    assert stat.S_IMODE(os.stat(instance.socket_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(instance.state_dir).st_mode) & 0o077 == 0
    assert stat.S_IMODE(os.stat(instance.token_file).st_mode) == 0o600
    token = instance.token_file.read_text().strip()
    assert len(token) >= 43, "32 random bytes, base64url"


MALFORMED = [b"{", b"\xff\xfe", b"[1]", b'{"to":"#a","message":NaN}', b"[" * 50_000, b'{"a":1,"a":2}', b"null",
             b'"just a string"', b'{"to":"#a","message":"m"} trailing']


@case("transport.malformed_json", "ERR-NO-5XX-ON-BAD-INPUT", "ERR-PROBLEM-JSON")
@pytest.mark.parametrize("route", ["/v1/send", "/v1/profile", "/v1/outbox/requeue"])
def test_malformed_json_is_a_4xx_problem(api, route):
    for body in MALFORMED:
        response = api.post(route, content=body, headers={"Content-Type": "application/json"})
        assert 400 <= response.status_code < 500, (route, body[:20], response.status_code)
        assert response.headers["content-type"].startswith("application/problem+json")


@case("transport.limits", "LIMIT-BODY", "ERR-PROBLEM-JSON")
def test_size_limit(api):
    big = b'{"to":"#general","message":"' + b"x" * (1024 * 1024 + 16) + b'"}'
    response = api.post("/v1/send", content=big, headers={"Content-Type": "application/json"})
    assert (response.status_code, response.json()["error"]) == (413, "payload_too_large")
    media = api.post("/v1/send", content=b"to=x", headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert (media.status_code, media.json()["error"]) == (415, "unsupported_media_type")


def _chunks(payload: bytes, size: int = 4096):
    for start in range(0, len(payload), size):
        yield payload[start:start + size]


@case("transport.early_answer", "IPC-HTTP-BODY", "LIMIT-BODY")
@pytest.mark.parametrize("content_type, status, error", [("application/json", 413, "payload_too_large"),
                                                         ("text/plain", 415, "unsupported_media_type")])
def test_an_early_answer_reaches_the_client_and_keeps_the_connection(mesh_target, content_type, status, error):
    """A 3 MiB send refused on its headers, then a health check pipelined behind it on the same connection: both
    answers come back, in order (E-34). A server that closes on the unread body loses the second one (and, as the
    client is still writing, may lose the first to a reset)."""
    big = b'{"to":"#general","message":"' + b"x" * (3 * 1024 * 1024) + b'"}'
    for transport in mesh_target.transports:
        sock, headers = mesh_target.raw_connection(transport)
        answers = pipelined(sock, [
            http_request("POST", "/v1/send", {**headers, "Content-Type": content_type}, big),
            http_request("GET", "/v1/health", {**headers, "Connection": "close"})])
        assert [a[0] for a in answers] == [status, 200], (transport, answers[:1])
        assert answers[0][1]["content-type"].startswith("application/problem+json")
        problem = json.loads(answers[0][2])
        assert problem["error"] == error and not list(validator("ipc/problem").iter_errors(problem))


@case("transport.chunked_body", "IPC-HTTP-BODY", "LIMIT-BODY")
def test_chunked_bodies_are_read_and_held_to_the_limit(api):
    """A chunked send (no Content-Length) is read like any other and held to the same limit (E-34). Streamed bodies
    go around the contract client, which records only bodies it can read."""
    small = json.dumps({"to": "#general", "message": "chunked", "client_message_id": unique("chunked")}).encode()
    good = api.client.post("/v1/send", content=_chunks(small), headers={"Content-Type": "application/json"})
    assert good.request.headers.get("Transfer-Encoding") == "chunked"
    assert good.status_code == 202, good.text
    big = b'{"to":"#general","message":"' + b"x" * (3 * 1024 * 1024) + b'"}'
    too_big = api.client.post("/v1/send", content=_chunks(big), headers={"Content-Type": "application/json"})
    assert (too_big.status_code, too_big.json()["error"]) == (413, "payload_too_large")
    assert too_big.headers["content-type"].startswith("application/problem+json")
    assert not list(validator("ipc/problem").iter_errors(too_big.json()))
