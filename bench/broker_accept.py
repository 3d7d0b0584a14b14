"""Broker accept throughput against the store's raw commit rate, on SQLite and on PostgreSQL.

    .venv/bin/python bench/broker_accept.py [--seconds 5] [--connections 8] [--window 16] [--stores sqlite,postgres]

For each store this measures, in one run:

* raw: single-row ``INSERT`` + ``COMMIT`` on one connection with the broker store's durability settings (SQLite WAL
  with ``synchronous = FULL``; PostgreSQL with ``fsync = on`` and ``synchronous_commit = on``), as fast as it goes;
* accept: ``meshd broker serve`` as a subprocess, and ``--connections`` daemon-side WebSocket clients (each a mesh
  member: hello, negotiation, then ``send`` frames with up to ``--window`` in flight, like a daemon draining its
  outbox) sending distinct messages to a topic whose one subscriber is offline, so every accept commits the four
  §4.7.1 effects (dedupe, message, history, one delivery row) in one transaction before its 201 ack. Only 201 acks
  count; after the broker stops, the store must hold exactly one message and one dedupe row per 201 ack and pass
  the orphan check, or the run fails.

The two alternate in ``--rounds`` slices on the same database server and disk (the cost of an fsync drifts on a
shared machine; two measurements far apart would compare the drift). It prints accepts per second, the raw rate and
their ratio per store; the target is a ratio of at least 0.3 (``--check`` exits 1 below it). It also prints the
broker process's CPU time per 201 accept over the accept slices (from /proc, Linux only): unlike the rates, that
figure hardly moves with what else the machine runs, so it is the one to compare between versions of the broker.
PostgreSQL runs on a private throwaway cluster (reference.broker.pgcluster) and is skipped with a note when the
server binaries are missing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from reference.broker.store import open_store  # noqa: E402
from reference.core.fingerprint import FingerprintInput, request_fingerprint  # noqa: E402

MESH = "bench"
TOPIC = "bench"
TARGET_RATIO = 0.3


# --- raw commit rate ------------------------------------------------------------------------------------------------

class RawSqlite:
    """Single-row insert + commit on a SQLite file with the broker store's pragmas (WAL, synchronous = FULL)."""

    def __init__(self, path: Path):
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = FULL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS raw_bench (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
        self.done = 0

    def run(self, seconds: float) -> int:
        """Commit single-row transactions for ``seconds``; returns how many."""
        count, deadline = 0, time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute("INSERT INTO raw_bench (body) VALUES (?)", (f"row {self.done}",))
            self.conn.execute("COMMIT")
            count += 1
            self.done += 1
        return count

    def close(self) -> None:
        self.conn.close()


class RawPostgres:
    """Single-row insert + commit on one PostgreSQL connection (fsync and synchronous_commit on)."""

    def __init__(self, dsn: str):
        import psycopg

        self.conn = psycopg.connect(dsn, autocommit=False)
        self.conn.execute("CREATE TABLE IF NOT EXISTS raw_bench (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)")
        self.conn.commit()
        settings = (self.conn.execute("SHOW synchronous_commit").fetchone()[0],
                    self.conn.execute("SHOW fsync").fetchone()[0])
        assert settings == ("on", "on"), settings
        self.conn.commit()
        self.done = 0

    def run(self, seconds: float) -> int:
        count, deadline = 0, time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            self.conn.execute("INSERT INTO raw_bench (body) VALUES (%s)", (f"row {self.done}",))
            self.conn.commit()
            count += 1
            self.done += 1
        return count

    def close(self) -> None:
        self.conn.close()


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` and all its threads so far, or None where /proc is missing."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15


# --- broker accept rate ---------------------------------------------------------------------------------------------

def _pubkey(key: Ed25519PrivateKey) -> str:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def _send_frame(cmid: str, body: str) -> str:
    fingerprint = request_fingerprint(FingerprintInput(destination_kind="topic", destination_ref=TOPIC,
                                                       reply_to_id="", priority="next", meta=None, body=body))
    return json.dumps({"type": "send", "id": cmid, "client_message_id": cmid,
                       "request_fingerprint": fingerprint.hex(), "envelope_version": "1",
                       "destination_kind": "topic", "destination_ref": TOPIC, "priority": "next",
                       "reply_to_id": "", "meta": None, "body": body})


class Gate:
    """When the senders may send: open for one accept slice at a time; 201s count only until ``closes_at``."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.closes_at = 0.0
        self.finished = False


class Sender(threading.Thread):
    """One daemon-side connection: hello, negotiation, then pipelined sends whenever the gate is open."""

    def __init__(self, url: str, key: Ed25519PrivateKey, index: int, window: int, gate: Gate):
        super().__init__(daemon=True)
        self.url, self.key, self.index, self.window, self.gate = url, key, index, window, gate
        self.ready = threading.Event()
        self.inflight = 0
        self.created = 0
        self.acked_201 = 0
        self.other: dict[int, int] = {}
        self.error: str | None = None

    def run(self) -> None:
        try:
            with connect(self.url, compression=None, open_timeout=10, max_size=2**22) as ws:
                pubkey = _pubkey(self.key)
                timestamp = int(time.time() * 1000)
                signature = self.key.sign(f"{MESH}|{pubkey}|{pubkey}|{timestamp}".encode()).hex()
                ws.send(json.dumps({"type": "hello", "meshId": MESH, "memberId": pubkey, "pubkey": pubkey,
                                    "timestamp": timestamp, "signature": signature}))
                assert json.loads(ws.recv(timeout=10))["type"] == "hello_ack"
                ws.send(json.dumps({"type": "feature_negotiation_request",
                                    "require": ["client_message_id_dedupe"], "optional": []}))
                assert json.loads(ws.recv(timeout=10))["type"] == "feature_negotiation_response"
                self.ready.set()
                sent = 0
                while not self.gate.finished or self.inflight:
                    if not self.inflight and not self.gate.open.wait(0.05):
                        continue
                    while self.gate.open.is_set() and self.inflight < self.window:
                        ws.send(_send_frame(f"b{self.index}-{sent}", f"bench message {sent} from {self.index}"))
                        sent += 1
                        self.inflight += 1
                    if not self.inflight:
                        continue
                    ack = json.loads(ws.recv(timeout=30))
                    if ack.get("type") != "ack":
                        continue
                    self.inflight -= 1
                    if ack["status"] != 201:
                        self.other[ack["status"]] = self.other.get(ack["status"], 0) + 1
                        continue
                    self.acked_201 += 1
                    if time.perf_counter() <= self.gate.closes_at:
                        self.created += 1
        except Exception as exc:  # reported by the caller
            self.error = repr(exc)
        finally:
            self.ready.set()


def start_broker(store_url: str, workdir: Path, connections: int, extra_args: list[str]
                 ) -> tuple[subprocess.Popen, str, list[Any]]:
    """A migrated store with a mesh, a topic whose only subscriber stays offline, and ``connections`` members;
    then ``meshd broker serve`` on it. Returns (process, url, member keys)."""
    keys = [Ed25519PrivateKey.generate() for _ in range(connections)]
    store = open_store(store_url)
    store.migrate()
    store.add_mesh(MESH, MESH, "retention_scoped", 7)
    store.create_topic(MESH, TOPIC)
    sink = "f" * 64  # never connected: one delivery row per message, no pushes
    store.add_member(MESH, sink, "sink")
    store.subscribe(MESH, TOPIC, sink)
    for key in keys:
        store.add_member(MESH, _pubkey(key), "bench")
    store.close()
    port_file = workdir / "broker.port"
    with (workdir / "broker.log").open("ab") as log:
        broker = subprocess.Popen(
            [sys.executable, "-m", "reference.cli", "broker", "serve", "--store", store_url, "--listen",
             "127.0.0.1:0", "--port-file", str(port_file), "--rate-limit", "0", "--sweep-interval-s", "0",
             "--log-level", "WARNING", *extra_args],
            cwd=ROOT, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if broker.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the broker did not start; see {workdir / 'broker.log'}")
        time.sleep(0.02)
    return broker, f"ws://127.0.0.1:{int(port_file.read_text())}", keys


def measure(store_url: str, raw: Any, workdir: Path, seconds: float, connections: int, window: int,
            rounds: int, extra_args: list[str] = ()) -> dict[str, Any]:
    """Alternate ``rounds`` raw slices and accept slices (each ``seconds / rounds`` long), so both rates see the
    same disk: the machine's fsync cost drifts, and a ratio of two far-apart measurements would measure the drift."""
    broker, url, keys = start_broker(store_url, workdir, connections, list(extra_args))
    gate = Gate()
    senders = [Sender(url, key, i, window, gate) for i, key in enumerate(keys)]
    try:
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.ready.wait(30)
        errors = [s.error for s in senders if s.error]
        if errors:
            raise RuntimeError(f"senders failed: {errors[:3]}")
        piece = seconds / rounds
        raw_commits = 0
        raw_time = accept_time = 0.0
        broker_cpu: float | None = 0.0
        for _ in range(rounds):
            began = time.perf_counter()
            raw_commits += raw.run(piece)
            raw_time += time.perf_counter() - began
            cpu_before = cpu_seconds(broker.pid)
            began = time.perf_counter()
            gate.closes_at = began + piece
            gate.open.set()
            time.sleep(piece)
            gate.open.clear()
            accept_time += gate.closes_at - began
            while any(sender.inflight for sender in senders if sender.is_alive()):
                time.sleep(0.005)  # the next raw slice starts on an idle broker
            cpu_after = cpu_seconds(broker.pid)
            if broker_cpu is not None and cpu_before is not None and cpu_after is not None:
                broker_cpu += cpu_after - cpu_before
            else:
                broker_cpu = None
        gate.finished = True
        for sender in senders:
            sender.join(timeout=60)
        errors = [s.error for s in senders if s.error]
        if errors:
            raise RuntimeError(f"senders failed: {errors[:3]}")
        created = sum(s.created for s in senders)
        acked_201 = sum(s.acked_201 for s in senders)  # the CPU covers the drain too, so count the drained 201s
        other: dict[int, int] = {}
        for sender in senders:
            for status, count in sender.other.items():
                other[status] = other.get(status, 0) + count
        result = {"accepts_per_s": created / accept_time, "accepted": created,
                  "raw_commits_per_s": raw_commits / raw_time, "raw_commits": raw_commits, "other_statuses": other,
                  "broker_cpu_ms_per_accept": None if broker_cpu is None or not acked_201
                  else 1000 * broker_cpu / acked_201}
    finally:
        gate.finished = True
        gate.open.clear()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(broker.pid, 15)
        broker.wait(timeout=30)
    store = open_store(store_url)  # every 201 the senders saw is a committed message, and nothing else is
    try:
        counts, orphans = store.counts(), store.orphan_check()
    finally:
        store.close()
    if counts["topic_message"] != acked_201 or counts["client_message_dedupe"] != acked_201 or orphans:
        raise RuntimeError(f"{acked_201} sends were acked 201, but the store holds {counts} ({len(orphans)} orphans)")
    return result


# --- the run --------------------------------------------------------------------------------------------------------

def run_store(name: str, seconds: float, connections: int, window: int, rounds: int,
              extra_args: list[str]) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"meshspec-bench-{name}-"))
    cluster = raw = None
    try:
        if name == "sqlite":
            raw = RawSqlite(workdir / "raw.db")
            result = measure(f"sqlite:///{workdir / 'broker.db'}", raw, workdir, seconds, connections, window, rounds,
                             extra_args)
        else:
            from reference.broker.pgcluster import PgCluster

            cluster = PgCluster().start()
            raw = RawPostgres(cluster.create_database("raw_bench"))
            result = measure(cluster.create_database("broker_bench"), raw, workdir, seconds, connections, window,
                             rounds, extra_args)
        return {"store": name, **result, "ratio": result["accepts_per_s"] / result["raw_commits_per_s"]}
    finally:
        if raw is not None:
            raw.close()
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each measurement")
    parser.add_argument("--connections", type=int, default=8, help="concurrent daemon connections")
    parser.add_argument("--window", type=int, default=16, help="sends in flight per connection")
    parser.add_argument("--rounds", type=int, default=5, help="raw and accept slices alternate this many times")
    parser.add_argument("--broker-args", default="", help="extra `meshd broker serve` flags, e.g. '--db-workers 4'")
    parser.add_argument("--stores", default="sqlite,postgres", help="comma-separated: sqlite, postgres")
    parser.add_argument("--json", action="store_true", help="print one JSON object per store")
    parser.add_argument("--check", action="store_true", help=f"exit 1 when a ratio is below {TARGET_RATIO}")
    args = parser.parse_args(argv)
    results = []
    for name in args.stores.split(","):
        if name == "postgres":
            from reference.broker.pgcluster import find_bindir

            if find_bindir() is None:
                print("postgres: skipped (no PostgreSQL server binaries)", file=sys.stderr)
                continue
        results.append(run_store(name, args.seconds, args.connections, args.window, args.rounds,
                                 args.broker_args.split()))
    if args.json:
        for result in results:
            print(json.dumps(result))
    else:
        print(f"broker accept vs raw insert+commit ({args.connections} connections, window {args.window}, "
              f"{args.seconds:g} s each; every accept durable before its ack)")
        print(f"{'store':<10}{'accepts/s':>12}{'raw commits/s':>16}{'ratio':>8}{'cpu ms/accept':>15}"
              f"  target >= {TARGET_RATIO}")
        for r in results:
            verdict = "ok" if r["ratio"] >= TARGET_RATIO else "BELOW TARGET"
            cpu = r["broker_cpu_ms_per_accept"]
            others = f"  other acks: {json.dumps(r['other_statuses'])}" if r["other_statuses"] else ""
            print(f"{r['store']:<10}{r['accepts_per_s']:>12.0f}{r['raw_commits_per_s']:>16.0f}{r['ratio']:>8.2f}"
                  f"{'n/a' if cpu is None else f'{cpu:.3f}':>15}  {verdict}{others}")
    if args.check and any(r["ratio"] < TARGET_RATIO for r in results):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
