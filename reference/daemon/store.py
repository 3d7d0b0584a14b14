"""Durable storage for the reference daemon: ``outbox.db`` and ``inbox.db`` on SQLite.

Rules of this file:

* The store persists exactly what ``reference.core`` decides. It reads a row, hands it to ``decide_send`` or
  ``apply``, and writes back the row the core returned (``after``, ``successor``); it never interprets a table itself.
* Every write is one ``BEGIN IMMEDIATE`` transaction, so the read that feeds a decision and the write that records it
  cannot interleave with another writer -- in this process or another one (the CLI may open ``outbox.db`` while the
  daemon runs; ``busy_timeout`` makes it wait).
* Durability boundary = ``COMMIT``. Databases run in WAL mode with ``synchronous=FULL`` by default, so a method that
  returns has fsynced its write.

Threading model: each store owns ONE writer connection guarded by a ``threading.Lock``; every write transaction runs
under that lock (concurrent accepts of one id therefore serialize: the second sees the first's row). Reads use a
small pool of separate connections (WAL readers see the last committed state and never block the writer), so a slow
listing does not hold up an accept. Connections are opened with ``check_same_thread=False`` and are only ever used by
one thread at a time. Group commit: ``OutboxStore.accept_batch`` decides several sends in one transaction with one
fsync; ``reference.daemon.committer.GroupCommitter`` gathers concurrent requests into such batches. The outbox
``trace`` hook runs on the committing thread after COMMIT and before the writer lock is released (trace order =
commit order), so it must be quick and must not write to the store.

Schemas are forward-only migrations (``migrations/<db>/NNNN_<name>.sql``) recorded in a ``schema_version`` table; a
database whose version is newer than the newest file here is refused (``SchemaTooNew``), never opened.
"""

from __future__ import annotations

import base64
import binascii
import builtins
import functools
import json
import logging
import operator
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, NamedTuple

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
from reference.core.outbox import STATES

log = logging.getLogger("meshd.store")

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")
ABORT_ACTORS = ("operator", "auto")
_MIGRATION_FILE = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")
_CORRUPTION_ERRORS = frozenset({"SQLITE_NOTADB", "SQLITE_CORRUPT"})
_MIN_SQLITE = (3, 35, 0)  # RETURNING


# --- errors ---------------------------------------------------------------------------------------------------------


class StoreError(Exception):
    """Base class of every error this module raises on purpose."""


class StoreClosed(StoreError):
    """The store was closed."""


class SchemaTooNew(StoreError):
    """The database was written by a newer meshd: its schema version is above the newest migration known here."""

    def __init__(self, path: Path, found: int, known: int):
        super().__init__(
            f"{path}: schema version {found} is newer than this meshd supports ({known}); refusing to open it "
            "(migrations are forward-only: run a meshd that knows this schema)"
        )
        self.path = path
        self.found = found
        self.known = known


class MigrationError(StoreError):
    """A migration failed; the database is left at the version it had."""


class InvalidCursor(StoreError, ValueError):
    """A paging cursor that this store did not produce (or that belongs to another listing)."""


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


class InboxCorrupt(StoreError):
    """``inbox.db`` fails its integrity check or is not a database (``open_or_quarantine`` replaces it)."""

    def __init__(self, path: Path, detail: str):
        super().__init__(f"{path}: integrity check failed: {detail}")
        self.path = path
        self.detail = detail


def is_corruption(exc: BaseException) -> bool:
    """True for SQLite's "not a database" and "malformed" errors (and only those: a locked file is not corrupt)."""
    return isinstance(exc, sqlite3.DatabaseError) and getattr(exc, "sqlite_errorname", "") in _CORRUPTION_ERRORS


# --- migrations -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Migration:
    """One forward-only schema step."""

    version: int
    name: str
    sql: str


def migrations(database: str) -> tuple[Migration, ...]:
    """The migrations for ``database`` (``outbox`` or ``inbox``), numbered 1..n without gaps."""
    found = []
    for path in sorted((MIGRATIONS_DIR / database).glob("*.sql")):
        match = _MIGRATION_FILE.fullmatch(path.name)
        if match is None:
            raise MigrationError(f"{path}: migration files are named NNNN_<name>.sql")
        found.append(Migration(int(match.group(1)), match.group(2), path.read_text(encoding="utf-8")))
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise MigrationError(f"{MIGRATIONS_DIR / database}: migration versions must be 1..n without gaps")
    return tuple(found)


def _statements(sql: str) -> Iterator[str]:
    """Split a script into statements with SQLite's own tokenizer (``executescript`` would COMMIT our transaction)."""
    buffer = ""
    for line in sql.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            yield buffer.strip()
            buffer = ""
    rest = "\n".join(line for line in buffer.splitlines() if line.strip() and not line.strip().startswith("--"))
    if rest:
        raise MigrationError(f"unterminated statement at the end of a migration: {rest[:80]!r}")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def schema_version(conn: sqlite3.Connection) -> int:
    """The highest applied migration, 0 for a new database."""
    exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'").fetchone()
    if exists is None:
        return 0
    return int(conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()[0])


def _migrate(conn: sqlite3.Connection, database: str, path: Path) -> int:
    """Bring ``conn`` to the newest schema in one ``BEGIN IMMEDIATE`` transaction; returns the version."""
    steps = migrations(database)
    known = steps[-1].version if steps else 0
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = schema_version(conn)
        if current > known:
            raise SchemaTooNew(path, current, known)
        if current < known:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version ("
                " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)"
            )
            for step in steps[current:]:
                try:
                    for statement in _statements(step.sql):
                        conn.execute(statement)
                except sqlite3.DatabaseError as exc:
                    if is_corruption(exc):
                        raise
                    raise MigrationError(f"{path}: migration {step.version:04d}_{step.name} failed: {exc}") from exc
                conn.execute(
                    "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)",
                    (step.version, step.name, _now_ms()),
                )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return known


# --- connections ----------------------------------------------------------------------------------------------------


class _SqliteStore:
    """One SQLite file: a locked writer connection, a pool of reader connections, migrations on open."""

    DATABASE = ""
    _MAX_IDLE_READERS = 8
    trace: Callable[[Any], None] | None = None

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str = "FULL", busy_timeout_ms: int = 5_000):
        if sqlite3.sqlite_version_info < _MIN_SQLITE:
            raise StoreError(f"SQLite {sqlite3.sqlite_version} is too old; meshd needs 3.35 or newer (RETURNING)")
        if str(path) == ":memory:" or str(path).startswith("file:"):
            raise ValueError("the store needs a file path: WAL readers and durability need a real file")
        mode = synchronous.upper()
        if mode not in SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}")
        self.path = Path(path)
        self.synchronous = mode
        self.busy_timeout_ms = int(busy_timeout_ms)
        self._lock = threading.Lock()
        self._readers_lock = threading.Lock()
        self._idle_readers: list[sqlite3.Connection] = []
        self._closed = False
        existed = self.path.exists()
        if not existed:
            # §1: the databases are 0600; SQLite gives the -wal and -shm files the mode of the database file.
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        writer = None
        try:
            writer = self._connect()
            if existed:
                # Damage must be found before the migrations read the schema: a mangled schema_version page reads as
                # "no migration applied" and the migration then fails as if the schema were ours to fix.
                found = [row[0] for row in writer.execute("PRAGMA quick_check").fetchall()]
                if found != ["ok"]:
                    raise self._corrupt("; ".join(map(str, found[:5])))
            mode_set = writer.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode_set).lower() != "wal":
                raise StoreError(f"{self.path}: cannot switch to WAL (journal_mode is {mode_set})")
            self.schema_version = _migrate(writer, self.DATABASE, self.path)
            self._writer = writer
        except BaseException as exc:
            if writer is not None:
                writer.close()
            if is_corruption(exc):
                raise self._corrupt(str(exc)) from exc
            raise

    def _corrupt(self, detail: str) -> StoreError:
        """The typed error for a file that is not a database or is malformed."""
        return StoreError(f"{self.path}: {detail}")
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                               timeout=self.busy_timeout_ms / 1000)
        conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed(f"{self.path} is closed")

    @contextmanager
    def _transaction(self, traced: builtins.list[Any] | None = None) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` on the writer, under the writer lock; rolls back on any exception.

        What the block appended to ``traced`` goes to the trace hook after COMMIT but before the lock is released, so
        trace order is commit order even when several threads write.
        """
        with self._lock:
            self._check_open()
            conn = self._writer
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            if traced:
                self._emit(traced)

    def _emit(self, items: Iterable[Any]) -> None:
        # After COMMIT: a failing trace hook must not turn a durable write into an error answer.
        hook = self.trace
        if hook is None:
            return
        for item in items:
            try:
                hook(item)
            except Exception:
                log.exception("trace hook failed")

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """A reader connection from the pool (autocommit: each statement sees the latest commit)."""
        self._check_open()
        with self._readers_lock:
            conn = self._idle_readers.pop() if self._idle_readers else None
        if conn is None:
            conn = self._connect()
            conn.execute("PRAGMA query_only = ON")
        try:
            yield conn
        finally:
            with self._readers_lock:
                keep = not self._closed and len(self._idle_readers) < self._MAX_IDLE_READERS
                if keep:
                    self._idle_readers.append(conn)
            if not keep:
                conn.close()

    def integrity_check(self) -> None:
        """``PRAGMA integrity_check``.

        Raises:
            OutboxCorrupt, InboxCorrupt: with SQLite's report when it is not "ok".
        """
        try:
            with self._reading() as conn:
                report = [str(row[0]) for row in conn.execute("PRAGMA integrity_check").fetchall()]
        except sqlite3.DatabaseError as exc:
            if not is_corruption(exc):
                raise
            raise self._corrupt(str(exc)) from exc
        if report != ["ok"]:
            more = f" (and {len(report) - 10} more)" if len(report) > 10 else ""
            raise self._corrupt("; ".join(report[:10]) + more)

    def close(self) -> None:
        """Close every connection; later calls raise ``StoreClosed``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._writer.close()
        with self._readers_lock:
            idle, self._idle_readers = self._idle_readers, []
        for conn in idle:
            conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# --- cursors --------------------------------------------------------------------------------------------------------


def _encode_cursor(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode("utf-8")).decode("ascii").rstrip("=")


def _decode_cursor(cursor: str, pattern: re.Pattern[str]) -> re.Match[str]:
    if not isinstance(cursor, str) or not cursor or len(cursor) > 512:
        raise InvalidCursor("invalid cursor")
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("utf-8")
    except (binascii.Error, ValueError) as exc:
        raise InvalidCursor("invalid cursor") from exc
    match = pattern.fullmatch(text)
    if match is None:
        raise InvalidCursor("invalid cursor")
    return match


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
_EXPIRED_WHERE = "status = 'pending' AND max_age_at IS NOT NULL AND max_age_at < ?"


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


class AcceptItem(NamedTuple):
    """One send for ``accept_batch``: the validated request and the ids the IPC adapter minted."""

    request: SendRequest
    client_message_id: str
    outbox_id: str
    now_ms: int


class _Prepared(NamedTuple):
    client_message_id: str
    outbox_id: str
    now_ms: int
    fingerprint: bytes
    payload: bytes


Accepted = tuple[IpcDecision, Transition | None]
TraceHook = Callable[[IpcDecision | Transition], None]


class OutboxStore(_SqliteStore):
    """``outbox.db``: the §4.5.1 accept, the outbox lifecycle, requeue, expiry and crash recovery.

    Args:
        path: the database file (created 0600 when missing).
        policy: retry timing and max age handed to the core for every row.
        synchronous: SQLite ``synchronous``; ``FULL`` (the default) fsyncs every commit.
        trace: called after each commit with every ``IpcDecision`` and ``Transition`` (also ignore/reject ones);
            its exceptions are logged, never raised.

    Raises:
        OutboxCorrupt: the file is not a database or is malformed.
        SchemaTooNew: the file was migrated by a newer meshd.
    """

    DATABASE = "outbox"

    def __init__(self, path: str | os.PathLike[str], policy: OutboxPolicy, synchronous: str = "FULL", *,
                 busy_timeout_ms: int = 5_000, trace: TraceHook | None = None):
        self.policy = policy
        self.trace = trace
        super().__init__(path, synchronous=synchronous, busy_timeout_ms=busy_timeout_ms)

    def _corrupt(self, detail: str) -> StoreError:
        return OutboxCorrupt(self.path, detail)

    # --- accept (§4.5.1 steps 3-6) -------------------------------------------------------------------------------

    def accept(self, request: SendRequest, client_message_id: str, outbox_id: str, now_ms: int) -> Accepted:
        """Decide one send under ``BEGIN IMMEDIATE`` and insert its row when the table says so.

        Returns the decision and, for a new row, the ``OB-NONE-ACCEPT`` transition. The row is durable on return.
        """
        return self.accept_batch([AcceptItem(request, client_message_id, outbox_id, now_ms)])[0]

    def accept_batch(self, items: Iterable[AcceptItem | tuple[SendRequest, str, str, int]]) -> list[Accepted]:
        """Decide several sends in ONE transaction (group commit: one fsync for all of them).

        Items are decided in order, each seeing the rows the earlier ones inserted, so two items with the same
        client_message_id behave exactly as two sequential ``accept`` calls. All or nothing: if any statement fails
        the whole batch is rolled back and the exception raised (callers may then retry items one by one).
        """
        prepared = [self._prepare(AcceptItem(*item)) for item in items]
        if not prepared:
            return []
        results: list[Accepted] = []
        traced: list[IpcDecision | Transition] = []
        with self._transaction(traced) as conn:
            # Few statements per batch, not two per item: each one hands the GIL over, and under load getting it
            # back is what a request waits for. ``rows`` is what a sequential SELECT would see at each item.
            rows = self._load_many(conn, "client_message_id", {item.client_message_id for item in prepared})
            inserts: list[OutboxRow] = []
            for item in prepared:
                existing = rows.get(item.client_message_id)
                decision = decide_send(existing, item.fingerprint, item.client_message_id)
                transition = None
                if decision.insert:
                    row = new_row(item.outbox_id, item.client_message_id, item.fingerprint, item.payload,
                                  item.now_ms, self.policy)
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
    def _prepare(item: AcceptItem) -> _Prepared:
        # Pure CPU work stays outside the writer lock.
        return _Prepared(item.client_message_id, item.outbox_id, item.now_ms, item.request.fingerprint(),
                         item.request.payload())

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
                raise NewIdInUse(successor.client_message_id, holder.id)
        after = result.after
        assert after is not None
        before = result.before.__dict__ if result.before is not None and result.before.id == after.id else {}
        changed = tuple(c for c in _OUTBOX_COLUMNS if c != "id" and (c not in before or before[c] != after.__dict__[c]))
        if conn.execute(_outbox_update(changed), {c: after.__dict__[c] for c in ("id", *changed)}).rowcount != 1:
            raise StoreError(f"outbox row {result.after.id!r} vanished inside its transaction")
        if successor is not None:
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
        return self._apply_each("status = 'inflight'", (), OutboxEvent("crash_recovery", now_ms))

    def cap_max_age(self, max_age_ms: int) -> int:
        """Adopt the negotiated max age (§4.9): new rows get it; live rows' ``max_age_at`` is lowered, never raised.

        Returns how many pending or inflight rows were capped.
        """
        if max_age_ms <= 0 or max_age_ms % 3_600_000:
            raise ValueError("max_age_ms must be a positive whole number of hours")
        with self._transaction() as conn:
            self.policy = replace(self.policy, max_age_hours=max_age_ms // 3_600_000)
            return conn.execute(
                "UPDATE outbox SET max_age_at = enqueued_at + :age"
                " WHERE status IN ('pending', 'inflight')"
                " AND (max_age_at IS NULL OR max_age_at > enqueued_at + :age)",
                {"age": max_age_ms},
            ).rowcount

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
            match = _decode_cursor(cursor, _OUTBOX_CURSOR)
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
            next_cursor = _encode_cursor(f"o1:{last.enqueued_at}:{last.id}")
        return rows, next_cursor


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
    f" ON CONFLICT (client_message_id) DO NOTHING RETURNING {', '.join(_INBOX_COLUMNS)}"
)
_INBOX_CURSOR = re.compile(r"i1:(\d{1,19})")


def inbox_cursor(seq: int) -> str:
    """The opaque inbox cursor naming ``seq`` (E-12)."""
    return _encode_cursor(f"i1:{seq}")


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


class InboxStore(_SqliteStore):
    """``inbox.db``: deduplicated inbound messages (§4.10, §5), cursor paging (E-12) and the SSE event log (E-13).

    Args:
        path: the database file (created 0600 when missing).
        synchronous: SQLite ``synchronous``; ``FULL`` by default (the row must survive before ``client_ack``).
        clock: unix-ms clock for event timestamps.

    Raises:
        InboxCorrupt: the file is not a database or is malformed (see ``open_or_quarantine``).
        SchemaTooNew: the file was migrated by a newer meshd.
    """

    DATABASE = "inbox"

    def __init__(self, path: str | os.PathLike[str], synchronous: str = "FULL", *, busy_timeout_ms: int = 5_000,
                 clock: Callable[[], int] = _now_ms):
        self.clock = clock
        super().__init__(path, synchronous=synchronous, busy_timeout_ms=busy_timeout_ms)

    def _corrupt(self, detail: str) -> StoreError:
        return InboxCorrupt(self.path, detail)

    def _number_above_clock(self) -> None:
        """E-45: an inbox.db recreated after a quarantine numbers its rows (E-12 ``seq``) and SSE events (E-13 ids)
        from a floor of the wall clock in microseconds, above every number the quarantined file can have given out
        (fewer than one per microsecond since it was created): a client's ``since`` cursor or ``Last-Event-ID`` never
        hides what the new file receives, and a resuming stream opens with ``replay_gap`` for what was lost."""
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
        quarantined = _quarantine(path)
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
    ) -> tuple[InboxRow, int] | None:
        """Store ``message`` and its SSE event in ONE transaction; ``None`` (and no event) for a duplicate.

        Returns the row and the event id. The caller sends ``client_ack`` and streams the event afterwards.
        """
        with self._transaction() as conn:
            row = self._insert(conn, message)
            if row is None:
                return None
            return row, self._append(conn, event_name, payload(row))

    def get(self, inbox_id: str) -> InboxRow | None:
        """The row with this inbox id."""
        with self._reading() as conn:
            found = conn.execute(f"{_INBOX_SELECT} WHERE id = ?", (inbox_id,)).fetchone()
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
        after = 0 if cursor is None else int(_decode_cursor(cursor, _INBOX_CURSOR).group(1))
        where, params = ["seq > ?"], [after]
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
                   max_rows: int = 10_000) -> tuple[int, bool]:
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


def _quarantine(path: Path) -> Path:
    """Rename ``path`` and its WAL sidecars to ``<name>.corrupt-<unix-ms>`` (a fresh name, never overwriting)."""
    stamp = _now_ms()
    while True:
        target = path.with_name(f"{path.name}.corrupt-{stamp}")
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
