"""Validation phase A of POST /v1/send (§4.5.1 step 1, §4.6.1 A): parse, check, default, resolve.

Nothing here consumes an id: a ``RequestError`` is answered with a 4xx and no row is written. A ``SendRequest`` is the
validated request with every default applied, ready for the fingerprint and the lookup table.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spec import fast_validator, schema

from .destination import DestinationError, parse_destination
from .fingerprint import FingerprintInput, MetaError, meta_canonical, request_fingerprint
from .limits import DuplicateKey, LimitExceeded, Unparsable, loads, unique_keys

_SEND = schema("ipc/send_request")["properties"]
#: the members a send body may carry (spec/schemas/ipc/send_request.json)
SEND_MEMBERS = frozenset(_SEND)
#: the priorities (spec/schemas/common/defs.json ``priority``) and the one an absent priority means (E-19)
PRIORITIES: tuple[str, ...] = tuple(schema("common/defs")["$defs"]["priority"]["enum"])
DEFAULT_PRIORITY: str = _SEND["priority"]["default"]


class RequestError(ValueError):
    """A phase-A refusal: ``code`` is an error code of spec/tables/errors.yaml."""

    def __init__(self, code: str, detail: str, invalid_params: tuple[tuple[str, str], ...] = ()):
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.invalid_params = invalid_params


@dataclass(frozen=True)
class SendRequest:
    """A validated send with defaults applied. ``client_message_id`` is ``None`` when the daemon must mint one."""

    client_message_id: str | None
    to: str
    destination_kind: str
    destination_ref: str
    message: str
    priority: str
    meta: Mapping[str, Any] | None = field(hash=False)
    reply_to_id: str

    def fingerprint_input(self) -> FingerprintInput:
        return FingerprintInput(
            destination_kind=self.destination_kind,
            destination_ref=self.destination_ref,
            reply_to_id=self.reply_to_id,
            priority=self.priority,
            meta=self.meta,
            body=self.message,
        )

    def fingerprint(self) -> bytes:
        """The request fingerprint (computed once per request)."""
        return self._fingerprint

    def payload(self) -> bytes:
        """The bytes stored in ``outbox.payload``: what the drain loop re-sends on every attempt (computed once)."""
        return self._payload

    # cached_property writes the instance __dict__ directly, so it works on a frozen dataclass; not a field, so it
    # takes no part in equality or hashing.
    @functools.cached_property
    def _fingerprint(self) -> bytes:
        return request_fingerprint(self.fingerprint_input())

    @functools.cached_property
    def _payload(self) -> bytes:
        document = {
            "to": self.to,
            "destination_kind": self.destination_kind,
            "destination_ref": self.destination_ref,
            "message": self.message,
            "priority": self.priority,
            "meta": dict(self.meta) if self.meta else None,
            "reply_to_id": self.reply_to_id,
        }
        return json.dumps(document, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode("utf-8")


def load_payload(payload: bytes) -> dict[str, Any]:
    """Inverse of ``SendRequest.payload``."""
    return json.loads(payload.decode("utf-8"))


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Strict JSON: UTF-8, one object, no duplicate keys, no NaN/Infinity, within the JSON limits (E-40)."""
    try:
        # req: IPC-REQUEST-STRICT, LIMIT-JSON -- NaN, Infinity and trailing data are Unparsable
        document = loads(raw, object_pairs_hook=unique_keys)
    except DuplicateKey as exc:
        # req: IPC-REQUEST-STRICT -- RFC 7493 I-JSON
        raise RequestError("invalid_json", str(exc)) from exc
    except Unparsable as exc:
        raise RequestError("invalid_json", f"body: {exc}") from exc
    except LimitExceeded as exc:
        raise RequestError("limit_exceeded", f"body: {exc.detail} ({exc.limit})") from exc
    if not isinstance(document, dict):
        raise RequestError("invalid_request", "body must be a JSON object")
    return document


def is_client_message_id(value: object) -> bool:
    """E-02's id grammar (spec/schemas/common/defs.json ``client_message_id``)."""
    return fast_validator("common/defs#/$defs/client_message_id").is_valid(value)


def is_broker_message_id(value: object) -> bool:
    """The shape of a broker_message_id (spec/schemas/common/defs.json ``broker_message_id``)."""
    return fast_validator("common/defs#/$defs/broker_message_id").is_valid(value)


def parse_send(raw: bytes, idempotency_key: str | None = None) -> SendRequest:
    """Validate a POST /v1/send body and the ``Idempotency-Key`` header (E-01, E-02, E-04, E-18, E-19).

    Raises:
        RequestError: with the error code to answer; nothing has been consumed.
    """
    document = parse_json_object(raw)
    return validate_send(document, idempotency_key)


def _bad(name: str, reason: str, code: str = "invalid_request") -> RequestError:
    return RequestError(code, f"{name}: {reason}", ((name, reason),))


def validate_send(document: Mapping[str, Any], idempotency_key: str | None = None) -> SendRequest:
    """Validate an already-parsed send body; see ``parse_send``."""
    unknown = sorted(set(document) - SEND_MEMBERS)
    # req: IPC-REQUEST-STRICT
    if unknown:
        raise _bad(unknown[0], "unknown member")
    # req: IPC-ID-GRAMMAR
    if idempotency_key is not None and not is_client_message_id(idempotency_key):
        raise _bad("Idempotency-Key", "does not match the id grammar", "invalid_client_message_id")
    body_id = document.get("client_message_id")
    if body_id is not None and not is_client_message_id(body_id):
        raise _bad("client_message_id", "does not match the id grammar", "invalid_client_message_id")
    to = document.get("to")
    if not isinstance(to, str) or not to:
        raise _bad("to", "required non-empty string")
    message = document.get("message")
    # req: IPC-REQUEST-STRICT
    if not isinstance(message, str) or not message:
        raise _bad("message", "required non-empty string")
    priority = document.get("priority")
    # req: FP-DEFAULTS
    if priority is None:
        priority = DEFAULT_PRIORITY
    elif priority not in PRIORITIES:
        raise _bad("priority", f"must be one of {', '.join(PRIORITIES)}")
    meta = document.get("meta")
    if meta is not None and not isinstance(meta, dict):
        raise _bad("meta", "must be an object or null")
    reply_to_id = document.get("reply_to_id")
    # req: FP-DEFAULTS, IPC-REQUEST-STRICT
    if reply_to_id is None:
        reply_to_id = ""
    elif not isinstance(reply_to_id, str):
        raise _bad("reply_to_id", "must be a string or null")
    elif reply_to_id and not is_broker_message_id(reply_to_id):
        raise _bad("reply_to_id", "is not a broker_message_id")
    try:
        # req: DEST-GRAMMAR
        destination = parse_destination(to)
    except DestinationError as exc:
        raise _bad("to", str(exc), "destination_unresolvable") from exc
    try:
        # req: FP-META-REPRESENTABLE
        meta_canonical(meta)
        message.encode("utf-8")
    except MetaError as exc:
        raise _bad("meta", str(exc), "meta_not_canonicalizable") from exc
    except UnicodeEncodeError as exc:
        raise _bad("message", "is not valid Unicode text", "invalid_request") from exc
    return SendRequest(
        # req: IPC-ID-PRECEDENCE
        client_message_id=idempotency_key if idempotency_key is not None else body_id,
        to=to,
        destination_kind=destination.kind,
        destination_ref=destination.ref,
        message=message,
        priority=priority,
        meta=meta or None,
        reply_to_id=reply_to_id,
    )
