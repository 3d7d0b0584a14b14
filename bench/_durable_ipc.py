"""A multi-process durable accept on the daemon's IPC stack: the "what would pass" rows of bench/send_throughput.py.

    python bench/_durable_ipc.py SOCKET WORKERS DB

Each of ``WORKERS`` gunicorn worker processes (the daemon's worker class settings, as in ``_bare_ipc.py``) serves
``POST /v1/send`` with the reference's own phase A (``reference.core.parse_send``: the body's limits, the schema,
the request fingerprint) and its own group committer (``reference.daemon.committer.GroupCommitter``) inserting the
accepted rows into one shared SQLite file in WAL mode with ``synchronous=FULL``; a 202 is written only after the
COMMIT that fsynced its row. The processes serialise on SQLite's write lock (``BEGIN IMMEDIATE`` with a busy
timeout), so N processes cost about one fsync per batch each, not one per request.

What it leaves out, on purpose, is the part of the daemon that is one per daemon: the broker link (frames out, acks
in, the outbox transitions they drive), the idempotency lookup against earlier rows and the event streams. Its rate
is therefore a ceiling for a daemon built as "several accepting processes in front of one link process", and shows
how far that design could go on this machine before the link's share is paid.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import falcon
from _bare_ipc import StackServer
from ulid import ULID

from reference.core import RequestError, parse_send
from reference.daemon.committer import GroupCommitter

SCHEMA = ("CREATE TABLE IF NOT EXISTS outbox (id TEXT PRIMARY KEY, client_message_id TEXT NOT NULL UNIQUE, "
          "request_fingerprint TEXT NOT NULL, status TEXT NOT NULL, enqueued_at INTEGER NOT NULL, "
          "payload BLOB NOT NULL)")


class _Store:
    """One connection per worker process, used only by that process's committer thread."""

    def __init__(self, path: str):
        self.path = path
        self.conn: sqlite3.Connection | None = None

    def accept_batch(self, items: list[tuple[str, str, bytes]]) -> list[None]:
        if self.conn is None:  # opened on the committer thread, after the fork
            self.conn = sqlite3.connect(self.path, isolation_level=None, timeout=30, check_same_thread=False)
            self.conn.execute("PRAGMA journal_mode = WAL")
            self.conn.execute("PRAGMA synchronous = FULL")
            self.conn.execute(SCHEMA)
        now = int(time.time() * 1000)
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.executemany("INSERT INTO outbox VALUES (?, ?, ?, 'pending', ?, ?)",
                              [(str(ULID()), cmid, fingerprint, now, payload) for cmid, fingerprint, payload in items])
        self.conn.execute("COMMIT")
        return [None] * len(items)


class _Send:
    def __init__(self, db: str):
        self.db = db
        self.committer: GroupCommitter | None = None
        self.lock = threading.Lock()

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        if self.committer is None:
            with self.lock:
                if self.committer is None:
                    self.committer = GroupCommitter(_Store(self.db).accept_batch)
        raw = req.bounded_stream.read(req.content_length or 0)
        try:
            request = parse_send(raw, req.get_header("Idempotency-Key"))
        except RequestError as exc:
            resp.status = falcon.HTTP_400
            resp.media = {"error": exc.code, "detail": exc.detail}
            return
        cmid = request.client_message_id or str(ULID())
        fingerprint = request.fingerprint().hex()
        self.committer.submit((cmid, fingerprint, request.payload()))
        resp.status = falcon.HTTP_202
        resp.content_type = falcon.MEDIA_JSON
        resp.data = json.dumps({"client_message_id": cmid, "status": "queued", "duplicate": False,
                                "request_fingerprint": fingerprint}).encode()

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = b'{"status":"ok"}'


if __name__ == "__main__":
    StackServer(sys.argv[1], int(sys.argv[2]), lambda: _Send(sys.argv[3])).run()
