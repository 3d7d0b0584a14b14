"""`meshconform sdk`: a client SDK driven through scenarios against the scripted daemon (conformance/sdk_daemon.py).

Each case sets up what the daemon will do wrong, runs the SDK's driver on a scenario (the launch contract of
conformance/sdk_target.py), and judges what the daemon saw -- the keys of every attempt, when each came, which
``Last-Event-ID`` a reconnection carried, which page was the last asked for -- and what the driver reports,
requirement by requirement. Every check is on the daemon's side where it can be, so a driver cannot pass by saying so.
"""

from __future__ import annotations

import socket
import time
from email.utils import formatdate
from typing import Any

from conformance.registry import case
from conformance.sdk_daemon import EventPlan, ScriptedDaemon
from spec import load_table

MESH = "meshconform"
#: every conflict of the §4.5.1 lookup table that answers 409
CONFLICTS = sorted({row["then"]["conflict"] for row in load_table("ipc_lookup")["rows"]
                    if row["then"].get("http_status") == 409})


def _keys(daemon: ScriptedDaemon) -> list[str]:
    return [(r.body or {}).get("client_message_id") or r.headers.get("idempotency-key") for r in daemon.sends()]


def ok(result: dict[str, Any]) -> bool:
    return result.get("ok") is True and "value" in result


def error(result: dict[str, Any]) -> dict[str, Any]:
    return result.get("error") or {} if not ok(result) else {}


def value(result: dict[str, Any], default: Any = None) -> Any:
    return result["value"] if ok(result) else default


def _event(n: int) -> dict[str, Any]:
    return {"id": n, "event": "message", "data": {"body": f"m{n}"}}


@case("sdk.discover.socket", "SDK-DISCOVER-CONNECT")
def test_discovers_the_daemon_on_its_socket(sdk_state, run_sdk, verdict):
    with ScriptedDaemon(sdk_state, MESH) as daemon:
        results = run_sdk(daemon, [{"op": "discover"}, {"op": "version"}])
    chose = (value(results[0]) or {}).get("transport")
    verdict.expect("SDK-DISCOVER-CONNECT", chose == "unix" and ok(results[1]),
                   f"a live socket of the right mesh: the SDK chose {chose or results[0]}, then {results[1]}")
    verdict.expect("SDK-DISCOVER-CONNECT", any(r.transport == "unix" and r.path.startswith("/v1/version")
                                               for r in daemon.requests), "no GET /v1/version on the socket")


@case("sdk.discover.stale_socket", "SDK-DISCOVER-CONNECT", "SDK-DISCOVER-TCP")
def test_a_socket_file_nobody_listens_on_is_not_a_daemon(sdk_state, run_sdk, verdict):
    sdk_state.mkdir(parents=True)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sdk_state / "daemon.sock"))  # the file of a daemon that died: nobody listens
    stale.close()
    (sdk_state / "daemon.pid").write_text("1\n")  # and a pid file naming a live process
    with ScriptedDaemon(sdk_state, MESH, unix=False) as daemon:
        results = run_sdk(daemon, [{"op": "discover"}, {"op": "version"}])
    chose = (value(results[0]) or {}).get("transport")
    verdict.expect("SDK-DISCOVER-CONNECT", chose == "tcp",
                   f"a dead socket file and a live TCP daemon: discover gave {chose or results[0]}")
    version_over_tcp = [r for r in daemon.requests if r.transport == "tcp" and r.path.startswith("/v1/version")
                        and r.headers.get("authorization") == f"Bearer {daemon.token}"]
    verdict.expect("SDK-DISCOVER-TCP", ok(results[1]) and bool(version_over_tcp),
                   f"over TCP with the token file: {results[1]}; {len(version_over_tcp)} authorized "
                   "GET /v1/version over TCP")


@case("sdk.discover.checked", "SDK-DISCOVER-CHECK")
def test_a_socket_of_another_mesh_or_api_is_not_used(sdk_state, run_sdk, verdict, tmp_path):
    for name, options in (("another mesh", {"unix_mesh": "not-" + MESH}), ("another ipc_api", {"unix_ipc_api": "v2"})):
        state = tmp_path / name.replace(" ", "-")
        with ScriptedDaemon(state, MESH, **options) as daemon:
            results = run_sdk(daemon, [{"op": "discover"}, {"op": "version"}])
        chose = (value(results[0]) or {}).get("transport")
        used_unix = [r.path for r in daemon.requests if r.transport == "unix"
                     and not r.path.startswith(("/v1/version", "/v1/health"))]
        verdict.expect("SDK-DISCOVER-CHECK", chose == "tcp" and not used_unix,
                       f"the socket serves {name}; the TCP daemon is the one: the SDK chose "
                       f"{chose or results[0]}{', and used the socket for ' + str(used_unix) if used_unix else ''}")


@case("sdk.token.rotated", "SDK-TOKEN-REREAD")
def test_a_rotated_token_is_read_again(sdk_state, run_sdk, verdict):
    with ScriptedDaemon(sdk_state, MESH, unix=False, rotate_token_after=3) as daemon:
        steps = [{"op": "discover"}] + [{"op": "send", "to": "#t", "message": f"m{n}", "deadline_s": 10,
                                         "client_message_id": f"mc-token-{n}"} for n in range(4)]
        results = run_sdk(daemon, steps)
    failed = [r for r in results if not ok(r)]
    verdict.expect("SDK-TOKEN-REREAD", not failed, f"local_token was rewritten mid-run; failed steps: {failed}")
    verdict.expect("SDK-TOKEN-REREAD", daemon.rotated and daemon.unauthorized >= 1
                   and daemon.authorized_after_rotation >= 1,
                   f"the token was rotated: {daemon.unauthorized} answered 401, then "
                   f"{daemon.authorized_after_rotation} requests came with the new token")


@case("sdk.send.retried_under_one_key", "SDK-SAME-KEY", "SDK-RETRY-AFTER")
def test_busy_draining_and_a_lost_answer_are_retried_under_one_key(sdk_state, run_sdk, verdict):
    with ScriptedDaemon(sdk_state, MESH) as daemon:
        daemon.send_script = [("answer", 429, {"Retry-After": "1"}, {}), ("reset",),
                              ("answer", 503, {"Retry-After": lambda: formatdate(time.time() + 3, usegmt=True)}, {}),
                              ("commit",)]
        results = run_sdk(daemon, [{"op": "send", "to": "#alerts", "message": "disk full", "deadline_s": 30}])
    sends, keys = daemon.sends(), _keys(daemon)
    stages = {1: ("SDK-RETRY-AFTER", "a 429 with Retry-After was not retried"),
              2: ("SDK-SAME-KEY", "a connection lost after the commit was not retried"),
              3: ("SDK-RETRY-AFTER", "a 503 with Retry-After (an HTTP-date) was not retried")}
    if len(sends) in stages:
        requirement, why = stages[len(sends)]
        verdict.require(requirement, False, f"{why}: {len(sends)} sends, result {results[0]}")
    verdict.expect("SDK-SAME-KEY", len(sends) == 4 and ok(results[0]),
                   f"429, a reset after the commit, 503, then 202: {len(sends)} sends, result {results[0]}")
    verdict.expect("SDK-SAME-KEY", len(set(keys)) == 1 and (value(results[0]) or {}).get("client_message_id")
                   == keys[0], f"the keys of the attempts: {keys}, the result's {value(results[0])}")
    verdict.expect("SDK-SAME-KEY", len(daemon.rows) == 1, f"{len(daemon.rows)} rows committed")
    if len(sends) >= 4:
        after_busy, after_draining = sends[1].at - sends[0].at, sends[3].at - sends[2].at
        verdict.expect("SDK-RETRY-AFTER", after_busy >= 0.95, f"Retry-After: 1, retried after {after_busy:.2f} s")
        verdict.expect("SDK-RETRY-AFTER", after_draining >= 1.9,
                       f"Retry-After: an HTTP-date 3 s ahead (2 s or more, to the second), retried after "
                       f"{after_draining:.2f} s")


@case("sdk.send.given_key", "SDK-SAME-KEY")
def test_a_given_key_is_the_key_of_every_attempt(sdk_state, run_sdk, verdict):
    with ScriptedDaemon(sdk_state, MESH) as daemon:
        daemon.send_script = [("reset",), ("reset",), ("commit",)]
        results = run_sdk(daemon, [{"op": "send", "to": "#alerts", "message": "m", "client_message_id": "mc-given-1",
                                    "deadline_s": 30}])
    verdict.expect("SDK-SAME-KEY", _keys(daemon) == ["mc-given-1"] * 3 and ok(results[0]),
                   f"two resets after the commit: keys {_keys(daemon)}, result {results[0]}")


@case("sdk.send.distinct_keys", "SDK-SAME-KEY")
def test_distinct_sends_never_share_a_minted_key(sdk_state, run_sdk, verdict):
    """Three sends without a key, two of them alike (to, message): three keys, three rows -- a key per send, not
    per content or per client."""
    with ScriptedDaemon(sdk_state, MESH) as daemon:
        steps = [{"op": "send", "to": "#t", "message": text, "deadline_s": 10} for text in ("same", "same", "other")]
        results = run_sdk(daemon, steps)
    keys = _keys(daemon)
    verdict.expect("SDK-SAME-KEY", all(ok(r) for r in results) and len(set(keys)) == 3 and len(daemon.rows) == 3,
                   f"three sends, two alike: keys {keys}, {len(daemon.rows)} rows, results {results}")


@case("sdk.send.retry_after_past_deadline", "SDK-RETRY-AFTER")
def test_a_retry_after_past_the_deadline_gives_up_in_time(sdk_state, run_sdk, verdict):
    with ScriptedDaemon(sdk_state, MESH) as daemon:
        daemon.send_script = [("answer", 429, {"Retry-After": "30"}, {})] * 3
        started = time.monotonic()
        results = run_sdk(daemon, [{"op": "send", "to": "#t", "message": "m", "deadline_s": 4}], timeout=40)
        took = time.monotonic() - started
    sends = daemon.sends()
    verdict.expect("SDK-RETRY-AFTER", len(sends) == 1,
                   f"Retry-After: 30 with a 4 s deadline: {len(sends)} sends (a retry before 30 s cuts it short)")
    verdict.expect("SDK-RETRY-AFTER", error(results[0]).get("kind") == "unavailable" and took < 20,
                   f"the SDK gave up with {results[0]} after {took:.1f} s (driver included); its deadline was 4 s")


@case("sdk.send.conflicts_typed", "SDK-TYPED-CONFLICT", "SDK-NO-RETRY-REFUSED")
def test_every_conflict_of_the_lookup_table_comes_back_typed(sdk_state, run_sdk, verdict):
    with ScriptedDaemon(sdk_state, MESH) as daemon:
        daemon.send_script = [("answer", 409, {}, {"conflict": conflict}) for conflict in CONFLICTS]
        steps = [{"op": "send", "to": "#t", "message": "m", "client_message_id": f"mc-conflict-{n}", "deadline_s": 10}
                 for n in range(len(CONFLICTS))]
        results = run_sdk(daemon, steps)
    for n, (conflict, result) in enumerate(zip(CONFLICTS, results, strict=True)):
        found = error(result)
        verdict.expect("SDK-TYPED-CONFLICT", found.get("kind") == "conflict" and found.get("conflict") == conflict
                       and found.get("client_message_id") == f"mc-conflict-{n}" and found.get("status") == 409,
                       f"409 {conflict}: the SDK reported {result}")
    verdict.expect("SDK-NO-RETRY-REFUSED", len(daemon.sends()) == len(CONFLICTS),
                   f"{len(CONFLICTS)} conflicts answered, {len(daemon.sends())} sends made")


REFUSALS = (400, 404, 413, 415)


@case("sdk.send.refusals_not_retried", "SDK-NO-RETRY-REFUSED")
def test_a_refused_send_is_not_retried(sdk_state, run_sdk, verdict):
    with ScriptedDaemon(sdk_state, MESH) as daemon:
        daemon.send_script = [("answer", status, {}, {}) for status in REFUSALS]
        results = run_sdk(daemon, [{"op": "send", "to": "#t", "message": "m", "deadline_s": 10}] * len(REFUSALS))
    reported = [(error(r).get("kind"), error(r).get("status")) for r in results]
    verdict.expect("SDK-NO-RETRY-REFUSED", reported == [("refused", s) for s in REFUSALS]
                   and len(daemon.sends()) == len(REFUSALS),
                   f"{', '.join(map(str, REFUSALS))}: reported {reported}, {len(daemon.sends())} sends made")


def _resumed_from(request) -> str | None:
    """The id a reconnection asked to resume after: the Last-Event-ID header, or the last_event_id parameter
    (spec/openapi.yaml takes both)."""
    from urllib.parse import parse_qs, urlsplit

    return request.headers.get("last-event-id") or (parse_qs(urlsplit(request.path).query).get("last_event_id")
                                                     or [None])[0]


@case("sdk.events.resumed", "SDK-EVENTS-RESUME")
def test_a_dropped_stream_resumes_with_nothing_lost_or_repeated(sdk_state, run_sdk, verdict):
    with ScriptedDaemon(sdk_state, MESH) as daemon:
        daemon.events = EventPlan(batches=[[_event(n) for n in range(1, 6)], [_event(n) for n in range(7, 11)]],
                                  cut=[True, False], overlap=2)
        results = run_sdk(daemon, [{"op": "events", "count": 10, "idle_s": 4}], timeout=60)
    streams = [r for r in daemon.requests if r.path.startswith("/v1/events")]
    ids = [event.get("id") for event in value(results[0], [])]
    verdict.expect("SDK-EVENTS-RESUME", ids == list(range(1, 11)),
                   f"events 1-5, a drop in the middle of 6, a replay from 4 (at least once), then 7-10: got {ids} "
                   f"({results[0] if not ok(results[0]) else 'ok'})")
    resumed = [_resumed_from(r) for r in streams[1:2]]
    verdict.expect("SDK-EVENTS-RESUME", resumed == ["5"], f"the reconnection resumed after {resumed}")


@case("sdk.events.replay_gap", "SDK-EVENTS-RESUME")
def test_a_replay_gap_reaches_the_caller(sdk_state, run_sdk, verdict):
    """Resuming after an event the daemon no longer holds: the stream starts with replay_gap (no id), which the
    caller must see -- it is the only sign that events were lost -- then the oldest retained ones."""
    with ScriptedDaemon(sdk_state, MESH) as daemon:
        daemon.events = EventPlan(retained=[_event(n) for n in range(5, 9)])
        results = run_sdk(daemon, [{"op": "events", "count": 5, "last_event_id": 2, "idle_s": 3}], timeout=40)
    got = [(event.get("event"), event.get("id")) for event in value(results[0], [])]
    verdict.expect("SDK-EVENTS-RESUME", got == [("replay_gap", None)] + [("message", n) for n in range(5, 9)],
                   f"resumed after 2 with 5-8 retained: got {got} ({results[0] if not ok(results[0]) else 'ok'})")


@case("sdk.inbox.paged_to_the_end", "SDK-INBOX-CURSOR")
def test_inbox_pages_are_followed_to_the_end(sdk_state, run_sdk, verdict):
    with ScriptedDaemon(sdk_state, MESH) as daemon:
        daemon.inbox = [{"id": f"01INBOX{n:019d}", "seq": n, "client_message_id": f"in-{n}", "broker_message_id": None,
                         "mesh": MESH, "topic": None, "sender_pubkey": "cd" * 32, "sender_name": None,
                         "body": f"b{n}", "meta": None, "received_at": "2026-11-27T00:00:00.000Z", "reply_to_id": None}
                        for n in range(1, 10)]
        daemon.inbox_pages = [3, 1, 3]  # a short page in the middle is not the end; only an empty one is
        results = run_sdk(daemon, [{"op": "inbox", "limit": 3}])
    seqs = [item.get("seq") for item in (value(results[0]) or {}).get("items", [])]
    verdict.expect("SDK-INBOX-CURSOR", seqs == list(range(1, 10)),
                   f"9 items in pages of 3, 1, 3, 2: got {seqs} ({results[0] if not ok(results[0]) else 'ok'})")
    verdict.expect("SDK-INBOX-CURSOR", daemon.inbox_served[-1:] == [0],
                   f"pages served {daemon.inbox_served}: the SDK never asked past the last one")
    verdict.expect("SDK-INBOX-CURSOR", (value(results[0]) or {}).get("next_cursor") == "9",
                   f"the cursor to resume from: {(value(results[0]) or {}).get('next_cursor')!r}")
