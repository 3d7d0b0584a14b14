"""runtime.Components, the seam the daemon is built through: every part it names is the one the daemon uses.

Each field is replaced by a subclass or wrapper that records its use and otherwise behaves as the reference's own;
``preflight`` and ``Runtime`` then build and run a real daemon against the harness's scripted broker, and every
replacement must have been used -- none of them by replacing a module attribute.
"""

from __future__ import annotations

import time
from dataclasses import fields, replace
from pathlib import Path

import falcon.testing

from conformance.peer import ScriptedBroker
from reference.core import parse_send
from reference.daemon import identity, ports
from reference.daemon.app import create_app
from reference.daemon.committer import GroupCommitter
from reference.daemon.config import load
from reference.daemon.events import EventBus
from reference.daemon.link import BrokerLink
from reference.daemon.runtime import Components, Runtime, lock_state_dir, preflight
from reference.daemon.store import InboxStore, OutboxStore

USED: list[str] = []


class RecordingOutbox(OutboxStore):
    def __init__(self, *args, **kwargs):
        USED.append("outbox_store")
        super().__init__(*args, **kwargs)


class RecordingInbox(InboxStore):
    def __init__(self, *args, **kwargs):
        USED.append("inbox_store")
        super().__init__(*args, **kwargs)


class RecordingBus(EventBus):
    def publish(self, name, payload):
        USED.append("event_bus")
        return super().publish(name, payload)


class RecordingLink(BrokerLink):
    def _handshake(self, ws):
        USED.append("broker_link")
        return super()._handshake(ws)


class RecordingCommitter(GroupCommitter):
    def submit(self, item, timeout=30.0):
        USED.append("committer")
        return super().submit(item, timeout)


def recording(name, function):
    def wrapper(*args, **kwargs):
        USED.append(name)
        return function(*args, **kwargs)

    return wrapper


def test_every_component_is_the_one_the_daemon_uses(tmp_path: Path):
    USED.clear()
    parts = Components(outbox_store=RecordingOutbox, inbox_store=RecordingInbox, event_bus=RecordingBus,
                       broker_link=RecordingLink, committer=RecordingCommitter,
                       create_app=recording("create_app", create_app), parse_send=recording("parse_send", parse_send),
                       check_host=recording("check_host", identity.check_host),
                       lock_state_dir=recording("lock_state_dir", lock_state_dir))
    state = tmp_path / "daemon"
    with ScriptedBroker() as broker:
        config = load(None, {"broker": {"url": broker.url}, "ipc": {"tcp_enabled": False}})
        preflight(state, config, parts)
        assert {"lock_state_dir", "check_host", "outbox_store", "inbox_store"} <= set(USED)
        USED.clear()
        runtime = Runtime(state, config, components=parts)
        ctx = runtime.ctx
        wired = [(ctx.outbox, ports.Outbox), (ctx.inbox, ports.Inbox), (ctx.link, ports.Link),
                 (ctx.events, ports.EventStreams), (ctx.committer, ports.Committer), (ctx.metrics, ports.Metrics)]
        assert [port.__name__ for part, port in wired if not isinstance(part, port)] == []
        runtime.start()
        try:
            client = falcon.testing.TestClient(runtime.app)
            unix = {"meshd.transport": "unix"}
            deadline = time.monotonic() + 30
            while not client.simulate_get("/v1/health", extras=unix).json["connected"]:
                assert time.monotonic() < deadline, "the link did not come up"
                time.sleep(0.05)
            answer = client.simulate_post("/v1/send", json={"to": "#general", "message": "m"},
                                          headers={"Idempotency-Key": "components-1"}, extras=unix)
            assert answer.status_code == 202, answer.text
            runtime.link.publish("daemon_reconnect", {"mesh": "default", "attempt": 1, "ts": "t"})
        finally:
            runtime.close()
    assert set(USED) == {f.name for f in fields(Components)} - {"lock_state_dir", "check_host"}


def test_the_default_components_are_the_reference_parts():
    parts = Components()
    assert (parts.outbox_store, parts.inbox_store, parts.event_bus, parts.broker_link, parts.committer) == \
        (OutboxStore, InboxStore, EventBus, BrokerLink, GroupCommitter)
    assert parts.create_app is create_app and parts.parse_send is parse_send
    assert replace(parts, committer=RecordingCommitter).outbox_store is OutboxStore
