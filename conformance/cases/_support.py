"""Helpers the cases share: requests any implementation understands, reading its outbox and inbox without trusting
their shape, waiting for rows and inbound messages, reading event streams with a deadline.

Rules of this file. Nothing here raises KeyError or TypeError on a surprising answer: a missing member is ``None``
and a malformed page is an AssertionError naming what came back, so it becomes a verdict. Every loop is bounded —
by pages (``MAX_PAGES``), by time, or both — so a daemon that streams endless pages or events cannot hang a case.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import threading
import time
from typing import Any

import httpx

from conformance.wire import json_object
from reference.core import exit_code
from spec import load_table, openapi_parameter

_counter = itertools.count()
#: the outbox states no event leaves (spec/tables/outbox.yaml, ``terminal``)
TERMINAL = frozenset(name for name, state in load_table("outbox")["states"].items() if state["terminal"])
MAX_PAGES = 50
# The destination every behaviour case sends to: a DM to a 64-hex member key. It is the one `to` every grammar in
# the claudemesh family maps to the same (dm, <that key>) — meshspec's E-18 and upstream's "anything else is a DM"
# — so a case about the outbox or the lookup table never depends on meshspec's own `to` grammar (DEST-GRAMMAR). It
# is a real ed25519 public key (the one of sha256("meshconform recipient") as a seed): a daemon that seals DMs to
# the recipient's key (upstream 1.37) can do so.
RECIPIENT = "a2361551b8e8628bae67a5ffdd005271b0849dd4e2720b21590d136f8d358738"
BODY = {"to": RECIPIENT, "message": "conformance"}
OTHER = {"to": RECIPIENT, "message": "conformance, but different"}


def unique(prefix: str) -> str:
    """A client_message_id no other case uses in this run (letters, digits and dashes only)."""
    clean = "".join(c if c.isalnum() else "-" for c in prefix)[:40]
    return f"mc-{clean}-{int(time.time() * 1000) % 10**9}-{next(_counter)}"


def expect_exit(verdict: Any, code: int | None, name: str, what: str) -> None:
    """LIFE-EXIT-CODES: after ``what`` the daemon exited ``code``, which E-15 names ``name``
    (spec/tables/exit_codes.yaml)."""
    wanted = exit_code(name)
    verdict.expect("LIFE-EXIT-CODES", code == wanted, f"{what} exited {code}, E-15 says {wanted} ({name})")


def post_send(api: Any, body: dict[str, Any], key: str | None = None, **kwargs: Any) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    return api.post("/v1/send", json=body, headers=headers, **kwargs)


def _items(response: httpx.Response, what: str) -> tuple[list[dict[str, Any]], str | None]:
    assert response.status_code == 200, f"{what} answered {response.status_code}: {response.text[:200]}"
    page = json_object(response)
    items = page.get("items")
    assert isinstance(items, list), f"{what} answered no items list: {response.text[:200]}"
    cursor = page.get("next_cursor")
    return [i for i in items if isinstance(i, dict)], cursor if isinstance(cursor, str) and cursor else None


def outbox_rows(client: Any, status: str | None = None) -> list[dict[str, Any]]:
    """The outbox through GET /v1/outbox: every page there is (following ``next_cursor`` where the daemon offers
    one, at most MAX_PAGES pages, never the same cursor twice)."""
    rows: list[dict[str, Any]] = []
    cursor, seen = None, set()
    for _ in range(MAX_PAGES):
        params: dict[str, Any] = {"limit": openapi_parameter("/v1/outbox", "get", "limit")["maximum"]}
        if status:
            params["status"] = status
        if cursor:
            params["cursor"] = cursor
        items, cursor = _items(client.get("/v1/outbox", params=params), "GET /v1/outbox")
        rows += items
        if not cursor or cursor in seen or not items:
            return rows
        seen.add(cursor)
    return rows


def row_for(client: Any, cmid: str, status: str | None = None) -> dict[str, Any] | None:
    return next((r for r in outbox_rows(client, status) if r.get("client_message_id") == cmid), None)


def wait_row(client: Any, cmid: str, status: str | tuple[str, ...], timeout: float = 15.0,
             attempted: bool = False) -> dict[str, Any]:
    """Wait until ``cmid``'s row is in ``status`` (with ``attempted``: after a broker answer recorded last_error)."""
    wanted = (status,) if isinstance(status, str) else status
    deadline = time.monotonic() + timeout
    row = None
    while time.monotonic() < deadline:
        row = row_for(client, cmid)
        if row and row.get("status") in wanted and (not attempted or row.get("last_error")):
            return row
        if row and row.get("status") in TERMINAL and row.get("status") not in wanted:
            raise AssertionError(f"{cmid} settled in {row.get('status')}, expected {'/'.join(wanted)}: {row}")
        time.sleep(0.05)
    raise AssertionError(f"{cmid} did not reach {'/'.join(wanted)} within {timeout:g} s; last seen: {row}")


def watch_row(client: Any, cmid: str, seconds: float) -> list[str]:
    """Every status the row showed while polling for ``seconds``."""
    statuses: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        row = row_for(client, cmid)
        status = row.get("status") if row else None
        if status and (not statuses or statuses[-1] != status):
            statuses.append(status)
        time.sleep(0.05)
    return statuses


def inbox_items(api: Any, max_pages: int = MAX_PAGES, **params: Any) -> tuple[list[dict[str, Any]], str | None]:
    """Every inbox item through GET /v1/inbox, oldest first as the daemon pages them, and the resume cursor."""
    items: list[dict[str, Any]] = []
    cursor, seen = None, set()
    for _ in range(max_pages):
        query = {**params, "limit": params.get("limit", openapi_parameter("/v1/inbox", "get", "limit")["default"])}
        if cursor:
            query["cursor"] = cursor
        page, next_cursor = _items(api.get("/v1/inbox", params=query), "GET /v1/inbox")
        items += page
        if not next_cursor or not page or next_cursor in seen:
            return items, next_cursor or cursor
        seen.add(next_cursor)
        cursor = next_cursor
    return items, cursor


def wait_inbound(api: Any, broker: Any, cmid: str, timeout: float = 15.0) -> str:
    """Wait until an inbound message ``cmid`` is acknowledged to the broker (``client_ack``) or, for a daemon that
    sends none, visible in its inbox; returns which of the two showed it ("client_ack" or "inbox")."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if broker.client_acks(cmid):
            return "client_ack"
        if any(i.get("client_message_id") == cmid for i in inbox_items(api, max_pages=5)[0]):
            return "inbox"
        time.sleep(0.1)
    raise AssertionError(f"inbound message {cmid} was neither acknowledged (client_ack) nor in the inbox after "
                         f"{timeout:g} s")


def payload(event: dict) -> dict:
    data = event.get("json")
    return data if isinstance(data, dict) else {}


def http_request(method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    """One HTTP/1.1 request as bytes (Content-Length framed when it has a body)."""
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items())]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def pipelined(sock: socket.socket, requests: list[bytes], timeout: float = 20.0) -> list[tuple[int, dict[str, str],
                                                                                             bytes]]:
    """Write ``requests`` back to back on one connection (from a thread, so a server that answers before it reads
    cannot deadlock us) and read until the server closes or ``timeout`` passes; returns every complete response."""
    def write() -> None:
        with contextlib.suppress(OSError):
            sock.sendall(b"".join(requests))

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    received = bytearray()
    deadline = time.monotonic() + timeout
    sock.settimeout(1.0)
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            if len(parse_responses(bytes(received))) >= len(requests):
                break
            continue
        except OSError:
            break
        if not chunk:
            break
        received += chunk
    writer.join(timeout=5)
    sock.close()
    return parse_responses(bytes(received))


def parse_responses(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Split a byte stream into complete HTTP/1.1 responses (Content-Length or chunked); a torn tail is dropped."""
    responses = []
    while (end := data.find(b"\r\n\r\n")) >= 0:
        head = data[:end].decode("latin-1").split("\r\n")
        try:
            status = int(head[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            return responses
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:])}
        rest = data[end + 4:]
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = bytearray()
            while (eol := rest.find(b"\r\n")) >= 0:
                try:
                    size = int(rest[:eol].split(b";")[0], 16)
                except ValueError:
                    return responses
                if len(rest) < eol + 2 + size + 2:
                    return responses
                body += rest[eol + 2:eol + 2 + size]
                rest = rest[eol + 2 + size + 2:]
                if size == 0:
                    break
            else:
                return responses
        else:
            try:
                length = int(headers.get("content-length", "0"))
            except ValueError:
                return responses
            if len(rest) < length:
                return responses
            body, rest = rest[:length], rest[length:]
        responses.append((status, headers, bytes(body)))
        data = rest
    return responses


class EventStream:
    """GET /v1/events read on a background thread over a raw connection: events collect in ``events``, comment
    lines (keepalives) in ``comments``.

    For daemons without replay a case opens the stream before it causes the events it waits for. ``close`` shuts the
    socket down, which ends a read that is still waiting at once. Everything is bounded by ``limit_s``.
    """

    def __init__(self, target: Any, headers: dict[str, str] | None = None, limit_s: float = 60.0,
                 transport: str | None = None):
        self.sock, base = target.raw_connection(transport or target.transports[0], timeout=limit_s)
        self.request = http_request("GET", "/v1/events", {**base, "Accept": "text/event-stream", **(headers or {})})
        self.events: list[dict] = []
        self.comments: list[tuple[float, str]] = []
        self.status: int | None = None
        self.error: str | None = None
        self._opened = threading.Event()
        self._cond = threading.Condition()
        self._deadline = time.monotonic() + limit_s
        self._thread = threading.Thread(target=self._run, daemon=True, name="sse-reader")
        self._thread.start()

    def _recv(self) -> bytes:
        if time.monotonic() > self._deadline:
            return b""
        return self.sock.recv(65536)

    def _run(self) -> None:
        try:
            self.sock.sendall(self.request)
            buffer = b""
            while b"\r\n\r\n" not in buffer:
                chunk = self._recv()
                if not chunk:
                    return
                buffer += chunk
            head, _, rest = buffer.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            self.status = int(lines[0].split(" ", 2)[1])
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
            self._opened.set()
            if self.status != 200:
                return
            chunked = "chunked" in headers.get("transfer-encoding", "").lower()
            self._body(rest, chunked)
        except (OSError, ValueError, IndexError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._opened.set()
            with self._cond:
                self._cond.notify_all()

    def _body(self, pending: bytes, chunked: bool) -> None:
        text = b""
        current: dict[str, str] = {}
        while True:
            if chunked:
                while b"\r\n" not in pending:
                    more = self._recv()
                    if not more:
                        return
                    pending += more
                size_line, _, pending = pending.partition(b"\r\n")
                size = int(size_line.split(b";")[0] or b"0", 16)
                if size == 0:
                    return
                while len(pending) < size + 2:
                    more = self._recv()
                    if not more:
                        return
                    pending += more
                data, pending = pending[:size], pending[size + 2:]
            else:
                data = pending or self._recv()
                pending = b""
                if not data:
                    return
            text += data
            while b"\n" in text:
                raw, _, text = text.partition(b"\n")
                current = self._line(raw.rstrip(b"\r").decode("utf-8", "replace"), current)

    def _line(self, line: str, current: dict[str, str]) -> dict[str, str]:
        if line.startswith(":"):
            self.comments.append((time.monotonic(), line))
            return current
        if not line:
            if "event" in current or "data" in current:
                try:
                    current["json"] = json.loads(current.get("data", "null"))
                except ValueError:
                    current["json"] = None
                current.setdefault("event", "message")
                with self._cond:
                    self.events.append(current)
                    self._cond.notify_all()
            return {}
        key, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        current[key] = current[key] + "\n" + value if key == "data" and key in current else value
        return current

    def opened(self, timeout: float = 10.0) -> int | None:
        """Wait for the response head; returns its status (None when it never came)."""
        self._opened.wait(timeout)
        return self.status

    def wait(self, predicate, timeout: float, what: str = "events") -> list[dict]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self.events):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():
                    raise AssertionError(f"no {what} on GET /v1/events within {timeout:g} s "
                                         f"({len(self.events)} event(s) seen{'; ' + self.error if self.error else ''})")
                self._cond.wait(min(remaining, 0.2))
            return list(self.events)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()
        self._thread.join(timeout=5)

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def release_rows(api: Any, broker: Any, *cmids: str) -> None:
    """Forget what was scripted for ``cmids`` and settle any of them still inflight with a 201, so a daemon whose
    drain waits on one ack at a time (upstream's does) is not left blocked behind a row a case kept silent."""
    from conformance.peer import CREATED
    from conformance.wire import send_seen

    broker.forget(*cmids)
    for cmid in cmids:
        row = row_for(api, cmid) or {}
        sends = broker.sends_of(cmid)
        if row.get("status") == "inflight" and sends:
            with contextlib.suppress(ConnectionError, OSError, TimeoutError, RuntimeError):
                broker.send_raw(broker.decide(send_seen(sends[-1].frame), CREATED))
