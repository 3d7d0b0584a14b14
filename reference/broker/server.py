"""The reference broker's WebSocket server: hello, negotiation, accept, fan-out, presence, retention (§4.3–§4.7, §15).

Theory of operation. ``BrokerServer`` puts the broker together from its parts and owns their threads:

* _connection.py serves one member connection: the handshake (_handshake.py: hello, E-22; negotiation, E-08), the
  frame loop, and the close each way of ending it gets (codes from spec/tables/close_codes.yaml);
* _frames.py reads frames under the JSON limits (E-40) and checks them against their schemas;
* _accept.py is the accept path: a ``send`` checked on its connection's thread, committed in groups by the accept
  writers, acked after the COMMIT; _ratelimit.py is the B1 rate limit the store consults last;
* _delivery.py is the fan-out: the dispatcher, leases, pushes and ``client_ack``; _presence.py who is connected,
  the connection policy, peers and each session's outbound queue (E-33);
* _retention.py prunes old messages and expires dedupe rows on an interval; _dev.py is ``--dev``.

The listener itself closes a WebSocket message past ``link_frame_max_bytes`` with 1009 before it is read, and past
``broker_connections`` open connections closes a new one with 1013 before its handshake.

No connection thread touches the database. Store calls run on one bounded pool, so the number of database
connections stays bounded however many WebSockets come and go (the stores keep one connection per thread); SQLite's
writes queue on one lock of this process (``_writer``) rather than in SQLite's busy handler.

Seams. A subclass may override ``_handle``, ``_parse``, ``_signature_verified``, ``_hello_skew_ms``, ``_lease``,
``_trace_accept`` and ``_dev_topic``, or replace ``checks``: the parts call these through the server
(tests/broker/broken_brokers.py serves deliberately broken brokers this way).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ulid import ULID
from websockets.sync.server import Server, ServerConnection, serve

from reference.core.codes import close_codes
from reference.core.limits import limit
from reference.trace import TraceWriter, schema_check

from ._accept import ACCEPT_WRITERS, GROUP_MAX, PHASE, AcceptWriter, trace_accept
from ._connection import MemberConnection
from ._delivery import Deliveries, Dispatcher
from ._dev import DevMode
from ._frames import (
    CLIENT_MESSAGE_ID,
    DAEMON_FRAMES,
    FINGERPRINT_HEX,
    MAX_DETAIL,
    DaemonFrames,
    error_frame,
    parse_frame,
)
from ._handshake import Handshake, hello_payload, signature_ok
from ._presence import Presence, Session
from ._ratelimit import TokenBuckets
from ._retention import Sweeper, retention_sweep
from .config import BrokerConfig
from .store import AcceptChecks, AcceptRequest, AcceptResult, BrokerStore, Delivery

__all__ = [
    "ACCEPT_WRITERS",
    "CLIENT_MESSAGE_ID",
    "CLOSE",
    "DAEMON_FRAMES",
    "FINGERPRINT_HEX",
    "GROUP_MAX",
    "MAX_DETAIL",
    "PHASE",
    "BrokerServer",
    "error_frame",
    "hello_payload",
    "retention_sweep",
    "signature_ok",
]

log = logging.getLogger("meshbroker")

#: close-code name -> code, from spec/tables/close_codes.yaml (the broker sends 4001-4005, 1001, 1011 and 1013)
CLOSE = close_codes()


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
        self.trace: TraceWriter | None = None
        if config.trace_dir is not None:
            self.trace = TraceWriter(config.trace_dir, "broker", config.trace_node,
                                     check=schema_check if config.trace_strict else None)
        self.frames = DaemonFrames()
        #: SQLite admits one writer at a time and its busy handler waits by sleeping (1, 2, 5, 10 … ms), so this
        #: process's writers queue on a lock instead; PostgreSQL serialises on rows and needs none.
        self._writer: Any = threading.Lock() if getattr(store, "engine", "") == "sqlite" else contextlib.nullcontext()
        self.dev = DevMode(config, store, self._writer)
        self.deliveries = Deliveries(store, self.presence, self.pool, writer=self._writer, now_ms=self._now_ms,
                                     lease_ms=int(config.lease_s * 1000), emit=self._emit)
        self.dispatcher = Dispatcher(self.pool, self._lease, self.deliveries.deliver, self.presence.connected,
                                     tick_s=max(0.02, min(1.0, config.lease_s / 4)))
        self.accepts = AcceptWriter(
            store, self.presence, self.frames,
            AcceptChecks(max_payload_bytes=config.max_payload_bytes, rate_limit=self.buckets.allow,
                         retry_after_ms=self.buckets.retry_after_ms),
            writer=self._writer, new_id=new_id, now_ms=self._now_ms, emit=self._emit, decided=self._trace_accept,
            dev_topic=self._dev_topic if config.dev else None, due=self.dispatcher.due)
        handshake = Handshake(
            config, store, self.presence, self.frames, signature_verified=self._signature_verified,
            hello_skew_ms=self._hello_skew_ms, parse=self._parse, db=self._db, now_ms=self._now_ms,
            dev_register=self.dev.register if config.dev else None, due=self.dispatcher.due, close_codes=CLOSE)
        self.connection = MemberConnection(
            self.presence, self.frames, handshake=handshake, parse=self._parse, on_send=self.accepts.submit,
            on_client_ack=self.deliveries.on_client_ack, now_ms=self._now_ms, close_codes=CLOSE)
        self._server: Server | None = None
        self._stopping = threading.Event()
        self._serving = threading.Event()
        self._sweeper: Sweeper | None = None
        self._connections = 0
        self._connections_lock = threading.Lock()

    @property
    def checks(self) -> AcceptChecks:
        """The B1 checks the store applies to each send (payload size, rate limit)."""
        return self.accepts.checks

    @checks.setter
    def checks(self, checks: AcceptChecks) -> None:
        self.accepts.checks = checks

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
        self.accepts.start(ACCEPT_WRITERS.get(getattr(self.store, "engine", ""), 1))
        if self.config.sweep_interval_s > 0:
            self._sweeper = Sweeper(lambda: self._db(self.sweep), self.config.sweep_interval_s, self._stopping)
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
                self._server.shutdown(code=CLOSE["going_away"], reason="broker stopping")
            else:  # never served: shutdown() would wait for serve_forever() to notice
                self._server.socket.close()
        self.accepts.stop()  # the writers commit what is queued, then end
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

    def sweep(self) -> dict[str, int]:
        """One retention sweep now (what the periodic thread runs)."""
        retention_ms = int(self.config.message_retention_days * 86_400_000)
        with self._writer:
            return retention_sweep(self.store, self._now_ms(), retention_ms, self._emit)

    # --- the listener and the seams --------------------------------------------------------------------------------

    def _handle(self, conn: ServerConnection) -> None:
        with self._connections_lock:
            self._connections += 1
            full = self._connections > self.config.max_connections
        try:
            if full:
                log.warning("connection refused: %d open connections (max_connections)", self._connections - 1)
                # req: BRK-CONNECTION-CAP
                conn.close(CLOSE["try_again_later"], "try_again_later")
                return
            self.connection.serve(conn)
        finally:
            with self._connections_lock:
                self._connections -= 1

    @staticmethod
    def _parse(raw: str | bytes) -> tuple[dict[str, Any] | None, str | None]:
        """(the frame, or None when it is unparsable or has no type; what limit it goes past, or None) (E-40)."""
        return parse_frame(raw)

    def _signature_verified(self, hello: dict[str, Any]) -> bool:
        """Whether the hello's signature verifies (E-22)."""
        return signature_ok(hello)

    def _hello_skew_ms(self, timestamp_ms: int) -> int | None:
        """How far a hello's timestamp is from the broker's clock when that is beyond ``hello_skew_s`` (E-22: ±60 s,
        either way), else None."""
        skew_ms = abs(self._now_ms() - timestamp_ms)
        return skew_ms if skew_ms > self.config.hello_skew_s * 1000 else None

    def _lease(self, pubkey: str) -> list[Delivery]:
        """Lease (and trace) the member's due deliveries for the dispatcher to push."""
        return self.deliveries.lease(pubkey)

    def _trace_accept(self, session: Session, request: AcceptRequest, result: AcceptResult) -> None:
        """Trace a decision once its group has committed, before its ack is sent."""
        trace_accept(self._emit if self.trace is not None else None, session, request, result)

    def _dev_topic(self, mesh_id: str, topic: str) -> None:
        """--dev: create a topic on first use and subscribe every member of the mesh to it."""
        self.dev.topic(mesh_id, topic)

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
