"""A scripted daemon-side peer for certifying brokers: connects as a mesh member, negotiates, sends, acknowledges.

Each ``Member`` owns an ed25519 key and one WebSocket connection (websocket-client). It records every frame it
receives, so broker cases can assert on acks, pushes, presence and close codes.
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

from reference.core import FingerprintInput, parse_destination, request_fingerprint

REQUIRE = ["client_message_id_dedupe", "concurrent_connection_policy"]
OPTIONAL = ["member_keypair_rotated_event", "key_epoch", "max_payload"]


def fingerprint_of(frame: dict[str, Any]) -> str:
    """The §4.4 fingerprint of a send frame's fields, hex."""
    return request_fingerprint(FingerprintInput(
        destination_kind=frame["destination_kind"], destination_ref=frame["destination_ref"],
        reply_to_id=frame.get("reply_to_id") or "", priority=frame["priority"], meta=frame.get("meta"),
        body=frame["body"])).hex()


def send_frame(cmid: str, to: str, body: str, priority: str = "next", meta: dict | None = None,
               claimed: str | None = None) -> dict[str, Any]:
    """A valid send frame for ``to`` (E-18 grammar); ``claimed`` overrides the request_fingerprint member."""
    destination = parse_destination(to)
    frame = {"type": "send", "id": cmid, "client_message_id": cmid, "envelope_version": "1",
             "destination_kind": destination.kind, "destination_ref": destination.ref, "priority": priority,
             "reply_to_id": "", "meta": meta, "body": body, "targetSpec": to}
    frame["request_fingerprint"] = claimed or fingerprint_of(frame)
    return frame


@dataclass
class Member:
    """One member connection to the broker under test."""

    url: str
    mesh_id: str
    key: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)
    name: str = "meshconform"
    frames: list[dict[str, Any]] = field(default_factory=list)
    ws: websocket.WebSocket | None = None
    negotiation: dict[str, Any] | None = None
    close_code: int | None = None
    close_reason: str = ""
    _lock: threading.Condition = field(default_factory=threading.Condition)
    _reader: threading.Thread | None = None

    @property
    def pubkey(self) -> str:
        return self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()

    def hello(self, timestamp_ms: int | None = None, signature: str | None = None) -> dict[str, Any]:
        timestamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        payload = f"{self.mesh_id}|{self.pubkey}|{self.pubkey}|{timestamp}".encode()
        return {"type": "hello", "meshId": self.mesh_id, "memberId": self.pubkey, "pubkey": self.pubkey,
                "displayName": self.name, "sessionId": f"meshconform-{id(self)}", "protocolVersion": "0.9.0",
                "timestamp": timestamp, "signature": signature or self.key.sign(payload).hex()}

    def open(self, hello: dict[str, Any] | None = None, negotiate: bool = True, timeout: float = 10.0) -> Member:
        """Connect, say hello, negotiate; then read frames in the background."""
        self.ws = websocket.create_connection(self.url, timeout=timeout)
        self.send(hello or self.hello())
        ack = self._recv_until("hello_ack", timeout)
        if ack is None:
            return self
        if negotiate:
            self.send({"type": "feature_negotiation_request", "require": REQUIRE, "optional": OPTIONAL})
            self.negotiation = self._recv_until("feature_negotiation_response", timeout)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _recv_until(self, kind: str, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            frame = self._recv_one(deadline - time.monotonic())
            if frame is None:
                return None
            if frame.get("type") == kind:
                return frame
        raise TimeoutError(f"no {kind} from the broker")

    def _recv_one(self, timeout: float) -> dict[str, Any] | None:
        assert self.ws is not None
        self.ws.settimeout(max(0.01, timeout))
        try:
            opcode, data = self.ws.recv_data(control_frame=False)
        except websocket.WebSocketTimeoutException:
            return {}
        except (websocket.WebSocketConnectionClosedException, OSError):
            self._closed(None, "")
            return None
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            code = int.from_bytes(data[:2], "big") if len(data) >= 2 else None
            self._closed(code, data[2:].decode("utf-8", "replace"))
            return None
        frame = json.loads(data.decode("utf-8"))
        with self._lock:
            self.frames.append(frame)
            self._lock.notify_all()
        return frame

    def _closed(self, code: int | None, reason: str) -> None:
        with self._lock:
            if self.close_code is None:
                self.close_code, self.close_reason = code, reason
            self._lock.notify_all()

    def _read(self) -> None:
        while self.close_code is None:
            if self._recv_one(0.2) is None:
                return

    def send(self, frame: dict[str, Any] | str) -> None:
        assert self.ws is not None
        self.ws.send(frame if isinstance(frame, str) else json.dumps(frame))

    def wait(self, predicate, timeout: float = 10.0, what: str = "a frame") -> Any:
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                value = predicate()
                if value:
                    return value
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"member {self.pubkey[:8]}: timed out waiting for {what}")
                self._lock.wait(0.05)

    def ack_for(self, cmid: str, count: int = 1, timeout: float = 10.0) -> list[dict[str, Any]]:
        return self.wait(lambda: (a := [f for f in self.frames if f.get("type") == "ack"
                                        and f.get("client_message_id") == cmid]) and len(a) >= count and a,
                         timeout, f"{count} ack(s) for {cmid}")

    def pushes(self, cmid: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [f for f in self.frames if f.get("type") == "push" and f.get("subtype") != "system"
                    and (cmid is None or f.get("client_message_id") == cmid)]

    def wait_close(self, timeout: float = 10.0) -> tuple[int | None, str]:
        self.wait(lambda: self.close_code is not None or (self.ws is not None and not self.ws.connected), timeout,
                  "the broker to close the connection")
        return self.close_code, self.close_reason

    def close(self) -> None:
        if self.ws is not None:
            with contextlib.suppress(OSError, websocket.WebSocketException):
                self.ws.close(timeout=1)
            with contextlib.suppress(OSError, websocket.WebSocketException):
                self.ws.shutdown()
