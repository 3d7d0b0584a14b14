"""The accept path: a ``send`` frame checked on its connection's thread, then committed with others in one group.

Theory of operation. A ``send`` is checked against its schema and the JSON limits on the connection thread (a
failure is B1 ``invalid_frame`` or ``limit_exceeded``, answered with a 4xx ack and nothing written; without a usable
client_message_id it is an ``error`` frame, E-28) and queued for an accept writer; a connection may have several
sends in flight, as a daemon draining its outbox does, bounded per connection (its session's ``inflight``). The B1
size limit is the advertised ``max_payload.inline_bytes``; the rate limit is a per-member token bucket
(_ratelimit.py) the store consults last.

Group commit. An accept writer takes every queued send (up to ``GROUP_MAX``), from whichever connections, and hands
them to ``store.accept_batch``: one write transaction, each send from its own savepoint through the whole §4.7.2
sequence (B1 reads, claim, read-back, B2, inserts), whatever a send must not keep rolled back to its savepoint, then
one COMMIT for the group, so one fsync makes many 201s durable. A key appears at most once per transaction (a repeat
waits for the next one), so a duplicate is only ever answered from a committed dedupe row, as without grouping. Only
when ``accept_batch`` has returned, the COMMIT done, does the writer trace the decision and send the ack
(``AcceptResult.ack_frame``); a failed COMMIT turns the group's 201s into 500s (BRK-COMMIT-FAIL). Sends queue while
a group commits, so the groups grow with the load and a lone send is committed at once. SQLite has one writer at a
time anyway, so it gets one accept writer; PostgreSQL gets two, so one group runs while the other waits for its
COMMIT. Sends in flight together have no order among them (as before grouping): a group runs in key order, whatever
order its sends arrived in. After a commit the recipients that are connected are due for the dispatcher.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import Any

from websockets.exceptions import ConnectionClosed

from reference.core import broker_accept

from ._frames import CLIENT_MESSAGE_ID, FINGERPRINT_HEX, MAX_DETAIL, DaemonFrames, error_frame
from ._presence import Presence, Session
from .store import EFFECTS, AcceptChecks, AcceptRequest, AcceptResult, BrokerStore

log = logging.getLogger("meshbroker")

#: table row -> phase, for the accept_decision trace (spec/tables/broker_accept.yaml)
PHASE = {row.id: row.then["phase"] for row in broker_accept.table().rows}
#: the most sends one group transaction takes (PostgreSQL keeps 64 subtransaction ids per transaction in shared
#: memory; more make every other session's visibility checks slower)
GROUP_MAX = 64
#: accept writers per store engine: SQLite has one writer at a time anyway; on PostgreSQL a second one runs the next
#: group while the first waits for its COMMIT (groups take their row locks in key order, so they cannot deadlock)
ACCEPT_WRITERS = {"sqlite": 1, "postgres": 2}

Emit = Callable[..., None]


def trace_accept(emit: Emit | None, session: Session, request: AcceptRequest, result: AcceptResult) -> None:
    """Trace one committed decision: its ``accept_commit`` (if it committed), then its ``accept_decision``."""
    if result.table_row is None:  # a store fault before the decision started: no table row decided it
        log.warning("accept of %s: store fault before the decision (%s)", request.client_message_id,
                    result.body.get("detail"))
        return
    if emit is None:  # tracing is off: build no event
        return
    answered = result.body.get("broker_message_id") if result.http_status in (200, 201) else None
    # The commit first: a broker stopped between the two writes leaves a commit without its decision, which the
    # trace checks allow (TRC-SIDE-EFFECTS), never a BRK-ACCEPT decision without its commit.
    if result.committed:
        emit("accept_commit", mesh=request.mesh_id, client_message_id=request.client_message_id,
             broker_message_id=answered, request_fingerprint=request.request_fingerprint.hex(),
             destination_kind=request.destination_kind, destination_ref=request.destination_ref,
             effects=dict(result.effects), recipients=len(result.recipients))
    emit("accept_decision", mesh=request.mesh_id, client_message_id=request.client_message_id,
         request_fingerprint=request.request_fingerprint.hex(), table_row=result.table_row,
         phase=PHASE[result.table_row], status=result.http_status, broker_message_id=answered,
         member=session.pubkey)


class AcceptWriter:
    """Takes ``send`` frames (``submit``) and commits them group by group on its writer threads.

    Args:
        checks: the B1 checks the store applies (payload size, rate limit).
        writer: the lock every store write of this process takes (SQLite's one writer).
        new_id: mints broker_message_id and history_id values.
        decided: ``decided(session, request, result)`` after the COMMIT, before the ack (traces it).
        dev_topic: ``--dev``: creates a send's topic on first use (None otherwise).
        due: marks members due for the delivery dispatcher.
    """

    def __init__(self, store: BrokerStore, presence: Presence, frames: DaemonFrames, checks: AcceptChecks, *,
                 writer: Any, new_id: Callable[[], str], now_ms: Callable[[], int], emit: Emit,
                 decided: Callable[[Session, AcceptRequest, AcceptResult], None],
                 dev_topic: Callable[[str, str], None] | None, due: Callable[[Any], None]):
        self.store = store
        self.presence = presence
        self.frames = frames
        self.checks = checks
        self.writer = writer
        self.new_id = new_id
        self.now_ms = now_ms
        self.emit = emit
        self.decided = decided
        self.dev_topic = dev_topic
        self.due = due
        #: sends waiting for the accept writer: (session, request)
        self._sends: collections.deque[tuple[Session, AcceptRequest]] = collections.deque()
        self._sends_ready = threading.Condition()
        self._sends_closed = False
        self._threads: list[threading.Thread] = []

    def start(self, writers: int) -> None:
        for number in range(writers):
            thread = threading.Thread(target=self._loop, name=f"meshbroker-accept-writer-{number}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Commit what is queued, then end the writer threads; a send after this closes its connection."""
        with self._sends_ready:
            self._sends_closed = True
            self._sends_ready.notify_all()
        for thread in self._threads:
            thread.join()

    def submit(self, session: Session, frame: dict[str, Any], limited: str | None = None) -> None:
        """Take one ``send`` frame (``limited``: the JSON limit it goes past): refuse it in B1 or queue it."""
        problem = limited or self.frames.problem(frame)
        if problem is None and frame["id"] != frame["client_message_id"]:
            problem = "id must equal client_message_id"
        if problem is not None:
            cmid = frame.get("client_message_id")
            # req: BRK-B1-NO-WRITE, BRK-FRAME-LIMITS -- a send past the schema or the limits: a B1 ack, nothing written
            if isinstance(cmid, str) and CLIENT_MESSAGE_ID.fullmatch(cmid):
                self._reject_frame(session, frame, cmid, problem[:MAX_DETAIL], "limits" if limited else "schema")
            else:
                session.send(error_frame("invalid_frame", f"send without a usable client_message_id: {problem}"))
            return
        request = AcceptRequest(
            mesh_id=session.mesh_id, sender_pubkey=session.pubkey, client_message_id=frame["client_message_id"],
            request_fingerprint=bytes.fromhex(frame["request_fingerprint"]),
            destination_kind=frame["destination_kind"], destination_ref=frame["destination_ref"],
            priority=frame["priority"], reply_to_id=frame["reply_to_id"], meta=frame["meta"], body=frame["body"],
            received_at_ms=self.now_ms(),
        )
        assert session.inflight is not None
        session.inflight.acquire()
        with self._sends_ready:
            if self._sends_closed:  # the broker is stopping
                session.inflight.release()
                raise ConnectionClosed(None, None) from None
            self._sends.append((session, request))
            self._sends_ready.notify()

    def _reject_frame(self, session: Session, frame: dict[str, Any], cmid: str, problem: str,
                      check: str = "schema") -> None:
        """B1 schema (or limits) failure with a usable client_message_id: a 4xx ack, nothing written (BRK-B1-REJECT)."""
        status, error = broker_accept.check_status("B1", check)
        result = AcceptResult("BRK-B1-REJECT", status, {"client_message_id": cmid, "error": error, "detail": problem},
                              dict.fromkeys(EFFECTS, 0))
        claimed = frame.get("request_fingerprint")
        self.emit("accept_decision", mesh=session.mesh_id, client_message_id=cmid,
                  request_fingerprint=claimed if isinstance(claimed, str) and FINGERPRINT_HEX.fullmatch(claimed)
                  else None, table_row=result.table_row, phase="B1", status=status, broker_message_id=None,
                  member=session.pubkey)
        session.send(result.ack_frame())

    def _loop(self) -> None:
        """One accept writer: commit the queued sends group by group until stopped and the queue is empty."""
        while True:
            with self._sends_ready:
                while not self._sends and not self._sends_closed:
                    self._sends_ready.wait()
                if not self._sends:
                    return
                group = [self._sends.popleft() for _ in range(min(GROUP_MAX, len(self._sends)))]
            try:
                self._accept_group(group)
            except Exception:
                log.exception("a group of %d sends failed outside the store", len(group))

    def _accept_group(self, group: list[tuple[Session, AcceptRequest]]) -> None:
        """Dev-mode topics, the store's group transaction, then (after its COMMIT) traces, acks and the dispatcher."""
        calls: list[tuple[AcceptRequest, str, str]] = []
        sessions: list[Session] = []
        try:
            for session, request in group:
                try:
                    if self.dev_topic is not None and request.destination_kind == "topic":
                        self.dev_topic(request.mesh_id, request.destination_ref)
                except Exception:
                    log.exception("accept of %s failed outside the store", request.client_message_id)
                    assert session.inflight is not None
                    session.inflight.release()
                    continue
                calls.append((request, self.new_id(), self.new_id()))
                sessions.append(session)
            with self.writer:
                results = self.store.accept_batch(calls, self.checks)
        except BaseException:
            for session in sessions:
                assert session.inflight is not None
                session.inflight.release()
            raise
        online: set[str] = set()
        for session, (request, _, _), result in zip(sessions, calls, results, strict=True):
            try:
                self.decided(session, request, result)
                online.update(pubkey for pubkey in result.recipients if self.presence.is_connected(pubkey))
                # req: BRK-DELIVERY-COMMITTED -- acks and pushes only after accept_batch's COMMIT
                session.send(result.ack_frame())
            except Exception:
                log.exception("accept of %s failed outside the store", request.client_message_id)
            finally:
                assert session.inflight is not None
                session.inflight.release()
        if online:
            # req: BRK-DELIVERY-COMMITTED
            self.due(online)
