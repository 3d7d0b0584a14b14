"""The launch contract: how the harness starts, kills and restarts an implementation under test.

An implementation is described by a command template whose placeholders the harness fills in:

* ``{broker_url}`` — the scripted broker peer's WebSocket URL the implementation must connect to;
* ``{state_dir}`` — an empty directory the implementation keeps its state in (and must keep across restarts);
* ``{socket}`` — the unix socket path the implementation must listen on (``{state_dir}/daemon.sock``);
* ``{port}`` — a free TCP port on 127.0.0.1 for the bearer-token listener (0 is never passed);
* ``{token_file}`` — where the implementation writes its bearer token (``{state_dir}/local_token``).

The harness runs the command in its own process group, waits until ``GET /v1/health`` answers on the socket, and
for crash tests sends SIGKILL to the whole group and runs the same command again. Without a launch command the
restart-dependent requirements are skipped with that reason, never passed.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REFERENCE_TEMPLATE = (
    f"{shlex.quote(sys.executable)} -m reference.cli up --state-dir {{state_dir}} --broker-url {{broker_url}} "
    "--port {port}"
)


class LaunchError(RuntimeError):
    """The implementation did not come up; the message carries the tail of its output."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Launched:
    """One implementation process started from a template; ``restart`` reuses the state directory and port."""

    template: str
    state_dir: Path
    broker_url: str
    port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout: float = 30.0
    process: subprocess.Popen | None = None
    starts: int = 0

    @property
    def socket_path(self) -> Path:
        return self.state_dir / "daemon.sock"

    @property
    def token_file(self) -> Path:
        return self.state_dir / "local_token"

    @property
    def log_path(self) -> Path:
        return self.state_dir.parent / f"{self.state_dir.name}.log"

    def command(self) -> list[str]:
        text = self.template.format(broker_url=self.broker_url, state_dir=self.state_dir, socket=self.socket_path,
                                    port=self.port, token_file=self.token_file)
        return shlex.split(text)

    def start(self, wait: bool = True) -> Launched:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        env = {**os.environ, **self.env}
        self.process = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                        start_new_session=True)
        log.close()
        self.starts += 1
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise LaunchError(f"exited with {self.process.returncode} before answering:\n{self.tail()}")
            if self.socket_path.exists():
                try:
                    with self.unix() as client:
                        if client.get("/v1/health").status_code < 500:
                            return
                except httpx.HTTPError:
                    pass
            time.sleep(0.05)
        raise LaunchError(f"no answer on {self.socket_path} within {self.ready_timeout:g} s:\n{self.tail()}")

    def wait_connected(self, timeout: float = 15.0) -> None:
        """Wait until the implementation reports its broker link up (GET /v1/health ``connected``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with self.unix() as client:
                    if client.get("/v1/health").json().get("connected"):
                        return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.05)
        raise LaunchError(f"the broker link did not come up within {timeout:g} s:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no output)"

    def unix(self, timeout: float = 10.0) -> httpx.Client:
        transport = httpx.HTTPTransport(uds=str(self.socket_path), verify=False)  # plain HTTP: no TLS context
        return httpx.Client(transport=transport, base_url="http://localhost", timeout=timeout)

    def tcp(self, token: str | None = None, timeout: float = 10.0) -> httpx.Client:
        headers = {}
        if token is None and self.token_file.exists():
            token = self.token_file.read_text().strip()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return httpx.Client(base_url=f"http://127.0.0.1:{self.port}", headers=headers, timeout=timeout, verify=False)

    def kill9(self) -> None:
        """SIGKILL the whole process group (a crash: nothing runs on the way down)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        _wait_group_gone(self.process.pid)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (a graceful stop); returns the exit code, SIGKILLing after ``timeout``."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return self.process.wait()
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
            return None
        finally:
            _wait_group_gone(self.process.pid)

    def restart(self) -> Launched:
        self.kill9()
        return self.start()

    def wait_exit(self, timeout: float = 20.0) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)


def _live_members(pgid: int) -> bool:
    """True while a process of group ``pgid`` is alive. Zombies do not count: a killed master's orphaned worker
    may linger as a zombie until init reaps it, and it holds no locks, sockets or files."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _wait_group_gone(pgid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _live_members(pgid):
        time.sleep(0.02)
