"""The scripted daemon of `meshconform sdk`: a /v1 daemon that misbehaves on purpose, for checking a client SDK.

It listens where a real daemon would (``<state dir>/daemon.sock``, and TCP on 127.0.0.1 with its port in
``http.port`` and a bearer token in ``local_token``) and answers from a script each case sets: a send answered 429
or 503 with Retry-After, a connection reset after the send was committed, 409 with any conflict of the §4.5.1
lookup table, an event stream cut in the middle of an event and replayed from ``Last-Event-ID`` with an overlap,
inbox pages that end, a token rotated under the client, a socket that serves another mesh or another ``ipc_api``.
It records every request, so a case judges what the SDK did, not what it says it did.

Rules of this file. It holds no protocol logic beyond what a case needs to see: a committed send is a row keyed by
``client_message_id`` holding its body, a retry of the same body is answered as the real daemon would (202, or 200
once delivered), another body 409. Everything binds to 127.0.0.1 or a unix socket, and every thread stops with
``close()``.
"""

from __future__ import annotations

import http.server
import json
import os
import secrets
import socket
import socketserver
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

IPC_API = "v1"
DAEMON_VERSION = "0.9.0"


@dataclass
class Request:
    """One request the SDK made."""

    at: float  # time.monotonic()
    transport: str  # unix | tcp
    method: str
    path: str
    headers: dict[str, str]
    body: Any = None


@dataclass
class EventPlan:
    """What each successive ``GET /v1/events`` connection gets: after the replay of the retained events with an id
    greater than ``Last-Event-ID - overlap`` (none without the header: the stream starts with the next new event),
    connection ``k`` publishes ``batches[k]`` (appended to the retained log as it goes), then, when ``cut[k]``,
    writes half of one more event (which is retained too) and drops the connection; the last connection stays open
    until the client goes."""

    batches: list[list[dict[str, Any]]] = field(default_factory=list)
    cut: list[bool] = field(default_factory=list)
    overlap: int = 0
    #: events retained from before the run, oldest first; a ``Last-Event-ID`` older than the first of them gets a
    #: ``replay_gap`` (no id) first, as the daemon sends one when the events asked for were pruned
    retained: list[dict[str, Any]] = field(default_factory=list)


class ScriptedDaemon:
    """A daemon for SDK cases; ``with ScriptedDaemon(state_dir) as daemon:`` starts and stops it."""

    def __init__(self, state_dir: Path, mesh: str = "meshconform", *, unix: bool = True, tcp: bool = True,
                 unix_mesh: str | None = None, unix_ipc_api: str = IPC_API, rotate_token_after: int | None = None):
        self.state_dir = Path(state_dir)
        self.mesh, self.unix_mesh, self.unix_ipc_api = mesh, unix_mesh or mesh, unix_ipc_api
        self.want_unix, self.want_tcp = unix, tcp
        self.token = secrets.token_urlsafe(32)
        self.rotate_token_after = rotate_token_after
        self.rotated = False
        self.requests: list[Request] = []
        self.send_script: list[tuple] = []  # ("answer", status, headers, members) | ("reset",) | ("commit",)
        self.rows: dict[str, dict[str, Any]] = {}  # committed sends by client_message_id
        self.inbox: list[dict[str, Any]] = []
        #: how many items each successive inbox page holds at most (then ``limit``): a short page is not the end
        self.inbox_pages: list[int] = []
        self.inbox_served: list[int] = []  # how many items each answered page held
        self.unauthorized = 0  # 401s answered
        self.authorized_after_rotation = 0  # requests with the new token after a rotation
        self.events = EventPlan()
        self.retained: list[dict[str, Any]] = []
        self._stream_count = 0
        self._lock = threading.Lock()
        self._servers: list[socketserver.BaseServer] = []
        self._closing = threading.Event()

    # --- lifecycle ----------------------------------------------------------------------------------------------
    def __enter__(self) -> ScriptedDaemon:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.want_unix:
            path = self.state_dir / "daemon.sock"
            path.unlink(missing_ok=True)
            self._serve(_UnixServer(str(path), _Handler, self, "unix"))
        if self.want_tcp:
            server = _TcpServer(("127.0.0.1", 0), _Handler, self, "tcp")
            self._serve(server)
            (self.state_dir / "http.port").write_text(f"{server.server_address[1]}\n", encoding="ascii")
            self._write_token()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closing.set()
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def _serve(self, server: socketserver.BaseServer) -> None:
        self._servers.append(server)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def _write_token(self) -> None:
        path = self.state_dir / "local_token"
        path.write_text(self.token + "\n", encoding="ascii")
        os.chmod(path, 0o600)

    @property
    def port(self) -> int | None:
        tcp = [s for s in self._servers if isinstance(s, _TcpServer)]
        return tcp[0].server_address[1] if tcp else None

    # --- what the SDK did ---------------------------------------------------------------------------------------
    def sends(self) -> list[Request]:
        return [r for r in self.requests if (r.method, r.path.split("?")[0]) == ("POST", "/v1/send")]

    def record(self, request: Request) -> int:
        with self._lock:
            self.requests.append(request)
            return len(self.requests)

    def authorized(self, transport: str, header: str | None, served: int) -> bool:
        """Over TCP the bearer token must be the current one; after ``rotate_token_after`` answered requests the
        token is replaced (the file rewritten) and the old one refused."""
        if transport == "unix":
            return True
        with self._lock:
            if self.rotate_token_after is not None and served > self.rotate_token_after:
                self.rotate_token_after = None
                self.rotated = True
                self.token = secrets.token_urlsafe(32)
                self._write_token()
            ok = header == f"Bearer {self.token}"
            if not ok:
                self.unauthorized += 1
            elif self.rotated:
                self.authorized_after_rotation += 1
            return ok

    def next_send_action(self) -> tuple:
        with self._lock:
            return self.send_script.pop(0) if self.send_script else ("commit",)

    def stream_plan(self) -> tuple[int, list[dict[str, Any]], bool]:
        with self._lock:
            k = self._stream_count
            self._stream_count += 1
        batch = self.events.batches[k] if k < len(self.events.batches) else []
        cut = self.events.cut[k] if k < len(self.events.cut) else False
        return k, batch, cut


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, address: str, handler: type, daemon: ScriptedDaemon, transport: str):
        self.scripted, self.transport = daemon, transport
        super().__init__(address, handler)


class _TcpServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type, daemon: ScriptedDaemon, transport: str):
        self.scripted, self.transport = daemon, transport
        super().__init__(address, handler)


def _problem(status: int, error: str, **members: Any) -> dict[str, Any]:
    return {"type": f"urn:meshspec:error:{error}", "title": error.replace("_", " "), "status": status,
            "detail": f"scripted: {error}", "error": error, **members}


def _without_key(body: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in body.items() if k != "client_message_id"}, sort_keys=True)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _UnixServer | _TcpServer

    def log_message(self, *args: Any) -> None:
        pass

    def address_string(self) -> str:  # a unix socket has no host to name
        return self.server.transport

    # --- dispatch -----------------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        daemon = self.server.scripted
        body = None
        if method == "POST":
            raw = self._body()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
        served = daemon.record(Request(time.monotonic(), self.server.transport, method, self.path,
                                       {k.lower(): v for k, v in self.headers.items()}, body))
        if not daemon.authorized(self.server.transport, self.headers.get("Authorization"), served):
            self._json(401, _problem(401, "invalid_bearer_token"), {"WWW-Authenticate": 'Bearer realm="meshd"'})
            return
        route = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(route.query))
        handler = {("GET", "/v1/version"): self._version, ("GET", "/v1/health"): self._health,
                   ("POST", "/v1/send"): self._send, ("GET", "/v1/inbox"): self._inbox,
                   ("GET", "/v1/events"): self._events}.get((method, route.path))
        if handler is None:
            self._json(404, _problem(404, "not_found"))
            return
        handler(query, body)

    def _body(self) -> bytes:
        """The request body, by Content-Length or chunked (RFC 9112 §7.1; E-34: every recipient takes both)."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _json(self, status: int, document: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if status < 400 else "application/problem+json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    # --- routes ---------------------------------------------------------------------------------------------------
    def _version(self, query: dict[str, str], body: Any) -> None:
        daemon = self.server.scripted
        api = daemon.unix_ipc_api if self.server.transport == "unix" else IPC_API
        self._json(200, {"daemon_version": DAEMON_VERSION, "ipc_api": api, "ipc_features": ["version", "send"],
                         "schema_version": 5, "broker_features_negotiated": [], "broker_feature_params": {}})

    def _health(self, query: dict[str, str], body: Any) -> None:
        daemon = self.server.scripted
        mesh = daemon.unix_mesh if self.server.transport == "unix" else daemon.mesh
        self._json(200, {"ok": True, "connected": True, "lag_ms": None, "queue_depth": 0, "inflight": 0,
                         "mesh": mesh, "member_pubkey": "ab" * 32, "uptime_s": 1.0, "schema_version": 5,
                         "daemon_version": DAEMON_VERSION, "broker_version": None, "pid": os.getpid()})

    def _send(self, query: dict[str, str], body: Any) -> None:
        daemon = self.server.scripted
        if not isinstance(body, dict) or not isinstance(body.get("to"), str):
            self._json(400, _problem(400, "invalid_request"))
            return
        key = body.get("client_message_id") or self.headers.get("Idempotency-Key") or secrets.token_hex(13)
        action = daemon.next_send_action()
        if action[0] == "answer":
            _, status, headers, members = action
            extra = {"client_message_id": key, **members} if status == 409 else members
            error = {409: "idempotency_key_reused", 429: "daemon_busy", 503: "daemon_draining", 400: "invalid_request",
                     404: "not_found", 413: "payload_too_large", 415: "unsupported_media_type"}[status]
            # a header given as a function is computed as the answer leaves (an HTTP-date relative to now)
            headers = {name: value() if callable(value) else value for name, value in headers.items()}
            self._json(status, _problem(status, error, **extra), headers)
            return
        with daemon._lock:
            row = daemon.rows.get(key)
            if row is None:
                daemon.rows[key] = body
            elif _without_key(row) != _without_key(body):
                conflict = "outbox_pending_fingerprint_mismatch"
                self._json(409, _problem(409, "idempotency_key_reused", conflict=conflict, client_message_id=key))
                return
        if action[0] == "reset":  # committed, and the answer lost with the connection
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._json(202, {"client_message_id": key, "status": "queued", "duplicate": False,
                         "request_fingerprint": "ab" * 32})

    def _inbox(self, query: dict[str, str], body: Any) -> None:
        items = self.server.scripted.inbox
        limit = int(query.get("limit", "100"))
        cursor = query.get("cursor")
        after = int(cursor) if cursor and cursor.isdigit() else 0
        pages = self.server.scripted.inbox_pages
        size = min(limit, pages.pop(0)) if pages else limit
        page = [item for item in items if item["seq"] > after][:size]
        self.server.scripted.inbox_served.append(len(page))
        self._json(200, {"items": page, "next_cursor": str(page[-1]["seq"]) if page else cursor})

    def _events(self, query: dict[str, str], body: Any) -> None:
        daemon = self.server.scripted
        header = self.headers.get("Last-Event-ID") or query.get("last_event_id")
        _, batch, cut = daemon.stream_plan()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            if header is not None and header.isdigit():
                older = daemon.events.retained
                if older and int(header) < older[0]["id"] - 1:
                    gap = {"requested_after": int(header), "oldest_available": older[0]["id"],
                           "ts": "2026-11-27T00:00:00.000Z"}
                    self.wfile.write(f"event: replay_gap\ndata: {json.dumps(gap)}\n\n".encode())
                for event in [*older, *daemon.retained]:
                    if event["id"] > int(header) - daemon.events.overlap:
                        self.wfile.write(_frame(event))
            for event in batch:
                daemon.retained.append(event)
                self.wfile.write(_frame(event))
                self.wfile.flush()
                time.sleep(0.01)
            if cut:
                half = dict(id=max([e["id"] for e in daemon.retained] + [0]) + 1, event="message",
                            data={"body": "cut"})
                daemon.retained.append(half)
                frame = _frame(half)
                self.wfile.write(frame[: len(frame) // 2])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            while not daemon._closing.is_set():  # the last stream stays open, with keepalives
                self.wfile.write(b": keepalive\n\n")
                self.wfile.flush()
                daemon._closing.wait(0.5)
        except OSError:
            return


def _frame(event: dict[str, Any]) -> bytes:
    return f"id: {event['id']}\nevent: {event['event']}\ndata: {json.dumps(event['data'])}\n\n".encode()
