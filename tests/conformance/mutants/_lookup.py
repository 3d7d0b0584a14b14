"""Mutants of POST /v1/send: the §4.5.1 lookup (outbox_store, committer), phase A and the fingerprint (parse_send).

An ``outbox_store`` mutant subclasses ``OutboxStore`` and changes what ``accept_batch`` decides or writes; a
``parse_send`` mutant wraps the core's ``parse_send`` (it may return a ``SendRequest`` subclass whose fingerprint
differs); a ``committer`` mutant subclasses ``GroupCommitter``.
"""

from __future__ import annotations

import hashlib
import re
import threading
import uuid
from dataclasses import fields, replace
from typing import Any

from . import mutant


def _decided(change):
    """An OutboxStore whose every accept decision passes through ``change(store, item, decision)``."""
    from reference.daemon.store import OutboxStore

    class Store(OutboxStore):
        def accept_batch(self, items):
            items = list(items)
            return [(change(self, item, decision), transition)
                    for item, (decision, transition) in zip(items, super().accept_batch(items), strict=True)]

    return Store


# --- the lookup table (§4.5.1) -----------------------------------------------------------------------------------


@mutant("fingerprint-mismatch-202",
        "a different request under a pending or inflight id is answered 202 duplicate instead of 409",
        kills=("IPC-CONFLICT-NO-MUTATION",), select=("ipc.lookup.row",), seam="outbox_store", est_s=25)
def _fingerprint_mismatch_202():
    from reference.core import decide_send
    from reference.core.outbox import replace as replace_row

    def change(store, item, decision):
        if decision.is_conflict and decision.row_state in ("pending", "inflight"):
            row = store.get_by_client_message_id(item.client_message_id)
            # decided as if the stored row had this request's fingerprint
            return decide_send(replace_row(row, request_fingerprint=decision.request_fingerprint),
                               decision.request_fingerprint, item.client_message_id)
        return decision

    return _decided(change)


@mutant("insert-or-ignore",
        "no lookup: every send is answered 202 new (duplicate false) and stored with INSERT OR IGNORE",
        kills=("IPC-PENDING-MATCH", "IPC-DONE-MATCH", "IPC-CONFLICT-NO-MUTATION", "IPC-SERIALIZED"),
        select=("ipc.lookup.row", "ipc.concurrent.same_key"), seam="outbox_store", est_s=25)
def _insert_or_ignore():
    from reference.core import accepted, decide_send, new_row
    from reference.daemon.store import outbox as store

    class Store(store.OutboxStore):
        def accept_batch(self, items):
            results = []
            with self._transaction() as conn:
                for item in items:
                    row = new_row(item.outbox_id, item.client_message_id, item.request_fingerprint, item.payload,
                                  item.enqueued_at, self.policy)
                    conn.execute(store._OUTBOX_INSERT.replace("INSERT INTO", "INSERT OR IGNORE INTO", 1),
                                 store._outbox_params(row))
                    results.append((decide_send(None, item.request_fingerprint, item.client_message_id),
                                    accepted(row)))
            return results

    return Store


@mutant("conflict-mutates-row",
        "a 409 is answered correctly but overwrites the stored row's request_fingerprint with the new request's",
        kills=("IPC-CONFLICT-NO-MUTATION", "FP-FROZEN"), select=("ipc.lookup.row",), seam="outbox_store", est_s=25)
def _conflict_mutates_row():
    from reference.daemon.store import OutboxStore

    class Store(OutboxStore):
        def accept_batch(self, items):
            results = super().accept_batch(items)
            with self._transaction() as conn:
                for decision, _ in results:
                    if decision.is_conflict and decision.row_state != "none":
                        conn.execute("UPDATE outbox SET request_fingerprint = ? WHERE client_message_id = ?",
                                     (decision.request_fingerprint, decision.body["client_message_id"]))
            return results

    return Store


@mutant("done-match-202", "a retry of a delivered send is answered 202 queued instead of 200 done with its ids",
        kills=("IPC-DONE-MATCH", "IPC-DONE-MATCH-BODY"), select=("ipc.lookup.row",), seam="outbox_store", est_s=25)
def _done_match_202():
    def change(store, item, decision):
        if decision.table_row == "IPC-DONE-MATCH":
            body = {k: v for k, v in decision.body.items() if k not in ("broker_message_id", "history_id")}
            return replace(decision, http_status=202, body={**body, "status": "queued"})
        return decision

    return _decided(change)


@mutant("dead-match-no-reason", "the 409 for a retry of a dead send omits `reason` (the row's last_error)",
        kills=("IPC-DEAD-MATCH",), select=("ipc.lookup.row",), seam="outbox_store", est_s=25)
def _dead_match_no_reason():
    def change(store, item, decision):
        if decision.table_row == "IPC-DEAD-MATCH":
            return replace(decision, body={k: v for k, v in decision.body.items() if k != "reason"})
        return decision

    return _decided(change)


@mutant("conflict-prefix-of-stored-row",
        "a 409's daemon_fingerprint_prefix is the stored row's fingerprint, not the one computed for this request "
        "(E-26)", kills=("FP-PREFIX-409-WHICH",), select=("ipc.lookup.row",), seam="outbox_store", est_s=25)
def _conflict_prefix_of_stored_row():
    def change(store, item, decision):
        if decision.is_conflict and decision.row_state != "none":
            row = store.get_by_client_message_id(item.client_message_id)
            return replace(decision, body={**decision.body,
                                           "daemon_fingerprint_prefix": row.request_fingerprint[:8].hex()})
        return decision

    return _decided(change)


@mutant("done-duplicate-history-id-wrong",
        "a done duplicate's 200 carries the outbox row's own id as history_id, not the broker's history_id",
        kills=("IPC-DONE-MATCH",), select=("ipc.lookup.row",), seam="outbox_store", est_s=25)
def _done_duplicate_history_id_wrong():
    def change(store, item, decision):
        if decision.table_row == "IPC-DONE-MATCH":
            return replace(decision, body={**decision.body, "history_id": decision.outbox_id})
        return decision

    return _decided(change)


@mutant("done-duplicate-broker-message-id-wrong",
        "a done duplicate's 200 carries the history_id as broker_message_id, not the row's broker_message_id",
        kills=("IPC-DONE-MATCH",), select=("ipc.lookup.row",), seam="outbox_store", est_s=25)
def _done_duplicate_broker_message_id_wrong():
    def change(store, item, decision):
        if decision.table_row == "IPC-DONE-MATCH":
            return replace(decision, body={**decision.body, "broker_message_id": decision.body.get("history_id")})
        return decision

    return _decided(change)


# --- the group commit (one transaction around lookup and insert) -------------------------------------------------


@mutant("check-then-insert-race",
        "the lookup and the insert run in separate transactions (no BEGIN IMMEDIATE around both): concurrent "
        "sends of one id race", kills=("IPC-SERIALIZED",), select=("ipc.concurrent.same_key",), seam="committer")
def _check_then_insert_race():
    from reference.core import decide_send, new_row
    from reference.daemon.committer import GroupCommitter
    from reference.daemon.store import outbox as store

    class Committer(GroupCommitter):
        def submit(self, item, timeout=30.0):
            cmid = item.client_message_id
            outbox = self._accept_batch.__self__
            snapshot = outbox.get_by_client_message_id(cmid)  # outside the writer's transaction
            decision = decide_send(snapshot, item.request_fingerprint, cmid)
            if decision.insert:
                row = new_row(item.outbox_id, cmid, item.request_fingerprint, item.payload, item.enqueued_at,
                              outbox.policy)
                with outbox._transaction() as conn:
                    conn.execute(store._OUTBOX_INSERT.replace("INSERT INTO", "INSERT OR IGNORE INTO", 1),
                                 store._outbox_params(row))
            return decision, None

    return Committer


@mutant("respond-before-commit",
        "POST /v1/send answers from a read snapshot and commits the row 0.5 s later (write-behind)",
        kills=("REC-NO-LOSS", "IPC-SERIALIZED"), select=("recovery.kill9_before_dispatch", "ipc.concurrent.same_key"),
        seam="committer", est_s=35)
def _respond_before_commit():
    from reference.core import decide_send
    from reference.daemon.committer import GroupCommitter

    class Committer(GroupCommitter):
        def submit(self, item, timeout=30.0):
            cmid = item.client_message_id
            outbox = self._accept_batch.__self__
            decision = decide_send(outbox.get_by_client_message_id(cmid), item.request_fingerprint, cmid)
            if decision.insert:
                threading.Timer(0.5, super().submit, (item,)).start()
            return decision, None

    return Committer


# --- phase A: parsing, ids and fingerprints ----------------------------------------------------------------------


def _document(raw: bytes) -> dict[str, Any]:
    from reference.core.request import parse_json_object

    return parse_json_object(raw)


@mutant("header-body-precedence-swapped", "the body's client_message_id wins over the Idempotency-Key header",
        kills=("IPC-ID-PRECEDENCE",), seam="parse_send")
def _header_body_precedence_swapped():
    from reference.core import parse_send

    def parse(raw, idempotency_key=None):
        request = parse_send(raw, idempotency_key)
        body_id = _document(raw).get("client_message_id")
        return request if body_id is None else replace(request, client_message_id=body_id)

    return parse


@mutant("500-on-malformed-json",
        "a body that is not (I-)JSON escapes validation as an unexpected exception: 500 internal_error",
        kills=("ERR-NO-5XX-ON-BAD-INPUT", "IPC-VALIDATION-CONSUMES-NOTHING"),
        select=("transport.malformed_json", "ipc.validation.consumes_nothing"), seam="parse_send", est_s=15)
def _500_on_malformed_json():
    from reference.core import RequestError, parse_send

    def parse(raw, idempotency_key=None):
        try:
            return parse_send(raw, idempotency_key)
        except RequestError as exc:
            if exc.code == "invalid_json":
                raise RuntimeError(exc.detail) from None
            raise

    return parse


def _ids_also_accepted(accepts) -> Any:
    """A parse_send that also accepts the ids (header or body) the grammar refuses but ``accepts`` allows: it
    validates the rest of the request as the reference does and keeps the id exactly as sent."""
    from reference.core.request import is_client_message_id, validate_send

    stand_in = "mutant-stand-in-id"

    def parse(raw, idempotency_key=None):
        document = _document(raw)
        body_id = document.get("client_message_id")
        lax_body = isinstance(body_id, str) and not is_client_message_id(body_id) and accepts(body_id)
        lax_header = (idempotency_key is not None and not is_client_message_id(idempotency_key)
                      and accepts(idempotency_key))
        if lax_body:
            document = {**document, "client_message_id": stand_in}
        request = validate_send(document, stand_in if lax_header else idempotency_key)
        if lax_header:
            return replace(request, client_message_id=idempotency_key)
        if lax_body and idempotency_key is None:
            return replace(request, client_message_id=body_id)
        return request

    return parse


@mutant("id-grammar-lax", "any 1-200 printable characters are accepted as a client_message_id",
        kills=("IPC-ID-GRAMMAR",), select=("ipc.id.grammar",), seam="parse_send")
def _id_grammar_lax():
    lax = re.compile(r"[^\x00-\x1f\x7f]{1,200}")
    return _ids_also_accepted(lambda value: lax.fullmatch(value) is not None)


@mutant("id-grammar-trailing-newline",
        "the id grammar is checked with re.match(r'^…$'), so an otherwise valid id with one trailing newline passes",
        kills=("IPC-ID-GRAMMAR",), select=("ipc.id.grammar",), seam="parse_send")
def _id_grammar_trailing_newline():
    dollar = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:~-]{0,127}$")  # $ also matches before a final "\n"
    return _ids_also_accepted(lambda value: dollar.match(value) is not None)


def _request_class(fingerprint):
    """A SendRequest subclass whose fingerprint is ``fingerprint(request)``."""
    from dataclasses import dataclass

    from reference.core import SendRequest

    @dataclass(frozen=True)
    class Request(SendRequest):
        def fingerprint(self) -> bytes:
            return fingerprint(self)

    return Request


def _as(cls, request):
    return cls(**{f.name: getattr(request, f.name) for f in fields(request)})


def _preimage(request, meta: bytes | None = None, body_digest: bytes | None = None) -> bytes:
    """The reference's canonical preimage, with the meta part or the body digest part replaced."""
    from reference.core.fingerprint import SEPARATOR, canonical_preimage

    parts = canonical_preimage(request.fingerprint_input()).split(SEPARATOR)
    if meta is not None:
        parts[5] = meta
    if body_digest is not None:
        parts[6:] = [body_digest]
    return SEPARATOR.join(parts)


@mutant("fingerprint-raw-digest",
        "the preimage ends with the body's raw 32-byte sha256 digest instead of its lowercase hex",
        kills=("FP-CANONICAL-FORM", "FP-BODY-HASH-HEX"), select=("ipc.fingerprint.vectors",), seam="parse_send",
        est_s=15)
def _fingerprint_raw_digest():
    from reference.core import parse_send

    raw_digest = _request_class(lambda r: hashlib.sha256(
        _preimage(r, body_digest=hashlib.sha256(r.message.encode("utf-8")).digest())).digest())

    def parse(raw, idempotency_key=None):
        return _as(raw_digest, parse_send(raw, idempotency_key))

    return parse


@mutant("empty-meta-as-braces", "meta {} is canonicalised as the text {} instead of the empty string",
        kills=("FP-EMPTY-META",), select=("ipc.fingerprint.vectors",), seam="parse_send", est_s=15)
def _empty_meta_as_braces():
    from reference.core import parse_send

    braces = _request_class(lambda r: hashlib.sha256(_preimage(r, meta=b"{}")).digest())

    def parse(raw, idempotency_key=None):
        request = parse_send(raw, idempotency_key)
        return _as(braces, request) if _document(raw).get("meta") == {} else request

    return parse


@mutant("priority-default-now", "an absent priority defaults to `now` instead of `next` (before hashing)",
        kills=("FP-DEFAULTS",), select=("ipc.fingerprint.vectors",), seam="parse_send", est_s=15)
def _priority_default_now():
    from reference.core import parse_send

    def parse(raw, idempotency_key=None):
        request = parse_send(raw, idempotency_key)
        return replace(request, priority="now") if "priority" not in _document(raw) else request

    return parse


@mutant("minted-uuid", "a send without an id gets a UUIDv4 instead of a ULID (as do its outbox row ids)",
        kills=("IPC-ID-MINTED-ULID", "IPC-ID-MINTED-FORM"), select=("ipc.id.minted",), seam="create_app")
def _minted_uuid():
    from reference.daemon.app import create_app

    def build(ctx, requeue):
        return create_app(replace(ctx, mint_id=lambda: str(uuid.uuid4())), requeue)

    return build
