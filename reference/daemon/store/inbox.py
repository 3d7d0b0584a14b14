"""``inbox.db``: deduplicated inbound messages (§4.10, §5), cursor paging (E-12), the quarantine of frames the daemon
could not take (E-41) and the SSE event log (E-13). A corrupt file is moved aside and replaced (E-16, E-45)."""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from reference.clock import wall_ms
from reference.core.limits import limit
from reference.state_dir import quarantine_path

from ._cursor import decode_cursor, encode_cursor
from ._sqlite import SqliteStore, StoreError, log


class InboxCorrupt(StoreError):
    """``inbox.db`` fails its integrity check or is not a database (``open_or_quarantine`` replaces it)."""

    def __init__(self, path: Path, detail: str):
        super().__init__(f"{path}: integrity check failed: {detail}")
        self.path = path
        self.detail = detail


# --- inbox ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class InboxMessage:
    """An inbound message as stored (§4.10). ``meta`` is a JSON object; ``received_at`` is unix ms."""

    id: str
    client_message_id: str
    mesh: str
    sender_pubkey: str
    sender_name: str
    received_at: int
    broker_message_id: str | None = None
    topic: str | None = None
    body: str | None = None
    meta: Mapping[str, Any] | None = None
    reply_to_id: str | None = None
    delivery_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class InboxRow(InboxMessage):
    """A stored inbox row with its paging sequence number."""

    seq: int

    @property
    def cursor(self) -> str:
        """The opaque cursor that continues after this row."""
        return inbox_cursor(self.seq)

    def as_dict(self) -> dict[str, Any]:
        # Shallow on purpose: dataclasses.asdict deep-copies meta recursively (a RecursionError on a deep one, E-41).
        record = {name: getattr(self, name) for name in _INBOX_COLUMNS}
        record["meta"] = None if self.meta is None else dict(self.meta)
        return record


@dataclass(frozen=True, kw_only=True)
class QuarantinedFrame:
    """An inbound frame the daemon could not take, kept with why (E-41). Times are unix ms."""

    id: int
    frame_key: bytes
    first_seen_at: int
    last_seen_at: int
    seen: int
    reason: str
    frame_type: str | None
    client_message_id: str | None
    broker_message_id: str | None
    delivery_id: str | None
    acked: bool
    frame_bytes: int
    frame: bytes

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record (the frame as text, undecodable bytes replaced; its key as hex)."""
        record = {name: getattr(self, name) for name in _QUARANTINE_COLUMNS}
        record["frame_key"] = self.frame_key.hex()
        record["frame"] = self.frame.decode("utf-8", errors="replace")
        record["acked"] = bool(self.acked)
        return record


_QUARANTINE_COLUMNS = tuple(f.name for f in fields(QuarantinedFrame))


@dataclass(frozen=True)
class StoredEvent:
    """One persisted SSE event; ``id`` is the SSE ``id:``."""

    id: int
    name: str
    payload: dict[str, Any]
    created_at: int


_INBOX_MESSAGE_COLUMNS = tuple(f.name for f in fields(InboxMessage))
_INBOX_COLUMNS = ("seq", *_INBOX_MESSAGE_COLUMNS)
_INBOX_SELECT = f"SELECT {', '.join(_INBOX_COLUMNS)} FROM inbox"
_INBOX_INSERT = (
    f"INSERT INTO inbox ({', '.join(_INBOX_MESSAGE_COLUMNS)})"
    f" VALUES ({', '.join(':' + c for c in _INBOX_MESSAGE_COLUMNS)})"
    # req: INB-DEDUPE -- one row per client_message_id; a redelivery inserts nothing
    f" ON CONFLICT (client_message_id) DO NOTHING RETURNING {', '.join(_INBOX_COLUMNS)}"
)
_INBOX_CURSOR = re.compile(r"i1:(\d{1,19})")


def inbox_cursor(seq: int) -> str:
    """The opaque inbox cursor naming ``seq`` (E-12)."""
    return encode_cursor(f"i1:{seq}")


def _json_text(value: Mapping[str, Any]) -> str:
    if not isinstance(value, Mapping):
        raise TypeError("expected a JSON object")
    return json.dumps(dict(value), ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _inbox_row(values: Sequence[Any]) -> InboxRow:
    record = dict(zip(_INBOX_COLUMNS, values, strict=True))
    if record["meta"] is not None:
        record["meta"] = json.loads(record["meta"])
    return InboxRow(**record)


def message_event_payload(row: InboxRow) -> dict[str, Any]:
    """The default ``message`` SSE payload: the stored row's members (the IPC layer may pass its own builder)."""
    return row.as_dict()


class InboxStore(SqliteStore):
    """``inbox.db``: deduplicated inbound messages (§4.10, §5), cursor paging (E-12) and the SSE event log (E-13).

    Args:
        path: the database file (created 0600 when missing).
        synchronous: SQLite ``synchronous``; ``FULL`` by default (the row must survive before ``client_ack``).
        clock: unix-ms clock for event timestamps, the E-45 floor and a quarantined file's name.

    Raises:
        InboxCorrupt: the file is not a database or is malformed (see ``open_or_quarantine``).
        SchemaTooNew: the file was migrated by a newer meshd.
    """

    DATABASE = "inbox"

    def __init__(self, path: str | os.PathLike[str], synchronous: str = "FULL", *, busy_timeout_ms: int = 5_000,
                 clock: Callable[[], int] = wall_ms):
        super().__init__(path, synchronous=synchronous, busy_timeout_ms=busy_timeout_ms, clock=clock)

    def _corrupt(self, detail: str) -> StoreError:
        return InboxCorrupt(self.path, detail)

    def _number_above_clock(self) -> None:
        """E-45: an inbox.db recreated after a quarantine numbers its rows (E-12 ``seq``) and SSE events (E-13 ids)
        from a floor of the wall clock in microseconds, above every number the quarantined file can have given out
        (fewer than one per microsecond since it was created): a client's ``since`` cursor or ``Last-Event-ID`` never
        hides what the new file receives, and a resuming stream opens with ``replay_gap`` for what was lost."""
        # req: INBOX-IDS-AFTER-RECREATE
        floor = int(self.clock()) * 1000
        with self._transaction() as conn:
            for name in ("inbox", "events"):
                conn.execute("DELETE FROM sqlite_sequence WHERE name = ?", (name,))
                conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (name, floor))

    @classmethod
    def open_or_quarantine(cls, path: str | os.PathLike[str], **options: Any) -> tuple[InboxStore, Path | None]:
        """Open ``path``; if it is not a database or fails ``PRAGMA integrity_check``, move it aside and start fresh.

        The bad file (and its ``-wal``/``-shm``) is renamed ``inbox.db.corrupt-<unix-ms>`` (E-16). Returns the store
        and the quarantine path, ``None`` when the file was healthy; the daemon logs ``inbox_corruption_recovered``
        when it is not ``None``. ``SchemaTooNew`` and non-corruption errors (a locked file) propagate untouched.
        """
        path = Path(path)
        try:
            store = cls(path, **options)
        except InboxCorrupt:
            pass
        else:
            try:
                store.integrity_check()
                return store, None
            except InboxCorrupt:
                store.close()
        # req: REC-INBOX-QUARANTINE -- renamed inbox.db.corrupt-<ts> and recreated
        quarantined = _quarantine(path, int(options.get("clock", wall_ms)()))
        fresh = cls(path, **options)
        fresh._number_above_clock()
        return fresh, quarantined

    # --- messages ------------------------------------------------------------------------------------------------

    @staticmethod
    def _insert(conn: sqlite3.Connection, message: InboxMessage) -> InboxRow | None:
        record = {name: getattr(message, name) for name in _INBOX_MESSAGE_COLUMNS}
        if record["meta"] is not None:
            record["meta"] = _json_text(record["meta"])
        found = conn.execute(_INBOX_INSERT, record).fetchall()
        return _inbox_row(found[0]) if found else None

    def insert(self, message: InboxMessage) -> InboxRow | None:
        """Store ``message`` unless its client_message_id is already stored; only a new row is returned."""
        with self._transaction() as conn:
            return self._insert(conn, message)

    def insert_with_event(
        self,
        message: InboxMessage,
        payload: Callable[[InboxRow], Mapping[str, Any]] = message_event_payload,
        event_name: str = "message",
        with_row: Callable[[sqlite3.Connection, InboxRow, int], Any] | None = None,
    ) -> tuple[InboxRow, int] | None:
        """Store ``message`` and its SSE event in ONE transaction; ``None`` (and no event) for a duplicate.

        ``with_row(conn, row, event_id)`` writes what else commits with a new row (its hook runs, E-48) on the same
        transaction.
        Returns the row and the event id. The caller sends ``client_ack`` and streams the event afterwards.
        """
        with self._transaction() as conn:
            row = self._insert(conn, message)
            # req: INB-DEDUPE-EVENT, INB-DURABLE-BEFORE-ACK -- the event commits with the new row, before the client_ack
            if row is None:
                return None
            event_id = self._append(conn, event_name, payload(row))
            if with_row is not None:
                # req: HOOK-NEW-ROWS-ONLY -- only a new row gets what commits with it: a redelivery runs no hook
                with_row(conn, row, event_id)
            return row, event_id

    def get(self, inbox_id: str) -> InboxRow | None:
        """The row with this inbox id."""
        with self._reading() as conn:
            found = conn.execute(f"{_INBOX_SELECT} WHERE id = ?", (inbox_id,)).fetchone()
        return None if found is None else _inbox_row(found)

    def by_seq(self, seq: int) -> InboxRow | None:
        """The row with this ``seq`` (a hook run names its message so)."""
        with self._reading() as conn:
            found = conn.execute(f"{_INBOX_SELECT} WHERE seq = ?", (seq,)).fetchone()
        return None if found is None else _inbox_row(found)

    def page(self, cursor: str | None = None, since_ms: int | None = None, topic: str | None = None,
             sender: str | None = None, limit: int = 100) -> tuple[list[InboxRow], str | None]:
        """Rows in ascending ``seq`` after ``cursor``, filtered exactly (E-12).

        ``since_ms`` keeps rows received at or after it; ``topic`` and ``sender`` (a sender pubkey) match exactly.
        ``next_cursor`` is ``None`` when no matching row follows right now; each row's ``cursor`` also continues
        after it, so a consumer that read to the end can remember where it stopped.

        Raises:
            InvalidCursor: ``cursor`` was not produced by this store.
        """
        if limit < 1:
            raise ValueError("limit must be at least 1")
        # req: INBOX-CURSOR -- ascending seq strictly after the cursor: no gaps, no repeats
        after = 0 if cursor is None else int(decode_cursor(cursor, _INBOX_CURSOR).group(1))
        where, params = ["seq > ?"], [after]
        # req: INBOX-FILTERS, INBOX-FILTERS-EXACT
        for clause, value in (("received_at >= ?", since_ms), ("topic = ?", topic), ("sender_pubkey = ?", sender)):
            if value is not None:
                where.append(clause)
                params.append(value)
        sql = f"{_INBOX_SELECT} WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?"
        with self._reading() as conn:
            found = [_inbox_row(r) for r in conn.execute(sql, (*params, limit + 1)).fetchall()]
        rows = found[:limit]
        return rows, (rows[-1].cursor if len(found) > limit else None)

    # --- quarantine (E-41) ----------------------------------------------------------------------------------------

    def quarantine(self, *, frame_key: bytes, frame: bytes, frame_bytes: int, reason: str, now_ms: int,
                   frame_type: str | None = None, client_message_id: str | None = None,
                   broker_message_id: str | None = None, delivery_id: str | None = None,
                   max_rows: int = int(limit("quarantine_max_rows"))) -> tuple[int, bool]:
        """Keep one inbound frame the daemon could not take; a frame seen before (same ``frame_key``) is counted.

        Returns (its quarantine id, whether it is new). Past ``max_rows`` the oldest are deleted (and logged).
        """
        with self._transaction() as conn:
            found = conn.execute(
                "INSERT INTO quarantine (frame_key, first_seen_at, last_seen_at, reason, frame_type, client_message_id,"
                " broker_message_id, delivery_id, frame_bytes, frame) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (frame_key) DO UPDATE SET seen = seen + 1, last_seen_at = excluded.last_seen_at,"
                " reason = excluded.reason RETURNING id, seen",
                (frame_key, now_ms, now_ms, reason, frame_type, client_message_id, broker_message_id, delivery_id,
                 frame_bytes, frame),
            ).fetchone()
            pruned = conn.execute(
                "DELETE FROM quarantine WHERE id <= coalesce("
                " (SELECT id FROM quarantine ORDER BY id DESC LIMIT 1 OFFSET ?), 0)", (max_rows,)).rowcount
        if pruned:
            log.warning("quarantine_pruned rows=%d (the %d newest are kept)", pruned, max_rows)
        return int(found[0]), int(found[1]) == 1

    def mark_quarantine_acked(self, quarantine_id: int) -> None:
        """Record that the broker was told (client_ack) it need not deliver this frame again."""
        with self._transaction() as conn:
            conn.execute("UPDATE quarantine SET acked = 1 WHERE id = ?", (quarantine_id,))

    def quarantined(self, limit: int = 100) -> list[QuarantinedFrame]:
        """The quarantined frames, newest first."""
        with self._reading() as conn:
            found = conn.execute(f"SELECT {', '.join(_QUARANTINE_COLUMNS)} FROM quarantine ORDER BY id DESC LIMIT ?",
                                 (limit,)).fetchall()
        return [QuarantinedFrame(**dict(zip(_QUARANTINE_COLUMNS, row, strict=True))) for row in found]

    def quarantine_count(self) -> int:
        with self._reading() as conn:
            return int(conn.execute("SELECT count(*) FROM quarantine").fetchone()[0])

    # --- SSE events ----------------------------------------------------------------------------------------------

    def _append(self, conn: sqlite3.Connection, name: str, payload: Mapping[str, Any]) -> int:
        # req: SSE-IDS-MONOTONIC -- events.id is AUTOINCREMENT: strictly increasing, never reused
        cursor = conn.execute("INSERT INTO events (name, payload, created_at) VALUES (?, ?, ?)",
                              (name, _json_text(payload), int(self.clock())))
        return int(cursor.lastrowid)

    def append_event(self, name: str, payload: Mapping[str, Any]) -> int:
        """Persist one SSE event and return its id (strictly increasing, never reused). Stream it only afterwards."""
        with self._transaction() as conn:
            return self._append(conn, name, payload)

    def events_after(self, event_id: int, limit: int = 1000) -> list[StoredEvent]:
        """Retained events with id > ``event_id``, in id order (``Last-Event-ID`` replay)."""
        with self._reading() as conn:
            found = conn.execute("SELECT id, name, payload, created_at FROM events WHERE id > ? ORDER BY id LIMIT ?",
                                 (event_id, limit)).fetchall()
        return [StoredEvent(int(i), name, json.loads(payload), int(at)) for i, name, payload, at in found]

    def oldest_event_id(self) -> int | None:
        """The oldest retained event id, ``None`` when none is retained."""
        with self._reading() as conn:
            found = conn.execute("SELECT min(id) FROM events").fetchone()[0]
        return None if found is None else int(found)

    def last_event_id(self) -> int:
        """The last id ever assigned (0 before the first event), retained or pruned."""
        with self._reading() as conn:
            found = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
        return 0 if found is None else int(found[0])

    def prune_events(self, keep_last_n: int | None = None, older_than_ms: int | None = None) -> int:
        """Delete events beyond the newest ``keep_last_n`` and/or created more than ``older_than_ms`` ago.

        Returns how many were deleted. Ids are never reused, so a replay request for a pruned id is detectable
        through ``oldest_event_id`` (E-13 ``replay_gap``).
        """
        if keep_last_n is None and older_than_ms is None:
            raise ValueError("give keep_last_n, older_than_ms or both")
        deleted = 0
        with self._transaction() as conn:
            if keep_last_n is not None:
                if keep_last_n < 0:
                    raise ValueError("keep_last_n must be >= 0")
                deleted += conn.execute(
                    "DELETE FROM events WHERE id <= coalesce("
                    " (SELECT id FROM events ORDER BY id DESC LIMIT 1 OFFSET ?), 0)",
                    (keep_last_n,),
                ).rowcount
            if older_than_ms is not None:
                deleted += conn.execute("DELETE FROM events WHERE created_at < ?",
                                        (int(self.clock()) - older_than_ms,)).rowcount
        return deleted


def _quarantine(path: Path, stamp: int) -> Path:
    """Rename ``path`` and its WAL sidecars to ``<name>.corrupt-<stamp>`` (unix ms; a fresh name, never overwriting)."""
    while True:
        target = quarantine_path(path, stamp)
        if not any(Path(f"{target}{suffix}").exists() for suffix in ("", "-wal", "-shm")):
            break
        stamp += 1
    # The sidecars move too: a stale -wal beside the fresh file would be replayed into it. They keep SQLite's naming
    # (<file>-wal) so the quarantined copy opens with its WAL for forensics.
    for suffix in ("-wal", "-shm", ""):
        source = Path(f"{path}{suffix}")
        if source.exists():
            os.replace(source, Path(f"{target}{suffix}"))
    return target
