"""Deliberately broken brokers: the reference broker with one plausible mistake each, for testing the broker suite.

Each is served by `meshd broker serve`'s own code through its seams — ``cli.cmd_serve(open_store=, make_server=)``,
a ``BrokerServer`` subclass overriding one method, a store wrapper or a store subclass with one statement changed,
or an existing option (``--hello-skew-s``, ``--advertise``) — never by patching module attributes.
tests/broker/test_broker_suite_kills.py runs the broker suite against each and asserts it fails the requirement the
mistake breaks. Run one by hand:

    python tests/broker/broken_brokers.py NAME --store sqlite:///tmp/b/broker.db --listen 127.0.0.1:7931 --dev

``NAME`` ``reference`` serves the reference unchanged (the control).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ulid import ULID

from reference.broker.cli import add_commands, cmd_serve
from reference.broker.config import BrokerConfig, supported_features
from reference.broker.server import DAEMON_FRAMES, BrokerServer
from reference.broker.store import AcceptChecks, AcceptRequest, AcceptResult, BrokerStore, rfc3339_ms
from reference.broker.store.sqlite import SqliteStore
from reference.core.fingerprint import FingerprintInput, request_fingerprint
from reference.core.limits import LimitExceeded, Unparsable, limit, loads, unique_keys

# --- seams: a store wrapper, a connection wrapper ------------------------------------------------------------------


def _recomputed(req: AcceptRequest, **changes: Any) -> AcceptRequest:
    """``req`` with ``changes`` and the fingerprint an honest daemon would claim for the result."""
    req = dataclasses.replace(req, **changes)
    fingerprint = request_fingerprint(FingerprintInput(
        destination_kind=req.destination_kind, destination_ref=req.destination_ref, reply_to_id=req.reply_to_id,
        priority=req.priority, meta=req.meta, body=req.body))
    return dataclasses.replace(req, request_fingerprint=fingerprint)


def _with(result: AcceptResult, **members: Any) -> AcceptResult:
    return dataclasses.replace(result, body={**result.body, **members})


def _created(req: AcceptRequest) -> AcceptResult:
    """A 201 made up without the store (a phantom accept)."""
    body = {"client_message_id": req.client_message_id, "broker_message_id": str(ULID()),
            "history_id": str(ULID()), "duplicate": False}
    return AcceptResult("BRK-ACCEPT", 201, body, {"dedupe": 0, "message": 0, "history": 0, "delivery": 0})


class StoreWrapper:
    """The reference store, with ``answer`` rewriting each accept's outcome (and free to call the store again)."""

    def __init__(self, store: BrokerStore):
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def accept_batch(self, calls, checks=None) -> list[AcceptResult]:
        calls = [(self.request(req), bmid, hid) for req, bmid, hid in calls]
        results = self._store.accept_batch(calls, checks)
        return [self.answer(req, result, checks) for (req, _, _), result in zip(calls, results, strict=True)]

    def request(self, req: AcceptRequest) -> AcceptRequest:
        return req

    def answer(self, req: AcceptRequest, result: AcceptResult, checks: AcceptChecks | None) -> AcceptResult:
        return result

    def accept_again(self, req: AcceptRequest, checks: AcceptChecks | None) -> AcceptResult:
        return self._store.accept_batch([(req, str(ULID()), str(ULID()))], checks)[0]


class ConnWrapper:
    """A broker connection whose received frames ``frames`` may drop, add or reorder (``recv`` is the handshake's,
    iteration the frame loop's)."""

    def __init__(self, conn: Any):
        self._conn = conn
        self._handshake_frames = 0
        self.stashed: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def recv(self, timeout: float | None = None) -> Any:
        self._handshake_frames += 1
        return self.handshake_frame(self._conn.recv(timeout=timeout), self._handshake_frames, timeout)

    def __iter__(self) -> Iterator[Any]:
        yield from self.stashed
        for raw in self._conn:
            if self.keep(raw):
                yield raw

    def handshake_frame(self, raw: Any, number: int, timeout: float | None) -> Any:
        return raw

    def keep(self, raw: Any) -> bool:
        return True


def _parsed(raw: Any) -> dict[str, Any] | None:
    """The frame the reference's parser reads from ``raw``, or None when it reads none."""
    frame, _ = BrokerServer._parse(raw)
    return frame


# --- hello ---------------------------------------------------------------------------------------------------------


class AcceptsAnySignature(BrokerServer):
    def _signature_verified(self, hello):
        return True


class TrustsKnownMembers(BrokerServer):
    """Verifies a key's first hello; a later hello with a key it has seen passes unverified (a session cache)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._verified: set[str] = set()

    def _signature_verified(self, hello):
        if hello.get("pubkey") in self._verified:
            return True
        verified = super()._signature_verified(hello)
        if verified:
            self._verified.add(hello["pubkey"])
        return verified


class FutureHellosUnchecked(BrokerServer):
    """Refuses hellos older than the window, never ones dated in the future."""

    def _hello_skew_ms(self, timestamp_ms):
        late = self._now_ms() - timestamp_ms
        return late if late > self.config.hello_skew_s * 1000 else None


# --- protocol errors -----------------------------------------------------------------------------------------------


class _IgnoreUnknown(ConnWrapper):
    def keep(self, raw):
        frame = _parsed(raw)
        return frame is None or frame["type"] in DAEMON_FRAMES


class _IgnoreUnparsable(ConnWrapper):
    """Drops text that is not JSON at all; a frame that is JSON but too deep to parse still reaches the broker's own
    limits (BRK-FRAME-LIMITS judges that mistake, with its own broken brokers)."""

    def keep(self, raw):
        try:
            json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return False
        except (RecursionError, ValueError):  # JSON past a limit (depth, digits): the broker's limits judge it
            return True
        return True


class _SendBeforeNegotiation(ConnWrapper):
    """A send in place of the negotiation request is kept for the frame loop, as if negotiation were optional."""

    def handshake_frame(self, raw, number, timeout):
        frame = _parsed(raw)
        if number == 2 and frame is not None and frame["type"] == "send":
            self.stashed.append(raw)
            return json.dumps({"type": "feature_negotiation_request", "require": [], "optional": []})
        return raw


class _WaitForHello(ConnWrapper):
    """Skips whatever comes before the hello."""

    def handshake_frame(self, raw, number, timeout):
        while number == 1 and (_parsed(raw) or {}).get("type") != "hello":
            raw = self._conn.recv(timeout=timeout)
        return raw


class LastKeyWins(BrokerServer):
    """Parses frames as the reference did before E-46: a binary message like a text one, a repeated key last-wins."""

    @staticmethod
    def _parse(raw):
        try:
            frame, problem = loads(raw), None
        except Unparsable:
            return None, None
        except LimitExceeded as exc:
            frame, problem = exc.document, f"{exc.limit}: {exc.detail}"
        if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
            return None, None
        return frame, problem


def _wrapping(wrapper: type[ConnWrapper]) -> type[BrokerServer]:
    class Wrapped(BrokerServer):
        def _handle(self, conn):
            return super()._handle(wrapper(conn))

    Wrapped.__name__ = f"Broker{wrapper.__name__}"
    return Wrapped


# --- the accept decision -------------------------------------------------------------------------------------------


class _DuplicateNewHistoryId(StoreWrapper):
    def answer(self, req, result, checks):
        return _with(result, history_id=str(ULID())) if result.http_status == 200 else result


class _DuplicateFirstSeenNow(StoreWrapper):
    def answer(self, req, result, checks):
        return _with(result, first_seen_at=rfc3339_ms(time.time_ns() // 1_000_000)) if result.http_status == 200 \
            else result


class _PrefixOfStoredFingerprint(StoreWrapper):
    """A 409 mismatch names the stored row's fingerprint, not this send's (E-31 decides the latter)."""

    def __init__(self, store):
        super().__init__(store)
        self._stored: dict[tuple[str, str], str] = {}

    def answer(self, req, result, checks):
        key = (req.mesh_id, req.client_message_id)
        if result.http_status == 201:
            self._stored[key] = req.request_fingerprint.hex()
        if result.body.get("conflict") == "request_fingerprint_mismatch" and key in self._stored:
            return _with(result, broker_fingerprint_prefix=self._stored[key][:16])
        return result


class _DriftCheckedOnFirstSendOnly(StoreWrapper):
    """Recomputes the fingerprint of a first send only: a retry's claim is taken as its own."""

    def __init__(self, store):
        super().__init__(store)
        self._accepted: set[tuple[str, str]] = set()

    def request(self, req):
        return _recomputed(req) if (req.mesh_id, req.client_message_id) in self._accepted else req

    def answer(self, req, result, checks):
        if result.http_status == 201:
            self._accepted.add((req.mesh_id, req.client_message_id))
        return result


class _RefusalLeavesRow(StoreWrapper):
    """A refusal (B1 413 or B2 404) still claims the id: the send is kept under it as a note to self."""

    def __init__(self, store, statuses: tuple[int, ...]):
        super().__init__(store)
        self._statuses = statuses

    def answer(self, req, result, checks):
        if result.http_status in self._statuses:
            with contextlib.suppress(Exception):  # already there
                self._store.create_topic(req.mesh_id, "leftover")
            self.accept_again(_recomputed(req, destination_kind="topic", destination_ref="leftover",
                                          body="a refused send's leftover"), checks)
        return result


class _CreatesUnknownDestinations(StoreWrapper):
    """A DM to a non-member makes it a member; a send to an unknown queue creates the queue (with no consumer)."""

    def __init__(self, store, kind: str):
        super().__init__(store)
        self._kind = kind

    def answer(self, req, result, checks):
        if result.http_status != 404 or req.destination_kind != self._kind:
            return result
        if self._kind == "dm":
            self._store.add_member(req.mesh_id, req.destination_ref, "")
        else:
            self._store.create_queue(req.mesh_id, req.destination_ref, [])
        return self.accept_again(req, checks)


class TopicsWithoutSubscribers(BrokerServer):
    """--dev creates a topic on first use but subscribes nobody to it."""

    def _dev_topic(self, mesh_id, topic):
        with self.dev.lock, self._writer:
            if (mesh_id, topic) in self.dev.topics:
                return
            self.store.create_topic(mesh_id, topic)
            self.dev.topics.add((mesh_id, topic))


class _RaceSecondWinner(StoreWrapper):
    """Sends of one id that arrive together are each 'first': the later ones get a 201 of their own."""

    def accept_batch(self, calls, checks=None):
        seen: set[tuple[str, str]] = set()
        first, repeats = [], {}
        for index, (req, _, _) in enumerate(calls):
            key = (req.mesh_id, req.client_message_id)
            if key in seen:
                repeats[index] = _created(req)
            else:
                seen.add(key)
                first.append(index)
        results = dict(zip(first, self._store.accept_batch([calls[i] for i in first], checks), strict=True))
        return [results.get(i) or repeats[i] for i in range(len(calls))]


class _RaceMismatchAnswered200(StoreWrapper):
    """Sends of one id that arrive together are all duplicates of the one that won, whatever their body."""

    def accept_batch(self, calls, checks=None):
        results = self._store.accept_batch(calls, checks)
        keys = [(req.mesh_id, req.client_message_id) for req, _, _ in calls]
        won = {keys[i]: r for i, r in enumerate(results) if r.http_status in (200, 201)}
        out = []
        for key, result in zip(keys, results, strict=True):
            winner = won.get(key)
            if result.http_status == 409 and keys.count(key) > 1 and winner is not None:
                body = {"client_message_id": key[1], "broker_message_id": winner.body["broker_message_id"],
                        "history_id": winner.body["history_id"], "duplicate": True, "history_available": True,
                        "first_seen_at": rfc3339_ms(time.time_ns() // 1_000_000)}
                result = AcceptResult("BRK-DUP-MATCH", 200, body, result.effects)
            out.append(result)
        return out


class PayloadLimitOffByOne(BrokerServer):
    """Refuses a body of exactly the advertised inline_bytes (``>=`` for ``>``)."""

    def __init__(self, config, store, **kwargs):
        super().__init__(config, store, **kwargs)
        self.checks = AcceptChecks(max_payload_bytes=config.max_payload_bytes - 1, rate_limit=self.buckets.allow)


def _parsing(max_depth_change: int = 0, crash_when_too_deep: bool = False) -> type[BrokerServer]:
    """A broker whose frame parser differs: a json_max_depth off by ``max_depth_change`` levels, or (the mistake
    E-40 fixed) a frame too deep to parse escaping as an exception, which ends the connection 1011."""

    class Parsing(BrokerServer):
        @staticmethod
        def _parse(raw):
            if not isinstance(raw, str):  # E-46 as the reference: only the depth differs
                return None, None
            try:
                frame, problem = loads(raw, object_pairs_hook=unique_keys,
                                       max_depth=int(limit("json_max_depth")) + max_depth_change), None
            except LimitExceeded as exc:
                if exc.document is None and crash_when_too_deep:
                    raise RecursionError("maximum recursion depth exceeded while decoding a JSON object") from exc
                frame, problem = exc.document, f"{exc.limit}: {exc.detail}"
            except Unparsable:
                return None, None
            if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
                return None, None
            return frame, problem

    return Parsing


class _CountsCharacters(SqliteStore):
    """Measures the body in characters, not UTF-8 bytes."""

    @staticmethod
    def _phase_b1(req, checks, sender):
        if len(req.body) <= checks.max_payload_bytes:
            checks = AcceptChecks(max_payload_bytes=2**31, rate_limit=checks.rate_limit)
        return SqliteStore._phase_b1(req, checks, sender)


# --- delivery ------------------------------------------------------------------------------------------------------


class NeverRedelivers(BrokerServer):
    """Pushes each delivery once; a lapsed lease is leased again but never pushed."""

    def _lease(self, pubkey):
        return [delivery for delivery in super()._lease(pubkey) if delivery.attempt == 1]


class PushesRefusedSends(BrokerServer):
    """Pushes a DM to its recipient as soon as it is decided, whether it was accepted or not."""

    def _trace_accept(self, session, request, result):
        super()._trace_accept(session, request, result)
        if result.committed or request.destination_kind != "dm":
            return
        target = self.presence.target(request.mesh_id, request.destination_ref)
        if target is not None:
            target.send({"type": "push", "messageId": str(ULID()), "meshId": request.mesh_id,
                         "senderPubkey": request.sender_pubkey, "topic": None, "replyToId": None,
                         "priority": request.priority, "body": request.body, "meta": None,
                         "createdAt": rfc3339_ms(request.received_at_ms),
                         "client_message_id": request.client_message_id, "delivery_id": "0", "attempt": 1})


def _ack_statement(where: str) -> type[SqliteStore]:
    class AckStore(SqliteStore):
        SQL: ClassVar[dict[str, str]] = {**SqliteStore.SQL,
               "ack_delivery": f"UPDATE delivery_queue SET acked_at = COALESCE(acked_at, :now) WHERE {where}"}

    return AckStore


# --- the catalogue -------------------------------------------------------------------------------------------------


def _sqlite(cls: type[SqliteStore]) -> Callable[[str], BrokerStore]:
    def open_store(url: str) -> BrokerStore:
        store = cls(url.removeprefix("sqlite:///"))
        store.migrate()
        return store

    return open_store


def _wrapped(wrapper: Callable[[BrokerStore], StoreWrapper]) -> Callable[[str], Any]:
    def open_store(url: str) -> Any:
        return wrapper(_sqlite(SqliteStore)(url))

    return open_store


def _advertising(mode: str, days: int | None) -> dict[str, Any]:
    """What a broker whose meshes are retention_scoped for 30 days would advertise if it said ``mode``/``days``."""
    return supported_features(BrokerConfig(store_url=""), mode, days)


@dataclass(frozen=True)
class Broken:
    """One broken broker: what it gets wrong, the requirements the suite must fail, the cases that see it."""

    name: str
    description: str
    kills: tuple[str, ...]
    select: tuple[str, ...]
    make_server: type[BrokerServer] | None = None
    open_store: Callable[[str], Any] | None = None
    serve_args: tuple[str, ...] = ()
    advertise: dict[str, Any] | None = None
    lease_s: float = 1.0
    #: the one broken broker of its class that `make test` runs (the others run in the slow matrix)
    default: bool = False


CATALOGUE: dict[str, Broken] = {b.name: b for b in (
    # hello (4001, 4002)
    Broken("accepts-any-signature", "never verifies the hello signature", ("BRK-HELLO-AUTH",), ("broker.hello.auth",),
           make_server=AcceptsAnySignature),
    Broken("trusts-known-members", "verifies a key's first hello only", ("BRK-HELLO-AUTH",), ("broker.hello.auth",),
           make_server=TrustsKnownMembers, default=True),
    Broken("future-hellos-unchecked", "refuses stale hellos but not ones dated in the future", ("BRK-HELLO-AUTH",),
           ("broker.hello.skew",), make_server=FutureHellosUnchecked, default=True),
    Broken("skew-120s", "allows ±120 s instead of ±60 s", ("BRK-HELLO-AUTH",), ("broker.hello.skew",),
           serve_args=("--hello-skew-s", "120")),
    Broken("skew-30s", "allows ±30 s instead of ±60 s", ("BRK-HELLO-AUTH",), ("broker.hello.skew",),
           serve_args=("--hello-skew-s", "30")),
    # 4005
    Broken("ignores-unknown-frames", "drops a frame of an unknown type instead of closing 4005",
           ("BRK-PROTOCOL-ERROR",), ("broker.protocol_error",), make_server=_wrapping(_IgnoreUnknown)),
    Broken("ignores-unparsable-frames", "drops a frame that is not JSON instead of closing 4005",
           ("BRK-PROTOCOL-ERROR",), ("broker.protocol_error",), make_server=_wrapping(_IgnoreUnparsable)),
    Broken("send-before-negotiation", "takes a send in place of the negotiation request",
           ("BRK-PROTOCOL-ERROR",), ("broker.protocol_error",),
           make_server=_wrapping(_SendBeforeNegotiation), default=True),
    Broken("waits-for-hello", "skips frames that come before the hello", ("BRK-PROTOCOL-ERROR",),
           ("broker.protocol_error",), make_server=_wrapping(_WaitForHello)),
    Broken("last-key-wins", "takes binary messages and reads a repeated object key last-wins", ("LINK-FRAME-IJSON",),
           ("broker.frame_ijson",), make_server=LastKeyWins, default=True),
    # negotiation
    Broken("advertises-other-retention", "advertises 7 retention days for a 30-day mesh", ("BRK-ADVERTISE-POLICY",),
           ("broker.negotiation.policy",), advertise=_advertising("retention_scoped", 7), default=True),
    Broken("advertises-permanent", "advertises permanent dedupe for a 30-day mesh", ("BRK-ADVERTISE-POLICY",),
           ("broker.negotiation.policy",), advertise=_advertising("permanent", None)),
    # the accept decision
    Broken("duplicate-new-history-id", "a duplicate answers a freshly minted history_id", ("BRK-DUP-MATCH",),
           ("broker.accept.outcomes",), open_store=_wrapped(_DuplicateNewHistoryId)),
    Broken("duplicate-first-seen-now", "a duplicate's first_seen_at is the retry's time", ("BRK-DUP-MATCH",),
           ("broker.accept.outcomes",), open_store=_wrapped(_DuplicateFirstSeenNow), default=True),
    Broken("prefix-of-stored-fingerprint", "a 409 mismatch names the stored fingerprint's prefix",
           ("BRK-DUP-MISMATCH-PREFIX",), ("broker.accept.outcomes",),
           open_store=_wrapped(_PrefixOfStoredFingerprint), default=True),
    Broken("drift-on-first-send-only", "a retry's claimed fingerprint is not recomputed",
           ("BRK-RECOMPUTE", "BRK-RECOMPUTE-DRIFT"),
           ("broker.accept.recompute",), open_store=_wrapped(_DriftCheckedOnFirstSendOnly), default=True),
    Broken("payload-limit-off-by-one", "refuses a body of exactly inline_bytes", ("BRK-PAYLOAD-LIMIT",),
           ("broker.accept.b1",), make_server=PayloadLimitOffByOne),
    Broken("payload-counts-characters", "measures the body in characters, not UTF-8 bytes", ("BRK-PAYLOAD-LIMIT",),
           ("broker.accept.b1",), open_store=_sqlite(_CountsCharacters), default=True),
    # the JSON limits (E-40)
    Broken("depth-limit-off-by-one", "refuses a frame of exactly json_max_depth levels", ("BRK-FRAME-LIMITS",),
           ("broker.frame_limits",), make_server=_parsing(max_depth_change=-1)),
    Broken("depth-limit-lenient", "parses frames 8 levels past json_max_depth", ("BRK-FRAME-LIMITS",),
           ("broker.frame_limits",), make_server=_parsing(max_depth_change=8), default=True),
    Broken("too-deep-ends-1011", "a frame too deep to parse ends its connection 1011", ("BRK-FRAME-LIMITS",),
           ("broker.frame_limits",), make_server=_parsing(crash_when_too_deep=True)),
    Broken("b1-refusal-leaves-row", "a 413 still claims the id", ("BRK-B1-NO-WRITE",), ("broker.accept.b1",),
           open_store=_wrapped(lambda store: _RefusalLeavesRow(store, (413,))), default=True),
    Broken("b2-refusal-leaves-row", "a 404 destination_not_found still claims the id", ("BRK-B2-ROLLBACK",),
           ("broker.accept.b2",), open_store=_wrapped(lambda store: _RefusalLeavesRow(store, (404,)))),
    Broken("dm-to-stranger-accepted", "a DM to a key no member has makes it a member", ("BRK-B2-ROLLBACK",),
           ("broker.accept.b2",),
           open_store=_wrapped(lambda store: _CreatesUnknownDestinations(store, "dm")), default=True),
    Broken("unknown-queue-accepted", "a send to an unknown queue creates it, with no consumer", ("BRK-B2-ROLLBACK",),
           ("broker.accept.b2",), open_store=_wrapped(lambda store: _CreatesUnknownDestinations(store, "queue"))),
    Broken("topics-without-subscribers", "creates a topic on first use but subscribes nobody", ("BRK-B2-ROLLBACK",),
           ("broker.accept.b2",), make_server=TopicsWithoutSubscribers),
    Broken("race-second-winner", "concurrent sends of one id each get a 201", ("BRK-CONCURRENT-ONE-MESSAGE",),
           ("broker.accept.concurrent",), open_store=_wrapped(_RaceSecondWinner), default=True),
    Broken("race-mismatch-answered-200", "concurrent sends of one id are all duplicates, whatever their body",
           ("BRK-DUP-MISMATCH",), ("broker.accept.concurrent",),
           open_store=_wrapped(_RaceMismatchAnswered200), default=True),
    # delivery
    Broken("never-redelivers", "pushes each delivery once", ("BRK-REDELIVER",), ("broker.delivery",),
           make_server=NeverRedelivers, lease_s=2.0, default=True),
    Broken("pushes-refused-sends", "pushes a DM whether it was accepted or not", ("BRK-DELIVERY-COMMITTED",),
           ("broker.delivery",), make_server=PushesRefusedSends, lease_s=2.0),
    Broken("ack-from-any-member", "a client_ack from any member settles the delivery", ("BRK-CLIENT-ACK",),
           ("broker.delivery",), open_store=_sqlite(_ack_statement(
               "id = :id AND (:broker_message_id IS NULL OR broker_message_id = :broker_message_id)")), lease_s=2.0,
           default=True),
    Broken("ack-ignores-message-id", "a client_ack settles its delivery_id whatever brokerMessageId it names",
           ("BRK-CLIENT-ACK",), ("broker.delivery",),
           open_store=_sqlite(_ack_statement("id = :id AND recipient_pubkey = :recipient")), lease_s=2.0, default=True),
    Broken("ack-ignores-delivery-id", "a client_ack settles the message it names whatever delivery_id it names",
           ("BRK-CLIENT-ACK",), ("broker.delivery",), open_store=_sqlite(_ack_statement(
               "recipient_pubkey = :recipient AND broker_message_id = :broker_message_id")), lease_s=2.0),
)}
CONTROL = Broken("reference", "the reference broker, unchanged", (), ())


def main(argv: list[str]) -> int:
    name, *serve = argv
    broken = CONTROL if name == CONTROL.name else CATALOGUE[name]
    if broken.advertise is not None:  # written next to the store (its state directory), else to a temporary file
        store = serve[serve.index("--store") + 1] if "--store" in serve else ""
        folder = Path(store.removeprefix("sqlite:///")).parent if store.startswith("sqlite:///") else None
        path = (folder or Path(tempfile.mkdtemp(prefix="broken-broker-"))) / "advertise.json"
        path.write_text(json.dumps(broken.advertise), encoding="utf-8")
        serve += ["--advertise", str(path)]
    parser = argparse.ArgumentParser(prog=f"broken_brokers.py {name}")
    add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["broker", "serve", *serve, *broken.serve_args])
    return cmd_serve(args, open_store=broken.open_store, make_server=broken.make_server)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
