"""One clock: every timestamp the daemon writes comes from the clock it was given (reference/clock.py).

The end-to-end test runs a real daemon whose clock hook (``daemon.clock_file``) puts it 10^9 s (about 31.7 years)
ahead of the wall clock: a timestamp taken from ``time`` instead of the injected clock is off by exactly that.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import time
from datetime import datetime
from pathlib import Path

import falcon.testing

from conformance.peer import ScriptedBroker
from reference.clock import now_rfc3339, rfc3339_ms, wall_ms
from reference.core import OutboxPolicy
from reference.daemon.cli import cmd_inbox_quarantine
from reference.daemon.config import load
from reference.daemon.runtime import Runtime, preflight
from reference.daemon.store import InboxStore, OutboxStore, migrations
from reference.state_dir import StateDir, quarantine_path

OFFSET_S = 1_000_000_000
T0 = 1_700_000_000_000
UNIX = {"meshd.transport": "unix"}


def test_rfc3339_ms_is_utc_with_milliseconds_and_z():
    assert rfc3339_ms(0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339_ms(T0 + 123) == "2023-11-14T22:13:20.123Z"
    assert rfc3339_ms(T0 + 999) == "2023-11-14T22:13:20.999Z"
    assert now_rfc3339(lambda: 1_700_000_000.5) == "2023-11-14T22:13:20.500Z"
    before = time.time_ns() // 1_000_000
    assert before <= wall_ms() <= time.time_ns() // 1_000_000


def test_the_stores_stamp_with_their_clock(tmp_path):
    with OutboxStore(tmp_path / "outbox.db", OutboxPolicy(), clock=lambda: T0) as outbox:
        assert outbox.schema_version == 2
    with sqlite3.connect(tmp_path / "outbox.db") as conn:
        assert {at for (at,) in conn.execute("SELECT applied_at FROM schema_version")} == {T0}
    with InboxStore(tmp_path / "inbox.db", clock=lambda: T0 + 7) as inbox:
        event_id = inbox.append_event("peer_join", {"pubkey": "ab" * 32})
        assert [(e.id, e.created_at) for e in inbox.events_after(0)] == [(event_id, T0 + 7)]
    broken = tmp_path / "broken" / "inbox.db"
    broken.parent.mkdir()
    broken.write_bytes(b"not a database" * 100)
    fresh, quarantined = InboxStore.open_or_quarantine(broken, clock=lambda: T0 + 9)
    fresh.close()
    assert quarantined == quarantine_path(broken, T0 + 9) == broken.with_name(f"inbox.db.corrupt-{T0 + 9}")


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def test_an_injected_clock_drives_every_timestamp_the_daemon_writes(tmp_path: Path):
    clock_file = tmp_path / "clock"
    clock_file.write_text(f"{OFFSET_S}\n", encoding="ascii")
    state = tmp_path / "daemon"
    files = StateDir(state)
    start = (time.time() + OFFSET_S) * 1000
    with ScriptedBroker() as broker:
        config = load(None, {"broker": {"url": broker.url}, "ipc": {"tcp_enabled": False},
                             "daemon": {"clock_file": str(clock_file)}})
        preflight(state, config)
        runtime = Runtime(state, config)
        runtime.start()
        try:
            client = falcon.testing.TestClient(runtime.app)
            deadline = time.monotonic() + 30
            while not client.simulate_get("/v1/health", extras=UNIX).json["connected"]:
                assert time.monotonic() < deadline, "the link did not come up"
                time.sleep(0.05)
            sent = client.simulate_post("/v1/send", json={"to": "#general", "message": "m"},
                                        headers={"Idempotency-Key": "clock-1"}, extras=UNIX)
            assert sent.status_code == 202, sent.text
            broker.push(body="inbound", client_message_id="clock-in-1")
            broker.push_system("peer_joined", {"pubkey": "cd" * 32})
            broker.wait_for(lambda: len(runtime.inbox.events_after(0)) >= 2, what="the message and peer_join events")
            health = client.simulate_get("/v1/health", extras=UNIX).json
            row = runtime.outbox.get_by_client_message_id("clock-1")
            max_age_ms = runtime.outbox.policy.max_age_hours * 3_600_000
            (message,), _ = runtime.inbox.page()
            events = {event.name: event for event in runtime.inbox.events_after(0)}
            runtime.inbox.prune_events(keep_last_n=0)
            stream = runtime.bus.open_stream(0)
            assert next(stream) == b": connected\n\n"
            gap = json.loads(next(stream).decode().split("data: ", 1)[1])
            stream.close()
        finally:
            runtime.close()
    end = (time.time() + OFFSET_S) * 1000
    stamps = {
        "outbox enqueued_at": row.enqueued_at,
        "outbox max_age_at - max age": row.max_age_at - max_age_ms,
        "inbox received_at": message.received_at,
        "message event created_at": events["message"].created_at,
        "message event received_at": _ms(events["message"].payload["received_at"]),
        "peer_join event ts": _ms(events["peer_join"].payload["ts"]),
        "replay_gap ts": _ms(gap["ts"]),
        "host_fingerprint written_at": _ms(json.loads(files.host_fingerprint.read_text())["written_at"]),
    }
    for path in (files.outbox_db, files.inbox_db):
        with sqlite3.connect(path) as conn:
            stamps[f"{path.name} migrations applied_at"] = conn.execute("SELECT min(applied_at) FROM schema_version"
                                                                        ).fetchone()[0]
    assert {name: start - 1_000 <= at <= end + 1_000 for name, at in stamps.items()} == dict.fromkeys(stamps, True)
    assert 0 <= health["uptime_s"] < 120  # started_at and now come from the same clock


def test_meshd_inbox_quarantine_opens_the_inbox_with_the_daemons_clock(tmp_path: Path, capsys):
    """A migration the CLI applies to an inbox the daemon left at an older schema is stamped by the daemon's clock
    (its [daemon] clock_file), as the daemon would stamp it."""
    files = StateDir(tmp_path)
    clock_file = tmp_path / "clock"
    clock_file.write_text(f"{OFFSET_S}\n", encoding="ascii")
    files.config.write_text(f'[daemon]\nclock_file = "{clock_file}"\n', encoding="utf-8")
    first = migrations("inbox")[0]
    with sqlite3.connect(files.inbox_db) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
                     " applied_at INTEGER NOT NULL)")
        conn.executescript(first.sql)
        conn.execute("INSERT INTO schema_version VALUES (?, ?, ?)", (first.version, first.name, T0))
    before = wall_ms()
    args = argparse.Namespace(state_dir=tmp_path, mesh="default", limit=10, frames=False, json=True)
    assert cmd_inbox_quarantine(args) == 0
    assert json.loads(capsys.readouterr().out) == []
    with sqlite3.connect(files.inbox_db) as conn:
        applied = dict(conn.execute("SELECT version, applied_at FROM schema_version").fetchall())
    assert set(applied) == {m.version for m in migrations("inbox")}
    assert all(before + OFFSET_S * 1000 <= at <= wall_ms() + OFFSET_S * 1000
               for version, at in applied.items() if version > first.version)
