"""Inbound messages (§5): dedupe, durable before the ack, schema checks on inbound frames, the inbox listing and its
cursor (E-12), the event stream (§3, E-13): payloads, persisted ids, Last-Event-ID replay, keepalive, the stream cap.

Inbound cases wait for the daemon's own evidence: its ``client_ack`` when it sends one (E-13), else the message in
its inbox. Event cases open the stream before they push, so a daemon without replay is judged on its live stream.
"""

from __future__ import annotations

import contextlib
import time
from datetime import datetime, timedelta

import httpx

from conformance.cases._support import EventStream, inbox_items, payload, unique, wait_inbound
from conformance.registry import case
from conformance.wire import json_object
from spec import validator

SENDER = "ab" * 32
OTHER_SENDER = "ef" * 32


def _in_inbox(api, cmid: str) -> list[dict]:
    return [i for i in inbox_items(api)[0] if i.get("client_message_id") == cmid]


@case("inbound.dedupe_and_ack", "INB-DEDUPE", "INB-DEDUPE-EVENT", "INB-DURABLE-BEFORE-ACK", "INB-CLIENT-ACK")
def test_dedupe_and_ack(api, broker, mesh_target, verdict):
    """A message delivered twice (the same broker message again, under a new delivery_id, its body altered so the
    harness can tell which one was kept): one inbox row with the first body, one message event; each delivery
    acknowledged after the row is durable."""
    cmid = unique("in")
    seen: dict[str, bool] = {}

    def on_receive(frame):
        if frame.get("type") == "client_ack" and frame.get("clientMessageId") == cmid:
            with contextlib.suppress(httpx.HTTPError, AssertionError):
                seen[str(frame.get("delivery_id"))] = bool(_in_inbox(api, cmid))

    stream = EventStream(mesh_target)
    broker.on_receive = on_receive
    try:
        stream.opened()
        first = broker.push(body="hello", client_message_id=cmid, sender=SENDER)
        how = wait_inbound(api, broker, cmid)
        second = broker.push(body="hello again", client_message_id=cmid, sender=SENDER, attempt=2,
                             broker_message_id=first["messageId"])
        if how == "client_ack":
            with contextlib.suppress(TimeoutError):
                broker.wait_for(lambda: len(broker.client_acks(cmid)) >= 2, 10, "the second client_ack")
        else:
            time.sleep(2.0)
        with contextlib.suppress(AssertionError):
            stream.wait(lambda evs: any(payload(e).get("client_message_id") == cmid for e in evs), 5, "the event")
        time.sleep(0.5)
    finally:
        broker.on_receive = None
        stream.close()
    rows = _in_inbox(api, cmid)
    with verdict.check("INB-DEDUPE"):
        assert len(rows) == 1, f"{len(rows)} inbox rows for one client_message_id"
        assert rows[0].get("body") == "hello", f"the row's body is {rows[0].get('body')!r}, not the first delivery's"
        assert rows[0].get("broker_message_id") == first["messageId"], rows[0]
    events = [e for e in stream.events if e.get("event") == "message" and payload(e).get("client_message_id") == cmid]
    verdict.expect("INB-DEDUPE-EVENT", len(events) == 1,
                   f"{len(events)} message events for one message delivered twice")
    acks = broker.client_acks(cmid)
    with verdict.check("INB-CLIENT-ACK"):
        delivered = {first["delivery_id"], second["delivery_id"]}
        assert acks, "the daemon sent no client_ack for the delivery"
        acked = {a["delivery_id"] for a in acks}
        assert acked >= delivered, f"client_acks name delivery ids {sorted(map(str, acked))}, the deliveries were " \
                                   f"{sorted(delivered)} (the redelivered duplicate needs its ack too)"
        assert all(a["broker_message_id"] == first["messageId"] for a in acks), [a["frame"] for a in acks]
    if not acks:
        verdict.skip("INB-DURABLE-BEFORE-ACK", "the daemon sends no client_ack, so there is no ack to order")
    else:
        verdict.expect("INB-DURABLE-BEFORE-ACK", seen and all(seen.values()),
                       f"at a client_ack the row was not yet in the inbox: {seen}")


POISON = [  # (label, frame or raw text): inbound frames no schema admits
    ("sender_not_hex", {"senderPubkey": "zz"}),
    ("message_id_missing", {"messageId": None}),
    ("client_message_id_number", {"client_message_id": 42}),
    ("attempt_string", {"attempt": "1"}),
    ("body_object", {"body": {"a": 1}, "ciphertext": {"a": 1}}),
    ("created_not_a_time", {"createdAt": 17}),
    ("unknown_member", {"sneaky": True}),  # v3 §16.1: "Daemon refuses unknown fields"
]


@case("inbound.invalid_frames", "INB-SCHEMA")
def test_invalid_pushes_are_dropped(api, broker, verdict):
    """Pushes no schema admits are dropped (not stored in the inbox); the link stays up and the next valid push is
    stored. (Whether a dropped push is acknowledged so the broker stops redelivering it is E-41's, checked in
    inbound.poison.)"""
    for label, change in POISON:
        cmid = unique(f"evil-{label}")
        frame = broker.push_frame(body="x", client_message_id=cmid, sender=SENDER)
        for key, value in change.items():
            if value is None:
                frame.pop(key, None)
            else:
                frame[key] = value
        bad_id = frame.get("client_message_id")
        broker.send_raw(frame)
        good = unique("good")
        broker.push(body="fine", client_message_id=good, sender=SENDER)
        with verdict.check("INB-SCHEMA"):
            wait_inbound(api, broker, good)
            stored = [i for i in inbox_items(api)[0] if i.get("client_message_id") == bad_id]
            assert not stored or not isinstance(bad_id, str), f"the {label} push was stored: {stored[:1]}"


@case("inbound.cursor_paging", "INBOX-CURSOR", "INBOX-FILTERS", "INBOX-FILTERS-EXACT")
def test_cursor_paging_and_filters(api, broker, verdict):
    """16 messages read 7 at a time: ascending, no gap, no repeat, a resumable cursor; from/topic/since filter
    exactly; a foreign cursor is a 400."""
    topic = "paging"
    pushed = [unique("page") for _ in range(16)]
    for n, cmid in enumerate(pushed):
        broker.push(body=f"p{n}", client_message_id=cmid, sender=OTHER_SENDER if n % 2 else SENDER,
                    topic=topic if n % 4 == 0 else None)
        time.sleep(0.01)
    for cmid in pushed:
        wait_inbound(api, broker, cmid)
    items, resume = inbox_items(api, limit=7)
    ids = [i.get("client_message_id") for i in items]
    with verdict.check("INBOX-CURSOR"):
        assert len(ids) == len(set(ids)), "a page boundary repeated a row"
        order = [i for i in ids if i in pushed]
        assert order == pushed, f"rows out of order or missing: {order}"
        assert resume, "no next_cursor to resume from"
        later = unique("later")
        broker.push(body="later", client_message_id=later, sender=SENDER)
        wait_inbound(api, broker, later)
        page = json_object(api.get("/v1/inbox", params={"cursor": resume}))
        assert [i.get("client_message_id") for i in page.get("items") or []] == [later], page
        bad = api.get("/v1/inbox", params={"cursor": "!!not-ours!!"})
        assert bad.status_code == 400, f"a foreign cursor answered {bad.status_code}"
    with verdict.check("INBOX-FILTERS"):
        by_sender = {i.get("client_message_id") for i in inbox_items(api, **{"from": OTHER_SENDER})[0]}
        assert by_sender & set(pushed) == {c for n, c in enumerate(pushed) if n % 2}, "from= kept the wrong rows"
        by_topic = {i.get("client_message_id") for i in inbox_items(api, topic=topic)[0]}
        assert by_topic & set(pushed) == {c for n, c in enumerate(pushed) if n % 4 == 0}, "topic= kept the wrong rows"
    with verdict.check("INBOX-FILTERS-EXACT"):
        rows = {i.get("client_message_id"): i for i in inbox_items(api)[0]}
        pivot = (rows.get(pushed[8]) or {}).get("received_at")
        assert isinstance(pivot, str), f"no received_at on the inbox item: {rows.get(pushed[8])}"
        at = {i.get("client_message_id") for i in inbox_items(api, since=pivot)[0]}
        assert pushed[8] in at and pushed[7] not in at and pushed[15] in at, \
            f"since={pivot} (a row's own received_at) must keep that row and later ones, not earlier ones"
        moment = datetime.fromisoformat(pivot.replace("Z", "+00:00")) + timedelta(milliseconds=1)
        after = {i.get("client_message_id") for i in inbox_items(api, since=moment.isoformat())[0]}
        assert pushed[8] not in after and pushed[9] in after, f"since one millisecond after {pivot} kept the row"


@case("events.replay", "SSE-IDS-MONOTONIC", "SSE-REPLAY", "SSE-PAYLOADS")
def test_sse_replay(api, broker, mesh_target, verdict):
    """Three messages: their events carry strictly increasing persisted ids and schema-valid payloads; a stream
    opened with Last-Event-ID of the first replays exactly the ones after it, in order."""
    marks = [unique("sse") for _ in range(3)]
    with EventStream(mesh_target) as live:
        live.opened()
        for cmid in marks:
            broker.push(body=cmid, client_message_id=cmid, sender=SENDER)
        events = live.wait(lambda evs: {payload(e).get("client_message_id") for e in evs} >= set(marks), 15,
                           "the three message events")
    mine = [e for e in events if e.get("event") == "message" and payload(e).get("client_message_id") in marks]
    with verdict.check("SSE-IDS-MONOTONIC", fatal=True):
        ids = [e.get("id") for e in events]
        assert all(isinstance(i, str) and i.isdigit() for i in ids), f"event ids {ids[:5]} are not decimal"
        numbers = [int(i) for i in ids]
        assert numbers == sorted(numbers) and len(numbers) == len(set(numbers)), f"ids not increasing: {numbers}"
    with verdict.check("SSE-PAYLOADS"):
        for event in events:
            name = event.get("event")
            assert isinstance(event.get("json"), dict), f"{name} data is not a JSON object"
            errors = list(validator(f"sse/{name}").iter_errors(event["json"])) if _known(name) else ["unknown"]
            assert not errors, f"{name}: {getattr(errors[0], 'message', errors[0])}"
    first = mine[0]
    with EventStream(mesh_target, {"Last-Event-ID": first["id"]}) as replay:
        replayed = replay.wait(lambda evs: any(payload(e).get("client_message_id") == marks[2] for e in evs), 10,
                               "the replayed events")
    names = [payload(e).get("client_message_id") for e in replayed if e.get("event") == "message"]
    verdict.expect("SSE-REPLAY", marks[0] not in names and [n for n in names if n in marks] == marks[1:],
                   f"Last-Event-ID {first['id']} replayed {names}")
    verdict.expect("SSE-REPLAY", all(int(e["id"]) > int(first["id"]) for e in replayed if e.get("id")),
                   "the replay includes events at or before Last-Event-ID")


def _known(name: str | None) -> bool:
    from spec import SPEC_DIR

    return bool(name) and (SPEC_DIR / "schemas" / "sse" / f"{name}.json").exists()


@case("events.keepalive", "SSE-KEEPALIVE")
def test_keepalive(mesh_target, verdict, timing):
    """An idle stream gets a keepalive comment every 15 s (or the interval the harness configured)."""
    period = timing.keepalive_s
    with EventStream(mesh_target, {"Last-Event-ID": "999999999999"}) as stream:
        verdict.require("SSE-KEEPALIVE", stream.opened() == 200, f"GET /v1/events answered {stream.status}")
        start = time.monotonic()
        while time.monotonic() - start < 2 * period + 3 and len([1 for at, _ in stream.comments if at > start]) < 2:
            time.sleep(0.1)
        seen = [at - start for at, _ in stream.comments if at > start]
    verdict.expect("SSE-KEEPALIVE", len(seen) >= 2 and seen[1] - seen[0] <= period * 1.25 + 0.5,
                   f"comment lines at {[round(t, 1) for t in seen]} s on an idle stream, one every {period:g} s "
                   f"expected")


@case("events.stream_limit", "SSE-STREAM-LIMIT")
def test_stream_limit(mesh_target, verdict):
    """32 open streams: the 33rd is refused 429; when one of them goes away its slot is free again at once."""
    streams = [EventStream(mesh_target, {"Last-Event-ID": "999999999999"})
               for _ in range(32)]
    try:
        statuses = [s.opened(10) for s in streams]
        verdict.require("SSE-STREAM-LIMIT", all(s == 200 for s in statuses),
                        f"of 32 streams, {sum(s == 200 for s in statuses)} opened ({sorted(set(map(str, statuses)))})")
        with EventStream(mesh_target) as extra:
            status = extra.opened(10)
        verdict.expect("SSE-STREAM-LIMIT", status == 429, f"the 33rd stream answered {status}, not 429")
        streams.pop().close()
        deadline = time.monotonic() + 5
        status = None
        while time.monotonic() < deadline:
            with EventStream(mesh_target) as again:
                status = again.opened(10)
            if status == 200:
                break
            time.sleep(0.25)
        verdict.expect("SSE-STREAM-LIMIT", status == 200, f"5 s after a stream went away a new one still gets {status}")
    finally:
        for stream in streams:
            stream.close()
