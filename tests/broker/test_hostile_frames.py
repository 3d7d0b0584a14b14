"""The broker against hostile frames: the JSON limits in B1, 4005 for what cannot be parsed, 1009 for what is too
large, a connection cap, retry_after_ms on a rate limit -- and never a 1011 with a traceback (E-40, E-42, E-43).

The broker runs in this process on a real socket (broker_server_testkit.running_broker); clients are real WebSocket
clients. The hypothesis fuzz sends arbitrary JSON, garbage and near-valid frames (a valid send or client_ack with one
thing broken) after a real handshake, and checks after each example that the connection was either still served
or closed with a documented code (4005, 1009), never 1011, that the broker still serves another member, and that
only sends it acknowledged with 201 left a dedupe row.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from broker_server_testkit import Client, Member, joined, running_broker, send_frame
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed

from reference.core.codes import close_codes
from spec import load_table, validator

CLOSE = close_codes()
LIMITS = {name: entry["value"] for name, entry in load_table("limits")["limits"].items()}
BROKER_TO_DAEMON = validator("broker/frame#/$defs/broker_to_daemon")
FUZZ_EXAMPLES = int(os.environ.get("MESHSPEC_FUZZ_EXAMPLES", "150"))
SLOW_FUZZ_EXAMPLES = int(os.environ.get("MESHSPEC_SLOW_FUZZ_EXAMPLES", "3000"))
FUZZ_FRAMES: list[int] = []


def valid(frame: dict) -> dict:
    errors = [e.message for e in BROKER_TO_DAEMON.iter_errors(frame)]
    assert not errors, (frame, errors)
    return frame


@pytest.fixture
def cast() -> dict[str, Member]:
    return {name: Member(name) for name in ("alice", "bob")}


def _until(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _deep(levels: int) -> str:
    return '{"a":' * (levels - 1) + "1" + "}" * (levels - 1)


@pytest.mark.parametrize("when", ["before_hello", "after_handshake"])
def test_a_frame_too_deep_to_parse_closes_4005_not_1011(tmp_path, cast, when):
    """BRK-FRAME-LIMITS (E-40): a frame nested deeper than any parser goes closes 4005 protocol_error (before: 1011
    internal_error and a traceback), whenever it comes."""
    with running_broker(f"sqlite:///{tmp_path / 'b.db'}", list(cast.values())) as broker, Client(broker.url) as client:
        if when == "after_handshake":
            client.handshake(cast["alice"])
        client.send('{"type":"send","meta":' + _deep(100_000) + "}")
        assert client.closed() == (CLOSE["protocol_error"], "protocol_error")


def test_frames_past_the_json_limits_are_refused_in_b1(tmp_path, cast):
    """BRK-FRAME-LIMITS (E-40): a send whose meta nests past json_max_depth, or holds an integer literal past
    json_max_integer_digits, is refused in B1 by its client_message_id (ack 400 limit_exceeded, no dedupe row); any
    other frame past a limit gets an error frame; the connection carries on."""
    with running_broker(f"sqlite:///{tmp_path / 'b.db'}", list(cast.values())) as broker, \
            joined(broker.url, cast["alice"]) as alice:
        alice.send(json.dumps(send_frame("deep-send")).replace('"meta": null', '"meta": ' + _deep(40)))
        deep = valid(alice.expect("ack", client_message_id="deep-send"))
        alice.send(json.dumps(send_frame("long-int")).replace('"meta": null', '"meta": {"n": ' + "9" * 5000 + "}"))
        long_int = valid(alice.expect("ack", client_message_id="long-int"))
        alice.send('{"type":"list_peers","requestId":"r1","x":' + _deep(40) + "}")
        error = valid(alice.expect("error"))
        alice.send(send_frame("fine"))
        fine = valid(alice.expect("ack", client_message_id="fine"))
        tally = broker.store.counts()
    assert (deep["status"], deep["error"]) == (400, "limit_exceeded") and "json_max_depth" in deep["detail"]
    assert (long_int["status"], long_int["error"]) == (400, "limit_exceeded")
    assert error["code"] == "invalid_frame" and "json_max_depth" in error["message"]
    assert fine["status"] == 201 and tally["client_message_dedupe"] == 1


def test_a_message_past_the_frame_limit_closes_1009(tmp_path, cast):
    """BRK-FRAME-LIMITS (E-40): a WebSocket message past link_frame_max_bytes closes 1009 (message too big), and the
    limit is the same one the daemon's accept check and inbound reader use."""
    with running_broker(f"sqlite:///{tmp_path / 'b.db'}", list(cast.values())) as broker, \
            joined(broker.url, cast["alice"]) as alice:
        alice.send(send_frame("huge", "h" * (LIMITS["link_frame_max_bytes"] + 1)))
        code, _ = alice.closed()
        assert code == 1009
        with joined(broker.url, cast["bob"]) as bob:  # nobody else is touched
            bob.send(send_frame("after"))
            assert bob.expect("ack", client_message_id="after")["status"] == 201


def test_a_rate_limited_send_is_told_when_to_come_back(tmp_path, cast):
    """OBX-RETRY-LATER (E-42): the B1 rate limit answers 429 with retry_after_ms, the time until the member's bucket
    holds a token again."""
    url = f"sqlite:///{tmp_path / 'b.db'}"
    with running_broker(url, list(cast.values()), rate_per_s=2.0, rate_burst=1) as broker, \
            joined(broker.url, cast["alice"]) as alice:
        alice.send(send_frame("r1"))
        assert alice.expect("ack", client_message_id="r1")["status"] == 201
        alice.send(send_frame("r2"))
        limited = valid(alice.expect("ack", client_message_id="r2"))
    assert (limited["status"], limited["error"]) == (429, "rate_limited")
    assert 0 < limited["retry_after_ms"] <= 500


def test_connections_past_the_cap_are_closed_before_their_handshake(tmp_path, cast):
    """BRK-CONNECTION-CAP (E-43): past max_connections (3 here) open connections, authenticated or not, a new one is
    closed 1013 at once; when one goes, a new one is served again."""
    with running_broker(f"sqlite:///{tmp_path / 'b.db'}", list(cast.values()), max_connections=3) as broker:
        idle = [Client(broker.url) for _ in range(3)]
        try:
            _until(lambda: broker._connections == 3, "three connections counted")
            with Client(broker.url) as extra:
                assert extra.closed()[0] == 1013
        finally:
            for client in idle:
                client.close()
        _until(lambda: broker._connections == 0, "the connections to end")
        with joined(broker.url, cast["alice"]) as alice:
            alice.send(send_frame("served"))
            assert alice.expect("ack", client_message_id="served")["status"] == 201


# --- the fuzz ------------------------------------------------------------------------------------------------------

texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=12,
)
SEND_KEYS = ["type", "id", "client_message_id", "request_fingerprint", "envelope_version", "destination_kind",
             "destination_ref", "priority", "reply_to_id", "meta", "body"]


@st.composite
def near_valid(draw) -> str:
    """A valid send or client_ack with one thing broken (or none: a valid frame)."""
    cmid = f"fz-{draw(st.integers(0, 10**9))}"
    if draw(st.booleans()):
        frame = send_frame(cmid, draw(texts.filter(bool)) if draw(st.booleans()) else "hello")
        keys = SEND_KEYS
    else:
        frame = {"type": "client_ack", "clientMessageId": cmid, "brokerMessageId": "01JXAMPLE000000000000000000",
                 "delivery_id": str(draw(st.integers(0, 10**6)))}
        keys = list(frame)
    mutation = draw(st.sampled_from(["drop", "replace", "extra", "deep", "long_int", "none"]))
    if mutation == "drop":
        frame.pop(draw(st.sampled_from(keys)))
    elif mutation == "replace":
        frame[draw(st.sampled_from(keys))] = draw(json_values)
    elif mutation == "extra":
        frame[draw(texts.filter(bool))] = draw(json_values)
    elif mutation == "deep":
        return json.dumps({**frame, "meta": "@"}).replace('"@"', _deep(draw(st.integers(30, 3000))))
    elif mutation == "long_int":
        return json.dumps({**frame, "meta": "@"}).replace('"@"', '{"n": ' + "7" * draw(st.integers(90, 6000)) + "}")
    return json.dumps(frame)


frames = st.one_of(json_values.map(json.dumps), texts, near_valid())


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory):
    members = {name: Member(name) for name in ("alice", "bob")}
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'b.db'}"
    with running_broker(url, list(members.values())) as broker, joined(broker.url, members["bob"]) as bob:
        yield broker, members, bob, {"created": set(), "probe": 0, "unanswered": 0}
    print(json.dumps({"broker_fuzz_examples": len(FUZZ_FRAMES), "broker_fuzz_frames": sum(FUZZ_FRAMES)}))


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(sent=st.lists(frames, min_size=1, max_size=6))
def test_fuzzed_frames_never_end_in_1011_and_the_broker_keeps_serving(fuzz_broker, sent):
    """BRK-FRAME-LIMITS, ERR-NO-5XX-ON-BAD-INPUT (broker side): whatever a member sends, its connection is served or
    closed with a documented code (4005 protocol_error, 1009), never 1011; other members are served throughout; and
    only sends acknowledged 201 leave a dedupe row."""
    _fuzz_example(fuzz_broker, sent)


@pytest.mark.slow
@settings(max_examples=SLOW_FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(sent=st.lists(frames, min_size=1, max_size=12))
def test_fuzzed_frames_soak(fuzz_broker, sent):
    """The long form of the broker fuzz: MESHSPEC_SLOW_FUZZ_EXAMPLES examples (default 3000) of up to 12 frames."""
    _fuzz_example(fuzz_broker, sent)


def _fuzz_example(fuzz_broker, sent) -> None:
    broker, members, bob, seen = fuzz_broker
    FUZZ_FRAMES.append(len(sent))
    with Client(broker.url) as alice:
        alice.handshake(members["alice"])
        try:
            for frame in sent:
                alice.send(frame)
            # A send of its own last: the broker acknowledges one connection's sends in order, so once its ack is
            # here every earlier send of the example has been answered (peers_list would come back sooner).
            seen["probe"] += 1
            probe = f"alice-{seen['probe']}"
            alice.send(send_frame(probe))
            assert alice.expect("ack", timeout=10, client_message_id=probe)["status"] == 201
            seen["created"].add(probe)
            answers = [alice.backlog.pop(0) for _ in range(len(alice.backlog))]
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd else None
            assert code in (CLOSE["protocol_error"], 1009), (code, sent)
            answers = list(alice.backlog)
            # sends queued before the close may still commit, their acks lost with the connection (as in a crash)
            seen["unanswered"] += sum('"type": "send"' in frame for frame in sent)
        for answer in answers:
            valid(answer)
            if answer.get("type") == "ack" and answer["status"] in (200, 201):
                seen["created"].add(answer["client_message_id"])
    seen["probe"] += 1
    bob.send(send_frame(f"bob-{seen['probe']}"))
    assert bob.expect("ack", client_message_id=f"bob-{seen['probe']}", timeout=10)["status"] == 201
    seen["created"].add(f"bob-{seen['probe']}")
    assert broker.store.counts()["client_message_dedupe"] <= len(seen["created"]) + seen["unanswered"]


def test_after_the_fuzz_the_store_is_consistent(fuzz_broker):
    broker, _, _, _seen = fuzz_broker
    if not FUZZ_FRAMES:
        pytest.skip("the fuzz did not run")
    assert broker.store.orphan_check() == []
