"""Who is connected: the broker's in-memory sessions, the concurrent connection policy, peers_list and the
peer_joined / peer_left system pushes.

Rules of this file: one lock guards the registry; no I/O happens under it (callers get back the sessions to notify
or close and do that themselves). A session is *admitted* at hello (the policy decides then: prefer_newest replaces
the member's older sessions, prefer_oldest refuses the newcomer, allow_concurrent keeps both) and *active* once
negotiation finished; only active sessions are listed, pushed to and announced. A member is announced (peer_joined)
when its first session becomes active and its departure (peer_left) when its last session goes; a session replaced
under prefer_newest goes silently, its successor carrying the member's presence on.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection

PROFILE_FIELDS = ("avatar", "title", "bio", "capabilities")


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

    def send(self, frame: dict[str, Any]) -> bool:
        """Write one frame; False when the connection is already closed (websockets serialises concurrent sends)."""
        try:
            self.conn.send(json.dumps(frame, separators=(",", ":"), ensure_ascii=False))
        except ConnectionClosed:
            return False
        return True

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
        self._active: dict[str, int] = {}  # pubkey -> active sessions, in any mesh
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
            self._active[session.pubkey] = self._active.get(session.pubkey, 0) + 1
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
        left = self._active[session.pubkey] - 1
        if left:
            self._active[session.pubkey] = left
        else:
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
