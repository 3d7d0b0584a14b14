"""``outbox.db``: the §4.5.1 accept, the outbox lifecycle, requeue, expiry and crash recovery.

The store persists exactly what ``reference.core`` decides. It reads a row, hands it to ``decide_send`` or ``apply``,
and writes back the row the core returned (``after``, ``successor``); it never interprets a table itself. Group commit:
``OutboxStore.accept_batch`` decides several sends in one transaction with one fsync;
``reference.daemon.committer.GroupCommitter`` gathers concurrent requests into such batches.
"""

from __future__ import annotations

import builtins
import functools
import operator
import os
import re
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from reference.clock import wall_ms
from reference.core import (
    IpcDecision,
    OutboxEvent,
    OutboxPolicy,
    OutboxRow,
    SendRequest,
    Transition,
    TransitionError,
    accepted,
    apply,
    decide_send,
    is_expired,
    new_row,
)
from reference.core.maxage import capped_max_age_at
from reference.core.outbox import STATES, TERMINAL

from ._cursor import decode_cursor, encode_cursor
from ._sqlite import SqliteStore, StoreError

ABORT_ACTORS = ("operator", "auto")


# --- errors ---------------------------------------------------------------------------------------------------------


class OutboxRowNotFound(StoreError, LookupError):
    """No outbox row has this id (or client_message_id); the IPC adapter answers 404 ``outbox_row_not_found``."""

    def __init__(self, key: str):
        super().__init__(f"no outbox row for {key!r}")
        self.key = key


class AmbiguousOutboxKey(StoreError, LookupError):
    """``transition(key)`` without ``by=``: ``key`` is one row's id and another row's client_message_id."""

    def __init__(self, key: str):
        super().__init__(f"{key!r} is both an outbox id and another row's client_message_id; pass by=")
        self.key = key


class NewIdInUse(StoreError):
    """Requeue: the new client_message_id is already daemon-consumed (409 ``requeue_new_id_in_use``, E-09)."""

    def __init__(self, client_message_id: str, existing_id: str):
        super().__init__(f"client_message_id {client_message_id!r} is already bound to outbox row {existing_id!r}")
        self.client_message_id = client_message_id
        self.existing_id = existing_id


class OutboxCorrupt(StoreError):
    """``outbox.db`` fails its integrity check or is not a database; the daemon refuses to start (exit 5, E-16)."""

    def __init__(self, path: Path, detail: str):
        super().__init__(f"{path}: integrity check failed: {detail}")
        self.path = path
        self.detail = detail


# --- outbox ---------------------------------------------------------------------------------------------------------

_OUTBOX_COLUMNS = tuple(f.name for f in fields(OutboxRow))
_OUTBOX_SELECT = f"SELECT {', '.join(_OUTBOX_COLUMNS)} FROM outbox"
_OUTBOX_INSERT = (
    f"INSERT INTO outbox ({', '.join(_OUTBOX_COLUMNS)}) VALUES ({', '.join(':' + c for c in _OUTBOX_COLUMNS)})"
)
_OUTBOX_CURSOR = re.compile(r"o1:(\d{1,19}):(.+)", re.DOTALL)
_KEY_COLUMNS = {"id": "id", "client_message_id": "client_message_id"}
_DUE_WHERE = "status = 'pending' AND next_attempt_at <= ?"
_DUE_ORDER = "ORDER BY next_attempt_at, enqueued_at, id"
# req: OBX-MAX-AGE-DEAD -- pending rows only: an inflight row's ack may still come
_EXPIRED_WHERE = "status = 'pending' AND max_age_at IS NOT NULL AND max_age_at < ?"
_LIVE_STATES = tuple(state for state in STATES if state not in TERMINAL)
_LIVE_DEADLINES = (
    f"SELECT id, enqueued_at, max_age_at FROM outbox WHERE status IN ({', '.join('?' * len(_LIVE_STATES))})"
)


def _outbox_row(values: Sequence[Any]) -> OutboxRow:
    record = dict(zip(_OUTBOX_COLUMNS, values, strict=True))
    record["request_fingerprint"] = bytes(record["request_fingerprint"])
    record["payload"] = bytes(record["payload"])
    return OutboxRow(**record)


_outbox_values = operator.attrgetter(*_OUTBOX_COLUMNS)  # positional, in column order
_ROWS_PER_STATEMENT = 64  # x 16 columns stays far below SQLite's bound-parameter limit


@functools.cache
def _outbox_insert_many(count: int) -> str:
    """``INSERT`` of ``count`` rows in one statement (one step, one GIL hand-off)."""
    row = "(" + ", ".join("?" * len(_OUTBOX_COLUMNS)) + ")"
    return f"INSERT INTO outbox ({', '.join(_OUTBOX_COLUMNS)}) VALUES " + ", ".join([row] * count)


@functools.cache
def _outbox_select_many(column: str, count: int) -> str:
    """The rows whose ``column`` is any of ``count`` values."""
    return f"{_OUTBOX_SELECT} WHERE {column} IN ({', '.join('?' * count)})"


@functools.cache
def _outbox_update(columns: tuple[str, ...]) -> str:
    """``UPDATE`` of just these columns: SQLite then maintains only the indexes that cover them."""
    if not columns:
        return "UPDATE outbox SET id = id WHERE id = :id"  # still proves the row exists (rowcount 1)
    return "UPDATE outbox SET " + ", ".join(f"{c} = :{c}" for c in columns) + " WHERE id = :id"


def _outbox_params(row: OutboxRow) -> dict[str, Any]:
    # A shallow mapping: dataclasses.asdict deep-copies every value and dominated the cost of a batch.
    return {name: getattr(row, name) for name in _OUTBOX_COLUMNS}


@dataclass(frozen=True, slots=True)
class AcceptItem:
    """One send for the group commit and ``accept_batch`` (§4.5.1 steps 3-6), built on the request's thread.

    ``client_message_id`` and ``request_fingerprint`` are what the lookup compares; ``outbox_id``, ``payload`` and
    ``enqueued_at`` (unix ms) make the row when the table says insert.
    """

    client_message_id: str
    request_fingerprint: bytes
    payload: bytes
    outbox_id: str
    enqueued_at: int

    @classmethod
    def of(cls, request: SendRequest, client_message_id: str, outbox_id: str, now_ms: int) -> AcceptItem:
        """The item for a validated request, with the ids the IPC adapter minted."""
        return cls(client_message_id, request.fingerprint(), request.payload(), outbox_id, now_ms)


Accepted = tuple[IpcDecision, Transition | None]
TraceHook = Callable[[IpcDecision | Transition], None]


class OutboxStore(SqliteStore):
    """``outbox.db``: the §4.5.1 accept, the outbox lifecycle, requeue, expiry and crash recovery.

    Args:
        path: the database file (created 0600 when missing).
        policy: retry timing and max age handed to the core for every row.
        synchronous: SQLite ``synchronous``; ``FULL`` (the default) fsyncs every commit.
        trace: called after each commit with every ``IpcDecision`` and ``Transition`` (also ignore/reject ones);
            its exceptions are logged, never raised.
        clock: unix-ms clock for the times the store writes on its own (applied migrations).

    Raises:
        OutboxCorrupt: the file is not a database or is malformed.
        SchemaTooNew: the file was migrated by a newer meshd.
    """

    DATABASE = "outbox"

    def __init__(self, path: str | os.PathLike[str], policy: OutboxPolicy, synchronous: str = "FULL", *,
                 busy_timeout_ms: int = 5_000, trace: TraceHook | None = None, clock: Callable[[], int] = wall_ms):
        self.policy = policy
        self.trace = trace
        super().__init__(path, synchronous=synchronous, busy_timeout_ms=busy_timeout_ms, clock=clock)

    def _corrupt(self, detail: str) -> StoreError:
        return OutboxCorrupt(self.path, detail)

    # --- accept (§4.5.1 steps 3-6) -------------------------------------------------------------------------------

    def accept(self, request: SendRequest, client_message_id: str, outbox_id: str, now_ms: int) -> Accepted:
        """Decide one send under ``BEGIN IMMEDIATE`` and insert its row when the table says so.

        Returns the decision and, for a new row, the ``OB-NONE-ACCEPT`` transition. The row is durable on return.
        """
        return self.accept_batch([AcceptItem.of(request, client_message_id, outbox_id, now_ms)])[0]

    def accept_batch(self, items: Iterable[AcceptItem]) -> list[Accepted]:
        """Decide several sends in ONE transaction (group commit: one fsync for all of them).

        Items are decided in order, each seeing the rows the earlier ones inserted, so two items with the same
        client_message_id behave exactly as two sequential ``accept`` calls. All or nothing: if any statement fails
        the whole batch is rolled back and the exception raised (callers may then retry items one by one).
        """
        batch = list(items)
        if not batch:
            return []
        results: list[Accepted] = []
        traced: list[IpcDecision | Transition] = []
        with self._transaction(traced) as conn:
            # Few statements per batch, not two per item: each one hands the GIL over, and under load getting it
            # back is what a request waits for. ``rows`` is what a sequential SELECT would see at each item.
            rows = self._load_many(conn, "client_message_id", {item.client_message_id for item in batch})
            inserts: list[OutboxRow] = []
            for item in batch:
                existing = rows.get(item.client_message_id)
                # req: IPC-SERIALIZED -- the lookup reads under the same BEGIN IMMEDIATE as the insert
                decision = decide_send(existing, item.request_fingerprint, item.client_message_id)
                transition = None
                if decision.insert:
                    # req: IPC-NEW-ROW, FP-FROZEN -- the fingerprint computed at accept is stored with the row
                    row = new_row(item.outbox_id, item.client_message_id, item.request_fingerprint, item.payload,
                                  item.enqueued_at, self.policy)
                    rows[item.client_message_id] = row
                    inserts.append(row)
                    transition = accepted(row)
                results.append((decision, transition))
                traced += [decision] if transition is None else [decision, transition]
            for start in range(0, len(inserts), _ROWS_PER_STATEMENT):
                chunk = inserts[start:start + _ROWS_PER_STATEMENT]
                conn.execute(_outbox_insert_many(len(chunk)), [value for row in chunk for value in _outbox_values(row)])
        return results

    @staticmethod
    def _load_many(conn: sqlite3.Connection, column: str, keys: builtins.set[str]) -> dict[str, OutboxRow]:
        """The rows whose ``column`` (``id`` or ``client_message_id``) is one of ``keys``, by that key."""
        found: dict[str, OutboxRow] = {}
        ordered = sorted(keys)
        for start in range(0, len(ordered), _ROWS_PER_STATEMENT):
            chunk = ordered[start:start + _ROWS_PER_STATEMENT]
            for values in conn.execute(_outbox_select_many(_KEY_COLUMNS[column], len(chunk)), chunk).fetchall():
                row = _outbox_row(values)
                found[getattr(row, column)] = row
        return found

    # --- reads ---------------------------------------------------------------------------------------------------

    @staticmethod
    def _load(conn: sqlite3.Connection, column: str, key: str) -> OutboxRow | None:
        found = conn.execute(f"{_OUTBOX_SELECT} WHERE {_KEY_COLUMNS[column]} = ?", (key,)).fetchone()
        return None if found is None else _outbox_row(found)

    def get(self, outbox_id: str) -> OutboxRow | None:
        """The row with this outbox id."""
        with self._reading() as conn:
            return self._load(conn, "id", outbox_id)

    def get_by_client_message_id(self, client_message_id: str) -> OutboxRow | None:
        """The row bound to this client_message_id (the id is daemon-consumed iff it exists, §4.1)."""
        with self._reading() as conn:
            return self._load(conn, "client_message_id", client_message_id)

    def counts(self) -> dict[str, int]:
        """Rows per status; every status is present."""
        with self._reading() as conn:
            found = dict(conn.execute("SELECT status, count(*) FROM outbox GROUP BY status").fetchall())
        return {state: int(found.get(state, 0)) for state in STATES}

    def health(self) -> tuple[dict[str, int], int | None]:
        """``counts()`` and ``oldest_pending_enqueued_at()`` from one read (one statement, one snapshot)."""
        with self._reading() as conn:
            found = conn.execute("SELECT status, count(*), min(enqueued_at) FROM outbox GROUP BY status").fetchall()
        counts = {state: 0 for state in STATES}
        oldest = None
        for status, count, first in found:
            counts[status] = int(count)
            if status == "pending":
                oldest = first
        return counts, oldest

    def oldest_pending_enqueued_at(self) -> int | None:
        """``enqueued_at`` of the oldest pending row (for /v1/health ``lag_ms``), ``None`` when none is pending."""
        with self._reading() as conn:
            (value,) = conn.execute("SELECT min(enqueued_at) FROM outbox WHERE status = 'pending'").fetchone()
        return value

    def due(self, now_ms: int, limit: int = 32) -> list[OutboxRow]:
        """Pending rows with ``next_attempt_at <= now_ms``, oldest first (by ``next_attempt_at``, then enqueue)."""
        with self._reading() as conn:
            found = conn.execute(f"{_OUTBOX_SELECT} WHERE {_DUE_WHERE} {_DUE_ORDER} LIMIT ?",
                                 (now_ms, limit)).fetchall()
        return [_outbox_row(r) for r in found]

    # --- lifecycle -----------------------------------------------------------------------------------------------

    def transition(self, key: str, event: OutboxEvent, *, by: str | None = None) -> Transition:
        """Apply ``event`` to one row in one ``BEGIN IMMEDIATE`` transaction and persist the core's result.

        ``by`` is ``"id"`` or ``"client_message_id"``; without it ``key`` may be either, and a key that names two
        different rows raises ``AmbiguousOutboxKey``. Only ``outcome == "transition"`` writes anything.

        Raises:
            OutboxRowNotFound: no row for ``key``.
            NewIdInUse: a requeue whose successor id is already daemon-consumed.
            TransitionError: the core says the pair is impossible.
        """
        traced: list[Transition] = []
        with self._transaction(traced) as conn:
            row = self._resolve(conn, key, by)
            result = apply(row, event, self.policy)
            if result.outcome == "transition":
                self._persist(conn, result)
            traced.append(result)
        return result

    def transition_many(self, changes: Sequence[tuple[str, OutboxEvent]], *, by: str
                        ) -> builtins.list[Transition | OutboxRowNotFound | TransitionError]:
        """Apply each ``(key, event)`` in order in ONE transaction, as consecutive ``transition`` calls would.

        Each change sees the writes of the ones before it. A key without a row, or a pair the core refuses, takes its
        exception's place in the result and writes nothing; the other changes go ahead. Any other failure (including
        ``NewIdInUse``) rolls the whole batch back and is raised.
        """
        if by not in _KEY_COLUMNS:
            raise ValueError("by must be 'id' or 'client_message_id'")
        results: builtins.list[Transition | OutboxRowNotFound | TransitionError] = []
        traced: builtins.list[Transition] = []
        with self._transaction(traced) as conn:
            rows = self._load_many(conn, by, {key for key, _ in changes})  # what each change would SELECT, kept current
            for key, event in changes:
                row = rows.get(key)
                try:
                    if row is None:
                        raise OutboxRowNotFound(key)
                    result = apply(row, event, self.policy)
                except (OutboxRowNotFound, TransitionError) as exc:
                    results.append(exc)
                    continue
                if result.outcome == "transition":
                    self._persist(conn, result)
                    for written in (result.after, result.successor):
                        if written is not None:
                            rows[getattr(written, by)] = written
                traced.append(result)
                results.append(result)
        return results

    def drain(self, now_ms: int, limit: int) -> tuple[builtins.list[Transition], builtins.list[Transition]]:
        """The drain loop's write, in ONE transaction: ``expire`` (E-14), then ``dispatch`` up to ``limit`` due rows.

        Returns (the expiry transitions, the dispatch transitions), as ``expire`` followed by ``transition(row.id,
        dispatch)`` for each row of ``due(now_ms, limit)`` would; every dispatched row is ``inflight`` on return, so
        its frame may be sent.
        """
        expired: builtins.list[Transition] = []
        dispatched: builtins.list[Transition] = []
        traced: builtins.list[Transition] = []
        with self._transaction(traced) as conn:
            expiry = OutboxEvent("max_age_exceeded", now_ms)
            for values in conn.execute(f"{_OUTBOX_SELECT} WHERE {_EXPIRED_WHERE} ORDER BY enqueued_at, id",
                                       (now_ms,)).fetchall():
                row = _outbox_row(values)
                if is_expired(row, now_ms):
                    result = apply(row, expiry, self.policy)
                    if result.outcome == "transition":
                        self._persist(conn, result)
                    expired.append(result)
            dispatch = OutboxEvent("dispatch", now=now_ms)
            for values in conn.execute(f"{_OUTBOX_SELECT} WHERE {_DUE_WHERE} {_DUE_ORDER} LIMIT ?",
                                       (now_ms, limit)).fetchall():
                result = apply(_outbox_row(values), dispatch, self.policy)
                if result.outcome == "transition":
                    self._persist(conn, result)
                dispatched.append(result)
            traced += expired + dispatched
        return expired, dispatched

    def _resolve(self, conn: sqlite3.Connection, key: str, by: str | None) -> OutboxRow:
        if by is not None:
            if by not in _KEY_COLUMNS:
                raise ValueError("by must be 'id' or 'client_message_id'")
            row = self._load(conn, by, key)
        else:
            found = conn.execute(f"{_OUTBOX_SELECT} WHERE id = ? OR client_message_id = ? LIMIT 2",
                                 (key, key)).fetchall()
            if len(found) > 1:
                raise AmbiguousOutboxKey(key)
            row = _outbox_row(found[0]) if found else None
        if row is None:
            raise OutboxRowNotFound(key)
        return row

    def _persist(self, conn: sqlite3.Connection, result: Transition) -> None:
        successor = result.successor
        if successor is not None:
            holder = self._load(conn, "client_message_id", successor.client_message_id)
            if holder is not None:
                # req: REQUEUE-NEW-ID-IN-USE
                raise NewIdInUse(successor.client_message_id, holder.id)
        after = result.after
        assert after is not None
        before = result.before.__dict__ if result.before is not None and result.before.id == after.id else {}
        changed = tuple(c for c in _OUTBOX_COLUMNS if c != "id" and (c not in before or before[c] != after.__dict__[c]))
        # req: ID-CONSUMED-NEVER-FREED -- a transition updates its row in place; no path deletes an outbox row
        if conn.execute(_outbox_update(changed), {c: after.__dict__[c] for c in ("id", *changed)}).rowcount != 1:
            raise StoreError(f"outbox row {result.after.id!r} vanished inside its transaction")
        if successor is not None:
            # req: REQUEUE-ATOMIC -- in the transaction that aborts the old row
            conn.execute(_OUTBOX_INSERT, _outbox_params(successor))

    def requeue(self, outbox_id: str, new_client_message_id: str, successor_id: str, now_ms: int,
                actor: str = "operator") -> Transition:
        """§4.5.3 / E-09: retire a ``pending`` or ``dead`` row and insert its successor, atomically.

        Returns the ``reject`` transition (nothing written, ``error == "outbox_requeue_state_invalid"``) for any
        other state.

        Raises:
            OutboxRowNotFound: unknown ``outbox_id`` (404 ``outbox_row_not_found``).
            NewIdInUse: ``new_client_message_id`` already has a row (409 ``requeue_new_id_in_use``).
        """
        if actor not in ABORT_ACTORS:
            raise ValueError(f"actor must be one of {', '.join(ABORT_ACTORS)}")
        event = OutboxEvent("requeue", now_ms, actor=actor, successor_id=successor_id,
                            successor_client_message_id=new_client_message_id)
        return self.transition(outbox_id, event, by="id")

    def _apply_each(self, where: str, params: tuple[Any, ...], event: OutboxEvent,
                    keep: Callable[[OutboxRow], bool] = lambda row: True) -> list[Transition]:
        results: list[Transition] = []
        with self._transaction(results) as conn:
            rows = [_outbox_row(r) for r in conn.execute(f"{_OUTBOX_SELECT} WHERE {where} ORDER BY enqueued_at, id",
                                                         params).fetchall()]
            for row in rows:
                if not keep(row):
                    continue
                result = apply(row, event, self.policy)
                if result.outcome == "transition":
                    self._persist(conn, result)
                results.append(result)
        return results

    def expire(self, now_ms: int) -> list[Transition]:
        """Every pending row past its max age goes ``dead`` (``max_age_exceeded``, E-14), in one transaction."""
        return self._apply_each(_EXPIRED_WHERE, (now_ms,),
                                OutboxEvent("max_age_exceeded", now_ms), keep=lambda row: is_expired(row, now_ms))

    def recover(self, now_ms: int) -> list[Transition]:
        """Crash recovery (§4.11, E-16): in one transaction every inflight row goes back to pending, same attempts."""
        # req: REC-INFLIGHT-TO-PENDING, REC-ATTEMPTS-UNCHANGED -- the table's crash_recovery row keeps attempts
        return self._apply_each("status = 'inflight'", (), OutboxEvent("crash_recovery", now_ms))

    def cap_max_age(self, max_age_hours: int) -> int:
        """Adopt the negotiated max age (§4.9): new rows get it; live rows' ``max_age_at`` is lowered, never raised.

        The core decides each live row's deadline (``capped_max_age_at``); the read and the writes are one
        transaction. Returns how many pending or inflight rows were capped.
        """
        if isinstance(max_age_hours, bool) or not isinstance(max_age_hours, int) or max_age_hours <= 0:
            raise ValueError("max_age_hours must be a positive whole number of hours")
        with self._transaction() as conn:
            self.policy = replace(self.policy, max_age_hours=max_age_hours)
            capped = []
            for outbox_id, enqueued_at, current in conn.execute(_LIVE_DEADLINES, _LIVE_STATES).fetchall():
                deadline = capped_max_age_at(enqueued_at, current, max_age_hours)
                if deadline is not None:
                    capped.append((deadline, outbox_id))
            conn.executemany("UPDATE outbox SET max_age_at = ? WHERE id = ?", capped)
        return len(capped)

    # ``list`` comes last: inside the class body its name shadows the builtin.
    def list(self, status: str | None = None, limit: int = 50, cursor: str | None = None
             ) -> tuple[builtins.list[OutboxRow], str | None]:
        """Rows newest first by ``(enqueued_at, id)``, optionally of one status.

        ``next_cursor`` is opaque and continues strictly after the last row returned; it is ``None`` when no row
        follows. Rows inserted later sort before the cursor and so never shift a listing in progress.

        Raises:
            InvalidCursor: ``cursor`` was not produced by this method.
        """
        if status is not None and status not in STATES:
            raise ValueError(f"status must be one of {', '.join(STATES)}")
        if limit < 1:
            raise ValueError("limit must be at least 1")
        where, params = [], []
        if status is not None:
            where.append("status = ?")
            params.append(status)
        if cursor is not None:
            match = decode_cursor(cursor, _OUTBOX_CURSOR)
            where.append("(enqueued_at, id) < (?, ?)")
            params += [int(match.group(1)), match.group(2)]
        sql = _OUTBOX_SELECT + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY enqueued_at DESC, id DESC LIMIT ?"
        with self._reading() as conn:
            found = [_outbox_row(r) for r in conn.execute(sql, (*params, limit + 1)).fetchall()]
        rows = found[:limit]
        next_cursor = None
        if len(found) > limit:
            last = rows[-1]
            next_cursor = encode_cursor(f"o1:{last.enqueued_at}:{last.id}")
        return rows, next_cursor
