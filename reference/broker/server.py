"""The reference broker's WebSocket server: hello, negotiation, accept, fan-out, presence, retention (§4.3–§4.7, §15).

Theory of operation. websockets' sync server gives each connection a thread, which owns that connection's receive
side: ``hello`` (ed25519 signature over ``meshId|memberId|pubkey|timestamp``, clock skew, membership, connection
policy), then ``feature_negotiation_request`` (E-08), then the frame loop. Any other first or second frame, or an
unparsable one, closes with 4005; the codes and their names come from spec/tables/close_codes.yaml.

Hostile frames (E-40). Every frame is parsed with the JSON limits of spec/tables/limits.yaml
(``reference.core.limits.loads``), never with a bare ``json.loads``: a frame too deep to parse, or that is not JSON,
closes 4005; a frame that parses but goes past a limit is refused like a schema failure -- a ``send`` with a usable
client_message_id in B1 (ack 400 ``limit_exceeded``), anything else with an ``error`` frame. A WebSocket message past
``link_frame_max_bytes`` is closed 1009 by the server before it is read. Past ``broker_connections`` open
connections a new one is closed 1013 before its handshake. Nothing a peer sends ends in 1011 and a traceback.

No connection thread touches the database. Store calls run on one bounded pool, so the number of database
connections stays bounded however many WebSockets come and go (the stores keep one connection per thread). A
``send`` is checked against its schema on the connection thread (a failure is B1 ``invalid_frame``; without a usable
client_message_id it is an ``error`` frame, E-28) and queued for the accept writer; a connection may have several
sends in flight, as a daemon draining its outbox does, bounded per connection. The B1 size limit is the advertised
``max_payload.inline_bytes``; the rate limit is a per-member token bucket the store consults last. Frames to a
member (acks, pushes, errors) are queued on its session and written by the session's own sender thread, so a member
that stops reading stalls nobody else and is closed 1013 ``slow_consumer`` past ``max_outbound_bytes`` (E-33).

Group commit. An accept-writer thread takes every queued send (up to ``GROUP_MAX``), from whichever connections,
and hands them to ``store.accept_batch``: one write transaction, each send from its own savepoint through the whole
§4.7.2 sequence (B1 reads, claim, read-back, B2, inserts), whatever a send must not keep rolled back to its
savepoint, then one COMMIT for the group, so one fsync makes many 201s durable. A key appears at most once per
transaction (a repeat waits for the next one), so a duplicate is only ever answered from a committed dedupe row, as
without grouping. Only when ``accept_batch`` has returned, the COMMIT done, does the writer write the trace events
and send the acks (``AcceptResult.ack_frame``); a failed COMMIT turns the group's 201s into 500s (BRK-COMMIT-FAIL).
Sends queue while a group commits, so the groups grow with the load and a lone send is committed at once. SQLite
has one writer at a time anyway, so it gets one accept writer; PostgreSQL gets two, so one group runs while the
other waits for its COMMIT. Sends in flight together have no order among them (as before grouping): a group runs in
key order, whatever order its sends arrived in.

After a commit the recipients are due for the dispatcher (_delivery.py), which leases committed delivery rows and
pushes them; ``client_ack`` marks a row acked. Presence is in memory (_presence.py). A retention thread prunes old
messages (flipping history_available) and expires dedupe rows on an interval; ``retention_sweep`` is the same job
for ``meshd broker retention-sweep``.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from ulid import ULID
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import Server, ServerConnection, serve

from reference.core import broker_accept
from reference.core.codes import close_codes
from reference.core.limits import LimitExceeded, Unparsable, limit, loads
from reference.trace import TraceWriter, schema_check
from spec import schema

from ._delivery import BATCH, Dispatcher, push_frame
from ._presence import PROFILE_FIELDS, Presence, Session
from ._ratelimit import TokenBuckets
from ._schemas import frame_schema
from .config import BROKER_VERSION, BrokerConfig, supported_features
from .store import EFFECTS, AcceptChecks, AcceptRequest, AcceptResult, BrokerStore, Delivery, rfc3339_ms

log = logging.getLogger("meshbroker")

#: close-code name -> code, from spec/tables/close_codes.yaml (the broker sends 4001-4005)
CLOSE = close_codes()
#: table row -> phase, for the accept_decision trace (spec/tables/broker_accept.yaml)
PHASE = {row.id: row.then["phase"] for row in broker_accept.table().rows}
#: the frames a daemon may send, by type (spec/schemas/broker/frame.json#/$defs/daemon_to_broker)
DAEMON_FRAMES = tuple(
    entry["$ref"].removesuffix(".json") for entry in schema("broker/frame")["$defs"]["daemon_to_broker"]["oneOf"]
)
_DEFS = schema("common/defs")["$defs"]
CLIENT_MESSAGE_ID = re.compile(_DEFS["client_message_id"]["pattern"])
FINGERPRINT_HEX = re.compile(_DEFS["fingerprint_hex"]["pattern"])
MAX_DETAIL = 200
#: the most sends one group transaction takes (PostgreSQL keeps 64 subtransaction ids per transaction in shared
#: memory; more make every other session's visibility checks slower)
GROUP_MAX = 64
#: accept writers per store engine: SQLite has one writer at a time anyway; on PostgreSQL a second one runs the next
#: group while the first waits for its COMMIT (groups take their row locks in key order, so they cannot deadlock)
ACCEPT_WRITERS = {"sqlite": 1, "postgres": 2}


def error_frame(code: str, message: str, request_id: Any = None) -> dict[str, Any]:
    """An ``error`` frame (spec/schemas/broker/error.json)."""
    frame = {"type": "error", "code": code, "message": message[:MAX_DETAIL]}
    if isinstance(request_id, str) and 1 <= len(request_id) <= 128:
        frame["requestId"] = request_id
    return frame


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


class _Refused(Exception):
    """End the handshake with a close code named in spec/tables/close_codes.yaml."""

    def __init__(self, name: str, detail: str):
        super().__init__(detail)
        self.name = name


def retention_sweep(store: BrokerStore, now_ms: int, message_retention_ms: int,
                    emit: Callable[..., Any] | None = None) -> dict[str, int]:
    """Prune messages older than the retention (flipping their dedupe rows' history_available, §17 step 6), then
    delete expired dedupe rows (§17 step 5); ``emit`` gets one history_pruned event per flipped message.

    Returns:
        ``{"pruned": messages deleted, "history_flipped": dedupe rows flipped, "expired": dedupe rows deleted}``.
    """
    before = now_ms - message_retention_ms
    flipped = store.prunable(before)
    pruned = store.prune_messages(before)
    if emit is not None:
        for row in flipped:
            emit("history_pruned", mesh=row["mesh_id"], broker_message_id=row["broker_message_id"],
                 client_message_id=row["client_message_id"])
    expired = store.expire_dedupe(now_ms)
    log.info("retention_sweep pruned=%d history_flipped=%d expired=%d", pruned, len(flipped), expired)
    return {"pruned": pruned, "history_flipped": len(flipped), "expired": expired}


class BrokerServer:
    """One broker: ``start()`` binds and starts the workers, ``serve_forever()`` accepts, ``stop()`` ends it all.

    Args:
        config: the settings.
        store: a migrated store; the caller owns it (``stop()`` does not close it).
        clock: unix seconds (hello skew, received_at, leases).
        new_id: mints broker_message_id and history_id values (ULIDs).
    """

    def __init__(self, config: BrokerConfig, store: BrokerStore, *, clock: Callable[[], float] = time.time,
                 new_id: Callable[[], str] = lambda: str(ULID())):
        self.config = config
        self.store = store
        self.clock = clock
        self.new_id = new_id
        self.pool = ThreadPoolExecutor(config.db_workers, thread_name_prefix="meshbroker-db")
        self.presence = Presence(config.connection_policy)
        self.buckets = TokenBuckets(config.rate_per_s, config.rate_burst)
        self.checks = AcceptChecks(max_payload_bytes=config.max_payload_bytes, rate_limit=self.buckets.allow,
                                   retry_after_ms=self.buckets.retry_after_ms)
        self.dispatcher = Dispatcher(self.pool, self._lease, self._deliver, self.presence.connected,
                                     tick_s=max(0.02, min(1.0, config.lease_s / 4)))
        self.trace: TraceWriter | None = None
        if config.trace_dir is not None:
            self.trace = TraceWriter(config.trace_dir, "broker", config.trace_node,
                                     check=schema_check if config.trace_strict else None)
        self._schemas = {name: frame_schema(f"broker/{name}") for name in DAEMON_FRAMES}
        self._server: Server | None = None
        self._stopping = threading.Event()
        self._serving = threading.Event()
        self._sweeper: threading.Thread | None = None
        self._sessions = itertools.count(1)
        self._dev_lock = threading.Lock()
        #: SQLite admits one writer at a time and its busy handler waits by sleeping (1, 2, 5, 10 … ms), so this
        #: process's writers queue on a lock instead; PostgreSQL serialises on rows and needs none.
        self._writer: Any = threading.Lock() if getattr(store, "engine", "") == "sqlite" else contextlib.nullcontext()
        #: sends waiting for the accept writer: (session, request)
        self._sends: collections.deque[tuple[Session, AcceptRequest]] = collections.deque()
        self._sends_ready = threading.Condition()
        self._sends_closed = False
        self._accept_writers: list[threading.Thread] = []
        self._dev_members: set[tuple[str, str]] = set()
        self._dev_topics: set[tuple[str, str]] = set()
        self._connections = 0
        self._connections_lock = threading.Lock()

    # --- lifecycle -------------------------------------------------------------------------------------------------

    def start(self) -> int:
        """Bind the listener and start the dispatcher and the retention thread; returns the bound port."""
        self._server = serve(
            self._handle, self.config.host, self.config.port, compression=None,
            # req: BRK-FRAME-LIMITS -- a message past link_frame_max_bytes closes 1009
            open_timeout=self.config.handshake_timeout_s, close_timeout=2, max_size=int(limit("link_frame_max_bytes")),
            logger=logging.getLogger("meshbroker.websockets"),
        )
        self.dispatcher.start()
        writers = ACCEPT_WRITERS.get(getattr(self.store, "engine", ""), 1)
        for number in range(writers):
            writer = threading.Thread(target=self._accept_loop, name=f"meshbroker-accept-writer-{number}", daemon=True)
            writer.start()
            self._accept_writers.append(writer)
        if self.config.sweep_interval_s > 0:
            self._sweeper = threading.Thread(target=self._sweep_loop, name="meshbroker-retention", daemon=True)
            self._sweeper.start()
        return self.port

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.socket.getsockname()[1])

    @property
    def url(self) -> str:
        return f"ws://{self.config.host}:{self.port}"

    def serve_forever(self) -> None:
        assert self._server is not None, "start() first"
        self._serving.set()
        self._server.serve_forever()

    def stop(self) -> None:
        """Close every connection (1001), stop the workers, wait for in-flight store calls."""
        self._stopping.set()
        if self._server is not None:
            if self._serving.is_set():
                self._server.shutdown(code=1001, reason="broker stopping")
            else:  # never served: shutdown() would wait for serve_forever() to notice
                self._server.socket.close()
        with self._sends_ready:  # the writer commits what is queued, then ends
            self._sends_closed = True
            self._sends_ready.notify_all()
        for writer in self._accept_writers:
            writer.join()
        self.dispatcher.stop()
        self.pool.shutdown(wait=True, cancel_futures=False)
        if self.trace is not None:
            self.trace.close()

    def __enter__(self) -> BrokerServer:
        self.start()
        threading.Thread(target=self.serve_forever, name="meshbroker-accept", daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- helpers ---------------------------------------------------------------------------------------------------

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a store call on the database pool and wait for it."""
        return self.pool.submit(fn, *args, **kwargs).result()

    def _emit(self, kind: str, **members: Any) -> None:
        if self.trace is None:
            return
        try:
            self.trace.emit(kind, **members)
        except Exception:
            log.exception("trace event %s could not be written", kind)

    def _problem(self, frame: dict[str, Any]) -> str | None:
        """The first schema error of a frame of a known type, or None."""
        problem = self._schemas[frame["type"]].problem(frame)
        return None if problem is None else problem[:MAX_DETAIL]

    @staticmethod
    def _parse(raw: str | bytes) -> tuple[dict[str, Any] | None, str | None]:
        """(the frame, or None when it is unparsable or has no type; what limit it goes past, or None) (E-40)."""
        try:
            frame, problem = loads(raw), None
        except Unparsable:
            return None, None
        except LimitExceeded as exc:
            frame, problem = exc.document, f"{exc.limit}: {exc.detail}"
        if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
            return None, None
        return frame, problem

    # --- one connection --------------------------------------------------------------------------------------------

    def _handle(self, conn: ServerConnection) -> None:
        with self._connections_lock:
            self._connections += 1
            full = self._connections > self.config.max_connections
        try:
            if full:
                log.warning("connection refused: %d open connections (max_connections)", self._connections - 1)
                # req: BRK-CONNECTION-CAP
                conn.close(1013, "try_again_later")
                return
            self._handle_member(conn)
        finally:
            with self._connections_lock:
                self._connections -= 1

    def _handle_member(self, conn: ServerConnection) -> None:
        session: Session | None = None
        received: Any = None
        try:
            session = self._handshake(conn)
            self._serve(session)
        except _Refused as refused:
            log.info("connection refused: %s %s (%s)", CLOSE[refused.name], refused.name, refused)
            self._leave(session)
            self._close(conn, session, CLOSE[refused.name], refused.name)
        except ConnectionClosed as closed:
            received = closed.rcvd
        except Exception:
            log.exception("connection handler failed")
            self._leave(session)
            self._close(conn, session, 1011, "internal_error")
        finally:
            if session is not None:
                session.end()
                self._leave(session)
                log.info("session %s closed: code=%s reason=%s", session.session_id,
                         received.code if received else conn.close_code, received.reason if received else "")

    def _leave(self, session: Session | None) -> None:
        """Take ``session`` out of presence (idempotent) before the broker closes it: a connection being closed gets
        no further lease or push -- the member could never ack it -- and its deliveries wait for its next session."""
        if session is not None:
            for other in self.presence.remove(session):
                other.send(self._system("peer_left", session))

    @staticmethod
    def _close(conn: ServerConnection, session: Session | None, code: int, reason: str) -> None:
        """Close after the error frames queued before: through the session (flushed first) once there is one."""
        if session is None:
            conn.close(code, reason)
        else:
            session.close(code, reason)

    def _recv_frame(self, conn: ServerConnection, expected: str) -> dict[str, Any]:
        try:
            raw = conn.recv(timeout=self.config.handshake_timeout_s)
        except TimeoutError as exc:
            raise _Refused("protocol_error", f"no {expected} within {self.config.handshake_timeout_s:g} s") from exc
        frame, limited = self._parse(raw)
        # req: BRK-PROTOCOL-ERROR -- before hello, or before negotiation completes
        if frame is None or frame["type"] != expected:
            got = "an unparsable frame" if frame is None else f"a {frame['type'][:32]!r} frame"
            raise _Refused("protocol_error", f"{got} before {expected}")
        problem = limited or self._problem(frame)
        if problem is not None:
            raise _Refused("protocol_error", f"invalid {expected}: {problem}")
        return frame

    def _signature_verified(self, hello: dict[str, Any]) -> bool:
        """Whether the hello's signature verifies (E-22). A seam: the conformance tests subclass it."""
        return signature_ok(hello)

    def _hello_skew_ms(self, timestamp_ms: int) -> int | None:
        """How far a hello's timestamp is from the broker's clock when that is beyond ``hello_skew_s`` (E-22: ±60 s,
        either way), else None. A seam like ``_signature_verified``."""
        skew_ms = abs(self._now_ms() - timestamp_ms)
        return skew_ms if skew_ms > self.config.hello_skew_s * 1000 else None

    def _handshake(self, conn: ServerConnection) -> Session:
        hello = self._recv_frame(conn, "hello")
        # req: BRK-HELLO-AUTH -- a bad signature closes 4001
        if not self._signature_verified(hello):
            raise _Refused("unauthorized", "bad hello signature")
        # req: BRK-HELLO-AUTH -- a timestamp past ±hello_skew_s closes 4002
        skew_ms = self._hello_skew_ms(hello["timestamp"])
        if skew_ms is not None:
            raise _Refused("hello_expired", f"hello timestamp is {skew_ms} ms away from the broker's clock")
        mesh_id, pubkey = hello["meshId"], hello["pubkey"]
        if self.config.dev:
            self._db(self._dev_register, mesh_id, pubkey, hello.get("displayName") or "")
        policy = self._db(self.store.mesh_policy, mesh_id)
        # req: BRK-HELLO-AUTH -- an unknown member closes 4001
        if policy is None or not self._db(self.store.is_member, mesh_id, pubkey):
            raise _Refused("unauthorized", f"{pubkey[:16]}… is not a member of mesh {mesh_id!r}")
        session = Session(
            conn=conn, mesh_id=mesh_id, pubkey=pubkey, member_id=hello["memberId"],
            session_id=f"s{next(self._sessions)}-{pubkey[:8]}", display_name=hello.get("displayName") or "",
            connected_at=rfc3339_ms(self._now_ms()), peer_type=hello.get("peerType"), channel=hello.get("channel"),
            hostname=hello.get("hostname"),
            inflight=threading.BoundedSemaphore(self.config.max_inflight_per_connection),
            max_outbound_bytes=self.config.max_outbound_bytes,
        )
        admitted, replaced = self.presence.admit(session)
        if not admitted:
            raise _Refused("member_already_connected", f"{pubkey[:16]}… already has a connection")
        for old in replaced:
            threading.Thread(target=old.close, args=(CLOSE["replaced_by_newer_connection"],
                                                     "replaced_by_newer_connection"), daemon=True).start()
        try:
            conn.send(_json({"type": "hello_ack", "memberId": hello["memberId"], "meshId": mesh_id,
                             "sessionId": session.session_id, "brokerVersion": BROKER_VERSION,
                             "serverTime": self._now_ms()}))
            request = self._recv_frame(conn, "feature_negotiation_request")
            # req: BRK-ADVERTISE-POLICY -- the mesh's own policy, the one _expires_at enacts
            supported = supported_features(self.config, policy["dedupe_mode"], policy["retention_days"])
            missing = [bit for bit in request["require"] if bit not in supported]
            conn.send(_json({"type": "feature_negotiation_response", "supported": supported,
                             "missing_required": missing}))
        except BaseException:
            for other in self.presence.remove(session):
                other.send(self._system("peer_left", session))
            raise
        for other in self.presence.activate(session):
            other.send(self._system("peer_joined", session))
        log.info("session %s open mesh=%s member=%s…", session.session_id, mesh_id, pubkey[:16])
        self.dispatcher.due([pubkey])
        return session

    def _system(self, event: str, session: Session) -> dict[str, Any]:
        return {"type": "push", "subtype": "system", "event": event,
                "eventData": {"pubkey": session.pubkey, "displayName": session.display_name,
                              "memberId": session.member_id},
                "meshId": session.mesh_id, "createdAt": rfc3339_ms(self._now_ms())}

    def _serve(self, session: Session) -> None:
        for raw in session.conn:
            frame, limited = self._parse(raw)
            # req: BRK-PROTOCOL-ERROR, BRK-FRAME-LIMITS -- not JSON, or too deep to parse: 4005
            if frame is None:
                raise _Refused("protocol_error", "an unparsable frame")
            kind = frame["type"]
            # req: BRK-PROTOCOL-ERROR -- no known type
            if kind not in self._schemas:
                raise _Refused("protocol_error", f"unknown frame type {kind[:32]!r}")
            if kind == "send":
                self._on_send(session, frame, limited)
                continue
            # req: BRK-FRAME-LIMITS -- a frame past the JSON limits gets an error frame
            problem = limited or self._problem(frame)
            if problem is not None:
                session.send(error_frame("invalid_frame", f"{kind}: {problem}", frame.get("requestId")))
            elif kind in ("hello", "feature_negotiation_request"):
                session.send(error_frame("unexpected_frame", f"{kind} after the handshake"))
            elif kind == "client_ack":
                self._on_client_ack(session, frame)
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

    # --- send → ack ------------------------------------------------------------------------------------------------

    def _on_send(self, session: Session, frame: dict[str, Any], limited: str | None = None) -> None:
        problem = limited or self._problem(frame)
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
            received_at_ms=self._now_ms(),
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
        self._emit("accept_decision", mesh=session.mesh_id, client_message_id=cmid,
                   request_fingerprint=claimed if isinstance(claimed, str) and FINGERPRINT_HEX.fullmatch(claimed)
                   else None, table_row=result.table_row, phase="B1", status=status, broker_message_id=None,
                   member=session.pubkey)
        session.send(result.ack_frame())

    def _accept_loop(self) -> None:
        """The accept writer: commit the queued sends group by group until the broker stops and the queue is empty."""
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
                    if self.config.dev and request.destination_kind == "topic":
                        self._dev_topic(request.mesh_id, request.destination_ref)
                except Exception:
                    log.exception("accept of %s failed outside the store", request.client_message_id)
                    assert session.inflight is not None
                    session.inflight.release()
                    continue
                calls.append((request, self.new_id(), self.new_id()))
                sessions.append(session)
            with self._writer:
                results = self.store.accept_batch(calls, self.checks)
        except BaseException:
            for session in sessions:
                assert session.inflight is not None
                session.inflight.release()
            raise
        online: set[str] = set()
        for session, (request, _, _), result in zip(sessions, calls, results, strict=True):
            try:
                self._trace_accept(session, request, result)
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
            self.dispatcher.due(online)

    def _trace_accept(self, session: Session, request: AcceptRequest, result: AcceptResult) -> None:
        if result.table_row is None:  # a store fault before the decision started: no table row decided it
            log.warning("accept of %s: store fault before the decision (%s)", request.client_message_id,
                        result.body.get("detail"))
            return
        if self.trace is None:  # tracing is off: build no event
            return
        answered = result.body.get("broker_message_id") if result.http_status in (200, 201) else None
        # The commit first: a broker stopped between the two writes leaves a commit without its decision, which the
        # trace checks allow (TRC-SIDE-EFFECTS), never a BRK-ACCEPT decision without its commit.
        if result.committed:
            self._emit("accept_commit", mesh=request.mesh_id, client_message_id=request.client_message_id,
                       broker_message_id=answered, request_fingerprint=request.request_fingerprint.hex(),
                       destination_kind=request.destination_kind, destination_ref=request.destination_ref,
                       effects=dict(result.effects), recipients=len(result.recipients))
        self._emit("accept_decision", mesh=request.mesh_id, client_message_id=request.client_message_id,
                   request_fingerprint=request.request_fingerprint.hex(), table_row=result.table_row,
                   phase=PHASE[result.table_row], status=result.http_status, broker_message_id=answered,
                   member=session.pubkey)

    # --- deliveries ------------------------------------------------------------------------------------------------

    def _lease(self, pubkey: str) -> list[Delivery]:
        """Lease the member's due deliveries; each is traced with its lease, under the writer lock (E-32): a
        client_ack of an earlier attempt, committed and traced after this lease, can never precede it in the trace."""
        if not self.presence.is_open(pubkey):
            return []
        with self._writer:
            leased = self.store.pending_deliveries(pubkey, self._now_ms(), int(self.config.lease_s * 1000), BATCH)
            for delivery in leased:
                if delivery.client_message_id is not None:
                    self._emit("delivery", mesh=delivery.mesh_id, broker_message_id=delivery.broker_message_id,
                               client_message_id=delivery.client_message_id, recipient=delivery.recipient_pubkey,
                               delivery_id=str(delivery.delivery_id), attempt=delivery.attempt,
                               lease_until_ms=delivery.lease_until_ms)
            return leased

    def _deliver(self, delivery: Delivery) -> bool:
        session = self.presence.target(delivery.mesh_id, delivery.recipient_pubkey)
        if session is None or delivery.client_message_id is None:
            return False
        sender = self.presence.target(delivery.mesh_id, delivery.sender_pubkey)
        # Already traced by _lease. A push the connection refuses stays leased; its redelivery is the next attempt.
        return session.send(push_frame(delivery, sender.display_name if sender else None))

    def _on_client_ack(self, session: Session, frame: dict[str, Any]) -> None:
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
            with self._writer:
                acked = self.store.ack_delivery(delivery_id, session.pubkey, self._now_ms(),
                                                broker_message_id=frame["brokerMessageId"])
            if acked:
                self._emit("delivery_ack", mesh=session.mesh_id, broker_message_id=frame["brokerMessageId"],
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

    # --- dev mode --------------------------------------------------------------------------------------------------

    def _dev_register(self, mesh_id: str, pubkey: str, display_name: str) -> None:
        """--dev: create the mesh on first use, admit the member, subscribe it to every topic of the mesh."""
        with self._dev_lock, self._writer:
            if (mesh_id, pubkey) in self._dev_members:
                return
            if self.store.mesh_policy(mesh_id) is None:
                retention = self.config.retention_days if self.config.dedupe_mode == "retention_scoped" else None
                try:
                    self.store.add_mesh(mesh_id, mesh_id, self.config.dedupe_mode, retention)
                except Exception:
                    if self.store.mesh_policy(mesh_id) is None:  # not a concurrent creation: a real failure
                        raise
            self.store.add_member(mesh_id, pubkey, display_name)
            for topic in self.store.topics(mesh_id):
                self.store.subscribe(mesh_id, topic, pubkey)
            self._dev_members.add((mesh_id, pubkey))

    def _dev_topic(self, mesh_id: str, topic: str) -> None:
        """--dev: create a topic on first use and subscribe every member of the mesh to it."""
        with self._dev_lock, self._writer:
            if (mesh_id, topic) in self._dev_topics:
                return
            self.store.create_topic(mesh_id, topic)
            for member in self.store.members(mesh_id):
                self.store.subscribe(mesh_id, topic, member["pubkey"])
            self._dev_topics.add((mesh_id, topic))

    # --- retention -------------------------------------------------------------------------------------------------

    def sweep(self) -> dict[str, int]:
        """One retention sweep now (what the periodic thread runs)."""
        retention_ms = int(self.config.message_retention_days * 86_400_000)
        with self._writer:
            return retention_sweep(self.store, self._now_ms(), retention_ms, self._emit)

    def _sweep_loop(self) -> None:
        while not self._stopping.wait(self.config.sweep_interval_s):
            try:
                self._db(self.sweep)
            except Exception:
                log.exception("retention sweep failed; it runs again after the interval")


def _json(frame: dict[str, Any]) -> str:
    return json.dumps(frame, separators=(",", ":"), ensure_ascii=False)
