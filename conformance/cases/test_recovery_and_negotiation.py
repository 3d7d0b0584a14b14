"""Crash recovery (§4.11, E-16), identity and lifecycle at start (§1, §2, E-15), and feature negotiation (§15):
cases that start, kill and restart fresh instances through the launch contract.

Files are reached where the target says they live (its target description, else ``{state_dir}``); a target that
keeps them elsewhere and does not say so gets those cases skipped with that reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import stat
import subprocess
import time

import httpx
import pytest

from conformance.cases._support import (
    BODY,
    OTHER,
    expect_exit,
    inbox_items,
    outbox_rows,
    post_send,
    row_for,
    unique,
    wait_row,
)
from conformance.launch import Launched, LaunchError
from conformance.peer import ACCEPT_SILENTLY, CREATED, PeerConfig, ScriptedBroker, fail, reject
from conformance.registry import case
from conformance.verdict import TARGET_FAILURES
from conformance.wire import json_object, send_seen
from reference.core import close_code
from spec import load_table

HEX64 = re.compile(r"[0-9a-f]{64}")
FEATURE_UNAVAILABLE = close_code("feature_unavailable")
#: how long a 4010 close reason may be (spec/tables/close_codes.yaml: RFC 6455's 123 bytes, E-07)
REASON_MAX_BYTES = next(entry["reason_max_bytes"] for entry in load_table("close_codes")["codes"]
                        if entry["code"] == FEATURE_UNAVAILABLE)


def _close_reason(text: str) -> dict:
    """The close_reason object, bare (E-07) or wrapped as the spec's cross-spec note shows; {} when not JSON."""
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    if isinstance(value, dict) and isinstance(value.get("close_reason"), dict):
        value = value["close_reason"]
    return value if isinstance(value, dict) else {}


def fresh(launcher, name: str, config: PeerConfig | None = None) -> tuple[ScriptedBroker, Launched]:
    peer = ScriptedBroker(config or PeerConfig(dialect=launcher.dialect))
    peer.start()
    instance = launcher.launch(name, broker=peer)
    peer.wait_linked(launcher.timing.reconnect_wait_s)
    return peer, instance


def one_message_each(peer: ScriptedBroker, cmids: list[str]) -> dict[str, int]:
    return {c: sum(1 for m in peer.messages.values() if m.get("client_message_id", m.get("id")) == c) for c in cmids}


@case("recovery.kill9_before_dispatch", "REC-NO-LOSS")
def test_kill9_right_after_202(launcher, verdict):
    """The broker is unreachable; five sends answer 202 and the target is SIGKILLed at once: after a restart every
    one reaches done, exactly once at the broker."""
    timing = launcher.timing
    peer, instance = fresh(launcher, "kill-early")
    try:
        peer.hold()
        cmids = [unique("kill-early") for _ in range(5)]
        with instance.unix() as client:
            for cmid in cmids:
                assert post_send(client, BODY, cmid).status_code == 202
        instance.kill9()
        peer.held.clear()
        instance.start()
        with instance.unix() as client, verdict.check("REC-NO-LOSS"):
            for cmid in cmids:
                wait_row(client, cmid, "done", timeout=timing.settle_s() + timing.hello_timeout_s + 5)
            counts = one_message_each(peer, cmids)
            assert set(counts.values()) == {1}, f"messages at the broker per id: {counts}"
    finally:
        peer.stop()


@case("recovery.kill9_inflight", "REC-INFLIGHT-TO-PENDING", "REC-ATTEMPTS-UNCHANGED", "REC-NO-LOSS",
      "WS-SEND-SAME-BYTES")
def test_kill9_while_inflight(launcher, verdict):
    """Three rows the broker committed but never acked; the target dies with them inflight. After a restart, with
    the broker still away, each row is pending again with its attempts unchanged (E-16); when the broker returns
    each is resent with the same request and settles done with the broker's original message: one message per row."""
    timing = launcher.timing
    peer, instance = fresh(launcher, "kill-inflight")
    try:
        cmids = [unique("kill-inflight") for _ in range(3)]
        for cmid in cmids:
            peer.answer(cmid, ACCEPT_SILENTLY, *[fail()] * 2)
        with instance.unix() as client:
            for cmid in cmids:
                assert post_send(client, BODY, cmid).status_code == 202
            before = {c: wait_row(client, c, "inflight", timeout=timing.settle_s()) for c in cmids}
        instance.kill9()
        peer.hold()
        instance.start()
        with instance.unix() as client:
            recovered = {}
            with verdict.check("REC-INFLIGHT-TO-PENDING"):
                for cmid in cmids:
                    recovered[cmid] = wait_row(client, cmid, "pending", timeout=10)
            if len(recovered) < len(cmids):
                verdict.skip("REC-ATTEMPTS-UNCHANGED", "no row came back from recovery to count its attempts")
            else:
                changed = {c: (before[c].get("attempts"), r.get("attempts")) for c, r in recovered.items()
                           if r.get("attempts") != before[c].get("attempts")}
                verdict.expect("REC-ATTEMPTS-UNCHANGED", not changed, f"recovery changed attempts: {changed}")
            peer.release(timeout=timing.reconnect_wait_s)
            with verdict.check("REC-NO-LOSS"):
                rows = {c: wait_row(client, c, "done", timeout=timing.settle_s(3)) for c in cmids}
                assert set(one_message_each(peer, cmids).values()) == {1}
                for cmid, row in rows.items():
                    assert row.get("broker_message_id") == peer.dedupe[cmid].broker_message_id, \
                        f"{cmid}: done with {row.get('broker_message_id')}, the broker committed " \
                        f"{peer.dedupe[cmid].broker_message_id}"
        for cmid in cmids:
            sends = peer.sends_of(cmid)
            if len(sends) >= 2:
                prints = {r.frame.get("request_fingerprint") for r in sends}
                verdict.expect("WS-SEND-SAME-BYTES", len(prints) == 1,
                               f"{cmid}: {len(sends)} sends with fingerprints {prints}")
    finally:
        peer.held.clear()
        peer.stop()


@case("recovery.restart_keeps_state", "ID-CONSUMED-NEVER-FREED")
def test_restart_keeps_consumed_ids(launcher, verdict):
    timing = launcher.timing
    peer, instance = fresh(launcher, "restart")
    try:
        cmid = unique("restart")
        with instance.unix() as client:
            post_send(client, BODY, cmid)
            wait_row(client, cmid, "done", timeout=timing.settle_s())
        instance.kill9()
        instance.start()
        with instance.unix() as client, verdict.check("ID-CONSUMED-NEVER-FREED"):
            again = post_send(client, OTHER, cmid)
            assert again.status_code == 409, f"after a restart the consumed id answered {again.status_code}"
            assert (row_for(client, cmid) or {}).get("status") == "done"
    finally:
        peer.stop()


def _check_separator(verdict, text: str) -> None:
    """When the file names its inputs, the fingerprint is sha256(host_id 0x00 stable_mac) (E-15)."""
    try:
        document = json.loads(text)
    except ValueError:
        verdict.skip("ID-HOST-FINGERPRINT-SEPARATOR", "host_fingerprint.json is not JSON")
        return
    host_id, mac = document.get("host_id"), document.get("stable_mac")
    stored = next((v for k, v in document.items() if "fingerprint" in k and isinstance(v, str)), None)
    if not isinstance(host_id, str) or not isinstance(mac, str) or stored is None:
        verdict.skip("ID-HOST-FINGERPRINT-SEPARATOR", "host_fingerprint.json does not name host_id and stable_mac")
        return
    expected = hashlib.sha256(host_id.encode() + b"\x00" + mac.encode()).hexdigest()
    verdict.expect("ID-HOST-FINGERPRINT-SEPARATOR", stored == expected,
                   f"the fingerprint {stored} is not sha256(host_id 0x00 stable_mac) = {expected}")


def _start_and_expect_exit(instance: Launched, timeout: float = 30.0) -> int | None:
    """Start ``instance`` and return its exit code, or None if it is still running after ``timeout``."""
    instance.start(wait=False)
    try:
        return instance.wait_exit(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


@case("lifecycle.singleton", "LIFE-SINGLETON", "LIFE-EXIT-CODES")
def test_second_daemon_on_one_state_dir_refuses(launcher, verdict):
    """A second start on a state directory in use exits (6, E-15) and the first keeps serving."""
    peer, instance = fresh(launcher, "singleton")
    try:
        # its own port; the state, and with it the node and its trace directory, are the first one's
        second = Launched(instance.template, instance.state_dir, peer.url, trace_dir=instance.trace_dir)
        code = _start_and_expect_exit(second, timeout=20)
        if code is None:
            second.kill9()
        verdict.expect("LIFE-SINGLETON", code not in (None, 0), f"the second daemon exited {code} "
                                                                 "(None: it kept running)")
        expect_exit(verdict, code, "state_dir_locked", "the second daemon")
        with verdict.check("LIFE-SINGLETON"), instance.unix() as client:
            assert client.get("/v1/health").status_code == 200, "the first daemon stopped answering"
    finally:
        peer.stop()


def _corrupt(path: os.PathLike, start: int) -> None:
    """Overwrite everything after ``start`` bytes with a repeating junk pattern (the SQLite header survives, so the
    file still opens and only an integrity check finds the damage)."""
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:
        handle.seek(start)
        handle.write(bytes(range(7, 251)) * ((size - start) // 244 + 1))


def _stopped_with_rows(launcher, name: str, rows: int = 40) -> tuple[ScriptedBroker, Launched, list[str]]:
    peer, instance = fresh(launcher, name)
    cmids = [unique(name) for _ in range(rows)]
    with instance.unix() as client:
        for cmid in cmids:
            post_send(client, {**BODY, "message": cmid * 40}, cmid)
        wait_row(client, cmids[-1], "done", timeout=launcher.timing.settle_s())
    instance.stop()
    return peer, instance, cmids


@case("recovery.corrupt_outbox", "REC-OUTBOX-INTEGRITY", "LIFE-EXIT-CODES")
def test_corrupt_outbox_refuses_to_start(launcher, verdict):
    peer, instance, _ = _stopped_with_rows(launcher, "corrupt-outbox")
    try:
        path = instance.file("outbox_db")
        if not path.exists():
            verdict.blocked(["REC-OUTBOX-INTEGRITY", "LIFE-EXIT-CODES"], f"no outbox.db at {path}")
        for suffix in ("-wal", "-shm"):
            wal = path.with_name(path.name + suffix)
            if wal.exists():
                wal.unlink()
        _corrupt(path, 4096 + 200)
        code = _start_and_expect_exit(instance, timeout=20)
        if code is None:
            instance.kill9()
        verdict.expect("REC-OUTBOX-INTEGRITY", code not in (None, 0),
                       f"with a corrupt outbox.db the daemon {'kept running' if code is None else f'exited {code}'}")
        expect_exit(verdict, code, "outbox_integrity_failed", "a corrupt outbox.db")
    finally:
        peer.stop()


@case("recovery.corrupt_inbox", "REC-INBOX-QUARANTINE", "INBOX-IDS-AFTER-RECREATE")
def test_corrupt_inbox_is_quarantined(launcher, verdict):
    """A corrupt inbox.db is moved aside and recreated, and the new one receives messages; the cursor of the old
    file's last row pages the new file's rows (E-45: its numbers continue above the old ones)."""
    timing = launcher.timing
    peer, instance = fresh(launcher, "corrupt-inbox")
    try:
        for n in range(40):
            peer.push(body=f"inbound {n} " + "x" * 400, client_message_id=unique("corrupt-inbox"))
        time.sleep(1.0)
        with instance.unix() as client:
            old, old_cursor = inbox_items(client)  # the cursor after the old file's last row
        instance.stop()
        path = instance.file("inbox_db")
        if not path.exists():
            verdict.blocked(["REC-INBOX-QUARANTINE"], f"no inbox.db at {path}")
        for suffix in ("-wal", "-shm"):
            wal = path.with_name(path.name + suffix)
            if wal.exists():
                wal.unlink()
        _corrupt(path, 4096 + 200)
        instance.start(wait=False)
        try:
            instance.wait_ready()
        except (LaunchError, *TARGET_FAILURES) as exc:  # any way of not coming up is the finding
            verdict.expect("REC-INBOX-QUARANTINE", False, f"with a corrupt inbox.db the daemon did not start: {exc}")
            return
        quarantined = sorted(p.name for p in path.parent.glob(path.name + ".corrupt-*"))
        with verdict.check("REC-INBOX-QUARANTINE"):
            assert quarantined, f"no {path.name}.corrupt-<ts> beside {path}: {sorted(os.listdir(path.parent))}"
            peer.wait_linked(timing.reconnect_wait_s)
            cmid = unique("after-quarantine")
            peer.push(body="after", client_message_id=cmid)
            with instance.unix() as client:
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    items = json_object(client.get("/v1/inbox")).get("items") or []
                    if any(isinstance(i, dict) and i.get("client_message_id") == cmid for i in items):
                        break
                    time.sleep(0.1)
                else:
                    raise AssertionError("the recreated inbox does not receive messages")
        if not isinstance(old_cursor, str) or not old_cursor:
            verdict.skip("INBOX-IDS-AFTER-RECREATE",
                         f"the old inbox gave no cursor to resume from ({len(old)} rows read)")
            return
        with verdict.check("INBOX-IDS-AFTER-RECREATE"), instance.unix() as client:
            answer = client.get("/v1/inbox", params={"cursor": old_cursor})
            assert answer.status_code == 200, f"the old inbox's last cursor answered {answer.status_code}"
            after = [i.get("client_message_id") for i in json_object(answer).get("items") or [] if isinstance(i, dict)]
            assert cmid in after, (f"paging from the old inbox's last cursor ({old_cursor!r}) does not reach the "
                                   f"recreated inbox's message: {after[:5]}")
    finally:
        peer.stop()


@case("identity.host_fingerprint", "ID-HOST-FINGERPRINT", "ID-HOST-FINGERPRINT-SEPARATOR", "ID-MISMATCH-REFUSE",
      "ID-KEYPAIR", "LIFE-EXIT-CODES")
def test_host_fingerprint_frozen_and_checked(launcher, verdict):
    """host_fingerprint.json is written at first start and unchanged by a restart; a fingerprint that no longer
    matches the host refuses to start (4, E-15)."""
    peer, instance = fresh(launcher, "host-fingerprint")
    try:
        path = instance.file("host_fingerprint")
        requirements = ["ID-HOST-FINGERPRINT", "ID-HOST-FINGERPRINT-SEPARATOR", "ID-MISMATCH-REFUSE",
                        "LIFE-EXIT-CODES"]
        keypair = instance.file("state_dir") / "keypair.json"
        with verdict.check("ID-KEYPAIR"):
            assert keypair.exists(), f"no keypair.json in {keypair.parent}"
            assert stat.S_IMODE(os.stat(keypair).st_mode) == 0o600, f"keypair.json is {oct(os.stat(keypair).st_mode)}"
        if not path.exists():
            verdict.blocked(requirements, f"no host_fingerprint.json at {path}")
        first = path.read_text(encoding="utf-8")
        verdict.expect("ID-HOST-FINGERPRINT", HEX64.search(first), f"no sha256 hex in {path.name}: {first[:200]}")
        _check_separator(verdict, first)
        instance.restart()
        verdict.expect("ID-HOST-FINGERPRINT", path.read_text(encoding="utf-8") == first,
                       "a restart on the same host rewrote host_fingerprint.json")
        instance.stop()
        document = json.loads(first)
        for key, value in list(document.items()):
            if isinstance(value, str) and HEX64.fullmatch(value):
                document[key] = ("0" if value[0] != "0" else "1") + value[1:]
            elif key in ("host_id", "stable_mac") and isinstance(value, str):
                document[key] = value + "-elsewhere"
        path.write_text(json.dumps(document), encoding="utf-8")
        code = _start_and_expect_exit(instance, timeout=20)
        if code is None:
            instance.kill9()
        verdict.expect("ID-MISMATCH-REFUSE", code not in (None, 0),
                       f"a fingerprint from another host {'was accepted' if code is None else f'exited {code}'}")
        expect_exit(verdict, code, "host_fingerprint_mismatch", "a host fingerprint mismatch")
    finally:
        peer.stop()


# --- negotiation ------------------------------------------------------------------------------------------------------

BAD_NEGOTIATIONS = [  # name, how to spoil the advertisement, the close_reason kind, the requirement for refusing
    ("below_floor", {"dedupe_retention_days": 2}, "feature_param_below_floor", "NEG-PARAM-VALIDATION"),
    ("no_fingerprint", {"request_fingerprint": False}, "feature_param_invalid", "NEG-REQUIRE-DEDUPE"),
    ("bad_version", {"version": 2}, "feature_param_invalid", "NEG-PARAM-VALIDATION"),
    ("bad_mode", {"mode": "forever"}, "feature_param_invalid", "NEG-PARAM-KINDS"),
    ("days_as_string", {"dedupe_retention_days": "7"}, "feature_param_invalid", "NEG-PARAM-KINDS"),
    ("days_missing", {"dedupe_retention_days": None}, "feature_param_invalid", "NEG-PARAM-VALIDATION"),
    ("dedupe_missing", "client_message_id_dedupe", "feature_unavailable", "NEG-REQUIRE-DEDUPE"),
    ("policy_missing", "concurrent_connection_policy", "feature_unavailable", "NEG-CLOSE-4010"),
]
# Which close_reason kind a refusal names is the spec's (§15.5) except where E-06 decided it.
KIND_BY_ERRATUM = {"below_floor", "no_fingerprint", "bad_mode", "days_as_string"}


@case("negotiation.refused", "NEG-CLOSE-4010", "NEG-CLOSE-REASON-SHAPE", "NEG-CLOSE-REASON-FIT",
      "NEG-PARAM-VALIDATION", "NEG-PARAM-KINDS", "NEG-REQUIRE-DEDUPE", "LIFE-EXIT-CODES")
@pytest.mark.parametrize(("name", "spoil", "kind", "requirement"), BAD_NEGOTIATIONS,
                         ids=[b[0] for b in BAD_NEGOTIATIONS])
def test_bad_negotiation_closes_4010(launcher, verdict, name, spoil, kind, requirement):
    """A broker advertising a missing or invalid required feature: the daemon closes 4010 with the reason, sends
    nothing, and exits non-zero (10, E-15)."""
    config = PeerConfig(dialect=launcher.dialect)
    feature = "client_message_id_dedupe"
    if isinstance(spoil, str):
        del config.supported[spoil]
        feature = spoil
    else:
        for key, value in spoil.items():
            if value is None:
                config.supported[feature]["params"].pop(key, None)
            else:
                config.supported[feature]["params"][key] = value
    with ScriptedBroker(config) as peer:
        instance = launcher.launch(f"neg-{name}", broker=peer, wait=False)
        try:
            link = peer.wait_for(lambda: next((link for link in peer.links.values()
                                               if link.negotiation_state != "pending"), None),
                                 launcher.timing.reconnect_wait_s, "the daemon's hello and first frame")
        except TimeoutError:
            verdict.blocked([requirement, "NEG-CLOSE-4010"], "the daemon never connected to the broker")
        if link.negotiation_state == "absent":
            cmid = unique(f"neg-{name}")
            dispatched = False
            try:
                instance.wait_ready()
                with instance.unix() as client:
                    post_send(client, BODY, cmid)
                dispatched = bool(peer.wait_for(lambda: peer.sends_of(cmid), 10, "a send"))
            except (LaunchError, *TARGET_FAILURES):  # not dispatching is fine: the finding is the missing negotiation
                pass
            detail = (f"the daemon never sent feature_negotiation_request (its first frame after hello_ack: "
                      f"{link.first_after_ack or 'none'}): it runs against a broker whose {feature} is {name}"
                      + (" and dispatched a send on that link" if dispatched else ""))
            for req in dict.fromkeys((requirement, "NEG-CLOSE-4010")):
                verdict.expect(req, False, detail)
            for req in ("NEG-CLOSE-REASON-SHAPE", "NEG-CLOSE-REASON-FIT"):
                verdict.skip(req, "the daemon never closed 4010, so there is no close reason to examine")
            return
        try:
            closed = peer.wait_close(timeout=launcher.timing.hello_timeout_s + 10)
        except TimeoutError:
            closed = None
        with verdict.check("NEG-CLOSE-4010"):
            assert closed is not None and closed.code == FEATURE_UNAVAILABLE, f"the daemon closed with {closed}"
            assert instance.wait_exit(timeout=30) != 0, "the daemon exited 0"
        verdict.expect(requirement, closed is not None and closed.code == FEATURE_UNAVAILABLE,
                       f"a broker whose {feature} is {name} was not refused (close {closed})")
        if closed is not None and closed.code == FEATURE_UNAVAILABLE:
            reason = _close_reason(closed.reason)
            with verdict.check("NEG-CLOSE-REASON-SHAPE"):
                assert isinstance(reason, dict) and {"kind", "feature"} <= set(reason) <= \
                    {"kind", "feature", "detail"}, f"close reason {closed.reason!r}"
                assert reason.get("feature") == feature, f"close_reason names {reason.get('feature')!r}"
                if name not in KIND_BY_ERRATUM:
                    assert reason.get("kind") == kind, f"close_reason kind {reason.get('kind')!r}, §15.5: {kind}"
            if name in KIND_BY_ERRATUM:
                verdict.expect("NEG-PARAM-KINDS", reason.get("kind") == kind,
                               f"close_reason kind {reason.get('kind')!r}, E-06: {kind}")
            with verdict.check("NEG-CLOSE-REASON-FIT"):
                assert len(closed.reason.encode("utf-8")) <= REASON_MAX_BYTES, f"{len(closed.reason.encode())} bytes"
                bare = json.loads(closed.reason)
                assert isinstance(bare, dict) and "close_reason" not in bare, \
                    f"the reason is not the bare compact object: {closed.reason!r}"
        verdict.expect(requirement, not peer.received("send"), "the daemon dispatched a send before negotiating")
        if instance.process is not None and instance.process.poll() is not None:
            expect_exit(verdict, instance.process.returncode, "feature_negotiation_failed", "a failed negotiation")


@case("negotiation.optional_invalid", "NEG-OPTIONAL-INVALID")
def test_invalid_optional_feature_is_ignored(launcher, verdict):
    """An optional bit with invalid params (max_payload below its floor): the daemon negotiates on and delivers."""
    config = PeerConfig(dialect=launcher.dialect)
    config.supported["max_payload"]["params"]["inline_bytes"] = 10
    config.supported["key_epoch"]["params"]["max_concurrent_epochs"] = "two"
    with ScriptedBroker(config) as peer:
        instance = launcher.launch("neg-optional", broker=peer, wait=False)
        try:
            instance.wait_ready()
            peer.wait_linked(launcher.timing.reconnect_wait_s)
        except (LaunchError, *TARGET_FAILURES) as exc:
            verdict.expect("NEG-OPTIONAL-INVALID", False, f"the daemon did not come up: {exc}")
            return
        cmid = unique("neg-optional")
        with instance.unix() as client, verdict.check("NEG-OPTIONAL-INVALID"):
            assert post_send(client, BODY, cmid).status_code == 202
            wait_row(client, cmid, "done", timeout=launcher.timing.settle_s())
            assert not [c for c in peer.closes if c.code == FEATURE_UNAVAILABLE], \
                "the daemon closed 4010 over an optional bit"


@case("negotiation.order", "NEG-ORDER")
def test_negotiation_comes_first(api, broker, verdict, timing):
    """On every connection the frame after hello_ack is feature_negotiation_request, and no send precedes the
    broker's response."""
    cmid = unique("order")
    post_send(api, BODY, cmid)
    wait_row(api, cmid, "done", timeout=timing.settle_s())
    links = [link for link in broker.links.values() if link.linked_at is not None]
    verdict.require("NEG-ORDER", links, "no linked connection to judge")
    for link in links:
        verdict.expect("NEG-ORDER", link.first_after_ack == "feature_negotiation_request",
                       f"connection #{link.connection}: the first frame after hello_ack was "
                       f"{link.first_after_ack or 'none (nothing within the wait)'}")


@case("outbox.listing", "API-OUTBOX")
def test_outbox_listing_filters(api, broker, verdict, timing):
    """GET /v1/outbox?status= keeps exactly the rows in that state."""
    done, dead = unique("list-done"), unique("list-dead")
    broker.answer(dead, reject(404, "destination_not_found"))
    for cmid in (done, dead):
        post_send(api, BODY, cmid)
    wait_row(api, done, "done", timeout=timing.settle_s())
    wait_row(api, dead, "dead", timeout=timing.settle_s())
    for status, inside, outside in (("done", done, dead), ("dead", dead, done)):
        rows = outbox_rows(api, status)
        ids = {r.get("client_message_id") for r in rows}
        with verdict.check("API-OUTBOX"):
            assert inside in ids and outside not in ids, f"?status={status} kept {len(ids)} rows, " \
                                                         f"{inside in ids=}, {outside in ids=}"
            kept = sorted({str(r.get("status")) for r in rows})
            assert set(kept) <= {status}, f"?status={status} kept rows in {kept}"


@case("lifecycle.drain", "LIFE-DRAIN")
def test_sigterm_drains(launcher, verdict):
    """SIGTERM with a row inflight: new sends are refused (503), the daemon waits for the outstanding ack (which
    the broker gives 0.3 s after the signal), applies it, and exits 0."""
    timing = launcher.timing
    peer, instance = fresh(launcher, "drain")
    try:
        cmid = unique("drain")
        peer.answer(cmid, ACCEPT_SILENTLY)
        with instance.unix() as client:
            assert post_send(client, BODY, cmid).status_code == 202
            wait_row(client, cmid, "inflight", timeout=timing.settle_s())
        frame = peer.wait_for(lambda: peer.sends_of(cmid), timing.settle_s(), f"the send of {cmid}")[0].frame
        kept = instance.unix(timeout=5)  # a connection opened before the signal, kept alive
        kept.get("/v1/health")
        os.killpg(instance.process.pid, signal.SIGTERM)
        time.sleep(0.3)
        exited_early = instance.process.poll() is not None
        with contextlib.suppress(ConnectionError, OSError, RuntimeError, TimeoutError):
            peer.send_raw(peer.decide(send_seen(frame), CREATED), peer.links and max(peer.links))
        refused = "refused"  # no connection at all also refuses the write
        with contextlib.suppress(httpx.HTTPError, OSError):
            refused = post_send(kept, BODY, unique("during-drain")).status_code
        kept.close()
        try:
            code = instance.wait_exit(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
            instance.kill9()
        verdict.expect("LIFE-DRAIN", refused in (503, "refused"), f"a send during the drain answered {refused}")
        verdict.expect("LIFE-DRAIN", not exited_early, "the daemon exited before its outstanding ack arrived")
        verdict.expect("LIFE-DRAIN", code == 0, f"after SIGTERM the daemon exited {code}")
        instance.start()
        with instance.unix() as client:
            row = row_for(client, cmid) or {}
        verdict.expect("LIFE-DRAIN", row.get("status") == "done",
                       f"the ack that arrived during the drain was not applied: the row is {row.get('status')!r}")
    finally:
        peer.stop()


@case("lifecycle.sighup", "LIFE-SIGHUP")
def test_sighup_restarts_nothing(launcher, verdict):
    """SIGHUP to the daemon's process: it keeps running and serving, its broker link is not reopened."""
    peer, instance = fresh(launcher, "sighup")
    try:
        links = len(peer.links)
        os.kill(instance.process.pid, signal.SIGHUP)
        time.sleep(2.0)
        alive = instance.process.poll() is None
        verdict.expect("LIFE-SIGHUP", alive, f"SIGHUP ended the daemon (exit {instance.process.returncode})")
        if alive:
            with instance.unix() as client:
                verdict.expect("LIFE-SIGHUP", client.get("/v1/health").status_code == 200, "no answer after SIGHUP")
            verdict.expect("LIFE-SIGHUP", len(peer.links) == links and peer.linked() is not None,
                           f"SIGHUP reopened the broker link ({len(peer.links) - links} new connection(s))")
    finally:
        peer.stop()
