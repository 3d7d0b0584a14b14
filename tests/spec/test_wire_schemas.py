"""The wire contracts: broker WebSocket frames (spec/schemas/broker), trace events (spec/schemas/trace) and the
close-code table (spec/tables/close_codes.yaml).

Every schema is checked against the 2020-12 metaschema and for its `title`/`description`/`$id`; then hand-written
valid and invalid examples are validated through a registry holding every spec/schemas/**/*.json by `$id`, first
against the schema they were written for and then against the union schemas (broker/frame.json, trace/event.json),
which must accept each valid example through exactly one branch. The trace schemas that name table rows are checked
against the tables themselves, and one valid event is built per table row.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator, FormatChecker
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from websockets.frames import CloseCode

SPEC = Path(__file__).resolve().parents[2] / "spec"
SCHEMAS = SPEC / "schemas"
BASE = "https://meshspec.dev/schemas/"
BROKER_FILES = sorted((SCHEMAS / "broker").glob("*.json"))
TRACE_FILES = sorted((SCHEMAS / "trace").glob("*.json"))
MY_FILES = BROKER_FILES + TRACE_FILES
FRAME_NAMES = [p.stem for p in BROKER_FILES if p.stem != "frame"]
EVENT_KINDS = [p.stem for p in TRACE_FILES if p.stem != "event"]
ENVELOPE = ["v", "source", "node", "seq", "ts_ms", "kind"]


def _registry() -> Registry:
    resources = []
    for path in sorted(SCHEMAS.rglob("*.json")):
        document = json.loads(path.read_text(encoding="utf-8"))
        resources.append((document["$id"], Resource.from_contents(document, default_specification=DRAFT202012)))
    return Registry().with_resources(resources)


REGISTRY = _registry()


def validator(ref: str) -> Draft202012Validator:
    """A format-checking validator for `group/name` or a full URI (fragments allowed)."""
    uri = ref if ref.startswith("https://") else f"{BASE}{ref}.json"
    return Draft202012Validator({"$ref": uri}, registry=REGISTRY, format_checker=FormatChecker())


def table(name: str) -> dict[str, Any]:
    return yaml.safe_load((SPEC / "tables" / f"{name}.yaml").read_text(encoding="utf-8"))


def changed(base: dict[str, Any], **members: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    out.update(members)
    return out


def without(base: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in copy.deepcopy(base).items() if k not in keys}


# --- sample values ---------------------------------------------------------------------------------------------------
MESH = "6f1c2a5e-3b7d-4c1a-9e2f-0a1b2c3d4e5f"
PK = hashlib.sha256(b"member").hexdigest()
PK2 = hashlib.sha256(b"peer").hexdigest()
FP = hashlib.sha256(b"fingerprint").hexdigest()
SIG = hashlib.sha512(b"signature").hexdigest()
CMID = "01HQX3Z5V9K2M4N6P8R0S2T4V6"
OUTBOX_ID = "01HQX3Z5VB0000000000000001"
SUCCESSOR_ID = "01HQX3Z5VB0000000000000002"
BMID = "01HQX3Z5VC0000000000000003"
T0 = 1_767_225_600_000

# --- broker frames: (valid, invalid) per frame ------------------------------------------------------------------------
HELLO = {
    "type": "hello", "meshId": MESH, "memberId": "mem_7", "pubkey": PK, "sessionPubkey": PK2, "displayName": "laptop",
    "sessionId": "daemon-4242", "pid": 4242, "cwd": "/home/u/proj", "hostname": "laptop", "peerType": "ai",
    "channel": "claudemesh-daemon", "protocolVersion": "0.9.0", "timestamp": T0, "signature": SIG,
}
HELLO_MIN = without(HELLO, "sessionPubkey", "displayName", "sessionId", "pid", "cwd", "hostname", "peerType",
                    "channel", "protocolVersion")
HELLO_ACK = {"type": "hello_ack", "memberId": "mem_7", "meshId": MESH, "sessionId": "s-1", "brokerVersion": "0.9.0",
             "serverTime": T0 + 3}
FNREQ = {"type": "feature_negotiation_request", "require": ["client_message_id_dedupe", "max_payload"],
         "optional": ["concurrent_connection_policy", "key_epoch"]}
FNRESP = {
    "type": "feature_negotiation_response",
    "supported": {
        "client_message_id_dedupe": {"params": {"version": 1, "mode": "retention_scoped", "dedupe_retention_days": 365,
                                                "request_fingerprint": True}},
        "max_payload": {"params": {"version": 1, "inline_bytes": 65536, "blob_bytes": 524288000}},
        "some_future_bit": {"params": {"version": 3, "anything": [1, 2]}},
    },
    "missing_required": [],
}
SEND = {
    "type": "send", "id": CMID, "client_message_id": CMID, "request_fingerprint": FP, "envelope_version": "1",
    "destination_kind": "topic", "destination_ref": "deploys", "priority": "next", "reply_to_id": "", "meta": None,
    "body": "hello mesh",
}
ACK_201 = {"type": "ack", "status": 201, "id": CMID, "client_message_id": CMID, "messageId": BMID, "queued": True,
           "broker_message_id": BMID, "history_id": BMID, "duplicate": False}
ACK_200 = changed(ACK_201, status=200, duplicate=True, history_available=False,
                  first_seen_at="2026-01-01T00:00:00.123Z")
ACK_409 = {"type": "ack", "status": 409, "id": CMID, "client_message_id": CMID, "messageId": "", "queued": False,
           "error": "idempotency_key_reused", "conflict": "request_fingerprint_mismatch",
           "broker_fingerprint_prefix": FP[:16]}
ACK_4XX = {"type": "ack", "status": 404, "id": CMID, "client_message_id": CMID, "messageId": "", "queued": False,
           "error": "destination_not_found", "detail": "no topic deploys"}
ACK_5XX = changed(without(ACK_4XX, "detail"), status=503, error="commit_failed")
PUSH_MSG = {
    "type": "push", "messageId": BMID, "meshId": MESH, "senderPubkey": PK2, "senderName": "peer", "topic": "deploys",
    "replyToId": None, "priority": "now", "body": "hi", "meta": {"k": "v"}, "createdAt": "2026-01-01T00:00:00Z",
    "client_message_id": CMID, "request_fingerprint": FP, "delivery_id": "d-17", "attempt": 1,
}
PUSH_SYS = {"type": "push", "subtype": "system", "event": "peer_joined", "eventData": {"pubkey": PK2},
            "meshId": MESH, "createdAt": "2026-01-01T00:00:00+00:00"}
CLIENT_ACK = {"type": "client_ack", "clientMessageId": CMID, "brokerMessageId": BMID, "delivery_id": "d-17"}
PEERS_LIST = {"type": "peers_list", "requestId": "r1",
              "peers": [{"pubkey": PK2, "displayName": "peer", "status": "idle", "summary": "open peer members"}]}

FRAMES: dict[str, tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]] = {
    "hello": (
        [HELLO, HELLO_MIN],
        [("short_signature", changed(HELLO, signature=SIG[:64])),
         ("uppercase_pubkey", changed(HELLO, pubkey=PK.upper())),
         ("no_timestamp", without(HELLO, "timestamp")),
         ("timestamp_string", changed(HELLO, timestamp=str(T0))),
         ("unknown_member", changed(HELLO, capabilities=["x"])),
         ("bad_protocol_version", changed(HELLO, protocolVersion="v0.9"))],
    ),
    "hello_ack": (
        [HELLO_ACK, {"type": "hello_ack", "memberId": "m", "meshId": MESH}],
        [("no_member", without(HELLO_ACK, "memberId")),
         ("features_on_ack", changed(HELLO_ACK, features={})),
         ("server_time_negative", changed(HELLO_ACK, serverTime=-1))],
    ),
    "feature_negotiation_request": (
        [FNREQ, changed(FNREQ, require=[], optional=[]), changed(FNREQ, require=["a_bit_the_broker_lacks"])],
        [("no_optional", without(FNREQ, "optional")),
         ("duplicate_bits", changed(FNREQ, require=["max_payload", "max_payload"])),
         ("bits_not_strings", changed(FNREQ, require=[1]))],
    ),
    "feature_negotiation_response": (
        [FNRESP, changed(FNRESP, supported={}, missing_required=["client_message_id_dedupe"]),
         changed(FNRESP, supported={"client_message_id_dedupe": {"params": {"version": 2}}})],
        [("no_version", changed(FNRESP, supported={"max_payload": {"params": {"inline_bytes": 1024}}})),
         ("version_string", changed(FNRESP, supported={"max_payload": {"params": {"version": "1"}}})),
         ("no_params", changed(FNRESP, supported={"max_payload": {"version": 1}})),
         ("no_missing_required", without(FNRESP, "missing_required"))],
    ),
    "send": (
        [SEND,
         changed(SEND, destination_kind="dm", destination_ref=PK2, priority="now", reply_to_id=BMID,
                 meta={"trace": "x"}, targetSpec=PK2),
         changed(SEND, destination_kind="queue", destination_ref="jobs:build-1", priority="low")],
        [("no_fingerprint", without(SEND, "request_fingerprint")),
         ("envelope_version_int", changed(SEND, envelope_version=1)),
         ("bad_kind", changed(SEND, destination_kind="group")),
         ("dm_uppercase_ref", changed(SEND, destination_kind="dm", destination_ref=PK2.upper())),
         ("topic_ref_with_hash", changed(SEND, destination_ref="#deploys")),
         ("reply_to_null", changed(SEND, reply_to_id=None)),
         ("empty_body", changed(SEND, body="")),
         ("no_meta", without(SEND, "meta")),
         ("meta_list", changed(SEND, meta=[1])),
         ("bad_cmid", changed(SEND, id="has space", client_message_id="has space"))],
    ),
    "ack": (
        [ACK_201, ACK_200, changed(ACK_200, history_available=True), ACK_409,
         changed(ACK_409, conflict="canonical_form_drift"), ACK_4XX, without(ACK_4XX, "detail"),
         changed(ACK_4XX, status=429, error="rate_limited"), ACK_5XX, changed(ACK_5XX, detail="serialization")],
        [("no_status", without(ACK_201, "status")),
         ("status_string", changed(ACK_201, status="201")),
         ("201_duplicate_true", changed(ACK_201, duplicate=True)),
         ("201_no_history_id", without(ACK_201, "history_id")),
         ("201_not_queued", changed(ACK_201, queued=False)),
         ("201_with_error", changed(ACK_201, error="x")),
         ("200_no_first_seen_at", without(ACK_200, "first_seen_at")),
         ("200_no_history_available", without(ACK_200, "history_available")),
         ("200_bad_first_seen_at", changed(ACK_200, first_seen_at="yesterday")),
         ("200_duplicate_false", changed(ACK_200, duplicate=False)),
         ("409_no_conflict", without(ACK_409, "conflict")),
         ("409_unknown_conflict", changed(ACK_409, conflict="outbox_dead_fingerprint_match")),
         ("409_other_error", changed(ACK_409, error="conflict")),
         ("409_no_prefix", without(ACK_409, "broker_fingerprint_prefix")),
         ("409_long_prefix", changed(ACK_409, broker_fingerprint_prefix=FP)),
         ("409_queued", changed(ACK_409, queued=True)),
         ("4xx_no_error", without(ACK_4XX, "error")),
         ("4xx_message_id", changed(ACK_4XX, messageId=BMID)),
         ("4xx_free_text_error", changed(ACK_4XX, error="Rate limited!")),
         ("5xx_with_broker_id", changed(ACK_5XX, broker_message_id=BMID)),
         ("status_302", changed(ACK_4XX, status=302)),
         ("status_600", changed(ACK_5XX, status=600)),
         ("legacy_only", {"type": "ack", "id": CMID, "messageId": BMID, "queued": True}),
         ("no_client_message_id", without(ACK_201, "client_message_id"))],
    ),
    "push": (
        [PUSH_MSG, PUSH_SYS, without(PUSH_MSG, "senderName", "topic", "replyToId", "meta", "request_fingerprint"),
         changed(PUSH_MSG, topic=None, attempt=4), changed(PUSH_SYS, event="peer_left", eventData={})],
        [("no_delivery_id", without(PUSH_MSG, "delivery_id")),
         ("attempt_zero", changed(PUSH_MSG, attempt=0)),
         ("no_client_message_id", without(PUSH_MSG, "client_message_id")),
         ("bad_created_at", changed(PUSH_MSG, createdAt="01/01/2026")),
         ("message_with_subtype", changed(PUSH_MSG, subtype="system")),
         ("system_no_event", without(PUSH_SYS, "event")),
         ("system_other_subtype", changed(PUSH_SYS, subtype="other")),
         ("system_with_body", changed(PUSH_SYS, body="x"))],
    ),
    "client_ack": (
        [CLIENT_ACK],
        [("no_delivery_id", without(CLIENT_ACK, "delivery_id")),
         ("snake_case", {"type": "client_ack", "client_message_id": CMID, "broker_message_id": BMID,
                         "delivery_id": "d-17"}),
         ("empty_delivery_id", changed(CLIENT_ACK, delivery_id=""))],
    ),
    "list_peers": (
        [{"type": "list_peers"}, {"type": "list_peers", "requestId": "r1"}],
        [("empty_request_id", {"type": "list_peers", "requestId": ""}),
         ("extra", {"type": "list_peers", "mesh": MESH})],
    ),
    "peers_list": (
        [PEERS_LIST, {"type": "peers_list", "peers": []}],
        [("no_peers", without(PEERS_LIST, "peers")),
         ("peer_without_name", changed(PEERS_LIST, peers=[{"pubkey": PK2}])),
         ("peer_bad_pubkey", changed(PEERS_LIST, peers=[{"pubkey": "abc", "displayName": "x"}]))],
    ),
    "set_summary": (
        [{"type": "set_summary", "summary": "refactoring the outbox"}, {"type": "set_summary", "summary": ""}],
        [("no_summary", {"type": "set_summary"}), ("summary_null", {"type": "set_summary", "summary": None})],
    ),
    "set_status": (
        [{"type": "set_status", "status": s} for s in ("idle", "working", "dnd")],
        [("unknown_status", {"type": "set_status", "status": "away"}), ("no_status", {"type": "set_status"})],
    ),
    "set_visible": (
        [{"type": "set_visible", "visible": True}, {"type": "set_visible", "visible": False}],
        [("visible_string", {"type": "set_visible", "visible": "yes"}), ("no_visible", {"type": "set_visible"})],
    ),
    "set_profile": (
        [{"type": "set_profile", "avatar": "🦊", "title": "SRE", "bio": "", "capabilities": ["deploy", "review"]},
         {"type": "set_profile", "title": "SRE"}],
        [("capabilities_string", {"type": "set_profile", "capabilities": "deploy"}),
         ("capability_not_string", {"type": "set_profile", "capabilities": [1]}),
         ("unknown_member", {"type": "set_profile", "displayName": "x"})],
    ),
    "error": (
        [{"type": "error", "code": "protocol_error", "message": "unknown frame type", "requestId": "r1"},
         {"type": "error", "code": "invalid_frame", "message": ""}],
        [("no_message", {"type": "error", "code": "invalid_frame"}),
         ("code_int", {"type": "error", "code": 400, "message": "x"})],
    ),
}

# --- trace events ----------------------------------------------------------------------------------------------------


def envelope(source: str, kind: str, seq: int = 0) -> dict[str, Any]:
    node = "daemon-a" if source == "daemon" else "broker-1"
    return {"v": 1, "source": source, "node": node, "seq": seq, "ts_ms": T0 + seq, "kind": kind}


IPC = {**envelope("daemon", "ipc_decision"), "mesh": MESH, "client_message_id": CMID, "request_fingerprint": FP,
       "row_state": "none", "fingerprint_match": None, "table_row": "IPC-NEW", "http_status": 202,
       "outbox_id": OUTBOX_ID}
IPC_DONE = changed(IPC, row_state="done", fingerprint_match=True, table_row="IPC-DONE-MATCH", http_status=200)
OBX = {**envelope("daemon", "outbox_transition", 1), "mesh": MESH, "outbox_id": OUTBOX_ID, "client_message_id": CMID,
       "request_fingerprint": FP, "from": "none", "to": "pending", "event": "accept", "table_row": "OB-NONE-ACCEPT",
       "attempts": 0, "enqueued_at_ms": T0, "max_age_at_ms": T0 + 71 * 3_600_000, "broker_message_id": None,
       "superseded_by": None}
OBX_DONE = changed(OBX, **{"from": "inflight", "to": "done", "event": "ack_created", "table_row": "OB-INFLIGHT-CREATED",
                           "attempts": 1, "broker_message_id": BMID})
OBX_ABORT = changed(OBX, **{"from": "dead", "to": "aborted", "event": "requeue", "table_row": "OB-DEAD-REQUEUE",
                            "attempts": 3, "superseded_by": SUCCESSOR_ID})
OBX_SUCCESSOR = changed(OBX, **{"outbox_id": SUCCESSOR_ID, "client_message_id": "01HQX3Z5VD0000000000000004",
                                "event": "requeue", "table_row": "OB-DEAD-REQUEUE"})
INBOX = {**envelope("daemon", "inbox_insert", 2), "mesh": MESH, "recipient": PK, "client_message_id": CMID,
         "broker_message_id": BMID, "delivery_id": "d-17", "inserted": True, "inbox_seq": 1}
SSE = {**envelope("daemon", "sse_event", 3), "event_id": 1, "event": "message"}
HOOK_ENQUEUE = {**envelope("daemon", "hook_enqueue", 4), "mesh": MESH, "client_message_id": CMID,
                "broker_message_id": BMID, "inbox_seq": 1, "hook": "on-message"}
HOOK_RUN = {**envelope("daemon", "hook_run", 5), "mesh": MESH, "client_message_id": CMID, "inbox_seq": 1,
            "hook": "on-message", "to": "done", "claims": 1,
            "reply_client_message_id": "hook.0123456789abcdef0123456789abcdef01234567", "http_status": 202}
ACCEPT = {**envelope("broker", "accept_decision"), "mesh": MESH, "client_message_id": CMID, "request_fingerprint": FP,
          "table_row": "BRK-ACCEPT", "phase": "B3", "status": 201, "broker_message_id": BMID, "member": PK2}
COMMIT = {**envelope("broker", "accept_commit", 1), "mesh": MESH, "client_message_id": CMID, "broker_message_id": BMID,
          "request_fingerprint": FP, "destination_kind": "topic", "destination_ref": "deploys",
          "effects": {"dedupe": 1, "message": 1, "history": 1, "delivery": 2}, "recipients": 2}
DELIVERY = {**envelope("broker", "delivery", 2), "mesh": MESH, "broker_message_id": BMID, "client_message_id": CMID,
            "recipient": PK, "delivery_id": "d-17", "attempt": 1, "lease_until_ms": T0 + 30_000}
DELIVERY_ACK = without(changed(DELIVERY, kind="delivery_ack", seq=3), "attempt", "lease_until_ms")
PRUNED = {**envelope("broker", "history_pruned", 4), "mesh": MESH, "broker_message_id": BMID,
          "client_message_id": CMID}

EVENTS: dict[str, tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]] = {
    "ipc_decision": (
        [IPC, IPC_DONE, changed(IPC, row_state="dead", fingerprint_match=True, table_row="IPC-DEAD-MATCH",
                                http_status=409)],
        [("none_with_match", changed(IPC, fingerprint_match=True)),
         ("row_without_match", changed(IPC_DONE, fingerprint_match=None)),
         ("row_status_mismatch", changed(IPC, http_status=409)),
         ("row_state_mismatch", changed(IPC_DONE, row_state="pending")),
         ("unknown_row", changed(IPC, table_row="IPC-MAYBE")),
         ("extra_member", changed(IPC, note="x")),
         ("source_broker", changed(IPC, source="broker")),
         ("bad_outbox_id", changed(IPC, outbox_id="row-1"))],
    ),
    "outbox_transition": (
        [OBX, OBX_DONE, OBX_ABORT, OBX_SUCCESSOR,
         changed(OBX, **{"from": "inflight", "to": "pending", "event": "link_lost", "table_row": "OB-INFLIGHT-FAILED",
                         "attempts": 2, "max_age_at_ms": None})],
        [("ignored_row", changed(OBX_DONE, table_row="OB-DONE-QUIET", **{"from": "done"})),
         ("row_event_mismatch", changed(OBX, event="dispatch")),
         ("done_without_broker_id", changed(OBX_DONE, broker_message_id=None)),
         ("aborted_without_successor", changed(OBX_ABORT, superseded_by=None)),
         ("superseded_when_not_aborted", changed(OBX, superseded_by=SUCCESSOR_ID)),
         ("successor_from_wrong_row", changed(OBX_SUCCESSOR, table_row="OB-INFLIGHT-RECOVER")),
         ("negative_attempts", changed(OBX, attempts=-1)),
         ("missing_nullable", without(OBX, "max_age_at_ms")),
         ("v2", changed(OBX, v=2))],
    ),
    "inbox_insert": (
        [INBOX, changed(INBOX, inserted=False, inbox_seq=None, delivery_id=None), changed(INBOX, inserted=False)],
        [("inserted_without_seq", changed(INBOX, inbox_seq=None)),
         ("seq_zero", changed(INBOX, inbox_seq=0)),
         ("bad_recipient", changed(INBOX, recipient="peer"))],
    ),
    "sse_event": (
        [SSE, changed(SSE, event_id=9, event="replay_gap"), changed(SSE, event="outbox_dead")],
        [("event_id_zero", changed(SSE, event_id=0)),
         ("unknown_event", changed(SSE, event="peer_joined")),
         ("no_event", without(SSE, "event"))],
    ),
    "hook_enqueue": (
        [HOOK_ENQUEUE, changed(HOOK_ENQUEUE, hook="on-topic-deploys")],
        [("seq_zero", changed(HOOK_ENQUEUE, inbox_seq=0)),
         ("no_hook", without(HOOK_ENQUEUE, "hook")),
         ("empty_hook", changed(HOOK_ENQUEUE, hook=""))],
    ),
    "hook_run": (
        [HOOK_RUN, changed(HOOK_RUN, to="failed", claims=3, reply_client_message_id=None, http_status=None),
         changed(HOOK_RUN, to="done", http_status=409)],
        [("not_final", changed(HOOK_RUN, to="claimed")),
         ("status_without_reply", changed(HOOK_RUN, reply_client_message_id=None)),
         ("reply_without_status", changed(HOOK_RUN, http_status=None)),
         ("claims_negative", changed(HOOK_RUN, claims=-1)),
         ("bad_reply_id", changed(HOOK_RUN, reply_client_message_id="hook id"))],
    ),
    "accept_decision": (
        [ACCEPT,
         changed(ACCEPT, table_row="BRK-DUP-MATCH", phase="dedupe", status=200),
         changed(ACCEPT, table_row="BRK-DRIFT", phase="B1", status=409, broker_message_id=None),
         changed(ACCEPT, table_row="BRK-B1-REJECT", phase="B1", status=400, broker_message_id=None,
                 client_message_id=None, request_fingerprint=None)],
        [("accept_without_id", changed(ACCEPT, broker_message_id=None)),
         ("accept_wrong_phase", changed(ACCEPT, phase="B2")),
         ("accept_wrong_status", changed(ACCEPT, status=200)),
         ("b2_as_409", changed(ACCEPT, table_row="BRK-B2-REJECT", phase="B2", status=409, broker_message_id=None)),
         ("drift_with_null_cmid", changed(ACCEPT, table_row="BRK-DRIFT", phase="B1", status=409,
                                          broker_message_id=None, client_message_id=None)),
         ("unknown_phase", changed(ACCEPT, phase="B0"))],
    ),
    "accept_commit": (
        [COMMIT, changed(COMMIT, effects={"dedupe": 2, "message": 0, "history": 1, "delivery": 0}, recipients=0)],
        [("effects_missing_history", changed(COMMIT, effects={"dedupe": 1, "message": 1, "delivery": 2})),
         ("effects_negative", changed(COMMIT, effects={"dedupe": 1, "message": 1, "history": 1, "delivery": -1})),
         ("bad_kind", changed(COMMIT, destination_kind="group"))],
    ),
    "delivery": (
        [DELIVERY, changed(DELIVERY, attempt=3)],
        [("attempt_zero", changed(DELIVERY, attempt=0)),
         ("no_lease", without(DELIVERY, "lease_until_ms")),
         ("daemon_source", changed(DELIVERY, source="daemon"))],
    ),
    "delivery_ack": (
        [DELIVERY_ACK],
        [("with_attempt", changed(DELIVERY_ACK, attempt=1)), ("no_delivery_id", without(DELIVERY_ACK, "delivery_id"))],
    ),
    "history_pruned": (
        [PRUNED],
        [("no_broker_id", without(PRUNED, "broker_message_id")), ("float_ts", changed(PRUNED, ts_ms=1.5)),
         ("negative_seq", changed(PRUNED, seq=-1))],
    ),
}

ALL = {**{f"broker/{k}": v for k, v in FRAMES.items()}, **{f"trace/{k}": v for k, v in EVENTS.items()}}
VALID = [(ref, i, ex) for ref, (valid, _) in ALL.items() for i, ex in enumerate(valid)]
INVALID = [(ref, label, ex) for ref, (_, invalid) in ALL.items() for label, ex in invalid]


def union_for(ref: str) -> str:
    return "broker/frame" if ref.startswith("broker/") else "trace/event"


# --- schema files ----------------------------------------------------------------------------------------------------


def test_every_schema_has_examples():
    assert sorted(FRAMES) == sorted(FRAME_NAMES)
    assert sorted(EVENTS) == sorted(EVENT_KINDS)
    for ref, (valid, invalid) in ALL.items():
        assert len(valid) >= 1 and len(invalid) >= 2, ref


@pytest.mark.parametrize("path", MY_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_schema_file_is_valid_2020_12(path):
    document = json.loads(path.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(document)
    assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert document["$id"] == f"{BASE}{path.parent.name}/{path.name}"
    assert document["title"].strip() and document["description"].strip()


@pytest.mark.parametrize("name", FRAME_NAMES)
def test_frame_schema_shape(name):
    document = json.loads((SCHEMAS / "broker" / f"{name}.json").read_text(encoding="utf-8"))
    assert document["type"] == "object"
    assert "type" in document["required"]
    assert document["properties"]["type"] == {"const": name}
    direction = [d for d in ("daemon→broker", "broker→daemon") if d in document["description"]]
    assert len(direction) == 1, "the description must say who sends the frame"
    union = json.loads((SCHEMAS / "broker" / "frame.json").read_text(encoding="utf-8"))
    side = "daemon_to_broker" if direction == ["daemon→broker"] else "broker_to_daemon"
    assert {"$ref": f"{name}.json"} in union["$defs"][side]["oneOf"]


@pytest.mark.parametrize("kind", EVENT_KINDS)
def test_event_schema_shape(kind):
    document = json.loads((SCHEMAS / "trace" / f"{kind}.json").read_text(encoding="utf-8"))
    assert document["type"] == "object"
    assert document["additionalProperties"] is False
    assert document["required"][: len(ENVELOPE)] == ENVELOPE
    properties = document["properties"]
    assert properties["v"] == {"type": "integer", "const": 1}  # an integer literal: 1.0 is not v 1
    assert properties["kind"] == {"const": kind}
    assert properties["source"]["const"] in ("daemon", "broker")
    assert document["description"].startswith(f"Trace event ({properties['source']['const']}).")
    reference = json.loads((SCHEMAS / "trace" / "delivery.json").read_text(encoding="utf-8"))["properties"]
    for key in ("node", "seq", "ts_ms"):
        assert properties[key] == reference[key], f"{kind}.{key} differs from the common envelope"
    assert set(document["required"]) == set(properties), "every member is required (nullable ones are null)"


def test_unions_list_every_file():
    frame = json.loads((SCHEMAS / "broker" / "frame.json").read_text(encoding="utf-8"))
    listed = [r["$ref"] for side in frame["$defs"].values() for r in side["oneOf"]]
    assert sorted(listed) == sorted(f"{n}.json" for n in FRAME_NAMES)
    assert sorted(frame["properties"]["type"]["enum"]) == sorted(FRAME_NAMES)
    event = json.loads((SCHEMAS / "trace" / "event.json").read_text(encoding="utf-8"))
    assert sorted(r["$ref"] for r in event["oneOf"]) == sorted(f"{k}.json" for k in EVENT_KINDS)
    assert sorted(event["properties"]["kind"]["enum"]) == sorted(EVENT_KINDS)


# --- examples --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("ref", "index", "example"), VALID, ids=[f"{r}#{i}" for r, i, _ in VALID])
def test_valid_example(ref, index, example):
    errors = [e.message for e in validator(ref).iter_errors(example)]
    assert not errors, errors
    assert not list(validator(union_for(ref)).iter_errors(example))


@pytest.mark.parametrize(("ref", "label", "example"), INVALID, ids=[f"{r}:{label}" for r, label, _ in INVALID])
def test_invalid_example(ref, label, example):
    assert list(validator(ref).iter_errors(example)), f"{ref} accepted {label}"
    assert list(validator(union_for(ref)).iter_errors(example)), f"{union_for(ref)} accepted {label}"


@pytest.mark.parametrize(("ref", "index", "example"), VALID, ids=[f"{r}#{i}" for r, i, _ in VALID])
def test_union_branches_are_exclusive(ref, index, example):
    group, names = ("broker", FRAME_NAMES) if ref.startswith("broker/") else ("trace", EVENT_KINDS)
    matching = [n for n in names if validator(f"{group}/{n}").is_valid(example)]
    assert matching == [ref.split("/")[1]]
    if group == "broker":
        sides = [s for s in ("daemon_to_broker", "broker_to_daemon")
                 if validator(f"{BASE}broker/frame.json#/$defs/{s}").is_valid(example)]
        assert len(sides) == 1


@pytest.mark.parametrize("union", ["broker/frame", "trace/event"])
def test_unions_reject_unknown_discriminators(union):
    check = validator(union)
    assert not check.is_valid({"type": "pong"})
    assert not check.is_valid({"kind": "pong", "v": 1})
    assert not check.is_valid({})
    assert not check.is_valid([])


# --- trace schemas against the tables --------------------------------------------------------------------------------


def _enum(kind: str, member: str) -> list[str]:
    document = json.loads((SCHEMAS / "trace" / f"{kind}.json").read_text(encoding="utf-8"))
    return document["properties"][member]["enum"]


def test_ipc_decision_names_every_ipc_lookup_row():
    rows = table("ipc_lookup")["rows"]
    assert _enum("ipc_decision", "table_row") == [r["id"] for r in rows]
    for row in rows:
        state, fingerprint = row["when"]["row_state"], row["when"]["fingerprint"]
        event = changed(IPC, row_state=state, table_row=row["id"], http_status=row["then"]["http_status"],
                        fingerprint_match=None if state == "none" else fingerprint == "match")
        assert validator("trace/event").is_valid(event), row["id"]
        assert not validator("trace/ipc_decision").is_valid(changed(event, http_status=500)), row["id"]


def test_outbox_transition_names_every_transition_row():
    rows = [r for r in table("outbox")["rows"] if r["then"]["outcome"] == "transition"]
    assert _enum("outbox_transition", "table_row") == [r["id"] for r in rows]
    assert _enum("outbox_transition", "event") == table("outbox")["inputs"]["event"]
    for row in rows:
        events = row["when"]["event"] if isinstance(row["when"]["event"], list) else [row["when"]["event"]]
        to = row["then"]["to"]
        for name in events:
            event = changed(OBX, **{"from": row["when"]["state"], "to": to, "event": name, "table_row": row["id"],
                                    "broker_message_id": BMID if to == "done" else None,
                                    "superseded_by": SUCCESSOR_ID if to == "aborted" else None})
            assert validator("trace/event").is_valid(event), (row["id"], name)
            wrong_to = "dead" if to != "dead" else "done"
            assert not validator("trace/outbox_transition").is_valid(changed(event, to=wrong_to)), row["id"]


def test_accept_decision_names_every_broker_accept_row():
    rows = table("broker_accept")["rows"]
    assert _enum("accept_decision", "table_row") == [r["id"] for r in rows]
    concrete = {"4xx": 403, "5xx": 500}
    for row in rows:
        status = concrete.get(row["then"]["http_status"], row["then"]["http_status"])
        event = changed(ACCEPT, table_row=row["id"], phase=row["then"]["phase"], status=status,
                        broker_message_id=BMID if status in (200, 201) else None)
        assert validator("trace/event").is_valid(event), row["id"]
        assert not validator("trace/accept_decision").is_valid(changed(event, phase="commit" if row["then"][
            "phase"] != "commit" else "B3")), row["id"]


# --- close codes -----------------------------------------------------------------------------------------------------


def test_close_codes_table():
    document = table("close_codes")
    assert document["id"] == "close_codes"
    assert document["section"] == "15.5"
    assert not list(validator("tables/catalogue").iter_errors(document))
    codes = {entry["code"]: entry for entry in document["codes"]}
    assert sorted(codes) == [1001, 1009, 1011, 1013, 4001, 4002, 4003, 4004, 4005, 4010]
    assert len(codes) == len(document["codes"])
    names = {code: entry["name"] for code, entry in codes.items()}
    assert names == {1001: "going_away", 1009: "message_too_big", 1011: "internal_error", 1013: "try_again_later",
                     4001: "unauthorized", 4002: "hello_expired", 4003: "replaced_by_newer_connection",
                     4004: "member_already_connected", 4005: "protocol_error", 4010: "feature_unavailable"}
    known = {r["id"] for r in yaml.safe_load((SPEC / "requirements.yaml").read_text(encoding="utf-8"))["requirements"]}
    for code, entry in codes.items():
        assert entry["sent_by"] == {4010: "daemon", 1001: "either"}.get(code, "broker")
        assert entry["description"].strip()
        assert entry["reason"] == {4010: "close_reason", 1001: "any", 1009: "any", 1013: "listed"}.get(code, "name")
        assert set(entry.get("requirements", [])) <= known, code
        # a standard code carries its RFC 6455 name, which is the name it is read by
        assert ("rfc6455" in entry) == (code < 4000), code
        if code < 4000:
            assert entry["rfc6455"].lower().replace(" ", "_") == entry["name"] == CloseCode(code).name.lower()
    assert sorted(codes[1013]["reasons"]) == ["slow_consumer", "try_again_later"]
    assert codes[4010]["reason_max_bytes"] == 123
    reason = validator(codes[4010]["reason_schema"])
    sample = {"kind": "feature_param_below_floor", "feature": "client_message_id_dedupe", "detail": "days=2 < 3"}
    assert reason.is_valid(sample)
    assert len(json.dumps(sample, separators=(",", ":")).encode()) <= 123
    assert not reason.is_valid({"close_reason": sample})


def test_sse_event_names_match_the_sse_schemas():
    payloads = sorted(p.stem for p in (SCHEMAS / "sse").glob("*.json") if p.stem != "index")
    if not payloads:
        pytest.skip("spec/schemas/sse has no payload schemas yet")
    assert sorted(_enum("sse_event", "event")) == payloads
