"""Durable storage for the reference daemon: ``outbox.db`` and ``inbox.db`` on SQLite.

``_sqlite`` opens one file (pragmas, WAL, forward-only migrations, the ``BEGIN IMMEDIATE`` write transaction and the
reader pool); ``outbox`` persists what ``reference.core`` decides for sends; ``inbox`` keeps what the broker delivered,
the quarantine and the SSE event log. Callers import from this package.
"""

from __future__ import annotations

from ._cursor import InvalidCursor
from ._sqlite import (
    MIGRATIONS_DIR,
    SYNCHRONOUS_MODES,
    Migration,
    MigrationError,
    SchemaTooNew,
    StoreClosed,
    StoreError,
    is_corruption,
    migrations,
    schema_version,
)
from .inbox import (
    InboxCorrupt,
    InboxMessage,
    InboxRow,
    InboxStore,
    QuarantinedFrame,
    StoredEvent,
    inbox_cursor,
    message_event_payload,
)
from .outbox import (
    ABORT_ACTORS,
    Accepted,
    AcceptItem,
    AmbiguousOutboxKey,
    NewIdInUse,
    OutboxCorrupt,
    OutboxRowNotFound,
    OutboxStore,
    TraceHook,
)

__all__ = [
    "ABORT_ACTORS",
    "MIGRATIONS_DIR",
    "SYNCHRONOUS_MODES",
    "AcceptItem",
    "Accepted",
    "AmbiguousOutboxKey",
    "InboxCorrupt",
    "InboxMessage",
    "InboxRow",
    "InboxStore",
    "InvalidCursor",
    "Migration",
    "MigrationError",
    "NewIdInUse",
    "OutboxCorrupt",
    "OutboxRowNotFound",
    "OutboxStore",
    "QuarantinedFrame",
    "SchemaTooNew",
    "StoreClosed",
    "StoreError",
    "StoredEvent",
    "TraceHook",
    "inbox_cursor",
    "is_corruption",
    "message_event_payload",
    "migrations",
    "schema_version",
]
