"""POST /v1/send: validation phase A, the §4.5.1 lookup table row by row, id rules, fingerprints, concurrency.

Behaviour before shape: every check below asserts what the spec (or the erratum it names) requires of the answer —
the status code, the conflict name, the row left untouched, the exact fingerprint — and nothing about the wording or
the media type of the answer; those are checked once, for every response, against spec/openapi.yaml (API-CONFORMS)
and the error envelope (ERR-PROBLEM-JSON). Requests use a destination every `to` grammar in the family reads alike
(a 64-hex DM, _support.RECIPIENT); meshspec's own `to` grammar is checked apart (DEST-GRAMMAR).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conformance.cases._support import (
    BODY,
    OTHER,
    RECIPIENT,
    outbox_rows,
    post_send,
    release_rows,
    row_for,
    unique,
    wait_row,
)
from conformance.peer import SILENT, fail, reject
from conformance.registry import case
from conformance.wire import json_object
from reference.core import canonical_preimage, parse_send
from spec import SPEC_DIR, load_json, load_table

ULID = re.compile(r"^[0-7][0-9A-HJKMNP-TV-Z]{25}$")
ULID_INSIDE = re.compile(r"(?<![0-9A-Za-z])[0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{25}(?![0-9A-Za-z])")
LOOKUP = load_table("ipc_lookup")
ROW_REQUIREMENTS = sorted({r for row in LOOKUP["rows"] for r in row["requirements"]})
# The answer's members beyond the spec's own words belong to the OpenAPI shape (E-29): per success row, and for 409s.
BODY_REQUIREMENT = {"IPC-NEW-ROW": "IPC-NEW-ROW-BODY", "IPC-PENDING-MATCH": "IPC-PENDING-MATCH-BODY",
                    "IPC-INFLIGHT-MATCH": "IPC-INFLIGHT-MATCH-BODY", "IPC-DONE-MATCH": "IPC-DONE-MATCH-BODY"}
IDENTITY = ("id", "client_message_id", "request_fingerprint")
HEX16 = re.compile(r"^[0-9a-f]{16}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")


def reach(api, broker, verdict, timing, state: str, cmid: str, blocked: list[str]) -> None:
    """Bring ``cmid``'s row into ``state`` through the IPC surface and the scripted broker, or end the node with
    ``blocked`` skipped (naming why) when the implementation does not let the row get there."""
    if state == "none":
        return
    if state == "pending":
        _reach_pending(api, broker, verdict, timing, cmid, blocked)
        return
    outcome = {"inflight": [SILENT] * 6, "done": [], "dead": [reject(404, "destination_not_found")],
               "aborted": [reject(404, "destination_not_found")]}[state]
    broker.answer(cmid, *outcome)
    accepted = post_send(api, BODY, cmid)
    if accepted.status_code != 202:
        verdict.blocked(blocked, f"the first send of {cmid} answered {accepted.status_code}, not 202")
    try:
        wait_row(api, cmid, "dead" if state == "aborted" else state, timeout=timing.settle_s())
    except AssertionError as exc:
        verdict.blocked(blocked, f"the row never reached {state}: {exc}")
    if state == "aborted":
        row = row_for(api, cmid) or {}
        requeued = api.post("/v1/outbox/requeue", json={"id": row.get("id")})
        if requeued.status_code != 200:
            verdict.blocked(blocked, f"POST /v1/outbox/requeue of the dead row answered {requeued.status_code}")
        try:
            wait_row(api, cmid, "aborted")
        except AssertionError as exc:
            verdict.blocked(blocked, f"the requeued row never showed aborted: {exc}")


def _reach_pending(api, broker, verdict, timing, cmid, blocked) -> None:
    """A pending row: the broker unreachable (the row waits for a link), or — for a daemon that marks rows inflight
    before it has a link — between two retries after transient (5xx) answers."""
    broker.answer(cmid, *[fail()] * 8)  # answers for when the row is sent after all (below)
    broker.hold()
    try:
        if post_send(api, BODY, cmid).status_code != 202:
            verdict.blocked(blocked, "the first send did not answer 202")
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            row = row_for(api, cmid)
            if row and row.get("status") == "pending":
                return  # released by the caller's finally
            time.sleep(0.05)
    except BaseException:
        broker.release(timeout=timing.reconnect_wait_s)
        raise
    broker.release(timeout=timing.reconnect_wait_s)
    try:
        wait_row(api, cmid, "pending", attempted=True, timeout=timing.settle_s(2))
    except AssertionError as exc:
        verdict.blocked(blocked, f"the row never showed pending, neither with the broker away nor between "
                                 f"retries: {exc}")


@case("ipc.lookup.row", "IPC-NEW-ROW", "IPC-PENDING-MATCH", "IPC-INFLIGHT-MATCH", "IPC-DONE-MATCH",
      "IPC-DONE-MISMATCH", "IPC-DEAD-MATCH", "IPC-CONFLICT-NO-MUTATION", "REQUEUE-NEVER-FREES", "IPC-NEW-ROW-BODY",
      "IPC-PENDING-MATCH-BODY", "IPC-INFLIGHT-MATCH-BODY", "IPC-DONE-MATCH-BODY", "IPC-CONFLICT-BODY",
      "FP-PREFIX-409", "FP-PREFIX-409-WHICH", "IPC-STABLE-ID", "FP-FROZEN")
@pytest.mark.parametrize("row", LOOKUP["rows"], ids=lambda r: r["id"])
def test_lookup_row(api, broker, verdict, timing, row):
    """Each row of spec/tables/ipc_lookup.yaml, reached through the protocol and answered exactly."""
    state = row["when"]["row_state"]
    mismatch = row["when"]["fingerprint"] == "mismatch"
    cmid = unique(row["id"].lower())
    then = row["then"]
    conflict_row = then["http_status"] == 409
    checked = [*row["requirements"], *(["FP-PREFIX-409", "FP-PREFIX-409-WHICH", "IPC-CONFLICT-BODY"] if conflict_row
                                       else ["IPC-STABLE-ID"]),
               *(BODY_REQUIREMENT[r] for r in row["requirements"] if r in BODY_REQUIREMENT)]
    try:
        reach(api, broker, verdict, timing, state, cmid, checked)
        before = row_for(api, cmid)
        request = OTHER if mismatch else BODY
        response = post_send(api, request, cmid)
        after = row_for(api, cmid)
    finally:
        if broker.held.is_set():
            broker.release(timeout=timing.reconnect_wait_s)
        release_rows(api, broker, cmid)
    body = json_object(response)
    got = f"{response.status_code} {response.text[:300]}"
    for requirement in row["requirements"]:
        own = requirement not in GENERIC  # the members a row includes belong to that row's own requirement
        with verdict.check(requirement):
            assert response.status_code == then["http_status"], f"{row['id']}: expected {then['http_status']}, {got}"
            if conflict_row:
                assert body.get("conflict") == then["conflict"], f"{row['id']}: conflict {body.get('conflict')!r}"
            if then.get("mutation") == "insert_pending":
                assert after is not None and after.get("status") in ("pending", "inflight", "done"), \
                    f"no row after the 202: {after}"
            else:
                _same_row(before, after, state)
            for member in then.get("include", ()) if own else ():
                assert member in body, f"{row['id']}: the answer has no {member!r}: {got}"
            if own and "broker_message_id" in then.get("include", ()):
                assert body.get("broker_message_id") == (before or {}).get("broker_message_id"), \
                    f"broker_message_id {body.get('broker_message_id')!r} is not the row's"
            if own and then["http_status"] == 200:
                assert body.get("duplicate") is True, f"{row['id']}: duplicate {body.get('duplicate')!r}, {got}"
            if own and "history_id" in then.get("include", ()):
                entry = broker.dedupe.get(cmid)
                assert entry is not None and body.get("history_id") == entry.history_id, \
                    f"history_id {body.get('history_id')!r} is not the one the broker acked " \
                    f"({entry.history_id if entry else None!r})"
            if own and "reason" in then.get("include", ()):
                assert body.get("reason") == ((before or {}).get("last_error") or ""), \
                    f"reason {body.get('reason')!r} is not the row's last_error {(before or {}).get('last_error')!r}"
    for requirement in row["requirements"]:
        body_requirement = BODY_REQUIREMENT.get(requirement)
        if body_requirement and response.status_code == then["http_status"]:
            _check_body(verdict, body_requirement, row, body, cmid)
    if conflict_row:
        prefix = body.get("daemon_fingerprint_prefix")
        verdict.expect("FP-PREFIX-409", isinstance(prefix, str) and HEX16.match(prefix),
                       f"the 409 carries daemon_fingerprint_prefix {prefix!r}, not 8 bytes of hex")
        own_print = daemon_fingerprint(api, broker, timing, request)
        stored = daemon_fingerprint(api, broker, timing, BODY)
        if own_print is None:
            verdict.skip("FP-PREFIX-409-WHICH", "the daemon shows its own fingerprint of a request nowhere")
        else:
            verdict.expect("FP-PREFIX-409-WHICH", prefix == own_print[:16],
                           f"daemon_fingerprint_prefix {prefix!r}, expected {own_print[:16]}: the first 8 bytes of "
                           f"the fingerprint the daemon computes for this request (E-26)"
                           + (" — it names the stored row's instead" if stored and prefix == stored[:16] else ""))
        with verdict.check("IPC-CONFLICT-BODY"):
            assert body.get("error") == "idempotency_key_reused", f"error {body.get('error')!r}"
            assert body.get("client_message_id") == cmid, f"client_message_id {body.get('client_message_id')!r}"
    else:
        verdict.expect("IPC-STABLE-ID", body.get("client_message_id") == cmid,
                       f"the answer names client_message_id {body.get('client_message_id')!r}, not {cmid!r}")
    if before is not None and after is not None and "request_fingerprint" in before:
        verdict.expect("FP-FROZEN", after.get("request_fingerprint") == before.get("request_fingerprint"),
                       f"the row's request_fingerprint changed: {before.get('request_fingerprint')} -> "
                       f"{after.get('request_fingerprint')}")


GENERIC = {"IPC-CONFLICT-NO-MUTATION", "REQUEUE-NEVER-FREES"}


def _check_body(verdict, requirement: str, row: dict, body: dict, cmid: str) -> None:
    """The members E-29 pins for a successful answer (status word, duplicate flag, the whole fingerprint)."""
    then = row["then"]
    with verdict.check(requirement):
        assert body.get("status") == then["status"], f"{row['id']}: status {body.get('status')!r}"
        assert body.get("duplicate") is then["duplicate"], f"{row['id']}: duplicate {body.get('duplicate')!r}"
        assert body.get("client_message_id") == cmid, f"client_message_id {body.get('client_message_id')!r}"
        if then["http_status"] == 202:
            shown = body.get("request_fingerprint")
            assert isinstance(shown, str) and HEX64.match(shown), f"request_fingerprint {shown!r}"
_OWN_PRINTS: dict[tuple[int, str], str | None] = {}


def daemon_fingerprint(api, broker, timing, body: dict) -> str | None:
    """The fingerprint the daemon itself computes for ``body`` (sent once under a fresh id; its send frame or its
    202 shows it), so exact-value checks do not depend on the daemon's canonical form being right."""
    key = (id(broker), json.dumps(body, sort_keys=True))
    if key not in _OWN_PRINTS:
        cmid = unique("own-print")
        response = post_send(api, body, cmid)
        _OWN_PRINTS[key] = _seen_fingerprint(api, broker, response, cmid, timing.settle_s())[0] \
            if response.status_code == 202 else None
    return _OWN_PRINTS[key]


def _same_row(before, after, state) -> None:
    """No mutation: a settled row is unchanged in every member; a live one (whose retries may move it on) keeps
    its identity and fingerprint."""
    assert before is not None and after is not None, f"the row vanished: {before} -> {after}"
    keys = before.keys() if state in ("done", "dead", "aborted") else [k for k in IDENTITY if k in before]
    changed = {k: (before.get(k), after.get(k)) for k in keys if before.get(k) != after.get(k)}
    assert not changed, f"the answer changed the row: {changed}"


# --- validation phase A -------------------------------------------------------------------------------------------

INVALID = [  # (body, the requirement the refusal belongs to)
    ({"to": RECIPIENT}, "IPC-VALIDATION-CONSUMES-NOTHING"),
    ({"message": "x"}, "IPC-VALIDATION-CONSUMES-NOTHING"),
    ({"to": RECIPIENT, "message": "x", "priority": "urgent"}, "IPC-VALIDATION-CONSUMES-NOTHING"),
    ({"to": RECIPIENT, "message": "x", "meta": [1]}, "IPC-VALIDATION-CONSUMES-NOTHING"),
    ({"to": RECIPIENT, "message": "x", "meta": "{}"}, "IPC-VALIDATION-CONSUMES-NOTHING"),
    ({"to": RECIPIENT, "message": 42}, "IPC-VALIDATION-CONSUMES-NOTHING"),
    ({"to": "@team", "message": "x"}, "DEST-GRAMMAR"),
    ({"to": "*", "message": "x"}, "DEST-GRAMMAR"),
    ({"to": RECIPIENT, "message": "x", "meta": {"n": 9007199254740993}}, "FP-META-REPRESENTABLE"),
]


@case("ipc.validation.consumes_nothing", "IPC-VALIDATION-CONSUMES-NOTHING", "DEST-GRAMMAR", "FP-META-REPRESENTABLE",
      "ERR-NO-5XX-ON-BAD-INPUT", "IPC-REQUEST-STRICT")
def test_validation_consumes_nothing(api, verdict):
    """Each invalid request is refused with a 4xx and consumes nothing: the same id is free for a valid send."""
    for n, (body, requirement) in enumerate(INVALID):
        cmid = unique(f"phase-a-{n}")
        response = post_send(api, body, cmid)
        verdict.expect(requirement, 400 <= response.status_code < 500,
                       f"{json.dumps(body)[:80]} answered {response.status_code}, not a 4xx")
        verdict.expect("ERR-NO-5XX-ON-BAD-INPUT", response.status_code < 500,
                       f"{json.dumps(body)[:80]} answered {response.status_code}")
        if 400 <= response.status_code < 500:
            verdict.expect(requirement, row_for(api, cmid) is None, f"a refused request left a row for {cmid}")
            accepted = post_send(api, BODY, cmid)
            verdict.expect(requirement, accepted.status_code == 202,
                           f"after the refusal, a valid send with the same id answered {accepted.status_code}: "
                           f"{accepted.text[:200]}")
    raw = unique("dup-members")
    dup = api.post("/v1/send", content=f'{{"to":"{RECIPIENT}","to":"{RECIPIENT}","message":"m"}}'.encode(),
                   headers={"Content-Type": "application/json", "Idempotency-Key": raw})
    verdict.expect("IPC-REQUEST-STRICT", 400 <= dup.status_code < 500,
                   f"a body with a duplicated member answered {dup.status_code} (E-19: duplicate keys are invalid)")


# --- ids -------------------------------------------------------------------------------------------------------------


@case("ipc.id.precedence", "IPC-ID-PRECEDENCE")
def test_header_wins(api, verdict):
    header, body_id = unique("header"), unique("body")
    response = post_send(api, {**BODY, "client_message_id": body_id}, header)
    with verdict.check("IPC-ID-PRECEDENCE"):
        assert response.status_code == 202, f"{response.status_code} {response.text[:200]}"
        assert json_object(response).get("client_message_id") == header, \
            f"the Idempotency-Key header did not win: the answer names {json_object(response).get('client_message_id')}"
        assert row_for(api, body_id) is None, "a row was written under the body's id"
        only_body = post_send(api, {**BODY, "client_message_id": body_id})
        assert json_object(only_body).get("client_message_id") == body_id, \
            "without the header, the body's client_message_id is not used"


@case("ipc.id.minted", "IPC-ID-MINTED-ULID", "IPC-ID-MINTED-FORM")
def test_minted_ids_are_ulids(api, verdict):
    """Without a caller id the daemon mints a ULID (v3 §4.2) and returns it; E-02: the bare 26-character form."""
    ids = [json_object(post_send(api, BODY)).get("client_message_id") for _ in range(3)]
    with verdict.check("IPC-ID-MINTED-ULID"):
        assert len(set(ids)) == 3, f"minted ids repeat: {ids}"
        bad = [i for i in ids if not isinstance(i, str) or not ULID_INSIDE.search(i)]
        assert not bad, f"minted ids are not ULIDs: {bad}"
        assert all(row_for(api, i) for i in ids), "a minted id has no outbox row"
    verdict.expect("IPC-ID-MINTED-FORM", all(isinstance(i, str) and ULID.match(i) for i in ids),
                   f"minted ids are not bare 26-character ULIDs: {ids}")


BAD_IDS = ["has space", "a/b", "-leading", "x" * 129, "é", "trailing\n", "tab\tinside", "", "a" * 200]


@case("ipc.id.grammar", "IPC-ID-GRAMMAR")
@pytest.mark.parametrize("bad", BAD_IDS, ids=lambda b: repr(b)[:24])
def test_id_grammar(api, verdict, bad):
    """An id outside the E-02 grammar is refused, in the body and (where HTTP can carry it) in the header."""
    body_id = post_send(api, {**BODY, "client_message_id": bad})
    verdict.expect("IPC-ID-GRAMMAR", body_id.status_code == 400,
                   f"client_message_id {bad!r} in the body answered {body_id.status_code}: {body_id.text[:160]}")
    if bad and "\n" not in bad and "\t" not in bad:
        header = api.post("/v1/send", content=json.dumps(BODY).encode(),
                          headers={"Content-Type": "application/json", "Idempotency-Key": bad.encode("utf-8")})
        verdict.expect("IPC-ID-GRAMMAR", header.status_code == 400,
                       f"Idempotency-Key {bad!r} answered {header.status_code}: {header.text[:160]}")
    if 400 <= body_id.status_code < 500:
        verdict.expect("IPC-ID-GRAMMAR", json_object(body_id).get("error") in (None, "invalid_client_message_id"),
                       f"refused with error {json_object(body_id).get('error')!r}, not invalid_client_message_id")


@case("ipc.id.grammar_boundary", "IPC-ID-GRAMMAR")
def test_id_grammar_boundary(api, verdict):
    """The longest id the grammar admits (128 characters, every character class) is accepted."""
    longest = ("A1b2.c3:d4_e5~f6-" * 8)[:128]
    response = post_send(api, BODY, longest)
    verdict.expect("IPC-ID-GRAMMAR", response.status_code == 202,
                   f"a 128-character id of the grammar answered {response.status_code}: {response.text[:160]}")


@case("ipc.id.hook_reply_reserved", "HOOK-REPLY-ID-RESERVED")
def test_hook_reply_ids_are_reserved(api, verdict):
    """E-50: ids beginning ``hook.`` are the daemon's hook replies (E-48); a client's send under one, in the body or
    the header, is refused and writes no row, whether the daemon runs hooks or not."""
    import hashlib

    for where in ("body", "header"):
        reserved = "hook." + hashlib.sha256(unique(where).encode()).hexdigest()[:40]
        response = (post_send(api, {**BODY, "client_message_id": reserved}) if where == "body"
                    else post_send(api, BODY, reserved))
        verdict.expect("HOOK-REPLY-ID-RESERVED", response.status_code == 400
                       and json_object(response).get("error") == "invalid_client_message_id",
                       f"{reserved} in the {where} answered {response.status_code}: {response.text[:160]}")
        verdict.expect("HOOK-REPLY-ID-RESERVED", row_for(api, reserved) is None, f"a row was written under {reserved}")


# --- fingerprints ----------------------------------------------------------------------------------------------------

VECTORS = load_json(SPEC_DIR / "vectors" / "fingerprint.json")["vectors"]
TO_MEMBER = re.compile(r'"to"\s*:\s*"((?:[^"\\]|\\.)*)"')


def neutral(vector: dict) -> bytes | None:
    """The vector's body with its destination replaced by RECIPIENT, raw bytes otherwise untouched (its escapes and
    whitespace are what it tests); None when that cannot be done exactly."""
    text = vector["input"]["body"]
    matches = list(TO_MEMBER.finditer(text))
    if len(matches) != 1:
        return None
    found = matches[0]
    return (text[:found.start(1)] + RECIPIENT + text[found.end(1):]).encode("utf-8")


def requirements_of(vector: dict) -> list[str]:
    flags = set(vector["flags"])
    found = ["FP-CANONICAL-FORM"]
    if flags & {"jcs-key-order", "jcs-numbers", "jcs-strings", "jcs-literals", "utf16-sort"}:
        found.append("FP-JCS")
    if "empty-meta" in flags:
        found.append("FP-EMPTY-META")
    if flags & {"defaults", "null-as-absent", "reply-to"}:
        found.append("FP-DEFAULTS")
    return found


SPEC_VECTORS = [v for v in VECTORS if v["expected"].get("valid") and "destination" not in v["flags"]
                and neutral(v) is not None]


def _seen_fingerprint(api, broker, response, cmid: str, timeout: float) -> tuple[str | None, str]:
    """The fingerprint the daemon computed for ``cmid``: from its send frame on the wire (E-21), else from the 202
    (E-29). Returns (hex or None, where it was seen)."""
    try:
        frames = broker.wait_for(lambda: broker.sends_of(cmid), timeout, f"the send frame of {cmid}")
        claimed = frames[0].frame.get("request_fingerprint")
        if isinstance(claimed, str):
            return claimed, "its send frame"
    except TimeoutError:
        pass
    answer = json_object(response).get("request_fingerprint")
    return (answer, "its 202") if isinstance(answer, str) else (None, "nowhere")


def _variants(raw: bytes, key: str | None) -> dict[str, str]:
    """The fingerprint of ``raw`` as the spec and E-03 compute it (``hex``), and as two readings of §4.4's "hex"
    that other implementations use: upper-case hex (still the spec, not E-03) and the raw 32 digest bytes (not hex
    at all). Knowing which one a daemon produced keeps one defect from hiding the rest of the preimage."""
    request = parse_send(raw, key)
    preimage = canonical_preimage(request.fingerprint_input())
    digest = hashlib.sha256(request.message.encode("utf-8")).digest()
    stem = preimage[:-64]
    return {"hex": hashlib.sha256(preimage).hexdigest(),
            "HEX": hashlib.sha256(stem + digest.hex().upper().encode()).hexdigest(),
            "raw": hashlib.sha256(stem + digest).hexdigest()}


@case("ipc.fingerprint.vectors", "FP-CANONICAL-FORM", "FP-BODY-HASH-HEX", "FP-JCS", "FP-EMPTY-META", "FP-DEFAULTS")
@pytest.mark.parametrize("vector", SPEC_VECTORS, ids=lambda v: v["id"])
def test_fingerprint_vector(api, broker, verdict, timing, vector):
    """Every valid spec/vectors/fingerprint.json vector, its destination made the neutral DM: the daemon computes
    exactly the fingerprint the core computes for those bytes (its send frame, or its 202, shows it)."""
    raw = neutral(vector)
    cmid = unique(vector["id"])
    body_key = vector["input"].get("idempotency_key")
    variants = _variants(raw, body_key)
    response = api.post("/v1/send", content=raw, headers={"Content-Type": "application/json",
                                                         "Idempotency-Key": cmid})
    requirements = requirements_of(vector)
    if response.status_code != 202:
        for requirement in requirements:
            verdict.expect(requirement, False, f"{vector['id']}: a valid request answered {response.status_code}: "
                                               f"{response.text[:200]}")
        return
    sent_key = json_object(response).get("client_message_id") or body_key or cmid
    seen, where = _seen_fingerprint(api, broker, response, sent_key, timing.settle_s())
    if seen is None:
        verdict.blocked([*requirements, "FP-BODY-HASH-HEX"],
                        "the daemon shows its fingerprint neither in its send frame nor in its 202")
    about = f"{vector['id']} ({', '.join(vector['flags'])}): {where} shows {seen}"
    if seen == variants["hex"]:
        verdict.passed(*requirements, "FP-BODY-HASH-HEX")
        return
    if seen in (variants["HEX"], variants["raw"]):
        form = "upper-case hex" if seen == variants["HEX"] else "the raw 32 digest bytes, not hex"
        verdict.expect("FP-BODY-HASH-HEX", False, f"{about}: body_hash entered the preimage as {form}")
        verdict.expect("FP-CANONICAL-FORM", seen == variants["HEX"],
                       f"{about}: body_hash entered the preimage as {form} (§4.4: sha256(body bytes), hex)")
        verdict.passed(*(r for r in requirements if r != "FP-CANONICAL-FORM"))  # the rest of the preimage agrees
        return
    for requirement in requirements:
        verdict.expect(requirement, False, f"{about}, expected {variants['hex']} — {vector['description']}")


DESTINATION_VECTORS = [v for v in VECTORS if "destination" in v["flags"]]


@case("ipc.destination.grammar", "DEST-GRAMMAR")
@pytest.mark.parametrize("vector", DESTINATION_VECTORS, ids=lambda v: v["id"])
def test_destination_vector(api, verdict, vector):
    """meshspec's `to` grammar (E-18): each destination vector is accepted with its fingerprint, or refused."""
    expected = vector["expected"]
    cmid = unique(vector["id"])
    response = api.post("/v1/send", content=vector["input"]["body"].encode("utf-8"),
                        headers={"Content-Type": "application/json", "Idempotency-Key": cmid})
    if expected.get("valid"):
        with verdict.check("DEST-GRAMMAR"):
            assert response.status_code == 202, f"{vector['id']}: {response.status_code} {response.text[:160]}"
            shown = json_object(response).get("request_fingerprint")
            if shown is not None:
                assert shown == expected["fingerprint"], f"{vector['id']}: fingerprint {shown}"
    else:
        verdict.expect("DEST-GRAMMAR", response.status_code == 400,
                       f"{vector['id']} ({vector['input']['body'][:60]}) answered {response.status_code}")


INVALID_VECTORS = [v for v in VECTORS if not v["expected"].get("valid") and "destination" not in v["flags"]]


STRICT_FLAGS = {"reply-to", "unknown-member", "lone-surrogate"}


def _invalid_requirement(vector: dict) -> str:
    """Which requirement a vector's refusal belongs to: the spec's own request schema (priority, meta an object,
    to/message present and strings) or the meshspec decision that makes it invalid."""
    flags, error = set(vector["flags"]), vector["expected"]["error"]
    if "id-grammar" in flags:
        return "IPC-ID-GRAMMAR"
    if error == "meta_not_canonicalizable":
        return "FP-META-REPRESENTABLE"
    if error == "invalid_json" or flags & STRICT_FLAGS or vector["input"]["body"].endswith('"message":""}'):
        return "IPC-REQUEST-STRICT"
    return "IPC-VALIDATION-CONSUMES-NOTHING"


@case("ipc.fingerprint.invalid", "IPC-ID-GRAMMAR", "FP-META-REPRESENTABLE", "ERR-NO-5XX-ON-BAD-INPUT",
      "IPC-VALIDATION-CONSUMES-NOTHING", "IPC-REQUEST-STRICT", "ERR-PROBLEM-JSON")
@pytest.mark.parametrize("vector", INVALID_VECTORS, ids=lambda v: v["id"])
def test_invalid_vector(api, verdict, vector):
    """Every invalid vector is refused with a 4xx before anything is stored (then: with its E-11 error code)."""
    key = vector["input"].get("idempotency_key")
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    response = api.post("/v1/send", content=vector["input"]["body"].encode("utf-8"), headers=headers)
    requirement = _invalid_requirement(vector)
    verdict.expect("ERR-NO-5XX-ON-BAD-INPUT", response.status_code < 500,
                   f"{vector['id']} ({vector['description'][:80]}) answered {response.status_code}")
    ok = verdict.expect(requirement, 400 <= response.status_code < 500,
                        f"{vector['id']} ({vector['description'][:80]}) answered {response.status_code}: "
                        f"{response.text[:160]}")
    if ok:
        error = json_object(response).get("error")
        verdict.expect("ERR-PROBLEM-JSON", error == vector["expected"]["error"],
                       f"{vector['id']}: error {error!r}, expected {vector['expected']['error']!r}")


# --- concurrency -----------------------------------------------------------------------------------------------------


#: rounds of the same-key race, each on an id of its own: a race a loaded machine lets slip through one round (its
#: requests served one after another) is caught by another; a serialising target passes every round
RACE_ROUNDS = 4
#: concurrent requests per wave; each round sends two waves of the same id
RACE_WIDTH = 32


def _race(mesh_target, cmid: str) -> list:
    """Two waves of RACE_WIDTH identical POSTs of ``cmid``, each released at once by a barrier from connections
    already open (a health request first), so that they reach the target together."""
    barrier = threading.Barrier(RACE_WIDTH)

    def one(_):
        with mesh_target.client(mesh_target.transports[0]) as client:
            with contextlib.suppress(Exception):  # the connection is opened now, not after the barrier
                client.get("/v1/health")
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=10)
            return client.post("/v1/send", json=BODY, headers={"Idempotency-Key": cmid})

    with ThreadPoolExecutor(RACE_WIDTH) as pool:
        return list(pool.map(one, range(RACE_WIDTH))) + list(pool.map(one, range(RACE_WIDTH)))


@case("ipc.concurrent.same_key", "IPC-SERIALIZED")
def test_concurrent_same_key(api, mesh_target, verdict):
    """Concurrent identical POSTs of one id, in RACE_ROUNDS rounds (a fresh id each): exactly one row, at most one
    answer saying it created it, one fingerprint, every answer 200 or 202."""
    rounds = []
    for round_ in range(1, RACE_ROUNDS + 1):
        cmid = unique(f"race{round_}")
        answers = _race(mesh_target, cmid)
        for answer in answers:
            api.check(answer)
        rounds.append((round_, cmid, answers))
    with verdict.check("IPC-SERIALIZED"):
        for round_, cmid, answers in rounds:
            where = f"round {round_} of {RACE_ROUNDS} ({len(answers)} concurrent POSTs of one id)"
            statuses = sorted({a.status_code for a in answers})
            assert set(statuses) <= {200, 202}, f"{where}: answers {statuses}"
            rows = [r for r in outbox_rows(api) if r.get("client_message_id") == cmid]
            assert len(rows) == 1, f"{where}: {len(rows)} rows for one id"
            prints = {json_object(a).get("request_fingerprint") for a in answers}
            assert len(prints) == 1, f"{where}: {len(prints)} different fingerprints for one request"
            created = [a for a in answers if json_object(a).get("duplicate") is False]
            assert len(created) <= 1, f"{where}: {len(created)} answers say they created the row"
