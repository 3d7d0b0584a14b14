"""Small helpers the cases share: polling the target's outbox, unique ids, reading SSE events."""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import threading
import time
from typing import Any

import httpx

_counter = itertools.count()
TERMINAL = frozenset({"done", "dead", "aborted"})


def unique(prefix: str) -> str:
    """A client_message_id no other case uses in this run."""
    return f"mc-{prefix}-{int(time.time() * 1000) % 10**9}-{next(_counter)}"


def outbox_rows(client: Any) -> list[dict[str, Any]]:
    """Every outbox row, through GET /v1/outbox (all pages)."""
    rows: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 500}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/v1/outbox", params=params).json()
        rows += page["items"]
        cursor = page["next_cursor"]
        if not cursor:
            return rows


def row_for(client: Any, cmid: str) -> dict[str, Any] | None:
    return next((r for r in outbox_rows(client) if r["client_message_id"] == cmid), None)


def wait_row(client: Any, cmid: str, status: str | tuple[str, ...], timeout: float = 15.0,
             attempted: bool = False) -> dict[str, Any]:
    """Wait until ``cmid``'s row is in ``status`` (with ``attempted``: after a broker answer recorded last_error)."""
    wanted = (status,) if isinstance(status, str) else status
    deadline = time.monotonic() + timeout
    row = None
    while time.monotonic() < deadline:
        row = row_for(client, cmid)
        if row and row["status"] in wanted and (not attempted or row["last_error"]):
            return row
        if row and row["status"] in TERMINAL and row["status"] not in wanted:
            raise AssertionError(f"{cmid} settled in {row['status']}, expected {wanted}: {row}")
        time.sleep(0.05)
    raise AssertionError(f"{cmid} did not reach {wanted} within {timeout:g} s; last seen: {row}")


def read_events(client: httpx.Client, headers: dict[str, str], until, timeout: float = 10.0) -> list[dict]:
    """Read SSE events (dicts with id, event, data) until ``until(events)`` is true."""
    events: list[dict] = []
    current: dict[str, str] = {}
    with client.stream("GET", "/v1/events", headers=headers, timeout=timeout) as response:
        assert response.status_code == 200, response.status_code
        for line in response.iter_lines():
            if line.startswith(":"):
                continue
            if not line:
                if "event" in current:
                    current["json"] = json.loads(current.get("data", "null"))
                    events.append(current)
                    if until(events):
                        return events
                current = {}
                continue
            key, _, value = line.partition(":")
            current[key] = value[1:] if value.startswith(" ") else value
    return events


def http_request(method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    """One HTTP/1.1 request as bytes (Content-Length framed when it has a body)."""
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items())]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def pipelined(sock: socket.socket, requests: list[bytes]) -> list[tuple[int, dict[str, str], bytes]]:
    """Write ``requests`` back to back on one connection (from a thread, so a server that answers before it reads
    cannot deadlock us) and read until the server closes; returns every complete response, in order."""
    def write() -> None:
        with contextlib.suppress(OSError):
            sock.sendall(b"".join(requests))

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    received = bytearray()
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            received += chunk
    writer.join(timeout=5)
    sock.close()
    return parse_responses(bytes(received))


def parse_responses(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Split a byte stream into complete HTTP/1.1 responses (Content-Length or chunked); a torn tail is dropped."""
    responses = []
    while (end := data.find(b"\r\n\r\n")) >= 0:
        head = data[:end].decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:])}
        rest = data[end + 4:]
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = bytearray()
            while (eol := rest.find(b"\r\n")) >= 0:
                size = int(rest[:eol].split(b";")[0], 16)
                if len(rest) < eol + 2 + size + 2:
                    return responses
                body += rest[eol + 2:eol + 2 + size]
                rest = rest[eol + 2 + size + 2:]
                if size == 0:
                    break
            else:
                return responses
        else:
            length = int(headers.get("content-length", "0"))
            if len(rest) < length:
                return responses
            body, rest = rest[:length], rest[length:]
        responses.append((status, headers, bytes(body)))
        data = rest
    return responses
