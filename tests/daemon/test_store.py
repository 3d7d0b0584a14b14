"""The SQLite stores behind the reference daemon: outbox.db (§4.5, §4.11) and inbox.db (§4.10, E-12, E-13, E-16).

Every test uses real database files under ``tmp_path``. The outbox store must persist exactly what the core decides,
so most assertions compare the stored row with the core's own answer for the same input.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import random
import shutil
import sqlite3
import stat
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from reference.core import OutboxEvent, OutboxPolicy, Transition, TransitionError, apply, parse_send
from reference.core.ipc import table as ipc_table
from reference.core.limits import limit
from reference.core.outbox import STATES
from reference.core.outbox import table as outbox_table
from reference.daemon.store import (
    AcceptItem,
    AmbiguousOutboxKey,
    InboxCorrupt,
    InboxMessage,
    InboxStore,
    InvalidCursor,
    MigrationError,
    NewIdInUse,
    OutboxCorrupt,
    OutboxRowNotFound,
    OutboxStore,
    SchemaTooNew,
    StoreClosed,
    _sqlite,
    inbox_cursor,
    migrations,
)

T0 = 1_700_000_000_000
HOUR = 3_600_000
POLICY = OutboxPolicy(retry_base_ms=500, retry_max_ms=30_000, jitter=0.25, max_age_hours=72)
_ids = itertools.count(1)


def send(message: str = "hello", to: str = "#general", **members):
    return parse_send(json.dumps({"to": to, "message": message, **members}).encode())


def new_id(prefix: str = "01ROW") -> str:
    return f"{prefix}{next(_ids):08d}"


@pytest.fixture
def outbox(tmp_path):
    store = OutboxStore(tmp_path / "outbox.db", POLICY)
    yield store
    store.close()


@pytest.fixture
def inbox(tmp_path):
    clock = {"now": T0}
    store = InboxStore(tmp_path / "inbox.db", clock=lambda: clock["now"])
    store.test_clock = clock
    yield store
    store.close()


def accept_new(store: OutboxStore, cmid: str, request=None, now: int = T0):
    decision, transition = store.accept(request or send(), cmid, new_id(), now)
    assert decision.table_row == "IPC-NEW"
    return transition.after


def event(name: str, now: int = T0 + 1_000, **members) -> OutboxEvent:
    return OutboxEvent(name, now, **members)


def row_in_state(store: OutboxStore, state: str, cmid: str, request=None):
    """Reach ``state`` through real transitions, as the daemon would."""
    row = accept_new(store, cmid, request)
    if state == "pending":
        return row
    if state == "aborted":
        store.requeue(row.id, new_id("cm-successor-"), new_id(), T0 + 500)
        return store.get(row.id)
    store.transition(row.id, event("dispatch"), by="id")
    follow = {
        "inflight": None,
        "done": event("ack_created", broker_message_id="01BROKER", history_id="h-1"),
        "dead": event("ack_rejected", error="rejected: 403"),
    }[state]
    if follow is not None:
        store.transition(cmid, follow, by="client_message_id")
    found = store.get(row.id)
    assert found.status == state
    return found


def all_rows(path: Path) -> list[tuple]:
    """Every outbox row through a NEW connection (not the store's)."""
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT * FROM outbox ORDER BY id").fetchall()


# --- schema and migrations ------------------------------------------------------------------------------------------


def test_outbox_schema_is_section_4_5_2_plus_e20(outbox):
    conn = sqlite3.connect(outbox.path)
    columns = {name: (kind, notnull) for _, name, kind, notnull, _, _ in conn.execute("PRAGMA table_info(outbox)")}
    assert set(columns) == {
        "id", "client_message_id", "request_fingerprint", "payload", "enqueued_at", "attempts", "next_attempt_at",
        "status", "last_error", "delivered_at", "broker_message_id", "aborted_at", "aborted_by", "superseded_by",
        "history_id", "max_age_at",
    }
    assert columns["request_fingerprint"] == ("BLOB", 1)
    assert columns["enqueued_at"][0] == columns["next_attempt_at"][0] == columns["max_age_at"][0] == "INTEGER"
    indexes = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"))
    assert "(status, next_attempt_at)" in indexes["outbox_pending"]
    assert "WHERE status = 'aborted'" in indexes["outbox_aborted"]
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("INSERT INTO outbox (id, client_message_id, request_fingerprint, payload, enqueued_at,"
                     " next_attempt_at, status) VALUES ('x', 'y', x'00', x'00', 0, 0, 'pending')")
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("INSERT INTO outbox (id, client_message_id, request_fingerprint, payload, enqueued_at,"
                     " next_attempt_at, status) VALUES ('x', 'y', zeroblob(32), x'00', 0, 0, 'lost')")
    conn.close()


def test_pragmas_wal_full_and_mode_0600(outbox):
    assert outbox._writer.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert outbox._writer.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert outbox._writer.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert outbox._writer.execute("PRAGMA busy_timeout").fetchone()[0] == 5_000
    assert stat.S_IMODE(os.stat(outbox.path).st_mode) == 0o600


def test_reopen_keeps_rows_and_version(tmp_path):
    path = tmp_path / "outbox.db"
    with OutboxStore(path, POLICY) as store:
        row = accept_new(store, "cm-keep")
        assert store.schema_version == migrations("outbox")[-1].version
    with OutboxStore(path, POLICY) as store:
        assert store.get(row.id) == row
        conn = sqlite3.connect(path)
        expected = [(m.version, m.name) for m in migrations("outbox")]
        assert conn.execute("SELECT version, name FROM schema_version").fetchall() == expected
        conn.close()


@pytest.mark.parametrize("kind", ["outbox", "inbox"])
def test_schema_newer_than_code_is_refused(tmp_path, kind):
    path = tmp_path / f"{kind}.db"
    opener = (lambda: OutboxStore(path, POLICY)) if kind == "outbox" else (lambda: InboxStore(path))
    opener().close()
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO schema_version (version, name, applied_at) VALUES (99, 'from_the_future', 0)")
    with pytest.raises(SchemaTooNew) as caught:
        opener()
    assert (caught.value.found, caught.value.known) == (99, len(migrations(kind)))
    assert str(path) in str(caught.value) and "newer" in str(caught.value)
    if kind == "inbox":  # a refusal is not corruption: the file stays where it is
        with pytest.raises(SchemaTooNew):
            InboxStore.open_or_quarantine(path)
        assert [p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name] == []


def test_migrations_run_forward_and_atomically(tmp_path, monkeypatch):
    """A later migration file upgrades an existing database in place; a failing one leaves it at its version."""
    path = tmp_path / "outbox.db"
    with OutboxStore(path, POLICY) as store:
        row = accept_new(store, "cm-before-upgrade")
    future = tmp_path / "migrations"
    shutil.copytree(_sqlite.MIGRATIONS_DIR, future)
    monkeypatch.setattr(_sqlite, "MIGRATIONS_DIR", future)
    latest = len(migrations("outbox"))
    broken = future / "outbox" / f"{latest + 1:04d}_broken.sql"
    broken.write_text("-- adds a column, then fails\nALTER TABLE outbox ADD COLUMN note TEXT;\nSELECT * FROM nope;\n")
    with pytest.raises(MigrationError, match=f"{latest + 1:04d}_broken"):
        OutboxStore(path, POLICY)
    with sqlite3.connect(path) as conn:
        assert "note" not in {r[1] for r in conn.execute("PRAGMA table_info(outbox)")}
    broken.unlink()
    (future / "outbox" / f"{latest + 1:04d}_note.sql").write_text("ALTER TABLE outbox ADD COLUMN note TEXT; -- x\n")
    with OutboxStore(path, POLICY) as store:
        assert store.schema_version == latest + 1
        assert store.get(row.id) == row
    (future / "outbox" / f"{latest + 3:04d}_gap.sql").write_text("SELECT 1;\n")
    with pytest.raises(MigrationError, match="without gaps"):
        OutboxStore(path, POLICY)


def test_memory_database_and_bad_synchronous_are_refused(tmp_path):
    with pytest.raises(ValueError):
        OutboxStore(":memory:", POLICY)
    with pytest.raises(ValueError):
        OutboxStore(tmp_path / "o.db", POLICY, synchronous="SOMETIMES")


def test_closed_store_refuses(tmp_path):
    store = OutboxStore(tmp_path / "outbox.db", POLICY)
    store.close()
    store.close()
    with pytest.raises(StoreClosed):
        store.accept(send(), "cm-1", new_id(), T0)
    with pytest.raises(StoreClosed):
        store.counts()


# --- §4.5.1 accept --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("table_row", ipc_table().rows, ids=lambda r: r.id)
def test_every_ipc_lookup_row_through_accept(outbox, table_row):
    """IPC-NEW-ROW, IPC-*-MATCH, IPC-CONFLICT-NO-MUTATION: each §4.5.1 row, reached through real transitions."""
    state = next(iter(table_row.when["row_state"]))
    original = send("original")
    match = table_row.when["fingerprint"] in (None, frozenset({"match"}))
    retry = original if match else send("something else")
    if state != "none":
        row_in_state(outbox, state, "cm-1", original)
    before_rows, before_counts = all_rows(outbox.path), outbox.counts()

    decision, transition = outbox.accept(retry, "cm-1", "01NEWROW", T0 + 9_000)

    then = table_row.then
    assert (decision.table_row, decision.http_status, decision.row_state) == (table_row.id, then["http_status"], state)
    if then["mutation"] == "insert_pending":
        stored = outbox.get("01NEWROW")
        assert transition.table_row == "OB-NONE-ACCEPT" and transition.after == stored
        assert (stored.status, stored.client_message_id, stored.enqueued_at) == ("pending", "cm-1", T0 + 9_000)
        assert stored.request_fingerprint == retry.fingerprint() and stored.payload == retry.payload()
        assert stored.max_age_at == T0 + 9_000 + 72 * HOUR
        return
    assert transition is None
    assert all_rows(outbox.path) == before_rows  # the full row, every column, unchanged
    assert outbox.counts() == before_counts
    if then["http_status"] == 409:
        assert decision.body["conflict"] == then["conflict"]
        assert decision.body["daemon_fingerprint_prefix"] == retry.fingerprint()[:8].hex()
    if state == "done":
        assert decision.body["broker_message_id"] == "01BROKER"
    if table_row.id == "IPC-DONE-MATCH":
        assert decision.body["history_id"] == "h-1"
    if table_row.id == "IPC-DEAD-MATCH":
        assert decision.body["reason"] == "rejected: 403"


def test_accept_is_visible_to_a_new_connection_when_it_returns(outbox):
    """The durability boundary is COMMIT: no read of the store's own connection is needed to see the row."""
    request = send("durable")
    decision, transition = outbox.accept(request, "cm-durable", "01DURABLE", T0)
    conn = sqlite3.connect(outbox.path)
    found = conn.execute("SELECT status, request_fingerprint, payload FROM outbox WHERE client_message_id = ?",
                         ("cm-durable",)).fetchone()
    conn.close()
    assert found == ("pending", request.fingerprint(), request.payload())
    assert decision.http_status == 202 and transition.after.id == "01DURABLE"


def test_accept_batch_decides_in_order_like_sequential_accepts(tmp_path):
    a, a_again, b = send("a"), send("a"), send("b")
    sends = [
        (a, "cm-1", "01A", T0),
        (a_again, "cm-1", "01A-AGAIN", T0 + 1),  # same id, same request: 202 pending match
        (b, "cm-1", "01B", T0 + 2),  # same id, other request: 409
        (b, "cm-2", "01C", T0 + 3),
        (b, "cm-2", "01D", T0 + 4),
    ]
    with OutboxStore(tmp_path / "batch.db", POLICY) as batched:
        together = batched.accept_batch([AcceptItem.of(*args) for args in sends])
        batched_rows = all_rows(batched.path)
    with OutboxStore(tmp_path / "single.db", POLICY) as single:
        one_by_one = [single.accept(*args) for args in sends]
        single_rows = all_rows(single.path)
    assert [d.table_row for d, _ in together] == [
        "IPC-NEW", "IPC-PENDING-MATCH", "IPC-PENDING-MISMATCH", "IPC-NEW", "IPC-PENDING-MATCH"]
    assert together == one_by_one
    assert batched_rows == single_rows and len(batched_rows) == 2
    assert [t is not None for _, t in together] == [True, False, False, True, False]


def test_accept_batch_is_all_or_nothing(outbox):
    items = [AcceptItem.of(send("a"), "cm-1", "01SAME", T0), AcceptItem.of(send("b"), "cm-2", "01SAME", T0)]
    with pytest.raises(sqlite3.IntegrityError):
        outbox.accept_batch(items)
    assert all_rows(outbox.path) == []
    assert outbox.accept_batch([]) == []


def test_64_threads_accepting_one_id(outbox):
    """Concurrent accepts of one id serialize: one row, and every answer is what the table says for that row."""
    requests = [send("same") if i % 2 == 0 else send(f"different {i}") for i in range(64)]
    barrier = threading.Barrier(64)
    answers: list = [None] * 64

    def worker(i: int) -> None:
        barrier.wait()
        answers[i] = outbox.accept(requests[i], "cm-contended", f"01THREAD{i:03d}", T0 + i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rows = all_rows(outbox.path)
    assert len(rows) == 1
    winners = [i for i, (decision, _) in enumerate(answers) if decision.table_row == "IPC-NEW"]
    assert len(winners) == 1
    stored = outbox.get_by_client_message_id("cm-contended")
    assert stored.id == f"01THREAD{winners[0]:03d}"
    for i, (decision, transition) in enumerate(answers):
        if i == winners[0]:
            continue
        assert transition is None
        if requests[i].fingerprint() == stored.request_fingerprint:
            assert (decision.table_row, decision.http_status) == ("IPC-PENDING-MATCH", 202)
        else:
            assert (decision.table_row, decision.http_status) == ("IPC-PENDING-MISMATCH", 409)


def test_trace_hook_sees_decisions_and_transitions_after_commit(tmp_path):
    seen = []

    def hook(item):
        seen.append((type(item).__name__, item.table_row, len(all_rows(tmp_path / "outbox.db"))))

    with OutboxStore(tmp_path / "outbox.db", POLICY, trace=hook) as store:
        store.accept(send(), "cm-1", "01A", T0)
        store.accept(send(), "cm-1", "01B", T0)
        store.transition("cm-1", event("dispatch"))
    assert seen == [
        ("IpcDecision", "IPC-NEW", 1), ("Transition", "OB-NONE-ACCEPT", 1),
        ("IpcDecision", "IPC-PENDING-MATCH", 1), ("Transition", "OB-PENDING-DISPATCH", 1),
    ]


def test_failing_trace_hook_does_not_fail_a_committed_accept(tmp_path):
    def hook(item):
        raise RuntimeError("trace disk full")

    with OutboxStore(tmp_path / "outbox.db", POLICY, trace=hook) as store:
        decision, _ = store.accept(send(), "cm-1", "01A", T0)
        assert decision.http_status == 202 and store.get("01A") is not None


# --- reads ----------------------------------------------------------------------------------------------------------


def test_list_pages_newest_first_with_opaque_cursor(outbox):
    ids = []
    for i in range(23):
        row = accept_new(outbox, f"cm-{i}", send(f"m{i}"), now=T0 + (i // 3))  # ties on enqueued_at
        ids.append(row.id)
    outbox.transition("cm-5", event("dispatch"))
    seen, cursor = [], None
    while True:
        rows, cursor = outbox.list(limit=5, cursor=cursor)
        seen += [r.id for r in rows]
        if cursor is None:
            break
    assert seen == sorted(ids, key=lambda i: (outbox.get(i).enqueued_at, i), reverse=True)
    pending, cursor = outbox.list(status="pending", limit=100)
    assert len(pending) == 22 and cursor is None
    assert [r.client_message_id for r in outbox.list(status="inflight")[0]] == ["cm-5"]
    with pytest.raises(InvalidCursor):
        outbox.list(cursor="not a cursor")
    with pytest.raises(InvalidCursor):
        outbox.list(cursor=inbox_cursor(3))
    with pytest.raises(ValueError):
        outbox.list(status="lost")


def test_counts_and_get(outbox):
    assert outbox.counts() == dict.fromkeys(STATES, 0)
    row_in_state(outbox, "done", "cm-done")
    row_in_state(outbox, "dead", "cm-dead")
    row = accept_new(outbox, "cm-pending")
    assert outbox.counts() == {"pending": 1, "inflight": 0, "done": 1, "dead": 1, "aborted": 0}
    assert outbox.get(row.id) == outbox.get_by_client_message_id("cm-pending") == row
    assert outbox.get("01NOPE") is None and outbox.get_by_client_message_id("nope") is None


def test_health_is_counts_and_oldest_pending_in_one_read(outbox):
    assert outbox.health() == (dict.fromkeys(STATES, 0), None)
    row_in_state(outbox, "done", "cm-done")
    accept_new(outbox, "cm-late", now=T0 + 50)
    accept_new(outbox, "cm-early", now=T0 + 10)
    assert outbox.health() == (outbox.counts(), outbox.oldest_pending_enqueued_at()) == (
        {"pending": 2, "inflight": 0, "done": 1, "dead": 0, "aborted": 0}, T0 + 10)


def test_due_is_pending_and_due_oldest_first(outbox):
    late = accept_new(outbox, "cm-late", now=T0 + 50)
    early = accept_new(outbox, "cm-early", now=T0 + 10)
    accept_new(outbox, "cm-future", now=T0 + 10_000)
    row_in_state(outbox, "inflight", "cm-inflight")
    assert [r.id for r in outbox.due(T0 + 100, 10)] == [early.id, late.id]
    assert [r.id for r in outbox.due(T0 + 100, 1)] == [early.id]
    assert outbox.due(T0, 10) == []


# --- lifecycle ------------------------------------------------------------------------------------------------------

EVENTS = list(outbox_table().inputs["event"])


@pytest.mark.parametrize("state", STATES)
def test_every_table_pair_persists_exactly_the_cores_after(outbox, state):
    """For every (state, event): the stored row after ``transition`` is the core's ``after`` (or unchanged)."""
    for name in EVENTS:
        row = row_in_state(outbox, state, f"cm-{state}-{name}")
        ev = event(name, broker_message_id="01B", history_id="h9", error=f"{name}!", jitter_unit=0.5,
                   successor_id=new_id(), successor_client_message_id=f"cm-next-{state}-{name}")
        rows_before = all_rows(outbox.path)
        try:
            expected = apply(row, ev, POLICY)
        except TransitionError:
            with pytest.raises(TransitionError):
                outbox.transition(row.id, ev, by="id")
            assert all_rows(outbox.path) == rows_before
            continue
        result = outbox.transition(row.id, ev, by="id")
        assert result == expected
        if result.outcome == "transition":
            assert outbox.get(row.id) == result.after
            if result.successor is not None:
                assert outbox.get(result.successor.id) == result.successor
        else:
            assert all_rows(outbox.path) == rows_before


def test_random_walk_matches_the_core(outbox):
    """Many rows, random events, persisted row == the core applied to the previous persisted row."""
    rng = random.Random(4)
    model = {}
    for i in range(6):
        row = accept_new(outbox, f"cm-walk-{i}")
        model[row.id] = row
    for step in range(300):
        row_id = rng.choice(sorted(model))
        ev = event(rng.choice(EVENTS), now=T0 + step, broker_message_id="01B", error="e",
                   jitter_unit=rng.uniform(-1, 1), successor_id=f"01SUCC{step:04d}",
                   successor_client_message_id=f"cm-succ-{step}")
        try:
            expected = apply(model[row_id], ev, POLICY)
        except TransitionError:
            with pytest.raises(TransitionError):
                outbox.transition(row_id, ev, by="id")
            continue
        assert outbox.transition(row_id, ev, by="id") == expected
        model[row_id] = expected.after
        if expected.successor is not None:
            model[expected.successor.id] = expected.successor
    assert {r.id: r for r in (outbox.get(i) for i in model)} == model


def test_transition_key_lookup(outbox):
    row = accept_new(outbox, "cm-key")
    assert outbox.transition("cm-key", event("dispatch")).after.status == "inflight"
    assert outbox.transition(row.id, event("ack_timeout")).after.status == "pending"
    with pytest.raises(OutboxRowNotFound) as caught:
        outbox.transition("cm-unknown", event("ack_created"))
    assert isinstance(caught.value, LookupError)
    # A caller-chosen client_message_id equal to another row's outbox id is ambiguous without by=.
    other_decision, _ = outbox.accept(send("x"), "cm-other", "cm-key", T0)
    assert other_decision.table_row == "IPC-NEW"
    with pytest.raises(AmbiguousOutboxKey):
        outbox.transition("cm-key", event("dispatch"))
    assert outbox.transition("cm-key", event("dispatch"), by="id").after.client_message_id == "cm-other"
    assert outbox.transition("cm-key", event("dispatch"), by="client_message_id").after.id == row.id


def test_impossible_pair_propagates_and_writes_nothing(outbox):
    row = row_in_state(outbox, "done", "cm-done")
    before = all_rows(outbox.path)
    with pytest.raises(TransitionError) as caught:
        outbox.transition(row.id, event("dispatch"))
    assert (caught.value.state, caught.value.event) == ("done", "dispatch")
    assert all_rows(outbox.path) == before


# --- requeue (§4.5.3, E-09) -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["dead", "pending"])
def test_requeue_is_atomic_and_never_frees_the_old_id(outbox, state):
    original = send("to requeue")
    old = row_in_state(outbox, state, "cm-old", original)
    result = outbox.requeue(old.id, "cm-new", "01SUCCESSOR", T0 + 7_000)
    assert (result.table_row, result.outcome) == (f"OB-{state.upper()}-REQUEUE", "transition")
    retired, successor = outbox.get(old.id), outbox.get("01SUCCESSOR")
    assert (retired.status, retired.aborted_at, retired.aborted_by, retired.superseded_by) == (
        "aborted", T0 + 7_000, "operator", "01SUCCESSOR")
    assert replace(retired, status=old.status, aborted_at=None, aborted_by=None, superseded_by=None) == old
    assert (successor.status, successor.client_message_id, successor.attempts) == ("pending", "cm-new", 0)
    assert (successor.payload, successor.request_fingerprint) == (old.payload, old.request_fingerprint)
    assert (retired, successor) == (result.after, result.successor)
    # REQUEUE-NEVER-FREES: the old id answers 409 aborted forever; the new id is the live one.
    assert outbox.accept(original, "cm-old", new_id(), T0 + 8_000)[0].table_row == "IPC-ABORTED-MATCH"
    assert outbox.accept(send("other"), "cm-old", new_id(), T0 + 8_000)[0].table_row == "IPC-ABORTED-MISMATCH"
    assert outbox.accept(original, "cm-new", new_id(), T0 + 8_000)[0].table_row == "IPC-PENDING-MATCH"
    assert len(all_rows(outbox.path)) == 2


def test_requeue_actor_auto(outbox):
    row = row_in_state(outbox, "dead", "cm-auto")
    assert outbox.requeue(row.id, "cm-auto-2", new_id(), T0, actor="auto").after.aborted_by == "auto"
    with pytest.raises(ValueError):
        outbox.requeue("whatever", "cm-x", new_id(), T0, actor="root")


@pytest.mark.parametrize("state", ["inflight", "done", "aborted"])
def test_requeue_of_other_states_is_rejected_without_writes(outbox, state):
    row = row_in_state(outbox, state, "cm-stuck")
    before = all_rows(outbox.path)
    result = outbox.requeue(row.id, "cm-fresh", "01FRESH", T0 + 9_000)
    assert (result.outcome, result.error, result.successor) == ("reject", "outbox_requeue_state_invalid", None)
    assert all_rows(outbox.path) == before
    assert outbox.get_by_client_message_id("cm-fresh") is None


def test_requeue_unknown_id_and_new_id_in_use(outbox):
    with pytest.raises(OutboxRowNotFound):
        outbox.requeue("01NOSUCHROW", "cm-fresh", "01FRESH", T0)
    dead = row_in_state(outbox, "dead", "cm-dead")
    taken = accept_new(outbox, "cm-taken")
    before = all_rows(outbox.path)
    for new_cmid in ("cm-taken", "cm-dead"):
        with pytest.raises(NewIdInUse) as caught:
            outbox.requeue(dead.id, new_cmid, "01FRESH", T0)
        assert caught.value.client_message_id == new_cmid
    assert caught.value.existing_id == dead.id
    assert all_rows(outbox.path) == before
    assert taken.status == "pending"


def test_requeue_failing_midway_rolls_back_the_abort(outbox):
    """The abort and the successor insert are one transaction: a failing insert leaves the old row dead."""
    dead = row_in_state(outbox, "dead", "cm-dead")
    existing = accept_new(outbox, "cm-existing")
    before = all_rows(outbox.path)
    with pytest.raises(sqlite3.IntegrityError):
        outbox.requeue(dead.id, "cm-fresh", existing.id, T0)  # successor id collides with a row id
    assert all_rows(outbox.path) == before


# --- recovery and expiry ----------------------------------------------------------------------------------------------


def test_recover_moves_inflight_to_pending_without_counting_an_attempt(tmp_path):
    path = tmp_path / "outbox.db"
    with OutboxStore(path, POLICY) as store:
        flying = [row_in_state(store, "inflight", f"cm-fly-{i}") for i in range(3)]
        others = [row_in_state(store, s, f"cm-{s}") for s in ("pending", "done", "dead", "aborted")]
        before_others = {r.id: store.get(r.id) for r in others}
    # the process "crashed"; a new one opens the file and recovers
    with OutboxStore(path, POLICY) as store:
        results = store.recover(T0 + 60_000)
        assert sorted(r.after.id for r in results) == sorted(r.id for r in flying)
        for row in flying:
            recovered = store.get(row.id)
            assert (recovered.status, recovered.attempts) == ("pending", row.attempts) == ("pending", 1)
            assert recovered.next_attempt_at == T0 + 60_000 + POLICY.retry_base_ms
        assert {i: store.get(i) for i in before_others} == before_others
        assert store.recover(T0 + 70_000) == []


def test_expire_moves_only_expired_pending_rows_to_dead(tmp_path):
    policy = replace(POLICY, max_age_hours=1)
    with OutboxStore(tmp_path / "outbox.db", policy) as store:
        old = accept_new(store, "cm-old", now=T0)
        boundary = accept_new(store, "cm-boundary", now=T0 + 1)
        young = accept_new(store, "cm-young", now=T0 + 30 * 60_000)
        flying = accept_new(store, "cm-flying", now=T0)
        store.transition(flying.id, event("dispatch"))
        now = T0 + HOUR + 1  # past old's max_age_at, exactly at boundary's
        results = store.expire(now)
        assert [r.after.id for r in results] == [old.id]
        dead = store.get(old.id)
        assert (dead.status, dead.last_error) == ("dead", "max_age_exceeded")
        assert results[0].effects == ("emit_outbox_dead",)
        assert store.get(boundary.id).status == store.get(young.id).status == "pending"
        assert store.get(flying.id).status == "inflight"  # never aged out while its ack may arrive (E-14)


def test_transition_many_is_consecutive_transitions_in_one_commit(tmp_path):
    """The drain loop's batched acks: the same rows, results and errors as one ``transition`` call per change."""
    stores = [OutboxStore(tmp_path / f"{name}.db", POLICY) for name in ("one", "many")]
    try:
        for store in stores:
            for cmid in ("cm-a", "cm-b", "cm-c"):
                store.accept(send(), cmid, f"01ROW-{cmid}", T0)
                store.transition(cmid, event("dispatch"), by="client_message_id")
            store.accept(send(), "cm-d", "01ROW-cm-d", T0)
        changes = [
            ("cm-a", event("ack_created", broker_message_id="01BA", history_id="h-a")),
            ("cm-a", event("ack_created", broker_message_id="01BA2", history_id="h-a2")),  # late: sees the first
            ("cm-nope", event("ack_created", broker_message_id="01BN", history_id="h-n")),  # no row
            ("cm-b", event("ack_failed", error="503 busy", jitter_unit=0.5)),
            ("cm-b", event("dispatch")),  # pending again after the failure: dispatched again
            ("cm-c", event("ack_rejected", error="rejected: 403")),
            ("cm-d", event("requeue", successor_id="01ROW-cm-d2", successor_client_message_id="cm-d2")),
            ("cm-d2", event("dispatch")),  # the successor the requeue inserted
            ("cm-d", event("dispatch")),  # aborted now: refused
        ]
        one, many = stores
        expected = []
        for key, change in changes:
            try:
                expected.append(one.transition(key, change, by="client_message_id"))
            except (OutboxRowNotFound, TransitionError) as exc:
                expected.append(type(exc))
        got = many.transition_many(changes, by="client_message_id")
        assert [r if isinstance(r, Transition) else type(r) for r in got] == expected
        assert all_rows(many.path) == all_rows(one.path)
    finally:
        for store in stores:
            store.close()


def test_transition_many_rolls_back_on_a_store_error(outbox):
    first = accept_new(outbox, "cm-1")
    second = accept_new(outbox, "cm-2")
    taken = accept_new(outbox, "cm-taken")
    rows_before = all_rows(outbox.path)
    requeue = event("requeue", actor="operator", successor_id=new_id(), successor_client_message_id="cm-taken")
    with pytest.raises(NewIdInUse):
        outbox.transition_many([(first.id, event("dispatch")), (second.id, requeue)], by="id")
    assert all_rows(outbox.path) == rows_before
    assert outbox.get(taken.id) == taken


def test_drain_is_expire_then_dispatch_of_the_due_rows(tmp_path):
    policy = replace(POLICY, max_age_hours=1)
    with OutboxStore(tmp_path / "a.db", policy) as batched, OutboxStore(tmp_path / "b.db", policy) as single:
        for store in (batched, single):
            for cmid, enqueued_at in (("cm-old", T0), ("cm-due-1", T0 + 30 * 60_000), ("cm-due-2", T0 + 31 * 60_000),
                                      ("cm-due-3", T0 + 32 * 60_000), ("cm-future", T0 + 5 * HOUR)):
                store.accept(send(), cmid, f"01ROW-{cmid}", enqueued_at)
            store.transition("cm-due-3", event("dispatch"), by="client_message_id")
        now = T0 + HOUR + 1
        expected_expired = single.expire(now)
        expected_dispatched = [single.transition(row.id, OutboxEvent("dispatch", now=now), by="id")
                               for row in single.due(now, 1)]
        expired, dispatched = batched.drain(now, 1)
        assert expired == expected_expired and [r.after.client_message_id for r in expired] == ["cm-old"]
        assert dispatched == expected_dispatched
        assert [r.after.client_message_id for r in dispatched] == ["cm-due-1"]
        assert all_rows(batched.path) == all_rows(single.path)
        _, rest = batched.drain(now, 10)
        assert [r.after.client_message_id for r in rest] == ["cm-due-2"]  # cm-due-3 is inflight, cm-future not due
        assert batched.drain(now, 10) == ([], [])


def test_cap_max_age_lowers_live_rows_and_sets_new_rows(tmp_path):
    with OutboxStore(tmp_path / "outbox.db", replace(POLICY, max_age_hours=None)) as store:
        unbounded = accept_new(store, "cm-unbounded")
        done = row_in_state(store, "done", "cm-done")
        assert unbounded.max_age_at is None
        assert store.cap_max_age(72) == 1
        assert store.get(unbounded.id).max_age_at == unbounded.enqueued_at + 72 * HOUR
        assert store.get(done.id).max_age_at is None
        assert store.cap_max_age(100) == 0  # never raised
        assert store.get(unbounded.id).max_age_at == unbounded.enqueued_at + 72 * HOUR
        fresh = accept_new(store, "cm-fresh", now=T0 + 5)
        assert fresh.max_age_at == T0 + 5 + 100 * HOUR
        for invalid in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match="whole number of hours"):
                store.cap_max_age(invalid)
        assert store.policy.max_age_hours == 100


def test_cap_max_age_boundaries_and_expiry_at_the_capped_deadline(tmp_path):
    """A deadline exactly at enqueued_at + max age stays, one ms above is lowered, one below stays; a row is expired
    one ms past its max_age_at, not at it."""
    with OutboxStore(tmp_path / "outbox.db", replace(POLICY, max_age_hours=None)) as store:
        below, at, above = (accept_new(store, f"cm-{name}") for name in ("below", "at", "above"))
        flying = row_in_state(store, "inflight", "cm-flying")
        dead = row_in_state(store, "dead", "cm-dead")
        with sqlite3.connect(store.path) as conn:
            conn.executemany("UPDATE outbox SET max_age_at = ? WHERE id = ?",
                             [(T0 + HOUR - 1, below.id), (T0 + HOUR, at.id), (T0 + HOUR + 1, above.id)])
        assert store.cap_max_age(1) == 2
        assert {r.client_message_id: r.max_age_at for r in (store.get(x.id) for x in (below, at, above, flying, dead))
                } == {"cm-below": T0 + HOUR - 1, "cm-at": T0 + HOUR, "cm-above": T0 + HOUR, "cm-flying": T0 + HOUR,
                      "cm-dead": None}
        assert store.expire(T0 + HOUR - 1) == []
        assert [r.after.client_message_id for r in store.expire(T0 + HOUR)] == ["cm-below"]
        assert [r.after.client_message_id for r in store.expire(T0 + HOUR + 1)] == ["cm-at", "cm-above"]
        assert store.get(flying.id).status == "inflight"


# --- integrity ------------------------------------------------------------------------------------------------------


def corrupt_copy(source: Path, target: Path) -> None:
    """Copy a checkpointed database and overwrite a run of its middle pages with garbage."""
    shutil.copyfile(source, target)
    size = target.stat().st_size
    page = 4096
    pages = size // page
    assert pages > 20, "the fixture needs a database with many pages"
    rng = random.Random(7)
    with target.open("r+b") as handle:
        for number in range(pages // 2, pages // 2 + 6):
            handle.seek(number * page)
            handle.write(rng.randbytes(page))


def test_integrity_check_detects_a_corrupted_outbox(tmp_path):
    path = tmp_path / "outbox.db"
    with OutboxStore(path, POLICY) as store:
        store.accept_batch([AcceptItem.of(send("x" * 400 + str(i)), f"cm-{i}", f"01ROW{i:05d}", T0 + i)
                            for i in range(600)])
        store.integrity_check()
    assert not Path(f"{path}-wal").exists()  # closing checkpointed everything into the main file
    broken = tmp_path / "broken.db"
    corrupt_copy(path, broken)
    with pytest.raises(OutboxCorrupt) as caught, OutboxStore(broken, POLICY) as store:
        store.integrity_check()
    assert str(broken) in str(caught.value)
    with OutboxStore(path, POLICY) as store:  # the original is untouched
        store.integrity_check()
    # An index that no longer matches its table: the file opens, and integrity_check reports it.
    skewed = tmp_path / "skewed.db"
    shutil.copyfile(path, skewed)
    with sqlite3.connect(skewed) as conn:
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET sql = 'CREATE INDEX outbox_pending ON outbox (status, attempts, id)'"
                     " WHERE name = 'outbox_pending'")
    conn.close()
    with OutboxStore(skewed, POLICY) as store:
        assert store.counts()["pending"] == 600
        with pytest.raises(OutboxCorrupt, match="missing from index outbox_pending"):
            store.integrity_check()


def test_outbox_that_is_not_a_database_is_corrupt(tmp_path):
    path = tmp_path / "outbox.db"
    path.write_bytes(b"this is not sqlite" * 500)
    with pytest.raises(OutboxCorrupt):
        OutboxStore(path, POLICY)
    assert path.read_bytes().startswith(b"this is not sqlite")  # the outbox is never moved aside


# --- inbox ----------------------------------------------------------------------------------------------------------


def message(i: int, *, topic: str | None = "general", sender: str = "a" * 64, received_at: int | None = None,
            cmid: str | None = None) -> InboxMessage:
    return InboxMessage(
        id=f"01INBOX{i:05d}", client_message_id=cmid or f"cm-in-{i}", broker_message_id=f"01BRK{i:05d}",
        mesh="mesh-1", topic=topic, sender_pubkey=sender, sender_name="alice", body=f"body {i}",
        meta={"k": i, "nested": {"x": [1, 2]}}, received_at=T0 + i if received_at is None else received_at,
        reply_to_id=None, delivery_id=f"d-{i}",
    )


def test_inbox_schema(inbox):
    conn = sqlite3.connect(inbox.path)
    columns = {name: notnull for _, name, _, notnull, _, _ in conn.execute("PRAGMA table_info(inbox)")}
    assert set(columns) == {"seq", "id", "client_message_id", "broker_message_id", "mesh", "topic", "sender_pubkey",
                            "sender_name", "body", "meta", "received_at", "reply_to_id", "delivery_id"}
    assert all(columns[c] for c in ("client_message_id", "mesh", "sender_pubkey", "sender_name", "received_at"))
    indexed = {row[0] for row in conn.execute("SELECT sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")}
    for column in ("received_at", "topic", "sender_pubkey"):
        assert any(f"inbox ({column})" in sql for sql in indexed)
    conn.close()


def test_inbox_dedupes_on_client_message_id(inbox):
    first = inbox.insert(message(1))
    assert first.seq == 1 and first.meta == {"k": 1, "nested": {"x": [1, 2]}}
    assert inbox.insert(replace(message(2), client_message_id="cm-in-1")) is None
    assert inbox.insert_with_event(message(1)) is None
    assert inbox.events_after(0) == []
    rows, _ = inbox.page()
    assert [r.id for r in rows] == [first.id]
    assert inbox.get(first.id) == first


def test_insert_with_event_is_one_transaction(inbox):
    row, event_id = inbox.insert_with_event(message(1))
    (stored,) = inbox.events_after(0)
    assert (stored.id, stored.name, stored.created_at) == (event_id, "message", T0)
    assert stored.payload == row.as_dict()

    def broken_payload(row):
        raise RuntimeError("payload builder failed")

    with pytest.raises(RuntimeError):
        inbox.insert_with_event(message(2), broken_payload)
    with pytest.raises(TypeError):
        inbox.insert_with_event(message(3), lambda row: {"not json": object()})
    assert [r.id for r in inbox.page()[0]] == [row.id]
    assert [e.id for e in inbox.events_after(0)] == [event_id]
    # the failed messages were not consumed: they can still be stored
    assert inbox.insert_with_event(message(2), lambda r: {"id": r.id}) is not None


def test_inbox_paging_has_no_gaps_or_repeats(inbox):
    expected = []
    for i in range(1, 41):
        topic = "alpha" if i % 3 else "beta"
        sender = "a" * 64 if i % 2 else "b" * 64
        row = inbox.insert(message(i, topic=topic, sender=sender, received_at=T0 + (i // 4) * 1000))
        expected.append(row)

    def read_all(**filters):
        seen, cursor = [], None
        while True:
            rows, cursor = inbox.page(cursor=cursor, limit=7, **filters)
            seen += rows
            if cursor is None:
                return seen

    assert read_all() == expected
    assert read_all(topic="beta") == [r for r in expected if r.topic == "beta"]
    assert read_all(sender="b" * 64) == [r for r in expected if r.sender_pubkey == "b" * 64]
    since = T0 + 5_000
    assert read_all(since_ms=since) == [r for r in expected if r.received_at >= since]
    assert read_all(topic="alpha", sender="a" * 64, since_ms=since) == [
        r for r in expected if r.topic == "alpha" and r.sender_pubkey == "a" * 64 and r.received_at >= since]
    assert inbox.page(topic="gamma") == ([], None)
    # a consumer that read to the end resumes from its last row's cursor and sees only what came later
    last = expected[-1]
    later = inbox.insert(message(99))
    assert inbox.page(cursor=last.cursor) == ([later], None)


@pytest.mark.parametrize("cursor", [
    "", "!!!", "aTE6", base64.urlsafe_b64encode(b"i1:abc").decode(), base64.urlsafe_b64encode(b"o1:1:x").decode(),
    "\u00e9t\u00e9", "A" * 600,
])
def test_inbox_invalid_cursor(inbox, cursor):
    with pytest.raises(InvalidCursor):
        inbox.page(cursor=cursor)


def test_a_cursor_is_held_to_ipc_cursor_chars(outbox):
    """INBOX-CURSOR, LIMIT-TABLE: a well-formed cursor of exactly ipc_cursor_chars characters is decoded; a longer
    one that would decode just as well is refused."""
    cap = limit("ipc_cursor_chars")

    def cursor(id_bytes: int) -> str:
        return base64.urlsafe_b64encode(b"o1:1:" + b"x" * id_bytes).decode().rstrip("=")

    at_cap, past_cap = cursor(cap * 3 // 4 - 5), cursor(cap * 3 // 4 - 4)
    assert (len(at_cap), len(past_cap)) == (cap, cap + 2)
    assert outbox.list(cursor=at_cap) == ([], None)
    with pytest.raises(InvalidCursor, match=r"^invalid cursor$"):
        outbox.list(cursor=past_cap)


def test_events_are_monotonic_and_replay_after_an_id(inbox):
    ids = [inbox.append_event("peer_join", {"n": n}) for n in range(5)]
    assert ids == sorted(ids) and len(set(ids)) == 5
    assert [(e.id, e.payload["n"]) for e in inbox.events_after(ids[1])] == [(ids[2], 2), (ids[3], 3), (ids[4], 4)]
    assert [e.id for e in inbox.events_after(ids[0], limit=2)] == ids[1:3]
    assert inbox.events_after(ids[-1]) == []
    assert inbox.oldest_event_id() == ids[0] and inbox.last_event_id() == ids[-1]


def test_prune_events_never_reuses_ids(inbox):
    ids = [inbox.append_event("e", {"n": n}) for n in range(6)]
    assert inbox.prune_events(keep_last_n=2) == 4
    assert inbox.oldest_event_id() == ids[4]
    assert inbox.prune_events(keep_last_n=0) == 2
    assert inbox.oldest_event_id() is None and inbox.last_event_id() == ids[-1]
    assert inbox.append_event("e", {}) == ids[-1] + 1
    inbox.test_clock["now"] = T0 + 10_000
    newer = inbox.append_event("e", {})
    assert inbox.prune_events(older_than_ms=5_000) == 1
    assert [e.id for e in inbox.events_after(0)] == [newer]
    with pytest.raises(ValueError):
        inbox.prune_events()


def test_events_survive_reopen(tmp_path):
    path = tmp_path / "inbox.db"
    with InboxStore(path) as store:
        first = store.append_event("daemon_reconnect", {"ts": "now"})
    with InboxStore(path) as store:
        assert store.append_event("daemon_disconnect", {}) == first + 1
        assert [e.name for e in store.events_after(0)] == ["daemon_reconnect", "daemon_disconnect"]


def test_quarantine_of_a_garbage_inbox(tmp_path):
    path = tmp_path / "inbox.db"
    path.write_bytes(b"\x00garbage" * 1000)
    Path(f"{path}-wal").write_bytes(b"stale wal")
    store, quarantined = InboxStore.open_or_quarantine(path)
    try:
        assert quarantined is not None and quarantined.name.startswith("inbox.db.corrupt-")
        assert int(quarantined.name.rsplit("-", 1)[1]) > 0
        assert quarantined.read_bytes() == b"\x00garbage" * 1000
        assert Path(f"{quarantined}-wal").read_bytes() == b"stale wal"
        assert store.insert(message(1)).seq > 1
        store.integrity_check()
    finally:
        store.close()
    again, flag = InboxStore.open_or_quarantine(path)  # healthy now: kept
    with again:
        assert flag is None and again.page()[0][0].id == "01INBOX00001"


def test_a_recreated_inbox_numbers_above_the_quarantined_one(tmp_path):
    """E-45: after a quarantine, inbox seq and SSE event ids continue above the old file's -- a client's since cursor
    and Last-Event-ID still see the new rows and events; a resumed stream is told of the gap (replay_gap)."""
    path = tmp_path / "inbox.db"
    clock = [1_795_000_000_000]
    with InboxStore(path, clock=lambda: clock[0]) as store:
        rows = [store.insert_with_event(message(i))[0] for i in range(1, 30)]
        seqs, old_cursor = [r.seq for r in rows], rows[-1].cursor
        last_event = store.last_event_id()
        assert seqs == list(range(1, 30)) and last_event == 29  # a first inbox numbers from 1
    path.write_bytes(b"\x00garbage" * 1000)
    clock[0] += 1
    store, quarantined = InboxStore.open_or_quarantine(path, clock=lambda: clock[0])
    with store:
        assert quarantined is not None
        row, event_id = store.insert_with_event(message(1))
        assert row.seq == clock[0] * 1000 + 1 > seqs[-1] and event_id == clock[0] * 1000 + 1 > last_event
        assert [r.seq for r in store.page(cursor=old_cursor)[0]] == [row.seq]  # the old file's last cursor
        assert [e.id for e in store.events_after(last_event, 10)] == [event_id]
        assert store.oldest_event_id() == event_id and store.last_event_id() == event_id


def test_quarantine_of_an_inbox_failing_integrity_check(tmp_path):
    path = tmp_path / "source.db"
    with InboxStore(path, synchronous="OFF") as store:  # only builds the fixture file
        for i in range(500):
            store.insert(replace(message(i), body="y" * 500))
    target = tmp_path / "inbox.db"
    corrupt_copy(path, target)
    with pytest.raises(InboxCorrupt), InboxStore(target) as store:
        store.integrity_check()
    store, quarantined = InboxStore.open_or_quarantine(target)
    with store:
        assert quarantined is not None and quarantined.exists()
        assert store.page() == ([], None)


def _scramble_after(path, start: int) -> None:
    size = path.stat().st_size
    with path.open("r+b") as handle:
        handle.seek(start)
        handle.write(bytes(range(7, 251)) * ((size - start) // 244 + 1))


def test_damage_is_found_before_the_migrations_read_the_schema(tmp_path):
    """A mangled schema page used to read as "no migration applied", the migration then failed on the existing
    tables, and the daemon exited 1 instead of refusing (outbox, exit 5) or quarantining (inbox)."""
    from reference.core import OutboxPolicy
    from reference.daemon.store import InboxStore, OutboxCorrupt, OutboxStore

    OutboxStore(tmp_path / "outbox.db", OutboxPolicy(), "FULL").close()
    InboxStore.open_or_quarantine(tmp_path / "inbox.db")[0].close()
    for name in ("outbox.db", "inbox.db"):
        _scramble_after(tmp_path / name, 4096 + 200)
    with pytest.raises(OutboxCorrupt):
        OutboxStore(tmp_path / "outbox.db", OutboxPolicy(), "FULL")
    store, quarantined = InboxStore.open_or_quarantine(tmp_path / "inbox.db")
    try:
        assert quarantined is not None and quarantined.name.startswith("inbox.db.corrupt-")
    finally:
        store.close()
