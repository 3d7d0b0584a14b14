"""A member that stops reading stalls nobody else and is closed 1013 slow_consumer (E-33), through real sockets with
the broker in this process.

Deadlines below are "within N seconds", generous for a loaded 2-core machine; nothing asserts on speed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from broker_server_testkit import Member, joined, running_broker, send_frame
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from reference.broker._presence import SLOW_CONSUMER
from spec import load_table

BIG = "x" * 60_000  # under --inline-bytes 65536: each push fills the slow member's buffers fast
OUTBOUND = 2**20


@contextlib.contextmanager
def stalled_member(url: str, member: Member) -> Iterator[ClientConnection]:
    """A connection as ``member`` that completes hello and negotiation and then reads nothing: a tiny receive buffer
    and a one-frame receive queue, so the broker's writes back up at once."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
    with connect(url, sock=sock, open_timeout=10, close_timeout=1, compression=None, max_size=2**24,
                 max_queue=1) as ws:
        ws.send(json.dumps(member.hello()))
        assert json.loads(ws.recv(timeout=10))["type"] == "hello_ack"
        ws.send(json.dumps({"type": "feature_negotiation_request",
                            "require": ["client_message_id_dedupe", "concurrent_connection_policy"], "optional": []}))
        assert json.loads(ws.recv(timeout=10))["type"] == "feature_negotiation_response"
        yield ws


def slow_consumer_logged(caplog: pytest.LogCaptureFixture) -> bool:
    return any("slow consumer" in record.getMessage() for record in caplog.records)


def exchange(one, two, sender: Member, recipient: Member, cmid: str, timeout: float = 15.0) -> None:
    """``sender`` DMs ``recipient``: the 201 ack and the push arrive within ``timeout``; the push is acknowledged."""
    one.send(send_frame(cmid, body=cmid, ref=recipient.pubkey, kind="dm"))
    assert one.expect("ack", timeout=timeout, client_message_id=cmid)["status"] == 201
    push = two.expect("push", timeout=timeout, client_message_id=cmid)
    two.send({"type": "client_ack", "delivery_id": push["delivery_id"], "brokerMessageId": push["messageId"],
              "clientMessageId": cmid})


def test_a_member_that_stops_reading_stalls_nobody_and_is_closed_1013(tmp_path, caplog):
    """(E-33) While one member reads nothing, another floods it with pushes and it keeps sending (so acks to it are
    due from the accept writer): two other members keep exchanging messages with prompt acks, a new member can
    connect, and the stalled member is closed with 1013 slow_consumer once it has OUTBOUND bytes unread."""
    slow, flooder, alice, bob, late = (Member(name) for name in ("slow", "flooder", "alice", "bob", "late"))
    caplog.set_level(logging.INFO, logger="meshbroker")
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(running_broker(f"sqlite:///{tmp_path / 'b.db'}", [slow, flooder, alice, bob, late],
                                                    inline_bytes=65_536, max_outbound_bytes=OUTBOUND))
        stalled = stack.enter_context(stalled_member(broker.url, slow))
        done = threading.Event()
        flood_errors: list[BaseException] = []

        def flood() -> None:
            """Big DMs to the stalled member (acks read), and small sends from it (acks never read)."""
            try:
                with joined(broker.url, flooder) as client:
                    deadline = time.monotonic() + 60
                    for n in range(400):
                        if done.is_set() or time.monotonic() > deadline:
                            return
                        client.send(send_frame(f"big-{n}", body=BIG, ref=slow.pubkey, kind="dm"))
                        client.expect("ack", timeout=30, client_message_id=f"big-{n}")
                        for m in range(8):
                            stalled.send(json.dumps(send_frame(f"own-{n}-{m}", ref=late.pubkey, kind="dm")))
            except ConnectionClosed:
                pass  # the stalled member's own sends end once the broker closed it
            except BaseException as exc:
                flood_errors.append(exc)

        close_seen: list[tuple[int, str] | None] = []

        def read_once_given_up() -> None:
            """Reads again as soon as the broker logged its decision: what was written, then the close frame."""
            deadline = time.monotonic() + 90
            while not slow_consumer_logged(caplog) and time.monotonic() < deadline:
                time.sleep(0.02)
            try:
                for _ in range(10_000):
                    stalled.recv(timeout=15)
            except ConnectionClosed as exc:
                close_seen.append((exc.rcvd.code, exc.rcvd.reason) if exc.rcvd else None)
            except TimeoutError:
                pass

        flooder_thread = threading.Thread(target=flood, daemon=True)
        reader_thread = threading.Thread(target=read_once_given_up, daemon=True)
        flooder_thread.start()
        reader_thread.start()
        try:
            with joined(broker.url, alice) as a, joined(broker.url, bob) as b:
                rounds = 0
                deadline = time.monotonic() + 60
                while (not slow_consumer_logged(caplog) or rounds < 10) and time.monotonic() < deadline:
                    exchange(a, b, alice, bob, f"ab-{rounds}")
                    exchange(b, a, bob, alice, f"ba-{rounds}")
                    rounds += 1
                assert slow_consumer_logged(caplog), "the stalled member was never closed as a slow consumer"
                with joined(broker.url, late) as newcomer:
                    newcomer.send({"type": "list_peers", "requestId": "r1"})
                    newcomer.expect("peers_list", timeout=15, requestId="r1")
            reader_thread.join(timeout=60)
            # What was written before arrives, then the close frame (CLOSE_GRACE_S lets it pass the write in flight).
            assert close_seen == [(1013, "slow_consumer")]
        finally:
            done.set()
            flooder_thread.join(timeout=60)
        assert not flood_errors, flood_errors


def test_a_member_that_never_reads_again_is_disconnected(tmp_path):
    """(E-33) A close frame cannot pass a write the peer never reads: the broker aborts the connection instead, within
    a bounded time, and the other members are told peer_left."""
    slow, flooder, watcher = Member("slow"), Member("flooder"), Member("watcher")
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(running_broker(f"sqlite:///{tmp_path / 'b.db'}", [slow, flooder, watcher],
                                                    inline_bytes=65_536, max_outbound_bytes=OUTBOUND))
        watching = stack.enter_context(joined(broker.url, watcher))
        stack.enter_context(stalled_member(broker.url, slow))
        watching.expect("push", timeout=15, event="peer_joined")
        client = stack.enter_context(joined(broker.url, flooder))
        left = False
        deadline = time.monotonic() + 60
        for n in range(400):
            client.send(send_frame(f"big-{n}", body=BIG, ref=slow.pubkey, kind="dm"))
            client.expect("ack", timeout=30, client_message_id=f"big-{n}")
            left = not watching.quiet("push", 0.01, event="peer_left")
            if left or time.monotonic() > deadline:
                break
        if not left:  # the last pushes overflowed it; the abort follows within CLOSE_GRACE_S
            watching.expect("push", timeout=30, event="peer_left")


def test_connect_disconnect_cycles_leave_no_sender_threads(tmp_path):
    """Each session's sender thread ends with its connection: many cycles do not grow the thread count."""
    member = Member("cycler")
    with running_broker(f"sqlite:///{tmp_path / 'b.db'}", [member]) as broker:
        with joined(broker.url, member) as warm:  # the broker's own threads and pools are up
            warm.send({"type": "list_peers", "requestId": "w"})
            warm.expect("peers_list", requestId="w")
        baseline = threading.active_count()
        for n in range(60):
            with joined(broker.url, member) as client:
                client.send({"type": "list_peers", "requestId": f"r{n}"})  # the answer goes through the sender
                client.expect("peers_list", requestId=f"r{n}")
        deadline = time.monotonic() + 20
        while threading.active_count() > baseline + 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert threading.active_count() <= baseline + 4, [t.name for t in threading.enumerate()]


def test_a_1013_close_carries_a_reason_the_table_lists():
    """E-33 and E-43 close 1013 with the reasons close_codes.yaml lists for it."""
    entry = next(e for e in load_table("close_codes")["codes"] if e["name"] == "try_again_later")
    assert (entry["code"], "slow_consumer") == SLOW_CONSUMER
    assert set(entry["reasons"]) == {"slow_consumer", "try_again_later"}
