"""`meshconform sdk`: a client SDK driven through scenarios against the scripted daemon (conformance/sdk_daemon.py).

Each case sets up what the daemon will do wrong, runs the SDK's driver on a scenario (the launch contract of
conformance/sdk_target.py), and judges what the daemon saw -- the keys of every retry, when each came, which
``Last-Event-ID`` a reconnection carried -- and what the driver reports, requirement by requirement.
"""

from __future__ import annotations

import socket

from conformance.registry import case
from conformance.sdk_daemon import EventPlan, ScriptedDaemon
from spec import load_table

MESH = "meshconform"
#: every conflict of the §4.5.1 lookup table that answers 409
CONFLICTS = sorted({row["then"]["conflict"] for row in load_table("ipc_lookup")["rows"]
                    if row["then"].get("http_status") == 409})


def _keys(daemon: ScriptedDaemon) -> list[str]:
    return [(r.body or {}).get("client_message_id") or r.headers.get("idempotency-key") for r in daemon.sends()]


@case("sdk.discover.socket", "SDK-DISCOVER-CONNECT")
def test_discovers_the_daemon_on_its_socket(sdk_state, run_sdk, verdict):
    with ScriptedDaemon(sdk_state, MESH) as daemon:
        results = run_sdk(daemon, [{"op": "discover"}, {"op": "version"}])
    verdict.require("SDK-DISCOVER-CONNECT", results[0].get("ok"), f"discover: {results[0]}")
    verdict.expect("SDK-DISCOVER-CONNECT", results[0]["value"]["transport"] == "unix",
                   f"a live socket of the right mesh, and the SDK chose {results[0]['value']['transport']}")
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
    verdict.require("SDK-DISCOVER-CONNECT", results[0].get("ok"),
                    f"a dead socket file and a live TCP daemon: discover gave {results[0]}")
    verdict.expect("SDK-DISCOVER-CONNECT", results[0]["value"]["transport"] == "tcp", "the dead socket was used")
    verdict.expect("SDK-DISCOVER-TCP", results[1].get("ok") and all(r.transport == "tcp" for r in daemon.requests),
                   f"over TCP with the token file: {results[1]}")


@case("sdk.discover.checked", "SDK-DISCOVER-CHECK")
def test_a_socket_of_another_mesh_or_api_is_not_used(sdk_state, run_sdk, verdict, tmp_path):
    for name, options in (("another mesh", {"unix_mesh": "not-" + MESH}), ("another ipc_api", {"unix_ipc_api": "v2"})):
        state = tmp_path / name.replace(" ", "-")
        with ScriptedDaemon(state, MESH, **options) as daemon:
            results = run_sdk(daemon, [{"op": "discover"}])
        chose = results[0].get("value", {}).get("transport") if results[0].get("ok") else None
        verdict.expect("SDK-DISCOVER-CHECK", chose == "tcp",
                       f"the socket serves {name}; the TCP daemon is the one: the SDK chose {chose or results[0]}")


@case("sdk.token.rotated", "SDK-TOKEN-REREAD")
def test_a_rotated_token_is_read_again(sdk_state, run_sdk, verdict):
    with ScriptedDaemon(sdk_state, MESH, unix=False, rotate_token_after=3) as daemon:
        results = run_sdk(daemon, [{"op": "discover"}] + [{"op": "version"}] * 4)
    failed = [r for r in results if not r.get("ok")]
    verdict.expect("SDK-TOKEN-REREAD", not failed and len(results) == 5,
                   f"local_token was rewritten mid-run; failed steps: {failed}")


@case("sdk.send.retried_under_one_key", "SDK-SAME-KEY", "SDK-RETRY-AFTER")
def test_busy_draining_and_a_lost_answer_are_retried_under_one_key(sdk_state, run_sdk, verdict):
    with ScriptedDaemon(sdk_state, MESH) as daemon:
        daemon.send_script = [("answer", 429, {"Retry-After": "1"}, {}), ("reset",),
                              ("answer", 503, {"Retry-After": "2"}, {}), ("commit",)]
        results = run_sdk(daemon, [{"op": "send", "to": "#alerts", "message": "disk full", "deadline_s": 30}])
    sends, keys = daemon.sends(), _keys(daemon)
    verdict.require("SDK-SAME-KEY", results[0].get("ok") and len(sends) == 4,
                    f"429, a reset after the commit, 503, then 202: {len(sends)} sends, result {results[0]}")
    verdict.expect("SDK-SAME-KEY", len(set(keys)) == 1 and keys[0] == results[0]["value"]["client_message_id"],
                   f"the keys of the four attempts: {keys}")
    verdict.expect("SDK-SAME-KEY", len(daemon.rows) == 1, f"{len(daemon.rows)} rows committed")
    after_busy, after_draining = sends[1].at - sends[0].at, sends[3].at - sends[2].at
    verdict.expect("SDK-RETRY-AFTER", after_busy >= 0.95, f"Retry-After: 1, retried after {after_busy:.2f} s")
    verdict.expect("SDK-RETRY-AFTER", after_draining >= 1.95, f"Retry-After: 2, retried after {after_draining:.2f} s")


@case("sdk.send.given_key", "SDK-SAME-KEY")
def test_a_given_key_is_the_key_of_every_attempt(sdk_state, run_sdk, verdict):
    with ScriptedDaemon(sdk_state, MESH) as daemon:
        daemon.send_script = [("reset",), ("reset",), ("commit",)]
        results = run_sdk(daemon, [{"op": "send", "to": "#alerts", "message": "m", "client_message_id": "mc-given-1",
                                    "deadline_s": 30}])
    verdict.expect("SDK-SAME-KEY", _keys(daemon) == ["mc-given-1"] * 3 and results[0].get("ok"),
                   f"two resets after the commit: keys {_keys(daemon)}, result {results[0]}")


@case("sdk.send.conflicts_typed", "SDK-TYPED-CONFLICT", "SDK-NO-RETRY-REFUSED")
def test_every_conflict_of_the_lookup_table_comes_back_typed(sdk_state, run_sdk, verdict):
    with ScriptedDaemon(sdk_state, MESH) as daemon:
        daemon.send_script = [("answer", 409, {}, {"conflict": conflict}) for conflict in CONFLICTS]
        steps = [{"op": "send", "to": "#t", "message": "m", "client_message_id": f"mc-conflict-{n}", "deadline_s": 10}
                 for n in range(len(CONFLICTS))]
        results = run_sdk(daemon, steps)
    for n, (conflict, result) in enumerate(zip(CONFLICTS, results, strict=False)):
        error = result.get("error") or {}
        verdict.expect("SDK-TYPED-CONFLICT", error.get("kind") == "conflict" and error.get("conflict") == conflict
                       and error.get("client_message_id") == f"mc-conflict-{n}" and error.get("status") == 409,
                       f"409 {conflict}: the SDK reported {result}")
    verdict.expect("SDK-TYPED-CONFLICT", len(results) == len(CONFLICTS), f"{len(results)} results")
    verdict.expect("SDK-NO-RETRY-REFUSED", len(daemon.sends()) == len(CONFLICTS),
                   f"{len(CONFLICTS)} conflicts answered, {len(daemon.sends())} sends made")


@case("sdk.send.refusals_not_retried", "SDK-NO-RETRY-REFUSED")
def test_a_refused_send_is_not_retried(sdk_state, run_sdk, verdict):
    with ScriptedDaemon(sdk_state, MESH) as daemon:
        daemon.send_script = [("answer", 400, {}, {}), ("answer", 413, {}, {})]
        results = run_sdk(daemon, [{"op": "send", "to": "#t", "message": "m", "deadline_s": 10}] * 2)
    kinds = [(r.get("error") or {}).get("status") for r in results]
    verdict.expect("SDK-NO-RETRY-REFUSED", kinds == [400, 413] and len(daemon.sends()) == 2,
                   f"400 then 413: reported {kinds}, {len(daemon.sends())} sends made")


@case("sdk.events.resumed", "SDK-EVENTS-RESUME")
def test_a_dropped_stream_resumes_with_nothing_lost_or_repeated(sdk_state, run_sdk, verdict):
    first = [{"id": n, "event": "message", "data": {"body": f"m{n}"}} for n in range(1, 6)]
    second = [{"id": n, "event": "message", "data": {"body": f"m{n}"}} for n in range(7, 11)]
    with ScriptedDaemon(sdk_state, MESH) as daemon:
        daemon.events = EventPlan(batches=[first, second], cut=[True, False], overlap=2)
        results = run_sdk(daemon, [{"op": "events", "count": 10, "idle_s": 4}], timeout=60)
    streams = [r for r in daemon.requests if r.path.startswith("/v1/events")]
    verdict.require("SDK-EVENTS-RESUME", results and results[0].get("ok"), f"events: {results}")
    ids = [event["id"] for event in results[0]["value"]]
    verdict.expect("SDK-EVENTS-RESUME", ids == list(range(1, 11)),
                   f"events 1-5, a drop in the middle of 6, a replay from 4 (at least once), then 7-10: got {ids}")
    resumed = [r.headers.get("last-event-id") for r in streams[1:2]]
    verdict.expect("SDK-EVENTS-RESUME", resumed == ["5"], f"the reconnection's Last-Event-ID: {resumed}")


@case("sdk.inbox.paged_to_the_end", "SDK-INBOX-CURSOR")
def test_inbox_pages_are_followed_to_the_end(sdk_state, run_sdk, verdict):
    with ScriptedDaemon(sdk_state, MESH) as daemon:
        daemon.inbox = [{"id": f"01INBOX{n:019d}", "seq": n, "client_message_id": f"in-{n}", "broker_message_id": None,
                         "mesh": MESH, "topic": None, "sender_pubkey": "cd" * 32, "sender_name": None,
                         "body": f"b{n}", "meta": None, "received_at": "2026-11-27T00:00:00.000Z", "reply_to_id": None}
                        for n in range(1, 8)]
        results = run_sdk(daemon, [{"op": "inbox", "limit": 3}])
    verdict.require("SDK-INBOX-CURSOR", results and results[0].get("ok"), f"inbox: {results}")
    seqs = [item["seq"] for item in results[0]["value"]["items"]]
    verdict.expect("SDK-INBOX-CURSOR", seqs == list(range(1, 8)), f"7 items in pages of 3: got {seqs}")
    verdict.expect("SDK-INBOX-CURSOR", results[0]["value"]["next_cursor"] == "7",
                   f"the cursor to resume from: {results[0]['value']['next_cursor']!r}")
