"""The launch contract: how the harness starts, kills and restarts an implementation under test.

An implementation is described by a command template whose placeholders the harness fills in:

* ``{broker_url}`` — the scripted broker peer's WebSocket URL the implementation must connect to;
* ``{state_dir}`` — an empty directory the implementation keeps its state in (and must keep across restarts); the
  harness writes ``{state_dir}/config.toml`` (``{config}``) with short retry timings first;
* ``{socket}`` — the unix socket path it should listen on (``{state_dir}/daemon.sock``);
* ``{port}`` — a free TCP port on 127.0.0.1 for the bearer-token listener (0 is never passed);
* ``{token_file}`` — where it should write its bearer token (``{state_dir}/local_token``);
* ``{target_file}`` — where it MAY write a JSON description (spec/schemas/harness/target.json) of the socket, token
  file and port it actually uses, its timing, and whether it honours the clock hook — for implementations (or their
  adapters, see ``conformance/adapters/``) that cannot follow the paths above;
* ``{clock_file}`` — the clock hook: a file holding a decimal number of seconds to add to the wall clock (``0`` at
  start; the harness rewrites it to move time forward, e.g. to age a row past its max age in a bounded run).
* ``{trace_dir}`` — a directory the harness owns where the implementation MAY write its trace (JSONL events of
  spec/schemas/trace, one file per node): one per instance, kept across that instance's restarts (every incarnation
  appends, and ``seq`` goes on increasing); after the run the harness checks it with the trace oracle and reports
  TRC-* verdicts (traces.py). An implementation that writes nothing there gets them all "not judged".
* ``{hooks_dir}`` — a folder the harness owns and fills before every start with a §6 ``hooks.toml`` (in the format
  of spec/schemas/config/hooks.json; empty, so no hook runs, unless a hook case installs its hooks) and the hooks'
  executables. An implementation that runs hooks takes them from there: by naming ``{hooks_dir}`` in its template,
  by reading the ``[hooks]`` table the harness writes into ``{config}`` (``enabled = true``, ``dir`` = this
  folder; the reference does), or by saying ``"hooks": true`` in ``{target_file}`` (it reads
  ``MESHCONFORM_HOOKS_DIR``). Hook cases run only against a daemon that lists ``hooks`` in ``GET /v1/version``
  ``ipc_features``; every other daemon gets them skipped with that reason (conformance/hooks.py).

The same values are in the environment as ``MESHCONFORM_<NAME>`` (``MESHCONFORM_BROKER_URL`` …). The harness runs
the command in its own process group, waits until ``GET /v1/health`` answers on the socket, and for crash tests
sends SIGKILL to the whole group and runs the same command again. Without a launch command the restart-dependent
requirements are skipped with that reason, never passed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from spec import validator

from .hooks import HOOKS_FILE, install_hooks

REFERENCE_TEMPLATE = (
    f"{shlex.quote(sys.executable)} -m reference.cli up --state-dir {{state_dir}} --broker-url {{broker_url}} "
    "--port {port} --clock-file {clock_file} --target-file {target_file}"
)
#: what ``meshconform run --target reference`` launches: the reference always writes its trace for the harness
REFERENCE_TRACED_TEMPLATE = f"{REFERENCE_TEMPLATE} --trace-dir {{trace_dir}}"
PLACEHOLDERS = ("broker_url", "state_dir", "socket", "port", "token_file", "target_file", "clock_file", "config",
                "trace_dir", "hooks_dir")


class LaunchError(RuntimeError):
    """The implementation did not come up; the message carries the tail of its output."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_template(template: str) -> None:
    """Refuse a template naming an unknown placeholder (a typo would otherwise start a broken command)."""
    try:
        template.format(**{name: "" for name in PLACEHOLDERS})
    except (KeyError, IndexError, ValueError) as exc:
        raise LaunchError(f"launch template {template!r}: {exc!r}; placeholders: "
                          f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}") from exc


@dataclass
class Description:
    """What the launched implementation declared in ``{target_file}`` (empty when it wrote nothing)."""

    raw: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        return self.raw.get(name, default)


@dataclass
class Launched:
    """One implementation process started from a template; ``restart`` reuses the state, trace directory and port."""

    template: str
    state_dir: Path
    broker_url: str
    port: int = field(default_factory=free_port)
    trace_dir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout: float = 30.0
    process: subprocess.Popen | None = None
    starts: int = 0
    description: Description = field(default_factory=Description)

    # --- where it listens (its own description wins over the placeholders) ----------------------------------
    @property
    def target_file(self) -> Path:
        return self.state_dir.parent / f"{self.state_dir.name}.target.json"

    @property
    def clock_file(self) -> Path:
        return self.state_dir.parent / f"{self.state_dir.name}.clock"

    @property
    def trace_path(self) -> Path:
        """``{trace_dir}``: the directory the harness gave this instance, else one beside its state directory."""
        return self.trace_dir or self.state_dir.parent / f"{self.state_dir.name}.trace"

    @property
    def hooks_dir(self) -> Path:
        """``{hooks_dir}``: the folder of this instance's ``hooks.toml`` and hook executables, beside its state."""
        return self.state_dir.parent / f"{self.state_dir.name}.hooks"

    @property
    def socket_path(self) -> Path:
        return Path(self.description.get("socket") or self.state_dir / "daemon.sock")

    @property
    def token_file(self) -> Path:
        return Path(self.description.get("token_file") or self.state_dir / "local_token")

    @property
    def tcp_port(self) -> int | None:
        return self.description.get("port", self.port)

    @property
    def fixed_port(self) -> bool:
        return bool(self.description.get("fixed_port", False))

    @property
    def log_path(self) -> Path:
        return self.state_dir.parent / f"{self.state_dir.name}.log"

    def file(self, name: str) -> Path:
        """Where one of the files the spec names lives (``outbox_db``, ``inbox_db``, ``host_fingerprint`` …)."""
        files = self.description.get("files") or {}
        default = {"outbox_db": "outbox.db", "inbox_db": "inbox.db", "host_fingerprint": "host_fingerprint.json",
                   "local_token": "local_token", "state_dir": "."}[name]
        return Path(files.get(name) or self.state_dir / default)

    def values(self) -> dict[str, str]:
        return {"broker_url": self.broker_url, "state_dir": str(self.state_dir),
                "socket": str(self.state_dir / "daemon.sock"), "port": str(self.port),
                "token_file": str(self.state_dir / "local_token"), "target_file": str(self.target_file),
                "clock_file": str(self.clock_file), "config": str(self.state_dir / "config.toml"),
                "trace_dir": str(self.trace_path), "hooks_dir": str(self.hooks_dir)}

    def command(self) -> list[str]:
        return shlex.split(self.template.format(**self.values()))

    def set_clock(self, offset_s: float) -> None:
        """Move the implementation's wall clock (the clock hook) ``offset_s`` seconds ahead of real time."""
        temporary = self.clock_file.with_suffix(".tmp")
        temporary.write_text(f"{offset_s:.3f}\n", encoding="ascii")
        os.replace(temporary, self.clock_file)

    def start(self, wait: bool = True) -> Launched:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.trace_dir is not None or "{trace_dir}" in self.template:
            self.trace_path.mkdir(parents=True, exist_ok=True)
        if not self.clock_file.exists():
            self.set_clock(0)
        if not (self.hooks_dir / HOOKS_FILE).exists():  # no hooks installed: a valid, empty hooks.toml
            install_hooks(self.hooks_dir, ())
        log = self.log_path.open("ab")
        env = {**os.environ, **{f"MESHCONFORM_{k.upper()}": v for k, v in self.values().items()}, **self.env}
        self.process = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                        start_new_session=True)
        log.close()
        self.starts += 1
        if wait:
            self.wait_ready()
        return self

    def read_description(self, final: bool = False) -> None:
        """Load ``{target_file}`` when the implementation wrote one. While it starts the file may be half written;
        once it answers (``final``) a file that is not a target description is a launch error."""
        if not self.target_file.exists():
            return
        try:
            document = json.loads(self.target_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            if not final:
                return
            raise LaunchError(f"{self.target_file}: not JSON: {exc}") from exc
        errors = [e.message for e in validator("harness/target").iter_errors(document)]
        if errors:
            raise LaunchError(f"{self.target_file}: not a target description: {errors[0]}")
        self.description = Description(document)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise LaunchError(f"exited with {self.process.returncode} before answering:\n{self.tail()}")
            self.read_description()
            if self.socket_path.exists():
                try:
                    with self.unix(timeout=2.0) as client:
                        if client.get("/v1/health").status_code < 500:
                            self.read_description(final=True)
                            return
                except httpx.HTTPError:
                    pass
            time.sleep(0.05)
        raise LaunchError(f"no answer on {self.socket_path} within {self.ready_timeout:g} s:\n{self.tail()}")

    def wait_connected(self, timeout: float = 15.0) -> None:
        """Wait until ``GET /v1/health`` reports ``connected`` — a convenience for the reference daemon's own tests;
        the harness decides "linked" from its broker peer's evidence, never from a member the spec does not define."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with self.unix(timeout=2.0) as client:
                    if client.get("/v1/health").json().get("connected"):
                        return
            except (httpx.HTTPError, ValueError, AttributeError):
                pass
            time.sleep(0.05)
        raise LaunchError(f"not connected within {timeout:g} s:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no output)"

    def unix(self, timeout: float = 10.0) -> httpx.Client:
        transport = httpx.HTTPTransport(uds=str(self.socket_path), verify=False)  # plain HTTP: no TLS context
        return httpx.Client(transport=transport, base_url="http://localhost", timeout=timeout)

    def token(self) -> str | None:
        try:
            return self.token_file.read_text(encoding="utf-8").strip()
        except OSError:
            return None

    def tcp(self, token: str | None = None, timeout: float = 10.0) -> httpx.Client:
        headers = {}
        token = token if token is not None else self.token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return httpx.Client(base_url=f"http://127.0.0.1:{self.tcp_port}", headers=headers, timeout=timeout,
                            verify=False)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill9(self) -> None:
        """SIGKILL the whole process group (a crash: nothing runs on the way down)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
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
