"""The scripted broker peer: a WebSocket server speaking the broker protocol, under test control.

An implementation under test connects to it as it would to a broker. By default the peer behaves like a correct
broker, deciding every ``send`` with the spec's accept table over an in-memory dedupe store (201 first, 200
duplicate for an equal fingerprint, 409 for a different one). A test overrides that per message or globally: answer
201 / 200 / 409 / any other 4xx / 5xx, answer late, stay silent (the row stays inflight), drop the connection,
advertise missing or invalid feature parameters; and it pushes inbound messages and redeliveries. Every frame in
both directions is recorded with a timestamp, and so is how each connection closed (code and reason).

Theory of operation — dialects. The spec fixes what a broker decides, not how its frames look on the wire (the
WebSocket encoding is meshspec's E-10 / E-28). The peer therefore speaks two dialects and picks one per connection
(``PeerConfig.dialect``: ``meshspec``, ``claudemesh`` or ``auto``, which reads it from the hello):

* ``meshspec`` — the frames of ``spec/schemas/broker``; a ``send`` carries the request's fields, so the peer
  recomputes its fingerprint like a broker (E-21) and can see canonical-form drift.
* ``claudemesh`` — the upstream daemon's frames (``send`` carries ``targetSpec``/``nonce``/``ciphertext`` and the
  claimed ``request_fingerprint``; pushes carry ``ciphertext`` as base64 of the body; ``list_peers`` correlates by
  ``_reqId``). The peer cannot recompute a fingerprint from such a frame, so it dedupes on the claimed one, as
  upstream's broker does.

Acks are a superset in both dialects: the E-10 members (``status``, ``broker_message_id``, ``duplicate``,
``conflict`` …) next to the legacy ``id``/``messageId``/``queued``/``error`` that upstream reads, so the spec's
outcome name always reaches the implementation.

Negotiation is optional: after ``hello_ack`` the peer waits ``negotiation_wait_s`` for a
``feature_negotiation_request``. Whatever happens is recorded per connection (``Link.negotiation``); a first frame
of another type is processed normally. A connection counts as *linked* — from the peer's own evidence, never from
the implementation's health report — once its hello verified, ``hello_ack`` went out and negotiation either
completed or was found absent.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
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

from reference.core import close_code, fingerprint_prefix, settle
from spec import load_table, validator

from . import wire
from .wire import SendSeen

#: what the peer advertises unless a test says otherwise: every bit of spec/tables/features.yaml at its version
DEFAULT_SUPPORTED: dict[str, dict[str, Any]] = {
    bit: {"params": {"version": load_table("features")["bits"][bit]["version"], **params}} for bit, params in {
        "client_message_id_dedupe": {"mode": "retention_scoped", "dedupe_retention_days": 7,
                                     "request_fingerprint": True},
        "concurrent_connection_policy": {"default_policy": "prefer_newest"},
        "member_keypair_rotated_event": {},
        "key_epoch": {"max_concurrent_epochs": 2},
        "max_payload": {"inline_bytes": 2 * 1024 * 1024, "blob_bytes": 524288000},
    }.items()}
DIALECTS = ("auto", "meshspec", "claudemesh")


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
    retry_after_ms: int | None = None


AUTO = Outcome()
CREATED = Outcome("created")
SILENT = Outcome("silent")
ACCEPT_SILENTLY = Outcome("accept_silently")
DROP = Outcome("drop")


def duplicate(history_available: bool = True) -> Outcome:
    return Outcome("duplicate", history_available=history_available)


def conflict(kind: str = "request_fingerprint_mismatch") -> Outcome:
    return Outcome("conflict", conflict=kind)


def reject(status: int = 404, error: str = "destination_not_found") -> Outcome:
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
class Link:
    """One connection's handshake, as the peer saw it."""

    connection: int
    opened_at: float
    hello: dict[str, Any] | None = None
    hello_errors: list[str] = field(default_factory=list)
    signature_ok: bool | None = None
    dialect: str = "meshspec"
    negotiation: dict[str, Any] | None = None  # the request, when one came
    negotiation_state: str = "pending"  # pending | requested | absent
    linked_at: float | None = None
    first_after_ack: str | None = None  # the type of the first frame after hello_ack


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
    dialect: str = "auto"
    negotiation_wait_s: float = 2.0
    hello_wait_s: float = 10.0


def detect_dialect(hello: dict[str, Any]) -> str:
    """The dialect a hello announces: upstream's daemon names its channel and carries process details."""
    if hello.get("channel") == "claudemesh-daemon" or ("protocolVersion" not in hello and "sessionPubkey" in hello):
        return "claudemesh"
    return "meshspec"


class ScriptedBroker:
    """A scripted broker peer on 127.0.0.1; use as a context manager."""

    def __init__(self, config: PeerConfig | None = None, host: str = "127.0.0.1", port: int = 0):
        self.config = config or PeerConfig()
        if self.config.dialect not in DIALECTS:
            raise ValueError(f"unknown dialect {self.config.dialect!r}: one of {', '.join(DIALECTS)}")
        self.host = host
        self._port = port
        self.frames: list[Recorded] = []
        self.closes: list[Closed] = []
        self.hellos: list[dict[str, Any]] = []
        self.links: dict[int, Link] = {}
        self.dedupe: dict[str, _Dedupe] = {}
        self.messages: dict[str, dict[str, Any]] = {}  # broker_message_id -> accepted send frame
        self.script: dict[str, list[Outcome]] = {}
        self.default: Outcome = AUTO
        self._cond = threading.Condition()
        self._connections: dict[int, ServerConnection] = {}
        self._next_connection = 0
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self._hello_check = validator("broker/hello")
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
                with contextlib.suppress(Exception):
                    connection.close(close_code("going_away"), "scripted broker stopping")
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

    def forget(self, *cmids: str) -> None:
        """Drop what is still scripted for ``cmids`` (they are answered by the default again)."""
        with self._cond:
            for cmid in cmids:
                self.script.pop(cmid, None)

    def answer_all(self, outcome: Outcome) -> None:
        """Answer every send without a scripted outcome with ``outcome``."""
        with self._cond:
            self.default = outcome

    def dialect_of(self, connection: int | None = None) -> str:
        """The dialect of the newest (or a given) linked connection."""
        with self._cond:
            if connection is None:
                linked = [c for c, link in self.links.items() if link.linked_at is not None]
                connection = max(linked) if linked else None
            link = self.links.get(connection) if connection is not None else None
        if link is not None:
            return link.dialect
        return "meshspec" if self.config.dialect == "auto" else self.config.dialect

    def push(self, *, body: str, client_message_id: str | None = None, sender: str = "ab" * 32,
             topic: str | None = None, delivery_id: str | None = None, attempt: int = 1,
             broker_message_id: str | None = None, meta: dict[str, Any] | None = None,
             connection: int | None = None) -> dict[str, Any]:
        """Push one inbound message to the connected implementation, in its dialect; returns the frame sent."""
        conn_id = connection if connection is not None else self.wait_connected()
        frame = self.push_frame(body=body, client_message_id=client_message_id, sender=sender, topic=topic,
                                delivery_id=delivery_id, attempt=attempt, broker_message_id=broker_message_id,
                                meta=meta, connection=conn_id)
        self.send_raw(frame, conn_id)
        return frame

    def push_frame(self, *, body: str, client_message_id: str | None = None, sender: str = "ab" * 32,
                   topic: str | None = None, delivery_id: str | None = None, attempt: int = 1,
                   broker_message_id: str | None = None, meta: dict[str, Any] | None = None,
                   connection: int | None = None) -> dict[str, Any]:
        """The push frame for one inbound message in the dialect of the newest (or a given) connection."""
        frame: dict[str, Any] = {
            "type": "push", "messageId": broker_message_id or str(ULID()), "meshId": "mesh",
            "senderPubkey": sender, "senderName": "scripted", "topic": topic, "replyToId": None,
            "priority": wire.DEFAULT_PRIORITY, "createdAt": wire.iso(time.time()),
            "client_message_id": client_message_id or str(ULID()), "delivery_id": delivery_id or str(ULID()),
            "attempt": attempt,
        }
        if self.dialect_of(connection) == "claudemesh":
            frame.update(nonce="", ciphertext=base64.b64encode(body.encode("utf-8")).decode("ascii"))
            if meta is not None:
                frame["meta"] = meta
        else:
            frame.update(body=body, meta=meta)
        return frame

    def push_system(self, event: str, data: dict[str, Any]) -> None:
        self.send_raw({"type": "push", "subtype": "system", "event": event, "eventData": data, "meshId": "mesh",
                       "createdAt": wire.iso(time.time())})

    def send_raw(self, frame: dict[str, Any] | str | bytes, connection: int | None = None) -> None:
        """Send any frame (a dict as JSON text, raw text, or bytes as a binary message) on the newest (or a given)
        connection."""
        conn_id = connection if connection is not None else self.wait_connected()
        text = frame if isinstance(frame, str | bytes) else json.dumps(frame)
        with self._cond:
            connection_obj = self._connections.get(conn_id)
        if connection_obj is None:
            raise ConnectionError("no connected implementation")
        connection_obj.send(text)
        if isinstance(frame, dict):
            self._record("out", frame, conn_id)

    def hold(self) -> None:
        """Become unreachable: drop every connection and refuse new ones (close 1013) until ``release``.

        Rows the implementation accepts meanwhile cannot be dispatched.
        """
        self.held.set()
        self.drop(close_code("try_again_later"), "scripted hold")

    def release(self, timeout: float = 15.0) -> None:
        """Accept connections again and wait until the implementation is linked again."""
        connections = self._next_connection
        self.held.clear()
        self.wait_for(lambda: any(c > connections and link.linked_at for c, link in self.links.items()), timeout,
                      "the implementation to reconnect")

    def drop(self, code: int = close_code("internal_error"), reason: str = "scripted drop") -> None:
        """Close every connection from the broker side."""
        for connection in list(self._connections.values()):
            with contextlib.suppress(Exception):
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

    def sends_of(self, cmid: str) -> list[Recorded]:
        """Every ``send`` frame the implementation sent for ``cmid``, with its time and connection."""
        with self._cond:
            return [r for r in self.frames if r.direction == "in" and r.frame.get("type") == "send"
                    and r.frame.get("client_message_id", r.frame.get("id")) == cmid]

    def client_acks(self, cmid: str | None = None) -> list[dict[str, Any]]:
        """``client_ack`` frames, normalised to ``{cmid, broker_message_id, delivery_id, frame}``."""
        acks = []
        for frame in self.received("client_ack"):
            entry = wire.client_ack(frame)
            if cmid is None or entry["cmid"] == cmid:
                acks.append(entry)
        return acks

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
                    raise TimeoutError(f"scripted broker: timed out after {timeout:g} s waiting for {what}")
                self._cond.wait(min(remaining, 0.1))

    def connection_times(self, after: int = 0) -> list[float]:
        """When each connection numbered above ``after`` was opened (the implementation's connect attempts)."""
        with self._cond:
            return [link.opened_at for number, link in sorted(self.links.items()) if number > after]

    def linked(self) -> Link | None:
        """The newest open connection that completed its handshake (the peer's own evidence of a link)."""
        with self._cond:
            open_links = [link for c, link in self.links.items() if link.linked_at is not None
                          and c in self._connections]
            return max(open_links, key=lambda link: link.connection) if open_links else None

    def wait_linked(self, timeout: float = 10.0) -> Link:
        return self.wait_for(self.linked, timeout, "a linked connection (hello verified, hello_ack sent)")

    def wait_connected(self, timeout: float = 10.0) -> int:
        """The id of the newest linked connection."""
        return self.wait_linked(timeout).connection

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
            self.links[conn_id] = Link(conn_id, time.time())
        try:
            if self.held.is_set():
                ws.close(close_code("try_again_later"), "try_again_later")
                return
            first = self._handshake(ws, conn_id)
            if first is False:
                return
            if isinstance(first, dict):
                self._on_frame(ws, conn_id, first)
            for raw in ws:
                frame = self._parse(conn_id, raw)
                if frame is not None:
                    self._on_frame(ws, conn_id, frame)
        except (ConnectionClosed, TimeoutError, OSError):
            pass
        finally:
            with self._cond:
                self._connections.pop(conn_id, None)
                rcvd = ws.close_exc.rcvd if ws.close_exc is not None else None
                self.closes.append(Closed(conn_id, rcvd.code if rcvd else None, rcvd.reason if rcvd else "",
                                          time.time()))
                self._cond.notify_all()

    def _parse(self, conn_id: int, raw: str | bytes) -> dict[str, Any] | None:
        try:
            frame = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            self._record("in", {"type": "<unparsable>", "raw": str(raw)[:200]}, conn_id)
            return None
        if not isinstance(frame, dict):
            self._record("in", {"type": "<not-an-object>", "raw": str(raw)[:200]}, conn_id)
            return None
        self._record("in", frame, conn_id)
        return frame

    def _handshake(self, ws: ServerConnection, conn_id: int) -> bool | dict[str, Any] | None:
        """hello → hello_ack → optional negotiation. False: closed; a dict: the first frame after hello_ack,
        which was not a negotiation request and still has to be processed; None: nothing pending."""
        hello = self._parse(conn_id, ws.recv(timeout=self.config.hello_wait_s))
        link = self.links[conn_id]
        if not hello or hello.get("type") != "hello":
            ws.close(close_code("protocol_error"), "protocol_error")
            return False
        link.hello = hello
        link.hello_errors = [e.message for e in self._hello_check.iter_errors(hello)]
        link.dialect = detect_dialect(hello) if self.config.dialect == "auto" else self.config.dialect
        self.hellos.append(hello)
        if not all(isinstance(hello.get(k), str | int) for k in ("meshId", "memberId", "pubkey", "timestamp",
                                                                    "signature")):
            ws.close(close_code("protocol_error"), "protocol_error")
            return False
        link.signature_ok = _signature_ok(hello)
        if self.config.verify_signatures and not link.signature_ok:
            ws.close(close_code("unauthorized"), "unauthorized")
            return False
        self._send(ws, conn_id, {"type": "hello_ack", "memberId": hello["memberId"], "meshId": hello["meshId"],
                                 "sessionId": f"session-{conn_id}", "brokerVersion": self.config.broker_version,
                                 "serverTime": int(time.time() * 1000)})
        with self._cond:
            self._connections[conn_id] = ws
        try:
            first = self._parse(conn_id, ws.recv(timeout=self.config.negotiation_wait_s))
        except TimeoutError:
            first = None
        link.first_after_ack = first.get("type") if first else None
        if first is not None and first.get("type") == "feature_negotiation_request":
            link.negotiation, link.negotiation_state = first, "requested"
            if self.config.answer_negotiation:
                self._send(ws, conn_id, {"type": "feature_negotiation_response", "supported": self.config.supported,
                                         "missing_required": list(self.config.missing_required)})
            first = None
        else:
            link.negotiation_state = "absent"
        with self._cond:
            link.linked_at = time.time()
            self._cond.notify_all()
        return first

    def _on_frame(self, ws: ServerConnection, conn_id: int, frame: dict[str, Any]) -> None:
        if self.on_receive is not None:
            self.on_receive(frame)
        kind = frame.get("type")
        if kind == "send":
            self._on_send(ws, conn_id, frame)
        elif kind == "list_peers" and self.config.answer_peers:
            answer: dict[str, Any] = {"type": "peers_list", "peers": self.config.peers}
            for key in ("requestId", "_reqId"):  # echo whichever correlation member the request used
                if key in frame:
                    answer[key] = frame[key]
            self._send(ws, conn_id, answer)

    def _next_outcome(self, cmid: str) -> Outcome:
        with self._cond:
            queue = self.script.get(cmid)
            if queue:
                return queue.pop(0)
            return self.default

    def _on_send(self, ws: ServerConnection, conn_id: int, frame: dict[str, Any]) -> None:
        seen = wire.send_seen(frame)
        outcome = self._next_outcome(seen.cmid)
        if outcome.kind == "silent":
            return
        if outcome.kind == "accept_silently":
            self.decide(seen, AUTO)
            return
        if outcome.kind == "drop":
            ws.close(close_code("internal_error"), "scripted drop")
            return
        if outcome.delay_s:
            time.sleep(outcome.delay_s)
        self._send(ws, conn_id, self.decide(seen, outcome))

    def decide(self, seen: SendSeen, outcome: Outcome) -> dict[str, Any]:
        """The ack a broker sends for ``seen`` under ``outcome`` (recording an accepted message like one would)."""
        cmid = seen.cmid
        fingerprint = seen.fingerprint()
        base = {"type": "ack", "id": seen.frame.get("id", cmid), "client_message_id": cmid}
        if outcome.kind == "auto":
            with self._cond:
                existing = self.dedupe.get(cmid)
            claim = "ours" if existing is None else "theirs"
            match = None if existing is None else ("match" if existing.fingerprint == fingerprint else "mismatch")
            drift = "same"
            if seen.fields is not None and seen.claimed != fingerprint.hex():
                drift = "differs"
            known = {"b1": "ok", "drift": drift, "claim": claim, "b2": "ok", "commit": "ok"}
            if match is not None:
                known["fingerprint"] = match
            decision = settle(**known)
            outcome = {"201": CREATED, "200": duplicate(True)}.get(decision.http_status) or conflict(
                decision.conflict or "request_fingerprint_mismatch")
        if outcome.kind in ("created", "duplicate"):
            with self._cond:
                entry = self.dedupe.get(cmid)
                if entry is None or outcome.kind == "created":
                    entry = _Dedupe(str(ULID()), fingerprint, str(ULID()), wire.iso(time.time()))
                    self.dedupe[cmid] = entry
                    self.messages[entry.broker_message_id] = seen.frame
            body = {**base, "status": 201 if outcome.kind == "created" else 200, "messageId": entry.broker_message_id,
                    "queued": True, "broker_message_id": entry.broker_message_id, "history_id": entry.history_id,
                    "duplicate": outcome.kind == "duplicate"}
            if outcome.kind == "duplicate":
                body.update(history_available=outcome.history_available, first_seen_at=entry.first_seen_at)
            return body
        if outcome.kind == "conflict":
            return {**base, "status": 409, "messageId": "", "queued": False, "error": "idempotency_key_reused",
                    "conflict": outcome.conflict, "broker_fingerprint_prefix": fingerprint_prefix(fingerprint)}
        body = {**base, "status": outcome.status, "messageId": "", "queued": False, "error": outcome.error,
                "detail": f"scripted {outcome.kind}"}
        if outcome.retry_after_ms is not None:
            body["retry_after_ms"] = outcome.retry_after_ms
        return body


def _signature_ok(hello: dict[str, Any]) -> bool:
    payload = f"{hello['meshId']}|{hello['memberId']}|{hello['pubkey']}|{hello['timestamp']}".encode()
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(str(hello["pubkey"]))).verify(
            bytes.fromhex(str(hello["signature"])), payload)
    except (InvalidSignature, ValueError, binascii.Error):
        return False
    return True
