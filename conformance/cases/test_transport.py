"""Transports and auth (§3.2, E-27), limits (§3.4, E-34), the error envelope (E-11), the routes' own contracts
(§3.1, §15.3), the loopback bind, and the broker link's reconnect schedule (§14, E-35).

Status codes are the behaviour; error codes and media types are the envelope (ERR-PROBLEM-JSON), recorded apart so a
differently worded refusal is never counted as a missing one.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import socket
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from conformance.cases._support import BODY, http_request, pipelined, post_send, unique, wait_row
from conformance.registry import case
from conformance.timing import Timing
from conformance.wire import json_object
from spec import load_table, validator

#: the body limits of the IPC routes (spec/tables/limits.yaml, E-29)
BODY_LIMITS = {route: int(load_table("limits")["limits"][name]["value"]) for route, name in (
    ("/v1/send", "ipc_send_body_bytes"), ("/v1/profile", "ipc_profile_body_bytes"),
    ("/v1/outbox/requeue", "ipc_requeue_body_bytes"))}

PROBLEM = validator("ipc/problem")


def _problem_ok(response_headers: dict, body: bytes | str) -> bool:
    if not str(response_headers.get("content-type", "")).startswith("application/problem+json"):
        return False
    try:
        document = json.loads(body)
    except ValueError:
        return False
    return not list(PROBLEM.iter_errors(document))


# --- auth --------------------------------------------------------------------------------------------------------


BAD_HOSTS = ["attacker.example", "localhost.attacker.example", "127.0.0.1.attacker.example", "attacker-localhost",
             "127.0.0.2", "0.0.0.0", "[::2]", "[::ffff:127.0.0.1]", "localhost@attacker.example"]


@case("transport.auth", "AUTH-BEARER", "AUTH-BEARER-401", "AUTH-TOKEN-QUERY", "AUTH-TOKEN-QUERY-BOTH", "AUTH-HOST",
      "AUTH-HOST-TCP-ONLY", "AUTH-ORIGIN", "AUTH-ORIGIN-BOTH")
def test_tcp_auth_matrix(tcp_api, verdict):
    """Bearer: missing, near-miss and wrong tokens are 401; every query-token name the OpenAPI lists is a 400; a
    Host outside localhost / 127.0.0.1 / [::1] (any port) is 403 and those three pass; any Origin is 403."""
    base = str(tcp_api.client.base_url)
    token = tcp_api.client.headers["Authorization"].split(" ", 1)[1]
    port = base.rsplit(":", 1)[1]
    with httpx.Client(base_url=base, verify=False, timeout=10) as anonymous:
        for label, header, code in (("missing", None, "missing_bearer_token"),
                                    ("shorter", f"Bearer {token[:-1]}", "invalid_bearer_token"),
                                    ("longer", f"Bearer {token}x", "invalid_bearer_token"),
                                    ("case-flipped", f"Bearer {token.swapcase()}", "invalid_bearer_token"),
                                    ("wrong", "Bearer not-the-token", "invalid_bearer_token"),
                                    ("another scheme", f"Basic {token}", None), ("no token", "Bearer", None)):
            response = anonymous.get("/v1/health", headers={"Authorization": header} if header else {})
            tcp_api.check(response)
            verdict.expect("AUTH-BEARER", 400 <= response.status_code < 500,
                           f"{label} token was served: {response.status_code}")
            with verdict.check("AUTH-BEARER-401"):
                assert response.status_code == 401, f"{label} token answered {response.status_code}"
                if code:
                    assert json_object(response).get("error") == code, \
                        f"{label} token: error {json_object(response).get('error')!r}, expected {code}"
                assert response.headers.get("www-authenticate", "").lower().startswith("bearer"), \
                    f"{label} token: WWW-Authenticate {response.headers.get('www-authenticate')!r}"
        for path in ("/v1/version", "/v1/outbox", "/v1/inbox", "/v1/peers", "/v1/metrics"):
            response = anonymous.get(path)
            verdict.expect("AUTH-BEARER", 400 <= response.status_code < 500,
                           f"GET {path} without a token answered {response.status_code}")
    for name in _query_token_names():
        response = tcp_api.get("/v1/health", params={name: token})
        requirement = "AUTH-TOKEN-QUERY" if name == "token" else "AUTH-TOKEN-QUERY-BOTH"  # ?token= is the spec's
        verdict.expect(requirement, response.status_code == 400, f"?{name}=<token> answered {response.status_code}")
        if response.status_code == 400:
            verdict.expect("AUTH-TOKEN-QUERY-BOTH", json_object(response).get("error") == "token_in_query",
                           f"?{name}=: error {json_object(response).get('error')!r}")
    for host in BAD_HOSTS:
        response = tcp_api.get("/v1/health", headers={"Host": host})
        verdict.expect("AUTH-HOST", response.status_code == 403, f"Host {host!r} answered {response.status_code}")
    for host in ("localhost", "127.0.0.1", "[::1]"):
        response = tcp_api.get("/v1/health", headers={"Host": host})
        verdict.expect("AUTH-HOST", response.status_code == 200, f"Host {host!r} answered {response.status_code}")
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", f"[::1]:{int(port) + 1}"):
        response = tcp_api.get("/v1/health", headers={"Host": host})
        verdict.expect("AUTH-HOST-TCP-ONLY", response.status_code == 200,
                       f"Host {host!r} answered {response.status_code}")
    for origin in ("https://attacker.example", "null", "http://localhost", f"http://127.0.0.1:{port}"):
        response = tcp_api.get("/v1/health", headers={"Origin": origin})
        verdict.expect("AUTH-ORIGIN", 400 <= response.status_code < 500 and not any(
            k.lower().startswith("access-control-") for k in response.headers),
            f"Origin {origin!r} answered {response.status_code} {sorted(response.headers)}")
        verdict.expect("AUTH-ORIGIN-BOTH", response.status_code == 403 and
                       json_object(response).get("error") == "forbidden_origin",
                       f"Origin {origin!r}: {response.status_code} {json_object(response).get('error')!r}")
    preflight = tcp_api.client.request("OPTIONS", "/v1/send", headers={
        "Origin": "https://attacker.example", "Access-Control-Request-Method": "POST"})
    verdict.expect("AUTH-ORIGIN", preflight.status_code in (403, 405) and not any(
        k.lower().startswith("access-control-") for k in preflight.headers),
        f"a CORS preflight answered {preflight.status_code} with {dict(preflight.headers)}")


def _query_token_names() -> list[str]:
    """Every parameter name spec/openapi.yaml names as a token travelling in the query (refused with 400)."""
    from spec import SPEC_DIR, load_yaml

    names = {"token"}

    def walk(node):
        if isinstance(node, dict):
            name = node.get("name")
            if isinstance(name, str) and "token" in name and name.isidentifier():
                names.add(name)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(load_yaml(SPEC_DIR / "openapi.yaml"))
    return sorted(names)


@case("transport.unix_refusals", "AUTH-ORIGIN-BOTH", "AUTH-TOKEN-QUERY-BOTH", "AUTH-HOST-TCP-ONLY")
def test_unix_socket_refusals(mesh_target, verdict):
    """On the unix socket (E-27): any Origin is 403 and a query token 400, as over TCP; Host is not checked."""
    if "unix" not in mesh_target.transports:
        pytest.skip("no unix socket the harness can reach")
    with mesh_target.client("unix") as client:
        verdict.expect("AUTH-ORIGIN-BOTH", client.get("/v1/health", headers={"Origin": "null"}).status_code == 403,
                       "Origin: null on the unix socket was not refused")
        verdict.expect("AUTH-TOKEN-QUERY-BOTH", client.get("/v1/health", params={"token": "x"}).status_code == 400,
                       "?token= on the unix socket was not refused")
        verdict.expect("AUTH-HOST-TCP-ONLY", client.get("/v1/health", headers={"Host": "anything.example"}
                                                        ).status_code == 200,
                       "the unix socket refused a request for its Host")


@case("transport.socket_mode", "AUTH-UDS-MODE", "AUTH-STATE-DIR-MODE", "AUTH-TOKEN-FILE")
def test_socket_and_token_modes(mesh_target, verdict):
    instance = mesh_target.launched
    if instance is None:
        pytest.skip("the harness does not know where the target keeps its socket and token")
    with verdict.check("AUTH-UDS-MODE"):
        assert stat.S_IMODE(os.stat(instance.socket_path).st_mode) == 0o600, \
            f"socket mode {oct(stat.S_IMODE(os.stat(instance.socket_path).st_mode))}"
    with verdict.check("AUTH-STATE-DIR-MODE"):
        directory = instance.socket_path.parent
        assert stat.S_IMODE(os.stat(directory).st_mode) & 0o077 == 0, \
            f"{directory} is {oct(stat.S_IMODE(os.stat(directory).st_mode))}"
    with verdict.check("AUTH-TOKEN-FILE"):
        assert stat.S_IMODE(os.stat(instance.token_file).st_mode) == 0o600, \
            f"token file mode {oct(stat.S_IMODE(os.stat(instance.token_file).st_mode))}"
        token = instance.token_file.read_text().strip()
        assert len(token) == 43 and all(c.isalnum() or c in "-_" for c in token), \
            f"the token is not 32 bytes of base64url: {len(token)} characters"


@case("transport.loopback", "AUTH-LOOPBACK")
def test_tcp_listens_on_loopback_only(mesh_target, verdict):
    """The TCP port is reachable on 127.0.0.1 and on no other address of this machine."""
    address = mesh_target.tcp_address()
    if address is None:
        pytest.skip("the target has no TCP listener")
    others = _non_loopback_addresses()
    if not others:
        pytest.skip("this machine has no non-loopback address to try")
    for host in others:
        with contextlib.suppress(OSError), socket.create_connection((host, address[1]), timeout=2):
            verdict.expect("AUTH-LOOPBACK", False, f"the TCP port {address[1]} accepts connections on {host}")
            return
    verdict.passed("AUTH-LOOPBACK")


def _non_loopback_addresses() -> list[str]:
    found = set()
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent for a UDP connect
        found.add(probe.getsockname()[0])
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            found.add(info[4][0])
    return sorted(a for a in found if not a.startswith("127.") and a != "0.0.0.0")


# --- bad input -------------------------------------------------------------------------------------------------------

MALFORMED = [b"{", b"\xff\xfe", b"[1]", b'{"to":"#a","message":NaN}', b"[" * 50_000, b"null",
             b'"just a string"', b'{"to":"#a","message":"m"} trailing', b"1" * 5000,
             b"{" + b'"a":{' * 3000 + b"}" * 3001]


@case("transport.malformed_json", "ERR-NO-5XX-ON-BAD-INPUT", "ERR-PROBLEM-JSON")
@pytest.mark.parametrize("route", ["/v1/send", "/v1/profile", "/v1/outbox/requeue"])
def test_malformed_json_is_a_4xx(api, verdict, route):
    for body in MALFORMED:
        response = api.post(route, content=body, headers={"Content-Type": "application/json"})
        label = body[:24]
        ok = verdict.expect("ERR-NO-5XX-ON-BAD-INPUT", 400 <= response.status_code < 500,
                            f"{route} with {label!r} answered {response.status_code}")
        if ok:
            verdict.expect("ERR-PROBLEM-JSON", _problem_ok(response.headers, response.content),
                           f"{route} refused {label!r} without a problem+json body: "
                           f"{response.headers.get('content-type')} {response.text[:100]}")


def _send_of_size(size: int) -> bytes:
    head = f'{{"to":"{BODY["to"]}","message":"'.encode()
    tail = b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


@case("transport.limits", "LIMIT-BODY", "LIMIT-BODY-ROUTES")
def test_size_limit_boundaries(api, verdict):
    """§3.4: a send above 1 MB is refused (whatever the status: a 5xx is ERR-NO-5XX's finding); E-29: exactly
    1 MiB (1048576 bytes) is accepted, one byte more is 413 payload_too_large, and so for the other routes' limits."""
    limit = BODY_LIMITS["/v1/send"]

    def send(size: int):
        return api.post("/v1/send", content=_send_of_size(size),
                        headers={"Content-Type": "application/json", "Idempotency-Key": unique(f"size-{size}")})

    over = send(limit + 1)
    verdict.expect("LIMIT-BODY", over.status_code >= 400, f"a body of {limit + 1} bytes answered "
                                                          f"{over.status_code}")
    at = send(limit)
    with verdict.check("LIMIT-BODY-ROUTES"):
        assert at.status_code == 202, f"a body of exactly {limit} bytes answered {at.status_code}: {at.text[:120]}"
        assert over.status_code == 413 and json_object(over).get("error") == "payload_too_large", \
            f"{limit + 1} bytes: {over.status_code} {over.text[:120]}"
    for route in ("/v1/profile", "/v1/outbox/requeue"):
        limit_bytes = BODY_LIMITS[route]
        big = b'{"summary":"' + b"x" * limit_bytes + b'"}'
        response = api.post(route, content=big, headers={"Content-Type": "application/json"})
        verdict.expect("LIMIT-BODY-ROUTES", response.status_code == 413,
                       f"{route} with {len(big)} bytes answered {response.status_code}")


@case("transport.media_type", "IPC-MEDIA-TYPE")
def test_media_type(api, verdict):
    """POST bodies need application/json (E-29): another type, or none, is 415."""
    for headers in ({"Content-Type": "application/x-www-form-urlencoded"}, {"Content-Type": "text/plain"}, {}):
        response = api.post("/v1/send", content=json.dumps(BODY).encode(), headers=headers)
        verdict.expect("IPC-MEDIA-TYPE", response.status_code == 415,
                       f"a send with Content-Type {headers.get('Content-Type', '(none)')!r} answered "
                       f"{response.status_code}")


def _chunks(data: bytes, size: int = 4096):
    for start in range(0, len(data), size):
        yield data[start:start + size]


@case("transport.early_answer", "IPC-HTTP-BODY")
@pytest.mark.parametrize(("content_type", "status"), [("application/json", 413), ("text/plain", 415)])
def test_an_early_answer_reaches_the_client(mesh_target, verdict, content_type, status):
    """A 3 MiB send refused on its headers, then a health check pipelined behind it: both answers come back, in
    order (E-34)."""
    big = b'{"to":"' + BODY["to"].encode() + b'","message":"' + b"x" * (3 * 1024 * 1024) + b'"}'
    for transport in mesh_target.transports:
        sock, headers = mesh_target.raw_connection(transport)
        answers = pipelined(sock, [http_request("POST", "/v1/send", {**headers, "Content-Type": content_type}, big),
                                   http_request("GET", "/v1/health", {**headers, "Connection": "close"})])
        verdict.expect("IPC-HTTP-BODY", [a[0] for a in answers] == [status, 200],
                       f"{transport}: answers {[a[0] for a in answers]}, expected [{status}, 200]")


@case("transport.chunked_body", "IPC-HTTP-BODY")
def test_chunked_bodies(api, verdict):
    small = json.dumps({**BODY, "client_message_id": unique("chunked")}).encode()
    good = api.client.post("/v1/send", content=_chunks(small), headers={"Content-Type": "application/json"})
    verdict.expect("IPC-HTTP-BODY", good.status_code == 202, f"a small chunked send answered {good.status_code}")
    big = _send_of_size(3 * 1024 * 1024)
    too_big = api.client.post("/v1/send", content=_chunks(big), headers={"Content-Type": "application/json"})
    verdict.expect("IPC-HTTP-BODY", too_big.status_code == 413, f"a 3 MiB chunked send answered "
                                                                f"{too_big.status_code}")


# --- the cap on requests in flight ---------------------------------------------------------------------------------


@case("limits.inflight", "LIMIT-INFLIGHT")
def test_requests_in_flight_are_capped(mesh_target, broker, verdict):
    """80 GET /v1/peers at once while the broker does not answer peers_list (each waits for it): at most 64 are in
    flight, the others are refused 429 at once; afterwards the daemon answers normally."""
    broker.config.answer_peers = False
    try:
        barrier = threading.Barrier(80)

        def one(_):
            with mesh_target.client(mesh_target.transports[0], timeout=30) as client:
                with contextlib.suppress(threading.BrokenBarrierError):
                    barrier.wait(timeout=10)
                started = time.monotonic()
                try:
                    response = client.get("/v1/peers")
                except httpx.HTTPError as exc:
                    return None, type(exc).__name__, time.monotonic() - started
                return response.status_code, json_object(response).get("error"), time.monotonic() - started

        with ThreadPoolExecutor(80) as pool:
            answers = list(pool.map(one, range(80)))
    finally:
        broker.config.answer_peers = True
    busy = [a for a in answers if a[0] == 429]
    with verdict.check("LIMIT-INFLIGHT"):
        assert len(busy) >= 16, f"{len(busy)} of 80 concurrent requests were refused 429 (statuses: " \
                                f"{sorted({str(a[0]) for a in answers})})"
        assert all(a[2] < 2.0 for a in busy), "a 429 came only after waiting"
        with mesh_target.client(mesh_target.transports[0]) as client:
            assert client.get("/v1/health").status_code == 200, "the daemon did not recover from the burst"


# --- the routes' contracts -----------------------------------------------------------------------------------------


@case("api.version", "API-VERSION")
def test_version(api, broker, verdict):
    body = json_object(api.get("/v1/version"))
    with verdict.check("API-VERSION"):
        assert isinstance(body.get("daemon_version"), str) and body["daemon_version"], body
        assert body.get("ipc_api") == "v1", f"ipc_api {body.get('ipc_api')!r}"
        features = body.get("ipc_features")
        assert isinstance(features, list) and {"send", "inbox", "events"} <= set(features), f"ipc_features {features}"
        negotiated = body.get("broker_features_negotiated")
        assert isinstance(negotiated, list) and "client_message_id_dedupe" in negotiated, \
            f"broker_features_negotiated {negotiated!r} (linked to a broker that offers client_message_id_dedupe)"


@case("api.health", "API-HEALTH")
def test_health(api, broker, verdict, timing):
    """Health reports the link, the queue and the identity, and follows the link down and up."""
    body = json_object(api.get("/v1/health"))
    with verdict.check("API-HEALTH"):
        missing = [k for k in ("connected", "lag_ms", "queue_depth", "inflight", "mesh", "member_pubkey", "uptime_s",
                               "schema_version", "daemon_version", "broker_version") if k not in body]
        assert not missing, f"/v1/health lacks {missing}: {body}"
        assert body.get("connected") is True, f"connected is {body.get('connected')!r} while linked"
    broker.hold()
    try:
        cmids = [unique("health") for _ in range(3)]
        for cmid in cmids:
            post_send(api, BODY, cmid)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            body = json_object(api.get("/v1/health"))
            if body.get("connected") is False:
                break
            time.sleep(0.1)
        with verdict.check("API-HEALTH"):
            assert body.get("connected") is False, f"connected is {body.get('connected')!r} with the broker away"
            assert isinstance(body.get("queue_depth"), int) and body["queue_depth"] >= 3, \
                f"queue_depth {body.get('queue_depth')!r} with 3 rows waiting"
    finally:
        broker.release(timeout=timing.reconnect_wait_s)
    for cmid in cmids:
        wait_row(api, cmid, "done", timeout=timing.settle_s())


@case("api.peers", "API-PEERS", "API-PEERS-PASSTHROUGH")
def test_peers_pass_through(api, broker, verdict, timing):
    peers = [{"pubkey": "cd" * 32, "displayName": "peer-one", "status": "idle"},
             {"pubkey": "ce" * 32, "displayName": "peer-two", "status": "working"}]
    broker.config.peers = peers
    try:
        response = api.get("/v1/peers")
    finally:
        broker.config.peers = []
    body = json_object(response)
    listed = body.get("peers")
    with verdict.check("API-PEERS"):
        assert response.status_code == 200, f"{response.status_code} {response.text[:160]}"
        assert isinstance(listed, list) and {p.get("pubkey") for p in listed if isinstance(p, dict)} == \
            {p["pubkey"] for p in peers}, f"peers {listed!r}"
    with verdict.check("API-PEERS-PASSTHROUGH"):
        shown = {p.get("pubkey"): p for p in listed or [] if isinstance(p, dict)}
        for peer in peers:
            assert {k: shown.get(peer["pubkey"], {}).get(k) for k in peer} == peer, f"{shown.get(peer['pubkey'])}"
    broker.hold()
    try:
        deadline = time.monotonic() + 5
        status = None
        while time.monotonic() < deadline:
            status = api.get("/v1/peers").status_code
            if status == 503:
                break
            time.sleep(0.2)
        verdict.expect("API-PEERS-PASSTHROUGH", status == 503, f"GET /v1/peers with the link down answered {status}")
    finally:
        broker.release(timeout=timing.reconnect_wait_s)


PROFILE = {"summary": "testing", "status": "working", "visible": False, "title": "tester", "capabilities": ["a", "b"]}
FORWARDED = ("summary", "status", "visible")  # API-PROFILE's three; the others are E-29's (API-PROFILE-FIELDS)


@case("api.profile", "API-PROFILE", "API-PROFILE-FIELDS")
def test_profile_is_forwarded(api, broker, verdict, timing):
    """Summary, status and visible reach the broker -- in one frame or several (upstream sends one `set_*` frame
    each), waited for until all three came -- over a link the peer saw open from before the request to the end of
    the wait. A link that dropped meanwhile proves nothing either way: the case tries once more, then skips."""

    def profile_frames(since: int) -> list[dict]:
        return [f for f in broker.received()[since:] if f.get("type", "").startswith("set_")]

    def forwarded(frames: list[dict]) -> dict:
        return {k: v for f in frames for k, v in f.items() if k in FORWARDED}

    for attempt in (1, 2):
        ready = unique("profile-ready")  # a send that settles proves the daemon's link is open, not only the peer's
        post_send(api, BODY, ready)
        wait_row(api, ready, "done", timeout=timing.settle_s())
        link = broker.wait_linked(timing.reconnect_wait_s)
        before = len(broker.received())
        response = api.post("/v1/profile", json=PROFILE)
        if "API-PROFILE-FIELDS" not in verdict.recorded():
            with verdict.check("API-PROFILE-FIELDS"):
                applied = json_object(response).get("applied")
                assert applied == list(PROFILE), f"applied {applied!r}"
        with contextlib.suppress(TimeoutError):
            broker.wait_for(lambda since=before: len(forwarded(profile_frames(since))) == len(FORWARDED), 5,
                            "the profile frames")
        frames = profile_frames(before)
        still = broker.linked()
        if len(forwarded(frames)) == len(FORWARDED) or (still is not None and still.connection == link.connection):
            break
        if attempt == 2:
            verdict.skip("API-PROFILE", f"the link to the scripted broker dropped during the case twice "
                                        f"(connection {link.connection}, then {still.connection if still else 'none'})")
            return
    with verdict.check("API-PROFILE"):
        assert response.status_code == 200, f"{response.status_code} {response.text[:160]}"
        assert forwarded(frames) == {"summary": "testing", "status": "working", "visible": False}, \
            f"within 5 s, on connection {link.connection} (open throughout), the broker received {frames}"


@case("api.metrics", "API-METRICS")
def test_metrics(api, verdict):
    response = api.get("/v1/metrics")
    with verdict.check("API-METRICS"):
        assert response.status_code == 200, f"GET /v1/metrics answered {response.status_code}"
        assert response.headers.get("content-type", "").startswith("text/plain"), response.headers.get("content-type")
        assert "cm_daemon_" in response.text, "no cm_daemon_* family"


@case("api.compat", "API-COMPAT")
def test_compat(api, verdict):
    response = api.get("/v1/compat")
    with verdict.check("API-COMPAT"):
        assert response.status_code == 200, f"GET /v1/compat answered {response.status_code}"
        body = json_object(response)
        assert {"daemon", "compatible_brokers", "required_broker_features"} <= set(body), body


# --- the broker link -------------------------------------------------------------------------------------------------


@case("link.reconnect_backoff", "WS-RECONNECT-SCHEDULE", "WS-RECONNECT-BACKOFF")
def test_reconnect_backoff(api, broker, mesh_target, verdict, timing):
    """The broker refuses every connection for a while: the daemon's attempts follow the [reconnect] schedule — the
    spec's defaults (500 ms, x2, 30 s, 25 % jitter) unless the harness configured others — and sends accepted
    meanwhile bring no attempt forward (E-35: measured against the schedule the target declares)."""
    attempts_wanted = 4
    budget = sum(timing.reconnect_delay_ms(n) for n in range(1, attempts_wanted + 1)) / 1000
    if budget > 40:
        attempts_wanted = 3
    start = len(broker.links)
    broker.hold()
    try:
        deadline = time.monotonic() + min(60.0, budget * (1 + timing.reconnect_jitter) + 10)
        sent = 0
        while time.monotonic() < deadline:
            opened = broker.connection_times(after=start)
            if len(opened) >= attempts_wanted + 1:
                break
            if sent < 10:
                post_send(api, BODY, unique("during-outage"))
                sent += 1
            time.sleep(0.1)
    finally:
        broker.release(timeout=timing.reconnect_wait_s)
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(opened)]
    if len(gaps) < 2:
        for requirement in ("WS-RECONNECT-SCHEDULE", "WS-RECONNECT-BACKOFF"):
            verdict.expect(requirement, False, f"only {len(opened)} reconnect attempt(s) in the outage")
        return
    spec_schedule = Timing() if not _reconnect_configured(mesh_target) else timing
    schedules = (("WS-RECONNECT-SCHEDULE", spec_schedule, "the spec's [reconnect] defaults"),
                 ("WS-RECONNECT-BACKOFF", timing, timing.source))
    for requirement, schedule, source in schedules:
        for n, gap in enumerate(gaps, start=1):
            low, high = schedule.reconnect_gap_bounds(n + 1)  # the gap after the (n+1)-th failed attempt
            verdict.expect(requirement, low <= gap <= high,
                           f"reconnect gap {n} was {gap:.0f} ms, outside [{low:.0f}, {high:.0f}] ms ({source}); "
                           f"gaps {[round(g) for g in gaps]}")


def _reconnect_configured(target) -> bool:
    """True when the harness gave the target [reconnect] settings it reads (so they, not the defaults, apply)."""
    from conformance.target import HARNESS_CONFIG

    return "[reconnect]" in HARNESS_CONFIG and target.reads_config
