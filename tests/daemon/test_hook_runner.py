"""Hooks (§6, E-48) in the daemon: hooks.toml, runs committed with their inbox row, and the runner with real hook
processes -- replies through the outbox exactly once, a daemon killed -9 mid-hook, timeouts that kill the whole
process group, the stdin and output limits and the hook's environment."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from reference.core import parse_send, reply_client_message_id
from reference.core.limits import limit
from reference.daemon import hooks as h
from reference.daemon.config import load as load_config
from reference.daemon.runtime import policy_for
from reference.daemon.store.hook_runs import HookRuns, enqueue
from reference.daemon.store.inbox import InboxMessage, InboxStore
from reference.daemon.store.outbox import OutboxStore

SENDER = "ab" * 32


def script(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def toml(folder: Path, text: str) -> None:
    (folder / "hooks.toml").write_text(textwrap.dedent(text))


def message(n: int, topic: str | None = None, body: str = "ping") -> InboxMessage:
    return InboxMessage(id=f"01IN{n:06d}", client_message_id=f"cm-{n}", mesh="m", sender_pubkey=SENDER,
                        sender_name="alice", received_at=1_700_000_000_000 + n, broker_message_id=f"01BRK{n:06d}",
                        topic=topic, body=body)


class Rig:
    """A daemon's stores and a runner over real files and real hook processes."""

    def __init__(self, tmp: Path, max_claims: int = 3):
        self.tmp, self.folder = tmp, tmp / "hooks"
        self.folder.mkdir(exist_ok=True)
        self.inbox = InboxStore(tmp / "inbox.db")
        self.outbox = OutboxStore(tmp / "outbox.db", policy_for(load_config(None)))
        self.runs = HookRuns(self.inbox, max_claims)
        self.runner: h.HookRunner | None = None
        self.finished: list = []
        self.ids = iter(f"01ROW{n:021d}" for n in range(10**6))

    def hooks(self) -> list[h.Hook]:
        return h.load_hooks(self.folder, 30.0)

    def deliver(self, msg: InboxMessage):
        hooks = self.hooks()
        stored = self.inbox.insert_with_event(
            msg, with_row=lambda conn, row, event_id: enqueue(conn, row, h.matching(hooks, row), 0, event_id))
        if self.runner is not None:
            self.runner.notify()
        return stored

    def start(self, concurrency: int = 2, **options) -> h.HookRunner:
        submit = h.outbox_reply(parse_send, lambda item: self.outbox.accept_batch([item])[0],
                                lambda: next(self.ids), lambda: int(time.time() * 1000), lambda: None)
        self.runner = h.HookRunner(self.runs, self.hooks(), self.folder, inbox_row=self.inbox.by_seq,
                                   submit_reply=submit, mesh="m", socket_path=str(self.tmp / "daemon.sock"),
                                   clock_ms=lambda: int(time.time() * 1000), concurrency=concurrency,
                                   on_finish=self.finished.append, **options)
        self.runner.start()
        return self.runner

    def wait_finished(self, count: int, timeout: float = 30.0) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = [r for r in self.runs.list(limit=1000) if r.state in ("done", "failed", "timed_out")]
            if len(done) >= count:
                return sorted(done, key=lambda r: r.id)
            time.sleep(0.05)
        raise AssertionError(f"only {self.runs.counts()} after {timeout} s")

    def close(self) -> None:
        if self.runner is not None:
            self.runner.stop()
        self.inbox.close()
        self.outbox.close()


@pytest.fixture
def rig(tmp_path):
    made = Rig(tmp_path)
    yield made
    made.close()


def outbox_rows(rig: Rig) -> list[tuple[str, bytes]]:
    with rig.outbox._reading() as conn:
        return [(cmid, payload) for cmid, payload in
                conn.execute("SELECT client_message_id, payload FROM outbox ORDER BY rowid").fetchall()]


# --- hooks.toml --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "files", "wanted"), [
    (None, {}, "missing; hooks are enabled and §6 makes hooks.toml mandatory"),
    ("[on-message\n", {}, "hooks.toml: "),
    ("[on-mention]\n", {}, "[on-mention]: this daemon runs on-message, on-dm and on-topic-<name> hooks"),
    ("[pre-send]\n", {}, "pre-send is not run"),
    ("[on-whatever]\n", {}, "'on-whatever' does not match"),
    ("[on-topic-Bad]\n", {}, "'on-topic-Bad' does not match"),
    ("[on-message]\nsandbox = \"bubblewrap\"\n", {"on-message": ""}, "sandbox: not enforced by this daemon"),
    ("[on-message]\nredact_payload = []\n", {"on-message": ""}, "redact_payload: not enforced"),
    ("[on-message]\ncapability_token_scope = \"reply:event\"\n", {"on-message": ""},
     "[on-message.capability_token_scope]: 'reply:event' is not of type 'array'"),
    ("[on-message]\ncapability_token_scope = [\"reply:event\", \"reply:event\"]\n", {"on-message": ""},
     "has non-unique elements"),
    ("[on-message]\ntimeout_s = 0\n", {"on-message": ""}, "[on-message.timeout_s]: 0 is less than or equal to"),
    ("[on-message]\ntimeout_s = \"30\"\n", {"on-message": ""}, "[on-message.timeout_s]: '30' is not of type"),
    ("[on-message]\noutput_size_limit = 2000000\n", {"on-message": ""}, "2000000 is greater than the maximum"),
    ("[on-message]\nallow_reply = 1\n", {"on-message": ""}, "[on-message.allow_reply]: 1 is not of type 'boolean'"),
    ("[on-message]\nextra = 1\n", {"on-message": ""}, "Additional properties are not allowed ('extra'"),
    ("[on-message]\n", {}, "[on-message]: no executable"),
    ("[on-message]\ncommand = \"x.sh\"\n", {"x.sh": "noexec"}, "x.sh is not executable"),
    ("[on-message]\ncommand = \"a\\u0000b\"\n", {}, "[on-message.command]: holds a NUL character"),
    ("[on-message]\ncommand = \"\"\n", {}, "[on-message.command]: '' should be non-empty"),
    ("[on-message]\nnetwork_policy = \"allowlist\"\n", {"on-message": ""},
     'network_policy = "allowlist": not enforced'),
    ("[on-message]\nnetwork_policy = \"maybe\"\n", {"on-message": ""}, "'maybe' is not one of ['deny', 'allow']"),
])
def test_hooks_toml_errors_name_the_file_the_hook_and_the_key(tmp_path, text, files, wanted):
    if text is not None:
        (tmp_path / "hooks.toml").write_text(text)
    for name, mode in files.items():
        path = tmp_path / name
        path.write_text("#!/bin/sh\n")
        path.chmod(0o644 if mode == "noexec" else 0o755)
    with pytest.raises(h.HooksConfigError) as raised:
        h.load_hooks(tmp_path, 30.0)
    assert wanted in str(raised.value)
    assert str(tmp_path / "hooks.toml") in str(raised.value)


def test_hooks_toml_defaults_and_disabled_hooks(tmp_path):
    script(tmp_path, "on-message.sh", "")
    script(tmp_path, "bin-x", "")
    script(tmp_path, "on-dm", "")
    toml(tmp_path, """
        [on-message]
        [on-dm]
        enabled = false
        [on-topic-alerts]
        command = "bin-x"
        timeout_s = 2.5
        output_size_limit = 10
        allow_reply = true
        """)
    hooks = {hook.name: hook for hook in h.load_hooks(tmp_path, 12.0)}
    assert set(hooks) == {"on-message", "on-topic-alerts"}
    assert hooks["on-message"] == h.Hook("on-message", (tmp_path / "on-message.sh").resolve(), 12.0,
                                         limit("hook_output_bytes"), False)
    assert hooks["on-topic-alerts"] == h.Hook("on-topic-alerts", (tmp_path / "bin-x").resolve(), 2.5, 10, True)


def test_which_hooks_match_a_message(rig):
    hooks = [h.Hook(name, Path("/bin/true"), 1, 1, False) for name in ("on-message", "on-dm", "on-topic-alerts")]
    row = rig.inbox.insert(message(1))
    assert h.matching(hooks, row) == ["on-message", "on-dm"]
    row = rig.inbox.insert(message(2, topic="alerts"))
    assert h.matching(hooks, row) == ["on-message", "on-topic-alerts"]
    row = rig.inbox.insert(message(3, topic="alertsx"))
    assert h.matching(hooks, row) == ["on-message"]


# --- runs commit with their inbox row ----------------------------------------------------------------------------
def test_runs_commit_with_their_inbox_row(rig):
    script(rig.folder, "on-message", "")
    script(rig.folder, "on-dm", "")
    toml(rig.folder, "[on-message]\n[on-dm]\n")
    row, _ = rig.deliver(message(1))
    assert sorted((r.hook, r.state, r.inbox_seq) for r in rig.runs.list()) == [
        ("on-dm", "pending", row.seq), ("on-message", "pending", row.seq)]
    assert rig.deliver(message(1)) is None  # a duplicate inbound: no row, so no runs
    assert len(rig.runs.list()) == 2

    def failing(conn, row, event_id):
        enqueue(conn, row, ["on-message"], 0)
        raise RuntimeError("the disk filled up")

    with pytest.raises(RuntimeError):
        rig.inbox.insert_with_event(message(2), with_row=failing)
    assert rig.inbox.by_seq(row.seq + 1) is None and rig.inbox.get("01IN000002") is None
    assert len(rig.runs.list()) == 2  # neither the row nor its runs


# --- the runner ----------------------------------------------------------------------------------------------------
def test_a_hook_reply_goes_through_the_outbox_once(rig):
    script(rig.folder, "on-message", """
        cat > "$0.$CLAUDEMESH_EVENT_ID.stdin"
        echo '{"reply": "pong"}'
        """)
    toml(rig.folder, "[on-message]\nallow_reply = true\n")
    rig.start()
    rig.deliver(message(1))
    rig.deliver(message(2, topic="alerts"))
    done = rig.wait_finished(2)
    assert [r.state for r in done] == ["done", "done"]
    sent = {cmid: json.loads(payload) for cmid, payload in outbox_rows(rig)}  # the two ran at once: either order
    assert len(sent) == 2
    first, second = (sent[reply_client_message_id(f"cm-{n}", "on-message")] for n in (1, 2))
    assert (first["to"], first["message"], first["reply_to_id"]) == (f"dm:{SENDER}", "pong", "01BRK000001")
    assert (second["to"], second["reply_to_id"]) == ("#alerts", "01BRK000002")
    assert done[0].result["reply"] == {"client_message_id": reply_client_message_id("cm-1", "on-message"),
                                       "http_status": 202, "table_row": "IPC-NEW"}
    event = json.loads((rig.folder / "on-message.cm-1.stdin").read_text())
    assert event["hook"] == "on-message" and event["message"]["body"] == "ping" and "_truncated" not in event


def test_a_rerun_replies_the_same_or_is_refused_and_never_sends_twice(rig):
    """E-48: the same hook run again (a claim lost to a crash) sends under the same id: a match adds nothing, a
    different reply is a 409 and the first reply stands."""
    counter = rig.folder / "count"
    script(rig.folder, "on-message", f"""
        n=$(cat {counter} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {counter}
        if [ $n -le 2 ]; then echo '{{"reply": "first"}}'; else echo '{{"reply": "second"}}'; fi
        """)
    toml(rig.folder, "[on-message]\nallow_reply = true\n")
    rig.start()
    rig.deliver(message(1))
    first = rig.wait_finished(1)[0]
    for expected in ({"http_status": 202, "table_row": "IPC-PENDING-MATCH"},
                     {"http_status": 409, "table_row": "IPC-PENDING-MISMATCH"}):
        with rig.inbox._transaction() as conn:  # the run as a crash leaves it: claimed by a process that is gone
            conn.execute("UPDATE hook_runs SET state = 'claimed', claim_owner = 'dead', finished_at = NULL,"
                         " result = NULL WHERE id = ?", (first.id,))
        rig.runner._reset(rig.runs.reset_lost(int(time.time() * 1000), keep_owner=rig.runner.owner))
        again = rig.wait_finished(1)[0]
        assert again.state == "done" and {k: again.result["reply"][k] for k in expected} == expected
    assert len(outbox_rows(rig)) == 1 and json.loads(outbox_rows(rig)[0][1])["message"] == "first"


@pytest.mark.parametrize(("stdout", "allow", "refused"), [
    ('{"reply": "x"}', False, "allow_reply_false"), ("not json", True, "stdout_not_json"),
    ('{"other": 1}', True, "no_reply_member"), ('{"reply": 5}', True, "reply_not_a_string"),
    ('{"reply": ""}', True, "reply_not_a_string"), ("", True, None)])
def test_what_is_not_a_reply_sends_nothing(rig, stdout, allow, refused):
    script(rig.folder, "on-message", f"printf '%s' '{stdout}'\n")
    toml(rig.folder, f"[on-message]\nallow_reply = {'true' if allow else 'false'}\n")
    rig.start()
    rig.deliver(message(1))
    run = rig.wait_finished(1)[0]
    assert run.state == "done" and outbox_rows(rig) == []
    assert run.result["reply"] == (None if refused is None else {"refused": refused})


def test_a_nonzero_exit_fails_and_is_not_retried(rig):
    script(rig.folder, "on-message", "echo oops >&2\nexit 3\n")
    toml(rig.folder, "[on-message]\nallow_reply = true\n")
    rig.start()
    rig.deliver(message(1))
    run = rig.wait_finished(1)[0]
    time.sleep(1.0)
    assert (run.state, run.claims, run.result["exit"], run.result["stderr"]) == ("failed", 1, 3, "oops\n")
    assert [r.state for r in rig.runs.list()] == ["failed"] and rig.runs.get(run.id).claims == 1


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_a_timeout_kills_the_hook_and_the_sleeper_it_forked(rig):
    pids = rig.folder / "pids"
    script(rig.folder, "on-message", f"""
        sleep 300 &
        echo $! > {pids}
        echo '{{"reply": "never"}}'
        sleep 300
        """)
    toml(rig.folder, "[on-message]\ntimeout_s = 0.5\nallow_reply = true\n")
    rig.start()
    rig.deliver(message(1))
    run = rig.wait_finished(1)[0]
    assert (run.state, run.result["signalled"]) == ("timed_out", "SIGTERM")
    assert "reply" not in run.result and outbox_rows(rig) == []
    sleeper = int(pids.read_text())
    deadline = time.monotonic() + 5
    while alive(sleeper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(sleeper)


def test_a_hook_that_ignores_sigterm_is_killed_after_the_grace(rig):
    script(rig.folder, "on-message", "trap '' TERM\nwhile :; do sleep 0.1; done\n")
    toml(rig.folder, "[on-message]\ntimeout_s = 0.3\n")
    rig.start()
    started = time.monotonic()
    rig.deliver(message(1))
    run = rig.wait_finished(1, timeout=30)[0]
    assert (run.state, run.result["signalled"]) == ("timed_out", "SIGKILL")
    assert time.monotonic() - started >= limit("hook_kill_grace_s")


def test_a_hook_that_exits_leaving_a_child_does_not_keep_it(rig):
    pids = rig.folder / "pids"
    script(rig.folder, "on-message", f"sleep 300 &\necho $! > {pids}\nexit 0\n")
    toml(rig.folder, "[on-message]\n")
    rig.start()
    rig.deliver(message(1))
    assert rig.wait_finished(1)[0].state == "done"
    assert not alive(int(pids.read_text()))


def test_the_stdin_limit_cuts_the_body_and_says_so(rig):
    script(rig.folder, "on-message", f'cat > "{rig.folder}/stdin"\n')
    toml(rig.folder, "[on-message]\n")
    rig.start()
    rig.deliver(message(1, body="é" * 200_000))
    rig.wait_finished(1)
    raw = (rig.folder / "stdin").read_bytes()
    event = json.loads(raw)
    assert len(raw) <= limit("hook_stdin_bytes") and event["_truncated"] is True
    assert "é" * 1000 in event["message"]["body"] and event["message"]["client_message_id"] == "cm-1"


def test_output_past_the_limit_is_read_dropped_and_no_reply(rig):
    script(rig.folder, "on-message", "head -c 300000 /dev/zero | tr '\\0' x\n")
    toml(rig.folder, "[on-message]\noutput_size_limit = 1000\nallow_reply = true\n")
    rig.start()
    rig.deliver(message(1))
    run = rig.wait_finished(1)[0]
    assert (run.state, run.result["stdout_bytes"], run.result["_truncated"]) == ("done", 300000, True)
    assert run.result["reply"] == {"refused": "stdout_truncated"}


def test_a_hook_gets_a_bare_environment(rig, monkeypatch):
    monkeypatch.setenv("CLAUDEMESH_TOKEN", "secret")
    monkeypatch.setenv("MESHD_TOKEN", "secret")
    script(rig.folder, "on-message", f'env > "{rig.folder}/env"\npwd > "{rig.folder}/cwd"\n')
    toml(rig.folder, "[on-message]\n")
    rig.start()
    rig.deliver(message(1))
    rig.wait_finished(1)
    env = dict(line.split("=", 1) for line in (rig.folder / "env").read_text().splitlines())
    env.pop("PWD", None)  # the shell's own
    env.pop("SHLVL", None)
    env.pop("_", None)
    assert env == {"PATH": "/usr/bin:/bin", "CLAUDEMESH_MESH": "m", "CLAUDEMESH_HOOK_NAME": "on-message",
                   "CLAUDEMESH_EVENT_ID": "cm-1", "CLAUDEMESH_DAEMON_SOCK": str(rig.tmp / "daemon.sock")}
    assert (rig.folder / "cwd").read_text().strip() == str(rig.folder)


def test_the_pool_runs_hooks_at_once_up_to_its_size(rig):
    """Six runs, a pool of three: from each process's own start and end times, never more than three at once, and
    three at some moment."""
    marks = rig.folder / "marks"
    marks.mkdir()
    script(rig.folder, "on-message", f"""
        date +%s.%N > "{marks}/$CLAUDEMESH_EVENT_ID.start"
        sleep 2
        date +%s.%N > "{marks}/$CLAUDEMESH_EVENT_ID.end"
        """)
    toml(rig.folder, "[on-message]\n")
    rig.start(concurrency=3)
    for n in range(1, 7):
        rig.deliver(message(n))
    assert len(rig.wait_finished(6)) == 6
    spans = [(float((marks / f"cm-{n}.start").read_text()), float((marks / f"cm-{n}.end").read_text()))
             for n in range(1, 7)]
    overlap = max(sum(1 for s, e in spans if s <= at < e) for at, _ in spans)
    assert overlap == 3


# --- a daemon killed -9 mid-hook ---------------------------------------------------------------------------------
DAEMON_A = """
import sys, time
from pathlib import Path
from reference.core import parse_send
from reference.daemon import hooks as h
from reference.daemon.config import load
from reference.daemon.runtime import policy_for
from reference.daemon.store.hook_runs import HookRuns
from reference.daemon.store.inbox import InboxStore
from reference.daemon.store.outbox import OutboxStore
tmp = Path(sys.argv[1])
inbox, outbox = InboxStore(tmp / "inbox.db"), OutboxStore(tmp / "outbox.db", policy_for(load(None)))
runs = HookRuns(inbox, 3)
ids = iter(f"01AAA{n:021d}" for n in range(10**6))
submit = h.outbox_reply(parse_send, lambda item: outbox.accept_batch([item])[0], lambda: next(ids),
                        lambda: int(time.time() * 1000), lambda: None)
runner = h.HookRunner(runs, h.load_hooks(tmp / "hooks", 30.0), tmp / "hooks", inbox_row=inbox.by_seq,
                      submit_reply=submit, mesh="m", socket_path="", clock_ms=lambda: int(time.time() * 1000),
                      concurrency=1)
runner.start()
while True:
    time.sleep(1)
"""


def test_a_daemon_killed_mid_hook_runs_it_again_and_replies_once(rig):
    """kill -9 of the daemon while its hook runs: the next start kills the orphaned hook's group, runs the hook
    again, and the broker gets one reply."""
    pids, count = rig.folder / "pids", rig.folder / "count"
    script(rig.folder, "on-message", f"""
        echo $$ >> {pids}
        n=$(cat {count} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {count}
        echo '{{"reply": "pong"}}'
        if [ $n -eq 1 ]; then sleep 300; fi
        """)
    toml(rig.folder, "[on-message]\nallow_reply = true\n")
    rig.deliver(message(1))
    daemon = subprocess.Popen([sys.executable, "-c", DAEMON_A, str(rig.tmp)], cwd=Path(__file__).parents[2])
    try:
        deadline = time.monotonic() + 30
        while not (pids.exists() and rig.runs.list()[0].pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        claimed = rig.runs.list()[0]
        assert claimed.state == "claimed" and claimed.claims == 1 and claimed.pgid
    finally:
        daemon.send_signal(signal.SIGKILL)
        daemon.wait()
    orphan = int(pids.read_text().split()[0])
    assert alive(orphan)  # the hook outlived its daemon, in its own process group
    rig.start()
    run = rig.wait_finished(1)[0]
    assert (run.state, run.claims, count.read_text().strip()) == ("done", 2, "2")
    assert not alive(orphan)
    assert [cmid for cmid, _ in outbox_rows(rig)] == [reply_client_message_id("cm-1", "on-message")]


def test_a_run_whose_claims_run_out_fails(tmp_path):
    rig = Rig(tmp_path, max_claims=1)
    try:
        script(rig.folder, "on-message", "")
        toml(rig.folder, "[on-message]\n")
        rig.deliver(message(1))
        claimed, _ = rig.runs.claim("gone", 0, 1000)
        rig.start()
        run = rig.wait_finished(1)[0]
        assert (run.id, run.state, run.result) == (claimed.id, "failed", {"outcome": "claims_exhausted", "claims": 1})
    finally:
        rig.close()


def test_an_expired_lease_of_this_process_with_no_worker_is_reset(rig):
    script(rig.folder, "on-message", "")
    toml(rig.folder, "[on-message]\n")
    rig.deliver(message(1))
    runner = rig.start(concurrency=1)
    run = rig.wait_finished(1)[0]
    with rig.inbox._transaction() as conn:  # a claim of this process that no worker holds, its lease run out
        conn.execute("UPDATE hook_runs SET state = 'claimed', claim_owner = ?, lease_until = 1, result = NULL"
                     " WHERE id = ?", (runner.owner, run.id))
    deadline = time.monotonic() + 10
    while rig.runs.get(run.id).claims < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rig.runs.get(run.id).claims == 2
    assert rig.wait_finished(1)[0].state == "done"


def test_a_hook_that_cannot_start_fails_at_once(rig):
    script(rig.folder, "on-message", "")
    toml(rig.folder, "[on-message]\nnetwork_policy = \"allow\"\n")  # started directly, not through unshare
    rig.start(rlimits=(None, "started directly"))  # nor through prlimit, which would exit 126 for it
    (rig.folder / "on-message").write_bytes(b"\x7fELFnot really")  # no interpreter, not a binary: exec fails
    rig.deliver(message(1))
    run = rig.wait_finished(1)[0]
    assert (run.state, run.claims, run.result["outcome"]) == ("failed", 1, "spawn_failed")
    assert "Exec format error" in run.result["error"]


@pytest.mark.parametrize(("body", "meta", "name", "kept"), [
    ("x" * 300_000, None, "alice", "body"), ("é" * 200_000, None, "alice", "body"),
    ("\u0001" * 100_000, None, "alice", "body"),  # escaped six bytes a character
    ("short", {"k": "v" * 300_000}, "alice", "meta dropped"), ("b", None, "n" * 300_000, "message left out")])
def test_the_stdin_event_always_fits(rig, body, meta, name, kept):
    msg = InboxMessage(id="01IN1", client_message_id="cm-x", mesh="m", sender_pubkey=SENDER, sender_name=name,
                       received_at=1, body=body, meta=meta)
    row = rig.inbox.insert(msg)
    raw = h.event_document(row, "on-message", limit("hook_stdin_bytes"))
    event = json.loads(raw)
    assert len(raw) <= limit("hook_stdin_bytes") and event["_truncated"] is True and event["event_id"] == "cm-x"
    if kept == "body":
        assert body.startswith(event["message"]["body"]) and len(raw) > limit("hook_stdin_bytes") - 12
    elif kept == "meta dropped":
        assert event["message"]["meta"] is None and event["message"]["body"] == "short"
    else:
        assert "message" not in event


def test_the_readme_example_hooks_work_as_shown(rig):
    """The README's auto-responder and topic filter are fixtures/hooks/example, verbatim, and they do what it says."""
    import shutil

    example = Path(__file__).parents[2] / "fixtures" / "hooks" / "example"
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for name in ("hooks.toml", "on-dm", "on-topic-alerts"):
        assert (example / name).read_text().rstrip() in readme, name
    shutil.rmtree(rig.folder)
    shutil.copytree(example, rig.folder)
    rig.start()
    rig.deliver(message(1, body="are you there?"))
    rig.deliver(message(2, topic="alerts", body="CRITICAL: disk full on db-1"))
    rig.deliver(message(3, topic="alerts", body="fyi: deploy done"))
    rig.deliver(message(4, topic="general", body="CRITICAL but elsewhere"))
    runs = rig.wait_finished(3)
    assert [(r.client_message_id, r.hook, r.state) for r in runs] == [
        ("cm-1", "on-dm", "done"), ("cm-2", "on-topic-alerts", "done"), ("cm-3", "on-topic-alerts", "done")]
    sent = {cmid: json.loads(payload) for cmid, payload in outbox_rows(rig)}
    assert set(sent) == {reply_client_message_id("cm-1", "on-dm"), reply_client_message_id("cm-2", "on-topic-alerts")}
    dm = sent[reply_client_message_id("cm-1", "on-dm")]
    assert (dm["to"], dm["message"]) == (f"dm:{SENDER}", "Hi alice, I am away until Monday; your message is in my "
                                                          "inbox.")
    alert = sent[reply_client_message_id("cm-2", "on-topic-alerts")]
    assert (alert["to"], alert["message"]) == ("#alerts", "acknowledged: CRITICAL: disk full on db-1")


# --- meshd hooks list | test | audit, and the metrics ---------------------------------------------------------------
def test_meshd_hooks_list_test_and_audit(tmp_path, capsys):
    import shutil

    from reference.cli import main

    state = tmp_path / "state"
    state.mkdir()
    (state / "config.toml").write_text("[hooks]\nenabled = true\n")
    shutil.copytree(Path(__file__).parents[2] / "fixtures" / "hooks" / "example", state / "hooks")
    assert main(["hooks", "list", "--state-dir", str(state), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["enabled"] is True and [h["hook"] for h in listed["hooks"]] == ["on-dm", "on-topic-alerts"]
    assert listed["hooks"][0]["timeout_s"] == 10.0 and listed["hooks"][0]["runs"] == {}

    event = tmp_path / "event.json"
    event.write_text(json.dumps({"event": "message", "hook": "on-dm", "event_id": "cm-7", "message": {
        "client_message_id": "cm-7", "topic": None, "sender_pubkey": SENDER, "sender_name": "bob", "body": "hi"}}))
    assert main(["hooks", "test", "on-dm", "--event", str(event), "--state-dir", str(state)]) == 0
    ran = json.loads(capsys.readouterr().out)
    assert (ran["outcome"], ran["exit"]) == ("exit_ok", 0)
    assert ran["reply"] == {"would_send": {"to": f"dm:{SENDER}", "client_message_id": reply_client_message_id(
        "cm-7", "on-dm"), "message": "Hi bob, I am away until Monday; your message is in my inbox."}}
    assert main(["hooks", "test", "on-message", "--event", str(event), "--state-dir", str(state)]) == 2
    assert "no enabled hook 'on-message'" in capsys.readouterr().err
    event.write_text("[1]")
    assert main(["hooks", "test", "on-dm", "--event", str(event), "--state-dir", str(state)]) == 2
    (state / "hooks" / "hooks.toml").write_text("[on-dm]\nsandbox = 'x'\n")
    assert main(["hooks", "list", "--state-dir", str(state)]) == 3
    assert "sandbox: not enforced" in capsys.readouterr().err


def test_finished_runs_are_audited_and_counted(rig, capsys):
    from reference.cli import main
    from reference.daemon.metrics import DaemonMetrics

    script(rig.folder, "on-message", "echo '{\"reply\": \"pong\"}'\n")
    script(rig.folder, "on-dm", "exit 4\n")
    toml(rig.folder, "[on-message]\nallow_reply = true\n[on-dm]\n")
    metrics = DaemonMetrics()
    rig.start()
    rig.runner.on_finish = lambda run: metrics.hook(run.hook, run.state, run.result["duration_ms"] / 1000)
    rig.deliver(message(1))
    rig.wait_finished(2)
    (rig.tmp / "config.toml").write_text("[hooks]\nenabled = true\n")
    assert main(["hooks", "audit", "--state-dir", str(rig.tmp), "--json"]) == 0
    audit = {r["hook"]: r for r in json.loads(capsys.readouterr().out)}
    assert (audit["on-message"]["state"], audit["on-message"]["replied"], audit["on-message"]["exit"]) == (
        "done", True, 0)
    assert (audit["on-dm"]["state"], audit["on-dm"]["replied"], audit["on-dm"]["exit"]) == ("failed", False, 4)
    assert set(audit["on-dm"]) == {"hook", "event_id", "state", "claims", "exit", "duration_ms", "stdout_bytes",
                                   "stderr_bytes", "replied", "capability_calls", "ts"}
    text = metrics.render().decode()
    assert 'cm_daemon_hook_invocations_total{hook="on-message",state="done"} 1.0' in text
    assert 'cm_daemon_hook_invocations_total{hook="on-dm",state="failed"} 1.0' in text
    assert 'cm_daemon_hook_duration_seconds_count{hook="on-dm"} 1.0' in text


# --- network_policy (§6.3: best effort) ------------------------------------------------------------------------------
CONNECT = """#!/usr/bin/python3
import os, socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[0].rsplit("-", 1)[1])), timeout=2).close()
    result = "connected"
except OSError as exc:
    result = type(exc).__name__
open(os.path.join(os.path.dirname(sys.argv[0]), os.environ["CLAUDEMESH_HOOK_NAME"] + ".result"), "w").write(result)
"""


@pytest.fixture
def listener():
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


def connecting_hooks(rig: Rig, port: int, policies: dict[str, str]) -> None:
    lines = []
    for name, policy in policies.items():
        path = rig.folder / f"{name}-{port}"
        path.write_text(CONNECT)
        path.chmod(0o755)
        lines.append(f'[{name}]\ncommand = "{path.name}"\n' + (f'network_policy = "{policy}"\n' if policy else ""))
    toml(rig.folder, "".join(lines))


@pytest.mark.skipif(h.network_namespace()[0] is None, reason="this machine makes no network namespace for a hook")
def test_network_policy_deny_runs_the_hook_without_the_network(rig, listener):
    connecting_hooks(rig, listener, {"on-message": "", "on-dm": "allow"})  # deny is the default
    rig.start()
    rig.deliver(message(1))
    assert [r.state for r in rig.wait_finished(2)] == ["done", "done"]
    assert (rig.folder / "on-message.result").read_text() in ("ConnectionRefusedError", "OSError", "TimeoutError")
    assert (rig.folder / "on-dm.result").read_text() == "connected"


def test_a_deny_the_machine_cannot_enforce_runs_and_is_counted(rig, listener):
    counted = []
    connecting_hooks(rig, listener, {"on-message": "deny", "on-dm": "allow"})
    rig.start(network=(None, "namespace_refused"), on_unenforceable=lambda hook, why: counted.append((hook, why)))
    rig.deliver(message(1))
    rig.wait_finished(2)
    assert (rig.folder / "on-message.result").read_text() == "connected"
    assert counted == [("on-message", "namespace_refused")]


@pytest.mark.skipif(h.resource_limits()[0] is None, reason="this machine has no prlimit to set a hook's rlimits")
def test_a_hook_runs_under_the_rlimits_of_limits_yaml_and_so_do_its_children(rig):
    from reference.core.limits import limit

    script(rig.folder, "on-message", f"""
        ulimit -c > {rig.folder}/limits; ulimit -n >> {rig.folder}/limits; ulimit -f >> {rig.folder}/limits
        sh -c 'ulimit -n' >> {rig.folder}/limits
        """)
    script(rig.folder, "on-dm", f"head -c {int(limit('hook_rlimit_fsize_bytes')) + 1} /dev/zero > {rig.folder}/big\n")
    toml(rig.folder, "[on-message]\n[on-dm]\n")
    counted = []
    rig.start(on_unenforceable=lambda hook, why: counted.append((hook, why)))
    rig.deliver(message(1))
    runs = {run.hook: run for run in rig.wait_finished(2)}
    nofile = str(int(limit("hook_rlimit_nofile")))
    # req: HOOK-RLIMITS -- ulimit -f counts 512-byte blocks
    assert (rig.folder / "limits").read_text().split() == [
        str(int(limit("hook_rlimit_core_bytes"))), nofile, str(int(limit("hook_rlimit_fsize_bytes")) // 512), nofile]
    # a write past RLIMIT_FSIZE fails the hook (SIGXFSZ), and the file stops at the limit
    assert runs["on-dm"].state == "failed"
    assert (rig.folder / "big").stat().st_size == int(limit("hook_rlimit_fsize_bytes"))
    assert not [c for c in counted if c[1] == "no_prlimit"]


def test_rlimits_the_machine_cannot_set_are_counted_and_the_hook_runs(rig):
    script(rig.folder, "on-message", f"echo ran > {rig.folder}/ran\n")
    toml(rig.folder, "[on-message]\nnetwork_policy = \"allow\"\n")
    counted = []
    rig.start(rlimits=(None, "no_prlimit"), on_unenforceable=lambda hook, why: counted.append((hook, why)))
    rig.deliver(message(1))
    assert [run.state for run in rig.wait_finished(1)] == ["done"]
    assert (rig.folder / "ran").read_text() == "ran\n" and counted == [("on-message", "no_prlimit")]


def test_the_namespace_probe_names_why_there_is_none(monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert h.network_namespace() == (None, "no_unshare")


def test_a_finished_run_publishes_hook_executed(rig):
    """E-13, E-48: one hook_executed per finished run whose process ran, after the mark, naming the message's
    `message` event; none for a run that never started a process."""
    import spec

    published = []
    script(rig.folder, "on-message", "exit 2\n")
    script(rig.folder, "on-dm", "sleep 5\n")
    toml(rig.folder, "[on-message]\n[on-dm]\ntimeout_s = 0.2\n")
    rig.start(publish=lambda name, payload: published.append((name, payload, rig.runs.counts())))
    _, event_id = rig.deliver(message(1))
    rig.wait_finished(2)
    deadline = time.monotonic() + 5
    while len(published) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    events = {payload["hook"]: (name, payload, counts) for name, payload, counts in published}
    assert set(events) == {"on-message", "on-dm"} and len(published) == 2
    validator = spec.validator("sse/hook_executed")
    for name, payload, counts in events.values():
        assert name == "hook_executed" and not list(validator.iter_errors(payload))
        assert payload["event_id"] == event_id and counts.get("pending", 0) + counts.get("claimed", 0) < 2
    assert events["on-message"][1]["exit"] == 2 and events["on-dm"][1]["exit"] == -signal.SIGTERM
    rig.runner.publish = lambda *a: published.append(a)
    (rig.folder / "on-message").unlink()  # a run with no process: no event
    rig.inbox.insert_with_event(message(2, topic="t"),
                                with_row=lambda conn, row, event: enqueue(conn, row, ["on-message"], 0, event))
    rig.runner.notify()
    rig.wait_finished(3)
    time.sleep(0.3)
    assert len(published) == 2


# --- what a hostile pass found (#13): each a class, not the one case ---------------------------------------------
@pytest.mark.parametrize(("stdout", "refused"), [
    ("[" * 40 + "]" * 40, "stdout_past_json_limits"),  # deeper than the IPC JSON limit: the same limit here
    ("[" * 32000 + "]" * 32000, "stdout_past_json_limits"),  # deep enough to break a recursive parser
    ('{"reply": "a", "reply": "b"}', "stdout_not_json"),  # duplicate keys, refused as at the IPC boundary
    ('{"reply": "\\ud800"}', "reply_not_unicode"),  # a lone surrogate is no text a message can carry
    ('{"reply": 1e999}', "reply_not_a_string"),
    ("[1, 2]", "no_reply_member"),
])
def test_a_reply_the_daemon_cannot_take_is_refused_once_with_its_reason(rig, stdout, refused):
    (rig.folder / "out.txt").write_text(stdout)
    script(rig.folder, "on-message", f"cat {rig.folder}/out.txt\necho ran >> {rig.folder}/ran\n")
    toml(rig.folder, "[on-message]\nallow_reply = true\n")
    rig.start()
    rig.deliver(message(1))
    run = rig.wait_finished(1)[0]
    time.sleep(0.3)
    assert (run.state, run.claims, run.result["reply"]) == ("done", 1, {"refused": refused})
    assert (rig.folder / "ran").read_text() == "ran\n"  # run once: a refusal is not a crash


def test_a_run_whose_last_claim_is_lost_is_audited_and_counted(rig, caplog):
    script(rig.folder, "on-message", "true\n")
    toml(rig.folder, "[on-message]\n")
    rig.deliver(message(1))
    run = rig.runs.list()[0]
    with rig.inbox._transaction() as conn:  # claimed max_claims times already, by a process that is gone
        conn.execute("UPDATE hook_runs SET state = 'claimed', claim_owner = 'gone-1', claims = 3, lease_until = 1"
                     " WHERE id = ?", (run.id,))
    with caplog.at_level("INFO", logger="meshd.hooks"):
        rig.start()
        finished = rig.wait_finished(1)
    assert finished[0].state == "failed" and [r.state for r in rig.finished] == ["failed"]
    audit = [json.loads(r.getMessage().split("hook_audit ", 1)[1]) for r in caplog.records
             if r.getMessage().startswith("hook_audit ")]
    assert [(a["hook"], a["state"], a["claims"]) for a in audit] == [("on-message", "failed", 3)]


def test_the_token_dies_when_the_hook_exits_though_a_child_that_left_holds_its_output(rig):
    """E-50: revoked at the hook's exit, not when its output is read to the end (a setsid'd child holds the pipe);
    and the run's duration is the hook's."""
    script(rig.folder, "on-message", """
        setsid sh -c 'sleep 4' &
        exit 0
        """)
    toml(rig.folder, '[on-message]\ncapability_token_scope = ["reply:event"]\n')
    runner = rig.start()
    minted = []
    original = runner.capabilities.mint

    def spy(*args):
        minted.append(original(*args))
        return minted[-1]

    runner.capabilities.mint = spy
    rig.deliver(message(1))
    deadline = time.monotonic() + 10
    while not minted and time.monotonic() < deadline:
        time.sleep(0.01)
    while minted[0].live and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not minted[0].live and runner.capabilities.lookup(minted[0].token) is None
    run = rig.wait_finished(1, timeout=15)[0]
    assert run.result["duration_ms"] < 2000


@pytest.mark.skipif(os.geteuid() != 0 or h.network_namespace()[0] is None,
                    reason="the escape needs a root daemon on a machine that makes network namespaces")
def test_a_root_hook_cannot_enter_the_daemons_network_namespace_again(rig):
    script(rig.folder, "on-message", f"""
        nsenter --net=/proc/{os.getpid()}/ns/net true && echo escaped > {rig.folder}/result \\
            || echo blocked > {rig.folder}/result
        """)
    toml(rig.folder, "[on-message]\n")  # network_policy deny, the default
    rig.start()
    rig.deliver(message(1))
    rig.wait_finished(1)
    assert (rig.folder / "result").read_text() == "blocked\n"


@pytest.mark.parametrize(("text", "wanted"), [
    ("[on-message]\ntimeout_s = nan\n", "[on-message.timeout_s]: nan is not a finite number"),
    ("[on-message]\ntimeout_s = -nan\n", "is not a finite number"),
    (f'[on-message]\ncommand = "{"x" * 300}"\n', "[on-message.command]:"),
])
def test_hooks_toml_values_a_schema_lets_through_are_refused_by_name(tmp_path, text, wanted):
    script(tmp_path, "on-message", "true\n")
    toml(tmp_path, text)
    with pytest.raises(h.HooksConfigError, match=re.escape(wanted)):
        h.load_hooks(tmp_path, 30.0)


def test_meshd_hooks_test_gives_the_hook_no_daemon_and_a_token_that_grants_nothing(tmp_path, capsys):
    from reference.cli import main

    state = tmp_path / "state"
    (state / "hooks").mkdir(parents=True)
    (state / "config.toml").write_text("[hooks]\nenabled = true\n")
    (state / "daemon.sock").write_text("")  # where a running daemon's socket would be
    script(state / "hooks", "on-dm", f"env > {tmp_path}/env\n")
    toml(state / "hooks", '[on-dm]\ncapability_token_scope = ["reply:event"]\n')
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"event": "message", "message": {"client_message_id": "cm-1", "topic": None,
                                                                 "sender_pubkey": SENDER, "body": "hi"}}))
    assert main(["hooks", "test", "on-dm", "--event", str(event), "--state-dir", str(state)]) == 0
    env = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line)
    assert env["CLAUDEMESH_DAEMON_SOCK"] != str(state / "daemon.sock")
    assert not Path(env["CLAUDEMESH_DAEMON_SOCK"]).exists()
    assert env["CLAUDEMESH_CAPABILITY_TOKEN"] == "meshd-hooks-test-grants-nothing"
