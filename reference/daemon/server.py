"""Serving the IPC app under gunicorn: a unix socket (0600) and TCP loopback, one gthread worker.

Why this shape: the outbox, the inbox and the broker link are process state, so there is exactly one worker; the
gthread worker gives every request and every event stream its own thread, and ``ipc.threads`` exceeds
``max_inflight + max_streams`` so long SSE streams can never starve other requests. The master binds both listeners
(port 0 picks a free port, written to ``http.port``), then forks the worker, which builds the daemon in ``load()``.
A fatal condition in the worker (failed negotiation, say) is written to ``exit_reason.json`` and the master is asked
to stop; ``serve`` then exits with the recorded code (E-15). SIGHUP re-reads ``daemon.log_level`` in the master and
the worker; it never restarts the worker (gunicorn's own SIGHUP boots a second worker before the first has gone,
and the daemon's state must have one owner).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.workers.gthread import ThreadWorker

from .logs import JsonGunicornLogger

log = logging.getLogger("meshd")
EXIT_REASON = "exit_reason.json"


class TransportTag:
    """WSGI wrapper marking each request with the listener it arrived on (``meshd.transport``)."""

    def __init__(self, app: Callable):
        self.app = app

    def __call__(self, environ: dict, start_response: Callable) -> Any:
        sock = environ.get("gunicorn.socket")
        environ["meshd.transport"] = "unix" if sock is not None and sock.family == socket.AF_UNIX else "tcp"
        return self.app(environ, start_response)


class LingeringThreadWorker(ThreadWorker):
    """gunicorn's gthread worker, except that a kept-alive connection stays on its thread while requests keep coming.

    gthread hands every kept-alive connection back to the main thread's poller after each answer, and the next
    request then travels poller -> thread pool -> future callback -> pipe -> poller: three thread hand-offs and half a
    dozen syscalls per request, which cost more CPU than the daemon spends answering a health check. Here the thread
    that answered waits up to ``LINGER_S`` for the connection's next request and serves it itself. It stops lingering
    (and the connection goes back to the poller, exactly as in gthread) when the connection falls quiet, when the
    worker is stopping, after ``MAX_TURNS`` requests in a row, or as soon as other work waits for a thread, so a busy
    connection never keeps a thread from a new one and long event streams still get threads of their own.
    """

    LINGER_S = 0.01
    MAX_TURNS = 256

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._waiting = 0  # connections submitted to the pool that no thread has picked up yet
        self._waiting_lock = threading.Lock()

    def enqueue_req(self, conn: Any) -> None:
        with self._waiting_lock:
            self._waiting += 1
        super().enqueue_req(conn)

    def handle(self, conn: Any) -> Any:
        with self._waiting_lock:
            self._waiting -= 1
        keepalive = super().handle(conn)
        turns = 1
        while keepalive is True and turns < self.MAX_TURNS and self.alive and not self._waiting:
            if not (conn.parser.unreader.buf.getvalue() or _readable(conn.sock, self.LINGER_S)):
                break
            keepalive = super().handle(conn)
            turns += 1
        return keepalive


def _readable(sock: socket.socket, timeout: float) -> bool:
    """Whether ``sock`` has data (or EOF) within ``timeout`` seconds."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    try:
        return bool(poller.poll(timeout * 1000))
    except OSError:
        return False


def serving_settings(config: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The gunicorn settings the daemon serves with, binds and hooks aside (bench/_bare_ipc.py measures the same)."""
    return {
        "workers": 1,
        "worker_class": LingeringThreadWorker,
        "threads": int(config["ipc"]["threads"]),
        "umask": 0o077,
        "timeout": 30,
        "graceful_timeout": int(float(config["daemon"]["drain_timeout_s"])) + 5,
        "keepalive": 5,
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
        binds = [f"unix:{self.state_dir / 'daemon.sock'}"]
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
        return TransportTag(app)

    def _when_ready(self, server: Any) -> None:
        sock_path = self.state_dir / "daemon.sock"
        os.chmod(sock_path, 0o600)
        for listener in server.LISTENERS:
            address = listener.sock.getsockname()
            if listener.sock.family in (socket.AF_INET, socket.AF_INET6):
                port_file = self.state_dir / "http.port"
                port_file.write_text(f"{address[1]}\n", encoding="ascii")
                os.chmod(port_file, 0o644)
        server.handle_hup = lambda: self._hangup(server)
        log.info("daemon_started pid=%s sock=%s", os.getpid(), sock_path)

    def _reload_log_level(self) -> None:
        """Set this process's log level from the configuration as it is now; a bad file keeps the current one."""
        if self.log_level is None:
            return
        try:
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
    (state_dir / EXIT_REASON).write_text(json.dumps({"code": code, "reason": reason}), encoding="utf-8")


def recorded_exit(state_dir: Path) -> tuple[int, str] | None:
    path = state_dir / EXIT_REASON
    if not path.exists():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        return int(document["code"]), str(document["reason"])
    except (ValueError, KeyError, TypeError):
        return 1, "unreadable exit_reason.json"
    finally:
        path.unlink(missing_ok=True)


def serve(state_dir: Path, config: dict[str, dict[str, Any]], build: Callable[[], tuple[Callable, Any]],
          log_level: Callable[[], str] | None = None) -> int:
    """Run the daemon until it is stopped; returns the process exit code (E-15). ``log_level`` reads the
    configured level again (SIGHUP)."""
    (state_dir / EXIT_REASON).unlink(missing_ok=True)
    (state_dir / "daemon.sock").unlink(missing_ok=True)
    master = os.getpid()
    code = 0
    try:
        DaemonServer(state_dir, config, build, log_level).run()
    except SystemExit as exc:
        if os.getpid() != master:  # the forked worker unwinds through this frame too: let it exit as it wants
            raise
        code = exc.code if isinstance(exc.code, int) else 1
    recorded = recorded_exit(state_dir)
    if recorded is not None:
        code, reason = recorded
        log.error("daemon stopped: %s (exit %s)", reason, code)
    return code
