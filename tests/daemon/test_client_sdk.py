"""The Python SDK (reference.client, §11) against real daemons linked to a scripted broker: discovery over the socket
and over TCP, a send and its retry under one key, a typed conflict, inbox paging to the end, and an event stream
resumed across a daemon restart without loss or repeats."""

from __future__ import annotations

import os
import re
import threading
import time

import pytest

from reference.client import Conflict, DaemonNotFound, Event, MeshError, discover, new_client_message_id

SENDER = "cd" * 32


def test_discover_finds_the_daemon_on_its_socket_and_checks_the_mesh(daemon):
    client = discover(daemon.state_dir)
    assert client.endpoint.socket_path == str(daemon.state_dir / "daemon.sock")
    health = client.health()
    assert health.ok is True and client.version().ipc_api == "v1"
    assert discover(daemon.state_dir, mesh=health.mesh).endpoint.socket_path is not None
    with pytest.raises(DaemonNotFound, match="serves another mesh"):
        discover(daemon.state_dir, mesh="not-" + health.mesh)


def test_discover_falls_back_to_tcp_with_the_token_file(daemon, tmp_path):
    os.rename(daemon.state_dir / "daemon.sock", daemon.state_dir / "daemon.sock.away")
    try:
        client = discover(daemon.state_dir)
        assert client.endpoint.socket_path is None and client.endpoint.port == daemon.tcp_port
        assert client.health().ok is True
    finally:
        os.rename(daemon.state_dir / "daemon.sock.away", daemon.state_dir / "daemon.sock")
    with pytest.raises(DaemonNotFound, match="no socket"):
        discover(tmp_path)


def test_a_send_and_its_retry_under_the_same_key_send_once_and_a_changed_body_is_a_typed_conflict(broker, daemon):
    client = discover(daemon.state_dir)
    key = new_client_message_id()
    first = client.send("#alerts", "disk full", client_message_id=key)
    assert (first.client_message_id, first.status, first.duplicate) == (key, "queued", False)
    broker.wait_for(lambda: broker.sends_of(key), 20, "the send")
    again = client.send("#alerts", "disk full", client_message_id=key)
    assert again.client_message_id == key and again.request_fingerprint == first.request_fingerprint
    with pytest.raises(Conflict) as refused:
        client.send("#alerts", "disk FULL", client_message_id=key)
    assert refused.value.status == 409 and refused.value.client_message_id == key
    assert refused.value.conflict and refused.value.code == "idempotency_key_reused"
    time.sleep(0.5)
    assert len({s.frame.get("client_message_id", s.frame.get("clientMessageId")) for s in broker.sends_of(key)}) == 1
    with pytest.raises(MeshError) as bad:
        client.send("@group", "x")
    assert bad.value.status == 400 and bad.value.code == "destination_unresolvable"


def test_inbox_pages_run_to_the_end_and_resume_from_the_last_cursor(broker, daemon):
    client = discover(daemon.state_dir)
    for n in range(5):
        broker.push(body=f"m{n}", sender=SENDER, client_message_id=f"in-{n}")
    deadline = time.monotonic() + 20
    while len(client.inbox(limit=10).items) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    pages = list(client.inbox_pages(limit=2))
    assert [len(p.items) for p in pages] == [2, 2, 1]
    assert [i.body for p in pages for i in p.items] == [f"m{n}" for n in range(5)]
    broker.push(body="m5", sender=SENDER, client_message_id="in-5")
    deadline = time.monotonic() + 20
    later: list = []
    while not later and time.monotonic() < deadline:
        later = [i.body for p in client.inbox_pages(cursor=pages[-1].next_cursor) for i in p.items]
    assert later == ["m5"]


def test_the_event_stream_resumes_across_a_daemon_restart_without_loss_or_repeats(broker, daemon):
    client = discover(daemon.state_dir)
    seen: list[Event] = []
    stop = threading.Event()

    def consume():
        for event in client.events(reconnect_s=60):
            if event.event == "message":
                seen.append(event)
            if stop.is_set() or len(seen) >= 10:
                return

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    time.sleep(0.5)
    for n in range(5):
        broker.push(body=f"a{n}", sender=SENDER, client_message_id=f"ev-a{n}")
    deadline = time.monotonic() + 20
    while len(seen) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(seen) == 5
    daemon.kill9()  # the stream drops mid-connection; the client reconnects to the next daemon
    daemon.start()
    daemon.wait_connected()
    for n in range(5):
        broker.push(body=f"b{n}", sender=SENDER, client_message_id=f"ev-b{n}")
    reader.join(30)
    stop.set()
    assert not reader.is_alive()
    ids = [event.id for event in seen]
    assert len(ids) == len(set(ids)) == 10 and ids == sorted(ids)
    assert [event.data["body"] for event in seen] == [f"a{n}" for n in range(5)] + [f"b{n}" for n in range(5)]


def test_the_readme_example_runs_against_a_daemon(broker, daemon):
    import subprocess
    import sys
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    code = readme.split("<!-- example: sdk -->\n```python\n", 1)[1].split("```", 1)[0]
    broker.push(body="hello", sender=SENDER, client_message_id="readme-1")
    client = discover(daemon.state_dir)
    deadline = time.monotonic() + 20
    while not client.inbox().items and time.monotonic() < deadline:
        time.sleep(0.05)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MESHD_STATE_DIR": str(daemon.state_dir)})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["True", "queued alert-db-2-disk"]
    # the row the second send meets depends on how far the first has gone: queued, in flight or delivered
    assert re.fullmatch(r"refused: outbox_(pending|inflight|done)_fingerprint_mismatch", lines[2]), lines[2]
    assert lines[-1] == f"{SENDER[:12]} None hello"
