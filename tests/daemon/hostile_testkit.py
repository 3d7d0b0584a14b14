"""Raw-socket clients for the hostile-client tests: they say exactly the bytes a test wants, at the pace it wants.

(A plain module: conftest.py is not importable.)
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conformance.launch import Launched

HOSTILE_IPC = {"header_read_s": 1.0, "body_read_s": 1.5}


def hostile_config(**ipc: float | int) -> str:
    """A daemon config with fast retries and short read deadlines; ``ipc`` overrides [ipc] keys."""
    from reference.daemon.config import KEYS

    # Only keys this daemon knows: the same cases then run (and fail for their real reason) against a daemon that
    # predates the read deadlines.
    values = {key: value for key, value in {**HOSTILE_IPC, **ipc}.items() if key in KEYS["ipc"]}
    return ("[outbox]\nretry_base_ms = 100\nretry_max_ms = 400\nack_timeout_s = 2.0\n[daemon]\ndrain_timeout_s = 2.0\n"
            "[ipc]\n" + "".join(f"{key} = {value!r}\n" for key, value in values.items()))


HOSTILE_CONFIG = hostile_config()


def connect(daemon: Launched, transport: str = "tcp", timeout: float = 10.0) -> socket.socket:
    if transport == "tcp":
        sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=timeout)
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(str(daemon.socket_path))
    return sock


def head(method: str, path: str, daemon: Launched | None = None, transport: str = "unix",
         **headers: str | int) -> bytes:
    """A request head; over TCP with the daemon's bearer token (pass ``Authorization=""`` to go without)."""
    fields = {"Host": "localhost", **{k.replace("_", "-"): str(v) for k, v in headers.items()}}
    if transport == "tcp" and daemon is not None and "Authorization" not in fields:
        fields["Authorization"] = f"Bearer {daemon.token_file.read_text().strip()}"
    fields = {k: v for k, v in fields.items() if v != ""}
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in fields.items()), "", ""]
    return "\r\n".join(lines).encode("latin-1")


def read_answer(sock: socket.socket, timeout: float) -> tuple[int, dict[str, str], bytes, float]:
    """(status, headers, body, seconds) of one answer; the body as long as Content-Length says."""
    started = time.monotonic()
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65_536)
        if not chunk:
            raise ConnectionError(f"closed before an answer: {data[:200]!r}")
        data += chunk
    raw_head, body = data.split(b"\r\n\r\n", 1)
    status_line, *lines = raw_head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65_536)
        if not chunk:
            break
        body += chunk
    return int(status_line.split()[1]), headers, body[:length], time.monotonic() - started


def problem(status_headers_body: tuple[int, dict[str, str], bytes, float]) -> dict[str, Any]:
    """The answer's problem+json body, checked to be one."""
    _, headers, body, _ = status_headers_body
    assert headers["content-type"].startswith("application/problem+json"), headers
    return json.loads(body)


def closed_by_peer(sock: socket.socket, timeout: float = 5.0) -> bool:
    """Whether the daemon closes the connection (EOF) within ``timeout``, reading and dropping what comes first."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65_536):
            pass
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


@contextlib.contextmanager
def held(daemon: Launched, count: int, payload: bytes = b"G", transport: str = "tcp") -> Iterator[list[socket.socket]]:
    """``count`` connections that each send ``payload`` and then nothing; closed on exit."""
    socks = []
    try:
        for _ in range(count):
            sock = connect(daemon, transport)
            if payload:
                sock.sendall(payload)
            socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()


def health_latencies(socket_path: Path, count: int) -> list[float]:
    """Seconds per GET /v1/health over the unix socket, each on its own connection (as a CLI would)."""
    latencies = []
    request = b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    for _ in range(count):
        started = time.perf_counter()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(str(socket_path))
        sock.sendall(request)
        status, _, _, _ = read_answer(sock, 10)
        sock.close()
        assert status == 200, status
        latencies.append(time.perf_counter() - started)
    return latencies


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]
