"""The scripted broker peer: a WebSocket server speaking the spec's broker protocol, under test control.

An implementation under test connects to it as it would to a broker. By default the peer behaves like a correct
broker, deciding every ``send`` with the spec's own accept table over an in-memory dedupe store (201 first, 200
duplicate for an equal fingerprint, 409 for a different one). A test overrides that per message or globally: answer
201 / 200 / 409 / any other 4xx / 5xx, answer late, stay silent (the row stays inflight), drop the connection,
advertise missing or invalid feature parameters; and it pushes inbound messages and redeliveries. Every frame in
both directions is recorded with a timestamp, and so is how each connection closed (code and reason), for the
assertions.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from ulid import ULID
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import Server, ServerConnection, serve

from reference.core import settle
from reference.core.fingerprint import FingerprintInput, fingerprint_prefix, request_fingerprint
from spec import validator

DEFAULT_SUPPORTED: dict[str, dict[str, Any]] = {
    "client_message_id_dedupe": {"params": {"version": 1, "mode": "retention_scoped", "dedupe_retention_days": 7,
                                            "request_fingerprint": True}},
    "concurrent_connection_policy": {"params": {"version": 1, "default_policy": "prefer_newest"}},
    "member_keypair_rotated_event": {"params": {"version": 1}},
    "key_epoch": {"params": {"version": 1, "max_concurrent_epochs": 2}},
    "max_payload": {"params": {"version": 1, "inline_bytes": 65536, "blob_bytes": 524288000}},
}


@dataclass(frozen=True)
class Outcome:
    """How the peer answers one ``send``.

    ``kind``: auto (decide like a correct broker), created, duplicate, conflict, reject, fail, silent (never answer),
    accept_silently (commit it like a broker that crashed after COMMIT and before the ack, §4.7.3), drop (close).
    """

    kind: str = "auto"
    status: int | None = None
    error: str | None = None
    history_available: bool = True
    delay_s: float = 0.0
    conflict: str = "request_fingerprint_mismatch"


AUTO = Outcome()
CREATED = Outcome("created")
SILENT = Outcome("silent")
ACCEPT_SILENTLY = Outcome("accept_silently")
DROP = Outcome("drop")


def duplicate(history_available: bool = True) -> Outcome:
    return Outcome("duplicate", history_available=history_available)


def conflict(kind: str = "request_fingerprint_mismatch") -> Outcome:
    return Outcome("conflict", conflict=kind)


def reject(status: int = 403, error: str = "not_a_member") -> Outcome:
    return Outcome("reject", status=status, error=error)


def fail(status: int = 503, error: str = "internal_error") -> Outcome:
    return Outcome("fail", status=status, error=error)


@dataclass
class Recorded:
    """One frame seen by the peer: direction ``in`` (from the implementation) or ``out``."""

    direction: str
    frame: dict[str, Any]
    at: float
    connection: int


@dataclass
class Closed:
    """How a connection ended: the close code and reason the implementation sent (None when it just vanished)."""

    connection: int
    code: int | None
    reason: str
    at: float


@dataclass
class _Dedupe:
    broker_message_id: str
    fingerprint: bytes
    history_id: str
    first_seen_at: str


@dataclass
class PeerConfig:
    """What the peer advertises and how it answers by default."""

    supported: dict[str, Any] = field(default_factory=lambda: json.loads(json.dumps(DEFAULT_SUPPORTED)))
    missing_required: list[str] = field(default_factory=list)
    verify_signatures: bool = True
    answer_negotiation: bool = True
    answer_peers: bool = True
    peers: list[dict[str, Any]] = field(default_factory=list)
    broker_version: str = "0.9.0-scripted"


class ScriptedBroker:
    """A scripted broker peer on 127.0.0.1; use as a context manager."""

    def __init__(self, config: PeerConfig | None = None, host: str = "127.0.0.1", port: int = 0):
        self.config = config or PeerConfig()
        self.host = host
        self._port = port
        self.frames: list[Recorded] = []
        self.closes: list[Closed] = []
        self.hellos: list[dict[str, Any]] = []
        self.dedupe: dict[str, _Dedupe] = {}
        self.messages: dict[str, dict[str, Any]] = {}  # broker_message_id -> accepted send frame
        self.script: dict[str, list[Outcome]] = {}
        self.default: Outcome = AUTO
        self._cond = threading.Condition()
        self._connections: dict[int, ServerConnection] = {}
        self._next_connection = 0
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self._daemon_check = validator("broker/frame#/$defs/daemon_to_broker")
        self.on_receive: Callable[[dict[str, Any]], None] | None = None  # runs on the handler thread, per frame
        self.held = threading.Event()

    # --- lifecycle -----------------------------------------------------------------------------------------
    def __enter__(self) -> ScriptedBroker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._server = serve(self._handle, self.host, self._port, compression=None, ping_interval=None,
                             max_size=2**22)
        self._port = self._server.socket.getsockname()[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="scripted-broker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            for connection in list(self._connections.values()):
                connection.close(1001, "scripted broker stopping")
            self._server.shutdown()
            self._server = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self._port}"

    # --- scripting -----------------------------------------------------------------------------------------
    def answer(self, client_message_id: str, *outcomes: Outcome) -> None:
        """Answer the next sends of ``client_message_id`` with ``outcomes`` in order (then the default)."""
        with self._cond:
            self.script.setdefault(client_message_id, []).extend(outcomes)

    def answer_all(self, outcome: Outcome) -> None:
        """Answer every send without a scripted outcome with ``outcome``."""
        with self._cond:
            self.default = outcome

    def push(self, *, body: str, client_message_id: str | None = None, sender: str = "ab" * 32,
             topic: str | None = None, delivery_id: str | None = None, attempt: int = 1,
             broker_message_id: str | None = None, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """Push one inbound message to the connected implementation; returns the frame sent."""
        frame = {
            "type": "push", "messageId": broker_message_id or str(ULID()), "meshId": "mesh",
            "senderPubkey": sender, "senderName": "scripted", "topic": topic, "replyToId": None,
            "priority": "next", "body": body, "meta": meta, "createdAt": _iso(time.time()),
            "client_message_id": client_message_id or str(ULID()), "delivery_id": delivery_id or str(ULID()),
            "attempt": attempt,
        }
        self.send_raw(frame)
        return frame

    def push_system(self, event: str, data: dict[str, Any]) -> None:
        self.send_raw({"type": "push", "subtype": "system", "event": event, "eventData": data, "meshId": "mesh",
                       "createdAt": _iso(time.time())})

    def send_raw(self, frame: dict[str, Any] | str, connection: int | None = None) -> None:
        """Send any frame (or raw text) on the newest (or a given) connection."""
        conn_id = connection if connection is not None else self.wait_connected()
        text = frame if isinstance(frame, str) else json.dumps(frame)
        with self._cond:
            connection_obj = self._connections.get(conn_id)
        if connection_obj is None:
            raise ConnectionError("no connected implementation")
        connection_obj.send(text)
        if isinstance(frame, dict):
            self._record("out", frame, conn_id)

    def hold(self) -> None:
        """Become unreachable: drop every connection and refuse new ones (close 1013) until ``release``.

        Rows the implementation accepts meanwhile stay ``pending``: nothing can be dispatched.
        """
        self.held.set()
        self.drop(1013, "scripted hold")

    def release(self, timeout: float = 15.0) -> None:
        """Accept connections again and wait until the implementation is back."""
        connections = self._next_connection
        self.held.clear()
        self.wait_for(lambda: self._connections and max(self._connections) > connections, timeout,
                      "the implementation to reconnect")

    def drop(self, code: int = 1011, reason: str = "scripted drop") -> None:
        """Close every connection from the broker side."""
        for connection in list(self._connections.values()):
            connection.close(code, reason)

    # --- observation ---------------------------------------------------------------------------------------
    def _frames(self, direction: str, kind: str | None) -> list[dict[str, Any]]:
        with self._cond:
            return [r.frame for r in self.frames
                    if r.direction == direction and (kind is None or r.frame.get("type") == kind)]

    def received(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Frames the implementation sent, oldest first (all, or those of one ``type``)."""
        return self._frames("in", kind)

    def sent(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Frames the peer sent to the implementation."""
        return self._frames("out", kind)

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
        """Wait until ``predicate()`` is truthy; returns its value or raises TimeoutError naming ``what``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                value = predicate()
                if value:
                    return value
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"scripted broker: timed out waiting for {what}")
                self._cond.wait(min(remaining, 0.1))

    def wait_connected(self, timeout: float = 10.0) -> int:
        """The id of the newest connection that finished negotiation."""
        return self.wait_for(lambda: max(self._connections) if self._connections else None, timeout, "a connection")

    def wait_frame(self, kind: str, count: int = 1, timeout: float = 10.0, direction: str = "in"
                   ) -> list[dict[str, Any]]:
        """Wait for ``count`` frames of ``kind`` received from (``in``) or sent to (``out``) the implementation."""
        pick = self.received if direction == "in" else self.sent
        return self.wait_for(lambda: (f := pick(kind)) and len(f) >= count and f, timeout,
                             f"{count} {kind} frame(s) {direction}")

    def wait_close(self, timeout: float = 10.0) -> Closed:
        return self.wait_for(lambda: self.closes[-1] if self.closes else None, timeout, "a close")

    # --- protocol ------------------------------------------------------------------------------------------
    def _record(self, direction: str, frame: dict[str, Any], connection: int) -> None:
        with self._cond:
            self.frames.append(Recorded(direction, frame, time.time(), connection))
            self._cond.notify_all()

    def _send(self, ws: ServerConnection, conn_id: int, frame: dict[str, Any]) -> None:
        ws.send(json.dumps(frame))
        self._record("out", frame, conn_id)

    def _handle(self, ws: ServerConnection) -> None:
        with self._cond:
            self._next_connection += 1
            conn_id = self._next_connection
        try:
            if self.held.is_set():
                ws.close(1013, "try again later")
                return
            if not self._handshake(ws, conn_id):
                return
            with self._cond:
                self._connections[conn_id] = ws
                self._cond.notify_all()
            for raw in ws:
                frame = self._parse(ws, conn_id, raw)
                if frame is not None:
                    self._on_frame(ws, conn_id, frame)
        except ConnectionClosed:
            pass
        finally:
            with self._cond:
                self._connections.pop(conn_id, None)
                rcvd = ws.close_exc.rcvd if ws.close_exc is not None else None
                self.closes.append(Closed(conn_id, rcvd.code if rcvd else None, rcvd.reason if rcvd else "",
                                          time.time()))
                self._cond.notify_all()

    def _parse(self, ws: ServerConnection, conn_id: int, raw: str | bytes) -> dict[str, Any] | None:
        try:
            frame = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            self._record("in", {"type": "<unparsable>", "raw": str(raw)[:200]}, conn_id)
            return None
        self._record("in", frame, conn_id)
        return frame

    def _handshake(self, ws: ServerConnection, conn_id: int) -> bool:
        hello = self._parse(ws, conn_id, ws.recv())
        if not hello or hello.get("type") != "hello" or list(self._daemon_check.iter_errors(hello)):
            ws.close(4005, "protocol_error")
            return False
        self.hellos.append(hello)
        if self.config.verify_signatures and not _signature_ok(hello):
            ws.close(4001, "unauthorized")
            return False
        self._send(ws, conn_id, {"type": "hello_ack", "memberId": hello["memberId"], "meshId": hello["meshId"],
                                 "sessionId": f"session-{conn_id}", "brokerVersion": self.config.broker_version,
                                 "serverTime": int(time.time() * 1000)})
        request = self._parse(ws, conn_id, ws.recv())
        if not request or request.get("type") != "feature_negotiation_request":
            ws.close(4005, "protocol_error")
            return False
        if self.config.answer_negotiation:
            self._send(ws, conn_id, {"type": "feature_negotiation_response", "supported": self.config.supported,
                                     "missing_required": list(self.config.missing_required)})
        return True

    def _on_frame(self, ws: ServerConnection, conn_id: int, frame: dict[str, Any]) -> None:
        if self.on_receive is not None:
            self.on_receive(frame)
        kind = frame.get("type")
        if kind == "send":
            self._on_send(ws, conn_id, frame)
        elif kind == "list_peers" and self.config.answer_peers:
            self._send(ws, conn_id, {"type": "peers_list", "requestId": frame.get("requestId"),
                                     "peers": self.config.peers})

    def _next_outcome(self, cmid: str) -> Outcome:
        with self._cond:
            queue = self.script.get(cmid)
            if queue:
                return queue.pop(0)
            return self.default

    def _on_send(self, ws: ServerConnection, conn_id: int, frame: dict[str, Any]) -> None:
        cmid = frame.get("client_message_id", "")
        outcome = self._next_outcome(cmid)
        if outcome.kind == "silent":
            return
        if outcome.kind == "accept_silently":
            self._decide(frame, AUTO)
            return
        if outcome.kind == "drop":
            ws.close(1011, "scripted drop")
            return
        if outcome.delay_s:
            time.sleep(outcome.delay_s)
        ack = self._decide(frame, outcome)
        self._send(ws, conn_id, ack)

    def _decide(self, frame: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
        cmid = frame["client_message_id"]
        fingerprint = _recompute(frame)
        base = {"type": "ack", "id": cmid, "client_message_id": cmid}
        if outcome.kind == "auto":
            existing = self.dedupe.get(cmid)
            claim = "ours" if existing is None else "theirs"
            match = None if existing is None else ("match" if existing.fingerprint == fingerprint else "mismatch")
            drift = "differs" if frame.get("request_fingerprint") != fingerprint.hex() else "same"
            known = {"b1": "ok", "drift": drift, "claim": claim, "b2": "ok", "commit": "ok"}
            if match is not None:
                known["fingerprint"] = match
            decision = settle(**known)
            outcome = {"201": CREATED, "200": duplicate(True)}.get(decision.http_status) or conflict(
                decision.conflict or "request_fingerprint_mismatch")
        if outcome.kind in ("created", "duplicate"):
            entry = self.dedupe.get(cmid)
            if entry is None or outcome.kind == "created":
                entry = _Dedupe(str(ULID()), fingerprint, str(ULID()), _iso(time.time()))
                self.dedupe[cmid] = entry
                self.messages[entry.broker_message_id] = frame
            body = {**base, "status": 201 if outcome.kind == "created" else 200, "messageId": entry.broker_message_id,
                    "queued": True, "broker_message_id": entry.broker_message_id, "history_id": entry.history_id,
                    "duplicate": outcome.kind == "duplicate"}
            if outcome.kind == "duplicate":
                body.update(history_available=outcome.history_available, first_seen_at=entry.first_seen_at)
            return body
        if outcome.kind == "conflict":
            return {**base, "status": 409, "messageId": "", "queued": False, "error": "idempotency_key_reused",
                    "conflict": outcome.conflict, "broker_fingerprint_prefix": fingerprint_prefix(fingerprint)}
        return {**base, "status": outcome.status, "messageId": "", "queued": False, "error": outcome.error,
                "detail": f"scripted {outcome.kind}"}


def _recompute(frame: dict[str, Any]) -> bytes:
    return request_fingerprint(FingerprintInput(
        destination_kind=frame.get("destination_kind", ""), destination_ref=frame.get("destination_ref", ""),
        reply_to_id=frame.get("reply_to_id") or "", priority=frame.get("priority", "next"), meta=frame.get("meta"),
        body=frame.get("body", ""), envelope_version=frame.get("envelope_version", "1")))


def _signature_ok(hello: dict[str, Any]) -> bool:
    payload = f"{hello['meshId']}|{hello['memberId']}|{hello['pubkey']}|{hello['timestamp']}".encode()
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(hello["pubkey"])).verify(
            bytes.fromhex(hello["signature"]), payload)
    except (InvalidSignature, ValueError):
        return False
    return True


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds % 1 * 1000):03d}Z"
