"""Frames on the broker link: reading them under the JSON limits, their schema problems, and the frames the broker
builds itself (``error``, the system pushes).

Hostile frames (E-40, E-46). A frame is one WebSocket text message holding one I-JSON object, parsed with the JSON
limits of spec/tables/limits.yaml (``reference.core.limits.loads``), never with a bare ``json.loads``: a binary
message, a frame too deep to parse, one that is not JSON, names an object key twice or has no string ``type`` is
unparsable (the caller closes 4005); a frame that parses but goes past a limit comes back with the limit it passed,
and the caller refuses it like a schema failure.
"""

from __future__ import annotations

import json
import re
from typing import Any

from reference.core.limits import LimitExceeded, Unparsable, loads, unique_keys
from spec import schema, validator

from ._presence import Session
from ._schemas import frame_schema
from .store import rfc3339_ms

#: the frames a daemon may send, by type (spec/schemas/broker/frame.json#/$defs/daemon_to_broker)
DAEMON_FRAMES = tuple(
    entry["$ref"].removesuffix(".json") for entry in schema("broker/frame")["$defs"]["daemon_to_broker"]["oneOf"]
)
_DEFS = schema("common/defs")["$defs"]
CLIENT_MESSAGE_ID = re.compile(_DEFS["client_message_id"]["pattern"])
FINGERPRINT_HEX = re.compile(_DEFS["fingerprint_hex"]["pattern"])
MAX_DETAIL = 200
#: the requestId an error frame may echo (spec/schemas/broker/list_peers.json#/$defs/request_id)
REQUEST_ID = validator("broker/list_peers#/$defs/request_id")


def parse_frame(raw: str | bytes) -> tuple[dict[str, Any] | None, str | None]:
    """(the frame, or None when it is unparsable or has no type; what limit it goes past, or None) (E-40, E-46).

    ``raw`` is a text message's ``str`` or a binary message's ``bytes`` (as websockets hands them over).
    """
    # req: LINK-FRAME-IJSON -- frames are text messages
    if not isinstance(raw, str):
        return None, None
    try:
        # req: LINK-FRAME-IJSON -- no duplicate object keys
        frame, problem = loads(raw, object_pairs_hook=unique_keys), None
    except Unparsable:
        return None, None
    except LimitExceeded as exc:
        frame, problem = exc.document, f"{exc.limit}: {exc.detail}"
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        return None, None
    return frame, problem


class DaemonFrames:
    """The schemas of the frames a daemon may send; ``kind in frames`` says whether a type is one of them."""

    def __init__(self) -> None:
        self._schemas = {name: frame_schema(f"broker/{name}") for name in DAEMON_FRAMES}

    def __contains__(self, kind: object) -> bool:
        return kind in self._schemas

    def problem(self, frame: dict[str, Any]) -> str | None:
        """The first schema error of a frame of a known type, or None."""
        problem = self._schemas[frame["type"]].problem(frame)
        return None if problem is None else problem[:MAX_DETAIL]


def error_frame(code: str, message: str, request_id: Any = None) -> dict[str, Any]:
    """An ``error`` frame (spec/schemas/broker/error.json)."""
    frame = {"type": "error", "code": code, "message": message[:MAX_DETAIL]}
    if REQUEST_ID.is_valid(request_id):
        frame["requestId"] = request_id
    return frame


def system_push(event: str, session: Session, now_ms: int) -> dict[str, Any]:
    """A ``push`` of subtype ``system`` announcing ``session``'s member (``peer_joined``, ``peer_left``)."""
    return {"type": "push", "subtype": "system", "event": event,
            "eventData": {"pubkey": session.pubkey, "displayName": session.display_name,
                          "memberId": session.member_id},
            "meshId": session.mesh_id, "createdAt": rfc3339_ms(now_ms)}


def to_json(frame: dict[str, Any]) -> str:
    return json.dumps(frame, separators=(",", ":"), ensure_ascii=False)
