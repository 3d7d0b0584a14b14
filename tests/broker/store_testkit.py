"""Shared builders for the broker store tests: the cast, the standard mesh layout, requests, ids and raw SQL.

(A uniquely named module rather than ``conftest``: two ``conftest`` modules without packages shadow each other when
pytest is given several test directories at once.)
"""

from __future__ import annotations

import sqlite3

from ulid import ULID

from reference.broker.store import AcceptRequest, AcceptResult, BrokerStore
from reference.core.fingerprint import FingerprintInput, request_fingerprint
from spec import validator

SENDER = "a" * 64
BOB = "b" * 64
CAROL = "c" * 64
DAVE = "d" * 64
OUTSIDER = "e" * 64
MESH = "mesh-retention"
PERMANENT_MESH = "mesh-permanent"
RETENTION_DAYS = 3
DAY_MS = 86_400_000
T0 = 1_777_777_777_000  # unix ms; every test passes explicit times


def populate(store: BrokerStore) -> None:
    """Two meshes (retention_scoped 3 days, permanent), each with members SENDER, BOB, CAROL, DAVE; topic `general`
    (SENDER, BOB, CAROL subscribed), empty topic `quiet`, queue `jobs` (consumers CAROL, DAVE)."""
    for mesh_id, mode, days in ((MESH, "retention_scoped", RETENTION_DAYS), (PERMANENT_MESH, "permanent", None)):
        store.add_mesh(mesh_id, mesh_id, mode, days)
        for pubkey in (SENDER, BOB, CAROL, DAVE):
            store.add_member(mesh_id, pubkey, pubkey[:1])
        store.create_topic(mesh_id, "general")
        store.create_topic(mesh_id, "quiet")
        for pubkey in (SENDER, BOB, CAROL):
            store.subscribe(mesh_id, "general", pubkey)
        store.create_queue(mesh_id, "jobs", [CAROL, DAVE])


def fingerprint_of(req: AcceptRequest) -> bytes:
    """The fingerprint an honest daemon claims for ``req``."""
    return request_fingerprint(FingerprintInput(
        destination_kind=req.destination_kind, destination_ref=req.destination_ref, reply_to_id=req.reply_to_id,
        priority=req.priority, meta=req.meta, body=req.body,
    ))


def make_request(claimed: bytes | None = None, **fields) -> AcceptRequest:
    """A send from SENDER to #general in MESH; ``claimed`` overrides the (otherwise correct) claimed fingerprint."""
    values = {
        "mesh_id": MESH, "sender_pubkey": SENDER, "client_message_id": "cmid-1", "request_fingerprint": b"",
        "destination_kind": "topic", "destination_ref": "general", "priority": "next", "reply_to_id": "",
        "meta": None, "body": "hello", "received_at_ms": T0,
    }
    values.update(fields)
    req = AcceptRequest(**values)
    fingerprint = fingerprint_of(req) if claimed is None else claimed
    return AcceptRequest(**{**values, "request_fingerprint": fingerprint})


def valid_ack(result: AcceptResult) -> AcceptResult:
    """``result``, after checking that its ack frame matches spec/schemas/broker/ack.json (E-10, E-28)."""
    errors = [error.message for error in validator("broker/ack").iter_errors(result.ack_frame())]
    assert not errors, (result, errors)
    return result


def new_ids() -> tuple[str, str]:
    """A fresh (broker_message_id, history_id), minted as the broker mints them."""
    return str(ULID()), str(ULID())


def raw_execute(store: BrokerStore, statement: str) -> list[tuple]:
    """Run SQL behind the store's back on a connection of its own; ``{s}`` becomes the engine's schema prefix."""
    if store.engine == "sqlite":
        conn = sqlite3.connect(store.path, isolation_level=None)
        try:
            return conn.execute(statement.format(s="")).fetchall()
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(store.dsn, autocommit=True) as conn:
        cur = conn.execute(statement.format(s="mesh."))
        return cur.fetchall() if cur.description else []
