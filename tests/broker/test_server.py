"""The reference broker's WebSocket server on every store engine: handshake, negotiation, accept, fan-out, presence,
retention and traces, through real sockets (the server in-process), then end to end with reference daemons and the
`meshd broker` commands as subprocesses.

Each test names the requirement ids (spec/requirements.yaml) it checks in its docstring.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
from pathlib import Path

import httpx
import pytest
from broker_server_testkit import (
    MESH,
    BrokerProcess,
    Client,
    Member,
    joined,
    meshd,
    running_broker,
    send_frame,
)

from conformance.launch import REFERENCE_TEMPLATE, Launched
from reference.broker.store import open_store
from reference.core.codes import close_codes, exit_code
from reference.daemon.identity import load_or_mint_keypair
from reference.trace import schema_check
from spec import validator

CLOSE = close_codes()
BROKER_TO_DAEMON = validator("broker/frame#/$defs/broker_to_daemon")
FAST_DAEMON = """
[outbox]
retry_base_ms = 50
retry_max_ms = 300
ack_timeout_s = 3.0
[reconnect]
initial_ms = 50
max_ms = 300
[daemon]
drain_timeout_s = 1.0
"""


def valid(frame: dict) -> dict:
    """``frame`` after checking it against the broker→daemon schemas (E-28)."""
    errors = [e.message for e in BROKER_TO_DAEMON.iter_errors(frame)]
    assert not errors, (frame, errors)
    return frame


def cli(*args: str) -> tuple[int, str]:
    """`meshd ARGS` in this process (the same parser and commands as the console script); (exit code, stdout)."""
    import contextlib
    import io

    from reference.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(list(args))
    return code, out.getvalue()


@pytest.fixture
def cast() -> dict[str, Member]:
    return {name: Member(name) for name in ("alice", "bob", "carol")}


# --- frame validation ------------------------------------------------------------------------------------------------

def _corpus() -> list[tuple[str, dict]]:
    member = Member("m")
    valid_frames = [
        member.hello(sessionId="daemon-1", pid=1, peerType="ai", channel="meshd", hostname="h"),
        {"type": "feature_negotiation_request", "require": ["client_message_id_dedupe"], "optional": []},
        send_frame("c1", meta={"k": [1, 2]}), send_frame("c2", ref=member.pubkey, kind="dm"),
        send_frame("c3", ref="jobs:1", kind="queue", reply_to_id="01HQXABCDEF"),
        {"type": "client_ack", "clientMessageId": "c1", "brokerMessageId": "01HQX", "delivery_id": "7"},
        {"type": "list_peers", "requestId": "r"}, {"type": "set_summary", "summary": "s"},
        {"type": "set_status", "status": "dnd"}, {"type": "set_visible", "visible": False},
        {"type": "set_profile", "title": "t", "capabilities": ["a", "b"]},
    ]
    corpus = []
    for frame in valid_frames:
        corpus.append((frame["type"], frame))
        corpus.append((frame["type"], {**frame, "bogus": 1}))
        for key in frame:
            if key == "type":
                continue
            corpus.append((frame["type"], {k: v for k, v in frame.items() if k != key}))
            for wrong in (12345, "", None, "x" * 300, [], {"a": 1}, True):
                corpus.append((frame["type"], {**frame, key: wrong}))
    return corpus


@pytest.mark.parametrize("engine", ["jsonschema_rs", "jsonschema"])
def test_fast_frame_validation_agrees_with_the_spec_validator(engine):
    """E-28, INB-SCHEMA's broker side: the broker's frame check (schemas with inlined $refs, jsonschema_rs when
    installed) accepts and refuses exactly what spec.validator does, over valid frames and their mutations."""
    from reference.broker._schemas import FrameSchema, jsonschema_rs

    if engine == "jsonschema_rs" and jsonschema_rs is None:
        pytest.skip("jsonschema_rs is not installed")
    schemas: dict[str, FrameSchema] = {}
    disagreements = []
    for kind, frame in _corpus():
        ref = f"broker/{kind}"
        fast = schemas.setdefault(kind, FrameSchema(ref, prefer_rust=engine == "jsonschema_rs"))
        assert fast.engine == engine
        if (fast.problem(frame) is None) != validator(ref).is_valid(frame):
            disagreements.append((kind, frame))
    assert not disagreements, disagreements[:5]


# --- handshake and negotiation ----------------------------------------------------------------------------------------

def test_negotiation_advertises_the_meshs_dedupe_policy_with_request_fingerprint(store_url, cast):
    """BRK-ADVERTISE, NEG-ORDER: hello → hello_ack → negotiation; the broker offers client_message_id_dedupe v1 with
    request_fingerprint true and its mesh's mode and retention, and names unknown required bits in missing_required."""
    with running_broker(store_url, list(cast.values())) as broker, Client(broker.url) as client:
        client.send(cast["alice"].hello())
        ack = valid(client.expect("hello_ack"))
        assert (ack["meshId"], ack["memberId"]) == (MESH, cast["alice"].pubkey)
        client.send({"type": "feature_negotiation_request", "require": ["client_message_id_dedupe", "no_such_bit"],
                     "optional": ["max_payload"]})
        response = valid(client.expect("feature_negotiation_response"))
    dedupe = response["supported"]["client_message_id_dedupe"]["params"]
    assert dedupe == {"version": 1, "mode": "retention_scoped", "dedupe_retention_days": 7,
                      "request_fingerprint": True}
    assert response["missing_required"] == ["no_such_bit"]
    assert response["supported"]["max_payload"]["params"]["inline_bytes"] == 65_536
    assert response["supported"]["concurrent_connection_policy"]["params"]["default_policy"] == "prefer_newest"


def _refusal(url: str, frame) -> tuple[int | None, str]:
    with Client(url) as client:
        client.send(frame)
        return client.closed()


@pytest.mark.parametrize("case", ["unknown_member", "bad_signature", "unknown_mesh", "stale", "future"])
def test_hello_is_verified_and_refused_with_documented_close_codes(tmp_path, cast, case):
    """BRK-HELLO-AUTH (E-22): unknown member, unknown mesh or a bad signature → 4001 unauthorized; a timestamp more
    than 60 s away → 4002 hello_expired; 59 s away is admitted."""
    outsider = Member("mallory")
    now = int(time.time() * 1000)
    frames = {
        "unknown_member": (outsider.hello(), "unauthorized"),
        "bad_signature": (cast["alice"].hello(sign_as=outsider), "unauthorized"),
        "unknown_mesh": (cast["alice"].hello("no-such-mesh"), "unauthorized"),
        "stale": (cast["alice"].hello(timestamp=now - 61_000), "hello_expired"),
        "future": (cast["alice"].hello(timestamp=now + 61_000), "hello_expired"),
    }
    frame, name = frames[case]
    with running_broker(f"sqlite:///{tmp_path / 'b.db'}", list(cast.values())) as broker:
        assert _refusal(broker.url, frame) == (CLOSE[name], name)
        with Client(broker.url) as client:  # inside the skew: admitted
            client.send(cast["alice"].hello(timestamp=now - 59_000))
            valid(client.expect("hello_ack"))


@pytest.mark.parametrize("case", ["send_first", "not_json", "send_before_negotiation", "unknown_type_later",
                                  "unparsable_later", "hello_timeout"])
def test_frames_out_of_order_or_unparsable_close_4005(tmp_path, cast, case):
    """BRK-HELLO-AUTH, NEG-ORDER (E-08, E-22): anything before hello, or before the negotiation request, or a frame
    that is not JSON or of no known type → 4005 protocol_error."""
    alice = cast["alice"]
    with running_broker(f"sqlite:///{tmp_path / 'b.db'}", list(cast.values()), handshake_timeout_s=0.5) as broker:
        with Client(broker.url) as client:
            if case == "send_first":
                client.send(send_frame("c1"))
            elif case == "not_json":
                client.send("{not json")
            elif case == "send_before_negotiation":
                client.send(alice.hello())
                client.expect("hello_ack")
                client.send(send_frame("c1"))
            elif case in ("unknown_type_later", "unparsable_later"):
                client.handshake(alice)
                client.send({"type": "ack"} if case == "unknown_type_later" else "[1, 2")
            assert client.closed() == (CLOSE["protocol_error"], "protocol_error")
        assert broker.store.counts()["client_message_dedupe"] == 0


@pytest.mark.parametrize("case", ["binary_hello", "binary_send", "duplicate_key_send", "nested_duplicate_key"])
def test_a_binary_or_duplicate_key_frame_closes_4005(tmp_path, cast, case):
    """LINK-FRAME-IJSON (E-46): a frame is one I-JSON text message; a binary message (valid JSON in it or not) or an
    object naming a key twice closes 4005 protocol_error, and the send in it leaves no dedupe row."""
    alice = cast["alice"]
    sent = json.dumps(send_frame("c1", "first"))
    with running_broker(f"sqlite:///{tmp_path / 'b.db'}", list(cast.values())) as broker:
        with Client(broker.url) as client:
            if case == "binary_hello":
                client.ws.send(json.dumps(alice.hello()).encode())
            else:
                client.handshake(alice)
                if case == "binary_send":
                    client.ws.send(sent.encode())
                elif case == "duplicate_key_send":
                    client.send(sent.replace('"body": "first"', '"body": "first", "body": "second"'))
                else:
                    client.send(sent.replace('"meta": null', '"meta": {"k": 1, "k": 2}'))
            assert client.closed() == (CLOSE["protocol_error"], "protocol_error")
        assert broker.store.counts()["client_message_dedupe"] == 0


# --- accept -----------------------------------------------------------------------------------------------------------

def test_send_answers_201_200_409_and_drift_with_schema_valid_acks(store_url, cast):
    """WS-ACK-STATUS, BRK-FIRST-INSERT, BRK-DUP-MATCH, BRK-DUP-MISMATCH, BRK-RECOMPUTE: one ack per send, each valid
    against ack.json; a retry collapses onto the first message; a reused id with another body is 409; a claimed
    fingerprint that differs from the broker's recomputation is 409 canonical_form_drift before any write."""
    with running_broker(store_url, list(cast.values())) as broker, joined(broker.url, cast["alice"]) as alice:
        alice.send(send_frame("c1", "first"))
        created = valid(alice.expect("ack", client_message_id="c1"))
        alice.send(send_frame("c1", "first"))
        duplicate = valid(alice.expect("ack", client_message_id="c1"))
        alice.send(send_frame("c1", "another body"))
        reused = valid(alice.expect("ack", client_message_id="c1"))
        alice.send(send_frame("c2", "drift", claimed="0" * 64))
        drift = valid(alice.expect("ack", client_message_id="c2"))
        tally = broker.store.counts()
    assert (created["status"], created["duplicate"], created["queued"]) == (201, False, True)
    assert created["messageId"] == created["broker_message_id"]
    assert (duplicate["status"], duplicate["duplicate"], duplicate["history_available"]) == (200, True, True)
    assert (duplicate["broker_message_id"], duplicate["history_id"]) == (created["broker_message_id"],
                                                                           created["history_id"])
    assert (reused["status"], reused["conflict"], reused["messageId"]) == (409, "request_fingerprint_mismatch", "")
    assert (drift["status"], drift["conflict"]) == (409, "canonical_form_drift")
    assert (tally["client_message_dedupe"], tally["topic_message"], tally["message_history"]) == (1, 1, 1)
    assert tally["delivery_queue"] == 2  # bob and carol


def test_b1_rejections_answer_before_any_write(tmp_path, cast):
    """BRK-B1-NO-WRITE (E-28): a schema failure with a usable id is a 400 invalid_frame ack, without one an error
    frame; a body over the advertised inline_bytes is 413; past the member's token bucket 429. No dedupe row."""
    with running_broker(f"sqlite:///{tmp_path / 'b.db'}", list(cast.values()), inline_bytes=1024, rate_per_s=0.001,
                        rate_burst=2) as broker, joined(broker.url, cast["alice"]) as alice:
        alice.send({**send_frame("c1"), "priority": "urgent"})
        schema_ack = valid(alice.expect("ack", client_message_id="c1"))
        alice.send({**send_frame("x"), "client_message_id": "not a valid id!", "id": "not a valid id!"})
        error = valid(alice.expect("error"))
        alice.send(send_frame("c2", "x" * 1025))
        too_large = valid(alice.expect("ack", client_message_id="c2"))
        alice.send(send_frame("c3", "ok"))
        alice.send(send_frame("c4", "ok"))
        alice.send(send_frame("c5", "over the limit"))
        statuses = {cmid: valid(alice.expect("ack", client_message_id=cmid))["status"] for cmid in ("c3", "c4", "c5")}
        tally = broker.store.counts()
    assert (schema_ack["status"], schema_ack["error"]) == (400, "invalid_frame")
    assert error["code"] == "invalid_frame"
    assert (too_large["status"], too_large["error"]) == (413, "payload_too_large")
    assert sorted(statuses.values()) == [201, 201, 429]  # pipelined: which one meets the empty bucket varies
    assert tally["client_message_dedupe"] == 2


def test_b2_unknown_topic_rolls_back_the_claim(store_url, cast):
    """BRK-B2-ROLLBACK: a send to a topic that does not exist (no --dev) is 404 destination_not_found and leaves no
    dedupe row: the same id then commits to an existing topic."""
    with running_broker(store_url, list(cast.values())) as broker, joined(broker.url, cast["alice"]) as alice:
        alice.send(send_frame("c1", ref="nosuch"))
        rejected = valid(alice.expect("ack", client_message_id="c1"))
        assert broker.store.counts()["client_message_dedupe"] == 0
        alice.send(send_frame("c1", ref="general"))
        assert alice.expect("ack", client_message_id="c1")["status"] == 201
    assert (rejected["status"], rejected["error"]) == (404, "destination_not_found")


def test_racing_one_client_message_id_over_many_connections_commits_one_message(store_url):
    """BRK-CONCURRENT-ONE-MESSAGE, BRK-ORPHAN-CHECK: sixteen members on sixteen connections send one
    client_message_id at once, half with one body and half with another: exactly one 201; every other caller gets
    200 with the winner's broker_message_id if its fingerprint matches, else 409; the orphan check is clean."""
    members = [Member(f"m{i}") for i in range(16)]
    with running_broker(store_url, members, db_workers=16) as broker:
        clients = [joined(broker.url, member) for member in members]
        barrier = threading.Barrier(len(clients))
        acks: list[dict] = [{} for _ in clients]

        def race(index: int) -> None:
            barrier.wait(timeout=30)
            clients[index].send(send_frame("shared", f"variant {index % 2}"))
            acks[index] = valid(clients[index].expect("ack", client_message_id="shared", timeout=30))

        threads = [threading.Thread(target=race, args=(i,)) for i in range(len(clients))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        for client in clients:
            client.close()
        tally, orphans = broker.store.counts(), broker.store.orphan_check()
    statuses = [ack["status"] for ack in acks]
    assert statuses.count(201) == 1, statuses
    winner = statuses.index(201)
    for index, ack in enumerate(acks):
        if index == winner:
            continue
        if index % 2 == winner % 2:
            assert (ack["status"], ack["broker_message_id"]) == (200, acks[winner]["broker_message_id"])
        else:
            assert (ack["status"], ack["conflict"]) == (409, "request_fingerprint_mismatch")
    assert (tally["client_message_dedupe"], tally["topic_message"], tally["message_history"]) == (1, 1, 1)
    assert tally["delivery_queue"] == 15
    assert orphans == []


# --- fan-out ----------------------------------------------------------------------------------------------------------

def test_committed_messages_are_pushed_redelivered_after_the_lease_and_stop_after_client_ack(store_url, cast):
    """BRK-DELIVERY-COMMITTED, BRK-REDELIVER: a recipient gets a push (delivery_id, attempt 1) of the committed
    message, again with attempt 2 after the lease while it does not ack, and never after its client_ack; a member
    that connects later gets its backlog."""
    with (running_broker(store_url, list(cast.values()), lease_s=0.4) as broker,
          joined(broker.url, cast["alice"]) as alice, joined(broker.url, cast["bob"]) as bob):
        alice.send(send_frame("c1", "to everyone", meta={"k": 1}))
        ack = alice.expect("ack", client_message_id="c1")
        first = valid(bob.expect("push", client_message_id="c1"))
        again = valid(bob.expect("push", client_message_id="c1", timeout=5))
        bob.send({"type": "client_ack", "clientMessageId": "c1", "brokerMessageId": again["messageId"],
                  "delivery_id": again["delivery_id"]})
        assert bob.quiet("push", 1.2, client_message_id="c1")
        with joined(broker.url, cast["carol"]) as carol:  # offline until now: the backlog arrives
            backlog = valid(carol.expect("push", client_message_id="c1"))
    assert (first["messageId"], first["topic"], first["body"], first["meta"]) == (
        ack["broker_message_id"], "general", "to everyone", {"k": 1})
    assert (first["attempt"], again["attempt"], again["delivery_id"]) == (1, 2, first["delivery_id"])
    assert first["senderPubkey"] == cast["alice"].pubkey
    assert backlog["attempt"] == 1


def test_dm_and_presence_peers_list_profile_and_join_leave(tmp_path, cast):
    """A dm reaches its recipient (topic null); list_peers answers the other connected members with their profile
    updates (set_summary, set_status, set_visible, set_profile); peer_joined and peer_left reach the others."""
    with (running_broker(f"sqlite:///{tmp_path / 'b.db'}", list(cast.values())) as broker,
          joined(broker.url, cast["alice"]) as alice):
        with joined(broker.url, cast["bob"]) as bob:
            joined_event = valid(alice.expect("push", event="peer_joined"))
            bob.send({"type": "set_summary", "summary": "writing tests"})
            bob.send({"type": "set_status", "status": "working"})
            bob.send({"type": "set_profile", "title": "tester", "capabilities": ["python"]})
            bob.send({"type": "list_peers", "requestId": "sync"})  # frames are handled in order
            bob.expect("peers_list", requestId="sync")
            alice.send({"type": "list_peers", "requestId": "r1"})
            peers = valid(alice.expect("peers_list", requestId="r1"))["peers"]
            bob.send({"type": "set_visible", "visible": False})
            bob.send({"type": "list_peers", "requestId": "sync2"})
            bob.expect("peers_list", requestId="sync2")
            alice.send({"type": "list_peers", "requestId": "r2"})
            hidden = alice.expect("peers_list", requestId="r2")["peers"]
            alice.send(send_frame("d1", "psst", ref=cast["bob"].pubkey, kind="dm"))
            dm = valid(bob.expect("push", client_message_id="d1"))
            bob.send({"type": "list_peers", "bogus": 1})
            invalid = valid(bob.expect("error"))
        left = valid(alice.expect("push", event="peer_left"))
    assert joined_event["eventData"]["pubkey"] == cast["bob"].pubkey
    assert [(p["pubkey"], p["displayName"], p["summary"], p["status"], p["title"]) for p in peers] == [
        (cast["bob"].pubkey, "bob", "writing tests", "working", "tester")]
    assert hidden == []
    assert (dm["topic"], dm["body"]) == (None, "psst")
    assert invalid["code"] == "invalid_frame"
    assert left["eventData"]["pubkey"] == cast["bob"].pubkey


@pytest.mark.parametrize("policy", ["prefer_newest", "prefer_oldest", "allow_concurrent"])
def test_concurrent_connection_policy(tmp_path, cast, policy):
    """E-22: prefer_newest closes the older connection with 4003, prefer_oldest refuses the newer with 4004,
    allow_concurrent keeps both."""
    with running_broker(f"sqlite:///{tmp_path / 'b.db'}", list(cast.values()), connection_policy=policy) as broker:
        first = joined(broker.url, cast["alice"])
        second = Client(broker.url)
        second.send(cast["alice"].hello())
        if policy == "prefer_newest":
            second.expect("hello_ack")
            assert first.closed() == (4003, "replaced_by_newer_connection")
        elif policy == "prefer_oldest":
            assert second.closed() == (4004, "member_already_connected")
        else:
            second.expect("hello_ack")
            first.send({"type": "list_peers", "requestId": "still-open"})
            first.expect("peers_list", requestId="still-open")
        first.close()
        second.close()


# --- retention and traces ---------------------------------------------------------------------------------------------

def test_retention_thread_flips_history_available_and_traces_are_schema_valid(store_url, cast, tmp_path):
    """BRK-HISTORY-AVAILABLE, trace kinds accept_decision / accept_commit / delivery / delivery_ack / history_pruned:
    the periodic sweep prunes a message and a later duplicate answers 200 with history_available false; every trace
    line validates against spec/schemas/trace and names broker_accept.yaml rows."""
    trace_dir = tmp_path / "trace"
    with running_broker(store_url, list(cast.values()), trace_dir=trace_dir, trace_node="b1", trace_strict=True,
                        sweep_interval_s=0.2, message_retention_days=0.8 / 86_400) as broker:
        with joined(broker.url, cast["alice"]) as alice, joined(broker.url, cast["bob"]) as bob:
            alice.send(send_frame("c1", "soon pruned"))
            alice.expect("ack", client_message_id="c1")
            push = bob.expect("push", client_message_id="c1")
            bob.send({"type": "client_ack", "clientMessageId": "c1", "brokerMessageId": push["messageId"],
                      "delivery_id": push["delivery_id"]})
            alice.send(send_frame("c1", "another"))
            alice.expect("ack", client_message_id="c1")
            alice.send(send_frame("c2", ref="nosuch"))
            alice.expect("ack", client_message_id="c2")
            deadline = time.monotonic() + 10
            while broker.store.counts()["topic_message"] and time.monotonic() < deadline:
                time.sleep(0.1)
            alice.send(send_frame("c1", "soon pruned"))
            late = valid(alice.expect("ack", client_message_id="c1"))
        assert broker.store.orphan_check() == []
    assert (late["status"], late["history_available"], late["broker_message_id"]) == (
        200, False, push["messageId"])
    events = [json.loads(line) for line in (trace_dir / "broker-b1.jsonl").read_text().splitlines()]
    for event in events:
        schema_check(event)
    kinds = [event["kind"] for event in events]
    for kind in ("accept_decision", "accept_commit", "delivery", "delivery_ack", "history_pruned"):
        assert kind in kinds, kinds
    rows = [event["table_row"] for event in events if event["kind"] == "accept_decision"]
    assert rows == ["BRK-ACCEPT", "BRK-DUP-MISMATCH", "BRK-B2-REJECT", "BRK-DUP-MATCH"]
    commit = next(event for event in events if event["kind"] == "accept_commit")
    assert (commit["effects"], commit["recipients"]) == ({"dedupe": 1, "message": 1, "history": 1, "delivery": 2}, 2)
    assert [event["seq"] for event in events] == sorted({event["seq"] for event in events})


# --- the commands -----------------------------------------------------------------------------------------------------

def test_admin_commands_orphan_check_and_retention_sweep(tmp_path, cast):
    """BRK-ORPHAN-CHECK, BRK-DEDUPE-EXPIRY, BRK-HISTORY-AVAILABLE: `meshd broker add-mesh / add-member` admit a
    member; `orphan-check` exits 0 on a clean store and 1 naming each violation; `retention-sweep` prunes (flipping
    history_available, traced) and, past the dedupe window, expires the dedupe rows."""
    url = f"sqlite:///{tmp_path / 'b.db'}"
    alice, bob = cast["alice"], cast["bob"]
    assert cli("broker", "add-mesh", "--store", url, MESH, "--retention-days", "3")[0] == 0
    for member in (alice, bob):
        assert cli("broker", "add-member", "--store", url, "--mesh", MESH, "--pubkey", member.pubkey,
                   "--display-name", member.name, "--topic", "general")[0] == 0
    with running_broker(url) as broker, joined(broker.url, alice) as client:
        for cmid in ("c1", "c2"):
            client.send(send_frame(cmid, f"body {cmid}"))
            assert client.expect("ack", client_message_id=cmid)["status"] == 201
    clean = meshd("broker", "orphan-check", "--store", url)  # the real entry point, once
    assert (clean.returncode, clean.stdout) == (0, "")
    now = int(time.time() * 1000)
    swept = cli("broker", "retention-sweep", "--store", url, "--message-retention-days", "1", "--now-ms",
                str(now + 2 * 86_400_000), "--trace-dir", str(tmp_path / "trace"))
    assert json.loads(swept[1]) == {"pruned": 2, "history_flipped": 2, "expired": 0}
    pruned = [json.loads(line) for line in (tmp_path / "trace" / "broker-broker.jsonl").read_text().splitlines()]
    assert sorted(event["client_message_id"] for event in pruned) == ["c1", "c2"]
    assert cli("broker", "orphan-check", "--store", url)[0] == 0
    expired = cli("broker", "retention-sweep", "--store", url, "--now-ms", str(now + 4 * 86_400_000))
    assert json.loads(expired[1])["expired"] == 2
    store = open_store(url)
    try:
        assert store.counts()["client_message_dedupe"] == 0
        store.add_mesh("other", "other", "permanent", None)
    finally:
        store.close()
    import sqlite3

    conn = sqlite3.connect(tmp_path / "b.db")
    conn.execute("INSERT INTO message_history (id, broker_message_id, mesh_id, destination_kind, destination_ref, "
                 "sender_pubkey, recipient_count, created_at) VALUES ('h-x', 'm-x', 'other', 'topic', 't', 'p', 0, 0)")
    conn.commit()
    conn.close()
    code, printed = cli("broker", "orphan-check", "--store", url)
    assert code == 1
    assert "history_without_message" in printed and "m-x" in printed


# --- end to end with reference daemons -------------------------------------------------------------------------------

@pytest.fixture
def daemons(tmp_path):
    """Start reference daemons against a broker URL; each gets its own state dir and is stopped at teardown."""
    started: list[Launched] = []

    def make(name: str, broker_url: str, start: bool = True, config: str = FAST_DAEMON) -> Launched:
        state_dir = tmp_path / name
        state_dir.mkdir(mode=0o700, exist_ok=True)
        (state_dir / "config.toml").write_text(config)
        daemon = Launched(REFERENCE_TEMPLATE, state_dir, broker_url)
        started.append(daemon)
        if start:
            daemon.start(wait=False)  # callers wait_connected(): several daemons start side by side
        return daemon

    yield make
    stop_all(started)


def stop_all(daemons: list[Launched]) -> None:
    """SIGTERM every daemon at once and wait for all of them."""
    stoppers = [threading.Thread(target=daemon.stop, kwargs={"timeout": 10}) for daemon in daemons]
    for stopper in stoppers:
        stopper.start()
    for stopper in stoppers:
        stopper.join()


def _inbox(daemon: Launched) -> list[dict]:
    with daemon.unix() as client:
        return client.get("/v1/inbox", params={"limit": 1000}).json()["items"]


def _outbox_row(daemon: Launched, cmid: str) -> dict | None:
    with daemon.unix() as client:
        items = client.get("/v1/outbox", params={"limit": 500}).json()["items"]
    return next((row for row in items if row["client_message_id"] == cmid), None)


def _wait(predicate, timeout: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_daemons_exchange_a_topic_message_exactly_once_through_a_dev_broker(store_url, daemons, tmp_path):
    """End to end (--dev): daemon A sends to #general; daemon B has it in /v1/inbox exactly once and its client_ack
    marks the delivery acked; A's retry of the same Idempotency-Key collapses (200 duplicate, one message); the
    broker's orphan check is clean. BRK-DELIVERY-COMMITTED, INB-DEDUPE, WS-ACK-STATUS."""
    with running_broker(store_url, dev=True, lease_s=1.0) as broker:
        a = daemons("a", broker.url)
        b = daemons("b", broker.url)
        for daemon in (a, b):
            daemon.wait_ready()
            daemon.wait_connected()
        with a.unix() as client:
            first = client.post("/v1/send", json={"to": "#general", "message": "hello b"},
                                headers={"Idempotency-Key": "e2e-1"})
            assert first.status_code == 202, first.text
        done = _wait(lambda: (row := _outbox_row(a, "e2e-1")) and row["status"] == "done" and row, what="done")
        received = _wait(lambda: [m for m in _inbox(b) if m["client_message_id"] == "e2e-1"], what="inbox")
        with a.unix() as client:
            retry = client.post("/v1/send", json={"to": "#general", "message": "hello b"},
                                headers={"Idempotency-Key": "e2e-1"})
        _wait(lambda: broker.store.pending_deliveries(b_pubkey(b), int(time.time() * 1000) + 10_000, 1) == []
              and broker.store.counts()["delivery_queue"] == 1, what="the delivery acked")
        time.sleep(1.5)  # past the lease: an acked delivery is not pushed again
        assert [m["body"] for m in _inbox(b)] == ["hello b"]
        assert _inbox(a) == []
        tally, orphans = broker.store.counts(), broker.store.orphan_check()
        stop_all([a, b])  # while the broker is up: nothing to drain
    assert (retry.status_code, retry.json()["duplicate"], retry.json()["broker_message_id"]) == (
        200, True, done["broker_message_id"])
    assert received[0]["broker_message_id"] == done["broker_message_id"]
    assert (tally["topic_message"], tally["client_message_dedupe"], tally["delivery_queue"]) == (1, 1, 1)
    assert orphans == []


def b_pubkey(daemon: Launched) -> str:
    return json.loads((daemon.state_dir / "keypair.json").read_text())["ed25519_pubkey"]


def test_non_dev_broker_b2_rejection_kills_the_row_and_outsiders_are_refused(tmp_path, daemons, caplog):
    """BRK-B2-ROLLBACK, BRK-HELLO-AUTH, OBX-BROKER-OUTCOMES: without --dev, a send to an unknown topic is a broker
    404, so the daemon's row goes dead and the broker keeps no dedupe row; a daemon whose key is not a member is
    refused with 4001 and never connects; orphan-check is clean."""
    caplog.set_level(logging.INFO, logger="meshbroker")
    url = f"sqlite:///{tmp_path / 'b.db'}"
    member_dir = tmp_path / "member"
    member_dir.mkdir(mode=0o700)
    keypair, _ = load_or_mint_keypair(member_dir)
    store = open_store(url)
    store.migrate()
    store.add_mesh("default", "default", "retention_scoped", 7)
    store.add_member("default", keypair.public_hex, "member")
    store.create_topic("default", "general")
    store.close()
    with running_broker(url) as broker:
        member = daemons("member", broker.url)
        outsider = daemons("outsider", broker.url)
        member.wait_ready()
        member.wait_connected()
        with member.unix() as client:
            assert client.post("/v1/send", json={"to": "#nosuch", "message": "x"},
                               headers={"Idempotency-Key": "dead-1"}).status_code == 202
        dead = _wait(lambda: (row := _outbox_row(member, "dead-1")) and row["status"] == "dead" and row,
                     what="dead")
        assert "404 destination_not_found" in dead["last_error"]
        assert broker.store.counts()["client_message_dedupe"] == 0
        outsider.wait_ready()
        refused = f"4001 unauthorized ({b_pubkey(outsider)[:16]}… is not a member of mesh 'default')"
        _wait(lambda: any(refused in record.getMessage() for record in caplog.records), what="the 4001 refusal")
        with outsider.unix() as client:
            assert client.get("/v1/health").json()["connected"] is False
        with Client(broker.url) as raw:  # the same hello from a test client: the code itself
            raw.send(Member("outsider").hello("default"))
            assert raw.closed() == (4001, "unauthorized")
        stop_all([member, outsider])
    assert cli("broker", "orphan-check", "--store", url)[0] == 0


def test_invalid_advertised_dedupe_retention_makes_the_daemon_exit_10(tmp_path, daemons):
    """NEG-CLOSE-4010, NEG-PARAM-VALIDATION, BRK-ADVERTISE (the --advertise seam): a broker started with
    `--advertise` offering dedupe_retention_days 1 makes the reference daemon close with 4010 and exit 10."""
    advertise = tmp_path / "advertise.json"
    advertise.write_text(json.dumps({
        "client_message_id_dedupe": {"params": {"version": 1, "mode": "retention_scoped",
                                                "dedupe_retention_days": 1, "request_fingerprint": True}},
        "concurrent_connection_policy": {"params": {"version": 1}},
    }))
    broker = BrokerProcess(f"sqlite:///{tmp_path / 'b.db'}", tmp_path / "broker",
                           ["--dev", "--advertise", str(advertise)]).start()
    try:
        daemon = daemons("d", broker.url, start=False)
        daemon.start(wait=False)
        try:
            code = daemon.wait_exit(timeout=30)
        except Exception as exc:  # pragma: no cover - diagnostics
            raise AssertionError(daemon.tail()) from exc
        assert code == exit_code("feature_negotiation_failed"), daemon.tail()
        _wait(lambda: f"code={CLOSE['feature_unavailable']}" in broker.tail(200), timeout=10,
              what="the broker to log the 4010 close")
    finally:
        assert broker.stop() == exit_code("ok")


def test_sandbox_runs_a_dev_broker_and_a_joined_daemon(tmp_path):
    """`meshd sandbox`: a --dev broker on SQLite and a daemon joined to it; a send reaches the broker; both stop
    cleanly."""
    from reference.sandbox import Sandbox

    (tmp_path / "sb").mkdir(mode=0o755)  # an existing directory is made private too (E-44)
    os.chmod(tmp_path / "sb", 0o755)
    sandbox = Sandbox(tmp_path / "sb").start()
    try:
        assert "socket" in sandbox.summary() and sandbox.tcp_port()
        assert_private_files(tmp_path / "sb")
        transport = httpx.HTTPTransport(uds=str(sandbox.socket_path))
        with httpx.Client(transport=transport, base_url="http://localhost", timeout=10) as client:
            sent = client.post("/v1/send", json={"to": "#general", "message": "sandboxed"})
            assert sent.status_code == 202
            cmid = sent.json()["client_message_id"]
            _wait(lambda: any(row["status"] == "done" and row["client_message_id"] == cmid
                              for row in client.get("/v1/outbox").json()["items"]), what="done")
    finally:
        codes = sandbox.stop()
    assert codes == {"daemon": 0, "broker": 0}
    assert Path(tmp_path / "sb" / "broker.db").exists()
    assert_private_files(tmp_path / "sb")


def assert_private_files(directory: Path) -> None:
    """LIFE-PRIVATE-FILES (E-44): the sandbox directory is 0700 and broker.db (every message body), its WAL files and
    the logs are 0600."""
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    files = [path for path in directory.iterdir() if path.is_file() and path.name != "broker.port"]
    assert {"broker.db", "broker.log", "daemon.log"} <= {path.name for path in files}
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, (path.name, oct(path.stat().st_mode))
