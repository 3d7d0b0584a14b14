"""Fan-out: push committed deliveries to connected recipients, again after each lapsed lease, until client_ack.

Theory of operation. The delivery rows are the authority (§4.7.1: they commit with the message, so nothing
uncommitted can ever be pushed). One dispatcher thread decides *whom* to serve: a recipient is due when a commit
named it, when it connected, and on every tick (a fraction of the lease, so a lapsed lease is noticed in time).
Serving a recipient runs on the broker's database pool: lease its due rows (``pending_deliveries``: attempt + 1,
lease until now + lease), push each to the member's newest session in the row's mesh, repeat while full batches
come back. At most one job per recipient runs at a time. A push that finds no session (the connection went away)
is simply not made: the lease lapses and the row is leased again, to whichever session is there then.

``Deliveries`` is what serving does: each leased row is traced with its lease under the writer lock (E-32), so a
client_ack of an earlier attempt, committed and traced after this lease, never precedes it in the trace. A
``client_ack`` settles its row only when it names a delivery of that message to the acking member; any other gets an
``unknown_delivery`` error and settles nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from websockets.exceptions import ConnectionClosed

from reference.broker.store import BrokerStore, Delivery, rfc3339_ms

from ._frames import error_frame
from ._presence import Presence, Session

log = logging.getLogger("meshbroker.delivery")
BATCH = 100


def push_frame(delivery: Delivery, sender_name: str | None = None) -> dict[str, Any]:
    """The message ``push`` frame (spec/schemas/broker/push.json) for one leased delivery row."""
    frame: dict[str, Any] = {
        "type": "push", "messageId": delivery.broker_message_id, "meshId": delivery.mesh_id,
        "senderPubkey": delivery.sender_pubkey,
        "topic": delivery.destination_ref if delivery.destination_kind == "topic" else None,
        "replyToId": delivery.reply_to_id or None, "priority": delivery.priority, "body": delivery.body,
        "meta": dict(delivery.meta) if delivery.meta is not None else None,
        "createdAt": rfc3339_ms(delivery.created_at_ms), "client_message_id": delivery.client_message_id,
        "delivery_id": str(delivery.delivery_id), "attempt": delivery.attempt,
    }
    if sender_name:
        frame["senderName"] = sender_name
    return frame


class Dispatcher(threading.Thread):
    """The delivery dispatcher; ``due(pubkeys)`` wakes it, ``stop()`` ends it.

    Args:
        pool: where the store calls run (the broker's bounded database pool).
        lease: ``lease(recipient) -> [Delivery]`` leases that recipient's due rows.
        deliver: ``deliver(delivery) -> bool`` pushes one row to its recipient's session (False: nobody to push to).
        connected: ``connected() -> set[pubkey]`` every member with an active session.
        tick_s: how often every connected member is looked at regardless of commits.
    """

    def __init__(self, pool: Executor, lease: Callable[[str], list[Delivery]], deliver: Callable[[Delivery], bool],
                 connected: Callable[[], set[str]], tick_s: float):
        super().__init__(name="meshbroker-dispatcher", daemon=True)
        self.pool = pool
        self.lease = lease
        self.deliver = deliver
        self.connected = connected
        self.tick_s = tick_s
        self._cond = threading.Condition()
        self._due: set[str] = set()
        self._busy: set[str] = set()
        self._stopping = False

    def due(self, pubkeys: Any) -> None:
        """Serve these recipients soon (a commit named them, or they just connected)."""
        with self._cond:
            self._due.update(pubkeys)
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def run(self) -> None:
        next_tick = time.monotonic() + self.tick_s
        while True:
            with self._cond:
                while not self._stopping and not (self._due - self._busy) and time.monotonic() < next_tick:
                    self._cond.wait(max(0.0, next_tick - time.monotonic()))
                if self._stopping:
                    return
                ticked = time.monotonic() >= next_tick
                wanted = set(self._due)
            connected = self.connected()
            if ticked:
                # req: BRK-REDELIVER -- every tick looks at every connected member, so a lapsed lease is pushed again
                wanted |= connected
                next_tick = time.monotonic() + self.tick_s
            with self._cond:
                self._due -= wanted - connected  # nobody to push to: their rows wait for them to connect
                start = (wanted & connected) - self._busy
                self._due -= start
                self._busy |= start
            for pubkey in start:
                try:
                    self.pool.submit(self._serve, pubkey)
                except RuntimeError:  # the pool is shutting down
                    return

    def _serve(self, pubkey: str) -> None:
        try:
            while True:
                rows = self.lease(pubkey)
                for delivery in rows:
                    self.deliver(delivery)
                if len(rows) < BATCH:
                    break
        except Exception:
            log.exception("delivery to %s failed; its rows are leased again after the lease", pubkey)
        finally:
            with self._cond:
                self._busy.discard(pubkey)
                self._cond.notify()


class Deliveries:
    """Leases a recipient's due rows (traced), pushes one row to its recipient, and takes ``client_ack`` frames.

    Args:
        pool: where the acks' store calls run (the broker's bounded database pool).
        writer: the lock every store write of this process takes (SQLite's one writer).
        lease_ms: how long a pushed row stays leased to its recipient.
        emit: writes a trace event.
    """

    def __init__(self, store: BrokerStore, presence: Presence, pool: Executor, *, writer: Any,
                 now_ms: Callable[[], int], lease_ms: int, emit: Callable[..., None]):
        self.store = store
        self.presence = presence
        self.pool = pool
        self.writer = writer
        self.now_ms = now_ms
        self.lease_ms = lease_ms
        self.emit = emit

    def lease(self, pubkey: str) -> list[Delivery]:
        """Lease the member's due deliveries; each is traced with its lease, under the writer lock (E-32): a
        client_ack of an earlier attempt, committed and traced after this lease, can never precede it in the trace."""
        if not self.presence.is_open(pubkey):
            return []
        with self.writer:
            leased = self.store.pending_deliveries(pubkey, self.now_ms(), self.lease_ms, BATCH)
            for delivery in leased:
                if delivery.client_message_id is not None:
                    self.emit("delivery", mesh=delivery.mesh_id, broker_message_id=delivery.broker_message_id,
                              client_message_id=delivery.client_message_id, recipient=delivery.recipient_pubkey,
                              delivery_id=str(delivery.delivery_id), attempt=delivery.attempt,
                              lease_until_ms=delivery.lease_until_ms)
            return leased

    def deliver(self, delivery: Delivery) -> bool:
        session = self.presence.target(delivery.mesh_id, delivery.recipient_pubkey)
        if session is None or delivery.client_message_id is None:
            return False
        sender = self.presence.target(delivery.mesh_id, delivery.sender_pubkey)
        # Already traced by lease. A push the connection refuses stays leased; its redelivery is the next attempt.
        return session.send(push_frame(delivery, sender.display_name if sender else None))

    def on_client_ack(self, session: Session, frame: dict[str, Any]) -> None:
        delivery_id = frame["delivery_id"]
        # req: BRK-CLIENT-ACK
        if not delivery_id.isdigit():
            session.send(error_frame("unknown_delivery", f"no delivery {delivery_id[:64]!r}"))
            return
        assert session.inflight is not None
        session.inflight.acquire()
        try:
            self.pool.submit(self._ack, session, frame, int(delivery_id))
        except RuntimeError:
            session.inflight.release()
            raise ConnectionClosed(None, None) from None

    def _ack(self, session: Session, frame: dict[str, Any], delivery_id: int) -> None:
        try:
            with self.writer:
                acked = self.store.ack_delivery(delivery_id, session.pubkey, self.now_ms(),
                                                broker_message_id=frame["brokerMessageId"])
            if acked:
                self.emit("delivery_ack", mesh=session.mesh_id, broker_message_id=frame["brokerMessageId"],
                          client_message_id=frame["clientMessageId"], recipient=session.pubkey,
                          delivery_id=str(delivery_id))
            else:
                # req: BRK-CLIENT-ACK -- any other client_ack settles nothing
                session.send(error_frame("unknown_delivery", f"no delivery {delivery_id} of message "
                                         f"{frame['brokerMessageId'][:32]} for this member"))
        except Exception:
            log.exception("client_ack of delivery %s failed; it is delivered again after its lease", delivery_id)
        finally:
            assert session.inflight is not None
            session.inflight.release()
