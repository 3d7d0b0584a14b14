"""The daemon's persistent WebSocket link to the broker (websocket-client), in one thread.

Theory of operation. The thread connects, sends a signed ``hello``, waits for ``hello_ack``, then negotiates features
(E-08) before sending anything else. A failed negotiation closes with 4010 and the structured reason (E-07) and is
fatal (exit 10). Once open, one loop does everything, so no lock guards the socket:

* drain: rows past their max age go ``dead``; due ``pending`` rows go ``inflight`` (the transition is committed
  before the frame is sent) and their ack deadline is armed;
* acks: each ack's status picks the outbox event (E-10); the core's table decides what happens (E-17 for late acks);
* pushes: an inbound message is inserted into inbox.db with its ``message`` event in one transaction, *then*
  acknowledged with ``client_ack`` (duplicates are acknowledged too, so the broker stops redelivering);
* timeouts: an inflight row whose ack deadline passed returns to ``pending``;
* requests from IPC threads (peers, profile) arrive through a queue.

When the socket drops, every row this process dispatched and has not heard back about returns to ``pending``
(``link_lost``) and the thread reconnects with exponential backoff and jitter.
"""

from __future__ import annotations

import contextlib
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

from reference.core import OutboxEvent, TransitionError, maxage, negotiate
from reference.core.features import CloseReason
from reference.core.request import load_payload
from spec import SPEC_VERSION, fast_validator

from .identity import Keypair, hello_signature_payload

log = logging.getLogger("meshd.link")
CLOSE_FEATURE_UNAVAILABLE = 4010
EXIT_NEGOTIATION = 10
EXIT_CONFIG = 3
DISPATCH_BATCH = 256  # due rows claimed per drain transaction
MAX_FRAMES_PER_TURN = 256  # inbound frames read before the loop drains and checks timeouts again


class BrokerUnavailable(Exception):
    """The link is not open."""


class BrokerTimeout(Exception):
    """The broker did not answer in time."""


class Fatal(Exception):
    """The daemon must stop with ``code``."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code
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


def ack_event(frame: dict[str, Any]) -> tuple[str, str | None]:
    """The outbox event for an ack frame (E-10), and the error text a dead or retried row records."""
    status = frame.get("status")
    if not isinstance(status, int) or isinstance(status, bool):
        return "ack_failed", "ack without a valid status (E-10)"
    if status == 201:
        return "ack_created", None
    if status == 200:
        return ("ack_duplicate_history" if frame.get("history_available", True) else "ack_duplicate_pruned"), None
    if status == 409:
        detail = f"idempotency_key_reused: {frame.get('conflict')}"
        if frame.get("broker_fingerprint_prefix"):
            detail += f" (broker fingerprint {frame['broker_fingerprint_prefix']})"
        return "ack_conflict", detail
    text = f"{status} {frame.get('error', 'error')}"
    if frame.get("detail"):
        text += f": {frame['detail']}"
    if 400 <= status < 500:
        return "ack_rejected", text
    return "ack_failed", text


class BrokerLink(threading.Thread):
    """The broker link thread. ``publish(event, payload)`` delivers SSE events; ``on_fatal(code, reason)`` stops."""

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
        super().__init__(name="meshd-broker-link", daemon=True)
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
        attempt = 0
        while not self._stopping.is_set():
            ws = None
            try:
                ws = self._connect()
                self._handshake(ws)
                if attempt:
                    self.state.reconnects += 1
                    self.publish("daemon_reconnect", {"mesh": self.mesh, "attempt": attempt, "ts": _now_iso()})
                attempt = 0
                self.state.status = "open"
                self._count("connected", 1)
                log.info("broker_status status=open url=%s", self.config["broker"]["url"])
                self._serve(ws)
            except Fatal as fatal:
                self.state.status = "closed"
                self.on_fatal(fatal.code, fatal.reason)
                return
            except (OSError, websocket.WebSocketException, ValueError, TimeoutError, sqlite3.Error) as exc:
                # A store error while serving (e.g. disk I/O during a batch of acks) is a link loss too: the rows
                # it left inflight go back to pending below, and the link reconnects with backoff.
                log.warning("broker_status status=closed reason=%s", exc)
                if self.state.status == "open":
                    code = getattr(exc, "status_code", None)
                    self.publish("daemon_disconnect", {"mesh": self.mesh, "reason": str(exc) or type(exc).__name__,
                                                       "code": code, "ts": _now_iso()})
            finally:
                was_open = self.state.status == "open"
                self.state.status = "closed" if self._stopping.is_set() else "connecting"
                if was_open:
                    self._count("connected", 0)
                self._fail_pending_requests()
                self._lose_inflight()
                if ws is not None:
                    _close_quietly(ws, 1001 if self._stopping.is_set() else 1000, "")
            if self._stopping.is_set():
                break
            attempt += 1
            # Only stopping cuts the backoff short: an accept's wake() must not, or a burst of sends while the broker
            # is away spends every attempt at once and leaves the next one at the cap (the first turn after a
            # reconnect drains whatever was accepted meanwhile).
            self._stopping.wait(self._reconnect_delay(attempt))

    def _connect(self) -> websocket.WebSocket:
        url = self.config["broker"]["url"]
        if not url:
            raise ValueError("broker.url is not configured")
        timeout = float(self.config["broker"]["hello_timeout_s"])
        # skip_utf8_validation: websocket-client's own check walks every byte in Python (~100 us per ack frame). Text
        # frames are still refused unless they are UTF-8: recv() decodes them strictly, and the UnicodeDecodeError
        # (a ValueError) ends the connection in run() exactly as the validator's WebSocketPayloadException did.
        return websocket.create_connection(url, timeout=timeout, enable_multithread=False, skip_utf8_validation=True)

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
        request = {"type": "feature_negotiation_request", "require": list(features["require"]),
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
        self.publish("feature_negotiation_failed", {**reason.as_dict(), "negotiation": negotiation, "ts": _now_iso()})
        _close_quietly(ws, CLOSE_FEATURE_UNAVAILABLE, reason.close_payload())
        raise Fatal(EXIT_NEGOTIATION, f"feature negotiation failed: {reason.kind} {reason.feature}: {reason.detail}")

    def _apply_max_age(self) -> None:
        dedupe = self.state.negotiated.get("client_message_id_dedupe", {})
        outbox_cfg = self.config["outbox"]
        override = outbox_cfg["max_age_hours_override"] or None
        try:
            derived = maxage.derive(dedupe.get("mode", "permanent"), dedupe.get("dedupe_retention_days"),
                                    outbox_cfg["max_age_hours"], override)
        except maxage.MaxAgeError as exc:
            raise Fatal(EXIT_CONFIG, f"{exc.code}: {exc.detail}") from exc
        self.state.max_age_hours = derived.hours
        self.outbox.cap_max_age(derived.hours * 3_600_000)

    def _expect(self, ws: websocket.WebSocket, kind: str) -> dict[str, Any]:
        deadline = time.monotonic() + float(self.config["broker"]["hello_timeout_s"])
        while time.monotonic() < deadline:
            ws.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                frame = self._parse(ws.recv())
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
                raw = ws.recv()
            except websocket.WebSocketTimeoutException:
                continue
            # Frames are handled in arrival order; a run of consecutive acks is applied in one transaction.
            acks: list[dict[str, Any]] = []
            for index in range(MAX_FRAMES_PER_TURN):
                if index and not _readable(ws):
                    break
                frame = self._parse(raw if index == 0 else ws.recv())
                if frame is None:
                    continue
                if frame.get("type") == "ack":
                    acks.append(frame)
                    continue
                self._on_acks(acks)
                acks = []
                self._handle(ws, frame)
            self._on_acks(acks)

    # --- frames --------------------------------------------------------------------------------------------
    def _send(self, ws: websocket.WebSocket, frame: dict[str, Any]) -> None:
        ws.send(json.dumps(frame, separators=(",", ":"), ensure_ascii=False))

    def _send_many(self, ws: websocket.WebSocket, frames: list[dict[str, Any]]) -> None:
        """Send text frames (each masked by websocket-client, as ``ws.send`` would) in one write, not one each."""
        data = b"".join(websocket.ABNF.create_frame(json.dumps(frame, separators=(",", ":"), ensure_ascii=False),
                                                    websocket.ABNF.OPCODE_TEXT).format() for frame in frames)
        ws.sock.settimeout(float(self.config["broker"]["request_timeout_s"]))  # a whole batch, not one recv tick
        try:
            ws.sock.sendall(data)
        finally:
            ws.sock.settimeout(self.tick_s)

    def _parse(self, raw: Any) -> dict[str, Any] | None:
        if isinstance(raw, bytes):
            raw = raw.decode("utf-8", errors="replace")
        if not raw:
            raise websocket.WebSocketConnectionClosedException("connection closed by the broker")
        try:
            frame = json.loads(raw)
        except json.JSONDecodeError:
            self._invalid("unparsable frame")
            return None
        if not isinstance(frame, dict):
            self._invalid("frame is not an object")
            return None
        errors = list(self._frame_check.iter_errors(frame))
        if errors:
            if frame.get("type") == "ack" and isinstance(frame.get("client_message_id") or frame.get("id"), str):
                frame["_invalid"] = errors[0].message
                return frame
            self._invalid(f"{frame.get('type')!r} frame: {errors[0].message}")
            return None
        return frame

    def _invalid(self, what: str) -> None:
        log.warning("invalid_inbound %s", what)
        self._count("invalid_inbound_total")

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
            if frame.get("_invalid"):
                self._invalid(f"ack for {cmid}: {frame['_invalid']}")
                event, error = "ack_failed", f"invalid ack: {frame['_invalid']}"
            else:
                event, error = ack_event(frame)
            changes.append((cmid, OutboxEvent(
                event, now=now, broker_message_id=frame.get("broker_message_id") or frame.get("messageId") or None,
                history_id=frame.get("history_id"), error=error, jitter_unit=self._jitter())))
        self.state.last_ack_ms = now
        # The rows keep their ack deadlines until the batch has committed: if it raises, the link closes and
        # _lose_inflight() returns every one of them to pending (link_lost).
        results = self.outbox.transition_many(changes, by="client_message_id")
        for cmid, _ in changes:
            self._deadlines.pop(cmid, None)
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
                payload = {"mesh": self.mesh, "pubkey": data.get("pubkey", ""), "ts": _now_iso()}
                if data.get("displayName"):
                    payload["displayName"] = data["displayName"]
                self.publish(name, payload)
            return
        self._count("recv_total")
        inserted = self.inbox.receive(frame, self.mesh, self._now_ms())
        if inserted is None:
            self._count("dedupe_total", direction="inbound")
        if self.trace is not None:
            self.trace.emit("inbox_insert", mesh=self.mesh, recipient=self.keypair.public_hex,
                            client_message_id=frame["client_message_id"], broker_message_id=frame["messageId"],
                            delivery_id=frame.get("delivery_id"), inserted=inserted is not None,
                            inbox_seq=None if inserted is None else inserted["seq"])
        self._send(ws, {"type": "client_ack", "clientMessageId": frame["client_message_id"],
                        "brokerMessageId": frame["messageId"], "delivery_id": frame.get("delivery_id", "")})

    # --- outbox --------------------------------------------------------------------------------------------
    def _drain(self, ws: websocket.WebSocket) -> None:
        """Expire, then claim due rows (committed ``inflight`` in one transaction) and only then send their frames."""
        expired, dispatched = self.outbox.drain(self._now_ms(), DISPATCH_BATCH)
        for result in expired:
            self._perform(result)
        sent = [result.after for result in dispatched if result.outcome == "transition"]
        deadline = time.monotonic() + float(self.config["outbox"]["ack_timeout_s"])
        for row in sent:  # armed before any frame goes out: a link lost mid-way returns every claimed row
            self._deadlines.pop(row.client_message_id, None)  # (re)armed at the end: deadlines stay in time order
            self._deadlines[row.client_message_id] = deadline
        if sent:
            self._send_many(ws, [send_frame(row) for row in sent])
            self._count("send_total", len(sent))

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
            self._retry(cmid, "ack_timeout", "no ack within ack_timeout_s")

    def _lose_inflight(self) -> None:
        for cmid in list(self._deadlines):
            self._deadlines.pop(cmid, None)
            self._retry(cmid, "link_lost", "the broker link closed before the ack")

    def _retry(self, cmid: str, event: str, error: str) -> None:
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
            elif effect == "count_history_pruned":
                self._count("dedupe_history_pruned_total")
            elif effect == "emit_outbox_dead":
                conflict = None
                if row.last_error and row.last_error.startswith("idempotency_key_reused: "):
                    conflict = row.last_error.split(": ", 1)[1].split(" ", 1)[0]
                self.publish("outbox_dead", {"outbox_id": row.id, "client_message_id": row.client_message_id,
                                             "last_error": row.last_error or "", "conflict": conflict,
                                             "ts": _now_iso()})

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
        base = min(cfg["max_ms"], cfg["initial_ms"] * cfg["multiplier"] ** (attempt - 1))
        return max(0.0, base * (1 + cfg["jitter"] * self._jitter())) / 1000

    def _jitter(self) -> float:
        return self.rng.uniform(-1.0, 1.0)

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _count(self, name: str, value: float | None = None, **labels: str) -> None:
        if self.metrics is not None:
            self.metrics.record(name, value, **labels)


def send_frame(row: Any) -> dict[str, Any]:
    """The ``send`` frame for an outbox row: always the stored bytes and the frozen fingerprint (WS-SEND-SAME-BYTES)."""
    payload = load_payload(row.payload)
    return {
        "type": "send",
        "id": row.client_message_id,
        "client_message_id": row.client_message_id,
        "request_fingerprint": row.request_fingerprint.hex(),
        "envelope_version": "1",
        "destination_kind": payload["destination_kind"],
        "destination_ref": payload["destination_ref"],
        "priority": payload["priority"],
        "reply_to_id": payload["reply_to_id"],
        "meta": payload["meta"],
        "body": payload["message"],
        "targetSpec": payload["to"],
    }


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


def _now_iso() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
