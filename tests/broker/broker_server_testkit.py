"""Shared helpers for the broker server tests: members with keys, frames, a WebSocket client, the broker in-process
or as a subprocess, a fork server for fast kill cycles, and a load client that behaves like a daemon's outbox.

(A uniquely named module rather than ``conftest``: conftest modules are not importable.) Run as a script with
``--fork-server`` it *is* the fork server: see ``ForkServer``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

MESH = "mesh-1"
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- members and frames --------------------------------------------------------------------------------------------

#: how long `expect` waits for a frame that should come by default: a loaded make test run (2 workers, Spark and
#: conformance runs beside it) delayed a peer_joined push past the 5 s this was
EXPECT_S = 20.0


@dataclass(eq=False)
class Member:
    """A mesh member: an ed25519 key and a display name."""

    name: str = "member"
    key: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)

    @property
    def pubkey(self) -> str:
        return self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()

    def hello(self, mesh_id: str = MESH, timestamp: int | None = None, member_id: str | None = None,
              sign_as: Member | None = None, **extra: Any) -> dict[str, Any]:
        """A signed hello (``sign_as`` signs with another member's key: a bad signature)."""
        timestamp = int(time.time() * 1000) if timestamp is None else timestamp
        member_id = member_id or self.pubkey
        payload = f"{mesh_id}|{member_id}|{self.pubkey}|{timestamp}".encode()
        signature = (sign_as or self).key.sign(payload).hex()
        return {"type": "hello", "meshId": mesh_id, "memberId": member_id, "pubkey": self.pubkey,
                "displayName": self.name, "protocolVersion": "0.9.0", "timestamp": timestamp,
                "signature": signature, **extra}


def send_frame(cmid: str, body: str = "hello", ref: str = "general", kind: str = "topic",
               claimed: str | None = None, meta: dict[str, Any] | None = None, priority: str = "next",
               reply_to_id: str = "") -> dict[str, Any]:
    """A ``send`` frame with the fingerprint an honest daemon claims (``claimed`` overrides it)."""
    from reference.core.fingerprint import FingerprintInput, request_fingerprint

    fingerprint = request_fingerprint(FingerprintInput(destination_kind=kind, destination_ref=ref,
                                                       reply_to_id=reply_to_id, priority=priority, meta=meta,
                                                       body=body)).hex()
    return {"type": "send", "id": cmid, "client_message_id": cmid, "request_fingerprint": claimed or fingerprint,
            "envelope_version": "1", "destination_kind": kind, "destination_ref": ref, "priority": priority,
            "reply_to_id": reply_to_id, "meta": meta, "body": body}


def populate(store: Any, members: list[Member], mesh_id: str = MESH, topics: tuple[str, ...] = ("general",),
             mode: str = "retention_scoped", retention_days: int | None = 7) -> None:
    """A mesh with ``members``, each subscribed to every topic in ``topics``."""
    store.add_mesh(mesh_id, mesh_id, mode, retention_days if mode == "retention_scoped" else None)
    for member in members:
        store.add_member(mesh_id, member.pubkey, member.name)
    for topic in topics:
        store.create_topic(mesh_id, topic)
        for member in members:
            store.subscribe(mesh_id, topic, member.pubkey)


# --- a WebSocket client --------------------------------------------------------------------------------------------

class Client:
    """A test-side WebSocket client: frames in and out as dicts, with a backlog for frames a test skipped."""

    def __init__(self, url: str, timeout: float = 5.0):
        from websockets.sync.client import connect

        self._stack = contextlib.ExitStack()
        self.ws = self._stack.enter_context(connect(url, open_timeout=timeout, close_timeout=1, compression=None,
                                                    max_size=2**24))
        self.backlog: list[dict[str, Any]] = []

    def send(self, frame: dict[str, Any] | str) -> None:
        self.ws.send(frame if isinstance(frame, str) else json.dumps(frame))

    def recv(self, timeout: float = 5.0) -> dict[str, Any]:
        if self.backlog:
            return self.backlog.pop(0)
        return json.loads(self.ws.recv(timeout=timeout))

    def expect(self, kind: str, timeout: float = EXPECT_S, **match: Any) -> dict[str, Any]:
        """The next frame of type ``kind`` (whose members equal ``match``), keeping the others in the backlog. A
        frame that should come: the bound only ends a failing wait (``quiet`` asserts that none comes)."""
        for index, frame in enumerate(self.backlog):
            if frame.get("type") == kind and all(frame.get(k) == v for k, v in match.items()):
                return self.backlog.pop(index)
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {kind} frame matching {match} within {timeout:g} s; backlog {self.backlog}")
            frame = json.loads(self.ws.recv(timeout=remaining))
            if frame.get("type") == kind and all(frame.get(k) == v for k, v in match.items()):
                return frame
            self.backlog.append(frame)

    def quiet(self, kind: str, seconds: float, **match: Any) -> bool:
        """True when no frame of ``kind`` (matching) arrives within ``seconds``."""
        try:
            self.expect(kind, timeout=seconds, **match)
        except TimeoutError:
            return True
        return False

    def handshake(self, member: Member, mesh_id: str = MESH, require: tuple[str, ...] = (
            "client_message_id_dedupe", "concurrent_connection_policy"), optional: tuple[str, ...] = (
            "member_keypair_rotated_event", "key_epoch", "max_payload")) -> tuple[dict[str, Any], dict[str, Any]]:
        self.send(member.hello(mesh_id))
        ack = self.expect("hello_ack")
        self.send({"type": "feature_negotiation_request", "require": list(require), "optional": list(optional)})
        return ack, self.expect("feature_negotiation_response")

    def closed(self, timeout: float = 5.0) -> tuple[int | None, str]:
        """Read until the broker closes; its close code and reason."""
        from websockets.exceptions import ConnectionClosed

        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                self.ws.recv(timeout=max(0.01, deadline - time.monotonic()))
        except ConnectionClosed as exc:
            return (exc.rcvd.code, exc.rcvd.reason) if exc.rcvd else (None, "")
        raise TimeoutError("the broker did not close the connection")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._stack.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def joined(url: str, member: Member, mesh_id: str = MESH) -> Client:
    """A client that finished hello and negotiation as ``member``."""
    client = Client(url)
    client.handshake(member, mesh_id)
    return client


# --- the broker in this process ------------------------------------------------------------------------------------

@contextlib.contextmanager
def running_broker(store_url: str, members: list[Member] | None = None, **config: Any) -> Iterator[Any]:
    """A migrated store (populated with ``members`` unless None) and a BrokerServer on 127.0.0.1; yields the server
    (``server.store`` is the store, ``server.url`` its URL)."""
    from reference.broker.config import BrokerConfig
    from reference.broker.server import BrokerServer
    from reference.broker.store import open_store

    store = open_store(store_url)
    store.migrate()
    if members is not None:
        populate(store, members)
    config.setdefault("db_workers", 8)
    server = BrokerServer(BrokerConfig(store_url=store_url, **config), store)
    try:
        with server:
            yield server
    finally:
        store.close()


# --- the broker as a process ---------------------------------------------------------------------------------------

def meshd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reference.cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, cwd=ROOT)


@dataclass
class BrokerProcess:
    """``meshd broker serve`` as a subprocess on a fixed port (so clients reconnect to the same URL after a kill).

    With ``fork_server`` the process is forked from an already-imported parent (see ``ForkServer``) instead of
    started from scratch: the same broker code and the same kill, without a second of imports per cycle.
    """

    store_url: str
    directory: Path
    args: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    fork_server: ForkServer | None = None
    process: subprocess.Popen | None = None
    pid: int | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def port_file(self) -> Path:
        return self.directory / "broker.port"

    @property
    def log_path(self) -> Path:
        return self.directory / "broker.log"

    def argv(self) -> list[str]:
        return ["broker", "serve", "--store", self.store_url, "--listen", f"127.0.0.1:{self.port}",
                "--port-file", str(self.port_file), *self.args]

    def start(self, wait: bool = True, timeout: float = 30.0) -> BrokerProcess:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port_file.unlink(missing_ok=True)
        if self.fork_server is not None:
            self.pid = self.fork_server.spawn(self.argv(), self.log_path)
            self.process = None
        else:
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen([sys.executable, "-m", "reference.cli", *self.argv()],
                                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=ROOT,
                                                start_new_session=True)
            self.pid = self.process.pid
        self.starts += 1
        if wait:
            self.wait_ready(timeout)
        return self

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        if self.pid is None:
            return False
        assert self.fork_server is not None
        return not self.fork_server.exited(self.pid)

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.port_file.exists():
                return
            if not self.alive():
                raise RuntimeError(f"the broker exited before listening:\n{self.tail()}")
            time.sleep(0.005)
        raise RuntimeError(f"the broker did not listen within {timeout:g} s:\n{self.tail()}")

    def kill9(self) -> None:
        """SIGKILL the broker process (nothing runs on the way down) and reap it."""
        if self.pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=10)
        elif self.fork_server is not None:
            self.fork_server.reap(self.pid)
        self.pid = None

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait; returns the exit code (SIGKILL after ``timeout``)."""
        if self.pid is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)
        if self.process is not None:
            try:
                return self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill9()
                return None
            finally:
                self.pid = None
        assert self.fork_server is not None
        status = self.fork_server.reap(self.pid, timeout)
        self.pid = None
        return status

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no output)"


class ForkServer:
    """A single-threaded helper process that has imported the broker and forks one broker process per ``spawn``.

    Each child calls ``reference.cli.main(["broker", "serve", …])`` in its own session with its output in a log file,
    exactly as ``python -m reference.cli`` would after its imports; it is killed with SIGKILL like any process. The
    parent never opens a database or a socket and starts no thread, so forking it is safe. Protocol on stdin/stdout,
    one line each: ``spawn {"argv": [...], "log": PATH}`` → pid; ``reap PID TIMEOUT`` → exit code (or ``-SIGNAL``,
    ``timeout``); ``exited PID`` → 1 or 0.
    """

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, __file__, "--fork-server"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
        self._lock = threading.Lock()
        assert self._call("ping") == "pong"

    def _call(self, line: str) -> str:
        with self._lock:
            assert self.process.stdin is not None and self.process.stdout is not None
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
            answer = self.process.stdout.readline().strip()
        if not answer:
            raise RuntimeError("the fork server died")
        return answer

    def spawn(self, argv: list[str], log: Path) -> int:
        return int(self._call("spawn " + json.dumps({"argv": argv, "log": str(log)})))

    def reap(self, pid: int, timeout: float = 10.0) -> int | None:
        answer = self._call(f"reap {pid} {timeout}")
        return None if answer == "timeout" else int(answer)

    def exited(self, pid: int) -> bool:
        return self._call(f"exited {pid}") == "1"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            assert self.process.stdin is not None
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def _fork_server_main() -> None:
    import traceback

    import reference.cli
    from reference.broker import server
    from reference.broker._schemas import frame_schema
    from reference.broker.store import postgres, sqlite  # noqa: F401 - every child starts warm

    reference.cli.build_parser()
    for name in server.DAEMON_FRAMES:
        frame_schema(f"broker/{name}")
    statuses: dict[int, int] = {}

    def wait(pid: int, flags: int) -> int | None:
        if pid in statuses:
            return statuses[pid]
        try:
            got, status = os.waitpid(pid, flags)
        except ChildProcessError:
            return statuses.get(pid, 0)
        if got == 0:
            return None
        statuses[pid] = os.waitstatus_to_exitcode(status)
        return statuses[pid]

    for line in sys.stdin:
        command, _, rest = line.strip().partition(" ")
        if command == "ping":
            answer = "pong"
        elif command == "spawn":
            request = json.loads(rest)
            pid = os.fork()
            if pid == 0:  # the broker process
                code = 1
                try:
                    os.setsid()
                    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                    null = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(null, 0)
                    os.dup2(log, 1)
                    os.dup2(log, 2)
                    code = reference.cli.main(request["argv"])
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else 1
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(code or 0)
            answer = str(pid)
        elif command == "reap":
            pid_text, timeout_text = rest.split()
            deadline = time.monotonic() + float(timeout_text)
            status = wait(int(pid_text), os.WNOHANG)
            while status is None and time.monotonic() < deadline:
                time.sleep(0.005)
                status = wait(int(pid_text), os.WNOHANG)
            answer = "timeout" if status is None else str(status)
        elif command == "exited":
            answer = "0" if wait(int(rest), os.WNOHANG) is None else "1"
        else:
            answer = "error"
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()


# --- a load client that behaves like a daemon's outbox -------------------------------------------------------------

@dataclass
class Outcome:
    """What one client_message_id got: every (status, broker_message_id) ack, in order."""

    frame: dict[str, Any]
    acks: list[tuple[int, str]] = field(default_factory=list)

    @property
    def settled(self) -> bool:
        return any(status in (200, 201) for status, _ in self.acks)


class LoadClient(threading.Thread):
    """A member that sends a stream of messages like a daemon drains its outbox: up to ``window`` in flight, every
    unanswered send resent with the same bytes after a reconnect, a 5xx retried, until each is answered 201 or 200.
    Now and then it resends an already settled id (a duplicate retry). ``drain()`` stops minting new ids; the thread
    ends once every id it minted settled (or at ``stop()``)."""

    def __init__(self, url: str, member: Member, prefix: str, window: int = 4, mesh_id: str = MESH,
                 duplicate_every: int = 10, seed: int = 0):
        super().__init__(name=f"load-{prefix}", daemon=True)
        self.url = url
        self.member = member
        self.prefix = prefix
        self.window = window
        self.mesh_id = mesh_id
        self.duplicate_every = duplicate_every
        self.rng = random.Random(seed)
        self.outcomes: dict[str, Outcome] = {}
        self.connections = 0
        self.errors: list[str] = []
        self._minted = 0
        self._draining = threading.Event()
        self._stopping = threading.Event()

    def drain(self) -> None:
        self._draining.set()

    def stop(self) -> None:
        self._stopping.set()

    def unsettled(self) -> list[str]:
        return [cmid for cmid, outcome in list(self.outcomes.items()) if not outcome.settled]

    def _next(self, inflight: set[str]) -> str | None:
        waiting = [cmid for cmid in self.unsettled() if cmid not in inflight]
        if waiting:
            return waiting[0]
        if self._draining.is_set():
            return None
        settled = [cmid for cmid, outcome in self.outcomes.items() if outcome.settled and cmid not in inflight]
        if settled and self.rng.randrange(self.duplicate_every) == 0:
            return self.rng.choice(settled)
        self._minted += 1
        cmid = f"{self.prefix}-{self._minted:06d}"
        self.outcomes[cmid] = Outcome(send_frame(cmid, body=f"{self.prefix} message {self._minted}"))
        return cmid

    def run(self) -> None:
        from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

        while not self._stopping.is_set():
            if self._draining.is_set() and not self.unsettled():
                return
            client = None
            try:
                client = Client(self.url, timeout=1.0)
                client.handshake(self.member, self.mesh_id)
                self.connections += 1
                self._pump(client)
            except (OSError, ConnectionClosed, InvalidHandshake, InvalidURI, TimeoutError, ValueError):
                time.sleep(0.01)
            except Exception as exc:  # recorded for the test to report
                self.errors.append(repr(exc))
                time.sleep(0.01)
            finally:
                if client is not None:
                    client.close()

    def _pump(self, client: Client) -> None:
        inflight: set[str] = set()
        while not self._stopping.is_set():
            while len(inflight) < self.window:
                cmid = self._next(inflight)
                if cmid is None:
                    break
                inflight.add(cmid)
                client.send(self.outcomes[cmid].frame)
            if not inflight:
                return
            frame = client.recv(timeout=2.0)
            if frame.get("type") != "ack":
                continue
            cmid = frame["client_message_id"]
            self.outcomes[cmid].acks.append((frame["status"], frame["messageId"]))
            inflight.discard(cmid)
            if frame["status"] not in (200, 201) and frame["status"] < 500:
                self.errors.append(f"{cmid}: unexpected ack {frame}")


if __name__ == "__main__" and sys.argv[1:] == ["--fork-server"]:
    _fork_server_main()
