"""Who is connected: the broker's in-memory sessions, the concurrent connection policy, peers_list and the
peer_joined / peer_left system pushes.

Rules of this file: one lock guards the registry; no I/O happens under it (callers get back the sessions to notify
or close and do that themselves). A session is *admitted* at hello (the policy decides then: prefer_newest replaces
the member's older sessions, prefer_oldest refuses the newcomer, allow_concurrent keeps both) and *active* once
negotiation finished; only active sessions are listed, pushed to and announced. A member is announced (peer_joined)
when its first session becomes active and its departure (peer_left) when its last session goes; a session replaced
under prefer_newest goes silently, its successor carrying the member's presence on.

Outbound frames (E-33). ``Session.send`` never writes to the socket: it queues the serialised frame and returns, and
the session's own sender thread (started on the first send, ended when the connection ends) writes the queue in
order. So a member that stops reading blocks only its own sender, never the accept writer or the database pool that
push to everyone. A session whose queued bytes pass ``max_outbound_bytes`` counts as not reading: its queue is
dropped and the connection closed with 1013 ``slow_consumer`` (what it had not acked is pushed again after the
lease; what it sent unacked its daemon retries). Whoever closes a session after sending it frames calls
``Session.close``, which flushes the queue (bounded) first.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.protocol import State
from websockets.sync.server import ServerConnection

from reference.core.codes import close_code
from reference.core.limits import limit
from spec import schema

log = logging.getLogger("meshbroker")

#: the members of a set_profile frame (spec/schemas/broker/set_profile.json)
PROFILE_FIELDS = tuple(member for member in schema("broker/set_profile")["properties"] if member != "type")
#: unread outbound bytes a session may hold before the broker closes it as a slow consumer (E-33)
MAX_OUTBOUND_BYTES = int(limit("broker_outbound_bytes"))
#: the close of a slow consumer: 1013 "Try Again Later" with the reason close_codes.yaml lists for it (E-33)
SLOW_CONSUMER = (close_code("try_again_later"), "slow_consumer")
#: how long a close waits for the frames queued before it to be written
FLUSH_S = 2.0
#: how long a close frame may wait behind a write the peer does not read before the TCP connection is aborted
CLOSE_GRACE_S = 5.0


@dataclass(eq=False)
class Session:
    """One authenticated WebSocket connection of a mesh member."""

    conn: ServerConnection
    mesh_id: str
    pubkey: str
    member_id: str
    session_id: str
    display_name: str
    connected_at: str
    peer_type: str | None = None
    channel: str | None = None
    hostname: str | None = None
    status: str = "idle"
    summary: str | None = None
    visible: bool = True
    profile: dict[str, Any] = field(default_factory=dict)
    active: bool = False
    inflight: threading.BoundedSemaphore | None = None

    max_outbound_bytes: int = MAX_OUTBOUND_BYTES
    _outbound: collections.deque[bytes] = field(default_factory=collections.deque, init=False, repr=False)
    _outbound_bytes: int = field(default=0, init=False, repr=False)
    _outbound_closed: bool = field(default=False, init=False, repr=False)
    _outbound_ready: threading.Condition = field(default_factory=threading.Condition, init=False, repr=False)
    _sender: threading.Thread | None = field(default=None, init=False, repr=False)

    def send(self, frame: dict[str, Any]) -> bool:
        """Queue one frame for this session's sender thread; False when the outbound side is closed (the connection
        ended, or this frame made the session a slow consumer)."""
        data = json.dumps(frame, separators=(",", ":"), ensure_ascii=False).encode()
        with self._outbound_ready:
            if self._outbound_closed:
                return False
            # req: BRK-SLOW-CONSUMER
            if self._outbound and self._outbound_bytes + len(data) > self.max_outbound_bytes:
                queued = self._outbound_bytes
                self._stop_outbound()
                slow = True
            else:
                self._outbound.append(data)
                self._outbound_bytes += len(data)
                self._outbound_ready.notify_all()
                slow = False
                if self._sender is None:
                    self._sender = threading.Thread(target=self._send_loop, daemon=True,
                                                    name=f"meshbroker-sender-{self.session_id}")
                    self._sender.start()
        if slow:
            log.warning("session %s is a slow consumer (%d bytes unread): closing %d %s", self.session_id, queued,
                        *SLOW_CONSUMER)
            threading.Thread(target=self.close, args=SLOW_CONSUMER, kwargs={"flush_s": 0}, daemon=True,
                             name=f"meshbroker-close-{self.session_id}").start()
            return False
        return True

    def _send_loop(self) -> None:
        """The sender thread: write the queue in order until the outbound side closes."""
        while True:
            with self._outbound_ready:
                while not self._outbound and not self._outbound_closed:
                    self._outbound_ready.wait()
                if self._outbound_closed:
                    return
                data = self._outbound[0]
            try:
                self.conn.send(data, text=True)
            except ConnectionClosed:
                with self._outbound_ready:
                    self._stop_outbound()
                return
            with self._outbound_ready:
                if self._outbound and self._outbound[0] is data:  # not dropped meanwhile
                    self._outbound.popleft()
                    self._outbound_bytes -= len(data)
                self._outbound_ready.notify_all()

    def _stop_outbound(self) -> None:
        """Drop the queue and let the sender end (hold ``_outbound_ready``)."""
        self._outbound_closed = True
        self._outbound.clear()
        self._outbound_bytes = 0
        self._outbound_ready.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s until every queued frame is written; False when some were not."""
        deadline = time.monotonic() + timeout
        with self._outbound_ready:
            while self._outbound and not self._outbound_closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._outbound_ready.wait(remaining)
            return not self._outbound

    def end(self) -> None:
        """The connection ended: drop what is queued and let the sender thread exit."""
        with self._outbound_ready:
            self._stop_outbound()

    def close(self, code: int, reason: str, *, flush_s: float = FLUSH_S) -> None:
        """Flush the queue (up to ``flush_s``), then close the connection with ``code``. A close frame cannot pass a
        write the peer does not read (websockets writes under one lock): after ``CLOSE_GRACE_S`` the TCP
        connection is aborted instead, which ends that write."""
        self.flush(flush_s)
        self.end()
        closer = threading.Thread(target=self.conn.close, args=(code, reason), daemon=True,
                                  name=f"meshbroker-closer-{self.session_id}")
        closer.start()
        closer.join(CLOSE_GRACE_S)
        if closer.is_alive():
            log.warning("session %s: close %d %s is stuck behind an unread write; aborting the connection",
                        self.session_id, code, reason)
            with contextlib.suppress(OSError):
                self.conn.socket.shutdown(socket.SHUT_RDWR)
            closer.join(CLOSE_GRACE_S)

    def peer(self) -> dict[str, Any]:
        """This session as a peers_list entry (upstream camelCase members; the entry is an open object)."""
        entry: dict[str, Any] = {
            "pubkey": self.pubkey, "displayName": self.display_name, "memberId": self.member_id,
            "sessionId": self.session_id, "status": self.status, "summary": self.summary, "visible": self.visible,
            "connectedAt": self.connected_at,
        }
        for name, value in (("peerType", self.peer_type), ("channel", self.channel), ("hostname", self.hostname)):
            if value is not None:
                entry[name] = value
        entry.update(self.profile)
        return entry


class Presence:
    """The registry of sessions per (mesh, member)."""

    def __init__(self, policy: str):
        self.policy = policy
        self._lock = threading.Lock()
        self._sessions: dict[tuple[str, str], list[Session]] = {}
        self._active: dict[str, list[Session]] = {}  # pubkey -> its active sessions, in any mesh
        self._announced: set[tuple[str, str]] = set()  # members the others were told peer_joined (and not left)

    def admit(self, session: Session) -> tuple[bool, list[Session]]:
        """Apply the connection policy at hello: (admitted?, older sessions the caller must close with 4003)."""
        key = (session.mesh_id, session.pubkey)
        with self._lock:
            existing = self._sessions.get(key, [])
            if existing and self.policy == "prefer_oldest":
                return False, []
            if self.policy == "prefer_newest":
                for old in existing:
                    self._deactivate(old)
                self._sessions[key] = [session]
                return True, existing
            self._sessions[key] = [*existing, session]
            return True, []

    def activate(self, session: Session) -> list[Session]:
        """Mark ``session`` active; returns the other members' sessions to tell peer_joined (empty when the member
        was already announced, e.g. this session replaced an older one, or the session is gone meanwhile)."""
        key = (session.mesh_id, session.pubkey)
        with self._lock:
            if session not in self._sessions.get(key, []):
                return []
            session.active = True
            self._active.setdefault(session.pubkey, []).append(session)
            if key in self._announced:
                return []
            self._announced.add(key)
            return self._others(session)

    def remove(self, session: Session) -> list[Session]:
        """Forget ``session``; returns the sessions to tell peer_left (empty unless the member has no active session
        left in the mesh and was announced)."""
        key = (session.mesh_id, session.pubkey)
        with self._lock:
            mine = self._sessions.get(key, [])
            if session not in mine:
                return []  # replaced: its successor carries the member's presence on
            mine.remove(session)
            self._deactivate(session)
            if not mine:
                del self._sessions[key]
            if any(other.active for other in mine) or key not in self._announced:
                return []
            self._announced.discard(key)
            return self._others(session)

    def _deactivate(self, session: Session) -> None:
        if not session.active:
            return
        session.active = False
        left = self._active[session.pubkey]
        left.remove(session)
        if not left:
            del self._active[session.pubkey]

    def _others(self, session: Session) -> list[Session]:
        return [other for (mesh, pubkey), sessions in self._sessions.items()
                if mesh == session.mesh_id and pubkey != session.pubkey for other in sessions if other.active]

    def peers(self, asking: Session) -> list[dict[str, Any]]:
        """The peers_list entries ``asking`` sees: every other visible active session of its mesh."""
        with self._lock:
            return [other.peer() for other in self._others(asking) if other.visible]

    def target(self, mesh_id: str, pubkey: str) -> Session | None:
        """The member's newest active session in ``mesh_id`` (where its pushes go), or None."""
        with self._lock:
            active = [s for s in self._sessions.get((mesh_id, pubkey), []) if s.active]
        return active[-1] if active else None

    def connected(self) -> set[str]:
        """The pubkeys with at least one active session, in any mesh."""
        with self._lock:
            return set(self._active)

    def is_connected(self, pubkey: str) -> bool:
        return pubkey in self._active  # a dict lookup is atomic; a stale answer only delays a push to the next tick

    def is_open(self, pubkey: str) -> bool:
        """The member has an active session whose connection is still open: one the WebSocket layer is closing
        (1009 for a frame past the limit, a close the broker started) takes no new lease -- it could never be acked."""
        with self._lock:
            sessions = list(self._active.get(pubkey, ()))
        return any(s.conn.state is State.OPEN for s in sessions)

    def update(self, session: Session, **changes: Any) -> None:
        """Apply a set_summary / set_status / set_visible / set_profile frame's members."""
        with self._lock:
            for name, value in changes.items():
                if name in PROFILE_FIELDS:
                    session.profile[name] = value
                else:
                    setattr(session, name, value)

    def all(self) -> list[Session]:
        with self._lock:
            return [s for sessions in self._sessions.values() for s in sessions]
