"""The implementation under test: how the harness reaches it, controls its broker, and restarts it.

Three shapes:

* ``reference`` — the harness launches the reference daemon itself, against its scripted broker peer;
* a launch template (``--launch "CMD {broker_url} {state_dir} ..."``) — the same for any implementation (see
  launch.py for the contract); restart-dependent cases run;
* an already running daemon (``unix:///path/daemon.sock`` or ``http://127.0.0.1:PORT`` with ``--token-file``) — the
  harness listens for it on ``--broker-listen`` (its scripted broker) but cannot restart it: restart-dependent
  cases are skipped with that reason, never passed.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from .launch import REFERENCE_TEMPLATE, Launched, LaunchError
from .peer import PeerConfig, ScriptedBroker

HARNESS_CONFIG = """
[outbox]
retry_base_ms = 100
retry_max_ms = 500
ack_timeout_s = 3.0
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
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="meshconform-")))
    broker: ScriptedBroker | None = None
    launched: Launched | None = None
    instances: list[Launched] = field(default_factory=list)
    _socket: Path | None = None
    _http: str | None = None

    @property
    def can_restart(self) -> bool:
        return self.template is not None

    def start(self) -> Target:
        host, _, port = self.broker_listen.rpartition(":")
        self.broker = ScriptedBroker(PeerConfig(), host=host or "127.0.0.1", port=int(port or 0))
        self.broker.start()
        if self.spec == "reference":
            self.template = self.template or REFERENCE_TEMPLATE
        if self.template is not None:
            self.launched = self.launch("main")
            return self
        if self.spec.startswith("unix://"):
            self._socket = Path(self.spec.removeprefix("unix://"))
        elif self.spec.startswith("http://"):
            self._http = self.spec.rstrip("/")
        else:
            raise TargetError(f"unknown target {self.spec!r}: use reference, unix:///path, http://127.0.0.1:PORT")
        try:
            with self.client() as client:
                client.get("/v1/version")
        except httpx.HTTPError as exc:
            raise TargetError(f"cannot reach {self.spec}: {exc}") from exc
        return self

    def launch(self, name: str, config: str = HARNESS_CONFIG, wait: bool = True,
               broker: ScriptedBroker | None = None) -> Launched:
        """Start a fresh instance (its own state directory) from the launch template."""
        if self.template is None:
            raise TargetError("no launch template")
        state_dir = self.workdir / name
        if state_dir.exists():
            shutil.rmtree(state_dir)
        state_dir.mkdir(mode=0o700, parents=True)
        (state_dir / "config.toml").write_text(config)
        peer = broker or self.broker
        instance = Launched(self.template, state_dir, peer.url)
        self.instances.append(instance)
        try:
            instance.start(wait=wait)
            if wait:
                instance.wait_connected()
        except LaunchError as exc:
            raise TargetError(f"the target did not start: {exc}") from exc
        return instance

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
        if self.launched is not None:
            host, port, token_file = "127.0.0.1", self.launched.port, self.launched.token_file
        elif self._http is not None:
            url = httpx.URL(self._http)
            host, port, token_file = url.host, url.port or 80, self.token_file
        else:
            raise TargetError("the target has no tcp transport the harness can reach")
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        headers = {"Host": f"{host}:{port}"}
        if token_file is not None and Path(token_file).exists():
            headers["Authorization"] = f"Bearer {Path(token_file).read_text().strip()}"
        return sock, headers

    @property
    def transports(self) -> list[str]:
        if self.launched is not None:
            return ["unix", "tcp"]
        return ["unix"] if self._socket is not None else ["tcp"]

    def wait_broker_link(self, timeout: float = 15.0) -> bool:
        """True once the target reports its link to the harness broker up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with self.client(self.transports[0]) as client:
                    if client.get("/v1/health").json().get("connected") and self.broker and self.broker.hellos:
                        return True
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.1)
        return False

    def close(self) -> None:
        for instance in self.instances:
            instance.stop(timeout=10)
        if self.broker is not None:
            self.broker.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
