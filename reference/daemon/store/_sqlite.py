"""One SQLite file of the daemon's state: connections, pragmas, forward-only migrations and the write transaction.

Rules of this file:

* Every write is one ``BEGIN IMMEDIATE`` transaction, so the read that feeds a decision and the write that records it
  cannot interleave with another writer -- in this process or another one (the CLI may open ``outbox.db`` while the
  daemon runs; ``busy_timeout`` makes it wait).
* Durability boundary = ``COMMIT``. Databases run in WAL mode with ``synchronous=FULL`` by default, so a method that
  returns has fsynced its write.

Threading model: each store owns ONE writer connection guarded by a ``threading.Lock``; every write transaction runs
under that lock (concurrent accepts of one id therefore serialize: the second sees the first's row). Reads use a
small pool of separate connections (WAL readers see the last committed state and never block the writer), so a slow
listing does not hold up an accept. Connections are opened with ``check_same_thread=False`` and are only ever used by
one thread at a time. The ``trace`` hook runs on the committing thread after COMMIT and before the writer lock is
released (trace order = commit order), so it must be quick and must not write to the store.

Schemas are forward-only migrations (``migrations/<db>/NNNN_<name>.sql``) recorded in a ``schema_version`` table; a
database whose version is newer than the newest file here is refused (``SchemaTooNew``), never opened.
"""

from __future__ import annotations

import builtins
import logging
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference.clock import wall_ms

log = logging.getLogger("meshd.store")

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")
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


def schema_version(conn: sqlite3.Connection) -> int:
    """The highest applied migration, 0 for a new database."""
    exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'").fetchone()
    if exists is None:
        return 0
    return int(conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()[0])


def _migrate(conn: sqlite3.Connection, database: str, path: Path, now_ms: int) -> int:
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
                    (step.version, step.name, now_ms),
                )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return known


# --- connections ----------------------------------------------------------------------------------------------------


class SqliteStore:
    """One SQLite file: a locked writer connection, a pool of reader connections, migrations on open.

    ``clock`` (unix ms) stamps what the store writes on its own: applied migrations, the store's own rows' times.
    """

    DATABASE = ""
    _MAX_IDLE_READERS = 8
    trace: Callable[[Any], None] | None = None

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str = "FULL", busy_timeout_ms: int = 5_000,
                 clock: Callable[[], int] = wall_ms):
        self.clock = clock
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
            self.schema_version = _migrate(writer, self.DATABASE, self.path, int(self.clock()))
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
        """A new connection with this store's pragmas (``busy_timeout``, ``synchronous``, foreign keys)."""
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
            # req: IPC-SERIALIZED, IPC-DURABLE-BEFORE-RESPONSE -- one writer at a time; COMMIT fsyncs before any answer
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
