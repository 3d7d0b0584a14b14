"""The reference daemon as a real gunicorn process on a unix socket and TCP, against a scripted broker peer."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from conformance.launch import REFERENCE_TEMPLATE, Launched
from conformance.peer import ACCEPT_SILENTLY, SILENT, ScriptedBroker, conflict, fail
from reference.core.ipc import table as ipc_table
from spec import validator

HOLD = """
[outbox]
retry_base_ms = 600000
retry_max_ms = 600000
ack_timeout_s = 600.0
[daemon]
drain_timeout_s = 1.0
"""
BODY = {"to": "#general", "message": "hello"}
OTHER = {"to": "#general", "message": "a different body"}


def post(daemon: Launched, body, key: str | None = None, **kwargs) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    with daemon.unix() as client:
        return client.post("/v1/send", json=body, headers=headers, **kwargs)


def outbox_rows(daemon: Launched) -> list[dict]:
    rows, cursor = [], None
    with daemon.unix() as client:
        while True:
            params = {"limit": 500, **({"cursor": cursor} if cursor else {})}
            page = client.get("/v1/outbox", params=params).json()
            rows += page["items"]
            cursor = page["next_cursor"]
            if not cursor:
                return rows


def row_for(daemon: Launched, cmid: str) -> dict | None:
    return next((r for r in outbox_rows(daemon) if r["client_message_id"] == cmid), None)


def wait_status(daemon: Launched, cmid: str, status: str, timeout: float = 10.0, attempted: bool = False) -> dict:
    """Wait for ``cmid`` to be in ``status`` (with ``attempted``: after at least one broker answer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = row_for(daemon, cmid)
        if row and row["status"] == status and (not attempted or row["last_error"] is not None):
            return row
        time.sleep(0.05)
    raise AssertionError(f"{cmid} did not reach {status}: {row_for(daemon, cmid)}")


@pytest.fixture(scope="module")
def held(tmp_path_factory):
    """One broker and one daemon whose retries and ack timeouts are long enough to hold rows in any state."""
    with ScriptedBroker() as broker:
        state_dir = tmp_path_factory.mktemp("held") / "d"
        state_dir.mkdir(mode=0o700)
        (state_dir / "config.toml").write_text(HOLD)
        daemon = Launched(REFERENCE_TEMPLATE, state_dir, broker.url).start()
        daemon.wait_connected()
        try:
            yield broker, daemon
        finally:
            daemon.stop(timeout=10)


def prepare(broker: ScriptedBroker, daemon: Launched, state: str, cmid: str) -> None:
    """Bring ``cmid`` into ``state`` through the real protocol."""
    if state == "none":
        return
    outcome = {"pending": fail(), "inflight": SILENT, "done": None, "dead": conflict(), "aborted": conflict()}[state]
    if outcome is not None:
        broker.answer(cmid, outcome)
    assert post(daemon, BODY, cmid).status_code == 202
    wait_status(daemon, cmid, "dead" if state == "aborted" else state, attempted=state == "pending")
    if state == "aborted":
        row = row_for(daemon, cmid)
        with daemon.unix() as client:
            assert client.post("/v1/outbox/requeue", json={"id": row["id"]}).status_code == 200
        wait_status(daemon, cmid, "aborted")


@pytest.mark.parametrize("row", ipc_table().rows, ids=lambda r: r.id)
def test_every_lookup_row_live(held, row):
    """IPC-NEW-ROW ... IPC-CONFLICT-NO-MUTATION: each §4.5.1 row reached through the real daemon."""
    broker, daemon = held
    state = next(iter(row.when["row_state"]))
    cmid = f"live-{row.id.lower()}"
    prepare(broker, daemon, state, cmid)
    before = row_for(daemon, cmid)
    mismatch = row.when["fingerprint"] == frozenset({"mismatch"})
    response = post(daemon, OTHER if mismatch else BODY, cmid)
    then = row.then
    assert response.status_code == then["http_status"], response.text
    body = response.json()
    if then["http_status"] == 409:
        assert response.headers["content-type"].startswith("application/problem+json")
        assert (body["error"], body["conflict"], body["client_message_id"]) == (
            "idempotency_key_reused", then["conflict"], cmid)
        assert len(body["daemon_fingerprint_prefix"]) == 16
        assert row_for(daemon, cmid) == before, "a 409 must not mutate the row"
    else:
        assert (body["status"], body["duplicate"], body["client_message_id"]) == (
            then["status"], then["duplicate"], cmid)
    for member in then.get("include", ()):
        assert member in body
    if state == "none":
        assert row_for(daemon, cmid)["status"] in ("pending", "inflight", "done")


def test_validation_failure_consumes_nothing(held):
    daemon = held[1]
    bad = post(daemon, {"to": "@group", "message": "x"}, "reusable-id")
    assert bad.status_code == 400 and bad.json()["error"] == "destination_unresolvable"
    assert row_for(daemon, "reusable-id") is None
    assert post(daemon, BODY, "reusable-id").status_code == 202


def test_minted_ids_are_ulids(held):
    daemon = held[1]
    body = post(daemon, BODY).json()
    assert len(body["client_message_id"]) == 26 and body["client_message_id"].isalnum()


def test_header_wins_over_body(held):
    _, daemon = held
    response = post(daemon, {**BODY, "client_message_id": "from-body"}, "from-header")
    assert response.json()["client_message_id"] == "from-header"
    assert row_for(daemon, "from-body") is None


def test_64_concurrent_identical_posts_leave_one_row(held):
    """IPC-SERIALIZED: 64 concurrent identical POSTs, exactly one row, every answer consistent."""
    _, daemon = held
    barrier = threading.Barrier(64)

    def one(_):
        with daemon.unix() as client:
            barrier.wait()
            return client.post("/v1/send", json=BODY, headers={"Idempotency-Key": "race-64"})

    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(one, range(64)))
    assert all(a.status_code in (200, 202) for a in answers), [a.text for a in answers if a.status_code >= 300]
    assert sum(1 for a in answers if a.json()["duplicate"] is False) == 1
    assert len({a.json()["request_fingerprint"] for a in answers}) == 1
    assert sum(1 for r in outbox_rows(daemon) if r["client_message_id"] == "race-64") == 1


def test_kill9_after_202_before_dispatch_loses_nothing(make_daemon, tmp_path):
    """REC-NO-LOSS: the broker is unreachable, the daemon answers 202, dies; the row reaches done exactly once."""
    dead_port_broker = ScriptedBroker()
    dead_port_broker.start()
    url = dead_port_broker.url
    dead_port_broker.stop()  # nothing listens there now
    daemon = make_daemon(url)
    assert post(daemon, BODY, "crash-early").status_code == 202
    daemon.kill9()
    with ScriptedBroker(port=int(url.rsplit(":", 1)[1])) as broker:
        daemon.start()
        broker.wait_frame("send")
        wait_status(daemon, "crash-early", "done")
        assert [f["client_message_id"] for f in broker.received("send")] == ["crash-early"]
        assert len(broker.messages) == 1


def test_kill9_while_inflight_recovers_and_dedupes(broker, make_daemon):
    """REC-INFLIGHT-TO-PENDING + broker dedupe: the broker committed but never acked; the daemon dies inflight.

    After restart the row is recovered, retried (a 5xx first, then the broker's own decision) and collapsed by the
    broker's dedupe into a 200 duplicate: one message in all, the same fingerprint on every attempt.
    """
    daemon = make_daemon(broker.url)
    broker.answer("crash-inflight", ACCEPT_SILENTLY, fail())
    assert post(daemon, BODY, "crash-inflight").status_code == 202
    broker.wait_frame("send")
    wait_status(daemon, "crash-inflight", "inflight")
    first = broker.received("send")[0]
    daemon.kill9()
    daemon.start()
    row = wait_status(daemon, "crash-inflight", "done", timeout=15)
    sends = [f for f in broker.received("send") if f["client_message_id"] == "crash-inflight"]
    assert len(sends) >= 3
    assert {f["request_fingerprint"] for f in sends} == {first["request_fingerprint"]}
    assert [a["status"] for a in broker.sent("ack") if a["client_message_id"] == "crash-inflight"] == [503, 200]
    assert sum(1 for frame in broker.messages.values() if frame["client_message_id"] == "crash-inflight") == 1
    assert row["broker_message_id"] == next(iter(broker.messages))


def test_auth_matrix(held):
    _, daemon = held
    token = daemon.token_file.read_text().strip()
    with daemon.tcp(token="") as anonymous:
        assert anonymous.get("/v1/health").json()["error"] == "missing_bearer_token"
        assert anonymous.get("/v1/health", headers={"Authorization": "Basic abc"}).status_code == 401
    with daemon.tcp(token="wrong") as wrong:
        response = wrong.get("/v1/health")
        assert (response.status_code, response.json()["error"]) == (401, "invalid_bearer_token")
    with daemon.tcp() as ok:
        assert ok.get("/v1/health").status_code == 200
        assert ok.get("/v1/health", params={"token": token}).json()["error"] == "token_in_query"
        assert ok.get("/v1/health", headers={"Host": "evil.example"}).json()["error"] == "forbidden_host"
        for host in (f"localhost:{daemon.port}", f"127.0.0.1:{daemon.port}", f"[::1]:{daemon.port}"):
            assert ok.get("/v1/health", headers={"Host": host}).status_code == 200, host
        assert ok.get("/v1/health", headers={"Origin": "http://evil.example"}).json()["error"] == "forbidden_origin"
        assert "access-control-allow-origin" not in {k.lower() for k in ok.options("/v1/health").headers}
    with daemon.unix() as unix:
        assert unix.get("/v1/health").status_code == 200
        assert unix.get("/v1/health", headers={"Origin": "null"}).status_code == 403
        assert unix.get("/v1/health", params={"access_token": "x"}).status_code == 400
    assert stat.S_IMODE(os.stat(daemon.socket_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(daemon.state_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(daemon.token_file).st_mode) == 0o600
    assert len(token) == 43


HOSTILE = [
    (b"", "application/json"),
    (b"not json", "application/json"),
    (b"\xff\xfe\xfd", "application/json"),
    (b"[" * 200_000, "application/json"),
    (b'{"to":"#t","message":"m"}', "text/plain"),
    (b'{"to":"#t","message":"m","meta":{"n":1e999999}}', "application/json"),
    (b'{"to":' + b'"' + b"x" * (2 * 1024 * 1024) + b'"}', "application/json"),
    (json.dumps({"to": "#t", "message": "m", "priority": ["now"]}).encode(), "application/json"),
    (json.dumps({"to": 5, "message": None}).encode(), "application/json"),
]


@pytest.mark.parametrize(("body", "content_type"), HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_bodies_get_a_4xx_problem(held, body, content_type):
    _, daemon = held
    with daemon.unix() as client:
        response = client.post("/v1/send", content=body, headers={"Content-Type": content_type})
    assert 400 <= response.status_code < 500, response.text[:300]
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert {"type", "title", "status", "detail", "error"} <= set(problem)


def test_hostile_query_parameters(held):
    _, daemon = held
    with daemon.unix() as client:
        for path, params in (("/v1/inbox", {"limit": "0"}), ("/v1/inbox", {"limit": "x"}),
                             ("/v1/inbox", {"cursor": "!!"}), ("/v1/inbox", {"since": "yesterday"}),
                             ("/v1/outbox", {"status": "zombie"}), ("/v1/outbox", {"cursor": "bm9wZQ"})):
            response = client.get(path, params=params)
            assert response.status_code == 400, (path, params, response.text)


def test_inbound_push_dedupe_ack_and_sse_replay(held):
    """INB-DEDUPE, INB-DURABLE-BEFORE-ACK, SSE-REPLAY: one row per client_message_id, every push acknowledged."""
    broker, daemon = held
    first = broker.push(body="one", client_message_id="in-1")
    broker.push(body="one again", client_message_id="in-1", attempt=2)
    broker.push(body="two", client_message_id="in-2")
    broker.wait_frame("client_ack", 3)
    with daemon.unix() as client:
        items = client.get("/v1/inbox").json()["items"]
        assert [i["client_message_id"] for i in items] == ["in-1", "in-2"]
        assert items[0]["body"] == "one" and items[0]["broker_message_id"] == first["messageId"]
        events = read_events(client, {"Last-Event-ID": "0"}, 2)
        assert [e["event"] for e in events] == ["message", "message"]
        assert [json.loads(e["data"])["client_message_id"] for e in events] == ["in-1", "in-2"]
        later = read_events(client, {"Last-Event-ID": events[0]["id"]}, 1)
        assert json.loads(later[0]["data"])["client_message_id"] == "in-2"
        everything = read_events(client, {"Last-Event-ID": "0"}, 2, keep_all=True)
    ids = [int(e["id"]) for e in everything]
    assert ids == sorted(set(ids))
    for event in everything:
        errors = list(validator(f"sse/{event['event']}").iter_errors(json.loads(event["data"])))
        assert errors == [], (event, errors[0].message)


def read_events(client: httpx.Client, headers: dict, count: int, timeout: float = 10.0,
                names: tuple[str, ...] = ("message",), keep_all: bool = False) -> list[dict]:
    """Read SSE events until ``count`` events named in ``names`` arrived; the others (e.g. outbox_dead) are
    skipped, or with ``keep_all`` returned too."""
    seen = 0
    events, current = [], {}
    with client.stream("GET", "/v1/events", headers=headers, timeout=timeout) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line:
                if current.get("event") in names or (keep_all and "event" in current):
                    events.append(current)
                    seen += current.get("event") in names
                    if seen == count:
                        return events
                current = {}
                continue
            if line.startswith(":"):
                continue
            key, _, value = line.partition(": ")
            current[key] = value
    return events


def test_a_1013_slow_consumer_close_is_a_link_loss(broker, daemon):
    """E-33: a broker's 1013 slow_consumer close is a link loss like any other: the daemon reconnects and sends its
    unacknowledged row again, which then completes."""
    first = broker.wait_connected()
    broker.answer("slow-close", SILENT)
    assert post(daemon, BODY, "slow-close").status_code == 202
    broker.wait_frame("send")
    broker.drop(1013, "slow_consumer")
    broker.wait_for(lambda: broker.wait_connected() > first, timeout=15, what="a reconnect after 1013")
    wait_status(daemon, "slow-close", "done", timeout=15)
    sends = [f for f in broker.received("send") if f["client_message_id"] == "slow-close"]
    assert len(sends) >= 2 and len({f["request_fingerprint"] for f in sends}) == 1
