"""Concurrent accepts on every engine (BRK-CONCURRENT-ONE-MESSAGE, §4.7.2).

Sixteen threads race one (mesh, client_message_id): half send one request, half a different one. Exactly one
commits; every other caller gets 200 if its fingerprint equals the winner's and 409 otherwise; nothing is orphaned.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from store_testkit import BOB, T0, make_request, new_ids, valid_ack

from reference.broker.store import BrokerStore

THREADS = 16


def race(store: BrokerStore, requests: list) -> list:
    barrier = threading.Barrier(len(requests))

    def one(req):
        broker_message_id, history_id = new_ids()
        barrier.wait(timeout=30)
        return valid_ack(store.accept(req, broker_message_id, history_id)), broker_message_id

    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        return list(pool.map(one, requests, timeout=120))


def test_racing_one_client_message_id_commits_exactly_one_message(store: BrokerStore) -> None:
    requests = [make_request(body="variant A" if i % 2 == 0 else "variant B") for i in range(THREADS)]

    outcomes = race(store, requests)

    statuses = [result.http_status for result, _ in outcomes]
    assert statuses.count(201) == 1, statuses
    winner_index = statuses.index(201)
    winner_body, winner_id = requests[winner_index].body, outcomes[winner_index][1]
    for req, (result, _) in zip(requests, outcomes, strict=True):
        if result.http_status == 201:
            continue
        if req.body == winner_body:
            assert (result.http_status, result.body["broker_message_id"]) == (200, winner_id)
        else:
            assert (result.http_status, result.body["conflict"]) == (409, "request_fingerprint_mismatch")
    counts = store.counts()
    assert (counts["client_message_dedupe"], counts["topic_message"], counts["message_history"]) == (1, 1, 1)
    assert counts["delivery_queue"] == 2
    assert store.orphan_check() == []


def test_racing_distinct_ids_to_one_topic_commits_every_one(store: BrokerStore) -> None:
    requests = [make_request(client_message_id=f"cmid-{i}", body=f"body {i}") for i in range(THREADS)]

    outcomes = race(store, requests)

    assert [result.http_status for result, _ in outcomes] == [201] * THREADS
    counts = store.counts()
    assert (counts["client_message_dedupe"], counts["topic_message"], counts["delivery_queue"]) == (
        THREADS, THREADS, 2 * THREADS)
    assert len(store.pending_deliveries(BOB, now_ms=T0 + 1, lease_ms=1_000, limit=1_000)) == THREADS
    assert store.orphan_check() == []


def test_concurrent_pollers_never_lease_one_delivery_twice(store: BrokerStore) -> None:
    for i in range(THREADS):
        store.accept(make_request(client_message_id=f"cmid-{i}", body=f"body {i}"), *new_ids())
    barrier = threading.Barrier(4)

    def poll(_: int) -> list[int]:
        barrier.wait(timeout=30)
        leased: list[int] = []
        while batch := store.pending_deliveries(BOB, now_ms=T0 + 1, lease_ms=60_000, limit=3):
            leased.extend(d.delivery_id for d in batch)
        return leased

    with ThreadPoolExecutor(max_workers=4) as pool:
        per_poller = list(pool.map(poll, range(4), timeout=120))

    everything = [delivery for leased in per_poller for delivery in leased]
    assert len(everything) == len(set(everything)) == THREADS
