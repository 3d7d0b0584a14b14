"""One member connection from handshake to close: the frame loop, and how each way of ending it is closed.

Theory of operation. websockets' sync server gives each connection a thread, which owns that connection's receive
side: the handshake (_handshake.py), then the frame loop, which hands each frame to the part of the broker that owns
it (a ``send`` to the accept writer, a ``client_ack`` to the deliveries, the presence frames to presence). A frame
past the JSON limits, or against its schema, is answered with an ``error`` frame (a ``send`` with a usable
client_message_id gets a B1 ack instead, from the accept writer); an unparsable frame or an unknown type closes 4005.
A refusal closes with the code spec/tables/close_codes.yaml gives its name, after the frames queued before it; a
member leaving is taken out of presence first, so a closing connection gets no further lease or push. Nothing a
peer sends ends in 1011 and a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection

from ._frames import DaemonFrames, error_frame, system_push
from ._handshake import Refused
from ._presence import PROFILE_FIELDS, Presence, Session

log = logging.getLogger("meshbroker")


class MemberConnection:
    """Serves member connections: ``serve(conn)`` runs one from its handshake to its close.

    Args:
        handshake: ``handshake(conn) -> Session`` (raises ``Refused``).
        parse: reads one raw frame (``_frames.parse_frame``, or a subclass's).
        on_send: ``on_send(session, frame, limited)`` takes a ``send`` frame.
        on_client_ack: ``on_client_ack(session, frame)`` takes a valid ``client_ack`` frame.
    """

    def __init__(self, presence: Presence, frames: DaemonFrames, *, handshake: Callable[[ServerConnection], Session],
                 parse: Callable[[str | bytes], tuple[dict[str, Any] | None, str | None]],
                 on_send: Callable[[Session, dict[str, Any], str | None], None],
                 on_client_ack: Callable[[Session, dict[str, Any]], None], now_ms: Callable[[], int],
                 close_codes: dict[str, int]):
        self.presence = presence
        self.frames = frames
        self.handshake = handshake
        self.parse = parse
        self.on_send = on_send
        self.on_client_ack = on_client_ack
        self.now_ms = now_ms
        self.close_codes = close_codes

    def serve(self, conn: ServerConnection) -> None:
        session: Session | None = None
        received: Any = None
        try:
            session = self.handshake(conn)
            self._frame_loop(session)
        except Refused as refused:
            code = self.close_codes[refused.name]
            log.info("connection refused: %s %s (%s)", code, refused.name, refused)
            self.leave(session)
            self._close(conn, session, code, refused.name)
        except ConnectionClosed as closed:
            received = closed.rcvd
        except Exception:
            log.exception("connection handler failed")
            self.leave(session)
            self._close(conn, session, self.close_codes["internal_error"], "internal_error")
        finally:
            if session is not None:
                session.end()
                self.leave(session)
                log.info("session %s closed: code=%s reason=%s", session.session_id,
                         received.code if received else conn.close_code, received.reason if received else "")

    def leave(self, session: Session | None) -> None:
        """Take ``session`` out of presence (idempotent) before the broker closes it: a connection being closed gets
        no further lease or push -- the member could never ack it -- and its deliveries wait for its next session."""
        if session is not None:
            for other in self.presence.remove(session):
                other.send(system_push("peer_left", session, self.now_ms()))

    @staticmethod
    def _close(conn: ServerConnection, session: Session | None, code: int, reason: str) -> None:
        """Close after the error frames queued before: through the session (flushed first) once there is one."""
        if session is None:
            conn.close(code, reason)
        else:
            session.close(code, reason)

    def _frame_loop(self, session: Session) -> None:
        for raw in session.conn:
            frame, limited = self.parse(raw)
            # req: BRK-PROTOCOL-ERROR, BRK-FRAME-LIMITS -- not JSON, or too deep to parse: 4005
            if frame is None:
                raise Refused("protocol_error", "an unparsable frame")
            kind = frame["type"]
            # req: BRK-PROTOCOL-ERROR -- no known type
            if kind not in self.frames:
                raise Refused("protocol_error", f"unknown frame type {kind[:32]!r}")
            if kind == "send":
                self.on_send(session, frame, limited)
                continue
            # req: BRK-FRAME-LIMITS -- a frame past the JSON limits gets an error frame
            problem = limited or self.frames.problem(frame)
            if problem is not None:
                session.send(error_frame("invalid_frame", f"{kind}: {problem}", frame.get("requestId")))
            elif kind in ("hello", "feature_negotiation_request"):
                session.send(error_frame("unexpected_frame", f"{kind} after the handshake"))
            elif kind == "client_ack":
                self.on_client_ack(session, frame)
            elif kind == "list_peers":
                answer = {"type": "peers_list", "peers": self.presence.peers(session)}
                if "requestId" in frame:
                    answer["requestId"] = frame["requestId"]
                session.send(answer)
            elif kind == "set_profile":
                self.presence.update(session, **{k: frame[k] for k in PROFILE_FIELDS if k in frame})
            else:  # set_summary, set_status, set_visible
                member = kind.removeprefix("set_")
                self.presence.update(session, **{member: frame[member]})
