"""The §4.7.3 inventory of a broker's store, read with the spec's own schema (§4.3, §4.7.1) — no implementation code.

The spec names the tables and the columns that matter: ``client_message_dedupe (mesh_id, client_message_id,
broker_message_id, request_fingerprint, first_seen_at, expires_at, history_available)``, the message rows in
``topic_message`` / ``message_queue`` (``id``, ``mesh_id``, ``client_message_id``), ``message_history
(broker_message_id)`` and ``delivery_queue (broker_message_id, recipient_pubkey)`` (spec/tables/broker_accept.yaml
names the four in-transaction effects by these tables). On PostgreSQL they may live in a schema ``mesh`` (the
reference's) or on the search path. Times may be stored as unix milliseconds or as timestamps; both are read.

Rules of this file. Only the harness's own messages of this run are judged (``client_message_id`` starting with
``RUN_PREFIX``: the cases mint every id with it), so a long-lived store's other rows — legitimately expired, pruned or
someone else's — never produce a finding. A harness message is never old enough to have been pruned or expired, so
every rule below is a plain contradiction of §4.7.1 (all four effects or none) or §17 (history_available flips with
the prune). Nothing here imports the reference implementation.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

HARNESS_PREFIX = "bc-"
#: every client_message_id this harness process mints starts with this
RUN_PREFIX = f"{HARNESS_PREFIX}{uuid.uuid4().hex[:8]}-"

_MESSAGES = ("(SELECT id, mesh_id, client_message_id FROM {p}topic_message "
             "UNION ALL SELECT id, mesh_id, client_message_id FROM {p}message_queue)")

# (rule, the requirement it protects, SQL with {p} the table prefix, {m} the message union, ? the id prefix)
RULES = (
    ("dedupe_without_message", "BRK-ATOMIC",  # a dedupe row whose message is missing although history_available
     "SELECT d.client_message_id FROM {p}client_message_dedupe d WHERE d.client_message_id LIKE ? "
     "AND d.history_available IN (1, TRUE) AND NOT EXISTS (SELECT 1 FROM {m} m WHERE m.id = d.broker_message_id)"),
    ("message_without_dedupe", "BRK-ATOMIC",
     "SELECT m.client_message_id FROM {m} m WHERE m.client_message_id LIKE ? AND NOT EXISTS ("
     "SELECT 1 FROM {p}client_message_dedupe d WHERE d.mesh_id = m.mesh_id "
     "AND d.client_message_id = m.client_message_id)"),
    ("dedupe_names_another_message", "BRK-ATOMIC",
     "SELECT d.client_message_id FROM {p}client_message_dedupe d JOIN {m} m ON m.id = d.broker_message_id "
     "WHERE d.client_message_id LIKE ? AND (m.client_message_id <> d.client_message_id OR m.mesh_id <> d.mesh_id)"),
    ("message_without_history", "BRK-ATOMIC",
     "SELECT m.client_message_id FROM {m} m WHERE m.client_message_id LIKE ? AND NOT EXISTS ("
     "SELECT 1 FROM {p}message_history h WHERE h.broker_message_id = m.id)"),
    ("delivery_without_message", "BRK-ATOMIC",
     "SELECT d.client_message_id FROM {p}client_message_dedupe d JOIN {p}delivery_queue q "
     "ON q.broker_message_id = d.broker_message_id WHERE d.client_message_id LIKE ? "
     "AND NOT EXISTS (SELECT 1 FROM {m} m WHERE m.id = q.broker_message_id)"),
    ("duplicate_messages_for_one_key", "BRK-CONCURRENT-ONE-MESSAGE",
     "SELECT m.client_message_id FROM {m} m WHERE m.client_message_id LIKE ? "
     "GROUP BY m.mesh_id, m.client_message_id HAVING COUNT(*) > 1"),
    ("history_flag_off_with_message", "BRK-HISTORY-AVAILABLE",  # §17: the flag flips with the prune, not before
     "SELECT d.client_message_id FROM {p}client_message_dedupe d WHERE d.client_message_id LIKE ? "
     "AND d.history_available IN (0, FALSE) AND EXISTS (SELECT 1 FROM {m} m WHERE m.id = d.broker_message_id)"),
)


@dataclass(frozen=True)
class Finding:
    """One contradiction in the store: which rule, the requirement it breaks, the client_message_id."""

    rule: str
    requirement: str
    ref: str

    def __str__(self) -> str:
        return f"{self.rule} {self.ref}"


DEDUPE_COLUMNS = ("mesh_id", "client_message_id", "broker_message_id", "request_fingerprint", "first_seen_at",
                  "expires_at", "history_available")


class _Store:
    """A read-only connection to a broker store and the engine's SQL dialect."""

    def __init__(self, dsn: str):
        self.run: Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]]
        if dsn.startswith("sqlite:///"):
            path = dsn.removeprefix("sqlite:///")
            self.connection: Any = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
            self.prefix = ""
            self.run = lambda sql, params: self.connection.execute(sql, params).fetchall()
        elif dsn.startswith(("postgresql://", "postgres://")):
            import psycopg

            self.connection = psycopg.connect(dsn, autocommit=True)
            found = self.connection.execute("SELECT to_regclass('mesh.client_message_dedupe')").fetchone()
            self.prefix = "mesh." if found and found[0] is not None else ""

            def run(sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
                sql = sql.replace("?", "%s").replace("IN (1, TRUE)", "= TRUE").replace("IN (0, FALSE)", "= FALSE")
                with self.connection.cursor() as cursor:
                    cursor.execute(sql, params)
                    return cursor.fetchall()

            self.run = run
        else:
            raise ValueError(f"--store-dsn {dsn!r}: use sqlite:///path or postgresql://…")

    def sql(self, text: str) -> str:
        return text.format(p=self.prefix, m=_MESSAGES.format(p=self.prefix))


@contextmanager
def _opened(dsn: str) -> Iterator[_Store]:
    store = _Store(dsn)
    try:
        yield store
    finally:
        store.connection.close()


def findings(dsn: str, prefix: str = RUN_PREFIX) -> list[Finding]:
    """Every contradiction among the keys starting with ``prefix`` in the store at ``dsn`` (``sqlite:///path`` or
    ``postgresql://…``)."""
    with _opened(dsn) as store:
        return [Finding(rule, requirement, str(row[0])) for rule, requirement, sql in RULES
                for row in store.run(store.sql(sql), (prefix + "%",))]


def inventory(dsn: str, prefix: str = RUN_PREFIX) -> list[str]:
    """``findings`` as ``"<rule> <client_message_id>"`` lines."""
    return [str(finding) for finding in findings(dsn, prefix)]


def unix_ms(value: Any) -> int | None:
    """A stored time as unix milliseconds: integer milliseconds, a timestamp, or an ISO 8601 text."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, int | float):
        return int(value)
    return int(datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp() * 1000)


def dedupe_row(dsn: str, mesh_id: str, client_message_id: str) -> dict[str, Any] | None:
    """The §4.3 dedupe row of ``(mesh_id, client_message_id)``, times as unix ms and the fingerprint as hex; None
    when there is none."""
    with _opened(dsn) as store:
        rows = store.run(store.sql(f"SELECT {', '.join(DEDUPE_COLUMNS)} FROM {{p}}client_message_dedupe "
                                   "WHERE mesh_id = ? AND client_message_id = ?"), (mesh_id, client_message_id))
    if not rows:
        return None
    row = dict(zip(DEDUPE_COLUMNS, rows[0], strict=True))
    fingerprint = row["request_fingerprint"]
    row["request_fingerprint"] = bytes(fingerprint).hex() if isinstance(fingerprint, bytes | memoryview) else (
        str(fingerprint))
    row["first_seen_at"], row["expires_at"] = unix_ms(row["first_seen_at"]), unix_ms(row["expires_at"])
    row["history_available"] = bool(row["history_available"])
    return row


def message_count(dsn: str, mesh_id: str, client_message_id: str) -> int:
    """How many message rows (topic_message and message_queue) carry ``(mesh_id, client_message_id)``."""
    with _opened(dsn) as store:
        rows = store.run(store.sql("SELECT COUNT(*) FROM {m} m WHERE m.mesh_id = ? AND m.client_message_id = ?"),
                         (mesh_id, client_message_id))
    return int(rows[0][0])
