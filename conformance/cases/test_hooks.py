"""Hooks (§6, E-48, E-49, E-50): a pushed message runs the hooks that match it, a hook's reply reaches the broker once
under the E-48 id, a kill -9 mid-hook runs the hook again and still replies once, the process contract (exit status,
timeout and the process group, stdin and output limits, environment, pool, network), and capability tokens.

Every case starts a fresh instance with its own hooks in ``{hooks_dir}`` (conformance/hooks.py) and its own scripted
broker, so no other case's messages can fire a hook and no hook can send what another case does not expect; the
hooks match by topic besides. The hooks record what they observe in a folder of the harness; the harness judges the
records, the scripted broker's frames and the daemon's answers. The cases run only against a daemon that lists
``hooks`` in ``GET /v1/version`` (``hook_launcher``); every other daemon gets them skipped with that reason.

Hooks that block wait for a marker file the harness writes at the end of the case, and never longer than a bound of
their own, so no hook outlives its case by much, whatever the daemon does.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ulid import ULID

from conformance import hooks as hk
from conformance.cases._support import RECIPIENT, EventStream, payload, unique, wait_inbound
from conformance.launch import Launched
from conformance.peer import PeerConfig, ScriptedBroker
from conformance.registry import case
from conformance.target import Target, TargetError
from conformance.wire import json_object, send_seen
from reference.core import reply_client_message_id
from spec import load_table, openapi, validator

SENDER = "cd" * 32
LIMITS = load_table("limits")["limits"]
STDIN_LIMIT = int(LIMITS["hook_stdin_bytes"]["value"])
POOL = int(LIMITS["hook_concurrency"]["value"])
KILL_GRACE_S = float(LIMITS["hook_kill_grace_s"]["value"])
#: the environment §6 gives a hook, and nothing else (HOOK-ENVIRONMENT)
HOOK_ENV = {"PATH", "CLAUDEMESH_MESH", "CLAUDEMESH_HOOK_NAME", "CLAUDEMESH_EVENT_ID", "CLAUDEMESH_DAEMON_SOCK"}
TOKEN_ENV = "CLAUDEMESH_CAPABILITY_TOKEN"
CAPABILITY_SCHEME = "ClaudeMesh-Capability"
UNENFORCEABLE = "cm_daemon_hook_unenforceable_total"


# --- fixtures and helpers --------------------------------------------------------------------------------------------


@pytest.fixture
def hook_launcher(mesh_target: Target) -> Iterator[Target]:
    """The target, when its hook cases can run (it declares hooks and the harness can install them); fresh
    instances are stopped afterwards."""
    reason = mesh_target.hook_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    try:
        yield mesh_target
    finally:
        mesh_target.release_fresh()


class Hooked:
    """One fresh instance with the case's hooks, its scripted broker, and the folder its hooks record in."""

    def __init__(self, launcher: Target, name: str):
        self.launcher, self.name = launcher, name
        self.out = launcher.workdir / f"{name}.observed"
        shutil.rmtree(self.out, ignore_errors=True)
        self.out.mkdir(parents=True)
        self.release = self.out / "release"
        self.peer = ScriptedBroker(PeerConfig(dialect=launcher.dialect))
        self.instance: Launched | None = None

    def hook(self, name: str, body: str, **settings: Any) -> hk.HookScript:
        constants = settings.pop("constants", {})
        return hk.python_hook(name, body, self.out, settings, RELEASE=str(self.release), **constants)

    def start(self, *hooks: hk.HookScript) -> Launched:
        self.peer.start()
        try:
            self.instance = self.launcher.launch(self.name, broker=self.peer, hooks=hooks)
        except TargetError as exc:
            raise AssertionError(f"the target did not start with the case's hooks.toml "
                                 f"({', '.join(h.name for h in hooks)}): {exc}") from exc
        self.peer.wait_linked(self.launcher.timing.reconnect_wait_s)
        return self.instance

    def runs(self, hook: str, kind: str = "run") -> list[dict[str, Any]]:
        return hk.observations(self.out, hook, kind)

    def stream(self) -> EventStream:
        assert self.instance is not None
        return EventStream(_Socket(self.instance))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.release.touch()  # every blocked hook of the case ends
        self.peer.stop()


@contextlib.contextmanager
def hooked(launcher: Target, name: str) -> Iterator[Hooked]:
    setup = Hooked(launcher, name)
    try:
        yield setup
    finally:
        setup.close()


class _Socket:
    """What EventStream needs of a target, for one fresh instance's unix socket."""

    def __init__(self, instance: Launched):
        self.instance = instance
        self.transports = ["unix"]

    def raw_connection(self, transport: str, timeout: float = 20.0) -> tuple[socket.socket, dict[str, str]]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(str(self.instance.socket_path))
        return sock, {"Host": "localhost"}


def wait(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """``predicate()``'s first truthy value within ``timeout`` seconds, else an AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(0.05)


def for_message(runs: list[dict[str, Any]], cmid: str) -> list[dict[str, Any]]:
    """The runs that were for the message ``cmid`` (its id in the stdin event or in CLAUDEMESH_EVENT_ID)."""
    return [r for r in runs if cmid in (r.get("stdin_head") or "")
            or (r.get("env") or {}).get("CLAUDEMESH_EVENT_ID") == cmid]


def replies(peer: ScriptedBroker) -> set[str]:
    """Every E-48 reply id the target sent (``hook.`` and 40 hex digits)."""
    return {send_seen(f).cmid for f in peer.received("send") if send_seen(f).cmid.startswith("hook.")}


def bodies(peer: ScriptedBroker) -> dict[str, set[str]]:
    """The text of every send the target made (as far as the harness can read it), with the ids it came under."""
    carried: dict[str, set[str]] = collections.defaultdict(set)
    for frame in peer.received("send"):
        seen = send_seen(frame)
        carried[seen.body or ""].add(seen.cmid)
    return carried


def committed(peer: ScriptedBroker, text: str) -> int:
    """How many messages the broker committed carrying ``text`` (a resend of one row is a duplicate, not one)."""
    return sum(1 for m in peer.messages.values() if send_seen(m).body == text)


def destination(frame: dict[str, Any]) -> tuple[str, str]:
    """(kind, ref) of a send frame in either dialect (meshspec's members, upstream's ``targetSpec``)."""
    if "destination_kind" in frame:
        return str(frame.get("destination_kind")), str(frame.get("destination_ref"))
    spec = str(frame.get("targetSpec") or "")
    if spec.startswith("#"):
        return "topic", spec[1:]
    return ("dm", spec) if re.fullmatch(r"[0-9a-f]{64}", spec) else ("?", spec)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not: it holds nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not Path("/proc").is_dir()


def settle(launcher: Target) -> float:
    """How long to watch for something that must not happen (a second run, a late reply)."""
    return min(max(3.0, launcher.timing.retry_max_ms / 1000), 10.0)


# The hook bodies (conformance/hooks.py PRELUDE gives read_event, observe, record, reply, wait_file, ipc).
RECORD = """
raw, parsed = read_event()
record(observe(raw, parsed))
"""
RECORD_AND_REPLY = RECORD + "reply(REPLY)\n"


# --- a message runs its hooks, replies once, and a redelivery runs nothing ------------------------------------------


@case("hooks.match_reply_redelivery", "HOOK-EVERY-MATCH", "HOOK-REPLY-ID", "HOOK-NEW-ROWS-ONLY",
      "HOOK-EXECUTED-EVENT")
def test_a_message_runs_its_hooks_once_and_replies(hook_launcher, verdict):
    """A topic message and a direct message: on-message runs for both, on-topic-<topic> for the first, on-dm for the
    second, another topic's hook for neither; the replies reach the broker under the E-48 ids, addressed to the topic
    and to the sender, answering the message; delivered again, neither message runs a hook again; one hook_executed
    event per run names the message event's id."""
    topic, other = "mc-hooks-match", "mc-hooks-other"
    with hooked(hook_launcher, "hooks-match") as setup:
        on_topic, on_dm = f"on-topic-{topic}", "on-dm"
        instance = setup.start(
            setup.hook("on-message", RECORD),
            setup.hook(on_topic, RECORD_AND_REPLY, allow_reply=True, constants={"REPLY": "topic reply"}),
            setup.hook(f"on-topic-{other}", RECORD),
            setup.hook(on_dm, RECORD_AND_REPLY, allow_reply=True, constants={"REPLY": "dm reply"}))
        peer = setup.peer
        topical, direct = unique("hook-topic"), unique("hook-dm")
        expected = {(on_topic, topical): "topic reply", (on_dm, direct): "dm reply"}
        wanted = {("on-message", topical): 1, ("on-message", direct): 1, (on_topic, topical): 1, (on_dm, direct): 1}
        ids = {pair: reply_client_message_id(pair[1], pair[0]) for pair in expected}
        with setup.stream() as stream:
            stream.opened()
            pushed = {topical: peer.push(body=f"hook case {topical}", client_message_id=topical, sender=SENDER,
                                         topic=topic),
                      direct: peer.push(body=f"hook case {direct}", client_message_id=direct, sender=SENDER)}
            try:
                wait(lambda: all(for_message(setup.runs(hook), cmid) for hook, cmid in wanted), 30,
                     "a run of every hook that matches")
            except AssertionError as exc:
                verdict.expect("HOOK-EVERY-MATCH", False, str(exc))
                verdict.blocked(("HOOK-REPLY-ID", "HOOK-NEW-ROWS-ONLY", "HOOK-EXECUTED-EVENT"), "no hook ran")
            with contextlib.suppress(TimeoutError):  # judged below: a reply under another id is HOOK-REPLY-ID's
                peer.wait_for(lambda: all(peer.sends_of(i) for i in ids.values()), 20, "both hooks' replies")
            for cmid, frame in pushed.items():  # the same broker messages again, under new deliveries
                peer.push(body=f"hook case {cmid}", client_message_id=cmid, sender=SENDER, attempt=2,
                          topic=frame.get("topic"), broker_message_id=frame["messageId"])
            with instance.unix() as client:
                for cmid in pushed:
                    if peer.client_acks(cmid):
                        peer.wait_for(lambda c=cmid: len(peer.client_acks(c)) >= 2, 10, "the redelivery's client_ack")
                    else:
                        wait_inbound(client, peer, cmid)
            time.sleep(settle(hook_launcher))
        events = list(stream.events)
    ran = {(hook, cmid): len(for_message(setup.runs(hook), cmid))
           for hook in ("on-message", on_topic, on_dm, f"on-topic-{other}") for cmid in pushed}
    verdict.expect("HOOK-EVERY-MATCH", all(ran[pair] >= 1 for pair in wanted)
                   and not any(n for pair, n in ran.items() if pair not in wanted),
                   f"runs per (hook, message): {ran}; expected a run of exactly {sorted(wanted)}")
    verdict.expect("HOOK-NEW-ROWS-ONLY", all(ran[pair] <= 1 for pair in wanted),
                   f"runs per (hook, message) after each message was delivered twice: {ran}")
    with verdict.check("HOOK-REPLY-ID"):
        for (hook, cmid), text in expected.items():
            sends = peer.sends_of(ids[(hook, cmid)])
            assert sends, f"no send of {ids[(hook, cmid)]} (the E-48 id of {hook}'s reply to {cmid}); the " \
                          f"target sent the reply ids {sorted(replies(peer))}"
            frame = sends[0].frame
            where = ("topic", topic) if hook == on_topic else ("dm", SENDER)
            assert destination(frame) == where, f"{hook}'s reply went to {destination(frame)}, not {where}"
            answered = frame.get("reply_to_id", frame.get("replyToId"))
            assert answered == pushed[cmid]["messageId"], \
                f"{hook}'s reply answers {answered!r}, not the message's broker_message_id {pushed[cmid]['messageId']}"
            body = send_seen(frame).body
            assert body in (None, text), f"{hook}'s reply carries {body!r}, the hook replied {text!r}"
        assert replies(peer) == set(ids.values()), f"reply ids sent: {sorted(replies(peer))}, expected {ids}"
    with verdict.check("HOOK-EXECUTED-EVENT"):
        message_ids = {payload(e).get("client_message_id"): e.get("id") for e in events if e.get("event") == "message"}
        assert set(pushed) <= set(message_ids), f"no message event for {sorted(set(pushed) - set(message_ids))}"
        executed = [payload(e) for e in events if e.get("event") == "hook_executed"]
        for event in executed:
            errors = list(validator("sse/hook_executed").iter_errors(event))
            assert not errors, f"hook_executed {event}: {errors[0].message}"
        seen = collections.Counter((e.get("hook"), str(e.get("event_id"))) for e in executed)
        want = collections.Counter((hook, str(message_ids[cmid])) for hook, cmid in wanted)
        assert seen == want, f"hook_executed (hook, event_id) seen {dict(seen)}, expected one each of {dict(want)}"
        assert all(e.get("exit") == 0 for e in executed), f"exit statuses {[e.get('exit') for e in executed]}"


# --- kill -9 mid-hook -------------------------------------------------------------------------------------------------


KILLED_HOOK = """
raw, parsed = read_event()
record(observe(raw, parsed))
if len([n for n in os.listdir(OUT) if n.startswith(HOOK + ".run.") and n.endswith(".json")]) == 1:
    wait_file(RELEASE, 90)  # the first run: blocks until the case ends; the daemon is killed meanwhile
else:
    reply("after the crash")
"""


@case("hooks.kill9_mid_hook", "HOOK-REPLY-ONCE", "HOOK-EVERY-MATCH")
def test_a_daemon_killed_mid_hook_runs_it_again_and_replies_once(hook_launcher, verdict):
    """The target is SIGKILLed while its hook runs; restarted, it runs the hook again, and the broker holds exactly
    one reply under the E-48 id."""
    topic = "mc-hooks-kill"
    hook = f"on-topic-{topic}"
    with hooked(hook_launcher, "hooks-kill9") as setup:
        instance = setup.start(setup.hook(hook, KILLED_HOOK, allow_reply=True, timeout_s=120))
        peer = setup.peer
        cmid = unique("hook-kill")
        peer.push(body=f"hook case {cmid}", client_message_id=cmid, sender=SENDER, topic=topic)
        wait(lambda: setup.runs(hook), 20, "the hook's first run")
        instance.kill9()
        instance.start()
        peer.wait_linked(hook_launcher.timing.reconnect_wait_s)
        try:
            wait(lambda: len(for_message(setup.runs(hook), cmid)) >= 2, 45, "a run of the hook after the restart")
        except AssertionError as exc:
            verdict.expect("HOOK-EVERY-MATCH", False, str(exc))
            verdict.blocked(("HOOK-REPLY-ONCE",), "the hook never ran again, so it never replied")
        with contextlib.suppress(TimeoutError):  # judged below, whatever id it came under
            peer.wait_for(lambda: replies(peer), 20, "the reply of the hook's run after the restart")
        setup.release.touch()
        time.sleep(settle(hook_launcher))
        runs = setup.runs(hook)
    verdict.expect("HOOK-EVERY-MATCH", len(for_message(runs, cmid)) >= 2,
                   f"{len(runs)} run(s) of {hook}: it did not run again after the restart")
    # judged by the reply's text: an id other than E-48's is HOOK-REPLY-ID's (hooks.match_reply_redelivery)
    verdict.expect("HOOK-REPLY-ONCE", committed(peer, "after the crash") == 1
                   and len(bodies(peer).get("after the crash", ())) == 1,
                   f"the broker committed {committed(peer, 'after the crash')} message(s) carrying the reply, sent "
                   f"under the id(s) {sorted(bodies(peer).get('after the crash', ()))}")


# --- what a hook prints, its exit status, and its output limit -----------------------------------------------------

CONTRACT = {  # topic: (what the hook prints and how it exits, its hooks.toml keys); only mc-c-reply's is a reply
    "mc-c-reply": ("reply('yes')", {"allow_reply": True}),
    "mc-c-silent": ("pass", {"allow_reply": True}),
    "mc-c-array": ("sys.stdout.write(json.dumps([{'reply': 'no mc-c-array'}]))", {"allow_reply": True}),
    "mc-c-other": ("sys.stdout.write(json.dumps({'answer': 'no mc-c-other'}))", {"allow_reply": True}),
    "mc-c-text": ("sys.stdout.write('reply: no mc-c-text')", {"allow_reply": True}),
    "mc-c-empty": ("reply('')", {"allow_reply": True}),
    "mc-c-number": ("sys.stdout.write(json.dumps({'reply': 7}))", {"allow_reply": True}),
    "mc-c-noallow": ("reply('no mc-c-noallow')", {"allow_reply": False}),
    "mc-c-exit3": ("reply('no mc-c-exit3'); sys.stdout.flush(); sys.exit(3)", {"allow_reply": True}),
}
BIG_OUTPUT = """
raw, parsed = read_event()
record(observe(raw, parsed))
sys.stderr.write("e" * 200000)
reply("x" * 200000)  # a valid reply, past output_size_limit: cut, so no reply
record({}, kind="done")  # only written once the daemon read all of it (a full pipe would block the hook here)
"""


@case("hooks.reply_contract", "HOOK-REPLY-CONTRACT", "HOOK-NONZERO-NOT-RETRIED", "HOOK-OUTPUT-LIMIT")
def test_only_a_reply_object_of_a_hook_that_exits_0_is_sent(hook_launcher, verdict):
    """One message per hook: a hook that exits 0 printing {"reply": "..."} with allow_reply replies; nothing, a JSON
    array, an object without reply, plain text, an empty or non-string reply, allow_reply false, exit 3, and a reply
    cut at output_size_limit send nothing; the hook that exits 3 runs once; the one printing past its limit is read to
    its end."""
    big = "on-topic-mc-c-big"
    with hooked(hook_launcher, "hooks-contract") as setup:
        hooks = [setup.hook(f"on-topic-{topic}", RECORD + line + "\n", **settings)
                 for topic, (line, settings) in CONTRACT.items()]
        hooks.append(setup.hook(big, BIG_OUTPUT, allow_reply=True, output_size_limit=1024, timeout_s=20))
        setup.start(*hooks)
        peer = setup.peer
        cmids = {topic: unique(f"hook-{topic}") for topic in [*CONTRACT, "mc-c-big"]}
        for topic, cmid in cmids.items():
            peer.push(body=f"hook case {cmid}", client_message_id=cmid, sender=SENDER, topic=topic)
        ids = {topic: reply_client_message_id(cmid, f"on-topic-{topic}") for topic, cmid in cmids.items()}
        try:
            wait(lambda: all(setup.runs(f"on-topic-{t}") for t in cmids), 30, "a run of every hook")
        except AssertionError as exc:
            verdict.blocked(("HOOK-REPLY-CONTRACT", "HOOK-NONZERO-NOT-RETRIED", "HOOK-OUTPUT-LIMIT"), str(exc))
        with contextlib.suppress(TimeoutError):  # judged below
            peer.wait_for(lambda: peer.sends_of(ids["mc-c-reply"]), 20, "the reply of the hook that replies")
        with verdict.check("HOOK-OUTPUT-LIMIT"):
            wait(lambda: setup.runs(big, "done"), 25, "the hook printing 200 KB finishing (the daemon did not read "
                                                      "its output to the end)")
        time.sleep(settle(hook_launcher))
    # judged by what the sends carry (each hook prints its own text), so a reply under another id is HOOK-REPLY-ID's
    carried = bodies(peer)
    wrongly = sorted(t for t in CONTRACT if f"no {t}" in carried or (t == "mc-c-number" and "7" in carried))
    verdict.expect("HOOK-REPLY-CONTRACT", len(carried.get("yes", ())) == 1 and not wrongly,
                   f"{len(carried.get('yes', ()))} send(s) of the reply of the hook that replies (one expected); "
                   f"replies sent by {wrongly or 'no other hook'} (only mc-c-reply's is one)")
    exit3 = setup.runs("on-topic-mc-c-exit3")
    verdict.expect("HOOK-NONZERO-NOT-RETRIED", len(exit3) == 1 and "no mc-c-exit3" not in carried,
                   f"the hook that exits 3 ran {len(exit3)} times" + (" and its reply was sent"
                                                                      if "no mc-c-exit3" in carried else ""))
    verdict.expect("HOOK-OUTPUT-LIMIT", not any(body.startswith("xxxx") for body in carried),
                   "a reply cut at output_size_limit (1024 bytes of a 200 KB stdout) was sent")


# --- timeout: the whole process group --------------------------------------------------------------------------------


TIMED_OUT_HOOK = """
raw, parsed = read_event()
record(observe(raw, parsed))

def on_term(signum, frame):
    record({"role": ROLE}, kind="sigterm")  # and keep running: only the SIGKILL that follows may end it

ROLE = "hook"
signal.signal(signal.SIGTERM, on_term)
reply("too late")  # printed before the timeout: a timed-out run sends no reply
sleeper = os.fork()
if sleeper == 0:
    ROLE = "sleeper"
    deadline = time.time() + 120
    while time.time() < deadline:
        time.sleep(0.1)
    os._exit(0)
record({"hook_pid": os.getpid(), "sleeper_pid": sleeper}, kind="pids")
deadline = time.time() + 120
while time.time() < deadline:
    time.sleep(0.1)
"""


@case("hooks.timeout_kills_group", "HOOK-TIMEOUT-KILLPG")
def test_a_timed_out_hook_and_its_sleeper_are_killed(hook_launcher, verdict):
    """A hook with timeout_s 1 forks a sleeper; both ignore SIGTERM. After the timeout both get SIGTERM (the whole
    group), and both are gone a grace later (SIGKILL to the group); the reply it printed is not sent."""
    topic = "mc-hooks-timeout"
    hook = f"on-topic-{topic}"
    with hooked(hook_launcher, "hooks-timeout") as setup:
        setup.start(setup.hook(hook, TIMED_OUT_HOOK, allow_reply=True, timeout_s=1))
        cmid = unique("hook-timeout")
        # the daemon's timer starts when it spawns the hook, between these two times: the push (before it) bounds
        # how early a SIGTERM may come, the hook's own first record (after it, by its interpreter's start-up, which
        # a loaded machine stretches) bounds how late
        pushed = time.time()
        setup.peer.push(body=f"hook case {cmid}", client_message_id=cmid, sender=SENDER, topic=topic)
        pids = wait(lambda: setup.runs(hook, "pids"), 20, "the hook's pids")[0]
        hook_pid, sleeper_pid = int(pids["hook_pid"]), int(pids["sleeper_pid"])
        started = setup.runs(hook)[0]["at"]
        limit = 1 + KILL_GRACE_S + 8
        try:
            wait(lambda: not alive(hook_pid) and not alive(sleeper_pid), limit, "the hook and its sleeper gone")
            gone = time.time()
        except AssertionError:
            gone = None
        time.sleep(settle(hook_launcher))
        terms = {r.get("role"): r.get("at") for r in setup.runs(hook, "sigterm")}
        sent = bodies(setup.peer)
    verdict.require("HOOK-TIMEOUT-KILLPG", gone is not None,
                    f"{limit:g} s after the hook started, still running: "
                    + ", ".join(f"{n} {p}" for n, p in (("hook", hook_pid), ("sleeper", sleeper_pid)) if alive(p)))
    verdict.expect("HOOK-TIMEOUT-KILLPG", set(terms) == {"hook", "sleeper"},
                   f"SIGTERM reached {sorted(terms) or 'neither'} of the hook and its sleeper (the whole group "
                   f"gets it first)")
    if "hook" in terms:
        term_at = terms["hook"]
        verdict.expect("HOOK-TIMEOUT-KILLPG", term_at - pushed >= 0.8,
                       f"SIGTERM {term_at - pushed:.2f} s after the message that started a hook with timeout_s 1 "
                       f"was pushed (so at most that long after the hook's start)")
        verdict.expect("HOOK-TIMEOUT-KILLPG", term_at - started <= 4.0,
                       f"SIGTERM {term_at - started:.2f} s after a hook with timeout_s 1 recorded its start")
        verdict.expect("HOOK-TIMEOUT-KILLPG", KILL_GRACE_S * 0.6 <= gone - term_at <= KILL_GRACE_S + 4,
                       f"the group was gone {gone - term_at:.1f} s after the SIGTERM; the SIGKILL comes "
                       f"{KILL_GRACE_S:g} s after it")
    verdict.expect("HOOK-TIMEOUT-KILLPG", "too late" not in sent,
                   "the reply a timed-out hook printed was sent")


# --- stdin and environment -------------------------------------------------------------------------------------------


STDIN_HOOK = """
import resource

def rlimits():
    return {name: list(resource.getrlimit(getattr(resource, name))) for name in RLIMITS}

raw, parsed = read_event()
seen = observe(raw, parsed)
message = parsed.get("message") if isinstance(parsed, dict) else None
body = message.get("body") if isinstance(message, dict) else None
if isinstance(body, str):
    seen.update(body_chars=len(body), body_head=body[:200])
seen["rlimits"] = rlimits()
child = os.fork()
if child == 0:  # a process the hook starts
    record({"rlimits": rlimits()}, kind="child")
    os._exit(0)
os.waitpid(child, 0)
record(seen)
"""
#: the rlimits a hook and its children run under (E-49, limits.yaml): RLIMIT_<name> -> the most it may be
RLIMITS = {"RLIMIT_CORE": int(LIMITS["hook_rlimit_core_bytes"]["value"]),
           "RLIMIT_NOFILE": int(LIMITS["hook_rlimit_nofile"]["value"]),
           "RLIMIT_FSIZE": int(LIMITS["hook_rlimit_fsize_bytes"]["value"])}
RLIM_INFINITY = -1  # what resource.getrlimit reports for no limit (Linux)


@case("hooks.stdin_and_environment", "HOOK-STDIN-LIMIT", "HOOK-ENVIRONMENT", "HOOK-CAP-ENV", "HOOK-RLIMITS")
def test_a_hook_reads_a_capped_event_in_a_bare_environment(hook_launcher, verdict):
    """A 300 KB message reaches its hook as an event of at most hook_stdin_bytes with "_truncated": true and its
    body cut; a small one whole. Both hooks get only the five §6 variables, PATH=/usr/bin:/bin, no credential of the
    daemon's and, with no capability_token_scope, no capability token; they and a process they start run with no
    core file, at most 256 open files and no file over 64 MiB, or the daemon counts the run as unenforceable."""
    small_topic, big_topic = "mc-hooks-env", "mc-hooks-stdin"
    small_hook, big_hook = f"on-topic-{small_topic}", f"on-topic-{big_topic}"
    with hooked(hook_launcher, "hooks-env") as setup:
        instance = setup.start(*(setup.hook(h, STDIN_HOOK, constants={"RLIMITS": sorted(RLIMITS)})
                                 for h in (small_hook, big_hook)))
        small, big = unique("hook-env"), unique("hook-stdin")
        big_body = f"hook case {big} " + "0123456789abcdef" * (300 * 1024 // 16)
        setup.peer.push(body=f"hook case {small}", client_message_id=small, sender=SENDER, topic=small_topic)
        setup.peer.push(body=big_body, client_message_id=big, sender=SENDER, topic=big_topic)
        with verdict.check("HOOK-STDIN-LIMIT", "HOOK-ENVIRONMENT", "HOOK-CAP-ENV", "HOOK-RLIMITS", fatal=True):
            wait(lambda: setup.runs(small_hook) and setup.runs(big_hook), 30, "both hooks' runs")
        token = instance.token()
        with instance.unix() as client:
            metrics = client.get("/v1/metrics").text
    small_run, big_run = setup.runs(small_hook)[0], setup.runs(big_hook)[0]
    with verdict.check("HOOK-STDIN-LIMIT"):
        assert big_run["stdin_bytes"] <= STDIN_LIMIT, \
            f"the event of a {len(big_body)}-byte message is {big_run['stdin_bytes']} bytes (limit {STDIN_LIMIT})"
        assert big_run["truncated"] is True, f"the cut event's _truncated is {big_run['truncated']!r}"
        if "body_chars" in big_run:
            assert big_run["body_chars"] < len(big_body) and big_body.startswith(big_run["body_head"]), \
                "the cut event's body is not a prefix of the message's"
        assert small_run["truncated"] in (None, False), f"a small event says _truncated {small_run['truncated']!r}"
        assert f"hook case {small}" in small_run["stdin_head"], "a small message's body is not in its event"
    with verdict.check("HOOK-ENVIRONMENT"):
        for hook, run in ((small_hook, small_run), (big_hook, big_run)):
            env = run["env"]
            assert set(env) - {TOKEN_ENV} == HOOK_ENV, \
                f"{hook}'s environment: {sorted(env)}; §6 gives exactly {sorted(HOOK_ENV)}"
            assert env.get("PATH") == "/usr/bin:/bin", f"{hook}'s PATH is {env.get('PATH')!r}"
            assert env.get("CLAUDEMESH_HOOK_NAME") == hook, f"CLAUDEMESH_HOOK_NAME {env.get('CLAUDEMESH_HOOK_NAME')!r}"
            assert not token or not any(token in value for value in env.values()), \
                f"{hook}'s environment holds the daemon's bearer token"
    verdict.expect("HOOK-CAP-ENV", not any(TOKEN_ENV in run["env"] for run in (small_run, big_run)),
                   f"{TOKEN_ENV} is set for a hook granted no capability_token_scope")
    over = {}
    for hook, run in ((small_hook, small_run), (f"{small_hook}'s child", (setup.runs(small_hook, "child") or
                                                                           [{}])[0])):
        for name, most in RLIMITS.items():
            soft = (run.get("rlimits") or {}).get(name, [RLIM_INFINITY])[0]
            if soft == RLIM_INFINITY or soft > most:
                over[f"{hook} {name}"] = soft
    counted = [line for line in metrics.splitlines() if line.startswith(UNENFORCEABLE + "{")
               and f'hook="{small_hook}"' in line and not line.rstrip().endswith((" 0", " 0.0"))]
    verdict.expect("HOOK-RLIMITS", not over or counted,
                   f"rlimits above limits.yaml's ({RLIMITS}; -1 is none): {over}, and {UNENFORCEABLE} counts no run "
                   f"of {small_hook}")


# --- the pool ---------------------------------------------------------------------------------------------------------


POOL_HOOK = """
raw, parsed = read_event()
record(observe(raw, parsed))
wait_file(RELEASE, 40)
record({}, kind="end")
"""


@case("hooks.pool", "HOOK-POOL")
def test_at_most_the_pool_runs_at_once_and_storing_never_waits(hook_launcher, verdict):
    """hook_concurrency + 2 messages whose hook blocks: at most hook_concurrency hooks run at once while every message
    is stored (acknowledged, or in the inbox) all the same; released, every one runs."""
    topic = "mc-hooks-pool"
    hook = f"on-topic-{topic}"
    count = POOL + 2
    with hooked(hook_launcher, "hooks-pool") as setup:
        instance = setup.start(setup.hook(hook, POOL_HOOK, timeout_s=60))
        peer = setup.peer
        cmids = [unique("hook-pool") for _ in range(count)]
        for cmid in cmids:
            peer.push(body=f"hook case {cmid}", client_message_id=cmid, sender=SENDER, topic=topic)
        with verdict.check("HOOK-POOL", fatal=True):
            wait(lambda: setup.runs(hook), 20, "the first run")
            last, changed = len(setup.runs(hook)), time.monotonic()
            while time.monotonic() - changed < 2.0 and last < count:  # until no run starts for 2 s
                time.sleep(0.1)
                if len(setup.runs(hook)) != last:
                    last, changed = len(setup.runs(hook)), time.monotonic()
            with instance.unix() as client:
                for cmid in cmids:
                    wait_inbound(client, peer, cmid, timeout=10)
            blocked = len(setup.runs(hook))
        setup.release.touch()
        with verdict.check("HOOK-POOL"):
            wait(lambda: len(setup.runs(hook, "end")) >= count, 30, f"all {count} runs ending once released")
    starts = sorted(r["at"] for r in setup.runs(hook))
    ends = sorted(r["at"] for r in setup.runs(hook, "end"))
    most = max(sum(1 for s in starts if s <= t) - sum(1 for e in ends if e < t) for t in starts)
    verdict.expect("HOOK-POOL", blocked <= POOL and most <= POOL,
                   f"{max(blocked, most)} hooks ran at once; the pool is {POOL}")


# --- network_policy deny ----------------------------------------------------------------------------------------------


NETWORK_HOOK = """
raw, parsed = read_event()
seen = observe(raw, parsed)
try:
    socket.create_connection(("127.0.0.1", PORT), timeout=3).close()
    seen["connected"] = True
except OSError as exc:
    seen["connected"] = False
    seen["error"] = "%s: %s" % (type(exc).__name__, exc)
record(seen)
"""


@case("hooks.network_deny", "HOOK-NETWORK-BEST-EFFORT")
def test_a_hook_with_network_deny_has_no_network_or_is_counted(hook_launcher, verdict):
    """A hook with network_policy deny connects to a listener of the harness on 127.0.0.1: it runs, and either the
    connection fails (its own network namespace) or the daemon counts the run in
    cm_daemon_hook_unenforceable_total{hook=...} (GET /v1/metrics)."""
    topic = "mc-hooks-net"
    hook = f"on-topic-{topic}"
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    arrived: list[bool] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                connection, _ = listener.accept()
                arrived.append(True)
                connection.close()

    threading.Thread(target=accept, daemon=True).start()
    try:
        with hooked(hook_launcher, "hooks-net") as setup:
            instance = setup.start(setup.hook(hook, NETWORK_HOOK, network_policy="deny",
                                              constants={"PORT": listener.getsockname()[1]}))
            cmid = unique("hook-net")
            setup.peer.push(body=f"hook case {cmid}", client_message_id=cmid, sender=SENDER, topic=topic)
            with verdict.check("HOOK-NETWORK-BEST-EFFORT", fatal=True):
                run = wait(lambda: setup.runs(hook), 30, "the hook's run (a deny the machine cannot enforce still "
                                                         "runs the hook)")[0]
            time.sleep(0.5)
            with instance.unix() as client:
                metrics = client.get("/v1/metrics").text
    finally:
        stop.set()
        listener.close()
    if not run.get("connected") and not arrived:
        verdict.passed("HOOK-NETWORK-BEST-EFFORT")
        return
    counted = [line for line in metrics.splitlines() if line.startswith(UNENFORCEABLE + "{")
               and f'hook="{hook}"' in line and not line.rstrip().endswith((" 0", " 0.0"))]
    verdict.expect("HOOK-NETWORK-BEST-EFFORT", counted,
                   f"the hook reached 127.0.0.1 with network_policy deny, and {UNENFORCEABLE} counts no run of "
                   f"{hook}")


# --- capability tokens (E-50) -----------------------------------------------------------------------------------------


def routes() -> list[tuple[str, str]]:
    """Every route of spec/openapi.yaml but POST /v1/send, the one a capability token may grant, and one unknown."""
    methods = ("get", "post", "put", "patch", "delete")
    known = [(method.upper(), path) for path, item in openapi()["paths"].items() for method in item
             if method in methods and (method, path) != ("post", "/v1/send")]
    return [*known, ("GET", "/v1/meshconform-no-such-route")]


CAPABILITY_HOOK = """
raw, parsed = read_event()
env = environment()
token = env.get("CLAUDEMESH_CAPABILITY_TOKEN")
results = {}
if token:
    for label, body in SENDS:
        results[label] = ipc("POST", "/v1/send", body, token)
    for method, path in ROUTES:
        results[method + " " + path] = ipc(method, path, {} if method == "POST" else None, token)
if NO_TOKEN_SEND:
    results["no token: POST /v1/send"] = ipc("POST", "/v1/send", NO_TOKEN_SEND)
    for method, path in ROUTES:
        results["no token: " + method + " " + path] = ipc(method, path, {} if method == "POST" else None)
    child = os.fork()
    if child == 0:  # a process of the hook's group that presents no token
        record({"result": ipc("GET", "/v1/inbox")}, kind="child")
        os._exit(0)
    os.waitpid(child, 0)
record({"token": token, "results": results}, kind="cap")
wait_file(RELEASE, 30)  # alive, its token valid, while the harness presents the token over TCP
"""


def problem_code(response: httpx.Response) -> str | None:
    """The problem code of an error answer (``error``, else ``code``, else the type URI's last part)."""
    body = json_object(response)
    code = body.get("error") or body.get("code")
    kind = body.get("type")
    if code is None and isinstance(kind, str) and kind.startswith(hk.PROBLEM_TYPE_PREFIX):
        code = kind.removeprefix(hk.PROBLEM_TYPE_PREFIX)
    return code if isinstance(code, str) else None


def _send(to: str, label: str, reply_to_id: str | None = None) -> dict[str, Any]:
    body = {"to": to, "message": f"capability {label}", "client_message_id": unique(f"cap-{label}")}
    if reply_to_id is not None:
        body["reply_to_id"] = reply_to_id
    return body


@case("hooks.capability_matrix", "HOOK-CAP-SCOPE", "HOOK-CAP-REQUIRED", "HOOK-CAP-ENV", "HOOK-CAP-LOCAL")
def test_a_capability_token_grants_only_sends_its_scopes_bind_to_the_message(hook_launcher, verdict):
    """Two hooks with capability_token_scope get CLAUDEMESH_CAPABILITY_TOKEN. Presented on the unix socket, the token
    of a topic message's hook (topic:<its topic>:post, dm:send:<sender_pubkey>) sends to that topic and to the
    sender (202/200), and a direct message's hook (reply:event) answers its message; a send anywhere else, a reply
    not answering the message, and every other route of spec/openapi.yaml (and an unknown one) are 403
    capability_denied and never reach the broker; over TCP the token is 403 capability_denied; the hook's process
    and a child of its group presenting no token get 403 capability_required on every route."""
    topic = "mc-hooks-cap"
    topic_hook, dm_hook = f"on-topic-{topic}", "on-dm"
    topical, direct = str(ULID()), str(ULID())  # the broker ids of the two messages, known to the hooks
    topic_sends = [("topic", _send(f"#{topic}", "topic")), ("dm-sender", _send(SENDER, "dm-sender")),
                   ("other-topic", _send("#mc-hooks-cap-no", "other-topic")),
                   ("other-dm", _send(RECIPIENT, "other-dm"))]
    dm_sends = [("reply", _send(SENDER, "reply", direct)), ("reply-unbound", _send(SENDER, "reply-unbound")),
                ("reply-other-message", _send(SENDER, "reply-other", str(ULID()))),
                ("reply-elsewhere", _send(f"#{topic}", "reply-elsewhere", direct))]
    granted = {"topic", "dm-sender", "reply"}
    no_token = _send(f"#{topic}", "no-token")
    with hooked(hook_launcher, "hooks-cap") as setup:
        instance = setup.start(
            setup.hook(topic_hook, CAPABILITY_HOOK, capability_token_scope=[f"topic:{topic}:post",
                                                                            "dm:send:<sender_pubkey>"],
                       constants={"SENDS": topic_sends, "ROUTES": routes(), "NO_TOKEN_SEND": no_token}),
            setup.hook(dm_hook, CAPABILITY_HOOK, capability_token_scope=["reply:event"],
                       constants={"SENDS": dm_sends, "ROUTES": [], "NO_TOKEN_SEND": None}))
        peer = setup.peer
        for cmid_prefix, broker_id, where in (("hook-cap-topic", topical, topic), ("hook-cap-dm", direct, None)):
            cmid = unique(cmid_prefix)
            peer.push(body=f"hook case {cmid}", client_message_id=cmid, sender=SENDER, topic=where,
                      broker_message_id=broker_id)
        with verdict.check("HOOK-CAP-SCOPE", "HOOK-CAP-REQUIRED", "HOOK-CAP-ENV", "HOOK-CAP-LOCAL", fatal=True):
            seen = {hook: wait(lambda h=hook: setup.runs(h, "cap"), 30, f"{hook}'s record")[0]
                    for hook in (topic_hook, dm_hook)}
        token = seen[topic_hook].get("token")
        tcp: dict[str, Any] = {}
        if token and instance.tcp_port is not None:
            auth = {"Authorization": f"{CAPABILITY_SCHEME} {token}"}
            with httpx.Client(base_url=f"http://127.0.0.1:{instance.tcp_port}", timeout=10) as client:
                over_tcp = [client.post("/v1/send", json=_send(f"#{topic}", "tcp"), headers=auth),
                            client.get("/v1/version", headers=auth)]
            tcp = {f"{r.request.method} {r.request.url.path}": (r.status_code, problem_code(r)) for r in over_tcp}
        setup.release.touch()
        bodies = dict(topic_sends + dm_sends)
        if all(r.get("token") for r in seen.values()):
            with contextlib.suppress(TimeoutError):
                peer.wait_for(lambda: all(peer.sends_of(bodies[g]["client_message_id"]) for g in granted), 15,
                              "the granted sends")
        time.sleep(1.0)
        child = setup.runs(topic_hook, "child")
    results = {k: tuple(v) for r in seen.values() for k, v in (r.get("results") or {}).items()}

    def at_broker(label: str) -> bool:
        return bool(peer.sends_of(bodies[label]["client_message_id"]))

    verdict.expect("HOOK-CAP-ENV", all(r.get("token") for r in seen.values()),
                   f"no {TOKEN_ENV} for {sorted(h for h, r in seen.items() if not r.get('token'))}, granted a scope")
    with verdict.check("HOOK-CAP-REQUIRED"):
        refused = {k: v for k, v in results.items() if k.startswith("no token")}
        refused["a child of the hook, no token: GET /v1/inbox"] = tuple(child[0]["result"]) if child else None
        wrong = {k: v for k, v in refused.items() if v != (403, "capability_required")}
        assert not wrong, f"expected 403 capability_required, got {wrong}"
        assert not peer.sends_of(no_token["client_message_id"]), "the send without a token reached the broker"
    if not token:
        verdict.skip("HOOK-CAP-LOCAL", f"the hook got no {TOKEN_ENV} to present over TCP")
    elif not tcp:
        verdict.skip("HOOK-CAP-LOCAL", "the target's TCP listener is not reachable by the harness")
    else:
        wrong = {k: v for k, v in tcp.items() if v != (403, "capability_denied")}
        verdict.expect("HOOK-CAP-LOCAL", not wrong, f"a capability token over TCP, expected 403 capability_denied: "
                                                     f"{wrong}")
    if not all(r.get("token") for r in seen.values()):
        verdict.blocked(("HOOK-CAP-SCOPE",), f"a hook granted a scope got no {TOKEN_ENV} to present")
    with verdict.check("HOOK-CAP-SCOPE"):
        wrong = {label: results.get(label) for label in granted if (results.get(label) or (None,))[0] not in (200, 202)}
        assert not wrong, f"sends the scopes grant were answered {wrong}, not 202/200"
        denied = [label for label in bodies if label not in granted] + [f"{m} {p}" for m, p in routes()]
        wrong = {label: results.get(label) for label in denied if results.get(label) != (403, "capability_denied")}
        assert not wrong, f"expected 403 capability_denied, got {wrong}"
        leaked = [label for label in bodies if label not in granted and at_broker(label)]
        assert not leaked, f"refused sends reached the broker: {leaked}"
        missing = [label for label in granted if not at_broker(label)]
        assert not missing, f"granted sends never reached the broker: {missing}"


REVOKED_HOOK = """
raw, parsed = read_event()
token = environment().get("CLAUDEMESH_CAPABILITY_TOKEN")
record({"token": token, "valid": ipc("POST", "/v1/send", SEND, token) if token else None}, kind="cap")
"""


@case("hooks.capability_revoked", "HOOK-CAP-REVOKED")
def test_a_capability_token_dies_with_its_hook(hook_launcher, verdict):
    """A hook's token sends while the hook runs; once the hook has exited the same token answers 401
    capability_invalid with WWW-Authenticate: ClaudeMesh-Capability, on the route it granted and on any other; so
    does a token the daemon never issued."""
    topic = "mc-hooks-revoke"
    hook = f"on-topic-{topic}"
    with hooked(hook_launcher, "hooks-revoke") as setup:
        instance = setup.start(setup.hook(hook, REVOKED_HOOK, capability_token_scope=[f"topic:{topic}:post"],
                                          constants={"SEND": _send(f"#{topic}", "valid")}))
        message = unique("hook-revoke")
        with setup.stream() as stream:
            stream.opened()
            setup.peer.push(body=f"hook case {message}", client_message_id=message, sender=SENDER, topic=topic)
            with verdict.check("HOOK-CAP-REVOKED", fatal=True):
                seen = wait(lambda: setup.runs(hook, "cap"), 30, "the capability hook's record")[0]
            token = seen.get("token")
            if not token or tuple(seen.get("valid") or ())[:1] not in ((200,), (202,)):
                verdict.blocked(("HOOK-CAP-REVOKED",), f"the hook's token never worked (token: {bool(token)}, its "
                                                       f"send: {seen.get('valid')})")
            wait(lambda: not alive(int(seen["pid"])), 10, "the hook's exit")
            with contextlib.suppress(AssertionError):  # the run is marked (its token revoked) before this event
                stream.wait(lambda evs: any(e.get("event") == "hook_executed" and payload(e).get("hook") == hook
                                            for e in evs), 5, "hook_executed")
        answers = {}
        with instance.unix() as client:
            auth = {"Authorization": f"{CAPABILITY_SCHEME} {token}"}
            deadline = time.monotonic() + 2.0  # without hook_executed: the daemon sees the exit a moment later
            while True:
                version = client.get("/v1/version", headers=auth)
                if version.status_code == 401 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            sent = client.post("/v1/send", headers=auth, json=_send(f"#{topic}", "after-exit"))
            forged = client.post("/v1/send", headers={"Authorization": f"{CAPABILITY_SCHEME} {'0f' * 32}"},
                                 json=_send(f"#{topic}", "forged"))
            for label, answer in (("GET /v1/version", version), ("POST /v1/send", sent),
                                  ("a token never issued: POST /v1/send", forged)):
                answers[label] = (answer.status_code, problem_code(answer),
                                  answer.headers.get("www-authenticate", "").split(" ")[0])
    wrong = {k: v for k, v in answers.items() if v != (401, "capability_invalid", CAPABILITY_SCHEME)}
    verdict.expect("HOOK-CAP-REVOKED", not wrong, "after the hook exited, expected 401 capability_invalid with "
                                                  f"WWW-Authenticate: {CAPABILITY_SCHEME}: {wrong}")
