"""Group commit on every engine: ``accept_batch`` decides each send as ``accept`` would, under one COMMIT.

Each send keeps its own atomicity inside the shared transaction (whatever it must not keep leaves nothing behind), a
key appears at most once per transaction (so a repeat is answered from a committed row: BRK-CONCURRENT-ONE-MESSAGE
holds within a group), and a failed COMMIT turns the group's 201s into 500s with nothing left behind (BRK-ATOMIC).
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor

from store_testkit import BOB, CAROL, MESH, OUTSIDER, make_request, new_ids, valid_ack

from reference.broker.store import BrokerStore

MESSAGE_TABLES = ("client_message_dedupe", "topic_message", "message_queue", "message_history", "delivery_queue")


def batch(store: BrokerStore, requests: list) -> list[tuple]:
    """Accept ``requests`` as one batch under fresh ids: [(result, broker_message_id)], each ack schema-checked."""
    calls = [(req, *new_ids()) for req in requests]
    return [(valid_ack(result), call[1]) for result, call in zip(store.accept_batch(calls), calls, strict=True)]


def message_rows(store: BrokerStore) -> dict[str, int]:
    counts = store.counts()
    return {table: counts[table] for table in MESSAGE_TABLES}


def test_one_key_many_times_in_a_group_commits_exactly_one_message(store: BrokerStore) -> None:
    requests = [make_request(body="variant A" if i % 2 == 0 else "variant B") for i in range(16)]

    outcomes = batch(store, requests)

    statuses = [result.http_status for result, _ in outcomes]
    assert statuses.count(201) == 1, statuses
    winner = statuses.index(201)
    for req, (result, _) in zip(requests, outcomes, strict=True):
        if result.http_status == 201:
            continue
        if req.body == requests[winner].body:
            assert (result.http_status, result.table_row) == (200, "BRK-DUP-MATCH")
            assert result.body["broker_message_id"] == outcomes[winner][1]
        else:
            assert (result.http_status, result.body["conflict"]) == (409, "request_fingerprint_mismatch")
    assert message_rows(store) == {"client_message_dedupe": 1, "topic_message": 1, "message_queue": 0,
                                   "message_history": 1, "delivery_queue": 2}
    assert store.orphan_check() == []


def test_a_mixed_group_answers_each_send_as_alone_and_keeps_only_its_201s(store: BrokerStore) -> None:
    [(old, old_id)] = batch(store, [make_request(client_message_id="old")])
    requests = [
        make_request(client_message_id="new-topic"),
        make_request(client_message_id="b2", destination_ref="nowhere"),
        make_request(client_message_id="b1", sender_pubkey=OUTSIDER),
        make_request(client_message_id="drift", claimed=b"\x00" * 32),
        make_request(client_message_id="old"),
        make_request(client_message_id="old", body="another body"),
        make_request(client_message_id="new-queue", destination_kind="queue", destination_ref="jobs"),
        make_request(client_message_id="new-dm", destination_kind="dm", destination_ref=BOB),
    ]

    outcomes = batch(store, requests)

    assert old.http_status == 201
    assert [(result.http_status, result.table_row) for result, _ in outcomes] == [
        (201, "BRK-ACCEPT"), (404, "BRK-B2-REJECT"), (403, "BRK-B1-REJECT"), (409, "BRK-DRIFT"),
        (200, "BRK-DUP-MATCH"), (409, "BRK-DUP-MISMATCH"), (201, "BRK-ACCEPT"), (201, "BRK-ACCEPT")]
    assert outcomes[4][0].body["broker_message_id"] == old_id
    assert [result.recipients for result, _ in outcomes if result.http_status == 201] == [
        (BOB, CAROL), (CAROL, "d" * 64), (BOB,)]
    assert message_rows(store) == {"client_message_dedupe": 4, "topic_message": 2, "message_queue": 2,
                                   "message_history": 4, "delivery_queue": 2 + 2 + 2 + 1}
    assert store.orphan_check() == []
    # what the group did not commit left its ids free
    assert batch(store, [make_request(client_message_id=cmid) for cmid in ("b2", "b1", "drift")])[0][0].http_status \
        == 201


def test_a_failure_inside_one_send_leaves_the_rest_of_its_group_committed(store: BrokerStore) -> None:
    seen: list[str] = []

    def fail_second_history(stage: str) -> None:
        if stage == "history":
            seen.append(stage)
            if len(seen) == 2:
                raise RuntimeError("injected failure before the second history row")

    store.fault_hook = fail_second_history
    outcomes = batch(store, [make_request(client_message_id=f"c{i}", body=f"b{i}") for i in range(3)])
    store.fault_hook = None

    assert [(result.http_status, result.table_row) for result, _ in outcomes] == [
        (201, "BRK-ACCEPT"), (500, "BRK-COMMIT-FAIL"), (201, "BRK-ACCEPT")]
    assert message_rows(store)["client_message_dedupe"] == 2
    assert message_rows(store)["delivery_queue"] == 4
    assert store.orphan_check() == []
    assert batch(store, [make_request(client_message_id="c1", body="b1")])[0][0].http_status == 201


def test_a_failed_group_commit_turns_its_201s_into_500s_and_leaves_nothing(store: BrokerStore, monkeypatch) -> None:
    def refuse(conn) -> None:
        raise RuntimeError("injected COMMIT failure")

    monkeypatch.setattr(store, "_commit", refuse)
    outcomes = batch(store, [make_request(client_message_id="c1"), make_request(client_message_id="c2"),
                             make_request(client_message_id="b2", destination_ref="nowhere")])
    monkeypatch.undo()

    assert [(result.http_status, result.table_row) for result, _ in outcomes] == [
        (500, "BRK-COMMIT-FAIL"), (500, "BRK-COMMIT-FAIL"), (404, "BRK-B2-REJECT")]
    assert "injected COMMIT failure" in outcomes[0][0].body["detail"]
    assert not any(message_rows(store).values())
    assert [result.http_status for result, _ in batch(store, [make_request(client_message_id="c1")])] == [201]
    assert store.orphan_check() == []


def test_concurrent_groups_over_the_same_keys_commit_each_key_once(store: BrokerStore) -> None:
    keys = [f"cmid-{i}" for i in range(8)]
    orders = [random.Random(seed).sample(keys, len(keys)) for seed in range(4)]
    barrier = threading.Barrier(len(orders))

    def one(order: list[str]) -> list[tuple[str, int]]:
        requests = [make_request(client_message_id=key, body=f"body of {key}") for key in order]
        calls = [(req, *new_ids()) for req in requests]
        barrier.wait(timeout=30)
        return [(req.client_message_id, valid_ack(result).http_status)
                for req, result in zip(requests, store.accept_batch(calls), strict=True)]

    with ThreadPoolExecutor(max_workers=len(orders)) as pool:
        answers = [answer for answers in pool.map(one, orders, timeout=120) for answer in answers]

    for key in keys:
        assert sorted(status for cmid, status in answers if cmid == key) == [200, 200, 200, 201], key
    assert message_rows(store)["client_message_dedupe"] == len(keys)
    assert message_rows(store)["topic_message"] == len(keys)
    assert store.orphan_check() == []


def test_a_group_may_span_meshes(store: BrokerStore) -> None:
    from store_testkit import PERMANENT_MESH

    outcomes = batch(store, [make_request(mesh_id=MESH), make_request(mesh_id=PERMANENT_MESH)])

    assert [result.http_status for result, _ in outcomes] == [201, 201]
    assert message_rows(store)["client_message_dedupe"] == 2
    assert store.orphan_check() == []
