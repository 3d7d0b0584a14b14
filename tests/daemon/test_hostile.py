"""Hostile local clients and a hostile broker peer against a real daemon (gunicorn, real sockets): issue 11.

Every case here once broke the reference: a request that got a 5xx, a traceback or no answer, a client that froze
the IPC for everyone, a frame that cut the daemon off the mesh. Each now gets a clean, documented answer within a
bound, and nothing else is disturbed (E-40..E-44). Deadlines are lowered in the daemon's config (HOSTILE_CONFIG) so
the cases run in seconds; bench/hostile_health.py measures the same at the default limits.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from hostile_testkit import (
    HOSTILE_CONFIG,
    closed_by_peer,
    connect,
    head,
    health_latencies,
    held,
    hostile_config,
    percentile,
    problem,
    read_answer,
)

from conformance.launch import REFERENCE_TEMPLATE, Launched
from conformance.peer import DEFAULT_SUPPORTED, SILENT, PeerConfig, ScriptedBroker
from reference.core.codes import exit_code
from spec import validator

SEND = json.dumps({"to": "#general", "message": "hello"}).encode()
PROBLEM = validator("ipc/problem")


def assert_problem(answer, status: int, error: str) -> dict:
    body = problem(answer)
    assert (answer[0], body["error"]) == (status, error), body
    assert not list(PROBLEM.iter_errors(body)), body
    return body


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One scripted broker and one daemon for the cases that leave nothing behind but their own ids."""
    with ScriptedBroker() as peer:
        state_dir = tmp_path_factory.mktemp("hostile") / "d"
        state_dir.mkdir(mode=0o700)
        (state_dir / "config.toml").write_text(HOSTILE_CONFIG)
        daemon = Launched(REFERENCE_TEMPLATE, state_dir, peer.url).start()
        daemon.wait_connected()
        try:
            yield peer, daemon
        finally:
            daemon.stop(timeout=10)


@pytest.fixture
def hostile(shared):
    return shared[1]


@pytest.fixture
def peer(shared):
    return shared[0]


def outbox_row(daemon, cmid: str) -> dict | None:
    with daemon.unix() as client:
        items = client.get("/v1/outbox", params={"limit": 500}).json()["items"]
    return next((row for row in items if row["client_message_id"] == cmid), None)


def wait_row(daemon, cmid: str, status: str, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = outbox_row(daemon, cmid)
        if row is not None and row["status"] == status:
            return row
        time.sleep(0.05)
    raise AssertionError(f"{cmid} never reached {status}: {outbox_row(daemon, cmid)}")


def meshd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reference.cli", *args], capture_output=True, text=True, timeout=60,
                          check=False)


# --- request bodies (E-29, E-40) -----------------------------------------------------------------------------------

@pytest.mark.parametrize("route", ["/v1/send", "/v1/profile", "/v1/outbox/requeue"])
def test_a_post_without_content_type_is_415(hostile, route):
    """IPC-MEDIA-TYPE (E-29): a POST body without a Content-Type is refused 415, as the OpenAPI document says."""
    with hostile.unix() as client:
        answer = client.post(route, content=SEND, headers={"Idempotency-Key": "no-content-type"})
    assert (answer.status_code, answer.json()["error"]) == (415, "unsupported_media_type")
    assert outbox_row(hostile, "no-content-type") is None


@pytest.mark.parametrize(("route", "body"), [
    ("/v1/send", b'{"to":"#general","message":"m","meta":{"n":' + b"9" * 4301 + b"}}"),
    ("/v1/send", b'{"to":"#general","message":"m","meta":{"n":-' + b"1" * 101 + b"}}"),
    ("/v1/profile", b'{"summary":' + b"7" * 5000 + b"}"),
    ("/v1/outbox/requeue", b'{"id":' + b"7" * 4000 + b"}"),
])
def test_a_giant_integer_literal_is_a_400_problem(hostile, route, body):
    """LIMIT-JSON (E-40): an integer literal past json_max_integer_digits is a 400 limit_exceeded, not a 500."""
    with hostile.unix() as client:
        answer = client.post(route, content=body, headers={"Content-Type": "application/json",
                                                           "Idempotency-Key": "giant-int"})
        assert (answer.status_code, answer.json()["error"]) == (400, "limit_exceeded"), answer.text
        assert not list(PROBLEM.iter_errors(answer.json()))
        assert outbox_row(hostile, "giant-int") is None


def _body_of_depth(levels: int) -> bytes:
    """A send body nesting ``levels`` deep: the body object, and meta's levels - 1 objects inside it."""
    return b'{"to":"#general","message":"m","meta":' + b'{"a":' * (levels - 2) + b"{}" + b"}" * (levels - 2) + b"}"


def test_json_nesting_is_held_to_the_limit_at_the_ipc(hostile):
    """LIMIT-JSON (E-40): a body may nest json_max_depth (32) levels; one more, or the ~480 that once killed every
    receiver's link, is a 400 limit_exceeded and nothing is stored."""
    with hostile.unix() as client:
        headers = {"Content-Type": "application/json"}
        assert client.post("/v1/send", content=_body_of_depth(32), headers={**headers, "Idempotency-Key": "deep-32"}
                           ).status_code == 202
        for levels in (33, 480, 5000):
            answer = client.post("/v1/send", content=_body_of_depth(levels),
                                 headers={**headers, "Idempotency-Key": f"deep-{levels}"})
            assert (answer.status_code, answer.json()["error"]) == (400, "limit_exceeded"), (levels, answer.text)
            assert outbox_row(hostile, f"deep-{levels}") is None


@pytest.mark.parametrize("inline_bytes", [65_536, 100_000])
def test_a_send_the_link_cannot_carry_is_413_at_accept(make_daemon, inline_bytes):
    """LIMIT-CARRIABLE (E-40): a message past the negotiated max_payload.inline_bytes is refused at accept with 413
    and stores nothing; one at the limit is accepted and delivered -- whatever limit the broker advertised."""
    supported = json.loads(json.dumps(DEFAULT_SUPPORTED))
    supported["max_payload"]["params"]["inline_bytes"] = inline_bytes
    with ScriptedBroker(PeerConfig(supported=supported)) as peer:
        daemon = make_daemon(peer.url, config=HOSTILE_CONFIG)
        daemon.wait_connected()
        with daemon.unix() as client:
            over = client.post("/v1/send", json={"to": "#general", "message": "x" * (inline_bytes + 1)},
                               headers={"Idempotency-Key": "too-big"})
            assert (over.status_code, over.json()["error"]) == (413, "payload_too_large"), over.text
            at = client.post("/v1/send", json={"to": "#general", "message": "x" * inline_bytes},
                             headers={"Idempotency-Key": "just-fits"})
            assert at.status_code == 202, at.text
        wait_row(daemon, "just-fits", "done")
        assert outbox_row(daemon, "too-big") is None
        assert peer.sends_of("just-fits") and peer.sends_of("too-big") == []


# --- before the request is read (E-43) -----------------------------------------------------------------------------

def test_silent_and_dribbling_heads_never_block_the_unix_socket(broker, make_daemon):
    """IPC-HEAD-DEADLINE, IPC-TRANSPORT-CAPACITY (E-43): 200 TCP connections that send one byte, and 40 that dribble
    a head a byte every 0.2 s, take no request thread: health on the unix socket answers at once while they are
    held, each gets 408 request_timeout once ipc.header_read_s (3 s here) has passed since its first byte -- the
    dribbled bytes do not extend it -- and is closed, and TCP serves again. (Before: 128 such connections froze the
    whole IPC, the unix socket included, for as long as they stayed open.)"""
    daemon = make_daemon(broker.url, config=hostile_config(header_read_s=3.0))
    stop = threading.Event()
    with held(daemon, 200) as one_byte, held(daemon, 40, b"GET /v1/hea") as dribbling:
        started = time.monotonic()

        def dribble() -> None:
            while not stop.wait(0.2):
                for sock in dribbling:
                    with contextlib.suppress(OSError):
                        sock.send(b"l")

        dribbler = threading.Thread(target=dribble, daemon=True)
        dribbler.start()
        try:
            latencies = health_latencies(daemon.socket_path, 150)
            assert time.monotonic() - started < 3.0, "measured while every hostile connection was held"
            assert percentile(latencies, 0.99) < 0.25, sorted(latencies)[-5:]
            answers = [read_answer(sock, 6) for sock in one_byte[:10] + dribbling[:10]]
        finally:
            stop.set()
            dribbler.join()
        for answer in answers:
            assert_problem(answer, 408, "request_timeout")
        assert time.monotonic() - started < 5.5
        assert closed_by_peer(one_byte[0]) and closed_by_peer(dribbling[0])
    with daemon.tcp() as client:
        assert client.get("/v1/health").status_code == 200


def test_a_tcp_flood_past_the_connection_cap_leaves_the_unix_socket_alone(broker, make_daemon):
    """IPC-TRANSPORT-CAPACITY (E-43): past ipc.max_connections (20 here) a TCP connection is closed at once; the unix
    socket has its own 20 and keeps answering."""
    daemon = make_daemon(broker.url, config=hostile_config(max_connections=20, header_read_s=5.0))
    with held(daemon, 20, b"") as idle, held(daemon, 10, b"") as extra:
        assert all(closed_by_peer(sock, 2) for sock in extra)
        with daemon.unix() as client:
            assert client.get("/v1/health").status_code == 200
        assert not closed_by_peer(idle[0], 0.2)  # the first 20 are still open


def test_clients_that_never_close_do_not_stall_the_accept_loop(hostile):
    """IPC-LINGERING-CLOSE (E-43): 60 clients that send HTTP/1.0 requests (answered and closed by the daemon) and
    then neither read nor close; each graceful close lingers off the accept loop, so the unix socket answers at once.
    (gunicorn lingers up to 2 s per such connection on the loop itself: two minutes without an accept.)"""
    request = b"GET /v1/health HTTP/1.0\r\nHost: localhost\r\nAuthorization: Bearer %s\r\n\r\n" % (
        hostile.token_file.read_text().strip().encode())
    with held(hostile, 60, request):
        time.sleep(0.3)
        latencies = health_latencies(hostile.socket_path, 60)
    assert percentile(latencies, 0.99) < 0.5, sorted(latencies)[-5:]


def test_the_closer_lingers_at_most_its_cap():
    """IPC-LINGERING-CLOSE, LIMIT-TABLE: the closer lingers at most ipc_lingering_connections connections (its default
    cap); one handed to it past its cap is closed at once, and those within it stay half-open for their client."""
    from reference.core.limits import limit
    from reference.daemon.server import LingeringCloser

    assert LingeringCloser(linger_s=1.0, drain_bytes=1).max_sockets == limit("ipc_lingering_connections")
    closer = LingeringCloser(linger_s=30.0, drain_bytes=1024, max_sockets=2)
    closer.start()
    pairs = [socket.socketpair() for _ in range(3)]
    try:
        for ours, _ in pairs:
            closer.linger(ours)
        deadline = time.monotonic() + 5
        while pairs[2][0].fileno() != -1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [ours.fileno() == -1 for ours, _ in pairs] == [False, False, True]
        assert pairs[0][1].recv(1) == b""  # half-closed: the client reads the end of the answer
        pairs[0][1].sendall(b"still writing")  # and may still write; the closer reads and drops it
    finally:
        closer.stop()
        closer.join(5)
        for ours, theirs in pairs:
            ours.close()
            theirs.close()


def test_stalled_bodies_are_answered_within_their_deadline(hostile):
    """IPC-BODY-DEADLINE (E-43): a body that stops coming -- a Content-Length that lies, a chunked body that never
    ends -- is answered within ipc.body_read_s (1.5 s here), whether the request is refused early (401 over TCP) or
    read (408 request_timeout), and the connection is closed. (Before: no answer after 20 s.)"""
    cases = [
        ("tcp", head("POST", "/v1/send", hostile, "tcp", Authorization="", Content_Type="application/json",
                     Content_Length=1000) + b'{"to"', 401, "missing_bearer_token"),
        ("unix", head("POST", "/v1/send", Content_Type="application/json", Content_Length=1000) + b'{"to"', 408,
         "request_timeout"),
        ("unix", head("POST", "/v1/send", Content_Type="application/json", Transfer_Encoding="chunked")
         + b'5\r\n{"to"\r\n', 408, "request_timeout"),
        ("tcp", head("POST", "/v1/profile", hostile, "tcp", Content_Type="application/json", Content_Length=500)
         + b"{", 408, "request_timeout"),
    ]
    socks = []
    for transport, request, _, _ in cases:
        sock = connect(hostile, transport)
        sock.sendall(request)
        socks.append(sock)
    for sock, (transport, _, status, error) in zip(socks, cases, strict=True):
        answer = read_answer(sock, 4)
        assert_problem(answer, status, error)
        assert answer[3] < 3.5, (transport, error, answer[3])
        assert answer[1]["connection"] == "close"
        assert closed_by_peer(sock, 3)
    with hostile.unix() as client:
        assert client.get("/v1/health").status_code == 200


def test_stalled_tcp_bodies_never_make_the_unix_socket_busy(hostile):
    """IPC-TRANSPORT-CAPACITY (E-43): 70 authenticated TCP sends whose bodies stall fill TCP's in-flight cap (64),
    not the unix socket's: health there stays 200 (before: every request, health included, answered 429)."""
    request = head("POST", "/v1/send", hostile, "tcp", Content_Type="application/json", Content_Length=100) + b"{"
    with held(hostile, 70, request) as stalled:
        time.sleep(0.3)
        with hostile.unix() as client:
            assert client.get("/v1/health").status_code == 200
        statuses = sorted(read_answer(sock, 5)[0] for sock in stalled)
    assert set(statuses) <= {408, 429} and 408 in statuses, statuses


@pytest.mark.parametrize(("request_bytes", "status", "error"), [
    (b"GARBAGE\r\n\r\n", 400, "malformed_http"),
    (b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\nBad Header\r\n\r\n", 400, "malformed_http"),
    (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n", 414, "uri_too_long"),
    (b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n" + b"".join(b"X-F%d: 1\r\n" % i for i in range(120))
     + b"\r\n", 431, "header_fields_too_large"),
    (b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n", 431,
     "header_fields_too_large"),
    (b"POST /v1/send HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked"
     b"\r\n\r\nZZ\r\n{}\r\n0\r\n\r\n", 400, "malformed_http"),
], ids=["request-line", "header-line", "uri", "header-count", "header-size", "chunk-size"])
@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_malformed_http_is_answered_with_problem_json(hostile, request_bytes, status, error, transport):
    """ERR-PROBLEM-JSON, IPC-MALFORMED-HTTP (E-43): what gunicorn refused as a text/html page is a problem+json
    body with a stable code, and the connection is closed."""
    if transport == "tcp" and request_bytes.startswith(b"POST"):  # past the parser's checks: it needs its token
        token = hostile.token_file.read_text().strip().encode()
        request_bytes = request_bytes.replace(b"Host: localhost\r\n", b"Host: localhost\r\nAuthorization: Bearer "
                                              + token + b"\r\n")
    sock = connect(hostile, transport)
    sock.sendall(request_bytes)
    answer = read_answer(sock, 5)
    assert_problem(answer, status, error)
    assert closed_by_peer(sock, 3)


# --- event streams (E-43) ------------------------------------------------------------------------------------------

def _open_stream(daemon, transport: str) -> socket.socket:
    sock = connect(daemon, transport)
    sock.sendall(head("GET", "/v1/events", daemon, transport))
    sock.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096)
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    return sock


def test_event_stream_slots_are_freed_when_clients_vanish(broker, make_daemon):
    """SSE-SLOT-RECLAIM (E-43): clients that drop their streams free their slots at once, not after the next keepalive
    (15 s): a new stream is served right away. Streams are counted per transport."""
    daemon = make_daemon(broker.url, config=hostile_config(max_streams=3))
    for _ in range(3):  # churn: fill, vanish, refill
        streams = [_open_stream(daemon, "unix") for _ in range(3)]
        with daemon.unix() as client:
            assert client.get("/v1/events").status_code == 429
        for sock in streams:
            sock.close()
        replacement = _open_stream(daemon, "unix")
        replacement.close()
    tcp_streams = [_open_stream(daemon, "tcp") for _ in range(3)]
    try:
        _open_stream(daemon, "unix").close()  # TCP's three do not take the unix socket's slots
    finally:
        for sock in tcp_streams:
            sock.close()


# --- the broker link (E-40, E-41, E-42) ----------------------------------------------------------------------------

def _health(daemon) -> dict:
    with daemon.unix() as client:
        return client.get("/v1/health").json()


def test_poison_frames_are_quarantined_acknowledged_and_the_link_stays_up(peer, hostile):
    """INB-QUARANTINE, LINK-SURVIVES (E-41): the push whose meta nests 480 levels (it killed every receiver's link),
    and frames that are not JSON, not UTF-8, binary, too large or schema-invalid: each is quarantined with its reason
    and counted; the pushes that name their delivery are acknowledged so the broker stops redelivering them (a
    redelivery is counted, not stored twice); the link never drops and the next message is delivered."""
    broker = peer
    before = _health(hostile)
    with hostile.unix() as client:
        counted_before = _invalid_inbound(client.get("/v1/metrics").text)
    connections = broker.wait_connected()
    deep = broker.push(body="poison", client_message_id="deep-push", meta=json.loads('{"a":' * 480 + "1" + "}" * 480))
    broker.send_raw("not json at all")
    broker.send_raw(json.dumps({"type": "push", "messageId": "01JXAMPLE0000000000000000", "meshId": "mesh",
                                "senderPubkey": "zz", "body": "", "client_message_id": "bad-schema",
                                "delivery_id": "d-bad", "attempt": 1, "createdAt": "2026-01-01T00:00:00Z",
                                "priority": "next"}))
    conn = broker._connections[connections]  # raw frames the scripted broker's helpers cannot write
    conn.send(b"\xff\xfe{", text=True)
    conn.send(b"\x00\x01binary")
    conn.send("x" * 1_200_000)  # past link_frame_max_bytes (1114112)
    broker.send_raw({**deep, "attempt": 2})  # the broker redelivers the poison: counted, not a new row
    broker.push(body="still alive", client_message_id="after-poison")
    acks = broker.wait_for(lambda: [a for a in broker.received("client_ack")
                                    if a["clientMessageId"] == "after-poison"], 15, "the next message's ack")
    assert acks
    health = _health(hostile)
    assert health["connected"] and health["link_restarts"] == 0, health
    assert broker.wait_connected() == connections, "the link never dropped"
    assert health["quarantined"] - before["quarantined"] == 6, health
    acked = [a["clientMessageId"] for a in broker.received("client_ack")]
    assert acked.count("deep-push") == 2 and "bad-schema" in acked and acked[-1] == "after-poison"
    with hostile.unix() as client:
        inbox = [i["client_message_id"] for i in client.get("/v1/inbox", params={"limit": 1000}).json()["items"]]
        assert "after-poison" in inbox and "deep-push" not in inbox and "bad-schema" not in inbox
        assert _invalid_inbound(client.get("/v1/metrics").text) - counted_before == 7
    listing = meshd("inbox", "quarantine", "--state-dir", str(hostile.state_dir), "--json")
    assert listing.returncode == 0, listing.stderr
    records = json.loads(listing.stdout)
    by_id = {r["client_message_id"]: r for r in records if r["client_message_id"]}
    assert by_id["deep-push"]["seen"] == 2 and by_id["deep-push"]["acked"]
    assert "json_max_depth" in by_id["deep-push"]["reason"]
    assert by_id["bad-schema"]["acked"] and "senderPubkey" in by_id["bad-schema"]["reason"]
    reasons = " | ".join(r["reason"] for r in records)
    for expected in ("unparsable", "binary", "link_frame_max_bytes"):
        assert expected in reasons, reasons
    assert meshd("inbox", "quarantine", "--state-dir", str(hostile.state_dir)).returncode == 0


def _invalid_inbound(metrics: str) -> float:
    line = next(line for line in metrics.splitlines() if line.startswith("cm_daemon_invalid_inbound_total "))
    return float(line.split()[1])


@pytest.mark.parametrize(("status", "retry_after_ms"), [(429, 900), (429, None), (408, None), (425, None)])
def test_a_transient_ack_returns_the_row_to_pending(peer, hostile, status, retry_after_ms):
    """OBX-RETRY-LATER (E-42): a 429 rate_limited ack (and 408, 425) is transient: the row goes back to pending, is
    sent again -- no sooner than the ack's retry_after_ms when it names one -- and ends done (before: dead, needing an
    operator requeue)."""
    broker = peer
    cmid = f"limited-{status}-{retry_after_ms}"
    broker.answer(cmid, SILENT)
    with hostile.unix() as client:
        assert client.post("/v1/send", json={"to": "#general", "message": "m"},
                           headers={"Idempotency-Key": cmid}).status_code == 202

    def sends() -> list[dict]:
        return [f for f in broker.received("send") if f["client_message_id"] == cmid]

    broker.wait_for(sends, 10, "the send")
    ack = {"type": "ack", "status": status, "id": cmid, "client_message_id": cmid, "messageId": "", "queued": False,
           "error": "rate_limited" if status == 429 else "try_again", "detail": "slow down"}
    if retry_after_ms is not None:
        ack["retry_after_ms"] = retry_after_ms
    answered_at = time.monotonic()
    broker.send_raw(ack)
    broker.wait_for(lambda: len(sends()) == 2, 10, "the retry")
    waited = time.monotonic() - answered_at
    row = wait_row(hostile, cmid, "done")
    assert row["attempts"] == 2 and row["last_error"].startswith(str(status)), row
    if retry_after_ms is not None:
        assert waited >= retry_after_ms / 1000 - 0.1, waited


def test_a_1009_close_kills_the_largest_frame_in_flight_and_never_loops(peer, hostile):
    """LINK-1009-DEAD (E-40): when the broker closes 1009 (message too big) the largest frame in flight is marked dead
    with its reason and is never sent again; the other rows in flight are resent and delivered."""
    broker = peer
    broker.answer("small-row", SILENT)
    broker.answer("large-row", SILENT)
    with hostile.unix() as client:
        for cmid, size in (("small-row", 10), ("large-row", 60_000)):
            assert client.post("/v1/send", json={"to": "#general", "message": "y" * size},
                               headers={"Idempotency-Key": cmid}).status_code == 202
    broker.wait_for(lambda: {f["client_message_id"] for f in broker.received("send")} >= {"small-row", "large-row"},
                    10, "both sends")
    broker.drop(1009, "message too big")
    dead = wait_row(hostile, "large-row", "dead")
    assert "frame_too_large" in dead["last_error"] and "1009" in dead["last_error"]
    wait_row(hostile, "small-row", "done")
    time.sleep(0.5)
    assert sum(f["client_message_id"] == "large-row" for f in broker.received("send")) == 1


# --- a state directory the daemon cannot use (E-44) ----------------------------------------------------------------

def test_an_outbox_db_that_is_a_directory_exits_5_without_a_traceback(broker, make_daemon):
    """LIFE-STATE-REFUSED (E-44): outbox.db being a directory is a clear refusal with the E-15 code 5."""
    daemon = make_daemon(broker.url, start=False)
    (daemon.state_dir / "outbox.db").mkdir()
    result = meshd("up", "--state-dir", str(daemon.state_dir), "--broker-url", broker.url, "--no-tcp")
    assert result.returncode == exit_code("outbox_integrity_failed"), result.stderr
    assert "outbox.db" in result.stderr and "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize("content", [b"garbage", b'{"ed25519_seed": "zz"}'])
def test_a_garbage_keypair_exits_3_without_a_traceback(broker, make_daemon, content):
    """LIFE-STATE-REFUSED (E-44): a keypair.json meshd cannot read is refused with exit 3 and never replaced."""
    daemon = make_daemon(broker.url, start=False)
    (daemon.state_dir / "keypair.json").write_bytes(content)
    os.chmod(daemon.state_dir / "keypair.json", 0o600)
    result = meshd("up", "--state-dir", str(daemon.state_dir), "--broker-url", broker.url, "--no-tcp")
    assert result.returncode == exit_code("invalid_config"), result.stderr
    assert "keypair.json" in result.stderr and "Traceback" not in result.stderr + result.stdout
    assert (daemon.state_dir / "keypair.json").read_bytes() == content


# --- the soak (make slow; CI runs it bounded) ----------------------------------------------------------------------

SOAK_S = float(os.environ.get("MESHSPEC_SLOW_SOAK_S", "120"))


@pytest.mark.slow
@pytest.mark.timeout(SOAK_S + 180)
def test_hostile_soak(broker, make_daemon):
    """Everything at once for MESHSPEC_SLOW_SOAK_S seconds: 200 hostile TCP connections (silent, dribbling, stalled
    with and without the token, never closing) replaced as the daemon closes them, event streams churned on both
    transports, and poison frames from the broker between valid pushes -- while two honest clients send over the
    unix socket and TCP. Afterwards: not one 5xx, every honest send done, every valid push delivered, the link on
    its first connection and never restarted."""
    daemon = make_daemon(broker.url, config=hostile_config(header_read_s=2.0, body_read_s=3.0))
    daemon.wait_connected()
    connection = broker.wait_connected()
    token = daemon.token_file.read_text().strip()
    stop = threading.Event()
    statuses: list[int] = []
    sent: list[str] = []
    pushed: list[str] = []
    errors: list[BaseException] = []
    openings = [b"G", b"GET /v1/hea", head("POST", "/v1/send", daemon, "tcp", Authorization="",
                                           Content_Type="application/json", Content_Length=10_000) + b"{",
                head("POST", "/v1/send", daemon, "tcp", Content_Type="application/json", Content_Length=10_000)
                + b"{", b"GET /v1/health HTTP/1.0\r\nHost: localhost\r\nAuthorization: Bearer " + token.encode()
                + b"\r\n\r\n"]

    def guarded(work):
        def run() -> None:
            try:
                work()
            except BaseException as exc:  # surfaced by the assertions below
                errors.append(exc)
        return threading.Thread(target=run, daemon=True)

    def attack() -> None:
        socks = []
        for index in range(200):
            socks.append((index, _soak_open(daemon, openings[index % len(openings)])))
        while not stop.wait(0.05):
            for position, (index, sock) in enumerate(socks):
                if sock is None or _soak_gone(sock):
                    socks[position] = (index, _soak_open(daemon, openings[index % len(openings)]))
        for _, sock in socks:
            if sock is not None:
                sock.close()

    def churn() -> None:
        while not stop.is_set():
            for transport in ("unix", "tcp"):
                sock = connect(daemon, transport)
                sock.sendall(head("GET", "/v1/events", daemon, transport))
                status = read_answer_status(sock)
                statuses.append(status)
                sock.close()
            time.sleep(0.05)

    def honest(transport: str) -> None:
        n = 0
        while not stop.is_set():
            cmid = f"soak-{transport}-{n}"
            with (daemon.unix() if transport == "unix" else daemon.tcp()) as client:
                answer = client.post("/v1/send", json={"to": "#general", "message": f"m{n}"},
                                     headers={"Idempotency-Key": cmid})
                statuses.append(answer.status_code)
                if answer.status_code == 202:
                    sent.append(cmid)
                statuses.append(client.get("/v1/health").status_code)
            n += 1
            time.sleep(0.02)

    def poison() -> None:
        n = 0
        while not stop.wait(0.3):
            broker.push(body="poison", client_message_id=f"poison-{n}",
                        meta=json.loads('{"a":' * 100 + "1" + "}" * 100))
            broker.send_raw('{"type": "push", "meta": ' + "[" * 5000 + "]" * 5000 + "}")
            valid = f"valid-{n}"
            broker.push(body="fine", client_message_id=valid)
            pushed.append(valid)
            n += 1

    workers = [guarded(work) for work in (attack, churn, lambda: honest("unix"), lambda: honest("tcp"), poison)]
    for worker in workers:
        worker.start()
    time.sleep(SOAK_S)
    stop.set()
    for worker in workers:
        worker.join(timeout=30)
    assert not errors, errors[:3]
    assert statuses and max(statuses) < 500, sorted(set(statuses))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, inbox = _listed(daemon, "/v1/outbox", status="done"), _listed(daemon, "/v1/inbox")
        if set(sent) <= done and set(pushed) <= inbox:
            break
        time.sleep(0.5)
    assert set(sent) <= done and set(pushed) <= inbox, (len(set(sent) - done), len(set(pushed) - inbox))
    health = _health(daemon)
    assert health["connected"] and health["link_restarts"] == 0, health
    assert broker.wait_connected() == connection
    print(json.dumps({"soak_s": SOAK_S, "honest_sends": len(sent), "answers": len(statuses),
                      "valid_pushes": len(pushed), "quarantined": health["quarantined"]}))


def _listed(daemon, route: str, **params: str) -> set[str]:
    """Every client_message_id a listing holds, page by page."""
    found, cursor = set(), None
    with daemon.unix() as client:
        while True:
            page = client.get(route, params={"limit": 500, **params, **({"cursor": cursor} if cursor else {})}).json()
            found |= {item["client_message_id"] for item in page["items"]}
            if not page["items"] or page["next_cursor"] in (None, cursor):
                return found
            cursor = page["next_cursor"]


def _soak_open(daemon, opening: bytes) -> socket.socket | None:
    try:
        sock = connect(daemon, "tcp", timeout=2)
        sock.sendall(opening)
        sock.setblocking(False)
        return sock
    except OSError:
        return None


def _soak_gone(sock: socket.socket) -> bool:
    try:
        return sock.recv(65_536) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def read_answer_status(sock: socket.socket) -> int:
    return read_answer(sock, 10)[0]
