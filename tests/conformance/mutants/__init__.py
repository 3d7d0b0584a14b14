"""Deliberately broken daemons: testing the tester (STYLE.md point 8, after bowtie's miniatures).

Theory of operation. A mutant is the reference daemon with ONE small, named deviation from the spec. ``apply``
monkeypatches the reference in-process (one function, method or constant replaced by a broken variant); the launch
template ``python -m tests.conformance.mutants NAME up ...`` applies it and then runs ``meshd up`` in the same process. The
gunicorn master forks its worker from that process, so the patch is in the worker too, and a restart (the recovery
cases) re-applies it. ``kills`` names the requirement ids the suite must fail the mutant for; ``select`` narrows the run
to the cases that can see the deviation (default: every case checking one of ``kills``). ``killmatrix.py`` runs the
suite against each mutant and each miniature (miniatures.py: standalone toy daemons) and records which requirements
failed; tests/conformance/test_mutants.py asserts every one is killed by an expected requirement.

Rules of this file: a patch replaces the attribute where the caller looks it up at call time (``store.decide_send``,
not ``core.ipc.decide_send``, because store.py imported the name); every replacement wraps or re-states the original
with the deviation and nothing else. A deviation that no black-box test can observe (``undetectable``) is listed with
the reason and never run: the matrix must not claim a kill it cannot make.
"""

from __future__ import annotations

import contextlib
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

HARNESS_ERROR = "harness_error"


class Patcher:
    """Records every attribute it replaces, so ``revert`` can restore them (``patched`` uses it in-process)."""

    def __init__(self) -> None:
        self.replaced: list[tuple[Any, str, Any]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        """Replace ``owner.name`` (a module or class attribute that must exist) with ``value``."""
        original = vars(owner)[name] if isinstance(owner, type) else getattr(owner, name)  # fails on a typo
        self.replaced.append((owner, name, original))
        setattr(owner, name, value)

    def revert(self) -> None:
        for owner, name, original in reversed(self.replaced):
            setattr(owner, name, original)
        self.replaced.clear()


@dataclass(frozen=True)
class Mutant:
    """One broken implementation: how it deviates, and the requirements that must catch it."""

    name: str
    description: str
    kills: tuple[str, ...]
    apply: Callable[[Patcher], None] | None = None
    select: tuple[str, ...] = ()
    kind: str = "mutant"  # mutant | miniature | control
    undetectable: str | None = None  # why no black-box case can kill it (never run)
    known_gap: str | None = None  # why the suite cannot kill it yet, and the harness change that would kill it
    launch: str = field(default="", compare=False)
    est_s: float = 10.0  # a rough run time, to schedule the longest runs first

    @property
    def selection(self) -> tuple[str, ...]:
        """The case or requirement ids ``meshconform run --select`` gets for this subject."""
        return self.select or tuple(k for k in self.kills if k != HARNESS_ERROR)

    @property
    def template(self) -> str:
        return self.launch or template(self.name)


MUTANTS: dict[str, Mutant] = {}
UNDETECTABLE: dict[str, Mutant] = {}


def template(name: str) -> str:
    """The launch template that runs mutant ``name`` (see conformance/launch.py for the placeholders)."""
    return (f"{shlex.quote(sys.executable)} -m tests.conformance.mutants {name} up --state-dir {{state_dir}} "
            "--broker-url {broker_url} --port {port}")


def mutant(name: str, description: str, kills: tuple[str, ...], select: tuple[str, ...] = (), *,
           undetectable: str | None = None, known_gap: str | None = None, est_s: float = 10.0
           ) -> Callable[[Callable[[Patcher], None]], Callable[[Patcher], None]]:
    """Register the decorated ``apply(patcher)`` as mutant ``name``."""

    def register(apply: Callable[[Patcher], None]) -> Callable[[Patcher], None]:
        entry = Mutant(name, description, kills, apply, select, undetectable=undetectable, known_gap=known_gap,
                       est_s=est_s)
        registry = UNDETECTABLE if undetectable else MUTANTS
        if name in MUTANTS or name in UNDETECTABLE:
            raise ValueError(f"mutant {name!r} registered twice")
        registry[name] = entry
        return apply

    return register


@contextlib.contextmanager
def patched(name: str) -> Iterator[Patcher]:
    """Apply mutant ``name`` in this process for the duration of the block."""
    entry = MUTANTS.get(name) or UNDETECTABLE[name]
    patcher = Patcher()
    try:
        if entry.apply is not None:
            entry.apply(patcher)
        yield patcher
    finally:
        patcher.revert()


# --- the §4.5.1 lookup ------------------------------------------------------------------------------------------------


def _wrap_decide_send(p: Patcher, change: Callable[..., Any]) -> None:
    from reference.daemon import store

    original = store.decide_send

    def decide_send(existing, fingerprint, client_message_id, decisions=None):
        return change(original, existing, fingerprint, client_message_id, decisions)

    p.set(store, "decide_send", decide_send)


@mutant("fingerprint-mismatch-202",
        "a different request under a pending or inflight id is answered 202 duplicate instead of 409",
        kills=("IPC-CONFLICT-NO-MUTATION",), select=("ipc.lookup.row",), est_s=20)
def _fingerprint_mismatch_202(p: Patcher) -> None:
    from dataclasses import replace

    def change(original, existing, fingerprint, cmid, decisions):
        if existing is not None and existing.status in ("pending", "inflight"):
            existing = replace(existing, request_fingerprint=fingerprint)  # decided as if it matched
        return original(existing, fingerprint, cmid, decisions)

    _wrap_decide_send(p, change)


@mutant("insert-or-ignore",
        "no lookup: every send is answered 202 new (duplicate false) and stored with INSERT OR IGNORE",
        kills=("IPC-PENDING-MATCH", "IPC-DONE-MATCH", "IPC-CONFLICT-NO-MUTATION", "IPC-SERIALIZED"),
        select=("ipc.lookup.row", "ipc.concurrent.same_key"), est_s=20)
def _insert_or_ignore(p: Patcher) -> None:
    from reference.daemon import store

    def accept_batch(self, items):
        prepared = [self._prepare(store.AcceptItem(*item)) for item in items]
        results = []
        with self._transaction() as conn:
            for item in prepared:
                decision = store.decide_send(None, item.fingerprint, item.client_message_id)
                row = store.new_row(item.outbox_id, item.client_message_id, item.fingerprint, item.payload,
                                    item.now_ms, self.policy)
                conn.execute(store._OUTBOX_INSERT.replace("INSERT INTO", "INSERT OR IGNORE INTO", 1),
                             store._outbox_params(row))
                results.append((decision, store.accepted(row)))
        return results

    p.set(store.OutboxStore, "accept_batch", accept_batch)


@mutant("conflict-mutates-row",
        "a 409 is answered correctly but overwrites the stored row's request_fingerprint with the new request's",
        kills=("IPC-CONFLICT-NO-MUTATION",), select=("ipc.lookup.row",), est_s=20)
def _conflict_mutates_row(p: Patcher) -> None:
    from reference.daemon import store

    original = store.OutboxStore.accept_batch

    def accept_batch(self, items):
        results = original(self, items)
        with self._transaction() as conn:
            for decision, _ in results:
                if decision.is_conflict and decision.row_state != "none":
                    conn.execute("UPDATE outbox SET request_fingerprint = ? WHERE client_message_id = ?",
                                 (decision.request_fingerprint, decision.body["client_message_id"]))
        return results

    p.set(store.OutboxStore, "accept_batch", accept_batch)


@mutant("done-match-202", "a retry of a delivered send is answered 202 queued instead of 200 done with its ids",
        kills=("IPC-DONE-MATCH",), select=("ipc.lookup.row",), est_s=20)
def _done_match_202(p: Patcher) -> None:
    from dataclasses import replace

    def change(original, existing, fingerprint, cmid, decisions):
        decision = original(existing, fingerprint, cmid, decisions)
        if decision.table_row == "IPC-DONE-MATCH":
            body = {k: v for k, v in decision.body.items() if k not in ("broker_message_id", "history_id")}
            return replace(decision, http_status=202, body={**body, "status": "queued"})
        return decision

    _wrap_decide_send(p, change)


@mutant("dead-match-no-reason", "the 409 for a retry of a dead send omits `reason` (the row's last_error)",
        kills=("IPC-DEAD-MATCH",), select=("ipc.lookup.row",), est_s=20)
def _dead_match_no_reason(p: Patcher) -> None:
    from dataclasses import replace

    def change(original, existing, fingerprint, cmid, decisions):
        decision = original(existing, fingerprint, cmid, decisions)
        if decision.table_row == "IPC-DEAD-MATCH":
            return replace(decision, body={k: v for k, v in decision.body.items() if k != "reason"})
        return decision

    _wrap_decide_send(p, change)


@mutant("check-then-insert-race",
        "the lookup and the insert run in separate transactions (no BEGIN IMMEDIATE around both): concurrent "
        "sends of one id race",
        kills=("IPC-SERIALIZED",), select=("ipc.concurrent.same_key",))
def _check_then_insert_race(p: Patcher) -> None:
    from reference.daemon import committer, store

    def submit(self, item, timeout=30.0):
        request, cmid, outbox_id, now_ms = item
        outbox = self._accept_batch.__self__
        fingerprint = request.fingerprint()
        decision = store.decide_send(outbox.get_by_client_message_id(cmid), fingerprint, cmid)  # a reader snapshot
        if decision.insert:
            row = store.new_row(outbox_id, cmid, fingerprint, request.payload(), now_ms, outbox.policy)
            with outbox._transaction() as conn:
                conn.execute(store._OUTBOX_INSERT.replace("INSERT INTO", "INSERT OR IGNORE INTO", 1),
                             store._outbox_params(row))
        return decision, None

    p.set(committer.GroupCommitter, "submit", submit)


@mutant("respond-before-commit",
        "POST /v1/send answers from a read snapshot and commits the row 0.5 s later (write-behind)",
        kills=("REC-NO-LOSS", "IPC-SERIALIZED"), select=("recovery.kill9_before_dispatch", "ipc.concurrent.same_key"),
        est_s=30)
def _respond_before_commit(p: Patcher) -> None:
    import threading
    from concurrent.futures import Future

    from reference.daemon import committer, store

    def submit(self, item, timeout=30.0):
        request, cmid, _, _ = item
        outbox = self._accept_batch.__self__
        decision = store.decide_send(outbox.get_by_client_message_id(cmid), request.fingerprint(), cmid)
        if decision.insert:
            threading.Timer(0.5, self._queue.put, ((item, Future()),)).start()
        return decision, None

    p.set(committer.GroupCommitter, "submit", submit)


# --- request parsing, ids and fingerprints --------------------------------------------------------------------------


@mutant("header-body-precedence-swapped",
        "the body's client_message_id wins over the Idempotency-Key header",
        kills=("IPC-ID-PRECEDENCE",))
def _header_body_precedence_swapped(p: Patcher) -> None:
    from dataclasses import replace

    from reference.core import request

    original = request.validate_send

    def validate_send(document, idempotency_key=None):
        result = original(document, idempotency_key)
        if document.get("client_message_id") is not None:
            result = replace(result, client_message_id=document["client_message_id"])
        return result

    p.set(request, "validate_send", validate_send)


@mutant("500-on-malformed-json",
        "a body that is not (I-)JSON escapes validation as an unexpected exception: 500 internal_error",
        kills=("ERR-NO-5XX-ON-BAD-INPUT", "ERR-PROBLEM-JSON", "IPC-VALIDATION-CONSUMES-NOTHING"),
        select=("ipc.validation.consumes_nothing", "fuzz.openapi"), est_s=15)
def _500_on_malformed_json(p: Patcher) -> None:
    from reference.core import request

    original = request.parse_json_object

    def parse_json_object(raw):
        try:
            return original(raw)
        except request.RequestError as exc:
            if exc.code == "invalid_json":
                raise RuntimeError(exc.detail) from None
            raise

    p.set(request, "parse_json_object", parse_json_object)


@mutant("id-grammar-lax", "any 1-200 printable characters are accepted as a client_message_id",
        kills=("IPC-ID-GRAMMAR",))
def _id_grammar_lax(p: Patcher) -> None:
    import re

    from reference.core import request

    p.set(request, "CLIENT_MESSAGE_ID", re.compile(r"[^\x00-\x1f]{1,200}"))


@mutant("minted-uuid", "a send without an id gets a UUIDv4 instead of a ULID", kills=("IPC-ID-MINTED-ULID",))
def _minted_uuid(p: Patcher) -> None:
    import uuid
    from dataclasses import replace

    from reference.daemon import app

    original = app.parse_send

    def parse_send(raw, idempotency_key=None):
        result = original(raw, idempotency_key)
        return result if result.client_message_id else replace(result, client_message_id=str(uuid.uuid4()))

    p.set(app, "parse_send", parse_send)


@mutant("fingerprint-raw-digest",
        "the preimage ends with the body's raw 32-byte sha256 digest instead of its lowercase hex",
        kills=("FP-CANONICAL-FORM",), est_s=15)
def _fingerprint_raw_digest(p: Patcher) -> None:
    import hashlib

    from reference.core import fingerprint

    def canonical_preimage(item):
        parts = [item.envelope_version.encode(), item.destination_kind.encode(), item.destination_ref.encode(),
                 item.reply_to_id.encode(), item.priority.encode(), fingerprint.meta_canonical(item.meta),
                 hashlib.sha256(item.body.encode("utf-8")).digest()]
        return fingerprint.SEPARATOR.join(parts)

    p.set(fingerprint, "canonical_preimage", canonical_preimage)


@mutant("empty-meta-as-braces", "meta {} is canonicalised as the text {} instead of the empty string",
        kills=("FP-EMPTY-META",), est_s=15)
def _empty_meta_as_braces(p: Patcher) -> None:
    from dataclasses import replace

    import rfc8785

    from reference.core import fingerprint, request

    original_meta, original_validate = fingerprint.meta_canonical, request.validate_send

    def meta_canonical(meta):
        return rfc8785.dumps(dict(meta)) if meta == {} else original_meta(meta)

    def validate_send(document, idempotency_key=None):
        result = original_validate(document, idempotency_key)
        return replace(result, meta={}) if document.get("meta") == {} else result

    p.set(fingerprint, "meta_canonical", meta_canonical)
    p.set(request, "validate_send", validate_send)


@mutant("priority-default-now", "an absent priority defaults to `now` instead of `next` (before hashing)",
        kills=("FP-DEFAULTS",), est_s=15)
def _priority_default_now(p: Patcher) -> None:
    from reference.core import request

    p.set(request, "DEFAULT_PRIORITY", "now")


# --- the outbox and the broker link ---------------------------------------------------------------------------------


def _wrap_ack_event(p: Patcher, change: Callable[[str, str | None, dict], tuple[str, str | None]]) -> None:
    from reference.daemon import link

    original = link.ack_event

    def ack_event(frame):
        return change(*original(frame), frame)

    p.set(link, "ack_event", ack_event)


@mutant("ignores-409-from-broker", "a 409 ack is treated like a 5xx: the row is retried instead of going dead",
        kills=("OBX-BROKER-OUTCOMES",), select=("outbox.broker_outcome",), est_s=45)
def _ignores_409(p: Patcher) -> None:
    _wrap_ack_event(p, lambda event, error, frame: ("ack_failed", error) if event == "ack_conflict" else (event, error))


@mutant("permanent-4xx-retried", "a 4xx ack other than 409 (404, 413) is retried instead of going dead",
        kills=("OBX-BROKER-OUTCOMES",), select=("outbox.broker_outcome",), est_s=45)
def _permanent_4xx_retried(p: Patcher) -> None:
    _wrap_ack_event(p, lambda event, error, frame: ("ack_failed", error) if event == "ack_rejected" else (event, error))


@mutant("status-less-ack-is-success", "an ack without a status (schema-invalid) is taken as 201 created",
        kills=("OBX-BROKER-OUTCOMES",), select=("outbox.transient_failures",))
def _status_less_ack_is_success(p: Patcher) -> None:
    from reference.daemon import link

    original = link.BrokerLink._on_acks

    def _on_acks(self, frames):
        return original(self, [frame if "status" in frame else
                               {**{k: v for k, v in frame.items() if k != "_invalid"}, "status": 201}
                               for frame in frames])

    p.set(link.BrokerLink, "_on_acks", _on_acks)


@mutant("late-ack-ignored", "an ack for a row no longer awaiting one (it timed out back to pending) is dropped",
        kills=("OBX-LATE-ACK",), est_s=25)
def _late_ack_ignored(p: Patcher) -> None:
    from reference.daemon import link

    original = link.BrokerLink._on_acks

    def _on_acks(self, frames):
        return original(self, [frame for frame in frames
                               if (frame.get("client_message_id") or frame.get("id")) in self._deadlines])

    p.set(link.BrokerLink, "_on_acks", _on_acks)


@mutant("retry-rederives-request",
        "a retry re-derives the send frame with priority escalated to `now` (and a fingerprint to match) instead of "
        "re-sending the stored bytes", kills=("WS-SEND-SAME-BYTES",), select=("outbox.transient_failures",))
def _retry_rederives_request(p: Patcher) -> None:
    from reference.core.fingerprint import FingerprintInput, request_fingerprint
    from reference.daemon import link

    original = link.send_frame

    def send_frame(row):
        frame = original(row)
        if row.attempts < 2:
            return frame
        item = FingerprintInput(frame["destination_kind"], frame["destination_ref"], frame["reply_to_id"] or "",
                                "now", frame["meta"], frame["body"])
        return {**frame, "priority": "now", "request_fingerprint": request_fingerprint(item).hex()}

    p.set(link, "send_frame", send_frame)


@mutant("no-dead-event", "a row going dead is not announced with an outbox_dead SSE event",
        kills=("OBX-DEAD-EVENT",))
def _no_dead_event(p: Patcher) -> None:
    from reference.core import outbox

    p.set(outbox, "IO_EFFECTS", outbox.IO_EFFECTS - {"emit_outbox_dead"})


@mutant("inflight-never-recovered", "crash recovery leaves inflight rows inflight (recover() does nothing)",
        kills=("REC-INFLIGHT-TO-PENDING",), select=("recovery.kill9_inflight",), est_s=45)
def _inflight_never_recovered(p: Patcher) -> None:
    from reference.daemon import store

    p.set(store.OutboxStore, "recover", lambda self, now_ms: [])


@mutant("requeue-frees-id", "requeue deletes the old row instead of marking it aborted: its id is free again",
        kills=("REQUEUE-NEVER-FREES", "ID-CONSUMED-NEVER-FREED"), select=("outbox.requeue",))
def _requeue_frees_id(p: Patcher) -> None:
    from reference.daemon import store

    original = store.OutboxStore.requeue

    def requeue(self, outbox_id, *args, **kwargs):
        result = original(self, outbox_id, *args, **kwargs)
        if result.outcome == "transition":
            with self._transaction() as conn:
                conn.execute("DELETE FROM outbox WHERE id = ?", (outbox_id,))
        return result

    p.set(store.OutboxStore, "requeue", requeue)


@mutant("requeue-done-allowed", "a done row can be requeued (it is aborted and sent again under a new id)",
        kills=("REQUEUE-STATES",), select=("outbox.requeue",))
def _requeue_done_allowed(p: Patcher) -> None:
    from dataclasses import replace

    from reference.daemon import store

    original = store.apply

    def apply(row, event, policy, decisions=None):
        if event.name == "requeue" and row is not None and row.status == "done":
            row = replace(row, status="dead")
        return original(row, event, policy, decisions)

    p.set(store, "apply", apply)


# --- negotiation ----------------------------------------------------------------------------------------------------


@mutant("retention-floor-ignored", "a dedupe_retention_days below the daemon's floor (7) is accepted",
        kills=("NEG-PARAM-VALIDATION", "NEG-CLOSE-4010"), select=("negotiation.refused",), est_s=15)
def _retention_floor_ignored(p: Patcher) -> None:
    from reference.core import features

    original = features._check_param

    def _check_param(name, rule, value):
        return original(name, {k: v for k, v in rule.items() if k != "floor"}, value)

    p.set(features, "_check_param", _check_param)


@mutant("negotiation-close-1000", "a failed negotiation closes the socket with 1000 instead of 4010",
        kills=("NEG-CLOSE-4010",), select=("negotiation.refused",), est_s=15)
def _negotiation_close_1000(p: Patcher) -> None:
    from reference.daemon import link

    p.set(link, "CLOSE_FEATURE_UNAVAILABLE", 1000)


# --- inbound --------------------------------------------------------------------------------------------------------


@mutant("inbox-upsert", "a redelivered message overwrites the stored one (ON CONFLICT DO UPDATE) instead of deduping",
        kills=("INB-DEDUPE",))
def _inbox_upsert(p: Patcher) -> None:
    from reference.daemon import store

    upsert = store._INBOX_INSERT.replace(
        "DO NOTHING", "DO UPDATE SET body = excluded.body, broker_message_id = excluded.broker_message_id, "
        "delivery_id = excluded.delivery_id")
    p.set(store, "_INBOX_INSERT", upsert)


@mutant("ack-before-insert", "client_ack is sent first and the inbox row is written 0.3 s later (write-behind)",
        kills=("INB-DURABLE-BEFORE-ACK",))
def _ack_before_insert(p: Patcher) -> None:
    import threading

    from reference.daemon import link

    original = link.BrokerLink._on_push

    def _on_push(self, ws, frame):
        if frame.get("subtype") == "system":
            return original(self, ws, frame)
        self._send(ws, {"type": "client_ack", "clientMessageId": frame["client_message_id"],
                        "brokerMessageId": frame["messageId"], "delivery_id": frame.get("delivery_id", "")})
        threading.Timer(0.3, self.inbox.receive, (frame, self.mesh, self._now_ms())).start()
        return None

    p.set(link.BrokerLink, "_on_push", _on_push)


@mutant("no-frame-validation", "inbound broker frames are not validated against the wire schema",
        kills=("INB-SCHEMA",))
def _no_frame_validation(p: Patcher) -> None:
    from reference.daemon import link

    class AcceptsAnything:
        def iter_errors(self, instance):
            return iter(())

    p.set(link, "fast_validator", lambda name: AcceptsAnything())


@mutant("inbox-topic-filter-ignored", "GET /v1/inbox?topic= returns every topic", kills=("INBOX-FILTERS",))
def _inbox_topic_filter_ignored(p: Patcher) -> None:
    from reference.daemon import store

    original = store.InboxStore.page

    def page(self, cursor=None, since_ms=None, topic=None, sender=None, limit=100):
        return original(self, cursor, since_ms, None, sender, limit)

    p.set(store.InboxStore, "page", page)


@mutant("no-last-event-id-replay", "GET /v1/events ignores Last-Event-ID and streams only new events",
        kills=("SSE-REPLAY",), est_s=20)
def _no_last_event_id_replay(p: Patcher) -> None:
    from reference.daemon import events

    original = events.EventBus.open_stream
    p.set(events.EventBus, "open_stream", lambda self, last_event_id: original(self, None))


# --- transport and errors -------------------------------------------------------------------------------------------


@mutant("no-host-check", "any Host header is accepted over TCP (DNS rebinding)", kills=("AUTH-HOST",))
def _no_host_check(p: Patcher) -> None:
    from reference.daemon import guard

    p.set(guard, "host_is_loopback", lambda host: True)


@mutant("origin-allowed", "requests carrying a browser Origin header are served", kills=("AUTH-ORIGIN",))
def _origin_allowed(p: Patcher) -> None:
    from reference.daemon import guard

    original = guard.Guard.process_request

    def process_request(self, req, resp):
        req.env.pop("HTTP_ORIGIN", None)
        return original(self, req, resp)

    p.set(guard.Guard, "process_request", process_request)


@mutant("query-token-accepted", "a token in the query string is not refused", kills=("AUTH-TOKEN-QUERY",))
def _query_token_accepted(p: Patcher) -> None:
    from reference.daemon import guard

    p.set(guard, "QUERY_TOKEN_NAMES", frozenset())


@mutant("token-prefix-accepted", "a bearer token that is a non-empty prefix of local_token is accepted",
        kills=("AUTH-BEARER",))
def _token_prefix_accepted(p: Patcher) -> None:
    import types

    from reference.daemon import guard

    p.set(guard, "hmac", types.SimpleNamespace(compare_digest=lambda presented, token: token.startswith(presented)))


@mutant("token-compared-with-eq", "the bearer token is compared with == instead of hmac.compare_digest",
        kills=("AUTH-CONSTANT-TIME",),
        undetectable="answers are identical; the timing difference of one bytes comparison is nanoseconds, far below "
        "the jitter of a loopback HTTP round trip, so no bounded black-box run can tell (tests/daemon checks it "
        "white-box)")
def _token_compared_with_eq(p: Patcher) -> None:
    import operator
    import types

    from reference.daemon import guard

    p.set(guard, "hmac", types.SimpleNamespace(compare_digest=operator.eq))


@mutant("no-fsync", "outbox.db runs with synchronous=OFF (no fsync before the 202)", kills=("REC-NO-LOSS",),
        undetectable="SIGKILL never loses the OS page cache; only a power cut or kernel crash would show it")
def _no_fsync(p: Patcher) -> None:
    from reference.daemon import store

    original = store.OutboxStore.__init__

    def __init__(self, path, policy, synchronous="FULL", **kwargs):
        original(self, path, policy, "OFF", **kwargs)

    p.set(store.OutboxStore, "__init__", __init__)


@mutant("no-body-limit", "request bodies are read whole: no 413 above ipc.max_body_bytes", kills=("LIMIT-BODY",))
def _no_body_limit(p: Patcher) -> None:
    from reference.daemon import app

    p.set(app, "_read_body", lambda req, limit: req.bounded_stream.read())


@mutant("unread-body-left-on-the-socket", "a body the handler did not read is left unread when the answer goes out",
        kills=("IPC-HTTP-BODY",), select=("transport.early_answer",))
def _unread_body_left(p: Patcher) -> None:
    from reference.daemon import guard

    p.set(guard.BodyDrain, "process_response", lambda self, req, resp, resource, req_succeeded: None)


@mutant("chunked-body-read-as-empty", "a chunked request body is read as an empty body", kills=("IPC-HTTP-BODY",),
        select=("transport.chunked_body",))
def _chunked_body_empty(p: Patcher) -> None:
    from reference.daemon import app

    p.set(app, "body_stream", lambda req: req.bounded_stream)


@mutant("unix-socket-0644", "daemon.sock is left group/world readable (0644)", kills=("AUTH-UDS-MODE",))
def _unix_socket_0644(p: Patcher) -> None:
    import os

    from reference.daemon import server

    original = server.DaemonServer._when_ready

    def _when_ready(self, arbiter):
        original(self, arbiter)
        os.chmod(self.state_dir / "daemon.sock", 0o644)

    p.set(server.DaemonServer, "_when_ready", _when_ready)


@mutant("problem-as-plain-json", "error bodies are sent as application/json instead of application/problem+json",
        kills=("ERR-PROBLEM-JSON", "API-CONFORMS"), select=("ipc.validation.consumes_nothing", "transport.limits"))
def _problem_as_plain_json(p: Patcher) -> None:
    from reference.daemon import problems

    p.set(problems, "PROBLEM_JSON", "application/json")
