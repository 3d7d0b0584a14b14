"""The handshake of one connection: ``hello``, then ``feature_negotiation_request`` (§4.3, E-08, E-22).

Theory of operation. ``hello`` is checked in order: its ed25519 signature over ``meshId|memberId|pubkey|timestamp``
(4001), its timestamp against the broker's clock (±``hello_skew_s``, 4002), the member's membership of the mesh
(4001), then the mesh's connection policy (4003 ``member_already_connected`` under prefer_oldest; under prefer_newest
the older sessions are closed 4004). The ``hello_ack`` names the new session; the negotiation answers with what the
broker supports under the mesh's own dedupe policy. Any other first or second frame, an unparsable one, or none in
time, refuses the connection with 4005. A session becomes active (listed, pushed to, announced) only once
negotiation is done, and its due deliveries start then.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from websockets.sync.server import ServerConnection

from ._frames import DaemonFrames, system_push, to_json
from ._presence import Presence, Session
from .config import BROKER_VERSION, BrokerConfig, supported_features
from .store import BrokerStore, rfc3339_ms

log = logging.getLogger("meshbroker")


def hello_payload(mesh_id: str, member_id: str, pubkey: str, timestamp: int) -> bytes:
    """What a hello signature covers: the UTF-8 string ``meshId|memberId|pubkey|timestamp`` (E-22)."""
    return f"{mesh_id}|{member_id}|{pubkey}|{timestamp}".encode()


def signature_ok(hello: dict[str, Any]) -> bool:
    """Whether ``hello.signature`` is ``hello.pubkey``'s ed25519 signature of its payload."""
    try:
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(hello["pubkey"]))
        key.verify(bytes.fromhex(hello["signature"]),
                   hello_payload(hello["meshId"], hello["memberId"], hello["pubkey"], hello["timestamp"]))
    except (InvalidSignature, ValueError):
        return False
    return True


class Refused(Exception):
    """End the handshake with a close code named in spec/tables/close_codes.yaml."""

    def __init__(self, name: str, detail: str):
        super().__init__(detail)
        self.name = name


class Handshake:
    """Turns a new connection into an active ``Session``, or raises ``Refused``.

    Args:
        signature_verified, hello_skew_ms: the broker's checks of a hello (seams its subclasses override).
        parse: reads one raw frame (``_frames.parse_frame``, or a subclass's).
        db: runs a store call on the database pool and waits for it.
        dev_register: ``--dev``: admits the hello's member first (None otherwise).
        due: marks members due for the delivery dispatcher.
    """

    def __init__(self, config: BrokerConfig, store: BrokerStore, presence: Presence, frames: DaemonFrames, *,
                 signature_verified: Callable[[dict[str, Any]], bool],
                 hello_skew_ms: Callable[[int], int | None],
                 parse: Callable[[str | bytes], tuple[dict[str, Any] | None, str | None]],
                 db: Callable[..., Any], now_ms: Callable[[], int],
                 dev_register: Callable[[str, str, str], None] | None, due: Callable[[Any], None],
                 close_codes: dict[str, int]):
        self.config = config
        self.store = store
        self.presence = presence
        self.frames = frames
        self.signature_verified = signature_verified
        self.hello_skew_ms = hello_skew_ms
        self.parse = parse
        self.db = db
        self.now_ms = now_ms
        self.dev_register = dev_register
        self.due = due
        self.close_codes = close_codes
        self._sessions = itertools.count(1)

    def recv_frame(self, conn: ServerConnection, expected: str) -> dict[str, Any]:
        try:
            raw = conn.recv(timeout=self.config.handshake_timeout_s)
        except TimeoutError as exc:
            raise Refused("protocol_error", f"no {expected} within {self.config.handshake_timeout_s:g} s") from exc
        frame, limited = self.parse(raw)
        # req: BRK-PROTOCOL-ERROR -- before hello, or before negotiation completes
        if frame is None or frame["type"] != expected:
            got = "an unparsable frame" if frame is None else f"a {frame['type'][:32]!r} frame"
            raise Refused("protocol_error", f"{got} before {expected}")
        problem = limited or self.frames.problem(frame)
        if problem is not None:
            raise Refused("protocol_error", f"invalid {expected}: {problem}")
        return frame

    def __call__(self, conn: ServerConnection) -> Session:
        hello = self.recv_frame(conn, "hello")
        # req: BRK-HELLO-AUTH -- a bad signature closes 4001
        if not self.signature_verified(hello):
            raise Refused("unauthorized", "bad hello signature")
        # req: BRK-HELLO-AUTH -- a timestamp past ±hello_skew_s closes 4002
        skew_ms = self.hello_skew_ms(hello["timestamp"])
        if skew_ms is not None:
            raise Refused("hello_expired", f"hello timestamp is {skew_ms} ms away from the broker's clock")
        mesh_id, pubkey = hello["meshId"], hello["pubkey"]
        if self.dev_register is not None:
            self.db(self.dev_register, mesh_id, pubkey, hello.get("displayName") or "")
        policy = self.db(self.store.mesh_policy, mesh_id)
        # req: BRK-HELLO-AUTH -- an unknown member closes 4001
        if policy is None or not self.db(self.store.is_member, mesh_id, pubkey):
            raise Refused("unauthorized", f"{pubkey[:16]}… is not a member of mesh {mesh_id!r}")
        session = Session(
            conn=conn, mesh_id=mesh_id, pubkey=pubkey, member_id=hello["memberId"],
            session_id=f"s{next(self._sessions)}-{pubkey[:8]}", display_name=hello.get("displayName") or "",
            connected_at=rfc3339_ms(self.now_ms()), peer_type=hello.get("peerType"), channel=hello.get("channel"),
            hostname=hello.get("hostname"),
            inflight=threading.BoundedSemaphore(self.config.max_inflight_per_connection),
            max_outbound_bytes=self.config.max_outbound_bytes,
        )
        admitted, replaced = self.presence.admit(session)
        if not admitted:
            raise Refused("member_already_connected", f"{pubkey[:16]}… already has a connection")
        for old in replaced:
            threading.Thread(target=old.close, args=(self.close_codes["replaced_by_newer_connection"],
                                                     "replaced_by_newer_connection"), daemon=True).start()
        try:
            conn.send(to_json({"type": "hello_ack", "memberId": hello["memberId"], "meshId": mesh_id,
                               "sessionId": session.session_id, "brokerVersion": BROKER_VERSION,
                               "serverTime": self.now_ms()}))
            request = self.recv_frame(conn, "feature_negotiation_request")
            # req: BRK-ADVERTISE-POLICY -- the mesh's own policy, the one _expires_at enacts
            supported = supported_features(self.config, policy["dedupe_mode"], policy["retention_days"])
            missing = [bit for bit in request["require"] if bit not in supported]
            conn.send(to_json({"type": "feature_negotiation_response", "supported": supported,
                               "missing_required": missing}))
        except BaseException:
            for other in self.presence.remove(session):
                other.send(system_push("peer_left", session, self.now_ms()))
            raise
        for other in self.presence.activate(session):
            other.send(system_push("peer_joined", session, self.now_ms()))
        log.info("session %s open mesh=%s member=%s…", session.session_id, mesh_id, pubkey[:16])
        self.due([pubkey])
        return session
