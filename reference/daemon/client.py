"""A small IPC client for the CLI and the tests: the unix socket by default, TCP with the bearer token on request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from reference.state_dir import StateDir


def unix_client(state_dir: Path, timeout: float = 10.0) -> httpx.Client:
    """An httpx client bound to the daemon's unix socket."""
    transport = httpx.HTTPTransport(uds=str(StateDir(state_dir).socket), verify=False)  # plain HTTP
    return httpx.Client(transport=transport, base_url="http://localhost", timeout=timeout)


def tcp_client(state_dir: Path, timeout: float = 10.0) -> httpx.Client:
    """An httpx client for the TCP listener with the bearer token from local_token."""
    files = StateDir(state_dir)
    port = int(files.http_port.read_text(encoding="ascii").strip())
    token = files.local_token.read_text(encoding="ascii").strip()
    return httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=timeout, verify=False,
                        headers={"Authorization": f"Bearer {token}"})


def call(state_dir: Path, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One request over the unix socket."""
    with unix_client(state_dir) as client:
        return client.request(method, path, **kwargs)


def is_running(state_dir: Path) -> bool:
    """True when the daemon answers /v1/health on its socket."""
    if not StateDir(state_dir).socket.exists():
        return False
    try:
        return call(state_dir, "GET", "/v1/health").status_code == 200
    except httpx.HTTPError:
        return False
