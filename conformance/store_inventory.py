"""The §4.7.3 inventory of a broker's store, read with the spec's own schema (§4.3, §4.7.1) — no implementation code.

The spec names the tables and the columns that matter: ``client_message_dedupe (mesh_id, client_message_id,
broker_message_id, history_available)``, the message rows in ``topic_message`` / ``message_queue`` (``id``,
``mesh_id``, ``client_message_id``), ``message_history (broker_message_id)`` and ``delivery_queue
(broker_message_id)``; on PostgreSQL they live in schema ``mesh``. A broker whose store follows that schema can be
inventoried with ``--store-dsn``. Only the harness's own messages (``client_message_id`` starting with ``bc-``) are
judged, so a long-lived store's older rows (legitimately expired or pruned) never produce a finding.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

HARNESS_PREFIX = "bc-"

# (rule, SQL with {p} as the table prefix and ? / %s placeholders rewritten per engine)
RULES = (
    ("dedupe_without_message",
     "SELECT d.client_message_id AS ref FROM {p}client_message_dedupe d "
     "WHERE d.client_message_id LIKE ? AND d.history_available IN (1, TRUE) "
     "AND NOT EXISTS (SELECT 1 FROM {p}topic_message t WHERE t.id = d.broker_message_id) "
     "AND NOT EXISTS (SELECT 1 FROM {p}message_queue q WHERE q.id = d.broker_message_id)"),
    ("message_without_dedupe",
     "SELECT m.client_message_id AS ref FROM (SELECT mesh_id, client_message_id FROM {p}topic_message "
     "UNION ALL SELECT mesh_id, client_message_id FROM {p}message_queue) m "
     "WHERE m.client_message_id LIKE ? AND NOT EXISTS (SELECT 1 FROM {p}client_message_dedupe d "
     "WHERE d.mesh_id = m.mesh_id AND d.client_message_id = m.client_message_id)"),
    ("message_without_history",
     "SELECT m.client_message_id AS ref FROM (SELECT id, client_message_id FROM {p}topic_message "
     "UNION ALL SELECT id, client_message_id FROM {p}message_queue) m "
     "WHERE m.client_message_id LIKE ? AND NOT EXISTS (SELECT 1 FROM {p}message_history h "
     "WHERE h.broker_message_id = m.id)"),
    ("duplicate_messages_for_one_key",
     "SELECT m.client_message_id AS ref FROM (SELECT mesh_id, client_message_id FROM {p}topic_message "
     "UNION ALL SELECT mesh_id, client_message_id FROM {p}message_queue) m "
     "WHERE m.client_message_id LIKE ? GROUP BY m.mesh_id, m.client_message_id HAVING COUNT(*) > 1"),
)


def inventory(dsn: str) -> list[str]:
    """Every violation found in the store at ``dsn`` (``sqlite:///path`` or ``postgresql://…``)."""
    run: Callable[[str], list[Any]]
    if dsn.startswith("sqlite:///"):
        connection = sqlite3.connect(f"file:{dsn.removeprefix('sqlite:///')}?mode=ro", uri=True, timeout=10)
        prefix, placeholder = "", "?"

        def run(sql: str) -> list[Any]:
            return connection.execute(sql, (HARNESS_PREFIX + "%",)).fetchall()
    elif dsn.startswith(("postgresql://", "postgres://")):
        import psycopg

        connection = psycopg.connect(dsn, autocommit=True)
        prefix, placeholder = "mesh.", "%s"

        def run(sql: str) -> list[Any]:
            with connection.cursor() as cursor:
                cursor.execute(sql.replace("?", placeholder).replace("IN (1, TRUE)", "= TRUE"),
                               (HARNESS_PREFIX + "%",))
                return cursor.fetchall()
    else:
        raise ValueError(f"--store-dsn {dsn!r}: use sqlite:///path or postgresql://…")
    try:
        return [f"{rule} {row[0]}" for rule, sql in RULES for row in run(sql.format(p=prefix))]
    finally:
        connection.close()
