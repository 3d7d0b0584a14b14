"""A scripted daemon-side peer for certifying brokers: connects as a mesh member, negotiates, sends, acknowledges.

Each ``Member`` owns an ed25519 key and one WebSocket connection (websocket-client). It records every frame it
receives, so broker cases can assert on acks, pushes, presence and close codes.

Rules of this file — whatever the broker does, a member neither raises on what it receives nor waits unbounded:
``open`` returns with ``hello_ack`` / ``negotiation`` left ``None`` when the broker refused or closed (its close code
is in ``close_code``); a frame that is not a JSON object is recorded as ``{"type": None, "unparsable": …}``; every
wait has a timeout; the lookups (``ack``, ``pushes``) return ``None`` or ``[]`` rather than raise.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import websocket
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from reference.core import ENVELOPE_VERSION, FingerprintInput, parse_destination, request_fingerprint
from spec import load_table

from .wire import DEFAULT_PRIORITY

#: what a member asks for in its feature_negotiation_request: a daemon's defaults (spec/tables/features.yaml)
REQUIRE: list[str] = list(load_table("features")["daemon_defaults"]["require"])
OPTIONAL: list[str] = list(load_table("features")["daemon_defaults"]["optional"])
#: the broker's clock is assumed within this of ours when its hello_ack carries no serverTime
UNKNOWN_CLOCK_MS = 5_000.0


def fingerprint_of(frame: dict[str, Any]) -> str:
    """The §4.4 fingerprint of a send frame's fields, hex."""
    return request_fingerprint(FingerprintInput(
        destination_kind=frame["destination_kind"], destination_ref=frame["destination_ref"],
        reply_to_id=frame.get("reply_to_id") or "", priority=frame["priority"], meta=frame.get("meta"),
        body=frame["body"])).hex()


def send_frame(cmid: str, to: str, body: str, priority: str = DEFAULT_PRIORITY, meta: dict | None = None,
               claimed: str | None = None) -> dict[str, Any]:
    """A valid send frame for ``to`` (E-18 grammar); ``claimed`` overrides the request_fingerprint member."""
    destination = parse_destination(to)
    frame = {"type": "send", "id": cmid, "client_message_id": cmid, "envelope_version": ENVELOPE_VERSION,
             "destination_kind": destination.kind, "destination_ref": destination.ref, "priority": priority,
             "reply_to_id": "", "meta": meta, "body": body, "targetSpec": to}
    frame["request_fingerprint"] = claimed or fingerprint_of(frame)
    return frame


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Member:
    """One member connection to the broker under test."""

    url: str
    mesh_id: str
    key: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)
    name: str = "meshconform"
    frames: list[dict[str, Any]] = field(default_factory=list)
    ws: websocket.WebSocket | None = None
    hello_ack: dict[str, Any] | None = None
    negotiation: dict[str, Any] | None = None
    close_code: int | None = None
    close_reason: str = ""
    #: the broker's clock minus ours (ms), and how far that estimate may be off, from hello_ack.serverTime
    clock_offset_ms: float = 0.0
    clock_uncertainty_ms: float = UNKNOWN_CLOCK_MS
    #: like a daemon, acknowledge at close every push not acknowledged yet (a member never leaves deliveries behind
    #: that nobody will ever settle: a trace of the run stays free of leases that end with no one to push to)
    ack_on_close: bool = True
    _acked: set[str] = field(default_factory=set)
    _ended: bool = False
    _lock: threading.Condition = field(default_factory=threading.Condition)
    _reader: threading.Thread | None = None

    @property
    def pubkey(self) -> str:
        return self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()

    @property
    def joined(self) -> bool:
        """The broker said hello_ack and answered the negotiation request."""
        return self.hello_ack is not None and self.negotiation is not None

    def hello(self, timestamp_ms: int | None = None, signature: str | None = None,
              signer: Ed25519PrivateKey | None = None, signed_timestamp_ms: int | None = None,
              pubkey: str | None = None) -> dict[str, Any]:
        """A hello; by default an honest one. ``signature`` replaces the signature, ``signer`` signs with another key,
        ``signed_timestamp_ms`` signs another timestamp than the one sent, ``pubkey`` claims another member's key."""
        timestamp = now_ms() if timestamp_ms is None else timestamp_ms
        key = pubkey or self.pubkey
        signed = timestamp if signed_timestamp_ms is None else signed_timestamp_ms
        payload = f"{self.mesh_id}|{key}|{key}|{signed}".encode()
        return {"type": "hello", "meshId": self.mesh_id, "memberId": key, "pubkey": key,
                "displayName": self.name, "sessionId": f"meshconform-{id(self)}", "protocolVersion": "0.9.0",
                "timestamp": timestamp, "signature": signature or (signer or self.key).sign(payload).hex()}

    def connect(self, timeout: float = 10.0) -> Member:
        """Only the WebSocket: no hello (for cases that send something else first)."""
        self.ws = websocket.create_connection(self.url, timeout=timeout)
        return self

    def open(self, hello: dict[str, Any] | None = None, negotiate: bool = True, timeout: float = 10.0) -> Member:
        """Connect, say hello, negotiate; then read frames in the background. Never raises because of the broker's
        answer: a refusal leaves ``hello_ack`` (or ``negotiation``) ``None``."""
        try:
            self.connect(timeout)
            sent = time.time() * 1000
            self.send(hello or self.hello())
            self.hello_ack = self._recv_until("hello_ack", timeout)
            if self.hello_ack is None:
                return self
            self._clock(sent, time.time() * 1000)
            if negotiate:
                self.send({"type": "feature_negotiation_request", "require": REQUIRE, "optional": OPTIONAL})
                self.negotiation = self._recv_until("feature_negotiation_response", timeout)
        except (OSError, websocket.WebSocketException):
            self._closed(self.close_code, self.close_reason)
            return self
        self.start_reading()
        return self

    def start_reading(self) -> None:
        if self._reader is None and not self._ended and self.ws is not None:
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()

    def _clock(self, sent_ms: float, received_ms: float) -> None:
        server_time = (self.hello_ack or {}).get("serverTime")
        if isinstance(server_time, int) and not isinstance(server_time, bool):
            self.clock_offset_ms = server_time - (sent_ms + received_ms) / 2
            self.clock_uncertainty_ms = (received_ms - sent_ms) / 2 + 2.0

    def broker_now_ms(self) -> int:
        """Our estimate of the broker's clock now."""
        return int(time.time() * 1000 + self.clock_offset_ms)

    def _recv_until(self, kind: str, timeout: float) -> dict[str, Any] | None:
        """The first frame of type ``kind``; None when the broker closed or nothing came within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            frame = self._recv_one(deadline - time.monotonic())
            if frame is None:
                return None
            if frame.get("type") == kind:
                return frame
        return None

    def _recv_one(self, timeout: float) -> dict[str, Any] | None:
        """One frame (``{}`` on a timeout), or None once the connection is closed."""
        if self.ws is None:
            return None
        self.ws.settimeout(max(0.01, timeout))
        try:
            opcode, data = self.ws.recv_data(control_frame=False)
        except websocket.WebSocketTimeoutException:
            return {}
        except (websocket.WebSocketException, OSError):
            self._closed(None, "")
            return None
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            code = int.from_bytes(data[:2], "big") if len(data) >= 2 else None
            self._closed(code, data[2:].decode("utf-8", "replace"))
            return None
        try:
            frame = json.loads(data.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            frame = None
        if not isinstance(frame, dict):
            frame = {"type": None, "unparsable": data[:200].decode("utf-8", "replace")}
        with self._lock:
            self.frames.append(frame)
            self._lock.notify_all()
        return frame

    def _closed(self, code: int | None, reason: str) -> None:
        with self._lock:
            if not self._ended:
                self.close_code, self.close_reason, self._ended = code, reason, True
            self._lock.notify_all()

    @property
    def closed(self) -> bool:
        return self._ended or self.ws is None

    def _read(self) -> None:
        while not self._ended:
            if self._recv_one(0.2) is None:
                return

    def send(self, frame: dict[str, Any] | str | bytes) -> bool:
        """Send a frame (a dict as JSON text, a str verbatim, bytes as a binary message); False when the connection
        is already gone."""
        if self.ws is None:
            return False
        try:
            if isinstance(frame, bytes):
                self.ws.send_bytes(frame)
            else:
                self.ws.send(frame if isinstance(frame, str) else json.dumps(frame))
        except (OSError, websocket.WebSocketException):
            self._closed(self.close_code, self.close_reason)
            return False
        return True

    def wait(self, predicate, timeout: float = 10.0, what: str = "a frame") -> Any:
        """``predicate()``'s first truthy value; TimeoutError naming ``what`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                value = predicate()
                if value:
                    return value
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"member {self.pubkey[:8]}: timed out waiting for {what}")
                self._lock.wait(0.05)

    def poll(self, predicate, timeout: float) -> Any:
        """Like ``wait`` but returns the last (falsy) value instead of raising."""
        try:
            return self.wait(predicate, timeout)
        except TimeoutError:
            with self._lock:
                return predicate()

    def acks(self, cmid: str) -> list[dict[str, Any]]:
        with self._lock:
            return [f for f in self.frames if f.get("type") == "ack" and f.get("client_message_id") == cmid]

    def ack(self, cmid: str, number: int = 1, timeout: float = 10.0) -> dict[str, Any] | None:
        """The ``number``-th ack for ``cmid`` (1-based), or None when it did not come within ``timeout``."""
        found = self.poll(lambda: len(self.acks(cmid)) >= number or self.closed, timeout)
        acks = self.acks(cmid)
        return acks[number - 1] if found and len(acks) >= number else None

    def ack_for(self, cmid: str, count: int = 1, timeout: float = 10.0) -> list[dict[str, Any]]:
        return self.wait(lambda: (a := self.acks(cmid)) and len(a) >= count and a, timeout,
                         f"{count} ack(s) for {cmid}")

    def pushes(self, cmid: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [f for f in self.frames if f.get("type") == "push" and f.get("subtype") != "system"
                    and (cmid is None or f.get("client_message_id") == cmid)]

    def errors(self) -> list[dict[str, Any]]:
        with self._lock:
            return [f for f in self.frames if f.get("type") == "error"]

    def client_ack(self, push: dict[str, Any], **override: Any) -> bool:
        """Acknowledge ``push`` (``override`` replaces members: a wrong ``delivery_id`` or ``brokerMessageId``)."""
        frame = {"type": "client_ack", "clientMessageId": push.get("client_message_id"),
                 "brokerMessageId": push.get("messageId"), "delivery_id": push.get("delivery_id"), **override}
        if not override:
            self._acked.add(str(push.get("delivery_id")))
        return self.send(frame)

    def ack_everything(self) -> None:
        """Acknowledge every push received and not acknowledged yet (once per delivery, its latest push)."""
        latest = {str(p.get("delivery_id")): p for p in self.pushes() if isinstance(p.get("delivery_id"), str)}
        for delivery_id, push in latest.items():
            if delivery_id not in self._acked and isinstance(push.get("messageId"), str) and isinstance(
                    push.get("client_message_id"), str):
                self.client_ack(push)

    def wait_close(self, timeout: float = 10.0) -> tuple[int | None, str]:
        """The broker's close code and reason; TimeoutError if it keeps the connection open."""
        self.start_reading()
        self.wait(lambda: self.closed, timeout, "the broker to close the connection")
        return self.close_code, self.close_reason

    def close_code_within(self, timeout: float = 10.0) -> int | str:
        """The broker's close code, or ``"open"`` when it kept the connection open for ``timeout`` seconds, or
        ``"no code"`` when the connection ended without a close frame."""
        try:
            code, _ = self.wait_close(timeout)
        except TimeoutError:
            return "open"
        return code if code is not None else "no code"

    def settle(self, quiet_s: float = 0.1, limit_s: float = 2.0) -> None:
        """Take in the frames already on their way: read until none has come for ``quiet_s`` (at most ``limit_s``), so
        a push the broker sent just before the close is seen (and acknowledged) too."""
        self.start_reading()
        deadline = time.monotonic() + limit_s
        with self._lock:
            seen = len(self.frames)
            while not self._ended and time.monotonic() < deadline:
                self._lock.wait(quiet_s)
                if len(self.frames) == seen:
                    return
                seen = len(self.frames)

    def close(self) -> None:
        if self.ws is not None and self.ack_on_close and not self._ended:
            if self.hello_ack is not None:
                self.settle()
            self.ack_everything()
        if self.ws is not None:
            with contextlib.suppress(OSError, websocket.WebSocketException):
                self.ws.close(timeout=1)
            with contextlib.suppress(OSError, websocket.WebSocketException):
                self.ws.shutdown()
