"""Hostile local clients, hostile peers and poison messages (E-40 … E-44): the limits of spec/tables/limits.yaml at
every boundary, read deadlines that hold while a client stalls, per-transport capacity, malformed HTTP, stream slots
reclaimed, inbound frames that cannot end the link, transient broker answers retried, rows that cannot be carried
never looping, and a state the daemon cannot use refused cleanly.

Every raw connection here is bounded by a deadline and closed by the case; numbers come from the limits table (the
spec's own decision, E-40) or the target's declared timing.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import threading
import time

import httpx
import pytest

from conformance.cases._support import (
    BODY,
    EventStream,
    expect_exit,
    inbox_items,
    parse_responses,
    post_send,
    row_for,
    unique,
    wait_inbound,
    wait_row,
)
from conformance.peer import SILENT, Outcome, PeerConfig, ScriptedBroker
from conformance.registry import case
from conformance.wire import json_object
from reference.core import close_code
from spec import load_table

LIMITS = {name: entry["value"] for name, entry in load_table("limits")["limits"].items()}
DEPTH = LIMITS["json_max_depth"]
DIGITS = LIMITS["json_max_integer_digits"]


def nested(levels: int) -> dict:
    """A meta whose JSON nests ``levels`` objects (so the send body nests ``levels + 1``)."""
    value: dict = {"leaf": 1}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


# --- JSON limits ---------------------------------------------------------------------------------------------------


@case("limits.json_depth", "LIMIT-JSON", "ERR-NO-5XX-ON-BAD-INPUT")
def test_json_depth(api, broker, verdict, timing):
    """A send nesting exactly the limit is accepted and carried; one level more, and far more, is 400."""
    at = unique("depth-at")
    response = post_send(api, {**BODY, "meta": nested(DEPTH - 1)}, at)
    verdict.expect("LIMIT-JSON", response.status_code == 202,
                   f"a body nesting {DEPTH} levels (the limit) answered {response.status_code}: {response.text[:160]}")
    if response.status_code == 202:
        with verdict.check("LIMIT-JSON"):
            wait_row(api, at, "done", timeout=timing.settle_s())
    for levels in (DEPTH, 480, 5000):
        cmid = unique(f"depth-{levels}")
        text = json.dumps({**BODY, "meta": {"x": 1}}).replace('{"x": 1}', '{"a":' * levels + "1" + "}" * levels)
        refused = api.post("/v1/send", content=text.encode(), headers={"Content-Type": "application/json",
                                                                       "Idempotency-Key": cmid})
        verdict.expect("ERR-NO-5XX-ON-BAD-INPUT", refused.status_code < 500,
                       f"a body nesting {levels + 1} levels answered {refused.status_code}")
        with verdict.check("LIMIT-JSON"):
            assert refused.status_code == 400, f"a body nesting {levels + 1} levels answered {refused.status_code}"
            assert json_object(refused).get("error") == "limit_exceeded", refused.text[:160]
            assert row_for(api, cmid) is None, "the refused body left a row"


@case("limits.integer_digits", "LIMIT-JSON", "ERR-NO-5XX-ON-BAD-INPUT")
def test_integer_digits(api, verdict):
    """An integer literal of more than 100 digits in any POST body is 400 limit_exceeded, never a 5xx."""
    for route, body in (("/v1/send", '{{"to":"{to}","message":"m","meta":{{"n":{n}}}}}'),
                        ("/v1/profile", '{{"summary":"s","n":{n}}}')):
        for digits in (DIGITS + 1, 5000):
            text = body.format(to=BODY["to"], n="9" * digits)
            response = api.post(route, content=text.encode(), headers={"Content-Type": "application/json"})
            verdict.expect("ERR-NO-5XX-ON-BAD-INPUT", response.status_code < 500,
                           f"{route} with a {digits}-digit integer answered {response.status_code}")
            verdict.expect("LIMIT-JSON", response.status_code == 400 and
                           json_object(response).get("error") == "limit_exceeded",
                           f"{route} with a {digits}-digit integer: {response.status_code} {response.text[:120]}")


@case("limits.carriable", "LIMIT-CARRIABLE")
def test_what_cannot_be_carried_is_refused_at_accept(launcher, verdict):
    """A broker advertising max_payload.inline_bytes 65536: a message one byte over is 413 at accept; one of exactly
    that size is accepted and delivered."""
    config = PeerConfig(dialect=launcher.dialect)
    config.supported["max_payload"]["params"]["inline_bytes"] = 65536
    with ScriptedBroker(config) as peer:
        instance = launcher.launch("carriable", broker=peer)
        peer.wait_linked(launcher.timing.reconnect_wait_s)
        with instance.unix() as client:
            warm = unique("carriable-warm")  # settles only after the negotiation was applied
            post_send(client, BODY, warm)
            wait_row(client, warm, "done", timeout=launcher.timing.settle_s())
            over = post_send(client, {**BODY, "message": "x" * 65537}, unique("carriable-over"))
            fits = unique("carriable-fits")
            exact = post_send(client, {**BODY, "message": "x" * 65536}, fits)
            with verdict.check("LIMIT-CARRIABLE"):
                assert over.status_code == 413, f"a 65,537-byte message answered {over.status_code}"
                assert exact.status_code == 202, f"a 65,536-byte message answered {exact.status_code}"
                wait_row(client, fits, "done", timeout=launcher.timing.settle_s())


# --- the outbox against transient and oversize answers ---------------------------------------------------------------


@case("outbox.retry_later", "OBX-RETRY-LATER")
@pytest.mark.parametrize("status", [429, 408, 425])
def test_transient_answers_are_retried(api, broker, verdict, timing, status):
    """A 429 (with retry_after_ms 900), 408 or 425 returns the row to pending; it is sent again (no sooner than
    900 ms where the ack said so) and settles done."""
    cmid = unique(f"retry-later-{status}")
    broker.answer(cmid, Outcome("fail", status=status, error={429: "rate_limited", 408: "request_timeout",
                                                              425: "too_early"}[status],
                                retry_after_ms=900 if status == 429 else None))
    post_send(api, BODY, cmid)
    with verdict.check("OBX-RETRY-LATER"):
        wait_row(api, cmid, "done", timeout=timing.settle_s(2) + 2)
        sends = broker.sends_of(cmid)
        assert len(sends) == 2, f"{len(sends)} sends"
        if status == 429:
            gap = sends[1].at - sends[0].at
            assert gap >= 0.9 - 0.02, f"resent {gap:.3f} s after a 429 that said retry_after_ms 900"


@case("link.close_1009", "LINK-1009-DEAD")
def test_a_message_too_big_close_never_loops(api, broker, verdict, timing):
    """Two sends in flight, then the broker closes 1009 (message too big): the larger row goes dead and is never
    sent again; the other is resent and settles done."""
    small, large = unique("1009-small"), unique("1009-large")
    broker.answer(small, SILENT)
    broker.answer(large, *[SILENT] * 5)
    post_send(api, BODY, small)
    post_send(api, {**BODY, "message": "L" * 200_000}, large)
    broker.wait_for(lambda: broker.sends_of(small) and broker.sends_of(large), timing.settle_s(), "both sends")
    broker.drop(close_code("message_too_big"), "message too big")
    with verdict.check("LINK-1009-DEAD"):
        row = wait_row(api, large, "dead", timeout=timing.settle_s() + timing.reconnect_wait_s)
        assert row.get("last_error"), f"the dead row says nothing: {row}"
        wait_row(api, small, "done", timeout=timing.settle_s(2) + timing.reconnect_wait_s)
        time.sleep(1.0)
        assert len(broker.sends_of(large)) == 1, f"the row the link cannot carry was sent " \
                                                 f"{len(broker.sends_of(large))} times"
    broker.forget(small, large)


# --- inbound poison ------------------------------------------------------------------------------------------------


@case("inbound.poison", "LINK-SURVIVES", "INB-QUARANTINE")
def test_poison_frames_neither_end_the_link_nor_come_back(api, broker, verdict):
    """Frames no daemon can take — a push nesting 480 levels, text that is not JSON, a binary frame of invalid
    UTF-8, a schema-invalid push that names its delivery — arrive one by one: the connection is never dropped, the
    next message after each is delivered, and each push that names its delivery is acknowledged (E-41)."""
    link = broker.wait_linked()
    poisons: list[tuple[str, object, str | None]] = []
    deep = broker.push_frame(body="deep", client_message_id=unique("poison-deep"))
    deep["meta"] = nested(480)
    poisons.append(("meta nested 480 levels", deep, deep["delivery_id"]))
    poisons.append(("not JSON", '{"type": "push", "messageId": ', None))
    poisons.append(("invalid UTF-8", b"\xff\xfe\x00garbage", None))
    bad = broker.push_frame(body="x", client_message_id=unique("poison-schema"))
    bad["senderPubkey"] = "not a key"
    poisons.append(("schema-invalid push", bad, bad["delivery_id"]))
    for label, frame, delivery in poisons:
        try:
            broker.send_raw(frame, link.connection)
        except ConnectionError:
            verdict.expect("LINK-SURVIVES", False, f"the link was gone before the {label} frame")
            break
        after = unique("after-poison")
        broker.push(body="after", client_message_id=after, connection=link.connection)
        with verdict.check("LINK-SURVIVES"):
            wait_inbound(api, broker, after, timeout=10)
            assert broker.linked() is not None and broker.linked().connection == link.connection, \
                f"after the {label} frame the daemon reconnected (the link ended)"
        if delivery is not None:
            cmid = frame.get("client_message_id") if isinstance(frame, dict) else None
            acked = any(a["delivery_id"] == delivery or (a["delivery_id"] is None and a["cmid"] == cmid)
                        for a in broker.client_acks())
            verdict.expect("INB-QUARANTINE", acked, f"the {label} was not acknowledged: the broker would deliver it "
                                                    "again forever")
            verdict.expect("INB-QUARANTINE", not [i for i in inbox_items(api)[0]
                                                  if i.get("client_message_id") == cmid],
                           f"the {label} was stored in the inbox")
    verdict.expect("LINK-SURVIVES", not [c for c in broker.closes if c.connection == link.connection],
                   "the daemon closed the link")


@case("inbound.frame_ijson", "LINK-FRAME-IJSON")
def test_binary_and_duplicate_key_pushes_are_not_stored(api, broker, verdict):
    """E-46: a frame is one I-JSON text message. A valid push sent as a binary message and a push naming
    ``senderName`` twice are not stored (the daemon quarantines them, E-41); the next push is."""
    link = broker.wait_linked()
    binary = broker.push_frame(body="binary", client_message_id=unique("ijson-binary"))
    twice = broker.push_frame(body="twice", client_message_id=unique("ijson-twice"))
    messages = [("a push in a binary message", binary, json.dumps(binary).encode()),
                ("a push naming senderName twice", twice,
                 json.dumps(twice).replace('"senderName": "scripted"', '"senderName": "scripted", "senderName": "x"'))]
    for what, frame, message in messages:
        try:
            broker.send_raw(message, link.connection)
        except ConnectionError:
            verdict.blocked(["LINK-FRAME-IJSON"], f"the link was gone before {what}")
        after = unique("after-ijson")
        broker.push(body="after", client_message_id=after, connection=link.connection)
        wait_inbound(api, broker, after, timeout=10)
        stored = [i for i in inbox_items(api)[0] if i.get("client_message_id") == frame["client_message_id"]]
        verdict.expect("LINK-FRAME-IJSON", not stored, f"{what} was stored in the inbox: {stored[:1]}")


# --- the IPC against hostile local clients ---------------------------------------------------------------------


def _read_until_closed(sock: socket.socket, seconds: float) -> tuple[bytes, float | None]:
    """What the server sent until it closed (and after how long), or until ``seconds`` passed (None: still open)."""
    received = b""
    started = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - started < seconds:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return received, time.monotonic() - started
        if not chunk:
            return received, time.monotonic() - started
        received += chunk
    return received, None


@case("transport.head_deadline", "IPC-HEAD-DEADLINE")
@pytest.mark.parametrize("how", ["one_byte", "dribbled"])
def test_a_stalled_head_is_answered_and_closed(mesh_target, verdict, timing, how):
    """A head that does not complete — one byte and silence, or bytes dribbled slower than a head should take — is
    answered 408 and closed within the head deadline (plus slack), on each transport."""
    for transport in mesh_target.transports:
        sock, _ = mesh_target.raw_connection(transport, timeout=timing.header_read_s + 10)
        try:
            sock.sendall(b"G")
            if how == "dribbled":
                def dribble(s=sock):
                    with contextlib.suppress(OSError):
                        for byte in b"ET /v1/health HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 200:
                            s.sendall(bytes([byte]))
                            time.sleep(0.25)
                threading.Thread(target=dribble, daemon=True).start()
            received, closed_after = _read_until_closed(sock, timing.header_read_s + 5)
        finally:
            sock.close()
        answers = parse_responses(received)
        verdict.expect("IPC-HEAD-DEADLINE", closed_after is not None,
                       f"{transport}: a {how} head still held the connection {timing.header_read_s + 5:g} s later")
        verdict.expect("IPC-HEAD-DEADLINE", answers and answers[0][0] == 408,
                       f"{transport}: a {how} head got {[a[0] for a in answers] or 'no answer'} before the close")


@case("transport.body_deadline", "IPC-BODY-DEADLINE")
@pytest.mark.parametrize("how", ["content_length_lies", "chunked_never_ends"])
def test_a_stalled_body_is_answered_and_closed(mesh_target, verdict, timing, how):
    """A body that stops arriving is answered within the body deadline (plus slack) and the connection closed;
    nothing is stored."""
    cmid = unique(f"stalled-{how}")
    for transport in mesh_target.transports:
        sock, headers = mesh_target.raw_connection(transport, timeout=timing.body_read_s + 10)
        head = {**headers, "Content-Type": "application/json", "Idempotency-Key": cmid}
        if how == "content_length_lies":
            request = ("POST /v1/send HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items())
                       + "Content-Length: 500\r\n\r\n").encode() + b'{"to":'
        else:
            request = ("POST /v1/send HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items())
                       + "Transfer-Encoding: chunked\r\n\r\n6\r\n").encode() + b'{"to":\r\n'
        try:
            sock.sendall(request)
            received, closed_after = _read_until_closed(sock, timing.body_read_s + 5)
        finally:
            sock.close()
        answers = parse_responses(received)
        verdict.expect("IPC-BODY-DEADLINE", closed_after is not None and answers,
                       f"{transport}: a stalled body got {[a[0] for a in answers] or 'no answer'} and the "
                       f"connection {'closed' if closed_after is not None else 'stayed open'} within "
                       f"{timing.body_read_s + 5:g} s")
    with mesh_target.client(mesh_target.transports[0]) as client:
        verdict.expect("IPC-BODY-DEADLINE", row_for(client, cmid) is None, "a stalled body left a row")


MALFORMED = [  # label, raw request (Host added), the status E-43 wants
    ("bad request line", b"GARBAGE\r\n\r\n", 400),
    ("bad header line", b"GET /v1/health HTTP/1.1\r\nNo colon here\r\n\r\n", 400),
    ("URI of 5000 bytes", b"GET /v1/health?" + b"a" * 5000 + b" HTTP/1.1\r\n\r\n", 414),
    ("120 header fields", b"GET /v1/health HTTP/1.1\r\n" + b"".join(b"X-H%d: v\r\n" % n for n in range(120))
     + b"\r\n", 431),
    ("a 9000-byte header field", b"GET /v1/health HTTP/1.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", 431),
    ("a bad chunk size", b"POST /v1/send HTTP/1.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked"
     b"\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", 400),
]


@case("transport.malformed_http", "IPC-MALFORMED-HTTP")
@pytest.mark.parametrize(("label", "raw", "status"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_http_gets_a_problem(mesh_target, verdict, label, raw, status):
    for transport in mesh_target.transports:
        sock, headers = mesh_target.raw_connection(transport, timeout=10)
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode()
        first_line_end = raw.find(b"\r\n") + 2
        request = raw if raw.startswith(b"GARBAGE") else raw[:first_line_end] + extra + raw[first_line_end:]
        try:
            sock.sendall(request)
            received, _ = _read_until_closed(sock, 8)
        finally:
            sock.close()
        answers = parse_responses(received)
        with verdict.check("IPC-MALFORMED-HTTP"):
            assert answers, f"{transport}: {label} got no HTTP answer"
            got, response_headers, body = answers[0]
            assert got == status, f"{transport}: {label} answered {got}, E-43 says {status}"
            assert response_headers.get("content-type", "").startswith("application/problem+json"), \
                f"{transport}: {label} answered {response_headers.get('content-type')}"
            assert isinstance(json.loads(body or b"null"), dict), body[:100]


@case("transport.capacity_per_transport", "IPC-TRANSPORT-CAPACITY")
def test_tcp_clients_cannot_starve_the_unix_socket(mesh_target, verdict):
    """Past the TCP connection cap, clients that send one byte and nothing more: the unix socket keeps answering
    at once, every time."""
    if not {"unix", "tcp"} <= set(mesh_target.transports):
        pytest.skip("needs both transports")
    address = mesh_target.tcp_address()
    held: list[socket.socket] = []
    try:
        for _ in range(LIMITS["ipc_connections_per_transport"] + 44):
            with contextlib.suppress(OSError):
                sock = socket.create_connection(address, timeout=2)
                sock.sendall(b"G")
                held.append(sock)
        slow = []
        with mesh_target.client("unix", timeout=5) as client:
            for _ in range(20):
                started = time.monotonic()
                status = None
                with contextlib.suppress(OSError, httpx.HTTPError):
                    status = client.get("/v1/health").status_code
                took = time.monotonic() - started
                if status != 200 or took > 1.0:
                    slow.append((status, round(took, 2)))
        verdict.expect("IPC-TRANSPORT-CAPACITY", not slow,
                       f"with {len(held)} TCP clients holding one byte each, the unix socket answered {slow}")
    finally:
        for sock in held:
            with contextlib.suppress(OSError):
                sock.close()


@case("events.slot_reclaim", "SSE-SLOT-RECLAIM")
def test_vanished_stream_clients_free_their_slots(mesh_target, verdict):
    """Every stream slot taken, then all those clients vanish (their sockets shut): new streams open at once."""
    cap = LIMITS["ipc_streams_per_transport"]
    streams = [EventStream(mesh_target, {"Last-Event-ID": "999999999999"}) for _ in range(cap)]
    opened = [s.opened(10) for s in streams]
    for stream in streams:
        stream.close()
    if opened.count(200) < cap:
        verdict.blocked(["SSE-SLOT-RECLAIM"], f"only {opened.count(200)} of {cap} streams opened to begin with")
    time.sleep(0.3)
    again = [EventStream(mesh_target, {"Last-Event-ID": "999999999999"}) for _ in range(cap)]
    try:
        statuses = [s.opened(10) for s in again]
    finally:
        for stream in again:
            stream.close()
    verdict.expect("SSE-SLOT-RECLAIM", statuses.count(200) == cap,
                   f"0.3 s after {cap} stream clients vanished, {statuses.count(200)} of {cap} new streams opened "
                   f"({sorted(set(map(str, statuses)))})")


# --- a state the daemon cannot use -----------------------------------------------------------------------------------


@case("lifecycle.state_refused", "LIFE-STATE-REFUSED", "LIFE-EXIT-CODES")
def test_an_unusable_outbox_is_refused_cleanly(launcher, verdict):
    """outbox.db replaced by a directory: the daemon refuses to start with exit 5 and a line, not a traceback."""
    with ScriptedBroker(PeerConfig(dialect=launcher.dialect)) as peer:
        instance = launcher.launch("state-refused", broker=peer)
        instance.stop()
        path = instance.file("outbox_db")
        for candidate in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            if candidate.is_dir():
                shutil.rmtree(candidate)
            else:
                candidate.unlink(missing_ok=True)
        path.mkdir()
        instance.start(wait=False)
        try:
            code = instance.wait_exit(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
            instance.kill9()
        tail = instance.tail(60)
        verdict.expect("LIFE-STATE-REFUSED", code not in (None, 0) and "Traceback" not in tail,
                       f"with outbox.db a directory the daemon {'kept running' if code is None else f'exited {code}'}"
                       + (" after a traceback" if "Traceback" in tail else ""))
        if code not in (None, 0):
            expect_exit(verdict, code, "outbox_integrity_failed", "an unusable outbox.db")
