"""Serving the IPC app under gunicorn: a unix socket (0600) and TCP loopback, one gthread worker.

Why this shape: the outbox, the inbox and the broker link are process state, so there is exactly one worker; the
gthread worker gives every request and every event stream its own thread, and ``ipc.threads`` exceeds
``max_inflight + max_streams`` so long SSE streams can never starve other requests. Each transport has its own
threads and connection cap, and no thread waits for a client that has not finished sending its request head
(``IpcWorker``, E-43), so no client of one transport, however it behaves, can take the other's capacity. The master
binds both listeners (port 0 picks a free port, written to ``http.port``), then forks the worker, which builds the
daemon in ``load()``. A fatal condition in the worker (failed negotiation, say) is written to ``exit_reason.json`` and
the master is asked to stop; ``serve`` then exits with the recorded code (E-15). SIGHUP re-reads
``daemon.log_level`` in the master and the worker; it never restarts the worker (gunicorn's own SIGHUP boots a
second worker before the first has gone, and the daemon's state must have one owner).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import select
import selectors
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from gunicorn import util
from gunicorn.app.base import BaseApplication
from gunicorn.http import errors as http_errors
from gunicorn.http.errors import ParseException
from gunicorn.workers.gthread import TConn, ThreadWorker

from reference.core.codes import exit_code
from reference.core.limits import limit
from reference.state_dir import StateDir

from .deadlines import DeadlineSocket, ReadTimeout
from .logs import JsonGunicornLogger
from .problems import PROBLEM_JSON, Problem

log = logging.getLogger("meshd")


class TransportTag:
    """WSGI wrapper: marks each request with the listener it arrived on (``meshd.transport``) and, the head being read
    by now, arms the body's read deadline (``ipc_body_read_s``, E-43). An answer the app marks ``Connection: close``
    closes the connection (gunicorn drops the app's hop-by-hop headers and would otherwise keep it alive)."""

    def __init__(self, app: Callable, body_read_s: float | None = None):
        self.app = app
        self.body_read_s = float(limit("ipc_body_read_s") if body_read_s is None else body_read_s)

    def __call__(self, environ: dict, start_response: Callable) -> Any:
        sock = environ.get("gunicorn.socket")
        environ["meshd.transport"] = "unix" if sock is not None and sock.family == socket.AF_UNIX else "tcp"
        if isinstance(sock, DeadlineSocket):
            # req: IPC-BODY-DEADLINE -- armed once the head is read
            sock.arm(self.body_read_s, "body")
        return self.app(environ, _honouring_close(start_response))


def _honouring_close(start_response: Callable) -> Callable:
    response = getattr(start_response, "__self__", None)  # gunicorn's Response, whose bound method this is
    if response is None or not hasattr(response, "force_close"):
        return start_response

    def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        if any(name.lower() == "connection" and "close" in value.lower() for name, value in headers):
            response.force_close()
        return start_response(status, headers, exc_info)

    return start


@dataclass(frozen=True)
class IpcSettings:
    """What the IPC worker enforces per connection and per transport (spec/tables/limits.yaml, E-43)."""

    threads: int
    max_connections: int
    header_read_s: float
    write_s: float
    idle_s: float
    linger_s: float
    drain_bytes: int

    @classmethod
    def from_config(cls, config: dict[str, dict[str, Any]]) -> IpcSettings:
        ipc = config["ipc"]
        return cls(threads=int(ipc["threads"]), max_connections=int(ipc["max_connections"]),
                   header_read_s=float(ipc["header_read_s"]), write_s=float(ipc["write_s"]),
                   idle_s=float(limit("ipc_idle_s")), linger_s=float(limit("ipc_close_linger_s")),
                   drain_bytes=int(limit("ipc_drain_bytes")))


UNIX, TCP = "unix", "tcp"
#: a request head is handed to a thread once it is complete, or once this much of it has arrived (the parser then
#: reads the rest under the head deadline and answers 414 or 431 when it is too large)
HEAD_GATE_BYTES = 65_536
_HEAD_ENDS = (b"\r\n\r\n", b"\n\n")


class IpcConn(TConn):
    """A gthread connection that knows its transport, gathers its head on the poller, and is counted until closed."""

    def __init__(self, worker: IpcWorker, transport: str, *args: Any):
        super().__init__(*args)
        self.worker = worker
        self.transport = transport
        self.head = bytearray()  # head bytes gathered on the poller, handed to the parser when complete
        self.head_deadline: float | None = None  # set by the first byte of a request
        self.idle_until = 0.0
        self.closed = False

    def init(self) -> None:
        super().init()
        if self.head:
            self.parser.unreader.unread(bytes(self.head))
            self.head = bytearray()

    def close(self, graceful: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        self.worker.connection_closed(self)
        raw = self.sock.raw if isinstance(self.sock, DeadlineSocket) else self.sock
        if graceful:
            self.worker.closer.linger(raw)
        else:
            util.close(raw)


class LingeringCloser(threading.Thread):
    """Closes answered connections the RFC 9112 §9.6 way, for every connection at once on one thread.

    A connection closed with its request body (or a next request) still arriving must not be reset while the client
    is writing, or the client loses the answer: it is half-closed, and what the client still sends is read and
    dropped until it closes, for at most ``linger_s`` and ``drain_bytes``. gunicorn does this on its accept loop,
    blocking it for up to two seconds per connection, so a client that never closes could stall every transport;
    here it happens on a poller of its own.
    """

    def __init__(self, linger_s: float, drain_bytes: int,
                 max_sockets: int = int(limit("ipc_lingering_connections"))):
        super().__init__(name="meshd-closer", daemon=True)
        self.linger_s = linger_s
        self.drain_bytes = drain_bytes
        self.max_sockets = max_sockets
        self._incoming: list[socket.socket] = []
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stopping = False

    def linger(self, sock: socket.socket) -> None:
        """Half-close ``sock`` now and close it once the client has (or after ``linger_s``)."""
        try:
            sock.setblocking(False)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            util.close(sock)
            return
        with self._lock:
            # req: IPC-LINGERING-CLOSE -- on the closer's own poller, off request threads and the accept loop
            self._incoming.append(sock)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def stop(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def run(self) -> None:
        poller = selectors.DefaultSelector()
        poller.register(self._wake_r, selectors.EVENT_READ, None)
        lingering: dict[socket.socket, list[float]] = {}  # sock -> [deadline, bytes drained]
        while not self._stopping:
            timeout = min((entry[0] for entry in lingering.values()), default=time.monotonic() + 1.0)
            for key, _ in poller.select(max(0.0, min(1.0, timeout - time.monotonic()))):
                if key.data is None:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                    continue
                sock = key.fileobj
                entry = lingering[sock]
                if self._drain(sock, entry):
                    poller.unregister(sock)
                    del lingering[sock]
                    util.close(sock)
            with self._lock:
                incoming, self._incoming = self._incoming, []
            for sock in incoming:
                # req: LIMIT-TABLE -- ipc_lingering_connections: past it a connection is closed without lingering
                if len(lingering) >= self.max_sockets:
                    util.close(sock)
                    continue
                lingering[sock] = [time.monotonic() + self.linger_s, 0]
                poller.register(sock, selectors.EVENT_READ, sock)
            now = time.monotonic()
            for sock in [s for s, entry in lingering.items() if entry[0] <= now]:
                poller.unregister(sock)
                del lingering[sock]
                util.close(sock)
        for sock in lingering:
            util.close(sock)
        poller.close()

    def _drain(self, sock: socket.socket, entry: list[float]) -> bool:
        """Read what the client sent; True once it has closed (or sent too much)."""
        while True:
            try:
                data = sock.recv(65_536)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                return True
            if not data:
                return True
            entry[1] += len(data)
            if entry[1] > self.drain_bytes:
                return True


class _Pools:
    """The per-transport thread pools (and the closer), shut down together where gthread shuts down its one pool."""

    def __init__(self, pools: dict[str, ThreadPoolExecutor], closer: LingeringCloser):
        self.pools = pools
        self.closer = closer

    def submit(self, fn: Callable, *args: Any) -> Any:  # gthread itself never submits except through enqueue_req
        return self.pools[TCP].submit(fn, *args)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for pool in self.pools.values():
            pool.shutdown(wait=wait, cancel_futures=cancel_futures)
        self.closer.stop()


class IpcWorker(ThreadWorker):
    """gunicorn's gthread worker, hardened against clients that hold connections without finishing requests (E-43).

    * **Per-transport capacity.** The unix socket and TCP each have their own thread pool and their own connection
      cap (``ipc.threads``, ``ipc.max_connections``), so nothing that happens on TCP can starve the unix socket. A
      connection past its transport's cap is accepted and closed at once.
    * **Heads are gathered on the poller.** A new connection, or a kept-alive one whose next request starts, gets no
      thread until its request head is complete: the accept loop reads the head bytes without blocking as they come.
      An idle connection is closed after ``ipc_idle_s``; a head that has begun but is not complete within
      ``ipc.header_read_s`` is answered 408 ``request_timeout`` and closed. So neither silent nor dribbling clients
      hold threads. Thread reads are bounded too (``DeadlineSocket``): the body deadline is armed by ``TransportTag``.
    * **Lingering.** A thread that answered waits up to ``LINGER_S`` for the connection's next complete request and
      serves it itself (gthread's round trip through the poller costs more than a health check); it stops when the
      connection falls quiet, after ``MAX_TURNS`` requests, when the worker stops, or when other work waits for a
      thread of the same transport.
    * **Closing.** Graceful closes linger on the ``LingeringCloser``'s thread, never on the accept loop.
    * **Errors before routing** (a malformed or too large head, a head timeout) are answered with a problem+json body
      (E-11), never gunicorn's text/html page.
    """

    settings: IpcSettings  # bound by ipc_worker()
    LINGER_S = 0.01
    MAX_TURNS = 256

    def get_thread_pool(self) -> Any:
        # req: IPC-TRANSPORT-CAPACITY -- threads per transport
        self.pools = {transport: ThreadPoolExecutor(max_workers=self.settings.threads,
                                                    thread_name_prefix=f"meshd-{transport}")
                      for transport in (UNIX, TCP)}
        self._waiting = {UNIX: 0, TCP: 0}  # submitted connections no thread has picked up yet
        self._open = {UNIX: 0, TCP: 0}
        self._refused = {UNIX: 0, TCP: 0}  # connections closed at once: their transport was full
        self._refused_logged_at = 0.0
        self._counts_lock = threading.Lock()
        self.heads: dict[IpcConn, None] = {}  # connections whose head is being gathered, in arrival order
        self.closer = LingeringCloser(self.settings.linger_s, self.settings.drain_bytes)
        self.closer.start()
        return _Pools(self.pools, self.closer)

    # --- accepting and counting ----------------------------------------------------------------------------------
    def accept(self, listener: Any) -> None:
        try:
            client_sock, client_addr = listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        transport = UNIX if client_sock.family == socket.AF_UNIX else TCP
        with self._counts_lock:
            # req: IPC-TRANSPORT-CAPACITY -- a connection cap per transport
            full = self._open[transport] >= self.settings.max_connections
            if not full:
                self._open[transport] += 1
        if full:
            util.close(client_sock)
            self._refused[transport] += 1
            now = time.monotonic()
            if now >= self._refused_logged_at + 1.0:  # a flood of connections is not a flood of log lines
                self._refused_logged_at = now
                self.log.warning("ipc_connections_refused transport=%s refused=%d cap=%d", transport,
                                 self._refused[transport], self.settings.max_connections)
            return
        self.nr_conns += 1
        conn = IpcConn(self, transport, self.cfg, DeadlineSocket(client_sock, self.settings.write_s), client_addr,
                       listener.getsockname())
        self._gather(conn)

    def connection_closed(self, conn: IpcConn) -> None:
        with self._counts_lock:
            self._open[conn.transport] -= 1

    def open_connections(self) -> dict[str, int]:
        return dict(self._open)

    # --- gathering heads on the poller ---------------------------------------------------------------------------
    def enqueue_req(self, conn: IpcConn) -> None:
        if not _head_complete(conn.parser.unreader.buf.getvalue() if conn.parser is not None else bytes(conn.head)):
            self._gather(conn)
            return
        self._submit(conn)

    def _submit(self, conn: IpcConn) -> None:
        with self._counts_lock:
            self._waiting[conn.transport] += 1
        future = self.pools[conn.transport].submit(self.handle, conn)
        future.add_done_callback(lambda fut: self.method_queue.defer(self.finish_request, conn, fut))

    def _gather(self, conn: IpcConn) -> None:
        if conn.parser is not None:  # a kept-alive connection: what the parser holds is the start of the head
            conn.head = bytearray(conn.parser.unreader.take_buffered())
        conn.head_deadline = time.monotonic() + self.settings.header_read_s if conn.head else None
        conn.idle_until = time.monotonic() + self.settings.idle_s
        conn.sock.setblocking(False)
        self.heads[conn] = None
        self.poller.register(conn.sock, selectors.EVENT_READ, functools.partial(self._on_head_bytes, conn))

    def _stop_gathering(self, conn: IpcConn) -> None:
        self.heads.pop(conn, None)
        with contextlib.suppress(OSError, KeyError, ValueError):
            self.poller.unregister(conn.sock)

    def _on_head_bytes(self, conn: IpcConn, _fileobj: Any) -> None:
        try:
            data = conn.sock.raw.recv(HEAD_GATE_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client went away before finishing a request
            self._stop_gathering(conn)
            self.nr_conns -= 1
            conn.close()
            return
        if conn.head_deadline is None:
            # req: IPC-HEAD-DEADLINE -- from the first byte, on the poller: no thread waits for a head
            conn.head_deadline = time.monotonic() + self.settings.header_read_s
        conn.head += data
        if _head_complete(conn.head) or len(conn.head) >= HEAD_GATE_BYTES:
            self._stop_gathering(conn)
            if conn.parser is not None:
                conn.parser.unreader.unread(bytes(conn.head))
                conn.head = bytearray()
            conn.data_ready = True
            self._submit(conn)

    def murder_pending(self) -> None:
        super().murder_pending()
        now = time.monotonic()
        for conn in list(self.heads):
            # req: IPC-HEAD-DEADLINE
            if conn.head_deadline is not None and conn.head_deadline <= now:
                self._stop_gathering(conn)
                self.nr_conns -= 1
                with contextlib.suppress(OSError):
                    conn.sock.raw.send(problem_response(Problem(
                        "request_timeout", f"the request head did not arrive within "
                                           f"{self.settings.header_read_s:g} s (ipc_header_read_s)")))
                conn.close(graceful=True)
            elif conn.head_deadline is None and conn.idle_until <= now:
                self._stop_gathering(conn)
                self.nr_conns -= 1
                conn.close()

    def murder_keepalived(self, force: bool = False) -> None:
        super().murder_keepalived(force)
        if force:
            for conn in list(self.heads):
                self._stop_gathering(conn)
                self.nr_conns -= 1
                conn.close()

    def on_client_socket_readable(self, conn: IpcConn, client: Any) -> None:
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self._gather(conn)

    # --- serving ---------------------------------------------------------------------------------------------
    def handle(self, conn: IpcConn) -> Any:
        with self._counts_lock:
            self._waiting[conn.transport] -= 1
        conn.sock.arm(self.settings.header_read_s, "head")
        keepalive = super().handle(conn)
        turns = 1
        while (keepalive is True and turns < self.MAX_TURNS and self.alive and not self._waiting[conn.transport]
               and _next_head_ready(conn, self.LINGER_S)):
            conn.sock.arm(self.settings.header_read_s, "head")
            keepalive = super().handle(conn)
            turns += 1
        return keepalive

    def _keepalive_after(self, conn: IpcConn, keepalive: Any) -> bool:
        try:
            return super()._keepalive_after(conn, keepalive)
        except (ReadTimeout, OSError, ParseException):  # a body left unread and stalled: close instead
            return False

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        """Answer what failed before (or outside) the app with a problem+json body (E-11, E-43), then close."""
        problem = problem_for(exc)
        if problem is None:
            log.error("ipc_request_failed %s: %s", type(exc).__name__, exc, exc_info=exc)
            problem = Problem("internal_error", "internal daemon error; see the daemon log")
        else:
            log.info("ipc_request_refused status=%s error=%s detail=%s", problem.status, problem.code, problem.detail)
        with contextlib.suppress(Exception):
            client.sendall(problem_response(problem))


def _head_complete(data: bytes | bytearray) -> bool:
    return any(end in data for end in _HEAD_ENDS)


def _next_head_ready(conn: IpcConn, wait_s: float) -> bool:
    """Whether the connection's next request head is complete now or within ``wait_s`` (without consuming it)."""
    buffered = conn.parser.unreader.buf.getvalue()
    if _head_complete(buffered):
        return True
    if not _readable(conn.sock.raw, wait_s):
        return False
    try:
        peeked = conn.sock.raw.recv(HEAD_GATE_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:
        return False
    return _head_complete(buffered + peeked)


def problem_for(exc: BaseException) -> Problem | None:
    """The problem answering an error raised before the app could answer; None for a fault."""
    if isinstance(exc, ReadTimeout):
        bound = "ipc_header_read_s" if exc.phase == "head" else "ipc_body_read_s"
        return Problem("request_timeout", f"{exc} ({bound})")
    # req: IPC-MALFORMED-HTTP, ERR-NO-5XX-ON-BAD-INPUT
    if isinstance(exc, http_errors.LimitRequestLine):
        return Problem("uri_too_long", f"{exc} (http_request_line_bytes)")
    if isinstance(exc, http_errors.LimitRequestHeaders):
        return Problem("header_fields_too_large", f"{exc}")
    if isinstance(exc, ParseException | http_errors.NoMoreData) and not isinstance(
            exc, http_errors.InvalidResponseHeader | http_errors.InvalidResponseHeaderName):
        return Problem("malformed_http", f"{type(exc).__name__}: {exc}"[:300])
    return None


def problem_response(problem: Problem) -> bytes:
    """A whole HTTP/1.1 response for ``problem``: its status (errors.yaml's) and that status' reason phrase."""
    # req: ERR-PROBLEM-JSON -- errors before the app too
    body = json.dumps(problem.body(), ensure_ascii=False).encode()
    head = (f"HTTP/1.1 {problem.status} {HTTPStatus(problem.status).phrase}\r\nContent-Type: {PROBLEM_JSON}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode("latin-1") + body


def _readable(sock: socket.socket, timeout: float) -> bool:
    """Whether ``sock`` has data (or EOF) within ``timeout`` seconds."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    try:
        return bool(poller.poll(timeout * 1000))
    except OSError:
        return False


def ipc_worker(config: dict[str, dict[str, Any]]) -> type[IpcWorker]:
    """The worker class, bound to this configuration's IPC settings."""
    return type("IpcWorker", (IpcWorker,), {"settings": IpcSettings.from_config(config)})


#: the name the benchmarks and older code know the worker by
LingeringThreadWorker = IpcWorker


def serving_settings(config: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The gunicorn settings the daemon serves with, binds and hooks aside (bench/_bare_ipc.py measures the same)."""
    ipc = IpcSettings.from_config(config)
    return {
        "workers": 1,
        "worker_class": ipc_worker(config),
        "threads": ipc.threads,
        "worker_connections": 2 * ipc.max_connections + 16,  # the per-transport caps are the real bound
        "umask": 0o077,
        "timeout": 30,
        "graceful_timeout": int(float(config["daemon"]["drain_timeout_s"])) + 5,
        "keepalive": max(1, round(ipc.idle_s)),
        "limit_request_line": int(limit("http_request_line_bytes")),
        "limit_request_fields": int(limit("http_header_fields")),
        "limit_request_field_size": int(limit("http_header_field_bytes")),
        "accesslog": None,
        "errorlog": "-",
        "logger_class": JsonGunicornLogger,
        "loglevel": config["daemon"]["log_level"].lower(),
        "proc_name": "meshd",
        "control_socket_disable": True,
    }


class DaemonServer(BaseApplication):
    """gunicorn embedded: ``build()`` runs in the worker and returns (wsgi app, shutdown callable)."""

    def __init__(self, state_dir: Path, config: dict[str, dict[str, Any]], build: Callable[[], tuple[Callable, Any]],
                 log_level: Callable[[], str] | None = None):
        self.state_dir = state_dir
        self.daemon_config = config
        self.build = build
        self.log_level = log_level
        self.runtime: Any = None
        super().__init__()

    def load_config(self) -> None:
        ipc = self.daemon_config["ipc"]
        binds = [f"unix:{StateDir(self.state_dir).socket}"]
        if ipc["tcp_enabled"]:
            host = ipc["http_bind"]
            binds.append(f"[{host}]:{ipc['http_port']}" if ":" in host else f"{host}:{ipc['http_port']}")
        settings = {
            **serving_settings(self.daemon_config),
            "bind": binds,
            "when_ready": self._when_ready,
            "post_worker_init": self._post_worker_init,
            "worker_exit": self._worker_exit,
        }
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self) -> Callable:
        app, runtime = self.build()
        self.runtime = runtime
        return TransportTag(app, float(self.daemon_config["ipc"]["body_read_s"]))

    def _when_ready(self, server: Any) -> None:
        files = StateDir(self.state_dir)
        sock_path = files.socket
        # req: AUTH-UDS-MODE
        os.chmod(sock_path, 0o600)
        for listener in server.LISTENERS:
            address = listener.sock.getsockname()
            if listener.sock.family in (socket.AF_INET, socket.AF_INET6):
                port_file = files.http_port
                port_file.write_text(f"{address[1]}\n", encoding="ascii")
                os.chmod(port_file, 0o644)
        server.handle_hup = lambda: self._hangup(server)
        log.info("daemon_started pid=%s sock=%s", os.getpid(), sock_path)

    def _reload_log_level(self) -> None:
        """Set this process's log level from the configuration as it is now; a bad file keeps the current one."""
        if self.log_level is None:
            return
        try:
            # req: LIFE-SIGHUP -- only the log level; a bad file keeps the running one
            level = self.log_level()
        except Exception as exc:  # ConfigError, OSError: the running daemon keeps going as it is
            log.warning("sighup: configuration not re-read (%s); log level unchanged", exc)
            return
        logging.getLogger().setLevel(level)
        logging.getLogger("gunicorn.error").setLevel(level)
        log.info("sighup: log_level=%s", level)

    def _hangup(self, server: Any) -> None:
        """The master's SIGHUP: re-read the log level here and in the worker, which keeps running."""
        self._reload_log_level()
        for pid in list(server.WORKERS):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGHUP)

    def _post_worker_init(self, worker: Any) -> None:
        original = worker.handle_exit

        def drain_then_exit(sig: int, frame: Any) -> None:
            if self.runtime is not None:
                self.runtime.shutdown()
            original(sig, frame)

        signal.signal(signal.SIGTERM, drain_then_exit)
        signal.signal(signal.SIGINT, drain_then_exit)
        signal.signal(signal.SIGHUP, lambda sig, frame: self._reload_log_level())
        if self.runtime is not None:
            self.runtime.start(stop_master=lambda: os.kill(worker.ppid, signal.SIGTERM))

    def _worker_exit(self, server: Any, worker: Any) -> None:
        if self.runtime is not None:
            self.runtime.close()


def record_exit(state_dir: Path, code: int, reason: str) -> None:
    """Remember why the worker asked the master to stop, for ``serve`` to exit with."""
    StateDir(state_dir).exit_record.write_text(json.dumps({"code": code, "reason": reason}), encoding="utf-8")


def recorded_exit(state_dir: Path) -> tuple[int, str] | None:
    path = StateDir(state_dir).exit_record
    if not path.exists():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        return int(document["code"]), str(document["reason"])
    except (ValueError, KeyError, TypeError):
        return exit_code("error"), "unreadable exit_reason.json"
    finally:
        path.unlink(missing_ok=True)


def serve(state_dir: Path, config: dict[str, dict[str, Any]], build: Callable[[], tuple[Callable, Any]],
          log_level: Callable[[], str] | None = None) -> int:
    """Run the daemon until it is stopped; returns the process exit code (E-15). ``log_level`` reads the
    configured level again (SIGHUP)."""
    files = StateDir(state_dir)
    files.exit_record.unlink(missing_ok=True)
    files.socket.unlink(missing_ok=True)
    master = os.getpid()
    code = exit_code("ok")
    try:
        DaemonServer(state_dir, config, build, log_level).run()
    except SystemExit as exc:
        if os.getpid() != master:  # the forked worker unwinds through this frame too: let it exit as it wants
            raise
        code = exc.code if isinstance(exc.code, int) else exit_code("error")
    recorded = recorded_exit(state_dir)
    if recorded is not None:
        code, reason = recorded
        log.error("daemon stopped: %s (exit %s)", reason, code)
    return code
