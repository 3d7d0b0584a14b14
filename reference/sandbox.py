"""`meshd sandbox`: a reference broker (SQLite, --dev) and a reference daemon joined to it, for trying things out.

Both run as subprocesses in their own process groups, with their logs in the sandbox directory:
``<dir>/broker.db``, ``<dir>/broker.log``, ``<dir>/daemon/`` (the daemon's state directory) and ``<dir>/daemon.log``;
the directory is 0700 and every file in it 0600 (broker.db holds every message body).
The sandbox prints where to reach the daemon (unix socket, TCP port, token file) and runs until SIGINT or SIGTERM,
then stops the daemon (SIGTERM, a bounded drain) before the broker. Running it again on the same directory keeps
the state of both.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from reference.state_dir import StateDir

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class SandboxError(RuntimeError):
    """A process of the sandbox did not come up; the message names its log."""


@dataclass
class Sandbox:
    """The broker and the daemon of one sandbox directory; ``start()`` then ``stop()`` (or use ``with``)."""

    directory: Path
    python: str = sys.executable
    daemon_port: int = 0
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    broker_port: int | None = None

    @property
    def state_dir(self) -> Path:
        return self.directory / "daemon"

    @property
    def socket_path(self) -> Path:
        return StateDir(self.state_dir).socket

    @property
    def token_file(self) -> Path:
        return StateDir(self.state_dir).local_token

    @property
    def broker_url(self) -> str:
        return f"ws://127.0.0.1:{self.broker_port}"

    def tcp_port(self) -> int | None:
        try:
            return int(StateDir(self.state_dir).http_port.read_text().strip())
        except (OSError, ValueError):
            return None

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        with private_log(self.directory / f"{name}.log") as log:
            process = subprocess.Popen([self.python, "-m", "reference.cli", *argv], stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=log, start_new_session=True)
        self.processes[name] = process
        return process

    def _wait(self, name: str, ready, what: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.processes[name].poll() is not None:
                raise SandboxError(f"the {name} exited with {self.processes[name].returncode} before {what}; "
                                   f"see {self.directory / f'{name}.log'}")
            if ready():
                return
            time.sleep(0.05)
        raise SandboxError(f"the {name} did not {what} within {READY_TIMEOUT_S:g} s; "
                           f"see {self.directory / f'{name}.log'}")

    def start(self) -> Sandbox:
        """Start the broker, wait for its port, start the daemon, wait until its broker link is up."""
        # broker.db holds every message body and the logs name members: the directory is private (0700), like the
        # daemon's state directory, and so is every file in it (0600).
        # req: LIFE-PRIVATE-FILES
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        self.state_dir.mkdir(mode=0o700, exist_ok=True)
        port_file = self.directory / "broker.port"
        port_file.unlink(missing_ok=True)
        try:
            self._spawn("broker", ["broker", "serve", "--store", f"sqlite:///{self.directory / 'broker.db'}",
                                   "--listen", "127.0.0.1:0", "--port-file", str(port_file), "--dev"])
            self._wait("broker", port_file.exists, "listen")
            self.broker_port = int(port_file.read_text().strip())
            self._spawn("daemon", ["up", "--state-dir", str(self.state_dir), "--broker-url", self.broker_url,
                                   "--port", str(self.daemon_port)])
            self._wait("daemon", self._connected, "connect to the broker")
        except BaseException:
            self.stop()
            raise
        return self

    def _connected(self) -> bool:
        if not self.socket_path.exists():
            return False
        transport = httpx.HTTPTransport(uds=str(self.socket_path))
        try:
            with httpx.Client(transport=transport, base_url="http://localhost", timeout=2) as client:
                return bool(client.get("/v1/health").json().get("connected"))
        except (httpx.HTTPError, ValueError):
            return False

    def stop(self) -> dict[str, int | None]:
        """SIGTERM the daemon, then the broker (SIGKILL after a bounded wait); returns their exit codes."""
        codes: dict[str, int | None] = {}
        for name in ("daemon", "broker"):
            process = self.processes.pop(name, None)
            if process is None:
                continue
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=STOP_TIMEOUT_S)
            codes[name] = process.returncode
        return codes

    def summary(self) -> str:
        port = self.tcp_port()
        return "\n".join([
            f"meshd sandbox in {self.directory}",
            f"  broker   {self.broker_url} (SQLite {self.directory / 'broker.db'}, --dev)",
            f"  socket   {self.socket_path}",
            f"  tcp      127.0.0.1:{port}" if port else "  tcp      (disabled)",
            f"  token    {self.token_file}",
            f"  logs     {self.directory / 'broker.log'}, {self.directory / 'daemon.log'}",
            "  try      meshd send --state-dir " + str(self.state_dir) + " --to '#general' --message hi",
            "Ctrl-C stops both.",
        ])

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def private_log(path: Path) -> Any:
    """``path`` opened for appending, created 0600 (and made 0600 if it was not)."""
    # req: LIFE-PRIVATE-FILES -- the sandbox logs
    handle = os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")
    os.fchmod(handle.fileno(), 0o600)
    return handle


def cmd_sandbox(args: argparse.Namespace) -> int:
    directory = (args.dir or Path(tempfile.mkdtemp(prefix="meshd-sandbox-"))).resolve()
    sandbox = Sandbox(directory, daemon_port=args.port)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        sandbox.start()
    except SandboxError as exc:
        print(f"meshd sandbox: {exc}", file=sys.stderr)
        return 1
    print(sandbox.summary(), flush=True)
    try:
        while not stop.is_set():
            for name, process in sandbox.processes.items():
                if process.poll() is not None:
                    print(f"meshd sandbox: the {name} exited with {process.returncode}", file=sys.stderr)
                    stop.set()
            stop.wait(0.5)
    finally:
        codes = sandbox.stop()
    print(f"meshd sandbox stopped ({', '.join(f'{k} exit {v}' for k, v in codes.items())})", flush=True)
    return 0 if all(code == 0 for code in codes.values()) else 1


def add_command(sub: argparse._SubParsersAction) -> None:
    """Register ``meshd sandbox``."""
    parser = sub.add_parser("sandbox", help="run a --dev broker and a daemon joined to it until interrupted")
    parser.add_argument("--dir", type=Path, help="sandbox directory (default: a new temporary directory)")
    parser.add_argument("--port", type=int, default=0, help="the daemon's TCP port (0 picks a free one)")
    parser.set_defaults(func=cmd_sandbox)
