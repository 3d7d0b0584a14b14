"""The broker store on SQLite: one file, WAL, synchronous=FULL, one connection per thread.

Atomicity and serialisation: every write runs under ``BEGIN IMMEDIATE``, which takes the database's RESERVED lock
before the first statement, so the accept's claim → read-back → B2 → inserts run with no other writer in between
(SQLite has no row locks; the read-back needs none). A group of accepts shares one such transaction, each send from
its own savepoint (``_sql.py``); ``temp_store = MEMORY`` keeps the savepoints' statement journal off the disk.
Readers (idle delivery polls, counts, the orphan check) use deferred ``BEGIN`` and, under WAL, never wait for a
writer. Each thread gets its own connection (``threading.local``; ``busy_timeout`` makes a second writer wait rather
than fail); a connection is only ever used by the thread that opened it, and ``close()`` closes them all. Times are
INTEGER unix milliseconds; booleans are 0/1.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reference.clock import wall_ms

from ._sql import TABLES, SqlBrokerStore
from .base import AcceptChecks

BUSY_TIMEOUT_MS = 30_000

_MESSAGE_COLUMNS = (
    "id, mesh_id, client_message_id, sender_pubkey, destination_kind, destination_ref, priority, reply_to_id, meta, "
    "body, created_at"
)
_MESSAGE_VALUES = (
    ":id, :mesh_id, :client_message_id, :sender_pubkey, :destination_kind, :destination_ref, :priority, :reply_to_id, "
    ":meta, :body, :created_at"
)
#: A message whose dedupe row may have expired by policy (retention_scoped and older than the window at :now).
_DEDUPE_MAY_HAVE_EXPIRED = (
    "(policy.dedupe_mode = 'retention_scoped' AND m.created_at + policy.retention_days * 86400000 <= :now)"
)

SQL: dict[str, str] = {
    # B1 and B2 reads
    "mesh_policy": "SELECT dedupe_mode, retention_days FROM mesh WHERE id = :mesh_id",
    "sender_policy": (  # B1's two reads in one: the mesh's dedupe policy (no row: no mesh) and membership
        "SELECT m.dedupe_mode, m.retention_days, EXISTS (SELECT 1 FROM member s WHERE s.mesh_id = m.id "
        "AND s.pubkey = :pubkey) AS is_member FROM mesh m WHERE m.id = :mesh_id"
    ),
    # one send's savepoint inside a group transaction (SqlBrokerStore.accept_batch), named by its position
    "savepoint": "SAVEPOINT accept_{position}",
    "rollback_to_savepoint": "ROLLBACK TO SAVEPOINT accept_{position}",
    "member_exists": "SELECT 1 FROM member WHERE mesh_id = :mesh_id AND pubkey = :pubkey",
    "mesh_members": "SELECT pubkey, display_name FROM member WHERE mesh_id = :mesh_id ORDER BY pubkey",
    "mesh_topics": "SELECT name FROM topic WHERE mesh_id = :mesh_id ORDER BY name",
    "prunable": (
        "SELECT m.mesh_id, m.id AS broker_message_id, m.client_message_id FROM accepted_message m "
        "JOIN client_message_dedupe d ON d.mesh_id = m.mesh_id AND d.client_message_id = m.client_message_id "
        "AND d.broker_message_id = m.id WHERE m.created_at < :before AND d.history_available = 1 ORDER BY m.id"
    ),
    # B2 and the recipients in one read (§4.7.2 step 3): no row means no such destination; a NULL pubkey, no recipient
    "destination_topic": (
        "SELECT s.pubkey FROM topic t LEFT JOIN topic_subscription s ON s.mesh_id = t.mesh_id AND s.topic = t.name "
        "AND s.pubkey <> :sender WHERE t.mesh_id = :mesh_id AND t.name = :ref ORDER BY s.pubkey"
    ),
    "destination_dm": "SELECT pubkey FROM member WHERE mesh_id = :mesh_id AND pubkey = :ref",
    "destination_queue": (
        "SELECT c.pubkey FROM queue q LEFT JOIN queue_consumer c ON c.mesh_id = q.mesh_id AND c.queue_id = q.id "
        "WHERE q.mesh_id = :mesh_id AND q.id = :ref ORDER BY c.pubkey"
    ),
    # §4.7.2 steps 1 and 2
    # req: BRK-CONCURRENT-ONE-MESSAGE -- ON CONFLICT DO NOTHING: one dedupe row per (mesh, client_message_id)
    "claim_dedupe": (
        "INSERT INTO client_message_dedupe (mesh_id, client_message_id, broker_message_id, request_fingerprint, "
        "destination_kind, destination_ref, first_seen_at, expires_at) "
        "VALUES (:mesh_id, :client_message_id, :broker_message_id, :request_fingerprint, :destination_kind, "
        ":destination_ref, :first_seen_at, :expires_at) "
        "ON CONFLICT (mesh_id, client_message_id) DO NOTHING"
    ),
    "read_dedupe": (
        "SELECT d.broker_message_id, d.request_fingerprint, d.history_available, d.first_seen_at AS first_seen_at_ms, "
        "h.id AS history_id "
        "FROM client_message_dedupe d LEFT JOIN message_history h ON h.broker_message_id = d.broker_message_id "
        "WHERE d.mesh_id = :mesh_id AND d.client_message_id = :client_message_id"
    ),
    # §4.7.2 step 4
    "insert_topic_message": f"INSERT INTO topic_message ({_MESSAGE_COLUMNS}) VALUES ({_MESSAGE_VALUES})",
    "insert_queue_message": f"INSERT INTO message_queue ({_MESSAGE_COLUMNS}) VALUES ({_MESSAGE_VALUES})",
    "insert_history": (
        "INSERT INTO message_history (id, broker_message_id, mesh_id, destination_kind, destination_ref, "
        "sender_pubkey, recipient_count, created_at) VALUES (:id, :broker_message_id, :mesh_id, :destination_kind, "
        ":destination_ref, :sender_pubkey, :recipient_count, :created_at)"
    ),
    "insert_delivery": (
        "INSERT INTO delivery_queue (broker_message_id, mesh_id, recipient_pubkey) "
        "VALUES (:broker_message_id, :mesh_id, :recipient_pubkey)"
    ),
    # administration
    "add_mesh": (
        "INSERT INTO mesh (id, slug, dedupe_mode, retention_days) "
        "VALUES (:mesh_id, :slug, :dedupe_mode, :retention_days)"
    ),
    "add_member": (
        "INSERT INTO member (mesh_id, pubkey, display_name) VALUES (:mesh_id, :pubkey, :display_name) "
        "ON CONFLICT (mesh_id, pubkey) DO UPDATE SET display_name = excluded.display_name"
    ),
    "create_topic": "INSERT INTO topic (mesh_id, name) VALUES (:mesh_id, :topic) ON CONFLICT DO NOTHING",
    "subscribe": (
        "INSERT INTO topic_subscription (mesh_id, topic, pubkey) VALUES (:mesh_id, :topic, :pubkey) "
        "ON CONFLICT DO NOTHING"
    ),
    "create_queue": "INSERT INTO queue (mesh_id, id) VALUES (:mesh_id, :queue_id) ON CONFLICT DO NOTHING",
    "add_queue_consumer": (
        "INSERT INTO queue_consumer (mesh_id, queue_id, pubkey) VALUES (:mesh_id, :queue_id, :pubkey) "
        "ON CONFLICT DO NOTHING"
    ),
    # deliveries: claim (lease) → push → ack
    "due_delivery_exists": (
        "SELECT 1 FROM delivery_queue WHERE recipient_pubkey = :recipient AND acked_at IS NULL "
        "AND (lease_until IS NULL OR lease_until <= :now) LIMIT 1"
    ),
    # req: BRK-REDELIVER, BRK-REDELIVER-LEASE -- unacked rows whose lease lapsed are leased again, attempt + 1
    "lease_deliveries": (
        "UPDATE delivery_queue SET attempt = attempt + 1, lease_until = :lease_until "
        "WHERE id IN (SELECT id FROM delivery_queue WHERE recipient_pubkey = :recipient AND acked_at IS NULL "
        "AND (lease_until IS NULL OR lease_until <= :now) ORDER BY id LIMIT :limit) RETURNING id"
    ),
    "leased_deliveries": (
        "SELECT d.id, d.mesh_id, d.recipient_pubkey, d.attempt, d.lease_until AS lease_until_ms, d.broker_message_id, "
        "m.client_message_id, h.id AS history_id, m.sender_pubkey, m.destination_kind, m.destination_ref, "
        "m.priority, m.reply_to_id, m.meta, m.body, m.created_at AS created_at_ms "
        "FROM delivery_queue d JOIN accepted_message m ON m.id = d.broker_message_id "
        "LEFT JOIN message_history h ON h.broker_message_id = d.broker_message_id "
        "WHERE d.id IN (SELECT value FROM json_each(:ids)) ORDER BY d.id"
    ),
    # req: BRK-CLIENT-ACK -- only the delivery's recipient, naming its message, settles it
    "ack_delivery": (
        "UPDATE delivery_queue SET acked_at = COALESCE(acked_at, :now) "
        "WHERE id = :id AND recipient_pubkey = :recipient "
        "AND (:broker_message_id IS NULL OR broker_message_id = :broker_message_id)"
    ),
    # retention (§17 step 6) and expiry (§17 step 5)
    # req: BRK-HISTORY-AVAILABLE
    "prune_flip_history": (
        "UPDATE client_message_dedupe SET history_available = 0 WHERE history_available = 1 AND EXISTS ("
        "SELECT 1 FROM accepted_message m WHERE m.created_at < :before AND m.mesh_id = client_message_dedupe.mesh_id "
        "AND m.client_message_id = client_message_dedupe.client_message_id "
        "AND m.id = client_message_dedupe.broker_message_id)"
    ),
    "prune_deliveries": (
        "DELETE FROM delivery_queue WHERE broker_message_id IN "
        "(SELECT id FROM accepted_message WHERE created_at < :before)"
    ),
    "prune_history": (  # a history row stays while a dedupe row names it: a duplicate still answers history_id
        "DELETE FROM message_history WHERE broker_message_id IN "
        "(SELECT id FROM accepted_message WHERE created_at < :before) AND NOT EXISTS ("
        "SELECT 1 FROM client_message_dedupe d WHERE d.mesh_id = message_history.mesh_id "
        "AND d.broker_message_id = message_history.broker_message_id)"
    ),
    "prune_topic_messages": "DELETE FROM topic_message WHERE created_at < :before",
    "prune_queue_messages": "DELETE FROM message_queue WHERE created_at < :before",
    "expire_history": (  # the kept history rows of pruned messages go with their dedupe rows
        "DELETE FROM message_history WHERE broker_message_id IN (SELECT d.broker_message_id "
        "FROM client_message_dedupe d JOIN mesh policy ON policy.id = d.mesh_id WHERE d.expires_at IS NOT NULL "
        "AND d.expires_at < :now AND policy.dedupe_mode = 'retention_scoped') "
        "AND NOT EXISTS (SELECT 1 FROM accepted_message m WHERE m.id = message_history.broker_message_id)"
    ),
    # req: BRK-DEDUPE-EXPIRY, BRK-DEDUPE-PERMANENT -- retention_scoped meshes only
    "expire_dedupe": (
        "DELETE FROM client_message_dedupe WHERE expires_at IS NOT NULL AND expires_at < :now AND mesh_id IN "
        "(SELECT id FROM mesh WHERE dedupe_mode = 'retention_scoped')"
    ),
    # migrations
    "migrations_table": (
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)"
    ),
    "applied_migrations": "SELECT version FROM schema_migrations ORDER BY version",
    "record_migration": (
        "INSERT INTO schema_migrations (version, name, applied_at) VALUES (:version, :name, :applied_at)"
    ),
    # §4.7.3 inventory: each rule selects (mesh_id, ref, detail) per violation
    "dedupe_without_message": (
        "SELECT d.mesh_id, d.client_message_id AS ref, 'client_message_dedupe (' || d.mesh_id || ', ' || "
        "d.client_message_id || ') names message ' || d.broker_message_id || "
        "', which does not exist, and history_available is true' AS detail "
        "FROM client_message_dedupe d WHERE d.history_available = 1 AND NOT EXISTS ("
        "SELECT 1 FROM accepted_message m WHERE m.id = d.broker_message_id AND m.mesh_id = d.mesh_id)"
    ),
    "message_without_dedupe": (
        "SELECT m.mesh_id, m.id AS ref, 'message ' || m.id || ' (client_message_id ' || m.client_message_id || "
        "') has no client_message_dedupe row naming it' AS detail "
        "FROM accepted_message m JOIN mesh policy ON policy.id = m.mesh_id WHERE m.client_message_id IS NOT NULL "
        "AND NOT EXISTS (SELECT 1 FROM client_message_dedupe d WHERE d.mesh_id = m.mesh_id "
        "AND d.client_message_id = m.client_message_id AND d.broker_message_id = m.id) "
        f"AND NOT {_DEDUPE_MAY_HAVE_EXPIRED}"
    ),
    "message_without_history": (
        "SELECT m.mesh_id, m.id AS ref, 'message ' || m.id || ' has no message_history row' AS detail "
        "FROM accepted_message m WHERE NOT EXISTS ("
        "SELECT 1 FROM message_history h WHERE h.broker_message_id = m.id)"
    ),
    "history_without_message": (
        "SELECT h.mesh_id, h.broker_message_id AS ref, 'message_history ' || h.id || ' names message ' || "
        "h.broker_message_id || ', which does not exist and was not pruned (no dedupe row with "
        "history_available false names it)' AS detail "
        "FROM message_history h WHERE NOT EXISTS (SELECT 1 FROM accepted_message m WHERE m.id = h.broker_message_id) "
        "AND NOT EXISTS (SELECT 1 FROM client_message_dedupe d WHERE d.mesh_id = h.mesh_id "
        "AND d.broker_message_id = h.broker_message_id AND d.history_available = 0)"
    ),
    "delivery_count_mismatch": (
        "SELECT mesh_id, ref, 'message ' || ref || ' has ' || actual || ' delivery_queue rows; its history recorded ' "
        "|| expected AS detail FROM (SELECT h.mesh_id, h.broker_message_id AS ref, h.recipient_count AS expected, "
        "(SELECT count(*) FROM delivery_queue q WHERE q.broker_message_id = h.broker_message_id) AS actual "
        "FROM message_history h WHERE EXISTS (SELECT 1 FROM accepted_message m WHERE m.id = h.broker_message_id)) "
        "WHERE actual <> expected"
    ),
    "delivery_without_message": (
        "SELECT q.mesh_id, q.id AS ref, 'delivery_queue ' || q.id || ' names message ' || q.broker_message_id || "
        "', which does not exist' AS detail "
        "FROM delivery_queue q WHERE NOT EXISTS (SELECT 1 FROM accepted_message m WHERE m.id = q.broker_message_id)"
    ),
    "delivery_without_dedupe": (
        "SELECT q.mesh_id, q.id AS ref, 'delivery_queue ' || q.id || ' names message ' || q.broker_message_id || "
        "', which no client_message_dedupe row names' AS detail FROM delivery_queue q "
        "WHERE NOT EXISTS (SELECT 1 FROM client_message_dedupe d WHERE d.mesh_id = q.mesh_id "
        "AND d.broker_message_id = q.broker_message_id) "
        "AND NOT EXISTS (SELECT 1 FROM accepted_message m JOIN mesh policy ON policy.id = m.mesh_id "
        f"WHERE m.id = q.broker_message_id AND (m.client_message_id IS NULL OR {_DEDUPE_MAY_HAVE_EXPIRED}))"
    ),
    **{f"count_{table}": f"SELECT count(*) AS n FROM {table}" for table in TABLES},
}


class SqliteStore(SqlBrokerStore):
    """The broker store in one SQLite file (``:memory:`` is refused: each thread would see its own database)."""

    engine = "sqlite"
    SQL = SQL

    def __init__(self, path: str | Path, checks: AcceptChecks | None = None, fault_hook: Any = None,
                 clock: Callable[[], int] = wall_ms):
        if str(path) in ("", ":memory:") or str(path).startswith("file:"):
            raise ValueError("SqliteStore needs a file path (every thread opens its own connection)")
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        if not self.path.exists():
            # Every message body is in this file: 0600 from the start (SQLite gives -wal and -shm the same mode).
            with contextlib.suppress(FileNotFoundError):  # a missing directory fails on connect, with SQLite's words
                # req: LIFE-PRIVATE-FILES -- broker.db; SQLite gives its WAL files the same mode
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        super().__init__(checks, fault_hook, clock)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
        )
        conn.row_factory = sqlite3.Row
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise sqlite3.OperationalError(f"{self.path}: journal_mode is {mode}, not wal")
        # req: BRK-ATOMIC -- a COMMIT is durable before any ack of it is sent
        conn.execute("PRAGMA synchronous = FULL")
        # The statement journal that lets a group transaction roll back to one send's savepoint lives in memory, not
        # in a temporary file: it only ever serves a rollback inside an open transaction, never recovery.
        conn.execute("PRAGMA temp_store = MEMORY")
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    def _begin_read(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN")

    def _begin_write(self, conn: sqlite3.Connection) -> None:
        # req: BRK-CONCURRENT-ONE-MESSAGE -- one writer: the claim and its read-back see no other accept between them
        conn.execute("BEGIN IMMEDIATE")

    def _lock_migrations(self, cur: sqlite3.Cursor) -> None:
        """Nothing to add: the migration runs under BEGIN IMMEDIATE, which already excludes every other writer."""

    def _run_script(self, cur: sqlite3.Cursor, script: str) -> None:
        # executescript() would COMMIT first and drop the lock, so statements run one by one in our transaction.
        statement = ""
        for line in script.splitlines(keepends=True):
            statement += line
            if sqlite3.complete_statement(statement):
                cur.execute(statement)
                statement = ""
        leftover = [ln for ln in statement.splitlines() if ln.strip() and not ln.strip().startswith("--")]
        if leftover:
            raise sqlite3.OperationalError(f"migration ends inside a statement: {leftover[0]!r}")

    def _id_list(self, ids: list[int]) -> str:
        return "[" + ",".join(str(int(i)) for i in ids) + "]"
