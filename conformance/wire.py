"""Reading frames and IPC bodies the way a black-box harness must: without trusting their shape.

Every function here takes what an implementation under test sent and returns plain values, never raising on a
missing member or a wrong type: a case asserts on the values, so a deviation becomes a verdict on the requirement
it breaks instead of a KeyError that hides it. Two broker dialects are understood (see ``peer.py``).
"""

from __future__ import annotations

import base64
import binascii
import time
from dataclasses import dataclass
from typing import Any

from reference.core import ENVELOPE_VERSION, FingerprintInput
from spec import schema

#: E-19: the priority a send without one has (spec/schemas/ipc/send_request.json)
DEFAULT_PRIORITY = schema("ipc/send_request")["properties"]["priority"]["default"]


@dataclass
class SendSeen:
    """A ``send`` frame normalised across dialects."""

    cmid: str
    claimed: str | None  # the request_fingerprint the implementation sent (hex), if any
    fields: FingerprintInput | None  # the request's fields, when the frame carries them (meshspec dialect)
    body: str | None  # the body as text, when the harness can read it
    frame: dict[str, Any]

    def fingerprint(self) -> bytes:
        """What a broker dedupes on: its own recomputation when it can, else the claimed fingerprint."""
        from reference.core import request_fingerprint

        if self.fields is not None:
            try:
                return request_fingerprint(self.fields)
            except (ValueError, TypeError):
                pass
        try:
            return bytes.fromhex(self.claimed or "")
        except ValueError:
            return (self.claimed or "").encode()


def text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def send_seen(frame: dict[str, Any]) -> SendSeen:
    """Normalise a daemon's ``send`` frame (meshspec or upstream claudemesh dialect)."""
    cmid = text(frame.get("client_message_id")) or text(frame.get("id")) or ""
    claimed = text(frame.get("request_fingerprint"))
    fields = None
    body = text(frame.get("body"))
    if "destination_kind" in frame and "body" in frame:
        meta = frame.get("meta")
        fields = FingerprintInput(
            destination_kind=str(frame.get("destination_kind", "")),
            destination_ref=str(frame.get("destination_ref", "")),
            reply_to_id=str(frame.get("reply_to_id") or ""), priority=str(frame.get("priority", DEFAULT_PRIORITY)),
            meta=meta if isinstance(meta, dict) or meta is None else {"<not an object>": repr(meta)},
            body=str(frame.get("body", "")), envelope_version=str(frame.get("envelope_version", ENVELOPE_VERSION)))
    elif body is None and isinstance(frame.get("ciphertext"), str):
        body = decode_base64_text(frame["ciphertext"])
    return SendSeen(cmid, claimed, fields, body, frame)


def decode_base64_text(value: str) -> str | None:
    """Upstream sends topic and broadcast bodies as base64 of the UTF-8 text; DMs are sealed (unreadable)."""
    try:
        return base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def client_ack(frame: dict[str, Any]) -> dict[str, Any]:
    """A ``client_ack`` normalised: the acknowledged client_message_id, broker_message_id and delivery_id."""
    return {"cmid": text(frame.get("clientMessageId")) or text(frame.get("client_message_id")) or "",
            "broker_message_id": text(frame.get("brokerMessageId")) or text(frame.get("broker_message_id")),
            "delivery_id": text(frame.get("delivery_id")), "frame": frame}


def iso(seconds: float) -> str:
    """RFC 3339 UTC with milliseconds, as the broker writes times."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds % 1 * 1000):03d}Z"


def json_object(response: Any) -> dict[str, Any]:
    """An HTTP response's body as a dict; {} when it is not a JSON object (the shape is checked elsewhere)."""
    try:
        value = response.json()
    except (ValueError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def member(body: Any, name: str, default: Any = None) -> Any:
    return body.get(name, default) if isinstance(body, dict) else default
