"""The broker link against a hostile broker peer: it survives any inbound frame, and any failure of its own (E-41).

The daemon runtime runs in-process (its Falcon app through falcon.testing, as over the unix socket) with its real
SQLite stores, connected over a real socket to the harness's scripted broker, which sends whatever a case wants. A
failure of the link's own code cannot be produced on demand for real, so two cases inject one (a method that raises
once; a thread that ends); everything else is real.

The hypothesis fuzz sends arbitrary JSON, garbage text, invalid UTF-8, binary messages and near-valid pushes
(a valid push with one thing broken), interleaved with valid pushes and with sends, and checks after each example:
the link is still the same connection, health says connected, nothing accepted is lost (every valid push is in the
inbox and acknowledged, every send ends done), and every bad frame is in the quarantine. Which frames are bad is
decided here, independently of the daemon: by the spec's own validator and the limits table's numbers.
"""

from __future__ import annotations

import copy
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import falcon.testing
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ulid import ULID

from conformance.peer import ScriptedBroker
from reference.daemon.config import load
from reference.daemon.runtime import Runtime, preflight
from spec import load_table, validator

UNIX = {"meshd.transport": "unix"}
LIMITS = {name: entry["value"] for name, entry in load_table("limits")["limits"].items()}
BROKER_TO_DAEMON = validator("broker/frame#/$defs/broker_to_daemon")
FUZZ_EXAMPLES = int(os.environ.get("MESHSPEC_FUZZ_EXAMPLES", "150"))
SLOW_FUZZ_EXAMPLES = int(os.environ.get("MESHSPEC_SLOW_FUZZ_EXAMPLES", "3000"))
FUZZ_FRAMES: list[int] = []  # frames sent by the fuzz, for the report


def wait_until(predicate, what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def start_runtime(state: Path, broker: ScriptedBroker, **ipc: Any) -> Runtime:
    config = load(None, {"broker": {"url": broker.url}, "outbox": {"retry_base_ms": 50, "retry_max_ms": 200},
                         "reconnect": {"initial_ms": 50, "max_ms": 200}, "ipc": {"tcp_enabled": False, **ipc}})
    preflight(state, config)
    return Runtime(state, config)


def health(client: falcon.testing.TestClient) -> dict[str, Any]:
    return client.simulate_get("/v1/health", extras=UNIX).json


# --- the link's own failures ---------------------------------------------------------------------------------------

def test_an_unexpected_failure_restarts_the_link_and_health_says_so(tmp_path):
    """LINK-RESTART (E-41): an exception the link does not handle (here: its timeout check raising once) no longer
    ends the link thread for good: the link runs again, /v1/health counts the restart and names the failure, and
    sends accepted meanwhile are delivered."""
    with ScriptedBroker() as broker:
        runtime = start_runtime(tmp_path / "d", broker)
        original, failures = runtime.link._check_timeouts, []

        def failing_once() -> None:
            if not failures and runtime.link.state.status == "open":
                failures.append(1)
                raise RuntimeError("injected: a bug in the link")
            original()

        runtime.link._check_timeouts = failing_once
        runtime.start()
        try:
            client = falcon.testing.TestClient(runtime.app)
            wait_until(lambda: failures and health(client)["connected"], "the restarted link")
            assert client.simulate_post("/v1/send", json={"to": "#general", "message": "after"},
                                        headers={"Idempotency-Key": "after-restart"}, extras=UNIX).status_code == 202
            state = health(client)
            assert state["link_restarts"] == 1 and "injected" in state["link_last_failure"], state
            wait_until(lambda: client.simulate_get("/v1/outbox", extras=UNIX).json["items"][0]["status"] == "done",
                       "the send delivered")
            assert runtime.link.is_alive()
        finally:
            runtime.close()


def test_the_watchdog_restarts_a_link_thread_that_ended(tmp_path):
    """LINK-RESTART (E-41): should the link thread ever end while the daemon runs, the runtime's watchdog starts it
    again within a second, and health says so."""
    with ScriptedBroker() as broker:
        runtime = start_runtime(tmp_path / "d", broker)
        link, runs = runtime.link, []
        real_run = type(link).run

        def ends_at_once_the_first_time() -> None:
            runs.append(1)
            if len(runs) > 1:
                real_run(link)

        link.run = ends_at_once_the_first_time
        link._thread = link._new_thread()
        runtime.start()
        try:
            client = falcon.testing.TestClient(runtime.app)
            wait_until(lambda: health(client)["connected"], "the link, started again", timeout=10)
            assert len(runs) == 2
            state = health(client)
            assert state["link_restarts"] == 1 and state["link_last_failure"] == "the broker-link thread ended"
        finally:
            runtime.close()


# --- the fuzz ------------------------------------------------------------------------------------------------------

def _oracle_bad(text: str | bytes) -> bool:
    """Whether the spec says the daemon cannot take this text message: not UTF-8 JSON, an object naming a key twice
    (E-46), past the JSON limits, not an object, or invalid against broker_to_daemon (the schemas)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            return True
    digits: list[int] = []

    def parse_int(literal: str) -> int:
        digits.append(len(literal.lstrip("-")))
        return 0

    def not_json(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    def one_value_per_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        if len({key for key, _ in pairs}) != len(pairs):
            raise ValueError("an object names a key twice")
        return dict(pairs)

    try:
        document = json.loads(text, parse_int=parse_int, parse_constant=not_json, object_pairs_hook=one_value_per_key)
    except (ValueError, RecursionError):
        return True
    if digits and max(digits) > LIMITS["json_max_integer_digits"]:
        return True

    def depth(node: Any) -> int:
        if isinstance(node, dict):
            return 1 + max((depth(v) for v in node.values()), default=0)
        if isinstance(node, list):
            return 1 + max((depth(v) for v in node), default=0)
        return 0

    try:
        if depth(document) > LIMITS["json_max_depth"]:
            return True
    except RecursionError:
        return True
    if not isinstance(document, dict):
        return True
    real = json.loads(text)
    return not BROKER_TO_DAEMON.is_valid(real)


def _push(cmid: str, **changes: Any) -> dict[str, Any]:
    frame = {"type": "push", "messageId": str(ULID()), "meshId": "mesh", "senderPubkey": "ab" * 32,
             "senderName": "fuzz", "topic": "general", "replyToId": None, "priority": "next", "body": "hello",
             "meta": None, "createdAt": "2026-01-01T00:00:00.000Z", "client_message_id": cmid,
             "delivery_id": str(ULID()), "attempt": 1}
    frame.update(changes)
    return frame


texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
PUSH_KEYS = ["type", "messageId", "meshId", "senderPubkey", "priority", "body", "createdAt", "client_message_id",
             "delivery_id", "attempt", "meta", "topic", "replyToId", "senderName"]


@st.composite
def near_valid_push(draw) -> str:
    """A valid push with one thing broken (or, sometimes, nothing: then it is valid and must be delivered)."""
    frame = _push(f"fuzz-{ULID()}")
    mutation = draw(st.sampled_from(["drop", "replace", "extra", "deep", "long_int", "long_body", "none"]))
    if mutation == "drop":
        frame.pop(draw(st.sampled_from(PUSH_KEYS)))
    elif mutation == "replace":
        frame[draw(st.sampled_from(PUSH_KEYS))] = draw(json_values)
    elif mutation == "extra":
        frame[draw(texts.filter(bool))] = draw(json_values)
    elif mutation == "deep":
        return _deep_text(frame, draw(st.integers(min_value=28, max_value=1200)))
    elif mutation == "long_int":
        digits = draw(st.integers(min_value=90, max_value=5000))
        return json.dumps({**frame, "meta": {"n": 0}}).replace('"n": 0', '"n": ' + "9" * digits)
    elif mutation == "long_body":
        frame["body"] = "b" * draw(st.integers(min_value=1, max_value=70_000))
    return json.dumps(frame)


def _deep_text(frame: dict[str, Any], levels: int) -> str:
    text = json.dumps({**frame, "meta": "@"})
    return text.replace('"@"', '{"a":' * levels + "1" + "}" * levels)


raw_frames = st.one_of(
    json_values.map(json.dumps),
    texts,
    st.binary(max_size=40).map(lambda b: ("bytes", b)),
    st.binary(min_size=1, max_size=40).map(lambda b: ("binary", b)),
    near_valid_push(),
    st.just("valid"),
)


@pytest.fixture(scope="module")
def fuzz_rig(tmp_path_factory):
    with ScriptedBroker() as broker:
        runtime = start_runtime(tmp_path_factory.mktemp("fuzz") / "d", broker)
        runtime.start()
        try:
            client = falcon.testing.TestClient(runtime.app)
            wait_until(lambda: health(client)["connected"], "the link")
            yield broker, runtime, client, {"connection": broker.wait_connected(), "valid": [], "sends": []}
        finally:
            runtime.close()
            print(json.dumps({"inbound_fuzz_examples": len(FUZZ_FRAMES), "inbound_fuzz_frames": sum(FUZZ_FRAMES)}))


def _quarantine_seen(client: falcon.testing.TestClient) -> int:
    """Frames quarantined so far (repeats included): cm_daemon_invalid_inbound_total."""
    metrics = client.simulate_get("/v1/metrics", extras=UNIX).text
    line = next(line for line in metrics.splitlines() if line.startswith("cm_daemon_invalid_inbound_total "))
    return int(float(line.split()[1]))


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames=st.lists(raw_frames, min_size=1, max_size=6))
def test_fuzzed_inbound_frames_never_cut_the_link(fuzz_rig, frames):
    """LINK-SURVIVES, INB-QUARANTINE (E-41): whatever the broker sends, the link stays up on the same connection,
    health stays connected, nothing accepted is lost, and every frame the spec calls bad is quarantined."""
    _fuzz_example(fuzz_rig, frames)


@pytest.mark.slow
@settings(max_examples=SLOW_FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames=st.lists(raw_frames, min_size=1, max_size=12))
def test_fuzzed_inbound_frames_soak(fuzz_rig, frames):
    """The long form of the inbound fuzz: MESHSPEC_SLOW_FUZZ_EXAMPLES examples (default 3000) of up to 12 frames."""
    _fuzz_example(fuzz_rig, frames)


def _fuzz_example(fuzz_rig, frames) -> None:
    broker, runtime, client, seen = fuzz_rig
    connection = broker._connections[seen["connection"]]
    quarantined_before = _quarantine_seen(client)
    bad = 0
    cmid = f"send-{ULID()}"
    assert client.simulate_post("/v1/send", json={"to": "#general", "message": "m"},
                                headers={"Idempotency-Key": cmid}, extras=UNIX).status_code == 202
    seen["sends"].append(cmid)
    for frame in frames:
        if frame == "valid":
            push = _push(f"valid-{ULID()}")
            seen["valid"].append(push["client_message_id"])
            broker.send_raw(push)
            continue
        if isinstance(frame, tuple):
            kind, data = frame
            connection.send(data, text=kind == "bytes")
            bad += 1 if kind == "binary" else _oracle_bad(data)
            continue
        if not _oracle_bad(frame) and '"type": "push"' in frame and re.search(r'"subtype"', frame) is None:
            seen["valid"].append(json.loads(frame).get("client_message_id"))
        bad += _oracle_bad(frame)
        connection.send(frame)
    sentinel = _push(f"sentinel-{ULID()}")
    broker.send_raw(sentinel)
    wait_until(lambda: any(a["clientMessageId"] == sentinel["client_message_id"]
                           for a in broker.received("client_ack")), "the sentinel's ack")
    FUZZ_FRAMES.append(len(frames) + 1)
    assert broker.wait_connected() == seen["connection"], "the link reconnected"
    state = health(client)
    assert state["connected"] and state["link_restarts"] == 0, state
    assert _quarantine_seen(client) - quarantined_before == bad, (frames, bad)
    assert runtime.inbox.quarantine_count() == state["quarantined"]


def test_after_the_fuzz_nothing_accepted_was_lost(fuzz_rig):
    """The fuzz's bookkeeping: every valid push is in the inbox once, every send it made is done."""
    _broker, _runtime, client, seen = fuzz_rig
    if not FUZZ_FRAMES:
        pytest.skip("the fuzz did not run")
    inbox = {item["client_message_id"] for item in
             client.simulate_get("/v1/inbox", params={"limit": 1000}, extras=UNIX).json["items"]}
    assert set(seen["valid"]) <= inbox
    wait_until(lambda: {row["client_message_id"] for row in client.simulate_get(
        "/v1/outbox", params={"status": "done", "limit": 500}, extras=UNIX).json["items"]} >= set(seen["sends"]),
        "every send done")


def test_a_too_large_fragmented_message_is_dropped_and_the_next_one_taken(tmp_path):
    """LINK-SURVIVES (E-41): a message past link_frame_max_bytes sent in fragments is dropped fragment by fragment
    (never held whole), quarantined by its first bytes, and the link carries on with the next message."""
    with ScriptedBroker() as broker:
        runtime = start_runtime(tmp_path / "d", broker)
        runtime.start()
        try:
            client = falcon.testing.TestClient(runtime.app)
            wait_until(lambda: health(client)["connected"], "the link")
            connection = broker._connections[broker.wait_connected()]
            connection.send(iter(["{" + '"x":"' + "y" * 600_000, "y" * 600_000 + '"}']))  # fragments
            after = _push("after-big")
            broker.send_raw(after)
            wait_until(lambda: any(a["clientMessageId"] == "after-big" for a in broker.received("client_ack")),
                       "the next message")
            records = runtime.inbox.quarantined()
            assert len(records) == 1 and "link_frame_max_bytes" in records[0].reason
            assert records[0].frame_bytes > LIMITS["link_frame_max_bytes"]
            assert len(records[0].frame) <= 65_536
            assert health(client)["connected"]
        finally:
            runtime.close()


def test_a_binary_or_duplicate_key_push_is_quarantined_not_stored(tmp_path):
    """LINK-FRAME-IJSON (E-46): a push in a binary message, or one naming a key twice (at the top or inside meta), is
    quarantined and nothing of it stored; the link carries on with the next message."""
    with ScriptedBroker() as broker:
        runtime = start_runtime(tmp_path / "d", broker)
        runtime.start()
        try:
            client = falcon.testing.TestClient(runtime.app)
            wait_until(lambda: health(client)["connected"], "the link")
            twice = json.dumps(_push("twice")).replace('"body": "hello"', '"body": "hello", "body": "bye"')
            nested = json.dumps(_push("nested")).replace('"meta": null', '"meta": {"k": 1, "k": 2}')
            for message in (json.dumps(_push("binary")).encode(), twice, nested):
                broker.send_raw(message)
            broker.send_raw(_push("after"))
            wait_until(lambda: any(a["clientMessageId"] == "after" for a in broker.received("client_ack")),
                       "the next message")
            reasons = sorted(record.reason for record in runtime.inbox.quarantined())
            assert reasons == ["a binary message (the link carries JSON text)",
                               "unparsable: duplicate object key 'body' (RFC 7493 I-JSON)",
                               "unparsable: duplicate object key 'k' (RFC 7493 I-JSON)"]
            stored = {item["client_message_id"] for item in client.simulate_get("/v1/inbox", extras=UNIX).json["items"]}
            assert stored == {"after"}
            assert health(client)["connected"]
        finally:
            runtime.close()


def test_quarantine_keeps_its_newest_rows(tmp_path):
    """quarantine_max_rows: the quarantine is bounded; the oldest frames go first."""
    from reference.daemon.store import InboxStore

    store = InboxStore(tmp_path / "inbox.db")
    try:
        for n in range(12):
            store.quarantine(frame_key=bytes([n]) * 32, frame=b"x", frame_bytes=1, reason=f"r{n}", now_ms=n,
                             max_rows=10)
        assert [record.reason for record in store.quarantined()] == [f"r{n}" for n in range(11, 1, -1)]
        assert store.quarantine(frame_key=bytes([11]) * 32, frame=b"x", frame_bytes=1, reason="again", now_ms=99,
                                max_rows=10)[1] is False
        assert store.quarantined()[0].seen == 2
    finally:
        store.close()


def test_copy_of_push_is_independent():  # keeps the helper honest: each push gets fresh ids
    first, second = _push("a"), copy.deepcopy(_push("a"))
    assert first["delivery_id"] != second["delivery_id"]
    assert threading.active_count() >= 1
