"""The daemon's persistent WebSocket link to the broker (websocket-client), in one thread.

Theory of operation. The thread connects, sends a signed ``hello``, waits for ``hello_ack``, then negotiates features
(E-08) before sending anything else. A failed negotiation closes with 4010 ``feature_unavailable`` and the
structured reason (E-07) and is fatal (exit 10); both numbers are read by name from spec/tables/. Once open, one
loop does everything, so no lock guards the socket:

* drain: rows past their max age go ``dead``; due ``pending`` rows go ``inflight`` (the transition is committed
  before the frame is sent) and their ack deadline is armed;
* acks: each ack's status picks the outbox event (E-10, spec/tables/ack_events.yaml); the outbox table decides what
  happens (E-17 for late acks);
* pushes: an inbound message is inserted into inbox.db with its ``message`` event in one transaction, *then*
  acknowledged with ``client_ack`` (duplicates are acknowledged too, so the broker stops redelivering);
* timeouts: an inflight row whose ack deadline passed returns to ``pending``;
* requests from IPC threads (peers, profile) arrive through a queue.

When the socket drops, every row this process dispatched and has not heard back about returns to ``pending``
(``link_lost``) and the thread reconnects with exponential backoff and jitter.

Hostile or broken input (E-40, E-41, E-42). Every inbound message is parsed with the JSON limits of
spec/tables/limits.yaml and checked against its schema; a message larger than ``link_frame_max_bytes`` is read and
dropped without being held. A message the daemon cannot take -- unparsable, past a limit, schema-invalid, or one whose
handling raised anything but a store error -- is *quarantined* (kept in inbox.db with its reason, counted in
``cm_daemon_invalid_inbound_total``) and, when it is a push that names its delivery, acknowledged with
``client_ack`` after the quarantine row has committed, so the broker stops redelivering it; the link carries on. A
store error is a link loss (the frame is fine: its redelivery will be taken). Transient acks (429, 408, 425) return
the row to pending after the broker's ``retry_after_ms`` at least. A 1009 close (message too big) marks the largest
frame in flight dead instead of resending it for ever. And if anything escapes all that, the thread's supervisor
logs it, counts a restart (``/v1/health`` ``link_restarts``) and runs the link again; a watchdog restarts the thread
itself should it ever end while the daemon runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import random
import select
import socket
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import websocket

from reference.clock import now_rfc3339
from reference.core import ENVELOPE_VERSION, OutboxEvent, TransitionError, is_client_message_id, maxage, negotiate
from reference.core.ack import ack_event
from reference.core.codes import close_code, exit_code
from reference.core.features import CloseReason, required_bits
from reference.core.limits import LimitExceeded, Unparsable, limit, loads, unique_keys
from reference.core.request import is_broker_message_id, load_payload
from spec import SPEC_VERSION, fast_validator

from .identity import Keypair, hello_signature_payload
from .store import StoreError

log = logging.getLogger("meshd.link")
DISPATCH_BATCH = 256  # due rows claimed per drain transaction
MAX_FRAMES_PER_TURN = 256  # inbound frames read before the loop drains and checks timeouts again
#: bytes of a too-large inbound message kept in quarantine
QUARANTINE_PREFIX_BYTES = int(limit("quarantine_frame_prefix_bytes"))
#: the longest the watchdog and the supervisor wait before running a failed link again
RESTART_DELAY_S = 1.0
#: failures that are not the frame's fault: the link is lost and reconnects (the frame, redelivered, is taken then)
LINK_LOSSES = (sqlite3.Error, StoreError, OSError, websocket.WebSocketException, TimeoutError)


class BrokerUnavailable(Exception):
    """The link is not open."""


class BrokerTimeout(Exception):
    """The broker did not answer in time."""


class BrokerClosed(websocket.WebSocketConnectionClosedException):
    """The broker closed the link; ``code`` is its close code (None when the close frame had none)."""

    def __init__(self, code: int | None, reason: str):
        super().__init__(f"the broker closed the link ({code} {reason})".strip())
        self.code = code
        self.reason = reason


class FrameTooLarge(Exception):
    """An inbound WebSocket message is past ``link_frame_max_bytes``; its frame's header has been read, not its data."""

    def __init__(self, size: int, first: bool):
        super().__init__(f"an inbound message of at least {size} bytes is past link_frame_max_bytes "
                         f"({limit('link_frame_max_bytes')})")
        self.size = size
        self.first = first  # the frame that made the message too large (later fragments are dropped silently)


class _BoundedFrames(websocket._abnf.frame_buffer):
    """websocket-client's frame reader, refusing a message past ``link_frame_max_bytes`` before reading its data."""

    def __init__(self, recv_fn: Callable[[int], bytes], skip_utf8_validation: bool):
        super().__init__(recv_fn, skip_utf8_validation)
        self.limit = int(limit("link_frame_max_bytes"))
        self._message = 0  # data bytes of the message being received so far
        self._dropping = False  # the rest of a message already found too large

    def recv_length(self) -> None:
        super().recv_length()
        opcode, fin = self.header[4], self.header[0]
        if opcode in (websocket.ABNF.OPCODE_TEXT, websocket.ABNF.OPCODE_BINARY):
            self._message, self._dropping = 0, False
        if opcode in (websocket.ABNF.OPCODE_TEXT, websocket.ABNF.OPCODE_BINARY, websocket.ABNF.OPCODE_CONT):
            self._message += self.length
            if self._dropping or self._message > self.limit:
                first = not self._dropping
                self._dropping = not fin
                raise FrameTooLarge(self._message, first)

    def drop(self, keep: int) -> bytes:
        """Read and drop the data of the frame whose header raised ``FrameTooLarge``; returns its first bytes."""
        with self.lock:
            if self.needs_mask():
                self.recv_mask()
            remaining, kept = self.length or 0, []
            while remaining:
                chunk = self.recv_strict(min(65_536, remaining))
                remaining -= len(chunk)
                if keep > 0:
                    kept.append(chunk[:keep])
                    keep -= len(kept[-1])
            self.clear()
        return b"".join(kept)


class _LinkSocket(websocket.WebSocket):
    """The link's WebSocket: frames past the limit are refused by their header (``_BoundedFrames``)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.frame_buffer = _BoundedFrames(self._recv, kwargs.get("skip_utf8_validation", False))


class Fatal(Exception):
    """The daemon must stop with ``code``, the exit code spec/tables/exit_codes.yaml names ``exit_name``."""

    def __init__(self, exit_name: str, reason: str):
        super().__init__(reason)
        self.code = exit_code(exit_name)
        self.reason = reason


@dataclass
class LinkState:
    """What /v1/health and /v1/version report about the link."""

    status: str = "connecting"  # connecting | open | closed
    negotiated: dict[str, Any] = field(default_factory=dict)
    broker_version: str | None = None
    max_age_hours: int | None = None
    reconnects: int = 0
    last_ack_ms: int | None = None
    lag_ms: int | None = None
    restarts: int = 0  # the link failed unexpectedly and was run again (E-41)
    last_failure: str | None = None
    quarantined: int = 0  # frames in quarantine (E-41)


class BrokerLink:
    """The broker link and its thread. ``publish(event, payload)`` delivers SSE events; ``on_fatal(code, why)`` stops.

    ``start``, ``join`` and ``is_alive`` are those of its thread; ``watch()`` (the runtime's watchdog) starts a new
    thread should the current one have ended while the daemon runs.
    """

    def __init__(
        self,
        *,
        config: dict[str, dict[str, Any]],
        keypair: Keypair,
        outbox: Any,
        inbox: Any,
        publish: Callable[[str, dict[str, Any]], None],
        on_fatal: Callable[[int, str], None],
        metrics: Any = None,
        trace: Any = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        tick_s: float = 0.02,
    ):
        self.config = config
        self.keypair = keypair
        self.outbox = outbox
        self.inbox = inbox
        self.publish = publish
        self.on_fatal = on_fatal
        self.metrics = metrics
        self.trace = trace
        self.clock = clock
        self.rng = rng or random.Random()
        self.tick_s = tick_s
        self.state = LinkState()
        self.mesh = config["daemon"]["mesh"]
        self.mesh_id = config["broker"]["mesh_id"] or self.mesh
        self.member_id = config["broker"]["member_id"] or keypair.public_hex
        self._stopping = threading.Event()
        self._draining = threading.Event()
        self._wake = threading.Event()
        self._requests: queue.Queue = queue.Queue()
        self._pending_requests: dict[str, Future] = {}
        self._deadlines: dict[str, float] = {}
        self._frame_check = fast_validator("broker/frame#/$defs/broker_to_daemon")
        self._request_seq = 0
        self._request_lock = threading.Lock()
        self._frame_bytes: dict[str, int] = {}  # client_message_id -> size of the frame in flight (1009 closes)
        self._thread = self._new_thread()
        self._fatal = False
        self._watch_lock = threading.Lock()

    # --- the thread and its supervision (E-41) ------------------------------------------------------------------
    def _new_thread(self) -> threading.Thread:
        return threading.Thread(target=self.run, name="meshd-broker-link", daemon=True)

    @property
    def name(self) -> str:
        return self._thread.name

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def watch(self) -> bool:
        """Start a new link thread if the current one has ended although the daemon runs; True when it did."""
        with self._watch_lock:
            if self._stopping.is_set() or self._fatal or self._thread.is_alive() or self._thread.ident is None:
                return False
            # req: LINK-RESTART
            self._failed("the broker-link thread ended")
            self._thread = self._new_thread()
            self._thread.start()
            return True

    def _failed(self, what: str) -> None:
        self.state.restarts += 1
        self.state.last_failure = what[:500]
        self._count("link_restarts_total")
        log.error("broker_link_restarted restarts=%d failure=%s", self.state.restarts, what)

    # --- called from IPC threads ---------------------------------------------------------------------------
    def wake(self) -> None:
        """A row was accepted: dispatch without waiting for the next tick."""
        if not self._wake.is_set():  # Event.set takes a Condition even when set; this runs on every accept
            self._wake.set()

    def request_peers(self, timeout: float) -> list[dict[str, Any]]:
        """Ask the broker for its peer list (GET /v1/peers)."""
        with self._request_lock:
            self._request_seq += 1
            request_id = f"peers-{os.getpid()}-{self._request_seq}"
        frame = {"type": "list_peers", "requestId": request_id}
        future = self._submit(frame, request_id)
        try:
            answer = future.result(timeout=timeout)
        except TimeoutError as exc:
            raise BrokerTimeout(f"no peers_list within {timeout:g} s") from exc
        finally:
            self._pending_requests.pop(request_id, None)
        return list(answer.get("peers", []))

    def send_frames(self, frames: list[dict[str, Any]]) -> None:
        """Queue fire-and-forget frames (profile updates); raises BrokerUnavailable when the link is down."""
        for frame in frames:
            self._submit(frame, None)

    def _submit(self, frame: dict[str, Any], request_id: str | None) -> Future:
        if self.state.status != "open":
            raise BrokerUnavailable("the broker link is not open")
        future: Future = Future()
        if request_id is not None:
            self._pending_requests[request_id] = future
        self._requests.put(frame)
        self._wake.set()
        return future

    def drain_and_stop(self, timeout: float) -> None:
        """Stop dispatching, wait up to ``timeout`` for outstanding acks, then close (E-15)."""
        self._draining.set()
        deadline = time.monotonic() + timeout
        while self._deadlines and time.monotonic() < deadline:
            time.sleep(0.02)
        self._stopping.set()
        self._wake.set()
        self.join(timeout=max(1.0, timeout))

    # --- the thread ----------------------------------------------------------------------------------------
    def run(self) -> None:
        """The thread: the link, run again after any failure it did not handle itself, until the daemon stops."""
        while not self._stopping.is_set():
            try:
                self._run()
                return
            # req: LINK-RESTART -- counted (health: link_restarts, link_last_failure), and the link runs again
            except BaseException as exc:
                with contextlib.suppress(BaseException):
                    log.exception("the broker link failed unexpectedly; running it again")
                    self._failed(f"{type(exc).__name__}: {exc}")
                    self._fail_pending_requests()
                    self.state.status = "connecting"
                    self._count("connected", 0)
            self._stopping.wait(RESTART_DELAY_S)

    def _run(self) -> None:
        attempt = 0
        while not self._stopping.is_set():
            ws = None
            try:
                ws = self._connect()
                self._handshake(ws)
                if attempt:
                    self.state.reconnects += 1
                    self.publish("daemon_reconnect", {"mesh": self.mesh, "attempt": attempt, "ts": self._ts()})
                # req: WS-RECONNECT-BACKOFF -- n counts the failures since the link was last open
                attempt = 0
                self.state.status = "open"
                self._count("connected", 1)
                log.info("broker_status status=open url=%s", self.config["broker"]["url"])
                self._serve(ws)
            except Fatal as fatal:
                self.state.status = "closed"
                self._fatal = True
                self.on_fatal(fatal.code, fatal.reason)
                return
            except BrokerClosed as closed:
                log.warning("broker_status status=closed code=%s reason=%s", closed.code, closed.reason)
                # req: LINK-1009-DEAD
                if closed.code == close_code("message_too_big"):
                    self._refuse_largest_in_flight()
                if self.state.status == "open":
                    self.publish("daemon_disconnect", {"mesh": self.mesh, "reason": str(closed), "code": closed.code,
                                                       "ts": self._ts()})
            except (OSError, websocket.WebSocketException, ValueError, TimeoutError, sqlite3.Error) as exc:
                # A store error while serving (e.g. disk I/O during a batch of acks) is a link loss too: the rows
                # it left inflight go back to pending below, and the link reconnects with backoff.
                log.warning("broker_status status=closed reason=%s", exc)
                if self.state.status == "open":
                    code = getattr(exc, "status_code", None)
                    self.publish("daemon_disconnect", {"mesh": self.mesh, "reason": str(exc) or type(exc).__name__,
                                                       "code": code, "ts": self._ts()})
            finally:
                was_open = self.state.status == "open"
                self.state.status = "closed" if self._stopping.is_set() else "connecting"
                if was_open:
                    self._count("connected", 0)
                self._fail_pending_requests()
                self._lose_inflight()
                if ws is not None:
                    _close_quietly(ws, close_code("going_away") if self._stopping.is_set() else 1000, "")
            if self._stopping.is_set():
                break
            attempt += 1
            # Only stopping cuts the backoff short: an accept's wake() must not, or a burst of sends while the broker
            # is away spends every attempt at once and leaves the next one at the cap (the first turn after a
            # reconnect drains whatever was accepted meanwhile).
            # req: WS-RECONNECT-BACKOFF -- only stopping cuts the wait short
            self._stopping.wait(self._reconnect_delay(attempt))

    def _connect(self) -> websocket.WebSocket:
        url = self.config["broker"]["url"]
        if not url:
            raise ValueError("broker.url is not configured")
        timeout = float(self.config["broker"]["hello_timeout_s"])
        # skip_utf8_validation: websocket-client's own check walks every byte in Python (~100 us per ack frame). Text
        # frames are still refused unless they are UTF-8: _parse decodes them strictly and quarantines what is not.
        return websocket.create_connection(url, timeout=timeout, enable_multithread=False, skip_utf8_validation=True,
                                           class_=_LinkSocket)

    def _handshake(self, ws: websocket.WebSocket) -> None:
        timestamp = int(self.clock() * 1000)
        pubkey = self.keypair.public_hex
        hello = {
            "type": "hello", "meshId": self.mesh_id, "memberId": self.member_id, "pubkey": pubkey,
            "sessionId": f"daemon-{os.getpid()}", "pid": os.getpid(), "hostname": socket.gethostname(),
            "displayName": self.config["daemon"]["display_name"] or None, "peerType": "ai", "channel": "meshd",
            "protocolVersion": SPEC_VERSION, "timestamp": timestamp,
            "signature": self.keypair.sign(hello_signature_payload(self.mesh_id, self.member_id, pubkey, timestamp)),
        }
        self._send(ws, {k: v for k, v in hello.items() if v is not None})
        ack = self._expect(ws, "hello_ack")
        self.state.broker_version = ack.get("brokerVersion")
        features = self.config["features"]
        # req: NEG-ORDER -- right after hello_ack; _serve, and with it every send frame, starts only once it validated
        request = {"type": "feature_negotiation_request", "require": list(required_bits(features["require"])),
                   "optional": list(features["optional"])}
        self._send(ws, request)
        response = self._expect(ws, "feature_negotiation_response")
        result = negotiate(response, features["require"], features["optional"])
        for warning in result.warnings:
            log.warning("%s", warning)
        log.debug("feature_negotiation_response %s", json.dumps(response))
        if not result.ok:
            self._refuse(ws, result.failure, {"request": request, "response": response})
        self.state.negotiated = {bit: dict(params) for bit, params in result.accepted.items()}
        self._apply_max_age()

    def _refuse(self, ws: websocket.WebSocket, reason: CloseReason, negotiation: dict[str, Any]) -> None:
        log.warning("feature_negotiation_failed %s negotiation=%s", json.dumps(reason.as_dict()),
                    json.dumps(negotiation))
        self.publish("feature_negotiation_failed", {**reason.as_dict(), "negotiation": negotiation, "ts": self._ts()})
        # req: NEG-CLOSE-4010, NEG-CLOSE-REASON-FIT -- then exit 10
        _close_quietly(ws, close_code("feature_unavailable"), reason.close_payload())
        raise Fatal("feature_negotiation_failed",
                    f"feature negotiation failed: {reason.kind} {reason.feature}: {reason.detail}")

    def _apply_max_age(self) -> None:
        dedupe = self.state.negotiated.get("client_message_id_dedupe", {})
        outbox_cfg = self.config["outbox"]
        override = outbox_cfg["max_age_hours_override"] or None
        try:
            derived = maxage.derive(dedupe.get("mode", "permanent"), dedupe.get("dedupe_retention_days"),
                                    outbox_cfg["max_age_hours"], override)
        except maxage.MaxAgeError as exc:
            # req: MAXAGE-OVERRIDE -- an override outside the window refuses to run (exit 3)
            raise Fatal("invalid_config", f"{exc.code}: {exc.detail}") from exc
        self.state.max_age_hours = derived.hours
        self.outbox.cap_max_age(derived.hours)

    def _expect(self, ws: websocket.WebSocket, kind: str) -> dict[str, Any]:
        deadline = time.monotonic() + float(self.config["broker"]["hello_timeout_s"])
        while time.monotonic() < deadline:
            ws.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                frame = self._parse(ws, self._receive(ws))
            except websocket.WebSocketTimeoutException:
                break
            if frame is None:
                continue
            if frame.get("type") == kind:
                return frame
            if frame.get("type") == "error":
                raise ValueError(f"broker error during handshake: {frame.get('code')}: {frame.get('message')}")
            log.warning("unexpected %s frame while waiting for %s", frame.get("type"), kind)
        raise TimeoutError(f"no {kind} from the broker")

    def _serve(self, ws: websocket.WebSocket) -> None:
        ws.settimeout(self.tick_s)
        while not self._stopping.is_set():
            self._send_requests(ws)
            if not self._draining.is_set():
                self._drain(ws)
            self._check_timeouts()
            try:
                raw = self._receive(ws)
            except websocket.WebSocketTimeoutException:
                continue
            # Frames are handled in arrival order; a run of consecutive acks is applied in one transaction.
            acks: list[tuple[dict[str, Any], Any]] = []
            for index in range(MAX_FRAMES_PER_TURN):
                if index and not _readable(ws):
                    break
                if index:
                    raw = self._receive(ws)
                frame = self._parse(ws, raw)
                if frame is None:
                    continue
                if frame.get("type") == "ack":
                    acks.append((frame, raw))
                    continue
                self._take_acks(ws, acks)
                acks = []
                self._take(ws, frame, raw)
            self._take_acks(ws, acks)

    # --- frames --------------------------------------------------------------------------------------------
    def _send(self, ws: websocket.WebSocket, frame: dict[str, Any]) -> None:
        ws.send(json.dumps(frame, separators=(",", ":"), ensure_ascii=False))

    def _send_many(self, ws: websocket.WebSocket, texts: list[str]) -> None:
        """Send text frames (each masked by websocket-client, as ``ws.send`` would) in one write, not one each."""
        data = b"".join(websocket.ABNF.create_frame(text, websocket.ABNF.OPCODE_TEXT).format() for text in texts)
        ws.sock.settimeout(float(self.config["broker"]["request_timeout_s"]))  # a whole batch, not one recv tick
        try:
            ws.sock.sendall(data)
        finally:
            ws.sock.settimeout(self.tick_s)

    def _receive(self, ws: websocket.WebSocket) -> bytes | str | None:
        """The next inbound message's data; None when it was dropped into quarantine (too large, or binary).

        Raises:
            BrokerClosed: the broker's close frame (with its code).
            websocket.WebSocketTimeoutException: nothing within the socket's timeout.
        """
        try:
            opcode, data = ws.recv_data()
        except FrameTooLarge as too_large:
            previous = ws.gettimeout()
            ws.settimeout(float(self.config["broker"]["request_timeout_s"]))  # the rest of it, not one tick
            try:
                prefix = ws.frame_buffer.drop(QUARANTINE_PREFIX_BYTES)
            finally:
                ws.settimeout(previous)
            ws.cont_frame = websocket._abnf.continuous_frame(False, True)  # forget any part received before
            if too_large.first:
                self._quarantine(ws, prefix, str(too_large), size=too_large.size)
            return None
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            code = int.from_bytes(data[:2], "big") if len(data) >= 2 else None
            raise BrokerClosed(code, bytes(data[2:]).decode("utf-8", errors="replace"))
        if opcode == websocket.ABNF.OPCODE_BINARY:
            # req: LINK-FRAME-IJSON -- frames are text messages
            self._quarantine(ws, data, "a binary message (the link carries JSON text)")
            return None
        return data

    def _parse(self, ws: websocket.WebSocket, raw: bytes | str | None) -> dict[str, Any] | None:
        """The frame, checked against the JSON limits and its schema; None (quarantined) when it cannot be taken.

        An ack that fails its schema but names a client_message_id is quarantined *and* returned, marked
        ``_invalid``: its row gets the ack_events table's ``invalid`` event (ack_failed, E-10).
        """
        if raw is None:
            return None
        try:
            frame = loads(raw, object_pairs_hook=unique_keys)
        except Unparsable as exc:
            # req: LINK-FRAME-IJSON -- a frame that is not I-JSON (a key named twice, too) is quarantined
            self._quarantine(ws, raw, f"unparsable: {exc}")
            return None
        except LimitExceeded as exc:
            self._quarantine(ws, raw, f"{exc.limit}: {exc.detail}", document=exc.document)
            return None
        if not isinstance(frame, dict):
            self._quarantine(ws, raw, "the frame is not a JSON object")
            return None
        # req: INB-SCHEMA -- an invalid frame is quarantined and counted
        errors = list(self._frame_check.iter_errors(frame))
        if errors:
            reason = f"{str(frame.get('type'))[:64]!r} frame: {errors[0].message}"[:1000]
            self._quarantine(ws, raw, reason, document=frame)
            if frame.get("type") == "ack" and isinstance(frame.get("client_message_id") or frame.get("id"), str):
                frame["_invalid"] = errors[0].message[:500]
                return frame
            return None
        return frame

    def _take(self, ws: websocket.WebSocket, frame: dict[str, Any], raw: Any) -> None:
        """Handle one valid frame; a failure that is not the store's or the socket's quarantines it (E-41)."""
        try:
            # req: LINK-SURVIVES -- a frame whose handling fails is quarantined, and the link carries on
            self._handle(ws, frame)
        except LINK_LOSSES:
            raise
        except Exception as exc:
            self._quarantine(ws, raw, f"handling failed: {type(exc).__name__}: {exc}"[:1000], document=frame)

    def _take_acks(self, ws: websocket.WebSocket, acks: list[tuple[dict[str, Any], Any]]) -> None:
        try:
            self._on_acks([frame for frame, _ in acks])
        except LINK_LOSSES:
            raise
        except Exception as exc:  # their rows keep their ack deadlines: they are retried after ack_timeout_s
            for frame, raw in acks:
                self._quarantine(ws, raw, f"handling failed: {type(exc).__name__}: {exc}"[:1000], document=frame)

    def _quarantine(self, ws: websocket.WebSocket, raw: Any, reason: str, document: Any = None,
                    size: int | None = None) -> None:
        """Keep a frame the daemon cannot take, count it, and acknowledge it when it is a push naming its delivery.

        The quarantine row commits before the ``client_ack`` goes out (the rule of INB-DURABLE-BEFORE-ACK).
        """
        data = raw if isinstance(raw, bytes) else str(raw).encode("utf-8", errors="surrogatepass")
        ids = _frame_ids(document)
        log.warning("invalid_inbound %s", reason)
        self._count("invalid_inbound_total")
        quarantine_id, new = self.inbox.quarantine(
            frame_key=_frame_key(data, document), frame=data, frame_bytes=size or len(data), reason=reason,
            now_ms=self._now_ms(), frame_type=ids.get("type"), client_message_id=ids.get("client_message_id"),
            broker_message_id=ids.get("broker_message_id"), delivery_id=ids.get("delivery_id"),
            max_rows=int(limit("quarantine_max_rows")))
        if new:
            self.state.quarantined += 1
        # req: INB-QUARANTINE -- acknowledged only after the quarantine row committed
        if "ack" in ids:
            self._send(ws, ids["ack"])
            self.inbox.mark_quarantine_acked(quarantine_id)

    def _handle(self, ws: websocket.WebSocket, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind == "ack":
            self._on_acks([frame])
        elif kind == "push":
            self._on_push(ws, frame)
        elif kind == "peers_list":
            future = self._pending_requests.get(frame.get("requestId", ""))
            if future is None and len(self._pending_requests) == 1:
                future = next(iter(self._pending_requests.values()))
            if future is not None and not future.done():
                future.set_result(frame)
        elif kind == "error":
            log.warning("broker error %s: %s", frame.get("code"), frame.get("message"))
        else:
            log.info("ignoring %s frame", kind)

    def _on_acks(self, frames: list[dict[str, Any]]) -> None:
        """Apply each ack's outbox event (E-10), in order, in one transaction; the core's table decides (E-17)."""
        if not frames:
            return
        now = self._now_ms()
        changes = []
        for frame in frames:
            cmid = frame.get("client_message_id") or frame.get("id")
            # req: OBX-BROKER-OUTCOMES, OBX-RETRY-LATER, WS-ACK-STATUS -- spec/tables/ack_events.yaml picks the event
            acked = ack_event(frame, invalid=frame.get("_invalid"))  # an invalid one: quarantined by _parse
            retry_after = frame.get("retry_after_ms")
            changes.append((cmid, OutboxEvent(
                acked.event, now=now,
                broker_message_id=frame.get("broker_message_id") or frame.get("messageId") or None,
                history_id=frame.get("history_id"), error=acked.error, jitter_unit=self._jitter(),
                retry_after_ms=retry_after if isinstance(retry_after, int) and not isinstance(retry_after, bool)
                else None)))
        self.state.last_ack_ms = now
        # The rows keep their ack deadlines until the batch has committed: if it raises, the link closes and
        # _lose_inflight() returns every one of them to pending (link_lost).
        # req: OBX-LATE-ACK -- a late ack still applies to a row back in pending
        results = self.outbox.transition_many(changes, by="client_message_id")
        for cmid, _ in changes:
            self._deadlines.pop(cmid, None)
            self._frame_bytes.pop(cmid, None)
        for (cmid, _), result in zip(changes, results, strict=True):
            if isinstance(result, LookupError):
                log.warning("ack for unknown client_message_id %s", cmid)
            elif isinstance(result, TransitionError):
                log.error("%s", result)
            else:
                self._perform(result)

    def _on_push(self, ws: websocket.WebSocket, frame: dict[str, Any]) -> None:
        if frame.get("subtype") == "system":
            name = {"peer_joined": "peer_join", "peer_left": "peer_leave"}.get(frame.get("event", ""))
            data = frame.get("eventData") or {}
            if name is not None:
                payload = {"mesh": self.mesh, "pubkey": data.get("pubkey", ""), "ts": self._ts()}
                if data.get("displayName"):
                    payload["displayName"] = data["displayName"]
                self.publish(name, payload)
            return
        self._count("recv_total")

        def traced(inserted: dict[str, Any] | None) -> None:
            # E-32: a new row's inbox_insert is written before its message sse_event (receive announces it after)
            if self.trace is not None:
                self.trace.emit("inbox_insert", mesh=self.mesh, recipient=self.keypair.public_hex,
                                client_message_id=frame["client_message_id"], broker_message_id=frame["messageId"],
                                delivery_id=frame.get("delivery_id"), inserted=inserted is not None,
                                inbox_seq=None if inserted is None else inserted["seq"])

        inserted = self.inbox.receive(frame, self.mesh, self._now_ms(), traced=traced)
        # req: INB-DEDUPE
        if inserted is None:
            self._count("dedupe_total", direction="inbound")
        # req: INB-DURABLE-BEFORE-ACK, INB-CLIENT-ACK -- after the inbox commit, for a duplicate too
        self._send(ws, {"type": "client_ack", "clientMessageId": frame["client_message_id"],
                        "brokerMessageId": frame["messageId"], "delivery_id": frame.get("delivery_id", "")})

    # --- outbox --------------------------------------------------------------------------------------------
    def _drain(self, ws: websocket.WebSocket) -> None:
        """Expire, then claim due rows (committed ``inflight`` in one transaction) and only then send their frames."""
        # req: OBX-DISPATCH, OBX-MAX-AGE-DEAD -- committed inflight (or dead) before any frame goes out
        expired, dispatched = self.outbox.drain(self._now_ms(), DISPATCH_BATCH)
        for result in expired:
            self._perform(result)
        sent = [result.after for result in dispatched if result.outcome == "transition"]
        deadline = time.monotonic() + float(self.config["outbox"]["ack_timeout_s"])
        for row in sent:  # armed before any frame goes out: a link lost mid-way returns every claimed row
            self._deadlines.pop(row.client_message_id, None)  # (re)armed at the end: deadlines stay in time order
            self._deadlines[row.client_message_id] = deadline
        if not sent:
            return
        texts, ceiling = [], int(limit("link_frame_max_bytes"))
        for row in sent:
            text = json.dumps(send_frame(row), separators=(",", ":"), ensure_ascii=False)
            size = len(text.encode("utf-8")) if len(text) > ceiling // 4 else len(text)
            # req: LINK-1009-DEAD
            if size > ceiling:  # accepted by an older daemon or under other limits: it can never be carried (E-40)
                self._deadlines.pop(row.client_message_id, None)
                self._retry(row.client_message_id, "ack_rejected",
                            f"413 frame_too_large: the send frame is {size} bytes; the link carries at most {ceiling}")
                continue
            self._frame_bytes[row.client_message_id] = size
            texts.append(text)
        if texts:
            self._send_many(ws, texts)
            self._count("send_total", len(texts))

    def _check_timeouts(self) -> None:
        # Deadlines are armed in time order with one ack_timeout_s, and a dict keeps insertion order, so the expired
        # ones are a prefix: this runs every turn, and must not scan every inflight row each time.
        now = time.monotonic()
        expired = []
        for cmid, deadline in self._deadlines.items():
            if deadline > now:
                break
            expired.append(cmid)
        for cmid in expired:
            self._deadlines.pop(cmid, None)
            self._frame_bytes.pop(cmid, None)
            # req: OBX-BROKER-OUTCOMES -- an ack timeout returns the row to pending
            self._retry(cmid, "ack_timeout", "no ack within ack_timeout_s")

    def _lose_inflight(self) -> None:
        for cmid in list(self._deadlines):
            self._deadlines.pop(cmid, None)
            # req: OBX-BROKER-OUTCOMES -- a lost link too
            self._retry(cmid, "link_lost", "the broker link closed before the ack")
        self._frame_bytes.clear()

    def _refuse_largest_in_flight(self) -> None:
        """The broker closed 1009 (a message too big for it): the largest frame in flight was (at least) too big, so
        its row goes dead (``ack_rejected``) instead of being resent after every reconnect (E-40)."""
        in_flight = [cmid for cmid in self._deadlines if cmid in self._frame_bytes]
        if not in_flight:
            log.warning("the broker closed 1009 with no send in flight")
            return
        cmid = max(in_flight, key=self._frame_bytes.__getitem__)
        size = self._frame_bytes.pop(cmid)
        self._deadlines.pop(cmid, None)
        self._retry(cmid, "ack_rejected", f"413 frame_too_large: the broker closed the link 1009 (message too big) "
                    f"with this row's {size}-byte frame the largest in flight")

    def _retry(self, cmid: str, event: str, error: str) -> None:
        """Apply ``event`` (a retry, or a refusal the daemon decides itself) to the row ``cmid``."""
        try:
            result = self.outbox.transition(cmid, OutboxEvent(event, now=self._now_ms(), error=error,
                                                              jitter_unit=self._jitter()), by="client_message_id")
        except (KeyError, LookupError, TransitionError) as exc:
            log.error("cannot apply %s to %s: %s", event, cmid, exc)
            return
        self._perform(result)

    def _perform(self, result: Any) -> None:
        """Carry out the IO effects the table named for a transition."""
        row = result.after
        for effect in result.effects:
            if effect == "log_info":
                log.info("outbox %s -> %s (%s)", row.client_message_id, row.status, result.table_row)
            elif effect == "log_warn":
                log.warning("outbox %s -> %s (%s): history pruned at the broker", row.client_message_id, row.status,
                            result.table_row)
            elif effect == "log_error":
                log.error("outbox %s -> dead: %s", row.client_message_id, row.last_error)
            # req: OBX-HISTORY-PRUNED-WARN
            elif effect == "count_history_pruned":
                self._count("dedupe_history_pruned_total")
            # req: OBX-DEAD-EVENT
            elif effect == "emit_outbox_dead":
                conflict = None
                if row.last_error and row.last_error.startswith("idempotency_key_reused: "):
                    conflict = row.last_error.split(": ", 1)[1].split(" ", 1)[0]
                self.publish("outbox_dead", {"outbox_id": row.id, "client_message_id": row.client_message_id,
                                             "last_error": row.last_error or "", "conflict": conflict,
                                             "ts": self._ts()})

    def _send_requests(self, ws: websocket.WebSocket) -> None:
        while True:
            try:
                frame = self._requests.get_nowait()
            except queue.Empty:
                return
            self._send(ws, frame)

    def _fail_pending_requests(self) -> None:
        for future in list(self._pending_requests.values()):
            if not future.done():
                future.set_exception(BrokerUnavailable("the broker link closed"))
        while True:
            try:
                self._requests.get_nowait()
            except queue.Empty:
                break

    # --- helpers -------------------------------------------------------------------------------------------
    def _reconnect_delay(self, attempt: int) -> float:
        cfg = self.config["reconnect"]
        # req: WS-RECONNECT-SCHEDULE, WS-RECONNECT-BACKOFF
        base = min(cfg["max_ms"], cfg["initial_ms"] * cfg["multiplier"] ** (attempt - 1))
        return max(0.0, base * (1 + cfg["jitter"] * self._jitter())) / 1000

    def _jitter(self) -> float:
        return self.rng.uniform(-1.0, 1.0)

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _ts(self) -> str:
        """Now by the link's clock, as an SSE payload's ``ts``."""
        return now_rfc3339(self.clock)

    def _count(self, name: str, value: float | None = None, **labels: str) -> None:
        if self.metrics is not None:
            self.metrics.record(name, value, **labels)


def send_frame(row: Any) -> dict[str, Any]:
    """The ``send`` frame for an outbox row: always the stored bytes and the frozen fingerprint (WS-SEND-SAME-BYTES)."""
    # req: WS-SEND-SAME-BYTES, FP-FROZEN -- the stored bytes and the frozen fingerprint, on every attempt
    payload = load_payload(row.payload)
    return {
        "type": "send",
        "id": row.client_message_id,
        "client_message_id": row.client_message_id,
        "request_fingerprint": row.request_fingerprint.hex(),
        "envelope_version": ENVELOPE_VERSION,
        "destination_kind": payload["destination_kind"],
        "destination_ref": payload["destination_ref"],
        "priority": payload["priority"],
        "reply_to_id": payload["reply_to_id"],
        "meta": payload["meta"],
        "body": payload["message"],
        "targetSpec": payload["to"],
    }


def _frame_ids(document: Any) -> dict[str, Any]:
    """What a quarantined frame says about itself (its type and ids), and the client_ack it can be answered with.

    Only a message push whose delivery_id, client_message_id and messageId are all well-formed can be acknowledged
    (client_ack's schema needs the three); a system push, an ack or a frame without those ids cannot.
    """
    if not isinstance(document, dict):
        return {}
    ids: dict[str, Any] = {"type": document["type"][:64] if isinstance(document.get("type"), str) else None}
    cmid, bmid, delivery = document.get("client_message_id"), document.get("messageId"), document.get("delivery_id")
    if is_client_message_id(cmid):
        ids["client_message_id"] = cmid
    if is_broker_message_id(bmid):
        ids["broker_message_id"] = bmid
    if fast_validator("broker/client_ack#/properties/delivery_id").is_valid(delivery):
        ids["delivery_id"] = delivery
    if (ids["type"] == "push" and document.get("subtype") != "system"
            and {"client_message_id", "broker_message_id", "delivery_id"} <= ids.keys()):
        ids["ack"] = {"type": "client_ack", "clientMessageId": cmid, "brokerMessageId": bmid, "delivery_id": delivery}
    return ids


def _frame_key(data: bytes, document: Any) -> bytes:
    """What identifies a quarantined frame across redeliveries: its content without the delivery ``attempt``."""
    if isinstance(document, dict) and "attempt" in document:
        # a stand-in for a too-long integer, or nesting too deep to write: the frame's own bytes are its key then
        with contextlib.suppress(TypeError, ValueError, RecursionError):
            data = json.dumps({k: v for k, v in document.items() if k != "attempt"}, sort_keys=True,
                              ensure_ascii=False, separators=(",", ":")).encode("utf-8", errors="surrogatepass")
    return hashlib.sha256(data).digest()


def _readable(ws: websocket.WebSocket) -> bool:
    """Whether the link's socket has bytes waiting (so ``recv`` returns without waiting for the broker)."""
    poller = select.poll()
    poller.register(ws.sock, select.POLLIN)
    return bool(poller.poll(0))


def _close_quietly(ws: websocket.WebSocket, code: int, reason: str) -> None:
    """Send a close frame (if the connection is still open) and always release the TCP socket.

    websocket-client answers a peer's close frame inside ``recv`` but leaves the socket open, and ``close`` is then
    a no-op; without the ``shutdown`` the peer waits for the TCP close until its own timeout.
    """
    with contextlib.suppress(OSError, websocket.WebSocketException):
        ws.close(status=code, reason=reason.encode("utf-8"), timeout=1)
    with contextlib.suppress(OSError, websocket.WebSocketException):
        ws.shutdown()
