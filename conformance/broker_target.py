"""The broker under test: an already running one (``--url ws://…``) or one the harness launches and can restart.

The reference target launches `meshd broker serve --dev` on a SQLite store in a temporary directory, tracing into
``{trace_dir}``. A launch template for another broker uses ``{port}`` (a free 127.0.0.1 port to listen on) and
``{state_dir}``, and may use ``{trace_dir}``: a directory the harness owns, kept across restarts, where the broker may
write its trace (spec/schemas/trace), checked after the run as the daemon suite checks a daemon's (traces.py); so may
``--store-dsn`` (``sqlite:///{state_dir}/broker.db``), for a launched broker whose store lives in its state directory.
The harness plays members of a broker in development mode (any ed25519 key is admitted, topics may be created on first
use).

The delivery lease. The spec names no lease length and no way to advertise one, so the cases ask ``lease_for``: the
lease given on the command line (``--lease-s``), else one the broker advertises (a ``lease_ms`` or ``lease_s``
parameter of any bit it offers in its feature_negotiation_response: feature params are open, E-28), else the one the
harness's own reference template sets, else ``DEFAULT_LEASE_S`` — the reference broker's and upstream claudemesh's
default. A redelivery is awaited for twice the lease plus a margin (``redelivery_wait_s``), never for a guess.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .launch import free_port

#: the lease the reference template sets, so the suite's delivery cases take seconds
REFERENCE_LEASE_S = 1.0
REFERENCE_BROKER = (
    f"{shlex.quote(sys.executable)} -m reference.cli broker serve --store sqlite:///{{state_dir}}/broker.db "
    f"--listen 127.0.0.1:{{port}} --dev --lease-s {REFERENCE_LEASE_S} --inline-bytes 65536"
)
#: what ``meshconform broker`` launches by default: the reference broker, writing its trace for the harness
REFERENCE_TRACED_BROKER = f"{REFERENCE_BROKER} --trace-dir {{trace_dir}}"
#: the lease of a broker that names none: `meshd broker serve`'s default, and upstream claudemesh's ("a 30 s lease")
DEFAULT_LEASE_S = 30.0
#: parameter names a broker may carry its lease in (not in the spec: an open-params convention the harness reads)
ADVERTISED_LEASE_PARAMS = {"lease_ms": 0.001, "lease_s": 1.0}


class BrokerTargetError(RuntimeError):
    """The broker could not be started or reached (a harness error)."""


@dataclass
class BrokerTarget:
    url: str | None = None
    template: str | None = None
    mesh_id: str = "meshconform"
    store_dsn: str | None = None
    lease_s: float | None = None
    trace_dir: Path | None = None
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="meshconform-broker-")))
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def can_restart(self) -> bool:
        return self.template is not None

    def lease_for(self, negotiation: dict[str, Any] | None) -> tuple[float, str]:
        """The delivery lease in seconds, and where it came from (see the module docstring)."""
        if self.lease_s is not None:
            return self.lease_s, f"--lease-s {self.lease_s:g}"
        supported = (negotiation or {}).get("supported")
        for bit, entry in (supported.items() if isinstance(supported, dict) else ()):
            params = entry.get("params") if isinstance(entry, dict) else None
            for name, scale in ADVERTISED_LEASE_PARAMS.items():
                value = params.get(name) if isinstance(params, dict) else None
                if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                    return value * scale, f"advertised by the broker ({bit}.params.{name} = {value})"
        if self.template is not None and self.template.startswith(REFERENCE_BROKER):
            return REFERENCE_LEASE_S, "the harness's reference launch template"
        return DEFAULT_LEASE_S, (f"the default {DEFAULT_LEASE_S:g} s (the broker names no lease; give --lease-s if "
                                 "it uses another)")

    @staticmethod
    def redelivery_wait_s(lease_s: float) -> float:
        """How long a redelivery may take: the first push's lease runs out, and a second one for a broker that looks
        at lapsed leases only now and then, plus a margin for a loaded machine."""
        return 2 * lease_s + max(3.0, 0.1 * lease_s)

    def start(self) -> BrokerTarget:
        if self.store_dsn is not None and "{state_dir}" in self.store_dsn:
            self.store_dsn = self.store_dsn.replace("{state_dir}", str(self.workdir / "broker"))
        if self.template is not None:
            (self.workdir / "broker").mkdir(parents=True, exist_ok=True)
            if self.template.startswith(REFERENCE_BROKER) and self.store_dsn is None:
                self.store_dsn = f"sqlite:///{self.workdir / 'broker' / 'broker.db'}"
            self.url = f"ws://127.0.0.1:{self.port}"
            self._spawn()
        if not self.url:
            raise BrokerTargetError("give --url ws://HOST:PORT or a launch template")
        host, _, port = self.url.removeprefix("ws://").partition(":")
        self._wait_listening(host, int(port.split("/")[0] or 80))
        return self

    def _spawn(self) -> None:
        trace_dir = self.trace_dir or self.workdir / "trace"
        trace_dir.mkdir(parents=True, exist_ok=True)
        command = shlex.split(self.template.format(state_dir=self.workdir / "broker", port=self.port,
                                                   trace_dir=trace_dir))
        log = (self.workdir / "broker.log").open("ab")
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                        start_new_session=True)
        log.close()

    def _wait_listening(self, host: str, port: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise BrokerTargetError(f"the broker exited with {self.process.returncode}:\n{self.tail()}")
            try:
                with socket.create_connection((host, port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise BrokerTargetError(f"nothing listens on {host}:{port} after {timeout:g} s:\n{self.tail()}")

    def tail(self) -> str:
        try:
            return "\n".join((self.workdir / "broker.log").read_text(errors="replace").splitlines()[-30:])
        except OSError:
            return ""

    def kill9(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def restart(self) -> None:
        self.kill9()
        self._spawn()
        self._wait_listening("127.0.0.1", self.port)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                self.kill9()
        shutil.rmtree(self.workdir, ignore_errors=True)


class ReferenceBrokerProcess:
    """The reference broker (SQLite, ``--dev``) as a process on a fixed port, so daemons reconnect to the same URL
    after ``stop()`` and ``start()`` (graceful, SIGTERM; the store and, with ``trace``, the trace files carry over).
    For recordings and end-to-end tests that need a broker that goes away and comes back, traced."""

    def __init__(self, root: Path, trace: Path | None = None, lease_s: float = 1.0):
        self.root, self.trace, self.lease_s, self.port = root, trace, lease_s, free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.root / "broker.log"

    def start(self, timeout: float = 30.0) -> ReferenceBrokerProcess:
        port_file = self.root / "broker.port"
        port_file.unlink(missing_ok=True)
        traced = ["--trace-dir", str(self.trace), "--trace-strict"] if self.trace is not None else []
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "reference.cli", "broker", "serve", "--store",
                 f"sqlite:///{self.root / 'broker.db'}", "--listen", f"127.0.0.1:{self.port}", "--port-file",
                 str(port_file), "--dev", "--lease-s", str(self.lease_s), *traced],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise BrokerTargetError(f"the reference broker did not start:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=30)
