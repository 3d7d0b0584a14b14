"""The broker half: hello, close codes, negotiation, the accept decision (201 / 200 / 409 / B1 / B2), concurrency.

Every case records its evidence per requirement (conformance/verdict.py), behaviour before shape: an ack's status
and ids are judged against the requirement they serve, its E-10 schema against WS-ACK-STATUS apart. Exact values and
boundaries, each with a second instance: a duplicate answers the original's ids and first_seen_at exactly; a 409's
prefix is the broker's recomputation of *this* send (E-31); a body of exactly ``max_payload.inline_bytes`` UTF-8
bytes passes and one byte more is refused; a hello 2 s inside the ±60 s window passes and 2 s outside is refused,
in the past and in the future.

"No dedupe row behind a rejection" is observed black-box: after a B1 or B2 refusal the same id, sent again as a
valid request, is accepted with 201 (it would be 200 or 409 if a dedupe row had been left). With --store-dsn the
§4.3 dedupe row is also read from the store (conformance/store_inventory.py).
"""

from __future__ import annotations

import json
import threading
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from conformance.broker_cases._support import (
    ANSWER_S,
    CLOSE_S,
    DAY_MS,
    HELLO_SKEW_S,
    NEGOTIATION,
    TOPIC,
    cmid,
    dedupe_params,
    first_acks,
    fresh_name,
    inline_limit,
    join,
    record_shape,
    rfc3339_ms,
    status,
    stranger,
    summary,
)
from conformance.member import fingerprint_of, send_frame
from conformance.registry import case
from conformance.store_inventory import dedupe_row, message_count
from reference.core import close_code, negotiate
from spec import load_table, validator

#: broker_fingerprint_prefix's shape, as the spec's schemas define it: the first 8 bytes of a fingerprint in hex
PREFIX_SHAPE = validator("common/defs#/$defs/fingerprint_prefix")

LIMITS = {name: entry["value"] for name, entry in load_table("limits")["limits"].items()}

# --- hello and close codes -----------------------------------------------------------------------------------------


def _outcome(peer) -> str:
    """What became of a hello: accepted, or the close code."""
    if peer.hello_ack is not None:
        return "accepted"
    code = peer.close_code_within(CLOSE_S)
    return f"not answered within {CLOSE_S:g} s" if code == "open" else f"closed {code}"


@case("broker.hello.auth", "BRK-HELLO-AUTH")
def test_hello_is_verified(member, verdict):
    """An honest hello is accepted; four forged ones are closed 4001 — a signature of zeros, one by another key, one
    over another timestamp, and one claiming the key of a member that already authenticated."""
    honest = member(name="honest").open()
    verdict.require("BRK-HELLO-AUTH", honest.hello_ack is not None,
                    f"an honest, freshly signed hello was refused: {_outcome(honest)}")
    forgeries = {  # dated by the broker's clock, so only the signature can be wrong
        "a signature of zeros": lambda m, now: m.hello(now, signature="00" * 64),
        "a signature by another key": lambda m, now: m.hello(now, signer=Ed25519PrivateKey.generate()),
        "a signature over another timestamp": lambda m, now: m.hello(now, signed_timestamp_ms=now - 1_000),
        "the key of a connected member, signed by another key": lambda m, now: m.hello(now, pubkey=honest.pubkey),
    }
    for what, forge in forgeries.items():
        forged = member(name="forged")
        forged.open(hello=forge(forged, honest.broker_now_ms()))
        outcome = _outcome(forged)
        refused = f"closed {close_code('unauthorized')}"
        verdict.expect("BRK-HELLO-AUTH", outcome == refused, f"a hello with {what} was {outcome}, not {refused} "
                                                             "unauthorized (E-22)")


@case("broker.hello.skew", "BRK-HELLO-AUTH")
def test_hello_timestamp_window(member, verdict):
    """E-22: ±60 s from the broker's clock (read from hello_ack.serverTime). 2 s outside, in the past and in the
    future, is closed 4002; 2 s inside, either way, is accepted."""
    clock = member(name="clock").open()
    verdict.require("BRK-HELLO-AUTH", clock.hello_ack is not None,
                    f"an honest, freshly signed hello was refused: {_outcome(clock)}")
    margin_ms = 2_000 + clock.clock_uncertainty_ms
    where = (f"the broker's clock (hello_ack.serverTime, ±{clock.clock_uncertainty_ms:.0f} ms)"
             if clock.clock_uncertainty_ms < 1_000 else "our clock (the broker sent no serverTime)")
    expired = f"closed {close_code('hello_expired')}"
    rows = [(sign * (HELLO_SKEW_S * 1000 + inside * margin_ms), expected)
            for sign in (-1, 1) for inside, expected in ((1, expired), (-1, "accepted"))]
    for offset_ms, expected in rows:
        peer = member(name="skewed")
        peer.open(hello=peer.hello(timestamp_ms=int(clock.broker_now_ms() + offset_ms)), negotiate=False)
        outcome = _outcome(peer)
        verdict.expect("BRK-HELLO-AUTH", outcome == expected,
                       f"a hello dated {abs(offset_ms) / 1000:.1f} s {'after' if offset_ms > 0 else 'before'} {where} "
                       f"was {outcome}, expected {expected} (E-22: ±{HELLO_SKEW_S:g} s)")


@case("broker.protocol_error", "BRK-PROTOCOL-ERROR")
def test_frames_out_of_order_or_unparsable_close_4005(member, verdict):
    """E-22, close_codes.yaml: a frame before hello or before negotiation completes, an unparsable frame or one of no
    known type closes 4005 — before hello, between hello_ack and negotiation, and after the handshake."""
    for what, stage, frame in (
        ("a list_peers frame before hello", "connected", {"type": "list_peers"}),
        ("text that is not JSON before hello", "connected", "hello? {"),
        ("a send frame after hello_ack, before feature negotiation", "hello_ack",
         send_frame(cmid("early"), TOPIC, "sent before negotiation")),
        ("a frame of an unknown type after the handshake", "joined", {"type": "meshconform_no_such_frame"}),
        ("text that is not JSON after the handshake", "joined", "{\"type\": \"list_peers\""),
    ):
        peer = member(name="protocol")
        if stage == "connected":
            peer.connect()
        else:
            peer.open(negotiate=stage == "joined")
            if peer.hello_ack is None or (stage == "joined" and not peer.joined):
                verdict.blocked(["BRK-PROTOCOL-ERROR"], "a fresh member could not join: broker.hello.auth says why")
        peer.send(frame)
        outcome = peer.close_code_within(CLOSE_S)
        accepted = [a for a in peer.acks(frame["client_message_id"]) if a.get("status") in (200, 201)] if (
            isinstance(frame, dict) and frame.get("type") == "send") else []
        verdict.expect("BRK-PROTOCOL-ERROR", outcome == close_code("protocol_error") and not accepted,
                       f"after {what} the connection was {'closed ' if outcome != 'open' else 'left '}{outcome}"
                       f"{', and the send was accepted' if accepted else ''}; expected a 4005 protocol_error close")


@case("broker.frame_ijson", "LINK-FRAME-IJSON")
def test_binary_and_duplicate_key_frames_close_4005(member, verdict):
    """E-46: a frame is one I-JSON text message. A hello in a binary message, a send in a binary message and a send
    naming ``body`` twice each close 4005 protocol_error, and no such send is accepted. The binary hello is judged
    only when the broker closes 4005 on text that is not JSON before hello: a broker that reads past whatever comes
    before the hello makes BRK-PROTOCOL-ERROR's mistake, and a binary hello left open would only repeat it."""
    for what, stage, frame in (
        ("a hello in a binary message", "connected", None),
        ("a send in a binary message", "joined", json.dumps(send_frame(cmid("binary"), TOPIC, "binary")).encode()),
        ("a send naming body twice", "joined",
         json.dumps(send_frame(cmid("twice"), TOPIC, "first")).replace('"body": "first"',
                                                                       '"body": "first", "body": "second"')),
    ):
        if stage == "connected" and not _refuses_text_before_hello(member):
            continue
        peer = member(name="ijson")
        if stage == "connected":
            peer.connect()
            frame = json.dumps(peer.hello()).encode()
        else:
            peer.open()
            if not peer.joined:
                verdict.blocked(["LINK-FRAME-IJSON"], "a fresh member could not join: broker.hello.auth says why")
        peer.send(frame)
        outcome = peer.close_code_within(CLOSE_S)
        sent = json.loads(frame) if stage == "joined" else {}
        accepted = [a for a in peer.acks(sent.get("client_message_id", "")) if a.get("status") in (200, 201)]
        verdict.expect("LINK-FRAME-IJSON", outcome == close_code("protocol_error") and not accepted,
                       f"after {what} the connection was {'closed ' if outcome != 'open' else 'left '}{outcome}"
                       f"{', and the send was accepted' if accepted else ''}; expected a 4005 protocol_error close")


def _refuses_text_before_hello(member) -> bool:
    """Whether the broker closes 4005 on text that is not JSON sent before the hello (BRK-PROTOCOL-ERROR)."""
    probe = member(name="ijson-probe")
    probe.connect()
    probe.send("hello? {")
    return probe.close_code_within(CLOSE_S) == close_code("protocol_error")


def _nested(levels: int) -> dict:
    """An object ``levels`` deep (itself level 1)."""
    value: object = 1
    for _ in range(levels):
        value = {"a": value}
    return value  # type: ignore[return-value]


@case("broker.frame_limits", "BRK-FRAME-LIMITS", "BRK-B1-NO-WRITE", "WS-ACK-STATUS")
def test_frames_past_the_json_limits(member, verdict):
    """E-40, limits.yaml, at each boundary: a send nested exactly json_max_depth levels is accepted 201 and one
    level deeper is refused 400 limit_exceeded with its id left free; a send holding an integer literal of
    json_max_integer_digits + 1 digits is refused 400 limit_exceeded; another frame past a limit gets an error frame
    (invalid_frame) and the connection carries on; a frame too deep to parse closes 4005; a message of exactly
    link_frame_max_bytes bytes is acknowledged (not closed) and one byte more closes 1009; another member is served
    after each close."""
    requirements = ("BRK-FRAME-LIMITS", "BRK-B1-NO-WRITE")
    depth, digits = LIMITS["json_max_depth"], LIMITS["json_max_integer_digits"]
    frame_max = LIMITS["link_frame_max_bytes"]
    sender = join(member, verdict, requirements)
    acks = []
    # the frame is level 1 and meta level 2: meta nested depth - 1 levels makes the frame exactly `depth` deep
    for levels, expected in ((depth, (201, None)), (depth + 1, (400, "limit_exceeded"))):
        key = cmid(f"depth-{levels}")
        sender.send(send_frame(key, TOPIC, "nested meta", meta=_nested(levels - 1)))
        got = sender.ack(key, 1, ANSWER_S)
        acks.append(got)
        seen = (status(got), got.get("error") if got and status(got) != 201 else None)
        verdict.expect("BRK-FRAME-LIMITS", seen == expected,
                       f"a send nested {levels} levels deep (json_max_depth {depth}) was answered {summary(got)}, "
                       f"not {expected[0]}{' ' + expected[1] if expected[1] else ''}")
        if expected[0] == 400 and status(got) not in (200, 201):
            free, reuse = _reuse_is_free(sender, key, 2)
            verdict.expect("BRK-B1-NO-WRITE", free, f"after refusing the too-deep send the same id, now valid, was "
                                                    f"answered {reuse}, not 201: the refusal left a dedupe row")
    key = cmid("digits")
    long_int = json.dumps(send_frame(key, TOPIC, "long integer", meta={"n": "@"})).replace(
        '"@"', "7" * (digits + 1))
    sender.send(long_int)
    got = sender.ack(key, 1, ANSWER_S)
    acks.append(got)
    verdict.expect("BRK-FRAME-LIMITS", got is not None and (status(got), got.get("error")) == (400, "limit_exceeded"),
                   f"a send holding a {digits + 1}-digit integer (json_max_integer_digits {digits}) was answered "
                   f"{summary(got)}, not 400 limit_exceeded")
    errors_before = len(sender.errors())
    sender.send('{"type":"list_peers","x":' + json.dumps(_nested(depth + 1)) + "}")
    error = sender.poll(lambda: sender.errors()[errors_before:], ANSWER_S)
    verdict.expect("BRK-FRAME-LIMITS", bool(error) and error[0].get("code") == "invalid_frame",
                   f"a list_peers frame nested past json_max_depth was answered {error[0] if error else 'nothing'} "
                   f"(connection {'closed ' + str(sender.close_code) if sender.closed else 'open'}), not an error "
                   "frame with code invalid_frame")
    key = cmid("after-limits")
    sender.send(send_frame(key, TOPIC, "the connection carries on"))
    after = sender.ack(key, 1, ANSWER_S)
    verdict.expect("BRK-FRAME-LIMITS", status(after) == 201,
                   f"after the frames past the limits a valid send on the same connection was answered "
                   f"{summary(after)}, not 201")
    record_shape(verdict, acks)
    sender.close()

    def then_served(what: str) -> None:
        other = join(member, verdict, requirements, name="after-close")
        key = cmid("served")
        other.send(send_frame(key, TOPIC, f"after {what}"))
        served = other.ack(key, 1, ANSWER_S)
        verdict.expect("BRK-FRAME-LIMITS", status(served) == 201,
                       f"after {what} another member's valid send was answered {summary(served)}, not 201")
        other.close()

    deep = join(member, verdict, requirements, name="too-deep")
    deep.send('{"type":"send","meta":' + '{"a":' * 100_000 + "1" + "}" * 100_000 + "}")
    outcome = deep.close_code_within(CLOSE_S)
    verdict.expect("BRK-FRAME-LIMITS", outcome == close_code("protocol_error"),
                   f"a frame nested 100001 levels deep was followed by {outcome!r}, not a 4005 protocol_error close")
    then_served("a frame too deep to parse")

    for size in (frame_max, frame_max + 1):
        peer = join(member, verdict, requirements, name=f"frame-{size}")
        key = cmid(f"frame-{size}")
        frame = send_frame(key, TOPIC, "")
        padding = size - len(json.dumps(frame).encode())
        text = json.dumps(send_frame(key, TOPIC, "x" * padding))
        assert len(text.encode()) == size, (len(text.encode()), size)
        peer.send(text)
        if size == frame_max:
            got = peer.ack(key, 1, ANSWER_S)
            verdict.expect("BRK-FRAME-LIMITS", got is not None and not peer.closed,
                           f"a send message of exactly link_frame_max_bytes = {frame_max} bytes was answered "
                           f"{summary(got)} (connection {'closed ' + str(peer.close_code) if peer.closed else 'open'})"
                           ", not acknowledged on an open connection (413 payload_too_large when its body is past "
                           "inline_bytes)")
        else:
            outcome = peer.close_code_within(CLOSE_S)
            verdict.expect("BRK-FRAME-LIMITS", outcome == close_code("message_too_big") and not peer.acks(key),
                           f"a message of link_frame_max_bytes + 1 = {size} bytes was followed by {outcome!r}"
                           f"{' and an ack' if peer.acks(key) else ''}, not a 1009 close")
            then_served("a message past link_frame_max_bytes")
        peer.close()


# --- negotiation ---------------------------------------------------------------------------------------------------


@case("broker.negotiation.advertise", "BRK-ADVERTISE")
def test_negotiation_advertises_dedupe(member, verdict):
    peer = member().open()
    verdict.require("BRK-ADVERTISE", peer.negotiation is not None,
                    f"no feature_negotiation_response after hello_ack (hello_ack {peer.hello_ack is not None}, close "
                    f"{peer.close_code})")
    problems = [e.message for e in NEGOTIATION.iter_errors(peer.negotiation)]
    verdict.expect("BRK-ADVERTISE", not problems, f"the negotiation response is outside its schema: {problems[:1]}")
    result = negotiate(peer.negotiation, ["client_message_id_dedupe"], ["max_payload"])
    params = dedupe_params(peer) or {}
    why = result.failure or "not version 1 with request_fingerprint true"
    verdict.expect("BRK-ADVERTISE", result.ok and params.get("version") == 1 and params.get("request_fingerprint")
                   is True, f"client_message_id_dedupe params {params!r}: {why}")


@case("broker.negotiation.policy", "BRK-ADVERTISE-POLICY")
def test_advertised_dedupe_policy_is_the_meshs(broker_target, member, verdict):
    """§17: the advertised mode and dedupe_retention_days are the mesh's policy — the same for every member, and
    what the broker enacts: a dedupe row it writes expires dedupe_retention_days after first_seen_at
    (retention_scoped) or never (permanent). The second half reads the §4.3 row (--store-dsn)."""
    first, second = (join(member, verdict, ("BRK-ADVERTISE-POLICY",), name) for name in ("policy-1", "policy-2"))
    params, again = dedupe_params(first), dedupe_params(second)
    if params is None:
        verdict.blocked(["BRK-ADVERTISE-POLICY"], "no client_message_id_dedupe params (broker.negotiation.advertise)")
    keys = ("mode", "dedupe_retention_days")
    verdict.expect("BRK-ADVERTISE-POLICY", all(params.get(k) == (again or {}).get(k) for k in keys),
                   f"two members of one mesh were advertised different dedupe policies: {params!r} and {again!r}")
    if not broker_target.store_dsn:
        verdict.blocked(["BRK-ADVERTISE-POLICY"], "what the broker enacts is read from its store: give --store-dsn")
    key = cmid("policy")
    first.send(send_frame(key, TOPIC, "policy"))
    accepted = first.ack(key)
    if status(accepted) != 201:
        verdict.blocked(["BRK-ADVERTISE-POLICY"], f"a plain send was not accepted: {summary(accepted)}")
    row = dedupe_row(broker_target.store_dsn, broker_target.mesh_id, key)
    if row is None or row["first_seen_at"] is None:
        verdict.blocked(["BRK-ADVERTISE-POLICY"], f"no §4.3 client_message_dedupe row for {key} in the store")
    mode, days = params.get("mode"), params.get("dedupe_retention_days")
    if mode == "permanent":
        verdict.expect("BRK-ADVERTISE-POLICY", row["expires_at"] is None,
                       f"mode permanent is advertised but the dedupe row expires at {row['expires_at']}")
    else:
        lived = None if row["expires_at"] is None else row["expires_at"] - row["first_seen_at"]
        verdict.expect("BRK-ADVERTISE-POLICY", isinstance(days, int) and lived is not None
                       and abs(lived - days * DAY_MS) <= 1_000,
                       f"mode {mode} with dedupe_retention_days {days!r} is advertised, but the dedupe row lives "
                       f"{'forever' if lived is None else f'{lived / DAY_MS:.3f} days'}")


# --- the accept decision -------------------------------------------------------------------------------------------


@case("broker.accept.outcomes", "BRK-FIRST-INSERT", "BRK-DUP-MATCH", "BRK-DUP-MISMATCH", "BRK-DUP-MISMATCH-PREFIX",
      "WS-ACK-STATUS")
def test_first_duplicate_and_mismatch(broker_target, member, verdict):
    """201; two retries answered 200 with the original's broker_message_id, history_id and one first_seen_at (the
    original's, not the retry's); another body 409 whose prefix is this send's fingerprint (E-31); the original again
    still 200 (the 409 changed nothing)."""
    sender = join(member, verdict, ("BRK-FIRST-INSERT", "BRK-DUP-MATCH", "BRK-DUP-MISMATCH", "BRK-DUP-MISMATCH-PREFIX",
                                    "WS-ACK-STATUS"))
    key = cmid("accept")
    original = send_frame(key, TOPIC, "first")
    sent_at = sender.broker_now_ms()
    sender.send(original)
    first = sender.ack(key, 1)
    acked_at = sender.broker_now_ms()
    verdict.require("BRK-FIRST-INSERT", status(first) == 201 and first.get("duplicate") is False
                    and first.get("broker_message_id") and first.get("history_id"),
                    f"a first send was answered {summary(first)}, not 201 with ids and duplicate false")
    retries = []
    for number in (2, 3):
        time.sleep(0.5)  # a first_seen_at taken from the retry would move
        sender.send(original)
        retries.append(sender.ack(key, number))
    for retry in retries:
        verdict.expect("BRK-DUP-MATCH", status(retry) == 200 and retry.get("duplicate") is True
                       and retry.get("history_available") is True,
                       f"a matching retry was answered {summary(retry)}, not 200 duplicate with history_available")
        verdict.expect("BRK-DUP-MATCH", retry is not None and (retry.get("broker_message_id"), retry.get("history_id"))
                       == (first["broker_message_id"], first["history_id"]),
                       f"a duplicate named ids {summary(retry)} other than the original's {summary(first)}")
    seen = [rfc3339_ms((r or {}).get("first_seen_at")) for r in retries]
    slack = sender.clock_uncertainty_ms + 50
    verdict.expect("BRK-DUP-MATCH", seen[0] is not None and seen[0] == seen[1]
                   and sent_at - slack <= seen[0] <= acked_at + slack,
                   f"first_seen_at {[(r or {}).get('first_seen_at') for r in retries]} is not the original send's "
                   f"(between {sent_at} and {acked_at} ms on the broker's clock, the same in every duplicate)")
    if broker_target.store_dsn:
        row = dedupe_row(broker_target.store_dsn, broker_target.mesh_id, key)
        verdict.expect("BRK-DUP-MATCH", row is not None and row["first_seen_at"] == seen[0],
                       f"the duplicate's first_seen_at {seen[0]} differs from the stored row's "
                       f"{row and row['first_seen_at']}")
    other = send_frame(key, TOPIC, "a different body")
    sender.send(other)
    conflict = sender.ack(key, 4)
    verdict.expect("BRK-DUP-MISMATCH", status(conflict) == 409 and conflict.get("error") == "idempotency_key_reused"
                   and conflict.get("conflict") == "request_fingerprint_mismatch",
                   f"a retry with another body was answered {summary(conflict)}, not 409 request_fingerprint_mismatch")
    prefix = (conflict or {}).get("broker_fingerprint_prefix")
    verdict.expect("BRK-DUP-MISMATCH", PREFIX_SHAPE.is_valid(prefix),
                   f"the 409 carries broker_fingerprint_prefix {prefix!r}, not 8 bytes of hex")
    verdict.expect("BRK-DUP-MISMATCH-PREFIX", prefix == fingerprint_of(other)[:16],
                   f"the 409 names prefix {(conflict or {}).get('broker_fingerprint_prefix')!r}; the broker's "
                   f"recomputation of this send is {fingerprint_of(other)[:16]} (the stored one "
                   f"{fingerprint_of(original)[:16]}) — E-31")
    sender.send(original)
    after = sender.ack(key, 5)
    verdict.expect("BRK-DUP-MISMATCH", status(after) == 200 and after.get("broker_message_id")
                   == first["broker_message_id"], f"after the 409 the original was answered {summary(after)}")
    record_shape(verdict, [first, *retries, conflict, after])


@case("broker.accept.recompute", "BRK-RECOMPUTE", "BRK-RECOMPUTE-DRIFT", "WS-ACK-STATUS")
def test_claimed_fingerprint_is_recomputed(broker_target, member, verdict):
    """E-21: a claimed fingerprint that is not the broker's recomputation is 409 canonical_form_drift before any
    write — on a first send (the id stays free) and on a retry of an accepted send (not a 200: the dedupe row stays
    as it was, so the honest retry is still the original's duplicate)."""
    sender = join(member, verdict, ("BRK-RECOMPUTE", "BRK-RECOMPUTE-DRIFT", "WS-ACK-STATUS"))
    acks = []
    for when in ("first send", "retry"):
        key = cmid("drift")
        honest = send_frame(key, TOPIC, f"drift on the {when}")
        count = 0
        original = None
        if when == "retry":
            sender.send(honest)
            original = sender.ack(key, count := count + 1)
            if status(original) != 201:
                verdict.blocked(["BRK-RECOMPUTE", "BRK-RECOMPUTE-DRIFT"],
                                f"an honest send was answered {summary(original)}")
        sender.send({**honest, "request_fingerprint": "ab" * 32})
        drift = sender.ack(key, count := count + 1)
        acks += [original, drift]
        verdict.expect("BRK-RECOMPUTE", status(drift) == 409
                       and drift.get("broker_fingerprint_prefix") == fingerprint_of(honest)[:16],
                       f"a {when} claiming a fingerprint that is not the frame's was answered {summary(drift)}, not "
                       f"409 with the broker's own fingerprint {fingerprint_of(honest)[:16]}")
        verdict.expect("BRK-RECOMPUTE-DRIFT", status(drift) == 409 and drift.get("conflict") == "canonical_form_drift",
                       f"a {when} claiming a fingerprint that is not the frame's was answered {summary(drift)}, not "
                       "409 canonical_form_drift")
        sender.send(honest)
        again = sender.ack(key, count + 1)
        acks.append(again)
        if when == "first send":
            verdict.expect("BRK-RECOMPUTE-DRIFT", status(again) == 201,
                           f"after a drift refusal the honest send was answered {summary(again)}, not 201: the refusal "
                           "left a dedupe row")
            continue
        verdict.expect("BRK-RECOMPUTE-DRIFT", status(again) == 200 and again.get("broker_message_id")
                       == original.get("broker_message_id"),
                       f"after a drift refusal of a retry the honest retry was answered {summary(again)}, not a "
                       f"duplicate of {original.get('broker_message_id')}: the refusal changed the dedupe row")
        if broker_target.store_dsn:
            row = dedupe_row(broker_target.store_dsn, broker_target.mesh_id, key)
            verdict.expect("BRK-RECOMPUTE", row is not None and row["request_fingerprint"] == fingerprint_of(honest),
                           f"the stored fingerprint is {row and row['request_fingerprint']}, not the broker's own "
                           "recomputation of the accepted send")
    record_shape(verdict, acks)


def _reuse_is_free(sender, key: str, count: int) -> tuple[bool, str]:
    """After a refusal, the same id as a valid send is accepted 201: no dedupe row was left."""
    sender.send(send_frame(key, TOPIC, f"valid reuse of {key}"))
    reuse = sender.ack(key, count)
    return status(reuse) == 201, summary(reuse)


@case("broker.accept.b1", "BRK-B1-NO-WRITE", "BRK-PAYLOAD-LIMIT", "WS-ACK-STATUS")
def test_b1_rejections_leave_no_dedupe_row(broker_target, member, verdict):
    """B1: a schema failure with a usable id is refused 400, and a body one byte over the advertised inline_bytes is
    refused 413 — counted in UTF-8 bytes, with ASCII and with two-byte characters; no refusal leaves a dedupe row
    (the same id is then accepted 201; with --store-dsn the store has no row in between). A body of exactly
    inline_bytes bytes, of either kind, is accepted 201 (and its retry is its duplicate)."""
    sender = join(member, verdict, ("BRK-B1-NO-WRITE", "BRK-PAYLOAD-LIMIT", "WS-ACK-STATUS"))
    limit = inline_limit(sender)
    acks = []

    def refused_then_free(frame: dict, what: str, requirement: str, expected: tuple[int, str] | None) -> None:
        key = frame["client_message_id"]
        sender.send(frame)
        refused = sender.ack(key, 1)
        acks.append(refused)
        if expected is None:
            verdict.expect(requirement, status(refused) is not None and 400 <= status(refused) < 500
                           and status(refused) != 409, f"{what} was answered {summary(refused)}, not a B1 4xx")
        else:
            verdict.expect(requirement, refused is not None and (status(refused), refused.get("error")) == expected,
                           f"{what} was answered {summary(refused)}, not {expected[0]} {expected[1]}")
        if status(refused) in (200, 201):
            return  # accepted: nothing to learn about what a refusal leaves
        if broker_target.store_dsn:
            row = dedupe_row(broker_target.store_dsn, broker_target.mesh_id, key)
            verdict.expect("BRK-B1-NO-WRITE", row is None, f"refusing {what} left a dedupe row {row}")
        free, seen = _reuse_is_free(sender, key, 2)
        verdict.expect("BRK-B1-NO-WRITE", free, f"after refusing {what} the broker answered the same id, now valid, "
                                                f"{seen}, not 201: the refusal left a dedupe row")

    invalid = {**send_frame(cmid("b1-schema"), TOPIC, "bad priority"), "priority": "urgent"}
    refused_then_free(invalid, "a schema-invalid send with a usable id", "BRK-B1-NO-WRITE", None)
    if limit is None:
        record_shape(verdict, acks)
        verdict.blocked(["BRK-PAYLOAD-LIMIT"], "the broker advertises no max_payload.inline_bytes")
    half = limit // 2
    bodies = {  # name: (a body of limit + 1 UTF-8 bytes, a body of exactly limit bytes)
        "ASCII": ("x" * (limit + 1), "y" * limit),
        "two-byte characters": ("é" * half + "a" * (limit - 2 * half) + "b", "é" * half + "a" * (limit - 2 * half)),
    }
    for what, (over, exact) in bodies.items():
        refused_then_free(send_frame(cmid("b1-size"), TOPIC, over),
                          f"a body of {limit + 1} UTF-8 bytes ({what}, {len(over)} characters) over inline_bytes "
                          f"{limit}", "BRK-PAYLOAD-LIMIT", (413, "payload_too_large"))
        key = cmid("b1-exact")
        sender.send(send_frame(key, TOPIC, exact))
        fits = sender.ack(key, 1)
        acks.append(fits)
        verdict.expect("BRK-PAYLOAD-LIMIT", status(fits) == 201,
                       f"a body of exactly inline_bytes = {limit} UTF-8 bytes ({what}, {len(exact)} characters) was "
                       f"answered {summary(fits)}, not 201")
        if status(fits) == 201:
            sender.send(send_frame(key, TOPIC, exact))
            duplicate = sender.ack(key, 2)
            verdict.expect("BRK-PAYLOAD-LIMIT", status(duplicate) == 200,
                           f"its retry was answered {summary(duplicate)}, not 200")
    record_shape(verdict, acks)


@case("broker.accept.b2", "BRK-B2-ROLLBACK", "WS-ACK-STATUS")
def test_b2_rejections_roll_back(broker_target, member, verdict):
    """B2, per destination kind: a DM to a key no member has, a queue nobody created and a topic nobody created are
    refused 404 destination_not_found, and the id is then free. A broker that creates topics (or queues) on first use,
    as a development broker does, delivers the message to their subscribers: the kind is then not checkable; a 201
    that reaches no member is a failure."""
    sender = join(member, verdict, ("BRK-B2-ROLLBACK", "WS-ACK-STATUS"), "b2-sender")
    witness = join(member, verdict, ("BRK-B2-ROLLBACK", "WS-ACK-STATUS"), "b2-witness")
    acks = []
    checkable = 0
    for kind, to in (("dm", stranger()), ("queue", f"queue:{fresh_name()}"), ("topic", f"#{fresh_name()}")):
        key = cmid(f"b2-{kind}")
        sender.send(send_frame(key, to, f"to an unknown {kind}"))
        refused = sender.ack(key, 1)
        acks.append(refused)
        if status(refused) == 201 and kind != "dm":
            reached = witness.poll(lambda key=key: witness.pushes(key), 5.0) or sender.pushes(key)
            if reached:
                continue  # created on first use, with subscribers: nothing unknown to refuse
            verdict.expect("BRK-B2-ROLLBACK", False, f"a send to a {kind} nobody created ({to}) was accepted "
                                                     "201 and delivered to no member: it did not exist (B2 404)")
            continue
        checkable += 1
        if not verdict.expect("BRK-B2-ROLLBACK", status(refused) is not None and 400 <= status(refused) < 500
                              and status(refused) != 409, f"a send to an unknown {kind} ({to[:24]}) was answered "
                                                          f"{summary(refused)}, not a B2 4xx"):
            continue
        verdict.expect("WS-ACK-STATUS", (refused.get("status"), refused.get("error")) == (404, "destination_not_found"),
                       f"a B2 refusal ({kind}) was {summary(refused)}, not 404 destination_not_found")
        if broker_target.store_dsn:
            row = dedupe_row(broker_target.store_dsn, broker_target.mesh_id, key)
            verdict.expect("BRK-B2-ROLLBACK", row is None, f"the B2 refusal ({kind}) left a dedupe row {row}")
        free, seen = _reuse_is_free(sender, key, 2)
        verdict.expect("BRK-B2-ROLLBACK", free, f"after a B2 refusal ({kind}) the same id was answered {seen}, not "
                                                "201: the refusal left a dedupe row")
    record_shape(verdict, acks)
    if not checkable:
        verdict.blocked(["BRK-B2-ROLLBACK"], "no destination kind could be named unknown")


#: ids raced in broker.accept.concurrent
RACE_ROUNDS = 12


@case("broker.accept.concurrent", "BRK-CONCURRENT-ONE-MESSAGE", "BRK-DUP-MATCH", "BRK-DUP-MISMATCH",
      "BRK-DUP-MISMATCH-PREFIX", "BRK-ATOMIC")
def test_concurrent_same_key(broker_target, member, verdict):
    """RACE_ROUNDS ids, each raced by 16 connections (half the same body, half each a different one): one 201 per id
    and one broker_message_id (BRK-CONCURRENT-ONE-MESSAGE); every racer with the winner's fingerprint a 200
    duplicate of it (BRK-DUP-MATCH), every other a 409 request_fingerprint_mismatch with a prefix (BRK-DUP-MISMATCH)
    of its own fingerprint (BRK-DUP-MISMATCH-PREFIX, E-31); with --store-dsn, exactly one message row per id
    (BRK-ATOMIC). Whether racers meet inside the broker (one transaction, one lock wait) is up to its timing, not the
    harness's: the frames are serialised before the barrier, and there are enough rounds that a mistake only the
    meeting shows is met in at least one of them on a loaded machine. A racer gets "no ack" only when the broker
    stopped answering the round's racers for ANSWER_S (``first_acks``): one that answers them one after another is
    not cut off by one racer's wait."""
    declared = ("BRK-CONCURRENT-ONE-MESSAGE", "BRK-DUP-MATCH", "BRK-DUP-MISMATCH", "BRK-DUP-MISMATCH-PREFIX",
                "BRK-ATOMIC")
    racers = [join(member, verdict, declared, f"racer-{n}") for n in range(16)]
    keys = [cmid(f"race{round_}") for round_ in range(RACE_ROUNDS)]
    for round_, key in enumerate(keys):
        frames = [send_frame(key, TOPIC, "equal" if n % 2 == 0 else f"different {n}") for n in range(16)]
        texts = [json.dumps(frame) for frame in frames]
        barrier = threading.Barrier(16)

        def race(n: int, texts=texts, barrier=barrier) -> None:
            barrier.wait(timeout=ANSWER_S)
            racers[n].send(texts[n])

        threads = [threading.Thread(target=race, args=(n,)) for n in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(ANSWER_S)
        acks = first_acks([(racer, key) for racer in racers])
        created = [n for n, ack in enumerate(acks) if status(ack) == 201]
        named = {(ack or {}).get("broker_message_id") for ack in acks if status(ack) in (200, 201)}
        which = f"id {round_ + 1} of {RACE_ROUNDS}"
        if not verdict.expect("BRK-CONCURRENT-ONE-MESSAGE", len(created) == 1 and len(named) == 1,
                              f"{which}: {len(created)} racers got 201 and the accepted ones name "
                              f"{len(named)} broker_message_ids (statuses {[status(a) for a in acks]})"):
            continue
        winner = fingerprint_of(frames[created[0]])
        same, other, prefix = [], [], []
        for n, ack in enumerate(acks):
            if n == created[0]:
                continue
            own = fingerprint_of(frames[n])[:16]
            if fingerprint_of(frames[n]) == winner:
                if status(ack) != 200:
                    same.append(f"racer {n}: {summary(ack)}")
            elif (status(ack) != 409 or ack.get("conflict") != "request_fingerprint_mismatch"
                  or not PREFIX_SHAPE.is_valid(ack.get("broker_fingerprint_prefix"))):
                other.append(f"racer {n}: {summary(ack)}")
            elif ack["broker_fingerprint_prefix"] != own:  # the shape is the spec's, whose fingerprint is E-31's
                prefix.append(f"racer {n}: {summary(ack)} (its own prefix {own})")
        verdict.expect("BRK-DUP-MATCH", not same, f"{which}: racers with the winner's body were not "
                                                  f"answered 200: {'; '.join(same[:4])}")
        verdict.expect("BRK-DUP-MISMATCH", not other, f"{which}: racers with another body were not answered 409 "
                                                      f"request_fingerprint_mismatch with a prefix of 8 bytes hex: "
                                                      f"{'; '.join(other[:4])}")
        verdict.expect("BRK-DUP-MISMATCH-PREFIX", not prefix, f"{which}: a 409 named another fingerprint's "
                                                              f"prefix: {'; '.join(prefix[:4])}")
        if broker_target.store_dsn:
            count = message_count(broker_target.store_dsn, broker_target.mesh_id, key)
            verdict.expect("BRK-ATOMIC", count == 1, f"{which} has {count} message rows, not 1")
    # A broker that subscribes every member to the topic pushes each message to each racer: let those pushes land
    # before the racers leave, so each is acknowledged at close (Member.ack_on_close), as a daemon would.
    deadline = time.monotonic() + 3.0
    for racer in racers:
        racer.poll(lambda racer=racer: all(racer.pushes(k) for k in keys), max(0.0, deadline - time.monotonic()))
    if not broker_target.store_dsn:
        verdict.skip("BRK-ATOMIC", "the message rows are counted in the store: give --store-dsn")
