"""The outbox lifecycle driven by broker outcomes (§4.5b, §4.6), retries and backoff (E-14), late acks (E-17),
terminal states, max age through the clock hook (§4.9, E-14), and the requeue audit trail (§4.5.3, E-09).

Every timing the cases wait for comes from the target's declared timing (conformance/timing.py), never a constant.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conformance.cases._support import (
    BODY,
    TERMINAL,
    EventStream,
    expect_exit,
    payload,
    post_send,
    release_rows,
    row_for,
    unique,
    wait_row,
    watch_row,
)
from conformance.peer import (
    ACCEPT_SILENTLY,
    CREATED,
    DROP,
    SILENT,
    PeerConfig,
    ScriptedBroker,
    conflict,
    duplicate,
    fail,
    reject,
)
from conformance.plugin import next_scenario
from conformance.registry import case
from conformance.target import HARNESS_CONFIG
from conformance.timing import EARLY_MS, LATE_MS
from conformance.verdict import TARGET_FAILURES, describe
from conformance.wire import json_object, send_seen
from reference.core import derive

ULID = re.compile(r"^[0-7][0-9A-HJKMNP-TV-Z]{25}$")


def send(api, cmid, body=BODY):
    response = post_send(api, body, cmid)
    assert response.status_code == 202, f"the send answered {response.status_code}: {response.text[:200]}"
    return json_object(response)


def request_of(frame: dict) -> tuple:
    """What must not change between two sends of one row: its id, its fingerprint and the request it carries."""
    seen = send_seen(frame)
    carried = tuple(repr(frame.get(k)) for k in ("destination_kind", "destination_ref", "priority", "reply_to_id",
                                                 "meta", "body", "targetSpec"))
    return seen.cmid, seen.claimed, carried, seen.body


OUTCOMES = [  # name, scripted answers, the state the row must settle in
    ("created", [], "done"),
    ("duplicate_history", [duplicate(True)], "done"),
    ("duplicate_pruned", [duplicate(False)], "done"),
    ("conflict", [conflict()], "dead"),
    ("drift", [conflict("canonical_form_drift")], "dead"),
    ("reject_403", [reject(403, "forbidden")], "dead"),
    ("reject_404", [reject(404, "destination_not_found")], "dead"),
    ("reject_413", [reject(413, "payload_too_large")], "dead"),
    ("reject_422", [reject(422, "invalid_destination")], "dead"),
    ("fail_500_then_created", [fail(500)], "done"),
    ("fail_503_twice_then_created", [fail(503), fail(503)], "done"),
]


@case("outbox.broker_outcome", "OBX-BROKER-OUTCOMES", "OBX-DISPATCH")
@pytest.mark.parametrize(("name", "answers", "final"), OUTCOMES, ids=[o[0] for o in OUTCOMES])
def test_broker_outcome(api, broker, verdict, timing, name, answers, final):
    """201 / 200 → done with the broker_message_id; 409 / other 4xx → dead, never retried; 5xx → retried, then done."""
    cmid = unique(name)
    broker.answer(cmid, *answers)
    send(api, cmid)
    failures = sum(1 for a in answers if a.kind == "fail")
    with verdict.check("OBX-BROKER-OUTCOMES", fatal=True):
        row = wait_row(api, cmid, final, timeout=timing.settle_s(failures + 1))
    sends = broker.sends_of(cmid)
    with verdict.check("OBX-BROKER-OUTCOMES"):
        if final == "done":
            acked = [a for a in broker.sent("ack") if a.get("client_message_id") == cmid and a.get("status") in
                     (200, 201)]
            assert acked and row.get("broker_message_id") == acked[-1]["broker_message_id"], \
                f"the done row names broker_message_id {row.get('broker_message_id')!r}, the broker acked " \
                f"{acked[-1]['broker_message_id'] if acked else None!r}"
            assert len(sends) == failures + 1, f"{len(sends)} sends for {failures} transient failure(s)"
        else:
            assert row.get("last_error"), f"a dead row records why: {row}"
            assert len(sends) == 1, f"a permanent refusal was retried: {len(sends)} sends"
    verdict.expect("OBX-DISPATCH", row.get("attempts") == len(sends),
                   f"attempts = {row.get('attempts')} after {len(sends)} send(s)")


@case("outbox.transient_failures", "OBX-BROKER-OUTCOMES", "WS-SEND-SAME-BYTES", "WS-ACK-STATUS", "FP-FROZEN")
@pytest.mark.parametrize("transient", ["ack_timeout", "link_lost", "status_less_ack"])
def test_transient_failures_are_retried_with_the_same_bytes(api, broker, verdict, timing, transient):
    """An ack timeout, a lost link, an ack without a status (E-10): the row goes back to pending and is retried
    with exactly the same request."""
    cmid = unique(transient)
    broker.answer(cmid, {"ack_timeout": SILENT, "link_lost": DROP, "status_less_ack": SILENT}[transient])
    send(api, cmid)
    if transient == "status_less_ack":
        broker.wait_for(lambda: broker.sends_of(cmid), timing.settle_s(), f"the send of {cmid}")
        broker.send_raw({"type": "ack", "id": cmid, "client_message_id": cmid, "messageId": "", "queued": True})
    requirement = "WS-ACK-STATUS" if transient == "status_less_ack" else "OBX-BROKER-OUTCOMES"
    with verdict.check(requirement, fatal=True):
        wait_row(api, cmid, "done", timeout=timing.settle_s(2) + timing.reconnect_wait_s)
    sends = broker.sends_of(cmid)
    verdict.expect(requirement, len(sends) >= 2, f"the row reached done after {len(sends)} send(s): the "
                                                 f"{transient} was not treated as transient")
    if len(sends) >= 2:
        requests = {request_of(r.frame) for r in sends}
        verdict.expect("WS-SEND-SAME-BYTES", len(requests) == 1, f"the retries differ: {sorted(requests)[:3]}")
        prints = {send_seen(r.frame).claimed for r in sends}
        verdict.expect("FP-FROZEN", len(prints) == 1, f"the row was sent with {len(prints)} fingerprints: {prints}")


def _backoff_failures(timing) -> int:
    """Enough failures to see the schedule grow and reach its cap, within about 30 s of retries."""
    count, total = 0, 0.0
    while count < 7 and (count < 4 or total < 30_000):
        count += 1
        total += timing.retry_delay_ms(count)
        if timing.retry_delay_ms(count) >= timing.retry_max_ms and count >= 4:
            count += 1  # one more at the cap, to see it hold
            break
    return count


BACKOFF_CONFIG = {"retry_base_ms": 300, "retry_max_ms": 2400}


@case("outbox.backoff", "OBX-BACKOFF")
def test_backoff_follows_the_schedule(mesh_target, broker, verdict, timing):
    """N transient answers: the gap after the n-th failure lies within the declared schedule's bounds
    (min(max, base·m^(n-1)) ± jitter, plus scheduler granularity) — it grows, it is capped, it does not stop — and,
    over the gaps below the cap, the measured total is the nominal total within the jitter: a schedule off by a
    constant factor cannot hide in one gap's slack. A target that reads config.toml is given a 300 ms base for it
    (the harness's usual 100 ms base leaves the machine's slack larger than a gap)."""
    if mesh_target.reads_config and mesh_target.can_restart:
        config = HARNESS_CONFIG.replace("retry_base_ms = 100", f"retry_base_ms = {BACKOFF_CONFIG['retry_base_ms']}")
        config = config.replace("retry_max_ms = 500", f"retry_max_ms = {BACKOFF_CONFIG['retry_max_ms']}")
        schedule = timing.with_values(BACKOFF_CONFIG, timing.source + " (this case's config.toml)")
        with ScriptedBroker(PeerConfig(dialect=mesh_target.dialect)) as peer:
            try:
                instance = mesh_target.launch("backoff", config=config, broker=peer)
                peer.wait_linked(timing.reconnect_wait_s)
                with instance.unix() as client:
                    _backoff(client, peer, verdict, schedule)
            finally:
                mesh_target.release_fresh()
        return
    with mesh_target.client(mesh_target.transports[0]) as client:
        _backoff(client, broker, verdict, timing)


def _backoff(client, peer, verdict, schedule) -> None:
    failures = _backoff_failures(schedule)
    cmid = unique("backoff")
    peer.answer(cmid, *[fail()] * failures)
    send(client, cmid)
    with verdict.check("OBX-BACKOFF", fatal=True):
        wait_row(client, cmid, "done", timeout=schedule.settle_s(failures) + 10)
    times = [r.at for r in peer.sends_of(cmid)]
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(times)]
    verdict.expect("OBX-BACKOFF", len(gaps) == failures, f"{len(times)} sends for {failures} failures")
    shown = [round(g) for g in gaps]
    for n, gap in enumerate(gaps, start=1):
        low, high = schedule.retry_gap_bounds(n)
        verdict.expect("OBX-BACKOFF", low <= gap <= high,
                       f"gap {n} was {gap:.0f} ms, outside [{low:.0f}, {high:.0f}] ms for the declared schedule "
                       f"({schedule.source}); all gaps: {shown}")
    growing = [n for n in range(1, len(gaps) + 1) if schedule.retry_delay_ms(n) < schedule.retry_max_ms]
    if growing:
        nominal = sum(schedule.retry_delay_ms(n) for n in growing)
        measured = sum(gaps[n - 1] for n in growing)
        low = nominal * (1 - schedule.retry_jitter) - EARLY_MS * len(growing)
        high = nominal * (1 + schedule.retry_jitter) + (schedule.poll_ms + LATE_MS) * len(growing)
        verdict.expect("OBX-BACKOFF", low <= measured <= high,
                       f"the gaps below the cap total {measured:.0f} ms, the schedule's {nominal:.0f} ms allows "
                       f"[{low:.0f}, {high:.0f}]; all gaps: {shown}")


@case("outbox.dead_event", "OBX-DEAD-EVENT")
def test_dead_rows_are_announced(api, broker, mesh_target, verdict, timing):
    cmid = unique("dead-event")
    broker.answer(cmid, reject(404, "destination_not_found"))

    def announced(events):
        return [e for e in events if e.get("event") == "outbox_dead" and payload(e).get("client_message_id") == cmid]

    with EventStream(mesh_target) as stream:
        stream.opened()
        send(api, cmid)
        wait_row(api, cmid, "dead", timeout=timing.settle_s())
        with verdict.check("OBX-DEAD-EVENT"):
            stream.wait(announced, 5, f"an outbox_dead event for {cmid}")


@case("outbox.requeue", "REQUEUE-ATOMIC", "REQUEUE-STATES", "REQUEUE-STATES-REFUSED", "REQUEUE-FRESH-ID",
      "REQUEUE-NEW-ID-IN-USE", "REQUEUE-SAME-FINGERPRINT", "REQUEUE-NEVER-FREES", "ID-CONSUMED-NEVER-FREED",
      "API-OUTBOX")
def test_requeue_audit_trail(api, broker, verdict, timing):
    cmid = unique("requeue")
    broker.answer(cmid, reject(404, "destination_not_found"))
    send(api, cmid)
    with verdict.check("REQUEUE-ATOMIC", fatal=True):
        dead = wait_row(api, cmid, "dead", timeout=timing.settle_s())
    fresh = unique("requeued")
    result = api.post("/v1/outbox/requeue", json={"id": dead.get("id"), "new_client_message_id": fresh})
    body = json_object(result)
    verdict.require("REQUEUE-STATES", result.status_code == 200,
                    f"requeue of a dead row answered {result.status_code}: {result.text[:200]}")
    with verdict.check("REQUEUE-ATOMIC"):
        old = row_for(api, cmid) or {}
        assert old.get("status") == "aborted", f"the old row is {old.get('status')!r}, not aborted"
        assert old.get("aborted_at") and old.get("aborted_by") == "operator", \
            f"aborted_at {old.get('aborted_at')!r}, aborted_by {old.get('aborted_by')!r}"
        assert old.get("superseded_by") == body.get("new_row_id"), \
            f"superseded_by {old.get('superseded_by')!r}, new_row_id {body.get('new_row_id')!r}"
        new = wait_row(api, fresh, "done", timeout=timing.settle_s())
        assert new.get("id") == body.get("new_row_id"), f"the successor row is {new.get('id')}"
    with verdict.check("API-OUTBOX"):
        assert body.get("aborted_row_id") == dead.get("id"), f"aborted_row_id {body.get('aborted_row_id')!r}"
        assert body.get("new_client_message_id") == fresh, f"new_client_message_id {body.get('new_client_message_id')}"
    verdict.expect("REQUEUE-FRESH-ID", row_for(api, fresh) is not None, "the caller's new id has no row")
    first, successor = broker.sends_of(cmid), broker.sends_of(fresh)
    if first and successor:
        verdict.expect("REQUEUE-SAME-FINGERPRINT",
                       send_seen(first[0].frame).claimed == send_seen(successor[0].frame).claimed,
                       "the successor was sent with another request_fingerprint than the requeued row")
    if "request_fingerprint" in dead:
        verdict.expect("REQUEUE-SAME-FINGERPRINT", (row_for(api, fresh) or {}).get("request_fingerprint")
                       == dead["request_fingerprint"], "the successor row's request_fingerprint differs")
    for label, row_id in (("an aborted", dead.get("id")), ("a done", body.get("new_row_id"))):
        again = api.post("/v1/outbox/requeue", json={"id": row_id})
        verdict.expect("REQUEUE-STATES-REFUSED", again.status_code == 409,
                       f"requeue of {label} row answered {again.status_code}: {again.text[:160]}")
    in_use = unique("in-use")
    broker.answer(in_use, reject(404, "destination_not_found"))
    send(api, in_use)
    victim = wait_row(api, in_use, "dead", timeout=timing.settle_s())
    taken = api.post("/v1/outbox/requeue", json={"id": victim.get("id"), "new_client_message_id": fresh})
    with verdict.check("REQUEUE-NEW-ID-IN-USE"):
        assert taken.status_code == 409, f"a requeue onto a consumed id answered {taken.status_code}"
        assert json_object(taken).get("conflict") == "requeue_new_id_in_use", taken.text[:200]
    after = row_for(api, in_use) or {}
    verdict.expect("REQUEUE-ATOMIC", after.get("status") == "dead" and not after.get("superseded_by"),
                   f"a refused requeue changed the row (not one transaction): status {after.get('status')}, "
                   f"superseded_by {after.get('superseded_by')!r}")
    spare = unique("requeue-auto")
    broker.answer(spare, reject(404, "destination_not_found"))
    send(api, spare)
    spare_row = wait_row(api, spare, "dead", timeout=timing.settle_s())
    auto = api.post("/v1/outbox/requeue", json={"id": spare_row.get("id")})
    minted = json_object(auto).get("new_client_message_id")
    verdict.expect("REQUEUE-FRESH-ID", auto.status_code == 200 and isinstance(minted, str) and ULID.match(minted),
                   f"a requeue without a new id answered {auto.status_code} minting {minted!r}, not a ULID")
    missing = api.post("/v1/outbox/requeue", json={"id": "01ARZ3NDEKTSV4RRFFQ69G5FAV"})
    verdict.expect("API-OUTBOX", missing.status_code == 404, f"requeue of an unknown row answered "
                                                            f"{missing.status_code}")
    reused = post_send(api, BODY, cmid)
    with verdict.check("REQUEUE-NEVER-FREES", "ID-CONSUMED-NEVER-FREED"):
        assert reused.status_code == 409, f"the retired id answered {reused.status_code}"
        assert str(json_object(reused).get("conflict", "")).startswith("outbox_aborted"), reused.text[:200]


@case("outbox.requeue_states", "REQUEUE-STATES", "REQUEUE-STATES-REFUSED")
def test_requeue_pending_and_inflight(api, broker, verdict, timing):
    """A pending row may be requeued (§4.6.1 D); an inflight one may not (E-09: it would race the broker)."""
    inflight = unique("requeue-inflight")
    broker.answer(inflight, *[SILENT] * 6)
    send(api, inflight)
    row = wait_row(api, inflight, "inflight", timeout=timing.settle_s())
    refused = api.post("/v1/outbox/requeue", json={"id": row.get("id")})
    release_rows(api, broker, inflight)
    verdict.expect("REQUEUE-STATES-REFUSED", refused.status_code == 409,
                   f"requeue of an inflight row answered {refused.status_code}: {refused.text[:160]}")
    pending = unique("requeue-pending")
    broker.answer(pending, *[fail()] * 8)
    send(api, pending)
    # The row waits only a retry gap in pending: a 409 counts only when the row was still pending, on the same
    # attempt, both before and after the requeue; one that had moved on meanwhile is tried again (at most 6 times).
    outcome: tuple[str, str] = ("skip", "")
    for _ in range(6):
        try:
            row = wait_row(api, pending, "pending", attempted=True, timeout=timing.settle_s(2))
        except AssertionError as exc:
            outcome = ("skip", f"no pending row to requeue: {exc}")
            break
        accepted = api.post("/v1/outbox/requeue", json={"id": row.get("id")})
        if accepted.status_code == 200:
            outcome = ("pass", "")
            break
        after = row_for(api, pending) or {}
        if (after.get("status"), after.get("attempts")) == ("pending", row.get("attempts")):
            outcome = ("fail", f"requeue of a pending row (attempt {row.get('attempts')}, still pending on that "
                               f"attempt afterwards) answered {accepted.status_code}: {accepted.text[:160]}")
            break
        outcome = ("skip", f"each requeue was answered {accepted.status_code} after the row had left pending "
                           f"({after.get('status')}, attempt {after.get('attempts')}): its retry gap is too short "
                           "to requeue it in")
    release_rows(api, broker, pending)
    if outcome[0] == "skip":
        verdict.skip("REQUEUE-STATES", outcome[1])
    else:
        verdict.expect("REQUEUE-STATES", outcome[0] == "pass", outcome[1])


LATE = [("created", CREATED, "done"), ("conflict", conflict(), "dead"), ("rejected", reject(404, "gone"), "dead"),
        ("failed", fail(503), "pending")]


@case("outbox.late_ack", "OBX-LATE-ACK")
def test_late_acks_after_timeout_are_applied(launcher, verdict):
    """Four rows the broker answers only after their ack timeout, while each waits for its retry: a late 201 →
    done, 409 → dead, other 4xx → dead, 5xx → no change (E-17). Later attempts are never answered, so only the late
    ack can settle a row. (One instance, slow retries where the target reads config.toml.)"""
    config = HARNESS_CONFIG.replace("retry_base_ms = 100", "retry_base_ms = 8000").replace(
        "retry_max_ms = 500", "retry_max_ms = 8000")
    timing = launcher.timing
    with ScriptedBroker(PeerConfig(dialect=launcher.dialect)) as peer:
        instance = launcher.launch("late-acks", config=config, broker=peer)
        peer.wait_linked(timing.reconnect_wait_s)
        rows = {name: unique(f"late-{name}") for name, _, _ in LATE}
        for cmid in rows.values():
            peer.answer(cmid, ACCEPT_SILENTLY, *[SILENT] * 20)
        with instance.unix() as client:
            for cmid in rows.values():
                assert post_send(client, BODY, cmid).status_code == 202
            for name, late, final in LATE:
                cmid = rows[name]
                try:
                    wait_row(client, cmid, "pending", attempted=True, timeout=timing.settle_s())
                except AssertionError as exc:
                    verdict.expect("OBX-LATE-ACK", False, f"{name}: the row never waited for a retry: {exc}")
                    continue
                peer.send_raw(peer.decide(send_seen(peer.sends_of(cmid)[0].frame), late))
                if final == "pending":
                    statuses = watch_row(client, cmid, 1.5)
                    verdict.expect("OBX-LATE-ACK", not set(statuses) & TERMINAL,
                                   f"a late 5xx settled the row: {statuses}")
                    continue
                with verdict.check("OBX-LATE-ACK"):
                    row = wait_row(client, cmid, final, timeout=4)
                    if final == "done":
                        assert row.get("broker_message_id") == peer.dedupe[cmid].broker_message_id
                    sends = len(peer.sends_of(cmid))
                    assert sends == 1, f"{name}: the row was sent {sends} times although the late ack settled it"


STRAY = [("done", [], [duplicate(True), conflict(), reject(404, "gone"), fail()]),
         ("dead", [reject(404, "destination_not_found")], [CREATED, duplicate(True), fail()])]


@case("outbox.terminal", "OBX-TERMINAL")
@pytest.mark.parametrize(("state", "answers", "strays"), STRAY, ids=[s[0] for s in STRAY])
def test_terminal_rows_never_change(api, broker, verdict, timing, state, answers, strays):
    """A done or dead row: stray and repeated acks of every kind arrive; the row never changes."""
    cmid = unique(f"terminal-{state}")
    broker.answer(cmid, *answers)
    send(api, cmid)
    with verdict.check("OBX-TERMINAL", fatal=True):
        settled = wait_row(api, cmid, state, timeout=timing.settle_s())
    frame = broker.sends_of(cmid)[0].frame
    for stray in strays:
        broker.send_raw(broker.decide(send_seen(frame), stray))
    time.sleep(1.0)
    after = row_for(api, cmid) or {}
    changed = {k: (settled.get(k), after.get(k)) for k in settled if settled.get(k) != after.get(k)}
    verdict.expect("OBX-TERMINAL", not changed, f"stray acks changed the {state} row: {changed}")
    verdict.expect("OBX-TERMINAL", len(broker.sends_of(cmid)) == 1, "the settled row was sent again")


# --- max age (the clock hook) ----------------------------------------------------------------------------------------


def _clocked(launcher, verdict, requirements: list[str]):
    if not launcher.clock_hook:
        verdict.blocked(requirements, "the target does not declare the clock hook (clock_hook in its target "
                                      "description), so its clock cannot be moved in a bounded run")


MAX_AGES = [("retention_scoped_3", "retention_scoped", 3), ("retention_scoped_7", "retention_scoped", 7),
            ("retention_scoped_30", "retention_scoped", 30), ("permanent", "permanent", None)]


@case("outbox.max_age", "OBX-MAX-AGE-DEAD", "MAXAGE-DERIVATION", "MAXAGE-INSIDE-WINDOW")
def test_max_age(launcher, verdict):
    """For each way a broker can set the dedupe window (retention_scoped 3, 7 and 30 days, permanent), a row retried
    through an outage: one hour before its derived max age (§4.9) it is still retried; one hour after, it is dead
    with last_error max_age_exceeded, and never sent again. (Each in its own instance, side by side unless the
    target's port is fixed.)"""
    _clocked(launcher, verdict, ["OBX-MAX-AGE-DEAD", "MAXAGE-DERIVATION", "MAXAGE-INSIDE-WINDOW"])
    if launcher.launched is not None and launcher.launched.fixed_port:
        # one instance at a time, in the case's own thread: each scenario gets the case timeout, and a timeout
        # stops the case here (a scenario left running in a pool would launch its instance after the case's
        # teardown restarted the main one, and stop that again)
        failure = None
        for scenario in MAX_AGES:
            next_scenario()
            try:
                _max_age(launcher, verdict, *scenario)
            except Exception as exc:  # the others still run, as they do side by side; the first failure is raised
                failure = failure or exc
        if failure is not None:
            raise failure
        return
    pool = ThreadPoolExecutor(len(MAX_AGES))
    try:
        for future in [pool.submit(_max_age, launcher, verdict, *scenario) for scenario in MAX_AGES]:
            future.result()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _max_age(launcher, verdict, name, mode, days) -> None:
    # At 3 days the §4.9 formula gives the whole window; E-05 keeps it strictly inside (71 h).
    derivation = "MAXAGE-INSIDE-WINDOW" if days == 3 else "MAXAGE-DERIVATION"
    requirements = ["OBX-MAX-AGE-DEAD", derivation]
    try:
        _max_age_scenario(launcher, verdict, name, mode, days, derivation, requirements)
    except TARGET_FAILURES as exc:
        for requirement in requirements:
            verdict.expect(requirement, False, f"{name}: {describe(exc)}")


def _max_age_scenario(launcher, verdict, name, mode, days, derivation, requirements) -> None:
    timing = launcher.timing
    config = PeerConfig(dialect=launcher.dialect)
    params = config.supported["client_message_id_dedupe"]["params"]
    params["mode"] = mode
    if days is None:
        params.pop("dedupe_retention_days", None)
    else:
        params["dedupe_retention_days"] = days
    hours = derive(mode, days, 168).hours
    with ScriptedBroker(config) as peer:
        instance = launcher.launch(f"max-age-{name}", broker=peer)
        peer.wait_linked(timing.reconnect_wait_s)
        cmid = unique(f"max-age-{name}")
        with instance.unix() as client:
            warm = unique("max-age-warm-up")  # done only after the daemon applied the negotiation (NEG-ORDER)
            assert post_send(client, BODY, warm).status_code == 202
            wait_row(client, warm, "done", timeout=timing.settle_s())
            peer.answer_all(fail())
            assert post_send(client, BODY, cmid).status_code == 202
            wait_row(client, cmid, ("pending", "inflight"), attempted=True, timeout=timing.settle_s())
            instance.set_clock((hours - 1) * 3600)
            statuses = watch_row(client, cmid, max(1.0, min(timing.retry_max_ms / 1000 * 1.3 + 0.3, 8.0)))
            derived = f"{hours} h for {mode}{'' if days is None else f', {days} days'}"
            if "dead" in statuses:
                verdict.expect(derivation, False, f"{name}: the row died an hour before its max age ({derived})")
                return
            sends_before = len(peer.sends_of(cmid))
            instance.set_clock((hours + 1) * 3600)
            try:  # every retry is due at once on the moved clock, so the row dies at the next drain
                row = wait_row(client, cmid, "dead", timeout=10 + timing.ack_timeout_s + timing.poll_ms / 1000 * 2)
            except AssertionError as exc:
                for requirement in requirements:
                    verdict.expect(requirement, False, f"an hour past its max age ({derived}) the row is not dead: "
                                                       f"{exc}")
                return
            verdict.expect("OBX-MAX-AGE-DEAD", "max_age" in str(row.get("last_error")),
                           f"last_error {row.get('last_error')!r}, expected max_age_exceeded")
            verdict.passed(derivation)
            time.sleep(1.0)
            verdict.expect("OBX-MAX-AGE-DEAD", len(peer.sends_of(cmid)) <= sends_before + 1,
                           "the row was still dispatched after its max age")


@case("outbox.max_age_override", "MAXAGE-OVERRIDE", "LIFE-EXIT-CODES")
def test_max_age_override_outside_the_window_refuses_to_start(launcher, verdict):
    """[outbox] max_age_hours_override above the broker's window (W − 1 = 167 h for 7 days) refuses to start
    (outbox_max_age_above_dedupe_window; exit 3, E-15)."""
    if not launcher.reads_config:
        verdict.blocked(["MAXAGE-OVERRIDE", "LIFE-EXIT-CODES"], "the target reads no config.toml (§13), so the "
                                                                "override cannot be given to it")
    config = HARNESS_CONFIG.replace("[outbox]\n", "[outbox]\nmax_age_hours_override = 200\n")
    with ScriptedBroker(PeerConfig(dialect=launcher.dialect)) as peer:
        instance = launcher.launch("max-age-override", config=config, broker=peer, wait=False)
        try:
            code = instance.wait_exit(timeout=launcher.timing.reconnect_wait_s + 20)
        except subprocess.TimeoutExpired:
            code = None
            instance.kill9()
    outcome = "was accepted" if code is None else f"exited {code}"
    verdict.expect("MAXAGE-OVERRIDE", code not in (None, 0), f"an override of 200 h against a 7-day window {outcome}")
    if code not in (None, 0):
        expect_exit(verdict, code, "invalid_config", "a configuration the broker's window refutes")


@case("outbox.no_attempt_limit", "OBX-BACKOFF")
def test_no_attempt_limit(launcher, verdict):
    """30 transient answers in a row, the clock hook moving time past each retry's wait: the row keeps being
    retried and settles done on the 31st attempt (E-14: max age is the only bound, there is no attempt cap)."""
    if not launcher.clock_hook and launcher.timing.retry_max_ms > 2000:
        verdict.blocked(["OBX-BACKOFF"], "without the clock hook 30 retries at this target's backoff take too long")
    timing = launcher.timing
    failures = 30
    with ScriptedBroker(PeerConfig(dialect=launcher.dialect)) as peer:
        instance = launcher.launch("no-attempt-limit", broker=peer)
        peer.wait_linked(timing.reconnect_wait_s)
        cmid = unique("no-attempt-limit")
        peer.answer(cmid, *[fail()] * failures)
        offset = 0.0
        with instance.unix() as client:
            assert post_send(client, BODY, cmid).status_code == 202
            deadline = time.monotonic() + 120
            while len(peer.sends_of(cmid)) <= failures and time.monotonic() < deadline:
                seen = len(peer.sends_of(cmid))
                if launcher.clock_hook:
                    offset += timing.retry_max_ms / 1000 * (1 + timing.retry_jitter) + 1
                    instance.set_clock(offset)
                try:
                    peer.wait_for(lambda n=seen: len(peer.sends_of(cmid)) > n,
                                  timing.ack_timeout_s + timing.poll_ms / 1000 + 3
                                  + (0 if launcher.clock_hook else timing.retry_max_ms / 1000 * 1.3),
                                  "the next attempt")
                except TimeoutError:
                    break
            row = row_for(client, cmid) or {}
            sends = len(peer.sends_of(cmid))
            if sends > failures:
                row = wait_row(client, cmid, "done", timeout=timing.settle_s())
        verdict.expect("OBX-BACKOFF", sends > failures and row.get("status") == "done",
                       f"after {sends} attempt(s) the row is {row.get('status')!r} ({row.get('last_error')!r}): "
                       f"retries stopped before the broker accepted it")


@case("outbox.history_pruned", "OBX-HISTORY-PRUNED-WARN")
def test_history_pruned_is_counted(api, broker, verdict, timing):
    """A 200 duplicate with history_available false settles the row done and is counted
    (cm_daemon_dedupe_history_pruned_total on GET /v1/metrics)."""
    def pruned_count() -> float | None:
        response = api.client.get("/v1/metrics")
        if response.status_code != 200:
            return None
        total = 0.0
        for line in response.text.splitlines():
            if line.startswith("cm_daemon_dedupe_history_pruned_total"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    before = pruned_count()
    if before is None:
        verdict.blocked(["OBX-HISTORY-PRUNED-WARN"], "GET /v1/metrics is not served (API-METRICS), so the count "
                                                     "cannot be read")
    cmid = unique("pruned")
    broker.answer(cmid, duplicate(False))
    send(api, cmid)
    with verdict.check("OBX-HISTORY-PRUNED-WARN"):
        wait_row(api, cmid, "done", timeout=timing.settle_s())
        after = pruned_count()
        assert after is not None and after >= before + 1, \
            f"cm_daemon_dedupe_history_pruned_total went from {before} to {after}"
