"""The broker store on PostgreSQL (psycopg 3): tables in the ``mesh`` schema, one connection per thread.

Atomicity and serialisation: connections run with autocommit off at READ COMMITTED; a transaction starts with the
first statement and ends with an explicit COMMIT or ROLLBACK from the shared algorithm. Two accepts of one
``(mesh_id, client_message_id)`` meet at the primary key: the second ``INSERT … ON CONFLICT DO NOTHING`` waits for
the first transaction to end, then inserts (the first rolled back) or does nothing (it committed); the read-back
``SELECT … FOR SHARE OF d`` then sees the committed row and holds it against a concurrent expiry or prune until this
transaction ends. Deliveries are leased with ``FOR UPDATE SKIP LOCKED``, so concurrent pollers never lease one row
twice. Migrations run in one transaction holding ``pg_advisory_xact_lock``. psycopg_pool is not a dependency, so
each thread keeps its own connection (``threading.local``), reopened if it breaks; ``close()`` closes them all.
Times are TIMESTAMPTZ in the tables and unix milliseconds at the interface (``mesh.ms_to_ts`` / ``mesh.ts_to_ms``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import IsolationLevel
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

from reference.clock import wall_ms

from ._sql import TABLES, SqlBrokerStore
from .base import AcceptChecks

#: pg_advisory_xact_lock key for migrations: the ASCII bytes of "meshmigr".
MIGRATION_LOCK_KEY = int.from_bytes(b"meshmigr", "big") & 0x7FFF_FFFF_FFFF_FFFF

_MESSAGE_COLUMNS = (
    "id, mesh_id, client_message_id, sender_pubkey, destination_kind, destination_ref, priority, reply_to_id, meta, "
    "body, created_at"
)
_MESSAGE_VALUES = (
    "%(id)s, %(mesh_id)s, %(client_message_id)s, %(sender_pubkey)s, %(destination_kind)s, %(destination_ref)s, "
    "%(priority)s, %(reply_to_id)s, %(meta)s, %(body)s, mesh.ms_to_ts(%(created_at)s)"
)
#: A message whose dedupe row may have expired by policy (retention_scoped and older than the window at now).
_DEDUPE_MAY_HAVE_EXPIRED = (
    "(policy.dedupe_mode = 'retention_scoped' "
    "AND mesh.ts_to_ms(m.created_at) + policy.retention_days::bigint * 86400000 <= %(now)s)"
)

SQL: dict[str, str] = {
    # B1 and B2 reads
    "mesh_policy": "SELECT dedupe_mode, retention_days FROM mesh.mesh WHERE id = %(mesh_id)s",
    "sender_policy": (  # B1's two reads in one: the mesh's dedupe policy (no row: no mesh) and membership
        "SELECT m.dedupe_mode, m.retention_days, EXISTS (SELECT 1 FROM mesh.member s WHERE s.mesh_id = m.id "
        "AND s.pubkey = %(pubkey)s) AS is_member FROM mesh.mesh m WHERE m.id = %(mesh_id)s"
    ),
    # one send's savepoint inside a group transaction (SqlBrokerStore.accept_batch), named by its position
    "savepoint": "SAVEPOINT accept_{position}",
    "rollback_to_savepoint": "ROLLBACK TO SAVEPOINT accept_{position}",
    "member_exists": "SELECT 1 FROM mesh.member WHERE mesh_id = %(mesh_id)s AND pubkey = %(pubkey)s",
    "mesh_members": "SELECT pubkey, display_name FROM mesh.member WHERE mesh_id = %(mesh_id)s ORDER BY pubkey",
    "mesh_topics": "SELECT name FROM mesh.topic WHERE mesh_id = %(mesh_id)s ORDER BY name",
    "prunable": (
        "SELECT m.mesh_id, m.id AS broker_message_id, m.client_message_id FROM mesh.accepted_message m "
        "JOIN mesh.client_message_dedupe d ON d.mesh_id = m.mesh_id "
        "AND d.client_message_id = m.client_message_id AND d.broker_message_id = m.id "
        "WHERE m.created_at < mesh.ms_to_ts(%(before)s) AND d.history_available ORDER BY m.id"
    ),
    # B2 and the recipients in one read (§4.7.2 step 3): no row means no such destination; a NULL pubkey, no recipient
    "destination_topic": (
        "SELECT s.pubkey FROM mesh.topic t LEFT JOIN mesh.topic_subscription s ON s.mesh_id = t.mesh_id "
        "AND s.topic = t.name AND s.pubkey <> %(sender)s WHERE t.mesh_id = %(mesh_id)s AND t.name = %(ref)s "
        "ORDER BY s.pubkey"
    ),
    "destination_dm": "SELECT pubkey FROM mesh.member WHERE mesh_id = %(mesh_id)s AND pubkey = %(ref)s",
    "destination_queue": (
        "SELECT c.pubkey FROM mesh.queue q LEFT JOIN mesh.queue_consumer c ON c.mesh_id = q.mesh_id "
        "AND c.queue_id = q.id WHERE q.mesh_id = %(mesh_id)s AND q.id = %(ref)s ORDER BY c.pubkey"
    ),
    # §4.7.2 steps 1 and 2
    # req: BRK-CONCURRENT-ONE-MESSAGE -- ON CONFLICT DO NOTHING: one dedupe row per (mesh, client_message_id)
    "claim_dedupe": (
        "INSERT INTO mesh.client_message_dedupe (mesh_id, client_message_id, broker_message_id, request_fingerprint, "
        "destination_kind, destination_ref, first_seen_at, expires_at) "
        "VALUES (%(mesh_id)s, %(client_message_id)s, %(broker_message_id)s, %(request_fingerprint)s, "
        "%(destination_kind)s, %(destination_ref)s, mesh.ms_to_ts(%(first_seen_at)s), "
        "mesh.ms_to_ts(%(expires_at)s::bigint)) "
        "ON CONFLICT (mesh_id, client_message_id) DO NOTHING"
    ),
    "read_dedupe": (
        "SELECT d.broker_message_id, d.request_fingerprint, d.history_available, "
        "mesh.ts_to_ms(d.first_seen_at) AS first_seen_at_ms, h.id AS history_id "
        "FROM mesh.client_message_dedupe d "
        "LEFT JOIN mesh.message_history h ON h.broker_message_id = d.broker_message_id "
        "WHERE d.mesh_id = %(mesh_id)s AND d.client_message_id = %(client_message_id)s "
        "FOR SHARE OF d"
    ),
    # §4.7.2 step 4
    "insert_topic_message": f"INSERT INTO mesh.topic_message ({_MESSAGE_COLUMNS}) VALUES ({_MESSAGE_VALUES})",
    "insert_queue_message": f"INSERT INTO mesh.message_queue ({_MESSAGE_COLUMNS}) VALUES ({_MESSAGE_VALUES})",
    "insert_history": (
        "INSERT INTO mesh.message_history (id, broker_message_id, mesh_id, destination_kind, destination_ref, "
        "sender_pubkey, recipient_count, created_at) VALUES (%(id)s, %(broker_message_id)s, %(mesh_id)s, "
        "%(destination_kind)s, %(destination_ref)s, %(sender_pubkey)s, %(recipient_count)s, "
        "mesh.ms_to_ts(%(created_at)s))"
    ),
    "insert_delivery": (
        "INSERT INTO mesh.delivery_queue (broker_message_id, mesh_id, recipient_pubkey) "
        "VALUES (%(broker_message_id)s, %(mesh_id)s, %(recipient_pubkey)s)"
    ),
    # administration
    "add_mesh": (
        "INSERT INTO mesh.mesh (id, slug, dedupe_mode, retention_days) "
        "VALUES (%(mesh_id)s, %(slug)s, %(dedupe_mode)s, %(retention_days)s)"
    ),
    "add_member": (
        "INSERT INTO mesh.member (mesh_id, pubkey, display_name) VALUES (%(mesh_id)s, %(pubkey)s, %(display_name)s) "
        "ON CONFLICT (mesh_id, pubkey) DO UPDATE SET display_name = excluded.display_name"
    ),
    "create_topic": "INSERT INTO mesh.topic (mesh_id, name) VALUES (%(mesh_id)s, %(topic)s) ON CONFLICT DO NOTHING",
    "subscribe": (
        "INSERT INTO mesh.topic_subscription (mesh_id, topic, pubkey) VALUES (%(mesh_id)s, %(topic)s, %(pubkey)s) "
        "ON CONFLICT DO NOTHING"
    ),
    "create_queue": "INSERT INTO mesh.queue (mesh_id, id) VALUES (%(mesh_id)s, %(queue_id)s) ON CONFLICT DO NOTHING",
    "add_queue_consumer": (
        "INSERT INTO mesh.queue_consumer (mesh_id, queue_id, pubkey) VALUES (%(mesh_id)s, %(queue_id)s, %(pubkey)s) "
        "ON CONFLICT DO NOTHING"
    ),
    # deliveries: claim (lease) → push → ack
    "due_delivery_exists": (
        "SELECT 1 FROM mesh.delivery_queue WHERE recipient_pubkey = %(recipient)s AND acked_at IS NULL "
        "AND (lease_until IS NULL OR lease_until <= mesh.ms_to_ts(%(now)s)) LIMIT 1"
    ),
    # req: BRK-REDELIVER, BRK-REDELIVER-LEASE -- unacked rows whose lease lapsed are leased again, attempt + 1
    "lease_deliveries": (
        "UPDATE mesh.delivery_queue SET attempt = attempt + 1, lease_until = mesh.ms_to_ts(%(lease_until)s) "
        "WHERE id IN (SELECT id FROM mesh.delivery_queue WHERE recipient_pubkey = %(recipient)s "
        "AND acked_at IS NULL AND (lease_until IS NULL OR lease_until <= mesh.ms_to_ts(%(now)s)) "
        "ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) RETURNING id"
    ),
    "leased_deliveries": (
        "SELECT d.id, d.mesh_id, d.recipient_pubkey, d.attempt, mesh.ts_to_ms(d.lease_until) AS lease_until_ms, "
        "d.broker_message_id, m.client_message_id, h.id AS history_id, m.sender_pubkey, m.destination_kind, "
        "m.destination_ref, m.priority, m.reply_to_id, m.meta, m.body, mesh.ts_to_ms(m.created_at) AS created_at_ms "
        "FROM mesh.delivery_queue d JOIN mesh.accepted_message m ON m.id = d.broker_message_id "
        "LEFT JOIN mesh.message_history h ON h.broker_message_id = d.broker_message_id "
        "WHERE d.id = ANY(%(ids)s) ORDER BY d.id"
    ),
    # req: BRK-CLIENT-ACK -- only the delivery's recipient, naming its message, settles it
    "ack_delivery": (
        "UPDATE mesh.delivery_queue SET acked_at = COALESCE(acked_at, mesh.ms_to_ts(%(now)s)) "
        "WHERE id = %(id)s AND recipient_pubkey = %(recipient)s "
        "AND (%(broker_message_id)s::text IS NULL OR broker_message_id = %(broker_message_id)s)"
    ),
    # retention (§17 step 6) and expiry (§17 step 5)
    # req: BRK-HISTORY-AVAILABLE
    "prune_flip_history": (
        "UPDATE mesh.client_message_dedupe d SET history_available = FALSE WHERE d.history_available AND EXISTS ("
        "SELECT 1 FROM mesh.accepted_message m WHERE m.created_at < mesh.ms_to_ts(%(before)s) "
        "AND m.mesh_id = d.mesh_id AND m.client_message_id = d.client_message_id AND m.id = d.broker_message_id)"
    ),
    "prune_deliveries": (
        "DELETE FROM mesh.delivery_queue WHERE broker_message_id IN "
        "(SELECT id FROM mesh.accepted_message WHERE created_at < mesh.ms_to_ts(%(before)s))"
    ),
    "prune_history": (  # a history row stays while a dedupe row names it: a duplicate still answers history_id
        "DELETE FROM mesh.message_history h WHERE h.broker_message_id IN "
        "(SELECT id FROM mesh.accepted_message WHERE created_at < mesh.ms_to_ts(%(before)s)) AND NOT EXISTS ("
        "SELECT 1 FROM mesh.client_message_dedupe d WHERE d.mesh_id = h.mesh_id "
        "AND d.broker_message_id = h.broker_message_id)"
    ),
    "prune_topic_messages": "DELETE FROM mesh.topic_message WHERE created_at < mesh.ms_to_ts(%(before)s)",
    "prune_queue_messages": "DELETE FROM mesh.message_queue WHERE created_at < mesh.ms_to_ts(%(before)s)",
    "expire_history": (  # the kept history rows of pruned messages go with their dedupe rows
        "DELETE FROM mesh.message_history h WHERE h.broker_message_id IN (SELECT d.broker_message_id "
        "FROM mesh.client_message_dedupe d JOIN mesh.mesh policy ON policy.id = d.mesh_id "
        "WHERE d.expires_at IS NOT NULL AND d.expires_at < mesh.ms_to_ts(%(now)s) "
        "AND policy.dedupe_mode = 'retention_scoped') "
        "AND NOT EXISTS (SELECT 1 FROM mesh.accepted_message m WHERE m.id = h.broker_message_id)"
    ),
    # req: BRK-DEDUPE-EXPIRY, BRK-DEDUPE-PERMANENT -- retention_scoped meshes only
    "expire_dedupe": (
        "DELETE FROM mesh.client_message_dedupe WHERE expires_at IS NOT NULL "
        "AND expires_at < mesh.ms_to_ts(%(now)s) AND mesh_id IN "
        "(SELECT id FROM mesh.mesh WHERE dedupe_mode = 'retention_scoped')"
    ),
    # migrations
    "migrations_table": (
        "CREATE TABLE IF NOT EXISTS mesh.schema_migrations ("
        "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)"
    ),
    "applied_migrations": "SELECT version FROM mesh.schema_migrations ORDER BY version",
    "record_migration": (
        "INSERT INTO mesh.schema_migrations (version, name, applied_at) VALUES (%(version)s, %(name)s, %(applied_at)s)"
    ),
    # §4.7.3 inventory: each rule selects (mesh_id, ref, detail) per violation
    "dedupe_without_message": (
        "SELECT d.mesh_id, d.client_message_id AS ref, 'client_message_dedupe (' || d.mesh_id || ', ' || "
        "d.client_message_id || ') names message ' || d.broker_message_id || "
        "', which does not exist, and history_available is true' AS detail "
        "FROM mesh.client_message_dedupe d WHERE d.history_available AND NOT EXISTS ("
        "SELECT 1 FROM mesh.accepted_message m WHERE m.id = d.broker_message_id AND m.mesh_id = d.mesh_id)"
    ),
    "message_without_dedupe": (
        "SELECT m.mesh_id, m.id AS ref, 'message ' || m.id || ' (client_message_id ' || m.client_message_id || "
        "') has no client_message_dedupe row naming it' AS detail "
        "FROM mesh.accepted_message m JOIN mesh.mesh policy ON policy.id = m.mesh_id "
        "WHERE m.client_message_id IS NOT NULL "
        "AND NOT EXISTS (SELECT 1 FROM mesh.client_message_dedupe d WHERE d.mesh_id = m.mesh_id "
        "AND d.client_message_id = m.client_message_id AND d.broker_message_id = m.id) "
        f"AND NOT {_DEDUPE_MAY_HAVE_EXPIRED}"
    ),
    "message_without_history": (
        "SELECT m.mesh_id, m.id AS ref, 'message ' || m.id || ' has no message_history row' AS detail "
        "FROM mesh.accepted_message m WHERE NOT EXISTS ("
        "SELECT 1 FROM mesh.message_history h WHERE h.broker_message_id = m.id)"
    ),
    "history_without_message": (
        "SELECT h.mesh_id, h.broker_message_id AS ref, 'message_history ' || h.id || ' names message ' || "
        "h.broker_message_id || ', which does not exist and was not pruned (no dedupe row with "
        "history_available false names it)' AS detail "
        "FROM mesh.message_history h WHERE NOT EXISTS ("
        "SELECT 1 FROM mesh.accepted_message m WHERE m.id = h.broker_message_id) "
        "AND NOT EXISTS (SELECT 1 FROM mesh.client_message_dedupe d WHERE d.mesh_id = h.mesh_id "
        "AND d.broker_message_id = h.broker_message_id AND NOT d.history_available)"
    ),
    "delivery_count_mismatch": (
        "SELECT mesh_id, ref, 'message ' || ref || ' has ' || actual || ' delivery_queue rows; its history recorded ' "
        "|| expected AS detail FROM (SELECT h.mesh_id, h.broker_message_id AS ref, h.recipient_count AS expected, "
        "(SELECT count(*) FROM mesh.delivery_queue q WHERE q.broker_message_id = h.broker_message_id) AS actual "
        "FROM mesh.message_history h WHERE EXISTS ("
        "SELECT 1 FROM mesh.accepted_message m WHERE m.id = h.broker_message_id)) AS tally "
        "WHERE actual <> expected"
    ),
    "delivery_without_message": (
        "SELECT q.mesh_id, q.id AS ref, 'delivery_queue ' || q.id || ' names message ' || q.broker_message_id || "
        "', which does not exist' AS detail FROM mesh.delivery_queue q WHERE NOT EXISTS ("
        "SELECT 1 FROM mesh.accepted_message m WHERE m.id = q.broker_message_id)"
    ),
    "delivery_without_dedupe": (
        "SELECT q.mesh_id, q.id AS ref, 'delivery_queue ' || q.id || ' names message ' || q.broker_message_id || "
        "', which no client_message_dedupe row names' AS detail FROM mesh.delivery_queue q "
        "WHERE NOT EXISTS (SELECT 1 FROM mesh.client_message_dedupe d WHERE d.mesh_id = q.mesh_id "
        "AND d.broker_message_id = q.broker_message_id) "
        "AND NOT EXISTS (SELECT 1 FROM mesh.accepted_message m JOIN mesh.mesh policy ON policy.id = m.mesh_id "
        f"WHERE m.id = q.broker_message_id AND (m.client_message_id IS NULL OR {_DEDUPE_MAY_HAVE_EXPIRED}))"
    ),
    **{f"count_{table}": f"SELECT count(*) AS n FROM mesh.{table}" for table in TABLES},
}


class PostgresStore(SqlBrokerStore):
    """The broker store in a PostgreSQL database named by a libpq DSN or URL."""

    engine = "postgres"
    SQL = SQL

    def __init__(self, dsn: str, checks: AcceptChecks | None = None, fault_hook: Any = None,
                 clock: Callable[[], int] = wall_ms):
        self.dsn = dsn
        self.url = dsn
        super().__init__(checks, fault_hook, clock)

    def _connect(self) -> psycopg.Connection:
        conn = psycopg.connect(self.dsn, autocommit=False, row_factory=dict_row)
        conn.isolation_level = IsolationLevel.READ_COMMITTED
        return conn

    def _usable(self, conn: psycopg.Connection) -> bool:
        return not conn.closed and not conn.broken

    def _begin(self, conn: psycopg.Connection) -> None:
        # psycopg opens the transaction with the first statement; make sure no earlier one is still open.
        if conn.info.transaction_status != TransactionStatus.IDLE:
            conn.rollback()

    _begin_read = _begin
    _begin_write = _begin

    def _pipeline(self, conn: psycopg.Connection) -> contextlib.AbstractContextManager[Any]:
        return conn.pipeline()  # psycopg's pipeline mode: statements go out without waiting for each answer

    def _lock_migrations(self, cur: psycopg.Cursor) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        cur.execute("CREATE SCHEMA IF NOT EXISTS mesh")

    def _run_script(self, cur: psycopg.Cursor, script: str) -> None:
        cur.execute(script)  # no parameters: psycopg sends the whole file, several statements, in one round trip

    def _id_list(self, ids: list[int]) -> list[int]:
        return ids
