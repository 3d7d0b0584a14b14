"""A store error inside the broker link is a link loss, never the end of the link thread.

The fault (SQLite failing a batch of acks, as on a disk I/O error) cannot be produced on demand for real, so the
outbox's ``transition_many`` is wrapped to raise once; everything else is real: the daemon runtime in-process (its
Falcon app through falcon.testing, as over the unix socket), its SQLite stores, and the harness's scripted broker.
"""

from __future__ import annotations

import itertools
import sqlite3
import time
from pathlib import Path

import falcon.testing

from conformance.peer import ScriptedBroker
from reference.daemon.config import load
from reference.daemon.runtime import Runtime, preflight


def wait_until(predicate, what: str, timeout: float = 30.0, detail=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}: {detail()}")


def test_a_failed_ack_batch_reconnects_and_every_row_still_reaches_done(tmp_path: Path):
    state = tmp_path / "daemon"
    with ScriptedBroker() as broker:
        config = load(None, {"broker": {"url": broker.url}, "outbox": {"retry_base_ms": 50, "retry_max_ms": 200},
                             "ipc": {"tcp_enabled": False}})
        preflight(state, config)
        runtime = Runtime(state, config)
        failures = []
        original = runtime.outbox.transition_many

        def failing_once(changes, *, by):
            if not failures and any(event.name.startswith("ack_") for _, event in changes):
                failures.append(len(changes))
                raise sqlite3.OperationalError("disk I/O error")
            return original(changes, by=by)

        runtime.outbox.transition_many = failing_once
        runtime.start()
        try:
            client = falcon.testing.TestClient(runtime.app)
            unix = {"meshd.transport": "unix"}
            wait_until(lambda: client.simulate_get("/v1/health", extras=unix).json["connected"], "the link")
            for i in range(5):
                answer = client.simulate_post("/v1/send", json={"to": "#general", "message": f"m{i}"},
                                              headers={"Idempotency-Key": f"store-err-{i}"}, extras=unix)
                assert answer.status_code == 202, answer.text
            wait_until(lambda: {r["status"] for r in client.simulate_get("/v1/outbox", extras=unix).json["items"]}
                       == {"done"}, "every row done",
                       detail=lambda: client.simulate_get("/v1/outbox", extras=unix).json["items"])
            assert failures, "the fault was injected"
            assert runtime.link.is_alive(), "the link thread survived the store error"
            assert runtime.link.state.reconnects >= 1
        finally:
            runtime.close()


def test_sends_while_the_broker_is_away_do_not_spend_the_reconnect_backoff(tmp_path: Path):
    """Reconnects follow the backoff schedule whatever the IPC side does: 30 sends in the first second of an outage
    make no extra connection attempts. (A wake() per accept once cut the wait short, so the attempts went out 2 ms
    apart and the next delay reached the 30 s cap: a daemon stayed away for half a minute after a one-second broker
    restart.) The broker is a port nobody listens on; ``_connect`` is counted, not replaced."""
    from conformance.launch import free_port

    state = tmp_path / "daemon"
    config = load(None, {"broker": {"url": f"ws://127.0.0.1:{free_port()}"}, "ipc": {"tcp_enabled": False},
                         "reconnect": {"initial_ms": 1000, "max_ms": 30000, "jitter": 0.0}})
    preflight(state, config)
    runtime = Runtime(state, config)
    attempts = []
    original = runtime.link._connect

    def counted():
        attempts.append(time.monotonic())
        return original()

    runtime.link._connect = counted
    runtime.start()
    try:
        client = falcon.testing.TestClient(runtime.app)
        unix = {"meshd.transport": "unix"}
        wait_until(lambda: attempts, "the first connection attempt")
        for i in range(30):
            answer = client.simulate_post("/v1/send", json={"to": "#general", "message": f"m{i}"},
                                          headers={"Idempotency-Key": f"away-{i}"}, extras=unix)
            assert answer.status_code == 202, answer.text
            time.sleep(0.02)
        # The sends take about 0.6 s, longer on a loaded machine, so they may overlap later backoff steps: the
        # property is the spacing of every attempt made while and after they ran, not a count at a fixed time.
        sent = time.monotonic()
        wait_until(lambda: len(attempts) >= 2 and attempts[-1] > sent, "an attempt after the last send", timeout=10)
        gaps = [later - earlier for earlier, later in itertools.pairwise(list(attempts))]
        schedule = [1.0 * 2 ** n for n in range(len(gaps))]  # initial 1000 ms, multiplier 2, no jitter
        assert all(gap >= 0.9 * due for gap, due in zip(gaps, schedule, strict=True)), (gaps, schedule)
        assert gaps[0] <= 2.5, gaps  # the first delay is the initial one, not a step further up the schedule
    finally:
        runtime.close()
