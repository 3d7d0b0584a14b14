"""The broker store contract (§4.3–§4.7, §17, E-10, E-21): one suite, run against every engine.

Each test gets a fresh migrated store (see conftest.py) and checks the ack, the rows the accept left (or did not
leave) and, at the end, that the §4.7.3 inventory is clean.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime

import pytest
from store_testkit import (
    BOB,
    CAROL,
    DAVE,
    DAY_MS,
    MESH,
    OUTSIDER,
    PERMANENT_MESH,
    RETENTION_DAYS,
    SENDER,
    T0,
    fingerprint_of,
    make_request,
    new_ids,
    populate,
    raw_execute,
    valid_ack,
)

from reference.broker.store import AcceptChecks, BrokerStore, StoreError, open_store, rfc3339_ms
from reference.core.fingerprint import fingerprint_prefix

MESSAGE_TABLES = ("client_message_dedupe", "topic_message", "message_queue", "message_history", "delivery_queue")
NO_EFFECTS = {"dedupe": 0, "message": 0, "history": 0, "delivery": 0}


def message_rows(store: BrokerStore) -> dict[str, int]:
    counts = store.counts()
    return {table: counts[table] for table in MESSAGE_TABLES}


def nothing_written(store: BrokerStore) -> bool:
    return not any(message_rows(store).values())


def accept(store: BrokerStore, req, checks: AcceptChecks | None = None):
    """Accept ``req`` under fresh ids; every answer is checked against the ack schema."""
    broker_message_id, history_id = new_ids()
    return valid_ack(store.accept(req, broker_message_id, history_id, checks)), broker_message_id, history_id


# --- BRK-FIRST-INSERT / BRK-ATOMIC ------------------------------------------------------------------------------------


def test_first_insert_commits_all_four_effects_and_answers_201(store: BrokerStore) -> None:
    req = make_request()
    result, broker_message_id, history_id = accept(store, req)

    assert (result.http_status, result.table_row) == (201, "BRK-ACCEPT")
    assert result.body == {
        "broker_message_id": broker_message_id, "client_message_id": "cmid-1", "history_id": history_id,
        "duplicate": False,
    }
    assert result.effects == {"dedupe": 1, "message": 1, "history": 1, "delivery": 2}
    assert sorted(result.recipients) == [BOB, CAROL]  # topic subscribers except the sender
    assert message_rows(store) == {
        "client_message_dedupe": 1, "topic_message": 1, "message_queue": 0, "message_history": 1, "delivery_queue": 2,
    }
    stored = raw_execute(store, "SELECT request_fingerprint, broker_message_id FROM {s}client_message_dedupe")
    assert [(bytes(fp), bmid) for fp, bmid in stored] == [(fingerprint_of(req), broker_message_id)]
    assert store.orphan_check() == []


@pytest.mark.parametrize(
    ("kind", "ref", "table", "recipients"),
    [
        ("dm", BOB, "message_queue", [BOB]),
        ("queue", "jobs", "message_queue", [CAROL, DAVE]),
        ("topic", "quiet", "topic_message", []),
    ],
)
def test_each_destination_kind_lands_in_its_table_with_one_delivery_per_recipient(
    store: BrokerStore, kind: str, ref: str, table: str, recipients: list[str]
) -> None:
    result, _, _ = accept(store, make_request(destination_kind=kind, destination_ref=ref))

    assert result.http_status == 201
    assert sorted(result.recipients) == recipients
    assert result.effects == {"dedupe": 1, "message": 1, "history": 1, "delivery": len(recipients)}
    assert store.counts()[table] == 1
    assert store.counts()["delivery_queue"] == len(recipients)
    assert store.orphan_check() == []


# --- BRK-DUP-MATCH / BRK-DUP-MISMATCH ---------------------------------------------------------------------------------


def test_duplicate_answers_200_with_the_original_ids_and_writes_nothing(store: BrokerStore) -> None:
    first, broker_message_id, history_id = accept(store, make_request())
    before = message_rows(store)

    retry, retry_id, _ = accept(store, make_request(received_at_ms=T0 + 5_000))

    assert first.http_status == 201
    assert (retry.http_status, retry.table_row) == (200, "BRK-DUP-MATCH")
    assert retry_id != broker_message_id
    assert retry.body == {
        "broker_message_id": broker_message_id, "client_message_id": "cmid-1", "history_id": history_id,
        "duplicate": True, "history_available": True, "first_seen_at": rfc3339_ms(T0),
    }
    assert retry.effects == NO_EFFECTS
    assert message_rows(store) == before
    assert store.orphan_check() == []


def test_fingerprint_mismatch_answers_409_with_the_brokers_prefix_and_writes_nothing(store: BrokerStore) -> None:
    accept(store, make_request())
    before = message_rows(store)
    different = make_request(body="a different body")

    result, _, _ = accept(store, different)

    assert (result.http_status, result.table_row) == (409, "BRK-DUP-MISMATCH")
    assert result.body == {
        "client_message_id": "cmid-1", "error": "idempotency_key_reused", "conflict": "request_fingerprint_mismatch",
        "broker_fingerprint_prefix": fingerprint_prefix(fingerprint_of(different)),  # this request's (cf. E-26)
    }
    assert result.metric == "cm_broker_dedupe_fingerprint_mismatch_total"
    assert result.effects == NO_EFFECTS
    assert message_rows(store) == before
    assert store.orphan_check() == []


# --- BRK-RECOMPUTE (E-21) ---------------------------------------------------------------------------------------------


def test_canonical_form_drift_answers_409_before_any_write(store: BrokerStore) -> None:
    req = make_request(claimed=b"\x01" * 32)

    result, _, _ = accept(store, req)

    assert (result.http_status, result.table_row) == (409, "BRK-DRIFT")
    assert result.body == {
        "client_message_id": "cmid-1", "error": "idempotency_key_reused", "conflict": "canonical_form_drift",
        "broker_fingerprint_prefix": fingerprint_prefix(fingerprint_of(req)),
    }
    assert result.metric == "cm_broker_dedupe_fingerprint_mismatch_total"
    assert nothing_written(store)
    assert accept(store, make_request())[0].http_status == 201  # the id was never consumed


# --- BRK-B1-NO-WRITE --------------------------------------------------------------------------------------------------

B1_CASES = {
    "not_a_member": (dict(sender_pubkey=OUTSIDER), None, 403, "not_a_member"),
    "unknown_mesh": (dict(mesh_id="no-such-mesh"), None, 404, "mesh_not_found"),
    "bad_kind": (dict(destination_kind="group", destination_ref="everyone"), None, 400, "invalid_destination"),
    "too_large": (dict(body="x" * 1025), AcceptChecks(max_payload_bytes=1024), 413, "payload_too_large"),
    "rate_limited": ({}, AcceptChecks(rate_limit=lambda req: False), 429, "rate_limited"),
    "meta_not_canonicalizable": (dict(meta={"n": 2**60}), None, 400, "invalid_frame"),
}


@pytest.mark.parametrize("case", list(B1_CASES))
def test_b1_rejection_writes_nothing_and_leaves_the_id_free(store: BrokerStore, case: str) -> None:
    fields, checks, status, error = B1_CASES[case]
    req = make_request(claimed=b"\x00" * 32, **fields) if case == "meta_not_canonicalizable" else make_request(**fields)

    result, _, _ = accept(store, req, checks)

    assert (result.http_status, result.table_row) == (status, "BRK-B1-REJECT")
    assert result.body["error"] == error
    assert result.body["client_message_id"] == "cmid-1"
    assert set(result.body) <= {"client_message_id", "error", "detail"}
    assert result.effects == NO_EFFECTS
    assert nothing_written(store)
    assert accept(store, make_request())[0].http_status == 201


def test_rate_limit_is_consulted_only_for_frames_that_pass_every_other_b1_check(store: BrokerStore) -> None:
    seen: list[str] = []
    checks = AcceptChecks(rate_limit=lambda req: seen.append(req.client_message_id) or True)

    accept(store, make_request(sender_pubkey=OUTSIDER, client_message_id="refused"), checks)
    accept(store, make_request(client_message_id="allowed"), checks)

    assert seen == ["allowed"]


# --- BRK-B2-ROLLBACK --------------------------------------------------------------------------------------------------

B2_CASES = {
    "unknown_topic": dict(destination_kind="topic", destination_ref="nowhere"),
    "dm_to_non_member": dict(destination_kind="dm", destination_ref=OUTSIDER),
    "unknown_queue": dict(destination_kind="queue", destination_ref="no-such-queue"),
}


@pytest.mark.parametrize("case", list(B2_CASES))
def test_b2_rejection_rolls_back_the_dedupe_claim(store: BrokerStore, case: str) -> None:
    req = make_request(**B2_CASES[case])

    result, _, _ = accept(store, req)

    assert (result.http_status, result.table_row) == (404, "BRK-B2-REJECT")
    assert result.body["error"] == "destination_not_found"
    assert result.effects == NO_EFFECTS
    assert nothing_written(store)
    # the id stays free: once the destination exists, the same id commits
    if req.destination_kind == "topic":
        store.create_topic(MESH, "nowhere")
    elif req.destination_kind == "dm":
        store.add_member(MESH, OUTSIDER)
    else:
        store.create_queue(MESH, "no-such-queue", [BOB])
    assert accept(store, req)[0].http_status == 201
    assert store.orphan_check() == []


# --- BRK-ATOMIC: a failure inside the transaction ---------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["message", "history", "delivery", "commit"])
def test_failure_inside_the_transaction_leaves_nothing_then_a_retry_commits(store: BrokerStore, stage: str) -> None:
    def fail(at: str) -> None:
        if at == stage:
            raise RuntimeError(f"injected failure before {at}")

    store.fault_hook = fail
    result, _, _ = accept(store, make_request())

    assert (result.http_status, result.table_row) == (500, "BRK-COMMIT-FAIL")
    assert result.body["error"] == "internal_error"
    assert "injected failure" in result.body["detail"]
    assert result.effects == NO_EFFECTS
    assert nothing_written(store)
    assert store.pending_deliveries(BOB, T0 + 1, 1_000) == []

    store.fault_hook = None
    assert accept(store, make_request())[0].http_status == 201
    assert store.orphan_check() == []


def test_a_store_fault_before_the_decision_answers_500_outside_the_table(store: BrokerStore) -> None:
    store.close()

    result, _, _ = accept(store, make_request())

    assert (result.http_status, result.table_row, result.body["error"]) == (500, None, "internal_error")
    assert "closed" in result.body["detail"]


def test_a_constraint_violation_on_the_message_insert_rolls_back_the_claim(store: BrokerStore) -> None:
    first, broker_message_id, _ = accept(store, make_request(client_message_id="first"))
    before = message_rows(store)

    # the same broker_message_id again: the claim is "ours", then the message row's primary key refuses it
    clash = valid_ack(store.accept(make_request(client_message_id="second"), broker_message_id, new_ids()[1]))

    assert first.http_status == 201
    assert (clash.http_status, clash.table_row) == (500, "BRK-COMMIT-FAIL")
    assert message_rows(store) == before
    assert accept(store, make_request(client_message_id="second"))[0].http_status == 201
    assert store.orphan_check() == []


def test_a_constraint_violation_that_surfaces_at_a_later_statement_still_rolls_back(store: BrokerStore) -> None:
    """The same clash, with the history insert held back until the message insert's error has come back: a
    pipelining engine then raises it at the history insert, not at a sync, and must still roll the send back to its
    savepoint (it once answered a bare 500 with the pipeline aborted)."""
    _, broker_message_id, _ = accept(store, make_request(client_message_id="first"))
    before = message_rows(store)
    store.fault_hook = lambda stage: time.sleep(0.3) if stage == "history" else None

    clash = valid_ack(store.accept(make_request(client_message_id="second"), broker_message_id, new_ids()[1]))

    store.fault_hook = None
    assert (clash.http_status, clash.table_row) == (500, "BRK-COMMIT-FAIL")
    assert message_rows(store) == before
    assert accept(store, make_request(client_message_id="second"))[0].http_status == 201
    assert store.orphan_check() == []


# --- deliveries: lease → push → ack (BRK-REDELIVER, BRK-DELIVERY-COMMITTED) ------------------------------------------


def test_a_delivery_is_leased_redelivered_after_the_lease_and_never_after_the_ack(store: BrokerStore) -> None:
    req = make_request(meta={"k": [1, "two"]}, reply_to_id="01HQXREPLY", priority="now")
    _, broker_message_id, history_id = accept(store, req)

    [first] = store.pending_deliveries(BOB, now_ms=T0 + 10, lease_ms=1_000)
    assert (first.attempt, first.lease_until_ms, first.recipient_pubkey) == (1, T0 + 1_010, BOB)
    assert (first.broker_message_id, first.history_id, first.client_message_id) == (
        broker_message_id, history_id, "cmid-1")
    assert (first.sender_pubkey, first.destination_kind, first.destination_ref) == (SENDER, "topic", "general")
    assert (first.body, first.meta, first.priority, first.reply_to_id) == ("hello", {"k": [1, "two"]}, "now",
                                                                           "01HQXREPLY")
    assert first.created_at_ms == T0

    assert store.pending_deliveries(BOB, now_ms=T0 + 1_009, lease_ms=1_000) == []  # still leased
    [again] = store.pending_deliveries(BOB, now_ms=T0 + 1_010, lease_ms=1_000)
    assert (again.delivery_id, again.attempt) == (first.delivery_id, 2)

    assert store.ack_delivery(first.delivery_id, BOB, now_ms=T0 + 1_100)
    assert store.ack_delivery(first.delivery_id, BOB, now_ms=T0 + 1_200)  # idempotent
    assert not store.ack_delivery(first.delivery_id, CAROL)  # not CAROL's delivery
    assert store.pending_deliveries(BOB, now_ms=T0 + 100_000, lease_ms=1_000) == []

    [carols] = store.pending_deliveries(CAROL, now_ms=T0 + 100_000, lease_ms=1_000)  # untouched by BOB's ack
    assert carols.attempt == 1
    assert store.pending_deliveries(SENDER, now_ms=T0 + 100_000, lease_ms=1_000) == []
    assert store.orphan_check() == []


def test_deliveries_come_in_acceptance_order_and_respect_the_limit(store: BrokerStore) -> None:
    ids = [accept(store, make_request(client_message_id=f"c{i}", body=f"m{i}"))[1] for i in range(3)]

    leased = [store.pending_deliveries(BOB, now_ms=T0 + 1, lease_ms=60_000, limit=1) for _ in range(4)]

    assert [[d.broker_message_id for d in batch] for batch in leased] == [[ids[0]], [ids[1]], [ids[2]], []]


def test_an_uncommitted_message_is_never_delivered(store: BrokerStore) -> None:
    inside, release = threading.Event(), threading.Event()

    def hold_before_commit(stage: str) -> None:
        if stage == "commit":
            inside.set()
            assert release.wait(20)

    store.fault_hook = hold_before_commit
    results = []
    worker = threading.Thread(target=lambda: results.append(accept(store, make_request())[0]))
    worker.start()
    try:
        assert inside.wait(20)
        assert store.pending_deliveries(BOB, now_ms=T0 + 1, lease_ms=1_000) == []
        assert store.counts()["delivery_queue"] == 0
    finally:
        release.set()
        worker.join(20)
    store.fault_hook = None

    assert results[0].http_status == 201
    assert len(store.pending_deliveries(BOB, now_ms=T0 + 1, lease_ms=1_000)) == 1


# --- reads: membership at hello, policy for negotiation, members and topics, what a sweep prunes ---------------------


def test_reads_of_membership_policy_members_and_topics(store: BrokerStore) -> None:
    assert store.mesh_policy(MESH) == {"dedupe_mode": "retention_scoped", "retention_days": RETENTION_DAYS}
    assert store.mesh_policy(PERMANENT_MESH) == {"dedupe_mode": "permanent", "retention_days": None}
    assert store.mesh_policy("no-such-mesh") is None
    assert store.is_member(MESH, SENDER) and not store.is_member(MESH, OUTSIDER)
    assert not store.is_member("no-such-mesh", SENDER)
    assert store.members(MESH) == [{"pubkey": key, "display_name": key[:1]} for key in (SENDER, BOB, CAROL, DAVE)]
    assert store.members("no-such-mesh") == []
    assert store.topics(MESH) == ["general", "quiet"]
    assert store.topics("no-such-mesh") == []


def test_prunable_names_exactly_what_prune_messages_flips(store: BrokerStore) -> None:
    _, old_id, _ = accept(store, make_request(client_message_id="old"))
    _, dm_id, _ = accept(store, make_request(client_message_id="old-dm", destination_kind="dm", destination_ref=BOB))
    accept(store, make_request(client_message_id="new", received_at_ms=T0 + DAY_MS))

    listed = store.prunable(before_ms=T0 + 1)
    assert listed == sorted([{"mesh_id": MESH, "broker_message_id": old_id, "client_message_id": "old"},
                             {"mesh_id": MESH, "broker_message_id": dm_id, "client_message_id": "old-dm"}],
                            key=lambda row: row["broker_message_id"])
    assert store.prune_messages(before_ms=T0 + 1) == 2
    assert store.prunable(before_ms=T0 + 1) == []  # flipped already: history_available is false
    assert store.orphan_check(now_ms=T0 + DAY_MS) == []


# --- retention, expiry (§17 steps 5 and 6; BRK-HISTORY-AVAILABLE, BRK-DEDUPE-EXPIRY) ----------------------------------


def test_pruning_flips_history_available_and_a_later_duplicate_says_so(store: BrokerStore) -> None:
    _, old_id, old_history = accept(store, make_request(client_message_id="old"))
    _, new_id, new_history = accept(store, make_request(client_message_id="new", received_at_ms=T0 + DAY_MS))

    assert store.prune_messages(before_ms=T0 + 1) == 1

    counts = store.counts()
    assert (counts["topic_message"], counts["client_message_dedupe"], counts["delivery_queue"]) == (1, 2, 2)
    assert store.pending_deliveries(BOB, now_ms=T0 + 2 * DAY_MS, lease_ms=1)[0].broker_message_id == new_id
    old_retry = accept(store, make_request(client_message_id="old", received_at_ms=T0 + DAY_MS))[0]
    assert old_retry.body == {
        "broker_message_id": old_id, "client_message_id": "old", "history_id": old_history, "duplicate": True,
        "history_available": False, "first_seen_at": rfc3339_ms(T0),
    }
    new_retry = accept(store, make_request(client_message_id="new", received_at_ms=T0 + DAY_MS))[0]
    assert (new_retry.body["history_available"], new_retry.body["history_id"]) == (True, new_history)
    assert store.orphan_check(now_ms=T0 + DAY_MS) == []


def test_expiry_after_pruning_takes_the_kept_history_row_with_it(store: BrokerStore) -> None:
    window = RETENTION_DAYS * DAY_MS
    accept(store, make_request(client_message_id="old"))
    store.prune_messages(before_ms=T0 + 1)
    assert store.counts()["message_history"] == 1  # kept for the duplicate's history_id

    assert store.expire_dedupe(now_ms=T0 + window + 1) == 1

    assert not any(message_rows(store).values())
    assert store.orphan_check(now_ms=T0 + window + 1) == []


def test_pruning_a_message_whose_dedupe_row_expired_deletes_its_history(store: BrokerStore) -> None:
    window = RETENTION_DAYS * DAY_MS
    accept(store, make_request(client_message_id="old"))
    assert store.expire_dedupe(now_ms=T0 + window + 1) == 1
    assert store.counts()["message_history"] == 1  # the message is still there

    assert store.prune_messages(before_ms=T0 + 1) == 1

    assert not any(message_rows(store).values())
    assert store.orphan_check(now_ms=T0 + window + 1) == []


def test_expiry_deletes_only_expired_dedupe_rows_and_frees_their_ids(store: BrokerStore) -> None:
    window = RETENTION_DAYS * DAY_MS
    _, first_id, _ = accept(store, make_request(client_message_id="early"))
    accept(store, make_request(client_message_id="late", received_at_ms=T0 + DAY_MS))

    assert store.expire_dedupe(now_ms=T0 + window) == 0  # expires_at < now, strictly
    assert store.expire_dedupe(now_ms=T0 + window + 1) == 1
    assert store.counts()["client_message_dedupe"] == 1

    retry, retry_id, _ = accept(store, make_request(client_message_id="early", received_at_ms=T0 + window + 2))
    assert retry.http_status == 201 and retry_id != first_id  # §4.12: a retry past the window is a new send
    assert store.orphan_check(now_ms=T0 + window + 2) == []


def test_an_explicit_dedupe_expiry_is_honoured_in_retention_mode(store: BrokerStore) -> None:
    accept(store, make_request(dedupe_expires_at_ms=T0 + 60_000))

    assert store.expire_dedupe(now_ms=T0 + 60_001) == 1


def test_permanent_mode_never_expires_dedupe_rows(store: BrokerStore) -> None:
    accept(store, make_request(mesh_id=PERMANENT_MESH, client_message_id="p1"))
    accept(store, make_request(mesh_id=PERMANENT_MESH, client_message_id="p2", dedupe_expires_at_ms=T0 + 1))

    assert store.expire_dedupe(now_ms=T0 + 10_000 * DAY_MS) == 0
    assert store.counts()["client_message_dedupe"] == 2
    assert raw_execute(store, "SELECT count(*) FROM {s}client_message_dedupe WHERE expires_at IS NOT NULL") == [(0,)]
    assert store.orphan_check(now_ms=T0 + 10_000 * DAY_MS) == []


# --- §4.7.3 inventory (BRK-ORPHAN-CHECK) ------------------------------------------------------------------------------


def test_orphan_check_names_a_message_deleted_behind_the_stores_back(store: BrokerStore) -> None:
    _, broker_message_id, history_id = accept(store, make_request())
    accept(store, make_request(client_message_id="other"))
    assert store.orphan_check() == []

    raw_execute(store, f"DELETE FROM {{s}}topic_message WHERE id = '{broker_message_id}'")
    found = {(v.kind, v.ref) for v in store.orphan_check()}

    assert ("dedupe_without_message", "cmid-1") in found
    assert ("history_without_message", broker_message_id) in found
    assert {kind for kind, _ in found} == {"dedupe_without_message", "history_without_message",
                                           "delivery_without_message"}
    violations = store.orphan_check()
    assert any(broker_message_id in v.detail for v in violations if v.kind == "dedupe_without_message")
    assert all(v.mesh_id == MESH for v in violations)
    assert history_id in next(v.detail for v in violations if v.kind == "history_without_message")


def test_orphan_check_names_missing_dedupe_and_delivery_rows(store: BrokerStore) -> None:
    _, broker_message_id, _ = accept(store, make_request())
    raw_execute(store, "DELETE FROM {s}client_message_dedupe")
    found = {(v.kind, v.ref) for v in store.orphan_check(now_ms=T0 + 1)}
    assert ("message_without_dedupe", broker_message_id) in found
    assert "delivery_without_dedupe" in {kind for kind, _ in found}

    # once the mesh's window has passed, a missing dedupe row is what expiry leaves: not a violation
    assert store.orphan_check(now_ms=T0 + RETENTION_DAYS * DAY_MS) == []

    _, second_id, _ = accept(store, make_request(client_message_id="second"))
    raw_execute(store, f"DELETE FROM {{s}}delivery_queue WHERE broker_message_id = '{second_id}' "
                       f"AND recipient_pubkey = '{BOB}'")
    assert ("delivery_count_mismatch", second_id) in {(v.kind, v.ref) for v in store.orphan_check(now_ms=T0 + 1)}


# --- migrations -------------------------------------------------------------------------------------------------------


def test_migrations_are_versioned_and_idempotent(bare_store: BrokerStore) -> None:
    assert bare_store.migrate() == [1]
    assert bare_store.migrate() == []
    bare_store.add_mesh(MESH, MESH, "retention_scoped", RETENTION_DAYS)

    again = open_store(bare_store.url)
    try:
        assert again.migrate() == []
    finally:
        again.close()
    assert bare_store.counts()["mesh"] == 1
    assert raw_execute(bare_store, "SELECT version FROM {s}schema_migrations") == [(1,)]


def test_the_stores_own_times_are_its_clocks(store_url: str) -> None:
    """What the store stamps on its own (an applied migration) and the now of a maintenance call given none are the
    clock it was opened with, not the host's."""
    store = open_store(store_url, clock=lambda: T0 + 7)
    try:
        store.migrate()
        [(applied_at,)] = raw_execute(store, "SELECT applied_at FROM {s}schema_migrations")
        assert unix_ms(applied_at) == T0 + 7
        populate(store)
        accept(store, make_request())
        [delivery] = store.pending_deliveries(BOB, now_ms=T0 + 1, lease_ms=1_000)
        assert store.ack_delivery(delivery.delivery_id, BOB)
        [(acked_at,)] = raw_execute(store, "SELECT acked_at FROM {s}delivery_queue WHERE id = "
                                           + str(delivery.delivery_id))
        assert unix_ms(acked_at) == T0 + 7
    finally:
        store.close()


def unix_ms(value: int | datetime) -> int:
    """A time column's value in unix ms (SQLite stores the integer, PostgreSQL a timestamptz)."""
    return value if isinstance(value, int) else round(value.timestamp() * 1000)


def test_a_database_migrated_by_newer_code_is_refused(bare_store: BrokerStore) -> None:
    bare_store.migrate()
    raw_execute(bare_store, "INSERT INTO {s}schema_migrations (version, name, applied_at) VALUES (9999, 'x', 0)")

    with pytest.raises(StoreError, match="9999"):
        bare_store.migrate()


# --- open_store -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["sqlite:///:memory:", "sqlite:///", "mysql://x", "broker.db"])
def test_open_store_refuses_what_it_cannot_serve(url: str) -> None:
    with pytest.raises(ValueError):
        open_store(url)
