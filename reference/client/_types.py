"""The typed results of the /v1 routes: one frozen dataclass per schema of spec/openapi.yaml, named as it is.

Each class's fields are its schema's properties, in order (tests/client/test_types.py holds them to the document).
``from_json`` takes the members it knows and leaves out the ones a newer daemon may add, so a client keeps working
against a daemon of a later /v1 minor version.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


class _FromJson:
    @classmethod
    def from_json(cls, document: dict[str, Any]):
        """The result a JSON object decodes to; members this client does not know are dropped."""
        return cls(**{f.name: document.get(f.name) for f in fields(cls) if f.name in document or f.default is None})


@dataclass(frozen=True)
class SendResult(_FromJson):
    """``SendAccepted`` (202: stored, or a retry of a pending row) or ``SendDuplicate`` (200: delivered before)."""

    client_message_id: str
    status: str
    duplicate: bool
    request_fingerprint: str
    broker_message_id: str | None = None
    history_id: str | None = None


@dataclass(frozen=True)
class InboxItem(_FromJson):
    """One received message (``InboxItem``)."""

    id: str
    seq: int
    client_message_id: str | None
    broker_message_id: str | None
    mesh: str
    topic: str | None
    sender_pubkey: str
    sender_name: str | None
    body: str | None
    meta: Any
    received_at: str
    reply_to_id: str | None


@dataclass(frozen=True)
class InboxPage:
    """``InboxPage``: the items, and the cursor to resume from (even after the last page)."""

    items: list[InboxItem]
    next_cursor: str | None

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> InboxPage:
        return cls([InboxItem.from_json(item) for item in document["items"]], document.get("next_cursor"))


@dataclass(frozen=True)
class OutboxItem(_FromJson):
    """One outbox row (``OutboxItem``)."""

    id: str
    client_message_id: str
    status: str
    attempts: int
    enqueued_at: str
    next_attempt_at: str | None
    delivered_at: str | None
    broker_message_id: str | None
    history_id: str | None
    last_error: str | None
    aborted_at: str | None
    aborted_by: str | None
    superseded_by: str | None
    request_fingerprint: str
    payload_bytes: int


@dataclass(frozen=True)
class OutboxPage:
    """``OutboxPage``."""

    items: list[OutboxItem]
    next_cursor: str | None

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> OutboxPage:
        return cls([OutboxItem.from_json(item) for item in document["items"]], document.get("next_cursor"))


@dataclass(frozen=True)
class Version(_FromJson):
    """``GET /v1/version``."""

    daemon_version: str
    ipc_api: str
    ipc_features: list[str]
    schema_version: int
    broker_features_negotiated: list[str]
    broker_feature_params: dict[str, Any]


@dataclass(frozen=True)
class Health(_FromJson):
    """``GET /v1/health``."""

    ok: bool
    connected: bool
    lag_ms: int | None
    queue_depth: int
    inflight: int
    mesh: str
    member_pubkey: str
    uptime_s: float
    schema_version: int
    daemon_version: str
    broker_version: str | None
    pid: int
    link_restarts: int | None = None
    link_last_failure: str | None = None
    quarantined: int | None = None


@dataclass(frozen=True)
class RequeueResult(_FromJson):
    """``POST /v1/outbox/requeue``."""

    aborted_row_id: str
    new_row_id: str
    new_client_message_id: str


@dataclass(frozen=True)
class ProfileResult(_FromJson):
    """``POST /v1/profile``."""

    ok: bool
    applied: list[str]


@dataclass(frozen=True)
class Event:
    """One server-sent event of ``GET /v1/events``: its id (None for ``replay_gap``), name and JSON data."""

    id: int | None
    event: str
    data: Any = field(default=None)
