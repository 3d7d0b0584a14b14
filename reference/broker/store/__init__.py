"""The broker's storage: one narrow interface (``BrokerStore``), one implementation per engine.

``open_store("sqlite:///path/to/broker.db")`` or ``open_store("postgresql://user:pw@host:port/db")``; call
``migrate()`` once at start. Both engines pass the same contract suite (tests/broker/test_store_contract.py).
"""

from __future__ import annotations

from typing import Any

from .base import (
    DEDUPE_MODES,
    EFFECTS,
    AcceptChecks,
    AcceptRequest,
    AcceptResult,
    BrokerStore,
    Delivery,
    StoreError,
    Violation,
    rfc3339_ms,
)

__all__ = [
    "DEDUPE_MODES",
    "EFFECTS",
    "AcceptChecks",
    "AcceptRequest",
    "AcceptResult",
    "BrokerStore",
    "Delivery",
    "StoreError",
    "Violation",
    "open_store",
    "rfc3339_ms",
]

SQLITE_PREFIX = "sqlite:///"
POSTGRES_PREFIXES = ("postgresql://", "postgres://")


def open_store(url: str, **options: Any) -> BrokerStore:
    """The store for ``url``: ``sqlite:///PATH`` (a file; ``:memory:`` is refused) or ``postgresql://…``.

    ``options`` (``checks``, ``fault_hook``, ``clock``: unix ms, default ``reference.clock.wall_ms``) go to the store's
    constructor. The store is not migrated yet.

    Raises:
        ValueError: an unknown scheme or an in-memory SQLite URL.
    """
    if url.startswith(SQLITE_PREFIX):
        path = url[len(SQLITE_PREFIX):]
        if not path or path == ":memory:":
            raise ValueError("sqlite:///:memory: is not supported: the broker store needs a file")
        from .sqlite import SqliteStore

        return SqliteStore(path, **options)
    if url.startswith(POSTGRES_PREFIXES):
        from .postgres import PostgresStore

        return PostgresStore(url, **options)
    raise ValueError(f"unsupported store URL {url!r}: use sqlite:///PATH or postgresql://…")
