"""The broker's storage interface: what the WebSocket server may ask of a store, and the values that cross it.

Rules of this file: nothing here knows an engine. ``BrokerStore`` is the whole surface the server uses; every engine
(``sqlite.py``, ``postgres.py``) implements it and passes the same contract tests (tests/broker). Times cross the
interface as unix milliseconds; ``first_seen_at`` leaves it as RFC 3339 inside ack bodies (E-10).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reference.clock import rfc3339_ms as rfc3339_ms  # the broker writes times as the daemon does
from spec import load_table

#: The §4.7.1 in-transaction effects, in the order AcceptResult.effects lists them.
EFFECTS = ("dedupe", "message", "history", "delivery")
#: a mesh's dedupe modes (spec/tables/features.yaml client_message_id_dedupe ``mode``)
DEDUPE_MODES = tuple(load_table("features")["bits"]["client_message_id_dedupe"]["required"]["mode"]["enum"])
DAY_MS = 86_400_000


def _no_wait(request: AcceptRequest) -> int | None:
    return None


def _allow_all(request: AcceptRequest) -> bool:
    return True


@dataclass(frozen=True)
class AcceptRequest:
    """One ``send`` frame as the broker's accept sees it, after the server's schema validation.

    ``request_fingerprint`` is the 32 bytes the daemon claims (E-21); the store recomputes its own from the other
    fields. ``dedupe_expires_at_ms``: ``None`` derives the expiry from the mesh (``permanent`` → never,
    ``retention_scoped`` → ``received_at_ms`` + ``retention_days``); a value is honoured in ``retention_scoped`` mode
    and ignored in ``permanent`` mode.
    """

    mesh_id: str
    sender_pubkey: str
    client_message_id: str
    request_fingerprint: bytes
    destination_kind: str
    destination_ref: str
    priority: str
    reply_to_id: str
    meta: Mapping[str, Any] | None
    body: str
    received_at_ms: int
    dedupe_expires_at_ms: int | None = None


@dataclass(frozen=True)
class AcceptChecks:
    """The B1 limits a store enforces besides membership, mesh and kind.

    ``max_payload_bytes`` is the advertised ``max_payload.inline_bytes`` (compared with the body's UTF-8 length);
    ``rate_limit`` answers whether this send may proceed (True) and is called last, so refused frames spend nothing;
    ``retry_after_ms`` says, for a send the rate limit refused, how long until it would pass (E-42), or None.
    """

    max_payload_bytes: int = 65_536
    rate_limit: Callable[[AcceptRequest], bool] = _allow_all
    retry_after_ms: Callable[[AcceptRequest], int | None] = _no_wait


@dataclass(frozen=True)
class AcceptResult:
    """The outcome of one accept: the table row that decided it, the ack's status and its §4.5b/E-10 body members.

    ``table_row`` is the spec/tables/broker_accept.yaml row id (``None`` only for a store fault before the decision
    could start, e.g. the database is unreachable during the B1 reads). ``effects`` counts the rows committed per
    §4.7.1 effect (all zero unless ``table_row`` is BRK-ACCEPT). ``recipients`` lists the pubkeys that received a
    delivery row, for the server's best-effort live push after commit. ``metric`` names the counter to increment.
    """

    table_row: str | None
    http_status: int
    body: Mapping[str, Any]
    effects: Mapping[str, int]
    recipients: tuple[str, ...] = ()
    metric: str | None = None

    @property
    def committed(self) -> bool:
        return self.http_status == 201

    def ack_frame(self) -> dict[str, Any]:
        """The whole E-10 ``ack`` frame: ``type``, ``status``, legacy ``id``/``messageId``/``queued``, then ``body``."""
        # req: WS-ACK-STATUS -- an integer status and the §4.5b members, beside the legacy id, messageId and queued
        queued = self.http_status in (200, 201)
        return {
            "type": "ack", "status": self.http_status, "id": self.body["client_message_id"],
            "messageId": self.body["broker_message_id"] if queued else "", "queued": queued, **self.body,
        }


@dataclass(frozen=True)
class Delivery:
    """A leased delivery row with the message it carries."""

    delivery_id: int
    mesh_id: str
    recipient_pubkey: str
    attempt: int
    lease_until_ms: int
    broker_message_id: str
    client_message_id: str | None
    history_id: str | None
    sender_pubkey: str
    destination_kind: str
    destination_ref: str
    priority: str
    reply_to_id: str
    meta: Mapping[str, Any] | None
    body: str
    created_at_ms: int


@dataclass(frozen=True)
class Violation:
    """One §4.7.3 inconsistency: ``kind`` says which rule, ``ref`` names the row, ``detail`` says it in words."""

    kind: str
    mesh_id: str
    ref: str
    detail: str = field(default="", compare=False)


class StoreError(RuntimeError):
    """The store is misused or in a state it cannot serve from (e.g. the schema is newer than this code)."""


class BrokerStore(abc.ABC):
    """The broker's durable state. Every method is safe to call from several threads at once."""

    checks: AcceptChecks

    @abc.abstractmethod
    def migrate(self) -> list[int]:
        """Apply the pending versioned migrations under the engine's lock; returns the versions applied now."""

    @abc.abstractmethod
    def add_mesh(self, mesh_id: str, slug: str, dedupe_mode: str, retention_days: int | None) -> None:
        """Create a mesh; ``retention_days`` (>= 3) is required in ``retention_scoped`` mode."""

    @abc.abstractmethod
    def add_member(self, mesh_id: str, pubkey: str, display_name: str = "") -> None:
        """Add a member (idempotent)."""

    @abc.abstractmethod
    def create_topic(self, mesh_id: str, topic: str) -> None:
        """Create a topic (idempotent)."""

    @abc.abstractmethod
    def subscribe(self, mesh_id: str, topic: str, pubkey: str) -> None:
        """Subscribe a member to a topic (idempotent; the topic must exist)."""

    @abc.abstractmethod
    def create_queue(self, mesh_id: str, queue_id: str, consumers: Iterable[str] = ()) -> None:
        """Create a queue and add ``consumers`` to it (idempotent; consumers must be members)."""

    @abc.abstractmethod
    def mesh_policy(self, mesh_id: str) -> dict[str, Any] | None:
        """``{dedupe_mode, retention_days}`` of the mesh, or None when there is no such mesh."""

    @abc.abstractmethod
    def is_member(self, mesh_id: str, pubkey: str) -> bool:
        """Whether ``pubkey`` is a member of the mesh (False for an unknown mesh)."""

    @abc.abstractmethod
    def members(self, mesh_id: str) -> list[dict[str, Any]]:
        """``[{pubkey, display_name}]`` of the mesh, by pubkey."""

    @abc.abstractmethod
    def topics(self, mesh_id: str) -> list[str]:
        """The mesh's topic names, sorted."""

    @abc.abstractmethod
    def prunable(self, before_ms: int) -> list[dict[str, Any]]:
        """``[{mesh_id, broker_message_id, client_message_id}]``, by broker_message_id: the messages
        ``prune_messages(before_ms)`` would delete whose dedupe row it would flip to ``history_available`` false."""

    @abc.abstractmethod
    def accept(
        self, req: AcceptRequest, broker_message_id: str, history_id: str, checks: AcceptChecks | None = None
    ) -> AcceptResult:
        """Decide and, for a first insert, commit one send (§4.7.2).

        Args:
            req: the frame's fields.
            broker_message_id: pre-generated in code (a ULID); the claim is ours iff the read-back returns it.
            history_id: the id the history row gets if this send commits.
            checks: B1 limits for this call; ``None`` uses the store's.

        Returns:
            The outcome; never raises for a database fault (that is a 500 result with ``error: internal_error``).
        """

    def accept_batch(
        self, calls: Sequence[tuple[AcceptRequest, str, str]], checks: AcceptChecks | None = None
    ) -> list[AcceptResult]:
        """Decide several sends, ``(req, broker_message_id, history_id)`` each, as ``accept`` decides each one.

        An engine may commit the first inserts of several sends in one transaction (group commit), each send keeping
        its own atomicity: whatever one send does not commit leaves nothing behind, and every 201 in the answer is
        durable when this returns. The answers come in the order of ``calls``; this default accepts one at a time.
        """
        return [self.accept(req, broker_message_id, history_id, checks)
                for req, broker_message_id, history_id in calls]

    @abc.abstractmethod
    def pending_deliveries(self, recipient: str, now_ms: int, lease_ms: int, limit: int = 100) -> list[Delivery]:
        """Lease up to ``limit`` unacked deliveries for ``recipient`` whose lease is unset or expired at ``now_ms``.

        Each returned row's ``attempt`` is one more than before and its lease runs to ``now_ms + lease_ms``: the
        caller pushes it, the recipient acks it (``ack_delivery``), or the lease lapses and it is leased again.
        """

    @abc.abstractmethod
    def ack_delivery(self, delivery_id: int, recipient: str, now_ms: int | None = None, *,
                     broker_message_id: str | None = None) -> bool:
        """Mark a delivery acked (idempotent); False if no such delivery belongs to ``recipient`` or, when
        ``broker_message_id`` is given (a client_ack's ``brokerMessageId``), carries another message (BRK-CLIENT-ACK:
        an ack whose ids disagree settles nothing)."""

    @abc.abstractmethod
    def prune_messages(self, before_ms: int) -> int:
        """Delete messages created before ``before_ms`` with their delivery rows and flip their dedupe rows'
        ``history_available`` to false, in one transaction; returns the number of messages deleted.

        A pruned message's history row is kept while a dedupe row names it, so a later duplicate still answers its
        ``history_id`` (E-28); without a dedupe row it is deleted with the message.
        """

    @abc.abstractmethod
    def expire_dedupe(self, now_ms: int) -> int:
        """Delete dedupe rows whose ``expires_at`` is before ``now_ms`` (never in ``permanent`` meshes), with the kept
        history rows of their already-pruned messages; returns the number of dedupe rows deleted."""

    @abc.abstractmethod
    def orphan_check(self, now_ms: int | None = None) -> list[Violation]:
        """The §4.7.3 inventory: every inconsistency between dedupe, message, history and delivery rows.

        A message whose dedupe row is missing is only a violation while that row could not have expired by the
        mesh's policy (``permanent``, or younger than ``retention_days`` at ``now_ms``; ``None`` means now).
        """

    @abc.abstractmethod
    def counts(self) -> dict[str, int]:
        """Rows per table, for tests and diagnostics."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close every connection the store opened."""

    def __enter__(self) -> BrokerStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
