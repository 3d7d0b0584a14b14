"""The broker process killed with SIGKILL at random moments under accept load (§4.7.3 failure modes).

After every run: the orphan check finds nothing, every 201-acked message has all four in-transaction effects (dedupe,
message, history, one delivery row per recipient), every client_message_id that was retried converged on one
broker_message_id, and the store holds exactly one message per client_message_id. The CI variant kills a broker
forked from a warm parent (broker_server_testkit.ForkServer) at least 100 times in well under a minute; the `slow`
variant starts each broker from scratch and kills it many more times, bounded in count and in time; a third test
puts real reference daemons on the other side.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from broker_server_testkit import MESH, BrokerProcess, ForkServer, LoadClient, Member, meshd, populate

from conformance.launch import REFERENCE_TEMPLATE, Launched
from reference.broker.store import open_store
from reference.core.codes import exit_code

LOAD_MEMBERS = 4
RECIPIENTS = LOAD_MEMBERS - 1  # everyone on #general but the sender
CI_KILLS = 100
CONNECT_WAIT_S = 5.0  # how long a cycle waits for a client's handshake on the new broker before its random moment
SLOW_KILLS = int(os.environ.get("MESHSPEC_SLOW_KILLS", "500"))
SLOW_BUDGET_S = float(os.environ.get("MESHSPEC_SLOW_BUDGET", "240"))


def _message_rows(store) -> dict[str, tuple[str, int, int]]:
    """broker_message_id -> (client_message_id, history rows, delivery rows), read behind the store's back."""
    prefix = "mesh." if store.engine == "postgres" else ""
    statement = (
        f"SELECT m.id, m.client_message_id, (SELECT count(*) FROM {prefix}message_history h "
        f"WHERE h.broker_message_id = m.id), (SELECT count(*) FROM {prefix}delivery_queue q "
        f"WHERE q.broker_message_id = m.id) FROM {prefix}topic_message m"
    )
    if store.engine == "sqlite":
        import sqlite3

        conn = sqlite3.connect(store.path)
        try:
            rows = conn.execute(statement).fetchall()
        finally:
            conn.close()
    else:
        import psycopg

        with psycopg.connect(store.dsn) as conn:
            rows = conn.execute(statement).fetchall()
    return {row[0]: (row[1], int(row[2]), int(row[3])) for row in rows}


def _dedupe_rows(store) -> dict[str, str]:
    prefix = "mesh." if store.engine == "postgres" else ""
    statement = f"SELECT client_message_id, broker_message_id FROM {prefix}client_message_dedupe"
    if store.engine == "sqlite":
        import sqlite3

        conn = sqlite3.connect(store.path)
        try:
            return dict(conn.execute(statement).fetchall())
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(store.dsn) as conn:
        return dict(conn.execute(statement).fetchall())


def kill_under_load(store_url: str, tmp_path, kills: int, fork_server: ForkServer | None, budget_s: float,
                    seed: int) -> dict[str, int]:
    """Run LOAD_MEMBERS load clients against a broker that is SIGKILLed ``kills`` times (or until ``budget_s``),
    then let them converge on a last broker and check the store. Returns a summary for the test to report."""
    rng = random.Random(seed)
    members = [Member(f"load{i}") for i in range(LOAD_MEMBERS)]
    store = open_store(store_url)
    store.migrate()
    populate(store, members)
    broker = BrokerProcess(store_url, tmp_path / "broker", ["--log-level", "WARNING"], fork_server=fork_server)
    clients = [LoadClient(broker.url, member, f"c{i}", seed=seed + i) for i, member in enumerate(members)]
    started = time.monotonic()
    done = loaded = 0
    try:
        for client in clients:
            client.start()
        while done < kills and time.monotonic() - started < budget_s:
            broker.start()
            # under load by construction, not by luck: a loaded machine stretches the clients' reconnects past the
            # random moment, so the cycle first waits (bounded) for a client's handshake on this broker
            before = sum(client.connections for client in clients)
            deadline = time.monotonic() + CONNECT_WAIT_S
            while sum(client.connections for client in clients) == before and time.monotonic() < deadline:
                time.sleep(0.002)
            loaded += sum(client.connections for client in clients) > before
            time.sleep(rng.uniform(0.0, 0.15))  # a random moment: handshakes, accepts, commits, acks, pushes
            broker.kill9()
            done += 1
        broker.start()
        for client in clients:
            client.drain()
        for client in clients:
            client.join(timeout=60)
        assert not any(client.is_alive() for client in clients), [c.unsettled()[:5] for c in clients]
        assert broker.stop() == exit_code("ok"), broker.tail()
    finally:
        for client in clients:
            client.stop()
        broker.kill9()

    errors = [error for client in clients for error in client.errors]
    assert not errors, errors[:10]
    outcomes = {cmid: outcome for client in clients for cmid, outcome in client.outcomes.items()}
    answered: dict[str, str] = {}
    lost_acks = 0
    for cmid, outcome in outcomes.items():
        ids = {message_id for status, message_id in outcome.acks if status in (200, 201)}
        assert len(ids) == 1, (cmid, outcome.acks)  # every retry converged on one broker_message_id
        created = [status for status, _ in outcome.acks if status == 201]
        assert len(created) <= 1, (cmid, outcome.acks)
        if not created:
            lost_acks += 1  # committed, then the broker died before the 201 reached the client
        answered[cmid] = ids.pop()
    messages = _message_rows(store)
    dedupe = _dedupe_rows(store)
    violations = store.orphan_check()
    tally = store.counts()
    store.close()
    assert violations == [], violations[:10]
    assert dedupe == answered  # one dedupe row per client_message_id, naming the message every ack named
    assert {bmid: row[0] for bmid, row in messages.items()} == {bmid: cmid for cmid, bmid in answered.items()}
    for bmid, (cmid, history, deliveries) in messages.items():
        assert (history, deliveries) == (1, RECIPIENTS), (bmid, cmid, history, deliveries)
    assert tally["topic_message"] == tally["client_message_dedupe"] == tally["message_history"] == len(outcomes)
    return {"kills": done, "loaded_kills": loaded, "messages": len(outcomes), "acks_lost_to_a_kill": lost_acks,
            "connections": sum(client.connections for client in clients),
            "seconds": int(time.monotonic() - started)}


@pytest.fixture(scope="module")
def fork_server():
    server = ForkServer()
    try:
        yield server
    finally:
        server.close()


def test_sigkill_under_accept_load_ci(store_url, tmp_path, fork_server):
    """BRK-ATOMIC, BRK-ORPHAN-CHECK, BRK-DUP-MATCH, BRK-CONCURRENT-ONE-MESSAGE (§4.7.3): at least 100 SIGKILLs of the
    broker under accept load from four daemon-like clients; afterwards the orphan check is zero, every 201 has all
    its side effects, and retries converged without a second message row."""
    summary = kill_under_load(store_url, tmp_path, CI_KILLS, fork_server, budget_s=120, seed=7)
    print(json.dumps(summary))
    assert summary["kills"] == CI_KILLS
    assert summary["loaded_kills"] >= CI_KILLS * 9 // 10  # a client was connected (under load) at nearly every kill
    assert meshd("broker", "orphan-check", "--store", store_url).returncode == 0


@pytest.mark.slow
@pytest.mark.timeout(SLOW_BUDGET_S + 240)
def test_sigkill_under_accept_load_long(store_url, tmp_path):
    """The long form: every broker started from scratch (`python -m reference.cli broker serve`), up to
    MESHSPEC_SLOW_KILLS kills (default 500) within MESHSPEC_SLOW_BUDGET seconds (default 240) per engine. Runs only
    when selected with `-m slow` (make slow)."""
    summary = kill_under_load(store_url, tmp_path, SLOW_KILLS, None, budget_s=SLOW_BUDGET_S, seed=11)
    print(json.dumps(summary))
    assert summary["kills"] >= min(SLOW_KILLS, 50)


def test_reference_daemon_retries_converge_across_broker_kills(tmp_path, fork_server):
    """WS-SEND-SAME-BYTES, BRK-DUP-MATCH, INB-DEDUPE end to end: daemon A sends while the (--dev) broker process is
    SIGKILLed and restarted; every outbox row ends done with one broker message each, daemon B's inbox has each
    message exactly once, and `meshd broker orphan-check` exits 0."""
    url = f"sqlite:///{tmp_path / 'broker.db'}"
    broker = BrokerProcess(url, tmp_path / "broker", ["--dev", "--lease-s", "1"], fork_server=fork_server).start()
    config = ("[outbox]\nretry_base_ms = 50\nretry_max_ms = 250\nack_timeout_s = 2.0\n"
              "[reconnect]\ninitial_ms = 50\nmax_ms = 250\n[daemon]\ndrain_timeout_s = 1.0\n")
    daemons = []
    for name in ("a", "b"):
        state_dir = tmp_path / name
        state_dir.mkdir(mode=0o700)
        (state_dir / "config.toml").write_text(config)
        daemons.append(Launched(REFERENCE_TEMPLATE, state_dir, broker.url).start(wait=False))
    a, b = daemons
    total = 24
    try:
        for daemon in daemons:
            daemon.wait_ready()
        a.wait_connected()
        b.wait_connected()
        rng = random.Random(3)
        posted: list[str] = []

        def post_all() -> None:
            with a.unix() as client:
                for i in range(total):
                    cmid = f"kill-{i:03d}"
                    response = client.post("/v1/send", json={"to": "#general", "message": f"m{i}"},
                                           headers={"Idempotency-Key": cmid})
                    assert response.status_code == 202, response.text
                    posted.append(cmid)
                    time.sleep(0.05)

        poster = threading.Thread(target=post_all)
        poster.start()
        for _ in range(3):
            time.sleep(rng.uniform(0.1, 0.5))
            broker.kill9()
            broker.start()
        poster.join(timeout=60)
        assert len(posted) == total

        def settled() -> list[dict] | None:
            with a.unix() as client:
                rows = client.get("/v1/outbox", params={"limit": 500}).json()["items"]
            return rows if len(rows) == total and all(row["status"] == "done" for row in rows) else None

        rows = _until(settled, 60, "every outbox row done")
        _until(lambda: len(_inbox(b)) >= total, 60, "b's inbox")
        time.sleep(1.2)  # past a lease: nothing is delivered twice into the inbox
        inbox = _inbox(b)
    finally:
        stoppers = [threading.Thread(target=daemon.stop, kwargs={"timeout": 10}) for daemon in daemons]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join()
        broker.stop()
    assert sorted(item["client_message_id"] for item in inbox) == sorted(posted)
    assert len({item["broker_message_id"] for item in inbox}) == total
    assert {row["client_message_id"]: row["broker_message_id"] for row in rows} == {
        item["client_message_id"]: item["broker_message_id"] for item in inbox}
    store = open_store(url)
    try:
        tally = store.counts()
    finally:
        store.close()
    assert (tally["topic_message"], tally["client_message_dedupe"]) == (total, total)
    assert meshd("broker", "orphan-check", "--store", url).returncode == 0
    assert MESH  # the load tests' mesh; this one uses the daemons' default mesh


def _inbox(daemon: Launched) -> list[dict]:
    with daemon.unix() as client:
        return client.get("/v1/inbox", params={"limit": 1000}).json()["items"]


def _until(probe, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


# --- both sides at once: the daemon's master or worker and the broker, killed mid-send and mid-accept --------------

CRASH_CONFIG = ("[outbox]\nretry_base_ms = 50\nretry_max_ms = 250\nack_timeout_s = 2.0\n"
                "[reconnect]\ninitial_ms = 50\nmax_ms = 250\n[daemon]\ndrain_timeout_s = 1.0\n")
VICTIMS = ("daemon_master", "daemon_worker", "broker")


def _whole_inbox(daemon: Launched) -> list[dict]:
    """Every inbox item, page by page (a soak delivers more than one page holds)."""
    items, cursor = [], None
    with daemon.unix() as client:
        while True:
            page = client.get("/v1/inbox", params={"limit": 1000, **({"cursor": cursor} if cursor else {})}).json()
            items += page["items"]
            if not page["items"]:
                return items
            cursor = page["next_cursor"]


def _worker_pids(master: int) -> list[int]:
    """The gunicorn worker(s) of a daemon master: its child processes."""
    try:
        children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    except OSError:
        return []
    return [int(pid) for pid in children]


def crash_loop(tmp_path, fork_server, rounds: int, budget_s: float, seed: int) -> dict[str, int]:
    """Daemon A sends continuously (each id retried by its client until answered, as an SDK does) to daemon B
    through a --dev broker, while one of A's master (the whole process group), A's gunicorn worker, or the broker is
    SIGKILLed at a random moment, ``rounds`` times (or until ``budget_s``). Then: every id A answered 202 or 200 is
    done in A's outbox under one broker_message_id, is in B's inbox exactly once, and the broker holds one message
    per id and no orphans. Returns the counts for the report."""
    rng = random.Random(seed)
    url = f"sqlite:///{tmp_path / 'broker.db'}"
    broker = BrokerProcess(url, tmp_path / "broker", ["--dev", "--lease-s", "1"], fork_server=fork_server).start()
    daemons = []
    for name in ("a", "b"):
        state_dir = tmp_path / name
        state_dir.mkdir(mode=0o700)
        (state_dir / "config.toml").write_text(CRASH_CONFIG)
        daemons.append(Launched(REFERENCE_TEMPLATE, state_dir, broker.url).start(wait=False))
    a, b = daemons
    accepted: list[str] = []
    stop = threading.Event()
    kills = dict.fromkeys(VICTIMS, 0)
    answers = {"5xx": 0, "transport_errors": 0}

    def post_forever() -> None:
        n = 0
        while not stop.is_set():
            cmid = f"crash-{n:05d}"
            while not stop.is_set():  # the same id until the daemon answers it
                try:
                    with a.unix(timeout=5) as client:
                        response = client.post("/v1/send", json={"to": "#general", "message": f"m{n}"},
                                               headers={"Idempotency-Key": cmid})
                except (httpx.HTTPError, OSError):
                    answers["transport_errors"] += 1
                    time.sleep(0.05)
                    continue
                if response.status_code >= 500:
                    answers["5xx"] += 1  # 503 daemon_draining never happens here: nothing is stopped, only killed
                    time.sleep(0.05)
                    continue
                assert response.status_code in (200, 202), response.text
                accepted.append(cmid)
                break
            n += 1
            time.sleep(0.01)

    poster = threading.Thread(target=post_forever, name="crash-poster", daemon=True)
    started = time.monotonic()
    try:
        for daemon in daemons:
            daemon.wait_ready()
        a.wait_connected()
        b.wait_connected()
        poster.start()
        done = 0
        while done < rounds and time.monotonic() - started < budget_s:
            time.sleep(rng.uniform(0.05, 0.3))  # mid-send, mid-accept, mid-ack: wherever the moment falls
            victim = VICTIMS[done % len(VICTIMS)] if done < len(VICTIMS) else rng.choice(VICTIMS)
            if victim == "broker":
                broker.kill9()
                broker.start()
            elif victim == "daemon_master":
                a.kill9()
                a.start()
            else:
                workers = _worker_pids(a.process.pid)
                if not workers:
                    continue
                os.kill(workers[0], signal.SIGKILL)  # gunicorn's master starts another worker
                _until(lambda old=workers: _worker_pids(a.process.pid) not in ([], old), 20, "a new worker")
            kills[victim] += 1
            done += 1
        time.sleep(0.3)
        stop.set()
        poster.join(timeout=30)
        a.wait_ready()
        a.wait_connected(30)

        def settled() -> list[dict] | None:
            with a.unix() as client:
                rows = []
                cursor = None
                while True:
                    page = client.get("/v1/outbox", params={"limit": 500, **({"cursor": cursor} if cursor else {})}
                                      ).json()
                    rows += page["items"]
                    cursor = page["next_cursor"]
                    if not cursor:
                        break
            return rows if rows and all(row["status"] == "done" for row in rows) else None

        rows = _until(settled, 90, "every outbox row of A done")
        _until(lambda: len(_whole_inbox(b)) >= len({row["client_message_id"] for row in rows}), 90, "B's inbox")
        time.sleep(1.2)  # past a lease: nothing arrives twice
        inbox = _whole_inbox(b)
    finally:
        stop.set()
        stoppers = [threading.Thread(target=daemon.stop, kwargs={"timeout": 10}) for daemon in daemons]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join()
        broker.stop()
    outbox = {row["client_message_id"]: row["broker_message_id"] for row in rows}
    received = [item["client_message_id"] for item in inbox]
    lost = sorted(set(accepted) - set(received))
    duplicated = sorted({cmid for cmid in received if received.count(cmid) > 1})
    assert not lost, lost[:10]
    assert not duplicated, duplicated[:10]
    assert set(outbox) >= set(accepted)
    assert {item["client_message_id"]: item["broker_message_id"] for item in inbox} == outbox
    assert answers["5xx"] == 0, answers
    store = open_store(url)
    try:
        tally = store.counts()
    finally:
        store.close()
    assert tally["topic_message"] == tally["client_message_dedupe"] == len(outbox)
    assert meshd("broker", "orphan-check", "--store", url).returncode == 0
    return {**{f"kills_{name}": count for name, count in kills.items()}, "accepted": len(accepted),
            "delivered": len(received), "lost": len(lost), "duplicated": len(duplicated), "5xx": answers["5xx"],
            "transport_errors_while_down": answers["transport_errors"], "seconds": int(time.monotonic() - started)}


def test_daemon_and_broker_killed_mid_send_lose_and_duplicate_nothing(tmp_path, fork_server):
    """REC-INFLIGHT-TO-PENDING, WS-SEND-SAME-BYTES, BRK-ATOMIC, INB-DEDUPE end to end, with kills on both sides in one
    run: daemon A's whole process group, A's gunicorn worker alone (its successor recovers what the dead one had in
    flight), and the broker mid-accept; every accepted id reaches B exactly once."""
    summary = crash_loop(tmp_path, fork_server, rounds=6, budget_s=60, seed=5)
    print(json.dumps(summary))
    assert all(summary[f"kills_{name}"] >= 1 for name in VICTIMS), summary


@pytest.mark.slow
@pytest.mark.timeout(SLOW_BUDGET_S + 300)
def test_daemon_and_broker_crash_soak(tmp_path, fork_server):
    """The long form: up to MESHSPEC_SLOW_KILLS kills (default 500) within MESHSPEC_SLOW_BUDGET seconds, spread over
    the daemon's master, its worker and the broker."""
    summary = crash_loop(tmp_path, fork_server, rounds=SLOW_KILLS, budget_s=SLOW_BUDGET_S, seed=17)
    print(json.dumps(summary))
    assert all(summary[f"kills_{name}"] >= 3 for name in VICTIMS), summary
