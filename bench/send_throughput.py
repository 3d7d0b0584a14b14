"""Durable POST /v1/send throughput of the reference daemon against the disk's single-commit rate (issue #3).

One run measures, on one filesystem (a temp directory):

1. raw SQLite: one connection, sequential ``BEGIN IMMEDIATE; INSERT one row; COMMIT`` with the outbox.db pragmas
   (WAL, ``synchronous=FULL``): the rate at which this disk makes single rows durable;
2. ``GET /v1/health`` with N concurrent keep-alive clients over the daemon's unix socket;
3. ``POST /v1/send`` with N concurrent clients, every request with a fresh ``Idempotency-Key`` (a new durable row),
   with p50/p99 latency, while the scripted broker acks every send (the drain loop runs, as in production);

and, to show the load generator is not what limits (2) and (3), the same clients against a null HTTP responder on a
unix socket in its own process. To show what the stack itself allows, the same send load also runs against the
daemon's IPC stack with no work behind it (``bench/_bare_ipc.py``: a constant-answer Falcon app on the daemon's
gunicorn worker class and settings), with one worker process (the daemon's layout) and with two: no daemon built on
that stack answers faster than its ceiling, so where the one-process ceiling is below the raw commit rate (a disk
whose fsync costs less than the stack spends on a request), ``send/raw-commit >= 1.0`` is out of reach for it.

Afterwards the daemon's outbox must hold exactly one row per 202 it answered; the share of them the broker had
already acked (``done``) is reported too, since a drain loop that falls behind defers its CPU past the measurement
window and so flatters the send rate.

The three measurements run in ``--rounds`` rounds, each on a fresh daemon (so a send phase's outbox backlog never
slows the next health phase) with the raw commits measured just before it; the ratios use all rounds pooled, so a
burst of load from elsewhere on the machine skews numerator and denominator alike.

Theory of operation: the load generator is closed-loop (each client sends its next request when the previous answer
is complete). Clients are spread over worker processes (``--procs``) so the GIL of one process does not cap them; each
speaks HTTP/1.1 over a raw AF_UNIX socket with prebuilt request bytes (an HTTP library costs more CPU per request than
the daemon spends on a health check, which would make the client the bottleneck). A request counts when its answer
arrives inside the measurement window, after a warm-up.

Run: ``.venv/bin/python bench/send_throughput.py [--seconds N] [--clients 16]``. Exits 0; ``--check`` exits 1 when a
target is not met.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SEND_BODY = b'{"to":"#general","message":"hello from the benchmark"}'
NULL_BODY = (b'{"client_message_id":"bench-00000000-0000000000","status":"queued","duplicate":false,'
             b'"request_fingerprint":"' + b"0" * 64 + b'"}')
NULL_RESPONSE = (b"HTTP/1.1 202 Accepted\r\nServer: null\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(NULL_BODY)) + NULL_BODY
DAEMON_CONFIG = """
[daemon]
drain_timeout_s = 2.0
log_level = "WARNING"
"""
TARGETS = {"send/upstream": 1.0, "send p99 ms": 20.0}
DEFAULT_UPSTREAM = REPO.parent / "shared" / "upstream"
DEFAULT_RUNTIME = Path.home() / ".cache" / "claudemesh-upstream"


# --- the load generator (runs in worker processes: keep it free of project imports) ------------------------------


def _request(kind: str, key: str) -> bytes:
    if kind == "health":
        return b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n\r\n"
    return (b"POST /v1/send HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Idempotency-Key: %s\r\nContent-Length: %d\r\n\r\n%s" % (key.encode(), len(SEND_BODY), SEND_BODY))


def _exchange(sock: socket.socket, request: bytes) -> tuple[int, bool]:
    """Send one request and read its whole answer; returns (status, server closes the connection)."""
    sock.sendall(request)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection mid-answer")
        data += chunk
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            break
    head = data[:end].lower()
    at = head.find(b"\r\ncontent-length:")
    if at < 0:
        raise ConnectionError("an answer without Content-Length")
    stop = head.find(b"\r\n", at + 2)
    need = end + 4 + int(head[at + 17:stop if stop >= 0 else len(head)])
    while len(data) < need:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection mid-body")
        data += chunk
    return int(data[9:12]), b"\r\nconnection: close" in head


@dataclass
class _ClientResult:
    statuses: dict[int, int] = field(default_factory=dict)  # every answer, warm-up and tail included
    errors: int = 0
    reconnects: int = 0
    latencies: array = field(default_factory=lambda: array("d"))  # seconds, answers inside the window only


def _client(path: str, kind: str, name: str, go: Any, start: Any, warmup: float, seconds: float,
            result: _ClientResult) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    go.wait()
    begin = start.value + warmup
    end = begin + seconds
    serial = 0
    record = result.latencies.append
    statuses = result.statuses
    monotonic = time.monotonic
    while True:
        sent = monotonic()
        if sent >= end:
            break
        serial += 1
        request = _request(kind, f"{name}-{serial}")
        try:
            status, close = _exchange(sock, request)
        except OSError:
            result.errors += 1
            close = True
        else:
            done = monotonic()
            statuses[status] = statuses.get(status, 0) + 1
            if begin <= done < end:
                record(done - sent)
        if close:
            sock.close()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            result.reconnects += 1
    sock.close()


def _worker(path: str, kind: str, run: str, index: int, threads: int, ready: Any, go: Any, start: Any,
            warmup: float, seconds: float, out: Any) -> None:
    results = [_ClientResult() for _ in range(threads)]
    workers = [threading.Thread(target=_client, args=(path, kind, f"{run}-{index}-{n}", go, start, warmup, seconds,
                                                      results[n]), daemon=True) for n in range(threads)]
    for thread in workers:
        thread.start()
    ready.put(index)
    go.wait()
    cpu = time.process_time()
    for thread in workers:
        thread.join()
    out.put((index, time.process_time() - cpu, results))


@dataclass
class Load:
    """What one load run measured."""

    label: str
    seconds: float
    latencies: list[float]
    statuses: dict[int, int]
    errors: int
    reconnects: int
    client_cpu_s: float
    wall_s: float
    server_cpu_s: float | None = None

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds

    def percentile_ms(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        if len(self.latencies) < 2:
            return self.latencies[0] * 1000
        return statistics.quantiles(self.latencies, n=1000, method="inclusive")[int(q * 1000) - 1] * 1000

    @property
    def client_cores(self) -> float:
        return self.client_cpu_s / self.wall_s

    @property
    def server_cores(self) -> float | None:
        return None if self.server_cpu_s is None else self.server_cpu_s / self.wall_s


def run_load(path: Path, kind: str, label: str, clients: int, procs: int, seconds: float, warmup: float,
             server_pids: list[int] | None = None) -> Load:
    """``clients`` closed-loop keep-alive clients over ``procs`` processes against the unix socket ``path``."""
    ctx = mp.get_context("spawn")
    procs = max(1, min(procs, clients))
    shares = [clients // procs + (1 if n < clients % procs else 0) for n in range(procs)]
    ready, out, go, start = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    run = f"{label}-{os.getpid()}-{time.time_ns()}"
    workers = [ctx.Process(target=_worker, args=(str(path), kind, run, n, share, ready, go, start, warmup, seconds,
                                                 out), daemon=True) for n, share in enumerate(shares)]
    for worker in workers:
        worker.start()
    for _ in workers:
        ready.get(timeout=60)
    start.value = time.monotonic()
    server_cpu = _cpu_seconds(server_pids) if server_pids else None
    go.set()
    collected = [out.get(timeout=warmup + seconds + 60) for _ in workers]
    wall = time.monotonic() - start.value
    if server_pids:
        server_cpu = _cpu_seconds(server_pids) - server_cpu
    for worker in workers:
        worker.join(timeout=10)
    load = Load(label, seconds, [], {}, 0, 0, sum(cpu for _, cpu, _ in collected), wall, server_cpu)
    for _, _, results in collected:
        for result in results:
            load.latencies.extend(result.latencies)
            load.errors += result.errors
            load.reconnects += result.reconnects
            for status, count in result.statuses.items():
                load.statuses[status] = load.statuses.get(status, 0) + count
    return load


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of the given processes (from /proc; 0 where unreadable)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / ticks


def _process_tree(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


# --- the null responder ------------------------------------------------------------------------------------------


class _NullProtocol(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            at = head.find(b"\r\ncontent-length:")
            length = 0
            if at >= 0:
                stop = head.find(b"\r\n", at + 2)
                length = int(head[at + 17:stop if stop >= 0 else len(head)])
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length:]
            self.transport.write(NULL_RESPONSE)


def _null_server(path: str, ready: Any) -> None:
    async def main() -> None:
        server = await asyncio.get_running_loop().create_unix_server(_NullProtocol, path)
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# --- the stack's ceiling ----------------------------------------------------------------------------------------


def stack_ceiling(work: Path, workers: int, args: argparse.Namespace, durable: bool = False) -> Load:
    """The send load against bench/_bare_ipc.py (or, ``durable``, bench/_durable_ipc.py) with ``workers`` gunicorn
    worker processes."""
    name = "durable" if durable else "bare"
    path = work / f"{name}{workers}.sock"
    command = [sys.executable, str(REPO / "bench" / f"_{name}_ipc.py"), str(path), str(workers)]
    if durable:
        command.append(str(work / f"durable{workers}.db"))
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not _answers(path):  # the master binds first; a worker answers once it has booted
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"bench/_{name}_ipc.py did not start ({workers} workers)")
            time.sleep(0.05)
        return run_load(path, "send", f"{name}{workers}", args.clients, args.procs, args.seconds, args.warmup,
                        _process_tree(server.pid))
    finally:
        server.terminate()
        server.wait(timeout=30)


def _answers(path: Path) -> bool:
    """Whether a server on the unix socket ``path`` answers a health request."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2.0)
            sock.connect(str(path))
            return _exchange(sock, _request("health", ""))[0] == 200
    except OSError:
        return False


# --- raw SQLite --------------------------------------------------------------------------------------------------


def raw_commits(path: Path, seconds: float) -> list[float]:
    """Sequential single-row durable commits on one connection (WAL, synchronous=FULL); returns each one's seconds."""
    fresh = not path.exists()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        if fresh:
            conn.execute("CREATE TABLE outbox (id TEXT PRIMARY KEY, client_message_id TEXT NOT NULL UNIQUE,"
                         " status TEXT NOT NULL, enqueued_at INTEGER NOT NULL, payload BLOB NOT NULL)")
        payload = SEND_BODY * 2
        times: list[float] = []
        end = time.perf_counter() + seconds
        while True:
            began = time.perf_counter()
            if began >= end:
                break
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO outbox VALUES (?, ?, 'pending', ?, ?)",
                         (f"row-{time.time_ns()}", f"bench-{time.time_ns()}", time.time_ns() // 1_000_000, payload))
            conn.execute("COMMIT")
            times.append(time.perf_counter() - began)
    finally:
        conn.close()
    return times


# --- one run -------------------------------------------------------------------------------------------------------


def _outbox_depth(launched: Any) -> dict[str, int]:
    """Outbox rows per status (from the cm_daemon_outbox_depth gauges)."""
    with launched.unix() as client:
        text = client.get("/v1/metrics").text
    return {line.split('"')[1]: int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
            if line.startswith("cm_daemon_outbox_depth{")}


@dataclass
class Phase:
    """One send phase against one fresh implementation: the load and what its broker had by the end of it."""

    load: Load
    accepted: int  # 202 answers
    delivered: int  # distinct client_message_ids whose send frame the broker had received (and acked) by the end
    rows: int | None = None  # outbox rows afterwards (the reference's metrics; None where not readable)
    broker_cpu_s: float = 0.0  # CPU of this process during the phase: the scripted broker receiving and acking


@dataclass
class Round:
    """One round: raw commits, then the upstream daemon's send phase and a fresh reference's health and send."""

    raw: list[float]
    health: Load
    send: Phase
    upstream: Phase | None

    @property
    def raw_rate(self) -> float:
        return len(self.raw) / sum(self.raw)


def _delivered(broker: Any) -> int:
    """Distinct client_message_ids the scripted broker received a send frame for (it acks every one at once)."""
    return len({f.get("client_message_id") or f.get("id") for f in broker.received("send")})


def send_phase(template: str, state_dir: Path, args: argparse.Namespace, label: str,
               health: bool = False) -> tuple[Phase, Load | None]:
    """A fresh instance of ``template`` linked to a scripted broker that acks every send: [health,] send phase."""
    from conformance.launch import Launched
    from conformance.peer import ScriptedBroker

    state_dir.mkdir(mode=0o700, exist_ok=True)
    with ScriptedBroker() as broker:  # auto dialect: it speaks whichever dialect the daemon's hello announces
        daemon = Launched(template, state_dir, broker.url)
        daemon.start()
        try:
            daemon.wait_ready()
            broker.wait_linked(timeout=15)  # the broker's evidence: a hello answered (every dialect)
            pids = _process_tree(daemon.process.pid)
            health_load = run_load(daemon.socket_path, "health", "health", args.clients, args.procs, args.seconds,
                                   args.warmup, pids) if health else None
            broker_cpu = time.process_time()
            load = run_load(daemon.socket_path, "send", label, args.clients, args.procs, args.seconds, args.warmup,
                            pids)
            broker_cpu = time.process_time() - broker_cpu
            delivered = _delivered(broker)
            rows = sum(_outbox_depth(daemon).values()) if label == "send" else None
        finally:
            daemon.stop(timeout=20)
    return Phase(load, load.statuses.get(202, 0), delivered, rows, broker_cpu), health_load


def run_round(work: Path, index: int, args: argparse.Namespace, upstream: str | None) -> Round:
    """Raw commits on the filesystem of the daemons' state, then upstream's send phase and the reference's."""
    from conformance.launch import REFERENCE_TEMPLATE

    raw = raw_commits(work / "raw.db", args.seconds)
    peer = None
    if upstream is not None:
        peer, _ = send_phase(upstream, work / f"u{index}", args, "upstream")
    state_dir = work / f"d{index}"
    state_dir.mkdir(mode=0o700)
    (state_dir / "config.toml").write_text(DAEMON_CONFIG)
    send, health = send_phase(REFERENCE_TEMPLATE, state_dir, args, "send", health=True)
    assert health is not None
    return Round(raw, health, send, peer)


def upstream_template(args: argparse.Namespace, console: Any) -> str | None:
    """The launch template of upstream's build (installing its runtime once), or None when it is not here."""
    cli = args.runtime / f"claudemesh-cli-{args.build}" / "cli.js"
    if not (args.upstream / "setup.sh").is_file():
        console.print(f"[yellow]{args.upstream} is absent: no upstream daemon to compare with; the rows against it "
                      "are not measured (a user's clone has no upstream builds)[/yellow]")
        return None
    if not cli.is_file() or not (args.runtime / "node").exists():
        subprocess.run(["bash", str(args.upstream / "setup.sh"), str(args.runtime)], check=True)
    sys.path.insert(0, str(REPO / "fixtures" / "interop"))
    from run import launch_template

    return launch_template(args.runtime, args.build)


def pooled(loads: list[Load]) -> Load:
    """The rounds' loads as one: rates over the summed windows, latency percentiles over every answer."""
    total = Load(loads[0].label, 0.0, [], {}, 0, 0, 0.0, 0.0, 0.0)
    for load in loads:
        total.seconds += load.seconds
        total.latencies += load.latencies
        total.errors += load.errors
        total.reconnects += load.reconnects
        total.client_cpu_s += load.client_cpu_s
        total.wall_s += load.wall_s
        total.server_cpu_s = None if load.server_cpu_s is None or total.server_cpu_s is None else (
            total.server_cpu_s + load.server_cpu_s)
        for status, count in load.statuses.items():
            total.statuses[status] = total.statuses.get(status, 0) + count
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measurement window per phase and round (10)")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up before each window (default 1)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each on fresh daemons (default 2)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    parser.add_argument("--procs", type=int, default=4, help="load-generator processes (default 4)")
    parser.add_argument("--upstream", type=Path, default=DEFAULT_UPSTREAM,
                        help="the upstream builds' folder with setup.sh (default ../shared/upstream)")
    parser.add_argument("--runtime", type=Path, default=DEFAULT_RUNTIME,
                        help="where setup.sh installs Node and the builds (default ~/.cache/claudemesh-upstream)")
    parser.add_argument("--build", default="1.21.1", help="the upstream build to compare with (default 1.21.1)")
    parser.add_argument("--no-ceilings", action="store_true", help="skip the null responder and bare-stack rows")
    parser.add_argument("--tmp", type=Path, default=None, help="parent of the temp directory (default: system tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the temp directory (daemon state and logs)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is not met")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(REPO))
    from rich.console import Console
    from rich.table import Table

    from reference.core.limits import limit

    console = Console(width=None if sys.stdout.isatty() else 160)
    upstream = upstream_template(args, console)
    # A short parent keeps the unix socket path under the 108-byte limit.
    work = Path(tempfile.mkdtemp(prefix="meshbench-", dir=args.tmp))
    procs = max(1, min(args.procs, args.clients))
    console.print(f"[dim]temp dir {work} (raw commits and daemon state on one filesystem); {args.clients} clients "
                  f"over {procs} processes; {args.rounds} round(s) of {args.seconds:g} s per phase; "
                  f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; SQLite {sqlite3.sqlite_version}; "
                  f"reference with its default limits (spec/tables/limits.yaml: request body "
                  f"{int(limit('ipc_send_body_bytes')):,} B, the hostile-input caps of #11)[/dim]")
    ceilings: list[Load] = []
    null_load = None
    try:
        if not args.no_ceilings:
            console.print("null responder ...")
            ctx = mp.get_context("spawn")
            null_path = work / "null.sock"
            null_ready = ctx.Event()
            null = ctx.Process(target=_null_server, args=(str(null_path), null_ready), daemon=True)
            null.start()
            if not null_ready.wait(30):
                raise RuntimeError("the null responder did not start")
            null_load = run_load(null_path, "send", "null", args.clients, procs, args.seconds, args.warmup,
                                 [null.pid])
            null.terminate()
            null.join(10)
            console.print("the IPC stack with no work behind it (1 and 2 worker processes) ...")
            ceilings = [stack_ceiling(work, workers, args) for workers in (1, 2)]
            console.print("several processes accepting durably (phase A + group commit, FULL), no link: 1, 2, 3 ...")
            ceilings += [stack_ceiling(work, workers, args, durable=True) for workers in (1, 2, 3)]
        rounds = []
        for index in range(args.rounds):
            console.print(f"round {index + 1}: raw SQLite commits, "
                          f"{'upstream ' + args.build + ' POST /v1/send, ' if upstream else ''}"
                          "reference GET /v1/health and POST /v1/send ...")
            rounds.append(run_round(work, index, args, upstream))
    finally:
        if args.keep:
            console.print(f"[dim]kept {work}[/dim]")
        else:
            shutil.rmtree(work, ignore_errors=True)

    raw_times = [t for r in rounds for t in r.raw]
    raw_rate = len(raw_times) / sum(raw_times)
    health = pooled([r.health for r in rounds])
    send = pooled([r.send.load for r in rounds])
    peer = pooled([r.upstream.load for r in rounds]) if upstream else None

    per_round = Table(title="rounds (each on fresh daemons, side by side: upstream first, then the reference)")
    for column in ("round", "raw commit /s", f"upstream {args.build} send /s", "upstream p99 ms",
                   "upstream delivered by end", "reference send /s", "reference p99 ms",
                   "reference delivered by end", "reference/upstream", "scripted broker CPU (up | ref)"):
        per_round.add_column(column, justify="right")

    def broker_cores(phase: Phase | None) -> str:
        return "-" if phase is None else f"{phase.broker_cpu_s / phase.load.wall_s:.2f}"

    for index, r in enumerate(rounds, 1):
        u = r.upstream
        per_round.add_row(
            str(index), f"{r.raw_rate:,.0f}",
            f"{u.load.rate:,.0f}" if u else "-", f"{u.load.percentile_ms(0.99):.2f}" if u else "-",
            f"{u.delivered:,} of {u.accepted:,}" if u else "-",
            f"{r.send.load.rate:,.0f}", f"{r.send.load.percentile_ms(0.99):.2f}",
            f"{r.send.delivered:,} of {r.send.accepted:,}",
            f"{r.send.load.rate / u.load.rate:.2f}" if u else "-",
            f"{broker_cores(u)} | {broker_cores(r.send)} cores")
    console.print(per_round)

    table = Table(title=f"durable POST /v1/send, {args.clients} keep-alive clients, unix socket, all rounds pooled")
    for column in ("measurement", "rate /s", "p50 ms", "p99 ms", "answers", "errors", "client CPU", "server CPU",
                   "server CPU/req"):
        table.add_column(column, justify="left" if column == "measurement" else "right")

    def cores(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} cores"

    table.add_row("raw SQLite commit (1 conn, WAL, FULL)", f"{raw_rate:,.0f}",
                  f"{statistics.median(raw_times) * 1000:.2f}",
                  f"{statistics.quantiles(raw_times, n=100)[98] * 1000:.2f}", str(len(raw_times)), "-", "-", "-", "-")
    names = {"null": "null responder, POST (load generator max)",
             "bare1": "ceiling: bare IPC stack, 1 process, POST",
             "bare2": "ceiling: bare IPC stack, 2 processes, POST",
             "durable1": "durable accept, no link, 1 process (FULL)",
             "durable2": "durable accept, no link, 2 processes (FULL)",
             "durable3": "durable accept, no link, 3 processes (FULL)",
             "upstream": f"upstream {args.build} POST /v1/send (synchronous=NORMAL)",
             "health": "reference GET /v1/health", "send": "reference POST /v1/send (durable, FULL)"}
    for load in (null_load, *ceilings, peer, health, send):
        if load is None:
            continue
        answers = ", ".join(f"{status}: {count}" for status, count in sorted(load.statuses.items()))
        per_request = "-" if load.server_cpu_s is None else (
            f"{load.server_cpu_s / max(sum(load.statuses.values()), 1) * 1e6:.0f} us")
        table.add_row(names[load.label], f"{load.rate:,.0f}", f"{load.percentile_ms(0.5):.2f}",
                      f"{load.percentile_ms(0.99):.2f}", answers, str(load.errors), cores(load.client_cores),
                      cores(load.server_cores), per_request)
    console.print(table)

    accepted = sum(r.send.accepted for r in rounds)
    rows = sum(r.send.rows or 0 for r in rounds)
    delivered = sum(r.send.delivered for r in rounds)
    p99 = send.percentile_ms(0.99)
    verdicts: list[tuple[str, str, str, bool | None]] = []
    if peer is not None:
        ratio = send.rate / peer.rate
        peer_accepted = sum(r.upstream.accepted for r in rounds if r.upstream)
        peer_delivered = sum(r.upstream.delivered for r in rounds if r.upstream)
        verdicts += [
            ("accepted sends/s, reference / upstream " + args.build,
             f"{send.rate:,.0f} / {peer.rate:,.0f} = {ratio:.2f}", f">= {TARGETS['send/upstream']}",
             ratio >= TARGETS["send/upstream"]),
            (f"(info) upstream {args.build}: accepted rows its broker had by the end of the phase",
             f"{peer_delivered:,} of {peer_accepted:,} ({peer_delivered / max(peer_accepted, 1):.0%})",
             "upstream drains at most 32 rows per 500 ms", None)]
    else:
        verdicts.append(("accepted sends/s against upstream", "not measured: no upstream build here",
                         f">= {TARGETS['send/upstream']}", None))
    verdicts += [
        ("reference send p99", f"{p99:.2f} ms", f"<= {TARGETS['send p99 ms']:g} ms", p99 <= TARGETS["send p99 ms"]),
        ("reference durable: only 202s, one outbox row per 202",
         f"{accepted:,} x 202, {rows:,} rows, {send.errors} errors", "rows == 202s",
         rows == accepted and send.errors == 0 and set(send.statuses) == {202}),
        ("reference: every accepted row broker-acked by the end of the phase", f"{delivered:,} of {accepted:,}",
         "all", delivered >= accepted),
        ("(info) send/health, send/raw-commit", f"{send.rate / health.rate:.2f}, {send.rate / raw_rate:.2f}",
         "the #3 ratios, retired", None),
    ]
    if ceilings:
        verdicts.append(("(info) the IPC stack's ceiling, 1 and 2 processes",
                         f"{ceilings[0].rate:,.0f} and {ceilings[1].rate:,.0f} /s",
                         "no daemon on that stack answers faster than its ceiling", None))
        verdicts.append(("(info) durable accept without the link, 1/2/3 processes",
                         " / ".join(f"{load.rate:,.0f}" for load in ceilings[2:]) + " /s",
                         "a multi-process daemon's ceiling before the link's share", None))
    if null_load is not None:
        headroom = null_load.rate / max(send.rate, health.rate, peer.rate if peer else 0, 1)
        verdicts.append(("load generator not the bottleneck", f"null {null_load.rate:,.0f}/s = {headroom:.1f} x the "
                         f"fastest daemon rate; clients used {send.client_cores:.2f} cores during send", ">= 2 x",
                         headroom >= 2))
    summary = Table(title="targets (a reference 202 follows the COMMIT, synchronous=FULL, that fsynced its row)")
    for column in ("target", "measured", "wanted", "verdict"):
        summary.add_column(column)
    for name, measured, wanted, met in verdicts:
        verdict = "info" if met is None else "[green]met[/green]" if met else "[red]not met[/red]"
        summary.add_row(name, measured, wanted, verdict)
    console.print(summary)
    return 1 if args.check and not all(met for *_, met in verdicts if met is not None) else 0


if __name__ == "__main__":
    sys.exit(main())
