"""The implementation under test: how the harness reaches it, controls its broker, and restarts it.

Three shapes:

* ``reference`` — the harness launches the reference daemon itself, against its scripted broker peer;
* a launch template (``--launch "CMD {broker_url} {state_dir} ..."``) — the same for any implementation (see
  launch.py for the contract, conformance/adapters/ for adapters); restart-dependent cases run;
* an already running daemon (``unix:///path/daemon.sock`` or ``http://127.0.0.1:PORT`` with ``--token-file``) — the
  harness listens for it on ``--broker-listen`` (its scripted broker) but cannot restart it: restart-dependent
  cases are skipped with that reason, never passed.

Whether the implementation is *linked* to the scripted broker is decided from the peer's own evidence (a verified
hello answered with ``hello_ack``), never from a health member the spec does not define. A launched implementation
that never links is not a harness error: the cases that need the link fail, naming what the peer saw.

Traces. With a ``trace_root`` every instance ``launch`` starts gets its own ``{trace_dir}`` under it (``trace_dirs``:
``main``, or the case's name, ``-2`` … when a name comes again), kept across that instance's restarts; the plugin
checks them after the run (traces.py).

Hooks. Every instance ``launch`` starts gets a ``{hooks_dir}`` holding the hooks a case asks for (none: an empty
hooks.toml), and its config.toml a ``[hooks]`` table naming that folder; ``hook_skip_reason`` says, once per run,
whether the hook cases can run against this target (conformance/hooks.py).

Fixed ports. An implementation whose TCP port does not follow ``{port}`` (it says ``fixed_port`` in its target
description) cannot run two instances side by side, so ``launch`` stops the main instance while a fresh one runs and
``release_fresh`` restarts it afterwards (same state directory: a restart, not a new instance); a case's earlier
fresh instance is stopped before its next one starts, and each start waits until the port is free again.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from . import hooks as hooks_mod
from . import timing as timing_mod
from .launch import REFERENCE_TRACED_TEMPLATE, Launched, LaunchError, check_template
from .peer import PeerConfig, ScriptedBroker

HARNESS_CONFIG = """
[outbox]
retry_base_ms = 100
retry_max_ms = 500
ack_timeout_s = 3.0
[reconnect]
initial_ms = 100
max_ms = 800
[ipc]
keepalive_s = 2.0
header_read_s = 1.0
body_read_s = 1.0
[broker]
request_timeout_s = 2.0
[daemon]
drain_timeout_s = 2.0
"""


class TargetError(RuntimeError):
    """The target could not be reached or started: a harness error (exit 2)."""


@dataclass
class Target:
    """A resolved target plus the scripted broker it is connected to (when it is)."""

    spec: str
    template: str | None = None
    token_file: Path | None = None
    broker_listen: str = "127.0.0.1:0"
    dialect: str = "auto"
    timing_overrides: dict[str, float] = field(default_factory=dict)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="meshconform-")))
    trace_root: Path | None = None
    trace_dirs: dict[str, Path] = field(default_factory=dict)
    broker: ScriptedBroker | None = None
    launched: Launched | None = None
    instances: list[Launched] = field(default_factory=list)
    link_problem: str | None = None
    timing: timing_mod.Timing = field(default_factory=timing_mod.Timing)
    _hook_skip: tuple[str | None] | None = None
    _socket: Path | None = None
    _http: str | None = None
    _suspended: Launched | None = None

    @property
    def can_restart(self) -> bool:
        return self.template is not None

    def peer_config(self) -> PeerConfig:
        return PeerConfig(dialect=self.dialect)

    @property
    def is_reference(self) -> bool:
        """The harness launched the reference itself (no --launch template of the user's)."""
        return self.spec == "reference"

    @property
    def reads_config(self) -> bool:
        """The target reads the config.toml the harness writes (the reference does; others say so)."""
        return self.is_reference or bool(self.launched and self.launched.description.get("config_toml"))

    @property
    def clock_hook(self) -> bool:
        """The target honours the clock hook ({clock_file}) (the reference does; others say so)."""
        return self.is_reference or bool(self.launched and self.launched.description.get("clock_hook"))

    @property
    def installs_hooks(self) -> bool:
        """The harness can install hooks in the instances it launches: the template names ``{hooks_dir}``, the
        target reads the config.toml the harness writes (its ``[hooks]`` table names the folder), or its
        description says it takes hooks from ``{hooks_dir}`` (``"hooks": true``)."""
        if self.template is None:
            return False
        return ("{hooks_dir}" in self.template or self.reads_config
                or bool(self.launched and self.launched.description.get("hooks")))

    def hook_skip_reason(self) -> str | None:
        """Why the hook cases cannot run against this target (None: they run); asked of the main instance's
        ``GET /v1/version`` once per run (conformance/hooks.py)."""
        if self._hook_skip is None:
            try:
                with self.client(self.transports[0]) as client:
                    response = client.get("/v1/version")
                declared = hooks_mod.features(response.json()) if response.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                declared = None
            self._hook_skip = (hooks_mod.skip_reason(declared, self.can_restart, self.installs_hooks),)
        return self._hook_skip[0]

    def start(self) -> Target:
        if self.template is not None and self.spec == "reference":
            self.spec = "launch"  # a --launch template of the user's: not the reference, whatever --target says
        host, _, port = self.broker_listen.rpartition(":")
        self.broker = ScriptedBroker(self.peer_config(), host=host or "127.0.0.1", port=int(port or 0))
        self.broker.start()
        if self.spec == "reference":
            self.template = self.template or REFERENCE_TRACED_TEMPLATE
        if self.template is not None:
            try:
                check_template(self.template)
            except LaunchError as exc:
                raise TargetError(str(exc)) from exc
            self.launched = self.launch("main", wait=False)
            self._ready(self.launched)
            self.resolve_timing()
            self.await_link(self.launched)
            return self
        if self.spec.startswith("unix://"):
            self._socket = Path(self.spec.removeprefix("unix://"))
        elif self.spec.startswith("http://"):
            self._http = self.spec.rstrip("/")
        else:
            raise TargetError(f"unknown target {self.spec!r}: use reference, unix:///path, http://127.0.0.1:PORT")
        try:
            with self.client(self.transports[0]) as client:
                client.get("/v1/version")
        except httpx.HTTPError as exc:
            raise TargetError(f"cannot reach {self.spec}: {exc}") from exc
        self.resolve_timing()
        return self

    def resolve_timing(self) -> None:
        """Timing from --timing, else the target's description, else the config.toml the harness wrote when the
        target reads it (the reference does), else the meshspec defaults — the report names the source."""
        declared = self.launched.description.get("timing") if self.launched is not None else None
        timing = timing_mod.Timing()
        if self.reads_config:
            timing = timing.with_values(timing_mod.from_config_toml(HARNESS_CONFIG),
                                        "the config.toml the harness wrote (the target reads it)")
        if declared:
            timing = timing.with_values(declared, "the target's description ({target_file})")
        if self.timing_overrides:
            timing = timing.with_values(self.timing_overrides, "--timing on the command line")
        self.timing = timing

    @staticmethod
    def _ready(instance: Launched) -> None:
        try:
            instance.wait_ready()
        except LaunchError as exc:
            raise TargetError(f"the target did not start: {exc}") from exc

    def await_link(self, instance: Launched, timeout: float | None = None) -> bool:
        """Wait for the instance to link to the peer; a missing link is recorded (``link_problem``), not raised."""
        assert self.broker is not None
        wait = timeout if timeout is not None else max(15.0, self.timing.hello_timeout_s * 2 + 5)
        try:
            self.broker.wait_linked(timeout=wait)
            self.link_problem = None
            return True
        except TimeoutError:
            seen = list(self.broker.links.values())
            states = []
            for link in seen[-3:]:
                hello = "verified" if link.signature_ok else "refused" if link.hello else "none"
                schema = f", schema: {link.hello_errors[0]}" if link.hello_errors else ""
                states.append(f"#{link.connection}: hello {hello}{schema}")
            self.link_problem = (f"no linked connection within {wait:g} s (the peer saw {len(seen)} connection(s)"
                                 + (": " + "; ".join(states) if states else "") + ")")
            return False

    def launch(self, name: str, config: str = HARNESS_CONFIG, wait: bool = True,
               broker: ScriptedBroker | None = None,
               hooks: Iterable[hooks_mod.HookScript] = ()) -> Launched:
        """Start a fresh instance (its own state directory) from the launch template, with ``hooks`` installed in its
        ``{hooks_dir}`` (none: an empty hooks.toml) and the config.toml's ``[hooks]`` table naming that folder."""
        if self.template is None:
            raise TargetError("no launch template")
        fixed = self.launched is not None and self.launched.fixed_port
        if fixed and threading.current_thread() is not threading.main_thread():
            # the case's alarm stops only its own thread: a fresh instance launched from another one could
            # outlive the case, and stop the main instance its teardown restarted
            raise TargetError("a fixed-port target runs one instance at a time: launch it from the case's own thread")
        if fixed and name != "main" and self.launched.running:
            self.launched.stop()
            self._suspended = self.launched
        if fixed:
            for earlier in self.instances:  # one instance at a time: a case's earlier fresh instance gives way too
                if earlier is not self.launched and earlier.running:
                    earlier.stop(timeout=10)
            self._await_port_free(self.launched.tcp_port)
        state_dir = self.workdir / name
        if state_dir.exists():
            shutil.rmtree(state_dir)
        state_dir.mkdir(mode=0o700, parents=True)
        peer = broker or self.broker
        assert peer is not None
        instance = Launched(self.template, state_dir, peer.url, trace_dir=self._trace_dir(name))
        shutil.rmtree(instance.hooks_dir, ignore_errors=True)
        hooks_mod.install_hooks(instance.hooks_dir, hooks)
        (state_dir / "config.toml").write_text(hooks_mod.with_hooks(config, instance.hooks_dir))
        self.instances.append(instance)
        try:
            instance.start(wait=wait)
        except LaunchError as exc:
            raise TargetError(f"the target did not start: {exc}") from exc
        return instance

    def _trace_dir(self, name: str) -> Path | None:
        """A fresh ``{trace_dir}`` under ``trace_root`` for a new instance (``name``, ``name-2`` … when a case starts
        one name again: a new state directory is a new instance), or None without a trace root."""
        if self.trace_root is None:
            return None
        unique = next(n for n in (name, *(f"{name}-{k}" for k in range(2, 10_000))) if n not in self.trace_dirs)
        self.trace_dirs[unique] = self.trace_root / unique
        return self.trace_dirs[unique]

    def release_fresh(self) -> None:
        """Stop every instance but the main one; restart the main one if a fixed port made us stop it."""
        for instance in self.instances:
            if instance is not self.launched:
                instance.stop(timeout=10)
        self.instances = [i for i in self.instances if i is self.launched]
        if self._suspended is not None:
            suspended, self._suspended = self._suspended, None
            self._await_port_free(suspended.tcp_port)
            suspended.start(wait=False)
            self._ready(suspended)
            self.await_link(suspended, timeout=self.timing.reconnect_wait_s)

    @staticmethod
    def _await_port_free(port: int | None, timeout: float = 30.0) -> None:
        """A fixed-port target runs one instance at a time: before the next one starts, wait until the last one's
        port is free (a stopped instance, or a process it left behind, may hold it a while longer)."""
        if not port:
            return
        deadline = time.monotonic() + timeout
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.settimeout(1.0)
                if probe.connect_ex(("127.0.0.1", int(port))) != 0:
                    return
            if time.monotonic() > deadline:
                raise TargetError(f"127.0.0.1:{port} (the target's fixed port) is still taken {timeout:g} s after its "
                                  "last instance was stopped: a fresh instance cannot start")
            time.sleep(0.2)

    def client(self, transport: str = "unix", timeout: float = 10.0) -> httpx.Client:
        """A plain httpx client to the main instance (``unix`` or ``tcp``)."""
        if self.launched is not None:
            return self.launched.unix(timeout) if transport == "unix" else self.launched.tcp(timeout=timeout)
        if self._socket is not None and transport == "unix":
            return httpx.Client(transport=httpx.HTTPTransport(uds=str(self._socket), verify=False),
                                base_url="http://localhost", timeout=timeout)
        if self._http is not None:
            token = self.token_file.read_text().strip() if self.token_file else ""
            return httpx.Client(base_url=self._http, timeout=timeout, verify=False,
                                headers={"Authorization": f"Bearer {token}"} if token else {})
        raise TargetError(f"the target has no {transport} transport the harness can reach")

    def token(self) -> str | None:
        if self.launched is not None:
            return self.launched.token()
        if self.token_file is not None:
            return self.token_file.read_text().strip()
        return None

    def tcp_address(self) -> tuple[str, int] | None:
        if self.launched is not None:
            return None if self.launched.tcp_port is None else ("127.0.0.1", int(self.launched.tcp_port))
        if self._http is not None:
            url = httpx.URL(self._http)
            return url.host, url.port or 80
        return None

    def raw_connection(self, transport: str, timeout: float = 20.0) -> tuple[socket.socket, dict[str, str]]:
        """A plain socket to the main instance and the headers every request on it needs (Host, Authorization)."""
        if transport == "unix":
            path = self.launched.socket_path if self.launched is not None else self._socket
            if path is None:
                raise TargetError("the target has no unix transport the harness can reach")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(str(path))
            return sock, {"Host": "localhost"}
        address = self.tcp_address()
        if address is None:
            raise TargetError("the target has no tcp transport the harness can reach")
        host, port = address
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.settimeout(timeout)
        headers = {"Host": f"{host}:{port}"}
        token = self.token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return sock, headers

    @property
    def transports(self) -> list[str]:
        if self.launched is not None:
            return ["unix", "tcp"] if self.launched.tcp_port is not None else ["unix"]
        return ["unix"] if self._socket is not None else ["tcp"]

    def wait_broker_link(self, timeout: float = 15.0) -> bool:
        """True once the peer holds a linked connection (hello verified, hello_ack sent)."""
        if self.broker is None:
            return False
        try:
            self.broker.wait_linked(timeout)
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        for instance in self.instances:
            instance.stop(timeout=10)
        if self.broker is not None:
            self.broker.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
