"""The engine-neutral half of the SQL stores: the §4.7.2 accept algorithm and the maintenance jobs, run over DB-API.

Theory of operation. An engine subclass supplies (1) ``SQL``, its named statements (kept in the engine's module, next
to the code that runs them), (2) how to open a connection and begin a read or a write transaction, (3) how to run a
migration script under its lock, and optionally (4) a pipeline (``_pipeline``) that sends statements without waiting
for each answer. This class supplies the algorithm once, so both engines decide identically. ``accept`` is
``accept_batch`` of one send; ``accept_batch`` is group commit:

* The sends are split into groups in which every (mesh_id, client_message_id) appears once; a repeated key waits for
  a later group, so a duplicate is only ever answered from a committed dedupe row (exactly as without grouping). Each
  group runs in key order, so two concurrent groups on PostgreSQL take their dedupe rows' locks in the same order
  and cannot deadlock each other.
* One write transaction per group. First B1's reads for every send (mesh policy and membership, one read per
  sender), before any send writes. Then per send: the rest of B1 in code -- mesh exists, sender is a member,
  destination kind valid, body size, the broker's fingerprint recomputation (a meta that cannot be canonicalised is
  a schema failure), the rate limit last (the mesh is checked before membership so an unknown mesh answers 404
  mesh_not_found rather than 403; the schema check proper is the caller's); the drift check (E-21, a 409 before any
  write); then, from the send's own savepoint (named by its position in the group, so rolling back to it can never
  reach an earlier send): claim the dedupe key (INSERT … ON CONFLICT DO NOTHING), read the row back (the engine locks
  it), B2 destination check, message / history / delivery inserts.
* After each step the known inputs go to ``reference.core.broker_accept.settle``; the first ``Settled`` answer ends
  the send as its ``transaction`` field says: ``rollback`` rolls back to the send's savepoint (the store is as if the
  send never came), ``commit`` leaves its rows for the group's COMMIT. An exception inside a send rolls back to its
  savepoint and answers 500 internal_error (BRK-COMMIT-FAIL once B2 passed).
* One COMMIT for the group (nothing to commit: a ROLLBACK). Every answer is returned only after it, so no 201 is
  acknowledged before its rows are durable; if it fails, every 201 of the group becomes a 500 BRK-COMMIT-FAIL and
  nothing of the group remains. The other answers stand: they depended on no row of this transaction.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from importlib import resources
from typing import Any, ClassVar

from reference.clock import wall_ms
from reference.core import broker_accept
from reference.core.fingerprint import (
    FingerprintInput,
    MetaError,
    fingerprint_prefix,
    meta_canonical,
    request_fingerprint,
)
from spec import schema

from .base import (
    DAY_MS,
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

log = logging.getLogger("meshbroker.store")

IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
INTERNAL_ERROR = "internal_error"
MAX_DETAIL = 300  # characters of an exception's text a 500 ack carries (the full error is logged)
DESTINATION_KINDS = frozenset(schema("common/defs")["$defs"]["destination_kind"]["enum"])
#: Which B2 check (spec/tables/broker_accept.yaml b2_checks) guards which destination kind, and the statement that
#: runs it: no row means the destination does not exist; otherwise each row's ``pubkey`` is a recipient (NULL: none).
B2_CHECK_BY_KIND = {"topic": "topic_exists", "dm": "recipient_is_member", "queue": "queue_exists"}
DESTINATION_BY_KIND = {"topic": "destination_topic", "dm": "destination_dm", "queue": "destination_queue"}
#: Which message table holds which destination kind (§4.3: topic_message | message_queue).
MESSAGE_INSERT_BY_KIND = {
    "topic": "insert_topic_message", "dm": "insert_queue_message", "queue": "insert_queue_message",
}
TABLES = (
    "mesh", "member", "topic", "topic_subscription", "queue", "queue_consumer", "client_message_dedupe",
    "topic_message", "message_queue", "message_history", "delivery_queue",
)
ORPHAN_RULES = (
    "dedupe_without_message", "message_without_dedupe", "message_without_history", "history_without_message",
    "delivery_count_mismatch", "delivery_without_message", "delivery_without_dedupe",
)
#: Every statement an engine must define in ``SQL``.
STATEMENTS = (
    "mesh_policy", "member_exists", "mesh_members", "mesh_topics", "prunable", "sender_policy", "savepoint",
    "rollback_to_savepoint", "claim_dedupe",
    "read_dedupe", "destination_topic", "destination_dm", "destination_queue", "insert_topic_message",
    "insert_queue_message", "insert_history",
    "insert_delivery", "add_mesh", "add_member", "create_topic", "subscribe", "create_queue", "add_queue_consumer",
    "due_delivery_exists", "lease_deliveries", "leased_deliveries", "ack_delivery", "prune_flip_history",
    "prune_deliveries", "prune_history", "prune_topic_messages", "prune_queue_messages", "expire_history",
    "expire_dedupe",
    "migrations_table", "applied_migrations", "record_migration", *ORPHAN_RULES,
    *(f"count_{table}" for table in TABLES),
)
_MIGRATION_NAME = re.compile(r"(\d{4})_[a-z0-9_]+\.sql")
#: Each table row's ``then`` cell, for the one ack member ``Settled`` does not carry (``duplicate``).
_THEN = {row.id: row.then for row in broker_accept.table().rows}


class SqlBrokerStore(BrokerStore):
    """A ``BrokerStore`` over a DB-API driver; see the module docstring. One connection per thread."""

    engine: ClassVar[str]
    SQL: ClassVar[Mapping[str, str]]

    def __init__(self, checks: AcceptChecks | None = None, fault_hook: Callable[[str], None] | None = None,
                 clock: Callable[[], int] = wall_ms):
        missing = [name for name in STATEMENTS if name not in self.SQL]
        if missing:
            raise StoreError(f"{type(self).__name__}.SQL lacks {missing}")
        self.checks = checks or AcceptChecks()
        #: unix ms: stamps what the store writes on its own (applied migrations) and is the ``now`` of a
        #: maintenance call given none
        self.clock = clock
        #: Test seam: called with "message", "history", "delivery" before each in-transaction insert and with
        #: "commit" just before COMMIT; raising from it forces the failure path (BRK-COMMIT-FAIL).
        self.fault_hook = fault_hook
        self._local = threading.local()
        self._connections: list[Any] = []
        self._connections_lock = threading.Lock()
        self._closed = False

    # --- engine hooks ------------------------------------------------------------------------------------------

    def _connect(self) -> Any:
        """A new DB-API connection with dict-like rows, configured for this engine."""
        raise NotImplementedError

    def _usable(self, conn: Any) -> bool:
        """Whether a thread's cached connection can still be used."""
        return True

    def _begin_read(self, conn: Any) -> None:
        raise NotImplementedError

    def _begin_write(self, conn: Any) -> None:
        raise NotImplementedError

    def _commit(self, conn: Any) -> None:
        conn.commit()

    def _rollback(self, conn: Any) -> None:
        conn.rollback()

    def _pipeline(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """Where the engine can send statements without waiting for each answer: a context manager yielding an object
        whose ``sync()`` waits for every answer so far (and raises the first error), or yielding None."""
        return contextlib.nullcontext()

    def _lock_migrations(self, cur: Any) -> None:
        """Inside the migration transaction, before anything is read: serialise concurrent migrators."""
        raise NotImplementedError

    def _run_script(self, cur: Any, script: str) -> None:
        """Execute a migration file's statements inside the current transaction."""
        raise NotImplementedError

    def _id_list(self, ids: list[int]) -> Any:
        """``ids`` as the engine binds a list parameter."""
        raise NotImplementedError

    # --- connections and transactions --------------------------------------------------------------------------

    def _conn(self) -> Any:
        if self._closed:
            raise StoreError("the store is closed")
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._usable(conn):
            return conn
        conn = self._connect()
        self._local.conn = conn
        with self._connections_lock:
            self._connections.append(conn)
        return conn

    @contextlib.contextmanager
    def _transaction(self, write: bool) -> Iterator[Any]:
        conn = self._conn()
        (self._begin_write if write else self._begin_read)(conn)
        try:
            cur = conn.cursor()
            yield cur
        except BaseException:
            with contextlib.suppress(Exception):
                self._rollback(conn)
            raise
        self._commit(conn)

    def _x(self, cur: Any, statement: str, /, **params: Any) -> Any:
        cur.execute(self.SQL[statement], params)
        return cur

    def close(self) -> None:
        self._closed = True
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            with contextlib.suppress(Exception):
                conn.close()

    # --- migrations ----------------------------------------------------------------------------------------------

    def migration_files(self) -> list[tuple[int, str, str]]:
        """(version, name, SQL text) of every migration shipped for this engine, in version order."""
        folder = resources.files(__package__).joinpath("migrations", self.engine)
        found = []
        for entry in folder.iterdir():
            match = _MIGRATION_NAME.fullmatch(entry.name)
            if match:
                found.append((int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
        return sorted(found)

    def migrate(self) -> list[int]:
        applied_now: list[int] = []
        with self._transaction(write=True) as cur:
            self._lock_migrations(cur)
            self._x(cur, "migrations_table")
            done = {row["version"] for row in self._x(cur, "applied_migrations").fetchall()}
            shipped = self.migration_files()
            newer = done - {version for version, _, _ in shipped}
            if newer:
                raise StoreError(f"the database has migrations {sorted(newer)} this code does not know")
            for version, name, script in shipped:
                if version in done:
                    continue
                self._run_script(cur, script)
                self._x(cur, "record_migration", version=version, name=name, applied_at=self.clock())
                applied_now.append(version)
        if applied_now:
            log.info("broker_store_migrated engine=%s versions=%s", self.engine, applied_now)
        return applied_now

    # --- mesh administration ------------------------------------------------------------------------------------

    def add_mesh(self, mesh_id: str, slug: str, dedupe_mode: str, retention_days: int | None) -> None:
        if dedupe_mode not in DEDUPE_MODES:
            raise ValueError(f"dedupe_mode must be one of {DEDUPE_MODES}")
        with self._transaction(write=True) as cur:
            self._x(cur, "add_mesh", mesh_id=mesh_id, slug=slug, dedupe_mode=dedupe_mode,
                    retention_days=retention_days)

    def add_member(self, mesh_id: str, pubkey: str, display_name: str = "") -> None:
        with self._transaction(write=True) as cur:
            self._x(cur, "add_member", mesh_id=mesh_id, pubkey=pubkey, display_name=display_name)

    def create_topic(self, mesh_id: str, topic: str) -> None:
        with self._transaction(write=True) as cur:
            self._x(cur, "create_topic", mesh_id=mesh_id, topic=topic)

    def subscribe(self, mesh_id: str, topic: str, pubkey: str) -> None:
        with self._transaction(write=True) as cur:
            self._x(cur, "subscribe", mesh_id=mesh_id, topic=topic, pubkey=pubkey)

    def create_queue(self, mesh_id: str, queue_id: str, consumers: Iterable[str] = ()) -> None:
        with self._transaction(write=True) as cur:
            self._x(cur, "create_queue", mesh_id=mesh_id, queue_id=queue_id)
            for pubkey in consumers:
                self._x(cur, "add_queue_consumer", mesh_id=mesh_id, queue_id=queue_id, pubkey=pubkey)

    # --- reads: membership at hello, policy for negotiation, a mesh's members and topics, what a sweep prunes --------

    def _rows(self, statement: str, /, **params: Any) -> list[dict[str, Any]]:
        with self._transaction(write=False) as cur:
            return [dict(row) for row in self._x(cur, statement, **params).fetchall()]

    def mesh_policy(self, mesh_id: str) -> dict[str, Any] | None:
        rows = self._rows("mesh_policy", mesh_id=mesh_id)
        return rows[0] if rows else None

    def is_member(self, mesh_id: str, pubkey: str) -> bool:
        return bool(self._rows("member_exists", mesh_id=mesh_id, pubkey=pubkey))

    def members(self, mesh_id: str) -> list[dict[str, Any]]:
        return self._rows("mesh_members", mesh_id=mesh_id)

    def topics(self, mesh_id: str) -> list[str]:
        return [row["name"] for row in self._rows("mesh_topics", mesh_id=mesh_id)]

    def prunable(self, before_ms: int) -> list[dict[str, Any]]:
        return self._rows("prunable", before=before_ms)

    # --- accept (§4.7.2): one send, or a group of sends under one COMMIT ---------------------------------------------

    def accept(
        self, req: AcceptRequest, broker_message_id: str, history_id: str, checks: AcceptChecks | None = None
    ) -> AcceptResult:
        return self.accept_batch([(req, broker_message_id, history_id)], checks)[0]

    def accept_batch(
        self, calls: Sequence[tuple[AcceptRequest, str, str]], checks: AcceptChecks | None = None
    ) -> list[AcceptResult]:
        checks = checks or self.checks
        results: list[AcceptResult | None] = [None] * len(calls)
        pending = list(range(len(calls)))
        while pending:  # a key appears at most once per transaction; a repeat waits for the next one
            group: list[int] = []
            later: list[int] = []
            keys: set[tuple[str, str]] = set()
            for index in pending:
                key = (calls[index][0].mesh_id, calls[index][0].client_message_id)
                # req: BRK-CONCURRENT-ONE-MESSAGE -- a repeated key waits for the next transaction
                (later if key in keys else group).append(index)
                keys.add(key)
            group.sort(key=lambda i: (calls[i][0].mesh_id, calls[i][0].client_message_id))
            self._accept_group(calls, group, checks, results)
            pending = later
        assert all(result is not None for result in results)
        return results  # type: ignore[return-value]

    def _accept_group(
        self, calls: Sequence[tuple[AcceptRequest, str, str]], group: list[int], checks: AcceptChecks,
        results: list[AcceptResult | None],
    ) -> None:
        """One write transaction for ``group`` (distinct keys, in key order): the B1 reads of every send, then each
        send from its own savepoint, then one COMMIT for all that decided to commit. Fills ``results[i]`` for every
        ``i`` in ``group``."""
        try:
            conn = self._conn()
            self._begin_write(conn)
        except Exception as exc:
            log.exception("broker_accept_begin_failed sends=%d", len(group))
            for index in group:
                results[index] = self._fault(calls[index][0], None, exc)
            return
        committing: list[tuple[int, dict[str, str]]] = []
        try:
            with self._pipeline(conn) as pipe:
                try:
                    senders = self._sender_policies(conn, [calls[index][0] for index in group])
                except Exception as exc:  # nothing was written: a store fault before any decision
                    log.exception("broker_accept_b1_failed sends=%d", len(group))
                    for index in group:
                        results[index] = self._fault(calls[index][0], None, exc)
                    raise
                for position, (index, sender) in enumerate(zip(group, senders, strict=True)):
                    req, broker_message_id, history_id = calls[index]
                    result, known = self._accept_one(conn, pipe, position, req, broker_message_id, history_id,
                                                     checks, sender)
                    results[index] = result
                    if result.committed:
                        committing.append((index, known))
            if committing:
                # req: BRK-ATOMIC
                self._commit(conn)  # the one fsync of the group: no ack of it has been sent yet
            else:
                self._rollback(conn)
        except Exception as exc:
            with contextlib.suppress(Exception):
                self._rollback(conn)
            log.exception("broker_accept_group_failed sends=%d committing=%d", len(group), len(committing))
            for index, known in committing:
                results[index] = self._fault(calls[index][0], broker_accept.settle(**{**known, "commit": "failed"}),
                                             exc)
            for index in group:
                if results[index] is None:
                    results[index] = self._fault(calls[index][0], None, exc)

    def _sender_policies(self, conn: Any, requests: list[AcceptRequest]) -> list[Any]:
        """B1's reads for every send of a group, before any of them writes: each sender's mesh policy and membership
        (``None`` when the mesh does not exist), read once per (mesh, sender) of the group. One round trip on an
        engine that pipelines."""
        cursors: dict[tuple[str, str], Any] = {}
        for req in requests:
            key = (req.mesh_id, req.sender_pubkey)
            if key not in cursors:
                cursors[key] = self._x(conn.cursor(), "sender_policy", mesh_id=req.mesh_id, pubkey=req.sender_pubkey)
        rows = {key: cur.fetchone() for key, cur in cursors.items()}
        return [rows[(req.mesh_id, req.sender_pubkey)] for req in requests]

    def _accept_one(
        self, conn: Any, pipe: Any, position: int, req: AcceptRequest, broker_message_id: str, history_id: str,
        checks: AcceptChecks, sender: Any,
    ) -> tuple[AcceptResult, dict[str, str]]:
        """One send inside the group's transaction: the rest of B1 and the drift check (no writes), then from its
        own savepoint the claim, read-back, B2 and inserts. Anything that must not stay is rolled back to the
        savepoint; a 201 stays for the group's COMMIT. Returns the outcome and the table inputs that decided it.
        The savepoint is named after the send's ``position`` in the group, so rolling back to it can never undo an
        earlier send's work, even if setting it failed.

        The claim, the read-back and the destination read go out together, and so do the inserts (on an engine that
        pipelines, two round trips per send); the decision still takes them in the table's order.

        Raises:
            Exception: the savepoint could not be rolled back to; the transaction is unusable.
        """
        known: dict[str, str] = {}
        failed_check, policy, broker_fp = self._phase_b1(req, checks, sender)
        if failed_check is not None:
            # req: BRK-B1-NO-WRITE -- before the savepoint: nothing written
            return self._rejected(broker_accept.settle(b1="rejected"), req, failed_check, checks), known
        # req: BRK-RECOMPUTE-DRIFT -- decided before any write
        known = {"b1": "ok", "drift": "same" if broker_fp == req.request_fingerprint else "differs"}
        settled = broker_accept.settle(**known)
        if settled is not None:  # BRK-DRIFT: nothing written
            return self._answer(settled, req, {"broker_fingerprint_prefix": fingerprint_prefix(broker_fp)}), known
        failed_check = None
        counts: dict[str, int] = {}
        recipients: list[str] = []
        try:
            cur = conn.cursor()
            self._savepoint(cur, "savepoint", position)
            # req: BRK-CONCURRENT-ONE-MESSAGE, BRK-RECOMPUTE -- the broker's own fingerprint is what it stores
            self._x(cur, "claim_dedupe", mesh_id=req.mesh_id, client_message_id=req.client_message_id,
                    broker_message_id=broker_message_id, request_fingerprint=broker_fp,
                    destination_kind=req.destination_kind, destination_ref=req.destination_ref,
                    first_seen_at=req.received_at_ms, expires_at=self._expires_at(req, policy))
            read_back = self._x(conn.cursor(), "read_dedupe", mesh_id=req.mesh_id,
                                client_message_id=req.client_message_id)
            destination = self._x(conn.cursor(), DESTINATION_BY_KIND[req.destination_kind], mesh_id=req.mesh_id,
                                  ref=req.destination_ref, sender=req.sender_pubkey)
            row = read_back.fetchone()
            if row is None:
                raise StoreError("the dedupe row vanished between the claim and the read-back")
            # req: BRK-FIRST-INSERT, BRK-DUP-MATCH, BRK-DUP-MISMATCH -- the table settles on claim and fingerprint
            known["claim"] = "ours" if row["broker_message_id"] == broker_message_id else "theirs"
            # req: BRK-RECOMPUTE -- every receipt compares the broker's computation
            known["fingerprint"] = "match" if bytes(row["request_fingerprint"]) == broker_fp else "mismatch"
            settled = broker_accept.settle(**known)
            if settled is None:
                found = destination.fetchall()
                # req: BRK-B2-ROLLBACK
                failed_check = None if found else B2_CHECK_BY_KIND[req.destination_kind]
                known["b2"] = "ok" if failed_check is None else "rejected"
                settled = broker_accept.settle(**known)
            if settled is None:
                recipients = [found_row["pubkey"] for found_row in found if found_row["pubkey"] is not None]
                # req: BRK-ATOMIC -- message, history and deliveries inside the send's savepoint
                self._insert_effects(cur, req, broker_message_id, history_id, recipients)
                if pipe is not None:
                    pipe.sync()  # an insert's failure surfaces here, still this send's
                counts = {"dedupe": 1, "message": 1, "history": 1, "delivery": len(recipients)}
                self._hook("commit")
                known["commit"] = "ok"
                settled = broker_accept.settle(**known)
            assert settled is not None, known
            if settled.transaction == "rollback":
                # req: BRK-B2-ROLLBACK, BRK-DUP-MATCH, BRK-DUP-MISMATCH -- no dedupe row kept, nothing created
                self._rollback_to_savepoint(cur, pipe, position)
            elif settled.transaction != "commit":
                raise StoreError(f"a transaction was open for an outcome with transaction={settled.transaction!r}")
        except Exception as exc:
            if pipe is not None:
                # An error that surfaced at a later statement rather than at a sync leaves the pipeline aborted until
                # a sync is processed: every statement queued before that, the rollback included, would be skipped.
                with contextlib.suppress(Exception):
                    pipe.sync()
            self._rollback_to_savepoint(conn.cursor(), pipe, position)
            log.exception("broker_accept_failed client_message_id=%s", req.client_message_id)
            # req: BRK-ATOMIC -- a failure inside answers 5xx and leaves none of the send's rows
            decided = broker_accept.settle(**{**known, "commit": "failed"}) if known.get("b2") == "ok" else None
            return self._fault(req, decided, exc), known
        if failed_check is not None:
            return self._rejected(settled, req, failed_check, checks), known
        values = {  # what an ack may include; the history row is only the original's
            "broker_message_id": row["broker_message_id"],
            "history_id": history_id if known["claim"] == "ours" else row["history_id"],
            "history_available": bool(row["history_available"]),
        }
        if "first_seen_at" in settled.include:
            values["first_seen_at"] = rfc3339_ms(int(row["first_seen_at_ms"]))
        if settled.conflict is not None or "broker_fingerprint_prefix" in settled.include:
            # req: BRK-DUP-MISMATCH-PREFIX
            values["broker_fingerprint_prefix"] = fingerprint_prefix(broker_fp)  # this request's, as E-26 says
        return self._answer(settled, req, values, counts, tuple(recipients)), known

    def _savepoint(self, cur: Any, statement: str, position: int) -> None:
        cur.execute(self.SQL[statement].format(position=int(position)))

    def _rollback_to_savepoint(self, cur: Any, pipe: Any, position: int) -> None:
        self._savepoint(cur, "rollback_to_savepoint", position)
        if pipe is not None:
            pipe.sync()

    @staticmethod
    def _phase_b1(req: AcceptRequest, checks: AcceptChecks, sender: Any) -> tuple[str | None, Any, bytes]:
        """The first failed B1 check's name (or None), the mesh's dedupe policy, the broker's fingerprint;
        ``sender`` is the ``sender_policy`` row."""
        if sender is None:
            return "mesh_exists", None, b""
        policy = {"dedupe_mode": sender["dedupe_mode"], "retention_days": sender["retention_days"]}
        if not sender["is_member"]:
            return "membership", policy, b""
        if req.destination_kind not in DESTINATION_KINDS:
            return "destination_kind_valid", policy, b""
        # req: BRK-PAYLOAD-LIMIT
        if len(req.body.encode("utf-8", "surrogatepass")) > checks.max_payload_bytes:
            return "payload_size", policy, b""
        try:
            # req: BRK-RECOMPUTE, FP-CANONICAL-FORM
            broker_fp = request_fingerprint(FingerprintInput(
                destination_kind=req.destination_kind, destination_ref=req.destination_ref,
                reply_to_id=req.reply_to_id, priority=req.priority, meta=req.meta, body=req.body,
            ))
        except MetaError:
            return "schema", policy, b""
        if not checks.rate_limit(req):
            return "rate_limit", policy, broker_fp
        return None, policy, broker_fp

    @staticmethod
    def _expires_at(req: AcceptRequest, policy: Mapping[str, Any]) -> int | None:
        # req: BRK-DEDUPE-PERMANENT, BRK-ADVERTISE-POLICY
        if policy["dedupe_mode"] == "permanent":
            return None
        if req.dedupe_expires_at_ms is not None:
            return req.dedupe_expires_at_ms
        # req: BRK-ADVERTISE-POLICY -- dedupe_retention_days after first_seen_at
        return req.received_at_ms + int(policy["retention_days"]) * DAY_MS

    def _insert_effects(
        self, cur: Any, req: AcceptRequest, broker_message_id: str, history_id: str, recipients: list[str],
    ) -> None:
        """The §4.7.1 inserts after the dedupe claim: message, history, one delivery row per recipient."""
        meta = meta_canonical(req.meta).decode("utf-8") or None
        self._hook("message")
        self._x(cur, MESSAGE_INSERT_BY_KIND[req.destination_kind], id=broker_message_id, mesh_id=req.mesh_id,
                client_message_id=req.client_message_id, sender_pubkey=req.sender_pubkey,
                destination_kind=req.destination_kind, destination_ref=req.destination_ref, priority=req.priority,
                reply_to_id=req.reply_to_id, meta=meta, body=req.body, created_at=req.received_at_ms)
        self._hook("history")
        self._x(cur, "insert_history", id=history_id, broker_message_id=broker_message_id, mesh_id=req.mesh_id,
                destination_kind=req.destination_kind, destination_ref=req.destination_ref,
                sender_pubkey=req.sender_pubkey, recipient_count=len(recipients), created_at=req.received_at_ms)
        for recipient in recipients:
            self._hook("delivery")
            self._x(cur, "insert_delivery", broker_message_id=broker_message_id, mesh_id=req.mesh_id,
                    recipient_pubkey=recipient)

    def _hook(self, stage: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(stage)

    # --- ack bodies (E-10) ---------------------------------------------------------------------------------------

    @staticmethod
    def _answer(
        settled: broker_accept.Settled, req: AcceptRequest, values: Mapping[str, Any],
        counts: Mapping[str, int] | None = None, recipients: tuple[str, ...] = (),
    ) -> AcceptResult:
        """The ack for a 201, 200 or 409 outcome: the members the table row includes, per E-10."""
        body: dict[str, Any] = {"client_message_id": req.client_message_id}
        if settled.conflict is not None:
            # req: BRK-DUP-MISMATCH, BRK-RECOMPUTE-DRIFT
            body.update(error=IDEMPOTENCY_KEY_REUSED, conflict=settled.conflict,
                        broker_fingerprint_prefix=values["broker_fingerprint_prefix"])
        # req: BRK-FIRST-INSERT, BRK-DUP-MATCH -- the members the table row includes
        body.update({name: values[name] for name in settled.include})
        if "duplicate" in _THEN[settled.table_row]:
            body["duplicate"] = bool(_THEN[settled.table_row]["duplicate"])
        effects = {name: (counts or {}).get(name, 0) if name in settled.effects else 0 for name in EFFECTS}
        return AcceptResult(settled.table_row, int(settled.http_status), body, effects, recipients, settled.metric)

    @staticmethod
    def _rejected(settled: broker_accept.Settled | None, req: AcceptRequest, check: str,
                  checks: AcceptChecks | None = None) -> AcceptResult:
        """The ack for a failed B1 or B2 check: its status and error code come from the table's check list; a rate
        limit says when to come back (``retry_after_ms``, E-42)."""
        assert settled is not None
        status, error = broker_accept.check_status(settled.phase, check)
        body: dict[str, Any] = {"client_message_id": req.client_message_id, "error": error,
                                "detail": f"{settled.phase} check {check} failed"}
        if check == "rate_limit" and checks is not None:
            wait = checks.retry_after_ms(req)
            if wait is not None:
                body["retry_after_ms"] = int(wait)
        return AcceptResult(settled.table_row, status, body, dict.fromkeys(EFFECTS, 0), (), settled.metric)

    @staticmethod
    def _fault(req: AcceptRequest, settled: broker_accept.Settled | None, exc: BaseException) -> AcceptResult:
        body = {"client_message_id": req.client_message_id, "error": INTERNAL_ERROR,
                "detail": f"{type(exc).__name__}: {exc}"[:MAX_DETAIL]}
        return AcceptResult(settled.table_row if settled else None, 500, body, dict.fromkeys(EFFECTS, 0))

    # --- deliveries ----------------------------------------------------------------------------------------------

    def pending_deliveries(self, recipient: str, now_ms: int, lease_ms: int, limit: int = 100) -> list[Delivery]:
        params = {"recipient": recipient, "now": now_ms, "lease_until": now_ms + lease_ms, "limit": limit}
        with self._transaction(write=False) as cur:  # idle polls never take the write lock
            due = self._x(cur, "due_delivery_exists", **params).fetchone()
        if due is None:
            return []
        with self._transaction(write=True) as cur:
            ids = [row["id"] for row in self._x(cur, "lease_deliveries", **params).fetchall()]
            if not ids:
                return []
            rows = self._x(cur, "leased_deliveries", ids=self._id_list(ids)).fetchall()
        return [_delivery(row) for row in rows]

    def ack_delivery(self, delivery_id: int, recipient: str, now_ms: int | None = None, *,
                     broker_message_id: str | None = None) -> bool:
        with self._transaction(write=True) as cur:
            acked_at = self.clock() if now_ms is None else now_ms
            # req: BRK-CLIENT-ACK
            cur = self._x(cur, "ack_delivery", id=delivery_id, recipient=recipient, now=acked_at,
                          broker_message_id=broker_message_id)
            return cur.rowcount == 1

    # --- retention and expiry (§17 steps 5 and 6) ----------------------------------------------------------------

    def prune_messages(self, before_ms: int) -> int:
        with self._transaction(write=True) as cur:
            for name in ("prune_flip_history", "prune_deliveries", "prune_history"):
                # req: BRK-HISTORY-AVAILABLE -- history_available flips in the transaction that prunes the message
                self._x(cur, name, before=before_ms)
            deleted = self._x(cur, "prune_topic_messages", before=before_ms).rowcount
            deleted += self._x(cur, "prune_queue_messages", before=before_ms).rowcount
        return deleted

    def expire_dedupe(self, now_ms: int) -> int:
        with self._transaction(write=True) as cur:
            self._x(cur, "expire_history", now=now_ms)
            # req: BRK-DEDUPE-EXPIRY
            return self._x(cur, "expire_dedupe", now=now_ms).rowcount

    # --- inventory -----------------------------------------------------------------------------------------------

    def orphan_check(self, now_ms: int | None = None) -> list[Violation]:
        found: list[Violation] = []
        with self._transaction(write=False) as cur:
            # req: BRK-ORPHAN-CHECK
            for rule in ORPHAN_RULES:
                for row in self._x(cur, rule, now=self.clock() if now_ms is None else now_ms).fetchall():
                    found.append(Violation(rule, row["mesh_id"], str(row["ref"]), row["detail"]))
        for violation in found:
            log.warning("cm_broker_dedupe_orphan_found mesh_id=%s kind=%s ref=%s %s", violation.mesh_id,
                        violation.kind, violation.ref, violation.detail)
        return found

    def counts(self) -> dict[str, int]:
        with self._transaction(write=False) as cur:
            return {table: int(self._x(cur, f"count_{table}").fetchone()["n"]) for table in TABLES}


def _delivery(row: Mapping[str, Any]) -> Delivery:
    return Delivery(
        delivery_id=int(row["id"]), mesh_id=row["mesh_id"], recipient_pubkey=row["recipient_pubkey"],
        attempt=int(row["attempt"]), lease_until_ms=int(row["lease_until_ms"]),
        broker_message_id=row["broker_message_id"], client_message_id=row["client_message_id"],
        history_id=row["history_id"], sender_pubkey=row["sender_pubkey"], destination_kind=row["destination_kind"],
        destination_ref=row["destination_ref"], priority=row["priority"], reply_to_id=row["reply_to_id"],
        meta=json.loads(row["meta"]) if row["meta"] else None, body=row["body"],
        created_at_ms=int(row["created_at_ms"]),
    )
